/* The favor feature map on the device (definitions in favor.h; the interface in
 * feature_maps_cuda.cuh): features with their shifts, their gradient, the keys' largest
 * log-feature per slice, and the recurrent step with its running key shift. The
 * projection comes drawn on the host (linear_cuda.cu copies W and its transpose WT to
 * the device), so both devices use the same numbers.
 *
 * Arithmetic as on the CPU (favor.c) up to rounding: the projections w_r . x' are float
 * dot products over D here (a BLAS product there), exp is expf, sums of squares and of
 * the gradient's U are in double on both.
 *
 * Speed: not measured (no GPU here). Each feature is a dot product over D computed by
 * one lane, with WT read coalesced across the lanes of a warp (one warp per row) and x
 * read as a broadcast; that is C D multiply-adds per row, as a GEMM would do, but
 * without its tiling: expected to be well below cuBLAS's rate and to cost a fraction of
 * linear attention's own products at C = 2 D. */
#include "feature_maps_cuda.cuh"

#define THREADS 256
#define MAX_BLOCKS 65535LL

/* |x'|^2 / 2 = |x|^2 / (2 sqrt(D)) of a row, sum of squares in double (every lane of
 * a warp gets the same value). */
__device__ __forceinline__ float warp_half_sq(const float *x, int D, int lane) {
    double s = 0;
    for (int d = lane; d < D; d += 32) s += (double)x[d] * x[d];
    return (float)(0.5 * fm_warp_sum_d(s) / sqrt((double)D));
}

/* phi rows of the x rows of rm (one warp per row): a_r = D^(-1/4) x . WT[:, r] - h,
 * written first, then shifted and exponentiated in place. */
__global__ void favor_forward_kernel(fm_dev f, const float *x, rowmap rm, float *phi, float *row_shift,
                                     const float *slice_shift) {
    const int lane = threadIdx.x & 31, C = f.C, D = f.D;
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5;
    const float q4 = (float)pow((double)D, -0.25), norm = (float)(1.0 / sqrt((double)C));
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rm.n_rows; r += nw) {
        long long sl, p;
        row_at(rm, r, &sl, &p);
        float *out = phi + r * C;
        if (p >= rm.L) {
            for (int c = lane; c < C; c += 32) out[c] = 0.0f;
            if (row_shift && lane == 0) row_shift[r] = 0.0f;
            continue;
        }
        const float *xr = x + sl * rm.stride + p * D;
        const float h = warp_half_sq(xr, D, lane);
        float mx = -INFINITY;
        for (int c = lane; c < C; c += 32) {
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += xr[d] * f.WT[(long long)d * C + c];
            out[c] = q4 * acc;
            mx = fmaxf(mx, out[c]);
        }
        float shift;
        if (row_shift) {
            shift = attn_warp_max(mx) - h;
            if (lane == 0) row_shift[r] = shift;
        } else {
            shift = slice_shift[sl];
        }
        const float off = h + shift;
        for (int c = lane; c < C; c += 32) out[c] = norm * expf(out[c] - off);
    }
}

/* gx = D^(-1/4) U W - D^(-1/2) x sum_r U_r with U = gphi .* phi (written into gphi),
 * one warp per valid row. */
__global__ void favor_backward_kernel(fm_dev f, const float *x, rowmap rm, const float *phi, float *gphi, float *gx) {
    const int lane = threadIdx.x & 31, C = f.C, D = f.D;
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5;
    const float q4 = (float)pow((double)D, -0.25), q2 = (float)(1.0 / sqrt((double)D));
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rm.n_rows; r += nw) {
        long long sl, p;
        row_at(rm, r, &sl, &p);
        if (p >= rm.L) continue;
        float *u = gphi + r * C;
        const float *ph = phi + r * C;
        double su = 0;
        for (int c = lane; c < C; c += 32) {
            u[c] *= ph[c];
            su += u[c];
        }
        const float cs = q2 * (float)fm_warp_sum_d(su);
        __syncwarp(); /* every lane's U is visible to the others */
        const long long off = sl * rm.stride + p * D;
        for (int d = lane; d < D; d += 32) {
            float acc = 0.0f;
            for (int c = 0; c < C; c++) acc += u[c] * f.W[(long long)c * D + d];
            gx[off + d] = q4 * acc - cs * x[off + d];
        }
    }
}

/* Maximum over the block (every thread gets it; ends with a barrier). red: 32 floats of
 * the calling kernel's shared memory (a kernel of this file that reduces declares its
 * own: the emulator keeps a file's shared variables in one section, which a function
 * with shared memory of its own, attn_block_max, cannot share with part[] below). */
__device__ __forceinline__ float block_max(float v, float *red) {
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

/* Floats as ints that order like them (for atomicMax): non-negative floats keep their
 * bits, negative ones get their magnitude bits flipped; the map is its own inverse. */
__device__ __forceinline__ int ord_enc(float f) {
    const int i = __float_as_int(f);
    return i >= 0 ? i : i ^ 0x7fffffff;
}

/* slice_max[s] <-> its ordered-int encoding, in place (n_sl floats). */
__global__ void favor_ord_kernel(float *slice_max, long long n_sl) {
    for (long long s = (long long)blockIdx.x * blockDim.x + threadIdx.x; s < n_sl; s += (long long)gridDim.x * blockDim.x)
        slice_max[s] = __int_as_float(ord_enc(slice_max[s]));
}

/* slice_max[s] (encoded) = max(slice_max[s], max over the valid rows of slice s of rm
 * of max_r a_r): one warp per row (every row of every slice in parallel), its lanes over
 * the features (WT read coalesced, the row broadcast), an atomicMax per row.
 *
 * This replaces a kernel with one block per slice and one thread per row reading its
 * own row (uncoalesced: 32 cache lines per warp load) C x D times: its work per block
 * grew with N while its blocks (B*H) fell as 1/N at a fixed B*N, so at N = 65536
 * (B*H = 8) it ran on 8 multiprocessors for about 0.27 s per call (forward and
 * backward each made one): favor's time per sample grew as N^1.56 (Figure 1). */
__global__ void favor_key_max_kernel(fm_dev f, const float *x, rowmap rm, float *slice_max) {
    const int lane = threadIdx.x & 31, C = f.C, D = f.D;
    const float q4 = (float)pow((double)D, -0.25);
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rm.n_rows; r += nw) {
        long long sl, p;
        row_at(rm, r, &sl, &p);
        if (p >= rm.L) continue;
        const float *xr = x + sl * rm.stride + p * D;
        const float h = warp_half_sq(xr, D, lane);
        float best = -INFINITY;
        for (int c = lane; c < C; c += 32) {
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += xr[d] * f.WT[(long long)d * C + c];
            best = fmaxf(best, q4 * acc);
        }
        best = attn_warp_max(best);
        if (lane == 0) atomicMax((int *)slice_max + sl, ord_enc(best - h));
    }
}

/* ---- the recurrent step ----
 *
 * Workspace per slice (floats): Oaug [M+1], then for all slices phi(q), phi(k) [C] and
 * the rows' own shifts sq, sk. Three kernels: the features with their own shifts; the
 * update S = S e^(c_old - c_new) + e^(sk - c_new) phi(k) [v, 1]^T with Oaug = phi(q)^T S,
 * c_new = max(c_old, sk) (sk at t = 0, when S is empty); the division by
 * den + eps e^(-sq - c_new), which also stores c_new in the state. */

struct step_ws {
    float *oaug, *pq, *pk, *sq, *sk;
};

static __host__ __device__ step_ws step_carve(float *ws, long long n, int M, int C) {
    step_ws w;
    w.oaug = ws;
    w.pq = ws + n * (M + 1);
    w.pk = w.pq + n * C;
    w.sq = w.pk + n * C;
    w.sk = w.sq + n;
    return w;
}

/* One block per (slice, q or k): threads over the features. */
__global__ void favor_step_features_kernel(fm_dev f, const float *q, const float *k, float *ws, long long n, int M) {
    __shared__ float red[32];
    const step_ws w = step_carve(ws, n, M, f.C);
    const int C = f.C, D = f.D;
    const float q4 = (float)pow((double)D, -0.25), norm = (float)(1.0 / sqrt((double)C));
    for (long long item = blockIdx.x; item < 2 * n; item += gridDim.x) {
        const long long bh = item >> 1;
        const bool is_k = item & 1;
        const float *xr = (is_k ? k : q) + bh * D;
        float *out = (is_k ? w.pk : w.pq) + bh * C;
        double ss = 0;
        for (int d = 0; d < D; d++) ss += (double)xr[d] * xr[d];
        const float h = (float)(0.5 * ss / sqrt((double)D));
        float mx = -INFINITY;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += xr[d] * f.WT[(long long)d * C + c];
            out[c] = q4 * acc;
            mx = fmaxf(mx, out[c]);
        }
        const float shift = block_max(mx, red) - h, off = h + shift;
        for (int c = threadIdx.x; c < C; c += blockDim.x) out[c] = norm * expf(out[c] - off);
        if (threadIdx.x == 0) (is_k ? w.sk : w.sq)[bh] = shift;
    }
}

__device__ __forceinline__ float step_shift(const float *shift, const step_ws &w, long long bh, int t) {
    const float sk = w.sk[bh];
    return t == 0 ? sk : fmaxf(shift[bh], sk);
}

/* Block: `cols` columns of one slice's S x blockDim.x / cols rows strided over C. */
__global__ void favor_step_update_kernel(fm_dev f, float *S, const float *shift, const float *v, float *ws,
                                         long long n, int M, int t, int cols, int tiles) {
    __shared__ double part[THREADS];
    const step_ws w = step_carve(ws, n, M, f.C);
    const int tid = threadIdx.x, col = tid % cols, row = tid / cols, rows = blockDim.x / cols, M1 = M + 1;
    const long long C = f.C;
    for (long long blk = blockIdx.x; blk < n * tiles; blk += gridDim.x) {
        const long long bh = blk / tiles;
        const int m = (int)(blk % tiles) * cols + col;
        const float c_new = step_shift(shift, w, bh, t);
        const float rs = t == 0 ? 0.0f : expf(shift[bh] - c_new), rk = expf(w.sk[bh] - c_new);
        double acc = 0.0;
        if (m < M1) {
            const float vm = m < M ? v[bh * M + m] : 1.0f;
            const float *pq = w.pq + bh * C, *pk = w.pk + bh * C;
            float *Sb = S + bh * C * M1 + m;
            for (long long c = row; c < C; c += rows) {
                const float sv = Sb[c * M1] * rs + (pk[c] * rk) * vm;
                Sb[c * M1] = sv;
                acc += (double)pq[c] * sv;
            }
        }
        part[tid] = acc;
        __syncthreads();
        if (row == 0 && m < M1) {
            double sum = 0.0;
            for (int r = 0; r < rows; r++) sum += part[r * cols + col];
            w.oaug[bh * M1 + m] = (float)sum;
        }
        __syncthreads();
    }
}

/* out = num / (den + eps e^(-sq - c_new)). The state's shift becomes c_new: the thread of
 * column 0 writes it while others of the slice may still read the old value; both give
 * the same c_new (max(c_new, sk) = c_new), so the order does not matter. */
__global__ void favor_step_finish_kernel(float *shift, const float *ws, long long n, int M, int C, int t, double eps,
                                         float *out) {
    const step_ws w = step_carve((float *)ws, n, M, C);
    const long long total = n * M;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        const long long bh = e / M;
        const float c_new = step_shift(shift, w, bh, t);
        const float *o = w.oaug + bh * (M + 1);
        out[e] = o[e % M] * (float)(1.0 / ((double)o[M] + eps * exp(-((double)w.sq[bh] + c_new))));
        if (e % M == 0) shift[bh] = c_new;
    }
}

/* ---- launchers: fm_maps[FM_FAVOR].cuda ---- */

static unsigned grid_warps(long long rows) { return ab_cuda_grid(rows, THREADS / 32, MAX_BLOCKS); }

static int favor_launch_forward(const fm_dev &f, const float *x, const rowmap &rm, float *phi, float *row_shift,
                                const float *slice_shift) {
    AB_LAUNCH(favor_forward_kernel, grid_warps(rm.n_rows), THREADS, 0, ab_cuda_stream(), f, x, rm, phi, row_shift,
              slice_shift);
    return 0;
}

static int favor_launch_backward(const fm_dev &f, const float *x, const rowmap &rm, const float *phi, float *gphi,
                                 float *gx) {
    AB_LAUNCH(favor_backward_kernel, grid_warps(rm.n_rows), THREADS, 0, ab_cuda_stream(), f, x, rm, phi, gphi, gx);
    return 0;
}

static int favor_launch_key_max(const fm_dev &f, const float *x, const rowmap &rm, float *slice_max) {
    const long long n_sl = rm.n_rows / rm.rows_per;
    AB_LAUNCH(favor_ord_kernel, ab_cuda_grid(n_sl, THREADS, MAX_BLOCKS), THREADS, 0, ab_cuda_stream(), slice_max, n_sl);
    AB_LAUNCH(favor_key_max_kernel, grid_warps(rm.n_rows), THREADS, 0, ab_cuda_stream(), f, x, rm, slice_max);
    AB_LAUNCH(favor_ord_kernel, ab_cuda_grid(n_sl, THREADS, MAX_BLOCKS), THREADS, 0, ab_cuda_stream(), slice_max, n_sl);
    return 0;
}

static int favor_launch_step(const fm_step_args &a) {
    const int M1 = a.M + 1;
    int cols = 1;
    while (cols < M1 && cols < 32) cols *= 2;
    const int tiles = (M1 + cols - 1) / cols;
    AB_LAUNCH(favor_step_features_kernel, ab_cuda_grid(2 * a.n_slices, 1, MAX_BLOCKS), THREADS, 0, ab_cuda_stream(),
              a.f, a.q, a.k, a.ws, a.n_slices, a.M);
    AB_LAUNCH(favor_step_update_kernel, ab_cuda_grid(a.n_slices * tiles, 1, AB_CUDA_MAX_GRID_X), THREADS, 0,
              ab_cuda_stream(), a.f, a.S, (const float *)a.shift, a.v, a.ws, a.n_slices, a.M, a.t, cols, tiles);
    AB_LAUNCH(favor_step_finish_kernel, ab_cuda_grid(a.n_slices * a.M, THREADS, MAX_BLOCKS), THREADS, 0,
              ab_cuda_stream(), a.shift, (const float *)a.ws, a.n_slices, a.M, a.f.C, a.t, a.eps, a.out);
    return 0;
}

static long long favor_step_ws_floats(const fm_dev &f, int M) { return (long long)M + 1 + 2LL * f.C + 2; }

extern "C" const fm_cuda_map fm_favor_cuda = {favor_launch_forward, favor_launch_backward, favor_launch_key_max,
                                              favor_launch_step, favor_step_ws_floats};
