/* attnbench bench and plot, end to end: a seconds-long sweep (experiments/sweep/
 * smoke.json) writes a complete run document and TSV; bad configs are refused with
 * one line and exit status 2, and leave an earlier result untouched; --device cuda on
 * the emulated binary records oom and skipped points and goes on. */
#include "cuda_device.h"
#include "error.h"
#include "sweep.h"
#include "test_proc.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SMOKE ATTNBENCH_SOURCE_DIR "/experiments/sweep/smoke.json"
#define DIR TEST_DATA_DIR "/bench-test"

static char *g_err; /* stderr of the last run */

/* Runs `EXE --threads 1 ARG...` (NULL-terminated) with ENV ("NAME=VALUE" or NULL) added
 * to the environment, stdout and stderr into DIR; returns the exit status. */
#define run_exe(env, exe, ...) tp_run(DIR, exe, env, TP_ARGV("--threads", "1", __VA_ARGS__), NULL, &g_err)

/* Runs `attnbench ARG...`. */
#define run(...) run_exe(NULL, ATTNBENCH_EXE, __VA_ARGS__)

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void setup(void) {
    mkdir(TEST_DATA_DIR, 0777);
    mkdir(DIR, 0777);
}

static void teardown(void) {
    free(g_err);
    g_err = NULL;
}

TestSuite(bench, .init = setup, .fini = teardown);

Test(bench, smoke_sweep_writes_complete_document) {
    int rc = run("bench", SMOKE, "--quiet", "--out", DIR "/smoke.json", NULL);
    cr_assert_eq(rc, 0, "bench failed: %s", g_err);
    json_error_t je;
    json_t *doc = json_load_file(DIR "/smoke.json", 0, &je);
    cr_assert_not_null(doc, "result is not JSON: %s", je.text);
    cr_assert_str_eq(json_string_value(json_object_get(doc, "schema")), "attnbench/run/1");
    cr_assert_str_eq(json_string_value(json_object_get(doc, "status")), "ok");
    const char *keys[] = {"command", "config",   "seed", "machine", "git",
                          "started", "finished", "sgemm", "copy",   "records"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        cr_assert_not_null(json_object_get(doc, keys[i]), "missing top-level key %s", keys[i]);
    json_t *machine = json_object_get(doc, "machine");
    cr_assert(json_is_string(json_object_get(machine, "blas_core")), "machine.blas_core missing");
    cr_assert_eq(json_integer_value(json_object_get(machine, "threads")), 1);
    /* smoke.json: 6 variants x 2 lengths parallel, and 4 variants with a step
     * (stateful-softmax, linear, linear-taylor, polynomial) x 2 contexts recurrent. */
    json_t *recs = json_object_get(doc, "records");
    cr_assert_eq(json_array_size(recs), 6 * 2 + 4 * 2);
    size_t i;
    json_t *r;
    int parallel = 0, recurrent = 0;
    /* The copy bandwidth (64 MiB by default, read + write bytes per second) and the
     * memory floor of each point: its minimal bytes (q, k, v, dout read; out, dq, dk, dv
     * written: 8 tensors of B H N 8 floats for fwd+bwd) at that rate. */
    const double gbps = json_number_value(json_object_get(json_object_get(doc, "copy"), "gbps"));
    cr_assert(gbps > 0 && isfinite(gbps), "copy.gbps = %g", gbps);
    json_array_foreach(recs, i, r) {
        const char *kind = json_string_value(json_object_get(r, "kind"));
        cr_assert_str_eq(json_string_value(json_object_get(r, "status")), "ok", "record %zu not ok", i);
        if (strcmp(kind, "parallel") == 0) {
            parallel++;
            json_t *fb = json_object_get(r, "fwd_bwd_ms");
            double med = json_number_value(json_object_get(fb, "median"));
            {
                const double bhn = (double)json_integer_value(json_object_get(r, "batch")) * 2 *
                                   (double)json_integer_value(json_object_get(r, "len"));
                const double floor_ms = 8.0 * bhn * 8 * 4 / (gbps * 1e9) * 1e3;
                const double got = json_number_value(json_object_get(r, "floor_fwd_bwd_ms"));
                cr_assert(fabs(got - floor_ms) <= 1e-6 * floor_ms, "record %zu: floor %g ms, want %g", i, got, floor_ms);
                cr_assert(fabs(json_number_value(json_object_get(r, "fwd_bwd_over_floor")) - med / floor_ms) <=
                              1e-6 * med / floor_ms,
                          "record %zu: fwd_bwd_over_floor", i);
            }
            double p20 = json_number_value(json_object_get(fb, "p20"));
            double p80 = json_number_value(json_object_get(fb, "p80"));
            cr_assert(med > 0 && p20 <= med && med <= p80, "record %zu: quantiles out of order", i);
            long long n = json_integer_value(json_object_get(r, "len"));
            long long b = json_integer_value(json_object_get(r, "batch"));
            cr_assert_eq(b * n, 256, "batch rule 'scaled' with tokens 256 broken at record %zu", i);
            /* Peak memory covers at least the eight [B,H,N,8] float tensors of the call. */
            double peak = json_number_value(json_object_get(r, "peak_bytes"));
            cr_assert(peak >= 8.0 * b * 2 * n * 8 * 4, "record %zu: peak_bytes %g too small", i, peak);
            cr_assert(json_is_object(json_object_get(r, "options")));
        } else {
            recurrent++;
            cr_assert(json_number_value(json_object_get(r, "per_position_ms")) > 0);
            cr_assert(json_number_value(json_object_get(r, "floor_step_ms")) > 0, "record %zu: no step floor", i);
            cr_assert(json_integer_value(json_object_get(r, "state_bytes")) > 0);
        }
    }
    cr_assert_eq(parallel, 12);
    cr_assert_eq(recurrent, 8);
    /* The growth summary: one fitted exponent per variant (two ok lengths each). */
    json_t *summary = json_object_get(doc, "summary");
    cr_assert_eq(json_object_size(summary), 6);
    json_t *lin = json_object_get(summary, "linear");
    cr_assert(json_is_number(json_object_get(lin, "fwd_bwd_time_exponent")), "no exponent for linear");
    cr_assert_eq(json_integer_value(json_object_get(lin, "points")), 2);
    json_decref(doc);
    /* The TSV beside it: header + one line per record. */
    FILE *f = fopen(DIR "/smoke.tsv", "r");
    cr_assert_not_null(f, "no TSV beside the JSON");
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    cr_assert_eq(count_lines(buf), 1 + 20);
    cr_assert(strncmp(buf, "kind\tvariant\tlen", 16) == 0, "TSV header: %.40s", buf);
}

/* Item 10 of the GPU issue: on a machine without gnuplot nothing measured is lost. bench
 * draws nothing: its document is complete. plot, whose only job is the figure, exits 1
 * with one line naming what was not drawn, and keeps the .plot.tsv it wrote first;
 * a gnuplot that writes half a figure and fails leaves the figure already there as it
 * was (drawn to a temporary name, renamed only on success) and no temporary file. */
Test(bench, without_gnuplot_nothing_measured_is_lost) {
    char env[1200];
    tp_env_without_gnuplot(env, sizeof env, DIR, false);
    int rc = run_exe(env, ATTNBENCH_EXE, "bench", SMOKE, "--quiet", "--set", "recurrent.contexts=[]", "--out",
                     DIR "/nognu.json", NULL);
    cr_assert_eq(rc, 0, "bench without gnuplot: exit status %d: %s", rc, g_err);
    cr_expect_eq(count_lines(g_err), 0, "bench wrote to stderr: %s", g_err);
    json_t *doc = json_load_file(DIR "/nognu.json", 0, NULL);
    cr_assert_not_null(doc);
    cr_expect_str_eq(json_string_value(json_object_get(doc, "status")), "ok");
    cr_expect_eq(json_array_size(json_object_get(doc, "records")), 12, "6 variants x 2 lengths");
    json_decref(doc);
    char *tsv = tp_slurp(DIR "/nognu.tsv", NULL);
    cr_expect_eq(count_lines(tsv), 1 + 12);
    free(tsv);

    remove(DIR "/nognu.png");
    remove(DIR "/nognu.svg");
    remove(DIR "/nognu.plot.tsv");
    rc = run_exe(env, ATTNBENCH_EXE, "plot", DIR "/nognu.json", NULL);
    cr_expect_eq(rc, 1, "plot without gnuplot: exit status %d: %s", rc, g_err);
    cr_expect(strncmp(g_err, "attnbench: error: plot: ", 24) == 0 && count_lines(g_err) == 1 &&
                  strstr(g_err, "nognu.png not drawn: gnuplot could not be started") &&
                  strstr(g_err, "nognu.plot.tsv"),
              "plot without gnuplot: %s", g_err);
    tsv = tp_slurp(DIR "/nognu.plot.tsv", NULL);
    cr_expect_eq(count_lines(tsv), 1 + 12, "the figure's data: header and 12 parallel points");
    free(tsv);
    cr_expect_not(tp_exists(DIR "/nognu.png") || tp_exists(DIR "/nognu.svg"));

    const char *old = "the figure of an earlier run";
    tp_write_bytes(DIR "/nognu.png", old, strlen(old));
    tp_env_without_gnuplot(env, sizeof env, DIR, true);
    rc = run_exe(env, ATTNBENCH_EXE, "plot", DIR "/nognu.json", NULL);
    cr_expect_eq(rc, 1, "plot with a failing gnuplot: exit status %d: %s", rc, g_err);
    cr_expect(count_lines(g_err) == 1 && strstr(g_err, "exited with status 1"), "%s", g_err);
    char *png = tp_slurp(DIR "/nognu.png", NULL);
    cr_expect_str_eq(png, old, "a failed drawing replaced the figure already there");
    free(png);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "ls %s | grep -q '^nognu[.]tmp[.]'", DIR);
    cr_expect_neq(system(tmp), 0, "a temporary figure was left in %s", DIR);
}

Test(bench, memory_limit_gives_oom_then_skipped) {
    /* 1e-4 GiB = 107 kB: the first length fits nothing, so every point is oom or skipped. */
    int rc = run("bench", SMOKE, "--quiet", "--set", "memory_limit_gib=0.0001", "--set", "recurrent.contexts=[]",
                 "--out", DIR "/oom.json", NULL);
    cr_assert_eq(rc, 0, "bench failed: %s", g_err);
    json_t *doc = json_load_file(DIR "/oom.json", 0, NULL);
    cr_assert_not_null(doc);
    json_t *recs = json_object_get(doc, "records");
    cr_assert_eq(json_array_size(recs), 12);
    for (size_t i = 0; i < 12; i++) {
        json_t *r = json_array_get(recs, i);
        const char *st = json_string_value(json_object_get(r, "status"));
        cr_assert_str_eq(st, i % 2 == 0 ? "oom" : "skipped", "record %zu", i);
        cr_assert(json_is_null(json_object_get(r, "fwd_bwd_ms")), "oom point must carry null timings");
    }
    json_decref(doc);
}

#define KEEP "{\"keep\": true}\n"

/* `attnbench ARG...` with an earlier result at DIR/keep.json (written first): refused
 * with one line "attnbench: error: ..." naming `needle` and exit status 2, and the
 * earlier result untouched. */
#define expect_refused(needle, ...)                                                                                    \
    (tp_write_bytes(DIR "/keep.json", KEEP, strlen(KEEP)), check_refused(run(__VA_ARGS__), #__VA_ARGS__, needle))

static void check_refused(int rc, const char *args, const char *needle) {
    cr_assert(tp_usage_error(rc, g_err, args, TP_ARGV(needle, NULL)), "`%s` was not refused", args);
    char *buf = tp_slurp(DIR "/keep.json", NULL);
    cr_assert_str_eq(buf, KEEP, "an earlier result was overwritten");
    free(buf);
}

static void write_config(const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", DIR, name);
    tp_write_bytes(p, text, strlen(text));
}

Test(bench, bad_configs_refused) {
    expect_refused("does-not-exist.json", "bench", DIR "/does-not-exist.json", "--out", DIR "/keep.json", NULL);
    write_config("malformed.json", "{\"name\": \"x\",\n \"lengths\": [1, 2,\n");
    expect_refused("malformed.json:", "bench", DIR "/malformed.json", "--out", DIR "/keep.json", NULL);
    expect_refused("lenghts", "bench", SMOKE, "--set", "lenghts=[1]", "--out", DIR "/keep.json", NULL);
    expect_refused("nope", "bench", SMOKE, "--set", "variants.0.variant=nope", "--out", DIR "/keep.json", NULL);
    expect_refused("rounds", "bench", SMOKE, "--set", "variants.2.set.rounds=0", "--out", DIR "/keep.json", NULL);
    expect_refused("batch.rule", "bench", SMOKE, "--set", "batch.rule=sometimes", "--out", DIR "/keep.json", NULL);
    expect_refused("heads", "bench", SMOKE, "--set", "heads=0", "--out", DIR "/keep.json", NULL);
    expect_refused("lengths", "bench", SMOKE, "--set", "lengths=many", "--out", DIR "/keep.json", NULL);
    expect_refused("causal", "bench", SMOKE, "--set", "causal=1", "--out", DIR "/keep.json", NULL);
    expect_refused("non-causal only", "bench", SMOKE, "--set", "variants.0.variant=efficient", "--out",
                   DIR "/keep.json", NULL);
    write_config("extra.json", "{\"name\": \"x\", \"variants\": [{\"variant\": \"linear\"}], \"lengths\": [8], "
                               "\"heads\": 1, \"qk_dim\": 2, \"v_dim\": 2, \"causal\": true, "
                               "\"batch\": {\"rule\": \"fixed\", \"size\": 1}, \"colour\": \"red\"}");
    expect_refused("colour", "bench", DIR "/extra.json", "--out", DIR "/keep.json", NULL);
    expect_refused("copy.mib", "bench", SMOKE, "--set", "copy.mib=-1", "--out", DIR "/keep.json", NULL);
    expect_refused("copy", "bench", SMOKE, "--set", "copy.bytes=5", "--out", DIR "/keep.json", NULL);
    expect_refused("CONFIG", "bench", NULL);
    expect_refused("not an attnbench run document", "plot", DIR "/keep.json", NULL);
}

/* A committed sweep config shrunk to seconds (tiny shapes, one repeat): every variant
 * in it runs, each record ok, `variants` of them in the parallel mode at two lengths.
 * Returns the run document (json_decref it). */
static json_t *run_shrunk(const char *file, bool recurrent, int variants) {
    char path[512];
    snprintf(path, sizeof path, "%s/experiments/sweep/%s", ATTNBENCH_SOURCE_DIR, file);
    const char *args[40] = {"bench", path, "--quiet", "--out", DIR "/shrunk.json", "--set", "lengths=[16,32]",
                            "--set", "batch={\"rule\": \"fixed\", \"size\": 2}", "--set", "heads=1", "--set", "qk_dim=4", "--set",
                            "v_dim=4", "--set", "repeats=1", "--set", "warmup=0", "--set", "gemm.size=16"};
    int n = 0;
    while (args[n]) n++;
    if (recurrent) {
        args[n++] = "--set";
        args[n++] = "recurrent.contexts=[8]";
        args[n++] = "--set";
        args[n++] = "recurrent.steps=2";
    }
    args[n] = NULL;
    int rc = tp_run(DIR, ATTNBENCH_EXE, NULL, args, NULL, &g_err);
    cr_assert_eq(rc, 0, "%s: %s", file, g_err);
    json_t *doc = json_load_file(DIR "/shrunk.json", 0, NULL);
    cr_assert_not_null(doc);
    json_t *recs = json_object_get(doc, "records"), *r;
    size_t i;
    int parallel = 0;
    json_array_foreach(recs, i, r) {
        const char *st = json_string_value(json_object_get(r, "status"));
        cr_assert_str_eq(st, "ok", "%s record %zu (%s): %s", file, i, json_string_value(json_object_get(r, "variant")),
                         json_string_value(json_object_get(r, "reason")));
        parallel += strcmp(json_string_value(json_object_get(r, "kind")), "parallel") == 0;
    }
    cr_assert_eq(parallel, 2 * variants, "%s: %d parallel records", file, parallel);
    return doc;
}

/* The committed Figure 1 configs: every variant in them runs (the new ones too: favor,
 * local, efficient in the non-causal ones). */
Test(bench, figure1_configs_run_shrunk) {
    static const struct {
        const char *file;
        bool recurrent;
        int variants;
    } configs[] = {{"figure1-cpu.json", true, 8}, /* stateful-softmax: recurrent only */
                   {"figure1-gpu.json", true, 9},
                   {"figure1-noncausal-cpu.json", false, 9},
                   {"figure1-noncausal-gpu.json", false, 10}};
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        json_t *doc = run_shrunk(configs[c].file, configs[c].recurrent, configs[c].variants);
        json_t *sum = json_object_get(doc, "summary");
        for (const char *const *v = (const char *const[]){"favor", "local", NULL}; *v; v++)
            cr_assert_not_null(json_object_get(sum, *v), "%s: no %s", configs[c].file, *v);
        if (!configs[c].recurrent) cr_assert_not_null(json_object_get(sum, "efficient"), "%s", configs[c].file);
        json_decref(doc);
    }
}

/* The linear-RNN family's and sparse's sweeps (issue 25's speed targets): gla and
 * deltanet get their inputs bound by the sweep, in the parallel and recurrent modes. */
Test(bench, rnn_family_configs_run_shrunk) {
    json_decref(run_shrunk("rnn-family-cpu.json", true, 5));
    json_decref(run_shrunk("rnn-family-noncausal-cpu.json", false, 3));
    json_decref(run_shrunk("rnn-family-sparse.json", false, 7));
    json_decref(run_shrunk("rnn-family-sparse-noncausal.json", false, 7));
}

Test(bench, plot_draws_png_and_svg) {
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) cr_skip("gnuplot is not installed");
    int rc = run("bench", SMOKE, "--quiet", "--set", "recurrent.contexts=[]", "--out", DIR "/plotme.json", NULL);
    cr_assert_eq(rc, 0, "bench failed: %s", g_err);
    rc = run("plot", DIR "/plotme.json", NULL);
    cr_assert_eq(rc, 0, "plot failed: %s", g_err);
    struct stat st;
    cr_assert_eq(stat(DIR "/plotme.png", &st), 0, "no PNG");
    cr_assert_gt(st.st_size, 1000);
    cr_assert_eq(stat(DIR "/plotme.svg", &st), 0, "no SVG");
    FILE *f = fopen(DIR "/plotme.svg", "r");
    char head[64] = {0};
    fread(head, 1, sizeof head - 1, f);
    fclose(f);
    cr_assert(strstr(head, "<?xml") || strstr(head, "<svg"), "SVG is not SVG: %s", head);
}

/* ---- --device cuda ---- */

Test(bench, cuda_without_device_refused) {
    /* The real binary on a machine (or build) without CUDA: one line, exit status 2,
     * before any work. With a device the sweep would run: nothing to check here. */
    if (ab_cuda_init() == 0) cr_skip_test("this machine has a CUDA device");
    int rc = run("bench", SMOKE, "--device", "cuda", "--quiet", "--out", DIR "/nodev.json", NULL);
    cr_assert(tp_usage_error(rc, g_err, "bench --device cuda", TP_ARGV("CUDA", NULL)), "stderr: %s", g_err);
    struct stat st;
    cr_assert_neq(stat(DIR "/nodev.json", &st), 0, "a refused run wrote a result");
}

Test(bench, cuda_emulated_sweep_records_oom_and_skipped) {
    /* The emulated binary, with an emulated device of 400 kB: softmax and
     * stateful-softmax fit at both lengths (their fused kernels keep O and the rows'
     * log-sum-exps, 4 x 128 x 9 floats at N = 128, where the N x N probabilities would be
     * 256 kB); linear and linear-taylor too (their fused kernels keep a few segment
     * states and two floats per position: 76 kB of workspace at N = 16); polynomial
     * needs 925 kB of workspace already at N = 16 (a state and an R record of 2.5 k
     * floats per slice, 32 slices), and lsh-4 about 720 kB (the chunk blocks of all
     * 32 x 4 (slice, round) pairs at once): oom there (a real allocation failure: the
     * config's memory_limit_gib of 1 lets it try, and the sweep goes on), and their
     * N = 128 points are skipped after it. The recurrent states (C x (M+1) per slice, or the key/value
     * cache) fit. The document names the device. */
    int rc = run_exe("AB_EMU_DEVICE_MEMORY=400K", ATTNBENCH_EMU_EXE, "bench", SMOKE, "--device", "cuda", "--quiet",
                     "--set", "lengths=[16,128]", "--set", "gemm.size=16", "--out", DIR "/cuda.json", NULL);
    cr_assert_eq(rc, 0, "bench failed: %s", g_err);
    json_t *doc = json_load_file(DIR "/cuda.json", 0, NULL);
    cr_assert_not_null(doc);
    cr_assert_str_eq(json_string_value(json_object_get(doc, "status")), "ok");
    json_t *gpu = json_object_get(json_object_get(doc, "machine"), "gpu");
    cr_assert(json_is_object(gpu), "machine.gpu missing");
    cr_assert(json_is_true(json_object_get(gpu, "emulated")));
    cr_assert(strstr(json_string_value(json_object_get(gpu, "name")), "emulator") != NULL);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "config"), "device")), "cuda");
    json_t *recs = json_object_get(doc, "records");
    cr_assert_eq(json_array_size(recs), 6 * 2 + 4 * 2);
    int ok = 0, oom = 0, skipped = 0;
    size_t i;
    json_t *r;
    json_array_foreach(recs, i, r) {
        const char *v = json_string_value(json_object_get(r, "variant_name"));
        const char *kind = json_string_value(json_object_get(r, "kind"));
        const char *st = json_string_value(json_object_get(r, "status"));
        const char *reason = json_string_value(json_object_get(r, "reason"));
        bool small_oom = strcmp(v, "polynomial") == 0 || strcmp(v, "lsh") == 0; /* oom already at N = 16 */
        bool parallel = strcmp(kind, "parallel") == 0;
        long long len = json_integer_value(json_object_get(r, "len"));
        if (parallel && small_oom && len == 128) {
            cr_assert_str_eq(st, "skipped", "record %zu (%s N=128)", i, v);
            cr_assert(reason && strstr(reason, "smaller length"), "record %zu reason: %s", i, reason);
            skipped++;
        } else if (parallel && small_oom) {
            cr_assert_str_eq(st, "oom", "record %zu (%s N=%lld)", i, v, len);
            cr_assert(reason && strstr(reason, "out of device memory"), "record %zu reason: %s", i, reason);
            oom++;
        } else {
            cr_assert_str_eq(st, "ok", "record %zu (%s %s): %s", i, v, kind, reason ? reason : "");
            if (strcmp(kind, "parallel") == 0) {
                /* tracked device memory: at least the eight [16, 2, 16, 8] float tensors */
                double peak = json_number_value(json_object_get(r, "peak_bytes"));
                cr_assert(peak >= 8.0 * 16 * 2 * 16 * 8 * 4, "record %zu: peak_bytes %g", i, peak);
                cr_assert(json_integer_value(json_object_get(r, "device_used_bytes")) > 0);
            }
            ok++;
        }
    }
    cr_assert_eq(oom, 2);                /* polynomial, lsh at 16 */
    cr_assert_eq(ok, 4 + 4 + 4 * 2);     /* softmax, stateful-softmax, linear x2 at 16 and 128; 4 recurrent x 2 */
    cr_assert_eq(skipped, 2);            /* polynomial, lsh at 128 */
    json_decref(doc);
}

/* The emulated binary counts memory traffic where the build has the traffic library
 * (tests/cuda_emu/cuda_emu.h, "Memory traffic"; a sanitized build has none): every ok
 * point of a --device cuda sweep holds the counts of one forward+backward, or one step
 * at the context's position, beside the op's minimal bytes, which a correct kernel
 * cannot move less of (it reads every input and writes every output); the machine
 * section says whether traffic was counted, and stdout has the table. */
Test(bench, cuda_emulated_sweep_reports_traffic) {
    char *out = NULL;
    int rc = tp_run(DIR, ATTNBENCH_EMU_EXE, NULL,
                    TP_ARGV("--threads", "1", "bench", SMOKE, "--device", "cuda", "--set", "lengths=[32]", "--set",
                            "gemm.size=16", "--out", DIR "/traffic.json", NULL),
                    &out, &g_err);
    cr_assert_eq(rc, 0, "bench failed: %s", g_err);
    json_t *doc = json_load_file(DIR "/traffic.json", 0, NULL);
    cr_assert_not_null(doc);
    json_t *counted = json_object_get(json_object_get(json_object_get(doc, "machine"), "gpu"), "traffic_counted");
    cr_assert(json_is_boolean(counted), "machine.gpu.traffic_counted missing");
    cr_assert_eq(json_is_true(counted), TEST_TRAFFIC_EXPECTED != 0,
                 "traffic counted: %d, the build's traffic library: %d", json_is_true(counted), TEST_TRAFFIC_EXPECTED);
    size_t i;
    json_t *r;
    int with = 0;
    json_array_foreach(json_object_get(doc, "records"), i, r) {
        json_t *t = json_object_get(r, "traffic");
        if (!json_is_true(counted)) {
            cr_assert_null(t, "record %zu has traffic, but none was counted", i);
            continue;
        }
        cr_assert_str_eq(json_string_value(json_object_get(r, "status")), "ok");
        cr_assert(json_is_object(t), "record %zu: no traffic", i);
        const bool rec = strcmp(json_string_value(json_object_get(r, "kind")), "recurrent") == 0;
        cr_assert_str_eq(json_string_value(json_object_get(t, "what")), rec ? "step" : "forward+backward");
        if (rec)
            cr_assert_eq(json_integer_value(json_object_get(t, "position")),
                         json_integer_value(json_object_get(r, "context")));
        cr_assert_gt(json_integer_value(json_object_get(t, "launches")), 0, "record %zu", i);
        const double dram = (double)json_integer_value(json_object_get(t, "dram_read_bytes")) +
                            (double)json_integer_value(json_object_get(t, "dram_write_bytes"));
        const double min = (double)json_integer_value(json_object_get(t, "min_read_bytes")) +
                           (double)json_integer_value(json_object_get(t, "min_write_bytes"));
        cr_assert_geq(dram, min, "record %zu (%s): DRAM bytes %.0f below the minimal %.0f", i,
                      json_string_value(json_object_get(r, "variant")), dram, min);
        cr_assert_float_eq(json_number_value(json_object_get(t, "dram_over_min")), dram / min, 1e-6 * dram / min);
        /* the operations by name add up to the totals */
        json_t *e;
        size_t j;
        json_int_t launches = 0, dr = 0;
        json_array_foreach(json_object_get(t, "by_name"), j, e) {
            launches += json_integer_value(json_object_get(e, "launches"));
            dr += json_integer_value(json_object_get(e, "dram_read_bytes"));
        }
        cr_assert_eq(launches, json_integer_value(json_object_get(t, "launches")), "record %zu", i);
        cr_assert_eq(dr, json_integer_value(json_object_get(t, "dram_read_bytes")), "record %zu", i);
        with++;
    }
    if (json_is_true(counted)) {
        cr_assert_eq(with, 6 + 4 * 2, "%d records with traffic: want the 6 variants at N = 32 and the 4 recurrent "
                     "ones at 2 contexts", with);
        cr_assert(strstr(out, "memory traffic of one forward+backward") && strstr(out, "dram/min"), "stdout: %s", out);
    }
    free(out);
    json_decref(doc);
}

Test(bench, cuda_emulated_no_device_refused) {
    int rc = run_exe("AB_EMU_NO_DEVICE=1", ATTNBENCH_EMU_EXE, "bench", SMOKE, "--device", "cuda", "--quiet", "--out",
                     DIR "/nodev2.json", NULL);
    cr_assert(tp_usage_error(rc, g_err, "emulated, no device", TP_ARGV("no CUDA device", NULL)), "stderr: %s", g_err);
}

/* ---- issue 16 ---- */

/* Found by the fuzz target tests/fuzz/fuzz_bench_config.c: a config refused after a
 * variant with settings had been parsed left that variant's settings allocated, and
 * the count of variants set, for a caller that frees only what a success returns (the
 * leak LeakSanitizer reported). Now nothing is left: the count is 0 after any failure,
 * and the sanitized suite's leak check (harness/scripts/sanitize.sh) sees every string
 * freed. */
Test(bench, refused_config_leaves_nothing_to_free) {
    static const char *const configs[] = {
        /* the second variant's option is refused */
        "{\"name\": \"x\", \"variants\": [{\"variant\": \"linear\", \"set\": {\"eps\": 1e-4, \"chunk\": 8}},"
        " {\"variant\": \"linear\", \"set\": {\"feature_map\": \"nope\"}}], \"lengths\": [8], \"heads\": 1,"
        " \"qk_dim\": 4, \"v_dim\": 4, \"causal\": true, \"batch\": {\"rule\": \"fixed\", \"size\": 1}}",
        /* every variant fine, a later key refused */
        "{\"name\": \"x\", \"variants\": [{\"variant\": \"lsh\", \"set\": {\"rounds\": 2}}], \"lengths\": [8],"
        " \"heads\": 0, \"qk_dim\": 4, \"v_dim\": 4, \"causal\": true, \"batch\": {\"rule\": \"fixed\"}}",
        /* an unknown key at the top, before anything is parsed */
        "{\"name\": \"x\", \"bogus\": 1}",
    };
    for (size_t i = 0; i < sizeof configs / sizeof *configs; i++) {
        json_error_t je;
        json_t *root = json_loads(configs[i], 0, &je);
        cr_assert_not_null(root, "config %zu: %s", i, je.text);
        sweep_config c;
        memset(&c, 0x5a, sizeof c); /* what the caller's variable held before */
        cr_expect_eq(sweep_config_parse(root, AB_DEV_CPU, &c), AB_EINVAL, "config %zu accepted", i);
        cr_expect_eq(c.n_variants, 0, "config %zu: %d variants left after the failure", i, c.n_variants);
        sweep_config_free(&c); /* harmless */
        json_decref(root);
    }
}

/* Defects 6 and 7, and labels: `"name": "../../x"` wrote outside results/ (the name
 * makes results/NAME.json); `--set .=1` and `--set ..=1` were silently ignored (the
 * sweep then ran, replacing the result); a label with a newline broke the TSV. Each is
 * refused with one line, status 2, the earlier result untouched, and nothing written
 * where the name pointed. */
Test(bench, bad_names_and_empty_keys_refused) {
    char cwd[4096];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    char outside[4200];
    snprintf(outside, sizeof outside, "%s/../h16-outside.json", cwd); /* results/../../h16-outside.json */
    bool there = tp_exists(outside);
    /* not expect_refused, whose assertion would end the test before the cleanup */
    int rc = run("bench", SMOKE, "--set", "name=../../h16-outside", "--quiet", NULL);
    tp_usage_error(rc, g_err, "name=../../h16-outside", TP_ARGV("'name' = '../../h16-outside'", NULL));
    bool made = !there && tp_exists(outside);
    if (made) { /* left by the bug: not kept */
        remove(outside);
        snprintf(outside, sizeof outside, "%s/../h16-outside.tsv", cwd);
        remove(outside);
    }
    cr_expect_not(made, "a config's name wrote outside results/");
    expect_refused("must be a non-empty file name", "bench", SMOKE, "--set", "name=a/b", "--out", DIR "/keep.json",
                   NULL);
    expect_refused("must be a non-empty file name", "bench", SMOKE, "--set", "name=..", "--out", DIR "/keep.json",
                   NULL);
    expect_refused("must be a non-empty file name", "bench", SMOKE, "--set", "name=", "--out", DIR "/keep.json", NULL);
    expect_refused("--set .", "bench", SMOKE, "--set", ".=1", "--out", DIR "/keep.json", "--quiet", NULL);
    expect_refused("--set ..", "bench", SMOKE, "--set", "..=1", "--out", DIR "/keep.json", "--quiet", NULL);
    expect_refused("empty key", "bench", SMOKE, "--set", "batch..rule=fixed", "--out", DIR "/keep.json", "--quiet",
                   NULL);
    expect_refused("'variants.2.label' must not hold control characters", "bench", SMOKE, "--set",
                   "variants.2.label=two\nlines", "--out", DIR "/keep.json", "--quiet", NULL);
}

/* Runs `attnbench --threads 1 ARG...` under `ulimit -v KB` (so that a size the config
 * should refuse cannot make a run allocate gigabytes if it is accepted after all). */
static int run_limited(long kb, const char *const *args) {
    char lim[32];
    snprintf(lim, sizeof lim, "%ld", kb);
    const char *full[64] = {"-c", TP_ULIMIT_SCRIPT, "sh", lim, ATTNBENCH_EXE, "--threads", "1"};
    int n = 7;
    for (int i = 0; args[i]; i++) full[n++] = args[i];
    full[n] = NULL;
    return tp_wait_for(DIR, tp_spawn(DIR, "/bin/sh", NULL, full), 120, NULL, &g_err);
}

/* Defect 5: the sgemm measurement ran `repeats` products whatever they cost (the
 * config allowed 32768^3 x 1000). The size is capped at 16384, and the repeats stop
 * once time_budget_s is used: 1000 products of 1536^3 (40 s and more on one core) end
 * after about half a second, the record saying how many were timed. */
Test(bench, sgemm_measurement_bounded_in_size_and_time) {
    int rc = run_limited(2000000, TP_ARGV("bench", SMOKE, "--quiet", "--set", "gemm.size=32768", "--out",
                                          DIR "/big.json", NULL));
    tp_usage_error(rc, g_err, "gemm.size=32768", TP_ARGV("'gemm.size' = 32768 is outside [0, 16384]", NULL));
    cr_expect_not(tp_exists(DIR "/big.json"), "a refused run wrote a result");

    double t0 = tp_now_s();
    rc = run("bench", SMOKE, "--quiet", "--set", "gemm.size=1536", "--set", "gemm.repeats=1000", "--set",
             "time_budget_s=0.5", "--set", "lengths=[16]", "--set", "recurrent.contexts=[]", "--out",
             DIR "/budget.json", NULL);
    double took = tp_now_s() - t0;
    cr_assert_eq(rc, 0, "bench failed: %s", g_err);
    cr_expect_lt(took, 15.0, "the sgemm measurement took %.1f s with a 0.5 s budget", took);
    json_t *doc = json_load_file(DIR "/budget.json", 0, NULL);
    cr_assert_not_null(doc);
    json_t *g = json_object_get(doc, "sgemm");
    long long reps = json_integer_value(json_object_get(g, "repeats"));
    cr_expect(json_is_integer(json_object_get(g, "repeats")) && reps >= 1 && reps < 1000,
              "sgemm.repeats = %lld: not cut by the budget", reps);
    cr_expect_gt(json_number_value(json_object_get(g, "gflops")), 0.0);
    json_decref(doc);
}

/* Whether process `pid` has a handler installed for signal `sig` (Linux: SigCgt). */
static bool catches(pid_t pid, int sig) {
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f) return false;
    unsigned long long mask = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "SigCgt:", 7) == 0) mask = strtoull(line + 7, NULL, 16);
    fclose(f);
    return (mask >> (sig - 1)) & 1u;
}

/* CPU seconds process `pid` has used (Linux: /proc/PID/stat utime + stime), or -1. */
static double cpu_seconds(pid_t pid) {
    char p[64], buf[1024];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *c = strrchr(buf, ')'); /* after the command name: state is field 3 */
    unsigned long long ut = 0, st = 0;
    if (!c || sscanf(c + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Defect 5: Ctrl-C and SIGTERM were only seen between two products: one 8192^3
 * product is 1.1 TFLOP (seconds to a minute of a core). The matrices are now filled in
 * chunks and the product runs in panels, the flag checked between them: the signal
 * ends the measurement within about a second, the run written with status
 * "interrupted", exit status 130. The signal is sent once the run has used 6 CPU
 * seconds (filling the two matrices with normal numbers takes 3.5 here, a product
 * 6.5), so that it lands inside the first product however busy the machine is. */
Test(bench, sigterm_during_the_sgemm_measurement_stops_promptly) {
    if (cpu_seconds(getpid()) < 0) cr_skip_test("needs /proc to follow the run");
    pid_t pid = tp_spawn(DIR, ATTNBENCH_EXE, NULL,
                         TP_ARGV("--threads", "1", "bench", SMOKE, "--quiet", "--set", "gemm.size=8192", "--set",
                                 "gemm.repeats=1000", "--set", "time_budget_s=600", "--out", DIR "/term.json", NULL));
    double t0 = tp_now_s();
    while (!catches(pid, SIGTERM) && tp_now_s() - t0 < 30) usleep(10000);
    cr_assert(catches(pid, SIGTERM), "bench installed no SIGTERM handler");
    while (cpu_seconds(pid) < 6.0 && tp_now_s() - t0 < 120) usleep(20000);
    cr_assert_eq(kill(pid, SIGTERM), 0);
    double t1 = tp_now_s();
    int rc = tp_wait_for(DIR, pid, 120, NULL, &g_err);
    double took = tp_now_s() - t1;
    cr_expect_eq(rc, 130, "exit status %d: %s", rc, g_err);
    /* The bound: about a second between two looks at the flag, plus writing the run
     * document, with room for a busy machine; a sanitized build's instrumented fill
     * (the chunks between two looks) runs about twice as slow (measured: 0.6-0.8 s
     * against 1.1-1.4 s from the signal to the exit). */
    const double bound = TEST_SANITIZED ? 5.0 : 2.5;
    cr_expect_lt(took, bound, "bench ended %.1f s after SIGTERM", took);
    json_t *doc = json_load_file(DIR "/term.json", 0, NULL);
    cr_assert_not_null(doc, "no run document after the interruption");
    cr_expect_str_eq(json_string_value(json_object_get(doc, "status")), "interrupted");
    json_decref(doc);
}
