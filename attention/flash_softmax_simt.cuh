/* The fused softmax kernels in fp32 on the CUDA cores (flash_softmax.cuh lists them):
 * the forward with its online softmax in registers, the backward's delta_i = dO_i . O_i,
 * the dK/dV pass and the dQ pass. C++ (CUDA). */
#ifndef ATTN_FLASH_SOFTMAX_SIMT_CUH
#define ATTN_FLASH_SOFTMAX_SIMT_CUH

#include "flash_softmax_tiles.cuh"

/* ---- fp32 forward (SIMT) ----
 *
 * NT threads (256; the lab tries 128) as (NT / 16) x 16: thread (ty, tx) = (tid / 16,
 * tid % 16) holds rows ty + (NT / 16) i (i < TR) of the query tile (BQ = NT TR / 16 rows),
 * scores of keys tx + 16 j (j < 4) and output columns tx * 4 + 64 g + (0..3) (g < G).
 * Shared: Q (BQ x ldd), K (64 x ldd), V (64 x ldm), P (BQ x 68; over K when it fits). */
template <int TR, int G, int NT = FL_THREADS>
static inline size_t fl_fwd_simt_smem(int D, int M) {
    const size_t bq = NT / 16 * TR, kd = (size_t)FL_BK * fl_ld(D), p = bq * FL_LDP;
    return (bq * fl_ld(D) + kd + (size_t)FL_BK * fl_ld(M) + (p <= kd ? 0 : p)) * sizeof(float);
}

template <int TR, int G, int NT = FL_THREADS>
static __global__ void __launch_bounds__(NT, (TR == 8 || G == 2 ? 2 : 3) * (FL_THREADS / NT)) fl_fwd_simt(flash_args a) {
    constexpr int RS = NT / 16, BQ = RS * TR; /* rows of a thread are RS apart */
    AB_DYN_SMEM(float, sm);
    const int D = a.D, M = a.M, Dw = fl_round(D, 4), Mw = fl_round(M, 4), ldd = fl_ld(D), ldm = fl_ld(M);
    float *Qs = sm, *Ks = Qs + BQ * ldd, *Vs = Ks + FL_BK * ldd;
    float *Ps = BQ * FL_LDP <= FL_BK * ldd ? Ks : Vs + FL_BK * ldm;
    const bool p_on_k = Ps == Ks;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    int mcol[G]; /* clamped into the row: such a thread computes a copy it never stores */
FL_UNROLL
    for (int g = 0; g < G; g++) mcol[g] = min(tx * 4 + 64 * g, Mw - 4);
    const int ntq = (a.L + BQ - 1) / BQ;
    for (long long sl = blockIdx.x; sl < a.n_slices; sl += gridDim.x)
        for (int y = blockIdx.y; y < ntq; y += gridDim.y) {
            const int q0 = (ntq - 1 - y) * BQ, nq = min(BQ, a.L - q0); /* causal: the longest rows first */
            const float *kg = a.k + sl * a.sk, *vg = a.v + sl * a.sv;
            __syncthreads(); /* the previous tile's reads of Q and P are done */
            fl_load(Qs, ldd, Dw, BQ, a.q + sl * a.sq + (long long)q0 * D, D, nq, a.vec_qk, false);
            float o[TR][G][4], m[TR], l[TR];
FL_UNROLL
            for (int i = 0; i < TR; i++) {
                m[i] = -INFINITY, l[i] = 0.0f;
FL_UNROLL
                for (int g = 0; g < G; g++) o[i][g][0] = o[i][g][1] = o[i][g][2] = o[i][g][3] = 0.0f;
            }
            int kb, ke;
            fl_keys_of(a, q0, q0 + nq, &kb, &ke);
            for (int k0 = kb / FL_BK * FL_BK; k0 < ke; k0 += FL_BK) {
                const int nk = min(FL_BK, a.L - k0);
                __syncthreads(); /* Q is in; the previous key tile's reads of K, V, P are done */
                fl_load(Ks, ldd, Dw, FL_BK, kg + (long long)k0 * D, D, nk, a.vec_qk, false);
                fl_load(Vs, ldm, Mw, FL_BK, vg + (long long)k0 * M, M, nk, a.vec_vo, false);
                __syncthreads();
                /* S = Q K^T: TR x 4 per thread, float4 steps along d */
                float s[TR][4];
FL_UNROLL
                for (int i = 0; i < TR; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
FL_UNROLL_BY(1)
                for (int d = 0; d < Dw; d += 4) {
                    float4 kv[4];
FL_UNROLL
                    for (int j = 0; j < 4; j++) kv[j] = *reinterpret_cast<const float4 *>(Ks + (tx + 16 * j) * ldd + d);
FL_UNROLL
                    for (int i = 0; i < TR; i++) {
                        const float4 qv = *reinterpret_cast<const float4 *>(Qs + (ty + RS * i) * ldd + d);
FL_UNROLL
                        for (int j = 0; j < 4; j++) {
                            s[i][j] = fmaf(qv.x, kv[j].x, s[i][j]);
                            s[i][j] = fmaf(qv.y, kv[j].y, s[i][j]);
                            s[i][j] = fmaf(qv.z, kv[j].z, s[i][j]);
                            s[i][j] = fmaf(qv.w, kv[j].w, s[i][j]);
                        }
                    }
                }
                /* online softmax in base 2: the 16 threads of a row are lanes of one half-warp */
                const bool full = fl_full(a, q0, BQ, k0, FL_BK);
FL_UNROLL
                for (int i = 0; i < TR; i++) {
                    const int qi = q0 + ty + RS * i;
                    float mx = -INFINITY;
FL_UNROLL
                    for (int j = 0; j < 4; j++) {
                        float x = s[i][j] * a.cl;
                        if (!full && !fl_valid(a, qi, k0 + tx + 16 * j)) x = -INFINITY;
                        s[i][j] = x;
                        mx = fmaxf(mx, x);
                    }
FL_UNROLL
                    for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                    const float mn = fmaxf(m[i], mx), mu = mn == -INFINITY ? 0.0f : mn; /* a row masked so far */
                    const float al = exp2f(m[i] - mu);
                    m[i] = mn;
                    float ps = 0.0f;
FL_UNROLL
                    for (int j = 0; j < 4; j++) {
                        s[i][j] = exp2f(s[i][j] - mu);
                        ps += s[i][j];
                    }
                    l[i] = l[i] * al + ps; /* this thread's share of the row sum */
FL_UNROLL
                    for (int g = 0; g < G; g++)
FL_UNROLL
                        for (int e = 0; e < 4; e++) o[i][g][e] *= al;
                }
                if (p_on_k) __syncthreads(); /* every thread is done reading K */
FL_UNROLL
                for (int i = 0; i < TR; i++)
FL_UNROLL
                    for (int j = 0; j < 4; j++) Ps[(ty + RS * i) * FL_LDP + tx + 16 * j] = s[i][j];
                __syncthreads();
                /* O += P V */
FL_UNROLL_BY(1)
                for (int kk = 0; kk < FL_BK; kk += 4) {
                    float4 vv[4][G];
FL_UNROLL
                    for (int u = 0; u < 4; u++)
FL_UNROLL
                        for (int g = 0; g < G; g++)
                            vv[u][g] = *reinterpret_cast<const float4 *>(Vs + (kk + u) * ldm + mcol[g]);
FL_UNROLL
                    for (int i = 0; i < TR; i++) {
                        const float4 pv = *reinterpret_cast<const float4 *>(Ps + (ty + RS * i) * FL_LDP + kk);
                        const float pu[4] = {pv.x, pv.y, pv.z, pv.w};
FL_UNROLL
                        for (int u = 0; u < 4; u++)
FL_UNROLL
                            for (int g = 0; g < G; g++) {
                                o[i][g][0] = fmaf(pu[u], vv[u][g].x, o[i][g][0]);
                                o[i][g][1] = fmaf(pu[u], vv[u][g].y, o[i][g][1]);
                                o[i][g][2] = fmaf(pu[u], vv[u][g].z, o[i][g][2]);
                                o[i][g][3] = fmaf(pu[u], vv[u][g].w, o[i][g][3]);
                            }
                    }
                }
            }
            /* O / l, and the row's log-sum-exp */
FL_UNROLL
            for (int i = 0; i < TR; i++) {
                float lt = l[i];
FL_UNROLL
                for (int off = 8; off > 0; off >>= 1) lt += __shfl_xor_sync(0xffffffffu, lt, off);
                const int qi = q0 + ty + RS * i;
                if (qi >= a.L) continue;
                const float inv = 1.0f / lt; /* lt >= 1: the row maximum's own term is 2^0 */
                float *orow = a.o + sl * a.so + (long long)qi * M;
                float *o2row = a.o2 ? a.o2 + sl * a.so + (long long)qi * M : NULL;
FL_UNROLL
                for (int g = 0; g < G; g++) {
                    const float4 x = make_float4(o[i][g][0] * inv, o[i][g][1] * inv, o[i][g][2] * inv, o[i][g][3] * inv);
                    fl_store4(orow, tx * 4 + 64 * g, M, x, a.vec_vo);
                    if (o2row) fl_store4(o2row, tx * 4 + 64 * g, M, x, a.vec_vo);
                }
                if (a.lse && tx == 0) a.lse[sl * a.sl + qi] = m[i] + log2f(lt);
            }
        }
}

/* ---- backward: delta_i = dO_i . O_i (a warp per row) ---- */

static __global__ void fl_delta(flash_args a) {
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    const long long rows = a.n_slices * a.L;
    for (long long r = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += (long long)gridDim.x * wpb) {
        const long long sl = r / a.L;
        const int i = (int)(r - sl * a.L);
        const float *o = a.o2 + sl * a.so + (long long)i * a.M, *d = a.dout + sl * a.so + (long long)i * a.M;
        float acc = 0.0f;
        for (int c = lane; c < a.M; c += 32) acc = fmaf(__ldg(o + c), __ldg(d + c), acc);
        acc = fl_warp_sum(acc);
        if (lane == 0) a.delta[sl * a.sl + i] = acc;
    }
}

/* ---- fp32 backward (SIMT) ----
 *
 * dK, dV: a block per key tile (rows: keys ty + 16 i, i < 4), over the query tiles that
 * see it (columns: queries tx + 16 j). Per query tile: S^T = K Q^T and dP^T = V dO^T in
 * registers, P^T = 2^(cl S^T - lse) and dS^T = P^T (dP^T - delta) into shared memory,
 * then dV += P^T dO and dK += dS^T Q with dK, dV (4 x 4 G each) in registers.
 * Shared: K, Q (64 x ldd), V, dO (64 x ldm), P^T, dS^T (64 x 68), lse and delta (64).
 * ATOMIC_DQ (the lab's variant): dQ += dS K for the tile, added to global dq (zeroed by
 * the caller) with atomics, instead of fl_bwd_dq_simt's second pass. */
static inline size_t fl_bwd_dkdv_smem(int D, int M) {
    return ((size_t)2 * FL_BK * fl_ld(D) + (size_t)2 * FL_BK * fl_ld(M) + 2 * FL_BK * FL_LDP + 2 * FL_BK) *
           sizeof(float);
}

/* c[4][G][4] += A[rows ty + 16 i][0..64) B[0..64)[col[g] .. + 4): A row-major (stride
 * FL_LDP), B row-major (stride ldb). */
template <int G>
static __device__ __forceinline__ void fl_acc_nn(float (&c)[4][G][4], const float *A, const float *B, int ldb,
                                                 const int (&col)[G], int ty) {
FL_UNROLL_BY(1)
    for (int kk = 0; kk < FL_BK; kk += 4) {
        float4 bv[4][G];
FL_UNROLL
        for (int u = 0; u < 4; u++)
FL_UNROLL
            for (int g = 0; g < G; g++) bv[u][g] = *reinterpret_cast<const float4 *>(B + (kk + u) * ldb + col[g]);
FL_UNROLL
        for (int i = 0; i < 4; i++) {
            const float4 av = *reinterpret_cast<const float4 *>(A + (ty + 16 * i) * FL_LDP + kk);
            const float au[4] = {av.x, av.y, av.z, av.w};
FL_UNROLL
            for (int u = 0; u < 4; u++)
FL_UNROLL
                for (int g = 0; g < G; g++) {
                    c[i][g][0] = fmaf(au[u], bv[u][g].x, c[i][g][0]);
                    c[i][g][1] = fmaf(au[u], bv[u][g].y, c[i][g][1]);
                    c[i][g][2] = fmaf(au[u], bv[u][g].z, c[i][g][2]);
                    c[i][g][3] = fmaf(au[u], bv[u][g].w, c[i][g][3]);
                }
        }
    }
}

/* c[4][4] = A[rows ty + 16 i] . B[rows tx + 16 j] over [0, W) (both stride ld, W % 4 == 0). */
static __device__ __forceinline__ void fl_acc_nt(float (&c)[4][4], const float *A, const float *B, int ld, int W,
                                                 int ty, int tx) {
FL_UNROLL
    for (int i = 0; i < 4; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
FL_UNROLL_BY(1)
    for (int d = 0; d < W; d += 4) {
        float4 bv[4];
FL_UNROLL
        for (int j = 0; j < 4; j++) bv[j] = *reinterpret_cast<const float4 *>(B + (tx + 16 * j) * ld + d);
FL_UNROLL
        for (int i = 0; i < 4; i++) {
            const float4 av = *reinterpret_cast<const float4 *>(A + (ty + 16 * i) * ld + d);
FL_UNROLL
            for (int j = 0; j < 4; j++) {
                c[i][j] = fmaf(av.x, bv[j].x, c[i][j]);
                c[i][j] = fmaf(av.y, bv[j].y, c[i][j]);
                c[i][j] = fmaf(av.z, bv[j].z, c[i][j]);
                c[i][j] = fmaf(av.w, bv[j].w, c[i][j]);
            }
        }
    }
}

template <int G, bool ATOMIC_DQ>
static __global__ void __launch_bounds__(FL_THREADS, G == 1 ? 2 : 1) fl_bwd_dkdv_simt(flash_args a) {
    AB_DYN_SMEM(float, sm);
    const int D = a.D, M = a.M, Dw = fl_round(D, 4), Mw = fl_round(M, 4), ldd = fl_ld(D), ldm = fl_ld(M);
    float *Ks = sm, *Vs = Ks + FL_BK * ldd, *Qs = Vs + FL_BK * ldm, *Os = Qs + FL_BK * ldd;
    float *Pt = Os + FL_BK * ldm, *St = Pt + FL_BK * FL_LDP, *ls = St + FL_BK * FL_LDP, *dl = ls + FL_BK;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    int dcol[G], mcol[G];
FL_UNROLL
    for (int g = 0; g < G; g++) dcol[g] = min(tx * 4 + 64 * g, Dw - 4), mcol[g] = min(tx * 4 + 64 * g, Mw - 4);
    const int ntk = (a.L + FL_BK - 1) / FL_BK;
    for (long long sl = blockIdx.x; sl < a.n_slices; sl += gridDim.x)
        for (int y = blockIdx.y; y < ntk; y += gridDim.y) {
            const int k0 = y * FL_BK, nk = min(FL_BK, a.L - k0); /* causal: key tile 0 has the most queries */
            const float *qg = a.q + sl * a.sq, *og = a.dout + sl * a.so;
            __syncthreads();
            fl_load(Ks, ldd, Dw, FL_BK, a.k + sl * a.sk + (long long)k0 * D, D, nk, a.vec_qk, false);
            fl_load(Vs, ldm, Mw, FL_BK, a.v + sl * a.sv + (long long)k0 * M, M, nk, a.vec_vo, false);
            float dk[4][G][4], dv[4][G][4];
FL_UNROLL
            for (int i = 0; i < 4; i++)
FL_UNROLL
                for (int g = 0; g < G; g++)
FL_UNROLL
                    for (int e = 0; e < 4; e++) dk[i][g][e] = dv[i][g][e] = 0.0f;
            int ib, ie;
            fl_queries_of(a, k0, k0 + nk, &ib, &ie);
            for (int q0 = ib / FL_BK * FL_BK; q0 < ie; q0 += FL_BK) {
                const int nq = min(FL_BK, a.L - q0);
                __syncthreads(); /* K, V are in; the previous query tile's reads are done */
                fl_load(Qs, ldd, Dw, FL_BK, qg + (long long)q0 * D, D, nq, a.vec_qk, false);
                fl_load(Os, ldm, Mw, FL_BK, og + (long long)q0 * M, M, nq, a.vec_vo, false);
                for (int e = tid; e < FL_BK; e += FL_THREADS) {
                    ls[e] = e < nq ? a.lse[sl * a.sl + q0 + e] : 0.0f;
                    dl[e] = e < nq ? a.delta[sl * a.sl + q0 + e] : 0.0f;
                }
                __syncthreads();
                float st[4][4], dp[4][4];
                fl_acc_nt(st, Ks, Qs, ldd, Dw, ty, tx);
                fl_acc_nt(dp, Vs, Os, ldm, Mw, ty, tx);
                const bool full = fl_full(a, q0, FL_BK, k0, FL_BK);
FL_UNROLL
                for (int i = 0; i < 4; i++)
FL_UNROLL
                    for (int j = 0; j < 4; j++) {
                        const int c = tx + 16 * j;
                        const float p = full || fl_valid(a, q0 + c, k0 + ty + 16 * i) ? exp2f(st[i][j] * a.cl - ls[c]) : 0.0f;
                        Pt[(ty + 16 * i) * FL_LDP + c] = p;
                        St[(ty + 16 * i) * FL_LDP + c] = p * (dp[i][j] - dl[c]);
                    }
                __syncthreads();
                fl_acc_nn<G>(dv, Pt, Os, ldm, mcol, ty);
                fl_acc_nn<G>(dk, St, Qs, ldd, dcol, ty);
                if (ATOMIC_DQ) {
                    /* dQ[q0 + ty + 16 i][dcol] += scale sum_r dS^T[r][ty + 16 i] K[r][dcol] */
                    float dq[4][G][4];
FL_UNROLL
                    for (int i = 0; i < 4; i++)
FL_UNROLL
                        for (int g = 0; g < G; g++) dq[i][g][0] = dq[i][g][1] = dq[i][g][2] = dq[i][g][3] = 0.0f;
                    for (int r = 0; r < FL_BK; r++) {
                        float4 kv[G];
FL_UNROLL
                        for (int g = 0; g < G; g++) kv[g] = *reinterpret_cast<const float4 *>(Ks + r * ldd + dcol[g]);
FL_UNROLL
                        for (int i = 0; i < 4; i++) {
                            const float sv = St[r * FL_LDP + ty + 16 * i];
FL_UNROLL
                            for (int g = 0; g < G; g++) {
                                dq[i][g][0] = fmaf(sv, kv[g].x, dq[i][g][0]);
                                dq[i][g][1] = fmaf(sv, kv[g].y, dq[i][g][1]);
                                dq[i][g][2] = fmaf(sv, kv[g].z, dq[i][g][2]);
                                dq[i][g][3] = fmaf(sv, kv[g].w, dq[i][g][3]);
                            }
                        }
                    }
FL_UNROLL
                    for (int i = 0; i < 4; i++) {
                        const int qi = q0 + ty + 16 * i;
                        if (qi >= a.L) continue;
                        float *row = a.dq + sl * a.sq + (long long)qi * D;
FL_UNROLL
                        for (int g = 0; g < G; g++)
FL_UNROLL
                            for (int e = 0; e < 4; e++) {
                                const int c = tx * 4 + 64 * g + e;
                                if (c < D) atomicAdd(row + c, a.scale * dq[i][g][e]);
                            }
                    }
                }
            }
FL_UNROLL
            for (int i = 0; i < 4; i++) {
                const int kj = k0 + ty + 16 * i;
                if (kj >= a.L) continue;
                float *krow = a.dk + sl * a.sk + (long long)kj * D, *vrow = a.dv + sl * a.sv + (long long)kj * M;
FL_UNROLL
                for (int g = 0; g < G; g++) {
                    const float sc = a.scale;
                    fl_store4(krow, tx * 4 + 64 * g, D,
                              make_float4(dk[i][g][0] * sc, dk[i][g][1] * sc, dk[i][g][2] * sc, dk[i][g][3] * sc),
                              a.vec_qk);
                    fl_store4(vrow, tx * 4 + 64 * g, M, make_float4(dv[i][g][0], dv[i][g][1], dv[i][g][2], dv[i][g][3]),
                              a.vec_vo);
                }
            }
        }
}

/* dQ: a block per query tile (rows: queries ty + 16 i), over the key tiles it sees
 * (columns: keys tx + 16 j): S = Q K^T, dP = dO V^T in registers, dS into shared
 * memory, dQ += dS K in registers. Shared: Q, K (64 x ldd), dO, V (64 x ldm), dS. */
static inline size_t fl_bwd_dq_smem(int D, int M) {
    return ((size_t)2 * FL_BK * fl_ld(D) + (size_t)2 * FL_BK * fl_ld(M) + FL_BK * FL_LDP) * sizeof(float);
}

template <int G>
static __global__ void __launch_bounds__(FL_THREADS, G == 1 ? 2 : 1) fl_bwd_dq_simt(flash_args a) {
    AB_DYN_SMEM(float, sm);
    const int D = a.D, M = a.M, Dw = fl_round(D, 4), Mw = fl_round(M, 4), ldd = fl_ld(D), ldm = fl_ld(M);
    float *Qs = sm, *Ks = Qs + FL_BK * ldd, *Os = Ks + FL_BK * ldd, *Vs = Os + FL_BK * ldm, *Ss = Vs + FL_BK * ldm;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    int dcol[G];
FL_UNROLL
    for (int g = 0; g < G; g++) dcol[g] = min(tx * 4 + 64 * g, Dw - 4);
    const int ntq = (a.L + FL_BK - 1) / FL_BK;
    for (long long sl = blockIdx.x; sl < a.n_slices; sl += gridDim.x)
        for (int y = blockIdx.y; y < ntq; y += gridDim.y) {
            const int q0 = (ntq - 1 - y) * FL_BK, nq = min(FL_BK, a.L - q0); /* causal: the longest rows first */
            const float *kg = a.k + sl * a.sk, *vg = a.v + sl * a.sv;
            __syncthreads();
            fl_load(Qs, ldd, Dw, FL_BK, a.q + sl * a.sq + (long long)q0 * D, D, nq, a.vec_qk, false);
            fl_load(Os, ldm, Mw, FL_BK, a.dout + sl * a.so + (long long)q0 * M, M, nq, a.vec_vo, false);
            float lr[4], dr[4], dq[4][G][4];
FL_UNROLL
            for (int i = 0; i < 4; i++) {
                const int qi = q0 + ty + 16 * i;
                lr[i] = qi < a.L ? a.lse[sl * a.sl + qi] : 0.0f;
                dr[i] = qi < a.L ? a.delta[sl * a.sl + qi] : 0.0f;
FL_UNROLL
                for (int g = 0; g < G; g++) dq[i][g][0] = dq[i][g][1] = dq[i][g][2] = dq[i][g][3] = 0.0f;
            }
            int kb, ke;
            fl_keys_of(a, q0, q0 + nq, &kb, &ke);
            for (int k0 = kb / FL_BK * FL_BK; k0 < ke; k0 += FL_BK) {
                const int nk = min(FL_BK, a.L - k0);
                __syncthreads();
                fl_load(Ks, ldd, Dw, FL_BK, kg + (long long)k0 * D, D, nk, a.vec_qk, false);
                fl_load(Vs, ldm, Mw, FL_BK, vg + (long long)k0 * M, M, nk, a.vec_vo, false);
                __syncthreads();
                float s[4][4], dp[4][4];
                fl_acc_nt(s, Qs, Ks, ldd, Dw, ty, tx);
                fl_acc_nt(dp, Os, Vs, ldm, Mw, ty, tx);
                const bool full = fl_full(a, q0, FL_BK, k0, FL_BK);
FL_UNROLL
                for (int i = 0; i < 4; i++)
FL_UNROLL
                    for (int j = 0; j < 4; j++) {
                        const int c = tx + 16 * j;
                        const float p = full || fl_valid(a, q0 + ty + 16 * i, k0 + c) ? exp2f(s[i][j] * a.cl - lr[i]) : 0.0f;
                        Ss[(ty + 16 * i) * FL_LDP + c] = p * (dp[i][j] - dr[i]);
                    }
                __syncthreads();
                fl_acc_nn<G>(dq, Ss, Ks, ldd, dcol, ty);
            }
FL_UNROLL
            for (int i = 0; i < 4; i++) {
                const int qi = q0 + ty + 16 * i;
                if (qi >= a.L) continue;
                float *row = a.dq + sl * a.sq + (long long)qi * D;
                const float sc = a.scale;
FL_UNROLL
                for (int g = 0; g < G; g++)
                    fl_store4(row, tx * 4 + 64 * g, D,
                              make_float4(dq[i][g][0] * sc, dq[i][g][1] * sc, dq[i][g][2] * sc, dq[i][g][3] * sc),
                              a.vec_qk);
            }
        }
}

#endif
