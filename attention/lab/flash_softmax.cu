/* Lab: fused softmax attention, forward and backward, in the variants of the kernels
 * the library ships (attention/flash_softmax.cuh, included here: the same code).
 *   forward:
 *     1 rows        a warp per query row (fl_fwd_rows): the naive baseline, any D, M
 *     2 simt 64     fp32, 64 query rows x 64 keys per step, 8 warps, 4 rows per thread
 *                   (fl_fwd_simt<4, G>)
 *     3 simt 128    fp32, 128 x 64, 8 warps, 8 rows per thread (fl_fwd_simt<8, 1>;
 *                   D, M <= 64)
 *     4 simt 64/4w  fp32, 64 x 64, 4 warps, 8 rows per thread (fl_fwd_simt<8, 1, 128>;
 *                   D, M <= 64): 3's registers per thread with 2's tile
 *     5 tf32 64     tensor cores, 64 x 64 (fl_fwd_wmma<G>)
 *   backward (from the saved O and log-sum-exps of version 2's forward):
 *     6 rows        a warp per key row (dK, dV) and per query row (dQ)
 *     7 simt        fp32: dK dV pass, then dQ pass (the library's, deterministic)
 *     8 simt atomic fp32: dQ by atomics from the dK dV pass (dq zeroed inside the timing)
 *     9 tf32        tensor cores: dK dV pass, dQ pass
 *   the library (what softmax and local run, kernels chosen by shape and device):
 *    10 fwd+bwd fp32    flash_forward + flash_backward
 *    11 fwd+bwd tf32    the same with precision tf32
 * The window option (--window W, the local variant's banded form; default none) comes
 * on top of lab.h's options. G = 1 for D, M <= 64, 2 up to 128 (versions 2-5, 7-9 need
 * D, M <= 128).
 * Reference: double on the CPU, a row at a time, for the first and the last slice: every
 * row when N <= 4096 (out, dq, dk, dv), else 512 rows spread over the slice (out, dq; dk
 * and dv need every row, so they are not checked there).
 * Rates: useful flops of the forward 2 pairs (D + M) per slice (pairs: N^2, causal
 * N (N + 1) / 2, or the band's), backward twice that (its four products dV, dP, dQ, dK;
 * recomputing S is not counted), fwd+bwd 3x: attn_flops' convention. (FlashAttention's
 * papers count the backward as 2.5x the forward: multiply our backward rates by 1.25 to
 * compare with theirs.) Bytes: the tensors read and written once. */
#include "lab.h"

#include "../flash_softmax.cuh"

#include <vector>

/* ---- the problem ---- */

struct problem {
    lab_opts o;
    long long window; /* 0: none */
    long long BH;
    float *q, *k, *v, *dout;        /* inputs (device) */
    float *out, *o2, *lse, *delta;  /* forward's outputs, saved, workspace */
    float *dq, *dk, *dv;
    float *hq, *hk, *hv, *hdo;      /* host copies of the inputs */
};

static flash_args args_of(const problem &p) {
    const lab_opts &o = p.o;
    const long long ND = (long long)o.N * o.D, NM = (long long)o.N * o.M;
    flash_args a = flash_args_make(p.q, ND, p.k, ND, p.v, NM, NM, o.N, p.BH, o.N, o.D, o.M, 1.0 / sqrt((double)o.D),
                                   o.causal != 0, p.window);
    a.o = p.out, a.o2 = p.o2, a.lse = p.lse, a.dout = p.dout, a.delta = p.delta;
    a.dq = p.dq, a.dk = p.dk, a.dv = p.dv;
    /* float4 accesses where the widths and the buffers allow (as flash_forward decides) */
    const void *pq[4] = {p.q, p.k, p.dq, p.dk}, *pv[5] = {p.v, p.out, p.o2, p.dout, p.dv};
    a.vec_qk = o.D % 4 == 0, a.vec_vo = o.M % 4 == 0;
    for (const void *x : pq) a.vec_qk &= ((uintptr_t)x & 15u) == 0;
    for (const void *x : pv) a.vec_vo &= ((uintptr_t)x & 15u) == 0;
    return a;
}

/* ---- reference (double) ---- */

struct reference {
    std::vector<int> slices, rows; /* checked slices; checked rows of each */
    bool all_rows;
    std::vector<double> out, dq, dk, dv; /* [slice][row][X] for the checked ones (dk, dv: every row) */
};

static void keys_of(const problem &p, int i, int *j0, int *j1) {
    const int N = p.o.N;
    const long long w = p.window > 0 && p.window < N ? p.window : N;
    long long lo = i - w + 1, hi = p.o.causal ? i + 1 : i + w;
    *j0 = lo < 0 ? 0 : (int)lo;
    *j1 = hi > N ? N : (int)hi;
}

static reference make_reference(const problem &p) {
    const int N = p.o.N, D = p.o.D, M = p.o.M;
    const double scale = 1.0 / sqrt((double)D);
    reference r;
    r.slices.push_back(0);
    if (p.BH > 1) r.slices.push_back((int)p.BH - 1);
    r.all_rows = N <= 4096;
    const int step = r.all_rows ? 1 : (N + 511) / 512;
    for (int i = 0; i < N; i += step) r.rows.push_back(i);
    if (r.rows.back() != N - 1) r.rows.push_back(N - 1);
    const size_t ns = r.slices.size(), nr = r.rows.size();
    r.out.assign(ns * nr * M, 0.0);
    r.dq.assign(ns * nr * D, 0.0);
    if (r.all_rows) r.dk.assign(ns * (size_t)N * D, 0.0), r.dv.assign(ns * (size_t)N * M, 0.0);
    std::vector<double> pr(N), dp(N);
    for (size_t si = 0; si < ns; si++) {
        const long long sl = r.slices[si];
        const float *q = p.hq + sl * N * D, *k = p.hk + sl * N * D, *v = p.hv + sl * N * M, *g = p.hdo + sl * N * M;
        for (size_t ri = 0; ri < nr; ri++) {
            const int i = r.rows[ri];
            int j0, j1;
            keys_of(p, i, &j0, &j1);
            double mx = -INFINITY, sum = 0, del = 0;
            for (int j = j0; j < j1; j++) {
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)q[(size_t)i * D + d] * k[(size_t)j * D + d];
                pr[j] = scale * s;
                mx = fmax(mx, pr[j]);
            }
            for (int j = j0; j < j1; j++) sum += (pr[j] = exp(pr[j] - mx));
            double *o = &r.out[(si * nr + ri) * M];
            for (int j = j0; j < j1; j++) {
                pr[j] /= sum;
                double d = 0;
                for (int m = 0; m < M; m++) o[m] += pr[j] * v[(size_t)j * M + m], d += (double)g[(size_t)i * M + m] * v[(size_t)j * M + m];
                dp[j] = d;
            }
            for (int m = 0; m < M; m++) del += o[m] * g[(size_t)i * M + m];
            double *dq = &r.dq[(si * nr + ri) * D];
            for (int j = j0; j < j1; j++) {
                const double ds = pr[j] * (dp[j] - del);
                for (int d = 0; d < D; d++) dq[d] += scale * ds * k[(size_t)j * D + d];
                if (!r.all_rows) continue;
                double *dk = &r.dk[(si * (size_t)N + j) * D], *dv = &r.dv[(si * (size_t)N + j) * M];
                for (int d = 0; d < D; d++) dk[d] += scale * ds * q[(size_t)i * D + d];
                for (int m = 0; m < M; m++) dv[m] += pr[j] * g[(size_t)i * M + m];
            }
        }
    }
    return r;
}

/* max |got - want| / max |want| over the checked rows of a [BH, N, X] device tensor
 * (every row: all = true, else r.rows). */
static double rows_err(const problem &p, const reference &r, const float *dev, const std::vector<double> &want, int X,
                       bool all) {
    const int N = p.o.N;
    std::vector<float> h((size_t)N * X);
    double e = 0, m = 0;
    LAB_CHECK(ab_cuda_sync());
    for (size_t si = 0; si < r.slices.size(); si++) {
        LAB_CHECK(ab_cuda_memcpy_d2h(h.data(), dev + (size_t)r.slices[si] * N * X, sizeof(float) * (size_t)N * X));
        const size_t nr = all ? (size_t)N : r.rows.size();
        for (size_t ri = 0; ri < nr; ri++) {
            const int i = all ? (int)ri : r.rows[ri];
            for (int c = 0; c < X; c++) {
                const double w = want[(si * nr + ri) * X + c], g = h[(size_t)i * X + c];
                if (!(fabs(g - w) <= e)) e = fabs(g - w);
                m = fmax(m, fabs(w));
            }
        }
    }
    return m > 0 ? e / m : e;
}

static double fwd_err(const problem &p, const reference &r) { return rows_err(p, r, p.out, r.out, p.o.M, false); }

static double bwd_err(const problem &p, const reference &r) {
    double e = rows_err(p, r, p.dq, r.dq, p.o.D, false);
    if (r.all_rows) {
        e = fmax(e, rows_err(p, r, p.dk, r.dk, p.o.D, true));
        e = fmax(e, rows_err(p, r, p.dv, r.dv, p.o.M, true));
    }
    return e;
}

/* ---- versions ---- */

#define N_VERSIONS 11
static const char *NAMES[N_VERSIONS + 1] = {"",
                                            "fwd rows (warp per row)",
                                            "fwd simt 64x64",
                                            "fwd simt 128x64",
                                            "fwd simt 64x64 4 warps",
                                            "fwd tf32 64x64",
                                            "bwd rows (warp per row)",
                                            "bwd simt 2 passes",
                                            "bwd simt atomic dQ",
                                            "bwd tf32 2 passes",
                                            "library fwd+bwd fp32",
                                            "library fwd+bwd tf32"};

static bool is_bwd(int v) { return v >= 6 && v <= 9; }
static bool is_both(int v) { return v >= 10; }
static bool is_tf32(int v) { return v == 5 || v == 9 || v == 11; }

/* Whether version v runs at this shape. */
static bool supported(const problem &p, int v) {
    const int big = p.o.D > p.o.M ? p.o.D : p.o.M;
    if (v == 3 || v == 4) return big <= 64;
    if (v == 1 || v == 6 || v >= 10) return true;
    return big <= 128;
}

static int run(const problem &p, int v) {
    const flash_args a = args_of(p);
    const bool g2 = (p.o.D > p.o.M ? p.o.D : p.o.M) > 64;
    switch (v) {
    case 1: return fl_run_fwd_rows(a);
    case 2: return g2 ? fl_run_fwd_simt<4, 2>(a) : fl_run_fwd_simt<4, 1>(a);
    case 3: return fl_run_fwd_simt<8, 1>(a);
    case 4: return fl_run_fwd_simt<8, 1, 128>(a);
    case 5: return g2 ? fl_run_fwd_wmma<2>(a) : fl_run_fwd_wmma<1>(a);
    case 6: AB_TRY(fl_run_delta(a)); return fl_run_bwd_rows(a);
    case 7: AB_TRY(fl_run_delta(a)); return g2 ? fl_run_bwd_simt<2, false>(a) : fl_run_bwd_simt<1, false>(a);
    case 8:
        AB_TRY(ab_cuda_memset(p.dq, 0, sizeof(float) * (size_t)p.BH * p.o.N * p.o.D));
        AB_TRY(fl_run_delta(a));
        return g2 ? fl_run_bwd_simt<2, true>(a) : fl_run_bwd_simt<1, true>(a);
    case 9: AB_TRY(fl_run_delta(a)); return g2 ? fl_run_bwd_wmma<2>(a) : fl_run_bwd_wmma<1>(a);
    default: {
        const int prec = v == 10 ? AB_PREC_FP32 : AB_PREC_TF32;
        AB_TRY(flash_forward(&a, prec));
        return flash_backward(&a, prec);
    }
    }
}

/* The forward whose O and lse the backward versions read: version 2's (version 1's
 * above D, M = 128). */
static int saved_forward(const problem &p) {
    const flash_args a = args_of(p);
    const int big = p.o.D > p.o.M ? p.o.D : p.o.M;
    if (big > 128) return fl_run_fwd_rows(a);
    return big > 64 ? fl_run_fwd_simt<4, 2>(a) : fl_run_fwd_simt<4, 1>(a);
}

/* Useful flops of the forward: 2 (D + M) per (query, key) pair the masks allow. */
static double fwd_flops(const problem &p) {
    double pairs = 0;
    for (int i = 0; i < p.o.N; i++) {
        int j0, j1;
        keys_of(p, i, &j0, &j1);
        pairs += j1 - j0;
    }
    return 2.0 * pairs * (p.o.D + p.o.M) * (double)p.BH;
}

int main(int argc, char **argv) {
    /* --window W is this program's own option: taken out before lab_parse */
    long long window = 0;
    std::vector<char *> args;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--window") && i + 1 < argc) {
            window = atoll(argv[++i]);
            continue;
        }
        args.push_back(argv[i]);
    }
    problem p;
    p.o = lab_defaults(2, 8, 4096, 64, 64, 1);
    if (lab_parse((int)args.size(), args.data(), &p.o,
                  "lab flash_softmax: fused softmax attention forward and backward (--window W: banded)"))
        return 2;
    p.window = window;
    p.BH = (long long)p.o.B * p.o.H;
    const size_t nq = (size_t)p.BH * p.o.N * p.o.D, nv = (size_t)p.BH * p.o.N * p.o.M, nr = (size_t)p.BH * p.o.N;
    p.q = lab_random(nq, 1, 1.0f, &p.hq);
    p.k = lab_random(nq, 2, 1.0f, &p.hk);
    p.v = lab_random(nv, 3, 1.0f, &p.hv);
    p.dout = lab_random(nv, 4, 1.0f, &p.hdo);
    p.out = lab_zeros(nv), p.o2 = lab_zeros(nv), p.lse = lab_zeros(nr), p.delta = lab_zeros(nr);
    p.dq = lab_zeros(nq), p.dk = lab_zeros(nq), p.dv = lab_zeros(nv);
    printf("lab: window %lld; saved (O, lse) + workspace (delta): %.1f MB; reference rows: %s\n", window,
           (double)(nv + 2 * nr) * 4 / 1e6, p.o.N <= 4096 ? "all (out, dq, dk, dv)" : "512 per slice (out, dq)");
    const reference ref = make_reference(p);
    const double ff = fwd_flops(p);
    const double fbytes = 4.0 * ((double)nq * 2 + (double)nv * 2), bbytes = 4.0 * ((double)nq * 4 + (double)nv * 4);
    /* fp32: float sums of up to N terms in another order than the double reference:
     * measured up to 2e-6 on the emulator at N = 150; 1e-4 leaves room for N = 65536.
     * tf32: operands rounded to 10 bits (u = 4.9e-4): measured up to 1.1e-3
     * (tests/attention/test_cuda_flash.c); 1e-2 as the cross-check. */
    const double tol32 = 1e-4, tolt = 1e-2;
    int failed = 0;
    for (int v = 1; v <= N_VERSIONS; v++) {
        if (!lab_wants(&p.o, v) || !supported(p, v)) continue;
        const bool bwd = is_bwd(v), both = is_both(v);
        if (bwd) LAB_CHECK(saved_forward(p)); /* the saved O and lse */
        LAB_CHECK(run(p, v));
        double err = bwd ? bwd_err(p, ref) : fwd_err(p, ref);
        if (both) err = fmax(err, bwd_err(p, ref));
        const double tol = is_tf32(v) ? tolt : tol32;
        const double ms = p.o.check_only ? -1 : lab_time_ms(p.o.reps, [&] { return run(p, v); });
        const double fl = bwd ? 2 * ff : both ? 3 * ff : ff;
        const double by = bwd ? bbytes : both ? fbytes + bbytes : fbytes;
        failed += lab_report(v, NAMES[v], err, tol, ms, fl, by);
    }
    free(p.hq), free(p.hk), free(p.hv), free(p.hdo);
    float *bufs[11] = {p.q, p.k, p.v, p.dout, p.out, p.o2, p.lse, p.delta, p.dq, p.dk, p.dv};
    for (float *b : bufs) ab_cuda_free(b);
    return failed ? 1 : 0;
}
