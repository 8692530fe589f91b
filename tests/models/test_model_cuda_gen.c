/* Generation on the device (part of test_model_cuda; the suite's purpose and tolerances
 * are described in test_model_cuda.c, its shared helpers in test_model_cuda.h):
 * recurrent == recomputation == the CPU's logits, greedy tokens and draws, and the
 * device operations a generated token takes. */
#include "test_model_cuda.h"

#include "draw_core.h"

/* Recurrent (prefill, steps) against recomputation, both on the device, and against the
 * CPU model's recomputation: the same float sums in other orders through two layers
 * (test_model.c measures <= 3.6e-7 on the CPU and allows 2e-5); the recurrent step adds
 * each dense layer's bias after its GEMM (encoder.c's enc_step) where recomputation
 * starts the GEMM from it: one more rounding per layer output. Measured on the
 * emulator: <= 2.4e-7 (device recurrent vs device recompute) and <= 3.9e-7 (device vs
 * CPU), post- and pre-norm. The greedy tokens must be the CPU's, which the test only trusts when the top
 * two logits are further apart than that (asserted). */
#define GEN_TOL 2e-5

/* The draw of row b from its logits x (n), as tf_draw_last's spec d gives it. */
static int sample_draw_of(const float *x, int n, const draw_spec *d, int b) {
    return draw_categorical_core(x, n, d->temperature, ab_rng_uniform(d->seed, d->stream, d->idx0 + b * d->idx_stride));
}

static void generation_case(const char *variant, bool pre_norm) {
    tf_config c = tiny_config(variant, AB_DEV_CUDA);
    c.pre_norm = pre_norm;
    c.vocab = 11;
    c.max_len = 12;
    c.d_model = 16;
    c.d_ff = 32;
    c.dropout = 0.1f;
    tf_model *g = make(&c, 2);
    c.device = AB_DEV_CPU;
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
        /* sampling where the logits are (tf_draw_last): the generator's draws from its
         * step's logits on the device are the CPU model's from its own (the logits agree
         * to GEN_TOL; a draw would change only with u z that close to a boundary) */
        const draw_spec d = {false, 0, 1.0, 17, 3, 4, (uint64_t)len, 100};
        int dev_draw[2] = {-1, -1}, cpu_draw[2] = {-2, -2};
        cr_assert_eq(tf_draw_last(g, &d, dev_draw), 0, "%s", ab_error());
        cr_assert_eq(tf_draw_last(m, &d, cpu_draw), 0, "%s", ab_error());
        for (int b = 0; b < B; b++) {
            cr_expect_eq(dev_draw[b], cpu_draw[b], "%s: row %d's draw at length %d differs", variant, b, len);
            cr_expect_eq(cpu_draw[b], sample_draw_of(cpu + b * V, V, &d, b), "%s: the CPU's draw is not its logits'",
                         variant);
        }
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

/* The draws kept on the device (tf_gen_draw, then tf_gen_step from them): the CPU
 * model's kept draws, value for value (the logits agree to GEN_TOL, as above), for a
 * categorical head at T = 1 and 0.5 and for the logistic mixture; and nothing is copied
 * between host and device from the prefill to the table's one download (on the
 * emulator, which counts the copies). */
static void kept_case(const char *variant, bool mixture, double T) {
    enum { B = 3, P = 2, CAP = 10 };
    tf_config c = tiny_config(variant, AB_DEV_CUDA);
    c.vocab = mixture ? 257 : 11;
    c.max_len = CAP;
    c.d_model = 16;
    c.d_ff = 32;
    if (mixture) {
        c.head = TF_HEAD_LOGISTIC_MIXTURE;
        c.mixtures = 3;
        c.classes = 256;
    }
    tf_model *dev = make(&c, B);
    c.device = AB_DEV_CPU;
    tf_model *cpu = make(&c, B);
    const int prompt[B * P] = {1, 2, 3, 4, 5, 6};
    int tables[2][B * CAP];
    tf_model *models[2] = {cpu, dev};
    for (int w = 0; w < 2; w++) {
        tf_gen *g = NULL;
        cr_assert_eq(tf_gen_create(models[w], B, CAP, &g), 0, "%s", ab_error());
        cr_assert_eq(tf_gen_prefill(g, prompt, P, NULL), 0, "%s", ab_error());
#ifdef TEST_CUDA_EMU
        const unsigned long long copies = ab_emu_host_copy_count();
#endif
        for (int j = P - 1; j < CAP; j++) {
            const draw_spec d = {mixture, 0, T, 21, 7, 8, (uint64_t)j, 50};
            cr_assert_eq(tf_gen_draw(g, &d), 0, "%s", ab_error());
            if (j + 1 < CAP) cr_assert_eq(tf_gen_step(g, NULL, NULL), 0, "%s", ab_error());
        }
#ifdef TEST_CUDA_EMU
        if (w == 1)
            cr_expect_eq(ab_emu_host_copy_count(), copies, "%s: %llu copies between host and device in the loop",
                         variant, ab_emu_host_copy_count() - copies);
#endif
        cr_assert_eq(tf_gen_draws(g, tables[w]), 0, "%s", ab_error());
        tf_gen_destroy(g);
    }
    int differ = 0, drawn = 0;
    for (int i = 0; i < B * CAP; i++) differ += tables[0][i] != tables[1][i], drawn += tables[1][i] >= 0;
    cr_expect_eq(differ, 0, "%s (mixture %d, T %g): %d kept draws differ from the CPU's", variant, mixture, T, differ);
    cr_expect_eq(drawn, B * (CAP - P + 1), "%s: %d values drawn", variant, drawn);
    tf_destroy(dev);
    tf_destroy(cpu);
}

Test(generation_cuda, draws_kept_on_the_device) {
    kept_case("linear", false, 1.0);
    kept_case("linear", false, 0.5);
    kept_case("stateful-softmax", false, 1.0);
    kept_case("linear", true, 1.0);
}

#ifdef TEST_CUDA_EMU
/* Device operations (kernel launches, GEMMs, copies, memsets: what the stream queues,
 * each a launch on a GPU) of one generated token for a model of the sampling shapes'
 * structure (experiments/images/{mnist,cifar10}-linear.json: post-norm, a final layer
 * norm, the logistic mixture head; the counts do not depend on the widths): tf_gen_step
 * from host tokens with the logits copied back, or (kept) tf_gen_step from the last
 * draws and tf_gen_draw; *copies gets the copies between host and device among them. */
static unsigned long long ops_per_token(const char *variant, int layers, bool pre_norm, bool kept,
                                        unsigned long long *copies) {
    tf_config c = tiny_config(variant, AB_DEV_CUDA);
    c.layers = layers;
    c.pre_norm = pre_norm;
    c.final_norm = true;
    c.head = TF_HEAD_LOGISTIC_MIXTURE;
    c.mixtures = 2;
    c.classes = 256;
    c.vocab = 257;
    tf_model *m = make(&c, 2);
    tf_gen *gen = NULL;
    cr_assert_eq(tf_gen_create(m, 2, 5, &gen), 0, "%s", ab_error());
    int tok[2] = {1, 2};
    float logits[2 * 8];
    const draw_spec d = {true, 0, 1.0, 1, 2, 3, 0, 1};
    cr_assert_eq(tf_gen_prefill(gen, tok, 1, logits), 0, "%s", ab_error());
    cr_assert_eq(tf_gen_draw(gen, &d), 0, "%s", ab_error());
    cr_assert_eq(tf_gen_step(gen, tok, logits), 0, "%s", ab_error());
    cr_assert_eq(tf_gen_draw(gen, &d), 0, "%s", ab_error());
    const unsigned long long before = ab_emu_op_count(), copies0 = ab_emu_host_copy_count();
    if (kept) {
        cr_assert_eq(tf_gen_step(gen, NULL, NULL), 0, "%s", ab_error());
        cr_assert_eq(tf_gen_draw(gen, &d), 0, "%s", ab_error());
    } else {
        cr_assert_eq(tf_gen_step(gen, tok, logits), 0, "%s", ab_error());
    }
    const unsigned long long ops = ab_emu_op_count() - before;
    *copies = ab_emu_host_copy_count() - copies0;
    tf_gen_destroy(gen);
    tf_destroy(m);
    return ops;
}

Test(generation_cuda, operations_per_token) {
    /* per layer and outside the layers (input, final norm, head, the tokens' upload and
     * the logits' download; or, kept, the draw), from models of 1 and 3 layers */
    const char *variants[] = {"linear", "stateful-softmax"};
    for (int v = 0; v < 2; v++)
        for (int pre = 0; pre < 2; pre++)
            for (int kept = 0; kept < 2; kept++) {
                unsigned long long copies1, copies3;
                const unsigned long long one = ops_per_token(variants[v], 1, pre, kept, &copies1),
                                         three = ops_per_token(variants[v], 3, pre, kept, &copies3);
                const unsigned long long per_layer = (three - one) / 2, fixed = one - per_layer;
                if (tu_verbose())
                    fprintf(stderr, "operations per token%s: %s %s-norm: %llu per layer + %llu (MNIST, 8 layers: %llu; "
                                    "CIFAR-10, 16 layers: %llu), %llu copies between host and device\n",
                            kept ? " (draws kept)" : "", variants[v], pre ? "pre" : "post", per_layer, fixed,
                            8 * per_layer + fixed, 16 * per_layer + fixed, copies1);
                /* post-norm: qkv GEMM, bias + split, the attention step (one kernel), output
                 * GEMM, bias + residual + norm, FFN GEMM, bias + ReLU, FFN GEMM, bias + residual
                 * + norm (before: 17 for linear, 18 for stateful-softmax: biases, splits,
                 * merges, residuals, norms and the steps' kernels apart); pre-norm: its first
                 * norm too. Outside: embedding + positions, the final norm, the head's bias and
                 * GEMM, and the tokens' upload and the logits' download (before: 7), or
                 * (kept) the draw. */
                cr_expect_eq(per_layer, pre ? 10u : 9u, "%s %s-norm: %llu operations per layer", variants[v],
                             pre ? "pre" : "post", per_layer);
                cr_expect_eq(fixed, kept ? 5u : 6u, "%s: %llu operations outside the layers", variants[v], fixed);
                cr_expect_eq(copies1, kept ? 0u : 2u, "%s: %llu copies between host and device", variants[v],
                             copies1);
                cr_expect_eq(copies3, copies1, "%s: copies per layer", variants[v]);
            }
}
#endif

/* Steps fed by the kept draws with their layers and head as one CUDA graph
 * (tf_gen_set_graph) against the same steps without: the same draws, value for value
 * (the graph replays the same operations on the same memory: bit-identical), over two
 * prefills; one recording per prefill and after a forward between steps, one launch per
 * step; on the emulator, which
 * counts them, the same device operations. A variant whose step depends on its position,
 * a model on the CPU and a recording that fails run the steps as before and say why
 * (note_has: a part of that note; NULL: the graph must run). */
static void graph_case(const char *variant, const char *setting, ab_device dev, bool spoil, const char *note_has) {
    enum { B = 2, P = 2, CAP = 8, BATCHES = 2 };
    tf_config c = tiny_config(variant, dev);
    const char *const sets[1] = {setting};
    if (setting) c.n_attn_settings = 1, c.attn_settings = sets;
    c.vocab = 11;
    c.max_len = CAP;
    tf_model *m = make(&c, B);
    const int prompt[B * P] = {1, 2, 3, 4};
    int tables[2][BATCHES][B * CAP];
    unsigned long long ops[2] = {0, 0}, subs[2] = {0, 0}, step_ops[2] = {0, 0};
    (void)ops, (void)subs, (void)step_ops, (void)spoil; /* the emulator's counts and failures only */
    for (int w = 0; w < 2; w++) {
        tf_gen *g = NULL;
        cr_assert_eq(tf_gen_create(m, B, CAP, &g), 0, "%s", ab_error());
        if (w) cr_assert_eq(tf_gen_set_graph(g, true), 0, "%s", ab_error());
        for (int bt = 0; bt < BATCHES; bt++) {
            if (bt) cr_assert_eq(tf_gen_init(g), 0, "%s", ab_error());
            cr_assert_eq(tf_gen_prefill(g, prompt, P, NULL), 0, "%s", ab_error());
#ifdef TEST_CUDA_EMU
            if (w && spoil && bt == 0) ab_emu_spoil_next_capture();
            const unsigned long long ops0 = ab_emu_op_count();
#endif
            for (int j = P - 1; j < CAP; j++) {
                const draw_spec d = {false, 0, 1.0, 21 + (uint64_t)bt, 7, 8, (uint64_t)j, 50};
                cr_assert_eq(tf_gen_draw(g, &d), 0, "%s", ab_error());
                /* a forward of the model between two steps (it may grow the attention's
                 * workspace): the graph is recorded again */
                if (bt == 1 && j == P + 1) cr_assert_eq(tf_last_logits(m, prompt, B, P, 0, NULL), 0, "%s", ab_error());
#ifdef TEST_CUDA_EMU
                const unsigned long long s0 = ab_emu_submission_count(), o0 = ab_emu_op_count();
#endif
                if (j + 1 < CAP) cr_assert_eq(tf_gen_step(g, NULL, NULL), 0, "%s %s: %s", variant, w ? "graph" : "", ab_error());
#ifdef TEST_CUDA_EMU
                if (bt == 0 && j == P) /* the second step after the prefill (the graph's first replay) */
                    subs[w] = ab_emu_submission_count() - s0, step_ops[w] = ab_emu_op_count() - o0;
#endif
            }
#ifdef TEST_CUDA_EMU
            ops[w] += ab_emu_op_count() - ops0;
#endif
            cr_assert_eq(tf_gen_position(g), CAP);
            cr_assert_eq(tf_gen_draws(g, tables[w][bt]), 0, "%s", ab_error());
        }
        if (w) {
            long long records = -1, launches = -1;
            const char *note = tf_gen_graph_note(g, &records, &launches);
            if (note_has) {
                cr_expect(note && strstr(note, note_has), "%s: note '%s', expected '%s'", variant, note ? note : "(none)",
                          note_has);
                cr_expect_eq(launches, 0, "%s: %lld graph launches", variant, launches);
            } else {
                cr_expect_null(note, "%s: no graph: %s", variant, note ? note : "");
                cr_expect_eq(records, BATCHES + 1, "%s: %lld recordings for %d prefills and a forward", variant, records,
                             BATCHES);
                cr_expect_eq(launches, BATCHES * (CAP - P), "%s: %lld graph launches for %d steps", variant, launches,
                             BATCHES * (CAP - P));
            }
        }
        tf_gen_destroy(g);
    }
    for (int bt = 0; bt < BATCHES; bt++) {
        int differ = 0;
        for (int i = 0; i < B * CAP; i++) differ += tables[0][bt][i] != tables[1][bt][i];
        cr_expect_eq(differ, 0, "%s (%s): %d draws differ with the graph (prefill %d)", variant, setting ? setting : "",
                     differ, bt);
    }
#ifdef TEST_CUDA_EMU
    if (dev == AB_DEV_CUDA) {
        cr_expect_eq(ops[1], ops[0], "%s: %llu device operations with the graph, %llu without", variant, ops[1], ops[0]);
        /* from the host, a step is its operations one by one, or with the graph two: the
         * position's embedding and the graph's launch (the same operations on the device) */
        cr_expect_eq(step_ops[1], step_ops[0], "%s: a step's operations", variant);
        cr_expect_eq(subs[0], step_ops[0], "%s: %llu submissions for %llu operations", variant, subs[0], step_ops[0]);
        cr_expect_eq(subs[1], note_has ? subs[0] : 2u, "%s: %llu submissions for a step with the graph", variant,
                     subs[1]);
        cr_expect_gt(step_ops[0], 2u, "%s: %llu operations in a step", variant, step_ops[0]);
    }
#endif
    tf_destroy(m);
}

Test(generation_cuda, graph_steps_equal_plain_steps) {
    const char *replayable[] = {"linear", "polynomial", "retention", "gla", "deltanet"};
    for (int v = 0; v < 5; v++) graph_case(replayable[v], NULL, AB_DEV_CUDA, false, NULL);
    graph_case("linear", "feature_map=favor", AB_DEV_CUDA, false, "does not step the same way at every position");
    graph_case("stateful-softmax", NULL, AB_DEV_CUDA, false, "does not step the same way at every position");
    graph_case("linear", NULL, AB_DEV_CPU, false, "on the CPU");
#ifdef TEST_CUDA_EMU
    graph_case("linear", NULL, AB_DEV_CUDA, true, "recording the step failed");
#endif
}
