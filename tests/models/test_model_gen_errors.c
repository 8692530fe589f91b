/* The model suite's dropout at model level, generation and errors (part of test_model;
 * the suite is described in test_model.c). */
#include "test_model.h"

#include "draw_core.h"
#include "rng.h"

/* ---- dropout at model level ---- */

Test(model, dropout_train_and_eval) {
    tf_config c0 = mid_config("linear", 0.0f), c5 = mid_config("linear", 0.5f);
    tf_model *m0 = tm_make(&c0, 2), *m5 = tm_make(&c5, 2);
    cr_assert_eq(tf_param_count(m0), tf_param_count(m5));
    cr_assert(memcmp(tf_params(m0), tf_params(m5), sizeof(float) * tf_param_count(m0)) == 0);
    batch b = make_batch(2, 20, c0.vocab, 41);
    size_t nl = (size_t)2 * 20 * c0.vocab;
    float *ref = malloc(sizeof(float) * nl), *lg = malloc(sizeof(float) * nl);
    cr_assert_eq(tf_forward(m0, b.tokens, 2, 20, NULL, true, 1), 0);
    memcpy(ref, tf_logits(m0), sizeof(float) * nl);
    /* evaluation ignores dropout and the seed */
    cr_assert_eq(tf_forward(m5, b.tokens, 2, 20, NULL, false, 1), 0);
    cr_assert(memcmp(ref, tf_logits(m5), sizeof(float) * nl) == 0, "eval with dropout 0.5 differs from dropout 0");
    cr_assert_eq(tf_forward(m5, b.tokens, 2, 20, NULL, false, 2), 0);
    cr_assert(memcmp(ref, tf_logits(m5), sizeof(float) * nl) == 0, "eval depends on the seed");
    /* training: the seed decides, reproducibly */
    cr_assert_eq(tf_forward(m5, b.tokens, 2, 20, NULL, true, 1), 0);
    memcpy(lg, tf_logits(m5), sizeof(float) * nl);
    cr_assert(memcmp(ref, lg, sizeof(float) * nl) != 0, "training with dropout 0.5 changed nothing");
    cr_assert_eq(tf_forward(m5, b.tokens, 2, 20, NULL, true, 1), 0);
    cr_assert(memcmp(lg, tf_logits(m5), sizeof(float) * nl) == 0, "same seed, different logits");
    cr_assert_eq(tf_forward(m5, b.tokens, 2, 20, NULL, true, 2), 0);
    cr_assert(memcmp(lg, tf_logits(m5), sizeof(float) * nl) != 0, "another seed, same logits");
    /* the masks are the documented ones: layer l, site k from (seed, TF_STREAM_DROPOUT + 4l + k) */
    const char *sites[3] = {"attn.drop_mask", "ffn.hidden_drop_mask", "ffn.drop_mask"};
    size_t sizes[3] = {(size_t)2 * 20 * 32, (size_t)2 * 20 * 64, (size_t)2 * 20 * 32};
    char *acts = tf_acts(m5);
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 3; k++) {
            char name[64];
            snprintf(name, sizeof name, "layers.%d.%s", l, sites[k]);
            const tf_tensor *t = NULL;
            for (int i = 0; i < tf_act_tensor_count(m5); i++)
                if (strcmp(tf_act_tensor(m5, i)->name, name) == 0) t = tf_act_tensor(m5, i);
            cr_assert_not_null(t, "no activation %s", name);
            uint8_t *want = malloc(sizes[k]);
            dropout_mask(want, sizes[k], 0.5f, 2, TF_STREAM_DROPOUT + 4 * (uint64_t)l + (uint64_t)k);
            cr_assert(memcmp(want, acts + t->offset, sizes[k]) == 0, "%s is not the documented mask", name);
            free(want);
        }
    /* no masks are carved without dropout */
    for (int i = 0; i < tf_act_tensor_count(m0); i++)
        if (strstr(tf_act_tensor(m0, i)->name, "mask")) cr_assert_eq(tf_act_tensor(m0, i)->count, 0);
    free(ref);
    free(lg);
    free_batch(&b);
    tf_destroy(m0);
    tf_destroy(m5);
}

/* Plain SGD on one batch: the gradients are usable end to end (the loss falls). */
Test(model, sgd_reduces_loss) {
    tf_config c = mid_config("linear", 0.0f);
    tf_model *m = tm_make(&c, 4);
    batch b = make_batch(4, 24, c.vocab, 51);
    double first = train_step(m, &b, 0), last = first;
    for (int s = 0; s < 30; s++) {
        float *p = tf_params(m);
        const float *g = tf_grads(m);
        for (size_t i = 0; i < tf_param_count(m); i++) p[i] -= 0.1f * g[i];
        last = train_step(m, &b, 0);
    }
    if (tu_verbose()) fprintf(stderr, "sgd: loss %g -> %g\n", first, last);
    cr_expect_lt(last, 0.7 * first, "loss %g -> %g after 30 SGD steps", first, last);
    free_batch(&b);
    tf_destroy(m);
}

/* ---- generation ---- */

/* Recurrent logits vs recomputed logits: the same float sums in another order (steps
 * and prefill vs the chunked/blocked parallel forward) through two layers; measured
 * <= 3.6e-7 relative to the largest logit; 2e-5 leaves 55x. A greedy decision is
 * only at risk when the top two logits are closer than that; the test asserts the
 * margin so that equal tokens mean something. */
#define GEN_TOL 2e-5

static void generation_case_set(const char *variant, bool pre_norm, int n_set, const char *const *set) {
    tf_config c = mid_config(variant, 0.1f);
    c.attn_settings = set;
    c.n_attn_settings = n_set;
    c.max_len = 24;
    c.pre_norm = pre_norm;
    tf_model *m = tm_make(&c, 3);
    int B = 2, P = 4, G = 14, V = c.vocab, cap = P + G;
    int *seq = malloc(sizeof(int) * B * cap), *flat = malloc(sizeof(int) * B * cap);
    tu_fill_int(seq, (size_t)B * cap, 61, 1, 0, V - 1); /* prompts in [.., 0..P) */
    float *rec = malloc(sizeof(float) * B * V), *rnn = malloc(sizeof(float) * B * V);
    tf_gen *g = NULL;
    cr_assert_eq(tf_gen_create(m, B, cap, &g), 0, "%s", ab_error());
    cr_assert_gt(tf_gen_state_bytes(m, B, cap), 0);
    double worst = 0, min_gap = INFINITY;
    for (int pass = 0; pass < 2; pass++) { /* the second pass checks tf_gen_init */
        if (pass) cr_assert_eq(tf_gen_init(g), 0);
        for (int len = P; len < cap; len++) {
            /* recompute over the prefix of length len */
            for (int b = 0; b < B; b++) memcpy(flat + b * len, seq + b * cap, sizeof(int) * len);
            cr_assert_eq(tf_last_logits(m, flat, B, len, 0, rec), 0, "%s", ab_error());
            /* recurrent: prefill the prompt, then one step per new token */
            if (len == P) {
                cr_assert_eq(tf_gen_prefill(g, flat, P, rnn), 0, "%s", ab_error());
            } else {
                int tok[2] = {seq[0 * cap + len - 1], seq[1 * cap + len - 1]};
                cr_assert_eq(tf_gen_step(g, tok, rnn), 0, "%s", ab_error());
            }
            cr_assert_eq(tf_gen_position(g), len);
            double *want = tu_to_double(rec, (size_t)B * V);
            double e = tu_rel_err(rnn, want, (size_t)B * V, 1e-30);
            free(want);
            worst = fmax(worst, e);
            cr_expect_lt(e, GEN_TOL, "%s pre_norm=%d: logits at length %d differ by %g", variant, pre_norm, len, e);
            for (int b = 0; b < B; b++) {
                int t1 = tu_argmax(rec + b * V, V), t2 = tu_argmax(rnn + b * V, V);
                cr_expect_eq(t1, t2, "%s: greedy tokens differ at length %d row %d", variant, len, b);
                float top = rec[b * V + t1], second = -INFINITY;
                for (int v = 0; v < V; v++)
                    if (v != t1 && rec[b * V + v] > second) second = rec[b * V + v];
                min_gap = fmin(min_gap, (double)(top - second));
                if (pass == 0) seq[b * cap + len] = t1; /* greedy continuation */
                else cr_expect_eq(seq[b * cap + len], t1, "second pass differs");
            }
        }
    }
    if (tu_verbose()) fprintf(stderr, "generation %s pre_norm=%d: worst %.3g, min top-2 gap %.3g\n", variant, pre_norm,
                           worst, min_gap);
    cr_expect_gt(min_gap, 1e-3, "a greedy decision was nearly a tie: pick another seed");
    /* one more position fits, then the state is full */
    int tok[2] = {0, 0};
    cr_expect_eq(tf_gen_step(g, tok, rnn), 0, "%s", ab_error());
    cr_expect_lt(tf_gen_step(g, tok, rnn), 0);
    tf_gen_destroy(g);
    free(seq);
    free(flat);
    free(rec);
    free(rnn);
    tf_destroy(m);
}

static void generation_case(const char *variant, bool pre_norm) { generation_case_set(variant, pre_norm, 0, NULL); }

Test(generation, recurrent_equals_recompute_linear) { generation_case("linear", false); }
Test(generation, recurrent_equals_recompute_linear_pre_norm) { generation_case("linear", true); }
Test(generation, recurrent_equals_recompute_stateful_softmax) { generation_case("stateful-softmax", false); }
Test(generation, recurrent_equals_recompute_polynomial) { generation_case("polynomial", false); }
/* The linear-RNN family and sparse: gla and deltanet get their input from the block's
 * projection at every step (mha_step_forward), the same as over the whole prefix. */
Test(generation, recurrent_equals_recompute_retention) { generation_case("retention", false); }
Test(generation, recurrent_equals_recompute_gla) { generation_case("gla", false); }
Test(generation, recurrent_equals_recompute_gla_pre_norm) { generation_case("gla", true); }
Test(generation, recurrent_equals_recompute_deltanet) { generation_case("deltanet", false); }
/* sparse with a set window and stride: with auto ones the pattern follows N, which is
 * the state's capacity in the recurrent mode and the prefix's length in a recomputation
 * (attention/README.md), so the two differ by design. */
Test(generation, recurrent_equals_recompute_sparse) {
    const char *set[] = {"window=3", "stride=4"};
    generation_case_set("sparse", false, 2, set);
}

Test(generation, state_sizes_and_unsupported) {
    tf_config c = mid_config("linear", 0.0f);
    tf_model *m = tm_make(&c, 2);
    cr_assert(tf_has_recurrent(m));
    /* linear: constant state; stateful-softmax: grows with the capacity */
    cr_assert_eq(tf_gen_state_bytes(m, 2, 8), tf_gen_state_bytes(m, 2, 40));
    tf_destroy(m);
    c.attention = "stateful-softmax";
    m = tm_make(&c, 2);
    cr_assert_lt(tf_gen_state_bytes(m, 2, 8), tf_gen_state_bytes(m, 2, 40));
    tf_gen *g = (tf_gen *)1;
    cr_assert_lt(tf_gen_create(m, 3, 8, &g), 0, "batch above the model's maximum accepted");
    cr_assert_null(g);
    cr_assert_lt(tf_gen_create(m, 1, 41, &g), 0, "capacity above max_len accepted");
    tf_destroy(m);
    const char *none[2] = {"softmax", "lsh"};
    for (int i = 0; i < 2; i++) {
        c.attention = none[i];
        m = tm_make(&c, 2);
        cr_assert(!tf_has_recurrent(m));
        cr_assert_eq(tf_gen_state_bytes(m, 1, 8), 0);
        g = NULL;
        cr_assert_eq(tf_gen_create(m, 1, 8, &g), AB_EUNSUPPORTED);
        cr_assert_null(g);
        cr_assert(strstr(ab_error(), "has no recurrent mode"), "message: %s", ab_error());
        /* recomputation works and is reproducible for a seed */
        int toks[5] = {1, 2, 3, 4, 5};
        float a[11], b2[11];
        cr_assert_eq(tf_last_logits(m, toks, 1, 5, 9, a), 0, "%s", ab_error());
        cr_assert_eq(tf_last_logits(m, toks, 1, 5, 9, b2), 0, "%s", ab_error());
        cr_assert(memcmp(a, b2, sizeof a) == 0);
        tf_destroy(m);
    }
    c.attention = "linear";
    c.causal = false;
    m = tm_make(&c, 2);
    cr_assert(!tf_has_recurrent(m));
    cr_assert_eq(tf_gen_create(m, 1, 8, &g), AB_EUNSUPPORTED);
    cr_assert(strstr(ab_error(), "non-causal"), "message: %s", ab_error());
    tf_destroy(m);
}

/* tf_draw_last: the last forward's rows, drawn from its last position as the host's
 * draw gives them; refusals with a message before any forward, for the other head's
 * draw and for NULL arguments. */
Test(generation, draw_last_and_its_refusals) {
    tf_config c = mid_config("linear", 0.0f);
    tf_model *m = tm_make(&c, 2);
    const draw_spec d = {false, 0, 1.0, 3, 5, 6, 10, 7};
    int out[2] = {-1, -1};
    cr_expect_eq(tf_draw_last(m, &d, out), AB_EINVAL);
    cr_expect(strstr(ab_error(), "no forward"), "message: %s", ab_error());
    int toks[2 * 5] = {1, 2, 3, 4, 5, 5, 4, 3, 2, 1};
    float logits[2 * 11];
    cr_assert_eq(tf_last_logits(m, toks, 2, 5, 9, logits), 0, "%s", ab_error());
    cr_assert_eq(tf_draw_last(m, &d, out), 0, "%s", ab_error());
    for (int b = 0; b < 2; b++) {
        const double u = ab_rng_uniform(d.seed, d.stream, d.idx0 + (uint64_t)b * d.idx_stride);
        cr_expect_eq(out[b], draw_categorical_core(logits + b * 11, 11, 1.0, u), "row %d", b);
    }
    /* NULL logits: no copy, the draw still sees them */
    int again[2];
    cr_assert_eq(tf_last_logits(m, toks, 2, 5, 9, NULL), 0, "%s", ab_error());
    cr_assert_eq(tf_draw_last(m, &d, again), 0, "%s", ab_error());
    cr_expect(again[0] == out[0] && again[1] == out[1]);
    const draw_spec mix = {true, 0, 1.0, 3, 5, 6, 10, 7};
    cr_expect_eq(tf_draw_last(m, &mix, out), AB_EINVAL);
    cr_expect(strstr(ab_error(), "logistic mixture"), "message: %s", ab_error());
    cr_expect_eq(tf_draw_last(m, NULL, out), AB_EINVAL);
    cr_expect_eq(tf_draw_last(m, &d, NULL), AB_EINVAL);
    tf_destroy(m);
}

/* The generator's draws kept where the model is (tf_gen_draw, tf_gen_step with NULL
 * tokens, tf_gen_draws): the same values as the loop through the host (tf_draw_last,
 * each value fed back by tf_gen_step), in the table at the positions they were drawn
 * from and -1 elsewhere; a second round after tf_gen_init the same again. Refusals
 * with a message: a step from draws that were not made (none yet, or used already), a
 * draw before any position, the other head's draw, NULL arguments, and values that
 * are not tokens (more classes than the vocabulary). */
Test(generation, draws_kept_on_the_device_as_the_host_loop) {
    enum { B = 2, P = 3, CAP = 9 };
    tf_config c = mid_config("linear", 0.0f);
    tf_model *m = tm_make(&c, B);
    tf_gen *g = NULL;
    cr_assert_eq(tf_gen_create(m, B, CAP, &g), 0, "%s", ab_error());
    const int prompt[B * P] = {1, 2, 3, 7, 6, 5};
    int host[B * CAP], table[B * CAP];
    for (int i = 0; i < B * CAP; i++) host[i] = -1;
    /* the host's loop */
    cr_assert_eq(tf_gen_prefill(g, prompt, P, NULL), 0, "%s", ab_error());
    for (int j = P - 1; j < CAP; j++) {
        const draw_spec d = {false, 0, 1.0, 3, 5, 6, (uint64_t)j, 100};
        int next[B];
        cr_assert_eq(tf_draw_last(m, &d, next), 0, "%s", ab_error());
        for (int b = 0; b < B; b++) host[b * CAP + j] = next[b];
        if (j + 1 < CAP) cr_assert_eq(tf_gen_step(g, next, NULL), 0, "%s", ab_error());
    }
    /* kept: twice, the second after tf_gen_init */
    for (int round = 0; round < 2; round++) {
        cr_assert_eq(tf_gen_init(g), 0, "%s", ab_error());
        cr_expect_eq(tf_gen_draw(g, &(draw_spec){false, 0, 1.0, 3, 5, 6, 0, 100}), AB_EINVAL);
        cr_expect(strstr(ab_error(), "tf_gen_prefill first"), "message: %s", ab_error());
        cr_assert_eq(tf_gen_prefill(g, prompt, P, NULL), 0, "%s", ab_error());
        cr_expect_eq(tf_gen_step(g, NULL, NULL), AB_EINVAL, "a step from draws not made");
        cr_expect(strstr(ab_error(), "none drawn from position 2"), "message: %s", ab_error());
        for (int j = P - 1; j < CAP; j++) {
            const draw_spec d = {false, 0, 1.0, 3, 5, 6, (uint64_t)j, 100};
            cr_assert_eq(tf_gen_draw(g, &d), 0, "%s", ab_error());
            if (j + 1 < CAP) cr_assert_eq(tf_gen_step(g, NULL, NULL), 0, "%s", ab_error());
            if (j == P - 1) { /* the draws were used: no second step from them */
                cr_expect_eq(tf_gen_step(g, NULL, NULL), AB_EINVAL);
                cr_assert_eq(tf_gen_draw(g, &(draw_spec){false, 0, 1.0, 3, 5, 6, (uint64_t)j + 1, 100}), 0, "%s",
                             ab_error());
                cr_assert_eq(tf_gen_step(g, NULL, NULL), 0, "%s", ab_error());
                j++;
            }
        }
        cr_assert_eq(tf_gen_draws(g, table), 0, "%s", ab_error());
        cr_expect(memcmp(table, host, sizeof table) == 0, "round %d: the kept draws are not the host loop's", round);
    }
    int drawn = 0;
    for (int i = 0; i < B * CAP; i++) drawn += host[i] >= 0;
    cr_expect_eq(drawn, B * (CAP - P + 1), "the host loop drew %d values", drawn);
    cr_expect_eq(tf_gen_draw(g, &(draw_spec){true, 0, 1.0, 3, 5, 6, 0, 1}), AB_EINVAL);
    cr_expect(strstr(ab_error(), "logistic mixture"), "message: %s", ab_error());
    cr_expect_eq(tf_gen_draw(g, NULL), AB_EINVAL);
    cr_expect_eq(tf_gen_draw(NULL, &(draw_spec){false, 0, 1.0, 3, 5, 6, 0, 1}), AB_EINVAL);
    cr_expect_eq(tf_gen_draws(g, NULL), AB_EINVAL);
    tf_gen_destroy(g);
    tf_destroy(m);
    /* 20 classes over 11 tokens: a draw could not be fed back */
    c.classes = 20;
    m = tm_make(&c, B);
    cr_assert_eq(tf_gen_create(m, B, CAP, &g), 0, "%s", ab_error());
    cr_assert_eq(tf_gen_prefill(g, prompt, P, NULL), 0, "%s", ab_error());
    cr_expect_eq(tf_gen_draw(g, &(draw_spec){false, 0, 1.0, 3, 5, 6, 0, 1}), AB_EINVAL);
    cr_expect(strstr(ab_error(), "drawn values 0..19 are not all tokens (vocab 11)"), "message: %s", ab_error());
    tf_gen_destroy(g);
    tf_destroy(m);
}

/* ---- errors ---- */

Test(errors, bad_configs) {
    tf_config c;
#define BAD(stmt, mb, needle)             \
    do {                                  \
        c = tm_tiny_config("linear");        \
        stmt;                             \
        tm_expect_create_error(&c, mb, needle); \
    } while (0)
    BAD(c.vocab = 0, 2, "vocab 0");
    BAD(c.max_len = 0, 2, "max_len 0");
    BAD(c.d_model = 0, 2, "d_model 0");
    BAD(c.heads = 0, 2, "heads 0");
    BAD((c.d_model = 10, c.heads = 3), 2, "d_model 10 is not divisible by heads 3");
    BAD(c.layers = 0, 2, "layers 0");
    BAD(c.d_ff = -1, 2, "d_ff -1");
    BAD(c.dropout = 1.0f, 2, "dropout 1 must be in [0, 1)");
    BAD(c.dropout = -0.1f, 2, "dropout");
    BAD(c.dropout = NAN, 2, "dropout");
    BAD(c.attention = "bogus", 2, "unknown attention variant 'bogus'");
    BAD(c.attention = NULL, 2, "attention variant is not set");
    const char *s1[1] = {"feature_map=foo"}, *s2[1] = {"nonsense=1"}, *s3[1] = {"novalue"}, *s4[1] = {NULL};
    BAD((c.n_attn_settings = 1, c.attn_settings = s1), 2, "feature_map=foo: must be one of");
    BAD((c.n_attn_settings = 1, c.attn_settings = s2), 2, "has no option 'nonsense'");
    BAD((c.n_attn_settings = 1, c.attn_settings = s3), 2, "not of the form KEY=VALUE");
    BAD((c.n_attn_settings = 1, c.attn_settings = s4), 2, "setting 0 is NULL");
    BAD(c.n_attn_settings = -1, 2, "settings list is malformed");
    BAD(c.seed = 1, 0, "max batch 0");
    BAD(c.max_len = 1 << 20, 1 << 12, "too large");
#undef BAD
    /* good options pass through to the attention */
    c = tm_tiny_config("linear");
    const char *ok[2] = {"feature_map=taylor", "chunk=3"};
    c.n_attn_settings = 2;
    c.attn_settings = ok;
    tf_model *m = tm_make(&c, 1);
    cr_assert_str_eq(tf_get_config(m)->attention, "linear");
    cr_assert_str_eq(tf_get_config(m)->attn_settings[0], "feature_map=taylor");
    tf_destroy(m);
}

Test(errors, bad_calls) {
    tf_config c = tm_tiny_config("linear");
    tf_model *m = tm_make(&c, 2);
    int toks[12] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1}, tg[12] = {0};
    float w[12];
    for (int i = 0; i < 12; i++) w[i] = 1.0f;
    ce_stats st;
    cr_expect_lt(tf_loss(m, tg, w, &st), 0, "loss before any forward");
    cr_expect_lt(tf_backward(m), 0, "backward before any forward");
    cr_expect_lt(tf_forward(m, toks, 3, 4, NULL, true, 0), 0);
    cr_expect(strstr(ab_error(), "does not fit"), "%s", ab_error());
    cr_expect_lt(tf_forward(m, toks, 1, 7, NULL, true, 0), 0);
    cr_expect_lt(tf_forward(m, toks, 0, 4, NULL, true, 0), 0);
    toks[5] = 5;
    cr_expect_lt(tf_forward(m, toks, 2, 6, NULL, true, 0), 0);
    cr_expect(strstr(ab_error(), "token 5 at index 5 is outside [0, vocab=5)"), "%s", ab_error());
    toks[5] = -1;
    cr_expect_lt(tf_forward(m, toks, 2, 6, NULL, true, 0), 0);
    toks[5] = 0;
    int bad_len[2] = {6, 7};
    cr_expect_lt(tf_forward(m, toks, 2, 6, bad_len, true, 0), 0);
    cr_expect(strstr(ab_error(), "lengths[1] = 7"), "%s", ab_error());
    cr_assert_eq(tf_forward(m, toks, 2, 6, NULL, true, 0), 0, "%s", ab_error());
    cr_expect_lt(tf_backward(m), 0, "backward without a loss");
    tg[3] = 5;
    cr_expect_lt(tf_loss(m, tg, w, &st), 0);
    cr_expect(strstr(ab_error(), "target 5 at index 3"), "%s", ab_error());
    w[3] = 0.0f; /* an unscored position may hold any target */
    cr_assert_eq(tf_loss(m, tg, w, &st), 0, "%s", ab_error());
    cr_expect_eq(st.counted, 11);
    w[4] = -1.0f;
    cr_expect_lt(tf_loss(m, tg, w, &st), 0);
    w[4] = NAN;
    cr_expect_lt(tf_loss(m, tg, w, &st), 0);
    w[4] = INFINITY;
    cr_expect_lt(tf_loss(m, tg, w, &st), 0);
    w[4] = 1.0f;
    cr_assert_eq(tf_loss(m, tg, w, &st), 0);
    cr_assert_eq(tf_backward(m), 0, "%s", ab_error());
    cr_expect_lt(tf_backward(m), 0, "a second backward of one loss");
    /* a failed forward invalidates the previous one */
    cr_expect_lt(tf_forward(m, toks, 3, 6, NULL, true, 0), 0);
    cr_expect_lt(tf_loss(m, tg, w, &st), 0);
    /* generation misuse */
    tf_gen *g = NULL;
    cr_assert_eq(tf_gen_create(m, 2, 6, &g), 0, "%s", ab_error());
    float lg[10];
    cr_expect_lt(tf_gen_prefill(g, toks, 7, lg), 0, "prompt longer than the capacity");
    cr_expect_lt(tf_gen_prefill(g, toks, 0, lg), 0, "empty prompt");
    cr_assert_eq(tf_gen_prefill(g, toks, 3, lg), 0, "%s", ab_error());
    cr_expect_lt(tf_gen_prefill(g, toks, 3, lg), 0, "prefill of a non-empty state");
    int bad[2] = {0, 9};
    cr_expect_lt(tf_gen_step(g, bad, lg), 0, "step with a bad token");
    tf_gen_destroy(g);
    tf_destroy(m);
}

/* Input kinds and LSTM configs: each call of the wrong input kind is refused with a
 * message naming the kinds, as are non-finite frames, a causal bidirectional LSTM and
 * more LSTM layers than lstm.h carries. */
Test(errors, input_kinds_frames_and_lstm_configs) {
    tf_config c = tm_tiny_lstm_config();
    tf_model *fm = tm_make(&c, 2);
    tf_config tc = tm_tiny_config("linear");
    tf_model *tm = tm_make(&tc, 2);
    int toks[12] = {0};
    float fr[2 * 6 * 3];
    tu_fill_normal(fr, 36, 41, 1, 1.0);
    ce_stats st;
    int tg[12] = {0};
    /* tokens into a frames model */
    cr_expect_eq(tf_forward(fm, toks, 2, 6, NULL, true, 0), AB_EINVAL);
    cr_expect(strstr(ab_error(), "the model's input is frames, not tokens"), "%s", ab_error());
    cr_expect_lt(tf_loss(fm, tg, NULL, &st), 0, "a refused forward left something to score");
    /* frames into a token model */
    cr_expect_eq(tf_forward_frames(tm, fr, 2, 6, NULL, true, 0), AB_EINVAL);
    cr_expect(strstr(ab_error(), "the model's input is tokens, not frames"), "%s", ab_error());
    cr_expect_lt(tf_loss(tm, tg, NULL, &st), 0, "a refused forward left something to score");
    /* non-finite frame values, and NULL frames */
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(tf_forward_frames(fm, fr, 2, 6, NULL, true, 0), 0, "%s", ab_error());
        float keep = fr[17];
        fr[17] = bad[k];
        cr_expect_eq(tf_forward_frames(fm, fr, 2, 6, NULL, true, 0), AB_EINVAL, "frame value %g accepted",
                     (double)bad[k]);
        cr_expect(strstr(ab_error(), "frame value 17 is not finite"), "%s", ab_error());
        cr_expect(strchr(ab_error(), '\n') == NULL, "message has a newline: '%s'", ab_error());
        cr_expect_lt(tf_loss(fm, tg, NULL, &st), 0, "a refused forward left the previous one to score");
        fr[17] = keep;
    }
    /* a non-finite value past the call's B N F floats is not read */
    float big[3 * 6 * 3];
    memcpy(big, fr, sizeof fr);
    for (int i = 36; i < 54; i++) big[i] = NAN;
    cr_expect_eq(tf_forward_frames(fm, big, 2, 6, NULL, true, 0), 0, "%s", ab_error());
    cr_expect_eq(tf_forward_frames(fm, NULL, 2, 6, NULL, true, 0), AB_EINVAL);
    cr_expect(strstr(ab_error(), "NULL frames"), "%s", ab_error());
    /* the shape and lengths checks hold for frames too */
    cr_expect_eq(tf_forward_frames(fm, fr, 3, 6, NULL, true, 0), AB_EINVAL);
    cr_expect(strstr(ab_error(), "does not fit"), "%s", ab_error());
    int bad_len[2] = {6, 8};
    cr_expect_eq(tf_forward_frames(fm, fr, 2, 6, bad_len, true, 0), AB_EINVAL);
    cr_expect(strstr(ab_error(), "lengths[1] = 8"), "%s", ab_error());
    /* targets are checked against the classes (4), not a vocabulary */
    cr_assert_eq(tf_forward_frames(fm, fr, 2, 6, NULL, true, 0), 0, "%s", ab_error());
    tg[5] = 4;
    cr_expect_eq(tf_loss(fm, tg, NULL, &st), AB_EINVAL);
    cr_expect(strstr(ab_error(), "target 4 at index 5 is outside [0, classes=4)"), "%s", ab_error());
    tf_destroy(fm);
    tf_destroy(tm);

    /* configs */
#define BAD_LSTM(stmt, needle)                \
    do {                                      \
        c = tm_tiny_lstm_config();            \
        stmt;                                 \
        tm_expect_create_error(&c, 2, needle);   \
    } while (0)
    BAD_LSTM(c.causal = true, "a causal model cannot have a bidirectional LSTM");
    BAD_LSTM(c.layers = LSTM_MAX_LAYERS + 1, "layers = 17 outside [1, 16]");
    BAD_LSTM((c.layers = LSTM_MAX_LAYERS + 1, c.bidirectional = false, c.causal = true), "outside [1, 16]");
    BAD_LSTM(c.lstm_hidden = 0, "LSTM hidden size 0");
    BAD_LSTM(c.features = 0, "features 0");
    BAD_LSTM(c.classes = 0, "classes 0");
    BAD_LSTM(c.dropout = 1.0f, "dropout 1");
#undef BAD_LSTM
    /* the limits themselves are accepted: a causal unidirectional LSTM, LSTM_MAX_LAYERS layers */
    c = tm_tiny_lstm_config();
    c.bidirectional = false;
    c.causal = true;
    c.layers = LSTM_MAX_LAYERS;
    fm = tm_make(&c, 1);
    cr_expect_eq(tf_param_tensor_count(fm), 2 + 3 * LSTM_MAX_LAYERS + 2);
    tf_destroy(fm);
}

/* An inference model made for forwards of one position (cfg.forward_len = 1: a sampler
 * that starts from the start token) generates exactly as one of the full length, over
 * the whole capacity of max_len positions, with activations for one position: its
 * activation bytes are under 1/10 of the full model's at max_len = 40 (they scale with
 * the rows, B x forward_len against B x max_len). A longer forward, or a prefill longer
 * than forward_len, is refused with one line; forward_len outside 0..max_len is refused
 * at creation. */
Test(generation, forward_len_one_generates_the_same) {
    const char *variants[2] = {"linear", "stateful-softmax"};
    for (int v = 0; v < 2; v++) {
        tf_config c = mid_config(variants[v], 0.0f);
        const int B = 3, cap = c.max_len;
        tf_model *mf = NULL, *m1 = NULL;
        cr_assert_eq(tf_create_inference(&c, B, &mf), 0, "%s", ab_error());
        c.forward_len = 1;
        cr_assert_eq(tf_create_inference(&c, B, &m1), 0, "%s", ab_error());
        cr_assert(memcmp(tf_params(mf), tf_params(m1), sizeof(float) * tf_param_count(mf)) == 0);
        cr_expect_lt(10 * tf_act_bytes(m1), tf_act_bytes(mf), "%s: %zu vs %zu bytes", variants[v], tf_act_bytes(m1),
                     tf_act_bytes(mf));
        tf_gen *gf = NULL, *g1 = NULL;
        cr_assert_eq(tf_gen_create(mf, B, cap, &gf), 0, "%s", ab_error());
        cr_assert_eq(tf_gen_create(m1, B, cap, &g1), 0, "%s", ab_error());
        float *a = malloc(sizeof(float) * B * c.vocab), *b = malloc(sizeof(float) * B * c.vocab);
        int tok[3] = {1, 2, 3};
        cr_assert_eq(tf_gen_prefill(gf, tok, 1, a), 0, "%s", ab_error());
        cr_assert_eq(tf_gen_prefill(g1, tok, 1, b), 0, "%s", ab_error());
        for (int t = 1; t <= cap; t++) {
            cr_assert(memcmp(a, b, sizeof(float) * B * c.vocab) == 0, "%s: position %d differs", variants[v], t - 1);
            if (t == cap) break;
            for (int r = 0; r < B; r++) tok[r] = tu_argmax(a + r * c.vocab, c.vocab);
            cr_assert_eq(tf_gen_step(gf, tok, a), 0, "%s", ab_error());
            cr_assert_eq(tf_gen_step(g1, tok, b), 0, "%s at position %d", ab_error(), t);
        }
        /* what does not fit: a forward of 2 positions, a prefill of 2 */
        int two[6] = {1, 2, 3, 4, 5, 6};
        cr_expect_eq(tf_forward(m1, two, B, 2, NULL, false, 1), AB_EINVAL);
        cr_expect(strstr(ab_error(), "length 1..1") != NULL, "%s", ab_error());
        cr_assert_eq(tf_gen_init(g1), 0, "%s", ab_error());
        cr_expect_eq(tf_gen_prefill(g1, two, 2, b), AB_EINVAL);
        cr_expect(strstr(ab_error(), "does not fit the model") != NULL, "%s", ab_error());
        cr_expect(strchr(ab_error(), '\n') == NULL, "%s", ab_error());
        tf_gen_destroy(gf);
        tf_gen_destroy(g1);
        free(a);
        free(b);
        tf_destroy(mf);
        tf_destroy(m1);
    }
    tf_config c = mid_config("linear", 0.0f);
    tf_model *m = NULL;
    c.forward_len = c.max_len + 1;
    cr_expect_eq(tf_create_inference(&c, 2, &m), AB_EINVAL);
    cr_expect(strstr(ab_error(), "forward_len") != NULL, "%s", ab_error());
    c.forward_len = -1;
    cr_expect_eq(tf_create_inference(&c, 2, &m), AB_EINVAL);
    cr_expect(m == NULL);
}
