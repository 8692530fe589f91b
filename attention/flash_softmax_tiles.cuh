/* The fused softmax kernels' common parts (flash_softmax.cuh): tile sizes, the
 * geometry of a problem's tiles and its masks (causal, lengths, window), and the moves
 * of tiles between global and shared memory. C++ (CUDA). */
#ifndef ATTN_FLASH_SOFTMAX_TILES_CUH
#define ATTN_FLASH_SOFTMAX_TILES_CUH

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

#endif
