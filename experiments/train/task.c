/* The task registry and the row/batch plumbing shared by every task (task.h). */
#include "task.h"

#include "copy_task.h"
#include "error.h"
#include "memory.h"

#include <string.h>

static const task_kind *const KINDS[] = {&copy_task_kind};
#define N_KINDS (sizeof KINDS / sizeof *KINDS)

const task_kind *task_kind_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < N_KINDS; i++)
        if (strcmp(KINDS[i]->name, name) == 0) return KINDS[i];
    return NULL;
}

const char *task_kind_names(void) { return "copy"; }

int task_create(const json_t *obj, train_task **out) {
    *out = NULL;
    if (!json_is_object(obj)) return ab_fail(AB_EINVAL, "config: 'task' must be an object with a \"name\"");
    json_t *name = json_object_get(obj, "name");
    if (!json_is_string(name)) return ab_fail(AB_EINVAL, "config: 'task.name' must be a string (one of: %s)", task_kind_names());
    const task_kind *k = task_kind_find(json_string_value(name));
    if (!k)
        return ab_fail(AB_EINVAL, "config: 'task.name' = '%s' is not a task (one of: %s)", json_string_value(name),
                       task_kind_names());
    return k->create(obj, out);
}

void task_destroy(train_task *t) {
    if (t && t->destroy) t->destroy(t);
}

ab_rng task_row_rng(uint64_t run_seed, uint64_t stream, uint64_t index, uint64_t row) {
    uint32_t w[4];
    ab_philox4x32(run_seed, stream, index, w);
    return ab_rng_make((uint64_t)w[0] | (uint64_t)w[1] << 32, row);
}

int task_batch_alloc(const train_task *t, int B, task_batch *b) {
    memset(b, 0, sizeof *b);
    if (B < 1) return ab_fail(AB_EINVAL, "batch %d must be >= 1", B);
    size_t n = (size_t)B * (size_t)t->seq_len, bytes;
    /* tokens, targets, weights: n each (4 bytes); lengths: B */
    if (ab_mul_size(n, 3 * sizeof(int), &bytes) || bytes > SIZE_MAX - sizeof(int) * (size_t)B)
        return ab_fail(AB_EINVAL, "batch %d x length %d is too large", B, t->seq_len);
    bytes += sizeof(int) * (size_t)B;
    char *p = ab_calloc(bytes);
    if (!p) return ab_fail(AB_ENOMEM, "out of memory for a batch of %d rows", B);
    b->B = B;
    b->N = t->seq_len;
    b->tokens = (int *)p;
    b->targets = b->tokens + n;
    b->weights = (float *)(b->targets + n);
    b->lengths = (int *)(b->weights + n);
    return 0;
}

void task_batch_free(task_batch *b) {
    if (b && b->tokens) ab_free(b->tokens);
    if (b) memset(b, 0, sizeof *b);
}

void task_batch_fill(const train_task *t, uint64_t run_seed, uint64_t stream, uint64_t index, task_batch *b) {
    size_t N = (size_t)b->N;
    for (int r = 0; r < b->B; r++) {
        ab_rng rng = task_row_rng(run_seed, stream, index, (uint64_t)r);
        t->row(t, &rng, b->tokens + r * N, b->targets + r * N, b->weights + r * N, &b->lengths[r]);
    }
}
