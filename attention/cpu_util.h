/* Internal helpers shared by the CPU variants. */
#ifndef ATTN_CPU_UTIL_H
#define ATTN_CPU_UTIL_H

#include "variant.h"

#include "../harness/blas.h"

#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>

/* Threads for the loop over B*H slices. With at least as many slices as threads, the
 * slices run in parallel and each BLAS call is single-threaded (OpenBLAS's OpenMP build
 * does that inside a parallel region); with fewer, the slices run one after another and
 * BLAS uses all threads. Workspace is sized for attn_outer_threads() slots. */
static inline int attn_outer_threads(int n_slices) {
    int t = ab_threads();
    return n_slices >= t ? t : 1;
}

/* Valid length of batch b (N when no lengths). */
static inline int attn_valid_len(const attn_shape *s, int b) { return s->lengths ? s->lengths[b] : s->len; }

/* Element offsets of slice bh in a [B, H, N, X] tensor. */
static inline size_t attn_slice(const attn_shape *s, int bh, int x) { return (size_t)bh * (size_t)s->len * (size_t)x; }

/* Rounds bytes up to a multiple of 64 (so carved buffers stay aligned). */
static inline size_t attn_align64(size_t bytes) { return (bytes + 63u) & ~(size_t)63u; }

/* sum_i a[i] b[i] in double and max_i x[i] (-inf for n = 0), with 8 partial sums or
 * maxima so that the loops vectorise (a single running sum or maximum is a chain the
 * compiler may not reorder). */
static inline double attn_dot_d(const float *a, const float *b, int n) {
    double ps[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) ps[u] += (double)a[i + u] * (double)b[i + u];
    double s = 0;
    for (; i < n; i++) s += (double)a[i] * (double)b[i];
    for (int u = 0; u < 8; u++) s += ps[u];
    return s;
}

static inline float attn_max_f(const float *x, int n) {
    float pm[8];
    for (int u = 0; u < 8; u++) pm[u] = -INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) pm[u] = x[i + u] > pm[u] ? x[i + u] : pm[u];
    float m = -INFINITY;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int u = 0; u < 8; u++) m = pm[u] > m ? pm[u] : m;
    return m;
}

/* exp(x) for x <= 0, written to vectorise (libm's expf does not, and was half the
 * time of the elu forward at D = 64; also the exponentials of favor, efficient and
 * local). Range reduction x = n ln2 + r, |r| <= ln2/2
 * (ln2 split in a 16-bit-exact high part and a low part so n ln2_hi is exact), then
 * a degree-7 Taylor polynomial for e^r (truncation error |r|^8/8! < 5e-9, below
 * float rounding) and 2^n from the exponent bits. Accurate to ~2 ulp; inputs below
 * -87.3 (result under FLT_MIN) give 0. */
static inline float attn_exp_nonpos(float x) {
    float xc = x < -87.3f ? -87.3f : x;
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = xc - n * 0.693145751953125f - n * 1.42860682030941723e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } two_n;
    two_n.i = ((int32_t)n + 127) << 23;
    float e = p * two_n.f;
    return x < -87.3f ? 0.0f : e;
}

#endif
