/* linformer (Linformer, Wang et al. 2020) on the CPU: the double reference's backward
 * against central finite differences of its forward (q, k, v and both projections);
 * forward and backward (dq, dk, dv, and the parameter gradients dE, dF, added into the
 * bound buffer) against the reference on random shapes (N = 1, odd sizes, lengths with
 * 0 and N, k above and below N, D = M = 64), each sharing; a sequence shorter than the
 * max_len of its parameters reads only their first columns; padded keys and values
 * are never read; the parameters' count, initialisation and binding; one-line errors.
 *
 * Error figures are tu_rel_err (max abs error over a tensor / the tensor's max abs).
 * The products sum up to L <= 300 terms (the projections), D or M (scores), k (the
 * output) in float32 (u = 6e-8): worst case L u ~ 2e-5, typically sqrt(L) u; the
 * softmax weights are probabilities (no cancellation). */
#include <criterion/criterion.h>

#include "attention.h"
#include "error.h"
#include "reference.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* TC_PRINT=1 in the environment prints every measured error. */
static double note(const char *what, double e) {
    if (getenv("TC_PRINT")) fprintf(stderr, "ERR %.3g %s\n", e, what);
    return e;
}

/* Forward against the double reference: the worst-case float sums above (2e-5),
 * rounded up; measured up to 4.4e-7. A wrong column, mask or softmax axis is O(1e-1). */
#define FWD_TOL 4e-5
/* Backward against the reference: a few more products than forward, the parameter
 * gradient summing over every slice (B H <= 6 here) on top; measured up to 5.8e-7
 * (dq), the parameters' 4.4e-7. */
#define BWD_TOL 5e-5
/* The reference's backward against finite differences (h = 1e-4 in double: truncation
 * h^2 |f'''| ~ 1e-8, rounding 1e-16 / h ~ 1e-12): both are double, so anything above
 * 1e-6 is a wrong formula; measured up to 4.9e-9 (dE). */
#define FD_TOL 1e-6

static attn *make(const char *share, int k) {
    char kset[32], sset[32];
    snprintf(kset, sizeof kset, "k=%d", k);
    snprintf(sset, sizeof sset, "share=%s", share);
    const char *set[] = {kset, sset};
    attn_options o = {.variant = "linformer", .device = AB_DEV_CPU, .seed = 1, .n_settings = 2, .settings = set};
    attn *a = NULL;
    cr_assert_eq(attn_create(&o, &a), 0, "%s", attn_error());
    return a;
}

static ref_shape to_ref(const attn_shape *s) {
    return (ref_shape){s->batch, s->heads, s->len, s->qk_dim, s->v_dim, s->causal, s->lengths};
}

/* The parameters of an attention for max_len, drawn from (seed, stream 5). */
static float *params_of(attn *a, int max_len, size_t *n, uint64_t seed) {
    cr_assert_eq(attn_param_count(a, max_len, n), 0, "%s", attn_error());
    float *p = tu_alloc_f(*n);
    cr_assert_eq(attn_param_init(a, max_len, seed, 5, p), 0, "%s", attn_error());
    return p;
}

/* E and F (double) inside the parameters: F = E unless share=none (2 matrices). */
static void ef_of(const float *par, size_t n, int P, int ld, double **E, double **F) {
    *E = tu_to_double(par, (size_t)P * ld);
    *F = n == 2 * (size_t)P * ld ? tu_to_double(par + (size_t)P * ld, (size_t)P * ld) : *E;
}

/* One case: forward and backward of the library against the reference, with the
 * parameter gradient added to a buffer pre-filled with 0.25. */
static void check_case(const char *share, int P, int max_len, int B, int H, int N, int D, int M, const int *lengths,
                       uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, false, lengths, seed);
    attn *a = make(share, P);
    size_t np;
    float *par = params_of(a, max_len, &np, seed);
    float *grad = tu_alloc_f(np);
    for (size_t i = 0; i < np; i++) grad[i] = 0.25f;
    cr_assert_eq(attn_bind_params(a, max_len, par, grad), 0, "%s", attn_error());
    float *out = tu_alloc_f(p.nv), *dq = tu_alloc_f(p.nq), *dk = tu_alloc_f(p.nq), *dv = tu_alloc_f(p.nv);
    for (size_t i = 0; i < p.nv; i++) out[i] = dv[i] = 7.0f; /* rows the library forgets show */
    for (size_t i = 0; i < p.nq; i++) dq[i] = dk[i] = 7.0f;
    const size_t sb = attn_saved_bytes(a, &p.s);
    cr_assert_eq(sb, (size_t)B * H * P * (N + D + M) * sizeof(float), "saved: A, Kp, Vp per slice (%zu)", sb);
    void *saved = malloc(sb);
    cr_assert_eq(attn_forward(a, &p.s, p.q, p.k, p.v, out, saved), 0, "%s", attn_error());
    cr_assert_eq(attn_backward(a, &p.s, p.q, p.k, p.v, p.dout, saved, dq, dk, dv), 0, "%s", attn_error());

    ref_shape rs = to_ref(&p.s);
    double *E, *F;
    ef_of(par, np, P, max_len, &E, &F);
    double *q = tu_to_double(p.q, p.nq), *k = tu_to_double(p.k, p.nq), *v = tu_to_double(p.v, p.nv);
    double *g = tu_to_double(p.dout, p.nv), *want = tu_alloc_d(p.nv);
    double *gq = tu_alloc_d(p.nq), *gk = tu_alloc_d(p.nq), *gv = tu_alloc_d(p.nv);
    double *gE = tu_alloc_d((size_t)P * max_len), *gF = tu_alloc_d((size_t)P * max_len);
    double scale = 1.0 / sqrt((double)D);
    ref_linformer(&rs, P, max_len, E, F, scale, q, k, v, want);
    ref_linformer_backward(&rs, P, max_len, E, F, scale, q, k, v, g, gq, gk, gv, gE, gF);
    /* the bound gradient: 0.25 + dE (+ dF when E = F) */
    double *gpar = tu_alloc_d(np);
    for (size_t i = 0; i < (size_t)P * max_len; i++) {
        if (np == 2 * (size_t)P * max_len) {
            gpar[i] = 0.25 + gE[i];
            gpar[(size_t)P * max_len + i] = 0.25 + gF[i];
        } else
            gpar[i] = 0.25 + gE[i] + gF[i];
    }
    char what[128];
    snprintf(what, sizeof what, "share=%s k=%d max_len=%d B=%d H=%d N=%d D=%d M=%d", share, P, max_len, B, H, N, D, M);
    double eo = note("out", tu_rel_err(out, want, p.nv, 1e-30));
    double eq = note("dq", tu_rel_err(dq, gq, p.nq, 1e-30)), ek = note("dk", tu_rel_err(dk, gk, p.nq, 1e-30));
    double ev = note("dv", tu_rel_err(dv, gv, p.nv, 1e-30));
    /* judged against the gradient's own scale (the 0.25 taken off) */
    float *gf = tu_alloc_f(np);
    for (size_t i = 0; i < np; i++) gf[i] = grad[i] - 0.25f;
    for (size_t i = 0; i < np; i++) gpar[i] -= 0.25;
    double ep = note("dparams", tu_rel_err(gf, gpar, np, 1e-30));
    cr_expect_lt(eo, FWD_TOL, "%s: out err %g", what, eo);
    cr_expect_lt(eq, BWD_TOL, "%s: dq err %g", what, eq);
    cr_expect_lt(ek, BWD_TOL, "%s: dk err %g", what, ek);
    cr_expect_lt(ev, BWD_TOL, "%s: dv err %g", what, ev);
    cr_expect_lt(ep, BWD_TOL, "%s: dparams err %g", what, ep);
    /* columns no valid position reaches get nothing: exactly 0.25 still */
    int maxL = 0;
    for (int b = 0; b < B; b++) maxL = (lengths ? lengths[b] : N) > maxL ? (lengths ? lengths[b] : N) : maxL;
    for (size_t m = 0; m < np / ((size_t)P * max_len); m++)
        for (int r = 0; r < P; r++)
            for (int j = maxL; j < max_len; j++)
                cr_assert_eq(grad[(m * P + r) * (size_t)max_len + j], 0.25f, "%s: column %d past every length", what, j);
    tu_assert_padded_zero(&p.s, out, M, "out");
    tu_assert_padded_zero(&p.s, dq, D, "dq");
    tu_assert_padded_zero(&p.s, dk, D, "dk");
    tu_assert_padded_zero(&p.s, dv, M, "dv");
    free(gf), free(gpar), free(gE), free(gF), free(gq), free(gk), free(gv), free(want), free(g);
    free(q), free(k), free(v);
    if (F != E) free(F);
    free(E);
    free(out), free(dq), free(dk), free(dv), free(saved), free(par), free(grad);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(linformer, against_reference) {
    check_case("none", 4, 1, 1, 1, 1, 3, 2, NULL, 11);            /* N = 1 */
    check_case("none", 5, 37, 2, 3, 37, 5, 7, NULL, 12);          /* odd sizes, k < N */
    int lens[3] = {50, 23, 0};                                    /* full, partial, empty */
    check_case("kv", 64, 50, 3, 2, 50, 8, 3, lens, 13);           /* k > N */
    check_case("layer", 16, 80, 2, 1, 50, 6, 4, lens, 14);        /* N < max_len */
    int lens2[2] = {300, 157};
    check_case("none", 32, 300, 2, 1, 300, 16, 9, lens2, 15);     /* a row block of 256 and a ragged one of 44 */
    check_case("none", 32, 64, 1, 2, 64, 64, 64, NULL, 16);       /* the sweep's head size */
}

/* ---- the reference itself ---- */

typedef struct {
    ref_shape r;
    int P, ld;
    double *q, *k, *v, *E, *F;
} fd_ctx;

static void fd_forward(void *ctx, double *out) {
    fd_ctx *c = ctx;
    ref_linformer(&c->r, c->P, c->ld, c->E, c->F, 0.7, c->q, c->k, c->v, out);
}

/* Every gradient of the reference's backward against finite differences of its
 * forward, with lengths (one 0) and max_len > N. */
Test(linformer, reference_backward_finite_differences) {
    const int B = 3, H = 2, N = 7, D = 3, M = 2, P = 4, ld = 9, lens[3] = {7, 4, 0};
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, false, lens, 21);
    float *ef = tu_normal(2 * (size_t)P * ld, 21, 9, 0.5);
    fd_ctx c = {to_ref(&p.s), P, ld, tu_to_double(p.q, p.nq), tu_to_double(p.k, p.nq), tu_to_double(p.v, p.nv),
                tu_to_double(ef, (size_t)P * ld), tu_to_double(ef + (size_t)P * ld, (size_t)P * ld)};
    double *w = tu_to_double(p.dout, p.nv);
    double *aq = tu_alloc_d(p.nq), *ak = tu_alloc_d(p.nq), *av = tu_alloc_d(p.nv);
    double *aE = tu_alloc_d((size_t)P * ld), *aF = tu_alloc_d((size_t)P * ld);
    ref_linformer_backward(&c.r, P, ld, c.E, c.F, 0.7, c.q, c.k, c.v, w, aq, ak, av, aE, aF);
    double *fq = tu_alloc_d(p.nq), *fk = tu_alloc_d(p.nq), *fv = tu_alloc_d(p.nv);
    double *fE = tu_alloc_d((size_t)P * ld), *fF = tu_alloc_d((size_t)P * ld);
    tu_fd_grad(fd_forward, &c, c.q, p.nq, w, p.nv, 1e-4, fq);
    tu_fd_grad(fd_forward, &c, c.k, p.nq, w, p.nv, 1e-4, fk);
    tu_fd_grad(fd_forward, &c, c.v, p.nv, w, p.nv, 1e-4, fv);
    tu_fd_grad(fd_forward, &c, c.E, (size_t)P * ld, w, p.nv, 1e-4, fE);
    tu_fd_grad(fd_forward, &c, c.F, (size_t)P * ld, w, p.nv, 1e-4, fF);
    const double *got[5] = {aq, ak, av, aE, aF}, *fd[5] = {fq, fk, fv, fE, fF};
    const size_t n[5] = {p.nq, p.nq, p.nv, (size_t)P * ld, (size_t)P * ld};
    const char *name[5] = {"dq", "dk", "dv", "dE", "dF"};
    for (int t = 0; t < 5; t++) {
        double scale = tu_max_abs(fd[t], n[t]), e = 0;
        cr_assert_gt(scale, 1e-3, "%s: a gradient that is all zero tests nothing", name[t]);
        for (size_t i = 0; i < n[t]; i++) e = fmax(e, fabs(got[t][i] - fd[t][i]));
        cr_expect_lt(note(name[t], e / scale), FD_TOL, "reference %s against finite differences: %g", name[t],
                     e / scale);
    }
    /* the columns past every length (7, 8) get no gradient */
    for (int r = 0; r < P; r++)
        for (int j = N; j < ld; j++) cr_assert(aE[r * ld + j] == 0 && aF[r * ld + j] == 0);
    free(aq), free(ak), free(av), free(aE), free(aF), free(fq), free(fk), free(fv), free(fE), free(fF), free(w);
    free(c.q), free(c.k), free(c.v), free(c.E), free(c.F), free(ef);
    tu_problem_free(&p);
}

/* ---- the definition, without the reference ---- */

/* A sequence of N < max_len positions reads only the first N columns of E and F: the
 * other columns set to NaN change nothing, and the result equals the one with
 * parameters built for max_len = N holding those first columns (the same products,
 * other leading dimensions: equal up to rounding, measured bit for bit). Padded keys
 * and values (NaN, 1e30) are never read either. */
Test(linformer, first_columns_and_padding) {
    const int B = 2, H = 2, N = 20, D = 5, M = 3, P = 6, big = 33, lens[2] = {20, 13};
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, false, lens, 31);
    attn *a = make("none", P);
    size_t nb, ns;
    float *pb = params_of(a, big, &nb, 31);
    cr_assert_eq(nb, 2u * P * big);
    float *ps = tu_alloc_f(2 * (size_t)P * N);
    for (int m = 0; m < 2; m++)
        for (int r = 0; r < P; r++) {
            memcpy(ps + ((size_t)m * P + r) * N, pb + ((size_t)m * P + r) * big, sizeof(float) * N);
            for (int j = N; j < big; j++) pb[((size_t)m * P + r) * big + j] = NAN;
        }
    cr_assert_eq(attn_param_count(a, N, &ns), 0);
    cr_assert_eq(ns, 2u * P * N);
    for (int h = 0; h < H; h++)
        for (int j = lens[1]; j < N; j++) {
            for (int d = 0; d < D; d++) p.k[(((size_t)1 * H + h) * N + j) * D + d] = NAN;
            for (int c = 0; c < M; c++) p.v[(((size_t)1 * H + h) * N + j) * M + c] = 1e30f;
        }
    void *saved = malloc(attn_saved_bytes(a, &p.s));
    float *o1 = tu_alloc_f(p.nv), *o2 = tu_alloc_f(p.nv);
    cr_assert_eq(attn_bind_params(a, big, pb, NULL), 0, "%s", attn_error());
    cr_assert_eq(attn_forward(a, &p.s, p.q, p.k, p.v, o1, saved), 0, "%s", attn_error());
    cr_assert_eq(attn_bind_params(a, N, ps, NULL), 0, "%s", attn_error());
    cr_assert_eq(attn_forward(a, &p.s, p.q, p.k, p.v, o2, saved), 0, "%s", attn_error());
    for (size_t i = 0; i < p.nv; i++) cr_assert(isfinite(o1[i]), "NaN columns or padding were read at %zu", i);
    double *d2 = tu_to_double(o2, p.nv);
    /* only the leading dimension differs: a float rounding at most */
    double e = note("first columns", tu_rel_err(o1, d2, p.nv, 1e-30));
    cr_expect_lt(e, 1e-6, "max_len 33 and 20 differ by %g", e);
    free(d2), free(o1), free(o2), free(saved), free(pb), free(ps);
    attn_destroy(a);
    tu_problem_free(&p);
}

/* ---- parameters ---- */

Test(linformer, parameters) {
    attn *none = make("none", 8), *kv = make("kv", 8), *layer = make("layer", 8);
    size_t n;
    cr_assert_eq(attn_param_count(none, 100, &n), 0);
    cr_assert_eq(n, 1600u, "none: E and F, 8 x 100 each");
    cr_assert_eq(attn_param_count(kv, 100, &n), 0);
    cr_assert_eq(n, 800u, "kv: one matrix");
    cr_assert_eq(attn_param_count(layer, 100, &n), 0);
    cr_assert_eq(n, 800u);
    cr_assert_not(attn_params_shared_by_layers(none));
    cr_assert_not(attn_params_shared_by_layers(kv));
    cr_assert(attn_params_shared_by_layers(layer));
    /* initialisation: uniform(+-1/sqrt(max_len)), a function of (seed, stream) */
    float *a1 = tu_alloc_f(1600), *a2 = tu_alloc_f(1600), *a3 = tu_alloc_f(1600);
    cr_assert_eq(attn_param_init(none, 100, 7, 3, a1), 0);
    cr_assert_eq(attn_param_init(none, 100, 7, 3, a2), 0);
    cr_assert_eq(attn_param_init(none, 100, 7, 4, a3), 0);
    cr_assert_eq(memcmp(a1, a2, sizeof(float) * 1600), 0, "same seed and stream: same values");
    double mx = 0, sum = 0, sq = 0;
    int same = 0;
    for (int i = 0; i < 1600; i++) {
        mx = fmax(mx, fabs(a1[i]));
        sum += a1[i];
        sq += (double)a1[i] * a1[i];
        same += a1[i] == a3[i];
    }
    cr_assert_leq(mx, 0.1, "bound 1/sqrt(100)");
    cr_assert_gt(mx, 0.09, "the bound is reached nearly: %g", mx);
    /* uniform(+-0.1): mean 0 (sd of the mean 0.058/40 = 1.4e-3), variance 0.01/3 */
    cr_assert_lt(fabs(sum / 1600), 6e-3, "mean %g", sum / 1600);
    cr_assert_lt(fabs(sq / 1600 - 0.01 / 3) / (0.01 / 3), 0.1, "variance %g", sq / 1600);
    cr_assert_lt(same, 5, "another stream draws other values");
    /* variants without parameters: 0, nothing to init, nothing to bind */
    attn_options o = {.variant = "softmax", .device = AB_DEV_CPU};
    attn *sm = NULL;
    cr_assert_eq(attn_create(&o, &sm), 0);
    cr_assert_eq(attn_param_count(sm, 100, &n), 0);
    cr_assert_eq(n, 0u);
    cr_assert_eq(attn_param_init(sm, 100, 1, 1, NULL), 0);
    cr_assert_eq(attn_bind_params(sm, 100, a1, NULL), ATTN_EINVAL);
    cr_assert_not(attn_params_shared_by_layers(sm));
    free(a1), free(a2), free(a3);
    attn_destroy(sm), attn_destroy(none), attn_destroy(kv), attn_destroy(layer);
}

/* ---- errors: one line each ---- */

static void one_line(const char *must) {
    const char *msg = attn_error();
    cr_assert(strstr(msg, must) && !strchr(msg, '\n'), "message '%s' should name '%s' in one line", msg, must);
}

Test(linformer, errors_in_one_line) {
    attn *a = make("none", 4);
    float x[64] = {0}, out[64], sv[4096];
    attn_shape s = {1, 1, 8, 4, 4, false, NULL};
    /* parameters not bound */
    cr_assert_eq(attn_forward(a, &s, x, x, x, out, sv), ATTN_EINVAL);
    one_line("attn_bind_params");
    cr_assert_eq(attn_backward(a, &s, x, x, x, x, sv, out, out, out), ATTN_EINVAL);
    one_line("attn_bind_params");
    /* a sequence longer than max_len */
    float par[2 * 4 * 6] = {0};
    cr_assert_eq(attn_bind_params(a, 6, par, NULL), 0);
    cr_assert_eq(attn_forward(a, &s, x, x, x, out, sv), ATTN_EINVAL);
    one_line("N=8 exceeds the max_len 6");
    /* causal refused */
    s.causal = true;
    cr_assert_eq(attn_forward(a, &s, x, x, x, out, sv), ATTN_EUNSUPPORTED);
    one_line("non-causal");
    cr_assert_not(attn_has_step(a));
    /* bad max_len, NULL parameters */
    size_t n;
    cr_assert_eq(attn_param_count(a, 0, &n), ATTN_EINVAL);
    one_line("max_len 0");
    cr_assert_eq(attn_bind_params(a, 6, NULL, NULL), ATTN_EINVAL);
    one_line("NULL");
    /* sizes that overflow */
    attn *big = make("none", 1048576);
    cr_assert_eq(attn_param_count(big, 2147483647, &n), 0, "2^20 x 2^31 x 2 floats fit in 64 bits");
    attn_shape h = {1 << 20, 1 << 10, 1 << 20, 64, 64, false, NULL};
    cr_assert_eq(attn_check_shape(big, &h), ATTN_EINVAL);
    one_line("too large");
    /* options */
    const char *bad[] = {"k=0", "share=heads", "window=3"};
    const char *must[] = {"out of range", "none, kv, layer", "no option 'window'"};
    for (int i = 0; i < 3; i++) {
        attn_options o = {.variant = "linformer", .device = AB_DEV_CPU, .n_settings = 1, .settings = &bad[i]};
        attn *b = NULL;
        cr_assert_eq(attn_create(&o, &b), ATTN_EINVAL, "%s", bad[i]);
        one_line(must[i]);
    }
    attn_destroy(big);
    attn_destroy(a);
}
