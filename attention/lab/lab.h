/* The kernel lab's shared helpers (attention/lab/README.md): each lab program is one
 * .cu file that holds a hot kernel's numbered versions, a plain CPU reference in
 * double, and a main() that validates every version against the reference and times
 * it. Built by nvcc into lab_<name> when the build has CUDA, and always by g++ against
 * the CPU emulator into lab_<name>_emu, which the tests run at a small shape with
 * --check (validation only), so a lab program cannot rot unnoticed.
 *
 * A program includes this header first, then calls, in main:
 *   lab_opts o = lab_defaults(B, H, N, D, M, causal);  (its own default shape)
 *   if (lab_parse(argc, argv, &o, "what the program measures")) return 2;
 *   ... for each version v (1..n, or only o.version when set): run, check with
 *   lab_max_err, time with lab_time_ms, print with lab_report.
 * Options: --shape B,H,N,D,M  --causal 0|1  --version V (one version; default all)
 *          --reps R (timed repetitions, default 20)  --check (validate, no timing).
 * Every CUDA call is checked (LAB_CHECK: the program ends with exit status 1 and the
 * library's message). Header-only; C++ (CUDA). */
#ifndef ATTN_LAB_H
#define ATTN_LAB_H

#include "../../harness/cuda_compat.h"
#include "../../harness/error.h"

#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

typedef struct {
    int B, H, N, D, M;
    int causal;
    int version; /* 0: every version */
    int reps;
    int check_only;
} lab_opts;

static inline lab_opts lab_defaults(int B, int H, int N, int D, int M, int causal) {
    lab_opts o = {B, H, N, D, M, causal, 0, 20, 0};
    return o;
}

/* Ends the program (status 1) when an attnbench call (0 or an error code) failed. */
#define LAB_CHECK(call)                                                                                                \
    do {                                                                                                               \
        int lab_rc_ = (call);                                                                                          \
        if (lab_rc_) {                                                                                                 \
            fprintf(stderr, "lab: %s failed: %s\n", #call, ab_error());                                                \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static inline int lab_parse(int argc, char **argv, lab_opts *o, const char *what) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--check")) {
            o->check_only = 1;
        } else if (!strcmp(a, "--shape") && v) {
            if (sscanf(v, "%d,%d,%d,%d,%d", &o->B, &o->H, &o->N, &o->D, &o->M) != 5 || o->B < 1 || o->H < 1 ||
                o->N < 1 || o->D < 1 || o->M < 1) {
                fprintf(stderr, "lab: error: --shape %s: want B,H,N,D,M, each >= 1\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--causal") && v) {
            o->causal = atoi(v) != 0;
            i++;
        } else if (!strcmp(a, "--version") && v) {
            o->version = atoi(v);
            i++;
        } else if (!strcmp(a, "--reps") && v) {
            o->reps = atoi(v) > 0 ? atoi(v) : 1;
            i++;
        } else {
            fprintf(stderr,
                    "%s\nusage: %s [--shape B,H,N,D,M] [--causal 0|1] [--version V] [--reps R] [--check]\n", what,
                    argv[0]);
            return 2;
        }
    }
    if (ab_cuda_init()) {
        fprintf(stderr, "lab: error: %s\n", ab_error());
        return 2;
    }
    ab_cuda_info info;
    if (ab_cuda_device_info(&info) == 0)
        printf("lab: %s on %s (cc %d.%d), B=%d H=%d N=%d D=%d M=%d causal=%d\n", argv[0], info.name, info.cc_major,
               info.cc_minor, o->B, o->H, o->N, o->D, o->M, o->causal);
    return 0;
}

/* Whether version v runs (every one, or the one asked for). */
static inline bool lab_wants(const lab_opts *o, int v) { return o->version == 0 || o->version == v; }

/* n floats on the device, normal(0, scale) from a fixed seed (a small xorshift and
 * Box-Muller: the lab needs reproducible numbers, not the library's Philox); the host
 * copy is returned in *host (caller frees with free). */
static inline float *lab_random(size_t n, uint64_t seed, float scale, float **host) {
    float *h = (float *)malloc(sizeof(float) * (n ? n : 1));
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i += 2) {
        double u[2];
        for (int j = 0; j < 2; j++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            u[j] = ((double)(s >> 11) + 0.5) / 9007199254740992.0;
        }
        const double r = sqrt(-2.0 * log(u[0])), t = 6.283185307179586 * u[1];
        h[i] = (float)(scale * r * cos(t));
        if (i + 1 < n) h[i + 1] = (float)(scale * r * sin(t));
    }
    float *d = NULL;
    LAB_CHECK(ab_cuda_malloc((void **)&d, sizeof(float) * (n ? n : 1)));
    LAB_CHECK(ab_cuda_memcpy_h2d(d, h, sizeof(float) * n));
    if (host) *host = h;
    else free(h);
    return d;
}

static inline float *lab_zeros(size_t n) {
    float *d = NULL;
    LAB_CHECK(ab_cuda_malloc((void **)&d, sizeof(float) * (n ? n : 1)));
    LAB_CHECK(ab_cuda_memset(d, 0, sizeof(float) * (n ? n : 1)));
    return d;
}

/* max |got - want| / max |want| of n device floats against a host reference. */
static inline double lab_max_err(const float *got_dev, const double *want, size_t n) {
    std::vector<float> g(n ? n : 1);
    LAB_CHECK(ab_cuda_sync());
    LAB_CHECK(ab_cuda_memcpy_d2h(g.data(), got_dev, sizeof(float) * n));
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(fabs((double)g[i] - want[i]) <= e)) e = fabs((double)g[i] - want[i]); /* NaN: infinite */
        m = fmax(m, fabs(want[i]));
        if (g[i] != g[i]) e = INFINITY;
    }
    return m > 0 ? e / m : e;
}

/* Median milliseconds of `reps` runs of fn(ctx) (after one warm-up run), each timed
 * with events on the library's stream; fn returns 0 or an error code. */
template <class F> static inline double lab_time_ms(int reps, F &&fn) {
    cudaEvent_t e0, e1;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        fprintf(stderr, "lab: cudaEventCreate failed\n");
        exit(1);
    }
    LAB_CHECK(fn());
    std::vector<float> ms;
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(e0, ab_cuda_stream());
        LAB_CHECK(fn());
        cudaEventRecord(e1, ab_cuda_stream());
        cudaEventSynchronize(e1);
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        ms.push_back(t);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

/* One line per version: its error against the reference (and whether it is within tol),
 * and, when timed (ms >= 0), the median time and the rates its useful flops and its
 * minimal bytes give. Returns 1 when the version failed its check (main sums them and
 * exits with status 1 if any did). */
static inline int lab_report(int version, const char *name, double err, double tol, double ms, double flops,
                             double bytes) {
    const bool ok = err <= tol;
    printf("version %d %-28s max err %.2e (tol %.0e) %s", version, name, err, tol, ok ? "ok  " : "FAIL");
    if (ms >= 0)
        printf("  %9.4f ms  %8.2f TFLOP/s  %8.1f GB/s", ms, flops / (ms * 1e-3) / 1e12, bytes / (ms * 1e-3) / 1e9);
    printf("\n");
    fflush(stdout);
    return ok ? 0 : 1;
}

#endif
