/* Internal: the favor feature map of `linear` (FAVOR+, the Performer's positive
 * orthogonal random features; Choromanski et al. 2020).
 *
 *   x' = D^(-1/4) x                       (so that phi(q).phi(k) estimates exp(q.k / sqrt(D)),
 *                                          the softmax kernel at the usual scale)
 *   a_r(x) = w_r . x' - |x'|^2 / 2        (r = 0..m-1, m = `features`, default 2 D)
 *   phi(x)_r = m^(-1/2) exp(a_r(x))       E_W[phi(q).phi(k)] = exp(q'.k') = exp(q.k / sqrt(D))
 *
 * The projection W [m x D], drawn from the attention's seed (favor_draw, the Philox
 * generator of harness/rng.h, so CPU and CUDA use the same numbers):
 *   block b = 0..ceil(m/D)-1: G_b[r][d] = normal(seed, stream 0, (b D + r) D + d), r, d < D;
 *     its rows orthonormalised by Gram-Schmidt in double, in row order (row r minus its
 *     projections on the orthonormal rows 0..r-1 of its block, then normalised);
 *   row i = b D + r of W (i < m; the last block keeps its first m - b D rows) is that
 *     orthonormal row times |n_i|, n_i[d] = normal(seed, stream 1, i D + d): the norm of a
 *     Gaussian vector, chi-distributed with D degrees of freedom (the Performer's
 *     default), so each row has the length distribution of an unstructured Gaussian row;
 *   W[i][d] is that double rounded to float.
 *
 * Stability. exp(a_r) overflows float for large |x| and q.k; the map therefore writes
 * phi(x)_r e^(-shift) (a "log-scaled" map, feature_maps.h): queries with their own
 * shift s_i = max_r a_r(q_i), so their largest feature is m^(-1/2); keys with one
 * shared shift c, at least the largest a_r over the keys combined so far (linear.c: the
 * running maximum over the chunks, the state rescaled by e^(c_old - c_new) when it
 * grows, as in recurrent mode; the CUDA backend: the largest over a slice's keys, in a
 * pass over them first). Every term of numerator and denominator of query i then
 * carries the same factor e^(-s_i - c), which cancels; linear attention adds its eps
 * scaled by the same factor (eps e^(-s_i - c)), so the result is exactly
 * sum_j phi(q_i).phi(k_j) v_j / (sum_j phi(q_i).phi(k_j) + eps) with the unshifted
 * features, whatever the shifts: parallel, causal, recurrent and prefill agree, and
 * gradients treat the shifts as constants (exact, since the result does not depend on
 * them). */
#ifndef ATTN_FAVOR_H
#define ATTN_FAVOR_H

#include "feature_maps.h"

#include <stddef.h>
#include <stdint.h>

/* Feature count m for input size D (p: the attention's options, NULL: defaults). */
size_t favor_dim(int D, const attn_params *p);

/* W [m x D] (floats, row-major) from seed, as above; scratch: favor_draw_scratch(D)
 * bytes. */
void favor_draw(uint64_t seed, int D, int m, void *scratch, float *W);
size_t favor_draw_scratch(int D);

/* The map's functions (feature_maps.h's contract; f->W is the projection). */
void favor_forward(const fm_spec *f, int n, const float *x, int ldx, float *phi, int ldphi, const fm_shift *sh);
void favor_backward(const fm_spec *f, int n, const float *x, int ldx, const float *phi, int ldphi, float *gphi,
                    int ldg, float *gx, int ldgx);

#endif
