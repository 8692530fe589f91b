#include "device_type.h"

#include "error.h"

#include <string.h>

static const char *const g_names[AB_DEV_COUNT] = {[AB_DEV_CPU] = "cpu", [AB_DEV_CUDA] = "cuda"};

const char *ab_device_name(ab_device d) {
    return (unsigned)d < AB_DEV_COUNT ? g_names[d] : "unknown";
}

int ab_device_parse(const char *s, ab_device *out) {
    for (ab_device d = AB_DEV_CPU; s && d < AB_DEV_COUNT; d++)
        if (strcmp(s, g_names[d]) == 0) {
            *out = d;
            return 0;
        }
    return ab_fail(AB_EINVAL, "device '%s': must be cpu or cuda", s ? s : "(null)");
}
