/* The CUDA backend against the CPU, paths of single variants (the table-driven checks
 * of every variant are tests/attention/test_cuda.c, whose helpers these use): linear and
 * polynomial (several chunks, large feature sizes, wide heads, the grouped workspace,
 * state reset), local (long windows, the ring), favor (large and growing keys) and
 * retention (many chunks, long sequences).
 * Built into the same two binaries as test_cuda.c. */
#include "attention.h"
#include "cuda_device.h"
#include "device.h"
#include "error.h"
#include "memory.h"
#include "test_cuda_util.h"
#include "test_util.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TEST_CUDA_BACKEND
/* Internal knobs of the backend (attention/linear_cuda.h). */
extern size_t lin_cuda_ws_floats;
extern int lin_cuda_path;
#endif

/* ---- linear and polynomial: their own paths ---- */

static const cuda_variant LIN_ELU = {"linear", {NULL}, 0, true};
static const cuda_variant LIN_ELU_C4 = {"linear", {"chunk=4"}, 1, true};
static const cuda_variant LIN_TAYLOR = {"linear", {"feature_map=taylor", "chunk=5"}, 2, true};
static const cuda_variant POLY = {"polynomial", {NULL}, 0, true};
static const cuda_variant POLY_C4 = {"polynomial", {"c=2", "chunk=4"}, 2, true};

Test(cuda_linear, default_chunk_several_chunks) {
    /* N = 150 with the automatic chunk (64 on CUDA, 32 on the CPU): three chunks, the
     * last one ragged, lengths cutting inside the second and the third. */
    require_cuda();
    const int len[2] = {150, 70};
    for (int causal = 0; causal < 2; causal++) {
        check_parallel(&LIN_ELU, 2, 1, 150, 5, 3, causal, len, 61, false);
        check_parallel(&POLY, 1, 2, 150, 3, 2, causal, NULL, 62, false);
    }
    check_recurrent(&LIN_ELU, 1, 1, 140, 3, 2, 140, 130, true, 63);
}

Test(cuda_linear, polynomial_large_feature_dim) {
    /* D = 17 (C = 307) and D = 48 (C = 2353, more features than a block of threads and
     * than the warps' lanes many times over), with small N. */
    require_cuda();
    const int len[2] = {9, 4};
    for (int causal = 0; causal < 2; causal++) {
        check_parallel(&POLY_C4, 2, 1, 9, 17, 3, causal, len, 64, false);
        check_parallel(&POLY_C4, 1, 2, 7, 48, 5, causal, NULL, 65, false);
    }
    check_recurrent(&POLY_C4, 1, 2, 9, 17, 3, 9, 4, true, 66);
    check_recurrent(&POLY, 1, 1, 5, 48, 2, 5, 2, true, 67);
}

Test(cuda_linear, wide_heads) {
    /* D = 40 (feature rows longer than a warp: lanes loop; taylor's norm over more than
     * 32 entries) and M = 40 (the step's columns in two tiles of 32), and M = 1. */
    require_cuda();
    for (int causal = 0; causal < 2; causal++) {
        check_parallel(&LIN_ELU_C4, 1, 2, 11, 40, 40, causal, NULL, 68, false);
        check_parallel(&LIN_TAYLOR, 1, 2, 11, 40, 1, causal, NULL, 69, false);
    }
    check_recurrent(&LIN_ELU_C4, 1, 2, 9, 40, 40, 9, 3, true, 70);
    check_recurrent(&LIN_TAYLOR, 1, 1, 9, 40, 1, 12, 4, true, 71);
}

#ifdef TEST_CUDA_BACKEND
Test(cuda_linear, grouped_paths) {
    /* A workspace budget below the whole problem: slices and chunks go in groups, the
     * running state (forward, backward's first pass) and R (reverse pass) carried from
     * group to group. B = 3, H = 2, N = 30, D = 5, M = 4, runs of 6, 4 and 2 slices, 6 or
     * 8 chunks. Budget 1 gives the smallest groups (one chunk of one slice for
     * polynomial; elu and taylor fit two slices in the 64-float alignment of their tiny
     * buffers); 1000 floats one chunk of 2-3 slices; 3000 floats 2-5 chunks of all the
     * run's slices (polynomial: one chunk of 3 slices); the default budget everything at
     * once. (Checked by printing the plans while writing this test.) */
    require_cuda();
    const size_t saved = lin_cuda_ws_floats;
    const int saved_path = lin_cuda_path;
    lin_cuda_path = 1; /* the batched path (the linear maps' fused one: test_cuda_linear.c) */
    const size_t budgets[4] = {1, 1000, 3000, saved};
    const int len[3] = {30, 30, 17};
    const cuda_variant *vs[3] = {&LIN_ELU_C4, &LIN_TAYLOR, &POLY_C4};
    for (int b = 0; b < 4; b++) {
        lin_cuda_ws_floats = budgets[b];
        for (int i = 0; i < 3; i++)
            for (int causal = 0; causal < 2; causal++) {
                check_parallel(vs[i], 3, 2, 30, 5, 4, causal, NULL, 72, false);
                check_parallel(vs[i], 3, 2, 30, 5, 4, causal, len, 73, false);
            }
        check_recurrent(&LIN_ELU_C4, 2, 2, 25, 4, 3, 30, 19, true, 74);
    }
    lin_cuda_ws_floats = saved;
    lin_cuda_path = saved_path;
}

Test(cuda_linear, workspace_is_bounded) {
    /* The workspace is min(everything, budget): past the budget it no longer grows with
     * N. Its floor, one chunk of one slice, grows with N only by the two scalars per
     * position the backward keeps (1/(den+eps), (dout.out)/(den+eps)): no per-position
     * state. With the default budget (32 Mi floats) Figure 1's largest polynomial point
     * (N = 65536, D = M = 64, 4161 features) stays within 128 MiB. */
    require_cuda();
    const size_t saved = lin_cuda_ws_floats;
    const int saved_path = lin_cuda_path;
    lin_cuda_path = 1; /* the batched path's budget (the fused path: test_cuda_linear.c) */
    attn *a = make(&LIN_ELU_C4, AB_DEV_CUDA);
    attn_shape s = {2, 2, 3072, 5, 4, true, NULL};
    lin_cuda_ws_floats = 20000;
    const size_t w3 = attn_workspace_need(a, &s);
    s.len = 6144;
    const size_t w6 = attn_workspace_need(a, &s);
    cr_assert_eq(w3, 20000 * sizeof(float), "N=3072: %zu bytes", w3);
    cr_assert_eq(w6, w3, "N=6144: %zu bytes, N=3072: %zu", w6, w3);
    lin_cuda_ws_floats = 1;
    const size_t m6 = attn_workspace_need(a, &s);
    s.len = 3072;
    const size_t m3 = attn_workspace_need(a, &s);
    cr_assert_eq(m6 - m3, 2 * 3072 * sizeof(float), "one chunk of one slice: %zu bytes at N=3072, %zu at 6144", m3,
                 m6);
    s.causal = false; /* non-causal keeps no per-position scalars */
    const size_t n3 = attn_workspace_need(a, &s);
    s.len = 6144;
    cr_assert_eq(attn_workspace_need(a, &s), n3, "non-causal, one chunk of one slice: grows with N");
    attn_destroy(a);
    lin_cuda_ws_floats = saved;
    a = make(&POLY, AB_DEV_CUDA);
    attn_shape big = {1, 8, 65536, 64, 64, true, NULL};
    const size_t wb = attn_workspace_need(a, &big);
    cr_assert(wb > 0 && wb <= saved * sizeof(float), "polynomial N=65536 D=64: workspace %zu bytes", wb);
    attn_destroy(a);
    lin_cuda_path = saved_path;
}
#endif

Test(cuda_linear, reset_then_prefill_and_steps) {
    /* state_init also serves reset: after steps on other inputs, a reset state gives the
     * same prefill and steps as a fresh one (S and Z cleared). */
    require_cuda();
    const cuda_variant *vs[2] = {&LIN_TAYLOR, &POLY_C4};
    for (int i = 0; i < 2; i++) {
        const cuda_variant *cv = vs[i];
        tu_problem p;
        tu_problem_init(&p, 1, 2, 9, 5, 3, true, NULL, 75);
        grads g;
        grads_alloc(&g, &p);
        run_cuda(cv, &p, &g, false);
        attn *a = make(cv, AB_DEV_CUDA);
        attn_state *st = NULL;
        cr_assert_eq(attn_state_create(a, &p.s, 9, &st), 0, "%s", attn_error());
        const size_t bh = 2;
        float *junk = dupload(p.dout, bh * 5); /* other inputs: dout's first rows */
        float *o1 = dpoison(bh * 3);
        for (int t = 0; t < 3; t++) cr_assert_eq(attn_step(a, st, t, junk, junk, junk, o1), 0, "%s", attn_error());
        cr_assert_eq(attn_state_reset(a, st), 0, "%s", attn_error());
        const int P = 6;
        float *qp = tu_prefix(&p.s, p.q, P, 5), *kp = tu_prefix(&p.s, p.k, P, 5), *vp = tu_prefix(&p.s, p.v, P, 3);
        float *dq = dupload(qp, bh * P * 5), *dk = dupload(kp, bh * P * 5), *dv = dupload(vp, bh * P * 3);
        float *dop = dpoison(bh * P * 3);
        cr_assert_eq(attn_prefill(a, st, P, dq, dk, dv, dop), 0, "%s", attn_error());
        float *rec = tu_alloc_f(p.nv), *op = tu_alloc_f(bh * P * 3);
        ddownload(op, dop, bh * P * 3);
        for (size_t s = 0; s < bh; s++) memcpy(rec + s * 9 * 3, op + s * P * 3, sizeof(float) * P * 3);
        float *qt = tu_alloc_f(bh * 5), *kt = tu_alloc_f(bh * 5), *vt = tu_alloc_f(bh * 3), *ot = tu_alloc_f(bh * 3);
        float *dqt = dalloc(bh * 5), *dkt = dalloc(bh * 5), *dvt = dalloc(bh * 3);
        for (int t = P; t < 9; t++) {
            tu_gather(&p.s, p.q, qt, t, 5);
            tu_gather(&p.s, p.k, kt, t, 5);
            tu_gather(&p.s, p.v, vt, t, 3);
            cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dqt, qt, bh * 5 * 4), 0);
            cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dkt, kt, bh * 5 * 4), 0);
            cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dvt, vt, bh * 3 * 4), 0);
            cr_assert_eq(attn_step(a, st, t, dqt, dkt, dvt, o1), 0, "%s", attn_error());
            ddownload(ot, o1, bh * 3);
            tu_scatter(&p.s, ot, rec, t, 3);
        }
        char buf[128];
        expect_close(rec, g.out, p.nv, tol_factor(cv) * STEP_TOL, "reset + prefill + steps vs forward",
                     label(cv, buf, sizeof buf));
        free(qt), free(kt), free(vt), free(ot), free(rec), free(op), free(qp), free(kp), free(vp);
        dfree(dqt), dfree(dkt), dfree(dvt), dfree(dq), dfree(dk), dfree(dv), dfree(dop), dfree(junk), dfree(o1);
        attn_state_destroy(st);
        attn_destroy(a);
        grads_free(&g);
        tu_problem_free(&p);
    }
}

/* ---- local and favor: their own paths ---- */

Test(cuda_local, long_windows_and_the_ring) {
    /* N = 150: three key tiles of 64 per slice, lengths cutting them; windows reaching
     * one, two and all tiles back (the band's tiles and edges: attention/local_cuda.cu;
     * windows 1 and 3 and tf32 are in test_cuda_flash.c). Then the ring of 20 wrapping. */
    require_cuda();
    const int len[2] = {150, 77};
    static const cuda_variant ws[3] = {{"local", {"window=20"}, 1, true}, {"local", {"window=70"}, 1, true},
                                       {"local", {"window=1000"}, 1, true}};
    for (int w = 0; w < 3; w++)
        for (int causal = 0; causal < 2; causal++) check_parallel(&ws[w], 2, 2, 150, 5, 3, causal, len, 91, false);
    check_recurrent(&ws[0], 1, 2, 90, 4, 3, 90, 30, true, 92);
}

Test(cuda_favor, large_and_growing_keys) {
    /* Keys whose size grows along the sequence (sd 0.3 to 6 at D = 16: exponents past
     * float's exp range): the key shifts keep everything finite, and the recurrent state
     * is rescaled as later keys raise its running shift. CUDA against the CPU. */
    require_cuda();
    static const cuda_variant fv = {"linear", {"feature_map=favor"}, 1, true};
#ifdef TEST_CUDA_BACKEND
    /* both paths: the fused kernels' segment maxima, the batched path's key maxima */
    const int saved_path = lin_cuda_path;
    for (int path = 0; path < 2; path++) {
        lin_cuda_path = path;
#endif
    for (int causal = 0; causal < 2; causal++) {
        tu_problem p;
        tu_problem_init(&p, 1, 2, 40, 16, 4, causal, NULL, 93);
        for (int bh = 0; bh < 2; bh++)
            for (int t = 0; t < 40; t++)
                for (int d = 0; d < 16; d++) p.k[((size_t)bh * 40 + t) * 16 + d] *= 0.3f + 5.7f * t / 39.0f;
        check_problem(&fv, &p, false);
        tu_problem_free(&p);
    }
#ifdef TEST_CUDA_BACKEND
    }
    lin_cuda_path = saved_path;
#endif
    check_recurrent(&fv, 1, 2, 30, 6, 3, 30, 9, true, 94);
}


/* ---- retention: many chunks, long sequences ---- */

static const cuda_variant RET = {"retention", {NULL}, 0, true};
static const cuda_variant RET_NEAR1 = {"retention", {"gamma=0.9999"}, 1, true};
static const cuda_variant RET_FAR = {"retention", {"gamma=0.05", "chunk=17"}, 2, true};

Test(cuda_retention, many_chunks_and_long_sequences) {
    /* N = 1000: 16 chunks of 64 on CUDA (32 on the CPU), the last ragged, lengths cutting
     * inside a chunk; gamma near 1 (every earlier position counts), the per-head default
     * (4 heads: 4 decays), far from 1 (gamma^e underflows float within a chunk). */
    require_cuda();
    const int len[2] = {1000, 555};
    for (int causal = 0; causal < 2; causal++) {
        check_parallel(&RET_NEAR1, 2, 1, 1000, 4, 3, causal, len, 101, false);
        check_parallel(&RET, 1, 4, 1000, 4, 3, causal, NULL, 102, false);
        check_parallel(&RET_FAR, 1, 1, 1000, 3, 4, causal, NULL, 103, false);
    }
    check_recurrent(&RET_NEAR1, 1, 2, 300, 4, 3, 300, 250, false, 104);
    check_recurrent(&RET, 2, 2, 200, 16, 16, 200, 131, true, 105);
}
