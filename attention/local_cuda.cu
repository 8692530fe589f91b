/* local (sliding-window softmax) on CUDA, with the definitions, options and results of
 * the CPU version (local.c): row i attends to keys i - w < j <= i (causal) or
 * |i - j| < w, j < L; rows >= L output zero.
 *
 * Tiles of LT = 64 rows. Query tile b of a slice needs key tiles b - nb .. b + na
 * (nb = ceil((w - 1) / LT), at most the slice's other tiles; na = nb, or 0 when causal):
 * a row of `span` = (nb + 1 + na) LT scores. So that one strided-batched GEMM covers
 * every tile of every slice, the run's q, k, v (and dout) are first copied into padded
 * buffers where each slice takes exactly nblk LT rows (rows >= L zero) and nb LT zero
 * rows lead the first slice and na LT trail the last: tile i's keys then start at row
 * (i - nb) LT for every i. Key rows that fall outside the slice (before position 0 they
 * are the previous slice's rows, or the lead) are masked, and a masked score becomes a
 * probability of exactly 0, so what lies there never counts.
 *
 * Forward, per group of tiles (as many as the scratch budget holds, at least one):
 *   S = scale Q_tile K_range^T (batched GEMM), a warp per row masks and softmaxes it in
 *   place, O_tile = P V_range (batched GEMM); then O's valid rows are copied out.
 * Backward recomputes P the same way (nothing is saved), then dP = dO_tile V_range^T,
 * dS = P .* (dP - rowsum(P .* dP)) (a warp per row), dQ_tile = scale dS K_range, and
 * for each key tile offset o: dK_tile(i - nb + o) += scale dS[:, o]^T Q_tile(i) and
 * dV likewise with P and dO, one batched GEMM per o (the tiles one call writes are
 * distinct, and the calls run in order on the stream: no atomics, the same result
 * every time).
 *
 * Memory: forward saves nothing. Workspace: the padded copies (q, k, v and dO, dQ, dK,
 * dV: 7 padded tensors, about 7 B H N (D or M) floats plus the pads) and two LT x span
 * score blocks per tile of a group (local_cuda_scratch_floats). Recurrent state: the
 * CPU's ring (local.c); a step is one block per slice (scores of the window in the step
 * workspace, then its softmax and the weighted sum of the ring's values). Speed: not
 * measured (no GPU here); the pad copies move the inputs once more, and span is up to
 * LT - 1 columns wider than the window per side (masked work). */
#include "cuda_util.cuh"

#include "local_cuda.h"

#define LT 64
#define THREADS 256
#define MAX_BLOCKS 65535LL

size_t local_cuda_scratch_floats = (size_t)32 << 20;

/* ---- geometry ---- */

struct loc_geo {
    int nblk;          /* tiles per slice (ceil(L / LT)) */
    int nb, na, ntile; /* key tiles before and after a query tile; nb + 1 + na */
    int span;          /* ntile LT */
    long long lead, rows; /* lead rows, and all rows of a padded buffer */
};

static loc_geo geo_of(const attn *a, bool causal, long long ns, int L) {
    loc_geo g;
    g.nblk = (L + LT - 1) / LT;
    const long long need = ((long long)a->p.window - 1 + LT - 1) / LT;
    g.nb = (int)(need < g.nblk - 1 ? need : g.nblk - 1);
    if (g.nb < 0) g.nb = 0;
    g.na = causal ? 0 : g.nb;
    g.ntile = g.nb + 1 + g.na;
    g.span = g.ntile * LT;
    g.lead = (long long)g.nb * LT;
    g.rows = g.lead + ns * g.nblk * LT + (long long)g.na * LT;
    return g;
}

/* ---- kernels ---- */

/* dst (g.rows x X, padded layout) from the valid rows of ns slices of src (N rows each). */
__global__ void loc_pad_kernel(const float *src, long long ns, int N, int L, int X, int nblk, long long lead,
                               long long rows, float *dst) {
    const long long total = rows * X, P = (long long)nblk * LT;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        const long long r = e / X - lead;
        const int c = (int)(e % X);
        float val = 0.0f;
        if (r >= 0 && r < ns * P) {
            const long long sl = r / P, p = r % P;
            if (p < L) val = src[(sl * N + p) * X + c];
        }
        dst[e] = val;
    }
}

/* The valid rows of the padded src into dst (ns slices of N rows). */
__global__ void loc_unpad_kernel(const float *src, long long ns, int N, int L, int X, int nblk, long long lead,
                                 float *dst) {
    const long long total = ns * L * X, P = (long long)nblk * LT;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        const long long sl = e / ((long long)L * X), r = (e / X) % L;
        const int c = (int)(e % X);
        dst[(sl * N + r) * X + c] = src[(lead + sl * P + r) * X + c];
    }
}

struct loc_mask {
    int nblk, nb, span, L, causal;
    long long w;
};

/* Scores -> probabilities in place for the rows of tiles [i0, i0 + n): a warp per row;
 * disallowed entries and rows of padding queries become 0. */
__global__ void loc_probs_kernel(float *S, long long i0, long long n, loc_mask mk) {
    const int lane = threadIdx.x & 31;
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5, rows = n * LT;
    for (long long gr = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; gr < rows; gr += nw) {
        const long long i = i0 + gr / LT, b = i % mk.nblk, p = b * LT + gr % LT;
        const long long j0 = (b - mk.nb) * LT;
        float *row = S + gr * mk.span;
        if (p >= mk.L) {
            for (int c = lane; c < mk.span; c += 32) row[c] = 0.0f;
            continue;
        }
        const long long lo = p - mk.w + 1, hi = mk.causal ? p : p + mk.w - 1; /* allowed j in [lo, hi] */
        float mx = -INFINITY;
        for (int c = lane; c < mk.span; c += 32) {
            const long long j = j0 + c;
            if (j >= 0 && j < mk.L && j >= lo && j <= hi) mx = fmaxf(mx, row[c]);
        }
        mx = attn_warp_max(mx);
        double sum = 0;
        for (int c = lane; c < mk.span; c += 32) {
            const long long j = j0 + c;
            const float e = (j >= 0 && j < mk.L && j >= lo && j <= hi) ? expf(row[c] - mx) : 0.0f;
            row[c] = e;
            sum += e;
        }
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        const float inv = (float)(1.0 / sum); /* >= 1 term: the row's own key */
        for (int c = lane; c < mk.span; c += 32) row[c] *= inv;
    }
}

/* dS = P .* (dP - rowsum(P .* dP)) in place of dP, a warp per row. */
__global__ void loc_dscores_kernel(const float *P, float *dP, long long rows, int span) {
    const int lane = threadIdx.x & 31;
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        const float *p = P + r * span;
        float *d = dP + r * span;
        double dot = 0;
        for (int c = lane; c < span; c += 32) dot += (double)p[c] * d[c];
        for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        const float fd = (float)dot;
        for (int c = lane; c < span; c += 32) d[c] = p[c] * (d[c] - fd);
    }
}

/* ---- workspace ---- */

struct loc_bufs {
    float *qw, *kw, *vw, *ow, *dqw, *dkw, *dvw, *S, *dS;
};

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

/* Tiles per group: as many as the budget holds for two score blocks each, at least 1. */
static long long group_tiles(const loc_geo &g, long long tiles) {
    const long long per = 2LL * LT * g.span;
    long long n = (long long)(local_cuda_scratch_floats / (size_t)per);
    if (n < 1) n = 1;
    return n < tiles ? n : tiles;
}

/* Layout for ns slices of length L (the largest: all B H slices at N). */
static size_t carve(const attn *a, const attn_shape *s, long long ns, int L, float *ws, loc_bufs *b) {
    const loc_geo g = geo_of(a, s->causal, ns, L);
    const size_t R = (size_t)g.rows, D = (size_t)s->qk_dim, M = (size_t)s->v_dim;
    const size_t gt = (size_t)group_tiles(g, ns * g.nblk), sc = gt * LT * (size_t)g.span;
    const size_t sizes[9] = {R * D, R * D, R * M, R * M, R * D, R * D, R * M, sc, sc};
    float **dst[9] = {&b->qw, &b->kw, &b->vw, &b->ow, &b->dqw, &b->dkw, &b->dvw, &b->S, &b->dS};
    size_t off = 0;
    for (int i = 0; i < 9; i++) {
        if (ws) *dst[i] = ws + off;
        off += up64(sizes[i]);
    }
    return off;
}

extern "C" size_t local_cuda_workspace_bytes(const attn *a, const attn_shape *s) {
    loc_bufs b;
    return carve(a, s, (long long)s->batch * s->heads, s->len, NULL, &b) * sizeof(float);
}

static unsigned grid_elems(long long n) { return ab_cuda_grid(n, THREADS, MAX_BLOCKS); }
static unsigned grid_warps(long long rows) { return ab_cuda_grid(rows, THREADS / 32, MAX_BLOCKS); }

/* ---- parallel mode ---- */

/* One run: ns slices of length L >= 1 (tensor bases at the first); dout NULL: forward
 * only (out), else backward (dq, dk, dv). */
static int run(attn *a, const attn_shape *s, long long ns, int L, const float *q, const float *k, const float *v,
               float *out, const float *dout, float *dq, float *dk, float *dv) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const bool bwd = dout != NULL;
    const loc_geo g = geo_of(a, s->causal, ns, L);
    loc_bufs b;
    carve(a, s, ns, L, (float *)a->ws, &b);
    const float scale = (float)attn_scale(a, D);
    const long long tiles = ns * g.nblk, gt = group_tiles(g, tiles);
    const long long TD = (long long)LT * D, TM = (long long)LT * M, TS = (long long)LT * g.span;
    const loc_mask mk = {g.nblk, g.nb, g.span, L, s->causal ? 1 : 0, a->p.window};
    AB_LAUNCH(loc_pad_kernel, grid_elems(g.rows * D), THREADS, 0, ab_cuda_stream(), q, ns, N, L, D, g.nblk, g.lead,
              g.rows, b.qw);
    AB_LAUNCH(loc_pad_kernel, grid_elems(g.rows * D), THREADS, 0, ab_cuda_stream(), k, ns, N, L, D, g.nblk, g.lead,
              g.rows, b.kw);
    AB_LAUNCH(loc_pad_kernel, grid_elems(g.rows * M), THREADS, 0, ab_cuda_stream(), v, ns, N, L, M, g.nblk, g.lead,
              g.rows, b.vw);
    if (bwd) {
        AB_LAUNCH(loc_pad_kernel, grid_elems(g.rows * M), THREADS, 0, ab_cuda_stream(), dout, ns, N, L, M, g.nblk,
                  g.lead, g.rows, b.ow);
        AB_CUDA_CHECK(cudaMemsetAsync(b.dkw, 0, (size_t)g.rows * D * sizeof(float), ab_cuda_stream()));
        AB_CUDA_CHECK(cudaMemsetAsync(b.dvw, 0, (size_t)g.rows * M * sizeof(float), ab_cuda_stream()));
    }
    for (long long i0 = 0; i0 < tiles; i0 += gt) {
        const long long n = tiles - i0 < gt ? tiles - i0 : gt;
        const long long qrow = g.lead + i0 * LT, krow = g.lead + (i0 - g.nb) * LT; /* krow >= 0 */
        /* S = scale Q_tile K_range^T  (LT, span); probabilities in place */
        AB_TRY(ab_cuda_sgemm_batched(false, true, LT, g.span, D, scale, b.qw + qrow * D, D, TD, b.kw + krow * D, D,
                                     TD, 0.0f, b.S, g.span, TS, n));
        AB_LAUNCH(loc_probs_kernel, grid_warps(n * LT), THREADS, 0, ab_cuda_stream(), b.S, i0, n, mk);
        if (!bwd) {
            /* O_tile = P V_range  (LT, M) */
            AB_TRY(ab_cuda_sgemm_batched(false, false, LT, M, g.span, 1.0f, b.S, g.span, TS, b.vw + krow * M, M, TM,
                                         0.0f, b.ow + qrow * M, M, TM, n));
            continue;
        }
        /* dP = dO_tile V_range^T; dS in place */
        AB_TRY(ab_cuda_sgemm_batched(false, true, LT, g.span, M, 1.0f, b.ow + qrow * M, M, TM, b.vw + krow * M, M, TM,
                                     0.0f, b.dS, g.span, TS, n));
        AB_LAUNCH(loc_dscores_kernel, grid_warps(n * LT), THREADS, 0, ab_cuda_stream(), (const float *)b.S, b.dS,
                  n * LT, g.span);
        /* dQ_tile = scale dS K_range  (LT, D) */
        AB_TRY(ab_cuda_sgemm_batched(false, false, LT, D, g.span, scale, b.dS, g.span, TS, b.kw + krow * D, D, TD,
                                     0.0f, b.dqw + qrow * D, D, TD, n));
        /* dK, dV of each key tile offset o (distinct tiles within one call) */
        for (int o = 0; o < g.ntile; o++) {
            const long long orow = krow + (long long)o * LT;
            AB_TRY(ab_cuda_sgemm_batched(true, false, LT, D, LT, scale, b.dS + (long long)o * LT, g.span, TS,
                                         b.qw + qrow * D, D, TD, 1.0f, b.dkw + orow * D, D, TD, n));
            AB_TRY(ab_cuda_sgemm_batched(true, false, LT, M, LT, 1.0f, b.S + (long long)o * LT, g.span, TS,
                                         b.ow + qrow * M, M, TM, 1.0f, b.dvw + orow * M, M, TM, n));
        }
    }
    if (!bwd) {
        AB_LAUNCH(loc_unpad_kernel, grid_elems(ns * L * M), THREADS, 0, ab_cuda_stream(), (const float *)b.ow, ns, N, L,
                  M, g.nblk, g.lead, out);
        return 0;
    }
    AB_LAUNCH(loc_unpad_kernel, grid_elems(ns * L * D), THREADS, 0, ab_cuda_stream(), (const float *)b.dqw, ns, N, L,
              D, g.nblk, g.lead, dq);
    AB_LAUNCH(loc_unpad_kernel, grid_elems(ns * L * D), THREADS, 0, ab_cuda_stream(), (const float *)b.dkw, ns, N, L,
              D, g.nblk, g.lead, dk);
    AB_LAUNCH(loc_unpad_kernel, grid_elems(ns * L * M), THREADS, 0, ab_cuda_stream(), (const float *)b.dvw, ns, N, L,
              M, g.nblk, g.lead, dv);
    return 0;
}

extern "C" int local_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                  float *out, void *saved) {
    (void)saved;
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const long long ND = (long long)N * D, NM = (long long)N * M;
    return attn_cuda_runs(s, {{out, M, false}}, [&](long long s0, long long ns, int L) {
        return run(a, s, ns, L, q + s0 * ND, k + s0 * ND, v + s0 * NM, out + s0 * NM, NULL, NULL, NULL, NULL);
    });
}

extern "C" int local_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                   const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    (void)saved;
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const long long ND = (long long)N * D, NM = (long long)N * M;
    return attn_cuda_runs(s, {{dq, D, false}, {dk, D, false}, {dv, M, false}}, [&](long long s0, long long ns, int L) {
        return run(a, s, ns, L, q + s0 * ND, k + s0 * ND, v + s0 * NM, NULL, dout + s0 * NM, dq + s0 * ND,
                   dk + s0 * ND, dv + s0 * NM);
    });
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
