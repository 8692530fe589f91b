/* Checkpoints (harness/checkpoint.h): round trips of several blobs (empty, odd-sized,
 * large), the common blobs (meta, JSON, optimiser), atomic writes that leave an old
 * file intact on any failure, refusal of foreign, mangled, other-version, truncated,
 * corrupt and malformed files with messages naming the file, a fuzz pass over every
 * byte and every length of a valid file, and a bit-identical resume of an optimiser
 * run through a checkpoint. */
#include "test_checkpoint.h"

/* ------------------------------------------------------------------------------------
 * Scratch folder and raw file helpers
 * ---------------------------------------------------------------------------------- */

char g_dir[600];

static void scratch_setup(void) { tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/checkpoint-tmp"); }

static void scratch_teardown(void) { tp_rm_tree(g_dir); }

TestSuite(checkpoint, .init = scratch_setup, .fini = scratch_teardown);
TestSuite(checkpoint_bad, .init = scratch_setup, .fini = scratch_teardown);
TestSuite(checkpoint_fuzz, .init = scratch_setup, .fini = scratch_teardown);

const char *path_in(const char *name) {
    static char p[1024];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    return p;
}

static int count_temporaries(void) {
    DIR *d = opendir(g_dir);
    int k = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) k++;
    closedir(d);
    return k;
}

/* The format's fields, as checkpoint.h documents them. */
static uint32_t rd32(const unsigned char *p) {
    uint32_t x;
    memcpy(&x, p, 4);
    return x;
}
static uint64_t rd64(const unsigned char *p) {
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}
static void wr32(unsigned char *p, uint32_t x) { memcpy(p, &x, 4); }
static void wr64(unsigned char *p, uint64_t x) { memcpy(p, &x, 8); }

/* Recomputes the table and header CRCs after a deliberate edit of the first `len`
 * bytes, so the reader's later checks (table contents, layout) are the ones exercised.
 * A table that does not fit in `len` keeps its old CRC. */
void fix_crcs(unsigned char *b, size_t len) {
    uint64_t cap = rd32(b + 28);
    if (64 + 64 * cap <= len) wr32(b + 56, (uint32_t)crc32(0L, b + 64, (uInt)(64 * cap)));
    wr32(b + 36, 0);
    wr32(b + 36, (uint32_t)crc32(0L, b, 64));
}

/* Opening must fail with AB_EINVAL and a message naming the file and containing `msg`. */
static void expect_refused(const char *path, const char *msg, const char *what) {
    ab_ckpt_reader *r = (ab_ckpt_reader *)1;
    ab_clear_error();
    int rc = ab_ckpt_open(path, &r);
    cr_assert_eq(rc, AB_EINVAL, "%s: accepted (rc %d)", what, rc);
    cr_assert_null(r, "%s: no reader on failure", what);
    cr_assert(strstr(ab_error(), path), "%s: message '%s' does not name the file", what, ab_error());
    if (msg) cr_assert(strstr(ab_error(), msg), "%s: message '%s' lacks '%s'", what, ab_error(), msg);
}

/* ------------------------------------------------------------------------------------
 * A standard checkpoint with every kind of blob
 * ---------------------------------------------------------------------------------- */

static void set_add(blob_set *s, const char *name, const void *data, size_t bytes) {
    s->b[s->n].name = name;
    s->b[s->n].data = malloc(bytes ? bytes : 1);
    if (bytes) memcpy(s->b[s->n].data, data, bytes);
    s->b[s->n].bytes = bytes;
    s->n++;
}

void set_free(blob_set *s) {
    for (int i = 0; i < s->n; i++) free(s->b[i].data);
}

/* Writes PATH with blobs params (1000 floats), empty (0 bytes), odd (13 bytes), meta,
 * config (JSON) and optim (RAdam state after 3 steps); returns what each holds. */
void write_standard(const char *path, blob_set *set) {
    memset(set, 0, sizeof *set);
    const size_t n = 1000;
    float *p = tu_alloc_f(n), *g = tu_alloc_f(n);
    tu_fill_normal(p, n, 21, 0, 1.0);
    ab_optim_config oc;
    ab_optim_config_default(&oc);
    ab_optim *o;
    cr_assert_eq(ab_optim_create(&oc, n, NULL, 0, &o), 0);
    for (int t = 1; t <= 3; t++) {
        tu_fill_normal(g, n, 21, (uint64_t)t, 1.0);
        cr_assert_eq(ab_optim_step(o, p, g, NULL), 0);
    }
    json_t *state = json_pack("{s:i, s:i, s:f}", "step", 3, "n_params", (int)n, "elapsed_s", 1.5);
    json_t *cfg = json_pack("{s:i, s:f, s:s}", "seed", 21, "lr", 1e-3, "task", "copy");

    ab_ckpt_writer *w;
    cr_assert_eq(ab_ckpt_begin(path, &w), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_add(w, AB_CKPT_PARAMS, p, n * sizeof(float)), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_add(w, "empty", NULL, 0), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_add(w, "odd", "hello, world!", 13), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_add_json(w, "state", state), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_add_json(w, AB_CKPT_CONFIG, cfg), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_add_optim(w, AB_CKPT_OPTIM, o), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_commit(w), 0, "%s", ab_error());

    set_add(set, AB_CKPT_PARAMS, p, n * sizeof(float));
    set_add(set, "empty", NULL, 0);
    set_add(set, "odd", "hello, world!", 13);
    /* state and config as the reader will see them: read back from the file once, and
     * checked field by field in their own tests. */
    ab_ckpt_reader *r;
    cr_assert_eq(ab_ckpt_open(path, &r), 0, "%s", ab_error());
    const void *d;
    size_t nb;
    cr_assert_eq(ab_ckpt_get(r, "state", &d, &nb), 0);
    set_add(set, "state", d, nb);
    cr_assert_eq(ab_ckpt_get(r, AB_CKPT_CONFIG, &d, &nb), 0);
    set_add(set, AB_CKPT_CONFIG, d, nb);
    ab_ckpt_close(r);
    const void *st;
    size_t sb;
    ab_optim_state(o, &st, &sb);
    set_add(set, AB_CKPT_OPTIM, st, sb);

    json_decref(cfg);
    json_decref(state);
    ab_optim_destroy(o);
    free(p), free(g);
}

/* The reader holds exactly the blobs of `set`, in order, with identical bytes. */
void expect_same(const ab_ckpt_reader *r, const blob_set *set) {
    cr_assert_eq(ab_ckpt_count(r), set->n);
    for (int i = 0; i < set->n; i++) {
        cr_assert_str_eq(ab_ckpt_name(r, i), set->b[i].name);
        cr_assert(ab_ckpt_has(r, set->b[i].name));
        const void *d;
        size_t nb;
        cr_assert_eq(ab_ckpt_get(r, set->b[i].name, &d, &nb), 0, "%s", ab_error());
        cr_assert_eq(nb, set->b[i].bytes, "blob %s: %zu bytes, want %zu", set->b[i].name, nb, set->b[i].bytes);
        cr_assert_eq(memcmp(d, set->b[i].data, nb), 0, "blob %s differs", set->b[i].name);
        cr_assert_eq((uintptr_t)d % 64, 0, "blob %s is not 64-byte aligned", set->b[i].name);
    }
}

/* ------------------------------------------------------------------------------------
 * Round trips
 * ---------------------------------------------------------------------------------- */

Test(checkpoint, round_trip_standard) {
    blob_set set;
    write_standard(path_in("a.ckpt"), &set);
    ab_ckpt_reader *r;
    cr_assert_eq(ab_ckpt_open(path_in("a.ckpt"), &r), 0, "%s", ab_error());
    expect_same(r, &set);
    cr_assert_str_eq(ab_ckpt_path(r), path_in("a.ckpt"));
    cr_assert_null(ab_ckpt_name(r, -1));
    cr_assert_null(ab_ckpt_name(r, N_STD));
    cr_assert_not(ab_ckpt_has(r, "nope"));
    cr_assert_not(ab_ckpt_has(r, NULL));
    /* read into a caller buffer */
    float *p = tu_alloc_f(1000);
    cr_assert_eq(ab_ckpt_read(r, AB_CKPT_PARAMS, p, 1000 * sizeof(float)), 0, "%s", ab_error());
    cr_assert_eq(memcmp(p, set.b[0].data, 1000 * sizeof(float)), 0);
    cr_assert_eq(ab_ckpt_read(r, "empty", NULL, 0), 0, "%s", ab_error());
    free(p);
    ab_ckpt_close(r);
    cr_assert_eq(count_temporaries(), 0);
    set_free(&set);
}

Test(checkpoint, large_empty_and_zero_blobs) {
    /* 5 MB + 3 bytes of random data, empty blobs first, between and last. */
    const size_t big = 5u * 1024 * 1024 + 3;
    unsigned char *data = malloc(big);
    for (size_t i = 0; i < big; i += 4) {
        uint32_t w[4];
        ab_philox4x32(7, 0, i / 4, w);
        memcpy(data + i, w, big - i < 4 ? big - i : 4);
    }
    ab_ckpt_writer *w;
    cr_assert_eq(ab_ckpt_begin(path_in("big.ckpt"), &w), 0);
    cr_assert_eq(ab_ckpt_add(w, "e0", NULL, 0), 0);
    cr_assert_eq(ab_ckpt_add(w, "big", data, big), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_add(w, "e1", "", 0), 0);
    cr_assert_eq(ab_ckpt_add(w, "one", "x", 1), 0);
    cr_assert_eq(ab_ckpt_add(w, "e2", NULL, 0), 0);
    cr_assert_eq(ab_ckpt_commit(w), 0, "%s", ab_error());
    blob_set set = {0};
    set_add(&set, "e0", NULL, 0);
    set_add(&set, "big", data, big);
    set_add(&set, "e1", NULL, 0);
    set_add(&set, "one", "x", 1);
    set_add(&set, "e2", NULL, 0);
    ab_ckpt_reader *r;
    cr_assert_eq(ab_ckpt_open(path_in("big.ckpt"), &r), 0, "%s", ab_error());
    expect_same(r, &set);
    ab_ckpt_close(r);
    set_free(&set);
    free(data);

    /* No blobs at all is a valid checkpoint too. */
    cr_assert_eq(ab_ckpt_begin(path_in("none.ckpt"), &w), 0);
    cr_assert_eq(ab_ckpt_commit(w), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_open(path_in("none.ckpt"), &r), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_count(r), 0);
    ab_ckpt_close(r);

    /* The largest table: AB_CKPT_MAX_BLOBS blobs, then one more is refused. */
    cr_assert_eq(ab_ckpt_begin(path_in("full.ckpt"), &w), 0);
    char name[32];
    for (int i = 0; i < AB_CKPT_MAX_BLOBS; i++) {
        snprintf(name, sizeof name, "b%d", i);
        cr_assert_eq(ab_ckpt_add(w, name, &i, sizeof i), 0, "%s", ab_error());
    }
    cr_assert_eq(ab_ckpt_add(w, "more", "x", 1), AB_EINVAL);
    cr_assert(strstr(ab_error(), "more than 64 blobs"), "%s", ab_error());
    ab_ckpt_abort(w);
    cr_assert_eq(count_temporaries(), 0);
    cr_assert_not(tp_exists(path_in("full.ckpt")));
}

Test(checkpoint, json_round_trip_is_exact) {
    json_t *v = json_pack("{s:f, s:f, s:f, s:f, s:[i, i], s:{s:s, s:b}, s:n}", "a", 0.1, "b", 1e-3, "c", 1.0 / 3.0,
                          "d", 4.9e-324, "list", 1, -2, "obj", "name", "copy \"task\"\n", "flag", 1, "nothing");
    ab_ckpt_writer *w;
    cr_assert_eq(ab_ckpt_begin(path_in("j.ckpt"), &w), 0);
    cr_assert_eq(ab_ckpt_add_json(w, AB_CKPT_CONFIG, v), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_add(w, "bad", "{\"a\": ", 6), 0);
    /* a string holding \u0000: json_string cannot make one (the writer never does), and
     * a reader that allowed it cut the string at the NUL and used the rest (issue 28,
     * defect 9; a config file refuses the same string) */
    static const char nul[] = "{\"name\": \"copy\\u0000-evil\"}";
    cr_assert_eq(ab_ckpt_add(w, "nul", nul, sizeof nul - 1), 0);
    cr_assert_eq(ab_ckpt_commit(w), 0);
    ab_ckpt_reader *r;
    cr_assert_eq(ab_ckpt_open(path_in("j.ckpt"), &r), 0);
    json_t *back;
    cr_assert_eq(ab_ckpt_get_json(r, AB_CKPT_CONFIG, &back), 0, "%s", ab_error());
    cr_assert(json_equal(v, back), "JSON differs after the round trip");
    cr_assert_eq(json_real_value(json_object_get(back, "c")), 1.0 / 3.0, "doubles read back exactly");
    json_decref(back);
    cr_assert_eq(ab_ckpt_get_json(r, "bad", &back), AB_EINVAL);
    cr_assert_null(back);
    cr_assert(strstr(ab_error(), "blob 'bad' is not valid JSON") && strstr(ab_error(), path_in("j.ckpt")), "%s",
              ab_error());
    cr_assert_eq(ab_ckpt_get_json(r, "nul", &back), AB_EINVAL, "a \\u0000 in a string was taken");
    cr_assert_null(back);
    cr_assert(strstr(ab_error(), "blob 'nul' is not valid JSON") && strstr(ab_error(), "\\u0000"), "%s", ab_error());
    cr_assert_eq(ab_ckpt_get_json(r, "missing", &back), AB_EINVAL);
    cr_assert(strstr(ab_error(), "no blob 'missing'"), "%s", ab_error());
    ab_ckpt_close(r);
    json_decref(v);
}

/* ------------------------------------------------------------------------------------
 * Writer errors and atomicity
 * ---------------------------------------------------------------------------------- */

/* Writes "old" contents to PATH and checks, after `fail` ran, that they survive and
 * that no temporary file is left. */
static unsigned char *old_contents(const char *path, size_t *n) {
    blob_set set;
    write_standard(path, &set);
    set_free(&set);
    return tp_read_bytes(path, n);
}

static void expect_unchanged(const char *path, const unsigned char *old, size_t n, const char *what) {
    size_t m;
    unsigned char *now = tp_read_bytes(path, &m);
    cr_assert_eq(m, n, "%s: the old file changed size", what);
    cr_assert_eq(memcmp(now, old, n), 0, "%s: the old file changed", what);
    free(now);
    cr_assert_eq(count_temporaries(), 0, "%s: a temporary file is left behind", what);
    ab_ckpt_reader *r;
    cr_assert_eq(ab_ckpt_open(path, &r), 0, "%s: the old file no longer opens: %s", what, ab_error());
    ab_ckpt_close(r);
}

Test(checkpoint, abort_and_failed_adds_keep_the_old_file) {
    const char *path = path_in("keep.ckpt");
    size_t n;
    unsigned char *old = old_contents(path, &n);
    float x[4] = {1, 2, 3, 4};

    ab_ckpt_writer *w;
    cr_assert_eq(ab_ckpt_begin(path, &w), 0);
    cr_assert_eq(ab_ckpt_add(w, "params", x, sizeof x), 0);
    ab_ckpt_abort(w);
    expect_unchanged(path, old, n, "abort");
    ab_ckpt_abort(NULL);

    /* Each bad add poisons the writer: later adds and the commit fail, nothing lands. */
    struct {
        const char *name;
        const void *data;
        size_t bytes;
        const char *msg;
    } bad[] = {
        {"", x, 4, "bad blob name ''"},
        {"has space", x, 4, "bad blob name 'has space'"},
        {"tab\there", x, 4, "bad blob name"},
        {"caf\xc3\xa9", x, 4, "bad blob name"},
        {"a234567890123456789012345678901234567890", x, 4, "1 to 39"},
        {NULL, x, 4, "bad blob name '(null)'"},
        {"params", x, 4, "blob 'params' added twice"},
        {"nodata", NULL, 4, "blob 'nodata' has 4 bytes but no data"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        cr_assert_eq(ab_ckpt_begin(path, &w), 0);
        cr_assert_eq(ab_ckpt_add(w, "params", x, sizeof x), 0);
        ab_clear_error();
        cr_assert_eq(ab_ckpt_add(w, bad[k].name, bad[k].data, bad[k].bytes), AB_EINVAL, "case %zu accepted", k);
        cr_assert(strstr(ab_error(), bad[k].msg), "case %zu: '%s' lacks '%s'", k, ab_error(), bad[k].msg);
        cr_assert(strstr(ab_error(), path), "case %zu: '%s' does not name the file", k, ab_error());
        cr_assert_eq(ab_ckpt_add(w, "later", x, sizeof x), AB_EINVAL, "case %zu: add after a failure", k);
        cr_assert_neq(ab_ckpt_commit(w), 0, "case %zu: commit after a failed add", k);
        cr_assert(strstr(ab_error(), "not written"), "case %zu: %s", k, ab_error());
        expect_unchanged(path, old, n, bad[k].msg);
    }
    /* A 39-character name is the longest allowed. */
    cr_assert_eq(ab_ckpt_begin(path_in("long.ckpt"), &w), 0);
    cr_assert_eq(ab_ckpt_add(w, "a23456789012345678901234567890123456789", x, 4), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_commit(w), 0);
    free(old);
}

Test(checkpoint, write_failure_keeps_the_old_file) {
    const char *path = path_in("disk.ckpt");
    size_t n;
    unsigned char *old = old_contents(path, &n);
    /* A file-size limit makes writes fail (EFBIG) the way a full disk would: the new
     * checkpoint (2 MB) cannot be written, the old one (12 kB) must survive. The limit
     * applies to this test's process only (Criterion runs each test in its own). */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {1 << 20, 1 << 20};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0, "setrlimit: %s", strerror(errno));
    const size_t big = 2u << 20;
    unsigned char *data = calloc(big, 1);
    ab_ckpt_writer *w;
    cr_assert_eq(ab_ckpt_begin(path, &w), 0, "%s", ab_error());
    int rc_add = ab_ckpt_add(w, "params", data, big);
    int rc_commit = ab_ckpt_commit(w);
    cr_assert(rc_add != 0 || rc_commit != 0, "the write past the limit failed somewhere");
    cr_assert_eq(rc_commit, AB_ESYSTEM, "commit: a resource failure (exit status 1), not bad input: %d %s", rc_commit,
                 ab_error());
    cr_assert(strstr(ab_error(), path), "%s", ab_error());
    expect_unchanged(path, old, n, "write failure");
    free(data);
    free(old);
}

Test(checkpoint, begin_in_a_missing_folder_fails) {
    ab_ckpt_writer *w = (ab_ckpt_writer *)1;
    char p[1024];
    snprintf(p, sizeof p, "%s/no/such/dir/x.ckpt", g_dir);
    cr_assert_eq(ab_ckpt_begin(p, &w), AB_EIO);
    cr_assert_null(w);
    cr_assert(strstr(ab_error(), p), "%s", ab_error());
}

/* ------------------------------------------------------------------------------------
 * Refused files
 * ---------------------------------------------------------------------------------- */

Test(checkpoint_bad, foreign_files) {
    const char *p = path_in("foreign");
    tp_write_bytes(p, "hello, I am a text file\n", 24);
    expect_refused(p, "not an attnbench checkpoint", "text");
    static const char npy[] = "\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }";
    tp_write_bytes(p, npy, sizeof npy - 1);
    expect_refused(p, "not an attnbench checkpoint", "npy");
    tp_write_bytes(p, "\x7f" "ELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00", 16);
    expect_refused(p, "not an attnbench checkpoint", "elf");
    tp_write_bytes(p, "", 0);
    expect_refused(p, "empty file", "empty");
    tp_write_bytes(p, "x", 1);
    expect_refused(p, "not an attnbench checkpoint", "one byte");
    /* A large foreign file is refused from its first bytes, without reading it whole. */
    const size_t big = 4u << 20;
    unsigned char *junk = calloc(big, 1);
    tp_write_bytes(p, junk, big);
    free(junk);
    ab_mem_reset_peak(AB_DEV_CPU);
    size_t base = ab_mem_current(AB_DEV_CPU);
    expect_refused(p, "not an attnbench checkpoint", "4 MB of zeros");
    cr_assert_lt(ab_mem_peak(AB_DEV_CPU) - base, 4096u, "refusing a foreign file allocated %zu bytes",
                 ab_mem_peak(AB_DEV_CPU) - base);
    /* missing file */
    ab_ckpt_reader *r;
    cr_assert_lt(ab_ckpt_open(path_in("missing.ckpt"), &r), 0);
    cr_assert(strstr(ab_error(), "missing.ckpt"), "%s", ab_error());
    /* a folder */
    cr_assert_lt(ab_ckpt_open(g_dir, &r), 0);
    cr_assert(strstr(ab_error(), g_dir), "%s", ab_error());
}

Test(checkpoint_bad, text_mode_version_byte_order) {
    const char *p = path_in("v.ckpt");
    blob_set set;
    write_standard(p, &set);
    set_free(&set);
    size_t n;
    unsigned char *good = tp_read_bytes(p, &n);
    unsigned char *b = malloc(n + 1);

    /* CR LF turned into LF (a text-mode transfer): the magic loses a byte. */
    memcpy(b, good, 4);
    memcpy(b + 4, good + 5, n - 5);
    tp_write_bytes(p, b, n - 1);
    expect_refused(p, "text-mode", "CRLF -> LF");
    /* LF turned into CR LF */
    memcpy(b, good, 7);
    b[7] = '\r';
    memcpy(b + 8, good + 7, n - 7);
    tp_write_bytes(p, b, n + 1);
    expect_refused(p, "text-mode", "LF -> CRLF");

    memcpy(b, good, n);
    wr32(b + 8, 2);
    fix_crcs(b, n);
    tp_write_bytes(p, b, n);
    expect_refused(p, "checkpoint format version 2, this build reads 1", "version 2");
    wr32(b + 8, 0);
    tp_write_bytes(p, b, n);
    expect_refused(p, "checkpoint format version 0, this build reads 1", "version 0");

    memcpy(b, good, n);
    wr32(b + 12, 0x04030201u);
    tp_write_bytes(p, b, n);
    expect_refused(p, "other byte order", "byte order");
    free(b);
    free(good);
}

Test(checkpoint_bad, truncated_at_every_section_boundary) {
    const char *p = path_in("t.ckpt");
    blob_set set;
    write_standard(p, &set);
    set_free(&set);
    size_t n;
    unsigned char *good = tp_read_bytes(p, &n);
    /* Section boundaries from the file's own table: inside and at the end of the magic,
     * the header, the table, and at the start, middle and end of every blob. */
    size_t cuts[64];
    int k = 0;
    size_t fixed[] = {1, 4, 7, 8, 12, 32, 63, 64, 65, 128, 64 + 64 * 6, 64 + 64 * 64 - 1, 64 + 64 * 64};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) cuts[k++] = fixed[i];
    uint32_t count = rd32(good + 24);
    cr_assert_eq(count, 6u);
    for (uint32_t i = 0; i < count; i++) {
        uint64_t off = rd64(good + 64 + 64 * i + 40), bytes = rd64(good + 64 + 64 * i + 48);
        cuts[k++] = (size_t)off;
        if (bytes > 1) cuts[k++] = (size_t)(off + bytes / 2);
        if (off + bytes < n) cuts[k++] = (size_t)(off + bytes);
        if (off > 0) cuts[k++] = (size_t)off - 1;
    }
    cuts[k++] = n - 1;
    for (int i = 0; i < k; i++) {
        cr_assert_lt(cuts[i], n);
        tp_write_bytes(p, good, cuts[i]);
        char what[64];
        snprintf(what, sizeof what, "cut at %zu of %zu", cuts[i], n);
        expect_refused(p, "truncated", what);
    }
    /* One byte too many is refused as well. */
    unsigned char *b = malloc(n + 1);
    memcpy(b, good, n);
    b[n] = 0;
    tp_write_bytes(p, b, n + 1);
    expect_refused(p, "1 unexpected bytes after the end", "appended byte");
    free(b);
    free(good);
}

Test(checkpoint_bad, crc_mismatches) {
    const char *p = path_in("c.ckpt");
    blob_set set;
    write_standard(p, &set);
    size_t n;
    unsigned char *good = tp_read_bytes(p, &n);
    unsigned char *b = malloc(n);
    /* One flipped bit in each non-empty blob names that blob. */
    for (uint32_t i = 0; i < 6; i++) {
        uint64_t off = rd64(good + 64 + 64 * i + 40), bytes = rd64(good + 64 + 64 * i + 48);
        if (!bytes) continue;
        memcpy(b, good, n);
        b[off + bytes - 1] ^= 0x10;
        tp_write_bytes(p, b, n);
        char msg[96];
        snprintf(msg, sizeof msg, "blob '%s' is corrupt (CRC mismatch)", set.b[i].name);
        expect_refused(p, msg, msg);
    }
    memcpy(b, good, n);
    b[50] ^= 1; /* file size field */
    tp_write_bytes(p, b, n);
    expect_refused(p, "checkpoint header is corrupt (CRC mismatch)", "header");
    memcpy(b, good, n);
    b[64 + 64 * 2 + 50] ^= 1; /* a blob size in the table */
    tp_write_bytes(p, b, n);
    expect_refused(p, "checkpoint table is corrupt (CRC mismatch)", "table");
    memcpy(b, good, n);
    b[64 + 64 * 40 + 3] = 1; /* an unused table slot */
    tp_write_bytes(p, b, n);
    expect_refused(p, "checkpoint table is corrupt (CRC mismatch)", "unused slot");
    set_free(&set);
    free(b);
    free(good);
}

/* Tables that pass their CRCs but describe something impossible (a buggy or malicious
 * writer): each refused with a message. */
Test(checkpoint_bad, bad_tables) {
    const char *p = path_in("b.ckpt");
    blob_set set;
    write_standard(p, &set);
    set_free(&set);
    size_t n;
    unsigned char *good = tp_read_bytes(p, &n);
    unsigned char *b = malloc(n + 4096);
    unsigned char *e0 = b + 64, *e1 = b + 128, *e2 = b + 192;

#define CASE(what, msg, edit)                                                                                          \
    do {                                                                                                               \
        memcpy(b, good, n);                                                                                            \
        size_t len = n;                                                                                                \
        edit;                                                                                                          \
        fix_crcs(b, n);                                                                                                \
        tp_write_bytes(p, b, len);                                                                                     \
        expect_refused(p, msg, what);                                                                                  \
    } while (0)

    CASE("count > capacity", "7 blobs in 6 slots", (wr32(b + 24, 7), wr32(b + 28, 6)));
    CASE("huge capacity", "at most 65536", wr32(b + 28, 1u << 30));
    CASE("count beyond the used slots", "no valid name", wr32(b + 24, 7));
    CASE("count below the used slots", "unused slot 5 is not empty", wr32(b + 24, 5));
    CASE("entry size", "malformed checkpoint header", wr32(b + 20, 32));
    CASE("alignment", "malformed checkpoint header", wr32(b + 32, 16));
    CASE("data offset", "malformed checkpoint header", wr64(b + 40, 64));
    CASE("reserved header field", "malformed checkpoint header", wr32(b + 60, 1));
    CASE("misaligned blob", "bad checkpoint table (blob 'empty'", wr64(e1 + 40, rd64(e1 + 40) + 4));
    CASE("overlapping blobs", "bad checkpoint table (blob 'empty'", wr64(e1 + 40, rd64(e0 + 40)));
    CASE("blob past the end", "bad checkpoint table (blob 'odd'", wr64(e2 + 48, (uint64_t)n));
    CASE("huge blob size", "bad checkpoint table (blob 'params'", wr64(e0 + 48, UINT64_MAX - 10));
    CASE("huge offset", "bad checkpoint table (blob 'params'", wr64(e0 + 40, UINT64_MAX - 63));
    CASE("blob shorter than its room", "blobs end at", wr64(b + 48, (uint64_t)n + 64); len = n + 64;
         memset(b + n, 0, 64));
    CASE("duplicate names", "blob 'params' appears twice", memcpy(e2, "params\0\0", 8));
    CASE("empty name", "entry 1 has no valid name", memset(e1, 0, 40));
    CASE("name with a space", "entry 2 has no valid name", e2[1] = ' ');
    CASE("name without NUL", "entry 0 has no valid name", memset(e0, 'a', 40));
    CASE("bytes after the name", "entry 0: bytes after its name", e0[30] = 'z');
    CASE("reserved entry field", "reserved field", wr32(e0 + 60, 5));
    CASE("non-zero padding", "padding before blob 'empty'", b[rd64(e0 + 40) + rd64(e0 + 48)] = 1);
#undef CASE
    free(b);
    free(good);
}

/* Issue 16, defect 1: a last blob that ends short of an alignment boundary, then one
 * more table entry at the next boundary (past the end of the file) whose size is
 * file_bytes - offset modulo 2^64, so that offset + bytes wraps back to the file's
 * size. With valid CRCs, the reader used to accept the layout and crash computing the
 * CRC of 2^64 - 51 bytes; it must refuse the entry. */
Test(checkpoint_bad, blob_past_the_end_with_a_wrapping_size) {
    const char *p = path_in("wrap.ckpt");
    float x[100];
    for (int i = 0; i < 100; i++) x[i] = (float)i;
    ab_ckpt_writer *w;
    cr_assert_eq(ab_ckpt_begin(p, &w), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_add(w, AB_CKPT_PARAMS, x, sizeof x), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_add(w, "odd", "hello, world!", 13), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_commit(w), 0, "%s", ab_error());
    size_t n;
    unsigned char *b = tp_read_bytes(p, &n);
    const uint64_t file_bytes = rd64(b + 48);
    cr_assert_eq(file_bytes, (uint64_t)n);
    cr_assert_neq(file_bytes % 64, 0u, "the last blob must end off an alignment boundary");
    cr_assert_eq(rd32(b + 24), 2u);
    const uint64_t off = (file_bytes + 63) / 64 * 64;
    unsigned char *e = b + 64 + 64 * 2;
    memcpy(e, "evil", 4);
    wr64(e + 40, off);
    wr64(e + 48, file_bytes - off); /* wraps: offset + bytes == file_bytes mod 2^64 */
    wr32(e + 56, 0);
    wr32(b + 24, 3);
    fix_crcs(b, n);
    tp_write_bytes(p, b, n);
    expect_refused(p, "bad checkpoint table (blob 'evil'", "blob past the end with a wrapping size");
    /* The same entry with the size that would reach exactly the end: refused too. */
    wr64(e + 48, 0);
    fix_crcs(b, n);
    tp_write_bytes(p, b, n);
    expect_refused(p, "bad checkpoint table (blob 'evil'", "empty blob past the end");
    free(b);
}

Test(checkpoint_bad, missing_blob_and_wrong_size) {
    const char *p = path_in("s.ckpt");
    blob_set set;
    write_standard(p, &set);
    ab_ckpt_reader *r;
    cr_assert_eq(ab_ckpt_open(p, &r), 0);
    const void *d = NULL;
    size_t nb = 77;
    cr_assert_eq(ab_ckpt_get(r, "weights", &d, &nb), AB_EINVAL);
    cr_assert(strstr(ab_error(), "no blob 'weights'") && strstr(ab_error(), p), "%s", ab_error());
    cr_assert_null(d);
    cr_assert_eq(nb, 77u);
    float buf[1001];
    for (int i = 0; i < 1001; i++) buf[i] = -1;
    cr_assert_eq(ab_ckpt_read(r, AB_CKPT_PARAMS, buf, 1001 * sizeof(float)), AB_EINVAL);
    cr_assert(strstr(ab_error(), "blob 'params' has 4000 bytes, expected 4004") && strstr(ab_error(), p), "%s",
              ab_error());
    cr_assert_eq(buf[0], -1.0f, "the buffer is untouched");
    cr_assert_eq(ab_ckpt_read(r, "odd", buf, 12), AB_EINVAL);
    cr_assert(strstr(ab_error(), "blob 'odd' has 13 bytes, expected 12"), "%s", ab_error());
    cr_assert_eq(ab_ckpt_read(r, "nothing", buf, 4), AB_EINVAL);
    cr_assert(strstr(ab_error(), "no blob 'nothing'"), "%s", ab_error());

    /* The optimiser blob into an optimiser of another size or kind. */
    ab_optim_config c;
    ab_optim_config_default(&c);
    ab_optim *o;
    cr_assert_eq(ab_optim_create(&c, 999, NULL, 0, &o), 0);
    cr_assert_eq(ab_ckpt_get_optim(r, AB_CKPT_OPTIM, o), AB_EINVAL);
    cr_assert(strstr(ab_error(), p) && strstr(ab_error(), "blob 'optim'") &&
                  strstr(ab_error(), "1000 parameters, this optimiser has 999"),
              "%s", ab_error());
    ab_optim_destroy(o);
    c.kind = AB_OPTIM_ADAM;
    cr_assert_eq(ab_optim_create(&c, 1000, NULL, 0, &o), 0);
    cr_assert_eq(ab_ckpt_get_optim(r, AB_CKPT_OPTIM, o), AB_EINVAL);
    cr_assert(strstr(ab_error(), "radam state, this optimiser is adam"), "%s", ab_error());
    cr_assert_eq(ab_ckpt_get_optim(r, "odd", o), AB_EINVAL);
    cr_assert(strstr(ab_error(), "blob 'odd'") && strstr(ab_error(), "not an attnbench optimiser state"), "%s",
              ab_error());
    ab_optim_destroy(o);
    ab_ckpt_close(r);
    set_free(&set);
}
