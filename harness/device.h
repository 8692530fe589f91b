/* Memory and synchronisation on either device, for code that runs the same way on the
 * CPU and on CUDA (the registry, the CLI, the sweep, tests): the CPU side is the
 * tracked host allocator (memory.h), the CUDA side cuda_device.h. */
#ifndef AB_DEVICE_H
#define AB_DEVICE_H

#include "memory.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Whether device d's memory is the host's (the CPU): its pointers are read and written
 * directly, with no staging and no copies in between. */
bool ab_dev_host_memory(ab_device d);

/* Makes device d ready for use: nothing on the CPU; on CUDA ab_cuda_init (AB_EDEVICE
 * "this build has no CUDA backend ..." or "no CUDA device: ..."). */
int ab_dev_init(ab_device d);

/* Tracked allocation on device d: 0 and *out, or AB_ENOMEM / AB_EDEVICE with a
 * message. bytes == 0 gives *out = NULL. */
int ab_dev_malloc(ab_device d, void **out, size_t bytes);
void ab_dev_free(ab_device d, void *p);
/* Copies host -> device d and device d -> host (plain memcpy on the CPU). Synchronous. */
int ab_dev_upload(ab_device d, void *dst, const void *src, size_t bytes);
int ab_dev_download(ab_device d, void *dst, const void *src, size_t bytes);
int ab_dev_memset(ab_device d, void *p, int value, size_t bytes);
/* Copies within device d's memory (queued on CUDA, like memset; memcpy on the CPU). */
int ab_dev_copy(ab_device d, void *dst, const void *src, size_t bytes);
/* Waits for the device's queued work (nothing to wait for on the CPU). */
int ab_dev_sync(ab_device d);

#ifdef __cplusplus
}
#endif

#endif
