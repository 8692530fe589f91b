/* gla on CUDA against the CPU (built into both CUDA suites, as test_cuda.c: on the
 * emulator everywhere, on a GPU where there is one): forward, backward and the gate's
 * gradient dg (overwriting a buffer that starts as NaN), vector and scalar gates, causal
 * and not, lengths with 0 and N, N = 1, D and M above a warp and above the register
 * kernels' 64, rows over several staged steps, gates down to -20; outputs
 * and gradients start as NaN on the device (every entry must be written); a repeated
 * call allocates nothing and gives the same bits; prefill and steps against the CPU's
 * causal forward. Tolerances: test_cuda_util.h (FWD_TOL, BWD_TOL: both sides within the
 * CPU suite's bound of the double reference, test_gla.c); dg within BWD_TOL as well
 * (test_gla.c's DG_TOL on each side). Both forms of the CUDA passes: the chunked one
 * (chunk auto, 2, 5, 6, 8, 64; the workspace cap lowered to take its groups) and the
 * recurrence (chunk 1: its register and global-state kernels); different summation
 * orders of the same terms as the CPU's chunked form. Measured on the emulator
 * (TC_PRINT=1, plain and strict, the largest over all cases): out 3.2e-7, dq 3.0e-7,
 * dk 3.2e-7, dv 3.5e-7, dg 6.1e-7 (5.3e-7 before the carry's rows split over warps:
 * another order of the same sums). (The chunked form's log-decay sums in float gave up
 * to 8e-6 at gates down to -20, from the cancellation in Gam_i - Gam_j: they are in
 * double.) */
#include "attention.h"
#include "gla_cuda.h"
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

/* chunk: "chunk=T" or NULL (auto, 32) */
static attn *make_gla(ab_device dev, const char *gate, const char *chunk) {
    char gset[32];
    snprintf(gset, sizeof gset, "gate=%s", gate);
    const char *set[2] = {gset, chunk};
    attn_options o = {"gla", dev, 7, chunk ? 2 : 1, set};
    attn *a = NULL;
    cr_assert_eq(attn_create(&o, &a), 0, "attn_create(gla): %s", attn_error());
    return a;
}

/* n log-gates -gmax u^2, u = min(|normal| / 2.5, 1) (as test_gla.c). */
static float *gates(size_t n, uint64_t seed, double gmax) {
    float *g = tu_normal(n, seed, 9, 1.0);
    for (size_t i = 0; i < n; i++) {
        double u = fabs(g[i]) / 2.5;
        u = u > 1 ? 1 : u;
        g[i] = (float)(-gmax * u * u);
    }
    return g;
}

static void gla_case_chunk(const char *chunk, const char *gate, int B, int H, int N, int D, int M, bool causal,
                           const int *lengths, double gmax, uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, seed);
    attn *cpu = make_gla(AB_DEV_CPU, gate, chunk), *gpu = make_gla(AB_DEV_CUDA, gate, chunk);
    const int W = attn_aux_width(cpu, D);
    const size_t ng = (size_t)B * H * N * W;
    float *g = gates(ng, seed, gmax), *dgc = tu_alloc_f(ng), *dgg = tu_alloc_f(ng);
    cr_assert_eq(attn_bind_aux(cpu, g, dgc), 0, "%s", attn_error());
    grads c, r;
    grads_alloc(&c, &p);
    grads_alloc(&r, &p);
    cr_assert_eq(attn_forward(cpu, &p.s, p.q, p.k, p.v, c.out, NULL), 0, "%s", attn_error());
    cr_assert_eq(attn_backward(cpu, &p.s, p.q, p.k, p.v, p.dout, NULL, c.dq, c.dk, c.dv), 0, "%s", attn_error());
    float *q = dupload(p.q, p.nq), *k = dupload(p.k, p.nq), *v = dupload(p.v, p.nv), *dout = dupload(p.dout, p.nv);
    float *dg_in = dupload(g, ng), *ddg = dpoison(ng);
    float *out = dpoison(p.nv), *dq = dpoison(p.nq), *dk = dpoison(p.nq), *dv = dpoison(p.nv);
    cr_assert_eq(attn_bind_aux(gpu, dg_in, ddg), 0, "%s", attn_error());
    for (int rep = 0; rep < 2; rep++) {
        size_t cur = ab_mem_current(AB_DEV_CUDA);
        if (rep == 1) ab_mem_reset_peak(AB_DEV_CUDA);
        cr_assert_eq(attn_forward(gpu, &p.s, q, k, v, out, NULL), 0, "cuda forward: %s", attn_error());
        cr_assert_eq(attn_backward(gpu, &p.s, q, k, v, dout, NULL, dq, dk, dv), 0, "cuda backward: %s", attn_error());
        cr_assert_eq(ab_cuda_sync(), 0, "%s", ab_error());
        if (rep == 0) {
            ddownload(r.out, out, p.nv);
            ddownload(r.dq, dq, p.nq);
            ddownload(r.dk, dk, p.nq);
            ddownload(r.dv, dv, p.nv);
            ddownload(dgg, ddg, ng);
        } else {
            cr_assert_eq(ab_mem_peak(AB_DEV_CUDA), cur, "a repeated call allocated %zu device bytes",
                         ab_mem_peak(AB_DEV_CUDA) - cur);
            float *again = tu_alloc_f(ng);
            ddownload(again, ddg, ng);
            cr_assert_eq(memcmp(again, dgg, sizeof(float) * ng), 0, "a repeated backward's dg differs");
            free(again);
        }
    }
    char ctx[160];
    snprintf(ctx, sizeof ctx, "gla %s gate=%s B=%d H=%d N=%d D=%d M=%d causal=%d lengths=%s gmax=%g",
             chunk ? chunk : "chunk=auto", gate, B, H, N, D, M, causal, lengths ? "yes" : "no", gmax);
    expect_close(r.out, c.out, p.nv, FWD_TOL, "out", ctx);
    expect_close(r.dq, c.dq, p.nq, BWD_TOL, "dq", ctx);
    expect_close(r.dk, c.dk, p.nq, BWD_TOL, "dk", ctx);
    expect_close(r.dv, c.dv, p.nv, BWD_TOL, "dv", ctx);
    expect_close(dgg, dgc, ng, BWD_TOL, "dg", ctx);
    tu_assert_padded_zero(&p.s, r.out, M, "out");
    tu_assert_padded_zero(&p.s, r.dq, D, "dq");
    tu_assert_padded_zero(&p.s, r.dk, D, "dk");
    tu_assert_padded_zero(&p.s, r.dv, M, "dv");
    tu_assert_padded_zero(&p.s, dgg, W, "dg");
    dfree(q), dfree(k), dfree(v), dfree(dout), dfree(out), dfree(dq), dfree(dk), dfree(dv), dfree(dg_in), dfree(ddg);
    free(g), free(dgc), free(dgg);
    grads_free(&c);
    grads_free(&r);
    attn_destroy(cpu);
    attn_destroy(gpu);
    tu_problem_free(&p);
}

static void gla_case(const char *gate, int B, int H, int N, int D, int M, bool causal, const int *lengths,
                     double gmax, uint64_t seed) {
    gla_case_chunk(NULL, gate, B, H, N, D, M, causal, lengths, gmax, seed);
}

Test(cuda_gla, against_cpu) {
    require_cuda();
    const int len[3] = {37, 20, 0};
    gla_case("vector", 2, 3, 37, 5, 3, true, NULL, 0.5, 201);
    gla_case("scalar", 2, 3, 37, 5, 3, true, NULL, 0.5, 202);
    gla_case("vector", 3, 2, 37, 8, 8, true, len, 1.0, 203);   /* lengths N, partial, 0 */
    gla_case("scalar", 3, 2, 37, 8, 8, false, len, 1.0, 204);  /* non-causal with lengths */
    gla_case("vector", 2, 2, 33, 6, 4, false, NULL, 0.5, 205);
    gla_case("vector", 1, 2, 1, 3, 2, true, NULL, 0.5, 206);   /* N = 1 */
    gla_case("vector", 1, 2, 1, 3, 2, false, NULL, 0.5, 207);
    gla_case("vector", 1, 2, 50, 40, 33, true, NULL, 0.2, 208); /* rows and columns past a warp */
    gla_case("vector", 1, 2, 60, 16, 8, true, NULL, 20.0, 209); /* strong gates */
    gla_case("scalar", 1, 2, 60, 16, 8, false, NULL, 20.0, 210);
    /* a state line past the register kernels' 64 (gla_cuda.cu): D = 70 runs the column
     * passes on the global-state kernel, M = 70 the row passes; 75 rows, three stages */
    gla_case("vector", 1, 1, 75, 70, 9, false, NULL, 0.5, 211);
    gla_case("scalar", 1, 1, 75, 9, 70, true, NULL, 0.5, 212);
}

/* The chunked passes (chunk >= 2) at other chunk lengths, and the recurrent kernels
 * (chunk = 1) on the shapes above that reach each of them. */
Test(cuda_gla, chunks) {
    require_cuda();
    const int len[3] = {37, 20, 0};
    gla_case_chunk("chunk=5", "vector", 3, 2, 37, 8, 8, true, len, 1.0, 221);  /* eight chunks, partial ones */
    gla_case_chunk("chunk=5", "scalar", 3, 2, 37, 8, 8, false, len, 1.0, 222); /* non-causal */
    gla_case_chunk("chunk=2", "vector", 1, 2, 9, 4, 3, true, NULL, 0.5, 223);
    gla_case_chunk("chunk=64", "vector", 1, 2, 80, 16, 16, true, NULL, 20.0, 224); /* strong gates, 64 rows */
    gla_case_chunk("chunk=8", "vector", 1, 2, 60, 70, 9, true, NULL, 0.5, 225); /* D past the register kernels */
    gla_case_chunk("chunk=1", "vector", 3, 2, 37, 8, 8, true, len, 1.0, 226);  /* the register kernels */
    gla_case_chunk("chunk=1", "scalar", 3, 2, 37, 8, 8, false, len, 1.0, 227);
    gla_case_chunk("chunk=1", "vector", 1, 2, 50, 40, 33, true, NULL, 0.2, 228);
    gla_case_chunk("chunk=1", "scalar", 1, 1, 75, 9, 70, true, NULL, 0.5, 229); /* the global-state kernels */
    gla_case_chunk("chunk=1", "vector", 1, 1, 75, 70, 9, false, NULL, 0.5, 230);
}

/* Swaps the backend's knobs (attention/gla_cuda.h: the workspace cap and the carry
 * kernel's warps) with *cap and *warps: called twice, it restores them. The variables
 * exist only in a library with the CUDA backend; without it require_cuda has skipped
 * the test before this is called. */
static void gla_swap_knobs(size_t *cap, int *warps) {
#ifdef TEST_CUDA_BACKEND
    const size_t c = gla_cuda_ws_cap;
    const int w = gla_cuda_carry_warps;
    gla_cuda_ws_cap = *cap, gla_cuda_carry_warps = *warps;
    *cap = c, *warps = w;
#else
    (void)cap, (void)warps;
#endif
}

/* With the workspace cap lowered to nothing the chunked passes go one slice at a time. */
Test(cuda_gla, grouped) {
    require_cuda();
    const int len[3] = {37, 20, 0};
    size_t cap = 1;
    int warps = 0;
    gla_swap_knobs(&cap, &warps);
    gla_case_chunk("chunk=6", "vector", 3, 2, 37, 5, 4, true, len, 1.0, 231);
    gla_case_chunk("chunk=6", "scalar", 3, 2, 37, 5, 4, false, len, 1.0, 232);
    gla_swap_knobs(&cap, &warps);
}

/* The carry kernel with the warps set: 1 (every row on one warp), 3 (rows not dividing
 * evenly, a partial column group) and 8 (more warps than rows at D = 5). */
Test(cuda_gla, carry_warps) {
    require_cuda();
    const int len[3] = {37, 20, 0}, counts[3] = {1, 3, 8};
    for (int i = 0; i < 3; i++) {
        size_t cap = GLA_CUDA_WS_CAP_DEFAULT;
        int warps = counts[i];
        gla_swap_knobs(&cap, &warps);
        gla_case_chunk("chunk=6", "vector", 3, 2, 37, 5, 4, true, len, 1.0, 233 + i);
        gla_case_chunk("chunk=8", "scalar", 1, 2, 40, 33, 40, false, NULL, 0.5, 236 + i);
        gla_swap_knobs(&cap, &warps);
    }
}

/* Prefill of P (with its output) and steps to N-1 on CUDA against the CPU's causal
 * forward: STEP_TOL (the forward's bound: the same terms in another order). */
static void recurrent_case(const char *chunk, const char *gate, int P) {
    const int B = 2, H = 2, N = 19, D = 6, M = 5;
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, true, NULL, 300 + P);
    attn *cpu = make_gla(AB_DEV_CPU, gate, chunk), *gpu = make_gla(AB_DEV_CUDA, gate, chunk);
    const int W = attn_aux_width(cpu, D);
    float *g = gates((size_t)B * H * N * W, 300 + P, 2.0), *want = tu_alloc_f(p.nv), *got = tu_alloc_f(p.nv);
    cr_assert_eq(attn_bind_aux(cpu, g, NULL), 0);
    cr_assert_eq(attn_forward(cpu, &p.s, p.q, p.k, p.v, want, NULL), 0, "%s", attn_error());
    attn_state *st = NULL;
    cr_assert_eq(attn_state_create(gpu, &p.s, N, &st), 0, "%s", attn_error());
    if (P > 0) {
        attn_shape ps = p.s;
        ps.len = P;
        float *hq = tu_prefix(&p.s, p.q, P, D), *hk = tu_prefix(&p.s, p.k, P, D), *hv = tu_prefix(&p.s, p.v, P, M);
        float *hg = tu_prefix(&p.s, g, P, W), *ho = tu_alloc_f((size_t)B * H * P * M);
        float *pq = dupload(hq, (size_t)B * H * P * D), *pk = dupload(hk, (size_t)B * H * P * D);
        float *pv = dupload(hv, (size_t)B * H * P * M), *pg = dupload(hg, (size_t)B * H * P * W);
        float *po = dpoison((size_t)B * H * P * M);
        cr_assert_eq(attn_bind_aux(gpu, pg, NULL), 0);
        cr_assert_eq(attn_prefill(gpu, st, P, pq, pk, pv, po), 0, "%s", attn_error());
        cr_assert_eq(ab_cuda_sync(), 0, "%s", ab_error());
        ddownload(ho, po, (size_t)B * H * P * M);
        float row[64];
        for (int t = 0; t < P; t++) {
            tu_gather(&ps, ho, row, t, M);
            tu_scatter(&p.s, row, got, t, M);
        }
        dfree(pq), dfree(pk), dfree(pv), dfree(pg), dfree(po);
        free(hq), free(hk), free(hv), free(hg), free(ho);
    }
    float hq[64], hk[64], hv[64], hg[64], ho[64];
    float *sq = dalloc(64), *sk = dalloc(64), *sv = dalloc(64), *sg = dalloc(64), *so = dalloc(64);
    cr_assert_eq(attn_bind_aux(gpu, sg, NULL), 0);
    for (int t = P; t < N; t++) {
        tu_gather(&p.s, p.q, hq, t, D);
        tu_gather(&p.s, p.k, hk, t, D);
        tu_gather(&p.s, p.v, hv, t, M);
        tu_gather(&p.s, g, hg, t, W);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, sq, hq, sizeof(float) * B * H * D), 0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, sk, hk, sizeof(float) * B * H * D), 0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, sv, hv, sizeof(float) * B * H * M), 0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, sg, hg, sizeof(float) * B * H * W), 0);
        cr_assert_eq(attn_step(gpu, st, t, sq, sk, sv, so), 0, "%s", attn_error());
        cr_assert_eq(ab_cuda_sync(), 0, "%s", ab_error());
        ddownload(ho, so, (size_t)B * H * M);
        tu_scatter(&p.s, ho, got, t, M);
    }
    char ctx[80];
    snprintf(ctx, sizeof ctx, "gla %s gate=%s prefill %d + steps", chunk ? chunk : "chunk=auto", gate, P);
    expect_close(got, want, p.nv, STEP_TOL, "out", ctx);
    dfree(sq), dfree(sk), dfree(sv), dfree(sg), dfree(so);
    free(g), free(want), free(got);
    attn_state_destroy(st);
    attn_destroy(cpu);
    attn_destroy(gpu);
    tu_problem_free(&p);
}

Test(cuda_gla, prefill_and_steps) {
    require_cuda();
    recurrent_case(NULL, "vector", 0);
    recurrent_case(NULL, "scalar", 0);
    recurrent_case(NULL, "vector", 7);
    recurrent_case(NULL, "scalar", 19);
    recurrent_case("chunk=4", "vector", 17); /* the chunked prefill over five chunks */
    recurrent_case("chunk=1", "scalar", 11); /* the recurrent prefill */
}
