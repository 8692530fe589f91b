/* Helpers for the CLI commands: argument parsing and the one-line error exit. */
#ifndef AB_CLI_UTIL_H
#define AB_CLI_UTIL_H

#include "device_type.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* Exit statuses, the same in every command: README.md's "Exit status" is where they are
 * documented for users (main.c's usage text repeats them):
 *   0    done
 *   1    a resource or system failure on a valid request: out of memory (host or
 *        device, whatever the command and wherever the allocation), a full disk or
 *        quota, an I/O error, too many open files (AB_ESYSTEM), device errors, a
 *        training run that diverged, a point of a sweep that failed
 *   2    bad input or usage: unknown names or options, malformed or foreign files
 *        (including files that promise more data than they hold, refused before any
 *        allocation, inputs larger than the machine's memory, and inputs that are not
 *        regular files), configs, shapes, paths that are missing or not permitted,
 *        output paths, a data directory's command run without consent; also a request
 *        this build or machine cannot serve (no CUDA device)
 *   130  interrupted (Ctrl-C, SIGTERM) where a command stops cleanly (train, bench),
 *        with what was done so far written; elsewhere the signal ends the process
 * A library error code goes through cli_status_for: AB_EINVAL, AB_EUNSUPPORTED and
 * AB_EIO to 2; AB_ENOMEM, AB_EDEVICE and AB_ESYSTEM to 1. */
#define AB_EXIT_USAGE 2
#define AB_EXIT_FAILURE 1

/* Prints "attnbench: error: MESSAGE" on one line to stderr and exits with `status`.
 * Control characters in the message (a newline in a path or a label) are written as
 * escapes (\n, \t, \xHH), so the message stays one line whatever it quotes. */
_Noreturn void cli_die(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same for a rank of a data-parallel run (ab_error()'s message, with "rank K of R: "
 * on ranks other than 0); whole_job: end every rank (ab_dist_abort; a failure that may
 * be this rank's alone), else this one after closing the engine (a refusal all share). */
struct ab_dist;
_Noreturn void cli_die_rank(struct ab_dist *d, int status, bool whole_job);
/* Prints "attnbench: warning: MESSAGE" on one line to stderr (escaped as cli_die's) and
 * returns: for what went wrong beside a measurement that is kept (a figure not drawn). */
void cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Exit status for a library error code: AB_EXIT_USAGE for bad input (AB_EINVAL,
 * AB_EUNSUPPORTED, AB_EIO), AB_EXIT_FAILURE for everything else (AB_ENOMEM, AB_EDEVICE,
 * AB_ESYSTEM). */
int cli_status_for(int code);

/* How the commands' JSON documents are dumped (indented, in insertion order, 9 digits). */
#define CLI_JSON_FLAGS (JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9))

/* Writes doc as the whole file path (replaced only by a complete new file: written
 * beside it and renamed), a newline after it; dies with one line on failure. */
void cli_write_json(const char *path, const json_t *doc);

/* Parsers that die with a one-line message naming the option on bad input. */
long long cli_parse_int(const char *opt, const char *s, long long min, long long max);
uint64_t cli_parse_u64(const char *opt, const char *s);
/* argv[*i] is `opt`; returns argv[*i + 1] and advances, or dies if it is missing. */
const char *cli_value(int argc, char **argv, int *i);
/* The same for an option naming a file or folder (--out): an empty value is refused
 * (joined as "DIR/NAME" it would name files in the root folder). */
const char *cli_path_value(int argc, char **argv, int *i);
/* The same for --device: its value parsed (ab_device_parse), or dies with "--device X:
 * must be cpu or cuda". */
ab_device cli_device_value(int argc, char **argv, int *i);

/* Where plots/NAME (a gnuplot script) is: $ATTNBENCH_PLOTS, the source tree, or the
 * installed copy; buf on success, NULL when none has it. */
const char *cli_find_plot_script(const char *name, char *buf, size_t cap);
/* Runs gnuplot -c SCRIPT ARGS... (args NULL-terminated, passed as they are: no shell)
 * and waits for it: its exit status, or -1 when it could not be started. */
int cli_gnuplot(const char *script, const char *const *args);
/* Draws OUT with plots/SCRIPT_NAME: `gnuplot -c SCRIPT DATA TMP EXTRA...` (extra
 * NULL-terminated, or NULL), TMP a name beside OUT with its extension (the scripts pick
 * the terminal from it), renamed over OUT once gnuplot exits 0: OUT is only ever
 * replaced by a complete figure. Returns 0, or -1 with the reason in `why` (one line:
 * the script not found, gnuplot not started, its exit status), TMP removed. The data a
 * command measured is written before it draws: a figure that cannot be drawn loses
 * nothing else. */
int cli_draw(const char *script_name, const char *data, const char *out, const char *const *extra, char *why,
             size_t cap);

#endif
