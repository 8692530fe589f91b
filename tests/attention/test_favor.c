/* linear attention with the favor feature map (FAVOR+, attention/favor.h) on the CPU:
 * the projection against the reference's own draw (tests/reference/ref_favor.c) and its
 * orthogonality; forward against the double reference, causal and not, lengths, N = 1,
 * feature counts and chunks; inputs large enough that unshifted features would overflow
 * float; backward against central finite differences of the reference; recurrent steps
 * and prefill equal to the causal forward, with later keys raising the running shift;
 * the estimate of softmax that FAVOR+ is; seeds and options.
 *
 * Errors are tu_rel_err (max abs error over a tensor / its max abs). The features are
 * positive, so the sums have no cancellation; each feature is exp of a float exponent
 * w . x' - |x'|^2/2 - shift whose rounding, about u (|w| |x'| + |x'|^2) (u = 6e-8), is
 * a relative error of the feature: ~1e-6 for N(0, 1) inputs at D <= 16, growing with
 * the inputs' size. */
#include <criterion/criterion.h>

#include "attention.h"
#include "error.h"
#include "favor.h"
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

/* The float sums over N <= 150 keys and C <= 32 features plus the exponents' rounding:
 * measured up to 7.8e-7; 2e-5 leaves 25x. A wrong scale (D^-1/2 for D^-1/4) or a shift
 * that does not cancel is O(1e-1). */
#define FWD_TOL 2e-5
/* Backward vs finite differences of the double reference (h = 1e-4: exact to ~1e-8):
 * measured up to 4.3e-7. */
#define BWD_TOL 5e-5
/* Steps (one row against the state) vs the chunked forward, both float; measured up to
 * 1.9e-7. */
#define STEP_TOL (2 * FWD_TOL)

static attn *make(uint64_t seed, int n, const char *const *extra) {
    const char *set[4] = {"feature_map=favor"};
    for (int i = 0; i < n; i++) set[1 + i] = extra[i];
    attn_options o = {.variant = "linear", .device = AB_DEV_CPU, .seed = seed, .n_settings = 1 + n, .settings = set};
    attn *a = NULL;
    cr_assert_eq(attn_create(&o, &a), 0, "%s", attn_error());
    return a;
}

static ref_shape to_ref(const attn_shape *s) {
    return (ref_shape){s->batch, s->heads, s->len, s->qk_dim, s->v_dim, s->causal, s->lengths};
}

static float *forward(attn *a, const tu_problem *p) {
    float *out = tu_alloc_f(p->nv);
    for (size_t i = 0; i < p->nv; i++) out[i] = 7.0f;
    cr_assert_eq(attn_forward(a, &p->s, p->q, p->k, p->v, out, NULL), 0, "%s", attn_error());
    return out;
}

static double *reference(const tu_problem *p, uint64_t seed, int m, double eps) {
    const int D = p->s.qk_dim;
    double *W = tu_alloc_d((size_t)m * D);
    ref_favor_projection(seed, D, m, W);
    double *q = tu_to_double(p->q, p->nq), *k = tu_to_double(p->k, p->nq), *v = tu_to_double(p->v, p->nv);
    double *out = tu_alloc_d(p->nv);
    ref_shape rs = to_ref(&p->s);
    ref_favor(&rs, W, m, eps, q, k, v, out);
    free(q), free(k), free(v), free(W);
    return out;
}

/* ---- the projection ---- */

Test(favor_projection, equals_reference_and_is_orthogonal) {
    static const struct {
        int D, m;
    } cases[] = {{1, 3}, {4, 8}, {5, 12}, {16, 16}, {7, 3}, {64, 128}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int D = cases[c].D, m = cases[c].m;
        float *W = tu_alloc_f((size_t)m * D);
        void *scratch = malloc(favor_draw_scratch(D));
        favor_draw(99, D, m, scratch, W);
        double *R = tu_alloc_d((size_t)m * D);
        ref_favor_projection(99, D, m, R);
        /* Both round the same double (Gram-Schmidt in double, differently ordered sums:
         * ~1e-16 apart) to float: equal but for an occasional last-bit tie. */
        for (size_t e = 0; e < (size_t)m * D; e++)
            cr_assert(fabs(W[e] - R[e]) <= 1.2e-7 * fabs(R[e]) + 1e-30, "D=%d m=%d W[%zu] %.9g vs reference %.9g", D, m,
                      e, W[e], R[e]);
        /* Rows of one block are orthogonal (cosines at double precision before the
         * float rounding: |cos| below 1e-6); rows of different blocks are not. */
        for (int r = 0; r < m; r++)
            for (int p = r + 1; p < m && p / D == r / D; p++) {
                double dot = 0, nr = 0, np = 0;
                for (int d = 0; d < D; d++) {
                    dot += (double)W[r * D + d] * W[p * D + d];
                    nr += (double)W[r * D + d] * W[r * D + d];
                    np += (double)W[p * D + d] * W[p * D + d];
                }
                cr_assert(fabs(dot) / sqrt(nr * np) < 1e-6, "D=%d rows %d, %d: cos %g", D, r, p, dot / sqrt(nr * np));
            }
        free(W), free(R), free(scratch);
    }
    /* Row lengths are chi(D): their squares average D (over 2048 rows of D = 16: the mean
     * of chi^2(16) / 16 has standard deviation sqrt(2 / 16 / 2048) = 0.0078; 0.05 is 6
     * of those). */
    const int D = 16, m = 2048;
    float *W = tu_alloc_f((size_t)m * D);
    void *scratch = malloc(favor_draw_scratch(D));
    favor_draw(5, D, m, scratch, W);
    double mean = 0;
    for (size_t e = 0; e < (size_t)m * D; e++) mean += (double)W[e] * W[e];
    mean /= (double)m * D;
    cr_expect(fabs(mean - 1.0) < 0.05, "mean |w|^2 / D = %g", mean);
    free(W), free(scratch);
}

/* ---- forward ---- */

static void check_forward(uint64_t seed, int m, int n_extra, const char *const *extra, double eps, int B, int H,
                          int N, int D, int M, bool causal, const int *lengths, double input_sd) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, seed + 100);
    for (size_t i = 0; i < p.nq; i++) p.q[i] *= (float)input_sd, p.k[i] *= (float)input_sd;
    attn *a = make(seed, n_extra, extra);
    float *out = forward(a, &p);
    double *want = reference(&p, seed, m, eps);
    double e = tu_rel_err(out, want, p.nv, 1e-30);
    cr_expect_lt(note("e", e), FWD_TOL, "favor m=%d causal=%d N=%d D=%d M=%d sd=%g: err %g", m, causal, N, D, M, input_sd, e);
    tu_assert_padded_zero(&p.s, out, M, "out");
    free(out), free(want);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(favor_forward, shapes_lengths_features_chunks) {
    int lens[3] = {50, 23, 0}, lens20[2] = {20, 7};
    const char *f3[] = {"features=3"}, *f1[] = {"features=1", "chunk=7"}, *c5[] = {"chunk=5"};
    const char *e1[] = {"eps=0.5"};
    for (int c = 0; c <= 1; c++) {
        check_forward(1, 10, 0, NULL, 1e-6, 3, 2, 50, 5, 3, c, lens, 1.0);   /* default: 2 D features */
        check_forward(2, 3, 1, f3, 1e-6, 2, 3, 37, 7, 5, c, NULL, 1.0);      /* fewer features than D */
        check_forward(3, 1, 2, f1, 1e-6, 1, 2, 29, 4, 2, c, NULL, 1.0);      /* one feature */
        check_forward(4, 8, 1, c5, 1e-6, 2, 1, 1, 4, 3, c, NULL, 1.0);       /* N = 1 */
        check_forward(5, 32, 0, NULL, 1e-6, 1, 2, 150, 16, 9, c, NULL, 1.0); /* several chunks, 2 blocks */
        check_forward(6, 12, 1, e1, 0.5, 2, 2, 20, 6, 4, c, lens20, 1.0);    /* eps on the unshifted denominator */
    }
}

/* Inputs with sd 8 at D = 16: exponents up to several hundred, far past float's exp
 * range (88): only the shifts keep the features finite; the double reference has the
 * range and says the result is the unshifted formula's. The exponents' rounding grows
 * with them (u times ~300: up to 2e-5 relative per feature, so 1e-4 for the output);
 * measured 7.8e-7. */
Test(favor_forward, large_inputs_need_the_shifts) {
    for (int c = 0; c <= 1; c++) {
        tu_problem p;
        tu_problem_init(&p, 1, 2, 40, 16, 4, c, NULL, 61);
        for (size_t i = 0; i < p.nq; i++) p.q[i] *= 8.0f, p.k[i] *= 8.0f;
        attn *a = make(7, 0, NULL);
        float *out = forward(a, &p);
        for (size_t i = 0; i < p.nv; i++) cr_assert(isfinite(out[i]), "out[%zu] = %g", i, out[i]);
        double *want = reference(&p, 7, 32, 1e-6);
        double e = tu_rel_err(out, want, p.nv, 1e-30);
        cr_expect_lt(note("e", e), 1e-4, "large inputs causal=%d: err %g", c, e);
        free(out), free(want);
        attn_destroy(a);
        tu_problem_free(&p);
    }
}

/* FAVOR+ estimates softmax(q.k / sqrt(D)): with many orthogonal features the outputs
 * approach softmax's at that scale, and not softmax's at another scale. The estimator's
 * variance grows as exp(|q' + k'|^2), so the inputs are small: N(0, 0.5^2) at D = 4
 * (N = 24, non-causal, seed 3). Measured relative errors against softmax: 0.43 with 8
 * features, 0.026 with 8192; with 8192 against softmax at half the scale 0.16. (With
 * N(0, 1) inputs 8192 features still err by 0.56: FAVOR+'s known weakness with large
 * inputs, not this implementation's; the reference agrees with it there too.) */
static double vs_softmax(const tu_problem *p, const float *out, double scale) {
    double *q = tu_to_double(p->q, p->nq), *k = tu_to_double(p->k, p->nq), *v = tu_to_double(p->v, p->nv);
    double *want = tu_alloc_d(p->nv);
    ref_shape rs = to_ref(&p->s);
    ref_softmax(&rs, scale, q, k, v, want);
    double e = tu_rel_err(out, want, p->nv, 1e-30);
    free(q), free(k), free(v), free(want);
    return e;
}

Test(favor_forward, estimates_softmax) {
    tu_problem p;
    tu_problem_init(&p, 1, 1, 24, 4, 3, false, NULL, 71);
    for (size_t i = 0; i < p.nq; i++) p.q[i] *= 0.5f, p.k[i] *= 0.5f;
    const char *few[] = {"features=8"}, *many[] = {"features=8192"};
    attn *a8 = make(3, 1, few), *a8k = make(3, 1, many);
    float *o8 = forward(a8, &p), *o8k = forward(a8k, &p);
    const double e8 = vs_softmax(&p, o8, 0.5), e8k = vs_softmax(&p, o8k, 0.5), half = vs_softmax(&p, o8k, 0.25);
    if (getenv("TC_PRINT")) fprintf(stderr, "favor vs softmax: 8 features %g, 8192 %g, half scale %g\n", e8, e8k, half);
    cr_expect_lt(e8k, 0.05, "8192 features: %g from softmax", e8k);
    cr_expect_gt(e8, e8k, "more features do not estimate better (%g vs %g)", e8, e8k);
    cr_expect_gt(half, 0.1, "as close to softmax at half the scale: %g", half);
    free(o8), free(o8k);
    attn_destroy(a8), attn_destroy(a8k);
    tu_problem_free(&p);
}

/* ---- backward ---- */

typedef struct {
    ref_shape r;
    double *W;
    int m;
    double eps;
    double *q, *k, *v;
} fd_ctx;

static void fd_forward(void *ctx, double *out) {
    fd_ctx *c = ctx;
    ref_favor(&c->r, c->W, c->m, c->eps, c->q, c->k, c->v, out);
}

static void check_backward(uint64_t seed, int m, int n_extra, const char *const *extra, double eps, int B, int H,
                           int N, int D, int M, bool causal, const int *lengths) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, seed + 200);
    attn *a = make(seed, n_extra, extra);
    float *out = forward(a, &p);
    float *dq = tu_alloc_f(p.nq), *dk = tu_alloc_f(p.nq), *dv = tu_alloc_f(p.nv);
    for (size_t i = 0; i < p.nq; i++) dq[i] = dk[i] = 7.0f;
    for (size_t i = 0; i < p.nv; i++) dv[i] = 7.0f;
    cr_assert_eq(attn_backward(a, &p.s, p.q, p.k, p.v, p.dout, NULL, dq, dk, dv), 0, "%s", attn_error());
    fd_ctx c = {to_ref(&p.s), tu_alloc_d((size_t)m * D), m, eps, tu_to_double(p.q, p.nq), tu_to_double(p.k, p.nq),
                tu_to_double(p.v, p.nv)};
    ref_favor_projection(seed, D, m, c.W);
    double *w = tu_to_double(p.dout, p.nv);
    double *gq = tu_alloc_d(p.nq), *gk = tu_alloc_d(p.nq), *gv = tu_alloc_d(p.nv);
    tu_fd_grad(fd_forward, &c, c.q, p.nq, w, p.nv, 1e-4, gq);
    tu_fd_grad(fd_forward, &c, c.k, p.nq, w, p.nv, 1e-4, gk);
    tu_fd_grad(fd_forward, &c, c.v, p.nv, w, p.nv, 1e-4, gv);
    double eq = tu_rel_err(dq, gq, p.nq, 1e-30), ek = tu_rel_err(dk, gk, p.nq, 1e-30), ev = tu_rel_err(dv, gv, p.nv, 1e-30);
    cr_expect_lt(note("eq", eq), BWD_TOL, "favor causal=%d N=%d dq err %g", causal, N, eq);
    cr_expect_lt(note("ek", ek), BWD_TOL, "favor causal=%d N=%d dk err %g", causal, N, ek);
    cr_expect_lt(note("ev", ev), BWD_TOL, "favor causal=%d N=%d dv err %g", causal, N, ev);
    tu_assert_padded_zero(&p.s, dq, D, "dq");
    tu_assert_padded_zero(&p.s, dk, D, "dk");
    tu_assert_padded_zero(&p.s, dv, M, "dv");
    free(gq), free(gk), free(gv), free(w), free(c.q), free(c.k), free(c.v), free(c.W);
    free(out), free(dq), free(dk), free(dv);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(favor_backward, finite_differences) {
    int lens[3] = {8, 5, 0};
    const char *c3[] = {"chunk=3"}, *f5[] = {"features=5", "eps=0.5"};
    for (int c = 0; c <= 1; c++) {
        check_backward(11, 6, 1, c3, 1e-6, 3, 2, 8, 3, 3, c, lens); /* several chunks */
        check_backward(12, 5, 2, f5, 0.5, 1, 1, 1, 3, 2, c, NULL);  /* N = 1: dq, dk through eps (0.5) */
        check_backward(13, 10, 0, NULL, 1e-6, 1, 1, 11, 5, 3, c, NULL);
    }
}

/* ---- recurrent mode ---- */

/* Steps from P (after a prefill of P, P = 0: none) to N - 1 against the causal forward.
 * grow: the keys' size grows along the sequence (sd 0.3 to 4), so later keys raise the
 * running shift and the state is rescaled on the way. */
static void check_steps(int P, bool with_out, bool grow) {
    const int B = 2, H = 2, N = 30, D = 6, M = 3;
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, true, NULL, 81);
    if (grow)
        for (int bh = 0; bh < B * H; bh++)
            for (int t = 0; t < N; t++)
                for (int d = 0; d < D; d++) p.k[((size_t)bh * N + t) * D + d] *= 0.3f + 3.7f * t / (N - 1);
    attn *a = make(17, 0, NULL);
    float *want = forward(a, &p);
    float *got = tu_alloc_f(p.nv);
    tu_run_recurrent(a, &p, N, P, with_out, NULL, 0, got);
    const int from = with_out ? 0 : P;
    double *w = tu_to_double(want, p.nv), scale = tu_max_abs(w, p.nv), worst = 0;
    for (int bh = 0; bh < B * H; bh++)
        for (int t = from; t < N; t++)
            for (int m = 0; m < M; m++) {
                size_t i = ((size_t)bh * N + t) * M + m;
                worst = fmax(worst, fabs(got[i] - w[i]) / scale);
            }
    cr_expect_lt(note("worst", worst), STEP_TOL, "prefill %d (out %d) grow %d: steps vs forward %g", P, with_out, grow, worst);
    free(w), free(got), free(want);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(favor_recurrent, steps_and_prefill_equal_causal_forward) {
    for (int grow = 0; grow <= 1; grow++) {
        check_steps(0, false, grow);
        check_steps(11, false, grow);
        check_steps(11, true, grow);
        check_steps(30, true, grow);
    }
}

Test(favor_recurrent, state_constant_in_length) {
    attn *a = make(1, 0, NULL);
    attn_shape s = {2, 3, 1, 8, 4, true, NULL};
    cr_assert_eq(attn_state_bytes(a, &s, 4), attn_state_bytes(a, &s, 1 << 20));
    attn_destroy(a);
}

/* ---- seeds and options ---- */

Test(favor_options, seeds_features_and_errors) {
    tu_problem p;
    tu_problem_init(&p, 1, 2, 16, 5, 3, true, NULL, 91);
    attn *a = make(1, 0, NULL), *b = make(1, 0, NULL), *c = make(2, 0, NULL);
    float *oa = forward(a, &p), *ob = forward(b, &p), *oc = forward(c, &p);
    cr_assert(memcmp(oa, ob, p.nv * sizeof(float)) == 0, "the same seed gave other numbers");
    double *da = tu_to_double(oa, p.nv);
    cr_assert_gt(tu_rel_err(oc, da, p.nv, 1e-30), 1e-3, "another seed gave the same features");
    /* reseeding draws the other seed's features (per call: training redraws every step) */
    attn_reseed(a, 2);
    float *oa2 = forward(a, &p);
    cr_assert(memcmp(oa2, oc, p.nv * sizeof(float)) == 0, "attn_reseed did not redraw");
    char buf[64];
    cr_assert_str_eq(attn_option_value(a, NULL, "features", buf, sizeof buf), "auto");
    free(oa), free(ob), free(oc), free(oa2), free(da);
    attn_destroy(a), attn_destroy(b), attn_destroy(c);
    /* features belongs to favor: another map refuses it, in one line, at its first shape */
    const char *set[] = {"feature_map=elu", "features=8"};
    attn_options o = {.variant = "linear", .device = AB_DEV_CPU, .n_settings = 2, .settings = set};
    attn *e = NULL;
    cr_assert_eq(attn_create(&o, &e), 0, "%s", attn_error());
    ab_clear_error();
    cr_assert_eq(attn_check_shape(e, &p.s), ATTN_EINVAL);
    cr_assert(strstr(attn_error(), "features") && strstr(attn_error(), "favor") && !strchr(attn_error(), '\n'), "%s",
              attn_error());
    attn_destroy(e);
    tu_problem_free(&p);
}
