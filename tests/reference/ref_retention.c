/* Plain double-precision retention (RetNet, Sun et al. 2023), the parallel form written
 * out pair by pair: out_i = scale sum_j gamma_h^|i-j| (q_i . k_j) v_j over j <= i
 * (causal) or every j (non-causal), j < L; and its analytic gradients. */
#include "reference.h"

#include <math.h>
#include <stddef.h>

/* The decay of pair (i, j) of head h, 0 where the pair is not allowed. */
static double decay(const ref_shape *s, const double *gamma, int h, int L, int i, int j) {
    if (i >= L || j >= L || (s->causal && j > i)) return 0.0;
    return pow(gamma[h], fabs((double)(i - j)));
}

static double dot(const double *a, const double *b, int n) {
    double x = 0;
    for (int e = 0; e < n; e++) x += a[e] * b[e];
    return x;
}

void ref_retention(const ref_shape *s, const double *gamma, double scale, const double *q, const double *k,
                   const double *v, double *out) {
    const int N = s->N, D = s->D, M = s->M;
    for (int b = 0; b < s->B; b++) {
        int L = s->lengths ? s->lengths[b] : N;
        for (int h = 0; h < s->H; h++) {
            size_t bh = (size_t)b * s->H + h;
            const double *qs = q + bh * N * D, *ks = k + bh * N * D, *vs = v + bh * N * M;
            double *os = out + bh * N * M;
            for (int i = 0; i < N; i++) {
                double *oi = os + (size_t)i * M;
                for (int m = 0; m < M; m++) oi[m] = 0;
                for (int j = 0; j < N; j++) {
                    double w = decay(s, gamma, h, L, i, j);
                    if (w == 0.0) continue;
                    w *= scale * dot(qs + (size_t)i * D, ks + (size_t)j * D, D);
                    for (int m = 0; m < M; m++) oi[m] += w * vs[(size_t)j * M + m];
                }
            }
        }
    }
}

/* With w_ij = scale gamma^|i-j| (masked): dq_i = sum_j w_ij (g_i . v_j) k_j,
 * dk_j = sum_i w_ij (g_i . v_j) q_i, dv_j = sum_i w_ij (q_i . k_j) g_i. */
void ref_retention_backward(const ref_shape *s, const double *gamma, double scale, const double *q, const double *k,
                            const double *v, const double *dout, double *dq, double *dk, double *dv) {
    const int N = s->N, D = s->D, M = s->M;
    for (size_t e = 0; e < (size_t)s->B * s->H * N * D; e++) dq[e] = dk[e] = 0;
    for (size_t e = 0; e < (size_t)s->B * s->H * N * M; e++) dv[e] = 0;
    for (int b = 0; b < s->B; b++) {
        int L = s->lengths ? s->lengths[b] : N;
        for (int h = 0; h < s->H; h++) {
            size_t bh = (size_t)b * s->H + h;
            const double *qs = q + bh * N * D, *ks = k + bh * N * D, *vs = v + bh * N * M, *gs = dout + bh * N * M;
            double *dqs = dq + bh * N * D, *dks = dk + bh * N * D, *dvs = dv + bh * N * M;
            for (int i = 0; i < N; i++)
                for (int j = 0; j < N; j++) {
                    double w = decay(s, gamma, h, L, i, j);
                    if (w == 0.0) continue;
                    w *= scale;
                    const double *qi = qs + (size_t)i * D, *kj = ks + (size_t)j * D;
                    const double *vj = vs + (size_t)j * M, *gi = gs + (size_t)i * M;
                    double gv = w * dot(gi, vj, M), qk = w * dot(qi, kj, D);
                    for (int e = 0; e < D; e++) {
                        dqs[(size_t)i * D + e] += gv * kj[e];
                        dks[(size_t)j * D + e] += gv * qi[e];
                    }
                    for (int m = 0; m < M; m++) dvs[(size_t)j * M + m] += qk * gi[m];
                }
        }
    }
}
