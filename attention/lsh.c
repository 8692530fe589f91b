/* lsh: Reformer LSH attention with shared query/key, as the paper's baseline used
 * it (CPU backend).
 *
 * The formula (the CUDA backend must reproduce it exactly):
 *   keys     k_j = q_j / max(|q_j|, 1e-12) (ATTN_LSH_NORM_FLOOR): the keys are the
 *            normalised queries; the k input is ignored and dk is exactly zero.
 *   scores   s_ij = scale * q_i . k_j
 *   rotation round r (0-based) uses R_r [D x bits] with
 *            R_r[d][j] = ab_rng_normal(seed, stream = r, index = d * bits + j),
 *            shared by every batch row and head.
 *   hash     p = k_i R_r in float32 as a chain of fused multiply-adds in a fixed
 *            order (lsh_hash.h, shared with the CUDA backend: the same buckets bit for
 *            bit, which a BLAS product would not give); bucket = argmax over the 2*bits
 *            values [p_0 .. p_{bits-1}, -p_0 .. -p_{bits-1}], first maximum on ties
 *            (bucket j < bits means +p_j, bits + j means -p_j).
 *   per round, with L = lengths[b] (or N) and only positions [0, L) taking part:
 *            stable sort of positions by (bucket, position); the sorted order is cut
 *            into chunks of `chunk` positions (the last may be shorter); a query in
 *            chunk c attends to the keys of chunks c-1 and c; chunk 0 attends only to
 *            itself (no wrap-around to the last chunk).
 *   masks    causal: key position j > i is masked (original positions). Self: key
 *            j == i is masked unless no other key is allowed for query i; then the
 *            round's output is v_i and its logsumexp is the self score s_ii.
 *   round    o_ri = sum_j P_ij v_j, P = softmax over the allowed keys,
 *            lse_ri = log sum_j exp(s_ij) over the same keys.
 *   combine  mean: out_i = (1/R) sum_r o_ri (the paper's baseline);
 *            logsumexp: out_i = sum_r w_ri o_ri, w_ri = exp(lse_ri) / sum_r' exp(lse_r'i).
 *   padding  query rows i >= L output zero and get zero gradient; keys >= L are
 *            never attended to.
 *
 * Backward is exact for the sampled hashing (buckets are piecewise constant: no
 * gradient flows through them). With w the round weight (1/R or w_ri):
 *   dS_ij = w P_ij (dout_i . v_j - delta_i), delta_i = dout_i . o_ri (mean) or
 *   dout_i . out_i (logsumexp). Derivation for logsumexp: through o_ri the score
 *   s_ij gives w P_ij (dout_i . v_j - dout_i . o_ri); through the weights
 *   (dw_r'/dlse_r = w_r' (1[r = r'] - w_r), dlse_r/ds_ij = P_ij) it gives
 *   w P_ij (dout_i . o_ri - dout_i . out_i); the o_ri terms cancel in the sum.
 *   dq_i += scale sum_j dS_ij k_j; the key side
 *   g_j = scale sum_i dS_ij q_i reaches q_j through the normalisation:
 *   dq_j += (g_j - k_j (k_j . g_j)) / |q_j| (g_j / floor where the norm was floored);
 *   dv_j += sum_r w P_ij dout_i.
 *
 * Saved by forward, O(N * rounds + N * M) per slice: the sorted order (int32) and the
 * per-query logsumexp of every round; for logsumexp also the combined logsumexp per
 * query and the combined output. Backward recomputes the chunk scores.
 *
 * Work: OpenMP over the B*H slices (attn_outer_threads); with fewer slices than
 * threads the slices run one after another and the chunks of a slice spread over the
 * threads instead (chunk products are too small to gain from BLAS threads); backward
 * then runs even chunks, then odd chunks: chunk c writes the rows of chunks c-1 and c,
 * so chunks of one parity never share a row. Workspace: the rotations, a few O(N)
 * vectors per slice in flight, and per thread one set of chunk blocks (queries
 * [chunk x D], keys [2 chunk x D], scores [chunk x 2 chunk], ...). Every product of
 * the attention (scores, outputs, gradients) is an ab_sgemm. No dense N x N mask, no
 * allocation inside a call. The rotations are regenerated from the seed by every
 * forward (rounds * D * bits normals: small next to the attention itself).
 * There is no recurrent mode: generation recomputes, as in the paper.
 * The CUDA backend (lsh_cuda.cu) computes the same formula with the same hashing
 * (lsh_hash.h) and the same saved layout (attn_lsh_saved). */
#include "lsh.h"

#include "cpu_util.h"
#include "lsh_cuda.h"

#include "../harness/error.h"
#include "../harness/rng.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define HASH_ROWS 64 /* rows per hashing block */
#define HASH_TILE 8  /* projections computed together */
#define HASH_ILV 4   /* rows hashed together (project_tile4) */

static const char *const combine_names[] = {"mean", "logsumexp", NULL};

static const attn_option_spec lsh_options[] = {
    {"rounds", ATTN_OPT_INT, offsetof(attn_params, rounds), "1",
     "hashing rounds, 1..64 (the paper uses 1, 4, 8)", NULL, 1, 64, false, NULL},
    {"bits", ATTN_OPT_INT, offsetof(attn_params, bits), "8",
     "random rotations per round, 1..256: 2*bits buckets", NULL, 1, 256, false, NULL},
    {"chunk", ATTN_OPT_INT, offsetof(attn_params, chunk), "32",
     "positions per chunk after sorting, 1..1048576; a chunk attends to itself and the previous one", NULL, 1,
     1 << 20, false, NULL},
    {"combine", ATTN_OPT_CHOICE, offsetof(attn_params, combine), "mean",
     "how rounds combine: mean (uniform, the paper's baseline) or logsumexp (Reformer's weights)", combine_names, 0,
     0, false, NULL},
    {"scale", ATTN_OPT_DOUBLE, offsetof(attn_params, scale), "1/sqrt(D)",
     "score scale, a number in [0, 1e6] or auto for 1/sqrt(D)", NULL, 0, 1e6, true, NULL},
};

static void defaults_lsh(attn_params *p) {
    p->rounds = 1;
    p->bits = 8;
    p->chunk = 32;
    p->combine = ATTN_COMBINE_MEAN;
    p->scale = NAN;
}

/* ---- sizes ---- */

typedef struct {
    int N, D, M, R, bits, nb; /* nb = 2*bits buckets */
    int C, K2;                /* chunk (capped at N), keys per chunk block (capped at N) */
    int BH;
    int slots; /* slices in flight at once: attn_outer_threads(B*H) */
    int inner; /* threads over the chunks of one slice: all of them when slots == 1 */
    int nblk;  /* chunk blocks in the workspace: one per thread */
    bool lse_combine;
} lsh_dims;

static lsh_dims get_dims(const attn *a, const attn_shape *s) {
    lsh_dims d;
    d.N = s->len;
    d.D = s->qk_dim;
    d.M = s->v_dim;
    d.R = a->p.rounds;
    d.bits = a->p.bits;
    d.nb = 2 * a->p.bits;
    d.C = a->p.chunk < s->len ? a->p.chunk : s->len;
    d.K2 = 2 * d.C < s->len ? 2 * d.C : s->len;
    d.BH = s->batch * s->heads;
    d.slots = attn_outer_threads(d.BH);
    /* Fewer slices than threads: slices run one after another and the chunks of a
     * slice spread over the threads (chunk products are too small for BLAS threads). */
    d.inner = d.slots == 1 ? ab_threads() : 1;
    d.nblk = d.slots > d.inner ? d.slots : d.inner;
    d.lse_combine = a->p.combine == ATTN_COMBINE_LOGSUMEXP;
    return d;
}

/* Per-slice vectors, one set per slot. */
typedef struct {
    float *nrm, *invn;    /* [N] |q_j| and 1 / max(|q_j|, floor) */
    float *run_a, *run_b; /* [N] forward: running max / sum of the logsumexp combine; backward: delta */
    int *bucket;          /* [N] */
    int *counts;          /* [2*bits + 1] */
} lsh_vecs;

/* Chunk blocks, one set per thread. */
typedef struct {
    float *hk;                /* [HASH_ROWS x D] normalised queries to hash */
    float *Qc, *Kc, *Vc, *Oc; /* [C x D], [K2 x D], [K2 x M], [C x M] (backward: dout rows) */
    float *S, *P;             /* [C x K2] */
    float *dQc, *dKc, *dVc;   /* [C x D], [K2 x D], [K2 x M] */
} lsh_blk;

#define PIECE(field, type, count)                                                                                      \
    do {                                                                                                               \
        if (base) x->field = (type *)(base + off);                                                                     \
        off += attn_align64(sizeof(type) * (size_t)(count));                                                           \
    } while (0)

/* Carve from base (or only measure when base is NULL); return the bytes. */
static size_t carve_vecs(const lsh_dims *d, char *base, lsh_vecs *x) {
    size_t off = 0, N = (size_t)d->N;
    PIECE(nrm, float, N);
    PIECE(invn, float, N);
    PIECE(run_a, float, N);
    PIECE(run_b, float, N);
    PIECE(bucket, int, N);
    PIECE(counts, int, d->nb + 1);
    return off;
}

static size_t carve_blk(const lsh_dims *d, char *base, lsh_blk *x) {
    size_t off = 0, D = (size_t)d->D, M = (size_t)d->M, C = (size_t)d->C, K2 = (size_t)d->K2;
    PIECE(hk, float, (size_t)HASH_ROWS * D);
    PIECE(Qc, float, C * D);
    PIECE(Kc, float, K2 * D);
    PIECE(Vc, float, K2 * M);
    PIECE(Oc, float, C * M);
    PIECE(S, float, C * K2);
    PIECE(P, float, C * K2);
    PIECE(dQc, float, C * D);
    PIECE(dKc, float, K2 * D);
    PIECE(dVc, float, K2 * M);
    return off;
}
#undef PIECE

static size_t rot_bytes(const lsh_dims *d) { return attn_align64(sizeof(float) * (size_t)d->R * d->D * d->bits); }

/* Workspace: rotations [R][D][bits], then `slots` vector sets, then `nblk` blocks. */
static size_t workspace_lsh(const attn *a, const attn_shape *s) {
    lsh_dims d = get_dims(a, s);
    return rot_bytes(&d) + (size_t)d.slots * carve_vecs(&d, NULL, NULL) + (size_t)d.nblk * carve_blk(&d, NULL, NULL);
}

/* The workspace of one call, carved. */
typedef struct {
    float *rot;
    char *vecs, *blks;
    size_t vec_bytes, blk_bytes;
} lsh_ws;

static lsh_ws ws_of(const attn *a, const lsh_dims *d) {
    lsh_ws w;
    w.rot = (float *)a->ws;
    w.vec_bytes = carve_vecs(d, NULL, NULL);
    w.blk_bytes = carve_blk(d, NULL, NULL);
    w.vecs = (char *)a->ws + rot_bytes(d);
    w.blks = w.vecs + (size_t)d->slots * w.vec_bytes;
    return w;
}

static lsh_vecs vecs_at(const lsh_dims *d, const lsh_ws *w, int slot) {
    lsh_vecs x = {0};
    carve_vecs(d, w->vecs + (size_t)slot * w->vec_bytes, &x);
    return x;
}

/* The block of the calling thread: inside a chunk loop over `inner` threads it is
 * that thread's; in a serialised inner loop it is the slice slot's. */
static lsh_blk blk_here(const lsh_dims *d, const lsh_ws *w, int slot) {
    lsh_blk x = {0};
    int i = d->inner > 1 ? omp_get_thread_num() : slot;
    carve_blk(d, w->blks + (size_t)i * w->blk_bytes, &x);
    return x;
}

typedef struct {
    int32_t *perm; /* [BH][R][N] sorted order of each round (first L entries used) */
    float *lse;    /* [BH][R][N] logsumexp of each round per query */
    float *lse_tot; /* [BH][N] logsumexp over rounds (logsumexp combine only) */
    float *out;     /* [BH][N][M] combined output (logsumexp combine only) */
} lsh_saved;

attn_lsh_saved_layout attn_lsh_saved(size_t BH, int rounds, int N, int M, bool lse_combine) {
    attn_lsh_saved_layout l;
    size_t per = BH * (size_t)rounds * (size_t)N;
    l.perm = 0;
    l.lse = attn_align64(sizeof(int32_t) * per);
    l.lse_tot = l.lse + attn_align64(sizeof(float) * per);
    l.out = l.bytes = l.lse_tot;
    if (lse_combine) {
        l.out = l.lse_tot + attn_align64(sizeof(float) * BH * (size_t)N);
        l.bytes = l.out + attn_align64(sizeof(float) * BH * (size_t)N * (size_t)M);
    }
    return l;
}

static size_t saved_layout(const lsh_dims *d, char *base, lsh_saved *v) {
    attn_lsh_saved_layout l = attn_lsh_saved((size_t)d->BH, d->R, d->N, d->M, d->lse_combine);
    if (base) {
        v->perm = (int32_t *)(base + l.perm);
        v->lse = (float *)(base + l.lse);
        v->lse_tot = d->lse_combine ? (float *)(base + l.lse_tot) : NULL;
        v->out = d->lse_combine ? (float *)(base + l.out) : NULL;
    }
    return l.bytes;
}

static size_t saved_lsh(const attn *a, const attn_shape *s) {
    lsh_dims d = get_dims(a, s);
    return saved_layout(&d, NULL, NULL);
}

static int check_lsh(const attn *a, const attn_shape *s) {
    /* Every buffer size must fit in size_t with room to spare; check in double. */
    lsh_dims d = get_dims(a, s);
    double C = d.C, K2 = d.K2, N = d.N, Dd = d.D, M = d.M;
    double vecs = 4.0 * (6 * N + 2 * d.nb) + 64.0 * 6;
    double blk = 4.0 * (HASH_ROWS * Dd + 2 * C * (Dd + M) + 2 * K2 * (Dd + M) + 2 * C * K2) + 64.0 * 10;
    double ws = 4.0 * d.R * Dd * d.bits + (double)d.slots * vecs + (double)d.nblk * blk;
    double saved = 8.0 * d.BH * d.R * N + 4.0 * d.BH * N * (M + 1) + 256;
    if (ws > (double)SIZE_MAX / 4 || saved > (double)SIZE_MAX / 4 || N * d.R > (double)INT32_MAX)
        return ab_fail(AB_EINVAL, "lsh: shape N=%d D=%d M=%d with chunk=%d rounds=%d bits=%d needs more memory than "
                       "can be addressed", s->len, s->qk_dim, s->v_dim, a->p.chunk, a->p.rounds, a->p.bits);
    return 0;
}

/* ---- pieces ---- */

/* R [rounds][D][bits] from the seed (formula at the top of the file). */
static void make_rotations(const attn *a, const lsh_dims *d, float *rot) {
    size_t per = (size_t)d->D * d->bits, total = per * d->R;
    int64_t n = (int64_t)total;
#pragma omp parallel for schedule(static) num_threads(ab_threads()) if (n > 4096)
    for (int64_t e = 0; e < n; e++) {
        size_t r = (size_t)e / per, idx = (size_t)e % per;
        rot[e] = (float)ab_rng_normal(a->seed, (uint64_t)r, (uint64_t)idx);
    }
}

/* Norms of the valid queries of one slice. */
static void norms(const float *q, int L, int D, float *nrm, float *invn) {
    for (int i = 0; i < L; i++) {
        const float *x = q + (size_t)i * D;
        double ss = 0;
        for (int t = 0; t < D; t++) ss = attn_lsh_sumsq_step(ss, x[t]);
        invn[i] = attn_lsh_inv_norm(ss, &nrm[i]);
    }
}

/* p[u][jj] = projection j0 + jj of the keys k + u D (u < 4 rows of D) on R [D x bits],
 * for jj < HASH_TILE: the fused chains of lsh_hash.h, a tile of projections of 4 rows
 * at once, vectorised across the tile; the rows are independent chains, so their
 * fused multiply-adds overlap instead of waiting on each other (with AVX and FMA
 * explicitly: GCC's own vectorisation of this loop shuffles more than it computes).
 * Rows past nr repeat row 0 (computed and ignored). R has at least j0 + HASH_TILE
 * columns. */
static void project_tile4(const float *restrict k, int nr, const float *restrict R, int D, int bits, int j0,
                          float p[HASH_ILV][HASH_TILE]) {
    const float *restrict k0 = k, *restrict k1 = k + (size_t)(nr > 1 ? 1 : 0) * D;
    const float *restrict k2 = k + (size_t)(nr > 2 ? 2 : 0) * D, *restrict k3 = k + (size_t)(nr > 3 ? 3 : 0) * D;
#if defined(__AVX__) && defined(__FMA__) && HASH_TILE == 8
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int c = 0; c < D; c++) {
        const __m256 rr = _mm256_loadu_ps(R + (size_t)c * bits + j0);
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(k0[c]), rr, a0); /* = attn_lsh_proj_step per lane */
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(k1[c]), rr, a1);
        a2 = _mm256_fmadd_ps(_mm256_set1_ps(k2[c]), rr, a2);
        a3 = _mm256_fmadd_ps(_mm256_set1_ps(k3[c]), rr, a3);
    }
    _mm256_storeu_ps(p[0], a0);
    _mm256_storeu_ps(p[1], a1);
    _mm256_storeu_ps(p[2], a2);
    _mm256_storeu_ps(p[3], a3);
#else
    float a0[HASH_TILE] = {0}, a1[HASH_TILE] = {0}, a2[HASH_TILE] = {0}, a3[HASH_TILE] = {0};
    for (int c = 0; c < D; c++) {
        const float *restrict rr = R + (size_t)c * bits + j0;
        const float c0 = k0[c], c1 = k1[c], c2 = k2[c], c3 = k3[c];
        for (int jj = 0; jj < HASH_TILE; jj++) {
            a0[jj] = attn_lsh_proj_step(a0[jj], c0, rr[jj]);
            a1[jj] = attn_lsh_proj_step(a1[jj], c1, rr[jj]);
            a2[jj] = attn_lsh_proj_step(a2[jj], c2, rr[jj]);
            a3[jj] = attn_lsh_proj_step(a3[jj], c3, rr[jj]);
        }
    }
    for (int jj = 0; jj < HASH_TILE; jj++) p[0][jj] = a0[jj], p[1][jj] = a1[jj], p[2][jj] = a2[jj], p[3][jj] = a3[jj];
#endif
}

/* The same for a partial tile (nj < HASH_TILE projections left). */
static void project_tail(const float *k, int nr, const float *R, int D, int bits, int j0, int nj,
                         float p[HASH_ILV][HASH_TILE]) {
    for (int u = 0; u < HASH_ILV; u++) {
        const float *ku = k + (size_t)(u < nr ? u : 0) * D;
        for (int jj = 0; jj < nj; jj++) {
            float acc = 0.0f;
            for (int c = 0; c < D; c++) acc = attn_lsh_proj_step(acc, ku[c], R[(size_t)c * bits + j0 + jj]);
            p[u][jj] = acc;
        }
    }
}

/* Buckets of positions [i0, i0 + nr) (nr <= HASH_ROWS) for rotation R [D x bits]. */
static void hash_rows(const float *q, const float *invn, int i0, int nr, int D, int bits, const float *R,
                      const lsh_blk *w, int *bucket) {
    for (int t = 0; t < nr; t++) {
        const float *x = q + (size_t)(i0 + t) * D;
        float sc = invn[i0 + t];
        for (int c = 0; c < D; c++) w->hk[(size_t)t * D + c] = x[c] * sc;
    }
    for (int t0 = 0; t0 < nr; t0 += HASH_ILV) {
        const int nu = nr - t0 < HASH_ILV ? nr - t0 : HASH_ILV;
        float p[HASH_ILV][HASH_TILE];
        attn_lsh_argmax am[HASH_ILV];
        for (int j0 = 0; j0 < bits; j0 += HASH_TILE) {
            const int nj = bits - j0 < HASH_TILE ? bits - j0 : HASH_TILE;
            if (nj == HASH_TILE) project_tile4(w->hk + (size_t)t0 * D, nu, R, D, bits, j0, p);
            else project_tail(w->hk + (size_t)t0 * D, nu, R, D, bits, j0, nj, p);
            for (int u = 0; u < nu; u++)
                for (int jj = 0; jj < nj; jj++) {
                    if (j0 + jj == 0) am[u] = attn_lsh_argmax_first(p[u][0]);
                    else attn_lsh_argmax_add(&am[u], j0 + jj, p[u][jj]);
                }
        }
        for (int u = 0; u < nu; u++) bucket[i0 + t0 + u] = attn_lsh_argmax_bucket(&am[u], bits);
    }
}

/* Buckets of the valid positions [0, L) of one slice, blocks of rows spread over the
 * inner threads. */
static void hash_slice(const lsh_dims *d, const lsh_ws *ws, int slot, const float *q, const float *invn, int L,
                       const float *R, int *bucket) {
    int nblocks = (L + HASH_ROWS - 1) / HASH_ROWS;
#pragma omp parallel for schedule(static) num_threads(d->inner) if (d->inner > 1 && nblocks > 1)
    for (int hb = 0; hb < nblocks; hb++) {
        lsh_blk w = blk_here(d, ws, slot);
        int i0 = hb * HASH_ROWS, nr = L - i0 < HASH_ROWS ? L - i0 : HASH_ROWS;
        hash_rows(q, invn, i0, nr, d->D, d->bits, R, &w, bucket);
    }
}

/* Stable counting sort of positions [0, L) by bucket. */
static void sort_round(const int *bucket, int L, int nb, int *counts, int32_t *perm) {
    memset(counts, 0, sizeof(int) * (size_t)(nb + 1));
    for (int i = 0; i < L; i++) counts[bucket[i] + 1]++;
    for (int b = 0; b < nb; b++) counts[b + 1] += counts[b];
    for (int i = 0; i < L; i++) perm[counts[bucket[i]]++] = i;
}

/* dst[t] = src[idx[t]] * (mul ? mul[idx[t]] : 1), rows of width w. */
static void gather(float *dst, const float *src, const int32_t *idx, int n, int w, const float *mul) {
    for (int t = 0; t < n; t++) {
        const float *x = src + (size_t)idx[t] * w;
        float *y = dst + (size_t)t * w;
        if (mul) {
            float sc = mul[idx[t]];
            for (int c = 0; c < w; c++) y[c] = x[c] * sc;
        } else
            memcpy(y, x, sizeof(float) * (size_t)w);
    }
}

static inline bool masked(int j, int i, bool causal) { return j == i || (causal && j > i); }

/* Whether query i has an allowed key other than itself among kp[0..ck). */
static bool has_other(const int32_t *kp, int ck, int i, bool causal) {
    for (int u = 0; u < ck; u++)
        if (!masked(kp[u], i, causal)) return true;
    return false;
}

/* Everything one chunk needs: the slice's inputs, the round's order, the vectors. */
typedef struct {
    const lsh_dims *d;
    int chunk, L, r;
    bool causal;
    float scale;
    const float *q, *v, *dout;
    float *out, *dq, *dv;
    const int32_t *perm;
    float *lse;           /* this round's logsumexp per query */
    const float *lse_tot; /* logsumexp over rounds (logsumexp combine) */
    const lsh_vecs *x;
} lsh_job;

/* Chunk c of the sorted order: queries [*qs, *qe), keys [*ks, *qe). */
static void chunk_range(int c, int chunk, int L, int *qs, int *qe, int *ks) {
    *qs = c * chunk;
    *qe = *qs + chunk < L ? *qs + chunk : L;
    *ks = c > 0 ? *qs - chunk : 0;
}

/* ---- forward ---- */

/* One chunk of one round: scores, softmax with masks and self rule, output, and
 * its share of the combine (query rows of a chunk are its own: no races). */
static void forward_chunk(const lsh_job *j, int c, const lsh_blk *w) {
    const lsh_dims *d = j->d;
    const int D = d->D, M = d->M, R = d->R;
    int qs, qe, ks;
    chunk_range(c, j->chunk, j->L, &qs, &qe, &ks);
    int cq = qe - qs, ck = qe - ks;
    const int32_t *perm = j->perm, *kp = perm + ks;
    gather(w->Qc, j->q, perm + qs, cq, D, NULL);
    gather(w->Kc, j->q, kp, ck, D, j->x->invn);
    gather(w->Vc, j->v, kp, ck, M, NULL);
    /* S = scale Qc Kc^T   (cq, ck) */
    ab_sgemm(false, true, cq, ck, D, j->scale, w->Qc, D, w->Kc, D, 0.0f, w->S, ck);
    for (int t = 0; t < cq; t++) {
        int i = perm[qs + t], self = qs + t - ks;
        float *srow = w->S + (size_t)t * ck;
        if (!has_other(kp, ck, i, j->causal)) {
            j->lse[i] = srow[self];
            memset(srow, 0, sizeof(float) * (size_t)ck);
            srow[self] = 1.0f;
            continue;
        }
        float m = -INFINITY;
        for (int u = 0; u < ck; u++)
            if (!masked(kp[u], i, j->causal) && srow[u] > m) m = srow[u];
        double sum = 0;
        for (int u = 0; u < ck; u++) {
            float e = masked(kp[u], i, j->causal) ? 0.0f : expf(srow[u] - m);
            srow[u] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int u = 0; u < ck; u++) srow[u] *= inv;
        j->lse[i] = (float)(m + log(sum));
    }
    /* Oc = P Vc   (cq, M) */
    ab_sgemm(false, false, cq, M, ck, 1.0f, w->S, ck, w->Vc, M, 0.0f, w->Oc, M);
    float *run_a = j->x->run_a, *run_b = j->x->run_b;
    for (int t = 0; t < cq; t++) {
        int i = perm[qs + t];
        const float *o = w->Oc + (size_t)t * M;
        float *y = j->out + (size_t)i * M;
        if (!d->lse_combine) {
            float wr = 1.0f / (float)R;
            for (int c2 = 0; c2 < M; c2++) y[c2] += wr * o[c2];
        } else if (j->r == 0) {
            /* online softmax over rounds: run_a = max lse, run_b = sum exp(lse - max) */
            run_a[i] = j->lse[i];
            run_b[i] = 1.0f;
            memcpy(y, o, sizeof(float) * (size_t)M);
        } else {
            float l = j->lse[i], mx = run_a[i];
            if (l > mx) {
                float f = expf(mx - l);
                for (int c2 = 0; c2 < M; c2++) y[c2] = y[c2] * f + o[c2];
                run_b[i] = run_b[i] * f + 1.0f;
                run_a[i] = l;
            } else {
                float e = expf(l - mx);
                for (int c2 = 0; c2 < M; c2++) y[c2] += e * o[c2];
                run_b[i] += e;
            }
        }
    }
}

static void forward_slice(const attn *a, const lsh_dims *d, const attn_shape *s, int bh, int slot, const lsh_ws *ws,
                          const lsh_saved *sv, const float *q, const float *v, float *out) {
    const int N = d->N, D = d->D, M = d->M, R = d->R, chunk = a->p.chunk;
    const int L = attn_valid_len(s, bh / s->heads);
    memset(out, 0, sizeof(float) * (size_t)N * M);
    if (L == 0) return;
    lsh_vecs x = vecs_at(d, ws, slot);
    norms(q, L, D, x.nrm, x.invn);
    lsh_job j = {.d = d, .chunk = chunk, .L = L, .causal = s->causal, .scale = (float)attn_scale(a, D),
                 .q = q, .v = v, .out = out, .x = &x};
    const int nchunks = (L + chunk - 1) / chunk;
    for (int r = 0; r < R; r++) {
        int32_t *perm = sv->perm + ((size_t)bh * R + r) * N;
        j.r = r;
        j.perm = perm;
        j.lse = sv->lse + ((size_t)bh * R + r) * N;
        hash_slice(d, ws, slot, q, x.invn, L, ws->rot + (size_t)r * D * d->bits, x.bucket);
        sort_round(x.bucket, L, d->nb, x.counts, perm);
#pragma omp parallel for schedule(static) num_threads(d->inner) if (d->inner > 1 && nchunks > 1)
        for (int c = 0; c < nchunks; c++) {
            lsh_blk w = blk_here(d, ws, slot);
            forward_chunk(&j, c, &w);
        }
    }
    if (d->lse_combine) {
        float *lt = sv->lse_tot + (size_t)bh * N;
        for (int i = 0; i < L; i++) {
            float inv = 1.0f / x.run_b[i];
            float *y = out + (size_t)i * M;
            for (int c = 0; c < M; c++) y[c] *= inv;
            lt[i] = x.run_a[i] + logf(x.run_b[i]);
        }
        memcpy(sv->out + (size_t)bh * N * M, out, sizeof(float) * (size_t)N * M);
    }
}

static int forward_lsh(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                       void *saved) {
    (void)k; /* shared query/key: keys are the normalised queries */
    lsh_dims d = get_dims(a, s);
    lsh_saved sv;
    saved_layout(&d, saved, &sv);
    lsh_ws ws = ws_of(a, &d);
    make_rotations(a, &d, ws.rot);
#pragma omp parallel for schedule(dynamic) num_threads(d.slots) if (d.slots > 1)
    for (int bh = 0; bh < d.BH; bh++) {
        int slot = d.slots > 1 ? omp_get_thread_num() : 0;
        forward_slice(a, &d, s, bh, slot, &ws, &sv, q + attn_slice(s, bh, d.D), v + attn_slice(s, bh, d.M),
                      out + attn_slice(s, bh, d.M));
    }
    return 0;
}

/* ---- backward ---- */

/* One chunk of one round: recomputed scores and probabilities, dS, and the products
 * into dq (query rows of chunk c, key rows of chunks c-1 and c) and dv (key rows).
 * Chunks of one parity touch disjoint rows, so each parity runs in parallel. */
static void backward_chunk(const lsh_job *j, int c, const lsh_blk *w) {
    const lsh_dims *d = j->d;
    const int D = d->D, M = d->M, R = d->R;
    int qs, qe, ks;
    chunk_range(c, j->chunk, j->L, &qs, &qe, &ks);
    int cq = qe - qs, ck = qe - ks;
    const int32_t *perm = j->perm, *kp = perm + ks;
    const float *lse = j->lse, *invn = j->x->invn, *nrm = j->x->nrm, *delta_tot = j->x->run_a;
    gather(w->Qc, j->q, perm + qs, cq, D, NULL);
    gather(w->Kc, j->q, kp, ck, D, invn);
    gather(w->Vc, j->v, kp, ck, M, NULL);
    gather(w->Oc, j->dout, perm + qs, cq, M, NULL);
    /* S = scale Qc Kc^T, dP = dOc Vc^T   (cq, ck) */
    ab_sgemm(false, true, cq, ck, D, j->scale, w->Qc, D, w->Kc, D, 0.0f, w->S, ck);
    ab_sgemm(false, true, cq, ck, M, 1.0f, w->Oc, M, w->Vc, M, 0.0f, w->P, ck);
    for (int t = 0; t < cq; t++) {
        int i = perm[qs + t], self = qs + t - ks;
        float *srow = w->S + (size_t)t * ck, *prow = w->P + (size_t)t * ck;
        float wr = d->lse_combine ? expf(lse[i] - j->lse_tot[i]) : 1.0f / (float)R;
        bool other = has_other(kp, ck, i, j->causal);
        /* probabilities into srow */
        for (int u = 0; u < ck; u++) {
            if (!other) srow[u] = u == self ? 1.0f : 0.0f;
            else srow[u] = masked(kp[u], i, j->causal) ? 0.0f : expf(srow[u] - lse[i]);
        }
        float delta;
        if (d->lse_combine) delta = delta_tot[i];
        else {
            double acc = 0;
            for (int u = 0; u < ck; u++) acc += (double)srow[u] * prow[u];
            delta = (float)acc;
        }
        /* srow <- dS = w P (dP - delta); prow <- w P */
        for (int u = 0; u < ck; u++) {
            float wp = wr * srow[u];
            srow[u] = wp * (prow[u] - delta);
            prow[u] = wp;
        }
    }
    /* dQc = scale dS Kc (cq, D); dKc = scale dS^T Qc (ck, D); dVc = (wP)^T dOc (ck, M) */
    ab_sgemm(false, false, cq, D, ck, j->scale, w->S, ck, w->Kc, D, 0.0f, w->dQc, D);
    ab_sgemm(true, false, ck, D, cq, j->scale, w->S, ck, w->Qc, D, 0.0f, w->dKc, D);
    ab_sgemm(true, false, ck, M, cq, 1.0f, w->P, ck, w->Oc, M, 0.0f, w->dVc, M);
    for (int t = 0; t < cq; t++) {
        float *y = j->dq + (size_t)perm[qs + t] * D;
        const float *g = w->dQc + (size_t)t * D;
        for (int c2 = 0; c2 < D; c2++) y[c2] += g[c2];
    }
    for (int u = 0; u < ck; u++) {
        int jj = kp[u];
        const float *g = w->dKc + (size_t)u * D, *kj = w->Kc + (size_t)u * D;
        float *y = j->dq + (size_t)jj * D;
        float iv = invn[jj];
        if (nrm[jj] > ATTN_LSH_NORM_FLOOR) { /* through k = q / |q| */
            double ug = 0;
            for (int c2 = 0; c2 < D; c2++) ug += (double)kj[c2] * g[c2];
            float f = (float)ug;
            for (int c2 = 0; c2 < D; c2++) y[c2] += (g[c2] - kj[c2] * f) * iv;
        } else /* floored norm: k = q / floor */
            for (int c2 = 0; c2 < D; c2++) y[c2] += g[c2] * iv;
        float *z = j->dv + (size_t)jj * M;
        const float *gv = w->dVc + (size_t)u * M;
        for (int c2 = 0; c2 < M; c2++) z[c2] += gv[c2];
    }
}

static void backward_slice(const attn *a, const lsh_dims *d, const attn_shape *s, int bh, int slot,
                           const lsh_ws *ws, const lsh_saved *sv, const float *q, const float *v, const float *dout,
                           float *dq, float *dv) {
    const int N = d->N, D = d->D, M = d->M, R = d->R, chunk = a->p.chunk;
    const int L = attn_valid_len(s, bh / s->heads);
    memset(dq, 0, sizeof(float) * (size_t)N * D);
    memset(dv, 0, sizeof(float) * (size_t)N * M);
    if (L == 0) return;
    lsh_vecs x = vecs_at(d, ws, slot);
    norms(q, L, D, x.nrm, x.invn);
    if (d->lse_combine) { /* delta_i = dout_i . out_i, into run_a */
        const float *o = sv->out + (size_t)bh * N * M;
        for (int i = 0; i < L; i++) {
            double acc = 0;
            for (int c = 0; c < M; c++) acc += (double)dout[(size_t)i * M + c] * o[(size_t)i * M + c];
            x.run_a[i] = (float)acc;
        }
    }
    lsh_job j = {.d = d, .chunk = chunk, .L = L, .causal = s->causal, .scale = (float)attn_scale(a, D),
                 .q = q, .v = v, .dout = dout, .dq = dq, .dv = dv, .x = &x,
                 .lse_tot = d->lse_combine ? sv->lse_tot + (size_t)bh * N : NULL};
    const int nchunks = (L + chunk - 1) / chunk;
    for (int r = 0; r < R; r++) {
        j.r = r;
        j.perm = sv->perm + ((size_t)bh * R + r) * N;
        j.lse = sv->lse + ((size_t)bh * R + r) * N;
        for (int parity = 0; parity < 2; parity++) {
#pragma omp parallel for schedule(static) num_threads(d->inner) if (d->inner > 1 && nchunks > 2)
            for (int c = parity; c < nchunks; c += 2) {
                lsh_blk w = blk_here(d, ws, slot);
                backward_chunk(&j, c, &w);
            }
        }
    }
}

static int backward_lsh(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                        const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    (void)k;
    lsh_dims d = get_dims(a, s);
    lsh_saved sv;
    saved_layout(&d, (char *)(uintptr_t)saved, &sv);
    lsh_ws ws = ws_of(a, &d);
    memset(dk, 0, sizeof(float) * (size_t)d.BH * d.N * d.D); /* keys are the normalised queries */
#pragma omp parallel for schedule(dynamic) num_threads(d.slots) if (d.slots > 1)
    for (int bh = 0; bh < d.BH; bh++) {
        int slot = d.slots > 1 ? omp_get_thread_num() : 0;
        backward_slice(a, &d, s, bh, slot, &ws, &sv, q + attn_slice(s, bh, d.D), v + attn_slice(s, bh, d.M),
                       dout + attn_slice(s, bh, d.M), dq + attn_slice(s, bh, d.D), dv + attn_slice(s, bh, d.M));
    }
    return 0;
}

/* ---- buckets, for tests (and the CUDA backend's, lsh_cuda.cu) ---- */

int attn_lsh_buckets(attn *a, const attn_shape *s, const float *q, int *buckets) {
    if (!a || !s || !q || !buckets) return ab_fail(AB_EINVAL, "attn_lsh_buckets: NULL argument");
    if (a->v != &attn_variant_lsh) return ab_fail(AB_EINVAL, "attn_lsh_buckets: variant '%s' is not lsh", a->v->name);
    int rc = attn_reserve(a, s);
    if (rc) return rc;
#ifdef ATTNBENCH_HAVE_CUDA
    if (a->device == AB_DEV_CUDA) return lsh_cuda_buckets(a, s, q, buckets);
#endif
    if (a->device != AB_DEV_CPU) return ab_fail(AB_EUNSUPPORTED, "attn_lsh_buckets: no such device");
    lsh_dims d = get_dims(a, s);
    lsh_ws ws = ws_of(a, &d);
    make_rotations(a, &d, ws.rot);
#pragma omp parallel for schedule(dynamic) num_threads(d.slots) if (d.slots > 1)
    for (int bh = 0; bh < d.BH; bh++) {
        int slot = d.slots > 1 ? omp_get_thread_num() : 0;
        lsh_vecs x = vecs_at(&d, &ws, slot);
        const float *qs = q + attn_slice(s, bh, d.D);
        int L = attn_valid_len(s, bh / s->heads);
        norms(qs, L, d.D, x.nrm, x.invn);
        for (int r = 0; r < d.R; r++) {
            int *out = buckets + ((size_t)r * d.BH + bh) * d.N;
            hash_slice(&d, &ws, slot, qs, x.invn, L, ws.rot + (size_t)r * d.D * d.bits, out);
            for (int i = L; i < d.N; i++) out[i] = -1;
        }
    }
    return 0;
}

static const attn_backend cpu_lsh = {
    .check_shape = check_lsh,
    .saved_bytes = saved_lsh,
    .workspace_bytes = workspace_lsh,
    .forward = forward_lsh,
    .backward = backward_lsh,
};

#ifdef ATTNBENCH_HAVE_CUDA
static int check_lsh_cuda(const attn *a, const attn_shape *s) {
    int rc = check_lsh(a, s);
    return rc ? rc : lsh_cuda_check_shape(a, s);
}

static const attn_backend cuda_lsh = {
    .check_shape = check_lsh_cuda,
    .saved_bytes = saved_lsh,
    .workspace_bytes = lsh_cuda_workspace_bytes,
    .forward = lsh_cuda_forward,
    .backward = lsh_cuda_backward,
};
#define CUDA_LSH (&cuda_lsh)
#else
#define CUDA_LSH NULL
#endif

/* Not counted (NAN): besides its chunk products, whose sizes are fixed, lsh spends its
 * time hashing and sorting, which are not floating-point products, so a GFLOP/s figure
 * would not compare with the other variants'. */
static double flops(const attn *a, const attn_shape *s, bool backward) {
    (void)a, (void)s, (void)backward;
    return NAN;
}

const attn_variant attn_variant_lsh = {
    .name = "lsh",
    .summary = "Reformer LSH attention with shared query/key: keys are the normalised queries, sorted by hash "
               "bucket, chunked",
    .options = lsh_options,
    .n_options = (int)(sizeof lsh_options / sizeof lsh_options[0]),
    .defaults = defaults_lsh,
    .flops = flops,
    .cpu = &cpu_lsh,
    .cuda = CUDA_LSH,
};
