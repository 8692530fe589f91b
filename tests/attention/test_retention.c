/* retention on the CPU: the double reference's gradients against central finite
 * differences of its forward; forward and backward against the reference (ref_retention,
 * tests/reference/ref_retention.c), causal and not, chunks from 1 to beyond N (ones that
 * do not divide N), the per-head default decay and the gamma option, an explicit scale,
 * lengths with 0 and N (padded inputs set to NaN: never read); recurrent steps and prefill
 * against the causal forward; N = 4096 with gamma near 1 and far from it; the options.
 *
 * Errors are tu_rel_err (max abs error over a tensor / its max abs). The float32 argument
 * for the bounds: each output is a sum of at most N terms s gamma^|i-j| (q.k) v, each
 * rounded at ~u = 6e-8 relative through a dot product of D (or M) terms, the decay
 * factors rounded once (computed in double), and the chunked sum adds the state's part
 * (itself such a sum) to the chunk's own: error about u (D + T + N/T) |terms| in the worst
 * case, far less in practice (random signs). */
#include <criterion/criterion.h>

#include "attention.h"
#include "error.h"
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

/* Forward and backward against the double reference at N <= 100, D, M <= 16: the worst
 * case above is u (16 + 100 + 100) |terms| ~ 1.3e-5 of the terms' magnitude, which for
 * random data is within a small factor of the largest output; measured up to 2.7e-7
 * (forward) and 4.3e-7 (backward). */
#define FWD_TOL 1e-5
#define BWD_TOL 2e-5
/* The reference's analytic gradients against central differences of its forward, all
 * in double: h = 1e-5 leaves truncation error h^2 |f'''| ~ 1e-10 and rounding
 * 1e-16 / h ~ 1e-11 (the forward is polynomial of degree 3 in the inputs); measured
 * up to 9.2e-11. */
#define REF_FD_TOL 1e-7
/* Steps (a float state decayed by float gamma once per position) and prefill against
 * the chunked causal forward: the same sums in another order, both float, and
 * gamma^e as float(gamma)^e against float(gamma^e), a relative difference of about
 * e u for the e <= 60 positions of these tests; measured up to 2.8e-7. */
#define STEP_TOL 1e-5
/* N = 4096, D = M = 8 against the double reference: the worst case u (8 + 64 + 64) and
 * the terms' sum over up to 1 / (1 - gamma) ~ N positions (gamma = 0.9999 keeps them
 * all: |terms| ~ N while the output, a sum of random signs, is ~ sqrt N, so a relative
 * error of u sqrt(N) (D + T + N/T) ~ 5e-4 in the worst case); measured up to 7.4e-7
 * (forward) and 8.1e-7 (backward), both at gamma = 0.9999. */
#define LONG_TOL 5e-5

static attn *make(int n, const char *const *set) {
    attn_options o = {.variant = "retention", .device = AB_DEV_CPU, .seed = 1, .n_settings = n, .settings = set};
    attn *a = NULL;
    cr_assert_eq(attn_create(&o, &a), 0, "retention: %s", attn_error());
    return a;
}

/* The decay of each of H heads: gamma (> 0), or the per-head rule (gamma <= 0). */
static double *gammas(int H, double gamma) {
    double *g = tu_alloc_d((size_t)H);
    for (int h = 0; h < H; h++) g[h] = gamma > 0 ? gamma : 1.0 - ldexp(1.0, -5 - h);
    return g;
}

static ref_shape to_ref(const attn_shape *s) {
    return (ref_shape){s->batch, s->heads, s->len, s->qk_dim, s->v_dim, s->causal, s->lengths};
}

/* Positions >= lengths[b] of q, k, v and dout set to NaN: a backend that reads them
 * gives NaN somewhere (the reference never reads them). */
static void poison_padding(tu_problem *p) {
    const attn_shape *s = &p->s;
    if (!s->lengths) return;
    for (int b = 0; b < s->batch; b++)
        for (int h = 0; h < s->heads; h++)
            for (int i = s->lengths[b]; i < s->len; i++) {
                size_t row = ((size_t)b * s->heads + h) * s->len + i;
                for (int e = 0; e < s->qk_dim; e++) p->q[row * s->qk_dim + e] = p->k[row * s->qk_dim + e] = NAN;
                for (int e = 0; e < s->v_dim; e++) p->v[row * s->v_dim + e] = p->dout[row * s->v_dim + e] = NAN;
            }
}

typedef struct {
    const char *gamma, *scale, *chunk; /* settings or NULL */
} ret_opts;

static attn *make_opts(const ret_opts *o) {
    const char *set[3];
    int n = 0;
    if (o->gamma) set[n++] = o->gamma;
    if (o->scale) set[n++] = o->scale;
    if (o->chunk) set[n++] = o->chunk;
    return make(n, set);
}

static double opt_num(const char *setting, double dflt) {
    return setting ? strtod(strchr(setting, '=') + 1, NULL) : dflt;
}

/* Forward and backward of one case against the reference; returns the largest error. */
static double check_case(const ret_opts *o, int B, int H, int N, int D, int M, bool causal, const int *lengths,
                         uint64_t seed, double fwd_tol, double bwd_tol) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, seed);
    poison_padding(&p);
    attn *a = make_opts(o);
    cr_assert_eq(attn_saved_bytes(a, &p.s), 0u, "retention saves nothing");
    float *out = tu_alloc_f(p.nv), *dq = tu_alloc_f(p.nq), *dk = tu_alloc_f(p.nq), *dv = tu_alloc_f(p.nv);
    for (size_t i = 0; i < p.nv; i++) out[i] = dv[i] = 7.0f;
    for (size_t i = 0; i < p.nq; i++) dq[i] = dk[i] = 7.0f;
    cr_assert_eq(attn_forward(a, &p.s, p.q, p.k, p.v, out, NULL), 0, "%s", attn_error());
    cr_assert_eq(attn_backward(a, &p.s, p.q, p.k, p.v, p.dout, NULL, dq, dk, dv), 0, "%s", attn_error());

    double scale = opt_num(o->scale, 1.0 / sqrt((double)D)), *gm = gammas(H, opt_num(o->gamma, 0));
    double *q = tu_to_double(p.q, p.nq), *k = tu_to_double(p.k, p.nq), *v = tu_to_double(p.v, p.nv);
    double *g = tu_to_double(p.dout, p.nv);
    double *want = tu_alloc_d(p.nv), *gq = tu_alloc_d(p.nq), *gk = tu_alloc_d(p.nq), *gv = tu_alloc_d(p.nv);
    ref_shape rs = to_ref(&p.s);
    ref_retention(&rs, gm, scale, q, k, v, want);
    ref_retention_backward(&rs, gm, scale, q, k, v, g, gq, gk, gv);
    double e[4] = {tu_rel_err(out, want, p.nv, 1e-30), tu_rel_err(dq, gq, p.nq, 1e-30),
                   tu_rel_err(dk, gk, p.nq, 1e-30), tu_rel_err(dv, gv, p.nv, 1e-30)};
    const char *names[4] = {"out", "dq", "dk", "dv"};
    char what[160];
    for (int t = 0; t < 4; t++) {
        snprintf(what, sizeof what, "%s %s %s %s causal=%d N=%d D=%d M=%d", names[t], o->gamma ? o->gamma : "",
                 o->scale ? o->scale : "", o->chunk ? o->chunk : "", causal, N, D, M);
        cr_expect(isfinite(e[t]) && note(what, e[t]) < (t ? bwd_tol : fwd_tol), "%s: err %g", what, e[t]);
    }
    tu_assert_padded_zero(&p.s, out, M, "out");
    tu_assert_padded_zero(&p.s, dq, D, "dq");
    tu_assert_padded_zero(&p.s, dk, D, "dk");
    tu_assert_padded_zero(&p.s, dv, M, "dv");
    free(q), free(k), free(v), free(g), free(want), free(gq), free(gk), free(gv), free(gm);
    free(out), free(dq), free(dk), free(dv);
    attn_destroy(a);
    tu_problem_free(&p);
    return fmax(fmax(e[0], e[1]), fmax(e[2], e[3]));
}

/* ---- the reference's gradients ---- */

typedef struct {
    ref_shape r;
    const double *gamma;
    double scale;
    double *q, *k, *v;
} fd_ctx;

static void fd_forward(void *ctx, double *out) {
    fd_ctx *c = ctx;
    ref_retention(&c->r, c->gamma, c->scale, c->q, c->k, c->v, out);
}

static void check_ref_grad(int B, int H, int N, int D, int M, bool causal, const int *lengths, double gamma,
                           uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, seed);
    double *gm = gammas(H, gamma);
    fd_ctx c = {to_ref(&p.s), gm, 0.7, tu_to_double(p.q, p.nq), tu_to_double(p.k, p.nq), tu_to_double(p.v, p.nv)};
    double *w = tu_to_double(p.dout, p.nv);
    double *aq = tu_alloc_d(p.nq), *ak = tu_alloc_d(p.nq), *av = tu_alloc_d(p.nv);
    double *fq = tu_alloc_d(p.nq), *fk = tu_alloc_d(p.nq), *fv = tu_alloc_d(p.nv);
    ref_retention_backward(&c.r, gm, c.scale, c.q, c.k, c.v, w, aq, ak, av);
    tu_fd_grad(fd_forward, &c, c.q, p.nq, w, p.nv, 1e-5, fq);
    tu_fd_grad(fd_forward, &c, c.k, p.nq, w, p.nv, 1e-5, fk);
    tu_fd_grad(fd_forward, &c, c.v, p.nv, w, p.nv, 1e-5, fv);
    const double *an[3] = {aq, ak, av}, *fd[3] = {fq, fk, fv};
    const size_t n[3] = {p.nq, p.nq, p.nv};
    for (int t = 0; t < 3; t++) {
        double err = 0, mag = 1e-30;
        for (size_t i = 0; i < n[t]; i++) {
            err = fmax(err, fabs(an[t][i] - fd[t][i]));
            mag = fmax(mag, fabs(fd[t][i]));
        }
        cr_expect_lt(note("ref vs fd", err / mag), REF_FD_TOL, "tensor %d causal=%d N=%d: %g", t, causal, N,
                     err / mag);
    }
    free(aq), free(ak), free(av), free(fq), free(fk), free(fv), free(w), free(c.q), free(c.k), free(c.v), free(gm);
    tu_problem_free(&p);
}

Test(retention_reference, gradients_are_finite_differences) {
    int lens[3] = {9, 5, 0};
    for (int c = 0; c <= 1; c++) {
        check_ref_grad(3, 2, 9, 3, 2, c, lens, 0, 61 + c);  /* per-head decay, padding */
        check_ref_grad(1, 1, 7, 2, 3, c, NULL, 0.6, 63 + c); /* one gamma */
        check_ref_grad(1, 2, 6, 2, 2, c, NULL, 1.0, 65 + c); /* no decay */
    }
}

/* ---- forward and backward against the reference ---- */

Test(retention, chunks_causal_and_not) {
    int lens[3] = {50, 23, 0};
    static const char *chunks[] = {"chunk=1", "chunk=3", "chunk=7", "chunk=16", "chunk=50", "chunk=1000", NULL};
    for (int c = 0; c <= 1; c++)
        for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
            ret_opts o = {NULL, NULL, chunks[i]};
            check_case(&o, 3, 4, 50, 5, 6, c, lens, 100 + i, FWD_TOL, BWD_TOL); /* 4 heads: 4 decays */
        }
}

Test(retention, gamma_and_scale_options) {
    static const ret_opts opts[] = {
        {"gamma=0.9", NULL, "chunk=8"},      {"gamma=1", NULL, "chunk=8"},      {"gamma=0.3", NULL, "chunk=5"},
        {"gamma=1e-3", NULL, NULL},          {"gamma=0.97", "scale=0.3", "chunk=13"},
        {"gamma=auto", "scale=-1.5", NULL}, {NULL, "scale=0", "chunk=4"},
    };
    for (int c = 0; c <= 1; c++)
        for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
            check_case(&opts[i], 2, 3, 41, 4, 3, c, NULL, 120 + i, FWD_TOL, BWD_TOL);
}

/* Shapes: N = 1, one chunk, wide heads (small_gemm's widths: multiples of 16) and
 * narrow ones, D != M both ways. */
Test(retention, shapes) {
    int lens[2] = {1, 0};
    for (int c = 0; c <= 1; c++) {
        ret_opts dflt = {NULL, NULL, NULL}, ch = {NULL, NULL, "chunk=9"};
        check_case(&dflt, 2, 1, 1, 3, 2, c, lens, 140, FWD_TOL, BWD_TOL);
        check_case(&dflt, 1, 2, 70, 16, 32, c, NULL, 141, FWD_TOL, BWD_TOL);
        check_case(&ch, 1, 2, 70, 32, 16, c, NULL, 142, FWD_TOL, BWD_TOL);
        check_case(&ch, 1, 1, 30, 1, 1, c, NULL, 143, FWD_TOL, BWD_TOL);
    }
}

/* N = 4096 with gamma close to 1 (the terms of every earlier position count), the
 * per-head default (1 - 2^-5 and 1 - 2^-6: 32 and 64 positions) and far from 1 (0.05:
 * gamma^e underflows float within a chunk for e > 30 and must give 0, not NaN). */
Test(retention, long_sequence, .timeout = 240) {
    static const ret_opts opts[] = {
        {"gamma=0.9999", NULL, NULL}, {NULL, NULL, NULL}, {"gamma=0.05", NULL, "chunk=256"}, {"gamma=1", NULL, NULL}};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        int lens[1] = {4093};
        check_case(&opts[i], 1, i == 1 ? 2 : 1, 4096, 8, 8, i != 2, i == 0 ? lens : NULL, 150 + i, LONG_TOL,
                   LONG_TOL);
    }
}

/* ---- recurrent mode ---- */

/* prefill P (0: none) then steps to N - 1 against the causal forward. */
static void check_steps(const char *gamma, int P, bool with_out) {
    const int B = 2, H = 3, N = 60, D = 5, M = 4;
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, true, NULL, 160 + P);
    const char *set[2] = {"chunk=7", gamma};
    attn *a = make(gamma ? 2 : 1, set);
    float *want = tu_alloc_f(p.nv), *got = tu_alloc_f(p.nv);
    cr_assert_eq(attn_forward(a, &p.s, p.q, p.k, p.v, want, NULL), 0, "%s", attn_error());
    cr_assert_eq(attn_state_bytes(a, &p.s, N), (size_t)B * H * D * M * sizeof(float), "state: S per slice");
    tu_run_recurrent(a, &p, N, P, with_out, NULL, 0, got);
    double *wd = tu_to_double(want, p.nv);
    if (!with_out && P > 0) /* only the steps' rows */
        for (int b = 0; b < B * H; b++)
            for (int e = 0; e < P * M; e++) wd[(size_t)b * N * M + e] = got[(size_t)b * N * M + e];
    double e = tu_rel_err(got, wd, p.nv, 1e-30);
    cr_expect_lt(note("steps", e), STEP_TOL, "gamma %s prefill %d: err %g", gamma ? gamma : "auto", P, e);
    free(wd), free(want), free(got);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(retention_recurrent, steps_and_prefill) {
    static const int prompts[] = {0, 1, 7, 20, 59};
    for (size_t i = 0; i < sizeof prompts / sizeof prompts[0]; i++) {
        check_steps(NULL, prompts[i], true);
        check_steps("gamma=0.8", prompts[i], i % 2 == 0);
    }
    check_steps("gamma=1", 33, false);
}

/* A reset state starts again from position 0 and gives the same outputs. */
Test(retention_recurrent, reset) {
    tu_problem p;
    tu_problem_init(&p, 1, 2, 5, 3, 2, true, NULL, 170);
    attn *a = make(0, NULL);
    attn_state *st = NULL;
    cr_assert_eq(attn_state_create(a, &p.s, 5, &st), 0, "%s", attn_error());
    float o1[4], o2[4], q[6], k[6], v[4];
    tu_gather(&p.s, p.q, q, 0, 3);
    tu_gather(&p.s, p.k, k, 0, 3);
    tu_gather(&p.s, p.v, v, 0, 2);
    cr_assert_eq(attn_step(a, st, 0, q, k, v, o1), 0, "%s", attn_error());
    cr_assert_eq(attn_state_reset(a, st), 0, "%s", attn_error());
    cr_assert_eq(attn_state_len(st), 0);
    cr_assert_eq(attn_step(a, st, 0, q, k, v, o2), 0, "%s", attn_error());
    cr_expect_arr_eq(o1, o2, sizeof o1, "reset state gives the first step again");
    attn_state_destroy(st);
    attn_destroy(a);
    tu_problem_free(&p);
}

/* ---- options ---- */

Test(retention_options, gamma_range_and_values) {
    static const char *bad[] = {"gamma=0", "gamma=-0.5", "gamma=1.0001", "gamma=nan", "chunk=0", "chunk=65537"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *set[1] = {bad[i]};
        attn_options o = {.variant = "retention", .device = AB_DEV_CPU, .n_settings = 1, .settings = set};
        attn *a = NULL;
        int rc = attn_create(&o, &a);
        cr_expect_eq(rc, ATTN_EINVAL, "%s accepted", bad[i]);
        cr_expect_null(a);
        char key[16];
        snprintf(key, sizeof key, "%.*s", (int)(strchr(bad[i], '=') - bad[i]), bad[i]);
        cr_expect(strstr(attn_error(), key) && !strchr(attn_error(), '\n'), "%s: '%s'", bad[i], attn_error());
    }
    char buf[64];
    const char *set[1] = {"gamma=0.25"};
    attn *a = make(1, set), *d = make(0, NULL);
    cr_expect_str_eq(attn_option_value(a, NULL, "gamma", buf, sizeof buf), "0.25");
    cr_expect_str_eq(attn_option_value(d, NULL, "gamma", buf, sizeof buf), "auto");
    cr_expect_str_eq(attn_option_value(d, NULL, "chunk", buf, sizeof buf), "auto");
    attn_shape s = {1, 1, 8, 16, 4, true, NULL};
    cr_expect_float_eq(strtod(attn_option_value(d, &s, "scale", buf, sizeof buf), NULL), 0.25, 1e-9);
    cr_expect_float_eq(attn_flops(d, &s, false), 4.0 * 8 * 16 * 4, 1e-9, "4 N D M per slice");
    attn_destroy(a);
    attn_destroy(d);
}
