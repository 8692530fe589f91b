/* The elu, taylor and poly feature maps on the device (feature_maps_cuda.cuh): their
 * device functions, the kernels that compute features and their gradient one warp per
 * row, the recurrent step over a slice's state, and the launchers their table entries
 * point to. favor, which is log-scaled and has a projection, is favor_cuda.cu. */
#include "feature_maps_cuda.cuh"

#define THREADS 256
#define MAX_BLOCKS 65535LL /* enough blocks to fill any device; the loops do the rest */

/* ---- feature maps on the device ----
 *
 * Each map of the table (feature_maps.c, fm_maps) has a struct of device functions
 * here (favor's is favor_cuda.cu), with the float operations of its CPU functions, so
 * that the features agree with the CPU's:
 *   prep(f, x, lane)            warp-collective, for one row x: what its features share
 *                               (taylor: 1 / max(|x|, floor)), the same on every lane;
 *   value(f, x, c, pre)         feature c of row x;
 *   backward(f, x, g, o, lane)  warp-collective: o = (d phi / d x)^T g for one row;
 *   has_prep                    whether prep does anything (the step kernel skips its
 *                               warp pass and barrier otherwise).
 * The kernels that use a map are templates over that struct, and the map's entry in
 * the table points to its launchers (FM_CUDA_MAP, at the end of this file). */

/* Warp-collective: |x| of a row of D floats in double (every lane gets the same value:
 * the butterfly adds the same pairs on every lane). */
__device__ __forceinline__ double warp_norm(const float *x, int D, int lane) {
    double s = 0;
    for (int a = lane; a < D; a += 32) s += (double)x[a] * x[a];
    return sqrt(fm_warp_sum_d(s));
}

/* elu(x) + 1 (expf instead of the CPU's polynomial exp, both within 2 ulp). */
struct fm_elu_dev {
    static constexpr bool has_prep = false;
    static __device__ __forceinline__ double prep(const fm_dev &, const float *, int) { return 0.0; }
    static __device__ __forceinline__ float value(const fm_dev &, const float *x, long long c, double) {
        const float xv = x[c];
        return xv > 0.0f ? xv + 1.0f : expf(xv);
    }
    static __device__ __forceinline__ void backward(const fm_dev &f, const float *xr, const float *g, float *o,
                                                    int lane) {
        const int D = f.D;
        for (int a = lane; a < D; a += 32) o[a] = xr[a] > 0.0f ? g[a] : g[a] * expf(xr[a]);
    }
};

/* [1, x / max(|x|, floor)]; the norm is a warp sum in double. */
struct fm_taylor_dev {
    static constexpr bool has_prep = true;
    static __device__ __forceinline__ double prep(const fm_dev &f, const float *x, int lane) {
        return 1.0 / fmax(warp_norm(x, f.D, lane), FM_TAYLOR_NORM_FLOOR);
    }
    static __device__ __forceinline__ float value(const fm_dev &, const float *x, long long c, double inv) {
        return c == 0 ? 1.0f : (float)((double)x[c - 1] * inv);
    }
    static __device__ __forceinline__ void backward(const fm_dev &f, const float *xr, const float *g, float *o,
                                                    int lane) {
        const int D = f.D;
        /* u = x / r: du/dx = (I - u u^T) / r above the floor, I / floor below it */
        const double nr = warp_norm(xr, D, lane);
        const float *gu = g + 1;
        if (nr > FM_TAYLOR_NORM_FLOOR) {
            double ug = 0;
            for (int a = lane; a < D; a += 32) ug += xr[a] / nr * gu[a];
            ug = fm_warp_sum_d(ug);
            for (int a = lane; a < D; a += 32) o[a] = (float)((gu[a] - xr[a] / nr * ug) / nr);
        } else {
            for (int a = lane; a < D; a += 32) o[a] = (float)(gu[a] / FM_TAYLOR_NORM_FLOOR);
        }
    }
};

/* [c, sqrt(2 c scale) x, scale x_a x_b]. */
struct fm_poly_dev {
    static constexpr bool has_prep = false;
    static __device__ __forceinline__ double prep(const fm_dev &, const float *, int) { return 0.0; }
    static __device__ __forceinline__ float value(const fm_dev &f, const float *x, long long c, double) {
        if (c == 0) return f.c;
        if (c <= f.D) return f.lin * x[c - 1];
        const long long r = c - 1 - f.D;
        const float sa = f.scale * x[r / f.D];
        return sa * x[r % f.D];
    }
    static __device__ __forceinline__ void backward(const fm_dev &f, const float *xr, const float *g, float *o,
                                                    int lane) {
        const int D = f.D;
        /* d/dx_a of sum_{b,e} G_be x_b x_e = sum_e x_e G_ea + sum_e G_ae x_e */
        const float *G = g + 1 + D;
        for (int a = lane; a < D; a += 32) {
            float col = 0.0f, row = 0.0f;
            for (int e = 0; e < D; e++) col += xr[e] * G[(long long)e * D + a];
            for (int e = 0; e < D; e++) row += G[(long long)a * D + e] * xr[e];
            o[a] = f.lin * g[1 + a] + f.scale * (row + col);
        }
    }
};

/* phi rows (n_rows x C) of the x rows (D wide); padding rows are zero. One warp per
 * row (grid-stride over rows). */
template <class Map> __global__ void fm_forward_kernel(fm_dev f, const float *x, rowmap rm, float *phi) {
    const int lane = threadIdx.x & 31;
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rm.n_rows; r += nw) {
        long long sl, p;
        row_at(rm, r, &sl, &p);
        float *out = phi + r * f.C;
        if (p >= rm.L) {
            for (long long c = lane; c < f.C; c += 32) out[c] = 0.0f;
            continue;
        }
        const float *xr = x + sl * rm.stride + p * f.D;
        const double pre = Map::prep(f, xr, lane);
        for (long long c = lane; c < f.C; c += 32) out[c] = Map::value(f, xr, c, pre);
    }
}

/* gx rows (valid positions only, same layout as x) = (d phi / d x)^T gphi rows, as
 * the map's CPU backward (feature_maps.c). One warp per row. */
template <class Map>
__global__ void fm_backward_kernel(fm_dev f, const float *x, rowmap rm, const float *gphi, float *gx) {
    const int lane = threadIdx.x & 31, D = f.D;
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rm.n_rows; r += nw) {
        long long sl, p;
        row_at(rm, r, &sl, &p);
        if (p >= rm.L) continue;
        const long long off = sl * rm.stride + p * D;
        Map::backward(f, x + off, gphi + r * f.C, gx + off, lane);
    }
}

/* S += phi(k) vaug^T and oaug = phi(q)^T S (the updated S) in one pass over S. Block:
 * `cols` consecutive columns of one slice's S (coalesced) x blockDim.x / cols rows
 * strided over C; partial sums (double) meet in shared memory. Features are computed
 * from q and k on the fly (Map::value: the same floats as the feature kernel). */
template <class Map>
__global__ void step_update_kernel(fm_dev f, float *S, const float *q, const float *k, const float *v, float *oaug,
                                   long long n_slices, int M, int cols, int tiles) {
    __shared__ double part[THREADS];
    __shared__ double norms[2];
    const int tid = threadIdx.x, col = tid % cols, row = tid / cols, rows = blockDim.x / cols, M1 = M + 1;
    const long long C = f.C;
    for (long long blk = blockIdx.x; blk < n_slices * tiles; blk += gridDim.x) {
        const long long bh = blk / tiles;
        const int m = (int)(blk % tiles) * cols + col;
        const float *qs = q + bh * f.D, *ks = k + bh * f.D;
        double iq = 0.0, ik = 0.0;
        if (Map::has_prep) {
            if (tid < 32) {
                const double pq = Map::prep(f, qs, tid), pk = Map::prep(f, ks, tid);
                if (tid == 0) {
                    norms[0] = pq;
                    norms[1] = pk;
                }
            }
            __syncthreads();
            iq = norms[0];
            ik = norms[1];
        }
        double acc = 0.0;
        if (m < M1) {
            const float vm = m < M ? v[bh * M + m] : 1.0f;
            float *Sb = S + bh * C * M1 + m;
            for (long long c = row; c < C; c += rows) {
                const float sv = Sb[c * M1] + Map::value(f, ks, c, ik) * vm;
                Sb[c * M1] = sv;
                acc += (double)Map::value(f, qs, c, iq) * sv;
            }
        }
        part[tid] = acc;
        __syncthreads();
        if (row == 0 && m < M1) {
            double sum = 0.0;
            for (int r = 0; r < rows; r++) sum += part[r * cols + col];
            oaug[bh * M1 + m] = (float)sum;
        }
        __syncthreads();
    }
}

__global__ void step_finish_kernel(const float *oaug, long long n_slices, int M, double eps, float *out) {
    const long long total = n_slices * M;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        const float *o = oaug + (e / M) * (M + 1);
        out[e] = o[e % M] * (float)(1.0 / ((double)o[M] + eps));
    }
}

static unsigned grid_elems(long long n) { return ab_cuda_grid(n, THREADS, MAX_BLOCKS); }
static unsigned grid_warps(long long rows) { return ab_cuda_grid(rows, THREADS / 32, MAX_BLOCKS); }

/* ---- each map's launchers: its entry's `cuda` in fm_maps (feature_maps.c) ---- */

template <class Map>
static int launch_forward(const fm_dev &f, const float *x, const rowmap &rm, float *phi, float *row_shift,
                          const float *slice_shift) {
    (void)row_shift, (void)slice_shift; /* not log-scaled */
    AB_LAUNCH(fm_forward_kernel<Map>, grid_warps(rm.n_rows), THREADS, 0, ab_cuda_stream(), f, x, rm, phi);
    return 0;
}

template <class Map>
static int launch_backward(const fm_dev &f, const float *x, const rowmap &rm, const float *phi, float *gphi,
                           float *gx) {
    (void)phi;
    AB_LAUNCH(fm_backward_kernel<Map>, grid_warps(rm.n_rows), THREADS, 0, ab_cuda_stream(), f, x, rm,
              (const float *)gphi, gx);
    return 0;
}

/* The update kernel over `cols`-column tiles of each slice's state (the smallest power
 * of two >= M + 1, at most 32), then the division; the step workspace holds Oaug. */
template <class Map> static int launch_step(const fm_step_args &a) {
    const int M1 = a.M + 1;
    int cols = 1;
    while (cols < M1 && cols < 32) cols *= 2;
    const int tiles = (M1 + cols - 1) / cols;
    AB_LAUNCH(step_update_kernel<Map>, ab_cuda_grid(a.n_slices * tiles, 1, AB_CUDA_MAX_GRID_X), THREADS, 0,
              ab_cuda_stream(), a.f, a.S, a.q, a.k, a.v, a.ws, a.n_slices, a.M, cols, tiles);
    AB_LAUNCH(step_finish_kernel, grid_elems(a.n_slices * a.M), THREADS, 0, ab_cuda_stream(), (const float *)a.ws,
              a.n_slices, a.M, a.eps, a.out);
    return 0;
}

static long long step_ws_floats(const fm_dev &f, int M) {
    (void)f;
    return (long long)M + 1;
}

#define FM_CUDA_MAP(Map) {launch_forward<Map>, launch_backward<Map>, NULL, launch_step<Map>, step_ws_floats}

extern "C" const fm_cuda_map fm_elu_cuda = FM_CUDA_MAP(fm_elu_dev);
extern "C" const fm_cuda_map fm_taylor_cuda = FM_CUDA_MAP(fm_taylor_dev);
extern "C" const fm_cuda_map fm_poly_cuda = FM_CUDA_MAP(fm_poly_dev);
