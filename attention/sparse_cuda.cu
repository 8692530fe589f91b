/* sparse (strided sparse attention) on CUDA, with the definitions, options and results
 * of the CPU version (sparse.c): row i attends to keys j < L with |i - j| < w or
 * |i - j| mod s == 0 (causal: j <= i); rows >= L output zero.
 *
 * One block per query row (grid-stride over the rows): the row enumerates the keys it
 * sees, never an N x N matrix: its window [i - w + 1, i + w) clipped (causal: up to
 * i), then the strided ones i - m s (and i + m s non-causal) for m s >= w, so
 * min(2 w - 1, N) + 2 N / s at most. Their scores go to the block's slot, in shared
 * memory where two slots fit 48 KiB (else in workspace);
 * a block maximum and sum give the softmax and the row's log-sum-exp, and each thread
 * sums one output column. Time O(N (w + N/s) (D + M)).
 *
 * Saved: O and the rows' log-sum-exps (the CPU's layout, B*H*N*(M + 1) floats); forward
 * takes saved = NULL. Backward: one block per query row recomputes its probabilities
 * P = exp(S - lse), dS = P .* (dO . v_j - Delta_i) (Delta_i = dO_i . O_i, kept in
 * workspace) and writes dq_i = scale sum_j dS_ij k_j; then one block per key row j
 * enumerates the queries that see j (the pattern mirrored: causal i >= j) and writes
 * dv_j = sum_i P_ij dO_i and dk_j = scale sum_i dS_ij q_i. No atomics: deterministic.
 *
 * Recurrent state: the CPU's key/value cache of every position; a step writes position
 * t and runs the forward's row on the cache (one block per slice); prefill copies the
 * prompt into the cache and runs the causal forward (auto window and stride at
 * N = capacity, as on the CPU). */
#include "cuda_util.cuh"

#include "sparse_cuda.h"
#include "sparse_geo.h"

#define THREADS 128
#define MAX_BLOCKS 4096LL /* blocks of a row kernel: each has its slot of workspace */

/* The neighbours of position x among [0, L): its window [lo, hi), then nl strided ones
 * below (x - (c + u) s) and nr above (x + (c + u) s). lower / upper: which sides count
 * (a query's keys: lower, and upper non-causal; a key's queries: upper, and lower
 * non-causal). */
struct sp_nbrs {
    long long x, c;
    int lo, hi, nl, nr, s;
};

__device__ __forceinline__ sp_nbrs sp_neighbours(int x, int L, bool lower, bool upper, long long w, int s,
                                                 long long c) {
    sp_nbrs n;
    n.x = x, n.c = c, n.s = s;
    const long long lo = lower ? (long long)x - w + 1 : x, hi = upper ? (long long)x + w : (long long)x + 1;
    n.lo = lo < 0 ? 0 : (int)lo;
    n.hi = hi > L ? L : (int)hi;
    const long long below = (long long)x - c * s, above = (long long)x + c * s;
    n.nl = lower && below >= 0 ? (int)(below / s) + 1 : 0;
    n.nr = upper && above < L ? (int)((L - 1 - above) / s) + 1 : 0;
    return n;
}

__device__ __forceinline__ int sp_count(const sp_nbrs &n) { return (n.hi - n.lo) + n.nl + n.nr; }

__device__ __forceinline__ int sp_at(const sp_nbrs &n, int u) {
    const int nb = n.hi - n.lo;
    if (u < nb) return n.lo + u;
    u -= nb;
    if (u < n.nl) return (int)(n.x - (n.c + u) * n.s);
    return (int)(n.x + (n.c + (u - n.nl)) * n.s);
}

__device__ __forceinline__ float sp_dot(const float *a, const float *b, int n) {
    float acc = 0.0f;
    for (int d = 0; d < n; d++) acc += a[d] * b[d];
    return acc;
}

/* Forward of query i (row qi) against keys K, values V of one slice (positions [0, L)):
 * out (M floats), and, where not NULL, o2 (a copy of out) and *lse. sc: the block's
 * slot. Every thread calls. */
__device__ void sp_row_forward(const float *qi, const float *K, const float *V, int i, int L, bool causal, int D,
                               int M, long long w, int s, long long c, float scale, float *sc, float *out, float *o2,
                               float *lse) {
    const sp_nbrs nb = sp_neighbours(i, L, true, !causal, w, s, c);
    const int n = sp_count(nb);
    float mx = -INFINITY;
    for (int u = threadIdx.x; u < n; u += blockDim.x) {
        sc[u] = scale * sp_dot(qi, K + (long long)sp_at(nb, u) * D, D);
        mx = fmaxf(mx, sc[u]);
    }
    mx = attn_block_max(mx);
    float part = 0.0f;
    for (int u = threadIdx.x; u < n; u += blockDim.x) {
        sc[u] = expf(sc[u] - mx);
        part += sc[u];
    }
    const float sum = attn_block_sum(part); /* ends with a barrier: sc is complete */
    const float inv = 1.0f / sum;
    for (int m = threadIdx.x; m < M; m += blockDim.x) {
        float acc = 0.0f;
        for (int u = 0; u < n; u++) acc += sc[u] * V[(long long)sp_at(nb, u) * M + m];
        out[m] = acc * inv;
        if (o2) o2[m] = acc * inv;
    }
    if (lse && threadIdx.x == 0) *lse = mx + logf(sum);
    __syncthreads();
}

/* Rows of slices [s0, s0 + ns) of valid length L. */
__global__ void sp_forward_kernel(const float *q, const float *k, const float *v, float *out, float *o2, float *lse,
                                  float *ws, long long slot, long long s0, long long ns, int N, int L, int D, int M,
                                  long long w, int s, long long c, bool causal, float scale, bool smem) {
    AB_DYN_SMEM(float, sm);
    float *sc = smem ? sm : ws + blockIdx.x * slot;
    for (long long row = blockIdx.x; row < ns * L; row += gridDim.x) {
        const long long bh = s0 + row / L, at = bh * N + row % L;
        const int i = (int)(row % L);
        sp_row_forward(q + at * D, k + bh * N * D, v + bh * N * M, i, L, causal, D, M, w, s, c, scale, sc,
                       out + at * M, o2 ? o2 + at * M : NULL, lse ? lse + at : NULL);
    }
}

/* dq of each query row, and Delta_i = dO_i . O_i into delta. */
__global__ void sp_dq_kernel(const float *q, const float *k, const float *v, const float *dout, const float *o,
                             const float *lse, float *delta, float *dq, float *ws, long long slot, long long s0,
                             long long ns, int N, int L, int D, int M, long long w, int s, long long c, bool causal,
                             float scale, bool smem) {
    AB_DYN_SMEM(float, sm);
    float *ds = smem ? sm : ws + blockIdx.x * slot;
    for (long long row = blockIdx.x; row < ns * L; row += gridDim.x) {
        const long long bh = s0 + row / L, at = bh * N + row % L;
        const float *qi = q + at * D, *doi = dout + at * M, *K = k + bh * N * D, *V = v + bh * N * M;
        const sp_nbrs nb = sp_neighbours((int)(row % L), L, true, !causal, w, s, c);
        const int n = sp_count(nb);
        float part = 0.0f;
        for (int m = threadIdx.x; m < M; m += blockDim.x) part += doi[m] * o[at * M + m];
        const float dl = attn_block_sum(part), li = lse[at];
        if (threadIdx.x == 0) delta[at] = dl;
        for (int u = threadIdx.x; u < n; u += blockDim.x) {
            const long long j = sp_at(nb, u);
            const float p = expf(scale * sp_dot(qi, K + j * D, D) - li);
            ds[u] = p * (sp_dot(doi, V + j * M, M) - dl);
        }
        __syncthreads();
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float acc = 0.0f;
            for (int u = 0; u < n; u++) acc += ds[u] * K[(long long)sp_at(nb, u) * D + d];
            dq[at * D + d] = scale * acc;
        }
        __syncthreads();
    }
}

/* dk and dv of each key row, over the queries that see it. */
__global__ void sp_dkdv_kernel(const float *q, const float *k, const float *v, const float *dout, const float *lse,
                               const float *delta, float *dk, float *dv, float *ws, long long slot, long long s0,
                               long long ns, int N, int L, int D, int M, long long w, int s, long long c, bool causal,
                               float scale, bool smem) {
    AB_DYN_SMEM(float, sm);
    float *p = smem ? sm : ws + blockIdx.x * slot, *ds = p + slot / 2;
    for (long long row = blockIdx.x; row < ns * L; row += gridDim.x) {
        const long long bh = s0 + row / L, at = bh * N + row % L, base = bh * N;
        const float *kj = k + at * D, *vj = v + at * M, *Q = q + base * D, *dO = dout + base * M;
        const sp_nbrs nb = sp_neighbours((int)(row % L), L, !causal, true, w, s, c);
        const int n = sp_count(nb);
        for (int u = threadIdx.x; u < n; u += blockDim.x) {
            const long long i = sp_at(nb, u);
            p[u] = expf(scale * sp_dot(Q + i * D, kj, D) - lse[base + i]);
            ds[u] = p[u] * (sp_dot(dO + i * M, vj, M) - delta[base + i]);
        }
        __syncthreads();
        for (int m = threadIdx.x; m < M; m += blockDim.x) {
            float acc = 0.0f;
            for (int u = 0; u < n; u++) acc += p[u] * dO[(long long)sp_at(nb, u) * M + m];
            dv[at * M + m] = acc;
        }
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float acc = 0.0f;
            for (int u = 0; u < n; u++) acc += ds[u] * Q[(long long)sp_at(nb, u) * D + d];
            dk[at * D + d] = scale * acc;
        }
        __syncthreads();
    }
}

/* ---- workspace ---- */

/* Floats of a row's slot: the most neighbours a position has. */
static long long slot_floats(const sp_geo *g, int n) {
    const long long band = 2 * g->w - 1 < n ? 2 * g->w - 1 : n;
    return (band + 2LL * g->nsub + 1 + 15) / 16 * 16;
}

static unsigned row_grid(long long rows) { return ab_cuda_grid(rows, 1, MAX_BLOCKS); }

/* Whether the row kernels keep their slots (two for dk, dv) in shared memory: when they
 * fit the 48 KiB every device gives a block (2 w - 1 + 2 N / s up to about 6000 floats),
 * so that the scores never reach global memory; else in workspace. */
static bool slots_in_smem(const sp_geo *g, int n) { return 2 * slot_floats(g, n) * sizeof(float) <= 48 * 1024; }

static long long rows_of(const attn_shape *s) { return (long long)s->batch * s->heads * s->len; }

static size_t align64(size_t x) { return (x + 63) / 64 * 64; }

/* [Delta (B*H*N floats) | MAX_BLOCKS slots of two halves, unless in shared memory] */
extern "C" size_t sparse_cuda_workspace_bytes(const attn *a, const attn_shape *s) {
    const sp_geo g = sp_geo_of(a, s->len, s->len);
    const long long blocks = slots_in_smem(&g, s->len) ? 0 : row_grid(rows_of(s));
    return align64((size_t)rows_of(s) * sizeof(float)) + (size_t)blocks * 2 * (size_t)slot_floats(&g, s->len) * sizeof(float);
}

/* ---- parallel mode ---- */

/* Forward of shape s with geometry g; o2 and lse NULL or the saved copies. */
static int forward_impl(attn *a, const attn_shape *s, const sp_geo *g, const float *q, const float *k, const float *v,
                        float *out, float *o2, float *lse) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const float scale = (float)attn_scale(a, D);
    const long long slot = slot_floats(g, N);
    const bool sm = slots_in_smem(g, N);
    float *ws = (float *)a->ws;
    return attn_cuda_runs(s, {{out, M, false}}, [&](long long s0, long long ns, int L) {
        if (o2) AB_TRY(attn_cuda_zero_tail(o2 + s0 * N * M, ns, (long long)N * M, (long long)L * M));
        AB_LAUNCH(sp_forward_kernel, row_grid(ns * L), THREADS, sm ? slot * sizeof(float) : 0, ab_cuda_stream(), q, k,
                  v, out, o2, lse, ws, slot, s0, ns, N, L, D, M, g->w, g->s, g->c, s->causal, scale, sm);
        return 0;
    });
}

extern "C" int sparse_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                   float *out, void *saved) {
    const sp_geo g = sp_geo_of(a, s->len, s->len);
    float *o2 = (float *)saved, *lse = saved ? (float *)saved + rows_of(s) * s->v_dim : NULL;
    return forward_impl(a, s, &g, q, k, v, out, o2, lse);
}

extern "C" int sparse_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                    const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const sp_geo g = sp_geo_of(a, N, N);
    const float scale = (float)attn_scale(a, D);
    const float *o = (const float *)saved, *lse = o + rows_of(s) * M;
    float *delta = (float *)a->ws, *ws = (float *)((char *)a->ws + align64((size_t)rows_of(s) * sizeof(float)));
    const long long slot = slot_floats(&g, N);
    const bool sm = slots_in_smem(&g, N);
    const size_t sb = sm ? slot * sizeof(float) : 0;
    return attn_cuda_runs(s, {{dq, D, false}, {dk, D, false}, {dv, M, false}}, [&](long long s0, long long ns, int L) {
        AB_LAUNCH(sp_dq_kernel, row_grid(ns * L), THREADS, sb, ab_cuda_stream(), q, k, v, dout, o, lse, delta, dq, ws,
                  slot, s0, ns, N, L, D, M, g.w, g.s, g.c, s->causal, scale, sm);
        AB_LAUNCH(sp_dkdv_kernel, row_grid(ns * L), THREADS, 2 * sb, ab_cuda_stream(), q, k, v, dout, lse, delta, dk,
                  dv, ws, 2 * slot, s0, ns, N, L, D, M, g.w, g.s, g.c, s->causal, scale, sm);
        return 0;
    });
}

/* ---- recurrent mode: the CPU's key/value cache of every position ---- */

static size_t kcache_bytes(const attn_shape *s, int capacity) {
    return align64((size_t)s->batch * (size_t)s->heads * (size_t)capacity * (size_t)s->qk_dim * sizeof(float));
}

/* One block per slice: position t's key and value are in the cache; out = its row. */
__global__ void sp_step_kernel(const float *kc, const float *vc, const float *q, float *out, float *ws, long long slot,
                               long long n_slices, int capacity, int t, int D, int M, long long w, int s, long long c,
                               float scale) {
    for (long long bh = blockIdx.x; bh < n_slices; bh += gridDim.x)
        sp_row_forward(q + bh * D, kc + bh * capacity * D, vc + bh * capacity * M, t, t + 1, true, D, M, w, s, c,
                       scale, ws + blockIdx.x * slot, out + bh * M, NULL, NULL);
}

/* Positions not yet written are never read: nothing to clear. */
extern "C" int sparse_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    (void)a, (void)s, (void)capacity, (void)state;
    return 0;
}

/* The larger of a step's slots and prefill's forward on up to capacity positions. */
extern "C" size_t sparse_cuda_step_workspace_bytes(const attn *a, const attn_shape *s, int capacity) {
    const sp_geo g = sp_geo_of(a, capacity, capacity);
    attn_shape cs = *s;
    cs.len = capacity;
    /* prefill's rows keep their slots in shared memory when they fit at the capacity
     * (and so at every shorter prefix): no workspace for them then */
    const size_t fwd = slots_in_smem(&g, capacity)
                           ? 0
                           : (size_t)row_grid(rows_of(&cs)) * (size_t)slot_floats(&g, capacity) * sizeof(float);
    const size_t step = (size_t)row_grid((long long)s->batch * s->heads) * (size_t)slot_floats(&g, capacity) * sizeof(float);
    return fwd > step ? fwd : step;
}

extern "C" int sparse_cuda_prefill(attn *a, const attn_shape *s, int capacity, int P, const float *q, const float *k,
                                   const float *v, float *out, void *state) {
    const int D = s->qk_dim, M = s->v_dim;
    const long long BH = (long long)s->batch * s->heads;
    float *kc = (float *)state, *vc = (float *)((char *)state + kcache_bytes(s, capacity));
    AB_TRY(attn_cuda_copy_slices(kc, (long long)capacity * D, k, (long long)P * D, BH, (long long)P * D));
    AB_TRY(attn_cuda_copy_slices(vc, (long long)capacity * M, v, (long long)P * M, BH, (long long)P * M));
    if (!out) return 0;
    attn_shape ps = *s;
    ps.len = P;
    const sp_geo g = sp_geo_of(a, capacity, P);
    return forward_impl(a, &ps, &g, q, k, v, out, NULL, NULL);
}

extern "C" int sparse_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q,
                                const float *k, const float *v, float *out) {
    const int D = s->qk_dim, M = s->v_dim;
    const long long BH = (long long)s->batch * s->heads;
    const sp_geo g = sp_geo_of(a, capacity, capacity);
    float *kc = (float *)state, *vc = (float *)((char *)state + kcache_bytes(s, capacity));
    AB_TRY(attn_cuda_copy_slices(kc + (long long)t * D, (long long)capacity * D, k, D, BH, D));
    AB_TRY(attn_cuda_copy_slices(vc + (long long)t * M, (long long)capacity * M, v, M, BH, M));
    AB_LAUNCH(sp_step_kernel, row_grid(BH), THREADS, 0, ab_cuda_stream(), kc, vc, q, out, (float *)a->ws,
              slot_floats(&g, capacity), BH, capacity, t, D, M, g.w, g.s, g.c, (float)attn_scale(a, D));
    return 0;
}
