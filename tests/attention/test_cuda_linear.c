/* The fused chunked kernels of linear attention on CUDA (attention/linear_chunk.cuh)
 * against the CPU: every map that has them (elu, taylor, favor) in both precisions,
 * causal and not, odd and wide heads, D != M, N = 1, one chunk and many, N not a
 * multiple of the chunk, lengths of 0, N and in between, one segment per slice and many
 * (the knob lin_chunk_blocks), chunk sizes 16..64, prefill and steps after it, a reseed
 * (favor's cached projection), the workspace's growth with N, prefetch (the same bits),
 * and the batched cuBLAS path (lin_cuda_path = 1) that polynomial and too-large shapes
 * take. Built into the same two binaries as test_cuda.c, whose helpers it uses
 * (test_cuda_util.h). */
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
/* Knobs of the backend (attention/linear_cuda.h). */
extern int lin_cuda_path;
extern long long lin_chunk_blocks;
extern int lin_chunk_threads;
extern int lin_chunk_prefetch;
#endif

static const cuda_variant ELU32 = {"linear", {NULL}, 0, true};
static const cuda_variant ELU_TF = {"linear", {"precision=tf32"}, 1, true};
static const cuda_variant TAY32 = {"linear", {"feature_map=taylor"}, 1, true};
static const cuda_variant TAY_TF = {"linear", {"feature_map=taylor", "precision=tf32"}, 2, true};
static const cuda_variant FAV32 = {"linear", {"feature_map=favor"}, 1, true};
static const cuda_variant FAV_TF = {"linear", {"feature_map=favor", "precision=tf32"}, 2, true};
static const cuda_variant *const MAPS[6] = {&ELU32, &ELU_TF, &TAY32, &TAY_TF, &FAV32, &FAV_TF};
/* polynomial (attention/poly_chunk.cuh): its own kernels, the same structure */
static const cuda_variant POLY32 = {"polynomial", {"c=0.5", "scale=0.3"}, 2, true};
static const cuda_variant POLY_TF = {"polynomial", {"c=0.5", "scale=0.3", "precision=tf32"}, 3, true};
static const cuda_variant POLY_DEF = {"polynomial", {NULL}, 0, true};

Test(cuda_lchunk, polynomial_precisions_and_shapes) {
    /* As for the linear maps, at the sizes the emulator runs in seconds (C = 1 + D + D^2
     * features: D = 16 gives 273 in 17 slabs, D = 24 gives 601). */
    require_cuda();
    const int len_a[2] = {45, 0}, len_b[3] = {3, 40, 40};
    const cuda_variant *ps[3] = {&POLY32, &POLY_TF, &POLY_DEF};
    for (int i = 0; i < 3; i++)
        for (int causal = 0; causal < 2; causal++) {
            check_parallel(ps[i], 2, 3, 37, 5, 7, causal, NULL, 121, false);
            check_parallel_floor(ps[i], 2, 2, 1, 3, 5, causal, NULL, 122, false, i == 1 ? 1.0 : 0.1);
            check_parallel(ps[i], 2, 1, 45, 16, 24, causal, len_a, 124, false);
            check_parallel(ps[i], 3, 1, 40, 9, 3, causal, len_b, 125, false);
        }
    check_parallel(&POLY32, 1, 1, 64, 24, 16, true, NULL, 126, false);
    check_recurrent(&POLY_DEF, 1, 2, 70, 6, 5, 80, 50, true, 127);
    check_recurrent(&POLY_TF, 1, 2, 40, 5, 4, 40, 0, true, 128);
}

Test(cuda_lchunk, maps_precisions_and_shapes) {
    /* Odd sizes (5, 7: padded to 16 inside), N = 1, D = M = 64 over two chunks of the
     * automatic 32, D != M with N = 45 (a ragged second chunk) and lengths 45 and 0, a
     * length inside the first chunk. */
    require_cuda();
    const int len_a[2] = {45, 0}, len_b[3] = {3, 40, 40};
    for (int i = 0; i < 6; i++)
        for (int causal = 0; causal < 2; causal++) {
            check_parallel(MAPS[i], 2, 3, 37, 5, 7, causal, NULL, 101, false);
            /* N = 1: dq, dk are eps-sized differences (test_cuda.c n_equals_one): floor 0.1,
             * tf32 floor 1 (its rounding noise is 1e-3 absolute there) */
            check_parallel_floor(MAPS[i], 2, 2, 1, 3, 5, causal, NULL, 102, false, i % 2 ? 1.0 : 0.1);
            check_parallel(MAPS[i], 1, 1, 64, 64, 64, causal, NULL, 103, false);
            check_parallel(MAPS[i], 2, 1, 45, 16, 40, causal, len_a, 104, false);
            check_parallel(MAPS[i], 3, 1, 40, 9, 3, causal, len_b, 105, false);
        }
}

#ifdef TEST_CUDA_BACKEND
Test(cuda_lchunk, segments_and_chunk_sizes) {
    /* N = 150 in chunks of 16 (10 chunks; chunk=16), each length a run of H = 2 slices
     * (segments per slice: floor(blocks / 2), at most one per chunk): 1 block per call
     * (one segment per slice: the whole walk in one block), 4 (2 segments of 5 chunks),
     * 8 (4 segments of 3, 3, 3, 1) and 1000 (one chunk per segment): the segment states,
     * their scan and favor's shifts across segments; lengths 150, 70 and 33 make runs
     * of other chunk counts. Then chunks of 48 and 64 and prefill + steps after a
     * segmented prefill. */
    require_cuda();
    const long long saved = lin_chunk_blocks;
    const long long blocks[4] = {1, 4, 8, 1000};
    const int len[3] = {150, 70, 33};
    static const cuda_variant vs[4] = {{"linear", {"chunk=16"}, 1, true},
                                       {"linear", {"chunk=16", "precision=tf32"}, 2, true},
                                       {"linear", {"feature_map=favor", "chunk=16"}, 2, true},
                                       {"linear", {"feature_map=taylor", "chunk=16", "precision=tf32"}, 3, true}};
    static const cuda_variant pv[2] = {{"polynomial", {"chunk=16", "c=2"}, 2, true},
                                       {"polynomial", {"chunk=16", "precision=tf32"}, 2, true}};
    for (int b = 0; b < 4; b++) {
        lin_chunk_blocks = blocks[b];
        for (int i = 0; i < 4; i++)
            for (int causal = 0; causal < 2; causal++) check_parallel(&vs[i], 3, 2, 150, 6, 5, causal, len, 106, false);
        for (int causal = 0; causal < 2; causal++) check_parallel(&pv[b % 2], 3, 2, 150, 4, 5, causal, len, 106, false);
        check_recurrent(&vs[b], 1, 2, 100, 4, 3, 100, 90, true, 107);
        check_recurrent(&pv[b % 2], 1, 2, 100, 4, 3, 100, 90, true, 107);
    }
    lin_chunk_blocks = saved;
    static const cuda_variant cs[4] = {{"linear", {"chunk=48"}, 1, true},
                                       {"linear", {"chunk=64", "precision=tf32"}, 2, true},
                                       {"linear", {"feature_map=favor", "chunk=40"}, 2, true},
                                       {"linear", {"feature_map=taylor", "chunk=1000"}, 2, true}};
    for (int i = 0; i < 4; i++)
        for (int causal = 0; causal < 2; causal++) check_parallel(&cs[i], 1, 2, 130, 5, 4, causal, NULL, 108, false);
}

/* Forward and backward of cv on p with lin_chunk_prefetch 0 and 1: the same bits. */
static void expect_prefetch_same(const cuda_variant *cv, const tu_problem *p, const char *what) {
    grads g0, g1;
    grads_alloc(&g0, p);
    grads_alloc(&g1, p);
    lin_chunk_prefetch = 0;
    run_cuda(cv, p, &g0, false);
    lin_chunk_prefetch = 1;
    run_cuda(cv, p, &g1, false);
    lin_chunk_prefetch = 0;
    char buf[128];
    cr_assert(memcmp(g0.out, g1.out, p->nv * sizeof(float)) == 0, "%s %s: out differs with prefetch",
              label(cv, buf, sizeof buf), what);
    cr_assert(memcmp(g0.dq, g1.dq, p->nq * sizeof(float)) == 0 && memcmp(g0.dk, g1.dk, p->nq * sizeof(float)) == 0 &&
                  memcmp(g0.dv, g1.dv, p->nv * sizeof(float)) == 0,
              "%s %s: gradients differ with prefetch", label(cv, buf, sizeof buf), what);
    grads_free(&g0);
    grads_free(&g1);
}

Test(cuda_lchunk, prefetch_moves_the_same_values) {
    /* lin_chunk_prefetch = 1: elu's kernels stage the next chunk's rows in registers
     * (linear_chunk_tiles.cuh's lc_stage) while they work on a chunk. Only where the
     * values travel changes, so out, dq, dk, dv equal the plain kernels' bit for bit:
     * fp32 and tf32, causal and not, at D = M = 64 and 16 (float4 rows, two or fewer a
     * thread at chunk 32 and 256 threads: the staged path), with odd sizes (not float4
     * rows: lc_load's path), D != M, lengths 150 and 33 (a ragged last chunk, rows
     * past the length), several segments (lin_chunk_blocks = 6 over each run of 3
     * slices of one length: 2 segments of 3 and 2 chunks at length 150, 2 of 1 at 33;
     * each block fetches its segment's first chunk before the loop), 128 threads (D = 64
     * no longer fits: lc_load; D = 16 still staged), and a map built without prefetch
     * (taylor). */
    require_cuda();
    const int len[2] = {150, 33};
    const int shapes[4][2] = {{64, 64}, {16, 16}, {5, 7}, {64, 12}};
    const long long saved_blocks = lin_chunk_blocks;
    const int saved_threads = lin_chunk_threads;
    for (int sh = 0; sh < 4; sh++)
        for (int causal = 0; causal < 2; causal++) {
            tu_problem p;
            tu_problem_init(&p, 2, 3, 150, shapes[sh][0], shapes[sh][1], causal, len, 140 + sh);
            char what[64];
            snprintf(what, sizeof what, "D=%d M=%d causal=%d", shapes[sh][0], shapes[sh][1], causal);
            expect_prefetch_same(&ELU32, &p, what);
            expect_prefetch_same(&ELU_TF, &p, what);
            if (sh < 2) {
                lin_chunk_blocks = 6;
                expect_prefetch_same(&ELU32, &p, what);
                lin_chunk_blocks = saved_blocks;
                lin_chunk_threads = 128;
                expect_prefetch_same(&ELU_TF, &p, what);
                lin_chunk_threads = saved_threads;
            }
            if (sh == 0) expect_prefetch_same(&TAY32, &p, what);
            tu_problem_free(&p);
        }
    /* and against the CPU with prefetch on */
    lin_chunk_prefetch = 1;
    for (int causal = 0; causal < 2; causal++) check_parallel(&ELU32, 2, 2, 100, 16, 16, causal, NULL, 145, false);
    lin_chunk_prefetch = 0;
}

Test(cuda_lchunk, threads_per_block) {
    /* 128 and 64 threads: the tile loops and the warp-per-row steps take more turns. */
    require_cuda();
    const int saved = lin_chunk_threads;
    const int threads[2] = {128, 64};
    for (int t = 0; t < 2; t++) {
        lin_chunk_threads = threads[t];
        for (int i = 0; i < 6; i += 3) check_parallel(MAPS[i], 1, 2, 50, 12, 20, true, NULL, 109, false);
        check_parallel(&FAV_TF, 1, 2, 50, 12, 20, false, NULL, 110, false);
    }
    lin_chunk_threads = saved;
}

Test(cuda_lchunk, workspace_grows_only_by_per_position_scalars) {
    /* Nothing saved for backward; the workspace holds per-position scalars (two floats:
     * 1/(den+eps) and (dout.out)/(den+eps)) plus at most target + B*H segment states
     * (favor: and its projection), so from N = 1024 to 8192 it grows by exactly
     * 2 * B*H * 7168 floats once the segments are bounded by the target, and (the linear
     * maps) stays under a quarter of q's bytes (13% here: 72 states of 4168 floats and
     * the scalars). polynomial's states are 2640 x 65 floats (0.68 MB) at D = M = 64:
     * 72 for S and as many for R, 99 MB, bounded by the target but not small. */
    require_cuda();
    const long long saved = lin_chunk_blocks;
    lin_chunk_blocks = 64;
    const cuda_variant *vs[4] = {&ELU32, &TAY32, &FAV32, &POLY32};
    for (int i = 0; i < 4; i++)
        for (int causal = 0; causal < 2; causal++) {
            attn *a = make(vs[i], AB_DEV_CUDA);
            attn_shape s = {2, 4, 1024, 64, 64, causal, NULL};
            cr_assert_eq(attn_saved_bytes(a, &s), 0);
            const size_t w1 = attn_workspace_need(a, &s);
            s.len = 8192;
            const size_t w8 = attn_workspace_need(a, &s);
            const size_t q8 = (size_t)8 * 8192 * 64 * sizeof(float);
            char buf[128];
            cr_assert_eq(w8 - w1, (size_t)2 * 8 * 7168 * sizeof(float), "%s causal=%d: %zu bytes at N=1024, %zu at 8192",
                         label(vs[i], buf, sizeof buf), causal, w1, w8);
            if (i < 3) cr_assert_lt(w8, q8 / 4, "workspace %zu bytes against q's %zu", w8, q8);
            attn_destroy(a);
        }
    lin_chunk_blocks = saved;
}

Test(cuda_lchunk, batched_path_still_agrees) {
    /* lin_cuda_path = 1: the previous cuBLAS path (polynomial's, and the kernel lab's
     * version 1) for the linear maps too. */
    require_cuda();
    const int saved = lin_cuda_path;
    lin_cuda_path = 1;
    const int len[2] = {30, 17};
    for (int i = 0; i < 6; i++)
        for (int causal = 0; causal < 2; causal++) check_parallel(MAPS[i], 2, 2, 30, 5, 4, causal, len, 111, false);
    for (int causal = 0; causal < 2; causal++) check_parallel(&POLY32, 2, 2, 30, 5, 4, causal, len, 111, false);
    lin_cuda_path = saved;
}
#endif

Test(cuda_lchunk, favor_reseed_redraws_the_projection) {
    /* The projection is cached on the host per seed: after attn_reseed the device uses
     * the new W (outputs change, and equal the CPU's at the new seed), and going back
     * to the first seed gives the first outputs bit for bit. */
    require_cuda();
    tu_problem p;
    tu_problem_init(&p, 1, 2, 40, 8, 5, true, NULL, 112);
    attn *g = make(&FAV32, AB_DEV_CUDA), *c = make(&FAV32, AB_DEV_CPU);
    float *q = dupload(p.q, p.nq), *k = dupload(p.k, p.nq), *v = dupload(p.v, p.nv), *out = dpoison(p.nv);
    float *o1 = tu_alloc_f(p.nv), *o2 = tu_alloc_f(p.nv), *o3 = tu_alloc_f(p.nv), *want = tu_alloc_f(p.nv);
    cr_assert_eq(attn_forward(g, &p.s, q, k, v, out, NULL), 0, "%s", attn_error());
    ddownload(o1, out, p.nv);
    attn_reseed(g, 99);
    attn_reseed(c, 99);
    cr_assert_eq(attn_forward(g, &p.s, q, k, v, out, NULL), 0, "%s", attn_error());
    ddownload(o2, out, p.nv);
    cr_assert_eq(attn_forward(c, &p.s, p.q, p.k, p.v, want, NULL), 0, "%s", attn_error());
    cr_assert(memcmp(o1, o2, p.nv * sizeof(float)) != 0, "reseeding changed nothing");
    expect_close(o2, want, p.nv, FWD_TOL, "out after reseed", "favor");
    attn_reseed(g, 7);
    cr_assert_eq(attn_forward(g, &p.s, q, k, v, out, NULL), 0, "%s", attn_error());
    ddownload(o3, out, p.nv);
    cr_assert(memcmp(o1, o3, p.nv * sizeof(float)) == 0, "the first seed again gave other outputs");
    dfree(q), dfree(k), dfree(v), dfree(out);
    free(o1), free(o2), free(o3), free(want);
    attn_destroy(g);
    attn_destroy(c);
    tu_problem_free(&p);
}

Test(cuda_lchunk, tf32_rounds_and_stays_close) {
    /* precision=tf32 goes through the tensor cores: its results differ from fp32's by
     * more than float rounding (so the tf32 path ran) and by less than its tolerance. */
    require_cuda();
    for (int i = 0; i < 6; i += 2) {
        tu_problem p;
        tu_problem_init(&p, 1, 2, 70, 16, 16, true, NULL, 113);
        grads a32, atf;
        grads_alloc(&a32, &p);
        grads_alloc(&atf, &p);
        run_cuda(MAPS[i], &p, &a32, false);
        run_cuda(MAPS[i + 1], &p, &atf, false);
        double *w = tu_to_double(a32.out, p.nv);
        const double err = tu_rel_err(atf.out, w, p.nv, 1e-3);
        char buf[128];
        cr_assert(err > 1e-6 && err < TF32_TOL_FACTOR * FWD_TOL, "%s: tf32 vs fp32 out differ by %.3g",
                  label(MAPS[i + 1], buf, sizeof buf), err);
        free(w);
        grads_free(&a32);
        grads_free(&atf);
        tu_problem_free(&p);
    }
}

Test(cuda_lchunk, too_large_for_the_tiles_falls_back) {
    /* favor with 3000 features: its state (3000 x 16 floats, and R beside it in the
     * backward) does not fit a block's shared memory at any chunk, so the call takes the
     * batched path, with the same results. */
    require_cuda();
    static const cuda_variant big = {"linear", {"feature_map=favor", "features=3000"}, 2, true};
    for (int causal = 0; causal < 2; causal++) check_parallel(&big, 1, 2, 20, 4, 3, causal, NULL, 130, false);
}
