/* The training run as a library call (experiments/driver/train_run.h), without the
 * command line: a short copy-task run to completion and its run document, a stop
 * flag that interrupts a run with a checkpoint, a resume that continues it to the
 * same losses as an uninterrupted run (bit for bit at one thread), and the refusals of
 * a folder that already holds a run. */
#include <criterion/criterion.h>

#include "blas.h"
#include "error.h"
#include "task_list.h"
#include "test_proc.h"
#include "train_run.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* A tiny copy config: 12 steps, an evaluation every 4, a checkpoint every 4, a log
 * line every 2; seconds at most. */
static const char CONFIG[] =
    "{\"name\": \"copy-run\", \"task\": {\"name\": \"copy\", \"max_symbols\": 4, \"symbols\": 4},\n"
    " \"model\": {\"d_model\": 16, \"heads\": 2, \"layers\": 1, \"d_ff\": 32, \"dropout\": 0.0,\n"
    "           \"attention\": {\"variant\": \"linear\"}},\n"
    " \"optim\": {\"kind\": \"radam\", \"lr\": 0.01},\n"
    " \"steps\": 12, \"batch\": 8, \"eval_every\": 4, \"eval_batches\": 2, \"checkpoint_every\": 4,\n"
    " \"log_every\": 2, \"seed\": 7}\n";

static char g_dir[4096];
static char g_config[4200];

static void setup(void) {
    task_list_install(); /* the driver knows the tasks the program installs */
    ab_set_threads(1);   /* a resume is bit-identical on the thread count of its checkpoint */
    tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/train-run-tmp");
    snprintf(g_config, sizeof g_config, "%s/copy.json", g_dir);
    tp_write_bytes(g_config, CONFIG, strlen(CONFIG));
}

static void teardown(void) { tp_rm_tree(g_dir); }

TestSuite(train_run, .init = setup, .fini = teardown, .timeout = 300);

/* A request for the config into g_dir/NAME, quiet. */
static train_run_request request(const char *name) {
    static char out[16][4200];
    static int next;
    char *o = out[next++ % 16];
    snprintf(o, sizeof out[0], "%s/%s", g_dir, name);
    train_run_request r = {.config_path = g_config, .out_dir = o, .quiet = true, .device = AB_DEV_CPU,
                           .command_line = "attnbench train copy.json"};
    return r;
}

static json_t *load_doc(const char *dir) {
    json_error_t e;
    char path[4300];
    snprintf(path, sizeof path, "%s/train.json", dir);
    json_t *doc = json_load_file(path, 0, &e);
    cr_assert_not_null(doc, "%s: %s", path, e.text);
    return doc;
}

static const char *doc_status(const json_t *doc) { return json_string_value(json_object_get(doc, "status")); }

/* The number of records of a kind. */
static int count_records(const json_t *doc, const char *kind) {
    size_t i;
    json_t *r;
    int n = 0;
    json_array_foreach(json_object_get(doc, "records"), i, r) {
        if (strcmp(json_string_value(json_object_get(r, "kind")), kind) == 0) n++;
    }
    return n;
}

static void run_ok(const train_run_request *req, train_run_result *res) {
    int rc = train_run(req, res);
    cr_assert_eq(rc, 0, "train_run: %s", ab_error());
    cr_assert_eq(res->code, 0);
}

Test(train_run, completes_with_its_document) {
    train_run_request req = request("full");
    train_run_result res;
    run_ok(&req, &res);
    cr_assert_eq(res.status, TRAIN_RUN_OK);
    cr_assert_eq(res.step, 12);
    cr_assert_str_eq(res.dir, req.out_dir);
    json_t *doc = load_doc(res.dir);
    cr_assert_str_eq(doc_status(doc), "ok");
    cr_assert_str_eq(json_string_value(json_object_get(doc, "task")), "copy");
    cr_assert_str_eq(json_string_value(json_object_get(doc, "device")), "cpu");
    cr_assert_str_eq(json_string_value(json_object_get(doc, "command")), "attnbench train copy.json");
    cr_assert_eq(json_array_size(json_object_get(doc, "step_loss")), 12);
    cr_assert_eq(count_records(doc, "train"), 6, "a train record every 2 steps");
    cr_assert_eq(count_records(doc, "eval"), 4, "an evaluation at step 0, 4, 8, 12");
    json_t *summary = json_object_get(doc, "summary");
    cr_assert_eq(json_integer_value(json_object_get(summary, "steps_done")), 12);
    cr_assert(json_is_real(json_object_get(summary, "final_eval_loss")));
    cr_assert_null(json_object_get(doc, "resumes"), "a run that was never resumed has no resumes");
    json_decref(doc);
    cr_assert(tp_exists(tp_path(res.dir, "checkpoint.bin")));
    cr_assert(tp_exists(tp_path(res.dir, "train.tsv")));

    /* a resume of the complete run does nothing */
    req.resume = true;
    run_ok(&req, &res);
    cr_assert_eq(res.status, TRAIN_RUN_OK);
    cr_assert_eq(res.step, 12);
}

/* Sets the stop flag once the run reaches step *ctx. */
typedef struct {
    volatile sig_atomic_t flag;
    long long at;
} stopper;

static void stop_at(void *ctx, long long step) {
    stopper *s = ctx;
    if (step == s->at) s->flag = 1;
}

/* The losses of every step of a document, as the doubles it holds. */
static void step_losses(const json_t *doc, double *out, size_t n) {
    json_t *sl = json_object_get(doc, "step_loss");
    cr_assert_eq(json_array_size(sl), n);
    for (size_t i = 0; i < n; i++) out[i] = json_real_value(json_array_get(sl, i));
}

Test(train_run, interrupted_then_resumed_bit_for_bit) {
    train_run_request full = request("uninterrupted");
    train_run_result res;
    run_ok(&full, &res);
    json_t *doc = load_doc(res.dir);
    double want[12];
    step_losses(doc, want, 12);
    json_decref(doc);

    /* stopped after step 6 (between two checkpoints): a checkpoint at 6 */
    stopper st = {0, 6};
    train_run_request req = request("resumed");
    req.stop = &st.flag;
    req.on_step = stop_at;
    req.ctx = &st;
    run_ok(&req, &res);
    cr_assert_eq(res.status, TRAIN_RUN_INTERRUPTED);
    cr_assert_eq(res.step, 6);
    cr_assert(tp_exists(tp_path(res.dir, "checkpoint.bin")));
    doc = load_doc(res.dir);
    cr_assert_str_eq(doc_status(doc), "interrupted");
    cr_assert_eq(json_array_size(json_object_get(doc, "step_loss")), 6);
    json_decref(doc);

    /* the resume, its config from the checkpoint */
    train_run_request again = request("resumed");
    again.config_path = NULL;
    again.resume = true;
    run_ok(&again, &res);
    cr_assert_eq(res.status, TRAIN_RUN_OK);
    cr_assert_eq(res.step, 12);
    doc = load_doc(res.dir);
    cr_assert_str_eq(doc_status(doc), "ok");
    double got[12];
    step_losses(doc, got, 12);
    for (int i = 0; i < 12; i++) cr_assert(got[i] == want[i], "step %d: loss %.17g, uninterrupted %.17g", i + 1, got[i], want[i]);
    /* the earlier records are adopted: the same records as the uninterrupted run */
    cr_assert_eq(count_records(doc, "train"), 6);
    cr_assert_eq(count_records(doc, "eval"), 4);
    json_t *resumes = json_object_get(doc, "resumes");
    cr_assert_eq(json_array_size(resumes), 1);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(resumes, 0), "step")), 6);
    cr_assert(json_is_true(json_object_get(json_array_get(resumes, 0), "earlier_records")));
    json_decref(doc);
}

Test(train_run, stop_before_the_first_step) {
    train_run_request req = request("stopped");
    volatile sig_atomic_t stop = 1;
    req.stop = &stop;
    train_run_result res;
    run_ok(&req, &res);
    cr_assert_eq(res.status, TRAIN_RUN_INTERRUPTED);
    cr_assert_eq(res.step, 0);
    cr_assert(tp_exists(tp_path(res.dir, "checkpoint.bin")));
    json_t *doc = load_doc(res.dir);
    cr_assert_str_eq(doc_status(doc), "interrupted");
    cr_assert_eq(json_array_size(json_object_get(doc, "step_loss")), 0);
    json_decref(doc);
}

/* A refusal: code AB_EINVAL, status refused, the message `want`. */
static void expect_refusal(const train_run_request *req, const char *want) {
    train_run_result res;
    int rc = train_run(req, &res);
    cr_assert_eq(rc, AB_EINVAL, "rc %d (%s)", rc, ab_error());
    cr_assert_eq(res.code, AB_EINVAL);
    cr_assert_eq(res.status, TRAIN_RUN_REFUSED);
    cr_assert_str_eq(ab_error(), want);
}

Test(train_run, refuses_a_folder_holding_a_run) {
    train_run_request req = request("held");
    volatile sig_atomic_t stop = 1; /* a checkpoint at step 0 is enough */
    req.stop = &stop;
    train_run_result res;
    run_ok(&req, &res);
    char want[16384];
    snprintf(want, sizeof want,
             "%s already holds a run; continue it with --resume, or replace it with --overwrite", req.out_dir);
    req.stop = NULL;
    expect_refusal(&req, want);

    /* a run that stopped before its first checkpoint: only its document */
    cr_assert_eq(remove(tp_path(req.out_dir, "checkpoint.bin")), 0);
    snprintf(want, sizeof want,
             "%s already holds a run without a checkpoint (it stopped before its first one, so --resume cannot "
             "continue it); start it again with --overwrite",
             req.out_dir);
    expect_refusal(&req, want);
    /* ... which --resume cannot continue */
    req.resume = true;
    char ckpt[4300], json[4300];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.bin", req.out_dir);
    snprintf(json, sizeof json, "%s/train.json", req.out_dir);
    snprintf(want, sizeof want,
             "train --resume: no checkpoint %s to resume: the run in %s stopped before its first checkpoint; start "
             "it again with --overwrite (which replaces %s)",
             ckpt, req.out_dir, json);
    expect_refusal(&req, want);
    /* --overwrite starts it again */
    req.resume = false;
    req.overwrite = true;
    run_ok(&req, &res);
    cr_assert_eq(res.status, TRAIN_RUN_OK);
}

/* The config as JSON rather than a file, with --set applied over it. */
Test(train_run, config_given_as_json_with_sets) {
    json_error_t e;
    json_t *config = json_loads(CONFIG, 0, &e);
    cr_assert_not_null(config, "%s", e.text);
    train_run_request req = request("from-json");
    req.config_path = NULL;
    req.config = config;
    const char *sets[] = {"steps=4", "name=from-json"};
    req.sets = sets;
    req.n_sets = 2;
    train_run_result res;
    run_ok(&req, &res);
    cr_assert_eq(res.status, TRAIN_RUN_OK);
    cr_assert_eq(res.step, 4);
    json_t *doc = load_doc(res.dir);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "config"), "name")), "from-json");
    cr_assert_eq(json_array_size(json_object_get(doc, "step_loss")), 4);
    json_decref(doc);

    /* a bad value is refused, named by its key, without the name of a file */
    const char *bad[] = {"steps=-1"};
    req.sets = bad;
    req.n_sets = 1;
    req.overwrite = true;
    int rc = train_run(&req, &res);
    cr_assert_eq(rc, AB_EINVAL, "rc %d (%s)", rc, ab_error());
    cr_assert_eq(res.status, TRAIN_RUN_REFUSED);
    cr_assert_str_eq(ab_error(), "config: 'steps' = -1 is outside [0, 1099511627776]");
    json_decref(config);
}

Test(train_run, refuses_a_resume_without_a_checkpoint) {
    train_run_request req = request("empty");
    req.resume = true;
    char want[16384];
    snprintf(want, sizeof want, "train --resume: no checkpoint %s/checkpoint.bin to resume", req.out_dir);
    expect_refusal(&req, want);
    req.config_path = NULL; /* the config from the checkpoint: the same refusal */
    expect_refusal(&req, want);
    req.overwrite = true;
    expect_refusal(&req, "train: --resume and --overwrite exclude each other");
    req.overwrite = false;
    req.out_dir = NULL;
    expect_refusal(&req, "train: a CONFIG.json is required (or --resume --out DIR to continue a run)");
}
