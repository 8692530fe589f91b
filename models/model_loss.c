/* The model's losses (transformer.h: tf_loss for per-position targets, tf_loss_ctc for
 * label sequences) and its backward pass (tf_backward): the head's gradient, then the
 * body's and the input stage's, each in their own function (head_*, body_*, input_*). */
#include "transformer_internal.h"

#include "ctc.h"
#include "layers_dev.h"

#include "../harness/device.h"
#include "../harness/error.h"

#include <math.h>
#include <string.h>

/* ---- losses ---- */

int tf_loss(tf_model *m, const int *targets, const float *weights, ce_stats *st) {
    if (!m || !st) return ab_fail(AB_EINVAL, "tf_loss: NULL argument");
    if (!m->have_forward) return ab_fail(AB_EINVAL, "tf_loss: no forward to score (call tf_forward first)");
    if (m->cfg.head == TF_HEAD_CTC)
        return ab_fail(AB_EINVAL, "tf_loss: the model's head is ctc: score label sequences with tf_loss_ctc");
    if (!targets) return ab_fail(AB_EINVAL, "tf_loss: NULL targets");
    size_t n = (size_t)m->B * m->N;
    for (size_t i = 0; i < n; i++) {
        float w = weights ? weights[i] : 1.0f;
        if (!(w >= 0.0f) || isinf(w))
            return ab_fail(AB_EINVAL, "tf_loss: weight %g at index %zu is not finite and >= 0", (double)w, i);
        if (w > 0.0f && (targets[i] < 0 || targets[i] >= tf_targets_of(&m->cfg)))
            return ab_fail(AB_EINVAL, "tf_loss: target %d at index %zu is outside [0, classes=%d)", targets[i], i,
                           tf_targets_of(&m->cfg));
    }
    m->has_weights = weights != NULL;
    int rc;
    if (ab_dev_host_memory(m->dev)) {
        memcpy(m->targets, targets, sizeof(int) * n);
        if (weights) memcpy(m->weights, weights, sizeof(float) * n);
    } else {
        /* targets, and the weights after them, in one upload */
        memcpy(m->h_targets, targets, sizeof(int) * n);
        if (weights) memcpy(m->h_weights, weights, sizeof(float) * n);
        size_t bytes = weights ? (size_t)((char *)(m->h_weights + n) - (char *)m->h_targets) : sizeof(int) * n;
        if ((rc = ab_dev_upload(m->dev, m->targets, m->h_targets, bytes))) return rc;
    }
    if (m->cfg.head == TF_HEAD_LOGISTIC_MIXTURE)
        rc = ld_mixture_forward(m->dev, st, m->nll, m->logits, m->targets, m->has_weights ? m->weights : NULL, (int)n,
                                m->cfg.mixtures, m->ce_ws);
    else
        rc = ld_cross_entropy_forward(m->dev, st, m->nll, m->logits, m->targets, m->has_weights ? m->weights : NULL,
                                      (int)n, m->classes, m->ce_ws);
    if (rc) return rc;
    m->weight_sum = st->weight_sum;
    m->have_loss = true;
    return 0;
}

/* The CTC head's loss (transformer.h). The inputs are checked on the host, then go to
 * the model's buffer ctc_in in one copy, laid out for this batch: counts (B), lengths
 * (B), weights (B, as floats), labels (B, S). */
int tf_loss_ctc(tf_model *m, const int *labels, const int *counts, const float *weights, ce_stats *st) {
    if (!m || !st) return ab_fail(AB_EINVAL, "tf_loss_ctc: NULL argument");
    if (!m->have_forward) return ab_fail(AB_EINVAL, "tf_loss_ctc: no forward to score (call tf_forward first)");
    if (m->cfg.head != TF_HEAD_CTC)
        return ab_fail(AB_EINVAL, "tf_loss_ctc: the model's head is %s, not ctc (score it with tf_loss)",
                       tf_head_name(m->cfg.head));
    if (!labels || !counts) return ab_fail(AB_EINVAL, "tf_loss_ctc: NULL %s", labels ? "counts" : "labels");
    const int B = m->B, N = m->N, S = m->cfg.max_labels, P = tf_targets_of(&m->cfg);
    for (int b = 0; b < B; b++) {
        const float w = weights ? weights[b] : 1.0f;
        if (!(w >= 0.0f) || isinf(w))
            return ab_fail(AB_EINVAL, "tf_loss_ctc: the weight %g of row %d is not finite and >= 0", (double)w, b);
        if (w == 0.0f) continue; /* not scored: not read */
        const int L = counts[b], T = m->has_lengths ? m->lengths[b] : N;
        if (L < 0 || L > S)
            return ab_fail(AB_EINVAL, "tf_loss_ctc: row %d has %d labels, outside [0, max_labels=%d]", b, L, S);
        const int *lab = labels + (size_t)b * S;
        for (int j = 0; j < L; j++)
            if (lab[j] < 0 || lab[j] >= P)
                return ab_fail(AB_EINVAL, "tf_loss_ctc: label %d at row %d, position %d is outside [0, classes=%d)",
                               lab[j], b, j, P);
        const int need = ctc_min_frames(lab, L);
        if (need > T)
            return ab_fail(AB_EINVAL,
                           "tf_loss_ctc: row %d: %d labels with %d adjacent repeats need at least %d frames, the row "
                           "has %d (no alignment: the CTC loss would be infinite)",
                           b, L, need - L, need, T);
    }
    /* one block: counts, lengths, weights, labels; on CUDA staged on the host, uploaded once */
    const bool host = ab_dev_host_memory(m->dev); /* else staged on the host, then uploaded */
    int *in = host ? m->ctc_in : m->h_ctc;
    for (int b = 0; b < B; b++) {
        in[b] = counts[b];
        in[B + b] = m->has_lengths ? m->lengths[b] : N;
        float w = weights ? weights[b] : 1.0f;
        memcpy(&in[2 * B + b], &w, sizeof w);
    }
    memcpy(in + 3 * (size_t)B, labels, sizeof(int) * (size_t)B * S);
    int rc;
    if (!host &&
        (rc = ab_dev_upload(m->dev, m->ctc_in, m->h_ctc, sizeof(int) * (size_t)B * (3 + (size_t)S))))
        return rc;
    m->ctc_counts = m->ctc_in;
    m->ctc_lengths = m->ctc_in + B;
    m->ctc_weights = weights ? (const float *)(m->ctc_in + 2 * B) : NULL;
    m->ctc_labels = m->ctc_in + 3 * (size_t)B;
    m->has_weights = weights != NULL;
    const ctc_dims d = tf_ctc_dims(&m->cfg, B, N);
    rc = ld_ctc_forward(m->dev, st, m->nll, &d, m->logits, m->ctc_lengths, m->ctc_labels, m->ctc_counts,
                        m->ctc_weights, m->ctc_ws);
    if (rc) return rc;
    m->weight_sum = st->weight_sum;
    m->have_loss = true;
    return 0;
}

/* ---- backward ---- */

/* d(emb) (B N, C) -> the input stage's parameter gradients. */
static int input_backward(tf_model *m, const float *demb, int BT) {
    if (m->cfg.input == TF_INPUT_TOKENS)
        return ld_embedding_backward(m->dev, m->g_tok_emb, demb, m->tokens, m->order, m->starts, BT, m->cfg.d_model,
                                     m->cfg.vocab);
    return ld_dense_backward(m->dev, NULL, m->g_in_w, m->g_in_b, demb, m->frames, m->in_w, BT, m->cfg.features,
                             m->cfg.d_model);
}

static int head_backward(tf_model *m, float *dx, int BT) {
    int W = m->width, K = m->classes;
    const float *wts = m->has_weights ? m->weights : NULL;
    int rc = ld_zero(m->dev, m->dlogits, sizeof(float) * (size_t)BT * K);
    if (!rc && m->cfg.head == TF_HEAD_CTC) {
        const ctc_dims d = tf_ctc_dims(&m->cfg, m->B, m->N);
        rc = ld_ctc_backward(m->dev, m->dlogits, &d, m->logits, m->ctc_lengths, m->ctc_labels, m->ctc_counts,
                             m->ctc_weights, m->weight_sum, m->ctc_ws);
    } else if (!rc)
        rc = m->cfg.head == TF_HEAD_LOGISTIC_MIXTURE
                 ? ld_mixture_backward(m->dev, m->dlogits, m->logits, m->targets, wts, m->weight_sum, BT,
                                       m->cfg.mixtures)
                 : ld_cross_entropy_backward(m->dev, m->dlogits, m->logits, m->targets, wts, m->weight_sum, BT, K);
    if (rc) return rc;
    return ld_dense_backward(m->dev, dx, m->g_head_w, m->g_head_b, m->dlogits, tf_body_output(m), m->head_w, BT, W, K);
}

/* dtop: gradient at the body's output; returns the buffer holding d(emb) */
static int body_backward(tf_model *m, const mha_dims *d, float *dtop, float **demb) {
    int BT = d->B * d->N, C = m->cfg.d_model;
    size_t n = (size_t)BT * C;
    float *dcur = m->dx_a, *dnext = m->dx_b;
    int rc;
    if (m->cfg.body == TF_BODY_LSTM) {
        /* dtop is dx_b (the head's input gradient); d(emb) accumulates into dx_a */
        lstm_dims ld = {d->B, d->N, d->lengths, m->dev, 0};
        if ((rc = ld_zero(m->dev, dcur, sizeof(float) * n)) ||
            (rc = lstm_stack_backward(&m->lc, &ld, dcur, &m->lsg, dtop, m->emb, &m->lsp, &m->lsa, &m->lsw, m->train)))
            return rc;
        *demb = dcur;
        return 0;
    }
    if (m->cfg.final_norm) {
        if ((rc = ld_zero(m->dev, dcur, sizeof(float) * n)) ||
            (rc = ld_layernorm_backward(m->dev, dcur, m->g_lnf_g, m->g_lnf_b, dtop, tf_layer_input(m, m->cfg.layers),
                                        m->lnf_g, m->lnf_mean, m->lnf_rstd, BT, C)))
            return rc;
    } else if ((rc = ld_copy(m->dev, dcur, dtop, sizeof(float) * n))) {
        return rc;
    }
    for (int l = m->cfg.layers - 1; l >= 0; l--) {
        if ((rc = ld_zero(m->dev, dnext, sizeof(float) * n))) return rc;
        attn_reseed(m->att, tf_attn_seed(m->seed, l));
        rc = enc_backward(m->att, &m->enc, d, dnext, &m->lg[l], dcur, tf_layer_input(m, l), &m->lp[l], &m->la[l], &m->ws,
                          m->train);
        if (rc) return rc;
        float *t = dcur;
        dcur = dnext;
        dnext = t;
    }
    *demb = dcur;
    return 0;
}

int tf_backward(tf_model *m) {
    if (!m) return ab_fail(AB_EINVAL, "tf_backward: NULL model");
    if (!m->have_forward || !m->have_loss)
        return ab_fail(AB_EINVAL, "tf_backward: needs tf_forward then tf_loss first");
    if (m->forward_only)
        return ab_fail(AB_EINVAL, "tf_backward: the model was made for inference only (tf_create_inference): it "
                                  "keeps nothing for backward");
    if (m->infer_forward)
        return ab_fail(AB_EINVAL, "tf_backward: the last forward ran for inference (tf_set_inference, or generation) "
                                  "and kept nothing for backward");
    int BT = m->B * m->N;
    size_t n = (size_t)BT * m->width;
    /* the head's input gradient goes to dx_b (free until the first layer) */
    float *dtop = m->dx_b;
    const ab_precision p0 = tf_precision_enter(m);
    int rc = ld_zero(m->dev, dtop, sizeof(float) * n);
    float *demb;
    mha_dims d = {m->B, m->N, m->cfg.d_model, m->cfg.heads, m->cfg.causal, m->has_lengths ? m->lengths : NULL, m->dev, 0};
    if (!rc && !(rc = head_backward(m, dtop, BT)) && !(rc = body_backward(m, &d, dtop, &demb)))
        rc = input_backward(m, demb, BT);
    tf_precision_leave(m, p0);
    if (rc) return rc;
    m->have_loss = false;
    return 0;
}
