/* Optimisers (models/optim.h): Adam and RAdam against closed forms derived by hand and
 * against the double-precision reference (tests/reference/ref_optim.c), RAdam's switch
 * to the rectified step, weight decay of both kinds and per range, clipping, the
 * schedule, determinism across runs and thread counts, state save/restore, and the
 * refusal of bad configs (struct and JSON) with messages naming the key.
 *
 * Tolerances. The optimiser keeps p, m and v in float32 and rounds each per-step
 * scalar once, so one step's update carries a relative error of a few float ulps
 * (unit 6e-8) and the parameter itself is rounded to float (6e-8 |p|). The closed
 * forms are checked to 1e-6 relative, or to the rounding of p where a move is read as
 * the difference of two floats (measured 4e-8 absolute on |p| <= 2); multi-step
 * comparisons with the reference accumulate about one rounding per step and are
 * checked to 1e-5 of the parameters' scale over 25-30 steps (measured at most
 * 4.3e-7). Where eps's placement matters (gradients at eps's scale), the closed-form
 * tests include such entries. */
#include <criterion/criterion.h>

#include "error.h"
#include "memory.h"
#include "optim.h"
#include "reference.h"
#include "rng.h"
#include "test_util.h"

#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static ab_optim *make(const ab_optim_config *c, size_t n, const ab_optim_range *r, int nr) {
    ab_optim *o = NULL;
    int rc = ab_optim_create(c, n, r, nr, &o);
    cr_assert_eq(rc, 0, "ab_optim_create: %s", ab_error());
    cr_assert_not_null(o);
    return o;
}

static ab_optim_config cfg_of(ab_optim_kind kind) {
    ab_optim_config c;
    ab_optim_config_default(&c);
    c.kind = kind;
    return c;
}

/* The reference's config from the library's. */
static ref_optim_cfg ref_of(const ab_optim_config *c) {
    ref_optim_cfg r = {
        .kind = c->kind == AB_OPTIM_RADAM,
        .lr = c->lr,
        .beta1 = c->beta1,
        .beta2 = c->beta2,
        .eps = c->eps,
        .weight_decay = c->weight_decay,
        .decoupled = c->decoupled_decay,
        .clip_norm = c->clip_norm,
        .threshold = c->rectify_threshold,
        .n_milestones = c->n_milestones,
        .milestones = c->milestones,
        .gamma = c->gamma,
        .warmup = c->warmup,
    };
    return r;
}

static double rel(double got, double want) { return fabs(got - want) / fmax(fabs(want), 1e-300); }

/* Runs `steps` steps of the optimiser and of the reference on n parameters with fresh
 * normal(0, gsd) gradients each step, and returns the largest error of the parameters
 * relative to their scale, checking the logged norm, lr and branch on the way. */
static double compare_with_reference(const ab_optim_config *c, int n, const ab_optim_range *ranges, int nr,
                                     int steps, double gsd, uint64_t seed) {
    ab_optim *o = make(c, (size_t)n, ranges, nr);
    float *p = tu_alloc_f((size_t)n), *g = tu_alloc_f((size_t)n);
    tu_fill_normal(p, (size_t)n, seed, 0, 1.0);
    double *pr = tu_to_double(p, (size_t)n), *gr = tu_alloc_d((size_t)n);
    double *m = tu_alloc_d((size_t)n), *v = tu_alloc_d((size_t)n);
    bool *decay = calloc((size_t)n, sizeof(bool));
    if (!ranges)
        for (int i = 0; i < n; i++) decay[i] = true;
    for (int r = 0; r < nr; r++)
        for (size_t i = ranges[r].offset; i < ranges[r].offset + ranges[r].count; i++) decay[i] = ranges[r].decay;
    ref_optim_cfg rc = ref_of(c);
    double worst = 0;
    for (int t = 1; t <= steps; t++) {
        tu_fill_normal(g, (size_t)n, seed, (uint64_t)t, gsd);
        for (int i = 0; i < n; i++) gr[i] = g[i];
        ab_optim_info info;
        cr_assert_eq(ab_optim_step(o, p, g, &info), 0, "%s", ab_error());
        int rect;
        double norm = ref_optim_step(&rc, t, n, pr, gr, m, v, decay, &rect);
        /* The norm is summed in double from the same floats: only the order differs. */
        cr_assert_lt(rel(info.grad_norm, norm), 1e-14, "norm %.17g vs %.17g", info.grad_norm, norm);
        cr_assert_eq(info.lr, ref_optim_lr(&rc, t), "step %d: lr %.17g", t, info.lr);
        cr_assert_eq(info.rectified, rect != 0, "step %d: rectified %d vs %d", t, info.rectified, rect);
        cr_assert_eq(info.step, t);
        double err = tu_rel_err(p, pr, (size_t)n, 1e-3);
        if (err > worst) worst = err;
    }
    cr_assert_eq(ab_optim_steps(o), steps);
    ab_optim_destroy(o);
    free(p), free(g), free(pr), free(gr), free(m), free(v), free(decay);
    return worst;
}

/* ---- closed forms ---- */

/* Adam's first step: m = (1-b1) g, v = (1-b2) g^2, so m_hat = g, v_hat = g^2 and
 * p1 = p0 - lr g / (|g| + eps). */
Test(adam, first_step_closed_form) {
    ab_optim_config c = cfg_of(AB_OPTIM_ADAM);
    c.lr = 0.01;
    /* The last two gradients are at and below eps's scale, where its placement shows:
     * g = 1e-8 moves p by lr/2, g = 1e-9 by lr/11. */
    const float p0[7] = {0.5f, -1.0f, 2.0f, 0.0f, 3.0f, 0.0f, 0.0f};
    const float g[7] = {0.3f, -2.0f, 1e-3f, 5.0f, 0.0f, 1e-8f, -1e-9f};
    float p[7];
    memcpy(p, p0, sizeof p);
    ab_optim *o = make(&c, 7, NULL, 0);
    cr_assert_eq(ab_optim_step(o, p, g, NULL), 0);
    for (int i = 0; i < 7; i++) {
        double want = p0[i] - c.lr * g[i] / (fabs(g[i]) + c.eps);
        /* p and the update are floats: one rounding of each, 6e-8 relative. */
        cr_assert_leq(fabs(p[i] - want), 1e-6 * fmax(fabs(want), 1.0), "p[%d] = %.9g, want %.9g", i, p[i], want);
    }
    ab_optim_destroy(o);
}

/* RAdam with a constant gradient g: m_t = (1 - b1^t) g, so every momentum step moves p
 * by exactly lr g (p_t = p0 - t lr g for t <= 5); v_t = (1 - b2^t) g^2, so the first
 * rectified step (t = 6) moves p by lr r_6 g / (|g| + eps / sqrt(1 - b2^6)). The last
 * gradient (1e-8 = eps) is where eps's placement matters: its rectified moves are 7
 * times smaller than with eps added after the bias correction. */
Test(radam, constant_gradient_switches_at_step_6) {
    ab_optim_config c = cfg_of(AB_OPTIM_RADAM);
    c.lr = 0.01;
    const float p0[4] = {1.0f, -2.0f, 0.25f, 0.0f};
    const float g[4] = {0.5f, -0.125f, 2.0f, 1e-8f};
    float p[4];
    memcpy(p, p0, sizeof p);
    ab_optim *o = make(&c, 4, NULL, 0);
    const double b2 = 0.999, rho_inf = 2 / (1 - b2) - 1; /* 1999 */
    for (int t = 1; t <= 7; t++) {
        double pb[4];
        for (int i = 0; i < 4; i++) pb[i] = p[i];
        ab_optim_info info;
        cr_assert_eq(ab_optim_step(o, p, g, &info), 0);
        double b2t = pow(b2, t);
        double rho = rho_inf - 2 * t * b2t / (1 - b2t);
        cr_assert_lt(fabs(info.rho - rho), 1e-9, "rho_%d = %.12g, want %.12g", t, info.rho, rho);
        /* rho_5 = 4.996, rho_6 = 5.994 (threshold 5). */
        cr_assert_eq(info.rectified, t >= 6, "step %d rectified = %d", t, info.rectified);
        for (int i = 0; i < 4; i++) {
            double step;
            if (t <= 5) {
                step = c.lr * g[i];
            } else {
                double r = sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho));
                double bc1 = 1 - pow(0.9, t), bc2 = 1 - b2t;
                double m = bc1 * g[i], v = bc2 * (double)g[i] * g[i];
                step = c.lr * r * sqrt(bc2) / bc1 * m / (sqrt(v) + c.eps);
            }
            double moved = pb[i] - (double)p[i];
            /* The move is the difference of two floats: half an ulp of each (6e-8 |p|)
             * plus a few roundings of the update itself (1e-6 |step| is generous). */
            double tol = 6e-8 * (fabs(pb[i]) + fabs(p[i])) + 1e-6 * fabs(step);
            cr_assert_leq(fabs(moved - step), tol, "t=%d p[%d] moved %.9g, want %.9g", t, i, moved, step);
        }
    }
    ab_optim_destroy(o);
}

/* The switch at the right t for other beta2: rho_t >= threshold first at the step the
 * formula says, and a higher threshold moves it later. */
Test(radam, switch_step_follows_rho) {
    const double betas[3] = {0.99, 0.999, 0.9999};
    const double thresholds[2] = {5.0, 8.5};
    for (int bi = 0; bi < 3; bi++)
        for (int ti = 0; ti < 2; ti++) {
            ab_optim_config c = cfg_of(AB_OPTIM_RADAM);
            c.beta2 = betas[bi];
            c.rectify_threshold = thresholds[ti];
            ab_optim *o = make(&c, 2, NULL, 0);
            float p[2] = {1, 1}, g[2] = {0.1f, -0.2f};
            int first = 0;
            for (int t = 1; t <= 20 && !first; t++) {
                ab_optim_info info;
                cr_assert_eq(ab_optim_step(o, p, g, &info), 0);
                if (info.rectified) first = t;
            }
            /* Expected: the smallest t with rho_t >= threshold, from the formula. */
            int want = 0;
            double ri = 2 / (1 - c.beta2) - 1;
            for (int t = 1; t <= 20 && !want; t++) {
                double b2t = pow(c.beta2, t);
                if (ri - 2 * t * b2t / (1 - b2t) >= c.rectify_threshold) want = t;
            }
            cr_assert_eq(first, want, "beta2 %g threshold %g: first rectified step %d, want %d", c.beta2,
                         c.rectify_threshold, first, want);
            cr_assert(want >= 6 && want <= 10, "the cases are meaningful (want %d)", want);
            ab_optim_destroy(o);
        }
}

/* Decoupled decay with a zero gradient: m = v = 0 so the adaptive part is 0 / eps = 0
 * and p_t = p0 (1 - lr wd)^t on decayed ranges, p0 on the others. */
Test(weight_decay, decoupled_zero_gradient_and_ranges) {
    for (int kind = 0; kind < 2; kind++) {
        ab_optim_config c = cfg_of((ab_optim_kind)kind);
        c.lr = 0.1;
        c.weight_decay = 0.5;
        const ab_optim_range r[3] = {{4, 3, true}, {0, 2, true}, {2, 2, false}}; /* any order */
        ab_optim *o = make(&c, 7, r, 3);
        float p[7] = {1, -2, 3, -4, 5, -6, 7}, g[7] = {0};
        for (int t = 1; t <= 10; t++) cr_assert_eq(ab_optim_step(o, p, g, NULL), 0);
        const float p0[7] = {1, -2, 3, -4, 5, -6, 7};
        for (int i = 0; i < 7; i++) {
            bool decayed = i < 2 || i >= 4;
            double want = decayed ? p0[i] * pow(1 - 0.05, 10) : p0[i];
            /* Ten float multiplications by the rounded factor 0.95f: 10 roundings of
             * 6e-8 plus the factor's own rounding (0.95f - 0.95 = 2e-8, times 10). */
            cr_assert_lt(rel(p[i], want), 2e-6, "%s p[%d] = %.9g, want %.9g", ab_optim_kind_name(c.kind), i, p[i],
                         want);
        }
        ab_optim_destroy(o);
    }
}

/* L2 decay with a zero gradient: g' = wd p, so Adam's first step is
 * p1 = p0 - lr wd p0 / (wd |p0| + eps) = p0 - lr sign(p0) (nearly); RAdam's first
 * (momentum) step is p1 = p0 - lr wd p0. Undecayed ranges do not move. */
Test(weight_decay, l2_zero_gradient) {
    for (int kind = 0; kind < 2; kind++) {
        ab_optim_config c = cfg_of((ab_optim_kind)kind);
        c.lr = 0.01;
        c.weight_decay = 0.1;
        c.decoupled_decay = false;
        const ab_optim_range r[2] = {{0, 3, true}, {3, 1, false}};
        ab_optim *o = make(&c, 4, r, 2);
        const float p0[4] = {2, -0.5f, 4, 1};
        float p[4], g[4] = {0};
        memcpy(p, p0, sizeof p);
        cr_assert_eq(ab_optim_step(o, p, g, NULL), 0);
        for (int i = 0; i < 4; i++) {
            double want;
            if (i == 3) want = p0[i];
            else if (kind == 0) want = p0[i] - c.lr * c.weight_decay * p0[i] / (c.weight_decay * fabs(p0[i]) + c.eps);
            else want = p0[i] - c.lr * c.weight_decay * p0[i];
            cr_assert_lt(fabs(p[i] - want), 1e-6 * fmax(fabs(want), 1), "%s p[%d] = %.9g, want %.9g",
                         ab_optim_kind_name(c.kind), i, p[i], want);
        }
        ab_optim_destroy(o);
    }
}

/* Clipping on RAdam's first step (p1 = p0 - lr g_clipped): a norm above clip_norm is
 * scaled to exactly clip_norm, a norm below is left alone; the reported norm is the
 * raw one. The caller's gradient is not modified. */
Test(clipping, above_and_below) {
    const float g[4] = {3, 4, 0, 12}; /* norm 13 */
    const double clips[3] = {1.0, 13.5, 0.0};
    for (int k = 0; k < 3; k++) {
        ab_optim_config c = cfg_of(AB_OPTIM_RADAM);
        c.lr = 0.1;
        c.clip_norm = clips[k];
        ab_optim *o = make(&c, 4, NULL, 0);
        float p[4] = {0}, gc[4];
        memcpy(gc, g, sizeof g);
        ab_optim_info info;
        cr_assert_eq(ab_optim_step(o, p, gc, &info), 0);
        cr_assert_eq(memcmp(gc, g, sizeof g), 0, "the gradient array is left as it was");
        cr_assert_eq(info.grad_norm, 13.0, "norm %.17g", info.grad_norm);
        double scale = (clips[k] > 0 && clips[k] < 13) ? clips[k] / 13.0 : 1.0;
        cr_assert_lt(fabs(info.clip_scale - scale), 1e-15, "clip scale %.17g, want %.17g", info.clip_scale, scale);
        double moved2 = 0;
        for (int i = 0; i < 4; i++) {
            double want = -c.lr * g[i] * scale;
            cr_assert_lt(fabs(p[i] - want), 1e-6 * fmax(fabs(want), 1e-3), "clip %g p[%d] = %.9g, want %.9g",
                         clips[k], i, p[i], want);
            moved2 += (double)p[i] * p[i];
        }
        /* The step's length is lr times the clipped norm. */
        double want_len = c.lr * (scale < 1 ? clips[k] : 13.0);
        cr_assert_lt(rel(sqrt(moved2), want_len), 1e-6, "step length %.9g, want %.9g", sqrt(moved2), want_len);
        ab_optim_destroy(o);
    }
}

/* ---- schedule ---- */

Test(schedule, milestones_gamma_warmup) {
    ab_optim_config c = cfg_of(AB_OPTIM_RADAM);
    c.lr = 1e-3;
    c.n_milestones = 1;
    c.milestones[0] = 3000;
    c.gamma = 0.1;
    /* The copy task: 1e-3 through step 3000, then 1e-4. */
    cr_assert_eq(ab_optim_schedule_lr(&c, 1), 1e-3);
    cr_assert_eq(ab_optim_schedule_lr(&c, 3000), 1e-3);
    /* 1e-3 * 0.1 in double is 1.0000000000000000208e-4: one rounding from 1e-4. */
    cr_assert_lt(rel(ab_optim_schedule_lr(&c, 3001), 1e-4), 1e-15);
    cr_assert_lt(rel(ab_optim_schedule_lr(&c, 100000), 1e-4), 1e-15);

    c.n_milestones = 3;
    c.milestones[0] = 2;
    c.milestones[1] = 4;
    c.milestones[2] = 5;
    c.gamma = 0.5;
    c.warmup = 4;
    c.lr = 1.0;
    /* warm-up t/4 during t < 4, times 0.5 per milestone passed (m < t). */
    const double want[8] = {0.25, 0.5, 0.75 * 0.5, 0.5, 0.25, 0.125, 0.125, 0.125};
    for (int t = 1; t <= 8; t++)
        cr_assert_eq(ab_optim_schedule_lr(&c, t), want[t - 1], "lr(%d) = %.17g, want %.17g", t,
                     ab_optim_schedule_lr(&c, t), want[t - 1]);

    /* The step uses it: RAdam's momentum steps move p by lr_t g, so with g = 1 the
     * moves are the schedule itself. */
    c.lr = 0.01;
    ab_optim *o = make(&c, 1, NULL, 0);
    float p = 0, g = 1;
    for (int t = 1; t <= 5; t++) {
        float before = p;
        ab_optim_info info;
        cr_assert_eq(ab_optim_step(o, &p, &g, &info), 0);
        cr_assert_eq(info.lr, 0.01 * want[t - 1] / 1.0);
        /* one float rounding of p (|p| < 0.05: 4e-9) on a move >= 1.25e-3 */
        cr_assert_lt(fabs((double)before - p - info.lr), 1e-8, "t=%d moved %.9g, want %.9g", t, before - p, info.lr);
    }
    ab_optim_destroy(o);
}

/* ---- against the double reference ---- */

/* Measured worst errors (relative to the parameters' scale, 30 steps): 1.5e-7 to
 * 4.3e-7 over the cases below. The checks allow 1e-5: about one float rounding per
 * step of the parameters and of the update, with a factor of 20 to spare. */
#define MULTI_STEP_TOL 1e-5

Test(reference, adam_plain) {
    ab_optim_config c = cfg_of(AB_OPTIM_ADAM);
    c.lr = 0.01;
    double e = compare_with_reference(&c, 37, NULL, 0, 30, 1.0, 11);
    cr_assert_lt(e, MULTI_STEP_TOL, "error %.3g", e);
}

Test(reference, radam_plain_across_the_switch) {
    ab_optim_config c = cfg_of(AB_OPTIM_RADAM);
    c.lr = 0.01;
    double e = compare_with_reference(&c, 37, NULL, 0, 30, 1.0, 12);
    cr_assert_lt(e, MULTI_STEP_TOL, "error %.3g", e);
}

Test(reference, every_option_both_kinds) {
    const ab_optim_range ranges[4] = {{0, 10, true}, {10, 3, false}, {13, 20, true}, {33, 4, false}};
    for (int kind = 0; kind < 2; kind++)
        for (int decoupled = 0; decoupled < 2; decoupled++)
            for (int clip = 0; clip < 2; clip++) {
                ab_optim_config c = cfg_of((ab_optim_kind)kind);
                c.lr = 0.02;
                c.beta1 = 0.8;
                c.beta2 = 0.99;
                c.eps = 1e-6;
                c.weight_decay = 0.3;
                c.decoupled_decay = decoupled;
                /* gradients of norm ~ sqrt(37) * 0.5 = 3: a clip of 2 clips most steps */
                c.clip_norm = clip ? 2.0 : 0.0;
                c.n_milestones = 2;
                c.milestones[0] = 7;
                c.milestones[1] = 20;
                c.gamma = 0.3;
                c.warmup = 5;
                double e = compare_with_reference(&c, 37, ranges, 4, 30, 0.5, 13 + (uint64_t)(4 * kind + 2 * decoupled + clip));
                cr_assert_lt(e, MULTI_STEP_TOL, "%s decoupled=%d clip=%d: error %.3g", ab_optim_kind_name(c.kind),
                             decoupled, clip, e);
            }
}

/* Gradients spanning orders of magnitude (1e-6 .. 1e2) in one vector. */
Test(reference, mixed_scales) {
    for (int kind = 0; kind < 2; kind++) {
        ab_optim_config c = cfg_of((ab_optim_kind)kind);
        c.lr = 1e-3;
        const int n = 9;
        ab_optim *o = make(&c, n, NULL, 0);
        float p[9], g[9];
        double pr[9], gr[9], m[9] = {0}, v[9] = {0};
        bool decay[9];
        for (int i = 0; i < n; i++) p[i] = (float)(0.1 * (i - 4)), pr[i] = p[i], decay[i] = true;
        ref_optim_cfg rc = ref_of(&c);
        for (int t = 1; t <= 25; t++) {
            for (int i = 0; i < n; i++) {
                g[i] = (float)(pow(10.0, i - 6) * ab_rng_normal(5, (uint64_t)t, (uint64_t)i));
                gr[i] = g[i];
            }
            cr_assert_eq(ab_optim_step(o, p, g, NULL), 0);
            ref_optim_step(&rc, t, n, pr, gr, m, v, decay, NULL);
        }
        double e = tu_rel_err(p, pr, (size_t)n, 1e-3);
        cr_assert_lt(e, MULTI_STEP_TOL, "%s: error %.3g", ab_optim_kind_name(c.kind), e);
        ab_optim_destroy(o);
    }
}

/* ---- determinism, threads, memory ---- */

/* Runs `steps` steps on n parameters with `threads` OpenMP threads; returns the final
 * parameters followed by the optimiser state (malloc'ed). */
static unsigned char *run_threads(int threads, size_t n, int steps, size_t *bytes) {
    omp_set_num_threads(threads);
    ab_optim_config c = cfg_of(AB_OPTIM_RADAM);
    c.clip_norm = 100.0;
    c.weight_decay = 0.01;
    const ab_optim_range r[3] = {{0, n / 3, true}, {n / 3, 17, false}, {n / 3 + 17, n - n / 3 - 17, true}};
    ab_optim *o = make(&c, n, r, 3);
    float *p = tu_alloc_f(n), *g = tu_alloc_f(n);
    tu_fill_normal(p, n, 3, 0, 1.0);
    for (int t = 1; t <= steps; t++) {
        tu_fill_normal(g, n, 3, (uint64_t)t, 1.0);
        cr_assert_eq(ab_optim_step(o, p, g, NULL), 0, "%s", ab_error());
    }
    const void *st;
    size_t sb;
    ab_optim_state(o, &st, &sb);
    *bytes = n * sizeof(float) + sb;
    unsigned char *out = malloc(*bytes);
    memcpy(out, p, n * sizeof(float));
    memcpy(out + n * sizeof(float), st, sb);
    ab_optim_destroy(o);
    free(p), free(g);
    return out;
}

Test(determinism, repeated_runs_and_thread_counts_are_bit_identical) {
    const size_t n = 200003; /* above the parallel threshold, not a multiple of the blocks */
    size_t b1, b2, b3, b4;
    unsigned char *a = run_threads(2, n, 8, &b1);
    unsigned char *b = run_threads(2, n, 8, &b2);
    unsigned char *c = run_threads(1, n, 8, &b3);
    unsigned char *d = run_threads(3, n, 8, &b4);
    cr_assert_eq(b1, b2);
    cr_assert_eq(memcmp(a, b, b1), 0, "two runs at 2 threads differ");
    cr_assert_eq(memcmp(a, c, b1), 0, "1 thread differs from 2");
    cr_assert_eq(memcmp(a, d, b1), 0, "3 threads differ from 2");
    free(a), free(b), free(c), free(d);
}

Test(memory, one_allocation_and_none_per_step) {
    ab_optim_config c = cfg_of(AB_OPTIM_ADAM);
    size_t before = ab_mem_current(AB_DEV_CPU);
    const size_t n = 100000;
    ab_optim *o = make(&c, n, NULL, 0);
    size_t after_create = ab_mem_current(AB_DEV_CPU);
    /* m and v (8 bytes per parameter) plus a small header, partials and range table. */
    cr_assert_geq(after_create - before, 2 * n * sizeof(float));
    cr_assert_lt(after_create - before, 2 * n * sizeof(float) + 1024);
    float *p = tu_alloc_f(n), *g = tu_alloc_f(n);
    tu_fill_normal(g, n, 1, 1, 1.0);
    for (int t = 0; t < 3; t++) cr_assert_eq(ab_optim_step(o, p, g, NULL), 0);
    cr_assert_eq(ab_mem_current(AB_DEV_CPU), after_create, "a step allocates nothing");
    ab_optim_destroy(o);
    cr_assert_eq(ab_mem_current(AB_DEV_CPU), before);
    free(p), free(g);
}

/* A NaN or infinite gradient is refused and changes nothing. */
Test(step, non_finite_gradient_changes_nothing) {
    ab_optim_config c = cfg_of(AB_OPTIM_ADAM);
    ab_optim *o = make(&c, 4, NULL, 0);
    float p[4] = {1, 2, 3, 4}, g[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    cr_assert_eq(ab_optim_step(o, p, g, NULL), 0);
    const void *st;
    size_t sb;
    ab_optim_state(o, &st, &sb);
    unsigned char *saved = malloc(sb);
    memcpy(saved, st, sb);
    float pk[4];
    memcpy(pk, p, sizeof p);
    const float bad[2] = {NAN, INFINITY};
    for (int k = 0; k < 2; k++) {
        g[2] = bad[k];
        ab_clear_error();
        cr_assert_eq(ab_optim_step(o, p, g, NULL), AB_EINVAL);
        cr_assert(strstr(ab_error(), k == 0 ? "nan" : "inf"), "message: %s", ab_error());
        cr_assert(strstr(ab_error(), "step 2"), "message names the step: %s", ab_error());
        cr_assert_eq(memcmp(p, pk, sizeof p), 0);
        cr_assert_eq(ab_optim_steps(o), 1);
        ab_optim_state(o, &st, &sb);
        cr_assert_eq(memcmp(st, saved, sb), 0);
    }
    cr_assert_eq(ab_optim_step(o, NULL, g, NULL), AB_EINVAL);
    cr_assert_eq(ab_optim_step(o, p, NULL, NULL), AB_EINVAL);
    cr_assert_eq(ab_optim_steps(o), 1);
    free(saved);
    ab_optim_destroy(o);
}

/* ---- state ---- */

Test(state, restore_continues_bit_identically) {
    for (int kind = 0; kind < 2; kind++) {
        ab_optim_config c = cfg_of((ab_optim_kind)kind);
        c.weight_decay = 0.1;
        const size_t n = 1000;
        float *pa = tu_alloc_f(n), *pb = tu_alloc_f(n), *g = tu_alloc_f(n);
        tu_fill_normal(pa, n, 9, 0, 1.0);
        memcpy(pb, pa, n * sizeof(float));
        ab_optim *a = make(&c, n, NULL, 0), *b = make(&c, n, NULL, 0);
        for (int t = 1; t <= 12; t++) {
            tu_fill_normal(g, n, 9, (uint64_t)t, 1.0);
            cr_assert_eq(ab_optim_step(a, pa, g, NULL), 0);
            if (t <= 4) cr_assert_eq(ab_optim_step(b, pb, g, NULL), 0);
            if (t == 4) {
                /* b's state into a fresh optimiser, which carries on */
                const void *st;
                size_t sb;
                ab_optim_state(b, &st, &sb);
                ab_optim *b2 = make(&c, n, NULL, 0);
                cr_assert_eq(ab_optim_set_state(b2, st, sb), 0, "%s", ab_error());
                cr_assert_eq(ab_optim_steps(b2), 4);
                ab_optim_destroy(b);
                b = b2;
            } else if (t > 4) {
                cr_assert_eq(ab_optim_step(b, pb, g, NULL), 0);
            }
        }
        cr_assert_eq(memcmp(pa, pb, n * sizeof(float)), 0, "%s: resumed parameters differ",
                     ab_optim_kind_name(c.kind));
        ab_optim_destroy(a), ab_optim_destroy(b);
        free(pa), free(pb), free(g);
    }
}

Test(state, foreign_states_refused) {
    ab_optim_config ca = cfg_of(AB_OPTIM_ADAM), cr = cfg_of(AB_OPTIM_RADAM);
    ab_optim *a = make(&ca, 10, NULL, 0), *r = make(&cr, 10, NULL, 0), *a11 = make(&ca, 11, NULL, 0);
    float p[11] = {0}, g[11] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    cr_assert_eq(ab_optim_step(a, p, g, NULL), 0);
    const void *st;
    size_t sb;
    ab_optim_state(a, &st, &sb);
    cr_assert_eq(sb, 64 + 2 * 10 * sizeof(float));
    unsigned char *buf = malloc(sb);

    struct {
        const char *what;
        ab_optim *dst;
        size_t off;      /* byte to change (or SIZE_MAX) */
        unsigned char val;
        size_t size;     /* bytes to pass */
        const char *msg; /* expected in the message */
    } cases[] = {
        {"other kind", r, SIZE_MAX, 0, sb, "adam state, this optimiser is radam"},
        {"other size", a11, SIZE_MAX, 0, sb, "10 parameters, this optimiser has 11"},
        {"bad magic", a, 0, 'X', sb, "not an attnbench optimiser state"},
        {"other version", a, 8, 9, sb, "format version 9"},
        {"short", a, SIZE_MAX, 0, sb - 4, "expected"},
        {"too short for a header", a, SIZE_MAX, 0, 10, "not an attnbench optimiser state"},
        {"header garbage", a, 40, 1, sb, "malformed header"},
        {"negative second moment", a, 64 + 10 * 4 + 3, 0xbf, sb, "second moment 0"},
        {"nan first moment", a, 64 + 4 * 4 + 3, 0x7f, sb, "first moment 4"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        memcpy(buf, st, sb);
        if (cases[k].off != SIZE_MAX) buf[cases[k].off] = cases[k].val;
        if (strcmp(cases[k].what, "nan first moment") == 0) buf[64 + 4 * 4 + 2] = 0xc0; /* 0x7fc0.... = NaN */
        long long steps = ab_optim_steps(cases[k].dst);
        ab_clear_error();
        cr_assert_eq(ab_optim_set_state(cases[k].dst, buf, cases[k].size), AB_EINVAL, "%s accepted", cases[k].what);
        cr_assert(strstr(ab_error(), cases[k].msg), "%s: message '%s' lacks '%s'", cases[k].what, ab_error(),
                  cases[k].msg);
        cr_assert_eq(ab_optim_steps(cases[k].dst), steps, "%s: nothing changes", cases[k].what);
    }
    free(buf);
    ab_optim_destroy(a), ab_optim_destroy(r), ab_optim_destroy(a11);
}

Test(state, set_config_keeps_kind) {
    ab_optim_config c = cfg_of(AB_OPTIM_ADAM);
    ab_optim *o = make(&c, 3, NULL, 0);
    c.lr = 5e-4;
    cr_assert_eq(ab_optim_set_config(o, &c), 0);
    cr_assert_eq(ab_optim_get_config(o)->lr, 5e-4);
    c.kind = AB_OPTIM_RADAM;
    cr_assert_eq(ab_optim_set_config(o, &c), AB_EINVAL);
    cr_assert(strstr(ab_error(), "kind"), "%s", ab_error());
    c.kind = AB_OPTIM_ADAM;
    c.lr = -1;
    cr_assert_eq(ab_optim_set_config(o, &c), AB_EINVAL);
    cr_assert_eq(ab_optim_get_config(o)->lr, 5e-4);
    ab_optim_destroy(o);
}

/* ---- bad input ---- */

Test(config, bad_struct_values_name_the_field) {
    /* One mutation per case and the key its message must name. */
    ab_optim_config base = cfg_of(AB_OPTIM_RADAM);
    for (int k = 0; k < 14; k++) {
        ab_optim_config c = base;
        const char *key = NULL;
        switch (k) {
        case 0: c.lr = -1e-3, key = "'lr'"; break;
        case 1: c.lr = INFINITY, key = "'lr'"; break;
        case 2: c.beta1 = 1.0, key = "'beta1'"; break;
        case 3: c.beta1 = -0.1, key = "'beta1'"; break;
        case 4: c.beta2 = 1.0, key = "'beta2'"; break;
        case 5: c.eps = 0, key = "'eps'"; break;
        case 6: c.kind = (ab_optim_kind)7, key = "'kind'"; break;
        case 7: c.weight_decay = -0.1, key = "'weight_decay'"; break;
        case 8: c.clip_norm = -1, key = "'clip_norm'"; break;
        case 9: c.rectify_threshold = 4.0, key = "'rectify_threshold'"; break;
        case 10: c.n_milestones = 2, c.milestones[0] = 10, c.milestones[1] = 10, key = "'schedule.milestones'"; break;
        case 11: c.n_milestones = 1, c.milestones[0] = 0, key = "'schedule.milestones'"; break;
        case 12: c.gamma = 0, key = "'schedule.gamma'"; break;
        case 13: c.warmup = -1, key = "'schedule.warmup'"; break;
        }
        ab_clear_error();
        ab_optim *o = (ab_optim *)1;
        cr_assert_eq(ab_optim_create(&c, 4, NULL, 0, &o), AB_EINVAL, "case %d accepted", k);
        cr_assert_null(o);
        cr_assert(strstr(ab_error(), key), "case %d: message '%s' does not name %s", k, ab_error(), key);
        cr_assert_eq(ab_optim_config_validate(&c), AB_EINVAL);
    }
    cr_assert_eq(ab_optim_config_validate(&base), 0);
}

Test(config, bad_ranges) {
    ab_optim_config c = cfg_of(AB_OPTIM_ADAM);
    struct {
        ab_optim_range r[3];
        int nr;
        const char *msg;
    } cases[] = {
        {{{0, 4, true}, {5, 5, false}}, 2, "[4, 5) are in no range"},
        {{{0, 6, true}, {5, 5, false}}, 2, "overlaps"},
        {{{0, 4, true}, {4, 4, false}}, 2, "[8, 10) are in no range"},
        {{{0, 10, true}, {9, 5, false}}, 2, "goes past the 10 parameters"},
        {{{1, 9, true}}, 1, "[0, 1) are in no range"},
        {{{0, 10, true}, {3, 0, true}, {SIZE_MAX, 2, true}}, 3, "goes past"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ab_optim *o = NULL;
        ab_clear_error();
        cr_assert_eq(ab_optim_create(&c, 10, cases[k].r, cases[k].nr, &o), AB_EINVAL, "case %zu accepted", k);
        cr_assert(strstr(ab_error(), cases[k].msg), "case %zu: '%s' lacks '%s'", k, ab_error(), cases[k].msg);
    }
    ab_optim *o = NULL;
    cr_assert_eq(ab_optim_create(&c, 0, NULL, 0, &o), AB_EINVAL);
    cr_assert(strstr(ab_error(), "no parameters"), "%s", ab_error());
    const ab_optim_range one = {0, 10, true};
    cr_assert_eq(ab_optim_create(&c, 10, NULL, 2, &o), AB_EINVAL);
    cr_assert_eq(ab_optim_create(&c, 10, &one, 0, &o), AB_EINVAL);
    cr_assert_eq(ab_optim_create(&c, 10, &one, -1, &o), AB_EINVAL);
    /* Empty ranges anywhere are fine. */
    const ab_optim_range ok[4] = {{5, 0, false}, {0, 5, true}, {10, 0, true}, {5, 5, false}};
    cr_assert_eq(ab_optim_create(&c, 10, ok, 4, &o), 0, "%s", ab_error());
    ab_optim_destroy(o);
}

/* ---- JSON ---- */

static json_t *parse(const char *text) {
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    cr_assert_not_null(j, "test JSON: %s", err.text);
    return j;
}

Test(json, full_example) {
    json_t *j = parse("{\"kind\": \"radam\", \"lr\": 1e-3, \"weight_decay\": 0, \"clip_norm\": 1.0,"
                      " \"schedule\": {\"milestones\": [3000], \"gamma\": 0.1, \"warmup\": 0}}");
    ab_optim_config c;
    cr_assert_eq(ab_optim_config_from_json(j, "optim", &c), 0, "%s", ab_error());
    cr_assert_eq(c.kind, AB_OPTIM_RADAM);
    cr_assert_eq(c.lr, 1e-3);
    cr_assert_eq(c.weight_decay, 0.0);
    cr_assert_eq(c.clip_norm, 1.0);
    cr_assert_eq(c.n_milestones, 1);
    cr_assert_eq(c.milestones[0], 3000);
    cr_assert_eq(c.gamma, 0.1);
    cr_assert_eq(c.warmup, 0);
    cr_assert_eq(c.beta1, 0.9);
    cr_assert_eq(c.beta2, 0.999);
    cr_assert_eq(c.eps, 1e-8);
    cr_assert(c.decoupled_decay);
    json_decref(j);

    /* Every field through to_json and back. */
    c.kind = AB_OPTIM_ADAM;
    c.lr = 1.0 / 3.0;
    c.beta1 = 0.85;
    c.decoupled_decay = false;
    c.weight_decay = 0.01;
    c.rectify_threshold = 6.5;
    c.n_milestones = 3;
    c.milestones[1] = 4000;
    c.milestones[2] = 5000;
    c.warmup = 100;
    j = ab_optim_config_to_json(&c);
    cr_assert_not_null(j);
    char *text = json_dumps(j, 0);
    json_decref(j);
    j = parse(text);
    free(text);
    ab_optim_config d;
    cr_assert_eq(ab_optim_config_from_json(j, "", &d), 0, "%s", ab_error());
    cr_assert_eq(memcmp(&c, &d, offsetof(ab_optim_config, milestones)), 0, "round trip differs");
    cr_assert_eq(memcmp(c.milestones, d.milestones, 3 * sizeof(long long)), 0);
    cr_assert_eq(c.gamma, d.gamma);
    cr_assert_eq(c.warmup, d.warmup);
    json_decref(j);

    /* An empty object gives the defaults. */
    j = parse("{}");
    cr_assert_eq(ab_optim_config_from_json(j, "optim", &d), 0);
    ab_optim_config def;
    ab_optim_config_default(&def);
    cr_assert_eq(memcmp(&d, &def, sizeof d), 0);
    json_decref(j);
}

Test(json, bad_configs_name_the_key) {
    struct {
        const char *json;
        const char *msg;
    } cases[] = {
        {"{\"kind\": \"sgd\"}", "'optim.kind' = 'sgd' is not an optimiser"},
        {"{\"kind\": 1}", "'optim.kind' must be a string"},
        {"{\"lr\": -0.001}", "'optim.lr'"},
        {"{\"lr\": \"fast\"}", "'optim.lr' must be a number"},
        {"{\"learning_rate\": 0.001}", "unknown key 'optim.learning_rate'"},
        {"{\"beta1\": 1}", "'optim.beta1' = 1 must be in [0, 1)"},
        {"{\"beta2\": 1.5}", "'optim.beta2'"},
        {"{\"eps\": 0}", "'optim.eps'"},
        {"{\"weight_decay\": -1}", "'optim.weight_decay'"},
        {"{\"decoupled_weight_decay\": 1}", "'optim.decoupled_weight_decay' must be true or false"},
        {"{\"clip_norm\": -2}", "'optim.clip_norm'"},
        {"{\"clip_norm\": null}", "'optim.clip_norm' must be a number"},
        {"{\"rectify_threshold\": 3}", "'optim.rectify_threshold'"},
        {"{\"schedule\": 5}", "'optim.schedule' must be an object"},
        {"{\"schedule\": {\"step\": 5}}", "unknown key 'optim.schedule.step'"},
        {"{\"schedule\": {\"milestones\": 3000}}", "'optim.schedule.milestones' must be a list"},
        {"{\"schedule\": {\"milestones\": [3000, 100]}}", "'optim.schedule.milestones' entry 1 = 100"},
        {"{\"schedule\": {\"milestones\": [0]}}", "'optim.schedule.milestones' entry 0 = 0"},
        {"{\"schedule\": {\"milestones\": [1.5]}}", "'optim.schedule.milestones' entry 0 must be an integer"},
        {"{\"schedule\": {\"gamma\": 0}}", "'optim.schedule.gamma'"},
        {"{\"schedule\": {\"warmup\": -5}}", "'optim.schedule.warmup' = -5 must be >= 0"},
        {"{\"schedule\": {\"warmup\": 2.5}}", "'optim.schedule.warmup' must be an integer"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        json_t *j = parse(cases[k].json);
        ab_optim_config c;
        ab_optim_config_default(&c);
        c.lr = 42; /* untouched on failure */
        ab_clear_error();
        cr_assert_eq(ab_optim_config_from_json(j, "optim", &c), AB_EINVAL, "%s accepted", cases[k].json);
        cr_assert(strstr(ab_error(), cases[k].msg), "%s: message '%s' lacks \"%s\"", cases[k].json, ab_error(),
                  cases[k].msg);
        cr_assert_eq(c.lr, 42.0);
        json_decref(j);
    }
    /* At the root the key is named without a prefix; a non-object is refused. */
    json_t *j = parse("{\"lr\": -1}");
    ab_optim_config c;
    cr_assert_eq(ab_optim_config_from_json(j, "", &c), AB_EINVAL);
    cr_assert(strstr(ab_error(), "'lr'"), "%s", ab_error());
    json_decref(j);
    j = json_integer(3);
    cr_assert_eq(ab_optim_config_from_json(j, "optim", &c), AB_EINVAL);
    cr_assert(strstr(ab_error(), "'optim' must be an object"), "%s", ab_error());
    json_decref(j);
}
