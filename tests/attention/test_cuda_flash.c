/* softmax's fused kernels on CUDA (attention/flash_softmax.cu, .cuh), which softmax,
 * stateful-softmax (parallel mode, prefill) and local (the banded form) run: every
 * kernel family (fp32 tiles of 64 and 128 query rows, the row kernels of the fallback,
 * the tf32 tensor-core tiles) against the CPU backend and the float64 reference, on
 * shapes that reach the tiles' edges: N = 1, odd D and M, D = M = 64 and 128, D != M,
 * lengths 0 and N and a tile's multiple, several key and query tiles, causal and not,
 * local windows 1, 3 and >= N; the saved state and workspace O(N); forward without a
 * saved buffer; the prefill over several tiles. Built into the same two binaries as
 * test_cuda.c (helpers: test_cuda_util.h); on the emulator the shapes stay small. */
#include "attention.h"
#include "cuda_device.h"
#include "device.h"
#include "error.h"
#include "memory.h"
#include "reference.h"
#include "test_cuda_util.h"
#include "test_util.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TEST_CUDA_BACKEND
/* Which kernels run (attention/flash_softmax.h): 0 by shape, 1 the row kernels, 3 the
 * fp32 forward's tiles of 128 rows. */
extern int flash_cuda_force;
#define N_FORCES 3
static const int FORCES[N_FORCES] = {0, 3, 1};
static void force(int f) { flash_cuda_force = f; }
#else
#define N_FORCES 1
static const int FORCES[N_FORCES] = {0};
static void force(int f) { (void)f; }
#endif

static const cuda_variant SMX = {"softmax", {NULL}, 0, true};

/* ---- fp32: against the CPU (tolerances of test_cuda_util.h: both float32, other
 * summation orders) ---- */

Test(cuda_flash, tiles_masks_and_lengths) {
    /* Each shape with the kernels by shape (tiles of 64 rows on these small grids), the
     * 128-row tiles forced, and the row kernels forced. N = 150: three key tiles (the
     * last partial) and three or two query tiles; lengths cut inside a tile, at a
     * tile's end (64), and are 0 (a run with nothing to do) and N. */
    require_cuda();
    static const int len2[2] = {150, 77}, len3[3] = {0, 130, 64};
    for (int f = 0; f < N_FORCES; f++) {
        force(FORCES[f]);
        for (int causal = 0; causal < 2; causal++) {
            check_parallel(&SMX, 2, 1, 150, 5, 7, causal, len2, 101, false);   /* odd D, M: scalar loads */
            check_parallel(&SMX, 3, 2, 130, 64, 64, causal, len3, 102, false); /* float4 loads */
            check_parallel(&SMX, 1, 2, 70, 128, 128, causal, NULL, 103, false); /* two column groups */
            check_parallel(&SMX, 1, 1, 150, 64, 20, causal, NULL, 104, false);  /* D != M */
            check_parallel(&SMX, 2, 1, 150, 33, 100, causal, len2, 105, false);
            /* N = 1: dq, dk are float noise around 0 (see test_cuda.c n_equals_one) */
            check_parallel_floor(&SMX, 2, 1, 1, 7, 5, causal, NULL, 106, false, 0.1);
        }
    }
    force(0);
}

Test(cuda_flash, repeated_calls_give_the_same_bits) {
    /* Forward and backward twice on a multi-tile shape: nothing allocated the second
     * time and the same bits (no atomics: dQ is a second pass, attention/flash_softmax.cu). */
    require_cuda();
    static const int len[2] = {150, 101};
    for (int f = 0; f < N_FORCES; f++) {
        force(FORCES[f]);
        check_parallel(&SMX, 2, 2, 150, 16, 8, true, len, 107, true);
    }
    force(0);
}

Test(cuda_flash, local_windows_and_kernels) {
    /* The banded form: windows of 1 (a row sees itself), 3, 64 (a tile), 100 and 1000
     * (>= N: softmax), causal and not, N = 150 with lengths; every kernel family. */
    require_cuda();
    static const cuda_variant ws[5] = {{"local", {"window=1"}, 1, true},
                                       {"local", {"window=3"}, 1, true},
                                       {"local", {"window=64"}, 1, true},
                                       {"local", {"window=100", "scale=0.7"}, 2, true},
                                       {"local", {"window=1000"}, 1, true}};
    static const int len[2] = {150, 77};
    for (int f = 0; f < N_FORCES; f++) {
        force(FORCES[f]);
        for (int w = 0; w < 5; w++)
            for (int causal = 0; causal < 2; causal++) {
                /* window 1: a row's only key is itself, dq and dk are float noise around 0 */
                const double floor = w == 0 ? 0.1 : 1e-3;
                check_parallel_floor(&ws[w], 2, 1, 150, 7, 5, causal, len, 110 + w, false, floor);
                if (f == 0) check_parallel_floor(&ws[w], 1, 1, 150, 64, 64, causal, NULL, 115 + w, false, floor);
            }
    }
    force(0);
}

Test(cuda_flash, wide_heads_use_the_row_kernels) {
    /* D or M above 128: the generic kernels (a warp per row) for every call. */
    require_cuda();
    static const int len[2] = {70, 33};
    for (int causal = 0; causal < 2; causal++) {
        check_parallel(&SMX, 2, 1, 70, 130, 9, causal, len, 120, false);
        check_parallel(&SMX, 1, 2, 40, 7, 200, causal, NULL, 121, false);
    }
    static const cuda_variant lw = {"local", {"window=9"}, 1, true};
    check_parallel(&lw, 2, 1, 70, 130, 9, true, len, 122, false);
}

Test(cuda_flash, prefill_over_several_tiles) {
    /* stateful-softmax's prefill runs the fused forward over the cache (stride capacity):
     * a prompt of 140 (three key tiles), then steps to 150. */
    require_cuda();
    static const cuda_variant ss = {"stateful-softmax", {NULL}, 0, true};
    check_recurrent(&ss, 1, 2, 150, 8, 5, 160, 140, true, 123);
    check_recurrent(&ss, 2, 1, 70, 64, 64, 70, 65, true, 124);
}

/* ---- memory: saved state and workspace O(N), computed without running ---- */

Test(cuda_flash, saved_and_workspace_are_linear_in_n) {
    /* B*H = 2, N = 4096, D = M = 64: what backward keeps (saved) plus what it borrows
     * (workspace) is O and the log-sum-exps plus a float per row, 2 N (M + 2) floats
     * (2.2 MB), where the N x N probabilities the CPU saves are 134 MB; doubling N
     * doubles it. For every variant on the fused kernels. */
    require_cuda();
    static const cuda_variant vs[3] = {{"softmax", {NULL}, 0, true},
                                       {"stateful-softmax", {NULL}, 0, true},
                                       {"local", {"window=256"}, 1, true}};
    for (int i = 0; i < 3; i++) {
        attn *a = make(&vs[i], AB_DEV_CUDA);
        for (int causal = 0; causal < 2; causal++) {
            attn_shape s = {1, 2, 4096, 64, 64, causal, NULL};
            const size_t saved = attn_saved_bytes(a, &s), ws = attn_workspace_need(a, &s);
            const size_t n2 = (size_t)2 * 4096 * 4096 * sizeof(float);
            cr_assert_eq(saved, tc_flash_saved_bytes(&s), "%s: saved %zu", vs[i].variant, saved);
            cr_assert_eq(ws, (size_t)2 * 4096 * sizeof(float), "%s: workspace %zu", vs[i].variant, ws);
            cr_assert_leq(saved + ws, (size_t)2 * 4096 * (64 + 2) * sizeof(float) + 256);
            cr_assert_lt((saved + ws) * 50, n2, "%s: %zu bytes at N = 4096", vs[i].variant, saved + ws);
            s.len = 8192;
            const size_t saved2 = attn_saved_bytes(a, &s), ws2 = attn_workspace_need(a, &s);
            cr_assert_leq(saved2 + ws2, 2 * (saved + ws), "%s: N = 8192 needs %zu bytes, N = 4096 %zu", vs[i].variant,
                          saved2 + ws2, saved + ws);
            cr_assert_geq(saved2 + ws2 + 256, 2 * (saved + ws));
        }
        cr_assert(attn_can_forward_unsaved(a), "%s: forward without a saved buffer", vs[i].variant);
        attn_destroy(a);
    }
}

Test(cuda_flash, forward_without_saved_buffer) {
    /* forward(saved = NULL) writes the same out, bit for bit (the same kernels, without
     * the copy of O and the log-sum-exps). */
    require_cuda();
    static const int len[2] = {150, 90};
    tu_problem p;
    tu_problem_init(&p, 2, 1, 150, 16, 12, true, len, 125);
    attn *a = make(&SMX, AB_DEV_CUDA);
    float *q = dupload(p.q, p.nq), *k = dupload(p.k, p.nq), *v = dupload(p.v, p.nv);
    float *o1 = dpoison(p.nv), *o2 = dpoison(p.nv);
    void *saved = NULL;
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &saved, attn_saved_bytes(a, &p.s)), 0, "%s", ab_error());
    cr_assert_eq(attn_forward(a, &p.s, q, k, v, o1, saved), 0, "%s", attn_error());
    cr_assert_eq(attn_forward(a, &p.s, q, k, v, o2, NULL), 0, "%s", attn_error());
    float *h1 = tu_alloc_f(p.nv), *h2 = tu_alloc_f(p.nv);
    ddownload(h1, o1, p.nv);
    ddownload(h2, o2, p.nv);
    cr_assert(memcmp(h1, h2, p.nv * sizeof(float)) == 0, "forward without saved differs");
    free(h1), free(h2);
    dfree(saved), dfree(q), dfree(k), dfree(v), dfree(o1), dfree(o2);
    attn_destroy(a);
    tu_problem_free(&p);
}

/* ---- tf32: against the float64 reference ----
 *
 * With precision=tf32 the products run on the tensor cores with operands rounded to
 * TF32 (unit roundoff u = 2^-11 = 4.9e-4): q and k (each score carries about
 * 2 u sum_d |q_d k_d| scale, a few u relative to the score's scale, which becomes the
 * same relative error in its exponential), the probabilities and v (out), and dO, dS,
 * q, k in backward. Errors are relative to each tensor's largest entry (tu_rel_err).
 * Forward against ref_softmax / ref_local (double); backward against the CPU's float32
 * gradients, themselves within 5e-5 of exact (test_softmax.c), 1% of the bound here.
 * The bound: TF32_TOL = 1e-2 (20 u), the cross-check's TOL_TF32 (tests/crosscheck/
 * xcheck.py). Measured on the emulator (TC_PRINT=1 prints them): in the test below. */
#define TF32_TOL 1e-2

static double max_tf32_err[4]; /* out, dq, dk, dv: the largest seen (printed with TC_PRINT) */

/* qk_floor: dq and dk judged at the scale max(max |want|, qk_floor) (N = 1: noise). */
static void check_tf32(const char *variant, long long window, int B, int H, int N, int D, int M, bool causal,
                       const int *lengths, uint64_t seed, double qk_floor) {
    char wbuf[32];
    snprintf(wbuf, sizeof wbuf, "window=%lld", window);
    cuda_variant cpu = {variant, {window > 0 ? wbuf : NULL}, window > 0 ? 1 : 0, true};
    cuda_variant gpu = {variant, {"precision=tf32", window > 0 ? wbuf : NULL}, window > 0 ? 2 : 1, true};
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, seed);
    grads c, g;
    grads_alloc(&c, &p);
    grads_alloc(&g, &p);
    run_cpu(&cpu, &p, &c);
    run_cuda(&gpu, &p, &g, false);
    /* out against float64 */
    double *qd = tu_to_double(p.q, p.nq), *kd = tu_to_double(p.k, p.nq), *vd = tu_to_double(p.v, p.nv);
    double *od = malloc(sizeof(double) * p.nv);
    ref_shape rs = {B, H, N, D, M, causal, p.s.lengths};
    const double scale = 1.0 / sqrt((double)D);
    if (window > 0) ref_local(&rs, window, scale, qd, kd, vd, od);
    else ref_softmax(&rs, scale, qd, kd, vd, od);
    char ctx[160];
    snprintf(ctx, sizeof ctx, "%s tf32 window=%lld B=%d H=%d N=%d D=%d M=%d causal=%d lengths=%s", variant, window, B,
             H, N, D, M, causal, lengths ? "yes" : "no");
    const double e_out = tu_rel_err(g.out, od, p.nv, 1e-3);
    double *dqc = tu_to_double(c.dq, p.nq), *dkc = tu_to_double(c.dk, p.nq), *dvc = tu_to_double(c.dv, p.nv);
    const double e[4] = {e_out, tu_rel_err(g.dq, dqc, p.nq, qk_floor), tu_rel_err(g.dk, dkc, p.nq, qk_floor),
                         tu_rel_err(g.dv, dvc, p.nv, 1e-3)};
    static const char *names[4] = {"out (vs float64)", "dq", "dk", "dv"};
    for (int t = 0; t < 4; t++) {
        if (getenv("TC_PRINT")) fprintf(stderr, "ERR %.3g %s | %s\n", e[t], names[t], ctx);
        if (e[t] > max_tf32_err[t]) max_tf32_err[t] = e[t];
        cr_assert(e[t] <= TF32_TOL, "%s: %s: rel err %.3g > %.3g", ctx, names[t], e[t], TF32_TOL);
    }
    /* and far from the fp32 path's agreement: the tensor cores did run (an error of 0 or
     * 1e-7 would mean the fp32 kernels ran) */
    cr_assert(e_out > 1e-6, "%s: out within %.3g of float64: not TF32 arithmetic", ctx, e_out);
    tu_assert_padded_zero(&p.s, g.out, M, "out");
    tu_assert_padded_zero(&p.s, g.dq, D, "dq");
    tu_assert_padded_zero(&p.s, g.dk, D, "dk");
    tu_assert_padded_zero(&p.s, g.dv, M, "dv");
    free(qd), free(kd), free(vd), free(od), free(dqc), free(dkc), free(dvc);
    grads_free(&c);
    grads_free(&g);
    tu_problem_free(&p);
}

Test(cuda_flash, tf32_tensor_cores) {
    /* Measured on the emulator, both modes (strict permutes the fragments; the same
     * figures): out up to 6.5e-4 of its largest entry, dq 1.0e-3, dk 1.1e-3, dv 1.0e-3
     * (1.3-2.2 u): a margin of 9 under TF32_TOL. The fp32 kernels agree with the CPU to
     * 1.7e-6 on these shapes; a tensor-core path that did not round would too. */
    require_cuda();
    static const int len2[2] = {150, 77}, len3[3] = {0, 130, 64};
    for (int causal = 0; causal < 2; causal++) {
        check_tf32("softmax", 0, 2, 1, 150, 5, 7, causal, len2, 130, 1e-3);
        check_tf32("softmax", 0, 3, 1, 130, 64, 64, causal, len3, 131, 1e-3);
        check_tf32("softmax", 0, 1, 1, 70, 128, 100, causal, NULL, 132, 1e-3);
        check_tf32("softmax", 0, 1, 2, 100, 24, 64, causal, NULL, 133, 1e-3);
        check_tf32("local", 3, 2, 1, 150, 7, 5, causal, len2, 134, 1e-3);
        check_tf32("local", 70, 2, 1, 150, 16, 8, causal, len2, 135, 1e-3);
        /* N = 1: out = v (rounded); dq, dk are noise of the size of dO . v's rounding, so
         * at the absolute scale 1 (test_cuda.c n_equals_one's reason, with TF32's u) */
        check_tf32("softmax", 0, 2, 2, 1, 7, 5, causal, NULL, 136, 1.0);
    }
    if (getenv("TC_PRINT"))
        fprintf(stderr, "TF32 largest: out %.3g dq %.3g dk %.3g dv %.3g\n", max_tf32_err[0], max_tf32_err[1],
                max_tf32_err[2], max_tf32_err[3]);
}
