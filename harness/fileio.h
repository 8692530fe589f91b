/* Atomic file writes: write to PATH.tmp.HOST.PID.N, flush, fsync, rename over PATH, so
 * a reader never sees a half-written file and an old file survives a failed write. A
 * writer killed before it could commit or abort (kill -9) leaves its temporary file;
 * the next ab_atomic_open of the same PATH removes those of this machine whose process
 * is gone. */
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

/* mkdir -p; 0 or AB_EIO. An empty path is refused (AB_EINVAL): joined as "DIR/NAME"
 * it would name files in the root folder. */
int ab_mkdir_p(const char *dir);

/* Opens PATH for reading ("rb") if it is a regular file. Anything else is refused
 * without blocking: a FIFO (whose open would wait for a writer, and whose bytes could
 * not be read twice), a folder, a device. NULL with *rc set and a message "cannot read
 * WHAT PATH: ..." (WHAT e.g. "config", or "" ): AB_EINVAL for a missing or
 * non-regular file, AB_EIO for other failures. */
FILE *ab_fopen_regular(const char *path, const char *what, int *rc);

#endif
