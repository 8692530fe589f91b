#include "results.h"

#include "blas.h"
#include "cuda_device.h"
#include "cuda_traffic.h"
#include "error.h"
#include "fileio.h"

#include <gnu/libc-version.h>
#include <math.h>
#include <omp.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

struct ab_run {
    char *path, *tsv_path;
    json_t *doc, *records;
    char **columns;
    int n_columns;
};

json_t *ab_json_num(double x) { return isfinite(x) ? json_real(x) : json_null(); }

void ab_iso_time(char *buf, size_t cap) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static char *read_first_line(const char *cmd) {
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    char buf[512];
    char *res = NULL;
    if (fgets(buf, sizeof buf, p)) {
        buf[strcspn(buf, "\n")] = '\0';
        if (buf[0]) res = strdup(buf);
    }
    pclose(p);
    return res;
}

static char *cpu_model(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return NULL;
    char line[512];
    char *res = NULL;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                c[strcspn(c, "\n")] = '\0';
                res = strdup(c);
            }
            break;
        }
    }
    fclose(f);
    return res;
}

/* The CUDA device, when this process has initialised one (a run on --device cuda);
 * null otherwise, so a CPU run never touches a GPU. */
static json_t *gpu_info(void) {
    ab_cuda_info gi;
    if (!ab_cuda_ready() || ab_cuda_device_info(&gi)) return json_null();
    json_t *g = json_object();
    char v[32];
    json_object_set_new(g, "name", json_string(gi.name));
    snprintf(v, sizeof v, "%d.%d", gi.cc_major, gi.cc_minor);
    json_object_set_new(g, "compute_capability", json_string(v));
    json_object_set_new(g, "multiprocessors", json_integer(gi.sm_count));
    json_object_set_new(g, "memory_bytes", json_integer((json_int_t)gi.total_bytes));
    snprintf(v, sizeof v, "%d.%d", gi.driver_version / 1000, gi.driver_version % 1000 / 10);
    json_object_set_new(g, "driver", json_string(v));
    snprintf(v, sizeof v, "%d.%d", gi.runtime_version / 1000, gi.runtime_version % 1000 / 10);
    json_object_set_new(g, "cuda_runtime", json_string(v));
    json_object_set_new(g, "cublas_version", json_integer(gi.cublas_version));
    json_object_set_new(g, "emulated", json_boolean(gi.emulated));
    /* memory traffic counted (the instrumented emulator: bench records' "traffic") */
    json_object_set_new(g, "traffic_counted", json_boolean(ab_cuda_traffic_counted()));
    return g;
}

json_t *ab_machine_info(void) {
    json_t *m = json_object();
    char *model = cpu_model();
    json_object_set_new(m, "cpu", model ? json_string(model) : json_null());
    free(model);
    json_object_set_new(m, "cores", json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
    json_object_set_new(m, "threads", json_integer(ab_threads()));
    json_object_set_new(m, "omp_max_threads", json_integer(omp_get_max_threads()));
    json_object_set_new(m, "blas", json_string("OpenBLAS"));
    json_object_set_new(m, "blas_config", json_string(ab_blas_config()));
    json_object_set_new(m, "blas_core", json_string(ab_blas_corename()));
    json_object_set_new(m, "blas_threads", json_integer(ab_blas_threads()));
    const int par = ab_blas_parallel();
    json_object_set_new(m, "blas_parallel", json_integer(par));
    json_object_set_new(m, "blas_parallel_model", json_string(ab_blas_parallel_name(par)));
    const char *ct = getenv("OPENBLAS_CORETYPE");
    json_object_set_new(m, "openblas_coretype_env", ct ? json_string(ct) : json_null());
    /* "attnbench": the driver set it for a CPU that OpenBLAS did not know (harness/blas.h) */
    const char *by = getenv("ATTNBENCH_SET_CORETYPE");
    json_object_set_new(m, "openblas_coretype_by",
                        !ct ? json_null() : json_string(by && strcmp(by, ct) == 0 ? "attnbench" : "environment"));
    /* Host memory: harness/memory.c's tracked allocator on glibc's malloc
     * (aligned_alloc, 64-byte alignment); an LD_PRELOAD'ed allocator or malloc tunables
     * would change what that means, so they are recorded when set. */
    char alloc[96];
    snprintf(alloc, sizeof alloc, "glibc malloc (aligned_alloc, 64-byte alignment), glibc %s", gnu_get_libc_version());
    json_object_set_new(m, "allocator", json_string(alloc));
    char libc[48];
    snprintf(libc, sizeof libc, "glibc %s", gnu_get_libc_version());
    json_object_set_new(m, "libc", json_string(libc));
    const char *pre = getenv("LD_PRELOAD"), *tun = getenv("GLIBC_TUNABLES");
    json_object_set_new(m, "ld_preload", pre ? json_string(pre) : json_null());
    json_object_set_new(m, "glibc_tunables", tun ? json_string(tun) : json_null());
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    json_object_set_new(m, "memory_bytes", json_integer((json_int_t)pages * psz));
    struct utsname u;
    if (uname(&u) == 0) {
        /* the system and the architecture: a kernel's release string names the build of
         * the host it ran on, not anything a result depends on */
        char os[400];
        snprintf(os, sizeof os, "%s %s", u.sysname, u.machine);
        json_object_set_new(m, "os", json_string(os));
    }
#ifdef __VERSION__
    json_object_set_new(m, "compiler", json_string("gcc " __VERSION__));
#endif
    char v[64];
    snprintf(v, sizeof v, "%s", JANSSON_VERSION);
    json_object_set_new(m, "jansson", json_string(v));
    json_object_set_new(m, "zlib", json_string(zlibVersion()));
    json_object_set_new(m, "attnbench", json_string(ATTNBENCH_VERSION));
    json_t *gpu = gpu_info();
    json_object_set_new(m, "device_allocator",
                        json_is_null(gpu) ? json_null() : json_string("cudaMalloc per tensor (tracked, no caching)"));
    json_object_set_new(m, "gpu", gpu);
    return m;
}

json_t *ab_git_info_at(const char *dir) {
    json_t *g = json_object();
    char *commit = NULL, *dirty = NULL, *diff = NULL;
    /* a folder name with a quote would end the shell's quoting: unknown, not a guess */
    if (dir && !strchr(dir, '\'')) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "git -C '%s' rev-parse HEAD 2>/dev/null", dir);
        commit = read_first_line(cmd);
        snprintf(cmd, sizeof cmd, "git -C '%s' status --porcelain --untracked-files=no 2>/dev/null | head -n1", dir);
        dirty = commit ? read_first_line(cmd) : NULL;
        snprintf(cmd, sizeof cmd,
                 "git -C '%s' diff HEAD --binary --no-ext-diff --no-color 2>/dev/null | git hash-object --stdin 2>/dev/null",
                 dir);
        diff = dirty ? read_first_line(cmd) : NULL;
    }
    json_object_set_new(g, "commit", commit ? json_string(commit) : json_null());
    json_object_set_new(g, "dirty", commit ? json_boolean(dirty != NULL) : json_null());
    json_object_set_new(g, "diff_sha1", diff ? json_string(diff) : json_null());
    free(commit);
    free(dirty);
    free(diff);
    return g;
}

json_t *ab_git_info(void) {
    const char *env = getenv("ATTNBENCH_GIT_COMMIT");
    if (env && *env) { /* a copy away from its checkout (harness/scripts/gpu-pack.sh) */
        json_t *g = json_object();
        const char *d = getenv("ATTNBENCH_GIT_DIRTY"), *h = getenv("ATTNBENCH_GIT_DIFF_SHA1");
        json_object_set_new(g, "commit", json_string(env));
        json_object_set_new(g, "dirty", d && *d ? json_boolean(strcmp(d, "0") != 0) : json_null());
        json_object_set_new(g, "diff_sha1", h && *h ? json_string(h) : json_null());
        return g;
    }
#ifdef ATTNBENCH_SOURCE_DIR
    return ab_git_info_at(ATTNBENCH_SOURCE_DIR);
#else
    return ab_git_info_at(NULL);
#endif
}

ab_run *ab_run_begin(const char *path, const char *command, const json_t *config, uint64_t seed,
                     const char *const *tsv_columns) {
    ab_run *r = calloc(1, sizeof *r);
    if (!r) {
        ab_fail(AB_ENOMEM, "out of memory");
        return NULL;
    }
    r->path = strdup(path);
    size_t n = strlen(path);
    r->tsv_path = malloc(n + 8);
    if (n > 5 && strcmp(path + n - 5, ".json") == 0) {
        memcpy(r->tsv_path, path, n - 5);
        strcpy(r->tsv_path + n - 5, ".tsv");
    } else {
        snprintf(r->tsv_path, n + 8, "%s.tsv", path);
    }
    /* Make the folder. */
    char *dir = strdup(path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        if (ab_mkdir_p(dir)) {
            free(dir);
            free(r->path);
            free(r->tsv_path);
            free(r);
            return NULL;
        }
    }
    free(dir);
    for (int i = 0; tsv_columns && tsv_columns[i]; i++) r->n_columns++;
    r->columns = calloc((size_t)r->n_columns + 1, sizeof(char *));
    for (int i = 0; i < r->n_columns; i++) r->columns[i] = strdup(tsv_columns[i]);

    char now[32];
    ab_iso_time(now, sizeof now);
    r->doc = json_object();
    r->records = json_array();
    json_object_set_new(r->doc, "schema", json_string("attnbench/run/1"));
    json_object_set_new(r->doc, "command", json_string(command));
    json_object_set_new(r->doc, "config", json_deep_copy(config));
    json_object_set_new(r->doc, "seed", json_integer((json_int_t)seed));
    json_object_set_new(r->doc, "machine", ab_machine_info());
    json_t *git = ab_git_info();
    json_object_set_new(r->doc, "git", git);
    static bool warned = false; /* once a process */
    if (json_is_true(json_object_get(git, "dirty")) && !warned) {
        warned = true;
        const char *h = json_string_value(json_object_get(git, "diff_sha1"));
        fprintf(stderr,
                "attnbench: warning: the source tree has changes not committed (diff %.12s): the run records "
                "git.dirty and the diff's hash, and cannot be rebuilt from its commit alone\n",
                h ? h : "unknown");
    }
    json_object_set_new(r->doc, "started", json_string(now));
    json_object_set_new(r->doc, "finished", json_null());
    json_object_set_new(r->doc, "status", json_string("running"));
    json_object_set(r->doc, "records", r->records);
    return r;
}


json_t *ab_run_records(ab_run *r) { return r->records; }

int ab_run_set(ab_run *r, const char *key, json_t *value) { return json_object_set_new(r->doc, key, value) ? -1 : 0; }

/* Value at a dotted path inside a record, or NULL. */
static json_t *dotted(json_t *obj, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    char *save = NULL;
    json_t *cur = obj;
    for (char *tok = strtok_r(buf, ".", &save); tok && cur; tok = strtok_r(NULL, ".", &save))
        cur = json_is_object(cur) ? json_object_get(cur, tok) : NULL;
    return cur;
}

static void tsv_value(FILE *f, json_t *v) {
    if (!v || json_is_null(v)) fputs("NaN", f);
    else if (json_is_integer(v)) fprintf(f, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v)) fprintf(f, "%.9g", json_real_value(v));
    else if (json_is_true(v)) fputs("1", f);
    else if (json_is_false(v)) fputs("0", f);
    else if (json_is_string(v)) {
        for (const char *s = json_string_value(v); *s; s++) fputc((*s == '\t' || *s == '\n') ? ' ' : *s, f);
    } else
        fputs("-", f);
}

int ab_run_save(ab_run *r) {
    ab_atomic_file af;
    int rc = ab_atomic_open(&af, r->path);
    if (rc) return rc;
    errno = 0;
    if (json_dumpf(r->doc, af.f, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) != 0) {
        ab_atomic_abort(&af);
        return ab_fail(errno ? ab_io_code(errno) : AB_ESYSTEM, "cannot write %s: %s", r->path,
                       errno ? strerror(errno) : "the write failed");
    }
    fputc('\n', af.f);
    if ((rc = ab_atomic_commit(&af))) return rc;
    if (r->n_columns == 0) return 0;
    if ((rc = ab_atomic_open(&af, r->tsv_path))) return rc;
    for (int i = 0; i < r->n_columns; i++) fprintf(af.f, "%s%s", i ? "\t" : "", r->columns[i]);
    fputc('\n', af.f);
    size_t idx;
    json_t *rec;
    json_array_foreach(r->records, idx, rec) {
        for (int i = 0; i < r->n_columns; i++) {
            if (i) fputc('\t', af.f);
            tsv_value(af.f, dotted(rec, r->columns[i]));
        }
        fputc('\n', af.f);
    }
    return ab_atomic_commit(&af);
}

int ab_run_add(ab_run *r, json_t *record) {
    json_array_append_new(r->records, record);
    return ab_run_save(r);
}

void ab_run_discard(ab_run *r) {
    if (!r) return;
    json_decref(r->records);
    json_decref(r->doc);
    for (int i = 0; i < r->n_columns; i++) free(r->columns[i]);
    free(r->columns);
    free(r->path);
    free(r->tsv_path);
    free(r);
}

int ab_run_finish(ab_run *r, const char *status) {
    char now[32];
    ab_iso_time(now, sizeof now);
    json_object_set_new(r->doc, "finished", json_string(now));
    json_object_set_new(r->doc, "status", json_string(status));
    int rc = ab_run_save(r);
    ab_run_discard(r);
    return rc;
}
