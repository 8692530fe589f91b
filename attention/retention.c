/* Retention (RetNet, Sun et al. 2023) on the CPU: variant `retention`.
 *
 *   out_i = s sum_j gamma^|i-j| (q_i . k_j) v_j,  j <= i (causal) or every j < L,
 *
 * gamma = 1 - 2^(-5-h) for head h (option gamma=auto) or one value for every head, s the
 * scale (1/sqrt(D)); rows >= L, the batch row's valid length, are padding. The
 * recurrence: S_t = gamma S_{t-1} + k_t v_t^T (D x M), out_t = s S_t^T q_t.
 *
 * Chunked parallel form, chunk T. Everything (the forward and the three gradients) is
 * one primitive, a pass over a slice:
 *
 *   y_i = s sum_{j allowed} gamma^|i-j| (a_i . b_j) c_j,  a, b of width P, c of width R,
 *
 * with "allowed" j <= i (causal), j >= i (anti-causal) or every j (both). The forward is
 * (a, b, c) = (q, k, v); with w_ij = s gamma^|i-j| and the causal mask, the gradients are
 *   dq_i = sum_{j <= i} w_ij (g_i . v_j) k_j:  (g, v, k), causal,
 *   dk_j = sum_{i >= j} w_ij (g_i . v_j) q_i:  (v, g, q), anti-causal,
 *   dv_j = sum_{i >= j} w_ij (q_i . k_j) g_i:  (k, q, g), anti-causal,
 * all of them "both" when non-causal. A pass, per chunk of rows [i0, i0 + t):
 *   intra:  Y_c = (A_c B_c^T  .*  s gamma^|i-j| masked) C_c        (t x t products)
 *   causal: Y_c += diag(s gamma^(r+1)) A_c S;  S <- gamma^t S + (diag(gamma^(t-1-r)) B_c)^T C_c
 *   anti (chunks from the last):  Y_c += diag(s gamma^(t-r)) A_c U;
 *           U <- gamma^t U + (diag(gamma^r) B_c)^T C_c
 * with r = i - i0 in [0, t). S (P x R) is the recurrent state at the end of the chunks
 * before, U its mirror over the chunks after. Every power of gamma is gamma^e with
 * 0 <= e <= T, computed in double (pow) once per slice into a table and rounded to
 * float: no factor ever exceeds 1, so a long sequence cannot overflow, and a tiny
 * gamma^e underflows only where the true weight is below float's range anyway (never
 * gamma^(-i) against gamma^i). The t x t products are ab_sgemm; the state products are
 * small_gemm's (sg_rows, sg_outer_acc) where the output width allows, ab_sgemm otherwise.
 * OpenMP runs over the B*H slices (attn_outer_threads), as linear's.
 *
 * Nothing is saved for the backward (saved_bytes = 0): dq is its own pass over the
 * inputs, dk and dv share one (ret_pass_kv). The recurrent state is S per slice
 * (B*H*D*M floats); prefill runs the causal forward pass into it, a step updates it in
 * place. */
#include "cpu_util.h"
#include "small_gemm.h"
#include "variant.h"

#ifdef ATTNBENCH_HAVE_CUDA
#include "retention_cuda.h"
#endif

#include "../harness/error.h"
#include "../harness/memory.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

/* ---- options ---- */

static const attn_option_spec ret_options[] = {
    {"gamma", ATTN_OPT_DOUBLE, offsetof(attn_params, gamma), "auto",
     "decay gamma of every head, in (0, 1], or auto: 1 - 2^(-5-h) for head h = 0..H-1", NULL, DBL_MIN, 1.0,
     true, NULL},
    {"scale", ATTN_OPT_DOUBLE, offsetof(attn_params, scale), "1/sqrt(D)",
     "multiplier of q.k: any finite number, or auto for 1/sqrt(D)", NULL, -DBL_MAX, DBL_MAX, true, NULL},
    {"chunk", ATTN_OPT_INT, offsetof(attn_params, chunk), "auto",
     "chunk length of the chunked parallel form, 1..65536 or auto (CPU: 32; CUDA: 64, and at most 64)", NULL, 1,
     65536, true, NULL},
};

static void ret_defaults(attn_params *p) {
    p->gamma = NAN;
    p->scale = NAN;
    p->chunk = 0;
}

static double ret_gamma(const attn *a, int h) { return isnan(a->p.gamma) ? 1.0 - ldexp(1.0, -5 - h) : a->p.gamma; }

/* chunk=auto on the CPU. Measured: causal forward+backward, B=1, H=8, D=M=64, 2
 * threads (Xeon, OpenBLAS Haswell kernels, release build, the machine shared with other
 * work), median of 5, ms, chunk 32/64/128: N=1024 28.3 39.3 48.0; N=4096 116 151 168;
 * N=16384 427 489 692. As for linear, the chunk's own t x t products are the part that
 * grows with the chunk, and at 32 the D x M state products already run at speed. */
#define RET_AUTO_CHUNK 32

/* ---- configuration and workspace ---- */

typedef struct {
    int T, D, M, P; /* chunk used (<= N), head sizes, P = max(D, M) */
    float scale;
} ret_cfg;

static void cfg_make(const attn *a, const attn_shape *s, int len, ret_cfg *g) {
    int T = a->p.chunk > 0 ? a->p.chunk : RET_AUTO_CHUNK;
    g->T = T < len ? T : len;
    if (g->T < 1) g->T = 1;
    g->D = s->qk_dim;
    g->M = s->v_dim;
    g->P = g->D > g->M ? g->D : g->M;
    g->scale = (float)attn_scale(a, s->qk_dim);
}

typedef struct {
    float *A;      /* T x T */
    float *X, *Y;  /* T x P: scaled rows, a product's rows */
    float *S;      /* D x M (a pass's state, either orientation) */
    float *pw;     /* T + 1: gamma^e */
    float *spw;    /* T + 1: s gamma^e */
} ret_slot;

/* Bytes of one slot, 0 on overflow. */
static size_t slot_bytes(const ret_cfg *g) {
    size_t T = (size_t)g->T, P = (size_t)g->P, f = sizeof(float), tt, tp, dm;
    if (ab_mul_size(T, T, &tt) || ab_mul_size(tt, f, &tt) || ab_mul_size(T, P, &tp) || ab_mul_size(tp, f, &tp) ||
        ab_mul_size((size_t)g->D, (size_t)g->M, &dm) || ab_mul_size(dm, f, &dm))
        return 0;
    return attn_align64(tt) + 2 * attn_align64(tp) + attn_align64(dm) + 2 * attn_align64((T + 1) * f);
}

static ret_slot slot_carve(const ret_cfg *g, void *ws, int slot) {
    size_t T = (size_t)g->T, P = (size_t)g->P, f = sizeof(float);
    char *p = (char *)ws + (size_t)slot * slot_bytes(g);
    ret_slot w;
#define TAKE(field, count)                                                                                            \
    do {                                                                                                              \
        w.field = (float *)p;                                                                                         \
        p += attn_align64((count) * f);                                                                               \
    } while (0)
    TAKE(A, T * T);
    TAKE(X, T * P);
    TAKE(Y, T * P);
    TAKE(S, (size_t)g->D * (size_t)g->M);
    TAKE(pw, T + 1);
    TAKE(spw, T + 1);
#undef TAKE
    return w;
}

/* The decay tables of one slice: pw[e] = gamma^e, spw[e] = s gamma^e, e = 0..T. */
static void decay_tables(const ret_cfg *g, ret_slot *w, double gamma) {
    for (int e = 0; e <= g->T; e++) {
        double p = pow(gamma, (double)e);
        w->pw[e] = (float)p;
        w->spw[e] = (float)(p * (double)g->scale);
    }
}

static int check_shape(const attn *a, const attn_shape *s) {
    ret_cfg g;
    cfg_make(a, s, s->len, &g);
    size_t T = (size_t)g.T, P = (size_t)g.P;
    /* BLAS takes int sizes and leading dimensions */
    if (T * T > (size_t)INT_MAX || T * P > (size_t)INT_MAX || (size_t)g.D * (size_t)g.M > (size_t)INT_MAX)
        return ab_fail(AB_EINVAL, "variant 'retention': D=%d M=%d with chunk %d gives blocks too large", g.D, g.M,
                       g.T);
    size_t one = slot_bytes(&g), all;
    if (one == 0 || ab_mul_size(one, (size_t)attn_outer_threads(s->batch * s->heads), &all))
        return ab_fail(AB_EINVAL, "variant 'retention': workspace size overflows for D=%d M=%d N=%d", g.D, g.M,
                       s->len);
    return 0;
}

static size_t saved_bytes(const attn *a, const attn_shape *s) {
    (void)a;
    (void)s;
    return 0;
}

static size_t workspace_bytes(const attn *a, const attn_shape *s) {
    ret_cfg g;
    cfg_make(a, s, s->len, &g);
    return slot_bytes(&g) * (size_t)attn_outer_threads(s->batch * s->heads);
}

/* ---- the pass ---- */

enum { RET_CAUSAL = 1, RET_ANTI = 2, RET_BOTH = 3 };

/* Y (t x R) = X (t x K) W (K x R), rows contiguous. */
static void prod_rows(int t, int K, int R, const float *X, int ldx, const float *W, float *Y) {
    if (sg_fits(R)) sg_rows(t, K, R, X, ldx, W, R, Y, R);
    else ab_sgemm(false, false, t, R, K, 1.0f, X, ldx, W, R, 0.0f, Y, R);
}

/* W (K x R) += X^T Y with X (t x K), Y (t x R), rows contiguous. */
static void prod_outer(int t, int K, int R, const float *X, const float *Y, float *W) {
    if (sg_fits(R)) sg_outer_acc(t, K, R, X, K, Y, R, W, R);
    else ab_sgemm(true, false, K, R, t, 1.0f, X, K, Y, R, 1.0f, W, R);
}

/* Y_c = (A_c B_c^T masked and decayed) C_c for the t rows of one chunk. */
static void intra(const ret_cfg *g, ret_slot *w, int t, int dir, const float *a, const float *b, int P,
                  const float *c, int R, float *y) {
    const int T = g->T;
    ab_sgemm(false, true, t, t, P, 1.0f, a, P, b, P, 0.0f, w->A, T);
    for (int i = 0; i < t; i++) {
        float *row = w->A + (size_t)i * T;
        for (int j = 0; j < i; j++) row[j] = (dir & RET_CAUSAL) ? row[j] * w->spw[i - j] : 0.0f;
        row[i] *= w->spw[0];
        for (int j = i + 1; j < t; j++) row[j] = (dir & RET_ANTI) ? row[j] * w->spw[j - i] : 0.0f;
    }
    prod_rows(t, t, R, w->A, T, c, y);
}

/* y rows += spw[off + sign r] * (w->Y rows): a chunk's part from a state, once its
 * product is in w->Y (t x R). */
static void add_decayed(ret_slot *w, int t, int R, int off, int sign, float *y) {
    for (int r = 0; r < t; r++) {
        const float f = w->spw[off + sign * r], *src = w->Y + (size_t)r * R;
        float *dst = y + (size_t)r * R;
        for (int m = 0; m < R; m++) dst[m] += f * src[m];
    }
}

/* y rows += f[r] * (a rows S): the chunk's part from the state S (P x R); f = spw shifted
 * so that row r gets spw[off + sign r]. */
static void inter_add(ret_slot *w, int t, const float *a, int P, const float *S, int R, int off, int sign, float *y) {
    prod_rows(t, P, R, a, P, S, w->Y);
    add_decayed(w, t, R, off, sign, y);
}

/* As inter_add with the state's transpose: y rows += f[r] * (a rows S^T), S (R x P). */
static void inter_add_t(ret_slot *w, int t, const float *a, int P, const float *S, int R, int off, int sign,
                        float *y) {
    ab_sgemm(false, true, t, R, P, 1.0f, a, P, S, P, 0.0f, w->Y, R);
    add_decayed(w, t, R, off, sign, y);
}

/* S <- gamma^t S + (diag(pw[off + sign r]) B_c)^T C_c. */
static void state_add(ret_slot *w, int t, const float *b, int P, const float *c, int R, int off, int sign, float *S) {
    const float d = w->pw[t];
    if (d != 1.0f)
        for (size_t e = 0; e < (size_t)P * R; e++) S[e] *= d;
    for (int r = 0; r < t; r++) {
        const float f = w->pw[off + sign * r], *src = b + (size_t)r * P;
        float *dst = w->X + (size_t)r * P;
        for (int e = 0; e < P; e++) dst[e] = f * src[e];
    }
    prod_outer(t, P, R, w->X, c, S);
}

/* y[0..L) = the pass over positions [0, L) (see the top of the file); y may be NULL
 * (only the state). S (P x R, zero on entry) carries the causal sweep's state; with
 * `keep` it holds the state after position L-1 on return (dir with RET_CAUSAL). */
static void ret_pass(const ret_cfg *g, ret_slot *w, int L, int dir, const float *a, const float *b, int P,
                     const float *c, int R, float *y, float *S, bool keep) {
    const int T = g->T;
    for (int i0 = 0; i0 < L; i0 += T) {
        const int t = L - i0 < T ? L - i0 : T;
        const float *ac = a + (size_t)i0 * P, *bc = b + (size_t)i0 * P, *cc = c + (size_t)i0 * R;
        float *yc = y ? y + (size_t)i0 * R : NULL;
        if (yc) intra(g, w, t, dir, ac, bc, P, cc, R, yc);
        if (!(dir & RET_CAUSAL)) continue;
        if (yc && i0 > 0) inter_add(w, t, ac, P, S, R, 1, 1, yc);
        if (i0 + t < L || keep) state_add(w, t, bc, P, cc, R, t - 1, -1, S);
    }
    if (!(dir & RET_ANTI) || !y || L <= 0) return;
    float *U = w->S;
    memset(U, 0, sizeof(float) * (size_t)P * R);
    for (int i0 = ((L - 1) / T) * T; i0 >= 0; i0 -= T) {
        const int t = L - i0 < T ? L - i0 : T;
        const float *ac = a + (size_t)i0 * P, *bc = b + (size_t)i0 * P, *cc = c + (size_t)i0 * R;
        if (i0 + t < L) inter_add(w, t, ac, P, U, R, t, -1, y + (size_t)i0 * R);
        if (i0 > 0) state_add(w, t, bc, P, cc, R, 0, 1, U);
    }
}

/* The backward's dk and dv together: dk is the pass (v, g, q) and dv the pass (k, q, g)
 * (g = dout), with the same decays, and dk's state g^T q is the transpose of dv's q^T g,
 * so one state X (D x M) serves both sweeps. dir is RET_ANTI (causal) or RET_BOTH. A
 * causal backward does the chunks' own t x t terms in the anti-causal sweep itself, so
 * it reads q, k, v and dout once and writes dk and dv once (6 streams of a slice's N
 * rows; two anti-causal ret_pass calls made 18: an intra sweep and an inter sweep each,
 * the second reading its output back), which matters once a slice's tensors outgrow
 * the cache (experiments/sweep/RESULTS.md, the linear-RNN family section). */
static void ret_pass_kv(const ret_cfg *g, ret_slot *w, int L, int dir, const float *q, const float *k,
                        const float *v, const float *gd, float *dk, float *dv) {
    const int T = g->T, D = g->D, M = g->M;
    float *X = w->S;
    if (L <= 0) return;
    if (dir & RET_CAUSAL) {
        memset(X, 0, sizeof(float) * (size_t)D * M);
        for (int i0 = 0; i0 < L; i0 += T) {
            const int t = L - i0 < T ? L - i0 : T;
            const float *qc = q + (size_t)i0 * D, *kc = k + (size_t)i0 * D, *vc = v + (size_t)i0 * M;
            const float *gc = gd + (size_t)i0 * M;
            float *dkc = dk + (size_t)i0 * D, *dvc = dv + (size_t)i0 * M;
            intra(g, w, t, dir, vc, gc, M, qc, D, dkc);
            intra(g, w, t, dir, kc, qc, D, gc, M, dvc);
            if (i0 > 0) {
                inter_add_t(w, t, vc, M, X, D, 1, 1, dkc);
                inter_add(w, t, kc, D, X, M, 1, 1, dvc);
            }
            if (i0 + t < L) state_add(w, t, qc, D, gc, M, t - 1, -1, X);
        }
    }
    memset(X, 0, sizeof(float) * (size_t)D * M);
    for (int i0 = ((L - 1) / T) * T; i0 >= 0; i0 -= T) {
        const int t = L - i0 < T ? L - i0 : T;
        const float *qc = q + (size_t)i0 * D, *kc = k + (size_t)i0 * D, *vc = v + (size_t)i0 * M;
        const float *gc = gd + (size_t)i0 * M;
        float *dkc = dk + (size_t)i0 * D, *dvc = dv + (size_t)i0 * M;
        if (!(dir & RET_CAUSAL)) {
            intra(g, w, t, dir, vc, gc, M, qc, D, dkc);
            intra(g, w, t, dir, kc, qc, D, gc, M, dvc);
        }
        if (i0 + t < L) {
            inter_add_t(w, t, vc, M, X, D, t, -1, dkc);
            inter_add(w, t, kc, D, X, M, t, -1, dvc);
        }
        if (i0 > 0) state_add(w, t, qc, D, gc, M, 0, 1, X);
    }
}

static void zero_rows(float *x, int from, int to, int width) {
    if (to > from) memset(x + (size_t)from * width, 0, sizeof(float) * (size_t)(to - from) * (size_t)width);
}

/* ---- entry points ---- */

static int forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                   void *saved) {
    (void)saved;
    ret_cfg g;
    cfg_make(a, s, s->len, &g);
    const int BH = s->batch * s->heads, N = s->len, D = s->qk_dim, M = s->v_dim;
    const int nt = attn_outer_threads(BH), dir = s->causal ? RET_CAUSAL : RET_BOTH;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
    for (int bh = 0; bh < BH; bh++) {
        ret_slot w = slot_carve(&g, a->ws, omp_get_thread_num());
        const int L = attn_valid_len(s, bh / s->heads);
        const size_t oq = attn_slice(s, bh, D), ov = attn_slice(s, bh, M);
        decay_tables(&g, &w, ret_gamma(a, bh % s->heads));
        memset(w.S, 0, sizeof(float) * (size_t)D * M);
        ret_pass(&g, &w, L, dir, q + oq, k + oq, D, v + ov, M, out + ov, w.S, false);
        zero_rows(out + ov, L, N, M);
    }
    return 0;
}

static int backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, const float *dout,
                    const void *saved, float *dq, float *dk, float *dv) {
    (void)saved;
    ret_cfg g;
    cfg_make(a, s, s->len, &g);
    const int BH = s->batch * s->heads, N = s->len, D = s->qk_dim, M = s->v_dim;
    const int nt = attn_outer_threads(BH);
    const int fwd = s->causal ? RET_CAUSAL : RET_BOTH, rev = s->causal ? RET_ANTI : RET_BOTH;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
    for (int bh = 0; bh < BH; bh++) {
        ret_slot w = slot_carve(&g, a->ws, omp_get_thread_num());
        const int L = attn_valid_len(s, bh / s->heads);
        const size_t oq = attn_slice(s, bh, D), ov = attn_slice(s, bh, M);
        const float *qs = q + oq, *ks = k + oq, *vs = v + ov, *gs = dout + ov;
        decay_tables(&g, &w, ret_gamma(a, bh % s->heads));
        memset(w.S, 0, sizeof(float) * (size_t)D * M);
        ret_pass(&g, &w, L, fwd, gs, vs, M, ks, D, dq + oq, w.S, false);
        ret_pass_kv(&g, &w, L, rev, qs, ks, vs, gs, dk + oq, dv + ov);
        zero_rows(dq + oq, L, N, D);
        zero_rows(dk + oq, L, N, D);
        zero_rows(dv + ov, L, N, M);
    }
    return 0;
}

/* ---- recurrent mode: the state is S [D x M] per slice, B*H of them ---- */

static size_t state_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)a;
    (void)capacity;
    return (size_t)s->batch * (size_t)s->heads * (size_t)s->qk_dim * (size_t)s->v_dim * sizeof(float);
}

static int state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    memset(state, 0, state_bytes(a, s, capacity));
    return 0;
}

static int prefill(attn *a, const attn_shape *s, int capacity, int prompt_len, const float *q, const float *k,
                   const float *v, float *out, void *state) {
    (void)capacity;
    attn_shape ps = *s;
    ps.len = prompt_len;
    ret_cfg g;
    cfg_make(a, &ps, prompt_len, &g);
    const int BH = s->batch * s->heads, D = s->qk_dim, M = s->v_dim;
    const int nt = attn_outer_threads(BH);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
    for (int bh = 0; bh < BH; bh++) {
        ret_slot w = slot_carve(&g, a->ws, omp_get_thread_num());
        float *S = (float *)state + (size_t)bh * D * M;
        const size_t oq = attn_slice(&ps, bh, D), ov = attn_slice(&ps, bh, M);
        decay_tables(&g, &w, ret_gamma(a, bh % s->heads));
        memset(S, 0, sizeof(float) * (size_t)D * M);
        ret_pass(&g, &w, prompt_len, RET_CAUSAL, q + oq, k + oq, D, v + ov, M, out ? out + ov : NULL, S, true);
    }
    return 0;
}

/* S <- gamma S + k v^T and out = s S^T q in one pass over S, row by row (the sums over
 * the rows run in row order; the loop over a row's M columns vectorises). */
static void step_slice(float *restrict S, const float *restrict q, const float *restrict k, const float *restrict v,
                       float *restrict o, int D, int M, float gamma, float scale) {
    for (int m = 0; m < M; m++) o[m] = 0.0f;
    for (int c = 0; c < D; c++) {
        float *row = S + (size_t)c * M;
        const float kc = k[c], qc = q[c];
        for (int m = 0; m < M; m++) {
            const float x = gamma * row[m] + kc * v[m];
            row[m] = x;
            o[m] += qc * x;
        }
    }
    for (int m = 0; m < M; m++) o[m] *= scale;
}

static int step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                const float *v, float *out) {
    (void)capacity;
    (void)t;
    const int BH = s->batch * s->heads, D = s->qk_dim, M = s->v_dim;
    const int nt = attn_outer_threads(BH);
    const float scale = (float)attn_scale(a, D);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int bh = 0; bh < BH; bh++)
        step_slice((float *)state + (size_t)bh * D * M, q + (size_t)bh * D, k + (size_t)bh * D, v + (size_t)bh * M,
                   out + (size_t)bh * M, D, M, (float)ret_gamma(a, bh % s->heads), scale);
    return 0;
}

/* ---- useful floating-point operations ----
 *
 * The recurrent form, per slice and position: S = gamma S + k v^T and s S^T q, two
 * D x M multiply-adds: 4 N D M (linear's rule with C = D and no normaliser). Forward
 * plus backward: 3 times that. The chunks' t x t blocks and the decay are not counted. */
static double flops(const attn *a, const attn_shape *s, bool backward) {
    (void)a;
    double fwd = 4.0 * s->len * (double)s->qk_dim * s->v_dim * (double)s->batch * s->heads;
    return backward ? 3 * fwd : fwd;
}

static const attn_backend cpu_backend = {
    .check_shape = check_shape,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
    .state_bytes = state_bytes,
    .state_init = state_init,
    .prefill = prefill,
    .step = step,
    .step_workspace_bytes = NULL,
};

#ifdef ATTNBENCH_HAVE_CUDA
static int cuda_check_shape(const attn *a, const attn_shape *s) {
    int rc = check_shape(a, s);
    return rc ? rc : ret_cuda_check_sizes(a, s);
}

/* CUDA (retention_cuda.cu): nothing saved, the same state. */
static const attn_backend ret_cuda_backend = {
    .check_shape = cuda_check_shape,
    .saved_bytes = saved_bytes,
    .workspace_bytes = ret_cuda_workspace_bytes,
    .forward = ret_cuda_forward,
    .backward = ret_cuda_backward,
    .state_bytes = state_bytes,
    .state_init = ret_cuda_state_init,
    .prefill = ret_cuda_prefill,
    .step = ret_cuda_step,
    .step_workspace_bytes = NULL,
    .step_replayable = attn_always,
};
#define CUDA_RETENTION (&ret_cuda_backend)
#else
#define CUDA_RETENTION NULL
#endif

const attn_variant attn_variant_retention = {
    .name = "retention",
    .summary = "retention (RetNet): s gamma^|i-j| q.k with a decay gamma per head, chunked parallel form; O(N D M)",
    .options = ret_options,
    .n_options = (int)(sizeof ret_options / sizeof ret_options[0]),
    .defaults = ret_defaults,
    .flops = flops,
    .cpu = &cpu_backend,
    .cuda = CUDA_RETENTION,
};
