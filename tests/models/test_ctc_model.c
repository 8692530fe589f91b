/* The model with the CTC head (transformer.h: TF_HEAD_CTC, tf_loss_ctc) on the CPU:
 * - a non-causal transformer over frames (softmax and linear attention, padding):
 *   logits, loss and every parameter's gradient against central finite differences of
 *   the double reference model (tests/reference/ref_model.c) scored by ref_ctc;
 * - the bidirectional LSTM body (padding, dropout): logits, loss and every gradient
 *   against the exact gradient of the double composition of test_model_util.c with
 *   ref_ctc's gradient at its logits, and that composition against finite differences;
 * - the head's parameter table and sizes, training that lowers the loss, and the
 *   one-line refusals of bad configs and calls (tf_loss on a CTC model and the other
 *   way round, counts, labels, weights, rows whose labels cannot fit their frames).
 * TEST_VERBOSE=1 prints the measured errors. */
#include <criterion/criterion.h>

#include "ctc.h"
#include "error.h"
#include "optim.h"
#include "ref_ctc.h"
#include "ref_model.h"
#include "rng.h"
#include "test_model_util.h"
#include "test_util.h"
#include "transformer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FD_STEP 1e-5

static tf_model *make(const tf_config *c, int max_batch) {
    tf_model *m = NULL;
    int rc = tf_create(c, max_batch, &m);
    cr_assert_eq(rc, 0, "tf_create: %s", ab_error());
    return m;
}

/* The weighted mean of the rows' ref_ctc_nll over logits (B, N, K). */
static double ref_ctc_loss(const double *logits, int B, int N, int K, const int *lengths, const int *labels,
                           const int *counts, int S, const double *weights, double *dlogits) {
    double sw = 0, swl = 0;
    double *g = dlogits ? tu_alloc_d((size_t)N * K) : NULL;
    if (dlogits) memset(dlogits, 0, sizeof(double) * (size_t)B * N * K);
    for (int b = 0; b < B; b++) {
        const double w = weights ? weights[b] : 1.0;
        if (!(w > 0)) continue;
        sw += w;
        if (g) memset(g, 0, sizeof(double) * (size_t)N * K); /* ref_ctc_nll writes the row's frames only */
        swl += w * ref_ctc_nll(logits + (size_t)b * N * K, lengths ? lengths[b] : N, K, labels + (size_t)b * S,
                               counts[b], g);
        for (size_t i = 0; dlogits && i < (size_t)N * K; i++) dlogits[(size_t)b * N * K + i] = w * g[i];
    }
    for (size_t i = 0; dlogits && i < (size_t)B * N * K; i++) dlogits[i] /= sw;
    free(g);
    return swl / sw;
}

/* ---- the transformer body ---- */

typedef struct {
    const tf_model *m;
    ref_model_cfg rc;
    double *pd, *frames, *weights;
    const int *lengths, *labels, *counts;
    int B, N, F, K, S;
} tf_ctx;

static void tf_loss_fn(void *c_, double *out) {
    tf_ctx *c = c_;
    ref_params rp = tm_ref_params(c->m, c->pd);
    double *logits = tu_alloc_d((size_t)c->B * c->N * c->K);
    ref_model_logits_frames(&c->rc, &rp, c->frames, c->F, c->B, c->N, c->lengths, logits);
    out[0] = ref_ctc_loss(logits, c->B, c->N, c->K, c->lengths, c->labels, c->counts, c->S, c->weights, NULL);
    free(logits);
}

/* test_model.c's tolerances for the same model with the categorical head (logits and
 * loss 1e-5, gradients 5e-5 against differences of the double reference: 40x over
 * what it measures); the CTC loss adds double arithmetic and a float rounding of its
 * gradient (6e-8, test_ctc.c). Measured here: logits <= 1.7e-7, loss <= 2.7e-8,
 * gradients <= 4.0e-7 per tensor. */
#define MODEL_FWD_TOL 1e-5
#define MODEL_GRAD_TOL 5e-5

static void transformer_case(const char *variant, bool pre_norm, uint64_t seed) {
    tf_config c = tm_tiny_config(variant);
    c.input = TF_INPUT_FRAMES;
    c.features = 3;
    c.classes = 4;
    c.causal = false;
    c.pre_norm = pre_norm;
    c.head = TF_HEAD_CTC;
    c.max_labels = 3;
    const int B = 2, N = 6, K = 5, S = 3;
    tf_model *m = make(&c, B);
    cr_assert_eq(tf_classes(m), K);
    const size_t np = tf_param_count(m);
    float *params = tf_params(m);
    for (size_t i = 0; i < np; i++) params[i] += (float)(0.2 * ab_rng_normal(seed, 900, i));
    float *fr = tu_normal((size_t)B * N * 3, seed, 3, 1.0);
    const int lengths[2] = {6, 4}, counts[2] = {3, 2};
    const int labels[6] = {1, 1, 2, /* row 1 */ 3, 0, 77 /* past the count: never read */};
    const float weights[2] = {0.75f, 1.5f};
    cr_assert_eq(tf_zero_grad(m), 0);
    cr_assert_eq(tf_forward_frames(m, fr, B, N, lengths, true, 77), 0, "%s", ab_error());
    ce_stats st;
    cr_assert_eq(tf_loss_ctc(m, labels, counts, weights, &st), 0, "%s", ab_error());
    cr_assert_eq(tf_backward(m), 0, "%s", ab_error());
    cr_expect_eq(st.counted, 2);
    cr_expect_eq(st.weight_sum, 2.25);

    ref_model_cfg rc = {c.vocab, c.d_model, c.heads, c.layers, c.d_ff, c.pre_norm, c.final_norm, false,
                        strstr(variant, "softmax") ? REF_ATTN_SOFTMAX : REF_ATTN_LINEAR_ELU, 0, 0, false, 0, 0, 0};
    rc.V = K;
    tf_ctx ctx = {m, rc, tu_to_double(params, np), tu_to_double(fr, (size_t)B * N * 3), tu_alloc_d(2), lengths, labels,
                  counts, B, N, 3, K, S};
    ctx.weights[0] = weights[0], ctx.weights[1] = weights[1];
    ref_params rp = tm_ref_params(m, ctx.pd);
    double *logits = tu_alloc_d((size_t)B * N * K);
    ref_model_logits_frames(&ctx.rc, &rp, ctx.frames, 3, B, N, lengths, logits);
    const double le = tu_rel_err(tf_logits(m), logits, (size_t)B * N * K, 1e-30);
    double want;
    tf_loss_fn(&ctx, &want);
    const double lerr = fabs(st.loss - want) / want;
    char what[96];
    snprintf(what, sizeof what, "transformer %s pre_norm=%d + ctc", variant, pre_norm);
    if (tu_verbose()) fprintf(stderr, "%s: logits err %.3g, loss err %.3g\n", what, le, lerr);
    cr_expect_lt(le, MODEL_FWD_TOL, "%s: logits err %g", what, le);
    cr_expect_lt(lerr, MODEL_FWD_TOL, "%s: loss %.9g vs reference %.9g", what, st.loss, want);
    double *fd = tu_alloc_d(np), one = 1.0, worst = 0;
    tu_fd_grad(tf_loss_fn, &ctx, ctx.pd, np, &one, 1, FD_STEP, fd);
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        const double e = tu_rel_err(tf_grads(m) + t->offset, fd + t->offset, t->count, 1e-30);
        worst = fmax(worst, e);
        cr_expect_lt(e, MODEL_GRAD_TOL, "%s: gradient of %s: err %g", what, t->name, e);
        cr_expect_gt(tu_max_abs(fd + t->offset, t->count), 1e-6, "%s: %s has no gradient to check", what, t->name);
    }
    if (tu_verbose()) fprintf(stderr, "%s: worst gradient err %.3g\n", what, worst);
    free(fd), free(logits), free(ctx.pd), free(ctx.frames), free(ctx.weights), free(fr);
    tf_destroy(m);
}

Test(ctc_model, transformer_softmax_non_causal_padded) { transformer_case("softmax", false, 31); }
Test(ctc_model, transformer_linear_pre_norm_padded) { transformer_case("linear", true, 32); }

/* ---- the bidirectional LSTM body ---- */

typedef struct {
    tm_ref_lstm r;
    const double *frames, *weights;
    const int *lengths, *labels, *counts;
    const ref_lstm_drop *drop;
    int B, N, S;
} lstm_ctx;

static double lstm_ref_loss(const lstm_ctx *c, const tm_ref_lstm *g) {
    const int K = c->r.K;
    double *logits = tu_alloc_d((size_t)c->B * c->N * K), *dl = g ? tu_alloc_d((size_t)c->B * c->N * K) : NULL;
    tm_ref_lstm_logits(&c->r, c->frames, c->B, c->N, c->lengths, c->drop, logits);
    double loss = ref_ctc_loss(logits, c->B, c->N, K, c->lengths, c->labels, c->counts, c->S, c->weights, dl);
    if (g) tm_ref_lstm_backprop(&c->r, c->frames, c->B, c->N, c->lengths, c->drop, dl, g);
    free(logits), free(dl);
    return loss;
}

static void lstm_loss_fn(void *c_, double *out) { out[0] = lstm_ref_loss(c_, NULL); }

/* test_model.c's LSTM tolerances (forward 1e-5, gradients against the exact ones 1e-5,
 * the composition against differences 1e-6: see there). Measured here: logits
 * <= 1.2e-7, loss <= 4.1e-9, gradients <= 6.0e-7 per tensor, the composition against
 * the differences <= 3.4e-8. */
#define LSTM_TOL 1e-5
#define LSTM_REF_FD_TOL 1e-6

static void lstm_case(float dropout, bool train, uint64_t seed) {
    tf_config c = tm_tiny_lstm_config();
    c.head = TF_HEAD_CTC;
    c.max_labels = 4;
    c.dropout = dropout;
    c.layers = 2;
    const int B = 3, N = 6, S = 4, F = c.features;
    tf_model *m = make(&c, B + 1);
    const int K = tf_classes(m), DH = 2 * c.lstm_hidden;
    cr_assert_eq(K, c.classes + 1);
    const size_t np = tf_param_count(m), BT = (size_t)B * N;
    float *params = tf_params(m);
    for (size_t i = 0; i < np; i++) params[i] += (float)(0.2 * ab_rng_normal(seed, 900, i));
    float *fr = tu_normal(BT * F, seed, 1, 1.0);
    const int lengths[3] = {6, 4, 1}, counts[3] = {4, 2, 1};
    const int labels[12] = {0, 0, 1, 2, /* needs 5 of 6 frames */ 3, 2, -9, -9, /* row 2: one frame */ 1, -9, -9, -9};
    const float weights[3] = {1.0f, 0.5f, 2.0f};
    const uint64_t dseed = seed + 1000;
    cr_assert_eq(tf_zero_grad(m), 0);
    cr_assert_eq(tf_forward_frames(m, fr, B, N, lengths, train, dseed), 0, "%s", ab_error());
    ce_stats st;
    cr_assert_eq(tf_loss_ctc(m, labels, counts, weights, &st), 0, "%s", ab_error());
    cr_assert_eq(tf_backward(m), 0, "%s", ab_error());
    /* the masks the model drew (layer 0's output, layers.h's rule) for the reference */
    const bool drop = train && dropout > 0;
    uint8_t *mask0 = NULL;
    if (drop) {
        mask0 = malloc(BT * DH);
        dropout_mask(mask0, BT * DH, dropout, dseed, TF_STREAM_DROPOUT);
    }
    const uint8_t *masks[REF_LSTM_MAX_LAYERS] = {mask0};
    ref_lstm_drop rd = {masks, dropout};
    double *pd = tu_to_double(params, np), *gd = tu_alloc_d(np), *wd = tu_alloc_d(3);
    for (int b = 0; b < 3; b++) wd[b] = weights[b];
    lstm_ctx ctx = {tm_ref_lstm_view(m, pd), tu_to_double(fr, BT * F), wd, lengths, labels, counts,
                    drop ? &rd : NULL, B, N, S};
    tm_ref_lstm gv = tm_ref_lstm_view(m, gd);
    double *logits = tu_alloc_d(BT * K);
    tm_ref_lstm_logits(&ctx.r, ctx.frames, B, N, lengths, ctx.drop, logits);
    const double want = lstm_ref_loss(&ctx, &gv);
    const double le = tu_rel_err(tf_logits(m), logits, BT * K, 1e-30), lerr = fabs(st.loss - want) / want;
    char what[96];
    snprintf(what, sizeof what, "bidirectional LSTM + ctc, dropout %g, train %d", (double)dropout, train);
    if (tu_verbose()) fprintf(stderr, "%s: logits err %.3g, loss err %.3g\n", what, le, lerr);
    cr_expect_lt(le, LSTM_TOL, "%s: logits err %g", what, le);
    cr_expect_lt(lerr, LSTM_TOL, "%s: loss %.9g vs %.9g", what, st.loss, want);
    double worst = 0;
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        const double e = tu_rel_err(tf_grads(m) + t->offset, gd + t->offset, t->count, 1e-30);
        worst = fmax(worst, e);
        cr_expect_lt(e, LSTM_TOL, "%s: gradient of %s: err %g", what, t->name, e);
        cr_expect_gt(tu_max_abs(gd + t->offset, t->count), 1e-4, "%s: %s has no gradient to check", what, t->name);
    }
    /* the composition's exact gradient against differences of its loss */
    double *fd = tu_alloc_d(np), one = 1.0, fd_worst = 0;
    tu_fd_grad(lstm_loss_fn, &ctx, pd, np, &one, 1, FD_STEP, fd);
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        double mx = tu_max_abs(fd + t->offset, t->count), e = 0;
        for (size_t j = 0; j < t->count; j++) e = fmax(e, fabs(gd[t->offset + j] - fd[t->offset + j]));
        e /= mx > 1e-30 ? mx : 1e-30;
        fd_worst = fmax(fd_worst, e);
        cr_expect_lt(e, LSTM_REF_FD_TOL, "%s: the composition's gradient of %s against differences: %g", what,
                     t->name, e);
    }
    if (tu_verbose()) fprintf(stderr, "%s: worst gradient err %.3g, composition vs differences %.3g\n", what, worst, fd_worst);
    free(fd), free(logits), free(pd), free(gd), free(wd), free((double *)ctx.frames), free(fr), free(mask0);
    tf_destroy(m);
}

Test(ctc_model, lstm_bidirectional_padded) { lstm_case(0.0f, true, 41); }
Test(ctc_model, lstm_bidirectional_dropout) { lstm_case(0.3f, true, 42); }

/* ---- the head's table, training, refusals ---- */

static tf_config ctc_frames_config(void) {
    tf_config c = tm_tiny_config("linear");
    c.input = TF_INPUT_FRAMES;
    c.features = 3;
    c.classes = 4;
    c.causal = false;
    c.head = TF_HEAD_CTC;
    c.max_labels = 3;
    return c;
}

Test(ctc_model, head_table_and_sizes) {
    tf_config c = ctc_frames_config();
    tf_model *m = make(&c, 2);
    cr_expect_eq(tf_classes(m), 5, "classes + the blank");
    cr_expect_eq(tf_target_classes(m), 4);
    const tf_tensor *hw = NULL, *hb = NULL;
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        if (strcmp(tf_param_tensor(m, i)->name, "head.w") == 0) hw = tf_param_tensor(m, i);
        if (strcmp(tf_param_tensor(m, i)->name, "head.b") == 0) hb = tf_param_tensor(m, i);
    }
    cr_assert(hw && hb);
    cr_expect(hw->shape[0] == 5 && hw->shape[1] == c.d_model && hb->count == 5);
    size_t n = 0;
    cr_assert_eq(tf_param_count_for(&c, &n), 0, "%s", ab_error());
    cr_expect_eq(n, tf_param_count(m));
    /* the label inputs and the loss's tables are carved for (max batch, max_len) */
    bool in = false, ws = false;
    for (int i = 0; i < tf_act_tensor_count(m); i++) {
        const tf_tensor *t = tf_act_tensor(m, i);
        if (strcmp(t->name, "ctc.in") == 0) in = t->count == (size_t)2 * (3 + 3);
        if (strcmp(t->name, "ctc.ws") == 0) {
            ctc_dims d = {2, 6, 5, 3};
            ws = t->count == ctc_ws_bytes(&d);
        }
    }
    cr_expect(in && ws, "ctc.in or ctc.ws missing or of the wrong size");
    cr_expect_str_eq(tf_head_name(TF_HEAD_CTC), "ctc");
    cr_expect_eq(tf_head_find("ctc"), TF_HEAD_CTC);
    cr_expect(strstr(tf_head_names(), "categorical, logistic_mixture, ctc"), "%s", tf_head_names());
    tf_destroy(m);
    /* the other heads carve nothing for CTC */
    c.head = TF_HEAD_CATEGORICAL;
    c.max_labels = 0;
    m = make(&c, 2);
    for (int i = 0; i < tf_act_tensor_count(m); i++)
        cr_expect(strncmp(tf_act_tensor(m, i)->name, "ctc.", 4) != 0, "%s", tf_act_tensor(m, i)->name);
    tf_destroy(m);
}

/* A model with the CTC head learns: every row's labels are the signs of its frames'
 * first feature, run-length collapsed (labels 0 and 1 alternate with the runs), Adam
 * (lr 1e-2) on one batch of 4 rows of 12 frames. The loss must fall below a fifth of
 * its start in 150 steps (measured 6.3 -> 0.0017 nats per row), with most rows' best
 * path exactly their labels (measured 4 of 4). */
Test(ctc_model, the_head_learns) {
    tf_config c = ctc_frames_config();
    c.max_len = 12;
    c.max_labels = 12;
    c.classes = 2;
    c.d_model = 16;
    c.d_ff = 32;
    tf_model *m = make(&c, 4);
    const int B = 4, N = 12;
    float *fr = tu_normal((size_t)B * N * 3, 5, 1, 1.0);
    int labels[4 * 12], counts[4];
    for (int b = 0; b < B; b++) {
        counts[b] = 0;
        for (int t = 0; t < N; t++) {
            const int y = fr[(b * N + t) * 3] > 0;
            if (t == 0 || y != (fr[(b * N + t - 1) * 3] > 0)) labels[b * 12 + counts[b]++] = y;
        }
    }
    ab_optim_config oc;
    ab_optim_config_default(&oc);
    oc.kind = AB_OPTIM_ADAM;
    oc.lr = 1e-2;
    ab_optim *o = NULL;
    cr_assert_eq(ab_optim_create(&oc, tf_param_count(m), NULL, 0, &o), 0, "%s", ab_error());
    ce_stats st;
    double first = 0;
    for (int s = 0; s < 150; s++) {
        cr_assert_eq(tf_zero_grad(m), 0);
        cr_assert_eq(tf_forward_frames(m, fr, B, N, NULL, true, (uint64_t)s), 0, "%s", ab_error());
        cr_assert_eq(tf_loss_ctc(m, labels, counts, NULL, &st), 0, "%s", ab_error());
        cr_assert(isfinite(st.loss), "loss %g at step %d", st.loss, s);
        if (s == 0) first = st.loss;
        cr_assert_eq(tf_backward(m), 0, "%s", ab_error());
        cr_assert_eq(ab_optim_step(o, tf_params(m), tf_grads(m), NULL), 0, "%s", ab_error());
    }
    if (tu_verbose()) fprintf(stderr, "ctc training: %.4g -> %.4g nats per row, %lld of %lld rows exact\n", first, st.loss,
                           st.correct, st.counted);
    cr_expect_lt(st.loss, 0.2 * first, "loss %g -> %g", first, st.loss);
    cr_expect_geq(st.correct, 3, "%lld of 4 rows decoded exactly", st.correct);
    ab_optim_destroy(o);
    free(fr);
    tf_destroy(m);
}

static void expect_create_error(const tf_config *c, const char *needle) {
    tf_model *m = (tf_model *)1;
    cr_expect_eq(tf_create(c, 2, &m), AB_EINVAL, "accepted (expected '%s')", needle);
    cr_expect_null(m);
    cr_expect(strstr(ab_error(), needle), "message '%s' lacks '%s'", ab_error(), needle);
}

Test(ctc_model, bad_configs_and_calls) {
    tf_config c = ctc_frames_config();
    c.max_labels = 0;
    expect_create_error(&c, "model max_labels 0: the ctc head needs 1..max_len (6)");
    c.max_labels = 7;
    expect_create_error(&c, "model max_labels 7");
    c = ctc_frames_config();
    c.head = TF_HEAD_CATEGORICAL;
    expect_create_error(&c, "model max_labels 3: only the ctc head takes label sequences");

    c = ctc_frames_config();
    tf_model *m = make(&c, 2);
    float fr[2 * 6 * 3] = {0};
    int lab[6] = {0, 1, 2, 3, 3, 3}, cnt[2] = {3, 2}, tg[12] = {0};
    const int lens[2] = {6, 3};
    ce_stats st;
    cr_expect_eq(tf_loss_ctc(m, lab, cnt, NULL, &st), AB_EINVAL, "before a forward");
    cr_assert_eq(tf_forward_frames(m, fr, 2, 6, lens, true, 0), 0, "%s", ab_error());
    cr_expect_eq(tf_loss(m, tg, NULL, &st), AB_EINVAL);
    cr_expect(strstr(ab_error(), "tf_loss_ctc"), "%s", ab_error());
    cr_expect_eq(tf_backward(m), AB_EINVAL, "backward without a loss");
    struct {
        int l3, c0, c1;
        float w1;
        const char *needle;
    } bad[] = {
        {3, 4, 2, 1.0f, "row 0 has 4 labels, outside [0, max_labels=3]"},
        {3, -1, 2, 1.0f, "row 0 has -1 labels"},
        {4, 3, 2, 1.0f, "label 4 at row 1, position 0 is outside [0, classes=4)"},
        {3, 3, 2, -1.0f, "the weight -1 of row 1"},
        {3, 3, 2, INFINITY, "the weight inf of row 1"},
        /* row 1: labels 3 3 need 3 frames; give it 3 labels 3 3 3 (5 frames) in 3 */
        {3, 3, 3, 1.0f, "row 1: 3 labels with 2 adjacent repeats need at least 5 frames, the row has 3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        lab[3] = bad[i].l3;
        int cn[2] = {bad[i].c0, bad[i].c1};
        float w[2] = {1.0f, bad[i].w1};
        cr_expect_eq(tf_loss_ctc(m, lab, cn, w, &st), AB_EINVAL, "case %zu accepted", i);
        cr_expect(strstr(ab_error(), bad[i].needle), "case %zu: '%s' lacks '%s'", i, ab_error(), bad[i].needle);
    }
    /* a row of weight 0 is not read: its count and labels may be anything */
    lab[3] = 3;
    int cn[2] = {3, 99};
    float w[2] = {1.0f, 0.0f};
    cr_expect_eq(tf_loss_ctc(m, lab, cn, w, &st), 0, "%s", ab_error());
    cr_expect_eq(st.counted, 1);
    cr_expect_eq(tf_backward(m), 0, "%s", ab_error());
    tf_destroy(m);
    /* tf_loss_ctc on a categorical model */
    c.head = TF_HEAD_CATEGORICAL;
    c.max_labels = 0;
    m = make(&c, 2);
    cr_assert_eq(tf_forward_frames(m, fr, 2, 6, NULL, true, 0), 0, "%s", ab_error());
    cr_expect_eq(tf_loss_ctc(m, lab, cnt, NULL, &st), AB_EINVAL);
    cr_expect(strstr(ab_error(), "the model's head is categorical, not ctc"), "%s", ab_error());
    tf_destroy(m);
}
