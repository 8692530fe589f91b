/* The lsh variant (Reformer attention with shared query/key) on the CPU: forward
 * against the double reference given the buckets it computed, the hash against a
 * double recomputation of its formula, the one-chunk equivalence with shared-QK
 * softmax, backward against finite differences, seeds, options, recurrent mode. */
#include <criterion/criterion.h>

#include "attention.h"
#include "lsh.h"
#include "memory.h"
#include "reference.h"
#include "rng.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, H, N, D, M;
    bool causal;
    const int *lengths;
    int rounds, bits, chunk;
    int combine; /* 0 mean, 1 logsumexp */
    uint64_t seed;
} lcase;

static attn *make(const lcase *c) {
    char r[32], b[32], ch[32], co[32];
    snprintf(r, sizeof r, "rounds=%d", c->rounds);
    snprintf(b, sizeof b, "bits=%d", c->bits);
    snprintf(ch, sizeof ch, "chunk=%d", c->chunk);
    snprintf(co, sizeof co, "combine=%s", c->combine ? "logsumexp" : "mean");
    const char *set[] = {r, b, ch, co};
    attn_options o = {.variant = "lsh", .device = AB_DEV_CPU, .seed = c->seed, .n_settings = 4, .settings = set};
    attn *a = NULL;
    int rc = attn_create(&o, &a);
    cr_assert_eq(rc, 0, "attn_create: %s", attn_error());
    return a;
}

static attn_shape shape_of(const lcase *c) {
    attn_shape s = {c->B, c->H, c->N, c->D, c->M, c->causal, c->lengths};
    return s;
}
static ref_shape ref_shape_of(const lcase *c) {
    ref_shape s = {c->B, c->H, c->N, c->D, c->M, c->causal, c->lengths};
    return s;
}

/* Inputs of a case: q, k, v normal(0, 1) from fixed streams of `data_seed`. */
typedef struct {
    size_t nq, nv;
    float *q, *k, *v;
} inputs;

static inputs make_inputs(const lcase *c, uint64_t data_seed) {
    inputs in;
    in.nq = (size_t)c->B * c->H * c->N * c->D;
    in.nv = (size_t)c->B * c->H * c->N * c->M;
    in.q = tu_alloc_f(in.nq);
    in.k = tu_alloc_f(in.nq);
    in.v = tu_alloc_f(in.nv);
    tu_fill_normal(in.q, in.nq, data_seed, 1, 1.0);
    tu_fill_normal(in.k, in.nq, data_seed, 2, 1.0);
    tu_fill_normal(in.v, in.nv, data_seed, 3, 1.0);
    return in;
}
static void free_inputs(inputs *in) {
    free(in->q);
    free(in->k);
    free(in->v);
}

static int valid_len(const lcase *c, int b) { return c->lengths ? c->lengths[b] : c->N; }

/* Rows i >= L of a [B,H,N,W] tensor are exactly zero. */
static void assert_padded_rows_zero(const lcase *c, const float *x, int W, const char *what) {
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int i = valid_len(c, b); i < c->N; i++)
                for (int t = 0; t < W; t++)
                    cr_assert_eq(x[(((size_t)b * c->H + h) * c->N + i) * W + t], 0.0f,
                                 "%s: padded row b=%d h=%d i=%d is not zero", what, b, h, i);
}

/* Runs the forward and compares it with ref_lsh on the buckets the implementation
 * computed. Returns the relative error. */
static double forward_vs_ref(const lcase *c, uint64_t data_seed) {
    attn *a = make(c);
    attn_shape s = shape_of(c);
    inputs in = make_inputs(c, data_seed);
    size_t sb = attn_saved_bytes(a, &s);
    cr_assert_gt(sb, 0, "saved bytes: %s", attn_error());
    void *saved = malloc(sb);
    float *out = tu_alloc_f(in.nv);
    int *buckets = calloc((size_t)c->rounds * c->B * c->H * c->N, sizeof(int));
    cr_assert_eq(attn_forward(a, &s, in.q, in.k, in.v, out, saved), 0, "forward: %s", attn_error());
    cr_assert_eq(attn_lsh_buckets(a, &s, in.q, buckets), 0, "buckets: %s", attn_error());
    double *qd = tu_to_double(in.q, in.nq), *vd = tu_to_double(in.v, in.nv), *want = tu_alloc_d(in.nv);
    ref_shape rs = ref_shape_of(c);
    ref_lsh(&rs, c->rounds, c->chunk, c->combine, 1.0 / sqrt((double)c->D), buckets, qd, vd, want);
    assert_padded_rows_zero(c, out, c->M, "forward output");
    double err = tu_rel_err(out, want, in.nv, 1.0);
    free(qd), free(vd), free(want), free(buckets), free(out), free(saved);
    free_inputs(&in);
    attn_destroy(a);
    return err;
}

/* Outputs are convex combinations of the rows of v (|v| ~ 1; floor 1 for the scale).
 * float32 errors: scores are dot products of D terms (|s| <= scale |q| ~ 3) rounded
 * to ~6e-8 relative, exp turns that into ~|s| * 6e-8 relative error per weight, and
 * the weighted sums run over at most 2*chunk = 64 keys and 8 rounds, with errors
 * that mostly cancel: ~1e-6 at worst, 2e-7 observed. 2e-6 keeps a 10x margin over
 * what we see (other BLAS kernels round differently) and still catches any wrong
 * key, mask or weight, which give errors of order 0.1. */
#define FWD_TOL 2e-6

Test(lsh, forward_matches_reference_rounds_combine_causal) {
    static const int lens[3] = {29, 0, 37};
    int rounds_list[3] = {1, 4, 8};
    for (int ri = 0; ri < 3; ri++)
        for (int comb = 0; comb < 2; comb++)
            for (int causal = 0; causal < 2; causal++)
                for (int use_len = 0; use_len < 2; use_len++) {
                    /* N = 37 is not a multiple of chunk 8; odd D and M. */
                    lcase c = {3, 2, 37, 5, 3, causal, use_len ? lens : NULL, rounds_list[ri], 4, 8, comb, 11};
                    double err = forward_vs_ref(&c, 100 + ri);
                    cr_assert_lt(err, FWD_TOL, "rounds=%d combine=%d causal=%d lengths=%d: rel err %g",
                                 c.rounds, comb, causal, use_len, err);
                }
}

Test(lsh, forward_edge_shapes) {
    static const int len1[2] = {1, 0};
    static const int len_full[2] = {40, 40};
    static const int len_mixed[4] = {1, 2, 33, 64};
    lcase cases[] = {
        /* N = 1: the only key is the query itself (self rule) */
        {1, 1, 1, 4, 2, false, NULL, 1, 8, 32, 0, 1},
        {2, 3, 1, 3, 5, true, len1, 4, 2, 32, 1, 2},
        /* full lengths equal to N */
        {2, 1, 40, 7, 9, true, len_full, 2, 3, 7, 1, 3},
        /* chunk 1: a query sees only the previous position in sorted order */
        {1, 2, 19, 6, 4, false, NULL, 3, 2, 1, 0, 4},
        {1, 2, 19, 6, 4, true, NULL, 3, 2, 1, 1, 4},
        /* bits = 1 (two buckets), long-ish sequence, several chunk boundaries */
        {4, 1, 64, 8, 8, true, len_mixed, 2, 1, 5, 0, 5},
        /* many buckets relative to N: most buckets hold one position */
        {1, 1, 50, 16, 3, false, NULL, 8, 64, 4, 1, 6},
        /* defaults-like: chunk 32 and D = M = 32, two chunks */
        {2, 2, 64, 32, 32, true, NULL, 1, 8, 32, 0, 7},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        double err = forward_vs_ref(&cases[t], 200 + t);
        cr_assert_lt(err, FWD_TOL, "case %zu: rel err %g", t, err);
    }
}

/* The hash against the formula recomputed in double: R from ab_rng_normal, k from q
 * in double. Equal except where the two largest of the 2*bits projections are within
 * float rounding of each other. */
Test(lsh, hash_matches_formula_in_double) {
    static const int lens[2] = {300, 111};
    lcase c = {2, 3, 300, 13, 4, false, lens, 3, 16, 32, 0, 0x5eed};
    attn *a = make(&c);
    attn_shape s = shape_of(&c);
    inputs in = make_inputs(&c, 77);
    size_t nb = (size_t)c.rounds * c.B * c.H * c.N;
    int *buckets = calloc(nb, sizeof(int));
    cr_assert_eq(attn_lsh_buckets(a, &s, in.q, buckets), 0, "%s", attn_error());
    double *R = malloc(sizeof(double) * c.D * c.bits), *p = malloc(sizeof(double) * 2 * c.bits);
    int n_valid = 0, n_near = 0;
    for (int r = 0; r < c.rounds; r++) {
        for (int d = 0; d < c.D; d++)
            for (int j = 0; j < c.bits; j++)
                R[d * c.bits + j] = ab_rng_normal(c.seed, (uint64_t)r, (uint64_t)(d * c.bits + j));
        for (int b = 0; b < c.B; b++)
            for (int h = 0; h < c.H; h++)
                for (int i = 0; i < c.N; i++) {
                    int got = buckets[(((size_t)r * c.B + b) * c.H + h) * c.N + i];
                    if (i >= lens[b]) {
                        cr_assert_eq(got, -1, "padded position %d has bucket %d", i, got);
                        continue;
                    }
                    const float *x = in.q + (((size_t)b * c.H + h) * c.N + i) * c.D;
                    double nrm = 0;
                    for (int d = 0; d < c.D; d++) nrm += (double)x[d] * x[d];
                    nrm = sqrt(nrm);
                    for (int j = 0; j < c.bits; j++) {
                        double acc = 0;
                        for (int d = 0; d < c.D; d++) acc += x[d] / nrm * R[d * c.bits + j];
                        p[j] = acc;
                        p[c.bits + j] = -acc;
                    }
                    int want = 0;
                    for (int j = 1; j < 2 * c.bits; j++)
                        if (p[j] > p[want]) want = j;
                    n_valid++;
                    cr_assert(got >= 0 && got < 2 * c.bits, "bucket %d out of range", got);
                    if (got != want) {
                        /* float32 projection: D = 13 products of |k_d| <= 1 and |R| <~ 4,
                         * each rounded to 6e-8 relative: error well under 1e-5. */
                        cr_assert_lt(p[want] - p[got], 1e-5, "bucket %d vs %d: projections %g vs %g", got, want,
                                     p[got], p[want]);
                        n_near++;
                    }
                }
    }
    /* Near ties within 1e-5 among 16 gaps of spread ~1 happen with probability ~1e-4
     * per position: a handful at most out of ~2500, and any systematic error in the
     * formula (wrong stream, index, sign order) would disagree on most positions. */
    cr_assert_eq(n_valid, c.rounds * c.H * (lens[0] + lens[1]));
    cr_assert_leq(n_near, 3, "%d of %d buckets differ from the double formula", n_near, n_valid);
    free(R), free(p), free(buckets);
    free_inputs(&in);
    attn_destroy(a);
}

/* The buckets are pinned bit for bit (a hash of 14400 of them, with 8-wide tiles and a
 * partial one: bits = 13, D = 37): attention/lsh_hash.h fixes their arithmetic, so
 * every build (with or without AVX/FMA, any BLAS) and the CUDA backend choose exactly
 * these. A change of the hashing formula changes this constant: only on purpose. */
Test(lsh, buckets_pinned_bit_for_bit) {
    lcase c = {2, 3, 300, 37, 4, false, NULL, 4, 13, 32, 0, 0xb0c4e7};
    attn *a = make(&c);
    attn_shape s = shape_of(&c);
    inputs in = make_inputs(&c, 91);
    size_t nb = (size_t)c.rounds * c.B * c.H * c.N;
    int *buckets = calloc(nb, sizeof(int));
    cr_assert_eq(attn_lsh_buckets(a, &s, in.q, buckets), 0, "%s", attn_error());
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the bucket numbers */
    for (size_t e = 0; e < nb; e++) h = (h ^ (uint64_t)(unsigned)buckets[e]) * 1099511628211ull;
    cr_assert_eq(h, 0x6da5c94d9a4a1fa1ull, "hash of the buckets %016llx", (unsigned long long)h);
    free(buckets);
    free_inputs(&in);
    attn_destroy(a);
}

/* A zero query: its norm is floored (k = 0, no NaN), all 2*bits projections are 0
 * and the first maximum wins: bucket 0 (the tie rule, exactly). Its output stays
 * finite and matches the reference, which floors the same way. */
Test(lsh, zero_query_hashes_to_first_bucket) {
    lcase c = {1, 2, 10, 5, 3, false, NULL, 2, 4, 4, 1, 8};
    inputs in = make_inputs(&c, 31);
    for (int bh = 0; bh < 2; bh++)
        for (int i = 3; i < 10; i += 3) memset(in.q + ((size_t)bh * c.N + i) * c.D, 0, sizeof(float) * c.D);
    attn *a = make(&c);
    attn_shape s = shape_of(&c);
    int *buckets = calloc((size_t)c.rounds * 2 * c.N, sizeof(int));
    cr_assert_eq(attn_lsh_buckets(a, &s, in.q, buckets), 0, "%s", attn_error());
    for (int r = 0; r < c.rounds; r++)
        for (int bh = 0; bh < 2; bh++)
            for (int i = 3; i < 10; i += 3)
                cr_assert_eq(buckets[((size_t)r * 2 + bh) * c.N + i], 0, "zero query %d: bucket %d", i,
                             buckets[((size_t)r * 2 + bh) * c.N + i]);
    void *saved = malloc(attn_saved_bytes(a, &s));
    float *out = tu_alloc_f(in.nv);
    cr_assert_eq(attn_forward(a, &s, in.q, in.k, in.v, out, saved), 0, "%s", attn_error());
    double *qd = tu_to_double(in.q, in.nq), *vd = tu_to_double(in.v, in.nv), *want = tu_alloc_d(in.nv);
    ref_shape rs = ref_shape_of(&c);
    ref_lsh(&rs, c.rounds, c.chunk, c.combine, 1.0 / sqrt((double)c.D), buckets, qd, vd, want);
    double err = tu_rel_err(out, want, in.nv, 1.0); /* tu_rel_err returns inf on NaN */
    cr_assert_lt(err, FWD_TOL, "rel err %g", err);
    free(qd), free(vd), free(want), free(out), free(saved), free(buckets);
    free_inputs(&in);
    attn_destroy(a);
}

/* One chunk covering the whole sequence: every round sees every valid key, so any
 * seed, rounds and combine give shared-QK softmax with the self rule. */
Test(lsh, one_chunk_equals_shared_qk_softmax) {
    static const int lens[2] = {23, 6};
    for (int t = 0; t < 8; t++) {
        lcase c = {2, 2, 23, 7, 5, t & 1, (t & 2) ? lens : NULL, 1 + 3 * (t & 1) + (t >> 2) * 3, 4,
                   t & 4 ? 23 : 1000, (t >> 1) & 1, 1000 + (uint64_t)t};
        attn *a = make(&c);
        attn_shape s = shape_of(&c);
        inputs in = make_inputs(&c, 300 + t);
        void *saved = malloc(attn_saved_bytes(a, &s));
        float *out = tu_alloc_f(in.nv);
        cr_assert_eq(attn_forward(a, &s, in.q, in.k, in.v, out, saved), 0, "%s", attn_error());
        double *qd = tu_to_double(in.q, in.nq), *vd = tu_to_double(in.v, in.nv), *want = tu_alloc_d(in.nv);
        ref_shape rs = ref_shape_of(&c);
        ref_shared_qk_softmax(&rs, 1.0 / sqrt((double)c.D), qd, vd, want);
        double err = tu_rel_err(out, want, in.nv, 1.0);
        /* same float32 argument as FWD_TOL (sums of at most 23 terms) */
        cr_assert_lt(err, FWD_TOL, "case %d (rounds=%d chunk=%d combine=%d causal=%d): rel err %g", t, c.rounds,
                     c.chunk, c.combine, c.causal, err);
        free(qd), free(vd), free(want), free(out), free(saved);
        free_inputs(&in);
        attn_destroy(a);
    }
}

/* ---- backward ---- */

typedef struct {
    ref_shape rs;
    int rounds, chunk, combine;
    double scale;
    const int *buckets;
    double *q, *v;
} fd_ctx;

static void fd_forward(void *p, double *out) {
    fd_ctx *c = p;
    ref_lsh(&c->rs, c->rounds, c->chunk, c->combine, c->scale, c->buckets, c->q, c->v, out);
}

static void backward_vs_fd(const lcase *c, uint64_t data_seed) {
    attn *a = make(c);
    attn_shape s = shape_of(c);
    inputs in = make_inputs(c, data_seed);
    void *saved = malloc(attn_saved_bytes(a, &s));
    float *out = tu_alloc_f(in.nv), *dout = tu_alloc_f(in.nv);
    float *dq = tu_alloc_f(in.nq), *dk = tu_alloc_f(in.nq), *dv = tu_alloc_f(in.nv);
    /* poison the gradients: backward must overwrite them */
    for (size_t i = 0; i < in.nq; i++) dq[i] = dk[i] = NAN;
    for (size_t i = 0; i < in.nv; i++) dv[i] = NAN;
    tu_fill_normal(dout, in.nv, data_seed, 4, 1.0);
    int *buckets = calloc((size_t)c->rounds * c->B * c->H * c->N, sizeof(int));
    cr_assert_eq(attn_forward(a, &s, in.q, in.k, in.v, out, saved), 0, "%s", attn_error());
    cr_assert_eq(attn_lsh_buckets(a, &s, in.q, buckets), 0, "%s", attn_error());
    cr_assert_eq(attn_backward(a, &s, in.q, in.k, in.v, dout, saved, dq, dk, dv), 0, "%s", attn_error());

    for (size_t i = 0; i < in.nq; i++) cr_assert_eq(dk[i], 0.0f, "dk[%zu] = %g: keys are the normalised queries", i, dk[i]);
    assert_padded_rows_zero(c, dq, c->D, "dq");
    assert_padded_rows_zero(c, dv, c->M, "dv");

    fd_ctx ctx = {ref_shape_of(c), c->rounds, c->chunk, c->combine, 1.0 / sqrt((double)c->D), buckets,
                  tu_to_double(in.q, in.nq), tu_to_double(in.v, in.nv)};
    double *w = tu_to_double(dout, in.nv), *gq = tu_alloc_d(in.nq), *gv = tu_alloc_d(in.nv);
    /* h = 1e-5 in double: truncation error ~ h^2 * third derivative (~1e-10) and
     * cancellation ~ 1e-16 * |L| / h (~1e-10): the FD gradient is good to ~1e-9. */
    tu_fd_grad(fd_forward, &ctx, ctx.q, in.nq, w, in.nv, 1e-5, gq);
    tu_fd_grad(fd_forward, &ctx, ctx.v, in.nv, w, in.nv, 1e-5, gv);
    /* The float32 backward: recomputed scores and probabilities (~6e-8 relative,
     * times |s| <~ 3 through exp), products over at most 2*chunk keys and the
     * normalisation Jacobian 1/|q| (|q| >~ 0.5 for these normal inputs): ~1e-6 of the
     * gradient's scale at worst, 3e-7 observed. 3e-6 keeps a 10x margin and still
     * catches any missing or wrong term (order 0.1 of the scale). The floor 0.1 keeps
     * a mostly padded (mostly zero) gradient judged on an O(1) scale. */
    double eq = tu_rel_err(dq, gq, in.nq, 0.1), ev = tu_rel_err(dv, gv, in.nv, 0.1);
    cr_assert_lt(eq, 3e-6, "dq rel err %g (rounds=%d combine=%d causal=%d)", eq, c->rounds, c->combine, c->causal);
    cr_assert_lt(ev, 3e-6, "dv rel err %g (rounds=%d combine=%d causal=%d)", ev, c->rounds, c->combine, c->causal);
    free(ctx.q), free(ctx.v), free(w), free(gq), free(gv);
    free(buckets), free(saved), free(out), free(dout), free(dq), free(dk), free(dv);
    free_inputs(&in);
    attn_destroy(a);
}

Test(lsh, backward_matches_finite_differences) {
    static const int lens[2] = {9, 4};
    for (int comb = 0; comb < 2; comb++)
        for (int causal = 0; causal < 2; causal++)
            for (int use_len = 0; use_len < 2; use_len++) {
                /* N = 9 with chunk 2 (not a multiple), odd D and M, 3 rounds of 2 bits */
                lcase c = {2, 2, 9, 5, 3, causal, use_len ? lens : NULL, 3, 2, 2, comb, 21 + (uint64_t)use_len};
                backward_vs_fd(&c, 400 + comb * 4 + causal * 2 + use_len);
            }
}

Test(lsh, backward_edge_shapes) {
    static const int len0[2] = {0, 1};
    lcase cases[] = {
        {1, 1, 1, 3, 2, false, NULL, 2, 4, 32, 1, 1},        /* N = 1: self only */
        {2, 1, 3, 4, 5, true, len0, 1, 2, 1, 0, 2},          /* lengths 0 and 1 */
        /* 8 rounds, logsumexp, causal; one slice, so its 3 chunks run on the threads */
        {1, 1, 11, 6, 7, true, NULL, 8, 3, 4, 1, 3},
        {1, 1, 12, 3, 3, false, NULL, 4, 8, 100, 0, 4},       /* one chunk covers all */
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) backward_vs_fd(&cases[t], 500 + t);
}

/* ---- seeds, k ignored, workspace ---- */

Test(lsh, same_seed_reproduces_and_new_seed_rehashes) {
    lcase c = {2, 2, 64, 8, 4, true, NULL, 4, 8, 8, 1, 42};
    attn *a = make(&c);
    attn_shape s = shape_of(&c);
    inputs in = make_inputs(&c, 9);
    size_t nb = (size_t)c.rounds * c.B * c.H * c.N;
    void *saved = malloc(attn_saved_bytes(a, &s));
    float *o1 = tu_alloc_f(in.nv), *o2 = tu_alloc_f(in.nv);
    int *b1 = calloc(nb, sizeof(int)), *b2 = calloc(nb, sizeof(int));
    cr_assert_eq(attn_forward(a, &s, in.q, in.k, in.v, o1, saved), 0, "%s", attn_error());
    size_t mem = ab_mem_current(AB_DEV_CPU);
    /* k is ignored: other keys give the same output, bit for bit */
    tu_fill_normal(in.k, in.nq, 12345, 2, 3.0);
    cr_assert_eq(attn_forward(a, &s, in.q, in.k, in.v, o2, saved), 0, "%s", attn_error());
    cr_assert_eq(ab_mem_current(AB_DEV_CPU), mem, "a repeated call at one shape allocated");
    cr_assert_eq(memcmp(o1, o2, sizeof(float) * in.nv), 0, "same seed, same inputs: outputs differ");
    cr_assert_eq(attn_lsh_buckets(a, &s, in.q, b1), 0, "%s", attn_error());
    attn_reseed(a, 43);
    cr_assert_eq(attn_lsh_buckets(a, &s, in.q, b2), 0, "%s", attn_error());
    size_t ndiff = 0;
    for (size_t i = 0; i < nb; i++) ndiff += b1[i] != b2[i];
    /* 16 buckets: independent rotations agree on a position with probability well
     * under 1/2, so about half or more of the 1024 buckets change. */
    cr_assert_gt(ndiff, nb / 4, "a new seed changed only %zu of %zu buckets", ndiff, nb);
    cr_assert_eq(attn_forward(a, &s, in.q, in.k, in.v, o2, saved), 0, "%s", attn_error());
    cr_assert_neq(memcmp(o1, o2, sizeof(float) * in.nv), 0, "a new seed gave the same output");
    free(o1), free(o2), free(b1), free(b2), free(saved);
    free_inputs(&in);
    attn_destroy(a);
}

Test(lsh, saved_memory_is_linear_in_n) {
    lcase c = {2, 3, 1000, 16, 8, false, NULL, 4, 8, 32, 0, 1};
    attn *a = make(&c);
    attn_shape s = shape_of(&c);
    /* mean: the sorted order (int32) and logsumexp per round and query, nothing else */
    size_t bh = 6, want = bh * 4 * 1000 * 4 * 2;
    size_t got = attn_saved_bytes(a, &s);
    cr_assert(got >= want && got < want + 256, "saved %zu bytes, expected about %zu", got, want);
    attn_destroy(a);
    c.combine = 1;
    a = make(&c);
    /* logsumexp adds the combined logsumexp and output: N (M + 1) floats per slice */
    want += bh * 1000 * (8 + 1) * 4;
    got = attn_saved_bytes(a, &s);
    cr_assert(got >= want && got < want + 256, "saved %zu bytes, expected about %zu", got, want);
    attn_destroy(a);
}

/* ---- options and modes ---- */

static int create_with(const char *setting, attn **a) {
    const char *set[] = {setting};
    attn_options o = {.variant = "lsh", .device = AB_DEV_CPU, .seed = 1, .n_settings = 1, .settings = set};
    *a = NULL;
    return attn_create(&o, a);
}

Test(lsh, options_defaults_and_rejections) {
    attn_options o = {.variant = "lsh", .device = AB_DEV_CPU, .seed = 1};
    attn *a = NULL;
    cr_assert_eq(attn_create(&o, &a), 0, "%s", attn_error());
    char buf[64];
    attn_shape s = {1, 1, 8, 16, 4, false, NULL};
    cr_assert_str_eq(attn_option_value(a, NULL, "rounds", buf, sizeof buf), "1");
    cr_assert_str_eq(attn_option_value(a, NULL, "bits", buf, sizeof buf), "8");
    cr_assert_str_eq(attn_option_value(a, NULL, "chunk", buf, sizeof buf), "32");
    cr_assert_str_eq(attn_option_value(a, NULL, "combine", buf, sizeof buf), "mean");
    cr_assert_str_eq(attn_option_value(a, &s, "scale", buf, sizeof buf), "0.25");
    attn_destroy(a);
    int vi = attn_variant_find("lsh");
    cr_assert_geq(vi, 0);
    cr_assert_not(attn_variant_has_step(vi), "lsh has no recurrent mode");
    cr_assert(strstr(attn_variant_summary(vi), "LSH") != NULL);

    struct {
        const char *setting, *needle;
    } bad[] = {
        {"rounds=0", "rounds"}, {"rounds=65", "rounds"}, {"bits=0", "bits"},  {"bits=257", "bits"},
        {"chunk=0", "chunk"},   {"combine=foo", "combine"}, {"buckets=4", "buckets"}, {"scale=-1", "scale"},
        {"rounds=two", "rounds"},
    };
    for (size_t t = 0; t < sizeof bad / sizeof bad[0]; t++) {
        cr_assert_eq(create_with(bad[t].setting, &a), ATTN_EINVAL, "'%s' was accepted", bad[t].setting);
        cr_assert_null(a);
        cr_assert(strstr(attn_error(), bad[t].needle) != NULL, "message for '%s' does not name it: %s",
                  bad[t].setting, attn_error());
    }
    cr_assert_eq(create_with("combine=logsumexp", &a), 0, "%s", attn_error());
    cr_assert_str_eq(attn_option_value(a, NULL, "combine", buf, sizeof buf), "logsumexp");
    attn_destroy(a);
    cr_assert_eq(create_with("scale=auto", &a), 0, "%s", attn_error());
    attn_destroy(a);
}

Test(lsh, recurrent_mode_unsupported) {
    attn *a = NULL;
    cr_assert_eq(create_with("rounds=4", &a), 0, "%s", attn_error());
    cr_assert_not(attn_has_step(a));
    attn_shape s = {1, 2, 1, 4, 4, true, NULL};
    cr_assert_eq(attn_state_bytes(a, &s, 16), 0);
    cr_assert(strstr(attn_error(), "recurrent") != NULL, "message: %s", attn_error());
    attn_state *state = NULL;
    cr_assert_eq(attn_state_create(a, &s, 16, &state), ATTN_EUNSUPPORTED);
    cr_assert_null(state);
    attn_destroy(a);
}
