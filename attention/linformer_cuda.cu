/* linformer (non-causal) on CUDA, with the definitions, options, parameters and saved
 * layout of the CPU version (linformer.c, linformer.h):
 *   Kp = E[:, :L] K[:L],  Vp = F[:, :L] V[:L],  A = softmax_rows(scale Q Kp^T),  out = A Vp.
 * Per run of batch entries of equal valid length L (attn_cuda_runs), all its slices at
 * once: each product is one strided-batched cuBLAS GEMM over the slices (E and F with
 * stride 0: the heads share them), the softmax a warp per row (max, exponentials, sum
 * in double). Backward: dA = G Vp^T, dS = A .* (dA - rowsum(A .* dA)) (a warp per
 * row), dQ = scale dS Kp, dKp = scale dS^T Q, dVp = A^T G, dK = E^T dKp, dV = F^T dVp
 * (batched GEMMs), then the parameter gradient dE[:, :L] += dKp_s K_s^T and dF[:, :L] +=
 * dVp_s V_s^T, one GEMM per slice in slice order with beta = 1 (no atomics: two runs
 * give the same bits).
 *
 * Memory: forward saves A, Kp, Vp per slice (the CPU's layout). Workspace: dKp and dVp
 * of every slice (B H k (D + M) floats) and dA / dS (B H N k). Speed: not measured here
 * (no GPU); the parameter-gradient loop launches 2 B H GEMMs of k x L x D. */
#include "cuda_util.cuh"

#include "linformer.h"
#include "linformer_cuda.h"

#define THREADS 256
#define MAX_BLOCKS 65535LL

/* Rows i < L of each of ns slices (row r at x + (r / L) * stride + (r % L) * P):
 * in place softmax over the P entries; one warp per row. */
__global__ void lfm_softmax_kernel(float *x, long long ns, long long stride, int L, int P) {
    const int lane = threadIdx.x & 31;
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5, rows = ns * L;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        float *row = x + (r / L) * stride + (r % L) * (long long)P;
        float mx = -INFINITY;
        for (int j = lane; j < P; j += 32) mx = fmaxf(mx, row[j]);
        mx = attn_warp_max(mx);
        double sum = 0;
        for (int j = lane; j < P; j += 32) {
            const float e = expf(row[j] - mx);
            row[j] = e;
            sum += e;
        }
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        const float inv = (float)(1.0 / sum);
        for (int j = lane; j < P; j += 32) row[j] *= inv;
    }
}

/* dS = A .* (dA - rowsum(A .* dA)) in place of dA, rows i < L (A rows at a + slice *
 * a_stride + i P, dA rows at g + slice * g_stride + i P); one warp per row. */
__global__ void lfm_dscore_kernel(const float *a, long long a_stride, float *g, long long g_stride, long long ns, int L,
                                  int P) {
    const int lane = threadIdx.x & 31;
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5, rows = ns * L;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        const float *ar = a + (r / L) * a_stride + (r % L) * (long long)P;
        float *gr = g + (r / L) * g_stride + (r % L) * (long long)P;
        double dot = 0;
        for (int j = lane; j < P; j += 32) dot += (double)ar[j] * gr[j];
        for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        const float fd = (float)dot;
        for (int j = lane; j < P; j += 32) gr[j] = ar[j] * (gr[j] - fd);
    }
}

static unsigned grid_warps(long long rows) { return ab_cuda_grid(rows, THREADS / 32, MAX_BLOCKS); }

/* Workspace: dKp, dVp per slice [B*H][k][D + M], then dA [B*H][N][k]. */
extern "C" size_t lfm_cuda_workspace_bytes(const attn *a, const attn_shape *s) {
    const size_t BH = (size_t)s->batch * s->heads, P = (size_t)a->p.proj_k;
    return (BH * P * ((size_t)s->qk_dim + s->v_dim) + BH * (size_t)s->len * P) * sizeof(float);
}

extern "C" int lfm_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                float *out, void *saved) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim, P = a->p.proj_k, ld = a->param_len;
    const long long ND = (long long)N * D, NM = (long long)N * M, SS = (long long)lfm_saved_slice_floats(a, s);
    const float scale = (float)attn_scale(a, D);
    const float *E = lfm_E(a), *F = lfm_F(a);
    /* saved: Kp and Vp defined even for the slices of length 0 (the others' are written below) */
    AB_TRY(attn_cuda_zero_tail((float *)saved, (long long)s->batch * s->heads, SS, (long long)N * P));
    return attn_cuda_runs(s, {{out, M, false}}, [&](long long s0, long long ns, int L) {
        float *A = (float *)saved + s0 * SS, *kp = A + (long long)N * P, *vp = kp + (long long)P * D;
        AB_TRY(ab_cuda_sgemm_batched(false, false, P, D, L, 1.0f, E, ld, 0, k + s0 * ND, D, ND, 0.0f, kp, D, SS, ns));
        AB_TRY(ab_cuda_sgemm_batched(false, false, P, M, L, 1.0f, F, ld, 0, v + s0 * NM, M, NM, 0.0f, vp, M, SS, ns));
        AB_TRY(ab_cuda_sgemm_batched(false, true, L, P, D, scale, q + s0 * ND, D, ND, kp, D, SS, 0.0f, A, P, SS, ns));
        AB_LAUNCH(lfm_softmax_kernel, grid_warps(ns * L), THREADS, 0, ab_cuda_stream(), A, ns, SS, L, P);
        return ab_cuda_sgemm_batched(false, false, L, M, P, 1.0f, A, P, SS, vp, M, SS, 0.0f, out + s0 * NM, M, NM, ns);
    });
}

extern "C" int lfm_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                 const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    const int H = s->heads, N = s->len, D = s->qk_dim, M = s->v_dim, P = a->p.proj_k, ld = a->param_len;
    const long long ND = (long long)N * D, NM = (long long)N * M, SS = (long long)lfm_saved_slice_floats(a, s);
    const long long PS = (long long)P * (D + M), NP = (long long)N * P, BH = (long long)s->batch * H;
    const float scale = (float)attn_scale(a, D);
    const float *E = lfm_E(a), *F = lfm_F(a);
    float *dE = lfm_dE(a), *dF = lfm_dF(a);
    float *dpar = (float *)a->ws, *dA0 = dpar + BH * PS;
    return attn_cuda_runs(s, {{dq, D, false}, {dk, D, false}, {dv, M, false}}, [&](long long s0, long long ns, int L) {
        const float *A = (const float *)saved + s0 * SS, *kp = A + (long long)N * P, *vp = kp + (long long)P * D;
        float *dkp = dpar + s0 * PS, *dvp = dkp + (long long)P * D, *dA = dA0 + s0 * NP;
        const float *qs = q + s0 * ND, *gs = dout + s0 * NM;
        AB_TRY(ab_cuda_sgemm_batched(false, true, L, P, M, 1.0f, gs, M, NM, vp, M, SS, 0.0f, dA, P, NP, ns));
        AB_LAUNCH(lfm_dscore_kernel, grid_warps(ns * L), THREADS, 0, ab_cuda_stream(), A, SS, dA, NP, ns, L, P);
        AB_TRY(ab_cuda_sgemm_batched(false, false, L, D, P, scale, dA, P, NP, kp, D, SS, 0.0f, dq + s0 * ND, D, ND, ns));
        AB_TRY(ab_cuda_sgemm_batched(true, false, P, D, L, scale, dA, P, NP, qs, D, ND, 0.0f, dkp, D, PS, ns));
        AB_TRY(ab_cuda_sgemm_batched(true, false, P, M, L, 1.0f, A, P, SS, gs, M, NM, 0.0f, dvp, M, PS, ns));
        AB_TRY(ab_cuda_sgemm_batched(true, false, L, D, P, 1.0f, E, ld, 0, dkp, D, PS, 0.0f, dk + s0 * ND, D, ND, ns));
        AB_TRY(ab_cuda_sgemm_batched(true, false, L, M, P, 1.0f, F, ld, 0, dvp, M, PS, 0.0f, dv + s0 * NM, M, NM, ns));
        if (!dE) return 0;
        for (long long i = 0; i < ns; i++) {
            AB_TRY(ab_cuda_sgemm(false, true, P, L, D, 1.0f, dkp + i * PS, D, k + (s0 + i) * ND, D, 1.0f, dE, ld));
            AB_TRY(ab_cuda_sgemm(false, true, P, L, M, 1.0f, dvp + i * PS, M, v + (s0 + i) * NM, M, 1.0f, dF, ld));
        }
        return 0;
    });
}
