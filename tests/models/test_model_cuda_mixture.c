/* Device errors, the logistic mixture and the draws of sampling on CUDA against the CPU (part of
 * test_model_cuda; the suite's purpose and tolerances are described in
 * test_model_cuda.c, its shared helpers in test_model_cuda.h). */
#include "test_model_cuda.h"

#include "draw_core.h"

/* ======================================================================================
 * Errors
 * ==================================================================================== */

Test(errors_cuda, bad_device_and_out_of_memory) {
    const ab_device no_device = 7; /* outside the enum */
    tf_config c = tiny_config("linear", no_device);
    tf_model *m = (tf_model *)1;
    cr_expect_eq(tf_create(&c, 2, &m), AB_EINVAL);
    cr_expect_null(m);
    cr_expect(strstr(ab_error(), "model device 7"), "%s", ab_error());
    ab_optim_config oc;
    ab_optim_config_default(&oc);
    ab_optim *o = (ab_optim *)1;
    cr_expect_eq(ab_optim_create_on(no_device, &oc, 10, NULL, 0, &o), AB_EINVAL);
    cr_expect_null(o);
    require_cuda();
#ifdef TEST_CUDA_EMU
    /* a device too small for the model: AB_ENOMEM naming the size, nothing leaked */
    const size_t cap0 = ab_emu_device_memory(), c0 = ab_mem_current(AB_DEV_CUDA);
    ab_emu_set_device_memory(c0 + 4096);
    c = tiny_config("linear", AB_DEV_CUDA);
    m = (tf_model *)1;
    int rc = tf_create(&c, 2, &m);
    ab_emu_set_device_memory(cap0);
    cr_expect_eq(rc, AB_ENOMEM, "%s", ab_error());
    cr_expect_null(m);
    cr_expect(strstr(ab_error(), "on the CUDA device"), "%s", ab_error());
    cr_expect_eq(ab_mem_current(AB_DEV_CUDA), c0, "a failed creation leaked device memory");
#endif
    /* misuse on the device is refused as on the CPU */
    c = tiny_config("linear", AB_DEV_CUDA);
    m = make(&c, 2);
    float h[60];
    cr_expect_lt(tf_logits_download(m, h), 0, "logits before any forward");
    int toks[12] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1}, tg[12] = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 0};
    cr_expect_lt(tf_forward(m, toks, 3, 4, NULL, true, 0), 0);
    cr_assert_eq(tf_forward(m, toks, 2, 6, NULL, true, 0), 0, "%s", ab_error());
    ce_stats st;
    cr_expect_lt(tf_loss(m, tg, NULL, &st), 0);
    cr_expect(strstr(ab_error(), "target 5 at index 5"), "%s", ab_error());
    tf_destroy(m);
}

/* ======================================================================================
 * The discretised logistic mixture head (layers.h: mixture_*; transformer.h:
 * TF_HEAD_LOGISTIC_MIXTURE) on the device against the CPU
 * ==================================================================================== */

#ifdef TEST_CUDA_BACKEND

/* The forward and backward of BT positions of K components on both devices. The
 * device evaluates the CPU's double expressions (mixture_core.h) with its own exp,
 * log1p and expm1: nll and gradients are the CPU's float values to an ulp or two of
 * the double results (2^-24 relative each), so LAYER_TOL (1e-5) is a wide margin
 * (measured on the emulator, which uses glibc as the CPU does: 0). The most probable
 * value compares masses equal to ~1e-13 relative on both sides (mixture_core.h), so
 * `correct` is the CPU's unless two values tie that closely (random outputs: never). */
static void mixture_cuda_case(int BT, int K, bool weighted, uint64_t seed) {
    const size_t n = (size_t)BT * 3 * K;
    float *out = tu_alloc_f(n), *w = tu_alloc_f(BT);
    int *targets = malloc(sizeof(int) * BT);
    for (int i = 0; i < BT; i++) {
        for (int k = 0; k < K; k++) {
            uint64_t j = (uint64_t)i * K + k;
            out[(size_t)i * 3 * K + k] = (float)(2.0 * ab_rng_normal(seed, 1, j));
            out[(size_t)i * 3 * K + K + k] = (float)(-1.3 + 2.6 * ab_rng_uniform(seed, 2, j));
            out[(size_t)i * 3 * K + 2 * K + k] = (float)(-9.0 + 10.0 * ab_rng_uniform(seed, 3, j));
        }
        w[i] = (float)(i % 4) * 0.5f; /* 0, 0.5, 1, 1.5 */
    }
    tu_fill_int(targets, BT, seed, 4, 0, 255);
    targets[1] = 0;
    targets[2] = 255;
    /* a target at the most probable value of its position: one `correct` for sure */
    targets[3] = mixture_mode(out + 3 * 3 * K, K);
    for (int i = 0; i < BT; i++)
        if (w[i] == 0.0f && weighted) targets[i] = -1; /* unscored: never read */
    float *nll = tu_alloc_f(BT), *dout = tu_normal(n, seed, 5, 1.0);
    float *d_out = dput(out, 4 * n), *d_w = dput(w, 4 * (size_t)BT), *d_dout = dput(dout, 4 * n);
    float *d_nll = dput(NULL, 4 * (size_t)BT);
    int *d_targets = dput(targets, sizeof(int) * BT);
    void *d_ws = dput(NULL, cross_entropy_cuda_ws_bytes(BT));
    const float *wts = weighted ? w : NULL, *d_wts = weighted ? d_w : NULL;
    ce_stats st, dst;
    mixture_forward(&st, nll, out, targets, wts, BT, K);
    cr_assert_eq(mixture_forward_cuda(&dst, d_nll, d_out, d_targets, d_wts, BT, K, d_ws), 0, "%s", ab_error());
    double le = fabs(dst.loss - st.loss) / st.loss;
    if (tu_verbose()) fprintf(stderr, "mixture BT=%d K=%d: loss err %.3g\n", BT, K, le);
    cr_expect_lt(le, 1e-6, "loss %.17g vs %.17g", dst.loss, st.loss);
    cr_expect_eq(dst.weight_sum, st.weight_sum);
    cr_expect_eq(dst.correct, st.correct);
    cr_expect_eq(dst.counted, st.counted);
    cr_expect_geq(st.correct, 1);
    cr_expect_lt(dev_err(d_nll, nll, BT, "mixture nll"), LAYER_TOL);
    mixture_backward(dout, out, targets, wts, st.weight_sum, BT, K);
    cr_assert_eq(mixture_backward_cuda(d_dout, d_out, d_targets, d_wts, st.weight_sum, BT, K), 0, "%s", ab_error());
    cr_expect_lt(dev_err(d_dout, dout, n, "mixture dout"), LAYER_TOL);
    /* the same bits again */
    float *again = tu_alloc_f(BT);
    dget(again, d_nll, 4 * (size_t)BT);
    cr_assert_eq(mixture_forward_cuda(&dst, d_nll, d_out, d_targets, d_wts, BT, K, d_ws), 0, "%s", ab_error());
    cr_expect(dev_same(d_nll, again, 4 * (size_t)BT), "a second forward differs");
    free(out), free(w), free(targets), free(nll), free(dout), free(again);
    dfree(d_out), dfree(d_w), dfree(d_dout), dfree(d_nll), dfree(d_targets), dfree(d_ws);
}

Test(layers_cuda, mixture_forward_backward) {
    require_cuda();
    mixture_cuda_case(13, 10, true, 31);
    mixture_cuda_case(13, 3, false, 32);
    mixture_cuda_case(300, 1, true, 33); /* more positions than the sum's threads */
    mixture_cuda_case(9, 40, true, 34);  /* more components than a warp's lanes */
}

/* Draws of `rows` rows (each n values wide, padded to a row stride ld = n + 3) on the
 * device as the host's functions give them (draw_core.h, ab_rng_uniform at idx0 + b
 * stride): equal value for value. out gets the device's draws; the same values go to
 * column 2 of a table of rows x 5 ints, whose other entries stay as they were. */
static void draws_case(const float *x, int n, int rows, const draw_spec *d, int *out) {
    enum { W = 5, COL = 2 };
    const size_t ld = (size_t)(d->mixture ? 3 * n : n) + 3;
    float *dx = dput(x, sizeof(float) * ld * rows);
    int *dout = dput(NULL, sizeof(int) * rows);
    int *table = malloc(sizeof(int) * W * rows);
    for (int i = 0; i < W * rows; i++) table[i] = -7;
    int *dtable = dput(table, sizeof(int) * W * rows);
    cr_assert_eq(draw_rows_cuda(dout, dtable + COL, W, dx, ld, rows, d), 0, "%s", ab_error());
    dget(out, dout, sizeof(int) * rows);
    dget(table, dtable, sizeof(int) * W * rows);
    int mismatches = 0, table_wrong = 0;
    for (int b = 0; b < rows; b++) {
        const uint64_t i = d->idx0 + (uint64_t)b * d->idx_stride;
        const double u = ab_rng_uniform(d->seed, d->stream, i);
        const int want = d->mixture ? mixture_sample(x + b * ld, n, u, ab_rng_uniform(d->seed, d->stream2, i))
                                    : draw_categorical_core(x + b * ld, n, d->temperature, u);
        mismatches += out[b] != want;
        for (int c = 0; c < W; c++) table_wrong += table[b * W + c] != (c == COL ? want : -7);
    }
    cr_expect_eq(mismatches, 0, "%d of %d draws differ from the host's (n %d, mixture %d, T %g)", mismatches, rows,
                 n, d->mixture, d->temperature);
    cr_expect_eq(table_wrong, 0, "%d entries of the table are not the draws' column", table_wrong);
    free(table);
    dfree(dx), dfree(dout), dfree(dtable);
}

/* Sampling on the device (layers_cuda.h: draw_rows_cuda, what tf_draw_last runs): the
 * host's draws exactly, at the images' 256 classes, at other temperatures and for the
 * mixture head; and the draws follow the distribution: 4000 draws from one row of
 * five logits at T = 0.7 hit each class within 0.035 of softmax(x / T) (5 standard
 * errors at p = 0.5: sqrt(0.25 / 4000) = 0.0079; the seed is fixed). */
Test(layers_cuda, draws_as_the_host) {
    require_cuda();
    enum { R = 64, V = 256, RM = 200, K = 4, RF = 4000 };
    float *x = tu_normal((size_t)R * (V + 3), 41, 1, 2.0);
    int out[RF];
    const draw_spec cat = {false, V, 1.0, 5, 11, 12, 1000, 784};
    draws_case(x, V, R, &cat, out);
    int distinct = 0;
    for (int b = 0; b < R; b++) {
        bool seen = false;
        for (int c = 0; c < b; c++) seen |= out[c] == out[b];
        distinct += !seen;
    }
    cr_expect_gt(distinct, R / 2, "only %d distinct values in %d draws over 256 classes", distinct, R);
    const draw_spec cool = {false, V, 0.25, 5, 11, 12, 7, 1};
    draws_case(x, V, R, &cool, out);
    const draw_spec greedy = {false, V, 0.0, 5, 11, 12, 7, 1};
    draws_case(x, V, R, &greedy, out);
    for (int b = 0; b < R; b++) {
        int am = 0;
        for (int v = 1; v < V; v++)
            if (x[b * (V + 3) + v] > x[b * (V + 3) + am]) am = v;
        cr_expect_eq(out[b], am, "T = 0 is not the first largest in row %d", b);
    }
    free(x);
    /* the mixture head: logits N(0, 1), means in [-1, 1], log-scales in [-4, 0] */
    const size_t ldm = 3 * K + 3;
    float *p = tu_normal((size_t)RM * ldm, 42, 1, 1.0);
    for (int b = 0; b < RM; b++)
        for (int k = 0; k < K; k++) {
            float *r = p + b * ldm;
            r[K + k] = tanhf(r[K + k]);
            r[2 * K + k] = -2.0f + 2.0f * tanhf(r[2 * K + k]);
        }
    const draw_spec mix = {true, K, 1.0, 9, 21, 22, 3, 5};
    draws_case(p, K, RM, &mix, out);
    int lo = 255, hi = 0;
    for (int b = 0; b < RM; b++) lo = out[b] < lo ? out[b] : lo, hi = out[b] > hi ? out[b] : hi;
    cr_expect(lo >= 0 && hi <= 255 && hi - lo > 64, "mixture draws span %d..%d", lo, hi);
    free(p);
    /* frequencies of one row drawn RF times */
    const float row[5] = {0.3f, -0.5f, 1.0f, 0.0f, 0.2f};
    float *rep = tu_alloc_f((size_t)RF * 8);
    for (int b = 0; b < RF; b++) memcpy(rep + b * 8, row, sizeof row);
    const draw_spec freq = {false, 5, 0.7, 3, 31, 32, 0, 1};
    draws_case(rep, 5, RF, &freq, out);
    double z = 0, pr[5], count[5] = {0};
    for (int v = 0; v < 5; v++) z += exp(row[v] / 0.7);
    for (int v = 0; v < 5; v++) pr[v] = exp(row[v] / 0.7) / z;
    for (int b = 0; b < RF; b++) count[out[b]] += 1;
    for (int v = 0; v < 5; v++)
        cr_expect_lt(fabs(count[v] / RF - pr[v]), 0.035, "class %d drawn %.4f of the time, p = %.4f", v, count[v] / RF,
                     pr[v]);
    free(rep);
}

#endif /* TEST_CUDA_BACKEND */

/* The tiny transformer with the mixture head (K = 3, 9 outputs per position) on both
 * devices: logits, loss, statistics and every gradient, within the model tolerances
 * above (the head adds double arithmetic only; measured on the emulator: logits
 * 2.4e-7, loss 3.3e-8, gradients <= 1.5e-6 per tensor). */
Test(model_cuda, logistic_mixture_head) {
    tf_config cc = tiny_config("linear", AB_DEV_CPU);
    cc.head = TF_HEAD_LOGISTIC_MIXTURE;
    cc.mixtures = 3;
    cc.classes = 256;
    tf_config gc = cc;
    gc.device = AB_DEV_CUDA;
    const int B = 2, N = 6;
    tf_model *g = make(&gc, B), *m = make(&cc, B);
    cr_assert_eq(tf_classes(g), 9);
    cr_assert_eq(tf_target_classes(g), 256);
    const size_t np = tf_param_count(m);
    float *pc = tf_params(m), *gg = tu_alloc_f(np);
    for (size_t i = 0; i < np; i++) pc[i] += (float)(0.2 * ab_rng_normal(41, 900, i));
    cr_assert_eq(tf_params_upload(g, pc), 0, "%s", ab_error());
    int tokens[12], targets[12];
    float weights[12];
    tu_fill_int(tokens, 12, 41, 1, 0, cc.vocab - 1);
    tu_fill_int(targets, 12, 41, 2, 0, 255);
    targets[0] = 0;
    targets[1] = 255;
    for (int i = 0; i < 12; i++) weights[i] = (float)(i % 3) * 0.5f + 0.25f;
    weights[5] = 0.0f;
    targets[5] = 9999; /* unscored */
    ce_stats sc, sg;
    tf_model *both[2] = {m, g};
    ce_stats *st[2] = {&sc, &sg};
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(tf_zero_grad(both[d]), 0);
        cr_assert_eq(tf_forward(both[d], tokens, B, N, NULL, true, 5), 0, "%s", ab_error());
        cr_assert_eq(tf_loss(both[d], targets, weights, st[d]), 0, "%s", ab_error());
        cr_assert_eq(tf_backward(both[d]), 0, "%s", ab_error());
    }
    const size_t nl = (size_t)B * N * 9;
    float *lg = tu_alloc_f(nl);
    cr_assert_eq(tf_logits_download(g, lg), 0, "%s", ab_error());
    double *want = tu_to_double(tf_logits(m), nl);
    double le = tu_rel_err(lg, want, nl, 1e-30), lerr = fabs(sg.loss - sc.loss) / sc.loss;
    if (tu_verbose()) fprintf(stderr, "mixture model: logits err %.3g, loss err %.3g\n", le, lerr);
    cr_expect_lt(le, MODEL_FWD_TOL, "logits err %g", le);
    cr_expect_lt(lerr, MODEL_FWD_TOL, "loss %.9g vs CPU %.9g", sg.loss, sc.loss);
    cr_expect_eq(sg.counted, 11);
    cr_expect_eq(sg.counted, sc.counted);
    cr_expect_eq(sg.correct, sc.correct);
    cr_expect_eq(sg.weight_sum, sc.weight_sum);
    cr_assert_eq(tf_grads_download(g, gg), 0, "%s", ab_error());
    double worst = 0;
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        double *gw = tu_to_double(tf_grads(m) + t->offset, t->count);
        double e = tu_rel_err(gg + t->offset, gw, t->count, 1e-30);
        worst = fmax(worst, e);
        cr_expect_lt(e, MODEL_GRAD_TOL, "gradient of %s: err %g", t->name, e);
        cr_expect_gt(tu_max_abs(gw, t->count), 1e-6, "%s has no gradient to compare", t->name);
        free(gw);
    }
    if (tu_verbose()) fprintf(stderr, "mixture model: worst gradient err %.3g\n", worst);
    free(want), free(lg), free(gg);
    tf_destroy(m);
    tf_destroy(g);
}
