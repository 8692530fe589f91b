/* Per-thread error messages and the error codes every library call returns. */
#ifndef AB_ERROR_H
#define AB_ERROR_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes: 0 is success; library calls return one of these negatives. */
enum {
    AB_OK = 0,
    AB_EINVAL = -1,      /* bad input: shapes, options, values, files */
    AB_ENOMEM = -2,      /* out of memory (host or device) */
    AB_EUNSUPPORTED = -3, /* valid request the variant or device cannot do */
    AB_EIO = -4,         /* file system failure */
    AB_EDEVICE = -5,     /* device (CUDA) failure */
    AB_ESYSTEM = -6,     /* a resource or system failure: a full disk or quota, an I/O error, too many open
                          * files or processes (ab_io_code) */
};

/* The code of a failed file or process call by its errno: AB_ESYSTEM for a resource or
 * system failure (ENOSPC, EDQUOT, EIO, EFBIG, EMFILE, ENFILE, EAGAIN, ENOBUFS), AB_ENOMEM
 * for ENOMEM, AB_EIO otherwise (a path that is missing, not permitted, read-only: the
 * user's input). */
int ab_io_code(int err);

/* Sets this thread's message (printf-style) and returns `code`, so call sites read
 * `return ab_fail(AB_EINVAL, "...", ...);`. */
int ab_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ab_vfail(int code, const char *fmt, va_list ap);

/* The message of the last failure on this thread ("" if none). */
const char *ab_error(void);
void ab_clear_error(void);

#ifdef __cplusplus
}
#endif

#endif
