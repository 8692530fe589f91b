/* efficient (Efficient Attention, Shen et al.) on the CPU: forward against the double
 * reference (tests/reference/ref_efficient.c) on random shapes (N = 1, odd sizes,
 * lengths with 0 and N, more rows than one chunk), the definition checked directly
 * (rows of Q' and columns of K' are distributions: invariances and v = 1), backward
 * against central finite differences of the reference, the causal refusal, padding;
 * small_gemm.c's two products (the path of D and M multiples of 16) against double sums.
 *
 * Error figures are tu_rel_err (max abs error over a tensor / the tensor's max abs).
 * Every weight is a softmax probability (no cancellation), the context sums up to N
 * products in float and the output D more: with float32 (u = 6e-8) the worst-case sums
 * here (N <= 600) bound the error by N u ~ 4e-5, typically sqrt(N) u; measured below
 * 1e-6. */
#include <criterion/criterion.h>

#include "attention.h"
#include "efficient.h"
#include "error.h"
#include "memory.h"
#include "reference.h"
#include "small_gemm.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* TC_PRINT=1 in the environment prints every measured error (how the figures quoted
 * beside the tolerances were taken). */
static double note(const char *what, double e) {
    if (getenv("TC_PRINT")) fprintf(stderr, "ERR %.3g %s\n", e, what);
    return e;
}

/* Forward: the worst-case float sum over N = 600 keys (3.6e-5), rounded up; measured
 * up to 5.6e-7. A wrong normalisation axis or mask is O(1e-1). */
#define FWD_TOL 4e-5
/* Backward vs finite differences (h = 1e-4 on the double reference: truncation
 * h^2 |f'''| ~ 1e-8, rounding 1e-16 / h ~ 1e-12): the float backward's own error, a few
 * more products than forward. Measured up to 2.2e-7. */
#define BWD_TOL 5e-5

static attn *make(void) {
    attn_options o = {.variant = "efficient", .device = AB_DEV_CPU, .seed = 1};
    attn *a = NULL;
    cr_assert_eq(attn_create(&o, &a), 0, "%s", attn_error());
    return a;
}

static ref_shape to_ref(const attn_shape *s) {
    return (ref_shape){s->batch, s->heads, s->len, s->qk_dim, s->v_dim, s->causal, s->lengths};
}

static double *reference(const tu_problem *p) {
    double *q = tu_to_double(p->q, p->nq), *k = tu_to_double(p->k, p->nq), *v = tu_to_double(p->v, p->nv);
    double *out = tu_alloc_d(p->nv);
    ref_shape rs = to_ref(&p->s);
    ref_efficient(&rs, q, k, v, out);
    free(q), free(k), free(v);
    return out;
}

/* out of the library (pre-filled with garbage: rows it forgets show); *saved (may be
 * NULL: freed) receives what forward saved, O(D M) per slice: the context and the key
 * columns' statistics. */
static float *forward_saved(attn *a, const tu_problem *p, void **saved) {
    float *out = tu_alloc_f(p->nv);
    for (size_t i = 0; i < p->nv; i++) out[i] = 7.0f;
    const size_t sb = attn_saved_bytes(a, &p->s);
    cr_assert_eq(sb, (size_t)p->s.batch * p->s.heads * p->s.qk_dim * (p->s.v_dim + 2) * sizeof(float),
                 "efficient saves C (D x M) and 2 D column statistics per slice: %zu bytes", sb);
    void *sv = malloc(sb);
    cr_assert_eq(attn_forward(a, &p->s, p->q, p->k, p->v, out, sv), 0, "%s", attn_error());
    if (saved) *saved = sv;
    else free(sv);
    return out;
}

static float *forward(attn *a, const tu_problem *p) { return forward_saved(a, p, NULL); }

static void check_forward(int B, int H, int N, int D, int M, const int *lengths, uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, false, lengths, seed);
    attn *a = make();
    float *out = forward(a, &p);
    double *want = reference(&p);
    double e = tu_rel_err(out, want, p.nv, 1e-30);
    cr_expect_lt(note("e", e), FWD_TOL, "B=%d H=%d N=%d D=%d M=%d: err %g", B, H, N, D, M, e);
    tu_assert_padded_zero(&p.s, out, M, "out");
    free(out), free(want);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(efficient_forward, shapes_and_lengths) {
    check_forward(1, 1, 1, 4, 3, NULL, 11);          /* N = 1: out = v */
    check_forward(2, 3, 37, 5, 7, NULL, 12);         /* odd sizes */
    int lens[3] = {50, 23, 0};                       /* full, partial, empty */
    check_forward(3, 2, 50, 8, 3, lens, 13);
    int lens2[2] = {600, 257};                       /* longer rows */
    check_forward(2, 1, 600, 16, 9, lens2, 14);
    check_forward(1, 2, 64, 64, 64, NULL, 15);       /* the sweep's head size */
    check_forward(1, 1, 9, 1, 1, NULL, 16);          /* D = 1: Q' = 1, out = sum_j K'_j v_j */
}

/* The definition, without the reference: Q' rows and K' columns are probability
 * distributions, so (1) v = 1 gives out = 1 exactly up to rounding; (2) adding a
 * constant to a query row, or to one feature of every valid key, changes nothing; (3)
 * the padded keys' values are never read. */
Test(efficient_forward, definition_invariances) {
    const int B = 2, H = 2, N = 40, D = 6, M = 5, lens[2] = {40, 29};
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, false, lens, 21);
    attn *a = make();
    float *base = forward(a, &p);
    /* (1) */
    float *v1 = tu_alloc_f(p.nv), *keep = p.v;
    for (size_t i = 0; i < p.nv; i++) v1[i] = 1.0f;
    p.v = v1;
    float *ones = forward(a, &p);
    p.v = keep;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < lens[b]; i++)
                for (int m = 0; m < M; m++) {
                    /* sums of D and L probabilities in float: within 1e-6 of 1 */
                    float o = ones[(((size_t)b * H + h) * N + i) * M + m];
                    cr_expect(fabsf(o - 1.0f) < 1e-6f, "v = 1: out %.9g at b=%d h=%d i=%d", o, b, h, i);
                }
    /* (2) shifts: query row 3 of slice 0 by +5, key feature 2 of slice 1 by -3 (valid rows) */
    for (int d = 0; d < D; d++) p.q[3 * D + d] += 5.0f;
    for (int j = 0; j < N; j++) p.k[((size_t)1 * N + j) * D + 2] -= 3.0f;
    /* (3) padded keys and values of batch 1 (rows >= 29) become garbage */
    for (int h = 0; h < H; h++)
        for (int j = lens[1]; j < N; j++) {
            for (int d = 0; d < D; d++) p.k[(((size_t)1 * H + h) * N + j) * D + d] = NAN;
            for (int m = 0; m < M; m++) p.v[(((size_t)1 * H + h) * N + j) * M + m] = 1e30f;
        }
    float *moved = forward(a, &p);
    double *bd = tu_to_double(base, p.nv);
    /* The shifted values round differently (k - max, q - max in float): a few units of
     * rounding in the exponents, ~1e-6 relative at most; measured 6e-8. */
    double e = note("invariances", tu_rel_err(moved, bd, p.nv, 1e-30));
    cr_expect_lt(e, 2e-6, "softmax shifts or padding changed the output by %g", e);
    free(bd), free(base), free(ones), free(moved), free(v1);
    attn_destroy(a);
    tu_problem_free(&p);
}

/* ---- backward ---- */

typedef struct {
    ref_shape r;
    double *q, *k, *v;
} fd_ctx;

static void fd_forward(void *ctx, double *out) {
    fd_ctx *c = ctx;
    ref_efficient(&c->r, c->q, c->k, c->v, out);
}

static void check_backward(int B, int H, int N, int D, int M, const int *lengths, uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, false, lengths, seed);
    attn *a = make();
    void *saved;
    float *out = forward_saved(a, &p, &saved);
    float *dq = tu_alloc_f(p.nq), *dk = tu_alloc_f(p.nq), *dv = tu_alloc_f(p.nv);
    for (size_t i = 0; i < p.nq; i++) dq[i] = dk[i] = 7.0f;
    for (size_t i = 0; i < p.nv; i++) dv[i] = 7.0f;
    cr_assert_eq(attn_backward(a, &p.s, p.q, p.k, p.v, p.dout, saved, dq, dk, dv), 0, "%s", attn_error());
    free(saved);
    fd_ctx c = {to_ref(&p.s), tu_to_double(p.q, p.nq), tu_to_double(p.k, p.nq), tu_to_double(p.v, p.nv)};
    double *w = tu_to_double(p.dout, p.nv);
    double *gq = tu_alloc_d(p.nq), *gk = tu_alloc_d(p.nq), *gv = tu_alloc_d(p.nv);
    tu_fd_grad(fd_forward, &c, c.q, p.nq, w, p.nv, 1e-4, gq);
    tu_fd_grad(fd_forward, &c, c.k, p.nq, w, p.nv, 1e-4, gk);
    tu_fd_grad(fd_forward, &c, c.v, p.nv, w, p.nv, 1e-4, gv);
    double eq = tu_rel_err(dq, gq, p.nq, 1e-30), ek = tu_rel_err(dk, gk, p.nq, 1e-30), ev = tu_rel_err(dv, gv, p.nv, 1e-30);
    cr_expect_lt(note("eq", eq), BWD_TOL, "N=%d dq err %g", N, eq);
    cr_expect_lt(note("ek", ek), BWD_TOL, "N=%d dk err %g", N, ek);
    cr_expect_lt(note("ev", ev), BWD_TOL, "N=%d dv err %g", N, ev);
    tu_assert_padded_zero(&p.s, dq, D, "dq");
    tu_assert_padded_zero(&p.s, dk, D, "dk");
    tu_assert_padded_zero(&p.s, dv, M, "dv");
    free(gq), free(gk), free(gv), free(w), free(c.q), free(c.k), free(c.v);
    free(out), free(dq), free(dk), free(dv);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(efficient_backward, finite_differences) {
    int lens[3] = {9, 4, 0};
    check_backward(3, 2, 9, 5, 3, lens, 31);
    check_backward(1, 1, 1, 3, 2, NULL, 32); /* N = 1: dk = 0 (K' = 1), dq through Q' */
    check_backward(1, 2, 13, 1, 4, NULL, 33); /* D = 1: Q' = 1, dq = 0 */
}

/* Sequences longer than a chunk (lowered to 4 and 100 rows here, 16384 by default): the
 * context's exponentials and column sums, the queries' and the keys' passes of backward
 * run over every chunk; a ragged last chunk; lengths cutting a chunk. */
Test(efficient_backward, several_chunks) {
    const int saved = eff_chunk_rows;
    eff_chunk_rows = 4;
    int lens[2] = {11, 6};
    check_backward(2, 2, 11, 3, 2, lens, 34);
    check_forward(1, 3, 13, 5, 4, NULL, 35);
    /* chunks of 100 rows: forward's column sums go in blocks of 64 rows (float, then
     * double), so a chunk is a full block and a ragged one, and the lengths end inside a
     * block; backward over a full chunk and a ragged one */
    eff_chunk_rows = 100;
    int lens3[2] = {300, 229}, lens4[2] = {120, 101};
    check_forward(2, 1, 300, 16, 8, lens3, 37);
    check_backward(2, 1, 120, 8, 4, lens4, 36);
    eff_chunk_rows = saved;
}

/* ---- small_gemm.c's products (efficient's kernels where the width is a multiple of 16) ----
 *
 * Against double sums, element by element, within the a-priori bound of a float sum of
 * n products in any order with fused multiply-adds: |error| <= n u sum |terms| (u =
 * 2^-24; Higham's gamma_n, n u < 0.01 here), the terms of sg_outer_acc including W's
 * starting value. Sizes: every tail (rows t % 4, K % 4, widths P % 64 = 0, 16, 32, 48),
 * strides wider than the operands, t over the row block (256). */
static void sg_case(int t, int K, int P, uint64_t seed) {
    const int ldx = K + 3, ldw = P + 16, ldy = P + 32;
    float *X = tu_alloc_f((size_t)t * ldx), *W = tu_alloc_f((size_t)K * ldw), *Y = tu_alloc_f((size_t)t * ldy);
    float *Yt = tu_alloc_f((size_t)t * ldy), *W0 = tu_alloc_f((size_t)K * ldw);
    tu_fill_normal(X, (size_t)t * ldx, seed, 1, 1.0);
    tu_fill_normal(W, (size_t)K * ldw, seed, 2, 1.0);
    tu_fill_normal(Yt, (size_t)t * ldy, seed, 3, 1.0);
    memcpy(W0, W, sizeof(float) * (size_t)K * ldw);
    const double u = ldexp(1.0, -24);
    /* Y = X W; the columns past P of each Y row are left as they were (0) */
    sg_rows(t, K, P, X, ldx, W, ldw, Y, ldy);
    for (int i = 0; i < t; i++)
        for (int j = 0; j < ldy; j++) {
            double want = 0, mag = 0;
            for (int k = 0; j < P && k < K; k++) {
                want += (double)X[(size_t)i * ldx + k] * W[(size_t)k * ldw + j];
                mag += fabs((double)X[(size_t)i * ldx + k] * W[(size_t)k * ldw + j]);
            }
            const double got = Y[(size_t)i * ldy + j];
            cr_assert_leq(fabs(got - want), K * u * mag, "sg_rows t=%d K=%d P=%d: Y[%d][%d] = %.9g, want %.9g", t, K, P,
                          i, j, got, want);
        }
    /* W += X^T Yt; W's columns past P untouched */
    sg_outer_acc(t, K, P, X, ldx, Yt, ldy, W, ldw);
    for (int k = 0; k < K; k++)
        for (int j = 0; j < ldw; j++) {
            const double w0 = W0[(size_t)k * ldw + j];
            double want = w0, mag = fabs(w0);
            for (int i = 0; j < P && i < t; i++) {
                want += (double)X[(size_t)i * ldx + k] * Yt[(size_t)i * ldy + j];
                mag += fabs((double)X[(size_t)i * ldx + k] * Yt[(size_t)i * ldy + j]);
            }
            const double got = W[(size_t)k * ldw + j];
            cr_assert_leq(fabs(got - want), (t + 1) * u * mag, "sg_outer_acc t=%d K=%d P=%d: W[%d][%d] = %.9g, want %.9g",
                          t, K, P, k, j, got, want);
        }
    free(X), free(W), free(Y), free(Yt), free(W0);
}

Test(small_gemm, products_against_double_sums) {
    cr_assert(sg_fits(16) && sg_fits(64) && sg_fits(80) && !sg_fits(0) && !sg_fits(8) && !sg_fits(65));
    const int ts[] = {1, 3, 4, 7, 300}, Ks[] = {1, 3, 4, 5, 64}, Ps[] = {16, 32, 48, 64, 80, 128};
    uint64_t seed = 50;
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 5; b++)
            for (int c = 0; c < 6; c++) sg_case(ts[a], Ks[b], Ps[c], seed++);
}

/* The kernels' path through forward and backward (D and M multiples of 16), with
 * lengths and several chunks: the same references as above. */
Test(efficient_backward, vector_kernel_path) {
    int lens[2] = {150, 97}, lens2[2] = {41, 27};
    check_forward(2, 2, 150, 16, 32, lens, 38);
    check_backward(2, 1, 41, 16, 32, lens2, 39);
    /* widths over 64: a block of 64 columns and a tail of 16 (M = 80), and D = 64; rows
     * t % 4 = 3 and 2 */
    int lens3[2] = {23, 18};
    check_backward(2, 1, 23, 16, 80, lens3, 41);
    check_backward(1, 1, 23, 64, 16, NULL, 42);
    const int saved = eff_chunk_rows;
    eff_chunk_rows = 12; /* three whole chunks and a ragged one */
    check_backward(2, 1, 41, 32, 16, lens2, 40);
    eff_chunk_rows = saved;
}

/* ---- errors ---- */

Test(efficient_errors, causal_refused_in_one_line) {
    attn *a = make();
    attn_shape s = {1, 1, 8, 4, 4, true, NULL};
    float x[32] = {0}, out[32];
    ab_clear_error();
    cr_assert_eq(attn_forward(a, &s, x, x, x, out, NULL), ATTN_EUNSUPPORTED);
    const char *msg = attn_error();
    cr_assert(strstr(msg, "efficient") && strstr(msg, "non-causal") && !strchr(msg, '\n'), "%s", msg);
    cr_assert_eq(attn_saved_bytes(a, &s), 0u);
    cr_assert(isnan(attn_flops(a, &s, false)));
    /* no recurrent mode */
    cr_assert_not(attn_has_step(a));
    attn_state *st = NULL;
    cr_assert_eq(attn_state_create(a, &s, 8, &st), ATTN_EUNSUPPORTED);
    /* no options of its own (only the one every variant has: precision) */
    const char *set[] = {"scale=1"};
    attn_options o = {.variant = "efficient", .device = AB_DEV_CPU, .n_settings = 1, .settings = set};
    attn *b = NULL;
    cr_assert_eq(attn_create(&o, &b), ATTN_EINVAL);
    cr_assert(strstr(attn_error(), "no option 'scale' (its options: precision)") != NULL, "%s", attn_error());
    attn_destroy(a);
}
