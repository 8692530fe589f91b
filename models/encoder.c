#include "encoder.h"

#include "layers_dev.h"

#include "../harness/error.h"

#include <stdio.h>

/* Evaluates a call returning an error code; returns it from the caller on failure. */
#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        int rc_ = (call);                                                                                              \
        if (rc_) return rc_;                                                                                           \
    } while (0)

void enc_carve_params(tf_table *t, enc_params *p, const enc_config *c) {
    char base[TF_NAME_MAX];
    snprintf(base, sizeof base, "%s", t->prefix);
    p->ln1_g = tf_carve_f(t, "ln1.g", false, 1, c->C, 0, 0, 0);
    p->ln1_b = tf_carve_f(t, "ln1.b", false, 1, c->C, 0, 0, 0);
    tf_table_prefix(t, "%sattn.", base);
    mha_carve_params(t, &p->attn, c->C, c->H, c->attn_params, c->attn_len, &c->aux);
    tf_table_prefix(t, "%s", base);
    p->ln2_g = tf_carve_f(t, "ln2.g", false, 1, c->C, 0, 0, 0);
    p->ln2_b = tf_carve_f(t, "ln2.b", false, 1, c->C, 0, 0, 0);
    p->w1 = tf_carve_f(t, "ffn.w1", true, 2, c->F, c->C, 0, 0);
    p->b1 = tf_carve_f(t, "ffn.b1", false, 1, c->F, 0, 0, 0);
    p->w2 = tf_carve_f(t, "ffn.w2", true, 2, c->C, c->F, 0, 0);
    p->b2 = tf_carve_f(t, "ffn.b2", false, 1, c->C, 0, 0, 0);
}

void enc_carve_acts(tf_table *t, enc_acts *a, const enc_config *c, int B, int N, size_t attn_saved_bytes,
                    bool with_dropout) {
    int64_t C = c->C, F = c->F, md = with_dropout ? 1 : 0;
    a->ln1_mean = tf_carve_f(t, "ln1.mean", false, 2, B, N, 0, 0);
    a->ln1_rstd = tf_carve_f(t, "ln1.rstd", false, 2, B, N, 0, 0);
    a->ln1_out = tf_carve_f(t, "ln1.out", false, 3, B, N, C, 0);
    char base[TF_NAME_MAX];
    snprintf(base, sizeof base, "%s", t->prefix);
    tf_table_prefix(t, "%sattn.", base);
    mha_carve_acts(t, &a->attn, B, N, c->C, c->H, attn_saved_bytes, &c->aux);
    tf_table_prefix(t, "%s", base);
    a->mask_attn = tf_carve(t, "attn.drop_mask", 1, false, 3, B, N, C * md, 0);
    a->res1 = tf_carve_f(t, "res1", false, 3, B, N, C, 0);
    a->ln2_mean = tf_carve_f(t, "ln2.mean", false, 2, B, N, 0, 0);
    a->ln2_rstd = tf_carve_f(t, "ln2.rstd", false, 2, B, N, 0, 0);
    a->ln2_out = tf_carve_f(t, "ln2.out", false, 3, B, N, C, 0);
    a->hidden = tf_carve_f(t, "ffn.hidden", false, 3, B, N, F, 0);
    a->mask_hidden = tf_carve(t, "ffn.hidden_drop_mask", 1, false, 3, B, N, F * md, 0);
    a->mask_ffn = tf_carve(t, "ffn.drop_mask", 1, false, 3, B, N, C * md, 0);
    a->res2 = tf_carve_f(t, "res2", false, 3, B, N, C, 0);
}

void enc_carve_scratch(tf_table *t, enc_scratch *s, const enc_config *c, int B, int N) {
    mha_carve_scratch(t, &s->attn, B, N, c->C, c->H, &c->aux);
    s->branch = tf_carve_f(t, "branch", false, 3, B, N, c->C, 0);
    s->d1 = tf_carve_f(t, "d1", false, 3, B, N, c->C, 0);
    s->d2 = tf_carve_f(t, "d2", false, 3, B, N, c->C, 0);
    s->dhidden = tf_carve_f(t, "dhidden", false, 3, B, N, c->F, 0);
}

float *enc_output(const enc_config *c, const enc_acts *a) { return c->pre_norm ? a->res2 : a->ln2_out; }

static bool use_dropout(const enc_config *c, bool train) { return train && c->dropout > 0.0f; }

/* The recurrent step (N = 1, no dropout) with the layer's small operations fused: the
 * dense layers' GEMMs without their biases, each bias added in the pass that follows
 * (the heads' split, the ReLU, the residual and its layer norm). Post-norm: 9 device
 * operations (the attention's 4, 2 residual-and-norm passes, the FFN's 2 GEMMs and
 * bias-ReLU); pre-norm 10 (its first norm); the general path takes 16
 * (tests/models/test_model_cuda.c counts them). The same layer up to where the biases are
 * rounded in. */
static int enc_step(attn *a, const enc_config *c, const mha_dims *d, const mha_run *run, const float *x,
                    const enc_params *p, enc_acts *act, enc_scratch *ws) {
    const int B = d->B, C = c->C, F = c->F;
    ab_device dev = d->device;
    if (!c->pre_norm) {
        TRY(mha_step_forward(a, d, run, ws->branch, x, &p->attn, &act->attn, &ws->attn));
        TRY(ld_bias_residual_layernorm(dev, act->res1, act->ln1_out, act->ln1_mean, act->ln1_rstd, x, ws->branch,
                                       p->attn.bo, p->ln1_g, p->ln1_b, B, C));
        TRY(ld_dense_forward(dev, act->hidden, act->ln1_out, p->w1, NULL, B, C, F));
        TRY(ld_bias_relu(dev, act->hidden, p->b1, B, F));
        TRY(ld_dense_forward(dev, ws->branch, act->hidden, p->w2, NULL, B, F, C));
        return ld_bias_residual_layernorm(dev, act->res2, act->ln2_out, act->ln2_mean, act->ln2_rstd, act->ln1_out,
                                          ws->branch, p->b2, p->ln2_g, p->ln2_b, B, C);
    }
    TRY(ld_layernorm_forward(dev, act->ln1_out, act->ln1_mean, act->ln1_rstd, x, p->ln1_g, p->ln1_b, B, C));
    TRY(mha_step_forward(a, d, run, ws->branch, act->ln1_out, &p->attn, &act->attn, &ws->attn));
    TRY(ld_bias_residual_layernorm(dev, act->res1, act->ln2_out, act->ln2_mean, act->ln2_rstd, x, ws->branch,
                                   p->attn.bo, p->ln2_g, p->ln2_b, B, C));
    TRY(ld_dense_forward(dev, act->hidden, act->ln2_out, p->w1, NULL, B, C, F));
    TRY(ld_bias_relu(dev, act->hidden, p->b1, B, F));
    TRY(ld_dense_forward(dev, ws->branch, act->hidden, p->w2, NULL, B, F, C));
    return ld_bias_residual_layernorm(dev, act->res2, NULL, NULL, NULL, act->res1, ws->branch, p->b2, NULL, NULL, B, C);
}

int enc_forward(attn *a, const enc_config *c, const mha_dims *d, const mha_run *run, const float *x,
                const enc_params *p, enc_acts *act, enc_scratch *ws, bool train, uint64_t seed, uint64_t stream_base) {
    int BT = d->B * d->N, C = c->C, F = c->F;
    size_t n = (size_t)BT * C;
    bool drop = use_dropout(c, train);
    /* the first element of this batch's masks in the sequence of a batch starting at row 0 */
    const uint64_t first = (uint64_t)d->row0 * (uint64_t)d->N * (uint64_t)C;
    const uint64_t first_h = (uint64_t)d->row0 * (uint64_t)d->N * (uint64_t)F;
    ab_device dev = d->device;
    if (run && run->mode == MHA_STEP && !drop && d->N == 1) return enc_step(a, c, d, run, x, p, act, ws);
    if (drop && (!act->mask_attn || !act->mask_hidden || !act->mask_ffn))
        return ab_fail(AB_EINVAL, "encoder layer: dropout requested but no masks were carved");
    ffn_params fp = {p->w1, p->b1, p->w2, p->b2};
    if (!c->pre_norm) {
        TRY(mha_forward(a, d, run, ws->branch, x, &p->attn, &act->attn, &ws->attn));
        if (drop)
            TRY(ld_dropout_forward(dev, ws->branch, act->mask_attn, ws->branch, n, c->dropout, seed, stream_base + 0, first));
        TRY(ld_residual_add(dev, act->res1, x, ws->branch, n));
        TRY(ld_layernorm_forward(dev, act->ln1_out, act->ln1_mean, act->ln1_rstd, act->res1, p->ln1_g, p->ln1_b, BT,
                                 C));
        TRY(ld_ffn_forward(dev, ws->branch, act->hidden, drop ? act->mask_hidden : NULL, act->ln1_out, &fp, BT, C, F,
                           c->dropout, seed, stream_base + 1, first_h));
        if (drop)
            TRY(ld_dropout_forward(dev, ws->branch, act->mask_ffn, ws->branch, n, c->dropout, seed, stream_base + 2, first));
        TRY(ld_residual_add(dev, act->res2, act->ln1_out, ws->branch, n));
        TRY(ld_layernorm_forward(dev, act->ln2_out, act->ln2_mean, act->ln2_rstd, act->res2, p->ln2_g, p->ln2_b, BT,
                                 C));
    } else {
        TRY(ld_layernorm_forward(dev, act->ln1_out, act->ln1_mean, act->ln1_rstd, x, p->ln1_g, p->ln1_b, BT, C));
        TRY(mha_forward(a, d, run, ws->branch, act->ln1_out, &p->attn, &act->attn, &ws->attn));
        if (drop)
            TRY(ld_dropout_forward(dev, ws->branch, act->mask_attn, ws->branch, n, c->dropout, seed, stream_base + 0, first));
        TRY(ld_residual_add(dev, act->res1, x, ws->branch, n));
        TRY(ld_layernorm_forward(dev, act->ln2_out, act->ln2_mean, act->ln2_rstd, act->res1, p->ln2_g, p->ln2_b, BT,
                                 C));
        TRY(ld_ffn_forward(dev, ws->branch, act->hidden, drop ? act->mask_hidden : NULL, act->ln2_out, &fp, BT, C, F,
                           c->dropout, seed, stream_base + 1, first_h));
        if (drop)
            TRY(ld_dropout_forward(dev, ws->branch, act->mask_ffn, ws->branch, n, c->dropout, seed, stream_base + 2, first));
        TRY(ld_residual_add(dev, act->res2, act->res1, ws->branch, n));
    }
    return 0;
}

/* dst = dropout backward of src (or a copy without dropout); dst is overwritten */
static int through_dropout(ab_device dev, float *dst, const float *src, const uint8_t *mask, size_t n, float p,
                           bool drop) {
    if (!drop) return ld_copy(dev, dst, src, sizeof(float) * n);
    TRY(ld_zero(dev, dst, sizeof(float) * n));
    return ld_dropout_backward(dev, dst, src, mask, n, p);
}

int enc_backward(attn *a, const enc_config *c, const mha_dims *d, float *dx, const enc_params *g, const float *dout,
                 const float *x, const enc_params *p, const enc_acts *act, enc_scratch *ws, bool train) {
    int BT = d->B * d->N, C = c->C, F = c->F;
    size_t n = (size_t)BT * C;
    bool drop = use_dropout(c, train);
    ab_device dev = d->device;
    ffn_params fp = {p->w1, p->b1, p->w2, p->b2};
    ffn_grads fg = {g->w1, g->b1, g->w2, g->b2};
    float *d1 = ws->d1, *d2 = ws->d2;
    if (!c->pre_norm) {
        /* d1 = dr2 */
        TRY(ld_zero(dev, d1, sizeof(float) * n));
        TRY(ld_layernorm_backward(dev, d1, g->ln2_g, g->ln2_b, dout, act->res2, p->ln2_g, act->ln2_mean, act->ln2_rstd,
                                  BT, C));
        /* d2 = d(FFN output); the FFN adds its input gradient into d1, which then is dh1 */
        TRY(through_dropout(dev, d2, d1, act->mask_ffn, n, c->dropout, drop));
        TRY(ld_ffn_backward(dev, d1, &fg, ws->dhidden, d2, act->ln1_out, act->hidden, drop ? act->mask_hidden : NULL,
                            &fp, BT, C, F, c->dropout));
        /* d2 = dr1 */
        TRY(ld_zero(dev, d2, sizeof(float) * n));
        TRY(ld_layernorm_backward(dev, d2, g->ln1_g, g->ln1_b, d1, act->res1, p->ln1_g, act->ln1_mean, act->ln1_rstd,
                                  BT, C));
        TRY(ld_residual_acc(dev, dx, d2, n));
        TRY(through_dropout(dev, d1, d2, act->mask_attn, n, c->dropout, drop));
        return mha_backward(a, d, dx, &g->attn, d1, x, &p->attn, &act->attn, &ws->attn);
    }
    /* pre-norm: d1 = dr1, starting with the residual path of dout */
    TRY(ld_copy(dev, d1, dout, sizeof(float) * n));
    TRY(through_dropout(dev, d2, dout, act->mask_ffn, n, c->dropout, drop));
    float *dh = ws->branch;
    TRY(ld_zero(dev, dh, sizeof(float) * n));
    TRY(ld_ffn_backward(dev, dh, &fg, ws->dhidden, d2, act->ln2_out, act->hidden, drop ? act->mask_hidden : NULL, &fp,
                        BT, C, F, c->dropout));
    TRY(ld_layernorm_backward(dev, d1, g->ln2_g, g->ln2_b, dh, act->res1, p->ln2_g, act->ln2_mean, act->ln2_rstd, BT,
                              C));
    TRY(ld_residual_acc(dev, dx, d1, n));
    TRY(through_dropout(dev, d2, d1, act->mask_attn, n, c->dropout, drop));
    TRY(ld_zero(dev, dh, sizeof(float) * n));
    TRY(mha_backward(a, d, dh, &g->attn, d2, act->ln1_out, &p->attn, &act->attn, &ws->attn));
    return ld_layernorm_backward(dev, dx, g->ln1_g, g->ln1_b, dh, x, p->ln1_g, act->ln1_mean, act->ln1_rstd, BT, C);
}
