/* experiments/tasks/speech/kaldi_ark.c: a Kaldi binary archive of matrices on any bytes, read
 * the three ways the speech experiment reads one:
 *
 *   1. record by record (ka_reader_open, ka_reader_next), as an archive;
 *   2. each record's object again at the offset the reader gave for it (ka_read_at, as
 *      a feats.scp line ARCHIVE:OFFSET points into an archive): the same matrix, bit
 *      for bit;
 *   3. the object at offset 0 (ka_read_at, a file holding one matrix).
 *
 * A refusal is never out of memory (a size announced is checked against the file before
 * it is allocated). An accepted matrix has a known format, rows and columns >= 1 and finite values; a
 * float matrix ("FM") holds exactly the object's bytes and a double one ("DM") their
 * conversion; a compressed one ("CM", "CM2", "CM3") values within its header's range
 * [min, min + range] (up to the rounding of the decoding). The matrices read in (1)
 * are written again with the archive writer (ka_writer_*) and read back: the same
 * keys and values. */
#include "error.h"
#include "fuzz_util.h"
#include "kaldi_ark.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_RECORDS = 64 }; /* records followed through (2) and the rewrite; the rest are only read */

typedef struct {
    char key[4097];
    long long offset;
    ka_matrix m;
} record;

static float f32_at(const uint8_t *b) {
    float x;
    memcpy(&x, b, 4);
    return x;
}

static double f64_at(const uint8_t *b) {
    double x;
    memcpy(&x, b, 8);
    return x;
}

/* What every accepted matrix satisfies; `at` is the offset of its object in the input. */
static void check_matrix(const ka_matrix *m, const uint8_t *data, size_t size, long long at, const char *what) {
    if (m->rows < 1 || m->cols < 1 || !m->data)
        fuzz_fail(what, "accepted a %d x %d matrix at offset %lld", m->rows, m->cols, at);
    const size_t count = (size_t)m->rows * (size_t)m->cols;
    for (size_t i = 0; i < count; i++)
        if (!isfinite(m->data[i])) fuzz_fail(what, "value %zu (%g) is not finite", i, (double)m->data[i]);
    if (at < 0 || (size_t)at + 2 > size || data[at] != 0 || data[at + 1] != 'B')
        fuzz_fail(what, "accepted an object at offset %lld that does not start \\0B", at);
    const uint8_t *o = data + at;
    const size_t left = size - (size_t)at;
    if (strcmp(m->format, "FM") == 0 || strcmp(m->format, "DM") == 0) {
        /* "\0BFM " 4 rows 4 cols: 15 bytes, then the values */
        const size_t w = m->format[0] == 'F' ? 4 : 8;
        if (left < 15 + w * count || memcmp(o + 2, m->format, 2) != 0 || o[4] != ' ')
            fuzz_fail(what, "a %s matrix of %zu values from %zu bytes", m->format, count, left);
        for (size_t i = 0; i < count; i++) {
            float want = w == 4 ? f32_at(o + 15 + 4 * i) : (float)f64_at(o + 15 + 8 * i);
            if (memcmp(&want, &m->data[i], 4) != 0)
                fuzz_fail(what, "%s value %zu is %g, its bytes say %g", m->format, i, (double)m->data[i], (double)want);
        }
    } else if (strcmp(m->format, "CM") == 0 || strcmp(m->format, "CM2") == 0 || strcmp(m->format, "CM3") == 0) {
        const size_t tok = strlen(m->format) + 1; /* the token and its space */
        if (left < 2 + tok + 16 || memcmp(o + 2, m->format, tok - 1) != 0 || o[2 + tok - 1] != ' ')
            fuzz_fail(what, "a %s matrix from %zu bytes", m->format, left);
        const double gmin = f32_at(o + 2 + tok), range = f32_at(o + 2 + tok + 4);
        const double lo = fmin(gmin, gmin + range), hi = fmax(gmin, gmin + range);
        /* The decoding computes in float: min + (range / 65535) q, and CM interpolates
         * between such values; each step rounds to within an ulp or two of the largest
         * magnitude involved, so 1e-5 of it is far more than the rounding and far less
         * than any decoding error of layout (a wrong byte moves a value by range / 255). */
        const double tol = 1e-5 * (fabs(gmin) + fabs(range)) + 1e-30;
        for (size_t i = 0; i < count; i++)
            if (m->data[i] < lo - tol || m->data[i] > hi + tol)
                fuzz_fail(what, "%s value %zu is %g, outside its header's range [%g, %g]", m->format, i,
                          (double)m->data[i], lo, hi);
    } else {
        fuzz_fail(what, "accepted a matrix of format '%.4s'", m->format);
    }
}

/* A refusal: besides fuzz_refused's checks, never out of memory (the input is small,
 * and every size a header announces is checked against the file before it is
 * allocated). */
static void refused(int rc, const char *what) {
    fuzz_refused(rc, what);
    if (rc == AB_ENOMEM) fuzz_fail(what, "out of memory on a small input: %s", ab_error());
}

static bool same_matrix(const ka_matrix *a, const ka_matrix *b) {
    return a->rows == b->rows && a->cols == b->cols && strcmp(a->format, b->format) == 0 &&
           memcmp(a->data, b->data, sizeof(float) * (size_t)a->rows * (size_t)a->cols) == 0;
}

/* The records written again with the archive writer and read back: the same keys, float
 * matrices of the same values, at the offsets its index gives. */
static void rewrite(record *rec, int n) {
    const char *ark = fuzz_path("out.ark"), *scp = fuzz_path("out.scp");
    ka_writer *w;
    int rc = ka_writer_open(ark, scp, ark, &w);
    if (rc) fuzz_fail("ka_writer_open", "%s", ab_error());
    for (int i = 0; i < n; i++)
        if ((rc = ka_writer_add(w, rec[i].key, rec[i].m.rows, rec[i].m.cols, rec[i].m.data)))
            fuzz_fail("ka_writer_add", "a record the reader accepted: %s", ab_error());
    if ((rc = ka_writer_commit(w))) fuzz_fail("ka_writer_commit", "%s", ab_error());
    ka_reader *r;
    if ((rc = ka_reader_open(ark, &r))) fuzz_fail("ka_reader_open", "the rewritten archive: %s", ab_error());
    for (int i = 0; i <= n; i++) {
        const char *key;
        ka_matrix m;
        long long off;
        rc = ka_reader_next(r, &key, &m, &off);
        if (i == n) {
            if (rc != 0) fuzz_fail("rewrite", "the rewritten archive has more than its %d records (%d)", n, rc);
            break;
        }
        if (rc != 1) fuzz_fail("rewrite", "record %d of the rewritten archive: %d: %s", i, rc, ab_error());
        if (strcmp(key, rec[i].key) != 0 || strcmp(m.format, "FM") != 0 || m.rows != rec[i].m.rows ||
            m.cols != rec[i].m.cols ||
            memcmp(m.data, rec[i].m.data, sizeof(float) * (size_t)m.rows * (size_t)m.cols) != 0)
            fuzz_fail("rewrite", "record %d ('%s') reads back as another matrix", i, rec[i].key);
        ka_matrix_free(&m);
    }
    ka_reader_close(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("input.ark", data, size);
    static record rec[MAX_RECORDS];
    int n = 0;

    /* 1. record by record */
    ka_reader *r;
    int rc = ka_reader_open(path, &r);
    if (rc) fuzz_fail("ka_reader_open", "a regular file refused: %s", ab_error());
    for (;;) {
        const char *key;
        ka_matrix m;
        long long off = -1;
        rc = ka_reader_next(r, &key, &m, &off);
        if (rc == 0) break;
        if (rc < 0) {
            refused(rc, "ka_reader_next");
            break;
        }
        if (rc != 1) fuzz_fail("ka_reader_next", "returned %d", rc);
        if (!key || !key[0] || strlen(key) > 4096) fuzz_fail("ka_reader_next", "accepted a record without a key");
        for (const char *k = key; *k; k++)
            if ((unsigned char)*k <= ' ' || (unsigned char)*k >= 0x7f)
                fuzz_fail("ka_reader_next", "a key with byte 0x%02x", (unsigned char)*k);
        if (off < (long long)strlen(key) + 1 || data[off - 1] != ' ' ||
            memcmp(data + off - 1 - strlen(key), key, strlen(key)) != 0)
            fuzz_fail("ka_reader_next", "record '%s' at offset %lld does not follow its key", key, off);
        check_matrix(&m, data, size, off, "ka_reader_next");
        if (n < MAX_RECORDS) {
            strcpy(rec[n].key, key);
            rec[n].offset = off;
            rec[n++].m = m;
        } else {
            ka_matrix_free(&m);
        }
    }
    ka_reader_close(r);

    /* 2. each record again at its offset */
    for (int i = 0; i < n; i++) {
        ka_matrix m;
        if ((rc = ka_read_at(path, rec[i].offset, rec[i].key, &m)))
            fuzz_fail("ka_read_at", "record '%s' at offset %lld, read in sequence, refused at its offset: %s",
                      rec[i].key, rec[i].offset, ab_error());
        if (!same_matrix(&m, &rec[i].m))
            fuzz_fail("ka_read_at", "record '%s' at offset %lld reads as another matrix", rec[i].key, rec[i].offset);
        ka_matrix_free(&m);
    }

    /* 3. the object at offset 0 */
    ka_matrix m;
    if ((rc = ka_read_at(path, 0, NULL, &m))) {
        refused(rc, "ka_read_at");
    } else {
        check_matrix(&m, data, size, 0, "ka_read_at");
        ka_matrix_free(&m);
    }

    if (n > 0) rewrite(rec, n);
    for (int i = 0; i < n; i++) ka_matrix_free(&rec[i].m);
    fuzz_no_tracked_memory("Kaldi archive reader");
    return 0;
}
