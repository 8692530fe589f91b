/* What the files of the checkpoint suites share (test_checkpoint.c defines it): the
 * scratch folder and the helpers that write, read and damage checkpoint files. */
#ifndef AB_TEST_CHECKPOINT_H
#define AB_TEST_CHECKPOINT_H

#include <criterion/criterion.h>

#include "checkpoint.h"
#include "error.h"
#include "fileio.h"
#include "memory.h"
#include "optim.h"
#include "rng.h"
#include "test_proc.h"
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

extern char g_dir[600];

/* g_dir/name (in a static buffer: one at a time). */
const char *path_in(const char *name);

/* Recomputes the table and header CRCs after a deliberate edit of the first `len`
 * bytes (test_checkpoint.c says which). */
void fix_crcs(unsigned char *b, size_t len);

/* The blobs of a standard checkpoint, as written. */
#define N_STD 6
typedef struct {
    const char *name;
    unsigned char *data;
    size_t bytes;
} blob;

typedef struct {
    blob b[N_STD];
    int n;
} blob_set;

void set_free(blob_set *s);

/* Writes PATH with blobs params (1000 floats), empty (0 bytes), odd (13 bytes), meta,
 * config (JSON) and optim (RAdam state after 3 steps); returns what each holds. */
void write_standard(const char *path, blob_set *set);

/* The reader holds exactly the blobs of `set`, in order, with identical bytes. */
void expect_same(const ab_ckpt_reader *r, const blob_set *set);
#endif
