/* lsh (Reformer, shared query/key) on CUDA, with the formula, the buckets and the saved
 * layout of the CPU version (lsh.c documents the formula and the gradient).
 *
 * Units of work: a segment is one (slice, round) pair; segment g of a run of slices
 * [s0, s0 + ns) with valid length L (attn_run) is slice s0 + g / R, round g % R. The
 * segments of a run go in groups of consecutive segments that fit the scratch budget
 * (lsh_cuda_scratch_bytes; at least one segment). Per group:
 *
 * forward
 *   hash     norms of the touched slices (a thread per position, the double sum in
 *            order), then a thread per (segment, position): k = q invn, the 2*bits
 *            projections as fused chains against R_r (rotations drawn on the device,
 *            rng_core.h), the first argmax: the arithmetic of lsh_hash.h, shared with
 *            the CPU, so the same buckets bit for bit. (Not a cuBLAS product: its
 *            summation order differs from the CPU's and would flip near ties.)
 *   sort     one CUB radix sort of the group's (key = segment * 2*bits + bucket,
 *            value = position) pairs, generated in (segment, position) order: radix
 *            sort is stable, so this is the stable sort by (bucket, position) of
 *            every segment at once. The order goes to saved perm, and its inverse
 *            (position -> sorted index) to the workspace.
 *   gather   each segment's sorted queries Q, keys K = q invn and values V into rows
 *            of a buffer laid out as: C zero rows (a guard chunk), the L sorted rows,
 *            zero rows up to a multiple of C (with a single chunk there is no guard).
 *            So chunk c's keys (chunks c-1 and c) are W = 2C consecutive rows, and
 *            every chunk of every segment is one entry of a strided batched GEMM (the
 *            guard chunks of the segments after the first are entries too, wasted).
 *   attend   S = scale Q_c K_win^T (cuBLAS, batched over chunks), a kernel turning
 *            each row into masked probabilities (a warp per query row: keys outside
 *            [0, L) or before chunk 0 excluded, self unless alone, causal by original
 *            positions) and writing the round's logsumexp to saved lse, then
 *            O = P V_win (cuBLAS).
 *   combine  a warp per (touched slice, position) adds the group's rounds of that
 *            slice in round order: mean (1/R), or the CPU's online logsumexp (running
 *            max and sum, carried between groups in the workspace), normalised at the
 *            last round, which also writes saved lse_tot and out.
 * backward (recomputes the scores from saved perm and lse)
 *   gather Q, K, V and dO rows as above; S = scale Q_c K_win^T, dP = dO_c V_win^T;
 *   a warp per query row: P = exp(S - lse) masked (or the self one-hot), the round
 *   weight w (1/R or exp(lse_r - lse_tot)), delta (sum P dP, or dout . out for
 *   logsumexp), dS = w P (dP - delta) in place of S and wP in place of dP;
 *   dQ_c = scale dS K_win, dK_win = scale dS^T Q_c, dV_win = (wP)^T dO_c per chunk
 *   (cuBLAS; each chunk's key gradients in a block of its own, nothing accumulates);
 *   a warp per (touched slice, position) collects, for each round of the group in
 *   order, its query gradient and its key gradients from the two chunks that see it
 *   (its own, as keys [C, 2C), and the next, as keys [0, C)), takes the key part
 *   through the normalisation (g - k (k . g)) / |q| (g / floor where floored) and
 *   adds both into dq, and the value gradients into dv: a fixed order per position,
 *   no atomics, deterministic. dk is zero.
 *
 * Memory: saved as the CPU (perm and lse per round: O(N R); lse_tot and out for
 * logsumexp). Workspace: the rotations (R D bits floats), four O(N) vectors per slice
 * a group touches, and per segment of a group the gathered rows (about N (2D + 2M)
 * floats forward, N (3D + 2M) backward), the chunk blocks (scores about 2 C N, twice
 * backward, key gradients 2 N (D + M)) and the sort's keys, values and CUB storage
 * (O(N)): O(N (D + M + C)) per segment, never N x N (unless chunk >= N, where the one
 * chunk is N x N, as on the CPU).
 *
 * Everything runs on the library's stream; nothing synchronises or allocates inside
 * a call; indices are long long in kernels and every grid loops. */
#define AB_CUDA_CUB
#include "cuda_util.cuh"

#include "lsh.h"
#include "lsh_cuda.h"

#include "../harness/rng_core.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

size_t lsh_cuda_scratch_bytes = (size_t)128 << 20;

#define THREADS 256
#define WARPS (THREADS / 32)
#define FULL 0xffffffffu
#define MAX_BLOCKS 65535LL
#define MAX_ROUNDS 64 /* the option's maximum (lsh.c) */
#define ALIGN 256     /* bytes: CUB's temporary storage, coalesced rows */
#define TILE 8        /* projections a hashing thread keeps in registers */

/* ---- plan: chunking of a run, group size, workspace layout ---- */

/* Chunking of a run of valid length L (the CPU's chunk_range): chunk c holds sorted
 * rows [c C, min((c + 1) C, L)). */
struct lsh_chunks {
    int L, C, nc; /* valid length, rows per chunk, chunks */
    int off;      /* 1 when chunks have a previous chunk to attend to (nc > 1): the guard */
    int vc;       /* chunks per segment in the gathered buffers: nc + off */
    int W;        /* keys per query row: (1 + off) C */
    long long Lg; /* rows per segment in the gathered buffers: vc C */
    long long nbatch_of(long long nseg) const { return nseg * vc - off; }
};

static lsh_chunks chunks_of(int L, int chunk) {
    lsh_chunks k;
    k.L = L;
    k.C = chunk < L ? chunk : L;
    if (k.C < 1) k.C = 1;
    k.nc = (L + k.C - 1) / k.C;
    k.off = k.nc > 1 ? 1 : 0;
    k.vc = k.nc + k.off;
    k.W = (1 + k.off) * k.C;
    k.Lg = (long long)k.vc * k.C;
    return k;
}

struct lsh_plan {
    int N, D, M, R, bits, nb, chunk;
    long long BH;
    bool lse_combine;
    lsh_chunks kN;      /* chunking at L = N: bounds every run's buffers */
    long long segs;     /* segments per group (at most) */
    long long slots;    /* O(N) vector slots: a touched slice sl uses slot sl % slots */
    int key_bits;       /* radix sort key bits of a full group */
    size_t cub_bytes;   /* CUB's temporary storage for a full group */
};

static int bits_for(unsigned long long v) { /* bits holding the values [0, v) */
    int b = 0;
    while (b < 63 && (1ULL << b) < v) b++;
    return b;
}

static size_t align_up(size_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

/* Bytes of one segment's share of the group area (forward or backward), CUB and the
 * alignment of the pieces aside (at most 11 pieces: 11 ALIGN per group). */
static double seg_bytes(const lsh_plan *p, bool backward) {
    const lsh_chunks *k = &p->kN;
    const double N = p->N, D = p->D, M = p->M, Lg = (double)k->Lg, CW = (double)k->vc * k->C * k->W;
    if (!backward) return 4.0 * (5 * N + 2 * Lg * (D + M) + CW);
    return 4.0 * (N + Lg * (3 * D + 2 * M) + 2 * CW + (double)k->vc * k->W * (D + M));
}

/* The plan without CUB's storage (plan_cub adds it). */
static lsh_plan plan_of(const attn *a, const attn_shape *s) {
    lsh_plan p;
    p.N = s->len;
    p.D = s->qk_dim;
    p.M = s->v_dim;
    p.R = a->p.rounds;
    p.bits = a->p.bits;
    p.nb = 2 * a->p.bits;
    p.chunk = a->p.chunk;
    p.BH = (long long)s->batch * s->heads;
    p.lse_combine = a->p.combine == ATTN_COMBINE_LOGSUMEXP;
    p.kN = chunks_of(p.N, p.chunk);
    double per = seg_bytes(&p, false), per_b = seg_bytes(&p, true);
    if (per_b > per) per = per_b;
    double g = floor(((double)lsh_cuda_scratch_bytes - 11.0 * ALIGN) / per);
    if (g > (double)p.BH * p.R) g = (double)p.BH * p.R;
    if (g > floor((double)INT32_MAX / p.N)) g = floor((double)INT32_MAX / p.N); /* sort items fit an int */
    if (g > floor(4294967296.0 / p.nb)) g = floor(4294967296.0 / p.nb);         /* keys fit 32 bits */
    if (g < 1) g = 1;
    p.segs = (long long)g;
    const long long touched = (p.segs - 1) / p.R + 2; /* slices that consecutive segments can span */
    p.slots = touched < p.BH ? touched : p.BH;
    p.key_bits = bits_for((unsigned long long)p.segs * (unsigned long long)p.nb);
    p.cub_bytes = 0;
    return p;
}

/* CUB's temporary storage for sorting n pairs on key_bits bits. */
static int cub_temp_bytes(long long n, int key_bits, size_t *bytes) {
    *bytes = 0;
    AB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, *bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                                  (const int32_t *)NULL, (int32_t *)NULL, (int)n, 0, key_bits,
                                                  ab_cuda_stream()));
    return 0;
}

static int plan_cub(lsh_plan *p) {
    return cub_temp_bytes(p->segs * (long long)p->N, p->key_bits, &p->cub_bytes);
}

/* The workspace: rotations and vectors, then the group area (forward or backward view,
 * carved for the chunking of the run at hand; at L = N it is the largest). */
struct lsh_ws {
    float *rot;                  /* [R][D][bits] */
    float *nrm, *invn, *va, *vb; /* [slots][N]; va, vb: running max and sum of the
                                    logsumexp combine (forward), va: delta (backward) */
    char *area;
    size_t area_bytes;
    /* forward view */
    uint32_t *keys, *keys_out;
    int32_t *vals, *vals_out;
    int32_t *inv;             /* [segs][N] sorted index of each position (both views) */
    float *Q, *K, *V, *O, *S; /* gathered rows [segs][Lg][D or M]; chunk blocks [nbatch][C][W] */
    void *cub;
    size_t cub_bytes;
    /* backward view */
    float *dQ, *dO, *dP, *dKw, *dVw; /* dQ [segs][Lg][D], dO [segs][Lg][M], dP like S,
                                        dKw [nbatch][W][D], dVw [nbatch][W][M] */
};

#define PIECE(ptr, type, count)                                                                                        \
    do {                                                                                                               \
        if (base) w->ptr = (type *)(base + off);                                                                       \
        off += align_up(sizeof(type) * (size_t)(count));                                                              \
    } while (0)

static size_t carve_common(const lsh_plan *p, char *base, lsh_ws *w) {
    size_t off = 0;
    const size_t vec = (size_t)p->slots * (size_t)p->N;
    PIECE(rot, float, (size_t)p->R * p->D * p->bits);
    PIECE(nrm, float, vec);
    PIECE(invn, float, vec);
    PIECE(va, float, vec);
    PIECE(vb, float, vec);
    return off;
}

static size_t carve_forward(const lsh_plan *p, const lsh_chunks *k, char *base, lsh_ws *w) {
    size_t off = 0;
    const size_t G = (size_t)p->segs, N = (size_t)p->N, Lg = (size_t)k->Lg;
    PIECE(keys, uint32_t, G * N);
    PIECE(keys_out, uint32_t, G * N);
    PIECE(vals, int32_t, G * N);
    PIECE(vals_out, int32_t, G * N);
    PIECE(inv, int32_t, G * N);
    PIECE(Q, float, G * Lg * p->D);
    PIECE(K, float, G * Lg * p->D);
    PIECE(V, float, G * Lg * p->M);
    PIECE(O, float, G * Lg * p->M);
    PIECE(S, float, G * k->vc * (size_t)k->C * k->W);
    if (base) {
        w->cub = base + off;
        w->cub_bytes = w->area_bytes > off ? w->area_bytes - off : 0;
    }
    off += align_up(p->cub_bytes);
    return off;
}

static size_t carve_backward(const lsh_plan *p, const lsh_chunks *k, char *base, lsh_ws *w) {
    size_t off = 0;
    const size_t G = (size_t)p->segs, N = (size_t)p->N, Lg = (size_t)k->Lg, blk = G * k->vc * (size_t)k->W;
    PIECE(inv, int32_t, G * N);
    PIECE(Q, float, G * Lg * p->D);
    PIECE(K, float, G * Lg * p->D);
    PIECE(dQ, float, G * Lg * p->D);
    PIECE(V, float, G * Lg * p->M);
    PIECE(dO, float, G * Lg * p->M);
    PIECE(S, float, blk * k->C);
    PIECE(dP, float, blk * k->C);
    PIECE(dKw, float, blk * p->D);
    PIECE(dVw, float, blk * p->M);
    return off;
}
#undef PIECE

static size_t ws_total(const lsh_plan *p) {
    size_t f = carve_forward(p, &p->kN, NULL, NULL), b = carve_backward(p, &p->kN, NULL, NULL);
    return carve_common(p, NULL, NULL) + (f > b ? f : b);
}

/* Carves a->ws (sized by lsh_cuda_workspace_bytes for this shape). */
static int ws_of(attn *a, const lsh_plan *p, lsh_ws *w) {
    memset(w, 0, sizeof *w);
    if (a->ws_bytes < ws_total(p))
        return ab_fail(AB_EINVAL, "lsh (cuda): workspace of %zu bytes is below the %zu this shape needs", a->ws_bytes,
                       ws_total(p));
    char *base = (char *)a->ws;
    size_t c = carve_common(p, base, w);
    w->area = base + c;
    w->area_bytes = a->ws_bytes - c;
    return 0;
}

/* ---- kernels ---- */

#define GRID_LOOP(e, n)                                                                                                \
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < (n); e += (long long)gridDim.x * blockDim.x)

/* Warp-per-item loops: 8 warps per block. Every lane of a warp runs the same
 * iterations, so warp operations inside see the whole warp. */
#define WARP_LOOP(item, n)                                                                                             \
    for (long long item = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5); item < (n);                              \
         item += (long long)gridDim.x * WARPS)

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

/* rot[r][d][j] = (float)ab_rng_normal(seed, r, d * bits + j), per = D * bits. */
__global__ void rot_kernel(float *rot, uint64_t seed, long long per, long long total) {
    GRID_LOOP(e, total) rot[e] = (float)ab_rng_normal_core(seed, (uint64_t)(e / per), (uint64_t)(e % per));
}

__global__ void rng_test_kernel(uint64_t seed, uint64_t stream, uint64_t index0, long long n, uint32_t *words,
                                double *normals) {
    GRID_LOOP(e, n) {
        if (words) ab_philox4x32_core(seed, stream, index0 + (uint64_t)e, words + 4 * e);
        if (normals) normals[e] = ab_rng_normal_core(seed, stream, index0 + (uint64_t)e);
    }
}

/* Norms of positions [0, L) of the run's slices [sl0, sl0 + nsl), into their slots. */
__global__ void norms_kernel(const float *q, int N, int D, int L, long long sl0, long long nsl, long long slots,
                             float *nrm, float *invn) {
    GRID_LOOP(e, nsl * L) {
        const long long sl = sl0 + e / L;
        const int i = (int)(e % L);
        const float *x = q + (sl * N + i) * (long long)D;
        double ss = 0;
        for (int d = 0; d < D; d++) ss = attn_lsh_sumsq_step(ss, x[d]);
        const long long at = (sl % slots) * N + i;
        invn[at] = attn_lsh_inv_norm(ss, &nrm[at]);
    }
}

/* Buckets of the positions [0, L) of segments [seg0, seg0 + nseg) of the run (lsh_hash.h).
 * keys != NULL: item e = g * L + i (g = segment in the group) gets key g * 2bits +
 * bucket and value i. Otherwise buckets[(r * BH + bh0 + slice) * N + i] = bucket. */
__global__ void hash_kernel(const float *q, const float *invn, const float *rot, int N, int D, int L, int R, int bits,
                            long long seg0, long long nseg, long long slots, uint32_t *keys, int32_t *vals,
                            int *buckets, long long bh0, long long BH) {
    GRID_LOOP(e, nseg * L) {
        const long long g = e / L, seg = seg0 + g, sl = seg / R;
        const int i = (int)(e % L), r = (int)(seg % R);
        const float *x = q + (sl * N + i) * (long long)D;
        const float iv = invn[(sl % slots) * N + i];
        const float *rr = rot + (long long)r * D * bits;
        attn_lsh_argmax am = attn_lsh_argmax_first(0.0f);
        for (int j0 = 0; j0 < bits; j0 += TILE) {
            const int nj = bits - j0 < TILE ? bits - j0 : TILE;
            float p[TILE];
            for (int jj = 0; jj < TILE; jj++) p[jj] = 0.0f;
            for (int d = 0; d < D; d++) {
                const float kd = x[d] * iv;
                const float *row = rr + (long long)d * bits + j0;
                for (int jj = 0; jj < TILE; jj++)
                    if (jj < nj) p[jj] = attn_lsh_proj_step(p[jj], kd, row[jj]);
            }
            for (int jj = 0; jj < TILE; jj++) {
                if (jj >= nj) break;
                if (j0 + jj == 0) am = attn_lsh_argmax_first(p[0]);
                else attn_lsh_argmax_add(&am, j0 + jj, p[jj]);
            }
        }
        const int bucket = attn_lsh_argmax_bucket(&am, bits);
        if (keys) {
            keys[e] = (uint32_t)(g * 2 * bits + bucket);
            vals[e] = i;
        } else {
            buckets[((long long)r * BH + bh0 + sl) * N + i] = bucket;
        }
    }
}

/* The sorted order of the group's segments into saved perm (rows of N), and its inverse. */
__global__ void perm_kernel(const int32_t *sorted, long long nseg, int L, int N, int32_t *perm, int32_t *inv) {
    GRID_LOOP(e, nseg * L) {
        const long long g = e / L;
        const int t = (int)(e % L), p = sorted[e];
        perm[g * N + t] = p;
        inv[g * N + p] = t;
    }
}

__global__ void inverse_kernel(const int32_t *perm, long long nseg, int L, int N, int32_t *inv) {
    GRID_LOOP(e, nseg * L) {
        const long long g = e / L;
        const int t = (int)(e % L);
        inv[g * N + perm[g * N + t]] = t;
    }
}

/* dst rows [nseg][Lg][width]: row gr + t of segment g is src row perm_g[t] of the
 * segment's slice (times invn when given), for t in [0, L); the other rows are zero. */
__global__ void gather_kernel(float *dst, const float *src, int width, const int32_t *perm, const float *invn,
                              long long seg0, long long nseg, int R, int N, int L, long long Lg, int gr,
                              long long slots) {
    const long long per = Lg * width;
    GRID_LOOP(e, nseg * per) {
        const long long g = e / per, rem = e - g * per, vr = rem / width;
        const int c = (int)(rem - vr * width);
        const long long t = vr - gr;
        float x = 0.0f;
        if (t >= 0 && t < L) {
            const int i = perm[g * N + t];
            const long long sl = (seg0 + g) / R;
            x = src[(sl * N + i) * (long long)width + c];
            if (invn) x = x * invn[(sl % slots) * N + i];
        }
        dst[e] = x;
    }
}

/* Where query row `row` of the chunk blocks is: block b = row / C (query chunk b + off
 * of the buffers), segment g, chunk c, sorted index tq; false for the rows of guard
 * chunks and past L. */
struct row_at {
    long long g, row;
    int c, tl, tq;
};

__device__ __forceinline__ bool locate(long long row, const lsh_chunks &k, row_at *at) {
    const long long b = row / k.C, vq = b + k.off;
    at->row = row;
    at->tl = (int)(row - b * k.C);
    at->g = vq / k.vc;
    const int u = (int)(vq - at->g * k.vc);
    at->c = u - k.off;
    at->tq = at->c * k.C + at->tl;
    return u >= k.off && at->tq < k.L;
}

/* Key column col of a row in chunk c: its sorted index (c - off) C + col, allowed when
 * inside [0, L), not the query itself and, causal, not after it. */
__device__ __forceinline__ bool allowed(const int32_t *pg, const lsh_chunks &k, int c, int col, int i, int causal) {
    const int tk = (c - k.off) * k.C + col;
    if (tk < 0 || tk >= k.L) return false;
    const int j = pg[tk];
    return j != i && !(causal && j > i);
}

/* Forward: each query row of the chunk blocks S [nbatch][C][W] -> probabilities in
 * place, the round's logsumexp into lse (rows of N per segment, original positions).
 * Guard and padding rows are set to zero. */
__global__ void rows_forward_kernel(float *S, const int32_t *perm, float *lse, long long nrows, lsh_chunks k, int N,
                                    int causal) {
    const int lane = threadIdx.x & 31;
    WARP_LOOP(row, nrows) {
        float *srow = S + row * k.W;
        row_at at;
        if (!locate(row, k, &at)) {
            for (int col = lane; col < k.W; col += 32) srow[col] = 0.0f;
            continue;
        }
        const int32_t *pg = perm + at.g * N;
        const int i = pg[at.tq];
        float m = -INFINITY;
        int any = 0;
        for (int col = lane; col < k.W; col += 32)
            if (allowed(pg, k, at.c, col, i, causal)) {
                any = 1;
                if (srow[col] > m) m = srow[col];
            }
        m = attn_warp_max(m);
        any = __any_sync(FULL, any);
        if (!any) { /* only itself: one-hot, lse = its own score */
            const int self = k.off * k.C + at.tl;
            const float own = srow[self];
            __syncwarp();
            for (int col = lane; col < k.W; col += 32) srow[col] = col == self ? 1.0f : 0.0f;
            if (lane == 0) lse[at.g * N + i] = own;
            continue;
        }
        double sum = 0;
        for (int col = lane; col < k.W; col += 32) {
            const float e = allowed(pg, k, at.c, col, i, causal) ? expf(srow[col] - m) : 0.0f;
            srow[col] = e;
            sum += e;
        }
        sum = warp_sum_d(sum);
        const float inv = (float)(1.0 / sum);
        for (int col = lane; col < k.W; col += 32) srow[col] *= inv;
        if (lane == 0) lse[at.g * N + i] = (float)((double)m + log(sum));
    }
}

/* Backward: each query row -> dS = w P (dP - delta) in S, w P in dP (zero rows for guard
 * and padding). lse: saved per segment rows; lse_tot and delta (logsumexp combine):
 * per slice of the run (saved) and per slot (workspace). */
__global__ void rows_backward_kernel(float *S, float *dP, const int32_t *perm, const float *lse, const float *lse_tot,
                                     const float *delta, long long seg0, int R, long long slots, long long nrows,
                                     lsh_chunks k, int N, int causal, int lse_combine, float wmean) {
    const int lane = threadIdx.x & 31;
    WARP_LOOP(row, nrows) {
        float *srow = S + row * k.W, *prow = dP + row * k.W;
        row_at at;
        if (!locate(row, k, &at)) {
            for (int col = lane; col < k.W; col += 32) srow[col] = prow[col] = 0.0f;
            continue;
        }
        const int32_t *pg = perm + at.g * N;
        const int i = pg[at.tq];
        const long long sl = (seg0 + at.g) / R;
        const float l = lse[at.g * N + i];
        const float w = lse_combine ? expf(l - lse_tot[sl * N + i]) : wmean;
        int any = 0;
        for (int col = lane; col < k.W; col += 32) any |= allowed(pg, k, at.c, col, i, causal) ? 1 : 0;
        any = __any_sync(FULL, any);
        const int self = k.off * k.C + at.tl;
        double dot = 0;
        for (int col = lane; col < k.W; col += 32) {
            float pr;
            if (!any) pr = col == self ? 1.0f : 0.0f;
            else pr = allowed(pg, k, at.c, col, i, causal) ? expf(srow[col] - l) : 0.0f;
            srow[col] = pr;
            dot += (double)pr * prow[col];
        }
        dot = warp_sum_d(dot);
        const float dl = lse_combine ? delta[(sl % slots) * N + i] : (float)dot;
        for (int col = lane; col < k.W; col += 32) {
            const float wp = w * srow[col];
            srow[col] = wp * (prow[col] - dl);
            prow[col] = wp;
        }
    }
}

/* A group of segments [seg0, seg0 + nseg) touches the slices sl_a .. sl_a + n - 1 (n =
 * touched_slices); a warp item of the combine and gradient kernels is one (touched
 * slice, position < L): its slice sl, position i, the rounds [r0, r1) of sl inside the
 * group and its row slot in the per-slice scratch. */
__host__ __device__ __forceinline__ long long touched_slices(long long seg0, long long nseg, int R) {
    return (seg0 + nseg - 1) / R - seg0 / R + 1;
}
struct seg_item {
    long long sl, slot;
    int i, r0, r1;
};
__device__ __forceinline__ seg_item seg_item_at(long long item, long long seg0, long long nseg, int R, int L, int N,
                                                long long slots) {
    seg_item t;
    t.sl = seg0 / R + item / L;
    t.i = (int)(item % L);
    const long long lo = t.sl * R, a = seg0 > lo ? seg0 : lo, b = seg0 + nseg < lo + R ? seg0 + nseg : lo + R;
    t.r0 = (int)(a - lo);
    t.r1 = (int)(b - lo);
    t.slot = (t.sl % slots) * N + t.i;
    return t;
}

/* Forward combine: a warp per (touched slice, position < L). out rows of the run; O the
 * gathered outputs; inv per segment; lse saved rows of the run's segments. */
__global__ void combine_kernel(float *out, float *saved_out, float *lse_tot, const float *O, const int32_t *inv,
                               const float *lse, float *va, float *vb, long long seg0, long long nseg, int R, int N,
                               int M, int L, long long Lg, int gr, long long slots, int lse_combine, float wmean) {
    __shared__ float fac[WARPS][MAX_ROUNDS], fin[WARPS];
    __shared__ int kind[WARPS][MAX_ROUNDS], trow[WARPS][MAX_ROUNDS];
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const long long nitems = touched_slices(seg0, nseg, R) * L;
    WARP_LOOP(item, nitems) {
        const seg_item t = seg_item_at(item, seg0, nseg, R, L, N, slots);
        const long long sl = t.sl, slot = t.slot;
        const int i = t.i, r0 = t.r0, r1 = t.r1;
        if (lane == 0) {
            float a = r0 > 0 ? va[slot] : 0.0f, b = r0 > 0 ? vb[slot] : 0.0f;
            for (int r = r0; r < r1; r++) {
                const long long g = sl * R + r - seg0;
                trow[wp][r] = (int)inv[g * N + i];
                if (!lse_combine) continue;
                /* the CPU's online softmax over rounds (lsh.c forward_chunk) */
                const float l = lse[(sl * R + r) * N + i];
                if (r == 0) {
                    kind[wp][r] = 0, fac[wp][r] = 1.0f;
                    a = l, b = 1.0f;
                } else if (l > a) {
                    const float f = expf(a - l);
                    kind[wp][r] = 1, fac[wp][r] = f;
                    b = b * f + 1.0f;
                    a = l;
                } else {
                    const float e = expf(l - a);
                    kind[wp][r] = 2, fac[wp][r] = e;
                    b += e;
                }
            }
            if (lse_combine) {
                if (r1 == R) {
                    lse_tot[sl * N + i] = a + logf(b);
                    fin[wp] = 1.0f / b;
                } else {
                    va[slot] = a;
                    vb[slot] = b;
                }
            }
        }
        __syncwarp();
        float *y = out + (sl * N + i) * (long long)M;
        for (int c = lane; c < M; c += 32) {
            float acc = r0 > 0 ? y[c] : 0.0f;
            for (int r = r0; r < r1; r++) {
                const long long g = sl * R + r - seg0;
                const float o = O[(g * Lg + gr + trow[wp][r]) * M + c];
                if (!lse_combine) acc += wmean * o;
                else if (kind[wp][r] == 0) acc = o;
                else if (kind[wp][r] == 1) acc = acc * fac[wp][r] + o;
                else acc += fac[wp][r] * o;
            }
            if (lse_combine && r1 == R) {
                acc *= fin[wp];
                saved_out[(sl * N + i) * (long long)M + c] = acc;
            }
            y[c] = acc;
        }
        __syncwarp();
    }
}

/* delta_i = dout_i . out_i (saved combined output), per touched slice, into slots. */
__global__ void delta_kernel(const float *dout, const float *saved_out, int N, int M, int L, long long sl0,
                             long long nsl, long long slots, float *delta) {
    GRID_LOOP(e, nsl * L) {
        const long long sl = sl0 + e / L;
        const int i = (int)(e % L);
        const float *a = dout + (sl * N + i) * (long long)M, *b = saved_out + (sl * N + i) * (long long)M;
        double acc = 0;
        for (int c = 0; c < M; c++) acc += (double)a[c] * b[c];
        delta[(sl % slots) * N + i] = (float)acc;
    }
}

/* Backward: a warp per (touched slice, position < L) collects its gradients from the
 * group's rounds in order (see the top of the file). */
__global__ void grad_kernel(float *dq, float *dv, const float *q, const float *nrm, const float *invn, const float *dQ,
                            const float *dKw, const float *dVw, const int32_t *inv, long long seg0, long long nseg,
                            int R, int N, int D, int M, lsh_chunks k, long long slots) {
    __shared__ float kdot[WARPS][MAX_ROUNDS];
    __shared__ int trow[WARPS][MAX_ROUNDS];
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, L = k.L, gr = k.off * k.C;
    const long long nitems = touched_slices(seg0, nseg, R) * L;
    WARP_LOOP(item, nitems) {
        const seg_item t = seg_item_at(item, seg0, nseg, R, L, N, slots);
        const long long sl = t.sl, slot = t.slot;
        const int i = t.i, r0 = t.r0, r1 = t.r1;
        const float iv = invn[slot];
        const bool through = nrm[slot] > ATTN_LSH_NORM_FLOOR; /* k = q / |q| (else q / floor) */
        const float *x = q + (sl * N + i) * (long long)D;
        /* k . g for each round: g = key gradient rows of the own chunk (keys [C, 2C) of
         * its block) and of the next chunk (keys [0, C) of the next block) */
        for (int r = r0; r < r1; r++) {
            const long long g = sl * R + r - seg0;
            const int t = inv[g * N + i], c = t / k.C, tl = t - c * k.C;
            const long long b = g * k.vc + c;
            const float *g1 = dKw + (b * k.W + gr + tl) * (long long)D;
            const float *g2 = c + 1 < k.nc ? dKw + ((b + 1) * k.W + tl) * (long long)D : NULL;
            double acc = 0;
            if (through)
                for (int d = lane; d < D; d += 32) {
                    const float gd = g2 ? g1[d] + g2[d] : g1[d];
                    acc += (double)(x[d] * iv) * gd;
                }
            acc = warp_sum_d(acc);
            if (lane == 0) {
                kdot[wp][r] = (float)acc;
                trow[wp][r] = t;
            }
        }
        __syncwarp();
        float *yq = dq + (sl * N + i) * (long long)D;
        for (int d = lane; d < D; d += 32) {
            const float kd = x[d] * iv;
            float acc = r0 > 0 ? yq[d] : 0.0f;
            for (int r = r0; r < r1; r++) {
                const long long g = sl * R + r - seg0;
                const int t = trow[wp][r], c = t / k.C, tl = t - c * k.C;
                const long long b = g * k.vc + c;
                float gd = dKw[(b * k.W + gr + tl) * (long long)D + d];
                if (c + 1 < k.nc) gd += dKw[((b + 1) * k.W + tl) * (long long)D + d];
                acc += dQ[(g * k.Lg + gr + t) * (long long)D + d];
                acc += through ? (gd - kd * kdot[wp][r]) * iv : gd * iv;
            }
            yq[d] = acc;
        }
        float *yv = dv + (sl * N + i) * (long long)M;
        for (int m = lane; m < M; m += 32) {
            float acc = r0 > 0 ? yv[m] : 0.0f;
            for (int r = r0; r < r1; r++) {
                const long long g = sl * R + r - seg0;
                const int t = trow[wp][r], c = t / k.C, tl = t - c * k.C;
                const long long b = g * k.vc + c;
                acc += dVw[(b * k.W + gr + tl) * (long long)M + m];
                if (c + 1 < k.nc) acc += dVw[((b + 1) * k.W + tl) * (long long)M + m];
            }
            yv[m] = acc;
        }
        __syncwarp();
    }
}

/* ---- host side ---- */

static unsigned grid_for(long long n) { return ab_cuda_grid(n, THREADS, MAX_BLOCKS); }
static unsigned warp_grid_for(long long n) { return ab_cuda_grid(n, WARPS, MAX_BLOCKS); }

static int make_rotations(const attn *a, const lsh_plan *p, float *rot) {
    const long long per = (long long)p->D * p->bits, total = per * p->R;
    AB_LAUNCH(rot_kernel, grid_for(total), THREADS, 0, ab_cuda_stream(), rot, a->seed, per, total);
    return 0;
}

/* Norms of the slices a group touches, then its buckets: as sort keys (keys != NULL)
 * or into buckets. q: the run's first slice. */
static int hash_group(const lsh_plan *p, const lsh_ws *w, const float *q, int L, long long seg0, long long nseg,
                      uint32_t *keys, int32_t *vals, int *buckets, long long bh0) {
    const long long sl_a = seg0 / p->R, nsl = (seg0 + nseg - 1) / p->R - sl_a + 1;
    AB_LAUNCH(norms_kernel, grid_for(nsl * L), THREADS, 0, ab_cuda_stream(), q, p->N, p->D, L, sl_a, nsl, p->slots,
              w->nrm, w->invn);
    AB_LAUNCH(hash_kernel, grid_for(nseg * L), THREADS, 0, ab_cuda_stream(), q, (const float *)w->invn,
              (const float *)w->rot, p->N, p->D, L, p->R, p->bits, seg0, nseg, p->slots, keys, vals, buckets, bh0,
              p->BH);
    return 0;
}

static int gather(const lsh_plan *p, const lsh_chunks *k, float *dst, const float *src, int width, const int32_t *perm,
                  const float *invn, long long seg0, long long nseg) {
    const long long n = nseg * k->Lg * width;
    AB_LAUNCH(gather_kernel, grid_for(n), THREADS, 0, ab_cuda_stream(), dst, src, width, perm, invn, seg0, nseg, p->R,
              p->N, k->L, k->Lg, k->off * k->C, p->slots);
    return 0;
}

struct saved_ptrs {
    int32_t *perm;
    float *lse, *lse_tot, *out;
};

static saved_ptrs saved_of(const lsh_plan *p, const void *saved) {
    attn_lsh_saved_layout l = attn_lsh_saved((size_t)p->BH, p->R, p->N, p->M, p->lse_combine);
    char *b = (char *)(uintptr_t)saved;
    saved_ptrs s;
    s.perm = (int32_t *)(b + l.perm);
    s.lse = (float *)(b + l.lse);
    s.lse_tot = p->lse_combine ? (float *)(b + l.lse_tot) : NULL;
    s.out = p->lse_combine ? (float *)(b + l.out) : NULL;
    return s;
}

extern "C" int lsh_cuda_check_shape(const attn *a, const attn_shape *s) {
    if (a->p.rounds > MAX_ROUNDS) /* the kernels keep per-round values in shared memory */
        return ab_fail(AB_EINVAL, "lsh (cuda): rounds=%d is above %d", a->p.rounds, MAX_ROUNDS);
    lsh_plan p = plan_of(a, s);
    /* the workspace must be addressable (checked in double before any size_t product) */
    const double vec = 4.0 * (double)p.slots * p.N * 4 + 4.0 * p.R * (double)p.D * p.bits;
    const double area = (double)p.segs * (seg_bytes(&p, false) > seg_bytes(&p, true) ? seg_bytes(&p, false)
                                                                                       : seg_bytes(&p, true));
    const double rows = (double)p.segs * (double)p.kN.Lg * (p.D > p.M ? p.D : p.M);
    if (vec + area > (double)SIZE_MAX / 4 || rows > 9.0e18)
        return ab_fail(AB_EINVAL, "lsh (cuda): shape N=%d D=%d M=%d with chunk=%d rounds=%d bits=%d needs more memory "
                       "than can be addressed", s->len, s->qk_dim, s->v_dim, a->p.chunk, a->p.rounds, a->p.bits);
    return plan_cub(&p);
}

extern "C" size_t lsh_cuda_workspace_bytes(const attn *a, const attn_shape *s) {
    lsh_plan p = plan_of(a, s);
    if (plan_cub(&p)) return SIZE_MAX; /* reported by lsh_cuda_check_shape before we get here */
    return ws_total(&p);
}

extern "C" int lsh_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                float *out, void *saved) {
    (void)k; /* shared query/key: keys are the normalised queries */
    lsh_plan p = plan_of(a, s);
    AB_TRY(plan_cub(&p));
    lsh_ws w;
    AB_TRY(ws_of(a, &p, &w));
    const saved_ptrs sv = saved_of(&p, saved);
    const int N = p.N, D = p.D, M = p.M, R = p.R;
    const long long ND = (long long)N * D, NM = (long long)N * M;
    const float scale = (float)attn_scale(a, D), wmean = 1.0f / (float)R;
    AB_TRY(make_rotations(a, &p, w.rot));
    return attn_cuda_runs(s, {{out, M, false}}, [&](long long s0, long long ns, int L) {
        const lsh_chunks ck = chunks_of(L, p.chunk);
        carve_forward(&p, &ck, w.area, &w);
        const float *qr = q + s0 * ND, *vr = v + s0 * NM;
        float *outr = out + s0 * NM;
        int32_t *perm_r = sv.perm + s0 * R * N;
        float *lse_r = sv.lse + s0 * R * N;
        for (long long seg0 = 0; seg0 < ns * R; seg0 += p.segs) {
            const long long nseg = ns * R - seg0 < p.segs ? ns * R - seg0 : p.segs, n = nseg * L;
            AB_TRY(hash_group(&p, &w, qr, L, seg0, nseg, w.keys, w.vals, NULL, 0));
            /* stable sort by (segment, bucket): positions stay in order within a bucket */
            const int key_bits = bits_for((unsigned long long)nseg * p.nb);
            size_t need = 0;
            AB_TRY(cub_temp_bytes(n, key_bits, &need));
            if (need > w.cub_bytes)
                return ab_fail(AB_EDEVICE, "lsh (cuda): CUB needs %zu bytes of temporary storage, %zu reserved", need,
                               w.cub_bytes);
            size_t tb = w.cub_bytes;
            AB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(w.cub, tb, (const uint32_t *)w.keys, w.keys_out,
                                                          (const int32_t *)w.vals, w.vals_out, (int)n, 0, key_bits,
                                                          ab_cuda_stream()));
            int32_t *perm_g = perm_r + seg0 * N;
            AB_LAUNCH(perm_kernel, grid_for(n), THREADS, 0, ab_cuda_stream(), (const int32_t *)w.vals_out, nseg, L, N,
                      perm_g, w.inv);
            AB_TRY(gather(&p, &ck, w.Q, qr, D, perm_g, NULL, seg0, nseg));
            AB_TRY(gather(&p, &ck, w.K, qr, D, perm_g, w.invn, seg0, nseg));
            AB_TRY(gather(&p, &ck, w.V, vr, M, perm_g, NULL, seg0, nseg));
            const long long nb = ck.nbatch_of(nseg), C = ck.C, W = ck.W, qo = (long long)ck.off * C;
            /* S = scale Q_c K_win^T   (C, W) per chunk */
            AB_TRY(ab_cuda_sgemm_batched(false, true, ck.C, ck.W, D, scale, w.Q + qo * D, D, C * D, w.K, D, C * D,
                                         0.0f, w.S, ck.W, C * W, nb));
            AB_LAUNCH(rows_forward_kernel, warp_grid_for(nb * C), THREADS, 0, ab_cuda_stream(), w.S,
                      (const int32_t *)perm_g, lse_r + seg0 * N, nb * C, ck, N, (int)s->causal);
            /* O_c = P V_win   (C, M) per chunk */
            AB_TRY(ab_cuda_sgemm_batched(false, false, ck.C, M, ck.W, 1.0f, w.S, ck.W, C * W, w.V, M, C * M, 0.0f,
                                         w.O + qo * M, M, C * M, nb));
            const long long nitems = touched_slices(seg0, nseg, R) * L;
            AB_LAUNCH(combine_kernel, warp_grid_for(nitems), THREADS, 0, ab_cuda_stream(), outr,
                      p.lse_combine ? sv.out + s0 * NM : (float *)NULL, p.lse_combine ? sv.lse_tot + s0 * N : (float *)NULL,
                      (const float *)w.O, (const int32_t *)w.inv, (const float *)lse_r, w.va, w.vb, seg0, nseg, R, N,
                      M, L, ck.Lg, ck.off * ck.C, p.slots, (int)p.lse_combine, wmean);
        }
        return 0;
    });
}

extern "C" int lsh_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                 const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    (void)k;
    lsh_plan p = plan_of(a, s);
    lsh_ws w;
    AB_TRY(ws_of(a, &p, &w));
    const saved_ptrs sv = saved_of(&p, saved);
    const int N = p.N, D = p.D, M = p.M, R = p.R;
    const long long ND = (long long)N * D, NM = (long long)N * M;
    const float scale = (float)attn_scale(a, D), wmean = 1.0f / (float)R;
    /* keys are the normalised queries: nothing flows to k */
    return attn_cuda_runs(s, {{dk, D, true}, {dq, D, false}, {dv, M, false}}, [&](long long s0, long long ns, int L) {
        const lsh_chunks ck = chunks_of(L, p.chunk);
        carve_backward(&p, &ck, w.area, &w);
        const float *qr = q + s0 * ND, *vr = v + s0 * NM, *dor = dout + s0 * NM;
        const int32_t *perm_r = sv.perm + s0 * R * N;
        const float *lse_r = sv.lse + s0 * R * N;
        for (long long seg0 = 0; seg0 < ns * R; seg0 += p.segs) {
            const long long nseg = ns * R - seg0 < p.segs ? ns * R - seg0 : p.segs, n = nseg * L;
            const long long sl_a = seg0 / R, nsl = touched_slices(seg0, nseg, R);
            AB_LAUNCH(norms_kernel, grid_for(nsl * L), THREADS, 0, ab_cuda_stream(), qr, N, D, L, sl_a, nsl, p.slots,
                      w.nrm, w.invn);
            if (p.lse_combine)
                AB_LAUNCH(delta_kernel, grid_for(nsl * L), THREADS, 0, ab_cuda_stream(), dor,
                          (const float *)sv.out + s0 * NM, N, M, L, sl_a, nsl, p.slots, w.va);
            const int32_t *perm_g = perm_r + seg0 * N;
            AB_LAUNCH(inverse_kernel, grid_for(n), THREADS, 0, ab_cuda_stream(), perm_g, nseg, L, N, w.inv);
            AB_TRY(gather(&p, &ck, w.Q, qr, D, perm_g, NULL, seg0, nseg));
            AB_TRY(gather(&p, &ck, w.K, qr, D, perm_g, w.invn, seg0, nseg));
            AB_TRY(gather(&p, &ck, w.V, vr, M, perm_g, NULL, seg0, nseg));
            AB_TRY(gather(&p, &ck, w.dO, dor, M, perm_g, NULL, seg0, nseg));
            const long long nb = ck.nbatch_of(nseg), C = ck.C, W = ck.W, qo = (long long)ck.off * C;
            /* S = scale Q_c K_win^T, dP = dO_c V_win^T   (C, W) per chunk */
            AB_TRY(ab_cuda_sgemm_batched(false, true, ck.C, ck.W, D, scale, w.Q + qo * D, D, C * D, w.K, D, C * D,
                                         0.0f, w.S, ck.W, C * W, nb));
            AB_TRY(ab_cuda_sgemm_batched(false, true, ck.C, ck.W, M, 1.0f, w.dO + qo * M, M, C * M, w.V, M, C * M,
                                         0.0f, w.dP, ck.W, C * W, nb));
            AB_LAUNCH(rows_backward_kernel, warp_grid_for(nb * C), THREADS, 0, ab_cuda_stream(), w.S, w.dP, perm_g,
                      lse_r + seg0 * N, p.lse_combine ? (const float *)sv.lse_tot + s0 * N : (const float *)NULL,
                      (const float *)w.va, seg0, R, p.slots, nb * C, ck, N, (int)s->causal, (int)p.lse_combine, wmean);
            /* dQ_c = scale dS K_win (C, D); dK_win = scale dS^T Q_c (W, D); dV_win = (wP)^T dO_c (W, M) */
            AB_TRY(ab_cuda_sgemm_batched(false, false, ck.C, D, ck.W, scale, w.S, ck.W, C * W, w.K, D, C * D, 0.0f,
                                         w.dQ + qo * D, D, C * D, nb));
            AB_TRY(ab_cuda_sgemm_batched(true, false, ck.W, D, ck.C, scale, w.S, ck.W, C * W, w.Q + qo * D, D, C * D,
                                         0.0f, w.dKw, D, W * D, nb));
            AB_TRY(ab_cuda_sgemm_batched(true, false, ck.W, M, ck.C, 1.0f, w.dP, ck.W, C * W, w.dO + qo * M, M, C * M,
                                         0.0f, w.dVw, M, W * M, nb));
            AB_LAUNCH(grad_kernel, warp_grid_for(nsl * L), THREADS, 0, ab_cuda_stream(), dq + s0 * ND, dv + s0 * NM, qr,
                      (const float *)w.nrm, (const float *)w.invn, (const float *)w.dQ, (const float *)w.dKw,
                      (const float *)w.dVw, (const int32_t *)w.inv, seg0, nseg, R, N, D, M, ck, p.slots);
        }
        return 0;
    });
}

extern "C" int lsh_cuda_buckets(attn *a, const attn_shape *s, const float *q, int *buckets) {
    lsh_plan p = plan_of(a, s);
    lsh_ws w;
    AB_TRY(ws_of(a, &p, &w));
    AB_TRY(make_rotations(a, &p, w.rot));
    const long long ND = (long long)p.N * p.D;
    AB_CUDA_CHECK(cudaMemsetAsync(buckets, 0xff, sizeof(int) * (size_t)p.R * (size_t)p.BH * (size_t)p.N,
                                  ab_cuda_stream())); /* -1: padded positions */
    return attn_cuda_runs(s, {}, [&](long long s0, long long ns, int L) {
        for (long long seg0 = 0; seg0 < ns * p.R; seg0 += p.segs) {
            const long long nseg = ns * p.R - seg0 < p.segs ? ns * p.R - seg0 : p.segs;
            AB_TRY(hash_group(&p, &w, q + s0 * ND, L, seg0, nseg, NULL, NULL, buckets, s0));
        }
        return 0;
    });
}

extern "C" int lsh_cuda_rng(uint64_t seed, uint64_t stream, uint64_t index0, long long n, uint32_t *words,
                            double *normals) {
    if (n <= 0) return 0;
    AB_LAUNCH(rng_test_kernel, grid_for(n), THREADS, 0, ab_cuda_stream(), seed, stream, index0, n, words, normals);
    return 0;
}
