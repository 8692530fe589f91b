/* Internal: what the lsh variant exposes beyond attention.h, for tests and for the
 * CUDA backend that must reproduce its hashing (lsh_hash.h) and its saved layout. Not
 * installed. */
#ifndef ATTN_LSH_H
#define ATTN_LSH_H

#include "attention.h"
#include "lsh_hash.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The buckets the lsh forward of `a` (its seed and options) computes for q [B,H,N,D]:
 * buckets[((r * B + b) * H + h) * N + i] in [0, 2*bits) for valid positions
 * i < L (lengths[b] or N), and -1 for padded positions (they are not hashed). Same
 * code path and same products as the forward, so the values are identical to the
 * ones the forward sorted by. Sizes the workspace like attn_reserve. On a CUDA object
 * q and buckets are device memory (and the work is queued on the library's stream).
 * Returns 0 or a negative ATTN_E* code with a message. */
int attn_lsh_buckets(attn *a, const attn_shape *s, const float *q, int *buckets);

/* What forward saves for backward (both devices), as byte offsets into `saved`:
 *   perm    int32 [BH][R][N]  sorted order of each round (first L entries used)
 *   lse     float [BH][R][N]  logsumexp of each round per query (original positions)
 *   lse_tot float [BH][N]     logsumexp over rounds (logsumexp combine only)
 *   out     float [BH][N][M]  the combined output (logsumexp combine only)
 * Offsets are multiples of 64 bytes; lse_tot = out = bytes when unused. */
typedef struct {
    size_t perm, lse, lse_tot, out, bytes;
} attn_lsh_saved_layout;

attn_lsh_saved_layout attn_lsh_saved(size_t BH, int rounds, int N, int M, bool lse_combine);

#ifdef __cplusplus
}
#endif

#endif
