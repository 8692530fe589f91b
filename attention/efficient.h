/* Internal: the CPU backend of `efficient` (efficient.c), for the tests. */
#ifndef ATTN_EFFICIENT_H
#define ATTN_EFFICIENT_H

/* Rows per chunk of the CPU backend (efficient.c says why 16384); tests lower it to run
 * the several-chunk paths on short sequences. Not thread-safe. */
extern int eff_chunk_rows;

#endif
