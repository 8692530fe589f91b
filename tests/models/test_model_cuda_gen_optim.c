/* Generation, the optimiser, device errors and the logistic mixture on CUDA against the
 * CPU (part of test_model_cuda; the suite's purpose and tolerances are described in
 * test_model_cuda.c, its shared helpers in test_model_cuda.h). */
#include "test_model_cuda.h"

/* ---- generation on the device ---- */

/* Recurrent (prefill, steps) against recomputation, both on the device, and against the
 * CPU model's recomputation: the same float sums in other orders through two layers
 * (test_model.c measures <= 3.6e-7 on the CPU and allows 2e-5); the recurrent step adds
 * each dense layer's bias after its GEMM (encoder.c's enc_step) where recomputation
 * starts the GEMM from it: one more rounding per layer output. Measured on the
 * emulator: <= 2.4e-7 (device recurrent vs device recompute) and <= 3.9e-7 (device vs
 * CPU), post- and pre-norm. The greedy tokens must be the CPU's, which the test only trusts when the top
 * two logits are further apart than that (asserted). */
#define GEN_TOL 2e-5

static void generation_case(const char *variant, bool pre_norm) {
    tf_config c = tiny_config(variant, ATTN_DEVICE_CUDA);
    c.pre_norm = pre_norm;
    c.vocab = 11;
    c.max_len = 12;
    c.d_model = 16;
    c.d_ff = 32;
    c.dropout = 0.1f;
    tf_model *g = make(&c, 2);
    c.device = ATTN_DEVICE_CPU;
    tf_model *m = make(&c, 2);
    const int B = 2, P = 3, G = 8, V = c.vocab, cap = P + G;
    int seq[2 * 11], flat[2 * 11];
    tu_fill_int(seq, (size_t)B * cap, 61, 1, 0, V - 1);
    float rec[22], rnn[22], cpu[22];
    tf_gen *gen = NULL;
    cr_assert_eq(tf_gen_create(g, B, cap, &gen), 0, "%s", ab_error());
    double worst = 0, worst_cpu = 0, min_gap = INFINITY;
    for (int len = P; len < cap; len++) {
        for (int b = 0; b < B; b++) memcpy(flat + b * len, seq + b * cap, sizeof(int) * (size_t)len);
        cr_assert_eq(tf_last_logits(g, flat, B, len, 0, rec), 0, "%s", ab_error());
        cr_assert_eq(tf_last_logits(m, flat, B, len, 0, cpu), 0, "%s", ab_error());
        if (len == P) {
            cr_assert_eq(tf_gen_prefill(gen, flat, P, rnn), 0, "%s", ab_error());
        } else {
            int tok[2] = {seq[len - 1], seq[cap + len - 1]};
            cr_assert_eq(tf_gen_step(gen, tok, rnn), 0, "%s", ab_error());
        }
        double *want = tu_to_double(rec, (size_t)B * V), *wcpu = tu_to_double(cpu, (size_t)B * V);
        double e = tu_rel_err(rnn, want, (size_t)B * V, 1e-30), ec = tu_rel_err(rec, wcpu, (size_t)B * V, 1e-30);
        free(want), free(wcpu);
        worst = fmax(worst, e);
        worst_cpu = fmax(worst_cpu, ec);
        cr_expect_lt(e, GEN_TOL, "%s: recurrent logits at length %d differ by %g", variant, len, e);
        cr_expect_lt(ec, GEN_TOL, "%s: device logits at length %d differ from the CPU's by %g", variant, len, ec);
        for (int b = 0; b < B; b++) {
            int t_cpu = tu_argmax(cpu + b * V, V);
            cr_expect_eq(tu_argmax(rec + b * V, V), t_cpu, "%s: recomputed token differs at %d", variant, len);
            cr_expect_eq(tu_argmax(rnn + b * V, V), t_cpu, "%s: recurrent token differs at %d", variant, len);
            float second = -INFINITY;
            for (int v = 0; v < V; v++)
                if (v != t_cpu && cpu[b * V + v] > second) second = cpu[b * V + v];
            min_gap = fmin(min_gap, (double)(cpu[b * V + t_cpu] - second));
            seq[b * cap + len] = t_cpu; /* greedy continuation */
        }
    }
    if (tu_verbose())
        fprintf(stderr, "generation %s %s-norm: recurrent vs recompute %.3g, device vs CPU %.3g, min gap %.3g\n",
                variant, pre_norm ? "pre" : "post", worst, worst_cpu, min_gap);
    cr_expect_gt(min_gap, 1e-3, "a greedy decision was nearly a tie: pick another seed");
    tf_gen_destroy(gen);
    tf_destroy(g);
    tf_destroy(m);
}

Test(generation_cuda, linear_recurrent_equals_recompute_and_cpu) { generation_case("linear", false); }
Test(generation_cuda, stateful_softmax_recurrent_equals_recompute_and_cpu) { generation_case("stateful-softmax", false); }
Test(generation_cuda, pre_norm_recurrent_equals_recompute_and_cpu) {
    generation_case("linear", true);
    generation_case("stateful-softmax", true);
}

#ifdef TEST_CUDA_EMU
/* Device operations (kernel launches, GEMMs, copies, memsets: what the stream queues,
 * each a launch on a GPU) of one generated token, tf_gen_step, for a model of the
 * sampling shapes' structure
 * (experiments/images/{mnist,cifar10}-linear.json: post-norm, a final layer norm, the
 * logistic mixture head; the counts do not depend on the widths). */
static unsigned long long ops_per_token(const char *variant, int layers, bool pre_norm) {
    tf_config c = tiny_config(variant, ATTN_DEVICE_CUDA);
    c.layers = layers;
    c.pre_norm = pre_norm;
    c.final_norm = true;
    c.head = TF_HEAD_LOGISTIC_MIXTURE;
    c.mixtures = 2;
    c.classes = 256;
    tf_model *m = make(&c, 2);
    tf_gen *gen = NULL;
    cr_assert_eq(tf_gen_create(m, 2, 5, &gen), 0, "%s", ab_error());
    int tok[2] = {1, 2};
    float logits[2 * 8];
    cr_assert_eq(tf_gen_prefill(gen, tok, 1, logits), 0, "%s", ab_error());
    cr_assert_eq(tf_gen_step(gen, tok, logits), 0, "%s", ab_error());
    const unsigned long long before = ab_emu_op_count();
    cr_assert_eq(tf_gen_step(gen, tok, logits), 0, "%s", ab_error());
    const unsigned long long ops = ab_emu_op_count() - before;
    tf_gen_destroy(gen);
    tf_destroy(m);
    return ops;
}

Test(generation_cuda, operations_per_token) {
    /* per layer and outside the layers (input, final norm, head, the tokens' upload and
     * the logits' download), from models of 1 and 3 layers */
    const char *variants[] = {"linear", "stateful-softmax"};
    for (int v = 0; v < 2; v++)
        for (int pre = 0; pre < 2; pre++) {
            const unsigned long long one = ops_per_token(variants[v], 1, pre), three = ops_per_token(variants[v], 3, pre);
            const unsigned long long per_layer = (three - one) / 2, fixed = one - per_layer;
            if (tu_verbose())
                fprintf(stderr, "operations per token: %s %s-norm: %llu per layer + %llu (MNIST, 8 layers: %llu; "
                                "CIFAR-10, 16 layers: %llu)\n",
                        variants[v], pre ? "pre" : "post", per_layer, fixed, 8 * per_layer + fixed,
                        16 * per_layer + fixed);
            /* post-norm: qkv GEMM, bias + split, the attention step (one kernel), output
             * GEMM, bias + residual + norm, FFN GEMM, bias + ReLU, FFN GEMM, bias + residual
             * + norm (before: 17 for linear, 18 for stateful-softmax: biases, splits,
             * merges, residuals, norms and the steps' kernels apart); pre-norm: its first
             * norm too. Outside: the tokens' upload, embedding + positions, the final
             * norm, the head's bias and GEMM, the logits' download (before: 7). */
            cr_expect_eq(per_layer, pre ? 10u : 9u, "%s %s-norm: %llu operations per layer", variants[v],
                         pre ? "pre" : "post", per_layer);
            cr_expect_eq(fixed, 6u, "%s: %llu operations outside the layers", variants[v], fixed);
        }
}
#endif

/* ======================================================================================
 * The optimiser on the device
 * ==================================================================================== */

/* CUDA and CPU optimisers fed the same gradients: parameters, moments and every info
 * field equal bit for bit, step after step (optim_cuda.h says why). */
static void optim_case(ab_optim_kind kind, bool decoupled, double clip, uint64_t seed) {
    const size_t n = 10007; /* three norm blocks, the last one short */
    const ab_optim_range r[3] = {{0, 4000, true}, {4000, 17, false}, {4017, n - 4017, true}};
    ab_optim_config c;
    ab_optim_config_default(&c);
    c.kind = kind;
    c.lr = 3e-3;
    c.weight_decay = 0.05;
    c.decoupled_decay = decoupled;
    c.clip_norm = clip;
    c.n_milestones = 1;
    c.milestones[0] = 5;
    c.warmup = 3;
    ab_optim *oc = NULL, *og = NULL;
    cr_assert_eq(ab_optim_create_on(AB_DEV_CPU, &c, n, r, 3, &oc), 0, "%s", ab_error());
    int rc = ab_optim_create_on(AB_DEV_CUDA, &c, n, r, 3, &og);
    if (rc == AB_EDEVICE) cr_skip_test("CUDA not available here: %s", ab_error());
    cr_assert_eq(rc, 0, "%s", ab_error());
    cr_assert_eq(ab_optim_device(og), AB_DEV_CUDA);
    float *p = tu_normal(n, seed, 1, 1.0), *g = tu_alloc_f(n);
    float *d_p = dput(p, 4 * n), *d_g = dput(NULL, 4 * n);
    for (int t = 1; t <= 8; t++) { /* RAdam: steps 1-5 momentum, 6-8 rectified */
        tu_fill_normal(g, n, seed, 10 + (uint64_t)t, t == 2 ? 30.0 : 1.0); /* step 2 is clipped */
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d_g, g, 4 * n), 0);
        ab_optim_info ic, ig;
        cr_assert_eq(ab_optim_step(oc, p, g, &ic), 0, "%s", ab_error());
        cr_assert_eq(ab_optim_step(og, d_p, d_g, &ig), 0, "%s", ab_error());
        cr_expect_eq(ig.grad_norm, ic.grad_norm, "step %d: norm %.17g vs %.17g", t, ig.grad_norm, ic.grad_norm);
        cr_expect_eq(ig.clip_scale, ic.clip_scale);
        cr_expect_eq(ig.lr, ic.lr);
        cr_expect_eq(ig.rho, ic.rho);
        cr_expect_eq(ig.rectified, ic.rectified);
        cr_expect_eq(ig.step, t);
        cr_expect(dev_same(d_p, p, 4 * n), "%s decoupled=%d clip=%g: parameters differ after step %d",
                  ab_optim_kind_name(kind), decoupled, clip, t);
    }
    /* the states are the same blob */
    const void *sc, *sg;
    size_t bc, bg;
    cr_assert_eq(ab_optim_get_state(oc, &sc, &bc), 0);
    cr_assert_eq(ab_optim_get_state(og, &sg, &bg), 0, "%s", ab_error());
    cr_assert_eq(bg, bc);
    cr_expect(memcmp(sg, sc, bc) == 0, "the device's state differs from the CPU's");
    free(p), free(g);
    dfree(d_p), dfree(d_g);
    ab_optim_destroy(oc);
    ab_optim_destroy(og);
}

Test(optim_cuda, adam_and_radam_bit_for_bit) {
    optim_case(AB_OPTIM_RADAM, true, 50.0, 31);
    optim_case(AB_OPTIM_ADAM, true, 50.0, 32);
    optim_case(AB_OPTIM_ADAM, false, 0.0, 33);
    optim_case(AB_OPTIM_RADAM, false, 0.0, 34);
}

/* State moves between devices and through a checkpoint; a non-finite gradient changes
 * nothing on the device. */
Test(optim_cuda, state_checkpoint_and_refusals) {
    const size_t n = 3001;
    ab_optim_config c;
    ab_optim_config_default(&c);
    ab_optim *a = NULL, *b = NULL, *cpu = NULL;
    int rc = ab_optim_create_on(AB_DEV_CUDA, &c, n, NULL, 0, &a);
    if (rc == AB_EDEVICE) cr_skip_test("CUDA not available here: %s", ab_error());
    cr_assert_eq(rc, 0, "%s", ab_error());
    cr_assert_eq(ab_optim_create_on(AB_DEV_CUDA, &c, n, NULL, 0, &b), 0, "%s", ab_error());
    cr_assert_eq(ab_optim_create(&c, n, NULL, 0, &cpu), 0, "%s", ab_error());
    float *p = tu_normal(n, 41, 1, 1.0), *g = tu_alloc_f(n);
    float *d_pa = dput(p, 4 * n), *d_pb = dput(p, 4 * n), *d_g = dput(NULL, 4 * n);
    char path[512];
    /* TEST_DATA_DIR is the build folder of this binary; a copy run elsewhere (the GPU
     * pack, harness/scripts/gpu-pack.sh) names a scratch folder in ATTNBENCH_TEST_DIR */
    const char *dir = getenv("ATTNBENCH_TEST_DIR");
    snprintf(path, sizeof path, "%s/model_cuda_optim_%d.ckpt", dir && *dir ? dir : TEST_DATA_DIR, (int)getpid());
    for (int t = 1; t <= 9; t++) {
        tu_fill_normal(g, n, 41, (uint64_t)t, 1.0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d_g, g, 4 * n), 0);
        cr_assert_eq(ab_optim_step(a, d_pa, d_g, NULL), 0, "%s", ab_error());
        if (t <= 4) cr_assert_eq(ab_optim_step(b, d_pb, d_g, NULL), 0, "%s", ab_error());
        if (t == 4) {
            /* b's state through a checkpoint into the CPU optimiser, then back into a
             * fresh device optimiser, which carries on */
            ab_ckpt_writer *w = NULL;
            cr_assert_eq(ab_ckpt_begin(path, &w), 0, "%s", ab_error());
            cr_assert_eq(ab_ckpt_add_optim(w, AB_CKPT_OPTIM, b), 0, "%s", ab_error());
            cr_assert_eq(ab_ckpt_commit(w), 0, "%s", ab_error());
            ab_ckpt_reader *r = NULL;
            cr_assert_eq(ab_ckpt_open(path, &r), 0, "%s", ab_error());
            cr_assert_eq(ab_ckpt_get_optim(r, AB_CKPT_OPTIM, cpu), 0, "%s", ab_error());
            ab_ckpt_close(r);
            unlink(path);
            cr_assert_eq(ab_optim_steps(cpu), 4);
            const void *st;
            size_t sb;
            cr_assert_eq(ab_optim_get_state(cpu, &st, &sb), 0);
            ab_optim *b2 = NULL;
            cr_assert_eq(ab_optim_create_on(AB_DEV_CUDA, &c, n, NULL, 0, &b2), 0, "%s", ab_error());
            cr_assert_eq(ab_optim_set_state(b2, st, sb), 0, "%s", ab_error());
            cr_assert_eq(ab_optim_steps(b2), 4);
            ab_optim_destroy(b);
            b = b2;
        } else if (t > 4) {
            cr_assert_eq(ab_optim_step(b, d_pb, d_g, NULL), 0, "%s", ab_error());
        }
    }
    float *pa = tu_alloc_f(n);
    dget(pa, d_pa, 4 * n);
    cr_expect(dev_same(d_pb, pa, 4 * n), "resumed parameters differ from the uninterrupted run");
    /* a NaN gradient: refused, nothing changes */
    g[17] = NAN;
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d_g, g, 4 * n), 0);
    cr_expect_eq(ab_optim_step(a, d_pa, d_g, NULL), AB_EINVAL);
    cr_expect(strstr(ab_error(), "nan"), "%s", ab_error());
    cr_expect_eq(ab_optim_steps(a), 9);
    cr_expect(dev_same(d_pa, pa, 4 * n), "a refused step changed the parameters");
    free(p), free(g), free(pa);
    dfree(d_pa), dfree(d_pb), dfree(d_g);
    ab_optim_destroy(a), ab_optim_destroy(b), ab_optim_destroy(cpu);
}

/* ======================================================================================
 * Errors
 * ==================================================================================== */

Test(errors_cuda, bad_device_and_out_of_memory) {
    tf_config c = tiny_config("linear", (attn_device)7);
    tf_model *m = (tf_model *)1;
    cr_expect_eq(tf_create(&c, 2, &m), AB_EINVAL);
    cr_expect_null(m);
    cr_expect(strstr(ab_error(), "model device 7"), "%s", ab_error());
    ab_optim_config oc;
    ab_optim_config_default(&oc);
    ab_optim *o = (ab_optim *)1;
    cr_expect_eq(ab_optim_create_on((ab_device)7, &oc, 10, NULL, 0, &o), AB_EINVAL);
    cr_expect_null(o);
    require_cuda();
#ifdef TEST_CUDA_EMU
    /* a device too small for the model: AB_ENOMEM naming the size, nothing leaked */
    const size_t cap0 = ab_emu_device_memory(), c0 = ab_mem_current(AB_DEV_CUDA);
    ab_emu_set_device_memory(c0 + 4096);
    c = tiny_config("linear", ATTN_DEVICE_CUDA);
    m = (tf_model *)1;
    int rc = tf_create(&c, 2, &m);
    ab_emu_set_device_memory(cap0);
    cr_expect_eq(rc, AB_ENOMEM, "%s", ab_error());
    cr_expect_null(m);
    cr_expect(strstr(ab_error(), "on the CUDA device"), "%s", ab_error());
    cr_expect_eq(ab_mem_current(AB_DEV_CUDA), c0, "a failed creation leaked device memory");
#endif
    /* misuse on the device is refused as on the CPU */
    c = tiny_config("linear", ATTN_DEVICE_CUDA);
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

#endif /* TEST_CUDA_BACKEND */

/* The tiny transformer with the mixture head (K = 3, 9 outputs per position) on both
 * devices: logits, loss, statistics and every gradient, within the model tolerances
 * above (the head adds double arithmetic only; measured on the emulator: logits
 * 2.4e-7, loss 3.3e-8, gradients <= 1.5e-6 per tensor). */
Test(model_cuda, logistic_mixture_head) {
    tf_config cc = tiny_config("linear", ATTN_DEVICE_CPU);
    cc.head = TF_HEAD_LOGISTIC_MIXTURE;
    cc.mixtures = 3;
    cc.classes = 256;
    tf_config gc = cc;
    gc.device = ATTN_DEVICE_CUDA;
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
