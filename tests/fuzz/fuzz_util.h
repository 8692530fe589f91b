/* What every fuzz target of tests/fuzz/ shares (README.md): the input as a file for the
 * readers that take a path, and the checks that hold after any input, accepted or not.
 * A failed check prints one line and aborts, which libFuzzer reports as a crash. */
#ifndef AB_FUZZ_UTIL_H
#define AB_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* libFuzzer's entry point, defined by each target. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The process's own scratch folder (made at the first call, in /dev/shm when there is
 * one, else $TMPDIR or /tmp; removed at exit). */
const char *fuzz_dir(void);

/* The path of `name` in fuzz_dir() (in one of 8 buffers used in turn: valid for the
 * next 7 calls of this and fuzz_file). */
const char *fuzz_path(const char *name);

/* Writes `size` bytes as the file `name` in fuzz_dir() (replacing it) and returns its
 * path (as fuzz_path). */
const char *fuzz_file(const char *name, const void *data, size_t size);

/* A reader refused its input: the code is one of the library's errors and the message
 * is not empty. */
void fuzz_refused(int rc, const char *what);

/* Everything taken from the tracked allocator has been given back (harness/memory.h). */
void fuzz_no_tracked_memory(const char *what);

/* Fails the input: prints "fuzz: WHAT: ..." and aborts. */
_Noreturn void fuzz_fail(const char *what, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
