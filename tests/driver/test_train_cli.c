/* `attnbench train`, `generate` and `plot` of training runs, end to end, on the
 * seconds-long copy config experiments/copy/smoke.json: a complete run document and
 * TSV, the loss going down, resume equal to an uninterrupted run (checkpoint blobs and
 * losses bit for bit), kill -9 and SIGINT in the middle of a run, a diverging run
 * stopped with its last good checkpoint kept, corrupt / foreign / truncated
 * checkpoints and bad configs refused with one line and exit status 2, generation in
 * every variant (recurrent and recomputed tokens equal), training, resume and
 * generation on the CUDA backend (emulated on the CPU by attnbench-emu), and Figure 2. */
#include "test_train_cli.h"

char g_dir[600];
char *g_out, *g_err;

static void setup(void) {
    tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/train-cli-tmp");
}

static void teardown(void) {
    tp_rm_tree(g_dir);
    free(g_out);
    free(g_err);
    g_out = g_err = NULL;
}

TestSuite(train_cli, .init = setup, .fini = teardown, .timeout = 300);

/* The binary the helpers run (test_train_cli.h). */
const char *g_exe = ATTNBENCH_EXE;

int wait_status(pid_t pid) { return tp_wait(g_dir, pid, &g_out, &g_err); }

/* Exit status 2 and one line "attnbench: error: ..." holding `needle`. */
void expect_usage_error(int status, const char *what, const char *needle) {
    tp_usage_error(status, g_err, what, TP_ARGV(needle, NULL));
}

const char *status_of(json_t *doc) { return json_string_value(json_object_get(doc, "status")); }

/* The last eval record's loss and accuracy, and the first eval loss. */
static void eval_losses(json_t *doc, double *first, double *last, double *last_acc) {
    *first = *last = *last_acc = NAN;
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(doc, "records"), i, r) {
        if (strcmp(json_string_value(json_object_get(r, "kind")), "eval") != 0) continue;
        double l = json_number_value(json_object_get(r, "eval_loss"));
        if (isnan(*first)) *first = l;
        *last = l;
        *last_acc = json_number_value(json_object_get(r, "eval_accuracy"));
    }
}

/* What a resumed run must reproduce exactly: the blobs expect_same_state compares, and
 * the step its checkpoint was taken at. */
static void expect_same_checkpoint(const char *a, const char *b, const char *what) {
    expect_same_state(a, b, what);
    cr_expect_eq(ckpt_step(a), ckpt_step(b), "%s: steps differ", what);
}

/* ------------------------------------------------------------------------------------ */

Test(train_cli, smoke_run_is_complete_and_learns) {
    cr_assert_eq(run("train", SMOKE, "--out", P("run"), NULL), 0, "train failed: %s", g_err);
    /* stderr is not a terminal: log lines, no progress bar */
    cr_expect(strstr(g_err, "train: step 5/100 loss") != NULL, "no log lines: %s", g_err);
    cr_expect(strchr(g_err, '\r') == NULL, "a progress bar was drawn on a non-terminal");
    json_t *doc = load(P("run/train.json"));
    cr_assert_str_eq(json_string_value(json_object_get(doc, "schema")), "attnbench/run/1");
    cr_assert_str_eq(status_of(doc), "ok");
    const char *keys[] = {"command", "config", "seed", "machine", "git", "started", "finished", "records",
                          "step_loss", "summary", "task"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        cr_expect_not_null(json_object_get(doc, keys[i]), "missing top-level key %s", keys[i]);
    json_t *cfg = json_object_get(doc, "config");
    cr_expect_eq(json_integer_value(json_object_get(cfg, "steps")), 100);
    cr_expect_not_null(json_object_get(json_object_get(cfg, "optim"), "beta2"), "config is not the canonical one");
    cr_expect_eq(json_array_size(json_object_get(doc, "step_loss")), 100);
    /* records: train every 5 steps, eval at 0, 20, ..., 100 */
    size_t i, n_train = 0, n_eval = 0;
    json_t *r;
    double prev_cpu = 0;
    json_array_foreach(json_object_get(doc, "records"), i, r) {
        const char *k = json_string_value(json_object_get(r, "kind"));
        long long s = json_integer_value(json_object_get(r, "step"));
        if (strcmp(k, "train") == 0) {
            cr_expect_eq(s, 5 * (long long)(++n_train));
            const char *f[] = {"loss", "loss_last", "lr", "grad_norm", "tokens_per_s", "elapsed_s", "cpu_s"};
            for (int j = 0; j < 7; j++)
                cr_expect(json_is_number(json_object_get(r, f[j])), "train record at %lld: %s", s, f[j]);
        } else {
            cr_expect_str_eq(k, "eval");
            cr_expect_eq(s, 20 * (long long)(n_eval++));
            cr_expect(json_is_number(json_object_get(r, "eval_accuracy")));
        }
        /* the process CPU time since training began: a clock, so never going back */
        double cpu = json_number_value(json_object_get(r, "cpu_s"));
        cr_expect(json_is_number(json_object_get(r, "cpu_s")) && cpu >= prev_cpu, "record %zu: cpu_s %g after %g", i,
                  cpu, prev_cpu);
        prev_cpu = cpu;
    }
    cr_expect_eq(n_train, 20);
    cr_expect_eq(n_eval, 6);
    /* The loss goes down: copying 4 symbols out of 4, a model that has not learnt to
     * copy cannot beat ln 4 = 1.386 on the copied half (it starts near 2.0). Measured
     * after 100 steps: 0.95, accuracy 0.61 (chance 0.25). */
    double first, last, acc;
    eval_losses(doc, &first, &last, &acc);
    cr_expect_gt(first, 1.7, "initial eval loss %g", first);
    cr_expect_lt(last, 0.8 * log(4.0), "eval loss %g -> %g: the model did not learn to copy", first, last);
    cr_expect_gt(acc, 0.45, "eval accuracy %g", acc);
    json_t *sum = json_object_get(doc, "summary");
    cr_expect_eq(json_integer_value(json_object_get(sum, "steps_done")), 100);
    cr_expect_eq(json_real_value(json_object_get(sum, "final_eval_loss")), last);
    cr_expect_gt(json_integer_value(json_object_get(sum, "peak_bytes")), 0);
    /* CPU time: the steps' share of the training's, both positive; the total at the end
     * no less than the last record's (a clock) */
    double cpu = json_number_value(json_object_get(sum, "cpu_s")), step_cpu = json_number_value(json_object_get(sum, "step_cpu_s"));
    cr_expect(step_cpu > 0 && step_cpu <= cpu && cpu >= prev_cpu, "summary cpu_s %g, step_cpu_s %g", cpu, step_cpu);
    cr_expect_eq(json_number_value(json_object_get(sum, "positions")), 100.0 * 16 * 8,
                 "positions: 100 steps of 16 rows of N = 2 x 4 (the copy of up to 4 symbols)");
    /* TSV: a header and one row per record */
    char *tsv = tp_slurp(P("run/train.tsv"), NULL);
    cr_assert_not_null(tsv);
    cr_expect(strncmp(tsv, "kind\tstep\tloss\t", 15) == 0, "TSV header: %.60s", tsv);
    int lines = 0;
    for (char *c = tsv; *c; c++) lines += *c == '\n';
    cr_expect_eq(lines, 1 + 26);
    free(tsv);
    cr_expect_eq(ckpt_step(P("run/checkpoint.bin")), 100);
    json_decref(doc);

    /* a second run into the same folder is refused unless --overwrite or --resume */
    size_t n0, n1;
    char *before = tp_slurp(P("run/checkpoint.bin"), &n0);
    expect_usage_error(run("train", SMOKE, "--out", P("run"), NULL), "existing run", "--resume");
    char *after = tp_slurp(P("run/checkpoint.bin"), &n1);
    cr_expect(n0 == n1 && memcmp(before, after, n0) == 0, "the refused run touched the checkpoint");
    free(before);
    free(after);
    /* a resume of a finished run does nothing, and writes nothing */
    char *doc0 = tp_slurp(P("run/train.json"), &n0);
    cr_assert_eq(run("train", "--resume", "--out", P("run"), NULL), 0, "%s", g_err);
    cr_expect(strstr(g_err, "nothing to do"), "%s", g_err);
    char *doc1 = tp_slurp(P("run/train.json"), &n1);
    cr_expect(n0 == n1 && memcmp(doc0, doc1, n0) == 0, "a resume of a complete run rewrote its document");
    free(doc0);
    free(doc1);
    cr_expect_eq(ckpt_step(P("run/checkpoint.bin")), 100);
}

/* Item 10 of the GPU issue: train draws nothing, so a machine without gnuplot (PATH
 * holding nothing) runs it to the end with its document and table complete. */
Test(train_cli, runs_without_gnuplot) {
    char env[1200];
    tp_env_without_gnuplot(env, sizeof env, g_dir, false);
    int st = tp_run(g_dir, g_exe, env, TP_ARGV("--threads", "1", "train", SMOKE, "--out", P("nognu"), "--quiet",
                                               "--set", "steps=10", NULL),
                    &g_out, &g_err);
    cr_assert_eq(st, 0, "train without gnuplot: exit status %d: %s", st, g_err);
    cr_expect_null(strstr(g_err, "attnbench: "), "%s", g_err);
    json_t *doc = load(P("nognu/train.json"));
    cr_expect_str_eq(status_of(doc), "ok");
    cr_expect_eq(json_array_size(json_object_get(doc, "step_loss")), 10);
    json_decref(doc);
    cr_expect(tp_exists(P("nognu/train.tsv")) && tp_exists(P("nognu/checkpoint.bin")));
}

Test(train_cli, resume_equals_uninterrupted_run) {
    cr_assert_eq(run("train", SMOKE, "--out", P("a"), "--quiet", NULL), 0, "%s", g_err);
    cr_assert_eq(run("train", SMOKE, "--out", P("b"), "--quiet", "--set", "steps=40", NULL), 0, "%s", g_err);
    cr_assert_eq(ckpt_step(P("b/checkpoint.bin")), 40);
    /* resume with the config file and a longer run */
    cr_assert_eq(run("train", SMOKE, "--out", P("b"), "--resume", NULL), 0, "%s", g_err);
    cr_expect(strstr(g_err, "resuming") && strstr(g_err, "from step 40"), "%s", g_err);
    expect_same_checkpoint(P("a/checkpoint.bin"), P("b/checkpoint.bin"), "resumed at 40");
    /* the documents: same per-step losses, same records (kind, step, loss) */
    json_t *da = load(P("a/train.json")), *db = load(P("b/train.json"));
    cr_expect(json_equal(json_object_get(da, "step_loss"), json_object_get(db, "step_loss")), "step losses differ");
    json_t *ra = json_object_get(da, "records"), *rb = json_object_get(db, "records");
    cr_assert_eq(json_array_size(ra), json_array_size(rb), "records: %zu vs %zu", json_array_size(ra),
                 json_array_size(rb));
    for (size_t i = 0; i < json_array_size(ra); i++) {
        json_t *x = json_array_get(ra, i), *y = json_array_get(rb, i);
        const char *fields[] = {"kind", "step", "loss", "eval_loss", "eval_accuracy"};
        for (int f = 0; f < 5; f++)
            cr_expect(json_equal(json_object_get(x, fields[f]), json_object_get(y, fields[f])) ||
                          (!json_object_get(x, fields[f]) && !json_object_get(y, fields[f])),
                      "record %zu: %s differs", i, fields[f]);
    }
    /* the CPU time carries over the resume: the resumed process's records go on from the
     * checkpoint's, never below the first process's */
    double prev = 0;
    for (size_t i = 0; i < json_array_size(rb); i++) {
        json_t *c = json_object_get(json_array_get(rb, i), "cpu_s");
        cr_expect(json_is_number(c) && json_number_value(c) >= prev, "record %zu: cpu_s %g after %g", i,
                  json_number_value(c), prev);
        prev = json_number_value(c);
    }
    cr_expect_eq(json_array_size(json_object_get(db, "resumes")), 1);
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(db, "resumes"), 0), "time")) ? "x" : "",
                     "x", "the resume is not recorded");
    json_decref(da);
    json_decref(db);
    /* without the config file: the checkpoint's config, --set of a resumable key */
    cr_assert_eq(run("train", SMOKE, "--out", P("c"), "--quiet", "--set", "steps=60", NULL), 0, "%s", g_err);
    cr_assert_eq(run("train", "--resume", "--out", P("c"), "--quiet", "--set", "steps=100", NULL), 0, "%s", g_err);
    expect_same_checkpoint(P("a/checkpoint.bin"), P("c/checkpoint.bin"), "resumed at 60 without the config");
    /* a resume that changes the model or the optimiser is refused, the run untouched */
    size_t n0, n1;
    char *before = tp_slurp(P("c/checkpoint.bin"), &n0);
    expect_usage_error(run("train", SMOKE, "--out", P("c"), "--resume", "--set", "model.d_model=32", NULL),
                       "changed model", "'model.d_model' differs");
    expect_usage_error(run("train", "--resume", "--out", P("c"), "--set", "optim.lr=0.5", NULL), "changed lr",
                       "'optim.lr' differs");
    expect_usage_error(run("train", "--resume", "--out", P("c"), "--set", "model.attention.variant=softmax", NULL),
                       "changed variant", "'model.attention.variant' differs");
    char *after = tp_slurp(P("c/checkpoint.bin"), &n1);
    cr_expect(n0 == n1 && memcmp(before, after, n0) == 0, "a refused resume touched the checkpoint");
    free(before);
    free(after);
}

Test(train_cli, kill_9_then_resume_loses_only_steps_since_the_checkpoint) {
    /* a run that would go on for long, checkpoints every 50 steps */
    pid_t pid = spawn("train", SMOKE, "--out", P("k"), "--quiet", "--set", "steps=1000000", "--set",
                      "checkpoint_every=50", "--set", "eval_every=0", NULL);
    long long seen = wait_for_checkpoint(pid, P("k/checkpoint.bin"), 150);
    cr_assert_eq(kill(pid, SIGKILL), 0);
    cr_assert_eq(wait_status(pid), 128 + SIGKILL);
    /* what the run had logged when it died, and the checkpoint it left: complete */
    json_t *doc = load(P("k/train.json"));
    cr_expect_str_eq(status_of(doc), "running");
    size_t logged = json_array_size(json_object_get(doc, "step_loss"));
    json_decref(doc);
    long long ck = ckpt_step(P("k/checkpoint.bin"));
    cr_assert_geq(ck, seen, "the checkpoint went back");
    cr_expect_eq(ck % 50, 0);
    /* the JSON is written after the checkpoint of a step: at most 49 logged steps are newer */
    cr_expect_leq((long long)logged - ck, 49, "logged %zu steps, checkpoint at %lld", logged, ck);
    cr_assert_lt(ck, 400, "the run went too far before the kill (%lld steps)", ck);
    /* resume and finish at step 400 */
    cr_assert_eq(run("train", SMOKE, "--out", P("k"), "--resume", "--set", "steps=400", "--set", "checkpoint_every=50",
                     "--set", "eval_every=0", NULL),
                 0, "%s", g_err);
    char want[64];
    snprintf(want, sizeof want, "from step %lld", ck);
    cr_expect(strstr(g_err, want), "resume message: %s", g_err);
    doc = load(P("k/train.json"));
    cr_expect_str_eq(status_of(doc), "ok");
    cr_expect_eq(json_array_size(json_object_get(doc, "step_loss")), 400);
    json_decref(doc);
    /* equal to a run that was never killed */
    cr_assert_eq(run("train", SMOKE, "--out", P("straight"), "--quiet", "--set", "steps=400", "--set",
                     "checkpoint_every=50", "--set", "eval_every=0", NULL),
                 0, "%s", g_err);
    expect_same_checkpoint(P("straight/checkpoint.bin"), P("k/checkpoint.bin"), "killed and resumed");
}

Test(train_cli, sigint_stops_with_a_checkpoint) {
    pid_t pid = spawn("train", SMOKE, "--out", P("i"), "--set", "steps=1000000", "--set", "eval_every=0", NULL);
    wait_for_checkpoint(pid, P("i/checkpoint.bin"), 40);
    cr_assert_eq(kill(pid, SIGINT), 0);
    cr_assert_eq(wait_status(pid), 130, "stderr: %s", g_err);
    json_t *doc = load(P("i/train.json"));
    cr_expect_str_eq(status_of(doc), "interrupted");
    long long done = (long long)json_array_size(json_object_get(doc, "step_loss"));
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(doc, "summary"), "steps_done")), done);
    cr_expect_eq(ckpt_step(P("i/checkpoint.bin")), done, "the checkpoint is not at the last step");
    cr_expect(strstr(g_err, "--resume"), "%s", g_err);
    json_decref(doc);
}

Test(train_cli, divergence_stops_and_keeps_the_last_good_checkpoint) {
    /* lr 0.01 for 6 steps, then 1e31: the parameters overflow and a loss turns NaN */
    int st = run("train", SMOKE, "--out", P("nan"), "--set", "optim.schedule.milestones=[6]", "--set",
                 "optim.schedule.gamma=1e33", "--set", "checkpoint_every=5", "--set", "steps=30", NULL);
    cr_assert_eq(st, 1, "exit status %d: %s", st, g_err);
    const char *last = g_err;
    for (const char *c = g_err; *c; c++)
        if (c[0] == '\n' && c[1]) last = c + 1;
    cr_expect(strncmp(last, "attnbench: error: training diverged", 35) == 0, "%s", g_err);
    cr_expect(strstr(last, "last good checkpoint (step 5)"), "%s", last);
    json_t *doc = load(P("nan/train.json"));
    cr_expect_str_eq(status_of(doc), "failed");
    const char *reason = json_string_value(json_object_get(doc, "reason"));
    cr_expect(reason && strstr(reason, "diverged"), "reason: %s", reason ? reason : "(none)");
    size_t n = json_array_size(json_object_get(doc, "step_loss"));
    cr_expect(n >= 6 && n < 30, "%zu step losses", n);
    for (size_t i = 0; i < n; i++) cr_expect(json_is_number(json_array_get(json_object_get(doc, "step_loss"), i)));
    json_decref(doc);
    /* the checkpoint is the good one of step 5: finite parameters */
    cr_expect_eq(ckpt_step(P("nan/checkpoint.bin")), 5);
    size_t bytes;
    float *p = blob(P("nan/checkpoint.bin"), AB_CKPT_PARAMS, &bytes);
    for (size_t i = 0; i < bytes / sizeof(float); i++) cr_assert(isfinite(p[i]), "parameter %zu is %g", i, p[i]);
    free(p);
    /* --overwrite over that run, diverging before its first checkpoint: the earlier
     * run's checkpoint is gone (it must not pass for this run's) */
    st = run("train", SMOKE, "--out", P("nan"), "--overwrite", "--quiet", "--set", "optim.schedule.milestones=[6]",
             "--set", "optim.schedule.gamma=1e33", "--set", "checkpoint_every=100", NULL);
    cr_assert_eq(st, 1, "exit status %d: %s", st, g_err);
    cr_expect(strstr(g_err, "no checkpoint had been written yet"), "%s", g_err);
    cr_expect(!tp_exists(P("nan/checkpoint.bin")), "the earlier run's checkpoint is still there");
}

/* ---- bad input ---- */

void write_text(const char *path, const char *text) { tp_write_bytes(path, text, strlen(text)); }

Test(train_cli, set_task_option_left_out_of_the_file) {
    /* smoke.json leaves out task.noise (off): --set may still set it, the result's
     * config records it, a resume must keep it, and a misspelt task key is refused */
    cr_assert_eq(run("train", SMOKE, "--out", P("n"), "--quiet", "--set", "task.noise=0.2", "--set", "steps=20", NULL),
                 0, "%s", g_err);
    json_t *d = load(P("n/train.json"));
    json_t *task = json_object_get(json_object_get(d, "config"), "task");
    cr_expect(json_is_real(json_object_get(task, "noise")) && json_real_value(json_object_get(task, "noise")) == 0.2,
              "config.task.noise not recorded");
    json_decref(d);
    cr_assert_eq(run("train", "--resume", "--out", P("n"), "--quiet", "--set", "steps=30", NULL), 0, "%s", g_err);
    cr_expect_eq(ckpt_step(P("n/checkpoint.bin")), 30);
    expect_usage_error(run("train", SMOKE, "--out", P("n"), "--resume", "--set", "steps=40", NULL), "noise dropped",
                       "'task.noise' differs");
    expect_usage_error(run("train", SMOKE, "--out", P("n"), "--resume", "--set", "task.noise=0.3", "--set", "steps=40",
                           NULL),
                       "noise changed", "'task.noise' differs");
    expect_usage_error(run("train", SMOKE, "--out", P("o"), "--set", "task.nois=0.2", NULL), "misspelt task key",
                       "no key 'nois'");
    expect_usage_error(run("train", SMOKE, "--out", P("o"), "--set", "task.noise=2", NULL), "noise out of range",
                       "'task.noise' = 2 is outside [0, 1]");
    /* a new key on the way that is not UTF-8: jansson refused it and freed the object
     * made for it, which was then used (found by tests/fuzz/fuzz_config.c) */
    expect_usage_error(run("train", SMOKE, "--out", P("o"), "--set", "model.attention.set.\xff.x=1", NULL),
                       "key not UTF-8", "not valid UTF-8");
    expect_usage_error(run("train", SMOKE, "--out", P("o"), "--set", "name=\xff", NULL), "name not UTF-8",
                       "neither JSON nor UTF-8");
    cr_expect(!tp_exists(P("o")), "a refused run left an output folder");
}

Test(train_cli, bad_configs_one_line_exit_2) {
    write_text(P("unknown.json"), "{\"name\": \"x\", \"task\": {\"name\": \"copy\"}, \"model\": {\"attention\": "
                                  "{\"variant\": \"linear\"}}, \"bacth\": 3}");
    expect_usage_error(run("train", P("unknown.json"), "--out", P("o"), NULL), "unknown key", "unknown key 'bacth'");
    write_text(P("type.json"), "{\"name\": \"x\", \"task\": {\"name\": \"copy\"}, \"model\": {\"layers\": \"4\", "
                               "\"attention\": {\"variant\": \"linear\"}}}");
    expect_usage_error(run("train", P("type.json"), "--out", P("o"), NULL), "wrong type", "'model.layers' must be an integer");
    expect_usage_error(run("train", SMOKE, "--out", P("o"), "--set", "model.attention.variant=bogus", NULL),
                       "unknown variant", "'model.attention.variant' = 'bogus'");
    expect_usage_error(run("train", SMOKE, "--out", P("o"), "--set", "model.widht=3", NULL), "bad --set",
                       "no key 'widht'");
    expect_usage_error(run("train", SMOKE, "--out", P("o"), "--set", "steps", NULL), "--set without =", "KEY=VALUE");
    expect_usage_error(run("train", SMOKE, "--out", P("o"), "--set", "optim.lr=-1", NULL), "bad lr", "'optim.lr'");
    expect_usage_error(run("train", SMOKE, "--out", P("o"), "--device", "cuda", NULL), "cuda", "no CUDA");
    expect_usage_error(run("train", P("missing.json"), NULL), "missing config", "missing.json");
    write_text(P("broken.json"), "{\"name\": ");
    expect_usage_error(run("train", P("broken.json"), NULL), "broken JSON", "broken.json");
    expect_usage_error(run("train", SMOKE, "--bogus", NULL), "unknown argument", "--bogus");
    expect_usage_error(run("train", NULL), "no config", "CONFIG");
    expect_usage_error(run("train", "--resume", "--out", P("nothing"), NULL), "nothing to resume", "no checkpoint");
    cr_expect(!tp_exists(P("o")), "a refused run left an output folder");
}

Test(train_cli, corrupt_foreign_truncated_checkpoints_refused) {
    cr_assert_eq(run("train", SMOKE, "--out", P("r"), "--quiet", "--set", "steps=10", NULL), 0, "%s", g_err);
    size_t n;
    char *good = tp_slurp(P("r/checkpoint.bin"), &n);
    cr_assert_not_null(good);
    struct {
        const char *name, *needle;
        size_t len;
        long flip; /* byte to flip, or -1 */
    } cases[] = {
        {"flipped", "corrupt", n, (long)n - 100},
        {"header", "corrupt", n, 20},
        {"truncated", "truncated", n / 2, -1},
        {"empty", "empty file", 0, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cr_assert_eq(ab_mkdir_p(P("%s", cases[i].name)), 0);
        char *b = malloc(n);
        memcpy(b, good, n);
        if (cases[i].flip >= 0) b[cases[i].flip] ^= 0x10;
        FILE *f = fopen(P("%s/checkpoint.bin", cases[i].name), "wb");
        fwrite(b, 1, cases[i].len, f);
        fclose(f);
        free(b);
        expect_usage_error(run("train", "--resume", "--out", P("%s", cases[i].name), NULL), cases[i].name,
                           cases[i].needle);
        expect_usage_error(run("generate", P("%s/checkpoint.bin", cases[i].name), NULL), cases[i].name,
                           cases[i].needle);
        expect_usage_error(run("train", SMOKE, "--resume", "--out", P("%s", cases[i].name), NULL), cases[i].name,
                           cases[i].needle);
    }
    /* a foreign file */
    cr_assert_eq(ab_mkdir_p(P("foreign")), 0);
    write_text(P("foreign/checkpoint.bin"), "{\"this\": \"is JSON\"}\n");
    expect_usage_error(run("train", "--resume", "--out", P("foreign"), NULL), "foreign", "not an attnbench checkpoint");
    expect_usage_error(run("generate", SMOKE, NULL), "a config as checkpoint", "not an attnbench checkpoint");
    /* an attnbench checkpoint that is not a training checkpoint */
    ab_ckpt_writer *w;
    cr_assert_eq(ab_ckpt_begin(P("other.bin"), &w), 0);
    float x[4] = {1, 2, 3, 4};
    cr_assert_eq(ab_ckpt_add(w, AB_CKPT_PARAMS, x, sizeof x), 0);
    cr_assert_eq(ab_ckpt_commit(w), 0, "%s", ab_error());
    expect_usage_error(run("generate", P("other.bin"), NULL), "other checkpoint", "not a training checkpoint");
    expect_usage_error(run("generate", P("nothing.bin"), NULL), "missing checkpoint", "nothing.bin");
    free(good);
}

/* ---- generate ---- */

static json_t *generate(const char *ckpt, const char *mode, const char *n) {
    int st = run("generate", ckpt, "--mode", mode, "--n", n, "--tokens", "--out", P("gen.json"), NULL);
    cr_assert_eq(st, 0, "generate %s --mode %s: %s", ckpt, mode, g_err);
    json_error_t e;
    json_t *doc = json_loads(g_out, 0, &e);
    cr_assert_not_null(doc, "generate printed no JSON: %s", e.text);
    json_t *file = load(P("gen.json"));
    cr_expect(json_equal(doc, file), "--out differs from stdout");
    json_decref(file);
    const char *keys[] = {"schema", "checkpoint", "step", "task", "variant", "mode", "prompts", "tokens_generated",
                          "accuracy", "exact_rate", "wall_s", "tokens_per_s", "generated"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        cr_expect_not_null(json_object_get(doc, keys[i]), "generate: no %s", keys[i]);
    return doc;
}

Test(train_cli, generate_every_variant) {
    /* Every causal variant the copy task can train (efficient is non-causal only: the
     * model refuses it, one line), local with a window shorter than the sequence (its
     * ring wraps during generation), linear with the favor map, the linear-RNN family
     * (their gate and rate made from the layer input) and sparse with a set window and
     * stride (auto ones follow the length, which recomputation changes every step). */
    static const struct {
        const char *name, *variant, *set, *set2;
    } cases[] = {
        {"softmax", "softmax", NULL, NULL},
        {"stateful-softmax", "stateful-softmax", NULL, NULL},
        {"lsh", "lsh", NULL, NULL},
        {"linear", "linear", NULL, NULL},
        {"polynomial", "polynomial", NULL, NULL},
        {"local", "local", "model.attention.set.window=3", NULL},
        {"favor", "linear", "model.attention.set.feature_map=favor", NULL},
        {"retention", "retention", NULL, NULL},
        {"gla", "gla", NULL, NULL},
        {"gla-scalar", "gla", "model.attention.set.gate=scalar", NULL},
        {"deltanet", "deltanet", NULL, NULL},
        {"sparse", "sparse", "model.attention.set.window=2", "model.attention.set.stride=3"},
    };
    for (size_t v = 0; v < sizeof cases / sizeof cases[0]; v++) {
        char set[64];
        snprintf(set, sizeof set, "model.attention.variant=%s", cases[v].variant);
        cr_assert_eq(run("train", SMOKE, "--out", P("%s", cases[v].name), "--quiet", "--set", set, "--set",
                         cases[v].set ? cases[v].set : "steps=100", "--set", cases[v].set2 ? cases[v].set2 : "steps=100",
                         NULL),
                     0, "%s: %s", cases[v].name, g_err);
        const char *ck = P("%s/checkpoint.bin", cases[v].name);
        bool rec = strcmp(cases[v].variant, "softmax") && strcmp(cases[v].variant, "lsh");
        json_t *a = generate(ck, "auto", "12");
        cr_expect_str_eq(json_string_value(json_object_get(a, "mode")), rec ? "recurrent" : "recompute", "%s",
                         cases[v].name);
        cr_expect_str_eq(json_string_value(json_object_get(a, "variant")), cases[v].variant);
        cr_expect_eq(json_integer_value(json_object_get(a, "prompts")), 12);
        long long gen = json_integer_value(json_object_get(a, "tokens_generated"));
        cr_expect(gen >= 12 && gen <= 48, "%lld tokens", gen);
        double acc = json_number_value(json_object_get(a, "accuracy"));
        cr_expect(acc >= 0 && acc <= 1);
        cr_expect_gt(json_number_value(json_object_get(a, "tokens_per_s")), 0);
        if (rec) {
            /* greedy decoding: the RNN and the recomputation give the same tokens. Their
             * logits agree to ~1e-6 relative for linear, favor, local,
             * stateful-softmax, retention, gla, deltanet and sparse (the model suite
             * measures linear's and the family's), far below the gaps
             * between a trained model's top two logits. The polynomial map's recurrent
             * state loses more (up to 1e-4 relative, README), so for it both modes only
             * have to run. */
            json_t *b = generate(ck, "recompute", "12");
            cr_expect_str_eq(json_string_value(json_object_get(b, "mode")), "recompute");
            if (strcmp(cases[v].variant, "polynomial") != 0) {
                cr_expect(json_equal(json_object_get(a, "generated"), json_object_get(b, "generated")),
                          "%s: recurrent and recomputed tokens differ", cases[v].name);
                cr_expect_eq(json_number_value(json_object_get(a, "accuracy")),
                             json_number_value(json_object_get(b, "accuracy")));
            }
            json_decref(b);
        } else {
            expect_usage_error(run("generate", ck, "--mode", "recurrent", NULL), "no recurrent mode",
                               "has no recurrent mode");
        }
        json_decref(a);
    }
    expect_usage_error(run("train", SMOKE, "--out", P("efficient"), "--quiet", "--set",
                           "model.attention.variant=efficient", NULL),
                       "efficient on a causal task", "non-causal only");
    expect_usage_error(run("generate", P("linear/checkpoint.bin"), "--mode", "fast", NULL), "bad mode", "--mode");
    expect_usage_error(run("generate", P("linear/checkpoint.bin"), "--n", "0", NULL), "bad n", "--n");
    expect_usage_error(run("generate", NULL), "no checkpoint", "CHECKPOINT");
}

Test(train_cli, generate_a_trained_copy_is_right_more_often_than_chance) {
    /* 300 steps of the smoke config (2-layer linear model): greedy copies of up to 4
     * symbols out of 4; chance per symbol is 0.25. Measured: 0.83 (threshold 0.6). */
    cr_assert_eq(run("train", SMOKE, "--out", P("g"), "--quiet", "--set", "steps=300", NULL), 0, "%s", g_err);
    json_t *a = generate(P("g/checkpoint.bin"), "auto", "64");
    double acc = json_number_value(json_object_get(a, "accuracy"));
    cr_expect_gt(acc, 0.6, "copy accuracy %g", acc);
    json_decref(a);
}

/* ---- on the CUDA backend (emulated on the CPU) ---- */

Test(train_cli, cuda_emulated_train_resume_generate) {
    /* The same run on the CPU and on the CUDA backend: the same model, seeds, batches and
     * dropout masks, float32 on both with other summation orders (cuBLAS vs OpenBLAS,
     * the device's reductions), so the losses agree to rounding that training then
     * carries along. Measured over 40 steps: 2.0e-8 relative at most; tolerance 1e-4,
     * 5000x that, far below what a wrong gradient or a lost update does to a loss. */
    cr_assert_eq(run("train", SMOKE, "--out", P("cpu"), "--quiet", "--set", "steps=40", NULL), 0, "%s", g_err);
    g_exe = ATTNBENCH_EMU_EXE;
    cr_assert_eq(run("train", SMOKE, "--out", P("cu"), "--quiet", "--device", "cuda", "--set", "steps=40", NULL), 0,
                 "%s", g_err);
    json_t *doc = load(P("cu/train.json"));
    cr_expect_str_eq(json_string_value(json_object_get(doc, "device")), "cuda");
    cr_expect_str_eq(status_of(doc), "ok");
    json_decref(doc);
    size_t na, nb;
    double *a = step_losses(P("cpu/train.json"), &na), *b = step_losses(P("cu/train.json"), &nb);
    cr_assert_eq(na, 40);
    cr_assert_eq(nb, 40);
    double worst = 0;
    for (size_t i = 0; i < na; i++) worst = fmax(worst, fabs(a[i] - b[i]) / fabs(a[i]));
    cr_expect_lt(worst, 1e-4, "CUDA vs CPU step losses: %g relative", worst);
    cr_expect_lt(b[39], b[0], "the loss did not fall on CUDA");
    free(a);
    free(b);
    /* resume on the device: bit for bit the uninterrupted device run */
    cr_assert_eq(run("train", SMOKE, "--out", P("cu2"), "--quiet", "--device", "cuda", "--set", "steps=20", NULL), 0,
                 "%s", g_err);
    cr_assert_eq(run("train", "--resume", "--out", P("cu2"), "--quiet", "--device", "cuda", "--set", "steps=40", NULL),
                 0, "%s", g_err);
    expect_same_checkpoint(P("cu/checkpoint.bin"), P("cu2/checkpoint.bin"), "CUDA run resumed at 20");
    /* generation of one checkpoint on either device: the same greedy tokens (logits to
     * rounding, far below a trained model's top-two gaps) */
    const char *ck = P("cu/checkpoint.bin");
    cr_assert_eq(run("generate", ck, "--n", "12", "--tokens", "--device", "cuda", NULL), 0, "%s", g_err);
    json_t *gc = json_loads(g_out, 0, NULL);
    cr_assert_not_null(gc, "generate --device cuda: not JSON: %s", g_out);
    cr_expect_str_eq(json_string_value(json_object_get(gc, "device")), "cuda");
    g_exe = ATTNBENCH_EXE;
    cr_assert_eq(run("generate", ck, "--n", "12", "--tokens", NULL), 0, "%s", g_err);
    json_t *gp = json_loads(g_out, 0, NULL);
    cr_assert_not_null(gp);
    cr_expect(json_equal(json_object_get(gc, "generated"), json_object_get(gp, "generated")),
              "CUDA and CPU generation differ");
    json_decref(gc);
    json_decref(gp);
    /* no device: one line, exit status 2, nothing written */
    g_exe = ATTNBENCH_EMU_EXE;
    setenv("AB_EMU_NO_DEVICE", "1", 1);
    expect_usage_error(run("train", SMOKE, "--out", P("nodev"), "--device", "cuda", NULL), "no device",
                       "no CUDA device");
    unsetenv("AB_EMU_NO_DEVICE");
    cr_expect(!tp_exists(P("nodev/train.json")) && !tp_exists(P("nodev/checkpoint.bin")));
    g_exe = ATTNBENCH_EXE;
}
