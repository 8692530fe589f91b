#include "cli_util.h"

#include "dist.h"
#include "error.h"
#include "fileio.h"

#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Writes PREFIX and the formatted message as one line to stderr: control characters in
 * the message (a newline in a path or a label) become escapes (\n, \t, \xHH), since
 * scripts read the last line of stderr. */
static void put_line(const char *prefix, const char *fmt, va_list ap) {
    char small[1024], *buf = small;
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    if (n >= (int)sizeof small && (buf = malloc((size_t)n + 1))) vsnprintf(buf, (size_t)n + 1, fmt, ap2);
    else if (!buf) buf = small; /* out of memory: the message cut short */
    va_end(ap2);
    fputs(prefix, stderr);
    for (const unsigned char *p = (const unsigned char *)buf; *p; p++) {
        if (*p == '\n') fputs("\\n", stderr);
        else if (*p == '\r') fputs("\\r", stderr);
        else if (*p == '\t') fputs("\\t", stderr);
        else if (*p < 0x20 || *p == 0x7f) fprintf(stderr, "\\x%02x", *p);
        else fputc(*p, stderr);
    }
    fputc('\n', stderr);
    if (buf != small) free(buf);
}

_Noreturn void cli_die(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    put_line("attnbench: error: ", fmt, ap);
    va_end(ap);
    exit(status);
}

void cli_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    put_line("attnbench: warning: ", fmt, ap);
    va_end(ap);
}

void cli_write_json(const char *path, const json_t *doc) {
    ab_atomic_file af;
    int rc = ab_atomic_open(&af, path);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    if (json_dumpf(doc, af.f, CLI_JSON_FLAGS) != 0) {
        ab_atomic_abort(&af);
        cli_die(AB_EXIT_FAILURE, "cannot write %s", path);
    }
    fputc('\n', af.f);
    if ((rc = ab_atomic_commit(&af))) cli_die(cli_status_for(rc), "%s", ab_error());
}

int cli_status_for(int code) {
    return (code == AB_EINVAL || code == AB_EUNSUPPORTED || code == AB_EIO) ? AB_EXIT_USAGE : AB_EXIT_FAILURE;
}

long long cli_parse_int(const char *opt, const char *s, long long min, long long max) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno)
        cli_die(AB_EXIT_USAGE, "%s %s: not an integer", opt, s);
    if (x < min || x > max) cli_die(AB_EXIT_USAGE, "%s %s: must be in [%lld, %lld]", opt, s, min, max);
    return x;
}

uint64_t cli_parse_u64(const char *opt, const char *s) {
    char *end;
    errno = 0;
    if (*s == '-') cli_die(AB_EXIT_USAGE, "%s %s: must be a non-negative integer", opt, s);
    unsigned long long x = strtoull(s, &end, 0);
    if (*s == '\0' || *end != '\0' || errno) cli_die(AB_EXIT_USAGE, "%s %s: not a non-negative integer", opt, s);
    return (uint64_t)x;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) cli_die(AB_EXIT_USAGE, "%s needs a value", argv[*i]);
    *i += 1;
    return argv[*i];
}

const char *cli_path_value(int argc, char **argv, int *i) {
    const char *opt = argv[*i], *v = cli_value(argc, argv, i);
    if (!*v) cli_die(AB_EXIT_USAGE, "%s '': empty path", opt);
    return v;
}

ab_device cli_device_value(int argc, char **argv, int *i) {
    const char *v = cli_value(argc, argv, i);
    ab_device d;
    if (ab_device_parse(v, &d)) cli_die(AB_EXIT_USAGE, "--device %s: must be cpu or cuda", v);
    return d;
}

const char *cli_find_plot_script(const char *name, char *buf, size_t cap) {
    const char *env = getenv("ATTNBENCH_PLOTS");
    const char *dirs[3] = {env, ATTNBENCH_SOURCE_DIR "/plots", ATTNBENCH_DATADIR "/plots"};
    struct stat st;
    for (int i = 0; i < 3; i++) {
        if (!dirs[i]) continue;
        snprintf(buf, cap, "%s/%s", dirs[i], name);
        if (stat(buf, &st) == 0) return buf;
    }
    return NULL;
}

int cli_gnuplot(const char *script, const char *const *args) {
    const char *argv[16] = {"gnuplot", "-c", script};
    int n = 3;
    for (int i = 0; args[i] && n < 15; i++) argv[n++] = args[i];
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execvp("gnuplot", (char *const *)argv);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int cli_draw(const char *script_name, const char *data, const char *out, const char *const *extra, char *why,
             size_t cap) {
    char script[4096], tmp[4200];
    if (!cli_find_plot_script(script_name, script, sizeof script)) {
        snprintf(why, cap, "plots/%s not found (set ATTNBENCH_PLOTS to the plots folder)", script_name);
        return -1;
    }
    /* OUT's stem, ".tmp.PID", then OUT's extension: the scripts choose the terminal
     * from the extension */
    const char *slash = strrchr(out, '/'), *dot = strrchr(out, '.');
    if (!dot || (slash && dot < slash)) dot = out + strlen(out);
    snprintf(tmp, sizeof tmp, "%.*s.tmp.%d%s", (int)(dot - out), out, (int)getpid(), dot);
    const char *args[12] = {data, tmp};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 11; i++) args[n++] = extra[i];
    args[n] = NULL;
    int st = cli_gnuplot(script, args);
    if (st == 0 && rename(tmp, out) == 0) return 0;
    if (st == 0) snprintf(why, cap, "gnuplot wrote no %s", tmp);
    else if (st == 127) snprintf(why, cap, "gnuplot could not be started (not on PATH? harness/scripts/setup.sh installs it)");
    else if (st < 0) snprintf(why, cap, "gnuplot was killed or could not be run");
    else snprintf(why, cap, "gnuplot -c %s exited with status %d", script, st);
    remove(tmp);
    return -1;
}

/* The end of a rank of a data-parallel run that did not succeed: its message (with
 * its rank), then either every rank ends here (a refusal, which all ranks share) or
 * this one ends the job (a failure after the start may be this rank's alone: the
 * others would wait for it in the next sum). */
_Noreturn void cli_die_rank(ab_dist *d, int status, bool whole_job) {
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", ab_error());
    if (ab_dist_rank(d) == 0) fprintf(stderr, "attnbench: error: %s\n", msg);
    else fprintf(stderr, "attnbench: error: rank %d of %d: %s\n", ab_dist_rank(d), ab_dist_size(d), msg);
    fflush(stderr);
    if (whole_job) ab_dist_abort(d, status);
    ab_dist_close(d);
    exit(status);
}
