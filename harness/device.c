#include "device.h"

#include "cuda_device.h"
#include "error.h"

#include <string.h>

bool ab_dev_host_memory(ab_device d) { return d == AB_DEV_CPU; }

int ab_dev_init(ab_device d) { return d == AB_DEV_CUDA ? ab_cuda_init() : 0; }

int ab_dev_malloc(ab_device d, void **out, size_t bytes) {
    *out = NULL;
    if (bytes == 0) return 0;
    if (d == AB_DEV_CUDA) return ab_cuda_malloc(out, bytes);
    *out = ab_alloc(bytes);
    return *out ? 0 : AB_ENOMEM;
}

void ab_dev_free(ab_device d, void *p) {
    if (d == AB_DEV_CUDA) ab_cuda_free(p);
    else ab_free(p);
}

int ab_dev_upload(ab_device d, void *dst, const void *src, size_t bytes) {
    if (d == AB_DEV_CUDA) return ab_cuda_memcpy_h2d(dst, src, bytes);
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}

int ab_dev_download(ab_device d, void *dst, const void *src, size_t bytes) {
    if (d == AB_DEV_CUDA) return ab_cuda_memcpy_d2h(dst, src, bytes);
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}

int ab_dev_memset(ab_device d, void *p, int value, size_t bytes) {
    if (d == AB_DEV_CUDA) return ab_cuda_memset(p, value, bytes);
    if (bytes) memset(p, value, bytes);
    return 0;
}

int ab_dev_copy(ab_device d, void *dst, const void *src, size_t bytes) {
    if (d == AB_DEV_CUDA) return ab_cuda_memcpy_d2d(dst, src, bytes);
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}

int ab_dev_sync(ab_device d) { return d == AB_DEV_CUDA ? ab_cuda_sync() : 0; }
