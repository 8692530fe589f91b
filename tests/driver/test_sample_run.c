/* Sampling, generation and CTC decoding as library calls (experiments/driver:
 * sample_run.h, gen_run.h, decode_run.h), on tiny models trained here through the
 * trainer API and saved as checkpoints: sampled rows are a pure function of the seed
 * (whatever the batch and the mode), completions keep their prompts, the estimate
 * measures the positions it names; greedy generation agrees across modes and a trained
 * copy model scores above an untrained one; best-path decoding counts its errors
 * consistently, whatever the batch; refusals are error codes with one line. */
#include <criterion/criterion.h>

#include "decode_run.h"
#include "error.h"
#include "gen_run.h"
#include "npy.h"
#include "sample_run.h"
#include "task_list.h"
#include "test_datasets.h"
#include "test_proc.h"
#include "trainer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char g_dir[600];

static void setup(void) {
    task_list_install();
    tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/sample-run-tmp");
}

static void teardown(void) { tp_rm_tree(g_dir); }

TestSuite(sample_run, .init = setup, .fini = teardown, .timeout = 300);

#define P(...) tp_path(g_dir, __VA_ARGS__)

/* ---- data, configs, training ---- */

/* Trains the config `text` for `steps` steps and saves its checkpoint as `path`. */
static void train_to(const char *text, int steps, const char *path) {
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    cr_assert_not_null(j, "bad JSON in the test: %s", e.text);
    train_config c;
    cr_assert_eq(train_config_parse(j, &c), 0, "%s", ab_error());
    json_decref(j);
    trainer *t;
    cr_assert_eq(trainer_create(&c, &t), 0, "%s", ab_error());
    train_step_info info;
    for (int s = 0; s < steps; s++) cr_assert_eq(trainer_step(t, &info), 0, "%s", ab_error());
    cr_assert_eq(trainer_save(t, path, 0, 0), 0, "%s", ab_error());
    trainer_destroy(t);
}

/* A linear model of the sequences task, 40 steps (8 epochs of 5 batches) */
static const char *train_sequences(void) {
    td_write_sequences(P("seq"));
    char text[2000];
    snprintf(text, sizeof text,
             "{\"name\": \"seq\", \"task\": {\"name\": \"sequences\", \"path\": \"%s\"},"
             " \"model\": {\"d_model\": 16, \"heads\": 2, \"layers\": 1, \"d_ff\": 16, \"dropout\": 0.1,"
             "            \"attention\": {\"variant\": \"linear\"}},"
             " \"optim\": {\"kind\": \"radam\", \"lr\": 0.01}, \"epochs\": 8, \"batch\": 8,"
             " \"eval_split\": \"valid\", \"test_split\": \"test\", \"seed\": 3}",
             P("seq"));
    train_to(text, 40, P("seq.bin"));
    return P("seq.bin");
}

static const char COPY_FMT[] =
    "{\"name\": \"copy\", \"task\": {\"name\": \"copy\", \"max_symbols\": 4, \"symbols\": 4},"
    " \"model\": {\"d_model\": 16, \"heads\": 2, \"layers\": 2, \"d_ff\": 32, \"dropout\": 0.0,"
    "            \"attention\": {\"variant\": \"%s\"}},"
    " \"optim\": {\"kind\": \"radam\", \"lr\": 0.01}, \"steps\": 100, \"batch\": 16, \"seed\": 1}";

/* ---- sampling ---- */

/* Opens the checkpoint, samples with opts and returns the rows (n x N, malloc'd). */
static int *sample_rows(const char *ckpt, sample_opts o, sample_result *keep) {
    const sample_source src = {.checkpoint = ckpt, .device = AB_DEV_CPU};
    sample_session s;
    cr_assert_eq(sample_open(&s, &src, &o), 0, "%s", ab_error());
    cr_assert_eq(s.N, SEQ_L);
    sample_result r;
    cr_assert_eq(sample_run(&s, &r), 0, "%s", ab_error());
    cr_assert_eq(r.n, o.n);
    cr_expect_gt(r.wall_s, 0, "the sampling is timed");
    json_t *doc = sample_document(&s, &r, "test");
    cr_expect_str_eq(json_string_value(json_object_get(doc, "mode")),
                     o.mode == SAMPLE_MODE_RECOMPUTE ? "recompute" : "recurrent", "linear samples as an RNN in auto");
    /* the seed given, else the run's */
    cr_expect_eq(json_integer_value(json_object_get(doc, "seed")), (json_int_t)(o.have_seed ? o.seed : s.cfg.seed));
    cr_expect_eq(json_integer_value(json_object_get(doc, "prompt_values")), s.P);
    cr_expect_str_eq(json_string_value(json_object_get(doc, "draws")),
                     o.mode == SAMPLE_MODE_RECOMPUTE ? "device" : "device, kept", "a categorical head draws on the device");
    json_decref(doc);
    int *rows = malloc(sizeof(int) * (size_t)r.n * SEQ_L);
    memcpy(rows, r.samples, sizeof(int) * (size_t)r.n * SEQ_L);
    if (keep) *keep = r;
    else sample_result_free(&r);
    sample_close(&s);
    return rows;
}

Test(sample_run, rows_are_a_function_of_the_seed) {
    const char *ck = train_sequences();
    const size_t bytes = sizeof(int) * 8 * SEQ_L;
    sample_opts o = {.n = 8, .batch = 4, .temperature = 1, .mode = SAMPLE_MODE_AUTO, .seed = 7, .have_seed = true};
    int *a = sample_rows(ck, o, NULL), *again = sample_rows(ck, o, NULL);
    o.batch = 2;
    o.mode = SAMPLE_MODE_RECURRENT;
    int *b2 = sample_rows(ck, o, NULL);
    o.batch = 8;
    o.mode = SAMPLE_MODE_RECOMPUTE;
    int *c8 = sample_rows(ck, o, NULL);
    o.seed = 8;
    o.batch = 4;
    o.mode = SAMPLE_MODE_AUTO;
    int *s8 = sample_rows(ck, o, NULL);
    cr_expect(memcmp(a, again, bytes) == 0, "the same request twice gives other rows");
    cr_expect(memcmp(a, b2, bytes) == 0, "batch 4 and batch 2 differ");
    cr_expect(memcmp(a, c8, bytes) == 0, "recurrent and recompute differ");
    cr_expect(memcmp(a, s8, bytes) != 0, "seeds 7 and 8 give the same rows");
    int in_range = 1, follow = 0;
    for (int i = 0; i < 8 * SEQ_L; i++) in_range &= a[i] >= 0 && a[i] < 5;
    cr_expect(in_range, "a sampled value outside the task's 5 classes");
    for (int r = 0; r < 8; r++)
        for (int j = 1; j < SEQ_L; j++) follow += a[r * SEQ_L + j] == (a[r * SEQ_L + j - 1] + 1) % 5;
    cr_expect_gt(follow, 8 * (SEQ_L - 1) / 2, "only %d of %d sampled values follow the rule", follow, 8 * (SEQ_L - 1));
    /* temperature 0: the likeliest value, the same whatever the seed */
    o.temperature = 0;
    int *g7 = sample_rows(ck, o, NULL);
    o.seed = 1234;
    int *g1234 = sample_rows(ck, o, NULL);
    cr_expect(memcmp(g7, g1234, bytes) == 0, "greedy rows depend on the seed");
    free(a);
    free(again);
    free(b2);
    free(c8);
    free(s8);
    free(g7);
    free(g1234);
}

Test(sample_run, completion_keeps_the_prompt_and_estimate_measures) {
    const char *ck = train_sequences();
    sample_opts o = {.n = 6, .batch = 3, .temperature = 1, .complete = 0.5, .mode = SAMPLE_MODE_AUTO};
    sample_result r;
    int *s = sample_rows(ck, o, &r);
    cr_assert_not_null(r.originals);
    for (int k = 0; k < 6; k++) {
        const int *orig = r.originals + k * SEQ_L;
        cr_expect(memcmp(s + k * SEQ_L, orig, sizeof(int) * 5) == 0, "row %d: the prompt's 5 values not kept", k);
        int rule = 1; /* the originals are test rows: they count up modulo 5 */
        for (int j = 1; j < SEQ_L; j++) rule &= orig[j] == (orig[j - 1] + 1) % 5;
        cr_expect(rule, "row %d: the original is not a row of the data", k);
    }
    sample_result_free(&r);
    free(s);

    /* the estimate: positions 0, 3, 6 and the last, one batch, nothing drawn; by
     * recomputation and as an RNN (a step from the draws kept on the device), at T = 1
     * and at T = 0 */
    for (int mode = 0; mode < 3; mode++) {
        const sample_opts e = {.n = 4,
                               .batch = 2,
                               .temperature = mode == 2 ? 0 : 1,
                               .estimate = 3,
                               .mode = mode == 0 ? SAMPLE_MODE_RECOMPUTE : SAMPLE_MODE_RECURRENT};
        const sample_source src = {.checkpoint = ck, .device = AB_DEV_CPU};
        sample_session ss;
        cr_assert_eq(sample_open(&ss, &src, &e), 0, "%s", ab_error());
        cr_assert_eq(sample_run(&ss, &r), 0, "mode %d: %s", mode, ab_error());
        cr_expect_null(r.samples);
        cr_expect_eq(r.n, 2, "an estimate is for one batch");
        cr_assert_eq(r.n_points, 4);
        const int want[4] = {0, 3, 6, SEQ_L - 1};
        double sum = 0;
        for (int p = 0; p < 4; p++) {
            cr_expect_eq(r.at[p], want[p]);
            cr_expect_gt(r.secs[p], 0);
            sum += r.secs[p];
        }
        cr_expect_geq(r.wall_s, sum, "the estimate sums over all %d positions: %g < %g", SEQ_L, r.wall_s, sum);
        sample_result_free(&r);
        sample_close(&ss);
    }
}

Test(sample_run, refusals_are_codes_with_one_line) {
    td_write_sequences(P("seq"));
    char text[1000];
    snprintf(text, sizeof text,
             "{\"name\": \"seq\", \"task\": {\"name\": \"sequences\", \"path\": \"%s\"},"
             " \"model\": {\"d_model\": 8, \"heads\": 2, \"layers\": 1, \"attention\": {\"variant\": \"softmax\"}}}",
             P("seq"));
    tp_write_bytes(P("seq.json"), text, strlen(text));
    sample_session s;
    sample_opts o = {.n = 2, .batch = 1, .temperature = 1, .mode = SAMPLE_MODE_RECURRENT};
    sample_source src = {.config = P("seq.json"), .device = AB_DEV_CPU};
    cr_expect_eq(sample_open(&s, &src, &o), AB_EINVAL, "softmax has no recurrent mode");
    cr_expect(strncmp(ab_error(), "sample --mode recurrent: ", 25) == 0 && !strchr(ab_error(), '\n'), "%s",
              ab_error());
    /* with the override to linear it has: the initialised model samples */
    const char *sets[] = {"model.attention.variant=linear"};
    src.sets = sets;
    src.n_sets = 1;
    cr_assert_eq(sample_open(&s, &src, &o), 0, "%s", ab_error());
    cr_expect(s.recurrent);
    cr_expect_eq(s.meta.step, -1, "no checkpoint: no step");
    sample_close(&s);
    /* a copy model is not sampled value by value behind a start token */
    char copy[1000];
    snprintf(copy, sizeof copy, COPY_FMT, "linear");
    tp_write_bytes(P("copy.json"), copy, strlen(copy));
    src = (sample_source){.config = P("copy.json"), .device = AB_DEV_CPU};
    cr_expect_eq(sample_open(&s, &src, &o), AB_EINVAL);
    cr_expect(strstr(ab_error(), "the task 'copy' is not predicted value by value") != NULL, "%s", ab_error());
}

/* The traffic of a step (`sample --traffic`, the emulated binary): where the build
 * counts traffic (TEST_TRAFFIC_EXPECTED), one step at position 3 of a two-layer model
 * moves at least its minimal bytes, whose parts are the model's: each layer's state
 * (linear: C (M + 1) floats per slice, read and rewritten; the key/value cache: its 3
 * positions read, one written), the batch's embedding rows and position row, the
 * values in and out, the weights but the embedding table; the draws stay on the device
 * (nothing copied to or from the host). Elsewhere the request is refused. */
/* seq.json: a config of the sequences task (data in seq/): 2 layers of linear. */
static void write_seq_config(void) {
    char cfg[1000];
    snprintf(cfg, sizeof cfg,
             "{\"name\": \"seq\", \"task\": {\"name\": \"sequences\", \"path\": \"%s\"},"
             " \"model\": {\"d_model\": 16, \"heads\": 2, \"layers\": 2, \"d_ff\": 32,"
             "            \"attention\": {\"variant\": \"linear\"}}, \"seed\": 3}",
             P("seq"));
    tp_write_bytes(P("seq.json"), cfg, strlen(cfg));
}

static json_t *traffic_of(const char *variant, int T, char **err) {
    char set[64], pos[16], dir[64];
    write_seq_config();
    snprintf(set, sizeof set, "model.attention.variant=%s", variant);
    snprintf(pos, sizeof pos, "%d", T);
    snprintf(dir, sizeof dir, "t-%s", variant);
    int rc = tp_run(g_dir, ATTNBENCH_EMU_EXE, "AB_EMU_STRICT=0",
                    TP_ARGV("--threads", "1", "sample", "--config", P("seq.json"), "--set", set, "--traffic", pos,
                            "--device", "cuda", "--batch", "4", "--n", "4", "--out", P("%s", dir), NULL),
                    NULL, err);
    if (rc) {
        cr_assert_eq(rc, 2, "sample --traffic: status %d: %s", rc, *err);
        return NULL;
    }
    json_t *doc = json_load_file(P("%s/sample.json", dir), 0, NULL);
    cr_assert_not_null(doc);
    return doc;
}

static long long tr_int(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    cr_assert(json_is_integer(v), "traffic: no integer '%s'", key);
    return (long long)json_integer_value(v);
}

Test(sample_run, traffic_of_a_step_against_its_floor) {
    td_write_sequences(P("seq"));
    const int B = 4, H = 2, Dh = 8, L = 2, T = 3;
    const char *variants[] = {"linear", "stateful-softmax"};
    for (int v = 0; v < 2; v++) {
        char *err = NULL;
        json_t *doc = traffic_of(variants[v], T, &err);
        if (!TEST_TRAFFIC_EXPECTED) {
            cr_assert_null(doc, "a build without the traffic library counted traffic");
            cr_expect(tp_usage_error(2, err, "sample --traffic without counting",
                                     TP_ARGV("does not count memory traffic", NULL)));
            free(err);
            continue;
        }
        cr_assert_not_null(doc, "%s: refused: %s", variants[v], err);
        free(err);
        cr_assert_str_eq(json_string_value(json_object_get(doc, "method")), "traffic");
        cr_expect_null(json_object_get(doc, "wall_s"), "a traffic count has no time");
        const json_t *git = json_object_get(doc, "git"); /* the source (null outside a git checkout) */
        cr_expect(json_is_null(git) || (json_is_object(git) && json_object_get(git, "commit") &&
                                        json_object_get(git, "dirty")),
                  "sample.json does not name its source");
        const json_t *t = json_object_get(doc, "traffic"), *p = json_object_get(t, "min_parts");
        cr_assert(json_is_object(t) && json_is_object(p), "no traffic record");
        cr_expect_eq(tr_int(t, "position"), T);
        /* state bytes per layer: linear C (M+1) per slice, both ways; the cache (D + M)
         * per position and slice, T read and one written */
        const long long lin = (long long)B * H * Dh * (Dh + 1) * 4, kv = (long long)B * H * 2 * Dh * 4;
        cr_expect_eq(tr_int(p, "state_read_bytes"), v == 0 ? L * lin : L * T * kv, "%s", variants[v]);
        cr_expect_eq(tr_int(p, "state_write_bytes"), v == 0 ? L * lin : L * kv, "%s", variants[v]);
        cr_expect_eq(tr_int(p, "values_bytes"), 4 * B);
        cr_expect_eq(tr_int(p, "embedding_read_bytes"), (B + 1) * 16 * 4, "the batch's rows and one position");
        const long long params = (long long)json_integer_value(json_object_get(json_object_get(doc, "model"), "params"));
        const long long w = tr_int(p, "weights_read_bytes");
        cr_expect(w < 4 * params && (4 * params - w) % (16 * 4) == 0, "weights %lld of %lld parameters' bytes", w,
                  4 * params); /* all but whole rows of the token table */
        const long long min_r = tr_int(t, "min_read_bytes"), min_w = tr_int(t, "min_write_bytes");
        cr_expect_eq(min_r, w + tr_int(p, "embedding_read_bytes") + tr_int(p, "state_read_bytes") + 4 * B);
        cr_expect_eq(min_w, tr_int(p, "state_write_bytes") + 4 * B);
        const long long dram = tr_int(t, "dram_read_bytes") + tr_int(t, "dram_write_bytes");
        cr_expect_geq(dram, min_r + min_w, "%s: %lld bytes moved, below the floor %lld", variants[v], dram,
                      min_r + min_w);
        cr_expect_eq(tr_int(t, "h2d_bytes"), 0, "the draws stay on the device");
        cr_expect_eq(tr_int(t, "d2h_bytes"), 0, "the draws stay on the device");
        cr_expect_gt(tr_int(t, "launches"), 2 * L, "at least the layers' operations");
        /* and at most 2.1x it: 1.73x (linear) and 1.94x (the cache) measured, the rest
         * being the activations that the layers' operations write and read back (at
         * d_model 16 they weigh as much as the 18 kB of weights); a step reading its
         * weights twice would move 2.4x */
        cr_expect_leq(dram, 2.1 * (double)(min_r + min_w), "%s: %lld bytes moved, %.2fx the floor", variants[v],
                      dram, (double)dram / (double)(min_r + min_w));
        json_decref(doc);
    }
    /* refusals: a variant without a recurrent mode (the mode is checked first, so in
     * every build), a position past the row */
    char *err = NULL;
    cr_expect_null(traffic_of("softmax", T, &err));
    cr_expect(tp_usage_error(2, err, "softmax", TP_ARGV("counts a recurrent step", NULL)));
    if (TEST_TRAFFIC_EXPECTED) {
        cr_expect_null(traffic_of("linear", SEQ_L, &err));
        cr_expect(tp_usage_error(2, err, "past the row", TP_ARGV("positions 0..", NULL)));
    }
    /* and a count is not also an estimate or a completion (checked before any model) */
    const char *also[] = {"--estimate", "--complete"}, *val[] = {"2", "0.5"};
    for (int i = 0; i < 2; i++) {
        const int rc = tp_run(g_dir, ATTNBENCH_EMU_EXE, NULL,
                              TP_ARGV("sample", "--config", P("seq.json"), "--traffic", "1", also[i], val[i], "--device",
                                      "cuda", "--out", P("t-both"), NULL),
                              NULL, &err);
        cr_expect(tp_usage_error(rc, err, also[i], TP_ARGV("--traffic excludes", also[i], NULL)));
        cr_expect(!tp_exists(P("t-both/sample.json")), "a refused count wrote a document");
    }
    free(err);
}

/* `sample --graph` (the emulated binary, --device cuda): the same rows as the steps
 * without it, byte for byte, and sample.json says the graph was recorded once per batch
 * (after its prefill) and launched at every step; without --graph it says it was not
 * asked for. On the CPU, or by recomputation, the request is refused with one line and
 * nothing is written. */
static int graph_run(const char *exe, const char *mode, bool graph, const char *dir, char **err) {
    const char *dev = strcmp(exe, ATTNBENCH_EXE) == 0 ? "cpu" : "cuda";
    if (graph)
        return tp_run(g_dir, exe, "AB_EMU_STRICT=0",
                      TP_ARGV("--threads", "1", "sample", "--config", P("seq.json"), "--device", dev, "--batch", "2",
                              "--n", "4", "--seed", "5", "--mode", mode, "--graph", "--out", P("%s", dir), NULL),
                      NULL, err);
    return tp_run(g_dir, exe, "AB_EMU_STRICT=0",
                  TP_ARGV("--threads", "1", "sample", "--config", P("seq.json"), "--device", dev, "--batch", "2", "--n",
                          "4", "--seed", "5", "--mode", mode, "--out", P("%s", dir), NULL),
                  NULL, err);
}

Test(sample_run, graph_samples_the_same_rows) {
    td_write_sequences(P("seq"));
    write_seq_config();
    char *err = NULL;
    for (int gr = 0; gr < 2; gr++) /* (tp_run frees the last err itself) */
        cr_assert_eq(graph_run(ATTNBENCH_EMU_EXE, "recurrent", gr, gr ? "g1" : "g0", &err), 0, "%s", err);
    size_t n0 = 0, n1 = 0;
    unsigned char *a = tp_read_bytes(P("g0/samples.npy"), &n0), *b = tp_read_bytes(P("g1/samples.npy"), &n1);
    cr_assert(a && b && n0 == n1 && n0 > 0, "samples.npy missing");
    cr_expect(memcmp(a, b, n0) == 0, "--graph sampled other rows");
    free(a), free(b);
    for (int gr = 0; gr < 2; gr++) {
        json_t *doc = json_load_file(P("%s/sample.json", gr ? "g1" : "g0"), 0, NULL);
        cr_assert_not_null(doc);
        const json_t *g = json_object_get(doc, "graph");
        cr_assert(json_is_object(g), "sample.json has no graph record");
        const json_t *note = json_object_get(g, "note");
        cr_expect_eq(json_is_true(json_object_get(g, "asked")), gr == 1);
        cr_expect_eq(json_integer_value(json_object_get(g, "records")), gr ? 2 : 0, "one recording per batch");
        cr_expect_eq(json_integer_value(json_object_get(g, "launches")), gr ? 2 * (SEQ_L - 1) : 0,
                     "a launch per step");
        if (gr) cr_expect(json_is_null(note), "graph note: %s", json_string_value(note));
        else cr_expect_str_eq(json_string_value(note), "not asked for");
        json_decref(doc);
    }
    /* refusals: the CPU's binary, and recomputation */
    int rc = graph_run(ATTNBENCH_EXE, "recurrent", true, "g-cpu", &err);
    cr_expect(tp_usage_error(rc, err, "--graph on the CPU", TP_ARGV("sample --graph", "--device cuda", NULL)));
    rc = graph_run(ATTNBENCH_EMU_EXE, "recompute", true, "g-re", &err);
    cr_expect(tp_usage_error(rc, err, "--graph by recomputation", TP_ARGV("sample --graph", "recomputation", NULL)));
    free(err);
    const sample_opts both = {.n = 4, .batch = 2, .estimate = 2, .graph = true};
    cr_expect_eq(sample_opts_check(&both), AB_EINVAL, "--graph with --estimate");
    cr_expect(strstr(ab_error(), "--graph excludes --estimate") != NULL, "%s", ab_error());
    cr_expect(!tp_exists(P("g-cpu/sample.json")) && !tp_exists(P("g-re/sample.json")), "a refused request wrote a document");
}

/* ---- generation ---- */

static void generate(const char *ckpt, sample_mode mode, gen_result *r) {
    const gen_opts o = {.n = 12, .mode = mode, .keep_tokens = true, .device = AB_DEV_CPU};
    cr_assert_eq(gen_run(ckpt, &o, r), 0, "%s", ab_error());
    cr_assert_eq(r->prompts, 12);
    cr_expect(r->generated >= 12 && r->generated <= 48, "%lld tokens", r->generated);
    cr_expect_eq(r->accuracy, (double)r->correct / (double)r->generated);
    cr_expect_eq(r->exact_rate, (double)r->exact / 12.0);
    cr_assert(json_is_array(r->tokens) && json_array_size(r->tokens) == 12);
    cr_expect_gt(r->wall_s, 0);
}

Test(sample_run, generate_scores_a_trained_copy_model) {
    char text[1000];
    snprintf(text, sizeof text, COPY_FMT, "linear");
    train_to(text, 0, P("copy0.bin"));
    train_to(text, 100, P("copy.bin"));
    gen_result rec, cmp, untrained;
    generate(P("copy.bin"), SAMPLE_MODE_AUTO, &rec);
    generate(P("copy.bin"), SAMPLE_MODE_RECOMPUTE, &cmp);
    generate(P("copy0.bin"), SAMPLE_MODE_AUTO, &untrained);
    cr_expect(rec.recurrent && !cmp.recurrent);
    cr_expect(json_equal(rec.tokens, cmp.tokens), "recurrent and recomputed greedy tokens differ");
    cr_expect_eq(rec.correct, cmp.correct);
    cr_expect_eq(rec.generated, untrained.generated, "the same prompts, whatever the weights");
    cr_expect_gt(rec.accuracy, untrained.accuracy + 0.2, "trained %g vs untrained %g", rec.accuracy,
                 untrained.accuracy);
    json_t *doc = gen_document(&rec, &(gen_opts){.n = 12, .device = AB_DEV_CPU}, P("copy.bin"), "test");
    cr_expect_eq(json_number_value(json_object_get(doc, "accuracy")), rec.accuracy);
    cr_expect_eq(json_integer_value(json_object_get(doc, "step")), 100);
    cr_expect(json_is_array(json_object_get(doc, "generated")));
    cr_expect(json_object_get(doc, "git") != NULL, "the document does not name its source (git)");
    json_decref(doc);
    gen_result_free(&rec);
    gen_result_free(&cmp);
    gen_result_free(&untrained);
    /* softmax has no recurrent mode: refused, nothing kept */
    snprintf(text, sizeof text, COPY_FMT, "softmax");
    train_to(text, 0, P("sm.bin"));
    gen_result r;
    const gen_opts o = {.n = 2, .mode = SAMPLE_MODE_RECURRENT, .device = AB_DEV_CPU};
    cr_expect_eq(gen_run(P("sm.bin"), &o, &r), AB_EINVAL);
    cr_expect(strncmp(ab_error(), "generate --mode recurrent: ", 27) == 0, "%s", ab_error());
    cr_expect_null(r.tokens);
}

/* ---- decoding ---- */

Test(sample_run, decode_counts_errors_whatever_the_batch) {
    td_write_frames_ctc(P("ctc"));
    char text[2000];
    snprintf(text, sizeof text,
             "{\"name\": \"ctc\", \"task\": {\"name\": \"frames\", \"path\": \"%s\", \"targets\": \"ctc\"},"
             " \"model\": {\"d_model\": 16, \"heads\": 2, \"layers\": 1, \"d_ff\": 16, \"dropout\": 0.0,"
             "            \"attention\": {\"variant\": \"softmax\"}},"
             " \"optim\": {\"kind\": \"adam\", \"lr\": 0.02}, \"epochs\": 8, \"batch\": 8, \"seed\": 7}",
             P("ctc"));
    train_to(text, 40, P("ctc.bin"));
    decode_result all, part;
    cr_assert_eq(decode_run(P("ctc.bin"), &(decode_opts){.n = 0}, &all), 0, "%s", ab_error());
    cr_expect_str_eq(all.cfg.task->split_names[all.split], "test");
    cr_assert_eq(all.rows, TD_ROWS[2]);
    cr_assert_eq(json_array_size(all.utterances), (size_t)TD_ROWS[2]);
    long long errors = 0, refs = 0, exact = 0;
    for (size_t i = 0; i < json_array_size(all.utterances); i++) {
        json_t *u = json_array_get(all.utterances, i);
        errors += json_integer_value(json_object_get(u, "errors"));
        refs += json_integer_value(json_object_get(u, "ref_len"));
        exact += json_integer_value(json_object_get(u, "errors")) == 0;
        cr_expect_eq(json_integer_value(json_object_get(u, "row")), (json_int_t)i);
    }
    cr_expect_eq(all.errors, errors);
    cr_expect_eq(all.ref_labels, refs);
    cr_expect_eq(all.exact, exact);
    cr_expect_eq(all.per, (double)errors / (double)refs);
    cr_expect_lt(all.per, 0.5, "a trained model's label error rate: %g", all.per);
    /* the first 3 rows of test in batches of 2: what the whole split's batches of 8 gave
     * for them (rows are independent in evaluation mode) */
    cr_assert_eq(decode_run(P("ctc.bin"), &(decode_opts){.n = 3, .batch = 2}, &part), 0, "%s", ab_error());
    cr_assert_eq(part.rows, 3);
    for (size_t i = 0; i < 3; i++)
        cr_expect(json_equal(json_array_get(part.utterances, i), json_array_get(all.utterances, i)), "row %zu", i);
    decode_result_free(&part);
    cr_assert_eq(decode_run(P("ctc.bin"), &(decode_opts){.split = "valid", .n = 100}, &part), 0, "%s", ab_error());
    cr_expect_eq(part.rows, TD_ROWS[1], "n beyond the split: every row");
    decode_result_free(&part);
    decode_result_free(&all);
    /* refusals: an unknown split, a model without a ctc head */
    cr_expect_eq(decode_run(P("ctc.bin"), &(decode_opts){.split = "nope"}, &part), AB_EINVAL);
    cr_expect(strstr(ab_error(), "decode --split nope: the task has no such split") != NULL, "%s", ab_error());
    char copy[1000];
    snprintf(copy, sizeof copy, COPY_FMT, "linear");
    train_to(copy, 0, P("copy.bin"));
    cr_expect_eq(decode_run(P("copy.bin"), &(decode_opts){.n = 1}, &part), AB_EINVAL);
    cr_expect(strstr(ab_error(), "has no ctc head (task 'copy')") != NULL, "%s", ab_error());
}
