/* Internal: the fused ("flash") softmax attention of the CUDA backends, forward and
 * backward, as softmax_cuda.cu (softmax and stateful-softmax's parallel mode),
 * stateful_softmax_cuda.cu (the prefill) and local_cuda.cu (the banded form) call it.
 * The kernels are attention/flash_softmax.cuh (also included by the kernel lab), the
 * host side attention/flash_softmax.cu, whose header comment has the design. C++ only. */
#ifndef ATTN_FLASH_SOFTMAX_H
#define ATTN_FLASH_SOFTMAX_H

#include "variant.h"

#include <stddef.h>

/* One problem: n_slices slices of equal valid length L (a run of attn_cuda_runs).
 * Query i of a slice sees key j when j < L, i - j < window, and j <= i (causal) or
 * j - i < window (non-causal); window = L for plain softmax (no window).
 * Slice s of q is at q + s * sq, its row i at + i * D (k: sk, D; v: sv, M; o, o2 and
 * dout: so, M; lse and delta: sl, 1). Row strides are the widths (rows contiguous).
 * Forward writes rows [0, L) of o (and of o2 when not NULL: the copy backward reads)
 * and, when lse is not NULL, the rows' log-sum-exps (base 2, of the scores times
 * scale * log2(e): lse_i = log2 sum_j 2^(cl s_ij)). Backward reads o2 (the saved O),
 * lse and dout, writes delta (workspace) and rows [0, L) of dq, dk, dv. */
struct flash_args {
    const float *q, *k, *v;
    float *o, *o2, *lse;
    const float *dout;
    float *delta;
    float *dq, *dk, *dv;
    long long sq, sk, sv, so, sl;
    long long n_slices;
    int L, D, M;
    float scale; /* multiplier of q.k (dq, dk carry it) */
    float cl;    /* scale * log2(e): scores in base 2 */
    int causal;
    int window; /* in [1, L] */
    int vec_qk, vec_vo; /* float4 global access allowed (set by the launchers) */
};

/* The fields every call fills: inputs, strides, sizes and masks (window <= 0 or >= L:
 * none). Outputs NULL, set by the caller. */
flash_args flash_args_make(const float *q, long long sq, const float *k, long long sk, const float *v, long long sv,
                           long long so, long long sl, long long n_slices, int L, int D, int M, double scale,
                           bool causal, long long window);

/* Forward (o; o2 and lse when not NULL) and backward (delta, then dq, dk, dv) of one
 * problem. precision: ab_precision (fp32: SIMT kernels; tf32: tensor cores). Queued
 * on the library's stream; nothing allocated. 0 or an error code. */
int flash_forward(const flash_args *a, int precision);
int flash_backward(const flash_args *a, int precision);

/* Testing knob (not thread-safe): 0 chooses the kernels by shape and device (default);
 * 1 forces the generic row kernels (any D, M; the fallback above 128); 2 forces the
 * fp32 tiles of 64 query rows, 3 of 128 (forward; backward's tiles are 64 either way). */
extern int flash_cuda_force;

/* ---- attention level (softmax, stateful-softmax, local) ----
 * Forward and backward of a validated shape with window w (<= 0 or >= N: none): runs of
 * equal lengths (attn_cuda_runs), padded rows zero. saved: flash_attn_saved_bytes (O,
 * then the lse at a 256-byte boundary; forward takes NULL: out only); the workspace
 * (a->ws) holds flash_attn_workspace_bytes (backward's delta). check_shape: what these
 * functions need of a shape (variant names the caller in the message). */
size_t flash_attn_saved_bytes(const attn_shape *s);
size_t flash_attn_workspace_bytes(const attn_shape *s);
int flash_attn_check_shape(const char *variant, const attn_shape *s);
int flash_attn_forward(attn *a, const attn_shape *s, long long window, const float *q, const float *k, const float *v,
                       float *out, void *saved);
int flash_attn_backward(attn *a, const attn_shape *s, long long window, const float *q, const float *k, const float *v,
                        const float *dout, const void *saved, float *dq, float *dk, float *dv);

#endif
