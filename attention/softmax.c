/* softmax attention on the CPU: out = softmax(scale Q K^T, masked) V.
 *
 * The paper's quadratic-memory baseline: forward saves the probabilities P (one
 * N x N float matrix per (b, h) slice, saved_bytes = B*H*N*N*4) and backward reads
 * them:
 *   dV = P^T dO,  dP = dO V^T,  dS = P .* (dP - rowsum(dP .* P)),
 *   dQ = scale dS K,  dK = scale dS^T Q.
 * Queries go in row blocks of SMX_ROW_BLOCK: a block's scores are one GEMM written
 * straight into its rows of P, and a causal block [r0, r1) multiplies keys [0, r1)
 * only, so the upper triangle is skipped (up to one diagonal block per block row).
 * Keys at positions >= lengths[b] are never touched; query rows there output zero and
 * get zero gradient. Rows of P that no query reads are left unwritten.
 *
 * Threads: forward blocks are independent, so forward runs over (slice, block) items
 * (no workspace). Backward accumulates dK and dV over the blocks of a slice: with at
 * least as many slices as threads it runs over slices, each thread slot with a
 * SMX_ROW_BLOCK x N buffer for dP / dS; with fewer, it runs the slices in turn and
 * splits each slice's blocks over the threads, each slot adding into its own dK, dV
 * (N x (D + M) more per slot), summed at the end of the slice (see plan_backward).
 * With fewer items than threads a loop runs serially, BLAS gets the threads and the
 * element-wise passes are split over rows. */
#include "softmax_cpu.h"

#include "cpu_util.h"
#include "softmax_cuda.h"

#include "../harness/error.h"
#include "../harness/memory.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- options ---- */

const attn_option_spec smx_options[SMX_N_OPTIONS] = {
    {.name = "scale",
     .type = ATTN_OPT_DOUBLE,
     .offset = offsetof(attn_params, scale),
     .def = "1/sqrt(D)",
     .help = "multiplier of q.k inside the softmax: any finite number, or auto for 1/sqrt(D)",
     .choices = NULL,
     .min = -DBL_MAX,
     .max = DBL_MAX,
     .auto_ok = true},
};

void smx_defaults(attn_params *p) { p->scale = NAN; }

double smx_flops(const attn *a, const attn_shape *s, bool backward) {
    (void)a;
    double bh = (double)s->batch * s->heads, n = s->len, D = s->qk_dim, M = s->v_dim;
    double pairs = s->causal ? n * (n + 1) / 2 : n * n;
    double fwd = 2 * pairs * (D + M) * bh;
    return backward ? 3 * fwd : fwd;
}

/* ---- element-wise kernels ---- */

/* exp(x) for x <= 0, written so that loops over it vectorise: Cody-Waite reduction
 * x = n ln2 + r, |r| <= ln2/2, then the degree-7 Taylor polynomial of exp(r)
 * (truncation < 6e-9 relative, below float rounding), times 2^n built from its bits.
 * x is clamped at -87 (exp(-87) ~ 1.6e-38, still a normal float): a probability that
 * small is zero for every purpose here. */
static inline float smx_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float shift = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float t = x * 1.44269504088896341f + shift;
    float n = t - shift;
    float r = x - n * 0.693359375f; /* ln 2 split: the high part times n is exact */
    r = r - n * -2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    int32_t ni = (int32_t)tb - 0x4B400000; /* the integer n, from the low bits of t */
    uint32_t sb = (uint32_t)(ni + 127) << 23;
    float s;
    memcpy(&s, &sb, sizeof s);
    return p * s;
}

void smx_softmax_row(float *x, int n) {
    /* max, with 8 partial maxima so the loop vectorises */
    float pm[8];
    for (int u = 0; u < 8; u++) pm[u] = -INFINITY;
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) pm[u] = x[j + u] > pm[u] ? x[j + u] : pm[u];
    float m = -INFINITY;
    for (; j < n; j++) m = x[j] > m ? x[j] : m;
    for (int u = 0; u < 8; u++) m = pm[u] > m ? pm[u] : m;
    for (j = 0; j < n; j++) x[j] = smx_exp(x[j] - m);
    /* sum of up to N terms in double (8 partial sums, vectorisable) */
    double ps[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (j = 0; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) ps[u] += (double)x[j + u];
    double sum = 0;
    for (; j < n; j++) sum += (double)x[j];
    for (int u = 0; u < 8; u++) sum += ps[u];
    float inv = (float)(1.0 / sum); /* sum >= 1: the max term is exp(0) */
    for (j = 0; j < n; j++) x[j] *= inv;
}

/* sum_j a[j] * b[j] in double (8 partial sums). */
static double smx_dot(const float *a, const float *b, int n) {
    double ps[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) ps[u] += (double)a[j + u] * (double)b[j + u];
    double sum = 0;
    for (; j < n; j++) sum += (double)a[j] * (double)b[j];
    for (int u = 0; u < 8; u++) sum += ps[u];
    return sum;
}

/* ---- blocks ---- */

void smx_block_forward(const float *q, const float *k, const float *v, float *out, float *p, size_t ldp, int r0,
                       int r1, int kc, int D, int M, bool causal, float scale, bool inner_par) {
    int rb = r1 - r0;
    /* S = scale Q[r0:r1] K[0:kc]^T  (rb, kc) */
    ab_sgemm(false, true, rb, kc, D, scale, q + (size_t)r0 * D, D, k, D, 0.0f, p, (int)ldp);
#pragma omp parallel for schedule(static) if (inner_par)
    for (int i = 0; i < rb; i++) {
        float *row = p + (size_t)i * ldp;
        int n = causal ? r0 + i + 1 : kc;
        smx_softmax_row(row, n);
        for (int j = n; j < kc; j++) row[j] = 0.0f;
    }
    /* O[r0:r1] = P V[0:kc]  (rb, M) */
    ab_sgemm(false, false, rb, M, kc, 1.0f, p, (int)ldp, v, M, 0.0f, out + (size_t)r0 * M, M);
}

/* Backward of query rows [r0, r1) against keys [0, kc) (same masks as the forward):
 * p holds the block's saved probabilities (row stride ldp), ds is rb x kc scratch.
 * Writes dq rows [r0, r1), adds into dk and dv rows [0, kc). */
static void smx_block_backward(const float *q, const float *k, const float *v, const float *dout, const float *p,
                               size_t ldp, float *ds, float *dq, float *dk, float *dv, int r0, int r1, int kc, int D,
                               int M, bool causal, float scale, bool inner_par) {
    int rb = r1 - r0;
    const float *dob = dout + (size_t)r0 * M;
    /* dV[0:kc] += P^T dO[r0:r1]  (kc, M) */
    ab_sgemm(true, false, kc, M, rb, 1.0f, p, (int)ldp, dob, M, 1.0f, dv, M);
    /* dP = dO[r0:r1] V[0:kc]^T  (rb, kc) */
    ab_sgemm(false, true, rb, kc, M, 1.0f, dob, M, v, M, 0.0f, ds, kc);
    /* dS = P .* (dP - rowsum(dP .* P)), zero where masked */
#pragma omp parallel for schedule(static) if (inner_par)
    for (int i = 0; i < rb; i++) {
        const float *pr = p + (size_t)i * ldp;
        float *dr = ds + (size_t)i * kc;
        int n = causal ? r0 + i + 1 : kc;
        float dot = (float)smx_dot(dr, pr, n);
        for (int j = 0; j < n; j++) dr[j] = pr[j] * (dr[j] - dot);
        for (int j = n; j < kc; j++) dr[j] = 0.0f;
    }
    /* dQ[r0:r1] = scale dS K[0:kc]  (rb, D) */
    ab_sgemm(false, false, rb, D, kc, scale, ds, kc, k, D, 0.0f, dq + (size_t)r0 * D, D);
    /* dK[0:kc] += scale dS^T Q[r0:r1]  (kc, D) */
    ab_sgemm(true, false, kc, D, rb, scale, ds, kc, q + (size_t)r0 * D, D, 1.0f, dk, D);
}

/* ---- parallel mode ---- */

int smx_check_shape(const attn *a, const attn_shape *s) {
    (void)a;
    size_t n;
    if ((size_t)s->batch * (size_t)s->heads > (size_t)INT32_MAX)
        return ab_fail(AB_EINVAL, "softmax: B*H = %d*%d slices is more than this implementation indexes", s->batch,
                       s->heads);
    /* The saved probabilities (B*H*N*N floats) must be addressable. */
    if (ab_mul_size((size_t)s->batch * (size_t)s->heads, (size_t)s->len, &n) || ab_mul_size(n, (size_t)s->len, &n) ||
        ab_mul_size(n, sizeof(float), &n))
        return ab_fail(AB_EINVAL, "softmax: B=%d H=%d N=%d: the saved N x N probabilities overflow size_t", s->batch,
                       s->heads, s->len);
    return 0;
}

size_t smx_saved_bytes(const attn *a, const attn_shape *s) {
    (void)a;
    return (size_t)s->batch * (size_t)s->heads * (size_t)s->len * (size_t)s->len * sizeof(float);
}

/* How backward splits its work. With at least as many slices as threads, each thread
 * takes whole slices. Otherwise (e.g. B*H = 8 on 16 threads, or one long sequence)
 * the slices run one after another and the row blocks of a slice are split over the
 * threads, each adding into its own dK and dV (reduced at the end of the slice): the
 * per-block GEMMs are too small to give all threads to BLAS. */
typedef struct {
    int nt;        /* threads of the parallel loop (slots) */
    bool by_block; /* parallel over the row blocks of one slice */
    size_t ds_bytes, part_bytes, slot_bytes; /* per slot: dP / dS block; dK, dV partials */
} bwd_plan;

static bwd_plan plan_backward(const attn_shape *s) {
    bwd_plan p;
    const int N = s->len, nblk = smx_n_blocks(N);
    const int rb = N < SMX_ROW_BLOCK ? N : SMX_ROW_BLOCK;
    p.by_block = attn_outer_threads(s->batch * s->heads) == 1 && attn_outer_threads(nblk) > 1;
    p.nt = p.by_block ? attn_outer_threads(nblk) : attn_outer_threads(s->batch * s->heads);
    p.ds_bytes = attn_align64((size_t)rb * (size_t)N * sizeof(float));
    p.part_bytes = p.by_block ? attn_align64((size_t)N * (size_t)s->qk_dim * sizeof(float)) +
                                    attn_align64((size_t)N * (size_t)s->v_dim * sizeof(float))
                              : 0;
    p.slot_bytes = p.ds_bytes + p.part_bytes;
    return p;
}

/* Threads of the forward's loop over (slice, row block) items. */
static int forward_threads(const attn_shape *s) {
    const long items = (long)s->batch * s->heads * smx_n_blocks(s->len);
    return attn_outer_threads(items > 1 << 30 ? 1 << 30 : (int)items);
}

/* Backward's slots; a forward that saves nothing (saved = NULL) puts each block's
 * scores in a slot too (a slot holds at least SMX_ROW_BLOCK x N floats), so there are
 * as many slots as the larger of the two loops has threads. A saving forward writes
 * its scores straight into the saved probabilities. */
size_t smx_workspace_bytes(const attn *a, const attn_shape *s) {
    (void)a;
    bwd_plan p = plan_backward(s);
    int fwd = forward_threads(s), n = p.nt > fwd ? p.nt : fwd;
    return (size_t)n * p.slot_bytes;
}

int smx_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                void *saved) {
    const int H = s->heads, N = s->len, D = s->qk_dim, M = s->v_dim;
    const int BH = s->batch * H, nblk = smx_n_blocks(N);
    const bool causal = s->causal;
    const float scale = (float)attn_scale(a, D);
    float *P = saved; /* NULL: nothing kept, each block's scores in the thread's slot */
    const long items = (long)BH * nblk;
    const int nt = forward_threads(s);
    const bool inner = nt == 1 && ab_threads() > 1;
    const size_t slot_bytes = plan_backward(s).slot_bytes;
    /* Items in descending block order per slice: causal blocks grow with their row
     * index, so the big ones are handed out first (dynamic schedule). */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (long it = 0; it < items; it++) {
        int bh = (int)(it / nblk), blk = nblk - 1 - (int)(it % nblk);
        int r0 = blk * SMX_ROW_BLOCK, r1 = r0 + SMX_ROW_BLOCK < N ? r0 + SMX_ROW_BLOCK : N;
        int L = attn_valid_len(s, bh / H);
        int re = r1 < L ? r1 : L; /* rows [r0, re) are real queries */
        float *o = out + attn_slice(s, bh, M);
        float *p = P ? P + attn_slice(s, bh, N) + (size_t)r0 * N
                     : (float *)((char *)a->ws + (size_t)omp_get_thread_num() * slot_bytes);
        if (re > r0)
            smx_block_forward(q + attn_slice(s, bh, D), k + attn_slice(s, bh, D), v + attn_slice(s, bh, M), o, p,
                              (size_t)N, r0, re, causal ? re : L, D, M, causal, scale, inner);
        int z0 = re > r0 ? re : r0;
        if (r1 > z0) memset(o + (size_t)z0 * M, 0, sizeof(float) * (size_t)(r1 - z0) * M);
    }
    return 0;
}

int smx_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, const float *dout,
                 const void *saved, float *dq, float *dk, float *dv) {
    const int H = s->heads, N = s->len, D = s->qk_dim, M = s->v_dim;
    const int BH = s->batch * H, nblk = smx_n_blocks(N);
    const bool causal = s->causal;
    const float scale = (float)attn_scale(a, D);
    const float *P = saved;
    const bwd_plan pl = plan_backward(s);
    const int nt = pl.nt;
    char *ws = a->ws;

    if (!pl.by_block) {
        const bool inner = nt == 1 && ab_threads() > 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
        for (int bh = 0; bh < BH; bh++) {
            float *ds = (float *)(ws + (size_t)omp_get_thread_num() * pl.slot_bytes);
            int L = attn_valid_len(s, bh / H);
            float *dqs = dq + attn_slice(s, bh, D), *dks = dk + attn_slice(s, bh, D), *dvs = dv + attn_slice(s, bh, M);
            memset(dks, 0, sizeof(float) * (size_t)N * D);
            memset(dvs, 0, sizeof(float) * (size_t)N * M);
            memset(dqs + (size_t)L * D, 0, sizeof(float) * (size_t)(N - L) * D);
            const float *qs = q + attn_slice(s, bh, D), *ks = k + attn_slice(s, bh, D), *vs = v + attn_slice(s, bh, M);
            const float *dos = dout + attn_slice(s, bh, M), *Ps = P + attn_slice(s, bh, N);
            for (int blk = 0; blk < nblk; blk++) {
                int r0 = blk * SMX_ROW_BLOCK, r1 = r0 + SMX_ROW_BLOCK < N ? r0 + SMX_ROW_BLOCK : N;
                int re = r1 < L ? r1 : L;
                if (re <= r0) break;
                smx_block_backward(qs, ks, vs, dos, Ps + (size_t)r0 * N, (size_t)N, ds, dqs, dks, dvs, r0, re,
                                   causal ? re : L, D, M, causal, scale, inner);
            }
        }
        return 0;
    }

    /* by_block: slices in turn, blocks of a slice over the threads. The schedule is
     * static (block -> thread fixed), so the partial sums, and the result, do not
     * depend on timing. */
    for (int bh = 0; bh < BH; bh++) {
        int L = attn_valid_len(s, bh / H);
        float *dqs = dq + attn_slice(s, bh, D), *dks = dk + attn_slice(s, bh, D), *dvs = dv + attn_slice(s, bh, M);
        const float *qs = q + attn_slice(s, bh, D), *ks = k + attn_slice(s, bh, D), *vs = v + attn_slice(s, bh, M);
        const float *dos = dout + attn_slice(s, bh, M), *Ps = P + attn_slice(s, bh, N);
        const int nb = (L + SMX_ROW_BLOCK - 1) / SMX_ROW_BLOCK; /* blocks holding real queries */
#pragma omp parallel num_threads(nt)
        {
            const int tid = omp_get_thread_num();
            char *slot = ws + (size_t)tid * pl.slot_bytes;
            float *ds = (float *)slot;
            float *dkt = (float *)(slot + pl.ds_bytes);
            float *dvt = (float *)(slot + pl.ds_bytes + attn_align64((size_t)N * D * sizeof(float)));
            memset(dkt, 0, sizeof(float) * (size_t)L * D);
            memset(dvt, 0, sizeof(float) * (size_t)L * M);
            /* descending blocks, round robin: causal block cost grows with its index */
#pragma omp for schedule(static, 1)
            for (int i = 0; i < nb; i++) {
                int blk = nb - 1 - i;
                int r0 = blk * SMX_ROW_BLOCK, r1 = r0 + SMX_ROW_BLOCK < N ? r0 + SMX_ROW_BLOCK : N;
                int re = r1 < L ? r1 : L;
                smx_block_backward(qs, ks, vs, dos, Ps + (size_t)r0 * N, (size_t)N, ds, dqs, dkt, dvt, r0, re,
                                   causal ? re : L, D, M, causal, scale, false);
            }
            /* (implicit barrier) dK, dV = sum of the partials, in slot order; padding 0 */
#pragma omp for schedule(static)
            for (int r = 0; r < N; r++) {
                float *dkr = dks + (size_t)r * D, *dvr = dvs + (size_t)r * M;
                for (int c = 0; c < D; c++) dkr[c] = 0.0f;
                for (int c = 0; c < M; c++) dvr[c] = 0.0f;
                if (r >= L) {
                    for (int c = 0; c < D; c++) dqs[(size_t)r * D + c] = 0.0f;
                    continue;
                }
                for (int t = 0; t < nt; t++) {
                    const char *st = ws + (size_t)t * pl.slot_bytes;
                    const float *pk = (const float *)(st + pl.ds_bytes) + (size_t)r * D;
                    const float *pv =
                        (const float *)(st + pl.ds_bytes + attn_align64((size_t)N * D * sizeof(float))) +
                        (size_t)r * M;
                    for (int c = 0; c < D; c++) dkr[c] += pk[c];
                    for (int c = 0; c < M; c++) dvr[c] += pv[c];
                }
            }
        }
    }
    return 0;
}

static const attn_backend cpu_softmax = {
    .check_shape = smx_check_shape,
    .saved_bytes = smx_saved_bytes,
    .workspace_bytes = smx_workspace_bytes,
    .forward = smx_forward,
    .forward_unsaved = true,
    .backward = smx_backward,
};

#ifdef ATTNBENCH_HAVE_CUDA
/* Its own saved state (O and the rows' log-sum-exps, O(N M) per slice: softmax_cuda.cu)
 * and shape checks. */
static const attn_backend cuda_softmax = {
    .check_shape = smx_cuda_check_shape,
    .saved_bytes = smx_cuda_saved_bytes,
    .workspace_bytes = smx_cuda_workspace_bytes,
    .forward = smx_cuda_forward,
    .forward_unsaved = true,
    .backward = smx_cuda_backward,
};
#define CUDA_SOFTMAX (&cuda_softmax)
#else
#define CUDA_SOFTMAX NULL
#endif

const attn_variant attn_variant_softmax = {
    .name = "softmax",
    .summary = "softmax(scale q.k) attention; quadratic memory on the CPU (backward reads the saved N x N "
               "probabilities), O(N) on CUDA (fused kernels: backward recomputes them from the rows' log-sum-exps)",
    .options = smx_options,
    .n_options = SMX_N_OPTIONS,
    .defaults = smx_defaults,
    .flops = smx_flops,
    .cpu = &cpu_softmax,
    .cuda = CUDA_SOFTMAX,
};
