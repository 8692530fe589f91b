#include "error.h"

#include <stdio.h>

static _Thread_local char g_msg[1024];

int ab_vfail(int code, const char *fmt, va_list ap) {
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    return code;
}

int ab_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ab_vfail(code, fmt, ap);
    va_end(ap);
    return code;
}

const char *ab_error(void) { return g_msg; }

void ab_clear_error(void) { g_msg[0] = '\0'; }

const char *ab_strerror(int code) {
    switch (code) {
    case AB_OK: return "ok";
    case AB_EINVAL: return "invalid argument";
    case AB_ENOMEM: return "out of memory";
    case AB_EUNSUPPORTED: return "unsupported";
    case AB_EIO: return "i/o error";
    case AB_EDEVICE: return "device error";
    default: return "unknown error";
    }
}
