/* Internal: the CUDA backend of `local` (local_cuda.cu). local.c puts these functions
 * into its attn_backend table when the build has CUDA (ATTNBENCH_HAVE_CUDA);
 * state_bytes (the ring of the last `window` keys and values) is the CPU's, same
 * layout; saved_bytes is its own (O and the rows' log-sum-exps: local_cuda.cu), and
 * check_shape adds the fused kernels' limits to the CPU's checks. */
#ifndef ATTN_LOCAL_CUDA_H
#define ATTN_LOCAL_CUDA_H

#include "variant.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parallel mode. */
int local_cuda_check_shape(const attn *a, const attn_shape *s);
size_t local_cuda_saved_bytes(const attn *a, const attn_shape *s);
size_t local_cuda_workspace_bytes(const attn *a, const attn_shape *s);
int local_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                       void *saved);
int local_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                        const float *dout, const void *saved, float *dq, float *dk, float *dv);

/* Recurrent mode. */
int local_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state);
int local_cuda_prefill(attn *a, const attn_shape *s, int capacity, int prompt_len, const float *q, const float *k,
                       const float *v, float *out, void *state);
int local_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                    const float *v, float *out);
size_t local_cuda_step_workspace_bytes(const attn *a, const attn_shape *s, int capacity);

#ifdef __cplusplus
}
#endif

#endif
