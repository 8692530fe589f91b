/* Adam / RAdam on CUDA: the gradient's norm partials and the element-wise update
 * (optim_cuda.h says why both give the CPU's bits).
 *
 * Speed (unmeasured, no GPU was available): the norm is one thread per 4096 entries
 * (a chain of 4096 dependent double additions each, in order, to keep the CPU's
 * sums), so it takes tens of microseconds whatever the size; the update is
 * bandwidth-bound (p, g, m, v read, p, m, v written). */
#include "../harness/cuda_compat.h"

#include "optim_cuda.h"

#define THREADS 256
#define MAX_BLOCKS 65535LL

__global__ void norm_partials_kernel(double *partials, const float *g, long long n, long long block) {
    const long long nb = (n + block - 1) / block;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += stride) {
        const long long lo = b * block, hi = lo + block < n ? lo + block : n;
        double s = 0.0;
        for (long long i = lo; i < hi; i++) s += (double)g[i] * (double)g[i];
        partials[b] = s;
    }
}

extern "C" int optim_cuda_norm_partials(double *partials, const float *g, size_t n, size_t block) {
    if (n == 0 || block == 0) return 0;
    const long long nb = (long long)((n + block - 1) / block);
    AB_LAUNCH(norm_partials_kernel, ab_cuda_grid(nb, THREADS, MAX_BLOCKS), ab_cuda_threads(nb, THREADS), 0,
              ab_cuda_stream(), partials, g, (long long)n, (long long)block);
    return 0;
}

/* optim.c's update_adaptive / update_momentum, one element per thread (grid-stride
 * within each range). */
__global__ void update_kernel(float *p, const float *g, float *m, float *v, const optim_cuda_range *ranges,
                              int n_ranges, ab_optim_coef k, int adaptive) {
    for (int r = 0; r < n_ranges; r++) {
        const long long off = (long long)ranges[r].offset, cnt = (long long)ranges[r].count;
        const float keep = ranges[r].decay ? k.keep : 1.0f, l2 = ranges[r].decay ? k.l2 : 0.0f;
        for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < cnt;
             e += (long long)gridDim.x * blockDim.x) {
            const long long i = off + e;
            const float pi = p[i];
            const float gi = __fadd_rn(__fmul_rn(g[i], k.gscale), __fmul_rn(l2, pi));
            const float mi = __fadd_rn(__fmul_rn(k.b1, m[i]), __fmul_rn(k.c1, gi));
            const float vi = __fadd_rn(__fmul_rn(k.b2, v[i]), __fmul_rn(k.c2, __fmul_rn(gi, gi)));
            m[i] = mi;
            v[i] = vi;
            if (adaptive) {
                const float den = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), k.vscale), k.eps);
                p[i] = __fsub_rn(__fmul_rn(keep, pi), __fdiv_rn(__fmul_rn(k.alpha, mi), den));
            } else {
                p[i] = __fsub_rn(__fmul_rn(keep, pi), __fmul_rn(k.alpha, mi));
            }
        }
    }
}

extern "C" int optim_cuda_update(float *p, const float *g, float *m, float *v, size_t n,
                                 const optim_cuda_range *ranges, int n_ranges, const ab_optim_coef *k, bool adaptive) {
    if (n == 0 || n_ranges <= 0) return 0;
    /* a grid for all n entries: no range is longer, and each is walked grid-stride */
    AB_LAUNCH(update_kernel, ab_cuda_grid((long long)n, THREADS, MAX_BLOCKS), ab_cuda_threads((long long)n, THREADS),
              0, ab_cuda_stream(), p, g, m, v, ranges, n_ranges, *k, (int)adaptive);
    return 0;
}
