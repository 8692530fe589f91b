/* Internal: the CUDA backend of `linformer` (linformer_cuda.cu). linformer.c puts these
 * functions into its attn_backend table when the build has CUDA (ATTNBENCH_HAVE_CUDA);
 * check_shape and saved_bytes are the CPU's (the same saved layout, linformer.h). */
#ifndef ATTN_LINFORMER_CUDA_H
#define ATTN_LINFORMER_CUDA_H

#include "variant.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

size_t lfm_cuda_workspace_bytes(const attn *a, const attn_shape *s);
int lfm_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                     void *saved);
int lfm_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                      const float *dout, const void *saved, float *dq, float *dk, float *dv);

#ifdef __cplusplus
}
#endif

#endif
