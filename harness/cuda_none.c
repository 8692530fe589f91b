/* cuda_device.h and cuda_blas.h in a build without CUDA (nvcc was not found, or -Dcuda=disabled):
 * every call that would need the device fails with one clear message. */
#include "cuda_blas.h"
#include "cuda_device.h"
#include "cuda_traffic.h"

#include "error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NO_CUDA "this build has no CUDA backend (nvcc was not found when it was configured; " \
                "rebuild on a machine with the CUDA toolkit, or use --device cpu)"

bool ab_cuda_built(void) { return false; }
bool ab_cuda_emulated(void) { return false; }
int ab_cuda_init(void) { return ab_fail(AB_EDEVICE, NO_CUDA); }
int ab_cuda_load_cublas(void) { return ab_fail(AB_EDEVICE, NO_CUDA); }
bool ab_cuda_ready(void) { return false; }
int ab_cuda_select_device(int index) {
    (void)index;
    return ab_fail(AB_EDEVICE, NO_CUDA);
}
void *ab_cuda_stream_handle(void) { return NULL; }

int ab_cuda_malloc(void **out, size_t bytes) {
    (void)bytes;
    if (out) *out = NULL;
    return ab_fail(AB_EDEVICE, NO_CUDA);
}

void ab_cuda_free(void *p) {
    if (p) {
        fprintf(stderr, "attnbench: ab_cuda_free of a pointer not from ab_cuda_malloc\n");
        abort();
    }
}

int ab_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return ab_fail(AB_EDEVICE, NO_CUDA);
}
int ab_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return ab_fail(AB_EDEVICE, NO_CUDA);
}
int ab_cuda_memset(void *p, int value, size_t bytes) {
    (void)p, (void)value, (void)bytes;
    return ab_fail(AB_EDEVICE, NO_CUDA);
}
int ab_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return ab_fail(AB_EDEVICE, NO_CUDA);
}
int ab_cuda_sync(void) { return ab_fail(AB_EDEVICE, NO_CUDA); }
int ab_cuda_graph_begin(void) { return ab_fail(AB_EDEVICE, NO_CUDA); }
int ab_cuda_graph_end(void **graph) {
    if (graph) *graph = NULL;
    return ab_fail(AB_EDEVICE, NO_CUDA);
}
int ab_cuda_graph_launch(void *graph) {
    (void)graph;
    return ab_fail(AB_EDEVICE, NO_CUDA);
}
void ab_cuda_graph_destroy(void *graph) { (void)graph; }
int ab_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
    return ab_fail(AB_EDEVICE, NO_CUDA);
}
int ab_cuda_device_info(ab_cuda_info *info) {
    if (info) memset(info, 0, sizeof *info);
    return ab_fail(AB_EDEVICE, NO_CUDA);
}

const char *ab_precision_name(ab_precision p) { return p == AB_PREC_FP32 ? "fp32" : p == AB_PREC_TF32 ? "tf32" : "?"; }

/* Nothing to set without CUDA: the precision is remembered only to be given back. */
ab_precision ab_cuda_set_gemm_precision(ab_precision p) {
    static ab_precision cur = AB_PREC_FP32;
    ab_precision old = cur;
    cur = p;
    return old;
}

int ab_cuda_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                  const float *b, int ldb, float beta, float *c, int ldc) {
    (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb;
    (void)beta, (void)c, (void)ldc;
    return ab_fail(AB_EDEVICE, NO_CUDA);
}

int ab_cuda_sgemm_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                          long long stride_a, const float *b, int ldb, long long stride_b, float beta, float *c,
                          int ldc, long long stride_c, long long batch) {
    (void)stride_a, (void)stride_b, (void)stride_c, (void)batch;
    return ab_cuda_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

bool ab_cuda_traffic_counted(void) { return false; }
void ab_cuda_traffic_start(void) {}
void ab_cuda_traffic_stop(void) {}
void ab_cuda_traffic_total(ab_traffic_counts *c, unsigned long long *h2d_bytes, unsigned long long *d2h_bytes) {
    if (c) memset(c, 0, sizeof *c);
    if (h2d_bytes) *h2d_bytes = 0;
    if (d2h_bytes) *d2h_bytes = 0;
}
int ab_cuda_traffic_entries(void) { return 0; }
const char *ab_cuda_traffic_entry(int i, ab_traffic_kind *kind, ab_traffic_counts *c) {
    (void)i, (void)kind, (void)c;
    return NULL;
}
const char *ab_traffic_kind_name(ab_traffic_kind k) {
    static const char *const names[] = {"kernel", "cublas", "memset", "memcpy", "sort"};
    return (unsigned)k < sizeof names / sizeof *names ? names[k] : "?";
}
