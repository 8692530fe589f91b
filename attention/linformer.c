/* linformer: Linformer attention (Wang et al. 2020, "Linformer: Self-Attention with
 * Linear Complexity"), non-causal only, on the CPU.
 *
 *   Kp = E[:, :L] K[:L]   (k x D),   Vp = F[:, :L] V[:L]   (k x M)
 *   A_i. = softmax over r of scale q_i . Kp_r,   out_i = A_i Vp          (i < L)
 * E and F are k x max_len learned matrices (the variant's parameters, attention.h's
 * attn_bind_params), shared by the heads of a layer (the Linformer paper's "headwise
 * sharing"); `share` = none (E and F), kv (E = F), layer (one E = F for every layer of a
 * model: attn_params_shared_by_layers). A sequence of N < max_len positions uses the
 * first N columns; with lengths, the first L: padded keys and values are never read
 * (as if their rows were zero), padded query rows output zero. Time O(N k (D + M)).
 *
 * Backward, with G = dout (rows < L):
 *   dA = G Vp^T,   dS = A .* (dA - rowsum(A .* dA)),   dQ = scale dS Kp,
 *   dKp = scale dS^T Q,   dVp = A^T G,   dK = E^T dKp,   dV = F^T dVp,
 *   dE[:, :L] += dKp K^T,   dF[:, :L] += dVp V^T   (summed over batch rows and heads).
 *
 * What forward saves, per slice: A (N x k), Kp and Vp; backward recomputes nothing.
 * OpenMP over the B*H slices (attn_outer_threads). Per slice the projections are one
 * ab_sgemm each; the queries go in blocks of LFM_ROWS rows, so that a block's scores,
 * their softmax and the product with Vp (backward: dA, dS and the three products that
 * read it) stay in the cache (k = 256: 256 KiB a block) instead of a pass over N x k
 * per step. Backward keeps each slice's dKp and dVp in the workspace, and the
 * parameter gradient is then a pass over column blocks of dE and dF, one thread a
 * block, the slices added in order (no two threads write one column). */
#include "linformer.h"

#include "cpu_util.h"
#include "softmax_cpu.h"
#include "variant.h"

#ifdef ATTNBENCH_HAVE_CUDA
#include "linformer_cuda.h"
#endif

#include "../harness/error.h"
#include "../harness/memory.h"
#include "../harness/rng.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

static const char *const share_choices[] = {"none", "kv", "layer", NULL};

static const attn_option_spec lfm_options[] = {
    {"k", ATTN_OPT_INT, offsetof(attn_params, proj_k), "256",
     "rows k of the projections E, F (keys and values are projected from N to k positions), 1..1048576", NULL, 1,
     1048576, false, NULL},
    {"share", ATTN_OPT_CHOICE, offsetof(attn_params, share), "none",
     "sharing of the projections: none (E and F per layer, shared by its heads), kv (E = F per layer), layer (one "
     "E = F for every layer of the model)",
     share_choices, 0, 0, false, NULL},
    {"scale", ATTN_OPT_DOUBLE, offsetof(attn_params, scale), "1/sqrt(D)",
     "multiplier of q.k inside the softmax: any finite number, or auto for 1/sqrt(D)", NULL, -DBL_MAX, DBL_MAX, true,
     NULL},
};

static void lfm_defaults(attn_params *p) {
    p->proj_k = 256;
    p->share = ATTN_LFM_SHARE_NONE;
    p->scale = NAN;
}

/* ---- parameters ---- */

static int lfm_param_count(const attn *a, int max_len, size_t *count) {
    size_t n;
    const size_t mats = a->p.share == ATTN_LFM_SHARE_NONE ? 2 : 1;
    if (ab_mul_size((size_t)a->p.proj_k, (size_t)max_len, &n) || ab_mul_size(n, mats * sizeof(float), &n) ||
        n > (size_t)INT64_MAX)
        return ab_fail(AB_EINVAL, "variant 'linformer': k=%d x max_len=%d projections overflow", a->p.proj_k, max_len);
    *count = n / sizeof(float);
    return 0;
}

/* nn.Linear's default for a layer of fan-in max_len: uniform(-1/sqrt(max_len), +1/sqrt(max_len)). */
static void lfm_param_init(const attn *a, int max_len, uint64_t seed, uint64_t stream, float *params) {
    size_t n = 0;
    lfm_param_count(a, max_len, &n); /* checked by the caller */
    const double bound = 1.0 / sqrt((double)max_len);
    for (size_t j = 0; j < n; j++) params[j] = (float)((2.0 * ab_rng_uniform(seed, stream, j) - 1.0) * bound);
}

static bool lfm_shared_by_layers(const attn *a) { return a->p.share == ATTN_LFM_SHARE_LAYER; }

/* ---- sizes ---- */

/* Column block of the parameter-gradient pass, and query rows per block. */
#define LFM_COLS 128
#define LFM_ROWS 256

static int lfm_check_shape(const attn *a, const attn_shape *s) {
    size_t per, all, ws;
    const size_t P = (size_t)a->p.proj_k, BH = (size_t)s->batch * (size_t)s->heads;
    /* In bytes, must fit size_t: the saved buffer, B*H slices of k (N + D + M) floats
     * (the CUDA workspace's B H N k floats are less); the CPU workspace, k (D + M) per
     * slice and a block of k x LFM_ROWS per thread. Every BLAS size is an int already
     * (N, D, M, k, max_len, a block's rows). */
    if (ab_mul_size(P, (size_t)s->len + (size_t)s->qk_dim + (size_t)s->v_dim, &per) || ab_mul_size(per, BH, &all) ||
        ab_mul_size(all, sizeof(float), &all) ||
        ab_mul_size(BH, P * ((size_t)s->qk_dim + s->v_dim), &ws) ||
        ab_mul_size(P * LFM_ROWS, (size_t)ab_threads(), &per) || ws + per < ws || ab_mul_size(ws + per, sizeof(float), &ws))
        return ab_fail(AB_EINVAL, "variant 'linformer': B=%d H=%d N=%d k=%d D=%d M=%d gives blocks too large",
                       s->batch, s->heads, s->len, a->p.proj_k, s->qk_dim, s->v_dim);
    return 0;
}

static size_t lfm_saved_bytes(const attn *a, const attn_shape *s) {
    return (size_t)s->batch * s->heads * lfm_saved_slice_floats(a, s) * sizeof(float);
}

static int rows_of(const attn_shape *s) { return s->len < LFM_ROWS ? s->len : LFM_ROWS; }

/* Backward's workspace: dKp, dVp of every slice (k (D + M) each), then one block of
 * LFM_ROWS x k (dA, then dS) per thread slot. Forward needs none. */
static size_t lfm_workspace_bytes(const attn *a, const attn_shape *s) {
    const size_t P = (size_t)a->p.proj_k, BH = (size_t)s->batch * s->heads;
    return attn_align64(BH * P * ((size_t)s->qk_dim + s->v_dim) * sizeof(float)) +
           (size_t)attn_outer_threads((int)BH) * attn_align64(P * (size_t)rows_of(s) * sizeof(float));
}

typedef struct {
    float *A, *kp, *vp;
} lfm_saved;

static lfm_saved saved_of(const attn *a, const attn_shape *s, const void *saved, int bh) {
    const size_t P = (size_t)a->p.proj_k;
    float *base = (float *)saved + (size_t)bh * lfm_saved_slice_floats(a, s);
    lfm_saved w = {base, base + P * (size_t)s->len, base + P * ((size_t)s->len + s->qk_dim)};
    return w;
}

static void zero_rows(float *x, int from, int to, int width) {
    if (to > from) memset(x + (size_t)from * width, 0, sizeof(float) * (size_t)(to - from) * (size_t)width);
}

/* ---- entry points ---- */

static int lfm_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                       void *saved) {
    const int BH = s->batch * s->heads, N = s->len, D = s->qk_dim, M = s->v_dim, P = a->p.proj_k, ld = a->param_len;
    const float scale = (float)attn_scale(a, D);
    const float *E = lfm_E(a), *F = lfm_F(a);
    const int nt = attn_outer_threads(BH);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
    for (int bh = 0; bh < BH; bh++) {
        const int L = attn_valid_len(s, bh / s->heads);
        lfm_saved w = saved_of(a, s, saved, bh);
        const float *qs = q + attn_slice(s, bh, D), *ks = k + attn_slice(s, bh, D), *vs = v + attn_slice(s, bh, M);
        float *os = out + attn_slice(s, bh, M);
        if (L == 0) {
            /* saved: defined even when unused */
            memset(w.kp, 0, sizeof(float) * (size_t)P * D);
            memset(w.vp, 0, sizeof(float) * (size_t)P * M);
            zero_rows(os, 0, N, M);
            continue;
        }
        ab_sgemm(false, false, P, D, L, 1.0f, E, ld, ks, D, 0.0f, w.kp, D); /* Kp = E[:, :L] K[:L] */
        ab_sgemm(false, false, P, M, L, 1.0f, F, ld, vs, M, 0.0f, w.vp, M); /* Vp = F[:, :L] V[:L] */
        for (int i0 = 0; i0 < L; i0 += LFM_ROWS) {
            const int t = L - i0 < LFM_ROWS ? L - i0 : LFM_ROWS;
            float *A = w.A + (size_t)i0 * P;
            ab_sgemm(false, true, t, P, D, scale, qs + (size_t)i0 * D, D, w.kp, D, 0.0f, A, P);
            for (int i = 0; i < t; i++) smx_softmax_row(A + (size_t)i * P, P);
            ab_sgemm(false, false, t, M, P, 1.0f, A, P, w.vp, M, 0.0f, os + (size_t)i0 * M, M);
        }
        zero_rows(os, L, N, M);
    }
    return 0;
}

/* dE[:, c0:c1) += sum over slices of dX_s X_s[c0:c1)^T, X = K (xdim D) or V (xdim M),
 * dX_s at dx_all + s * stride (dKp or dVp), the columns limited to each slice's valid
 * length. */
static void param_grad_block(const attn *a, const attn_shape *s, const float *dx_all, int xdim, const float *x,
                             float *dE, int c0, int c1) {
    const int BH = s->batch * s->heads, P = a->p.proj_k, ld = a->param_len;
    const size_t stride = (size_t)P * ((size_t)s->qk_dim + s->v_dim);
    for (int bh = 0; bh < BH; bh++) {
        const int L = attn_valid_len(s, bh / s->heads), hi = c1 < L ? c1 : L;
        if (hi <= c0) continue;
        const float *dxs = dx_all + (size_t)bh * stride;
        const float *xs = x + attn_slice(s, bh, xdim) + (size_t)c0 * xdim;
        ab_sgemm(false, true, P, hi - c0, xdim, 1.0f, dxs, xdim, xs, xdim, 1.0f, dE + c0, ld);
    }
}

static int lfm_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                        const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    const int BH = s->batch * s->heads, N = s->len, D = s->qk_dim, M = s->v_dim, P = a->p.proj_k, ld = a->param_len;
    const float scale = (float)attn_scale(a, D);
    const float *E = lfm_E(a), *F = lfm_F(a);
    const size_t stride = (size_t)P * ((size_t)D + M); /* dKp then dVp of a slice */
    float *dpar = (float *)a->ws;
    char *slots = (char *)a->ws + attn_align64((size_t)BH * stride * sizeof(float));
    const size_t slot_bytes = attn_align64((size_t)P * rows_of(s) * sizeof(float));
    const int nt = attn_outer_threads(BH);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
    for (int bh = 0; bh < BH; bh++) {
        const int L = attn_valid_len(s, bh / s->heads);
        lfm_saved w = saved_of(a, s, saved, bh);
        float *dkp = dpar + (size_t)bh * stride, *dvp = dkp + (size_t)P * D;
        float *ds = (float *)(slots + (size_t)omp_get_thread_num() * slot_bytes);
        const size_t oq = attn_slice(s, bh, D), ov = attn_slice(s, bh, M);
        const float *qs = q + oq, *gs = dout + ov;
        float *dqs = dq + oq, *dks = dk + oq, *dvs = dv + ov;
        if (L == 0) {
            memset(dkp, 0, sizeof(float) * stride);
        } else {
            for (int i0 = 0; i0 < L; i0 += LFM_ROWS) {
                const int t = L - i0 < LFM_ROWS ? L - i0 : LFM_ROWS;
                const float *A = w.A + (size_t)i0 * P, *gb = gs + (size_t)i0 * M, *qb = qs + (size_t)i0 * D;
                const float beta = i0 == 0 ? 0.0f : 1.0f; /* dKp, dVp: the first block sets them */
                ab_sgemm(false, true, t, P, M, 1.0f, gb, M, w.vp, M, 0.0f, ds, P); /* dA = G Vp^T */
                for (int i = 0; i < t; i++) {
                    const float *restrict ar = A + (size_t)i * P;
                    float *restrict dr = ds + (size_t)i * P;
                    const float rs = (float)attn_dot_d(ar, dr, P);
                    for (int r = 0; r < P; r++) dr[r] = ar[r] * (dr[r] - rs);
                }
                ab_sgemm(false, false, t, D, P, scale, ds, P, w.kp, D, 0.0f, dqs + (size_t)i0 * D, D); /* dQ */
                ab_sgemm(true, false, P, D, t, scale, ds, P, qb, D, beta, dkp, D); /* dKp += scale dS^T Q */
                ab_sgemm(true, false, P, M, t, 1.0f, A, P, gb, M, beta, dvp, M);   /* dVp += A^T G */
            }
            ab_sgemm(true, false, L, D, P, 1.0f, E, ld, dkp, D, 0.0f, dks, D);     /* dK = E^T dKp */
            ab_sgemm(true, false, L, M, P, 1.0f, F, ld, dvp, M, 0.0f, dvs, M);     /* dV = F^T dVp */
        }
        zero_rows(dqs, L, N, D);
        zero_rows(dks, L, N, D);
        zero_rows(dvs, L, N, M);
    }
    float *dE = lfm_dE(a), *dF = lfm_dF(a);
    if (!dE) return 0;
    /* dE, dF: column blocks over the threads; each adds the slices in order */
    const int nb = (N + LFM_COLS - 1) / LFM_COLS, ntc = nb < ab_threads() ? nb : ab_threads();
#pragma omp parallel for num_threads(ntc) if (ntc > 1) schedule(static, 1)
    for (int c = 0; c < nb; c++) {
        const int c0 = c * LFM_COLS, c1 = c0 + LFM_COLS < N ? c0 + LFM_COLS : N;
        param_grad_block(a, s, dpar, D, k, dE, c0, c1);
        param_grad_block(a, s, dpar + (size_t)P * D, M, v, dF, c0, c1);
    }
    return 0;
}

/* ---- useful floating-point operations ----
 *
 * Forward: the four products E K, F V, Q Kp^T and A Vp, 2 N k (D + M) each pair: 4 N k
 * (D + M) per slice; backward's eight products are twice that, so forward plus backward
 * is 3 times forward (the sweep's rule). The softmax is not counted. */
static double lfm_flops(const attn *a, const attn_shape *s, bool backward) {
    double fwd = 4.0 * s->len * (double)a->p.proj_k * ((double)s->qk_dim + s->v_dim) * s->batch * s->heads;
    return backward ? 3 * fwd : fwd;
}

static const attn_backend cpu_backend = {
    .check_shape = lfm_check_shape,
    .saved_bytes = lfm_saved_bytes,
    .workspace_bytes = lfm_workspace_bytes,
    .forward = lfm_forward,
    .backward = lfm_backward,
};

#ifdef ATTNBENCH_HAVE_CUDA
static const attn_backend cuda_backend = {
    .check_shape = lfm_check_shape,
    .saved_bytes = lfm_saved_bytes,
    .workspace_bytes = lfm_cuda_workspace_bytes,
    .forward = lfm_cuda_forward,
    .backward = lfm_cuda_backward,
};
#define CUDA_LINFORMER (&cuda_backend)
#else
#define CUDA_LINFORMER NULL
#endif

const attn_variant attn_variant_linformer = {
    .name = "linformer",
    .summary = "Linformer (Wang et al.): keys and values projected along the sequence to k rows by learned E, F "
               "(k x max_len), then softmax attention; non-causal only; O(N k (D + M)); a sequence shorter than "
               "max_len uses the first columns of E and F",
    .options = lfm_options,
    .n_options = (int)(sizeof lfm_options / sizeof lfm_options[0]),
    .defaults = lfm_defaults,
    .flops = lfm_flops,
    .noncausal_only = true,
    .param_count = lfm_param_count,
    .param_init = lfm_param_init,
    .params_shared_by_layers = lfm_shared_by_layers,
    .cpu = &cpu_backend,
    .cuda = CUDA_LINFORMER,
};
