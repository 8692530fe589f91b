/* The CTC loss on CUDA against the CPU: the layer (ctc.h: ctc_forward_cuda,
 * ctc_backward_cuda) on shapes with more states and outputs than a block has threads,
 * more rows than one pass, rows without frames or labels, repeats, rows that barely
 * fit, impossible rows, weights of 0 and padding (NaN logits past a row's frames,
 * never read; zero gradient there), and the same bits on a repeat; then the model with
 * the CTC head (a non-causal transformer and a bidirectional LSTM over frames) on both
 * devices: logits, loss, statistics and every gradient.
 *
 * Written once, built twice (tests/meson.build), like test_model_cuda.c: test_ctc_cuda
 * on the real library (skips without a device) and test_ctc_cuda_emu on the emulated
 * one (runs everywhere, also in the emulator's strict mode). Error figures are
 * tu_rel_err; TEST_VERBOSE=1 prints them. */
#include <criterion/criterion.h>

#include "ctc.h"
#include "cuda_device.h"
#include "device.h"
#include "error.h"
#include "memory.h"
#include "rng.h"
#include "test_model_util.h"
#include "test_util.h"
#include "transformer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Everything below calls the CUDA layers: compiled where the build has them (the real
 * backend with nvcc, or the emulator); a build without CUDA (the sanitized one) links
 * an empty suite, which test_device_main.c skips. */
#ifdef TEST_CUDA_BACKEND

static void require_cuda(void) {
    if (ab_cuda_init()) cr_skip_test("CUDA not available here: %s", ab_error());
}

static void *dput(const void *h, size_t bytes) {
    void *d = NULL;
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &d, bytes ? bytes : 4), 0, "%s", ab_error());
    if (h && bytes) cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d, h, bytes), 0, "%s", ab_error());
    return d;
}

static void dget(void *h, const void *d, size_t bytes) {
    cr_assert_eq(ab_dev_download(AB_DEV_CUDA, h, d, bytes), 0, "%s", ab_error());
}

/* ======================================================================================
 * The layer
 * ==================================================================================== */

/* The device runs each row's double arithmetic in the CPU's order (ctc_core.h) with its
 * own exp and log (within an ulp or two of glibc's): nll and gradients are the CPU's
 * float values to a rounding or two (2^-24 relative each, and the double log p to
 * ~1e-15): 1e-6 relative is a wide margin, while a missing barrier or a wrong state
 * gives 1e-2 and more (or NaN from a stale read). The loss (double, summed in row
 * order on both) within 1e-12. Measured on the emulator, which uses glibc as the CPU
 * does: 0 (the same bits). */
#define LAYER_TOL 1e-6

typedef struct {
    int T, L;
    float w;
} row_spec;

static void layer_case(int N, int K, int S, const row_spec *rows, int B, uint64_t seed, const char *what) {
    const ctc_dims d = {B, N, K, S};
    cr_assert_eq(ctc_dims_check(&d), 0, "%s", ab_error());
    const size_t n = (size_t)B * N * K, wsb = ctc_ws_bytes(&d);
    float *x = tu_normal(n, seed, 1, 2.0), *w = tu_alloc_f(B), *nll = tu_alloc_f(B), *g = tu_normal(n, seed, 2, 1.0);
    int *len = malloc(sizeof(int) * B), *cnt = malloc(sizeof(int) * B), *lab = malloc(sizeof(int) * (size_t)(B * S + 1));
    for (int i = 0; i < B * S; i++) lab[i] = -5; /* past each count: never read */
    for (int b = 0; b < B; b++) {
        len[b] = rows[b].T;
        cnt[b] = rows[b].L;
        w[b] = rows[b].w;
        int r[128];
        cr_assert_leq(rows[b].L, 128);
        tu_fill_int(r, 128, seed, 10 + b, 0, K - 2);
        if (rows[b].L >= 3) r[2] = r[1]; /* a repeat */
        for (int j = 0; j < rows[b].L; j++) lab[b * S + j] = r[j];
        for (size_t i = (size_t)rows[b].T * K; i < (size_t)N * K; i++) x[(size_t)b * N * K + i] = NAN;
    }
    float *d_x = dput(x, 4 * n), *d_w = dput(w, 4 * (size_t)B), *d_nll = dput(NULL, 4 * (size_t)B);
    float *d_g = dput(g, 4 * n);
    int *d_len = dput(len, sizeof(int) * B), *d_cnt = dput(cnt, sizeof(int) * B);
    int *d_lab = dput(lab, sizeof(int) * (size_t)(B * S + 1));
    void *ws = ab_alloc(wsb), *d_ws = dput(NULL, wsb);
    ce_stats st, dst;
    ctc_forward(&st, nll, &d, x, len, lab, cnt, w, ws);
    cr_assert_eq(ctc_forward_cuda(&dst, d_nll, &d, d_x, d_len, d_lab, d_cnt, d_w, d_ws), 0, "%s", ab_error());
    /* the gradient accumulates into a non-zero start (g), as the model's does from 0 */
    ctc_backward(g, &d, x, len, lab, cnt, w, st.weight_sum, ws);
    cr_assert_eq(ctc_backward_cuda(d_g, &d, d_x, d_len, d_lab, d_cnt, d_w, st.weight_sum, d_ws), 0, "%s", ab_error());
    float *hn = tu_alloc_f(B), *hg = tu_alloc_f(n);
    dget(hn, d_nll, 4 * (size_t)B);
    dget(hg, d_g, 4 * n);
    int inf = 0;
    for (int b = 0; b < B; b++) {
        if (isinf(nll[b])) {
            inf++;
            cr_expect(isinf(hn[b]), "%s: row %d: CPU inf, device %g", what, b, (double)hn[b]);
        } else
            cr_expect(fabsf(hn[b] - nll[b]) <= LAYER_TOL * fmaxf(fabsf(nll[b]), 1e-30f), "%s: row %d: %.9g vs %.9g", what,
                      b, (double)hn[b], (double)nll[b]);
    }
    if (isinf(st.loss)) cr_expect(isinf(dst.loss), "%s: loss %g", what, dst.loss);
    else cr_expect(fabs(dst.loss - st.loss) <= 1e-12 * st.loss, "%s: loss %.17g vs %.17g", what, dst.loss, st.loss);
    cr_expect_eq(dst.weight_sum, st.weight_sum);
    cr_expect_eq(dst.counted, st.counted);
    cr_expect_eq(dst.correct, st.correct);
    double *gw = tu_to_double(g, n);
    const double e = tu_rel_err(hg, gw, n, 1e-30);
    if (tu_verbose()) fprintf(stderr, "%s: loss %.9g vs %.9g, gradient err %.3g, %d impossible rows\n", what, dst.loss,
                           st.loss, e, inf);
    cr_expect_lt(e, LAYER_TOL, "%s: gradient err %g", what, e);
    /* again: the same bits */
    ce_stats d2;
    float *hn2 = tu_alloc_f(B);
    cr_assert_eq(ctc_forward_cuda(&d2, d_nll, &d, d_x, d_len, d_lab, d_cnt, d_w, d_ws), 0, "%s", ab_error());
    dget(hn2, d_nll, 4 * (size_t)B);
    cr_expect(memcmp(hn, hn2, 4 * (size_t)B) == 0 && d2.loss == dst.loss, "%s: a repeat differs", what);
    free(x), free(w), free(nll), free(g), free(len), free(cnt), free(lab), free(hn), free(hg), free(gw), free(hn2);
    ab_free(ws);
    ab_dev_free(AB_DEV_CUDA, d_x), ab_dev_free(AB_DEV_CUDA, d_w), ab_dev_free(AB_DEV_CUDA, d_nll);
    ab_dev_free(AB_DEV_CUDA, d_g), ab_dev_free(AB_DEV_CUDA, d_len), ab_dev_free(AB_DEV_CUDA, d_cnt);
    ab_dev_free(AB_DEV_CUDA, d_lab), ab_dev_free(AB_DEV_CUDA, d_ws);
}

Test(ctc_cuda, rows_of_every_kind) {
    require_cuda();
    const row_spec rows[] = {
        {9, 4, 1.0f},  /* 4 labels (labels 1 and 2 always equal: a repeat) in 9 frames */
        {6, 4, 0.5f},  /* ... in 6 */
        {5, 4, 2.0f},  /* ... in 5: fits exactly when there is no other repeat */
        {1, 1, 1.0f},  /* one frame */
        {0, 0, 1.0f},  /* no frames, no labels */
        {7, 0, 1.5f},  /* no labels */
        {3, 4, 1.0f},  /* impossible: 5 frames needed */
        {8, 3, 0.0f},  /* weight 0 */
    };
    layer_case(9, 5, 4, rows, 8, 51, "rows of every kind");
}

Test(ctc_cuda, more_states_and_outputs_than_threads) {
    require_cuda();
    /* 2 S + 1 = 141 states and K = 150 outputs: more than the block's 128 threads */
    const row_spec rows[] = {{100, 70, 1.0f}, {90, 40, 0.5f}, {75, 70, 1.0f}};
    layer_case(100, 150, 70, rows, 3, 52, "141 states, 150 outputs");
}

Test(ctc_cuda, many_rows) {
    require_cuda();
    row_spec rows[300];
    for (int b = 0; b < 300; b++) rows[b] = (row_spec){1 + b % 5, b % 3, (float)(b % 4)};
    layer_case(5, 3, 2, rows, 300, 53, "300 rows");
}

/* ======================================================================================
 * The model
 * ==================================================================================== */

static tf_model *make(const tf_config *c, int max_batch) {
    tf_model *m = NULL;
    int rc = tf_create(c, max_batch, &m);
    if (c->device == AB_DEV_CUDA && rc == AB_EDEVICE) cr_skip_test("CUDA not available here: %s", ab_error());
    cr_assert_eq(rc, 0, "tf_create: %s", ab_error());
    return m;
}

/* test_model_cuda.c's model tolerances (logits and loss 1e-5, gradients 5e-5 for the
 * transformer and 1e-5 for the LSTM: each device within test_model.c's bounds of the
 * double reference); the CTC head adds the layer's agreement above. Measured on the
 * emulator: logits <= 1.9e-7, loss <= 3.5e-8, gradients <= 9e-7 per tensor. */
#define MODEL_FWD_TOL 1e-5
#define MODEL_GRAD_TOL 5e-5

static void model_case(tf_config cc, int B, int N, const int *lengths, const int *labels, const int *counts,
                       const float *weights, uint64_t seed, const char *what) {
    tf_config gc = cc;
    gc.device = AB_DEV_CUDA;
    tf_model *g = make(&gc, B), *m = make(&cc, B);
    const size_t np = tf_param_count(m), nl = (size_t)B * N * tf_classes(m);
    float *pc = tf_params(m), *gg = tu_alloc_f(np), *lg = tu_alloc_f(nl);
    for (size_t i = 0; i < np; i++) pc[i] += (float)(0.2 * ab_rng_normal(seed, 900, i));
    cr_assert_eq(tf_params_upload(g, pc), 0, "%s", ab_error());
    float *fr = tu_normal((size_t)B * N * cc.features, seed, 1, 1.0);
    ce_stats sc, sg;
    tf_model *both[2] = {m, g};
    ce_stats *st[2] = {&sc, &sg};
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(tf_zero_grad(both[d]), 0);
        cr_assert_eq(tf_forward_frames(both[d], fr, B, N, lengths, true, 7), 0, "%s", ab_error());
        cr_assert_eq(tf_loss_ctc(both[d], labels, counts, weights, st[d]), 0, "%s", ab_error());
        cr_assert_eq(tf_backward(both[d]), 0, "%s", ab_error());
    }
    cr_assert_eq(tf_logits_download(g, lg), 0, "%s", ab_error());
    double *want = tu_to_double(tf_logits(m), nl);
    const double le = tu_rel_err(lg, want, nl, 1e-30), lerr = fabs(sg.loss - sc.loss) / sc.loss;
    if (tu_verbose()) fprintf(stderr, "%s: logits err %.3g, loss err %.3g\n", what, le, lerr);
    cr_expect_lt(le, MODEL_FWD_TOL, "%s: logits err %g", what, le);
    cr_expect_lt(lerr, MODEL_FWD_TOL, "%s: loss %.9g vs CPU %.9g", what, sg.loss, sc.loss);
    cr_expect_eq(sg.counted, sc.counted);
    cr_expect_eq(sg.weight_sum, sc.weight_sum);
    cr_expect_eq(sg.correct, sc.correct);
    cr_assert_eq(tf_grads_download(g, gg), 0, "%s", ab_error());
    double worst = 0;
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        double *gw = tu_to_double(tf_grads(m) + t->offset, t->count);
        const double e = tu_rel_err(gg + t->offset, gw, t->count, 1e-30);
        worst = fmax(worst, e);
        cr_expect_lt(e, MODEL_GRAD_TOL, "%s: gradient of %s: err %g", what, t->name, e);
        cr_expect_gt(tu_max_abs(gw, t->count), 1e-6, "%s: %s has no gradient to compare", what, t->name);
        free(gw);
    }
    if (tu_verbose()) fprintf(stderr, "%s: worst gradient err %.3g\n", what, worst);
    free(want), free(gg), free(lg), free(fr);
    tf_destroy(m);
    tf_destroy(g);
}

Test(ctc_model_cuda, transformer_non_causal_padded) {
    tf_config c = tm_tiny_config("softmax");
    c.input = TF_INPUT_FRAMES;
    c.features = 3;
    c.classes = 4;
    c.causal = false;
    c.head = TF_HEAD_CTC;
    c.max_labels = 3;
    const int lengths[2] = {6, 4}, counts[2] = {3, 2}, labels[6] = {1, 1, 2, 3, 0, -1};
    const float weights[2] = {0.75f, 1.5f};
    model_case(c, 2, 6, lengths, labels, counts, weights, 61, "transformer + ctc");
}

Test(ctc_model_cuda, lstm_bidirectional_padded) {
    tf_config c = tm_tiny_lstm_config();
    c.head = TF_HEAD_CTC;
    c.max_labels = 4;
    const int lengths[3] = {6, 4, 1}, counts[3] = {4, 2, 1};
    const int labels[12] = {0, 0, 1, 2, 3, 2, -1, -1, 1, -1, -1, -1};
    model_case(c, 3, 6, lengths, labels, counts, NULL, 62, "bidirectional LSTM + ctc");
}

#endif /* TEST_CUDA_BACKEND */
