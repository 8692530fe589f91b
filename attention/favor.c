/* The favor feature map on the CPU: its projection drawn from the seed, its features
 * and their gradient (definitions in favor.h). */
#include "favor.h"

#include "cpu_util.h"

#include "../harness/rng.h"

#include <math.h>
#include <string.h>

#define FAVOR_STREAM_BLOCKS 0 /* the Gaussian blocks that are orthogonalised */
#define FAVOR_STREAM_NORMS 1  /* the Gaussian vectors whose norms scale the rows */

size_t favor_dim(int D, const attn_params *p) {
    if (p && p->features > 0) return (size_t)p->features;
    return 2 * (size_t)D;
}

size_t favor_draw_scratch(int D) { return (size_t)D * (size_t)D * sizeof(double); }

void favor_draw(uint64_t seed, int D, int m, void *scratch, float *W) {
    double *G = scratch; /* one D x D block */
    const size_t d2 = (size_t)D * (size_t)D;
    for (int b = 0; (size_t)b * (size_t)D < (size_t)m; b++) {
        const int rows = m - b * D < D ? m - b * D : D;
        const uint64_t base = (uint64_t)b * d2;
        /* the normals of the block (sequential: 2 m D normals cost ~30 ns each, less than
         * waking threads on a busy machine) */
        for (long e = 0; e < (long)d2; e++) G[e] = ab_rng_normal(seed, FAVOR_STREAM_BLOCKS, base + (uint64_t)e);
        /* modified Gram-Schmidt over the rows, in order (only the rows kept are needed:
         * row r depends on rows 0..r-1 alone) */
        for (int r = 0; r < rows; r++) {
            double *gr = G + (size_t)r * D;
            for (int p = 0; p < r; p++) {
                const double *gp = G + (size_t)p * D;
                double dot = 0;
                for (int d = 0; d < D; d++) dot += gr[d] * gp[d];
                for (int d = 0; d < D; d++) gr[d] -= dot * gp[d];
            }
            double nn = 0;
            for (int d = 0; d < D; d++) nn += gr[d] * gr[d];
            /* A zero row (probability 0) stays zero: its features are then constant. */
            const double inv = nn > 0 ? 1.0 / sqrt(nn) : 0.0;
            for (int d = 0; d < D; d++) gr[d] *= inv;
        }
        /* rows scaled by chi-distributed norms */
        for (int r = 0; r < rows; r++) {
            const uint64_t i = (uint64_t)b * (uint64_t)D + (uint64_t)r;
            double nn = 0;
            for (int d = 0; d < D; d++) {
                const double z = ab_rng_normal(seed, FAVOR_STREAM_NORMS, i * (uint64_t)D + (uint64_t)d);
                nn += z * z;
            }
            const double norm = sqrt(nn);
            for (int d = 0; d < D; d++) W[i * (uint64_t)D + (uint64_t)d] = (float)(G[(size_t)r * D + d] * norm);
        }
    }
}

/* D^(-1/4) and D^(-1/2), the scalings of x' and of |x'|^2 = D^(-1/2) |x|^2. */
static float quarter(int D) { return (float)pow((double)D, -0.25); }

/* proj[i][r] = w_r . x'_i (one GEMM into out, n x C, leading dimension ld) and
 * h[i] = |x'_i|^2 / 2 (double sum of squares). */
static void project(const fm_spec *f, int n, const float *x, int ldx, float *out, int ld) {
    ab_sgemm(false, true, n, f->C, f->D, quarter(f->D), x, ldx, f->W, f->D, 0.0f, out, ld);
}

static float half_sq(const fm_spec *f, const float *xi) {
    return (float)(0.5 * attn_dot_d(xi, xi, f->D) / sqrt((double)f->D));
}

void favor_forward(const fm_spec *f, int n, const float *x, int ldx, float *phi, int ldphi, const fm_shift *sh) {
    const int C = f->C;
    const float norm = (float)(1.0 / sqrt((double)C));
    project(f, n, x, ldx, phi, ldphi);
    for (int i = 0; i < n; i++) {
        float *p = phi + (size_t)i * ldphi;
        const float h = half_sq(f, x + (size_t)i * ldx);
        float shift;
        if (sh->rows) {
            shift = attn_max_f(p, C) - h;
            sh->rows[i] = shift;
        } else {
            shift = sh->shared;
        }
        /* a_r - shift = proj_r - (h + shift) <= 0 up to rounding */
        const float off = h + shift;
        for (int r = 0; r < C; r++) p[r] = norm * attn_exp_nonpos(p[r] - off);
    }
}

/* d phi_r / d x = D^(-1/4) phi_r (w_r - x'):  gx = D^(-1/4) U W - D^(-1/2) x sum_r U_r,
 * U = gphi .* phi (into gphi). */
void favor_backward(const fm_spec *f, int n, const float *x, int ldx, const float *phi, int ldphi, float *gphi,
                    int ldg, float *gx, int ldgx) {
    const int C = f->C, D = f->D;
    const float q4 = quarter(D), q2 = (float)(1.0 / sqrt((double)D));
    for (int i = 0; i < n; i++) {
        float *u = gphi + (size_t)i * ldg;
        const float *p = phi + (size_t)i * ldphi;
        for (int r = 0; r < C; r++) u[r] *= p[r];
    }
    ab_sgemm(false, false, n, D, C, q4, gphi, ldg, f->W, D, 0.0f, gx, ldgx);
    for (int i = 0; i < n; i++) {
        const float *u = gphi + (size_t)i * ldg, *xi = x + (size_t)i * ldx;
        double ps[8] = {0, 0, 0, 0, 0, 0, 0, 0}, su = 0;
        int r = 0;
        for (; r + 8 <= C; r += 8)
            for (int e = 0; e < 8; e++) ps[e] += u[r + e];
        for (; r < C; r++) su += u[r];
        for (int e = 0; e < 8; e++) su += ps[e];
        const float c = q2 * (float)su;
        float *o = gx + (size_t)i * ldgx;
        for (int d = 0; d < D; d++) o[d] -= c * xi[d];
    }
}
