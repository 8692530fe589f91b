/* deltanet (the delta rule) on the CPU: forward and the gradients dq, dk, dv, dbeta
 * against the double reference (tests/reference/ref_deltanet.c) for beta 0, 1 and
 * random, the scan (chunk=1) and the chunked form with chunks that do not divide N,
 * lengths with 0 and N; the reference's own gradient against central finite
 * differences; recurrent steps and prefill against the forward; a long run (N = 2048)
 * staying bounded; the refusals (non-causal shapes, no beta bound).
 *
 * Errors are tu_rel_err (max abs error over a tensor / its max abs). */
#include <criterion/criterion.h>

#include "attention.h"
#include "error.h"
#include "reference.h"
#include "rng.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The variant's constant (attention/deltanet.h): eps under the normalisation's root. */
#define EPS 1e-6

/* TC_PRINT=1 in the environment prints every measured error (how the figures quoted
 * beside the tolerances were taken). */
static double note(const char *what, double e) {
    if (getenv("TC_PRINT")) fprintf(stderr, "ERR %.3g %s\n", e, what);
    return e;
}

/* Forward: every output is S_t^T qn_t, S_t a sum over up to N rank-one terms each with
 * float rounding u = 6e-8 of its size, the update reading the state it changes (each
 * step's rounding carried on, contracted by (I - beta kn kn^T)); measured up to 4.1e-7
 * for N <= 150 (the scan and the chunked form alike). 2e-5 leaves room for ~300 terms
 * of worst-case accumulation. */
#define FWD_TOL 2e-5
/* Gradients: the backward sums the same number of terms as the forward, on recomputed
 * states (which differ from the forward's by its rounding); measured up to 7.1e-7 (dk;
 * dbeta 5.0e-7) over the scan's reverse recurrence (chunk=1) and the chunked form's
 * backward. */
#define BWD_TOL 5e-5
/* The reference's reverse pass against central differences (h = 1e-5, double): the
 * truncation error h^2 |f'''| ~ 1e-10 and the rounding 1e-16 / h ~ 1e-11; measured
 * 5.5e-11. */
#define FD_TOL 1e-7

typedef enum { BETA_ZERO, BETA_ONE, BETA_RANDOM } beta_kind;

static float *make_beta(size_t n, beta_kind kind, uint64_t seed) {
    float *b = tu_alloc_f(n);
    for (size_t i = 0; i < n; i++)
        b[i] = kind == BETA_ZERO ? 0.0f : kind == BETA_ONE ? 1.0f : (float)ab_rng_uniform(seed, 9, i);
    return b;
}

static attn *make_dn(const char *chunk) {
    const char *set[1] = {chunk};
    attn_options o = {.variant = "deltanet", .device = AB_DEV_CPU, .seed = 1, .n_settings = chunk ? 1 : 0,
                      .settings = set};
    attn *a = NULL;
    cr_assert_eq(attn_create(&o, &a), 0, "%s", attn_error());
    return a;
}

static ref_shape to_ref(const attn_shape *s) {
    return (ref_shape){s->batch, s->heads, s->len, s->qk_dim, s->v_dim, true, s->lengths};
}

typedef struct {
    tu_problem p;
    float *beta;
    size_t nb;
    double *q, *k, *v, *b, *dout; /* double copies */
} dn_case;

static void case_init(dn_case *c, int B, int H, int N, int D, int M, const int *lengths, beta_kind kind,
                      uint64_t seed) {
    tu_problem_init(&c->p, B, H, N, D, M, true, lengths, seed);
    c->nb = (size_t)B * H * N;
    c->beta = make_beta(c->nb, kind, seed);
    c->q = tu_to_double(c->p.q, c->p.nq), c->k = tu_to_double(c->p.k, c->p.nq);
    c->v = tu_to_double(c->p.v, c->p.nv), c->b = tu_to_double(c->beta, c->nb);
    c->dout = tu_to_double(c->p.dout, c->p.nv);
}

static void case_free(dn_case *c) {
    free(c->beta), free(c->q), free(c->k), free(c->v), free(c->b), free(c->dout);
    tu_problem_free(&c->p);
}

/* forward (and backward) of the library and of the reference, compared */
static void check(const char *chunk, int B, int H, int N, int D, int M, const int *lengths, beta_kind kind,
                  uint64_t seed) {
    dn_case c;
    case_init(&c, B, H, N, D, M, lengths, kind, seed);
    const tu_problem *p = &c.p;
    attn *a = make_dn(chunk);
    float *dbeta = tu_alloc_f(c.nb);
    for (size_t i = 0; i < c.nb; i++) dbeta[i] = 7.0f;
    cr_assert_eq(attn_bind_aux(a, c.beta, dbeta), 0, "%s", attn_error());
    float *out = tu_alloc_f(p->nv), *dq = tu_alloc_f(p->nq), *dk = tu_alloc_f(p->nq), *dv = tu_alloc_f(p->nv);
    for (size_t i = 0; i < p->nv; i++) out[i] = dv[i] = 7.0f;
    for (size_t i = 0; i < p->nq; i++) dq[i] = dk[i] = 7.0f;
    void *saved = malloc(attn_saved_bytes(a, &p->s) + 1);
    cr_assert_eq(attn_forward(a, &p->s, p->q, p->k, p->v, out, saved), 0, "%s", attn_error());
    cr_assert_eq(attn_backward(a, &p->s, p->q, p->k, p->v, p->dout, saved, dq, dk, dv), 0, "%s", attn_error());
    ref_shape rs = to_ref(&p->s);
    double *want = tu_alloc_d(p->nv), *gq = tu_alloc_d(p->nq), *gk = tu_alloc_d(p->nq), *gv = tu_alloc_d(p->nv),
           *gb = tu_alloc_d(c.nb);
    ref_deltanet(&rs, EPS, c.q, c.k, c.v, c.b, want);
    ref_deltanet_backward(&rs, EPS, c.q, c.k, c.v, c.b, c.dout, gq, gk, gv, gb);
    const double eo = tu_rel_err(out, want, p->nv, 1e-30), eq = tu_rel_err(dq, gq, p->nq, 1e-30),
                 ek = tu_rel_err(dk, gk, p->nq, 1e-30), ev = tu_rel_err(dv, gv, p->nv, 1e-30),
                 eb = tu_rel_err(dbeta, gb, c.nb, 1e-30);
    const char *ch = chunk ? chunk : "chunk=auto";
    cr_expect_lt(note("out", eo), FWD_TOL, "%s beta %d N=%d D=%d M=%d: out err %g", ch, kind, N, D, M, eo);
    cr_expect_lt(note("dq", eq), BWD_TOL, "%s beta %d N=%d D=%d M=%d: dq err %g", ch, kind, N, D, M, eq);
    cr_expect_lt(note("dk", ek), BWD_TOL, "%s beta %d N=%d D=%d M=%d: dk err %g", ch, kind, N, D, M, ek);
    cr_expect_lt(note("dv", ev), BWD_TOL, "%s beta %d N=%d D=%d M=%d: dv err %g", ch, kind, N, D, M, ev);
    cr_expect_lt(note("dbeta", eb), BWD_TOL, "%s beta %d N=%d D=%d M=%d: dbeta err %g", ch, kind, N, D, M, eb);
    tu_assert_padded_zero(&p->s, out, M, "out");
    tu_assert_padded_zero(&p->s, dq, D, "dq");
    tu_assert_padded_zero(&p->s, dk, D, "dk");
    tu_assert_padded_zero(&p->s, dv, M, "dv");
    tu_assert_padded_zero(&p->s, dbeta, 1, "dbeta");
    free(want), free(gq), free(gk), free(gv), free(gb), free(saved);
    free(out), free(dq), free(dk), free(dv), free(dbeta);
    attn_destroy(a);
    case_free(&c);
}

Test(deltanet, forward_backward_beta_kinds) {
    static const char *const chunks[] = {"chunk=1", "chunk=5", "chunk=16", NULL};
    int lens[3] = {37, 20, 0};
    for (int ck = 0; ck < 4; ck++)
        for (int kind = BETA_ZERO; kind <= BETA_RANDOM; kind++) {
            check(chunks[ck], 1, 2, 37, 8, 6, NULL, (beta_kind)kind, 11 + kind);
            check(chunks[ck], 3, 2, 37, 5, 7, lens, (beta_kind)kind, 21 + kind); /* padding, length 0 */
        }
}

/* Chunks that do not divide N, N = 1, N below the chunk, and wider heads. */
Test(deltanet, chunks_and_shapes) {
    int lens[2] = {150, 97};
    check("chunk=7", 2, 1, 150, 16, 16, lens, BETA_RANDOM, 31);
    check("chunk=64", 2, 1, 150, 16, 16, lens, BETA_RANDOM, 32);
    check(NULL, 1, 1, 1, 4, 3, NULL, BETA_RANDOM, 33);
    check("chunk=3", 1, 1, 2, 4, 3, NULL, BETA_ONE, 34);
    check(NULL, 1, 2, 130, 64, 64, NULL, BETA_RANDOM, 35);
    check("chunk=32", 1, 1, 100, 33, 17, NULL, BETA_RANDOM, 36);
}

/* The chunked form (chunk 64) and the scan (chunk 1) give the same outputs up to
 * rounding: measured 3.8e-7. */
Test(deltanet, chunked_equals_scan) {
    dn_case c;
    case_init(&c, 2, 2, 200, 16, 24, NULL, BETA_RANDOM, 41);
    float *o1 = tu_alloc_f(c.p.nv), *o2 = tu_alloc_f(c.p.nv);
    attn *scan = make_dn("chunk=1"), *wy = make_dn("chunk=64");
    cr_assert_eq(attn_bind_aux(scan, c.beta, NULL), 0);
    cr_assert_eq(attn_bind_aux(wy, c.beta, NULL), 0);
    cr_assert_eq(attn_forward(scan, &c.p.s, c.p.q, c.p.k, c.p.v, o1, NULL), 0, "%s", attn_error());
    cr_assert_eq(attn_forward(wy, &c.p.s, c.p.q, c.p.k, c.p.v, o2, NULL), 0, "%s", attn_error());
    double *d1 = tu_to_double(o1, c.p.nv);
    double e = tu_rel_err(o2, d1, c.p.nv, 1e-30);
    cr_expect_lt(note("chunked vs scan", e), FWD_TOL, "chunked vs scan: %g", e);
    free(d1), free(o1), free(o2);
    attn_destroy(scan), attn_destroy(wy);
    case_free(&c);
}

/* ---- the reference's gradient ---- */

typedef struct {
    ref_shape r;
    double *q, *k, *v, *b;
} fd_ctx;

static void fd_forward(void *ctx, double *out) {
    fd_ctx *c = ctx;
    ref_deltanet(&c->r, EPS, c->q, c->k, c->v, c->b, out);
}

Test(deltanet, reference_gradient_finite_differences) {
    int lens[2] = {9, 4};
    dn_case c;
    case_init(&c, 2, 2, 9, 4, 3, lens, BETA_RANDOM, 51);
    fd_ctx f = {to_ref(&c.p.s), c.q, c.k, c.v, c.b};
    const size_t nq = c.p.nq, nv = c.p.nv, nb = c.nb;
    double *gq = tu_alloc_d(nq), *gk = tu_alloc_d(nq), *gv = tu_alloc_d(nv), *gb = tu_alloc_d(nb);
    double *fq = tu_alloc_d(nq), *fk = tu_alloc_d(nq), *fv = tu_alloc_d(nv), *fb = tu_alloc_d(nb);
    ref_deltanet_backward(&f.r, EPS, c.q, c.k, c.v, c.b, c.dout, gq, gk, gv, gb);
    tu_fd_grad(fd_forward, &f, c.q, nq, c.dout, nv, 1e-5, fq);
    tu_fd_grad(fd_forward, &f, c.k, nq, c.dout, nv, 1e-5, fk);
    tu_fd_grad(fd_forward, &f, c.v, nv, c.dout, nv, 1e-5, fv);
    tu_fd_grad(fd_forward, &f, c.b, nb, c.dout, nv, 1e-5, fb);
    const struct {
        const char *name;
        const double *g, *f;
        size_t n;
    } t[4] = {{"dq", gq, fq, nq}, {"dk", gk, fk, nq}, {"dv", gv, fv, nv}, {"dbeta", gb, fb, nb}};
    for (int i = 0; i < 4; i++) {
        double worst = 0, scale = fmax(tu_max_abs(t[i].f, t[i].n), 1e-30);
        for (size_t j = 0; j < t[i].n; j++) worst = fmax(worst, fabs(t[i].g[j] - t[i].f[j]));
        cr_expect_gt(scale, 1e-3, "%s: the finite differences are all zero", t[i].name);
        cr_expect_lt(note(t[i].name, worst / scale), FD_TOL, "reference %s vs finite differences: %g", t[i].name,
                     worst / scale);
    }
    free(gq), free(gk), free(gv), free(gb), free(fq), free(fk), free(fv), free(fb);
    case_free(&c);
}

/* ---- recurrent mode ---- */

/* prefill P (P = 0: none), then steps to N - 1, against the forward. Steps vs forward:
 * the same sums in another order (the chunked form against the scan); measured 2e-7. */
static void check_steps(int P, bool with_out) {
    enum { B = 2, H = 2, N = 45, D = 8, M = 5 };
    dn_case c;
    case_init(&c, B, H, N, D, M, NULL, BETA_RANDOM, 61);
    attn *a = make_dn("chunk=16");
    cr_assert_eq(attn_bind_aux(a, c.beta, NULL), 0);
    float *want = tu_alloc_f(c.p.nv), *got = tu_alloc_f(c.p.nv);
    cr_assert_eq(attn_forward(a, &c.p.s, c.p.q, c.p.k, c.p.v, want, NULL), 0, "%s", attn_error());
    tu_run_recurrent(a, &c.p, N, P, with_out, c.beta, 1, got); /* beta: [B, H, N, 1] */
    const int from = with_out ? 0 : P;
    double *w = tu_to_double(want, c.p.nv);
    double scale = tu_max_abs(w, c.p.nv), worst = 0;
    for (int bh = 0; bh < B * H; bh++)
        for (int t = from; t < N; t++)
            for (int m = 0; m < M; m++) {
                size_t i = ((size_t)bh * N + t) * M + m;
                worst = fmax(worst, fabs(got[i] - w[i]) / scale);
            }
    cr_expect_lt(note("steps", worst), 2 * FWD_TOL, "prefill %d: steps vs forward %g", P, worst);
    free(w), free(got), free(want);
    attn_destroy(a);
    case_free(&c);
}

Test(deltanet, steps_and_prefill_equal_forward) {
    check_steps(0, false);
    check_steps(13, false);
    check_steps(13, true);
    check_steps(40, true); /* prefill over several chunks */
    check_steps(45, true); /* prefill only */
}

Test(deltanet, state_constant_in_length) {
    attn *a = make_dn(NULL);
    attn_shape s = {2, 3, 1, 8, 4, true, NULL};
    size_t s16 = attn_state_bytes(a, &s, 16), s1m = attn_state_bytes(a, &s, 1 << 20);
    cr_assert_eq(s16, s1m, "the state is S per head: %zu vs %zu", s16, s1m);
    cr_assert_eq(s16, (size_t)6 * 8 * 4 * sizeof(float));
    attn_destroy(a);
}

/* ---- a long run stays bounded ----
 *
 * With beta in [0, 1] and unit keys, I - beta kn kn^T has spectral norm <= 1, so
 * |S_t|_F <= |S_{t-1}|_F + beta_t |v_t| and |o_t| <= |S_t|_F <= sum_{s<=t} beta_s |v_s|:
 * the state holds no more than the values put in. Checked at N = 2048 (rows and the
 * bound in double), with the forward still matching the double reference (rounding
 * does not accumulate: measured 4.1e-7, as in short runs). */
Test(deltanet, long_run_bounded) {
    enum { N = 2048, D = 16, M = 16 };
    dn_case c;
    case_init(&c, 1, 2, N, D, M, NULL, BETA_RANDOM, 71);
    attn *a = make_dn(NULL);
    cr_assert_eq(attn_bind_aux(a, c.beta, NULL), 0);
    float *out = tu_alloc_f(c.p.nv);
    cr_assert_eq(attn_forward(a, &c.p.s, c.p.q, c.p.k, c.p.v, out, NULL), 0, "%s", attn_error());
    double vmax = 0, omax = 0;
    for (int bh = 0; bh < 2; bh++) {
        double put = 0;
        for (int t = 0; t < N; t++) {
            const double *vt = c.v + ((size_t)bh * N + t) * M;
            const float *ot = out + ((size_t)bh * N + t) * M;
            double vn = 0, on = 0;
            for (int m = 0; m < M; m++) vn += vt[m] * vt[m], on += (double)ot[m] * ot[m];
            put += c.b[(size_t)bh * N + t] * sqrt(vn);
            cr_assert(isfinite(on), "output %d not finite", t);
            cr_assert_leq(sqrt(on), put * (1 + 1e-5), "|o_%d| = %g exceeds what the values put in, %g", t, sqrt(on),
                          put);
            vmax = fmax(vmax, sqrt(vn)), omax = fmax(omax, sqrt(on));
        }
    }
    /* far below the linear bound: the delta rule overwrites rather than accumulates
     * (measured max |o| / max |v| = 0.77 here; summing without the delta rule's
     * correction would grow as sqrt(N) ~ 45) */
    cr_expect_lt(note("max |o| / max |v|", omax / vmax), 4.0, "max |o| %g, max |v| %g", omax, vmax);
    double *want = tu_alloc_d(c.p.nv);
    ref_shape rs = to_ref(&c.p.s);
    ref_deltanet(&rs, EPS, c.q, c.k, c.v, c.b, want);
    double e = tu_rel_err(out, want, c.p.nv, 1e-30);
    cr_expect_lt(note("long forward", e), FWD_TOL, "N = 2048 forward vs reference: %g", e);
    free(want), free(out);
    attn_destroy(a);
    case_free(&c);
}

/* ---- refusals and options ---- */

Test(deltanet, refusals) {
    attn *a = make_dn(NULL);
    float x[64] = {0}, o[64];
    attn_shape s = {1, 1, 4, 2, 2, true, NULL};
    tu_expect_fail(attn_forward(a, &s, x, x, x, o, NULL), ATTN_EINVAL, "no beta bound", "beta", "attn_bind_aux",
                   NULL);
    tu_expect_fail(attn_bind_aux(a, NULL, NULL), ATTN_EINVAL, "NULL beta", "beta", NULL);
    cr_assert_eq(attn_bind_aux(a, x, NULL), 0);
    s.causal = false;
    tu_expect_fail(attn_check_shape(a, &s), ATTN_EUNSUPPORTED, "non-causal", "deltanet", "causal only", NULL);
    tu_expect_fail(attn_forward(a, &s, x, x, x, o, NULL), ATTN_EUNSUPPORTED, "non-causal forward", "causal only",
                   NULL);
    s.causal = true;
    cr_assert_eq(attn_forward(a, &s, x, x, x, o, NULL), 0, "%s", attn_error());
    for (int i = 0; i < 8; i++) cr_assert_eq(o[i], 0.0f, "zero inputs give zero output");
    cr_assert_str_eq(attn_aux_name(a), "beta");
    cr_assert_eq(attn_aux_width(a, 64), 1);
    char buf[32];
    cr_assert_str_eq(attn_option_value(a, NULL, "chunk", buf, sizeof buf), "auto");
    attn_destroy(a);
    static const char *const bad[] = {"chunk=-1", "chunk=65537", "chunk=x", "eps=1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        attn_options op = {.variant = "deltanet", .device = AB_DEV_CPU, .n_settings = 1, .settings = &bad[i]};
        attn *b = NULL;
        ab_clear_error();
        cr_assert_eq(attn_create(&op, &b), ATTN_EINVAL, "%s accepted", bad[i]);
        cr_assert(!strchr(attn_error(), '\n') && attn_error()[0], "%s", attn_error());
    }
}
