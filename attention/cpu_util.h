/* Internal helpers shared by the CPU variants. */
#ifndef ATTN_CPU_UTIL_H
#define ATTN_CPU_UTIL_H

#include "variant.h"

#include "../harness/blas.h"

#include <omp.h>
#include <stddef.h>

/* Threads for the loop over B*H slices. With at least as many slices as threads, the
 * slices run in parallel and each BLAS call is single-threaded (OpenBLAS's OpenMP build
 * does that inside a parallel region); with fewer, the slices run one after another and
 * BLAS uses all threads. Workspace is sized for attn_outer_threads() slots. */
static inline int attn_outer_threads(int n_slices) {
    int t = ab_threads();
    return n_slices >= t ? t : 1;
}

/* Valid length of batch b (N when no lengths). */
static inline int attn_valid_len(const attn_shape *s, int b) { return s->lengths ? s->lengths[b] : s->len; }

/* Element offsets of slice bh in a [B, H, N, X] tensor. */
static inline size_t attn_slice(const attn_shape *s, int bh, int x) { return (size_t)bh * (size_t)s->len * (size_t)x; }

/* Rounds bytes up to a multiple of 64 (so carved buffers stay aligned). */
static inline size_t attn_align64(size_t bytes) { return (bytes + 63u) & ~(size_t)63u; }

#endif
