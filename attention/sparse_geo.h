/* Internal: the window and stride of the sparse variant for a shape, shared by its CPU
 * (sparse.c) and CUDA (sparse_cuda.cu) backends. C and C++. */
#ifndef ATTN_SPARSE_GEO_H
#define ATTN_SPARSE_GEO_H

#include "variant.h"

#include <math.h>
#include <stdbool.h>

typedef struct {
    long long w; /* window */
    int s;       /* stride, at most n (a larger one allows the same pairs: none strided) */
    long long c; /* ceil(w / s): the least subsequence distance outside the window */
    bool strided; /* some pair is strided: c s <= n - 1 */
    int nsub;     /* longest subsequence: ceil(n / s) */
    int rows;     /* CPU: query rows per block (16, 32 or 64: the largest not above max(16, w / 2)),
                   * so that the band's scores a row (rows + w - 1) stay within 1.5 w */
} sp_geo;

static inline long long sp_auto(int n) {
    long long r = llround(sqrt((double)n));
    return r < 1 ? 1 : r;
}

/* Window and stride for sequences of n positions, "auto" resolved with n_auto. */
static inline sp_geo sp_geo_of(const attn *a, int n_auto, int n) {
    sp_geo g;
    g.w = a->p.window ? a->p.window : sp_auto(n_auto);
    long long st = a->p.stride ? a->p.stride : sp_auto(n_auto);
    g.s = (int)(st < n ? st : (n > 0 ? n : 1));
    g.c = (g.w + g.s - 1) / g.s;
    g.strided = g.c * g.s <= (long long)n - 1;
    g.nsub = (n + g.s - 1) / g.s;
    g.rows = g.w >= 128 ? 64 : g.w >= 64 ? 32 : 16;
    return g;
}

#endif
