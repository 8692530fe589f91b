/* Checkpoint container: writer, validating reader, and the common blobs. The format
 * is described in checkpoint.h. */
#include "checkpoint.h"

#include "bytes.h"
#include "error.h"
#include "fileio.h"
#include "memory.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

static const unsigned char MAGIC[8] = {0x89, 'A', 'B', 'K', '\r', '\n', 0x1a, '\n'};
#define BYTE_ORDER_TAG 0x01020304u
#define HEADER_BYTES 64u
#define ENTRY_BYTES 64u
#define NAME_BYTES 40u
#define ALIGN 64u
/* A reader refuses tables larger than this (a damaged capacity must not make it
 * allocate or scan gigabytes). */
#define MAX_CAPACITY 65536u

typedef struct {
    char name[NAME_BYTES];
    uint64_t offset, bytes;
    uint32_t crc;
} entry;


static uint64_t align_up(uint64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

/* zlib's crc32 takes uInt lengths: feed big buffers in pieces. */
static uint32_t crc_update(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    uLong c = crc;
    while (n > 0) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}
static uint32_t crc_of(const void *data, size_t n) { return crc_update((uint32_t)crc32(0L, Z_NULL, 0), data, n); }

static uint64_t data_offset_for(uint32_t capacity) {
    return align_up((uint64_t)HEADER_BYTES + (uint64_t)ENTRY_BYTES * capacity);
}

/* A valid name: 1..AB_CKPT_NAME_MAX characters in '!'..'~'. */
static bool name_ok(const char *name, size_t len) {
    if (len == 0 || len > AB_CKPT_NAME_MAX) return false;
    for (size_t i = 0; i < len; i++)
        if (name[i] < '!' || name[i] > '~') return false;
    return true;
}

/* ------------------------------------------------------------------------------------
 * Writer
 * ---------------------------------------------------------------------------------- */

struct ab_ckpt_writer {
    ab_atomic_file af;
    entry entries[AB_CKPT_MAX_BLOBS];
    int count;
    uint64_t pos;   /* bytes written so far */
    int failed;     /* first error code of an add, 0 if none */
    char msg[512];  /* its message */
};

static const unsigned char ZEROS[4096];

static int write_zeros(ab_ckpt_writer *w, uint64_t n) {
    while (n > 0) {
        size_t k = n > sizeof ZEROS ? sizeof ZEROS : (size_t)n;
        if (fwrite(ZEROS, 1, k, w->af.f) != k) return -1;
        n -= k;
        w->pos += k;
    }
    return 0;
}

static int io_fail(ab_ckpt_writer *w) {
    int e = errno ? errno : EIO;
    return ab_fail(ab_io_code(e), "cannot write checkpoint %s: %s", w->af.path, strerror(e));
}

int ab_ckpt_begin(const char *path, ab_ckpt_writer **out) {
    *out = NULL;
    ab_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w) return ab_fail(AB_ENOMEM, "out of memory");
    int rc = ab_atomic_open(&w->af, path);
    if (rc) {
        free(w);
        return rc;
    }
    /* Room for the header and table, filled in at commit. */
    errno = 0;
    if (write_zeros(w, data_offset_for(AB_CKPT_MAX_BLOBS))) {
        rc = io_fail(w);
        ab_atomic_abort(&w->af);
        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

int ab_ckpt_poison(ab_ckpt_writer *w, int rc) {
    if (!w) return rc;
    if (!w->failed) {
        w->failed = rc;
        snprintf(w->msg, sizeof w->msg, "%s", ab_error());
    }
    return rc;
}

int ab_ckpt_add(ab_ckpt_writer *w, const char *name, const void *data, size_t bytes) {
    if (!w) return ab_fail(AB_EINVAL, "checkpoint: add on a NULL writer");
    if (w->failed)
        return ab_fail(w->failed, "checkpoint %s: not adding '%s' after an earlier failure: %s", w->af.path,
                       name ? name : "(null)", w->msg);
    if (!name || !name_ok(name, strnlen(name, AB_CKPT_NAME_MAX + 1)))
        return ab_ckpt_poison(w, ab_fail(AB_EINVAL,
                                 "checkpoint %s: bad blob name '%.60s' (1 to %d printable ASCII characters, no spaces)",
                                 w->af.path, name ? name : "(null)", AB_CKPT_NAME_MAX));
    for (int i = 0; i < w->count; i++)
        if (strcmp(w->entries[i].name, name) == 0)
            return ab_ckpt_poison(w, ab_fail(AB_EINVAL, "checkpoint %s: blob '%s' added twice", w->af.path, name));
    if (w->count == AB_CKPT_MAX_BLOBS)
        return ab_ckpt_poison(w, ab_fail(AB_EINVAL, "checkpoint %s: more than %d blobs (adding '%s')", w->af.path,
                                 AB_CKPT_MAX_BLOBS, name));
    if (!data && bytes)
        return ab_ckpt_poison(w, ab_fail(AB_EINVAL, "checkpoint %s: blob '%s' has %zu bytes but no data", w->af.path, name,
                                 bytes));
    errno = 0;
    if (write_zeros(w, align_up(w->pos) - w->pos)) return ab_ckpt_poison(w, io_fail(w));
    entry *e = &w->entries[w->count];
    memset(e, 0, sizeof *e);
    memcpy(e->name, name, strlen(name));
    e->offset = w->pos;
    e->bytes = bytes;
    e->crc = crc_of(data, bytes);
    if (bytes && fwrite(data, 1, bytes, w->af.f) != bytes) return ab_ckpt_poison(w, io_fail(w));
    w->pos += bytes;
    w->count++;
    return 0;
}

void ab_ckpt_abort(ab_ckpt_writer *w) {
    if (!w) return;
    ab_atomic_abort(&w->af);
    free(w);
}

int ab_ckpt_commit(ab_ckpt_writer *w) {
    if (!w) return ab_fail(AB_EINVAL, "checkpoint: commit on a NULL writer");
    if (w->failed) {
        int rc = ab_fail(w->failed, "checkpoint %s not written: %s", w->af.path, w->msg);
        ab_ckpt_abort(w);
        return rc;
    }
    const uint32_t cap = AB_CKPT_MAX_BLOBS;
    unsigned char table[AB_CKPT_MAX_BLOBS * ENTRY_BYTES];
    memset(table, 0, sizeof table);
    for (int i = 0; i < w->count; i++) {
        unsigned char *t = table + (size_t)i * ENTRY_BYTES;
        memcpy(t, w->entries[i].name, NAME_BYTES);
        ab_put_u64(t + 40, w->entries[i].offset);
        ab_put_u64(t + 48, w->entries[i].bytes);
        ab_put_u32(t + 56, w->entries[i].crc);
    }
    unsigned char h[HEADER_BYTES];
    memset(h, 0, sizeof h);
    memcpy(h, MAGIC, 8);
    ab_put_u32(h + 8, AB_CKPT_VERSION);
    ab_put_u32(h + 12, BYTE_ORDER_TAG);
    ab_put_u32(h + 16, HEADER_BYTES);
    ab_put_u32(h + 20, ENTRY_BYTES);
    ab_put_u32(h + 24, (uint32_t)w->count);
    ab_put_u32(h + 28, cap);
    ab_put_u32(h + 32, ALIGN);
    ab_put_u64(h + 40, data_offset_for(cap));
    ab_put_u64(h + 48, w->pos);
    ab_put_u32(h + 56, crc_of(table, sizeof table));
    ab_put_u32(h + 36, crc_of(h, sizeof h)); /* last: covers everything above with itself zero */

    errno = 0;
    if (fseek(w->af.f, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof h, w->af.f) != sizeof h ||
        fwrite(table, 1, sizeof table, w->af.f) != sizeof table) {
        int rc = io_fail(w);
        ab_ckpt_abort(w);
        return rc;
    }
    int rc = ab_atomic_commit(&w->af); /* flush, fsync, rename; removes the temporary on failure */
    free(w);
    return rc;
}

/* ------------------------------------------------------------------------------------
 * Reader
 * ---------------------------------------------------------------------------------- */

struct ab_ckpt_reader {
    char *path;
    unsigned char *buf; /* the whole file (ab_alloc; NULL for an empty file) */
    size_t size;
    int count;
    entry *entries;     /* count (malloc) */
};

void ab_ckpt_close(ab_ckpt_reader *r) {
    if (!r) return;
    ab_free(r->buf);
    free(r->entries);
    free(r->path);
    free(r);
}

/* The header's checks, on its first min(size, 64) bytes and the file size, so that a
 * foreign or damaged file is refused before it is read whole. Fills *hf. */
typedef struct {
    uint32_t count, cap, table_crc;
    uint64_t data_off, file_bytes;
} header_fields;

static int check_header(const char *path, const unsigned char *b, size_t size, header_fields *hf) {
    if (size == 0) return ab_fail(AB_EINVAL, "%s: empty file, not an attnbench checkpoint", path);
    size_t head = size < 8 ? size : 8;
    if (memcmp(b, MAGIC, head) != 0) {
        if (size >= 4 && memcmp(b, MAGIC, 4) == 0)
            return ab_fail(AB_EINVAL,
                           "%s: damaged attnbench checkpoint signature (line endings changed by a text-mode transfer?)",
                           path);
        return ab_fail(AB_EINVAL, "%s: not an attnbench checkpoint", path);
    }
    if (size < HEADER_BYTES)
        return ab_fail(AB_EINVAL, "%s: truncated checkpoint (%zu bytes, shorter than its %u-byte header)", path, size,
                       HEADER_BYTES);
    uint32_t order = ab_get_u32(b + 12);
    if (order == 0x04030201u)
        return ab_fail(AB_EINVAL, "%s: checkpoint written on a machine of the other byte order", path);
    if (order != BYTE_ORDER_TAG) return ab_fail(AB_EINVAL, "%s: checkpoint header is corrupt (byte order tag)", path);
    uint32_t version = ab_get_u32(b + 8);
    if (version != AB_CKPT_VERSION)
        return ab_fail(AB_EINVAL, "%s: checkpoint format version %u, this build reads %d", path, version,
                       AB_CKPT_VERSION);
    unsigned char h[HEADER_BYTES];
    memcpy(h, b, HEADER_BYTES);
    ab_put_u32(h + 36, 0);
    if (crc_of(h, HEADER_BYTES) != ab_get_u32(b + 36))
        return ab_fail(AB_EINVAL, "%s: checkpoint header is corrupt (CRC mismatch)", path);

    /* The header is what its writer meant; now check that it makes sense. */
    uint32_t hbytes = ab_get_u32(b + 16), ebytes = ab_get_u32(b + 20), align = ab_get_u32(b + 32), zero = ab_get_u32(b + 60);
    hf->count = ab_get_u32(b + 24);
    hf->cap = ab_get_u32(b + 28);
    hf->table_crc = ab_get_u32(b + 56);
    hf->data_off = ab_get_u64(b + 40);
    hf->file_bytes = ab_get_u64(b + 48);
    if (hbytes != HEADER_BYTES || ebytes != ENTRY_BYTES || align != ALIGN || zero != 0)
        return ab_fail(AB_EINVAL, "%s: malformed checkpoint header (sizes %u/%u/%u)", path, hbytes, ebytes, align);
    if (hf->cap > MAX_CAPACITY || hf->count > hf->cap)
        return ab_fail(AB_EINVAL, "%s: bad checkpoint table (%u blobs in %u slots, at most %u)", path, hf->count,
                       hf->cap, MAX_CAPACITY);
    if (hf->data_off != data_offset_for(hf->cap) || hf->file_bytes < hf->data_off)
        return ab_fail(AB_EINVAL, "%s: malformed checkpoint header (data at %llu, file of %llu bytes)", path,
                       (unsigned long long)hf->data_off, (unsigned long long)hf->file_bytes);
    if ((uint64_t)size < hf->file_bytes)
        return ab_fail(AB_EINVAL, "%s: truncated checkpoint (%zu bytes, its header says %llu)", path, size,
                       (unsigned long long)hf->file_bytes);
    if ((uint64_t)size > hf->file_bytes)
        return ab_fail(AB_EINVAL, "%s: %llu unexpected bytes after the end of the checkpoint", path,
                       (unsigned long long)((uint64_t)size - hf->file_bytes));
    return 0;
}

/* Reads the first bytes, checks the header, then reads the whole file into r->buf. */
static int slurp(ab_ckpt_reader *r, header_fields *hf) {
    int rc;
    FILE *f = ab_fopen_regular(r->path, "checkpoint", &rc); /* a FIFO is refused, not waited on */
    if (!f) return rc;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        int e = errno;
        fclose(f);
        return ab_fail(ab_io_code(e), "cannot read checkpoint %s: %s", r->path, strerror(e));
    }
    if ((unsigned long long)st.st_size > (unsigned long long)SIZE_MAX) {
        fclose(f);
        return ab_fail(AB_ENOMEM, "checkpoint %s is too large for this machine", r->path);
    }
    r->size = (size_t)st.st_size;
    unsigned char head[HEADER_BYTES];
    size_t nh = r->size < HEADER_BYTES ? r->size : HEADER_BYTES;
    if (fread(head, 1, nh, f) != nh)
        rc = ab_fail(ferror(f) ? ab_io_code(errno) : AB_EIO, "cannot read checkpoint %s: %s", r->path,
                     ferror(f) ? strerror(errno) : "it shrank");
    if (!rc) rc = check_header(r->path, head, r->size, hf);
    const char *big = rc ? NULL : ab_too_large(r->size);
    if (big) rc = ab_fail(AB_EINVAL, "checkpoint %s: %zu bytes, %s", r->path, r->size, big);
    if (!rc) {
        r->buf = ab_alloc(r->size); /* size >= 64 here */
        if (!r->buf)
            rc = ab_fail(AB_ENOMEM, "checkpoint %s: cannot allocate %zu bytes to read it", r->path, r->size);
    }
    if (!rc) {
        memcpy(r->buf, head, HEADER_BYTES);
        size_t rest = r->size - HEADER_BYTES;
        if (fread(r->buf + HEADER_BYTES, 1, rest, f) != rest)
            rc = ab_fail(ferror(f) ? ab_io_code(errno) : AB_EIO, "cannot read checkpoint %s: %s", r->path,
                         ferror(f) ? strerror(errno) : "the file shrank while being read");
    }
    fclose(f);
    return rc;
}

/* The table, the layout, the padding and the blobs' CRCs (the header passed). */
static int validate(ab_ckpt_reader *r, const header_fields *hf) {
    const char *path = r->path;
    const unsigned char *b = r->buf;
    const uint32_t count = hf->count, cap = hf->cap;
    const uint64_t file_bytes = hf->file_bytes;
    const unsigned char *table = b + HEADER_BYTES;
    if (crc_of(table, (size_t)cap * ENTRY_BYTES) != hf->table_crc)
        return ab_fail(AB_EINVAL, "%s: checkpoint table is corrupt (CRC mismatch)", path);

    r->entries = calloc(count ? count : 1, sizeof(entry));
    if (!r->entries) return ab_fail(AB_ENOMEM, "out of memory");
    uint64_t end = hf->data_off; /* where the previous blob ended */
    for (uint32_t i = 0; i < cap; i++) {
        const unsigned char *t = table + (size_t)i * ENTRY_BYTES;
        if (i >= count) {
            for (unsigned j = 0; j < ENTRY_BYTES; j++)
                if (t[j]) return ab_fail(AB_EINVAL, "%s: bad checkpoint table (unused slot %u is not empty)", path, i);
            continue;
        }
        entry *e = &r->entries[i];
        size_t len = strnlen((const char *)t, NAME_BYTES);
        if (len == NAME_BYTES || !name_ok((const char *)t, len))
            return ab_fail(AB_EINVAL, "%s: bad checkpoint table (entry %u has no valid name)", path, i);
        for (size_t j = len; j < NAME_BYTES; j++)
            if (t[j]) return ab_fail(AB_EINVAL, "%s: bad checkpoint table (entry %u: bytes after its name)", path, i);
        memcpy(e->name, t, NAME_BYTES);
        e->offset = ab_get_u64(t + 40);
        e->bytes = ab_get_u64(t + 48);
        e->crc = ab_get_u32(t + 56);
        if (ab_get_u32(t + 60) != 0)
            return ab_fail(AB_EINVAL, "%s: bad checkpoint table (entry '%s': reserved field)", path, e->name);
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(r->entries[j].name, e->name) == 0)
                return ab_fail(AB_EINVAL, "%s: bad checkpoint table (blob '%s' appears twice)", path, e->name);
        /* offset first: the padding before a blob can carry it past the end of the file
         * (the last blob ending short of an alignment boundary), and file_bytes - offset
         * would then wrap, letting a huge size through whose offset + bytes wraps back
         * to the file's size. */
        uint64_t want = align_up(end);
        if (e->offset != want || e->offset > file_bytes || e->bytes > file_bytes - e->offset)
            return ab_fail(AB_EINVAL,
                           "%s: bad checkpoint table (blob '%s' at %llu + %llu bytes; expected offset %llu, file "
                           "of %llu bytes)",
                           path, e->name, (unsigned long long)e->offset, (unsigned long long)e->bytes,
                           (unsigned long long)want, (unsigned long long)file_bytes);
        for (uint64_t j = end; j < e->offset; j++)
            if (b[j]) return ab_fail(AB_EINVAL, "%s: checkpoint is corrupt (padding before blob '%s')", path, e->name);
        end = e->offset + e->bytes;
    }
    if (end != file_bytes)
        return ab_fail(AB_EINVAL, "%s: bad checkpoint table (blobs end at %llu, the file at %llu)", path,
                       (unsigned long long)end, (unsigned long long)file_bytes);
    r->count = (int)count;
    for (int i = 0; i < r->count; i++) {
        const entry *e = &r->entries[i];
        if (crc_of(b + e->offset, (size_t)e->bytes) != e->crc)
            return ab_fail(AB_EINVAL, "%s: blob '%s' is corrupt (CRC mismatch)", path, e->name);
    }
    return 0;
}

int ab_ckpt_open(const char *path, ab_ckpt_reader **out) {
    *out = NULL;
    ab_ckpt_reader *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path))) {
        free(r);
        return ab_fail(AB_ENOMEM, "out of memory");
    }
    header_fields hf = {0};
    int rc = slurp(r, &hf);
    if (!rc) rc = validate(r, &hf);
    if (rc) {
        ab_ckpt_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

const char *ab_ckpt_path(const ab_ckpt_reader *r) { return r->path; }
int ab_ckpt_count(const ab_ckpt_reader *r) { return r->count; }
const char *ab_ckpt_name(const ab_ckpt_reader *r, int i) {
    return i >= 0 && i < r->count ? r->entries[i].name : NULL;
}

static const entry *find(const ab_ckpt_reader *r, const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < r->count; i++)
        if (strcmp(r->entries[i].name, name) == 0) return &r->entries[i];
    return NULL;
}

bool ab_ckpt_has(const ab_ckpt_reader *r, const char *name) { return find(r, name) != NULL; }

int ab_ckpt_get(const ab_ckpt_reader *r, const char *name, const void **data, size_t *bytes) {
    const entry *e = find(r, name);
    if (!e) return ab_fail(AB_EINVAL, "%s: no blob '%s' in the checkpoint", r->path, name ? name : "(null)");
    *data = r->buf + e->offset;
    *bytes = (size_t)e->bytes;
    return 0;
}

int ab_ckpt_read(const ab_ckpt_reader *r, const char *name, void *dst, size_t expected) {
    const void *p;
    size_t n;
    int rc = ab_ckpt_get(r, name, &p, &n);
    if (rc) return rc;
    if (n != expected)
        return ab_fail(AB_EINVAL, "%s: blob '%s' has %zu bytes, expected %zu", r->path, name, n, expected);
    if (n) memcpy(dst, p, n);
    return 0;
}

/* ------------------------------------------------------------------------------------
 * Common blobs
 * ---------------------------------------------------------------------------------- */

int ab_ckpt_add_json(ab_ckpt_writer *w, const char *name, const json_t *value) {
    if (!w) return ab_fail(AB_EINVAL, "checkpoint: add on a NULL writer");
    if (!value) return ab_ckpt_poison(w, ab_fail(AB_EINVAL, "checkpoint %s: blob '%s': no JSON value", w->af.path, name));
    char *text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
    if (!text) return ab_ckpt_poison(w, ab_fail(AB_ENOMEM, "checkpoint %s: cannot encode blob '%s' as JSON", w->af.path, name));
    int rc = ab_ckpt_add(w, name, text, strlen(text));
    free(text);
    return rc;
}

int ab_ckpt_get_json(const ab_ckpt_reader *r, const char *name, json_t **out) {
    const void *p;
    size_t n;
    *out = NULL;
    int rc = ab_ckpt_get(r, name, &p, &n);
    if (rc) return rc;
    json_error_t err;
    json_t *v = json_loadb(p, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &err);
    if (!v) return ab_fail(AB_EINVAL, "%s: blob '%s' is not valid JSON: %s", r->path, name, err.text);
    *out = v;
    return 0;
}
