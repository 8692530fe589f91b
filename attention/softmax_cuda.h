/* Internal: the CUDA backend of `softmax` and `stateful-softmax` (softmax_cuda.cu,
 * stateful_softmax_cuda.cu). The C files softmax.c and stateful_softmax.c put these
 * functions into their attn_backend tables when the build has CUDA
 * (ATTNBENCH_HAVE_CUDA); shape checks and saved_bytes are the CPU's (same contract). */
#ifndef ATTN_SOFTMAX_CUDA_H
#define ATTN_SOFTMAX_CUDA_H

#include "variant.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parallel mode (both variants). */
size_t smx_cuda_workspace_bytes(const attn *a, const attn_shape *s);
int smx_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                     void *saved);
int smx_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                      const float *dout, const void *saved, float *dq, float *dk, float *dv);

/* Recurrent mode (stateful-softmax). */
size_t ss_cuda_state_bytes(const attn *a, const attn_shape *s, int capacity);
int ss_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state);
int ss_cuda_prefill(attn *a, const attn_shape *s, int capacity, int prompt_len, const float *q, const float *k,
                    const float *v, float *out, void *state);
int ss_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                 const float *v, float *out);
size_t ss_cuda_step_workspace_bytes(const attn *a, const attn_shape *s, int capacity);

/* Floats of score scratch the backward (and the prefill) may use: it works on as many
 * slices and query rows at a time as fit (at least one row of one slice). 32 Mi floats
 * (128 MiB) by default; tests lower it to exercise the chunked paths. Not thread-safe. */
extern size_t smx_cuda_scratch_floats;

#ifdef __cplusplus
}

/* ---- shared by softmax_cuda.cu and stateful_softmax_cuda.cu (C++ only) ---- */

/* The slices of one run (equal valid length L) of a softmax attention problem: slice i
 * of q, k, v, out starts at q + i * sq (and so on); rows are D (q, k) or M (v, out)
 * floats. Causal: query i sees keys [0, min(i + 1, L)); otherwise keys [0, L). */
struct smx_cuda_problem {
    const float *q, *k, *v;
    float *out;
    long long sq, sk, sv, so;
    int D, M;
    float scale;
    bool causal;
    int L;
};

/* Query rows [r0, r1) of slices [s_off, s_off + n) of the problem: the scores
 * scale Q K^T go into pb (row i - r0 of slice j at pb + j * p_stride + (i - r0) * p_ld),
 * are turned into probabilities in place (zeros from the row's last visible key up to
 * column p_end, p_end >= the keys the block multiplies), and out rows [r0, r1) =
 * probabilities times V. */
int smx_cuda_attend_rows(const smx_cuda_problem *pr, long long s_off, long long n, int r0, int r1, float *pb,
                         long long p_ld, long long p_stride, int p_end);

/* Row blocks of a causal problem: rows per block, so that the blocks skip most of the
 * upper triangle (at most 8 blocks, at least 256 rows each). */
int smx_cuda_causal_block_rows(int L);

#endif

#endif
