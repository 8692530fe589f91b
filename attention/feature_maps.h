/* Internal: feature maps phi of linear attention, sim(q, k) = phi(q) . phi(k).
 *
 *   elu     phi(x) = elu(x) + 1                                    C = D
 *   taylor  phi(x) = [1, x / max(|x|, FM_TAYLOR_NORM_FLOOR)]        C = 1 + D
 *           (sim = 1 + cos(q, k); below the floor, in particular at x = 0, the
 *           direction part is x / floor, which is continuous at |x| = floor and 0 at
 *           x = 0, so sim = 1 there: a zero vector is "orthogonal" to everything)
 *   poly    phi(x) = [c, sqrt(2 c scale) x, scale x_a x_b (a, b = 0..D-1, a major)]
 *           C = 1 + D + D^2; phi(q) . phi(k) = (c + scale q.k)^2 exactly
 *
 * Rows are processed independently; x is [n x D] with leading dimension ldx, phi is
 * [n x C] with leading dimension ldphi. */
#ifndef ATTN_FEATURE_MAPS_H
#define ATTN_FEATURE_MAPS_H

#include <stddef.h>

#define FM_TAYLOR_NORM_FLOOR 1e-12

typedef enum { FM_ELU = 0, FM_TAYLOR = 1, FM_POLY = 2 } fm_kind;

typedef struct {
    fm_kind kind;
    int D, C;        /* input and feature sizes */
    float c;         /* poly: constant feature */
    float lin;       /* poly: sqrt(2 c scale), weight of the linear features */
    float scale;     /* poly: weight of the quadratic features */
} fm_spec;

/* Feature size of a map for input size D (size_t so callers can check overflow). */
size_t fm_dim(fm_kind kind, int D);

/* Fills *f; c and scale are read by FM_POLY only. */
void fm_init(fm_spec *f, fm_kind kind, int D, double c, double scale);

/* phi[i, :] = phi(x[i, :]) for i < n. */
void fm_forward(const fm_spec *f, int n, const float *x, int ldx, float *phi, int ldphi);

/* gx[i, :] = (d phi(x_i) / d x_i)^T gphi[i, :] for i < n (overwrites gx). */
void fm_backward(const fm_spec *f, int n, const float *x, int ldx, const float *gphi, int ldg, float *gx,
                 int ldgx);

#endif
