#include "mha.h"

#include "layers.h"

#include "../harness/error.h"

#include <string.h>

#define MHA_PAR_MIN 16384

void mha_carve_params(tf_table *t, mha_params *p, int C) {
    p->wqkv = tf_carve_f(t, "wqkv", true, 2, 3 * (int64_t)C, C, 0, 0);
    p->bqkv = tf_carve_f(t, "bqkv", false, 1, 3 * (int64_t)C, 0, 0, 0);
    p->wo = tf_carve_f(t, "wo", true, 2, C, C, 0, 0);
    p->bo = tf_carve_f(t, "bo", false, 1, C, 0, 0, 0);
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

/* qkv (B, N, 3C) -> q, k, v (B, H, N, D) */
static void split_heads(const mha_dims *d, const float *qkv, float *q, float *k, float *v) {
    int B = d->B, N = d->N, C = d->C, H = d->H, D = C / H;
#pragma omp parallel for schedule(static) collapse(2) if ((size_t)B * N * C > MHA_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            const float *row = qkv + ((size_t)b * N + n) * 3 * C;
            for (int h = 0; h < H; h++) {
                size_t dst = (((size_t)b * H + h) * N + n) * D;
                memcpy(q + dst, row + h * D, sizeof(float) * (size_t)D);
                memcpy(k + dst, row + C + h * D, sizeof(float) * (size_t)D);
                memcpy(v + dst, row + 2 * C + h * D, sizeof(float) * (size_t)D);
            }
        }
}

/* dq, dk, dv (B, H, N, D) -> dqkv (B, N, 3C) (overwritten) */
static void join_heads(const mha_dims *d, const float *dq, const float *dk, const float *dv, float *dqkv) {
    int B = d->B, N = d->N, C = d->C, H = d->H, D = C / H;
#pragma omp parallel for schedule(static) collapse(2) if ((size_t)B * N * C > MHA_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            float *row = dqkv + ((size_t)b * N + n) * 3 * C;
            for (int h = 0; h < H; h++) {
                size_t src = (((size_t)b * H + h) * N + n) * D;
                memcpy(row + h * D, dq + src, sizeof(float) * (size_t)D);
                memcpy(row + C + h * D, dk + src, sizeof(float) * (size_t)D);
                memcpy(row + 2 * C + h * D, dv + src, sizeof(float) * (size_t)D);
            }
        }
}

/* (B, H, N, D) -> (B, N, C) when to_merged, else the reverse */
static void merge_heads(const mha_dims *d, float *merged, float *heads, bool to_merged) {
    int B = d->B, N = d->N, C = d->C, H = d->H, D = C / H;
#pragma omp parallel for schedule(static) collapse(2) if ((size_t)B * N * C > MHA_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            float *row = merged + ((size_t)b * N + n) * C;
            for (int h = 0; h < H; h++) {
                float *hd = heads + (((size_t)b * H + h) * N + n) * D;
                if (to_merged) memcpy(row + h * D, hd, sizeof(float) * (size_t)D);
                else memcpy(hd, row + h * D, sizeof(float) * (size_t)D);
            }
        }
}

int mha_forward(attn *a, const mha_dims *d, const mha_run *run, float *out, const float *x, const mha_params *p,
                mha_acts *act, mha_scratch *ws) {
    int BT = d->B * d->N, C = d->C;
    dense_forward(ws->qkv, x, p->wqkv, p->bqkv, BT, C, 3 * C); /* (B, N, 3C) */
    split_heads(d, ws->qkv, act->q, act->k, act->v);
    attn_shape s = mha_shape(d);
    int rc;
    if (!run || run->mode == MHA_PARALLEL) {
        rc = attn_forward(a, &s, act->q, act->k, act->v, ws->att, act->saved);
    } else if (run->mode == MHA_PREFILL) {
        rc = attn_prefill(a, run->state, d->N, act->q, act->k, act->v, ws->att);
    } else {
        if (d->N != 1) return ab_fail(AB_EINVAL, "mha_forward: a recurrent step takes one position (N = %d)", d->N);
        rc = attn_step(a, run->state, run->t, act->q, act->k, act->v, ws->att);
    }
    if (rc) return rc;
    merge_heads(d, act->merged, ws->att, true);
    dense_forward(out, act->merged, p->wo, p->bo, BT, C, C);
    return 0;
}

int mha_backward(attn *a, const mha_dims *d, float *dx, const mha_params *g, const float *dout, const float *x,
                 const mha_params *p, const mha_acts *act, mha_scratch *ws) {
    int BT = d->B * d->N, C = d->C;
    size_t n = (size_t)BT * C;
    memset(ws->dmerged, 0, sizeof(float) * n);
    dense_backward(ws->dmerged, g->wo, g->bo, dout, act->merged, p->wo, BT, C, C);
    merge_heads(d, ws->dmerged, ws->att, false); /* datt (B, H, N, D) */
    attn_shape s = mha_shape(d);
    /* attn_backward overwrites dq, dk, dv */
    int rc = attn_backward(a, &s, act->q, act->k, act->v, ws->att, act->saved, ws->dq, ws->dk, ws->dv);
    if (rc) return rc;
    join_heads(d, ws->dq, ws->dk, ws->dv, ws->qkv); /* dqkv (B, N, 3C) */
    dense_backward(dx, g->wqkv, g->bqkv, ws->qkv, x, p->wqkv, BT, C, 3 * C);
    return 0;
}
