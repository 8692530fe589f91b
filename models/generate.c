/* Generation: by recomputation (a full forward per new token, every variant) or as an
 * RNN (a per-layer attention state, prefilled from the prompt in one parallel call per
 * layer, then one step per layer for each new token). */
#include "transformer_internal.h"

#include "layers_dev.h"

#include "../harness/device.h"
#include "../harness/error.h"
#include "../harness/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tf_gen {
    tf_model *m;
    int B, capacity, t;
    uint64_t seed;       /* of the forward passes (tf_gen_set_seed) */
    attn_state **states; /* per layer (attention.h: memory on the attention's device) */
    mha_run *runs;       /* per layer */
};

/* The logits (B, V) of position N-1 of the last forward into out (host memory; NULL:
 * nothing, they stay for tf_draw_last). On CUDA the rows are first gathered in the
 * dlogits scratch, then copied in one go. */
static int copy_last(const tf_model *m, int B, int N, float *out) {
    if (!out) return 0;
    size_t V = (size_t)m->classes;
    const float *last = m->logits + (size_t)(N - 1) * V;
    if (ab_dev_host_memory(m->dev)) {
        for (int b = 0; b < B; b++) memcpy(out + (size_t)b * V, last + (size_t)b * N * V, sizeof(float) * V);
        return 0;
    }
    if (N > 1) {
        int rc = ld_rows_copy(m->dev, m->dlogits, V, last, (size_t)N * V, (size_t)B, V);
        if (rc) return rc;
        last = m->dlogits;
    }
    return ab_dev_download(m->dev, out, last, sizeof(float) * (size_t)B * V);
}

int tf_last_logits(tf_model *m, const int *tokens, int B, int N, uint64_t seed, float *out) {
    const bool was = m->inference;
    m->inference = true; /* no backward follows */
    int rc = tf_forward(m, tokens, B, N, NULL, false, seed);
    m->inference = was;
    return rc ? rc : copy_last(m, B, N, out);
}

bool tf_has_recurrent(const tf_model *m) {
    if (!m) return false;
    if (m->cfg.body != TF_BODY_TRANSFORMER || m->cfg.input != TF_INPUT_TOKENS) {
        ab_fail(AB_EUNSUPPORTED, "generation as an RNN needs a transformer over tokens (this model: %s over %s)",
                tf_body_name(m->cfg.body), tf_input_name(m->cfg.input));
        return false;
    }
    if (!attn_has_step(m->att)) {
        ab_fail(AB_EUNSUPPORTED, "attention '%s' has no recurrent mode: generate by recomputation", m->cfg.attention);
        return false;
    }
    if (!m->cfg.causal) {
        ab_fail(AB_EUNSUPPORTED, "a non-causal model has no recurrent mode");
        return false;
    }
    return true;
}

static attn_shape gen_shape(const tf_model *m, int B) {
    mha_dims d = {B, 1, m->cfg.d_model, m->cfg.heads, true, NULL, m->dev, 0};
    return mha_shape(&d);
}

static int check_gen(const tf_model *m, int B, int capacity) {
    if (!tf_has_recurrent(m)) return AB_EUNSUPPORTED;
    if (B < 1 || B > m->max_batch) return ab_fail(AB_EINVAL, "generation batch %d is outside 1..%d", B, m->max_batch);
    if (capacity < 1 || capacity > m->max_len)
        return ab_fail(AB_EINVAL, "generation capacity %d is outside 1..max_len=%d", capacity, m->max_len);
    return 0;
}

size_t tf_gen_state_bytes(const tf_model *m, int B, int capacity) {
    if (!m || check_gen(m, B, capacity)) return 0;
    attn_shape s = gen_shape(m, B);
    size_t b = attn_state_bytes(m->att, &s, capacity), total;
    if (b == 0 || ab_mul_size(b, (size_t)m->cfg.layers, &total)) return 0;
    return total;
}

int tf_gen_init(tf_gen *g) {
    if (!g) return ab_fail(AB_EINVAL, "tf_gen_init: NULL generator");
    for (int l = 0; l < g->m->cfg.layers; l++) {
        int rc = attn_state_reset(g->m->att, g->states[l]);
        if (rc) return rc;
        g->runs[l] = (mha_run){MHA_PREFILL, g->states[l], 0};
    }
    g->t = 0;
    return 0;
}

int tf_gen_create(tf_model *m, int B, int capacity, tf_gen **out) {
    if (!m || !out) return ab_fail(AB_EINVAL, "tf_gen_create: NULL argument");
    *out = NULL;
    int rc = check_gen(m, B, capacity);
    if (rc) return rc;
    size_t total = tf_gen_state_bytes(m, B, capacity);
    if (total == 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ab_error());
        return ab_fail(AB_EINVAL, "generation state for batch %d, capacity %d: %s", B, capacity, msg);
    }
    tf_gen *g = calloc(1, sizeof *g);
    if (!g) return ab_fail(AB_ENOMEM, "out of memory for a generator");
    g->m = m;
    g->B = B;
    g->capacity = capacity;
    g->states = calloc((size_t)m->cfg.layers, sizeof *g->states);
    g->runs = calloc((size_t)m->cfg.layers, sizeof *g->runs);
    if (!g->states || !g->runs) {
        tf_gen_destroy(g);
        return ab_fail(AB_ENOMEM, "out of memory for a generator");
    }
    attn_shape s = gen_shape(m, B);
    for (int l = 0; l < m->cfg.layers; l++)
        if ((rc = attn_state_create(m->att, &s, capacity, &g->states[l]))) {
            tf_gen_destroy(g);
            return rc;
        }
    if ((rc = tf_gen_init(g))) {
        tf_gen_destroy(g);
        return rc;
    }
    *out = g;
    return 0;
}

void tf_gen_destroy(tf_gen *g) {
    if (!g) return;
    for (int l = 0; g->states && l < g->m->cfg.layers; l++) attn_state_destroy(g->states[l]);
    free(g->states);
    free(g->runs);
    free(g);
}

int tf_gen_position(const tf_gen *g) { return g ? g->t : 0; }

void tf_gen_set_seed(tf_gen *g, uint64_t seed) {
    if (g) g->seed = seed;
}

int tf_gen_prefill(tf_gen *g, const int *tokens, int P, float *logits) {
    if (!g) return ab_fail(AB_EINVAL, "tf_gen_prefill: NULL generator");
    if (g->t != 0)
        return ab_fail(AB_EINVAL, "tf_gen_prefill: the state already holds %d positions (tf_gen_init)", g->t);
    if (P < 1 || P > g->capacity)
        return ab_fail(AB_EINVAL, "tf_gen_prefill: prompt of %d positions is outside 1..capacity=%d", P, g->capacity);
    int rc = tf_check_tokens(g->m, tokens, (size_t)g->B * P, "generation");
    if (rc) return rc;
    for (int l = 0; l < g->m->cfg.layers; l++) {
        g->runs[l].mode = MHA_PREFILL;
        g->runs[l].t = 0;
    }
    tf_in in = {tokens, NULL};
    rc = tf_forward_run(g->m, &in, g->B, P, 0, NULL, false, g->seed, g->runs);
    if (rc || (rc = copy_last(g->m, g->B, P, logits))) return rc;
    g->t = P;
    return 0;
}

int tf_gen_step(tf_gen *g, const int *tokens, float *logits) {
    if (!g) return ab_fail(AB_EINVAL, "tf_gen_step: NULL generator");
    if (g->t >= g->capacity) return ab_fail(AB_EINVAL, "tf_gen_step: the state is full (capacity %d)", g->capacity);
    int rc = tf_check_tokens(g->m, tokens, (size_t)g->B, "generation");
    if (rc) return rc;
    for (int l = 0; l < g->m->cfg.layers; l++) {
        g->runs[l].mode = MHA_STEP;
        g->runs[l].t = g->t;
    }
    tf_in in = {tokens, NULL};
    rc = tf_forward_run(g->m, &in, g->B, 1, g->t, NULL, false, g->seed, g->runs);
    if (rc || (rc = copy_last(g->m, g->B, 1, logits))) return rc;
    g->t++;
    return 0;
}

int tf_draw_last(tf_model *m, const draw_spec *d, int *out) {
    if (!m || !d || !out) return ab_fail(AB_EINVAL, "tf_draw_last: NULL argument");
    if (m->out_B < 1 || m->cfg.input != TF_INPUT_TOKENS)
        return ab_fail(AB_EINVAL, "tf_draw_last: no forward over tokens to draw from");
    const bool mixture = m->cfg.head == TF_HEAD_LOGISTIC_MIXTURE;
    if (d->mixture != mixture)
        return ab_fail(AB_EINVAL, "tf_draw_last: the draw is for a %s, the model's head is %s",
                       d->mixture ? "logistic mixture" : "categorical head", tf_head_name(m->cfg.head));
    draw_spec s = *d;
    s.n = mixture ? m->cfg.mixtures : m->classes;
    const size_t K = (size_t)m->classes, N = (size_t)m->out_N;
    const float *last = m->logits + (N - 1) * K;
    if (ab_dev_host_memory(m->dev)) return ld_draw_rows(m->dev, out, last, N * K, m->out_B, &s);
    /* the values go through the dlogits scratch (B N K floats, unused by a forward),
     * which holds the B ints */
    int *draws = (int *)m->dlogits;
    int rc = ld_draw_rows(m->dev, draws, last, N * K, m->out_B, &s);
    return rc ? rc : ab_dev_download(m->dev, out, draws, sizeof(int) * (size_t)m->out_B);
}
