/* The images experiment's data and task (experiments/images/): the IDX and CIFAR-10
 * readers on tiny files the tests write (good ones plain and gzip-compressed, and
 * truncated, foreign and mislabelled ones, each refused with one line naming the file),
 * the "images" task's rows (raster order, the start token, the valid split at the end
 * of the training file, CIFAR's planes interleaved per pixel) and prompts, a model
 * that predicts the uniform distribution scoring exactly 8 bits/dim, and training on a
 * fixture of 4 x 4 "MNIST" images through `attnbench train` on the CPU and on the CUDA
 * backend (attnbench-emu): the loss falls, a resume in the middle of an epoch continues
 * bit for bit, generation runs, and a resume on changed data or a bad config is one
 * line, exit 2. Everything from fixed patterns and seeds. */
#include <criterion/criterion.h>

#include "checkpoint.h"
#include "error.h"
#include "image_data.h"
#include "task.h"
#include "task_list.h"
#include "npy.h"
#include "test_proc.h"
#include "test_run.h"
#include "train_config.h"
#include "trainer.h"
#include "transformer.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char g_dir[600];
static char *g_out, *g_err;
static const char *g_exe = ATTNBENCH_EXE;

static void setup(void) {
    task_list_install();
    tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/images-tmp");
}

static void teardown(void) {
    tp_rm_tree(g_dir);
    free(g_out);
    free(g_err);
    g_out = g_err = NULL;
    g_exe = ATTNBENCH_EXE;
}

TestSuite(images, .init = setup, .fini = teardown, .timeout = 300);

/* A path in the scratch folder (tp_path). */
#define P(...) tp_path(g_dir, __VA_ARGS__)

#define run(...) tp_wait(g_dir, tp_spawn(g_dir, g_exe, NULL, TP_ARGV("--threads", "1", __VA_ARGS__, NULL)), &g_out, &g_err)

/* ---- writing files ---- */

static void write_gz(const char *path, const void *data, size_t n) {
    gzFile gz = gzopen(path, "wb");
    cr_assert_not_null(gz, "cannot write %s", path);
    cr_assert_eq(gzwrite(gz, data, (unsigned)n), (int)n);
    cr_assert_eq(gzclose(gz), Z_OK);
}

/* An IDX file: magic 00 00 type ndim, big-endian dims, then `n` data bytes (which
 * need not match the dims: the tests write bad files too). */
static void write_idx(const char *path, int type, int ndim, const uint32_t *dims, const unsigned char *data, size_t n,
                      bool gz) {
    size_t h = 4 + 4 * (size_t)ndim;
    unsigned char *b = malloc(h + n + 1);
    b[0] = b[1] = 0;
    b[2] = (unsigned char)type;
    b[3] = (unsigned char)ndim;
    for (int i = 0; i < ndim; i++) {
        b[4 + 4 * i] = (unsigned char)(dims[i] >> 24);
        b[5 + 4 * i] = (unsigned char)(dims[i] >> 16);
        b[6 + 4 * i] = (unsigned char)(dims[i] >> 8);
        b[7 + 4 * i] = (unsigned char)dims[i];
    }
    if (n) memcpy(b + h, data, n);
    if (gz) write_gz(path, b, h + n);
    else tp_write_bytes(path, b, h + n);
    free(b);
}

/* Image r of a fixture: value(y, x) = ((x + y + r) mod 4) * 85, so every value is one
 * of 0, 85, 170, 255 and each follows from its left neighbour (a learnable pattern). */
static unsigned char pix(int r, int y, int x) { return (unsigned char)(((x + y + r) % 4) * 85); }

static unsigned char *fixture_images(int n, int rows, int cols) {
    unsigned char *p = malloc((size_t)n * rows * cols);
    for (int r = 0; r < n; r++)
        for (int y = 0; y < rows; y++)
            for (int x = 0; x < cols; x++) p[((size_t)r * rows + y) * cols + x] = pix(r, y, x);
    return p;
}

static unsigned char *fixture_labels(int n) {
    unsigned char *l = malloc((size_t)n);
    for (int r = 0; r < n; r++) l[r] = (unsigned char)(r % 10);
    return l;
}

enum { FX_SIDE = 4, FX_TRAIN = 24, FX_TEST = 8, FX_VALID = 4 };

/* A 4 x 4 "MNIST" folder: 24 training images (gzip-compressed files) and 8 test
 * images (plain files). */
static void write_mnist_fixture(const char *dir) {
    mkdir(dir, 0755);
    char p[1200];
    const int n[2] = {FX_TRAIN, FX_TEST};
    const char *stem[2] = {"train", "t10k"};
    for (int i = 0; i < 2; i++) {
        unsigned char *im = fixture_images(n[i] + (i ? 100 : 0), FX_SIDE, FX_SIDE), *lab = fixture_labels(n[i]);
        /* the test images continue the pattern where training's leave off (r + 100) */
        const unsigned char *src = i ? im + 100 * FX_SIDE * FX_SIDE : im;
        uint32_t d3[3] = {(uint32_t)n[i], FX_SIDE, FX_SIDE}, d1[1] = {(uint32_t)n[i]};
        snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte%s", dir, stem[i], i ? "" : ".gz");
        write_idx(p, 0x08, 3, d3, src, (size_t)n[i] * FX_SIDE * FX_SIDE, i == 0);
        snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte%s", dir, stem[i], i ? "" : ".gz");
        write_idx(p, 0x08, 1, d1, lab, (size_t)n[i], i == 0);
        free(im);
        free(lab);
    }
}

/* The reader's failure: AB_EINVAL and one line that names the file and holds `needle`. */
static void expect_refused(int rc, const char *path, const char *needle, const char *what) {
    const char *m = ab_error();
    cr_expect_eq(rc, AB_EINVAL, "%s: rc %d (%s)", what, rc, m);
    cr_expect(strstr(m, path) != NULL, "%s: the message does not name %s: %s", what, path, m);
    cr_expect(strchr(m, '\n') == NULL, "%s: the message is not one line: %s", what, m);
    if (needle) cr_expect(strstr(m, needle) != NULL, "%s: the message lacks '%s': %s", what, needle, m);
}

/* ---- IDX ---- */

Test(images, idx_reads_plain_and_gzip_files) {
    enum { n = 5, R = 3, C = 4 };
    unsigned char *im = fixture_images(n, R, C), *lab = fixture_labels(n);
    uint32_t d3[3] = {n, R, C}, d1[1] = {n};
    for (int gz = 0; gz < 2; gz++) {
        const char *ip = P("im%d", gz), *lp = P("lab%d", gz);
        write_idx(ip, 0x08, 3, d3, im, sizeof(unsigned char) * n * R * C, gz);
        write_idx(lp, 0x08, 1, d1, lab, n, gz);
        img_set s;
        cr_assert_eq(img_read_idx_images(ip, &s), 0, "%s", ab_error());
        cr_expect_eq(s.n, n);
        cr_expect_eq(s.rows, R);
        cr_expect_eq(s.cols, C);
        cr_expect_eq(s.channels, 1);
        cr_expect_eq(s.image_bytes, R * C);
        cr_expect(memcmp(s.pixels, im, n * R * C) == 0, "gz %d: the pixels differ", gz);
        cr_expect_null(s.labels);
        cr_assert_eq(img_read_idx_labels(lp, ip, 10, &s), 0, "%s", ab_error());
        cr_expect(memcmp(s.labels, lab, n) == 0, "gz %d: the labels differ", gz);
        cr_expect_eq(s.classes, 10);
        /* raster order of a greyscale image is the file's order */
        int row[R * C];
        img_raster(&s, 3, row);
        for (int y = 0; y < R; y++)
            for (int x = 0; x < C; x++) cr_expect_eq(row[y * C + x], pix(3, y, x));
        /* the fingerprint: zlib's CRC-32 of the pixels, then the labels */
        uLong want = crc32(crc32(0, im, n * R * C), lab, n);
        cr_expect_eq(img_crc32(&s), (uint32_t)want);
        img_set_free(&s);
    }
    free(im);
    free(lab);
}

/* An IDX file whose data is larger than this machine's memory and swap (sparse: it
 * takes no disk) is bad input, exit status 2, like other impossible sizes, not an
 * out-of-memory failure, exit 1 (issue 28: a 3 TB file). */
Test(images, an_idx_file_larger_than_memory_is_bad_input) {
    const double cap = tp_memory_capacity();
    const double count = cap / (1 << 20) + 1; /* images of 1024 x 1024 */
    if (count > 4294967295.0) cr_skip_test("more memory than an IDX file of 2^32 - 1 images of 1 MiB holds");
    const uint32_t d3[3] = {(uint32_t)count, 1024, 1024};
    const char *p = P("larger");
    write_idx(p, 0x08, 3, d3, NULL, 0, false);
    if (truncate(p, (off_t)(16 + (unsigned long long)d3[0] * (1ull << 20))) != 0)
        cr_skip_test("no sparse file of %u MiB here", d3[0]);
    img_set s;
    expect_refused(img_read_idx_images(p, &s), p, "more than this machine's memory and swap", "larger than memory");
}

Test(images, idx_refuses_truncated_foreign_and_mislabelled_files) {
    enum { n = 6, R = 4, C = 4, B = n * R * C };
    unsigned char *im = fixture_images(n, R, C), *lab = fixture_labels(n);
    uint32_t d3[3] = {n, R, C}, d1[1] = {n};
    img_set s;
    const char *p;

    /* a missing file, an empty one, one shorter than its header */
    p = P("missing");
    expect_refused(img_read_idx_images(p, &s), p, NULL, "missing");
    p = P("empty");
    tp_write_bytes(p, "", 0);
    expect_refused(img_read_idx_images(p, &s), p, "truncated", "empty");
    p = P("short-header");
    write_idx(p, 0x08, 3, d3, NULL, 0, false);
    unsigned char *bytes;
    size_t nb;
    bytes = tp_read_bytes(p, &nb);
    tp_write_bytes(p, bytes, 9);
    free(bytes);
    expect_refused(img_read_idx_images(p, &s), p, "truncated", "header cut at 9 bytes");

    /* the data one byte short, plain and compressed; a compressed stream cut in half */
    p = P("short.plain");
    write_idx(p, 0x08, 3, d3, im, B - 1, false);
    expect_refused(img_read_idx_images(p, &s), p, "truncated", "plain, a byte short");
    p = P("short.gz");
    write_idx(p, 0x08, 3, d3, im, B - 1, true);
    expect_refused(img_read_idx_images(p, &s), p, "truncated", "gzip, a byte short");
    p = P("cut.gz");
    write_idx(p, 0x08, 3, d3, im, B, true);
    bytes = tp_read_bytes(p, &nb);
    tp_write_bytes(p, bytes, nb / 2);
    expect_refused(img_read_idx_images(p, &s), p, NULL, "gzip stream cut in half");
    /* a compressed stream with its deflate data damaged */
    for (size_t i = 12; i < nb - 8; i++) bytes[i] ^= 0x5A;
    tp_write_bytes(p, bytes, nb);
    expect_refused(img_read_idx_images(p, &s), p, NULL, "gzip data damaged");
    free(bytes);

    /* the 8-byte trailer (CRC-32, length) cut off, wholly or in part: every data byte
     * is there, but nothing vouches for it, so a changed byte would go unseen (zlib's
     * gzread took these files: issue 28, defect 2) */
    p = P("whole.gz");
    write_idx(p, 0x08, 3, d3, im, B, true);
    bytes = tp_read_bytes(p, &nb);
    for (size_t cut = 1; cut <= 8; cut++) {
        char what[64];
        snprintf(what, sizeof what, "trailer short by %zu bytes", cut);
        p = P("trailer%zu.gz", cut);
        tp_write_bytes(p, bytes, nb - cut);
        expect_refused(img_read_idx_images(p, &s), p, "trailer", what);
    }
    /* a byte of the CRC changed: refused by the check the trailer makes possible */
    unsigned char *crcbad = malloc(nb);
    memcpy(crcbad, bytes, nb);
    crcbad[nb - 8] ^= 0x01;
    p = P("crc.gz");
    tp_write_bytes(p, crcbad, nb);
    expect_refused(img_read_idx_images(p, &s), p, "does not decompress", "CRC-32 changed");
    /* bytes after the gzip member (defect 3): zeros, text, a lone 1f; and a second
     * whole member, which gzip's format allows (its data is then more IDX data) */
    static const char *const tails[3] = {"\0\0\0", "junk", "\x1f"};
    static const size_t tail_len[3] = {3, 4, 1};
    for (int t = 0; t < 3; t++) {
        unsigned char *tb = malloc(nb + 4);
        memcpy(tb, bytes, nb);
        memcpy(tb + nb, tails[t], tail_len[t]);
        p = P("tail%d.gz", t);
        tp_write_bytes(p, tb, nb + tail_len[t]);
        free(tb);
        char what[64];
        snprintf(what, sizeof what, "%zu bytes after the gzip member", tail_len[t]);
        expect_refused(img_read_idx_images(p, &s), p, "after the end of the gzip data", what);
    }
    free(crcbad);
    free(bytes);
    {
        /* the file as two members: the header and part of the data, then the rest */
        size_t nr, na, nz;
        write_idx(P("two.plain"), 0x08, 3, d3, im, B, false);
        unsigned char *raw = tp_read_bytes(P("two.plain"), &nr);
        write_gz(P("two.a"), raw, 21);
        write_gz(P("two.b"), raw + 21, nr - 21);
        unsigned char *a = tp_read_bytes(P("two.a"), &na), *z = tp_read_bytes(P("two.b"), &nz);
        unsigned char *two = malloc(na + nz);
        memcpy(two, a, na);
        memcpy(two + na, z, nz);
        p = P("two.gz");
        tp_write_bytes(p, two, na + nz);
        cr_expect_eq(img_read_idx_images(p, &s), 0, "two gzip members: %s", ab_error());
        if (s.pixels) cr_expect(memcmp(s.pixels, im, B) == 0, "two gzip members: the pixels differ");
        img_set_free(&s);
        free(raw);
        free(a);
        free(z);
        free(two);
    }

    /* bytes after the data */
    p = P("long");
    unsigned char more[B + 3];
    memcpy(more, im, B);
    more[B] = more[B + 1] = more[B + 2] = 7;
    write_idx(p, 0x08, 3, d3, more, B + 3, false);
    expect_refused(img_read_idx_images(p, &s), p, "3 bytes after", "3 bytes too many");
    p = P("long.gz");
    write_idx(p, 0x08, 3, d3, more, B + 3, true);
    expect_refused(img_read_idx_images(p, &s), p, "3 bytes after", "3 bytes too many, compressed");

    /* foreign: not IDX at all (a zip's magic), floats, the labels given as images, the
     * images given as labels, a zero dimension */
    p = P("zip");
    static const char zip[] = "PK\x03\x04 not an IDX file at all";
    tp_write_bytes(p, zip, sizeof zip - 1);
    expect_refused(img_read_idx_images(p, &s), p, "not an IDX file", "zip magic");
    p = P("floats");
    write_idx(p, 0x0D, 3, d3, im, B, false);
    expect_refused(img_read_idx_images(p, &s), p, "0x0d (float)", "float elements");
    p = P("labels-as-images");
    write_idx(p, 0x08, 1, d1, lab, n, false);
    expect_refused(img_read_idx_images(p, &s), p, "1 dimensions, expected 3", "labels as images");
    p = P("zero");
    uint32_t dz[3] = {n, 0, C};
    write_idx(p, 0x08, 3, dz, NULL, 0, false);
    expect_refused(img_read_idx_images(p, &s), p, "is 0", "zero rows");

    /* a header that promises far more than the file holds: refused as truncated, with
     * no allocation of what it promised (plain: the file size is checked first; gzip:
     * the buffer grows with the data) */
    uint32_t huge[3] = {4000000000u, 28, 28};
    p = P("huge");
    write_idx(p, 0x08, 3, huge, im, B, false);
    expect_refused(img_read_idx_images(p, &s), p, "truncated", "a 2.9 TB promise, plain");
    p = P("huge.gz");
    write_idx(p, 0x08, 3, huge, im, B, true);
    expect_refused(img_read_idx_images(p, &s), p, "truncated", "a 2.9 TB promise, gzip");

    /* mislabelled: good images, labels of another count, a label out of range, images
     * given as labels */
    const char *ip = P("good-images");
    write_idx(ip, 0x08, 3, d3, im, B, false);
    cr_assert_eq(img_read_idx_images(ip, &s), 0, "%s", ab_error());
    p = P("labels-5");
    uint32_t d5[1] = {n - 1};
    write_idx(p, 0x08, 1, d5, lab, n - 1, true);
    expect_refused(img_read_idx_labels(p, ip, 10, &s), p, "5 labels", "label count 5 for 6 images");
    cr_expect(strstr(ab_error(), ip) != NULL, "the count message names the images too: %s", ab_error());
    p = P("labels-bad");
    unsigned char bad[n];
    memcpy(bad, lab, n);
    bad[4] = 10;
    write_idx(p, 0x08, 1, d1, bad, n, false);
    expect_refused(img_read_idx_labels(p, ip, 10, &s), p, "label 10 of image 4 is outside [0, 10)", "label 10");
    expect_refused(img_read_idx_labels(ip, ip, 10, &s), ip, "3 dimensions, expected 1", "images as labels");
    cr_expect_null(s.labels, "a refused labels file leaves none");
    img_set_free(&s);
    free(im);
    free(lab);
}

/* Found by the fuzz target tests/fuzz/fuzz_idx.c: a plain file whose dimensions
 * multiply to 2^63 bytes or more (size_t holds it) overflowed the signed comparison
 * with the file's size (undefined behaviour), and the file was reported as having
 * bytes after its data instead of as truncated. */
Test(images, idx_header_of_2_63_bytes_or_more_is_truncated) {
    const uint32_t dims[][3] = {{1024, 1u << 24, 1u << 29}, /* 2^63: the fuzzer's input */
                                {4294967295u, 4294967295u, 2}}; /* 2^65 - 2^34 + 2: past size_t */
    const char *needle[] = {"truncated: the IDX header announces 9223372036854775808 bytes of data, the file holds 56",
                            "multiply past"};
    unsigned char data[56] = {0};
    for (int i = 0; i < 2; i++) {
        const char *p = P("huge-%d", i);
        write_idx(p, 0x08, 3, dims[i], data, sizeof data, false);
        img_set s;
        expect_refused(img_read_idx_images(p, &s), p, needle[i], "dimensions of 2^63 bytes or more");
    }
}

/* ---- CIFAR-10 ---- */

/* Record r: label r mod 10; channel c of pixel (y, x) = (r * 7 + c * 50 + y * 3 + x) mod 256. */
static unsigned char cifar_value(int r, int c, int y, int x) { return (unsigned char)((r * 7 + c * 50 + y * 3 + x) % 256); }

static void write_cifar(const char *path, int r0, int n) {
    unsigned char *b = malloc((size_t)n * 3073);
    for (int k = 0; k < n; k++) {
        unsigned char *rec = b + (size_t)k * 3073;
        rec[0] = (unsigned char)((r0 + k) % 10);
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < 32; y++)
                for (int x = 0; x < 32; x++) rec[1 + c * 1024 + y * 32 + x] = cifar_value(r0 + k, c, y, x);
    }
    tp_write_bytes(path, b, (size_t)n * 3073);
    free(b);
}

Test(images, cifar_reads_records_and_interleaves_the_channels) {
    const char *a = P("a.bin"), *b = P("b.bin");
    write_cifar(a, 0, 3);
    write_cifar(b, 3, 2);
    const char *paths[2] = {a, b};
    img_set s;
    cr_assert_eq(img_read_cifar(paths, 2, &s), 0, "%s", ab_error());
    cr_expect_eq(s.n, 5);
    cr_expect_eq(s.rows, 32);
    cr_expect_eq(s.cols, 32);
    cr_expect_eq(s.channels, 3);
    cr_expect_eq(s.image_bytes, 3072);
    cr_expect_eq(s.classes, 10);
    int *seq = malloc(sizeof(int) * 3072);
    for (int r = 0; r < 5; r++) {
        cr_expect_eq(s.labels[r], r % 10);
        img_raster(&s, r, seq);
        int bad = 0;
        for (int y = 0; y < 32; y++)
            for (int x = 0; x < 32; x++)
                for (int c = 0; c < 3; c++) bad += seq[(y * 32 + x) * 3 + c] != cifar_value(r, c, y, x);
        cr_expect_eq(bad, 0, "image %d: %d values out of raster order (R, G, B of each pixel in turn)", r, bad);
    }
    free(seq);
    img_set_free(&s);
}

Test(images, cifar_refuses_truncated_and_foreign_files) {
    img_set s;
    const char *good = P("good.bin"), *p = P("cut.bin");
    write_cifar(good, 0, 2);
    unsigned char *bytes;
    size_t n;
    bytes = tp_read_bytes(good, &n);
    tp_write_bytes(p, bytes, n - 100);
    const char *two[2] = {good, p};
    expect_refused(img_read_cifar(two, 2, &s), p, "1 records of 3073 bytes", "the last record 100 bytes short");
    /* CIFAR-100's records (2 label bytes): 2 records of 3074 bytes are no whole number of 3073 */
    p = P("cifar100.bin");
    unsigned char *c100 = calloc(2, 3074);
    tp_write_bytes(p, c100, 2 * 3074);
    free(c100);
    const char *one[1] = {p};
    expect_refused(img_read_cifar(one, 1, &s), p, "truncated or not CIFAR-10", "CIFAR-100 records");
    /* a label outside 0..9 */
    p = P("label.bin");
    bytes[3073] = 10;
    tp_write_bytes(p, bytes, n);
    one[0] = p;
    expect_refused(img_read_cifar(one, 1, &s), p, "record 1 has label 10", "label 10");
    free(bytes);
    p = P("empty.bin");
    tp_write_bytes(p, "", 0);
    one[0] = p;
    expect_refused(img_read_cifar(one, 1, &s), p, "empty", "empty");
    p = P("none.bin");
    one[0] = p;
    expect_refused(img_read_cifar(one, 1, &s), p, NULL, "missing");
    cr_expect_null(s.pixels);
}

/* ---- the task ---- */

static train_task *make_task(const char *json) {
    json_error_t e;
    json_t *o = json_loads(json, 0, &e);
    cr_assert_not_null(o, "bad JSON in the test: %s", e.text);
    train_task *t;
    cr_assert_eq(task_create(o, &t), 0, "%s", ab_error());
    json_decref(o);
    return t;
}

static void fill_row(const train_task *t, int split, long long index, int *tokens, int *targets, float *weights,
                     int *len) {
    t->fill(t, split, index, tokens, NULL, targets, weights, len);
}

Test(images, task_rows_splits_and_prompts_of_mnist) {
    write_mnist_fixture(P("mnist"));
    char js[1400];
    snprintf(js, sizeof js, "{\"name\": \"images\", \"dataset\": \"mnist\", \"path\": \"%s\", \"valid_rows\": %d}",
             P("mnist"), FX_VALID);
    train_task *t = make_task(js);
    cr_expect_str_eq(t->name, "images");
    cr_expect_eq(t->input, TASK_INPUT_TOKENS);
    cr_expect_eq(t->vocab, 257);
    cr_expect_eq(t->classes, 256);
    cr_expect_eq(t->seq_len, 16);
    cr_expect(t->causal);
    cr_expect_str_eq(t->head, "categorical");
    cr_expect_eq(t->mixtures, 0);
    cr_assert_eq(t->n_metrics, 2);
    cr_expect_str_eq(t->metrics[0].name, "bits_per_dim");
    cr_expect_eq(t->metrics[0].kind, TASK_METRIC_BITS);
    cr_expect_str_eq(t->metrics[1].name, "accuracy");
    cr_assert_eq(t->n_splits, 3);
    const int tr = task_split_find(t, "train"), va = task_split_find(t, "valid"), te = task_split_find(t, "test");
    cr_assert(tr >= 0 && va >= 0 && te >= 0);
    cr_expect_eq(t->split_rows[tr], FX_TRAIN - FX_VALID);
    cr_expect_eq(t->split_rows[va], FX_VALID);
    cr_expect_eq(t->split_rows[te], FX_TEST);
    /* a row: the image in raster order behind the start token, weight 1 everywhere;
     * valid row k is training image 20 + k; test row k is pattern image 100 + k */
    int tokens[16], targets[16], len;
    float w[16];
    struct {
        int split, index, image;
    } rows[] = {{tr, 0, 0}, {tr, 19, 19}, {va, 0, 20}, {va, 3, 23}, {te, 0, 100}, {te, 7, 107}};
    for (size_t k = 0; k < sizeof rows / sizeof *rows; k++) {
        fill_row(t, rows[k].split, rows[k].index, tokens, targets, w, &len);
        cr_expect_eq(len, 16);
        cr_expect_eq(tokens[0], 256);
        for (int i = 0; i < 16; i++) {
            cr_expect_eq(targets[i], pix(rows[k].image, i / 4, i % 4), "row %zu, value %d", k, i);
            if (i) cr_expect_eq(tokens[i], targets[i - 1]);
            cr_expect_eq(w[i], 1.0f);
        }
    }
    /* prompts: START and a prefix of a test image; the expected continuation is the rest */
    int prompt[16], expected[17], P_, G;
    for (int k = 0; k < 20; k++) {
        ab_rng rng = task_row_rng(5, TASK_STREAM_GEN, (uint64_t)k, 0);
        t->prompt(t, &rng, prompt, &P_, expected, &G);
        cr_assert(P_ >= 1 && P_ <= t->max_prompt && G >= 1 && G <= t->max_gen && P_ - 1 + G == 16, "P %d, G %d", P_, G);
        cr_expect_eq(prompt[0], 256);
        int whole[16];
        for (int i = 0; i < P_ - 1; i++) whole[i] = prompt[i + 1];
        for (int i = 0; i < G; i++) whole[P_ - 1 + i] = expected[i];
        int match = -1;
        for (int r = 100; r < 100 + FX_TEST && match < 0; r++) {
            bool same = true;
            for (int i = 0; i < 16; i++) same &= whole[i] == pix(r, i / 4, i % 4);
            if (same) match = r;
        }
        cr_expect_geq(match, 0, "prompt %d and its continuation are no test image", k);
    }
    /* the canonical options: every default, the split rows and the files' CRC-32 */
    json_t *c = t->to_json(t);
    cr_expect_str_eq(json_string_value(json_object_get(c, "head")), "categorical");
    cr_expect_null(json_object_get(c, "mixtures"));
    cr_expect_eq(json_integer_value(json_object_get(c, "train_rows")), 0);
    json_t *r = json_object_get(c, "rows");
    cr_expect_eq(json_integer_value(json_object_get(r, "train")), 20);
    cr_expect_eq(json_integer_value(json_object_get(r, "valid")), 4);
    cr_expect_eq(json_integer_value(json_object_get(r, "test")), 8);
    cr_expect(json_is_integer(json_object_get(json_object_get(c, "crc32"), "train")));
    /* the canonical options create the same task again */
    train_task *t2;
    cr_expect_eq(task_create(c, &t2), 0, "%s", ab_error());
    task_destroy(t2);
    json_decref(c);
    task_destroy(t);

    /* no valid split by default; train_rows and test_rows take prefixes */
    snprintf(js, sizeof js,
             "{\"name\": \"images\", \"dataset\": \"fashion-mnist\", \"path\": \"%s\", \"train_rows\": 10,"
             " \"test_rows\": 3, \"head\": \"logistic_mixture\", \"mixtures\": 5}",
             P("mnist"));
    t = make_task(js);
    cr_expect_eq(t->n_splits, 2);
    cr_expect_eq(task_split_find(t, "valid"), -1);
    cr_expect_eq(t->split_rows[task_split_find(t, "train")], 10);
    cr_expect_eq(t->split_rows[task_split_find(t, "test")], 3);
    cr_expect_str_eq(t->head, "logistic_mixture");
    cr_expect_eq(t->mixtures, 5);
    cr_expect_eq(t->n_metrics, 1, "bits_per_dim only with the mixture head");
    c = t->to_json(t);
    cr_expect_eq(json_integer_value(json_object_get(c, "mixtures")), 5);
    cr_expect_str_eq(json_string_value(json_object_get(c, "dataset")), "fashion-mnist");
    json_decref(c);
    task_destroy(t);
}

Test(images, task_reads_cifar10_with_interleaved_channels) {
    mkdir(P("cifar"), 0755);
    for (int i = 1; i <= 5; i++) write_cifar(P("cifar/data_batch_%d.bin", i), 2 * (i - 1), 2);
    write_cifar(P("cifar/test_batch.bin"), 50, 3);
    char js[1400];
    snprintf(js, sizeof js, "{\"name\": \"images\", \"dataset\": \"cifar10\", \"path\": \"%s\", \"valid_rows\": 1}",
             P("cifar"));
    train_task *t = make_task(js);
    cr_expect_eq(t->seq_len, 3072);
    cr_expect_eq(t->split_rows[task_split_find(t, "train")], 9);
    cr_expect_eq(t->split_rows[task_split_find(t, "valid")], 1);
    cr_expect_eq(t->split_rows[task_split_find(t, "test")], 3);
    int *tok = malloc(sizeof(int) * 3072), *tgt = malloc(sizeof(int) * 3072), len;
    float *w = malloc(sizeof(float) * 3072);
    struct {
        const char *split;
        int index, record;
    } rows[] = {{"train", 0, 0}, {"train", 8, 8}, {"valid", 0, 9}, {"test", 2, 52}};
    for (size_t k = 0; k < sizeof rows / sizeof *rows; k++) {
        fill_row(t, task_split_find(t, rows[k].split), rows[k].index, tok, tgt, w, &len);
        int bad = 0;
        for (int q = 0; q < 1024; q++)
            for (int c = 0; c < 3; c++) bad += tgt[3 * q + c] != cifar_value(rows[k].record, c, q / 32, q % 32);
        for (int i = 1; i < 3072; i++) bad += tok[i] != tgt[i - 1];
        cr_expect_eq(bad, 0, "%s row %d: %d values wrong", rows[k].split, rows[k].index, bad);
        cr_expect_eq(tok[0], 256);
        cr_expect_eq(len, 3072);
    }
    free(tok);
    free(tgt);
    free(w);
    task_destroy(t);
    /* a truncated batch file is one line naming it */
    unsigned char *bytes;
    size_t n;
    bytes = tp_read_bytes(P("cifar/data_batch_3.bin"), &n);
    tp_write_bytes(P("cifar/data_batch_3.bin"), bytes, n - 1);
    free(bytes);
    json_t *o = json_loads(js, 0, NULL);
    expect_refused(task_create(o, &t), P("cifar/data_batch_3.bin"), "truncated", "task on a truncated batch");
    json_decref(o);
}

/* ---- a uniform model scores 8 bits/dim ---- */

Test(images, a_uniform_model_scores_8_bits_per_dim) {
    /* The head's weights and biases zeroed: every logit is exactly 0 (0 times a finite
     * activation, plus 0), so every value has probability 1/256 and its NLL is ln 256.
     * The CPU's cross-entropy computes log(sum exp(0)) = log(256) in double and stores
     * each position's NLL as a float: ln 256 rounded to float has a relative error of
     * at most 2^-24, and the mean over the split is summed in double (exact to ~1e-15
     * here). So bits/dim = 8 (1 + d), |d| <= 2^-24: within 8 x 2^-24 = 4.8e-7 of 8;
     * the tolerance is 1e-6. With equal logits the first argmax is value 0, so accuracy
     * is the fraction of values that are 0. */
    write_mnist_fixture(P("mnist"));
    char js[2000];
    snprintf(js, sizeof js,
             "{\"name\": \"u\", \"task\": {\"name\": \"images\", \"dataset\": \"mnist\", \"path\": \"%s\","
             " \"valid_rows\": 4},"
             " \"model\": {\"d_model\": 16, \"heads\": 2, \"layers\": 1, \"d_ff\": 16,"
             "            \"attention\": {\"variant\": \"linear\"}},"
             " \"steps\": 1, \"batch\": 3, \"seed\": 11}",
             P("mnist"));
    json_t *root = json_loads(js, 0, NULL);
    cr_assert_not_null(root);
    train_config cfg;
    cr_assert_eq(train_config_parse(root, &cfg), 0, "%s", ab_error());
    json_decref(root);
    trainer *tr;
    cr_assert_eq(trainer_create(&cfg, &tr), 0, "%s", ab_error());
    size_t np = tf_param_count(tr->model);
    float *p = malloc(sizeof(float) * np);
    cr_assert_eq(tf_params_download(tr->model, p), 0, "%s", ab_error());
    int zeroed = 0;
    for (int i = 0; i < tf_param_tensor_count(tr->model); i++) {
        const tf_tensor *x = tf_param_tensor(tr->model, i);
        if (strncmp(x->name, "head.", 5) == 0) {
            memset(p + x->offset, 0, sizeof(float) * x->count);
            zeroed++;
        }
    }
    cr_assert_eq(zeroed, 2, "the categorical head is a weight and a bias");
    cr_assert_eq(tf_params_upload(tr->model, p), 0, "%s", ab_error());
    free(p);
    const train_task *task = tr->cfg.task;
    const char *splits[3] = {"train", "valid", "test"};
    const int first[3] = {0, 20, 100}, nrows[3] = {20, 4, 8};
    for (int k = 0; k < 3; k++) {
        int sp = task_split_find(task, splits[k]);
        train_eval_info e;
        cr_assert_eq(trainer_eval(tr, sp, 0, &e), 0, "%s", ab_error());
        cr_expect_eq(e.rows, nrows[k]);
        cr_expect_eq(e.counted, 16LL * nrows[k]);
        cr_expect_lt(fabs(e.metrics[0] - 8.0), 1e-6, "%s: bits/dim %.12g", splits[k], e.metrics[0]);
        cr_expect_lt(fabs(e.loss - log(256.0)), 1e-6 * log(256.0), "%s: loss %.12g", splits[k], e.loss);
        int zeros = 0;
        for (int r = first[k]; r < first[k] + nrows[k]; r++)
            for (int i = 0; i < 16; i++) zeros += pix(r, i / 4, i % 4) == 0;
        cr_expect_eq(e.metrics[1], (double)zeros / (16.0 * nrows[k]), "%s: accuracy %g", splits[k], e.metrics[1]);
    }
    trainer_destroy(tr);
}

/* ---- training through the CLI ---- */

/* 20 training rows in batches of 5 (4 steps an epoch), 6 epochs, evaluation on the
 * 4 valid rows every 4 steps, the 8 test rows at the end. */
static const char *fixture_config(const char *head) {
    write_mnist_fixture(P("mnist"));
    char text[2000];
    snprintf(text, sizeof text,
             "{\"name\": \"img\", \"task\": {\"name\": \"images\", \"dataset\": \"mnist\", \"path\": \"%s\","
             " \"valid_rows\": %d%s},"
             " \"model\": {\"d_model\": 16, \"heads\": 2, \"layers\": 1, \"d_ff\": 16, \"dropout\": 0.1,"
             "            \"attention\": {\"variant\": \"linear\"}},"
             " \"optim\": {\"kind\": \"radam\", \"lr\": 0.05}, \"epochs\": 6, \"batch\": 5,"
             " \"eval_every\": 4, \"eval_split\": \"valid\", \"test_split\": \"test\","
             " \"checkpoint_every\": 4, \"log_every\": 4, \"seed\": 7}",
             P("mnist"), FX_VALID, head);
    tp_write_bytes(P("img.json"), text, strlen(text));
    return P("img.json");
}

Test(images, trains_resumes_bit_for_bit_and_generates) {
    const char *cfg = fixture_config("");
    cr_assert_eq(run("train", cfg, "--out", P("a"), "--quiet"), 0, "%s", g_err);
    json_t *doc = load(P("a/train.json")), *first, *last, *test, *tlast;
    cr_expect_str_eq(json_string_value(json_object_get(doc, "status")), "ok");
    cr_expect_eq(json_array_size(json_object_get(doc, "step_loss")), 24, "6 epochs of 20 rows in batches of 5");
    records(doc, "eval", &first, &last);
    records(doc, "test", &test, &tlast);
    cr_expect_eq(num(last, "step"), 24);
    cr_expect_eq(num(last, "eval_rows"), 4);
    cr_expect_eq(num(last, "eval_positions"), 64, "4 valid images of 16 values");
    cr_expect_eq(num(test, "test_rows"), 8);
    /* bits/dim = mean NLL / ln 2; the loss falls well below the 8 bits of a uniform
     * guess on this pattern */
    double b0 = num(first, "eval_bits_per_dim"), b1 = num(last, "eval_bits_per_dim");
    cr_expect_lt(fabs(b1 - num(last, "eval_loss") / log(2.0)), 1e-6 * b1);
    cr_expect_lt(b1, 0.7 * b0, "eval bits/dim %g -> %g", b0, b1);
    cr_expect(isfinite(num(last, "eval_accuracy")));
    json_t *sum = json_object_get(doc, "summary");
    cr_expect_eq(num(sum, "test_bits_per_dim"), num(test, "test_bits_per_dim"));
    /* the canonical config records the data: split rows and CRC-32s */
    json_t *task = json_object_get(json_object_get(doc, "config"), "task");
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(task, "rows"), "valid")), 4);
    cr_expect(json_is_integer(json_object_get(json_object_get(task, "crc32"), "test")));
    json_decref(doc);

    /* stopped in the middle of the third epoch (10 steps), resumed to 6 epochs */
    cr_assert_eq(run("train", cfg, "--out", P("b"), "--quiet", "--set", "epochs=2.5"), 0, "%s", g_err);
    cr_assert_eq(run("train", "--resume", "--out", P("b"), "--quiet", "--set", "epochs=6"), 0, "%s", g_err);
    expect_same_state(P("a/checkpoint.bin"), P("b/checkpoint.bin"), "images resumed at step 10");

    /* the CUDA backend (emulated): the CPU's losses to float rounding (1e-4 relative,
     * as train_data), and its own resume bit for bit */
    g_exe = ATTNBENCH_EMU_EXE;
    cr_assert_eq(run("train", cfg, "--out", P("c"), "--quiet", "--device", "cuda"), 0, "%s", g_err);
    cr_assert_eq(run("train", cfg, "--out", P("d"), "--quiet", "--device", "cuda", "--set", "steps=7"), 0, "%s", g_err);
    cr_assert_eq(run("train", "--resume", "--out", P("d"), "--quiet", "--device", "cuda", "--set", "epochs=6"), 0, "%s",
                 g_err);
    g_exe = ATTNBENCH_EXE;
    expect_same_state(P("c/checkpoint.bin"), P("d/checkpoint.bin"), "CUDA images resumed at step 7");
    size_t na, nb;
    double *la = step_losses(P("a/train.json"), &na), *lc = step_losses(P("c/train.json"), &nb);
    cr_assert_eq(na, nb);
    double worst = 0;
    for (size_t i = 0; i < na; i++) worst = fmax(worst, fabs(la[i] - lc[i]) / fabs(la[i]));
    cr_expect_lt(worst, 1e-4, "CUDA vs CPU step losses differ by %g relative", worst);
    free(la);
    free(lc);

    /* generation: prompts are prefixes of test images */
    cr_assert_eq(run("generate", P("a/checkpoint.bin"), "--n", "3"), 0, "%s", g_err);
    json_t *g = json_loads(g_out, 0, NULL);
    cr_assert_not_null(g, "generate: not JSON: %s", g_out);
    cr_expect_str_eq(json_string_value(json_object_get(g, "task")), "images");
    cr_expect_eq(json_integer_value(json_object_get(g, "prompts")), 3);
    json_decref(g);

    /* a resume on changed data is refused: one pixel of the test file changed (same
     * counts: the CRC-32 tells), then one training image more (the rows tell) */
    unsigned char *bytes;
    size_t n;
    const char *tp = P("mnist/t10k-images-idx3-ubyte");
    bytes = tp_read_bytes(tp, &n);
    bytes[n - 1] ^= 1;
    tp_write_bytes(tp, bytes, n);
    int st = run("train", "--resume", "--out", P("b"), "--set", "epochs=8");
    tp_usage_error(st, g_err, "resume on a changed test file", TP_ARGV("crc32", NULL));
    bytes[n - 1] ^= 1;
    tp_write_bytes(tp, bytes, n);
    free(bytes);
    unsigned char *im = fixture_images(FX_TRAIN + 1, FX_SIDE, FX_SIDE), *lab = fixture_labels(FX_TRAIN + 1);
    uint32_t d3[3] = {FX_TRAIN + 1, FX_SIDE, FX_SIDE}, d1[1] = {FX_TRAIN + 1};
    write_idx(P("mnist/train-images-idx3-ubyte.gz"), 0x08, 3, d3, im, (FX_TRAIN + 1) * 16, true);
    write_idx(P("mnist/train-labels-idx1-ubyte.gz"), 0x08, 1, d1, lab, FX_TRAIN + 1, true);
    free(im);
    free(lab);
    st = run("train", "--resume", "--out", P("b"), "--set", "epochs=8");
    tp_usage_error(st, g_err, "resume on more training images", TP_ARGV("rows", NULL));
}

Test(images, bad_data_and_configs_are_one_line_exit_2) {
    const char *cfg = fixture_config("");
    struct {
        const char *set, *needle;
    } cases[] = {
        {"task.dataset=svhn", "svhn"},
        {"task.head=gaussian", "gaussian"},
        {"task.mixtures=5", "mixtures"},       /* with the categorical head */
        {"task.valid_rows=24", "valid_rows"},  /* the whole training file */
        {"task.train_rows=21", "train_rows"},  /* 20 left after valid_rows */
        {"task.test_rows=9", "test_rows"},
        {"task.path=/nonexistent-attnbench", "nonexistent-attnbench"},
        {"task.colour=true", "colour"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *out = P("bad%zu", i);
        int st = run("train", cfg, "--out", out, "--set", cases[i].set);
        tp_usage_error(st, g_err, cases[i].set, TP_ARGV(cases[i].needle, NULL));
        cr_expect(!tp_exists(out), "%s: %s was made", cases[i].set, out);
    }
    /* bad files: a truncated compressed image file, labels of another count, a missing
     * test file */
    const char *ip = P("mnist/train-images-idx3-ubyte.gz");
    unsigned char *bytes;
    size_t n;
    bytes = tp_read_bytes(ip, &n);
    tp_write_bytes(ip, bytes, n - 20);
    int st = run("train", cfg, "--out", P("t1"));
    tp_usage_error(st, g_err, "truncated training images", TP_ARGV(ip, NULL));
    tp_write_bytes(ip, bytes, n);
    free(bytes);
    uint32_t d1[1] = {FX_TEST - 1};
    unsigned char *lab = fixture_labels(FX_TEST);
    const char *lp = P("mnist/t10k-labels-idx1-ubyte");
    write_idx(lp, 0x08, 1, d1, lab, FX_TEST - 1, false);
    free(lab);
    st = run("train", cfg, "--out", P("t2"));
    tp_usage_error(st, g_err, "7 labels for 8 test images", TP_ARGV(lp, "7 labels", NULL));
    remove(lp);
    st = run("train", cfg, "--out", P("t3"));
    tp_usage_error(st, g_err, "no test labels", TP_ARGV(lp, "missing", NULL));
}

Test(images, the_logistic_mixture_head_trains_and_samples) {
    /* The run trains and reports bits/dim (no accuracy metric with the mixture head);
     * `attnbench sample` then draws images from it: the same images in recurrent and
     * recompute mode and at another batch (the draws are a pure function of the seed,
     * the image and the position), a grid PNG, and completions that keep the prompt. */
    const char *cfg = fixture_config(", \"head\": \"logistic_mixture\", \"mixtures\": 3");
    int st = run("train", cfg, "--out", P("m"), "--quiet", "--set", "epochs=1");
    cr_assert_eq(st, 0, "%s", g_err);
    char ck[4096]; /* P's buffers are reused */
    snprintf(ck, sizeof ck, "%s", P("m/checkpoint.bin"));
    const char *modes[3][3] = {{"recurrent", "4", "sr"}, {"recompute", "4", "sc"}, {"recurrent", "2", "s2"}};
    ab_array a[3];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(run("sample", ck, "--n", "4", "--batch", modes[i][1], "--mode", modes[i][0], "--out",
                         P("%s", modes[i][2])),
                     0, "%s", g_err);
        cr_assert_eq(ab_npy_read(P("%s/samples.npy", modes[i][2]), &a[i]), 0, "%s", ab_error());
        cr_assert(a[i].ndim == 4 && a[i].shape[0] == 4 && a[i].shape[3] == 1, "samples (K, H, W, C)");
        cr_expect(tp_exists(P("%s/samples.png", modes[i][2])), "no grid drawn");
    }
    cr_expect(memcmp(a[0].data, a[1].data, a[0].count * 4) == 0, "recurrent and recompute samples differ");
    cr_expect(memcmp(a[0].data, a[2].data, a[0].count * 4) == 0, "batch 4 and batch 2 samples differ");
    for (size_t i = 0; i < a[0].count; i++) cr_assert(((int *)a[0].data)[i] >= 0 && ((int *)a[0].data)[i] < 256);
    /* the CUDA backend (emulated, its fused recurrent step): the CPU's images, in both
     * modes (the logits agree to float rounding, far from where a draw would change) */
    const char *exe0 = g_exe;
    g_exe = ATTNBENCH_EMU_EXE;
    for (int i = 0; i < 2; i++) {
        ab_array d;
        cr_assert_eq(run("sample", ck, "--n", "4", "--batch", "4", "--mode", modes[i][0], "--device", "cuda", "--out",
                         P("cuda-%s", modes[i][2])),
                     0, "%s", g_err);
        cr_assert_eq(ab_npy_read(P("cuda-%s/samples.npy", modes[i][2]), &d), 0, "%s", ab_error());
        cr_expect(d.count == a[0].count && memcmp(d.data, a[0].data, a[0].count * 4) == 0,
                  "%s samples on the device differ from the CPU's", modes[i][0]);
        ab_array_free(&d);
    }
    g_exe = exe0;
    for (int i = 0; i < 3; i++) ab_array_free(&a[i]);
    cr_assert_eq(run("sample", ck, "--n", "2", "--complete", "0.5", "--out", P("cmp")), 0, "%s", g_err);
    ab_array s, o;
    cr_assert_eq(ab_npy_read(P("cmp/samples.npy"), &s), 0, "%s", ab_error());
    cr_assert_eq(ab_npy_read(P("cmp/originals.npy"), &o), 0, "%s", ab_error());
    size_t per = s.count / 2;
    for (int r = 0; r < 2; r++)
        cr_expect(memcmp((int *)s.data + r * per, (int *)o.data + r * per, sizeof(int) * (per / 2)) == 0,
                  "completion %d changed its prompt", r);
    ab_array_free(&s);
    ab_array_free(&o);
    st = run("sample", ck, "--temperature", "0.5", "--out", P("t"));
    tp_usage_error(st, g_err, "a mixture at T 0.5", TP_ARGV("mixture", NULL));
    json_t *doc = load(P("m/train.json")), *first, *last;
    records(doc, "eval", &first, &last);
    cr_expect(isfinite(num(last, "eval_bits_per_dim")));
    cr_expect_null(json_object_get(last, "eval_accuracy"));
    json_t *task = json_object_get(json_object_get(doc, "config"), "task");
    cr_expect_eq(json_integer_value(json_object_get(task, "mixtures")), 3);
    json_decref(doc);
}

/* A checkpoint of a run that diverged (its parameters hold a NaN and an infinity) has
 * no model to run: `sample` refuses it in one line, exit 2 (it wrote images of zeros
 * and exited 0: issue 28); so do `generate` and `decode`, which load it the same way. */
Test(images, a_checkpoint_with_non_finite_parameters_is_refused) {
    const char *cfg = fixture_config("");
    cr_assert_eq(run("train", cfg, "--out", P("r"), "--quiet", "--set", "steps=1"), 0, "%s", g_err);
    char ck[4096], bad[4096];
    snprintf(ck, sizeof ck, "%s", P("r/checkpoint.bin"));
    snprintf(bad, sizeof bad, "%s", P("r/diverged.bin"));
    ab_ckpt_reader *r;
    ab_ckpt_writer *w;
    cr_assert_eq(ab_ckpt_open(ck, &r), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_begin(bad, &w), 0, "%s", ab_error());
    for (int i = 0; i < ab_ckpt_count(r); i++) { /* every blob as it is, the parameters spoilt */
        const char *name = ab_ckpt_name(r, i);
        const void *p;
        size_t n;
        cr_assert_eq(ab_ckpt_get(r, name, &p, &n), 0);
        if (strcmp(name, AB_CKPT_PARAMS) == 0) {
            float *x = malloc(n);
            memcpy(x, p, n);
            x[3] = NAN;
            x[n / sizeof(float) - 1] = INFINITY;
            cr_assert_eq(ab_ckpt_add(w, name, x, n), 0);
            free(x);
        } else {
            cr_assert_eq(ab_ckpt_add(w, name, p, n), 0);
        }
    }
    cr_assert_eq(ab_ckpt_commit(w), 0, "%s", ab_error());
    ab_ckpt_close(r);
    int st = run("sample", bad, "--n", "2", "--out", P("s"));
    tp_usage_error(st, g_err, "sample of a diverged run", TP_ARGV("diverged.bin", "2 of its", "not finite", NULL));
    cr_expect(!tp_exists(P("s")), "a refused sample wrote its folder");
    st = run("generate", bad, "--n", "1");
    tp_usage_error(st, g_err, "generate from a diverged run", TP_ARGV("not finite", NULL));
    cr_expect_eq(run("sample", ck, "--n", "2", "--out", P("s")), 0, "the checkpoint it came from samples: %s", g_err);
}

/* The samples of a run folder's samples.npy as a heap array (caller frees). */
static ab_array read_samples(const char *dir) {
    ab_array a;
    cr_assert_eq(ab_npy_read(P("%s/samples.npy", dir), &a), 0, "%s", ab_error());
    return a;
}

Test(images, sample_takes_a_config_a_stand_in_variant_and_estimates_speed) {
    /* --config samples from the model the config initialises (speed on a model's shape
     * needs no training); --variant stateful-softmax runs softmax's weights with its
     * key/value cache: the same function, so the same images as softmax's recomputation;
     * --estimate times single positions and writes no images. */
    char cfg[1100]; /* P()'s buffers are reused */
    snprintf(cfg, sizeof cfg, "%s", fixture_config(""));
    cr_assert_eq(run("sample", "--config", cfg, "--set", "model.attention.variant=softmax", "--n", "2", "--out",
                     P("soft")),
                 0, "%s", g_err);
    cr_assert_eq(run("sample", "--config", cfg, "--set", "model.attention.variant=softmax", "--variant",
                     "stateful-softmax", "--n", "2", "--batch", "2", "--out", P("kv")),
                 0, "%s", g_err);
    json_t *d = load(P("kv/sample.json"));
    cr_expect_str_eq(json_string_value(json_object_get(d, "weights")), "initialised");
    cr_expect(json_is_null(json_object_get(d, "step")), "an initialised model has no step");
    cr_expect_str_eq(json_string_value(json_object_get(d, "variant")), "stateful-softmax");
    cr_expect_str_eq(json_string_value(json_object_get(d, "mode")), "recurrent");
    cr_expect_str_eq(json_string_value(json_object_get(d, "method")), "sampled");
    json_decref(d);
    ab_array a = read_samples("soft"), b = read_samples("kv");
    cr_assert_eq(a.count, b.count);
    cr_expect(memcmp(a.data, b.data, a.count * 4) == 0, "stateful-softmax's samples differ from softmax's");
    ab_array_free(&a);
    ab_array_free(&b);

    /* from a trained checkpoint too (the run's variant is linear: only softmax and
     * stateful-softmax stand in for each other) */
    cr_assert_eq(run("train", cfg, "--out", P("lin"), "--quiet", "--set", "epochs=1"), 0, "%s", g_err);
    int st = run("sample", P("lin/checkpoint.bin"), "--variant", "stateful-softmax", "--out", P("x1"));
    tp_usage_error(st, g_err, "linear weights run as stateful-softmax", TP_ARGV("stand in", NULL));
    cr_assert_eq(run("sample", P("lin/checkpoint.bin"), "--variant", "linear", "--n", "1", "--out", P("x2")), 0, "%s",
                 g_err);
    d = load(P("x2/sample.json"));
    cr_expect_str_eq(json_string_value(json_object_get(d, "weights")), "trained");
    cr_expect_eq(json_integer_value(json_object_get(d, "step")), 4, "the checkpoint's step");
    json_decref(d);

    /* the estimate: value j timed at j = 0, 5, 10 and the last (15), integrated over all
     * 16 positions: between 16 times the cheapest and 16 times the dearest */
    for (int m = 0; m < 2; m++) {
        const char *out = P("est%d", m);
        cr_assert_eq(run("sample", "--config", cfg, "--estimate", "5", "--batch", "2", "--mode",
                         m ? "recompute" : "recurrent", "--out", out),
                     0, "%s", g_err);
        d = load(P("est%d/sample.json", m));
        cr_expect_str_eq(json_string_value(json_object_get(d, "method")), "estimated");
        json_t *e = json_object_get(d, "estimate"), *pos = json_object_get(e, "positions"),
               *secs = json_object_get(e, "seconds"), *cpus = json_object_get(e, "cpu_seconds");
        cr_assert_eq(json_array_size(pos), 4);
        cr_assert_eq(json_array_size(secs), 4);
        cr_assert_eq(json_array_size(cpus), 4);
        const int want[4] = {0, 5, 10, 15};
        double lo = INFINITY, hi = 0, clo = INFINITY, chi = 0;
        for (int i = 0; i < 4; i++) {
            cr_expect_eq(json_integer_value(json_array_get(pos, i)), want[i]);
            double s = json_number_value(json_array_get(secs, i)), c = json_number_value(json_array_get(cpus, i));
            cr_expect_gt(s, 0);
            cr_expect_geq(c, 0); /* the clock's tick may exceed a tiny model's step */
            lo = fmin(lo, s);
            hi = fmax(hi, s);
            clo = fmin(clo, c);
            chi = fmax(chi, c);
        }
        /* the CPU time integrated the same way (the same bounds, on its own medians) */
        const double cpu = num(d, "cpu_s");
        cr_expect(cpu >= 16 * clo * (1 - 1e-12) && cpu <= 16 * chi * (1 + 1e-12), "cpu %g outside [%g, %g]", cpu,
                  16 * clo, 16 * chi);
        cr_expect_eq(num(d, "cpu_s_per_image"), cpu / 2);
        double total = num(d, "wall_s");
        cr_expect(total >= 16 * lo * (1 - 1e-12) && total <= 16 * hi * (1 + 1e-12), "estimate %g outside [%g, %g]",
                  total, 16 * lo, 16 * hi);
        cr_expect_eq(num(d, "s_per_image"), total / 2, "batch 2: two images per pass");
        cr_expect(!tp_exists(P("est%d/samples.npy", m)), "an estimate wrote samples");
        json_decref(d);
    }

    /* refused: both a checkpoint and a config, --set without --config, --estimate with
     * --complete, a variant that computes something else */
    st = run("sample", P("lin/checkpoint.bin"), "--config", cfg, "--out", P("r1"));
    tp_usage_error(st, g_err, "checkpoint and config", TP_ARGV("exclude", NULL));
    st = run("sample", P("lin/checkpoint.bin"), "--set", "seed=2", "--out", P("r2"));
    tp_usage_error(st, g_err, "--set without --config", TP_ARGV("--set", NULL));
    st = run("sample", "--config", cfg, "--estimate", "4", "--complete", "0.5", "--out", P("r3"));
    tp_usage_error(st, g_err, "--estimate with --complete", TP_ARGV("exclude", NULL));
    st = run("sample", "--config", cfg, "--variant", "lsh", "--out", P("r4"));
    tp_usage_error(st, g_err, "linear run as lsh", TP_ARGV("lsh", "stand in", NULL));
    st = run("sample", "--config", cfg, "--set", "model.layerz=2", "--out", P("r5"));
    tp_usage_error(st, g_err, "a misspelt --set key", TP_ARGV("layerz", NULL));
}

/* The lines of `text` that start with `prefix`. */
static int lines_starting(const char *text, const char *prefix) {
    int n = 0;
    for (const char *l = text; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l))
        n += strncmp(l, prefix, strlen(prefix)) == 0;
    return n;
}

/* Item 10 of the GPU issue: on a GPU machine without gnuplot, sample measured, failed
 * to draw its grid and exited 1 before writing sample.json. Now the arrays, the grid's
 * data and the document come first; the grid that cannot be drawn (no gnuplot, or one
 * that writes half a figure and fails) is one warning line, exit status 0, and a grid
 * already there is left as it was. */
Test(images, sample_without_gnuplot_keeps_its_measurement) {
    char cfg[1100], env[1200];
    snprintf(cfg, sizeof cfg, "%s", fixture_config(""));
    for (int failing = 0; failing < 2; failing++) {
        tp_env_without_gnuplot(env, sizeof env, g_dir, failing);
        const char *old = "the grid of an earlier run";
        if (failing) tp_write_bytes(P("s/samples.png"), old, strlen(old));
        const char *seed = failing ? "5" : "4";
        int st = tp_run(g_dir, g_exe, env,
                        TP_ARGV("--threads", "1", "sample", "--config", cfg, "--n", "4", "--batch", "2", "--seed", seed,
                                "--out", P("s"), NULL),
                        &g_out, &g_err);
        cr_assert_eq(st, 0, "sample with %s: exit status %d: %s", failing ? "a failing gnuplot" : "no gnuplot", st,
                     g_err);
        cr_expect_eq(lines_starting(g_err, "attnbench: warning: "), 1, "%s", g_err);
        cr_expect_eq(lines_starting(g_err, "attnbench: error"), 0, "%s", g_err);
        cr_expect(strstr(g_err, "samples.png not drawn: ") &&
                      strstr(g_err, failing ? "exited with status 1" : "gnuplot could not be started"),
                  "%s", g_err);
        json_t *d = load(P("s/sample.json"));
        cr_expect_str_eq(json_string_value(json_object_get(d, "schema")), "attnbench/sample/1");
        cr_expect_str_eq(json_string_value(json_object_get(d, "method")), "sampled");
        cr_expect_eq(num(d, "seed"), failing ? 5 : 4, "sample.json is this run's");
        cr_expect_eq(num(d, "n"), 4);
        cr_expect_eq(num(d, "batch"), 2);
        cr_expect_gt(num(d, "images_per_s"), 0);
        cr_expect(json_is_object(json_object_get(d, "machine")));
        json_decref(d);
        ab_array a = read_samples("s");
        cr_expect(a.ndim == 4 && a.shape[0] == 4, "samples (4, H, W, C)");
        ab_array_free(&a);
        cr_expect(tp_exists(P("s/samples.grid.tsv")), "the grid's data is written");
        if (failing) {
            char *png = tp_slurp(P("s/samples.png"), NULL);
            cr_expect_str_eq(png, old, "a failed drawing replaced the grid already there");
            free(png);
        } else {
            cr_expect_not(tp_exists(P("s/samples.png")));
        }
        char ls[1200];
        snprintf(ls, sizeof ls, "ls '%s/s' | grep -q '[.]tmp[.]'", g_dir);
        cr_expect_neq(system(ls), 0, "a temporary file was left in %s/s", g_dir);
    }
}
