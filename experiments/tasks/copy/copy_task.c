/* The sequence-copy task (copy_task.h). */
#include "copy_task.h"

#include "config.h"
#include "error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Largest max_symbols accepted: rows of 2X positions must fit an int GEMM easily. */
#define COPY_MAX_X 1048576

int copy_draw(const copy_options *o, ab_rng *rng, int *d) {
    int X = o->max_symbols;
    int L = o->min_symbols + (int)ab_rng_next_below(rng, (uint32_t)(X - o->min_symbols + 1));
    for (int i = 0; i < L; i++) d[i] = COPY_FIRST_SYMBOL + (int)ab_rng_next_below(rng, (uint32_t)o->symbols);
    d[L] = COPY_SEP;
    for (int i = 0; i < L; i++) d[L + 1 + i] = d[i];
    if (o->noise > 0)
        for (int i = 0; i < L; i++)
            if (ab_rng_next_uniform(rng) < o->noise)
                d[L + 1 + i] = COPY_FIRST_SYMBOL + (int)ab_rng_next_below(rng, (uint32_t)o->symbols);
    for (int i = 2 * L + 1; i < 2 * X + 1; i++) d[i] = COPY_PAD;
    return L;
}

double copy_loss_floor(double noise, int symbols) {
    if (noise <= 0) return 0;
    double other = noise / symbols, q = 1 - noise + other;
    return -(q * log(q) + (symbols - 1) * other * log(other));
}

typedef struct {
    copy_options o;
    int *d; /* one data row, 2X + 1 (scratch of row() and prompt(): one caller at a time) */
} copy_state;

static void copy_row(const train_task *t, ab_rng *rng, int *tokens, float *frames, int *targets, float *weights,
                     int *length) {
    (void)frames;
    copy_state *s = t->priv;
    int N = t->seq_len;
    int L = copy_draw(&s->o, rng, s->d);
    for (int i = 0; i < N; i++) {
        tokens[i] = i < 2 * L ? s->d[i] : COPY_PAD;
        targets[i] = s->d[i + 1];
        weights[i] = (i >= L && i <= 2 * L - 1) ? 1.0f : 0.0f;
    }
    *length = 2 * L;
}

static void copy_prompt(const train_task *t, ab_rng *rng, int *prompt, int *P, int *expected, int *G) {
    copy_state *s = t->priv;
    int L = copy_draw(&s->o, rng, s->d);
    memcpy(prompt, s->d, sizeof(int) * (size_t)(L + 1));
    memcpy(expected, s->d, sizeof(int) * (size_t)L);
    *P = L + 1;
    *G = L;
}

static json_t *copy_to_json(const train_task *t) {
    const copy_state *s = t->priv;
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string("copy"));
    json_object_set_new(o, "max_symbols", json_integer(s->o.max_symbols));
    json_object_set_new(o, "symbols", json_integer(s->o.symbols));
    json_object_set_new(o, "min_symbols", json_integer(s->o.min_symbols));
    if (s->o.noise > 0) json_object_set_new(o, "noise", json_real(s->o.noise));
    return o;
}

static void copy_destroy(train_task *t) {
    if (!t) return;
    copy_state *s = t->priv;
    if (s) free(s->d);
    free(s);
    free(t);
}

static const char *const copy_keys[] = {"name", "max_symbols", "symbols", "min_symbols", "noise", NULL};

static int copy_create(const json_t *obj, train_task **out) {
    int rc = ab_config_only_keys(obj, "task", copy_keys);
    if (rc) return rc;
    long long x, s, mn;
    double noise;
    if ((rc = ab_config_int(obj, "task", "max_symbols", false, 128, 1, COPY_MAX_X, &x))) return rc;
    if ((rc = ab_config_int(obj, "task", "symbols", false, 10, 1, 1 << 20, &s))) return rc;
    if ((rc = ab_config_int(obj, "task", "min_symbols", false, 1, 1, COPY_MAX_X, &mn))) return rc;
    if ((rc = ab_config_num(obj, "task", "noise", false, 0, 0, 1, &noise))) return rc;
    if (mn > x)
        return ab_fail(AB_EINVAL, "config: 'task.min_symbols' = %lld is larger than 'task.max_symbols' = %lld", mn, x);
    train_task *t = calloc(1, sizeof *t);
    copy_state *st = calloc(1, sizeof *st);
    int *d = st ? malloc(sizeof(int) * (size_t)(2 * x + 1)) : NULL;
    if (!t || !st || !d) {
        free(t);
        free(st);
        free(d);
        return ab_fail(AB_ENOMEM, "out of memory for the copy task");
    }
    st->o = (copy_options){(int)x, (int)s, (int)mn, noise};
    st->d = d;
    t->name = "copy";
    t->input = TASK_INPUT_TOKENS;
    t->vocab = (int)s + COPY_FIRST_SYMBOL;
    t->seq_len = (int)(2 * x);
    t->causal = true;
    t->head = "categorical";
    t->classes = t->vocab;
    t->n_metrics = 1;
    t->metrics[0] = (task_metric){"accuracy", TASK_METRIC_ACCURACY, NULL, NULL, false};
    t->max_prompt = (int)x + 1;
    t->max_gen = (int)x;
    t->priv = st;
    t->row = copy_row;
    t->prompt = copy_prompt;
    t->to_json = copy_to_json;
    t->destroy = copy_destroy;
    *out = t;
    return 0;
}

const task_kind copy_task_kind = {
    "copy",
    "sequence copy (Figure 2): up to max_symbols random symbols, a separator, the copy (optionally noisy); "
    "loss on the copy",
    copy_keys,
    copy_create,
};
