/* Generation: by recomputation (a full forward per new token, every variant) or as an
 * RNN (a per-layer attention state, prefilled from the prompt in one parallel call per
 * layer, then one step per layer for each new token). A generator can also keep its
 * draws on the model's device (tf_gen_draw): each drawn value is the next step's input
 * there and is kept in a table, so that a sampling loop queues its positions without
 * waiting for the device and copies the values back once.
 *
 * On CUDA, with tf_gen_set_graph, such a step (its input the last draws) runs the
 * layers and the head as a CUDA graph: recorded at the first step after a prefill,
 * launched at each step after it (one launch where there were one or more per
 * operation: 77 at MNIST's shape). Only the embedding of the position and the draw stay
 * outside, since their work depends on the position. A variant whose step depends on
 * its position (attn_step_replayable false), or a recording that fails, leaves the
 * steps as they are (tf_gen_graph_note says why). */
#include "transformer_internal.h"

#include "layers_dev.h"
#include "mixture_core.h"

#include "../harness/cuda_device.h"
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
    int *next;           /* (B) the last draws, the next step's input (model's device) */
    int *table;          /* (B, capacity) the draws by position, -1 where none (model's device) */
    bool drawn;          /* next holds draws from the last position's logits */
    /* the recorded step (tf_gen_set_graph): asked for, the recording (valid while the
     * model runs no other forward, prefills included: one may move the buffers it names),
     * recordings and launches made, and why none is used (empty while one may be) */
    bool graph_on;
    void *graph;
    unsigned long long graph_forwards; /* the model's forwards when it was recorded */
    long long graph_records, graph_launches;
    char graph_note[320];
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

const attn *tf_attention(const tf_model *m) { return m ? m->att : NULL; }

attn_shape tf_gen_step_shape(const tf_model *m, int B) { return gen_shape(m, B); }

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

static size_t table_bytes(const tf_gen *g) { return sizeof(int) * (size_t)g->B * (size_t)g->capacity; }

static void drop_graph(tf_gen *g) {
    ab_cuda_graph_destroy(g->graph);
    g->graph = NULL;
}

int tf_gen_init(tf_gen *g) {
    if (!g) return ab_fail(AB_EINVAL, "tf_gen_init: NULL generator");
    for (int l = 0; l < g->m->cfg.layers; l++) {
        int rc = attn_state_reset(g->m->att, g->states[l]);
        if (rc) return rc;
        g->runs[l] = (mha_run){MHA_PREFILL, g->states[l], 0};
    }
    g->t = 0;
    g->drawn = false;
    return ab_dev_memset(g->m->dev, g->table, 0xff, table_bytes(g)); /* -1: nothing drawn */
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
    snprintf(g->graph_note, sizeof g->graph_note, "not asked for");
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
    if ((rc = ab_dev_malloc(m->dev, (void **)&g->next, sizeof(int) * (size_t)B)) ||
        (rc = ab_dev_malloc(m->dev, (void **)&g->table, table_bytes(g)))) {
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
    drop_graph(g);
    for (int l = 0; g->states && l < g->m->cfg.layers; l++) attn_state_destroy(g->states[l]);
    ab_dev_free(g->m->dev, g->next);
    ab_dev_free(g->m->dev, g->table);
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
    tf_in in = {tokens, NULL, NULL};
    g->drawn = false;
    rc = tf_forward_run(g->m, &in, g->B, P, 0, NULL, false, g->seed, g->runs);
    if (rc || (rc = copy_last(g->m, g->B, P, logits))) return rc;
    g->t = P;
    return 0;
}

/* The note when a recorded step cannot be used for this generator (else ""). */
static void graph_check(tf_gen *g) {
    const tf_model *m = g->m;
    if (ab_dev_host_memory(m->dev))
        snprintf(g->graph_note, sizeof g->graph_note, "the model runs on the CPU (CUDA graphs are for CUDA)");
    else if (!attn_step_replayable(m->att))
        snprintf(g->graph_note, sizeof g->graph_note,
                 "attention '%s' does not step the same way at every position", m->cfg.attention);
    else
        g->graph_note[0] = '\0';
}

int tf_gen_set_graph(tf_gen *g, bool on) {
    if (!g) return ab_fail(AB_EINVAL, "tf_gen_set_graph: NULL generator");
    drop_graph(g);
    g->graph_on = on;
    g->graph_records = g->graph_launches = 0;
    if (on) graph_check(g);
    else snprintf(g->graph_note, sizeof g->graph_note, "not asked for");
    return 0;
}

const char *tf_gen_graph_note(const tf_gen *g, long long *records, long long *launches) {
    if (records) *records = g ? g->graph_records : 0;
    if (launches) *launches = g ? g->graph_launches : 0;
    return !g ? "no generator" : g->graph_note[0] ? g->graph_note : NULL;
}

/* The layers and head of a step, recorded once and launched (the caller embedded the
 * position); recorded again when the model ran another forward since (it may have moved
 * the attention's workspace). A recording that fails leaves the states' counts as they were, gives the
 * recorded step up (the note says why) and runs the step as usual. */
static int graph_body(tf_gen *g) {
    tf_model *m = g->m;
    const int L = m->cfg.layers;
    int rc;
    if (g->graph && g->graph_forwards != m->forwards) drop_graph(g); /* a forward since: record again */
    if (!g->graph) {
        if ((rc = ab_cuda_graph_begin())) return rc;
        const int rb = tf_step_body(m, g->B, g->seed, g->runs, NULL);
        char why[256];
        snprintf(why, sizeof why, "%s", rb ? ab_error() : "");
        const int re = ab_cuda_graph_end(&g->graph);
        if (!rb && re) snprintf(why, sizeof why, "%s", ab_error());
        for (int l = 0; l < L; l++) /* the recording ran nothing */
            if ((rc = attn_state_set_len(g->states[l], g->t))) return rc;
        if (rb || re) {
            drop_graph(g);
            g->graph_on = false;
            snprintf(g->graph_note, sizeof g->graph_note, "recording the step failed: %s", why);
            ab_clear_error();
            return tf_step_body(m, g->B, g->seed, g->runs, NULL);
        }
        g->graph_records++;
        g->graph_forwards = m->forwards;
    }
    if ((rc = tf_step_body(m, g->B, g->seed, g->runs, g->graph))) return rc;
    g->graph_launches++;
    for (int l = 0; l < L; l++)
        if ((rc = attn_state_set_len(g->states[l], g->t + 1))) return rc;
    return 0;
}

int tf_gen_step(tf_gen *g, const int *tokens, float *logits) {
    if (!g) return ab_fail(AB_EINVAL, "tf_gen_step: NULL generator");
    if (g->t >= g->capacity) return ab_fail(AB_EINVAL, "tf_gen_step: the state is full (capacity %d)", g->capacity);
    if (!tokens && !g->drawn)
        return ab_fail(AB_EINVAL, "tf_gen_step: no tokens given and none drawn from position %d (tf_gen_draw)", g->t - 1);
    int rc = tokens ? tf_check_tokens(g->m, tokens, (size_t)g->B, "generation") : 0;
    if (rc) return rc;
    for (int l = 0; l < g->m->cfg.layers; l++) {
        g->runs[l].mode = MHA_STEP;
        g->runs[l].t = g->t;
    }
    /* the draws are tokens of the vocabulary (tf_gen_draw checked their range) */
    tf_in in = {tokens, NULL, tokens ? NULL : g->next};
    g->drawn = false;
    if (g->graph_on && !tokens && !g->graph_note[0]) {
        const ab_precision p0 = tf_precision_enter(g->m);
        rc = tf_step_input(g->m, g->next, g->B, g->t);
        if (!rc) rc = graph_body(g);
        tf_precision_leave(g->m, p0);
    } else {
        rc = tf_forward_run(g->m, &in, g->B, 1, g->t, NULL, false, g->seed, g->runs);
    }
    if (rc || (rc = copy_last(g->m, g->B, 1, logits))) return rc;
    g->t++;
    return 0;
}

/* The draw spec for the model's head (n set) and the outputs of the last forward's
 * last position (row stride *ld), after the checks common to tf_draw_last and
 * tf_gen_draw (what names the caller). */
static int draw_from_last(const tf_model *m, const draw_spec *d, const char *what, draw_spec *s, const float **last,
                          size_t *ld) {
    if (m->out_B < 1 || m->cfg.input != TF_INPUT_TOKENS)
        return ab_fail(AB_EINVAL, "%s: no forward over tokens to draw from", what);
    const bool mixture = m->cfg.head == TF_HEAD_LOGISTIC_MIXTURE;
    if (d->mixture != mixture)
        return ab_fail(AB_EINVAL, "%s: the draw is for a %s, the model's head is %s", what,
                       d->mixture ? "logistic mixture" : "categorical head", tf_head_name(m->cfg.head));
    *s = *d;
    s->n = mixture ? m->cfg.mixtures : m->classes;
    const size_t K = (size_t)m->classes, N = (size_t)m->out_N;
    *last = m->logits + (N - 1) * K;
    *ld = N * K;
    return 0;
}

int tf_draw_last(tf_model *m, const draw_spec *d, int *out) {
    if (!m || !d || !out) return ab_fail(AB_EINVAL, "tf_draw_last: NULL argument");
    draw_spec s;
    const float *last = NULL;
    size_t ld = 0;
    int rc = draw_from_last(m, d, "tf_draw_last", &s, &last, &ld);
    if (rc) return rc;
    if (ab_dev_host_memory(m->dev)) return ld_draw_rows(m->dev, out, NULL, 0, last, ld, m->out_B, &s);
    /* the values go through the dlogits scratch (B N K floats, unused by a forward),
     * which holds the B ints */
    int *draws = (int *)m->dlogits;
    rc = ld_draw_rows(m->dev, draws, NULL, 0, last, ld, m->out_B, &s);
    return rc ? rc : ab_dev_download(m->dev, out, draws, sizeof(int) * (size_t)m->out_B);
}

int tf_gen_draw(tf_gen *g, const draw_spec *d) {
    if (!g || !d) return ab_fail(AB_EINVAL, "tf_gen_draw: NULL argument");
    tf_model *m = g->m;
    if (g->t < 1 || m->out_B != g->B)
        return ab_fail(AB_EINVAL, "tf_gen_draw: no logits of the generator's to draw from (tf_gen_prefill first)");
    draw_spec s;
    const float *last = NULL;
    size_t ld = 0;
    int rc = draw_from_last(m, d, "tf_gen_draw", &s, &last, &ld);
    if (rc) return rc;
    /* the values feed the next step: they must be tokens */
    const int top = d->mixture ? MIX_VALUES - 1 : m->classes - 1;
    if (top >= m->cfg.vocab)
        return ab_fail(AB_EINVAL, "tf_gen_draw: the drawn values 0..%d are not all tokens (vocab %d)", top,
                       m->cfg.vocab);
    rc = ld_draw_rows(m->dev, g->next, g->table + (g->t - 1), (size_t)g->capacity, last, ld, g->B, &s);
    g->drawn = rc == 0;
    return rc;
}

int tf_gen_draws(const tf_gen *g, int *out) {
    if (!g || !out) return ab_fail(AB_EINVAL, "tf_gen_draws: NULL argument");
    return ab_dev_download(g->m->dev, out, g->table, table_bytes(g));
}
