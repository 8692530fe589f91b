/* The multi-query associative recall task (recall_task.h). */
#include "recall_task.h"

#include "config.h"
#include "error.h"

#include <stdlib.h>
#include <string.h>

/* Longest row and largest vocabularies accepted (rows of N positions in an int GEMM). */
#define RECALL_MAX_N 1048576
#define RECALL_MAX_VOCAB (1 << 20)

/* The first m of a uniformly shuffled 0 .. n-1 into a[0 .. m-1] (partial Fisher-Yates
 * over a[0 .. n-1]: draw i swaps a[i] with a[i + below(n - i)]). */
static void shuffle_prefix(ab_rng *rng, int *a, int n, int m) {
    for (int i = 0; i < n; i++) a[i] = i;
    for (int i = 0; i < m; i++) {
        int j = i + (int)ab_rng_next_below(rng, (uint32_t)(n - i));
        int t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

static int cmp_int(const void *x, const void *y) {
    int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

size_t recall_scratch_ints(const recall_options *o) {
    size_t n = (size_t)o->keys, r = (size_t)(o->length - 2 * o->pairs - o->queries);
    if (r > n) n = r;
    if ((size_t)o->pairs > n) n = (size_t)o->pairs;
    return n + 2 * (size_t)o->pairs; /* the shuffle's array, the keys and values drawn */
}

void recall_draw(const recall_options *o, ab_rng *rng, int *tokens, int *query_at, int *scratch) {
    const int N = o->length, P = o->pairs, Q = o->queries, K = o->keys;
    int *key = scratch, *val = scratch + P, *a = scratch + 2 * P;
    shuffle_prefix(rng, a, K, P);
    for (int i = 0; i < P; i++) key[i] = RECALL_FIRST_KEY + a[i];
    for (int i = 0; i < P; i++) val[i] = RECALL_FIRST_KEY + K + (int)ab_rng_next_below(rng, (uint32_t)o->values);
    for (int i = 0; i < P; i++) {
        tokens[2 * i] = key[i];
        tokens[2 * i + 1] = val[i];
    }
    for (int i = 2 * P; i < N; i++) tokens[i] = RECALL_FILL;
    /* the pairs to query, in slot order: a[0 .. Q-1] kept in query_at meanwhile */
    shuffle_prefix(rng, a, P, Q);
    memcpy(query_at, a, sizeof(int) * (size_t)Q);
    const int R = N - 2 * P;
    shuffle_prefix(rng, a, R - Q, Q);
    qsort(a, (size_t)Q, sizeof(int), cmp_int);
    for (int j = 0; j < Q; j++) {
        const int pair = query_at[j], at = 2 * P + a[j] + j;
        tokens[at] = key[pair];
        tokens[at + 1] = val[pair];
        query_at[j] = at;
    }
}

typedef struct {
    recall_options o;
    int *scratch, *query_at;
} recall_state;

static void recall_row(const train_task *t, ab_rng *rng, int *tokens, float *frames, int *targets, float *weights,
                       int *length) {
    (void)frames;
    recall_state *s = t->priv;
    const int N = t->seq_len;
    recall_draw(&s->o, rng, tokens, s->query_at, s->scratch);
    for (int i = 0; i < N; i++) {
        targets[i] = i + 1 < N ? tokens[i + 1] : RECALL_FILL;
        weights[i] = 0.0f;
    }
    for (int j = 0; j < s->o.queries; j++) weights[s->query_at[j]] = 1.0f;
    *length = N;
}

static json_t *recall_to_json(const train_task *t) {
    const recall_state *s = t->priv;
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string("recall"));
    json_object_set_new(o, "length", json_integer(s->o.length));
    json_object_set_new(o, "pairs", json_integer(s->o.pairs));
    json_object_set_new(o, "queries", json_integer(s->o.queries));
    json_object_set_new(o, "keys", json_integer(s->o.keys));
    json_object_set_new(o, "values", json_integer(s->o.values));
    return o;
}

static void recall_destroy(train_task *t) {
    if (!t) return;
    recall_state *s = t->priv;
    if (s) {
        free(s->scratch);
        free(s->query_at);
    }
    free(s);
    free(t);
}

static const char *const recall_keys[] = {"name", "length", "pairs", "queries", "keys", "values", NULL};

static int recall_options_read(const json_t *obj, recall_options *o) {
    long long n, p, q, k, v;
    int rc;
    if ((rc = ab_config_int(obj, "task", "length", false, 64, 4, RECALL_MAX_N, &n)) ||
        (rc = ab_config_int(obj, "task", "pairs", false, 8, 1, RECALL_MAX_N / 4, &p)) ||
        (rc = ab_config_int(obj, "task", "queries", false, p, 1, RECALL_MAX_N / 4, &q)) ||
        (rc = ab_config_int(obj, "task", "keys", false, 64, 1, RECALL_MAX_VOCAB, &k)) ||
        (rc = ab_config_int(obj, "task", "values", false, 64, 1, RECALL_MAX_VOCAB, &v)))
        return rc;
    if (q > p) return ab_fail(AB_EINVAL, "config: 'task.queries' = %lld is larger than 'task.pairs' = %lld", q, p);
    if (p > k)
        return ab_fail(AB_EINVAL, "config: 'task.pairs' = %lld needs as many distinct keys, but 'task.keys' = %lld", p,
                       k);
    if (2 * p + 2 * q > n)
        return ab_fail(AB_EINVAL,
                       "config: 'task.length' = %lld is too short for %lld pairs and %lld queries (2 x %lld + 2 x %lld "
                       "positions)",
                       n, p, q, p, q);
    *o = (recall_options){(int)n, (int)p, (int)q, (int)k, (int)v};
    return 0;
}

static int recall_create(const json_t *obj, train_task **out) {
    int rc = ab_config_only_keys(obj, "task", recall_keys);
    recall_options o;
    if (rc || (rc = recall_options_read(obj, &o))) return rc;
    train_task *t = calloc(1, sizeof *t);
    recall_state *st = calloc(1, sizeof *st);
    int *scratch = malloc(sizeof(int) * recall_scratch_ints(&o)), *query_at = malloc(sizeof(int) * (size_t)o.queries);
    if (!t || !st || !scratch || !query_at) {
        free(t);
        free(st);
        free(scratch);
        free(query_at);
        return ab_fail(AB_ENOMEM, "out of memory for the recall task");
    }
    *st = (recall_state){o, scratch, query_at};
    t->name = "recall";
    t->input = TASK_INPUT_TOKENS;
    t->vocab = RECALL_FIRST_KEY + o.keys + o.values;
    t->seq_len = o.length;
    t->causal = true;
    t->head = "categorical";
    t->classes = t->vocab;
    t->n_metrics = 1;
    t->metrics[0] = (task_metric){"accuracy", TASK_METRIC_ACCURACY, NULL, NULL, false};
    t->priv = st;
    t->row = recall_row;
    t->to_json = recall_to_json;
    t->destroy = recall_destroy;
    *out = t;
    return 0;
}

const task_kind recall_task_kind = {
    "recall",
    "multi-query associative recall (MQAR): `pairs` key-value pairs, then `queries` of their keys among "
    "fillers; loss and accuracy on the queried values",
    recall_keys,
    recall_create,
};
