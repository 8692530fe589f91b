#include "memory.h"

#include "error.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>

/* Each block carries a 64-byte header holding its size, so ab_free needs no table. */
#define AB_HEADER 64u
#define AB_MAGIC 0x61626d656d6f7279ULL /* "abmemory" */

typedef struct {
    uint64_t magic;
    size_t bytes;
} ab_block_header;

static _Atomic long long g_current[AB_DEV_COUNT];
static _Atomic long long g_peak[AB_DEV_COUNT];

void ab_mem_account(ab_device dev, long long delta) {
    long long now = atomic_fetch_add(&g_current[dev], delta) + delta;
    long long peak = atomic_load(&g_peak[dev]);
    while (now > peak && !atomic_compare_exchange_weak(&g_peak[dev], &peak, now)) {
    }
}

size_t ab_mem_current(ab_device dev) { return (size_t)atomic_load(&g_current[dev]); }
size_t ab_mem_peak(ab_device dev) { return (size_t)atomic_load(&g_peak[dev]); }
void ab_mem_reset_peak(ab_device dev) { atomic_store(&g_peak[dev], atomic_load(&g_current[dev])); }

int ab_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return -1;
    *out = a * b;
    return 0;
}

void *ab_alloc(size_t bytes) {
    if (bytes == 0) {
        ab_fail(AB_EINVAL, "allocation of zero bytes");
        return NULL;
    }
    if (bytes > SIZE_MAX - 2 * AB_HEADER) {
        ab_fail(AB_ENOMEM, "allocation of %zu bytes is too large", bytes);
        return NULL;
    }
    size_t total = (bytes + AB_HEADER + 63u) & ~(size_t)63u;
    unsigned char *base = aligned_alloc(64, total);
    if (!base) {
        ab_fail(AB_ENOMEM, "out of host memory allocating %zu bytes", bytes);
        return NULL;
    }
    ab_block_header *h = (ab_block_header *)base;
    h->magic = AB_MAGIC;
    h->bytes = bytes;
    ab_mem_account(AB_DEV_CPU, (long long)bytes);
    return base + AB_HEADER;
}

void *ab_calloc(size_t bytes) {
    void *p = ab_alloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

size_t ab_alloc_size(const void *p) {
    if (!p) return 0;
    const ab_block_header *h = (const ab_block_header *)((const unsigned char *)p - AB_HEADER);
    return h->bytes;
}

void ab_free(void *p) {
    if (!p) return;
    unsigned char *base = (unsigned char *)p - AB_HEADER;
    ab_block_header *h = (ab_block_header *)base;
    if (h->magic != AB_MAGIC) {
        /* Freeing memory the tracker did not hand out is a programming error. */
        fprintf(stderr, "attnbench: ab_free of a pointer not from ab_alloc\n");
        abort();
    }
    h->magic = 0;
    ab_mem_account(AB_DEV_CPU, -(long long)h->bytes);
    free(base);
}

static size_t status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kib = 0, klen = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) == 0) {
            kib = (size_t)strtoull(line + klen, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kib * 1024;
}

size_t ab_process_peak_rss(void) { return status_kib("VmHWM:"); }

const char *ab_too_large(size_t bytes) {
    static _Thread_local char why[96];
    struct sysinfo si;
    if (sysinfo(&si) != 0) return NULL; /* unknown: let the allocation decide */
    const double cap = ((double)si.totalram + (double)si.totalswap) * (double)si.mem_unit;
    if ((double)bytes <= cap) return NULL;
    snprintf(why, sizeof why, "more than this machine's memory and swap (%.1f GiB)", cap / (1024.0 * 1024 * 1024));
    return why;
}
