/* The commands of a data directory, under the user's policy (data_command.h). */
#define _GNU_SOURCE /* pipe2, vfork */
#include "data_command.h"

#include "error.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ---- the policy ---- */

static pthread_mutex_t g_policy_lock = PTHREAD_MUTEX_INITIALIZER;
static dc_policy g_policy = {false, DC_DEFAULT_TIMEOUT_S, (size_t)DC_DEFAULT_MAX_MB << 20};

void dc_policy_default(dc_policy *p) {
    p->allowed = false;
    p->timeout_s = DC_DEFAULT_TIMEOUT_S;
    p->max_bytes = (size_t)DC_DEFAULT_MAX_MB << 20;
}

void dc_set_policy(const dc_policy *p) {
    pthread_mutex_lock(&g_policy_lock);
    g_policy = *p;
    pthread_mutex_unlock(&g_policy_lock);
}

void dc_get_policy(dc_policy *p) {
    pthread_mutex_lock(&g_policy_lock);
    *p = g_policy;
    pthread_mutex_unlock(&g_policy_lock);
}

/* ---- the process groups of the commands running now ---- */

/* A slot per command running (0: free); more commands at once than slots still run,
 * unlisted: only the parent-death signal then ends them if attnbench is killed. */
enum { LIVE_SLOTS = 256 };
static atomic_int g_live[LIVE_SLOTS];

static int live_add(pid_t pgid) {
    for (int i = 0; i < LIVE_SLOTS; i++) {
        int expect = 0;
        if (atomic_compare_exchange_strong(&g_live[i], &expect, (int)pgid)) return i;
    }
    return -1;
}

static void live_remove(int slot) {
    if (slot >= 0) atomic_store(&g_live[slot], 0);
}

void dc_kill_all(void) {
    for (int i = 0; i < LIVE_SLOTS; i++) {
        int pg = atomic_load(&g_live[i]);
        if (pg > 0) kill(-pg, SIGKILL);
    }
}

/* ---- running one ---- */

typedef struct {
    unsigned char *data;
    size_t size, cap;
} buffer;

static int buffer_add(buffer *b, const unsigned char *p, size_t n) {
    if (b->size + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->size + n) cap *= 2;
        unsigned char *d = realloc(b->data, cap);
        if (!d) return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->size, p, n);
    b->size += n;
    return 0;
}

/* The last non-empty line of what a command wrote to stderr (in place), control
 * characters as spaces. */
static const char *last_line(buffer *e) {
    if (!e->size) return "";
    if (buffer_add(e, (const unsigned char *)"", 1)) return "";
    char *s = (char *)e->data;
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) s[--n] = '\0';
    char *nl = strrchr(s, '\n');
    s = nl ? nl + 1 : s;
    for (char *c = s; *c; c++)
        if ((unsigned char)*c < 0x20) *c = ' ';
    return s;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Starts /bin/sh -c CMD in a process group of its own, stdin /dev/null, stdout and
 * stderr the given pipe ends; its pid (= its group), or -1 with errno. vfork: the child
 * shares this process's memory until it execs (so that starting a command does not copy
 * the page tables of gigabytes of features), and makes only system calls until then. */
static pid_t start_shell(const char *cmd, int out_fd, int err_fd) {
    char *argv[] = {"sh", "-c", (char *)cmd, NULL};
    const pid_t parent = getpid();
    sigset_t none;
    sigemptyset(&none);
    pid_t pid = vfork();
    if (pid != 0) return pid;
    /* the child */
    if (setpgid(0, 0) != 0 || prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) _exit(126);
    if (getppid() != parent) _exit(126); /* attnbench died before the line above */
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    int in = open("/dev/null", O_RDONLY);
    if (in < 0 || dup2(in, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) _exit(126);
    execve("/bin/sh", argv, environ);
    _exit(127);
}

/* The command as a message quotes it: its first 160 bytes, "..." after them, so that
 * what a message says after it (the option to use) fits in one message. */
static const char *clip(const char *cmd, char *buf, size_t cap) {
    const size_t n = strlen(cmd);
    snprintf(buf, cap, "%.160s%s", cmd, n > 160 ? "..." : "");
    return buf;
}

int dc_run(const char *full_cmd, const char *where, unsigned char **out, size_t *n) {
    *out = NULL;
    *n = 0;
    dc_policy pol;
    dc_get_policy(&pol);
    char quoted[200];
    const char *cmd = clip(full_cmd, quoted, sizeof quoted);
    if (!pol.allowed)
        return ab_fail(AB_EINVAL,
                       "commands of data directories run only with attnbench --allow-commands "
                       "(experiments/speech/README.md): %.400s: the audio is the output of '%s |'",
                       where, cmd);
    int po[2], pe[2];
    if (pipe2(po, O_CLOEXEC) != 0)
        return ab_fail(ab_io_code(errno), "%s: cannot make a pipe: %s", where, strerror(errno));
    if (pipe2(pe, O_CLOEXEC) != 0) {
        int e = errno;
        close(po[0]);
        close(po[1]);
        return ab_fail(ab_io_code(e), "%s: cannot make a pipe: %s", where, strerror(e));
    }
    pid_t pid = start_shell(full_cmd, po[1], pe[1]);
    int spawn_errno = errno;
    close(po[1]);
    close(pe[1]);
    if (pid < 0) {
        close(po[0]);
        close(pe[0]);
        return ab_fail(ab_io_code(spawn_errno), "%s: cannot start /bin/sh: %s", where, strerror(spawn_errno));
    }
    const int slot = live_add(pid);
    buffer outb = {0}, errb = {0};
    struct pollfd pf[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
    int open_fds = 2, rc = 0;
    unsigned char chunk[65536];
    const double deadline = now_s() + pol.timeout_s;
    /* The command ends when its shell does (a pipeline's shell waits for every stage;
     * not for what it started in the background, which may hold the pipes open): then
     * the rest of its group is killed, and the pipes read to their end. */
    bool exited = false;
    int status = 0;
    while (open_fds > 0 && !rc) {
        if (!exited && waitpid(pid, &status, WNOHANG) == pid) {
            exited = true;
            kill(-pid, SIGKILL);
        }
        const double left = deadline - now_s();
        if (left <= 0) {
            rc = ab_fail(AB_EINVAL,
                         "%.400s: the command '%s' ran past its time limit of %g s and was killed (attnbench "
                         "--command-timeout SECONDS sets the limit)",
                         where, cmd, pol.timeout_s);
            break;
        }
        /* wakes every 100 ms at the most to see whether the shell has ended */
        int k = poll(pf, 2, left > 0.1 ? 100 : (int)(left * 1000) + 1);
        if (k < 0) {
            if (errno == EINTR) continue;
            rc = ab_fail(ab_io_code(errno), "%s: waiting for the command: %s", where, strerror(errno));
            break;
        }
        for (int i = 0; i < 2 && !rc; i++) {
            if (pf[i].fd < 0 || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t got = read(pf[i].fd, chunk, sizeof chunk);
            if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (got <= 0) {
                close(pf[i].fd);
                pf[i].fd = -1;
                open_fds--;
                continue;
            }
            if (i == 1) { /* stderr: its first 64 KiB are enough for the last line */
                if (errb.size + (size_t)got <= (1 << 16)) buffer_add(&errb, chunk, (size_t)got);
                continue;
            }
            if (outb.size + (size_t)got > pol.max_bytes)
                rc = ab_fail(AB_EINVAL,
                             "%.400s: the command '%s' wrote more than its output limit of %.0f MiB and was killed "
                             "(attnbench --command-max-mb MB sets the limit)",
                             where, cmd, (double)pol.max_bytes / (1 << 20));
            else if (buffer_add(&outb, chunk, (size_t)got))
                rc = ab_fail(AB_ENOMEM, "%s: out of memory for the command's output (%zu bytes so far)", where,
                             outb.size);
        }
    }
    for (int i = 0; i < 2; i++)
        if (pf[i].fd >= 0) close(pf[i].fd);
    /* stopped early (a limit, an error): the whole group goes */
    pid_t w = pid;
    if (!exited) {
        kill(-pid, SIGKILL);
        while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
        }
    }
    live_remove(slot);
    if (!rc && w < 0) rc = ab_fail(ab_io_code(errno), "%s: waiting for the command: %s", where, strerror(errno));
    if (!rc && WIFSIGNALED(status))
        rc = ab_fail(AB_EINVAL, "%s: the command '%s' was killed by signal %d%s%s", where, cmd, WTERMSIG(status),
                     errb.size ? ": " : "", last_line(&errb));
    else if (!rc && WEXITSTATUS(status) == 126 && outb.size == 0 && errb.size == 0)
        rc = ab_fail(AB_ESYSTEM, "%s: cannot start the command '%s' in a process group of its own", where, cmd);
    else if (!rc && WEXITSTATUS(status) != 0)
        rc = ab_fail(AB_EINVAL, "%s: the command '%s' failed (exit status %d)%s%s", where, cmd, WEXITSTATUS(status),
                     errb.size ? ": " : "", last_line(&errb));
    else if (!rc && outb.size == 0)
        rc = ab_fail(AB_EINVAL, "%s: the command '%s' wrote no audio%s%s", where, cmd, errb.size ? ": " : "",
                     last_line(&errb));
    free(errb.data);
    if (rc) {
        free(outb.data);
        return rc;
    }
    *out = outb.data;
    *n = outb.size;
    return 0;
}
