/* Internal: the CUDA backend of `linear` and `polynomial` (linear_cuda.cu, with its fused
 * kernels in linear_chunk.cuh and poly_chunk.cuh). linear.c
 * puts these functions into the attn_backend table of both variants when the build
 * has CUDA (ATTNBENCH_HAVE_CUDA); check_shape (the CPU's, plus: the feature map has
 * CUDA kernels), saved_bytes (0: forward saves nothing) and state_bytes (Saug,
 * B*H*C*(M+1) floats) are linear.c's, same contract. The feature maps' kernels are
 * reached through their table (feature_maps.h: each entry's `cuda`). */
#ifndef ATTN_LINEAR_CUDA_H
#define ATTN_LINEAR_CUDA_H

#include "variant.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parallel mode. */
size_t lin_cuda_workspace_bytes(const attn *a, const attn_shape *s);
int lin_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                     void *saved);
int lin_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                      const float *dout, const void *saved, float *dq, float *dk, float *dv);

/* Recurrent mode. */
size_t lin_cuda_state_bytes(const attn *a, const attn_shape *s, int capacity);
int lin_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state);
int lin_cuda_prefill(attn *a, const attn_shape *s, int capacity, int prompt_len, const float *q, const float *k,
                     const float *v, float *out, void *state);
int lin_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                  const float *v, float *out);
size_t lin_cuda_step_workspace_bytes(const attn *a, const attn_shape *s, int capacity);

/* Floats of workspace the batched path's parallel calls may use: they work on as many
 * slices and chunks at a time as fit (at least one chunk of one slice). 32 Mi floats
 * (128 MiB) by default; tests lower it to exercise the grouped paths. (The fused path's
 * workspace is bounded by its segment target instead.) Not thread-safe. */
extern size_t lin_cuda_ws_floats;

/* Knobs of the fused chunked kernels (linear_chunk.cuh; the kernel lab and the tests set
 * them, not thread-safe): lin_cuda_path 0 = the fused kernels where the map has them and
 * their tiles fit (else the batched cuBLAS path), 1 = always the batched path (the
 * previous approach; polynomial always takes it); lin_chunk_blocks: the (slice, segment)
 * blocks a call aims for (0: twice the device's multiprocessors); lin_chunk_threads:
 * threads per block (a multiple of 32, default 256); lin_chunk_prefetch: 1 = elu's
 * kernels fetch the next chunk's rows into registers while they work on a chunk
 * (linear_chunk_tiles.cuh's lc_stage; default 0 until a GPU has timed it). */
extern int lin_cuda_path;
extern long long lin_chunk_blocks;
extern int lin_chunk_threads;
extern int lin_chunk_prefetch;

#ifdef __cplusplus
}
#endif

#endif
