/* Internal: the CUDA backend of `retention` (retention_cuda.cu). retention.c puts these
 * functions into its attn_backend table when the build has CUDA (ATTNBENCH_HAVE_CUDA);
 * check_shape, saved_bytes (nothing) and state_bytes (S, D x M per slice, the same
 * layout) are the CPU's. */
#ifndef ATTN_RETENTION_CUDA_H
#define ATTN_RETENTION_CUDA_H

#include "variant.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parallel mode; ret_cuda_check_sizes: the workspace's size fits (after the CPU's checks). */
int ret_cuda_check_sizes(const attn *a, const attn_shape *s);
size_t ret_cuda_workspace_bytes(const attn *a, const attn_shape *s);
int ret_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                     void *saved);
int ret_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, const float *dout,
                      const void *saved, float *dq, float *dk, float *dv);

/* Recurrent mode. */
int ret_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state);
int ret_cuda_prefill(attn *a, const attn_shape *s, int capacity, int prompt_len, const float *q, const float *k,
                     const float *v, float *out, void *state);
int ret_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                  const float *v, float *out);

#ifdef __cplusplus
}
#endif

#endif
