/* retention (RetNet) on CUDA, with the definitions, options and results of the CPU
 * version (retention.c, whose header has the pass every call is made of):
 *
 *   y_i = s sum_{j allowed} gamma^|i-j| (a_i . b_j) c_j
 *
 * over one slice's positions [0, L), causal (j <= i) or, with rev, on the positions in
 * reverse order (j >= i), the diagonal included or not (non-causal: a causal pass with
 * it, then a reversed one without, added). The forward is (q, k, v); the gradients
 * (dout, v, k) causal, (v, dout, q) and (k, q, dout) reversed, as on the CPU.
 *
 * A pass over a run of slices of one valid length L, chunk T (the option, at most 64):
 * 1. rc_chunk_state_kernel: per (slice, chunk) its own state sum_r gamma^(t-1-r) b_r c_r^T
 *    (P x R) into the workspace;
 * 2. rc_scan_kernel: per (slice, element), over the chunks in order, the state before
 *    each chunk (exclusive scan, S <- gamma^t S + own), in place; the state after the
 *    last position into the recurrent state (prefill);
 * 3. rc_out_kernel: per (slice, chunk), the chunk's t x t decayed scores in shared memory,
 *    then y_i = scores c + s gamma^(r+1) a_i^T S.
 * Powers of gamma come from a per-head table gamma^e, e = 0..T (rc_table_kernel, in
 * double, rounded to float): as on the CPU, no factor exceeds 1. Nothing is saved.
 * Workspace: the table and B*H*ceil(N/T) states of D x M floats.
 *
 * The kernels compute in fp32 whatever the precision option (they make no cuBLAS
 * call, the only place tf32 applies).
 *
 * Recurrent state: the CPU's (S, D x M per slice); a step is one block per slice, one
 * thread per column of S. */
#include "cuda_util.cuh"

#include "retention_cuda.h"

#include "../harness/memory.h"

#define THREADS 256
#define MAX_BLOCKS 65535LL
#define RC_MAX_T 64 /* the chunk's scores, T x T floats, in shared memory: 16 KiB */

static unsigned grid_elems(long long n) { return ab_cuda_grid(n, THREADS, MAX_BLOCKS); }

static int chunk_of(const attn *a) { return a->p.chunk > 0 && a->p.chunk < RC_MAX_T ? a->p.chunk : RC_MAX_T; }

static size_t table_bytes(const attn_shape *s, int T) {
    return ((size_t)s->heads * (size_t)(T + 1) * sizeof(float) + 63) / 64 * 64;
}

extern "C" size_t ret_cuda_workspace_bytes(const attn *a, const attn_shape *s) {
    const int T = chunk_of(a);
    const size_t nc = ((size_t)s->len + T - 1) / T;
    return table_bytes(s, T) + (size_t)s->batch * s->heads * nc * (size_t)s->qk_dim * s->v_dim * sizeof(float);
}

extern "C" int ret_cuda_check_sizes(const attn *a, const attn_shape *s) {
    const int T = chunk_of(a);
    size_t n = ((size_t)s->len + T - 1) / T, bh;
    if (ab_mul_size((size_t)s->batch, (size_t)s->heads, &bh) || ab_mul_size(n, bh, &n) ||
        ab_mul_size(n, (size_t)s->qk_dim, &n) || ab_mul_size(n, (size_t)s->v_dim, &n) ||
        ab_mul_size(n, sizeof(float), &n) || n > SIZE_MAX - table_bytes(s, T))
        return ab_fail(AB_EINVAL, "variant 'retention': CUDA workspace size overflows for N=%d D=%d M=%d", s->len,
                       s->qk_dim, s->v_dim);
    return 0;
}

/* ---- kernels ---- */

/* pw[h (T+1) + e] = gamma_h^e. */
__global__ void rc_table_kernel(float *pw, int H, int T, double gamma) {
    const int n = H * (T + 1);
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        const int h = e / (T + 1), x = e % (T + 1);
        const double g = isnan(gamma) ? 1.0 - ldexp(1.0, -5 - h) : gamma;
        pw[e] = (float)pow(g, (double)x);
    }
}

/* The row of a slice's logical position i (reversed: L-1-i). */
__device__ __forceinline__ long long rc_row(long long sl, long long N, int L, int i, bool rev) {
    return sl * N + (rev ? L - 1 - i : i);
}

__global__ void rc_chunk_state_kernel(const float *b, const float *c, long long ns, long long N, int L, int T, int nc,
                                      int P, int R, bool rev, int H, const float *pw, float *hs) {
    const long long PR = (long long)P * R;
    for (long long blk = blockIdx.x; blk < ns * nc; blk += gridDim.x) {
        const long long sl = blk / nc;
        const int ch = (int)(blk % nc), i0 = ch * T, t = min(T, L - i0);
        const float *ph = pw + (sl % H) * (T + 1);
        for (long long e = threadIdx.x; e < PR; e += blockDim.x) {
            const int p = (int)(e / R), r = (int)(e % R);
            float acc = 0.0f;
            for (int rr = 0; rr < t; rr++) {
                const long long row = rc_row(sl, N, L, i0 + rr, rev);
                acc += ph[t - 1 - rr] * b[row * P + p] * c[row * R + r];
            }
            hs[blk * PR + e] = acc;
        }
    }
}

__global__ void rc_scan_kernel(float *hs, long long ns, int nc, long long PR, int L, int T, int H, const float *pw,
                               float *final_state) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < ns * PR;
         e += (long long)gridDim.x * blockDim.x) {
        const long long sl = e / PR, x = e % PR;
        const float *ph = pw + (sl % H) * (T + 1);
        float prev = 0.0f;
        for (int ch = 0; ch < nc; ch++) {
            const int t = min(T, L - ch * T);
            float *cell = hs + (sl * nc + ch) * PR + x;
            const float own = *cell;
            *cell = prev;
            prev = ph[t] * prev + own;
        }
        if (final_state) final_state[e] = prev;
    }
}

__global__ void rc_out_kernel(const float *a, const float *b, const float *c, float *y, long long ns, long long N,
                              int L, int T, int nc, int P, int R, bool rev, bool diag, bool accumulate, int H,
                              const float *pw, float scale, const float *hs) {
    AB_DYN_SMEM(float, sc); /* the chunk's t x t decayed scores */
    const long long PR = (long long)P * R;
    for (long long blk = blockIdx.x; blk < ns * nc; blk += gridDim.x) {
        const long long sl = blk / nc;
        const int ch = (int)(blk % nc), i0 = ch * T, t = min(T, L - i0);
        const float *ph = pw + (sl % H) * (T + 1);
        for (int e = threadIdx.x; e < t * t; e += blockDim.x) {
            const int rr = e / t, jj = e % t;
            float val = 0.0f;
            if (jj < rr || (diag && jj == rr)) {
                const float *ai = a + rc_row(sl, N, L, i0 + rr, rev) * P, *bj = b + rc_row(sl, N, L, i0 + jj, rev) * P;
                float d = 0.0f;
                for (int p = 0; p < P; p++) d += ai[p] * bj[p];
                val = scale * ph[rr - jj] * d;
            }
            sc[e] = val;
        }
        __syncthreads();
        const float *S = hs + blk * PR;
        for (int e = threadIdx.x; e < t * R; e += blockDim.x) {
            const int rr = e / R, r = e % R;
            const long long row = rc_row(sl, N, L, i0 + rr, rev);
            float acc = 0.0f;
            for (int jj = 0; jj <= rr; jj++) acc += sc[rr * t + jj] * c[rc_row(sl, N, L, i0 + jj, rev) * R + r];
            if (ch > 0) {
                const float *ai = a + row * P;
                float inter = 0.0f;
                for (int p = 0; p < P; p++) inter += ai[p] * S[(long long)p * R + r];
                acc += scale * ph[rr + 1] * inter;
            }
            y[row * R + r] = accumulate ? y[row * R + r] + acc : acc;
        }
        __syncthreads();
    }
}

__global__ void rc_step_kernel(float *S, const float *q, const float *k, const float *v, float *out, long long BH,
                               int H, int D, int M, double gamma, float scale) {
    for (long long bh = blockIdx.x; bh < BH; bh += gridDim.x) {
        const int h = (int)(bh % H);
        const float g = (float)(isnan(gamma) ? 1.0 - ldexp(1.0, -5 - h) : gamma);
        float *Sb = S + bh * D * M;
        const float *qs = q + bh * D, *ks = k + bh * D, *vs = v + bh * M;
        for (int m = threadIdx.x; m < M; m += blockDim.x) {
            float acc = 0.0f;
            for (int c = 0; c < D; c++) {
                float *x = Sb + (long long)c * M + m;
                const float val = g * *x + ks[c] * vs[m];
                *x = val;
                acc += qs[c] * val;
            }
            out[bh * M + m] = scale * acc;
        }
    }
}

/* ---- passes ---- */

typedef struct {
    long long N; /* rows per slice */
    int H, T;
    float scale;
    const float *pw; /* the table */
    float *hs;       /* the chunks' states */
} rc_ctx;

/* The table of the call (front of the workspace). */
static int rc_setup(attn *a, const attn_shape *s, rc_ctx *x) {
    x->N = s->len;
    x->H = s->heads;
    x->T = chunk_of(a);
    x->scale = (float)attn_scale(a, s->qk_dim);
    float *pw = (float *)a->ws;
    x->pw = pw;
    x->hs = (float *)((char *)a->ws + table_bytes(s, x->T));
    const int n = x->H * (x->T + 1);
    AB_LAUNCH(rc_table_kernel, grid_elems(n), THREADS, 0, ab_cuda_stream(), pw, x->H, x->T, a->p.gamma);
    return 0;
}

/* One pass over slices [s0, s0 + ns) of valid length L (operands at their slice 0);
 * y (may be NULL) written or, with accumulate, added to; final_state (or NULL) receives
 * the state after the last position (P x R per slice). */
static int rc_pass(const rc_ctx *x, long long s0, long long ns, int L, const float *A, const float *B, int P,
                   const float *C, int R, float *Y, bool rev, bool diag, bool accumulate, float *final_state) {
    const long long N = x->N, PR = (long long)P * R;
    const int T = x->T, nc = (L + T - 1) / T;
    const float *a = A + s0 * N * P, *b = B + s0 * N * P, *c = C + s0 * N * R;
    float *y = Y ? Y + s0 * N * R : NULL;
    const unsigned chunks = ab_cuda_grid(ns * nc, 1, MAX_BLOCKS);
    if (nc > 1 || final_state) {
        AB_LAUNCH(rc_chunk_state_kernel, chunks, THREADS, 0, ab_cuda_stream(), b, c, ns, N, L, T, nc, P, R, rev, x->H,
                  x->pw, x->hs);
        AB_LAUNCH(rc_scan_kernel, grid_elems(ns * PR), THREADS, 0, ab_cuda_stream(), x->hs, ns, nc, PR, L, T, x->H,
                  x->pw, final_state);
    }
    if (y)
        AB_LAUNCH(rc_out_kernel, chunks, THREADS, (size_t)T * T * sizeof(float), ab_cuda_stream(), a, b, c, y, ns, N,
                  L, T, nc, P, R, rev, diag, accumulate, x->H, x->pw, x->scale, x->hs);
    return 0;
}

/* The pass in direction `dir`: causal (forward order), anti-causal (reversed), or both
 * (a causal pass, then the reversed one without the diagonal added). */
enum { RC_CAUSAL, RC_ANTI, RC_BOTH };

static int rc_dir(const rc_ctx *x, long long s0, long long ns, int L, int dir, const float *A, const float *B, int P,
                  const float *C, int R, float *Y) {
    AB_TRY(rc_pass(x, s0, ns, L, A, B, P, C, R, Y, dir == RC_ANTI, true, false, NULL));
    if (dir == RC_BOTH) AB_TRY(rc_pass(x, s0, ns, L, A, B, P, C, R, Y, true, false, true, NULL));
    return 0;
}

/* ---- entry points ---- */

extern "C" int ret_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                float *out, void *saved) {
    (void)saved;
    rc_ctx x;
    AB_TRY(rc_setup(a, s, &x));
    const int D = s->qk_dim, M = s->v_dim, dir = s->causal ? RC_CAUSAL : RC_BOTH;
    return attn_cuda_runs(s, {{out, M, false}}, [&](long long s0, long long ns, int L) -> int {
        return rc_dir(&x, s0, ns, L, dir, q, k, D, v, M, out);
    });
}

extern "C" int ret_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                 const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    (void)saved;
    rc_ctx x;
    AB_TRY(rc_setup(a, s, &x));
    const int D = s->qk_dim, M = s->v_dim;
    const int fwd = s->causal ? RC_CAUSAL : RC_BOTH, rev = s->causal ? RC_ANTI : RC_BOTH;
    return attn_cuda_runs(s, {{dq, D, false}, {dk, D, false}, {dv, M, false}},
                          [&](long long s0, long long ns, int L) -> int {
                              AB_TRY(rc_dir(&x, s0, ns, L, fwd, dout, v, M, k, D, dq));
                              AB_TRY(rc_dir(&x, s0, ns, L, rev, v, dout, M, q, D, dk));
                              return rc_dir(&x, s0, ns, L, rev, k, q, D, dout, M, dv);
                          });
}

extern "C" int ret_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    (void)a, (void)capacity;
    const size_t bytes = (size_t)s->batch * s->heads * (size_t)s->qk_dim * s->v_dim * sizeof(float);
    AB_CUDA_CHECK(cudaMemsetAsync(state, 0, bytes, ab_cuda_stream()));
    return 0;
}

extern "C" int ret_cuda_prefill(attn *a, const attn_shape *s, int capacity, int P, const float *q, const float *k,
                                const float *v, float *out, void *state) {
    (void)capacity;
    attn_shape ps = *s;
    ps.len = P;
    rc_ctx x;
    AB_TRY(rc_setup(a, &ps, &x));
    const long long BH = (long long)s->batch * s->heads;
    return rc_pass(&x, 0, BH, P, q, k, s->qk_dim, v, s->v_dim, out, false, true, false, (float *)state);
}

extern "C" int ret_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q,
                             const float *k, const float *v, float *out) {
    (void)capacity, (void)t;
    const long long BH = (long long)s->batch * s->heads;
    AB_LAUNCH(rc_step_kernel, ab_cuda_grid(BH, 1, MAX_BLOCKS), ab_cuda_threads(s->v_dim, THREADS), 0,
              ab_cuda_stream(), (float *)state, q, k, v, out, BH, s->heads, s->qk_dim, s->v_dim, a->p.gamma,
              (float)attn_scale(a, s->qk_dim));
    return 0;
}
