/* Atomic file writes: write to PATH.tmp.PID, flush, fsync, rename over PATH, so a
 * reader never sees a half-written file and an old file survives a failed write. */
#ifndef AB_FILEIO_H
#define AB_FILEIO_H

#include <stdio.h>

typedef struct {
    FILE *f;
    char *tmp_path;
    char *path;
} ab_atomic_file;

/* Opens the temporary file. 0 or AB_EIO with a message. */
int ab_atomic_open(ab_atomic_file *af, const char *path);
/* Flushes, fsyncs and renames; on any failure removes the temporary file. */
int ab_atomic_commit(ab_atomic_file *af);
/* Gives up: closes and removes the temporary file; PATH is untouched. */
void ab_atomic_abort(ab_atomic_file *af);

/* mkdir -p; 0 or AB_EIO. */
int ab_mkdir_p(const char *dir);

#endif
