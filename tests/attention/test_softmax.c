/* softmax and stateful-softmax on the CPU: forward against the double reference,
 * backward against central finite differences of the reference, masks (causal,
 * lengths), stateful-softmax == softmax, recurrent steps and prefill == causal forward,
 * options and error cases.
 *
 * Inputs are N(0, 1). Tolerances are on tu_rel_err: max abs error over a tensor divided
 * by the tensor's max abs value, so one figure per tensor.
 *
 * The CPU code works in row blocks of 128 queries (SMX_ROW_BLOCK in
 * attention/softmax_cpu.h); N = 300 gives two full blocks and a partial one, and the
 * lengths below cut blocks in the middle (173, 211), at a block edge (128) and just
 * past one (129). */
#include <criterion/criterion.h>

#include "attention.h"
#include "blas.h"
#include "memory.h"
#include "reference.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Forward tolerance. A score is scale * (q.k) over D terms; its float32 error is at
 * most about D * 2^-24 * scale * sum|q_d k_d| (about 1e-6 at D = 16 and 1e-5 at D = 64
 * for N(0,1) inputs), and an absolute score error e changes the probabilities by a
 * relative e. The output sums up to N = 300 products in float (blocked GEMM, bound
 * about N * 2^-24 = 2e-5 worst case, typically sqrt(N) * 2^-24 = 1e-6). Measured
 * errors are 5e-8 to 8e-7 (D up to 64); 2e-5 is the worst-case sum bound, 25x the
 * largest measured, and still far below any mask or indexing error (O(1e-2) or more). */
#define FWD_TOL 2e-5

/* Backward vs finite differences. The finite differences of the double reference are
 * accurate to about 1e-10 (step h = 1e-5: truncation h^2 |L'''| / 6 ~ 1e-10 with
 * derivatives of order one; rounding 2^-53 |L| / h ~ 1e-11), so the error is the
 * float32 backward's: the forward's error above plus dP, the row dot product (double)
 * and two more GEMMs over up to N terms. Measured errors are 5e-8 to 6e-7; 5e-5 allows
 * a few worst-case N * 2^-24 sums (2e-5 each at N = 300) and still catches any wrong
 * term (a missing scale, mask or rowsum is an O(1e-2) to O(1) relative error). */
#define BWD_TOL 5e-5
#define FD_STEP 1e-5

/* Recurrent steps / prefill vs the causal forward (both float32): the same products
 * summed in a different order (one GEMV per step vs row-block GEMMs), so each is within
 * FWD_TOL of the reference and of each other within twice that. */
#define STEP_TOL (2 * FWD_TOL)

/* ---- problems ---- */

static ref_shape to_ref(const attn_shape *s) {
    return (ref_shape){.B = s->batch, .H = s->heads, .N = s->len, .D = s->qk_dim, .M = s->v_dim,
                       .causal = s->causal, .lengths = s->lengths};
}

/* Reference output (malloc'ed) for the problem's float inputs. */
static double *ref_out(const tu_problem *p, double scale) {
    double *q = tu_to_double(p->q, p->nq), *k = tu_to_double(p->k, p->nq), *v = tu_to_double(p->v, p->nv);
    double *out = tu_alloc_d(p->nv);
    ref_shape rs = to_ref(&p->s);
    ref_softmax(&rs, scale, q, k, v, out);
    free(q);
    free(k);
    free(v);
    return out;
}

static attn *create(const char *variant, const char *setting) {
    attn_options o = {.variant = variant, .device = AB_DEV_CPU, .seed = 1,
                      .n_settings = setting ? 1 : 0, .settings = setting ? &setting : NULL};
    attn *a = NULL;
    int rc = attn_create(&o, &a);
    cr_assert(rc == 0 && a, "attn_create(%s, %s): %s", variant, setting ? setting : "-", attn_error());
    return a;
}

/* Runs forward; returns the saved buffer (malloc'ed, caller frees). */
static void *run_forward(attn *a, const tu_problem *p, float *out) {
    size_t sb = attn_saved_bytes(a, &p->s);
    size_t want = (size_t)p->s.batch * p->s.heads * p->s.len * p->s.len * sizeof(float);
    cr_assert(sb == want, "saved_bytes %zu, expected B*H*N*N floats = %zu", sb, want);
    void *saved = malloc(sb);
    int rc = attn_forward(a, &p->s, p->q, p->k, p->v, out, saved);
    cr_assert(rc == 0, "attn_forward: %s", attn_error());
    return saved;
}

static void run_backward(attn *a, const tu_problem *p, const void *saved, float *dq, float *dk, float *dv) {
    int rc = attn_backward(a, &p->s, p->q, p->k, p->v, p->dout, saved, dq, dk, dv);
    cr_assert(rc == 0, "attn_backward: %s", attn_error());
}

/* ---- forward against the reference ---- */

static void check_forward(const char *variant, const char *setting, double scale, int B, int H, int N, int D, int M,
                          bool causal, const int *lengths, uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, seed);
    attn *a = create(variant, setting);
    float *out = tu_alloc_f(p.nv);
    for (size_t i = 0; i < p.nv; i++) out[i] = NAN; /* every entry must be written */
    void *saved = run_forward(a, &p, out);
    double *want = ref_out(&p, isnan(scale) ? 1.0 / sqrt((double)D) : scale);
    double err = tu_rel_err(out, want, p.nv, 1e-3);
    cr_assert(err <= FWD_TOL, "%s B=%d H=%d N=%d D=%d M=%d causal=%d lengths=%s: rel err %.3g > %.3g", variant, B, H,
              N, D, M, causal, lengths ? "yes" : "no", err, FWD_TOL);
    tu_assert_padded_zero(&p.s, out, M, "out");
    free(want);
    free(saved);
    free(out);
    attn_destroy(a);
    tu_problem_free(&p);
}

static const char *const variants[] = {"softmax", "stateful-softmax"};

Test(softmax_forward, blocks_odd_dims_no_lengths) {
    for (int vi = 0; vi < 2; vi++)
        for (int causal = 0; causal < 2; causal++)
            check_forward(variants[vi], NULL, NAN, 2, 3, 300, 5, 3, causal, NULL, 11);
}

Test(softmax_forward, lengths_zero_full_and_block_edges) {
    const int len_a[4] = {300, 0, 173, 128};
    const int len_b[4] = {129, 300, 0, 1};
    for (int vi = 0; vi < 2; vi++)
        for (int causal = 0; causal < 2; causal++) {
            check_forward(variants[vi], NULL, NAN, 4, 2, 300, 8, 16, causal, len_a, 12);
            check_forward(variants[vi], NULL, NAN, 4, 1, 300, 5, 3, causal, len_b, 13);
        }
}

Test(softmax_forward, n_equals_one) {
    const int len[2] = {1, 0};
    for (int vi = 0; vi < 2; vi++)
        for (int causal = 0; causal < 2; causal++) {
            check_forward(variants[vi], NULL, NAN, 2, 3, 1, 5, 3, causal, NULL, 14);
            check_forward(variants[vi], NULL, NAN, 2, 3, 1, 5, 3, causal, len, 15);
        }
}

Test(softmax_forward, small_and_exact_block_sizes) {
    /* N below one block, exactly one block, and one past two blocks; head size 64. */
    const int lens[3] = {7, 100, 257};
    for (int causal = 0; causal < 2; causal++) {
        check_forward("softmax", NULL, NAN, 1, 2, 7, 5, 3, causal, NULL, 16);
        check_forward("softmax", NULL, NAN, 1, 2, 128, 64, 64, causal, NULL, 17);
        check_forward("softmax", NULL, NAN, 1, 1, 257, 64, 64, causal, &lens[2], 18);
    }
}

Test(softmax_forward, scale_option) {
    for (int vi = 0; vi < 2; vi++)
        for (int causal = 0; causal < 2; causal++) {
            check_forward(variants[vi], "scale=0.3", 0.3, 1, 2, 45, 7, 9, causal, NULL, 19);
            check_forward(variants[vi], "scale=-0.7", -0.7, 1, 2, 45, 7, 9, causal, NULL, 20);
            check_forward(variants[vi], "scale=auto", NAN, 1, 2, 45, 7, 9, causal, NULL, 21);
        }
}

Test(softmax_forward, large_scores_are_stable) {
    /* scale = 40: scores of several hundred, whose exp overflows float without the max
     * subtraction; the result must still match the reference (softmax is nearly one-hot,
     * and the score error grows with the scale: FWD_TOL * 40 for the same reason as
     * FWD_TOL itself). */
    tu_problem p;
    tu_problem_init(&p, 1, 2, 150, 5, 3, true, NULL, 22);
    attn *a = create("softmax", "scale=40");
    float *out = tu_alloc_f(p.nv);
    void *saved = run_forward(a, &p, out);
    double *want = ref_out(&p, 40.0);
    double err = tu_rel_err(out, want, p.nv, 1e-3);
    cr_assert(err <= 40 * FWD_TOL, "scale=40: rel err %.3g", err);
    free(want);
    free(saved);
    free(out);
    attn_destroy(a);
    tu_problem_free(&p);
}

/* ---- backward against finite differences of the reference ---- */

typedef struct {
    ref_shape rs;
    double scale;
    double *q, *k, *v;
} fd_ctx;

static void fd_forward(void *ctx, double *out) {
    fd_ctx *c = ctx;
    ref_softmax(&c->rs, c->scale, c->q, c->k, c->v, out);
}

/* L = sum(out * w) at the current inputs. */
static double fd_loss(fd_ctx *c, const double *w, double *tmp, size_t nout) {
    fd_forward(c, tmp);
    double l = 0;
    for (size_t i = 0; i < nout; i++) l += tmp[i] * w[i];
    return l;
}

/* Central difference of L with respect to x[i] for the listed entries only. */
static void fd_entries(fd_ctx *c, double *x, const size_t *idx, int n_idx, const double *w, size_t nout,
                       double *grad) {
    double *tmp = tu_alloc_d(nout);
    for (int t = 0; t < n_idx; t++) {
        size_t i = idx[t];
        double x0 = x[i];
        x[i] = x0 + FD_STEP;
        double lp = fd_loss(c, w, tmp, nout);
        x[i] = x0 - FD_STEP;
        double lm = fd_loss(c, w, tmp, nout);
        x[i] = x0;
        grad[t] = (lp - lm) / (2 * FD_STEP);
    }
    free(tmp);
}

/* Runs forward and backward, checks every padded row of out/dq/dk/dv is exactly zero,
 * and checks dq, dk, dv against finite differences: at every entry (n_sample = 0) or
 * at n_sample random entries of each tensor. */
static void check_backward(const char *variant, const char *setting, double scale, int B, int H, int N, int D, int M,
                           bool causal, const int *lengths, uint64_t seed, int n_sample) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, causal, lengths, seed);
    attn *a = create(variant, setting);
    float *out = tu_alloc_f(p.nv), *dq = tu_alloc_f(p.nq), *dk = tu_alloc_f(p.nq), *dv = tu_alloc_f(p.nv);
    for (size_t i = 0; i < p.nq; i++) dq[i] = dk[i] = NAN; /* backward overwrites, never accumulates */
    for (size_t i = 0; i < p.nv; i++) dv[i] = NAN;
    void *saved = run_forward(a, &p, out);
    run_backward(a, &p, saved, dq, dk, dv);
    tu_assert_padded_zero(&p.s, out, M, "out");
    tu_assert_padded_zero(&p.s, dq, D, "dq");
    tu_assert_padded_zero(&p.s, dk, D, "dk");
    tu_assert_padded_zero(&p.s, dv, M, "dv");

    fd_ctx c = {.rs = to_ref(&p.s), .scale = isnan(scale) ? 1.0 / sqrt((double)D) : scale};
    c.q = tu_to_double(p.q, p.nq);
    c.k = tu_to_double(p.k, p.nq);
    c.v = tu_to_double(p.v, p.nv);
    double *w = tu_to_double(p.dout, p.nv);
    struct {
        const char *name;
        double *x;
        const float *got;
        size_t n;
    } t[3] = {{"dq", c.q, dq, p.nq}, {"dk", c.k, dk, p.nq}, {"dv", c.v, dv, p.nv}};
    for (int j = 0; j < 3; j++) {
        double *fd;
        float *got;
        size_t n;
        if (n_sample == 0) {
            n = t[j].n;
            fd = tu_alloc_d(n);
            got = tu_alloc_f(n);
            tu_fd_grad(fd_forward, &c, t[j].x, n, w, p.nv, FD_STEP, fd);
            memcpy(got, t[j].got, sizeof(float) * n);
        } else {
            n = (size_t)n_sample;
            fd = tu_alloc_d(n);
            got = tu_alloc_f(n);
            int *pick = malloc(sizeof(int) * n);
            size_t *idx = malloc(sizeof(size_t) * n);
            tu_fill_int(pick, n, seed, 10 + (uint64_t)j, 0, (int)t[j].n - 1);
            for (size_t i = 0; i < n; i++) {
                idx[i] = (size_t)pick[i];
                got[i] = t[j].got[idx[i]];
            }
            fd_entries(&c, t[j].x, idx, (int)n, w, p.nv, fd);
            free(pick);
            free(idx);
        }
        double err = tu_rel_err(got, fd, n, 1e-3);
        cr_assert(err <= BWD_TOL, "%s %s B=%d H=%d N=%d D=%d M=%d causal=%d lengths=%s: rel err %.3g > %.3g",
                  variant, t[j].name, B, H, N, D, M, causal, lengths ? "yes" : "no", err, BWD_TOL);
        cr_assert(tu_max_abs(fd, n) > 1e-3, "%s: finite differences are all ~0, the check would be vacuous",
                  t[j].name);
        free(fd);
        free(got);
    }
    free(c.q);
    free(c.k);
    free(c.v);
    free(w);
    free(saved);
    free(out);
    free(dq);
    free(dk);
    free(dv);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(softmax_backward, finite_differences_small) {
    const int len[3] = {7, 4, 0};
    for (int causal = 0; causal < 2; causal++) {
        check_backward("softmax", NULL, NAN, 2, 2, 7, 5, 3, causal, NULL, 31, 0);
        check_backward("softmax", NULL, NAN, 3, 2, 7, 5, 3, causal, len, 32, 0);
        check_backward("softmax", "scale=0.3", 0.3, 1, 1, 9, 4, 6, causal, NULL, 33, 0);
    }
}

Test(softmax_backward, n_equals_one) {
    /* N = 1: out = v, so dq = dk = 0 exactly and dv = dout (the entries are checked
     * against the finite differences, which are 0 for q and k). */
    tu_problem p;
    const int len[2] = {1, 0};
    tu_problem_init(&p, 2, 3, 1, 5, 3, true, len, 34);
    attn *a = create("softmax", NULL);
    float *out = tu_alloc_f(p.nv), *dq = tu_alloc_f(p.nq), *dk = tu_alloc_f(p.nq), *dv = tu_alloc_f(p.nv);
    void *saved = run_forward(a, &p, out);
    run_backward(a, &p, saved, dq, dk, dv);
    for (int b = 0; b < 2; b++)
        for (size_t i = 0; i < (size_t)3 * 3; i++) {
            size_t e = (size_t)b * 9 + i;
            float want_out = len[b] ? p.v[e] : 0.0f, want_dv = len[b] ? p.dout[e] : 0.0f;
            /* a single key has probability exactly 1, so these hold exactly */
            cr_assert(out[e] == want_out, "N=1: out[%zu] = %g, want v = %g", e, (double)out[e], (double)want_out);
            cr_assert(dv[e] == want_dv, "N=1: dv[%zu] = %g, want dout = %g", e, (double)dv[e], (double)want_dv);
        }
    for (size_t i = 0; i < p.nq; i++) cr_assert(dq[i] == 0.0f && dk[i] == 0.0f, "N=1: dq, dk must be 0");
    free(saved);
    free(out);
    free(dq);
    free(dk);
    free(dv);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(softmax_backward, finite_differences_across_blocks) {
    /* N = 300 (three row blocks), lengths cutting the middle of a block: 64 sampled
     * entries per tensor (every entry would take minutes of reference evaluations). */
    const int len[2] = {300, 211};
    for (int causal = 0; causal < 2; causal++) check_backward("softmax", NULL, NAN, 2, 1, 300, 5, 3, causal, len, 35, 64);
}

Test(softmax_backward, finite_differences_one_slice) {
    /* A single slice (B*H = 1, fewer slices than threads): backward splits the row
     * blocks of the slice over the threads, each with its own dK/dV partial sums. */
    const int len[1] = {277};
    for (int causal = 0; causal < 2; causal++) {
        check_backward("softmax", NULL, NAN, 1, 1, 300, 5, 3, causal, NULL, 36, 64);
        check_backward("softmax", NULL, NAN, 1, 1, 300, 5, 3, causal, len, 37, 64);
    }
}

/* ---- stateful-softmax == softmax ---- */

Test(stateful_softmax, same_as_softmax_bitwise) {
    /* Same code, same thread count, same calls: the results are identical bit for bit
     * (OpenBLAS partitions a GEMM of given sizes the same way every time). */
    const int len[2] = {300, 173};
    for (int causal = 0; causal < 2; causal++)
        for (int with_len = 0; with_len < 3; with_len++) {
            /* with_len 2: one slice, so backward takes its split-blocks path */
            tu_problem p;
            if (with_len < 2) tu_problem_init(&p, 2, 3, 300, 5, 3, causal, with_len ? len : NULL, 41);
            else tu_problem_init(&p, 1, 1, 300, 5, 3, causal, &len[1], 42);
            float *o[2], *dq[2], *dk[2], *dv[2];
            for (int vi = 0; vi < 2; vi++) {
                attn *a = create(variants[vi], NULL);
                o[vi] = tu_alloc_f(p.nv);
                dq[vi] = tu_alloc_f(p.nq);
                dk[vi] = tu_alloc_f(p.nq);
                dv[vi] = tu_alloc_f(p.nv);
                void *saved = run_forward(a, &p, o[vi]);
                run_backward(a, &p, saved, dq[vi], dk[vi], dv[vi]);
                free(saved);
                attn_destroy(a);
            }
            cr_assert(memcmp(o[0], o[1], sizeof(float) * p.nv) == 0, "out differs (causal=%d)", causal);
            cr_assert(memcmp(dq[0], dq[1], sizeof(float) * p.nq) == 0, "dq differs (causal=%d)", causal);
            cr_assert(memcmp(dk[0], dk[1], sizeof(float) * p.nq) == 0, "dk differs (causal=%d)", causal);
            cr_assert(memcmp(dv[0], dv[1], sizeof(float) * p.nv) == 0, "dv differs (causal=%d)", causal);
            for (int vi = 0; vi < 2; vi++) {
                free(o[vi]);
                free(dq[vi]);
                free(dk[vi]);
                free(dv[vi]);
            }
            tu_problem_free(&p);
        }
}

/* ---- recurrent mode ---- */

/* prefill(P) (P < 0: none, plain steps from an empty state) then steps P..N-1, against
 * the causal forward and the reference. with_out: prefill returns its outputs. */
static void check_recurrent(const char *setting, double scale, int B, int H, int N, int D, int M, int capacity, int P,
                            bool with_out, uint64_t seed) {
    tu_problem p;
    tu_problem_init(&p, B, H, N, D, M, true, NULL, seed);
    attn *a = create("stateful-softmax", setting);
    float *fwd = tu_alloc_f(p.nv);
    void *saved = run_forward(a, &p, fwd);
    double *want = ref_out(&p, isnan(scale) ? 1.0 / sqrt((double)D) : scale);

    size_t sb = attn_state_bytes(a, &p.s, capacity);
    cr_assert(sb > 0, "state_bytes: %s", attn_error());
    attn_state *state = NULL;
    cr_assert(attn_state_create(a, &p.s, capacity, &state) == 0, "state_create: %s", attn_error());
    float *rec = tu_alloc_f(p.nv);
    for (size_t i = 0; i < p.nv; i++) rec[i] = NAN;
    int start = 0;
    if (P >= 0) {
        float *qp = tu_prefix(&p.s, p.q, P, D), *kp = tu_prefix(&p.s, p.k, P, D), *vp = tu_prefix(&p.s, p.v, P, M);
        float *op = with_out ? tu_alloc_f((size_t)B * H * (size_t)(P ? P : 1) * M) : NULL;
        int rc = attn_prefill(a, state, P, qp, kp, vp, op);
        cr_assert(rc == 0, "prefill(%d): %s", P, attn_error());
        if (op)
            for (int bh = 0; bh < B * H; bh++)
                memcpy(rec + (size_t)bh * N * M, op + (size_t)bh * P * M, sizeof(float) * (size_t)P * M);
        free(qp);
        free(kp);
        free(vp);
        free(op);
        start = P;
    }
    float *qt = tu_alloc_f((size_t)B * H * D), *kt = tu_alloc_f((size_t)B * H * D);
    float *vt = tu_alloc_f((size_t)B * H * M), *ot = tu_alloc_f((size_t)B * H * M);
    for (int t = start; t < N; t++) {
        tu_gather(&p.s, p.q, qt, t, D);
        tu_gather(&p.s, p.k, kt, t, D);
        tu_gather(&p.s, p.v, vt, t, M);
        int rc = attn_step(a, state, t, qt, kt, vt, ot);
        cr_assert(rc == 0, "step %d: %s", t, attn_error());
        tu_scatter(&p.s, ot, rec, t, M);
    }
    /* Compare the rows the recurrent run produced: all of them unless the prefill's
     * outputs were not asked for. */
    int first = (P > 0 && !with_out) ? P : 0;
    for (int bh = 0; bh < B * H; bh++) {
        size_t off = ((size_t)bh * N + first) * M, n = (size_t)(N - first) * M;
        double err_ref = tu_rel_err(rec + off, want + off, n, 1e-3);
        cr_assert(err_ref <= FWD_TOL, "recurrent (P=%d, out=%d) vs reference, slice %d: rel err %.3g", P, with_out,
                  bh, err_ref);
        double *fd = tu_to_double(fwd + off, n);
        double err_fwd = tu_rel_err(rec + off, fd, n, 1e-3);
        cr_assert(err_fwd <= STEP_TOL, "recurrent (P=%d, out=%d) vs causal forward, slice %d: rel err %.3g", P,
                  with_out, bh, err_fwd);
        free(fd);
    }
    free(qt);
    free(kt);
    free(vt);
    free(ot);
    free(rec);
    attn_state_destroy(state);
    free(want);
    free(saved);
    free(fwd);
    attn_destroy(a);
    tu_problem_free(&p);
}

Test(stateful_softmax, steps_equal_causal_forward) {
    check_recurrent(NULL, NAN, 2, 3, 300, 5, 3, 300, -1, true, 51);     /* capacity == N */
    check_recurrent(NULL, NAN, 1, 1, 1, 5, 3, 1, -1, true, 52);         /* N = 1 */
    check_recurrent("scale=0.3", 0.3, 1, 2, 40, 7, 9, 57, -1, true, 53); /* spare capacity */
}

Test(stateful_softmax, prefill_then_steps_equal_causal_forward) {
    const int prompts[] = {0, 1, 137, 256, 300};
    for (size_t i = 0; i < sizeof prompts / sizeof prompts[0]; i++)
        check_recurrent(NULL, NAN, 2, 3, 300, 5, 3, 310, prompts[i], true, 54);
    check_recurrent(NULL, NAN, 2, 3, 300, 5, 3, 300, 137, false, 55); /* out == NULL */
    check_recurrent(NULL, NAN, 2, 3, 300, 5, 3, 300, 300, false, 56);
    check_recurrent(NULL, NAN, 1, 1, 130, 64, 64, 130, 129, true, 57); /* one slice: BLAS gets the threads */
}

Test(stateful_softmax, state_bytes_exact) {
    attn *a = create("stateful-softmax", NULL);
    attn_shape s = {.batch = 2, .heads = 3, .len = 1, .qk_dim = 5, .v_dim = 3, .causal = true};
    size_t got = attn_state_bytes(a, &s, 100);
    /* K cache (padded to 64 bytes) + V cache: the bookkeeping is in the host object */
    size_t kbytes = (size_t)2 * 3 * 100 * 5 * 4, vbytes = (size_t)2 * 3 * 100 * 3 * 4;
    size_t want = ((kbytes + 63) / 64) * 64 + vbytes;
    cr_assert(got == want, "state_bytes %zu, expected %zu", got, want);
    attn_destroy(a);
}

/* ---- options and errors ---- */

static void expect_create_fails(const char *variant, const char *setting, const char *needle) {
    attn_options o = {.variant = variant, .device = AB_DEV_CPU, .n_settings = 1, .settings = &setting};
    attn *a = NULL;
    int rc = attn_create(&o, &a);
    cr_assert(rc == ATTN_EINVAL && a == NULL, "%s with %s: rc %d, expected ATTN_EINVAL", variant, setting, rc);
    cr_assert(strstr(attn_error(), needle), "%s with %s: message '%s' does not name '%s'", variant, setting,
              attn_error(), needle);
}

Test(softmax_options, bad_settings_rejected) {
    for (int vi = 0; vi < 2; vi++) {
        expect_create_fails(variants[vi], "scale=abc", "scale");
        expect_create_fails(variants[vi], "scale=", "scale");
        expect_create_fails(variants[vi], "scale=inf", "scale");
        expect_create_fails(variants[vi], "temperature=2", "temperature");
        expect_create_fails(variants[vi], "chunk=4", "chunk");
    }
}

Test(softmax_options, listing_and_values) {
    for (int vi = 0; vi < 2; vi++) {
        int i = attn_variant_find(variants[vi]);
        cr_assert(i >= 0);
        const char *name, *def, *help;
        cr_assert(attn_variant_option(i, 0, &name, &def, &help));
        cr_assert(strcmp(name, "scale") == 0 && strcmp(def, "1/sqrt(D)") == 0, "option 0: %s default %s", name, def);
        /* then the option every variant has (the registry's), and nothing more */
        cr_assert(attn_variant_option(i, 1, &name, &def, &help));
        cr_assert(strcmp(name, "precision") == 0 && strcmp(def, "fp32") == 0, "option 1: %s default %s", name, def);
        cr_assert(!attn_variant_option(i, 2, &name, &def, &help), "softmax has one option of its own");
        cr_assert(strstr(attn_variant_summary(i), "softmax") != NULL);
        cr_assert(attn_variant_has_step(i) == (vi == 1), "only stateful-softmax has a recurrent mode");
    }
    attn_shape s = {.batch = 1, .heads = 1, .len = 4, .qk_dim = 25, .v_dim = 3};
    char buf[64];
    attn *a = create("softmax", NULL);
    cr_assert_str_eq(attn_option_value(a, &s, "scale", buf, sizeof buf), "0.2"); /* 1/sqrt(25) */
    cr_assert_str_eq(attn_option_value(a, NULL, "scale", buf, sizeof buf), "1/sqrt(D)");
    attn_destroy(a);
    a = create("stateful-softmax", "scale=0.3");
    cr_assert_str_eq(attn_option_value(a, &s, "scale", buf, sizeof buf), "0.3");
    attn_destroy(a);
}

Test(softmax_recurrent_errors, misuse_rejected) {
    attn *a = create("stateful-softmax", NULL);
    attn_shape s = {.batch = 2, .heads = 1, .len = 1, .qk_dim = 5, .v_dim = 3, .causal = true};
    const int cap = 3;
    attn_state *state = NULL;
    cr_assert(attn_state_create(a, &s, cap, &state) == 0, "%s", attn_error());
    cr_assert(attn_state_len(state) == 0 && attn_state_capacity(state) == cap);
    float q[10] = {0}, k[10] = {0}, v[6] = {0}, o[6];

    /* t must equal the number of positions held */
    int rc = attn_step(a, state, 1, q, k, v, o);
    cr_assert(rc == ATTN_EINVAL && strstr(attn_error(), "position"), "step t=1 on an empty state: rc %d '%s'", rc,
              attn_error());
    for (int t = 0; t < cap; t++) cr_assert(attn_step(a, state, t, q, k, v, o) == 0, "%s", attn_error());
    cr_assert(attn_state_len(state) == cap);
    rc = attn_step(a, state, 1, q, k, v, o);
    cr_assert(rc == ATTN_EINVAL && strstr(attn_error(), "position"), "step t=1 after 3 steps: rc %d", rc);
    /* past capacity */
    rc = attn_step(a, state, cap, q, k, v, o);
    cr_assert(rc == ATTN_EINVAL && strstr(attn_error(), "full"), "step past capacity: rc %d '%s'", rc, attn_error());
    /* prefill needs an empty state; a prompt longer than the capacity does not fit */
    rc = attn_prefill(a, state, 1, q, k, v, o);
    cr_assert(rc == ATTN_EINVAL, "prefill into a non-empty state: rc %d", rc);
    cr_assert(attn_state_reset(a, state) == 0);
    cr_assert(attn_state_len(state) == 0);
    rc = attn_prefill(a, state, cap + 1, q, k, v, NULL);
    cr_assert(rc == ATTN_EINVAL && strstr(attn_error(), "capacity"), "prompt > capacity: rc %d '%s'", rc,
              attn_error());
    /* a state belongs to the object that made it */
    attn *other = create("stateful-softmax", NULL);
    rc = attn_step(other, state, 0, q, k, v, o);
    cr_assert(rc == ATTN_EINVAL && strstr(attn_error(), "another"), "state of another object: rc %d '%s'", rc,
              attn_error());
    attn_destroy(other);
    attn_state_destroy(state);

    /* non-causal shape */
    attn_shape nc = s;
    nc.causal = false;
    cr_assert(attn_state_bytes(a, &nc, cap) == 0, "non-causal shape has no state");
    rc = attn_state_create(a, &nc, cap, &state);
    cr_assert(rc == ATTN_EINVAL && strstr(attn_error(), "causal") && !state, "non-causal: rc %d '%s'", rc,
              attn_error());
    /* lengths */
    const int len[2] = {1, 1};
    attn_shape ls = s;
    ls.lengths = len;
    cr_assert(attn_state_bytes(a, &ls, cap) == 0, "shape with lengths has no state");
    rc = attn_state_create(a, &ls, cap, &state);
    cr_assert(rc < 0 && strstr(attn_error(), "lengths"), "lengths: rc %d '%s'", rc, attn_error());
    attn_destroy(a);

    /* plain softmax has no recurrent mode */
    a = create("softmax", NULL);
    cr_assert(!attn_has_step(a));
    rc = attn_state_create(a, &s, cap, &state);
    cr_assert(rc == ATTN_EUNSUPPORTED, "softmax state_create: rc %d", rc);
    attn_destroy(a);
}

Test(softmax_memory, repeated_calls_allocate_nothing) {
    /* The registry sizes the workspace on the first call; later calls at the same shape
     * must not allocate (no malloc/ab_alloc inside forward/backward/step). */
    const int len[2] = {300, 99};
    tu_problem p;
    tu_problem_init(&p, 2, 3, 300, 5, 3, true, len, 61);
    attn *a = create("softmax", NULL);
    float *out = tu_alloc_f(p.nv), *dq = tu_alloc_f(p.nq), *dk = tu_alloc_f(p.nq), *dv = tu_alloc_f(p.nv);
    cr_assert(attn_reserve(a, &p.s) == 0, "%s", attn_error());
    size_t ws = attn_workspace_bytes(a);
    void *saved = run_forward(a, &p, out);
    run_backward(a, &p, saved, dq, dk, dv);
    size_t cur = ab_mem_current(AB_DEV_CPU);
    ab_mem_reset_peak(AB_DEV_CPU);
    free(run_forward(a, &p, out));
    run_backward(a, &p, saved, dq, dk, dv);
    cr_assert(attn_workspace_bytes(a) == ws, "workspace grew from %zu to %zu", ws, attn_workspace_bytes(a));
    cr_assert(ab_mem_peak(AB_DEV_CPU) == cur, "tracked memory peak %zu > %zu: allocation inside a call",
              ab_mem_peak(AB_DEV_CPU), cur);
    /* Workspace is one 128 x N block of floats per thread slot, far below N x N per
     * slice (B*H = 6 slices here). */
    size_t slot = ((size_t)128 * 300 * 4 + 63) / 64 * 64;
    cr_assert(ws <= (size_t)ab_threads() * slot, "workspace %zu bytes > %d slots of %zu", ws, ab_threads(), slot);
    free(saved);
    free(out);
    free(dq);
    free(dk);
    free(dv);
    attn_destroy(a);
    tu_problem_free(&p);
}

/* ---- a forward no backward follows ---- */

Test(softmax_forward, unsaved_forward_is_the_same_bit_for_bit) {
    /* saved = NULL: the row blocks' scores go to the thread slots of the workspace
     * instead of the N x N probabilities; the products and their order are the same,
     * so the outputs are identical, on one thread and on two (one slice with two threads
     * runs the blocks on the inner BLAS threads; two slices, over the items). Padding
     * rows stay zero. Variants that save nothing, and lsh (which does), say so. */
    const int len[2] = {300, 129};
    for (int vi = 0; vi < 2; vi++)
        for (int threads = 1; threads <= 2; threads++)
            for (int causal = 0; causal < 2; causal++)
                for (int shape = 0; shape < 3; shape++) {
                    ab_set_threads(threads);
                    tu_problem p;
                    if (shape == 0) tu_problem_init(&p, 2, 3, 300, 5, 3, causal, len, 51);
                    else if (shape == 1) tu_problem_init(&p, 1, 1, 300, 7, 4, causal, NULL, 52);
                    else tu_problem_init(&p, 1, 2, 1, 3, 2, causal, NULL, 53);
                    attn *a = create(variants[vi], NULL);
                    cr_assert(attn_can_forward_unsaved(a), "%s", variants[vi]);
                    float *o = tu_alloc_f(p.nv), *u = tu_alloc_f(p.nv);
                    for (size_t i = 0; i < p.nv; i++) u[i] = NAN; /* every entry must be written */
                    void *saved = run_forward(a, &p, o);
                    cr_assert_eq(attn_forward(a, &p.s, p.q, p.k, p.v, u, NULL), 0, "%s", attn_error());
                    cr_assert(memcmp(o, u, sizeof(float) * p.nv) == 0, "%s threads=%d causal=%d shape %d: differs",
                              variants[vi], threads, causal, shape);
                    free(saved);
                    free(o);
                    free(u);
                    attn_destroy(a);
                    tu_problem_free(&p);
                }
    ab_set_threads(0);
    const char *others[] = {"linear", "polynomial"};
    for (int i = 0; i < 2; i++) {
        attn *a = create(others[i], NULL);
        cr_expect(attn_can_forward_unsaved(a), "%s saves nothing", others[i]);
        attn_destroy(a);
    }
    attn *l = create("lsh", NULL);
    cr_expect(!attn_can_forward_unsaved(l), "lsh keeps its sort order");
    tu_problem p;
    tu_problem_init(&p, 1, 1, 64, 4, 4, false, NULL, 54);
    float *o = tu_alloc_f(p.nv);
    cr_expect_neq(attn_forward(l, &p.s, p.q, p.k, p.v, o, NULL), 0, "lsh without a saved buffer");
    cr_expect(strstr(attn_error(), "saved") != NULL, "%s", attn_error());
    free(o);
    attn_destroy(l);
    tu_problem_free(&p);
}
