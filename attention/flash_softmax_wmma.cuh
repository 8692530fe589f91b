/* The fused softmax kernels with their products on the tensor cores (TF32 wmma
 * m16n16k8; flash_softmax.cuh lists them). C++ (CUDA). */
#ifndef ATTN_FLASH_SOFTMAX_WMMA_CUH
#define ATTN_FLASH_SOFTMAX_WMMA_CUH

#include "flash_softmax_simt.cuh"

/* ---- TF32 tensor cores (wmma m16n16k8) ----
 *
 * 8 warps; tiles of 64 x 64 scores are 16 fragments of 16 x 16, two per warp (warp w:
 * rows 16 (w / 2), columns 32 (w % 2) .. + 32). Operands are rounded to TF32 once, when
 * they enter shared memory. The elementwise steps run with 4 threads per row (row
 * tid / 4, columns tid % 4 + 4 e), reading and writing the scores in shared memory. */
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 8, nvcuda::wmma::precision::tf32,
                               nvcuda::wmma::row_major>
    fl_frag_a;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 8, nvcuda::wmma::precision::tf32,
                               nvcuda::wmma::col_major>
    fl_frag_bt;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 8, nvcuda::wmma::precision::tf32,
                               nvcuda::wmma::row_major>
    fl_frag_b;
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float> fl_frag_c;

/* c += A B^T: A 16 x K at a (row-major, lda), B 16 x K at b (row-major, ldb); K % 8 == 0. */
static __device__ __forceinline__ void fl_mma_nt(fl_frag_c &c, const float *a, int lda, const float *b, int ldb,
                                                 int K) {
    fl_frag_a fa;
    fl_frag_bt fb;
    for (int k = 0; k < K; k += 8) {
        nvcuda::wmma::load_matrix_sync(fa, a + k, lda);
        nvcuda::wmma::load_matrix_sync(fb, b + k, ldb);
        nvcuda::wmma::mma_sync(c, fa, fb, c);
    }
}

/* c += A B: A 16 x K at a (row-major, lda), B K x 16 at b (row-major, ldb). */
static __device__ __forceinline__ void fl_mma_nn(fl_frag_c &c, const float *a, int lda, const float *b, int ldb,
                                                 int K) {
    fl_frag_a fa;
    fl_frag_b fb;
FL_UNROLL_BY(1)
    for (int k = 0; k < K; k += 8) {
        nvcuda::wmma::load_matrix_sync(fa, a + k, lda);
        nvcuda::wmma::load_matrix_sync(fb, b + (long long)k * ldb, ldb);
        nvcuda::wmma::mma_sync(c, fa, fb, c);
    }
}

/* The two 16 x 16 fragments of warp w in a 64 x 64 product A B^T (A, B: 64 x K,
 * row-major), stored row-major into C (stride FL_LDP). */
static __device__ __forceinline__ void fl_tile_nt(float *C, const float *A, int lda, const float *B, int ldb, int K,
                                                  int w) {
    const int rb = w >> 1, cb = (w & 1) * 2;
    fl_frag_c c0, c1;
    nvcuda::wmma::fill_fragment(c0, 0.0f);
    nvcuda::wmma::fill_fragment(c1, 0.0f);
    fl_mma_nt(c0, A + rb * 16 * lda, lda, B + cb * 16 * ldb, ldb, K);
    fl_mma_nt(c1, A + rb * 16 * lda, lda, B + (cb + 1) * 16 * ldb, ldb, K);
    nvcuda::wmma::store_matrix_sync(C + rb * 16 * FL_LDP + cb * 16, c0, FL_LDP, nvcuda::wmma::mem_row_major);
    nvcuda::wmma::store_matrix_sync(C + rb * 16 * FL_LDP + (cb + 1) * 16, c1, FL_LDP, nvcuda::wmma::mem_row_major);
}

/* Forward: S = Q K^T (fragments) -> shared; 4 threads per row do the online softmax
 * and keep the row's O (columns t4 + 4 e) in registers; P V of each key tile is a
 * fresh product (fragments) -> shared, which the row's threads add after rescaling
 * (O = alpha (O + (P V)_prev)). So nothing per-row ever touches a fragment.
 * Shared: Q, K (64 x ldd), V, (P V) (64 x ldm), S / P (64 x 68). */
static inline size_t fl_fwd_wmma_smem(int D, int M) {
    return ((size_t)2 * FL_BK * fl_ld(D) + (size_t)2 * FL_BK * fl_ld(M) + FL_BK * FL_LDP) * sizeof(float);
}

template <int G>
static __global__ void __launch_bounds__(FL_THREADS, G == 1 ? 2 : 1) fl_fwd_wmma(flash_args a) {
    constexpr int OE = 16 * G; /* O columns per thread: t4 + 4 e */
    AB_DYN_SMEM(float, sm);
    const int D = a.D, M = a.M, Dn = fl_round(D, 16), Mn = fl_round(M, 16), ldd = fl_ld(D), ldm = fl_ld(M);
    const int Dk = fl_round(D, 8);
    float *Qs = sm, *Ks = Qs + FL_BK * ldd, *Vs = Ks + FL_BK * ldd, *Ot = Vs + FL_BK * ldm, *Ss = Ot + FL_BK * ldm;
    const int tid = threadIdx.x, w = tid >> 5, row = tid >> 2, t4 = tid & 3;
    const int ntq = (a.L + FL_BK - 1) / FL_BK, npv = 4 * (Mn / 16);
    for (long long sl = blockIdx.x; sl < a.n_slices; sl += gridDim.x)
        for (int y = blockIdx.y; y < ntq; y += gridDim.y) {
            const int q0 = (ntq - 1 - y) * FL_BK, nq = min(FL_BK, a.L - q0), qi = q0 + row;
            const float *kg = a.k + sl * a.sk, *vg = a.v + sl * a.sv;
            __syncthreads();
            fl_load(Qs, ldd, Dn, FL_BK, a.q + sl * a.sq + (long long)q0 * D, D, nq, a.vec_qk, true);
            float o[OE], m = -INFINITY, l = 0.0f;
FL_UNROLL
            for (int e = 0; e < OE; e++) o[e] = 0.0f;
            bool first = true;
            int kb, ke;
            fl_keys_of(a, q0, q0 + nq, &kb, &ke);
            for (int k0 = kb / FL_BK * FL_BK; k0 < ke; k0 += FL_BK) {
                const int nk = min(FL_BK, a.L - k0);
                __syncthreads(); /* the previous P V is done reading V and P */
                fl_load(Ks, ldd, Dn, FL_BK, kg + (long long)k0 * D, D, nk, a.vec_qk, true);
                fl_load(Vs, ldm, Mn, FL_BK, vg + (long long)k0 * M, M, nk, a.vec_vo, true);
                __syncthreads();
                fl_tile_nt(Ss, Qs, ldd, Ks, ldd, Dk, w);
                __syncthreads();
                const bool full = fl_full(a, q0, FL_BK, k0, FL_BK);
                float sv[16], mx = -INFINITY;
FL_UNROLL
                for (int e = 0; e < 16; e++) {
                    float x = Ss[row * FL_LDP + t4 + 4 * e] * a.cl;
                    if (!full && !fl_valid(a, qi, k0 + t4 + 4 * e)) x = -INFINITY;
                    sv[e] = x;
                    mx = fmaxf(mx, x);
                }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mn = fmaxf(m, mx), mu = mn == -INFINITY ? 0.0f : mn;
                const float al = exp2f(m - mu);
                m = mn;
                float ps = 0.0f;
FL_UNROLL
                for (int e = 0; e < 16; e++) {
                    const float p = fl_tf32(exp2f(sv[e] - mu));
                    Ss[row * FL_LDP + t4 + 4 * e] = p;
                    ps += p;
                }
                l = l * al + ps;
FL_UNROLL
                for (int e = 0; e < OE; e++)
                    if (t4 + 4 * e < Mn) o[e] = first ? 0.0f : al * (o[e] + Ot[row * ldm + t4 + 4 * e]);
                first = false;
                __syncthreads(); /* P is in; the previous P V has been added */
                for (int t = w; t < npv; t += 8) {
                    fl_frag_c c;
                    nvcuda::wmma::fill_fragment(c, 0.0f);
                    fl_mma_nn(c, Ss + (t & 3) * 16 * FL_LDP, FL_LDP, Vs + (t >> 2) * 16, ldm, FL_BK);
                    nvcuda::wmma::store_matrix_sync(Ot + (t & 3) * 16 * ldm + (t >> 2) * 16, c, ldm,
                                                    nvcuda::wmma::mem_row_major);
                }
            }
            __syncthreads(); /* the last P V is in */
FL_UNROLL
            for (int e = 0; e < OE; e++)
                if (t4 + 4 * e < Mn) o[e] += Ot[row * ldm + t4 + 4 * e];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            if (qi < a.L) {
                const float inv = 1.0f / l;
                float *orow = a.o + sl * a.so + (long long)qi * M;
                float *o2row = a.o2 ? a.o2 + sl * a.so + (long long)qi * M : NULL;
FL_UNROLL
                for (int e = 0; e < OE; e++) {
                    const int c = t4 + 4 * e;
                    if (c < M) {
                        orow[c] = o[e] * inv;
                        if (o2row) o2row[c] = o[e] * inv;
                    }
                }
                if (a.lse && t4 == 0) a.lse[sl * a.sl + qi] = m + log2f(l);
            }
        }
}

/* dK, dV on the tensor cores: a block per key tile; per query tile S^T = K Q^T and
 * dP^T = V dO^T (fragments) -> shared, P^T and dS^T elementwise in shared memory (4
 * threads per key row), then dV += P^T dO and dK += dS^T Q into fragments that persist
 * across the query tiles (sums only: no per-row step touches them). Warp w owns the
 * output fragments w + 8 u. Shared: K, Q (64 x ldd), V, dO (64 x ldm), S^T, dP^T
 * (64 x 68), lse, delta (64). */
static inline size_t fl_bwd_dkdv_wmma_smem(int D, int M) { return fl_bwd_dkdv_smem(D, M); }

template <int G>
static __global__ void __launch_bounds__(FL_THREADS, G == 1 ? 2 : 1) fl_bwd_dkdv_wmma(flash_args a) {
    AB_DYN_SMEM(float, sm);
    const int D = a.D, M = a.M, Dn = fl_round(D, 16), Mn = fl_round(M, 16), ldd = fl_ld(D), ldm = fl_ld(M);
    const int Dk = fl_round(D, 8), Mk = fl_round(M, 8);
    float *Ks = sm, *Vs = Ks + FL_BK * ldd, *Qs = Vs + FL_BK * ldm, *Os = Qs + FL_BK * ldd;
    float *Ss = Os + FL_BK * ldm, *Ps = Ss + FL_BK * FL_LDP, *ls = Ps + FL_BK * FL_LDP, *dl = ls + FL_BK;
    const int tid = threadIdx.x, w = tid >> 5, row = tid >> 2, t4 = tid & 3;
    const int ntd = 4 * (Dn / 16), ntm = 4 * (Mn / 16);
    const int ntk = (a.L + FL_BK - 1) / FL_BK;
    for (long long sl = blockIdx.x; sl < a.n_slices; sl += gridDim.x)
        for (int y = blockIdx.y; y < ntk; y += gridDim.y) {
            const int k0 = y * FL_BK, nk = min(FL_BK, a.L - k0), kj = k0 + row;
            const float *qg = a.q + sl * a.sq, *og = a.dout + sl * a.so;
            __syncthreads();
            fl_load(Ks, ldd, Dn, FL_BK, a.k + sl * a.sk + (long long)k0 * D, D, nk, a.vec_qk, true);
            fl_load(Vs, ldm, Mn, FL_BK, a.v + sl * a.sv + (long long)k0 * M, M, nk, a.vec_vo, true);
            fl_frag_c dk[2 * G], dv[2 * G];
FL_UNROLL
            for (int u = 0; u < 2 * G; u++) {
                nvcuda::wmma::fill_fragment(dk[u], 0.0f);
                nvcuda::wmma::fill_fragment(dv[u], 0.0f);
            }
            int ib, ie;
            fl_queries_of(a, k0, k0 + nk, &ib, &ie);
            for (int q0 = ib / FL_BK * FL_BK; q0 < ie; q0 += FL_BK) {
                const int nq = min(FL_BK, a.L - q0);
                __syncthreads();
                fl_load(Qs, ldd, Dn, FL_BK, qg + (long long)q0 * D, D, nq, a.vec_qk, true);
                fl_load(Os, ldm, Mn, FL_BK, og + (long long)q0 * M, M, nq, a.vec_vo, true);
                for (int e = tid; e < FL_BK; e += FL_THREADS) {
                    ls[e] = e < nq ? a.lse[sl * a.sl + q0 + e] : 0.0f;
                    dl[e] = e < nq ? a.delta[sl * a.sl + q0 + e] : 0.0f;
                }
                __syncthreads();
                fl_tile_nt(Ss, Ks, ldd, Qs, ldd, Dk, w); /* S^T: keys x queries */
                fl_tile_nt(Ps, Vs, ldm, Os, ldm, Mk, w); /* dP^T */
                __syncthreads();
                const bool full = fl_full(a, q0, FL_BK, k0, FL_BK);
FL_UNROLL_BY(4)
                for (int e = 0; e < 16; e++) {
                    const int c = t4 + 4 * e, x = row * FL_LDP + c;
                    const float p = full || fl_valid(a, q0 + c, kj) ? exp2f(Ss[x] * a.cl - ls[c]) : 0.0f;
                    const float ds = p * (Ps[x] - dl[c]);
                    Ss[x] = fl_tf32(p);
                    Ps[x] = fl_tf32(ds);
                }
                __syncthreads();
FL_UNROLL
                for (int u = 0; u < 2 * G; u++) {
                    const int t = w + 8 * u;
                    if (t < ntm) fl_mma_nn(dv[u], Ss + (t & 3) * 16 * FL_LDP, FL_LDP, Os + (t >> 2) * 16, ldm, FL_BK);
                    if (t < ntd) fl_mma_nn(dk[u], Ps + (t & 3) * 16 * FL_LDP, FL_LDP, Qs + (t >> 2) * 16, ldd, FL_BK);
                }
            }
            __syncthreads(); /* Q and dO are free: the results go through them */
FL_UNROLL
            for (int u = 0; u < 2 * G; u++) {
                const int t = w + 8 * u;
                if (t < ntd)
                    nvcuda::wmma::store_matrix_sync(Qs + (t & 3) * 16 * ldd + (t >> 2) * 16, dk[u], ldd,
                                                    nvcuda::wmma::mem_row_major);
                if (t < ntm)
                    nvcuda::wmma::store_matrix_sync(Os + (t & 3) * 16 * ldm + (t >> 2) * 16, dv[u], ldm,
                                                    nvcuda::wmma::mem_row_major);
            }
            __syncthreads();
            fl_store_tile(a.dk + sl * a.sk + (long long)k0 * D, D, Qs, ldd, nk, a.scale, a.vec_qk);
            fl_store_tile(a.dv + sl * a.sv + (long long)k0 * M, M, Os, ldm, nk, 1.0f, a.vec_vo);
        }
}

/* dQ on the tensor cores: a block per query tile; per key tile S = Q K^T and
 * dP = dO V^T -> shared, dS elementwise, dQ += dS K into persistent fragments.
 * Shared: Q, K (64 x ldd), dO, V (64 x ldm), S, dP (64 x 68). */
static inline size_t fl_bwd_dq_wmma_smem(int D, int M) {
    return ((size_t)2 * FL_BK * fl_ld(D) + (size_t)2 * FL_BK * fl_ld(M) + 2 * FL_BK * FL_LDP) * sizeof(float);
}

template <int G>
static __global__ void __launch_bounds__(FL_THREADS, G == 1 ? 2 : 1) fl_bwd_dq_wmma(flash_args a) {
    AB_DYN_SMEM(float, sm);
    const int D = a.D, M = a.M, Dn = fl_round(D, 16), Mn = fl_round(M, 16), ldd = fl_ld(D), ldm = fl_ld(M);
    const int Dk = fl_round(D, 8), Mk = fl_round(M, 8);
    float *Qs = sm, *Ks = Qs + FL_BK * ldd, *Os = Ks + FL_BK * ldd, *Vs = Os + FL_BK * ldm;
    float *Ss = Vs + FL_BK * ldm, *Ps = Ss + FL_BK * FL_LDP;
    const int tid = threadIdx.x, w = tid >> 5, row = tid >> 2, t4 = tid & 3;
    const int ntd = 4 * (Dn / 16);
    const int ntq = (a.L + FL_BK - 1) / FL_BK;
    for (long long sl = blockIdx.x; sl < a.n_slices; sl += gridDim.x)
        for (int y = blockIdx.y; y < ntq; y += gridDim.y) {
            const int q0 = (ntq - 1 - y) * FL_BK, nq = min(FL_BK, a.L - q0), qi = q0 + row;
            const float *kg = a.k + sl * a.sk, *vg = a.v + sl * a.sv;
            __syncthreads();
            fl_load(Qs, ldd, Dn, FL_BK, a.q + sl * a.sq + (long long)q0 * D, D, nq, a.vec_qk, true);
            fl_load(Os, ldm, Mn, FL_BK, a.dout + sl * a.so + (long long)q0 * M, M, nq, a.vec_vo, true);
            const float lr = qi < a.L ? a.lse[sl * a.sl + qi] : 0.0f, dr = qi < a.L ? a.delta[sl * a.sl + qi] : 0.0f;
            fl_frag_c dq[2 * G];
FL_UNROLL
            for (int u = 0; u < 2 * G; u++) nvcuda::wmma::fill_fragment(dq[u], 0.0f);
            int kb, ke;
            fl_keys_of(a, q0, q0 + nq, &kb, &ke);
            for (int k0 = kb / FL_BK * FL_BK; k0 < ke; k0 += FL_BK) {
                const int nk = min(FL_BK, a.L - k0);
                __syncthreads();
                fl_load(Ks, ldd, Dn, FL_BK, kg + (long long)k0 * D, D, nk, a.vec_qk, true);
                fl_load(Vs, ldm, Mn, FL_BK, vg + (long long)k0 * M, M, nk, a.vec_vo, true);
                __syncthreads();
                fl_tile_nt(Ss, Qs, ldd, Ks, ldd, Dk, w);
                fl_tile_nt(Ps, Os, ldm, Vs, ldm, Mk, w);
                __syncthreads();
                const bool full = fl_full(a, q0, FL_BK, k0, FL_BK);
FL_UNROLL_BY(4)
                for (int e = 0; e < 16; e++) {
                    const int c = t4 + 4 * e, x = row * FL_LDP + c;
                    const float p = full || fl_valid(a, qi, k0 + c) ? exp2f(Ss[x] * a.cl - lr) : 0.0f;
                    Ps[x] = fl_tf32(p * (Ps[x] - dr));
                }
                __syncthreads();
FL_UNROLL
                for (int u = 0; u < 2 * G; u++) {
                    const int t = w + 8 * u;
                    if (t < ntd) fl_mma_nn(dq[u], Ps + (t & 3) * 16 * FL_LDP, FL_LDP, Ks + (t >> 2) * 16, ldd, FL_BK);
                }
            }
            __syncthreads();
FL_UNROLL
            for (int u = 0; u < 2 * G; u++) {
                const int t = w + 8 * u;
                if (t < ntd)
                    nvcuda::wmma::store_matrix_sync(Qs + (t & 3) * 16 * ldd + (t >> 2) * 16, dq[u], ldd,
                                                    nvcuda::wmma::mem_row_major);
            }
            __syncthreads();
            fl_store_tile(a.dq + sl * a.sq + (long long)q0 * D, D, Qs, ldd, nq, a.scale, a.vec_qk);
        }
}

#endif
