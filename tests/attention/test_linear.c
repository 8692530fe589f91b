/* linear (elu+1, taylor) and polynomial attention on the CPU against the double
 * reference (tests/reference/ref_linear.c): forward, backward against central finite
 * differences, padding, recurrent steps and prefill, chunk independence, the
 * polynomial feature map itself, and option parsing.
 *
 * Error figures are tu_rel_err: max abs error over a tensor divided by the tensor's
 * max abs value (so one figure per tensor, tiny entries judged at the tensor's scale).
 * Every similarity here is >= 0, so out_i is a convex combination of the v_j and the
 * denominator has no cancellation: float32 rounding (unit 6e-8) over the sums of
 * about C + T terms that make up each entry gives errors ~1e-6 in practice; the
 * tolerances below leave a factor of 10-50 over what was measured. */
#include <criterion/criterion.h>

#include "attention.h"
#include "feature_maps.h"
#include "reference.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

typedef struct {
    const char *variant;
    ref_sim sim;
    double c, scale; /* scale < 0: 1/sqrt(D) */
    const char *settings[4];
    int n_settings;
} vcfg;

static attn *make(const vcfg *v) {
    attn_options o = {.variant = v->variant, .device = AB_DEV_CPU, .seed = 1,
                      .n_settings = v->n_settings, .settings = v->settings};
    attn *a = NULL;
    int rc = attn_create(&o, &a);
    cr_assert_eq(rc, 0, "attn_create(%s): %s", v->variant, attn_error());
    return a;
}

static double ref_scale(const vcfg *v, int D) { return v->scale < 0 ? 1.0 / sqrt((double)D) : v->scale; }

static ref_shape to_ref(const attn_shape *s) {
    ref_shape r = {s->batch, s->heads, s->len, s->qk_dim, s->v_dim, s->causal, s->lengths};
    return r;
}

static size_t nq(const attn_shape *s) { return (size_t)s->batch * s->heads * s->len * s->qk_dim; }
static size_t nv(const attn_shape *s) { return (size_t)s->batch * s->heads * s->len * s->v_dim; }

typedef struct {
    float *q, *k, *v;
} inputs;

static inputs make_inputs(const attn_shape *s, uint64_t seed) {
    inputs in = {tu_alloc_f(nq(s)), tu_alloc_f(nq(s)), tu_alloc_f(nv(s))};
    tu_fill_normal(in.q, nq(s), seed, 1, 1.0);
    tu_fill_normal(in.k, nq(s), seed, 2, 1.0);
    tu_fill_normal(in.v, nv(s), seed, 3, 1.0);
    return in;
}

static void free_inputs(inputs *in) {
    free(in->q);
    free(in->k);
    free(in->v);
}

/* out = forward(in); the buffer is pre-filled with garbage so that rows the variant
 * forgets to write show up. */
static float *run_forward(attn *a, const attn_shape *s, const inputs *in) {
    float *out = tu_alloc_f(nv(s));
    for (size_t i = 0; i < nv(s); i++) out[i] = 7.0f;
    size_t sb = attn_saved_bytes(a, s);
    void *saved = sb ? malloc(sb) : NULL;
    int rc = attn_forward(a, s, in->q, in->k, in->v, out, saved);
    cr_assert_eq(rc, 0, "forward: %s", attn_error());
    free(saved);
    return out;
}

static double *run_ref(const vcfg *v, const attn_shape *s, const inputs *in, double eps) {
    ref_shape r = to_ref(s);
    double *q = tu_to_double(in->q, nq(s)), *k = tu_to_double(in->k, nq(s)), *vv = tu_to_double(in->v, nv(s));
    double *out = tu_alloc_d(nv(s));
    ref_linear(&r, v->sim, v->c, ref_scale(v, s->qk_dim), eps, q, k, vv, out);
    free(q);
    free(k);
    free(vv);
    return out;
}

/* Rows >= lengths[b] of a [B,H,N,X] tensor are exactly zero. */
static void assert_padding_zero(const attn_shape *s, const float *x, int X, const char *what) {
    if (!s->lengths) return;
    for (int b = 0; b < s->batch; b++)
        for (int h = 0; h < s->heads; h++)
            for (int i = s->lengths[b]; i < s->len; i++)
                for (int e = 0; e < X; e++) {
                    float val = x[(((size_t)b * s->heads + h) * s->len + i) * X + e];
                    cr_assert(val == 0.0f, "%s: padded row b=%d h=%d i=%d has %g", what, b, h, i, val);
                }
}

/* Forward against the reference; returns the relative error. */
static double forward_err(const vcfg *v, const attn_shape *s, uint64_t seed) {
    attn *a = make(v);
    inputs in = make_inputs(s, seed);
    float *out = run_forward(a, s, &in);
    double *want = run_ref(v, s, &in, 1e-6);
    assert_padding_zero(s, out, s->v_dim, "out");
    double err = tu_rel_err(out, want, nv(s), 1e-30);
    free(out);
    free(want);
    free_inputs(&in);
    attn_destroy(a);
    return err;
}

static const vcfg ELU = {"linear", REF_SIM_ELU, 0, 0, {NULL}, 0};
static const vcfg TAYLOR = {"linear", REF_SIM_TAYLOR, 0, 0, {"feature_map=taylor"}, 1};
static const vcfg POLY = {"polynomial", REF_SIM_POLY, 1.0, -1, {NULL}, 0};

static vcfg with(vcfg v, const char *setting) {
    v.settings[v.n_settings++] = setting;
    return v;
}

/* Forward tolerance: see the header comment (measured errors 1e-7..1.9e-6). */
#define FWD_TOL 2e-5

static void forward_suite(const vcfg *v) {
    int lens3[3] = {50, 23, 0}; /* full, partial, empty */
    for (int causal = 0; causal <= 1; causal++) {
        /* N = 1 */
        attn_shape s1 = {1, 1, 1, 4, 3, causal, NULL};
        double e = forward_err(v, &s1, 11);
        cr_expect_lt(e, FWD_TOL, "%s N=1 causal=%d: err %g", v->variant, causal, e);
        /* odd D, M; B, H > 1; lengths incl. 0 and full; default chunk */
        attn_shape s2 = {3, 2, 50, 5, 3, causal, lens3};
        e = forward_err(v, &s2, 12);
        cr_expect_lt(e, FWD_TOL, "%s lengths causal=%d: err %g", v->variant, causal, e);
        /* chunk 7 with N = 50 (not a multiple), lengths cutting inside a chunk */
        vcfg v7 = with(*v, "chunk=7");
        e = forward_err(&v7, &s2, 13);
        cr_expect_lt(e, FWD_TOL, "%s chunk=7 causal=%d: err %g", v->variant, causal, e);
        /* several default-sized chunks with a ragged end, no lengths */
        attn_shape s3 = {1, 2, 150, 5, 3, causal, NULL};
        e = forward_err(v, &s3, 14);
        cr_expect_lt(e, FWD_TOL, "%s N=150 causal=%d: err %g", v->variant, causal, e);
    }
}

/* ---- forward ---- */

Test(linear_forward, elu) { forward_suite(&ELU); }
Test(linear_forward, taylor) { forward_suite(&TAYLOR); }
Test(linear_forward, polynomial) { forward_suite(&POLY); }

Test(linear_forward, polynomial_options_and_large_d) {
    /* c and scale set explicitly, and D = 17 (C = 307) */
    vcfg v = POLY;
    v.c = 0.5;
    v.scale = 0.3;
    v = with(with(v, "c=0.5"), "scale=0.3");
    int lens[2] = {31, 9};
    for (int causal = 0; causal <= 1; causal++) {
        attn_shape s = {2, 2, 31, 17, 4, causal, lens};
        double e = forward_err(&v, &s, 21);
        cr_expect_lt(e, FWD_TOL, "poly D=17 causal=%d: err %g", causal, e);
    }
    /* c = 0: sim = scale^2 (q.k)^2, the linear features vanish */
    vcfg v0 = POLY;
    v0.c = 0.0;
    v0 = with(v0, "c=0");
    attn_shape s = {1, 1, 20, 3, 2, true, NULL};
    double e = forward_err(&v0, &s, 22);
    cr_expect_lt(e, FWD_TOL, "poly c=0: err %g", e);
}

Test(linear_forward, taylor_zero_vector) {
    /* A zero query or key row: the library and the reference both floor |x| (see
     * feature_maps.h), giving cos = 0, sim = 1, and no NaN. */
    attn_shape s = {1, 1, 9, 4, 3, true, NULL};
    attn *a = make(&TAYLOR);
    inputs in = make_inputs(&s, 31);
    memset(in.q + 2 * 4, 0, 4 * sizeof(float));
    memset(in.k + 5 * 4, 0, 4 * sizeof(float));
    float *out = run_forward(a, &s, &in);
    double *want = run_ref(&TAYLOR, &s, &in, 1e-6);
    double e = tu_rel_err(out, want, nv(&s), 1e-30);
    cr_expect_lt(e, FWD_TOL, "taylor zero rows: err %g", e);
    free(out);
    free(want);
    free_inputs(&in);
    attn_destroy(a);
}

Test(linear_forward, eps_option) {
    /* A large eps changes the result measurably (out shrinks by den/(den+eps)); the
     * reference with the same eps agrees, one with the default does not. */
    vcfg v = with(ELU, "eps=10");
    attn_shape s = {1, 1, 12, 3, 2, true, NULL};
    attn *a = make(&v);
    inputs in = make_inputs(&s, 41);
    float *out = run_forward(a, &s, &in);
    double *want = run_ref(&v, &s, &in, 10.0), *dflt = run_ref(&v, &s, &in, 1e-6);
    cr_expect_lt(tu_rel_err(out, want, nv(&s), 1e-30), FWD_TOL);
    cr_expect_gt(tu_rel_err(out, dflt, nv(&s), 1e-30), 1e-2, "eps=10 had no visible effect");
    free(out);
    free(want);
    free(dflt);
    free_inputs(&in);
    attn_destroy(a);
}

/* ---- backward against finite differences ---- */

typedef struct {
    ref_shape r;
    const vcfg *v;
    double eps;
    double *q, *k, *vv;
} fd_ctx;

static void fd_forward(void *ctx, double *out) {
    fd_ctx *c = ctx;
    ref_linear(&c->r, c->v->sim, c->v->c, ref_scale(c->v, c->r.D), c->eps, c->q, c->k, c->vv, out);
}

/* Backward tolerance: the float gradients are products of the same sums as forward
 * plus the feature map's derivative (for taylor a division by |x|, up to ~3x growth
 * for the short vectors of D = 3); finite differences with h = 1e-4 in double are
 * exact to ~1e-8 (h^2 truncation and 1e-16/h rounding). Measured errors <= 1.3e-6. */
#define BWD_TOL 2e-5

static void backward_check(const vcfg *v, const attn_shape *s, double eps, uint64_t seed) {
    attn *a = make(v);
    inputs in = make_inputs(s, seed);
    float *dout = tu_alloc_f(nv(s));
    tu_fill_normal(dout, nv(s), seed, 4, 1.0);
    float *out = run_forward(a, s, &in);
    float *dq = tu_alloc_f(nq(s)), *dk = tu_alloc_f(nq(s)), *dv = tu_alloc_f(nv(s));
    for (size_t i = 0; i < nq(s); i++) dq[i] = dk[i] = 7.0f;
    for (size_t i = 0; i < nv(s); i++) dv[i] = 7.0f;
    size_t sb = attn_saved_bytes(a, s);
    void *saved = sb ? malloc(sb) : NULL;
    cr_assert_eq(attn_forward(a, s, in.q, in.k, in.v, out, saved), 0, "%s", attn_error());
    int rc = attn_backward(a, s, in.q, in.k, in.v, dout, saved, dq, dk, dv);
    cr_assert_eq(rc, 0, "backward: %s", attn_error());

    fd_ctx c = {to_ref(s), v, eps, tu_to_double(in.q, nq(s)), tu_to_double(in.k, nq(s)), tu_to_double(in.v, nv(s))};
    double *w = tu_to_double(dout, nv(s));
    double *gq = tu_alloc_d(nq(s)), *gk = tu_alloc_d(nq(s)), *gv = tu_alloc_d(nv(s));
    tu_fd_grad(fd_forward, &c, c.q, nq(s), w, nv(s), 1e-4, gq);
    tu_fd_grad(fd_forward, &c, c.k, nq(s), w, nv(s), 1e-4, gk);
    tu_fd_grad(fd_forward, &c, c.vv, nv(s), w, nv(s), 1e-4, gv);
    double eq = tu_rel_err(dq, gq, nq(s), 1e-30), ek = tu_rel_err(dk, gk, nq(s), 1e-30),
           ev = tu_rel_err(dv, gv, nv(s), 1e-30);
    cr_expect_lt(eq, BWD_TOL, "%s causal=%d N=%d dq err %g", v->variant, s->causal, s->len, eq);
    cr_expect_lt(ek, BWD_TOL, "%s causal=%d dk err %g", v->variant, s->causal, ek);
    cr_expect_lt(ev, BWD_TOL, "%s causal=%d dv err %g", v->variant, s->causal, ev);
    assert_padding_zero(s, dq, s->qk_dim, "dq");
    assert_padding_zero(s, dk, s->qk_dim, "dk");
    assert_padding_zero(s, dv, s->v_dim, "dv");

    free(gq);
    free(gk);
    free(gv);
    free(w);
    free(c.q);
    free(c.k);
    free(c.vv);
    free(saved);
    free(out);
    free(dq);
    free(dk);
    free(dv);
    free(dout);
    free_inputs(&in);
    attn_destroy(a);
}

static void backward_suite(const vcfg *v0) {
    int lens[3] = {8, 5, 0};
    vcfg v = with(*v0, "chunk=3"); /* several chunks, N = 8 not a multiple of 3 */
    for (int causal = 0; causal <= 1; causal++) {
        attn_shape s = {3, 2, 8, 3, 3, causal, lens};
        backward_check(&v, &s, 1e-6, 51 + (uint64_t)causal);
        /* N = 1, default chunk. With one key out = sim v / (sim + eps), whose q and k
         * gradients are O(eps): eps = 0.5 makes them O(1) so the check has teeth. */
        vcfg ve = with(*v0, "eps=0.5");
        attn_shape s1 = {1, 1, 1, 3, 2, causal, NULL};
        backward_check(&ve, &s1, 0.5, 53 + (uint64_t)causal);
        attn_shape s2 = {1, 1, 11, 5, 3, causal, NULL}; /* default chunk, odd D and M */
        backward_check(v0, &s2, 1e-6, 55 + (uint64_t)causal);
    }
}

Test(linear_backward, elu) { backward_suite(&ELU); }
Test(linear_backward, taylor) { backward_suite(&TAYLOR); }
Test(linear_backward, polynomial) {
    backward_suite(&POLY);
    vcfg v = POLY;
    v.c = 0.7;
    v.scale = 0.4;
    v = with(with(v, "c=0.7"), "scale=0.4");
    attn_shape s = {1, 2, 6, 4, 2, true, NULL};
    backward_check(&v, &s, 1e-6, 57);
}

/* ---- chunk independence ---- */

/* chunk 1, 3 and 64 compute the same sums in different orders: they agree to float
 * rounding (relative 2e-5, as FWD_TOL / BWD_TOL-scale for these sizes). */
static void chunk_suite(const vcfg *v0) {
    const char *chunks[3] = {"chunk=1", "chunk=3", "chunk=64"};
    int lens[2] = {50, 37};
    for (int causal = 0; causal <= 1; causal++) {
        attn_shape s = {2, 1, 50, 5, 3, causal, lens};
        inputs in = make_inputs(&s, 61);
        float *dout = tu_alloc_f(nv(&s));
        tu_fill_normal(dout, nv(&s), 61, 4, 1.0);
        float *res[3][4];
        for (int c = 0; c < 3; c++) {
            vcfg v = with(*v0, chunks[c]);
            attn *a = make(&v);
            res[c][0] = run_forward(a, &s, &in);
            res[c][1] = tu_alloc_f(nq(&s));
            res[c][2] = tu_alloc_f(nq(&s));
            res[c][3] = tu_alloc_f(nv(&s));
            cr_assert_eq(attn_backward(a, &s, in.q, in.k, in.v, dout, NULL, res[c][1], res[c][2], res[c][3]), 0,
                         "%s", attn_error());
            attn_destroy(a);
        }
        size_t sizes[4] = {nv(&s), nq(&s), nq(&s), nv(&s)};
        for (int t = 0; t < 4; t++) {
            double *base = tu_to_double(res[2][t], sizes[t]);
            for (int c = 0; c < 2; c++) {
                double e = tu_rel_err(res[c][t], base, sizes[t], 1e-30);
                cr_expect_lt(e, 2e-5, "%s causal=%d %s tensor %d differs from chunk=64 by %g", v0->variant, causal,
                             chunks[c], t, e);
            }
            free(base);
        }
        for (int c = 0; c < 3; c++)
            for (int t = 0; t < 4; t++) free(res[c][t]);
        free(dout);
        free_inputs(&in);
    }
}

Test(linear_chunk, elu) { chunk_suite(&ELU); }
Test(linear_chunk, taylor) { chunk_suite(&TAYLOR); }
Test(linear_chunk, polynomial) { chunk_suite(&POLY); }

/* ---- recurrent mode ---- */

/* sim(q, k) and the sum of |terms| the float feature product adds up to get it
 * (sum_c |phi(q)_c phi(k)_c|), in double. Their ratio says how much cancellation
 * the feature dot product has: none for elu+1 (positive features); for polynomial
 * (c + scale q.k)^2 = c^2 + 2 c scale q.k + scale^2 (q.k)^2 it is large when
 * c + scale q.k ~ 0. */
static void sim_terms(const vcfg *v, int D, const float *q, const float *k, double *sim, double *abs_terms) {
    double dot = 0, adot = 0, qq = 0, kk = 0;
    for (int a = 0; a < D; a++) {
        dot += (double)q[a] * k[a];
        adot += fabs((double)q[a] * k[a]);
        qq += (double)q[a] * q[a];
        kk += (double)k[a] * k[a];
    }
    if (v->sim == REF_SIM_POLY) {
        double c = v->c, sc = ref_scale(v, D);
        *sim = (c + sc * dot) * (c + sc * dot);
        *abs_terms = (c + sc * adot) * (c + sc * adot);
    } else if (v->sim == REF_SIM_TAYLOR) {
        double n = fmax(sqrt(qq), 1e-12) * fmax(sqrt(kk), 1e-12);
        *sim = 1 + dot / n;
        *abs_terms = 1 + adot / n;
    } else {
        double sm = 0;
        for (int a = 0; a < D; a++) sm += (q[a] > 0 ? q[a] + 1.0 : exp(q[a])) * (k[a] > 0 ? k[a] + 1.0 : exp(k[a]));
        *sim = *abs_terms = sm;
    }
}

/* Steps from position P (after a prefill of P, out NULL unless with_out) to N-1 give
 * the causal forward's rows. Same sums in another order: relative 2e-5. */
static void recurrent_check(const vcfg *v, int P, bool with_out) {
    attn_shape s = {2, 3, 20, 5, 3, true, NULL};
    attn *a = make(v);
    inputs in = make_inputs(&s, 71);
    float *want = run_forward(a, &s, &in);
    int cap = s.len;
    size_t st = attn_state_bytes(a, &s, cap);
    cr_assert_gt(st, 0, "%s", attn_error());
    attn_state *state = NULL;
    cr_assert_eq(attn_state_create(a, &s, cap, &state), 0, "%s", attn_error());

    /* prefill: inputs [B,H,P,X] */
    size_t BH = (size_t)s.batch * s.heads;
    float *pq = tu_alloc_f(BH * P * s.qk_dim), *pk = tu_alloc_f(BH * P * s.qk_dim), *pv = tu_alloc_f(BH * P * s.v_dim);
    float *pout = with_out ? tu_alloc_f(BH * P * s.v_dim) : NULL;
    for (size_t bh = 0; bh < BH; bh++) {
        memcpy(pq + bh * P * s.qk_dim, in.q + bh * s.len * s.qk_dim, sizeof(float) * P * s.qk_dim);
        memcpy(pk + bh * P * s.qk_dim, in.k + bh * s.len * s.qk_dim, sizeof(float) * P * s.qk_dim);
        memcpy(pv + bh * P * s.v_dim, in.v + bh * s.len * s.v_dim, sizeof(float) * P * s.v_dim);
    }
    int rc = attn_prefill(a, state, P, pq, pk, pv, pout);
    cr_assert_eq(rc, 0, "prefill(%d): %s", P, attn_error());
    float *got = tu_alloc_f(nv(&s));
    if (with_out)
        for (size_t bh = 0; bh < BH; bh++)
            memcpy(got + bh * s.len * s.v_dim, pout + bh * P * s.v_dim, sizeof(float) * P * s.v_dim);

    float *sq = tu_alloc_f(BH * s.qk_dim), *sk = tu_alloc_f(BH * s.qk_dim), *sv = tu_alloc_f(BH * s.v_dim),
          *so = tu_alloc_f(BH * s.v_dim);
    for (int t = P; t < s.len; t++) {
        tu_gather(&s, in.q, sq, t, s.qk_dim);
        tu_gather(&s, in.k, sk, t, s.qk_dim);
        tu_gather(&s, in.v, sv, t, s.v_dim);
        rc = attn_step(a, state, t, sq, sk, sv, so);
        cr_assert_eq(rc, 0, "step %d: %s", t, attn_error());
        for (size_t bh = 0; bh < BH; bh++)
            memcpy(got + (bh * s.len + t) * s.v_dim, so + bh * s.v_dim, sizeof(float) * s.v_dim);
    }
    /* compare rows that were produced */
    /* Row t of slice bh is allowed 2e-5 + 1e-7 kappa (relative to max |out|), with
     * kappa = sum_j |terms of sim_tj| / (den_t + eps): the step forms phi(q) S (sims
     * never formed) while the chunked forward forms sim_tj first, so where the feature
     * products cancel (polynomial, c + scale q.k ~ 0, kappa ~4e3 for one row in these
     * inputs) their float rounding (u = 6e-8 times the sum of |terms|) is amplified
     * by kappa. Measured: 1.3e-8 kappa on that row, <= 2e-7 elsewhere. */
    int from = with_out ? 0 : P;
    double *w = tu_to_double(want, nv(&s));
    double scale = tu_max_abs(w, nv(&s));
    for (size_t bh = 0; bh < BH; bh++)
        for (int t = from; t < s.len; t++) {
            double den = 0, absum = 0, sm, ab;
            for (int j = 0; j <= t; j++) {
                sim_terms(v, s.qk_dim, in.q + (bh * s.len + t) * s.qk_dim, in.k + (bh * s.len + j) * s.qk_dim, &sm,
                          &ab);
                den += sm;
                absum += ab;
            }
            double kappa = absum / (den + 1e-6), tol = 2e-5 + 1e-7 * kappa;
            for (int m = 0; m < s.v_dim; m++) {
                size_t i = (bh * s.len + t) * s.v_dim + m;
                double e = fabs(got[i] - w[i]) / scale;
                cr_expect_leq(e, tol, "%s prefill %d (out %s) + steps vs forward: row %d of slice %zu err %g (kappa %g)",
                              v->variant, P, with_out ? "kept" : "NULL", t, bh, e, kappa);
            }
        }
    /* the state is full now */
    cr_expect_neq(attn_step(a, state, s.len, sq, sk, sv, so), 0, "step past capacity accepted");

    free(w);
    free(sq);
    free(sk);
    free(sv);
    free(so);
    free(got);
    free(pq);
    free(pk);
    free(pv);
    free(pout);
    attn_state_destroy(state);
    free(want);
    free_inputs(&in);
    attn_destroy(a);
}

static void recurrent_suite(const vcfg *v) {
    recurrent_check(v, 0, false);  /* steps only */
    recurrent_check(v, 7, false);  /* prefill 7 (out NULL) + steps */
    recurrent_check(v, 7, true);   /* prefill 7 with its output + steps */
    recurrent_check(v, 20, true);  /* prefill all */
    recurrent_check(v, 20, false); /* prefill all, out NULL: nothing to compare but must run */
}

Test(linear_recurrent, elu) { recurrent_suite(&ELU); }
Test(linear_recurrent, taylor) { recurrent_suite(&TAYLOR); }
Test(linear_recurrent, polynomial) { recurrent_suite(&POLY); }
Test(linear_recurrent, chunked_prefill) {
    vcfg v = with(ELU, "chunk=3");
    recurrent_check(&v, 13, true);
}

/* ---- the polynomial feature map ---- */

Test(linear_features, polynomial_exact) {
    /* phi(q).phi(k) == (c + scale q.k)^2 for the library's feature function, with c
     * and scale set. Float features, dot product in double over C terms each of
     * relative error ~2 ulp: error <= ~1e-6 of the sum of |terms|. */
    const int Ds[3] = {1, 5, 17};
    const double cs[3] = {1.0, 0.3, 2.5}, scales[3] = {1.0, 0.7, 0.05};
    for (int t = 0; t < 3; t++) {
        int D = Ds[t];
        fm_spec f;
        fm_init(&f, FM_POLY, D, cs[t], scales[t]);
        cr_assert_eq(f.C, 1 + D + D * D);
        cr_assert_eq(fm_dim(FM_POLY, D), (size_t)(1 + D + D * D));
        float *x = tu_alloc_f(2 * (size_t)D), *phi = tu_alloc_f(2 * (size_t)f.C);
        tu_fill_normal(x, 2 * (size_t)D, 81, (uint64_t)t, 1.0);
        fm_forward(&f, 2, x, D, phi, f.C, NULL);
        double dot = 0, mag = 0, qk = 0;
        for (int i = 0; i < f.C; i++) {
            dot += (double)phi[i] * phi[f.C + i];
            mag += fabs((double)phi[i] * phi[f.C + i]);
        }
        for (int a = 0; a < D; a++) qk += (double)x[a] * x[D + a];
        double want = (cs[t] + scales[t] * qk) * (cs[t] + scales[t] * qk);
        cr_expect_leq(fabs(dot - want), 1e-6 * mag, "D=%d: phi.phi = %.9g, (c + s q.k)^2 = %.9g", D, dot, want);
        free(x);
        free(phi);
    }
    /* feature sizes of the other maps */
    cr_expect_eq(fm_dim(FM_ELU, 7), 7u);
    cr_expect_eq(fm_dim(FM_TAYLOR, 7), 8u);
    cr_expect_eq(fm_dim(FM_POLY, 64), 4161u);
}

/* ---- options ---- */

static void expect_rejected(const char *variant, const char *setting, const char *must_name) {
    const char *set[1] = {setting};
    attn_options o = {.variant = variant, .device = AB_DEV_CPU, .n_settings = 1, .settings = set};
    attn *a = NULL;
    int rc = attn_create(&o, &a);
    cr_expect_eq(rc, ATTN_EINVAL, "%s %s accepted", variant, setting);
    cr_expect_null(a);
    cr_expect(strstr(attn_error(), must_name) != NULL, "message '%s' does not name '%s'", attn_error(), must_name);
    attn_destroy(a);
}

Test(linear_options, rejected) {
    expect_rejected("linear", "feature_map=relu", "feature_map");
    expect_rejected("linear", "chunk=0", "chunk");
    expect_rejected("linear", "chunk=-4", "chunk");
    expect_rejected("linear", "chunk=65537", "chunk");
    expect_rejected("linear", "eps=-1", "eps");
    expect_rejected("linear", "c=1", "'c'"); /* polynomial's option, not linear's */
    expect_rejected("linear", "bogus=1", "bogus");
    expect_rejected("polynomial", "c=-1", "c=-1");
    expect_rejected("polynomial", "scale=0", "scale");
    expect_rejected("polynomial", "chunk=0", "chunk");
    expect_rejected("polynomial", "feature_map=elu", "feature_map");
    expect_rejected("polynomial", "whatever=2", "whatever");
}

Test(linear_options, defaults_and_values) {
    attn *a = make(&ELU);
    char buf[64];
    attn_shape s = {1, 1, 8, 16, 4, true, NULL};
    cr_expect_str_eq(attn_option_value(a, &s, "feature_map", buf, sizeof buf), "elu");
    cr_expect_str_eq(attn_option_value(a, &s, "chunk", buf, sizeof buf), "auto");
    cr_expect_str_eq(attn_option_value(a, &s, "eps", buf, sizeof buf), "1e-06");
    cr_expect_eq(attn_saved_bytes(a, &s), 0u, "linear attention keeps nothing for backward");
    attn_destroy(a);
    a = make(&POLY);
    cr_expect_str_eq(attn_option_value(a, &s, "scale", buf, sizeof buf), "0.25");
    cr_expect_str_eq(attn_option_value(a, &s, "c", buf, sizeof buf), "1");
    attn_destroy(a);
    vcfg v = with(POLY, "scale=auto");
    a = make(&v);
    cr_expect_str_eq(attn_option_value(a, &s, "scale", buf, sizeof buf), "0.25");
    attn_destroy(a);
}

Test(linear_options, too_large_polynomial_rejected) {
    /* D = 50000 gives C = 2.5e9 features: blocks would overflow BLAS int sizes. */
    attn *a = make(&POLY);
    attn_shape s = {1, 1, 4, 50000, 4, true, NULL};
    cr_expect_eq(attn_check_shape(a, &s), ATTN_EINVAL);
    cr_expect(strstr(attn_error(), "polynomial") != NULL, "message: %s", attn_error());
    attn_destroy(a);
}
