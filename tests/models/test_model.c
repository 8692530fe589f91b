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
#include "test_model.h"


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

/* gla and deltanet read an input of their own that the block makes from its input
 * (models/mha.h: mha_aux): gla's gate through a rank-16 pair and log(sigmoid)/16,
 * deltanet's rate through one projection and sigmoid. The projections are parameters
 * of the model (layers.L.attn.aux.w1, .w2, .b), so the finite differences above check
 * their gradient, which reaches them through the attention's dg or dbeta. */
Test(model, tiny_gla_vector_padded) {
    int lengths[2] = {6, 4};
    tiny_case("gla", false, true, true, lengths, true, 21);
}
Test(model, tiny_gla_scalar_pre_norm) {
    tf_config c = tm_tiny_config("gla");
    const char *set[] = {"gate=scalar"};
    c.attn_settings = set;
    c.n_attn_settings = 1;
    c.pre_norm = true;
    tiny_check(&c, NULL, false, 22, "gla gate=scalar pre_norm");
}
Test(model, tiny_deltanet_post_norm_padded) {
    int lengths[2] = {3, 6};
    tiny_case("deltanet", false, true, true, lengths, false, 23);
}
Test(model, tiny_deltanet_pre_norm) { tiny_case("deltanet", true, false, true, NULL, true, 24); }

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
        cr_assert_eq(tf_act_bytes(m) % 64, 0, "%zu bytes of activations: not whole 64-byte units", tf_act_bytes(m));
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

/* ---- size tables, initialisation, memory ---- */

Test(model, parameter_table) {
    tf_config c = tm_tiny_config("linear");
    tf_model *m = tm_make(&c, 2);
    size_t C = 8, F = 16, V = 5, L = 2;
    size_t per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C;
    size_t want = V * C + L * per_layer + 2 * C + V * C + V;
    cr_assert_eq(tf_param_count(m), want);
    size_t off = 0;
    const char *decayed[] = {"attn.wqkv", "attn.wo", "ffn.w1", "ffn.w2", "head.w"};
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        cr_assert_eq(t->offset, off, "%s: not contiguous", t->name);
        cr_assert_eq(t->elem_size, sizeof(float));
        size_t count = 1;
        for (int d = 0; d < t->ndim; d++) count *= (size_t)t->shape[d];
        cr_assert_eq(count, t->count, "%s: shape and count disagree", t->name);
        off += t->count;
        bool dec = false;
        for (int k = 0; k < 5; k++) {
            size_t ln = strlen(t->name), lk = strlen(decayed[k]);
            dec |= ln >= lk && strcmp(t->name + ln - lk, decayed[k]) == 0;
        }
        cr_assert_eq(t->decay, dec, "%s: decay flag %d", t->name, t->decay);
        for (int j = 0; j < i; j++) cr_assert_str_neq(t->name, tf_param_tensor(m, j)->name, "duplicate name");
    }
    cr_assert_eq(off, want);
    cr_assert_eq(strcmp(tf_param_tensor(m, 0)->name, "tok_emb"), 0);
    cr_assert_not_null(tm_find_param(m, "layers.1.ffn.w2"));
    cr_assert_null(tf_param_tensor(m, tf_param_tensor_count(m)));
    /* activations: 64-byte aligned, in order, inside the block */
    size_t end = 0;
    for (int i = 0; i < tf_act_tensor_count(m); i++) {
        const tf_tensor *t = tf_act_tensor(m, i);
        cr_assert_eq(t->offset % 64, 0, "%s not aligned", t->name);
        cr_assert_geq(t->offset, end, "%s overlaps the previous tensor", t->name);
        end = t->offset + t->count * t->elem_size;
    }
    cr_assert_leq(end, tf_act_bytes(m));
    tf_destroy(m);
    /* no final LN: two tensors fewer */
    c.final_norm = false;
    m = tm_make(&c, 2);
    cr_assert_eq(tf_param_count(m), want - 2 * C);
    cr_assert_null(tm_find_param(m, "final_ln.g"));
    tf_destroy(m);
}

Test(model, initialisation_scheme) {
    tf_config c = tm_tiny_config("linear");
    c.seed = 1234;
    tf_model *m = tm_make(&c, 1), *m2 = tm_make(&c, 3);
    /* same seed, same parameters (whatever the max batch) */
    cr_assert(memcmp(tf_params(m), tf_params(m2), sizeof(float) * tf_param_count(m)) == 0);
    const float *p = tf_params(m);
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        const char *nm = t->name;
        size_t ln = strlen(nm);
        bool is_ln = strstr(nm, "ln1.") || strstr(nm, "ln2.") || strstr(nm, "final_ln.");
        bool ln_gain = is_ln && nm[ln - 1] == 'g', ln_bias = is_ln && nm[ln - 1] == 'b';
        for (size_t j = 0; j < t->count; j++) {
            float v = p[t->offset + j];
            if (strcmp(nm, "tok_emb") == 0) {
                cr_assert_eq(v, (float)ab_rng_normal(1234, TF_STREAM_INIT + (uint64_t)i, j));
            } else if (ln_gain) {
                cr_assert_eq(v, 1.0f, "%s", nm);
            } else if (ln_bias) {
                cr_assert_eq(v, 0.0f, "%s", nm);
            } else {
                /* dense: uniform(+-1/sqrt(fan_in)); fan_in = C except ffn.w2/b2 (F) */
                double fan_in = strstr(nm, "ffn.w2") || strstr(nm, "ffn.b2") ? 16 : 8;
                double bound = 1.0 / sqrt(fan_in);
                double want = (2.0 * ab_rng_uniform(1234, TF_STREAM_INIT + (uint64_t)i, j) - 1.0) * bound;
                cr_assert_eq(v, (float)want, "%s[%zu]", nm, j);
            }
        }
    }
    /* another seed, other parameters; tf_init_params restores */
    c.seed = 1235;
    tf_model *m3 = tm_make(&c, 1);
    cr_assert(memcmp(tf_params(m), tf_params(m3), sizeof(float) * tf_param_count(m)) != 0);
    tf_init_params(m3, 1234);
    cr_assert(memcmp(tf_params(m), tf_params(m3), sizeof(float) * tf_param_count(m)) == 0);
    tf_destroy(m);
    tf_destroy(m2);
    tf_destroy(m3);
}

Test(model, step_seeds) {
    cr_assert_eq(tf_step_seed(5, 10), tf_step_seed(5, 10));
    cr_assert_neq(tf_step_seed(5, 10), tf_step_seed(5, 11));
    cr_assert_neq(tf_step_seed(5, 10), tf_step_seed(6, 10));
    cr_assert_neq(tf_attn_seed(5, 0), tf_attn_seed(5, 1));
}

/* A mid-sized model for the step-level checks. */
tf_config mid_config(const char *variant, float dropout) {
    tf_config c;
    tf_config_default(&c);
    c.vocab = 11;
    c.max_len = 40;
    c.d_model = 32;
    c.heads = 4;
    c.layers = 2;
    c.d_ff = 64;
    c.dropout = dropout;
    c.attention = variant;
    c.seed = 5;
    return c;
}

batch make_batch(int B, int N, int V, uint64_t seed) {
    batch b = {B, N, malloc(sizeof(int) * B * N), malloc(sizeof(int) * B * N), {0}, malloc(sizeof(float) * B * N)};
    tu_fill_int(b.tokens, (size_t)B * N, seed, 1, 0, V - 1);
    tu_fill_int(b.targets, (size_t)B * N, seed, 2, 0, V - 1);
    for (int i = 0; i < B; i++) {
        b.lengths[i] = N - (i * 7) % N;
        for (int n = 0; n < N; n++) b.weights[i * N + n] = n < b.lengths[i] ? 1.0f : 0.0f;
    }
    return b;
}

void free_batch(batch *b) {
    free(b->tokens);
    free(b->targets);
    free(b->weights);
}

double train_step(tf_model *m, const batch *b, uint64_t seed) {
    tf_zero_grad(m);
    cr_assert_eq(tf_forward(m, b->tokens, b->B, b->N, b->lengths, true, seed), 0, "%s", ab_error());
    ce_stats st;
    cr_assert_eq(tf_loss(m, b->targets, b->weights, &st), 0, "%s", ab_error());
    cr_assert_eq(tf_backward(m), 0, "%s", ab_error());
    return st.loss;
}

static void repeat_case(const char *variant) {
    tf_config c = mid_config(variant, 0.1f);
    tf_model *m = tm_make(&c, 4), *m2 = tm_make(&c, 4);
    batch b = make_batch(3, 33, c.vocab, 21);
    size_t np = tf_param_count(m);
    double l1 = train_step(m, &b, 99);
    float *g1 = malloc(sizeof(float) * np), *lg1 = malloc(sizeof(float) * 3 * 33 * c.vocab);
    memcpy(g1, tf_grads(m), sizeof(float) * np);
    memcpy(lg1, tf_logits(m), sizeof(float) * 3 * 33 * c.vocab);
    /* the same model again, and a second model made from the same config */
    double l2 = train_step(m, &b, 99), l3 = train_step(m2, &b, 99);
    cr_assert_eq(l1, l2, "%s: loss differs on a repeat", variant);
    cr_assert_eq(l1, l3, "%s: loss differs on a second model", variant);
    cr_assert(memcmp(g1, tf_grads(m), sizeof(float) * np) == 0, "%s: gradients differ on a repeat", variant);
    cr_assert(memcmp(g1, tf_grads(m2), sizeof(float) * np) == 0, "%s: gradients differ on a second model", variant);
    cr_assert(memcmp(lg1, tf_logits(m2), sizeof(float) * 3 * 33 * c.vocab) == 0);
    /* another seed: other dropout masks, so other gradients */
    train_step(m, &b, 100);
    cr_assert(memcmp(g1, tf_grads(m), sizeof(float) * np) != 0, "%s: the dropout seed has no effect", variant);
    /* backward accumulates: a second backward of the same forward and loss adds the
     * same gradient again. Not bit-exact: the embedding adds row by row, and GEMMs with
     * beta = 1 may add in k-blocks; float rounding of the sums is ~1e-7 relative. */
    train_step(m, &b, 99);
    ce_stats st;
    cr_assert_eq(tf_loss(m, b.targets, b.weights, &st), 0);
    cr_assert_eq(tf_backward(m), 0, "%s", ab_error());
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        double *want = tu_alloc_d(t->count);
        for (size_t j = 0; j < t->count; j++) want[j] = 2.0 * g1[t->offset + j];
        double e = tu_rel_err(tf_grads(m) + t->offset, want, t->count, 1e-30);
        cr_expect_lt(e, 1e-6, "%s: %s not accumulated (err %g)", variant, t->name, e);
        free(want);
    }
    free(g1);
    free(lg1);
    free_batch(&b);
    tf_destroy(m);
    tf_destroy(m2);
}

Test(model, bit_identical_repeats_linear) { repeat_case("linear"); }
Test(model, bit_identical_repeats_softmax) { repeat_case("softmax"); }
Test(model, bit_identical_repeats_lsh) { repeat_case("lsh"); }

Test(model, no_allocation_per_step) {
    const char *variants[3] = {"softmax", "linear", "lsh"};
    for (int v = 0; v < 3; v++) {
        tf_config c = mid_config(variants[v], 0.1f);
        tf_model *m = tm_make(&c, 4);
        batch big = make_batch(4, 40, c.vocab, 31), small = make_batch(2, 17, c.vocab, 32);
        size_t before = ab_mem_current(AB_DEV_CPU);
        ab_mem_reset_peak(AB_DEV_CPU);
        train_step(m, &big, 1);
        train_step(m, &small, 2);
        cr_expect_eq(ab_mem_current(AB_DEV_CPU), before, "%s: memory changed during steps", variants[v]);
        cr_expect_eq(ab_mem_peak(AB_DEV_CPU), before, "%s: a step allocated (peak %zu > %zu)", variants[v],
                     ab_mem_peak(AB_DEV_CPU), before);
        free_batch(&big);
        free_batch(&small);
        tf_destroy(m);
    }
}

Test(model, inference_mode_same_logits_keeps_nothing) {
    /* tf_set_inference: the same logits bit for bit (softmax computes them from row
     * blocks of scores instead of the saved probabilities: the same products), nothing
     * allocated, and no backward after such a forward; off again, training works. */
    const char *variants[3] = {"softmax", "linear", "lsh"};
    for (int v = 0; v < 3; v++) {
        tf_config c = mid_config(variants[v], 0.1f);
        tf_model *m = tm_make(&c, 4);
        batch b = make_batch(3, 33, c.vocab, 23);
        const size_t nl = (size_t)3 * 33 * c.vocab;
        float *want = malloc(sizeof(float) * nl);
        cr_assert_eq(tf_forward(m, b.tokens, 3, 33, NULL, false, 5), 0, "%s", ab_error());
        memcpy(want, tf_logits(m), sizeof(float) * nl);
        size_t before = ab_mem_current(AB_DEV_CPU);
        ab_mem_reset_peak(AB_DEV_CPU);
        tf_set_inference(m, true);
        cr_assert_eq(tf_forward(m, b.tokens, 3, 33, NULL, false, 5), 0, "%s", ab_error());
        cr_assert(memcmp(want, tf_logits(m), sizeof(float) * nl) == 0, "%s: inference logits differ", variants[v]);
        cr_expect_eq(ab_mem_peak(AB_DEV_CPU), before, "%s: an inference forward allocated", variants[v]);
        ce_stats st;
        cr_assert_eq(tf_loss(m, b.targets, b.weights, &st), 0, "%s", ab_error());
        cr_expect_neq(tf_backward(m), 0, "%s: backward after an inference forward", variants[v]);
        cr_expect(strstr(ab_error(), "inference") != NULL, "%s", ab_error());
        tf_set_inference(m, false);
        cr_expect(isfinite(train_step(m, &b, 3)), "%s: training after inference", variants[v]);
        free(want);
        free_batch(&b);
        tf_destroy(m);
    }
}

Test(model, inference_model_same_logits_less_memory) {
    /* tf_create_inference: the same parameters and logits bit for bit as a training
     * model in inference mode (5 layers, so the two activation sets are used in turn
     * with layers left over, post- and pre-norm), fewer activation bytes (softmax: not
     * one N x N score block per layer), no backward ever, and recurrent generation on
     * it the same as on the training model. */
    const char *variants[4] = {"softmax", "linear", "lsh", "stateful-softmax"};
    for (int v = 0; v < 4; v++)
        for (int pre = 0; pre < 2; pre++) {
            tf_config c = mid_config(variants[v], 0.1f);
            c.layers = 5;
            c.pre_norm = pre;
            const int B = 3, N = 33;
            tf_model *m = tm_make(&c, 4), *mi = NULL;
            cr_assert_eq(tf_create_inference(&c, 4, &mi), 0, "%s", ab_error());
            cr_assert_eq(tf_param_count(mi), tf_param_count(m));
            cr_assert(memcmp(tf_params(mi), tf_params(m), sizeof(float) * tf_param_count(m)) == 0);
            if (v == 0) /* softmax trains with B H N^2 saved scores per layer at (4, 40) */
                cr_expect_geq(tf_act_bytes(m) - tf_act_bytes(mi), (size_t)5 * 4 * 4 * 40 * 40 * sizeof(float),
                              "%zu vs %zu", tf_act_bytes(m), tf_act_bytes(mi));
            else
                cr_expect_lt(tf_act_bytes(mi), tf_act_bytes(m), "%s", variants[v]);
            batch b = make_batch(B, N, c.vocab, 29);
            const size_t nl = (size_t)B * N * c.vocab;
            tf_set_inference(m, true);
            cr_assert_eq(tf_forward(m, b.tokens, B, N, b.lengths, false, 7), 0, "%s", ab_error());
            float *want = malloc(sizeof(float) * nl);
            memcpy(want, tf_logits(m), sizeof(float) * nl);
            tf_set_inference(mi, false); /* stays on */
            cr_assert_eq(tf_forward(mi, b.tokens, B, N, b.lengths, false, 7), 0, "%s", ab_error());
            cr_assert(memcmp(want, tf_logits(mi), sizeof(float) * nl) == 0, "%s pre_norm=%d: logits differ",
                      variants[v], pre);
            ce_stats st;
            cr_assert_eq(tf_loss(mi, b.targets, b.weights, &st), 0, "%s", ab_error());
            cr_expect_neq(tf_backward(mi), 0, "%s: backward on an inference model", variants[v]);
            cr_expect(strstr(ab_error(), "inference only") != NULL, "%s", ab_error());
            if (tf_has_recurrent(m)) { /* prefill 5 positions, then 4 steps: bit for bit */
                tf_gen *g = NULL, *gi = NULL;
                float *a = malloc(sizeof(float) * B * c.vocab), *bb = malloc(sizeof(float) * B * c.vocab);
                int *prompt = malloc(sizeof(int) * B * 5);
                for (int r = 0; r < B; r++) memcpy(prompt + r * 5, b.tokens + r * N, sizeof(int) * 5);
                cr_assert_eq(tf_gen_create(m, B, 12, &g), 0, "%s", ab_error());
                cr_assert_eq(tf_gen_create(mi, B, 12, &gi), 0, "%s", ab_error());
                cr_assert_eq(tf_gen_prefill(g, prompt, 5, a), 0, "%s", ab_error());
                cr_assert_eq(tf_gen_prefill(gi, prompt, 5, bb), 0, "%s", ab_error());
                for (int t = 0; t < 5; t++) {
                    cr_assert(memcmp(a, bb, sizeof(float) * B * c.vocab) == 0, "%s: generation differs at step %d",
                              variants[v], t);
                    int tok[3] = {tu_argmax(a, c.vocab), tu_argmax(a + c.vocab, c.vocab),
                                  tu_argmax(a + 2 * c.vocab, c.vocab)};
                    cr_assert_eq(tf_gen_step(g, tok, a), 0, "%s", ab_error());
                    cr_assert_eq(tf_gen_step(gi, tok, bb), 0, "%s", ab_error());
                }
                tf_gen_destroy(g);
                tf_gen_destroy(gi);
                free(a);
                free(bb);
                free(prompt);
            }
            free(want);
            free_batch(&b);
            tf_destroy(mi);
            tf_destroy(m);
        }
}
