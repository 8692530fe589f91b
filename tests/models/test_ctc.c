/* models/ctc on the CPU: the CTC loss and its gradient against the double reference
 * (tests/reference/ref_ctc.c, itself checked against the sum over every path and its
 * gradient against central finite differences) on random shapes with repeated labels,
 * label sequences that barely fit, one frame, no frames, empty label sequences,
 * padding (never read, zero gradient), weights and rows of weight 0; impossible rows
 * (an infinite loss, a zero gradient, never NaN); huge logits; the same bits whatever
 * the thread count; against PyTorch's ctc_loss (the stored fixture
 * tests/fixtures/ctc-torch.json, made by make_ctc_torch.py); best-path decoding, the
 * edit distance and the phone error rate on hand-made cases and against the
 * reference; the workspace size and refused dimensions.
 *
 * Error figures: nll relative per row; gradients tu_rel_err (max abs error over the
 * batch / the batch's max abs). TEST_VERBOSE=1 prints the measured errors. */
#include <criterion/criterion.h>

#include "ctc.h"
#include "error.h"
#include "memory.h"
#include "ref_ctc.h"
#include "rng.h"
#include "test_util.h"

#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Why the tolerances are what they are. The library computes in double from the same
 * float logits as the reference; it differs from it by the rounding of two double
 * methods (log space against rescaled probabilities, ~1e-15 relative) and by the
 * final rounding of nll and of the gradient to float (2^-24 = 6e-8 relative each).
 * Measured: nll <= 5.4e-8 relative, gradients <= 4.9e-8 of the batch's largest entry.
 * 1e-6 (nll, in expect_reference) and GRAD_TOL leave a 15x margin over the float
 * rounding, while a missing path (a skip over a repeat, one start state) moves the nll
 * and the gradient by 1e-2 and more. */
#define GRAD_TOL 1e-6

/* ---- a batch ---- */

typedef struct {
    ctc_dims d;
    float *logits, *weights, *nll, *grad;
    int *lengths, *labels, *counts;
    void *ws;
} cbatch;

/* Zeroed logits, weights 1, lengths N, counts 0, label slots 1000 (out of range: a
 * read past a row's count shows), grad 0, nll NaN. */
static void cb_init(cbatch *c, int B, int N, int K, int S) {
    memset(c, 0, sizeof *c);
    c->d = (ctc_dims){B, N, K, S};
    cr_assert_eq(ctc_dims_check(&c->d), 0, "%s", ab_error());
    const size_t n = (size_t)B * N * K;
    c->logits = tu_alloc_f(n);
    c->grad = tu_alloc_f(n);
    c->weights = tu_alloc_f(B);
    c->nll = tu_alloc_f(B);
    c->lengths = calloc((size_t)B, sizeof(int));
    c->counts = calloc((size_t)B, sizeof(int));
    c->labels = malloc(sizeof(int) * (size_t)(B * S > 0 ? B * S : 1));
    for (int i = 0; i < B * S; i++) c->labels[i] = 1000;
    for (int b = 0; b < B; b++) {
        c->weights[b] = 1.0f;
        c->lengths[b] = N;
        c->nll[b] = NAN;
    }
    c->ws = ab_alloc(ctc_ws_bytes(&c->d));
    cr_assert_not_null(c->ws);
    memset(c->ws, 0xff, ctc_ws_bytes(&c->d)); /* NaN: a read before a write shows */
}

static void cb_free(cbatch *c) {
    free(c->logits), free(c->grad), free(c->weights), free(c->nll);
    free(c->lengths), free(c->counts), free(c->labels);
    ab_free(c->ws);
}

/* Row b: T frames of normal(0, sd) logits from (seed, stream b), NaN past T (padding
 * is never read), and its labels. */
static void cb_row(cbatch *c, int b, int T, const int *lab, int L, uint64_t seed, double sd) {
    const int N = c->d.N, K = c->d.K;
    cr_assert(T <= N && L <= c->d.S);
    float *x = c->logits + (size_t)b * N * K;
    tu_fill_normal(x, (size_t)N * K, seed, 100 + (uint64_t)b, sd);
    for (size_t i = (size_t)T * K; i < (size_t)N * K; i++) x[i] = NAN;
    c->lengths[b] = T;
    c->counts[b] = L;
    for (int j = 0; j < L; j++) c->labels[b * c->d.S + j] = lab[j];
}

static void cb_run(cbatch *c, ce_stats *st) {
    memset(c->grad, 0, sizeof(float) * (size_t)c->d.B * c->d.N * c->d.K);
    ctc_forward(st, c->nll, &c->d, c->logits, c->lengths, c->labels, c->counts, c->weights, c->ws);
    ctc_backward(c->grad, &c->d, c->logits, c->lengths, c->labels, c->counts, c->weights, st->weight_sum, c->ws);
}

/* The reference of row b: nll and, with g non-NULL, the gradient of nll (N, K) (zero
 * past the row's frames). */
static double ref_row(const cbatch *c, int b, double *g) {
    const int N = c->d.N, K = c->d.K, T = c->lengths[b];
    double *x = tu_to_double(c->logits + (size_t)b * N * K, (size_t)T * K);
    double *rg = g ? tu_alloc_d((size_t)N * K) : NULL;
    double v = ref_ctc_nll(x, T, K, c->labels + (size_t)b * c->d.S, c->counts[b], rg);
    if (g) memcpy(g, rg, sizeof(double) * (size_t)N * K);
    free(x);
    free(rg);
    return v;
}

/* The batch against the reference: each row's nll, the statistics, and the gradient of
 * the weighted mean; padding frames and unscored rows get exactly 0. Returns the
 * worst nll and gradient errors. */
static void expect_reference(cbatch *c, const ce_stats *st, const char *what, double *nll_err, double *grad_err) {
    const int B = c->d.B, N = c->d.N, K = c->d.K;
    double *want = tu_alloc_d((size_t)B * N * K), *g = tu_alloc_d((size_t)N * K);
    double sw = 0, swl = 0;
    long long counted = 0, correct = 0;
    *nll_err = 0;
    for (int b = 0; b < B; b++) {
        const double w = c->weights[b];
        if (!(w > 0)) {
            cr_expect_eq(c->nll[b], 0.0f, "%s: row %d of weight 0 has nll %g", what, b, (double)c->nll[b]);
            continue;
        }
        const double v = ref_row(c, b, g);
        counted++;
        sw += w;
        swl += w * v;
        double *xd = tu_to_double(c->logits + (size_t)b * N * K, (size_t)c->lengths[b] * K);
        int *path = malloc(sizeof(int) * (size_t)(c->lengths[b] + 1));
        int n = ref_ctc_best_path(xd, c->lengths[b], K, path);
        correct += n == c->counts[b] && memcmp(path, c->labels + (size_t)b * c->d.S, sizeof(int) * (size_t)n) == 0;
        free(path), free(xd);
        if (isinf(v)) {
            cr_expect(isinf(c->nll[b]) && c->nll[b] > 0, "%s: row %d is impossible, nll %g", what, b,
                      (double)c->nll[b]);
            continue;
        }
        const double e = fabs(c->nll[b] - v) / fmax(fabs(v), 1e-30);
        *nll_err = fmax(*nll_err, e);
        cr_expect(e < 1e-6, "%s: row %d nll %.9g vs reference %.9g", what, b, (double)c->nll[b], v);
        for (size_t i = 0; i < (size_t)N * K; i++) g[i] *= w;
        memcpy(want + (size_t)b * N * K, g, sizeof(double) * (size_t)N * K);
    }
    for (size_t i = 0; i < (size_t)B * N * K; i++) want[i] = sw > 0 ? want[i] / sw : 0;
    cr_expect_eq(st->counted, counted, "%s: counted %lld of %lld", what, st->counted, counted);
    cr_expect_eq(st->correct, correct, "%s: exact best paths %lld, the reference %lld", what, st->correct, correct);
    cr_expect_eq(st->weight_sum, sw, "%s: weight sum", what);
    const double loss = sw > 0 ? swl / sw : 0;
    if (isinf(loss)) cr_expect(isinf(st->loss) && st->loss > 0, "%s: loss %g", what, st->loss);
    else
        cr_expect(fabs(st->loss - loss) <= 1e-12 * fmax(fabs(loss), 1e-30), "%s: loss %.17g vs reference %.17g", what,
                  st->loss, loss);
    *grad_err = tu_rel_err(c->grad, want, (size_t)B * N * K, 1e-30);
    cr_expect(*grad_err < GRAD_TOL, "%s: gradient err %g", what, *grad_err);
    /* padding frames and rows without a gradient: exactly zero */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < N; t++)
            for (int k = 0; k < K; k++) {
                const float v = c->grad[((size_t)b * N + t) * K + k];
                if (t >= c->lengths[b] || !(c->weights[b] > 0) || isinf(c->nll[b]))
                    cr_expect_eq(v, 0.0f, "%s: gradient %g at row %d frame %d output %d (padding or unscored)", what,
                                 (double)v, b, t, k);
                cr_expect(isfinite(v), "%s: gradient not finite", what);
            }
    free(want), free(g);
}

/* ---- the reference against the sum over every path, and its gradient ---- */

/* The scaled recursion against the sum over all K^T paths (tiny problems): both in
 * double, differing by the rounding of sums of at most 4^6 products (~1e-15
 * relative); 1e-12 leaves a wide margin, while a missing or extra transition changes
 * the sum by a whole path's probability (1e-3 and more here). */
Test(reference, recursion_equals_the_sum_over_all_paths) {
    int cases = 0, impossible = 0;
    double worst = 0;
    for (uint64_t seed = 1; seed <= 60; seed++) {
        const int T = 1 + (int)(seed % 6), K = 2 + (int)(seed % 3);
        int lab[4], L = (int)((seed / 3) % 5);
        if (L > 4) L = 4;
        tu_fill_int(lab, 4, seed, 1, 0, K - 2);
        if (seed % 4 == 0 && L >= 2) lab[1] = lab[0]; /* a repeat */
        double *x = tu_alloc_d((size_t)T * K);
        for (int i = 0; i < T * K; i++) x[i] = 1.5 * ab_rng_normal(seed, 2, (uint64_t)i);
        const double brute = ref_ctc_nll_brute(x, T, K, lab, L), rec = ref_ctc_nll(x, T, K, lab, L, NULL);
        if (isinf(brute)) {
            impossible++;
            cr_expect(isinf(rec), "seed %llu: brute force impossible, recursion %g", (unsigned long long)seed, rec);
        } else {
            const double e = fabs(rec - brute) / fabs(brute);
            worst = fmax(worst, e);
            cr_expect(e < 1e-12, "seed %llu (T %d, K %d, L %d): %.17g vs %.17g", (unsigned long long)seed, T, K, L, rec,
                      brute);
        }
        cases++;
        free(x);
    }
    if (tu_verbose()) fprintf(stderr, "reference vs brute force: %d cases (%d impossible), worst %.3g\n", cases,
                           impossible, worst);
    cr_expect(impossible > 0 && impossible < cases, "%d impossible of %d: both kinds must be tested", impossible, cases);
    /* no frames: only the empty sequence */
    int one = 0;
    cr_expect_eq(ref_ctc_nll_brute(NULL, 0, 3, &one, 0), 0.0);
    cr_expect(isinf(ref_ctc_nll_brute(NULL, 0, 3, &one, 1)));
    cr_expect_eq(ref_ctc_nll(NULL, 0, 3, &one, 0, NULL), 0.0);
}

typedef struct {
    int T, K, L;
    const int *lab;
    double *x;
} ref_fd_ctx;

static void ref_fd_fn(void *c_, double *out) {
    ref_fd_ctx *c = c_;
    out[0] = ref_ctc_nll(c->x, c->T, c->K, c->lab, c->L, NULL);
}

/* The reference's gradient against central differences of its nll (h = 1e-5):
 * truncation h^2 |f'''| / 6 ~ 1e-11 and rounding 1e-16 |nll| / h ~ 1e-10; measured
 * <= 2.5e-10 of the largest entry; 1e-8 leaves 40x, while a wrong term is 1e-3 and
 * more. */
Test(reference, gradient_matches_finite_differences) {
    const int cases[][3] = {{6, 4, 3}, {7, 3, 3}, {5, 5, 0}, {1, 3, 1}, {9, 6, 5}};
    for (int c = 0; c < 5; c++) {
        const int T = cases[c][0], K = cases[c][1], L = cases[c][2];
        int lab[5];
        tu_fill_int(lab, 5, 40 + c, 1, 0, K - 2);
        if (L >= 2) lab[L - 1] = lab[L - 2]; /* a repeat */
        ref_fd_ctx ctx = {T, K, L, lab, tu_alloc_d((size_t)T * K)};
        for (int i = 0; i < T * K; i++) ctx.x[i] = ab_rng_normal(40 + c, 2, (uint64_t)i);
        double *g = tu_alloc_d((size_t)T * K), *fd = tu_alloc_d((size_t)T * K), one = 1.0;
        const double v = ref_ctc_nll(ctx.x, T, K, lab, L, g);
        cr_assert(isfinite(v), "case %d: nll %g", c, v);
        tu_fd_grad(ref_fd_fn, &ctx, ctx.x, (size_t)T * K, &one, 1, 1e-5, fd);
        double mx = tu_max_abs(fd, (size_t)T * K), e = 0;
        for (int i = 0; i < T * K; i++) e = fmax(e, fabs(g[i] - fd[i]));
        if (tu_verbose()) fprintf(stderr, "reference gradient T %d K %d L %d: err %.3g of %.3g\n", T, K, L, e, mx);
        cr_expect(e < 1e-8 * mx, "case %d: gradient err %g (max %g)", c, e, mx);
        /* each frame's gradient sums to 0: softmax and occupancy both sum to 1 */
        for (int t = 0; t < T; t++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += g[t * K + k];
            cr_expect(fabs(s) < 1e-12, "case %d: frame %d gradient sums to %g", c, t, s);
        }
        free(ctx.x), free(g), free(fd);
    }
}

/* ---- the library against the reference ---- */

Test(ctc, hand_picked_rows_match_the_reference) {
    /* B = 7 rows of up to N = 9 frames, K = 5 outputs (4 labels), S = 4 slots */
    cbatch c;
    cb_init(&c, 7, 9, 5, 4);
    const int plain[4] = {0, 1, 2, 3}, rep[3] = {2, 2, 1}, tight[4] = {1, 1, 3, 3}, one = 2;
    cb_row(&c, 0, 9, plain, 4, 5, 1.5);
    cb_row(&c, 1, 7, rep, 3, 5, 1.5);   /* a repeat: a blank between the 2s */
    cb_row(&c, 2, 6, tight, 4, 5, 1.5); /* barely fits: 4 labels + 2 repeats = 6 frames */
    cb_row(&c, 3, 1, &one, 1, 5, 1.5);  /* one frame, one label */
    cb_row(&c, 4, 1, NULL, 0, 5, 1.5);  /* one frame, no label */
    cb_row(&c, 5, 0, NULL, 0, 5, 1.5);  /* no frames, no labels: nll 0 */
    cb_row(&c, 6, 5, NULL, 0, 5, 1.5);  /* no labels: every frame blank */
    c.weights[1] = 0.5f, c.weights[2] = 2.0f, c.weights[6] = 0.25f;
    ce_stats st;
    cb_run(&c, &st);
    double ne, ge;
    expect_reference(&c, &st, "hand-picked rows", &ne, &ge);
    cr_expect_eq(c.nll[5], 0.0f);
    if (tu_verbose()) fprintf(stderr, "hand-picked rows: nll err %.3g, gradient err %.3g\n", ne, ge);
    /* a label beyond a row's count is never read, and a row of weight 0 not at all */
    c.labels[1 * 4 + 3] = -77;
    c.weights[3] = 0.0f;
    c.labels[3 * 4] = 999; /* out of range: it would be read as an output index */
    cb_run(&c, &st);
    expect_reference(&c, &st, "hand-picked rows, row 3 unscored", &ne, &ge);
    cb_free(&c);
}

/* Random shapes: 1..6 rows of 1..12 frames, 2..7 outputs, 0..6 label slots; each
 * row's frames (0 included), labels (with repeats, more likely with few outputs) and
 * weight (0 now and then) drawn, about one row in four made to fit exactly. */
Test(ctc, random_shapes_match_the_reference) {
    double ne = 0, ge = 0;
    int rows = 0, tight = 0, empty = 0, repeats = 0;
    for (uint64_t seed = 1; seed <= 40; seed++) {
        int v[4];
        tu_fill_int(v, 4, seed, 1, 0, 1 << 20);
        const int B = 1 + v[0] % 6, N = 1 + v[1] % 12, K = 2 + v[2] % 6, S = v[3] % 7;
        cbatch c;
        cb_init(&c, B, N, K, S);
        for (int b = 0; b < B; b++) {
            int r[3], lab[7];
            tu_fill_int(r, 3, seed, 10 + b, 0, 1 << 20);
            tu_fill_int(lab, 7, seed, 20 + b, 0, K - 2);
            int L = S ? r[0] % (S + 1) : 0;
            while (L > 0 && ctc_min_frames(lab, L) > N) L--;
            const int need = ctc_min_frames(lab, L);
            const int T = r[1] % 4 == 0 ? need : need + r[1] % (N - need + 1);
            tight += T == need && L > 0;
            empty += L == 0;
            repeats += need > L;
            cb_row(&c, b, T, lab, L, seed, 2.0);
            c.weights[b] = r[2] % 5 == 0 ? 0.0f : (float)(r[2] % 4) * 0.5f + 0.5f;
            rows++;
        }
        ce_stats st;
        cb_run(&c, &st);
        double a, g;
        char what[64];
        snprintf(what, sizeof what, "seed %llu (B %d N %d K %d S %d)", (unsigned long long)seed, B, N, K, S);
        expect_reference(&c, &st, what, &a, &g);
        ne = fmax(ne, a), ge = fmax(ge, g);
        cb_free(&c);
    }
    if (tu_verbose())
        fprintf(stderr, "random shapes: %d rows (%d fit exactly, %d empty, %d with repeats): nll err %.3g, gradient err %.3g\n",
                rows, tight, empty, repeats, ne, ge);
    cr_expect(tight > 5 && empty > 5 && repeats > 5, "cases: %d tight, %d empty, %d with repeats", tight, empty, repeats);
}

typedef struct {
    cbatch *c;
    double *x; /* the logits in double, varied by the differences */
} fd_ctx;

/* The reference's weighted mean nll of the batch at logits x. */
static void batch_loss_fn(void *c_, double *out) {
    fd_ctx *f = c_;
    const cbatch *c = f->c;
    const int N = c->d.N, K = c->d.K;
    double sw = 0, swl = 0;
    for (int b = 0; b < c->d.B; b++) {
        if (!(c->weights[b] > 0)) continue;
        sw += c->weights[b];
        swl += c->weights[b] * ref_ctc_nll(f->x + (size_t)b * N * K, c->lengths[b], K, c->labels + (size_t)b * c->d.S,
                                           c->counts[b], NULL);
    }
    out[0] = swl / sw;
}

/* The float gradient against central differences of the reference loss (h = 1e-5, so
 * the differences are accurate to ~1e-10): the float rounding of the gradient
 * dominates (measured 4.8e-8 of the largest entry); GRAD_TOL. Padding entries have a
 * zero difference (the reference does not read them) and a zero gradient. */
Test(ctc, gradient_matches_finite_differences_of_the_reference) {
    cbatch c;
    cb_init(&c, 3, 7, 4, 4);
    const int a[4] = {1, 1, 0, 2}, b[2] = {2, 2}, d[3] = {0, 1, 0};
    cb_row(&c, 0, 7, a, 4, 8, 1.0);
    cb_row(&c, 1, 3, b, 2, 8, 1.0);
    cb_row(&c, 2, 5, d, 3, 8, 1.0);
    c.weights[0] = 0.75f, c.weights[2] = 1.5f;
    ce_stats st;
    cb_run(&c, &st);
    const size_t n = (size_t)3 * 7 * 4;
    fd_ctx f = {&c, tu_to_double(c.logits, n)};
    for (size_t i = 0; i < n; i++)
        if (isnan(f.x[i])) f.x[i] = 0; /* padding: set, but never read by the reference */
    double *fd = tu_alloc_d(n), one = 1.0;
    tu_fd_grad(batch_loss_fn, &f, f.x, n, &one, 1, 1e-5, fd);
    const double e = tu_rel_err(c.grad, fd, n, 1e-30);
    if (tu_verbose()) fprintf(stderr, "float gradient vs differences: %.3g\n", e);
    cr_expect(e < GRAD_TOL, "gradient vs finite differences: err %g", e);
    free(fd), free(f.x);
    cb_free(&c);
}

/* An impossible row (L + repeats > T): nll +inf, a zero gradient, never NaN; the
 * others are as without it, scaled by the weight sum that includes it. */
Test(ctc, impossible_rows_are_infinite_never_nan) {
    cbatch c;
    cb_init(&c, 3, 4, 3, 3);
    const int ok[2] = {0, 1}, bad[3] = {1, 1, 1}, bad2[2] = {0, 0};
    cb_row(&c, 0, 4, ok, 2, 9, 1.0);
    cb_row(&c, 1, 3, bad, 3, 9, 1.0);  /* needs 5 frames */
    cb_row(&c, 2, 2, bad2, 2, 9, 1.0); /* needs 3 frames */
    cr_expect_eq(ctc_min_frames(bad, 3), 5);
    cr_expect_eq(ctc_min_frames(bad2, 2), 3);
    ce_stats st;
    cb_run(&c, &st);
    double ne, ge;
    expect_reference(&c, &st, "impossible rows", &ne, &ge);
    cr_expect(isinf(c.nll[1]) && isinf(c.nll[2]) && isfinite(c.nll[0]));
    cr_expect(isinf(st.loss) && st.loss > 0, "loss %g", st.loss);
    cr_expect_eq(st.counted, 3);
    cr_expect_eq(st.weight_sum, 3.0);
    cb_free(&c);
}

/* Huge logits (scale 1e4: probabilities down to exp(-1e5) in a frame, far below
 * double's range) stay finite in log space: nll >= 0 and finite, each frame's
 * gradient in [-1, 1] summing to 0 (softmax and occupancy each sum to 1, to 1e-6 in
 * float). Labels equal to the best path cost at most that path's -log probability
 * (it is one of their alignments); at scale 30 (within double's range) against the
 * reference as everywhere. */
Test(ctc, huge_logits_stay_finite) {
    const double scales[3] = {30.0, 1e3, 1e4};
    for (int si = 0; si < 3; si++) {
        cbatch c;
        cb_init(&c, 2, 10, 4, 10);
        cb_row(&c, 0, 10, NULL, 0, 11, scales[si]);
        cb_row(&c, 1, 10, NULL, 0, 11, scales[si]);
        /* row 0: its own best path; row 1: a fixed sequence */
        int path[10], n = ctc_best_path(c.logits, 10, 4, path);
        memcpy(c.labels, path, sizeof(int) * (size_t)n);
        c.counts[0] = n;
        const int fixed[3] = {0, 2, 1};
        memcpy(c.labels + 10, fixed, sizeof fixed);
        c.counts[1] = 3;
        ce_stats st;
        cb_run(&c, &st);
        for (int b = 0; b < 2; b++) cr_expect(isfinite(c.nll[b]) && c.nll[b] >= 0, "scale %g row %d nll %g", scales[si], b,
                                              (double)c.nll[b]);
        /* the best path is one alignment of its own labels: nll <= its -log probability */
        double bound = 0;
        for (int t = 0; t < 10; t++) {
            double mx = -INFINITY, s = 0;
            for (int k = 0; k < 4; k++) mx = fmax(mx, c.logits[t * 4 + k]);
            for (int k = 0; k < 4; k++) s += exp(c.logits[t * 4 + k] - mx);
            bound += log(s);
        }
        cr_expect(c.nll[0] <= bound * (1 + 1e-6) + 1e-6, "scale %g: the best path's own labels cost %g > %g",
                  scales[si], (double)c.nll[0], bound);
        cr_expect_eq(st.correct, 1, "scale %g: row 0 is its best path", scales[si]);
        for (int t = 0; t < 20; t++) {
            double s = 0;
            for (int k = 0; k < 4; k++) {
                const double g = c.grad[t * 4 + k] * st.weight_sum; /* the row's own gradient, weight 1 */
                cr_expect(isfinite(g) && g >= -1 - 1e-6 && g <= 1 + 1e-6, "scale %g: gradient %g", scales[si], g);
                s += g;
            }
            cr_expect(fabs(s) < 1e-6, "scale %g: frame %d's gradient sums to %g", scales[si], t, s);
        }
        if (si == 0) {
            double ne, ge;
            expect_reference(&c, &st, "scale 30", &ne, &ge);
        }
        cb_free(&c);
    }
}

/* Rows are computed independently and summed in order: the same bits on 1 and 2
 * threads. */
Test(ctc, same_bits_on_any_thread_count) {
    float *nll[2], *grad[2];
    ce_stats st[2];
    for (int r = 0; r < 2; r++) {
        omp_set_num_threads(r + 1);
        cbatch c;
        cb_init(&c, 9, 11, 6, 5);
        for (int b = 0; b < 9; b++) {
            int lab[5];
            tu_fill_int(lab, 5, 13, (uint64_t)b, 0, 4);
            int L = b % 6;
            while (ctc_min_frames(lab, L) > 11 - b) L--;
            cb_row(&c, b, 11 - b, lab, L, 13, 1.0);
        }
        cb_run(&c, &st[r]);
        nll[r] = malloc(sizeof(float) * 9);
        grad[r] = malloc(sizeof(float) * 9 * 11 * 6);
        memcpy(nll[r], c.nll, sizeof(float) * 9);
        memcpy(grad[r], c.grad, sizeof(float) * 9 * 11 * 6);
        cb_free(&c);
    }
    omp_set_num_threads(2);
    cr_expect(memcmp(nll[0], nll[1], sizeof(float) * 9) == 0, "nll differs between 1 and 2 threads");
    cr_expect(memcmp(grad[0], grad[1], sizeof(float) * 9 * 11 * 6) == 0, "gradient differs between 1 and 2 threads");
    cr_expect(memcmp(&st[0].loss, &st[1].loss, sizeof(double)) == 0);
    for (int r = 0; r < 2; r++) free(nll[r]), free(grad[r]);
}

/* ---- against PyTorch (tests/fixtures/ctc-torch.json) ---- */

/* The stored torch results (float64 from the same float32 logits): the loss sums in
 * double agree to ~1e-15 (measured: equal; 1e-12 allowed); each row's nll is our
 * double rounded to float (2^-24 = 6e-8 relative: 1e-7 allowed); gradients: float
 * rounding of each entry (measured 5.4e-8 of the largest; GRAD_TOL). */
Test(ctc, matches_pytorch_ctc_loss) {
    json_error_t je;
    json_t *doc = json_load_file(ATTNBENCH_SOURCE_DIR "/tests/fixtures/ctc-torch.json", 0, &je);
    cr_assert_not_null(doc, "ctc-torch.json: %s", je.text);
    cr_assert_eq(json_integer_value(json_object_get(doc, "blank")), CTC_BLANK);
    size_t ci;
    json_t *cj;
    int n_cases = 0, n_inf = 0;
    json_array_foreach(json_object_get(doc, "cases"), ci, cj) {
        const char *name = json_string_value(json_object_get(cj, "name"));
        const int B = (int)json_integer_value(json_object_get(cj, "B")), N = (int)json_integer_value(json_object_get(cj, "N"));
        const int K = (int)json_integer_value(json_object_get(cj, "K")), S = (int)json_integer_value(json_object_get(cj, "S"));
        cbatch c;
        cb_init(&c, B, N, K, S);
        json_t *lg = json_object_get(cj, "logits"), *gr = json_object_get(cj, "grad"), *nl = json_object_get(cj, "nll");
        cr_assert_eq(json_array_size(lg), (size_t)B * N * K);
        for (size_t i = 0; i < (size_t)B * N * K; i++) c.logits[i] = (float)json_number_value(json_array_get(lg, i));
        for (int b = 0; b < B; b++) {
            c.lengths[b] = (int)json_integer_value(json_array_get(json_object_get(cj, "lengths"), (size_t)b));
            c.counts[b] = (int)json_integer_value(json_array_get(json_object_get(cj, "counts"), (size_t)b));
            c.weights[b] = (float)json_number_value(json_array_get(json_object_get(cj, "weights"), (size_t)b));
            for (int j = 0; j < S; j++) {
                int v = (int)json_integer_value(json_array_get(json_object_get(cj, "labels"), (size_t)(b * S + j)));
                c.labels[b * S + j] = j < c.counts[b] ? v : 1000;
            }
            for (size_t i = (size_t)c.lengths[b] * K; i < (size_t)N * K; i++) c.logits[(size_t)b * N * K + i] = NAN;
        }
        ce_stats st;
        cb_run(&c, &st);
        double sw = 0, swl = 0, *want = tu_alloc_d((size_t)B * N * K);
        for (int b = 0; b < B; b++) {
            json_t *v = json_array_get(nl, (size_t)b);
            if (!(c.weights[b] > 0)) continue;
            const double t = json_is_null(v) ? INFINITY : json_number_value(v);
            n_inf += isinf(t);
            sw += c.weights[b];
            swl += c.weights[b] * t;
            if (isinf(t)) cr_expect(isinf(c.nll[b]), "%s: row %d: torch inf, ours %g", name, b, (double)c.nll[b]);
            else
                cr_expect(fabs(c.nll[b] - t) < 1e-7 * t, "%s: row %d: nll %.9g, torch %.9g", name, b, (double)c.nll[b], t);
        }
        const double loss = swl / sw;
        if (isinf(loss)) cr_expect(isinf(st.loss), "%s: loss %g, torch inf", name, st.loss);
        else cr_expect(fabs(st.loss - loss) < 1e-12 * loss, "%s: loss %.17g, torch %.17g", name, st.loss, loss);
        for (size_t i = 0; i < (size_t)B * N * K; i++) want[i] = json_number_value(json_array_get(gr, i));
        const double e = tu_rel_err(c.grad, want, (size_t)B * N * K, 1e-30);
        if (tu_verbose())
            fprintf(stderr, "torch case %s: loss %.17g vs %.17g (relative %.3g), gradient err %.3g\n", name, st.loss, loss,
                    isinf(loss) ? 0.0 : fabs(st.loss - loss) / loss, e);
        cr_expect(e < GRAD_TOL, "%s: gradient err %g", name, e);
        cr_expect_gt(tu_max_abs(want, (size_t)B * N * K), 1e-3, "%s: torch's gradient is empty", name);
        free(want);
        cb_free(&c);
        n_cases++;
    }
    cr_expect_eq(n_cases, 3, "the fixture's three cases");
    cr_expect_eq(n_inf, 2, "the impossible case's two rows");
    json_decref(doc);
}

/* ---- decoding, the edit distance and the phone error rate ---- */

/* logits (T, K) with output argmax[t] of each frame at 1 and the rest at 0 */
static float *onehot(const int *argmax, int T, int K) {
    float *x = tu_alloc_f((size_t)T * K);
    for (int t = 0; t < T; t++) x[t * K + argmax[t]] = 1.0f;
    return x;
}

Test(decoding, best_path_collapses_repeats_then_drops_blanks) {
    int out[16];
    /* outputs b 1 1 b 1 2 2 b (b = blank, output c + 1 = label c): collapse -> b 1 b 1 2
     * b, drop blanks -> outputs 1 1 2 -> labels 0 0 1 (the blank between keeps the two 1s) */
    const int a1[8] = {0, 1, 1, 0, 1, 2, 2, 0};
    float *x = onehot(a1, 8, 3);
    int n = ctc_best_path(x, 8, 3, out);
    cr_expect_eq(n, 3);
    cr_expect(out[0] == 0 && out[1] == 0 && out[2] == 1, "%d %d %d", out[0], out[1], out[2]);
    free(x);
    /* 3 3 3 (no blank between): one label 2 */
    const int a2[3] = {3, 3, 3};
    x = onehot(a2, 3, 4);
    cr_expect_eq(ctc_best_path(x, 3, 4, out), 1);
    cr_expect_eq(out[0], 2);
    free(x);
    /* all blank, and no frames: nothing */
    const int a3[4] = {0, 0, 0, 0};
    x = onehot(a3, 4, 4);
    cr_expect_eq(ctc_best_path(x, 4, 4, out), 0);
    cr_expect_eq(ctc_best_path(x, 0, 4, out), 0);
    free(x);
    /* a tie takes the first largest output: frame (0.5, 0.9, 0.9) -> output 1 */
    const float tie[3] = {0.5f, 0.9f, 0.9f};
    cr_expect_eq(ctc_best_path(tie, 1, 3, out), 1);
    cr_expect_eq(out[0], 0);
    /* against the reference's decoding on random frames */
    for (uint64_t seed = 1; seed <= 30; seed++) {
        float *r = tu_normal(20 * 4, seed, 3, 1.0);
        double *rd = tu_to_double(r, 80);
        int ref[20];
        const int nr = ref_ctc_best_path(rd, 20, 4, ref);
        cr_expect_eq(ctc_best_path(r, 20, 4, out), nr);
        cr_expect(memcmp(out, ref, sizeof(int) * (size_t)nr) == 0, "seed %llu", (unsigned long long)seed);
        free(r), free(rd);
    }
}

Test(decoding, edit_distance_hand_cases) {
    int work[16];
#define ED(h, nh, r, nr) ctc_edit_distance(h, nh, r, nr, work)
    /* "kitten" -> "sitting": k->s, e->i (2 substitutions), then g inserted: 3 */
    const int kitten[6] = {'k', 'i', 't', 't', 'e', 'n'}, sitting[7] = {'s', 'i', 't', 't', 'i', 'n', 'g'};
    cr_expect_eq(ED(kitten, 6, sitting, 7), 3);
    cr_expect_eq(ED(sitting, 7, kitten, 6), 3);
    /* nothing against 4 reference labels: 4 deletions; 3 labels against nothing: 3 insertions */
    const int r4[4] = {1, 2, 3, 4}, h3[3] = {5, 6, 7};
    cr_expect_eq(ED(h3, 0, r4, 4), 4);
    cr_expect_eq(ED(h3, 3, r4, 0), 3);
    cr_expect_eq(ED(r4, 4, r4, 4), 0);
    /* 1 2 3 against 3 2 1: the ends swapped, 2 substitutions */
    const int a[3] = {1, 2, 3}, b[3] = {3, 2, 1};
    cr_expect_eq(ED(a, 3, b, 3), 2);
    /* a b c d against b c d a: one deletion (the first a) and one insertion (the last): 2,
     * fewer than the 4 substitutions of a position-by-position comparison */
    const int c1[4] = {1, 2, 3, 4}, c2[4] = {2, 3, 4, 1};
    cr_expect_eq(ED(c1, 4, c2, 4), 2);
#undef ED
    /* against the full table of the reference on random sequences */
    for (uint64_t seed = 1; seed <= 200; seed++) {
        int x[12], y[12], w2[13];
        const int nx = (int)(seed % 13), ny = (int)((seed * 7) % 13);
        tu_fill_int(x, 12, seed, 1, 0, 3);
        tu_fill_int(y, 12, seed, 2, 0, 3);
        cr_expect_eq(ctc_edit_distance(x, nx, y, ny, w2), ref_edit_distance(x, nx, y, ny), "seed %llu",
                     (unsigned long long)seed);
    }
}

/* The phone error rate of a split: the summed edit distances of the best paths over
 * the summed reference lengths. Three utterances (K = 4: labels 0, 1, 2):
 *   1: best path labels 0 1 2, reference 0 1 1 2: one deletion      -> 1 error of 4
 *   2: best path labels 2 2,   reference 2 2:     exact              -> 0 errors of 2
 *   3: best path labels 1,     reference (none):  one insertion      -> 1 error of 0
 * PER = (1 + 0 + 1) / (4 + 2 + 0) = 2/6 = 0.333... */
Test(decoding, phone_error_rate_of_a_split) {
    const int f1[6] = {1, 0, 2, 2, 0, 3}, f2[5] = {3, 0, 0, 3, 3}, f3[3] = {0, 2, 0};
    const int r1[4] = {0, 1, 1, 2}, r2[2] = {2, 2};
    float *x1 = onehot(f1, 6, 4), *x2 = onehot(f2, 5, 4), *x3 = onehot(f3, 3, 4);
    int work[16];
    const int e1 = ctc_best_path_errors(x1, 6, 4, r1, 4, work), e2 = ctc_best_path_errors(x2, 5, 4, r2, 2, work);
    const int e3 = ctc_best_path_errors(x3, 3, 4, NULL, 0, work);
    cr_expect_eq(e1, 1);
    cr_expect_eq(e2, 0);
    cr_expect_eq(e3, 1);
    cr_expect_eq((double)(e1 + e2 + e3) / (4 + 2 + 0), 2.0 / 6.0);
    free(x1), free(x2), free(x3);
}

/* ---- sizes and refusals ---- */

Test(ctc, workspace_size_and_refused_dimensions) {
    ctc_dims d = {3, 5, 4, 2};
    /* 4 sums + 2 per row + per row N (2S + 2) + 3 (2S + 1) + K = 30 + 15 + 4 = 49 */
    cr_expect_eq(ctc_ws_bytes(&d), sizeof(double) * (4 + 2 * 3 + 3 * 49));
    const ctc_dims bad[] = {{0, 5, 4, 2}, {3, 0, 4, 2}, {3, 5, 1, 2}, {3, 5, 4, -1}, {1 << 20, 1 << 20, 4, 1 << 20}};
    const char *needles[] = {"0 rows", "0 frames", "1 outputs", "-1 label slots", "overflows"};
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(ctc_dims_check(&bad[i]), AB_EINVAL, "case %d accepted", i);
        cr_expect(strstr(ab_error(), needles[i]), "case %d: %s", i, ab_error());
    }
    cr_expect_eq(ctc_min_frames(NULL, 0), 0);
    const int l[5] = {1, 1, 1, 2, 2};
    cr_expect_eq(ctc_min_frames(l, 5), 8); /* 5 labels + 3 adjacent repeats */
}
