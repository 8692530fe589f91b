/* efficient (Efficient Attention, non-causal) on CUDA, with the definitions, options and
 * results of the CPU version (efficient.c):
 *   Q' = row softmax of q over D;  K' = softmax of each key feature over the valid
 *   positions;  C = K'^T V (D x M);  out = Q' C;  rows >= L zero.
 * Per run of batch entries of equal valid length L (attn_cuda_runs), all its slices at
 * once:
 *   column max and sum of exp of K (a thread per (slice, feature), sums in double);
 *   K' (element-wise), C = K'^T V (one strided-batched GEMM over the slices);
 *   Q' (a warp per row), out = Q' C (batched GEMM straight into out).
 * Backward (as the CPU): K' again from the saved column statistics; dC = Q'^T dO,
 * dQ' = dO C^T -> dq = Q' .* (dQ' - Q'.dQ') (a warp per row); dK' = V dC^T, dV = K' dC
 * (into dv), the column sums of K' .* dK' (as sum_m dC_dm C_dm, the CPU's), then
 * dk = K' .* (dK' - those sums).
 *
 * Memory: forward saves the CPU's (efficient.c): C, the column maxima and 1/sums, in
 * the same layout. Workspace: Q', K' and one gradient of them for every slice
 * (3 B H N D floats: the same order as the inputs), dC (B H D M) and one column vector
 * (B H D). Speed: not measured (no GPU here); forward's column statistics walk N rows
 * per thread (a few hundred threads at B H = 8, D = 64: latency-bound, a two-level
 * reduction would help for long sequences); the products are D x M x L GEMMs per
 * slice. */
#include "cuda_util.cuh"

#include "efficient_cuda.h"

#define THREADS 256
#define MAX_BLOCKS 65535LL

/* kmax[sl*D + d], kinv = 1 / sum_j exp(k_jd - kmax) over rows j < L of slice sl (tensor
 * rows at k + sl * N * D). */
__global__ void eff_col_stats_kernel(const float *k, long long ns, int N, int L, int D, float *kmax, float *kinv) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < ns * D; e += (long long)gridDim.x * blockDim.x) {
        const long long sl = e / D;
        const int d = (int)(e % D);
        const float *col = k + sl * N * D + d;
        float mx = -INFINITY;
        for (int j = 0; j < L; j++) mx = fmaxf(mx, col[(long long)j * D]);
        double sum = 0;
        for (int j = 0; j < L; j++) sum += (double)expf(col[(long long)j * D] - mx);
        kmax[e] = mx;
        kinv[e] = (float)(1.0 / sum);
    }
}

/* kp (ns x L x D) = exp(k - kmax) * kinv for the valid rows. */
__global__ void eff_key_softmax_kernel(const float *k, long long ns, int N, int L, int D, const float *kmax,
                                       const float *kinv, float *kp) {
    const long long per = (long long)L * D, total = ns * per;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        const long long sl = e / per, r = e % per;
        const long long cd = sl * D + r % D;
        kp[e] = expf(k[sl * N * D + r] - kmax[cd]) * kinv[cd];
    }
}

/* qp rows (ns x L x D) = softmax over D of the q rows; one warp per row. */
__global__ void eff_query_softmax_kernel(const float *q, long long ns, int N, int L, int D, float *qp) {
    const int lane = threadIdx.x & 31;
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5, rows = ns * L;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        const long long sl = r / L, i = r % L;
        const float *x = q + (sl * N + i) * D;
        float *o = qp + r * D;
        float mx = -INFINITY;
        for (int d = lane; d < D; d += 32) mx = fmaxf(mx, x[d]);
        mx = attn_warp_max(mx);
        double sum = 0;
        for (int d = lane; d < D; d += 32) {
            o[d] = expf(x[d] - mx);
            sum += o[d];
        }
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        const float inv = (float)(1.0 / sum);
        for (int d = lane; d < D; d += 32) o[d] *= inv;
    }
}

/* dq rows = qp .* (g - qp . g) (g = dQ' rows, ns x L x D), written at dq's tensor rows. */
__global__ void eff_query_grad_kernel(const float *qp, const float *g, long long ns, int N, int L, int D, float *dq) {
    const int lane = threadIdx.x & 31;
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5, rows = ns * L;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        const long long sl = r / L, i = r % L;
        const float *p = qp + r * D, *gr = g + r * D;
        double dot = 0;
        for (int d = lane; d < D; d += 32) dot += (double)p[d] * gr[d];
        for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        const float fd = (float)dot;
        float *o = dq + (sl * N + i) * D;
        for (int d = lane; d < D; d += 32) o[d] = p[d] * (gr[d] - fd);
    }
}

/* cacc[sl*D + d] = sum over the L rows of kp .* g = sum_m dC_dm C_dm (efficient.c says
 * why), in double, a thread per (slice, feature): M terms instead of L. */
__global__ void eff_key_sums_kernel(const float *dctx, const float *ctx, long long ns, int D, int M, float *cacc) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < ns * D; e += (long long)gridDim.x * blockDim.x) {
        const float *a = dctx + e * M, *b = ctx + e * M; /* row d of slice sl's D x M blocks */
        double sum = 0;
        for (int m = 0; m < M; m++) sum += (double)a[m] * b[m];
        cacc[e] = (float)sum;
    }
}

/* dk rows = kp .* (g - cacc). */
__global__ void eff_key_grad_kernel(const float *kp, const float *g, const float *cacc, long long ns, int N, int L,
                                    int D, float *dk) {
    const long long per = (long long)L * D, total = ns * per;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        const long long sl = e / per, r = e % per;
        dk[sl * N * D + r] = kp[e] * (g[e] - cacc[sl * D + r % D]);
    }
}

/* ---- workspace ---- */

struct eff_bufs {
    float *qp, *kp, *g, *dctx, *cacc; /* workspace */
    float *ctx, *kmax, *kinv;         /* the saved buffer: [B*H][D][M], [B*H][D], [B*H][D] */
};

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

static size_t carve(const attn_shape *s, float *ws, const void *saved, eff_bufs *b) {
    const size_t BH = (size_t)s->batch * s->heads, ND = BH * (size_t)s->len * s->qk_dim;
    const size_t DM = BH * (size_t)s->qk_dim * s->v_dim, Dv = BH * (size_t)s->qk_dim;
    const size_t sizes[5] = {ND, ND, ND, DM, Dv};
    float **dst[5] = {&b->qp, &b->kp, &b->g, &b->dctx, &b->cacc};
    size_t off = 0;
    for (int i = 0; i < 5; i++) {
        if (ws) *dst[i] = ws + off;
        off += up64(sizes[i]);
    }
    float *sv = (float *)saved;
    b->ctx = sv;
    b->kmax = sv ? sv + DM : NULL;
    b->kinv = sv ? sv + DM + Dv : NULL;
    return off;
}

/* b with the saved parts moved on to slice s0 (the first of a run). */
static eff_bufs at_slice(eff_bufs b, long long s0, int D, int M) {
    b.ctx += s0 * D * M;
    b.kmax += s0 * D;
    b.kinv += s0 * D;
    return b;
}

extern "C" size_t eff_cuda_workspace_bytes(const attn *a, const attn_shape *s) {
    (void)a;
    eff_bufs b;
    return carve(s, NULL, NULL, &b) * sizeof(float);
}

static unsigned grid_elems(long long n) { return ab_cuda_grid(n, THREADS, MAX_BLOCKS); }
static unsigned grid_warps(long long rows) { return ab_cuda_grid(rows, THREADS / 32, MAX_BLOCKS); }

/* K' of ns slices (tensor bases at the first) from the column statistics. */
static int key_softmax(const eff_bufs &b, long long ns, int N, int L, int D, const float *k) {
    AB_LAUNCH(eff_key_softmax_kernel, grid_elems(ns * L * D), THREADS, 0, ab_cuda_stream(), k, ns, N, L, D,
              (const float *)b.kmax, (const float *)b.kinv, b.kp);
    return 0;
}

/* Column statistics, K' and the context C of ns slices (into the saved buffer). */
static int context(const eff_bufs &b, long long ns, int N, int L, int D, int M, const float *k, const float *v) {
    AB_LAUNCH(eff_col_stats_kernel, grid_elems(ns * D), THREADS, 0, ab_cuda_stream(), k, ns, N, L, D, b.kmax, b.kinv);
    AB_TRY(key_softmax(b, ns, N, L, D, k));
    /* C = K'^T V  (D, M) per slice */
    AB_TRY(ab_cuda_sgemm_batched(true, false, D, M, L, 1.0f, b.kp, D, (long long)L * D, v, M, (long long)N * M, 0.0f,
                                 b.ctx, M, (long long)D * M, ns));
    return 0;
}

extern "C" int eff_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                float *out, void *saved) {
    eff_bufs b0;
    carve(s, (float *)a->ws, saved, &b0);
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const long long ND = (long long)N * D, NM = (long long)N * M;
    /* saved: defined even for the slices of length 0 (the others' C is written below) */
    AB_TRY(attn_cuda_zero_tail(b0.ctx, 1, (long long)s->batch * s->heads * D * M, 0));
    return attn_cuda_runs(s, {{out, M, false}}, [&](long long s0, long long ns, int L) {
        const eff_bufs b = at_slice(b0, s0, D, M);
        AB_TRY(context(b, ns, N, L, D, M, k + s0 * ND, v + s0 * NM));
        AB_LAUNCH(eff_query_softmax_kernel, grid_warps(ns * L), THREADS, 0, ab_cuda_stream(), q + s0 * ND, ns, N, L, D,
                  b.qp);
        /* out = Q' C  (L, M) per slice, into the tensor */
        return ab_cuda_sgemm_batched(false, false, L, M, D, 1.0f, b.qp, D, (long long)L * D, b.ctx, M,
                                     (long long)D * M, 0.0f, out + s0 * NM, M, NM, ns);
    });
}

extern "C" int eff_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                 const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    eff_bufs b0;
    carve(s, (float *)a->ws, saved, &b0);
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const long long ND = (long long)N * D, NM = (long long)N * M;
    return attn_cuda_runs(s, {{dq, D, false}, {dk, D, false}, {dv, M, false}}, [&](long long s0, long long ns, int L) {
        const eff_bufs b = at_slice(b0, s0, D, M);
        const long long LD = (long long)L * D;
        const float *go = dout + s0 * NM;
        AB_TRY(key_softmax(b, ns, N, L, D, k + s0 * ND)); /* C and the statistics: forward's */
        AB_LAUNCH(eff_query_softmax_kernel, grid_warps(ns * L), THREADS, 0, ab_cuda_stream(), q + s0 * ND, ns, N, L, D,
                  b.qp);
        /* dQ' = dO C^T  (L, D); dq = Q' .* (dQ' - Q'.dQ') */
        AB_TRY(ab_cuda_sgemm_batched(false, true, L, D, M, 1.0f, go, M, NM, b.ctx, M, (long long)D * M, 0.0f, b.g, D,
                                     LD, ns));
        AB_LAUNCH(eff_query_grad_kernel, grid_warps(ns * L), THREADS, 0, ab_cuda_stream(), (const float *)b.qp,
                  (const float *)b.g, ns, N, L, D, dq + s0 * ND);
        /* dC = Q'^T dO  (D, M) */
        AB_TRY(ab_cuda_sgemm_batched(true, false, D, M, L, 1.0f, b.qp, D, LD, go, M, NM, 0.0f, b.dctx, M,
                                     (long long)D * M, ns));
        /* dK' = V dC^T  (L, D); dV = K' dC  (L, M), into the tensor */
        AB_TRY(ab_cuda_sgemm_batched(false, true, L, D, M, 1.0f, v + s0 * NM, M, NM, b.dctx, M, (long long)D * M, 0.0f,
                                     b.g, D, LD, ns));
        AB_TRY(ab_cuda_sgemm_batched(false, false, L, M, D, 1.0f, b.kp, D, LD, b.dctx, M, (long long)D * M, 0.0f,
                                     dv + s0 * NM, M, NM, ns));
        AB_LAUNCH(eff_key_sums_kernel, grid_elems(ns * D), THREADS, 0, ab_cuda_stream(), (const float *)b.dctx,
                  (const float *)b.ctx, ns, D, M, b.cacc);
        AB_LAUNCH(eff_key_grad_kernel, grid_elems(ns * LD), THREADS, 0, ab_cuda_stream(), (const float *)b.kp,
                  (const float *)b.g, (const float *)b.cacc, ns, N, L, D, dk + s0 * ND);
        return 0;
    });
}
