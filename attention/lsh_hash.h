/* The hashing arithmetic of the lsh variant, shared by its CPU (lsh.c) and CUDA
 * (lsh_cuda.cu) backends so that both choose the same buckets bit for bit: inline
 * functions that compile as C and as CUDA device code. Not installed.
 *
 * For a valid position with query x [D] and rotation R_r [D x bits] (floats, from
 * ab_rng_normal rounded to float):
 *   ss   = sum_d x_d^2 in double, d = 0..D-1 in order (each term exact in double);
 *   invn = (float)(1 / max(sqrt(ss), ATTN_LSH_NORM_FLOOR)), nrm = (float)sqrt(ss);
 *   k_d  = x_d * invn (one float product, the attention's key too);
 *   p_j  = fmaf(k_{D-1}, R[D-1][j], ... fmaf(k_1, R[1][j], fmaf(k_0, R[0][j], 0))),
 *          a chain of fused multiply-adds in the order d = 0..D-1, so no compiler or
 *          BLAS summation order enters;
 *   bucket = first argmax of [p_0 .. p_{bits-1}, -p_0 .. -p_{bits-1}] (strict
 *          comparisons in that order: bucket j < bits is +p_j, bits + j is -p_j).
 * The argmax is kept online (attn_lsh_argmax): the first maximum of +p and of -p
 * separately, then -p's wins only if strictly larger; this is the same choice as
 * scanning the 2*bits values in order, NaN included (a comparison with NaN is false
 * in both). */
#ifndef ATTN_LSH_HASH_H
#define ATTN_LSH_HASH_H

#include <math.h>

#ifdef __CUDACC__
#define ATTN_LSH_HD __host__ __device__
#else
#define ATTN_LSH_HD
#endif

/* Norms below this are floored when keys are normalised: k = q / max(|q|, floor). */
#define ATTN_LSH_NORM_FLOOR 1e-12

/* One term of the sum of squares (exact product, so fused or not gives the same). */
static inline ATTN_LSH_HD double attn_lsh_sumsq_step(double ss, float x) { return fma((double)x, (double)x, ss); }

/* invn from the sum of squares; *nrm gets the norm. */
static inline ATTN_LSH_HD float attn_lsh_inv_norm(double ss, float *nrm) {
    const double n = sqrt(ss);
    *nrm = (float)n;
    return (float)(1.0 / (n > ATTN_LSH_NORM_FLOOR ? n : ATTN_LSH_NORM_FLOOR));
}

/* One step of a projection chain: acc + k r, fused. */
static inline ATTN_LSH_HD float attn_lsh_proj_step(float acc, float k, float r) { return fmaf(k, r, acc); }

typedef struct {
    float pmax, nmax; /* largest +p_j and -p_j so far */
    int amax, namax;  /* their first indices */
} attn_lsh_argmax;

static inline ATTN_LSH_HD attn_lsh_argmax attn_lsh_argmax_first(float p0) {
    attn_lsh_argmax m;
    m.pmax = p0;
    m.nmax = -p0;
    m.amax = 0;
    m.namax = 0;
    return m;
}

/* p_j for j = 1, 2, ... in increasing order. */
static inline ATTN_LSH_HD void attn_lsh_argmax_add(attn_lsh_argmax *m, int j, float p) {
    if (p > m->pmax) m->pmax = p, m->amax = j;
    if (-p > m->nmax) m->nmax = -p, m->namax = j;
}

static inline ATTN_LSH_HD int attn_lsh_argmax_bucket(const attn_lsh_argmax *m, int bits) {
    return m->nmax > m->pmax ? bits + m->namax : m->amax;
}

#endif
