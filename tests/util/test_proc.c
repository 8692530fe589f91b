#include "test_proc.h"

#include "blas.h"

#include "error.h"
#include "fileio.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ---- files ---- */

const char *tp_path(const char *dir, const char *fmt, ...) {
    static char bufs[16][1100];
    static int k;
    char name[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    char *b = bufs[k++ % 16];
    snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
    return b;
}

void tp_scratch_make(char *dir, size_t cap, const char *base) {
    cr_assert_eq(ab_mkdir_p(base), 0, "cannot create %s: %s", base, ab_error());
    snprintf(dir, cap, "%s/XXXXXX", base);
    cr_assert_not_null(mkdtemp(dir), "mkdtemp %s: %s", dir, strerror(errno));
}

void tp_rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) tp_rm_tree(p);
        else remove(p);
    }
    closedir(d);
    rmdir(dir);
}

bool tp_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

char *tp_slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert_not_null(s);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    if (size) *size = (size_t)n;
    return s;
}

unsigned char *tp_read_bytes(const char *path, size_t *size) { return (unsigned char *)tp_slurp(path, size); }

void tp_write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    if (n) cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* ---- processes ---- */

pid_t tp_spawn(const char *dir, const char *exe, const char *env, const char *const *args) {
    size_t na = 0;
    while (args[na]) na++;
    const char **argv = malloc(sizeof(char *) * (na + 2));
    cr_assert_not_null(argv);
    argv[0] = exe;
    memcpy(argv + 1, args, sizeof(char *) * (na + 1));
    size_t ne = 0;
    while (environ[ne]) ne++;
    char **envp = malloc(sizeof(char *) * (ne + 3));
    cr_assert_not_null(envp);
    memcpy(envp, environ, sizeof(char *) * ne);
    /* the child runs this process's OpenBLAS kernels: attnbench would pick others where
     * OpenBLAS falls back to generic ones (harness/blas.h), and the suites compare its
     * files with the library's results bit for bit */
    static char core[96];
    if (!getenv("OPENBLAS_CORETYPE")) {
        snprintf(core, sizeof core, "OPENBLAS_CORETYPE=%s", ab_blas_corename());
        envp[ne++] = core;
    }
    if (env) { /* replaces a variable of the same name (getenv reads the first) */
        const char *eq = strchr(env, '=');
        size_t k = eq ? (size_t)(eq - env) + 1 : strlen(env), i = 0;
        while (i < ne && strncmp(envp[i], env, k) != 0) i++;
        envp[i] = (char *)env;
        if (i == ne) ne++;
    }
    envp[ne] = NULL;
    char out[1100], err[1100];
    snprintf(out, sizeof out, "%s/stdout.txt", dir);
    snprintf(err, sizeof err, "%s/stderr.txt", dir);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    int rc = posix_spawn(&pid, exe, &fa, NULL, (char *const *)argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    free(argv);
    cr_assert_eq(rc, 0, "cannot run %s: %s", exe, strerror(rc));
    return pid;
}

/* The exit status of a reaped process, and its captured output. */
static int finish(const char *dir, int status, char **out, char **err) {
    char p[1100];
    if (out) {
        free(*out);
        snprintf(p, sizeof p, "%s/stdout.txt", dir);
        *out = tp_slurp(p, NULL);
    }
    if (err) {
        free(*err);
        snprintf(p, sizeof p, "%s/stderr.txt", dir);
        *err = tp_slurp(p, NULL);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int tp_wait(const char *dir, pid_t pid, char **out, char **err) {
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return finish(dir, status, out, err);
}

int tp_wait_for(const char *dir, pid_t pid, double seconds, char **out, char **err) {
    int status;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        cr_assert_neq(w, -1, "waitpid: %s", strerror(errno));
        if (w == pid) break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) * 1e-9 >= seconds) {
            kill(pid, SIGKILL);
            cr_assert_eq(waitpid(pid, &status, 0), pid);
            break;
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return finish(dir, status, out, err);
}

void tp_env_without_gnuplot(char *env, size_t cap, const char *dir, bool failing) {
    char bin[1100];
    snprintf(bin, sizeof bin, "%s/%s", dir, failing ? "bin-failing-gnuplot" : "bin-no-gnuplot");
    cr_assert_eq(ab_mkdir_p(bin), 0, "cannot create %s: %s", bin, ab_error());
    if (failing) {
        char exe[1200];
        snprintf(exe, sizeof exe, "%s/gnuplot", bin);
        const char *script = "#!/bin/sh\nprintf 'half a figure' > \"$4\"\nexit 1\n";
        tp_write_bytes(exe, script, strlen(script));
        cr_assert_eq(chmod(exe, 0755), 0, "chmod %s: %s", exe, strerror(errno));
    }
    snprintf(env, cap, "PATH=%s", bin);
}

int tp_run(const char *dir, const char *exe, const char *env, const char *const *args, char **out, char **err) {
    return tp_wait(dir, tp_spawn(dir, exe, env, args), out, err);
}

bool tp_usage_error(int status, const char *err, const char *what, const char *const *must) {
    bool ok = status == 2;
    cr_expect(ok, "%s: exit status %d, want 2 (stderr: %s)", what, status, err);
    bool prefix = strncmp(err, "attnbench: error: ", 18) == 0;
    cr_expect(prefix, "%s: stderr does not start with 'attnbench: error: ': %s", what, err);
    const char *nl = strchr(err, '\n');
    bool one_line = nl && nl[1] == '\0';
    cr_expect(one_line, "%s: stderr is not exactly one line: %s", what, err);
    ok = ok && prefix && one_line;
    for (int i = 0; must && must[i]; i++) {
        bool has = strstr(err, must[i]) != NULL;
        cr_expect(has, "%s: message lacks '%s': %s", what, must[i], err);
        ok = ok && has;
    }
    return ok;
}

/* ---- time and the machine ---- */

double tp_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void tp_sleep_s(double s) {
    struct timespec t = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&t, &t) != 0) {
    }
}

double tp_memory_capacity(void) {
    struct sysinfo si;
    cr_assert_eq(sysinfo(&si), 0);
    return ((double)si.totalram + (double)si.totalswap) * (double)si.mem_unit;
}
