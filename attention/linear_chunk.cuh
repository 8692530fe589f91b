/* The fused chunked kernels of linear attention on CUDA (linear_cuda.cu's path for the
 * elu, taylor and favor maps; the kernel lab's attention/lab/linear_chunk.cu includes
 * this header, so it measures the code that ships). C++ (CUDA) only. The design, its
 * memory traffic and what to try on a GPU are at the top of linear_cuda.cu.
 *
 * Per slice (b, h) the positions 0..L-1 are cut into chunks of T rows (T a multiple of
 * 16) and the chunks into `nseg` segments of `cps` consecutive chunks. One block works on
 * one (slice, segment) and walks its chunks in order (backward's second pass: in
 * reverse), carrying the running state S [Cp x Mp] (+ the normaliser's z [Cp]) in shared
 * memory; the state entering a segment comes from a small scan over the segments' own
 * states (lc_state_kernel, lc_scan_kernel), so no per-chunk state ever reaches global
 * memory. Within a chunk everything is a product of tiles in shared memory
 * (lc_mm): fp32 on register tiles, or tf32 on the tensor cores (nvcuda::wmma m16n16k8).
 * The features are computed into shared memory from the q, k rows (never into global
 * memory); the feature map is a template parameter (lc_elu, lc_taylor, lc_favor: a new
 * map is one more such struct).
 *
 * Kernels (all: a 1-D grid over (slice, segment) items, blockDim.x a multiple of 32):
 *   lc_state_kernel  a segment's own state sum_j phi(k_j) v_j^T, z = sum_j phi(k_j), and
 *                    for a log-scaled map (favor) the largest key log-feature m of the
 *                    segment, the state kept at shift m (rescaled as m grows)
 *   lc_scan_kernel   exclusive prefix (forward) or suffix (backward's R) of the segments'
 *                    states in place, or their total; favor: the slice's key shift c =
 *                    max_s m_s and each state brought to it; prefill: the total into the
 *                    recurrent state
 *   lc_fwd_kernel    out rows: O = phiQ S + (phiQ phiK^T masked) V, den likewise
 *   lc_dq_kernel     backward pass 1 (chunks in order): O and den again, G, dq; the
 *                    segment's own R = sum phiQ^T G for pass 2
 *   lc_dkv_kernel    backward pass 2 (chunks in reverse): dk, dv from R and the chunk
 * The augmented column of ones (linear.c's Vaug) is not a column of the tiles: the
 * normaliser's products are matrix-vector ones on the side (den = A 1 + phiQ z, z +=
 * phiK^T 1, G's last column -gd as rank-one terms), so the tiles stay Mp = M rounded
 * up to 16 wide.
 *
 * The building blocks (lc_args, tile products, feature maps on tiles) are in
 * linear_chunk_tiles.cuh; the kernels and their host side here. */
#ifndef ATTN_LINEAR_CHUNK_CUH
#define ATTN_LINEAR_CHUNK_CUH

#include "linear_chunk_tiles.cuh"

#include <atomic>
#include <string.h>

/* ---- the kernels ---- */

/* Chunk ch of the slice: its first row and its valid rows. */
__device__ __forceinline__ int lc_rows(const lc_args &a, int ch) { return min(a.T, a.L - ch * a.T); }

/* A segment's own key state (want_state; otherwise favor's key maximum only), written
 * to its record. Log-scaled maps keep the state at the running maximum m of the key
 * log-features so far, rescaling it when m grows (linear.c's k_features_running). */
template <class Map, int P, bool PF> __global__ void lc_state_kernel(lc_args a, int want_state) {
    AB_DYN_SMEM(float, sm);
    const lc_smem ly = lc_layout(a, LC_K_STATE, Map::log_scaled);
    float *Xk = sm + ly.Xk, *Kf = sm + ly.Kf, *V = sm + ly.V, *S = sm + ly.S, *z = sm + ly.z, *rw = sm + ly.rows;
    const long long items = a.ns * a.nseg;
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
        const long long sl = item / a.nseg;
        const int seg = (int)(item % a.nseg), c0 = seg * a.cps, c1 = min(a.nchunks, c0 + a.cps);
        if (want_state) lc_state_in(a, NULL, S, z);
        float m = -INFINITY;
        lc_stage sk = {}, sv = {}; /* PF: the rows of the next chunk, in flight */
        auto fetch = [&](int ch) {
            const long long r = sl * a.N + (long long)ch * a.T;
            lc_fetch(sk, a.k + r * a.D, a.D, a.Dp, lc_rows(a, ch), a.T);
            if (want_state) lc_fetch(sv, a.v + r * a.M, a.M, a.Mp, lc_rows(a, ch), a.T);
        };
        if (PF) fetch(c0);
        __syncthreads();
        for (int ch = c0; ch < c1; ch++) {
            const int rows = lc_rows(a, ch);
            const long long r = sl * a.N + (long long)ch * a.T;
            if (PF) {
                lc_put(sk, Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, a.T);
                if (want_state) lc_put(sv, V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, a.T);
                if (ch + 1 < c1) fetch(ch + 1);
            } else {
                lc_load(Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, a.T);
                if (want_state) lc_load(V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, a.T);
            }
            __syncthreads();
            if constexpr (Map::log_scaled) {
                lc_favor::logits<P>(a, Xk, Kf, a.T, rows, rw);
                float cm = -INFINITY; /* the same on every thread */
                for (int i = 0; i < rows; i++) cm = fmaxf(cm, rw[LC_RW_PM * a.T + i] - rw[LC_RW_H * a.T + i]);
                if (cm > m) {
                    if (want_state && m > -INFINITY) {
                        const float f = expf(m - cm);
                        for (int e = threadIdx.x; e < a.Cp * a.ldM; e += blockDim.x) S[e] *= f;
                        for (int c = threadIdx.x; c < a.Cp; c += blockDim.x) z[c] *= f;
                    }
                    m = cm;
                }
                if (want_state) lc_favor::activate(a, Kf, a.T, 0, rows, m, rw); /* (else the maximum only) */
            } else {
                Map::template features<P>(a, Xk, Kf, a.T, 0, rows, 0.0f, rw);
            }
            if (want_state) {
                lc_mm<P, true, false>(a.Cp, a.Mp, a.T, Kf, a.ldC, V, a.ldM, S, a.ldM, true);
                lc_colsum(a, Kf, z);
                __syncthreads();
            }
        }
        float *rec = a.sst + item * a.E;
        if (want_state) lc_state_out(a, S, z, rec);
        if (threadIdx.x == 0) rec[(long long)a.Cp * a.Mp + a.Cp] = m;
        __syncthreads();
    }
}

/* Over the segment records of each slice, for entries e < n_e of a record (threads over
 * (slice, entry)): mode 0 exclusive prefix in place (forward), 1 exclusive suffix in
 * place (backward's R), 2 the total into tot. favor: each record is first brought from
 * its m to the slice's key shift c = max over the records' m (written to kc, and to
 * state_kls for a prefill). state (prefill, mode 0): the total into the recurrent
 * state's Saug. Sums in double. */
static __global__ void lc_scan_kernel(lc_args a, int n_e, int mode, int favor) {
    const long long per = n_e > 0 ? n_e : 1, items = a.ns * per, mpos = (long long)a.Cp * a.Mp + a.Cp;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < items;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long sl = idx / per, e = idx % per;
        float *base = a.sst + sl * a.nseg * a.E;
        float c = 0.0f;
        if (favor) {
            c = -INFINITY;
            for (int s = 0; s < a.nseg; s++) c = fmaxf(c, base[s * a.E + mpos]);
            if (e == 0) {
                a.kc[sl] = c;
                if (a.state_kls) a.state_kls[sl] = c;
            }
        }
        if (e >= n_e) continue;
        double acc = 0;
        for (int t = 0; t < a.nseg; t++) {
            const int s = mode == 1 ? a.nseg - 1 - t : t;
            float *p = base + s * a.E + e;
            float x = *p;
            if (favor) x *= expf(base[s * a.E + mpos] - c);
            if (mode != 2) *p = (float)acc;
            acc += x;
        }
        if (mode == 2) a.tot[sl * a.E + e] = (float)acc;
        if (a.state) { /* Saug [C x (M+1)]: S's columns, then z as column M */
            const long long SM = (long long)a.Cp * a.Mp, M1 = a.M + 1;
            float *st = a.state + sl * (long long)a.C * M1;
            const int row = (int)(e < SM ? e / a.Mp : e - SM), mm = e < SM ? (int)(e % a.Mp) : a.M;
            long long f = row < a.C ? row : -1, f2 = -1; /* the feature(s) of a state row */
            if (a.poly) { /* slab rows -> the CPU's feature order [c, lin x, scale x_a x_b] */
                if (row < a.W0p) {
                    f = row <= a.D ? row : -1;
                } else { /* slab 1 + qa holds b >= qa rounded down to 16 (poly_chunk.cuh): (qa, b)
                          * for b > qa is also (b, qa); b < qa is written from slab 1 + b */
                    int qa = 0, r0 = a.W0p;
                    while (r0 + a.Dp - 16 * (qa / 16) <= row) r0 += a.Dp - 16 * (qa / 16), qa++;
                    const int b = 16 * (qa / 16) + (row - r0);
                    f = b < a.D && b >= qa ? 1 + a.D + (long long)qa * a.D + b : -1;
                    if (f >= 0 && b > qa) f2 = 1 + a.D + (long long)b * a.D + qa;
                }
            }
            if (f >= 0 && (e >= SM || mm < a.M)) { /* not S's padding columns */
                st[f * M1 + mm] = (float)acc;
                if (f2 >= 0) st[f2 * M1 + mm] = (float)acc;
            }
        }
    }
}

/* Query and key features of a chunk (both when keys: Xq, Xk and Qf, Kf adjacent). */
template <class Map, int P>
__device__ __forceinline__ void lc_qk_features(const lc_args &a, const float *Xq, float *Qf, int rows, bool keys,
                                               float ck, float *rw) {
    Map::template features<P>(a, Xq, Qf, keys ? 2 * a.T : a.T, a.T, rows, ck, rw);
}

/* den of the chunk's rows (warp per row) = sum_j A_ij (causal) + phiQ_i . z, and with it
 * inv_i = 1/(den_i + eps_i) in the row arrays. */
template <class Map>
__device__ __forceinline__ void lc_den(const lc_args &a, const float *A, const float *Qf, const float *z, int rows,
                                       float ck, float *rw) {
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int i = threadIdx.x >> 5; i < a.T; i += nw) {
        float s = 0.0f;
        if (A)
            for (int j = lane; j < a.T; j += 32) s += A[i * a.ldT + j];
        for (int c = lane; c < a.Cp; c += 32) s = fmaf(Qf[i * a.ldC + c], z[c], s);
        s = attn_warp_sum(s);
        if (lane == 0) {
            rw[LC_RW_DEN * a.T + i] = s;
            rw[LC_RW_INV * a.T + i] = i < rows ? (float)(1.0 / ((double)s + lc_row_eps<Map>(a, rw, i, ck))) : 0.0f;
        }
    }
}

/* A chunk's q rows and, with kv, its k and v rows (r: the chunk's first row in the
 * tensors): lc_fetch_qkv stages them (PF); lc_chunk_qkv puts them into the shared tiles
 * from the stage (PF) or loads them now. */
__device__ __forceinline__ void lc_fetch_qkv(const lc_args &a, lc_stage &sq, lc_stage &sk, lc_stage &sv, long long r,
                                             int rows, bool kv) {
    lc_fetch(sq, a.q + r * a.D, a.D, a.Dp, rows, a.T);
    if (kv) {
        lc_fetch(sk, a.k + r * a.D, a.D, a.Dp, rows, a.T);
        lc_fetch(sv, a.v + r * a.M, a.M, a.Mp, rows, a.T);
    }
}
template <bool PF>
__device__ __forceinline__ void lc_chunk_qkv(const lc_args &a, const lc_stage &sq, const lc_stage &sk,
                                             const lc_stage &sv, float *Xq, float *Xk, float *V, long long r, int rows,
                                             bool kv) {
    if (PF) {
        lc_put(sq, Xq, a.ldD, a.q + r * a.D, a.D, a.Dp, rows, a.T);
        if (kv) {
            lc_put(sk, Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, a.T);
            lc_put(sv, V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, a.T);
        }
    } else {
        lc_load(Xq, a.ldD, a.q + r * a.D, a.D, a.Dp, rows, a.T);
        if (kv) {
            lc_load(Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, a.T);
            lc_load(V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, a.T);
        }
    }
}

template <class Map, int P, bool PF> __global__ void lc_fwd_kernel(lc_args a) {
    AB_DYN_SMEM(float, sm);
    const lc_smem ly = lc_layout(a, LC_K_FWD, Map::log_scaled);
    float *Xq = sm + ly.Xq, *Xk = sm + ly.Xk, *Qf = sm + ly.Qf, *Kf = sm + ly.Kf, *V = sm + ly.V, *O = sm + ly.O;
    float *S = sm + ly.S, *z = sm + ly.z, *A = sm + ly.A, *rw = sm + ly.rows;
    const int T = a.T;
    const bool causal = a.causal;
    const long long items = a.ns * a.nseg;
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
        const long long sl = item / a.nseg;
        const int seg = (int)(item % a.nseg), c0 = seg * a.cps, c1 = min(a.nchunks, c0 + a.cps);
        const float ck = Map::log_scaled ? a.kc[sl] : 0.0f;
        lc_state_in(a, causal ? (a.nseg > 1 ? a.sst + item * a.E : NULL) : a.tot + sl * a.E, S, z);
        lc_stage sq = {}, sk = {}, sv = {}; /* PF: the rows of the next chunk, in flight */
        if (PF) lc_fetch_qkv(a, sq, sk, sv, sl * a.N + (long long)c0 * T, lc_rows(a, c0), causal);
        __syncthreads();
        for (int ch = c0; ch < c1; ch++) {
            const int rows = lc_rows(a, ch);
            const long long r = sl * a.N + (long long)ch * T;
            lc_chunk_qkv<PF>(a, sq, sk, sv, Xq, Xk, V, r, rows, causal);
            if (PF && ch + 1 < c1) lc_fetch_qkv(a, sq, sk, sv, r + T, lc_rows(a, ch + 1), causal);
            __syncthreads();
            lc_qk_features<Map, P>(a, Xq, Qf, rows, causal, ck, rw);
            if (causal) lc_mm<P, false, true>(T, T, a.Cp, Qf, a.ldC, Kf, a.ldC, A, a.ldT, false, true);
            lc_mm<P, false, false>(T, a.Mp, a.Cp, Qf, a.ldC, S, a.ldM, O, a.ldM, false);
            __syncthreads();
            if (causal) lc_mm<P, false, false>(T, a.Mp, T, A, a.ldT, V, a.ldM, O, a.ldM, true, false, LC_K_LOWER);
            lc_den<Map>(a, causal ? A : NULL, Qf, z, rows, ck, rw);
            __syncthreads();
            float *out = a.out + r * a.M;
            for (int e = threadIdx.x; e < rows * a.M; e += blockDim.x) {
                const int i = e / a.M, mm = e - i * a.M;
                out[e] = O[i * a.ldM + mm] * rw[LC_RW_INV * T + i];
            }
            if (causal && ch + 1 < c1) {
                lc_mm<P, true, false>(a.Cp, a.Mp, T, Kf, a.ldC, V, a.ldM, S, a.ldM, true);
                lc_colsum(a, Kf, z);
            }
            __syncthreads();
        }
    }
}

/* Backward pass 1: per chunk in order, O and den as the forward computed them, then
 * inv = 1/(den+eps) and gd = (dout.out)/(den+eps) (kept per position for pass 2),
 * G = dout inv (its augmented column -gd: GCOL), dphiQ = G S^T - gd z^T + B phiK with
 * B = (G V^T - gd 1^T) masked, dq; and (want_r) the segment's own R = sum phiQ^T G,
 * r = sum phiQ^T (-gd), into its record. */
template <class Map, int P, bool PF> __global__ void lc_dq_kernel(lc_args a, int want_r) {
    AB_DYN_SMEM(float, sm);
    const lc_smem ly = lc_layout(a, LC_K_DQ, Map::log_scaled);
    float *Xq = sm + ly.Xq, *Xk = sm + ly.Xk, *Qf = sm + ly.Qf, *Kf = sm + ly.Kf, *dF = sm + ly.dF, *V = sm + ly.V;
    float *G = sm + ly.G, *O = sm + ly.O, *S = sm + ly.S, *z = sm + ly.z, *R = sm + ly.R, *rr = sm + ly.r;
    float *A = sm + ly.A, *B = sm + ly.B, *rw = sm + ly.rows, *SX = ly.SX >= 0 ? sm + ly.SX : NULL;
    const int T = a.T;
    const bool causal = a.causal;
    const long long items = a.ns * a.nseg;
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
        const long long sl = item / a.nseg;
        const int seg = (int)(item % a.nseg), c0 = seg * a.cps, c1 = min(a.nchunks, c0 + a.cps);
        const float ck = Map::log_scaled ? a.kc[sl] : 0.0f;
        lc_state_in(a, causal ? (a.nseg > 1 ? a.sst + item * a.E : NULL) : a.tot + sl * a.E, S, z);
        if (want_r) lc_state_in(a, NULL, R, rr);
        lc_stage sq = {}, sg = {}, sk = {}, sv = {}; /* PF: the rows of the next chunk, in flight */
        auto fetch = [&](long long r, int rows) {
            lc_fetch_qkv(a, sq, sk, sv, r, rows, causal);
            lc_fetch(sg, a.dout + r * a.M, a.M, a.Mp, rows, T);
        };
        if (PF) fetch(sl * a.N + (long long)c0 * T, lc_rows(a, c0));
        __syncthreads();
        for (int ch = c0; ch < c1; ch++) {
            const int rows = lc_rows(a, ch);
            const long long r = sl * a.N + (long long)ch * T, pos = (long long)ch * T;
            lc_chunk_qkv<PF>(a, sq, sk, sv, Xq, Xk, V, r, rows, causal);
            if (PF) lc_put(sg, G, a.ldM, a.dout + r * a.M, a.M, a.Mp, rows, T);
            else lc_load(G, a.ldM, a.dout + r * a.M, a.M, a.Mp, rows, T);
            if (PF && ch + 1 < c1) fetch(r + T, lc_rows(a, ch + 1));
            __syncthreads();
            lc_qk_features<Map, P>(a, Xq, Qf, rows, causal, ck, rw);
            if (causal) lc_mm<P, false, true>(T, T, a.Cp, Qf, a.ldC, Kf, a.ldC, A, a.ldT, false, true);
            lc_mm<P, false, false>(T, a.Mp, a.Cp, Qf, a.ldC, S, a.ldM, O, a.ldM, false);
            __syncthreads();
            if (causal) {
                lc_mm<P, false, false>(T, a.Mp, T, A, a.ldT, V, a.ldM, O, a.ldM, true, false, LC_K_LOWER);
                __syncthreads();
            }
            { /* per row: den, inv, gd (linear.c's grad_rows), G's last column */
                const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
                for (int i = threadIdx.x >> 5; i < T; i += nw) {
                    float s = 0.0f;
                    if (causal)
                        for (int j = lane; j < T; j += 32) s += A[i * a.ldT + j];
                    for (int c = lane; c < a.Cp; c += 32) s = fmaf(Qf[i * a.ldC + c], z[c], s);
                    s = attn_warp_sum(s);
                    double dn = 0;
                    for (int mm = lane; mm < a.M; mm += 32) dn += (double)G[i * a.ldM + mm] * O[i * a.ldM + mm];
                    dn = fm_warp_sum_d(dn);
                    if (lane == 0) {
                        float iv = 0.0f, g = 0.0f;
                        if (i < rows) {
                            const double rr_ = 1.0 / ((double)s + lc_row_eps<Map>(a, rw, i, ck));
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
            if (causal) lc_mm<P, false, true>(T, T, a.Mp, G, a.ldM, V, a.ldM, B, a.ldT, false, true);
            lc_mm<P, false, true>(T, a.Cp, a.Mp, G, a.ldM, S, a.ldM, dF, a.ldC, false);
            __syncthreads();
            for (int e = threadIdx.x; e < T * a.Cp; e += blockDim.x) {
                const int i = e / a.Cp, c = e - i * a.Cp;
                dF[i * a.ldC + c] += rw[LC_RW_GCOL * T + i] * z[c];
            }
            if (causal)
                for (int e = threadIdx.x; e < T * T; e += blockDim.x) {
                    const int i = e / T, j = e - i * T;
                    if (j <= i) B[i * a.ldT + j] += rw[LC_RW_GCOL * T + i];
                }
            __syncthreads();
            if (causal) {
                lc_mm<P, false, false>(T, a.Cp, T, B, a.ldT, Kf, a.ldC, dF, a.ldC, true, false, LC_K_LOWER);
                __syncthreads();
            }
            Map::template backward<P>(a, Xq, Qf, dF, rows, a.dq + r * a.D, SX, rw);
            if (want_r) {
                lc_mm<P, true, false>(a.Cp, a.Mp, T, Qf, a.ldC, G, a.ldM, R, a.ldM, true);
                for (int c = threadIdx.x; c < a.Cp; c += blockDim.x) {
                    float s = rr[c];
                    for (int i = 0; i < T; i++) s = fmaf(Qf[i * a.ldC + c], rw[LC_RW_GCOL * T + i], s);
                    rr[c] = s;
                }
            }
            if (causal && ch + 1 < c1) {
                lc_mm<P, true, false>(a.Cp, a.Mp, T, Kf, a.ldC, V, a.ldM, S, a.ldM, true);
                lc_colsum(a, Kf, z);
            }
            __syncthreads();
        }
        if (want_r) lc_state_out(a, R, rr, a.sst + item * a.E);
        __syncthreads();
    }
}

/* Backward pass 2: per chunk in reverse, R the sum of phiQ^T G over the later positions
 * (r for G's last column): dphiK = V R^T + 1 r^T + B^T phiQ, dV = phiK R + A^T G, dk. */
template <class Map, int P, bool PF> __global__ void lc_dkv_kernel(lc_args a) {
    AB_DYN_SMEM(float, sm);
    const lc_smem ly = lc_layout(a, LC_K_DKV, Map::log_scaled);
    float *Xq = sm + ly.Xq, *Xk = sm + ly.Xk, *Qf = sm + ly.Qf, *Kf = sm + ly.Kf, *dF = sm + ly.dF, *V = sm + ly.V;
    float *G = sm + ly.G, *O = sm + ly.O, *R = sm + ly.R, *rr = sm + ly.r, *A = sm + ly.A, *B = sm + ly.B;
    float *rw = sm + ly.rows, *SX = ly.SX >= 0 ? sm + ly.SX : NULL;
    const int T = a.T;
    const bool causal = a.causal;
    const long long items = a.ns * a.nseg;
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
        const long long sl = item / a.nseg;
        const int seg = (int)(item % a.nseg), c0 = seg * a.cps, c1 = min(a.nchunks, c0 + a.cps);
        const float ck = Map::log_scaled ? a.kc[sl] : 0.0f;
        lc_state_in(a, causal ? (a.nseg > 1 ? a.sst + item * a.E : NULL) : a.tot + sl * a.E, R, rr);
        lc_stage sk = {}, sv = {}, sq = {}, sg = {}; /* PF: the rows of the next chunk (the one before), in flight */
        float gdn = 0.0f;        /* PF: -gd of row threadIdx.x of that chunk (when blockDim.x >= T) */
        auto fetch = [&](int ch) {
            const long long r = sl * a.N + (long long)ch * T, pos = (long long)ch * T;
            const int rows = lc_rows(a, ch);
            lc_fetch(sk, a.k + r * a.D, a.D, a.Dp, rows, T);
            lc_fetch(sv, a.v + r * a.M, a.M, a.Mp, rows, T);
            if (causal) {
                lc_fetch(sq, a.q + r * a.D, a.D, a.Dp, rows, T);
                lc_fetch(sg, a.dout + r * a.M, a.M, a.Mp, rows, T, a.inv + sl * a.N + pos);
                if ((int)threadIdx.x < rows) gdn = -a.gd[sl * a.N + pos + threadIdx.x];
            }
        };
        if (PF) fetch(c1 - 1);
        __syncthreads();
        for (int ch = c1 - 1; ch >= c0; ch--) {
            const int rows = lc_rows(a, ch);
            const long long r = sl * a.N + (long long)ch * T, pos = (long long)ch * T;
            if (PF) {
                lc_put(sk, Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, T);
                lc_put(sv, V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, T);
                if (causal) {
                    lc_put(sq, Xq, a.ldD, a.q + r * a.D, a.D, a.Dp, rows, T);
                    lc_put(sg, G, a.ldM, a.dout + r * a.M, a.M, a.Mp, rows, T, a.inv + sl * a.N + pos);
                    if ((int)blockDim.x >= T) {
                        if ((int)threadIdx.x < T) rw[LC_RW_GCOL * T + threadIdx.x] = (int)threadIdx.x < rows ? gdn : 0.0f;
                    } else {
                        for (int i = threadIdx.x; i < T; i += blockDim.x)
                            rw[LC_RW_GCOL * T + i] = i < rows ? -a.gd[sl * a.N + pos + i] : 0.0f;
                    }
                }
                if (ch > c0) fetch(ch - 1);
            } else {
                lc_load(Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, T);
                lc_load(V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, T);
            }
            if (!PF && causal) {
                lc_load(Xq, a.ldD, a.q + r * a.D, a.D, a.Dp, rows, T);
                const float *dout = a.dout + r * a.M, *iv = a.inv + sl * a.N + pos;
                for (int e = threadIdx.x; e < T * a.Mp; e += blockDim.x) {
                    const int i = e / a.Mp, mm = e - i * a.Mp;
                    G[i * a.ldM + mm] = i < rows && mm < a.M ? dout[(long long)i * a.M + mm] * iv[i] : 0.0f;
                }
                for (int i = threadIdx.x; i < T; i += blockDim.x)
                    rw[LC_RW_GCOL * T + i] = i < rows ? -a.gd[sl * a.N + pos + i] : 0.0f;
            }
            __syncthreads();
            if (causal) lc_qk_features<Map, P>(a, Xq, Qf, rows, true, ck, rw);
            else Map::template features<P>(a, Xk, Kf, T, 0, rows, ck, rw);
            if (causal) {
                lc_mm<P, false, true>(T, T, a.Cp, Qf, a.ldC, Kf, a.ldC, A, a.ldT, false, true);
                lc_mm<P, false, true>(T, T, a.Mp, G, a.ldM, V, a.ldM, B, a.ldT, false, true);
            }
            lc_mm<P, false, true>(T, a.Cp, a.Mp, V, a.ldM, R, a.ldM, dF, a.ldC, false);
            lc_mm<P, false, false>(T, a.Mp, a.Cp, Kf, a.ldC, R, a.ldM, O, a.ldM, false);
            __syncthreads();
            for (int e = threadIdx.x; e < rows * a.Cp; e += blockDim.x) {
                const int j = e / a.Cp, c = e - j * a.Cp;
                dF[j * a.ldC + c] += rr[c];
            }
            if (causal)
                for (int e = threadIdx.x; e < T * T; e += blockDim.x) {
                    const int i = e / T, j = e - i * T;
                    if (j <= i) B[i * a.ldT + j] += rw[LC_RW_GCOL * T + i];
                }
            __syncthreads();
            if (causal) {
                lc_mm<P, true, false>(T, a.Cp, T, B, a.ldT, Qf, a.ldC, dF, a.ldC, true, false, LC_K_UPPER);
                lc_mm<P, true, false>(T, a.Mp, T, A, a.ldT, G, a.ldM, O, a.ldM, true, false, LC_K_UPPER);
                __syncthreads();
            }
            float *dv = a.dv + r * a.M;
            for (int e = threadIdx.x; e < rows * a.M; e += blockDim.x) {
                const int i = e / a.M, mm = e - i * a.M;
                dv[e] = O[i * a.ldM + mm];
            }
            Map::template backward<P>(a, Xk, Kf, dF, rows, a.dk + r * a.D, SX, rw);
            if (causal && ch > c0) {
                lc_mm<P, true, false>(a.Cp, a.Mp, T, Qf, a.ldC, G, a.ldM, R, a.ldM, true);
                for (int c = threadIdx.x; c < a.Cp; c += blockDim.x) {
                    float s = rr[c];
                    for (int i = 0; i < T; i++) s = fmaf(Qf[i * a.ldC + c], rw[LC_RW_GCOL * T + i], s);
                    rr[c] = s;
                }
            }
            __syncthreads();
        }
    }
}

/* ---- host side: configuration, workspace, launches ---- */

/* What a call is: the map and arithmetic, the chunk, the block, the blocks to aim for,
 * sizes, eps, favor's padded projection on the device (lc_favor_host fills it). */
struct lc_cfg {
    int map, prec;       /* LC_MAP_*, LC_FP32 or LC_TF32 */
    int T, threads;      /* chunk (multiple of 16), threads per block (multiple of 32) */
    long long target;    /* (slice, segment) blocks to aim for per call */
    int D, M, C;
    double eps;
    const float *W, *WT; /* favor */
    int prefetch;        /* 1: each block fetches the next chunk's rows into registers while it works on a
                          * chunk (lc_stage; elu only, the other maps run without) */
};

/* The args of a run of ns slices of valid length L in tensors of N positions (tensor
 * and workspace pointers left for the caller). Segments: as many as make about
 * `target` blocks over the ns slices and no more, at most one per chunk. */
static inline lc_args lc_make_args(const lc_cfg &c, long long ns, int N, int L, bool causal) {
    lc_args a;
    memset(&a, 0, sizeof a);
    a.D = c.D, a.M = c.M, a.C = c.C, a.T = c.T;
    a.Dp = lc_round16(c.D), a.Mp = lc_round16(c.M), a.Cp = lc_round16(c.C);
    const int pad = c.prec == LC_FP32 ? 1 : 4; /* fp32: odd strides (no bank conflicts); wmma: 16-byte rows */
    a.ldD = a.Dp + pad, a.ldM = a.Mp + pad, a.ldC = a.Cp + pad, a.ldT = a.T + pad;
    a.L = L;
    a.nchunks = (L + c.T - 1) / c.T;
    if (a.nchunks < 1) a.nchunks = 1; /* (runs of length 0 are never launched) */
    /* floor, not ceiling: `target` is what the device runs at once, and one block more
     * than that is a second wave of whole-segment blocks (on an H200 at B*H = 16,
     * N = 65536: 17 segments made 272 blocks for 264 places; the lab's 33 segments, two
     * full waves, took 0.66x the time) */
    long long nseg = ns > 0 ? c.target / ns : 1;
    if (nseg < 1) nseg = 1;
    if (nseg > a.nchunks) nseg = a.nchunks;
    a.cps = (int)((a.nchunks + nseg - 1) / nseg);
    a.nseg = (a.nchunks + a.cps - 1) / a.cps;
    a.ns = ns, a.N = N;
    a.E = lc_round8((long long)a.Cp * a.Mp + a.Cp + 1);
    a.causal = causal;
    a.eps = c.eps;
    a.W = c.W, a.WT = c.WT;
    a.q4 = (float)pow((double)c.D, -0.25);
    a.q2 = (float)(1.0 / sqrt((double)c.D));
    a.norm = (float)(1.0 / sqrt((double)c.C));
    return a;
}

/* Bytes of shared memory of the largest kernel of a configuration (the backward's). */
static inline size_t lc_smem_bytes(const lc_cfg &c, int kind) {
    lc_args a = lc_make_args(c, 1, c.T, c.T, true);
    return (size_t)lc_layout(a, kind, c.map == LC_MAP_FAVOR).total * sizeof(float);
}

/* Workspace floats of calls on BH slices of up to N positions: the segment records
 * (at most min(BH * chunks, target + BH) of them: ns * ceil(target / ns) <= target + ns),
 * the totals, inv and gd (the only O(N) part: two floats per position), favor's key
 * shifts; pieces 64-float aligned. */
static inline size_t lc_workspace_floats(const lc_cfg &c, long long BH, int N) {
    const long long nch = (N + c.T - 1) / c.T, E = lc_round8((long long)lc_round16(c.C) * lc_round16(c.M) +
                                                             lc_round16(c.C) + 1);
    long long recs = BH * nch;
    if (recs > c.target + BH) recs = c.target + BH;
    auto al = [](long long n) { return (size_t)((n + 63) / 64 * 64); };
    return al(recs * E) + al(BH * E) + 2 * al(BH * (long long)N) + al(BH);
}

/* Points a's workspace pieces into ws (the layout lc_workspace_floats sized). */
static inline void lc_carve(const lc_cfg &c, long long BH, int N, float *ws, lc_args *a) {
    const long long nch = (N + c.T - 1) / c.T;
    long long recs = BH * nch;
    if (recs > c.target + BH) recs = c.target + BH;
    auto al = [](long long n) { return (size_t)((n + 63) / 64 * 64); };
    float *p = ws;
    a->sst = p, p += al(recs * a->E);
    a->tot = p, p += al(BH * a->E);
    a->inv = p, p += al(BH * (long long)N);
    a->gd = p, p += al(BH * (long long)N);
    a->kc = p;
}

/* Launches kernel over `items` blocks with `smem` bytes of dynamic shared memory (the
 * limit raised once per kernel when above the default 48 KiB). */
template <class K, class... Args>
static int lc_launch(K *kernel, std::atomic<size_t> &allowed, long long items, int threads, size_t smem,
                     Args... args) {
    if (smem > allowed.load()) {
        AB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        allowed.store(smem);
    }
    AB_LAUNCH(kernel, ab_cuda_grid(items, 1, AB_CUDA_MAX_GRID_X), threads, smem, ab_cuda_stream(), args...);
    return 0;
}

static int lc_scan(const lc_args &a, long long n_e, int mode, bool favor) {
    const long long items = a.ns * (n_e > 0 ? n_e : 1);
    AB_LAUNCH(lc_scan_kernel, ab_cuda_grid(items, 256, 65535), 256, 0, ab_cuda_stream(), a, (int)n_e, mode,
              (int)favor);
    return 0;
}

template <class Map, int P, bool PF = false> struct lc_kernels {
    static std::atomic<size_t> &allowed(int kind) {
        static std::atomic<size_t> lim[4] = {{48 * 1024}, {48 * 1024}, {48 * 1024}, {48 * 1024}};
        return lim[kind];
    }
    static size_t smem(const lc_args &a, int kind) { return (size_t)lc_layout(a, kind, Map::log_scaled).total * sizeof(float); }

    /* Forward (want_out) and/or the final state into a.state (prefill). */
    static int forward(const lc_args &a, int threads, bool want_out) {
        const long long items = a.ns * a.nseg, n_e = (long long)a.Cp * a.Mp + a.Cp;
        const bool fav = Map::log_scaled;
        if (!a.causal || a.nseg > 1 || a.state || fav) {
            const bool st = !a.causal || a.nseg > 1 || a.state;
            AB_TRY(lc_launch(&lc_state_kernel<Map, P, PF>, allowed(LC_K_STATE), items, threads, smem(a, LC_K_STATE), a,
                             (int)st));
            AB_TRY(lc_scan(a, st ? n_e : 0, a.causal ? 0 : 2, fav));
        }
        if (want_out) AB_TRY(lc_launch(&lc_fwd_kernel<Map, P, PF>, allowed(LC_K_FWD), items, threads, smem(a, LC_K_FWD), a));
        return 0;
    }

    static int backward(const lc_args &a0, int threads) {
        lc_args a = a0;
        a.state = a.state_kls = NULL;
        const long long items = a.ns * a.nseg, n_e = (long long)a.Cp * a.Mp + a.Cp;
        AB_TRY(forward(a, threads, false)); /* the segments' prefix states (or the total), favor's shift */
        const bool want_r = !a.causal || a.nseg > 1;
        AB_TRY(lc_launch(&lc_dq_kernel<Map, P, PF>, allowed(LC_K_DQ), items, threads, smem(a, LC_K_DQ), a, (int)want_r));
        if (want_r) AB_TRY(lc_scan(a, n_e, a.causal ? 1 : 2, false));
        AB_TRY(lc_launch(&lc_dkv_kernel<Map, P, PF>, allowed(LC_K_DKV), items, threads, smem(a, LC_K_DKV), a));
        return 0;
    }
};

/* Dispatch on the map and the precision (and prefetch, which only elu's kernels are
 * built with: the other maps run without it). */
template <class F> static int lc_dispatch(const lc_cfg &c, F &&f) {
    if (c.prefetch && c.map == LC_MAP_ELU)
        return c.prec == LC_FP32 ? f(lc_kernels<lc_elu, LC_FP32, true>()) : f(lc_kernels<lc_elu, LC_TF32, true>());
    switch (c.map * 2 + (c.prec == LC_FP32 ? 0 : 1)) {
    case LC_MAP_ELU * 2: return f(lc_kernels<lc_elu, LC_FP32>());
    case LC_MAP_ELU * 2 + 1: return f(lc_kernels<lc_elu, LC_TF32>());
    case LC_MAP_TAYLOR * 2: return f(lc_kernels<lc_taylor, LC_FP32>());
    case LC_MAP_TAYLOR * 2 + 1: return f(lc_kernels<lc_taylor, LC_TF32>());
    case LC_MAP_FAVOR * 2: return f(lc_kernels<lc_favor, LC_FP32>());
    default: return f(lc_kernels<lc_favor, LC_TF32>());
    }
}

/* Causal or non-causal forward of a run: ns slices of valid length L (tensors' length
 * N, pointers at the run's first slice); state / state_kls: a prefill's recurrent state
 * (Saug [C x (M+1)] per slice and favor's key shifts), or NULL; out may then be NULL.
 * ws: lc_workspace_floats(c, >= ns, >= N) floats. */
static inline int lc_forward(const lc_cfg &c, float *ws, long long ns, int N, int L, bool causal, const float *q,
                             const float *k, const float *v, float *out, float *state, float *state_kls) {
    lc_args a = lc_make_args(c, ns, N, L, causal);
    lc_carve(c, ns, N, ws, &a);
    a.q = q, a.k = k, a.v = v, a.out = out;
    a.state = state, a.state_kls = state_kls;
    return lc_dispatch(c, [&](auto K) { return decltype(K)::forward(a, c.threads, out != NULL); });
}

static inline int lc_backward(const lc_cfg &c, float *ws, long long ns, int N, int L, bool causal, const float *q,
                              const float *k, const float *v, const float *dout, float *dq, float *dk, float *dv) {
    lc_args a = lc_make_args(c, ns, N, L, causal);
    lc_carve(c, ns, N, ws, &a);
    a.q = q, a.k = k, a.v = v, a.dout = dout;
    a.dq = dq, a.dk = dk, a.dv = dv;
    return lc_dispatch(c, [&](auto K) { return decltype(K)::backward(a, c.threads); });
}

/* favor: W [C x D] (host, favor_draw's) into the padded layouts the kernels read,
 * Wp [Cp x Dp] and WTp [Dp x Cp] (host buffers of Cp * Dp floats each). */
static inline void lc_favor_pad(const float *W, int C, int D, float *Wp, float *WTp) {
    const int Cp = lc_round16(C), Dp = lc_round16(D);
    for (int r = 0; r < Cp; r++)
        for (int d = 0; d < Dp; d++) {
            const float w = r < C && d < D ? W[(size_t)r * D + d] : 0.0f;
            Wp[(size_t)r * Dp + d] = w;
            WTp[(size_t)d * Cp + r] = w;
        }
}

#endif
