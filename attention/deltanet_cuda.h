/* Internal: the CUDA backend of `deltanet` (deltanet_cuda.cu). deltanet.c puts these
 * functions into its attn_backend table when the build has CUDA (ATTNBENCH_HAVE_CUDA);
 * check_shape, saved_bytes (the state at the start of every chunk, the CPU's layout)
 * and state_bytes (S per slice) are the CPU's. */
#ifndef ATTN_DELTANET_CUDA_H
#define ATTN_DELTANET_CUDA_H

#include "variant.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The workspace the backend sizes itself to (bytes): slices and blocks
 * go in groups that keep it under this (default 1 GiB). The tests lower it to take the
 * grouped paths. */
extern size_t dn_cuda_ws_cap;

size_t dn_cuda_workspace_bytes(const attn *a, const attn_shape *s);
int dn_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                    void *saved);
int dn_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                     const float *dout, const void *saved, float *dq, float *dk, float *dv);
int dn_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state);
int dn_cuda_prefill(attn *a, const attn_shape *s, int capacity, int prompt_len, const float *q, const float *k,
                    const float *v, float *out, void *state);
int dn_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                 const float *v, float *out);

#ifdef __cplusplus
}
#endif

#endif
