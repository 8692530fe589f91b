/* Dataset tasks and the non-transformer body through `attnbench train`, on tiny
 * synthetic datasets the tests write as .npy files:
 * - "sequences": token rows (row r of a split counts up from a start symbol modulo 5),
 *   a causal transformer; bits per token and accuracy over whole splits;
 * - "frames": float frames of F = 3 features with a per-frame class (how many of the
 *   first two features are positive: 0, 1 or 2), rows of different lengths, through a
 *   non-causal transformer and through a 2-layer bidirectional LSTM body with dropout;
 * - "frames" with targets "ctc": rows made of runs of frames that each point at one of
 *   3 classes, labelled by the sequence of their runs' classes (the CTC head, the PER
 *   metric), through a bidirectional LSTM and a non-causal transformer, and with a
 *   reduce-on-plateau schedule resumed across its reductions.
 * Each trains for a few epochs on the CPU and on the CUDA backend (attnbench-emu, its
 * device emulated on the CPU), the loss falls, a run resumed in the middle of an epoch
 * continues bit for bit, evaluation covers the whole split (or the configured prefix)
 * in batches whatever the batch size, and bad data or configs are one line, exit 2.
 * The library-level tests check the epoch order (a permutation, a pure function of
 * (seed, epoch)) and that an epoch visits every training row once. */
#include <criterion/criterion.h>

#include "checkpoint.h"
#include "error.h"
#include "npy.h"
#include "task.h"
#include "task_list.h"
#include "test_datasets.h"
#include "test_proc.h"
#include "test_run.h"
#include "train_config.h"
#include "trainer.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char g_dir[600];
static char *g_out, *g_err;
static const char *g_exe = ATTNBENCH_EXE;

static void setup(void) {
    task_list_install();
    tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/train-data-tmp");
}

static void teardown(void) {
    tp_rm_tree(g_dir);
    free(g_out);
    free(g_err);
    g_out = g_err = NULL;
}

TestSuite(train_data, .init = setup, .fini = teardown, .timeout = 300);

/* A path in the scratch folder (tp_path). */
#define P(...) tp_path(g_dir, __VA_ARGS__)

#define run(...) tp_wait(g_dir, tp_spawn(g_dir, g_exe, NULL, TP_ARGV("--threads", "1", __VA_ARGS__, NULL)), &g_out, &g_err)

/* ---- the datasets ---- */

static void write_text(const char *path, const char *text) { tp_write_bytes(path, text, strlen(text)); }

/* Run configs: batch 8 over 40 training rows (5 steps an epoch), evaluation on
 * "valid" every 5 steps, the test split at the end. */
static const char *seq_config(void) {
    td_write_sequences(P("seq"));
    char text[2000];
    snprintf(text, sizeof text,
             "{\"name\": \"seq\", \"task\": {\"name\": \"sequences\", \"path\": \"%s\"},"
             " \"model\": {\"d_model\": 16, \"heads\": 2, \"layers\": 1, \"d_ff\": 16, \"dropout\": 0.1,"
             "            \"attention\": {\"variant\": \"linear\"}},"
             " \"optim\": {\"kind\": \"radam\", \"lr\": 0.01}, \"epochs\": 8, \"batch\": 8,"
             " \"eval_every\": 5, \"eval_split\": \"valid\", \"test_split\": \"test\","
             " \"checkpoint_every\": 5, \"log_every\": 5, \"seed\": 3}",
             P("seq"));
    write_text(P("seq.json"), text);
    return P("seq.json");
}

static const char *frames_config(const char *body) {
    td_write_frames(P("fr"));
    char text[2000];
    snprintf(text, sizeof text,
             "{\"name\": \"fr\", \"task\": {\"name\": \"frames\", \"path\": \"%s\", \"classes\": 3},"
             " \"model\": %s,"
             " \"optim\": {\"kind\": \"adam\", \"lr\": 0.01}, \"epochs\": 8, \"batch\": 8,"
             " \"eval_every\": 5, \"eval_split\": \"valid\", \"test_split\": \"test\","
             " \"checkpoint_every\": 5, \"log_every\": 5, \"seed\": 5}",
             P("fr"), body);
    write_text(P("fr.json"), text);
    return P("fr.json");
}

/* The ctc frames task: batch 8 over 40 rows (5 steps an epoch), 8 epochs, evaluation
 * every 5 steps; `optim` the optimiser's object. */
static const char *ctc_config(const char *body, const char *optim) {
    td_write_frames_ctc(P("ctc"));
    char text[2000];
    snprintf(text, sizeof text,
             "{\"name\": \"ctc\", \"task\": {\"name\": \"frames\", \"path\": \"%s\", \"targets\": \"ctc\"},"
             " \"model\": %s, \"optim\": %s, \"epochs\": 8, \"batch\": 8,"
             " \"eval_every\": 5, \"checkpoint_every\": 5, \"log_every\": 5, \"seed\": 7}",
             P("ctc"), body, optim);
    write_text(P("ctc.json"), text);
    return P("ctc.json");
}

#define LSTM_BODY "{\"body\": \"lstm\", \"d_model\": 8, \"layers\": 2, \"hidden\": 6, \"dropout\": 0.1}"
#define TF_BODY                                                                                                      \
    "{\"d_model\": 16, \"heads\": 2, \"layers\": 1, \"d_ff\": 16, \"dropout\": 0.0, \"attention\": {\"variant\": " \
    "\"softmax\"}}"

/* ---- reading runs ---- */

/* A complete run in DIR that learned: status ok, 40 steps (8 epochs of 5), the eval
 * loss down by `drop` at least, whole-split records with every metric, a test record
 * and the test metrics in the summary. */
static void expect_learned(const char *dir, const char *const *metrics, double drop) {
    char path[1200];
    snprintf(path, sizeof path, "%s/train.json", dir);
    json_t *doc = load(path);
    cr_expect_str_eq(json_string_value(json_object_get(doc, "status")), "ok");
    cr_expect_eq(json_array_size(json_object_get(doc, "step_loss")), 40, "8 epochs of 40 rows in batches of 8");
    json_t *first, *last, *test, *test_last;
    records(doc, "eval", &first, &last);
    records(doc, "test", &test, &test_last);
    cr_expect_eq(num(last, "step"), 40);
    cr_expect_lt(num(last, "eval_loss"), (1.0 - drop) * num(first, "eval_loss"), "eval loss %g -> %g",
                 num(first, "eval_loss"), num(last, "eval_loss"));
    cr_expect_str_eq(json_string_value(json_object_get(last, "eval_split")), "valid");
    cr_expect_eq(num(last, "eval_rows"), 12, "evaluation covers the whole valid split (12 rows)");
    cr_expect_eq(num(test, "test_rows"), 10, "the test record covers the whole test split (10 rows)");
    json_t *sum = json_object_get(doc, "summary");
    for (int i = 0; metrics[i]; i++) {
        char k[96];
        snprintf(k, sizeof k, "eval_%s", metrics[i]);
        double v = num(last, k);
        snprintf(k, sizeof k, "test_%s", metrics[i]);
        cr_expect(isfinite(v) && isfinite(num(test, k)) && num(sum, k) == num(test, k), "metric %s", metrics[i]);
    }
    json_decref(doc);
}

/* ---- the sequences task ---- */

Test(train_data, sequences_train_resume_and_cuda) {
    const char *cfg = seq_config();
    static const char *const metrics[] = {"accuracy", "bits_per_token", NULL};
    cr_assert_eq(run("train", cfg, "--out", P("a"), "--quiet"), 0, "%s", g_err);
    expect_learned(P("a"), metrics, 0.3);
    /* bits per token = the mean loss over every scored position / ln 2, over the whole
     * split: 12 rows x 10 positions */
    json_t *doc = load(P("a/train.json")), *first, *last;
    records(doc, "eval", &first, &last);
    cr_expect_eq(num(last, "eval_positions"), 120);
    cr_expect_lt(fabs(num(last, "eval_bits_per_token") - num(last, "eval_loss") / log(2.0)), 1e-6 * num(last, "eval_loss"));
    json_decref(doc);

    /* stopped in the middle of the third epoch (13 steps), resumed to 8 epochs */
    cr_assert_eq(run("train", cfg, "--out", P("b"), "--quiet", "--set", "epochs=2.6"), 0, "%s", g_err);
    cr_assert_eq(run("train", "--resume", "--out", P("b"), "--quiet", "--set", "epochs=8"), 0, "%s", g_err);
    expect_same_state(P("a/checkpoint.bin"), P("b/checkpoint.bin"), "sequences resumed at step 13");

    /* the CUDA backend (emulated): the same losses to rounding (float32 sums in
     * other orders, carried by training: 1e-4 relative is far above them and far below
     * what a wrong gradient does), and its own resume bit for bit */
    g_exe = ATTNBENCH_EMU_EXE;
    cr_assert_eq(run("train", cfg, "--out", P("c"), "--quiet", "--device", "cuda"), 0, "%s", g_err);
    cr_assert_eq(run("train", cfg, "--out", P("d"), "--quiet", "--device", "cuda", "--set", "steps=7"), 0, "%s", g_err);
    cr_assert_eq(run("train", "--resume", "--out", P("d"), "--quiet", "--device", "cuda", "--set", "epochs=8"), 0, "%s",
                 g_err);
    g_exe = ATTNBENCH_EXE;
    expect_same_state(P("c/checkpoint.bin"), P("d/checkpoint.bin"), "CUDA sequences resumed at step 7");
    size_t na, nb;
    double *a = step_losses(P("a/train.json"), &na), *b = step_losses(P("c/train.json"), &nb);
    cr_assert_eq(na, nb);
    double worst = 0;
    for (size_t i = 0; i < na; i++) worst = fmax(worst, fabs(a[i] - b[i]) / fabs(a[i]));
    cr_expect_lt(worst, 1e-4, "CUDA vs CPU step losses differ by %g relative", worst);
    free(a);
    free(b);

    /* generation from a dataset task: the prompts are rows of its evaluation split */
    cr_assert_eq(run("generate", P("a/checkpoint.bin"), "--n", "4"), 0, "%s", g_err);
    json_t *g = json_loads(g_out, 0, NULL);
    cr_assert_not_null(g, "generate: not JSON: %s", g_out);
    cr_expect_str_eq(json_string_value(json_object_get(g, "task")), "sequences");
    cr_expect_eq(json_integer_value(json_object_get(g, "prompts")), 4);
    json_decref(g);
}

Test(train_data, evaluation_is_the_whole_split_whatever_the_batch) {
    /* Step 0's evaluation depends only on the initial parameters: with batch 8 the 12
     * valid rows go as 8 + 4, with batch 5 as 5 + 5 + 2, with batch 12 at once. Each
     * row's loss is the same computation in every case (rows never mix), so the three
     * agree to float rounding of the BLAS blocking (1e-6 relative: float32 sums of 120
     * terms differ by ~1e-7). eval_rows = 5 evaluates the first 5 rows only. */
    const char *cfg = seq_config();
    const char *batches[3] = {"batch=8", "batch=5", "batch=12"};
    double loss[3];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(run("train", cfg, "--out", P("e%d", i), "--quiet", "--set", batches[i], "--set", "steps=1"), 0,
                     "%s", g_err);
        json_t *doc = load(P("e%d/train.json", i)), *first, *last;
        records(doc, "eval", &first, &last);
        cr_expect_eq(num(first, "step"), 0);
        cr_expect_eq(num(first, "eval_rows"), 12);
        cr_expect_eq(num(first, "eval_positions"), 120);
        loss[i] = num(first, "eval_loss");
        json_decref(doc);
    }
    cr_expect_lt(fabs(loss[1] - loss[0]), 1e-6 * loss[0], "batch 5 vs 8: %.9g vs %.9g", loss[1], loss[0]);
    cr_expect_lt(fabs(loss[2] - loss[0]), 1e-6 * loss[0], "batch 12 vs 8: %.9g vs %.9g", loss[2], loss[0]);
    cr_assert_eq(run("train", cfg, "--out", P("p"), "--quiet", "--set", "eval_rows=5", "--set", "steps=1"), 0, "%s",
                 g_err);
    json_t *doc = load(P("p/train.json")), *first, *last;
    records(doc, "eval", &first, &last);
    cr_expect_eq(num(first, "eval_rows"), 5);
    cr_expect_eq(num(first, "eval_positions"), 50);
    cr_expect_neq(num(first, "eval_loss"), loss[0], "a prefix of 5 rows scores differently from all 12");
    json_decref(doc);
}

/* ---- the frames task: a transformer and the LSTM body ---- */

static void frames_case(const char *body, const char *what) {
    const char *cfg = frames_config(body);
    static const char *const metrics[] = {"accuracy", NULL};
    cr_assert_eq(run("train", cfg, "--out", P("a"), "--quiet"), 0, "%s: %s", what, g_err);
    expect_learned(P("a"), metrics, 0.1);
    /* the scored positions are the labelled frames of the valid rows (lengths 6..12) */
    json_t *doc = load(P("a/train.json")), *first, *last;
    records(doc, "eval", &first, &last);
    double pos = num(last, "eval_positions");
    cr_expect(pos >= 72 && pos <= 144, "%s: %g scored positions in 12 rows of 6..12 frames", what, pos);
    cr_expect_gt(num(last, "eval_accuracy"), 0.55, "%s: accuracy %g (a third by chance)", what,
                 num(last, "eval_accuracy"));
    json_decref(doc);
    cr_assert_eq(run("train", cfg, "--out", P("b"), "--quiet", "--set", "epochs=1.4"), 0, "%s", g_err);
    cr_assert_eq(run("train", "--resume", "--out", P("b"), "--quiet", "--set", "epochs=8"), 0, "%s", g_err);
    expect_same_state(P("a/checkpoint.bin"), P("b/checkpoint.bin"), what);

    g_exe = ATTNBENCH_EMU_EXE;
    cr_assert_eq(run("train", cfg, "--out", P("c"), "--quiet", "--device", "cuda"), 0, "%s: %s", what, g_err);
    cr_assert_eq(run("train", cfg, "--out", P("d"), "--quiet", "--device", "cuda", "--set", "epochs=1.4"), 0, "%s",
                 g_err);
    cr_assert_eq(run("train", "--resume", "--out", P("d"), "--quiet", "--device", "cuda", "--set", "epochs=8"), 0, "%s",
                 g_err);
    g_exe = ATTNBENCH_EXE;
    expect_same_state(P("c/checkpoint.bin"), P("d/checkpoint.bin"), what);
    size_t na, nb;
    double *a = step_losses(P("a/train.json"), &na), *b = step_losses(P("c/train.json"), &nb);
    cr_assert_eq(na, nb);
    double worst = 0;
    for (size_t i = 0; i < na; i++) worst = fmax(worst, fabs(a[i] - b[i]) / fabs(a[i]));
    cr_expect_lt(worst, 1e-4, "%s: CUDA vs CPU step losses differ by %g relative", what, worst);
    free(a);
    free(b);

    /* no generation for frame input: one line, exit 2 */
    int st = run("generate", P("a/checkpoint.bin"), "--n", "2");
    tp_usage_error(st, g_err, "generate of a frames model", TP_ARGV("frames", NULL));
}

Test(train_data, frames_with_a_transformer) { frames_case(TF_BODY, "frames, transformer"); }

/* linformer, the variant with parameters of its own (its projections E = F, k = 4,
 * one block shared by the layers): it learns the frames task, a resumed run's
 * checkpoint (parameters with the projections, optimiser moments, losses) equals the
 * uninterrupted run's bit for bit, on the CPU and on the CUDA backend (emulated). */
#define LINFORMER_BODY                                                                                               \
    "{\"d_model\": 16, \"heads\": 2, \"layers\": 2, \"d_ff\": 16, \"dropout\": 0.0, \"attention\": {\"variant\": " \
    "\"linformer\", \"set\": {\"k\": 4, \"share\": \"layer\"}}}"
Test(train_data, frames_with_linformer) { frames_case(LINFORMER_BODY, "frames, linformer"); }

/* The CTC frames task (the speech experiment's form) switched to linformer from the
 * command line (--set of the variant and its options), trained for a few steps; the
 * run's config says so, and the projections are in its parameters (more than the
 * softmax model's). */
Test(train_data, ctc_frames_set_to_linformer) {
    const char *cfg = ctc_config(TF_BODY, "{\"kind\": \"adam\", \"lr\": 0.02}");
    cr_assert_eq(run("train", cfg, "--out", P("s"), "--quiet", "--set", "epochs=1"), 0, "%s", g_err);
    cr_assert_eq(run("train", cfg, "--out", P("l"), "--quiet", "--set", "epochs=1", "--set",
                     "model.attention.variant=linformer", "--set", "model.attention.set.k=3", "--set",
                     "model.attention.set.share=kv"),
                 0, "%s", g_err);
    json_t *doc = load(P("l/train.json"));
    json_t *att = json_object_get(json_object_get(json_object_get(doc, "config"), "model"), "attention");
    cr_expect_str_eq(json_string_value(json_object_get(att, "variant")), "linformer");
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(att, "set"), "k")), 3);
    json_decref(doc);
    size_t ns, nl;
    void *ps = blob(P("s/checkpoint.bin"), AB_CKPT_PARAMS, &ns), *pl = blob(P("l/checkpoint.bin"), AB_CKPT_PARAMS, &nl);
    cr_expect_gt(nl, ns, "linformer's projections are parameters of the model: %zu vs %zu bytes", nl, ns);
    free(ps);
    free(pl);
}

Test(train_data, frames_with_a_bidirectional_lstm) {
    frames_case(LSTM_BODY, "frames, bidirectional LSTM");
    /* the LSTM's parameters are in the checkpoint under PyTorch's names */
    json_t *doc = load(P("a/train.json"));
    json_t *model = json_object_get(json_object_get(doc, "config"), "model");
    cr_expect_str_eq(json_string_value(json_object_get(model, "body")), "lstm");
    cr_expect(json_is_true(json_object_get(model, "bidirectional")), "non-causal: bidirectional by default");
    json_decref(doc);
}

/* ---- the frames task with label sequences (targets "ctc") ---- */

/* Trains, resumes and runs on the CUDA backend as frames_case; the loss is the mean
 * nll per row and a row is one scored unit; the label error rate (per) starts high (an
 * untrained model emits blanks or noise: measured 1 and 0.74) and falls below half of
 * that (measured 0.26 with the LSTM, 0 with the transformer). */
static void ctc_case(const char *body, const char *what) {
    const char *cfg = ctc_config(body, "{\"kind\": \"adam\", \"lr\": 0.02}");
    static const char *const metrics[] = {"per", NULL};
    cr_assert_eq(run("train", cfg, "--out", P("a"), "--quiet"), 0, "%s: %s", what, g_err);
    expect_learned(P("a"), metrics, 0.3);
    json_t *doc = load(P("a/train.json")), *first, *last;
    records(doc, "eval", &first, &last);
    cr_expect_eq(num(last, "eval_positions"), 12, "%s: a row is one scored unit", what);
    if (getenv("TEST_VERBOSE"))
        fprintf(stderr, "%s: per %g -> %g, loss %g -> %g\n", what, num(first, "eval_per"), num(last, "eval_per"),
                num(first, "eval_loss"), num(last, "eval_loss"));
    cr_expect_gt(num(first, "eval_per"), 0.6, "%s: per %g before training", what, num(first, "eval_per"));
    cr_expect_lt(num(last, "eval_per"), 0.5 * num(first, "eval_per"), "%s: per %g -> %g in 8 epochs", what,
                 num(first, "eval_per"), num(last, "eval_per"));
    json_t *task = json_object_get(json_object_get(doc, "config"), "task");
    cr_expect_str_eq(json_string_value(json_object_get(task, "targets")), "ctc");
    cr_expect(json_is_number(json_object_get(json_object_get(doc, "summary"), "final_eval_per")));
    json_decref(doc);
    char *tsv = tp_slurp(P("a/train.tsv"), NULL);
    cr_expect(strstr(tsv, "eval_per"), "%s: no eval_per column in the TSV", what);
    free(tsv);
    cr_assert_eq(run("train", cfg, "--out", P("b"), "--quiet", "--set", "epochs=1.4"), 0, "%s", g_err);
    cr_assert_eq(run("train", "--resume", "--out", P("b"), "--quiet", "--set", "epochs=8"), 0, "%s", g_err);
    expect_same_state(P("a/checkpoint.bin"), P("b/checkpoint.bin"), what);

    g_exe = ATTNBENCH_EMU_EXE;
    cr_assert_eq(run("train", cfg, "--out", P("c"), "--quiet", "--device", "cuda"), 0, "%s: %s", what, g_err);
    cr_assert_eq(run("train", cfg, "--out", P("d"), "--quiet", "--device", "cuda", "--set", "epochs=1.4"), 0, "%s",
                 g_err);
    cr_assert_eq(run("train", "--resume", "--out", P("d"), "--quiet", "--device", "cuda", "--set", "epochs=8"), 0, "%s",
                 g_err);
    g_exe = ATTNBENCH_EXE;
    expect_same_state(P("c/checkpoint.bin"), P("d/checkpoint.bin"), what);
    size_t na, nb;
    double *a = step_losses(P("a/train.json"), &na), *b = step_losses(P("c/train.json"), &nb);
    cr_assert_eq(na, nb);
    double worst = 0;
    for (size_t i = 0; i < na; i++) worst = fmax(worst, fabs(a[i] - b[i]) / fabs(a[i]));
    /* as frames_case: float sums in other orders carried by training */
    cr_expect_lt(worst, 1e-4, "%s: CUDA vs CPU step losses differ by %g relative", what, worst);
    free(a);
    free(b);
}

Test(train_data, ctc_frames_with_a_bidirectional_lstm) { ctc_case(LSTM_BODY, "ctc frames, bidirectional LSTM"); }
Test(train_data, ctc_frames_with_a_transformer) { ctc_case(TF_BODY, "ctc frames, transformer"); }

/* The plateau schedule on the ctc task: per, patience 0 and a threshold of 0.9 (an
 * evaluation improves only if per falls by 90%), so the learning rate halves at most
 * evaluations. A run stopped at step 13 (its evaluation at 13, the end of that run,
 * does not count) and resumed gives the uninterrupted run's state bit for bit; every
 * step uses lr x the factor of the evaluation before it; eval_every may not change on
 * resume. */
Test(train_data, plateau_resumes_across_its_reductions) {
    const char *cfg = ctc_config(LSTM_BODY, "{\"kind\": \"radam\", \"lr\": 0.02, \"schedule\": {\"plateau\":"
                                            " {\"metric\": \"per\", \"patience\": 0, \"threshold\": 0.9}}}");
    cr_assert_eq(run("train", cfg, "--out", P("a"), "--quiet"), 0, "%s", g_err);
    json_t *doc = load(P("a/train.json")), *r;
    size_t i;
    int before = 0, after = 0;
    double factor = 1.0; /* the factor in force since the last counted evaluation */
    json_array_foreach(json_object_get(doc, "records"), i, r) {
        const char *kind = json_string_value(json_object_get(r, "kind"));
        const long long step = (long long)num(r, "step");
        if (strcmp(kind, "train") == 0) {
            cr_expect(fabs(num(r, "lr") - 0.02 * factor) <= 1e-15, "step %lld: lr %.17g, want 0.02 x %g", step,
                      num(r, "lr"), factor);
        } else if (strcmp(kind, "eval") == 0) {
            json_t *f = json_object_get(r, "lr_factor");
            cr_expect_eq(json_is_number(f), step > 0, "step %lld: the plateau counts the evaluations after step 0", step);
            if (!json_is_number(f)) continue;
            const bool reduced = json_is_true(json_object_get(r, "lr_reduced"));
            cr_expect_eq(json_number_value(f), reduced ? factor * 0.5 : factor, "step %lld", step);
            factor = json_number_value(f);
            before += reduced && step < 13;
            after += reduced && step > 13;
        }
    }
    json_decref(doc);
    cr_expect(before >= 1 && after >= 1, "reductions: %d before step 13, %d after", before, after);
    cr_assert_eq(run("train", cfg, "--out", P("b"), "--quiet", "--set", "epochs=2.6"), 0, "%s", g_err);
    doc = load(P("b/train.json"));
    json_t *first, *last;
    records(doc, "eval", &first, &last);
    cr_expect_eq(num(last, "step"), 13);
    cr_expect_null(json_object_get(last, "lr_factor"), "the evaluation at the end of a run is not counted");
    json_decref(doc);
    int st = run("train", "--resume", "--out", P("b"), "--set", "epochs=8", "--set", "eval_every=10");
    tp_usage_error(st, g_err, "eval_every changed", TP_ARGV("eval_every", "plateau", NULL));
    cr_assert_eq(run("train", "--resume", "--out", P("b"), "--quiet", "--set", "epochs=8"), 0, "%s", g_err);
    expect_same_state(P("a/checkpoint.bin"), P("b/checkpoint.bin"), "plateau resumed at step 13");
}

/* Label sequences that are not: one line naming the file (and row), exit 2. */
Test(train_data, ctc_bad_label_sequences_are_one_line_exit_2) {
    const char *cfg = ctc_config(LSTM_BODY, "{\"kind\": \"adam\"}");
    int st = run("train", cfg, "--out", P("t0"), "--set", "task.targets=words");
    tp_usage_error(st, g_err, "targets words", TP_ARGV("task.targets", "words", NULL));
    int lab[12 * FR_N];
    for (int i = 0; i < 12 * FR_N; i++) lab[i] = -1;
    /* row 3 of valid: a label after the end */
    lab[3 * FR_N] = 1, lab[3 * FR_N + 2] = 2;
    td_save(P("ctc/valid.labels.npy"), AB_I32, 2, 12, FR_N, 0, lab);
    st = run("train", cfg, "--out", P("t1"));
    tp_usage_error(st, g_err, "a label after -1", TP_ARGV("valid.labels.npy", "row 3", "follows the row's end", NULL));
    /* row 5: 6 labels 0 0 0 1 1 1 need 6 + 4 = 10 frames: longer than rows of 6..12 may be */
    for (int i = 0; i < 12 * FR_N; i++) lab[i] = -1;
    const int seq[6] = {0, 0, 0, 1, 1, 1};
    for (int r = 0; r < 12; r++) lab[r * FR_N] = 0;
    memcpy(lab + 5 * FR_N, seq, sizeof seq);
    td_save(P("ctc/valid.labels.npy"), AB_I32, 2, 12, FR_N, 0, lab);
    int lens[12];
    for (int r = 0; r < 12; r++) lens[r] = 6;
    td_save(P("ctc/valid.lengths.npy"), AB_I32, 1, 12, 0, 0, lens);
    st = run("train", cfg, "--out", P("t2"));
    tp_usage_error(st, g_err, "too short", TP_ARGV("valid.labels.npy", "row 5", "need at least 10 frames", NULL));
    /* other label slots than train's; every label -1 */
    int wide[12 * 20];
    for (int i = 0; i < 12 * 20; i++) wide[i] = i % 20 == 0 ? 1 : -1;
    td_save(P("ctc/valid.labels.npy"), AB_I32, 2, 12, 20, 0, wide);
    st = run("train", cfg, "--out", P("t3"));
    tp_usage_error(st, g_err, "slots", TP_ARGV("valid.labels.npy", "20 label slots", NULL));
    for (int i = 0; i < 12 * FR_N; i++) lab[i] = -1;
    for (int sp = 0; sp < 3; sp++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s.labels.npy", P("ctc"), TD_SPLITS[sp]);
        int *none = malloc(sizeof(int) * TD_ROWS[sp] * FR_N);
        for (int i = 0; i < TD_ROWS[sp] * FR_N; i++) none[i] = -1;
        td_save(path, AB_I32, 2, TD_ROWS[sp], FR_N, 0, none);
        free(none);
    }
    st = run("train", cfg, "--out", P("t4"));
    tp_usage_error(st, g_err, "no labels", TP_ARGV("no row has a label", NULL));
    cr_expect(!tp_exists(P("t0")) && !tp_exists(P("t1")) && !tp_exists(P("t2")) && !tp_exists(P("t3")) &&
              !tp_exists(P("t4")));
}

/* ---- bad data and configs ---- */

Test(train_data, bad_data_and_configs_are_one_line_exit_2) {
    const char *cfg = seq_config();
    struct {
        const char *set, *needle;
    } cases[] = {
        {"steps=7", "disagree"},                   /* with epochs 8 in the file: both given */
        {"eval_split=nope", "nope"},               /* no such split */
        {"eval_batches=3", "eval_batches"},        /* a generator task's key */
        {"eval_rows=13", "eval_rows"},             /* more rows than the split has */
        {"task.path=/nonexistent-attnbench", "nonexistent-attnbench"},
        {"model.body=gru", "gru"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *out = P("bad%zu", i);
        int st = strcmp(cases[i].set, "steps=7") == 0
                     ? run("train", cfg, "--out", out, "--set", "steps=7", "--set", "epochs=8")
                     : run("train", cfg, "--out", out, "--set", cases[i].set);
        tp_usage_error(st, g_err, cases[i].set, TP_ARGV(cases[i].needle, NULL));
        cr_expect(!tp_exists(out), "%s: %s was made", cases[i].set, out);
    }
    /* epochs on a generator task */
    int st = run("train", ATTNBENCH_SOURCE_DIR "/experiments/copy/smoke.json", "--out", P("copy"), "--set", "epochs=2");
    tp_usage_error(st, g_err, "epochs on copy", TP_ARGV("epochs", NULL));
    /* a truncated split file, a split whose rows differ in length from train's, a
     * frames file whose labels have other rows */
    unsigned char *bytes;
    size_t n;
    bytes = tp_read_bytes(P("seq/valid.npy"), &n);
    tp_write_bytes(P("seq/valid.npy"), bytes, n - 7);
    st = run("train", cfg, "--out", P("t1"));
    tp_usage_error(st, g_err, "truncated valid.npy", TP_ARGV("valid.npy", NULL));
    tp_write_bytes(P("seq/valid.npy"), bytes, n);
    free(bytes);
    int short_rows[12 * 4] = {0};
    td_save(P("seq/test.npy"), AB_I32, 2, 12, 4, 0, short_rows);
    st = run("train", cfg, "--out", P("t2"));
    tp_usage_error(st, g_err, "rows of another length", TP_ARGV("test.npy", NULL));
    frames_config(TF_BODY);
    int labels[5 * FR_N] = {0};
    td_save(P("fr/valid.labels.npy"), AB_I32, 2, 5, FR_N, 0, labels);
    st = run("train", P("fr.json"), "--out", P("t3"));
    tp_usage_error(st, g_err, "labels of other rows", TP_ARGV("valid", NULL));
}

/* ---- the epoch order (library) ---- */

Test(train_data, epoch_order_is_a_permutation_and_a_pure_function) {
    enum { n = 97 };
    long long a[n], b[n], c[n];
    task_epoch_order(11, 0, n, a);
    task_epoch_order(11, 0, n, b);
    task_epoch_order(11, 1, n, c);
    int seen[n] = {0}, same_as_next = 0;
    for (int i = 0; i < n; i++) {
        cr_assert(a[i] >= 0 && a[i] < n);
        seen[a[i]]++;
        same_as_next += a[i] == c[i];
    }
    for (int i = 0; i < n; i++) cr_expect_eq(seen[i], 1, "row %d visited %d times in an epoch", i, seen[i]);
    cr_expect(memcmp(a, b, sizeof a) == 0, "epoch 0 drawn twice differs");
    /* two independent uniform permutations agree at ~1 position on average */
    cr_expect_lt(same_as_next, 10, "epochs 0 and 1 agree at %d of %d positions", same_as_next, n);
    task_epoch_order(12, 0, n, b);
    cr_expect(memcmp(a, b, sizeof a) != 0, "another seed gives the same order");
}

Test(train_data, training_visits_every_row_once_per_epoch) {
    /* Rows are told apart by their tokens: row r of the sequences task is (r, r). 40
     * rows, batch 8 then batch 7 (a batch spanning two epochs): over steps covering
     * exactly two epochs every row comes twice. */
    cr_assert_eq(mkdir(P("rows"), 0755), 0);
    int x[40 * 2];
    for (int r = 0; r < 40; r++) x[2 * r] = x[2 * r + 1] = r;
    td_save(P("rows/train.npy"), AB_I32, 2, 40, 2, 0, x);
    const int batches[2] = {8, 7};
    for (int k = 0; k < 2; k++) {
        char text[1500];
        snprintf(text, sizeof text,
                 "{\"name\": \"rows\", \"task\": {\"name\": \"sequences\", \"path\": \"%s\"},"
                 " \"model\": {\"d_model\": 8, \"heads\": 1, \"layers\": 1, \"d_ff\": 8,"
                 "            \"attention\": {\"variant\": \"linear\"}},"
                 " \"optim\": {\"kind\": \"radam\", \"lr\": 0.01}, \"steps\": 1000, \"batch\": %d, \"seed\": 9}",
                 P("rows"), batches[k]);
        json_t *root = json_loads(text, 0, NULL);
        cr_assert_not_null(root);
        train_config cfg;
        cr_assert_eq(train_config_parse(root, &cfg), 0, "%s", ab_error());
        json_decref(root);
        trainer *t;
        cr_assert_eq(trainer_create(&cfg, &t), 0, "%s", ab_error());
        int seen[40] = {0}, got = 0;
        for (long long step = 1; got < 80; step++) {
            cr_assert_eq(trainer_fill_step(t, step), 0, "%s", ab_error());
            const task_batch *b = &t->batch;
            for (int i = 0; i < b->rows && got < 80; i++, got++) {
                /* the input row is the start token then the row's first token */
                int tok = b->tokens[i * b->N + 1];
                cr_assert(tok >= 0 && tok < 40);
                seen[tok]++;
                if (got == 39)
                    for (int r = 0; r < 40; r++) cr_expect_eq(seen[r], 1, "batch %d: row %d in epoch 0", batches[k], r);
            }
        }
        for (int r = 0; r < 40; r++) cr_expect_eq(seen[r], 2, "batch %d: row %d %d times in 2 epochs", batches[k], r, seen[r]);
        trainer_destroy(t);
    }
}

/* ---- sampling (attnbench sample) ---- */

static int *load_ints(const char *path, int64_t *shape, int *ndim) {
    ab_array a;
    cr_assert_eq(ab_npy_read(path, &a), 0, "%s", ab_error());
    cr_assert_eq(a.dtype, AB_I32, "%s: int32", path);
    *ndim = a.ndim;
    for (int i = 0; i < a.ndim; i++) shape[i] = a.shape[i];
    int *x = malloc(sizeof(int) * a.count);
    memcpy(x, a.data, sizeof(int) * a.count);
    ab_array_free(&a);
    return x;
}

Test(train_data, sample_is_deterministic_in_every_mode_and_batch) {
    /* A trained linear model of the sequences task: rows drawn at temperature 1 from
     * the same seed are the same whatever the batch and the mode (recurrent steps or
     * recomputation: logits equal to float rounding, which decides a draw only at a
     * class boundary: not met by these 8 x 10 draws); another seed gives other rows. */
    const char *cfg = seq_config();
    cr_assert_eq(run("train", cfg, "--out", P("a"), "--quiet"), 0, "%s", g_err);
    const char *ck = P("a/checkpoint.bin");
    const char *cases[][4] = {{"4", "recurrent", "r4", "7"}, {"2", "recurrent", "r2", "7"},
                              {"8", "recompute", "c8", "7"}, {"4", "recurrent", "s8", "8"}};
    int *rows[4];
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(run("sample", ck, "--n", "8", "--batch", cases[i][0], "--mode", cases[i][1], "--seed", cases[i][3],
                         "--out", P("%s", cases[i][2])),
                     0, "%s", g_err);
        int64_t shape[4];
        int nd;
        rows[i] = load_ints(P("%s/samples.npy", cases[i][2]), shape, &nd);
        cr_assert(nd == 2 && shape[0] == 8 && shape[1] == SEQ_L);
        json_t *doc = load(P("%s/sample.json", cases[i][2]));
        cr_expect_str_eq(json_string_value(json_object_get(doc, "mode")), cases[i][1]);
        cr_expect_gt(num(doc, "images_per_s"), 0);
        cr_expect_eq(num(doc, "n"), 8);
        json_decref(doc);
    }
    cr_expect(memcmp(rows[0], rows[1], sizeof(int) * 8 * SEQ_L) == 0, "batch 4 and batch 2 differ");
    cr_expect(memcmp(rows[0], rows[2], sizeof(int) * 8 * SEQ_L) == 0, "recurrent and recompute differ");
    cr_expect(memcmp(rows[0], rows[3], sizeof(int) * 8 * SEQ_L) != 0, "seeds 7 and 8 give the same rows");
    int in_range = 1;
    for (int i = 0; i < 8 * SEQ_L; i++) in_range &= rows[0][i] >= 0 && rows[0][i] < 5;
    cr_expect(in_range, "a sampled value outside the task's 5 classes");
    /* the model learnt the rule (each value is the previous + 1 mod 5): most draws follow it */
    int follow = 0;
    for (int r = 0; r < 8; r++)
        for (int j = 1; j < SEQ_L; j++) follow += rows[0][r * SEQ_L + j] == (rows[0][r * SEQ_L + j - 1] + 1) % 5;
    cr_expect_gt(follow, 8 * (SEQ_L - 1) / 2, "only %d of %d sampled values follow the rule", follow, 8 * (SEQ_L - 1));
    for (int i = 0; i < 4; i++) free(rows[i]);

    /* completion: the first half of test rows kept, the originals written beside */
    cr_assert_eq(run("sample", ck, "--n", "6", "--batch", "3", "--complete", "0.5", "--out", P("comp")), 0, "%s", g_err);
    int64_t shape[4];
    int nd;
    int *s = load_ints(P("comp/samples.npy"), shape, &nd), *o = load_ints(P("comp/originals.npy"), shape, &nd);
    for (int r = 0; r < 6; r++) cr_expect(memcmp(s + r * SEQ_L, o + r * SEQ_L, sizeof(int) * 5) == 0, "row %d prompt", r);
    free(s);
    free(o);

    /* bad requests: one line, exit 2, nothing written (the status first: g_err is the
     * stderr of the last run) */
    int st = run("sample", ck, "--n", "5", "--batch", "2", "--out", P("bad1"));
    tp_usage_error(st, g_err, "n not a multiple", TP_ARGV("multiple", NULL));
    st = run("sample", ck, "--complete", "1", "--out", P("bad2"));
    tp_usage_error(st, g_err, "complete 1", TP_ARGV("--complete", NULL));
    st = run("sample", ck, "--mode", "sideways", "--out", P("bad3"));
    tp_usage_error(st, g_err, "mode", TP_ARGV("sideways", NULL));
    cr_expect(!tp_exists(P("bad1")) && !tp_exists(P("bad2")) && !tp_exists(P("bad3")));
    frames_config(TF_BODY);
    cr_assert_eq(run("train", P("fr.json"), "--out", P("f"), "--quiet", "--set", "steps=2"), 0, "%s", g_err);
    st = run("sample", P("f/checkpoint.bin"), "--out", P("bad4"));
    tp_usage_error(st, g_err, "frames task", TP_ARGV("frames", NULL));
    cr_expect(!tp_exists(P("bad4")));
}
