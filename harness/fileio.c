#include "fileio.h"

#include "error.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* This machine's name as it goes into a temporary name: letters, digits, '-' and '_'
 * kept, anything else as '_' ("localhost" when it has none). */
static void host_tag(char *out, size_t cap) {
    char h[256] = "";
    if (gethostname(h, sizeof h - 1) != 0 || !h[0]) snprintf(h, sizeof h, "localhost");
    size_t i = 0;
    for (; h[i] && i + 1 < cap; i++) {
        unsigned char c = (unsigned char)h[i];
        out[i] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ? (char)c : '_';
    }
    out[i] = '\0';
}

/* "DIGITS.DIGITS" and nothing more: the PID (its value in *pid) and the counter. */
static bool pid_and_counter(const char *s, long *pid) {
    char *end;
    if (*s < '0' || *s > '9') return false;
    errno = 0;
    *pid = strtol(s, &end, 10);
    if (errno || *end != '.' || end[1] < '0' || end[1] > '9') return false;
    return end[1 + strspn(end + 1, "0123456789")] == '\0';
}

/* Removes what a writer of PATH that died without committing or aborting (kill -9,
 * a power cut) left: PATH.tmp.HOST.PID.N of this machine whose process is gone. Others'
 * (another machine's, on a shared file system; a live writer's) are left alone. Best
 * effort: a failure here is not the write's. */
static void remove_stale_temps(const char *path, const char *host) {
    const char *slash = strrchr(path, '/');
    char dir[4096];
    const char *base = slash ? slash + 1 : path;
    if (slash) {
        size_t dn = slash == path ? 1 : (size_t)(slash - path);
        if (dn >= sizeof dir) return;
        memcpy(dir, path, dn);
        dir[dn] = '\0';
    } else {
        snprintf(dir, sizeof dir, ".");
    }
    char prefix[600];
    if ((size_t)snprintf(prefix, sizeof prefix, "%s.tmp.%s.", base, host) >= sizeof prefix) return;
    const size_t pn = strlen(prefix);
    DIR *d = opendir(dir);
    if (!d) return;
    const long self = (long)getpid();
    for (struct dirent *e; (e = readdir(d));) {
        long pid;
        if (strncmp(e->d_name, prefix, pn) != 0 || !pid_and_counter(e->d_name + pn, &pid)) continue;
        if (pid <= 0 || pid == self || pid > INT_MAX) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to ask: EPERM) */
        unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
}

int ab_atomic_open(ab_atomic_file *af, const char *path) {
    memset(af, 0, sizeof *af);
    char host[64];
    host_tag(host, sizeof host);
    remove_stale_temps(path, host);
    size_t n = strlen(path) + strlen(host) + 48;
    af->tmp_path = malloc(n);
    af->path = strdup(path);
    if (!af->tmp_path || !af->path) {
        free(af->tmp_path);
        free(af->path);
        return ab_fail(AB_ENOMEM, "out of memory");
    }
    /* The machine, the PID and a per-process counter: two threads writing one path do
     * not collide, and the next writer knows a dead writer's file (remove_stale_temps). */
    static atomic_uint counter;
    snprintf(af->tmp_path, n, "%s.tmp.%s.%ld.%u", path, host, (long)getpid(), atomic_fetch_add(&counter, 1u));
    af->f = fopen(af->tmp_path, "wb");
    if (!af->f) {
        int e = errno;
        free(af->tmp_path);
        free(af->path);
        af->tmp_path = af->path = NULL;
        return ab_fail(ab_io_code(e), "cannot write %s: %s", path, strerror(e));
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
        int rc = ab_fail(ab_io_code(e), "cannot write %s: %s", af->path, strerror(e));
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
    if (!*dir) return ab_fail(AB_EINVAL, "cannot create directory '': empty path");
    char *p = strdup(dir);
    if (!p) return ab_fail(AB_ENOMEM, "out of memory");
    size_t n = strlen(p);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] == '/' || p[i] == '\0') {
            char c = p[i];
            p[i] = '\0';
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                int e = errno;
                int rc = ab_fail(ab_io_code(e), "cannot create directory %s: %s", p, strerror(e));
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

FILE *ab_fopen_regular(const char *path, const char *what, int *rc) {
    const char *sep = *what ? " " : "";
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. It is
     * cleared again once the file is known to be regular. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        *rc = ab_fail(e == ENOENT || e == ENOTDIR || e == EISDIR ? AB_EINVAL : AB_EIO, "cannot read %s%s%s: %s", what,
                      sep, path, strerror(e));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        *rc = ab_fail(ab_io_code(e), "cannot read %s%s%s: %s", what, sep, path, strerror(e));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        const char *kind = S_ISFIFO(st.st_mode)  ? "a FIFO"
                           : S_ISDIR(st.st_mode) ? "a folder"
                           : S_ISSOCK(st.st_mode) ? "a socket"
                                                  : "a device or other special file";
        close(fd);
        *rc = ab_fail(AB_EINVAL, "cannot read %s%s%s: not a regular file (%s)", what, sep, path, kind);
        return NULL;
    }
    int flags = fcntl(fd, F_GETFL);
    FILE *f = flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0 ? NULL : fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        *rc = ab_fail(ab_io_code(e), "cannot read %s%s%s: %s", what, sep, path, strerror(e));
        return NULL;
    }
    *rc = 0;
    return f;
}
