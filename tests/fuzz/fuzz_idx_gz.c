/* experiments/tasks/images/image_data.c: the gzip path of the IDX reader, against the plain
 * path on the same bytes. Random bytes rarely make a gzip stream (its CRC-32 must hold),
 * so this target compresses the input itself and then damages the compressed file in a
 * way the input chooses; `idx` feeds the reader raw bytes.
 *
 * Input: byte 0 chooses the damage (below) and, in its high nibble, the deflate level
 * (0-9; 0 is stored blocks); byte 1 is the damage's parameter; the rest is the IDX file,
 * written plain and gzip-compressed, each read as images (3 dimensions) and as labels
 * (1 dimension).
 *   0  none: one whole member
 *   1  the 8-byte trailer (CRC-32, length) cut short by 1 + p % 8 bytes
 *   2  1 + p % 8 bytes appended after the member (p, p ^ 0x55, ...)
 *   3  two members: the data split at a point chosen by p
 *   4  byte p % size of the compressed file flipped (its low bit)
 *
 * Must hold: with damage 0 or 3, the gzip file is accepted exactly when the plain one
 * is, with the same dimensions and bytes; with damage 1 or 2 it is refused (the trailer
 * vouches for the data; bytes after a member are refused as after a raw IDX file); with
 * damage 4, if accepted, it is the plain file's data (a flip in the header's time or OS
 * byte changes nothing; anywhere else, the CRC-32 or the inflater refuses it). */
#include "error.h"
#include "fuzz_util.h"
#include "image_data.h"
#include "memory.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* Compresses data[0..n) as one gzip member at `level`: malloc'd, its size in *out_n. */
static unsigned char *gzip_member(const uint8_t *data, size_t n, int level, size_t *out_n) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        fuzz_fail("deflateInit2", "failed");
    const size_t cap = deflateBound(&z, (uLong)n) + 32;
    unsigned char *out = malloc(cap);
    if (!out) fuzz_fail("gzip", "out of memory");
    z.next_in = (Bytef *)data;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    if (deflate(&z, Z_FINISH) != Z_STREAM_END) fuzz_fail("deflate", "did not finish");
    *out_n = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

typedef struct {
    int rc;
    img_set s;
} result;

static result read_as(const char *path, bool labels, long long n) {
    result r;
    memset(&r, 0, sizeof r);
    if (labels) {
        r.s.n = n;
        r.rc = img_read_idx_labels(path, "images.idx", 256, &r.s);
    } else {
        r.rc = img_read_idx_images(path, &r.s);
    }
    if (r.rc) fuzz_refused(r.rc, labels ? "img_read_idx_labels" : "img_read_idx_images");
    return r;
}

static bool same(const result *a, const result *b, bool labels) {
    if (labels) return a->s.n == b->s.n && memcmp(a->s.labels, b->s.labels, (size_t)a->s.n) == 0;
    return a->s.n == b->s.n && a->s.rows == b->s.rows && a->s.cols == b->s.cols &&
           memcmp(a->s.pixels, b->s.pixels, (size_t)a->s.n * a->s.image_bytes) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const int damage = (data[0] & 0x0f) % 5, level = (data[0] >> 4) % 10, p = data[1];
    const uint8_t *idx = data + 2;
    const size_t n = size - 2;
    const char *plain = fuzz_file("plain.idx", idx, n);
    size_t gn;
    unsigned char *gz = gzip_member(idx, n, level, &gn);
    unsigned char *file = malloc(2 * gn + 64);
    if (!file) fuzz_fail("gzip", "out of memory");
    size_t fn = gn;
    memcpy(file, gz, gn);
    if (damage == 1) {
        fn = gn - (size_t)(1 + p % 8);
    } else if (damage == 2) {
        for (int i = 0; i < 1 + p % 8; i++) file[fn++] = (unsigned char)(p ^ (0x55 * i));
    } else if (damage == 3) {
        const size_t cut = n ? (size_t)p * n / 255 : 0;
        size_t an, bn;
        unsigned char *a = gzip_member(idx, cut, level, &an), *b = gzip_member(idx + cut, n - cut, level, &bn);
        free(file);
        if (!(file = malloc(an + bn))) fuzz_fail("gzip", "out of memory");
        memcpy(file, a, an);
        memcpy(file + an, b, bn);
        fn = an + bn;
        free(a);
        free(b);
    } else if (damage == 4) {
        file[(size_t)p % gn] ^= 0x01;
    }
    const char *gzp = fuzz_file("packed.idx.gz", file, fn);
    free(gz);
    free(file);

    /* as labels: a set of as many images as the header's first dimension says */
    const long long count =
        n >= 8 ? (long long)((uint32_t)idx[4] << 24 | (uint32_t)idx[5] << 16 | (uint32_t)idx[6] << 8 | idx[7]) : 1;
    for (int labels = 0; labels < 2; labels++) {
        result a = read_as(plain, labels, count), b = read_as(gzp, labels, count);
        const char *what = labels ? "gzip labels" : "gzip images";
        if ((damage == 0 || damage == 3) && (a.rc == 0) != (b.rc == 0))
            fuzz_fail(what, "damage %d: the plain file %s, the gzip file %s (%s)", damage, a.rc ? "refused" : "accepted",
                      b.rc ? "refused" : "accepted", b.rc ? ab_error() : "");
        if ((damage == 1 || damage == 2) && b.rc == 0)
            fuzz_fail(what, "damage %d (%s) accepted", damage, damage == 1 ? "a trailer cut short" : "bytes after the member");
        if (b.rc == 0 && (a.rc != 0 || !same(&a, &b, labels)))
            fuzz_fail(what, "damage %d: accepted with data other than the plain file's", damage);
        img_set_free(&a.s);
        img_set_free(&b.s);
    }
    fuzz_no_tracked_memory("IDX gzip reader");
    return 0;
}
