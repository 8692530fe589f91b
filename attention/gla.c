/* Gated linear attention (Yang et al. 2023; with a scalar gate, Mamba-2's SSD) on the
 * CPU: variant `gla`.
 *
 * Per slice, with the log-gate g <= 0 ([N, W], W = D for gate=vector, 1 for scalar)
 * and b_i = sum_{t<=i} g_t (per key dimension d; a scalar gate serves every d):
 *   causal      o_i = s sum_{j<=i} sum_d q_id k_jd e^(b_id - b_jd) v_j
 *               (the recurrence S_t = diag(e^g_t) S_{t-1} + k_t v_t^T, o_t = s S_t^T q_t)
 *   non-causal  weights e^(-|b_id - b_jd|) over every valid j: the causal sum plus the
 *               same sum over j > i, which is the causal form of the reversed sequence
 *               with gates g'_t' = g_(L-t') (t' >= 1; g'_0 unused), keys j' < i' only.
 *
 * Chunked, chunk T: inside a chunk of rows r0.., c_i = sum_{r0<=t<=i} g_t (the cumulative
 * gate relative to the chunk start, never a cumulative sum of the whole sequence), so
 *   o_i = s [ (q_i . e^c_i)^T S + sum_{j<=i in chunk} A_ij v_j ],
 *   A_ij = sum_d q_id k_jd e^(c_id - c_jd),
 *   S <- diag(e^c_E) S + sum_j (k_j . e^(c_E - c_j)) v_j^T   (E the chunk's last row),
 * where every exponent is <= 0. A comes from one matrix product of q_i e^(c_i - m) and
 * k_j e^(m - c_j), m = c_E / 2, when the chunk's decay |c_E| is at most FACTOR_MAX in
 * every dimension (the factors then stay within e^(+-FACTOR_MAX/2), and the masked
 * entries j > i within e^FACTOR_MAX |q||k|: no overflow, and each kept entry is the
 * exact term rescaled); else entry by entry from e^(sum_{j<t<=i} g_t), the gap summed
 * from i down (strong gates). The chunk's sums are taken in double.
 *
 * Backward (nothing saved; forward recomputed chunk by chunk), P = dout V^T masked:
 *   forward sweep:  dq_i = s (S dout_i) . e^c_i, then S as in the forward
 *   reverse sweep, R = sum over later rows of (q_i . e^(b_i - b_E)) dout_i^T:
 *     dq_i += s sum_j P_ij k_j e^(c_i - c_j);   dk_j = s [(R v_j) . e^(c_E - c_j)
 *     + sum_i P_ij q_i e^(c_i - c_j)];   dv_j = s [R^T (k_j . e^(c_E - c_j)) + sum_i A_ij dout_i]
 *     R <- diag(e^c_E) R + sum_i (q_i . e^c_i) dout_i^T
 * and the gate's gradient from the fact that q_id enters only as q_id e^b_id and k_jd as
 * k_jd e^-b_jd: dL/db_id = q_id dq_id - k_id dk_id, dg_t = sum_{t'>=t} dL/db_t' (summed
 * over d for a scalar gate), accumulated in double from the sequence's end.
 * Rows >= the valid length are never read; their outputs and gradients are zero. */
#include "cpu_util.h"
#include "variant.h"

#ifdef ATTNBENCH_HAVE_CUDA
#include "gla_cuda.h"
#endif

#include "../harness/error.h"
#include "../harness/memory.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The largest decay |c_E| of a chunk (in any dimension) for which A comes from one
 * product of rescaled factors (see above). Any value up to about 80 keeps e^FACTOR_MAX
 * |q||k| below FLT_MAX; the factors' exponents carry a rounding of up to u FACTOR_MAX / 2
 * each, which the cross-check's tolerance (170 u) bounds: 16 keeps it near 16 u, and
 * costs nothing at the mild gates (|g| ~ 0.1, decay ~ 3 over 32 rows) of the timings. */
#define FACTOR_MAX 16.0f

/* ---- options ---- */

static const char *const gate_choices[] = {"vector", "scalar", NULL};

static const attn_option_spec gla_options[] = {
    {"scale", ATTN_OPT_DOUBLE, offsetof(attn_params, scale), "1/sqrt(D)",
     "scale s of o = s S^T q, in (0, 1e30] or auto (1/sqrt(D))", NULL, 1e-300, 1e30, true, NULL},
    {"gate", ATTN_OPT_CHOICE, offsetof(attn_params, gate), "vector",
     "log-gate g <= 0 (the input g): vector (one per key dimension, [B, H, N, D]) or scalar (one per head and "
     "position, [B, H, N])",
     gate_choices, 0, 0, false, NULL},
    {"chunk", ATTN_OPT_INT, offsetof(attn_params, chunk), "auto",
     "chunk length of the chunked algorithm, 1..65536 or auto (32)", NULL, 1, 65536, true, NULL},
};

static void gla_defaults(attn_params *p) {
    p->scale = NAN;
    p->gate = ATTN_GLA_GATE_VECTOR;
    p->chunk = 0;
}

static int gla_aux_width(const attn *a, int qk_dim) { return a->p.gate == ATTN_GLA_GATE_SCALAR ? 1 : qk_dim; }

/* ---- configuration and workspace ---- */

typedef struct {
    int D, M, W, T;
    float scale;
    bool strict; /* keys j < i only (the reversed direction of the non-causal form) */
} gla_cfg;

/* chunk=auto: 32. Measured: causal forward+backward, B=1, H=8, N=4096, D=M=64, gates
 * -0.1 +- 0.02 (the sweep's), 2 threads, median of 7, ms, for chunk 16/32/64/128:
 * 226 217 238 308 (experiments/sweep/rnn-family-cpu.json with --set). Larger chunks pay for
 * their T x T products; smaller ones for more state products per position. */
static int chunk_of(const attn *a) { return a->p.chunk > 0 ? a->p.chunk : 32; }

static void cfg_make(const attn *a, const attn_shape *s, int len, gla_cfg *g) {
    g->D = s->qk_dim;
    g->M = s->v_dim;
    g->W = gla_aux_width(a, s->qk_dim);
    int T = chunk_of(a);
    g->T = T < len ? T : len;
    if (g->T < 1) g->T = 1;
    g->scale = (float)attn_scale(a, s->qk_dim);
    g->strict = false;
}

/* One thread's pieces: per chunk (T x D) the cumulative gate c, e^c, e^(c_E - c),
 * e^(c - m), e^(m - c), q e^c, k e^(c_E - c), q e^(c - m), k e^(m - c) and a product;
 * A and P (T x T); the states S and R (D x M); D doubles; and for the non-causal form
 * the reversed sequence (q, k, v, g, dout) and its gradients, N rows each. */
typedef struct {
    float *c, *fc, *fe, *fqm, *fkm, *qe, *ke, *qm, *km, *tmp;
    float *A, *P, *S, *R;
    double *acc;
    float *rq, *rk, *rv, *rg, *rdo, *rdq, *rdk, *rdv, *rdg;
} gla_slot;

#define N_TD 10

/* Carves slot pieces from p (or only counts when p is NULL); returns the bytes. */
static size_t slot_layout(const gla_cfg *g, int N, bool noncausal, char *p, gla_slot *w) {
    const size_t TD = (size_t)g->T * g->D, TT = (size_t)g->T * g->T, DM = (size_t)g->D * g->M, f = sizeof(float);
    size_t off = 0;
#define CARVE(field, count, type)                                                                                     \
    do {                                                                                                              \
        if (p) w->field = (type *)(p + off);                                                                          \
        off += attn_align64((size_t)(count) * sizeof(type));                                                          \
    } while (0)
    float **td[N_TD] = {&w->c, &w->fc, &w->fe, &w->fqm, &w->fkm, &w->qe, &w->ke, &w->qm, &w->km, &w->tmp};
    for (int i = 0; i < N_TD; i++) {
        if (p) *td[i] = (float *)(p + off);
        off += attn_align64(TD * f);
    }
    CARVE(A, TT, float);
    CARVE(P, TT, float);
    CARVE(S, DM, float);
    CARVE(R, DM, float);
    CARVE(acc, g->D, double);
    if (noncausal) {
        const size_t n = (size_t)N;
        CARVE(rq, n * g->D, float);
        CARVE(rk, n * g->D, float);
        CARVE(rv, n * g->M, float);
        CARVE(rg, n * g->W, float);
        CARVE(rdo, n * g->M, float);
        CARVE(rdq, n * g->D, float);
        CARVE(rdk, n * g->D, float);
        CARVE(rdv, n * g->M, float);
        CARVE(rdg, n * g->W, float);
    }
#undef CARVE
    return off;
}

static size_t slot_bytes(const attn *a, const attn_shape *s) {
    gla_cfg g;
    cfg_make(a, s, s->len, &g);
    gla_slot w;
    return attn_align64(slot_layout(&g, s->len, !s->causal, NULL, &w));
}

static gla_slot slot_at(const attn *a, const attn_shape *s, const gla_cfg *g, int thread) {
    gla_slot w;
    slot_layout(g, s->len, !s->causal, (char *)a->ws + (size_t)thread * slot_bytes(a, s), &w);
    return w;
}

/* ---- shape, sizes ---- */

static int gla_check_shape(const attn *a, const attn_shape *s) {
    gla_cfg g;
    cfg_make(a, s, s->len, &g);
    gla_slot w;
    size_t per = slot_layout(&g, s->len, !s->causal, NULL, &w), tot;
    /* every piece is at most a few N x 64-float rows; the product guards the total */
    if ((size_t)s->len > SIZE_MAX / 64 / ((size_t)4 * (s->qk_dim + s->v_dim) + 2) ||
        ab_mul_size(per, (size_t)attn_outer_threads(s->batch * s->heads), &tot))
        return ab_fail(AB_EINVAL, "gla: workspace for N=%d D=%d M=%d overflows", s->len, s->qk_dim, s->v_dim);
    return 0;
}

static size_t gla_saved_bytes(const attn *a, const attn_shape *s) {
    (void)a, (void)s;
    return 0;
}

static size_t gla_workspace_bytes(const attn *a, const attn_shape *s) {
    return slot_bytes(a, s) * (size_t)attn_outer_threads(s->batch * s->heads);
}

/* ---- one chunk ---- */

/* The chunk's cumulative gates: c_i = sum_{t<=i} g_t (w->c) and the rest of the chunk
 * c_E - c_i = sum_{t>i} g_t (w->tmp, until the factors are made), each summed in double,
 * so that each carries one rounding relative to itself (a difference of two long sums
 * would carry the rounding of the longer: u |c_E| on a weight near 1). */
static void chunk_cumulative(const gla_cfg *g, const gla_slot *w, int n, const float *gt) {
    const int D = g->D;
    if (g->W == 1) { /* one gate per row, broadcast over d */
        double up = 0.0, down = 0.0;
        for (int i = 0, j = n - 1; i < n; i++, j--) {
            up += gt[i];
            const float cu = (float)up, cd = (float)down;
            for (int d = 0; d < D; d++) w->c[(size_t)i * D + d] = cu;
            for (int d = 0; d < D; d++) w->tmp[(size_t)j * D + d] = cd;
            down += gt[j];
        }
        return;
    }
    double *acc = w->acc;
    for (int d = 0; d < D; d++) acc[d] = 0.0;
    for (int i = 0; i < n; i++) {
        const float *gi = gt + (size_t)i * D;
        float *ci = w->c + (size_t)i * D;
        for (int d = 0; d < D; d++) {
            acc[d] += gi[d];
            ci[d] = (float)acc[d];
        }
    }
    for (int d = 0; d < D; d++) acc[d] = 0.0;
    for (int i = n - 1; i >= 0; i--) {
        const float *gi = gt + (size_t)i * D;
        float *ri = w->tmp + (size_t)i * D;
        for (int d = 0; d < D; d++) {
            ri[d] = (float)acc[d];
            acc[d] += gi[d];
        }
    }
}

/* The chunk's factors for rows 0..n-1 of q, k, gates gt (W per row); returns whether A
 * comes from the product of rescaled factors (qm, km filled when intra: the chunk's own
 * terms are wanted) rather than entry by entry. */
static bool chunk_prep(const gla_cfg *g, const gla_slot *w, int n, const float *gt, const float *q,
                       const float *k, bool intra) {
    const int D = g->D;
    chunk_cumulative(g, w, n, gt);
    const float *cE = w->c + (size_t)(n - 1) * D;
    float decay = 0.0f;
    for (int d = 0; d < D; d++) decay = -cE[d] > decay ? -cE[d] : decay;
    const bool fact = decay <= FACTOR_MAX;
    /* the whole chunk as one run of n D elements (rows are contiguous), through
     * restrict pointers so that the loops vectorise: row by row through w's fields they
     * did not, and these exponentials took 66% of gla's forward+backward (146-189 ms,
     * now 53-57 ms: B = 1, H = 8, N = 4096, D = M = 64, one thread) */
    const int nd = n * D;
    const float *restrict cc = w->c, *restrict rr = w->tmp, *restrict qq = q, *restrict kk = k;
    float *restrict fc = w->fc, *restrict fe = w->fe, *restrict qe = w->qe, *restrict ke = w->ke;
#pragma omp simd
    for (int x = 0; x < nd; x++) {
        const float a = attn_exp_nonpos(cc[x]), b = attn_exp_nonpos(rr[x]);
        fc[x] = a;
        fe[x] = b;
        qe[x] = qq[x] * a;
        ke[x] = kk[x] * b;
    }
    if (fact && intra) {
        float *restrict fqm = w->fqm, *restrict fkm = w->fkm, *restrict qm = w->qm, *restrict km = w->km;
#pragma omp simd
        for (int x = 0; x < nd; x++) {
            const float h = 0.5f * (cc[x] - rr[x]); /* c_i - c_E / 2, in [c_E / 2, -c_E / 2] */
            const float e = attn_exp_nonpos(-fabsf(h)), r = 1.0f / e; /* e^-|h|, e^|h| */
            const float a = h <= 0.0f ? e : r, b = h <= 0.0f ? r : e;
            fqm[x] = a;
            fkm[x] = b;
            qm[x] = qq[x] * a;
            km[x] = kk[x] * b;
        }
    }
    return fact;
}

/* Zeroes the entries of an n x n matrix above the diagonal (and on it when strict). */
static void mask_upper(float *X, int n, bool strict) {
    for (int i = 0; i < n; i++) {
        const int j0 = strict ? i : i + 1;
        if (j0 < n) memset(X + (size_t)i * n + j0, 0, sizeof(float) * (size_t)(n - j0));
    }
}

/* x += g_(j+1): the gap sum_{j<t<=i} g_t grown by one row as j goes down from i, so that
 * its rounding is relative to the gap itself. */
static inline void running_gap(const gla_cfg *g, float *x, const float *gt, int j) {
    const float *gj = gt + (size_t)(j + 1) * g->W;
    if (g->W == 1)
        for (int d = 0; d < g->D; d++) x[d] += gj[0];
    else
        for (int d = 0; d < g->D; d++) x[d] += gj[d];
}

/* A (n x n, masked) of the chunk (gt: its gates, for the entry-by-entry path). */
static void chunk_A(const gla_cfg *g, const gla_slot *w, int n, bool fact, const float *q, const float *k,
                    const float *gt) {
    const int D = g->D;
    if (fact) ab_sgemm(false, true, n, n, D, 1.0f, w->qm, D, w->km, D, 0.0f, w->A, n);
    else
        for (int i = 0; i < n; i++) {
            const float *qi = q + (size_t)i * D;
            float *x = w->tmp; /* sum_{j<t<=i} g_t, from j = i down */
            memset(x, 0, sizeof(float) * (size_t)D);
            for (int j = i; j >= 0; j--) {
                if (j < i) running_gap(g, x, gt, j);
                if (g->strict && j == i) continue;
                const float *kj = k + (size_t)j * D;
                float sum = 0.0f;
                for (int d = 0; d < D; d++) sum += qi[d] * kj[d] * attn_exp_nonpos(x[d]);
                w->A[(size_t)i * n + j] = sum;
            }
        }
    mask_upper(w->A, n, g->strict);
}

/* X (D x M) <- diag(e^c_E) X + F^T Y with F (n x D), Y (n x M): the state's step over a chunk. */
static void state_advance(const gla_cfg *g, const gla_slot *w, int n, float *X, const float *F, const float *Y) {
    const int D = g->D, M = g->M;
    const float *cE = w->c + (size_t)(n - 1) * D;
    for (int d = 0; d < D; d++) {
        const float e = attn_exp_nonpos(cE[d]);
        for (int m = 0; m < M; m++) X[(size_t)d * M + m] *= e;
    }
    ab_sgemm(true, false, D, M, n, 1.0f, F, D, Y, M, 1.0f, X, M);
}

/* ---- one slice ---- */

/* Forward of one slice of L rows: out (may be NULL: only the state) and S, the state
 * after row L-1 (zeroed first). */
static void slice_fwd(const gla_cfg *g, const gla_slot *w, int L, const float *q, const float *k, const float *v,
                      const float *gate, float *out, float *S) {
    const int D = g->D, M = g->M, W = g->W, T = g->T;
    memset(S, 0, sizeof(float) * (size_t)D * M);
    for (int r0 = 0; r0 < L; r0 += T) {
        const int n = r0 + T <= L ? T : L - r0;
        const float *qc = q + (size_t)r0 * D, *kc = k + (size_t)r0 * D, *vc = v + (size_t)r0 * M;
        const bool fact = chunk_prep(g, w, n, gate + (size_t)r0 * W, qc, kc, out != NULL);
        if (out) {
            float *oc = out + (size_t)r0 * M;
            ab_sgemm(false, false, n, M, D, g->scale, w->qe, D, S, M, 0.0f, oc, M);
            chunk_A(g, w, n, fact, qc, kc, gate + (size_t)r0 * W);
            ab_sgemm(false, false, n, M, n, g->scale, w->A, n, vc, M, 1.0f, oc, M);
        }
        state_advance(g, w, n, S, w->ke, vc);
    }
}

/* The chunk's within-chunk terms of dq and dk (added), from P (masked). */
static void chunk_intra_grad(const gla_cfg *g, const gla_slot *w, int n, bool fact, const float *q, const float *k,
                             const float *gt, float *dq, float *dk) {
    const int D = g->D;
    const float s = g->scale;
    if (fact) {
        ab_sgemm(false, false, n, D, n, 1.0f, w->P, n, w->km, D, 0.0f, w->tmp, D);
        for (size_t x = 0; x < (size_t)n * D; x++) dq[x] += s * w->fqm[x] * w->tmp[x];
        ab_sgemm(true, false, n, D, n, 1.0f, w->P, n, w->qm, D, 0.0f, w->tmp, D);
        for (size_t x = 0; x < (size_t)n * D; x++) dk[x] += s * w->fkm[x] * w->tmp[x];
        return;
    }
    for (int i = 0; i < n; i++) {
        const float *qi = q + (size_t)i * D;
        float *dqi = dq + (size_t)i * D, *x = w->tmp;
        memset(x, 0, sizeof(float) * (size_t)D);
        for (int j = i; j >= 0; j--) {
            if (j < i) running_gap(g, x, gt, j);
            if (g->strict && j == i) continue;
            const float p = s * w->P[(size_t)i * n + j];
            const float *kj = k + (size_t)j * D;
            float *dkj = dk + (size_t)j * D;
            for (int d = 0; d < D; d++) {
                const float e = p * attn_exp_nonpos(x[d]);
                dqi[d] += e * kj[d];
                dkj[d] += e * qi[d];
            }
        }
    }
}

/* dg (L x W) from dq, dk: dg_t = sum_{t'>=t} (q dq - k dk)_t' (over d when W = 1). */
static void slice_dgate(const gla_cfg *g, const gla_slot *w, int L, const float *q, const float *k, const float *dq,
                        const float *dk, float *dg) {
    const int D = g->D, W = g->W;
    for (int d = 0; d < W; d++) w->acc[d] = 0.0;
    for (int t = L - 1; t >= 0; t--) {
        const size_t o = (size_t)t * D;
        if (W == 1) {
            double x = 0.0;
            for (int d = 0; d < D; d++) x += (double)q[o + d] * dq[o + d] - (double)k[o + d] * dk[o + d];
            w->acc[0] += x;
            dg[t] = (float)w->acc[0];
        } else
            for (int d = 0; d < D; d++) {
                w->acc[d] += (double)q[o + d] * dq[o + d] - (double)k[o + d] * dk[o + d];
                dg[o + d] = (float)w->acc[d];
            }
    }
    /* dg_0 is the sum of every term: zero exactly (a constant added to g_0 shifts every
     * b alike, and only differences of b enter), here rounding only */
    memset(dg, 0, sizeof(float) * (size_t)W);
}

/* Backward of one slice of L rows: dq, dk, dv (overwritten) and dg (may be NULL). */
static void slice_bwd(const gla_cfg *g, const gla_slot *w, int L, const float *q, const float *k, const float *v,
                      const float *gate, const float *dout, float *dq, float *dk, float *dv, float *dg) {
    const int D = g->D, M = g->M, W = g->W, T = g->T;
    const float s = g->scale;
    memset(w->S, 0, sizeof(float) * (size_t)D * M);
    for (int r0 = 0; r0 < L; r0 += T) { /* dq's terms from earlier chunks */
        const int n = r0 + T <= L ? T : L - r0;
        chunk_prep(g, w, n, gate + (size_t)r0 * W, q + (size_t)r0 * D, k + (size_t)r0 * D, false);
        float *dqc = dq + (size_t)r0 * D;
        ab_sgemm(false, true, n, D, M, s, dout + (size_t)r0 * M, M, w->S, M, 0.0f, dqc, D);
        for (size_t x = 0; x < (size_t)n * D; x++) dqc[x] *= w->fc[x];
        state_advance(g, w, n, w->S, w->ke, v + (size_t)r0 * M);
    }
    memset(w->R, 0, sizeof(float) * (size_t)D * M);
    const int nch = (L + T - 1) / T;
    for (int c = nch - 1; c >= 0; c--) {
        const int r0 = c * T, n = r0 + T <= L ? T : L - r0;
        const float *qc = q + (size_t)r0 * D, *kc = k + (size_t)r0 * D, *vc = v + (size_t)r0 * M;
        const float *doc = dout + (size_t)r0 * M;
        float *dkc = dk + (size_t)r0 * D, *dvc = dv + (size_t)r0 * M;
        const bool fact = chunk_prep(g, w, n, gate + (size_t)r0 * W, qc, kc, true);
        chunk_A(g, w, n, fact, qc, kc, gate + (size_t)r0 * W);
        ab_sgemm(false, true, n, n, M, 1.0f, doc, M, vc, M, 0.0f, w->P, n);
        mask_upper(w->P, n, g->strict);
        ab_sgemm(false, false, n, M, D, s, w->ke, D, w->R, M, 0.0f, dvc, M);
        ab_sgemm(true, false, n, M, n, s, w->A, n, doc, M, 1.0f, dvc, M);
        ab_sgemm(false, true, n, D, M, s, vc, M, w->R, M, 0.0f, dkc, D);
        for (size_t x = 0; x < (size_t)n * D; x++) dkc[x] *= w->fe[x];
        chunk_intra_grad(g, w, n, fact, qc, kc, gate + (size_t)r0 * W, dq + (size_t)r0 * D, dkc);
        state_advance(g, w, n, w->R, w->qe, doc);
    }
    if (dg) slice_dgate(g, w, L, q, k, dq, dk, dg);
}

/* The reversed sequence of L rows of X columns: dst[t] = src[L-1-t]. */
static void reverse_rows(const float *src, float *dst, int L, int X) {
    for (int t = 0; t < L; t++) memcpy(dst + (size_t)t * X, src + (size_t)(L - 1 - t) * X, sizeof(float) * (size_t)X);
}

/* dst[t] += src[L-1-t] over L rows of X columns. */
static void add_reversed(const float *src, float *dst, int L, int X) {
    for (int t = 0; t < L; t++)
        for (int x = 0; x < X; x++) dst[(size_t)t * X + x] += src[(size_t)(L - 1 - t) * X + x];
}

/* The reversed direction's inputs: q, k, v reversed, gates g'_t' = g_(L-t') (g'_0 = 0). */
static void reverse_inputs(const gla_cfg *g, const gla_slot *w, int L, const float *q, const float *k,
                           const float *v, const float *gate) {
    const int W = g->W;
    reverse_rows(q, w->rq, L, g->D);
    reverse_rows(k, w->rk, L, g->D);
    reverse_rows(v, w->rv, L, g->M);
    memset(w->rg, 0, sizeof(float) * (size_t)W);
    for (int t = 1; t < L; t++) memcpy(w->rg + (size_t)t * W, gate + (size_t)(L - t) * W, sizeof(float) * (size_t)W);
}

/* ---- entry points ---- */

/* Zeroes rows [L, N) of a slice of X columns. */
static void zero_tail(float *x, int L, int N, int X) {
    if (N > L) memset(x + (size_t)L * X, 0, sizeof(float) * (size_t)(N - L) * X);
}

static int gla_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                       void *saved) {
    (void)saved;
    const int H = s->heads, N = s->len, D = s->qk_dim, M = s->v_dim, BH = s->batch * H;
    gla_cfg g;
    cfg_make(a, s, N, &g);
    const int W = g.W, nt = attn_outer_threads(BH);
#pragma omp parallel for schedule(dynamic) num_threads(nt) if (nt > 1)
    for (int bh = 0; bh < BH; bh++) {
        const gla_slot w = slot_at(a, s, &g, nt > 1 ? omp_get_thread_num() : 0);
        const int L = attn_valid_len(s, bh / H);
        const float *qs = q + attn_slice(s, bh, D), *ks = k + attn_slice(s, bh, D), *vs = v + attn_slice(s, bh, M);
        const float *gs = a->aux + attn_slice(s, bh, W);
        float *os = out + attn_slice(s, bh, M);
        if (L > 0) slice_fwd(&g, &w, L, qs, ks, vs, gs, os, w.S);
        if (L > 1 && !s->causal) {
            gla_cfg r = g;
            r.strict = true;
            reverse_inputs(&g, &w, L, qs, ks, vs, gs);
            slice_fwd(&r, &w, L, w.rq, w.rk, w.rv, w.rg, w.rdv, w.S);
            add_reversed(w.rdv, os, L, M);
        }
        zero_tail(os, L, N, M);
    }
    return 0;
}

static int gla_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                        const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    (void)saved;
    const int H = s->heads, N = s->len, D = s->qk_dim, M = s->v_dim, BH = s->batch * H;
    gla_cfg g;
    cfg_make(a, s, N, &g);
    const int W = g.W, nt = attn_outer_threads(BH);
    float *dgate = a->aux_grad;
#pragma omp parallel for schedule(dynamic) num_threads(nt) if (nt > 1)
    for (int bh = 0; bh < BH; bh++) {
        const gla_slot w = slot_at(a, s, &g, nt > 1 ? omp_get_thread_num() : 0);
        const int L = attn_valid_len(s, bh / H);
        const size_t od = attn_slice(s, bh, D), om = attn_slice(s, bh, M), ow = attn_slice(s, bh, W);
        float *dgs = dgate ? dgate + ow : NULL;
        if (L > 0)
            slice_bwd(&g, &w, L, q + od, k + od, v + om, a->aux + ow, dout + om, dq + od, dk + od, dv + om, dgs);
        if (L > 1 && !s->causal) {
            gla_cfg r = g;
            r.strict = true;
            reverse_inputs(&g, &w, L, q + od, k + od, v + om, a->aux + ow);
            reverse_rows(dout + om, w.rdo, L, M);
            slice_bwd(&r, &w, L, w.rq, w.rk, w.rv, w.rg, w.rdo, w.rdq, w.rdk, w.rdv, dgs ? w.rdg : NULL);
            add_reversed(w.rdq, dq + od, L, D);
            add_reversed(w.rdk, dk + od, L, D);
            add_reversed(w.rdv, dv + om, L, M);
            if (dgs) /* dg_t += dg'_(L-t), t >= 1 */
                for (int t = 1; t < L; t++)
                    for (int x = 0; x < W; x++) dgs[(size_t)t * W + x] += w.rdg[(size_t)(L - t) * W + x];
        }
        zero_tail(dq + od, L, N, D);
        zero_tail(dk + od, L, N, D);
        zero_tail(dv + om, L, N, M);
        if (dgs) zero_tail(dgs, L, N, W);
    }
    return 0;
}

/* ---- recurrent mode: S (D x M) per slice ---- */

static size_t gla_state_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)a, (void)capacity;
    return (size_t)s->batch * s->heads * s->qk_dim * s->v_dim * sizeof(float);
}

static int gla_state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    memset(state, 0, gla_state_bytes(a, s, capacity));
    return 0;
}

static int gla_prefill(attn *a, const attn_shape *s, int capacity, int P, const float *q, const float *k,
                       const float *v, float *out, void *state) {
    (void)capacity;
    attn_shape ps = *s;
    ps.len = P;
    const int D = s->qk_dim, M = s->v_dim, BH = s->batch * s->heads;
    gla_cfg g;
    cfg_make(a, &ps, P, &g);
    const int W = g.W, nt = attn_outer_threads(BH);
#pragma omp parallel for schedule(dynamic) num_threads(nt) if (nt > 1)
    for (int bh = 0; bh < BH; bh++) {
        const gla_slot w = slot_at(a, &ps, &g, nt > 1 ? omp_get_thread_num() : 0);
        const size_t od = attn_slice(&ps, bh, D), om = attn_slice(&ps, bh, M);
        slice_fwd(&g, &w, P, q + od, k + od, v + om, a->aux + attn_slice(&ps, bh, W), out ? out + om : NULL,
                  (float *)state + (size_t)bh * D * M);
    }
    return 0;
}

static int gla_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                    const float *v, float *out) {
    (void)capacity, (void)t;
    const int D = s->qk_dim, M = s->v_dim, BH = s->batch * s->heads, W = gla_aux_width(a, D);
    const float scale = (float)attn_scale(a, D);
    const int nt = attn_outer_threads(BH);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int bh = 0; bh < BH; bh++) {
        float *S = (float *)state + (size_t)bh * D * M, *o = out + (size_t)bh * M;
        const float *qt = q + (size_t)bh * D, *kt = k + (size_t)bh * D, *vt = v + (size_t)bh * M;
        const float *gt = a->aux + (size_t)bh * W;
        memset(o, 0, sizeof(float) * (size_t)M);
        for (int d = 0; d < D; d++) {
            float *Sd = S + (size_t)d * M;
            const float e = attn_exp_nonpos(gt[W == 1 ? 0 : d]), kd = kt[d], qd = scale * qt[d];
            for (int m = 0; m < M; m++) {
                Sd[m] = e * Sd[m] + kd * vt[m];
                o[m] += qd * Sd[m];
            }
        }
    }
    return 0;
}

/* ---- useful floating-point operations ----
 *
 * Per slice and position: 2 D M for the query against the state, 2 D M for the state's
 * update, and the chunk's own products, 2 (D + M) per (query, key) pair within the
 * chunk, about T (D + M) per position; twice that for non-causal (two directions).
 * Forward plus backward 3 times the forward (as linear). */
static double gla_flops(const attn *a, const attn_shape *s, bool backward) {
    const double T = chunk_of(a) < s->len ? chunk_of(a) : s->len, D = s->qk_dim, M = s->v_dim;
    double fwd = (double)s->batch * s->heads * s->len * (4 * D * M + T * (D + M));
    if (!s->causal) fwd *= 2;
    return backward ? 3 * fwd : fwd;
}

static const attn_backend cpu_backend = {
    .check_shape = gla_check_shape,
    .saved_bytes = gla_saved_bytes,
    .workspace_bytes = gla_workspace_bytes,
    .forward = gla_forward,
    .backward = gla_backward,
    .state_bytes = gla_state_bytes,
    .state_init = gla_state_init,
    .prefill = gla_prefill,
    .step = gla_step,
};

#ifdef ATTNBENCH_HAVE_CUDA
static const attn_backend cuda_backend = {
    .check_shape = gla_check_shape,
    .saved_bytes = gla_saved_bytes,
    .workspace_bytes = gla_cuda_workspace_bytes,
    .forward = gla_cuda_forward,
    .backward = gla_cuda_backward,
    .state_bytes = gla_state_bytes,
    .state_init = gla_cuda_state_init,
    .prefill = gla_cuda_prefill,
    .step = gla_cuda_step,
    .step_replayable = attn_always,
};
#define CUDA_GLA (&cuda_backend)
#else
#define CUDA_GLA NULL
#endif

const attn_variant attn_variant_gla = {
    .name = "gla",
    .summary = "gated linear attention (Yang et al. 2023; scalar gate: Mamba-2's SSD): S_t = diag(e^g_t) S_{t-1} + "
               "k_t v_t^T, o_t = s S_t^T q_t, log-gate input g <= 0; chunked, O(N T (D + M) + N D M); recurrent: S",
    .options = gla_options,
    .n_options = (int)(sizeof gla_options / sizeof gla_options[0]),
    .defaults = gla_defaults,
    .flops = gla_flops,
    .aux_name = "g",
    .aux_width = gla_aux_width,
    .cpu = &cpu_backend,
    .cuda = CUDA_GLA,
};
