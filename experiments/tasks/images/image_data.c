/* IDX and CIFAR-10 readers (image_data.h). */
#include "image_data.h"

#include "error.h"
#include "fileio.h"
#include "memory.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* ---- a file read plainly or through zlib ---- */

/* A gzip file is inflated here rather than through zlib's gzFile, which takes a stream
 * whose 8-byte trailer (CRC-32 and length) is cut off, wholly or in part, as complete
 * (so the CRC is never checked) and ignores bytes after the last member. Here the data
 * counts as whole only when inflate reached a member's end, trailer checked; members
 * may follow one another (gzip's concatenation); anything else after a member is
 * refused, as extra bytes after a raw IDX file are. */
typedef struct {
    const char *path;
    FILE *f;             /* the file on disk (plain or gzip) */
    bool gz;             /* the file is gzip */
    z_stream z;          /* gzip: the inflater (initialised when gz) */
    unsigned char *in;   /* gzip: compressed bytes read from f, not yet inflated */
    bool member_end;     /* gzip: the last member ended with its trailer checked */
    bool ended;          /* gzip: the data is over (and whole: member_end) */
    const char *cut;     /* gzip: why the data stopped early, or NULL */
    long long file_size; /* bytes on disk */
} reader;

enum { GZ_IN = 1 << 17 };

static int reader_open(const char *path, reader *r) {
    memset(r, 0, sizeof *r);
    r->path = path;
    int rc;
    FILE *f = ab_fopen_regular(path, "", &rc);
    if (!f) return rc;
    struct stat st;
    unsigned char m[2] = {0, 0};
    size_t got = fread(m, 1, 2, f);
    if (fstat(fileno(f), &st) != 0 || ferror(f) || fseek(f, 0, SEEK_SET) != 0) {
        int e = errno;
        fclose(f);
        return ab_fail(ab_io_code(e), "cannot read %s: %s", path, strerror(e));
    }
    r->file_size = (long long)st.st_size;
    r->f = f;
    if (got == 2 && m[0] == 0x1f && m[1] == 0x8b) {
        r->gz = true;
        /* 16 + 15: a gzip wrapper (header and trailer checked), the largest window */
        if (!(r->in = malloc(GZ_IN)) || inflateInit2(&r->z, 16 + MAX_WBITS) != Z_OK) {
            free(r->in);
            fclose(f);
            r->f = NULL;
            r->gz = false;
            return ab_fail(AB_ENOMEM, "cannot read %s: out of memory for the gzip stream", path);
        }
    }
    return 0;
}

static void reader_close(reader *r) {
    if (r->gz) inflateEnd(&r->z);
    free(r->in);
    if (r->f) fclose(r->f);
    r->f = NULL;
    r->in = NULL;
    r->gz = false;
}

/* Refills the inflater's input: false at the end of the file (or a read error, set
 * as a message and *err). */
static bool gz_fill(reader *r, bool *err) {
    size_t k = fread(r->in, 1, GZ_IN, r->f);
    if (k == 0) {
        if (ferror(r->f)) {
            ab_fail(ab_io_code(errno), "cannot read %s: %s", r->path, strerror(errno));
            *err = true;
        }
        return false;
    }
    r->z.next_in = r->in;
    r->z.avail_in = (uInt)k;
    return true;
}

/* Bytes after a member: the next member (it starts 1f 8b), or the file's end. Returns
 * -1 with a message for anything else. */
static int gz_after_member(reader *r) {
    bool err = false;
    if (r->z.avail_in == 0 && !gz_fill(r, &err)) {
        if (err) return -1;
        r->ended = true; /* the file ends where a member ends: whole */
        return 0;
    }
    /* the next member's magic, which may straddle a refill */
    unsigned char m0 = r->z.next_in[0], m1;
    if (r->z.avail_in >= 2) m1 = r->z.next_in[1];
    else {
        int c = fgetc(r->f);
        if (c == EOF && ferror(r->f)) {
            ab_fail(ab_io_code(errno), "cannot read %s: %s", r->path, strerror(errno));
            return -1;
        }
        if (c != EOF) ungetc(c, r->f);
        m1 = c == EOF ? 0 : (unsigned char)c;
    }
    if (m0 == 0x1f && m1 == 0x8b) {
        r->member_end = false;
        return inflateReset(&r->z) == Z_OK ? 0 : (ab_fail(AB_EINVAL, "%s: the gzip data does not decompress", r->path), -1);
    }
    /* count what is left: the message says how much */
    long long extra = r->z.avail_in;
    while (gz_fill(r, &err)) extra += r->z.avail_in;
    if (err) return -1;
    ab_fail(AB_EINVAL, "%s: %lld bytes after the end of the gzip data (not another gzip member)", r->path, extra);
    return -1;
}

/* Reads up to n bytes (fewer only at the end of the data): the count, or -1 with a
 * message (a read error, a gzip stream that does not decompress, bytes after it). A
 * gzip stream that stops in the middle (of its data, or of its 8-byte trailer) reads as
 * its end, with r->cut set: the caller reports the data short (gz_note), or, when the
 * data was all there, reader_finish refuses the file. */
static long long reader_read(reader *r, void *buf, size_t n) {
    size_t got = 0;
    if (!r->gz) {
        got = fread(buf, 1, n, r->f);
        if (got < n && ferror(r->f)) {
            ab_fail(ab_io_code(errno), "cannot read %s: %s", r->path, strerror(errno));
            return -1;
        }
        return (long long)got;
    }
    while (got < n && !r->ended) {
        if (r->member_end) {
            if (gz_after_member(r)) return -1;
            continue;
        }
        bool err = false;
        if (r->z.avail_in == 0 && !gz_fill(r, &err)) {
            if (err) return -1;
            r->ended = true;
            r->cut = "the gzip stream ends early: its data or its 8-byte trailer (CRC-32 and length) is cut off";
            break;
        }
        size_t want = n - got > (1u << 30) ? (1u << 30) : n - got;
        r->z.next_out = (unsigned char *)buf + got;
        r->z.avail_out = (uInt)want;
        int zr = inflate(&r->z, Z_NO_FLUSH);
        got += want - r->z.avail_out;
        if (zr == Z_STREAM_END) {
            r->member_end = true;
        } else if (zr == Z_BUF_ERROR) {
            continue; /* no progress possible without more input: refilled above */
        } else if (zr != Z_OK) {
            ab_fail(zr == Z_MEM_ERROR ? AB_ENOMEM : AB_EINVAL, "%s: the gzip data does not decompress (%s)", r->path,
                    zr == Z_MEM_ERROR ? "out of memory" : r->z.msg ? r->z.msg : "corrupt");
            return -1;
        }
    }
    return (long long)got;
}

/* " (the gzip stream ends early: ...)" for a compressed file that stopped in the middle. */
static const char *gz_note(reader *r) {
    static _Thread_local char note[200];
    if (!r->gz || !r->cut) return "";
    snprintf(note, sizeof note, " (%s)", r->cut);
    return note;
}

/* ---- IDX ---- */

static const char *idx_type_name(int t) {
    switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "short";
    case 0x0C: return "int";
    case 0x0D: return "float";
    case 0x0E: return "double";
    default: return "unknown";
    }
}

/* Reads an IDX file of unsigned bytes with `want_ndim` dimensions (`what` describes
 * them for messages): dims and the data (tracked allocator). */
static int idx_read(const char *path, int want_ndim, const char *what, long long dims[3], unsigned char **data,
                    size_t *bytes) {
    *data = NULL;
    *bytes = 0;
    reader r;
    int rc = reader_open(path, &r);
    if (rc) return rc;
    unsigned char h[16];
    unsigned char *buf = NULL;
    long long got = reader_read(&r, h, 4);
    if (got < 0) {
        rc = AB_EINVAL;
        goto done;
    }
    if (got < 4) {
        rc = ab_fail(AB_EINVAL, "%s: truncated: %lld bytes, shorter than an IDX header%s", path, got, gz_note(&r));
        goto done;
    }
    if (h[0] != 0 || h[1] != 0) {
        rc = ab_fail(AB_EINVAL,
                     "%s: not an IDX file (it starts %02x %02x %02x %02x; an IDX file starts 00 00 TYPE DIMENSIONS)",
                     path, h[0], h[1], h[2], h[3]);
        goto done;
    }
    if (h[2] != 0x08) {
        rc = ab_fail(AB_EINVAL, "%s: IDX elements of type 0x%02x (%s), expected unsigned bytes (0x08)", path, h[2],
                     idx_type_name(h[2]));
        goto done;
    }
    if (h[3] != want_ndim) {
        rc = ab_fail(AB_EINVAL, "%s: an IDX array of %d dimensions, expected %d (%s)", path, h[3], want_ndim, what);
        goto done;
    }
    const size_t hbytes = 4 + 4 * (size_t)want_ndim;
    got = reader_read(&r, h + 4, 4 * (size_t)want_ndim);
    if (got < 0) {
        rc = AB_EINVAL;
        goto done;
    }
    if (got < 4 * want_ndim) {
        rc = ab_fail(AB_EINVAL, "%s: truncated: %lld bytes, shorter than its IDX header of %zu%s", path, 4 + got,
                     hbytes, gz_note(&r));
        goto done;
    }
    size_t total = 1;
    for (int i = 0; i < want_ndim; i++) {
        const unsigned char *p = h + 4 + 4 * i;
        dims[i] = (long long)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
        if (dims[i] == 0) {
            rc = ab_fail(AB_EINVAL, "%s: dimension %d of the IDX array is 0 (%s: nothing to read)", path, i + 1, what);
            goto done;
        }
        if (ab_mul_size(total, (size_t)dims[i], &total)) {
            rc = ab_fail(AB_EINVAL, "%s: the IDX array's dimensions multiply past what memory can address", path);
            goto done;
        }
    }
    if (!r.gz) {
        /* plain file: its size is known, so a short or long one is refused before
         * anything is allocated. Unsigned: the dimensions may multiply to 2^63 bytes or
         * more, past what a signed size holds. */
        const uint64_t held = (uint64_t)r.file_size - hbytes; /* the header was read from it */
        if (held < (uint64_t)total) {
            rc = ab_fail(AB_EINVAL, "%s: truncated: the IDX header announces %zu bytes of data, the file holds %llu",
                         path, total, (unsigned long long)held);
            goto done;
        }
        if (held > (uint64_t)total) {
            rc = ab_fail(AB_EINVAL, "%s: %llu bytes after the %zu bytes of data its IDX header announces", path,
                         (unsigned long long)(held - total), total);
            goto done;
        }
    }
    const char *big = r.gz ? NULL : ab_too_large(total); /* gzip: the data decides, below */
    if (big) {
        rc = ab_fail(AB_EINVAL, "%s: the IDX header announces %zu bytes of data, %s", path, total, big);
        goto done;
    }
    /* The buffer grows as the data arrives (a gzip file's size says nothing of its
     * contents), so a header that promises more than the file holds costs at most
     * twice what the file does hold. */
    size_t cap = total < ((size_t)1 << 22) || !r.gz ? total : ((size_t)1 << 22), n = 0;
    if (!(buf = ab_alloc(cap))) {
        rc = ab_fail(AB_ENOMEM, "%s: out of memory for %zu bytes", path, cap);
        goto done;
    }
    while (n < total) {
        if (n == cap) {
            size_t nc = cap > total / 2 ? total : 2 * cap;
            if ((big = ab_too_large(nc))) { /* bytes that arrived, not announced */
                rc = ab_fail(AB_EINVAL, "%s: %zu bytes of data decompressed and more to come, %s", path, n, big);
                goto done;
            }
            unsigned char *nb = ab_alloc(nc);
            if (!nb) {
                rc = ab_fail(AB_ENOMEM, "%s: out of memory for %zu bytes", path, nc);
                goto done;
            }
            memcpy(nb, buf, n);
            ab_free(buf);
            buf = nb;
            cap = nc;
        }
        got = reader_read(&r, buf + n, cap - n);
        if (got < 0) {
            rc = AB_EINVAL;
            goto done;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    if (n < total) {
        rc = ab_fail(AB_EINVAL, "%s: truncated: the IDX header announces %zu bytes of data, the file holds %zu%s", path,
                     total, n, gz_note(&r));
        goto done;
    }
    unsigned char extra[4096];
    long long more = 0;
    while ((got = reader_read(&r, extra, sizeof extra)) > 0) more += got;
    if (got < 0) {
        rc = AB_EINVAL;
        goto done;
    }
    if (more > 0) {
        rc = ab_fail(AB_EINVAL, "%s: %lld bytes after the %zu bytes of data its IDX header announces", path, more,
                     total);
        goto done;
    }
    if (r.cut) { /* every byte of data arrived, but the trailer that vouches for it did not */
        rc = ab_fail(AB_EINVAL, "%s: %s", path, r.cut);
        goto done;
    }
    *data = buf;
    *bytes = total;
    buf = NULL;
done:
    ab_free(buf);
    reader_close(&r);
    return rc;
}

void img_set_free(img_set *s) {
    if (!s) return;
    ab_free(s->pixels);
    ab_free(s->labels);
    memset(s, 0, sizeof *s);
}

int img_read_idx_images(const char *path, img_set *s) {
    memset(s, 0, sizeof *s);
    long long d[3];
    unsigned char *data;
    size_t bytes;
    int rc = idx_read(path, 3, "images: count, rows, columns", d, &data, &bytes);
    if (rc) return rc;
    if (d[1] > INT_MAX || d[2] > INT_MAX || d[1] * d[2] > INT_MAX) {
        ab_free(data);
        return ab_fail(AB_EINVAL, "%s: images of %lld x %lld pixels are too large (at most 2^31 - 1 pixels)", path, d[1],
                       d[2]);
    }
    s->n = d[0];
    s->rows = (int)d[1];
    s->cols = (int)d[2];
    s->channels = 1;
    s->planar = false;
    s->image_bytes = (size_t)(d[1] * d[2]);
    s->pixels = data;
    return 0;
}

int img_read_idx_labels(const char *path, const char *images_path, int classes, img_set *s) {
    long long d[3];
    unsigned char *data;
    size_t bytes;
    int rc = idx_read(path, 1, "labels: count", d, &data, &bytes);
    if (rc) return rc;
    if (d[0] != s->n) {
        ab_free(data);
        return ab_fail(AB_EINVAL, "%s: %lld labels, but %s holds %lld images", path, d[0], images_path, s->n);
    }
    for (long long i = 0; i < d[0]; i++)
        if (data[i] >= classes) {
            int y = data[i];
            ab_free(data);
            return ab_fail(AB_EINVAL, "%s: label %d of image %lld is outside [0, %d)", path, y, i, classes);
        }
    ab_free(s->labels);
    s->labels = data;
    s->classes = classes;
    return 0;
}

/* ---- CIFAR-10 ---- */

enum { CIFAR_SIDE = 32, CIFAR_PIXELS = 3 * 32 * 32, CIFAR_RECORD = 1 + CIFAR_PIXELS, CIFAR_CLASSES = 10 };

int img_read_cifar(const char *const *paths, int n_paths, img_set *s) {
    memset(s, 0, sizeof *s);
    if (n_paths < 1) return ab_fail(AB_EINVAL, "CIFAR-10: no files to read");
    /* the number of records of every file first, so that one allocation holds them */
    long long total = 0;
    for (int i = 0; i < n_paths; i++) {
        int rc;
        FILE *f = ab_fopen_regular(paths[i], "", &rc);
        if (!f) return rc;
        struct stat st;
        if (fstat(fileno(f), &st) != 0) {
            int e = errno;
            fclose(f);
            return ab_fail(ab_io_code(e), "cannot read %s: %s", paths[i], strerror(e));
        }
        fclose(f);
        long long size = (long long)st.st_size;
        if (size == 0) return ab_fail(AB_EINVAL, "%s: empty (no CIFAR-10 records)", paths[i]);
        if (size % CIFAR_RECORD)
            return ab_fail(AB_EINVAL,
                           "%s: truncated or not CIFAR-10: %lld bytes are %lld records of %d bytes (1 label + %d "
                           "pixels) and %lld bytes more",
                           paths[i], size, size / CIFAR_RECORD, CIFAR_RECORD, CIFAR_PIXELS, size % CIFAR_RECORD);
        total += size / CIFAR_RECORD;
    }
    size_t pbytes;
    if (ab_mul_size((size_t)total, CIFAR_PIXELS, &pbytes))
        return ab_fail(AB_EINVAL, "%s: %lld CIFAR-10 records are too many to address", paths[0], total);
    const char *big = ab_too_large(pbytes + (size_t)total);
    if (big) return ab_fail(AB_EINVAL, "%s: %lld CIFAR-10 records, %s", paths[0], total, big);
    s->pixels = ab_alloc(pbytes);
    s->labels = ab_alloc((size_t)total);
    if (!s->pixels || !s->labels) {
        img_set_free(s);
        return ab_fail(AB_ENOMEM, "CIFAR-10: out of memory for %lld images (%zu bytes)", total, pbytes);
    }
    s->n = total;
    s->rows = s->cols = CIFAR_SIDE;
    s->channels = 3;
    s->planar = true;
    s->image_bytes = CIFAR_PIXELS;
    s->classes = CIFAR_CLASSES;
    long long k = 0;
    unsigned char rec[CIFAR_RECORD];
    for (int i = 0; i < n_paths; i++) {
        int rc;
        FILE *f = ab_fopen_regular(paths[i], "", &rc);
        if (!f) {
            img_set_free(s);
            return rc;
        }
        long long j = 0;
        size_t got;
        while ((got = fread(rec, 1, CIFAR_RECORD, f)) == CIFAR_RECORD) {
            if (k == total) break; /* the file grew since it was measured */
            if (rec[0] >= CIFAR_CLASSES) {
                fclose(f);
                img_set_free(s);
                return ab_fail(AB_EINVAL, "%s: record %lld has label %d, outside [0, %d) (not a CIFAR-10 file?)",
                               paths[i], j, rec[0], CIFAR_CLASSES);
            }
            s->labels[k] = rec[0];
            memcpy(s->pixels + (size_t)k * CIFAR_PIXELS, rec + 1, CIFAR_PIXELS);
            k++;
            j++;
        }
        bool err = ferror(f);
        fclose(f);
        if (err) {
            img_set_free(s);
            return ab_fail(ab_io_code(errno), "cannot read %s: %s", paths[i], strerror(errno));
        }
        if (got != 0 && got != CIFAR_RECORD) {
            img_set_free(s);
            return ab_fail(AB_EINVAL, "%s: truncated: record %lld holds %zu of its %d bytes", paths[i], j, got,
                           CIFAR_RECORD);
        }
    }
    if (k != total) {
        img_set_free(s);
        return ab_fail(AB_EINVAL, "%s: the CIFAR-10 files changed while they were read", paths[n_paths - 1]);
    }
    return 0;
}

/* ---- views ---- */

void img_raster(const img_set *s, long long index, int *out) {
    const unsigned char *p = s->pixels + (size_t)index * s->image_bytes;
    const size_t C = (size_t)s->channels, HW = (size_t)s->rows * (size_t)s->cols;
    if (!s->planar || C == 1) {
        for (size_t i = 0; i < s->image_bytes; i++) out[i] = p[i];
        return;
    }
    for (size_t q = 0; q < HW; q++)
        for (size_t c = 0; c < C; c++) out[q * C + c] = p[c * HW + q];
}

uint32_t img_crc32(const img_set *s) {
    uLong c = crc32_z(0L, Z_NULL, 0);
    c = crc32_z(c, s->pixels, (size_t)s->n * s->image_bytes);
    if (s->labels) c = crc32_z(c, s->labels, (size_t)s->n);
    return (uint32_t)c;
}
