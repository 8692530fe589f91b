/* models/transformer with the discretised logistic mixture head
 * (TF_HEAD_LOGISTIC_MIXTURE): against the reference model scored by
 * tests/reference/ref_mixture.c, every gradient by finite differences, and a tiny model
 * that learns with it. TEST_VERBOSE=1 prints the measured errors. */
#include <criterion/criterion.h>

#include "error.h"
#include "optim.h"
#include "ref_mixture.h"
#include "ref_model.h"
#include "rng.h"
#include "test_model_util.h"
#include "test_util.h"
#include "transformer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tf_config mixture_config(const char *variant, int K) {
    tf_config c = tm_tiny_config(variant);
    c.head = TF_HEAD_LOGISTIC_MIXTURE;
    c.mixtures = K;
    c.classes = 256;
    return c;
}

/* the reference model's 3K outputs per position, scored by ref_mixture_nll */
static void mixture_loss_fn(void *c_, double *out) {
    tm_model_ctx *c = c_;
    ref_params rp = tm_ref_params(c->m, c->pd);
    double *logits = tu_alloc_d((size_t)c->B * c->N * c->rc.V);
    ref_model_logits(&c->rc, &rp, c->tokens, c->B, c->N, c->lengths, logits);
    out[0] = ref_mixture_nll(logits, c->targets, c->weights, c->B * c->N, c->rc.V / 3, NULL);
    free(logits);
}

/* The tiny transformer with K = 3 components against the reference model scored by
 * ref_mixture_nll: the head's table (9 outputs), logits, loss and statistics, and
 * every gradient against finite differences of the reference loss, with the
 * tolerances of the categorical head above (the mixture adds double arithmetic;
 * measured: logits 1.8e-7, loss 1.2e-8, gradients <= 7.5e-7 per tensor). */
Test(model, tiny_logistic_mixture_head) {
    tf_config c = mixture_config("linear", 3);
    const int B = 2, N = 6, K = 9;
    tf_model *m = tm_make(&c, B);
    cr_assert_eq(tf_classes(m), K);
    cr_assert_eq(tf_target_classes(m), 256);
    const tf_tensor *hw = tm_find_param(m, "head.w"), *hb = tm_find_param(m, "head.b");
    cr_assert(hw && hb);
    cr_expect_eq(hw->shape[0], K);
    cr_expect_eq(hw->shape[1], c.d_model);
    cr_expect_eq(hb->count, (size_t)K);
    size_t counted_for = 0;
    cr_assert_eq(tf_param_count_for(&c, &counted_for), 0, "%s", ab_error());
    cr_expect_eq(counted_for, tf_param_count(m));
    const size_t np = tf_param_count(m);
    float *params = tf_params(m);
    for (size_t i = 0; i < np; i++) params[i] += (float)(0.2 * ab_rng_normal(81, 900, i));
    int tokens[12], targets[12];
    float weights[12];
    tu_fill_int(tokens, 12, 81, 1, 0, c.vocab - 1);
    tu_fill_int(targets, 12, 81, 2, 0, 255);
    targets[0] = 0;
    targets[7] = 255;
    for (int i = 0; i < 12; i++) weights[i] = (float)(i % 3) * 0.5f + 0.25f;
    weights[4] = 0.0f;
    targets[4] = -7; /* unscored: never read */
    cr_assert_eq(tf_forward(m, tokens, B, N, NULL, true, 77), 0, "%s", ab_error());
    /* the most probable value of position 9 as its target: one correct position */
    targets[9] = mixture_mode(tf_logits(m) + 9 * K, 3);
    ce_stats st;
    cr_assert_eq(tf_loss(m, targets, weights, &st), 0, "%s", ab_error());
    cr_assert_eq(tf_backward(m), 0, "%s", ab_error());
    cr_expect_eq(st.counted, 11);
    long long correct = 0;
    for (int i = 0; i < 12; i++) correct += weights[i] > 0 && mixture_mode(tf_logits(m) + i * K, 3) == targets[i];
    cr_expect_eq(st.correct, correct);
    cr_expect_geq(st.correct, 1);

    tm_model_ctx ctx = {m, tm_ref_cfg(&c), tu_to_double(params, np), tokens, targets, NULL, NULL, 0, NULL, B, N};
    ctx.rc.V = K;
    ctx.weights = tu_to_double(weights, 12);
    ref_params rp = tm_ref_params(m, ctx.pd);
    double *logits = tu_alloc_d((size_t)B * N * K);
    ref_model_logits(&ctx.rc, &rp, tokens, B, N, NULL, logits);
    double le = tu_rel_err(tf_logits(m), logits, (size_t)B * N * K, 1e-30), want;
    mixture_loss_fn(&ctx, &want);
    double lerr = fabs(st.loss - want) / fabs(want);
    if (tu_verbose()) fprintf(stderr, "mixture head: logits err %.3g, loss err %.3g\n", le, lerr);
    cr_expect_lt(le, MODEL_FWD_TOL, "logits err %g", le);
    cr_expect_lt(lerr, MODEL_FWD_TOL, "loss %g vs reference %g", st.loss, want);
    double *fd = tu_alloc_d(np), one = 1.0, worst = 0;
    tu_fd_grad(mixture_loss_fn, &ctx, ctx.pd, np, &one, 1, FD_STEP, fd);
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        double e = tu_rel_err(tf_grads(m) + t->offset, fd + t->offset, t->count, 1e-30);
        worst = fmax(worst, e);
        cr_expect_lt(e, MODEL_GRAD_TOL, "gradient of %s: err %g", t->name, e);
        cr_expect_gt(tu_max_abs(fd + t->offset, t->count), 1e-6, "%s has no gradient to check", t->name);
    }
    if (tu_verbose()) fprintf(stderr, "mixture head: worst gradient err %.3g\n", worst);
    /* generation hands out the 3K outputs of the last position */
    float last[2 * 9];
    cr_assert_eq(tf_last_logits(m, tokens, B, N, 0, last), 0, "%s", ab_error());
    for (int j = 0; j < K; j++) cr_expect_eq(last[K + j], tf_logits(m)[(2 * N - 1) * K + j]);
    free(fd), free(logits), free(ctx.pd), free(ctx.weights);
    tf_destroy(m);
}

/* A model with the mixture head learns: targets a function of the input token
 * (value 40 t + 30 for token t, five values far apart), Adam (lr 3e-3) on one batch
 * through tf_forward, tf_loss, tf_backward. The loss starts near that of a broad
 * mixture (6.4 nats) and must fall below half of it in 150 steps (measured 2.3), and
 * the most probable value of most positions must be near its target (within 10 of
 * 256 values; measured for 64 of 64; exactly equal for 28). */
Test(model, logistic_mixture_head_trains) {
    tf_config c = mixture_config("linear", 4);
    c.vocab = 5;
    c.max_len = 16;
    c.d_model = 16;
    c.d_ff = 32;
    tf_model *m = tm_make(&c, 4);
    const int B = 4, N = 16;
    int tokens[64], targets[64];
    tu_fill_int(tokens, 64, 91, 1, 0, c.vocab - 1);
    for (int i = 0; i < 64; i++) targets[i] = 40 * tokens[i] + 30;
    ab_optim_config oc;
    ab_optim_config_default(&oc);
    oc.lr = 3e-3;
    ab_optim *o = NULL;
    cr_assert_eq(ab_optim_create(&oc, tf_param_count(m), NULL, 0, &o), 0, "%s", ab_error());
    ce_stats st;
    double first = 0;
    for (int s = 0; s < 150; s++) {
        cr_assert_eq(tf_zero_grad(m), 0);
        cr_assert_eq(tf_forward(m, tokens, B, N, NULL, true, (uint64_t)s), 0, "%s", ab_error());
        cr_assert_eq(tf_loss(m, targets, NULL, &st), 0, "%s", ab_error());
        cr_assert(isfinite(st.loss), "loss %g at step %d", st.loss, s);
        if (s == 0) first = st.loss;
        cr_assert_eq(tf_backward(m), 0, "%s", ab_error());
        cr_assert_eq(ab_optim_step(o, tf_params(m), tf_grads(m), NULL), 0, "%s", ab_error());
    }
    /* the last step's forward (before its update) */
    int near = 0;
    for (int i = 0; i < 64; i++) near += abs(mixture_mode(tf_logits(m) + i * 12, 4) - targets[i]) <= 10;
    if (tu_verbose())
        fprintf(stderr, "mixture training: loss %.4g -> %.4g nats, %lld of %lld exact, %d within 10\n", first,
                st.loss, st.correct, st.counted, near);
    cr_expect_gt(first, 5.0, "first loss %g", first);
    cr_expect_lt(st.loss, 0.5 * first, "loss %g -> %g after 150 steps", first, st.loss);
    cr_expect_geq(near, 48, "%d of 64 most probable values within 10 of the target", near);
    ab_optim_destroy(o);
    tf_destroy(m);
}

Test(errors, logistic_mixture_configs_and_targets) {
    tf_config c;
#define BAD(stmt, needle)                   \
    do {                                    \
        c = mixture_config("linear", 3);    \
        stmt;                               \
        tm_expect_create_error(&c, 2, needle); \
    } while (0)
    BAD(c.mixtures = 0, "model mixtures 0: the logistic_mixture head needs 1..4096 components");
    BAD(c.mixtures = -2, "model mixtures -2");
    BAD(c.mixtures = TF_MAX_MIXTURES + 1, "needs 1..4096");
    BAD(c.classes = 255, "model classes 255: the logistic_mixture head models 8-bit values (classes 256)");
    BAD(c.classes = 0, "model classes 5: the logistic_mixture head"); /* 0: the vocabulary, 5 */
    BAD((c.head = TF_HEAD_CATEGORICAL), "model mixtures 3: only the logistic_mixture head has mixture components");
#undef BAD
    cr_expect_eq(tf_head_find("logistic_mixture"), TF_HEAD_LOGISTIC_MIXTURE);
    cr_expect_str_eq(tf_head_name(TF_HEAD_LOGISTIC_MIXTURE), "logistic_mixture");
    cr_expect(strstr(tf_head_names(), "categorical, logistic_mixture"), "%s", tf_head_names());
    /* classes 0 with a vocabulary of 256 is the same as 256 */
    c = mixture_config("linear", 2);
    c.classes = 0;
    c.vocab = 256;
    tf_model *m = tm_make(&c, 1);
    cr_expect_eq(tf_classes(m), 6);
    tf_destroy(m);
    /* targets must be values 0..255 */
    c = mixture_config("linear", 2);
    m = tm_make(&c, 1);
    int tok[6] = {0, 1, 2, 3, 4, 0}, tg[6] = {0, 255, 3, 256, 1, 2};
    ce_stats st;
    cr_assert_eq(tf_forward(m, tok, 1, 6, NULL, true, 0), 0, "%s", ab_error());
    cr_expect_eq(tf_loss(m, tg, NULL, &st), AB_EINVAL);
    cr_expect(strstr(ab_error(), "target 256 at index 3 is outside [0, classes=256)"), "%s", ab_error());
    tg[3] = -1;
    cr_expect_eq(tf_loss(m, tg, NULL, &st), AB_EINVAL);
    tg[3] = 128;
    cr_expect_eq(tf_loss(m, tg, NULL, &st), 0, "%s", ab_error());
    cr_expect(isfinite(st.loss) && st.loss > 0);
    tf_destroy(m);
}
