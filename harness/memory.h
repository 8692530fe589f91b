/* Tracked allocator: every large buffer goes through it so that "peak memory" in a
 * result is the bytes the harness itself asked for, per device. Thread-safe. */
#ifndef AB_MEMORY_H
#define AB_MEMORY_H

#include "device_type.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 64-byte aligned host allocation, counted on AB_DEV_CPU. NULL (with a message set)
 * on failure or on a zero size. */
void *ab_alloc(size_t bytes);
/* Same, zero-filled. */
void *ab_calloc(size_t bytes);
void ab_free(void *p);
size_t ab_alloc_size(const void *p);

/* Accounting hooks for other devices' allocators (the CUDA backend). */
void ab_mem_account(ab_device dev, long long delta_bytes);

size_t ab_mem_current(ab_device dev);
size_t ab_mem_peak(ab_device dev);
/* Sets the peak to the current figure. */
void ab_mem_reset_peak(ab_device dev);

/* The high-water mark of this process's resident set in bytes (VmHWM), or 0 if
 * unknown. */
size_t ab_process_peak_rss(void);

/* An input that asks for more memory than this machine has (RAM and swap, sysinfo) is
 * bad input, refused with exit status 2 like other impossible sizes, not an
 * out-of-memory failure: NULL when `bytes` could be held, else "more than this
 * machine's memory and swap (X GiB)" for the caller's one-line message (a per-thread
 * buffer, valid until the next call). */
const char *ab_too_large(size_t bytes);

/* a * b (* c) with overflow check: returns 0 and sets *out, or -1 on overflow. */
int ab_mul_size(size_t a, size_t b, size_t *out);

#ifdef __cplusplus
}
#endif

#endif
