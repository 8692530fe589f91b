/* gla (gated linear attention) on the CPU: the double reference's backward (dq, dk, dv
 * and dg) against central finite differences of its forward; forward and all four
 * gradients against the reference, vector and scalar gates, causal and not, chunk
 * sizes that do not divide N, lengths with 0 and N; strong gates (g down to -20, whose
 * products along the sequence are far below float range) staying finite and accurate;
 * steps and prefill against the causal forward; the gate's width and the refusals.
 *
 * Error figures are tu_rel_err (max abs error over a tensor / the tensor's max abs).
 * Forward sums D products per (query, key) weight and up to N terms per output in
 * float32 (u = 6e-8), the state carried across chunks: worst case (N + D) u ~ 1e-5 at
 * N = 100, typically sqrt(N) u. */
#include <criterion/criterion.h>

#include "attention.h"
#include "error.h"
#include "reference.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double note(const char *what, double e) {
    if (tu_verbose()) fprintf(stderr, "ERR %.3g %s\n", e, what);
    return e;
}

/* Forward against the reference: the float sums above (1e-5) rounded up; measured up to
 * 2.3e-7, mild gates and gates down to -20 alike. A wrong gate index or mask is
 * O(1e-1). */
#define FWD_TOL 3e-5
/* dq, dk, dv: a few more products of the same kind; measured up to 3.4e-7 (strong
 * gates' dv), 2.9e-7 with mild ones. */
#define BWD_TOL 5e-5
/* dg: a sum over the sequence of q dq - k dk, differences of terms as large as dq's
 * entries (in double, from float dq and dk), so its error is dq's grown by up to N terms
 * of cancellation against dg's own scale; measured up to 4.3e-7 with mild gates, 6.3e-7
 * with strong ones: BWD_TOL's margin. */
#define DG_TOL 5e-5
/* Reference backward against finite differences (h = 1e-5 in double: truncation
 * h^2 |f'''| ~ 1e-10, rounding 1e-16 / h ~ 1e-11): above 1e-6 is a wrong formula; measured up to 1.3e-10. */
#define FD_TOL 1e-6

static attn *make(const char *gate, int chunk, bool cpu_only) {
    (void)cpu_only;
    char gset[32], cset[32];
    snprintf(gset, sizeof gset, "gate=%s", gate);
    snprintf(cset, sizeof cset, "chunk=%d", chunk);
    const char *set[] = {gset, cset};
    attn_options o = {.variant = "gla", .device = AB_DEV_CPU, .seed = 1, .n_settings = chunk > 0 ? 2 : 1,
                      .settings = set};
    attn *a = NULL;
    cr_assert_eq(attn_create(&o, &a), 0, "%s", attn_error());
    return a;
}

static ref_shape to_ref(const attn_shape *s) {
    return (ref_shape){s->batch, s->heads, s->len, s->qk_dim, s->v_dim, s->causal, s->lengths};
}

/* n log-gates in [-gmax, 0]: -gmax u^2 with u uniform-ish (|normal| clipped), so most
 * are small and some reach gmax. */
static float *gates(size_t n, uint64_t seed, double gmax) {
    float *g = tu_normal(n, seed, 9, 1.0);
    for (size_t i = 0; i < n; i++) {
        double u = fabs(g[i]) / 2.5;
        u = u > 1 ? 1 : u;
        g[i] = (float)(-gmax * u * u);
    }
    return g;
}

typedef struct {
    const char *gate;
    int chunk, B, H, N, D, M;
    bool causal;
    const int *lengths;
    double gmax;
} gla_case;

/* One case: forward and backward against the reference; dg pre-filled with 7
 * (overwritten); everything finite; padded rows zero. */
static void check_case(const gla_case *c, uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, c->B, c->H, c->N, c->D, c->M, c->causal, c->lengths, seed);
    attn *a = make(c->gate, c->chunk, true);
    const int W = attn_aux_width(a, c->D);
    const size_t ng = (size_t)c->B * c->H * c->N * W;
    float *g = gates(ng, seed, c->gmax), *dg = tu_alloc_f(ng);
    for (size_t i = 0; i < ng; i++) dg[i] = 7.0f;
    cr_assert_eq(attn_bind_aux(a, g, dg), 0, "%s", attn_error());
    float *out = tu_alloc_f(p.nv), *dq = tu_alloc_f(p.nq), *dk = tu_alloc_f(p.nq), *dv = tu_alloc_f(p.nv);
    cr_assert_eq(attn_forward(a, &p.s, p.q, p.k, p.v, out, NULL), 0, "%s", attn_error());
    cr_assert_eq(attn_backward(a, &p.s, p.q, p.k, p.v, p.dout, NULL, dq, dk, dv), 0, "%s", attn_error());

    ref_shape rs = to_ref(&p.s);
    double *q = tu_to_double(p.q, p.nq), *k = tu_to_double(p.k, p.nq), *v = tu_to_double(p.v, p.nv);
    double *gd = tu_to_double(g, ng), *dout = tu_to_double(p.dout, p.nv);
    double *ro = tu_alloc_d(p.nv), *rq = tu_alloc_d(p.nq), *rk = tu_alloc_d(p.nq), *rv = tu_alloc_d(p.nv);
    double *rg = tu_alloc_d(ng);
    const double scale = 1.0 / sqrt((double)c->D);
    ref_gla(&rs, W, scale, q, k, v, gd, ro);
    ref_gla_backward(&rs, W, scale, q, k, v, gd, dout, rq, rk, rv, rg);

    char what[160];
    snprintf(what, sizeof what, "gate=%s chunk=%d B=%d H=%d N=%d D=%d M=%d causal=%d lengths=%s gmax=%g", c->gate,
             c->chunk, c->B, c->H, c->N, c->D, c->M, c->causal, c->lengths ? "yes" : "no", c->gmax);
    const float *got[5] = {out, dq, dk, dv, dg};
    const double *want[5] = {ro, rq, rk, rv, rg};
    const size_t n[5] = {p.nv, p.nq, p.nq, p.nv, ng};
    const char *name[5] = {"out", "dq", "dk", "dv", "dg"};
    const double tol[5] = {FWD_TOL, BWD_TOL, BWD_TOL, BWD_TOL, DG_TOL};
    for (int t = 0; t < 5; t++) {
        for (size_t i = 0; i < n[t]; i++) cr_assert(isfinite(got[t][i]), "%s: %s[%zu] not finite", what, name[t], i);
        char w2[200];
        snprintf(w2, sizeof w2, "%s %s", name[t], what);
        double e = note(w2, tu_rel_err(got[t], want[t], n[t], 1e-30));
        cr_expect_leq(e, tol[t], "%s: error %g", w2, e);
    }
    tu_assert_padded_zero(&p.s, out, c->M, "out");
    tu_assert_padded_zero(&p.s, dq, c->D, "dq");
    tu_assert_padded_zero(&p.s, dv, c->M, "dv");
    tu_assert_padded_zero(&p.s, dg, W, "dg");
    free(q), free(k), free(v), free(gd), free(dout), free(ro), free(rq), free(rk), free(rv), free(rg);
    free(out), free(dq), free(dk), free(dv), free(g), free(dg);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(gla, against_reference) {
    static const int len3[3] = {0, 37, 19}, len2[2] = {50, 1};
    const gla_case cases[] = {
        {"vector", 0, 2, 3, 37, 8, 5, true, NULL, 0.5},
        {"scalar", 0, 2, 3, 37, 8, 5, true, NULL, 0.5},
        {"vector", 7, 1, 2, 50, 16, 16, true, NULL, 1.0},   /* 7 does not divide 50 */
        {"scalar", 5, 1, 2, 50, 16, 16, true, NULL, 1.0},
        {"vector", 1, 1, 1, 9, 4, 3, true, NULL, 0.3},      /* chunk 1: the recurrence */
        {"vector", 64, 1, 2, 50, 16, 8, true, NULL, 0.3},   /* one chunk longer than N */
        {"vector", 6, 3, 2, 37, 8, 8, true, len3, 1.0},     /* lengths 0, N, odd */
        {"scalar", 6, 2, 2, 50, 8, 8, true, len2, 1.0},
        {"vector", 1, 1, 1, 1, 1, 1, true, NULL, 0.3},      /* N = 1 */
        {"vector", 32, 1, 2, 100, 64, 64, true, NULL, 0.2}, /* the benchmark's head size */
        {"vector", 7, 2, 2, 37, 8, 5, false, NULL, 0.5},    /* non-causal */
        {"scalar", 5, 2, 2, 37, 8, 5, false, NULL, 0.5},
        {"vector", 6, 3, 2, 37, 8, 8, false, len3, 1.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i], 100 + i);
}

/* Gates down to -20: a chunk's decay reaches hundreds (so the entry-by-entry path, not
 * the rescaled product), and e^b over the sequence is far below float range (b ~ -500):
 * results stay finite and as accurate as with mild gates. */
Test(gla, strong_gates) {
    const gla_case cases[] = {
        {"vector", 16, 1, 2, 70, 16, 8, true, NULL, 20.0},
        {"scalar", 16, 1, 2, 70, 16, 8, true, NULL, 20.0},
        {"vector", 0, 1, 2, 70, 16, 8, true, NULL, 20.0},
        {"vector", 9, 1, 2, 40, 8, 8, false, NULL, 20.0},
        {"vector", 8, 1, 1, 40, 8, 8, true, NULL, 4.0}, /* decay near the switch between paths */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i], 200 + i);
}

/* ---- the reference's backward against finite differences ---- */

typedef struct {
    ref_shape s;
    int W;
    double *q, *k, *v, *g;
} fd_ctx;

static void fd_forward(void *ctx, double *out) {
    fd_ctx *c = ctx;
    ref_gla(&c->s, c->W, 0.7, c->q, c->k, c->v, c->g, out);
}

static void fd_case(int W, bool causal, const int *lengths) {
    const int B = 2, H = 1, N = 6, D = 3, M = 2;
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, 7);
    const size_t ng = (size_t)B * H * N * W;
    float *gf = gates(ng, 7, 1.5);
    fd_ctx c = {to_ref(&p.s), W, tu_to_double(p.q, p.nq), tu_to_double(p.k, p.nq), tu_to_double(p.v, p.nv),
                tu_to_double(gf, ng)};
    double *w = tu_to_double(p.dout, p.nv);
    double *dq = tu_alloc_d(p.nq), *dk = tu_alloc_d(p.nq), *dv = tu_alloc_d(p.nv), *dg = tu_alloc_d(ng);
    ref_gla_backward(&c.s, W, 0.7, c.q, c.k, c.v, c.g, w, dq, dk, dv, dg);
    double *fq = tu_alloc_d(p.nq), *fk = tu_alloc_d(p.nq), *fv = tu_alloc_d(p.nv), *fg = tu_alloc_d(ng);
    tu_fd_grad(fd_forward, &c, c.q, p.nq, w, p.nv, 1e-5, fq);
    tu_fd_grad(fd_forward, &c, c.k, p.nq, w, p.nv, 1e-5, fk);
    tu_fd_grad(fd_forward, &c, c.v, p.nv, w, p.nv, 1e-5, fv);
    tu_fd_grad(fd_forward, &c, c.g, ng, w, p.nv, 1e-5, fg);
    const double *got[4] = {dq, dk, dv, dg}, *want[4] = {fq, fk, fv, fg};
    const size_t n[4] = {p.nq, p.nq, p.nv, ng};
    for (int t = 0; t < 4; t++) {
        double m = tu_max_abs(want[t], n[t]), e = 0;
        for (size_t i = 0; i < n[t]; i++) e = fmax(e, fabs(got[t][i] - want[t][i]));
        char what[80];
        snprintf(what, sizeof what, "fd W=%d causal=%d lengths=%d grad %d", W, causal, lengths != NULL, t);
        note(what, e / m);
        cr_expect_leq(e / m, FD_TOL, "%s: %g", what, e / m);
    }
    free(c.q), free(c.k), free(c.v), free(c.g), free(w), free(gf);
    free(dq), free(dk), free(dv), free(dg), free(fq), free(fk), free(fv), free(fg);
    tu_problem_free(&p);
}

Test(gla, reference_backward_finite_differences) {
    static const int len[2] = {4, 6};
    fd_case(3, true, NULL);  /* vector gate (W = D) */
    fd_case(1, true, NULL);  /* scalar gate */
    fd_case(3, false, NULL); /* non-causal */
    fd_case(1, false, len);
    fd_case(3, true, len);
}

/* ---- recurrent mode ---- */

/* Steps from P (after a prefill of P, with its output when with_out) to N-1 equal the
 * causal forward: the same sums in another order (the state after every position
 * instead of chunks), measured up to 4e-7 relative; 2e-5 as FWD_TOL's argument. */
static void recurrent_check(const char *gate, int P, bool with_out) {
    const int B = 2, H = 2, N = 23, D = 8, M = 6;
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, true, NULL, 31);
    attn *a = make(gate, 5, true);
    const int W = attn_aux_width(a, D);
    float *g = gates((size_t)B * H * N * W, 31, 2.0), *out = tu_alloc_f(p.nv);
    cr_assert_eq(attn_bind_aux(a, g, NULL), 0);
    cr_assert_eq(attn_forward(a, &p.s, p.q, p.k, p.v, out, NULL), 0, "%s", attn_error());
    float *rec = tu_alloc_f(p.nv);
    tu_run_recurrent(a, &p, N, P, with_out, g, W, rec);
    double *want = tu_to_double(out, p.nv);
    for (int bh = 0; bh < B * H; bh++)
        for (int t = (P > 0 && !with_out) ? P : 0; t < N; t++) {
            const size_t o = ((size_t)bh * N + t) * M;
            double e = tu_rel_err(rec + o, want + o, (size_t)M, tu_max_abs(want + (size_t)bh * N * M, (size_t)N * M));
            cr_expect_leq(e, 2e-5, "gate=%s prefill %d (out %d): row %d of slice %d: %g", gate, P, with_out, t, bh, e);
        }
    free(want), free(rec), free(out), free(g);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(gla, steps_and_prefill) {
    recurrent_check("vector", 0, false);
    recurrent_check("scalar", 0, false);
    recurrent_check("vector", 11, false);
    recurrent_check("vector", 11, true);
    recurrent_check("scalar", 7, true);
    recurrent_check("vector", 23, true); /* the whole sequence by prefill */
}

/* ---- the input's width and refusals ---- */

Test(gla, gate_width_and_refusals) {
    attn *a = make("vector", 0, true), *b = make("scalar", 0, true);
    cr_assert_str_eq(attn_aux_name(a), "g");
    cr_assert_eq(attn_aux_width(a, 12), 12);
    cr_assert_eq(attn_aux_width(b, 12), 1);
    tu_problem p;
    tu_problem_init(&p, 1, 1, 4, 4, 4, true, NULL, 1);
    float out[16];
    ab_clear_error();
    tu_expect_fail(attn_forward(a, &p.s, p.q, p.k, p.v, out, NULL), ATTN_EINVAL, "unbound g", "gla", "g",
                   "attn_bind_aux", NULL);
    tu_expect_fail(attn_bind_aux(a, NULL, NULL), ATTN_EINVAL, "NULL g", "NULL", NULL);
    attn_options o = {.variant = "gla", .device = AB_DEV_CPU, .n_settings = 1, .settings = (const char *[]){"gate=x"}};
    attn *c = NULL;
    tu_expect_fail(attn_create(&o, &c), ATTN_EINVAL, "gate=x", "gate", "vector", "scalar", NULL);
    tu_problem_free(&p);
    attn_destroy(a);
    attn_destroy(b);
}
