/* Internal: the CUDA backend of `softmax` and `stateful-softmax` (softmax_cuda.cu,
 * stateful_softmax_cuda.cu, on the fused kernels of flash_softmax.cu). The C files
 * softmax.c and stateful_softmax.c put these functions into their attn_backend tables
 * when the build has CUDA (ATTNBENCH_HAVE_CUDA). The saved state differs from the
 * CPU's: O and the rows' log-sum-exps, O(N M) per slice, where the CPU keeps the N x N
 * probabilities. */
#ifndef ATTN_SOFTMAX_CUDA_H
#define ATTN_SOFTMAX_CUDA_H

#include "variant.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parallel mode (both variants). */
int smx_cuda_check_shape(const attn *a, const attn_shape *s);
size_t smx_cuda_saved_bytes(const attn *a, const attn_shape *s);
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

#ifdef __cplusplus
}
#endif

#endif
