/* The state of a training run and its operations: one training step, evaluation on
 * the fixed evaluation set, and checkpoints (train_ckpt.c). Generic over tasks (task.h).
 *
 * A training step t (1, 2, ...) of a run with seed S:
 *   batch    rows of batch t of TASK_STREAM_DATA (task.h)
 *   forward  tf_forward(train = true, seed = tf_step_seed(S, t)) with the rows' lengths
 *            (dropout masks and LSH rotations follow from that seed)
 *   loss     tf_loss with the task's weights; a NaN or infinite loss stops here
 *   backward tf_backward after tf_zero_grad
 *   update   ab_optim_step (clipping, schedule, Adam/RAdam); a non-finite gradient
 *            norm stops here (the optimiser then changes nothing)
 * Evaluation: batches 0 .. eval_batches-1 of TASK_STREAM_EVAL, forward without dropout
 * with the fixed seed tf_step_seed(S, TRAIN_EVAL_STEP) (for LSH: one fixed set of
 * rotations for every evaluation), loss = sum(w nll) / sum(w) over all of them,
 * accuracy = weighted positions whose argmax is the target / weighted positions.
 *
 * Everything is a function of (config, seed, step, parameters, optimiser state), so a
 * run restored from a checkpoint continues bit for bit on the same number of threads. */
#ifndef AB_TRAINER_H
#define AB_TRAINER_H

#include "checkpoint.h"
#include "optim.h"
#include "task.h"
#include "train_config.h"
#include "transformer.h"

#include <stdbool.h>

#define TRAIN_EVAL_STEP 0xFFFFFFFFFFFFFFFFULL

typedef struct {
    double loss;            /* weighted mean loss of the batch */
    long long correct, counted;
    double grad_norm, lr, clip_scale;
    bool diverged;          /* non-finite loss or gradient: the step changed nothing */
} train_step_info;

typedef struct {
    double loss, accuracy;
    long long counted;      /* scored positions */
} train_eval_info;

typedef struct {
    train_config cfg;       /* owned */
    tf_model *model;
    ab_optim *opt;
    task_batch batch;       /* training rows (cfg.batch) */
    long long step;         /* steps done */
    double *losses;         /* losses[i]: loss of step i + 1, for i < step */
    long long losses_cap;
    double elapsed_s;       /* wall time of earlier processes of this run (from the checkpoint) */
    double step_s;          /* seconds spent inside training steps so far, all processes */
    int ckpt_threads;       /* threads of the run that wrote the restored checkpoint (0: none) */
    float *host_params;     /* model on CUDA: host copy for checkpoints (tracked); NULL on the CPU */
} trainer;

/* Builds the model (max batch cfg.batch) on cfg->model.device, the optimiser on the
 * same device (decay flags from the parameter table) and the batch buffer; takes
 * ownership of *cfg (also on failure). The device is a property of the run, not of the
 * config: a checkpoint resumes on either device (bit for bit only on the one that wrote
 * it, with the same thread count on the CPU). */
int trainer_create(train_config *cfg, trainer **out);
void trainer_destroy(trainer *t);

/* One step as described above, on rows already in `b`; `step` is the step's number
 * (1-based). Used by trainer_step and by the tests. On divergence: AB_EINVAL with a
 * message, info->diverged set, parameters and optimiser unchanged for a bad loss. */
int train_step(tf_model *m, ab_optim *o, const task_batch *b, uint64_t run_seed, long long step,
               train_step_info *info);
/* Step t->step + 1 with its batch; records the loss. */
int trainer_step(trainer *t, train_step_info *info);
/* Evaluation on the fixed set (cfg.eval_batches batches of cfg.batch rows). */
int trainer_eval(trainer *t, train_eval_info *e);

/* ---- checkpoints (train_ckpt.c) ----
 * Blobs: "format" ("attnbench-train/1"), "config" (canonical config JSON),
 * "params", "optim", "meta" (step, n_params, seed, data position = step, elapsed
 * seconds, extra[0] = threads, extra[1] = the bits of the double step_s; rng[0] = the data cursor (seed, TASK_STREAM_DATA,
 * step)), "losses" (float64 per step done). Written atomically (a crash leaves the
 * previous file). */
#define TRAIN_CKPT_FORMAT "attnbench-train/1"

int trainer_save(trainer *t, const char *path, double elapsed_s);
/* Opens and checks a training checkpoint: the container (checkpoint.h), the format
 * blob ("... is not a training checkpoint" otherwise) and the config blob. *config:
 * the canonical config (new reference). */
int train_ckpt_open(const char *path, ab_ckpt_reader **r, json_t **config);
/* Restores parameters, optimiser state, step, losses and elapsed time into a trainer
 * built from a config equal to the checkpoint's (up to the resumable keys). */
int trainer_restore(trainer *t, const ab_ckpt_reader *r);
/* For generation: the config, the task and a model of max batch `max_batch` on
 * `device` with the checkpoint's parameters; meta (may be NULL) receives the meta
 * record. */
int train_ckpt_load_model(const char *path, int max_batch, attn_device device, train_config *cfg, tf_model **model,
                          ab_ckpt_meta *meta);

#endif
