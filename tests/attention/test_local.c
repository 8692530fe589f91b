/* local (sliding-window softmax) on the CPU: forward against the double reference
 * (ref_local, tests/reference/ref_softmax.c) for windows from 1 to beyond N, causal and
 * not, lengths with 0 and N, N = 1; window >= N equal to the softmax variant; backward
 * against central finite differences of the reference; recurrent steps and prefill
 * equal to the causal forward (the ring wrapping around); the state's size; options.
 *
 * Errors are tu_rel_err (max abs error over a tensor / its max abs). The arithmetic is
 * softmax's over at most `window` keys per row, so test_softmax.c's bounds apply. */
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

/* As test_softmax.c: the worst-case float sum over N <= 300 keys (2e-5); measured up to
 * 5.7e-7 here. A window off by one changes a row's output by O(1 / window). */
#define FWD_TOL 2e-5
/* As test_softmax.c (finite differences with h = 1e-5 are exact to ~1e-10); measured up
 * to 2.9e-7. */
#define BWD_TOL 5e-5
/* Steps vs the causal forward, both float: the same sums in another order; measured up
 * to 1.1e-7. */
#define STEP_TOL (2 * FWD_TOL)

static attn *make(const char *variant, int n, const char *const *set) {
    attn_options o = {.variant = variant, .device = AB_DEV_CPU, .seed = 1, .n_settings = n, .settings = set};
    attn *a = NULL;
    cr_assert_eq(attn_create(&o, &a), 0, "%s: %s", variant, attn_error());
    return a;
}

static attn *make_local(int window, const char *scale) {
    static char w[32];
    snprintf(w, sizeof w, "window=%d", window);
    const char *set[2] = {w, scale};
    return make("local", scale ? 2 : 1, set);
}

static ref_shape to_ref(const attn_shape *s) {
    return (ref_shape){s->batch, s->heads, s->len, s->qk_dim, s->v_dim, s->causal, s->lengths};
}

static float *forward(attn *a, const tu_problem *p) {
    float *out = tu_alloc_f(p->nv);
    for (size_t i = 0; i < p->nv; i++) out[i] = 7.0f;
    cr_assert_eq(attn_saved_bytes(a, &p->s), 0u, "local saves nothing");
    cr_assert_eq(attn_forward(a, &p->s, p->q, p->k, p->v, out, NULL), 0, "%s", attn_error());
    return out;
}

static double *reference(const tu_problem *p, int window, double scale) {
    double *q = tu_to_double(p->q, p->nq), *k = tu_to_double(p->k, p->nq), *v = tu_to_double(p->v, p->nv);
    double *out = tu_alloc_d(p->nv);
    ref_shape rs = to_ref(&p->s);
    ref_local(&rs, window, scale, q, k, v, out);
    free(q), free(k), free(v);
    return out;
}

static void check_forward(int window, const char *scale_set, double scale, int B, int H, int N, int D, int M,
                          bool causal, const int *lengths, uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, seed);
    attn *a = make_local(window, scale_set);
    float *out = forward(a, &p);
    double *want = reference(&p, window, scale > 0 ? scale : 1.0 / sqrt((double)D));
    double e = tu_rel_err(out, want, p.nv, 1e-30);
    cr_expect_lt(note("e", e), FWD_TOL, "window %d causal=%d N=%d D=%d M=%d: err %g", window, causal, N, D, M, e);
    tu_assert_padded_zero(&p.s, out, M, "out");
    free(out), free(want);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(local_forward, windows_shapes_lengths) {
    int lens[3] = {150, 67, 0};
    static const int windows[] = {1, 2, 5, 64, 65, 100, 149, 150, 1000};
    for (int c = 0; c <= 1; c++) {
        for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++)
            check_forward(windows[w], NULL, 0, 3, 2, 150, 5, 3, c, lens, 11 + w); /* blocks of 64 rows, ragged */
        check_forward(3, NULL, 0, 1, 1, 1, 4, 3, c, NULL, 21);                    /* N = 1 */
        check_forward(256, NULL, 0, 2, 1, 300, 16, 9, c, NULL, 22);               /* the default window */
        check_forward(7, "scale=0.3", 0.3, 2, 3, 37, 7, 5, c, NULL, 23);          /* an explicit scale */
    }
}

/* A window of at least N is softmax; bit for bit is not promised (other blocks of
 * rows), the values agree to rounding (measured: equal). */
Test(local_forward, window_at_least_n_is_softmax) {
    int lens[2] = {90, 41};
    for (int c = 0; c <= 1; c++) {
        tu_problem p;
        tu_problem_init(&p, 2, 2, 90, 6, 5, c, lens, 31);
        attn *loc = make_local(90, NULL), *big = make_local(1 << 20, NULL), *smx = make("softmax", 0, NULL);
        float *o1 = forward(loc, &p), *o2 = forward(big, &p), *os = tu_alloc_f(p.nv);
        void *saved = malloc(attn_saved_bytes(smx, &p.s));
        cr_assert_eq(attn_forward(smx, &p.s, p.q, p.k, p.v, os, saved), 0, "%s", attn_error());
        double *sd = tu_to_double(os, p.nv);
        cr_expect_lt(note("window N vs softmax", tu_rel_err(o1, sd, p.nv, 1e-30)), 2 * FWD_TOL,
                     "window = N vs softmax, causal=%d", c);
        cr_expect_lt(note("window 2^20 vs softmax", tu_rel_err(o2, sd, p.nv, 1e-30)), 2 * FWD_TOL,
                     "window 2^20 vs softmax, causal=%d", c);
        free(saved), free(sd), free(o1), free(o2), free(os);
        attn_destroy(loc), attn_destroy(big), attn_destroy(smx);
        tu_problem_free(&p);
    }
}

/* ---- backward ---- */

typedef struct {
    ref_shape r;
    int window;
    double scale;
    double *q, *k, *v;
} fd_ctx;

static void fd_forward(void *ctx, double *out) {
    fd_ctx *c = ctx;
    ref_local(&c->r, c->window, c->scale, c->q, c->k, c->v, out);
}

static void check_backward(int window, int B, int H, int N, int D, int M, bool causal, const int *lengths,
                           uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, seed);
    attn *a = make_local(window, NULL);
    float *out = forward(a, &p);
    float *dq = tu_alloc_f(p.nq), *dk = tu_alloc_f(p.nq), *dv = tu_alloc_f(p.nv);
    for (size_t i = 0; i < p.nq; i++) dq[i] = dk[i] = 7.0f;
    for (size_t i = 0; i < p.nv; i++) dv[i] = 7.0f;
    cr_assert_eq(attn_backward(a, &p.s, p.q, p.k, p.v, p.dout, NULL, dq, dk, dv), 0, "%s", attn_error());
    fd_ctx c = {to_ref(&p.s), window, 1.0 / sqrt((double)D), tu_to_double(p.q, p.nq), tu_to_double(p.k, p.nq),
                tu_to_double(p.v, p.nv)};
    double *w = tu_to_double(p.dout, p.nv);
    double *gq = tu_alloc_d(p.nq), *gk = tu_alloc_d(p.nq), *gv = tu_alloc_d(p.nv);
    tu_fd_grad(fd_forward, &c, c.q, p.nq, w, p.nv, 1e-5, gq);
    tu_fd_grad(fd_forward, &c, c.k, p.nq, w, p.nv, 1e-5, gk);
    tu_fd_grad(fd_forward, &c, c.v, p.nv, w, p.nv, 1e-5, gv);
    double eq = tu_rel_err(dq, gq, p.nq, 1e-30), ek = tu_rel_err(dk, gk, p.nq, 1e-30), ev = tu_rel_err(dv, gv, p.nv, 1e-30);
    cr_expect_lt(note("eq", eq), BWD_TOL, "window %d causal=%d N=%d dq err %g", window, causal, N, eq);
    cr_expect_lt(note("ek", ek), BWD_TOL, "window %d causal=%d N=%d dk err %g", window, causal, N, ek);
    cr_expect_lt(note("ev", ev), BWD_TOL, "window %d causal=%d N=%d dv err %g", window, causal, N, ev);
    tu_assert_padded_zero(&p.s, dq, D, "dq");
    tu_assert_padded_zero(&p.s, dk, D, "dk");
    tu_assert_padded_zero(&p.s, dv, M, "dv");
    free(gq), free(gk), free(gv), free(w), free(c.q), free(c.k), free(c.v);
    free(out), free(dq), free(dk), free(dv);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(local_backward, finite_differences) {
    int lens[3] = {10, 6, 0};
    for (int c = 0; c <= 1; c++) {
        check_backward(3, 3, 2, 10, 3, 2, c, lens, 41 + c);
        check_backward(1, 1, 1, 7, 2, 3, c, NULL, 43 + c); /* window 1: each row its own key */
        check_backward(4, 1, 1, 1, 3, 2, c, NULL, 45 + c); /* N = 1 */
    }
}

/* Blocks of 64 rows whose key ranges overlap (backward runs them class by class):
 * N = 150 with windows 20 and 70 (a block's keys reach into one and two blocks back). */
Test(local_backward, across_blocks) {
    int lens[1] = {141};
    check_backward(20, 1, 1, 150, 2, 2, true, lens, 47);
    check_backward(70, 1, 1, 150, 2, 1, false, NULL, 48);
}

/* ---- recurrent mode ---- */

/* prefill P (P = 0: none) then steps to N - 1 against the causal forward. */
static void check_steps(int window, int P, int capacity, bool with_out) {
    const int B = 2, H = 2, N = 45, D = 5, M = 3;
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, true, NULL, 51);
    attn *a = make_local(window, NULL);
    float *want = forward(a, &p);
    float *got = tu_alloc_f(p.nv);
    tu_run_recurrent(a, &p, capacity, P, with_out, NULL, 0, got);
    /* rows [from, N) were produced */
    const int from = with_out ? 0 : P;
    double *w = tu_to_double(want, p.nv);
    double scale = tu_max_abs(w, p.nv), worst = 0;
    for (int bh = 0; bh < B * H; bh++)
        for (int t = from; t < N; t++)
            for (int m = 0; m < M; m++) {
                size_t i = ((size_t)bh * N + t) * M + m;
                worst = fmax(worst, fabs(got[i] - w[i]) / scale);
            }
    cr_expect_lt(note("worst", worst), STEP_TOL, "window %d prefill %d capacity %d: steps vs forward %g", window, P, capacity, worst);
    free(w), free(got), free(want);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(local_recurrent, steps_and_prefill_equal_causal_forward) {
    check_steps(8, 0, 45, false);   /* the ring of 8 wraps five times */
    check_steps(8, 13, 45, false);  /* prefill longer than the window, then steps */
    check_steps(8, 13, 45, true);   /* with the prefill's output */
    check_steps(8, 5, 45, true);    /* prefill shorter than the window */
    check_steps(1, 3, 45, true);    /* window 1: out = v */
    check_steps(256, 20, 45, true); /* window longer than the capacity: ring of 45 */
    check_steps(45, 0, 45, false);  /* window = capacity */
}

Test(local_recurrent, state_constant_in_length) {
    attn *a = make_local(16, NULL);
    attn_shape s = {2, 3, 1, 8, 4, true, NULL};
    size_t s16 = attn_state_bytes(a, &s, 16), s1m = attn_state_bytes(a, &s, 1 << 20), s5 = attn_state_bytes(a, &s, 5);
    cr_assert_eq(s16, s1m, "the ring holds at most the window: %zu vs %zu", s16, s1m);
    cr_assert_geq(s16, (size_t)6 * 16 * (8 + 4) * sizeof(float));
    cr_assert_lt(s5, s16, "a capacity below the window needs fewer slots");
    attn_destroy(a);
}

/* ---- options ---- */

Test(local_options, values_and_errors) {
    attn *a = make("local", 0, NULL);
    char buf[64];
    cr_assert_str_eq(attn_option_value(a, NULL, "window", buf, sizeof buf), "256");
    attn_shape s = {1, 1, 4, 16, 2, true, NULL};
    cr_assert(fabs(strtod(attn_option_value(a, &s, "scale", buf, sizeof buf), NULL) - 0.25) < 1e-9);
    attn_destroy(a);
    static const char *const bad[] = {"window=0", "window=-3", "window=1073741825", "window=two", "scale=nan"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        attn_options o = {.variant = "local", .device = AB_DEV_CPU, .n_settings = 1, .settings = &bad[i]};
        attn *b = NULL;
        ab_clear_error();
        cr_assert_eq(attn_create(&o, &b), ATTN_EINVAL, "%s accepted", bad[i]);
        cr_assert(!strchr(attn_error(), '\n') && attn_error()[0], "%s", attn_error());
    }
}
