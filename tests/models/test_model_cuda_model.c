/* The model_cuda suite's transformer and frames + LSTM model on CUDA against the CPU
 * (part of test_model_cuda; the suite's purpose and tolerances are described in
 * test_model_cuda.c, its shared helpers in test_model_cuda.h). */
#include "test_model_cuda.h"

/* ======================================================================================
 * The model
 * ==================================================================================== */

tf_config tiny_config(const char *variant, ab_device dev) {
    tf_config c = tm_tiny_config(variant);
    c.device = dev;
    return c;
}

tf_model *make(const tf_config *c, int max_batch) {
    tf_model *m = NULL;
    int rc = tf_create(c, max_batch, &m);
    if (c->device == AB_DEV_CUDA && rc == AB_EDEVICE) cr_skip_test("CUDA not available here: %s", ab_error());
    cr_assert_eq(rc, 0, "tf_create: %s", ab_error());
    return m;
}

ab_optim_range *param_ranges(const tf_model *m) {
    int n = tf_param_tensor_count(m);
    ab_optim_range *r = malloc(sizeof *r * (size_t)n);
    for (int i = 0; i < n; i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        r[i] = (ab_optim_range){t->offset, t->count, t->decay};
    }
    return r;
}

typedef struct {
    const char *variant;
    bool pre_norm, final_norm, causal, weighted;
    float dropout;
    int lengths[2];
    bool has_lengths;
    const char *set[2]; /* the variant's options (n_set of them) */
    int n_set;
    int max_len; /* 0: the tiny config's */
} model_case;

static void model_vs_cpu(const model_case *mc, uint64_t seed) {
    tf_config cc = tiny_config(mc->variant, AB_DEV_CPU);
    cc.pre_norm = mc->pre_norm;
    cc.final_norm = mc->final_norm;
    cc.causal = mc->causal;
    cc.dropout = mc->dropout;
    cc.attn_settings = mc->set;
    cc.n_attn_settings = mc->n_set;
    if (mc->max_len) cc.max_len = mc->max_len;
    tf_config gc = cc;
    gc.device = AB_DEV_CUDA;
    const int B = 2, N = 6, V = cc.vocab;
    tf_model *g = make(&gc, B), *m = make(&cc, B);
    cr_assert_eq(tf_device(g), AB_DEV_CUDA);
    const size_t np = tf_param_count(m);
    cr_assert_eq(tf_param_count(g), np);
    /* the same initialisation on both devices */
    float *pg = tu_alloc_f(np), *gg = tu_alloc_f(np), *pc = tf_params(m);
    cr_assert_eq(tf_params_download(g, pg), 0, "%s", ab_error());
    cr_assert(memcmp(pg, pc, sizeof(float) * np) == 0, "initial parameters differ between the devices");
    /* move every parameter off its initial value, on both */
    for (size_t i = 0; i < np; i++) pc[i] += (float)(0.2 * ab_rng_normal(seed, 900, i));
    cr_assert_eq(tf_params_upload(g, pc), 0, "%s", ab_error());
    int tokens[12], targets[12];
    float weights[12];
    tu_fill_int(tokens, 12, seed, 1, 0, V - 1);
    tu_fill_int(targets, 12, seed, 2, 0, V - 1);
    for (int i = 0; i < 12; i++) weights[i] = mc->weighted ? (float)(i % 3) * 0.5f + 0.25f : 1.0f;
    const int *lengths = mc->has_lengths ? mc->lengths : NULL;
    if (lengths)
        for (int b = 0; b < B; b++)
            for (int n = lengths[b]; n < N; n++) {
                weights[b * N + n] = 0.0f;
                targets[b * N + n] = -1;
            }
    const uint64_t step_seed = 77;
    ce_stats sc, sg;
    tf_model *both[2] = {m, g};
    ce_stats *st[2] = {&sc, &sg};
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(tf_zero_grad(both[d]), 0);
        cr_assert_eq(tf_forward(both[d], tokens, B, N, lengths, true, step_seed), 0, "%s", ab_error());
        cr_assert_eq(tf_loss(both[d], targets, mc->weighted || lengths ? weights : NULL, st[d]), 0, "%s", ab_error());
        cr_assert_eq(tf_backward(both[d]), 0, "%s", ab_error());
    }
    char what[160];
    snprintf(what, sizeof what, "%s pre_norm=%d final_norm=%d causal=%d dropout=%g lengths=%d weighted=%d",
             mc->variant, mc->pre_norm, mc->final_norm, mc->causal, (double)mc->dropout, lengths != NULL,
             mc->weighted);
    /* logits and loss */
    const size_t nl = (size_t)B * N * V;
    float *lg = tu_alloc_f(nl);
    cr_assert_eq(tf_logits_download(g, lg), 0, "%s", ab_error());
    double *want = tu_to_double(tf_logits(m), nl);
    double le = tu_rel_err(lg, want, nl, 1e-30), lerr = fabs(sg.loss - sc.loss) / sc.loss;
    free(want);
    if (tu_verbose()) fprintf(stderr, "%s: logits err %.3g, loss err %.3g\n", what, le, lerr);
    cr_expect_lt(le, MODEL_FWD_TOL, "%s: logits err %g", what, le);
    cr_expect_lt(lerr, MODEL_FWD_TOL, "%s: loss %.9g vs CPU %.9g", what, sg.loss, sc.loss);
    cr_expect_eq(sg.counted, sc.counted);
    cr_expect_eq(sg.weight_sum, sc.weight_sum);
    /* the dropout masks are the CPU's, bit for bit */
    if (mc->dropout > 0) {
        int masks = 0;
        char *acts = tf_acts(m);
        for (int i = 0; i < tf_act_tensor_count(m); i++) {
            const tf_tensor *t = tf_act_tensor(m, i);
            if (!strstr(t->name, "mask") || t->count == 0) continue;
            const tf_tensor *tg = tf_act_tensor(g, i);
            cr_assert_str_eq(tg->name, t->name);
            cr_expect(dev_same((char *)tf_acts(g) + tg->offset, acts + t->offset, (size_t)B * N * t->shape[2]),
                      "%s: %s differs from the CPU's", what, t->name);
            masks++;
        }
        cr_expect_eq(masks, 3 * cc.layers, "%s: %d dropout masks", what, masks);
    }
    /* every gradient */
    cr_assert_eq(tf_grads_download(g, gg), 0, "%s", ab_error());
    double worst = 0;
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        double *gw = tu_to_double(tf_grads(m) + t->offset, t->count);
        double e = tu_rel_err(gg + t->offset, gw, t->count, 1e-30);
        worst = fmax(worst, e);
        cr_expect_lt(e, MODEL_GRAD_TOL, "%s: gradient of %s: err %g", what, t->name, e);
        cr_expect_gt(tu_max_abs(gw, t->count), 1e-6, "%s: %s has no gradient to compare", what, t->name);
        free(gw);
    }
    if (tu_verbose()) fprintf(stderr, "%s: worst gradient err %.3g\n", what, worst);
    /* one optimiser step on each device (RAdam: its first step is lr * g / (1 - beta1)
     * with the gradient's momentum, linear in the gradient) */
    ab_optim_config oc;
    ab_optim_config_default(&oc);
    oc.lr = 1e-2;
    oc.weight_decay = 0.1;
    ab_optim_range *r = param_ranges(m);
    ab_optim *oc_cpu = NULL, *oc_gpu = NULL;
    cr_assert_eq(ab_optim_create_on(AB_DEV_CPU, &oc, np, r, tf_param_tensor_count(m), &oc_cpu), 0, "%s", ab_error());
    cr_assert_eq(ab_optim_create_on(AB_DEV_CUDA, &oc, np, r, tf_param_tensor_count(m), &oc_gpu), 0, "%s",
                 ab_error());
    ab_optim_info ic, ig;
    float *before = fdup(pc, np);
    cr_assert_eq(ab_optim_step(oc_cpu, tf_params(m), tf_grads(m), &ic), 0, "%s", ab_error());
    cr_assert_eq(ab_optim_step(oc_gpu, tf_params(g), tf_grads(g), &ig), 0, "%s", ab_error());
    cr_expect_lt(fabs(ig.grad_norm - ic.grad_norm) / ic.grad_norm, MODEL_GRAD_TOL, "%s: gradient norms", what);
    cr_assert_eq(tf_params_download(g, pg), 0, "%s", ab_error());
    cr_expect(memcmp(before, tf_params(m), sizeof(float) * np) != 0, "%s: the step changed nothing", what);
    worst = 0;
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        double *pw = tu_to_double(tf_params(m) + t->offset, t->count);
        double e = tu_rel_err(pg + t->offset, pw, t->count, 1e-30);
        worst = fmax(worst, e);
        cr_expect_lt(e, MODEL_STEP_TOL, "%s: %s after one step: err %g", what, t->name, e);
        free(pw);
    }
    if (tu_verbose()) fprintf(stderr, "%s: parameters after a step err %.3g\n", what, worst);
    ab_optim_destroy(oc_cpu);
    ab_optim_destroy(oc_gpu);
    free(r), free(before), free(lg), free(pg), free(gg);
    tf_destroy(m);
    tf_destroy(g);
}

Test(model_cuda, softmax_post_norm) {
    model_case c = {"softmax", false, true, true, false, 0.0f, {0, 0}, false, {NULL, NULL}, 0, 0};
    model_vs_cpu(&c, 11);
}

Test(model_cuda, linear_post_norm_padded_dropout) {
    model_case c = {"linear", false, true, true, true, 0.2f, {6, 4}, true, {NULL, NULL}, 0, 0};
    model_vs_cpu(&c, 12);
}

Test(model_cuda, softmax_pre_norm_bidirectional_padded_dropout) {
    model_case c = {"softmax", true, true, false, true, 0.2f, {3, 6}, true, {NULL, NULL}, 0, 0};
    model_vs_cpu(&c, 13);
}

Test(model_cuda, linear_pre_norm_no_final_norm) {
    model_case c = {"linear", true, false, true, true, 0.0f, {0, 0}, false, {NULL, NULL}, 0, 0};
    model_vs_cpu(&c, 14);
}

Test(model_cuda, stateful_softmax_and_lsh) {
    model_case c = {"stateful-softmax", false, false, true, false, 0.1f, {0, 0}, false, {NULL, NULL}, 0, 0};
    model_vs_cpu(&c, 15);
    model_case l = {"lsh", false, true, true, true, 0.0f, {5, 6}, true, {NULL, NULL}, 0, 0};
    model_vs_cpu(&l, 16);
}

/* tf_create_inference on the device: the same logits bit for bit as the training
 * model in inference mode (4 layers: the two activation sets in turn), fewer bytes. */
Test(model_cuda, inference_model_same_logits) {
    const char *variants[3] = {"softmax", "linear", "lsh"};
    for (int v = 0; v < 3; v++) {
        tf_config c = tiny_config(variants[v], AB_DEV_CUDA);
        c.layers = 4;
        tf_model *m = make(&c, 2), *mi = NULL;
        cr_assert_eq(tf_create_inference(&c, 2, &mi), 0, "%s", ab_error());
        cr_expect_lt(tf_act_bytes(mi), tf_act_bytes(m), "%s", variants[v]);
        const int B = 2, N = 6, tokens[12] = {1, 4, 0, 2, 3, 3, 0, 1, 1, 4, 2, 0}, lengths[2] = {6, 4};
        const size_t nl = (size_t)B * N * c.vocab;
        float *a = malloc(sizeof(float) * nl), *b = malloc(sizeof(float) * nl);
        tf_set_inference(m, true);
        cr_assert_eq(tf_forward(m, tokens, B, N, lengths, false, 9), 0, "%s", ab_error());
        cr_assert_eq(tf_logits_download(m, a), 0, "%s", ab_error());
        cr_assert_eq(tf_forward(mi, tokens, B, N, lengths, false, 9), 0, "%s", ab_error());
        cr_assert_eq(tf_logits_download(mi, b), 0, "%s", ab_error());
        cr_expect(memcmp(a, b, sizeof(float) * nl) == 0, "%s: logits differ", variants[v]);
        free(a);
        free(b);
        tf_destroy(mi);
        tf_destroy(m);
    }
}

/* Tables on the device keep their tensors at their 64-byte offsets from an aligned
 * address: tf_table_bytes is a whole number of 64-byte units, and cudaMalloc aligns to
 * 256, the strict emulator as the size is (its data ends at a guard page; an
 * activation block of 4 mod 8 bytes once put the loss's double sums on 4-byte
 * addresses there). A table of 12, 16 and 20 bytes (148 in all) gets 192; and the
 * models' activation blocks at batches 1-6. */
Test(model_cuda, tables_aligned_on_the_device) {
    require_cuda();
    tf_table t;
    tf_table_init(&t, 1, 64);
    for (int pass = 0; pass < 2; pass++) {
        void *base = NULL;
        if (pass == 1) {
            cr_assert_eq(t.total, 148u);
            cr_assert_eq(tf_table_bytes(&t), 192u);
            cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &base, tf_table_bytes(&t)), 0, "%s", ab_error());
        }
        tf_table_begin(&t, base);
        float *f = tf_carve(&t, "f", sizeof(float), false, 1, 3, 0, 0, 0);
        double *d = tf_carve(&t, "d", sizeof(double), false, 1, 2, 0, 0, 0);
        int *i = tf_carve(&t, "i", sizeof(int), false, 1, 5, 0, 0, 0);
        if (pass == 1) {
            cr_expect_eq((uintptr_t)f % 64, 0);
            cr_expect_eq((uintptr_t)d % 64, 0, "the doubles at %p", (void *)d);
            cr_expect_eq((uintptr_t)i % 64, 0);
            ab_dev_free(AB_DEV_CUDA, base);
        }
    }
    tf_table_free(&t);
    for (int B = 1; B <= 6; B++) {
        tf_config c = tiny_config("linear", AB_DEV_CUDA);
        c.vocab = 7;
        c.max_len = 5;
        tf_model *m = make(&c, B);
        cr_expect_eq((uintptr_t)tf_acts(m) % 64, 0, "batch %d: activations at %p", B, tf_acts(m));
        cr_expect_eq(tf_act_bytes(m) % 64, 0, "batch %d: %zu bytes", B, tf_act_bytes(m));
        tf_destroy(m);
    }
}

/* precision tf32: the model's matrix products (cuBLAS's TF32 mode, and the attention's
 * through its precision option) round their operands to TF32; fp32 models before and
 * after it compute exactly what they did (the precision is given back). Refused: tf32
 * on the CPU, and a precision in the attention's own settings (the model sets it). */
Test(model_cuda, tf32_precision) {
    tf_config c = tiny_config("softmax", AB_DEV_CPU);
    c.precision = AB_PREC_TF32;
    tf_model *bad = NULL;
    cr_assert_eq(tf_create(&c, 2, &bad), AB_EINVAL);
    cr_assert(strstr(ab_error(), "fp32 only"), "%s", ab_error());
    const char *set[1] = {"precision=tf32"};
    c.device = AB_DEV_CUDA;
    c.precision = AB_PREC_FP32;
    c.attn_settings = set;
    c.n_attn_settings = 1;
    cr_assert_eq(tf_create(&c, 2, &bad), AB_EINVAL);
    cr_assert(strstr(ab_error(), "model's precision"), "%s", ab_error());
    cr_assert_null(bad);
    const char *variants[2] = {"softmax", "linear"};
    for (int v = 0; v < 2; v++) {
        tf_config fc = tiny_config(variants[v], AB_DEV_CUDA), tc = fc;
        tc.precision = AB_PREC_TF32;
        tf_model *f = make(&fc, 2), *t = make(&tc, 2);
        const int B = 2, N = 6, tokens[12] = {1, 4, 0, 2, 3, 3, 0, 1, 1, 4, 2, 0}, lengths[2] = {6, 4};
        const size_t nl = (size_t)B * N * fc.vocab;
        float *a = malloc(sizeof(float) * nl), *b = malloc(sizeof(float) * nl), *a2 = malloc(sizeof(float) * nl);
        cr_assert_eq(tf_forward(f, tokens, B, N, lengths, false, 9), 0, "%s", ab_error());
        cr_assert_eq(tf_logits_download(f, a), 0, "%s", ab_error());
        cr_assert_eq(tf_forward(t, tokens, B, N, lengths, true, 9), 0, "%s", ab_error());
        cr_assert_eq(tf_logits_download(t, b), 0, "%s", ab_error());
        ce_stats st;
        cr_assert_eq(tf_loss(t, tokens, NULL, &st), 0, "%s", ab_error());
        cr_assert_eq(tf_backward(t), 0, "%s", ab_error());
        cr_assert(isfinite(st.loss));
        cr_assert_eq(tf_forward(f, tokens, B, N, lengths, false, 9), 0, "%s", ab_error());
        cr_assert_eq(tf_logits_download(f, a2), 0, "%s", ab_error());
        cr_assert(memcmp(a, a2, sizeof(float) * nl) == 0, "%s: the fp32 model changed after a tf32 one ran", variants[v]);
        /* tf32 vs fp32, relative to the largest logit: TF32 keeps 11 significant bits
         * (relative rounding 2^-11 = 4.9e-4 per operand) through two layers of products;
         * measured on the emulator 3.2e-4 (softmax) and 2.7e-4 (linear) of the largest
         * logit. 1e-2 allows 30x; products left in fp32 would give 0 (checked below), a
         * wrong one O(1). */
        double mx = 0, err = 0;
        for (size_t i = 0; i < nl; i++) {
            mx = fmax(mx, fabs((double)a[i]));
            err = fmax(err, fabs((double)a[i] - (double)b[i]));
        }
        if (tu_verbose()) fprintf(stderr, "tf32 %s: logits differ by %.3g of %.3g\n", variants[v], err, mx);
        cr_assert(err <= 1e-2 * mx, "%s: tf32 logits differ by %.3g of %.3g", variants[v], err, mx);
        cr_assert(err > 1e-6 * mx, "%s: tf32 logits equal fp32's (%.3g of %.3g): no TF32 rounding", variants[v], err, mx);
        free(a), free(b), free(a2);
        tf_destroy(f);
        tf_destroy(t);
    }
}

/* linformer: its projections are model parameters on the device, bound to the device's
 * attention per layer (share none) or one block for both layers (share layer), sized
 * for max_len 9 and run at N = 6 (their first columns). */
Test(model_cuda, linformer_none_and_layer) {
    model_case c = {"linformer", false, true, false, true, 0.2f, {6, 4}, true, {"k=3", "share=none"}, 2, 9};
    model_vs_cpu(&c, 17);
    model_case l = {"linformer", true, true, false, false, 0.0f, {0, 0}, false, {"k=4", "share=layer"}, 2, 9};
    model_vs_cpu(&l, 18);
}

/* Two training steps (of two shapes) with the optimiser on the device: no memory is
 * taken on either side, and a repeat gives the same bits. */
Test(model_cuda, no_allocation_per_step_and_repeatable) {
    tf_config c = tiny_config("linear", AB_DEV_CUDA);
    c.dropout = 0.1f;
    tf_model *m = make(&c, 3);
    ab_optim_config oc;
    ab_optim_config_default(&oc);
    ab_optim *o = NULL;
    cr_assert_eq(ab_optim_create_on(AB_DEV_CUDA, &oc, tf_param_count(m), NULL, 0, &o), 0, "%s", ab_error());
    int tokens[18], targets[18], lens[3] = {6, 2, 5};
    tu_fill_int(tokens, 18, 21, 1, 0, c.vocab - 1);
    tu_fill_int(targets, 18, 21, 2, 0, c.vocab - 1);
    float weights[18];
    for (int i = 0; i < 18; i++) weights[i] = 1.0f;
    size_t gpu0 = ab_mem_current(AB_DEV_CUDA), cpu0 = ab_mem_current(AB_DEV_CPU);
    ab_mem_reset_peak(AB_DEV_CUDA);
    ab_mem_reset_peak(AB_DEV_CPU);
    double losses[3];
    const size_t np = tf_param_count(m);
    float *p0 = tu_alloc_f(np), *p1 = tu_alloc_f(np), *g0 = tu_alloc_f(np), *g2 = tu_alloc_f(np);
    cr_assert_eq(tf_params_download(m, p0), 0);
    /* step 0: batch A (3 x 6, padded); step 1: batch B (2 x 4); step 2: A again from
     * the initial parameters, without the optimiser */
    for (int s = 0; s < 3; s++) {
        if (s == 2) cr_assert_eq(tf_params_upload(m, p0), 0);
        bool a = s != 1;
        int B = a ? 3 : 2, N = a ? 6 : 4;
        ce_stats st;
        cr_assert_eq(tf_zero_grad(m), 0);
        cr_assert_eq(tf_forward(m, tokens, B, N, a ? lens : NULL, true, tf_step_seed(5, a ? 0 : 1)), 0, "%s",
                     ab_error());
        cr_assert_eq(tf_loss(m, targets, a ? weights : NULL, &st), 0, "%s", ab_error());
        cr_assert_eq(tf_backward(m), 0, "%s", ab_error());
        if (s == 0) cr_assert_eq(tf_grads_download(m, g0), 0);
        if (s == 2) cr_assert_eq(tf_grads_download(m, g2), 0);
        if (s < 2) cr_assert_eq(ab_optim_step(o, tf_params(m), tf_grads(m), NULL), 0, "%s", ab_error());
        if (s == 1) cr_assert_eq(tf_params_download(m, p1), 0);
        losses[s] = st.loss;
    }
    cr_assert_eq(ab_cuda_sync(), 0, "%s", ab_error());
    cr_expect_eq(ab_mem_current(AB_DEV_CUDA), gpu0, "device memory changed during steps");
    cr_expect_eq(ab_mem_peak(AB_DEV_CUDA), gpu0, "a step allocated device memory");
    cr_expect_eq(ab_mem_current(AB_DEV_CPU), cpu0, "host memory changed during steps");
    cr_expect_eq(ab_mem_peak(AB_DEV_CPU), cpu0, "a step allocated host memory");
    /* the same parameters, batch and seed give the same loss and gradients, bit for bit */
    cr_expect_eq(losses[2], losses[0], "loss %.17g on a repeat, %.17g before", losses[2], losses[0]);
    cr_expect(memcmp(g2, g0, sizeof(float) * np) == 0, "gradients differ on a repeat");
    cr_expect(memcmp(p1, p0, sizeof(float) * np) != 0, "the optimiser changed nothing");
    free(p0), free(p1), free(g0), free(g2);
    ab_optim_destroy(o);
    tf_destroy(m);
}

/* ---- frame input and the LSTM body on the device ---- */

/* The frames + LSTM model (tm_tiny_lstm_config: F = 3, C = 4, H = 3, 2 layers) on
 * CUDA against the same model on the CPU. Each side is within test_model.c's measured
 * bounds of the exact double values (logits <= 1.4e-7, gradients <= 6.7e-7 per
 * tensor), and the device adds only another summation order (cuBLAS, or the
 * emulator's double-accumulated GEMM, against OpenBLAS) and its expf/tanhf (within
 * 2 ulp) through the cell recurrence: lstm_cuda's bound 1e-5 for forward and
 * gradients, while a wrong position, a lost padding row, a mask that is not the CPU's
 * or a device buffer read before it is written (NaN on the emulator) gives 1e-2 or
 * worse. Measured on the emulator (both modes): logits <= 8.3e-8, loss equal,
 * gradients <= 5.9e-7 per tensor (17x margin). */
#define LSTM_MODEL_CUDA_TOL 1e-5

static void lstm_model_vs_cpu(bool bidirectional, float dropout, const int *lengths, uint64_t seed) {
    tf_config cc = tm_tiny_lstm_config();
    cc.bidirectional = bidirectional;
    cc.causal = !bidirectional;
    cc.dropout = dropout;
    tf_config gc = cc;
    gc.device = AB_DEV_CUDA;
    const int B = 3, N = 6, F = cc.features, L = cc.layers;
    /* carved for 4 x 7: the calls run on the first rows of every buffer */
    tf_model *g = make(&gc, B + 1), *m = make(&cc, B + 1);
    cr_assert_eq(tf_device(g), AB_DEV_CUDA);
    const int K = tf_classes(m), DH = (bidirectional ? 2 : 1) * cc.lstm_hidden;
    const size_t np = tf_param_count(m), BT = (size_t)B * N;
    cr_assert_eq(tf_param_count(g), np);
    cr_assert_eq(tf_param_tensor_count(g), tf_param_tensor_count(m));
    float *pg = tu_alloc_f(np), *gg = tu_alloc_f(np), *pc = tf_params(m);
    cr_assert_eq(tf_params_download(g, pg), 0, "%s", ab_error());
    cr_assert(memcmp(pg, pc, sizeof(float) * np) == 0, "initial parameters differ between the devices");
    for (size_t i = 0; i < np; i++) pc[i] += (float)(0.2 * ab_rng_normal(seed, 900, i));
    cr_assert_eq(tf_params_upload(g, pc), 0, "%s", ab_error());
    float *fr = tu_normal(BT * F, seed, 1, 1.0);
    int targets[18];
    float weights[18];
    tu_fill_int(targets, BT, seed, 2, 0, K - 1);
    for (size_t i = 0; i < BT; i++) weights[i] = (float)(i % 3) * 0.5f + 0.25f;
    for (int b = 0; lengths && b < B; b++)
        for (int n = lengths[b]; n < N; n++) {
            weights[b * N + n] = 0.0f;
            targets[b * N + n] = -1;
        }
    const uint64_t step_seed = seed + 1000;
    ce_stats sc, sg;
    tf_model *both[2] = {m, g};
    ce_stats *st[2] = {&sc, &sg};
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(tf_zero_grad(both[d]), 0);
        cr_assert_eq(tf_forward_frames(both[d], fr, B, N, lengths, true, step_seed), 0, "%s", ab_error());
        cr_assert_eq(tf_loss(both[d], targets, weights, st[d]), 0, "%s", ab_error());
        cr_assert_eq(tf_backward(both[d]), 0, "%s", ab_error());
    }
    char what[160];
    int k = snprintf(what, sizeof what, "frames -> lstm %s p=%g lengths", bidirectional ? "bi" : "uni",
                     (double)dropout);
    for (int b = 0; lengths && b < B && k < (int)sizeof what; b++)
        k += snprintf(what + k, sizeof what - (size_t)k, " %d", lengths[b]);
    if (!lengths) snprintf(what + k, sizeof what - (size_t)k, " none");
    /* logits and loss */
    const size_t nl = BT * K;
    float *lg = tu_alloc_f(nl), *lg2 = tu_alloc_f(nl), *gg2 = tu_alloc_f(np);
    cr_assert_eq(tf_logits_download(g, lg), 0, "%s", ab_error());
    double *want = tu_to_double(tf_logits(m), nl);
    double le = tu_rel_err(lg, want, nl, 1e-30), lerr = fabs(sg.loss - sc.loss) / sc.loss;
    free(want);
    if (tu_verbose()) fprintf(stderr, "%s: logits err %.3g, loss err %.3g\n", what, le, lerr);
    cr_expect_lt(le, LSTM_MODEL_CUDA_TOL, "%s: logits err %g", what, le);
    cr_expect_lt(lerr, LSTM_MODEL_CUDA_TOL, "%s: loss %.9g vs CPU %.9g", what, sg.loss, sc.loss);
    cr_expect_eq(sg.counted, sc.counted);
    cr_expect_eq(sg.weight_sum, sc.weight_sum);
    /* the dropout masks (one per layer but the last) are the CPU's, bit for bit */
    int masks = 0;
    for (int i = 0; i < tf_act_tensor_count(m); i++) {
        const tf_tensor *t = tf_act_tensor(m, i);
        if (!strstr(t->name, "mask") || t->count == 0) continue;
        const tf_tensor *tg = tf_act_tensor(g, i);
        cr_assert_str_eq(tg->name, t->name);
        cr_expect(dev_same((char *)tf_acts(g) + tg->offset, (char *)tf_acts(m) + t->offset, BT * DH),
                  "%s: %s differs from the CPU's", what, t->name);
        masks++;
    }
    cr_expect_eq(masks, dropout > 0 ? L - 1 : 0, "%s: %d dropout masks", what, masks);
    /* every gradient */
    cr_assert_eq(tf_grads_download(g, gg), 0, "%s", ab_error());
    double worst = 0;
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        cr_assert_str_eq(tf_param_tensor(g, i)->name, t->name);
        double *gw = tu_to_double(tf_grads(m) + t->offset, t->count);
        double e = tu_rel_err(gg + t->offset, gw, t->count, 1e-30);
        worst = fmax(worst, e);
        if (tu_verbose()) fprintf(stderr, "%s: d%s err %.3g\n", what, t->name, e);
        cr_expect_lt(e, LSTM_MODEL_CUDA_TOL, "%s: gradient of %s: err %g", what, t->name, e);
        cr_expect_gt(tu_max_abs(gw, t->count), 1e-4, "%s: %s has no gradient to compare", what, t->name);
        free(gw);
    }
    if (tu_verbose()) fprintf(stderr, "%s: worst gradient err %.3g\n", what, worst);
    /* the same step again on the device: the same bits */
    ce_stats s2;
    cr_assert_eq(tf_zero_grad(g), 0);
    cr_assert_eq(tf_forward_frames(g, fr, B, N, lengths, true, step_seed), 0, "%s", ab_error());
    cr_assert_eq(tf_loss(g, targets, weights, &s2), 0, "%s", ab_error());
    cr_assert_eq(tf_backward(g), 0, "%s", ab_error());
    cr_assert_eq(tf_logits_download(g, lg2), 0, "%s", ab_error());
    cr_assert_eq(tf_grads_download(g, gg2), 0, "%s", ab_error());
    cr_expect_eq(s2.loss, sg.loss, "%s: loss %.17g on a repeat, %.17g before", what, s2.loss, sg.loss);
    cr_expect(memcmp(lg2, lg, sizeof(float) * nl) == 0, "%s: device logits differ on a repeat", what);
    cr_expect(memcmp(gg2, gg, sizeof(float) * np) == 0, "%s: device gradients differ on a repeat", what);
    free(fr), free(lg), free(lg2), free(pg), free(gg), free(gg2);
    tf_destroy(m);
    tf_destroy(g);
}

Test(model_cuda, lstm_frames_bidirectional_padded) {
    const int lens[3] = {6, 4, 1};
    lstm_model_vs_cpu(true, 0.0f, lens, 31);
}

Test(model_cuda, lstm_frames_bidirectional_padded_dropout) {
    const int lens[3] = {5, 6, 0};
    lstm_model_vs_cpu(true, 0.3f, lens, 32);
}

Test(model_cuda, lstm_frames_unidirectional_causal_dropout) {
    lstm_model_vs_cpu(false, 0.2f, NULL, 33);
}

/* Training steps of two shapes with the optimiser on the device: no memory is taken on
 * either side, and a repeat of the first step gives the same bits. */
Test(model_cuda, lstm_frames_no_allocation_per_step_and_repeatable) {
    tf_config c = tm_tiny_lstm_config();
    c.device = AB_DEV_CUDA;
    c.dropout = 0.3f;
    tf_model *m = make(&c, 3);
    ab_optim_config oc;
    ab_optim_config_default(&oc);
    ab_optim *o = NULL;
    cr_assert_eq(ab_optim_create_on(AB_DEV_CUDA, &oc, tf_param_count(m), NULL, 0, &o), 0, "%s", ab_error());
    const int F = c.features;
    float *fr = tu_normal((size_t)3 * 7 * F, 41, 1, 1.0);
    int targets[21], lens[3] = {7, 2, 0};
    tu_fill_int(targets, 21, 41, 2, 0, c.classes - 1);
    float weights[21];
    for (int b = 0; b < 3; b++)
        for (int n = 0; n < 7; n++) weights[b * 7 + n] = n < lens[b] ? 1.0f : 0.0f;
    const size_t np = tf_param_count(m);
    float *p0 = tu_alloc_f(np), *p1 = tu_alloc_f(np), *g0 = tu_alloc_f(np), *g2 = tu_alloc_f(np);
    cr_assert_eq(tf_params_download(m, p0), 0);
    size_t gpu0 = ab_mem_current(AB_DEV_CUDA), cpu0 = ab_mem_current(AB_DEV_CPU);
    ab_mem_reset_peak(AB_DEV_CUDA);
    ab_mem_reset_peak(AB_DEV_CPU);
    double losses[3];
    /* step 0: batch A (3 x 7, padded, one empty row); step 1: batch B (2 x 5); step 2:
     * A again from the initial parameters, without the optimiser */
    for (int s = 0; s < 3; s++) {
        if (s == 2) cr_assert_eq(tf_params_upload(m, p0), 0);
        bool a = s != 1;
        int B = a ? 3 : 2, N = a ? 7 : 5;
        ce_stats st;
        cr_assert_eq(tf_zero_grad(m), 0);
        cr_assert_eq(tf_forward_frames(m, fr, B, N, a ? lens : NULL, true, tf_step_seed(5, a ? 0 : 1)), 0, "%s",
                     ab_error());
        cr_assert_eq(tf_loss(m, targets, a ? weights : NULL, &st), 0, "%s", ab_error());
        cr_assert_eq(tf_backward(m), 0, "%s", ab_error());
        if (s == 0) cr_assert_eq(tf_grads_download(m, g0), 0);
        if (s == 2) cr_assert_eq(tf_grads_download(m, g2), 0);
        if (s < 2) cr_assert_eq(ab_optim_step(o, tf_params(m), tf_grads(m), NULL), 0, "%s", ab_error());
        if (s == 1) cr_assert_eq(tf_params_download(m, p1), 0);
        losses[s] = st.loss;
    }
    cr_assert_eq(ab_cuda_sync(), 0, "%s", ab_error());
    cr_expect_eq(ab_mem_current(AB_DEV_CUDA), gpu0, "device memory changed during steps");
    cr_expect_eq(ab_mem_peak(AB_DEV_CUDA), gpu0, "a step allocated device memory");
    cr_expect_eq(ab_mem_current(AB_DEV_CPU), cpu0, "host memory changed during steps");
    cr_expect_eq(ab_mem_peak(AB_DEV_CPU), cpu0, "a step allocated host memory");
    cr_expect_eq(losses[2], losses[0], "loss %.17g on a repeat, %.17g before", losses[2], losses[0]);
    cr_expect(memcmp(g2, g0, sizeof(float) * np) == 0, "gradients differ on a repeat");
    cr_expect(memcmp(p1, p0, sizeof(float) * np) != 0, "the optimiser changed nothing");
    free(fr), free(p0), free(p1), free(g0), free(g2);
    ab_optim_destroy(o);
    tf_destroy(m);
}
