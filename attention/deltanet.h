/* Internal: the pieces of the deltanet variant (deltanet.c) that its chunked form
 * (deltanet_wy.c) and the CUDA backend share. Not installed. */
#ifndef ATTN_DELTANET_H
#define ATTN_DELTANET_H

#include "variant.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Added under the square root of the L2 normalisation of q and k:
 * x / sqrt(|x|^2 + DN_EPS), so a zero vector stays zero (and differentiable). */
#define DN_EPS 1e-6
/* chunk=auto: the fastest of 8, 16, 32, 64 on the CPU (B = 1, H = 8, D = M = 64, CPU
 * time of forward + backward at N = 4096, one thread: 135, 129, 178, 242 ms). */
#define DN_CHUNK_AUTO 16
#define DN_CHUNK_AUTO_TEXT "16"

/* The chunk length for sequences of len positions (option chunk, at most len). */
int dn_chunk(const attn *a, int len);

/* xn = x / sqrt(|x|^2 + DN_EPS) (D floats); returns the norm. */
float dn_normalise(const float *x, int D, float *xn);

/* One position of the recurrence on S (D x M, row-major): S_t from S_{t-1} for
 * q, k (D), v (M), beta; o = S_t^T qn (M floats) when o is not NULL. tmp: 2 D + 2 M
 * floats. */
void dn_step_one(int D, int M, float *S, const float *q, const float *k, const float *v, float beta, float *o,
                 float *tmp);

/* The chunked (WY) form of one chunk of n <= C positions: S (D x M) from the state
 * before the chunk to the state after it, out rows (n x M) when out is not NULL.
 * ws: dn_wy_floats(C, D, M) floats. */
size_t dn_wy_floats(int C, int D, int M);
/* Whether chunks of length C take the chunked form (forward and backward); else the
 * one-position scan (C = 1). */
bool dn_wy_usable(int C);
void dn_wy_chunk(int n, int D, int M, const float *q, const float *k, const float *v, const float *beta, float *S,
                 float *out, float *ws);
/* Its backward: S the state before the chunk, G (D x M) = dL/dS after it on entry and
 * before it on return; dout rows (n x M) in, dq, dk (n x D), dv (n x M) and dbeta
 * (n, when not NULL) out. ws: dn_wy_floats(C, D, M) floats. */
void dn_wy_backward_chunk(int n, int D, int M, const float *q, const float *k, const float *v, const float *beta,
                          const float *S, float *G, const float *dout, float *dq, float *dk, float *dv, float *dbeta,
                          float *ws);

#ifdef __cplusplus
}
#endif

#endif
