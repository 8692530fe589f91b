/* softmax attention on CUDA (parallel mode of `softmax` and `stateful-softmax`), with
 * the contract and the saved probabilities of the CPU version (softmax.c):
 *   forward:  S = scale Q K^T (cuBLAS, batched over slices), P = masked row softmax
 *             of S in place (a kernel; masks from indices), out = P V (cuBLAS).
 *             P is what forward saves: B*H*N*N floats, slice bh at saved + bh*N*N.
 *   backward: dV = P^T dO, dP = dO V^T, dS = P .* (dP - rowsum(dP .* P)),
 *             dQ = scale dS K, dK = scale dS^T Q.
 *
 * Lengths: batch entries are taken in runs of equal valid length L (attn_run); every
 * product of a run is restricted to rows and keys [0, L), so padded positions are never
 * read; padded output rows and gradient rows are set to zero. Within a run the slices
 * of the run are one batched cuBLAS call per product.
 *
 * Causal: queries go in row blocks [r0, r1) (smx_cuda_causal_block_rows) that multiply
 * keys [0, r1) only, skipping most of the upper triangle. Saved P: rows [0, L) of a
 * slice are written at columns [0, L) (zeros past the row's last visible key); rows and
 * columns >= L are not written (nobody reads them).
 *
 * Backward needs dP / dS for a block of rows: a scratch of at most
 * smx_cuda_scratch_floats (default 128 MiB) in the workspace. A run is processed in
 * chunks of slices and, when one slice's L x L block does not fit, in row blocks too;
 * dK and dV accumulate over the row blocks (beta = 1 after zeroing). */
#include "softmax_cuda.h"

#include "cuda_util.cuh"

#include <math.h>

size_t smx_cuda_scratch_floats = (size_t)32 << 20;

#define MAX_THREADS 256
#define MAX_ROW_BLOCKS (1LL << 20) /* grid cap for the row kernels (they loop over the rest) */

/* ---- kernels ---- */

/* In place: each row of scores -> probabilities. Row `row` of the launch is query
 * i = r0 + row % rows of slice row / rows, at p + slice * p_stride + (row % rows) * p_ld.
 * Keys [0, n) are visible (n = min(i + 1, L) when causal, else L); columns [n, p_end)
 * are set to zero. One block per row (grid-stride over rows). */
__global__ void softmax_rows_kernel(float *p, long long p_ld, long long p_stride, long long n_rows, int rows, int r0,
                                    int L, int causal, int p_end) {
    for (long long row = blockIdx.x; row < n_rows; row += gridDim.x) {
        const long long sl = row / rows;
        const int li = (int)(row % rows), i = r0 + li;
        float *x = p + sl * p_stride + (long long)li * p_ld;
        const int n = causal ? (i + 1 < L ? i + 1 : L) : L;
        /* per thread: running max m and sum z of exp(x - m) (online softmax) */
        float m = -INFINITY, z = 0.0f;
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            float s = x[j];
            if (s > m) {
                z = z * expf(m - s) + 1.0f;
                m = s;
            } else {
                z += expf(s - m);
            }
        }
        const float mx = attn_block_max(m);
        const float zt = attn_block_sum(m == -INFINITY ? 0.0f : z * expf(m - mx));
        const float inv = 1.0f / zt; /* zt >= 1: the maximum's own term is exp(0) */
        for (int j = threadIdx.x; j < n; j += blockDim.x) x[j] = expf(x[j] - mx) * inv;
        for (int j = n + threadIdx.x; j < p_end; j += blockDim.x) x[j] = 0.0f;
    }
}

/* In place: dP -> dS = P .* (dP - rowsum(dP .* P)) for the rows of a block, laid out
 * as in softmax_rows_kernel (dS rows at ds + slice * ds_stride + li * ds_ld, P rows at
 * p + slice * p_stride + li * p_ld); columns [n, kc) of dS are set to zero. */
__global__ void dsoftmax_rows_kernel(float *ds, long long ds_ld, long long ds_stride, const float *p, long long p_ld,
                                     long long p_stride, long long n_rows, int rows, int r0, int L, int causal,
                                     int kc) {
    for (long long row = blockIdx.x; row < n_rows; row += gridDim.x) {
        const long long sl = row / rows;
        const int li = (int)(row % rows), i = r0 + li;
        float *d = ds + sl * ds_stride + (long long)li * ds_ld;
        const float *pr = p + sl * p_stride + (long long)li * p_ld;
        const int n = causal ? (i + 1 < L ? i + 1 : L) : L;
        float dot = 0.0f;
        for (int j = threadIdx.x; j < n; j += blockDim.x) dot += d[j] * pr[j];
        dot = attn_block_sum(dot);
        for (int j = threadIdx.x; j < n; j += blockDim.x) d[j] = pr[j] * (d[j] - dot);
        for (int j = n + threadIdx.x; j < kc; j += blockDim.x) d[j] = 0.0f;
    }
}

/* ---- blocks of rows ---- */

int smx_cuda_causal_block_rows(int L) {
    int nb = (L + 255) / 256;
    if (nb > 8) nb = 8;
    if (nb < 1) nb = 1;
    return (L + nb - 1) / nb;
}

int smx_cuda_attend_rows(const smx_cuda_problem *pr, long long s_off, long long n, int r0, int r1, float *pb,
                         long long p_ld, long long p_stride, int p_end) {
    const int rows = r1 - r0, kc = pr->causal ? r1 : pr->L, D = pr->D, M = pr->M;
    if (rows <= 0 || n <= 0) return 0;
    /* S = scale Q[r0:r1] K[0:kc]^T  (rows, kc) per slice */
    AB_TRY(ab_cuda_sgemm_batched(false, true, rows, kc, D, pr->scale, pr->q + s_off * pr->sq + (long long)r0 * D, D,
                                 pr->sq, pr->k + s_off * pr->sk, D, pr->sk, 0.0f, pb, (int)p_ld, p_stride, n));
    const long long n_rows = n * rows;
    AB_LAUNCH(softmax_rows_kernel, ab_cuda_grid(n_rows, 1, MAX_ROW_BLOCKS), ab_cuda_threads(kc, MAX_THREADS), 0,
              ab_cuda_stream(), pb, p_ld, p_stride, n_rows, rows, r0, pr->L, (int)pr->causal, p_end);
    /* out[r0:r1] = P V[0:kc]  (rows, M) per slice */
    AB_TRY(ab_cuda_sgemm_batched(false, false, rows, M, kc, 1.0f, pb, (int)p_ld, p_stride, pr->v + s_off * pr->sv, M,
                                 pr->sv, 0.0f, pr->out + s_off * pr->so + (long long)r0 * M, M, pr->so, n));
    return 0;
}

/* ---- workspace ---- */

/* Floats of dP/dS scratch for this shape: all slices' N x N when that is within the
 * budget, else the budget, but always at least one row (N floats). */
static size_t scratch_floats(const attn_shape *s) {
    size_t all = (size_t)s->batch * (size_t)s->heads * (size_t)s->len * (size_t)s->len;
    size_t budget = smx_cuda_scratch_floats > (size_t)s->len ? smx_cuda_scratch_floats : (size_t)s->len;
    return all < budget ? all : budget;
}

extern "C" size_t smx_cuda_workspace_bytes(const attn *a, const attn_shape *s) {
    (void)a;
    return scratch_floats(s) * sizeof(float);
}

/* Rows per block and slices per chunk for a run of ns slices of length L, so that
 * chunk * rows * L floats of scratch fit in w (w >= L). */
static void plan_chunks(int L, long long ns, bool causal, size_t w, int *rb, long long *cs) {
    int r = causal ? smx_cuda_causal_block_rows(L) : L;
    if ((size_t)r * (size_t)L > w) r = (int)(w / (size_t)L);
    if (r < 1) r = 1;
    long long c = (long long)(w / ((size_t)r * (size_t)L));
    *rb = r;
    *cs = c < 1 ? 1 : c > ns ? ns : c;
}

/* ---- forward and backward ---- */

extern "C" int smx_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                float *out, void *saved) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const long long ND = (long long)N * D, NM = (long long)N * M, NN = (long long)N * N;
    float *P = (float *)saved;
    /* padded rows of out: zero (all of them for L = 0) */
    return attn_cuda_runs(s, {{out, M, false}}, [&](long long s0, long long ns, int L) {
        smx_cuda_problem pr = {q + s0 * ND, k + s0 * ND, v + s0 * NM, out + s0 * NM, ND, ND, NM, NM,
                               D, M, (float)attn_scale(a, D), s->causal, L};
        const int rb = s->causal ? smx_cuda_causal_block_rows(L) : L;
        for (int r0 = 0; r0 < L; r0 += rb) {
            const int r1 = r0 + rb < L ? r0 + rb : L;
            AB_TRY(smx_cuda_attend_rows(&pr, 0, ns, r0, r1, P + s0 * NN + (long long)r0 * N, N, NN, L));
        }
        return 0;
    });
}

extern "C" int smx_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                 const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const long long ND = (long long)N * D, NM = (long long)N * M, NN = (long long)N * N;
    const float scale = (float)attn_scale(a, D);
    const bool causal = s->causal;
    const float *P = (const float *)saved;
    float *ds = (float *)a->ws;
    size_t w = a->ws_bytes / sizeof(float);
    const size_t budget = smx_cuda_scratch_floats > (size_t)N ? smx_cuda_scratch_floats : (size_t)N;
    if (w > budget) w = budget;
    if (w < (size_t)N) return ab_fail(AB_EINVAL, "softmax backward: workspace of %zu floats is below one row", w);
    /* dK, dV accumulate (from zero); dQ rows >= L are zero */
    return attn_cuda_runs(s, {{dk, D, true}, {dv, M, true}, {dq, D, false}}, [&](long long s0, long long ns, int L) {
        int rb;
        long long cs;
        plan_chunks(L, ns, causal, w, &rb, &cs);
        for (long long c0 = 0; c0 < ns; c0 += cs) {
            const long long cn = ns - c0 < cs ? ns - c0 : cs, sb = s0 + c0;
            const float *qs = q + sb * ND, *ks = k + sb * ND, *vs = v + sb * NM, *dos = dout + sb * NM;
            const float *Ps = P + sb * NN;
            float *dqs = dq + sb * ND, *dks = dk + sb * ND, *dvs = dv + sb * NM;
            for (int r0 = 0; r0 < L; r0 += rb) {
                const int r1 = r0 + rb < L ? r0 + rb : L, rows = r1 - r0, kc = causal ? r1 : L;
                const long long dstr = (long long)rows * kc; /* dS: (rows, kc) per slice */
                const float *pb = Ps + (long long)r0 * N;
                /* dV[0:kc] += P[r0:r1, 0:kc]^T dO[r0:r1]  (kc, M) */
                AB_TRY(ab_cuda_sgemm_batched(true, false, kc, M, rows, 1.0f, pb, N, NN, dos + (long long)r0 * M, M, NM,
                                             1.0f, dvs, M, NM, cn));
                /* dP = dO[r0:r1] V[0:kc]^T  (rows, kc) */
                AB_TRY(ab_cuda_sgemm_batched(false, true, rows, kc, M, 1.0f, dos + (long long)r0 * M, M, NM, vs, M, NM,
                                             0.0f, ds, kc, dstr, cn));
                const long long n_rows = cn * rows;
                AB_LAUNCH(dsoftmax_rows_kernel, ab_cuda_grid(n_rows, 1, MAX_ROW_BLOCKS),
                          ab_cuda_threads(kc, MAX_THREADS), 0, ab_cuda_stream(), ds, (long long)kc, dstr, pb,
                          (long long)N, NN, n_rows, rows, r0, L, (int)causal, kc);
                /* dQ[r0:r1] = scale dS K[0:kc]  (rows, D) */
                AB_TRY(ab_cuda_sgemm_batched(false, false, rows, D, kc, scale, ds, kc, dstr, ks, D, ND, 0.0f,
                                             dqs + (long long)r0 * D, D, ND, cn));
                /* dK[0:kc] += scale dS^T Q[r0:r1]  (kc, D) */
                AB_TRY(ab_cuda_sgemm_batched(true, false, kc, D, rows, scale, ds, kc, dstr, qs + (long long)r0 * D, D,
                                             ND, 1.0f, dks, D, ND, cn));
            }
        }
        return 0;
    });
}
