/* Files and processes for the Criterion suites: scratch folders, whole-file reads and
 * writes, running a program with its output captured, and the CLI's one-line usage
 * error. Failures are Criterion assertions of the calling test. */
#ifndef AB_TEST_PROC_H
#define AB_TEST_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "test_sanitized.h"

/* ---- files ---- */

/* Makes `base` (and its parents) and a new empty folder inside it; its path goes into
 * dir (cap bytes). */
void tp_scratch_make(char *dir, size_t cap, const char *base);

/* dir/NAME with NAME formatted from fmt (up to 300 bytes), in a ring of 16 static
 * buffers: a test can hold 16 such paths at once. */
const char *tp_path(const char *dir, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Removes a folder and everything in it (only ever the tests' own scratch folders). */
void tp_rm_tree(const char *dir);

bool tp_exists(const char *path);

/* The whole file in a malloc'ed buffer with a NUL after its end; *size (if not NULL)
 * its length. Asserts that the file can be read. */
char *tp_slurp(const char *path, size_t *size);
unsigned char *tp_read_bytes(const char *path, size_t *size); /* the same, for binary data */

/* Writes n bytes of data as the whole file. */
void tp_write_bytes(const char *path, const void *data, size_t n);

/* ---- processes ---- */

/* The shell script that runs "$2" "$3"... under `ulimit -v "$1"` (KB), for
 * tp_spawn("/bin/sh", TP_ARGV("-c", TP_ULIMIT_SCRIPT, "sh", KB, EXE, ARG..., NULL)).
 * Under a sanitizer the limit is left out: AddressSanitizer reserves terabytes of
 * address space and a sanitized binary cannot start under one (test_sanitized.h). */
#define TP_ULIMIT_SCRIPT                                                                                               \
    (TEST_SANITIZED ? "shift && exec \"$@\"" : "ulimit -v \"$1\" && shift && exec \"$@\"")

/* A NULL-terminated argument list in place: TP_ARGV("op", "--help", NULL). */
#define TP_ARGV(...) ((const char *const[]){__VA_ARGS__})

/* Starts `exe` with `args` (NULL-terminated, after argv[0]), stdin from /dev/null,
 * stdout and stderr into dir/stdout.txt and dir/stderr.txt, and `env` ("NAME=VALUE",
 * or NULL) added to the environment (in place of a variable NAME already there: e.g.
 * "PATH=DIR" for a PATH without gnuplot). Returns its process id. */
pid_t tp_spawn(const char *dir, const char *exe, const char *env, const char *const *args);

/* Waits for a process of tp_spawn(dir, ...); *out and *err (each where not NULL) are
 * freed and replaced by what it wrote to stdout and stderr. Returns its exit status, or
 * 128 + the signal that ended it. */
int tp_wait(const char *dir, pid_t pid, char **out, char **err);

/* tp_wait with a deadline: a process still running `seconds` after the call is killed
 * (SIGKILL), and the result is then 128 + SIGKILL. For runs that must not block (a
 * FIFO given as an input) or must stop promptly (a signal). */
int tp_wait_for(const char *dir, pid_t pid, double seconds, char **out, char **err);

/* "PATH=DIR/..." for tp_spawn's `env`: a PATH without gnuplot on it, made in `dir`:
 * an empty folder, or (failing) one whose only program is a `gnuplot` that writes a
 * few bytes to its output file (the fourth argument of `gnuplot -c SCRIPT DATA OUT`)
 * and exits 1, as a gnuplot that breaks off halfway. Into env (cap bytes). */
void tp_env_without_gnuplot(char *env, size_t cap, const char *dir, bool failing);

/* tp_spawn, then tp_wait. */
int tp_run(const char *dir, const char *exe, const char *env, const char *const *args, char **out, char **err);

/* Whether a run was refused as bad input: exit status 2 and, on stderr (`err`), exactly
 * one line "attnbench: error: ..." holding every string of `must` (NULL-terminated, or
 * NULL for none). Each check is a cr_expect whose message starts with `what`; returns
 * whether all of them held. */
bool tp_usage_error(int status, const char *err, const char *what, const char *const *must);

/* ---- time and the machine ---- */

/* Seconds on the monotonic clock (for durations). */
double tp_now_s(void);

/* Sleeps `s` seconds, the whole of them even when a signal interrupts. */
void tp_sleep_s(double s);

/* This machine's memory and swap in bytes (what ab_too_large compares with): the
 * tests of inputs larger than memory make one just past it. */
double tp_memory_capacity(void);

#endif
