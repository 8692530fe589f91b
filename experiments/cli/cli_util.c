#include "cli_util.h"

#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

_Noreturn void cli_die(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("attnbench: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(status);
}

int cli_status_for(int code) {
    return (code == AB_EINVAL || code == AB_EUNSUPPORTED || code == AB_EIO) ? AB_EXIT_USAGE : AB_EXIT_FAILURE;
}

long long cli_parse_int(const char *opt, const char *s, long long min, long long max) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno)
        cli_die(AB_EXIT_USAGE, "%s %s: not an integer", opt, s);
    if (x < min || x > max) cli_die(AB_EXIT_USAGE, "%s %s: must be in [%lld, %lld]", opt, s, min, max);
    return x;
}

uint64_t cli_parse_u64(const char *opt, const char *s) {
    char *end;
    errno = 0;
    if (*s == '-') cli_die(AB_EXIT_USAGE, "%s %s: must be a non-negative integer", opt, s);
    unsigned long long x = strtoull(s, &end, 0);
    if (*s == '\0' || *end != '\0' || errno) cli_die(AB_EXIT_USAGE, "%s %s: not a non-negative integer", opt, s);
    return (uint64_t)x;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) cli_die(AB_EXIT_USAGE, "%s needs a value", argv[*i]);
    *i += 1;
    return argv[*i];
}
