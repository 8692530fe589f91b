/* linear and polynomial attention on CUDA, the BATCHED path (linear_cuda.cu takes the
 * fused kernels wherever their tiles fit; this path serves feature counts too large for
 * them, and with lin_cuda_path = 1 the kernel lab's version 1 and the tests), and the
 * configuration both paths share (lin_cfg_make).
 *
 * Work is organised in runs of batch entries of equal valid length L (attn_cuda_runs), and
 * within a run in *groups*: cn slices x g chunks of T positions (chunk option; auto is
 * 64 here, 32 on the CPU: both give the same result to float rounding). A group's
 * buffers hold all its chunks back to back ([cn][g][T][...]), so every product below is
 * ONE cuBLAS strided-batched GEMM over the cn*g chunks. Rows at positions >= L inside
 * the last chunk are zero in the feature and Vaug buffers, so full T x T / T x C
 * products give the right sums. Groups of one slice batch run in sequence, with a
 * running state carried from group to group.
 *
 * Causal forward, per group:
 *   phiK, phiQ, Vaug                                  (feature kernel, copy kernel)
 *   Sc[c] = phiK_c^T Vaug_c                           (per-chunk states, C x (M+1))
 *   Sc[c] <- S_run + sum_{c' < c} Sc[c'];  S_run += sum_c Sc[c]
 *                                                     (exclusive scan over the chunk axis:
 *                                                      one thread per (slice, state entry),
 *                                                      double accumulation)
 *   A_c = phiQ_c phiK_c^T, lower triangle incl. diagonal (GEMM + mask kernel)
 *   O_c = phiQ_c Sc[c] + A_c Vaug_c;  out = O[:, :M] / (O[:, M] + eps)
 * Causal backward (paper eqs. 13-15 in chunk form, as linear.c), with
 * Gaug_i = [dout_i/(den_i+eps), -(dout_i . out_i)/(den_i+eps)]:
 *   pass 1, groups in order: the forward's Sc and O again (so out_i and den_i as the
 *     forward computed them), Gaug, and the two scalars 1/(den+eps), (dout.out)/(den+eps)
 *     of each position kept in O(N) vectors; B_c = Gaug_c Vaug_c^T masked;
 *     dphiQ_c = Gaug_c Sc[c]^T + B_c phiK_c -> feature backward -> dq
 *   pass 2, groups in reverse: Gaug from the kept scalars; Rc[c] = phiQ_c^T Gaug_c,
 *     reverse exclusive scan (R = sum over later chunks, carried between groups);
 *     dphiK_c = Vaug_c R[c]^T + B_c^T phiQ_c -> dk;  dV_c = phiK_c R[c][:, :M] + A_c^T Gaug_c[:, :M]
 * Non-causal (no chunk structure needed; a group is just g*T rows):
 *   S = phiK^T Vaug (one GEMM per slice over the valid rows, accumulated over groups),
 *   O = phiQ S; backward: dphiQ = Gaug S^T, R = phiQ^T Gaug, dphiK = Vaug R^T, dV = phiK R[:, :M].
 *
 * Memory (floats; C features, M1 = M + 1, T chunk, Np = ceil(L/T) * T):
 * - saved for backward: nothing (saved_bytes 0, as the CPU): backward recomputes.
 * - workspace, per (slice, chunk) of a group: phiQ, phiK, dphi (3 T C), Vaug, Gaug, O
 *   (3 T M1), and when causal A, B (2 T^2) and the chunk's state (C M1); per slice of a
 *   group: the running state (C M1; non-causal: S and R, 2 C M1) and, causal, the two
 *   per-position scalars (2 Np: the only O(N) part, what the paper's Algorithm 1 also
 *   needs for the denominator). All of it for all slices and chunks when that is below
 *   lin_cuda_ws_floats (default 32 Mi floats = 128 MiB); otherwise that budget, the
 *   groups made as large as fit (all slices of a run and as many chunks as fit, or
 *   fewer slices of one chunk), and never less than one chunk of one slice. So the
 *   backward's extra memory is bounded, like the paper's Algorithm 1 (no per-position
 *   state stored), up to the budget: e.g. elu D = M = 64, T = 64: 37120 floats per
 *   chunk (580 per position); polynomial D = M = 64 (C = 4161): 1.09 M floats per chunk.
 * - recurrent state: Saug per slice, B*H*C*M1 floats (as the CPU), then one counter per
 *   slice; step workspace: the fused step's partial sums (lin_step_workspace_bytes).
 *
 * Precision: float32 products (cuBLAS) as the CPU's sgemm; double where the CPU uses
 * double (the taylor norm, 1/(den+eps), dout.out) and in the chunk scans and the step's
 * sums over C.
 *
 * Speed: not measured (developed without a GPU). Expected limits of the batched path,
 * from estimates only:
 * - the batched GEMMs work on 64 x 64 blocks (and T x C, C x (M+1) ones): far from
 *   cuBLAS's peak, and the per-chunk states are written, scanned and read back (4 passes
 *   over C (M+1) / T floats per position); elu at D = M = 64 does ~2 MFLOP per chunk
 *   forward, so a group of ~880 chunks (8 slices x 110) is ~2 GFLOP;
 * - polynomial: features are materialised (T x C per chunk, three buffers), so at D = 64
 *   the default budget holds only 3 chunks of 8 slices per group, and each group costs
 *   10 launches forward and 31 backward for ~2.5 GFLOP (forward): launch overhead
 *   and the feature buffers' traffic are not negligible (a larger budget, or features
 *   fused into the products, would help);
 * - the chunk scan walks a group's chunks serially per (slice, state entry), loads
 *   batched 8 at a time: ~33 k threads x ~110 steps per group for elu at B*H = 8,
 *   N = 65536 (latency-bound; estimated small next to the GEMMs; a two-level scan
 *   would remove it);
 * - the separate mask pass over the T x T blocks; the polynomial feature backward reads
 *   the D x D gradient block by rows and by columns (one of them strided, L1-resident). */
#include "linear_batched_cuda.cuh"

#include "linear_cuda.h"

extern "C" {
#include "favor.h"
}

#include <limits.h>
#include <math.h>

size_t lin_cuda_ws_floats = (size_t)32 << 20;

#define AUTO_CHUNK 64
#define THREADS 256
#define MAX_BLOCKS 65535LL /* enough blocks to fill any device; the loops do the rest */
#define ALIGN_FLOATS 64    /* buffers carved at 256-byte boundaries */
#define N_BUFFERS 17

/* ---- small kernels of the chunked algorithm ---- */

/* vaug rows = [v row, 1], zero for padding. */
__global__ void vaug_kernel(const float *v, rowmap rm, int M, float *vaug) {
    const int M1 = M + 1;
    const long long total = rm.n_rows * M1;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        long long sl, p;
        const int m = (int)(e % M1);
        row_at(rm, e / M1, &sl, &p);
        vaug[e] = p >= rm.L ? 0.0f : m < M ? v[sl * rm.stride + p * M + m] : 1.0f;
    }
}

/* Zeroes the strictly upper triangle of n_blocks consecutive T x T blocks. */
__global__ void mask_upper_kernel(float *A, long long n_blocks, int T) {
    const long long total = n_blocks * T * T;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        const long long i = (e / T) % T, j = e % T;
        if (j > i) A[e] = 0.0f;
    }
}

/* Exclusive scan of n_sl x g chunk states (E floats each, [slice][chunk][E]) along the
 * chunk axis, starting from run ([slice][E]), which ends holding the total. Forward:
 * chunks 0..g-1; reverse: g-1..0. Double accumulation; loads in batches of 8 so they
 * are in flight together. */
__global__ void scan_chunks_kernel(float *Sc, float *run, long long n_sl, int g, long long E, int reverse) {
    const long long total = n_sl * E;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long sl = idx / E, e = idx % E;
        float *base = Sc + sl * g * E + e;
        double acc = run[idx];
        for (int i0 = 0; i0 < g; i0 += 8) {
            float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            const int n = g - i0 < 8 ? g - i0 : 8;
            for (int u = 0; u < 8; u++) /* constant trip counts: unrolled, t[] in registers */
                if (u < n) t[u] = base[(long long)(reverse ? g - 1 - (i0 + u) : i0 + u) * E];
            for (int u = 0; u < 8; u++)
                if (u < n) {
                    base[(long long)(reverse ? g - 1 - (i0 + u) : i0 + u) * E] = (float)acc;
                    acc += t[u];
                }
        }
        run[idx] = (float)acc;
    }
}

/* eps of group row r (slice sl): eps, or for a log-scaled map eps e^(-qls[r] - kls[sl]),
 * the factor its Oaug row carries (linear.c's row_eps). */
__device__ __forceinline__ double row_eps(double eps, const float *qls, const float *kls, long long r, long long sl) {
    return qls ? eps * exp(-((double)qls[r] + (double)kls[sl])) : eps;
}

/* out rows (valid positions) = O[:, :M] / (O[:, M] + eps), as finish_rows (linear.c). */
__global__ void finish_kernel(const float *O, rowmap rm, int M, double eps, const float *qls, const float *kls,
                              float *out) {
    const int M1 = M + 1;
    const long long total = rm.n_rows * M;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        long long sl, p;
        const long long r = e / M;
        const int m = (int)(e % M);
        row_at(rm, r, &sl, &p);
        if (p >= rm.L) continue;
        const float *o = O + r * M1;
        out[sl * rm.stride + p * M + m] = o[m] * (float)(1.0 / ((double)o[M] + row_eps(eps, qls, kls, r, sl)));
    }
}

/* From Oaug rows and dout rows (one warp per row): inv = 1/(den+eps),
 * gd = (dout . out) / (den+eps) (double, as grad_rows in linear.c), kept at
 * inv_v / gd_v [slice * vstride + pos] when inv_v is not NULL, and
 * Gaug = [dout * inv, -gd] (zero rows for padding). */
__global__ void grad_rows_kernel(const float *O, const float *dout, rowmap rm, int M, double eps, const float *qls,
                                 const float *kls, float *inv_v, float *gd_v, long long vstride, float *gaug) {
    const int lane = threadIdx.x & 31, M1 = M + 1;
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rm.n_rows; r += nw) {
        long long sl, p;
        row_at(rm, r, &sl, &p);
        float *gr = gaug + r * M1;
        if (p >= rm.L) {
            for (int m = lane; m < M1; m += 32) gr[m] = 0.0f;
            continue;
        }
        const float *o = O + r * M1, *d = dout + sl * rm.stride + p * M;
        const double rr = 1.0 / ((double)o[M] + row_eps(eps, qls, kls, r, sl));
        double dn = 0;
        for (int m = lane; m < M; m += 32) dn += (double)d[m] * o[m];
        dn = fm_warp_sum_d(dn);
        const float iv = (float)rr, gd = (float)(dn * rr * rr);
        if (lane == 0) {
            if (inv_v) {
                inv_v[sl * vstride + p] = iv;
                gd_v[sl * vstride + p] = gd;
            }
            gr[M] = -gd;
        }
        for (int m = lane; m < M; m += 32) gr[m] = d[m] * iv;
    }
}

/* x[0..n) = v. */
__global__ void fill_kernel(float *x, long long n, float v) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x)
        x[e] = v;
}

/* Gaug rows from dout and the kept scalars (load_gaug in linear.c). */
__global__ void gaug_kernel(const float *dout, rowmap rm, int M, const float *inv_v, const float *gd_v,
                            long long vstride, float *gaug) {
    const int M1 = M + 1;
    const long long total = rm.n_rows * M1;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        long long sl, p;
        const int m = (int)(e % M1);
        row_at(rm, e / M1, &sl, &p);
        gaug[e] = p >= rm.L ? 0.0f
                  : m < M   ? dout[sl * rm.stride + p * M + m] * inv_v[sl * vstride + p]
                            : -gd_v[sl * vstride + p];
    }
}

/* dst rows (valid positions, M wide) = src rows (leading dimension ld). */
__global__ void copy_rows_kernel(const float *src, int ld, rowmap rm, int M, float *dst) {
    const long long total = rm.n_rows * M;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        long long sl, p;
        const long long r = e / M;
        row_at(rm, r, &sl, &p);
        if (p < rm.L) dst[sl * rm.stride + p * M + e % M] = src[r * ld + e % M];
    }
}

/* ---- configuration ---- */


/* The map is the CPU's (lin_feature_map, linear.c); the backend's check_shape has made
 * sure that it has CUDA kernels. */
void lin_cfg_make(const attn *a, const attn_shape *s, lin_cfg *g) {
    fm_spec sp;
    lin_feature_map(a, s->qk_dim, &sp);
    g->map = sp.map->cuda;
    g->f.D = sp.D;
    g->f.C = sp.C;
    g->f.c = sp.c;
    g->f.lin = sp.lin;
    g->f.scale = sp.scale;
    g->f.W = g->f.WT = NULL;
    g->scaled = sp.map->log_scaled;
    const int T = a->p.chunk > 0 ? a->p.chunk : AUTO_CHUNK;
    g->T = T < s->len ? T : s->len;
    if (g->T < 1) g->T = 1;
    g->C = sp.C;
    g->D = s->qk_dim;
    g->M = s->v_dim;
    g->M1 = s->v_dim + 1;
    g->eps = a->p.eps;
}

/* Saturating size arithmetic (a need that overflows is simply "too much"). */
static size_t smul(size_t a, size_t b) { return (a && b > SIZE_MAX / a) ? SIZE_MAX : a * b; }
static size_t sadd(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static size_t align_up(size_t n) { return sadd(n, ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS; }

/* Floats of the buffers of one group of cn slices x g chunks, per-slice vectors of np
 * positions (the layout carve() makes). */
struct lin_bufs {
    float *W, *WT, *phiq, *phik, *dphi, *vaug, *gaug, *o, *A, *B, *Sc, *run, *R, *inv, *gd, *qls, *kls;
};

static size_t carve(const lin_cfg &c, bool causal, long long cn, long long g, long long np, float *ws, lin_bufs *b) {
    const size_t rows = smul((size_t)cn, smul((size_t)g, (size_t)c.T)), C = (size_t)c.C, M1 = (size_t)c.M1;
    const size_t chunks = smul((size_t)cn, (size_t)g), T = (size_t)c.T, CM = smul(C, M1);
    const size_t CD = c.scaled ? smul(C, (size_t)c.D) : 0; /* favor's W and WT: first, at fixed offsets */
    const size_t sizes[N_BUFFERS] = {
        CD, CD,
        smul(rows, C), smul(rows, C), smul(rows, C), smul(rows, M1), smul(rows, M1), smul(rows, M1),
        causal ? smul(chunks, T * T) : 0, causal ? smul(chunks, T * T) : 0, causal ? smul(chunks, CM) : 0,
        smul((size_t)cn, CM), causal ? 0 : smul((size_t)cn, CM),
        causal ? smul((size_t)cn, (size_t)np) : 0, causal ? smul((size_t)cn, (size_t)np) : 0,
        c.scaled ? rows : 0, c.scaled ? (size_t)cn : 0,
    };
    float **dst[N_BUFFERS] = {&b->W,  &b->WT, &b->phiq, &b->phik, &b->dphi, &b->vaug, &b->gaug, &b->o,  &b->A,
                              &b->B,  &b->Sc, &b->run,  &b->R,    &b->inv,  &b->gd,   &b->qls,  &b->kls};
    size_t off = 0;
    for (int i = 0; i < N_BUFFERS; i++) {
        if (ws) *dst[i] = sizes[i] ? ws + off : NULL;
        off = sadd(off, align_up(sizes[i]));
    }
    return off;
}

static size_t need_floats(const lin_cfg &c, bool causal, long long cn, long long g, long long np) {
    lin_bufs b;
    return carve(c, causal, cn, g, np, NULL, &b);
}

/* Floats the calls may use at most for this configuration: the budget, but never below
 * one chunk of one slice. */
static size_t budget_floats(const lin_cfg &c, bool causal, long long np) {
    const size_t min1 = need_floats(c, causal, 1, 1, np);
    return lin_cuda_ws_floats > min1 ? lin_cuda_ws_floats : min1;
}

size_t lin_batched_workspace_bytes(const attn *a, const attn_shape *s) {
    lin_cfg c;
    lin_cfg_make(a, s, &c);
    const long long nc = ((long long)s->len + c.T - 1) / c.T, np = nc * c.T, BH = (long long)s->batch * s->heads;
    const size_t all = need_floats(c, s->causal, BH, nc, np), budget = budget_floats(c, s->causal, np);
    return smul(all < budget ? all : budget, sizeof(float));
}

/* How a run of ns slices of valid length L goes: cn slices and g chunks per group.
 * All slices and as many chunks as fit; when not even one chunk of every slice fits,
 * one chunk of as many slices as fit. */
struct lin_plan {
    long long cn;
    int g, nc;
    long long np;
};

static int make_plan(const attn *a, const lin_cfg &c, bool causal, long long ns, int L, lin_plan *pl) {
    pl->nc = (int)(((long long)L + c.T - 1) / c.T);
    pl->np = (long long)pl->nc * c.T;
    size_t w = a->ws_bytes / sizeof(float);
    const size_t budget = budget_floats(c, causal, pl->np);
    if (w > budget) w = budget;
    if (need_floats(c, causal, 1, 1, pl->np) > w)
        return ab_fail(AB_EINVAL, "%s on CUDA: workspace of %zu floats is below one chunk", a->v->name, w);
    if (need_floats(c, causal, ns, 1, pl->np) <= w) {
        pl->cn = ns;
        int lo = 1, hi = pl->nc; /* largest g in [lo, hi] that fits; g * T rows index with int */
        if (hi > INT_MAX / c.T) hi = INT_MAX / c.T;
        while (lo < hi) {
            const int mid = lo + (hi - lo + 1) / 2;
            if (need_floats(c, causal, ns, mid, pl->np) <= w) lo = mid;
            else hi = mid - 1;
        }
        pl->g = lo;
    } else {
        pl->g = 1;
        long long lo = 1, hi = ns;
        while (lo < hi) {
            const long long mid = lo + (hi - lo + 1) / 2;
            if (need_floats(c, causal, mid, 1, pl->np) <= w) lo = mid;
            else hi = mid - 1;
        }
        pl->cn = lo;
    }
    return 0;
}

/* ---- launch helpers ---- */

static unsigned grid_elems(long long n) { return ab_cuda_grid(n, THREADS, MAX_BLOCKS); }
static unsigned grid_warps(long long rows) { return ab_cuda_grid(rows, THREADS / 32, MAX_BLOCKS); }

/* Query features (log-scaled maps: each row's shift into qls) and key features
 * (shifted by their slice's kls). */
static int q_features(const lin_cfg &c, const float *x, const rowmap &rm, float *phi, float *qls) {
    return c.map->forward(c.f, x, rm, phi, c.scaled ? qls : NULL, NULL);
}

static int k_features(const lin_cfg &c, const float *x, const rowmap &rm, float *phi, const float *kls) {
    return c.map->forward(c.f, x, rm, phi, NULL, c.scaled ? kls : NULL);
}

static int features_backward(const lin_cfg &c, const float *x, const rowmap &rm, const float *phi, float *gphi,
                             float *gx) {
    return c.map->backward(c.f, x, rm, phi, gphi, gx);
}

/* favor: W drawn from the seed on the host (favor_draw: the CPU's numbers), its
 * transpose beside it, both copied to W and WT on the device; the map reads them there. */
int lin_draw_projection(attn *a, lin_cfg &c, float *W, float *WT) {
    const size_t CD = (size_t)c.C * (size_t)c.D, fb = (CD * sizeof(float) + 63) / 64 * 64;
    AB_TRY(attn_host_ws_ensure(a, 2 * fb + favor_draw_scratch(c.D)));
    float *hW = (float *)a->host_ws, *hWT = (float *)((char *)a->host_ws + fb);
    favor_draw(a->seed, c.D, c.C, (char *)a->host_ws + 2 * fb, hW);
    for (int r = 0; r < c.C; r++)
        for (int d = 0; d < c.D; d++) hWT[(size_t)d * c.C + r] = hW[(size_t)r * c.D + d];
    AB_TRY(ab_cuda_memcpy_h2d(W, hW, CD * sizeof(float)));
    AB_TRY(ab_cuda_memcpy_h2d(WT, hWT, CD * sizeof(float)));
    c.f.W = W;
    c.f.WT = WT;
    return 0;
}

static int mask_upper(float *A, long long n_blocks, int T) {
    if (T < 2) return 0;
    AB_LAUNCH(mask_upper_kernel, grid_elems(n_blocks * T * T), THREADS, 0, ab_cuda_stream(), A, n_blocks, T);
    return 0;
}

static int scan_chunks(float *Sc, float *run, long long n_sl, int g, long long E, bool reverse) {
    AB_LAUNCH(scan_chunks_kernel, grid_elems(n_sl * E), THREADS, 0, ab_cuda_stream(), Sc, run, n_sl, g, E,
              (int)reverse);
    return 0;
}

/* One group: slices [sb, sb + cn) of a run (tensor bases q0.. already at slice sb),
 * chunks [ch0, ch0 + g). */
struct group {
    long long cn, nch, nrows, p0;
    int g, rows_per; /* rows_per = g * T <= INT_MAX (make_plan) */
};

static group group_at(const lin_cfg &c, long long cn, int g, int ch0) {
    group gr;
    gr.cn = cn;
    gr.g = g;
    gr.nch = cn * g;
    gr.rows_per = g * c.T;
    gr.nrows = cn * gr.rows_per;
    gr.p0 = (long long)ch0 * c.T;
    return gr;
}

static rowmap map_of(const group &gr, int L, long long stride) {
    rowmap rm;
    rm.n_rows = gr.nrows;
    rm.stride = stride;
    rm.rows_per = gr.rows_per;
    rm.p0 = gr.p0;
    rm.L = L;
    return rm;
}

/* Tensors of one slice batch (bases at its first slice; N is the tensors' length). */
struct lin_io {
    const float *q, *k, *v, *dout;
    float *out, *dq, *dk, *dv;
    int N, L;
};

/* io moved on to its slice c0 (the tensors a call does not use stay NULL). */
static lin_io io_at(const lin_io &io0, const lin_cfg &c, long long c0) {
    lin_io io = io0;
    const long long oq = c0 * io.N * c.D, ov = c0 * io.N * c.M;
    io.q += oq, io.k += oq, io.v += ov;
    if (io.out) io.out += ov;
    if (io.dout) io.dout += ov, io.dq += oq, io.dk += oq, io.dv += ov;
    return io;
}

/* Log-scaled maps: kls[0..cn) = the largest log-feature over the valid keys of each
 * slice of the batch (every group of its chunks), the shift of its key features. */
static int key_shifts(const lin_cfg &c, const lin_plan &pl, long long cn, const lin_io &io, float *kls) {
    if (!c.scaled) return 0;
    AB_LAUNCH(fill_kernel, grid_elems(cn), THREADS, 0, ab_cuda_stream(), kls, cn, -INFINITY);
    for (int ch0 = 0; ch0 < pl.nc; ch0 += pl.g) {
        const group gr = group_at(c, cn, pl.nc - ch0 < pl.g ? pl.nc - ch0 : pl.g, ch0);
        AB_TRY(c.map->key_max(c.f, io.k, map_of(gr, io.L, (long long)io.N * c.D), kls));
    }
    return 0;
}

/* ---- causal ---- */

/* phiQ (if want_q), phiK, Vaug, the chunk states and their exclusive scan with the
 * running state; with want_o also A (masked) and Oaug. */
static int causal_group_forward(const lin_cfg &c, const group &gr, const lin_io &io, const lin_bufs &b, float *run,
                                const float *kls, bool want_o) {
    const int T = c.T, C = c.C, M1 = c.M1;
    const long long TC = (long long)T * C, TM = (long long)T * M1, TT = (long long)T * T, CM = (long long)C * M1;
    const rowmap rq = map_of(gr, io.L, (long long)io.N * c.D), rv = map_of(gr, io.L, (long long)io.N * c.M);
    AB_TRY(k_features(c, io.k, rq, b.phik, kls));
    AB_LAUNCH(vaug_kernel, grid_elems(gr.nrows * M1), THREADS, 0, ab_cuda_stream(), io.v, rv, c.M, b.vaug);
    /* Sc[c] = phiK_c^T Vaug_c  (C, M1) per chunk */
    AB_TRY(ab_cuda_sgemm_batched(true, false, C, M1, T, 1.0f, b.phik, C, TC, b.vaug, M1, TM, 0.0f, b.Sc, M1, CM,
                                 gr.nch));
    AB_TRY(scan_chunks(b.Sc, run, gr.cn, gr.g, CM, false));
    if (!want_o) return 0;
    AB_TRY(q_features(c, io.q, rq, b.phiq, b.qls));
    /* A = phiQ_c phiK_c^T  (T, T), lower triangle */
    AB_TRY(ab_cuda_sgemm_batched(false, true, T, T, C, 1.0f, b.phiq, C, TC, b.phik, C, TC, 0.0f, b.A, T, TT, gr.nch));
    AB_TRY(mask_upper(b.A, gr.nch, T));
    /* O = phiQ_c Sc[c] + A Vaug_c  (T, M1) */
    AB_TRY(ab_cuda_sgemm_batched(false, false, T, M1, C, 1.0f, b.phiq, C, TC, b.Sc, M1, CM, 0.0f, b.o, M1, TM,
                                 gr.nch));
    AB_TRY(ab_cuda_sgemm_batched(false, false, T, M1, T, 1.0f, b.A, T, TT, b.vaug, M1, TM, 1.0f, b.o, M1, TM, gr.nch));
    return 0;
}

/* Causal forward of slices [0, ns) of io (state: NULL, or the recurrent state of those
 * slices, which then carries the running state and keeps the final one; state_kls: a
 * log-scaled map's key shifts in that state). */
static int causal_forward_run(const attn *a, const lin_cfg &c, long long ns, const lin_io &io0, float *state,
                              float *state_kls) {
    lin_plan pl;
    AB_TRY(make_plan(a, c, true, ns, io0.L, &pl));
    lin_bufs b;
    carve(c, true, pl.cn, pl.g, pl.np, (float *)a->ws, &b);
    const long long CM = (long long)c.C * c.M1;
    for (long long c0 = 0; c0 < ns; c0 += pl.cn) {
        const long long cn = ns - c0 < pl.cn ? ns - c0 : pl.cn;
        const lin_io io = io_at(io0, c, c0);
        float *run = state ? state + c0 * CM : b.run, *kls = state_kls ? state_kls + c0 : b.kls;
        if (!state) AB_CUDA_CHECK(cudaMemsetAsync(run, 0, (size_t)(cn * CM) * sizeof(float), ab_cuda_stream()));
        AB_TRY(key_shifts(c, pl, cn, io, kls));
        for (int ch0 = 0; ch0 < pl.nc; ch0 += pl.g) {
            const group gr = group_at(c, cn, pl.nc - ch0 < pl.g ? pl.nc - ch0 : pl.g, ch0);
            AB_TRY(causal_group_forward(c, gr, io, b, run, kls, io.out != NULL));
            if (io.out) {
                const rowmap rv = map_of(gr, io.L, (long long)io.N * c.M);
                AB_LAUNCH(finish_kernel, grid_elems(gr.nrows * c.M), THREADS, 0, ab_cuda_stream(), b.o, rv, c.M,
                          c.eps, c.scaled ? (const float *)b.qls : NULL, (const float *)kls, io.out);
            }
        }
    }
    return 0;
}

static int causal_backward_run(const attn *a, const lin_cfg &c, long long ns, const lin_io &io0) {
    lin_plan pl;
    AB_TRY(make_plan(a, c, true, ns, io0.L, &pl));
    lin_bufs b;
    carve(c, true, pl.cn, pl.g, pl.np, (float *)a->ws, &b);
    const int T = c.T, C = c.C, M = c.M, M1 = c.M1;
    const long long TC = (long long)T * C, TM = (long long)T * M1, TT = (long long)T * T, CM = (long long)C * M1;
    for (long long c0 = 0; c0 < ns; c0 += pl.cn) {
        const long long cn = ns - c0 < pl.cn ? ns - c0 : pl.cn;
        const lin_io io = io_at(io0, c, c0);
        const long long sq = (long long)io.N * c.D, sv = (long long)io.N * c.M;
        /* pass 1: chunks in order; Oaug, Gaug (kept scalars), dphiQ -> dq */
        AB_CUDA_CHECK(cudaMemsetAsync(b.run, 0, (size_t)(cn * CM) * sizeof(float), ab_cuda_stream()));
        AB_TRY(key_shifts(c, pl, cn, io, b.kls));
        for (int ch0 = 0; ch0 < pl.nc; ch0 += pl.g) {
            const group gr = group_at(c, cn, pl.nc - ch0 < pl.g ? pl.nc - ch0 : pl.g, ch0);
            const rowmap rq = map_of(gr, io.L, sq), rv = map_of(gr, io.L, sv);
            AB_TRY(causal_group_forward(c, gr, io, b, b.run, b.kls, true));
            AB_LAUNCH(grad_rows_kernel, grid_warps(gr.nrows), THREADS, 0, ab_cuda_stream(), b.o, io.dout, rv, M,
                      c.eps, c.scaled ? (const float *)b.qls : NULL, (const float *)b.kls, b.inv, b.gd, pl.np, b.gaug);
            /* B = Gaug_c Vaug_c^T  (T, T), lower triangle */
            AB_TRY(ab_cuda_sgemm_batched(false, true, T, T, M1, 1.0f, b.gaug, M1, TM, b.vaug, M1, TM, 0.0f, b.B, T, TT,
                                         gr.nch));
            AB_TRY(mask_upper(b.B, gr.nch, T));
            /* dphiQ = Gaug_c Sc[c]^T + B phiK_c  (T, C) */
            AB_TRY(ab_cuda_sgemm_batched(false, true, T, C, M1, 1.0f, b.gaug, M1, TM, b.Sc, M1, CM, 0.0f, b.dphi, C,
                                         TC, gr.nch));
            AB_TRY(ab_cuda_sgemm_batched(false, false, T, C, T, 1.0f, b.B, T, TT, b.phik, C, TC, 1.0f, b.dphi, C, TC,
                                         gr.nch));
            AB_TRY(features_backward(c, io.q, rq, b.phiq, b.dphi, io.dq));
        }
        /* pass 2: chunks in reverse; R = sum over later chunks of phiQ^T Gaug */
        AB_CUDA_CHECK(cudaMemsetAsync(b.run, 0, (size_t)(cn * CM) * sizeof(float), ab_cuda_stream()));
        const int n_groups = (pl.nc + pl.g - 1) / pl.g;
        for (int gi = n_groups - 1; gi >= 0; gi--) {
            const int ch0 = gi * pl.g;
            const group gr = group_at(c, cn, pl.nc - ch0 < pl.g ? pl.nc - ch0 : pl.g, ch0);
            const rowmap rq = map_of(gr, io.L, sq), rv = map_of(gr, io.L, sv);
            AB_TRY(q_features(c, io.q, rq, b.phiq, b.qls));
            AB_TRY(k_features(c, io.k, rq, b.phik, b.kls));
            AB_LAUNCH(vaug_kernel, grid_elems(gr.nrows * M1), THREADS, 0, ab_cuda_stream(), io.v, rv, M, b.vaug);
            AB_LAUNCH(gaug_kernel, grid_elems(gr.nrows * M1), THREADS, 0, ab_cuda_stream(), io.dout, rv, M, b.inv,
                      b.gd, pl.np, b.gaug);
            /* Rc[c] = phiQ_c^T Gaug_c  (C, M1), reverse exclusive scan */
            AB_TRY(ab_cuda_sgemm_batched(true, false, C, M1, T, 1.0f, b.phiq, C, TC, b.gaug, M1, TM, 0.0f, b.Sc, M1,
                                         CM, gr.nch));
            AB_TRY(scan_chunks(b.Sc, b.run, gr.cn, gr.g, CM, true));
            AB_TRY(ab_cuda_sgemm_batched(false, true, T, T, C, 1.0f, b.phiq, C, TC, b.phik, C, TC, 0.0f, b.A, T, TT,
                                         gr.nch));
            AB_TRY(mask_upper(b.A, gr.nch, T));
            AB_TRY(ab_cuda_sgemm_batched(false, true, T, T, M1, 1.0f, b.gaug, M1, TM, b.vaug, M1, TM, 0.0f, b.B, T, TT,
                                         gr.nch));
            AB_TRY(mask_upper(b.B, gr.nch, T));
            /* dphiK = Vaug_c R[c]^T + B^T phiQ_c  (T, C) */
            AB_TRY(ab_cuda_sgemm_batched(false, true, T, C, M1, 1.0f, b.vaug, M1, TM, b.Sc, M1, CM, 0.0f, b.dphi, C,
                                         TC, gr.nch));
            AB_TRY(ab_cuda_sgemm_batched(true, false, T, C, T, 1.0f, b.B, T, TT, b.phiq, C, TC, 1.0f, b.dphi, C, TC,
                                         gr.nch));
            /* dV = phiK_c R[c][:, :M] + A^T Gaug_c[:, :M]  (T, M), into the O buffer */
            AB_TRY(ab_cuda_sgemm_batched(false, false, T, M, C, 1.0f, b.phik, C, TC, b.Sc, M1, CM, 0.0f, b.o, M1, TM,
                                         gr.nch));
            AB_TRY(ab_cuda_sgemm_batched(true, false, T, M, T, 1.0f, b.A, T, TT, b.gaug, M1, TM, 1.0f, b.o, M1, TM,
                                         gr.nch));
            AB_LAUNCH(copy_rows_kernel, grid_elems(gr.nrows * M), THREADS, 0, ab_cuda_stream(), b.o, M1, rv, M, io.dv);
            AB_TRY(features_backward(c, io.k, rq, b.phik, b.dphi, io.dk));
        }
    }
    return 0;
}

/* ---- non-causal ---- */

/* S = phiK^T Vaug over the run's valid rows, per slice of the batch (b.run); first
 * the key shifts (b.kls) of a log-scaled map. */
static int noncausal_state(const lin_cfg &c, const lin_plan &pl, long long cn, const lin_io &io, const lin_bufs &b) {
    const int C = c.C, M1 = c.M1;
    AB_TRY(key_shifts(c, pl, cn, io, b.kls));
    for (int ch0 = 0; ch0 < pl.nc; ch0 += pl.g) {
        const group gr = group_at(c, cn, pl.nc - ch0 < pl.g ? pl.nc - ch0 : pl.g, ch0);
        const rowmap rq = map_of(gr, io.L, (long long)io.N * c.D), rv = map_of(gr, io.L, (long long)io.N * c.M);
        const int R = gr.rows_per;
        AB_TRY(k_features(c, io.k, rq, b.phik, b.kls));
        AB_LAUNCH(vaug_kernel, grid_elems(gr.nrows * M1), THREADS, 0, ab_cuda_stream(), io.v, rv, c.M, b.vaug);
        /* S (+)= phiK^T Vaug  (C, M1) per slice */
        AB_TRY(ab_cuda_sgemm_batched(true, false, C, M1, R, 1.0f, b.phik, C, (long long)R * C, b.vaug, M1,
                                     (long long)R * M1, ch0 == 0 ? 0.0f : 1.0f, b.run, M1, (long long)C * M1, cn));
    }
    return 0;
}

static int noncausal_forward_run(const attn *a, const lin_cfg &c, long long ns, const lin_io &io0) {
    lin_plan pl;
    AB_TRY(make_plan(a, c, false, ns, io0.L, &pl));
    lin_bufs b;
    carve(c, false, pl.cn, pl.g, pl.np, (float *)a->ws, &b);
    const int C = c.C, M1 = c.M1;
    for (long long c0 = 0; c0 < ns; c0 += pl.cn) {
        const long long cn = ns - c0 < pl.cn ? ns - c0 : pl.cn;
        const lin_io io = io_at(io0, c, c0);
        AB_TRY(noncausal_state(c, pl, cn, io, b));
        for (int ch0 = 0; ch0 < pl.nc; ch0 += pl.g) {
            const group gr = group_at(c, cn, pl.nc - ch0 < pl.g ? pl.nc - ch0 : pl.g, ch0);
            const rowmap rq = map_of(gr, io.L, (long long)io.N * c.D), rv = map_of(gr, io.L, (long long)io.N * c.M);
            const int R = gr.rows_per;
            AB_TRY(q_features(c, io.q, rq, b.phiq, b.qls));
            /* O = phiQ S  (R, M1) per slice */
            AB_TRY(ab_cuda_sgemm_batched(false, false, R, M1, C, 1.0f, b.phiq, C, (long long)R * C, b.run, M1,
                                         (long long)C * M1, 0.0f, b.o, M1, (long long)R * M1, cn));
            AB_LAUNCH(finish_kernel, grid_elems(gr.nrows * c.M), THREADS, 0, ab_cuda_stream(), b.o, rv, c.M, c.eps,
                      c.scaled ? (const float *)b.qls : NULL, (const float *)b.kls, io.out);
        }
    }
    return 0;
}

static int noncausal_backward_run(const attn *a, const lin_cfg &c, long long ns, const lin_io &io0) {
    lin_plan pl;
    AB_TRY(make_plan(a, c, false, ns, io0.L, &pl));
    lin_bufs b;
    carve(c, false, pl.cn, pl.g, pl.np, (float *)a->ws, &b);
    const int C = c.C, M = c.M, M1 = c.M1;
    const long long CM = (long long)C * M1;
    for (long long c0 = 0; c0 < ns; c0 += pl.cn) {
        const long long cn = ns - c0 < pl.cn ? ns - c0 : pl.cn;
        const lin_io io = io_at(io0, c, c0);
        const long long sq = (long long)io.N * c.D, sv = (long long)io.N * c.M;
        AB_TRY(noncausal_state(c, pl, cn, io, b));
        /* queries: Oaug, Gaug, dphiQ = Gaug S^T -> dq; R = sum phiQ^T Gaug */
        for (int ch0 = 0; ch0 < pl.nc; ch0 += pl.g) {
            const group gr = group_at(c, cn, pl.nc - ch0 < pl.g ? pl.nc - ch0 : pl.g, ch0);
            const rowmap rq = map_of(gr, io.L, sq), rv = map_of(gr, io.L, sv);
            const int R = gr.rows_per;
            const long long RC = (long long)R * C, RM = (long long)R * M1;
            AB_TRY(q_features(c, io.q, rq, b.phiq, b.qls));
            AB_TRY(ab_cuda_sgemm_batched(false, false, R, M1, C, 1.0f, b.phiq, C, RC, b.run, M1, CM, 0.0f, b.o, M1, RM,
                                         cn));
            AB_LAUNCH(grad_rows_kernel, grid_warps(gr.nrows), THREADS, 0, ab_cuda_stream(), b.o, io.dout, rv, M,
                      c.eps, c.scaled ? (const float *)b.qls : NULL, (const float *)b.kls, (float *)NULL,
                      (float *)NULL, 0LL, b.gaug);
            AB_TRY(ab_cuda_sgemm_batched(false, true, R, C, M1, 1.0f, b.gaug, M1, RM, b.run, M1, CM, 0.0f, b.dphi, C,
                                         RC, cn));
            AB_TRY(features_backward(c, io.q, rq, b.phiq, b.dphi, io.dq));
            AB_TRY(ab_cuda_sgemm_batched(true, false, C, M1, R, 1.0f, b.phiq, C, RC, b.gaug, M1, RM,
                                         ch0 == 0 ? 0.0f : 1.0f, b.R, M1, CM, cn));
        }
        /* keys: dphiK = Vaug R^T -> dk; dV = phiK R[:, :M] */
        for (int ch0 = 0; ch0 < pl.nc; ch0 += pl.g) {
            const group gr = group_at(c, cn, pl.nc - ch0 < pl.g ? pl.nc - ch0 : pl.g, ch0);
            const rowmap rq = map_of(gr, io.L, sq), rv = map_of(gr, io.L, sv);
            const int R = gr.rows_per;
            const long long RC = (long long)R * C, RM = (long long)R * M1;
            AB_TRY(k_features(c, io.k, rq, b.phik, b.kls));
            AB_LAUNCH(vaug_kernel, grid_elems(gr.nrows * M1), THREADS, 0, ab_cuda_stream(), io.v, rv, M, b.vaug);
            AB_TRY(ab_cuda_sgemm_batched(false, true, R, C, M1, 1.0f, b.vaug, M1, RM, b.R, M1, CM, 0.0f, b.dphi, C, RC,
                                         cn));
            AB_TRY(features_backward(c, io.k, rq, b.phik, b.dphi, io.dk));
            AB_TRY(ab_cuda_sgemm_batched(false, false, R, M, C, 1.0f, b.phik, C, RC, b.R, M1, CM, 0.0f, b.o, M1, RM,
                                         cn));
            AB_LAUNCH(copy_rows_kernel, grid_elems(gr.nrows * M), THREADS, 0, ab_cuda_stream(), b.o, M1, rv, M, io.dv);
        }
    }
    return 0;
}

/* ---- the path's entry points (linear_cuda.cu calls them) ---- */

/* favor: the call's W and WT, drawn into their fixed place at the front of the
 * workspace (carve). */
static int draw_for_call(attn *a, lin_cfg &c) {
    if (!c.scaled) return 0;
    lin_bufs b;
    carve(c, false, 1, 1, 1, (float *)a->ws, &b);
    return lin_draw_projection(a, c, b.W, b.WT);
}

int lin_batched_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const long long ND = (long long)N * D, NM = (long long)N * M;
    lin_cfg c;
    lin_cfg_make(a, s, &c);
    AB_TRY(draw_for_call(a, c));
    return attn_cuda_runs(s, {{out, M, false}}, [&](long long s0, long long ns, int L) {
        lin_io io = {q + s0 * ND, k + s0 * ND, v + s0 * NM, NULL, out + s0 * NM, NULL, NULL, NULL, N, L};
        return s->causal ? causal_forward_run(a, c, ns, io, NULL, NULL) : noncausal_forward_run(a, c, ns, io);
    });
}

int lin_batched_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                         const float *dout, float *dq, float *dk, float *dv) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const long long ND = (long long)N * D, NM = (long long)N * M;
    lin_cfg c;
    lin_cfg_make(a, s, &c);
    AB_TRY(draw_for_call(a, c));
    return attn_cuda_runs(s, {{dq, D, false}, {dk, D, false}, {dv, M, false}}, [&](long long s0, long long ns, int L) {
        lin_io io = {q + s0 * ND, k + s0 * ND, v + s0 * NM, dout + s0 * NM, NULL, dq + s0 * ND, dk + s0 * ND,
                     dv + s0 * NM, N, L};
        return s->causal ? causal_backward_run(a, c, ns, io) : noncausal_backward_run(a, c, ns, io);
    });
}

int lin_batched_prefill(attn *a, const lin_cfg &c, long long n_slices, int P, const float *q, const float *k,
                        const float *v, float *out, float *state, float *kls) {
    lin_io io = {q, k, v, NULL, out, NULL, NULL, NULL, P, P};
    return causal_forward_run(a, c, n_slices, io, state, kls);
}
