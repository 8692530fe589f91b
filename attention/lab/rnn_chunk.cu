/* Lab: the linear-RNN family's chunked forms on CUDA (deltanet_wy_cuda.cu, gla_cuda.cu),
 * forward + backward through the library (attn_forward, attn_backward), against their
 * recurrences and with the carry kernels' warps set, beside linear attention:
 *   deltanet (causal only; beta = sigmoid(normal), per position):
 *     version 1: the scan (chunk=1)
 *     version 2: the WY form, chunk 16 (the default), carry kernels on 1 warp
 *     version 3: the WY form, chunk 16, the library's warps (about 8 rows a warp)
 *     version 4: the WY form, chunk 32
 *     version 5: the WY form, chunk 64 (the reverse kernel then fits 1 warp only)
 *   gla (log-gates -0.1 +- 0.02, the sweep's):
 *     version 6: vector gate, the recurrence (chunk=1, register kernels)
 *     version 7: vector gate, chunk 32 (the default), the carry on 1 warp
 *     version 8: vector gate, chunk 32, the library's warps
 *     version 9: vector gate, chunk 16
 *     version 10: scalar gate, chunk 32
 *   version 11: linear (elu), the library's default path: the peer of the issue's
 *     "within 2x of linear" target.
 * Reference: the variant's CPU backend at the same options (chunk=auto), on every slice;
 * the CPU backends are held to the float64 references by the test suites. Error: the
 * largest of out, dq, dk, dv and the aux gradient (dbeta, dg), each relative to the
 * reference's largest value; tolerance 1e-4 (the suites' BWD_TOL: float sums over N
 * positions in another order; measured on the emulator: below 1e-6). Rates: attn_flops
 * (forward + backward) and the minimal bytes of q, k, v, out and their gradients, with
 * the aux input and its gradient. --causal is ignored (deltanet is causal only; gla and
 * linear run causal too, the issue's shape). The scan versions (1, 6) take at most 3
 * timed repetitions: each is N dependent steps. */
#include "lab.h"

#include "../attention.h"
#include "../deltanet_cuda.h"
#include "../gla_cuda.h"

#include <string>
#include <vector>

struct version {
    const char *name, *variant;
    const char *settings[2];
    int n_settings;
    int warps; /* the carry kernels' warps (0: the library's choice) */
    bool scan;
};

static const version VERSIONS[] = {
    {"", "", {NULL, NULL}, 0, 0, false},
    {"deltanet scan (chunk=1)", "deltanet", {"chunk=1", NULL}, 1, 0, true},
    {"deltanet chunk 16, 1 warp", "deltanet", {"chunk=16", NULL}, 1, 1, false},
    {"deltanet chunk 16 (library)", "deltanet", {"chunk=16", NULL}, 1, 0, false},
    {"deltanet chunk 32", "deltanet", {"chunk=32", NULL}, 1, 0, false},
    {"deltanet chunk 64", "deltanet", {"chunk=64", NULL}, 1, 0, false},
    {"gla vector, chunk=1", "gla", {"gate=vector", "chunk=1"}, 2, 0, true},
    {"gla vector 32, 1 warp", "gla", {"gate=vector", "chunk=32"}, 2, 1, false},
    {"gla vector 32 (library)", "gla", {"gate=vector", "chunk=32"}, 2, 0, false},
    {"gla vector 16", "gla", {"gate=vector", "chunk=16"}, 2, 0, false},
    {"gla scalar 32", "gla", {"gate=scalar", "chunk=32"}, 2, 0, false},
    {"linear elu (library)", "linear", {"feature_map=elu", NULL}, 1, 0, false},
};
#define N_VERSIONS 11

/* The CPU's results for one variant's options (the reference of every version of it). */
struct reference {
    std::string key;
    std::vector<double> out, dq, dk, dv, daux;
};

static std::vector<double> widen(const std::vector<float> &x) { return std::vector<double>(x.begin(), x.end()); }

/* Runs forward and backward of `variant` with `settings` on the CPU from host inputs. */
static reference cpu_reference(const char *variant, const char *const *settings, int n_settings, const attn_shape &s,
                               const float *q, const float *k, const float *v, const float *dout, const float *aux,
                               size_t n_aux) {
    attn_options ao = {variant, AB_DEV_CPU, 7, n_settings, settings};
    attn *a = NULL;
    LAB_CHECK(attn_create(&ao, &a));
    const size_t nq = (size_t)s.batch * s.heads * s.len * s.qk_dim, nv = (size_t)s.batch * s.heads * s.len * s.v_dim;
    std::vector<float> out(nv), dq(nq), dk(nq), dv(nv), daux(n_aux ? n_aux : 1);
    if (n_aux) LAB_CHECK(attn_bind_aux(a, aux, daux.data()));
    std::vector<char> saved(attn_saved_bytes(a, &s) + 1);
    LAB_CHECK(attn_forward(a, &s, q, k, v, out.data(), saved.data()));
    LAB_CHECK(attn_backward(a, &s, q, k, v, dout, saved.data(), dq.data(), dk.data(), dv.data()));
    attn_destroy(a);
    reference r;
    r.out = widen(out), r.dq = widen(dq), r.dk = widen(dk), r.dv = widen(dv);
    if (n_aux) r.daux = widen(daux);
    return r;
}

int main(int argc, char **argv) {
    lab_opts o = lab_defaults(2, 8, 4096, 64, 64, 1);
    if (lab_parse(argc, argv, &o, "lab rnn_chunk: deltanet and gla, chunked and scanned, beside linear")) return 2;
    const int B = o.B, H = o.H, N = o.N, D = o.D, M = o.M;
    const long long BH = (long long)B * H;
    const size_t nq = (size_t)BH * N * D, nv = (size_t)BH * N * M, nr = (size_t)BH * N;
    float *hq, *hk, *hv, *hd, *hb, *hg;
    float *q = lab_random(nq, 1, 1.0f, &hq), *k = lab_random(nq, 2, 1.0f, &hk), *v = lab_random(nv, 3, 1.0f, &hv);
    float *dout = lab_random(nv, 4, 1.0f, &hd);
    /* beta = sigmoid(normal); log-gates -0.1 + 0.02 normal, at most 0 (per key dimension:
     * the scalar gate reads the first nr of them) */
    float *beta = lab_random(nr, 5, 1.0f, &hb), *gate = lab_random(nq, 6, 0.02f, &hg);
    for (size_t i = 0; i < nr; i++) hb[i] = 1.0f / (1.0f + expf(-hb[i]));
    for (size_t i = 0; i < nq; i++) hg[i] = fminf(0.0f, hg[i] - 0.1f);
    LAB_CHECK(ab_cuda_memcpy_h2d(beta, hb, sizeof(float) * nr));
    LAB_CHECK(ab_cuda_memcpy_h2d(gate, hg, sizeof(float) * nq));
    float *out = lab_zeros(nv), *dq = lab_zeros(nq), *dk = lab_zeros(nq), *dv = lab_zeros(nv), *daux = lab_zeros(nq);
    attn_shape s = {B, H, N, D, M, true, NULL};

    std::vector<reference> refs;
    int failed = 0;
    for (int vi = 1; vi <= N_VERSIONS; vi++) {
        if (!lab_wants(&o, vi)) continue;
        const version &ver = VERSIONS[vi];
        const bool is_dn = !strcmp(ver.variant, "deltanet"), is_gla = !strcmp(ver.variant, "gla");
        const bool scalar = is_gla && !strcmp(ver.settings[0], "gate=scalar");
        const size_t n_aux = is_dn ? nr : is_gla ? (scalar ? nr : nq) : 0;
        const float *h_aux = is_dn ? hb : hg, *d_aux = is_dn ? beta : gate;
        /* the reference: the CPU at chunk=auto (the gate's kind kept) */
        const std::string key = std::string(ver.variant) + (scalar ? " scalar" : "");
        const reference *ref = NULL;
        for (const reference &r : refs)
            if (r.key == key) ref = &r;
        if (!ref) {
            const char *cs[1] = {ver.settings[0]}; /* deltanet: none (its chunk) */
            refs.push_back(cpu_reference(ver.variant, cs, is_dn ? 0 : 1, s, hq, hk, hv, hd, h_aux, n_aux));
            refs.back().key = key;
            ref = &refs.back();
        }
        attn_options ao = {ver.variant, AB_DEV_CUDA, 7, ver.n_settings, ver.settings};
        attn *a = NULL;
        LAB_CHECK(attn_create(&ao, &a));
        if (n_aux) LAB_CHECK(attn_bind_aux(a, d_aux, daux));
        void *saved = NULL;
        const size_t sb = attn_saved_bytes(a, &s);
        if (sb) LAB_CHECK(ab_cuda_malloc(&saved, sb));
        dn_cuda_carry_warps = is_dn ? ver.warps : 0;
        gla_cuda_carry_warps = is_gla ? ver.warps : 0;
        auto fwd_bwd = [&] {
            int rc = attn_forward(a, &s, q, k, v, out, saved);
            return rc ? rc : attn_backward(a, &s, q, k, v, dout, saved, dq, dk, dv);
        };
        LAB_CHECK(fwd_bwd());
        double err = fmax(fmax(lab_max_err(out, ref->out.data(), nv), lab_max_err(dq, ref->dq.data(), nq)),
                          fmax(lab_max_err(dk, ref->dk.data(), nq), lab_max_err(dv, ref->dv.data(), nv)));
        if (n_aux) err = fmax(err, lab_max_err(daux, ref->daux.data(), n_aux));
        const double ms = o.check_only ? -1 : lab_time_ms(ver.scan && o.reps > 3 ? 3 : o.reps, fwd_bwd);
        const double flops = attn_flops(a, &s, true);
        /* read q, k, v, dout and the aux input; write out, dq, dk, dv and its gradient */
        const double bytes = 4.0 * (4.0 * nq + 4.0 * nv + 2.0 * n_aux);
        failed += lab_report(vi, ver.name, err, 1e-4, ms, flops == flops ? flops : 0.0, bytes);
        dn_cuda_carry_warps = 0, gla_cuda_carry_warps = 0;
        ab_cuda_free(saved);
        attn_destroy(a);
    }
    free(hq), free(hk), free(hv), free(hd), free(hb), free(hg);
    ab_cuda_free(q), ab_cuda_free(k), ab_cuda_free(v), ab_cuda_free(dout), ab_cuda_free(beta), ab_cuda_free(gate);
    ab_cuda_free(out), ab_cuda_free(dq), ab_cuda_free(dk), ab_cuda_free(dv), ab_cuda_free(daux);
    return failed ? 1 : 0;
}
