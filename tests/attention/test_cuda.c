/* The CUDA backend against the CPU backend: for every variant with a CUDA
 * implementation and its options, forward and backward on random shapes (N = 1, odd D
 * and M, lengths masks with 0 and N, causal and not), recurrent steps and prefill
 * against the causal forward, workspace reuse, out of memory.
 *
 * Written once, built twice (tests/meson.build):
 * - test_cuda: linked to the real library. Runs on a machine with a GPU; skips (with
 *   the reason) when the build has no CUDA or the machine no device.
 * - test_cuda_emu: linked to the emulated library (the same .cu sources compiled by g++
 *   against tests/cuda_emu/), so it runs everywhere, CI included. Shapes stay small:
 *   the emulator runs every GPU thread as a fiber.
 *
 * Adding a variant: put its cases in CUDA_VARIANTS below (expected = true once its
 * backend exists); every test loops over that table. Paths of one variant (linear and
 * polynomial: several chunks, large feature sizes, the grouped workspace, state reset;
 * favor's shifts) have their own tests in test_cuda_paths.c, softmax's fused kernels
 * (tiles, masks, windows, tf32, the fallback, memory) in test_cuda_flash.c, with the
 * helpers this file defines (test_cuda_util.h).
 * Tolerances are relative to each tensor's largest entry (tu_rel_err); TC_PRINT=1 in
 * the environment prints every measured error (how the figures below were taken). */
#include "attention.h"
#include "cuda_blas.h"
#include "cuda_device.h"
#include "device.h"
#include "error.h"
#include "lsh.h"
#include "memory.h"
#include "rng.h"
#include "test_util.h"
#include "test_cuda_util.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TEST_CUDA_BACKEND
/* Internal knob of the backend (attention/lsh_cuda.h), for the grouped paths. */
extern size_t lsh_cuda_scratch_bytes;
/* The device's random numbers (lsh_cuda.cu), for the bit-for-bit check against the host. */
int lsh_cuda_rng(uint64_t seed, uint64_t stream, uint64_t index0, long long n, uint32_t *words, double *normals);
#endif
#ifdef TEST_CUDA_EMU
/* The emulator's device capacity (tests/cuda_emu/cuda_emu.cpp). */
size_t ab_emu_device_memory(void);
void ab_emu_set_device_memory(size_t bytes);
#endif

/* ---- the variants the CUDA backend implements, with options (test_cuda_util.h) ---- */

static const cuda_variant CUDA_VARIANTS[] = {
    {"softmax", {NULL}, 0, true},
    {"softmax", {"scale=0.3"}, 1, true},
    {"stateful-softmax", {NULL}, 0, true},
    {"stateful-softmax", {"scale=-0.7"}, 1, true},
    {"linear", {NULL}, 0, true},
    {"linear", {"chunk=3"}, 1, true},
    {"linear", {"feature_map=taylor"}, 1, true},
    {"linear", {"feature_map=taylor", "chunk=7", "eps=0.01"}, 3, true},
    {"polynomial", {NULL}, 0, true},
    {"polynomial", {"c=0.5", "scale=0.3", "chunk=7"}, 3, true},
    {"lsh", {NULL}, 0, true},
    {"lsh", {"rounds=2", "bits=2", "chunk=5", "combine=logsumexp"}, 4, true},
    {"lsh", {"rounds=4", "bits=3", "chunk=3", "scale=0.7"}, 4, true},
    {"lsh", {"rounds=4", "chunk=7", "combine=logsumexp"}, 3, true},
    {"lsh", {"rounds=1", "bits=1", "chunk=1000"}, 3, true},
    {"linear", {"feature_map=favor"}, 1, true},
    {"linear", {"feature_map=favor", "features=5", "chunk=3", "eps=0.01"}, 4, true},
    {"linear", {"precision=tf32"}, 1, true},
    {"linear", {"feature_map=favor", "features=20", "precision=tf32"}, 3, true},
    {"efficient", {NULL}, 0, true},
    {"local", {NULL}, 0, true},
    {"local", {"window=5"}, 1, true},
    {"local", {"window=3", "scale=0.7"}, 2, true},
    {"retention", {NULL}, 0, true},
    {"retention", {"gamma=0.9", "chunk=3"}, 2, true},
    {"retention", {"gamma=1", "scale=0.4", "chunk=100"}, 3, true},
    /* explicit window and stride: with auto, the recurrent mode takes N = capacity
     * (spare capacity then differs from the forward at N; crosscheck_cuda_emu has auto) */
    {"sparse", {"window=3", "stride=4"}, 2, true},
    {"sparse", {"window=5", "stride=3"}, 2, true},
    {"sparse", {"window=1", "stride=2", "scale=0.7"}, 3, true},
    {"sparse", {"window=2", "stride=1"}, 2, true},
};
#define N_CUDA_VARIANTS (int)(sizeof CUDA_VARIANTS / sizeof CUDA_VARIANTS[0])

const char *label(const cuda_variant *cv, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "%s", cv->variant);
    for (int i = 0; i < cv->n_settings && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, " %s", cv->settings[i]);
    return buf;
}

attn *make(const cuda_variant *cv, ab_device dev) {
    /* The CPU computes in fp32 only: its reference for a precision=tf32 case is fp32. */
    const char *set[4];
    int n = 0;
    for (int i = 0; i < cv->n_settings; i++)
        if (dev != AB_DEV_CPU || strncmp(cv->settings[i], "precision=", 10) != 0) set[n++] = cv->settings[i];
    attn_options o = {cv->variant, dev, 7, n, n ? set : NULL};
    attn *a = NULL;
    char buf[128];
    int rc = attn_create(&o, &a);
    cr_assert_eq(rc, 0, "attn_create(%s, %s): %s", label(cv, buf, sizeof buf), dev == AB_DEV_CUDA ? "cuda" : "cpu",
                 attn_error());
    return a;
}

/* Skips the test when there is no CUDA here (build or device); fails when an expected
 * variant has no CUDA backend. */
void require_cuda(void) {
    attn_options o = {"softmax", AB_DEV_CUDA, 0, 0, NULL};
    attn *a = NULL;
    int rc = attn_create(&o, &a);
    if (rc == ATTN_EDEVICE) cr_skip_test("CUDA backend not available here: %s", attn_error());
    cr_assert_eq(rc, 0, "attn_create(softmax, cuda): %s", attn_error());
    attn_destroy(a);
    for (int i = 0; i < N_CUDA_VARIANTS; i++) {
        if (!CUDA_VARIANTS[i].expected) continue;
        attn *b = make(&CUDA_VARIANTS[i], AB_DEV_CUDA);
        attn_destroy(b);
    }
}

/* ---- device buffers ---- */

float *dalloc(size_t n) {
    void *p = NULL;
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &p, (n ? n : 1) * sizeof(float)), 0, "%s", ab_error());
    return p;
}

float *dupload(const float *h, size_t n) {
    float *d = dalloc(n);
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d, h, n * sizeof(float)), 0, "%s", ab_error());
    return d;
}

/* Device buffer filled with NaN bytes: every entry the call should write must be written. */
float *dpoison(size_t n) {
    float *d = dalloc(n);
    cr_assert_eq(ab_dev_memset(AB_DEV_CUDA, d, 0xff, (n ? n : 1) * sizeof(float)), 0, "%s", ab_error());
    return d;
}

void ddownload(float *h, const float *d, size_t n) {
    cr_assert_eq(ab_dev_download(AB_DEV_CUDA, h, d, n * sizeof(float)), 0, "%s", ab_error());
}

void dfree(void *d) { ab_dev_free(AB_DEV_CUDA, d); }

/* ---- problems ---- */



void grads_alloc(grads *g, const tu_problem *p) {
    g->out = tu_alloc_f(p->nv);
    g->dq = tu_alloc_f(p->nq);
    g->dk = tu_alloc_f(p->nq);
    g->dv = tu_alloc_f(p->nv);
}

void grads_free(grads *g) {
    free(g->out);
    free(g->dq);
    free(g->dk);
    free(g->dv);
}

void run_cpu(const cuda_variant *cv, const tu_problem *p, grads *g) {
    attn *a = make(cv, AB_DEV_CPU);
    size_t sb = attn_saved_bytes(a, &p->s);
    void *saved = sb ? malloc(sb) : NULL;
    cr_assert_eq(attn_forward(a, &p->s, p->q, p->k, p->v, g->out, saved), 0, "cpu forward: %s", attn_error());
    cr_assert_eq(attn_backward(a, &p->s, p->q, p->k, p->v, p->dout, saved, g->dq, g->dk, g->dv), 0,
                 "cpu backward: %s", attn_error());
    free(saved);
    attn_destroy(a);
}

bool tc_flash_saves(const char *variant) {
    return strcmp(variant, "softmax") == 0 || strcmp(variant, "stateful-softmax") == 0 || strcmp(variant, "local") == 0;
}

size_t tc_flash_saved_bytes(const attn_shape *s) {
    const size_t rows = (size_t)s->batch * s->heads * s->len;
    return (rows * s->v_dim * sizeof(float) + 255) / 256 * 256 + rows * sizeof(float);
}

/* Forward and backward on the device; out and the gradients start as NaN on the device
 * (every entry must be written) and are copied back into g. `repeat` runs the pair
 * twice (workspace reuse: the second allocates nothing and gives the same results). */
void run_cuda(const cuda_variant *cv, const tu_problem *p, grads *g, bool repeat) {
    attn *a = make(cv, AB_DEV_CUDA);
    size_t sb = attn_saved_bytes(a, &p->s);
    if (tc_flash_saves(cv->variant)) {
        /* Its own saved state: O and the rows' log-sum-exps, O(N M) per slice (the CPU
         * keeps the N x N probabilities, or for local nothing). */
        cr_assert_eq(sb, tc_flash_saved_bytes(&p->s), "%s: saved_bytes %zu on CUDA", cv->variant, sb);
    } else {
        attn *cpu = make(cv, AB_DEV_CPU);
        cr_assert_eq(sb, attn_saved_bytes(cpu, &p->s), "saved_bytes differ between the devices");
        attn_destroy(cpu);
    }
    float *q = dupload(p->q, p->nq), *k = dupload(p->k, p->nq), *v = dupload(p->v, p->nv);
    float *dout = dupload(p->dout, p->nv);
    float *out = dpoison(p->nv), *dq = dpoison(p->nq), *dk = dpoison(p->nq), *dv = dpoison(p->nv);
    void *saved = NULL;
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &saved, sb), 0, "%s", ab_error());
    for (int r = 0; r < (repeat ? 2 : 1); r++) {
        size_t cur = ab_mem_current(AB_DEV_CUDA);
        if (r == 1) ab_mem_reset_peak(AB_DEV_CUDA);
        cr_assert_eq(attn_forward(a, &p->s, q, k, v, out, saved), 0, "cuda forward: %s", attn_error());
        cr_assert_eq(attn_backward(a, &p->s, q, k, v, dout, saved, dq, dk, dv), 0, "cuda backward: %s", attn_error());
        cr_assert_eq(ab_cuda_sync(), 0, "%s", ab_error());
        if (r == 1) {
            cr_assert_eq(ab_mem_peak(AB_DEV_CUDA), cur, "repeated calls allocated %zu device bytes",
                         ab_mem_peak(AB_DEV_CUDA) - cur);
            grads g2;
            grads_alloc(&g2, p);
            ddownload(g2.out, out, p->nv);
            ddownload(g2.dq, dq, p->nq);
            ddownload(g2.dk, dk, p->nq);
            ddownload(g2.dv, dv, p->nv);
            cr_assert(memcmp(g2.out, g->out, p->nv * 4) == 0 && memcmp(g2.dq, g->dq, p->nq * 4) == 0 &&
                          memcmp(g2.dk, g->dk, p->nq * 4) == 0 && memcmp(g2.dv, g->dv, p->nv * 4) == 0,
                      "a second forward/backward gave other results");
            grads_free(&g2);
        } else {
            ddownload(g->out, out, p->nv);
            ddownload(g->dq, dq, p->nq);
            ddownload(g->dk, dk, p->nq);
            ddownload(g->dv, dv, p->nv);
        }
    }
    dfree(saved);
    dfree(q), dfree(k), dfree(v), dfree(dout), dfree(out), dfree(dq), dfree(dk), dfree(dv);
    attn_destroy(a);
}

double tol_factor(const cuda_variant *cv) {
    double f = strcmp(cv->variant, "polynomial") == 0 ? POLY_TOL_FACTOR : 1.0;
    for (int i = 0; i < cv->n_settings; i++)
        if (strcmp(cv->settings[i], "precision=tf32") == 0) f *= TF32_TOL_FACTOR;
    return f;
}

/* got vs want: max abs error over max(max |want|, floor) (tu_rel_err). */
void expect_close_floor(const float *got, const float *want, size_t n, double tol, double floor,
                               const char *what, const char *ctx) {
    double *w = tu_to_double(want, n);
    double err = tu_rel_err(got, w, n, floor);
    if (getenv("TC_PRINT")) fprintf(stderr, "ERR %.3g %s | %s\n", err, what, ctx);
    cr_assert(err <= tol, "%s: %s: cuda vs cpu rel err %.3g > %.3g", ctx, what, err, tol);
    free(w);
}

void expect_close(const float *got, const float *want, size_t n, double tol, const char *what,
                         const char *ctx) {
    expect_close_floor(got, want, n, tol, 1e-3, what, ctx);
}

/* CUDA == CPU for one variant and problem, forward and backward; dq and dk judged at
 * the scale max(max |want|, qk_floor). */
void check_problem_floor(const cuda_variant *cv, tu_problem *pp, bool repeat, double qk_floor) {
    tu_problem p = *pp;
    const int B = p.s.batch, H = p.s.heads, N = p.s.len, D = p.s.qk_dim, M = p.s.v_dim;
    const bool causal = p.s.causal, lengths = p.s.lengths != NULL;
    grads c, g;
    grads_alloc(&c, &p);
    grads_alloc(&g, &p);
    run_cpu(cv, &p, &c);
    run_cuda(cv, &p, &g, repeat);
    char ctx[256], buf[128];
    snprintf(ctx, sizeof ctx, "%s B=%d H=%d N=%d D=%d M=%d causal=%d lengths=%s", label(cv, buf, sizeof buf), B, H, N, D,
             M, causal, lengths ? "yes" : "no");
    const double f = tol_factor(cv);
    expect_close(g.out, c.out, p.nv, f * FWD_TOL, "out", ctx);
    expect_close_floor(g.dq, c.dq, p.nq, f * BWD_TOL, qk_floor, "dq", ctx);
    expect_close_floor(g.dk, c.dk, p.nq, f * BWD_TOL, qk_floor, "dk", ctx);
    expect_close(g.dv, c.dv, p.nv, f * BWD_TOL, "dv", ctx);
    tu_assert_padded_zero(&p.s, g.out, M, "out");
    tu_assert_padded_zero(&p.s, g.dq, D, "dq");
    tu_assert_padded_zero(&p.s, g.dk, D, "dk");
    tu_assert_padded_zero(&p.s, g.dv, M, "dv");
    grads_free(&c);
    grads_free(&g);
}

void check_problem(const cuda_variant *cv, tu_problem *p, bool repeat) {
    check_problem_floor(cv, p, repeat, 1e-3);
}

void check_parallel_floor(const cuda_variant *cv, int B, int H, int N, int D, int M, bool causal,
                                 const int *lengths, uint64_t seed, bool repeat, double qk_floor) {
    if (causal && !attn_variant_has_causal(attn_variant_find(cv->variant))) return; /* efficient */
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, seed);
    check_problem_floor(cv, &p, repeat, qk_floor);
    tu_problem_free(&p);
}

void check_parallel(const cuda_variant *cv, int B, int H, int N, int D, int M, bool causal, const int *lengths,
                           uint64_t seed, bool repeat) {
    check_parallel_floor(cv, B, H, N, D, M, causal, lengths, seed, repeat, 1e-3);
}

/* ---- parallel mode ---- */

Test(cuda_parallel, odd_sizes_causal_and_not) {
    require_cuda();
    for (int i = 0; i < N_CUDA_VARIANTS; i++)
        for (int causal = 0; causal < 2; causal++) check_parallel(&CUDA_VARIANTS[i], 2, 3, 37, 5, 7, causal, NULL, 11, false);
}

Test(cuda_parallel, lengths_zero_one_and_full) {
    require_cuda();
    const int len_a[4] = {37, 0, 20, 1};
    const int len_b[3] = {0, 0, 9}; /* equal lengths next to each other form one run */
    for (int i = 0; i < N_CUDA_VARIANTS; i++)
        for (int causal = 0; causal < 2; causal++) {
            check_parallel(&CUDA_VARIANTS[i], 4, 2, 37, 8, 3, causal, len_a, 12, false);
            check_parallel(&CUDA_VARIANTS[i], 3, 1, 9, 3, 5, causal, len_b, 13, false);
        }
}

Test(cuda_parallel, n_equals_one) {
    /* With one key, out = sim v / (sim + eps) (linear, polynomial): dq and dk are
     * eps-sized (~1e-5 here) differences of two terms of size |dout . v| / den (softmax:
     * exactly zero), i.e. float rounding noise on either side: the CPU's own causal and
     * non-causal paths (the same sums) differ by up to 3.8e-6 absolute in polynomial's dk
     * (den = 0.44). So dq and dk are judged at an absolute scale (floor 0.1: allowed
     * 1e-5, polynomial 4e-5); out and dv as everywhere. Measured: absolute error up to
     * 5.4e-7 (linear, taylor dq), 4.7e-6 (polynomial dk). With precision=tf32 the two
     * terms carry TF32's rounding (4.9e-4 of |dout . v| / den, which is O(1) here): the
     * noise is 1e-3 absolute (measured up to 9e-4), so those cases take floor 1. */
    require_cuda();
    const int len[2] = {1, 0};
    for (int i = 0; i < N_CUDA_VARIANTS; i++)
        for (int causal = 0; causal < 2; causal++) {
            const double floor = tol_factor(&CUDA_VARIANTS[i]) >= TF32_TOL_FACTOR ? 1.0 : 0.1;
            check_parallel_floor(&CUDA_VARIANTS[i], 2, 2, 1, 3, 5, causal, NULL, 14, false, floor);
            check_parallel_floor(&CUDA_VARIANTS[i], 2, 2, 1, 3, 5, causal, len, 15, false, floor);
        }
}

Test(cuda_parallel, long_rows_and_head_size_64) {
    /* N = 300: five key tiles of 64 (softmax's fused kernels, attention/flash_softmax.cu),
     * lengths cutting the fifth; rows longer than a block of threads (256). */
    require_cuda();
    const int len[2] = {300, 257};
    for (int causal = 0; causal < 2; causal++) {
        check_parallel(&CUDA_VARIANTS[0], 2, 1, 300, 16, 9, causal, len, 16, false);
        check_parallel(&CUDA_VARIANTS[0], 1, 1, 64, 64, 64, causal, NULL, 17, false);
    }
}

Test(cuda_parallel, sparse_rows_beyond_shared_memory) {
    /* sparse keeps a row's scores in shared memory while two slots of 2 w - 1 + 2 N / s
     * floats fit 48 KiB (attention/sparse_cuda.cu), and in workspace past that: window
     * 1000 and stride 1 at N = 2100 give slots of 1999 + 4200 floats, past the 6144 that
     * fit (the table's cases all fit). */
    require_cuda();
    static const cuda_variant big = {"sparse", {"window=1000", "stride=1"}, 2, true};
    const int len[2] = {2100, 1999};
    for (int causal = 0; causal < 2; causal++) check_parallel(&big, 2, 1, 2100, 3, 2, causal, len, 18, false);
}

Test(cuda_parallel, repeated_calls_reuse_the_workspace) {
    require_cuda();
    const int len[2] = {20, 11};
    for (int i = 0; i < N_CUDA_VARIANTS; i++) check_parallel(&CUDA_VARIANTS[i], 2, 2, 20, 4, 6, true, len, 18, true);
}


/* ---- lsh: hashing, sort groups, norm floor ---- */

static const cuda_variant *lsh_case(const char *s0, const char *s1, const char *s2, const char *s3, cuda_variant *cv) {
    *cv = (cuda_variant){"lsh", {s0, s1, s2, s3}, 0, true};
    while (cv->n_settings < 4 && cv->settings[cv->n_settings]) cv->n_settings++;
    return cv;
}

/* attn_lsh_buckets on both devices for q [B,H,N,D] (host), compared exactly. */
static void check_buckets(const cuda_variant *cv, const attn_shape *s, const float *q, uint64_t seed) {
    attn_options oc = {"lsh", AB_DEV_CPU, seed, cv->n_settings, cv->settings};
    attn_options og = {"lsh", AB_DEV_CUDA, seed, cv->n_settings, cv->settings};
    attn *cpu = NULL, *gpu = NULL;
    cr_assert_eq(attn_create(&oc, &cpu), 0, "%s", attn_error());
    cr_assert_eq(attn_create(&og, &gpu), 0, "%s", attn_error());
    char buf[128];
    int rounds = atoi(attn_option_value(cpu, s, "rounds", buf, sizeof buf)), bits = atoi(attn_option_value(cpu, s, "bits", buf, sizeof buf));
    size_t nq = (size_t)s->batch * s->heads * s->len * s->qk_dim, nb = (size_t)rounds * s->batch * s->heads * s->len;
    int *want = malloc(nb * sizeof(int)), *got = malloc(nb * sizeof(int));
    cr_assert_eq(attn_lsh_buckets(cpu, s, q, want), 0, "cpu buckets: %s", attn_error());
    float *dq = dupload(q, nq);
    int *db = (int *)dpoison(nb);
    cr_assert_eq(attn_lsh_buckets(gpu, s, dq, db), 0, "cuda buckets: %s", attn_error());
    cr_assert_eq(ab_dev_download(AB_DEV_CUDA, got, db, nb * sizeof(int)), 0, "%s", ab_error());
    int used = 0;
    for (size_t e = 0; e < nb; e++) {
        cr_assert_eq(got[e], want[e], "%s seed %llu: bucket %zu: cuda %d, cpu %d", label(cv, buf, sizeof buf),
                     (unsigned long long)seed, e, got[e], want[e]);
        cr_assert(want[e] >= -1 && want[e] < 2 * bits);
        used |= want[e] >= bits; /* the negated half is reached too */
    }
    cr_assert(nb < 64 || used, "no bucket from the negated projections");
    dfree(dq), dfree(db);
    free(want), free(got);
    attn_destroy(cpu);
    attn_destroy(gpu);
}

Test(cuda_lsh, buckets_equal_cpu_bit_for_bit) {
    /* The same seed gives the same buckets as the CPU, exactly: the hash is the same
     * arithmetic on both (attention/lsh_hash.h, rotations from harness/rng_core.h).
     * bits 1, 8 (one tile of projections), 13 (a partial tile), 64; D from 1 to 70;
     * lengths with 0; zero queries (norm floored: all projections 0, bucket 0) and
     * repeated queries (equal projections). */
    require_cuda();
    cuda_variant cv;
    static const int lens[3] = {0, 300, 111};
    static const struct {
        const char *bits, *rounds;
        int B, H, N, D;
        bool lengths;
    } cases[] = {
        {"bits=8", "rounds=3", 3, 2, 300, 13, true}, {"bits=1", "rounds=2", 2, 2, 50, 1, false},
        {"bits=13", "rounds=4", 1, 3, 90, 70, false}, {"bits=64", "rounds=1", 2, 1, 120, 5, false},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        attn_shape s = {cases[t].B, cases[t].H, cases[t].N, cases[t].D, 3, false, cases[t].lengths ? lens : NULL};
        size_t nq = (size_t)s.batch * s.heads * s.len * s.qk_dim;
        float *q = tu_alloc_f(nq);
        tu_fill_normal(q, nq, 60 + t, 1, 1.0);
        for (size_t r = 0; r < nq / s.qk_dim; r += 7) memset(q + r * s.qk_dim, 0, sizeof(float) * s.qk_dim);
        for (size_t r = 3; r + 5 < nq / s.qk_dim; r += 11)
            memcpy(q + r * s.qk_dim, q + (r + 5) * s.qk_dim, sizeof(float) * s.qk_dim);
        for (uint64_t seed = 0; seed < 3; seed++)
            check_buckets(lsh_case(cases[t].bits, cases[t].rounds, NULL, NULL, &cv), &s, q, seed * 0x9e3779b97f4a7c15ull);
        free(q);
    }
}

#ifdef TEST_CUDA_BACKEND
Test(cuda_lsh, philox_and_normals_equal_host) {
    /* The device's Philox words and normals (harness/rng_core.h compiled as device code)
     * equal the host's bit for bit, on runs of indices that cross 2^32 and for streams
     * and seeds with high words: the rotations R_r are these normals rounded to float. */
    require_cuda();
    static const struct {
        uint64_t seed, stream, index0;
    } runs[] = {{0, 0, 0}, {7, 3, 0xfffff000ull}, {0x123456789abcdefull, 0xfedcba9876543210ull, 1ull << 40},
                {~0ull, 63, ~0ull - 5000}};
    const long long n = 5000;
    uint32_t *w = malloc(sizeof(uint32_t) * 4 * n);
    double *z = malloc(sizeof(double) * n);
    void *dw = NULL, *dz = NULL;
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &dw, sizeof(uint32_t) * 4 * n), 0);
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &dz, sizeof(double) * n), 0);
    for (size_t t = 0; t < sizeof runs / sizeof runs[0]; t++) {
        cr_assert_eq(lsh_cuda_rng(runs[t].seed, runs[t].stream, runs[t].index0, n, dw, dz), 0, "%s", ab_error());
        cr_assert_eq(ab_dev_download(AB_DEV_CUDA, w, dw, sizeof(uint32_t) * 4 * n), 0);
        cr_assert_eq(ab_dev_download(AB_DEV_CUDA, z, dz, sizeof(double) * n), 0);
        for (long long e = 0; e < n; e++) {
            uint32_t hw[4];
            const uint64_t i = runs[t].index0 + (uint64_t)e;
            ab_philox4x32(runs[t].seed, runs[t].stream, i, hw);
            cr_assert(memcmp(hw, w + 4 * e, sizeof hw) == 0, "run %zu index %llu: Philox words differ", t,
                      (unsigned long long)i);
            const double hz = ab_rng_normal(runs[t].seed, runs[t].stream, i);
            cr_assert(memcmp(&hz, &z[e], sizeof hz) == 0, "run %zu index %llu: normal %.17g on the device, %.17g on the host",
                      t, (unsigned long long)i, z[e], hz);
        }
    }
    dfree(dw), dfree(dz);
    free(w), free(z);
}

Test(cuda_lsh, groups_of_segments) {
    /* A scratch budget below the (slice, round) pairs of a call: they go in groups, some
     * of one pair, some cutting a slice's rounds in two (the logsumexp combine's running
     * state carries over), with lengths making several runs. Same results as the CPU. */
    require_cuda();
    const size_t saved = lsh_cuda_scratch_bytes;
    const size_t budgets[3] = {1, 20000, 45000}; /* 1, 2 and 5 pairs per group (about 8 kB each) */
    static const int len[3] = {30, 17, 0};
    cuda_variant cv;
    for (int b = 0; b < 3; b++) {
        lsh_cuda_scratch_bytes = budgets[b];
        for (int causal = 0; causal < 2; causal++) {
            check_parallel(lsh_case("rounds=3", "chunk=4", "combine=logsumexp", "bits=2", &cv), 3, 2, 30, 5, 4, causal,
                           len, 70, b == 1);
            check_parallel(lsh_case("rounds=3", "chunk=4", "bits=2", NULL, &cv), 3, 2, 30, 5, 4, causal, len, 71, false);
        }
    }
    lsh_cuda_scratch_bytes = saved;
}
#endif

Test(cuda_lsh, wide_heads_many_chunks_and_zero_queries) {
    /* D, M above a warp (the row kernels' lanes loop), 2 chunk = 80 keys per row, N not a
     * multiple of the chunk; then zero query rows (norm floored: the key gradient takes
     * the k = q / floor branch) among normal ones. */
    require_cuda();
    cuda_variant cv;
    static const int len[2] = {131, 77};
    for (int causal = 0; causal < 2; causal++)
        check_parallel(lsh_case("rounds=2", "chunk=40", "combine=logsumexp", NULL, &cv), 2, 1, 131, 33, 40, causal,
                       len, 72, false);
    tu_problem p;
    tu_problem_init(&p, 1, 2, 23, 6, 3, true, NULL, 73);
    for (size_t r = 0; r < 2 * 23; r += 5) memset(p.q + r * 6, 0, sizeof(float) * 6);
    check_problem(lsh_case("rounds=2", "chunk=4", "bits=2", NULL, &cv), &p, false);
    check_problem(lsh_case("rounds=3", "chunk=5", "combine=logsumexp", NULL, &cv), &p, false);
    tu_problem_free(&p);
}

/* ---- recurrent mode ---- */

/* prefill(P) (P < 0: none) then steps P..N-1 on the device, against the causal forward
 * of the CPU and of the device. with_out: the prefill returns its outputs. */
void check_recurrent(const cuda_variant *cv, int B, int H, int N, int D, int M, int capacity, int P,
                            bool with_out, uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, true, NULL, seed);
    grads c, g;
    grads_alloc(&c, &p);
    grads_alloc(&g, &p);
    run_cpu(cv, &p, &c);
    run_cuda(cv, &p, &g, false);
    attn *a = make(cv, AB_DEV_CUDA);
    size_t cur = ab_mem_current(AB_DEV_CUDA);
    attn_state *st = NULL;
    cr_assert_eq(attn_state_create(a, &p.s, capacity, &st), 0, "state_create: %s", attn_error());
    cr_assert_geq(ab_mem_current(AB_DEV_CUDA), cur + attn_state_bytes(a, &p.s, capacity),
                  "the state's memory is not on the device's tracked allocator");
    float *rec = tu_alloc_f(p.nv);
    int start = 0;
    if (P >= 0) {
        float *qp = tu_prefix(&p.s, p.q, P, D), *kp = tu_prefix(&p.s, p.k, P, D), *vp = tu_prefix(&p.s, p.v, P, M);
        size_t np = (size_t)B * H * (size_t)P;
        float *dq = dupload(qp, np * D), *dk = dupload(kp, np * D), *dv = dupload(vp, np * M);
        float *dop = with_out ? dpoison(np * M) : NULL;
        cr_assert_eq(attn_prefill(a, st, P, dq, dk, dv, dop), 0, "prefill(%d): %s", P, attn_error());
        if (dop) {
            float *op = tu_alloc_f(np * M);
            ddownload(op, dop, np * M);
            for (int bh = 0; bh < B * H; bh++)
                memcpy(rec + (size_t)bh * N * M, op + (size_t)bh * P * M, sizeof(float) * (size_t)P * M);
            free(op);
        }
        dfree(dq), dfree(dk), dfree(dv), dfree(dop);
        free(qp), free(kp), free(vp);
        start = P;
    }
    size_t bh = (size_t)B * H;
    float *qt = tu_alloc_f(bh * D), *kt = tu_alloc_f(bh * D), *vt = tu_alloc_f(bh * M), *ot = tu_alloc_f(bh * M);
    float *dqt = dalloc(bh * D), *dkt = dalloc(bh * D), *dvt = dalloc(bh * M), *dot = dpoison(bh * M);
    size_t before = ab_mem_current(AB_DEV_CUDA);
    ab_mem_reset_peak(AB_DEV_CUDA);
    for (int t = start; t < N; t++) {
        tu_gather(&p.s, p.q, qt, t, D);
        tu_gather(&p.s, p.k, kt, t, D);
        tu_gather(&p.s, p.v, vt, t, M);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dqt, qt, bh * D * 4), 0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dkt, kt, bh * D * 4), 0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dvt, vt, bh * M * 4), 0);
        cr_assert_eq(attn_step(a, st, t, dqt, dkt, dvt, dot), 0, "step %d: %s", t, attn_error());
        ddownload(ot, dot, bh * M);
        tu_scatter(&p.s, ot, rec, t, M);
    }
    cr_assert_eq(ab_mem_peak(AB_DEV_CUDA), before, "steps allocated device memory");
    cr_assert_eq(attn_state_len(st), N);
    int first = (P > 0 && !with_out) ? P : 0;
    char ctx[256], buf[128];
    snprintf(ctx, sizeof ctx, "%s B=%d H=%d N=%d D=%d M=%d cap=%d prefill=%d out=%d", label(cv, buf, sizeof buf), B, H,
             N, D, M, capacity, P, with_out);
    for (size_t s = 0; s < bh; s++) {
        size_t off = (s * N + first) * M, n = (size_t)(N - first) * M;
        expect_close(rec + off, c.out + off, n, tol_factor(cv) * FWD_TOL, "steps vs cpu causal forward", ctx);
        expect_close(rec + off, g.out + off, n, tol_factor(cv) * STEP_TOL, "steps vs cuda causal forward", ctx);
    }
    free(qt), free(kt), free(vt), free(ot), free(rec);
    dfree(dqt), dfree(dkt), dfree(dvt), dfree(dot);
    attn_state_destroy(st);
    attn_destroy(a);
    grads_free(&c);
    grads_free(&g);
    tu_problem_free(&p);
}

static const cuda_variant *first_with_step(int from) {
    for (int i = from; i < N_CUDA_VARIANTS; i++)
        if (attn_variant_has_step(attn_variant_find(CUDA_VARIANTS[i].variant))) return &CUDA_VARIANTS[i];
    return NULL;
}

Test(cuda_recurrent, steps_equal_causal_forward) {
    require_cuda();
    for (int i = 0; i < N_CUDA_VARIANTS; i++) {
        const cuda_variant *cv = &CUDA_VARIANTS[i];
        if (!attn_variant_has_step(attn_variant_find(cv->variant))) continue;
        check_recurrent(cv, 2, 3, 37, 5, 7, 37, -1, true, 51); /* capacity == N */
        check_recurrent(cv, 1, 1, 1, 3, 2, 1, -1, true, 52);   /* N = 1 */
        check_recurrent(cv, 1, 2, 12, 4, 3, 20, -1, true, 53); /* spare capacity */
    }
}

Test(cuda_recurrent, prefill_then_steps) {
    require_cuda();
    const int prompts[] = {0, 1, 20, 37};
    for (int i = 0; i < N_CUDA_VARIANTS; i++) {
        const cuda_variant *cv = &CUDA_VARIANTS[i];
        if (!attn_variant_has_step(attn_variant_find(cv->variant))) continue;
        for (size_t j = 0; j < sizeof prompts / sizeof prompts[0]; j++)
            check_recurrent(cv, 2, 3, 37, 5, 7, 40, prompts[j], true, 54);
        check_recurrent(cv, 2, 3, 37, 5, 7, 37, 20, false, 55); /* out == NULL */
    }
}

Test(cuda_recurrent, wide_heads) {
    /* M and D above the step kernel's block of threads: its output columns go in passes. */
    require_cuda();
    const cuda_variant *cv = first_with_step(0);
    cr_assert_not_null(cv);
    check_recurrent(cv, 1, 1, 6, 300, 300, 6, 2, true, 56);
    check_recurrent(cv, 1, 2, 40, 3, 1, 40, 33, true, 57); /* M = 1 */
}


/* ---- device memory ---- */

Test(cuda_memory, tracked_and_state_on_device) {
    require_cuda();
    const cuda_variant *cv = first_with_step(0);
    cr_assert_not_null(cv);
    attn *a = make(cv, AB_DEV_CUDA);
    attn_shape s = {2, 2, 1, 8, 8, true, NULL};
    size_t c0 = ab_mem_current(AB_DEV_CUDA), h0 = ab_mem_current(AB_DEV_CPU);
    attn_state *st = NULL;
    cr_assert_eq(attn_state_create(a, &s, 100, &st), 0, "%s", attn_error());
    size_t sb = attn_state_bytes(a, &s, 100);
    cr_assert_geq(sb, (size_t)2 * 2 * 100 * 16 * 4, "a cache of 100 positions");
    cr_assert_geq(ab_mem_current(AB_DEV_CUDA) - c0, sb, "state not on the device");
    cr_assert_lt(ab_mem_current(AB_DEV_CPU) - h0, sb, "state taken from host memory");
    attn_state_destroy(st);
    attn_destroy(a);
    cr_assert_eq(ab_mem_current(AB_DEV_CUDA), c0, "device memory not returned");
}

#ifdef TEST_CUDA_EMU
Test(cuda_memory, out_of_device_memory_is_enomem) {
    /* The emulated device's capacity is lowered: creating a state or running a shape
     * that does not fit fails with ATTN_ENOMEM and says so; nothing leaks, and the
     * device works again afterwards. */
    require_cuda();
    const size_t cap0 = ab_emu_device_memory();
    const size_t c0 = ab_mem_current(AB_DEV_CUDA);
    ab_emu_set_device_memory(c0 + ((size_t)1 << 20)); /* 1 MiB free */
    attn *a = make(&CUDA_VARIANTS[2], AB_DEV_CUDA);
    attn_shape s = {4, 4, 1, 64, 64, true, NULL};
    attn_state *st = NULL;
    ab_clear_error();
    int rc = attn_state_create(a, &s, 4096, &st); /* 4*4*4096*128*4 = 32 MiB */
    cr_assert_eq(rc, ATTN_ENOMEM, "state that does not fit: rc %d (%s)", rc, attn_error());
    cr_assert(strstr(attn_error(), "out of device memory") != NULL, "message: %s", attn_error());
    cr_assert_null(st);
    attn_shape big = {64, 8, 1024, 8, 8, false, NULL}; /* workspace (backward's delta) 2 MiB */
    ab_clear_error();
    rc = attn_reserve(a, &big);
    cr_assert_eq(rc, ATTN_ENOMEM, "workspace that does not fit: rc %d (%s)", rc, attn_error());
    attn_destroy(a);
    cr_assert_eq(ab_mem_current(AB_DEV_CUDA), c0, "a failed allocation leaked");
    ab_emu_set_device_memory(cap0);
    a = make(&CUDA_VARIANTS[2], AB_DEV_CUDA);
    cr_assert_eq(attn_state_create(a, &s, 4096, &st), 0, "%s", attn_error());
    attn_state_destroy(st);
    attn_destroy(a);
}
#endif

Test(cuda_device, info_and_errors) {
    require_cuda();
    ab_cuda_info info;
    cr_assert_eq(ab_cuda_device_info(&info), 0, "%s", ab_error());
    cr_assert(info.name[0] != '\0' && info.total_bytes > 0 && info.cc_major >= 7, "device %s cc %d.%d", info.name,
              info.cc_major, info.cc_minor);
    cr_assert(ab_cuda_ready());
    /* A bad GEMM size is refused with a message, not a crash. */
    ab_clear_error();
    cr_assert_eq(ab_cuda_sgemm(false, false, 2, 2, 2, 1.0f, NULL, 1, NULL, 2, 0.0f, NULL, 2), AB_EINVAL);
    cr_assert(strstr(ab_error(), "leading dimension") != NULL, "%s", ab_error());
    /* ab_cuda_malloc of nothing is NULL and no error. */
    void *p = (void *)&p;
    cr_assert_eq(ab_cuda_malloc(&p, 0), 0);
    cr_assert_null(p);
}

Test(cuda_device, unsupported_variants_say_so) {
    /* A variant without a CUDA implementation is refused with ATTN_EUNSUPPORTED and a
     * message naming it (until its backend lands). */
    require_cuda();
    for (int v = 0; v < attn_variant_count(); v++) {
        const char *name = attn_variant_name(v);
        bool listed = false;
        for (int i = 0; i < N_CUDA_VARIANTS; i++) listed |= strcmp(CUDA_VARIANTS[i].variant, name) == 0;
        /* a variant with parameters of its own (linformer) has its own suite, which
         * binds them: tests/attention/test_cuda_linformer.c */
        listed |= strcmp(name, "linformer") == 0;
        listed |= strcmp(name, "deltanet") == 0; /* its input beta: tests/attention/test_cuda_deltanet.c */
        listed |= strcmp(name, "gla") == 0; /* reads its gate g: tests/attention/test_cuda_gla.c */
        attn_options o = {name, AB_DEV_CUDA, 0, 0, NULL};
        attn *a = NULL;
        int rc = attn_create(&o, &a);
        cr_assert_eq(attn_variant_has_device(v, AB_DEV_CUDA), listed, "%s: has_device(cuda) disagrees", name);
        if (listed) {
            cr_assert_eq(rc, 0, "%s: %s", name, attn_error());
            attn_destroy(a);
        } else {
            cr_assert_eq(rc, ATTN_EUNSUPPORTED, "%s on cuda: rc %d (%s); list it in CUDA_VARIANTS", name, rc,
                         attn_error());
            cr_assert(strstr(attn_error(), name) != NULL, "message '%s' does not name %s", attn_error(), name);
        }
    }
}
