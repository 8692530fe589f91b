/* Internal: the geometry of a sliding window over blocks of query rows, shared by the
 * CPU variants that attend to a band of keys (local; the window part of sparse).
 *
 * Query i sees keys i - w < j <= i (causal) or |i - j| < w (non-causal), clipped to
 * [0, L). Rows are processed in blocks of `rows` (at most BAND_ROWS); a block [r0, r1)
 * multiplies its rows with the keys [r0 - w + 1, r1) (causal) or [r0 - w + 1, r1 + w - 1),
 * clipped: rows + w - 1 scores a row where w are needed (causal), so a window much
 * narrower than the block wants a smaller block. */
#ifndef ATTN_BAND_CPU_H
#define ATTN_BAND_CPU_H

#include <stdbool.h>

#define BAND_ROWS 64 /* the most query rows per block */

static inline int band_n_blocks(int n, int rows) { return (n + rows - 1) / rows; }

/* The widest key range of a block (at most n): what the per-block buffers are sized for. */
static inline int band_key_span(long long w, bool causal, int n, int rows) {
    long long rb = n < rows ? n : rows;
    long long span = rb + (w - 1) + (causal ? 0 : w - 1);
    return span < n ? (int)span : n;
}

/* Keys [*k0, *k1) of the block of rows [r0, r1), clipped to [0, L). */
static inline void band_block_keys(long long w, bool causal, int r0, int r1, int L, int *k0, int *k1) {
    long long lo = (long long)r0 - w + 1, hi = causal ? r1 : (long long)r1 + w - 1;
    *k0 = lo < 0 ? 0 : (int)lo;
    *k1 = hi > L ? L : (int)hi;
}

/* Keys [*j0, *j1) of row i, clipped to [k0, L): its run inside its block's range. */
static inline void band_row_keys(long long w, bool causal, int i, int k0, int L, int *j0, int *j1) {
    long long lo = (long long)i - w + 1, hi = causal ? i + 1 : (long long)i + w;
    *j0 = lo < k0 ? k0 : (int)lo;
    *j1 = hi > L ? L : (int)hi;
}

/* Blocks whose indices differ by this much have disjoint key ranges (backward adds
 * into dK and dV class by class: block index mod period). */
static inline int band_period(long long w, bool causal, int n, int rows) {
    long long reach = (w - 1) * (causal ? 1 : 2); /* rows - 1 beyond the block's own */
    long long p = 1 + (reach + rows - 1) / rows;
    long long nblk = band_n_blocks(n, rows);
    return (int)(p < nblk ? p : nblk);
}

#endif
