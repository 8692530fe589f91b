/* attnbench inputs: writes seeded random q, k, v, dout (and optional lengths) as .npy,
 * so `attnbench op` can be tried, or cross-checked, without any other tool. */
#include "cli_args.h"
#include "cli_util.h"
#include "commands.h"
#include "error.h"
#include "fileio.h"
#include "memory.h"
#include "npy.h"
#include "rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char INPUTS_USAGE[] =
    "usage: attnbench inputs --shape B,H,N,D,M [--seed S] [--lengths L1,L2,...] --out DIR\n"
    "\n"
    "Writes DIR/q.npy, DIR/k.npy [B,H,N,D], DIR/v.npy, DIR/dout.npy [B,H,N,M] (float32,\n"
    "standard normal from the Philox generator with seed S, default 0) and, with\n"
    "--lengths, DIR/lengths.npy (int32 [B]).\n";

/* inputs' own options: --shape and --lengths. */
typedef struct {
    const char *shape, *lens;
} inputs_opts;

static bool inputs_option(int argc, char **argv, int *i, void *ctx) {
    inputs_opts *o = ctx;
    if (strcmp(argv[*i], "--shape") == 0) o->shape = cli_value(argc, argv, i);
    else if (strcmp(argv[*i], "--lengths") == 0) o->lens = cli_value(argc, argv, i);
    else return false;
    return true;
}

/* One pass over --lengths' comma-separated values (empty fields skipped): each checked
 * to lie in [0, n] (an error exits), stored in lv when given. Returns the count, or
 * b + 1 once there are more than b. */
static long long lengths_pass(const char *lens, long long b, long long n, int32_t *lv) {
    long long m = 0;
    for (const char *p = lens; *p;) {
        size_t len = strcspn(p, ",");
        if (len) {
            char tok[64];
            if (len >= sizeof tok) cli_die(AB_EXIT_USAGE, "--lengths %.*s: not an integer", (int)len, p);
            memcpy(tok, p, len);
            tok[len] = '\0';
            if (m == b) return b + 1;
            long long v = cli_parse_int("--lengths", tok, 0, n);
            if (lv) lv[m] = (int32_t)v;
            m++;
        }
        p += len;
        if (*p == ',') p++;
    }
    return m;
}

int cmd_inputs(int argc, char **argv, const char *command_line) {
    (void)command_line;
    inputs_opts opts = {NULL, NULL};
    cli_args a = {.cmd = "inputs", .usage = INPUTS_USAGE, .takes = CLI_SEED | CLI_OUT};
    cli_parse(argc, argv, &a, inputs_option, &opts);
    const char *shape = opts.shape, *out = a.out, *lens = opts.lens;
    const uint64_t seed = a.seed;
    if (!shape || !out) cli_die(AB_EXIT_USAGE, "inputs: --shape B,H,N,D,M and --out DIR are required");
    long long d[5];
    int n = 0;
    char copy[256], *save = NULL;
    if (strlen(shape) >= sizeof copy) cli_die(AB_EXIT_USAGE, "--shape %s: need exactly five sizes B,H,N,D,M", shape);
    strcpy(copy, shape);
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == 5) cli_die(AB_EXIT_USAGE, "--shape %s: need exactly five sizes B,H,N,D,M", shape);
        d[n++] = cli_parse_int("--shape", tok, 1, 1 << 30);
    }
    if (n != 5) cli_die(AB_EXIT_USAGE, "--shape %s: need exactly five sizes B,H,N,D,M", shape);
    size_t nq, nv;
    if (ab_mul_size((size_t)(d[0] * d[1]), (size_t)d[2], &nq) || ab_mul_size(nq, (size_t)d[4], &nv) ||
        ab_mul_size(nq, (size_t)d[3], &nq) || nq > ((size_t)1 << 34) || nv > ((size_t)1 << 34))
        cli_die(AB_EXIT_USAGE, "--shape %s: too large", shape);
    /* every error exits before a buffer is allocated or after it is freed, so nothing is
     * left for a leak check: the lengths are checked in a first pass, stored in a second */
    int32_t *lv = NULL;
    if (lens) {
        if (lengths_pass(lens, d[0], d[2], NULL) != d[0])
            cli_die(AB_EXIT_USAGE, "--lengths %s: need exactly B = %lld values", lens, d[0]);
        lv = malloc(sizeof(int32_t) * (size_t)d[0]);
        if (!lv) cli_die(AB_EXIT_FAILURE, "out of memory for %lld lengths", d[0]);
        lengths_pass(lens, d[0], d[2], lv);
    }
    int rc = ab_mkdir_p(out);
    if (rc) {
        free(lv);
        cli_die(cli_status_for(rc), "--out: %s", ab_error());
    }
    const char *names[4] = {"q.npy", "k.npy", "v.npy", "dout.npy"};
    for (int t = 0; t < 4 && !rc; t++) {
        size_t cnt = t < 2 ? nq : nv;
        float *x = ab_alloc(cnt * sizeof(float));
        if (!x) {
            rc = AB_ENOMEM;
            break;
        }
        for (size_t i = 0; i < cnt; i++) x[i] = (float)ab_rng_normal(seed, (uint64_t)t, i);
        int64_t sh[4] = {d[0], d[1], d[2], t < 2 ? d[3] : d[4]};
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", out, names[t]);
        rc = ab_npy_write(path, AB_F32, 4, sh, x);
        ab_free(x);
    }
    if (!rc && lv) {
        char path[4096];
        snprintf(path, sizeof path, "%s/lengths.npy", out);
        int64_t sh[1] = {d[0]};
        rc = ab_npy_write(path, AB_I32, 1, sh, lv);
    }
    free(lv);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    return 0;
}
