/* sparse: strided sparse attention (Child et al. 2019, "Generating Long Sequences with
 * Sparse Transformers", the strided pattern) on the CPU.
 *
 *   out_i = sum_{j in A(i)} P_ij v_j,  P_i. = softmax over j in A(i) of scale q_i . k_j
 *   A(i): j <= i and (i - j < w or (i - j) mod s == 0)     (causal)
 *         |i - j| < w or |i - j| mod s == 0                 (non-causal)
 * with w = `window`, s = `stride` (auto: round(sqrt(N)) each), and j < L (L = lengths[b],
 * or N); query rows i >= L output zero and get zero gradient. stride 1 is softmax; a
 * stride of at least N leaves only the window (local).
 *
 * A(i) is cut into two disjoint parts, each computed without an N x N matrix:
 * - the band |i - j| < w: local's blocks of rows (band_cpu.h): a block of R rows
 *   against its key range in one GEMM, each row's softmax over its own run;
 * - the strided keys |i - j| >= w, (i - j) mod s == 0: positions of one residue class
 *   r = i mod s only see each other, so per class the queries and keys r, r + s, ... form
 *   a subsequence (a matrix with row stride s D: no copy) in which query a sees key b
 *   when a - b >= c (and b - a >= c non-causal), c = ceil(w / s). Blocks of R
 *   subsequence rows against the subsequence keys.
 * The band pass writes normalised outputs and each row's log-sum-exp; the strided pass
 * merges its scores into them (out_i <- e^(lse_i - lse'_i) out_i + sum_j e^(S_ij -
 * lse'_i) v_j, lse' the log-sum-exp over both parts). Time O(N (w + R + N / s)
 * (D + M)).
 *
 * Saved: O and the rows' log-sum-exps L (B*H*N*(M + 1) floats). Backward recomputes the
 * scores of both parts, P = exp(S - L), and with Delta_i = dO_i . O_i:
 *   dV += P^T dO,  dP = dO V^T,  dS = P .* (dP - Delta),  dQ += scale dS K,  dK += scale dS^T Q.
 * Threads: with at least as many slices as threads, a slice per thread, both parts in
 * turn (no barrier between them, nothing shared). Otherwise the band pass as local's
 * (blocks in classes with disjoint key ranges in backward), then the strided pass over
 * (slice, residue class) items, whose rows and keys are disjoint.
 *
 * Recurrent mode: the strided part reaches back to position 0, so the state is a
 * key/value cache of all `capacity` positions (B*H*capacity*(D + M) floats); step t
 * reads only its min(t + 1, w) window keys and the t / s strided ones. With auto
 * window or stride the recurrent mode takes N = capacity. Prefill is the causal forward
 * (with the capacity's window and stride) and fills the cache. */
#include "band_cpu.h"
#include "cpu_util.h"
#include "sparse_geo.h"
#include "variant.h"

#ifdef ATTNBENCH_HAVE_CUDA
#include "sparse_cuda.h"
#endif

#include "../harness/error.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

static const attn_option_spec sparse_options[] = {
    {"window", ATTN_OPT_INT, offsetof(attn_params, window), "auto",
     "window w: query i attends to keys with |i-j| < w (causal: i-w < j <= i), 1..1073741824, or auto for "
     "round(sqrt(N))",
     NULL, 1, 1073741824, true, NULL},
    {"stride", ATTN_OPT_INT, offsetof(attn_params, stride), "auto",
     "stride s: query i also attends to keys with |i-j| a multiple of s (causal: j <= i), 1..1073741824, or auto "
     "for round(sqrt(N))",
     NULL, 1, 1073741824, true, NULL},
    {"scale", ATTN_OPT_DOUBLE, offsetof(attn_params, scale), "1/sqrt(D)",
     "multiplier of q.k inside the softmax: any finite number, or auto for 1/sqrt(D)", NULL, -DBL_MAX, DBL_MAX, true,
     NULL},
};

static void sparse_defaults(attn_params *p) {
    p->window = 0;
    p->stride = 0;
    p->scale = NAN;
}

/* ---- geometry ---- */

/* Subsequence length of residue class r among the first L positions. */
static int sub_len(int L, int r, int s) { return r < L ? (L - 1 - r) / s + 1 : 0; }

/* Keys [0, *kc) that a block of subsequence rows [a0, a1) multiplies (of n_r). */
static int sub_block_keys(const sp_geo *g, bool causal, int a1, int n_r) {
    long long hi = causal ? (long long)a1 - g->c : n_r;
    return hi < 0 ? 0 : (int)(hi < n_r ? hi : n_r);
}

/* Strided runs of subsequence row a among keys [0, kc): [0, *e1) and [*b2, kc). */
static void sub_row_runs(const sp_geo *g, bool causal, int a, int kc, int *e1, int *b2) {
    long long e = (long long)a - g->c + 1, b = causal ? kc : (long long)a + g->c;
    *e1 = e < 0 ? 0 : (int)(e < kc ? e : kc);
    *b2 = b < *e1 ? *e1 : (int)(b < kc ? b : kc);
}

/* ---- workspace ---- */

typedef struct {
    size_t band, sub, half, slot, rows; /* bytes: a band block, a subsequence block, their max, a slot
                                         * (two blocks and a row's scalars), B*H*N floats */
    int nslots;
} sp_ws;

static sp_ws ws_of(const sp_geo *g, const attn_shape *s) {
    sp_ws w;
    const int n = s->len, rb = n < g->rows ? n : g->rows, rs = g->nsub < g->rows ? g->nsub : g->rows;
    const long BH = (long)s->batch * s->heads;
    w.band = attn_align64((size_t)rb * (size_t)band_key_span(g->w, s->causal, n, g->rows) * sizeof(float));
    w.sub = g->strided ? attn_align64((size_t)rs * (size_t)g->nsub * sizeof(float)) : 0;
    w.half = w.band > w.sub ? w.band : w.sub;
    w.slot = 2 * w.half + attn_align64((size_t)g->rows * sizeof(float));
    w.rows = attn_align64((size_t)BH * (size_t)n * sizeof(float));
    long ia = BH * band_n_blocks(n, g->rows), ib = BH * (g->s < n ? g->s : n);
    int ta = attn_outer_threads(ia > 1 << 30 ? 1 << 30 : (int)ia), tb = attn_outer_threads(ib > 1 << 30 ? 1 << 30 : (int)ib);
    w.nslots = ta > tb ? ta : tb;
    return w;
}

/* [log-sum-exps | Delta | slots] */
static size_t ws_bytes(const sp_ws *w) { return 2 * w->rows + (size_t)w->nslots * w->slot; }

static char *slot_of(attn *a, const sp_ws *w) {
    return (char *)a->ws + 2 * w->rows + (size_t)omp_get_thread_num() * w->slot;
}

static int sparse_check_shape(const attn *a, const attn_shape *s) {
    (void)a;
    if (s->qk_dim > INT_MAX / BAND_ROWS || s->v_dim > INT_MAX / BAND_ROWS)
        return ab_fail(AB_EINVAL, "variant 'sparse': D=%d M=%d too large for this implementation", s->qk_dim,
                       s->v_dim);
    const int x = s->qk_dim > s->v_dim ? s->qk_dim : s->v_dim;
    /* a block's key span (up to 2 N + 64) and a residue class's row stride (s D <= N D) index with int */
    if ((long long)s->len * 2 + 2 * BAND_ROWS > INT_MAX || (long long)s->len * x > INT_MAX)
        return ab_fail(AB_EINVAL, "variant 'sparse': N=%d with D=%d M=%d is more than this implementation indexes",
                       s->len, s->qk_dim, s->v_dim);
    return 0;
}

static size_t sparse_saved_bytes(const attn *a, const attn_shape *s) {
    (void)a;
    return (size_t)s->batch * (size_t)s->heads * (size_t)s->len * ((size_t)s->v_dim + 1) * sizeof(float);
}

static size_t sparse_workspace_bytes(const attn *a, const attn_shape *s) {
    sp_geo g = sp_geo_of(a, s->len, s->len);
    sp_ws w = ws_of(&g, s);
    return ws_bytes(&w);
}

/* ---- rows ---- */

/* x[0..n) <- softmax; returns the log-sum-exp. n >= 1. */
static float softmax_lse(float *x, int n) {
    const float m = attn_max_f(x, n);
    double sum = 0;
    for (int j = 0; j < n; j++) x[j] = attn_exp_nonpos(x[j] - m);
    for (int j = 0; j < n; j++) sum += x[j];
    const float inv = (float)(1.0 / sum);
    for (int j = 0; j < n; j++) x[j] *= inv;
    return m + (float)log(sum);
}

/* x[0..n) <- exp(x - lse) (the probabilities, given the row's log-sum-exp). */
static void probs_given(float *x, int n, float lse) {
    for (int j = 0; j < n; j++) x[j] = attn_exp_nonpos(x[j] - lse);
}

/* Scores of rows [r0, r1) of q (row stride ldq) against keys [0, kc) of k (ldk). */
static void scores(const float *q, int ldq, const float *k, int ldk, int r0, int r1, int kc, int D, float scale,
                   float *p) {
    ab_sgemm(false, true, r1 - r0, kc, D, scale, q + (size_t)r0 * ldq, ldq, k, ldk, 0.0f, p, kc);
}

/* ---- band part ---- */

typedef struct {
    const attn_shape *s;
    const sp_geo *g;
    float scale;
} sp_ctx;

/* Band probabilities of rows [r0, r1) over keys [k0, k1) into p; lse: NULL (forward:
 * the rows' softmax, their log-sum-exps written to lse_out) or the rows' final
 * log-sum-exps (backward). */
static void band_probs(const sp_ctx *x, const float *q, const float *k, int r0, int r1, int k0, int k1, int L,
                       const float *lse, float *lse_out, float *p) {
    const int D = x->s->qk_dim, kc = k1 - k0;
    scores(q, D, k + (size_t)k0 * D, D, r0, r1, kc, D, x->scale, p);
    for (int i = r0; i < r1; i++) {
        float *row = p + (size_t)(i - r0) * kc;
        int j0, j1;
        band_row_keys(x->g->w, x->s->causal, i, k0, L, &j0, &j1);
        if (lse) probs_given(row + (j0 - k0), j1 - j0, lse[i]);
        else lse_out[i] = softmax_lse(row + (j0 - k0), j1 - j0);
        memset(row, 0, sizeof(float) * (size_t)(j0 - k0));
        memset(row + (j1 - k0), 0, sizeof(float) * (size_t)(k1 - j1));
    }
}

/* Band forward of one (slice, block): outputs and log-sum-exps of its rows. */
static void band_forward_block(const sp_ctx *x, const sp_ws *w, attn *a, int bh, int blk, const float *q,
                               const float *k, const float *v, float *out, float *lse) {
    const attn_shape *s = x->s;
    const int N = s->len, D = s->qk_dim, M = s->v_dim, L = attn_valid_len(s, bh / s->heads), r0 = blk * x->g->rows;
    const int r1 = r0 + x->g->rows < N ? r0 + x->g->rows : N, re = r1 < L ? r1 : L;
    float *o = out + attn_slice(s, bh, M);
    if (re > r0) {
        float *p = (float *)slot_of(a, w);
        int k0, k1;
        band_block_keys(x->g->w, s->causal, r0, re, L, &k0, &k1);
        band_probs(x, q + attn_slice(s, bh, D), k + attn_slice(s, bh, D), r0, re, k0, k1, L, NULL,
                   lse + (size_t)bh * N, p);
        ab_sgemm(false, false, re - r0, M, k1 - k0, 1.0f, p, k1 - k0, v + attn_slice(s, bh, M) + (size_t)k0 * M, M,
                 0.0f, o + (size_t)r0 * M, M);
    }
    const int z0 = re > r0 ? re : r0;
    if (r1 > z0) memset(o + (size_t)z0 * M, 0, sizeof(float) * (size_t)(r1 - z0) * M);
}

/* Band backward of one (slice, block): writes its dq rows, adds into dk and dv. */
static void band_backward_block(const sp_ctx *x, const sp_ws *w, attn *a, int bh, int blk, const float *q,
                                const float *k, const float *v, const float *dout, const float *lse,
                                const float *delta, float *dq, float *dk, float *dv) {
    const attn_shape *s = x->s;
    const int N = s->len, D = s->qk_dim, M = s->v_dim, L = attn_valid_len(s, bh / s->heads), r0 = blk * x->g->rows;
    const int r1 = r0 + x->g->rows < N ? r0 + x->g->rows : N, re = r1 < L ? r1 : L;
    const size_t oq = attn_slice(s, bh, D), ov = attn_slice(s, bh, M);
    const int z0 = re > r0 ? re : r0;
    if (r1 > z0) memset(dq + oq + (size_t)z0 * D, 0, sizeof(float) * (size_t)(r1 - z0) * D);
    if (re <= r0) return;
    char *slot = slot_of(a, w);
    float *p = (float *)slot, *ds = (float *)(slot + w->half);
    int k0, k1;
    band_block_keys(x->g->w, s->causal, r0, re, L, &k0, &k1);
    const int rb = re - r0, kc = k1 - k0;
    const float *qs = q + oq, *ks = k + oq + (size_t)k0 * D, *vs = v + ov + (size_t)k0 * M;
    const float *dob = dout + ov + (size_t)r0 * M, *dl = delta + (size_t)bh * N + r0;
    band_probs(x, qs, k + oq, r0, re, k0, k1, L, lse + (size_t)bh * N, NULL, p);
    ab_sgemm(true, false, kc, M, rb, 1.0f, p, kc, dob, M, 1.0f, dv + ov + (size_t)k0 * M, M);
    ab_sgemm(false, true, rb, kc, M, 1.0f, dob, M, vs, M, 0.0f, ds, kc);
    for (int i = 0; i < rb; i++) {
        const float *restrict pr = p + (size_t)i * kc;
        float *restrict dr = ds + (size_t)i * kc;
        for (int j = 0; j < kc; j++) dr[j] = pr[j] * (dr[j] - dl[i]);
    }
    ab_sgemm(false, false, rb, D, kc, x->scale, ds, kc, ks, D, 0.0f, dq + oq + (size_t)r0 * D, D);
    ab_sgemm(true, false, kc, D, rb, x->scale, ds, kc, qs + (size_t)r0 * D, D, 1.0f, dk + oq + (size_t)k0 * D, D);
}

/* ---- strided part: residue class r of a slice, as a subsequence with row stride s ---- */

/* Exponentials of the strided runs of subsequence row a against its final
 * log-sum-exp, merged with the band's: row <- e^(S - L'), returns e^(L_band - L') (the
 * band output's factor) and sets *lse to L'. Rows without strided keys stay as they
 * were (factor 1). */
static float merge_row(const sp_ctx *x, float *row, int a, int kc, float *lse) {
    int e1, b2;
    sub_row_runs(x->g, x->s->causal, a, kc, &e1, &b2);
    if (e1 == 0 && b2 == kc) {
        memset(row, 0, sizeof(float) * (size_t)kc);
        return 1.0f;
    }
    const float m1 = attn_max_f(row, e1), m2 = attn_max_f(row + b2, kc - b2), mx = m1 > m2 ? m1 : m2;
    double sum = 0;
    for (int j = 0; j < e1; j++) sum += row[j] = attn_exp_nonpos(row[j] - mx);
    for (int j = b2; j < kc; j++) sum += row[j] = attn_exp_nonpos(row[j] - mx);
    memset(row + e1, 0, sizeof(float) * (size_t)(b2 - e1));
    const double lb = *lse, ls = mx + log(sum), hi = lb > ls ? lb : ls;
    const double ln = hi + log(exp(lb - hi) + exp(ls - hi));
    const float f = (float)exp(mx - ln);
    for (int j = 0; j < e1; j++) row[j] *= f;
    for (int j = b2; j < kc; j++) row[j] *= f;
    *lse = (float)ln;
    return (float)exp(lb - ln);
}

/* Probabilities of the strided runs of subsequence row a, given its log-sum-exp. */
static void sub_probs_row(const sp_ctx *x, float *row, int a, int kc, float lse) {
    int e1, b2;
    sub_row_runs(x->g, x->s->causal, a, kc, &e1, &b2);
    probs_given(row, e1, lse);
    memset(row + e1, 0, sizeof(float) * (size_t)(b2 - e1));
    probs_given(row + b2, kc - b2, lse);
}

static void sub_forward(const sp_ctx *x, const sp_ws *w, attn *a, int bh, int r, const float *q, const float *k,
                        const float *v, float *out, float *lse) {
    const attn_shape *s = x->s;
    const int N = s->len, D = s->qk_dim, M = s->v_dim, st = x->g->s;
    const int n_r = sub_len(attn_valid_len(s, bh / s->heads), r, st), ldq = st * D, ldv = st * M;
    const float *Q = q + attn_slice(s, bh, D) + (size_t)r * D, *K = k + attn_slice(s, bh, D) + (size_t)r * D;
    const float *V = v + attn_slice(s, bh, M) + (size_t)r * M;
    float *O = out + attn_slice(s, bh, M) + (size_t)r * M, *ls = lse + (size_t)bh * N + r;
    char *slot = slot_of(a, w);
    float *p = (float *)slot, *alpha = (float *)(slot + 2 * w->half);
    for (int a0 = 0; a0 < n_r; a0 += x->g->rows) {
        const int a1 = a0 + x->g->rows < n_r ? a0 + x->g->rows : n_r, kc = sub_block_keys(x->g, s->causal, a1, n_r);
        if (kc == 0) continue;
        scores(Q, ldq, K, ldq, a0, a1, kc, D, x->scale, p);
        for (int i = a0; i < a1; i++) {
            alpha[i - a0] = merge_row(x, p + (size_t)(i - a0) * kc, i, kc, ls + (size_t)i * st);
            float *o = O + (size_t)i * ldv;
            for (int m = 0; m < M; m++) o[m] *= alpha[i - a0];
        }
        ab_sgemm(false, false, a1 - a0, M, kc, 1.0f, p, kc, V, ldv, 1.0f, O + (size_t)a0 * ldv, ldv);
    }
}

static void sub_backward(const sp_ctx *x, const sp_ws *w, attn *a, int bh, int r, const float *q, const float *k,
                         const float *v, const float *dout, const float *lse, const float *delta, float *dq,
                         float *dk, float *dv) {
    const attn_shape *s = x->s;
    const int N = s->len, D = s->qk_dim, M = s->v_dim, st = x->g->s;
    const int n_r = sub_len(attn_valid_len(s, bh / s->heads), r, st), ldq = st * D, ldv = st * M;
    const size_t oq = attn_slice(s, bh, D) + (size_t)r * D, ov = attn_slice(s, bh, M) + (size_t)r * M;
    const float *Q = q + oq, *K = k + oq, *V = v + ov, *dO = dout + ov;
    const float *ls = lse + (size_t)bh * N + r, *dl = delta + (size_t)bh * N + r;
    char *slot = slot_of(a, w);
    float *p = (float *)slot, *ds = (float *)(slot + w->half);
    for (int a0 = 0; a0 < n_r; a0 += x->g->rows) {
        const int a1 = a0 + x->g->rows < n_r ? a0 + x->g->rows : n_r, kc = sub_block_keys(x->g, s->causal, a1, n_r);
        const int rb = a1 - a0;
        if (kc == 0) continue;
        scores(Q, ldq, K, ldq, a0, a1, kc, D, x->scale, p);
        for (int i = a0; i < a1; i++) sub_probs_row(x, p + (size_t)(i - a0) * kc, i, kc, ls[(size_t)i * st]);
        ab_sgemm(true, false, kc, M, rb, 1.0f, p, kc, dO + (size_t)a0 * ldv, ldv, 1.0f, dv + ov, ldv);
        ab_sgemm(false, true, rb, kc, M, 1.0f, dO + (size_t)a0 * ldv, ldv, V, ldv, 0.0f, ds, kc);
        for (int i = 0; i < rb; i++) {
            const float *restrict pr = p + (size_t)i * kc;
            float *restrict dr = ds + (size_t)i * kc;
            const float d = dl[(size_t)(a0 + i) * st];
            for (int j = 0; j < kc; j++) dr[j] = pr[j] * (dr[j] - d);
        }
        ab_sgemm(false, false, rb, D, kc, x->scale, ds, kc, K, ldq, 1.0f, dq + oq + (size_t)a0 * ldq, ldq);
        ab_sgemm(true, false, kc, D, rb, x->scale, ds, kc, Q + (size_t)a0 * ldq, ldq, 1.0f, dk + oq, ldq);
    }
}

/* ---- parallel mode ---- */

/* Forward of shape s (causal or not) with geometry g; the rows' log-sum-exps into lse
 * (B*H*N floats). Used by forward and by prefill (on the prompt). */
static void forward_impl(attn *a, const attn_shape *s, const sp_geo *g, const float *q, const float *k,
                         const float *v, float *out, float *lse) {
    const int BH = s->batch * s->heads, nblk = band_n_blocks(s->len, g->rows);
    const sp_ctx x = {s, g, (float)attn_scale(a, s->qk_dim)};
    const sp_ws w = ws_of(g, s);
    if (BH >= ab_threads()) {
        /* a slice per thread, both parts in turn: no barrier between them */
        const int nt = attn_outer_threads(BH), nres = g->strided ? g->s : 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
        for (int bh = 0; bh < BH; bh++) {
            for (int blk = 0; blk < nblk; blk++) band_forward_block(&x, &w, a, bh, blk, q, k, v, out, lse);
            for (int r = 0; r < nres; r++) sub_forward(&x, &w, a, bh, r, q, k, v, out, lse);
        }
        return;
    }
    const long ia = (long)BH * nblk;
    const int ta = attn_outer_threads(ia > 1 << 30 ? 1 << 30 : (int)ia);
#pragma omp parallel for schedule(static) num_threads(ta) if (ta > 1)
    for (long it = 0; it < ia; it++) band_forward_block(&x, &w, a, (int)(it / nblk), (int)(it % nblk), q, k, v, out, lse);
    if (!g->strided) return;
    const long ib = (long)BH * g->s;
    const int tb = attn_outer_threads(ib > 1 << 30 ? 1 << 30 : (int)ib);
#pragma omp parallel for schedule(dynamic, 1) num_threads(tb) if (tb > 1)
    for (long it = 0; it < ib; it++) sub_forward(&x, &w, a, (int)(it / g->s), (int)(it % g->s), q, k, v, out, lse);
}

static int sparse_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                          void *saved) {
    const sp_geo g = sp_geo_of(a, s->len, s->len);
    const size_t no = (size_t)s->batch * s->heads * s->len * s->v_dim;
    float *lse = (float *)a->ws;
    forward_impl(a, s, &g, q, k, v, out, lse);
    if (saved) {
        memcpy(saved, out, sizeof(float) * no);
        memcpy((float *)saved + no, lse, sizeof(float) * (size_t)s->batch * s->heads * s->len);
    }
    return 0;
}

/* Delta_i = dO_i . O_i for the valid rows. */
static void deltas(const attn_shape *s, const float *o, const float *dout, float *delta) {
    const int BH = s->batch * s->heads, N = s->len, M = s->v_dim, nt = attn_outer_threads(BH);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int bh = 0; bh < BH; bh++) {
        const int L = attn_valid_len(s, bh / s->heads);
        for (int i = 0; i < N; i++) {
            const size_t at = attn_slice(s, bh, M) + (size_t)i * M;
            delta[(size_t)bh * N + i] = i < L ? (float)attn_dot_d(o + at, dout + at, M) : 0.0f;
        }
    }
}

static int sparse_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                           const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    const int BH = s->batch * s->heads, N = s->len, D = s->qk_dim, M = s->v_dim;
    const sp_geo g = sp_geo_of(a, N, N);
    const int nblk = band_n_blocks(N, g.rows);
    const sp_ctx x = {s, &g, (float)attn_scale(a, D)};
    const sp_ws w = ws_of(&g, s);
    const float *o = saved, *lse = (const float *)saved + (size_t)BH * N * M;
    float *delta = (float *)((char *)a->ws + w.rows);
    deltas(s, o, dout, delta);
    memset(dk, 0, sizeof(float) * (size_t)BH * N * D);
    memset(dv, 0, sizeof(float) * (size_t)BH * N * M);
    if (BH >= ab_threads()) {
        /* a slice per thread: its blocks in order (they alone add into its dK, dV) */
        const int nt = attn_outer_threads(BH), nres = g.strided ? g.s : 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
        for (int bh = 0; bh < BH; bh++) {
            for (int blk = 0; blk < nblk; blk++)
                band_backward_block(&x, &w, a, bh, blk, q, k, v, dout, lse, delta, dq, dk, dv);
            for (int r = 0; r < nres; r++) sub_backward(&x, &w, a, bh, r, q, k, v, dout, lse, delta, dq, dk, dv);
        }
        return 0;
    }
    /* the band: classes of blocks with disjoint key ranges; it writes every dq row */
    const int period = band_period(g.w, s->causal, N, g.rows), per_class = (nblk + period - 1) / period;
    const long ia = (long)BH * per_class;
    const int ta = attn_outer_threads(ia > 1 << 30 ? 1 << 30 : (int)ia);
    for (int cls = 0; cls < period; cls++) {
#pragma omp parallel for schedule(static) num_threads(ta) if (ta > 1)
        for (long it = 0; it < ia; it++) {
            const int blk = cls + period * (int)(it % per_class);
            if (blk < nblk)
                band_backward_block(&x, &w, a, (int)(it / per_class), blk, q, k, v, dout, lse, delta, dq, dk, dv);
        }
    }
    if (!g.strided) return 0;
    /* the strided part: residue classes touch disjoint rows of dq, dk and dv */
    const long ib = (long)BH * g.s;
    const int tb = attn_outer_threads(ib > 1 << 30 ? 1 << 30 : (int)ib);
#pragma omp parallel for schedule(dynamic, 1) num_threads(tb) if (tb > 1)
    for (long it = 0; it < ib; it++)
        sub_backward(&x, &w, a, (int)(it / g.s), (int)(it % g.s), q, k, v, dout, lse, delta, dq, dk, dv);
    return 0;
}

/* ---- recurrent mode: a key/value cache of every position ---- */

static size_t kcache_bytes(const attn_shape *s, int capacity) {
    return attn_align64((size_t)s->batch * (size_t)s->heads * (size_t)capacity * (size_t)s->qk_dim * sizeof(float));
}

static size_t sparse_state_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)a;
    return kcache_bytes(s, capacity) +
           (size_t)s->batch * (size_t)s->heads * (size_t)capacity * (size_t)s->v_dim * sizeof(float);
}

/* Positions not yet written are never read: nothing to clear. */
static int sparse_state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    (void)a, (void)s, (void)capacity, (void)state;
    return 0;
}

/* A step's scores: at most min(w, capacity) window keys and nsub strided ones. */
static size_t step_slot(const sp_geo *g, int capacity) {
    long long n = (g->w < capacity ? g->w : capacity) + g->nsub + 1;
    return attn_align64((size_t)n * sizeof(float));
}

/* The larger of a step's and of prefill's forward (on up to capacity positions). */
static size_t sparse_step_workspace_bytes(const attn *a, const attn_shape *s, int capacity) {
    const sp_geo g = sp_geo_of(a, capacity, capacity);
    attn_shape cs = *s;
    cs.len = capacity;
    const sp_ws w = ws_of(&g, &cs);
    const size_t fwd = ws_bytes(&w), step = step_slot(&g, capacity) * (size_t)attn_outer_threads(s->batch * s->heads);
    return fwd > step ? fwd : step;
}

static int sparse_prefill(attn *a, const attn_shape *s, int capacity, int P, const float *q, const float *k,
                          const float *v, float *out, void *state) {
    const int D = s->qk_dim, M = s->v_dim, BH = s->batch * s->heads;
    float *kc = state, *vc = (float *)((char *)state + kcache_bytes(s, capacity));
    const int nt = attn_outer_threads(BH);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int bh = 0; bh < BH; bh++) {
        memcpy(kc + (size_t)bh * capacity * D, k + (size_t)bh * P * D, sizeof(float) * (size_t)P * D);
        memcpy(vc + (size_t)bh * capacity * M, v + (size_t)bh * P * M, sizeof(float) * (size_t)P * M);
    }
    if (!out) return 0;
    attn_shape ps = *s;
    ps.len = P;
    const sp_geo g = sp_geo_of(a, capacity, P);
    forward_impl(a, &ps, &g, q, k, v, out, (float *)a->ws);
    return 0;
}

static int sparse_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q,
                       const float *k, const float *v, float *out) {
    const int D = s->qk_dim, M = s->v_dim, BH = s->batch * s->heads;
    const sp_geo g = sp_geo_of(a, capacity, capacity);
    float *kc = state, *vc = (float *)((char *)state + kcache_bytes(s, capacity));
    const float scale = (float)attn_scale(a, D);
    const int n1 = t + 1 < g.w ? t + 1 : (int)g.w; /* window: positions t-n1+1..t */
    const long long jmax = g.strided ? t - g.c * g.s : -1; /* strided: t mod s, ..., jmax */
    const int r = t % g.s, n2 = jmax >= 0 ? (int)((jmax - r) / g.s) + 1 : 0;
    const int nt = attn_outer_threads(BH);
    const size_t slot = step_slot(&g, capacity);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int bh = 0; bh < BH; bh++) {
        float *ks = kc + (size_t)bh * capacity * D, *vs = vc + (size_t)bh * capacity * M;
        float *sc = (float *)((char *)a->ws + (size_t)omp_get_thread_num() * slot);
        memcpy(ks + (size_t)t * D, k + (size_t)bh * D, sizeof(float) * (size_t)D);
        memcpy(vs + (size_t)t * M, v + (size_t)bh * M, sizeof(float) * (size_t)M);
        const float *qt = q + (size_t)bh * D;
        float *o = out + (size_t)bh * M;
        const int j0 = t - n1 + 1;
        /* scores [strided | window], softmax, out = p V over both */
        if (n2) ab_sgemm(false, true, 1, n2, D, scale, qt, D, ks + (size_t)r * D, g.s * D, 0.0f, sc, n2);
        ab_sgemm(false, true, 1, n1, D, scale, qt, D, ks + (size_t)j0 * D, D, 0.0f, sc + n2, n1);
        softmax_lse(sc, n1 + n2);
        ab_sgemm(false, false, 1, M, n1, 1.0f, sc + n2, n1, vs + (size_t)j0 * M, M, 0.0f, o, M);
        if (n2) ab_sgemm(false, false, 1, M, n2, 1.0f, sc, n2, vs + (size_t)r * M, g.s * M, 1.0f, o, M);
    }
    return 0;
}

/* ---- useful floating-point operations ----
 *
 * 2 (D + M) per allowed (query, key) pair and slice, at the full length N: the window's
 * pairs as local counts them (K = min(w, N) - 1: N + K N - K (K + 1) / 2 causal, twice
 * the off-diagonal part non-causal), plus the strided ones, N - m s pairs at each
 * distance m s with w <= m s <= N - 1 (twice non-causal). Forward plus backward 3 times
 * the forward. Masked columns that the blocks compute are not counted. */
static double sparse_flops(const attn *a, const attn_shape *s, bool backward) {
    const sp_geo g = sp_geo_of(a, s->len, s->len);
    double n = s->len, K = (g.w < s->len ? (double)g.w : n) - 1.0;
    double below = K * n - K * (K + 1) / 2, strided = 0;
    if (g.strided) {
        double m0 = (double)g.c, m1 = floor((n - 1) / g.s), cnt = m1 - m0 + 1;
        strided = cnt * n - g.s * (m0 + m1) * cnt / 2;
    }
    double pairs = n + (s->causal ? below + strided : 2 * (below + strided));
    double fwd = 2 * pairs * ((double)s->qk_dim + s->v_dim) * s->batch * s->heads;
    return backward ? 3 * fwd : fwd;
}

static const attn_backend cpu_backend = {
    .check_shape = sparse_check_shape,
    .saved_bytes = sparse_saved_bytes,
    .workspace_bytes = sparse_workspace_bytes,
    .forward = sparse_forward,
    .forward_unsaved = true,
    .backward = sparse_backward,
    .state_bytes = sparse_state_bytes,
    .state_init = sparse_state_init,
    .prefill = sparse_prefill,
    .step = sparse_step,
    .step_workspace_bytes = sparse_step_workspace_bytes,
};

#ifdef ATTNBENCH_HAVE_CUDA
/* The CPU's shape checks, saved layout (O and the log-sum-exps) and cache layout. */
static const attn_backend cuda_backend = {
    .check_shape = sparse_check_shape,
    .saved_bytes = sparse_saved_bytes,
    .workspace_bytes = sparse_cuda_workspace_bytes,
    .forward = sparse_cuda_forward,
    .forward_unsaved = true,
    .backward = sparse_cuda_backward,
    .state_bytes = sparse_state_bytes,
    .state_init = sparse_cuda_state_init,
    .prefill = sparse_cuda_prefill,
    .step = sparse_cuda_step,
    .step_workspace_bytes = sparse_cuda_step_workspace_bytes,
};
#define CUDA_SPARSE (&cuda_backend)
#else
#define CUDA_SPARSE NULL
#endif

const attn_variant attn_variant_sparse = {
    .name = "sparse",
    .summary = "strided sparse softmax (Sparse Transformer): each query attends to the `window` nearest keys and "
               "to every `stride`-th one; O(N (w + N/s) (D + M)); recurrent: a key/value cache",
    .options = sparse_options,
    .n_options = (int)(sizeof sparse_options / sizeof sparse_options[0]),
    .defaults = sparse_defaults,
    .flops = sparse_flops,
    .cpu = &cpu_backend,
    .cuda = CUDA_SPARSE,
};
