/* The draws of sampling, one value per position from its head's outputs, as inline
 * functions that the host (layers_cpu.c's draw_rows, sample_run.c's sample_draw,
 * mixture.c's mixture_sample) and the CUDA kernel (layers_cuda.cu: draw_rows_cuda)
 * share, so that a value drawn on either device is the same function of the same
 * numbers. They differ only where glibc's and CUDA's exp, log and log1p round
 * differently (an ulp): a draw then changes only when u times the total falls within
 * that of a boundary between two values. */
#ifndef AB_MODELS_DRAW_CORE_H
#define AB_MODELS_DRAW_CORE_H

#include "mixture_core.h"

/* The first index of the largest of x[0..n). */
static inline MIX_HD int draw_argmax_core(const float *x, int n) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

/* A class from logits x (n): the first i whose cumulative weight e^((x_i - max) / T)
 * exceeds u (in [0, 1)) times the total, in double; T = 0 (or not > 0): the first
 * largest. */
static inline MIX_HD int draw_categorical_core(const float *x, int n, double T, double u) {
    const int am = draw_argmax_core(x, n);
    if (!(T > 0)) return am;
    const double mx = x[am];
    double z = 0;
    for (int i = 0; i < n; i++) z += exp(((double)x[i] - mx) / T);
    double c = 0;
    const double target = u * z;
    for (int i = 0; i < n; i++) {
        c += exp(((double)x[i] - mx) / T);
        if (c > target) return i;
    }
    return am; /* u z at the top of the sum's rounding: the likeliest class */
}

/* A value 0..255 from a logistic-mixture position p (3K: logits, means, log-scales)
 * and two uniforms (layers.h: mixture_sample). */
static inline MIX_HD int draw_mixture_core(const float *p, int K, double u1, double u2) {
    /* the component: the first k whose cumulative weight exceeds u1 times the total */
    float mx = p[0];
    for (int k = 1; k < K; k++) mx = p[k] > mx ? p[k] : mx;
    double total = 0.0;
    for (int k = 0; k < K; k++) total += exp((double)p[k] - mx);
    const double t = u1 * total;
    double cum = 0.0;
    int pick = -1, last = 0;
    for (int k = 0; k < K && pick < 0; k++) {
        const double e = exp((double)p[k] - mx);
        if (e > 0.0) last = k;
        cum += e;
        if (t < cum) pick = k;
    }
    if (pick < 0) pick = last; /* u1 at (or rounding to) 1 */
    /* the logistic inverse CDF at u2, kept inside [1e-5, 1 - 1e-5] as PixelCNN++ does */
    if (!(u2 >= MIX_TINY_MASS)) u2 = MIX_TINY_MASS;
    if (!(u2 <= 1.0 - MIX_TINY_MASS)) u2 = 1.0 - MIX_TINY_MASS;
    const double x = (double)p[K + pick] + exp(mix_log_scale(p[2 * K + pick])) * (log(u2) - log1p(-u2));
    /* the bin of x: v = round((x + 1) 255 / 2), clamped to 0..255 (the edge bins hold the tails) */
    const double y = (x + 1.0) * 127.5;
    if (!(y > 0.0)) return 0;
    if (y >= (double)(MIX_VALUES - 1)) return MIX_VALUES - 1;
    return (int)floor(y + 0.5);
}

#endif
