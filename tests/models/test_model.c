/* models/transformer: the whole model against the double reference
 * (tests/reference/ref_model.c: logits, loss, and every parameter's gradient by
 * central finite differences of the reference loss; token and frame input), the
 * frames + LSTM model against the double composition of test_model_util.c (dense
 * projection, ref_lstm's stack, dense head, weighted cross-entropy: logits, loss and
 * every gradient against its exact gradient, with padding and dropout masks) and its
 * parameter table and initialisation, the size tables, the
 * initialisation scheme, dropout at model level (eval off, seeds), bit-identical
 * repeated steps, no allocation per step, generation (recurrent == recomputation,
 * greedy tokens equal), and the one-line errors of bad configs and bad calls (input
 * kinds, non-finite frames, LSTM configs, mixture configs and targets). The logistic
 * mixture head has its own suite (test_model_mixture.c).
 * TEST_VERBOSE=1 prints the measured errors. */
#include <criterion/criterion.h>

#include "error.h"
#include "lstm.h"
#include "memory.h"
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


/* ---- helpers ---- */

/* ---- the tiny model against the reference ---- */


static void ref_loss_fn(void *c_, double *out) {
    tm_model_ctx *c = c_;
    ref_params rp = tm_ref_params(c->m, c->pd);
    double *logits = tu_alloc_d((size_t)c->B * c->N * c->rc.V);
    if (c->frames) ref_model_logits_frames(&c->rc, &rp, c->frames, c->F, c->B, c->N, c->lengths, logits);
    else ref_model_logits(&c->rc, &rp, c->tokens, c->B, c->N, c->lengths, logits);
    out[0] = ref_cross_entropy(logits, c->targets, c->weights, c->B * c->N, c->rc.V);
    free(logits);
}


/* The transformer c (token or frame input, dropout 0) on B = 2, N = 6 against the
 * reference: logits, loss and every parameter's gradient. */
static void tiny_check(const tf_config *cp, const int *lengths, bool weighted, uint64_t seed, const char *what) {
    tf_config c = *cp;
    const bool frames = c.input == TF_INPUT_FRAMES;
    int B = 2, N = 6;
    tf_model *m = tm_make(&c, B);
    const int K = tf_classes(m);
    /* move every parameter off its initial value (LN gains 1, biases 0) */
    size_t np = tf_param_count(m);
    float *params = tf_params(m);
    for (size_t i = 0; i < np; i++) params[i] += (float)(0.2 * ab_rng_normal(seed, 900, i));
    int tokens[12], targets[12];
    float weights[12];
    float *fr = frames ? tu_normal((size_t)B * N * c.features, seed, 3, 1.0) : NULL;
    if (!frames) tu_fill_int(tokens, 12, seed, 1, 0, c.vocab - 1);
    tu_fill_int(targets, 12, seed, 2, 0, K - 1);
    for (int i = 0; i < 12; i++) weights[i] = weighted ? (float)(i % 3) * 0.5f + 0.25f : 1.0f;
    if (lengths)
        for (int b = 0; b < B; b++)
            for (int n = lengths[b]; n < N; n++) {
                weights[b * N + n] = 0.0f;
                targets[b * N + n] = -1; /* padding: never read */
            }
    tf_zero_grad(m);
    if (frames) cr_assert_eq(tf_forward_frames(m, fr, B, N, lengths, true, 77), 0, "%s", ab_error());
    else cr_assert_eq(tf_forward(m, tokens, B, N, lengths, true, 77), 0, "%s", ab_error());
    ce_stats st;
    cr_assert_eq(tf_loss(m, targets, weights, &st), 0, "%s", ab_error());
    cr_assert_eq(tf_backward(m), 0, "%s", ab_error());

    tm_model_ctx ctx = {m, tm_ref_cfg(&c), tu_to_double(params, np), tokens, targets, lengths, NULL, c.features, NULL, B, N};
    ctx.rc.V = K; /* the head's outputs */
    ctx.weights = tu_to_double(weights, 12);
    if (frames) ctx.frames = tu_to_double(fr, (size_t)B * N * c.features);
    ref_params rp = tm_ref_params(m, ctx.pd);
    double *logits = tu_alloc_d((size_t)B * N * K);
    if (frames) ref_model_logits_frames(&ctx.rc, &rp, ctx.frames, c.features, B, N, lengths, logits);
    else ref_model_logits(&ctx.rc, &rp, tokens, B, N, lengths, logits);
    double le = tu_rel_err(tf_logits(m), logits, (size_t)B * N * K, 1e-30);
    double want;
    ref_loss_fn(&ctx, &want);
    double lerr = fabs(st.loss - want) / fabs(want);
    if (tu_verbose()) fprintf(stderr, "%s: logits err %.3g, loss err %.3g\n", what, le, lerr);
    cr_expect_lt(le, MODEL_FWD_TOL, "%s: logits err %g", what, le);
    cr_expect_lt(lerr, MODEL_FWD_TOL, "%s: loss %g vs reference %g", what, st.loss, want);

    double *fd = tu_alloc_d(np), one = 1.0;
    tu_fd_grad(ref_loss_fn, &ctx, ctx.pd, np, &one, 1, FD_STEP, fd);
    const float *grads = tf_grads(m);
    double worst = 0;
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        double e = tu_rel_err(grads + t->offset, fd + t->offset, t->count, 1e-30);
        worst = fmax(worst, e);
        cr_expect_lt(e, MODEL_GRAD_TOL, "%s: gradient of %s: err %g (max %g)", what, t->name, e,
                     tu_max_abs(fd + t->offset, t->count));
        /* a gradient that is zero everywhere would pass a relative check vacuously */
        cr_expect_gt(tu_max_abs(fd + t->offset, t->count), 1e-6, "%s: %s has no gradient to check", what, t->name);
    }
    if (tu_verbose()) fprintf(stderr, "%s: worst gradient err %.3g\n", what, worst);
    free(fd);
    free(logits);
    free(ctx.pd);
    free(ctx.weights);
    free((double *)ctx.frames);
    free(fr);
    tf_destroy(m);
}

static void tiny_case(const char *variant, bool pre_norm, bool final_norm, bool causal, const int *lengths,
                      bool weighted, uint64_t seed) {
    tf_config c = tm_tiny_config(variant);
    c.pre_norm = pre_norm;
    c.final_norm = final_norm;
    c.causal = causal;
    char what[160];
    snprintf(what, sizeof what, "%s pre_norm=%d final_norm=%d causal=%d lengths=%d weighted=%d", variant, pre_norm,
             final_norm, causal, lengths != NULL, weighted);
    tiny_check(&c, lengths, weighted, seed, what);
}

Test(model, tiny_softmax_post_norm) { tiny_case("softmax", false, true, true, NULL, false, 11); }
Test(model, tiny_linear_post_norm_padded) {
    int lens[2] = {6, 4};
    tiny_case("linear", false, true, true, lens, true, 12);
}
Test(model, tiny_softmax_pre_norm_bidirectional) {
    int lens[2] = {3, 6};
    tiny_case("softmax", true, true, false, lens, true, 13);
}
Test(model, tiny_linear_pre_norm_no_final_norm) { tiny_case("linear", true, false, true, NULL, true, 14); }
Test(model, tiny_stateful_softmax_post_norm_no_final_norm) {
    tiny_case("stateful-softmax", false, false, true, NULL, false, 15);
}

/* Frame input into the transformer (non-causal, as a frame classifier would be): the
 * dense projection F = 3 -> C plus positions in place of the embedding. */
static void frames_transformer_case(const char *variant, bool pre_norm, const int *lengths, uint64_t seed) {
    tf_config c = tm_tiny_config(variant);
    c.input = TF_INPUT_FRAMES;
    c.features = 3;
    c.classes = 4;
    c.causal = false;
    c.pre_norm = pre_norm;
    char what[160];
    snprintf(what, sizeof what, "frames F=3 -> %s pre_norm=%d non-causal lengths=%d", variant, pre_norm,
             lengths != NULL);
    tiny_check(&c, lengths, true, seed, what);
}

Test(model, tiny_frames_softmax_post_norm_padded) {
    int lens[2] = {6, 4};
    frames_transformer_case("softmax", false, lens, 16);
}
Test(model, tiny_frames_linear_pre_norm) { frames_transformer_case("linear", true, NULL, 17); }

/* linformer (non-causal, k = 3 projections of the model's max_len 9 columns, run at
 * N = 6: the first 6 columns): its projections are parameters of the model, so the
 * finite differences above check their gradient too, per layer (none, kv: one matrix)
 * or one block summed over both layers (layer). The parameter table holds them as
 * layers.L.attn.proj or attn.proj, decayed as the other weight matrices. */
static void linformer_case(const char *share, bool pre_norm, const int *lengths, uint64_t seed) {
    tf_config c = tm_tiny_config("linformer");
    char sh[32];
    snprintf(sh, sizeof sh, "share=%s", share);
    const char *set[] = {"k=3", sh};
    c.attn_settings = set;
    c.n_attn_settings = 2;
    c.causal = false;
    c.pre_norm = pre_norm;
    c.max_len = 9;
    tf_model *m = tm_make(&c, 2);
    const bool layer = strcmp(share, "layer") == 0;
    const size_t per = strcmp(share, "none") == 0 ? 2 * 3 * 9 : 3 * 9;
    const tf_tensor *l0 = tm_find_param(m, "layers.0.attn.proj"), *l1 = tm_find_param(m, "layers.1.attn.proj");
    const tf_tensor *all = tm_find_param(m, "attn.proj");
    if (layer) {
        cr_assert(!l0 && !l1 && all && all->count == per && all->decay, "share=layer: one attn.proj of %zu", per);
    } else {
        cr_assert(l0 && l1 && !all && l0->count == per && l1->count == per && l0->decay, "per layer: %zu each", per);
    }
    size_t plain;
    tf_config cl = tm_tiny_config("linear");
    cl.max_len = 9;
    cr_assert_eq(tf_param_count_for(&cl, &plain), 0);
    cr_assert_eq(tf_param_count(m), plain + (layer ? per : 2 * per), "the projections and nothing else added");
    size_t counted;
    cr_assert_eq(tf_param_count_for(&c, &counted), 0, "%s", ab_error());
    cr_assert_eq(counted, tf_param_count(m));
    tf_destroy(m);
    char what[96];
    snprintf(what, sizeof what, "linformer share=%s pre_norm=%d lengths=%d", share, pre_norm, lengths != NULL);
    tiny_check(&c, lengths, false, seed, what);
}

Test(model, tiny_linformer_none_padded) {
    int lengths[2] = {6, 4};
    linformer_case("none", false, lengths, 18);
}
Test(model, tiny_linformer_kv_pre_norm) { linformer_case("kv", true, NULL, 19); }
Test(model, tiny_linformer_layer_padded) {
    int lengths[2] = {3, 6};
    linformer_case("layer", false, lengths, 20);
}

/* ---- frame input and the LSTM body against the reference ---- */

/* The frames + LSTM model (tm_tiny_lstm_config: F = 3, C = 4, H = 3, 2 layers) against
 * the double composition of test_model_util.c (ref_dense, ref_lstm, ref_dense,
 * weighted cross-entropy) with its EXACT gradient (back-propagation through the head,
 * ref_lstm_backward and the input projection), so the float gradients are judged
 * against exact values rather than differences.
 *
 * Forward: the projection (3 products), two or three LSTM layers (test_lstm.c
 * measures <= 2.5e-7 for the stack alone) and the head (<= 6 products), each in
 * float32: measured <= 1.4e-7 (logits, tensor-relative) and <= 6.1e-9 (loss,
 * relative); 1e-5 is a 70x margin, while a wrong gate order, a missed padding row or
 * a wrong mask gives 1e-2 and more.
 * Gradients: the float backward chain (head, BPTT through <= 6 steps of each layer,
 * dropout, the projection) against the exact double gradient: measured <= 6.7e-7 per
 * tensor; 1e-5 (test_lstm.c's BWD_TOL) leaves a 15x margin, while a missing term is
 * 1e-2 or more.
 * The reference's own gradient against central differences of its loss (h = 1e-5), so
 * that the composition (the cross-entropy's gradient, the two dense layers, the masks
 * inside ref_lstm) is itself checked: the differences carry an absolute rounding
 * error of ~1e-15 (the loss's) / 2h ~ 1e-10, and the smallest tensors' gradients
 * (dweight_hh of layer 0) are only ~6e-4 at their largest, so the tensor-relative
 * figure reaches 7.7e-8 (measured); 1e-6 leaves 13x, while any wrong term of the
 * hand-written gradient gives 1e-3 and more. */
#define LSTM_MODEL_FWD_TOL 1e-5
#define LSTM_MODEL_GRAD_TOL 1e-5
#define LSTM_REF_FD_TOL 1e-6

static const tf_tensor *find_act(const tf_model *m, const char *name) {
    for (int i = 0; i < tf_act_tensor_count(m); i++)
        if (strcmp(tf_act_tensor(m, i)->name, name) == 0) return tf_act_tensor(m, i);
    return NULL;
}

typedef struct {
    tm_ref_lstm r;
    const double *frames, *weights;
    const int *targets, *lengths;
    const ref_lstm_drop *drop;
    int B, N;
} lstm_ctx;

static void lstm_ref_loss_fn(void *c_, double *out) {
    lstm_ctx *c = c_;
    out[0] = tm_ref_lstm_loss(&c->r, c->frames, c->B, c->N, c->lengths, c->drop, c->targets, c->weights, NULL);
}

/* B = 3, N = 6 (the model carved for 4 x 7, so the call runs on the first rows of
 * every buffer), training or not with dropout masks from step seed `seed + 1000`. */
static void lstm_case(const tf_config *cp, const int *lengths, bool train, uint64_t seed) {
    tf_config c = *cp;
    const int B = 3, N = 6, F = c.features, L = c.layers;
    tf_model *m = tm_make(&c, B + 1);
    const int K = tf_classes(m), DH = (c.bidirectional ? 2 : 1) * c.lstm_hidden;
    const size_t np = tf_param_count(m), BT = (size_t)B * N;
    float *params = tf_params(m);
    for (size_t i = 0; i < np; i++) params[i] += (float)(0.2 * ab_rng_normal(seed, 900, i));
    float *fr = tu_normal(BT * F, seed, 1, 1.0);
    int targets[18];
    float weights[18];
    tu_fill_int(targets, BT, seed, 2, 0, K - 1);
    for (size_t i = 0; i < BT; i++) weights[i] = (float)(i % 3) * 0.5f + 0.25f;
    for (int b = 0; lengths && b < B; b++)
        for (int n = lengths[b]; n < N; n++) {
            weights[b * N + n] = 0.0f;
            targets[b * N + n] = -1; /* padding: never read */
        }
    const uint64_t dseed = seed + 1000;
    cr_assert_eq(tf_zero_grad(m), 0);
    cr_assert_eq(tf_forward_frames(m, fr, B, N, lengths, train, dseed), 0, "%s", ab_error());
    ce_stats st;
    cr_assert_eq(tf_loss(m, targets, weights, &st), 0, "%s", ab_error());
    cr_assert_eq(tf_backward(m), 0, "%s", ab_error());

    char what[160];
    int k = snprintf(what, sizeof what, "frames -> lstm L=%d %s causal=%d p=%g train=%d lengths", L,
                     c.bidirectional ? "bi" : "uni", c.causal, (double)c.dropout, train);
    for (int b = 0; lengths && b < B && k < (int)sizeof what; b++)
        k += snprintf(what + k, sizeof what - (size_t)k, " %d", lengths[b]);
    if (!lengths) snprintf(what + k, sizeof what - (size_t)k, " none");

    /* the masks the reference applies: layers.h's rule on the documented streams (layer
     * l's output: TF_STREAM_DROPOUT + 4 l), and the model's own masks are those */
    const bool drop = train && c.dropout > 0 && L > 1;
    uint8_t *masks[REF_LSTM_MAX_LAYERS] = {0};
    for (int l = 0; drop && l < L - 1; l++) {
        masks[l] = malloc(BT * DH);
        dropout_mask(masks[l], BT * DH, c.dropout, dseed, TF_STREAM_DROPOUT + 4 * (uint64_t)l);
        char name[64];
        snprintf(name, sizeof name, "lstm.l%d.drop_mask", l);
        const tf_tensor *t = find_act(m, name);
        cr_assert_not_null(t, "%s: no activation %s", what, name);
        cr_assert_geq(t->count, BT * DH);
        cr_expect(memcmp((char *)tf_acts(m) + t->offset, masks[l], BT * DH) == 0, "%s: %s is not the documented mask",
                  what, name);
        size_t kept = 0;
        for (size_t i = 0; i < BT * DH; i++) kept += masks[l][i];
        cr_assert(kept > 0 && kept < BT * DH, "%s: a mask keeps %zu of %zu: nothing to test", what, kept, BT * DH);
    }
    ref_lstm_drop rd = {(const uint8_t *const *)masks, c.dropout};

    double *pd = tu_to_double(params, np), *gd = tu_alloc_d(np);
    lstm_ctx ctx = {tm_ref_lstm_view(m, pd), NULL, NULL, targets, lengths, drop ? &rd : NULL, B, N};
    tm_ref_lstm gv = tm_ref_lstm_view(m, gd);
    ctx.frames = tu_to_double(fr, BT * F);
    ctx.weights = tu_to_double(weights, BT);
    double *logits = tu_alloc_d(BT * K);
    tm_ref_lstm_logits(&ctx.r, ctx.frames, B, N, lengths, ctx.drop, logits);
    double want = tm_ref_lstm_loss(&ctx.r, ctx.frames, B, N, lengths, ctx.drop, targets, ctx.weights, &gv);
    double le = tu_rel_err(tf_logits(m), logits, BT * K, 1e-30), lerr = fabs(st.loss - want) / fabs(want);
    if (tu_verbose()) fprintf(stderr, "%s: logits err %.3g, loss err %.3g\n", what, le, lerr);
    cr_expect_lt(le, LSTM_MODEL_FWD_TOL, "%s: logits err %g", what, le);
    cr_expect_lt(lerr, LSTM_MODEL_FWD_TOL, "%s: loss %.9g vs reference %.9g", what, st.loss, want);
    /* padding positions: the LSTM's output there is 0, so their logits are the head's bias */
    const tf_tensor *hb = tm_find_param(m, "head.b");
    cr_assert_not_null(hb);
    for (int b = 0; lengths && b < B; b++)
        for (int n = lengths[b]; n < N; n++)
            for (int q = 0; q < K; q++)
                cr_expect_eq(tf_logits(m)[((size_t)b * N + n) * K + q], params[hb->offset + q],
                             "%s: logit (%d, %d, %d) at padding is not the head's bias", what, b, n, q);

    /* every gradient against the exact one */
    const float *grads = tf_grads(m);
    double worst = 0;
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        double e = tu_rel_err(grads + t->offset, gd + t->offset, t->count, 1e-30);
        worst = fmax(worst, e);
        if (tu_verbose()) fprintf(stderr, "%s: d%s err %.3g\n", what, t->name, e);
        cr_expect_lt(e, LSTM_MODEL_GRAD_TOL, "%s: gradient of %s: err %g (max %g)", what, t->name, e,
                     tu_max_abs(gd + t->offset, t->count));
        cr_expect_gt(tu_max_abs(gd + t->offset, t->count), 1e-4, "%s: %s has no gradient to check", what, t->name);
    }
    if (tu_verbose()) fprintf(stderr, "%s: worst gradient err %.3g\n", what, worst);

    /* the reference's gradient against central differences of its own loss */
    double *fd = tu_alloc_d(np), one = 1.0, fd_worst = 0;
    tu_fd_grad(lstm_ref_loss_fn, &ctx, pd, np, &one, 1, FD_STEP, fd);
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        /* tu_rel_err takes a float result: the same figure in double by hand */
        double mx = tu_max_abs(fd + t->offset, t->count), e = 0;
        for (size_t j = 0; j < t->count; j++) e = fmax(e, fabs(gd[t->offset + j] - fd[t->offset + j]));
        e /= mx > 1e-30 ? mx : 1e-30;
        fd_worst = fmax(fd_worst, e);
        if (tu_verbose()) fprintf(stderr, "%s: reference d%s vs differences %.3g (max %.3g)\n", what, t->name, e, mx);
        cr_expect_lt(e, LSTM_REF_FD_TOL, "%s: the reference's gradient of %s against differences: err %g", what,
                     t->name, e);
    }
    if (tu_verbose()) fprintf(stderr, "%s: reference vs differences worst %.3g\n", what, fd_worst);

    for (int l = 0; l < L; l++) free(masks[l]);
    free(fd), free(logits), free(pd), free(gd), free((double *)ctx.frames), free((double *)ctx.weights), free(fr);
    tf_destroy(m);
}

Test(model, lstm_frames_bidirectional_padded) {
    tf_config c = tm_tiny_lstm_config();
    int lens[3] = {6, 4, 1};
    lstm_case(&c, lens, true, 21);
}

Test(model, lstm_frames_bidirectional_dropout_train) {
    tf_config c = tm_tiny_lstm_config();
    c.dropout = 0.3f;
    int lens[3] = {5, 6, 0};
    lstm_case(&c, lens, true, 22);
    lstm_case(&c, NULL, true, 23);
}

/* evaluation: dropout > 0 in the config but no masks (the reference without dropout) */
Test(model, lstm_frames_dropout_eval) {
    tf_config c = tm_tiny_lstm_config();
    c.dropout = 0.3f;
    int lens[3] = {3, 6, 2};
    lstm_case(&c, lens, false, 24);
}

/* a causal model: one direction, 3 layers */
Test(model, lstm_frames_unidirectional_causal) {
    tf_config c = tm_tiny_lstm_config();
    c.bidirectional = false;
    c.causal = true;
    c.layers = 3;
    c.dropout = 0.2f;
    int lens[3] = {6, 2, 4};
    lstm_case(&c, lens, true, 25);
}

/* The parameter table of the frames + LSTM model: PyTorch's names in carve order,
 * shapes, decay flags, and the initialisation: tensor i, element j is
 * (2 ab_rng_uniform(seed, TF_STREAM_INIT + i, j) - 1) * bound with bound 1/sqrt(H) for
 * the LSTM's tensors and 1/sqrt(fan_in) for the dense ones (F for in.*, D H for
 * head.*), and so within +-bound. */
Test(model, lstm_parameter_table_and_init) {
    for (int bi = 1; bi >= 0; bi--) {
        tf_config c = tm_tiny_lstm_config();
        c.bidirectional = bi;
        c.causal = !bi;
        c.seed = 4321;
        tf_model *m = tm_make(&c, 2), *m2 = tm_make(&c, 3);
        const int F = 3, C = 4, H = 3, K = 4, D = bi ? 2 : 1, G = 4 * H;
        typedef struct {
            char name[48];
            int ndim;
            int64_t d0, d1;
            bool decay;
            double bound;
        } want_t;
        want_t want[32];
        int n = 0;
        want[n++] = (want_t){"in.w", 2, C, F, true, 1 / sqrt(F)};
        want[n++] = (want_t){"in.b", 1, C, 0, false, 1 / sqrt(F)};
        for (int l = 0; l < 2; l++)
            for (int d = 0; d < D; d++) {
                const char *sfx = d ? "_reverse" : "";
                want[n] = (want_t){"", 2, G, l == 0 ? C : D * H, true, 1 / sqrt(H)};
                snprintf(want[n++].name, 48, "lstm.weight_ih_l%d%s", l, sfx);
                want[n] = (want_t){"", 2, G, H, true, 1 / sqrt(H)};
                snprintf(want[n++].name, 48, "lstm.weight_hh_l%d%s", l, sfx);
                want[n] = (want_t){"", 1, G, 0, false, 1 / sqrt(H)};
                snprintf(want[n++].name, 48, "lstm.bias_l%d%s", l, sfx);
            }
        want[n++] = (want_t){"head.w", 2, K, D * H, true, 1 / sqrt(D * H)};
        want[n++] = (want_t){"head.b", 1, K, 0, false, 1 / sqrt(D * H)};
        cr_assert_eq(tf_param_tensor_count(m), n, "bi=%d: %d tensors, expected %d", bi, tf_param_tensor_count(m), n);
        cr_assert_eq(tf_classes(m), K);
        /* same seed, same parameters, whatever the max batch */
        cr_assert(memcmp(tf_params(m), tf_params(m2), sizeof(float) * tf_param_count(m)) == 0);
        const float *p = tf_params(m);
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            const tf_tensor *t = tf_param_tensor(m, i);
            cr_assert_str_eq(t->name, want[i].name, "tensor %d", i);
            cr_assert_eq(t->ndim, want[i].ndim, "%s", t->name);
            cr_assert_eq(t->shape[0], want[i].d0, "%s: shape[0] %lld", t->name, (long long)t->shape[0]);
            if (t->ndim == 2) cr_assert_eq(t->shape[1], want[i].d1, "%s: shape[1] %lld", t->name, (long long)t->shape[1]);
            size_t count = (size_t)want[i].d0 * (size_t)(t->ndim == 2 ? want[i].d1 : 1);
            cr_assert_eq(t->count, count, "%s: count %zu", t->name, t->count);
            cr_assert_eq(t->offset, off, "%s: not contiguous", t->name);
            cr_assert_eq(t->decay, want[i].decay, "%s: decay flag %d", t->name, t->decay);
            off += t->count;
            double bound = want[i].bound, top = 0;
            for (size_t j = 0; j < t->count; j++) {
                float v = p[t->offset + j];
                double w = (2.0 * ab_rng_uniform(4321, TF_STREAM_INIT + (uint64_t)i, j) - 1.0) * bound;
                cr_assert_eq(v, (float)w, "%s[%zu] = %g, expected %g", t->name, j, (double)v, w);
                cr_assert_leq(fabs(v), (float)bound, "%s[%zu] = %g outside +-%g", t->name, j, (double)v, bound);
                top = fmax(top, fabs(v));
            }
            /* the draws fill the range: not a smaller bound */
            if (t->count >= 12) cr_expect_gt(top, 0.6 * bound, "%s: largest |value| %g of bound %g", t->name, top, bound);
        }
        cr_assert_eq(off, tf_param_count(m));
        cr_assert_null(tf_param_tensor(m, n));
        /* the activations: no positions table (the LSTM needs none), no masks without
         * dropout; 64-byte aligned, in order, inside the block */
        const tf_tensor *pos = find_act(m, "positions");
        cr_assert(pos == NULL || pos->count == 0, "an LSTM model carries a positions table");
        size_t end = 0;
        for (int i = 0; i < tf_act_tensor_count(m); i++) {
            const tf_tensor *t = tf_act_tensor(m, i);
            cr_assert_eq(t->offset % 64, 0, "%s not aligned", t->name);
            cr_assert_geq(t->offset, end, "%s overlaps the previous tensor", t->name);
            end = t->offset + t->count * t->elem_size;
            cr_assert(!strstr(t->name, "mask") || t->count == 0, "%s carved without dropout", t->name);
        }
        cr_assert_leq(end, tf_act_bytes(m));
        tf_destroy(m);
        tf_destroy(m2);
        /* with dropout: one mask per layer but the last, for the carved maxima */
        c.dropout = 0.25f;
        m = tm_make(&c, 2);
        const tf_tensor *mk = find_act(m, "lstm.l0.drop_mask");
        cr_assert_not_null(mk);
        cr_assert_eq(mk->count, (size_t)2 * c.max_len * D * H);
        cr_assert_null(find_act(m, "lstm.l1.drop_mask"), "the last layer has no dropout");
        tf_destroy(m);
    }
}

/* Repeats of a training step give the same bits, and steps allocate nothing. */
Test(model, lstm_frames_repeats_and_no_allocation) {
    tf_config c = tm_tiny_lstm_config();
    c.dropout = 0.3f;
    c.lstm_hidden = 5;
    tf_model *m = tm_make(&c, 4);
    const int B = 4, N = 7, F = c.features;
    float *fr = tu_normal((size_t)B * N * F, 31, 1, 1.0);
    int targets[28], lens[4] = {7, 3, 0, 5};
    tu_fill_int(targets, 28, 31, 2, 0, c.classes - 1);
    const size_t np = tf_param_count(m);
    float *g1 = tu_alloc_f(np), *l1 = tu_alloc_f((size_t)B * N * c.classes);
    ce_stats st;
    double loss[3];
    size_t before = ab_mem_current(AB_DEV_CPU);
    ab_mem_reset_peak(AB_DEV_CPU);
    for (int s = 0; s < 3; s++) {
        /* steps 0 and 2 alike; step 1 another shape and seed */
        int b = s == 1 ? 2 : B, n = s == 1 ? 5 : N;
        cr_assert_eq(tf_zero_grad(m), 0);
        cr_assert_eq(tf_forward_frames(m, fr, b, n, s == 1 ? NULL : lens, true, s == 1 ? 8 : 7), 0, "%s", ab_error());
        cr_assert_eq(tf_loss(m, targets, NULL, &st), 0, "%s", ab_error());
        cr_assert_eq(tf_backward(m), 0, "%s", ab_error());
        loss[s] = st.loss;
        if (s == 0) {
            memcpy(g1, tf_grads(m), sizeof(float) * np);
            memcpy(l1, tf_logits(m), sizeof(float) * B * N * c.classes);
        }
    }
    cr_expect_eq(ab_mem_current(AB_DEV_CPU), before, "memory changed during steps");
    cr_expect_eq(ab_mem_peak(AB_DEV_CPU), before, "a step allocated (peak %zu > %zu)", ab_mem_peak(AB_DEV_CPU), before);
    cr_expect_eq(loss[2], loss[0], "loss %.17g on a repeat, %.17g before", loss[2], loss[0]);
    cr_expect(memcmp(g1, tf_grads(m), sizeof(float) * np) == 0, "gradients differ on a repeat");
    cr_expect(memcmp(l1, tf_logits(m), sizeof(float) * B * N * c.classes) == 0, "logits differ on a repeat");
    /* another dropout seed changes the step */
    cr_assert_eq(tf_zero_grad(m), 0);
    cr_assert_eq(tf_forward_frames(m, fr, B, N, lens, true, 9), 0, "%s", ab_error());
    cr_assert_eq(tf_loss(m, targets, NULL, &st), 0, "%s", ab_error());
    cr_assert_eq(tf_backward(m), 0, "%s", ab_error());
    cr_expect(memcmp(g1, tf_grads(m), sizeof(float) * np) != 0, "the dropout seed has no effect");
    free(fr), free(g1), free(l1);
    tf_destroy(m);
}
