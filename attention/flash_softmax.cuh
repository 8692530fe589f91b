/* The fused softmax attention kernels (forward and backward), shared by the library
 * (attention/flash_softmax.cu, whose header comment has the design, the sizes and the
 * performance notes) and the kernel lab (attention/lab/flash_softmax.cu), so the lab
 * measures the code that ships. C++ (CUDA); include after harness/cuda_compat.h.
 *
 * Kernels (every one takes a flash_args, attention/flash_softmax.h):
 *   fl_fwd_simt<TR, G>        fp32 forward: 16 TR query rows x 64 keys per step, 256
 *                             threads as 16 x 16, a thread TR rows x 4 keys of S and TR
 *                             rows x 4 G columns of O in registers; online softmax.
 *   fl_delta                  backward's delta_i = dO_i . O_i (a warp per row).
 *   fl_bwd_dkdv_simt<G, A>    fp32: a block per 64 keys, dK and dV in registers across
 *                             the query tiles (A: also dQ by atomics, the lab's variant).
 *   fl_bwd_dq_simt<G>         fp32: a block per 64 queries, dQ in registers across the
 *                             key tiles (the deterministic second pass).
 *   fl_fwd_wmma<G>, fl_bwd_dkdv_wmma<G>, fl_bwd_dq_wmma<G>
 *                             the same with the products on the tensor cores (TF32
 *                             m16n16k8), S and P through shared memory (the fragment
 *                             layout is unspecified: every per-row or per-column step
 *                             reads and writes shared memory, never fragment elements).
 *   fl_fwd_rows, fl_bwd_dkdv_rows, fl_bwd_dq_rows
 *                             generic: a warp per row, any D and M (the fallback above
 *                             128, and the lab's naive version).
 * G is the number of 64-column groups of the head dims (D, M <= 64 G; G = 1 or 2).
 * The launchers fl_run_* (bottom) size the shared memory, raise the limit above 48 KiB
 * (checked) and launch on the library's stream (checked). */
#ifndef ATTN_FLASH_SOFTMAX_CUH
#define ATTN_FLASH_SOFTMAX_CUH

#include "../harness/cuda_compat.h"
#include "flash_softmax.h"

#include <math.h>

#define FL_THREADS 256
#define FL_BK 64            /* keys per tile (and queries per tile of the backward) */
#define FL_LDP (FL_BK + 4)  /* row stride of the score tiles in shared memory */
#define FL_ROWS_WARPS 4     /* warps per block of the row kernels */

/* Loop unrolling for nvcc (g++ of the emulated build does not know the pragma). */
#ifdef AB_CUDA_EMU
#define FL_UNROLL
#define FL_UNROLL_BY(n)
#else
#define FL_UNROLL _Pragma("unroll")
#define FL_UNROLL_BY_(s) _Pragma(#s)
#define FL_UNROLL_BY(n) FL_UNROLL_BY_(unroll n)
#endif

/* ---- geometry and masks ---- */

static __host__ __device__ __forceinline__ int fl_round(int x, int m) { return (x + m - 1) / m * m; }
/* Row stride of a tile of width x in shared memory: 4 (mod 32) floats, so that the 16
 * float4 reads of one column position by 16 rows (a half-warp) fill two wavefronts
 * without conflicts, and a multiple of 4 (float4 and wmma alignment). */
static __host__ __device__ __forceinline__ int fl_ld(int x) { return fl_round(x, 32) + 4; }

/* Keys [*k0, *k1) that some query of [q0, q1) sees (q1 <= L). */
static __host__ __device__ __forceinline__ void fl_keys_of(const flash_args &a, int q0, int q1, int *k0, int *k1) {
    const long long lo = (long long)q0 - (a.window - 1), hi = a.causal ? (long long)q1 : (long long)q1 - 1 + a.window;
    *k0 = lo < 0 ? 0 : (int)lo;
    *k1 = hi > a.L ? a.L : (int)hi;
}

/* Queries [*i0, *i1) that see some key of [j0, j1) (j1 <= L). */
static __host__ __device__ __forceinline__ void fl_queries_of(const flash_args &a, int j0, int j1, int *i0, int *i1) {
    const long long lo = a.causal ? (long long)j0 : (long long)j0 - (a.window - 1), hi = (long long)j1 - 1 + a.window;
    *i0 = lo < 0 ? 0 : (int)lo;
    *i1 = hi > a.L ? a.L : (int)hi;
}

/* Query i sees key j. */
static __device__ __forceinline__ bool fl_valid(const flash_args &a, int i, int j) {
    return i < a.L && j < a.L && i - j < a.window && (a.causal ? j <= i : j - i < a.window);
}

/* Every query of [q0, q0 + nq) sees every key of [k0, k0 + nk): the tile needs no mask. */
static __device__ __forceinline__ bool fl_full(const flash_args &a, int q0, int nq, int k0, int nk) {
    const long long ql = (long long)q0 + nq - 1, kl = (long long)k0 + nk - 1;
    return ql < a.L && kl < a.L && ql - k0 < a.window && (a.causal ? kl <= q0 : kl - q0 < a.window);
}

static __device__ __forceinline__ float fl_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float fl_tf32(float x) { return nvcuda::wmma::__float_to_tf32(x); }

/* ---- tiles between global and shared memory ---- */

/* Rows [0, nrows) x columns [0, W) of dst (row stride ld, W a multiple of 4): row r is
 * src + r X (X floats) for r < nvalid, its columns >= X zero; rows >= nvalid are zero
 * (nothing past the valid rows is read). vec: float4 loads (X % 4 == 0, src 16-byte
 * aligned). tf32: values rounded to TF32 (operands of the tensor cores). */
static __device__ __forceinline__ void fl_load(float *dst, int ld, int W, int nrows, const float *src, int X,
                                               int nvalid, bool vec, bool tf32) {
    const int w4 = W >> 2;
    for (int e = threadIdx.x; e < nrows * w4; e += blockDim.x) {
        const int r = e / w4, c = (e - r * w4) * 4;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < nvalid && c < X) {
            const float *p = src + (long long)r * X + c;
            if (vec) {
                x = __ldg(reinterpret_cast<const float4 *>(p));
            } else {
                x.x = __ldg(p);
                if (c + 1 < X) x.y = __ldg(p + 1);
                if (c + 2 < X) x.z = __ldg(p + 2);
                if (c + 3 < X) x.w = __ldg(p + 3);
            }
        }
        if (tf32) x = make_float4(fl_tf32(x.x), fl_tf32(x.y), fl_tf32(x.z), fl_tf32(x.w));
        *reinterpret_cast<float4 *>(dst + r * ld + c) = x;
    }
}

/* Columns [c, c + 4) of a global row (width X) from x (only those < X). */
static __device__ __forceinline__ void fl_store4(float *row, int c, int X, float4 x, bool vec) {
    if (c >= X) return;
    if (vec) {
        *reinterpret_cast<float4 *>(row + c) = x;
        return;
    }
    row[c] = x.x;
    if (c + 1 < X) row[c + 1] = x.y;
    if (c + 2 < X) row[c + 2] = x.z;
    if (c + 3 < X) row[c + 3] = x.w;
}

/* Rows [0, nvalid) of a shared tile (stride ld) times mul into global rows of width X. */
static __device__ __forceinline__ void fl_store_tile(float *dst, int X, const float *src, int ld, int nvalid, float mul,
                                                     bool vec) {
    const int w4 = (X + 3) >> 2;
    for (int e = threadIdx.x; e < nvalid * w4; e += blockDim.x) {
        const int r = e / w4, c = (e - r * w4) * 4;
        const float4 x = *reinterpret_cast<const float4 *>(src + r * ld + c);
        fl_store4(dst + (long long)r * X, c, X, make_float4(x.x * mul, x.y * mul, x.z * mul, x.w * mul), vec);
    }
}

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

/* ---- generic: a warp per row, any D and M ----
 *
 * The row's vectors live in shared memory, each lane its elements c = lane + 32 t (so
 * no lane reads another's: no barrier); dot products are warp sums. Shared per warp:
 * 2 (D + M) floats (fl_rows_smem). */
static __host__ __device__ __forceinline__ size_t fl_rows_warp_floats(int D, int M) { return (size_t)2 * ((size_t)D + (size_t)M); }

static __global__ void fl_fwd_rows(flash_args a) {
    AB_DYN_SMEM(float, sm);
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5, D = a.D, M = a.M;
    float *qv = sm + (threadIdx.x >> 5) * fl_rows_warp_floats(D, M), *ov = qv + D;
    const long long rows = a.n_slices * a.L;
    for (long long r = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += (long long)gridDim.x * wpb) {
        const long long sl = r / a.L;
        const int i = (int)(r - sl * a.L);
        const float *qr = a.q + sl * a.sq + (long long)i * D, *kg = a.k + sl * a.sk, *vg = a.v + sl * a.sv;
        for (int c = lane; c < D; c += 32) qv[c] = qr[c];
        for (int c = lane; c < M; c += 32) ov[c] = 0.0f;
        int kb, ke;
        fl_keys_of(a, i, i + 1, &kb, &ke); /* every key of the range is valid for row i */
        float m = -INFINITY, l = 0.0f;
        for (int j = kb; j < ke; j++) {
            const float *kr = kg + (long long)j * D, *vr = vg + (long long)j * M;
            float s = 0.0f;
            for (int c = lane; c < D; c += 32) s = fmaf(qv[c], kr[c], s);
            s = fl_warp_sum(s) * a.cl;
            const float mn = fmaxf(m, s), al = exp2f(m - mn), p = exp2f(s - mn);
            l = l * al + p;
            m = mn;
            for (int c = lane; c < M; c += 32) ov[c] = fmaf(p, vr[c], ov[c] * al);
        }
        const float inv = 1.0f / l;
        float *orow = a.o + sl * a.so + (long long)i * M;
        for (int c = lane; c < M; c += 32) orow[c] = ov[c] * inv;
        if (a.o2)
            for (int c = lane; c < M; c += 32) a.o2[sl * a.so + (long long)i * M + c] = ov[c] * inv;
        if (a.lse && lane == 0) a.lse[sl * a.sl + i] = m + log2f(l);
    }
}

static __global__ void fl_bwd_dkdv_rows(flash_args a) {
    AB_DYN_SMEM(float, sm);
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5, D = a.D, M = a.M;
    float *kv = sm + (threadIdx.x >> 5) * fl_rows_warp_floats(D, M), *vv = kv + D, *dk = vv + M, *dv = dk + D;
    const long long rows = a.n_slices * a.L;
    for (long long r = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += (long long)gridDim.x * wpb) {
        const long long sl = r / a.L;
        const int j = (int)(r - sl * a.L);
        const float *kr = a.k + sl * a.sk + (long long)j * D, *vr = a.v + sl * a.sv + (long long)j * M;
        for (int c = lane; c < D; c += 32) kv[c] = kr[c], dk[c] = 0.0f;
        for (int c = lane; c < M; c += 32) vv[c] = vr[c], dv[c] = 0.0f;
        int ib, ie;
        fl_queries_of(a, j, j + 1, &ib, &ie); /* every query of the range sees key j */
        for (int i = ib; i < ie; i++) {
            const float *qr = a.q + sl * a.sq + (long long)i * D, *gr = a.dout + sl * a.so + (long long)i * M;
            float s = 0.0f, dp = 0.0f;
            for (int c = lane; c < D; c += 32) s = fmaf(qr[c], kv[c], s);
            for (int c = lane; c < M; c += 32) dp = fmaf(gr[c], vv[c], dp);
            s = fl_warp_sum(s);
            dp = fl_warp_sum(dp);
            const float p = exp2f(s * a.cl - a.lse[sl * a.sl + i]), ds = p * (dp - a.delta[sl * a.sl + i]);
            for (int c = lane; c < M; c += 32) dv[c] = fmaf(p, gr[c], dv[c]);
            for (int c = lane; c < D; c += 32) dk[c] = fmaf(ds, qr[c], dk[c]);
        }
        float *dkr = a.dk + sl * a.sk + (long long)j * D, *dvr = a.dv + sl * a.sv + (long long)j * M;
        for (int c = lane; c < D; c += 32) dkr[c] = dk[c] * a.scale;
        for (int c = lane; c < M; c += 32) dvr[c] = dv[c];
    }
}

static __global__ void fl_bwd_dq_rows(flash_args a) {
    AB_DYN_SMEM(float, sm);
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5, D = a.D, M = a.M;
    float *qv = sm + (threadIdx.x >> 5) * fl_rows_warp_floats(D, M), *gv = qv + D, *dq = gv + M;
    const long long rows = a.n_slices * a.L;
    for (long long r = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += (long long)gridDim.x * wpb) {
        const long long sl = r / a.L;
        const int i = (int)(r - sl * a.L);
        const float *qr = a.q + sl * a.sq + (long long)i * D, *gr = a.dout + sl * a.so + (long long)i * M;
        const float *kg = a.k + sl * a.sk, *vg = a.v + sl * a.sv;
        for (int c = lane; c < D; c += 32) qv[c] = qr[c], dq[c] = 0.0f;
        for (int c = lane; c < M; c += 32) gv[c] = gr[c];
        const float lse = a.lse[sl * a.sl + i], del = a.delta[sl * a.sl + i];
        int kb, ke;
        fl_keys_of(a, i, i + 1, &kb, &ke);
        for (int j = kb; j < ke; j++) {
            const float *kr = kg + (long long)j * D, *vr = vg + (long long)j * M;
            float s = 0.0f, dp = 0.0f;
            for (int c = lane; c < D; c += 32) s = fmaf(qv[c], kr[c], s);
            for (int c = lane; c < M; c += 32) dp = fmaf(gv[c], vr[c], dp);
            s = fl_warp_sum(s);
            dp = fl_warp_sum(dp);
            const float p = exp2f(s * a.cl - lse), ds = p * (dp - del);
            for (int c = lane; c < D; c += 32) dq[c] = fmaf(ds, kr[c], dq[c]);
        }
        float *dqr = a.dq + sl * a.sq + (long long)i * D;
        for (int c = lane; c < D; c += 32) dqr[c] = dq[c] * a.scale;
    }
}

/* ---- launchers (grid: x = slices, y = tiles of the slice; both loop past the limits) ---- */

template <class K>
static inline int fl_launch(K *kernel, long long tiles, int threads, size_t smem, const flash_args &a) {
    if (smem > 48 * 1024)
        AB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid((unsigned)(a.n_slices < AB_CUDA_MAX_GRID_X ? a.n_slices : AB_CUDA_MAX_GRID_X),
                    (unsigned)(tiles < AB_CUDA_MAX_GRID_YZ ? tiles : AB_CUDA_MAX_GRID_YZ));
    AB_LAUNCH(kernel, grid, threads, smem, ab_cuda_stream(), a);
    return 0;
}

template <int TR, int G, int NT = FL_THREADS> static inline int fl_run_fwd_simt(const flash_args &a) {
    auto *k = &fl_fwd_simt<TR, G, NT>;
    constexpr int BQ = NT / 16 * TR;
    return fl_launch(k, (a.L + BQ - 1) / BQ, NT, fl_fwd_simt_smem<TR, G, NT>(a.D, a.M), a);
}

template <int G> static inline int fl_run_fwd_wmma(const flash_args &a) {
    auto *k = &fl_fwd_wmma<G>;
    return fl_launch(k, (a.L + FL_BK - 1) / FL_BK, FL_THREADS, fl_fwd_wmma_smem(a.D, a.M), a);
}

/* The row kernels' block: FL_ROWS_WARPS warps when their rows fit 48 KiB, else one
 * (with the limit raised). The caller has checked that one warp's rows fit. */
static inline int fl_rows_warps(const flash_args &a) {
    return fl_rows_warp_floats(a.D, a.M) * sizeof(float) * FL_ROWS_WARPS <= 48 * 1024 ? FL_ROWS_WARPS : 1;
}

static inline int fl_run_rows(void (*kernel)(flash_args), const flash_args &a) {
    const int nw = fl_rows_warps(a);
    const size_t smem = fl_rows_warp_floats(a.D, a.M) * sizeof(float) * nw;
    if (smem > 48 * 1024)
        AB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    AB_LAUNCH(kernel, ab_cuda_grid(a.n_slices * a.L, nw, AB_CUDA_MAX_GRID_X), 32 * nw, smem, ab_cuda_stream(), a);
    return 0;
}

static inline int fl_run_fwd_rows(const flash_args &a) { return fl_run_rows(fl_fwd_rows, a); }

static inline int fl_run_delta(const flash_args &a) {
    AB_LAUNCH(fl_delta, ab_cuda_grid(a.n_slices * a.L, 8, 1 << 20), 256, 0, ab_cuda_stream(), a);
    return 0;
}

/* Backward after fl_run_delta. ATOMIC_DQ: dq must be zero beforehand. */
template <int G, bool ATOMIC_DQ> static inline int fl_run_bwd_simt(const flash_args &a) {
    const long long tiles = (a.L + FL_BK - 1) / FL_BK;
    auto *kd = &fl_bwd_dkdv_simt<G, ATOMIC_DQ>;
    AB_TRY(fl_launch(kd, tiles, FL_THREADS, fl_bwd_dkdv_smem(a.D, a.M), a));
    if (ATOMIC_DQ) return 0;
    auto *kq = &fl_bwd_dq_simt<G>;
    return fl_launch(kq, tiles, FL_THREADS, fl_bwd_dq_smem(a.D, a.M), a);
}

template <int G> static inline int fl_run_bwd_wmma(const flash_args &a) {
    const long long tiles = (a.L + FL_BK - 1) / FL_BK;
    auto *kd = &fl_bwd_dkdv_wmma<G>;
    AB_TRY(fl_launch(kd, tiles, FL_THREADS, fl_bwd_dkdv_wmma_smem(a.D, a.M), a));
    auto *kq = &fl_bwd_dq_wmma<G>;
    return fl_launch(kq, tiles, FL_THREADS, fl_bwd_dq_wmma_smem(a.D, a.M), a);
}

static inline int fl_run_bwd_rows(const flash_args &a) {
    AB_TRY(fl_run_rows(fl_bwd_dkdv_rows, a));
    return fl_run_rows(fl_bwd_dq_rows, a);
}

#endif
