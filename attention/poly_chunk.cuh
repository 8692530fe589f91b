/* The fused chunked kernels of the polynomial variant on CUDA: sim = (c + scale q.k)^2
 * through its exact features phi(x) = [c, sqrt(2 c scale) x, scale x_a x_b] (C = 1 + D +
 * D^2), with the structure of linear_chunk.cuh (blocks over (slice, segment), chunks
 * walked in order, segment states from a state kernel and lc_scan_kernel), and two
 * differences that its size forces:
 *
 * - within a chunk the C features are never formed: A = (c + scale Q K^T)^2 (masked)
 *   comes from the T x T product of q and k (tensor cores in tf32), and the gradient
 *   through it likewise (B' = 2 scale (c + scale Q K^T) .* dA gives dq += B' K, dk +=
 *   B'^T Q);
 * - the state S [C x M] (+ z) is large: it lives in global memory (the block's segment
 *   record, L2-resident while the block walks) and is streamed through shared memory in
 *   slabs of features: slab 0 = [c, lin x] (W0p = 1 + D rounded up to 16 rows), slab
 *   1 + a = scale x_a x_b for b >= a rounded down to 16, the quadratic features taken
 *   symmetric (weights 2 for b > a, 1 for b = a, 0 below, on the query side): 2640 rows
 *   at D = 64 instead of 4161, 0.68 MB of state at M = 64. A slab's features for the
 *   chunk's rows are computed into a T x W shared tile from the q, k rows, multiplied
 *   (tile products), and dropped; the slab's state is read, and (walking) updated and
 *   written back. The recurrent state (a prefill's) gets the CPU's full layout.
 *
 * Per chunk of T rows the state traffic is 2 C M floats (read and write) against
 * T (2 D + 2 M) of q, k, v, out: the chunk should be as large as the shared tiles allow
 * (the backward's kernels hold more tiles: 32 rows at D = M = 64; the forward 64). */
#ifndef ATTN_POLY_CHUNK_CUH
#define ATTN_POLY_CHUNK_CUH

#include "linear_chunk.cuh"

struct lp_smem {
    int Xq, Xk, dX, V, G, O, A, B, Fq, Fk, dF, Sx, zx, Rx, rx, rows, total;
};

/* Slab geometry. The quadratic features are taken symmetric: (q.k)^2 = sum_a sum_b
 * w_ab q_a q_b k_a k_b with w_aa = 1, w_ab = 2 (b > a), 0 (b < a), the weights on the
 * query side only; slab 1 + a holds the features b >= a16 = a rounded down to 16 (the
 * few b < a of its first 16-block with weight 0), so D = 64 takes 2560 quadratic rows
 * instead of 4096. Width (padded) and first record row of slab s: */
__host__ __device__ inline int lp_width(const lc_args &a, int s) { return s == 0 ? a.W0p : a.Dp - 16 * ((s - 1) / 16); }
__host__ __device__ inline int lp_row0(const lc_args &a, int s) {
    if (s == 0) return 0;
    const int n = s - 1, q = n / 16, rem = n % 16; /* the quadratic slabs before it */
    return a.W0p + 16 * q * a.Dp - 128 * q * (q - 1) + rem * (a.Dp - 16 * q);
}
/* query weight of feature b in slab 1 + qa */
__device__ __forceinline__ float lp_weight(int qa, int b) { return b == qa ? 1.0f : b > qa ? 2.0f : 0.0f; }

/* ldC is the slab tiles' leading dimension (W0p + pad). */
__host__ __device__ inline lp_smem lp_layout(const lc_args &a, int kind) {
    lp_smem s;
    int off = 0;
    auto take = [&](bool use, int n) {
        if (!use) return -1;
        const int o = off;
        off += (int)lc_round8(n);
        return o;
    };
    const int XT = a.T * a.ldD, FT = a.T * a.ldC, VT = a.T * a.ldM, ST = a.W0p * a.ldM, TT = a.T * a.ldT;
    const bool st = kind == LC_K_STATE, dq = kind == LC_K_DQ, dkv = kind == LC_K_DKV, bwd = dq || dkv;
    s.Xq = take(!st, XT);
    s.Xk = take(true, XT);
    s.dX = take(bwd, XT);
    s.V = take(true, VT);
    s.G = take(bwd, VT);
    s.O = take(!st, VT);
    s.A = take(!st, TT);
    s.B = take(bwd, TT);
    s.Fq = take(!st, FT);
    s.Fk = take(true, FT);
    s.dF = take(bwd, FT);
    s.Sx = take(!dkv, ST);
    s.zx = take(!dkv, a.W0p);
    s.Rx = take(bwd, ST);
    s.rx = take(bwd, a.W0p);
    s.rows = take(true, LC_RW_N * a.T);
    s.total = off;
    return s;
}

/* Slab s's features of rows [0, T) of X into F (ldC), zero for invalid rows and padding:
 * slab 0 [c, lin x], slab 1 + a scale x_a x_b for b >= a16 (feature_maps.c's
 * poly_forward floats), times w_ab for queries. */
__device__ __forceinline__ void lp_features(const lc_args &a, const float *X, float *F, int s, int rows, bool query) {
    const int W = lp_width(a, s), a16 = s == 0 ? 0 : 16 * ((s - 1) / 16);
    for (int e = threadIdx.x; e < a.T * W; e += blockDim.x) {
        const int i = e / W, f = e - i * W, b = a16 + f;
        const float *x = X + i * a.ldD;
        float y = 0.0f;
        if (i < rows) {
            if (s == 0) y = f == 0 ? a.pc : f <= a.D ? a.plin * x[f - 1] : 0.0f;
            else if (b < a.D) y = (a.pscale * x[s - 1]) * x[b] * (query ? lp_weight(s - 1, b) : 1.0f);
        }
        F[i * a.ldC + f] = y;
    }
}

/* dX rows += (d phi_slab / d x)^T dF rows (slab s): slab 0 lin dF[1 + d]; slab 1 + a
 * scale w x_a dF[b = d], and at d = a also scale sum_b w x_b dF[b] (w: the query
 * weights, or 1 for keys). */
__device__ __forceinline__ void lp_features_backward(const lc_args &a, const float *X, const float *dF, float *dX,
                                                     int s, int rows, bool query) {
    const int qa = s - 1, a16 = s == 0 ? 0 : 16 * (qa / 16);
    for (int e = threadIdx.x; e < rows * a.D; e += blockDim.x) {
        const int i = e / a.D, d = e - i * a.D;
        const float *x = X + i * a.ldD, *g = dF + i * a.ldC;
        float v = 0.0f;
        if (s == 0) {
            v = a.plin * g[1 + d];
        } else {
            if (d >= a16) v = a.pscale * x[qa] * g[d - a16] * (query ? lp_weight(qa, d) : 1.0f);
            if (d == qa) {
                float dot = 0.0f;
                for (int b = a16; b < a.D; b++) dot = fmaf(x[b] * (query ? lp_weight(qa, b) : 1.0f), g[b - a16], dot);
                v += a.pscale * dot;
            }
        }
        dX[i * a.ldD + d] += v;
    }
}

/* A = (c + scale Q K^T)^2 on the chunk's valid lower triangle (zero elsewhere); keeps
 * P = c + scale Q K^T in B when B is given (the backward's B' needs it). Two phases:
 * the product into A, then the map. Ends with a barrier. */
template <int P>
__device__ __forceinline__ void lp_intra(const lc_args &a, const float *Xq, const float *Xk, float *A, float *B,
                                         int rows) {
    lc_mm<P, false, true>(a.T, a.T, a.Dp, Xq, a.ldD, Xk, a.ldD, A, a.ldT, false, true);
    __syncthreads();
    for (int e = threadIdx.x; e < a.T * a.T; e += blockDim.x) {
        const int i = e / a.T, j = e - i * a.T;
        const bool ok = j <= i && i < rows;
        const float p = a.pc + a.pscale * A[i * a.ldT + j];
        if (B) B[i * a.ldT + j] = ok ? p : 0.0f;
        A[i * a.ldT + j] = ok ? p * p : 0.0f;
    }
    __syncthreads();
}

/* S slab (W rows of Mp) and z slab between a record (row0) and shared memory. */
__device__ __forceinline__ void lp_slab_in(const lc_args &a, const float *rec, int row0, int W, float *S, float *z) {
    const long long zoff = (long long)a.Cp * a.Mp;
    for (int e = threadIdx.x; e < W * a.Mp; e += blockDim.x) S[(e / a.Mp) * a.ldM + e % a.Mp] = rec[(long long)row0 * a.Mp + e];
    for (int c = threadIdx.x; c < W; c += blockDim.x) z[c] = rec[zoff + row0 + c];
}

__device__ __forceinline__ void lp_slab_out(const lc_args &a, float *rec, int row0, int W, const float *S, const float *z) {
    const long long zoff = (long long)a.Cp * a.Mp;
    for (int e = threadIdx.x; e < W * a.Mp; e += blockDim.x) rec[(long long)row0 * a.Mp + e] = S[(e / a.Mp) * a.ldM + e % a.Mp];
    for (int c = threadIdx.x; c < W; c += blockDim.x) rec[zoff + row0 + c] = z[c];
}

/* record (Cp rows of Mp, then Cp) = 0 */
__device__ __forceinline__ void lp_rec_zero(const lc_args &a, float *rec) {
    const long long n = (long long)a.Cp * a.Mp + a.Cp;
    for (long long e = threadIdx.x; e < n; e += blockDim.x) rec[e] = 0.0f;
}

/* S += F^T V, z += colsum F (slab of width W). */
template <int P>
__device__ __forceinline__ void lp_update(const lc_args &a, const float *F, const float *V, int W, float *S, float *z) {
    lc_mm<P, true, false>(W, a.Mp, a.T, F, a.ldC, V, a.ldM, S, a.ldM, true);
    for (int c = threadIdx.x; c < W; c += blockDim.x) {
        float s = z[c];
        for (int i = 0; i < a.T; i++) s += F[i * a.ldC + c];
        z[c] = s;
    }
}

/* O += F S (slab), den += F z (row arrays DEN). */
template <int P>
__device__ __forceinline__ void lp_apply(const lc_args &a, const float *F, const float *S, const float *z, int W,
                                         float *O, float *rw) {
    lc_mm<P, false, false>(a.T, a.Mp, W, F, a.ldC, S, a.ldM, O, a.ldM, true);
    for (int i = threadIdx.x; i < a.T; i += blockDim.x) {
        float s = rw[LC_RW_DEN * a.T + i];
        for (int c = 0; c < W; c++) s = fmaf(F[i * a.ldC + c], z[c], s);
        rw[LC_RW_DEN * a.T + i] = s;
    }
}

/* The slabs: 1 + D of them. */
__device__ __forceinline__ int lp_nslabs(const lc_args &a) { return 1 + a.D; }

/* A segment's own state (written into its record, walked chunk by chunk). */
template <int P> __global__ void lp_state_kernel(lc_args a) {
    AB_DYN_SMEM(float, sm);
    const lp_smem ly = lp_layout(a, LC_K_STATE);
    float *Xk = sm + ly.Xk, *V = sm + ly.V, *Fk = sm + ly.Fk, *S = sm + ly.Sx, *z = sm + ly.zx;
    const long long items = a.ns * a.nseg;
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
        const long long sl = item / a.nseg;
        const int seg = (int)(item % a.nseg), c0 = seg * a.cps, c1 = min(a.nchunks, c0 + a.cps);
        float *rec = a.sst + item * a.E;
        lp_rec_zero(a, rec);
        __syncthreads();
        for (int ch = c0; ch < c1; ch++) {
            const int rows = lc_rows(a, ch);
            const long long r = sl * a.N + (long long)ch * a.T;
            lc_load(Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, a.T);
            lc_load(V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, a.T);
            __syncthreads();
            for (int s = 0; s < lp_nslabs(a); s++) {
                const int W = lp_width(a, s), r0 = lp_row0(a, s);
                lp_features(a, Xk, Fk, s, rows, false);
                lp_slab_in(a, rec, r0, W, S, z);
                __syncthreads();
                lp_update<P>(a, Fk, V, W, S, z);
                __syncthreads();
                lp_slab_out(a, rec, r0, W, S, z);
                __syncthreads();
            }
        }
    }
}

/* The record a block walks: causal, its segment's (the prefix after the scan; zeroed
 * here when there is one segment: no state kernel ran); non-causal, the slice's total. */
__device__ __forceinline__ float *lp_walk_record(const lc_args &a, float *recs, float *tots, long long item,
                                                 long long sl) {
    return a.causal ? recs + item * a.E : tots + sl * a.E;
}

template <int P> __global__ void lp_fwd_kernel(lc_args a) {
    AB_DYN_SMEM(float, sm);
    const lp_smem ly = lp_layout(a, LC_K_FWD);
    float *Xq = sm + ly.Xq, *Xk = sm + ly.Xk, *V = sm + ly.V, *O = sm + ly.O, *A = sm + ly.A, *Fq = sm + ly.Fq;
    float *Fk = sm + ly.Fk, *S = sm + ly.Sx, *z = sm + ly.zx, *rw = sm + ly.rows;
    const int T = a.T;
    const bool causal = a.causal;
    const long long items = a.ns * a.nseg;
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
        const long long sl = item / a.nseg;
        const int seg = (int)(item % a.nseg), c0 = seg * a.cps, c1 = min(a.nchunks, c0 + a.cps);
        float *rec = lp_walk_record(a, a.sst, a.tot, item, sl);
        if (causal && a.nseg == 1) lp_rec_zero(a, rec);
        __syncthreads();
        for (int ch = c0; ch < c1; ch++) {
            const int rows = lc_rows(a, ch);
            const long long r = sl * a.N + (long long)ch * T;
            const bool update = causal && ch + 1 < c1;
            lc_load(Xq, a.ldD, a.q + r * a.D, a.D, a.Dp, rows, T);
            lc_load(Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, T);
            lc_load(V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, T);
            __syncthreads();
            if (causal) {
                lp_intra<P>(a, Xq, Xk, A, NULL, rows);
                lc_mm<P, false, false>(T, a.Mp, T, A, a.ldT, V, a.ldM, O, a.ldM, false, false, LC_K_LOWER);
            } else {
                for (int e = threadIdx.x; e < T * a.Mp; e += blockDim.x) O[(e / a.Mp) * a.ldM + e % a.Mp] = 0.0f;
            }
            for (int i = threadIdx.x; i < T; i += blockDim.x) {
                float s = 0.0f;
                if (causal)
                    for (int j = 0; j < T; j++) s += A[i * a.ldT + j];
                rw[LC_RW_DEN * T + i] = s;
            }
            __syncthreads();
            for (int s = 0; s < lp_nslabs(a); s++) {
                const int W = lp_width(a, s), r0 = lp_row0(a, s);
                lp_features(a, Xq, Fq, s, rows, true);
                if (update) lp_features(a, Xk, Fk, s, rows, false);
                lp_slab_in(a, rec, r0, W, S, z);
                __syncthreads();
                lp_apply<P>(a, Fq, S, z, W, O, rw);
                __syncthreads();
                if (update) {
                    lp_update<P>(a, Fk, V, W, S, z);
                    __syncthreads();
                    lp_slab_out(a, rec, r0, W, S, z);
                    __syncthreads();
                }
            }
            float *out = a.out + r * a.M;
            for (int e = threadIdx.x; e < rows * a.M; e += blockDim.x) {
                const int i = e / a.M, mm = e - i * a.M;
                out[e] = O[i * a.ldM + mm] * (float)(1.0 / ((double)rw[LC_RW_DEN * T + i] + a.eps));
            }
            __syncthreads();
        }
    }
}

/* Backward pass 1 (chunks in order): O and den again (the intra-chunk part and every
 * slab), inv and gd per position, G; then per slab dphiQ = G S^T - gd z^T -> dq, the
 * state walked on, and the segment's own R = sum phiQ^T G into its R record (want_r);
 * the intra-chunk part of dq: B' K with B' = 2 scale P .* (G V^T - gd 1^T), masked. */
template <int P> __global__ void lp_dq_kernel(lc_args a, int want_r) {
    AB_DYN_SMEM(float, sm);
    const lp_smem ly = lp_layout(a, LC_K_DQ);
    float *Xq = sm + ly.Xq, *Xk = sm + ly.Xk, *dX = sm + ly.dX, *V = sm + ly.V, *G = sm + ly.G, *O = sm + ly.O;
    float *A = sm + ly.A, *B = sm + ly.B, *Fq = sm + ly.Fq, *Fk = sm + ly.Fk, *dF = sm + ly.dF, *S = sm + ly.Sx;
    float *z = sm + ly.zx, *R = sm + ly.Rx, *rr = sm + ly.rx, *rw = sm + ly.rows;
    const int T = a.T;
    const bool causal = a.causal;
    const long long items = a.ns * a.nseg;
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
        const long long sl = item / a.nseg;
        const int seg = (int)(item % a.nseg), c0 = seg * a.cps, c1 = min(a.nchunks, c0 + a.cps);
        float *rec = lp_walk_record(a, a.sst, a.tot, item, sl), *rrec = a.rst + item * a.E;
        if (causal && a.nseg == 1) lp_rec_zero(a, rec);
        if (want_r) lp_rec_zero(a, rrec);
        __syncthreads();
        for (int ch = c0; ch < c1; ch++) {
            const int rows = lc_rows(a, ch);
            const long long r = sl * a.N + (long long)ch * T, pos = (long long)ch * T;
            const bool update = causal && ch + 1 < c1;
            lc_load(Xq, a.ldD, a.q + r * a.D, a.D, a.Dp, rows, T);
            lc_load(Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, T);
            lc_load(V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, T);
            lc_load(G, a.ldM, a.dout + r * a.M, a.M, a.Mp, rows, T);
            for (int e = threadIdx.x; e < T * a.Dp; e += blockDim.x) dX[(e / a.Dp) * a.ldD + e % a.Dp] = 0.0f;
            __syncthreads();
            if (causal) {
                lp_intra<P>(a, Xq, Xk, A, B, rows);
                lc_mm<P, false, false>(T, a.Mp, T, A, a.ldT, V, a.ldM, O, a.ldM, false, false, LC_K_LOWER);
            } else {
                for (int e = threadIdx.x; e < T * a.Mp; e += blockDim.x) O[(e / a.Mp) * a.ldM + e % a.Mp] = 0.0f;
            }
            for (int i = threadIdx.x; i < T; i += blockDim.x) {
                float s = 0.0f;
                if (causal)
                    for (int j = 0; j < T; j++) s += A[i * a.ldT + j];
                rw[LC_RW_DEN * T + i] = s;
            }
            __syncthreads();
            for (int s = 0; s < lp_nslabs(a); s++) { /* O, den: the state part */
                const int W = lp_width(a, s);
                lp_features(a, Xq, Fq, s, rows, true);
                lp_slab_in(a, rec, lp_row0(a, s), W, S, z);
                __syncthreads();
                lp_apply<P>(a, Fq, S, z, W, O, rw);
                __syncthreads();
            }
            { /* per row: inv, gd (linear.c's grad_rows), G's last column */
                const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
                for (int i = threadIdx.x >> 5; i < T; i += nw) {
                    double dn = 0;
                    for (int mm = lane; mm < a.M; mm += 32) dn += (double)G[i * a.ldM + mm] * O[i * a.ldM + mm];
                    dn = fm_warp_sum_d(dn);
                    if (lane == 0) {
                        float iv = 0.0f, g = 0.0f;
                        if (i < rows) {
                            const double rr_ = 1.0 / ((double)rw[LC_RW_DEN * T + i] + a.eps);
                            iv = (float)rr_;
                            g = (float)(dn * rr_ * rr_);
                            a.inv[sl * a.N + pos + i] = iv;
                            a.gd[sl * a.N + pos + i] = g;
                        }
                        rw[LC_RW_INV * T + i] = iv;
                        rw[LC_RW_GCOL * T + i] = -g;
                    }
                }
            }
            __syncthreads();
            for (int e = threadIdx.x; e < T * a.Mp; e += blockDim.x) {
                const int i = e / a.Mp, mm = e - i * a.Mp;
                G[i * a.ldM + mm] *= rw[LC_RW_INV * T + i];
            }
            __syncthreads();
            if (causal) { /* dA = G V^T - gd 1^T; B' = 2 scale P .* dA (masked) -> dq += B' K */
                lc_mm<P, false, true>(T, T, a.Mp, G, a.ldM, V, a.ldM, A, a.ldT, false, true);
                __syncthreads();
                for (int e = threadIdx.x; e < T * T; e += blockDim.x) {
                    const int i = e / T, j = e - i * T;
                    const float dA = j <= i ? A[i * a.ldT + j] + rw[LC_RW_GCOL * T + i] : 0.0f;
                    B[i * a.ldT + j] = 2.0f * a.pscale * B[i * a.ldT + j] * dA;
                }
                __syncthreads();
                lc_mm<P, false, false>(T, a.Dp, T, B, a.ldT, Xk, a.ldD, dX, a.ldD, true, false, LC_K_LOWER);
                __syncthreads();
            }
            for (int s = 0; s < lp_nslabs(a); s++) {
                const int W = lp_width(a, s), r0 = lp_row0(a, s);
                lp_features(a, Xq, Fq, s, rows, true);
                if (update) lp_features(a, Xk, Fk, s, rows, false);
                lp_slab_in(a, rec, r0, W, S, z);
                if (want_r) lp_slab_in(a, rrec, r0, W, R, rr);
                __syncthreads();
                lc_mm<P, false, true>(T, W, a.Mp, G, a.ldM, S, a.ldM, dF, a.ldC, false);
                __syncthreads();
                for (int e = threadIdx.x; e < T * W; e += blockDim.x) {
                    const int i = e / W, c = e - i * W;
                    dF[i * a.ldC + c] += rw[LC_RW_GCOL * T + i] * z[c];
                }
                __syncthreads();
                lp_features_backward(a, Xq, dF, dX, s, rows, true);
                if (update) lp_update<P>(a, Fk, V, W, S, z);
                if (want_r) {
                    lc_mm<P, true, false>(W, a.Mp, T, Fq, a.ldC, G, a.ldM, R, a.ldM, true);
                    for (int c = threadIdx.x; c < W; c += blockDim.x) {
                        float v = rr[c];
                        for (int i = 0; i < T; i++) v = fmaf(Fq[i * a.ldC + c], rw[LC_RW_GCOL * T + i], v);
                        rr[c] = v;
                    }
                }
                __syncthreads();
                if (update) lp_slab_out(a, rec, r0, W, S, z);
                if (want_r) lp_slab_out(a, rrec, r0, W, R, rr);
                __syncthreads();
            }
            float *dq = a.dq + r * a.D;
            for (int e = threadIdx.x; e < rows * a.D; e += blockDim.x) dq[e] = dX[(e / a.D) * a.ldD + e % a.D];
            __syncthreads();
        }
    }
}

/* Backward pass 2 (chunks in reverse): per slab dphiK = V R^T + 1 r^T -> dk, dV += phiK
 * R; intra-chunk: dV += A^T G, dk += B'^T Q; R walked on (the R record: the suffix after
 * the scan, or zeroed when there is one segment; non-causal: the total). */
template <int P> __global__ void lp_dkv_kernel(lc_args a) {
    AB_DYN_SMEM(float, sm);
    const lp_smem ly = lp_layout(a, LC_K_DKV);
    float *Xq = sm + ly.Xq, *Xk = sm + ly.Xk, *dX = sm + ly.dX, *V = sm + ly.V, *G = sm + ly.G, *O = sm + ly.O;
    float *A = sm + ly.A, *B = sm + ly.B, *Fq = sm + ly.Fq, *Fk = sm + ly.Fk, *dF = sm + ly.dF;
    float *R = sm + ly.Rx, *rr = sm + ly.rx, *rw = sm + ly.rows;
    const int T = a.T;
    const bool causal = a.causal;
    const long long items = a.ns * a.nseg;
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
        const long long sl = item / a.nseg;
        const int seg = (int)(item % a.nseg), c0 = seg * a.cps, c1 = min(a.nchunks, c0 + a.cps);
        float *rec = lp_walk_record(a, a.rst, a.tot, item, sl);
        if (causal && a.nseg == 1) lp_rec_zero(a, rec);
        __syncthreads();
        for (int ch = c1 - 1; ch >= c0; ch--) {
            const int rows = lc_rows(a, ch);
            const long long r = sl * a.N + (long long)ch * T, pos = (long long)ch * T;
            const bool update = causal && ch > c0;
            lc_load(Xq, a.ldD, a.q + r * a.D, a.D, a.Dp, rows, T);
            lc_load(Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, T);
            lc_load(V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, T);
            if (causal) {
                const float *dout = a.dout + r * a.M, *iv = a.inv + sl * a.N + pos;
                for (int e = threadIdx.x; e < T * a.Mp; e += blockDim.x) {
                    const int i = e / a.Mp, mm = e - i * a.Mp;
                    G[i * a.ldM + mm] = i < rows && mm < a.M ? dout[(long long)i * a.M + mm] * iv[i] : 0.0f;
                }
                for (int i = threadIdx.x; i < T; i += blockDim.x)
                    rw[LC_RW_GCOL * T + i] = i < rows ? -a.gd[sl * a.N + pos + i] : 0.0f;
            }
            for (int e = threadIdx.x; e < T * a.Dp; e += blockDim.x) dX[(e / a.Dp) * a.ldD + e % a.Dp] = 0.0f;
            __syncthreads();
            if (causal) {
                lp_intra<P>(a, Xq, Xk, A, B, rows);
                /* dV = A^T G; then dA = G V^T - gd 1^T over A */
                lc_mm<P, true, false>(T, a.Mp, T, A, a.ldT, G, a.ldM, O, a.ldM, false, false, LC_K_UPPER);
                __syncthreads();
                lc_mm<P, false, true>(T, T, a.Mp, G, a.ldM, V, a.ldM, A, a.ldT, false, true);
                __syncthreads();
                for (int e = threadIdx.x; e < T * T; e += blockDim.x) {
                    const int i = e / T, j = e - i * T;
                    const float dA = j <= i ? A[i * a.ldT + j] + rw[LC_RW_GCOL * T + i] : 0.0f;
                    B[i * a.ldT + j] = 2.0f * a.pscale * B[i * a.ldT + j] * dA;
                }
                __syncthreads();
                lc_mm<P, true, false>(T, a.Dp, T, B, a.ldT, Xq, a.ldD, dX, a.ldD, true, false, LC_K_UPPER);
            } else {
                for (int e = threadIdx.x; e < T * a.Mp; e += blockDim.x) O[(e / a.Mp) * a.ldM + e % a.Mp] = 0.0f;
            }
            __syncthreads();
            for (int s = 0; s < lp_nslabs(a); s++) {
                const int W = lp_width(a, s), r0 = lp_row0(a, s);
                lp_features(a, Xk, Fk, s, rows, false);
                if (update) lp_features(a, Xq, Fq, s, rows, true);
                lp_slab_in(a, rec, r0, W, R, rr);
                __syncthreads();
                lc_mm<P, false, true>(T, W, a.Mp, V, a.ldM, R, a.ldM, dF, a.ldC, false);
                lc_mm<P, false, false>(T, a.Mp, W, Fk, a.ldC, R, a.ldM, O, a.ldM, true);
                __syncthreads();
                for (int e = threadIdx.x; e < rows * W; e += blockDim.x) {
                    const int j = e / W, c = e - j * W;
                    dF[j * a.ldC + c] += rr[c];
                }
                __syncthreads();
                lp_features_backward(a, Xk, dF, dX, s, rows, false);
                if (update) {
                    lc_mm<P, true, false>(W, a.Mp, T, Fq, a.ldC, G, a.ldM, R, a.ldM, true);
                    for (int c = threadIdx.x; c < W; c += blockDim.x) {
                        float v = rr[c];
                        for (int i = 0; i < T; i++) v = fmaf(Fq[i * a.ldC + c], rw[LC_RW_GCOL * T + i], v);
                        rr[c] = v;
                    }
                }
                __syncthreads();
                if (update) {
                    lp_slab_out(a, rec, r0, W, R, rr);
                    __syncthreads();
                }
            }
            float *dk = a.dk + r * a.D, *dv = a.dv + r * a.M;
            for (int e = threadIdx.x; e < rows * a.D; e += blockDim.x) dk[e] = dX[(e / a.D) * a.ldD + e % a.D];
            for (int e = threadIdx.x; e < rows * a.M; e += blockDim.x) dv[e] = O[(e / a.M) * a.ldM + e % a.M];
            __syncthreads();
        }
    }
}

/* ---- host side ---- */

struct lp_cfg {
    int prec, T, threads;
    long long target;
    int D, M;
    double eps, c, scale;
};

static inline lc_args lp_make_args(const lp_cfg &c, long long ns, int N, int L, bool causal) {
    lc_cfg lc = {LC_MAP_ELU, c.prec, c.T, c.threads, c.target, c.D, c.M, 1 + c.D + c.D * c.D, c.eps, NULL, NULL, 0};
    lc_args a = lc_make_args(lc, ns, N, L, causal);
    a.poly = 1;
    a.W0p = lc_round16(1 + c.D);
    a.Cp = lp_row0(a, 1 + c.D); /* state rows: the slabs */
    a.ldC = a.W0p + (c.prec == LC_FP32 ? 1 : 4);
    a.E = lc_round8((long long)a.Cp * a.Mp + a.Cp + 1);
    a.pc = (float)c.c;
    a.pscale = (float)c.scale;
    a.plin = (float)sqrt(2.0 * c.c * c.scale);
    return a;
}

static inline size_t lp_smem_bytes(const lp_cfg &c, int kind) {
    lc_args a = lp_make_args(c, 1, c.T, c.T, true);
    return (size_t)lp_layout(a, kind).total * sizeof(float);
}

/* Workspace floats: S records and R records (each at most min(BH * chunks, target + BH)
 * of them), the totals, inv and gd (two floats per position). */
static inline size_t lp_workspace_floats(const lp_cfg &c, long long BH, int N) {
    lc_args a = lp_make_args(c, 1, N, N, true);
    const long long nch = (N + c.T - 1) / c.T;
    long long recs = BH * nch;
    if (recs > c.target + BH) recs = c.target + BH;
    auto al = [](long long n) { return (size_t)((n + 63) / 64 * 64); };
    return 2 * al(recs * a.E) + al(BH * a.E) + 2 * al(BH * (long long)N);
}

static inline void lp_carve(const lp_cfg &c, long long BH, int N, float *ws, lc_args *a) {
    const long long nch = (N + c.T - 1) / c.T;
    long long recs = BH * nch;
    if (recs > c.target + BH) recs = c.target + BH;
    auto al = [](long long n) { return (size_t)((n + 63) / 64 * 64); };
    float *p = ws;
    a->sst = p, p += al(recs * a->E);
    a->rst = p, p += al(recs * a->E);
    a->tot = p, p += al(BH * a->E);
    a->inv = p, p += al(BH * (long long)N);
    a->gd = p;
    a->kc = NULL;
}

template <int P> struct lp_kernels {
    static std::atomic<size_t> &allowed(int kind) {
        static std::atomic<size_t> lim[4] = {{48 * 1024}, {48 * 1024}, {48 * 1024}, {48 * 1024}};
        return lim[kind];
    }
    static size_t smem(const lc_args &a, int kind) { return (size_t)lp_layout(a, kind).total * sizeof(float); }
    static int states(const lc_args &a, int threads) {
        const long long items = a.ns * a.nseg, n_e = (long long)a.Cp * a.Mp + a.Cp;
        AB_TRY(lc_launch(&lp_state_kernel<P>, allowed(LC_K_STATE), items, threads, smem(a, LC_K_STATE), a));
        return lc_scan(a, n_e, a.causal ? 0 : 2, false);
    }
    static int forward(const lc_args &a, int threads, bool want_out) {
        if (!a.causal || a.nseg > 1 || a.state) AB_TRY(states(a, threads));
        if (want_out)
            AB_TRY(lc_launch(&lp_fwd_kernel<P>, allowed(LC_K_FWD), a.ns * a.nseg, threads, smem(a, LC_K_FWD), a));
        return 0;
    }
    static int backward(const lc_args &a0, int threads) {
        lc_args a = a0;
        a.state = a.state_kls = NULL;
        const long long items = a.ns * a.nseg, n_e = (long long)a.Cp * a.Mp + a.Cp;
        if (!a.causal || a.nseg > 1) AB_TRY(states(a, threads));
        const bool want_r = !a.causal || a.nseg > 1;
        AB_TRY(lc_launch(&lp_dq_kernel<P>, allowed(LC_K_DQ), items, threads, smem(a, LC_K_DQ), a, (int)want_r));
        if (want_r) {
            lc_args b = a;
            b.sst = a.rst; /* the scan of the R records */
            AB_TRY(lc_scan(b, n_e, a.causal ? 1 : 2, false));
        }
        AB_TRY(lc_launch(&lp_dkv_kernel<P>, allowed(LC_K_DKV), items, threads, smem(a, LC_K_DKV), a));
        return 0;
    }
};

static inline int lp_forward(const lp_cfg &c, float *ws, long long ns, int N, int L, bool causal, const float *q,
                             const float *k, const float *v, float *out, float *state) {
    lc_args a = lp_make_args(c, ns, N, L, causal);
    lp_carve(c, ns, N, ws, &a);
    a.q = q, a.k = k, a.v = v, a.out = out, a.state = state;
    return c.prec == LC_FP32 ? lp_kernels<LC_FP32>::forward(a, c.threads, out != NULL)
                             : lp_kernels<LC_TF32>::forward(a, c.threads, out != NULL);
}

static inline int lp_backward(const lp_cfg &c, float *ws, long long ns, int N, int L, bool causal, const float *q,
                              const float *k, const float *v, const float *dout, float *dq, float *dk, float *dv) {
    lc_args a = lp_make_args(c, ns, N, L, causal);
    lp_carve(c, ns, N, ws, &a);
    a.q = q, a.k = k, a.v = v, a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv;
    return c.prec == LC_FP32 ? lp_kernels<LC_FP32>::backward(a, c.threads) : lp_kernels<LC_TF32>::backward(a, c.threads);
}

#endif
