/* Reference softmax attention: plain double loops, no BLAS, written for clarity.
 *   out[i] = sum_j w_ij v_j / sum_j w_ij,  w_ij = exp(scale q_i.k_j - max_j' scale q_i.k_j')
 * over the keys j that query i may see: j < lengths[b], and j <= i when causal; with a
 * window w (ref_local), also i - w < j (and j < i + w when not causal).
 * Query rows i >= lengths[b] output zero. */
#include "reference.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

/* Keys [*j0, *j1) that query i sees (window <= 0: no window). */
static void key_range(const ref_shape *s, int L, int i, long long window, int *j0, int *j1) {
    long long lo = 0, hi = s->causal ? i + 1 : L;
    if (window > 0) {
        if (i - window + 1 > lo) lo = i - window + 1;
        if (!s->causal && i + window < hi) hi = i + window;
    }
    *j0 = (int)lo;
    *j1 = (int)hi;
}

static void softmax_window(const ref_shape *s, long long window, double scale, const double *q, const double *k,
                           const double *v, double *out) {
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
                int j0, j1;
                key_range(s, L, i, window, &j0, &j1);
                double mx = -INFINITY;
                for (int j = j0; j < j1; j++) {
                    double dot = 0.0;
                    for (int d = 0; d < D; d++) dot += qs[(size_t)i * D + d] * ks[(size_t)j * D + d];
                    score[j] = scale * dot;
                    if (score[j] > mx) mx = score[j];
                }
                double total = 0.0;
                for (int j = j0; j < j1; j++) {
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

void ref_softmax(const ref_shape *s, double scale, const double *q, const double *k, const double *v, double *out) {
    softmax_window(s, 0, scale, q, k, v, out);
}

void ref_local(const ref_shape *s, long long window, double scale, const double *q, const double *k, const double *v,
               double *out) {
    softmax_window(s, window, scale, q, k, v, out);
}
