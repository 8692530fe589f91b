#include "mha.h"

#include "layers_dev.h"

#include "../harness/error.h"

void mha_carve_params(tf_table *t, mha_params *p, int C, size_t proj_count, int proj_len) {
    p->wqkv = tf_carve_f(t, "wqkv", true, 2, 3 * (int64_t)C, C, 0, 0);
    p->bqkv = tf_carve_f(t, "bqkv", false, 1, 3 * (int64_t)C, 0, 0, 0);
    p->wo = tf_carve_f(t, "wo", true, 2, C, C, 0, 0);
    p->bo = tf_carve_f(t, "bo", false, 1, C, 0, 0, 0);
    /* a variant without parameters adds no entry (the table, and so every tensor's
     * initialisation stream, stays what it was before variants could have any) */
    p->proj = proj_count ? tf_carve_f(t, "proj", true, 1, (int64_t)proj_count, 0, 0, 0) : NULL;
    p->proj_len = proj_len;
}

/* The layer's attention parameters bound to the (shared) attention object, with their
 * gradient for backward (g NULL: forward). */
static int bind(attn *a, const mha_params *p, const mha_params *g) {
    if (!p->proj) return 0;
    return attn_bind_params(a, p->proj_len, p->proj, g ? g->proj : NULL);
}

void mha_carve_acts(tf_table *t, mha_acts *a, int B, int N, int C, size_t saved_bytes) {
    a->q = tf_carve_f(t, "q", false, 3, B, N, C, 0); /* (B, H, N, D) has B*N*C elements */
    a->k = tf_carve_f(t, "k", false, 3, B, N, C, 0);
    a->v = tf_carve_f(t, "v", false, 3, B, N, C, 0);
    a->merged = tf_carve_f(t, "merged", false, 3, B, N, C, 0);
    a->saved = tf_carve(t, "attn_saved", 1, false, 1, (int64_t)saved_bytes, 0, 0, 0);
}

void mha_carve_scratch(tf_table *t, mha_scratch *s, int B, int N, int C) {
    s->qkv = tf_carve_f(t, "qkv", false, 3, B, N, 3 * (int64_t)C, 0);
    s->att = tf_carve_f(t, "att", false, 3, B, N, C, 0);
    s->dq = tf_carve_f(t, "dq", false, 3, B, N, C, 0);
    s->dk = tf_carve_f(t, "dk", false, 3, B, N, C, 0);
    s->dv = tf_carve_f(t, "dv", false, 3, B, N, C, 0);
    s->dmerged = tf_carve_f(t, "dmerged", false, 3, B, N, C, 0);
}

attn_shape mha_shape(const mha_dims *d) {
    attn_shape s = {d->B, d->H, d->N, d->C / d->H, d->C / d->H, d->causal, d->lengths};
    return s;
}

int mha_forward(attn *a, const mha_dims *d, const mha_run *run, float *out, const float *x, const mha_params *p,
                mha_acts *act, mha_scratch *ws) {
    int BT = d->B * d->N, C = d->C;
    ab_device dev = d->device;
    int rc;
    if ((rc = ld_dense_forward(dev, ws->qkv, x, p->wqkv, p->bqkv, BT, C, 3 * C))) return rc; /* (B, N, 3C) */
    if ((rc = ld_heads_split(dev, act->q, act->k, act->v, ws->qkv, d->B, d->N, C, d->H))) return rc;
    attn_shape s = mha_shape(d);
    if ((rc = bind(a, p, NULL))) return rc;
    if (!run || run->mode == MHA_PARALLEL) {
        rc = attn_forward(a, &s, act->q, act->k, act->v, ws->att, act->saved);
    } else if (run->mode == MHA_INFER) {
        rc = attn_forward(a, &s, act->q, act->k, act->v, ws->att, attn_can_forward_unsaved(a) ? NULL : act->saved);
    } else if (run->mode == MHA_PREFILL) {
        rc = attn_prefill(a, run->state, d->N, act->q, act->k, act->v, ws->att);
    } else {
        if (d->N != 1) return ab_fail(AB_EINVAL, "mha_forward: a recurrent step takes one position (N = %d)", d->N);
        rc = attn_step(a, run->state, run->t, act->q, act->k, act->v, ws->att);
    }
    if (rc) return rc;
    if ((rc = ld_heads_merge(dev, act->merged, ws->att, d->B, d->N, C, d->H))) return rc;
    return ld_dense_forward(dev, out, act->merged, p->wo, p->bo, BT, C, C);
}

int mha_step_forward(attn *a, const mha_dims *d, const mha_run *run, float *out, const float *x, const mha_params *p,
                     mha_acts *act, mha_scratch *ws) {
    if (!run || run->mode != MHA_STEP || d->N != 1)
        return ab_fail(AB_EINVAL, "mha_step_forward: a recurrent step of one position (N = %d)", d->N);
    const int B = d->B, C = d->C;
    ab_device dev = d->device;
    int rc;
    if ((rc = ld_dense_forward(dev, ws->qkv, x, p->wqkv, NULL, B, C, 3 * C))) return rc; /* (B, 3C), no bias */
    if ((rc = ld_bias_heads_split(dev, act->q, act->k, act->v, ws->qkv, p->bqkv, B, 1, C, d->H))) return rc;
    if ((rc = bind(a, p, NULL))) return rc;
    if ((rc = attn_step(a, run->state, run->t, act->q, act->k, act->v, ws->att))) return rc;
    return ld_dense_forward(dev, out, ws->att, p->wo, NULL, B, C, C); /* ws->att (B, H, 1, D) = (B, 1, C) */
}

int mha_backward(attn *a, const mha_dims *d, float *dx, const mha_params *g, const float *dout, const float *x,
                 const mha_params *p, const mha_acts *act, mha_scratch *ws) {
    int BT = d->B * d->N, C = d->C;
    size_t n = (size_t)BT * C;
    ab_device dev = d->device;
    int rc;
    if ((rc = ld_zero(dev, ws->dmerged, sizeof(float) * n))) return rc;
    if ((rc = ld_dense_backward(dev, ws->dmerged, g->wo, g->bo, dout, act->merged, p->wo, BT, C, C))) return rc;
    if ((rc = ld_heads_unmerge(dev, ws->att, ws->dmerged, d->B, d->N, C, d->H))) return rc; /* datt (B, H, N, D) */
    attn_shape s = mha_shape(d);
    /* attn_backward overwrites dq, dk, dv (and adds into g->proj) */
    if ((rc = bind(a, p, g))) return rc;
    rc = attn_backward(a, &s, act->q, act->k, act->v, ws->att, act->saved, ws->dq, ws->dk, ws->dv);
    if (rc) return rc;
    if ((rc = ld_heads_join(dev, ws->qkv, ws->dq, ws->dk, ws->dv, d->B, d->N, C, d->H))) return rc; /* dqkv */
    return ld_dense_backward(dev, dx, g->wqkv, g->bqkv, ws->qkv, x, p->wqkv, BT, C, 3 * C);
}
