/* Internal: the CUDA backend of `sparse` (sparse_cuda.cu). sparse.c puts these functions
 * into its attn_backend table when the build has CUDA (ATTNBENCH_HAVE_CUDA);
 * check_shape, saved_bytes (O and the rows' log-sum-exps, the CPU's layout) and
 * state_bytes (the key/value cache of every position) are the CPU's. */
#ifndef ATTN_SPARSE_CUDA_H
#define ATTN_SPARSE_CUDA_H

#include "variant.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parallel mode. */
size_t sparse_cuda_workspace_bytes(const attn *a, const attn_shape *s);
int sparse_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                        void *saved);
int sparse_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                         const float *dout, const void *saved, float *dq, float *dk, float *dv);

/* Recurrent mode. */
int sparse_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state);
int sparse_cuda_prefill(attn *a, const attn_shape *s, int capacity, int prompt_len, const float *q, const float *k,
                        const float *v, float *out, void *state);
int sparse_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                     const float *v, float *out);
size_t sparse_cuda_step_workspace_bytes(const attn *a, const attn_shape *s, int capacity);

#ifdef __cplusplus
}
#endif

#endif
