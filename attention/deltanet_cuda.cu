/* deltanet (the delta rule) on CUDA, with the definitions, options and results of the
 * CPU version (deltanet.c):
 *   qn, kn = q, k / sqrt(|x|^2 + DN_EPS);  e_t = v_t - S_{t-1}^T kn_t;
 *   S_t = S_{t-1} + beta_t kn_t e_t^T;  out_t = S_t^T qn_t;  rows >= L zero.
 *
 * Two forms, chosen as the CPU chooses them by the option chunk (C):
 * - C >= 2: the chunked (WY) form of deltanet_wy.c, forward and backward, in kernels
 *   that are parallel over (slice, chunk) for everything but the carry of the state
 *   from chunk to chunk, which runs per (slice, 32 columns of S): deltanet_wy_cuda.cu.
 *   Taken when every kernel's shared memory fits 48 KiB (C and D up to 64 and more:
 *   dn_wy_on_cuda); else the scan.
 * - C = 1 (and chunks too large for the above): the scan. One block per slice
 *   (grid-stride over the slices of a run of equal lengths), the recurrence one
 *   position at a time. A thread owns columns m of the state S (D x M, row-major:
 *   consecutive threads read consecutive floats of a row): S^T kn, S^T qn and the update
 *   of its columns need nothing from the other threads, so a step has only the barriers
 *   of the normalisations (block sums) and one at its end. The state lives in shared
 *   memory when D M floats fit DN_SMEM_STATE bytes (D = M = 64: 16 KiB), in a per-block
 *   slot of the workspace otherwise. Recurrent steps use it too; prefill is the forward
 *   with the recurrent state as S.
 *
 * Both forwards save the CPU's layout: the state at the start of every chunk of C
 * positions. The scan's backward (the CPU's reverse recurrence, deltanet.c): per chunk
 * from the last, the chunk's states S_{t-1}, qn, kn, their norms and e are recomputed
 * from the saved state into the block's workspace slot; then per position, from the last:
 *   columns: G += qn g^T; gk = G^T kn; de = dv = beta gk;  (block sums: e . g, dbeta)
 *   rows:    dqn = S_{t-1} g + beta kn (e . g);  dkn = beta G e - S_{t-1} de
 *   columns: G -= kn de^T;  then dq, dk through the normalisation (two block sums).
 * Its workspace: per block C (D M) + D M + C (2 D + M + 2) floats, the number of blocks
 * capped so that it stays under dn_cuda_ws_cap (B H = 8, D = M = 64, chunk 64: 33 MB).
 *
 * Speed: not measured on a GPU (none was lent when either form was written). */
#include "cuda_util.cuh"

#include "deltanet.h"
#include "deltanet_cuda.h"

#define DN_THREADS_MAX 128
#define DN_SMEM_STATE (32 * 1024)
/* DN_CUDA_WS_CAP_DEFAULT, 1 GiB: the chunked form's backward keeps per slice the chunks'
 * X, P and G and the rows' dU' (B = 2, H = 8, N = 65536, D = M = 64, chunk 16: 92 MB a
 * slice), and the carry of S runs per (slice of the group, 32 columns): a group of a few
 * slices would leave that sequential part a handful of blocks. */
size_t dn_cuda_ws_cap = DN_CUDA_WS_CAP_DEFAULT;

static int dn_threads(const attn_shape *s) {
    return ab_cuda_threads(s->qk_dim > s->v_dim ? s->qk_dim : s->v_dim, DN_THREADS_MAX);
}

static bool state_in_smem(const attn_shape *s) { return (size_t)s->qk_dim * s->v_dim * sizeof(float) <= DN_SMEM_STATE; }

/* Floats of one backward block's slot. */
static size_t bwd_slot(int C, int D, int M) {
    const size_t dm = (size_t)D * M;
    return (size_t)C * dm + dm + (size_t)C * (2 * (size_t)D + (size_t)M + 2);
}

static long long bwd_blocks(const attn_shape *s, int C) {
    const size_t slot = bwd_slot(C, s->qk_dim, s->v_dim) * sizeof(float);
    long long n = (long long)(dn_cuda_ws_cap / slot), bh = (long long)s->batch * s->heads;
    if (n < 1) n = 1;
    if (n > bh) n = bh;
    return n > DN_MAX_BLOCKS ? DN_MAX_BLOCKS : n;
}

static long long fwd_blocks(const attn_shape *s) {
    long long bh = (long long)s->batch * s->heads;
    return bh > 1024 ? 1024 : bh;
}


/* ---- device helpers (every thread of the block calls) ---- */

/* xn = x / sqrt(|x|^2 + DN_EPS) (D floats, shared or global); returns the norm. Ends
 * with a barrier: xn is visible to the block. */
__device__ float dn_normalise_dev(const float *x, int D, float *xn) {
    float ss = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) ss += x[d] * x[d];
    const float r = sqrtf(attn_block_sum(ss) + (float)DN_EPS), inv = 1.0f / r;
    for (int d = threadIdx.x; d < D; d += blockDim.x) xn[d] = x[d] * inv;
    __syncthreads();
    return r;
}

/* One position on the thread's columns of S: e = v - S^T kn, o = S_t^T qn (when o),
 * S += beta kn e^T. kq = kn . qn. */
__device__ void dn_columns_step(float *S, int D, int M, const float *kn, const float *qn, float kq, const float *v,
                                float b, float *o) {
    for (int m = threadIdx.x; m < M; m += blockDim.x) {
        float u = 0.0f, w = 0.0f;
        for (int d = 0; d < D; d++) {
            const float x = S[(long long)d * M + m];
            u += x * kn[d];
            if (o) w += x * qn[d];
        }
        const float e = v[m] - u;
        if (o) o[m] = w + b * kq * e;
        for (int d = 0; d < D; d++) S[(long long)d * M + m] += b * kn[d] * e;
    }
}

/* ---- forward ---- */

/* Slices [s0, s0 + ns) of valid length L: out rows (when out), the chunks' starting
 * states (when saved), the final state into states (when not NULL: prefill). */
__global__ void dn_forward_kernel(const float *q, const float *k, const float *v, const float *beta, long long s0,
                                  long long ns, int N, int L, int D, int M, int C, float *out, float *saved,
                                  float *states, float *ws, int smem_state) {
    AB_DYN_SMEM(float, sm);
    float *qn = sm, *kn = sm + D;
    const long long dm = (long long)D * M, nb = (N + C - 1) / C;
    for (long long sl = s0 + blockIdx.x; sl < s0 + ns; sl += gridDim.x) {
        float *S = states ? states + sl * dm : smem_state ? sm + 2 * D : ws + (long long)blockIdx.x * dm;
        for (long long i = threadIdx.x; i < dm; i += blockDim.x) S[i] = 0.0f;
        __syncthreads();
        for (int t = 0; t < L; t++) {
            if (saved && t % C == 0)
                for (long long i = threadIdx.x; i < dm; i += blockDim.x) saved[(sl * nb + t / C) * dm + i] = S[i];
            dn_normalise_dev(k + (sl * N + t) * D, D, kn);
            float kq = 0.0f;
            if (out) {
                dn_normalise_dev(q + (sl * N + t) * D, D, qn);
                float p = 0.0f;
                for (int d = threadIdx.x; d < D; d += blockDim.x) p += kn[d] * qn[d];
                kq = attn_block_sum(p);
            }
            /* the copy above and the steps touch S in different layouts: a barrier
             * (the normalisations' block sums) separates them */
            dn_columns_step(S, D, M, kn, qn, kq, v + (sl * N + t) * M, beta[sl * N + t],
                            out ? out + (sl * N + t) * M : NULL);
            __syncthreads();
        }
    }
}

static int forward_impl(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                        void *saved, float *states) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim, C = dn_chunk(a, N), nt = dn_threads(s);
    const bool smem = state_in_smem(s) && !states;
    const size_t sm = (size_t)(2 * D + (smem ? D * M : 0)) * sizeof(float);
    const float *beta = a->aux;
    float *ws = (float *)a->ws;
    cudaStream_t st = ab_cuda_stream();
    const bool wy = dn_wy_on_cuda(C, D);
    auto run = [&](long long s0, long long ns, int L) -> int {
        if (wy) return dn_wy_cuda_forward(a, s, s0, ns, L, q, k, v, out, (float *)saved, states);
        const unsigned grid = (unsigned)(ns < fwd_blocks(s) ? ns : fwd_blocks(s));
        AB_LAUNCH(dn_forward_kernel, grid, nt, sm, st, q, k, v, beta, s0, ns, N, L, D, M, C, out, (float *)saved,
                  states, ws, (int)smem);
        return 0;
    };
    return out ? attn_cuda_runs(s, {{out, M, false}}, run) : attn_cuda_runs(s, {}, run);
}

int dn_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                    void *saved) {
    return forward_impl(a, s, q, k, v, out, saved, NULL);
}

/* ---- backward ---- */

typedef struct {
    float *Sb, *G, *qn, *kn, *e, *rq, *rk;
} dn_slot;

__device__ dn_slot dn_carve(float *w, int C, int D, int M) {
    const long long dm = (long long)D * M;
    dn_slot b;
    b.Sb = w;
    b.G = b.Sb + (long long)C * dm;
    b.qn = b.G + dm;
    b.kn = b.qn + (long long)C * D;
    b.e = b.kn + (long long)C * D;
    b.rq = b.e + (long long)C * M;
    b.rk = b.rq + C;
    return b;
}

/* Positions [t0, t0 + n) of slice sl from the chunk's saved starting state S0. */
__device__ void dn_recompute(const dn_slot &b, const float *S0, const float *q, const float *k, const float *v,
                             const float *beta, long long sl, int N, int t0, int n, int D, int M) {
    const long long dm = (long long)D * M;
    for (long long i = threadIdx.x; i < dm; i += blockDim.x) b.Sb[i] = S0[i];
    __syncthreads();
    for (int i = 0; i < n; i++) {
        const long long t = t0 + i;
        float *kn = b.kn + (long long)i * D, *Sp = b.Sb + i * dm, *e = b.e + (long long)i * M;
        const float rk = dn_normalise_dev(k + (sl * N + t) * D, D, kn);
        const float rq = dn_normalise_dev(q + (sl * N + t) * D, D, b.qn + (long long)i * D);
        if (threadIdx.x == 0) b.rk[i] = rk, b.rq[i] = rq;
        const float bt = beta[sl * N + t], *vt = v + (sl * N + t) * M;
        for (int m = threadIdx.x; m < M; m += blockDim.x) {
            float u = 0.0f;
            for (int d = 0; d < D; d++) u += Sp[(long long)d * M + m] * kn[d];
            const float em = vt[m] - u;
            e[m] = em;
            if (i + 1 < n)
                for (int d = 0; d < D; d++) Sp[dm + (long long)d * M + m] = Sp[(long long)d * M + m] + bt * kn[d] * em;
        }
    }
    __syncthreads();
}

/* The reverse step at position t = t0 + i (see the header). sm: gk, de (M), dqn, dkn (D). */
__device__ void dn_reverse_one(const dn_slot &b, float *sm, int i, long long row, float bt, const float *g, int D,
                               int M, float *dq, float *dk, float *dv, float *dbeta) {
    float *gk = sm, *de = sm + M, *dqn = sm + 2 * M, *dkn = sm + 2 * M + D;
    const long long dm = (long long)D * M;
    const float *Sp = b.Sb + i * dm, *qn = b.qn + (long long)i * D, *kn = b.kn + (long long)i * D,
                *e = b.e + (long long)i * M;
    float eg = 0.0f, db = 0.0f;
    for (int m = threadIdx.x; m < M; m += blockDim.x) {
        float acc = 0.0f;
        for (int d = 0; d < D; d++) {
            float *gp = b.G + (long long)d * M + m;
            *gp += qn[d] * g[m];
            acc += *gp * kn[d];
        }
        gk[m] = acc;
        de[m] = bt * acc;
        dv[row * M + m] = bt * acc;
        eg += e[m] * g[m];
        db += acc * e[m];
    }
    eg = attn_block_sum(eg);
    db = attn_block_sum(db);
    if (dbeta && threadIdx.x == 0) dbeta[row] = db;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        for (int m = 0; m < M; m++) {
            const float x = Sp[(long long)d * M + m];
            a1 += x * g[m];
            a2 += b.G[(long long)d * M + m] * e[m];
            a3 += x * de[m];
        }
        dqn[d] = a1 + bt * kn[d] * eg;
        dkn[d] = bt * a2 - a3;
    }
    __syncthreads();
    for (int m = threadIdx.x; m < M; m += blockDim.x)
        for (int d = 0; d < D; d++) b.G[(long long)d * M + m] -= kn[d] * de[m];
    float pq = 0.0f, pk = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) pq += qn[d] * dqn[d], pk += kn[d] * dkn[d];
    pq = attn_block_sum(pq);
    pk = attn_block_sum(pk);
    const float iq = 1.0f / b.rq[i], ik = 1.0f / b.rk[i];
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        dq[row * D + d] = (dqn[d] - qn[d] * pq) * iq;
        dk[row * D + d] = (dkn[d] - kn[d] * pk) * ik;
    }
    __syncthreads();
}

__global__ void dn_backward_kernel(const float *q, const float *k, const float *v, const float *beta,
                                   const float *dout, const float *saved, long long s0, long long ns, int N, int L,
                                   int D, int M, int C, float *dq, float *dk, float *dv, float *dbeta, float *ws,
                                   long long slot) {
    AB_DYN_SMEM(float, sm);
    const dn_slot b = dn_carve(ws + (long long)blockIdx.x * slot, C, D, M);
    const long long dm = (long long)D * M, nb = (N + C - 1) / C;
    for (long long sl = s0 + blockIdx.x; sl < s0 + ns; sl += gridDim.x) {
        for (long long i = threadIdx.x; i < dm; i += blockDim.x) b.G[i] = 0.0f;
        for (int c = (L + C - 1) / C - 1; c >= 0; c--) {
            const int t0 = c * C, n = L - t0 < C ? L - t0 : C;
            dn_recompute(b, saved + (sl * nb + c) * dm, q, k, v, beta, sl, N, t0, n, D, M);
            for (int i = n - 1; i >= 0; i--) {
                const long long row = sl * N + t0 + i;
                dn_reverse_one(b, sm, i, row, beta[row], dout + row * M, D, M, dq, dk, dv, dbeta);
            }
        }
        __syncthreads();
    }
}

size_t dn_cuda_workspace_bytes(const attn *a, const attn_shape *s) {
    const int C = dn_chunk(a, s->len);
    if (dn_wy_on_cuda(C, s->qk_dim)) return dn_wy_cuda_workspace_bytes(s, C);
    const size_t b = (size_t)bwd_blocks(s, C) * bwd_slot(C, s->qk_dim, s->v_dim),
                 f = state_in_smem(s) ? 0 : (size_t)fwd_blocks(s) * s->qk_dim * s->v_dim;
    return (b > f ? b : f) * sizeof(float);
}

int dn_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                     const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim, C = dn_chunk(a, N), nt = dn_threads(s);
    const size_t sm = (size_t)(2 * D + 2 * M) * sizeof(float);
    const long long slot = (long long)bwd_slot(C, D, M), nblk = bwd_blocks(s, C);
    const float *beta = a->aux;
    float *dbeta = a->aux_grad, *ws = (float *)a->ws;
    cudaStream_t st = ab_cuda_stream();
    const bool wy = dn_wy_on_cuda(C, D);
    auto run = [&](long long s0, long long ns, int L) -> int {
        if (wy) return dn_wy_cuda_backward(a, s, s0, ns, L, q, k, v, dout, (const float *)saved, dq, dk, dv);
        const unsigned grid = (unsigned)(ns < nblk ? ns : nblk);
        AB_LAUNCH(dn_backward_kernel, grid, nt, sm, st, q, k, v, beta, dout, (const float *)saved, s0, ns, N, L, D, M,
                  C, dq, dk, dv, dbeta, ws, slot);
        return 0;
    };
    if (dbeta) return attn_cuda_runs(s, {{dq, D, false}, {dk, D, false}, {dv, M, false}, {dbeta, 1, false}}, run);
    return attn_cuda_runs(s, {{dq, D, false}, {dk, D, false}, {dv, M, false}}, run);
}

/* ---- recurrent mode ---- */

int dn_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    (void)a, (void)capacity;
    AB_CUDA_CHECK(cudaMemsetAsync(state, 0, (size_t)s->batch * s->heads * s->qk_dim * s->v_dim * sizeof(float),
                                  ab_cuda_stream()));
    return 0;
}

int dn_cuda_prefill(attn *a, const attn_shape *s, int capacity, int P, const float *q, const float *k,
                    const float *v, float *out, void *state) {
    (void)capacity;
    attn_shape ps = *s;
    ps.len = P;
    return forward_impl(a, &ps, q, k, v, out, NULL, (float *)state);
}

/* One position for every slice: q, k [BH, D], v [BH, M], beta [BH] -> out [BH, M]. */
__global__ void dn_step_kernel(float *state, const float *q, const float *k, const float *v, const float *beta,
                               long long bh, int D, int M, float *out) {
    AB_DYN_SMEM(float, sm);
    float *qn = sm, *kn = sm + D;
    const long long dm = (long long)D * M;
    for (long long sl = blockIdx.x; sl < bh; sl += gridDim.x) {
        dn_normalise_dev(k + sl * D, D, kn);
        dn_normalise_dev(q + sl * D, D, qn);
        float p = 0.0f;
        for (int d = threadIdx.x; d < D; d += blockDim.x) p += kn[d] * qn[d];
        const float kq = attn_block_sum(p);
        dn_columns_step(state + sl * dm, D, M, kn, qn, kq, v + sl * M, beta[sl], out + sl * M);
        __syncthreads();
    }
}

int dn_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                 const float *v, float *out) {
    (void)capacity, (void)t;
    const long long bh = (long long)s->batch * s->heads;
    const unsigned grid = ab_cuda_grid(bh, 1, DN_MAX_BLOCKS);
    AB_LAUNCH(dn_step_kernel, grid, dn_threads(s), (size_t)(2 * s->qk_dim) * sizeof(float), ab_cuda_stream(),
              (float *)state, q, k, v, a->aux, bh, s->qk_dim, s->v_dim, out);
    return 0;
}
