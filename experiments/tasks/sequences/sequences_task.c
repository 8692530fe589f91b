/* The "sequences" dataset task (sequences_task.h). */
#include "sequences_task.h"

#include "config.h"
#include "error.h"
#include "npy_splits.h"

#include <stdlib.h>
#include <string.h>

enum { ARR_TOKENS = 0, ARR_LENGTHS = 1 };

typedef struct {
    npy_splits s;
    char *path;
    int vocab, L;
    bool vocab_given;
} seq_state;

static int row_len(const seq_state *st, int split, long long index) {
    const ab_array *len = &st->s.arrays[split][ARR_LENGTHS];
    return len->count ? (int)npy_int_at(len, (size_t)index) : st->L;
}

static void seq_fill(const train_task *t, int split, long long index, int *tokens, float *frames, int *targets,
                     float *weights, int *length) {
    (void)frames;
    const seq_state *st = t->priv;
    const ab_array *a = &st->s.arrays[split][ARR_TOKENS];
    const int L = st->L, n = row_len(st, split, index);
    const size_t base = (size_t)index * (size_t)L;
    for (int i = 0; i < L; i++) {
        int x = (int)npy_int_at(a, base + (size_t)i);
        targets[i] = i < n ? x : 0;
        weights[i] = i < n ? 1.0f : 0.0f;
        if (i + 1 < L) tokens[i + 1] = i + 1 < n ? x : 0;
    }
    tokens[0] = st->vocab; /* the start token */
    *length = n;
}

static void seq_prompt(const train_task *t, ab_rng *rng, int *prompt, int *P, int *expected, int *G) {
    const seq_state *st = t->priv;
    int split = t->n_splits - 1;
    long long index = (long long)ab_rng_next_below(rng, (uint32_t)t->split_rows[split]);
    int n = row_len(st, split, index);
    int p = (int)ab_rng_next_below(rng, (uint32_t)n); /* tokens of the row in the prompt */
    const ab_array *a = &st->s.arrays[split][ARR_TOKENS];
    const size_t base = (size_t)index * (size_t)st->L;
    prompt[0] = st->vocab;
    for (int i = 0; i < p; i++) prompt[i + 1] = (int)npy_int_at(a, base + (size_t)i);
    for (int i = p; i < n; i++) expected[i - p] = (int)npy_int_at(a, base + (size_t)i);
    *P = p + 1;
    *G = n - p;
}

static json_t *seq_to_json(const train_task *t) {
    const seq_state *st = t->priv;
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string("sequences"));
    json_object_set_new(o, "path", json_string(st->path));
    json_object_set_new(o, "vocab", json_integer(st->vocab));
    json_object_set_new(o, "splits", npy_splits_names_json(&st->s));
    json_object_set_new(o, "rows", npy_splits_rows_json(&st->s));
    return o;
}

static void seq_destroy(train_task *t) {
    if (!t) return;
    seq_state *st = t->priv;
    if (st) {
        npy_splits_free(&st->s);
        free(st->path);
    }
    free(st);
    free(t);
}

static const char *const seq_keys[] = {"name", "path", "vocab", "splits", "rows", NULL};

/* Checks every split's arrays: tokens (rows, L) integers in [0, vocab) (or >= 0 when
 * the vocabulary is inferred), lengths in [1, L]. */
static int check_data(seq_state *st, const char *dir) {
    st->L = 0;
    long long maxtok = -1;
    for (int i = 0; i < st->s.n; i++) {
        const ab_array *a = &st->s.arrays[i][ARR_TOKENS], *len = &st->s.arrays[i][ARR_LENGTHS];
        if (a->dtype == AB_F32 || a->ndim != 2 || a->shape[1] < 1)
            return ab_fail(AB_EINVAL, "%s/%s.npy: expected integer tokens of shape (rows, L), got %s with %d dimensions",
                           dir, st->s.names[i], ab_dtype_name(a->dtype), a->ndim);
        if (st->L && a->shape[1] != st->L)
            return ab_fail(AB_EINVAL, "%s/%s.npy: rows of %lld tokens, but %s.npy has rows of %d", dir, st->s.names[i],
                           (long long)a->shape[1], st->s.names[0], st->L);
        if (a->shape[1] > (1 << 24))
            return ab_fail(AB_EINVAL, "%s/%s.npy: rows of %lld tokens are longer than 2^24", dir, st->s.names[i],
                           (long long)a->shape[1]);
        st->L = (int)a->shape[1];
        for (size_t j = 0; j < a->count; j++) {
            long long x = npy_int_at(a, j);
            if (x < 0 || (st->vocab_given && x >= st->vocab) || x >= (1 << 30))
                return ab_fail(AB_EINVAL, "%s/%s.npy: token %lld at row %zu, position %zu is outside [0, %s)", dir,
                               st->s.names[i], x, j / (size_t)st->L, j % (size_t)st->L,
                               st->vocab_given ? "vocab" : "2^30");
            if (x > maxtok) maxtok = x;
        }
        if (len->count) {
            if (len->dtype == AB_F32 || len->ndim != 1)
                return ab_fail(AB_EINVAL, "%s/%s.lengths.npy: expected integer lengths of shape (rows)", dir,
                               st->s.names[i]);
            for (size_t j = 0; j < len->count; j++) {
                long long n = npy_int_at(len, j);
                if (n < 1 || n > st->L)
                    return ab_fail(AB_EINVAL, "%s/%s.lengths.npy: length %lld of row %zu is outside [1, %d]", dir,
                                   st->s.names[i], n, j, st->L);
            }
        }
    }
    if (!st->vocab_given) st->vocab = (int)maxtok + 1;
    return 0;
}

static int seq_create(const json_t *obj, train_task **out) {
    int rc = ab_config_only_keys(obj, "task", seq_keys);
    if (rc) return rc;
    const char *path;
    long long vocab;
    if ((rc = ab_config_str(obj, "task", "path", true, NULL, &path))) return rc;
    if ((rc = ab_config_int(obj, "task", "vocab", false, 0, 0, 1 << 30, &vocab))) return rc;
    train_task *t = calloc(1, sizeof *t);
    seq_state *st = calloc(1, sizeof *st);
    if (!t || !st || !(st->path = strdup(path))) {
        free(t);
        free(st);
        return ab_fail(AB_ENOMEM, "out of memory for the sequences task");
    }
    t->priv = st;
    t->destroy = seq_destroy;
    st->vocab = (int)vocab;
    st->vocab_given = vocab > 0;
    static const char *const suffixes[] = {"", "lengths"};
    static const bool required[] = {true, false};
    if ((rc = npy_splits_load(path, json_object_get(obj, "splits"), suffixes, required, 2, "task", &st->s)) ||
        (rc = check_data(st, path)) || (rc = npy_splits_check_rows(&st->s, json_object_get(obj, "rows"), "task"))) {
        seq_destroy(t);
        return rc;
    }
    t->name = "sequences";
    t->input = TASK_INPUT_TOKENS;
    t->vocab = st->vocab + 1;
    t->seq_len = st->L;
    t->causal = true;
    t->head = "categorical";
    t->classes = st->vocab;
    t->samplable = true; /* start token st->vocab = classes */
    t->n_metrics = 2;
    t->metrics[0] = (task_metric){"accuracy", TASK_METRIC_ACCURACY, NULL, NULL, false};
    t->metrics[1] = (task_metric){"bits_per_token", TASK_METRIC_BITS, NULL, NULL, false};
    npy_splits_to_task(&st->s, t);
    t->fill = seq_fill;
    t->max_prompt = st->L;
    t->max_gen = st->L;
    t->prompt = seq_prompt;
    t->to_json = seq_to_json;
    *out = t;
    return 0;
}

const task_kind sequences_task_kind = {
    "sequences",
    "autoregressive modelling of token rows from .npy files with splits (SPLIT.npy: rows x L tokens)",
    seq_keys,
    seq_create,
};
