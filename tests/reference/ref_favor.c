/* Plain double-precision FAVOR+ (the favor feature map of linear attention), written
 * from attention/favor.h's definition: its projection W drawn from the seed with the
 * harness's Philox normals, and linear attention with sim(q, k) = phi(q) . phi(k),
 *   phi(x)_r = m^(-1/2) exp(w_r . x' - |x'|^2 / 2),  x' = D^(-1/4) x,
 * computed without any shift (double has the range for the tests' inputs). */
#include "reference.h"

#include "rng.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

void ref_favor_projection(uint64_t seed, int D, int m, double *W) {
    double *G = malloc(sizeof(double) * (size_t)D * D);
    for (int b = 0; b * D < m; b++) {
        for (int r = 0; r < D; r++)
            for (int d = 0; d < D; d++)
                G[(size_t)r * D + d] = ab_rng_normal(seed, 0, ((uint64_t)b * D + (uint64_t)r) * (uint64_t)D + (uint64_t)d);
        /* classical Gram-Schmidt, row by row: row r minus its components along the
         * orthonormal rows before it, then normalised */
        for (int r = 0; r < D && b * D + r < m; r++) {
            double *gr = G + (size_t)r * D;
            for (int p = 0; p < r; p++) {
                const double *gp = G + (size_t)p * D;
                double dot = 0;
                for (int d = 0; d < D; d++) dot += gr[d] * gp[d];
                for (int d = 0; d < D; d++) gr[d] -= dot * gp[d];
            }
            double nn = 0;
            for (int d = 0; d < D; d++) nn += gr[d] * gr[d];
            for (int d = 0; d < D; d++) gr[d] /= sqrt(nn);
            /* the row's length: the norm of a fresh Gaussian vector (chi, D degrees) */
            const int i = b * D + r;
            double len = 0;
            for (int d = 0; d < D; d++) {
                const double z = ab_rng_normal(seed, 1, (uint64_t)i * (uint64_t)D + (uint64_t)d);
                len += z * z;
            }
            for (int d = 0; d < D; d++) W[(size_t)i * D + d] = (double)(float)(gr[d] * sqrt(len));
        }
    }
    free(G);
}

void ref_favor_features(const double *W, int D, int m, const double *x, double *phi) {
    const double c4 = pow((double)D, -0.25);
    double sq = 0;
    for (int d = 0; d < D; d++) sq += x[d] * x[d];
    const double h = 0.5 * sq / sqrt((double)D);
    for (int r = 0; r < m; r++) {
        double a = 0;
        for (int d = 0; d < D; d++) a += W[(size_t)r * D + d] * x[d];
        phi[r] = exp(c4 * a - h) / sqrt((double)m);
    }
}

void ref_favor(const ref_shape *s, const double *W, int m, double eps, const double *q, const double *k,
               const double *v, double *out) {
    const int N = s->N, D = s->D, M = s->M;
    double *fq = malloc(sizeof(double) * (size_t)m), *fk = malloc(sizeof(double) * (size_t)N * m);
    for (int b = 0; b < s->B; b++) {
        int L = s->lengths ? s->lengths[b] : N;
        for (int h = 0; h < s->H; h++) {
            size_t slice = (size_t)b * s->H + (size_t)h;
            const double *qs = q + slice * N * D, *ks = k + slice * N * D, *vs = v + slice * N * M;
            double *os = out + slice * N * M;
            for (int j = 0; j < L; j++) ref_favor_features(W, D, m, ks + (size_t)j * D, fk + (size_t)j * m);
            for (int i = 0; i < N; i++) {
                double *o = os + (size_t)i * M;
                for (int c = 0; c < M; c++) o[c] = 0;
                if (i >= L) continue;
                ref_favor_features(W, D, m, qs + (size_t)i * D, fq);
                double den = 0;
                for (int j = 0; j <= (s->causal ? i : L - 1); j++) {
                    double sim = 0;
                    for (int r = 0; r < m; r++) sim += fq[r] * fk[(size_t)j * m + r];
                    den += sim;
                    for (int c = 0; c < M; c++) o[c] += sim * vs[(size_t)j * M + c];
                }
                for (int c = 0; c < M; c++) o[c] /= den + eps;
            }
        }
    }
    free(fq);
    free(fk);
}
