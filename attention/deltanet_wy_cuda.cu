/* deltanet's chunked (WY) form on CUDA: the kernels and their runs, forward and
 * backward, of deltanet_wy.c's form (the scan, the recurrent mode and the choice between
 * the two are deltanet_cuda.cu's; the declarations are in deltanet_cuda.h).
 *
 * Speed: not measured on a GPU (none was lent when it was written). Its emulated
 * traffic: experiments/sweep/TRAFFIC.md. */
#include "cuda_util.cuh"

#include "deltanet.h"
#include "deltanet_cuda.h"

/* ---- forward: the chunked (WY) form ----
 *
 * deltanet_wy.c's chunk in three kernels, so that only the state's carry is sequential:
 *   prep  (block per (slice, chunk), in parallel): Kn, T = (I + strictly_lower(diag(beta)
 *         Kn Kn^T))^{-1} diag(beta) in shared memory; W = T Kn and U = T V to the workspace.
 *   state (block per (slice, WY_GROUP state columns), chunks in order): U' = U - W S over
 *         the block's columns (in place of U), the chunk's starting state to `saved` (or to
 *         the workspace), S += Kn^T U'. The delta rule's columns m of S are independent
 *         (each step reads and writes column m only), so the columns split across blocks;
 *         within a block the rows of S split across its warps (wy_warps: up to WY_WARPS,
 *         rows d = w, w + R, ... for warp w of R), a lane owns one column, the state
 *         lives in shared memory, the rows of W and k are staged WY_ROWS at a time. The
 *         products W S reduce the warps' partial sums in shared memory (wy_cols_dot).
 *   out   (block per (slice, chunk), in parallel): O = Qn S + lower_incl(Qn Kn^T) U'.
 * The sequential part per chunk is two products of n x D by D x 32 per block, split
 * over R warps (a lane's chain: 2 n D / R multiply-adds and the reduction's R adds per
 * row), where the scan (deltanet_cuda.cu) takes n dependent steps with four block-wide
 * barriers each. Backward reads the chunks' starting states that `state` saves, in the
 * scan's layout.
 * Workspace per slice: N (D + M) floats (W, U), and the chunks' starting states when
 * the caller saves none; slices go in groups that keep it under dn_cuda_ws_cap. Used when
 * C >= 2 and every kernel's shared memory fits WY_SMEM_MAX; else the scan. */
#define WY_GROUP 32
#define WY_ROWS 16
#define WY_THREADS 128
#define WY_WARPS 8
#define WY_SMEM_MAX (48 * 1024)

__host__ __device__ static inline int n_chunks(int N, int C) { return (N + C - 1) / C; }

static size_t wy_prep_smem(int C, int D) { return ((size_t)C * D + (size_t)C * C + 3 * (size_t)C) * sizeof(float); }
/* The carry kernels' (state, reverse) with R warps: the state's columns (D x WY_GROUP),
 * a tile of rows (WY_ROWS x D) and its norms, the warps' partial sums (R x WY_ROWS x
 * WY_GROUP; the first R = 1 part doubles as the reduced tile); reverse adds T, P and beta. */
static size_t wy_state_smem(int D, int R) {
    return ((size_t)D * WY_GROUP + (size_t)WY_ROWS * D + WY_ROWS + (size_t)R * WY_ROWS * WY_GROUP) * sizeof(float);
}
static size_t wy_out_smem(int C, int D) { return ((size_t)C * D + (size_t)C * C + 2 * (size_t)C) * sizeof(float); }
static size_t wy_reverse_smem(int C, int D, int R) {
    return wy_state_smem(D, R) + (2 * (size_t)C * C + (size_t)C) * sizeof(float);
}

bool dn_wy_on_cuda(int C, int D) {
    return dn_wy_usable(C) && wy_prep_smem(C, D) <= WY_SMEM_MAX && wy_state_smem(D, 1) <= WY_SMEM_MAX &&
           wy_out_smem(C, D) <= WY_SMEM_MAX && wy_reverse_smem(C, D, 1) <= WY_SMEM_MAX;
}

int dn_cuda_carry_warps = 0;

/* Warps of a carry kernel's block: about 8 rows of S per warp (D = 64: 8 warps), at most
 * WY_WARPS (or dn_cuda_carry_warps when set), fewer where the partial sums would not fit
 * shared memory (reverse at C = 64, D = 64: 1). C = 0: the state kernel (no T or P). */
static int wy_warps(int C, int D) {
    int R = dn_cuda_carry_warps > 0 ? dn_cuda_carry_warps : (D + 7) / 8;
    if (R > WY_WARPS) R = WY_WARPS;
    while (R > 1 && (C ? wy_reverse_smem(C, D, R) : wy_state_smem(D, R)) > WY_SMEM_MAX) R--;
    return R;
}

/* Floats of one slice's forward workspace (W, U and the chunks' starting states). */
static size_t wy_slice_floats(int N, int C, int D, int M) {
    return (size_t)N * ((size_t)D + (size_t)M) + (size_t)n_chunks(N, C) * D * M;
}

/* Slices per group of the chunked forward. */
static long long wy_group_slices(const attn_shape *s, int C) {
    const size_t per = wy_slice_floats(s->len, C, s->qk_dim, s->v_dim) * sizeof(float);
    long long g = (long long)(dn_cuda_ws_cap / per), bh = (long long)s->batch * s->heads;
    if (g < 1) g = 1;
    return g < bh ? g : bh;
}

/* Rows [0, n) of x (stride D) into xs (n x D, shared), each divided by
 * sqrt(|x_i|^2 + DN_EPS); r (n floats, shared) gets 1 / that. Ends with a barrier. */
__device__ void wy_stage_normalised(const float *x, int n, int D, float *xs, float *r) {
    for (int e = threadIdx.x; e < n * D; e += blockDim.x) xs[e] = x[e];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float ss = 0.0f;
        for (int d = 0; d < D; d++) ss += xs[i * D + d] * xs[i * D + d];
        r[i] = 1.0f / sqrtf(ss + (float)DN_EPS);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n * D; e += blockDim.x) xs[e] *= r[e / D];
    __syncthreads();
}

/* The carry kernels' products with the state's columns sS (D x WY_GROUP, shared), whose
 * rows split over the block's R warps: warp w owns rows d = w, w + R, ..., lane l
 * column l. */

/* red[i][l] (its first WY_ROWS x WY_GROUP part) = sum_d sx[i][d] sS[d][l] for i < nr
 * (sx: nr x D, shared): the warps' partial sums over their rows into red (R x WY_ROWS x
 * WY_GROUP), then added per (i, l) by one thread. Ends with a barrier. */
__device__ void wy_cols_dot(const float *sx, int nr, int D, const float *sS, float *red) {
    const int lane = threadIdx.x % WY_GROUP, w = threadIdx.x / WY_GROUP, R = blockDim.x / WY_GROUP;
    for (int i = 0; i < nr; i++) {
        float u = 0.0f;
        for (int d = w; d < D; d += R) u += sx[i * D + d] * sS[d * WY_GROUP + lane];
        red[(w * WY_ROWS + i) * WY_GROUP + lane] = u;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < nr * WY_GROUP; e += blockDim.x) {
        float u = red[e]; /* only this thread reads or writes entry e of every part */
        for (int x = 1; x < R; x++) u += red[x * WY_ROWS * WY_GROUP + e];
        red[e] = u;
    }
    __syncthreads();
}

/* sS[d][l] += sum_i sx[i][d] su[i][l] over i < nr (su: nr x WY_GROUP, shared), on the
 * warp's own rows (no barrier: no other warp reads them). */
__device__ void wy_cols_update(const float *sx, int nr, int D, const float *su, float *sS) {
    const int lane = threadIdx.x % WY_GROUP, w = threadIdx.x / WY_GROUP, R = blockDim.x / WY_GROUP;
    for (int d = w; d < D; d += R) {
        float x = 0.0f;
        for (int i = 0; i < nr; i++) x += sx[i * D + d] * su[i * WY_GROUP + lane];
        sS[d * WY_GROUP + lane] += x;
    }
}

/* P = lower_incl(Qn Kn^T) (n x n, row stride n; shared or global) with one side staged
 * normalised in shared memory (xs) and the other read from its raw rows x (global),
 * normalised on the fly: x holds the queries when x_queries, else the keys. r (n
 * floats, shared) gets x's inverse norms. Ends with a barrier. */
__device__ void wy_lower_products(const float *x, const float *xs, bool x_queries, int n, int D, float *r, float *P) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float ss = 0.0f;
        for (int d = 0; d < D; d++) ss += x[(long long)i * D + d] * x[(long long)i * D + d];
        r[i] = 1.0f / sqrtf(ss + (float)DN_EPS);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n * n; e += blockDim.x) {
        const int i = e / n, j = e % n, g = x_queries ? i : j, h = x_queries ? j : i;
        float p = 0.0f;
        if (j <= i)
            for (int d = 0; d < D; d++) p += (x[(long long)g * D + d] * r[g]) * xs[h * D + d];
        P[e] = p;
    }
    __syncthreads();
}

/* X = (I + strictly_lower(diag(beta) Kn Kn^T))^{-1} (n x n, row stride n, unit lower
 * triangular) by forward substitution, row by row: X[i][j] = -beta_i sum_{j <= l < i}
 * A[i][l] X[l][j]. Kn: n x D, bc: the chunk's beta, arow: n floats (all shared). Ends
 * with a barrier. */
__device__ void wy_inverse_dev(const float *Kn, const float *bc, int n, int D, float *X, float *arow) {
    for (int e = threadIdx.x; e < n * n; e += blockDim.x) {
        const int i = e / n, j = e % n;
        float a = 0.0f;
        if (j < i)
            for (int d = 0; d < D; d++) a += Kn[i * D + d] * Kn[j * D + d];
        X[e] = i == j ? 1.0f : a; /* A's strictly lower part, replaced row by row */
    }
    __syncthreads();
    for (int i = 1; i < n; i++) {
        for (int l = threadIdx.x; l < i; l += blockDim.x) arow[l] = X[i * n + l];
        __syncthreads();
        for (int j = threadIdx.x; j < i; j += blockDim.x) {
            float x = 0.0f;
            for (int l = j; l < i; l++) x += arow[l] * X[l * n + j];
            X[i * n + j] = -bc[i] * x;
        }
        __syncthreads();
    }
}

/* Per (slice, chunk). Forward (W, U not NULL): W = T Kn, U = T V (T = X diag(beta)),
 * [slice of the group][N][D or M]. Backward (Xw, Pw not NULL): X and P =
 * lower_incl(Qn Kn^T), n x n each (row stride n) at [slice of the group][chunk][C C]. */
__global__ void dn_wy_prep_kernel(const float *q, const float *k, const float *v, const float *beta, long long s0,
                                  long long ns, int N, int L, int D, int M, int C, float *W, float *U, float *Xw,
                                  float *Pw) {
    AB_DYN_SMEM(float, sm);
    float *Kn = sm, *T = Kn + C * D, *arow = T + C * C, *bc = arow + C, *r = bc + C;
    const int nc = n_chunks(L, C), nb = n_chunks(N, C);
    for (long long item = blockIdx.x; item < ns * nc; item += gridDim.x) {
        const long long ls = item / nc, sl = s0 + ls, row0 = sl * N + (item % nc) * C;
        const int c = (int)(item % nc), t0 = c * C, n = L - t0 < C ? L - t0 : C;
        wy_stage_normalised(k + row0 * D, n, D, Kn, r);
        for (int i = threadIdx.x; i < n; i += blockDim.x) bc[i] = beta[row0 + i];
        wy_inverse_dev(Kn, bc, n, D, T, arow);
        if (Xw) {
            float *Xc = Xw + (ls * nb + c) * (long long)C * C, *Pc = Pw + (ls * nb + c) * (long long)C * C;
            for (int e = threadIdx.x; e < n * n; e += blockDim.x) Xc[e] = T[e];
            wy_lower_products(q + row0 * D, Kn, true, n, D, arow, Pc);
            continue;
        }
        for (int e = threadIdx.x; e < n * n; e += blockDim.x) T[e] = e % n <= e / n ? T[e] * bc[e % n] : 0.0f;
        __syncthreads();
        float *Wc = W + (ls * N + t0) * D, *Uc = U + (ls * N + t0) * M;
        for (int e = threadIdx.x; e < n * D; e += blockDim.x) {
            const int i = e / D, d = e % D;
            float w = 0.0f;
            for (int j = 0; j <= i; j++) w += T[i * n + j] * Kn[j * D + d];
            Wc[e] = w;
        }
        const float *vc = v + row0 * M;
        for (int e = threadIdx.x; e < n * M; e += blockDim.x) {
            const int i = e / M, m = e % M;
            float u = 0.0f;
            for (int j = 0; j <= i; j++) u += T[i * n + j] * vc[(long long)j * M + m];
            Uc[e] = u;
        }
        __syncthreads();
    }
}

/* Sb: the chunks' starting states, [slice of the group][chunk][D][M] (saved, or the
 * workspace's with sb0 = s0). states (prefill): each slice's final state. */
__global__ void dn_wy_state_kernel(const float *k, const float *W, float *U, long long s0, long long ns, int N, int L,
                                   int D, int M, int C, float *Sb, long long sb0, float *states) {
    AB_DYN_SMEM(float, sm);
    float *sS = sm, *sx = sS + D * WY_GROUP, *r = sx + WY_ROWS * D, *red = r + WY_ROWS;
    const int groups = (M + WY_GROUP - 1) / WY_GROUP, nc = n_chunks(L, C), nb = n_chunks(N, C);
    const int lane = threadIdx.x % WY_GROUP, w = threadIdx.x / WY_GROUP, R = blockDim.x / WY_GROUP;
    const long long dm = (long long)D * M;
    for (long long item = blockIdx.x; item < ns * groups; item += gridDim.x) {
        const long long ls = item / groups, sl = s0 + ls;
        const int m0 = (int)(item % groups) * WY_GROUP, m = m0 + lane;
        const bool on = m < M;
        for (int d = w; d < D; d += R) sS[d * WY_GROUP + lane] = 0.0f;
        for (int c = 0; c < nc; c++) {
            const int t0 = c * C, n = L - t0 < C ? L - t0 : C;
            float *Uc = U + (ls * N + t0) * M;
            const float *Wc = W + (ls * N + t0) * D, *kc = k + (sl * N + t0) * D;
            if (on) {
                float *S0 = Sb + ((sl - sb0) * nb + c) * dm;
                for (int d = w; d < D; d += R) S0[(long long)d * M + m] = sS[d * WY_GROUP + lane];
            }
            /* U' = U - W S over the chunk's rows, S still the chunk's starting state */
            for (int i0 = 0; i0 < n; i0 += WY_ROWS) {
                const int nr = n - i0 < WY_ROWS ? n - i0 : WY_ROWS;
                __syncthreads();
                for (int e = threadIdx.x; e < nr * D; e += blockDim.x) sx[e] = Wc[(long long)i0 * D + e];
                __syncthreads();
                wy_cols_dot(sx, nr, D, sS, red);
                for (int e = threadIdx.x; e < nr * WY_GROUP; e += blockDim.x)
                    if (m0 + e % WY_GROUP < M) Uc[(long long)(i0 + e / WY_GROUP) * M + m0 + e % WY_GROUP] -= red[e];
            }
            /* S += Kn^T U' (U' read back: the barriers order it after its writes) */
            for (int i0 = 0; i0 < n; i0 += WY_ROWS) {
                const int nr = n - i0 < WY_ROWS ? n - i0 : WY_ROWS;
                __syncthreads();
                for (int e = threadIdx.x; e < nr * WY_GROUP; e += blockDim.x)
                    red[e] = m0 + e % WY_GROUP < M ? Uc[(long long)(i0 + e / WY_GROUP) * M + m0 + e % WY_GROUP] : 0.0f;
                wy_stage_normalised(kc + (long long)i0 * D, nr, D, sx, r);
                wy_cols_update(sx, nr, D, red, sS);
            }
        }
        if (states && on)
            for (int d = w; d < D; d += R) states[sl * dm + (long long)d * M + m] = sS[d * WY_GROUP + lane];
        __syncthreads();
    }
}

__global__ void dn_wy_out_kernel(const float *q, const float *k, const float *U, const float *Sb, long long sb0,
                                 long long s0, long long ns, int N, int L, int D, int M, int C, float *out) {
    AB_DYN_SMEM(float, sm);
    float *Qn = sm, *P = Qn + C * D, *rq = P + C * C, *rk = rq + C;
    const int nc = n_chunks(L, C), nb = n_chunks(N, C);
    const long long dm = (long long)D * M;
    for (long long item = blockIdx.x; item < ns * nc; item += gridDim.x) {
        const long long ls = item / nc, sl = s0 + ls, row0 = sl * N + (item % nc) * C;
        const int c = (int)(item % nc), t0 = c * C, n = L - t0 < C ? L - t0 : C;
        const float *kc = k + row0 * D, *Uc = U + (ls * N + t0) * M, *S0 = Sb + ((sl - sb0) * nb + c) * dm;
        wy_stage_normalised(q + row0 * D, n, D, Qn, rq);
        wy_lower_products(kc, Qn, false, n, D, rk, P);
        for (int e = threadIdx.x; e < n * M; e += blockDim.x) {
            const int i = e / M, m = e % M;
            float o = 0.0f, a = 0.0f;
            for (int d = 0; d < D; d++) o += Qn[i * D + d] * S0[(long long)d * M + m];
            for (int j = 0; j <= i; j++) a += P[i * n + j] * Uc[(long long)j * M + m];
            out[(row0 + i) * M + m] = o + a;
        }
        __syncthreads();
    }
}

/* The chunked forward of slices [s0, s0 + ns) of valid length L. */
int dn_wy_cuda_forward(attn *a, const attn_shape *s, long long s0, long long ns, int L, const float *q,
                       const float *k, const float *v, float *out, float *saved, float *states) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim, C = dn_chunk(a, N), nc = n_chunks(L, C);
    const long long G = wy_group_slices(s, C);
    float *ws = (float *)a->ws;
    cudaStream_t st = ab_cuda_stream();
    for (long long g0 = s0; g0 < s0 + ns; g0 += G) {
        const long long gn = s0 + ns - g0 < G ? s0 + ns - g0 : G;
        float *W = ws, *U = W + gn * N * D, *Sb = saved ? saved : U + gn * N * M;
        const long long sb0 = saved ? 0 : g0;
        AB_LAUNCH(dn_wy_prep_kernel, ab_cuda_grid(gn * nc, 1, DN_MAX_BLOCKS), WY_THREADS, wy_prep_smem(C, D), st, q,
                  k, v, a->aux, g0, gn, N, L, D, M, C, W, U, (float *)NULL, (float *)NULL);
        const long long groups = (M + WY_GROUP - 1) / WY_GROUP;
        const int R = wy_warps(0, D);
        AB_LAUNCH(dn_wy_state_kernel, ab_cuda_grid(gn * groups, 1, DN_MAX_BLOCKS), WY_GROUP * R, wy_state_smem(D, R),
                  st, k, W, U, g0, gn, N, L, D, M, C, Sb, sb0, states);
        if (out)
            AB_LAUNCH(dn_wy_out_kernel, ab_cuda_grid(gn * nc, 1, DN_MAX_BLOCKS), WY_THREADS, wy_out_smem(C, D), st,
                      q, k, U, Sb, sb0, g0, gn, N, L, D, M, C, out);
    }
    return 0;
}

/* ---- backward: the chunked (WY) form ----
 *
 * deltanet_wy.c's chunk backward in three kernels:
 *   prep    (per (slice, chunk)): X and P = lower_incl(Qn Kn^T) to the workspace.
 *   reverse (per (slice, WY_GROUP columns), chunks from the last): with G = dL/dS after
 *           the chunk, saved to the workspace for the third kernel, the columns' dU' =
 *           Kn G + P^T dO (to the workspace), dV = T^T dU' (dv itself), then
 *           G += Qn^T dO - Kn^T dV. Column m of G, dU' and dV needs column m only.
 *           G's rows split over the block's warps as the state kernel's S; the entries
 *           of dU' and dV over all its threads.
 *   chunk   (per (slice, chunk), in parallel, a workspace slot per block): the rest of
 *           the chunk's backward from its starting state S (saved by forward) and G:
 *           Vs = V - Kn S, U' = T Vs, dP = lower_incl(dO U'^T), dQn = dO S^T + dP Kn,
 *           dKn = dP^T Qn + U' G^T - dV S^T, dT = dU' Vs^T, through the inverse (dbeta,
 *           dKn += (dA + dA^T) Kn), then dq, dk through the normalisation.
 * Workspace: per slice (nb chunks) nb (2 C^2 + D M) + N M floats, slices in groups;
 * the chunk kernel's slots (wy_slot_floats each; none when they fit shared memory) use
 * at most half the cap, the groups what the slots leave. */
static size_t wy_bwd_slice_floats(int N, int C, int D, int M) {
    return (size_t)n_chunks(N, C) * (2 * (size_t)C * C + (size_t)D * M) + (size_t)N * M;
}

static size_t wy_slot_floats(int C, int D, int M) {
    return 4 * (size_t)C * D + 2 * (size_t)C * M + 3 * (size_t)C * C + 4 * (size_t)C;
}

/* The chunk kernel's matrices live in shared memory when they fit (C = 16, D = M = 64:
 * 27 KiB), else in per-block slots of the workspace, as many as about fill a GPU
 * (WY_MAX_SLOTS blocks, grid-stride over the chunks) so that they stay in its L2. */
#define WY_MAX_SLOTS 1024

static bool wy_slot_in_smem(int C, int D, int M) { return wy_slot_floats(C, D, M) * sizeof(float) <= WY_SMEM_MAX; }

static long long wy_slots(const attn_shape *s, int C) {
    if (wy_slot_in_smem(C, s->qk_dim, s->v_dim)) return 0;
    const size_t slot = wy_slot_floats(C, s->qk_dim, s->v_dim) * sizeof(float);
    long long n = (long long)(dn_cuda_ws_cap / 2 / slot), items = (long long)s->batch * s->heads * n_chunks(s->len, C);
    if (n < 1) n = 1;
    if (n > items) n = items;
    return n > WY_MAX_SLOTS ? WY_MAX_SLOTS : n;
}

static long long wy_bwd_group_slices(const attn_shape *s, int C) {
    const size_t per = wy_bwd_slice_floats(s->len, C, s->qk_dim, s->v_dim) * sizeof(float);
    const size_t slots = (size_t)wy_slots(s, C) * wy_slot_floats(C, s->qk_dim, s->v_dim) * sizeof(float);
    long long g = (long long)(dn_cuda_ws_cap > slots ? (dn_cuda_ws_cap - slots) / per : 0),
              bh = (long long)s->batch * s->heads;
    if (g < 1) g = 1;
    return g < bh ? g : bh;
}

static size_t wy_bwd_floats(const attn_shape *s, int C) {
    return (size_t)wy_slots(s, C) * wy_slot_floats(C, s->qk_dim, s->v_dim) +
           (size_t)wy_bwd_group_slices(s, C) * wy_bwd_slice_floats(s->len, C, s->qk_dim, s->v_dim);
}

__global__ void dn_wy_reverse_kernel(const float *q, const float *k, const float *beta, const float *dout,
                                     const float *Xw, const float *Pw, long long s0, long long ns, int N, int L, int D,
                                     int M, int C, float *Gs, float *dU, float *dv) {
    AB_DYN_SMEM(float, sm);
    const int lane = threadIdx.x % WY_GROUP, w = threadIdx.x / WY_GROUP, R = blockDim.x / WY_GROUP;
    float *sG = sm, *sx = sG + D * WY_GROUP, *r = sx + WY_ROWS * D, *red = r + WY_ROWS,
          *sT = red + R * WY_ROWS * WY_GROUP, *sP = sT + C * C, *bc = sP + C * C;
    const int groups = (M + WY_GROUP - 1) / WY_GROUP, nc = n_chunks(L, C), nb = n_chunks(N, C);
    const long long dm = (long long)D * M;
    for (long long item = blockIdx.x; item < ns * groups; item += gridDim.x) {
        const long long ls = item / groups, sl = s0 + ls;
        const int m0 = (int)(item % groups) * WY_GROUP, m = m0 + lane;
        const bool on = m < M;
        for (int d = w; d < D; d += R) sG[d * WY_GROUP + lane] = 0.0f;
        for (int c = nc - 1; c >= 0; c--) {
            const int t0 = c * C, n = L - t0 < C ? L - t0 : C;
            const long long row0 = sl * N + t0;
            const float *Xc = Xw + (ls * nb + c) * (long long)C * C, *Pc = Pw + (ls * nb + c) * (long long)C * C;
            float *dUc = dU + (ls * N + t0) * M;
            __syncthreads();
            for (int i = threadIdx.x; i < n; i += blockDim.x) bc[i] = beta[row0 + i];
            __syncthreads();
            for (int e = threadIdx.x; e < n * n; e += blockDim.x) sT[e] = Xc[e] * bc[e % n], sP[e] = Pc[e];
            if (on) {
                float *Gc = Gs + (ls * nb + c) * dm;
                for (int d = w; d < D; d += R) Gc[(long long)d * M + m] = sG[d * WY_GROUP + lane];
            }
            /* dU'[i] = Kn_i . G[:, m] + sum_{j >= i} P[j][i] dO[j][m] */
            for (int i0 = 0; i0 < n; i0 += WY_ROWS) {
                const int nr = n - i0 < WY_ROWS ? n - i0 : WY_ROWS;
                __syncthreads();
                wy_stage_normalised(k + (row0 + i0) * D, nr, D, sx, r);
                wy_cols_dot(sx, nr, D, sG, red);
                for (int e = threadIdx.x; e < nr * WY_GROUP; e += blockDim.x) {
                    const int i = i0 + e / WY_GROUP, mm = m0 + e % WY_GROUP;
                    if (mm >= M) continue;
                    float x = 0.0f;
                    for (int j = i; j < n; j++) x += sP[j * n + i] * dout[(row0 + j) * M + mm];
                    dUc[(long long)i * M + mm] = red[e] + x;
                }
            }
            /* dV[i] = sum_{r >= i} T[r][i] dU'[r] */
            __syncthreads();
            for (int e = threadIdx.x; e < n * WY_GROUP; e += blockDim.x) {
                const int i = e / WY_GROUP, mm = m0 + e % WY_GROUP;
                if (mm >= M) continue;
                float x = 0.0f;
                for (int rr = i; rr < n; rr++) x += sT[rr * n + i] * dUc[(long long)rr * M + mm];
                dv[(row0 + i) * M + mm] = x;
            }
            /* G += Qn^T dO - Kn^T dV */
            for (int pass = 0; pass < 2; pass++)
                for (int i0 = 0; i0 < n; i0 += WY_ROWS) {
                    const int nr = n - i0 < WY_ROWS ? n - i0 : WY_ROWS;
                    __syncthreads();
                    for (int e = threadIdx.x; e < nr * WY_GROUP; e += blockDim.x) {
                        const long long at = (row0 + i0 + e / WY_GROUP) * M + m0 + e % WY_GROUP;
                        red[e] = m0 + e % WY_GROUP >= M ? 0.0f : pass ? -dv[at] : dout[at];
                    }
                    wy_stage_normalised((pass ? k : q) + (row0 + i0) * D, nr, D, sx, r);
                    wy_cols_update(sx, nr, D, red, sG);
                }
        }
        __syncthreads();
    }
}

/* C (rows x cols, stride ldc) = alpha A B (+ C when acc), A: rows x K (or its transpose
 * when ta: A[l * lda + i]), B: K x cols (or transposed when tb); every thread calls; ends
 * with a barrier. For the chunk kernel's products in its workspace slot. */
__device__ void wy_mm(bool ta, bool tb, int rows, int cols, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, bool acc, float *Cm, int ldc) {
    for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
        const int i = e / cols, j = e % cols;
        float x = 0.0f;
        for (int l = 0; l < K; l++)
            x += (ta ? A[(long long)l * lda + i] : A[(long long)i * lda + l]) *
                 (tb ? B[(long long)j * ldb + l] : B[(long long)l * ldb + j]);
        Cm[(long long)i * ldc + j] = alpha * x + (acc ? Cm[(long long)i * ldc + j] : 0.0f);
    }
    __syncthreads();
}

__global__ void dn_wy_chunk_kernel(const float *q, const float *k, const float *v, const float *beta,
                                   const float *dout, const float *saved, const float *Xw, const float *Gs,
                                   const float *dU, const float *dv, long long s0, long long ns, int N, int L, int D,
                                   int M, int C, float *dq, float *dk, float *dbeta, float *ws, long long slot) {
    const int nc = n_chunks(L, C), nb = n_chunks(N, C);
    const long long dm = (long long)D * M;
    AB_DYN_SMEM(float, sm);
    float *w = ws ? ws + (long long)blockIdx.x * slot : sm;
    float *Kn = w, *Qn = Kn + C * D, *dKn = Qn + C * D, *dQn = dKn + C * D, *Vs = dQn + C * D, *U = Vs + C * M,
          *dP = U + C * M, *dT = dP + C * C, *tmp = dT + C * C, *rk = tmp + C * C, *rq = rk + C, *pk = rq + C,
          *pq = pk + C;
    for (long long item = blockIdx.x; item < ns * nc; item += gridDim.x) {
        const long long ls = item / nc, sl = s0 + ls;
        const int c = (int)(item % nc), t0 = c * C, n = L - t0 < C ? L - t0 : C;
        const long long row0 = sl * N + t0;
        const float *S = saved + (sl * nb + c) * dm, *G = Gs + (ls * nb + c) * dm;
        const float *X = Xw + (ls * nb + c) * (long long)C * C, *dUc = dU + (ls * N + t0) * M;
        const float *dO = dout + row0 * M, *dV = dv + row0 * M, *bt = beta + row0;
        wy_stage_normalised(k + row0 * D, n, D, Kn, rk);
        wy_stage_normalised(q + row0 * D, n, D, Qn, rq);
        /* Vs = V - Kn S;  U' = T Vs */
        wy_mm(false, false, n, M, D, -1.0f, Kn, D, S, M, false, Vs, M);
        for (int e = threadIdx.x; e < n * M; e += blockDim.x) Vs[e] += v[row0 * M + e];
        __syncthreads();
        for (int e = threadIdx.x; e < n * M; e += blockDim.x) {
            const int i = e / M, m = e % M;
            float x = 0.0f;
            for (int j = 0; j <= i; j++) x += X[i * n + j] * bt[j] * Vs[j * M + m];
            U[e] = x;
        }
        __syncthreads();
        /* dP = lower_incl(dO U'^T);  dT = dU' Vs^T */
        wy_mm(false, true, n, n, M, 1.0f, dO, M, U, M, false, dP, n);
        for (int e = threadIdx.x; e < n * n; e += blockDim.x)
            if (e % n > e / n) dP[e] = 0.0f;
        wy_mm(false, true, n, n, M, 1.0f, dUc, M, Vs, M, false, dT, n);
        /* dQn = dO S^T + dP Kn;  dKn = dP^T Qn + U' G^T - dV S^T */
        wy_mm(false, true, n, D, M, 1.0f, dO, M, S, M, false, dQn, D);
        wy_mm(false, false, n, D, n, 1.0f, dP, n, Kn, D, true, dQn, D);
        wy_mm(true, false, n, D, n, 1.0f, dP, n, Qn, D, false, dKn, D);
        wy_mm(false, true, n, D, M, 1.0f, U, M, G, M, true, dKn, D);
        wy_mm(false, true, n, D, M, -1.0f, dV, M, S, M, true, dKn, D);
        /* through T = X diag(beta): dX = dT diag(beta) (into dP), dbeta_i = sum_r dT[r][i] X[r][i] */
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            float x = 0.0f;
            for (int rr = i; rr < n; rr++) x += dT[rr * n + i] * X[rr * n + i];
            pk[i] = x;
        }
        for (int e = threadIdx.x; e < n * n; e += blockDim.x) dP[e] = dT[e] * bt[e % n];
        __syncthreads();
        /* dL = -X^T dX X^T (into dT);  dA = strictly_lower(diag(beta) dL);
         * dbeta_i += sum_{l < i} dL[i][l] A[i][l] */
        wy_mm(true, false, n, n, n, 1.0f, X, n, dP, n, false, tmp, n);
        wy_mm(false, true, n, n, n, -1.0f, tmp, n, X, n, false, dT, n);
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            float x = 0.0f;
            for (int l = 0; l < i; l++) {
                float a = 0.0f;
                for (int d = 0; d < D; d++) a += Kn[i * D + d] * Kn[l * D + d];
                x += dT[i * n + l] * a;
            }
            pk[i] += x;
        }
        __syncthreads();
        if (dbeta)
            for (int i = threadIdx.x; i < n; i += blockDim.x) dbeta[row0 + i] = pk[i];
        for (int e = threadIdx.x; e < n * n; e += blockDim.x) dT[e] = e % n < e / n ? dT[e] * bt[e / n] : 0.0f;
        __syncthreads();
        wy_mm(false, false, n, D, n, 1.0f, dT, n, Kn, D, true, dKn, D);
        wy_mm(true, false, n, D, n, 1.0f, dT, n, Kn, D, true, dKn, D);
        /* dx = (dxn - xn (xn . dxn)) / r, r = 1 / (the staged inverse) */
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            float a = 0.0f, b = 0.0f;
            for (int d = 0; d < D; d++) a += Qn[i * D + d] * dQn[i * D + d], b += Kn[i * D + d] * dKn[i * D + d];
            pq[i] = a, pk[i] = b;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < n * D; e += blockDim.x) {
            const int i = e / D;
            dq[row0 * D + e] = (dQn[e] - Qn[e] * pq[i]) * rq[i];
            dk[row0 * D + e] = (dKn[e] - Kn[e] * pk[i]) * rk[i];
        }
        __syncthreads();
    }
}

/* The chunked backward of slices [s0, s0 + ns) of valid length L. */
int dn_wy_cuda_backward(attn *a, const attn_shape *s, long long s0, long long ns, int L, const float *q,
                        const float *k, const float *v, const float *dout, const float *saved, float *dq, float *dk,
                        float *dv) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim, C = dn_chunk(a, N), nc = n_chunks(L, C), nb = n_chunks(N, C);
    const long long G = wy_bwd_group_slices(s, C), nslot = wy_slots(s, C), slot = (long long)wy_slot_floats(C, D, M);
    const long long groups = (M + WY_GROUP - 1) / WY_GROUP;
    const int R = wy_warps(C, D);
    float *slots = (float *)a->ws, *wg = slots + nslot * slot;
    cudaStream_t st = ab_cuda_stream();
    for (long long g0 = s0; g0 < s0 + ns; g0 += G) {
        const long long gn = s0 + ns - g0 < G ? s0 + ns - g0 : G;
        float *Xw = wg, *Pw = Xw + gn * nb * (long long)C * C, *Gs = Pw + gn * nb * (long long)C * C,
              *dU = Gs + gn * nb * (long long)D * M;
        AB_LAUNCH(dn_wy_prep_kernel, ab_cuda_grid(gn * nc, 1, DN_MAX_BLOCKS), WY_THREADS, wy_prep_smem(C, D), st, q,
                  k, v, a->aux, g0, gn, N, L, D, M, C, (float *)NULL, (float *)NULL, Xw, Pw);
        AB_LAUNCH(dn_wy_reverse_kernel, ab_cuda_grid(gn * groups, 1, DN_MAX_BLOCKS), WY_GROUP * R,
                  wy_reverse_smem(C, D, R), st, q, k, a->aux, dout, Xw, Pw, g0, gn, N, L, D, M, C, Gs, dU, dv);
        const long long items = gn * nc;
        const bool in_smem = nslot == 0;
        const unsigned grid = in_smem ? ab_cuda_grid(items, 1, DN_MAX_BLOCKS) : (unsigned)(items < nslot ? items : nslot);
        AB_LAUNCH(dn_wy_chunk_kernel, grid, WY_THREADS, in_smem ? (size_t)slot * sizeof(float) : 0, st, q, k, v,
                  a->aux, dout, saved, Xw, Gs, dU, dv, g0, gn, N, L, D, M, C, dq, dk, a->aux_grad,
                  in_smem ? (float *)NULL : slots, slot);
    }
    return 0;
}

size_t dn_wy_cuda_workspace_bytes(const attn_shape *s, int C) {
    const size_t f = (size_t)wy_group_slices(s, C) * wy_slice_floats(s->len, C, s->qk_dim, s->v_dim),
                 b = wy_bwd_floats(s, C);
    return (b > f ? b : f) * sizeof(float);
}
