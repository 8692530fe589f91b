/* Reference strided sparse attention (Child et al. 2019): plain double loops over the
 * full N x N pattern, no BLAS, written for clarity.
 *   out_i = sum_{j in A(i)} w_ij v_j / sum_{j in A(i)} w_ij,
 *   w_ij = exp(scale q_i.k_j - max_{j' in A(i)} scale q_i.k_j'),
 *   A(i) = { j < L : |i - j| < window or |i - j| mod stride == 0 } (and j <= i causal).
 * Query rows i >= L (L = lengths[b], or N) output zero. */
#include "reference.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

bool ref_sparse_allowed(bool causal, long long window, long long stride, int i, int j) {
    long long d = (long long)i - j;
    if (causal && d < 0) return false;
    if (d < 0) d = -d;
    return d < window || d % stride == 0;
}

void ref_sparse(const ref_shape *s, long long window, long long stride, double scale, const double *q,
                const double *k, const double *v, double *out) {
    const int N = s->N, D = s->D, M = s->M;
    double *score = malloc(sizeof(double) * (size_t)(N > 0 ? N : 1));
    for (int b = 0; b < s->B; b++) {
        const int L = s->lengths ? s->lengths[b] : N;
        for (int h = 0; h < s->H; h++) {
            const size_t slice = (size_t)b * s->H + (size_t)h;
            const double *qs = q + slice * N * D, *ks = k + slice * N * D, *vs = v + slice * N * M;
            double *os = out + slice * N * M;
            for (int i = 0; i < N; i++) {
                double *o = os + (size_t)i * M;
                for (int m = 0; m < M; m++) o[m] = 0.0;
                if (i >= L) continue; /* padded query row */
                double mx = -INFINITY;
                for (int j = 0; j < L; j++) {
                    if (!ref_sparse_allowed(s->causal, window, stride, i, j)) continue;
                    double dot = 0.0;
                    for (int d = 0; d < D; d++) dot += qs[(size_t)i * D + d] * ks[(size_t)j * D + d];
                    score[j] = scale * dot;
                    if (score[j] > mx) mx = score[j];
                }
                double total = 0.0;
                for (int j = 0; j < L; j++) {
                    if (!ref_sparse_allowed(s->causal, window, stride, i, j)) continue;
                    double w = exp(score[j] - mx);
                    total += w;
                    for (int m = 0; m < M; m++) o[m] += w * vs[(size_t)j * M + m];
                }
                for (int m = 0; m < M; m++) o[m] /= total; /* j = i is always allowed */
            }
        }
    }
    free(score);
}
