/* deltanet against linear on the CPU, forward + backward, causal, B = 1, H = 8,
 * D = M = 64, N = 1024 .. 16384 (the sweep's `attnbench bench` binds no beta yet):
 * both variants in the same run, best of R calls each, as wall time and as the
 * process's CPU time (the latter is steadier on a machine shared with other work),
 * and the exponent of deltanet's CPU time fitted over N. Inputs uniform in
 * [-0.5, 0.5] and beta uniform in [0.05, 0.95] from harness/rng.h (seed 1).
 *
 * Not built by meson. From the repository root, after `ninja -C build`:
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iattention -Iharness experiments/sweep/deltanet_bench.c \
 *      -Lbuild -lattnbench -Wl,-rpath,build -lm -o build/deltanet_bench
 *   OMP_NUM_THREADS=1 build/deltanet_bench [chunk=C]
 */
#include "attention.h"
#include "blas.h"
#include "error.h"
#include "rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double clock_s(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *uniform(size_t n, uint64_t stream, double lo, double hi) {
    float *x = malloc(n * sizeof(float));
    if (!x) exit(2);
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * ab_rng_uniform(1, stream, i));
    return x;
}

/* Best wall and CPU seconds of forward + backward over reps calls. */
static void run(const char *variant, const char *set, int N, int reps, double *wall, double *cpu) {
    const char *sets[1] = {set};
    attn_options o = {.variant = variant, .device = AB_DEV_CPU, .seed = 1, .n_settings = set ? 1 : 0, .settings = sets};
    attn *a = NULL;
    if (attn_create(&o, &a)) {
        fprintf(stderr, "%s: %s\n", variant, attn_error());
        exit(1);
    }
    attn_shape s = {1, 8, N, 64, 64, true, NULL};
    const size_t n = (size_t)8 * N * 64, nb = (size_t)8 * N;
    float *q = uniform(n, 1, -0.5, 0.5), *k = uniform(n, 2, -0.5, 0.5), *v = uniform(n, 3, -0.5, 0.5);
    float *g = uniform(n, 4, -0.5, 0.5), *beta = uniform(nb, 5, 0.05, 0.95), *db = uniform(nb, 6, 0, 0);
    float *out = uniform(n, 7, 0, 0), *dq = uniform(n, 7, 0, 0), *dk = uniform(n, 7, 0, 0), *dv = uniform(n, 7, 0, 0);
    if (attn_aux_name(a) && attn_bind_aux(a, beta, db)) exit(1);
    const size_t sb = attn_saved_bytes(a, &s);
    void *saved = malloc(sb ? sb : 1);
    *wall = *cpu = INFINITY;
    for (int r = 0; r < reps; r++) {
        const double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        if (attn_forward(a, &s, q, k, v, out, saved) || attn_backward(a, &s, q, k, v, g, saved, dq, dk, dv)) {
            fprintf(stderr, "%s: %s\n", variant, attn_error());
            exit(1);
        }
        const double w = clock_s(CLOCK_MONOTONIC) - w0, c = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        *wall = w < *wall ? w : *wall;
        *cpu = c < *cpu ? c : *cpu;
    }
    free(q), free(k), free(v), free(g), free(beta), free(db), free(out), free(dq), free(dk), free(dv), free(saved);
    attn_destroy(a);
}

int main(int argc, char **argv) {
    const char *set = argc > 1 ? argv[1] : NULL;
    static const int Ns[] = {1024, 2048, 4096, 8192, 16384};
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    printf("threads %d; best of 5 (N <= 4096) or 3 calls of forward + backward; ms\n", ab_threads());
    for (int i = 0; i < 5; i++) {
        const int N = Ns[i], reps = N <= 4096 ? 5 : 3;
        double lw, lc, dw, dc;
        run("linear", NULL, N, reps, &lw, &lc);
        run("deltanet", set, N, reps, &dw, &dc);
        printf("N=%5d  cpu: linear %8.1f deltanet %8.1f ratio %.2f   wall: linear %8.1f deltanet %8.1f ratio %.2f\n",
               N, lc * 1e3, dc * 1e3, dc / lc, lw * 1e3, dw * 1e3, dw / lw);
        const double x = log((double)N), y = log(dc);
        sx += x, sy += y, sxx += x * x, sxy += x * y;
    }
    printf("deltanet%s%s: exponent of CPU time in N (least squares on logs) %.3f\n", set ? " " : "", set ? set : "",
           (5 * sxy - sx * sy) / (5 * sxx - sx * sx));
    return 0;
}
