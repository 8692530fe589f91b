#define _POSIX_C_SOURCE 200809L
#include "fileio.h"

#include "error.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ab_atomic_open(ab_atomic_file *af, const char *path) {
    memset(af, 0, sizeof *af);
    size_t n = strlen(path) + 48;
    af->tmp_path = malloc(n);
    af->path = strdup(path);
    if (!af->tmp_path || !af->path) {
        free(af->tmp_path);
        free(af->path);
        return ab_fail(AB_ENOMEM, "out of memory");
    }
    /* PID and a per-process counter: two threads writing one path do not collide. */
    static atomic_uint counter;
    snprintf(af->tmp_path, n, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1u));
    af->f = fopen(af->tmp_path, "wb");
    if (!af->f) {
        int e = errno;
        free(af->tmp_path);
        free(af->path);
        af->tmp_path = af->path = NULL;
        return ab_fail(AB_EIO, "cannot write %s: %s", path, strerror(e));
    }
    return 0;
}

static void release(ab_atomic_file *af) {
    free(af->tmp_path);
    free(af->path);
    af->tmp_path = af->path = NULL;
    af->f = NULL;
}

int ab_atomic_commit(ab_atomic_file *af) {
    errno = 0;
    int had_error = ferror(af->f);
    int bad = had_error || fflush(af->f) != 0 || fsync(fileno(af->f)) != 0;
    int e = errno ? errno : EIO; /* a stream error may leave errno unset */
    if (fclose(af->f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (!bad && rename(af->tmp_path, af->path) != 0) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        remove(af->tmp_path);
        int rc = ab_fail(AB_EIO, "cannot write %s: %s", af->path, strerror(e));
        release(af);
        return rc;
    }
    release(af);
    return 0;
}

void ab_atomic_abort(ab_atomic_file *af) {
    if (af->f) fclose(af->f);
    if (af->tmp_path) remove(af->tmp_path);
    release(af);
}

int ab_mkdir_p(const char *dir) {
    char *p = strdup(dir);
    if (!p) return ab_fail(AB_ENOMEM, "out of memory");
    size_t n = strlen(p);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] == '/' || p[i] == '\0') {
            char c = p[i];
            p[i] = '\0';
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                int e = errno;
                int rc = ab_fail(AB_EIO, "cannot create directory %s: %s", p, strerror(e));
                free(p);
                return rc;
            }
            struct stat st;
            if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
                int rc = ab_fail(AB_EIO, "cannot create directory %s: a file is in the way", p);
                free(p);
                return rc;
            }
            p[i] = c;
        }
    }
    free(p);
    return 0;
}
