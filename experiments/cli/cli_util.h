/* Helpers for the CLI commands: argument parsing and the one-line error exit. */
#ifndef AB_CLI_UTIL_H
#define AB_CLI_UTIL_H

#include <stdbool.h>
#include <stdint.h>

/* Exit status for bad input (unknown names, malformed files or configs, bad shapes),
 * and for failures of the run itself (out of memory, device errors). */
#define AB_EXIT_USAGE 2
#define AB_EXIT_FAILURE 1

/* Prints "attnbench: error: MESSAGE" on one line to stderr and exits with `status`. */
_Noreturn void cli_die(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Exit status for a library error code: AB_EXIT_USAGE for bad input, else AB_EXIT_FAILURE. */
int cli_status_for(int code);

/* Parsers that die with a one-line message naming the option on bad input. */
long long cli_parse_int(const char *opt, const char *s, long long min, long long max);
uint64_t cli_parse_u64(const char *opt, const char *s);
/* argv[*i] is `opt`; returns argv[*i + 1] and advances, or dies if it is missing. */
const char *cli_value(int argc, char **argv, int *i);

#endif
