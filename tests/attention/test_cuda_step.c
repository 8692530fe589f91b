/* The recurrent step kernels of the CUDA backends (attention/kv_step_cuda.cu, the
 * key/value cache step split over the context; attention/linear_step_cuda.cu, the fused
 * linear step): their split and tiling policies, and their results against the CPU and
 * the device's causal forward at split counts and tilings the automatic rules never pick
 * on the emulator (which reports one multiprocessor). Built into the same two binaries
 * as test_cuda.c, whose helpers (test_cuda_util.h) these use; TC_PRINT=1 prints the
 * measured errors. */
#include "attention.h"
#include "cuda_device.h"
#include "device.h"
#include "error.h"
#include "memory.h"
#include "step_cuda.h"
#include "test_cuda_util.h"
#include "test_util.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The backends' step functions and knobs exist only in a build with a CUDA backend
 * (real or emulated). */
#ifdef TEST_CUDA_BACKEND

static const cuda_variant SS = {"stateful-softmax", {NULL}, 0, true};
static const cuda_variant SS_SCALED = {"stateful-softmax", {"scale=-0.7"}, 1, true};

/* ---- the split policy of the key/value step (host functions) ---- */

Test(kv_step_policy, splits_fill_the_device_and_fit_the_workspace) {
    /* For every context up to the capacity: splits of KV_SPLIT_MIN..KV_SPLIT_MAX
     * positions (or the whole context when shorter), never more splits than
     * kv_step_max_splits (the workspace's size), and enough blocks to fill the device
     * where the context allows it (4 per SM). */
    const int sms_list[] = {1, 7, 132};
    const long long slices_list[] = {1, 3, 8, 64, 528, 4096};
    for (size_t a = 0; a < sizeof sms_list / sizeof sms_list[0]; a++)
        for (size_t b = 0; b < sizeof slices_list / sizeof slices_list[0]; b++) {
            const int sms = sms_list[a];
            const long long S = slices_list[b];
            const int caps[] = {1, 63, 64, 65, 1000, 4097, 70000};
            for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
                const int cap = caps[c], most = kv_step_max_splits(S, cap, sms, 0);
                int worst = 0;
                for (int n = 1; n <= cap; n += n < 300 ? 1 : 97) {
                    const int len = kv_step_split_len(S, n, sms, 0), splits = (n + len - 1) / len;
                    cr_assert(len >= 64 && len <= 2048, "S=%lld sms=%d n=%d: split of %d", S, sms, n, len);
                    cr_assert(splits <= most, "S=%lld sms=%d cap=%d n=%d: %d splits > %d", S, sms, cap, n, splits,
                              most);
                    /* splits of ceil(n / want) positions give at least want n / (n + want)
                     * splits: 64/65 of the wanted ones once n >= 64 want */
                    const long long target = 4LL * sms, want = S >= target ? 1 : (target + S - 1) / S;
                    if (n >= 64 * want && len < 2048)
                        cr_assert(65 * S * splits >= 64 * S * want, "S=%lld sms=%d n=%d: %d splits, %lld wanted", S,
                                  sms, n, splits, want);
                    if (splits > worst) worst = splits;
                }
                if (cap < 300) cr_assert_eq(worst, most, "S=%lld sms=%d cap=%d: bound %d, reached %d", S, sms, cap,
                                            most, worst);
            }
        }
    /* the shape of the issue: B = 1, H = 8 on an H100's 132 SMs */
    cr_assert_eq(kv_step_split_len(8, 65536, 132, 0), 993);
    cr_assert_eq(kv_step_split_len(8, 1024, 132, 0), 64);
    cr_assert_eq(kv_step_split_len(8, 16384, 132, 0), 249);
    cr_assert_eq(kv_step_split_len(1024, 3072, 132, 0), 2048); /* a full device: the cap only */
    /* an override is taken as it is, up to the cap */
    cr_assert_eq(kv_step_split_len(8, 100, 132, 1), 1);
    cr_assert_eq(kv_step_split_len(8, 100, 132, 5000), 2048);
    cr_assert_eq(kv_step_max_splits(8, 100, 132, 3), 34);
}

/* ---- the key/value step at several split counts ---- */

static void kv_at(int split_len, const cuda_variant *cv, int B, int H, int N, int D, int M, int cap, int P,
                  uint64_t seed) {
    const int saved = kv_step_split_len_override;
    kv_step_split_len_override = split_len;
    check_recurrent(cv, B, H, N, D, M, cap, P, true, seed);
    kv_step_split_len_override = saved;
}

Test(kv_step, split_counts_against_cpu_and_forward) {
    /* Splits of 1 position (a split per key), 2, 3 and 7 (boundaries inside and at the
     * end of the context), 36 and 37 (one split short of the context, one exactly), 1000
     * (longer than the context: one split); odd D and M (scalar loads) and D = M = 64
     * (float4 loads); capacity above the context; a prefill of 20 then steps. */
    require_cuda();
    const int lens[] = {1, 2, 3, 7, 36, 37, 1000};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        kv_at(lens[i], &SS, 2, 3, 37, 5, 7, 40, -1, 71);
        kv_at(lens[i], &SS_SCALED, 1, 2, 37, 8, 12, 37, 20, 72);
    }
    kv_at(5, &SS, 1, 2, 40, 64, 64, 48, -1, 73);
    kv_at(16, &SS, 1, 2, 40, 64, 64, 40, 8, 74);
    kv_at(1, &SS, 1, 1, 1, 3, 2, 1, -1, 75); /* context 1 */
    kv_at(3, &SS, 1, 1, 12, 300, 300, 12, 2, 76); /* wide heads: column groups in passes */
}

Test(kv_step, automatic_splits_on_one_sm) {
    /* The emulator reports one multiprocessor: 4 blocks wanted, so one slice over 200
     * positions runs in 4 splits of 64 (the last one short): the automatic path. */
    require_cuda();
    if (attn_cuda_sm_count() == 1) cr_assert_eq(kv_step_split_len(1, 200, 1, 0), 64);
    kv_at(0, &SS, 1, 1, 200, 16, 8, 200, 100, 77);
    kv_at(0, &SS, 1, 1, 130, 64, 64, 150, -1, 78);
}

/* Steps 0..N-1 of one slice batch at a split length, the outputs (B*H*N*M) returned. */
static float *kv_outputs(int split_len, int B, int H, int N, int D, int M, uint64_t seed) {
    const int saved = kv_step_split_len_override;
    kv_step_split_len_override = split_len;
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, true, NULL, seed);
    attn *a = make(&SS, AB_DEV_CUDA);
    attn_state *st = NULL;
    cr_assert_eq(attn_state_create(a, &p.s, N, &st), 0, "%s", attn_error());
    const size_t bh = (size_t)B * H;
    float *qt = tu_alloc_f(bh * D), *kt = tu_alloc_f(bh * D), *vt = tu_alloc_f(bh * M), *ot = tu_alloc_f(bh * M);
    float *dq = dalloc(bh * D), *dk = dalloc(bh * D), *dv = dalloc(bh * M), *dout = dpoison(bh * M);
    float *rec = tu_alloc_f(p.nv);
    for (int t = 0; t < N; t++) {
        tu_gather(&p.s, p.q, qt, t, D);
        tu_gather(&p.s, p.k, kt, t, D);
        tu_gather(&p.s, p.v, vt, t, M);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dq, qt, bh * D * 4), 0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dk, kt, bh * D * 4), 0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dv, vt, bh * M * 4), 0);
        cr_assert_eq(attn_step(a, st, t, dq, dk, dv, dout), 0, "step %d: %s", t, attn_error());
        ddownload(ot, dout, bh * M);
        tu_scatter(&p.s, ot, rec, t, M);
    }
    free(qt), free(kt), free(vt), free(ot);
    dfree(dq), dfree(dk), dfree(dv), dfree(dout);
    attn_state_destroy(st);
    attn_destroy(a);
    tu_problem_free(&p);
    kv_step_split_len_override = saved;
    return rec;
}

/* Split vs one split: the same scores; the combine rescales each split's sum and p V by
 * exp(m_s - m) <= 1 and adds them in another order than one pass does: a few float
 * roundings per output, relative to the largest |out| (values of order 1, sums of at
 * most N = 33 terms): a bound of 1e-6 (~8 ulp of the output scale); measured on the
 * emulator: see TC_PRINT. */
#define KV_SPLIT_TOL 1e-6

Test(kv_step, splits_equal_one_split_to_rounding) {
    require_cuda();
    const int B = 1, H = 3, N = 33, D = 8, M = 12;
    float *one = kv_outputs(2048, B, H, N, D, M, 79);
    const int lens[] = {1, 4, 32};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        float *got = kv_outputs(lens[i], B, H, N, D, M, 79);
        const size_t n = (size_t)B * H * N * M;
        double *w = tu_to_double(one, n);
        const double err = tu_rel_err(got, w, n, 1e-3);
        if (getenv("TC_PRINT")) fprintf(stderr, "ERR %.3g kv split %d vs one split\n", err, lens[i]);
        cr_expect(err <= KV_SPLIT_TOL, "split %d vs one split: rel err %.3g > %.3g", lens[i], err, KV_SPLIT_TOL);
        /* the first split_len positions are one split in both runs: the same bits */
        for (int bh = 0; bh < B * H; bh++)
            cr_expect(memcmp(got + (size_t)bh * N * M, one + (size_t)bh * N * M,
                             sizeof(float) * (size_t)(lens[i] < N ? lens[i] : N) * M) == 0,
                      "split %d: positions inside the first split differ", lens[i]);
        free(w);
        free(got);
    }
    free(one);
}

/* ---- the fused linear step ---- */

static const cuda_variant LIN = {"linear", {NULL}, 0, true};
static const cuda_variant LIN_TAYLOR = {"linear", {"feature_map=taylor", "eps=0.01"}, 2, true};
static const cuda_variant POLY = {"polynomial", {"c=0.5", "scale=0.3"}, 2, true};
static const cuda_variant FAVOR = {"linear", {"feature_map=favor", "features=5"}, 2, true};
/* C D = 600 x 32 > LS_FAVOR_FUSED_MAX: the features kernel, then the step kernel */
static const cuda_variant FAVOR_BIG = {"linear", {"feature_map=favor", "features=600"}, 2, true};

Test(linear_step_policy, tiles_and_row_splits) {
    int p[4];
    /* elu, D = M = 64, B*H = 8 on 132 SMs: one tile of 65 columns (3 lanes of 256
     * threads), row splits of >= 12 rows (4 per lane): 6 of 11 rows */
    lin_step_plan(8, 64, 64, 132, p);
    cr_expect(p[0] == 1 && p[1] == 65 && p[2] == 6 && p[3] == 11, "elu: %d x %d, %d x %d", p[0], p[1], p[2], p[3]);
    /* polynomial D = 64 (C = 4161): 66 splits (8 x 66 = 528 blocks = 4 per SM) */
    lin_step_plan(8, 4161, 64, 132, p);
    cr_expect(p[0] == 1 && p[2] == 66 && p[3] == 64, "poly: %d x %d, %d x %d", p[0], p[1], p[2], p[3]);
    /* MNIST's sampling at batch 256: S = 2048 slices fill the device: one block each */
    lin_step_plan(2048, 32, 32, 132, p);
    cr_expect(p[0] == 1 && p[1] == 33 && p[2] == 1 && p[3] == 32, "mnist: %d x %d, %d x %d", p[0], p[1], p[2], p[3]);
    /* M = 300: two tiles of 151 columns */
    lin_step_plan(1, 300, 300, 1, p);
    cr_expect(p[0] == 2 && p[1] == 151, "wide: %d x %d", p[0], p[1]);
    /* every tiling covers the columns and rows exactly once */
    for (int M = 1; M < 600; M += 37)
        for (long long C = 1; C < 5000; C = C * 3 + 1) {
            lin_step_plan(3, C, M, 132, p);
            cr_assert(p[0] * p[1] >= M + 1 && (p[0] - 1) * p[1] < M + 1 && p[1] <= 256, "M=%d: %d x %d", M, p[0], p[1]);
            cr_assert((long long)p[2] * p[3] >= C && (long long)(p[2] - 1) * p[3] < C, "C=%lld: %d x %d", C, p[2],
                      p[3]);
        }
}

static void lin_at(int rows, int cols, const cuda_variant *cv, int B, int H, int N, int D, int M, int cap, int P,
                   uint64_t seed) {
    const int r0 = lin_step_rows_override, c0 = lin_step_cols_override;
    lin_step_rows_override = rows;
    lin_step_cols_override = cols;
    check_recurrent(cv, B, H, N, D, M, cap, P, true, seed);
    lin_step_rows_override = r0;
    lin_step_cols_override = c0;
}

Test(linear_step, row_splits_and_tiles_against_cpu_and_forward) {
    /* Row splits of 1, 2 and 3 rows (a block per feature row, boundaries inside C),
     * whole C in one split (1000); column tiles of 1, 4 and 7 columns (the denominator
     * column alone in the last tile, or with others); every map; odd D and M, D = M = 64,
     * capacity above the context, a prefill then steps. */
    require_cuda();
    const cuda_variant *maps[] = {&LIN, &LIN_TAYLOR, &POLY, &FAVOR};
    const int rows[] = {1, 2, 3, 1000, 0};
    const int cols[] = {1, 4, 7, 0};
    for (size_t m = 0; m < sizeof maps / sizeof maps[0]; m++) {
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
            lin_at(rows[r], 0, maps[m], 2, 3, 17, 5, 7, 20, -1, 81);
        for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
            lin_at(2, cols[c], maps[m], 1, 2, 12, 4, 3, 12, 5, 82);
    }
    lin_at(5, 0, &LIN, 1, 2, 20, 64, 64, 24, -1, 83);
    lin_at(0, 0, &LIN, 1, 2, 20, 64, 64, 20, 7, 84);
    lin_at(100, 16, &POLY, 1, 1, 6, 12, 64, 6, 2, 85); /* C = 157: 2 row splits, 5 tiles */
    lin_at(0, 0, &FAVOR_BIG, 1, 2, 9, 32, 5, 9, 3, 86);
    lin_at(7, 3, &FAVOR_BIG, 1, 1, 9, 32, 5, 9, -1, 87);
    lin_at(0, 0, &LIN, 1, 1, 1, 3, 2, 1, -1, 88); /* context 1 */
}

/* Steps 0..N-1 of `cv` at a tiling, the outputs (B*H*N*M) returned. */
static float *lin_outputs(const cuda_variant *cv, int rows, int cols, int B, int H, int N, int D, int M,
                          uint64_t seed) {
    const int r0 = lin_step_rows_override, c0 = lin_step_cols_override;
    lin_step_rows_override = rows;
    lin_step_cols_override = cols;
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, true, NULL, seed);
    attn *a = make(cv, AB_DEV_CUDA);
    attn_state *st = NULL;
    cr_assert_eq(attn_state_create(a, &p.s, N, &st), 0, "%s", attn_error());
    const size_t bh = (size_t)B * H;
    float *qt = tu_alloc_f(bh * D), *kt = tu_alloc_f(bh * D), *vt = tu_alloc_f(bh * M), *ot = tu_alloc_f(bh * M);
    float *dq = dalloc(bh * D), *dk = dalloc(bh * D), *dv = dalloc(bh * M), *dout = dpoison(bh * M);
    float *rec = tu_alloc_f(p.nv);
    for (int t = 0; t < N; t++) {
        tu_gather(&p.s, p.q, qt, t, D);
        tu_gather(&p.s, p.k, kt, t, D);
        tu_gather(&p.s, p.v, vt, t, M);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dq, qt, bh * D * 4), 0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dk, kt, bh * D * 4), 0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dv, vt, bh * M * 4), 0);
        cr_assert_eq(attn_step(a, st, t, dq, dk, dv, dout), 0, "step %d: %s", t, attn_error());
        ddownload(ot, dout, bh * M);
        tu_scatter(&p.s, ot, rec, t, M);
    }
    free(qt), free(kt), free(vt), free(ot);
    dfree(dq), dfree(dk), dfree(dv), dfree(dout);
    attn_state_destroy(st);
    attn_destroy(a);
    tu_problem_free(&p);
    lin_step_rows_override = r0;
    lin_step_cols_override = c0;
    return rec;
}

/* Row splits vs one block per slice: the same float updates of S (so the same state),
 * the double sums over the rows added in another grouping, rounded to float once: the
 * outputs agree to about one float rounding of the numerator and one of the
 * denominator, ~2 ulp of each output; 1e-6 relative to the largest |out| bounds that
 * with room (outputs are averages of values, so the largest is of the order of the
 * rest). Measured on the emulator: see TC_PRINT. Tiles: the same sums: the same bits. */
#define LIN_SPLIT_TOL 1e-6

Test(linear_step, splits_equal_one_block_to_rounding) {
    require_cuda();
    const cuda_variant *maps[] = {&LIN, &LIN_TAYLOR, &POLY, &FAVOR};
    const int B = 1, H = 2, N = 15, D = 6, M = 5;
    const size_t n = (size_t)B * H * N * M;
    for (size_t m = 0; m < sizeof maps / sizeof maps[0]; m++) {
        float *one = lin_outputs(maps[m], 100000, 0, B, H, N, D, M, 89);
        float *split = lin_outputs(maps[m], 2, 0, B, H, N, D, M, 89);
        float *tiled = lin_outputs(maps[m], 100000, 2, B, H, N, D, M, 89);
        double *w = tu_to_double(one, n);
        const double err = tu_rel_err(split, w, n, 1e-3);
        char buf[128];
        if (getenv("TC_PRINT")) fprintf(stderr, "ERR %.3g linear split vs one block %s\n", err, label(maps[m], buf, sizeof buf));
        cr_expect(err <= LIN_SPLIT_TOL, "%s: row splits vs one block: %.3g", label(maps[m], buf, sizeof buf), err);
        cr_expect(memcmp(tiled, one, sizeof(float) * n) == 0, "%s: tiles changed the results",
                  label(maps[m], buf, sizeof buf));
        free(w), free(one), free(split), free(tiled);
    }
}

#endif
