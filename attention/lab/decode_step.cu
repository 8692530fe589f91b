/* Lab: the key/value cache step of stateful-softmax (decoding one position against a
 * cache of N positions): out = softmax(scale q K^T) V over positions 0..N-1 of every
 * slice, after writing k, v into position N-1. --shape B,H,N,D,M: N is the context.
 *   version 1: the earlier kernel (one block of up to 256 threads per slice, the scores
 *              in global memory, k and v copied by two more kernels): 3 launches
 *   version 2: the library's step (kv_step_cuda: the context split so that the blocks
 *              fill the device, automatic split count, 256 threads), 1 launch
 *   version 3: the split kernel with splits of 256 positions
 *   version 4: the split kernel with splits of 1024 positions
 *   version 5: the automatic split count with 128 threads per block (the library's
 *              until an H200 measured 256 faster)
 *   version 6: the automatic split count with 64 threads per block
 *   version 7: the automatic split count aiming at 2x the blocks (half the split length)
 * Reference: the same step in double on the host. Rates: GB/s of the cache read
 * (B H N (D + M) 4 bytes, the step's floor) and the flops of the two products. The
 * auto split count depends on the device's SM count (printed). */
#include "lab.h"

#include "../kv_step_cuda.cuh"
#include "../step_cuda.h"

/* ---- version 1: the earlier step (stateful_softmax_cuda.cu before the split) ---- */

/* Attention of q_t over positions 0..t of one slice per block: scores -> sc (workspace
 * row of the slice), softmax, out = p V / sum. The output sum splits the keys over
 * `groups` threads per column; partial sums meet in dynamic shared memory. */
static __global__ void v1_attend_kernel(const float *q, const float *kc, const float *vc, float *out, float *scores,
                                        long long n_slices, long long cap, int t, int D, int M, float scale) {
    AB_DYN_SMEM(float, part);
    const int T = blockDim.x, tid = threadIdx.x;
    for (long long bh = blockIdx.x; bh < n_slices; bh += gridDim.x) {
        const float *qs = q + bh * D, *ks = kc + bh * cap * D, *vs = vc + bh * cap * M;
        float *sc = scores + bh * cap;
        float m = -INFINITY;
        for (int j = tid; j <= t; j += T) {
            const float *kr = ks + (long long)j * D;
            float dot = 0.0f;
            for (int d = 0; d < D; d++) dot += qs[d] * kr[d];
            dot *= scale;
            sc[j] = dot;
            m = fmaxf(m, dot);
        }
        const float mx = attn_block_max(m);
        float z = 0.0f;
        for (int j = tid; j <= t; j += T) {
            float e = expf(sc[j] - mx);
            sc[j] = e;
            z += e;
        }
        const float inv = 1.0f / attn_block_sum(z);
        const int groups = M >= T ? 1 : T / M, cols = T / groups;
        const int col = tid % cols, g = tid / cols;
        for (int c0 = 0; c0 < M; c0 += cols) {
            const int c = c0 + col;
            float acc = 0.0f;
            if (g < groups && c < M)
                for (int j = g; j <= t; j += groups) acc += sc[j] * vs[(long long)j * M + c];
            part[tid] = acc;
            __syncthreads();
            if (g == 0 && c < M) {
                float sum = 0.0f;
                for (int h = 0; h < groups; h++) sum += part[h * cols + col];
                out[bh * M + c] = sum * inv;
            }
            __syncthreads();
        }
    }
}

struct problem {
    const float *q, *k, *v;
    float *kc, *vc, *out, *ws, *scores;
    size_t ws_bytes;
    unsigned *count;
    long long BH;
    int N, D, M;
    float scale;
};

static int run_v1(const problem &p) {
    const int t = p.N - 1;
    AB_TRY(attn_cuda_copy_slices(p.kc + (long long)t * p.D, (long long)p.N * p.D, p.k, p.D, p.BH, p.D));
    AB_TRY(attn_cuda_copy_slices(p.vc + (long long)t * p.M, (long long)p.N * p.M, p.v, p.M, p.BH, p.M));
    const int threads = ab_cuda_threads(p.N > p.M ? p.N : p.M, 256);
    AB_LAUNCH(v1_attend_kernel, ab_cuda_grid(p.BH, 1, AB_CUDA_MAX_GRID_X), threads, threads * sizeof(float),
              ab_cuda_stream(), p.q, p.kc, p.vc, p.out, p.scores, p.BH, (long long)p.N, t, p.D, p.M, p.scale);
    return 0;
}

/* The split kernel at split length `len` (0: the library's automatic rule, or with
 * `aim` > 1, that rule at aim x its block target) with `threads` threads. */
static int run_split(const problem &p, int len, int threads, int aim) {
    kv_step_args a;
    a.q = p.q, a.k = p.k, a.v = p.v, a.kc = p.kc, a.vc = p.vc, a.out = p.out;
    a.part = p.ws;
    a.count = p.count;
    a.n_slices = p.BH;
    a.cap = p.N;
    a.D = p.D, a.M = p.M, a.t = p.N - 1;
    a.scale = p.scale;
    a.lanes = 1;
    a.split_len = len > 0 ? len : kv_step_split_len(p.BH, p.N, attn_cuda_sm_count() * (aim > 1 ? aim : 1), 0);
    a.splits = (p.N + a.split_len - 1) / a.split_len;
    if ((size_t)p.BH * a.splits * (p.M + 2) * sizeof(float) > p.ws_bytes)
        return ab_fail(AB_EINVAL, "lab: workspace too small for %d splits", a.splits);
    return kv_step_launch(a, threads);
}

static int run(int v, const problem &p) {
    switch (v) {
    case 1: return run_v1(p);
    case 2:
        return kv_step_cuda(p.q, p.k, p.v, p.kc, p.vc, p.out, p.ws, p.ws_bytes, p.count, p.BH, p.N, p.N - 1, p.D, p.M,
                            p.scale);
    case 3: return run_split(p, 256, KV_THREADS, 1);
    case 4: return run_split(p, 1024, KV_THREADS, 1);
    case 5: return run_split(p, 0, 128, 1);
    case 6: return run_split(p, 0, 64, 1);
    default: return run_split(p, 0, KV_THREADS, 2);
    }
}

int main(int argc, char **argv) {
    lab_opts o = lab_defaults(1, 8, 4096, 64, 64, 1);
    if (lab_parse(argc, argv, &o, "lab decode_step: one key/value cache step over a context of N positions")) return 2;
    const long long BH = (long long)o.B * o.H;
    const int N = o.N, D = o.D, M = o.M;
    const size_t nk = (size_t)BH * N * D, nv = (size_t)BH * N * M;
    float *hk, *hv, *hq, *hkt, *hvt;
    float *kc = lab_random(nk, 1, 1.0f, &hk), *vc = lab_random(nv, 2, 1.0f, &hv);
    float *q = lab_random((size_t)BH * D, 3, 1.0f, &hq), *k = lab_random((size_t)BH * D, 4, 1.0f, &hkt);
    float *v = lab_random((size_t)BH * M, 5, 1.0f, &hvt), *out = lab_zeros((size_t)BH * M);
    const float scale = (float)(1.0 / sqrt((double)D));
    /* the reference, with k, v at position N - 1 */
    std::vector<double> want((size_t)BH * M), s((size_t)N);
    for (long long bh = 0; bh < BH; bh++) {
        double mx = -INFINITY, z = 0;
        for (int j = 0; j < N; j++) {
            const float *kr = j == N - 1 ? hkt + bh * D : hk + ((size_t)bh * N + j) * D;
            double dot = 0;
            for (int d = 0; d < D; d++) dot += (double)hq[bh * D + d] * kr[d];
            s[j] = dot * scale;
            mx = fmax(mx, s[j]);
        }
        for (int j = 0; j < N; j++) z += (s[j] = exp(s[j] - mx));
        for (int m = 0; m < M; m++) {
            double acc = 0;
            for (int j = 0; j < N; j++)
                acc += s[j] * (j == N - 1 ? hvt[bh * M + m] : hv[((size_t)bh * N + j) * M + m]);
            want[(size_t)bh * M + m] = acc / z;
        }
    }
    /* workspace for the shortest splits any version takes (64 positions, or the whole
     * context), the counters (zero; each step leaves them so) and version 1's scores */
    problem p;
    p.q = q, p.k = k, p.v = v, p.kc = kc, p.vc = vc, p.out = out;
    p.BH = BH, p.N = N, p.D = D, p.M = M, p.scale = scale;
    const size_t max_splits = (size_t)(N + KV_SPLIT_MIN - 1) / KV_SPLIT_MIN;
    p.ws_bytes = (size_t)BH * max_splits * (M + 2) * sizeof(float);
    p.ws = lab_zeros(p.ws_bytes / sizeof(float));
    p.scores = lab_zeros((size_t)BH * N);
    LAB_CHECK(ab_cuda_malloc((void **)&p.count, sizeof(unsigned) * BH));
    LAB_CHECK(ab_cuda_memset(p.count, 0, sizeof(unsigned) * BH));
    const int sms = attn_cuda_sm_count(), len = kv_step_split_len(BH, N, sms, 0);
    printf("lab: %d SMs: automatic split %d positions, %d splits, %lld blocks\n", sms, len, (N + len - 1) / len,
           BH * ((N + len - 1) / len));
    static const char *names[8] = {"",
                                   "1 block/slice (3 launches)",
                                   "split, automatic (library)",
                                   "split 256",
                                   "split 1024",
                                   "split auto, 128 threads",
                                   "split auto, 64 threads",
                                   "split auto, 2x blocks"};
    /* Float sums: scores over D, p V over a split (or a thread's keys) of up to N terms,
     * whose rounding errors grow like sqrt(terms): 1e-5 up to N = 1024, sqrt(N / 1024)
     * times that beyond (8e-5 at 64k). Measured on the emulator: <= 3.1e-7 at N = 300,
     * <= 9.1e-7 at N = 16384 (version 1; the split versions <= 3.6e-7). */
    const double tol = 1e-5 * (N > 1024 ? sqrt(N / 1024.0) : 1.0);
    const double bytes = (double)BH * N * (D + M) * 4.0, flops = 2.0 * BH * N * (D + M);
    int failed = 0;
    for (int ver = 1; ver <= 7; ver++) {
        if (!lab_wants(&o, ver)) continue;
        LAB_CHECK(ab_cuda_memset(out, 0xff, sizeof(float) * BH * M));
        LAB_CHECK(run(ver, p));
        const double err = lab_max_err(out, want.data(), want.size());
        const double ms = o.check_only ? -1 : lab_time_ms(o.reps, [&] { return run(ver, p); });
        failed += lab_report(ver, names[ver], err, tol, ms, flops, bytes);
    }
    free(hk), free(hv), free(hq), free(hkt), free(hvt);
    ab_cuda_free(kc), ab_cuda_free(vc), ab_cuda_free(q), ab_cuda_free(k), ab_cuda_free(v), ab_cuda_free(out);
    ab_cuda_free(p.ws), ab_cuda_free(p.scores), ab_cuda_free(p.count);
    return failed ? 1 : 0;
}
