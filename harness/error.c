#include "error.h"

#include <errno.h>
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

int ab_io_code(int err) {
    switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EIO:
    case EFBIG:
    case EMFILE:
    case ENFILE:
    case EAGAIN:
    case ENOBUFS: return AB_ESYSTEM;
    case ENOMEM: return AB_ENOMEM;
    default: return AB_EIO;
    }
}

const char *ab_error(void) { return g_msg; }

void ab_clear_error(void) { g_msg[0] = '\0'; }

