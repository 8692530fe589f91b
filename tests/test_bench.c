/* attnbench bench and plot, end to end: a seconds-long sweep (experiments/sweep/
 * smoke.json) writes a complete run document and TSV; bad configs are refused with
 * one line and exit status 2, and leave an earlier result untouched; --device cuda on
 * the emulated binary records oom and skipped points and goes on. */
#include "cuda_device.h"
#include "error.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SMOKE ATTNBENCH_SOURCE_DIR "/experiments/sweep/smoke.json"
#define DIR TEST_DATA_DIR "/bench-test"

/* Runs `ENV EXE ARGS` through the shell with stderr captured; returns the exit status. */
static int run_exe(const char *env, const char *exe, const char *args, char *err, size_t cap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s --threads 1 %s 2>%s/stderr.txt >/dev/null", env, exe, args, DIR);
    int st = system(cmd);
    if (err) {
        err[0] = '\0';
        char p[512];
        snprintf(p, sizeof p, "%s/stderr.txt", DIR);
        FILE *f = fopen(p, "r");
        if (f) {
            size_t n = fread(err, 1, cap - 1, f);
            err[n] = '\0';
            fclose(f);
        }
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs `attnbench ARGS`. */
static int run(const char *args, char *err, size_t cap) { return run_exe("", ATTNBENCH_EXE, args, err, cap); }

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void setup(void) {
    mkdir(TEST_DATA_DIR, 0777);
    mkdir(DIR, 0777);
}

TestSuite(bench, .init = setup);

Test(bench, smoke_sweep_writes_complete_document) {
    char err[8192];
    int rc = run("bench " SMOKE " --quiet --out " DIR "/smoke.json", err, sizeof err);
    cr_assert_eq(rc, 0, "bench failed: %s", err);
    json_error_t je;
    json_t *doc = json_load_file(DIR "/smoke.json", 0, &je);
    cr_assert_not_null(doc, "result is not JSON: %s", je.text);
    cr_assert_str_eq(json_string_value(json_object_get(doc, "schema")), "attnbench/run/1");
    cr_assert_str_eq(json_string_value(json_object_get(doc, "status")), "ok");
    const char *keys[] = {"command", "config", "seed", "machine", "git", "started", "finished", "sgemm", "records"};
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
    json_array_foreach(recs, i, r) {
        const char *kind = json_string_value(json_object_get(r, "kind"));
        cr_assert_str_eq(json_string_value(json_object_get(r, "status")), "ok", "record %zu not ok", i);
        if (strcmp(kind, "parallel") == 0) {
            parallel++;
            json_t *fb = json_object_get(r, "fwd_bwd_ms");
            double med = json_number_value(json_object_get(fb, "median"));
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

Test(bench, memory_limit_gives_oom_then_skipped) {
    char err[8192];
    /* 1e-4 GiB = 107 kB: the first length fits nothing, so every point is oom or skipped. */
    int rc = run("bench " SMOKE " --quiet --set memory_limit_gib=0.0001 --set 'recurrent.contexts=[]' --out " DIR
                 "/oom.json",
                 err, sizeof err);
    cr_assert_eq(rc, 0, "bench failed: %s", err);
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

static void expect_refused(const char *args, const char *needle) {
    /* An earlier result at the same path must survive a refused run. */
    FILE *f = fopen(DIR "/keep.json", "w");
    fputs("{\"keep\": true}\n", f);
    fclose(f);
    char err[8192];
    int rc = run(args, err, sizeof err);
    cr_assert_eq(rc, 2, "`%s` exited %d, want 2; stderr: %s", args, rc, err);
    cr_assert_eq(count_lines(err), 1, "want one line on stderr, got: %s", err);
    cr_assert(strstr(err, "attnbench: error:") == err, "stderr: %s", err);
    cr_assert(strstr(err, needle), "stderr should name '%s': %s", needle, err);
    f = fopen(DIR "/keep.json", "r");
    char buf[64] = {0};
    fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    cr_assert_str_eq(buf, "{\"keep\": true}\n", "an earlier result was overwritten");
}

static void write_config(const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", DIR, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

Test(bench, bad_configs_refused) {
    expect_refused("bench " DIR "/does-not-exist.json --out " DIR "/keep.json", "does-not-exist.json");
    write_config("malformed.json", "{\"name\": \"x\",\n \"lengths\": [1, 2,\n");
    expect_refused("bench " DIR "/malformed.json --out " DIR "/keep.json", "malformed.json:");
    expect_refused("bench " SMOKE " --set lenghts=[1] --out " DIR "/keep.json", "lenghts");
    expect_refused("bench " SMOKE " --set variants.0.variant=nope --out " DIR "/keep.json", "nope");
    expect_refused("bench " SMOKE " --set variants.2.set.rounds=0 --out " DIR "/keep.json", "rounds");
    expect_refused("bench " SMOKE " --set batch.rule=sometimes --out " DIR "/keep.json", "batch.rule");
    expect_refused("bench " SMOKE " --set heads=0 --out " DIR "/keep.json", "heads");
    expect_refused("bench " SMOKE " --set lengths=\"many\" --out " DIR "/keep.json", "lengths");
    expect_refused("bench " SMOKE " --set causal=1 --out " DIR "/keep.json", "causal");
    write_config("extra.json", "{\"name\": \"x\", \"variants\": [{\"variant\": \"linear\"}], \"lengths\": [8], "
                               "\"heads\": 1, \"qk_dim\": 2, \"v_dim\": 2, \"causal\": true, "
                               "\"batch\": {\"rule\": \"fixed\", \"size\": 1}, \"colour\": \"red\"}");
    expect_refused("bench " DIR "/extra.json --out " DIR "/keep.json", "colour");
    expect_refused("bench", "CONFIG");
    expect_refused("plot " DIR "/keep.json", "not an attnbench run document");
}

Test(bench, plot_draws_png_and_svg) {
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) cr_skip("gnuplot is not installed");
    char err[8192];
    int rc = run("bench " SMOKE " --quiet --set 'recurrent.contexts=[]' --out " DIR "/plotme.json", err, sizeof err);
    cr_assert_eq(rc, 0, "bench failed: %s", err);
    rc = run("plot " DIR "/plotme.json", err, sizeof err);
    cr_assert_eq(rc, 0, "plot failed: %s", err);
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
    char err[8192];
    int rc = run("bench " SMOKE " --device cuda --quiet --out " DIR "/nodev.json", err, sizeof err);
    cr_assert_eq(rc, 2, "exit status %d: %s", rc, err);
    cr_assert(strncmp(err, "attnbench: error: ", 18) == 0 && count_lines(err) == 1 && strstr(err, "CUDA"),
              "stderr: %s", err);
    struct stat st;
    cr_assert_neq(stat(DIR "/nodev.json", &st), 0, "a refused run wrote a result");
}

Test(bench, cuda_emulated_sweep_records_oom_and_skipped) {
    /* The emulated binary, with an emulated device of 400 kB: softmax fits at N = 16
     * (B = 16) but not at N = 128 (its saved 4 x 128 x 128 probabilities alone are 256 kB
     * plus as much workspace): that point is oom (a real allocation failure: the config's
     * memory_limit_gib of 1 lets it try), the sweep goes on. linear and linear-taylor
     * likewise (at N = 128 their workspace, every chunk of every slice at once, is 374 kB:
     * T x T blocks with T = 64 dominate at D = 8); polynomial (73 features) needs 742 kB
     * of workspace already at N = 16, and lsh-4 about 720 kB (the chunk blocks of all
     * 32 x 4 (slice, round) pairs at once): oom there, and their N = 128 points are
     * skipped after it. The recurrent states (C x (M+1) per slice, or the key/value
     * cache) fit. The document names the device. */
    char err[8192];
    int rc = run_exe("AB_EMU_DEVICE_MEMORY=400K", ATTNBENCH_EMU_EXE,
                     "bench " SMOKE " --device cuda --quiet --set 'lengths=[16,128]' --set gemm.size=16 --out " DIR
                     "/cuda.json",
                     err, sizeof err);
    cr_assert_eq(rc, 0, "bench failed: %s", err);
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
        } else if (parallel && (len == 128 || small_oom)) {
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
    cr_assert_eq(oom, 2 + 2 + 2);        /* softmax, stateful-softmax, linear x2 at 128; polynomial, lsh at 16 */
    cr_assert_eq(ok, 2 + 2 + 4 * 2);     /* softmax, stateful-softmax, linear x2 at 16; 4 recurrent x 2 contexts */
    cr_assert_eq(skipped, 2);            /* polynomial, lsh at 128 */
    json_decref(doc);
}

Test(bench, cuda_emulated_no_device_refused) {
    char err[8192];
    int rc = run_exe("AB_EMU_NO_DEVICE=1", ATTNBENCH_EMU_EXE, "bench " SMOKE " --device cuda --quiet --out " DIR
                     "/nodev2.json", err, sizeof err);
    cr_assert_eq(rc, 2, "exit status %d: %s", rc, err);
    cr_assert(strstr(err, "no CUDA device") && count_lines(err) == 1, "stderr: %s", err);
}
