#include "mha.h"

#include "layers_dev.h"

#include "../harness/error.h"

#include <string.h>

/* GLA's low-rank gate projection (Yang et al. 2023): rank 16. */
#define MHA_GATE_RANK 16

int mha_aux_of(const char *name, int width, mha_aux *out) {
    *out = (mha_aux){0, 0, GATE_ACT_SIGMOID};
    if (!name) return 0;
    if (width < 1) return ab_fail(AB_EINVAL, "the attention's input %s has width %d", name, width);
    if (strcmp(name, "g") == 0) *out = (mha_aux){width, MHA_GATE_RANK, GATE_ACT_LOGSIGMOID16};
    else if (strcmp(name, "beta") == 0) *out = (mha_aux){width, 0, GATE_ACT_SIGMOID};
    else return ab_fail(AB_EINVAL, "the model has no rule to make the attention's input '%s'", name);
    return 0;
}

void mha_carve_params(tf_table *t, mha_params *p, int C, int H, size_t proj_count, int proj_len, const mha_aux *aux) {
    p->wqkv = tf_carve_f(t, "wqkv", true, 2, 3 * (int64_t)C, C, 0, 0);
    p->bqkv = tf_carve_f(t, "bqkv", false, 1, 3 * (int64_t)C, 0, 0, 0);
    p->wo = tf_carve_f(t, "wo", true, 2, C, C, 0, 0);
    p->bo = tf_carve_f(t, "bo", false, 1, C, 0, 0, 0);
    /* a variant without parameters adds no entry (the table, and so every tensor's
     * initialisation stream, stays what it was before variants could have any) */
    p->proj = proj_count ? tf_carve_f(t, "proj", true, 1, (int64_t)proj_count, 0, 0, 0) : NULL;
    p->proj_len = proj_len;
    p->aux = *aux;
    p->aux_w1 = p->aux_w2 = p->aux_b = NULL;
    if (aux->width) {
        const int64_t HW = (int64_t)H * aux->width, R = aux->rank;
        p->aux_w1 = tf_carve_f(t, "aux.w1", true, 2, R ? R : HW, C, 0, 0);
        if (R) p->aux_w2 = tf_carve_f(t, "aux.w2", true, 2, HW, R, 0, 0);
        p->aux_b = tf_carve_f(t, "aux.b", false, 1, HW, 0, 0, 0);
    }
}

/* The layer's attention parameters bound to the (shared) attention object, with their
 * gradient for backward (g NULL: forward). */
static int bind(attn *a, const mha_params *p, const mha_params *g) {
    if (!p->proj) return 0;
    return attn_bind_params(a, p->proj_len, p->proj, g ? g->proj : NULL);
}

void mha_carve_acts(tf_table *t, mha_acts *a, int B, int N, int C, int H, size_t saved_bytes, const mha_aux *aux) {
    a->q = tf_carve_f(t, "q", false, 3, B, N, C, 0); /* (B, H, N, D) has B*N*C elements */
    a->k = tf_carve_f(t, "k", false, 3, B, N, C, 0);
    a->v = tf_carve_f(t, "v", false, 3, B, N, C, 0);
    a->merged = tf_carve_f(t, "merged", false, 3, B, N, C, 0);
    a->saved = tf_carve(t, "attn_saved", 1, false, 1, (int64_t)saved_bytes, 0, 0, 0);
    a->aux = a->aux_z1 = NULL;
    if (aux->width) {
        a->aux = tf_carve_f(t, "aux", false, 3, B, N, (int64_t)H * aux->width, 0);
        if (aux->rank) a->aux_z1 = tf_carve_f(t, "aux_z1", false, 3, B, N, aux->rank, 0);
    }
}

void mha_carve_scratch(tf_table *t, mha_scratch *s, int B, int N, int C, int H, const mha_aux *aux) {
    s->qkv = tf_carve_f(t, "qkv", false, 3, B, N, 3 * (int64_t)C, 0);
    s->att = tf_carve_f(t, "att", false, 3, B, N, C, 0);
    s->dq = tf_carve_f(t, "dq", false, 3, B, N, C, 0);
    s->dk = tf_carve_f(t, "dk", false, 3, B, N, C, 0);
    s->dv = tf_carve_f(t, "dv", false, 3, B, N, C, 0);
    s->dmerged = tf_carve_f(t, "dmerged", false, 3, B, N, C, 0);
    s->aux_z = s->daux = s->aux_dz1 = NULL;
    if (aux->width) {
        s->aux_z = tf_carve_f(t, "aux_z", false, 3, B, N, (int64_t)H * aux->width, 0);
        s->daux = tf_carve_f(t, "daux", false, 3, B, N, (int64_t)H * aux->width, 0);
        if (aux->rank) s->aux_dz1 = tf_carve_f(t, "aux_dz1", false, 3, B, N, aux->rank, 0);
    }
}

/* The attention's own input from x (B, N, C) into act->aux (B, H, N, W), bound to the
 * attention (mha_aux); nothing for a variant without one. */
static int aux_forward(attn *a, const mha_dims *d, const float *x, const mha_params *p, mha_acts *act,
                       mha_scratch *ws) {
    if (!p->aux.width) return 0;
    const int BT = d->B * d->N, C = d->C, HW = d->H * p->aux.width, R = p->aux.rank;
    const ab_device dev = d->device;
    int rc;
    if (R) {
        if ((rc = ld_dense_forward(dev, act->aux_z1, x, p->aux_w1, NULL, BT, C, R)) ||
            (rc = ld_dense_forward(dev, ws->aux_z, act->aux_z1, p->aux_w2, p->aux_b, BT, R, HW)))
            return rc;
    } else if ((rc = ld_dense_forward(dev, ws->aux_z, x, p->aux_w1, p->aux_b, BT, C, HW))) {
        return rc;
    }
    if ((rc = ld_gate_act_forward(dev, ws->aux_z, (size_t)BT * HW, p->aux.act)) ||
        (rc = ld_heads_unmerge(dev, act->aux, ws->aux_z, d->B, d->N, HW, d->H)))
        return rc;
    return attn_bind_aux(a, act->aux, NULL);
}

/* After attn_backward wrote ws->daux: through the activation and the projection into
 * dx and the projection's gradients (+=). */
static int aux_backward(const mha_dims *d, float *dx, const mha_params *g, const float *x, const mha_params *p,
                        const mha_acts *act, mha_scratch *ws) {
    const int BT = d->B * d->N, C = d->C, HW = d->H * p->aux.width, R = p->aux.rank;
    const ab_device dev = d->device;
    int rc;
    /* dy -> dz in the heads' layout (the activation is element-wise), then merged */
    if ((rc = ld_gate_act_backward(dev, ws->daux, act->aux, (size_t)BT * HW, p->aux.act)) ||
        (rc = ld_heads_merge(dev, ws->aux_z, ws->daux, d->B, d->N, HW, d->H)))
        return rc;
    if (!R) return ld_dense_backward(dev, dx, g->aux_w1, g->aux_b, ws->aux_z, x, p->aux_w1, BT, C, HW);
    if ((rc = ld_zero(dev, ws->aux_dz1, sizeof(float) * (size_t)BT * R)) ||
        (rc = ld_dense_backward(dev, ws->aux_dz1, g->aux_w2, g->aux_b, ws->aux_z, act->aux_z1, p->aux_w2, BT, R, HW)))
        return rc;
    return ld_dense_backward(dev, dx, g->aux_w1, NULL, ws->aux_dz1, x, p->aux_w1, BT, C, R);
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
    if ((rc = bind(a, p, NULL)) || (rc = aux_forward(a, d, x, p, act, ws))) return rc;
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
    if ((rc = bind(a, p, NULL)) || (rc = aux_forward(a, d, x, p, act, ws))) return rc;
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
    if (p->aux.width && (rc = attn_bind_aux(a, act->aux, ws->daux))) return rc;
    rc = attn_backward(a, &s, act->q, act->k, act->v, ws->att, act->saved, ws->dq, ws->dk, ws->dv);
    if (rc) return rc;
    if (p->aux.width && (rc = aux_backward(d, dx, g, x, p, act, ws))) return rc;
    if ((rc = ld_heads_join(dev, ws->qkv, ws->dq, ws->dk, ws->dv, d->B, d->N, C, d->H))) return rc; /* dqkv */
    return ld_dense_backward(dev, dx, g->wqkv, g->bqkv, ws->qkv, x, p->wqkv, BT, C, 3 * C);
}
