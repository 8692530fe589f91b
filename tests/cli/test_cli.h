/* What the files of the cli suite share (test_cli.c defines it): the scratch folder
 * with the inputs the suite's setup writes, and running the binary. */
#ifndef AB_TEST_CLI_H
#define AB_TEST_CLI_H

#include "attention.h"
#include "blas.h"
#include "cuda_device.h"
#include "error.h"
#include "fileio.h"
#include "memory.h"
#include "npy.h"
#include "test_proc.h"
#include "task.h"
#include "task_list.h"
#include "test_util.h"
#include "transformer.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char g_dir[600]; /* this test's scratch folder */
extern char *g_stdout;  /* output of the last run */
extern char *g_stderr;

/* A path inside the scratch folder; the strings live until the test's teardown. */
const char *P(const char *name);

/* Runs `exe` with the NULL-terminated arguments (and `env`, "NAME=VALUE" or NULL, added
 * to the environment), stdout and stderr captured in g_stdout / g_stderr; returns the
 * exit status (or 128 + signal). run_argv runs attnbench. */
int run_exe_argv(const char *exe, const char *env, const char *const *args);
int run_argv(const char *const *args);

/* run(arg, ..., NULL) */
#define run(...) run_argv(TP_ARGV(__VA_ARGS__))

/* Exit status 2 and exactly one line on stderr, "attnbench: error: ...", containing
 * every string of `must` (NULL-terminated). */
void expect_usage_error(int status, const char *what, const char *const *must);

/* The inputs the suite's setup writes: B = 2, H = 2, N = 9 (odd, not a multiple of any
 * chunk), D = 5, M = 3 (odd). */
enum { B = 2, H = 2, N = 9, D = 5, M = 3 };
#define NQ ((size_t)B * H * N * D)
#define NV ((size_t)B * H * N * M)

/* Reads the .npy file `name` of the scratch folder (asserted). */
void load(const char *name, ab_array *a);

/* The library's forward (and backward when dq != NULL) on the fixture inputs, with one
 * thread like the binary's --threads 1, so results must be bit-identical. */
void library_op(const char *variant, int n_set, const char *const *set, uint64_t seed, bool causal,
                const int *lengths, float *out, float *dq, float *dk, float *dv);

#endif
