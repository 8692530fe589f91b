/* Internal: the CUDA backend of `efficient` (efficient_cuda.cu). efficient.c puts these
 * functions into its attn_backend table when the build has CUDA (ATTNBENCH_HAVE_CUDA);
 * check_shape and saved_bytes (0) are the CPU's. */
#ifndef ATTN_EFFICIENT_CUDA_H
#define ATTN_EFFICIENT_CUDA_H

#include "variant.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

size_t eff_cuda_workspace_bytes(const attn *a, const attn_shape *s);
int eff_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                     void *saved);
int eff_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                      const float *dout, const void *saved, float *dq, float *dk, float *dv);

#ifdef __cplusplus
}
#endif

#endif
