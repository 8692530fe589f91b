/* The devices a computation runs on: one type for the harness (memory.h, device.h),
 * the attention library (attention.h), the models and the experiments, so that no
 * layer converts between device enums. Installed beside attention.h, which uses it. */
#ifndef AB_DEVICE_TYPE_H
#define AB_DEVICE_TYPE_H

#ifdef __cplusplus
extern "C" {
#endif

/* The values index per-device tables (the models' layer table, the tracked
 * allocator's counters): AB_DEV_COUNT is their length. */
typedef enum { AB_DEV_CPU = 0, AB_DEV_CUDA = 1, AB_DEV_COUNT } ab_device;

/* "cpu" or "cuda" (as --device and the results' "device" field spell them), or
 * "unknown" for a value outside the enum. */
const char *ab_device_name(ab_device d);

/* The device named s ("cpu" or "cuda"): 0 and *out, or AB_EINVAL (error.h) with the
 * message "device 'S': must be cpu or cuda". */
int ab_device_parse(const char *s, ab_device *out);

#ifdef __cplusplus
}
#endif

#endif
