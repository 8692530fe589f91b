/* The layers suite's discretised logistic mixture (part of test_layers; the suite is
 * described in test_layers.c, its shared helpers and tolerances in test_layers.h). */
#include "test_layers.h"

/* ---- discretised logistic mixture (mixture.c against ref_mixture.c) ----
 *
 * The library evaluates mixture_core.h's expressions in double from the float outputs;
 * the reference evaluates other expressions (sigmoid differences, sigma'(z) / mass) in
 * double from the same values, so they differ by double rounding only: log P to
 * ~1e-15 relative, except where the reference's difference of two sigmoids loses
 * digits (a mass just above the 1e-5 fallback threshold: 2^-53 / 1e-5 ~ 1e-11). What
 * the library stores in float (nll, gradients) carries float rounding (2^-24 = 6e-8
 * relative). */

/* Random outputs of P positions with K components: logits N(0, 2^2), means uniform
 * in [-1.3, 1.3], raw log-scales uniform in [lo, hi]. */
static void mix_random(float *out, int P, int K, uint64_t seed, double lo, double hi) {
    for (int i = 0; i < P; i++) {
        float *p = out + (size_t)i * 3 * K;
        for (int k = 0; k < K; k++) {
            uint64_t j = (uint64_t)i * K + k;
            p[k] = (float)(2.0 * ab_rng_normal(seed, 1, j));
            p[K + k] = (float)(-1.3 + 2.6 * ab_rng_uniform(seed, 2, j));
            p[2 * K + k] = (float)(lo + (hi - lo) * ab_rng_uniform(seed, 3, j));
        }
    }
}

/* Extreme outputs, position by position (K = 3): means far outside [-1, 1], on a
 * value, on a bin edge, at the ends; log-scales far below the clamp, at it, tiny and
 * huge; logits +-30. */
#define MIX_EXTREME 12
static const float MIX_EXTREME_P[MIX_EXTREME][9] = {
    {0, 0, 0, -50.0f, 0.0f, 50.0f, -9.0f, -9.0f, -9.0f},     /* sharp, two means far outside */
    {30, -30, 0, 0.0f, 0.5f, -0.5f, -20.0f, 0.0f, 3.0f},     /* one component dominant, clamped */
    {0, 0, 0, -1.0f, 1.0f, 1.0f / 255, -7.0f, -7.0f, -7.0f}, /* at the ends, at a bin edge, at the clamp */
    {1, 2, 3, 3.0f, -3.0f, 0.0f, 0.0f, 0.0f, 12.0f},         /* outside, and a very broad one */
    {0, 0, 0, 0.2f, 0.2f, 0.2f, 30.0f, -6.9f, 1.0f},         /* huge scale */
    {-5, 5, 0, 1.0f - 1.0f / 255, -1.0f + 1.0f / 255, 0.0f, -6.5f, -6.5f, -6.5f}, /* next to the end values */
    {0, 0, 0, 1e3f, -1e3f, 0.9f, -3.0f, -3.0f, -4.0f},
    {10, 0, -10, 2.0f / 255 - 1, 0.0f, 1.0f, -5.5f, -2.0f, -100.0f},
    {0, 0, 0, 0.5f, 0.5f, 0.5f, -6.0f, -3.0f, 2.0f},
    {0, 0, 0, -0.999f, 0.999f, 0.0f, -4.0f, -4.0f, -7.5f},
    {3, 3, 3, 1.5f, -1.5f, 0.0f, -1.0f, -1.0f, -1.0f},
    {0, 0, 0, 0.0f, 0.0f, 0.0f, 8.0f, 9.0f, 10.0f},
};

/* All outputs of the normalisation and reference tests: 200 random positions of
 * K = 5 with log-scales in [-9, 3] (a fifth of them clamped), 100 with K = 10 in
 * [-7.5, -3] (sharp: most bins far in the tails), then the extreme ones. */
typedef struct {
    float *p;
    int n, K[400];
    size_t off[400];
} mix_set;

static mix_set mix_make_set(void) {
    mix_set s = {0};
    s.p = tu_alloc_f(200 * 15 + 100 * 30 + MIX_EXTREME * 9);
    mix_random(s.p, 200, 5, 501, -9.0, 3.0);
    mix_random(s.p + 200 * 15, 100, 10, 502, -7.5, -3.0);
    memcpy(s.p + 200 * 15 + 100 * 30, MIX_EXTREME_P, sizeof MIX_EXTREME_P);
    size_t o = 0;
    for (int i = 0; i < 200 + 100 + MIX_EXTREME; i++) {
        s.K[i] = i < 200 ? 5 : i < 300 ? 10 : 3;
        s.off[i] = o;
        o += 3 * (size_t)s.K[i];
    }
    s.n = 200 + 100 + MIX_EXTREME;
    return s;
}

/* Sum of P(v) over the 256 values. The exact masses sum to 1 (the edge bins hold both
 * tails); PixelCNN++'s fallback replaces a middle bin's mass Delta <= 1e-5 by
 * pdf(x) 2/255. In the tails (where those bins are) the density is convex and the
 * midpoint rule under-estimates, by a factor d / (2 sinh(d/2)), d = (2/255) / s, and
 * the bins below the threshold hold at most 1e-5 / (1 - e^-d) per side, so each side
 * loses at most 1e-5 (1 - d / (2 sinh(d/2))) / (1 - e^-d) <= 8.9e-6 (at the clamp,
 * d = 8.6; less for broader components). Two sides: < 1.8e-5, so 2e-5 is the bound
 * (a formula error in any bin moves the sum by far more). The reference's exact masses
 * sum to 1 to double rounding (1e-12 allows 256 additions). */
#define MIX_SUM_TOL 2e-5

Test(mixture, probabilities_sum_to_one) {
    mix_set s = mix_make_set();
    double worst = 0, worst_exact = 0;
    for (int i = 0; i < s.n; i++) {
        const float *p = s.p + s.off[i];
        int K = s.K[i];
        double sum = 0, P[256];
        for (int v = 0; v < 256; v++) {
            double lp = mixture_log_prob(p, K, v);
            cr_assert(isfinite(lp) || lp == -INFINITY, "position %d value %d: log P = %g", i, v, lp);
            cr_assert_leq(lp, 1e-12, "position %d value %d: log P = %g > 0", i, v, lp);
            sum += exp(lp);
        }
        worst = fmax(worst, fabs(sum - 1.0));
        cr_expect_lt(fabs(sum - 1.0), MIX_SUM_TOL, "position %d (K = %d): sum of P = %.12g", i, K, sum);
        double *pd = tu_to_double(p, 3 * (size_t)K), exact = 0;
        ref_mixture_probs(pd, K, P);
        for (int v = 0; v < 256; v++) exact += P[v];
        worst_exact = fmax(worst_exact, fabs(exact - 1.0));
        cr_expect_lt(fabs(exact - 1.0), 1e-12, "position %d: the exact masses sum to %.17g", i, exact);
        free(pd);
    }
    if (getenv("TEST_VERBOSE"))
        fprintf(stderr, "mixture: worst |sum P - 1| %.3g (exact masses %.3g)\n", worst, worst_exact);
    free(s.p);
}

/* log P(v) for every value, 0 and 255 included, against the reference: double
 * against double (see above), judged by |error| / max(1, |log P|); measured 1.5e-13
 * (when a change of branch, or a formula, would give 1e-3 or more); 1e-10 leaves
 * room for the reference's cancellation next to the threshold (~1e-11). */
#define MIX_LOGP_TOL 1e-10

Test(mixture, log_prob_matches_reference) {
    mix_set s = mix_make_set();
    double worst = 0;
    int worst_v = -1;
    for (int i = 0; i < s.n; i++) {
        const float *p = s.p + s.off[i];
        int K = s.K[i];
        double *pd = tu_to_double(p, 3 * (size_t)K);
        for (int v = 0; v < 256; v++) {
            double got = mixture_log_prob(p, K, v), want = ref_mixture_log_prob(pd, K, v);
            double e = fabs(got - want) / fmax(1.0, fabs(want));
            if (e > worst) worst = e, worst_v = v;
            cr_expect_lt(e, MIX_LOGP_TOL, "position %d value %d: log P %.17g vs reference %.17g", i, v, got, want);
        }
        free(pd);
    }
    if (getenv("TEST_VERBOSE")) fprintf(stderr, "mixture: worst log P err %.3g (at v = %d)\n", worst, worst_v);
    free(s.p);
}

/* The weighted loss and its gradient. */
typedef struct {
    int BT, K;
    double *out, *weights;
    const int *targets;
} mix_ctx;

static void mix_ref(void *c_, double *out) {
    mix_ctx *c = c_;
    out[0] = ref_mixture_nll(c->out, c->targets, c->weights, c->BT, c->K, NULL);
}

/* nll and the loss are float values of double results (2^-24 = 6e-8 relative each;
 * the loss measured <= 9e-9): 1e-6. The gradient against the reference's analytic
 * one: float rounding of each element, judged against the tensor's largest (measured
 * <= 2.8e-8): 1e-6. The reference's gradient against its own central differences
 * (h = 1e-5, double): truncation h^2 f''' / 6 with f''' ~ (1/s)^3 <= e^12 here
 * (log-scales >= -4) stays near 1e-6 of the largest entry, rounding 2^-53 |L| / h ~
 * 1e-11; measured <= 6.1e-9 (and the library's float gradient against the same
 * differences <= 2.8e-8); 1e-5. A wrong sign, term or index gives 1e-2 and more. */
#define MIX_VAL_TOL 1e-6
#define MIX_GRAD_TOL 1e-6
#define MIX_FD_TOL 1e-5

static void mix_loss_case(int K, uint64_t seed, bool clamp_one) {
    enum { BT = 10 };
    /* the targets: the ends, middle values, one far in a tail (the fallback), and two
     * unscored positions whose targets are never read */
    int targets[BT] = {0, 255, 128, 17, 240, -1, 3, 999, 200, 64};
    float weights[BT] = {1, 2, 0.5f, 1, 1, 0, 1.5f, 0, 1, 3};
    float *out = tu_alloc_f((size_t)BT * 3 * K);
    /* log-scales in [-4, 0.5]: sharp enough for every branch, smooth enough for the
     * finite differences */
    mix_random(out, BT, K, seed, -4.0, 0.5);
    /* position 3: one component at 0.1 of scale e^-3 and value 17 (x = -0.867):
     * mass ~ e^-19 2/255 e^3, far below 1e-5: the fallback */
    for (int k = 0; k < K; k++) {
        out[3 * 3 * K + K + k] = 0.1f;
        out[3 * 3 * K + 2 * K + k] = -3.0f;
    }
    /* one log-scale held by the clamp, on a component whose mean is far from every
     * target (its mean and log-scale gradients are then ~0 on both sides) */
    if (clamp_one) {
        out[8 * 3 * K + K + 0] = 1.3f;
        out[8 * 3 * K + 2 * K + 0] = -8.5f;
    }
    ce_stats st;
    float nll[BT];
    mixture_forward(&st, nll, out, targets, weights, BT, K);
    mix_ctx c = {BT, K, tu_to_double(out, (size_t)BT * 3 * K), tu_to_double(weights, BT), targets};
    double want = ref_mixture_nll(c.out, targets, c.weights, BT, K, NULL);
    cr_expect_lt(fabs(st.loss - want) / want, MIX_VAL_TOL, "K=%d: loss %.9g vs %.9g", K, st.loss, want);
    if (getenv("TEST_VERBOSE")) fprintf(stderr, "mixture K=%d: loss err %.3g\n", K, fabs(st.loss - want) / want);
    cr_expect_eq(st.weight_sum, 11.0);
    cr_expect_eq(st.counted, 8);
    long long correct = 0;
    for (int i = 0; i < BT; i++) {
        if (!(weights[i] > 0)) {
            cr_expect_eq(nll[i], 0.0f);
            continue;
        }
        double lp = ref_mixture_log_prob(c.out + (size_t)i * 3 * K, K, targets[i]);
        cr_expect_lt(fabs(nll[i] + lp) / fabs(lp), MIX_VAL_TOL, "K=%d position %d: nll %g vs %g", K, i, nll[i], -lp);
        double P[256];
        ref_mixture_probs(c.out + (size_t)i * 3 * K, K, P);
        int am = 0;
        for (int v = 1; v < 256; v++)
            if (P[v] > P[am]) am = v;
        correct += am == targets[i];
    }
    cr_expect_eq(st.correct, correct);
    cr_expect_gt(nll[3], 11.5, "position 3 should sit in the fallback (mass < 1e-5)");
    /* the gradient; then on top of non-zero values it adds exactly those numbers; and
     * with one thread it is the same bits */
    const size_t n = (size_t)BT * 3 * K;
    float *base = tu_normal(n, seed, 9, 1.0), *d = tu_alloc_f(n), *d2 = tu_alloc_f(n);
    mixture_backward(d, out, targets, weights, st.weight_sum, BT, K);
    double *dref = tu_alloc_d(n);
    ref_mixture_nll(c.out, targets, c.weights, BT, K, dref);
    double e = tu_rel_err(d, dref, n, 1e-30);
    if (getenv("TEST_VERBOSE")) fprintf(stderr, "mixture K=%d: gradient vs reference err %.3g\n", K, e);
    cr_expect_lt(e, MIX_GRAD_TOL, "K=%d: gradient vs the reference's: err %g", K, e);
    for (int j = 0; j < 3 * K; j++) {
        cr_expect_eq(d[5 * 3 * K + j], 0.0f, "an unscored position got a gradient");
        cr_expect_eq(d[7 * 3 * K + j], 0.0f, "an unscored position got a gradient");
    }
    if (clamp_one) cr_expect_eq(d[8 * 3 * K + 2 * K], 0.0f, "a clamped log-scale got a gradient");
    memcpy(d2, base, sizeof(float) * n);
    mixture_backward(d2, out, targets, weights, st.weight_sum, BT, K);
    for (size_t j = 0; j < n; j++) cr_assert_eq(d2[j], base[j] + d[j], "backward does not add at %zu", j);
    set_threads(1);
    memset(d2, 0, sizeof(float) * n);
    mixture_backward(d2, out, targets, weights, st.weight_sum, BT, K);
    ce_stats st1;
    float nll1[BT];
    mixture_forward(&st1, nll1, out, targets, weights, BT, K);
    set_threads(2);
    cr_expect(memcmp(d2, d, sizeof(float) * n) == 0, "the gradient depends on the thread count");
    cr_expect(memcmp(nll1, nll, sizeof nll) == 0, "nll depends on the thread count");
    cr_expect_eq(st1.loss, st.loss);
    cr_expect_eq(st1.correct, st.correct);
    /* the reference's gradient against its finite differences */
    double *fd = tu_alloc_d(n), one = 1.0;
    tu_fd_grad(mix_ref, &c, c.out, n, &one, 1, FD_STEP, fd);
    double worst = 0, scale = tu_max_abs(fd, n);
    for (size_t j = 0; j < n; j++) worst = fmax(worst, fabs(fd[j] - dref[j]) / scale);
    if (getenv("TEST_VERBOSE")) fprintf(stderr, "mixture K=%d: reference vs finite differences %.3g\n", K, worst);
    cr_expect_lt(worst, MIX_FD_TOL, "K=%d: the reference's gradient vs finite differences: %g", K, worst);
    /* and the library's float gradient against the differences directly */
    e = tu_rel_err(d, fd, n, 1e-30);
    if (getenv("TEST_VERBOSE")) fprintf(stderr, "mixture K=%d: gradient vs finite differences %.3g\n", K, e);
    cr_expect_lt(e, MIX_FD_TOL, "K=%d: gradient vs finite differences: err %g", K, e);
    /* all weights 0: loss 0, no gradient */
    float zeros[BT] = {0};
    mixture_forward(&st, nll, out, targets, zeros, BT, K);
    cr_expect_eq(st.loss, 0.0);
    cr_expect_eq(st.counted, 0);
    memset(d, 0, sizeof(float) * n);
    mixture_backward(d, out, targets, zeros, 0.0, BT, K);
    for (size_t j = 0; j < n; j++) cr_expect_eq(d[j], 0.0f);
    free(out), free(base), free(d), free(d2), free(dref), free(fd), free(c.out), free(c.weights);
}

Test(mixture, loss_and_gradients) {
    mix_loss_case(1, 511, false);
    mix_loss_case(3, 512, true);
    mix_loss_case(10, 513, true);
}

/* The most probable value against the reference's exact masses: the same masses to
 * double rounding (~1e-15 relative), so the choice is the reference's argmax except
 * between values tied to 1e-9 (six of the extreme positions, symmetric on purpose, e.g.
 * a mean exactly between two values or equal masses at both ends), where it must be
 * one of the tied values. */
Test(mixture, mode_is_the_most_probable_value) {
    mix_set s = mix_make_set();
    int ties = 0;
    double worst = 0;
    for (int i = 0; i < s.n; i++) {
        const float *p = s.p + s.off[i];
        int K = s.K[i];
        double *pd = tu_to_double(p, 3 * (size_t)K), P[256];
        ref_mixture_probs(pd, K, P);
        int am = 0, mode = mixture_mode(p, K);
        for (int v = 1; v < 256; v++)
            if (P[v] > P[am]) am = v;
        /* the masses the CUDA kernel compares (mix_bin_prob), against the reference's:
         * products of a few correctly computed factors against differences of two
         * sigmoids taken where they do not cancel; measured 5.3e-14 of the largest */
        const double lse = mix_logit_lse(p, K);
        for (int v = 0; v < 256; v++) {
            double e = fabs(mix_bin_prob(p, K, v, lse) - P[v]) / P[am];
            worst = fmax(worst, e);
            cr_expect_lt(e, 1e-12, "position %d value %d: mass %.17g vs %.17g", i, v, mix_bin_prob(p, K, v, lse), P[v]);
        }
        int near = 0;
        for (int v = 0; v < 256; v++) near += P[v] >= P[am] * (1 - 1e-9);
        if (near > 1 && getenv("TEST_VERBOSE")) fprintf(stderr, "mixture mode: near-tie at position %d (%d values)\n", i, near);
        if (near > 1 && i < 300) ties++; /* the extreme positions are symmetric on purpose */
        if (near == 1) cr_expect_eq(mode, am, "position %d: mode %d, reference %d", i, mode, am);
        else cr_expect_geq(P[mode], P[am] * (1 - 1e-9), "position %d: mode %d is not among the tied values", i, mode);
        free(pd);
    }
    cr_expect_eq(ties, 0, "%d near-ties among the random positions: pick other seeds", ties);
    if (getenv("TEST_VERBOSE")) fprintf(stderr, "mixture: mix_bin_prob vs reference masses %.3g\n", worst);
    free(s.p);
}

/* Sampling: a pure function of (outputs, u1, u2); the component picked by u1, the
 * value by the logistic inverse CDF at u2, rounded and clamped; and 100,000 draws from
 * the Philox uniforms follow the reference's distribution: the largest gap between the
 * empirical and the exact CDF (Kolmogorov-Smirnov) stays below 2.69 / sqrt(n) = 8.5e-3,
 * the level a correct sampler exceeds with probability 2 exp(-2 x 2.69^2) = 1e-6 (a
 * wrong scale or component choice gives 0.05 and more). */
Test(mixture, sampling) {
    /* the component by u1: equal weights, means -0.5 and 0.5, at u2 = 1/2 (x = mu) */
    float two[6] = {0, 0, -0.5f, 0.5f, -3, -3};
    cr_expect_eq(mixture_sample(two, 2, 0.49, 0.5), 64); /* (-0.5 + 1) 127.5 = 63.75 */
    cr_expect_eq(mixture_sample(two, 2, 0.51, 0.5), 191); /* 191.25 */
    cr_expect_eq(mixture_sample(two, 2, 0.0, 0.5), 64);
    cr_expect_eq(mixture_sample(two, 2, 1.0, 0.5), 191); /* u1 = 1 takes the last component */
    /* at u2 = 1/2 the mean's own value, for every value */
    for (int v = 0; v < 256; v++) {
        float one[3] = {0, (float)(2.0 * v / 255.0 - 1.0), -5};
        cr_expect_eq(mixture_sample(one, 1, 0.3, 0.5), v, "value %d", v);
    }
    /* clamped to the ends, for any u2 (kept within [1e-5, 1 - 1e-5]) */
    float hi[3] = {0, 5.0f, -3}, lo[3] = {0, -5.0f, -3};
    double us[5] = {0.0, 1e-9, 0.5, 1 - 1e-9, 1.0};
    for (int j = 0; j < 5; j++) {
        cr_expect_eq(mixture_sample(hi, 1, 0.5, us[j]), 255);
        cr_expect_eq(mixture_sample(lo, 1, 0.5, us[j]), 0);
    }
    /* a dominant component decides */
    float dom[9] = {-40, 40, -40, -0.8f, 0.2f, 0.9f, -4, -4, -4};
    for (int j = 0; j < 100; j++) {
        int v = mixture_sample(dom, 3, (j + 0.5) / 100, (j + 0.5) / 100);
        cr_expect(v >= 140 && v <= 166, "value %d far from the dominant component's mean (153)", v);
    }
    /* the distribution: three components, one partly beyond 1 (mass at 255) */
    float p[9] = {0.5f, -0.3f, 0.1f, -0.4f, 0.3f, 0.95f, -2.5f, -3.5f, -1.5f};
    enum { NS = 100000 };
    static int hist[256];
    memset(hist, 0, sizeof hist);
    for (int i = 0; i < NS; i++) {
        double u1 = ab_rng_uniform(521, 1, (uint64_t)i), u2 = ab_rng_uniform(521, 2, (uint64_t)i);
        int v = mixture_sample(p, 3, u1, u2);
        cr_assert(v >= 0 && v <= 255);
        cr_assert_eq(mixture_sample(p, 3, u1, u2), v, "not a pure function");
        hist[v]++;
    }
    double *pd = tu_to_double(p, 9), P[256], ce = 0, cp = 0, ks = 0;
    ref_mixture_probs(pd, 3, P);
    for (int v = 0; v < 256; v++) {
        ce += (double)hist[v] / NS;
        cp += P[v];
        ks = fmax(ks, fabs(ce - cp));
    }
    if (getenv("TEST_VERBOSE")) fprintf(stderr, "mixture sampling: KS distance %.3g (P(255) = %.3g)\n", ks, P[255]);
    cr_expect_gt(P[255], 0.05, "the test wants mass at the upper end");
    cr_expect_lt(ks, 2.69 / sqrt((double)NS), "KS distance %g", ks);
    free(pd);
}
