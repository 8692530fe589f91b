/* The model's parameter initialisation (transformer.h: tf_init_params), the rules of
 * each tensor as the header lists them: drawn on the host from the parameter's own
 * stream (TF_STREAM_INIT + its index in the table), then uploaded on CUDA. Split from
 * transformer.c. */
#include "transformer_internal.h"

#include "../harness/device.h"
#include "../harness/error.h"
#include "../harness/memory.h"
#include "../harness/rng.h"

#include <math.h>

static uint64_t init_stream(const tf_model *m, const float *p) {
    size_t off = (size_t)(p - m->params);
    for (int i = 0; i < m->ptab.n; i++)
        if (m->ptab.t[i].offset == off && m->ptab.t[i].count > 0) return TF_STREAM_INIT + (uint64_t)i;
    return TF_STREAM_INIT + 0xFFFFFFFFu; /* not reached: every tensor is in the table */
}

/* The values are drawn into host memory `h` laid out as the parameters (the
 * parameters themselves on the CPU; a copy uploaded afterwards on CUDA): tensor p of
 * the model is h + (p - params). */
typedef struct {
    tf_model *m;
    float *h;
    uint64_t seed;
} init_ctx;

static float *host_of(const init_ctx *x, const float *p) { return x->h + (p - x->m->params); }

static void fill_uniform(const init_ctx *x, const float *p, size_t n, double bound) {
    uint64_t st = init_stream(x->m, p);
    float *h = host_of(x, p);
    for (size_t j = 0; j < n; j++) h[j] = (float)((2.0 * ab_rng_uniform(x->seed, st, j) - 1.0) * bound);
}

static void fill_normal(const init_ctx *x, const float *p, size_t n, double sd) {
    uint64_t st = init_stream(x->m, p);
    float *h = host_of(x, p);
    for (size_t j = 0; j < n; j++) h[j] = (float)(sd * ab_rng_normal(x->seed, st, j));
}

static void fill_const(const init_ctx *x, const float *p, size_t n, float v) {
    float *h = host_of(x, p);
    for (size_t j = 0; j < n; j++) h[j] = v;
}

/* nn.Linear's default: weights and bias uniform(+-1/sqrt(fan_in)) */
static void init_dense(const init_ctx *x, const float *w, const float *b, int out, int in) {
    double bound = 1.0 / sqrt((double)in);
    fill_uniform(x, w, (size_t)out * in, bound);
    if (b) fill_uniform(x, b, (size_t)out, bound);
}

static void input_init(const init_ctx *x) {
    const tf_config *c = &x->m->cfg;
    if (c->input == TF_INPUT_TOKENS) fill_normal(x, x->m->tok_emb, (size_t)c->vocab * c->d_model, 1.0);
    else init_dense(x, x->m->in_w, x->m->in_b, c->d_model, c->features);
}

/* The attention's own parameters at p (the variant's rule: attn_param_init), element j
 * from the tensor's stream as every other tensor. */
static int fill_attn(const init_ctx *x, const float *p) {
    return attn_param_init(x->m->att, x->m->enc.attn_len, x->seed, init_stream(x->m, p), host_of(x, p));
}

static int body_init(const init_ctx *x) {
    tf_model *m = x->m;
    const tf_config *c = &m->cfg;
    int C = c->d_model, F = c->d_ff, rc;
    if (c->body == TF_BODY_LSTM) {
        /* PyTorch's nn.LSTM: every tensor uniform(+-1/sqrt(H)), each from its table stream */
        lstm_init_tensor list[LSTM_MAX_TENSORS];
        int n = lstm_init_list(&m->lc, &m->lsp, list);
        for (int i = 0; i < n; i++) fill_uniform(x, list[i].p, list[i].count, list[i].bound);
        return 0;
    }
    for (int l = 0; l < c->layers; l++) {
        enc_params *p = &m->lp[l];
        fill_const(x, p->ln1_g, (size_t)C, 1.0f);
        fill_const(x, p->ln1_b, (size_t)C, 0.0f);
        init_dense(x, p->attn.wqkv, p->attn.bqkv, 3 * C, C);
        init_dense(x, p->attn.wo, p->attn.bo, C, C);
        fill_const(x, p->ln2_g, (size_t)C, 1.0f);
        fill_const(x, p->ln2_b, (size_t)C, 0.0f);
        init_dense(x, p->w1, p->b1, F, C);
        init_dense(x, p->w2, p->b2, C, F);
        if (p->attn.proj && !m->attn_shared && (rc = fill_attn(x, p->attn.proj))) return rc;
        const mha_aux *ax = &p->attn.aux; /* nn.Linear's rule for each projection of the attention's input */
        if (ax->width && ax->rank) init_dense(x, p->attn.aux_w1, NULL, ax->rank, C);
        if (ax->width) init_dense(x, ax->rank ? p->attn.aux_w2 : p->attn.aux_w1, p->attn.aux_b, c->heads * ax->width,
                                  ax->rank ? ax->rank : C);
    }
    if (m->attn_shared && (rc = fill_attn(x, m->attn_proj))) return rc;
    if (c->final_norm) {
        fill_const(x, m->lnf_g, (size_t)C, 1.0f);
        fill_const(x, m->lnf_b, (size_t)C, 0.0f);
    }
    return 0;
}

int tf_init_params(tf_model *m, uint64_t seed) {
    const bool host = ab_dev_host_memory(m->dev); /* else drawn on the host, then uploaded */
    const size_t bytes = sizeof(float) * m->ptab.total;
    init_ctx x = {m, host ? m->params : ab_alloc(bytes), seed};
    if (!x.h) return AB_ENOMEM;
    input_init(&x);
    int rc = body_init(&x);
    init_dense(&x, m->head_w, m->head_b, m->classes, m->width);
    if (host) return rc;
    if (!rc) rc = ab_dev_upload(m->dev, m->params, x.h, bytes);
    ab_free(x.h);
    return rc;
}
