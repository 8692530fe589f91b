/* Memory traffic of an attention variant on the emulated device (traffic_util.h). */
#include "traffic_util.h"

#include "cuda_device.h"
#include "device.h"
#include "error.h"
#include "sweep.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>

double tt_dram(const tt_traffic *t) { return (double)t->total.dram_read + (double)t->total.dram_write; }
double tt_requested(const tt_traffic *t) { return (double)t->total.req_read + (double)t->total.req_write; }
double tt_min(const tt_traffic *t) { return t->min_read + t->min_write; }

/* n floats normal(0, 1) from (seed, stream), in new device memory. */
static int device_normal(float **out, size_t n, uint64_t seed, uint64_t stream) {
    *out = NULL;
    if (n == 0) return 0;
    float *h = tu_normal(n, seed, stream, 1.0);
    int rc = h ? ab_dev_malloc(AB_DEV_CUDA, (void **)out, n * sizeof(float)) : AB_ENOMEM;
    if (!rc) rc = ab_dev_upload(AB_DEV_CUDA, *out, h, n * sizeof(float));
    free(h);
    return rc;
}

static int create(const char *variant, const char *const *settings, int n_settings, uint64_t seed, attn **a) {
    int rc = ab_cuda_init();
    if (rc) return rc;
    attn_options o = {variant, AB_DEV_CUDA, seed, n_settings, settings};
    return attn_create(&o, a);
}

static void finish(tt_traffic *out) {
    out->counted = ab_cuda_traffic_counted();
    ab_cuda_traffic_total(&out->total, &out->h2d, &out->d2h);
}

int tt_fwd_bwd(const char *variant, const char *const *settings, int n_settings, const attn_shape *s, uint64_t seed,
               tt_traffic *out) {
    *out = (tt_traffic){0};
    attn *a = NULL;
    int rc = create(variant, settings, n_settings, seed, &a);
    if (rc) return rc;
    const size_t bh = (size_t)s->batch * s->heads, nq = bh * s->len * s->qk_dim, nv = bh * s->len * s->v_dim;
    size_t np = 0;
    float *q = NULL, *k = NULL, *v = NULL, *dout = NULL, *o = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    float *par = NULL, *dpar = NULL;
    void *saved = NULL;
    rc = attn_param_count(a, s->len, &np);
    if (!rc && np) { /* linformer's projections */
        float *h = malloc(np * sizeof(float));
        rc = h ? attn_param_init(a, s->len, seed, 4, h) : AB_ENOMEM;
        if (!rc) rc = ab_dev_malloc(AB_DEV_CUDA, (void **)&par, np * sizeof(float));
        if (!rc) rc = ab_dev_upload(AB_DEV_CUDA, par, h, np * sizeof(float));
        if (!rc) rc = ab_dev_malloc(AB_DEV_CUDA, (void **)&dpar, np * sizeof(float));
        if (!rc) rc = ab_dev_memset(AB_DEV_CUDA, dpar, 0, np * sizeof(float));
        if (!rc) rc = attn_bind_params(a, s->len, par, dpar);
        free(h);
    }
    if (!rc) rc = device_normal(&q, nq, seed, 0);
    if (!rc) rc = device_normal(&k, nq, seed, 1);
    if (!rc) rc = device_normal(&v, nv, seed, 2);
    if (!rc) rc = device_normal(&dout, nv, seed, 3);
    if (!rc) rc = ab_dev_malloc(AB_DEV_CUDA, (void **)&o, nv * sizeof(float));
    if (!rc) rc = ab_dev_malloc(AB_DEV_CUDA, (void **)&dq, nq * sizeof(float));
    if (!rc) rc = ab_dev_malloc(AB_DEV_CUDA, (void **)&dk, nq * sizeof(float));
    if (!rc) rc = ab_dev_malloc(AB_DEV_CUDA, (void **)&dv, nv * sizeof(float));
    if (!rc) rc = ab_dev_malloc(AB_DEV_CUDA, &saved, attn_saved_bytes(a, s));
    if (!rc) rc = attn_reserve(a, s);
    if (!rc) rc = ab_dev_sync(AB_DEV_CUDA);
    if (!rc) {
        ab_cuda_traffic_start();
        rc = attn_forward(a, s, q, k, v, o, saved);
        if (!rc) rc = attn_backward(a, s, q, k, v, dout, saved, dq, dk, dv);
        if (!rc) rc = ab_dev_sync(AB_DEV_CUDA);
        ab_cuda_traffic_stop();
        finish(out);
        sweep_min_bytes_parallel(s, np, true, &out->min_read, &out->min_write);
    }
    float *bufs[] = {q, k, v, dout, o, dq, dk, dv, par, dpar};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) ab_dev_free(AB_DEV_CUDA, bufs[i]);
    ab_dev_free(AB_DEV_CUDA, saved);
    attn_destroy(a);
    return rc;
}

int tt_step(const char *variant, const char *const *settings, int n_settings, const attn_shape *s, uint64_t seed,
            tt_traffic *out) {
    *out = (tt_traffic){0};
    attn *a = NULL;
    int rc = create(variant, settings, n_settings, seed, &a);
    if (rc) return rc;
    const int P = s->len;
    const size_t bh = (size_t)s->batch * s->heads;
    attn_shape st = *s;
    st.causal = true;
    st.lengths = NULL;
    attn_state *state = NULL;
    float *q = NULL, *k = NULL, *v = NULL, *qt = NULL, *kt = NULL, *vt = NULL, *ot = NULL;
    rc = attn_state_create(a, &st, P + 1, &state);
    if (!rc) rc = device_normal(&q, bh * P * s->qk_dim, seed, 10);
    if (!rc) rc = device_normal(&k, bh * P * s->qk_dim, seed, 11);
    if (!rc) rc = device_normal(&v, bh * P * s->v_dim, seed, 12);
    if (!rc) rc = device_normal(&qt, bh * s->qk_dim, seed, 13);
    if (!rc) rc = device_normal(&kt, bh * s->qk_dim, seed, 14);
    if (!rc) rc = device_normal(&vt, bh * s->v_dim, seed, 15);
    if (!rc) rc = ab_dev_malloc(AB_DEV_CUDA, (void **)&ot, bh * s->v_dim * sizeof(float));
    if (!rc && P > 0) rc = attn_prefill(a, state, P, q, k, v, NULL);
    if (!rc) rc = ab_dev_sync(AB_DEV_CUDA);
    if (!rc) rc = sweep_min_bytes_step(a, &st, P, &out->min_read, &out->min_write);
    if (!rc) {
        ab_cuda_traffic_start();
        rc = attn_step(a, state, P, qt, kt, vt, ot);
        if (!rc) rc = ab_dev_sync(AB_DEV_CUDA);
        ab_cuda_traffic_stop();
        finish(out);
        out->position = P;
    }
    float *bufs[] = {q, k, v, qt, kt, vt, ot};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) ab_dev_free(AB_DEV_CUDA, bufs[i]);
    attn_state_destroy(state);
    attn_destroy(a);
    return rc;
}

void tt_print(const char *label, const tt_traffic *t) {
    const double mib = 1048576.0;
    fprintf(stderr,
            "traffic: %s: %llu launches, DRAM %.3f MiB read + %.3f MiB written, requested %.3f MiB, minimal %.3f "
            "MiB: DRAM/min %.2f, requested/min %.2f\n",
            label, t->total.launches, t->total.dram_read / mib, t->total.dram_write / mib, tt_requested(t) / mib,
            tt_min(t) / mib, tt_dram(t) / tt_min(t), tt_requested(t) / tt_min(t));
    for (int i = 0, n = ab_cuda_traffic_entries(); i < n; i++) {
        ab_traffic_kind kind;
        ab_traffic_counts c;
        const char *name = ab_cuda_traffic_entry(i, &kind, &c);
        fprintf(stderr, "traffic:     %-32s %-6s %4llu launches, DRAM %.3f + %.3f MiB, requested %.3f + %.3f MiB\n",
                name, ab_traffic_kind_name(kind), c.launches, c.dram_read / mib, c.dram_write / mib, c.req_read / mib,
                c.req_write / mib);
    }
}
