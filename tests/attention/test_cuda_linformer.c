/* linformer on CUDA against the CPU (built into both CUDA suites, as test_cuda.c: on
 * the emulator everywhere, on a GPU where there is one): forward, backward and the
 * gradient of the variant's own parameters (E, F added into a bound buffer that starts
 * at 0.25 on both devices), every sharing, lengths with 0 and N, a sequence shorter
 * than the parameters' max_len, k above and below N, N = 1; outputs and gradients
 * start as NaN on the device (every entry must be written); a repeated call allocates
 * nothing and gives the same bits. Tolerances: test_cuda_util.h (FWD_TOL, BWD_TOL:
 * both sides within the CPU suite's bound of the double reference); the parameter
 * gradient sums over every slice on top, within BWD_TOL as well (measured below). */
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

static attn *make_lfm(ab_device dev, const char *const *set, int n_set) {
    attn_options o = {"linformer", dev, 7, n_set, set};
    attn *a = NULL;
    cr_assert_eq(attn_create(&o, &a), 0, "attn_create(linformer): %s", attn_error());
    return a;
}

static void lfm_case(const char *k, const char *share, int max_len, int B, int H, int N, int D, int M,
                     const int *lengths, uint64_t seed) {
    const char *set[2] = {k, share};
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, false, lengths, seed);
    attn *cpu = make_lfm(AB_DEV_CPU, set, 2), *gpu = make_lfm(AB_DEV_CUDA, set, 2);
    size_t np;
    cr_assert_eq(attn_param_count(cpu, max_len, &np), 0, "%s", attn_error());
    float *par = tu_alloc_f(np), *gc = tu_alloc_f(np), *gg = tu_alloc_f(np);
    cr_assert_eq(attn_param_init(cpu, max_len, seed, 0, par), 0);
    for (size_t i = 0; i < np; i++) gc[i] = gg[i] = 0.25f;
    float *dpar = dupload(par, np), *dgrad = dupload(gg, np);
    cr_assert_eq(attn_bind_params(cpu, max_len, par, gc), 0, "%s", attn_error());
    cr_assert_eq(attn_bind_params(gpu, max_len, dpar, dgrad), 0, "%s", attn_error());
    /* the CPU */
    grads c, g;
    grads_alloc(&c, &p);
    grads_alloc(&g, &p);
    const size_t sb = attn_saved_bytes(cpu, &p.s);
    cr_assert_eq(sb, attn_saved_bytes(gpu, &p.s), "saved_bytes differ between the devices");
    void *saved = malloc(sb);
    cr_assert_eq(attn_forward(cpu, &p.s, p.q, p.k, p.v, c.out, saved), 0, "%s", attn_error());
    cr_assert_eq(attn_backward(cpu, &p.s, p.q, p.k, p.v, p.dout, saved, c.dq, c.dk, c.dv), 0, "%s", attn_error());
    free(saved);
    /* the device, twice: the second call allocates nothing; the gradient is added twice */
    float *q = dupload(p.q, p.nq), *kk = dupload(p.k, p.nq), *v = dupload(p.v, p.nv), *dout = dupload(p.dout, p.nv);
    float *out = dpoison(p.nv), *dq = dpoison(p.nq), *dk = dpoison(p.nq), *dv = dpoison(p.nv);
    void *dsaved = NULL;
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &dsaved, sb), 0, "%s", ab_error());
    float *first = tu_alloc_f(np);
    for (int r = 0; r < 2; r++) {
        size_t cur = ab_mem_current(AB_DEV_CUDA);
        if (r == 1) ab_mem_reset_peak(AB_DEV_CUDA);
        cr_assert_eq(attn_forward(gpu, &p.s, q, kk, v, out, dsaved), 0, "cuda forward: %s", attn_error());
        cr_assert_eq(attn_backward(gpu, &p.s, q, kk, v, dout, dsaved, dq, dk, dv), 0, "cuda backward: %s",
                     attn_error());
        cr_assert_eq(ab_cuda_sync(), 0, "%s", ab_error());
        if (r == 0) {
            ddownload(g.out, out, p.nv);
            ddownload(g.dq, dq, p.nq);
            ddownload(g.dk, dk, p.nq);
            ddownload(g.dv, dv, p.nv);
            ddownload(first, dgrad, np);
        } else {
            cr_assert_eq(ab_mem_peak(AB_DEV_CUDA), cur, "a repeated call allocated %zu device bytes",
                         ab_mem_peak(AB_DEV_CUDA) - cur);
            float *again = tu_alloc_f(p.nv), *twice = tu_alloc_f(np);
            ddownload(again, out, p.nv);
            cr_assert_eq(memcmp(again, g.out, sizeof(float) * p.nv), 0, "a repeated forward differs");
            ddownload(twice, dgrad, np);
            /* the second backward adds the same d again: (0.25 + d) + d in float against
             * first + (first - 0.25), each a few roundings (6e-8 relative) of values of
             * size |want| + 0.25: 4e-7 (|want| + 1) is a bound with room; a second call
             * that overwrote or added something else is off by |d| */
            for (size_t i = 0; i < np; i++) {
                const float want = first[i] + (first[i] - 0.25f);
                cr_assert(fabsf(twice[i] - want) <= 4e-7f * (fabsf(want) + 1.0f),
                          "the second backward did not add the same gradient at %zu: %g vs %g", i, twice[i], want);
            }
            free(again), free(twice);
        }
    }
    char ctx[160];
    snprintf(ctx, sizeof ctx, "linformer %s %s max_len=%d B=%d H=%d N=%d D=%d M=%d lengths=%s", k, share, max_len, B, H,
             N, D, M, lengths ? "yes" : "no");
    expect_close(g.out, c.out, p.nv, FWD_TOL, "out", ctx);
    expect_close(g.dq, c.dq, p.nq, BWD_TOL, "dq", ctx);
    expect_close(g.dk, c.dk, p.nq, BWD_TOL, "dk", ctx);
    expect_close(g.dv, c.dv, p.nv, BWD_TOL, "dv", ctx);
    /* the parameter gradients, without the 0.25 they were added to */
    for (size_t i = 0; i < np; i++) {
        gc[i] -= 0.25f;
        first[i] -= 0.25f;
    }
    expect_close(first, gc, np, BWD_TOL, "dparams", ctx);
    tu_assert_padded_zero(&p.s, g.out, M, "out");
    tu_assert_padded_zero(&p.s, g.dq, D, "dq");
    tu_assert_padded_zero(&p.s, g.dk, D, "dk");
    tu_assert_padded_zero(&p.s, g.dv, M, "dv");
    dfree(q), dfree(kk), dfree(v), dfree(dout), dfree(out), dfree(dq), dfree(dk), dfree(dv), dfree(dsaved);
    dfree(dpar), dfree(dgrad);
    free(par), free(gc), free(gg), free(first);
    grads_free(&c);
    grads_free(&g);
    attn_destroy(cpu);
    attn_destroy(gpu);
    tu_problem_free(&p);
}

Test(cuda_linformer, against_cpu) {
    require_cuda();
    const int len[3] = {37, 20, 0};
    lfm_case("k=5", "share=none", 37, 3, 2, 37, 5, 3, len, 101);   /* k < N, lengths with N, partial, 0 */
    lfm_case("k=64", "share=kv", 50, 2, 2, 33, 6, 4, NULL, 102);   /* k > N, N < max_len */
    lfm_case("k=8", "share=layer", 40, 3, 1, 37, 4, 4, len, 103);  /* N < max_len with lengths */
    lfm_case("k=3", "share=none", 1, 1, 2, 1, 3, 2, NULL, 104);    /* N = 1 */
    lfm_case("k=40", "share=none", 70, 1, 2, 70, 33, 40, NULL, 105); /* rows longer than a warp */
}

Test(cuda_linformer, errors) {
    require_cuda();
    const char *set[1] = {"k=4"};
    attn *a = make_lfm(AB_DEV_CUDA, set, 1);
    attn_shape s = {1, 1, 8, 4, 4, false, NULL};
    float *x = dalloc(64), *o = dalloc(64), *sv = dalloc(4096);
    cr_assert_eq(attn_forward(a, &s, x, x, x, o, sv), ATTN_EINVAL);
    cr_assert(strstr(attn_error(), "attn_bind_params") != NULL, "%s", attn_error());
    s.causal = true;
    cr_assert_eq(attn_forward(a, &s, x, x, x, o, sv), ATTN_EUNSUPPORTED);
    dfree(x), dfree(o), dfree(sv);
    attn_destroy(a);
}
