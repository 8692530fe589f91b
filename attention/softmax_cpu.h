/* Internal: the CPU softmax attention shared by the `softmax` and `stateful-softmax`
 * variants (softmax.c holds the code, stateful_softmax.c adds the key/value cache). */
#ifndef ATTN_SOFTMAX_CPU_H
#define ATTN_SOFTMAX_CPU_H

#include "variant.h"

#include <stdbool.h>
#include <stddef.h>

/* Queries are processed in blocks of this many rows: a block's scores [rows, keys]
 * are one GEMM, and a causal block only multiplies the keys it can see. */
#define SMX_ROW_BLOCK 128

/* The option table and defaults of both variants ("scale"). */
#define SMX_N_OPTIONS 1
extern const attn_option_spec smx_options[SMX_N_OPTIONS];
void smx_defaults(attn_params *p);

/* Parallel mode (identical for both variants). */
int smx_check_shape(const attn *a, const attn_shape *s);
size_t smx_saved_bytes(const attn *a, const attn_shape *s);
size_t smx_workspace_bytes(const attn *a, const attn_shape *s);
int smx_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                void *saved);
int smx_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, const float *dout,
                 const void *saved, float *dq, float *dk, float *dv);

/* Useful floating-point operations (attn_variant.flops, both variants): the products
 * Q K^T and P V, 2 (D + M) per (query, key) pair, over N^2 pairs (N (N + 1) / 2 when
 * causal) per slice; forward plus backward 3 times that. */
double smx_flops(const attn *a, const attn_shape *s, bool backward);

/* Number of row blocks for n rows. */
static inline int smx_n_blocks(int n) { return (n + SMX_ROW_BLOCK - 1) / SMX_ROW_BLOCK; }

/* Forward of query rows [r0, r1) of one (b, h) slice against keys [0, kc):
 * q (N, D), k (>= kc, D), v (>= kc, M), out (N, M) are the slice's tensors (row 0 of
 * each). p receives the block's probabilities: row i - r0 at p + (i - r0) * ldp,
 * columns [0, kc); causal: row i sees keys [0, i] (entries after i are set to 0), and
 * kc must be r1; otherwise every row sees [0, kc). inner_par: parallelise the
 * element-wise work over rows (when the caller runs serially and BLAS has the threads). */
void smx_block_forward(const float *q, const float *k, const float *v, float *out, float *p, size_t ldp, int r0,
                       int r1, int kc, int D, int M, bool causal, float scale, bool inner_par);

/* In place: x[0..n) <- softmax(x[0..n)), max-subtracted, sum in double. n >= 1. */
void smx_softmax_row(float *x, int n);

#endif
