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
 * up to 16 wide. */
#ifndef ATTN_LINEAR_CHUNK_CUH
#define ATTN_LINEAR_CHUNK_CUH

#include "feature_maps_cuda.cuh"

#include <atomic>
#include <string.h>
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

/* ---- the kernels ---- */

/* Chunk ch of the slice: its first row and its valid rows. */
__device__ __forceinline__ int lc_rows(const lc_args &a, int ch) { return min(a.T, a.L - ch * a.T); }

/* A segment's own key state (want_state; otherwise favor's key maximum only), written
 * to its record. Log-scaled maps keep the state at the running maximum m of the key
 * log-features so far, rescaling it when m grows (linear.c's k_features_running). */
template <class Map, int P> __global__ void lc_state_kernel(lc_args a, int want_state) {
    AB_DYN_SMEM(float, sm);
    const lc_smem ly = lc_layout(a, LC_K_STATE, Map::log_scaled);
    float *Xk = sm + ly.Xk, *Kf = sm + ly.Kf, *V = sm + ly.V, *S = sm + ly.S, *z = sm + ly.z, *rw = sm + ly.rows;
    const long long items = a.ns * a.nseg;
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
        const long long sl = item / a.nseg;
        const int seg = (int)(item % a.nseg), c0 = seg * a.cps, c1 = min(a.nchunks, c0 + a.cps);
        if (want_state) lc_state_in(a, NULL, S, z);
        float m = -INFINITY;
        __syncthreads();
        for (int ch = c0; ch < c1; ch++) {
            const int rows = lc_rows(a, ch);
            const long long r = sl * a.N + (long long)ch * a.T;
            lc_load(Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, a.T);
            if (want_state) lc_load(V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, a.T);
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

template <class Map, int P> __global__ void lc_fwd_kernel(lc_args a) {
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
        __syncthreads();
        for (int ch = c0; ch < c1; ch++) {
            const int rows = lc_rows(a, ch);
            const long long r = sl * a.N + (long long)ch * T;
            lc_load(Xq, a.ldD, a.q + r * a.D, a.D, a.Dp, rows, T);
            if (causal) {
                lc_load(Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, T);
                lc_load(V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, T);
            }
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
template <class Map, int P> __global__ void lc_dq_kernel(lc_args a, int want_r) {
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
        __syncthreads();
        for (int ch = c0; ch < c1; ch++) {
            const int rows = lc_rows(a, ch);
            const long long r = sl * a.N + (long long)ch * T, pos = (long long)ch * T;
            lc_load(Xq, a.ldD, a.q + r * a.D, a.D, a.Dp, rows, T);
            lc_load(G, a.ldM, a.dout + r * a.M, a.M, a.Mp, rows, T);
            if (causal) {
                lc_load(Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, T);
                lc_load(V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, T);
            }
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
template <class Map, int P> __global__ void lc_dkv_kernel(lc_args a) {
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
        __syncthreads();
        for (int ch = c1 - 1; ch >= c0; ch--) {
            const int rows = lc_rows(a, ch);
            const long long r = sl * a.N + (long long)ch * T, pos = (long long)ch * T;
            lc_load(Xk, a.ldD, a.k + r * a.D, a.D, a.Dp, rows, T);
            lc_load(V, a.ldM, a.v + r * a.M, a.M, a.Mp, rows, T);
            if (causal) {
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
};

/* The args of a run of ns slices of valid length L in tensors of N positions (tensor
 * and workspace pointers left for the caller). Segments: as many as make about
 * `target` blocks over the ns slices, at most one per chunk. */
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
    long long nseg = ns > 0 ? (c.target + ns - 1) / ns : 1;
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

template <class Map, int P> struct lc_kernels {
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
            AB_TRY(lc_launch(&lc_state_kernel<Map, P>, allowed(LC_K_STATE), items, threads, smem(a, LC_K_STATE), a,
                             (int)st));
            AB_TRY(lc_scan(a, st ? n_e : 0, a.causal ? 0 : 2, fav));
        }
        if (want_out) AB_TRY(lc_launch(&lc_fwd_kernel<Map, P>, allowed(LC_K_FWD), items, threads, smem(a, LC_K_FWD), a));
        return 0;
    }

    static int backward(const lc_args &a0, int threads) {
        lc_args a = a0;
        a.state = a.state_kls = NULL;
        const long long items = a.ns * a.nseg, n_e = (long long)a.Cp * a.Mp + a.Cp;
        AB_TRY(forward(a, threads, false)); /* the segments' prefix states (or the total), favor's shift */
        const bool want_r = !a.causal || a.nseg > 1;
        AB_TRY(lc_launch(&lc_dq_kernel<Map, P>, allowed(LC_K_DQ), items, threads, smem(a, LC_K_DQ), a, (int)want_r));
        if (want_r) AB_TRY(lc_scan(a, n_e, a.causal ? 1 : 2, false));
        AB_TRY(lc_launch(&lc_dkv_kernel<Map, P>, allowed(LC_K_DKV), items, threads, smem(a, LC_K_DKV), a));
        return 0;
    }
};

/* Dispatch on the map and the precision. */
template <class F> static int lc_dispatch(const lc_cfg &c, F &&f) {
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
