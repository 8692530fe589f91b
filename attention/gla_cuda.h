/* Internal: the CUDA backend of `gla` (gla_cuda.cu). gla.c puts these functions into its
 * attn_backend table when the build has CUDA (ATTNBENCH_HAVE_CUDA); check_shape and
 * saved_bytes (nothing saved) are the CPU's. */
#ifndef ATTN_GLA_CUDA_H
#define ATTN_GLA_CUDA_H

#include "variant.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The chunked passes' workspace cap (bytes, default 1 GiB): slices go in groups that
 * keep it under this. The tests lower it to take the grouped path. */
extern size_t gla_cuda_ws_cap;
#define GLA_CUDA_WS_CAP_DEFAULT ((size_t)1 << 30)

/* The chunked form's carry kernel's warps: 0 (the default) chooses (about 8 rows of the
 * state a warp, at most 8); 1..8 asks for that many. The tests and the kernel lab set it
 * to compare; set it between calls only. */
extern int gla_cuda_carry_warps;

size_t gla_cuda_workspace_bytes(const attn *a, const attn_shape *s);
int gla_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                     void *saved);
int gla_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                      const float *dout, const void *saved, float *dq, float *dk, float *dv);
int gla_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state);
int gla_cuda_prefill(attn *a, const attn_shape *s, int capacity, int prompt_len, const float *q, const float *k,
                     const float *v, float *out, void *state);
int gla_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                  const float *v, float *out);

#ifdef __cplusplus
}
#endif

#endif
