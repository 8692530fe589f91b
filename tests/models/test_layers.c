/* models/ layers on the CPU: each forward against the double reference
 * (tests/reference/ref_model.c), each backward against central finite differences of
 * that reference, accumulation (+=), results independent of the thread count, the
 * dropout mask (its formula, reproducibility, keep rate, scaling), and the discretised
 * logistic mixture head against tests/reference/ref_mixture.c (its 256 probabilities
 * sum to 1, log P of every value, loss and gradients with finite differences, the most
 * probable value, sampling; tolerances with their own reasons at the end).
 *
 * Error figures are tu_rel_err: max abs error over a tensor divided by the tensor's max
 * abs value. Finite differences use the double reference with step h = 1e-5: truncation
 * h^2 |f'''| / 6 ~ 1e-10 and rounding 2^-53 |L| / h ~ 1e-11 for the O(1) values here,
 * so the measured differences are the float32 code's own error. Inputs are O(1), sums
 * run over at most a few dozen terms, so float32 rounding (2^-24 = 6e-8 per operation)
 * stays near 1e-6; every tolerance below is given with what was measured. A ReLU kink
 * within h of an input would spoil a difference; with these fixed seeds none is (the
 * nearest pre-activation is far beyond 1e-5, or the checks would fail by O(1)).
 * TEST_VERBOSE=1 prints every measured error. */
#include "test_layers.h"

/* ---- helpers ---- */

/* n floats of 1 + sd * normal (layer-norm gains) */
void fill_gain(float *x, size_t n, uint64_t seed, uint64_t stream, double sd) {
    tu_fill_normal(x, n, seed, stream, sd);
    for (size_t i = 0; i < n; i++) x[i] += 1.0f;
}

void gadd(gcheck *g, const char *name, double *x, size_t n, const float *grad) {
    g->name[g->nt] = name;
    g->x[g->nt] = x;
    g->n[g->nt] = n;
    g->grad[g->nt] = grad;
    g->nt++;
}

/* Every gradient in g against finite differences of sum(fwd(ctx) * w). */
void check_grads(const gcheck *g, tu_forward_fn fwd, void *ctx, const double *w, size_t nout, double tol,
                 const char *what) {
    for (int i = 0; i < g->nt; i++) {
        double *fd = tu_alloc_d(g->n[i]);
        tu_fd_grad(fwd, ctx, g->x[i], g->n[i], w, nout, FD_STEP, fd);
        double e = tu_rel_err(g->grad[i], fd, g->n[i], 1e-30);
        cr_expect_lt(e, tol, "%s: gradient of %s: err %g", what, g->name[i], e);
        if (getenv("TEST_VERBOSE"))
            fprintf(stderr, "%s: d%s err %.3g (max %.3g)\n", what, g->name[i], e, tu_max_abs(fd, g->n[i]));
        free(fd);
    }
}

double fwd_err(const float *got, const double *want, size_t n) {
    double e = tu_rel_err(got, want, n, 1e-30);
    if (getenv("TEST_VERBOSE")) fprintf(stderr, "forward err %.3g\n", e);
    return e;
}

void set_threads(int n) { omp_set_num_threads(n); }

/* ---- dense ---- */

typedef struct {
    int BT, C, OC;
    double *x, *w, *b;
} dense_ctx;

static void dense_ref(void *c_, double *out) {
    dense_ctx *c = c_;
    ref_dense(c->x, c->w, c->b, c->BT, c->C, c->OC, out);
}

static void dense_case(int BT, int C, int OC, bool bias, uint64_t seed) {
    float *x = tu_normal((size_t)BT * C, seed, 1, 1.0), *w = tu_normal((size_t)OC * C, seed, 2, 0.5);
    float *b = bias ? tu_normal((size_t)OC, seed, 3, 1.0) : NULL;
    float *dout = tu_normal((size_t)BT * OC, seed, 4, 1.0), *out = tu_alloc_f((size_t)BT * OC);
    for (size_t i = 0; i < (size_t)BT * OC; i++) out[i] = 7.0f;
    dense_forward(out, x, w, b, BT, C, OC);
    dense_ctx c = {BT, C, OC, tu_to_double(x, (size_t)BT * C), tu_to_double(w, (size_t)OC * C),
                   bias ? tu_to_double(b, (size_t)OC) : NULL};
    double *want = tu_alloc_d((size_t)BT * OC);
    dense_ref(&c, want);
    double e = fwd_err(out, want, (size_t)BT * OC);
    cr_expect_lt(e, FWD_TOL, "dense forward BT=%d C=%d OC=%d bias=%d: err %g", BT, C, OC, bias, e);

    float *dx = tu_alloc_f((size_t)BT * C), *dw = tu_alloc_f((size_t)OC * C), *db = tu_alloc_f((size_t)OC);
    dense_backward(dx, dw, bias ? db : NULL, dout, x, w, BT, C, OC);
    gcheck g = {0};
    gadd(&g, "x", c.x, (size_t)BT * C, dx);
    gadd(&g, "w", c.w, (size_t)OC * C, dw);
    if (bias) gadd(&g, "b", c.b, (size_t)OC, db);
    double *wd = tu_to_double(dout, (size_t)BT * OC);
    check_grads(&g, dense_ref, &c, wd, (size_t)BT * OC, BWD_TOL, "dense");

    /* a second backward adds exactly the same values again */
    float *dx1 = malloc(sizeof(float) * BT * C), *dw1 = malloc(sizeof(float) * OC * C);
    float *db1 = malloc(sizeof(float) * OC);
    memcpy(dx1, dx, sizeof(float) * BT * C);
    memcpy(dw1, dw, sizeof(float) * OC * C);
    memcpy(db1, db, sizeof(float) * OC);
    dense_backward(dx, dw, bias ? db : NULL, dout, x, w, BT, C, OC);
    for (int i = 0; i < BT * C; i++) cr_assert_eq(dx[i], 2 * dx1[i], "dx does not accumulate at %d", i);
    for (int i = 0; i < OC * C; i++) cr_assert_eq(dw[i], 2 * dw1[i], "dw does not accumulate at %d", i);
    for (int i = 0; i < OC; i++) cr_assert_eq(db[i], 2 * db1[i], "db does not accumulate at %d", i);

    free(dx1);
    free(dw1);
    free(db1);
    free(wd);
    free(want);
    free(c.x);
    free(c.w);
    free(c.b);
    free(x);
    free(w);
    free(b);
    free(dout);
    free(out);
    free(dx);
    free(dw);
    free(db);
}

Test(layers, dense) {
    dense_case(7, 5, 4, true, 11);
    dense_case(1, 3, 1, true, 12);
    dense_case(6, 4, 9, false, 13);
}

/* Big enough for the threaded paths (> 16384 elements): 1 and 2 threads agree bit for
 * bit (row-ordered column sums; OpenBLAS reproducible per thread count is not assumed
 * across counts, so only db, the part written here, is compared exactly) and the
 * closed forms hold. */
Test(layers, dense_threads) {
    int BT = 300, C = 17, OC = 70;
    float *x = tu_normal((size_t)BT * C, 21, 1, 1.0), *w = tu_normal((size_t)OC * C, 21, 2, 0.5);
    float *dout = tu_normal((size_t)BT * OC, 21, 4, 1.0);
    float *db[2], *dw = tu_alloc_f((size_t)OC * C);
    for (int t = 0; t < 2; t++) {
        set_threads(t + 1);
        db[t] = tu_alloc_f((size_t)OC);
        dense_backward(NULL, dw, db[t], dout, x, w, BT, C, OC);
    }
    set_threads(2);
    cr_assert(memcmp(db[0], db[1], sizeof(float) * OC) == 0, "db differs between 1 and 2 threads");
    double *want = tu_alloc_d((size_t)OC);
    for (int i = 0; i < BT; i++)
        for (int o = 0; o < OC; o++) want[o] += dout[(size_t)i * OC + o];
    /* 300 float32 terms summed in double then rounded once: error <= 2^-24 relative */
    cr_expect_lt(tu_rel_err(db[0], want, (size_t)OC, 1e-30), 1e-6);
    free(want);
    free(db[0]);
    free(db[1]);
    free(dw);
    free(x);
    free(w);
    free(dout);
}

/* ---- layer normalisation ---- */

typedef struct {
    int BT, C;
    double *x, *g, *b;
} ln_ctx;

static void ln_ref(void *c_, double *out) {
    ln_ctx *c = c_;
    ref_layernorm(c->x, c->g, c->b, c->BT, c->C, out);
}

static void ln_case(int BT, int C, uint64_t seed) {
    size_t n = (size_t)BT * C;
    float *x = tu_normal(n, seed, 1, 2.0), *g = tu_alloc_f((size_t)C), *b = tu_normal((size_t)C, seed, 3, 0.3);
    for (size_t i = 0; i < n; i++) x[i] += 0.5f;
    fill_gain(g, (size_t)C, seed, 2, 0.3);
    float *out = tu_alloc_f(n), *mean = tu_alloc_f((size_t)BT), *rstd = tu_alloc_f((size_t)BT);
    float *dout = tu_normal(n, seed, 4, 1.0);
    layernorm_forward(out, mean, rstd, x, g, b, BT, C);
    ln_ctx c = {BT, C, tu_to_double(x, n), tu_to_double(g, (size_t)C), tu_to_double(b, (size_t)C)};
    double *want = tu_alloc_d(n);
    ln_ref(&c, want);
    double e = fwd_err(out, want, n);
    cr_expect_lt(e, FWD_TOL, "layernorm forward: err %g", e);
    float *dx = tu_alloc_f(n), *dg = tu_alloc_f((size_t)C), *db = tu_alloc_f((size_t)C);
    layernorm_backward(dx, dg, db, dout, x, g, mean, rstd, BT, C);
    gcheck gc = {0};
    gadd(&gc, "x", c.x, n, dx);
    gadd(&gc, "g", c.g, (size_t)C, dg);
    gadd(&gc, "b", c.b, (size_t)C, db);
    double *wd = tu_to_double(dout, n);
    check_grads(&gc, ln_ref, &c, wd, n, BWD_TOL, "layernorm");
    free(wd);
    free(want);
    free(c.x);
    free(c.g);
    free(c.b);
    free(x);
    free(g);
    free(b);
    free(out);
    free(mean);
    free(rstd);
    free(dout);
    free(dx);
    free(dg);
    free(db);
}

Test(layers, layernorm) {
    ln_case(6, 7, 31);
    /* one row of 3 (C = 2 is degenerate: xhat = +-1 whatever x, so dx is ~1e-6 and
     * only float rounding is left to compare) */
    ln_case(1, 3, 32);
    ln_case(3, 33, 33);
}

/* Threaded sizes: every output bit-identical on 1 and 2 threads (rows are independent
 * and the gain/bias sums run per channel in row order). */
Test(layers, layernorm_threads) {
    int BT = 700, C = 40;
    size_t n = (size_t)BT * C;
    float *x = tu_normal(n, 34, 1, 1.0), *g = tu_normal((size_t)C, 34, 2, 1.0), *b = tu_normal((size_t)C, 34, 3, 1.0);
    float *dout = tu_normal(n, 34, 4, 1.0);
    float *res[2][6];
    for (int t = 0; t < 2; t++) {
        set_threads(t + 1);
        float *out = tu_alloc_f(n), *mean = tu_alloc_f((size_t)BT), *rstd = tu_alloc_f((size_t)BT);
        float *dx = tu_alloc_f(n), *dg = tu_alloc_f((size_t)C), *db = tu_alloc_f((size_t)C);
        layernorm_forward(out, mean, rstd, x, g, b, BT, C);
        layernorm_backward(dx, dg, db, dout, x, g, mean, rstd, BT, C);
        float *r[6] = {out, mean, rstd, dx, dg, db};
        memcpy(res[t], r, sizeof r);
    }
    set_threads(2);
    size_t sizes[6] = {n, (size_t)BT, (size_t)BT, n, (size_t)C, (size_t)C};
    for (int i = 0; i < 6; i++) {
        cr_expect(memcmp(res[0][i], res[1][i], sizeof(float) * sizes[i]) == 0, "tensor %d differs", i);
        free(res[0][i]);
        free(res[1][i]);
    }
    free(x);
    free(g);
    free(b);
    free(dout);
}

/* ---- token embedding and positions ---- */

typedef struct {
    int BT, C;
    const int *tokens;
    double *wte;
} emb_ctx;

static void emb_ref(void *c_, double *out) {
    emb_ctx *c = c_;
    for (int i = 0; i < c->BT; i++)
        for (int ch = 0; ch < c->C; ch++) out[(size_t)i * c->C + ch] = c->wte[(size_t)c->tokens[i] * c->C + ch];
}

Test(layers, embedding) {
    int V = 5, C = 6, BT = 9;
    int tokens[9] = {0, 3, 3, 4, 1, 3, 0, 4, 4}; /* repeats: their gradients add up; 2 is unused */
    float *wte = tu_normal((size_t)V * C, 41, 1, 1.0), *out = tu_alloc_f((size_t)BT * C);
    float *dout = tu_normal((size_t)BT * C, 41, 2, 1.0), *dwte = tu_alloc_f((size_t)V * C);
    embedding_forward(out, tokens, wte, BT, C);
    for (int i = 0; i < BT; i++)
        cr_assert(memcmp(out + i * C, wte + tokens[i] * C, sizeof(float) * C) == 0, "row %d is not wte[%d]", i,
                  tokens[i]);
    embedding_backward(dwte, dout, tokens, BT, C);
    emb_ctx c = {BT, C, tokens, tu_to_double(wte, (size_t)V * C)};
    gcheck g = {0};
    gadd(&g, "wte", c.wte, (size_t)V * C, dwte);
    double *wd = tu_to_double(dout, (size_t)BT * C);
    check_grads(&g, emb_ref, &c, wd, (size_t)BT * C, BWD_TOL, "embedding");
    for (int ch = 0; ch < C; ch++) cr_expect_eq(dwte[2 * C + ch], 0.0f, "unused token 2 got a gradient");
    free(wd);
    free(c.wte);
    free(wte);
    free(out);
    free(dout);
    free(dwte);
}

Test(layers, positions) {
    int N = 50, C = 7; /* odd C: the last channel is a sin without its cos */
    float *table = tu_alloc_f((size_t)N * C);
    positions_table(table, N, C);
    double worst = 0;
    for (int p = 0; p < N; p++)
        for (int c = 0; c < C; c++) {
            double angle = p / pow(10000.0, (double)(2 * (c / 2)) / C);
            double want = c % 2 == 0 ? sin(angle) : cos(angle);
            worst = fmax(worst, fabs(table[p * C + c] - want));
        }
    /* double computation rounded to float: half an ulp of values <= 1 is 6e-8 */
    cr_expect_lt(worst, 1e-7, "positions table: err %g", worst);
    cr_expect_eq(table[0], 0.0f);
    cr_expect_eq(table[1], 1.0f);
    /* positions_add at an offset (generation steps) */
    int B = 2, n = 3, pos0 = 4;
    float *x = tu_normal((size_t)B * n * C, 42, 1, 1.0), *x0 = malloc(sizeof(float) * B * n * C);
    memcpy(x0, x, sizeof(float) * B * n * C);
    positions_add(x, table, B, n, C, pos0);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < n; i++)
            for (int c = 0; c < C; c++) {
                size_t k = ((size_t)b * n + i) * C + c;
                cr_assert_eq(x[k], x0[k] + table[(pos0 + i) * C + c]);
            }
    free(x);
    free(x0);
    free(table);
}

/* ---- dropout ---- */

Test(dropout, mask_formula_and_reproducibility) {
    size_t n = 1003; /* not a multiple of 4 */
    float p = 0.3f;
    uint8_t *m1 = malloc(n), *m2 = malloc(n), *m3 = malloc(n);
    dropout_mask(m1, n, p, 77, 5);
    dropout_mask(m2, n, p, 77, 5);
    cr_assert(memcmp(m1, m2, n) == 0, "same seed and stream, different masks");
    uint32_t thr = dropout_threshold(p);
    cr_assert_eq(thr, (uint32_t)llround(0.7 * 16777216.0));
    for (size_t i = 0; i < n; i++) {
        uint32_t w[4];
        ab_philox4x32(77, 5, i / 4, w);
        cr_assert_eq(m1[i], (w[i % 4] >> 8) < thr, "element %zu does not follow the documented rule", i);
    }
    dropout_mask(m3, n, p, 78, 5);
    size_t same = 0;
    for (size_t i = 0; i < n; i++) same += m1[i] == m3[i];
    /* independent masks agree on p^2 + (1-p)^2 = 58% of elements, not all */
    cr_expect_lt(same, n - 100, "another seed gives (nearly) the same mask");
    dropout_mask(m3, n, p, 77, 6);
    same = 0;
    for (size_t i = 0; i < n; i++) same += m1[i] == m3[i];
    cr_expect_lt(same, n - 100, "another stream gives (nearly) the same mask");
    cr_expect_eq(dropout_threshold(0.0f), 1u << 24);
    free(m1);
    free(m2);
    free(m3);
}

/* A part of a batch draws its piece of the whole batch's masks (the micro-batches of
 * accumulate and of data-parallel ranks): elements first .. first + n - 1, for a start
 * on a Philox block boundary and off one, and the outputs with them. */
Test(dropout, a_part_draws_its_piece_of_the_whole_mask) {
    const size_t total = 1003;
    const float p = 0.3f;
    uint8_t *whole = malloc(total), *part = malloc(total + 1);
    float *x = malloc(sizeof(float) * total), *y = malloc(sizeof(float) * total), *yp = malloc(sizeof(float) * total);
    for (size_t i = 0; i < total; i++) x[i] = (float)i - 500.0f;
    dropout_forward(y, whole, x, total, p, 77, 5);
    const size_t starts[4] = {0, 4, 401, 1002};
    for (int s = 0; s < 4; s++) {
        const size_t first = starts[s], n = total - first;
        memset(part, 7, total + 1);
        dropout_mask_at(part, n, p, 77, 5, first);
        cr_expect(memcmp(part, whole + first, n) == 0, "mask from element %zu differs from the whole's", first);
        cr_expect_eq(part[n], 7, "mask from element %zu wrote past its %zu elements", first, n);
        dropout_forward_at(yp, part, x + first, n, p, 77, 5, first);
        cr_expect(memcmp(yp, y + first, sizeof(float) * n) == 0, "output from element %zu differs", first);
    }
    /* a part in the middle: elements 6 .. 9 (crossing a block boundary) */
    dropout_mask_at(part, 4, p, 77, 5, 6);
    cr_expect(memcmp(part, whole + 6, 4) == 0, "elements 6..9 differ");
    free(whole), free(part), free(x), free(y), free(yp);
}

Test(dropout, keep_rate_scaling_backward_threads) {
    size_t n = 1 << 20;
    float rates[3] = {0.1f, 0.5f, 0.9f};
    float *x = tu_normal(n, 51, 1, 1.0), *y = tu_alloc_f(n), *dx = tu_alloc_f(n), *dout = tu_normal(n, 51, 2, 1.0);
    uint8_t *mask = malloc(n), *mask1 = malloc(n);
    for (int r = 0; r < 3; r++) {
        float p = rates[r];
        set_threads(2);
        dropout_forward(y, mask, x, n, p, 9, 3);
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) {
            kept += mask[i];
            if (mask[i]) cr_assert_eq(y[i], x[i] * (1.0f / (1.0f - p)), "kept element %zu not scaled", i);
            else cr_assert_eq(y[i], 0.0f, "dropped element %zu not zero", i);
        }
        /* binomial keep count: sd sqrt(n p (1-p)) <= 512 for n = 2^20; 6 sd */
        double sd = sqrt((double)n * p * (1 - p));
        cr_expect_lt(fabs((double)kept - (1 - p) * (double)n), 6 * sd, "p=%g: kept %zu of %zu", p, kept, n);
        /* the same mask on one thread */
        set_threads(1);
        dropout_mask(mask1, n, p, 9, 3);
        set_threads(2);
        cr_assert(memcmp(mask, mask1, n) == 0, "mask depends on the thread count");
        /* backward: dx += dout * mask / (1 - p) */
        for (size_t i = 0; i < n; i++) dx[i] = 1.0f;
        dropout_backward(dx, dout, mask, n, p);
        for (size_t i = 0; i < n; i += 97)
            cr_assert_eq(dx[i], mask[i] ? 1.0f + dout[i] * (1.0f / (1.0f - p)) : 1.0f, "backward at %zu", i);
    }
    /* in place */
    memcpy(y, x, sizeof(float) * n);
    dropout_forward(y, mask1, y, n, 0.5f, 9, 3);
    dropout_forward(dx, mask, x, n, 0.5f, 9, 3);
    cr_assert(memcmp(y, dx, sizeof(float) * n) == 0, "in-place dropout differs");
    free(x);
    free(y);
    free(dx);
    free(dout);
    free(mask);
    free(mask1);
}

/* ---- ReLU and the feed-forward block ---- */

Test(layers, relu) {
    float x[6] = {-2, -0.0f, 0, 1e-30f, 3, -1e-30f}, y[6], d[6] = {1, 1, 1, 1, 1, 1}, dx[6] = {0};
    memcpy(y, x, sizeof x);
    relu_forward(y, 6);
    float want[6] = {0, 0, 0, 1e-30f, 3, 0};
    for (int i = 0; i < 6; i++) cr_assert_eq(y[i], want[i]);
    relu_backward(dx, d, y, 6);
    float wd[6] = {0, 0, 0, 1, 1, 0};
    for (int i = 0; i < 6; i++) cr_assert_eq(dx[i], wd[i]);
}

/* gate_act against the definitions in double: log(sigmoid(z)) / 16 and sigmoid(z), and
 * their derivatives by central differences of those (step 1e-5: truncation ~1e-11).
 * Float evaluation: values within 1e-6 relative (measured <= 2e-7). The derivatives
 * are computed from y, as backward has only y: sigmoid's y (1 - y) inherits y's
 * absolute rounding (<= 6e-8 near 1), so its error is absolute, not relative, where
 * sigmoid saturates; hence 1e-6 relative plus 1.5e-7 absolute (of a derivative whose
 * largest value is 0.25). A wrong formula is off by 1e-2 or more. The far ends
 * (|z| = 40) check that nothing overflows: log sigmoid(-40) = -40 within rounding. */
static double logsig16(double z) { return -log1p(exp(-z)) / 16.0; }
static double sig(double z) { return 1.0 / (1.0 + exp(-z)); }

Test(layers, gate_activations) {
    const int n = 801;
    float z[801], y[801], d[801];
    for (int kind = 0; kind < 2; kind++) {
        double (*f)(double) = kind == GATE_ACT_SIGMOID ? sig : logsig16;
        for (int i = 0; i < n; i++) z[i] = y[i] = -40.0f + 0.1f * (float)i;
        gate_act_forward(y, (size_t)n, (gate_act)kind);
        for (int i = 0; i < n; i++) d[i] = 1.0f;
        gate_act_backward(d, y, (size_t)n, (gate_act)kind);
        for (int i = 0; i < n; i++) {
            const double zi = z[i], want = f(zi), dwant = (f(zi + 1e-5) - f(zi - 1e-5)) / 2e-5;
            cr_assert_leq(fabs(y[i] - want), 1e-6 * fabs(want) + 1e-30, "kind %d, z %g: %g vs %g", kind, zi, y[i], want);
            cr_assert_leq(fabs(d[i] - dwant), 1e-6 * fabs(dwant) + 1.5e-7, "kind %d, z %g: derivative %g vs %g", kind,
                          zi, d[i], dwant);
        }
    }
}

typedef struct {
    int BT, C, F;
    double *x, *w1, *b1, *w2, *b2, p;
    const uint8_t *mask;
} ffn_ctx;

static void ffn_ref(void *c_, double *out) {
    ffn_ctx *c = c_;
    ref_ffn(c->x, c->w1, c->b1, c->w2, c->b2, c->mask, c->p, c->BT, c->C, c->F, out);
}

static void ffn_case(int BT, int C, int F, float p, uint64_t seed) {
    size_t nx = (size_t)BT * C, nh = (size_t)BT * F;
    float *x = tu_normal(nx, seed, 1, 1.0), *w1 = tu_normal((size_t)F * C, seed, 2, 0.5);
    float *b1 = tu_normal((size_t)F, seed, 3, 0.5);
    float *w2 = tu_normal((size_t)C * F, seed, 4, 0.5), *b2 = tu_normal((size_t)C, seed, 5, 0.5);
    float *dout = tu_normal(nx, seed, 6, 1.0);
    float *out = tu_alloc_f(nx), *hidden = tu_alloc_f(nh), *dhidden = tu_alloc_f(nh);
    uint8_t *mask = p > 0 ? malloc(nh) : NULL;
    ffn_params fp = {w1, b1, w2, b2};
    ffn_forward(out, hidden, mask, x, &fp, BT, C, F, p, seed, 9, 0);
    ffn_ctx c = {BT, C, F, tu_to_double(x, nx), tu_to_double(w1, (size_t)F * C), tu_to_double(b1, (size_t)F),
                 tu_to_double(w2, (size_t)C * F), tu_to_double(b2, (size_t)C), p, mask};
    double *want = tu_alloc_d(nx);
    ffn_ref(&c, want);
    double e = fwd_err(out, want, nx);
    cr_expect_lt(e, FWD_TOL, "ffn forward p=%g: err %g", p, e);
    if (mask) {
        size_t dropped = 0;
        for (size_t i = 0; i < nh; i++) dropped += !mask[i];
        cr_expect_gt(dropped, 0, "dropout p=%g dropped nothing: the test has no teeth", p);
    }
    float *dx = tu_alloc_f(nx), *gw1 = tu_alloc_f((size_t)F * C), *gb1 = tu_alloc_f((size_t)F);
    float *gw2 = tu_alloc_f((size_t)C * F), *gb2 = tu_alloc_f((size_t)C);
    ffn_grads fg = {gw1, gb1, gw2, gb2};
    ffn_backward(dx, &fg, dhidden, dout, x, hidden, mask, &fp, BT, C, F, p);
    gcheck g = {0};
    gadd(&g, "x", c.x, nx, dx);
    gadd(&g, "w1", c.w1, (size_t)F * C, gw1);
    gadd(&g, "b1", c.b1, (size_t)F, gb1);
    gadd(&g, "w2", c.w2, (size_t)C * F, gw2);
    gadd(&g, "b2", c.b2, (size_t)C, gb2);
    double *wd = tu_to_double(dout, nx);
    check_grads(&g, ffn_ref, &c, wd, nx, BWD_TOL, p > 0 ? "ffn with dropout" : "ffn");
    free(wd);
    free(want);
    free(c.x);
    free(c.w1);
    free(c.b1);
    free(c.w2);
    free(c.b2);
    free(x);
    free(w1);
    free(b1);
    free(w2);
    free(b2);
    free(dout);
    free(out);
    free(hidden);
    free(dhidden);
    free(mask);
    free(dx);
    free(gw1);
    free(gb1);
    free(gw2);
    free(gb2);
}

Test(layers, ffn) {
    ffn_case(6, 5, 9, 0.0f, 61);
    ffn_case(6, 5, 9, 0.3f, 62);
    ffn_case(1, 1, 3, 0.0f, 63);
}

/* ---- cross-entropy ---- */

typedef struct {
    int BT, V;
    double *logits, *weights;
    const int *targets;
} ce_ctx;

static void ce_ref(void *c_, double *out) {
    ce_ctx *c = c_;
    out[0] = ref_cross_entropy(c->logits, c->targets, c->weights, c->BT, c->V);
}

Test(layers, cross_entropy) {
    int BT = 7, V = 5;
    int targets[7] = {2, -1, 4, 0, 99, 3, 1}; /* -1 and 99 sit at weight-0 positions */
    float weights[7] = {1, 0, 2, 0.5f, 0, 1, 3};
    float *logits = tu_normal((size_t)BT * V, 71, 1, 2.0), nll[7], *dlogits = tu_alloc_f((size_t)BT * V);
    /* make position 0 correct and position 2 wrong for sure */
    logits[0 * V + 2] = 10.0f;
    logits[2 * V + 4] = -10.0f;
    ce_stats st;
    cross_entropy_forward(&st, nll, logits, targets, weights, BT, V);
    ce_ctx c = {BT, V, tu_to_double(logits, (size_t)BT * V), tu_to_double(weights, (size_t)BT), targets};
    double want;
    ce_ref(&c, &want);
    /* float log-sum-exp of 5 terms per position, summed in double: measured 3e-8 */
    cr_expect_lt(fabs(st.loss - want) / want, 1e-6, "loss %g vs %g", st.loss, want);
    cr_expect_eq(st.weight_sum, 7.5);
    cr_expect_eq(st.counted, 5);
    long long correct = 0;
    for (int i = 0; i < BT; i++) {
        if (!(weights[i] > 0)) continue;
        int am = 0;
        for (int v = 1; v < V; v++)
            if (logits[i * V + v] > logits[i * V + am]) am = v;
        correct += am == targets[i];
    }
    cr_expect_eq(st.correct, correct);
    cr_expect_geq(st.correct, 1);
    cr_expect_leq(st.correct, 4);
    cross_entropy_backward(dlogits, logits, targets, weights, st.weight_sum, BT, V);
    for (int v = 0; v < V; v++) cr_expect_eq(dlogits[1 * V + v], 0.0f, "weight-0 position got a gradient");
    gcheck g = {0};
    gadd(&g, "logits", c.logits, (size_t)BT * V, dlogits);
    double one = 1.0;
    check_grads(&g, ce_ref, &c, &one, 1, BWD_TOL, "cross-entropy");
    /* all weights 0: loss 0, no gradient */
    float zeros[7] = {0};
    cross_entropy_forward(&st, nll, logits, targets, zeros, BT, V);
    cr_expect_eq(st.loss, 0.0);
    cr_expect_eq(st.counted, 0);
    memset(dlogits, 0, sizeof(float) * BT * V);
    cross_entropy_backward(dlogits, logits, targets, zeros, 0.0, BT, V);
    for (int i = 0; i < BT * V; i++) cr_expect_eq(dlogits[i], 0.0f);
    /* NULL weights = all ones */
    int t2[7] = {2, 1, 4, 0, 0, 3, 1};
    cross_entropy_forward(&st, nll, logits, t2, NULL, BT, V);
    double want2 = ref_cross_entropy(c.logits, t2, NULL, BT, V);
    cr_expect_lt(fabs(st.loss - want2) / want2, 1e-6);
    cr_expect_eq(st.counted, BT);
    free(c.logits);
    free(c.weights);
    free(logits);
    free(dlogits);
}

/* ---- attention block and encoder layer ---- */

/* Carves one layer's tensors into heap buffers: params, grads (same carving),
 * activations and scratch. */
typedef struct {
    enc_config ec;
    ref_model_cfg rc;
    int B, N;
    int lengths[4];
    bool has_lengths;
    attn *a;
    tf_table pt, at;
    float *pbuf, *gbuf;
    void *abuf;
    enc_params p, g;
    enc_acts act;
    enc_scratch ws;
    double *pd; /* double copy of the parameters */
} layer_setup;

static void *zalloc64(size_t bytes) {
    size_t n = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, n ? n : 64);
    memset(p, 0, n ? n : 64);
    return p;
}

static void layer_make(layer_setup *s, const char *variant, bool causal, bool pre_norm, float dropout,
                       const int *lengths, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->B = 2;
    s->N = 5;
    int C = 8, H = 2, F = 12;
    s->ec = (enc_config){C, H, F, dropout, pre_norm, causal, 0, 0, {0}};
    s->rc = (ref_model_cfg){5, C, H, 1, F, pre_norm, false, causal,
                            strstr(variant, "softmax") ? REF_ATTN_SOFTMAX : REF_ATTN_LINEAR_ELU, 0, 0, false, 0, 0, 0};
    if (lengths) {
        memcpy(s->lengths, lengths, sizeof(int) * (size_t)s->B);
        s->has_lengths = true;
    }
    attn_options o = {.variant = variant, .device = AB_DEV_CPU, .seed = 1};
    cr_assert_eq(attn_create(&o, &s->a), 0, "%s", attn_error());
    mha_dims d = {s->B, s->N, C, H, causal, NULL, AB_DEV_CPU, 0};
    attn_shape as = mha_shape(&d);
    size_t saved = attn_saved_bytes(s->a, &as);
    /* parameters and gradients */
    tf_table_init(&s->pt, sizeof(float), 1);
    tf_table_begin(&s->pt, NULL);
    enc_carve_params(&s->pt, &s->p, &s->ec);
    s->pbuf = zalloc64(s->pt.total * sizeof(float));
    s->gbuf = zalloc64(s->pt.total * sizeof(float));
    tf_table_begin(&s->pt, s->gbuf);
    enc_carve_params(&s->pt, &s->g, &s->ec);
    tf_table_begin(&s->pt, s->pbuf);
    enc_carve_params(&s->pt, &s->p, &s->ec);
    cr_assert_eq(s->pt.err, 0);
    /* activations and scratch */
    tf_table_init(&s->at, 1, 64);
    tf_table_begin(&s->at, NULL);
    enc_carve_acts(&s->at, &s->act, &s->ec, s->B, s->N, saved, dropout > 0);
    enc_carve_scratch(&s->at, &s->ws, &s->ec, s->B, s->N);
    s->abuf = zalloc64(s->at.total);
    tf_table_begin(&s->at, s->abuf);
    enc_carve_acts(&s->at, &s->act, &s->ec, s->B, s->N, saved, dropout > 0);
    enc_carve_scratch(&s->at, &s->ws, &s->ec, s->B, s->N);
    cr_assert_eq(s->at.err, 0);
    /* parameter values: weights N(0, 0.5), biases N(0, 0.5), LN gains 1 + N(0, 0.3) */
    tu_fill_normal(s->pbuf, s->pt.total, seed, 100, 0.5);
    fill_gain(s->p.ln1_g, (size_t)C, seed, 101, 0.3);
    fill_gain(s->p.ln2_g, (size_t)C, seed, 102, 0.3);
    s->pd = tu_to_double(s->pbuf, s->pt.total);
}

static void layer_free(layer_setup *s) {
    attn_destroy(s->a);
    tf_table_free(&s->pt);
    tf_table_free(&s->at);
    free(s->pbuf);
    free(s->gbuf);
    free(s->abuf);
    free(s->pd);
}

/* The double copy of a float parameter tensor. */
static double *pd_of(const layer_setup *s, const float *p) { return s->pd + (p - s->pbuf); }

static ref_layer_params ref_params_of(const layer_setup *s) {
    const enc_params *p = &s->p;
    ref_layer_params r = {pd_of(s, p->ln1_g), pd_of(s, p->ln1_b), pd_of(s, p->attn.wqkv), pd_of(s, p->attn.bqkv),
                          pd_of(s, p->attn.wo), pd_of(s, p->attn.bo), pd_of(s, p->ln2_g), pd_of(s, p->ln2_b),
                          pd_of(s, p->w1), pd_of(s, p->b1), pd_of(s, p->w2), pd_of(s, p->b2), NULL, NULL, NULL, NULL};
    return r;
}

/* Every parameter tensor of the layer (or only the attention block's) in g. */
static void add_param_grads(gcheck *g, layer_setup *s, bool attn_only) {
    for (int i = 0; i < s->pt.n; i++) {
        const tf_tensor *t = &s->pt.t[i];
        bool is_attn = strncmp(t->name, "attn.", 5) == 0;
        if (attn_only && !is_attn) continue;
        gadd(g, t->name, s->pd + t->offset, t->count, s->gbuf + t->offset);
    }
}

typedef struct {
    layer_setup *s;
    double *x;
    ref_masks masks;
    bool use_masks;
} layer_ctx;

static void mha_ref_fn(void *c_, double *out) {
    layer_ctx *c = c_;
    ref_layer_params rp = ref_params_of(c->s);
    ref_mha(&c->s->rc, &rp, c->x, c->s->B, c->s->N, c->s->has_lengths ? c->s->lengths : NULL, out);
}

static void enc_ref_fn(void *c_, double *out) {
    layer_ctx *c = c_;
    ref_layer_params rp = ref_params_of(c->s);
    ref_encoder_layer(&c->s->rc, &rp, c->x, c->s->B, c->s->N, c->s->has_lengths ? c->s->lengths : NULL,
                      c->use_masks ? &c->masks : NULL, out);
}

static void mha_case(const char *variant, bool causal, const int *lengths, uint64_t seed) {
    layer_setup s;
    layer_make(&s, variant, causal, false, 0.0f, lengths, seed);
    int C = s.ec.C;
    size_t n = (size_t)s.B * s.N * C;
    mha_dims d = {s.B, s.N, C, s.ec.H, causal, s.has_lengths ? s.lengths : NULL, AB_DEV_CPU, 0};
    float *x = tu_normal(n, seed, 1, 1.0), *out = tu_alloc_f(n), *dout = tu_normal(n, seed, 2, 1.0);
    float *dx = tu_alloc_f(n);
    cr_assert_eq(mha_forward(s.a, &d, NULL, out, x, &s.p.attn, &s.act.attn, &s.ws.attn), 0, "%s", attn_error());
    layer_ctx c = {&s, tu_to_double(x, n), {0}, false};
    double *want = tu_alloc_d(n);
    mha_ref_fn(&c, want);
    double e = fwd_err(out, want, n);
    cr_expect_lt(e, BLOCK_TOL, "mha %s causal=%d lengths=%d forward: err %g", variant, causal, lengths != NULL, e);
    cr_assert_eq(mha_backward(s.a, &d, dx, &s.g.attn, dout, x, &s.p.attn, &s.act.attn, &s.ws.attn), 0, "%s",
                 attn_error());
    gcheck g = {0};
    gadd(&g, "x", c.x, n, dx);
    add_param_grads(&g, &s, true);
    cr_assert_eq(g.nt, 5);
    double *wd = tu_to_double(dout, n);
    char what[96];
    snprintf(what, sizeof what, "mha %s causal=%d lengths=%d", variant, causal, lengths != NULL);
    check_grads(&g, mha_ref_fn, &c, wd, n, BLOCK_TOL, what);
    free(wd);
    free(want);
    free(c.x);
    free(x);
    free(out);
    free(dout);
    free(dx);
    layer_free(&s);
}

Test(blocks, attention_softmax) {
    int lens[2] = {5, 3};
    mha_case("softmax", true, NULL, 81);
    mha_case("softmax", false, NULL, 82);
    mha_case("softmax", true, lens, 83);
    mha_case("softmax", false, lens, 84);
}

Test(blocks, attention_linear) {
    int lens[2] = {4, 5};
    mha_case("linear", true, NULL, 85);
    mha_case("linear", false, lens, 86);
    mha_case("stateful-softmax", true, lens, 87);
}

static void enc_case(const char *variant, bool causal, bool pre_norm, float dropout, const int *lengths,
                     uint64_t seed) {
    layer_setup s;
    layer_make(&s, variant, causal, pre_norm, dropout, lengths, seed);
    int C = s.ec.C;
    size_t n = (size_t)s.B * s.N * C;
    mha_dims d = {s.B, s.N, C, s.ec.H, causal, s.has_lengths ? s.lengths : NULL, AB_DEV_CPU, 0};
    float *x = tu_normal(n, seed, 1, 1.0), *dout = tu_normal(n, seed, 2, 1.0), *dx = tu_alloc_f(n);
    bool train = dropout > 0;
    cr_assert_eq(enc_forward(s.a, &s.ec, &d, NULL, x, &s.p, &s.act, &s.ws, train, seed, 500), 0, "%s", attn_error());
    const float *out = enc_output(&s.ec, &s.act);
    layer_ctx c = {&s, tu_to_double(x, n), {s.act.mask_attn, s.act.mask_hidden, s.act.mask_ffn, dropout}, train};
    double *want = tu_alloc_d(n);
    enc_ref_fn(&c, want);
    char what[128];
    snprintf(what, sizeof what, "encoder %s causal=%d pre_norm=%d dropout=%g lengths=%d", variant, causal, pre_norm,
             dropout, lengths != NULL);
    double e = fwd_err(out, want, n);
    cr_expect_lt(e, BLOCK_TOL, "%s forward: err %g", what, e);
    cr_assert_eq(enc_backward(s.a, &s.ec, &d, dx, &s.g, dout, x, &s.p, &s.act, &s.ws, train), 0, "%s", attn_error());
    gcheck g = {0};
    gadd(&g, "x", c.x, n, dx);
    add_param_grads(&g, &s, false);
    cr_assert_eq(g.nt, 13);
    double *wd = tu_to_double(dout, n);
    check_grads(&g, enc_ref_fn, &c, wd, n, BLOCK_TOL, what);
    free(wd);
    free(want);
    free(c.x);
    free(x);
    free(dout);
    free(dx);
    layer_free(&s);
}

Test(blocks, encoder_post_norm) {
    int lens[2] = {5, 2};
    enc_case("softmax", true, false, 0.0f, NULL, 91);
    enc_case("linear", true, false, 0.0f, lens, 92);
    enc_case("softmax", false, false, 0.0f, lens, 93);
}

Test(blocks, encoder_pre_norm) {
    int lens[2] = {3, 5};
    enc_case("softmax", true, true, 0.0f, NULL, 94);
    enc_case("linear", true, true, 0.0f, lens, 95);
}

/* Backward through the three dropout sites with the masks forward drew. */
Test(blocks, encoder_dropout) {
    enc_case("softmax", true, false, 0.25f, NULL, 96);
    enc_case("linear", true, true, 0.25f, NULL, 97);
}
