/* Training tasks: what `attnbench train` and `attnbench generate` need to know about
 * a task. A task brings its data, its input, its output head and its metrics; the
 * driver (trainer.h) and the model (models/transformer.h) do the rest, so a new
 * experiment is a task plus its pieces, not a fork of the driver.
 *
 * Input. Tokens (TASK_INPUT_TOKENS: ids in [0, vocab) into an embedding) or float
 * frames (TASK_INPUT_FRAMES: `features` floats per position into a dense projection).
 * Every row has the task's N = seq_len model positions; row b's first lengths[b] are
 * valid, the rest is padding (masked out of the attention, weight 0).
 *
 * Output. A head and its loss, by name ("categorical": a softmax over `classes`
 * with per-position targets and loss weights; tf_head in models/transformer.h lists
 * them) and the
 * number of classes. Targets are per position (N ints, ignored where the weight is 0).
 * The "ctc" head scores a LABEL SEQUENCE per row instead (models/ctc.h): the task
 * declares max_labels (label slots per row, S) and fills each row's labels (S ints,
 * classes in [0, classes), the first `count` of them the sequence) and count with
 * fill_labels; the row's frames are its valid positions (lengths), every row weighs 1,
 * and the per-position targets and weights are not used. Dataset tasks only.
 *
 * Metrics. A list of named values the driver logs in every evaluation record
 * ("eval_NAME"), in the TSV and in the summary ("final_eval_NAME"), and in every
 * training record for the last step's batch ("NAME_last"). Each is computed from
 * per-batch sums that add up over a split (task_metric below): accuracy (weighted
 * positions whose first argmax is the target; with the ctc head: rows whose best path
 * is exactly their labels), bits per scored value (the weighted mean loss in nats /
 * ln 2), the label error rate of a ctc head (PER: the summed edit distances between
 * each row's best path and its labels over the summed label counts, from the logits
 * on the host), or a task's own (from the logits on the host). Accuracy is maximised,
 * bits and PER minimised, a task's own says which (task_metric_maximised): what a
 * plateau schedule watching the metric needs to know.
 *
 * Data, one of two kinds:
 * - A generator (copy): a row is a pure function of an RNG cursor. Row r of batch
 *   `index` of stream `stream` of a run with seed S has the cursor
 *       cursor = ab_rng_make(seed_of(S, stream, index), r)
 *       seed_of(S, stream, index) = words 0, 1 of ab_philox4x32(S, stream, index)
 *   training batch `index` = the step number (1, 2, ...) of TASK_STREAM_DATA; the
 *   evaluation set = batches 0 .. eval_batches-1 of TASK_STREAM_EVAL (the same rows at
 *   every evaluation); generation prompt k = row 0 of batch k of TASK_STREAM_GEN.
 * - A dataset with named splits (e.g. "train", "valid", "test"), each a fixed number of
 *   rows; a row is a pure function of (split, index). Training draws the rows of
 *   the training split ("train") in epochs: epoch e (0, 1, ...) visits them in the
 *   order of a permutation that is a pure function of (seed, e) (task_epoch_order), and
 *   the epochs follow each other as one stream, so step t (1, 2, ...) with batch B
 *   takes stream positions (t-1) B .. t B - 1 (a batch may span two epochs).
 *   Evaluation runs over the rows of a split in order (all, or a prefix), in batches.
 * Either way a run's data needs no loader state: a resumed run draws exactly the
 * batches it would have drawn.
 *
 * Generation (optional, for `attnbench generate`): a prompt of P tokens and the G
 * tokens a perfect model continues it with. */
#ifndef AB_TRAIN_TASK_H
#define AB_TRAIN_TASK_H

#include "rng.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define TASK_STREAM_DATA 0x4441544100000000ULL  /* "DATA" << 32: training batches, index = step */
#define TASK_STREAM_EVAL 0x4556414C00000000ULL  /* "EVAL" << 32: the fixed evaluation set */
#define TASK_STREAM_GEN 0x47454E5200000000ULL   /* "GENR" << 32: generation prompts */
#define TASK_STREAM_EPOCH 0x45504F4300000000ULL /* "EPOC" << 32: dataset epoch orders, index = epoch */
#define TASK_STREAM_SAMPLE 0x534D504C00000000ULL /* "SMPL" << 32: generation draws, index = prompt (N+1) + token */
#define TASK_STREAM_SAMPLE2 0x534D503200000000ULL /* "SMP2" << 32: a second draw at the same index (a mixture's value) */
#define TASK_STREAM_AUGMENT 0x4155474D00000000ULL /* "AUGM" << 32: training-batch augmentation, index = step */

#define TASK_MAX_SPLITS 8
#define TASK_MAX_METRICS 8
#define TASK_METRIC_SUMS 4 /* per-batch sums a metric accumulates over a split */

typedef enum { TASK_INPUT_TOKENS = 0, TASK_INPUT_FRAMES = 1 } task_input;

typedef struct train_task train_task;

/* A batch of up to B rows: `rows` filled (the last evaluation batch of a split may
 * hold fewer). tokens (B N) for token input, frames (B N F) for frame input, targets
 * and weights (B N), lengths (B). A task with label sequences (max_labels S > 0):
 * labels (B S) and label_counts (B), and `work` (N + S + 1 ints) of scratch for the
 * metrics (decoding and edit distances); else the three are NULL and S is 0. */
typedef struct {
    int B, N, F, S, rows; /* N: the batch's positions per row (the task's seq_len, or less: pad_to_longest) */
    int *tokens;
    float *frames;
    int *targets, *lengths;
    float *weights;
    int *labels, *label_counts, *work;
} task_batch;

/* The statistics of a batch's loss the head reports (models/layers.h ce_stats's
 * fields): weighted mean loss, sum of weights, argmax hits among the weighted
 * positions and their number. */
typedef struct {
    double loss, weight_sum;
    long long correct, counted;
} task_loss_stats;

typedef enum {
    TASK_METRIC_ACCURACY = 0, /* sums: correct, counted; value correct / counted */
    TASK_METRIC_BITS = 1,     /* sums: loss * weight_sum, weight_sum; value mean loss / ln 2 */
    TASK_METRIC_CUSTOM = 2,   /* the task's add/value callbacks, from the logits */
    TASK_METRIC_PER = 3       /* the ctc head: sums: the edit distances between each row's best
                                 path (over its lengths[r] frames) and its labels, the label
                                 counts; value errors / labels (NaN without labels) */
} task_metric_kind;

typedef struct {
    const char *name; /* e.g. "accuracy", "bits_per_dim": a JSON key and TSV column suffix */
    task_metric_kind kind;
    /* TASK_METRIC_CUSTOM only: adds one batch to sums[TASK_METRIC_SUMS] (logits
     * (rows, N, outputs) in host memory, task_outputs) and turns the sums into the
     * value; maximise: whether higher values are better. */
    void (*add)(const train_task *t, const task_batch *b, const float *logits, double *sums);
    double (*value)(const train_task *t, const double *sums);
    bool maximise;
} task_metric;

struct train_task {
    const char *name; /* the config's task.name */
    /* input */
    task_input input;
    int vocab;    /* TASK_INPUT_TOKENS: ids in [0, vocab) */
    int features; /* TASK_INPUT_FRAMES: F floats per position */
    int seq_len;  /* N: model positions of every row */
    bool causal;  /* the model is autoregressive */
    /* output */
    const char *head; /* "categorical", "logistic_mixture", "ctc" */
    int classes;      /* targets (or labels) in [0, classes) */
    int mixtures;     /* a mixture head's components (0: the head has none) */
    int max_labels;   /* the ctc head: label slots per row (0: no label sequences) */
    /* Sampling from scratch (attnbench sample): tasks whose rows are predicted value by
     * value behind a start token, inputs START x_0 .. x_{N-2} and targets x_0 ..
     * x_{N-1}, each value in [0, classes) fed back as the input token of the same id.
     * samplable: the task is such a task, START = classes (the input vocabulary
     * classes + 1). image_h, image_w, image_c: the shape of a row as an image in
     * raster order, channels last (0: the rows are not images). */
    bool samplable;
    int image_h, image_w, image_c;
    /* metrics */
    int n_metrics;
    task_metric metrics[TASK_MAX_METRICS];
    /* data: a generator (row != NULL) or a dataset (n_splits > 0, fill != NULL) */
    void (*row)(const train_task *t, ab_rng *rng, int *tokens, float *frames, int *targets, float *weights,
                int *length);
    int n_splits;
    const char *split_names[TASK_MAX_SPLITS];
    long long split_rows[TASK_MAX_SPLITS];
    /* Row `index` of split `split` (0 <= index < split_rows[split]): tokens or frames
     * (N, or N F), targets, weights (N) and *length in [0, N]. Pure function of its
     * arguments; may be called from one thread at a time. */
    void (*fill)(const train_task *t, int split, long long index, int *tokens, float *frames, int *targets,
                 float *weights, int *length);
    /* The ctc head: row `index`'s label sequence into labels (max_labels ints; the
     * first *count of them) and *count in [0, max_labels], the labels in
     * [0, classes) and aligned to the row's frames (at least count + repeats of them,
     * ctc_min_frames: the task checks its data when it loads it). Pure function of its
     * arguments, like fill. */
    void (*fill_labels)(const train_task *t, int split, long long index, int *labels, int *count);
    /* Dataset tasks: a batch of rows is cut to its longest row (task_batch_fill_rows
     * sets the batch's N to the largest of its lengths and packs the rows at that
     * stride), so the model runs over that many positions, not the task's seq_len: a
     * batch of short utterances costs what its longest one needs. The rows' valid
     * positions are the same either way; the arithmetic of position-wise layers is too,
     * but matrix products over another N may round differently. */
    bool pad_to_longest;
    /* Optional, dataset tasks: augments row r of a filled training batch in place
     * (e.g. masks bands of its frames), drawing from the cursor task_row_rng(seed,
     * TASK_STREAM_AUGMENT, step, r): a pure function of (seed, step, r) and the row, so
     * a resumed run augments exactly as before. Training batches only (trainer_fill_step); evaluation
     * and decoding see the rows as they are. NULL: no augmentation. */
    void (*augment)(const train_task *t, ab_rng *rng, task_batch *b, int r);
    /* Optional, for reports (attnbench decode): a row's name (e.g. its utterance id)
     * and a label's (e.g. its phone); NULL: rows and labels are shown by number. */
    const char *(*row_name)(const train_task *t, int split, long long index);
    const char *(*label_name)(const train_task *t, int label);
    /* generation (max_prompt 0: the task does not generate) */
    int max_prompt, max_gen;
    /* A generation prompt from the cursor: prompt (P tokens, P <= max_prompt) and the
     * expected continuation (G tokens, G <= max_gen, P + G - 1 <= N). */
    void (*prompt)(const train_task *t, ab_rng *rng, int *prompt, int *P, int *expected, int *G);
    /* The task's options with every default filled in (new reference), for results,
     * checkpoints and config comparison on resume. Includes "name". */
    json_t *(*to_json)(const train_task *t);
    void (*destroy)(train_task *t);
    void *priv;
};

typedef struct {
    const char *name;
    const char *summary;
    /* Every key its config object accepts, "name" included (NULL-terminated): also
     * what `train --set task.KEY=VALUE` may set when the config file leaves it out. */
    const char *const *keys;
    /* Creates the task from its config object (at config key "task"); unknown keys,
     * wrong types, out-of-range values and unreadable data are AB_EINVAL naming
     * "task.KEY" or the file. */
    int (*create)(const json_t *obj, train_task **out);
} task_kind;

/* The tasks a program knows, installed by the program before any config is parsed:
 * the list is made at the top (experiments/cli/task_list.c, task_list_install), so the
 * driver includes no task. `kinds` (n of them) must outlive every use; a later call
 * replaces the list. Without one, every task name is unknown. */
void task_kinds_install(const task_kind *const *kinds, int n);
/* The installed kinds, by name; NULL if unknown. */
const task_kind *task_kind_find(const char *name);
/* Names of every kind, comma-separated (for messages), built from the list. */
const char *task_kind_names(void);
/* Kind i (0, 1, ...), NULL past the last. */
const task_kind *task_kind_at(int i);
/* Creates the task named by obj's "name" key. */
int task_create(const json_t *obj, train_task **out);
void task_destroy(train_task *t);

/* Whether the task reads a dataset (else it is a generator). */
bool task_is_dataset(const train_task *t);
/* Index of the split named `name`, -1 if the task has none of that name. */
int task_split_find(const train_task *t, const char *name);
/* The split names, comma-separated (messages). */
void task_split_names(const train_task *t, char *buf, size_t cap);

/* The cursor of row r of batch `index` of `stream` (formula above). */
ab_rng task_row_rng(uint64_t run_seed, uint64_t stream, uint64_t index, uint64_t row);

/* The order of epoch e over n rows: order[i] = the row visited i-th, a permutation of
 * 0..n-1 drawn by Fisher-Yates from the Philox stream (seed, TASK_STREAM_EPOCH, e):
 * for i = n-1 down to 1, j = uniform{0..i} from the cursor ab_rng_make(seed_of(seed,
 * TASK_STREAM_EPOCH, e), 0), swap. A pure function of (seed, e, n). */
void task_epoch_order(uint64_t run_seed, uint64_t epoch, long long n, long long *order);

/* Allocates a batch of B rows of the task's shape (tracked allocator; one block). */
int task_batch_alloc(const train_task *t, int B, task_batch *b);
void task_batch_free(task_batch *b);
/* Generator: fills rows 0..B-1 of batch `index` of `stream`. */
void task_batch_fill(const train_task *t, uint64_t run_seed, uint64_t stream, uint64_t index, task_batch *b);
/* Dataset: fills the batch with rows `indices[0..rows-1]` of split `split`, at the
 * task's N; with pad_to_longest, then cut to N = the largest of the rows' lengths (at
 * least 1): tokens or frames, targets and weights packed at that stride. */
void task_batch_fill_rows(const train_task *t, int split, const long long *indices, int rows, task_batch *b);
/* v = rows r0 .. r0 + rows - 1 of the filled batch b, in place (pointers into b's
 * arrays, at b's N: a micro-batch of a step, trainer.h); nothing to free. */
void task_batch_view(const task_batch *b, int r0, int rows, task_batch *v);

/* The head's outputs per position, the width of the logits: classes (categorical),
 * classes + 1 (ctc: the blank first), 3 x mixtures (logistic mixture). */
int task_outputs(const train_task *t);
/* Whether higher values of the metric are better (accuracy, a custom metric that says
 * so); bits and PER are minimised. */
bool task_metric_maximised(const task_metric *m);
/* Metric sums: zeroes, adds one batch (its loss stats; the logits (rows, N,
 * task_outputs) on the host, needed only by PER and custom metrics:
 * task_metrics_need_logits), values. */
bool task_metrics_need_logits(const train_task *t);
void task_metrics_add(const train_task *t, const task_batch *b, const task_loss_stats *st, const float *logits,
                      double sums[][TASK_METRIC_SUMS]);
void task_metrics_values(const train_task *t, double sums[][TASK_METRIC_SUMS], double *values);

#endif
