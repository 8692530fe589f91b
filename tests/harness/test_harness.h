/* What the files of the harness suite share (test_harness.c defines it): the scratch
 * folder of the suites that write files, and a few string helpers. */
#ifndef AB_TEST_HARNESS_H
#define AB_TEST_HARNESS_H

#include "blas.h"
#include "config.h"
#include "device.h"
#include "error.h"
#include "fileio.h"
#include "memory.h"
#include "npy.h"
#include "results.h"
#include "rng.h"
#include "rng_core.h"
#include "test_proc.h"
#include "test_util.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <signal.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The scratch folder of the npy, fileio and config suites: made before each test,
 * removed after it. */
extern char g_dir[600];
void scratch_setup(void);
void scratch_teardown(void);

/* g_dir/name, in a static buffer (one at a time). */
const char *path_in(const char *name);

/* Case-insensitive strstr (strcasestr is a GNU extension). */
bool contains_nocase(const char *hay, const char *needle);

#endif
