/* The task registry and the row, batch, epoch and metric plumbing shared by every
 * task (task.h). */
#include "task.h"

#include "ctc.h"
#include "error.h"
#include "memory.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The installed list (task_kinds_install; the CLI's is experiments/cli/task_list.c). */
static const task_kind *const *KINDS;
static int N_KINDS;

void task_kinds_install(const task_kind *const *kinds, int n) {
    KINDS = kinds;
    N_KINDS = kinds ? n : 0;
}

const task_kind *task_kind_at(int i) { return i >= 0 && i < N_KINDS ? KINDS[i] : NULL; }

const task_kind *task_kind_find(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < N_KINDS; i++)
        if (strcmp(KINDS[i]->name, name) == 0) return KINDS[i];
    return NULL;
}

const char *task_kind_names(void) {
    static char buf[256];
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_KINDS && n < sizeof buf; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", i ? ", " : "", KINDS[i]->name);
    if (N_KINDS == 0) snprintf(buf, sizeof buf, "none installed");
    return buf;
}

int task_create(const json_t *obj, train_task **out) {
    *out = NULL;
    if (!json_is_object(obj)) return ab_fail(AB_EINVAL, "config: 'task' must be an object with a \"name\"");
    json_t *name = json_object_get(obj, "name");
    if (!json_is_string(name))
        return ab_fail(AB_EINVAL, "config: 'task.name' must be a string (one of: %s)", task_kind_names());
    const task_kind *k = task_kind_find(json_string_value(name));
    if (!k)
        return ab_fail(AB_EINVAL, "config: 'task.name' = '%s' is not a task (one of: %s)", json_string_value(name),
                       task_kind_names());
    return k->create(obj, out);
}

void task_destroy(train_task *t) {
    if (t && t->destroy) t->destroy(t);
}

bool task_is_dataset(const train_task *t) { return t->n_splits > 0 && t->fill != NULL; }

int task_split_find(const train_task *t, const char *name) {
    for (int i = 0; name && i < t->n_splits; i++)
        if (strcmp(t->split_names[i], name) == 0) return i;
    return -1;
}

void task_split_names(const train_task *t, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < t->n_splits && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", t->split_names[i]);
}

static uint64_t seed_of(uint64_t run_seed, uint64_t stream, uint64_t index) {
    uint32_t w[4];
    ab_philox4x32(run_seed, stream, index, w);
    return (uint64_t)w[0] | (uint64_t)w[1] << 32;
}

ab_rng task_row_rng(uint64_t run_seed, uint64_t stream, uint64_t index, uint64_t row) {
    return ab_rng_make(seed_of(run_seed, stream, index), row);
}

/* uniform{0..n-1} for n up to 2^63 from the cursor: ab_rng_next_below for n < 2^32,
 * else rejection over 64-bit words (two 32-bit draws). */
static uint64_t below64(ab_rng *r, uint64_t n) {
    if (n <= UINT32_MAX) return ab_rng_next_below(r, (uint32_t)n);
    uint64_t lim = UINT64_MAX - UINT64_MAX % n, x;
    do {
        x = (uint64_t)ab_rng_next_below(r, UINT32_MAX) << 32;
        x |= ab_rng_next_below(r, UINT32_MAX);
    } while (x >= lim);
    return x % n;
}

void task_epoch_order(uint64_t run_seed, uint64_t epoch, long long n, long long *order) {
    for (long long i = 0; i < n; i++) order[i] = i;
    ab_rng rng = ab_rng_make(seed_of(run_seed, TASK_STREAM_EPOCH, epoch), 0);
    for (long long i = n - 1; i > 0; i--) {
        long long j = (long long)below64(&rng, (uint64_t)i + 1);
        long long x = order[i];
        order[i] = order[j];
        order[j] = x;
    }
}

int task_batch_alloc(const train_task *t, int B, task_batch *b) {
    memset(b, 0, sizeof *b);
    if (B < 1) return ab_fail(AB_EINVAL, "batch %d must be >= 1", B);
    const bool frames = t->input == TASK_INPUT_FRAMES;
    const size_t F = frames ? (size_t)t->features : 0, S = t->max_labels > 0 ? (size_t)t->max_labels : 0;
    size_t n = (size_t)B * (size_t)t->seq_len, bytes, fbytes, lbytes;
    /* tokens (token input), targets, weights: n each (4 bytes); frames: n F floats;
     * lengths: B; label sequences: B S labels, B counts and N + S + 1 ints of work */
    const size_t lints = S ? (size_t)B * (S + 1) + (size_t)t->seq_len + S + 1 : 0;
    if (ab_mul_size(n, (frames ? 2 : 3) * sizeof(int), &bytes) || ab_mul_size(n, F * sizeof(float), &fbytes) ||
        (S && (S > SIZE_MAX / 4 / (size_t)B || ab_mul_size(lints, sizeof(int), &lbytes))) ||
        bytes > SIZE_MAX - fbytes - sizeof(int) * (size_t)B - (S ? lbytes : 0))
        return ab_fail(AB_EINVAL, "batch %d x length %d is too large", B, t->seq_len);
    bytes += fbytes + sizeof(int) * (size_t)B + (S ? lbytes : 0);
    char *p = ab_calloc(bytes);
    if (!p) return ab_fail(AB_ENOMEM, "out of memory for a batch of %d rows", B);
    b->B = B;
    b->N = t->seq_len;
    b->F = (int)F;
    b->rows = B;
    char *q = p;
    if (frames) {
        b->frames = (float *)q;
        q += fbytes;
    } else {
        b->tokens = (int *)q;
        q += sizeof(int) * n;
    }
    b->targets = (int *)q;
    q += sizeof(int) * n;
    b->weights = (float *)q;
    q += sizeof(float) * n;
    b->lengths = (int *)q;
    q += sizeof(int) * (size_t)B;
    if (S) {
        b->S = (int)S;
        b->labels = (int *)q;
        b->label_counts = b->labels + (size_t)B * S;
        b->work = b->label_counts + B;
    }
    return 0;
}

void task_batch_free(task_batch *b) {
    if (!b) return;
    /* one block, starting at the first of frames / tokens */
    ab_free(b->frames ? (void *)b->frames : (void *)b->tokens);
    memset(b, 0, sizeof *b);
}

void task_batch_fill(const train_task *t, uint64_t run_seed, uint64_t stream, uint64_t index, task_batch *b) {
    b->N = t->seq_len;
    size_t N = (size_t)b->N, F = (size_t)b->F;
    for (int r = 0; r < b->B; r++) {
        ab_rng rng = task_row_rng(run_seed, stream, index, (uint64_t)r);
        t->row(t, &rng, b->tokens ? b->tokens + r * N : NULL, b->frames ? b->frames + r * N * F : NULL,
               b->targets + r * N, b->weights + r * N, &b->lengths[r]);
    }
    b->rows = b->B;
}

/* pad_to_longest: rows 0..rows-1, filled at stride N, packed at stride M < N (row r
 * moves down from r N to r M: in place, in increasing r). */
static void pack_rows(task_batch *b, int M) {
    const size_t N = (size_t)b->N, F = (size_t)b->F, m = (size_t)M;
    for (int r = 1; r < b->rows; r++) {
        if (b->frames) memmove(b->frames + r * m * F, b->frames + r * N * F, sizeof(float) * m * F);
        if (b->tokens) memmove(b->tokens + r * m, b->tokens + r * N, sizeof(int) * m);
        memmove(b->targets + r * m, b->targets + r * N, sizeof(int) * m);
        memmove(b->weights + r * m, b->weights + r * N, sizeof(float) * m);
    }
    b->N = M;
}

void task_batch_fill_rows(const train_task *t, int split, const long long *indices, int rows, task_batch *b) {
    b->N = t->seq_len;
    size_t N = (size_t)b->N, F = (size_t)b->F;
    int longest = 1;
    for (int r = 0; r < rows; r++) {
        t->fill(t, split, indices[r], b->tokens ? b->tokens + r * N : NULL, b->frames ? b->frames + r * N * F : NULL,
                b->targets + r * N, b->weights + r * N, &b->lengths[r]);
        if (b->labels) t->fill_labels(t, split, indices[r], b->labels + (size_t)r * b->S, &b->label_counts[r]);
        if (b->lengths[r] > longest) longest = b->lengths[r];
    }
    b->rows = rows;
    if (t->pad_to_longest && longest < b->N) pack_rows(b, longest);
}

int task_outputs(const train_task *t) {
    if (t->head && strcmp(t->head, "ctc") == 0) return t->classes + 1;
    if (t->head && strcmp(t->head, "logistic_mixture") == 0) return 3 * t->mixtures;
    return t->classes;
}

bool task_metric_maximised(const task_metric *m) {
    switch (m->kind) {
    case TASK_METRIC_ACCURACY: return true;
    case TASK_METRIC_BITS:
    case TASK_METRIC_PER: return false;
    case TASK_METRIC_CUSTOM: return m->maximise;
    }
    return false;
}

bool task_metrics_need_logits(const train_task *t) {
    for (int i = 0; i < t->n_metrics; i++)
        if (t->metrics[i].kind == TASK_METRIC_CUSTOM || t->metrics[i].kind == TASK_METRIC_PER) return true;
    return false;
}

/* PER: the best path of each row over its frames against its labels, summed. */
static void add_per(const train_task *t, const task_batch *b, const float *logits, double *sums) {
    const int K = task_outputs(t);
    for (int r = 0; r < b->rows; r++) {
        const int L = b->label_counts[r];
        sums[0] += ctc_best_path_errors(logits + (size_t)r * b->N * K, b->lengths[r], K, b->labels + (size_t)r * b->S,
                                        L, b->work);
        sums[1] += L;
    }
}

void task_metrics_add(const train_task *t, const task_batch *b, const task_loss_stats *st, const float *logits,
                      double sums[][TASK_METRIC_SUMS]) {
    for (int i = 0; i < t->n_metrics; i++) {
        const task_metric *m = &t->metrics[i];
        switch (m->kind) {
        case TASK_METRIC_ACCURACY:
            sums[i][0] += (double)st->correct;
            sums[i][1] += (double)st->counted;
            break;
        case TASK_METRIC_BITS:
            sums[i][0] += st->loss * st->weight_sum;
            sums[i][1] += st->weight_sum;
            break;
        case TASK_METRIC_CUSTOM: m->add(t, b, logits, sums[i]); break;
        case TASK_METRIC_PER: add_per(t, b, logits, sums[i]); break;
        }
    }
}

void task_metrics_values(const train_task *t, double sums[][TASK_METRIC_SUMS], double *values) {
    for (int i = 0; i < t->n_metrics; i++) {
        const task_metric *m = &t->metrics[i];
        switch (m->kind) {
        case TASK_METRIC_ACCURACY: values[i] = sums[i][1] > 0 ? sums[i][0] / sums[i][1] : NAN; break;
        case TASK_METRIC_BITS: values[i] = sums[i][1] > 0 ? sums[i][0] / sums[i][1] / log(2.0) : NAN; break;
        case TASK_METRIC_CUSTOM: values[i] = m->value(t, sums[i]); break;
        case TASK_METRIC_PER: values[i] = sums[i][1] > 0 ? sums[i][0] / sums[i][1] : NAN; break;
        }
    }
}

void task_batch_view(const task_batch *b, int r0, int rows, task_batch *v) {
    *v = *b;
    const size_t at = (size_t)r0 * (size_t)b->N;
    v->B = v->rows = rows;
    if (b->tokens) v->tokens = b->tokens + at;
    if (b->frames) v->frames = b->frames + at * (size_t)b->F;
    if (b->targets) v->targets = b->targets + at;
    if (b->weights) v->weights = b->weights + at;
    if (b->lengths) v->lengths = b->lengths + r0;
    if (b->labels) v->labels = b->labels + (size_t)r0 * (size_t)b->S;
    if (b->label_counts) v->label_counts = b->label_counts + r0;
}
