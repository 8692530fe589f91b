/* The fused linear kernels' building blocks (linear_chunk.cuh): the precisions of the
 * tile products and the k ranges of triangular operands, the kernels' arguments
 * (lc_args), tile products in shared memory (fp32 register tiles, TF32 wmma, favor's
 * split TF32), small block-wide steps, and the feature maps on shared tiles. C++ (CUDA). */
#ifndef ATTN_LINEAR_CHUNK_TILES_CUH
#define ATTN_LINEAR_CHUNK_TILES_CUH

#include "feature_maps_cuda.cuh"

#include <type_traits>

/* ---- precisions of the tile products, and the k ranges of triangular operands ---- */

enum { LC_FP32 = 0, LC_TF32 = 1, LC_TF32X3 = 2 };
/* op(A) lower triangular (nonzero for k <= row: k stops at the row tile's end) or upper
 * (k >= row: k starts at the row tile's start) */
enum { LC_K_ALL = 0, LC_K_LOWER = 1, LC_K_UPPER = 2 };
enum { LC_MAP_ELU = 0, LC_MAP_TAYLOR = 1, LC_MAP_FAVOR = 2 };

__host__ __device__ inline int lc_round16(int x) { return (x + 15) / 16 * 16; }
__host__ __device__ inline long long lc_round8(long long x) { return (x + 7) / 8 * 8; }

/* Everything a kernel reads: sizes, tensors (at the run's first slice), workspace. */
struct lc_args {
    int D, M, C, T;       /* head sizes, features, chunk */
    int Dp, Mp, Cp;       /* rounded up to 16 */
    int ldD, ldM, ldC, ldT; /* leading dimensions of the shared tiles */
    int L, nchunks, cps, nseg;
    long long ns, N;      /* slices of the run; positions per slice in the tensors */
    long long E;          /* floats of one state record: S [Cp x Mp], z [Cp], m, rounded to 8 */
    int causal;
    double eps;
    const float *W, *WT;  /* favor: the projection, zero-padded: W [Cp x Dp], WT [Dp x Cp] */
    float q4, q2, norm;   /* favor: D^-1/4, D^-1/2, C^-1/2 */
    const float *q, *k, *v, *dout;
    float *out, *dq, *dk, *dv;
    float *sst;           /* [ns][nseg] state records */
    float *tot;           /* [ns] records: the totals (non-causal) */
    float *inv, *gd;      /* [ns][N]: 1/(den+eps) and (dout.out)/(den+eps) per position */
    float *kc;            /* [ns]: favor's key shift */
    float *state, *state_kls; /* prefill: the recurrent state's Saug [C x (M+1)] per slice, key shifts */
    /* polynomial (poly_chunk.cuh): 1, its c, sqrt(2 c scale), scale; the state's rows are
     * slabs (slab 0: [c, lin x] in W0p rows, slab 1 + a: scale x_a x, Dp rows each):
     * Cp = W0p + D Dp of them; rst: the R records of its backward */
    int poly, W0p;
    float pc, plin, pscale;
    float *rst;
};

/* Offsets (floats) of a kernel's shared buffers; Xq, Xk and Qf, Kf are adjacent (so
 * both feature sets come out of one pass, favor's projections out of one product). */
enum { LC_K_STATE = 0, LC_K_FWD = 1, LC_K_DQ = 2, LC_K_DKV = 3 };
enum { LC_RW_H = 0, LC_RW_PM = 2, LC_RW_QSH = 4, LC_RW_DEN = 5, LC_RW_INV = 6, LC_RW_GCOL = 7, LC_RW_SU = 8,
       LC_RW_N = 9 }; /* row arrays, in units of T floats (H and PM: 2T each) */
struct lc_smem {
    int Xq, Xk, SX, Qf, Kf, dF, V, G, O, S, z, R, r, A, B, rows, total;
};

__host__ __device__ inline lc_smem lc_layout(const lc_args &a, int kind, bool favor) {
    lc_smem s;
    int off = 0;
    auto take = [&](int n) {
        const int o = off;
        off += (int)lc_round8(n);
        return o;
    };
    const int XT = a.T * a.ldD, FT = a.T * a.ldC, VT = a.T * a.ldM, ST = a.Cp * a.ldM, TT = a.T * a.ldT;
    const bool bwd = kind == LC_K_DQ || kind == LC_K_DKV, fwd = kind == LC_K_FWD;
    s.Xq = kind == LC_K_STATE ? -1 : take(XT);
    s.Xk = take(XT); /* adjacent to Xq: T * ldD is a multiple of 16 */
    s.Qf = kind == LC_K_STATE ? -1 : take(FT);
    s.Kf = take(FT);
    s.SX = bwd && favor ? take(XT) : -1;
    s.dF = kind == LC_K_DKV ? take(FT) : -1;
    s.V = take(VT);
    s.G = bwd ? take(VT) : -1;
    s.O = kind == LC_K_STATE ? -1 : take(kind == LC_K_DQ && FT > VT ? FT : VT);
    if (kind == LC_K_DQ) s.dF = s.O; /* pass 1 is done with O (den, gd) before it forms dphiQ */
    s.S = kind == LC_K_DKV ? -1 : take(ST);
    s.z = kind == LC_K_DKV ? -1 : take(a.Cp);
    s.R = bwd ? take(ST) : -1;
    s.r = bwd ? take(a.Cp) : -1;
    s.A = fwd || bwd ? take(TT) : -1;
    s.B = bwd ? take(TT) : -1;
    s.rows = take(LC_RW_N * a.T);
    s.total = off;
    return s;
}

/* ---- tile products in shared (or global) memory: every thread of the block calls ----
 *
 * C[m x n] (ldc) = op(A) op(B) (+ C when acc), op(A) [m x k]: A stored m x k (lda) or,
 * TA, k x m; op(B) [k x n]: B stored k x n or, TB, n x k. m, n multiples of 16, k of 8.
 * mask: C is the lower triangle of a square product (entries col > row are zero; tiles
 * wholly above the diagonal are not computed). kmode: op(A) is triangular (LC_K_*), so
 * the k range of a row tile is cut. No barrier inside; the caller synchronises. */

/* fp32: each thread a micro-tile of RM consecutive rows x 4 columns strided by n/4 (so
 * a warp's B loads are consecutive and its A loads broadcasts). */
template <int RM, bool TA, bool TB>
__device__ __forceinline__ void lc_mm_simt(int m, int n, int k, const float *A, int lda, const float *B, int ldb,
                                           float *Cm, int ldc, bool acc, bool mask, int kmode) {
    const int tm = m / RM, tn = n / 4;
    for (int t = threadIdx.x; t < tm * tn; t += blockDim.x) {
        const int i0 = (t / tn) * RM, jt = t % tn;
        float s[RM][4];
        for (int r = 0; r < RM; r++)
            for (int c = 0; c < 4; c++) s[r][c] = 0.0f;
        int k0 = 0, k1 = k;
        if (kmode == LC_K_LOWER) k1 = min(k, i0 + RM);
        else if (kmode == LC_K_UPPER) k0 = i0;
        if (!(mask && jt > i0 + RM - 1)) /* wholly above the diagonal: zeros */
            for (int kk = k0; kk < k1; kk++) {
                float av[RM], bv[4];
                for (int r = 0; r < RM; r++) av[r] = TA ? A[(long long)kk * lda + i0 + r] : A[(long long)(i0 + r) * lda + kk];
                for (int c = 0; c < 4; c++)
                    bv[c] = TB ? B[(long long)(jt + c * tn) * ldb + kk] : B[(long long)kk * ldb + jt + c * tn];
                for (int r = 0; r < RM; r++)
                    for (int c = 0; c < 4; c++) s[r][c] = fmaf(av[r], bv[c], s[r][c]);
            }
        for (int r = 0; r < RM; r++)
            for (int c = 0; c < 4; c++) {
                const int i = i0 + r, j = jt + c * tn;
                float *p = Cm + (long long)i * ldc + j;
                const float v = mask && j > i ? 0.0f : s[r][c];
                *p = acc ? *p + v : v;
            }
    }
}

/* tf32: each warp 16 x 16 output tiles; operands rounded to tf32 (SPLIT 3: each operand
 * split as hi + lo, both tf32, and hi hi + hi lo + lo hi summed: about fp32 accuracy
 * for three times the tensor work, used for favor's projections, whose results go into
 * exponentials). */
template <int SPLIT, bool TA, bool TB>
__device__ __forceinline__ void lc_mm_wmma(int m, int n, int k, const float *A, int lda, const float *B, int ldb,
                                           float *Cm, int ldc, bool acc, bool mask, int kmode) {
    using namespace nvcuda;
    typedef typename std::conditional<TA, wmma::col_major, wmma::row_major>::type LA;
    typedef typename std::conditional<TB, wmma::col_major, wmma::row_major>::type LB;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5, tn = n / 16, tiles = (m / 16) * tn;
    for (int t = w; t < tiles; t += nw) {
        const int ti = t / tn, tj = t % tn;
        float *ct = Cm + (long long)ti * 16 * ldc + tj * 16;
        wmma::fragment<wmma::accumulator, 16, 16, 8, float> c;
        if (mask && tj > ti) {
            if (!acc) {
                wmma::fill_fragment(c, 0.0f);
                wmma::store_matrix_sync(ct, c, ldc, wmma::mem_row_major);
            }
            continue;
        }
        if (acc) wmma::load_matrix_sync(c, ct, ldc, wmma::mem_row_major);
        else wmma::fill_fragment(c, 0.0f);
        int k0 = 0, k1 = k;
        if (kmode == LC_K_LOWER) k1 = min(k, (ti + 1) * 16);
        else if (kmode == LC_K_UPPER) k0 = ti * 16;
        for (int kk = k0; kk < k1; kk += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LA> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB> fb;
            wmma::load_matrix_sync(fa, TA ? A + (long long)kk * lda + ti * 16 : A + (long long)ti * 16 * lda + kk, lda);
            wmma::load_matrix_sync(fb, TB ? B + (long long)tj * 16 * ldb + kk : B + (long long)kk * ldb + tj * 16, ldb);
            if (SPLIT == 3) {
                wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LA> la;
                wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB> lb;
                for (int i = 0; i < fa.num_elements; i++) {
                    const float hi = wmma::__float_to_tf32(fa.x[i]);
                    la.x[i] = wmma::__float_to_tf32(fa.x[i] - hi);
                    fa.x[i] = hi;
                }
                for (int i = 0; i < fb.num_elements; i++) {
                    const float hi = wmma::__float_to_tf32(fb.x[i]);
                    lb.x[i] = wmma::__float_to_tf32(fb.x[i] - hi);
                    fb.x[i] = hi;
                }
                wmma::mma_sync(c, la, fb, c);
                wmma::mma_sync(c, fa, lb, c);
            } else {
                for (int i = 0; i < fa.num_elements; i++) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
                for (int i = 0; i < fb.num_elements; i++) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
            }
            wmma::mma_sync(c, fa, fb, c);
        }
        wmma::store_matrix_sync(ct, c, ldc, wmma::mem_row_major);
        if (mask && ti == tj) { /* the diagonal tile: its upper triangle to zero */
            __syncwarp();
            for (int e = lane; e < 256; e += 32)
                if ((e & 15) > (e >> 4)) ct[(e >> 4) * ldc + (e & 15)] = 0.0f;
            __syncwarp();
        }
    }
}

template <int P, bool TA, bool TB>
__device__ __forceinline__ void lc_mm(int m, int n, int k, const float *A, int lda, const float *B, int ldb, float *C,
                                      int ldc, bool acc, bool mask = false, int kmode = LC_K_ALL) {
    if constexpr (P == LC_FP32) {
        const int nt = blockDim.x;
        if ((m / 4) * (n / 4) >= nt) lc_mm_simt<4, TA, TB>(m, n, k, A, lda, B, ldb, C, ldc, acc, mask, kmode);
        else if ((m / 2) * (n / 4) >= nt) lc_mm_simt<2, TA, TB>(m, n, k, A, lda, B, ldb, C, ldc, acc, mask, kmode);
        else lc_mm_simt<1, TA, TB>(m, n, k, A, lda, B, ldb, C, ldc, acc, mask, kmode);
    } else {
        lc_mm_wmma<P == LC_TF32X3 ? 3 : 1, TA, TB>(m, n, k, A, lda, B, ldb, C, ldc, acc, mask, kmode);
    }
}

/* ---- small block-wide steps ---- */

/* dst rows [0, T) x [0, Wp) = src rows (W floats each, valid for i < rows), zero elsewhere.
 * Rows of a multiple of 4 floats at a 16-byte aligned start (D, M = 64: the usual case)
 * go as float4 loads (a quarter of the load instructions and index divisions). */
__device__ __forceinline__ void lc_load(float *dst, int ld, const float *src, int W, int Wp, int rows, int T) {
    if ((W & 3) == 0 && ((uintptr_t)src & 15) == 0) {
        const int W4 = W >> 2, Wp4 = Wp >> 2;
        const float4 *s4 = reinterpret_cast<const float4 *>(src);
        for (int e = threadIdx.x; e < T * Wp4; e += blockDim.x) {
            const int i = e / Wp4, c4 = e - i * Wp4;
            const float4 x = i < rows && c4 < W4 ? s4[(long long)i * W4 + c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float *d = dst + i * ld + 4 * c4;
            d[0] = x.x, d[1] = x.y, d[2] = x.z, d[3] = x.w;
        }
        return;
    }
    for (int e = threadIdx.x; e < T * Wp; e += blockDim.x) {
        const int i = e / Wp, c = e - i * Wp;
        dst[i * ld + c] = i < rows && c < W ? src[(long long)i * W + c] : 0.0f;
    }
}

/* ---- a chunk's rows staged in registers (prefetch) ----
 *
 * lc_load's loop waits for each of a thread's loads before its store to shared memory,
 * so a chunk's rows cost one trip to memory per float4 a thread loads, and nothing
 * else runs meanwhile (the block is at a barrier). Staged instead: lc_fetch issues a
 * thread's loads of a tile into registers and returns at once; lc_put stores them to
 * shared memory later. A kernel fetches chunk ch + 1 before it works on chunk ch, so
 * the loads are in flight during the chunk's products. A tile is staged when it is
 * LC_STAGE_U float4 per thread or fewer (T = 32, 64 columns, 256 threads: 2) and its
 * rows are float4 rows; otherwise lc_put falls back to lc_load (the same values). The
 * optional row scale multiplies each row by scale[i] (the backward's dout / (den+eps)). */
#define LC_STAGE_U 2

struct lc_stage {
    float4 x[LC_STAGE_U];
    float sc[LC_STAGE_U];
};

/* Whether a tile of T rows of W floats (Wp with padding) at src goes through registers
 * (the same answer on every thread of the block). */
__device__ __forceinline__ bool lc_stageable(const float *src, int W, int Wp, int T) {
    return (W & 3) == 0 && ((uintptr_t)src & 15) == 0 && T * (Wp >> 2) <= LC_STAGE_U * (int)blockDim.x;
}

/* Issues the loads of the tile (rows < `rows` valid; each row times scale[i] if given)
 * into st; nothing when it is not stageable (lc_put then loads it). */
__device__ __forceinline__ void lc_fetch(lc_stage &st, const float *src, int W, int Wp, int rows, int T,
                                         const float *scale = NULL) {
    if (!lc_stageable(src, W, Wp, T)) return;
    const int W4 = W >> 2, Wp4 = Wp >> 2;
    const float4 *s4 = reinterpret_cast<const float4 *>(src);
    AB_UNROLL
    for (int u = 0; u < LC_STAGE_U; u++) {
        const int e = threadIdx.x + u * blockDim.x, i = e / Wp4, c4 = e - i * Wp4;
        const bool in = e < T * Wp4 && i < rows && c4 < W4;
        st.x[u] = in ? s4[(long long)i * W4 + c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        st.sc[u] = in && scale ? scale[i] : 1.0f;
    }
}

/* dst rows [0, T) x [0, Wp) (ld) = the tile lc_fetch fetched into st with the same
 * arguments (zero past the valid rows and W), or loaded now when not stageable. */
__device__ __forceinline__ void lc_put(const lc_stage &st, float *dst, int ld, const float *src, int W, int Wp,
                                       int rows, int T, const float *scale = NULL) {
    if (!lc_stageable(src, W, Wp, T)) {
        if (!scale) {
            lc_load(dst, ld, src, W, Wp, rows, T);
            return;
        }
        for (int e = threadIdx.x; e < T * Wp; e += blockDim.x) {
            const int i = e / Wp, c = e - i * Wp;
            dst[i * ld + c] = i < rows && c < W ? src[(long long)i * W + c] * scale[i] : 0.0f;
        }
        return;
    }
    const int Wp4 = Wp >> 2;
    AB_UNROLL
    for (int u = 0; u < LC_STAGE_U; u++) {
        const int e = threadIdx.x + u * blockDim.x, i = e / Wp4, c4 = e - i * Wp4;
        if (e < T * Wp4) {
            const float sc = st.sc[u];
            float *d = dst + i * ld + 4 * c4;
            d[0] = st.x[u].x * sc, d[1] = st.x[u].y * sc, d[2] = st.x[u].z * sc, d[3] = st.x[u].w * sc;
        }
    }
}

/* z[c] += sum over the T rows of F[:, c] (rows past the valid ones are zero). */
__device__ __forceinline__ void lc_colsum(const lc_args &a, const float *F, float *z) {
    for (int c = threadIdx.x; c < a.Cp; c += blockDim.x) {
        float s = z[c];
        for (int i = 0; i < a.T; i++) s += F[i * a.ldC + c];
        z[c] = s;
    }
}

/* S [Cp x Mp] (ldM) and z from a record (or zero). */
__device__ __forceinline__ void lc_state_in(const lc_args &a, const float *rec, float *S, float *z) {
    const int n = a.Cp * a.Mp;
    for (int e = threadIdx.x; e < n; e += blockDim.x) S[(e / a.Mp) * a.ldM + e % a.Mp] = rec ? rec[e] : 0.0f;
    for (int c = threadIdx.x; c < a.Cp; c += blockDim.x) z[c] = rec ? rec[n + c] : 0.0f;
}

__device__ __forceinline__ void lc_state_out(const lc_args &a, const float *S, const float *z, float *rec) {
    const int n = a.Cp * a.Mp;
    for (int e = threadIdx.x; e < n; e += blockDim.x) rec[e] = S[(e / a.Mp) * a.ldM + e % a.Mp];
    for (int c = threadIdx.x; c < a.Cp; c += blockDim.x) rec[n + c] = z[c];
}

/* eps of row i: eps, or for a log-scaled map eps e^(-qsh_i - c) (linear.c's row_eps). */
template <class Map> __device__ __forceinline__ double lc_row_eps(const lc_args &a, const float *rw, int i, float ck) {
    if (Map::log_scaled) return a.eps * exp(-((double)rw[LC_RW_QSH * a.T + i] + (double)ck));
    return a.eps;
}

/* ---- feature maps on shared tiles ----
 *
 * features: F rows [0, nr) from X rows (ldD), zero for rows whose i % T >= rows (past
 *   the valid positions) and for the padding columns; rows < q_rows are queries, the
 *   others keys (log-scaled maps: query rows by their own shift, written to the row
 *   array QSH; key rows by the shared shift ck).
 * backward: gx rows [0, rows) (global, D floats apart) = (d phi / d x)^T dF rows, from
 *   X and F of those rows; dF may be overwritten; SX: a T x ldD scratch tile (favor).
 * Both end with a barrier. */

struct lc_elu {
    static constexpr bool log_scaled = false;
    template <int P>
    static __device__ void features(const lc_args &a, const float *X, float *F, int nr, int q_rows, int rows, float ck,
                                    float *rw) {
        (void)q_rows, (void)ck, (void)rw;
        for (int e = threadIdx.x; e < nr * a.Cp; e += blockDim.x) {
            const int i = e / a.Cp, c = e - i * a.Cp;
            float y = 0.0f;
            if (i % a.T < rows && c < a.C) {
                const float x = X[i * a.ldD + c];
                y = x > 0.0f ? x + 1.0f : expf(x);
            }
            F[i * a.ldC + c] = y;
        }
        __syncthreads();
    }
    template <int P>
    static __device__ void backward(const lc_args &a, const float *X, const float *F, float *dF, int rows, float *gx,
                                    float *SX, float *rw) {
        (void)F, (void)SX, (void)rw;
        for (int e = threadIdx.x; e < rows * a.D; e += blockDim.x) {
            const int i = e / a.D, d = e - i * a.D;
            const float x = X[i * a.ldD + d], g = dF[i * a.ldC + d];
            gx[(long long)i * a.D + d] = x > 0.0f ? g : g * expf(x);
        }
        __syncthreads();
    }
};

struct lc_taylor {
    static constexpr bool log_scaled = false;
    template <int P>
    static __device__ void features(const lc_args &a, const float *X, float *F, int nr, int q_rows, int rows, float ck,
                                    float *rw) {
        (void)q_rows, (void)ck, (void)rw;
        const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        for (int i = threadIdx.x >> 5; i < nr; i += nw) {
            float *f = F + i * a.ldC;
            if (i % a.T >= rows) {
                for (int c = lane; c < a.Cp; c += 32) f[c] = 0.0f;
                continue;
            }
            const float *x = X + i * a.ldD;
            double s = 0;
            for (int d = lane; d < a.D; d += 32) s += (double)x[d] * x[d];
            const double inv = 1.0 / fmax(sqrt(fm_warp_sum_d(s)), FM_TAYLOR_NORM_FLOOR);
            for (int c = lane; c < a.Cp; c += 32) f[c] = c == 0 ? 1.0f : c <= a.D ? (float)((double)x[c - 1] * inv) : 0.0f;
        }
        __syncthreads();
    }
    template <int P>
    static __device__ void backward(const lc_args &a, const float *X, const float *F, float *dF, int rows, float *gx,
                                    float *SX, float *rw) {
        (void)F, (void)SX, (void)rw;
        const int lane = threadIdx.x & 31, nw = blockDim.x >> 5, D = a.D;
        for (int i = threadIdx.x >> 5; i < rows; i += nw) {
            const float *x = X + i * a.ldD, *gu = dF + i * a.ldC + 1;
            float *o = gx + (long long)i * D;
            double s = 0;
            for (int d = lane; d < D; d += 32) s += (double)x[d] * x[d];
            const double nr = sqrt(fm_warp_sum_d(s));
            if (nr > FM_TAYLOR_NORM_FLOOR) {
                double ug = 0;
                for (int d = lane; d < D; d += 32) ug += x[d] / nr * gu[d];
                ug = fm_warp_sum_d(ug);
                for (int d = lane; d < D; d += 32) o[d] = (float)((gu[d] - x[d] / nr * ug) / nr);
            } else {
                for (int d = lane; d < D; d += 32) o[d] = (float)(gu[d] / FM_TAYLOR_NORM_FLOOR);
            }
        }
        __syncthreads();
    }
};

/* favor (favor.h): projections q4 x W^T on the tiles (fp32, or 3xtf32 on the tensor
 * cores: exponentiated, they need fp32's accuracy), then features norm e^(p - off) with
 * off = h + shift, h = |x'|^2/2, as favor.c. */
struct lc_favor {
    static constexpr bool log_scaled = true;
    /* F rows [0, nr) = x W^T (not yet scaled by q4); row arrays H[i] = h, PM[i] = the
     * largest q4 x.w_r over the features (0 for invalid rows). Ends with a barrier. */
    template <int P>
    static __device__ void logits(const lc_args &a, const float *X, float *F, int nr, int rows, float *rw) {
        lc_mm<P == LC_FP32 ? LC_FP32 : LC_TF32X3, false, false>(nr, a.Cp, a.Dp, X, a.ldD, a.WT, a.Cp, F, a.ldC, false);
        __syncthreads();
        const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        for (int i = threadIdx.x >> 5; i < nr; i += nw) {
            const float *x = X + i * a.ldD, *f = F + i * a.ldC;
            const bool valid = i % a.T < rows;
            double s = 0;
            float mx = -INFINITY;
            if (valid) {
                for (int d = lane; d < a.D; d += 32) s += (double)x[d] * x[d];
                for (int c = lane; c < a.C; c += 32) mx = fmaxf(mx, a.q4 * f[c]);
            }
            s = fm_warp_sum_d(s);
            mx = attn_warp_max(mx);
            if (lane == 0) {
                rw[LC_RW_H * a.T + i] = valid ? (float)(0.5 * s / sqrt((double)a.D)) : 0.0f;
                rw[LC_RW_PM * a.T + i] = valid ? mx : 0.0f;
            }
        }
        __syncthreads();
    }
    /* F = norm e^(q4 F - off_i): queries (i < q_rows) off = h + (pm - h), that shift kept
     * in QSH; keys off = h + ck. Zero for invalid rows and padding columns. */
    static __device__ void activate(const lc_args &a, float *F, int nr, int q_rows, int rows, float ck, float *rw) {
        const float *H = rw + LC_RW_H * a.T, *PM = rw + LC_RW_PM * a.T;
        for (int e = threadIdx.x; e < nr * a.Cp; e += blockDim.x) {
            const int i = e / a.Cp, c = e - i * a.Cp;
            const bool valid = i % a.T < rows;
            const float sh = i < q_rows ? PM[i] - H[i] : ck, off = H[i] + sh;
            if (c == 0 && i < q_rows) rw[LC_RW_QSH * a.T + i] = valid ? sh : 0.0f;
            float *p = F + i * a.ldC + c;
            *p = valid && c < a.C ? a.norm * expf(a.q4 * *p - off) : 0.0f;
        }
        __syncthreads();
    }
    template <int P>
    static __device__ void features(const lc_args &a, const float *X, float *F, int nr, int q_rows, int rows, float ck,
                                    float *rw) {
        logits<P>(a, X, F, nr, rows, rw);
        activate(a, F, nr, q_rows, rows, ck, rw);
    }
    /* U = dF .* F; gx = q4 U W - q2 (sum_r U_r) x (favor.c's favor_backward). */
    template <int P>
    static __device__ void backward(const lc_args &a, const float *X, const float *F, float *dF, int rows, float *gx,
                                    float *SX, float *rw) {
        for (int e = threadIdx.x; e < a.T * a.Cp; e += blockDim.x) {
            const int i = e / a.Cp, c = e - i * a.Cp;
            float *u = dF + i * a.ldC + c;
            *u = i < rows ? *u * F[i * a.ldC + c] : 0.0f;
        }
        __syncthreads();
        lc_mm<P, false, false>(a.T, a.Dp, a.Cp, dF, a.ldC, a.W, a.Dp, SX, a.ldD, false);
        const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        for (int i = threadIdx.x >> 5; i < rows; i += nw) {
            double s = 0;
            for (int c = lane; c < a.C; c += 32) s += dF[i * a.ldC + c];
            s = fm_warp_sum_d(s);
            if (lane == 0) rw[LC_RW_SU * a.T + i] = a.q2 * (float)s;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < rows * a.D; e += blockDim.x) {
            const int i = e / a.D, d = e - i * a.D;
            gx[(long long)i * a.D + d] = a.q4 * SX[i * a.ldD + d] - rw[LC_RW_SU * a.T + i] * X[i * a.ldD + d];
        }
        __syncthreads();
    }
};

#endif
