/* LSH attention (shared query/key) in plain double precision, given the buckets.
 * Written for clarity: one query at a time, no BLAS, no cleverness. */
#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NORM_FLOOR 1e-12

static int valid_len(const ref_shape *s, int b) { return s->lengths ? s->lengths[b] : s->N; }

/* k = q / max(|q|, floor) for each of the n rows of width D. */
static void normalise_rows(const double *q, int n, int D, double *k) {
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int d = 0; d < D; d++) ss += q[i * D + d] * q[i * D + d];
        double nrm = fmax(sqrt(ss), NORM_FLOOR);
        for (int d = 0; d < D; d++) k[i * D + d] = q[i * D + d] / nrm;
    }
}

static double dot(const double *a, const double *b, int n) {
    double acc = 0;
    for (int t = 0; t < n; t++) acc += a[t] * b[t];
    return acc;
}

/* Key j is allowed for query i (self excluded; causal uses original positions). */
static bool allowed(int i, int j, bool causal) { return j != i && !(causal && j > i); }

/* Attention of query i over the candidate keys keys[0..nk): softmax over the allowed
 * ones, or v_i alone (logsumexp = the self score) when none is allowed. Writes o [M]
 * and returns the logsumexp of the scores used. */
static double attend(int i, const int *keys, int nk, bool causal, double scale, const double *q, const double *k,
                     const double *v, int D, int M, double *o) {
    double m = -INFINITY;
    for (int u = 0; u < nk; u++)
        if (allowed(i, keys[u], causal)) m = fmax(m, scale * dot(q + i * D, k + keys[u] * D, D));
    if (m == -INFINITY) { /* only itself */
        for (int c = 0; c < M; c++) o[c] = v[i * M + c];
        return scale * dot(q + i * D, k + i * D, D);
    }
    double sum = 0;
    for (int c = 0; c < M; c++) o[c] = 0;
    for (int u = 0; u < nk; u++) {
        int j = keys[u];
        if (!allowed(i, j, causal)) continue;
        double e = exp(scale * dot(q + i * D, k + j * D, D) - m);
        sum += e;
        for (int c = 0; c < M; c++) o[c] += e * v[j * M + c];
    }
    for (int c = 0; c < M; c++) o[c] /= sum;
    return m + log(sum);
}

/* order[0..L) = positions 0..L-1 sorted stably by bucket (insertion sort). */
static void sort_by_bucket(const int *bucket, int L, int *order) {
    for (int i = 0; i < L; i++) order[i] = i;
    for (int i = 1; i < L; i++) {
        int x = order[i], t = i;
        while (t > 0 && bucket[order[t - 1]] > bucket[x]) {
            order[t] = order[t - 1];
            t--;
        }
        order[t] = x;
    }
}

void ref_lsh(const ref_shape *s, int rounds, int chunk, int combine, double scale, const int *buckets,
             const double *q, const double *v, double *out) {
    const int N = s->N, D = s->D, M = s->M;
    double *k = malloc(sizeof(double) * N * D);
    double *o = malloc(sizeof(double) * rounds * N * M); /* o[r][i][c] */
    double *lse = malloc(sizeof(double) * rounds * N);   /* lse[r][i] */
    int *order = malloc(sizeof(int) * N);
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->H; h++) {
            int bh = b * s->H + h, L = valid_len(s, b);
            const double *qs = q + (size_t)bh * N * D, *vs = v + (size_t)bh * N * M;
            double *os = out + (size_t)bh * N * M;
            memset(os, 0, sizeof(double) * N * M);
            normalise_rows(qs, L, D, k);
            for (int r = 0; r < rounds; r++) {
                sort_by_bucket(buckets + ((size_t)r * s->B * s->H + bh) * N, L, order);
                for (int t = 0; t < L; t++) {
                    int c = t / chunk;
                    int lo = c > 0 ? (c - 1) * chunk : 0;
                    int hi = (c + 1) * chunk < L ? (c + 1) * chunk : L;
                    int i = order[t];
                    lse[r * N + i] = attend(i, order + lo, hi - lo, s->causal, scale, qs, k, vs, D, M,
                                            o + ((size_t)r * N + i) * M);
                }
            }
            for (int i = 0; i < L; i++) {
                double mx = -INFINITY, z = 0;
                for (int r = 0; r < rounds; r++) mx = fmax(mx, lse[r * N + i]);
                for (int r = 0; r < rounds; r++) z += exp(lse[r * N + i] - mx);
                for (int r = 0; r < rounds; r++) {
                    double w = combine == 0 ? 1.0 / rounds : exp(lse[r * N + i] - mx) / z;
                    for (int c = 0; c < M; c++) os[i * M + c] += w * o[((size_t)r * N + i) * M + c];
                }
            }
        }
    free(k);
    free(o);
    free(lse);
    free(order);
}

void ref_shared_qk_softmax(const ref_shape *s, double scale, const double *q, const double *v, double *out) {
    const int N = s->N, D = s->D, M = s->M;
    double *k = malloc(sizeof(double) * N * D);
    int *all = malloc(sizeof(int) * N);
    for (int j = 0; j < N; j++) all[j] = j;
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->H; h++) {
            int bh = b * s->H + h, L = valid_len(s, b);
            const double *qs = q + (size_t)bh * N * D, *vs = v + (size_t)bh * N * M;
            double *os = out + (size_t)bh * N * M;
            memset(os, 0, sizeof(double) * N * M);
            normalise_rows(qs, L, D, k);
            for (int i = 0; i < L; i++) attend(i, all, L, s->causal, scale, qs, k, vs, D, M, os + i * M);
        }
    free(k);
    free(all);
}
