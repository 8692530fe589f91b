/* Lab: linear attention forward and backward (attention/linear_chunk.cuh, the fused
 * chunked kernels the library ships, and the batched cuBLAS path before them).
 *
 *   version 1  batched: the library's previous path (cuBLAS strided-batched GEMMs over
 *              chunks of 64, per-chunk states written and scanned), fp32, through the
 *              attention API with lin_cuda_path = 1
 *   version 2  fused fp32 (register tiles), chunk 32, 256 threads, 2 blocks per SM: the
 *              library's default
 *   version 3  fused tf32 (wmma), chunk 32, 256 threads, 2 blocks per SM: precision=tf32
 *   version 4  fused tf32, chunk 16
 *   version 5  fused tf32, chunk 64 (backward's tiles need more shared memory)
 *   version 6  fused tf32, 128 threads per block
 *   version 7  fused tf32, 4 blocks per SM aimed for (more, shorter segments)
 *   version 8  fused tf32, 1 block per SM aimed for (fewer segments: less state traffic)
 *   version 9  fused fp32, chunk 16
 *   version 10 fused fp32, 128 threads per block
 *   version 11-12 fused tf32 / fp32, chunk 48, 1 block per SM (polynomial's defaults)
 *   version 13-14 versions 2 and 3 with prefetch: each block fetches the next chunk's
 *              rows into registers while it works on a chunk (lc_stage; elu only: with
 *              another LAB_MAP they run as 2 and 3)
 * Each version prints three lines: forward, backward (alone: it recomputes what it
 * needs) and forward + backward, each with its error against a float64 reference (the
 * scan form, paper eqs. 13-15; computed for the first two slices only, to keep it
 * quick at large shapes), time, TFLOP/s of useful work (attn_flops' rule: 4 N C (M+1)
 * per slice forward, three times that for both) and GB/s against the minimal bytes:
 * forward q, k, v, out; backward q, k, v, dout, dq, dk, dv; both: the eight tensors.
 * LAB_MAP=elu|taylor|favor|poly in the environment picks the feature map (default elu;
 * poly: the polynomial variant, c = 1, scale = 1/sqrt(D), through poly_chunk.cuh, whose
 * versions that do not fit shared memory are skipped). */
#include "lab.h"

#include "../linear_chunk.cuh"
#include "../poly_chunk.cuh"
#include "../linear_cuda.h"

extern "C" {
#include "../favor.h"
}

#include <functional>
#include <string>

/* ---- the float64 reference (one slice) ---- */

#define LAB_MAP_POLY 3

struct ref_map {
    int kind, D, C;
    double c, scale;
    std::vector<double> W; /* favor: C x D */
    void phi(const float *x, double *f) const {
        if (kind == LC_MAP_ELU) {
            for (int d = 0; d < D; d++) f[d] = x[d] > 0 ? x[d] + 1.0 : exp((double)x[d]);
        } else if (kind == LC_MAP_TAYLOR) {
            double s = 0;
            for (int d = 0; d < D; d++) s += (double)x[d] * x[d];
            const double inv = 1.0 / fmax(sqrt(s), FM_TAYLOR_NORM_FLOOR);
            f[0] = 1;
            for (int d = 0; d < D; d++) f[1 + d] = x[d] * inv;
        } else if (kind == LAB_MAP_POLY) {
            const double lin = sqrt(2 * c * scale);
            f[0] = c;
            for (int d = 0; d < D; d++) f[1 + d] = lin * x[d];
            for (int a = 0; a < D; a++)
                for (int b = 0; b < D; b++) f[1 + D + a * D + b] = scale * x[a] * x[b];
        } else {
            const double q4 = pow((double)D, -0.25);
            double h = 0;
            for (int d = 0; d < D; d++) h += (double)x[d] * x[d];
            h *= 0.5 * q4 * q4;
            for (int c = 0; c < C; c++) {
                double p = 0;
                for (int d = 0; d < D; d++) p += W[(size_t)c * D + d] * x[d];
                f[c] = exp(q4 * p - h) / sqrt((double)C);
            }
        }
    }
    /* gx = (d phi / d x)^T g */
    void back(const float *x, const double *f, const double *g, double *gx) const {
        if (kind == LC_MAP_ELU) {
            for (int d = 0; d < D; d++) gx[d] = x[d] > 0 ? g[d] : g[d] * f[d];
        } else if (kind == LC_MAP_TAYLOR) {
            double s = 0;
            for (int d = 0; d < D; d++) s += (double)x[d] * x[d];
            const double r = sqrt(s);
            if (r > FM_TAYLOR_NORM_FLOOR) {
                double ug = 0;
                for (int d = 0; d < D; d++) ug += x[d] / r * g[1 + d];
                for (int d = 0; d < D; d++) gx[d] = (g[1 + d] - x[d] / r * ug) / r;
            } else {
                for (int d = 0; d < D; d++) gx[d] = g[1 + d] / FM_TAYLOR_NORM_FLOOR;
            }
        } else if (kind == LAB_MAP_POLY) {
            const double lin = sqrt(2 * c * scale);
            for (int d = 0; d < D; d++) gx[d] = lin * g[1 + d];
            for (int a = 0; a < D; a++)
                for (int b = 0; b < D; b++) {
                    const double ga = g[1 + D + a * D + b] * scale;
                    gx[a] += ga * x[b];
                    gx[b] += ga * x[a];
                }
        } else {
            const double q4 = pow((double)D, -0.25);
            double su = 0;
            for (int d = 0; d < D; d++) gx[d] = 0;
            for (int c = 0; c < C; c++) {
                const double u = g[c] * f[c];
                su += u;
                for (int d = 0; d < D; d++) gx[d] += q4 * u * W[(size_t)c * D + d];
            }
            for (int d = 0; d < D; d++) gx[d] -= q4 * q4 * su * x[d];
        }
    }
};

/* out, dq, dk, dv of one slice (N rows), eps added to the denominator. */
static void reference(const ref_map &mp, int N, int M, bool causal, double eps, const float *q, const float *k,
                      const float *v, const float *dout, double *out, double *dq, double *dk, double *dv) {
    const int C = mp.C, D = mp.D;
    std::vector<double> fq((size_t)N * C), fk((size_t)N * C), S((size_t)C * M, 0), z(C, 0), R((size_t)C * M, 0),
        r(C, 0), G((size_t)N * M), gd(N), den(N), g(C), dphi(C);
    for (int i = 0; i < N; i++) {
        mp.phi(q + (size_t)i * D, &fq[(size_t)i * C]);
        mp.phi(k + (size_t)i * D, &fk[(size_t)i * C]);
    }
    auto add_key = [&](int j) {
        for (int c = 0; c < C; c++) {
            z[c] += fk[(size_t)j * C + c];
            for (int m = 0; m < M; m++) S[(size_t)c * M + m] += fk[(size_t)j * C + c] * v[(size_t)j * M + m];
        }
    };
    if (!causal)
        for (int j = 0; j < N; j++) add_key(j);
    for (int i = 0; i < N; i++) {
        if (causal) add_key(i);
        const double *f = &fq[(size_t)i * C];
        double dn = 0, od = 0;
        for (int c = 0; c < C; c++) dn += f[c] * z[c];
        den[i] = dn + eps;
        for (int m = 0; m < M; m++) {
            double nm = 0;
            for (int c = 0; c < C; c++) nm += f[c] * S[(size_t)c * M + m];
            out[(size_t)i * M + m] = nm / den[i];
            od += dout[(size_t)i * M + m] * out[(size_t)i * M + m];
        }
        gd[i] = od / den[i];
        for (int m = 0; m < M; m++) G[(size_t)i * M + m] = dout[(size_t)i * M + m] / den[i];
        for (int c = 0; c < C; c++) {
            double s = -gd[i] * z[c];
            for (int m = 0; m < M; m++) s += S[(size_t)c * M + m] * G[(size_t)i * M + m];
            dphi[c] = s;
        }
        mp.back(q + (size_t)i * D, f, dphi.data(), dq + (size_t)i * D);
    }
    auto add_query = [&](int i) {
        for (int c = 0; c < C; c++) {
            r[c] -= gd[i] * fq[(size_t)i * C + c];
            for (int m = 0; m < M; m++) R[(size_t)c * M + m] += fq[(size_t)i * C + c] * G[(size_t)i * M + m];
        }
    };
    if (!causal)
        for (int i = 0; i < N; i++) add_query(i);
    for (int j = N - 1; j >= 0; j--) {
        if (causal) add_query(j);
        for (int c = 0; c < C; c++) {
            double s = r[c];
            for (int m = 0; m < M; m++) s += R[(size_t)c * M + m] * v[(size_t)j * M + m];
            dphi[c] = s;
        }
        mp.back(k + (size_t)j * D, &fk[(size_t)j * C], dphi.data(), dk + (size_t)j * D);
        for (int m = 0; m < M; m++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += R[(size_t)c * M + m] * fk[(size_t)j * C + c];
            dv[(size_t)j * M + m] = s;
        }
    }
}

/* ---- the versions ---- */

struct version {
    const char *name;
    bool batched;
    int prec, T, threads, per_sm;
    int prefetch;
};
static const version VERSIONS[] = {
    {"", false, 0, 0, 0, 0, 0},
    {"batched cuBLAS fp32", true, LC_FP32, 64, 0, 0, 0},
    {"fused fp32 T32 256t 2/SM", false, LC_FP32, 32, 256, 2, 0},
    {"fused tf32 T32 256t 2/SM", false, LC_TF32, 32, 256, 2, 0},
    {"fused tf32 T16 256t 2/SM", false, LC_TF32, 16, 256, 2, 0},
    {"fused tf32 T64 256t 2/SM", false, LC_TF32, 64, 256, 2, 0},
    {"fused tf32 T32 128t 2/SM", false, LC_TF32, 32, 128, 2, 0},
    {"fused tf32 T32 256t 4/SM", false, LC_TF32, 32, 256, 4, 0},
    {"fused tf32 T32 256t 1/SM", false, LC_TF32, 32, 256, 1, 0},
    {"fused fp32 T16 256t 2/SM", false, LC_FP32, 16, 256, 2, 0},
    {"fused fp32 T32 128t 2/SM", false, LC_FP32, 32, 128, 2, 0},
    {"fused tf32 T48 256t 1/SM", false, LC_TF32, 48, 256, 1, 0},
    {"fused fp32 T48 256t 1/SM", false, LC_FP32, 48, 256, 1, 0},
    {"fused fp32 T32 256t 2/SM pf", false, LC_FP32, 32, 256, 2, 1},
    {"fused tf32 T32 256t 2/SM pf", false, LC_TF32, 32, 256, 2, 1},
};
static const int N_VERSIONS = (int)(sizeof VERSIONS / sizeof VERSIONS[0]) - 1;

int main(int argc, char **argv) {
    const char *env0 = getenv("LAB_MAP");
    /* polynomial: a smaller default (its float64 reference costs N (1 + D + D^2) M per slice) */
    lab_opts o = env0 && !strcmp(env0, "poly") ? lab_defaults(2, 8, 4096, 64, 64, 1) : lab_defaults(8, 8, 8192, 64, 64, 1);
    if (lab_parse(argc, argv, &o, "lab linear_chunk: linear attention forward and backward (fused chunked kernels)"))
        return 2;
    const char *env = getenv("LAB_MAP");
    const std::string mname = env ? env : "elu";
    const int map = mname == "taylor" ? LC_MAP_TAYLOR
                    : mname == "favor"  ? LC_MAP_FAVOR
                    : mname == "poly"   ? LAB_MAP_POLY
                                        : LC_MAP_ELU;
    const bool poly = map == LAB_MAP_POLY;
    const int B = o.B, H = o.H, N = o.N, D = o.D, M = o.M;
    const bool causal = o.causal;
    const int C = map == LC_MAP_ELU ? D : map == LC_MAP_TAYLOR ? D + 1 : poly ? 1 + D + D * D : 2 * D;
    const double eps = 1e-6;
    const long long BH = (long long)B * H, nq = BH * N * D, nv = BH * N * M;
    float *hq, *hk, *hv, *hd;
    float *q = lab_random((size_t)nq, 1, 1.0f, &hq), *k = lab_random((size_t)nq, 2, 1.0f, &hk);
    float *v = lab_random((size_t)nv, 3, 1.0f, &hv), *dout = lab_random((size_t)nv, 4, 1.0f, &hd);
    float *out = lab_zeros((size_t)nv), *dq = lab_zeros((size_t)nq), *dk = lab_zeros((size_t)nq),
          *dv = lab_zeros((size_t)nv);

    /* favor's projection: the library's draw (seed 7), padded for the kernels */
    ref_map mp = {map, D, C, 1.0, 1.0 / sqrt((double)D), {}};
    float *dW = NULL, *dWT = NULL;
    if (map == LC_MAP_FAVOR) {
        std::vector<float> W((size_t)C * D), Wp((size_t)lc_round16(C) * lc_round16(D)), WTp(Wp.size());
        std::vector<char> scratch(favor_draw_scratch(D));
        favor_draw(7, D, C, scratch.data(), W.data());
        mp.W.assign(W.begin(), W.end());
        lc_favor_pad(W.data(), C, D, Wp.data(), WTp.data());
        LAB_CHECK(ab_cuda_malloc((void **)&dW, Wp.size() * sizeof(float)));
        LAB_CHECK(ab_cuda_malloc((void **)&dWT, Wp.size() * sizeof(float)));
        LAB_CHECK(ab_cuda_memcpy_h2d(dW, Wp.data(), Wp.size() * sizeof(float)));
        LAB_CHECK(ab_cuda_memcpy_h2d(dWT, WTp.data(), Wp.size() * sizeof(float)));
    }

    /* reference of the first (up to) two slices */
    const int ns_ref = BH < 2 ? (int)BH : 2;
    std::vector<double> rout((size_t)ns_ref * N * M), rdq((size_t)ns_ref * N * D), rdk(rdq.size()), rdv(rout.size());
    for (int s = 0; s < ns_ref; s++)
        reference(mp, N, M, causal, eps, hq + (size_t)s * N * D, hk + (size_t)s * N * D, hv + (size_t)s * N * M,
                  hd + (size_t)s * N * M, &rout[(size_t)s * N * M], &rdq[(size_t)s * N * D], &rdk[(size_t)s * N * D],
                  &rdv[(size_t)s * N * M]);

    /* the batched path through the attention API (its own workspace) */
    const char *settings[3] = {"feature_map=elu", "eps=1e-6", "chunk=64"};
    std::string fm = "feature_map=" + mname;
    settings[0] = fm.c_str();
    attn_options ao = {poly ? "polynomial" : "linear", AB_DEV_CUDA, 7, poly ? 2 : 3, poly ? settings + 1 : settings};
    attn *att = NULL;
    LAB_CHECK(attn_create(&ao, &att));
    attn_shape shape = {B, H, N, D, M, causal, NULL};

    ab_cuda_info info;
    LAB_CHECK(ab_cuda_device_info(&info));
    const double fwd_flops = 4.0 * N * C * (M + 1) * BH;
    const double tensor = 4.0 * BH * N, fwd_bytes = tensor * (2 * D + 2 * M), bwd_bytes = tensor * (4 * D + 3 * M),
                 all_bytes = tensor * (4 * D + 4 * M);
    int failed = 0;
    for (int vi = 1; vi <= N_VERSIONS; vi++) {
        if (!lab_wants(&o, vi)) continue;
        const version &ver = VERSIONS[vi];
        lc_cfg c = {poly ? LC_MAP_ELU : map, ver.prec, ver.T, ver.threads, (long long)ver.per_sm * info.sm_count,
                    D, M, C, eps, dW, dWT, ver.prefetch};
        float *ws = NULL;
        std::function<int()> fwd, bwd;
        if (ver.batched) {
            fwd = [&] {
                lin_cuda_path = 1;
                int rc = attn_forward(att, &shape, q, k, v, out, NULL);
                lin_cuda_path = 0;
                return rc;
            };
            bwd = [&] {
                lin_cuda_path = 1;
                int rc = attn_backward(att, &shape, q, k, v, dout, NULL, dq, dk, dv);
                lin_cuda_path = 0;
                return rc;
            };
        } else if (poly) {
            const lp_cfg pc = {ver.prec, ver.T, ver.threads, (long long)ver.per_sm * info.sm_count, D, M, eps, 1.0,
                               1.0 / sqrt((double)D)};
            const size_t need = std::max(lp_smem_bytes(pc, LC_K_DQ), lp_smem_bytes(pc, LC_K_DKV));
            lc_args a = lp_make_args(pc, BH, N, N, causal);
            printf("version %d: T=%d threads=%d segments=%d x %d chunks, shared memory fwd %zu dq %zu dkv %zu bytes\n",
                   vi, pc.T, pc.threads, a.nseg, a.cps, lp_smem_bytes(pc, LC_K_FWD), lp_smem_bytes(pc, LC_K_DQ),
                   lp_smem_bytes(pc, LC_K_DKV));
            if (need > 227 * 1024) {
                printf("version %d %-28s skipped: %zu bytes of shared memory per block\n", vi, ver.name, need);
                continue;
            }
            LAB_CHECK(ab_cuda_malloc((void **)&ws, lp_workspace_floats(pc, BH, N) * sizeof(float)));
            fwd = [&, pc, ws] { return lp_forward(pc, ws, BH, N, N, causal, q, k, v, out, NULL); };
            bwd = [&, pc, ws] { return lp_backward(pc, ws, BH, N, N, causal, q, k, v, dout, dq, dk, dv); };
        } else {
            const size_t need = lc_smem_bytes(c, LC_K_DQ) > lc_smem_bytes(c, LC_K_DKV) ? lc_smem_bytes(c, LC_K_DQ)
                                                                                        : lc_smem_bytes(c, LC_K_DKV);
            lc_args a = lc_make_args(c, BH, N, N, causal);
            printf("version %d: T=%d threads=%d segments=%d x %d chunks, shared memory fwd %zu dq %zu dkv %zu bytes\n",
                   vi, c.T, c.threads, a.nseg, a.cps, lc_smem_bytes(c, LC_K_FWD), lc_smem_bytes(c, LC_K_DQ),
                   lc_smem_bytes(c, LC_K_DKV));
            if (need > 227 * 1024) {
                printf("version %d %-28s skipped: %zu bytes of shared memory per block\n", vi, ver.name, need);
                continue;
            }
            LAB_CHECK(ab_cuda_malloc((void **)&ws, lc_workspace_floats(c, BH, N) * sizeof(float)));
            fwd = [&, c, ws] { return lc_forward(c, ws, BH, N, N, causal, q, k, v, out, NULL, NULL); };
            bwd = [&, c, ws] { return lc_backward(c, ws, BH, N, N, causal, q, k, v, dout, dq, dk, dv); };
        }
        LAB_CHECK(fwd());
        LAB_CHECK(bwd());
        const double eo = lab_max_err(out, rout.data(), rout.size());
        const double eb = fmax(fmax(lab_max_err(dq, rdq.data(), rdq.size()), lab_max_err(dk, rdk.data(), rdk.size())),
                               lab_max_err(dv, rdv.data(), rdv.size()));
        /* tolerances: fp32 sums of N terms of float products (relative to the largest
         * value) well below 1e-4; tf32 products: a few 2^-11 */
        const double tol = (ver.prec == LC_TF32 ? 1e-2 : 1e-4) * (poly ? 4 : 1); /* poly: cancellation in c + q.k */
        const bool timed = !o.check_only;
        const double tf = timed ? lab_time_ms(o.reps, fwd) : -1, tb = timed ? lab_time_ms(o.reps, bwd) : -1;
        const double tfb = timed ? lab_time_ms(o.reps, [&] {
            int rc = fwd();
            return rc ? rc : bwd();
        })
                                 : -1;
        char name[64];
        snprintf(name, sizeof name, "%s fwd", ver.name);
        failed += lab_report(vi, name, eo, tol, tf, fwd_flops, fwd_bytes);
        snprintf(name, sizeof name, "%s bwd", ver.name);
        failed += lab_report(vi, name, eb, tol, tb, 2 * fwd_flops, bwd_bytes);
        snprintf(name, sizeof name, "%s fwd+bwd", ver.name);
        failed += lab_report(vi, name, fmax(eo, eb), tol, tfb, 3 * fwd_flops, all_bytes);
        ab_cuda_free(ws);
    }
    attn_destroy(att);
    free(hq), free(hk), free(hv), free(hd);
    ab_cuda_free(q), ab_cuda_free(k), ab_cuda_free(v), ab_cuda_free(dout);
    ab_cuda_free(out), ab_cuda_free(dq), ab_cuda_free(dk), ab_cuda_free(dv);
    ab_cuda_free(dW), ab_cuda_free(dWT);
    return failed ? 1 : 0;
}
