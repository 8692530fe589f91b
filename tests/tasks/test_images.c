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
#include "test_images.h"

char g_dir[600];
char *g_out, *g_err;
const char *g_exe = ATTNBENCH_EXE;

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

/* ---- writing files ---- */

static void write_gz(const char *path, const void *data, size_t n) {
    gzFile gz = gzopen(path, "wb");
    cr_assert_not_null(gz, "cannot write %s", path);
    cr_assert_eq(gzwrite(gz, data, (unsigned)n), (int)n);
    cr_assert_eq(gzclose(gz), Z_OK);
}

/* An IDX file: magic 00 00 type ndim, big-endian dims, then `n` data bytes (which
 * need not match the dims: the tests write bad files too). */
void write_idx(const char *path, int type, int ndim, const uint32_t *dims, const unsigned char *data, size_t n,
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

unsigned char *fixture_images(int n, int rows, int cols) {
    unsigned char *p = malloc((size_t)n * rows * cols);
    for (int r = 0; r < n; r++)
        for (int y = 0; y < rows; y++)
            for (int x = 0; x < cols; x++) p[((size_t)r * rows + y) * cols + x] = pix(r, y, x);
    return p;
}

unsigned char *fixture_labels(int n) {
    unsigned char *l = malloc((size_t)n);
    for (int r = 0; r < n; r++) l[r] = (unsigned char)(r % 10);
    return l;
}

/* A 4 x 4 "MNIST" folder: 24 training images (gzip-compressed files) and 8 test
 * images (plain files). */
void write_mnist_fixture(const char *dir) {
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
