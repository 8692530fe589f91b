/* local (sliding-window softmax) on CUDA, with the definitions, options and results of
 * the CPU version (local.c): row i attends to keys i - w < j <= i (causal) or
 * |i - j| < w, j < L; rows >= L output zero.
 *
 * Parallel mode: the banded form of softmax's fused kernels (flash_softmax.cu, whose
 * header has the design): a query tile visits only the key tiles that meet its band
 * (key tiles [max(0, q0 - w + 1), q1 + w - 1) / 64, causal: up to the diagonal), a key
 * tile of the backward only the query tiles its band reaches, and only the tiles that
 * cross a band edge, the diagonal or L evaluate the mask; the probabilities of a row
 * are the online softmax over its band. Time O(N (w + 64) (D + M)), linear in N for a
 * fixed window. What forward saves (its own layout, not the CPU's nothing): O and the
 * rows' log-sum-exps, B*H*N*(M + 1) floats (local_cuda_saved_bytes); forward takes
 * saved = NULL (out only: inference, the prefill). Backward recomputes the band's
 * probabilities from Q, K and the log-sum-exps, dK and dV per key tile in registers,
 * dQ by a second pass over query tiles (no atomics: deterministic). Workspace: B*H*N
 * floats (backward's dO . O). This replaces tiles of scores through cuBLAS over padded
 * copies of the inputs (7 padded tensors and two score blocks per tile of workspace,
 * up to 63 masked columns per side computed and stored).
 *
 * Recurrent state: the CPU's ring (local.c); a step is one block per slice (scores of
 * the window in the step workspace, then its softmax and the weighted sum of the
 * ring's values). */
#include "cuda_util.cuh"

#include "flash_softmax.h"
#include "local_cuda.h"

#define THREADS 256
#define MAX_BLOCKS 65535LL

static unsigned grid_elems(long long n) { return ab_cuda_grid(n, THREADS, MAX_BLOCKS); }

/* ---- parallel mode ---- */

extern "C" int local_cuda_check_shape(const attn *a, const attn_shape *s) {
    (void)a;
    return flash_attn_check_shape("local", s);
}

extern "C" size_t local_cuda_saved_bytes(const attn *a, const attn_shape *s) {
    (void)a;
    return flash_attn_saved_bytes(s);
}

extern "C" size_t local_cuda_workspace_bytes(const attn *a, const attn_shape *s) {
    (void)a;
    return flash_attn_workspace_bytes(s);
}

extern "C" int local_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                  float *out, void *saved) {
    return flash_attn_forward(a, s, a->p.window, q, k, v, out, saved);
}

extern "C" int local_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                   const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    return flash_attn_backward(a, s, a->p.window, q, k, v, dout, saved, dq, dk, dv);
}

/* ---- recurrent mode: the CPU's ring (local.c) ---- */

static int ring_len(const attn *a, int capacity) { return a->p.window < capacity ? a->p.window : capacity; }

static size_t kring_bytes(const attn *a, const attn_shape *s, int capacity) {
    return ((size_t)s->batch * (size_t)s->heads * (size_t)ring_len(a, capacity) * (size_t)s->qk_dim * sizeof(float) +
            63) / 64 * 64;
}

/* Positions [first, P) of the prompt (ns slices of P rows) into their ring slots. */
__global__ void loc_ring_fill_kernel(const float *src, long long ns, int P, int first, int X, int W, float *ring) {
    const long long per = (long long)(P - first) * X, total = ns * per;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        const long long sl = e / per, t = first + (e % per) / X;
        const int c = (int)(e % X);
        ring[(sl * W + t % W) * X + c] = src[(sl * P + t) * X + c];
    }
}

/* One block per slice: k, v into slot t mod W; the scores of positions t-n+1..t (sc,
 * W floats per slice of workspace), their softmax, out = their weighted values. */
__global__ void loc_step_kernel(float *kr, float *vr, const float *q, const float *k, const float *v, float *out,
                                float *scores, long long n_slices, int D, int M, int W, int t, int n, float scale) {
    for (long long bh = blockIdx.x; bh < n_slices; bh += gridDim.x) {
        float *ks = kr + bh * W * D, *vs = vr + bh * W * M, *sc = scores + bh * W;
        const float *qt = q + bh * D;
        const int slot = t % W, first = (t - n + 1) % W;
        for (int d = threadIdx.x; d < D; d += blockDim.x) ks[(long long)slot * D + d] = k[bh * D + d];
        for (int m = threadIdx.x; m < M; m += blockDim.x) vs[(long long)slot * M + m] = v[bh * M + m];
        __syncthreads();
        float mx = -INFINITY;
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            const float *kj = ks + (long long)((first + j) % W) * D;
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += qt[d] * kj[d];
            sc[j] = scale * acc;
            mx = fmaxf(mx, sc[j]);
        }
        mx = attn_block_max(mx);
        float part = 0.0f;
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            sc[j] = expf(sc[j] - mx);
            part += sc[j];
        }
        const float inv = 1.0f / attn_block_sum(part); /* ends with a barrier: sc is complete */
        for (int m = threadIdx.x; m < M; m += blockDim.x) {
            float acc = 0.0f;
            for (int j = 0; j < n; j++) acc += sc[j] * vs[(long long)((first + j) % W) * M + m];
            out[bh * M + m] = acc * inv;
        }
        __syncthreads();
    }
}

/* The ring's slots beyond the positions held are never read: nothing to clear. */
extern "C" int local_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    (void)a, (void)s, (void)capacity, (void)state;
    return 0;
}

extern "C" size_t local_cuda_step_workspace_bytes(const attn *a, const attn_shape *s, int capacity) {
    return (size_t)s->batch * (size_t)s->heads * (size_t)ring_len(a, capacity) * sizeof(float);
}

extern "C" int local_cuda_prefill(attn *a, const attn_shape *s, int capacity, int P, const float *q, const float *k,
                                  const float *v, float *out, void *state) {
    const int D = s->qk_dim, M = s->v_dim, W = ring_len(a, capacity);
    const long long BH = (long long)s->batch * s->heads;
    float *kr = (float *)state, *vr = (float *)((char *)state + kring_bytes(a, s, capacity));
    const int first = P > W ? P - W : 0;
    AB_LAUNCH(loc_ring_fill_kernel, grid_elems(BH * (P - first) * D), THREADS, 0, ab_cuda_stream(), k, BH, P, first,
              D, W, kr);
    AB_LAUNCH(loc_ring_fill_kernel, grid_elems(BH * (P - first) * M), THREADS, 0, ab_cuda_stream(), v, BH, P, first,
              M, W, vr);
    if (!out) return 0;
    attn_shape ps = *s;
    ps.len = P;
    return local_cuda_forward(a, &ps, q, k, v, out, NULL);
}

extern "C" int local_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q,
                               const float *k, const float *v, float *out) {
    const int D = s->qk_dim, M = s->v_dim, W = ring_len(a, capacity);
    const long long BH = (long long)s->batch * s->heads;
    float *kr = (float *)state, *vr = (float *)((char *)state + kring_bytes(a, s, capacity));
    const int n = t + 1 < a->p.window ? t + 1 : a->p.window;
    AB_LAUNCH(loc_step_kernel, ab_cuda_grid(BH, 1, MAX_BLOCKS), THREADS, 0, ab_cuda_stream(), kr, vr, q, k, v, out,
              (float *)a->ws, BH, D, M, W, t, n, (float)attn_scale(a, D));
    return 0;
}
