/* Plain double-precision Linformer attention (Wang et al. 2020), written from its
 * definition, forward and backward, one (b, h) slice at a time:
 *   Kp = E[:, :L] K[:L]   (P x D),   Vp = F[:, :L] V[:L]   (P x M)
 *   S_ir = scale q_i . Kp_r,   A_i. = softmax over r of S_i.,   out_i = sum_r A_ir Vp_r
 * for i < L (L = lengths[b], or N); padded rows are zero and take no part. E and F are
 * P x ld (ld = the max_len they were built for, >= N); only their first L columns are
 * read. Backward, with G = dout:
 *   dA_ir = G_i . Vp_r,   dS_ir = A_ir (dA_ir - sum_r' A_ir' dA_ir')
 *   dq_i = scale sum_r dS_ir Kp_r,   dKp_r = scale sum_i dS_ir q_i,   dVp_r = sum_i A_ir G_i
 *   dk_j = sum_r E_rj dKp_r,   dv_j = sum_r F_rj dVp_r                   (j < L)
 *   dE_rj += dKp_r . k_j,   dF_rj += dVp_r . v_j                           (j < L)
 * summed over every batch row and head (the heads share E and F). */
#include "reference.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double *kp, *vp, *a; /* P x D, P x M, N x P */
} lin_tmp;

/* Kp, Vp and A of one slice (rows i < L of A). */
static void slice_forward(const ref_shape *s, int P, int ld, const double *E, const double *F, double scale, int L,
                          const double *qs, const double *ks, const double *vs, lin_tmp *t) {
    const int D = s->D, M = s->M;
    for (int r = 0; r < P; r++) {
        for (int d = 0; d < D; d++) {
            double acc = 0;
            for (int j = 0; j < L; j++) acc += E[(size_t)r * ld + j] * ks[(size_t)j * D + d];
            t->kp[(size_t)r * D + d] = acc;
        }
        for (int m = 0; m < M; m++) {
            double acc = 0;
            for (int j = 0; j < L; j++) acc += F[(size_t)r * ld + j] * vs[(size_t)j * M + m];
            t->vp[(size_t)r * M + m] = acc;
        }
    }
    for (int i = 0; i < L; i++) {
        double *ar = t->a + (size_t)i * P, mx = -INFINITY, sum = 0;
        for (int r = 0; r < P; r++) {
            double dot = 0;
            for (int d = 0; d < D; d++) dot += qs[(size_t)i * D + d] * t->kp[(size_t)r * D + d];
            ar[r] = scale * dot;
            mx = fmax(mx, ar[r]);
        }
        for (int r = 0; r < P; r++) sum += (ar[r] = exp(ar[r] - mx));
        for (int r = 0; r < P; r++) ar[r] /= sum;
    }
}

static lin_tmp tmp_make(const ref_shape *s, int P) {
    lin_tmp t = {malloc(sizeof(double) * (size_t)P * s->D), malloc(sizeof(double) * (size_t)P * s->M),
                 malloc(sizeof(double) * (size_t)s->N * P)};
    return t;
}

static void tmp_free(lin_tmp *t) {
    free(t->kp);
    free(t->vp);
    free(t->a);
}

void ref_linformer(const ref_shape *s, int P, int ld, const double *E, const double *F, double scale, const double *q,
                   const double *k, const double *v, double *out) {
    const int N = s->N, D = s->D, M = s->M;
    lin_tmp t = tmp_make(s, P);
    for (int b = 0; b < s->B; b++) {
        const int L = s->lengths ? s->lengths[b] : N;
        for (int h = 0; h < s->H; h++) {
            size_t slice = (size_t)b * s->H + (size_t)h;
            const double *qs = q + slice * N * D, *ks = k + slice * N * D, *vs = v + slice * N * M;
            double *os = out + slice * N * M;
            memset(os, 0, sizeof(double) * (size_t)N * M);
            slice_forward(s, P, ld, E, F, scale, L, qs, ks, vs, &t);
            for (int i = 0; i < L; i++)
                for (int m = 0; m < M; m++) {
                    double acc = 0;
                    for (int r = 0; r < P; r++) acc += t.a[(size_t)i * P + r] * t.vp[(size_t)r * M + m];
                    os[(size_t)i * M + m] = acc;
                }
        }
    }
    tmp_free(&t);
}

void ref_linformer_backward(const ref_shape *s, int P, int ld, const double *E, const double *F, double scale,
                            const double *q, const double *k, const double *v, const double *dout, double *dq,
                            double *dk, double *dv, double *dE, double *dF) {
    const int N = s->N, D = s->D, M = s->M;
    lin_tmp t = tmp_make(s, P);
    double *dkp = malloc(sizeof(double) * (size_t)P * D), *dvp = malloc(sizeof(double) * (size_t)P * M);
    double *ds = malloc(sizeof(double) * (size_t)P);
    memset(dE, 0, sizeof(double) * (size_t)P * ld);
    memset(dF, 0, sizeof(double) * (size_t)P * ld);
    for (int b = 0; b < s->B; b++) {
        const int L = s->lengths ? s->lengths[b] : N;
        for (int h = 0; h < s->H; h++) {
            size_t slice = (size_t)b * s->H + (size_t)h;
            const double *qs = q + slice * N * D, *ks = k + slice * N * D, *vs = v + slice * N * M;
            const double *gs = dout + slice * N * M;
            double *dqs = dq + slice * N * D, *dks = dk + slice * N * D, *dvs = dv + slice * N * M;
            memset(dqs, 0, sizeof(double) * (size_t)N * D);
            memset(dks, 0, sizeof(double) * (size_t)N * D);
            memset(dvs, 0, sizeof(double) * (size_t)N * M);
            memset(dkp, 0, sizeof(double) * (size_t)P * D);
            memset(dvp, 0, sizeof(double) * (size_t)P * M);
            slice_forward(s, P, ld, E, F, scale, L, qs, ks, vs, &t);
            for (int i = 0; i < L; i++) {
                const double *ar = t.a + (size_t)i * P, *g = gs + (size_t)i * M;
                double rs = 0;
                for (int r = 0; r < P; r++) {
                    double da = 0;
                    for (int m = 0; m < M; m++) da += g[m] * t.vp[(size_t)r * M + m];
                    ds[r] = da;
                    rs += ar[r] * da;
                }
                for (int r = 0; r < P; r++) {
                    double dsr = ar[r] * (ds[r] - rs);
                    for (int d = 0; d < D; d++) {
                        dqs[(size_t)i * D + d] += scale * dsr * t.kp[(size_t)r * D + d];
                        dkp[(size_t)r * D + d] += scale * dsr * qs[(size_t)i * D + d];
                    }
                    for (int m = 0; m < M; m++) dvp[(size_t)r * M + m] += ar[r] * g[m];
                }
            }
            for (int j = 0; j < L; j++)
                for (int r = 0; r < P; r++) {
                    const double e = E[(size_t)r * ld + j], f = F[(size_t)r * ld + j];
                    double de = 0, df = 0;
                    for (int d = 0; d < D; d++) {
                        dks[(size_t)j * D + d] += e * dkp[(size_t)r * D + d];
                        de += dkp[(size_t)r * D + d] * ks[(size_t)j * D + d];
                    }
                    for (int m = 0; m < M; m++) {
                        dvs[(size_t)j * M + m] += f * dvp[(size_t)r * M + m];
                        df += dvp[(size_t)r * M + m] * vs[(size_t)j * M + m];
                    }
                    dE[(size_t)r * ld + j] += de;
                    dF[(size_t)r * ld + j] += df;
                }
        }
    }
    free(dkp);
    free(dvp);
    free(ds);
    tmp_free(&t);
}
