#include "test_model_util.h"

#include "error.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tf_config tm_tiny_config(const char *variant) {
    tf_config c;
    tf_config_default(&c);
    c.vocab = 5;
    c.max_len = 6;
    c.d_model = 8;
    c.heads = 2;
    c.layers = 2;
    c.d_ff = 16;
    c.dropout = 0.0f;
    c.attention = variant;
    c.seed = 3;
    return c;
}

ref_params tm_ref_params(const tf_model *m, const double *pd) {
    ref_params r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        const double *p = pd + t->offset;
        int l;
        char suffix[64];
        const double **slot = NULL;
        if (strcmp(t->name, "tok_emb") == 0) slot = &r.tok_emb;
        else if (strcmp(t->name, "in.w") == 0) slot = &r.in_w;
        else if (strcmp(t->name, "in.b") == 0) slot = &r.in_b;
        else if (strcmp(t->name, "final_ln.g") == 0) slot = &r.lnf_g;
        else if (strcmp(t->name, "final_ln.b") == 0) slot = &r.lnf_b;
        else if (strcmp(t->name, "head.w") == 0) slot = &r.head_w;
        else if (strcmp(t->name, "head.b") == 0) slot = &r.head_b;
        else if (strcmp(t->name, "attn.proj") == 0) {
            /* the attention's parameters shared by every layer (linformer share=layer) */
            for (int k = 0; k < REF_MAX_LAYERS; k++) {
                cr_assert_null(r.layer[k].proj, "attn.proj and a layer's own");
                r.layer[k].proj = p;
            }
            continue;
        }
        else if (sscanf(t->name, "layers.%d.%63s", &l, suffix) == 2 && l >= 0 && l < REF_MAX_LAYERS) {
            ref_layer_params *lp = &r.layer[l];
            const char *names[16] = {"ln1.g",  "ln1.b",  "attn.wqkv", "attn.bqkv", "attn.wo",     "attn.bo",
                                     "ln2.g",  "ln2.b",  "ffn.w1",    "ffn.b1",    "ffn.w2",      "ffn.b2",
                                     "attn.proj", "attn.aux.w1", "attn.aux.w2", "attn.aux.b"};
            const double **slots[16] = {&lp->ln1_g, &lp->ln1_b, &lp->wqkv,   &lp->bqkv,   &lp->wo,    &lp->bo,
                                        &lp->ln2_g, &lp->ln2_b, &lp->w1,     &lp->b1,     &lp->w2,    &lp->b2,
                                        &lp->proj,  &lp->aux_w1, &lp->aux_w2, &lp->aux_b};
            for (int k = 0; k < 16; k++)
                if (strcmp(suffix, names[k]) == 0) slot = slots[k];
        }
        cr_assert_not_null(slot, "parameter %s has no place in the reference", t->name);
        cr_assert_null(*slot, "parameter %s mapped twice", t->name);
        *slot = p;
    }
    return r;
}

/* ---- the frames + LSTM model in double ---- */

tf_config tm_tiny_lstm_config(void) {
    tf_config c;
    tf_config_default(&c);
    c.input = TF_INPUT_FRAMES;
    c.features = 3;
    c.classes = 4;
    c.body = TF_BODY_LSTM;
    c.max_len = 7;
    c.d_model = 4;
    c.lstm_hidden = 3;
    c.layers = 2;
    c.bidirectional = true;
    c.causal = false;
    c.dropout = 0.0f;
    c.seed = 3;
    return c;
}

static void expect_shape(const tf_tensor *t, int ndim, int64_t d0, int64_t d1) {
    cr_assert_eq(t->ndim, ndim, "%s: %d dimensions, expected %d", t->name, t->ndim, ndim);
    cr_assert_eq(t->shape[0], d0, "%s: dimension 0 is %lld, expected %lld", t->name, (long long)t->shape[0],
                 (long long)d0);
    if (ndim > 1)
        cr_assert_eq(t->shape[1], d1, "%s: dimension 1 is %lld, expected %lld", t->name, (long long)t->shape[1],
                     (long long)d1);
}

tm_ref_lstm tm_ref_lstm_view(const tf_model *m, double *pd) {
    const tf_config *c = tf_get_config(m);
    tm_ref_lstm r;
    memset(&r, 0, sizeof r);
    r.F = c->features;
    r.C = c->d_model;
    r.H = c->lstm_hidden;
    r.layers = c->layers;
    r.K = tf_classes(m);
    r.bidirectional = c->bidirectional;
    const int D = r.bidirectional ? 2 : 1, G = 4 * r.H;
    cr_assert_leq(r.layers, REF_LSTM_MAX_LAYERS);
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        double *p = pd + t->offset, **slot = NULL;
        char kind[16] = "", rest[16] = "";
        int l = -1;
        if (strcmp(t->name, "in.w") == 0) slot = &r.in_w, expect_shape(t, 2, r.C, r.F);
        else if (strcmp(t->name, "in.b") == 0) slot = &r.in_b, expect_shape(t, 1, r.C, 0);
        else if (strcmp(t->name, "head.w") == 0) slot = &r.head_w, expect_shape(t, 2, r.K, D * r.H);
        else if (strcmp(t->name, "head.b") == 0) slot = &r.head_b, expect_shape(t, 1, r.K, 0);
        else if (sscanf(t->name, "lstm.%15[a-z_]%d%15s", kind, &l, rest) >= 2 && l >= 0 && l < r.layers &&
                 (rest[0] == '\0' || (D == 2 && strcmp(rest, "_reverse") == 0))) {
            ref_lstm_dir *q = &r.lstm.dir[l][rest[0] ? 1 : 0];
            int in = l == 0 ? r.C : D * r.H;
            if (strcmp(kind, "weight_ih_l") == 0) slot = &q->w_ih, expect_shape(t, 2, G, in);
            else if (strcmp(kind, "weight_hh_l") == 0) slot = &q->w_hh, expect_shape(t, 2, G, r.H);
            else if (strcmp(kind, "bias_l") == 0) slot = &q->b, expect_shape(t, 1, G, 0);
        }
        cr_assert_not_null(slot, "parameter %s has no place in the reference", t->name);
        cr_assert_null(*slot, "parameter %s mapped twice", t->name);
        *slot = p;
    }
    cr_assert(r.in_w && r.in_b && r.head_w && r.head_b, "a dense tensor of the model is missing");
    for (int l = 0; l < r.layers; l++)
        for (int d = 0; d < D; d++)
            cr_assert(r.lstm.dir[l][d].w_ih && r.lstm.dir[l][d].w_hh && r.lstm.dir[l][d].b,
                      "LSTM layer %d direction %d lacks a tensor", l, d);
    return r;
}

/* frames -> x (B N, C) -> h (B N, D H) -> logits (B N, K) */
static void lstm_model_forward(const tm_ref_lstm *r, const double *frames, int B, int N, const int *lengths,
                               const ref_lstm_drop *drop, double *x, double *h, double *logits) {
    const int BT = B * N, DH = (r->bidirectional ? 2 : 1) * r->H;
    ref_lstm_cfg lc = {r->C, r->H, r->layers, r->bidirectional};
    ref_dense(frames, r->in_w, r->in_b, BT, r->F, r->C, x);
    ref_lstm_forward(&lc, &r->lstm, x, B, N, lengths, drop, h);
    ref_dense(h, r->head_w, r->head_b, BT, DH, r->K, logits);
}

void tm_ref_lstm_logits(const tm_ref_lstm *r, const double *frames, int B, int N, const int *lengths,
                        const ref_lstm_drop *drop, double *logits) {
    const size_t BT = (size_t)B * N, DH = (size_t)(r->bidirectional ? 2 : 1) * r->H;
    double *x = calloc(BT * r->C, sizeof(double)), *h = calloc(BT * DH, sizeof(double));
    lstm_model_forward(r, frames, B, N, lengths, drop, x, h, logits);
    free(x);
    free(h);
}

void tm_ref_lstm_backprop(const tm_ref_lstm *r, const double *frames, int B, int N, const int *lengths,
                          const ref_lstm_drop *drop, const double *dl, const tm_ref_lstm *g) {
    const int BT = B * N, C = r->C, K = r->K, F = r->F, DH = (r->bidirectional ? 2 : 1) * r->H;
    double *x = calloc((size_t)BT * C, sizeof(double)), *h = calloc((size_t)BT * DH, sizeof(double));
    double *logits = calloc((size_t)BT * K, sizeof(double));
    lstm_model_forward(r, frames, B, N, lengths, drop, x, h, logits);
    double *dh = calloc((size_t)BT * DH, sizeof(double)), *dx = calloc((size_t)BT * C, sizeof(double));
    /* head: dW += dl^T h, db += column sums, dh = dl W */
    for (int i = 0; i < BT; i++)
        for (int k = 0; k < K; k++) {
            double d = dl[(long)i * K + k];
            g->head_b[k] += d;
            for (int j = 0; j < DH; j++) {
                g->head_w[(long)k * DH + j] += d * h[(long)i * DH + j];
                dh[(long)i * DH + j] += d * r->head_w[(long)k * DH + j];
            }
        }
    ref_lstm_cfg lc = {C, r->H, r->layers, r->bidirectional};
    ref_lstm_backward(&lc, &r->lstm, x, B, N, lengths, drop, dh, dx, &g->lstm);
    /* input projection: dW += dx^T frames, db += column sums */
    for (int i = 0; i < BT; i++)
        for (int ch = 0; ch < C; ch++) {
            double d = dx[(long)i * C + ch];
            g->in_b[ch] += d;
            for (int f = 0; f < F; f++) g->in_w[(long)ch * F + f] += d * frames[(long)i * F + f];
        }
    free(dh);
    free(dx);
    free(x);
    free(h);
    free(logits);
}

double tm_ref_lstm_loss(const tm_ref_lstm *r, const double *frames, int B, int N, const int *lengths,
                        const ref_lstm_drop *drop, const int *targets, const double *weights, const tm_ref_lstm *g) {
    const int BT = B * N, K = r->K, DH = (r->bidirectional ? 2 : 1) * r->H;
    double *x = calloc((size_t)BT * r->C, sizeof(double)), *h = calloc((size_t)BT * DH, sizeof(double));
    double *logits = calloc((size_t)BT * K, sizeof(double));
    lstm_model_forward(r, frames, B, N, lengths, drop, x, h, logits);
    double loss = ref_cross_entropy(logits, targets, weights, BT, K);
    if (g) {
        /* d loss / d logits = w_i / sum(w) (softmax_i - onehot(t_i)) at scored positions */
        double sw = 0;
        for (int i = 0; i < BT; i++) sw += weights ? (weights[i] > 0 ? weights[i] : 0) : 1.0;
        double *dl = calloc((size_t)BT * K, sizeof(double));
        for (int i = 0; sw > 0 && i < BT; i++) {
            double w = weights ? weights[i] : 1.0;
            if (!(w > 0)) continue;
            const double *li = logits + (long)i * K;
            double mx = li[0], s = 0;
            for (int k = 1; k < K; k++) mx = fmax(mx, li[k]);
            for (int k = 0; k < K; k++) s += exp(li[k] - mx);
            for (int k = 0; k < K; k++)
                dl[(long)i * K + k] = w / sw * (exp(li[k] - mx) / s - (k == targets[i] ? 1.0 : 0.0));
        }
        tm_ref_lstm_backprop(r, frames, B, N, lengths, drop, dl, g);
        free(dl);
    }
    free(x);
    free(h);
    free(logits);
    return loss;
}

tf_model *tm_make(const tf_config *c, int max_batch) {
    tf_model *m = NULL;
    int rc = tf_create(c, max_batch, &m);
    cr_assert_eq(rc, 0, "tf_create: %s", ab_error());
    cr_assert_not_null(m);
    return m;
}

const tf_tensor *tm_find_param(const tf_model *m, const char *name) {
    for (int i = 0; i < tf_param_tensor_count(m); i++)
        if (strcmp(tf_param_tensor(m, i)->name, name) == 0) return tf_param_tensor(m, i);
    return NULL;
}

ref_model_cfg tm_ref_cfg(const tf_config *c) {
    ref_model_cfg r = {c->vocab, c->d_model, c->heads, c->layers, c->d_ff, c->pre_norm, c->final_norm, c->causal,
                       strstr(c->attention, "softmax") ? REF_ATTN_SOFTMAX : REF_ATTN_LINEAR_ELU, 0, 0, false, 0, 0, 0};
    if (strcmp(c->attention, "gla") == 0) {
        /* the block's gate: rank 16, log(sigmoid) / 16; W = D, or 1 with gate=scalar */
        r.attn = REF_ATTN_GLA;
        r.aux_w = c->d_model / c->heads;
        r.aux_rank = 16;
        for (int i = 0; i < c->n_attn_settings; i++)
            if (strcmp(c->attn_settings[i], "gate=scalar") == 0) r.aux_w = 1;
    } else if (strcmp(c->attention, "deltanet") == 0) {
        r.attn = REF_ATTN_DELTANET; /* the block's rate: one projection, sigmoid */
        r.aux_w = 1;
        r.aux_act = 1;
    }
    if (strcmp(c->attention, "linformer") == 0) {
        /* its settings here: k=K and share=NAME */
        r.attn = REF_ATTN_LINFORMER;
        r.lin_k = 256;
        r.lin_len = c->max_len;
        for (int i = 0; i < c->n_attn_settings; i++) {
            sscanf(c->attn_settings[i], "k=%d", &r.lin_k);
            if (strncmp(c->attn_settings[i], "share=", 6) == 0) r.lin_one = strcmp(c->attn_settings[i] + 6, "none") != 0;
        }
    }
    return r;
}

void tm_expect_create_error(const tf_config *c, int max_batch, const char *needle) {
    tf_model *m = (tf_model *)1;
    int rc = tf_create(c, max_batch, &m);
    cr_expect_lt(rc, 0, "config accepted (expected an error about '%s')", needle);
    cr_expect_null(m);
    cr_expect(strstr(ab_error(), needle) != NULL, "message '%s' lacks '%s'", ab_error(), needle);
    cr_expect(strchr(ab_error(), '\n') == NULL, "message has a newline: '%s'", ab_error());
    if (rc == 0) tf_destroy(m);
}
