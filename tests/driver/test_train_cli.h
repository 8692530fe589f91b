/* What the files of the train_cli suite share (test_train_cli.c defines it): the
 * scratch folder and running the binary. */
#ifndef AB_TEST_TRAIN_CLI_H
#define AB_TEST_TRAIN_CLI_H

#include <criterion/criterion.h>

#include "checkpoint.h"
#include "error.h"
#include "fileio.h"
#include "test_proc.h"
#include "test_run.h"
#include "trainer.h"

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define SMOKE ATTNBENCH_SOURCE_DIR "/experiments/copy/smoke.json"

/* This test's scratch folder and the last run's stdout and stderr. */
extern char g_dir[600];
extern char *g_out, *g_err;

/* A path in the scratch folder (tp_path). */
#define P(...) tp_path(g_dir, __VA_ARGS__)

/* The binary the helpers below run: attnbench, or attnbench-emu (its CUDA device
 * emulated on the CPU) for the --device cuda tests. */
extern const char *g_exe;

/* Starts attnbench --threads 1 ARG... (NULL-terminated) with stdout/stderr to files. */
#define spawn(...) tp_spawn(g_dir, g_exe, NULL, TP_ARGV("--threads", "1", __VA_ARGS__))

/* Waits for a process of spawn(); its output goes to g_out and g_err. */
int wait_status(pid_t pid);

#define run(...) wait_status(spawn(__VA_ARGS__))

/* Exit status 2 and one line "attnbench: error: ..." holding `needle`. */
void expect_usage_error(int status, const char *what, const char *needle);

/* A run document's "status". */
const char *status_of(json_t *doc);

/* ckpt_step and wait_for_checkpoint: test_run.h */

/* Writes `text` as the whole file. */
void write_text(const char *path, const char *text);

#endif
