/* sparse (strided sparse attention) on the CPU: forward against the double reference
 * (ref_sparse, tests/reference/ref_sparse.c) for windows and strides from 1 to beyond N,
 * causal and not, lengths with 0 and N, N = 1, the auto defaults; stride 1 equal to the
 * softmax variant and a stride beyond N equal to local; backward against central
 * finite differences of the reference; recurrent steps and prefill equal to the causal
 * forward; the state's size; options.
 *
 * Errors are tu_rel_err (max abs error over a tensor / its max abs). The arithmetic is
 * softmax's over at most window + N / stride keys per row (two partial sums merged by
 * their log-sum-exps), so test_softmax.c's bounds apply. */
#include <criterion/criterion.h>

#include "attention.h"
#include "error.h"
#include "memory.h"
#include "reference.h"
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

/* As test_softmax.c: the worst-case float sum over N <= 300 keys (2e-5; each output is
 * a convex combination of float products, relative rounding ~N u with u = 6e-8);
 * measured up to 3.2e-7 here. A key missing from or added to a row's set changes its
 * output by O(1 / keys), far above this. */
#define FWD_TOL 2e-5
/* As test_softmax.c (central differences with h = 1e-5 of the double reference are
 * exact to ~1e-10, the float backward's rounding dominates); measured up to 4.3e-7. */
#define BWD_TOL 5e-5
/* Steps vs the causal forward, both float: the same sums in another order; measured up
 * to 1.3e-7. */
#define STEP_TOL (2 * FWD_TOL)

static attn *make(const char *variant, int n, const char *const *set) {
    attn_options o = {.variant = variant, .device = AB_DEV_CPU, .seed = 1, .n_settings = n, .settings = set};
    attn *a = NULL;
    cr_assert_eq(attn_create(&o, &a), 0, "%s: %s", variant, attn_error());
    return a;
}

/* window or stride 0: left at auto. */
static attn *make_sparse(int window, int stride, const char *scale) {
    char w[32], st[32];
    const char *set[3];
    int n = 0;
    snprintf(w, sizeof w, "window=%d", window);
    snprintf(st, sizeof st, "stride=%d", stride);
    if (window) set[n++] = w;
    if (stride) set[n++] = st;
    if (scale) set[n++] = scale;
    return make("sparse", n, set);
}

static long long auto_of(int n) { return llround(sqrt((double)n)) < 1 ? 1 : llround(sqrt((double)n)); }

static ref_shape to_ref(const attn_shape *s) {
    return (ref_shape){s->batch, s->heads, s->len, s->qk_dim, s->v_dim, s->causal, s->lengths};
}

/* Forward with a saved buffer (and, causal or not, the same output without one). */
static float *forward(attn *a, const tu_problem *p) {
    float *out = tu_alloc_f(p->nv), *o2 = tu_alloc_f(p->nv);
    for (size_t i = 0; i < p->nv; i++) out[i] = o2[i] = 7.0f;
    void *saved = malloc(attn_saved_bytes(a, &p->s));
    cr_assert(attn_can_forward_unsaved(a));
    cr_assert_eq(attn_forward(a, &p->s, p->q, p->k, p->v, out, saved), 0, "%s", attn_error());
    cr_assert_eq(attn_forward(a, &p->s, p->q, p->k, p->v, o2, NULL), 0, "%s", attn_error());
    cr_assert_eq(memcmp(out, o2, sizeof(float) * p->nv), 0, "forward without a saved buffer differs");
    free(saved), free(o2);
    return out;
}

static double *reference(const tu_problem *p, long long window, long long stride, double scale) {
    double *q = tu_to_double(p->q, p->nq), *k = tu_to_double(p->k, p->nq), *v = tu_to_double(p->v, p->nv);
    double *out = tu_alloc_d(p->nv);
    ref_shape rs = to_ref(&p->s);
    ref_sparse(&rs, window, stride, scale, q, k, v, out);
    free(q), free(k), free(v);
    return out;
}

static void check_forward(int window, int stride, const char *scale_set, double scale, int B, int H, int N, int D,
                          int M, bool causal, const int *lengths, uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, seed);
    attn *a = make_sparse(window, stride, scale_set);
    float *out = forward(a, &p);
    double *want = reference(&p, window ? window : auto_of(N), stride ? stride : auto_of(N),
                             scale > 0 ? scale : 1.0 / sqrt((double)D));
    double e = tu_rel_err(out, want, p.nv, 1e-30);
    cr_expect_lt(note("fwd", e), FWD_TOL, "window %d stride %d causal=%d N=%d: err %g", window, stride, causal, N, e);
    tu_assert_padded_zero(&p.s, out, M, "out");
    free(out), free(want);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(sparse_forward, windows_strides_lengths) {
    int lens[3] = {150, 67, 0};
    static const int ws[][2] = {{1, 1}, {1, 2}, {1, 7}, {3, 2}, {4, 4}, {5, 3}, {2, 10}, {10, 2}, {64, 5},
                                {20, 64}, {1, 149}, {1, 150}, {1, 1000}, {100, 9}, {1000, 3}};
    for (int c = 0; c <= 1; c++) {
        for (size_t t = 0; t < sizeof ws / sizeof ws[0]; t++)
            check_forward(ws[t][0], ws[t][1], NULL, 0, 3, 2, 150, 5, 3, c, lens, 11 + t); /* ragged blocks */
        check_forward(3, 2, NULL, 0, 1, 1, 1, 4, 3, c, NULL, 31);            /* N = 1 */
        check_forward(0, 0, NULL, 0, 2, 1, 300, 16, 9, c, NULL, 32);         /* auto: window = stride = 17 */
        check_forward(0, 3, NULL, 0, 2, 2, 90, 6, 4, c, NULL, 33);           /* auto window 9, stride 3 */
        check_forward(2, 0, NULL, 0, 2, 2, 90, 6, 4, c, NULL, 34);           /* window 2, auto stride 9 */
        check_forward(3, 5, "scale=0.3", 0.3, 2, 3, 37, 7, 5, c, NULL, 35);  /* an explicit scale */
        check_forward(1, 1, NULL, 0, 1, 1, 200, 4, 4, c, NULL, 36);          /* stride 1: subsequence of 200 rows */
    }
}

/* stride 1 is softmax, a stride of at least N is local with the same window; bit for
 * bit is not promised (other blocks and sums), the values agree to rounding (measured
 * 1.6e-7 and equal). */
static float *other(const char *variant, int n, const char *const *set, const tu_problem *p) {
    attn *a = make(variant, n, set);
    float *o = tu_alloc_f(p->nv);
    void *saved = malloc(attn_saved_bytes(a, &p->s) + 1);
    cr_assert_eq(attn_forward(a, &p->s, p->q, p->k, p->v, o, saved), 0, "%s", attn_error());
    free(saved);
    attn_destroy(a);
    return o;
}

Test(sparse_forward, stride_one_is_softmax_stride_n_is_local) {
    int lens[2] = {90, 41};
    for (int c = 0; c <= 1; c++) {
        tu_problem p;
        tu_problem_init(&p, 2, 2, 90, 6, 5, c, lens, 41);
        attn *s1 = make_sparse(7, 1, NULL), *sn = make_sparse(7, 90, NULL), *sb = make_sparse(7, 1 << 20, NULL);
        float *o1 = forward(s1, &p), *on = forward(sn, &p), *ob = forward(sb, &p);
        const char *lw[1] = {"window=7"};
        float *os = other("softmax", 0, NULL, &p), *ol = other("local", 1, lw, &p);
        double *sd = tu_to_double(os, p.nv), *ld = tu_to_double(ol, p.nv);
        cr_expect_lt(note("stride 1 vs softmax", tu_rel_err(o1, sd, p.nv, 1e-30)), 2 * FWD_TOL, "causal=%d", c);
        cr_expect_lt(note("stride N vs local", tu_rel_err(on, ld, p.nv, 1e-30)), 2 * FWD_TOL, "causal=%d", c);
        cr_expect_lt(note("stride 2^20 vs local", tu_rel_err(ob, ld, p.nv, 1e-30)), 2 * FWD_TOL, "causal=%d", c);
        free(sd), free(ld), free(o1), free(on), free(ob), free(os), free(ol);
        attn_destroy(s1), attn_destroy(sn), attn_destroy(sb);
        tu_problem_free(&p);
    }
}

/* ---- backward ---- */

typedef struct {
    ref_shape r;
    long long window, stride;
    double scale;
    double *q, *k, *v;
} fd_ctx;

static void fd_forward(void *ctx, double *out) {
    fd_ctx *c = ctx;
    ref_sparse(&c->r, c->window, c->stride, c->scale, c->q, c->k, c->v, out);
}

static void check_backward(int window, int stride, int B, int H, int N, int D, int M, bool causal,
                           const int *lengths, uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, seed);
    attn *a = make_sparse(window, stride, NULL);
    float *out = tu_alloc_f(p.nv);
    void *saved = malloc(attn_saved_bytes(a, &p.s));
    cr_assert_eq(attn_forward(a, &p.s, p.q, p.k, p.v, out, saved), 0, "%s", attn_error());
    float *dq = tu_alloc_f(p.nq), *dk = tu_alloc_f(p.nq), *dv = tu_alloc_f(p.nv);
    for (size_t i = 0; i < p.nq; i++) dq[i] = dk[i] = 7.0f;
    for (size_t i = 0; i < p.nv; i++) dv[i] = 7.0f;
    cr_assert_eq(attn_backward(a, &p.s, p.q, p.k, p.v, p.dout, saved, dq, dk, dv), 0, "%s", attn_error());
    fd_ctx c = {to_ref(&p.s), window ? window : auto_of(N), stride ? stride : auto_of(N), 1.0 / sqrt((double)D),
                tu_to_double(p.q, p.nq), tu_to_double(p.k, p.nq), tu_to_double(p.v, p.nv)};
    double *w = tu_to_double(p.dout, p.nv);
    double *gq = tu_alloc_d(p.nq), *gk = tu_alloc_d(p.nq), *gv = tu_alloc_d(p.nv);
    tu_fd_grad(fd_forward, &c, c.q, p.nq, w, p.nv, 1e-5, gq);
    tu_fd_grad(fd_forward, &c, c.k, p.nq, w, p.nv, 1e-5, gk);
    tu_fd_grad(fd_forward, &c, c.v, p.nv, w, p.nv, 1e-5, gv);
    double eq = tu_rel_err(dq, gq, p.nq, 1e-30), ek = tu_rel_err(dk, gk, p.nq, 1e-30);
    double ev = tu_rel_err(dv, gv, p.nv, 1e-30);
    cr_expect_lt(note("eq", eq), BWD_TOL, "window %d stride %d causal=%d N=%d dq err %g", window, stride, causal, N, eq);
    cr_expect_lt(note("ek", ek), BWD_TOL, "window %d stride %d causal=%d N=%d dk err %g", window, stride, causal, N, ek);
    cr_expect_lt(note("ev", ev), BWD_TOL, "window %d stride %d causal=%d N=%d dv err %g", window, stride, causal, N, ev);
    tu_assert_padded_zero(&p.s, dq, D, "dq");
    tu_assert_padded_zero(&p.s, dk, D, "dk");
    tu_assert_padded_zero(&p.s, dv, M, "dv");
    free(gq), free(gk), free(gv), free(w), free(c.q), free(c.k), free(c.v);
    free(out), free(saved), free(dq), free(dk), free(dv);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(sparse_backward, finite_differences) {
    int lens[3] = {12, 7, 0};
    for (int c = 0; c <= 1; c++) {
        check_backward(2, 3, 3, 2, 12, 3, 2, c, lens, 51 + c);
        check_backward(1, 1, 1, 1, 9, 2, 3, c, NULL, 53 + c);  /* stride 1: full softmax */
        check_backward(1, 4, 1, 1, 9, 2, 3, c, NULL, 55 + c);  /* window 1: strided keys only */
        check_backward(3, 20, 1, 1, 9, 2, 3, c, NULL, 57 + c); /* stride > N: the window only */
        check_backward(0, 0, 1, 2, 10, 2, 2, c, NULL, 59 + c); /* auto: 3 and 3 */
        check_backward(4, 2, 1, 1, 1, 3, 2, c, NULL, 61 + c);  /* N = 1 */
    }
}

/* Several blocks in both parts, at each block height (16, 32 and 64 rows for windows
 * below 64, below 128 and from 128, sparse_geo.h): N = 150, window 20 (16 rows, band
 * blocks overlap) with stride 2 (subsequences of 75 rows: five blocks); window 70 (32
 * rows) with stride 1 (one subsequence of 130: five blocks); window 130 (64 rows) with
 * stride 3 at N = 300 (subsequences of 100: two blocks). One slice:
 * with 2 threads (the suite's OMP_NUM_THREADS) the block-parallel passes run, where
 * cases of several slices take a slice per thread. */
Test(sparse_backward, across_blocks) {
    int lens[1] = {141};
    check_backward(20, 2, 1, 1, 150, 2, 1, true, lens, 63);
    check_backward(20, 2, 1, 1, 150, 2, 1, false, NULL, 64);
    check_backward(70, 1, 1, 1, 130, 1, 1, true, NULL, 65);
    check_backward(130, 3, 1, 1, 300, 1, 1, true, NULL, 66);
    check_backward(130, 3, 1, 1, 300, 1, 1, false, NULL, 67);
}

/* ---- recurrent mode ---- */

/* prefill P (P = 0: none) then steps to N - 1 against the causal forward at N = capacity. */
static void check_steps(int window, int stride, int P, bool with_out) {
    enum { B = 2, H = 2, N = 45, D = 5, M = 3 };
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, true, NULL, 71);
    attn *a = make_sparse(window, stride, NULL);
    float *want = forward(a, &p);
    float *got = tu_alloc_f(p.nv);
    tu_run_recurrent(a, &p, N, P, with_out, NULL, 0, got);
    const int from = with_out ? 0 : P; /* rows [from, N) were produced */
    double *w = tu_to_double(want, p.nv);
    double scale = tu_max_abs(w, p.nv), worst = 0;
    for (int bh = 0; bh < B * H; bh++)
        for (int t = from; t < N; t++)
            for (int m = 0; m < M; m++) {
                size_t i = ((size_t)bh * N + t) * M + m;
                worst = fmax(worst, fabs(got[i] - w[i]) / scale);
            }
    cr_expect_lt(note("steps", worst), STEP_TOL, "window %d stride %d prefill %d: steps vs forward %g", window, stride,
                 P, worst);
    free(w), free(got), free(want);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(sparse_recurrent, steps_and_prefill_equal_causal_forward) {
    check_steps(4, 3, 0, false);   /* every position by steps */
    check_steps(4, 3, 13, false);  /* prefill, then steps */
    check_steps(4, 3, 13, true);   /* with the prefill's output */
    check_steps(0, 0, 20, true);   /* auto at the capacity: window = stride = 7 */
    check_steps(1, 1, 5, true);    /* stride 1: every earlier key */
    check_steps(1, 5, 0, false);   /* window 1: strided keys and itself */
    check_steps(8, 100, 9, true);  /* stride beyond the capacity: the window only */
    check_steps(100, 2, 9, true);  /* window beyond the capacity */
}

/* The cache holds every position: the strided part reaches back to position 0. */
Test(sparse_recurrent, state_is_a_cache_of_capacity) {
    attn *a = make_sparse(16, 4, NULL);
    attn_shape s = {2, 3, 1, 8, 4, true, NULL};
    size_t s64 = attn_state_bytes(a, &s, 64), s128 = attn_state_bytes(a, &s, 128);
    cr_assert_geq(s64, (size_t)6 * 64 * (8 + 4) * sizeof(float));
    cr_assert_geq(s128, 2 * s64 - 64, "the state grows with the capacity: %zu vs %zu", s64, s128);
    attn_destroy(a);
}

/* ---- options ---- */

Test(sparse_options, values_and_errors) {
    attn *a = make("sparse", 0, NULL);
    char buf[64];
    cr_assert_str_eq(attn_option_value(a, NULL, "window", buf, sizeof buf), "auto");
    cr_assert_str_eq(attn_option_value(a, NULL, "stride", buf, sizeof buf), "auto");
    attn_shape s = {1, 1, 4, 16, 2, true, NULL};
    cr_assert(fabs(strtod(attn_option_value(a, &s, "scale", buf, sizeof buf), NULL) - 0.25) < 1e-9);
    attn_destroy(a);
    attn *b = make_sparse(5, 9, NULL);
    cr_assert_str_eq(attn_option_value(b, NULL, "window", buf, sizeof buf), "5");
    cr_assert_str_eq(attn_option_value(b, NULL, "stride", buf, sizeof buf), "9");
    attn_destroy(b);
    static const char *const bad[] = {"window=0",  "window=-3",          "window=1073741825", "stride=0",
                                      "stride=-1", "stride=1073741825", "stride=two",        "scale=nan"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        attn_options o = {.variant = "sparse", .device = AB_DEV_CPU, .n_settings = 1, .settings = &bad[i]};
        attn *c = NULL;
        ab_clear_error();
        cr_assert_eq(attn_create(&o, &c), ATTN_EINVAL, "%s accepted", bad[i]);
        cr_assert(!strchr(attn_error(), '\n') && attn_error()[0], "%s", attn_error());
    }
}
