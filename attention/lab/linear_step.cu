/* Lab: one recurrent step of linear attention: per slice S (C x (M+1)) += phi(k) [v, 1]^T,
 * out = phi(q)^T S[:, :M] / (phi(q)^T S[:, M] + eps). --shape B,H,N,D,M (N unused).
 * elu (C = D):
 *   version 1: the earlier step (update kernel, then the division): 2 launches
 *   version 2: the library's fused step (lin_step_cuda: automatic tiles and row splits)
 *   version 3: fused, one block per slice, 256 threads (no counter, no partials)
 *   version 4: fused, one block per slice, 1024 threads
 *   version 5: fused, row splits aiming at 2x the blocks of the automatic rule
 *   version 6: fused, automatic plan with 128 threads per block
 * polynomial (C = 1 + D + D^2, c = 1, scale = 1/sqrt(D)):
 *   version 7: the earlier step
 *   version 8: the library's fused step
 * both, timed as one CUDA graph of LS_GRAPH_STEPS (20) library steps, per step (the
 * device's time for a step without the host's launch in between, as `sample --graph`
 * runs them; each step checked like 2 and 8 from the same state before):
 *   version 9: elu;  version 10: polynomial
 * Reference: the step in double on the host, from the same state (the state before the
 * step: 8 random positions, so that the denominators are those of a real sequence).
 * Rates: GB/s of the state read and written (8 B H C (M+1) bytes: the floor), flops
 * of the update and the two products (4 B H C (M+1)). */
#include "lab.h"

#include "../linear_step_cuda.cuh"
#include "../step_cuda.h"

#include <vector>

struct problem {
    fm_dev f;
    int kind;
    long long BH;
    int D, M;
    float *S, *q, *k, *v, *out, *ws;
    size_t ws_bytes;
    unsigned *count;
};

static fm_step_args args_of(const problem &p) {
    fm_step_args a;
    a.f = p.f;
    a.S = p.S;
    a.shift = NULL;
    a.q = p.q, a.k = p.k, a.v = p.v;
    a.out = p.out;
    a.ws = p.ws;
    a.n_slices = p.BH;
    a.M = p.M;
    a.t = 1; /* not the first position (only favor reads it) */
    a.eps = 1e-6;
    return a;
}

/* The fused kernel with its plan made for `sms` x aim SMs (rows_override when > 0). */
static int run_fused(const problem &p, int threads, int aim, int rows_override) {
    const ls_plan pl = ls_make_plan(p.BH, p.f.C, p.M, threads, attn_cuda_sm_count() * aim, rows_override, 0);
    if (!(pl.tiles == 1 && pl.rsplits == 1) &&
        (size_t)p.BH * pl.rsplits * (p.M + 1) * sizeof(double) > p.ws_bytes)
        return ab_fail(AB_EINVAL, "lab: workspace too small");
    const fm_step_args s = args_of(p);
    ls_args a;
    a.f = s.f;
    a.S = s.S;
    a.shift = NULL;
    a.q = s.q, a.k = s.k, a.v = s.v;
    a.out = s.out;
    a.part = (double *)p.ws;
    a.feat = NULL;
    a.count = p.count;
    a.n_slices = p.BH;
    a.M = p.M;
    a.t = s.t;
    a.eps = s.eps;
    return ls_step_launch(a, p.kind, pl, threads);
}

#define LS_GRAPH_STEPS 20

static int run(int v, const problem &p) {
    switch (v) {
    case 1:
    case 7: return fm_maps[p.kind].cuda->step(args_of(p));
    case 2:
    case 8:
    case 9:
    case 10: return lin_step_cuda(args_of(p), p.kind, p.count, p.ws_bytes);
    case 3: return run_fused(p, 256, 1, p.f.C);
    case 4: return run_fused(p, 1024, 1, p.f.C);
    case 5: return run_fused(p, 256, 2, 0);
    default: return run_fused(p, 128, 1, 0);
    }
}

/* phi of one row in double, as the maps define it. */
static void phi_of(const problem &p, const float *x, std::vector<double> &out) {
    const int D = p.D, C = p.f.C;
    out.assign((size_t)C, 0.0);
    if (p.kind == FM_ELU) {
        for (int c = 0; c < C; c++) out[c] = x[c] > 0 ? x[c] + 1.0 : exp((double)x[c]);
        return;
    }
    out[0] = p.f.c;
    for (int a = 0; a < D; a++) out[1 + a] = (double)p.f.lin * x[a];
    for (int a = 0; a < D; a++)
        for (int b = 0; b < D; b++) out[1 + D + a * D + b] = (double)p.f.scale * x[a] * x[b];
}

int main(int argc, char **argv) {
    lab_opts o = lab_defaults(1, 8, 1, 64, 64, 1);
    if (lab_parse(argc, argv, &o, "lab linear_step: one recurrent step of linear attention (elu, polynomial)"))
        return 2;
    const long long BH = (long long)o.B * o.H;
    const int D = o.D, M = o.M, M1 = M + 1;
    int failed = 0;
    for (int kind = FM_ELU; kind <= FM_POLY; kind += FM_POLY - FM_ELU) {
        const std::vector<int> vers = kind == FM_ELU ? std::vector<int>{1, 2, 3, 4, 5, 6, 9} : std::vector<int>{7, 8, 10};
        bool any = false;
        for (int ver : vers) any |= lab_wants(&o, ver);
        if (!any) continue;
        problem p;
        p.kind = kind;
        p.BH = BH, p.D = D, p.M = M;
        p.f.D = D;
        p.f.C = kind == FM_ELU ? D : 1 + D + D * D;
        p.f.c = 1.0f;
        p.f.scale = (float)(1.0 / sqrt((double)D));
        p.f.lin = (float)sqrt(2.0 * p.f.c * p.f.scale);
        p.f.W = p.f.WT = NULL;
        const int C = p.f.C;
        const size_t ns = (size_t)BH * C * M1;
        /* the state after 8 random positions (float, as a device would hold it) */
        float *hq, *hk, *hv, *hp;
        p.q = lab_random((size_t)BH * D, 11, 1.0f, &hq);
        p.k = lab_random((size_t)BH * D, 12, 1.0f, &hk);
        p.v = lab_random((size_t)BH * M, 13, 1.0f, &hv);
        float *pk = lab_random((size_t)8 * BH * D, 14, 1.0f, &hp), *pv = lab_random((size_t)8 * BH * M, 15, 1.0f, NULL);
        std::vector<float> pvh((size_t)8 * BH * M);
        LAB_CHECK(ab_cuda_memcpy_d2h(pvh.data(), pv, sizeof(float) * pvh.size()));
        std::vector<float> S0(ns, 0.0f);
        std::vector<double> ph, phq;
        for (int j = 0; j < 8; j++)
            for (long long bh = 0; bh < BH; bh++) {
                phi_of(p, hp + ((size_t)j * BH + bh) * D, ph);
                for (int c = 0; c < C; c++)
                    for (int m = 0; m < M1; m++)
                        S0[((size_t)bh * C + c) * M1 + m] +=
                            (float)(ph[c] * (m < M ? pvh[((size_t)j * BH + bh) * M + m] : 1.0));
            }
        /* the reference step from S0 */
        std::vector<double> want((size_t)BH * M);
        for (long long bh = 0; bh < BH; bh++) {
            phi_of(p, hk + bh * D, ph);
            phi_of(p, hq + bh * D, phq);
            std::vector<double> o1((size_t)M1, 0.0);
            for (int c = 0; c < C; c++)
                for (int m = 0; m < M1; m++)
                    o1[m] += phq[c] * (S0[((size_t)bh * C + c) * M1 + m] + ph[c] * (m < M ? hv[bh * M + m] : 1.0));
            for (int m = 0; m < M; m++) want[(size_t)bh * M + m] = o1[m] / (o1[M] + 1e-6);
        }
        float *S = NULL;
        LAB_CHECK(ab_cuda_malloc((void **)&S, sizeof(float) * ns));
        p.S = S;
        p.out = lab_zeros((size_t)BH * M);
        p.ws_bytes = (size_t)BH * C * M1 * sizeof(double); /* row splits of one row at most */
        p.ws = lab_zeros(p.ws_bytes / sizeof(float));
        LAB_CHECK(ab_cuda_malloc((void **)&p.count, sizeof(unsigned) * BH));
        LAB_CHECK(ab_cuda_memset(p.count, 0, sizeof(unsigned) * BH));
        int plan[4];
        lin_step_plan(BH, C, M, attn_cuda_sm_count(), plan);
        printf("lab: %s C=%d: %d SMs: automatic plan %d tile(s) of %d columns, %d row split(s) of %d rows\n",
               kind == FM_ELU ? "elu" : "polynomial", C, attn_cuda_sm_count(), plan[0], plan[1], plan[2], plan[3]);
        static const char *names[11] = {"",           "elu: update + divide (2)", "elu: fused (library)",
                                        "elu: fused, 1 block/slice", "elu: fused, 1 block, 1024 thr",
                                        "elu: fused, 2x blocks", "elu: fused, 128 threads",
                                        "poly: update + divide (2)", "poly: fused (library)",
                                        "elu: library, graph of 20", "poly: library, graph of 20"};
        /* Sums over C rows in double (float for the update), divided once: a few float
         * roundings of S and of the ratio, ~1e-7; 1e-5 leaves room for the state's
         * accumulated magnitude. Measured on the emulator: <= 1.2e-7 (elu and polynomial,
         * D = 5, 8 and 64). */
        const double tol = 1e-5;
        const double bytes = 8.0 * ns, flops = 4.0 * ns;
        for (int ver : vers) {
            if (!lab_wants(&o, ver)) continue;
            LAB_CHECK(ab_cuda_memcpy_h2d(S, S0.data(), sizeof(float) * ns));
            LAB_CHECK(ab_cuda_memset(p.out, 0xff, sizeof(float) * BH * M));
            LAB_CHECK(run(ver, p));
            const double err = lab_max_err(p.out, want.data(), want.size());
            double ms = -1;
            if (!o.check_only && ver >= 9) { /* the steps recorded once, timed per step */
                void *graph = NULL;
                LAB_CHECK(ab_cuda_graph_begin());
                int rc = 0;
                for (int i = 0; i < LS_GRAPH_STEPS && !rc; i++) rc = run(ver, p);
                const int re = ab_cuda_graph_end(&graph);
                LAB_CHECK(rc ? rc : re);
                ms = lab_time_ms(o.reps, [&] { return ab_cuda_graph_launch(graph); }) / LS_GRAPH_STEPS;
                ab_cuda_graph_destroy(graph);
            } else if (!o.check_only) {
                ms = lab_time_ms(o.reps, [&] { return run(ver, p); });
            }
            failed += lab_report(ver, names[ver], err, tol, ms, flops, bytes);
        }
        free(hq), free(hk), free(hv), free(hp);
        ab_cuda_free(p.q), ab_cuda_free(p.k), ab_cuda_free(p.v), ab_cuda_free(pk), ab_cuda_free(pv);
        ab_cuda_free(S), ab_cuda_free(p.out), ab_cuda_free(p.ws), ab_cuda_free(p.count);
    }
    return failed ? 1 : 0;
}
