/* Micro-batches and data-parallel ranks (trainer.h, "Micro-batches"; dist.h):
 * accumulate against a plain step (the trainer called directly), then `attnbench train
 * --dist mpi` under mpirun with R = 1, 2 and 4 ranks against one process accumulating
 * the same R micro-batches (bit for bit) and a plain run (float rounding), a rank
 * killed mid-run, a resume on another number of ranks, the refusals, and the nccl
 * engine on the CUDA emulator (through a stand-in of NCCL carried by MPI) against the
 * mpi engine. The MPI tests skip where the build has no MPI or mpirun is missing. */
#include <criterion/criterion.h>

#include "blas.h"
#include "checkpoint.h"
#include "dist.h"
#include "error.h"
#include "task_list.h"
#include "test_proc.h"
#include "test_run.h"
#include "train_config.h"
#include "trainer.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* A tiny copy config with dropout (so that the micro-batches' masks matter): 6 steps
 * of 8 rows, an evaluation and a checkpoint every 3 steps. */
static const char CONFIG[] =
    "{\"name\": \"copy-dist\", \"task\": {\"name\": \"copy\", \"max_symbols\": 4, \"symbols\": 4},\n"
    " \"model\": {\"d_model\": 16, \"heads\": 2, \"layers\": 2, \"d_ff\": 32, \"dropout\": 0.1,\n"
    "           \"attention\": {\"variant\": \"linear\"}},\n"
    " \"optim\": {\"kind\": \"radam\", \"lr\": 0.01},\n"
    " \"steps\": 6, \"batch\": 8, \"eval_every\": 3, \"eval_batches\": 2, \"checkpoint_every\": 3,\n"
    " \"log_every\": 2, \"seed\": 5}\n";

/* How far a run of micro-batches may drift from a plain one. Each step's gradient is
 * the same sum in another order (a matrix product over 8 rows against 2 or 4 partial
 * products added), about 1e-7 relative per element; Adam's update divides by the root
 * of the second moment, so the parameters move by the same relative amount and the
 * losses of the next steps differ in the 7th or 8th digit. Measured over these 6
 * steps: at most 3e-8 relative on the losses; 1e-5 leaves room for other BLAS
 * kernels while failing on any real difference (a wrong dropout mask or weight
 * changes the loss in the 2nd or 3rd digit). */
#define DRIFT_REL 1e-5

static char g_dir[4096];
static char g_config[4200];
static char *g_out, *g_err;

static void setup(void) {
    task_list_install();
    ab_set_threads(1);
    tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/dist-tmp");
    snprintf(g_config, sizeof g_config, "%s/copy.json", g_dir);
    tp_write_bytes(g_config, CONFIG, strlen(CONFIG));
}

static void teardown(void) {
    tp_rm_tree(g_dir);
    free(g_out);
    free(g_err);
    g_out = g_err = NULL;
}

TestSuite(dist, .init = setup, .fini = teardown, .timeout = 300);

#define P(...) tp_path(g_dir, __VA_ARGS__)

/* The config with `accumulate` set, parsed. */
static void config_with(long long accumulate, train_config *c) {
    json_error_t e;
    json_t *root = json_loads(CONFIG, 0, &e);
    cr_assert_not_null(root, "%s", e.text);
    if (accumulate) json_object_set_new(root, "accumulate", json_integer(accumulate));
    cr_assert_eq(train_config_parse(root, c), 0, "%s", ab_error());
    json_decref(root);
}

static void expect_close(const double *a, const double *b, size_t n, double rel, const char *what) {
    for (size_t i = 0; i < n; i++)
        cr_expect_leq(fabs(a[i] - b[i]), rel * fabs(b[i]), "%s: step %zu: %.9g against %.9g", what, i + 1, a[i], b[i]);
}

/* The trainer's own steps: accumulate = 2 and 4 against the plain step, the losses and
 * the parameters after 6 steps; and the micro-batch model is built for b rows. */
Test(dist, accumulate_agrees_with_a_plain_step) {
    double losses[3][6];
    float *params[3];
    size_t np = 0;
    const long long acc[3] = {0, 2, 4};
    for (int k = 0; k < 3; k++) {
        train_config c;
        config_with(acc[k], &c);
        trainer *t;
        cr_assert_eq(trainer_create(&c, &t), 0, "%s", ab_error());
        cr_expect_eq(t->micro_rows, acc[k] ? 8 / acc[k] : 8, "micro-batch rows");
        for (int s = 0; s < 6; s++) {
            train_step_info info;
            cr_assert_eq(trainer_step(t, &info), 0, "%s", ab_error());
            losses[k][s] = info.loss;
        }
        np = tf_param_count(t->model);
        params[k] = malloc(sizeof(float) * np);
        memcpy(params[k], tf_params(t->model), sizeof(float) * np);
        trainer_destroy(t);
    }
    expect_close(losses[1], losses[0], 6, DRIFT_REL, "accumulate 2");
    expect_close(losses[2], losses[0], 6, DRIFT_REL, "accumulate 4");
    /* the parameters (about 1 in size after RAdam steps of 0.01) as the losses */
    double worst = 0;
    for (int k = 1; k < 3; k++)
        for (size_t i = 0; i < np; i++) worst = fmax(worst, fabs((double)params[k][i] - params[0][i]));
    cr_expect_lt(worst, 1e-4, "parameters drift by %g", worst);
    cr_expect_gt(fabs(losses[2][5] - losses[2][0]), 1e-3, "the runs did not train");
    for (int k = 0; k < 3; k++) free(params[k]);
}

Test(dist, accumulate_that_does_not_divide_the_batch_is_refused) {
    json_error_t e;
    json_t *root = json_loads(CONFIG, 0, &e);
    json_object_set_new(root, "accumulate", json_integer(3));
    train_config c;
    cr_expect_eq(train_config_parse(root, &c), AB_EINVAL);
    cr_expect(strstr(ab_error(), "'accumulate' 3 does not divide 'batch' 8"), "%s", ab_error());
    json_object_set_new(root, "accumulate", json_integer(0));
    cr_expect_eq(train_config_parse(root, &c), AB_EINVAL);
    cr_expect(strstr(ab_error(), "accumulate"), "%s", ab_error());
    json_decref(root);
    /* the canonical config leaves accumulate out at 1 (checkpoints before it compare equal) */
    config_with(1, &c);
    cr_expect_null(json_object_get(c.canon, "accumulate"));
    train_config_free(&c);
    config_with(2, &c);
    cr_expect_eq(json_integer_value(json_object_get(c.canon, "accumulate")), 2);
    train_config_free(&c);
}

Test(dist, the_engines_by_name_and_the_none_engine) {
    ab_dist_kind k;
    cr_expect_eq(ab_dist_kind_parse("mpi", &k), 0);
    cr_expect_eq(k, AB_DIST_MPI);
    cr_expect_eq(ab_dist_kind_parse("gloo", &k), AB_EINVAL);
    cr_expect(strstr(ab_error(), "--dist gloo: unknown (none, mpi or nccl)"), "%s", ab_error());
    ab_dist *d;
    cr_assert_eq(ab_dist_open(AB_DIST_NONE, AB_DEV_CPU, &d), 0, "%s", ab_error());
    cr_expect_eq(ab_dist_size(d), 1);
    float x[3] = {1, 2, 3};
    cr_expect_eq(ab_dist_sum_floats(d, AB_DEV_CPU, x, 3), 0);
    cr_expect(x[0] == 1 && x[1] == 2 && x[2] == 3, "one rank's sum is its own vector");
    ab_dist_close(d);
    float acc[2] = {1e8f, 1}, y[2] = {1, 2};
    ab_dist_add_floats(acc, y, 2);
    cr_expect(acc[0] == 1e8f + 1.0f && acc[1] == 3, "acc = acc + x");
}

/* ---- under mpirun ---- */

static bool have_mpi(void) {
    const char *why;
    if (!ab_dist_built(AB_DIST_MPI, &why)) return false;
    return MPIRUN[0] != '\0';
}
#define REQUIRE_MPI()                                                                                                  \
    do {                                                                                                               \
        if (!have_mpi()) cr_skip_test("no MPI in this build, or no mpirun");                                         \
    } while (0)

/* `mpirun -np R EXE --threads 1 train g_config ARGS... --dist ENGINE --quiet`, as root
 * too, more ranks than cores allowed; extra mpirun options (e.g. "-x", "NAME=VALUE")
 * before the program. Returns the exit status. */
static pid_t spawn_ranks(int R, const char *exe, const char *engine, const char *const *mpi_extra,
                         const char *const *args) {
    const char *argv[64];
    int n = 0;
    static char np[16];
    snprintf(np, sizeof np, "%d", R);
    argv[n++] = "--allow-run-as-root";
    argv[n++] = "--oversubscribe";
    argv[n++] = "-np";
    argv[n++] = np;
    for (int i = 0; mpi_extra && mpi_extra[i]; i++) argv[n++] = mpi_extra[i];
    argv[n++] = exe;
    argv[n++] = "--threads";
    argv[n++] = "1";
    argv[n++] = "train";
    argv[n++] = g_config;
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n++] = "--dist";
    argv[n++] = engine;
    argv[n++] = "--quiet";
    argv[n] = NULL;
    return tp_spawn(g_dir, MPIRUN, NULL, argv);
}

static int run_ranks(int R, const char *exe, const char *engine, const char *const *mpi_extra,
                     const char *const *args) {
    return tp_wait_for(g_dir, spawn_ranks(R, exe, engine, mpi_extra, args), 120, &g_out, &g_err);
}

static int run_one(const char *const *args) {
    const char *argv[32];
    int n = 0;
    argv[n++] = "--threads";
    argv[n++] = "1";
    argv[n++] = "train";
    argv[n++] = g_config;
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n++] = "--quiet";
    argv[n] = NULL;
    return tp_run(g_dir, ATTNBENCH_EXE, NULL, argv, &g_out, &g_err);
}

static void expect_same_losses(const char *a, const char *b, const char *what) {
    size_t na, nb;
    double *la = step_losses(a, &na), *lb = step_losses(b, &nb);
    cr_expect_eq(na, nb, "%s: %zu and %zu steps", what, na, nb);
    for (size_t i = 0; i < na && i < nb; i++)
        cr_expect(la[i] == lb[i], "%s: step %zu: %.9g against %.9g", what, i + 1, la[i], lb[i]);
    free(la);
    free(lb);
}

Test(dist, ranks_give_the_bits_of_one_process_accumulating_their_micro_batches) {
    REQUIRE_MPI();
    cr_assert_eq(run_one(TP_ARGV("--out", P("plain"), NULL)), 0, "%s", g_err);
    size_t n;
    double *plain = step_losses(P("plain/train.json"), &n);
    cr_assert_eq(n, 6);
    const int ranks[3] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        const int R = ranks[k];
        char mdir[64], adir[64], acc[32];
        snprintf(mdir, sizeof mdir, "mpi%d", R);
        snprintf(adir, sizeof adir, "acc%d", R);
        snprintf(acc, sizeof acc, "accumulate=%d", R);
        int st = run_ranks(R, ATTNBENCH_EXE, "mpi", NULL, TP_ARGV("--out", P("%s", mdir), NULL));
        cr_assert_eq(st, 0, "R = %d: exit %d: %s", R, st, g_err);
        cr_assert_eq(run_one(TP_ARGV("--out", P("%s", adir), "--set", acc, NULL)), 0, "%s", g_err);
        char what[64];
        snprintf(what, sizeof what, "%d ranks against accumulate %d", R, R);
        expect_same_losses(P("%s/train.json", mdir), P("%s/train.json", adir), what);
        expect_same_state(P("%s/checkpoint.bin", mdir), P("%s/checkpoint.bin", adir), what);
        double *l = step_losses(P("%s/train.json", mdir), &n);
        snprintf(what, sizeof what, "%d ranks against a plain run", R);
        expect_close(l, plain, 6, DRIFT_REL, what);
        free(l);
        json_t *doc = load(P("%s/train.json", mdir));
        json_t *sum = json_object_get(doc, "summary");
        cr_expect_eq(json_integer_value(json_object_get(sum, "ranks")), R);
        cr_expect_str_eq(json_string_value(json_object_get(sum, "dist")), "mpi");
        cr_expect_geq(num(sum, "comm_s"), 0.0);
        /* each step sums the gradient (2 (R-1)/R of it sent) and gathers the stats */
        cr_expect(R == 1 ? num(sum, "comm_bytes") == 0 : num(sum, "comm_bytes") > 0, "comm_bytes %g",
                  num(sum, "comm_bytes"));
        json_decref(doc);
        /* only rank 0 wrote: one document, one table, one checkpoint in the folder */
        int files = 0;
        DIR *dd = opendir(P("%s", mdir));
        cr_assert_not_null(dd);
        for (struct dirent *e; (e = readdir(dd));) files += e->d_name[0] != '.';
        closedir(dd);
        cr_expect_eq(files, 3, "%s holds %d files", mdir, files);
    }
    free(plain);
}

/* The pid of the rank `rank` that mpirun `parent` started (from /proc: the child whose
 * environment says OMPI_COMM_WORLD_RANK=rank); -1 when none. */
static pid_t rank_pid(pid_t parent, int rank) {
    DIR *d = opendir("/proc");
    if (!d) return -1;
    pid_t found = -1;
    char want[64];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    for (struct dirent *e; found < 0 && (e = readdir(d));) {
        const pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0) continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int ppid = 0;
        char comm[256], state;
        const bool ok = fscanf(f, "%*d (%255[^)]) %c %d", comm, &state, &ppid) == 3;
        fclose(f);
        if (!ok || ppid != parent) continue;
        /* /proc files have no size: read until the end */
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
        if (!(f = fopen(path, "rb"))) continue;
        static char env[1 << 17];
        const size_t n = fread(env, 1, sizeof env - 1, f);
        fclose(f);
        env[n] = '\0';
        for (size_t i = 0; i < n && found < 0; i += strlen(env + i) + 1)
            if (strcmp(env + i, want) == 0) found = pid;
    }
    closedir(d);
    return found;
}

Test(dist, a_killed_rank_fails_the_job_and_leaves_a_whole_checkpoint) {
    REQUIRE_MPI();
    const char *ckpt = P("killed/checkpoint.bin");
    pid_t pid = spawn_ranks(2, ATTNBENCH_EXE, "mpi", NULL,
                            TP_ARGV("--out", P("killed"), "--set", "steps=100000", "--set", "checkpoint_every=2",
                                    "--set", "eval_every=0", NULL));
    wait_for_checkpoint(pid, ckpt, 2);
    pid_t victim = rank_pid(pid, 1);
    cr_assert_gt(victim, 0, "rank 1 of mpirun %d not found", (int)pid);
    cr_assert_eq(kill(victim, SIGKILL), 0);
    const double t0 = tp_now_s();
    int st = tp_wait_for(g_dir, pid, 60, &g_out, &g_err);
    /* mpirun's own status is the killed rank's (128 + 9); a hang would be killed at 60 s */
    cr_expect(st != 0 && tp_now_s() - t0 < 50, "the job went on or hung: status %d after %.0f s", st, tp_now_s() - t0);
    cr_expect(strstr(g_err, "signal 9") || strstr(g_err, "Killed"), "mpirun did not say why: %s", g_err);
    /* what is there is a whole checkpoint (written atomically by rank 0) */
    cr_expect_geq(ckpt_step(ckpt), 2, "the checkpoint is not readable");
}

/* SIGTERM to mpirun reaches every rank (at whatever moment each gets it): they agree on
 * the step to stop after, rank 0 writes the checkpoint of that step and the document
 * says "interrupted". */
Test(dist, a_signal_stops_every_rank_at_the_same_step) {
    REQUIRE_MPI();
    const char *ckpt = P("stopped/checkpoint.bin");
    pid_t pid = spawn_ranks(2, ATTNBENCH_EXE, "mpi", NULL,
                            TP_ARGV("--out", P("stopped"), "--set", "steps=100000", "--set", "checkpoint_every=2",
                                    "--set", "eval_every=0", NULL));
    wait_for_checkpoint(pid, ckpt, 2);
    cr_assert_eq(kill(pid, SIGTERM), 0);
    int st = tp_wait_for(g_dir, pid, 60, &g_out, &g_err);
    cr_expect(st != 0 && st != 128 + SIGKILL, "status %d: %s", st, g_err);
    json_t *doc = load(P("stopped/train.json"));
    cr_expect_str_eq(json_string_value(json_object_get(doc, "status")), "interrupted");
    const long long done = (long long)num(json_object_get(doc, "summary"), "steps_done");
    cr_expect_eq(ckpt_step(ckpt), done, "the checkpoint is not of the last step (%lld)", done);
    cr_expect_lt(done, 100000);
    json_decref(doc);
}

Test(dist, a_resume_may_change_the_number_of_ranks) {
    REQUIRE_MPI();
    cr_assert_eq(run_one(TP_ARGV("--out", P("whole"), NULL)), 0, "%s", g_err);
    cr_assert_eq(run_one(TP_ARGV("--out", P("half"), "--set", "steps=3", NULL)), 0, "%s", g_err);
    int st = run_ranks(2, ATTNBENCH_EXE, "mpi", NULL, TP_ARGV("--out", P("half"), "--resume", "--set", "steps=6", NULL));
    cr_assert_eq(st, 0, "exit %d: %s", st, g_err);
    size_t na, nb;
    double *a = step_losses(P("half/train.json"), &na), *b = step_losses(P("whole/train.json"), &nb);
    cr_assert_eq(na, 6);
    cr_assert_eq(nb, 6);
    for (int i = 0; i < 3; i++) cr_expect(a[i] == b[i], "step %d: the steps before the resume changed", i + 1);
    expect_close(a + 3, b + 3, 3, DRIFT_REL, "2 ranks after 1");
    json_t *doc = load(P("half/train.json"));
    json_t *res = json_array_get(json_object_get(doc, "resumes"), 0);
    cr_expect_eq(json_integer_value(json_object_get(res, "ranks")), 2);
    json_decref(doc);
    free(a);
    free(b);
}

Test(dist, refusals) {
    REQUIRE_MPI();
    /* 8 rows do not make 3 ranks x accumulate 1: every rank refuses, the job exits 2 */
    int st = run_ranks(3, ATTNBENCH_EXE, "mpi", NULL, TP_ARGV("--out", P("three"), NULL));
    cr_expect_eq(st, 2, "status %d: %s", st, g_err);
    cr_expect(strstr(g_err, "attnbench: error: batch 8 does not divide into 3 ranks x accumulate 1"), "%s", g_err);
    cr_expect(strstr(g_err, "rank 2 of 3:"), "the other ranks do not say who they are: %s", g_err);
    cr_expect(!tp_exists(P("three/train.json")), "a refused run wrote its document");
    /* nccl sums device memory */
    st = run_ranks(1, ATTNBENCH_EXE, "nccl", NULL, TP_ARGV("--out", P("nccl-cpu"), NULL));
    cr_expect_eq(st, 2, "status %d: %s", st, g_err);
    cr_expect(strstr(g_err, "--dist nccl") && strstr(g_err, "--device cuda"), "%s", g_err);
    /* an engine that is not one */
    st = tp_run(g_dir, ATTNBENCH_EXE, NULL, TP_ARGV("train", g_config, "--dist", "gloo", NULL), &g_out, &g_err);
    tp_usage_error(st, g_err, "--dist gloo", TP_ARGV("--dist gloo: unknown", NULL));
}

/* The nccl engine's code (its chunks, sends, device sums, all-gather) on the emulator,
 * with NCCL stood in for by tests/util/nccl_standin.c, against the mpi engine on the
 * same emulated device: the same bits. Not strict mode: the stand-in reads device
 * memory from host code, as NCCL's transports would from the device. */
Test(dist, the_nccl_engine_on_the_emulator_sums_as_the_mpi_engine) {
    REQUIRE_MPI();
    if (!NCCL_STANDIN[0]) cr_skip_test("no NCCL stand-in in this build");
    char lib[4200];
    snprintf(lib, sizeof lib, "AB_NCCL_LIBRARY=%s", NCCL_STANDIN);
    int st = run_ranks(2, ATTNBENCH_EMU_EXE, "nccl", TP_ARGV("-x", "AB_EMU_STRICT=0", "-x", lib, NULL),
                       TP_ARGV("--out", P("nccl"), "--device", "cuda", "--set", "steps=3", NULL));
    cr_assert_eq(st, 0, "exit %d: %s", st, g_err);
    st = run_ranks(2, ATTNBENCH_EMU_EXE, "mpi", TP_ARGV("-x", "AB_EMU_STRICT=0", NULL),
                   TP_ARGV("--out", P("mpi"), "--device", "cuda", "--set", "steps=3", NULL));
    cr_assert_eq(st, 0, "exit %d: %s", st, g_err);
    expect_same_losses(P("nccl/train.json"), P("mpi/train.json"), "nccl against mpi");
    expect_same_state(P("nccl/checkpoint.bin"), P("mpi/checkpoint.bin"), "nccl against mpi");
    json_t *doc = load(P("nccl/train.json"));
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(doc, "summary"), "dist")), "nccl");
    json_decref(doc);
}
