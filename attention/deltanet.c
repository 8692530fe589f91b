/* deltanet: linear attention with the delta rule (Schlag et al. 2021, "Linear
 * Transformers Are Secretly Fast Weight Programmers"; the chunked form of Yang et al.
 * 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence Length"),
 * on the CPU. Causal only. Per slice (b, h), with the rate beta [B, H, N] bound by
 * attn_bind_aux:
 *
 *   qn = q / r_q, kn = k / r_k,  r_x = sqrt(|x|^2 + DN_EPS)      (L2 normalisation)
 *   S_0 = 0,  S_t = (I - beta_t kn_t kn_t^T) S_{t-1} + beta_t kn_t v_t^T   (D x M)
 *             = S_{t-1} + beta_t kn_t e_t^T,  e_t = v_t - S_{t-1}^T kn_t
 *   out_t = S_t^T qn_t   (no scale)
 *
 * Positions t >= L = lengths[b] are never read; their outputs and gradients are zero.
 *
 * Forward: chunks of C positions (option chunk). With C >= 2 each chunk goes through
 * the chunked (WY) form in matrix products (deltanet_wy.c); with C = 1 the slice runs
 * the recurrence one position at a time (the scan: per position one pass over S for
 * S^T kn and S^T qn, one for the update, o_t = S_{t-1}^T qn + beta_t (kn . qn) e_t).
 * Both give the same states at the chunk boundaries. What forward saves: the state at
 * the start of every chunk, ceil(N / C) D x M per slice.
 *
 * Backward: chunk by chunk from the last, each from its saved starting state and
 * G = dL/dS after it. With C >= 2 the chunked form's backward (deltanet_wy.c: matrix
 * products again); with C = 1 the reverse recurrence, the position's state S_{t-1}
 * being the saved one, with G = dL/dS_t:
 *   G += qn_t dout_t^T;  dqn_t = S_t dout_t = S_{t-1} dout_t + beta_t kn_t (e_t . dout_t)
 *   de = beta_t G^T kn_t = dv_t;  dbeta_t = (G^T kn_t) . e_t
 *   dkn_t = beta_t G e_t - S_{t-1} de;  G <- G - kn_t de^T
 *   dx = (dxn - xn (xn . dxn)) / r_x   (through the normalisation).
 * dbeta goes to the bound gradient buffer (overwritten) when there is one.
 *
 * Recurrent mode: the state is S per slice (B H D M floats, constant in the length);
 * step reads beta as [B, H], prefill as [B, H, P] and runs the forward on the prompt. */
#include "deltanet.h"

#include "cpu_util.h"
#ifdef ATTNBENCH_HAVE_CUDA
#include "deltanet_cuda.h"
#endif
#include "variant.h"

#include "../harness/error.h"
#include "../harness/memory.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

static const attn_option_spec dn_options[] = {
    {"chunk", ATTN_OPT_INT, offsetof(attn_params, chunk), "auto",
     "positions per chunk: the forward's chunked form and the states saved for backward (one per chunk), "
     "1..65536 or auto (" DN_CHUNK_AUTO_TEXT ")",
     NULL, 1, 65536, true, NULL},
};

static void dn_defaults(attn_params *p) { p->chunk = 0; }

int dn_chunk(const attn *a, int len) {
    int c = a->p.chunk > 0 ? a->p.chunk : DN_CHUNK_AUTO;
    return c < len ? c : (len > 0 ? len : 1);
}

/* ---- sizes ---- */

/* States S_{t-1} the scan's backward keeps per chunk (none for the chunked form). */
static int scan_states(int C) { return dn_wy_usable(C) ? 0 : C; }

/* Floats of one thread's workspace: the scan's states S_{t-1} (scan_states), the
 * chunk's qn, kn (C D each), norms (2 C), e (C M), G and the running state (2 D M),
 * vectors (4 D + 4 M); the chunked form's blocks (dn_wy_floats). 0 on overflow. */
static size_t slot_floats(int C, int D, int M) {
    size_t dm, cdm, f;
    if (ab_mul_size((size_t)D, (size_t)M, &dm) || ab_mul_size(dm, (size_t)scan_states(C) + 2, &cdm)) return 0;
    f = cdm + (size_t)C * (2 * (size_t)D + (size_t)M + 2) + 4 * (size_t)D + 4 * (size_t)M;
    size_t w = dn_wy_floats(C, D, M);
    if (w == 0 || f > SIZE_MAX / 8 - w) return 0;
    return f + w;
}

static size_t slot_bytes(const attn_shape *s, int C) {
    return attn_align64(slot_floats(C, s->qk_dim, s->v_dim) * sizeof(float));
}

static int n_chunks(int N, int C) { return (N + C - 1) / C; }

static int dn_check_shape(const attn *a, const attn_shape *s) {
    if (!s->causal)
        return ab_fail(AB_EUNSUPPORTED, "variant 'deltanet' is causal only: the delta rule's state runs forward in "
                                        "time (use a causal shape, or another variant)");
    const int C = dn_chunk(a, s->len);
    size_t slot = slot_floats(C, s->qk_dim, s->v_dim), all, saved, dm;
    /* BLAS takes int sizes: the blocks of a chunk index with int */
    if (slot == 0 || (size_t)s->qk_dim * (size_t)s->v_dim > (size_t)INT_MAX ||
        ab_mul_size(slot * sizeof(float) + 64, (size_t)attn_outer_threads(s->batch * s->heads), &all) ||
        ab_mul_size((size_t)s->qk_dim, (size_t)s->v_dim, &dm) ||
        ab_mul_size(dm, (size_t)n_chunks(s->len, C), &saved) ||
        ab_mul_size(saved, (size_t)s->batch * (size_t)s->heads * sizeof(float), &saved))
        return ab_fail(AB_EINVAL, "variant 'deltanet': D=%d M=%d N=%d with chunk %d: sizes overflow", s->qk_dim,
                       s->v_dim, s->len, C);
    return 0;
}

/* The state at the start of every chunk, per slice. */
static size_t dn_saved_bytes(const attn *a, const attn_shape *s) {
    return (size_t)s->batch * s->heads * (size_t)n_chunks(s->len, dn_chunk(a, s->len)) * s->qk_dim * s->v_dim *
           sizeof(float);
}

static size_t dn_workspace_bytes(const attn *a, const attn_shape *s) {
    return slot_bytes(s, dn_chunk(a, s->len)) * (size_t)attn_outer_threads(s->batch * s->heads);
}

/* ---- one position ---- */

/* sum_i a[i] b[i] in float with 8 partial sums (vectorises). */
static inline float dotf(const float *restrict a, const float *restrict b, int n) {
    float ps[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) ps[u] += a[i + u] * b[i + u];
    float s = 0;
    for (; i < n; i++) s += a[i] * b[i];
    for (int u = 0; u < 8; u++) s += ps[u];
    return s;
}

float dn_normalise(const float *x, int D, float *xn) {
    const float r = (float)sqrt(attn_dot_d(x, x, D) + DN_EPS), inv = 1.0f / r;
    for (int d = 0; d < D; d++) xn[d] = x[d] * inv;
    return r;
}

/* dx = (dxn - xn (xn . dxn)) / r */
static void normalise_back(const float *xn, float r, const float *dxn, int D, float *dx) {
    const float p = dotf(xn, dxn, D), inv = 1.0f / r;
    for (int d = 0; d < D; d++) dx[d] = (dxn[d] - xn[d] * p) * inv;
}

/* u = S^T kn and (when w) w = S^T qn, in one pass over S (D x M). */
static void state_t_mul(int D, int M, const float *restrict S, const float *restrict kn, const float *restrict qn,
                        float *restrict u, float *restrict w) {
    memset(u, 0, sizeof(float) * (size_t)M);
    if (w) memset(w, 0, sizeof(float) * (size_t)M);
    for (int d = 0; d < D; d++) {
        const float *restrict row = S + (size_t)d * M;
        const float kd = kn[d];
        for (int m = 0; m < M; m++) u[m] += kd * row[m];
        if (w) {
            const float qd = qn[d];
            for (int m = 0; m < M; m++) w[m] += qd * row[m];
        }
    }
}

/* dst = src + beta kn e^T (dst may be src). */
static void rank1(int D, int M, const float *src, float *dst, float beta, const float *restrict kn,
                  const float *restrict e) {
    for (int d = 0; d < D; d++) {
        const float c = beta * kn[d];
        const float *sr = src + (size_t)d * M;
        float *dr = dst + (size_t)d * M;
        for (int m = 0; m < M; m++) dr[m] = sr[m] + c * e[m];
    }
}

/* One position of the recurrence: S from S_{t-1} to S_t, o = S_t^T qn (when o).
 * tmp: 2 D + 2 M floats. */
void dn_step_one(int D, int M, float *S, const float *q, const float *k, const float *v, float beta, float *o,
                 float *tmp) {
    float *qn = tmp, *kn = tmp + D, *u = tmp + 2 * D, *w = u + M;
    dn_normalise(k, D, kn);
    if (o) dn_normalise(q, D, qn);
    state_t_mul(D, M, S, kn, o ? qn : NULL, u, o ? w : NULL);
    for (int m = 0; m < M; m++) u[m] = v[m] - u[m]; /* e */
    if (o) {
        const float c = beta * dotf(kn, qn, D);
        for (int m = 0; m < M; m++) o[m] = w[m] + c * u[m];
    }
    rank1(D, M, S, S, beta, kn, u);
}

/* ---- forward ---- */

/* One slice of valid length L (<= N; the tensors' row count is N): out rows (when out),
 * the chunks' starting states (when bounds), the final state into S (D M floats). */
static void forward_slice(const attn *a, int N, int L, int D, int M, const float *q, const float *k, const float *v,
                          const float *beta, float *out, float *bounds, float *S, float *tmp) {
    const int C = dn_chunk(a, N);
    const size_t dm = (size_t)D * M;
    memset(S, 0, sizeof(float) * dm);
    for (int t0 = 0; t0 < L; t0 += C) {
        const int n = L - t0 < C ? L - t0 : C;
        if (bounds) memcpy(bounds + (size_t)(t0 / C) * dm, S, sizeof(float) * dm);
        if (dn_wy_usable(C)) {
            dn_wy_chunk(n, D, M, q + (size_t)t0 * D, k + (size_t)t0 * D, v + (size_t)t0 * M, beta + t0, S,
                        out ? out + (size_t)t0 * M : NULL, tmp + 2 * D + 2 * M);
            continue;
        }
        for (int t = t0; t < t0 + n; t++)
            dn_step_one(D, M, S, q + (size_t)t * D, k + (size_t)t * D, v + (size_t)t * M, beta[t],
                        out ? out + (size_t)t * M : NULL, tmp);
    }
    if (out && L < N) memset(out + (size_t)L * M, 0, sizeof(float) * (size_t)(N - L) * M);
}

/* The forward of shape s (prefill: the prompt's); states (when not NULL) gets each
 * slice's final state. */
static void forward_impl(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                         void *saved, float *states) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim, BH = s->batch * s->heads, C = dn_chunk(a, N);
    const size_t dm = (size_t)D * M, slot = slot_bytes(s, C), nb = (size_t)n_chunks(N, C);
    const int nt = attn_outer_threads(BH);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (int bh = 0; bh < BH; bh++) {
        float *ws = (float *)((char *)a->ws + (size_t)omp_get_thread_num() * slot);
        float *S = states ? states + (size_t)bh * dm : ws;
        float *tmp = ws + dm;
        forward_slice(a, N, attn_valid_len(s, bh / s->heads), D, M, q + attn_slice(s, bh, D),
                      k + attn_slice(s, bh, D), v + attn_slice(s, bh, M), a->aux + (size_t)bh * N,
                      out ? out + attn_slice(s, bh, M) : NULL, saved ? (float *)saved + (size_t)bh * nb * dm : NULL,
                      S, tmp);
    }
}

static int dn_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                      void *saved) {
    forward_impl(a, s, q, k, v, out, saved, NULL);
    return 0;
}

/* ---- backward ---- */

typedef struct {
    int D, M, C;
    float *Sb;           /* C states S_{t-1}, D x M each */
    float *qn, *kn, *e;  /* C x D, C x D, C x M */
    float *rq, *rk;      /* C norms each */
    float *G;            /* D x M: dL/dS_t */
    float *gk, *dqn, *dkn, *de; /* M, D, D, M */
    float *wy;                  /* the chunked form's blocks (dn_wy_floats) */
} bwd_ws;

static void bwd_carve(float *w, int C, int D, int M, bwd_ws *b) {
    const size_t dm = (size_t)D * M;
    b->D = D, b->M = M, b->C = C;
    b->Sb = w, w += (size_t)scan_states(C) * dm;
    b->G = w, w += dm;
    b->qn = w, w += (size_t)C * D;
    b->kn = w, w += (size_t)C * D;
    b->e = w, w += (size_t)C * M;
    b->rq = w, w += C;
    b->rk = w, w += C;
    b->gk = w, w += M;
    b->de = w, w += M;
    b->dqn = w, w += D;
    b->dkn = w, w += D;
    b->wy = w;
}

/* Recomputes positions [t0, t0 + n) from the chunk's starting state S0: Sb[i] = S_{t0+i-1},
 * qn, kn, their norms and e. */
static void recompute_chunk(bwd_ws *b, int t0, int n, const float *S0, const float *q, const float *k,
                            const float *v, const float *beta) {
    const int D = b->D, M = b->M;
    const size_t dm = (size_t)D * M;
    memcpy(b->Sb, S0, sizeof(float) * dm);
    for (int i = 0; i < n; i++) {
        const int t = t0 + i;
        float *Sp = b->Sb + (size_t)i * dm, *kn = b->kn + (size_t)i * D, *e = b->e + (size_t)i * M;
        b->rq[i] = dn_normalise(q + (size_t)t * D, D, b->qn + (size_t)i * D);
        b->rk[i] = dn_normalise(k + (size_t)t * D, D, kn);
        state_t_mul(D, M, Sp, kn, NULL, e, NULL);
        const float *vt = v + (size_t)t * M;
        for (int m = 0; m < M; m++) e[m] = vt[m] - e[m];
        if (i + 1 < n) rank1(D, M, Sp, Sp + dm, beta[t], kn, e);
    }
}

/* The reverse recurrence over position t = t0 + i of the chunk (G holds dL/dS_t's
 * later part on entry, dL/dS_{t-1} on return). */
static void reverse_one(bwd_ws *b, int i, float bt, const float *g, float *dq, float *dk, float *dv, float *dbeta) {
    const int D = b->D, M = b->M;
    const float *Sp = b->Sb + (size_t)i * D * M, *qn = b->qn + (size_t)i * D, *kn = b->kn + (size_t)i * D;
    const float *e = b->e + (size_t)i * M;
    float *restrict G = b->G, *restrict gk = b->gk, *restrict de = b->de;
    const float eg = bt * dotf(e, g, M);
    memset(gk, 0, sizeof(float) * (size_t)M);
    for (int d = 0; d < D; d++) { /* G += qn g^T; gk = G^T kn; dqn = S_{t-1} g + beta kn (e . g) */
        float *restrict gr = G + (size_t)d * M;
        const float qd = qn[d], kd = kn[d];
        for (int m = 0; m < M; m++) {
            gr[m] += qd * g[m];
            gk[m] += kd * gr[m];
        }
        b->dqn[d] = dotf(Sp + (size_t)d * M, g, M) + eg * kd;
    }
    for (int m = 0; m < M; m++) de[m] = bt * gk[m];
    if (dbeta) *dbeta = dotf(gk, e, M);
    memcpy(dv, de, sizeof(float) * (size_t)M);
    for (int d = 0; d < D; d++) { /* dkn = beta G e - S_{t-1} de; G -= kn de^T */
        float *restrict gr = G + (size_t)d * M;
        b->dkn[d] = bt * dotf(gr, e, M) - dotf(Sp + (size_t)d * M, de, M);
        const float kd = kn[d];
        for (int m = 0; m < M; m++) gr[m] -= kd * de[m];
    }
    normalise_back(qn, b->rq[i], b->dqn, D, dq);
    normalise_back(kn, b->rk[i], b->dkn, D, dk);
}

static void backward_slice(bwd_ws *b, int N, int L, const float *bounds, const float *q, const float *k,
                           const float *v, const float *beta, const float *dout, float *dq, float *dk, float *dv,
                           float *dbeta) {
    const int D = b->D, M = b->M, C = b->C;
    memset(b->G, 0, sizeof(float) * (size_t)D * M);
    for (int c = n_chunks(L, C) - 1; c >= 0; c--) {
        const int t0 = c * C, n = L - t0 < C ? L - t0 : C;
        if (dn_wy_usable(C)) {
            dn_wy_backward_chunk(n, D, M, q + (size_t)t0 * D, k + (size_t)t0 * D, v + (size_t)t0 * M, beta + t0,
                                 bounds + (size_t)c * D * M, b->G, dout + (size_t)t0 * M, dq + (size_t)t0 * D,
                                 dk + (size_t)t0 * D, dv + (size_t)t0 * M, dbeta ? dbeta + t0 : NULL, b->wy);
            continue;
        }
        recompute_chunk(b, t0, n, bounds + (size_t)c * D * M, q, k, v, beta);
        for (int i = n - 1; i >= 0; i--) {
            const int t = t0 + i;
            reverse_one(b, i, beta[t], dout + (size_t)t * M, dq + (size_t)t * D, dk + (size_t)t * D,
                        dv + (size_t)t * M, dbeta ? dbeta + t : NULL);
        }
    }
    const size_t pad = (size_t)(N - L);
    memset(dq + (size_t)L * D, 0, sizeof(float) * pad * D);
    memset(dk + (size_t)L * D, 0, sizeof(float) * pad * D);
    memset(dv + (size_t)L * M, 0, sizeof(float) * pad * M);
    if (dbeta) memset(dbeta + L, 0, sizeof(float) * pad);
}

static int dn_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                       const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim, BH = s->batch * s->heads, C = dn_chunk(a, N);
    const size_t dm = (size_t)D * M, slot = slot_bytes(s, C), nb = (size_t)n_chunks(N, C);
    const int nt = attn_outer_threads(BH);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (int bh = 0; bh < BH; bh++) {
        bwd_ws b;
        bwd_carve((float *)((char *)a->ws + (size_t)omp_get_thread_num() * slot), C, D, M, &b);
        backward_slice(&b, N, attn_valid_len(s, bh / s->heads), (const float *)saved + (size_t)bh * nb * dm,
                       q + attn_slice(s, bh, D), k + attn_slice(s, bh, D), v + attn_slice(s, bh, M),
                       a->aux + (size_t)bh * N, dout + attn_slice(s, bh, M), dq + attn_slice(s, bh, D),
                       dk + attn_slice(s, bh, D), dv + attn_slice(s, bh, M),
                       a->aux_grad ? a->aux_grad + (size_t)bh * N : NULL);
    }
    return 0;
}

/* ---- recurrent mode: S per slice ---- */

static size_t dn_state_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)a, (void)capacity;
    return (size_t)s->batch * s->heads * (size_t)s->qk_dim * s->v_dim * sizeof(float);
}

static int dn_state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    memset(state, 0, dn_state_bytes(a, s, capacity));
    return 0;
}

static size_t step_slot(const attn_shape *s) {
    return attn_align64((size_t)(2 * s->qk_dim + 2 * s->v_dim) * sizeof(float));
}

static size_t dn_step_workspace_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)a, (void)capacity;
    return step_slot(s) * (size_t)attn_outer_threads(s->batch * s->heads);
}

static int dn_prefill(attn *a, const attn_shape *s, int capacity, int P, const float *q, const float *k,
                      const float *v, float *out, void *state) {
    (void)capacity;
    attn_shape ps = *s;
    ps.len = P;
    forward_impl(a, &ps, q, k, v, out, NULL, state);
    return 0;
}

static int dn_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                   const float *v, float *out) {
    (void)capacity, (void)t;
    const int D = s->qk_dim, M = s->v_dim, BH = s->batch * s->heads;
    const size_t dm = (size_t)D * M, slot = step_slot(s);
    const int nt = attn_outer_threads(BH);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int bh = 0; bh < BH; bh++)
        dn_step_one(D, M, (float *)state + (size_t)bh * dm, q + (size_t)bh * D, k + (size_t)bh * D,
                    v + (size_t)bh * M, a->aux[bh], out + (size_t)bh * M,
                    (float *)((char *)a->ws + (size_t)omp_get_thread_num() * slot));
    return 0;
}

/* ---- useful floating-point operations ----
 *
 * The scan, per position and slice: S^T kn, S^T qn and the rank-one update, three
 * D x M multiply-adds: 6 N D M. Forward plus backward: 3 times that (the sweep's rule,
 * as linear's). The normalisations and the chunked form's C x C blocks are not
 * counted. */
static double dn_flops(const attn *a, const attn_shape *s, bool backward) {
    (void)a;
    double fwd = 6.0 * s->len * (double)s->qk_dim * s->v_dim * s->batch * s->heads;
    return backward ? 3 * fwd : fwd;
}

static int dn_aux_width(const attn *a, int qk_dim) {
    (void)a, (void)qk_dim;
    return 1;
}

static const attn_backend cpu_backend = {
    .check_shape = dn_check_shape,
    .saved_bytes = dn_saved_bytes,
    .workspace_bytes = dn_workspace_bytes,
    .forward = dn_forward,
    .forward_unsaved = true,
    .backward = dn_backward,
    .state_bytes = dn_state_bytes,
    .state_init = dn_state_init,
    .prefill = dn_prefill,
    .step = dn_step,
    .step_workspace_bytes = dn_step_workspace_bytes,
};

#ifdef ATTNBENCH_HAVE_CUDA
/* The CPU's checks, saved layout and state size (deltanet_cuda.cu). */
static const attn_backend cuda_backend = {
    .check_shape = dn_check_shape,
    .saved_bytes = dn_saved_bytes,
    .workspace_bytes = dn_cuda_workspace_bytes,
    .forward = dn_cuda_forward,
    .forward_unsaved = true,
    .backward = dn_cuda_backward,
    .state_bytes = dn_state_bytes,
    .state_init = dn_cuda_state_init,
    .prefill = dn_cuda_prefill,
    .step = dn_cuda_step,
    .step_replayable = attn_always,
};
#define CUDA_DELTANET (&cuda_backend)
#else
#define CUDA_DELTANET NULL
#endif

const attn_variant attn_variant_deltanet = {
    .name = "deltanet",
    .summary = "DeltaNet: linear attention with the delta rule, S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t "
               "v_t^T on L2-normalised q, k, out_t = S_t^T q_t; causal only; reads the rate beta in [0, 1] per "
               "position (attn_bind_aux); O(N D M); recurrent: S per head",
    .options = dn_options,
    .n_options = (int)(sizeof dn_options / sizeof dn_options[0]),
    .defaults = dn_defaults,
    .flops = dn_flops,
    .aux_name = "beta",
    .aux_width = dn_aux_width,
    .cpu = &cpu_backend,
    .cuda = CUDA_DELTANET,
};
