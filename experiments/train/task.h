/* Training tasks: what `attnbench train` and `attnbench generate` need to know about
 * a task (the copy task now; MNIST, CIFAR-10 and speech later).
 *
 * A task is a vocabulary, a fixed number of model positions N per row, and a row
 * generator that is a pure function of an RNG cursor (harness/rng.h). The driver
 * derives the cursor of row r of batch `index` in stream `stream` of a run with seed S
 * as
 *
 *     cursor = ab_rng_make(seed_of(S, stream, index), r)
 *     seed_of(S, stream, index) = words 0, 1 of ab_philox4x32(S, stream, index)
 *
 * with the streams below: training batch `index` = the step number (1, 2, ...), the
 * evaluation set = batches 0 .. eval_batches-1 of TASK_STREAM_EVAL (the same rows at
 * every evaluation), generation prompt k = row 0 of batch k of TASK_STREAM_GEN. So a
 * run's data needs no loader state: a resumed run draws exactly the batches it would
 * have drawn.
 *
 * Rows: tokens (N) in [0, vocab), next-token targets (N), loss weights (N; 0 where a
 * position is not scored, e.g. padding or the prompt), and the number of valid
 * positions (the rest is padding, masked out of the attention).
 *
 * Generation (optional, for `attnbench generate`): a prompt of P tokens and the G
 * tokens a perfect model continues it with; the driver decodes G tokens greedily and
 * scores them against the expected ones. */
#ifndef AB_TRAIN_TASK_H
#define AB_TRAIN_TASK_H

#include "rng.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define TASK_STREAM_DATA 0x4441544100000000ULL /* "DATA" << 32: training batches, index = step */
#define TASK_STREAM_EVAL 0x4556414C00000000ULL /* "EVAL" << 32: the fixed evaluation set */
#define TASK_STREAM_GEN 0x47454E5200000000ULL  /* "GENR" << 32: generation prompts */

typedef struct train_task train_task;

struct train_task {
    const char *name;   /* the config's task.name */
    int vocab;          /* tokens in [0, vocab) */
    int seq_len;        /* N: model positions of every row */
    bool causal;        /* the model is autoregressive */
    int max_prompt;     /* generation: longest prompt (0: the task does not generate) */
    int max_gen;        /* generation: most tokens to generate after a prompt */
    void *priv;

    /* One row from the cursor (a pure function of it): tokens, targets, weights (N
     * each) and *length valid positions in [1, N]. */
    void (*row)(const train_task *t, ab_rng *rng, int *tokens, int *targets, float *weights, int *length);
    /* A generation prompt from the cursor: prompt (P tokens, P <= max_prompt) and the
     * expected continuation (G tokens, G <= max_gen, P + G - 1 <= N). */
    void (*prompt)(const train_task *t, ab_rng *rng, int *prompt, int *P, int *expected, int *G);
    /* The task's options with every default filled in (new reference), for results,
     * checkpoints and config comparison on resume. Includes "name". */
    json_t *(*to_json)(const train_task *t);
    void (*destroy)(train_task *t);
};

typedef struct {
    const char *name;
    const char *summary;
    /* Every key its config object accepts, "name" included (NULL-terminated): also
     * what `train --set task.KEY=VALUE` may set when the config file leaves it out. */
    const char *const *keys;
    /* Creates the task from its config object (at config key "task"); unknown keys,
     * wrong types and out-of-range values are AB_EINVAL naming "task.KEY". */
    int (*create)(const json_t *obj, train_task **out);
} task_kind;

/* The registered kinds ("copy"), by name; NULL if unknown. */
const task_kind *task_kind_find(const char *name);
/* Names of every kind, comma-separated (for messages). */
const char *task_kind_names(void);
/* Creates the task named by obj's "name" key. */
int task_create(const json_t *obj, train_task **out);
void task_destroy(train_task *t);

/* The cursor of row r of batch `index` of `stream` (formula above). */
ab_rng task_row_rng(uint64_t run_seed, uint64_t stream, uint64_t index, uint64_t row);

/* A batch of B rows (B * N tokens, targets, weights; B lengths). */
typedef struct {
    int B, N;
    int *tokens, *targets, *lengths;
    float *weights;
} task_batch;

/* Allocates a batch of B rows of the task's N (tracked allocator; one block). */
int task_batch_alloc(const train_task *t, int B, task_batch *b);
void task_batch_free(task_batch *b);
/* Fills rows 0..B-1 of batch `index` of `stream`. */
void task_batch_fill(const train_task *t, uint64_t run_seed, uint64_t stream, uint64_t index, task_batch *b);

#endif
