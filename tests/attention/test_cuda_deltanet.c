/* deltanet on CUDA against the CPU (built into both CUDA suites, as test_cuda.c: on the
 * emulator everywhere, on a GPU where there is one): forward, backward with dbeta, the
 * rate beta random, 0 and 1, chunk lengths 1 (the scan), 5, 7, 8, 16, 64 and auto (the
 * chunked form), chunks too large for shared memory (the scan again), lengths with 0
 * and N, N = 1, a state beyond a warp's columns and beyond shared memory (the scan's
 * workspace path), the chunk kernel's matrices in shared memory and in workspace slots,
 * and with the workspace cap lowered so that every pass goes one slice at a time;
 * outputs and gradients start as NaN on the device (every entry must be written); a
 * repeated call allocates nothing and gives the same bits; recurrent steps and prefill
 * against the CPU's forward; the refusals. Tolerances: test_cuda_util.h (FWD_TOL,
 * BWD_TOL: each side within the CPU suite's bound of the double reference,
 * test_deltanet.c's 2e-5 and 5e-5). Measured on the emulator (TC_PRINT=1, plain and
 * strict, the largest over the cases, with the chunked form and the carry kernels' rows
 * over several warps): out 4.3e-7, dq 3.8e-7, dk 3.9e-7, dv 5.5e-7, dbeta 4.8e-7. */
#include "attention.h"
#include "deltanet_cuda.h"
#include "cuda_device.h"
#include "device.h"
#include "error.h"
#include "memory.h"
#include "rng.h"
#include "test_cuda_util.h"
#include "test_util.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static attn *make_dn(ab_device dev, const char *chunk) {
    const char *set[1] = {chunk};
    attn_options o = {"deltanet", dev, 7, chunk ? 1 : 0, set};
    attn *a = NULL;
    cr_assert_eq(attn_create(&o, &a), 0, "attn_create(deltanet): %s", attn_error());
    return a;
}

/* beta: kind 0 all 0, 1 all 1, 2 uniform in [0, 1] */
static float *make_beta(size_t n, int kind, uint64_t seed) {
    float *b = tu_alloc_f(n);
    for (size_t i = 0; i < n; i++) b[i] = kind == 0 ? 0.0f : kind == 1 ? 1.0f : (float)ab_rng_uniform(seed, 9, i);
    return b;
}

static void dn_case(const char *chunk, int kind, int B, int H, int N, int D, int M, const int *lengths,
                    uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, true, lengths, seed);
    const size_t nb = (size_t)B * H * N;
    float *beta = make_beta(nb, kind, seed), *dbc = tu_alloc_f(nb), *dbg = tu_alloc_f(nb);
    attn *cpu = make_dn(AB_DEV_CPU, chunk), *gpu = make_dn(AB_DEV_CUDA, chunk);
    float *dbeta = dupload(beta, nb), *ddb = dpoison(nb);
    cr_assert_eq(attn_bind_aux(cpu, beta, dbc), 0, "%s", attn_error());
    cr_assert_eq(attn_bind_aux(gpu, dbeta, ddb), 0, "%s", attn_error());
    grads c, g;
    grads_alloc(&c, &p);
    grads_alloc(&g, &p);
    const size_t sb = attn_saved_bytes(cpu, &p.s);
    cr_assert_eq(sb, attn_saved_bytes(gpu, &p.s), "saved_bytes differ between the devices");
    void *saved = malloc(sb + 1);
    cr_assert_eq(attn_forward(cpu, &p.s, p.q, p.k, p.v, c.out, saved), 0, "%s", attn_error());
    cr_assert_eq(attn_backward(cpu, &p.s, p.q, p.k, p.v, p.dout, saved, c.dq, c.dk, c.dv), 0, "%s", attn_error());
    free(saved);
    float *q = dupload(p.q, p.nq), *k = dupload(p.k, p.nq), *v = dupload(p.v, p.nv), *dout = dupload(p.dout, p.nv);
    float *out = dpoison(p.nv), *dq = dpoison(p.nq), *dk = dpoison(p.nq), *dv = dpoison(p.nv);
    void *dsaved = NULL;
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &dsaved, sb + 1), 0, "%s", ab_error());
    for (int r = 0; r < 2; r++) {
        size_t cur = ab_mem_current(AB_DEV_CUDA);
        if (r == 1) ab_mem_reset_peak(AB_DEV_CUDA);
        cr_assert_eq(attn_forward(gpu, &p.s, q, k, v, out, dsaved), 0, "cuda forward: %s", attn_error());
        cr_assert_eq(attn_backward(gpu, &p.s, q, k, v, dout, dsaved, dq, dk, dv), 0, "cuda backward: %s",
                     attn_error());
        cr_assert_eq(ab_cuda_sync(), 0, "%s", ab_error());
        if (r == 0) {
            ddownload(g.out, out, p.nv);
            ddownload(g.dq, dq, p.nq);
            ddownload(g.dk, dk, p.nq);
            ddownload(g.dv, dv, p.nv);
            ddownload(dbg, ddb, nb);
        } else {
            cr_assert_eq(ab_mem_peak(AB_DEV_CUDA), cur, "a repeated call allocated %zu device bytes",
                         ab_mem_peak(AB_DEV_CUDA) - cur);
            float *again = tu_alloc_f(p.nq > p.nv ? p.nq : p.nv);
            ddownload(again, out, p.nv);
            cr_assert_eq(memcmp(again, g.out, sizeof(float) * p.nv), 0, "a repeated forward differs");
            ddownload(again, dk, p.nq);
            cr_assert_eq(memcmp(again, g.dk, sizeof(float) * p.nq), 0, "a repeated backward differs");
            free(again);
        }
    }
    char ctx[160];
    snprintf(ctx, sizeof ctx, "deltanet %s beta %d B=%d H=%d N=%d D=%d M=%d lengths=%s", chunk ? chunk : "auto", kind,
             B, H, N, D, M, lengths ? "yes" : "no");
    expect_close(g.out, c.out, p.nv, FWD_TOL, "out", ctx);
    expect_close(g.dq, c.dq, p.nq, BWD_TOL, "dq", ctx);
    expect_close(g.dk, c.dk, p.nq, BWD_TOL, "dk", ctx);
    expect_close(g.dv, c.dv, p.nv, BWD_TOL, "dv", ctx);
    expect_close(dbg, dbc, nb, BWD_TOL, "dbeta", ctx);
    tu_assert_padded_zero(&p.s, g.out, M, "out");
    tu_assert_padded_zero(&p.s, g.dq, D, "dq");
    tu_assert_padded_zero(&p.s, g.dk, D, "dk");
    tu_assert_padded_zero(&p.s, g.dv, M, "dv");
    tu_assert_padded_zero(&p.s, dbg, 1, "dbeta");
    dfree(q), dfree(k), dfree(v), dfree(dout), dfree(out), dfree(dq), dfree(dk), dfree(dv), dfree(dsaved);
    dfree(dbeta), dfree(ddb);
    free(beta), free(dbc), free(dbg);
    grads_free(&c);
    grads_free(&g);
    attn_destroy(cpu);
    attn_destroy(gpu);
    tu_problem_free(&p);
}

Test(cuda_deltanet, against_cpu) {
    require_cuda();
    const int len[3] = {37, 20, 0};
    dn_case(NULL, 2, 3, 2, 37, 5, 3, len, 201);        /* lengths with N, partial, 0 */
    dn_case("chunk=5", 2, 2, 2, 37, 8, 6, NULL, 202);  /* chunks not dividing N */
    dn_case("chunk=1", 2, 1, 2, 20, 4, 7, NULL, 203);  /* the scan's saved states */
    dn_case("chunk=8", 0, 3, 2, 37, 6, 6, len, 204);   /* beta 0: out = 0, only dbeta */
    dn_case("chunk=8", 1, 2, 1, 21, 6, 5, NULL, 205);  /* beta 1 */
    dn_case(NULL, 2, 1, 2, 1, 3, 2, NULL, 206);        /* N = 1 */
    dn_case("chunk=16", 2, 1, 2, 40, 33, 40, NULL, 207); /* columns and rows beyond a warp */
    dn_case("chunk=7", 2, 1, 2, 20, 96, 100, NULL, 208); /* chunked, the state beyond a warp's columns */
    dn_case("chunk=1", 2, 1, 2, 9, 96, 100, NULL, 209);  /* the scan with its state in the workspace */
    dn_case("chunk=64", 2, 1, 1, 70, 160, 8, NULL, 210); /* chunks too large for shared memory: the scan */
    dn_case("chunk=64", 2, 1, 2, 130, 64, 64, NULL, 211); /* chunks of 64 and a partial one: the workspace slots */
}

/* Swaps the backend's knobs (attention/deltanet_cuda.h: the workspace cap and the
 * carry kernels' warps) with *cap and *warps: called twice, it restores them. The
 * variables exist only in a library with the CUDA backend; without it require_cuda has
 * skipped the test before this is called. */
static void dn_swap_knobs(size_t *cap, int *warps) {
#ifdef TEST_CUDA_BACKEND
    const size_t c = dn_cuda_ws_cap;
    const int w = dn_cuda_carry_warps;
    dn_cuda_ws_cap = *cap, dn_cuda_carry_warps = *warps;
    *cap = c, *warps = w;
#else
    (void)cap, (void)warps;
#endif
}

/* With the workspace cap lowered to nothing, every pass goes one slice (and one block)
 * at a time: the groups' and the grid-stride loops' paths. */
Test(cuda_deltanet, grouped) {
    require_cuda();
    const int len[3] = {37, 20, 0};
    size_t cap = 1;
    int warps = 0;
    dn_swap_knobs(&cap, &warps);
    dn_case("chunk=8", 2, 3, 2, 37, 6, 5, len, 212);
    dn_case("chunk=1", 2, 2, 2, 11, 4, 3, NULL, 213);
    dn_case("chunk=64", 2, 1, 2, 70, 64, 64, NULL, 214); /* the chunk kernel's one slot in the workspace */
    dn_swap_knobs(&cap, &warps);
}

/* The carry kernels (state, reverse) with the warps set: 1 (every row on one warp), 3
 * (rows not dividing evenly, a partial column group) and 8 (more warps than rows at
 * D = 6: warps with no rows add zeros). */
Test(cuda_deltanet, carry_warps) {
    require_cuda();
    const int len[3] = {37, 20, 0}, counts[3] = {1, 3, 8};
    for (int i = 0; i < 3; i++) {
        size_t cap = DN_CUDA_WS_CAP_DEFAULT;
        int warps = counts[i];
        dn_swap_knobs(&cap, &warps);
        dn_case("chunk=8", 2, 3, 2, 37, 6, 5, len, 215 + i);
        dn_case("chunk=16", 2, 1, 2, 40, 33, 40, NULL, 218 + i);
        dn_swap_knobs(&cap, &warps);
    }
}

/* prefill P then steps to N - 1 on the device, against the CPU's forward (the same
 * bound as forward: STEP_TOL). */
static void dn_recurrent(int P, bool with_out, int D, int M) {
    enum { B = 2, H = 2, N = 30 };
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, true, NULL, 301);
    const size_t nb = (size_t)B * H * N;
    float *beta = make_beta(nb, 2, 301);
    attn *cpu = make_dn(AB_DEV_CPU, "chunk=8"), *gpu = make_dn(AB_DEV_CUDA, "chunk=8");
    cr_assert_eq(attn_bind_aux(cpu, beta, NULL), 0);
    float *want = tu_alloc_f(p.nv), *got = tu_alloc_f(p.nv);
    cr_assert_eq(attn_forward(cpu, &p.s, p.q, p.k, p.v, want, NULL), 0, "%s", attn_error());
    attn_state *st = NULL;
    cr_assert_eq(attn_state_create(gpu, &p.s, N, &st), 0, "%s", attn_error());
    attn_shape bs = p.s;
    if (P > 0) {
        attn_shape ps = p.s;
        ps.len = P;
        float *hq = tu_prefix(&p.s, p.q, P, D), *hk = tu_prefix(&p.s, p.k, P, D), *hv = tu_prefix(&p.s, p.v, P, M);
        float *hb = tu_prefix(&bs, beta, P, 1);
        float *pq = dupload(hq, (size_t)B * H * P * D), *pk = dupload(hk, (size_t)B * H * P * D);
        float *pv = dupload(hv, (size_t)B * H * P * M), *pb = dupload(hb, (size_t)B * H * P);
        float *po = with_out ? dpoison((size_t)B * H * P * M) : NULL;
        cr_assert_eq(attn_bind_aux(gpu, pb, NULL), 0);
        cr_assert_eq(attn_prefill(gpu, st, P, pq, pk, pv, po), 0, "%s", attn_error());
        if (with_out) {
            float *ho = tu_alloc_f((size_t)B * H * P * M), row[B * H * 128];
            ddownload(ho, po, (size_t)B * H * P * M);
            for (int t = 0; t < P; t++) {
                tu_gather(&ps, ho, row, t, M);
                tu_scatter(&p.s, row, got, t, M);
            }
            free(ho);
        }
        dfree(pq), dfree(pk), dfree(pv), dfree(pb), dfree(po);
        free(hq), free(hk), free(hv), free(hb);
    }
    float hq[B * H * 128], hk[B * H * 128], hv[B * H * 128], hb[B * H], ho[B * H * 128];
    float *q = dalloc((size_t)B * H * D), *k = dalloc((size_t)B * H * D), *v = dalloc((size_t)B * H * M);
    float *b = dalloc((size_t)B * H), *o = dalloc((size_t)B * H * M);
    cr_assert_eq(attn_bind_aux(gpu, b, NULL), 0);
    for (int t = P; t < N; t++) {
        tu_gather(&p.s, p.q, hq, t, D);
        tu_gather(&p.s, p.k, hk, t, D);
        tu_gather(&p.s, p.v, hv, t, M);
        tu_gather(&bs, beta, hb, t, 1);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, q, hq, sizeof(float) * B * H * D), 0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, k, hk, sizeof(float) * B * H * D), 0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, v, hv, sizeof(float) * B * H * M), 0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, b, hb, sizeof(float) * B * H), 0);
        cr_assert_eq(attn_step(gpu, st, t, q, k, v, o), 0, "step %d: %s", t, attn_error());
        ddownload(ho, o, (size_t)B * H * M);
        tu_scatter(&p.s, ho, got, t, M);
    }
    const int from = with_out ? 0 : P;
    double scale = 0, worst = 0;
    for (size_t i = 0; i < p.nv; i++) scale = fmax(scale, fabs(want[i]));
    for (int bh = 0; bh < B * H; bh++)
        for (int t = from; t < N; t++)
            for (int m = 0; m < M; m++) {
                size_t i = ((size_t)bh * N + t) * M + m;
                worst = fmax(worst, fabs(got[i] - want[i]) / scale);
            }
    if (tu_verbose()) fprintf(stderr, "deltanet cuda recurrent P=%d D=%d M=%d: %.3g\n", P, D, M, worst);
    cr_expect_lt(worst, STEP_TOL, "prefill %d D=%d M=%d: cuda steps vs cpu forward %g", P, D, M, worst);
    dfree(q), dfree(k), dfree(v), dfree(b), dfree(o);
    free(want), free(got), free(beta);
    attn_state_destroy(st);
    attn_destroy(cpu);
    attn_destroy(gpu);
    tu_problem_free(&p);
}

Test(cuda_deltanet, steps_and_prefill) {
    require_cuda();
    dn_recurrent(0, false, 8, 5);
    dn_recurrent(11, true, 8, 5);
    dn_recurrent(30, true, 6, 9);
    dn_recurrent(7, false, 96, 100); /* prefill's state beyond shared memory */
}

Test(cuda_deltanet, errors) {
    require_cuda();
    attn *a = make_dn(AB_DEV_CUDA, NULL);
    attn_shape s = {1, 1, 8, 4, 4, true, NULL};
    float *x = dalloc(64), *o = dalloc(64), *sv = dalloc(4096);
    cr_assert_eq(attn_forward(a, &s, x, x, x, o, sv), ATTN_EINVAL);
    cr_assert(strstr(attn_error(), "attn_bind_aux") != NULL, "%s", attn_error());
    cr_assert_eq(attn_bind_aux(a, x, NULL), 0);
    s.causal = false;
    cr_assert_eq(attn_forward(a, &s, x, x, x, o, sv), ATTN_EUNSUPPORTED);
    cr_assert(strstr(attn_error(), "causal only") != NULL, "%s", attn_error());
    dfree(x), dfree(o), dfree(sv);
    attn_destroy(a);
}
