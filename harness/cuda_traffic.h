/* Memory traffic of the CUDA device's operations, as the instrumented CPU emulator
 * counts it (the emulated build's traffic library; tests/cuda_emu/cuda_emu.h, section
 * "Memory traffic" of its first comment, has the model). A roofline without a GPU:
 * bytes a kernel would move, against the bytes its operation must move.
 *
 * Present in every build. Where nothing is counted (a real GPU, the plain emulated
 * library, a build without CUDA, a sanitized build) ab_cuda_traffic_counted() is false
 * and every count reads zero.
 *
 * Counting is off until ab_cuda_traffic_start(); it covers the operations queued
 * between start and stop, one host thread at a time. */
#ifndef AB_CUDA_TRAFFIC_H
#define AB_CUDA_TRAFFIC_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What one operation, or a sum of them, moved in device memory. */
typedef struct {
    unsigned long long launches;              /* operations (kernel launches, cuBLAS calls, ...) */
    unsigned long long req_read, req_write;   /* requested bytes: the sum of the access sizes */
    unsigned long long dram_read, dram_write; /* 32 x distinct 32-byte sectors per operation */
} ab_traffic_counts;

typedef enum {
    AB_TRAFFIC_KERNEL = 0, /* a kernel launch */
    AB_TRAFFIC_CUBLAS = 1, /* a cuBLAS call */
    AB_TRAFFIC_MEMSET = 2, /* cudaMemset */
    AB_TRAFFIC_MEMCPY = 3, /* a device-to-device copy */
    AB_TRAFFIC_SORT = 4,   /* CUB's radix sort */
} ab_traffic_kind;

/* True when this process counts (the instrumented emulator). */
bool ab_cuda_traffic_counted(void);
/* Zeroes the counts and counts from now on; stop ends the counting (counts kept). */
void ab_cuda_traffic_start(void);
void ab_cuda_traffic_stop(void);
/* The sums since start: device operations; host-to-device and device-to-host copy
 * bytes (any pointer may be NULL). */
void ab_cuda_traffic_total(ab_traffic_counts *c, unsigned long long *h2d_bytes, unsigned long long *d2h_bytes);
/* The operations by name (a kernel's name as launched, the cuBLAS call's, "cudaMemset",
 * ...), in order of first appearance since start: their number; the i-th one's name
 * (valid until the next start; NULL past the end), kind and sums. */
int ab_cuda_traffic_entries(void);
const char *ab_cuda_traffic_entry(int i, ab_traffic_kind *kind, ab_traffic_counts *c);
/* "kernel", "cublas", "memset", "memcpy", "sort". */
const char *ab_traffic_kind_name(ab_traffic_kind k);

#ifdef __cplusplus
}
#endif

#endif
