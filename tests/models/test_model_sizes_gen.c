/* The model suite's size tables, initialisation and memory, dropout at model level,
 * generation and errors (part of test_model; the suite is described in test_model.c). */
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
static tf_config mid_config(const char *variant, float dropout) {
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

typedef struct {
    int B, N;
    int *tokens, *targets, lengths[8];
    float *weights;
} batch;

static batch make_batch(int B, int N, int V, uint64_t seed) {
    batch b = {B, N, malloc(sizeof(int) * B * N), malloc(sizeof(int) * B * N), {0}, malloc(sizeof(float) * B * N)};
    tu_fill_int(b.tokens, (size_t)B * N, seed, 1, 0, V - 1);
    tu_fill_int(b.targets, (size_t)B * N, seed, 2, 0, V - 1);
    for (int i = 0; i < B; i++) {
        b.lengths[i] = N - (i * 7) % N;
        for (int n = 0; n < N; n++) b.weights[i * N + n] = n < b.lengths[i] ? 1.0f : 0.0f;
    }
    return b;
}

static void free_batch(batch *b) {
    free(b->tokens);
    free(b->targets);
    free(b->weights);
}

static double train_step(tf_model *m, const batch *b, uint64_t seed) {
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

static void generation_case(const char *variant, bool pre_norm) {
    tf_config c = mid_config(variant, 0.1f);
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

Test(generation, recurrent_equals_recompute_linear) { generation_case("linear", false); }
Test(generation, recurrent_equals_recompute_linear_pre_norm) { generation_case("linear", true); }
Test(generation, recurrent_equals_recompute_stateful_softmax) { generation_case("stateful-softmax", false); }
Test(generation, recurrent_equals_recompute_polynomial) { generation_case("polynomial", false); }

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
