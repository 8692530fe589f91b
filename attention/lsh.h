/* Internal: what the lsh variant exposes beyond attention.h, for tests and for the
 * CUDA backend that must reproduce its hashing. Not installed. */
#ifndef ATTN_LSH_H
#define ATTN_LSH_H

#include "attention.h"

/* Norms below this are floored when keys are normalised: k = q / max(|q|, floor). */
#define ATTN_LSH_NORM_FLOOR 1e-12

/* The buckets the lsh forward of `a` (its seed and options) computes for q [B,H,N,D]:
 * buckets[((r * B + b) * H + h) * N + i] in [0, 2*bits) for valid positions
 * i < L (lengths[b] or N), and -1 for padded positions (they are not hashed). Same
 * code path and same products as the forward, so the values are identical to the
 * ones the forward sorted by. Sizes the workspace like attn_reserve. Returns 0 or a
 * negative ATTN_E* code with a message. */
int attn_lsh_buckets(attn *a, const attn_shape *s, const float *q, int *buckets);

#endif
