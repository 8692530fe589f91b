/* efficient: Efficient Attention (Shen et al. 2018, "Efficient Attention: Attention
 * with Linear Complexities"), non-causal only, on the CPU.
 *
 *   Q'_i  = softmax over the D features of query row i          (i < L)
 *   K'_jd = exp(k_jd) / sum_{j' < L} exp(k_j'd)                  (softmax of each key
 *           feature d over the valid positions j < L of the sequence)
 *   C     = sum_{j < L} K'_j^T v_j                               (D x M, the "context")
 *   out_i = Q'_i C                                                (i < L; rows >= L zero)
 * No scale (the definition has none) and no eps (both normalisations sum to 1). Both
 * softmaxes subtract their maximum (per query row; per key feature over the valid
 * positions), which cancels exactly. Time O(N D M), memory O(D M) beyond the tensors.
 *
 * Backward, with G = dout:
 *   dC    = sum_{i < L} Q'_i^T G_i;   dQ'_i = G_i C^T;   dq_i = Q'_i .* (dQ'_i - Q'_i . dQ'_i)
 *   dK'_j = v_j dC^T;   dV_j = K'_j dC;   dk_jd = K'_jd (dK'_jd - sum_{j' < L} K'_j'd dK'_j'd)
 * where sum_{j' < L} K'_j'd dK'_j'd = sum_m dC_dm C_dm (C = K'^T V): no pass over the
 * sequence for it, so backward makes one pass over the keys.
 *
 * What forward saves: per slice the context C (D x M floats) and the key columns' maxima
 * and 1/sums (2 D floats), O(D M), not O(N): backward recomputes only K' and Q' from
 * them (element-wise) and does the products of the gradients.
 *
 * Everything goes in chunks of eff_chunk_rows rows through per-thread workspace (K' and
 * Q' of a chunk), every product through prod_rows / prod_outer (small_gemm.c's kernels
 * where the output width is a multiple of 16, ab_sgemm otherwise); OpenMP over the B*H
 * slices (attn_outer_threads). The column sums over the sequence and the row dots of
 * backward are in double (the former from float blocks of 64 rows); the row softmax's
 * sum over D in float (query_softmax). */
#include "cpu_util.h"
#include "efficient.h"
#include "small_gemm.h"
#include "variant.h"

#ifdef ATTNBENCH_HAVE_CUDA
#include "efficient_cuda.h"
#endif

#include "../harness/error.h"
#include "../harness/memory.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* Rows per chunk (the rows of Q' or K' made at once, then multiplied). With OpenBLAS
 * for the products, longer chunks were faster (B = 1, H = 8, N = 4096, D = M = 64, one
 * thread, forward + backward, median of 9: chunks of 256 rows ~56 ms, 2048 rows ~40 ms;
 * 1024 and 2048 against one chunk of 4096 again after the softmax rework: 6% and 4%
 * slower). The workspace is 2 chunk x D floats per thread: 8 MiB at D = 64. */
int eff_chunk_rows = 16384;

static void eff_defaults(attn_params *p) { (void)p; }

/* ---- workspace: one slot per outer thread ---- */

typedef struct {
    float *xp, *dxp;        /* chunk x D: Q' or K', and dQ' */
    float *dctx;            /* D x M */
    float *ct;              /* M x D: C^T, then dC^T (backward's row products take them) */
    double *csum;           /* D: the column sums of exp(K - max) */
    float *fcol;            /* D: forward: a block's column sums in float, added into csum;
                               backward: r = the column sums of K' .* dK' */
    /* the slice's part of what forward saves (eff_saved) */
    float *ctx;             /* D x M: the context K'^T V */
    float *kmax, *kinv;     /* D: column maxima of K and 1 / the column sums of exp(K - max) */
} eff_slot;

/* The saved buffer: ctx [B*H][D][M], then kmax [B*H][D], then kinv [B*H][D]. */
static size_t saved_floats(const attn_shape *s) {
    return (size_t)s->batch * (size_t)s->heads * (size_t)s->qk_dim * ((size_t)s->v_dim + 2);
}

static void saved_slice(const attn_shape *s, const void *saved, int bh, eff_slot *w) {
    const size_t BH = (size_t)s->batch * s->heads, D = (size_t)s->qk_dim, M = (size_t)s->v_dim;
    float *base = (float *)saved;
    w->ctx = base + (size_t)bh * D * M;
    w->kmax = base + BH * D * M + (size_t)bh * D;
    w->kinv = base + BH * D * M + BH * D + (size_t)bh * D;
}

static int chunk_of(const attn_shape *s) { return s->len < eff_chunk_rows ? s->len : eff_chunk_rows; }

static size_t slot_bytes(const attn_shape *s) {
    size_t T = (size_t)chunk_of(s), D = (size_t)s->qk_dim, M = (size_t)s->v_dim;
    return 2 * attn_align64(T * D * sizeof(float)) + 2 * attn_align64(D * M * sizeof(float)) +
           attn_align64(D * sizeof(double)) + attn_align64(D * sizeof(float));
}

/* Thread slot `slot`'s workspace, and slice bh's part of the saved buffer. */
static eff_slot slot_carve(const attn_shape *s, void *ws, int slot, const void *saved, int bh) {
    size_t T = (size_t)chunk_of(s), D = (size_t)s->qk_dim, M = (size_t)s->v_dim;
    char *p = (char *)ws + (size_t)slot * slot_bytes(s);
    eff_slot w;
    w.xp = (float *)p, p += attn_align64(T * D * sizeof(float));
    w.dxp = (float *)p, p += attn_align64(T * D * sizeof(float));
    w.dctx = (float *)p, p += attn_align64(D * M * sizeof(float));
    w.ct = (float *)p, p += attn_align64(D * M * sizeof(float));
    w.csum = (double *)p, p += attn_align64(D * sizeof(double));
    w.fcol = (float *)p;
    saved_slice(s, saved, bh, &w);
    return w;
}

static int eff_check_shape(const attn *a, const attn_shape *s) {
    size_t D = (size_t)s->qk_dim, M = (size_t)s->v_dim, one = slot_bytes(s), all;
    /* BLAS takes int sizes: the D x M context and the chunk blocks index with int. */
    if (D * M > (size_t)INT_MAX || (size_t)chunk_of(s) * (D > M ? D : M) > (size_t)INT_MAX ||
        ab_mul_size(one, (size_t)attn_outer_threads(s->batch * s->heads), &all))
        return ab_fail(AB_EINVAL, "variant '%s': D=%d M=%d gives blocks too large for this implementation",
                       a->v->name, s->qk_dim, s->v_dim);
    return 0;
}

static size_t eff_saved_bytes(const attn *a, const attn_shape *s) {
    (void)a;
    return saved_floats(s) * sizeof(float);
}

static size_t eff_workspace_bytes(const attn *a, const attn_shape *s) {
    (void)a;
    return slot_bytes(s) * (size_t)attn_outer_threads(s->batch * s->heads);
}

/* ---- building blocks ---- */

/* Y (t x P) = X (t x K) W (K x P), rows contiguous. */
static void prod_rows(int t, int K, int P, const float *X, const float *W, float *Y) {
    if (sg_fits(P)) sg_rows(t, K, P, X, K, W, P, Y, P);
    else ab_sgemm(false, false, t, P, K, 1.0f, X, K, W, P, 0.0f, Y, P);
}

/* W (K x P) += X^T Y with X (t x K), Y (t x P), rows contiguous. */
static void prod_outer(int t, int K, int P, const float *X, const float *Y, float *W) {
    if (sg_fits(P)) sg_outer_acc(t, K, P, X, K, Y, P, W, P);
    else ab_sgemm(true, false, K, P, t, 1.0f, X, K, Y, P, 1.0f, W, P);
}

/* At (c x r) = A^T, A (r x c). */
static void transpose(int r, int c, const float *A, float *At) {
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) At[(size_t)j * r + i] = A[(size_t)i * c + j];
}

/* kmax = the column maxima of k rows [0, L), L >= 1. */
static void key_max(int L, int D, const float *k, const eff_slot *w) {
    float *restrict mx = w->kmax;
    for (int d = 0; d < D; d++) mx[d] = -INFINITY;
    for (int j = 0; j < L; j++) {
        const float *restrict kr = k + (size_t)j * D;
        for (int d = 0; d < D; d++) mx[d] = kr[d] > mx[d] ? kr[d] : mx[d];
    }
}

/* K' of t key rows into xp (t x D). */
static void key_softmax(int t, int D, const float *k, const eff_slot *w, float *xp) {
    const float *restrict mx = w->kmax, *restrict kinv = w->kinv;
    for (int i = 0; i < t; i++) {
        const float *restrict kr = k + (size_t)i * D;
        float *restrict o = xp + (size_t)i * D;
        for (int d = 0; d < D; d++) o[d] = attn_exp_nonpos(kr[d] - mx[d]) * kinv[d];
    }
}

/* Q' rows (row softmax over D) of t query rows into xp: maximum, exponentials and their
 * sum in float, each loop an OpenMP simd loop (the reductions reassociate: they vectorise).
 * The sum of D terms in (0, 1], one of them 1, has a relative rounding error below
 * D * 2^-24 (4e-6 at D = 64; in practice a few 1e-7), the same order as the float
 * rounding of the terms themselves: a double sum (smx_softmax_row, after a copy of the
 * row) bought nothing here and was slower (forward 10.6 -> 9.5 ms at N = 4096, B = 1,
 * H = 8, D = M = 64, one thread, with the column sums below). */
static void query_softmax(int t, int D, const float *q, float *xp) {
    for (int i = 0; i < t; i++) {
        const float *restrict x = q + (size_t)i * D;
        float *restrict o = xp + (size_t)i * D;
        float m = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : m)
        for (int d = 0; d < D; d++) m = x[d] > m ? x[d] : m;
#pragma omp simd reduction(+ : sum)
        for (int d = 0; d < D; d++) {
            const float e = attn_exp_nonpos(x[d] - m);
            o[d] = e;
            sum += e;
        }
        const float inv = 1.0f / sum; /* sum >= 1: the maximum's term */
#pragma omp simd
        for (int d = 0; d < D; d++) o[d] *= inv;
    }
}

/* E = exp(K - max) of t key rows into e (t x D), and E's column sums added into acc
 * (double): the rows in blocks of COL_BLOCK summed in float as they are made (the loops
 * run along rows of D and vectorise), each block's sums then added in double. Float over
 * at most 64 terms in (0, 1] loses no more than the float rounding of the terms does;
 * the sum over the N rows stays in double. */
enum { COL_BLOCK = 64 };

static void exp_col_sums(int t, int D, const float *k, const float *mx, float *e, float *fcol, double *acc) {
    for (int i0 = 0; i0 < t; i0 += COL_BLOCK) {
        const int i1 = t - i0 < COL_BLOCK ? t : i0 + COL_BLOCK;
        float *restrict f = fcol;
        const float *restrict m = mx;
        for (int d = 0; d < D; d++) f[d] = 0.0f;
        for (int i = i0; i < i1; i++) {
            const float *restrict kr = k + (size_t)i * D;
            float *restrict er = e + (size_t)i * D;
            for (int d = 0; d < D; d++) {
                er[d] = attn_exp_nonpos(kr[d] - m[d]);
                f[d] += er[d];
            }
        }
        for (int d = 0; d < D; d++) acc[d] += (double)f[d];
    }
}

/* Column statistics and the context C = K'^T V of one slice's valid rows, with one
 * exponential per key entry: E = exp(K - max) chunk by chunk, its column sums and
 * E^T V accumulated, then C = diag(1 / sums) E^T V (K' = E diag(1 / sums)). */
static void context(const attn_shape *s, const eff_slot *w, int L, const float *k, const float *v) {
    const int D = s->qk_dim, M = s->v_dim, T = chunk_of(s);
    key_max(L, D, k, w);
    const float *restrict mx = w->kmax;
    double *restrict csum = w->csum;
    for (int d = 0; d < D; d++) csum[d] = 0.0;
    memset(w->ctx, 0, sizeof(float) * (size_t)D * M);
    for (int j0 = 0; j0 < L; j0 += T) {
        int t = L - j0 < T ? L - j0 : T;
        exp_col_sums(t, D, k + (size_t)j0 * D, mx, w->xp, w->fcol, csum);
        prod_outer(t, D, M, w->xp, v + (size_t)j0 * M, w->ctx);
    }
    for (int d = 0; d < D; d++) {
        const float inv = (float)(1.0 / csum[d]); /* csum >= 1: the maximum's term */
        w->kinv[d] = inv;
        float *restrict row = w->ctx + (size_t)d * M;
        for (int m = 0; m < M; m++) row[m] *= inv;
    }
}

static void zero_rows(float *x, int from, int to, int width) {
    if (to > from) memset(x + (size_t)from * width, 0, sizeof(float) * (size_t)(to - from) * (size_t)width);
}

/* ---- entry points ---- */

static int eff_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                       void *saved) {
    const int BH = s->batch * s->heads, N = s->len, D = s->qk_dim, M = s->v_dim, T = chunk_of(s);
    const int nt = attn_outer_threads(BH);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
    for (int bh = 0; bh < BH; bh++) {
        eff_slot w = slot_carve(s, a->ws, omp_get_thread_num(), saved, bh);
        const int L = attn_valid_len(s, bh / s->heads);
        const float *qs = q + attn_slice(s, bh, D);
        float *os = out + attn_slice(s, bh, M);
        if (L > 0) context(s, &w, L, k + attn_slice(s, bh, D), v + attn_slice(s, bh, M));
        else memset(w.ctx, 0, sizeof(float) * (size_t)D * M); /* saved: defined even when unused */
        for (int i0 = 0; i0 < L; i0 += T) {
            int t = L - i0 < T ? L - i0 : T;
            query_softmax(t, D, qs + (size_t)i0 * D, w.xp);
            prod_rows(t, D, M, w.xp, w.ctx, os + (size_t)i0 * M);
        }
        zero_rows(os, L, N, M);
    }
    return 0;
}

static int eff_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                        const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    const int BH = s->batch * s->heads, N = s->len, D = s->qk_dim, M = s->v_dim, T = chunk_of(s);
    const int nt = attn_outer_threads(BH);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
    for (int bh = 0; bh < BH; bh++) {
        eff_slot w = slot_carve(s, a->ws, omp_get_thread_num(), saved, bh); /* C, kmax, kinv: forward's */
        const int L = attn_valid_len(s, bh / s->heads);
        const size_t oq = attn_slice(s, bh, D), ov = attn_slice(s, bh, M);
        const float *qs = q + oq, *ks = k + oq, *vs = v + ov, *gs = dout + ov;
        float *dqs = dq + oq, *dks = dk + oq, *dvs = dv + ov;
        /* queries: dQ' = G C^T -> dq; dC = sum Q'^T G */
        memset(w.dctx, 0, sizeof(float) * (size_t)D * M);
        transpose(D, M, w.ctx, w.ct);
        for (int i0 = 0; i0 < L; i0 += T) {
            int t = L - i0 < T ? L - i0 : T;
            query_softmax(t, D, qs + (size_t)i0 * D, w.xp);
            prod_rows(t, M, D, gs + (size_t)i0 * M, w.ct, w.dxp);
            for (int i = 0; i < t; i++) {
                const float *restrict p = w.xp + (size_t)i * D, *restrict g = w.dxp + (size_t)i * D;
                float *restrict o = dqs + (size_t)(i0 + i) * D;
                const float fd = (float)attn_dot_d(p, g, D); /* double: the difference g - fd cancels */
                for (int d = 0; d < D; d++) o[d] = p[d] * (g[d] - fd);
            }
            prod_outer(t, D, M, w.xp, gs + (size_t)i0 * M, w.dctx);
        }
        /* keys, one pass: dK' = V dC^T (into dk), dV = K' dC, dk = K' .* (dK' - r) with
         * r_d = sum_j K'_jd dK'_jd = sum_m dC_dm sum_j K'_jd v_jm = sum_m dC_dm C_dm: the
         * column sums over the sequence are a row dot of two D x M blocks */
        float *restrict r = w.fcol;
        for (int d = 0; d < D; d++)
            r[d] = (float)attn_dot_d(w.dctx + (size_t)d * M, w.ctx + (size_t)d * M, M);
        transpose(D, M, w.dctx, w.ct);
        for (int j0 = 0; j0 < L; j0 += T) {
            int t = L - j0 < T ? L - j0 : T;
            key_softmax(t, D, ks + (size_t)j0 * D, &w, w.xp);
            float *dkc = dks + (size_t)j0 * D;
            prod_rows(t, M, D, vs + (size_t)j0 * M, w.ct, dkc);
            prod_rows(t, D, M, w.xp, w.dctx, dvs + (size_t)j0 * M);
            for (int i = 0; i < t; i++) {
                float *restrict o = dkc + (size_t)i * D;
                const float *restrict p = w.xp + (size_t)i * D;
                for (int d = 0; d < D; d++) o[d] = p[d] * (o[d] - r[d]);
            }
        }
        zero_rows(dqs, L, N, D);
        zero_rows(dks, L, N, D);
        zero_rows(dvs, L, N, M);
    }
    return 0;
}

/* ---- useful floating-point operations ----
 *
 * The two products per slice, C = K'^T V and out = Q' C: 2 N D M each, 4 N D M forward;
 * forward plus backward 3 times that (the sweep's rule). The softmaxes are not counted
 * (as the feature maps of linear are not). */
static double eff_flops(const attn *a, const attn_shape *s, bool backward) {
    (void)a;
    double fwd = 4.0 * s->len * (double)s->qk_dim * s->v_dim * s->batch * s->heads;
    return backward ? 3 * fwd : fwd;
}

static const attn_backend cpu_backend = {
    .check_shape = eff_check_shape,
    .saved_bytes = eff_saved_bytes,
    .workspace_bytes = eff_workspace_bytes,
    .forward = eff_forward,
    .backward = eff_backward,
};

#ifdef ATTNBENCH_HAVE_CUDA
static const attn_backend cuda_backend = {
    .check_shape = eff_check_shape,
    .saved_bytes = eff_saved_bytes,
    .workspace_bytes = eff_cuda_workspace_bytes,
    .forward = eff_cuda_forward,
    .backward = eff_cuda_backward,
};
#define CUDA_EFFICIENT (&cuda_backend)
#else
#define CUDA_EFFICIENT NULL
#endif

const attn_variant attn_variant_efficient = {
    .name = "efficient",
    .summary = "Efficient Attention (Shen et al.): softmax(q) over D times softmax(k) over N, then V; non-causal "
               "only; O(N D M)",
    .options = NULL,
    .n_options = 0,
    .defaults = eff_defaults,
    .flops = eff_flops,
    .noncausal_only = true,
    .cpu = &cpu_backend,
    .cuda = CUDA_EFFICIENT,
};
