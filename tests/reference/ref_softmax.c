/* Reference softmax attention: plain double loops, no BLAS, written for clarity.
 *   out[i] = sum_j w_ij v_j / sum_j w_ij,  w_ij = exp(scale q_i.k_j - max_j' scale q_i.k_j')
 * over the keys j that query i may see: j < lengths[b], and j <= i when causal.
 * Query rows i >= lengths[b] output zero. */
#include "reference.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

void ref_softmax(const ref_shape *s, double scale, const double *q, const double *k, const double *v, double *out) {
    const int N = s->N, D = s->D, M = s->M;
    double *score = malloc(sizeof(double) * (size_t)N);
    for (int b = 0; b < s->B; b++) {
        int L = s->lengths ? s->lengths[b] : N;
        for (int h = 0; h < s->H; h++) {
            size_t slice = (size_t)b * s->H + (size_t)h;
            const double *qs = q + slice * N * D, *ks = k + slice * N * D, *vs = v + slice * N * M;
            double *os = out + slice * N * M;
            for (int i = 0; i < N; i++) {
                double *o = os + (size_t)i * M;
                for (int m = 0; m < M; m++) o[m] = 0.0;
                if (i >= L) continue; /* padded query row */
                int nkeys = s->causal ? i + 1 : L;
                double mx = -INFINITY;
                for (int j = 0; j < nkeys; j++) {
                    double dot = 0.0;
                    for (int d = 0; d < D; d++) dot += qs[(size_t)i * D + d] * ks[(size_t)j * D + d];
                    score[j] = scale * dot;
                    if (score[j] > mx) mx = score[j];
                }
                double total = 0.0;
                for (int j = 0; j < nkeys; j++) {
                    double w = exp(score[j] - mx);
                    total += w;
                    for (int m = 0; m < M; m++) o[m] += w * vs[(size_t)j * M + m];
                }
                for (int m = 0; m < M; m++) o[m] /= total;
            }
        }
    }
    free(score);
}
