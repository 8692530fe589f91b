/* The position-wise layers on CUDA (layers_cuda.h): element-wise kernels with
 * grid-stride loops, a warp per row where a row is reduced (layer normalisation,
 * cross-entropy), cuBLAS for the dense products, and one column-reduction kernel for
 * every sum over rows (bias and gain gradients).
 *
 * Determinism: no atomics. A column sum runs in blocks of COL_W columns x COL_R row
 * lanes; lane r adds rows r, r + COL_R, ... in order (double) and the COL_R partials
 * are added in lane order, so the result depends only on these two constants, never
 * on the grid or the device. The embedding gradient adds each token's rows in
 * position order (as the CPU does, so the same bits); the loss sums are one block's
 * fixed tree.
 *
 * Speed (unmeasured, no GPU was available): the column sums use C / 32 blocks, few
 * for narrow layers (C = 128: 4 blocks, each lane BT / 16 rows), which is fine next
 * to the GEMMs at the paper's sizes but would deserve a two-level reduction for very
 * long batches; the embedding backward runs V x C threads, each over its token's
 * positions (the copy task's 12 tokens: 1536 threads of a few hundred rows). */
#include "../harness/cuda_compat.h"

#include "layers_cuda.h"
#include "draw_core.h"
#include "mixture_core.h"

#include "../harness/rng_core.h"

#include <math.h>

#define THREADS 256
#define MAX_BLOCKS 65535LL
#define WARPS 8 /* warps per block of the warp-per-row kernels */
#define FULL 0xffffffffu
#define COL_W 32 /* column sums: columns per block */
#define COL_R 16 /* column sums: row lanes per block */

/* ---- helpers ---- */

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

__device__ __forceinline__ float warp_max_f(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        float u = __shfl_xor_sync(FULL, v, o);
        v = u > v ? u : v;
    }
    return v;
}

/* grid-stride loop over [0, n) */
#define FOR_EACH(i, n)                                                                                                 \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                                      \
         i += (long long)gridDim.x * blockDim.x)

/* warp-stride loop over rows [0, n): every lane of a warp runs the same iterations */
#define FOR_EACH_ROW(row, n)                                                                                           \
    for (long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < (n);                    \
         row += (long long)gridDim.x * (blockDim.x >> 5))

static unsigned grid_for(long long n) { return ab_cuda_grid(n, THREADS, MAX_BLOCKS); }
static int threads_for(long long n) { return ab_cuda_threads(n, THREADS); }
static unsigned row_grid(long long rows) { return ab_cuda_grid(rows, WARPS, MAX_BLOCKS); }
static int row_threads(long long rows) { return 32 * (rows < WARPS ? (int)(rows > 0 ? rows : 1) : WARPS); }

#define LAUNCH_N(kernel, n, ...) AB_LAUNCH(kernel, grid_for(n), threads_for(n), 0, ab_cuda_stream(), __VA_ARGS__)
#define LAUNCH_ROWS(kernel, rows, ...)                                                                                 \
    AB_LAUNCH(kernel, row_grid(rows), row_threads(rows), 0, ab_cuda_stream(), __VA_ARGS__)

/* ---- copies ---- */

extern "C" int copy_cuda(void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return 0;
    AB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ab_cuda_stream()));
    return 0;
}

extern "C" int zero_cuda(void *p, size_t bytes) {
    if (bytes == 0) return 0;
    AB_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ab_cuda_stream()));
    return 0;
}

__global__ void rows_copy_kernel(float *dst, long long dst_ld, const float *src, long long src_ld, long long rows,
                                 long long cols) {
    FOR_EACH(e, rows * cols) dst[(e / cols) * dst_ld + e % cols] = src[(e / cols) * src_ld + e % cols];
}

extern "C" int rows_copy_cuda(float *dst, long long dst_ld, const float *src, long long src_ld, long long rows,
                              long long cols) {
    if (rows <= 0 || cols <= 0) return 0;
    LAUNCH_N(rows_copy_kernel, rows * cols, dst, dst_ld, src, src_ld, rows, cols);
    return 0;
}

/* ---- drawing values (sampling) ---- */

/* One thread per row, each the host's loop (draw_core.h), so a row's draw is the CPU's
 * function of the same outputs. A block is one warp, so that a batch of rows spreads
 * over the multiprocessors (1024 rows: 32 blocks): each thread runs 2 n exps in
 * sequence (n = 256 classes: 512), which is the work, not the 1 MB of logits read. */
__global__ void draw_rows_kernel(int *out, int *col, long long col_ld, const float *x, long long ld, int rows,
                                 draw_spec d) {
    FOR_EACH(b, rows) {
        const uint64_t i = d.idx0 + (uint64_t)b * d.idx_stride;
        const float *r = x + b * ld;
        const double u = ab_rng_uniform_core(d.seed, d.stream, i);
        const int v = d.mixture ? draw_mixture_core(r, d.n, u, ab_rng_uniform_core(d.seed, d.stream2, i))
                                : draw_categorical_core(r, d.n, d.temperature, u);
        out[b] = v;
        if (col) col[b * col_ld] = v;
    }
}

extern "C" int draw_rows_cuda(int *out, int *col, size_t col_ld, const float *x, size_t ld, int rows,
                              const draw_spec *d) {
    if (rows <= 0) return 0;
    AB_LAUNCH(draw_rows_kernel, ab_cuda_grid(rows, 32, MAX_BLOCKS), 32, 0, ab_cuda_stream(), out, col,
              (long long)col_ld, x, (long long)ld, rows, *d);
    return 0;
}

/* ---- column sums ---- */

/* dsum[c] += sum_i a[i][c]; with x (and mean, rstd) also dprod[c] += sum_i a[i][c] xhat[i][c],
 * xhat = (x - mean) rstd (layer normalisation's gain gradient). Block: COL_W columns x
 * COL_R row lanes (threadIdx.x = lane * COL_W + column). */
__global__ void colsum_kernel(float *dsum, float *dprod, const float *a, const float *x, const float *mean,
                              const float *rstd, int BT, int C) {
    __shared__ double ps[COL_R][COL_W], pp[COL_R][COL_W];
    const int cx = threadIdx.x % COL_W, ry = threadIdx.x / COL_W;
    const long long c = (long long)blockIdx.x * COL_W + cx;
    double s = 0.0, p = 0.0;
    if (c < C) {
        for (long long i = ry; i < BT; i += COL_R) {
            const float d = a[i * C + c];
            s += d;
            if (x) p += (double)d * ((x[i * C + c] - mean[i]) * rstd[i]);
        }
    }
    ps[ry][cx] = s;
    pp[ry][cx] = p;
    __syncthreads();
    if (ry == 0 && c < C) {
        double ts = 0.0, tp = 0.0;
        for (int r = 0; r < COL_R; r++) {
            ts += ps[r][cx];
            tp += pp[r][cx];
        }
        if (dsum) dsum[c] += (float)ts;
        if (dprod) dprod[c] += (float)tp;
    }
}

static int colsum(float *dsum, float *dprod, const float *a, const float *x, const float *mean, const float *rstd,
                  int BT, int C) {
    if (BT <= 0 || C <= 0) return 0;
    AB_LAUNCH(colsum_kernel, (unsigned)((C + COL_W - 1) / COL_W), COL_W * COL_R, 0, ab_cuda_stream(), dsum, dprod, a,
              x, mean, rstd, BT, C);
    return 0;
}

/* ---- embedding and positions ---- */

__global__ void embedding_forward_kernel(float *out, const int *tokens, const float *wte, long long BT, int C) {
    FOR_EACH(e, BT * C) out[e] = wte[(long long)tokens[e / C] * C + e % C];
}

extern "C" int embedding_forward_cuda(float *out, const int *tokens, const float *wte, int BT, int C) {
    if (BT <= 0 || C <= 0) return 0;
    LAUNCH_N(embedding_forward_kernel, (long long)BT * C, out, tokens, wte, (long long)BT, C);
    return 0;
}

__global__ void embedding_backward_kernel(float *dwte, const float *dout, const int *order, const int *starts,
                                          long long V, int C) {
    FOR_EACH(e, V * C) {
        const long long v = e / C, c = e % C;
        float acc = dwte[e];
        for (int j = starts[v]; j < starts[v + 1]; j++) acc += dout[(long long)order[j] * C + c];
        dwte[e] = acc;
    }
}

extern "C" int embedding_backward_cuda(float *dwte, const float *dout, const int *order, const int *starts, int V,
                                       int C) {
    if (V <= 0 || C <= 0) return 0;
    LAUNCH_N(embedding_backward_kernel, (long long)V * C, dwte, dout, order, starts, (long long)V, C);
    return 0;
}

__global__ void positions_add_kernel(float *x, const float *table, long long total, int N, int C, int pos0) {
    FOR_EACH(e, total) {
        const long long n = (e / C) % N;
        x[e] += table[(pos0 + n) * C + e % C];
    }
}

extern "C" int positions_add_cuda(float *x, const float *table, int B, int N, int C, int pos0) {
    const long long total = (long long)B * N * C;
    if (total <= 0) return 0;
    LAUNCH_N(positions_add_kernel, total, x, table, total, N, C, pos0);
    return 0;
}

/* ---- layer normalisation ---- */

__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *x, const float *g,
                                         const float *b, int BT, int C) {
    const int lane = threadIdx.x & 31;
    FOR_EACH_ROW(i, BT) {
        const float *xi = x + i * C;
        float *oi = out + i * C;
        double m = 0.0;
        for (int c = lane; c < C; c += 32) m += xi[c];
        m = warp_sum_d(m) / C;
        double v = 0.0;
        for (int c = lane; c < C; c += 32) {
            const double d = xi[c] - m;
            v += d * d;
        }
        v = warp_sum_d(v) / C;
        const float mf = (float)m, rs = (float)(1.0 / sqrt(v + (double)LN_EPS));
        for (int c = lane; c < C; c += 32) oi[c] = (xi[c] - mf) * rs * g[c] + b[c];
        if (lane == 0) {
            mean[i] = mf;
            rstd[i] = rs;
        }
    }
}

extern "C" int layernorm_forward_cuda(float *out, float *mean, float *rstd, const float *x, const float *g,
                                      const float *b, int BT, int C) {
    if (BT <= 0 || C <= 0) return 0;
    LAUNCH_ROWS(layernorm_forward_kernel, BT, out, mean, rstd, x, g, b, BT, C);
    return 0;
}

__global__ void layernorm_dx_kernel(float *dx, const float *dout, const float *x, const float *g, const float *mean,
                                    const float *rstd, int BT, int C) {
    const int lane = threadIdx.x & 31;
    FOR_EACH_ROW(i, BT) {
        const float *xi = x + i * C, *di = dout + i * C;
        const float m = mean[i], rs = rstd[i];
        double s1 = 0.0, s2 = 0.0; /* sum dxhat, sum dxhat xhat */
        for (int c = lane; c < C; c += 32) {
            const double dxh = (double)di[c] * g[c];
            s1 += dxh;
            s2 += dxh * ((xi[c] - m) * rs);
        }
        const float m1 = (float)(warp_sum_d(s1) / C), m2 = (float)(warp_sum_d(s2) / C);
        float *dxi = dx + i * C;
        for (int c = lane; c < C; c += 32) {
            const float xh = (xi[c] - m) * rs;
            dxi[c] += rs * (di[c] * g[c] - m1 - xh * m2);
        }
    }
}

extern "C" int layernorm_backward_cuda(float *dx, float *dg, float *db, const float *dout, const float *x,
                                       const float *g, const float *mean, const float *rstd, int BT, int C) {
    if (BT <= 0 || C <= 0) return 0;
    if (dx) LAUNCH_ROWS(layernorm_dx_kernel, BT, dx, dout, x, g, mean, rstd, BT, C);
    return colsum(db, dg, dout, x, mean, rstd, BT, C);
}

/* ---- dense ---- */

__global__ void bias_rows_kernel(float *out, const float *b, long long BT, int OC) {
    FOR_EACH(e, BT * OC) out[e] = b[e % OC];
}

extern "C" int dense_forward_cuda(float *out, const float *x, const float *w, const float *b, int BT, int C,
                                  int OC) {
    if (BT <= 0 || OC <= 0) return 0;
    if (b) LAUNCH_N(bias_rows_kernel, (long long)BT * OC, out, b, (long long)BT, OC);
    /* (BT, C) (C, OC) on top of the bias rows */
    return ab_cuda_sgemm(false, true, BT, OC, C, 1.0f, x, C, w, C, b ? 1.0f : 0.0f, out, OC);
}

extern "C" int dense_backward_cuda(float *dx, float *dw, float *db, const float *dout, const float *x,
                                   const float *w, int BT, int C, int OC) {
    if (BT <= 0) return 0;
    if (dx) AB_TRY(ab_cuda_sgemm(false, false, BT, C, OC, 1.0f, dout, OC, w, C, 1.0f, dx, C)); /* (BT,OC)(OC,C) */
    AB_TRY(ab_cuda_sgemm(true, false, OC, C, BT, 1.0f, dout, OC, x, C, 1.0f, dw, C));           /* (OC,BT)(BT,C) */
    if (db) AB_TRY(colsum(db, NULL, dout, NULL, NULL, NULL, BT, OC));
    return 0;
}

/* ---- dropout ---- */

/* One thread per Philox block b0 + j: elements 4(b0+j) .. 4(b0+j)+3 of the sequence take
 * words 0..3; element g of it goes to position g - first (those in [first, first + n)).
 * mask and/or out (out = x * scale where kept, else 0; out may equal x). */
__global__ void dropout_kernel(float *out, uint8_t *mask, const float *x, long long n, uint32_t thr, float scale,
                               uint64_t seed, uint64_t stream, uint64_t first) {
    const uint64_t b0 = first / 4;
    const long long nblocks = (long long)((first + (uint64_t)n + 3) / 4 - b0);
    FOR_EACH(j, nblocks) {
        uint32_t w[4];
        ab_philox4x32_core(seed, stream, b0 + (uint64_t)j, w);
        for (int e = 0; e < 4; e++) {
            const uint64_t g = 4 * (b0 + (uint64_t)j) + (uint64_t)e;
            if (g < first) continue;
            if (g >= first + (uint64_t)n) break;
            const long long i = (long long)(g - first);
            const uint8_t keep = (uint8_t)((w[e] >> 8) < thr);
            if (mask) mask[i] = keep;
            if (out) out[i] = keep ? x[i] * scale : 0.0f;
        }
    }
}

static float drop_scale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

static long long drop_blocks(size_t n, uint64_t first) { return (long long)((first + n + 3) / 4 - first / 4); }

extern "C" int dropout_mask_cuda(uint8_t *mask, size_t n, float p, uint64_t seed, uint64_t stream, uint64_t first) {
    if (n == 0) return 0;
    LAUNCH_N(dropout_kernel, drop_blocks(n, first), (float *)NULL, mask, (const float *)NULL, (long long)n,
             dropout_threshold(p), 0.0f, seed, stream, first);
    return 0;
}

extern "C" int dropout_forward_cuda(float *out, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed,
                                    uint64_t stream, uint64_t first) {
    if (n == 0) return 0;
    LAUNCH_N(dropout_kernel, drop_blocks(n, first), out, mask, x, (long long)n, dropout_threshold(p), drop_scale(p),
             seed, stream, first);
    return 0;
}

__global__ void dropout_backward_kernel(float *dx, const float *dout, const uint8_t *mask, long long n, float scale) {
    FOR_EACH(i, n) if (mask[i]) dx[i] += dout[i] * scale;
}

extern "C" int dropout_backward_cuda(float *dx, const float *dout, const uint8_t *mask, size_t n, float p) {
    if (n == 0) return 0;
    LAUNCH_N(dropout_backward_kernel, (long long)n, dx, dout, mask, (long long)n, drop_scale(p));
    return 0;
}

/* ---- ReLU and the feed-forward block ---- */

__global__ void relu_forward_kernel(float *x, long long n) {
    FOR_EACH(i, n) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void relu_backward_kernel(float *dx, const float *dout, const float *y, long long n) {
    FOR_EACH(i, n) if (y[i] > 0.0f) dx[i] += dout[i];
}

/* d = hidden > 0 ? d * scale : 0 in place (through dropout and ReLU, as ffn.c) */
__global__ void relu_dropout_backward_kernel(float *d, const float *hidden, long long n, float scale) {
    FOR_EACH(i, n) d[i] = hidden[i] > 0.0f ? d[i] * scale : 0.0f;
}

extern "C" int relu_forward_cuda(float *x, size_t n) {
    if (n == 0) return 0;
    LAUNCH_N(relu_forward_kernel, (long long)n, x, (long long)n);
    return 0;
}

extern "C" int relu_backward_cuda(float *dx, const float *dout, const float *y, size_t n) {
    if (n == 0) return 0;
    LAUNCH_N(relu_backward_kernel, (long long)n, dx, dout, y, (long long)n);
    return 0;
}

extern "C" int ffn_forward_cuda(float *out, float *hidden, uint8_t *mask, const float *x, const ffn_params *p,
                                int BT, int C, int F, float drop_p, uint64_t seed, uint64_t stream,
                                uint64_t first) {
    const size_t nh = (size_t)BT * F;
    AB_TRY(dense_forward_cuda(hidden, x, p->w1, p->b1, BT, C, F)); /* (BT, F) */
    AB_TRY(relu_forward_cuda(hidden, nh));
    if (mask) AB_TRY(dropout_forward_cuda(hidden, mask, hidden, nh, drop_p, seed, stream, first));
    return dense_forward_cuda(out, hidden, p->w2, p->b2, BT, F, C); /* (BT, C) */
}

extern "C" int ffn_backward_cuda(float *dx, const ffn_grads *g, float *dhidden, const float *dout, const float *x,
                                 const float *hidden, const uint8_t *mask, const ffn_params *p, int BT, int C, int F,
                                 float drop_p) {
    const long long nh = (long long)BT * F;
    AB_TRY(zero_cuda(dhidden, sizeof(float) * (size_t)nh));
    AB_TRY(dense_backward_cuda(dhidden, g->w2, g->b2, dout, hidden, p->w2, BT, F, C));
    if (nh > 0) LAUNCH_N(relu_dropout_backward_kernel, nh, dhidden, hidden, nh, mask ? drop_scale(drop_p) : 1.0f);
    return dense_backward_cuda(dx, g->w1, g->b1, dhidden, x, p->w1, BT, C, F);
}

/* ---- heads ---- */

/* Element e of qkv (B*N, 3C) <-> its place in q, k or v (B, H, N, D). */
__device__ __forceinline__ long long head_index(long long row, long long c, int N, int C, int H) {
    const int D = C / H;
    const long long b = row / N, n = row % N, h = c / D, d = c % D;
    return ((b * H + h) * N + n) * D + d;
}

__global__ void heads_split_kernel(float *q, float *k, float *v, const float *qkv, long long rows, int N, int C,
                                   int H) {
    FOR_EACH(e, rows * 3 * C) {
        const long long row = e / (3 * C), c3 = e % (3 * C), part = c3 / C;
        float *dst = part == 0 ? q : part == 1 ? k : v;
        dst[head_index(row, c3 % C, N, C, H)] = qkv[e];
    }
}

__global__ void heads_join_kernel(float *dqkv, const float *dq, const float *dk, const float *dv, long long rows,
                                  int N, int C, int H) {
    FOR_EACH(e, rows * 3 * C) {
        const long long row = e / (3 * C), c3 = e % (3 * C), part = c3 / C;
        const float *src = part == 0 ? dq : part == 1 ? dk : dv;
        dqkv[e] = src[head_index(row, c3 % C, N, C, H)];
    }
}

/* to_merged: merged (B*N, C) = heads; else heads = merged */
__global__ void heads_merge_kernel(float *merged, float *heads, long long rows, int N, int C, int H, int to_merged) {
    FOR_EACH(e, rows * C) {
        const long long hi = head_index(e / C, e % C, N, C, H);
        if (to_merged) merged[e] = heads[hi];
        else heads[hi] = merged[e];
    }
}

extern "C" int heads_split_cuda(float *q, float *k, float *v, const float *qkv, int B, int N, int C, int H) {
    const long long rows = (long long)B * N;
    if (rows <= 0 || C <= 0) return 0;
    LAUNCH_N(heads_split_kernel, rows * 3 * C, q, k, v, qkv, rows, N, C, H);
    return 0;
}

extern "C" int heads_join_cuda(float *dqkv, const float *dq, const float *dk, const float *dv, int B, int N, int C,
                               int H) {
    const long long rows = (long long)B * N;
    if (rows <= 0 || C <= 0) return 0;
    LAUNCH_N(heads_join_kernel, rows * 3 * C, dqkv, dq, dk, dv, rows, N, C, H);
    return 0;
}

extern "C" int heads_merge_cuda(float *merged, const float *heads, int B, int N, int C, int H) {
    const long long rows = (long long)B * N;
    if (rows <= 0 || C <= 0) return 0;
    LAUNCH_N(heads_merge_kernel, rows * C, merged, (float *)heads, rows, N, C, H, 1);
    return 0;
}

extern "C" int heads_unmerge_cuda(float *heads, const float *merged, int B, int N, int C, int H) {
    const long long rows = (long long)B * N;
    if (rows <= 0 || C <= 0) return 0;
    LAUNCH_N(heads_merge_kernel, rows * C, (float *)merged, heads, rows, N, C, H, 0);
    return 0;
}

/* ---- residuals ---- */

__global__ void residual_add_kernel(float *out, const float *a, const float *b, long long n) {
    FOR_EACH(i, n) out[i] = a[i] + b[i];
}

__global__ void residual_acc_kernel(float *y, const float *x, long long n) {
    FOR_EACH(i, n) y[i] += x[i];
}

extern "C" int residual_add_cuda(float *out, const float *a, const float *b, size_t n) {
    if (n == 0) return 0;
    LAUNCH_N(residual_add_kernel, (long long)n, out, a, b, (long long)n);
    return 0;
}

extern "C" int residual_acc_cuda(float *y, const float *x, size_t n) {
    if (n == 0) return 0;
    LAUNCH_N(residual_acc_kernel, (long long)n, y, x, (long long)n);
    return 0;
}

__global__ void scale_inplace_kernel(float *x, long long n, float s) {
    FOR_EACH(i, n) x[i] *= s;
}

extern "C" int scale_inplace_cuda(float *x, size_t n, float s) {
    if (n == 0) return 0;
    LAUNCH_N(scale_inplace_kernel, (long long)n, x, (long long)n, s);
    return 0;
}

/* layers.h's gate_act: the same float formulas as residual.c */
__global__ void gate_act_forward_kernel(float *x, long long n, int kind) {
    if (kind == GATE_ACT_LOGSIGMOID16) {
        FOR_EACH(i, n) x[i] = (fminf(x[i], 0.0f) - log1pf(expf(-fabsf(x[i])))) * 0.0625f;
    } else {
        FOR_EACH(i, n) x[i] = 1.0f / (1.0f + expf(-x[i]));
    }
}

__global__ void gate_act_backward_kernel(float *d, const float *y, long long n, int kind) {
    if (kind == GATE_ACT_LOGSIGMOID16) {
        FOR_EACH(i, n) d[i] *= -expm1f(16.0f * y[i]) * 0.0625f;
    } else {
        FOR_EACH(i, n) d[i] *= y[i] * (1.0f - y[i]);
    }
}

extern "C" int gate_act_forward_cuda(float *x, size_t n, gate_act kind) {
    if (n == 0) return 0;
    LAUNCH_N(gate_act_forward_kernel, (long long)n, x, (long long)n, (int)kind);
    return 0;
}

extern "C" int gate_act_backward_cuda(float *d, const float *y, size_t n, gate_act kind) {
    if (n == 0) return 0;
    LAUNCH_N(gate_act_backward_kernel, (long long)n, d, y, (long long)n, (int)kind);
    return 0;
}

/* ---- fused layers (layers.h: fused.c), the recurrent step's ---- */

__global__ void embedding_positions_kernel(float *out, const int *tokens, const float *wte, const float *table,
                                           long long total, int N, int C, int pos0) {
    FOR_EACH(e, total) {
        const long long row = e / C, c = e % C;
        const float x = wte[(long long)tokens[row] * C + c];
        out[e] = table ? x + table[(pos0 + row % N) * C + c] : x;
    }
}

extern "C" int embedding_positions_cuda(float *out, const int *tokens, const float *wte, const float *table, int B,
                                        int N, int C, int pos0) {
    const long long total = (long long)B * N * C;
    if (total <= 0) return 0;
    LAUNCH_N(embedding_positions_kernel, total, out, tokens, wte, table, total, N, C, pos0);
    return 0;
}

__global__ void bias_heads_split_kernel(float *q, float *k, float *v, const float *qkv, const float *bias,
                                        long long rows, int N, int C, int H) {
    FOR_EACH(e, rows * 3 * C) {
        const long long row = e / (3 * C), c3 = e % (3 * C), part = c3 / C;
        float *dst = part == 0 ? q : part == 1 ? k : v;
        dst[head_index(row, c3 % C, N, C, H)] = qkv[e] + bias[c3];
    }
}

extern "C" int bias_heads_split_cuda(float *q, float *k, float *v, const float *qkv, const float *bias, int B, int N,
                                     int C, int H) {
    const long long rows = (long long)B * N;
    if (rows <= 0 || C <= 0) return 0;
    LAUNCH_N(bias_heads_split_kernel, rows * 3 * C, q, k, v, qkv, bias, rows, N, C, H);
    return 0;
}

__global__ void bias_relu_kernel(float *x, const float *b, long long n, int F) {
    FOR_EACH(i, n) {
        const float y = x[i] + b[i % F];
        x[i] = y > 0.0f ? y : 0.0f;
    }
}

extern "C" int bias_relu_cuda(float *x, const float *b, int BT, int F) {
    const long long n = (long long)BT * F;
    if (n <= 0) return 0;
    LAUNCH_N(bias_relu_kernel, n, x, b, n, F);
    return 0;
}

/* One warp per row: the lanes write their columns of res, then normalise them as
 * layernorm_forward_kernel does (each lane sums the columns it wrote: no barrier). */
__global__ void bias_residual_layernorm_kernel(float *res, float *out, float *mean, float *rstd, const float *x,
                                               const float *branch, const float *bias, const float *g,
                                               const float *b, int BT, int C) {
    const int lane = threadIdx.x & 31;
    FOR_EACH_ROW(i, BT) {
        const float *xi = x + i * C, *bi = branch + i * C;
        float *ri = res + i * C;
        for (int c = lane; c < C; c += 32) ri[c] = xi[c] + (bi[c] + bias[c]);
        if (!out) continue;
        double m = 0.0;
        for (int c = lane; c < C; c += 32) m += ri[c];
        m = warp_sum_d(m) / C;
        double v = 0.0;
        for (int c = lane; c < C; c += 32) {
            const double d = ri[c] - m;
            v += d * d;
        }
        v = warp_sum_d(v) / C;
        const float mf = (float)m, rs = (float)(1.0 / sqrt(v + (double)LN_EPS));
        float *oi = out + i * C;
        for (int c = lane; c < C; c += 32) oi[c] = (ri[c] - mf) * rs * g[c] + b[c];
        if (lane == 0) {
            mean[i] = mf;
            rstd[i] = rs;
        }
    }
}

extern "C" int bias_residual_layernorm_cuda(float *res, float *out, float *mean, float *rstd, const float *x,
                                            const float *branch, const float *bias, const float *g, const float *b,
                                            int BT, int C) {
    if (BT <= 0 || C <= 0) return 0;
    LAUNCH_ROWS(bias_residual_layernorm_kernel, BT, res, out, mean, rstd, x, branch, bias, g, b, BT, C);
    return 0;
}

/* ---- softmax cross-entropy ---- */

/* Scratch: 4 doubles of sums (weight, weighted nll, correct, counted), then one flag
 * byte per position (bit 1: scored, bit 0: first argmax == target). */
#define CE_SUMS_BYTES 64
#define CE_SUM_THREADS 256

extern "C" size_t cross_entropy_cuda_ws_bytes(int BT) {
    return CE_SUMS_BYTES + ((size_t)(BT > 0 ? BT : 0) + 63) / 64 * 64;
}

/* Row maximum (float, as the CPU's) and first argmax over the warp; every lane gets
 * both. Lanes past V hold index -1, which loses. */
__device__ void row_max_argmax(const float *li, int V, float *mx_out, int *am_out) {
    const int lane = threadIdx.x & 31;
    float mx = -INFINITY;
    int am = -1;
    for (int v = lane; v < V; v += 32)
        if (am < 0 || li[v] > mx) {
            mx = li[v];
            am = v;
        }
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(FULL, mx, o);
        const int oa = __shfl_xor_sync(FULL, am, o);
        if (oa >= 0 && (am < 0 || om > mx || (om == mx && oa < am))) {
            mx = om;
            am = oa;
        }
    }
    *mx_out = mx;
    *am_out = am;
}

__global__ void ce_rows_kernel(float *nll, uint8_t *flags, const float *logits, const int *targets,
                               const float *weights, int BT, int V) {
    const int lane = threadIdx.x & 31;
    FOR_EACH_ROW(i, BT) {
        const float w = weights ? weights[i] : 1.0f;
        if (!(w > 0.0f)) {
            if (lane == 0) {
                nll[i] = 0.0f;
                flags[i] = 0;
            }
            continue;
        }
        const float *li = logits + i * (long long)V;
        float mx;
        int am;
        row_max_argmax(li, V, &mx, &am);
        double s = 0.0;
        for (int v = lane; v < V; v += 32) s += exp((double)li[v] - mx);
        s = warp_sum_d(s);
        if (lane == 0) {
            const int t = targets[i];
            nll[i] = (float)(log(s) + mx - (double)li[t]);
            flags[i] = (uint8_t)(2 | (am == t));
        }
    }
}

/* One block of CE_SUM_THREADS: thread t adds positions t, t + CE_SUM_THREADS, ... in
 * order, then a fixed tree. */
__global__ void ce_sum_kernel(double *sums, const float *nll, const uint8_t *flags, const float *weights, int BT) {
    __shared__ double sw[CE_SUM_THREADS], swl[CE_SUM_THREADS];
    __shared__ long long nc[CE_SUM_THREADS], nn[CE_SUM_THREADS];
    const int t = threadIdx.x;
    double a = 0.0, b = 0.0;
    long long c = 0, n = 0;
    for (int i = t; i < BT; i += CE_SUM_THREADS) {
        if (!(flags[i] & 2)) continue;
        const float w = weights ? weights[i] : 1.0f;
        a += w;
        b += (double)w * nll[i];
        c += flags[i] & 1;
        n++;
    }
    sw[t] = a;
    swl[t] = b;
    nc[t] = c;
    nn[t] = n;
    __syncthreads();
    for (int h = CE_SUM_THREADS / 2; h > 0; h >>= 1) {
        if (t < h) {
            sw[t] += sw[t + h];
            swl[t] += swl[t + h];
            nc[t] += nc[t + h];
            nn[t] += nn[t + h];
        }
        __syncthreads();
    }
    if (t == 0) {
        sums[0] = sw[0];
        sums[1] = swl[0];
        sums[2] = (double)nc[0];
        sums[3] = (double)nn[0];
    }
}

/* The statistics from the per-position nll and flags in ws (ce_sum_kernel, then one
 * download, which waits for the kernels). */
static int ce_stats_of(ce_stats *st, const float *nll, const float *weights, int BT, void *ws) {
    double *sums = (double *)ws;
    const uint8_t *flags = (const uint8_t *)ws + CE_SUMS_BYTES;
    AB_LAUNCH(ce_sum_kernel, 1, CE_SUM_THREADS, 0, ab_cuda_stream(), sums, nll, flags, weights, BT);
    double h[4];
    AB_TRY(ab_cuda_memcpy_d2h(h, sums, sizeof h)); /* waits for the kernels */
    st->weight_sum = h[0];
    st->loss = h[0] > 0 ? h[1] / h[0] : 0.0;
    st->correct = (long long)h[2];
    st->counted = (long long)h[3];
    return 0;
}

extern "C" int cross_entropy_forward_cuda(ce_stats *st, float *nll, const float *logits, const int *targets,
                                          const float *weights, int BT, int V, void *ws) {
    uint8_t *flags = (uint8_t *)ws + CE_SUMS_BYTES;
    if (BT > 0) LAUNCH_ROWS(ce_rows_kernel, BT, nll, flags, logits, targets, weights, BT, V);
    return ce_stats_of(st, nll, weights, BT, ws);
}

__global__ void ce_backward_kernel(float *dlogits, const float *logits, const int *targets, const float *weights,
                                   double weight_sum, int BT, int V) {
    const int lane = threadIdx.x & 31;
    FOR_EACH_ROW(i, BT) {
        const float w = weights ? weights[i] : 1.0f;
        if (!(w > 0.0f)) continue;
        const float *li = logits + i * (long long)V;
        float *di = dlogits + i * (long long)V;
        float mx = -INFINITY;
        for (int v = lane; v < V; v += 32) mx = li[v] > mx ? li[v] : mx;
        mx = warp_max_f(mx);
        double s = 0.0;
        for (int v = lane; v < V; v += 32) s += exp((double)li[v] - mx);
        s = warp_sum_d(s);
        const double scale = (double)w / weight_sum;
        const int t = targets[i];
        for (int v = lane; v < V; v += 32) {
            const double pv = exp((double)li[v] - mx) / s;
            di[v] += (float)(scale * (pv - (v == t)));
        }
    }
}

extern "C" int cross_entropy_backward_cuda(float *dlogits, const float *logits, const int *targets,
                                           const float *weights, double weight_sum, int BT, int V) {
    if (!(weight_sum > 0) || BT <= 0) return 0;
    LAUNCH_ROWS(ce_backward_kernel, BT, dlogits, logits, targets, weights, weight_sum, BT, V);
    return 0;
}

/* ---- discretised logistic mixture (mixture_core.h's formulas, as the CPU) ---- */

/* One warp per position: lane 0 computes -log P(target); the most probable value is
 * shared out, lane l taking values l, l + 32, ... (mix_bin_prob), then the first
 * argmax over the warp. Flags as ce_rows_kernel's, for ce_sum_kernel. */
__global__ void mixture_rows_kernel(float *nll, uint8_t *flags, const float *out, const int *targets,
                                    const float *weights, int BT, int K) {
    const int lane = threadIdx.x & 31;
    FOR_EACH_ROW(i, BT) {
        const float w = weights ? weights[i] : 1.0f;
        if (!(w > 0.0f)) {
            if (lane == 0) {
                nll[i] = 0.0f;
                flags[i] = 0;
            }
            continue;
        }
        const float *p = out + i * 3LL * K;
        const double lse = mix_logit_lse(p, K);
        double best = 0.0;
        int am = -1;
        for (int v = lane; v < MIX_VALUES; v += 32) {
            const double P = mix_bin_prob(p, K, v, lse);
            if (am < 0 || P > best) {
                best = P;
                am = v;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const double ob = __shfl_xor_sync(FULL, best, o);
            const int oa = __shfl_xor_sync(FULL, am, o);
            if (oa >= 0 && (am < 0 || ob > best || (ob == best && oa < am))) {
                best = ob;
                am = oa;
            }
        }
        if (lane == 0) {
            const int t = targets[i];
            nll[i] = (float)-mix_log_prob(p, K, t);
            flags[i] = (uint8_t)(2 | (am == t));
        }
    }
}

extern "C" int mixture_forward_cuda(ce_stats *st, float *nll, const float *out, const int *targets,
                                    const float *weights, int BT, int K, void *ws) {
    uint8_t *flags = (uint8_t *)ws + CE_SUMS_BYTES;
    if (BT > 0) LAUNCH_ROWS(mixture_rows_kernel, BT, nll, flags, out, targets, weights, BT, K);
    return ce_stats_of(st, nll, weights, BT, ws);
}

/* One thread per position (its K components in order). */
__global__ void mixture_backward_kernel(float *dout, const float *out, const int *targets, const float *weights,
                                        double weight_sum, int BT, int K) {
    FOR_EACH(i, BT) {
        const float w = weights ? weights[i] : 1.0f;
        if (!(w > 0.0f)) continue;
        const float *p = out + i * 3LL * K;
        const int t = targets[i];
        mix_grad(dout + i * 3LL * K, p, K, t, mix_log_prob(p, K, t), (double)w / weight_sum);
    }
}

extern "C" int mixture_backward_cuda(float *dout, const float *out, const int *targets, const float *weights,
                                     double weight_sum, int BT, int K) {
    if (!(weight_sum > 0) || BT <= 0) return 0;
    LAUNCH_N(mixture_backward_kernel, BT, dout, out, targets, weights, weight_sum, BT, K);
    return 0;
}
