/* The model (transformer.h): creation (config checks, size tables, allocation) and
 * forward, with the input stage, the body and the head each in their own functions
 * (input_*, body_*, head_*). The parameters' initialisation is in model_init.c, the
 * losses and the backward pass in model_loss.c, generation in generate.c. */
#include "transformer_internal.h"

#include "ctc.h"
#include "layers_dev.h"

#include "../harness/cuda_blas.h"
#include "../harness/cuda_device.h"
#include "../harness/device.h"
#include "../harness/error.h"
#include "../harness/memory.h"
#include "../harness/rng.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const INPUT_NAMES[] = {"tokens", "frames"};
static const char *const BODY_NAMES[] = {"transformer", "lstm"};
static const char *const HEAD_NAMES[] = {"categorical", "logistic_mixture", "ctc"};
_Static_assert(sizeof INPUT_NAMES / sizeof *INPUT_NAMES == TF_INPUT_COUNT, "a name for every input");
_Static_assert(sizeof BODY_NAMES / sizeof *BODY_NAMES == TF_BODY_COUNT, "a name for every body");
_Static_assert(sizeof HEAD_NAMES / sizeof *HEAD_NAMES == TF_HEAD_COUNT, "a name for every head");

const char *tf_input_name(tf_input i) { return (unsigned)i < TF_INPUT_COUNT ? INPUT_NAMES[i] : "?"; }
const char *tf_body_name(tf_body b) { return (unsigned)b < TF_BODY_COUNT ? BODY_NAMES[b] : "?"; }
const char *tf_head_name(tf_head h) { return (unsigned)h < TF_HEAD_COUNT ? HEAD_NAMES[h] : "?"; }

static int find_name(const char *const *names, int n, const char *name) {
    for (int i = 0; name && i < n; i++)
        if (strcmp(names[i], name) == 0) return i;
    return -1;
}
int tf_body_find(const char *name) { return find_name(BODY_NAMES, TF_BODY_COUNT, name); }
int tf_head_find(const char *name) { return find_name(HEAD_NAMES, TF_HEAD_COUNT, name); }

static const char *join(char *buf, size_t cap, const char *const *names, int n) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? ", " : "", names[i]);
    return buf;
}
const char *tf_body_names(void) {
    static char buf[128];
    return join(buf, sizeof buf, BODY_NAMES, TF_BODY_COUNT);
}
const char *tf_head_names(void) {
    static char buf[128];
    return join(buf, sizeof buf, HEAD_NAMES, TF_HEAD_COUNT);
}

void tf_config_default(tf_config *c) {
    memset(c, 0, sizeof *c);
    c->input = TF_INPUT_TOKENS;
    c->body = TF_BODY_TRANSFORMER;
    c->head = TF_HEAD_CATEGORICAL;
    c->lstm_hidden = 256;
    c->bidirectional = true;
    c->vocab = 12;
    c->max_len = 257;
    c->d_model = 128;
    c->heads = 8;
    c->layers = 4;
    c->d_ff = 512;
    c->dropout = 0.1f;
    c->pre_norm = false;
    c->final_norm = true;
    c->causal = true;
    c->attention = "linear";
    c->seed = 1;
    c->device = AB_DEV_CPU;
}

uint64_t tf_step_seed(uint64_t run_seed, uint64_t step) {
    uint32_t w[4];
    ab_philox4x32(run_seed, TF_STREAM_STEP, step, w);
    return (uint64_t)w[0] | (uint64_t)w[1] << 32;
}

uint64_t tf_attn_seed(uint64_t seed, int layer) {
    uint32_t w[4];
    ab_philox4x32(seed, TF_STREAM_ATTN, (uint64_t)layer, w);
    return (uint64_t)w[0] | (uint64_t)w[1] << 32;
}

/* ---- configuration ---- */

/* The targets' range: classes, or the vocabulary when classes is 0. */
int tf_targets_of(const tf_config *c) { return c->classes > 0 ? c->classes : c->vocab; }

/* The head's outputs per position: a logit per class, the mixture's 3K, or CTC's blank
 * and a logit per class. */
static int classes_of(const tf_config *c) {
    if (c->head == TF_HEAD_LOGISTIC_MIXTURE) return 3 * c->mixtures;
    return c->head == TF_HEAD_CTC ? tf_targets_of(c) + 1 : tf_targets_of(c);
}

/* The CTC loss's dimensions for a batch of B rows of N positions. */
ctc_dims tf_ctc_dims(const tf_config *c, int B, int N) {
    ctc_dims d = {B, N, classes_of(c), c->max_labels};
    return d;
}

/* The body's output channels. */
static int width_of(const tf_config *c) {
    if (c->body == TF_BODY_LSTM) return c->bidirectional ? 2 * c->lstm_hidden : c->lstm_hidden;
    return c->d_model;
}

static int check_config(const tf_config *c, int max_batch) {
    if (!c) return ab_fail(AB_EINVAL, "model config is NULL");
    if ((unsigned)c->input >= TF_INPUT_COUNT) return ab_fail(AB_EINVAL, "model input %d is not an input kind", (int)c->input);
    if ((unsigned)c->body >= TF_BODY_COUNT)
        return ab_fail(AB_EINVAL, "model body %d is not a body (one of: %s)", (int)c->body, tf_body_names());
    if ((unsigned)c->head >= TF_HEAD_COUNT)
        return ab_fail(AB_EINVAL, "model head %d is not a head (one of: %s)", (int)c->head, tf_head_names());
    if (c->input == TF_INPUT_TOKENS && c->vocab < 1) return ab_fail(AB_EINVAL, "model vocab %d must be >= 1", c->vocab);
    if (c->input == TF_INPUT_FRAMES && c->features < 1)
        return ab_fail(AB_EINVAL, "model features %d must be >= 1 (frames of F floats)", c->features);
    if (c->classes < 0 || (c->classes == 0 && c->input != TF_INPUT_TOKENS))
        return ab_fail(AB_EINVAL, "model classes %d must be >= 1 (0 means the vocabulary, for token input)", c->classes);
    if (c->head == TF_HEAD_LOGISTIC_MIXTURE) {
        if (c->mixtures < 1 || c->mixtures > TF_MAX_MIXTURES)
            return ab_fail(AB_EINVAL, "model mixtures %d: the logistic_mixture head needs 1..%d components", c->mixtures,
                           TF_MAX_MIXTURES);
        if (tf_targets_of(c) != 256)
            return ab_fail(AB_EINVAL, "model classes %d: the logistic_mixture head models 8-bit values (classes 256)",
                           tf_targets_of(c));
    } else if (c->mixtures != 0) {
        return ab_fail(AB_EINVAL, "model mixtures %d: only the logistic_mixture head has mixture components (set 0)",
                       c->mixtures);
    }
    if (c->max_len < 1) return ab_fail(AB_EINVAL, "model max_len %d must be >= 1", c->max_len);
    if (c->forward_len < 0 || c->forward_len > c->max_len)
        return ab_fail(AB_EINVAL, "model forward_len %d is outside 0..max_len=%d", c->forward_len, c->max_len);
    if (c->precision < 0 || c->precision >= AB_PREC_COUNT)
        return ab_fail(AB_EINVAL, "model precision %d is not a precision (fp32 or tf32)", c->precision);
    if (c->precision != AB_PREC_FP32 && c->device != AB_DEV_CUDA)
        return ab_fail(AB_EINVAL, "model precision %s: the CPU computes in fp32 only (use the CUDA device, or fp32)",
                       ab_precision_name((ab_precision)c->precision));
    for (int i = 0; i < c->n_attn_settings; i++)
        if (c->attn_settings && c->attn_settings[i] && strncmp(c->attn_settings[i], "precision=", 10) == 0)
            return ab_fail(AB_EINVAL, "model attention setting '%s': the model's precision sets the attention's (give "
                                      "it as the model's precision)",
                           c->attn_settings[i]);
    if (c->head == TF_HEAD_CTC) {
        if (c->max_labels < 1 || c->max_labels > c->max_len)
            return ab_fail(AB_EINVAL,
                           "model max_labels %d: the ctc head needs 1..max_len (%d) label slots per row (a row of "
                           "L labels needs at least L frames)",
                           c->max_labels, c->max_len);
        if (tf_targets_of(c) >= INT_MAX) return ab_fail(AB_EINVAL, "model classes %d: too many for the ctc head", tf_targets_of(c));
        ctc_dims d = tf_ctc_dims(c, max_batch > 0 ? max_batch : 1, c->max_len);
        int rc = ctc_dims_check(&d);
        if (rc) return rc;
    } else if (c->max_labels != 0) {
        return ab_fail(AB_EINVAL, "model max_labels %d: only the ctc head takes label sequences (set 0)",
                       c->max_labels);
    }
    if (c->d_model < 1) return ab_fail(AB_EINVAL, "model d_model %d must be >= 1", c->d_model);
    if (c->layers < 1) return ab_fail(AB_EINVAL, "model layers %d must be >= 1", c->layers);
    if (c->body == TF_BODY_TRANSFORMER) {
        if (c->heads < 1) return ab_fail(AB_EINVAL, "model heads %d must be >= 1", c->heads);
        if (c->d_model % c->heads != 0)
            return ab_fail(AB_EINVAL, "model d_model %d is not divisible by heads %d (head dimension = d_model / heads)",
                           c->d_model, c->heads);
        if (c->d_ff < 1) return ab_fail(AB_EINVAL, "model d_ff %d must be >= 1", c->d_ff);
    } else {
        if (c->lstm_hidden < 1 || c->lstm_hidden > (1 << 20))
            return ab_fail(AB_EINVAL, "model LSTM hidden size %d must be in [1, 2^20]", c->lstm_hidden);
        lstm_config lc = {c->d_model, c->lstm_hidden, c->layers, c->bidirectional, c->dropout};
        int rc = lstm_check_config(&lc);
        if (rc) return rc;
        if (c->causal && c->bidirectional)
            return ab_fail(AB_EINVAL, "a causal model cannot have a bidirectional LSTM (its reverse direction sees "
                                      "the future): set bidirectional to false");
    }
    if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
        return ab_fail(AB_EINVAL, "model dropout %g must be in [0, 1)", (double)c->dropout);
    if (max_batch < 1) return ab_fail(AB_EINVAL, "model max batch %d must be >= 1", max_batch);
    if ((unsigned)c->device >= AB_DEV_COUNT)
        return ab_fail(AB_EINVAL, "model device %d is neither the CPU (%d) nor CUDA (%d)", (int)c->device,
                       (int)AB_DEV_CPU, (int)AB_DEV_CUDA);
    if (c->body == TF_BODY_TRANSFORMER && (!c->attention || !*c->attention))
        return ab_fail(AB_EINVAL, "model attention variant is not set");
    if (c->n_attn_settings < 0 || (c->n_attn_settings > 0 && !c->attn_settings))
        return ab_fail(AB_EINVAL, "model attention settings list is malformed");
    /* GEMM dimensions are ints: rows B*N and widths 3C, F, K, 4H must fit */
    if ((long long)max_batch * c->max_len > INT_MAX || c->d_model > INT_MAX / 3 ||
        (c->body == TF_BODY_LSTM && c->lstm_hidden > INT_MAX / 8))
        return ab_fail(AB_EINVAL, "model sizes too large: max batch %d x max_len %d rows (or 3 x d_model %d) exceed %d",
                       max_batch, c->max_len, c->d_model, INT_MAX);
    return 0;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- size tables ---- */

/* The parameters of the input stage, the body and the head, in that order (the
 * order fixes each tensor's initialisation stream), or with grads the same carving of
 * the gradients. */
static void input_carve_params(tf_model *m, tf_table *t, bool grads) {
    const tf_config *c = &m->cfg;
    if (c->input == TF_INPUT_TOKENS) {
        *(grads ? &m->g_tok_emb : &m->tok_emb) = tf_carve_f(t, "tok_emb", false, 2, c->vocab, c->d_model, 0, 0);
    } else {
        *(grads ? &m->g_in_w : &m->in_w) = tf_carve_f(t, "in.w", true, 2, c->d_model, c->features, 0, 0);
        *(grads ? &m->g_in_b : &m->in_b) = tf_carve_f(t, "in.b", false, 1, c->d_model, 0, 0, 0);
    }
}

static void body_carve_params(tf_model *m, tf_table *t, bool grads) {
    const tf_config *c = &m->cfg;
    if (c->body == TF_BODY_TRANSFORMER) {
        enc_params *lp = grads ? m->lg : m->lp;
        for (int l = 0; l < c->layers; l++) {
            tf_table_prefix(t, "layers.%d.", l);
            enc_carve_params(t, &lp[l], &m->enc);
        }
        tf_table_prefix(t, "%s", "");
        if (m->attn_shared) {
            /* one block of the attention's parameters, bound to every layer */
            float *p = tf_carve_f(t, "attn.proj", true, 1, (int64_t)m->attn_shared, 0, 0, 0);
            *(grads ? &m->g_attn_proj : &m->attn_proj) = p;
            for (int l = 0; l < c->layers; l++) {
                lp[l].attn.proj = p;
                lp[l].attn.proj_len = m->enc.attn_len;
            }
        }
        if (c->final_norm) {
            *(grads ? &m->g_lnf_g : &m->lnf_g) = tf_carve_f(t, "final_ln.g", false, 1, c->d_model, 0, 0, 0);
            *(grads ? &m->g_lnf_b : &m->lnf_b) = tf_carve_f(t, "final_ln.b", false, 1, c->d_model, 0, 0, 0);
        }
    } else {
        tf_table_prefix(t, "%s", "lstm.");
        lstm_carve_params(t, grads ? &m->lsg : &m->lsp, &m->lc);
        tf_table_prefix(t, "%s", "");
    }
}

static void head_carve_params(tf_model *m, tf_table *t, bool grads) {
    *(grads ? &m->g_head_w : &m->head_w) = tf_carve_f(t, "head.w", true, 2, m->classes, m->width, 0, 0);
    *(grads ? &m->g_head_b : &m->head_b) = tf_carve_f(t, "head.b", false, 1, m->classes, 0, 0, 0);
}

static void carve_params(tf_model *m, tf_table *t, bool grads) {
    input_carve_params(m, t, grads);
    body_carve_params(m, t, grads);
    head_carve_params(m, t, grads);
}

static void carve_acts(tf_model *m, tf_table *t) {
    const tf_config *c = &m->cfg;
    /* a device whose memory is not the host's stages its inputs in host memory (and
     * keeps the lengths there, make_staging); one whose embedding backward reads the
     * token index gets it here */
    const bool host = ab_dev_host_memory(m->dev), tokens = c->input == TF_INPUT_TOKENS;
    const bool transformer = c->body == TF_BODY_TRANSFORMER;
    /* rows of one forward (fwd_len); the positions table keeps max_len rows */
    int B = m->max_batch, N = m->fwd_len, C = c->d_model, V = tokens ? c->vocab : 0, K = m->classes;
    int64_t W = m->width > C ? m->width : C;
    m->tokens = tf_carve(t, "tokens", sizeof(int), false, 2, B, tokens ? N : 0, 0, 0);
    /* CUDA: embedding_token_index of the tokens, starts (V + 1) then order (B N) */
    int *index = tf_carve(t, "token_index", sizeof(int), false, 1,
                          ld_token_index(m->dev) && tokens ? (int64_t)V + 1 + (int64_t)B * N : 0, 0, 0, 0);
    m->starts = index;
    m->order = index ? index + V + 1 : NULL;
    m->targets = tf_carve(t, "targets", sizeof(int), false, 2, B, N, 0, 0);
    m->weights = tf_carve_f(t, "weights", false, 2, B, N, 0, 0);
    /* lengths stay in host memory (attention.h): here on the CPU, in the staging on CUDA */
    int *lengths = tf_carve(t, "lengths", sizeof(int), false, 1, host ? B : 0, 0, 0, 0);
    if (host) m->lengths = lengths;
    m->frames = tf_carve_f(t, "frames", false, 3, B, N, tokens ? 0 : c->features, 0);
    m->pos_table = tf_carve_f(t, "positions", false, 2, m->max_len, transformer ? C : 0, 0, 0);
    m->emb = tf_carve_f(t, "emb", false, 3, B, N, C, 0);
    if (transformer) {
        /* forward only: layer l reads layer l-1's output and writes its own, so two
         * sets used in turn hold everything (layer l uses set l % 2) */
        const int sets = m->forward_only && c->layers > 2 ? 2 : c->layers;
        for (int l = 0; l < sets; l++) {
            tf_table_prefix(t, "layers.%d.", l);
            enc_carve_acts(t, &m->la[l], &m->enc, B, N, m->attn_saved, c->dropout > 0.0f);
        }
        for (int l = sets; l < c->layers; l++) m->la[l] = m->la[l % 2];
        tf_table_prefix(t, "%s", "");
        if (c->final_norm) {
            m->lnf_mean = tf_carve_f(t, "final_ln.mean", false, 2, B, N, 0, 0);
            m->lnf_rstd = tf_carve_f(t, "final_ln.rstd", false, 2, B, N, 0, 0);
            m->lnf_out = tf_carve_f(t, "final_ln.out", false, 3, B, N, C, 0);
        }
    } else {
        tf_table_prefix(t, "%s", "lstm.");
        lstm_carve_acts(t, &m->lsa, &m->lc, B, N, c->dropout > 0.0f);
        tf_table_prefix(t, "%s", "");
    }
    m->logits = tf_carve_f(t, "logits", false, 3, B, N, K, 0);
    m->nll = tf_carve_f(t, "nll", false, 2, B, N, 0, 0);
    tf_table_prefix(t, "%s", "scratch.");
    if (transformer) enc_carve_scratch(t, &m->ws, &m->enc, B, N);
    else lstm_carve_scratch(t, &m->lsw, &m->lc, B, N);
    m->dx_a = tf_carve_f(t, "dx_a", false, 3, B, N, W, 0);
    m->dx_b = tf_carve_f(t, "dx_b", false, 3, B, N, W, 0);
    m->dlogits = tf_carve_f(t, "dlogits", false, 3, B, N, K, 0);
    m->ce_ws = tf_carve(t, "ce", 1, false, 1, (int64_t)ld_cross_entropy_ws_bytes(m->dev, B * N), 0, 0, 0);
    tf_table_prefix(t, "%s", "");
    if (c->head == TF_HEAD_CTC) {
        /* the label inputs (counts, lengths, weights, labels: 3B + B S ints) and the
         * loss's tables (ctc_dims_check in check_config: the size fits) */
        const ctc_dims d = tf_ctc_dims(c, B, N);
        m->ctc_in = tf_carve(t, "ctc.in", sizeof(int), false, 1, (int64_t)B * (3 + (int64_t)c->max_labels), 0, 0, 0);
        m->ctc_ws = tf_carve(t, "ctc.ws", 1, false, 1, (int64_t)ctc_ws_bytes(&d), 0, 0, 0);
    }
}

/* CUDA: the host staging of the inputs, laid out as the device tensors from "tokens"
 * to the end of "token_index" and from "targets" to the end of "weights" (each range
 * one upload), then the frames (frame input) and the lengths. Needs the sized
 * activation table. */
static int make_staging(tf_model *m) {
    if (ab_dev_host_memory(m->dev)) return 0;
    const tf_tensor *tt = tf_table_find(&m->atab, "tokens"), *ti = tf_table_find(&m->atab, "token_index");
    const tf_tensor *tg = tf_table_find(&m->atab, "targets"), *tw = tf_table_find(&m->atab, "weights");
    const tf_tensor *tf = tf_table_find(&m->atab, "frames");
    size_t tok = (ti->offset + ti->count * sizeof(int) - tt->offset + 63) / 64 * 64;
    size_t tgt = (tw->offset + tw->count * sizeof(float) - tg->offset + 63) / 64 * 64;
    size_t frm = (tf->count * sizeof(float) + 63) / 64 * 64;
    size_t len = (sizeof(int) * (size_t)m->max_batch + 63) / 64 * 64;
    const tf_tensor *tc = tf_table_find(&m->atab, "ctc.in");
    size_t ctc = tc ? tc->count * sizeof(int) : 0;
    char *h = ab_alloc(tok + tgt + frm + len + ctc);
    if (!h) return AB_ENOMEM;
    m->host_in = h;
    m->h_tokens = (int *)h;
    m->h_starts = (int *)(h + (ti->offset - tt->offset));
    m->h_order = m->h_starts + m->cfg.vocab + 1;
    m->h_targets = (int *)(h + tok);
    m->h_weights = (float *)(h + tok + (tw->offset - tg->offset));
    m->h_frames = (float *)(h + tok + tgt);
    m->lengths = (int *)(h + tok + tgt + frm);
    m->h_ctc = tc ? (int *)(h + tok + tgt + frm + len) : NULL;
    return 0;
}

/* The positions table (computed on the host; uploaded on CUDA). */
static int init_tables(tf_model *m) {
    int N = m->max_len, C = m->cfg.d_model;
    if (!m->pos_table) return 0; /* a body without positions */
    if (ab_dev_host_memory(m->dev)) {
        positions_table(m->pos_table, N, C);
        return 0;
    }
    size_t bytes = sizeof(float) * (size_t)N * C;
    float *h = ab_alloc(bytes);
    if (!h) return AB_ENOMEM;
    positions_table(h, N, C);
    int rc = ab_dev_upload(m->dev, m->pos_table, h, bytes);
    ab_free(h);
    return rc;
}

/* ---- lifetime ---- */

/* The layout of the attention's own parameters (a transformer body's attention, as ao
 * asks for it): per layer in each layer's table (enc.attn_params), or one block for all
 * (attn_shared), sized for the model's max_len. The registry answers from the variant
 * and its settings (attn_variant_params), with or without an attention object. */
static int set_attn_params(tf_model *m, const attn_options *ao) {
    size_t n;
    bool shared;
    int rc = attn_variant_params(ao, m->cfg.max_len, &n, &shared);
    if (rc) return rc;
    m->enc.attn_params = shared ? 0 : n;
    m->enc.attn_len = m->cfg.max_len;
    m->attn_shared = shared ? n : 0;
    /* the attention's own input (gla's gate, deltanet's rate): the block's projection */
    const char *aux;
    int width;
    if ((rc = attn_variant_aux_of(ao, m->cfg.d_model / m->cfg.heads, &aux, &width))) return rc;
    return mha_aux_of(aux, width, &m->enc.aux);
}

/* The sizes the carving passes read, from the config. */
static void set_dims(tf_model *m, const tf_config *cfg) {
    m->classes = classes_of(cfg);
    m->width = width_of(cfg);
    m->enc = (enc_config){cfg->d_model, cfg->heads, cfg->d_ff, cfg->dropout, cfg->pre_norm, cfg->causal, 0, 0, {0}};
    /* the attention's own parameters: set_attn_params (from the registry) */
    m->lc = (lstm_config){cfg->d_model, cfg->lstm_hidden, cfg->layers, cfg->bidirectional, cfg->dropout};
}

int tf_param_count_for(const tf_config *cfg, size_t *count) {
    *count = 0;
    int rc = check_config(cfg, 1);
    if (rc) return rc;
    /* a model with nothing allocated but its per-layer records, carved once unbound:
     * the same sizing pass as tf_create's, so the counts cannot drift apart */
    tf_model *m = calloc(1, sizeof *m);
    if (m) m->lp = calloc((size_t)cfg->layers, sizeof *m->lp);
    if (!m || !m->lp) {
        free(m);
        return ab_fail(AB_ENOMEM, "out of memory sizing a model");
    }
    m->cfg = *cfg;
    set_dims(m, cfg);
    if (cfg->body == TF_BODY_TRANSFORMER) {
        /* the attention's own parameters: the registry says how many from the variant
         * and its settings (the count does not depend on the device; nothing is made) */
        attn_options ao = {.variant = cfg->attention, .device = AB_DEV_CPU,
                           .n_settings = cfg->n_attn_settings, .settings = cfg->attn_settings};
        if ((rc = set_attn_params(m, &ao))) {
            free(m->lp);
            free(m);
            return rc;
        }
    }
    tf_table t;
    tf_table_init(&t, sizeof(float), 1);
    tf_table_begin(&t, NULL);
    carve_params(m, &t, false);
    rc = t.err;
    if (!rc) *count = t.total;
    tf_table_free(&t);
    free(m->lp);
    free(m);
    return rc;
}

void tf_destroy(tf_model *m) {
    if (!m) return;
    attn_destroy(m->att);
    ab_dev_free(m->dev, m->params);
    ab_dev_free(m->dev, m->grads);
    ab_dev_free(m->dev, m->acts);
    ab_free(m->host_in);
    tf_table_free(&m->ptab);
    tf_table_free(&m->atab);
    free(m->lp);
    free(m->lg);
    free(m->la);
    free(m->variant);
    if (m->settings)
        for (int i = 0; i < m->n_settings; i++) free(m->settings[i]);
    free(m->settings);
    free(m);
}

static int create(const tf_config *cfg, int max_batch, bool forward_only, tf_model **out) {
    if (!out) return ab_fail(AB_EINVAL, "tf_create: NULL output");
    *out = NULL;
    int rc = check_config(cfg, max_batch);
    if (rc) return rc;
    tf_model *m = calloc(1, sizeof *m);
    if (!m) return ab_fail(AB_ENOMEM, "out of memory for a model");
    m->cfg = *cfg;
    m->max_batch = max_batch;
    m->max_len = cfg->max_len;
    m->fwd_len = forward_only && cfg->forward_len > 0 && cfg->forward_len < cfg->max_len ? cfg->forward_len
                                                                                           : cfg->max_len;
    m->forward_only = m->inference = forward_only;
    m->dev = cfg->device;
    m->variant = dup_str(cfg->attention ? cfg->attention : "");
    /* the attention's settings, and its precision when the model's is not the default */
    const int n_set = cfg->n_attn_settings + (cfg->precision != AB_PREC_FP32);
    m->settings = n_set ? calloc((size_t)n_set, sizeof(char *)) : NULL;
    m->lp = calloc((size_t)cfg->layers, sizeof *m->lp);
    m->lg = calloc((size_t)cfg->layers, sizeof *m->lg);
    m->la = calloc((size_t)cfg->layers, sizeof *m->la);
    bool ok = m->variant && (m->settings || !n_set) && m->lp && m->lg && m->la;
    for (int i = 0; ok && i < cfg->n_attn_settings; i++) {
        if (!cfg->attn_settings[i]) {
            tf_destroy(m);
            return ab_fail(AB_EINVAL, "model attention setting %d is NULL", i);
        }
        ok = (m->settings[i] = dup_str(cfg->attn_settings[i])) != NULL;
        m->n_settings += ok; /* copied so far (tf_destroy frees them) */
    }
    if (ok && n_set > cfg->n_attn_settings) {
        char buf[64];
        snprintf(buf, sizeof buf, "precision=%s", ab_precision_name((ab_precision)cfg->precision));
        ok = (m->settings[m->n_settings] = dup_str(buf)) != NULL;
        m->n_settings += ok;
    }
    if (!ok) {
        tf_destroy(m);
        return ab_fail(AB_ENOMEM, "out of memory for a model");
    }
    m->cfg.attention = m->variant;
    m->cfg.attn_settings = (const char *const *)m->settings;
    set_dims(m, cfg);

    /* the attention (transformer body), checked at the largest shape */
    const int fwd_len = m->fwd_len;
    mha_dims md = {max_batch, fwd_len, cfg->d_model, cfg->heads, cfg->causal, NULL, m->dev, 0};
    attn_shape as = mha_shape(&md);
    if (cfg->body == TF_BODY_TRANSFORMER) {
        attn_options ao = {.variant = m->variant, .device = m->dev, .seed = tf_attn_seed(cfg->seed, 0),
                           .n_settings = m->n_settings, .settings = (const char *const *)m->settings};
        if ((rc = attn_create(&ao, &m->att))) {
            tf_destroy(m);
            return rc;
        }
        if ((rc = attn_check_shape(m->att, &as))) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", ab_error());
            tf_destroy(m);
            return ab_fail(rc, "model attention at batch %d, length %d: %s", max_batch, fwd_len, msg);
        }
        m->attn_saved = forward_only && attn_can_forward_unsaved(m->att) ? 0 : attn_saved_bytes(m->att, &as);
        if ((rc = set_attn_params(m, &ao))) {
            tf_destroy(m);
            return rc;
        }
    } else if ((rc = ab_dev_init(m->dev))) {
        tf_destroy(m);
        return rc;
    }

    /* sizing passes, allocation, binding passes */
    tf_table_init(&m->ptab, sizeof(float), 1);
    tf_table_init(&m->atab, 1, 64);
    tf_table_begin(&m->ptab, NULL);
    carve_params(m, &m->ptab, false);
    tf_table_begin(&m->atab, NULL);
    carve_acts(m, &m->atab);
    if ((rc = m->ptab.err ? m->ptab.err : m->atab.err)) {
        tf_destroy(m);
        return rc;
    }
    size_t pbytes;
    if (ab_mul_size(m->ptab.total, sizeof(float), &pbytes)) {
        tf_destroy(m);
        return ab_fail(AB_EINVAL, "model parameters overflow");
    }
    if (ab_dev_host_memory(m->dev)) {
        m->params = ab_calloc(pbytes);
        m->grads = ab_calloc(pbytes);
        m->acts = ab_calloc(tf_table_bytes(&m->atab));
        rc = m->params && m->grads && m->acts ? 0 : AB_ENOMEM;
    } else {
        /* device memory comes uninitialised: the gradients are zeroed below, the
         * parameters initialised, and the activations are written before being read */
        if (!(rc = ab_dev_malloc(m->dev, (void **)&m->params, pbytes)) &&
            !(rc = ab_dev_malloc(m->dev, (void **)&m->grads, pbytes)))
            rc = ab_dev_malloc(m->dev, &m->acts, tf_table_bytes(&m->atab));
        if (!rc) rc = make_staging(m);
    }
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ab_error());
        size_t total = 2 * pbytes + tf_table_bytes(&m->atab);
        const char *where = ab_dev_host_memory(m->dev) ? "the host" : "the CUDA device";
        tf_destroy(m);
        return ab_fail(rc, "model needs %.1f MiB (parameters, gradients, activations) on %s: %s",
                       (double)total / 1048576.0, where, msg);
    }
    tf_table gtab;
    tf_table_init(&gtab, sizeof(float), 1);
    tf_table_begin(&gtab, m->grads);
    carve_params(m, &gtab, true);
    tf_table_free(&gtab);
    tf_table_begin(&m->ptab, m->params);
    carve_params(m, &m->ptab, false);
    tf_table_begin(&m->atab, m->acts);
    carve_acts(m, &m->atab);

    if (m->att && (rc = attn_reserve(m->att, &as))) {
        tf_destroy(m);
        return rc;
    }
    if ((rc = init_tables(m)) || (rc = tf_init_params(m, cfg->seed)) || (rc = tf_zero_grad(m))) {
        tf_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

const tf_config *tf_get_config(const tf_model *m) { return &m->cfg; }
ab_device tf_device(const tf_model *m) { return m->dev; }
size_t tf_param_count(const tf_model *m) { return m->ptab.total; }
float *tf_params(tf_model *m) { return m->params; }
float *tf_grads(tf_model *m) { return m->grads; }
int tf_param_tensor_count(const tf_model *m) { return m->ptab.n; }
const tf_tensor *tf_param_tensor(const tf_model *m, int i) { return i >= 0 && i < m->ptab.n ? &m->ptab.t[i] : NULL; }
size_t tf_act_bytes(const tf_model *m) { return tf_table_bytes(&m->atab); }
void *tf_acts(tf_model *m) { return m->acts; }
int tf_act_tensor_count(const tf_model *m) { return m->atab.n; }
const tf_tensor *tf_act_tensor(const tf_model *m, int i) { return i >= 0 && i < m->atab.n ? &m->atab.t[i] : NULL; }
int tf_zero_grad(tf_model *m) { return ld_zero(m->dev, m->grads, sizeof(float) * m->ptab.total); }
const float *tf_logits(const tf_model *m) { return m->logits; }

int tf_params_download(const tf_model *m, float *host) {
    if (!m || !host) return ab_fail(AB_EINVAL, "tf_params_download: NULL argument");
    return ab_dev_download(m->dev, host, m->params, sizeof(float) * m->ptab.total);
}

int tf_params_upload(tf_model *m, const float *host) {
    if (!m || !host) return ab_fail(AB_EINVAL, "tf_params_upload: NULL argument");
    return ab_dev_upload(m->dev, m->params, host, sizeof(float) * m->ptab.total);
}

int tf_grads_download(const tf_model *m, float *host) {
    if (!m || !host) return ab_fail(AB_EINVAL, "tf_grads_download: NULL argument");
    return ab_dev_download(m->dev, host, m->grads, sizeof(float) * m->ptab.total);
}

int tf_logits_download(const tf_model *m, float *host) {
    if (!m || !host) return ab_fail(AB_EINVAL, "tf_logits_download: NULL argument");
    if (!m->have_forward) return ab_fail(AB_EINVAL, "tf_logits_download: no forward (call tf_forward first)");
    return ab_dev_download(m->dev, host, m->logits, sizeof(float) * (size_t)m->B * m->N * m->classes);
}

/* ---- forward ---- */

/* The input stage -> emb (B, N, C): token embedding or the dense projection of the
 * frames, plus the positions (from pos0) for a body that needs them. */
static int input_forward(tf_model *m, const int *tokens, int B, int N, int pos0) {
    int C = m->cfg.d_model, rc;
    if (m->cfg.input == TF_INPUT_TOKENS) /* one pass: embedding then positions, the same bits */
        return ld_embedding_positions(m->dev, m->emb, tokens, m->tok_emb, m->pos_table, B, N, C, pos0);
    rc = ld_dense_forward(m->dev, m->emb, m->frames, m->in_w, m->in_b, B * N, m->cfg.features, C);
    if (rc || !m->pos_table) return rc;
    return ld_positions_add(m->dev, m->emb, m->pos_table, B, N, C, pos0);
}

int tf_create(const tf_config *cfg, int max_batch, tf_model **out) { return create(cfg, max_batch, false, out); }

int tf_create_inference(const tf_config *cfg, int max_batch, tf_model **out) {
    return create(cfg, max_batch, true, out);
}

const float *tf_layer_input(const tf_model *m, int l) {
    return l == 0 ? m->emb : enc_output(&m->enc, &m->la[l - 1]);
}

/* the input of the head: the transformer's final LN output or last layer's output */
const float *tf_body_output(const tf_model *m) {
    if (m->cfg.body == TF_BODY_LSTM) return lstm_output(&m->lc, &m->lsa);
    return m->cfg.final_norm ? m->lnf_out : tf_layer_input(m, m->cfg.layers);
}

static int body_forward(tf_model *m, const mha_dims *d, bool train, uint64_t seed, const mha_run *runs) {
    const mha_run infer = {MHA_INFER, NULL, 0};
    if (m->cfg.body == TF_BODY_LSTM) {
        lstm_dims ld = {d->B, d->N, d->lengths, m->dev, d->row0};
        return lstm_stack_forward(&m->lc, &ld, m->emb, &m->lsp, &m->lsa, &m->lsw, train, seed, TF_STREAM_DROPOUT);
    }
    for (int l = 0; l < m->cfg.layers; l++) {
        attn_reseed(m->att, tf_attn_seed(seed, l));
        const mha_run *run = runs ? &runs[l] : m->inference ? &infer : NULL;
        int rc = enc_forward(m->att, &m->enc, d, run, tf_layer_input(m, l), &m->lp[l], &m->la[l],
                             &m->ws, train, seed, TF_STREAM_DROPOUT + 4 * (uint64_t)l);
        if (rc) return rc;
    }
    if (m->cfg.final_norm)
        return ld_layernorm_forward(m->dev, m->lnf_out, m->lnf_mean, m->lnf_rstd, tf_layer_input(m, m->cfg.layers),
                                    m->lnf_g, m->lnf_b, d->B * d->N, m->cfg.d_model);
    return 0;
}

static int head_forward(tf_model *m, int BT) {
    return ld_dense_forward(m->dev, m->logits, tf_body_output(m), m->head_w, m->head_b, BT, m->width, m->classes);
}

/* The tokens (B N) into the model's buffer; on CUDA with their token index for the
 * embedding backward, in one upload. */
static int put_tokens(tf_model *m, const int *tokens, int BT) {
    if (ab_dev_host_memory(m->dev)) {
        memcpy(m->tokens, tokens, sizeof(int) * (size_t)BT);
        return 0;
    }
    memcpy(m->h_tokens, tokens, sizeof(int) * (size_t)BT);
    embedding_token_index(m->h_order, m->h_starts, tokens, BT, m->cfg.vocab);
    size_t bytes = (size_t)((char *)(m->h_order + BT) - (char *)m->h_tokens);
    return ab_dev_upload(m->dev, m->tokens, m->h_tokens, bytes);
}

/* The frames (B N F) into the model's buffer (one upload on CUDA). */
static int put_frames(tf_model *m, const float *frames, int BT) {
    size_t bytes = sizeof(float) * (size_t)BT * (size_t)m->cfg.features;
    if (ab_dev_host_memory(m->dev)) {
        memcpy(m->frames, frames, bytes);
        return 0;
    }
    return ab_dev_upload(m->dev, m->frames, frames, bytes);
}

/* 0 when a forward of B rows of N positions from position pos0 fits the model */
static int check_fit(const tf_model *m, int B, int N, int pos0) {
    if (B >= 1 && B <= m->max_batch && N >= 1 && N <= m->fwd_len && pos0 >= 0 && pos0 <= m->max_len - N) return 0;
    return ab_fail(AB_EINVAL, "batch %d x length %d from position %d does not fit the model (batch 1..%d, length 1..%d, "
                              "positions 0..%d)", B, N, pos0, m->max_batch, m->fwd_len, m->max_len - 1);
}

static int forward_run(tf_model *m, const tf_in *in, int B, int N, int pos0, const int *lengths, bool train,
                       uint64_t seed, const mha_run *runs) {
    m->have_forward = m->have_loss = false;
    m->out_B = m->out_N = 0;
    if (check_fit(m, B, N, pos0)) return AB_EINVAL;
    m->forwards++;
    m->infer_forward = m->inference || runs != NULL;
    int rc = in->dev_tokens ? 0 : in->tokens ? put_tokens(m, in->tokens, B * N) : put_frames(m, in->frames, B * N);
    if (rc || (rc = input_forward(m, in->dev_tokens ? in->dev_tokens : m->tokens, B, N, pos0))) return rc;
    mha_dims d = {B, N, m->cfg.d_model, m->cfg.heads, m->cfg.causal, lengths, m->dev, m->row0};
    if ((rc = body_forward(m, &d, train, seed, runs)) || (rc = head_forward(m, B * N))) return rc;
    m->out_B = B, m->out_N = N;
    return 0;
}

int tf_step_input(tf_model *m, const int *dev_tokens, int B, int pos0) {
    m->have_forward = m->have_loss = false;
    m->out_B = m->out_N = 0;
    if (check_fit(m, B, 1, pos0)) return AB_EINVAL;
    m->infer_forward = true;
    return input_forward(m, dev_tokens, B, 1, pos0);
}

int tf_step_body(tf_model *m, int B, uint64_t seed, const mha_run *runs, void *graph) {
    mha_dims d = {B, 1, m->cfg.d_model, m->cfg.heads, m->cfg.causal, NULL, m->dev, m->row0};
    int rc = graph ? ab_cuda_graph_launch(graph) : body_forward(m, &d, false, seed, runs);
    if (rc || (!graph && (rc = head_forward(m, B)))) return rc;
    m->out_B = B, m->out_N = 1;
    return 0;
}

ab_precision tf_precision_enter(const tf_model *m) {
    return ld_set_gemm_precision(m->dev, (ab_precision)m->cfg.precision);
}

void tf_precision_leave(const tf_model *m, ab_precision p0) {
    ld_set_gemm_precision(m->dev, p0);
}

int tf_forward_run(tf_model *m, const tf_in *in, int B, int N, int pos0, const int *lengths, bool train,
                   uint64_t seed, const mha_run *runs) {
    const ab_precision p0 = tf_precision_enter(m);
    int rc = forward_run(m, in, B, N, pos0, lengths, train, seed, runs);
    tf_precision_leave(m, p0);
    return rc;
}

int tf_check_tokens(const tf_model *m, const int *tokens, size_t n, const char *what) {
    if (m->cfg.input != TF_INPUT_TOKENS)
        return ab_fail(AB_EINVAL, "%s: the model's input is %s, not tokens", what, tf_input_name(m->cfg.input));
    if (!tokens) return ab_fail(AB_EINVAL, "%s: NULL tokens", what);
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab)
            return ab_fail(AB_EINVAL, "%s: token %d at index %zu is outside [0, vocab=%d)", what, tokens[i], i,
                           m->cfg.vocab);
    return 0;
}

static int check_frames(const tf_model *m, const float *frames, size_t n, const char *what) {
    if (m->cfg.input != TF_INPUT_FRAMES)
        return ab_fail(AB_EINVAL, "%s: the model's input is %s, not frames", what, tf_input_name(m->cfg.input));
    if (!frames) return ab_fail(AB_EINVAL, "%s: NULL frames", what);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(frames[i])) return ab_fail(AB_EINVAL, "%s: frame value %zu is not finite", what, i);
    return 0;
}

static int forward(tf_model *m, const tf_in *in, bool frames, int B, int N, const int *lengths, bool train,
                   uint64_t seed) {
    if (!m) return ab_fail(AB_EINVAL, "tf_forward: NULL model");
    m->have_forward = m->have_loss = false;
    if (check_fit(m, B, N, 0)) return AB_EINVAL;
    int rc = !frames ? tf_check_tokens(m, in->tokens, (size_t)B * N, "tf_forward")
                     : check_frames(m, in->frames, (size_t)B * N * (size_t)m->cfg.features, "tf_forward_frames");
    if (rc) return rc;
    if (lengths) {
        for (int b = 0; b < B; b++)
            if (lengths[b] < 0 || lengths[b] > N)
                return ab_fail(AB_EINVAL, "tf_forward: lengths[%d] = %d is outside [0, N=%d]", b, lengths[b], N);
        memcpy(m->lengths, lengths, sizeof(int) * (size_t)B);
    }
    if (m->att && !(m->forward_only && attn_can_forward_unsaved(m->att))) {
        mha_dims d = {B, N, m->cfg.d_model, m->cfg.heads, m->cfg.causal, NULL, m->dev, 0};
        attn_shape s = mha_shape(&d);
        if (attn_saved_bytes(m->att, &s) > m->attn_saved)
            return ab_fail(AB_EINVAL, "tf_forward: attention at batch %d, length %d saves more than at the maximum shape",
                           B, N);
    }
    rc = tf_forward_run(m, in, B, N, 0, lengths ? m->lengths : NULL, train, seed, NULL);
    if (rc) return rc;
    m->B = B;
    m->N = N;
    m->has_lengths = lengths != NULL;
    m->train = train;
    m->seed = seed;
    m->have_forward = true;
    return 0;
}

void tf_set_row_offset(tf_model *m, long long row0) { m->row0 = row0 < 0 ? 0 : row0; }

int tf_forward(tf_model *m, const int *tokens, int B, int N, const int *lengths, bool train, uint64_t seed) {
    tf_in in = {tokens, NULL, NULL};
    return forward(m, &in, false, B, N, lengths, train, seed);
}

int tf_forward_frames(tf_model *m, const float *frames, int B, int N, const int *lengths, bool train, uint64_t seed) {
    tf_in in = {NULL, frames, NULL};
    return forward(m, &in, true, B, N, lengths, train, seed);
}

int tf_classes(const tf_model *m) { return m->classes; }

void tf_set_inference(tf_model *m, bool on) {
    if (m) m->inference = on || m->forward_only;
}
int tf_target_classes(const tf_model *m) { return tf_targets_of(&m->cfg); }
