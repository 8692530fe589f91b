/* Kaldi binary archives of matrices (kaldi_ark.h). */
#include "kaldi_ark.h"

#include "error.h"
#include "fileio.h"
#include "memory.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kaldi_ark.c reads Kaldi's little-endian archives with plain copies: a big-endian host needs byte swaps"
#endif

void ka_matrix_free(ka_matrix *m) {
    if (!m) return;
    ab_free(m->data);
    memset(m, 0, sizeof *m);
}

/* ---- reading one object ---- */

/* Where an object is, for messages: "PATH, offset N (key 'K')". */
typedef struct {
    const char *path;
    long long offset;
    const char *key;
} place;

static int fail_at(int code, const place *p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_at(int code, const place *p, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->key) return ab_fail(code, "%s, offset %lld (key '%s'): %s", p->path, p->offset, p->key, msg);
    return ab_fail(code, "%s, offset %lld: %s", p->path, p->offset, msg);
}

/* Reads exactly n bytes: 0, or AB_EINVAL (the file ends first: `what` says where) /
 * AB_EIO. */
static int read_exact(FILE *f, void *buf, size_t n, const place *p, const char *what) {
    size_t got = fread(buf, 1, n, f);
    if (got == n) return 0;
    if (ferror(f)) return fail_at(ab_io_code(errno), p, "cannot read: %s", strerror(errno));
    return fail_at(AB_EINVAL, p, "truncated: the file ends inside %s", what);
}

static int32_t le_i32(const unsigned char *b) {
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
}
static float le_f32(const unsigned char *b) {
    float x;
    memcpy(&x, b, 4);
    return x;
}
static uint16_t le_u16(const unsigned char *b) { return (uint16_t)(b[0] | b[1] << 8); }

/* The token's bytes as text for a message: printable characters as they are, others
 * as \xHH. */
static void show_bytes(const unsigned char *b, size_t n, char *out, size_t cap) {
    size_t k = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && k + 5 < cap; i++) {
        if (isprint(b[i]) && b[i] != '\'') k += (size_t)snprintf(out + k, cap - k, "%c", b[i]);
        else k += (size_t)snprintf(out + k, cap - k, "\\x%02x", b[i]);
    }
}

typedef enum { FMT_FM, FMT_DM, FMT_CM, FMT_CM2, FMT_CM3 } mat_format;
static const char *const FMT_NAME[] = {"FM", "DM", "CM", "CM2", "CM3"};

/* Kaldi's decoding of the byte of a CM column between its four percentiles. */
static float cm_byte(float p0, float p25, float p75, float p100, unsigned c) {
    if (c <= 64) return p0 + (p25 - p0) * (float)c * (1.0f / 64.0f);
    if (c <= 192) return p25 + (p75 - p25) * (float)(c - 64) * (1.0f / 128.0f);
    return p75 + (p100 - p75) * (float)(c - 192) * (1.0f / 63.0f);
}

/* Reads the matrix object at the file's position (p->offset), in a file of
 * `file_size` bytes. */
static int read_object(FILE *f, long long file_size, const place *p, ka_matrix *m) {
    memset(m, 0, sizeof *m);
    unsigned char h[16];
    int rc;
    size_t got = fread(h, 1, 2, f);
    if (got < 2) {
        if (ferror(f)) return fail_at(ab_io_code(errno), p, "cannot read: %s", strerror(errno));
        return fail_at(AB_EINVAL, p, "truncated: the file ends where a matrix should start");
    }
    if (h[0] != 0 || h[1] != 'B') {
        if (h[0] == ' ' || h[0] == '[' || h[0] == '\t' || h[0] == '\n')
            return fail_at(AB_EINVAL, p,
                           "a text-mode object: only binary archives are read (Kaldi's copy-feats ark:IN ark:OUT "
                           "writes one)");
        char s[32];
        show_bytes(h, 2, s, sizeof s);
        return fail_at(AB_EINVAL, p, "not a Kaldi binary object (it starts '%s', a binary object starts \\x00B)", s);
    }
    /* the token: up to four characters, then a space */
    unsigned char tok[6];
    size_t n = 0;
    for (;;) {
        if ((rc = read_exact(f, tok + n, 1, p, "the object's type"))) return rc;
        if (tok[n] == ' ') break;
        if (++n == 5) break;
    }
    mat_format fmt;
    if (n == 2 && memcmp(tok, "FM", 2) == 0) fmt = FMT_FM;
    else if (n == 2 && memcmp(tok, "DM", 2) == 0) fmt = FMT_DM;
    else if (n == 2 && memcmp(tok, "CM", 2) == 0) fmt = FMT_CM;
    else if (n == 3 && memcmp(tok, "CM2", 3) == 0) fmt = FMT_CM2;
    else if (n == 3 && memcmp(tok, "CM3", 3) == 0) fmt = FMT_CM3;
    else {
        char s[40];
        show_bytes(tok, n, s, sizeof s);
        if (n == 2 && (memcmp(tok, "FV", 2) == 0 || memcmp(tok, "DV", 2) == 0))
            return fail_at(AB_EINVAL, p, "a Kaldi vector ('%s'), not a matrix", s);
        return fail_at(AB_EINVAL, p, "an object of type '%s', not a matrix (FM, DM, CM, CM2 or CM3)", s);
    }
    long long rows, cols;
    float gmin = 0, grange = 0;
    if (fmt == FMT_FM || fmt == FMT_DM) {
        if ((rc = read_exact(f, h, 10, p, "the matrix's size"))) return rc;
        if (h[0] != 4 || h[5] != 4)
            return fail_at(AB_EINVAL, p, "the matrix's size is not two 4-byte integers (size bytes %d and %d)", h[0],
                           h[5]);
        rows = le_i32(h + 1);
        cols = le_i32(h + 6);
    } else {
        if ((rc = read_exact(f, h, 16, p, "the compressed matrix's header"))) return rc;
        gmin = le_f32(h);
        grange = le_f32(h + 4);
        rows = le_i32(h + 8);
        cols = le_i32(h + 12);
        if (!isfinite(gmin) || !isfinite(grange))
            return fail_at(AB_EINVAL, p, "the compressed matrix's header holds min %g and range %g (not finite)",
                           (double)gmin, (double)grange);
    }
    if (rows < 0 || cols < 0)
        return fail_at(AB_EINVAL, p, "a matrix of %lld x %lld (a negative size)", rows, cols);
    if (rows == 0 || cols == 0) return fail_at(AB_EINVAL, p, "an empty matrix (%lld x %lld)", rows, cols);
    /* The bytes the header announces, checked against what the file holds from here
     * before anything of that size is allocated. rows x cols (each < 2^31) fits in 64
     * bits, but not always times the bytes of a value: a DM header of 1073807362 x
     * 2147352580 announced 2^64 + 64 bytes, 64 once wrapped, and the matrix's 2^63
     * bytes were asked for. */
    const size_t count = (size_t)rows * (size_t)cols;
    const size_t width = fmt == FMT_FM ? 4 : fmt == FMT_DM ? 8 : fmt == FMT_CM2 ? 2 : 1;
    const size_t extra = fmt == FMT_CM ? (size_t)cols * 8 : 0; /* CM's column headers */
    const bool fits = count <= (SIZE_MAX - extra) / width;
    const size_t bytes = fits ? extra + width * count : SIZE_MAX;
    long long here = ftello(f);
    if (here < 0) return fail_at(ab_io_code(errno), p, "cannot tell the position: %s", strerror(errno));
    if (!fits)
        return fail_at(AB_EINVAL, p, "truncated: the %s matrix of %lld x %lld needs more than 2^64 bytes, the file "
                                     "holds %lld", FMT_NAME[fmt], rows, cols, file_size - here);
    if ((unsigned long long)(file_size - here) < (unsigned long long)bytes)
        return fail_at(AB_EINVAL, p, "truncated: the %s matrix of %lld x %lld needs %zu bytes, the file holds %lld",
                       FMT_NAME[fmt], rows, cols, bytes, file_size - here);
    const char *big = ab_too_large(count * sizeof(float) + (fmt == FMT_FM || fmt == FMT_DM ? 0 : bytes));
    if (big) return fail_at(AB_EINVAL, p, "a %lld x %lld matrix, %s", rows, cols, big);
    float *out = ab_alloc(count * sizeof(float));
    if (!out) return fail_at(AB_ENOMEM, p, "out of memory for a %lld x %lld matrix", rows, cols);
    unsigned char *raw = NULL;
    if (fmt == FMT_FM) {
        rc = read_exact(f, out, bytes, p, "the matrix's values");
    } else if (fmt == FMT_DM) {
        /* in blocks, converted as they come */
        double blk[512];
        for (size_t i = 0; i < count && !rc; i += 512) {
            size_t k = count - i < 512 ? count - i : 512;
            if (!(rc = read_exact(f, blk, k * 8, p, "the matrix's values")))
                for (size_t j = 0; j < k; j++) out[i + j] = (float)blk[j];
        }
    } else {
        raw = ab_alloc(bytes);
        if (!raw) rc = fail_at(AB_ENOMEM, p, "out of memory for a %lld x %lld matrix", rows, cols);
        else rc = read_exact(f, raw, bytes, p, "the compressed matrix's values");
    }
    if (!rc && fmt == FMT_CM) {
        /* per column: four uint16 percentiles; then the bytes column by column */
        const unsigned char *bytes_at = raw + (size_t)cols * 8;
        const float inc = grange * (1.0f / 65535.0f);
        for (long long c = 0; c < cols; c++) {
            const unsigned char *ph = raw + (size_t)c * 8;
            float p0 = gmin + inc * le_u16(ph), p25 = gmin + inc * le_u16(ph + 2), p75 = gmin + inc * le_u16(ph + 4),
                  p100 = gmin + inc * le_u16(ph + 6);
            const unsigned char *col = bytes_at + (size_t)c * (size_t)rows;
            for (long long r = 0; r < rows; r++) out[(size_t)r * (size_t)cols + (size_t)c] = cm_byte(p0, p25, p75, p100, col[r]);
        }
    } else if (!rc && fmt == FMT_CM2) {
        const float inc = grange * (1.0f / 65535.0f);
        for (size_t i = 0; i < count; i++) out[i] = gmin + inc * le_u16(raw + 2 * i);
    } else if (!rc && fmt == FMT_CM3) {
        const float inc = grange * (1.0f / 255.0f);
        for (size_t i = 0; i < count; i++) out[i] = gmin + inc * raw[i];
    }
    ab_free(raw);
    for (size_t i = 0; i < count && !rc; i++)
        if (!isfinite(out[i]))
            rc = fail_at(AB_EINVAL, p, "value (%zu, %zu) of the %s matrix is not finite (%g)", i / (size_t)cols,
                         i % (size_t)cols, FMT_NAME[fmt], (double)out[i]);
    if (rc) {
        ab_free(out);
        return rc;
    }
    m->rows = (int)rows;
    m->cols = (int)cols;
    m->data = out;
    strcpy(m->format, FMT_NAME[fmt]);
    return 0;
}

/* Opens a regular file for reading; its size in *size. */
static FILE *open_sized(const char *path, long long *size, int *rc) {
    FILE *f = ab_fopen_regular(path, "archive", rc);
    if (!f) return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        *rc = ab_fail(ab_io_code(errno), "cannot read archive %s: %s", path, strerror(errno));
        fclose(f);
        return NULL;
    }
    *size = (long long)st.st_size;
    return f;
}

int ka_read_at(const char *path, long long offset, const char *key, ka_matrix *m) {
    memset(m, 0, sizeof *m);
    place p = {path, offset, key};
    int rc;
    long long size;
    FILE *f = open_sized(path, &size, &rc);
    if (!f) return rc;
    if (offset < 0 || offset >= size)
        rc = fail_at(AB_EINVAL, &p, "the offset is past the end of the file (%lld bytes)", size);
    else if (fseeko(f, (off_t)offset, SEEK_SET) != 0)
        rc = fail_at(ab_io_code(errno), &p, "cannot seek: %s", strerror(errno));
    else
        rc = read_object(f, size, &p, m);
    fclose(f);
    return rc;
}

/* ---- sequential reading ---- */

enum { KEY_MAX = 4096 };

struct ka_reader {
    FILE *f;
    char *path;
    long long size;
    char key[KEY_MAX + 1];
};

int ka_reader_open(const char *path, ka_reader **out) {
    *out = NULL;
    ka_reader *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path))) {
        free(r);
        return ab_fail(AB_ENOMEM, "out of memory");
    }
    int rc;
    if (!(r->f = open_sized(path, &r->size, &rc))) {
        free(r->path);
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int ka_reader_next(ka_reader *r, const char **key, ka_matrix *m, long long *offset) {
    memset(m, 0, sizeof *m);
    *key = NULL;
    long long start = ftello(r->f);
    place p = {r->path, start, NULL};
    size_t n = 0;
    for (;;) {
        int c = getc(r->f);
        if (c == EOF) {
            if (ferror(r->f)) return fail_at(ab_io_code(errno), &p, "cannot read: %s", strerror(errno));
            if (n == 0) return 0; /* the end, between records */
            r->key[n] = '\0';
            return fail_at(AB_EINVAL, &p, "truncated: the archive ends inside the key '%.60s'", r->key);
        }
        if (c == ' ') break;
        if (!isgraph(c))
            return fail_at(AB_EINVAL, &p, "not a Kaldi archive: byte 0x%02x where a key should be%s", (unsigned)c,
                           n == 0 && c == '\n' ? " (a text-mode archive?)" : "");
        if (n == KEY_MAX) return fail_at(AB_EINVAL, &p, "not a Kaldi archive: no space after %d bytes of key", KEY_MAX);
        r->key[n++] = (char)c;
    }
    if (n == 0) return fail_at(AB_EINVAL, &p, "not a Kaldi archive: an empty key");
    r->key[n] = '\0';
    p.key = r->key;
    p.offset = start + (long long)n + 1;
    int rc = read_object(r->f, r->size, &p, m);
    if (rc) return rc;
    *key = r->key;
    if (offset) *offset = p.offset;
    return 1;
}

void ka_reader_close(ka_reader *r) {
    if (!r) return;
    if (r->f) fclose(r->f);
    free(r->path);
    free(r);
}

/* ---- writing ---- */

struct ka_writer {
    ab_atomic_file ark, scp;
    char *ark_name;
    long long pos; /* bytes written to the archive */
};

bool ka_index_name_ok(const char *s) {
    for (; *s; s++)
        if (isspace((unsigned char)*s) || iscntrl((unsigned char)*s)) return false;
    return true;
}

int ka_writer_open(const char *ark_path, const char *scp_path, const char *ark_name, ka_writer **out) {
    *out = NULL;
    ka_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->ark_name = strdup(ark_name))) {
        free(w);
        return ab_fail(AB_ENOMEM, "out of memory");
    }
    if (!ka_index_name_ok(ark_name)) {
        free(w->ark_name);
        free(w);
        return ab_fail(AB_EINVAL, "archive %s: a name with whitespace cannot be written into a .scp index", ark_name);
    }
    int rc = ab_atomic_open(&w->ark, ark_path);
    if (!rc && (rc = ab_atomic_open(&w->scp, scp_path))) ab_atomic_abort(&w->ark);
    if (rc) {
        free(w->ark_name);
        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

int ka_writer_add(ka_writer *w, const char *key, int rows, int cols, const float *data) {
    if (!key[0]) return ab_fail(AB_EINVAL, "%s: an empty key cannot be written", w->ark.path);
    for (const char *s = key; *s; s++)
        if (!isgraph((unsigned char)*s))
            return ab_fail(AB_EINVAL, "%s: the key '%s' holds whitespace or a control character", w->ark.path, key);
    if (rows <= 0 || cols <= 0)
        return ab_fail(AB_EINVAL, "%s: key '%s': an empty matrix (%d x %d) cannot be written", w->ark.path, key,
                       rows, cols);
    size_t klen = strlen(key);
    unsigned char h[15] = {0, 'B', 'F', 'M', ' ', 4, 0, 0, 0, 0, 4, 0, 0, 0, 0};
    uint32_t r = (uint32_t)rows, c = (uint32_t)cols;
    for (int i = 0; i < 4; i++) {
        h[6 + i] = (unsigned char)(r >> (8 * i));
        h[11 + i] = (unsigned char)(c >> (8 * i));
    }
    long long obj = w->pos + (long long)klen + 1;
    size_t count = (size_t)rows * (size_t)cols;
    if (fwrite(key, 1, klen, w->ark.f) != klen || fputc(' ', w->ark.f) == EOF ||
        fwrite(h, 1, sizeof h, w->ark.f) != sizeof h || fwrite(data, sizeof(float), count, w->ark.f) != count ||
        fprintf(w->scp.f, "%s %s:%lld\n", key, w->ark_name, obj) < 0)
        return ab_fail(ab_io_code(errno), "cannot write %s: %s", w->ark.path, strerror(errno));
    w->pos = obj + (long long)sizeof h + (long long)(count * sizeof(float));
    return 0;
}

static void writer_free(ka_writer *w) {
    free(w->ark_name);
    free(w);
}

int ka_writer_commit(ka_writer *w) {
    int rc = ab_atomic_commit(&w->ark);
    if (rc) ab_atomic_abort(&w->scp);
    else rc = ab_atomic_commit(&w->scp);
    writer_free(w);
    return rc;
}

void ka_writer_abort(ka_writer *w) {
    if (!w) return;
    ab_atomic_abort(&w->ark);
    ab_atomic_abort(&w->scp);
    writer_free(w);
}
