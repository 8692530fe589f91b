/* gla (gated linear attention) on CUDA, with the definitions and options of the CPU
 * version (gla.c): per slice, b_i = sum_{t<=i} g_t per key dimension,
 *   causal      o_i = s sum_{j<=i} sum_d q_id k_jd e^(b_id - b_jd) v_j,
 *   non-causal  weights e^(-|b_id - b_jd|) over every valid j.
 * Every product is one pass of a recurrence over the sequence, in one of two directions:
 * a state X (D x M per slice) holding X_t = sum over keys j on one side of t (j <= t
 * forward, j >= t backward; strictly, without j = t, for the other direction of the
 * non-causal form) of e^-(the gates between them) a_j b_j^T, read at every t against a
 * vector c_t. Each step decays X by e^g (a factor <= 1: nothing under- or overflows
 * that was not already below float range), so strong gates need no care. The state is
 * in the workspace; one thread owns a column m of it (gla_cols: reads sum_d c_td X[d][m])
 * or a row d (gla_rows: reads sum_m X[d][m] c_tm), so no reduction crosses threads.
 *   forward    out  = cols(a=k, b=v, c=q, forward)        [+ cols(k, v, q, backward, strict)]
 *   backward   dq   = rows(k, v, c=dout, forward)         [+ rows(k, v, dout, backward, strict)]
 *              dk   = rows(q, dout, c=v, backward)        [+ rows(q, dout, v, forward, strict)]
 *              dv   = cols(q, dout, c=k, backward)        [+ cols(q, dout, k, forward, strict)]
 *              dg_t = sum_{t'>=t} (q dq - k dk)_t' per key dimension (over d for a scalar
 *              gate; the strict direction's parts enter with the opposite sign), in double,
 *              one block per (slice, gate column); dg_0 = 0.
 * Each pass runs in one of two forms, chosen by the option chunk as on the CPU:
 * - chunk >= 2 (auto 32): the chunked form ("chunked passes" below), parallel over
 *   (slice, chunk) but for the carry of X from chunk to chunk, per (slice, 32 columns);
 *   taken when its kernels' shared memory fits 48 KiB (chunks of 32 up to D = M = 64);
 * - chunk = 1, or chunks that do not fit: the recurrence, sequential in N within a slice
 *   (parallel over slices and columns). On an H200 it took 100-250x linear's time with
 *   the state in global memory (experiments/sweep/RESULTS.md); the passes now keep it in
 *   registers where a line fits (gla_*_reg_kernel).
 * Neither is timed on a GPU yet. Recurrent mode: the state is S (D x M per slice) in the
 * CPU's layout; a step is one kernel; prefill is the forward pass with the state as X. */
#include "cuda_util.cuh"

#include "gla_cuda.h"

#define GROUP 32
#define MAX_BLOCKS 65535LL

struct gla_pass {
    const float *a, *b, *gate, *c; /* a, c: [slice][N][D] or c [slice][N][M] (rows) */
    float *o;                      /* [slice][N][M] (cols) or [slice][N][D] (rows), or NULL */
    float *X;                      /* D x M per slice */
    long long N, ns;
    int L, D, M, W, dir, strict, accumulate;
    float scale;
};

/* The decay of step it (t in the pass's order): e^g of the gate between t and the
 * previous position of the pass, for dimension d; 1 at the pass's first step. */
__device__ __forceinline__ float gla_decay(const gla_pass &p, const float *g, int it, int t, int d) {
    if (it == 0) return 1.0f;
    const int gi = p.dir > 0 ? t : t + 1;
    return expf(g[(long long)gi * p.W + (p.W == 1 ? 0 : d)]);
}

/* One thread per (slice, column m): X[d][m] at X + d * M + m. */
__global__ void gla_cols_kernel(gla_pass p) {
    const int groups = (p.M + GROUP - 1) / GROUP;
    for (long long item = blockIdx.x; item < p.ns * groups; item += gridDim.x) {
        const long long sl = item / groups;
        const int m = (int)(item % groups) * GROUP + (int)threadIdx.x;
        if (m >= p.M) continue;
        const float *a = p.a + sl * p.N * p.D, *b = p.b + sl * p.N * p.M, *c = p.c + sl * p.N * p.D;
        const float *g = p.gate + sl * p.N * p.W;
        float *X = p.X + sl * (long long)p.D * p.M, *o = p.o ? p.o + sl * p.N * p.M : NULL;
        for (int d = 0; d < p.D; d++) X[(long long)d * p.M + m] = 0.0f;
        for (int it = 0; it < p.L; it++) {
            const int t = p.dir > 0 ? it : p.L - 1 - it;
            const float bt = b[(long long)t * p.M + m];
            float acc = 0.0f;
            for (int d = 0; d < p.D; d++) {
                float x = X[(long long)d * p.M + m] * gla_decay(p, g, it, t, d);
                const float ab = a[(long long)t * p.D + d] * bt;
                if (!p.strict) x += ab;
                acc += c[(long long)t * p.D + d] * x;
                if (p.strict) x += ab;
                X[(long long)d * p.M + m] = x;
            }
            if (o) o[(long long)t * p.M + m] = (p.accumulate ? o[(long long)t * p.M + m] : 0.0f) + p.scale * acc;
        }
    }
}

/* One thread per (slice, row d): X[d][m] at X + m * D + d. */
__global__ void gla_rows_kernel(gla_pass p) {
    const int groups = (p.D + GROUP - 1) / GROUP;
    for (long long item = blockIdx.x; item < p.ns * groups; item += gridDim.x) {
        const long long sl = item / groups;
        const int d = (int)(item % groups) * GROUP + (int)threadIdx.x;
        if (d >= p.D) continue;
        const float *a = p.a + sl * p.N * p.D, *b = p.b + sl * p.N * p.M, *c = p.c + sl * p.N * p.M;
        const float *g = p.gate + sl * p.N * p.W;
        float *X = p.X + sl * (long long)p.D * p.M, *o = p.o + sl * p.N * p.D;
        for (int m = 0; m < p.M; m++) X[(long long)m * p.D + d] = 0.0f;
        for (int it = 0; it < p.L; it++) {
            const int t = p.dir > 0 ? it : p.L - 1 - it;
            const float e = gla_decay(p, g, it, t, d), at = a[(long long)t * p.D + d];
            float acc = 0.0f;
            for (int m = 0; m < p.M; m++) {
                float x = X[(long long)m * p.D + d] * e;
                const float ab = at * b[(long long)t * p.M + m];
                if (!p.strict) x += ab;
                acc += x * c[(long long)t * p.M + m];
                if (p.strict) x += ab;
                X[(long long)m * p.D + d] = x;
            }
            o[(long long)t * p.D + d] = (p.accumulate ? o[(long long)t * p.D + d] : 0.0f) + p.scale * acc;
        }
    }
}

/* The two kernels above with the state in registers, for D (cols) or M (rows) up to
 * DM: the thread's column (row) of X is x[0..DM), and the pass's rows are staged STAGE
 * steps at a time in shared memory, each read and each decay e^g computed once per block
 * rather than once per thread. The recurrence's dependent chain then runs in registers,
 * where the kernels above load and store X[d][m] in global memory at every step. The
 * read-out sum over the line runs in four partial sums (d mod 4), so that a step's
 * chain of dependent additions is a quarter as long. X is written once at the end
 * (prefill's state). Shared memory: STAGE (3 D) floats (cols), STAGE (2 D + 2 M) (rows). */
#define STAGE 32

/* The position of a pass's step it (in the pass's order). */
__device__ __forceinline__ int gla_time(const gla_pass &p, int it) { return p.dir > 0 ? it : p.L - 1 - it; }

/* Stages steps [i0, i0 + n) of the pass: dst[s][r] = src's row of step i0 + s (R wide). */
__device__ __forceinline__ void gla_stage_rows(const gla_pass &p, const float *src, int R, int i0, int n, float *dst) {
    for (int e = threadIdx.x; e < n * R; e += blockDim.x)
        dst[e] = src[(long long)gla_time(p, i0 + e / R) * R + e % R];
}

/* The decays of steps [i0, i0 + n) for the D key dimensions: se[s][d]. */
__device__ __forceinline__ void gla_stage_decays(const gla_pass &p, const float *g, int i0, int n, float *se) {
    for (int e = threadIdx.x; e < n * p.D; e += blockDim.x) {
        const int it = i0 + e / p.D;
        se[e] = gla_decay(p, g, it, gla_time(p, it), e % p.D);
    }
}

template <int DM> __global__ void gla_cols_reg_kernel(gla_pass p) {
    AB_DYN_SMEM(float, smem);
    const int D = p.D, M = p.M, groups = (M + GROUP - 1) / GROUP;
    float *sa = smem, *se = sa + STAGE * D, *sc = se + STAGE * D;
    for (long long item = blockIdx.x; item < p.ns * groups; item += gridDim.x) {
        const long long sl = item / groups;
        const int m = (int)(item % groups) * GROUP + (int)threadIdx.x;
        const bool on = m < M;
        const float *a = p.a + sl * p.N * D, *b = p.b + sl * p.N * M, *c = p.c + sl * p.N * D;
        const float *g = p.gate + sl * p.N * p.W;
        float *X = p.X + sl * (long long)D * M, *o = p.o ? p.o + sl * p.N * M : NULL;
        float x[DM];
AB_UNROLL /* x[] indexed by constants: it stays in registers */
        for (int d = 0; d < DM; d++) x[d] = 0.0f;
        for (int i0 = 0; i0 < p.L; i0 += STAGE) {
            const int n = p.L - i0 < STAGE ? p.L - i0 : STAGE;
            __syncthreads(); /* every thread is done with the previous stage */
            gla_stage_rows(p, a, D, i0, n, sa);
            gla_stage_rows(p, c, D, i0, n, sc);
            gla_stage_decays(p, g, i0, n, se);
            __syncthreads();
            for (int s = 0; s < n; s++) {
                const int t = gla_time(p, i0 + s);
                const float bt = on ? b[(long long)t * M + m] : 0.0f;
                const float *ra = sa + s * D, *rc = sc + s * D, *re = se + s * D;
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
AB_UNROLL
                for (int d = 0; d < DM; d++)
                    if (d < D) {
                        float xd = x[d] * re[d];
                        const float ab = ra[d] * bt;
                        if (!p.strict) xd += ab;
                        acc[d & 3] += rc[d] * xd;
                        if (p.strict) xd += ab;
                        x[d] = xd;
                    }
                const float sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
                if (on && o) o[(long long)t * M + m] = (p.accumulate ? o[(long long)t * M + m] : 0.0f) + p.scale * sum;
            }
        }
        if (on)
AB_UNROLL
            for (int d = 0; d < DM; d++)
                if (d < D) X[(long long)d * M + m] = x[d];
    }
}

template <int DM> __global__ void gla_rows_reg_kernel(gla_pass p) {
    AB_DYN_SMEM(float, smem);
    const int D = p.D, M = p.M, groups = (D + GROUP - 1) / GROUP;
    float *sa = smem, *se = sa + STAGE * D, *sc = se + STAGE * D, *sb = sc + STAGE * M;
    for (long long item = blockIdx.x; item < p.ns * groups; item += gridDim.x) {
        const long long sl = item / groups;
        const int d = (int)(item % groups) * GROUP + (int)threadIdx.x;
        const bool on = d < D;
        const float *a = p.a + sl * p.N * D, *b = p.b + sl * p.N * M, *c = p.c + sl * p.N * M;
        const float *g = p.gate + sl * p.N * p.W;
        float *X = p.X + sl * (long long)D * M, *o = p.o + sl * p.N * D;
        float x[DM];
AB_UNROLL
        for (int m = 0; m < DM; m++) x[m] = 0.0f;
        for (int i0 = 0; i0 < p.L; i0 += STAGE) {
            const int n = p.L - i0 < STAGE ? p.L - i0 : STAGE;
            __syncthreads();
            gla_stage_rows(p, a, D, i0, n, sa);
            gla_stage_rows(p, b, M, i0, n, sb);
            gla_stage_rows(p, c, M, i0, n, sc);
            gla_stage_decays(p, g, i0, n, se);
            __syncthreads();
            for (int s = 0; s < n; s++) {
                const int t = gla_time(p, i0 + s);
                const float e = on ? se[s * D + d] : 1.0f, at = on ? sa[s * D + d] : 0.0f;
                const float *rb = sb + s * M, *rc = sc + s * M;
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
AB_UNROLL
                for (int m = 0; m < DM; m++)
                    if (m < M) {
                        float xm = x[m] * e;
                        const float ab = at * rb[m];
                        if (!p.strict) xm += ab;
                        acc[m & 3] += xm * rc[m];
                        if (p.strict) xm += ab;
                        x[m] = xm;
                    }
                const float sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
                if (on) o[(long long)t * D + d] = (p.accumulate ? o[(long long)t * D + d] : 0.0f) + p.scale * sum;
            }
        }
        if (on)
AB_UNROLL
            for (int m = 0; m < DM; m++)
                if (m < M) X[(long long)m * D + d] = x[m];
    }
}

/* dg (W columns per position) of ns slices of valid length L from q, k, dq, dk and, for
 * the non-causal form, the strict direction's parts dqa, dka (else NULL):
 * dg_t = sum_{t' >= t} term(t'), term(t) = sum over the column's d of q dq - k dk, in
 * double. One block per (slice, gate column): positions 1..L-1 cut into DG_THREADS
 * contiguous ranges, one a thread; each thread sums its range, the block adds up the
 * ranges after each, and each thread writes its range's suffix sums from the end. (One
 * thread walking every position, the CPU's order, made a scalar gate's dg one thread
 * per slice adding L D terms in sequence.) dg_0 = 0: only differences of b enter. */
#define DG_THREADS 128

__device__ __forceinline__ double gla_dg_term(const float *q, const float *k, const float *dq, const float *dk,
                                              const float *dqa, const float *dka, long long r, int d0, int d1) {
    double a = 0.0;
    for (int d = d0; d < d1; d++) {
        a += (double)q[r + d] * dq[r + d] - (double)k[r + d] * dk[r + d];
        if (dqa) a -= (double)q[r + d] * dqa[r + d] - (double)k[r + d] * dka[r + d];
    }
    return a;
}

__global__ void gla_dgate_kernel(const float *q, const float *k, const float *dq, const float *dk, const float *dqa,
                                 const float *dka, float *dg, long long ns, long long N, int L, int D, int W) {
    __shared__ double tot[DG_THREADS];
    const int T = (int)blockDim.x, tid = (int)threadIdx.x;
    const int per = L > 1 ? (L - 1 + T - 1) / T : 0;
    const int t0 = 1 + tid * per, t1 = t0 + per < L ? t0 + per : L; /* [t0, t1), maybe empty */
    for (long long item = blockIdx.x; item < ns * W; item += gridDim.x) {
        const long long sl = item / W, off = sl * N * D;
        const int x = (int)(item % W), d0 = W == 1 ? 0 : x, d1 = W == 1 ? D : x + 1;
        double local = 0.0;
        for (int t = t0; t < t1; t++) local += gla_dg_term(q, k, dq, dk, dqa, dka, off + (long long)t * D, d0, d1);
        tot[tid] = local;
        __syncthreads();
        double acc = 0.0;
        for (int j = T - 1; j > tid; j--) acc += tot[j];
        for (int t = t1 - 1; t >= t0; t--) {
            acc += gla_dg_term(q, k, dq, dk, dqa, dka, off + (long long)t * D, d0, d1);
            dg[sl * N * W + (long long)t * W + x] = (float)acc;
        }
        if (tid == 0) dg[sl * N * W + x] = 0.0f;
        __syncthreads(); /* tot is the next item's */
    }
}

/* dst += src over rows [0, L) of ns slices of N rows of X floats. */
__global__ void gla_add_rows_kernel(float *dst, const float *src, long long ns, long long N, int L, int X) {
    const long long per = (long long)L * X;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < ns * per;
         i += (long long)gridDim.x * blockDim.x) {
        const long long e = (i / per) * N * X + i % per;
        dst[e] += src[e];
    }
}

/* One step for every slice: S = diag(e^g) S + k v^T, out = scale S^T q; thread per m. */
__global__ void gla_step_kernel(float *S, const float *q, const float *k, const float *v, const float *g, float *out,
                                long long ns, int D, int M, int W, float scale) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < ns * M;
         i += (long long)gridDim.x * blockDim.x) {
        const long long sl = i / M;
        const int m = (int)(i % M);
        float *Ss = S + sl * D * M;
        const float vm = v[sl * M + m];
        float acc = 0.0f;
        for (int d = 0; d < D; d++) {
            const float x = Ss[(long long)d * M + m] * expf(g[sl * W + (W == 1 ? 0 : d)]) + k[sl * D + d] * vm;
            Ss[(long long)d * M + m] = x;
            acc += q[sl * D + d] * x;
        }
        out[sl * M + m] = scale * acc;
    }
}

static long long blocks_of(long long items) { return items < 1 ? 1 : items < MAX_BLOCKS ? items : MAX_BLOCKS; }

/* The register kernels where the thread's line of X fits (D for cols, M for rows, up
 * to 64), the global-state kernels past that. */
static int run_pass_recurrent(gla_pass p, bool cols) {
    const long long groups = ((cols ? p.M : p.D) + GROUP - 1) / GROUP, grid = blocks_of(p.ns * groups);
    const int line = cols ? p.D : p.M;
    const size_t sm = (size_t)STAGE * (cols ? 3 * p.D : 2 * p.D + 2 * p.M) * sizeof(float);
    cudaStream_t st = ab_cuda_stream();
    if (cols) {
        if (line <= 32) AB_LAUNCH(gla_cols_reg_kernel<32>, grid, GROUP, sm, st, p);
        else if (line <= 64) AB_LAUNCH(gla_cols_reg_kernel<64>, grid, GROUP, sm, st, p);
        else AB_LAUNCH(gla_cols_kernel, grid, GROUP, 0, st, p);
    } else {
        if (line <= 32) AB_LAUNCH(gla_rows_reg_kernel<32>, grid, GROUP, sm, st, p);
        else if (line <= 64) AB_LAUNCH(gla_rows_reg_kernel<64>, grid, GROUP, sm, st, p);
        else AB_LAUNCH(gla_rows_kernel, grid, GROUP, 0, st, p);
    }
    return 0;
}

/* ---- chunked passes ----
 *
 * A pass in chunks of T steps (the option chunk, in the pass's order), with Gam_i the
 * sum of the log-decays of the chunk's steps up to i (the first included: it decays the
 * state carried in) and X_c the state before the chunk:
 *   cols  o_i[m] = s [sum_d c_id e^Gam_id X_c[d][m] + sum_{j<=i} A_ij b_jm],
 *         A_ij = sum_d c_id a_jd e^(Gam_id - Gam_jd)
 *   rows  o_i[d] = s [e^Gam_id sum_m X_c[d][m] c_im + sum_{j<=i} (b_j . c_i) a_jd e^(Gam_id - Gam_jd)]
 *   X_(c+1) = diag(e^Gam_E) X_c + sum_j (a_j e^(Gam_E - Gam_j)) b_j^T
 * (j < i for a strict pass). Every exponent is a sum of log-gates <= 0 over steps
 * between j and i: each term is exact and nothing overflows, however strong the gates.
 * Three kernels: intra (per slice and chunk: the in-chunk sums into o, and a_j
 * e^(Gam_E - Gam_j) and e^Gam_E to the workspace), carry (per slice and 32 columns m
 * of X, chunks in order, X's rows split over up to 8 warps: the chunks' starting
 * states to the workspace, the final state into X), inter (per slice and chunk: the
 * carried state's term added to o). Taken for chunk >= 2 when the three kernels'
 * shared memory fits CH_SMEM_MAX; chunk = 1 runs the recurrent kernels above.
 * Workspace per slice: nb D M + N D + nb D floats (nb chunks), after the recurrent
 * passes' part, slices in groups under gla_cuda_ws_cap (1 GiB). */
#define CH_THREADS 128
#define CH_ROWS 16
#define CH_WARPS 8
#define CH_SMEM_MAX (48 * 1024)

size_t gla_cuda_ws_cap = GLA_CUDA_WS_CAP_DEFAULT;

static size_t ch_intra_smem(int T, int D, int M) { /* gam in double, a, c, b, A */
    return (size_t)T * D * sizeof(double) +
           ((size_t)T * ((size_t)D + (size_t)(D > M ? D : M) + (size_t)M) + (size_t)T * T) * sizeof(float);
}
/* The carry's: its 32 columns of X (D x GROUP), a tile of a's rows (CH_ROWS x D) and of
 * b's (CH_ROWS x GROUP). */
static size_t ch_carry_smem(int D) {
    return ((size_t)D * GROUP + (size_t)CH_ROWS * D + (size_t)CH_ROWS * GROUP) * sizeof(float);
}
int gla_cuda_carry_warps = 0;

/* The carry's warps: the rows of X split over them (rows d = w, w + R, ... for warp w of
 * R; they are independent), about 8 rows a warp (D = 64: 8 warps), at most CH_WARPS;
 * gla_cuda_carry_warps when set. */
static int ch_carry_warps(int D) {
    const int R = gla_cuda_carry_warps > 0 ? gla_cuda_carry_warps : (D + 7) / 8;
    return R > CH_WARPS ? CH_WARPS : R;
}
static size_t ch_inter_smem(int T, int D, int M) { /* gam, c's rows, the carried state */
    return ((size_t)T * D + (size_t)T * (D > M ? D : M) + (size_t)D * M) * sizeof(float);
}

static bool ch_usable(int T, int D, int M) {
    return T >= 2 && ch_intra_smem(T, D, M) <= CH_SMEM_MAX && ch_carry_smem(D) <= CH_SMEM_MAX &&
           ch_inter_smem(T, D, M) <= CH_SMEM_MAX;
}

__host__ __device__ static inline int ch_chunks(int L, int T) { return (L + T - 1) / T; }

static size_t ch_slice_floats(int N, int T, int D, int M) {
    const size_t nb = (size_t)ch_chunks(N, T);
    return nb * D * M + (size_t)N * D + nb * D;
}

/* Gam (n x D, shared) of the chunk of steps [i0, i0 + n): the log-decays' running sums,
 * in double (R = double) where differences Gam_i - Gam_j of strong gates (hundreds)
 * must keep the few units between near rows. Ends with a barrier. */
template <typename R> __device__ void ch_gammas(const gla_pass &p, const float *g, int i0, int n, R *gam) {
    for (int d = threadIdx.x; d < p.D; d += blockDim.x) {
        double acc = 0.0;
        for (int i = 0; i < n; i++) {
            const int it = i0 + i;
            if (it > 0) {
                const int t = gla_time(p, it), gi = p.dir > 0 ? t : t + 1;
                acc += g[(long long)gi * p.W + (p.W == 1 ? 0 : d)];
            }
            gam[i * p.D + d] = (R)acc;
        }
    }
    __syncthreads();
}

/* Rows of the chunk's steps [i0, i0 + n) of src (R wide) into dst (n x R). */
__device__ void ch_stage(const gla_pass &p, const float *src, int R, int i0, int n, float *dst) {
    for (int e = threadIdx.x; e < n * R; e += blockDim.x) dst[e] = src[(long long)gla_time(p, i0 + e / R) * R + e % R];
}

__global__ void gla_ch_intra_kernel(gla_pass p, int T, int cols, float *At, float *E) {
    AB_DYN_SMEM(float, sm);
    const int D = p.D, M = p.M, Cw = cols ? D : M, Ow = cols ? M : D, nc = ch_chunks(p.L, T);
    const int nb = ch_chunks((int)p.N, T);
    double *gam = (double *)sm; /* the dynamic shared memory starts aligned for a double */
    float *sa = (float *)(gam + T * D), *sc = sa + T * D, *sb = sc + T * (D > M ? D : M), *A = sb + T * M;
    for (long long item = blockIdx.x; item < p.ns * nc; item += gridDim.x) {
        const long long sl = item / nc;
        const int c = (int)(item % nc), i0 = c * T, n = p.L - i0 < T ? p.L - i0 : T;
        const float *a = p.a + sl * p.N * D, *b = p.b + sl * p.N * M, *cc = p.c + sl * p.N * Cw;
        const float *g = p.gate + sl * p.N * p.W;
        float *o = p.o ? p.o + sl * p.N * Ow : NULL;
        ch_gammas(p, g, i0, n, gam);
        ch_stage(p, a, D, i0, n, sa);
        ch_stage(p, b, M, i0, n, sb);
        ch_stage(p, cc, Cw, i0, n, sc);
        __syncthreads();
        for (int e = threadIdx.x; e < n * n; e += blockDim.x) {
            const int i = e / n, j = e % n;
            float x = 0.0f;
            if (j < i || (j == i && !p.strict)) {
                if (cols)
                    for (int d = 0; d < D; d++)
                        x += sc[i * D + d] * sa[j * D + d] * expf((float)(gam[i * D + d] - gam[j * D + d]));
                else
                    for (int m = 0; m < M; m++) x += sc[i * M + m] * sb[j * M + m];
            }
            A[e] = x;
        }
        __syncthreads();
        if (o)
            for (int e = threadIdx.x; e < n * Ow; e += blockDim.x) {
                const int i = e / Ow, r = e % Ow;
                float x = 0.0f;
                if (cols)
                    for (int j = 0; j <= i; j++) x += A[i * n + j] * sb[j * M + r];
                else
                    for (int j = 0; j <= i; j++)
                        x += A[i * n + j] * sa[j * D + r] * expf((float)(gam[i * D + r] - gam[j * D + r]));
                float *dst = o + (long long)gla_time(p, i0 + i) * Ow + r;
                *dst = (p.accumulate ? *dst : 0.0f) + p.scale * x;
            }
        float *Ac = At + (sl * p.N + i0) * D;
        for (int e = threadIdx.x; e < n * D; e += blockDim.x) {
            const int j = e / D, d = e % D;
            Ac[e] = sa[e] * expf((float)(gam[(n - 1) * D + d] - gam[j * D + d]));
        }
        for (int d = threadIdx.x; d < D; d += blockDim.x) E[(sl * nb + c) * D + d] = expf((float)gam[(n - 1) * D + d]);
        __syncthreads();
    }
}

/* Xs: the chunks' starting states [slice][chunk][D][M]; p.X (when final) the last. A
 * block per (slice, 32 columns m); lane l of warp w owns X[d][m0 + l] for d = w, w + R, ...
 * (R warps), so a chunk's update needs no barrier but the tiles' staging. */
__global__ void gla_ch_carry_kernel(gla_pass p, int T, const float *At, const float *E, float *Xs, int final_state) {
    AB_DYN_SMEM(float, sm);
    const int D = p.D, M = p.M, groups = (M + GROUP - 1) / GROUP, nc = ch_chunks(p.L, T), nb = ch_chunks((int)p.N, T);
    const int lane = threadIdx.x % GROUP, w = threadIdx.x / GROUP, R = blockDim.x / GROUP;
    const long long dm = (long long)D * M;
    float *sX = sm, *sx = sX + D * GROUP, *sb = sx + CH_ROWS * D;
    for (long long item = blockIdx.x; item < p.ns * groups; item += gridDim.x) {
        const long long sl = item / groups;
        const int m0 = (int)(item % groups) * GROUP, m = m0 + lane;
        const bool on = m < M;
        const float *b = p.b + sl * p.N * M;
        for (int d = w; d < D; d += R) sX[d * GROUP + lane] = 0.0f;
        for (int c = 0; c < nc; c++) {
            const int i0 = c * T, n = p.L - i0 < T ? p.L - i0 : T;
            const float *Ac = At + (sl * p.N + i0) * D, *Ec = E + (sl * nb + c) * D;
            if (on) {
                float *X0 = Xs + (sl * nb + c) * dm;
                for (int d = w; d < D; d += R) {
                    X0[(long long)d * M + m] = sX[d * GROUP + lane];
                    sX[d * GROUP + lane] *= Ec[d];
                }
            }
            for (int j0 = 0; j0 < n; j0 += CH_ROWS) {
                const int nr = n - j0 < CH_ROWS ? n - j0 : CH_ROWS;
                __syncthreads();
                for (int e = threadIdx.x; e < nr * D; e += blockDim.x) sx[e] = Ac[(long long)j0 * D + e];
                for (int e = threadIdx.x; e < nr * GROUP; e += blockDim.x)
                    sb[e] = m0 + e % GROUP < M ? b[(long long)gla_time(p, i0 + j0 + e / GROUP) * M + m0 + e % GROUP]
                                               : 0.0f;
                __syncthreads();
                for (int d = w; d < D; d += R) {
                    float x = 0.0f;
                    for (int j = 0; j < nr; j++) x += sx[j * D + d] * sb[j * GROUP + lane];
                    sX[d * GROUP + lane] += x;
                }
            }
        }
        if (final_state && on)
            for (int d = w; d < D; d += R) p.X[sl * dm + (long long)d * M + m] = sX[d * GROUP + lane];
        __syncthreads();
    }
}

__global__ void gla_ch_inter_kernel(gla_pass p, int T, int cols, const float *Xs) {
    AB_DYN_SMEM(float, sm);
    const int D = p.D, M = p.M, Cw = cols ? D : M, Ow = cols ? M : D, nc = ch_chunks(p.L, T);
    const int nb = ch_chunks((int)p.N, T);
    const long long dm = (long long)D * M;
    float *gam = sm, *sc = gam + T * D, *X0 = sc + T * (D > M ? D : M);
    for (long long item = blockIdx.x; item < p.ns * nc; item += gridDim.x) {
        const long long sl = item / nc;
        const int c = (int)(item % nc), i0 = c * T, n = p.L - i0 < T ? p.L - i0 : T;
        if (c == 0) continue; /* nothing carried into the first chunk (uniform over the block) */
        const float *g = p.gate + sl * p.N * p.W, *Xc = Xs + (sl * nb + c) * dm;
        float *o = p.o + sl * p.N * Ow;
        ch_gammas(p, g, i0, n, gam);
        ch_stage(p, p.c + sl * p.N * Cw, Cw, i0, n, sc);
        for (long long e = threadIdx.x; e < dm; e += blockDim.x) X0[e] = Xc[e];
        __syncthreads();
        for (int e = threadIdx.x; e < n * Ow; e += blockDim.x) {
            const int i = e / Ow, r = e % Ow;
            float x = 0.0f;
            if (cols)
                for (int d = 0; d < D; d++) x += sc[i * D + d] * expf(gam[i * D + d]) * X0[(long long)d * M + r];
            else {
                for (int m = 0; m < M; m++) x += X0[(long long)r * M + m] * sc[i * M + m];
                x *= expf(gam[i * D + r]);
            }
            o[(long long)gla_time(p, i0 + i) * Ow + r] += p.scale * x;
        }
        __syncthreads();
    }
}

/* Slices per group of a chunked pass. */
static long long ch_group(long long ns, long long N, int T, int D, int M) {
    const size_t per = ch_slice_floats((int)N, T, D, M) * sizeof(float);
    long long g = (long long)(gla_cuda_ws_cap / per);
    if (g < 1) g = 1;
    return g < ns ? g : ns;
}

/* A pass in chunks of T; ws: the chunked part of the workspace. With final, the last
 * state goes to p.X (prefill); else p.X is not touched. */
static int run_pass_chunked(gla_pass p, bool cols, int T, float *ws, bool final) {
    const int D = p.D, M = p.M, Cw = cols ? D : M, Ow = cols ? M : D;
    cudaStream_t st = ab_cuda_stream();
    const long long G = ch_group(p.ns, p.N, T, D, M), nb = ch_chunks((int)p.N, T), nc = ch_chunks(p.L, T);
    for (long long g0 = 0; g0 < p.ns; g0 += G) {
        gla_pass q = p;
        q.ns = p.ns - g0 < G ? p.ns - g0 : G;
        q.a = p.a + g0 * p.N * D;
        q.b = p.b + g0 * p.N * M;
        q.c = p.c + g0 * p.N * Cw;
        q.o = p.o ? p.o + g0 * p.N * Ow : NULL;
        q.gate = p.gate + g0 * p.N * p.W;
        q.X = p.X + g0 * (long long)D * M;
        float *Xs = ws, *At = Xs + q.ns * nb * (long long)D * M, *E = At + q.ns * p.N * D;
        AB_LAUNCH(gla_ch_intra_kernel, blocks_of(q.ns * nc), CH_THREADS, ch_intra_smem(T, D, M), st, q, T, (int)cols,
                  At, E);
        AB_LAUNCH(gla_ch_carry_kernel, blocks_of(q.ns * ((M + GROUP - 1) / GROUP)), GROUP * ch_carry_warps(D),
                  ch_carry_smem(D), st, q, T, (const float *)At, (const float *)E, Xs, (int)final);
        if (q.o)
            AB_LAUNCH(gla_ch_inter_kernel, blocks_of(q.ns * nc), CH_THREADS, ch_inter_smem(T, D, M), st, q, T,
                      (int)cols, (const float *)Xs);
    }
    return 0;
}

static int gla_width(const attn *a, int D) { return a->p.gate == ATTN_GLA_GATE_SCALAR ? 1 : D; }

/* The chunk length of sequences of N positions: the option chunk (auto 32, as the
 * CPU), at most N. */
static int gla_chunk(const attn *a, long long N) {
    const int T = a->p.chunk > 0 ? a->p.chunk : 32;
    return N < T ? (int)(N > 0 ? N : 1) : T;
}

/* Floats of the recurrent passes' workspace (X per slice; the non-causal form's strict
 * dq, dk), where the chunked passes' part starts. */
static size_t recurrent_floats(const attn_shape *s) {
    const size_t bh = (size_t)s->batch * s->heads;
    size_t n = bh * (size_t)s->qk_dim * s->v_dim;
    if (!s->causal) n += 2 * bh * (size_t)s->len * s->qk_dim;
    return n;
}

/* A pass: chunked when the option's chunk is 2 or more and the kernels fit, else the
 * recurrence. final: the last state into p.X (prefill; the recurrent kernels always
 * write it). */
static int run_pass(const attn *a, const attn_shape *s, gla_pass p, bool cols, bool final = false) {
    const int T = gla_chunk(a, s->len);
    if (!ch_usable(T, p.D, p.M)) return run_pass_recurrent(p, cols);
    return run_pass_chunked(p, cols, T, (float *)a->ws + recurrent_floats(s), final);
}

/* A pass over slices [s0, s0 + ns) of length L. */
static gla_pass pass_of(const attn *a, const attn_shape *s, long long s0, long long ns, int L, const float *pa,
                        const float *pb, const float *pc, float *po, bool rows, int dir, bool strict, bool acc) {
    const long long N = s->len;
    const int D = s->qk_dim, M = s->v_dim, W = gla_width(a, D);
    gla_pass p;
    p.a = pa + s0 * N * D;
    p.b = pb + s0 * N * M;
    p.c = pc + s0 * N * (rows ? M : D);
    p.o = po ? po + s0 * N * (rows ? D : M) : NULL;
    p.gate = a->aux + s0 * N * W;
    p.X = (float *)a->ws + s0 * (long long)D * M;
    p.N = N;
    p.ns = ns;
    p.L = L;
    p.D = D;
    p.M = M;
    p.W = W;
    p.dir = dir;
    p.strict = strict;
    p.accumulate = acc;
    p.scale = (float)attn_scale(a, D);
    return p;
}

size_t gla_cuda_workspace_bytes(const attn *a, const attn_shape *s) {
    const long long bh = (long long)s->batch * s->heads;
    const int T = gla_chunk(a, s->len), D = s->qk_dim, M = s->v_dim;
    size_t n = recurrent_floats(s);
    if (ch_usable(T, D, M)) n += (size_t)ch_group(bh, s->len, T, D, M) * ch_slice_floats(s->len, T, D, M);
    return n * sizeof(float);
}

int gla_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                     void *saved) {
    (void)saved;
    return attn_cuda_runs(s, {{out, s->v_dim, false}}, [&](long long s0, long long ns, int L) {
        AB_TRY(run_pass(a, s, pass_of(a, s, s0, ns, L, k, v, q, out, false, +1, false, false), true));
        if (!s->causal) AB_TRY(run_pass(a, s, pass_of(a, s, s0, ns, L, k, v, q, out, false, -1, true, true), true));
        return 0;
    });
}

int gla_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                      const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    (void)saved;
    const long long N = s->len, BH = (long long)s->batch * s->heads;
    const int D = s->qk_dim, W = gla_width(a, D);
    float *dqa = NULL, *dka = NULL, *dg = a->aux_grad;
    if (!s->causal) {
        dqa = (float *)a->ws + BH * D * s->v_dim;
        dka = dqa + BH * N * D;
    }
    const float *dqa_c = dqa, *dka_c = dka;
    return attn_cuda_runs(s, {{dq, D, false}, {dk, D, false}, {dv, s->v_dim, false}, {dg ? dg : dq, dg ? W : 0, false}},
                          [&](long long s0, long long ns, int L) {
        AB_TRY(run_pass(a, s, pass_of(a, s, s0, ns, L, k, v, dout, dq, true, +1, false, false), false));
        AB_TRY(run_pass(a, s, pass_of(a, s, s0, ns, L, q, dout, v, dk, true, -1, false, false), false));
        AB_TRY(run_pass(a, s, pass_of(a, s, s0, ns, L, q, dout, k, dv, false, -1, false, false), true));
        if (!s->causal) {
            AB_TRY(run_pass(a, s, pass_of(a, s, s0, ns, L, k, v, dout, dqa, true, -1, true, false), false));
            AB_TRY(run_pass(a, s, pass_of(a, s, s0, ns, L, q, dout, v, dka, true, +1, true, false), false));
            AB_TRY(run_pass(a, s, pass_of(a, s, s0, ns, L, q, dout, k, dv, false, +1, true, true), true));
        }
        const long long off = s0 * N * D;
        if (dg)
            AB_LAUNCH(gla_dgate_kernel, blocks_of(ns * W), DG_THREADS, 0, ab_cuda_stream(), q + off, k + off,
                      dq + off, dk + off, dqa_c ? dqa_c + off : NULL, dka_c ? dka_c + off : NULL, dg + s0 * N * W, ns,
                      N, L, D, W);
        if (!s->causal) {
            AB_LAUNCH(gla_add_rows_kernel, blocks_of((ns * L * D + 255) / 256), 256, 0, ab_cuda_stream(), dq + off,
                      dqa_c + off, ns, N, L, D);
            AB_LAUNCH(gla_add_rows_kernel, blocks_of((ns * L * D + 255) / 256), 256, 0, ab_cuda_stream(), dk + off,
                      dka_c + off, ns, N, L, D);
        }
        return 0;
    });
}

int gla_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    (void)a, (void)capacity;
    AB_CUDA_CHECK(cudaMemsetAsync(state, 0, (size_t)s->batch * s->heads * s->qk_dim * s->v_dim * sizeof(float),
                                  ab_cuda_stream()));
    return 0;
}

int gla_cuda_prefill(attn *a, const attn_shape *s, int capacity, int P, const float *q, const float *k,
                     const float *v, float *out, void *state) {
    (void)capacity;
    attn_shape ps = *s;
    ps.len = P;
    gla_pass p = pass_of(a, &ps, 0, (long long)s->batch * s->heads, P, k, v, q, out, false, +1, false, false);
    p.X = (float *)state;
    return run_pass(a, &ps, p, true, true);
}

int gla_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                  const float *v, float *out) {
    (void)capacity, (void)t;
    const long long ns = (long long)s->batch * s->heads;
    const int D = s->qk_dim, M = s->v_dim;
    AB_LAUNCH(gla_step_kernel, blocks_of((ns * M + 127) / 128), 128, 0, ab_cuda_stream(), (float *)state, q, k, v,
              a->aux, out, ns, D, M, gla_width(a, D), (float)attn_scale(a, D));
    return 0;
}
