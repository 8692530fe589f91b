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
    attn *a = make(&SS, ATTN_DEVICE_CUDA);
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

#endif
