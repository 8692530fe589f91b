/* local: sliding-window softmax attention (the local pattern of Longformer and of the
 * Sparse Transformer) on the CPU.
 *
 *   out_i = sum_j P_ij v_j,  P_i. = softmax over the allowed j of scale q_i . k_j
 *   allowed: i - w < j <= i (causal) or |i - j| < w (non-causal), w = `window`, and
 *   j < L (L = lengths[b], or N); query rows i >= L output zero and get zero gradient.
 * With w >= N this is `softmax`. Every row allows at least itself, so no row is empty.
 *
 * Blocks of LOC_ROWS query rows: a block [r0, r1) multiplies its rows with the keys
 * [max(0, r0 - w + 1), min(L, r1 + w - 1)) (causal: up to r1) in one GEMM, each row's
 * softmax runs over its own contiguous run of those columns (the rest of the row is set
 * to 0), and the outputs are one more GEMM. Time O(N (w + LOC_ROWS) (D + M)): linear in
 * N for a fixed window.
 *
 * What forward saves: nothing. Backward recomputes each block's probabilities (the
 * same GEMM and softmax as forward), then
 *   dV += P^T dO,  dP = dO V^T,  dS = P .* (dP - rowsum(dP .* P)),
 *   dQ = scale dS K,  dK += scale dS^T Q   (over the block's key range).
 * So the memory beyond the tensors is per-thread workspace of two LOC_ROWS x
 * (LOC_ROWS + 2 w) blocks: O(w), not O(N w). The price is a second score GEMM and
 * softmax in backward (what FlashAttention does too).
 *
 * Threads: forward runs over (slice, block) items, all independent. In backward the
 * blocks of a slice add into overlapping key ranges; blocks whose index differs by a
 * multiple of `period` (1 + ceil(span/LOC_ROWS)) have disjoint ranges, so backward runs
 * class by class (block index mod period), each class's (slice, block) items in
 * parallel: no partial copies, and the result does not depend on the thread count.
 *
 * Recurrent mode: the state is a ring of the last W = min(window, capacity) keys and
 * values per slice (B*H*W*(D + M) floats, constant in the sequence length); step t
 * writes slot t mod W and attends over positions max(0, t - w + 1)..t in position
 * order. Prefill runs the causal forward on the prompt and fills the ring with its
 * last keys and values. */
#include "softmax_cpu.h"

#include "band_cpu.h"
#include "cpu_util.h"
#include "variant.h"

#ifdef ATTNBENCH_HAVE_CUDA
#include "local_cuda.h"
#endif

#include "../harness/error.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#define LOC_ROWS BAND_ROWS /* query rows per block */

static const attn_option_spec local_options[] = {
    {"window", ATTN_OPT_INT, offsetof(attn_params, window), "256",
     "window w: query i attends to keys i-w < j <= i (causal) or |i-j| < w (non-causal), 1..1073741824", NULL, 1,
     1073741824, false, NULL},
    {"scale", ATTN_OPT_DOUBLE, offsetof(attn_params, scale), "1/sqrt(D)",
     "multiplier of q.k inside the softmax: any finite number, or auto for 1/sqrt(D)", NULL, -DBL_MAX, DBL_MAX, true,
     NULL},
};

static void local_defaults(attn_params *p) {
    p->window = 256;
    p->scale = NAN;
}

/* ---- geometry (band_cpu.h) ---- */

static int key_span(const attn *a, const attn_shape *s) { return band_key_span(a->p.window, s->causal, s->len, LOC_ROWS); }

static void block_keys(const attn *a, bool causal, int r0, int r1, int L, int *k0, int *k1) {
    band_block_keys(a->p.window, causal, r0, r1, L, k0, k1);
}

static int period_of(const attn *a, const attn_shape *s) { return band_period(a->p.window, s->causal, s->len, LOC_ROWS); }

static int n_blocks(int n) { return band_n_blocks(n, LOC_ROWS); }

/* ---- workspace ---- */

static int slots_of(const attn_shape *s) {
    long items = (long)s->batch * s->heads * n_blocks(s->len);
    return attn_outer_threads(items > 1 << 30 ? 1 << 30 : (int)items);
}

static size_t block_bytes(const attn *a, const attn_shape *s) {
    int rb = s->len < LOC_ROWS ? s->len : LOC_ROWS;
    return attn_align64((size_t)rb * (size_t)key_span(a, s) * sizeof(float));
}

static int local_check_shape(const attn *a, const attn_shape *s) {
    (void)a;
    if (s->qk_dim > INT_MAX / LOC_ROWS || s->v_dim > INT_MAX / LOC_ROWS)
        return ab_fail(AB_EINVAL, "variant 'local': D=%d M=%d too large for this implementation", s->qk_dim,
                       s->v_dim);
    /* a block's key span (up to 2 N + 64 columns on CUDA) indexes with int */
    if ((long long)s->len * 2 + 2 * LOC_ROWS > INT_MAX)
        return ab_fail(AB_EINVAL, "variant 'local': N=%d is more than this implementation indexes (at most %d)",
                       s->len, (INT_MAX - 2 * LOC_ROWS) / 2);
    return 0;
}

static size_t local_saved_bytes(const attn *a, const attn_shape *s) {
    (void)a, (void)s;
    return 0;
}

/* Per slot: the block's probabilities and its dP / dS. */
static size_t local_workspace_bytes(const attn *a, const attn_shape *s) {
    return 2 * block_bytes(a, s) * (size_t)slots_of(s);
}

/* ---- blocks ---- */

/* Probabilities of rows [r0, r1) over keys [k0, k1) into p (row stride ld = k1 - k0):
 * scores by one GEMM, each row's softmax over its allowed run, zero elsewhere. */
static void block_probs(const attn *a, bool causal, const float *q, const float *k, int r0, int r1, int k0, int k1,
                        int L, int D, float scale, float *p) {
    const int rb = r1 - r0, kc = k1 - k0;
    const long long w = a->p.window;
    ab_sgemm(false, true, rb, kc, D, scale, q + (size_t)r0 * D, D, k + (size_t)k0 * D, D, 0.0f, p, kc);
    for (int i = r0; i < r1; i++) {
        float *row = p + (size_t)(i - r0) * kc;
        int j0, j1;
        band_row_keys(w, causal, i, k0, L, &j0, &j1);
        smx_softmax_row(row + (j0 - k0), j1 - j0);
        memset(row, 0, sizeof(float) * (size_t)(j0 - k0));
        memset(row + (j1 - k0), 0, sizeof(float) * (size_t)(k1 - j1));
    }
}

/* ---- parallel mode ---- */

/* Causal or not per s; used by forward and by prefill (on the prompt). */
static void forward_impl(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out) {
    const int H = s->heads, N = s->len, D = s->qk_dim, M = s->v_dim, BH = s->batch * H, nblk = n_blocks(N);
    const float scale = (float)attn_scale(a, D);
    const long items = (long)BH * nblk;
    const int nt = slots_of(s);
    const size_t bb = block_bytes(a, s);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (long it = 0; it < items; it++) {
        const int bh = (int)(it / nblk), blk = (int)(it % nblk);
        const int L = attn_valid_len(s, bh / H), r0 = blk * LOC_ROWS;
        const int r1 = r0 + LOC_ROWS < N ? r0 + LOC_ROWS : N, re = r1 < L ? r1 : L;
        float *o = out + attn_slice(s, bh, M);
        if (re > r0) {
            float *p = (float *)((char *)a->ws + (size_t)omp_get_thread_num() * 2 * bb);
            int k0, k1;
            block_keys(a, s->causal, r0, re, L, &k0, &k1);
            block_probs(a, s->causal, q + attn_slice(s, bh, D), k + attn_slice(s, bh, D), r0, re, k0, k1, L, D, scale,
                        p);
            ab_sgemm(false, false, re - r0, M, k1 - k0, 1.0f, p, k1 - k0, v + attn_slice(s, bh, M) + (size_t)k0 * M, M,
                     0.0f, o + (size_t)r0 * M, M);
        }
        const int z0 = re > r0 ? re : r0;
        if (r1 > z0) memset(o + (size_t)z0 * M, 0, sizeof(float) * (size_t)(r1 - z0) * M);
    }
}

static int local_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                         void *saved) {
    (void)saved;
    forward_impl(a, s, q, k, v, out);
    return 0;
}

static int local_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                          const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    (void)saved;
    const int H = s->heads, N = s->len, D = s->qk_dim, M = s->v_dim, BH = s->batch * H, nblk = n_blocks(N);
    const float scale = (float)attn_scale(a, D);
    const int period = period_of(a, s), per_class = (nblk + period - 1) / period;
    const int nt = slots_of(s);
    const size_t bb = block_bytes(a, s);
    /* dK, dV accumulate: zero them (padding rows stay zero); dq rows are written once. */
    memset(dk, 0, sizeof(float) * (size_t)BH * N * D);
    memset(dv, 0, sizeof(float) * (size_t)BH * N * M);
    for (int cls = 0; cls < period; cls++) {
        const long items = (long)BH * per_class;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
        for (long it = 0; it < items; it++) {
            const int bh = (int)(it / per_class), blk = cls + period * (int)(it % per_class);
            if (blk >= nblk) continue;
            const int L = attn_valid_len(s, bh / H), r0 = blk * LOC_ROWS;
            const int r1 = r0 + LOC_ROWS < N ? r0 + LOC_ROWS : N, re = r1 < L ? r1 : L;
            const size_t oq = attn_slice(s, bh, D), ov = attn_slice(s, bh, M);
            float *dqs = dq + oq;
            const int z0 = re > r0 ? re : r0;
            if (r1 > z0) memset(dqs + (size_t)z0 * D, 0, sizeof(float) * (size_t)(r1 - z0) * D);
            if (re <= r0) continue;
            char *slot = (char *)a->ws + (size_t)omp_get_thread_num() * 2 * bb;
            float *p = (float *)slot, *ds = (float *)(slot + bb);
            int k0, k1;
            block_keys(a, s->causal, r0, re, L, &k0, &k1);
            const int rb = re - r0, kc = k1 - k0;
            const float *qs = q + oq, *ks = k + oq + (size_t)k0 * D, *vs = v + ov + (size_t)k0 * M;
            const float *dob = dout + ov + (size_t)r0 * M;
            block_probs(a, s->causal, qs, k + oq, r0, re, k0, k1, L, D, scale, p);
            /* dV[k0:k1] += P^T dO  (kc, M) */
            ab_sgemm(true, false, kc, M, rb, 1.0f, p, kc, dob, M, 1.0f, dv + ov + (size_t)k0 * M, M);
            /* dP = dO V^T  (rb, kc); dS = P .* (dP - rowsum(dP .* P)) */
            ab_sgemm(false, true, rb, kc, M, 1.0f, dob, M, vs, M, 0.0f, ds, kc);
            for (int i = 0; i < rb; i++) {
                const float *restrict pr = p + (size_t)i * kc;
                float *restrict dr = ds + (size_t)i * kc;
                const float fd = (float)attn_dot_d(pr, dr, kc);
                for (int j = 0; j < kc; j++) dr[j] = pr[j] * (dr[j] - fd);
            }
            /* dQ = scale dS K  (rb, D); dK[k0:k1] += scale dS^T Q  (kc, D) */
            ab_sgemm(false, false, rb, D, kc, scale, ds, kc, ks, D, 0.0f, dqs + (size_t)r0 * D, D);
            ab_sgemm(true, false, kc, D, rb, scale, ds, kc, qs + (size_t)r0 * D, D, 1.0f, dk + oq + (size_t)k0 * D, D);
        }
    }
    return 0;
}

/* ---- recurrent mode: a ring of the last W keys and values per slice ---- */

static int ring_len(const attn *a, int capacity) { return a->p.window < capacity ? a->p.window : capacity; }

static size_t kring_bytes(const attn *a, const attn_shape *s, int capacity) {
    return attn_align64((size_t)s->batch * (size_t)s->heads * (size_t)ring_len(a, capacity) * (size_t)s->qk_dim *
                        sizeof(float));
}

static size_t local_state_bytes(const attn *a, const attn_shape *s, int capacity) {
    return kring_bytes(a, s, capacity) +
           (size_t)s->batch * (size_t)s->heads * (size_t)ring_len(a, capacity) * (size_t)s->v_dim * sizeof(float);
}

/* The ring's slots beyond the positions held are never read: nothing to clear. */
static int local_state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    (void)a, (void)s, (void)capacity, (void)state;
    return 0;
}

/* Step: the scores of one slot's window (W floats) per thread. */
static size_t local_step_workspace_bytes(const attn *a, const attn_shape *s, int capacity) {
    return attn_align64((size_t)ring_len(a, capacity) * sizeof(float)) * (size_t)attn_outer_threads(s->batch * s->heads);
}

static int local_prefill(attn *a, const attn_shape *s, int capacity, int P, const float *q, const float *k,
                         const float *v, float *out, void *state) {
    const int D = s->qk_dim, M = s->v_dim, BH = s->batch * s->heads, W = ring_len(a, capacity);
    float *kr = state, *vr = (float *)((char *)state + kring_bytes(a, s, capacity));
    const int first = P > W ? P - W : 0; /* the ring keeps positions [first, P) */
    const int nt = attn_outer_threads(BH);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int bh = 0; bh < BH; bh++)
        for (int t = first; t < P; t++) {
            memcpy(kr + ((size_t)bh * W + (size_t)(t % W)) * D, k + ((size_t)bh * P + t) * D, sizeof(float) * (size_t)D);
            memcpy(vr + ((size_t)bh * W + (size_t)(t % W)) * M, v + ((size_t)bh * P + t) * M, sizeof(float) * (size_t)M);
        }
    if (!out) return 0;
    attn_shape ps = *s;
    ps.len = P;
    forward_impl(a, &ps, q, k, v, out);
    return 0;
}

static int local_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q,
                      const float *k, const float *v, float *out) {
    const int D = s->qk_dim, M = s->v_dim, BH = s->batch * s->heads, W = ring_len(a, capacity);
    float *kr = state, *vr = (float *)((char *)state + kring_bytes(a, s, capacity));
    const float scale = (float)attn_scale(a, D);
    const int n = t + 1 < a->p.window ? t + 1 : a->p.window; /* positions t-n+1..t, n <= W */
    const int first = (t - n + 1) % W;                        /* their first slot */
    const int n1 = first + n <= W ? n : W - first, n2 = n - n1; /* slots [first, first+n1), then [0, n2) */
    const int nt = attn_outer_threads(BH);
    const size_t slot = attn_align64((size_t)W * sizeof(float));
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int bh = 0; bh < BH; bh++) {
        float *ks = kr + (size_t)bh * W * D, *vs = vr + (size_t)bh * W * M;
        float *sc = (float *)((char *)a->ws + (size_t)omp_get_thread_num() * slot);
        memcpy(ks + (size_t)(t % W) * D, k + (size_t)bh * D, sizeof(float) * (size_t)D);
        memcpy(vs + (size_t)(t % W) * M, v + (size_t)bh * M, sizeof(float) * (size_t)M);
        const float *qt = q + (size_t)bh * D;
        float *o = out + (size_t)bh * M;
        /* scores in position order, softmax, out = p V over the two runs of slots */
        ab_sgemm(false, true, 1, n1, D, scale, qt, D, ks + (size_t)first * D, D, 0.0f, sc, n1);
        if (n2) ab_sgemm(false, true, 1, n2, D, scale, qt, D, ks, D, 0.0f, sc + n1, n2);
        smx_softmax_row(sc, n);
        ab_sgemm(false, false, 1, M, n1, 1.0f, sc, n1, vs + (size_t)first * M, M, 0.0f, o, M);
        if (n2) ab_sgemm(false, false, 1, M, n2, 1.0f, sc + n1, n2, vs, M, 1.0f, o, M);
    }
    return 0;
}

/* ---- useful floating-point operations ----
 *
 * 2 (D + M) per allowed (query, key) pair and slice (the products Q K^T and P V), over
 * the pairs the window allows at the full length N: with K = min(w, N) - 1, causal
 * N + K N - K (K + 1) / 2 (row i sees min(i + 1, w) keys), non-causal
 * N + 2 (K N - K (K + 1) / 2). Forward plus backward 3 times the forward. The columns a
 * block computes and masks (up to LOC_ROWS - 1 per row) are not counted. */
static double local_flops(const attn *a, const attn_shape *s, bool backward) {
    double n = s->len, K = (a->p.window < s->len ? a->p.window : s->len) - 1.0;
    double below = K * n - K * (K + 1) / 2; /* pairs with i - j in 1..K */
    double pairs = n + (s->causal ? below : 2 * below);
    double fwd = 2 * pairs * ((double)s->qk_dim + s->v_dim) * s->batch * s->heads;
    return backward ? 3 * fwd : fwd;
}

static const attn_backend cpu_backend = {
    .check_shape = local_check_shape,
    .saved_bytes = local_saved_bytes,
    .workspace_bytes = local_workspace_bytes,
    .forward = local_forward,
    .backward = local_backward,
    .state_bytes = local_state_bytes,
    .state_init = local_state_init,
    .prefill = local_prefill,
    .step = local_step,
    .step_workspace_bytes = local_step_workspace_bytes,
};

#ifdef ATTNBENCH_HAVE_CUDA
static int local_cuda_check(const attn *a, const attn_shape *s) {
    int rc = local_check_shape(a, s);
    return rc ? rc : local_cuda_check_shape(a, s);
}

/* Its own saved state: O and the rows' log-sum-exps (local_cuda.cu). */
static const attn_backend cuda_backend = {
    .check_shape = local_cuda_check,
    .saved_bytes = local_cuda_saved_bytes,
    .workspace_bytes = local_cuda_workspace_bytes,
    .forward = local_cuda_forward,
    .forward_unsaved = true,
    .backward = local_cuda_backward,
    .state_bytes = local_state_bytes,
    .state_init = local_cuda_state_init,
    .prefill = local_cuda_prefill,
    .step = local_cuda_step,
    .step_workspace_bytes = local_cuda_step_workspace_bytes,
};
#define CUDA_LOCAL (&cuda_backend)
#else
#define CUDA_LOCAL NULL
#endif

const attn_variant attn_variant_local = {
    .name = "local",
    .summary = "sliding-window softmax: each query attends to the `window` nearest keys (causal: the last window); "
               "O(N w (D + M)); recurrent: a ring of the last window keys and values",
    .options = local_options,
    .n_options = (int)(sizeof local_options / sizeof local_options[0]),
    .defaults = local_defaults,
    .flops = local_flops,
    .cpu = &cpu_backend,
    .cuda = CUDA_LOCAL,
};
