/* The state of a training run and its operations: one training step, evaluation over
 * a split, and checkpoints (train_ckpt.c). Generic over tasks (task.h): their data,
 * input, head and metrics.
 *
 * A training step t (1, 2, ...) of a run with seed S:
 *   batch    generator tasks: rows of batch t of TASK_STREAM_DATA; dataset tasks: the
 *            rows at positions (t-1) B .. t B - 1 of the stream of epoch orders of the
 *            training split (task.h)
 *   forward  tf_forward (tokens) or tf_forward_frames (frames), train = true,
 *            seed = tf_step_seed(S, t), with the rows' lengths (dropout masks and LSH
 *            rotations follow from that seed)
 *   loss     tf_loss with the task's weights (the ctc head: tf_loss_ctc with the
 *            batch's label sequences, every row of weight 1); a NaN or infinite
 *            loss stops here
 *   backward tf_backward after tf_zero_grad
 *   update   ab_optim_step (clipping, schedule, Adam/RAdam); a non-finite gradient
 *            norm stops here (the optimiser then changes nothing)
 * A plateau schedule's factor changes only between steps, after the evaluations the
 * driver reports to it (trainer_plateau).
 * Evaluation (trainer_eval): generator tasks: batches 0 .. eval_batches-1 of
 * TASK_STREAM_EVAL; dataset tasks: rows 0 .. rows-1 of a split in order, in batches of
 * B (the last one may be smaller). Forward without dropout with the fixed seed
 * tf_step_seed(S, TRAIN_EVAL_STEP) (for LSH: one fixed set of rotations for every
 * evaluation); loss = sum(w nll) / sum(w) over all of it, and each of the task's
 * metrics over all of it.
 *
 * Micro-batches (config "accumulate" A; data-parallel ranks R, dist.h): the step's
 * batch of B rows, filled as above by every process, is cut into K = R A micro-batches
 * of b = B / K rows; rank r runs micro-batches k = r A .. r A + A - 1 (rows k b ..
 * k b + b - 1), each a forward, loss and backward as above with the step's seed, its
 * rows drawing the dropout masks they have in the whole batch (tf_set_row_offset).
 * With W_k the micro-batch's weight sum and g_k the gradient of its mean loss, a rank
 * forms p_r = (W_k g_k for its first k) + W_k g_k + ... (floats, in order), the ranks'
 * p_r are summed in rank order (ab_dist_sum_floats), and the step's gradient is that
 * sum times (float)(1 / W), W the sum of every W_k (in order); the loss is
 * sum(loss_k W_k) / W. So R ranks of A = 1 give the bits of one process with
 * A = R, and agree with a plain step (K = 1, taken as before) to float rounding. A
 * micro-batch runs at the whole batch's N; evaluation runs in batches of b rows. The
 * model is built for b rows: accumulate trades time for memory.
 *
 * Everything is a function of (config, seed, step, parameters, optimiser state), so a
 * run restored from a checkpoint continues bit for bit on the same number of threads
 * (and the same number of ranks). */
#ifndef AB_TRAINER_H
#define AB_TRAINER_H

#include "checkpoint.h"
#include "dist.h"
#include "optim.h"
#include "task.h"
#include "train_config.h"
#include "transformer.h"

#include <stdbool.h>

#define TRAIN_EVAL_STEP 0xFFFFFFFFFFFFFFFFULL

typedef struct {
    double loss;            /* weighted mean loss of the batch */
    task_loss_stats st;     /* the head's statistics of the batch */
    double grad_norm, lr, clip_scale;
    bool diverged;          /* non-finite loss or gradient: the step changed nothing */
} train_step_info;

typedef struct {
    double loss;
    double metrics[TASK_MAX_METRICS]; /* the task's metrics, in its order */
    long long counted;      /* scored positions */
    long long rows;         /* rows evaluated */
} train_eval_info;

typedef struct {
    train_config cfg;       /* owned */
    tf_model *model;
    ab_optim *opt;
    task_batch batch;       /* training rows (cfg.batch) */
    long long *order;       /* dataset tasks: the order of epoch order_epoch over the training split */
    long long order_epoch;  /* -1: none yet */
    long long *rows;        /* dataset tasks: the row indices of a batch (cfg.batch) */
    int train_split;        /* dataset tasks: index of "train" */
    float *host_logits;     /* a batch's logits on the host, when a metric needs them (else NULL) */
    long long step;         /* steps done */
    double *losses;         /* losses[i]: loss of step i + 1, for i < step */
    long long losses_cap;
    double elapsed_s;       /* wall time of earlier processes of this run (from the checkpoint) */
    double step_s;          /* seconds spent inside training steps so far, all processes */
    double cpu_s;           /* CPU time (ab_cpu_ns) of earlier processes of this run (from the
                               checkpoint; NaN when a checkpoint of an earlier release lacks it) */
    double step_cpu_s;      /* CPU seconds inside training steps so far, all processes (NaN: as cpu_s) */
    double positions;       /* model positions of the training steps so far (rows x the batch's N,
                               summed over steps; N varies when the task pads to the longest row) */
    int ckpt_threads;       /* threads of the run that wrote the restored checkpoint (0: none) */
    float *host_params;     /* model on CUDA: host copy for checkpoints (tracked); NULL on the CPU */
    ab_dist *dist;          /* data-parallel ranks (borrowed; NULL: one process) */
    int micro_rows;         /* b: rows of a micro-batch (the batch when K = 1) */
    float *acc;             /* K > 1: the weighted gradient sum (parameters' device; tracked) */
    /* K > 1: the metric sums of the last step's micro-batches, all ranks (the logits
     * of one micro-batch are not the batch's) */
    double step_sums[TASK_MAX_METRICS][TASK_METRIC_SUMS];
    bool have_step_sums;
} trainer;

/* Builds the model (max batch cfg.batch) on cfg->model.device, the optimiser on the
 * same device (decay flags from the parameter table) and the batch buffer; takes
 * ownership of *cfg (also on failure). The device is a property of the run, not of the
 * config: a checkpoint resumes on either device (bit for bit only on the one that wrote
 * it, with the same thread count on the CPU). */
int trainer_create(train_config *cfg, trainer **out);
/* The same for one rank of data-parallel ranks `dist` (NULL: one process): the batch
 * must divide into R x accumulate micro-batches. */
int trainer_create_dist(train_config *cfg, ab_dist *dist, trainer **out);
void trainer_destroy(trainer *t);

/* One step as described above, on rows already in `b`; `step` is the step's number
 * (1-based). Used by trainer_step and by the tests. On divergence: AB_EINVAL with a
 * message, info->diverged set, parameters and optimiser unchanged for a bad loss. */
int train_step(tf_model *m, ab_optim *o, const task_batch *b, uint64_t run_seed, long long step,
               train_step_info *info);
/* Fills t->batch with the rows of training step `step` (1-based), augmented when the
 * task augments (train_task.augment). */
int trainer_fill_step(trainer *t, long long step);
/* Step t->step + 1 with its batch; records the loss. */
int trainer_step(trainer *t, train_step_info *info);
/* Evaluation: split < 0 (and generator tasks): the evaluation set of the config
 * (eval_batches batches, or eval_rows rows of eval_split); split >= 0: the first
 * `rows` rows of that split (all when rows <= 0 or more than it has). */
int trainer_eval(trainer *t, int split, long long rows, train_eval_info *e);
/* The plateau schedule (optim.schedule.plateau, train_config.h): reports the watched
 * value of evaluation e (its loss or metric, negated when better higher) to the
 * optimiser; *reduced says whether the learning rate was lowered. Nothing (0) without
 * a plateau schedule. Call it after the evaluations at positive multiples of
 * eval_every only. */
int trainer_plateau(trainer *t, const train_eval_info *e, bool *reduced);
/* The task's metrics of the last training step's batch (values in the task's order). */
int trainer_step_metrics(trainer *t, const train_step_info *info, double *values);
/* Whether the config evaluates at all (generator: eval_batches > 0). */
bool trainer_has_eval(const trainer *t);

/* ---- checkpoints (train_ckpt.c) ----
 * Blobs: "format" ("attnbench-train/2"), "config" (canonical config JSON), "state"
 * (JSON: step, n_params, seed, elapsed_s (wall time of all processes so far), step_s
 * (time inside training steps), threads (of the process that wrote it); cpu_s,
 * step_cpu_s (the same as process CPU time) and positions (trainer.positions), which
 * checkpoints written before them lack: the CPU times are then unknown (NaN), the
 * positions step x batch x N, which they were), "params",
 * "optim", "losses" (float64 per step done). Written atomically (a crash leaves the
 * previous file). Checkpoints of format "attnbench-train/1" (the release before
 * datasets) load too: their binary "meta" record holds the same facts (and a data
 * position and cursor, which must agree with the step: both are derived from it). */
#define TRAIN_CKPT_FORMAT "attnbench-train/2"
#define TRAIN_CKPT_FORMAT_V1 "attnbench-train/1"

/* What a checkpoint's state record holds. */
typedef struct {
    long long step;
    size_t n_params;
    uint64_t seed;
    double elapsed_s, step_s;
    double cpu_s, step_cpu_s; /* NaN when the checkpoint lacks them */
    double positions;         /* -1 when the checkpoint lacks it */
    int threads;
} train_ckpt_state;

/* Writes the checkpoint; elapsed_s and cpu_s: the run's wall and CPU time so far, all
 * processes. */
int trainer_save(trainer *t, const char *path, double elapsed_s, double cpu_s);
/* Opens and checks a training checkpoint: the container (checkpoint.h), the format
 * blob ("... is not a training checkpoint" otherwise) and the config blob. *config:
 * the canonical config (new reference). */
int train_ckpt_open(const char *path, ab_ckpt_reader **r, json_t **config);
/* Restores parameters, optimiser state, step, losses and elapsed time into a trainer
 * built from a config equal to the checkpoint's (up to the resumable keys). */
int trainer_restore(trainer *t, const ab_ckpt_reader *r);
/* The state record (either format). */
int train_ckpt_get_state(const ab_ckpt_reader *r, train_ckpt_state *st);
/* Checks that the checkpoint's parameters (the state record's count and the size of
 * the params blob) fit the model `model` would build, without building it: a
 * checkpoint whose config was edited to a huge model is refused before anything is
 * allocated for it. 0 or AB_EINVAL naming the file; *st (may be NULL) receives the
 * state record. */
int train_ckpt_check_model(const ab_ckpt_reader *r, const tf_config *model, train_ckpt_state *st);
/* For generation: the config, the task and a model of max batch `max_batch` on
 * `device` with the checkpoint's parameters, made for inference only
 * (tf_create_inference); state (may be NULL) receives the state
 * record. `variant` (NULL: the checkpoint's) runs the model with another attention
 * variant that computes the same function with the same parameters: softmax and
 * stateful-softmax stand in for each other (stateful-softmax trains as softmax and
 * samples with its key/value cache); any other change is AB_EINVAL. forward_len: the
 * model's cfg.forward_len (0: forwards up to max_len; 1: a sampler from the start
 * token, whose activations then hold one position). */
int train_ckpt_load_model(const char *path, int max_batch, int forward_len, ab_device device, const char *variant,
                          train_config *cfg, tf_model **model, train_ckpt_state *state);
/* Whether attention variant `b` may stand in for `a` with a's trained parameters (the
 * same function: equal names, or softmax and stateful-softmax); false with a message. */
bool train_variant_interchangeable(const char *a, const char *b);

#endif
