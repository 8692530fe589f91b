/* Internal: two matrix products for narrow operands (an inner or outer dimension of a
 * head's width, 16..a few hundred), written for Efficient Attention's shapes, where
 * OpenBLAS reaches 65-77% of its large-GEMM rate (B = 1, H = 8, N = 4096, D = M = 64,
 * one thread): (N x 64)(64 x 64) and (64 x N)(N x 64). These keep a 4 x 64 block of the
 * result in vector registers and stream the other operand past it: 82-91% on the same
 * shapes, no packing copies and no zeroing pass for beta = 0 (small_gemm.c measures).
 * Row-major, float, fused multiply-adds; the output width P must be a multiple of 16
 * (sg_fits), anything else goes to ab_sgemm. */
#ifndef ATTN_SMALL_GEMM_H
#define ATTN_SMALL_GEMM_H

#include <stdbool.h>

/* Whether the products below take an output width of P floats. */
static inline bool sg_fits(int P) { return P > 0 && P % 16 == 0; }

/* Y (t x P) = X (t x K) W (K x P), Y overwritten; P a multiple of 16, K >= 1. */
void sg_rows(int t, int K, int P, const float *X, int ldx, const float *W, int ldw, float *Y, int ldy);

/* W (K x P) += X^T Y with X (t x K), Y (t x P); P a multiple of 16. */
void sg_outer_acc(int t, int K, int P, const float *X, int ldx, const float *Y, int ldy, float *W, int ldw);

#endif
