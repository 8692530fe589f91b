/* The element-wise LSTM step on CUDA (lstm_step.h: lstm_step_forward_cuda,
 * lstm_step_backward_cuda); the matrix products around it are cuBLAS calls made by
 * lstm.c. One thread per (row b, unit j), grid-stride: each thread reads its unit's
 * four gates and writes only its own elements, so there are no atomics and no
 * barriers, and the results do not depend on the launch.
 *
 * The formulas and their order of operations are lstm.c's (the CPU's step); the
 * device's expf and tanhf (within 2 ulp) and fused multiply-adds round differently
 * from glibc's, so the two agree to float rounding, not bit for bit.
 *
 * Speed (unmeasured, no GPU was available): a step is one small GEMM and one launch
 * of B H threads, so a layer and direction costs about 2 max(L_b) launches forward
 * and backward; for short batches of narrow layers launch latency dominates. Running
 * the two directions in one batched GEMM and one launch, or a persistent kernel
 * keeping W_hh on chip, would be the next steps. */
#include "../harness/cuda_compat.h"

#include "lstm_step.h"

#include <math.h>

#define THREADS 256
#define MAX_BLOCKS 65535LL

/* grid-stride loop over [0, n) */
#define FOR_EACH(i, n)                                                                                                 \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                                      \
         i += (long long)gridDim.x * blockDim.x)

__device__ __forceinline__ float sigmoid_d(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void lstm_step_forward_kernel(lstm_step_shape s, float *gates, float *c, float *out, int out_ld,
                                         float *h, float *cs, const float *hw) {
    const long long H = s.H;
    const int k = s.k;
    FOR_EACH(e, (long long)s.B * H) {
        const long long b = e / H, j = e % H;
        const int L = s.lengths ? s.lengths[b] : s.N;
        if (k >= L) {
            if (k == 0) h[e] = cs[e] = 0.0f;
            continue;
        }
        const long long row = b * s.N + (s.reverse ? L - 1 - k : k);
        float *g = gates + row * 4 * H;
        float zi = g[j], zf = g[H + j], zg = g[2 * H + j], zo = g[3 * H + j];
        if (hw) {
            const float *r = hw + b * 4 * H;
            zi += r[j];
            zf += r[H + j];
            zg += r[2 * H + j];
            zo += r[3 * H + j];
        }
        const float ig = sigmoid_d(zi), fg = sigmoid_d(zf), gg = tanhf(zg), og = sigmoid_d(zo);
        const float cp = k > 0 ? cs[e] : 0.0f;
        const float cn = fg * cp + ig * gg;
        const float hn = og * tanhf(cn);
        g[j] = ig;
        g[H + j] = fg;
        g[2 * H + j] = gg;
        g[3 * H + j] = og;
        c[row * H + j] = cn;
        out[row * out_ld + j] = hn;
        cs[e] = cn;
        h[e] = hn;
    }
}

__global__ void lstm_step_backward_kernel(lstm_step_shape s, float *dgates, float *dstep, float *hprev, float *dcs,
                                          const float *dh_rec, const float *dout, int dout_ld, const float *gates,
                                          const float *c, const float *out, int out_ld) {
    const long long H = s.H;
    const int k = s.k;
    FOR_EACH(e, (long long)s.B * H) {
        const long long b = e / H, j = e % H;
        const int L = s.lengths ? s.lengths[b] : s.N;
        float *ds = dstep + b * 4 * H;
        if (k >= L) {
            ds[j] = ds[H + j] = ds[2 * H + j] = ds[3 * H + j] = 0.0f;
            continue;
        }
        const int p = s.reverse ? L - 1 - k : k;
        const bool first = k == L - 1; /* the row's last position in time: nothing carried */
        const long long row = b * s.N + p;
        const float *g = gates + row * 4 * H;
        const float ig = g[j], fg = g[H + j], gg = g[2 * H + j], og = g[3 * H + j];
        const float tc = tanhf(c[row * H + j]);
        const float dr = dout[row * dout_ld + j];
        const float dh = !first && dh_rec ? dr + dh_rec[e] : dr;
        const float dc = (first ? 0.0f : dcs[e]) + dh * og * (1.0f - tc * tc);
        float cp = 0.0f, hp = 0.0f;
        if (k > 0) {
            const long long prow = b * s.N + (s.reverse ? p + 1 : p - 1);
            cp = c[prow * H + j];
            hp = out[prow * out_ld + j];
        }
        const float di = dc * gg * ig * (1.0f - ig);
        const float df = dc * cp * fg * (1.0f - fg);
        const float dgg = dc * ig * (1.0f - gg * gg);
        const float dog = dh * tc * og * (1.0f - og);
        float *dg = dgates + row * 4 * H;
        dg[j] = ds[j] = di;
        dg[H + j] = ds[H + j] = df;
        dg[2 * H + j] = ds[2 * H + j] = dgg;
        dg[3 * H + j] = ds[3 * H + j] = dog;
        dcs[e] = dc * fg;
        hprev[row * H + j] = hp;
    }
}

static unsigned grid_for(long long n) { return ab_cuda_grid(n, THREADS, MAX_BLOCKS); }
static int threads_for(long long n) { return ab_cuda_threads(n, THREADS); }

extern "C" int lstm_step_forward_cuda(const lstm_step_shape *s, float *gates, float *c, float *out, int out_ld,
                                      float *h, float *cs, const float *hw) {
    const long long n = (long long)s->B * s->H;
    if (n <= 0) return 0;
    AB_LAUNCH(lstm_step_forward_kernel, grid_for(n), threads_for(n), 0, ab_cuda_stream(), *s, gates, c, out, out_ld,
              h, cs, hw);
    return 0;
}

extern "C" int lstm_step_backward_cuda(const lstm_step_shape *s, float *dgates, float *dstep, float *hprev,
                                       float *dcs, const float *dh_rec, const float *dout, int dout_ld,
                                       const float *gates, const float *c, const float *out, int out_ld) {
    const long long n = (long long)s->B * s->H;
    if (n <= 0) return 0;
    AB_LAUNCH(lstm_step_backward_kernel, grid_for(n), threads_for(n), 0, ab_cuda_stream(), *s, dgates, dstep, hprev,
              dcs, dh_rec, dout, dout_ld, gates, c, out, out_ld);
    return 0;
}
