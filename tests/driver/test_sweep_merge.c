/* A sweep in points, through the binary: `bench --points` lists them, `bench --point I`
 * writes one point's document, `merge` joins them into the whole sweep's document (the
 * unsharded run's records, point for point) and refuses, with one line and exit status
 * 2 and the output left as it was: another config, another machine class, a point
 * twice, missing points (listed), truncated, foreign and unfinished files. A point
 * that ran out of time makes the later lengths of its variant skipped, as a full run. */
#include "test_proc.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CONFIG ATTNBENCH_SOURCE_DIR "/tests/scripts/slurm/sweep.json"
#define DIR TEST_DATA_DIR "/sweep-merge-test"
#define N_POINTS 8

static char *g_out, *g_err;

#define run(...) tp_run(DIR, ATTNBENCH_EXE, NULL, TP_ARGV("--threads", "1", __VA_ARGS__), &g_out, &g_err)

static void setup(void) {
    mkdir(TEST_DATA_DIR, 0777);
    mkdir(DIR, 0777);
}

static void teardown(void) {
    free(g_out);
    free(g_err);
    g_out = g_err = NULL;
}

TestSuite(sweep_merge, .init = setup, .fini = teardown);

/* DIR/pts/sw.point-I.json (a buffer per point: tp_path's ring would be reused) */
static const char *point_doc(int i) {
    static char paths[N_POINTS][512];
    snprintf(paths[i], sizeof paths[i], "%s/pts/sw.point-%d.json", DIR, i);
    return paths[i];
}

/* The 8 point documents in DIR/pts and the unsharded run DIR/full.json, made by this
 * build once per test (a test is a process: the first call starts from nothing). */
static void make_points(void) {
    static bool fresh = false;
    if (!fresh) {
        tp_rm_tree(DIR "/pts");
        remove(DIR "/full.json");
        fresh = true;
    }
    char idx[16];
    for (int i = 0; i < N_POINTS; i++) {
        if (tp_exists(point_doc(i))) continue;
        snprintf(idx, sizeof idx, "%d", i);
        int rc = run("bench", CONFIG, "--quiet", "--point", idx, "--out", DIR "/pts/sw.json", NULL);
        cr_assert_eq(rc, 0, "bench --point %d: %s", i, g_err);
    }
    if (!tp_exists(DIR "/full.json"))
        cr_assert_eq(run("bench", CONFIG, "--quiet", "--out", DIR "/full.json", NULL), 0, "bench: %s", g_err);
}

static json_t *load(const char *path) {
    json_error_t je;
    json_t *d = json_load_file(path, 0, &je);
    cr_assert_not_null(d, "%s: %s", path, je.text);
    return d;
}

static void save(const json_t *d, const char *path) {
    cr_assert_eq(json_dump_file(d, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER), 0, "cannot write %s", path);
}

/* A copy of point i's document at DIR/NAME with `edit` applied to it. */
static const char *edited(int i, const char *name, void (*edit)(json_t *)) {
    json_t *d = load(point_doc(i));
    edit(d);
    static char p[512]; /* until the next call */
    snprintf(p, sizeof p, "%s/%s", DIR, name);
    save(d, p);
    json_decref(d);
    return p;
}

Test(sweep_merge, points_listed_as_tsv_and_json) {
    cr_assert_eq(run("bench", CONFIG, "--points", "--out", DIR "/pts/sw.json", NULL), 0, "%s", g_err);
    int lines = 0;
    for (const char *s = g_out; *s; s++) lines += *s == '\n';
    cr_assert_eq(lines, N_POINTS + 1, "--points: %s", g_out);
    cr_assert(strncmp(g_out, "index\tkind\tvariant\tlen\tdocument\tdone\n", 37) == 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\n4\trecurrent\tlinear\t8\t" DIR "/pts/sw.point-4.json\t"), "%s", g_out);
    cr_assert_eq(run("bench", CONFIG, "--points", "--json", NULL), 0, "%s", g_err);
    json_t *d = json_loads(g_out, 0, NULL);
    cr_assert_not_null(d);
    cr_assert_str_eq(json_string_value(json_object_get(d, "schema")), "attnbench/points/1");
    cr_assert_eq(json_integer_value(json_object_get(d, "count")), N_POINTS);
    cr_assert_str_eq(json_string_value(json_object_get(d, "document")), "results/slurm-test.json");
    json_t *p7 = json_array_get(json_object_get(d, "points"), 7);
    cr_assert_str_eq(json_string_value(json_object_get(p7, "variant")), "lsh-1");
    cr_assert_eq(json_integer_value(json_object_get(p7, "len")), 64);
    cr_assert_str_eq(json_string_value(json_object_get(p7, "document")), "results/slurm-test.point-7.json");
    json_decref(d);
    int rc = run("bench", CONFIG, "--point", "8", "--out", DIR "/x.json", NULL);
    cr_assert(tp_usage_error(rc, g_err, "--point 8", TP_ARGV("points 0..7", NULL)));
    cr_assert_not(tp_exists(DIR "/x.point-8.json"));
    rc = run("bench", CONFIG, "--json", NULL);
    cr_assert(tp_usage_error(rc, g_err, "--json alone", TP_ARGV("--points", NULL)));
    rc = run("bench", CONFIG, "--points", "--point", "1", NULL);
    cr_assert(tp_usage_error(rc, g_err, "both", TP_ARGV("one or the other", NULL)));
}

Test(sweep_merge, merged_document_is_the_full_runs) {
    make_points();
    /* a point's own document: one record, marked */
    json_t *p3 = load(point_doc(3));
    json_t *pts = json_object_get(p3, "points");
    cr_assert_eq(json_integer_value(json_object_get(pts, "count")), N_POINTS);
    cr_assert_eq(json_integer_value(json_array_get(json_object_get(pts, "held"), 0)), 3);
    cr_assert_eq(json_array_size(json_object_get(p3, "records")), 1);
    json_decref(p3);
    /* done, as a resubmission sees it */
    cr_assert_eq(run("bench", CONFIG, "--points", "--out", DIR "/pts/sw.json", NULL), 0, "%s", g_err);
    cr_assert_not_null(strstr(g_out, "\t" DIR "/pts/sw.point-3.json\t1\n"), "%s", g_out);
    const char *args[N_POINTS + 8] = {"--threads", "1", "merge"};
    int n = 3;
    for (int i = N_POINTS - 1; i >= 0; i--) args[n++] = point_doc(i); /* any order */
    args[n++] = "--out";
    args[n++] = DIR "/merged.json";
    args[n] = NULL;
    int rc = tp_run(DIR, ATTNBENCH_EXE, NULL, args, NULL, &g_err);
    cr_assert_eq(rc, 0, "merge: %s", g_err);
    json_t *m = load(DIR "/merged.json"), *f = load(DIR "/full.json");
    cr_assert_str_eq(json_string_value(json_object_get(m, "schema")), "attnbench/run/1");
    cr_assert_str_eq(json_string_value(json_object_get(m, "status")), "ok");
    cr_assert(json_equal(json_object_get(m, "config"), json_object_get(f, "config")));
    json_t *mr = json_object_get(m, "records"), *fr = json_object_get(f, "records");
    cr_assert_eq(json_array_size(mr), N_POINTS);
    cr_assert_eq(json_array_size(fr), N_POINTS);
    static const char *const same[] = {"kind", "variant", "variant_name", "options", "len", "batch", "heads",
                                       "qk_dim", "v_dim", "causal", "status", "context", "steps", "saved_bytes",
                                       "workspace_bytes", "estimated_bytes", "state_bytes", NULL};
    for (size_t i = 0; i < N_POINTS; i++)
        for (int k = 0; same[k]; k++) {
            json_t *a = json_object_get(json_array_get(mr, i), same[k]);
            json_t *b = json_object_get(json_array_get(fr, i), same[k]);
            cr_assert((!a && !b) || (a && b && json_equal(a, b)), "record %zu: %s differs", i, same[k]);
        }
    static const char *const parts[] = {"sgemm", "copy", "summary", "machine", NULL};
    for (int k = 0; parts[k]; k++) cr_assert(json_is_object(json_object_get(m, parts[k])), "no %s", parts[k]);
    cr_assert(json_is_object(json_object_get(json_object_get(m, "summary"), "softmax")));
    json_t *mp = json_object_get(m, "points");
    cr_assert_eq(json_array_size(json_object_get(mp, "held")), N_POINTS);
    cr_assert_eq(json_array_size(json_object_get(mp, "sgemm_gflops")), N_POINTS);
    json_decref(m);
    json_decref(f);
    cr_assert(tp_exists(DIR "/merged.tsv"));
}

#define KEEP "{\"kept\": true}\n"

/* merge of the given documents into DIR/keep.json must be refused naming `needle`,
 * and keep.json stay as it was. */
static void refused(const char *needle, const char *const *docs) {
    tp_write_bytes(DIR "/keep.json", KEEP, strlen(KEEP));
    const char *args[N_POINTS + 16] = {"--threads", "1", "merge"};
    int n = 3;
    for (int i = 0; docs[i]; i++) args[n++] = docs[i];
    args[n++] = "--out";
    args[n++] = DIR "/keep.json";
    args[n] = NULL;
    int rc = tp_run(DIR, ATTNBENCH_EXE, NULL, args, NULL, &g_err);
    cr_assert(tp_usage_error(rc, g_err, needle, TP_ARGV(needle, NULL)), "not refused: %s", needle);
    char *buf = tp_slurp(DIR "/keep.json", NULL);
    cr_assert_str_eq(buf, KEEP, "the output was written on a refusal (%s)", needle);
    free(buf);
}

static void set_running(json_t *d) { json_object_set_new(d, "status", json_string("running")); }
static void set_cpu(json_t *d) { json_object_set_new(json_object_get(d, "machine"), "cpu", json_string("Other CPU")); }
static void set_threads(json_t *d) { json_object_set_new(json_object_get(d, "machine"), "threads", json_integer(64)); }
static void set_repeats(json_t *d) { json_object_set_new(json_object_get(d, "config"), "repeats", json_integer(9)); }

Test(sweep_merge, refusals_leave_the_output_alone) {
    make_points();
    const char *all[N_POINTS + 2];
    for (int i = 0; i < N_POINTS; i++) all[i] = point_doc(i);
    all[N_POINTS] = NULL;
    /* missing points, listed */
    all[6] = NULL;
    refused("2 of 8 points missing: 6, 7", all);
    all[6] = point_doc(6);
    /* a point twice */
    all[N_POINTS] = point_doc(2);
    all[N_POINTS + 1] = NULL;
    refused("point 2 twice", all);
    all[N_POINTS] = NULL;
    /* another config: a point of the same sweep with --set repeats=2 */
    cr_assert_eq(run("bench", CONFIG, "--quiet", "--set", "repeats=2", "--point", "5", "--out",
                     DIR "/other/sw.json", NULL), 0, "%s", g_err);
    all[5] = DIR "/other/sw.point-5.json";
    refused("another config", all);
    refused("key 'repeats' differs", all);
    all[5] = edited(5, "edited-config.json", set_repeats);
    refused("key 'repeats' differs", all);
    /* another machine class */
    all[5] = edited(5, "other-cpu.json", set_cpu);
    all[N_POINTS] = NULL;
    refused("another machine class", all);
    refused("machine 'cpu' differs", all);
    all[5] = edited(5, "other-threads.json", set_threads);
    refused("machine 'threads' differs", all);
    /* a truncated document */
    size_t size;
    char *bytes = tp_slurp(point_doc(5), &size);
    tp_write_bytes(DIR "/cut.json", bytes, size / 2);
    free(bytes);
    all[5] = DIR "/cut.json";
    refused("not a complete JSON document", all);
    /* an unfinished one */
    all[5] = edited(5, "running.json", set_running);
    refused("not finished (status running)", all);
    /* foreign: an unsharded run, a JSON that is no run, nothing at all */
    make_points();
    all[5] = DIR "/full.json";
    refused("not a point document", all);
    tp_write_bytes(DIR "/foreign.json", "[1, 2]\n", 7);
    all[5] = DIR "/foreign.json";
    refused("not an attnbench run document", all);
    all[5] = DIR "/none.json";
    refused("none.json", all);
    /* no documents, no --out */
    int rc = run("merge", "--out", DIR "/keep.json", NULL);
    cr_assert(tp_usage_error(rc, g_err, "none", TP_ARGV("no point", NULL)));
    rc = run("merge", point_doc(0), NULL);
    cr_assert(tp_usage_error(rc, g_err, "no --out", TP_ARGV("--out", NULL)));
}

static void set_timeout(json_t *d) {
    json_t *r = json_array_get(json_object_get(d, "records"), 0);
    json_object_set_new(r, "status", json_string("timeout"));
    json_object_set_new(r, "reason", json_string("one forward+backward call exceeded time_budget_s"));
}

/* Point 2 (linear at N = 32) ran out of time: point 3 (linear at 64) is recorded as a
 * full run records it, skipped, with what its own point measured; linear's recurrent
 * points (4, 5: another kind) and lsh's stay as measured. */
Test(sweep_merge, points_after_a_timeout_skipped_as_a_full_run) {
    make_points();
    const char *args[N_POINTS + 8] = {"--threads", "1", "merge"};
    int n = 3;
    for (int i = 0; i < N_POINTS; i++) args[n++] = i == 2 ? edited(2, "timeout.json", set_timeout) : point_doc(i);
    args[n++] = "--out";
    args[n++] = DIR "/skips.json";
    args[n] = NULL;
    cr_assert_eq(tp_run(DIR, ATTNBENCH_EXE, NULL, args, NULL, &g_err), 0, "merge: %s", g_err);
    json_t *m = load(DIR "/skips.json");
    json_t *r = json_object_get(m, "records");
    const char *st[N_POINTS] = {"ok", "ok", "timeout", "skipped", "ok", "ok", "ok", "ok"};
    for (int i = 0; i < N_POINTS; i++)
        cr_assert_str_eq(json_string_value(json_object_get(json_array_get(r, i), "status")), st[i], "record %d", i);
    json_t *r3 = json_array_get(r, 3);
    cr_assert_str_eq(json_string_value(json_object_get(r3, "reason")), "ran out of time or memory at a smaller length");
    cr_assert_str_eq(json_string_value(json_object_get(r3, "point_status")), "ok");
    cr_assert(json_is_null(json_object_get(r3, "fwd_bwd_ms")));
    cr_assert_eq(json_integer_value(json_object_get(r3, "len")), 64);
    cr_assert_str_eq(json_string_value(json_object_get(m, "status")), "ok");
    json_decref(m);
}

/* ---- the driver's functions, called directly ---- */

#include "error.h"
#include "sweep_points.h"

/* sweep_merge returns its refusals as codes with one-line messages, writes nothing,
 * and never exits. */
Test(sweep_merge, driver_merge_returns_codes) {
    make_points();
    const char *docs[N_POINTS + 1];
    for (int i = 0; i < N_POINTS; i++) docs[i] = point_doc(i);
    bool failed = true;
    sweep_merge_request req = {docs, N_POINTS, DIR "/direct.json", "test"};
    remove(DIR "/direct.json");
    cr_assert_eq(sweep_merge(&req, &failed), 0, "%s", ab_error());
    cr_assert_not(failed);
    json_t *d = load(DIR "/direct.json");
    cr_assert_str_eq(json_string_value(json_object_get(d, "command")), "test");
    json_decref(d);
    req.n_docs = N_POINTS - 1;
    req.out_path = DIR "/direct-missing.json";
    cr_assert_eq(sweep_merge(&req, &failed), AB_EINVAL);
    cr_assert_str_eq(ab_error(), "merge: 1 of 8 points missing: 7 (attnbench bench CONFIG --point I writes them)");
    cr_assert_not(tp_exists(DIR "/direct-missing.json"));
    req.n_docs = 0;
    cr_assert_eq(sweep_merge(&req, &failed), AB_EINVAL);
    /* the machine class is what the documents record */
    json_t *p = load(point_doc(0));
    json_t *cls = sweep_machine_class(p);
    cr_assert_eq(json_object_size(cls), 4);
    cr_assert(json_equal(json_object_get(cls, "threads"), json_object_get(json_object_get(p, "machine"), "threads")));
    cr_assert(json_is_null(json_object_get(cls, "gpu")), "a CPU run has no GPU");
    json_decref(cls);
    json_decref(p);
    char path[64];
    cr_assert_eq(sweep_point_path("results/x.json", 12, path, sizeof path), 0);
    cr_assert_str_eq(path, "results/x.point-12.json");
    cr_assert_eq(sweep_point_path("out", 3, path, sizeof path), 0);
    cr_assert_str_eq(path, "out.point-3.json");
    cr_assert_eq(sweep_point_path("results/a-rather-long-name.json", 3, path, 16), AB_EINVAL);
}
