/* harness/checkpoint.c: ab_ckpt_open on any bytes, then every blob read back (as bytes
 * and as JSON). Each input is tried twice: as it is (the CRCs refuse nearly every
 * change), and with its CRCs made right for its bytes (blobs, then table, then header,
 * where the input is long enough to hold them), so that the checks behind the CRCs
 * (layout, offsets, sizes, padding, names) see mutated structure too: the crash of
 * issue 16 (a wrapping blob size) needed valid CRCs. */
#include "bytes.h"
#include "checkpoint.h"
#include "error.h"
#include "fuzz_util.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

enum { HEADER = 64, ENTRY = 64, MAX_CAPACITY = 65536 };

static uint32_t crc(const unsigned char *p, size_t n) { return (uint32_t)crc32(crc32(0L, Z_NULL, 0), p, (uInt)n); }

/* Sets the CRCs of a container's blobs, table and header from its own fields. */
static void fix_crcs(unsigned char *b, size_t size) {
    if (size < HEADER) return;
    uint32_t count = ab_get_u32(b + 24), cap = ab_get_u32(b + 28);
    if (cap > MAX_CAPACITY) cap = MAX_CAPACITY;
    for (uint32_t i = 0; i < count && i < cap && HEADER + (size_t)(i + 1) * ENTRY <= size; i++) {
        unsigned char *t = b + HEADER + (size_t)i * ENTRY;
        uint64_t off = ab_get_u64(t + 40), n = ab_get_u64(t + 48);
        if (off <= size && n <= size - off) ab_put_u32(t + 56, crc(b + off, (size_t)n));
    }
    if (HEADER + (size_t)cap * ENTRY <= size) ab_put_u32(b + 56, crc(b + HEADER, (size_t)cap * ENTRY));
    ab_put_u32(b + 36, 0);
    ab_put_u32(b + 36, crc(b, HEADER));
}

static void read_all(const unsigned char *data, size_t size) {
    ab_ckpt_reader *r;
    int rc = ab_ckpt_open(fuzz_file("input.ckpt", data, size), &r);
    if (rc) {
        fuzz_refused(rc, "ab_ckpt_open");
        return;
    }
    for (int i = 0; i < ab_ckpt_count(r); i++) {
        const char *name = ab_ckpt_name(r, i);
        const void *p;
        size_t n;
        if (!name || !ab_ckpt_has(r, name)) fuzz_fail("ab_ckpt_name", "blob %d has no name", i);
        if ((rc = ab_ckpt_get(r, name, &p, &n))) fuzz_fail("ab_ckpt_get", "blob '%s' listed but not got", name);
        if (n > size || (uintptr_t)p % 64 != 0)
            fuzz_fail("ab_ckpt_get", "blob '%s': %zu bytes at %p", name, n, p);
        unsigned char *copy = malloc(n ? n : 1);
        if (!copy) abort();
        if ((rc = ab_ckpt_read(r, name, copy, n)) || (n && memcmp(copy, p, n) != 0))
            fuzz_fail("ab_ckpt_read", "blob '%s' reads back otherwise", name);
        free(copy);
        json_t *v;
        if ((rc = ab_ckpt_get_json(r, name, &v))) fuzz_refused(rc, "ab_ckpt_get_json");
        else json_decref(v);
    }
    if (ab_ckpt_name(r, ab_ckpt_count(r)) || ab_ckpt_name(r, -1)) fuzz_fail("ab_ckpt_name", "a name past the table");
    ab_ckpt_close(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    read_all(data, size);
    unsigned char *fixed = malloc(size ? size : 1);
    if (!fixed) abort();
    memcpy(fixed, data, size);
    fix_crcs(fixed, size);
    if (memcmp(fixed, data, size) != 0) read_all(fixed, size);
    free(fixed);
    fuzz_no_tracked_memory("ab_ckpt_open");
    return 0;
}
