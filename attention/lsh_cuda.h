/* Internal: the CUDA backend of `lsh` (lsh_cuda.cu). lsh.c puts these functions into
 * its attn_backend table when the build has CUDA (ATTNBENCH_HAVE_CUDA); saved_bytes
 * and the shape checks are the CPU's (same contract, same saved layout) plus
 * lsh_cuda_check_shape. */
#ifndef ATTN_LSH_CUDA_H
#define ATTN_LSH_CUDA_H

#include "variant.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int lsh_cuda_check_shape(const attn *a, const attn_shape *s);
size_t lsh_cuda_workspace_bytes(const attn *a, const attn_shape *s);
int lsh_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                     void *saved);
int lsh_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                      const float *dout, const void *saved, float *dq, float *dk, float *dv);

/* attn_lsh_buckets (lsh.h) for a CUDA object: q and buckets are device memory; the
 * workspace is already reserved for s. */
int lsh_cuda_buckets(attn *a, const attn_shape *s, const float *q, int *buckets);

/* For tests: the device's Philox words and normals, n consecutive indices from index0
 * of (seed, stream): words[4 e .. 4 e + 3] = ab_philox4x32(seed, stream, index0 + e),
 * normals[e] = ab_rng_normal(seed, stream, index0 + e) (device buffers; either may be
 * NULL). Queued on the library's stream. */
int lsh_cuda_rng(uint64_t seed, uint64_t stream, uint64_t index0, long long n, uint32_t *words, double *normals);

/* Bytes of device scratch the calls may use beyond the O(N) vectors: the (slice,
 * round) pairs of a call go in groups that fit (at least one pair). 128 MiB by default;
 * tests lower it to exercise the groups. Not thread-safe. */
extern size_t lsh_cuda_scratch_bytes;

#ifdef __cplusplus
}
#endif

#endif
