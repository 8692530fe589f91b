/* The CTC loss on the CPU, best-path decoding and the edit distance (ctc.h). The
 * formulas are ctc_core.h's, shared with the CUDA kernels. Rows run in parallel: each
 * row is computed start to end by one thread, writing only its own nll, log p, flags,
 * workspace and gradient rows, so the dynamic schedule (rows differ in length) cannot
 * change a result; the sums over rows run afterwards in row order. */
#include "ctc.h"

#include "ctc_core.h"

#include "../harness/error.h"
#include "../harness/memory.h"

#include <math.h>
#include <stdint.h>

size_t ctc_ws_bytes(const ctc_dims *d) {
    if (d->B < 1 || d->N < 1 || d->K < 2 || d->S < 0) return 0;
    /* ctc_row_doubles without overflow: N (2S + 2) + 3 (2S + 1) + K */
    const size_t Sx = 2 * (size_t)d->S + 1;
    size_t row, tail, n;
    if (ab_mul_size((size_t)d->N, Sx + 1, &row)) return 0;
    tail = 3 * Sx + (size_t)d->K;
    if (row > SIZE_MAX - tail) return 0;
    row += tail;
    if (ab_mul_size(row, (size_t)d->B, &n) || n > SIZE_MAX / sizeof(double) - 4 - 2 * (size_t)d->B) return 0;
    return sizeof(double) * (n + 4 + 2 * (size_t)d->B);
}

int ctc_dims_check(const ctc_dims *d) {
    if (!d) return ab_fail(AB_EINVAL, "ctc: NULL dims");
    if (d->B < 1 || d->N < 1 || d->K < 2 || d->S < 0)
        return ab_fail(AB_EINVAL, "ctc: %d rows of %d frames of %d outputs with %d label slots (need rows >= 1, "
                                  "frames >= 1, outputs >= 2: the blank and a label, slots >= 0)",
                       d->B, d->N, d->K, d->S);
    if (ctc_ws_bytes(d) == 0)
        return ab_fail(AB_EINVAL, "ctc: the workspace of %d rows of %d frames and %d label slots overflows", d->B, d->N,
                       d->S);
    return 0;
}

/* alpha of one row: lse (T), alpha rows of stride Sx; returns log p. */
static double row_forward(const float *x, int T, int K, const int *lab, int L, size_t Sx, double *lse,
                          double *alpha) {
    if (T == 0) return L == 0 ? 0.0 : -INFINITY;
    const int S = 2 * L + 1;
    for (int t = 0; t < T; t++) lse[t] = ctc_frame_lse(x + (size_t)t * K, K);
    for (int t = 0; t < T; t++) {
        double *row = alpha + (size_t)t * Sx;
        const double *prev = t ? row - Sx : NULL;
        for (int s = 0; s < S; s++) row[s] = ctc_alpha(prev, t, s, lab, x + (size_t)t * K, lse[t]);
    }
    return ctc_log_prob(alpha + (size_t)(T - 1) * Sx, S);
}

void ctc_forward(ce_stats *st, float *nll, const ctc_dims *d, const float *logits, const int *lengths,
                 const int *labels, const int *counts, const float *weights, void *ws) {
    const int B = d->B, N = d->N, K = d->K, S = d->S;
    const size_t Sx = 2 * (size_t)S + 1;
    double *w = ws, *logp = w + 4, *flags = w + 4 + B;
#pragma omp parallel for schedule(dynamic, 1) if (B > 1)
    for (int b = 0; b < B; b++) {
        const float wb = weights ? weights[b] : 1.0f;
        if (!(wb > 0.0f)) {
            nll[b] = 0.0f;
            logp[b] = 0.0;
            flags[b] = 0.0;
            continue;
        }
        const int T = lengths ? lengths[b] : N, L = counts[b];
        const float *x = logits + (size_t)b * N * K;
        const int *lab = labels + (size_t)b * S;
        double *row = w + ctc_row_offset(B, N, S, K, b);
        const double lp = row_forward(x, T, K, lab, L, Sx, row, row + N);
        logp[b] = lp;
        nll[b] = (float)-lp;
        flags[b] = 2.0 + ctc_best_path_is(x, T, K, lab, L);
    }
    double sw = 0, swl = 0;
    long long correct = 0, counted = 0;
    for (int b = 0; b < B; b++) {
        if (!((int)flags[b] & 2)) continue;
        const double wb = weights ? weights[b] : 1.0;
        sw += wb;
        swl += wb * -logp[b];
        correct += (int)flags[b] & 1;
        counted++;
    }
    w[0] = sw, w[1] = swl, w[2] = (double)correct, w[3] = (double)counted;
    st->weight_sum = sw;
    st->loss = sw > 0 ? swl / sw : 0.0;
    st->correct = correct;
    st->counted = counted;
}

/* The gradient of one row (scale = w / weight_sum) from its forward tables; beta: two
 * rows of Sx, occ: K doubles of scratch. */
static void row_backward(float *dl, const float *x, int T, int K, const int *lab, int L, size_t Sx,
                         const double *lse, const double *alpha, double logp, double scale, double *beta,
                         double *occ) {
    const int S = 2 * L + 1;
    double *cur = beta, *nxt = beta + Sx;
    for (int s = 0; s < S; s++) cur[s] = s >= S - 2 ? 0.0 : -INFINITY;
    for (int t = T - 1; t >= 0; t--) {
        const double *a = alpha + (size_t)t * Sx;
        const float *xt = x + (size_t)t * K;
        for (int k = 0; k < K; k++) occ[k] = 0.0;
        for (int s = 0; s < S; s++) occ[ctc_state_output(lab, s)] += exp(a[s] + cur[s] - logp);
        float *g = dl + (size_t)t * K;
        for (int k = 0; k < K; k++) g[k] += (float)(scale * (exp((double)xt[k] - lse[t]) - occ[k]));
        if (t > 0) {
            for (int s = 0; s < S; s++) nxt[s] = ctc_beta(cur, s, S, lab, xt, lse[t]);
            double *tmp = cur;
            cur = nxt;
            nxt = tmp;
        }
    }
}

void ctc_backward(float *dlogits, const ctc_dims *d, const float *logits, const int *lengths, const int *labels,
                  const int *counts, const float *weights, double weight_sum, void *ws) {
    if (!(weight_sum > 0)) return;
    const int B = d->B, N = d->N, K = d->K, S = d->S;
    const size_t Sx = 2 * (size_t)S + 1;
    double *w = ws;
    const double *logp = w + 4;
#pragma omp parallel for schedule(dynamic, 1) if (B > 1)
    for (int b = 0; b < B; b++) {
        const float wb = weights ? weights[b] : 1.0f;
        if (!(wb > 0.0f) || logp[b] == -INFINITY) continue;
        const int T = lengths ? lengths[b] : N;
        double *row = w + ctc_row_offset(B, N, S, K, b);
        double *beta = row + N + (size_t)N * Sx;
        row_backward(dlogits + (size_t)b * N * K, logits + (size_t)b * N * K, T, K, labels + (size_t)b * S, counts[b],
                     Sx, row, row + N, logp[b], (double)wb / weight_sum, beta, beta + 2 * Sx);
    }
}

/* ---- decoding and scoring ---- */

int ctc_min_frames(const int *labels, int L) {
    int n = L;
    for (int j = 1; j < L; j++) n += labels[j] == labels[j - 1];
    return n;
}

int ctc_best_path(const float *x, int T, int K, int *out) {
    int n = 0, prev = -1;
    for (int t = 0; t < T; t++) {
        const float *f = x + (size_t)t * K;
        int am = 0;
        for (int k = 1; k < K; k++)
            if (f[k] > f[am]) am = k;
        if (am != prev && am != CTC_BLANK) out[n++] = am - 1;
        prev = am;
    }
    return n;
}

int ctc_edit_distance(const int *hyp, int nh, const int *ref, int nr, int *work) {
    /* work[j] holds row i of the table D[i][j] (the distance between the first i of hyp
     * and the first j of ref), one row at a time */
    for (int j = 0; j <= nr; j++) work[j] = j;
    for (int i = 1; i <= nh; i++) {
        int diag = work[0]; /* D[i-1][j-1] */
        work[0] = i;
        for (int j = 1; j <= nr; j++) {
            const int up = work[j]; /* D[i-1][j] */
            int v = diag + (hyp[i - 1] != ref[j - 1]);
            if (up + 1 < v) v = up + 1;
            if (work[j - 1] + 1 < v) v = work[j - 1] + 1;
            work[j] = v;
            diag = up;
        }
    }
    return work[nr];
}

int ctc_best_path_errors(const float *x, int T, int K, const int *ref, int nr, int *work) {
    const int nh = ctc_best_path(x, T, K, work);
    return ctc_edit_distance(work, nh, ref, nr, work + T);
}
