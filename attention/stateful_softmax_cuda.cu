/* stateful-softmax on CUDA: the recurrent mode (forward and backward are softmax's,
 * softmax_cuda.cu), as on the CPU (stateful_softmax.c).
 *
 * State (device memory, capacity fixed at creation, never reallocated): K cache
 * (B, H, capacity, D), then at a 256-byte boundary the V cache (B, H, capacity, M).
 * Step t copies k_t, v_t into position t of every slice (one kernel) and attends q_t
 * over positions 0..t (one kernel, one block per slice): O(t (D + M)) per slice, the
 * scores in the step workspace (B*H*capacity floats).
 * Prefill copies the prompt's keys and values into the cache and, when out is wanted,
 * computes the prompt's causal outputs with softmax's fused forward (flash_softmax.cu)
 * reading the keys and values from the cache: no workspace, nothing of size P x P.
 */
#include "softmax_cuda.h"

#include "cuda_util.cuh"
#include "flash_softmax.h"

#include <math.h>

#define STEP_MAX_THREADS 256

static size_t align256(size_t x) { return (x + 255u) & ~(size_t)255u; }

static size_t kcache_bytes(const attn_shape *s, int capacity) {
    return align256((size_t)s->batch * (size_t)s->heads * (size_t)capacity * (size_t)s->qk_dim * sizeof(float));
}

extern "C" size_t ss_cuda_state_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)a;
    return kcache_bytes(s, capacity) +
           (size_t)s->batch * (size_t)s->heads * (size_t)capacity * (size_t)s->v_dim * sizeof(float);
}

/* The cache beyond the positions held is never read: nothing to clear. */
extern "C" int ss_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    (void)a, (void)s, (void)capacity, (void)state;
    return 0;
}

/* Step: capacity scores per slice (the prefill needs none). */
extern "C" size_t ss_cuda_step_workspace_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)a;
    return (size_t)s->batch * (size_t)s->heads * (size_t)capacity * sizeof(float);
}

extern "C" int ss_cuda_prefill(attn *a, const attn_shape *s, int capacity, int P, const float *q, const float *k,
                               const float *v, float *out, void *state) {
    const int D = s->qk_dim, M = s->v_dim;
    const long long BH = (long long)s->batch * s->heads, cap = capacity;
    float *kc = (float *)state, *vc = (float *)((char *)state + kcache_bytes(s, capacity));
    AB_TRY(attn_cuda_copy_slices(kc, cap * D, k, (long long)P * D, BH, (long long)P * D));
    AB_TRY(attn_cuda_copy_slices(vc, cap * M, v, (long long)P * M, BH, (long long)P * M));
    if (!out || P == 0) return 0;
    /* causal attention of the prompt over the cache's first P positions */
    flash_args fa = flash_args_make(q, (long long)P * D, kc, cap * D, vc, cap * M, (long long)P * M, 0, BH, P, D, M,
                                    attn_scale(a, D), true, 0);
    fa.o = out;
    return flash_forward(&fa, a->p.precision);
}

/* Attention of q_t over positions 0..t of one slice per block:
 * scores -> sc (workspace row of the slice), softmax, out = p V / sum.
 * The output sum splits the keys over `groups` threads per column; partial sums meet
 * in dynamic shared memory (blockDim.x floats). */
__global__ void step_attend_kernel(const float *q, const float *kc, const float *vc, float *out, float *scores,
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
        const float inv = 1.0f / attn_block_sum(z); /* ends with a barrier: sc is visible */
        /* out[c] = sum_j sc[j] v[j][c] * inv: `groups` threads per column */
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

extern "C" int ss_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q,
                            const float *k, const float *v, float *out) {
    const int D = s->qk_dim, M = s->v_dim;
    const long long BH = (long long)s->batch * s->heads, cap = capacity;
    float *kc = (float *)state, *vc = (float *)((char *)state + kcache_bytes(s, capacity));
    AB_TRY(attn_cuda_copy_slices(kc + (long long)t * D, cap * D, k, D, BH, D));
    AB_TRY(attn_cuda_copy_slices(vc + (long long)t * M, cap * M, v, M, BH, M));
    const int threads = ab_cuda_threads((long long)t + 1 > M ? (long long)t + 1 : M, STEP_MAX_THREADS);
    AB_LAUNCH(step_attend_kernel, ab_cuda_grid(BH, 1, AB_CUDA_MAX_GRID_X), threads, threads * sizeof(float),
              ab_cuda_stream(), q, kc, vc, out, (float *)a->ws, BH, cap, t, D, M, (float)attn_scale(a, D));
    return 0;
}
