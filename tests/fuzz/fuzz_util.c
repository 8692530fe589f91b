/* The fuzz targets' shared helpers (fuzz_util.h). */
#include "fuzz_util.h"

#include "error.h"
#include "memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[4096];

/* Removes the scratch folder and its files (the targets make no sub-folders). */
static void remove_dir(void) {
    DIR *d = opendir(g_dir);
    if (!d) return;
    struct dirent *e;
    char p[4400];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(g_dir);
}

const char *fuzz_dir(void) {
    if (g_dir[0]) return g_dir;
    struct stat st;
    const char *base = getenv("TMPDIR");
    if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0) base = "/dev/shm";
    if (!base || !*base) base = "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/attnbench-fuzz-XXXXXX", base);
    if (!mkdtemp(g_dir)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(remove_dir);
    return g_dir;
}

const char *fuzz_path(const char *name) {
    static char path[8][4200];
    static unsigned slot = 0;
    char *p = path[slot++ % 8];
    snprintf(p, sizeof path[0], "%s/%s", fuzz_dir(), name);
    return p;
}

const char *fuzz_file(const char *name, const void *data, size_t size) {
    const char *p = fuzz_path(name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror("fuzz: open");
        abort();
    }
    const char *b = data;
    while (size > 0) {
        ssize_t n = write(fd, b, size);
        if (n <= 0) {
            perror("fuzz: write");
            abort();
        }
        b += n;
        size -= (size_t)n;
    }
    close(fd);
    return p;
}

_Noreturn void fuzz_fail(const char *what, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz: %s: ", what);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

void fuzz_refused(int rc, const char *what) {
    if (rc != AB_EINVAL && rc != AB_ENOMEM && rc != AB_EIO && rc != AB_EUNSUPPORTED && rc != AB_ESYSTEM)
        fuzz_fail(what, "refused with code %d, not one of the library's errors", rc);
    if (!ab_error()[0]) fuzz_fail(what, "refused (code %d) without a message", rc);
}

void fuzz_no_tracked_memory(const char *what) {
    size_t left = ab_mem_current(AB_DEV_CPU);
    if (left != 0) fuzz_fail(what, "%zu bytes of the tracked allocator not given back", left);
}
