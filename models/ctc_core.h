/* The arithmetic of the CTC loss (ctc.h) as inline functions that compile as C
 * (models/ctc.c), as C++ (the CPU emulator of CUDA) and as CUDA device code
 * (models/ctc_cuda.cu), so that both backends evaluate the very same expressions in
 * the same order; and the layout of the workspace they share.
 *
 * One row: T frames of K outputs (output 0 the blank, output c + 1 label c), L labels.
 * The extended sequence has S' = 2L + 1 states: state s is the blank for even s and
 * label (s - 1) / 2 for odd s. In log space, with lp_t(k) = x_tk - lse_t the log
 * softmax of frame t (lse_t = max + log sum exp, in double):
 *   alpha_0(0) = lp_0(blank), alpha_0(1) = lp_0(label 0), others -inf
 *   alpha_t(s) = lp_t(z_s) + lse(alpha_{t-1}(s), alpha_{t-1}(s-1), alpha_{t-1}(s-2))
 *                the last term only for a label state whose label differs from the
 *                label before it (ctc_skip)
 *   log p      = lse(alpha_{T-1}(S'-1), alpha_{T-1}(S'-2))
 *   beta_{T-1}(s) = 0 for the last two states (the last one when L = 0), else -inf
 *   beta_t(s)  = lse over s' in {s, s+1, s+2 (ctc_skip(s+2))} of lp_{t+1}(z_s') + beta_{t+1}(s')
 *                (beta excludes frame t's own output, so alpha + beta is the log of
 *                the probability of the paths through state s at t)
 *   d(-log p) / d x_tk = softmax_t(k) - sum_{s: z_s = k} exp(alpha_t(s) + beta_t(s) - log p)
 * The log-sum-exp of two or three terms takes the maximum out first and returns -inf
 * when every term is -inf, so no NaN arises from empty states; an impossible row
 * (L + repeats > T) ends with log p = -inf. */
#ifndef AB_MODELS_CTC_CORE_H
#define AB_MODELS_CTC_CORE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define CTC_HD __host__ __device__
#else
#define CTC_HD
#endif

static inline CTC_HD double ctc_lse2(double a, double b) {
    const double m = a > b ? a : b;
    if (m == -INFINITY) return -INFINITY;
    return m + log(exp(a - m) + exp(b - m));
}

static inline CTC_HD double ctc_lse3(double a, double b, double c) {
    double m = a > b ? a : b;
    m = c > m ? c : m;
    if (m == -INFINITY) return -INFINITY;
    return m + log(exp(a - m) + exp(b - m) + exp(c - m));
}

/* The output of state s: the blank (0) or its label's output. */
static inline CTC_HD int ctc_state_output(const int *labels, int s) { return (s & 1) ? labels[s >> 1] + 1 : 0; }

/* Whether state s may be entered from s - 2 (a label different from the one before). */
static inline CTC_HD int ctc_skip(const int *labels, int s) {
    return (s & 1) && s >= 3 && labels[s >> 1] != labels[(s >> 1) - 1];
}

/* lse_t of one frame's K outputs: the float maximum, then the sum of exp(x - max) in
 * output order, in double. */
static inline CTC_HD double ctc_frame_lse(const float *x, int K) {
    float mx = x[0];
    for (int k = 1; k < K; k++) mx = x[k] > mx ? x[k] : mx;
    double s = 0.0;
    for (int k = 0; k < K; k++) s += exp((double)x[k] - mx);
    return (double)mx + log(s);
}

/* alpha_t(s) from the previous frame's row `prev` (t > 0), or the start (t == 0). */
static inline CTC_HD double ctc_alpha(const double *prev, int t, int s, const int *labels, const float *x,
                                      double lse) {
    const double lp = (double)x[ctc_state_output(labels, s)] - lse;
    if (t == 0) return s < 2 ? lp : -INFINITY;
    const double a = prev[s], b = s >= 1 ? prev[s - 1] : -INFINITY;
    const double v = ctc_skip(labels, s) ? ctc_lse3(a, b, prev[s - 2]) : ctc_lse2(a, b);
    return lp + v;
}

/* beta_t(s) from beta_{t+1} (`next`) and frame t + 1's outputs x (lse its lse). */
static inline CTC_HD double ctc_beta(const double *next, int s, int S, const int *labels, const float *x, double lse) {
    const double a = next[s] + ((double)x[ctc_state_output(labels, s)] - lse);
    const double b = s + 1 < S ? next[s + 1] + ((double)x[ctc_state_output(labels, s + 1)] - lse) : -INFINITY;
    if (s + 2 < S && ctc_skip(labels, s + 2))
        return ctc_lse3(a, b, next[s + 2] + ((double)x[ctc_state_output(labels, s + 2)] - lse));
    return ctc_lse2(a, b);
}

/* log p from the last frame's alpha row (S' states). */
static inline CTC_HD double ctc_log_prob(const double *last, int S) {
    return S >= 2 ? ctc_lse2(last[S - 1], last[S - 2]) : last[S - 1];
}

/* Whether the best path of the row (first largest output per frame, repeats
 * collapsed, blanks dropped) is exactly `labels`. */
static inline CTC_HD int ctc_best_path_is(const float *x, int T, int K, const int *labels, int L) {
    int n = 0, prev = -1;
    for (int t = 0; t < T; t++) {
        const float *f = x + (size_t)t * K;
        int am = 0;
        for (int k = 1; k < K; k++)
            if (f[k] > f[am]) am = k;
        if (am != prev && am != 0) {
            if (n == L || labels[n] != am - 1) return 0;
            n++;
        }
        prev = am;
    }
    return n == L;
}

/* The workspace (ctc.h: ctc_ws_bytes), the same on both devices, in doubles:
 *   [0, 4)            the loss sums (weight, weighted nll, exact rows, counted rows)
 *   [4, 4 + B)        log p of each row (forward), -inf for an impossible row
 *   [4 + B, 4 + 2B)   each row's flags as doubles (bit 1 scored, bit 0 exact best path)
 *   then per row b, ctc_row_doubles(N, S, K) doubles from ctc_row_offset:
 *     lse (N), alpha (N x S'), beta (2 x S'), scratch (S' + K)
 *   with S' = 2 S + 1 for the row stride S of the labels (the largest L). */
static inline CTC_HD size_t ctc_row_doubles(int N, int S, int K) {
    const size_t Sx = 2 * (size_t)S + 1;
    return (size_t)N + (size_t)N * Sx + 3 * Sx + (size_t)K;
}
static inline CTC_HD size_t ctc_row_offset(int B, int N, int S, int K, int b) {
    return 4 + 2 * (size_t)B + (size_t)b * ctc_row_doubles(N, S, K);
}

#endif
