/* The recurrent step of linear and polynomial attention on the device as one fused
 * kernel: the kernel templates over the feature maps and their launcher, in a header
 * so that the library (linear_step_cuda.cu) and the kernel lab
 * (attention/lab/linear_step.cu) run the same code. Design in linear_step_cuda.cu.
 * C++ (CUDA) only. */
#ifndef ATTN_LINEAR_STEP_CUDA_CUH
#define ATTN_LINEAR_STEP_CUDA_CUH

#include "feature_maps_cuda.cuh"

#include <limits.h>

#define LS_THREADS 256        /* threads per block in the library */
#define LS_MAX_COLS 256       /* columns of a tile at most (one tile per slice up to M = 255) */
#define LS_CHUNK 256          /* rows whose features a block stages at a time */
#define LS_ROWS_PER_THREAD 4  /* rows a thread updates at least (the automatic row splits) */
#define LS_BLOCKS_PER_SM 4    /* blocks the automatic row splits aim at, per multiprocessor */
#define LS_FAVOR_FUSED_MAX 16384 /* favor computes its features in the step kernel up to C D this */

/* The step of n_slices slices: S (C x M1 per slice, M1 = M + 1) += phi(k) [v, 1]^T and
 * out = phi(q)^T S[:, :M] / (phi(q)^T S[:, M] + eps). Blocks: n_slices x tiles x rsplits,
 * each `cols` consecutive columns (one tile) of rows [rs row_split, (rs + 1) row_split)
 * of one slice. part: n_slices x rsplits x M1 partial sums (double) when a slice has
 * more than one block; count: one counter per slice (zero before and after); shift:
 * favor's running key shift per slice (the state's), feat: favor's features computed
 * by ls_favor_features_kernel when they are not computed in the step kernel. */
struct ls_args {
    fm_dev f;
    float *S, *shift;
    const float *q, *k, *v;
    float *out;
    double *part;
    const float *feat; /* [n][C] phi(q), [n][C] phi(k), [n] sq, [n] sk */
    unsigned *count;
    long long n_slices;
    int M, t;
    int tiles, cols, rsplits, row_split;
    double eps;
};

/* What a block prepares for its slice before the rows (in shared memory). */
struct ls_pre {
    double iq, ik;   /* taylor: 1 / max(|x|, floor) of q and k */
    float rs, rk;    /* favor: S's and phi(k)'s rescaling to the new shift */
    float sq, c_new; /* favor: the query's own shift, the slice's new key shift */
    float offq, offk; /* favor (fused): the offsets of q's and k's log-features */
};

/* ---- the maps: prepare (block-collective, ends with a barrier) and the features of
 * rows [c0, c0 + n) into pq, pk (threads over rows). The same float operations as
 * feature_maps_cuda.cu's and favor_cuda.cu's device functions, so the same features. */

__device__ __forceinline__ double ls_warp_norm(const float *x, int D, int lane) {
    double s = 0;
    for (int a = lane; a < D; a += 32) s += (double)x[a] * x[a];
    return sqrt(fm_warp_sum_d(s));
}

struct ls_elu {
    static __device__ __forceinline__ void prepare(const ls_args &, long long, ls_pre *, float *) { __syncthreads(); }
    static __device__ __forceinline__ void features(const ls_args &a, long long bh, const ls_pre &, long long c0, int n,
                                                    float *pq, float *pk) {
        const float *q = a.q + bh * a.f.D, *k = a.k + bh * a.f.D;
        for (int r = threadIdx.x; r < n; r += blockDim.x) {
            const float xq = q[c0 + r], xk = k[c0 + r];
            pq[r] = xq > 0.0f ? xq + 1.0f : expf(xq);
            pk[r] = xk > 0.0f ? xk + 1.0f : expf(xk);
        }
    }
};

struct ls_taylor {
    static __device__ __forceinline__ void prepare(const ls_args &a, long long bh, ls_pre *pre, float *) {
        const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
        if (w < 2) { /* warp 0: q, warp 1: k */
            const double nr = ls_warp_norm((w ? a.k : a.q) + bh * a.f.D, a.f.D, lane);
            if (lane == 0) (w ? pre->ik : pre->iq) = 1.0 / fmax(nr, FM_TAYLOR_NORM_FLOOR);
        }
        __syncthreads();
    }
    static __device__ __forceinline__ void features(const ls_args &a, long long bh, const ls_pre &pre, long long c0,
                                                    int n, float *pq, float *pk) {
        const float *q = a.q + bh * a.f.D, *k = a.k + bh * a.f.D;
        for (int r = threadIdx.x; r < n; r += blockDim.x) {
            const long long c = c0 + r;
            pq[r] = c == 0 ? 1.0f : (float)((double)q[c - 1] * pre.iq);
            pk[r] = c == 0 ? 1.0f : (float)((double)k[c - 1] * pre.ik);
        }
    }
};

struct ls_poly {
    static __device__ __forceinline__ void prepare(const ls_args &, long long, ls_pre *, float *) { __syncthreads(); }
    static __device__ __forceinline__ float value(const fm_dev &f, const float *x, long long c) {
        if (c == 0) return f.c;
        if (c <= f.D) return f.lin * x[c - 1];
        const long long r = c - 1 - f.D;
        const float sa = f.scale * x[r / f.D];
        return sa * x[r % f.D];
    }
    static __device__ __forceinline__ void features(const ls_args &a, long long bh, const ls_pre &, long long c0, int n,
                                                    float *pq, float *pk) {
        const float *q = a.q + bh * a.f.D, *k = a.k + bh * a.f.D;
        for (int r = threadIdx.x; r < n; r += blockDim.x) {
            pq[r] = value(a.f, q, c0 + r);
            pk[r] = value(a.f, k, c0 + r);
        }
    }
};

/* Maximum over the block (every thread gets it; ends with a barrier); red: 32 floats. */
__device__ __forceinline__ float ls_block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = attn_warp_max(v);
    if (lane == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        v = attn_warp_max(lane < nw ? red[lane] : -INFINITY);
        if (lane == 0) red[0] = v;
    }
    __syncthreads();
    v = red[0];
    __syncthreads();
    return v;
}

/* favor's shifts: c_new = max(c_old, sk) (sk at t = 0, when S is empty); S is rescaled
 * by e^(c_old - c_new) and phi(k) by e^(sk - c_new). */
__device__ __forceinline__ void ls_favor_shifts(const ls_args &a, long long bh, float sq, float sk, ls_pre *pre) {
    const float c_new = a.t == 0 ? sk : fmaxf(a.shift[bh], sk);
    pre->sq = sq;
    pre->c_new = c_new;
    pre->rs = a.t == 0 ? 0.0f : expf(a.shift[bh] - c_new);
    pre->rk = expf(sk - c_new);
}

/* favor, features in the step kernel: every block computes the C log-features of q and
 * k for their maxima (C D multiply-adds each, W from L2), then its rows' again. */
struct ls_favor {
    static __device__ __forceinline__ float logf_of(const fm_dev &f, const float *x, long long c, float q4) {
        float acc = 0.0f;
        for (int d = 0; d < f.D; d++) acc += x[d] * f.WT[(long long)d * f.C + c];
        return q4 * acc;
    }
    static __device__ __forceinline__ void prepare(const ls_args &a, long long bh, ls_pre *pre, float *red) {
        const fm_dev &f = a.f;
        const float *q = a.q + bh * f.D, *k = a.k + bh * f.D;
        const float q4 = (float)pow((double)f.D, -0.25);
        float mq = -INFINITY, mk = -INFINITY;
        for (long long c = threadIdx.x; c < f.C; c += blockDim.x) {
            mq = fmaxf(mq, logf_of(f, q, c, q4));
            mk = fmaxf(mk, logf_of(f, k, c, q4));
        }
        mq = ls_block_max(mq, red);
        mk = ls_block_max(mk, red);
        if (threadIdx.x == 0) {
            double ssq = 0, ssk = 0;
            for (int d = 0; d < f.D; d++) {
                ssq += (double)q[d] * q[d];
                ssk += (double)k[d] * k[d];
            }
            const float hq = (float)(0.5 * ssq / sqrt((double)f.D)), hk = (float)(0.5 * ssk / sqrt((double)f.D));
            const float sq = mq - hq, sk = mk - hk;
            pre->offq = hq + sq;
            pre->offk = hk + sk;
            ls_favor_shifts(a, bh, sq, sk, pre);
        }
        __syncthreads();
    }
    static __device__ __forceinline__ void features(const ls_args &a, long long bh, const ls_pre &pre, long long c0,
                                                    int n, float *pq, float *pk) {
        const fm_dev &f = a.f;
        const float *q = a.q + bh * f.D, *k = a.k + bh * f.D;
        const float q4 = (float)pow((double)f.D, -0.25), norm = (float)(1.0 / sqrt((double)f.C));
        for (int r = threadIdx.x; r < n; r += blockDim.x) {
            pq[r] = norm * expf(logf_of(f, q, c0 + r, q4) - pre.offq);
            pk[r] = norm * expf(logf_of(f, k, c0 + r, q4) - pre.offk);
        }
    }
};

/* favor, features from ls_favor_features_kernel (a.feat). */
struct ls_favor_pre {
    static __device__ __forceinline__ void prepare(const ls_args &a, long long bh, ls_pre *pre, float *) {
        if (threadIdx.x == 0) {
            const float *sq = a.feat + 2 * a.n_slices * a.f.C, *sk = sq + a.n_slices;
            ls_favor_shifts(a, bh, sq[bh], sk[bh], pre);
        }
        __syncthreads();
    }
    static __device__ __forceinline__ void features(const ls_args &a, long long bh, const ls_pre &, long long c0, int n,
                                                    float *pq, float *pk) {
        const float *fq = a.feat + bh * a.f.C + c0, *fk = a.feat + (a.n_slices + bh) * a.f.C + c0;
        for (int r = threadIdx.x; r < n; r += blockDim.x) {
            pq[r] = fq[r];
            pk[r] = fk[r];
        }
    }
};

template <class Map> struct ls_scaled {
    static constexpr bool value = false;
};
template <> struct ls_scaled<ls_favor> {
    static constexpr bool value = true;
};
template <> struct ls_scaled<ls_favor_pre> {
    static constexpr bool value = true;
};

/* phi(q), phi(k) and their shifts for favor when C D is too large for every block of the
 * step to compute them: one block per (slice, q or k), threads over the features (the
 * arithmetic of favor_cuda.cu's step features). */
static __global__ void ls_favor_features_kernel(fm_dev f, const float *q, const float *k, float *feat, long long n) {
    __shared__ float red[32];
    const int C = f.C, D = f.D;
    const float q4 = (float)pow((double)D, -0.25), norm = (float)(1.0 / sqrt((double)C));
    for (long long item = blockIdx.x; item < 2 * n; item += gridDim.x) {
        const long long bh = item >> 1;
        const bool is_k = item & 1;
        const float *xr = (is_k ? k : q) + bh * D;
        float *out = feat + ((is_k ? n : 0) + bh) * C;
        double ss = 0;
        for (int d = 0; d < D; d++) ss += (double)xr[d] * xr[d];
        const float h = (float)(0.5 * ss / sqrt((double)D));
        float mx = -INFINITY;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const float lf = ls_favor::logf_of(f, xr, c, q4);
            out[c] = lf;
            mx = fmaxf(mx, lf);
        }
        const float shift = ls_block_max(mx, red) - h, off = h + shift;
        for (int c = threadIdx.x; c < C; c += blockDim.x) out[c] = norm * expf(out[c] - off);
        if (threadIdx.x == 0) feat[2 * n * C + (is_k ? n : 0) + bh] = shift;
        __syncthreads(); /* the next item's threads reuse red */
    }
}

/* Dynamic shared memory of the step kernel (bytes) for blocks of `threads` threads. */
static __host__ __device__ inline size_t ls_smem_bytes(int threads) {
    return 64 /* ls_pre */ + (size_t)threads * sizeof(double) /* row lanes' sums, then the tile's totals */ +
           2 * LS_CHUNK * sizeof(float) /* pq, pk */ + 32 * sizeof(float) /* red */ + 16 /* flag */;
}

/* Grid: n_slices x tiles x rsplits blocks (flattened, row split fastest), grid-stride.
 * Block: threads = lanes x cols (the rest idle): thread (lane r, column j) updates rows
 * r, r + lanes, ... of its column of the block's rows, chunk by chunk (the chunk's
 * features staged in shared memory), summing phi(q)_c S_cj in double. Then the lanes'
 * sums in lane order; one block per slice: the division; several: the partial sums into
 * part, the counter, and the last block adds the partials in row-split order and
 * divides (and, favor, stores the new key shift). */
template <class Map> static __global__ void ls_step_kernel(ls_args a) {
    AB_DYN_SMEM(double, dsm);
    const int T = blockDim.x, tid = threadIdx.x;
    ls_pre *pre = reinterpret_cast<ls_pre *>(dsm);
    double *lane_sum = dsm + 8;
    float *pq = reinterpret_cast<float *>(lane_sum + T), *pk = pq + LS_CHUNK, *red = pk + LS_CHUNK;
    int *flag = reinterpret_cast<int *>(red + 32);
    const long long C = a.f.C;
    const int M = a.M, M1 = M + 1, W = a.cols, lanes = T / W, lr = tid / W, cj = tid % W;
    const bool one_block = a.tiles == 1 && a.rsplits == 1;
    const long long per_slice = (long long)a.tiles * a.rsplits;
    for (long long item = blockIdx.x; item < a.n_slices * per_slice; item += gridDim.x) {
        const long long bh = item / per_slice;
        const int tile = (int)(item % per_slice) / a.rsplits, rs = (int)(item % a.rsplits);
        const int col = tile * W + cj;
        const bool active = lr < lanes && col < M1;
        const long long r0 = (long long)rs * a.row_split, r1 = r0 + a.row_split < C ? r0 + a.row_split : C;
        Map::prepare(a, bh, pre, red);
        const bool scaled = ls_scaled<Map>::value;
        const float rs_s = scaled ? pre->rs : 1.0f, rk = scaled ? pre->rk : 1.0f;
        const float vm = active ? (col < M ? a.v[bh * M + col] : 1.0f) : 0.0f;
        float *Sb = a.S + bh * C * M1 + col;
        double acc = 0.0;
        for (long long c0 = r0; c0 < r1; c0 += LS_CHUNK) {
            const int n = (int)(r1 - c0 < LS_CHUNK ? r1 - c0 : LS_CHUNK);
            Map::features(a, bh, *pre, c0, n, pq, pk);
            __syncthreads();
            if (active) {
                AB_UNROLL_4
                for (int r = lr; r < n; r += lanes) {
                    float *sp = Sb + (c0 + r) * M1;
                    const float sv = scaled ? *sp * rs_s + (pk[r] * rk) * vm : *sp + pk[r] * vm;
                    *sp = sv;
                    acc += (double)pq[r] * sv;
                }
            }
            __syncthreads(); /* the next chunk overwrites pq, pk */
        }
        lane_sum[tid] = acc;
        __syncthreads();
        double total = 0.0;
        if (lr == 0 && col < M1)
            for (int l = 0; l < lanes; l++) total += lane_sum[l * W + cj];
        __syncthreads(); /* lane_sum is read; it now holds the tile's totals */
        if (one_block) {
            if (lr == 0 && col < M1) lane_sum[col] = total;
            __syncthreads();
            const float den = (float)lane_sum[M];
            const double ex = scaled ? a.eps * exp(-((double)pre->sq + pre->c_new)) : a.eps;
            for (int m = tid; m < M; m += T)
                a.out[bh * M + m] = (float)lane_sum[m] * (float)(1.0 / ((double)den + ex));
            if (scaled && tid == 0) a.shift[bh] = pre->c_new; /* the slice's only block has read the old one */
        } else {
            if (lr == 0 && col < M1) a.part[(bh * a.rsplits + rs) * M1 + col] = total;
            __threadfence();
            __syncthreads();
            if (tid == 0) {
                const unsigned prev = atomicAdd(&a.count[bh], 1u);
                *flag = prev == (unsigned)per_slice - 1u;
                __threadfence();
            }
            __syncthreads();
            if (*flag) { /* the slice's last block: every other has read the old shift */
                volatile const double *P = a.part + bh * a.rsplits * M1;
                double den = 0.0;
                for (int s = 0; s < a.rsplits; s++) den += P[(long long)s * M1 + M];
                const double ex = scaled ? a.eps * exp(-((double)pre->sq + pre->c_new)) : a.eps;
                const float inv = (float)(1.0 / ((double)(float)den + ex));
                for (int m = tid; m < M; m += T) {
                    double num = 0.0;
                    for (int s = 0; s < a.rsplits; s++) num += P[(long long)s * M1 + m];
                    a.out[bh * M + m] = (float)num * inv;
                }
                if (tid == 0) {
                    if (scaled) a.shift[bh] = pre->c_new;
                    a.count[bh] = 0u; /* ready for the next step */
                }
            }
        }
        __syncthreads(); /* the next item reuses the shared memory */
    }
}

/* The blocks of a step: column tiles of at most LS_MAX_COLS (and of `cols_override`
 * when > 0), and row splits of at least LS_ROWS_PER_THREAD rows per lane so that the
 * blocks reach LS_BLOCKS_PER_SM per SM (or of `rows_override` rows when > 0). */
struct ls_plan {
    int tiles, cols, rsplits, row_split;
};

static inline ls_plan ls_make_plan(long long n_slices, long long C, int M, int threads, int sms, int rows_override,
                                   int cols_override) {
    ls_plan p;
    const int M1 = M + 1;
    int maxc = cols_override > 0 ? cols_override : LS_MAX_COLS;
    if (maxc > threads) maxc = threads;
    p.tiles = (M1 + maxc - 1) / maxc;
    p.cols = (M1 + p.tiles - 1) / p.tiles;
    long long rows;
    if (rows_override > 0) {
        rows = rows_override;
    } else {
        const long long lanes = threads / p.cols, min_rows = lanes * LS_ROWS_PER_THREAD;
        const long long target = (long long)LS_BLOCKS_PER_SM * (sms > 0 ? sms : 1), have = n_slices * p.tiles;
        long long want = have >= target ? 1 : (target + have - 1) / have;
        const long long most = (C + min_rows - 1) / min_rows;
        if (want > most) want = most;
        if (want < 1) want = 1;
        rows = (C + want - 1) / want;
    }
    if (rows > C) rows = C;
    if (rows > INT_MAX) rows = INT_MAX;
    p.row_split = (int)rows;
    p.rsplits = (int)((C + rows - 1) / rows);
    return p;
}

/* Whether favor's features are computed in the step kernel (C D small enough that every
 * block computing all of them costs little next to its rows), or by their own kernel. */
static inline bool ls_favor_fused(const fm_dev &f) { return (long long)f.C * f.D <= LS_FAVOR_FUSED_MAX; }

/* Launches the step for map kind `kind` (fm_kind) with plan p: a.tiles, a.cols,
 * a.rsplits, a.row_split from p; a.part, a.count, a.feat set by the caller where needed. */
static inline int ls_step_launch(ls_args a, int kind, const ls_plan &p, int threads) {
    a.tiles = p.tiles, a.cols = p.cols, a.rsplits = p.rsplits, a.row_split = p.row_split;
    const unsigned grid = ab_cuda_grid(a.n_slices * p.tiles * p.rsplits, 1, AB_CUDA_MAX_GRID_X);
    const size_t smem = ls_smem_bytes(threads);
    auto *elu = &ls_step_kernel<ls_elu>;
    auto *taylor = &ls_step_kernel<ls_taylor>;
    auto *poly = &ls_step_kernel<ls_poly>;
    auto *favor = &ls_step_kernel<ls_favor>;
    auto *favor_pre = &ls_step_kernel<ls_favor_pre>;
    switch (kind) {
    case FM_ELU: AB_LAUNCH(elu, grid, threads, smem, ab_cuda_stream(), a); return 0;
    case FM_TAYLOR: AB_LAUNCH(taylor, grid, threads, smem, ab_cuda_stream(), a); return 0;
    case FM_POLY: AB_LAUNCH(poly, grid, threads, smem, ab_cuda_stream(), a); return 0;
    case FM_FAVOR:
        if (ls_favor_fused(a.f)) {
            AB_LAUNCH(favor, grid, threads, smem, ab_cuda_stream(), a);
        } else {
            AB_LAUNCH(ls_favor_features_kernel, ab_cuda_grid(2 * a.n_slices, 1, 65535), 256, 0, ab_cuda_stream(), a.f,
                      a.q, a.k, (float *)a.feat, a.n_slices);
            AB_LAUNCH(favor_pre, grid, threads, smem, ab_cuda_stream(), a);
        }
        return 0;
    default: return ab_fail(AB_EINVAL, "linear step: feature map %d has no fused step", kind);
    }
}

#endif
