/* A training array through the binary (experiments/driver/train_array.h): --array-count,
 * --array-index I runs entry I in DIR/array-I with its overrides, resumes there, and
 * refuses a folder of another entry (another index, changed overrides, a run that is
 * no array task's) with one line and exit status 2, the folder left as it was. */
#include "test_proc.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CONFIG ATTNBENCH_SOURCE_DIR "/tests/scripts/slurm/train-array.json"
#define PLAIN ATTNBENCH_SOURCE_DIR "/experiments/copy/smoke.json"
#define DIR TEST_DATA_DIR "/train-array-test"

static char *g_out, *g_err;

#define run(...) tp_run(DIR, ATTNBENCH_EXE, NULL, TP_ARGV("--threads", "1", __VA_ARGS__), &g_out, &g_err)

static void setup(void) {
    mkdir(TEST_DATA_DIR, 0777);
    tp_rm_tree(DIR);
    mkdir(DIR, 0777);
}

static void teardown(void) {
    free(g_out);
    free(g_err);
    g_out = g_err = NULL;
}

TestSuite(train_array, .init = setup, .fini = teardown);

static json_t *load(const char *path) {
    json_error_t je;
    json_t *d = json_load_file(path, 0, &je);
    cr_assert_not_null(d, "%s: %s", path, je.text);
    return d;
}

static void copy_file(const char *from, const char *to) {
    size_t n;
    unsigned char *b = tp_read_bytes(from, &n);
    tp_write_bytes(to, b, n);
    free(b);
}

Test(train_array, count_and_bad_indices) {
    cr_assert_eq(run("train", CONFIG, "--array-count", NULL), 0, "%s", g_err);
    cr_assert_str_eq(g_out, "3\n");
    int rc = run("train", PLAIN, "--array-count", NULL);
    cr_assert(tp_usage_error(rc, g_err, "no array", TP_ARGV("no 'array'", NULL)));
    rc = run("train", CONFIG, "--array-index", "3", "--out", DIR "/a", NULL);
    cr_assert(tp_usage_error(rc, g_err, "index 3", TP_ARGV("entries 0..2", NULL)));
    cr_assert_not(tp_exists(DIR "/a/array-3"));
    rc = run("train", CONFIG, "--out", DIR "/a", NULL);
    cr_assert(tp_usage_error(rc, g_err, "without an index", TP_ARGV("'array'", NULL)));
}

Test(train_array, entry_runs_resumes_and_refuses_another_entrys_folder) {
    int rc = run("train", CONFIG, "--array-index", "2", "--out", DIR "/a", "--quiet", "--set", "steps=3", NULL);
    cr_assert_eq(rc, 0, "%s", g_err);
    json_t *d = load(DIR "/a/array-2/train.json");
    json_t *cfg = json_object_get(d, "config");
    cr_assert_eq(json_integer_value(json_object_get(cfg, "seed")), 3, "entry 2's seed");
    cr_assert_float_eq(json_real_value(json_object_get(json_object_get(cfg, "optim"), "lr")), 0.002, 1e-12);
    cr_assert_eq(json_integer_value(json_object_get(cfg, "steps")), 3, "--set after the entry's overrides");
    cr_assert_null(json_object_get(cfg, "array"));
    json_decref(d);
    json_t *m = load(DIR "/a/array-2/array.json");
    cr_assert_eq(json_integer_value(json_object_get(m, "index")), 2);
    json_decref(m);
    /* resumed: the same entry continues */
    rc = run("train", CONFIG, "--array-index", "2", "--out", DIR "/a", "--quiet", "--resume", "--set", "steps=6", NULL);
    cr_assert_eq(rc, 0, "%s", g_err);
    d = load(DIR "/a/array-2/train.json");
    cr_assert_eq(json_array_size(json_object_get(d, "step_loss")), 6);
    json_decref(d);
    /* entry 2's folder as entry 1's: refused, left as it was */
    mkdir(DIR "/a/array-1", 0777);
    const char *files[] = {"array.json", "checkpoint.bin", "train.json", NULL};
    for (int i = 0; files[i]; i++)
        copy_file(tp_path(DIR, "a/array-2/%s", files[i]), tp_path(DIR, "a/array-1/%s", files[i]));
    size_t n0;
    unsigned char *before = tp_read_bytes(DIR "/a/array-1/checkpoint.bin", &n0);
    rc = run("train", CONFIG, "--array-index", "1", "--out", DIR "/a", "--quiet", "--resume", NULL);
    cr_assert(tp_usage_error(rc, g_err, "another index", TP_ARGV("holds array task 2's run, not task 1's", NULL)));
    rc = run("train", CONFIG, "--array-index", "1", "--out", DIR "/a", "--quiet", "--overwrite", NULL);
    cr_assert(tp_usage_error(rc, g_err, "overwrite", TP_ARGV("holds array task 2's run", NULL)));
    size_t n1;
    unsigned char *after = tp_read_bytes(DIR "/a/array-1/checkpoint.bin", &n1);
    cr_assert(n0 == n1 && memcmp(before, after, n0) == 0, "the checkpoint was changed");
    free(before);
    free(after);
    /* without its marker: a run that is no array task's */
    remove(DIR "/a/array-1/array.json");
    rc = run("train", CONFIG, "--array-index", "1", "--out", DIR "/a", "--quiet", "--resume", NULL);
    cr_assert(tp_usage_error(rc, g_err, "no marker", TP_ARGV("not array task 1's", NULL)));
    /* the entry's overrides changed since its run began */
    json_t *c = load(CONFIG);
    json_object_set_new(json_array_get(json_object_get(c, "array"), 2), "seed", json_integer(30));
    cr_assert_eq(json_dump_file(c, DIR "/changed.json", 0), 0);
    json_decref(c);
    rc = run("train", DIR "/changed.json", "--array-index", "2", "--out", DIR "/a", "--quiet", "--resume", NULL);
    cr_assert(tp_usage_error(rc, g_err, "changed", TP_ARGV("other overrides", NULL)));
}

/* ---- the driver's function, called directly ---- */

#include "error.h"
#include "train_array.h"

Test(train_array, driver_prepare_gives_the_entry) {
    train_array_task t;
    cr_assert_eq(train_array_prepare(CONFIG, 2, DIR "/d", &t), 0, "%s", ab_error());
    cr_assert_eq(t.count, 3);
    cr_assert_str_eq(t.dir, DIR "/d/array-2");
    cr_assert_eq(t.n_sets, 2);
    cr_assert_str_eq(t.sets[0], "seed=3");
    cr_assert_str_eq(t.sets[1], "optim.lr=0.002");
    cr_assert_null(json_object_get(t.config, "array"));
    cr_assert(tp_exists(DIR "/d/array-2/array.json"));
    train_array_free(&t);
    cr_assert_eq(train_array_prepare(CONFIG, 1, DIR "/d", &t), 0, "%s", ab_error());
    train_array_free(&t);
    /* entry 1's marker in entry 0's folder */
    rename(DIR "/d/array-1", DIR "/d/array-0");
    cr_assert_eq(train_array_prepare(CONFIG, 0, DIR "/d", &t), AB_EINVAL);
    cr_assert_not_null(strstr(ab_error(), "holds array task 1's run, not task 0's"), "%s", ab_error());
    int n = 0;
    cr_assert_eq(train_array_count(CONFIG, &n), 0);
    cr_assert_eq(n, 3);
    cr_assert_eq(train_array_count(PLAIN, &n), AB_EINVAL);
    cr_assert_eq(train_array_prepare(NULL, 0, NULL, &t), AB_EINVAL);
}
