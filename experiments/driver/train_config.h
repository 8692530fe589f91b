/* The config of a training run (`attnbench train CONFIG.json`), parsed and validated.
 *
 *   {
 *     "name": "copy-cpu-linear",           required; default output folder results/NAME/
 *     "label": "linear",                   legend label in figures (default: name)
 *     "description": "...",
 *     "task": {"name": "copy", ...},       the task and its options (task.h, copy_task.h)
 *     "model": {
 *       "body": "transformer",             or "lstm"
 *       transformer: "d_model": 256, "heads": 8, "layers": 4, "d_ff": 1024, "dropout": 0.0,
 *         "pre_norm": false, "final_norm": true,
 *         "attention": {"variant": "lsh", "set": {"rounds": 4, "chunk": 32}}
 *       lstm: "d_model": 64 (the input stage's width), "layers": 3, "hidden": 320
 *         (units per direction), "bidirectional": true, "dropout": 0.0 (between layers)
 *     },
 *     "optim": {...},                      models/optim.h's JSON (RAdam, schedule, ...);
 *                                          schedule.plateau.metric: "loss" or a task metric
 *     "steps": 10000, "batch": 64,         or, for a dataset task, "epochs": 250
 *     "eval_every": 250, "eval_batches": 4 (generator tasks),
 *     "eval_split": "valid", "eval_rows": 0, "test_split": "test" (dataset tasks),
 *     "checkpoint_every": 500, "log_every": 25,
 *     "seed": 1, "accumulate": 1       (micro-batches of batch / accumulate rows per step,
 *                                       their gradients summed: trainer.h)
 *   }
 *
 * The model's input (tokens or frames), vocabulary or features, length, classes, head
 * and causality come from the task; its initialisation seed is the run's seed. Every
 * key but name, task and model is optional (defaults: model as tf_config_default,
 * optim as ab_optim_config_default, steps 1000, batch 64, eval_every 100,
 * eval_batches 4, checkpoint_every 500, log_every 10, seed 1). Dataset tasks: "epochs"
 * (a positive number; steps = ceil(epochs x training rows / batch)) may replace
 * "steps" (given both, they must agree); evaluation runs over the first eval_rows rows
 * (0: all) of eval_split (default "valid" if the task has it, else "test"), and at
 * the end of a run over all of test_split (default "test" when the task has it and it
 * is not the evaluation split; "" for none). Unknown keys, wrong types and values out
 * of range are errors whose one-line message names the dotted key.
 *
 * A plateau schedule (optim.schedule.plateau, models/optim.h) watches the evaluation
 * loss ("loss") or one of the task's metrics on the evaluation set: the driver reports
 * it to the optimiser after each evaluation at a positive multiple of eval_every (not
 * the one at step 0, nor the extra one at the end of a run, whose step depends on where
 * the run stops), negated for a metric that is better higher (accuracy), so that a
 * run stopped and resumed reduces its learning rate at the same steps.
 *
 * The canonical form (train_config.canon) has every key with its value, defaults
 * filled in: it is what results and checkpoints record and what a resume compares. */
#ifndef AB_TRAIN_CONFIG_H
#define AB_TRAIN_CONFIG_H

#include "optim.h"
#include "task.h"
#include "transformer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define TRAIN_MAX_ATTN_SETTINGS 16

typedef struct {
    json_t *canon;              /* canonical config (owned) */
    const char *name, *label;   /* point into canon */
    train_task *task;           /* owned */
    tf_config model;            /* strings point into canon and attn_settings (a copy of the
                                   struct must re-point model.attn_settings) */
    char *attn_settings[TRAIN_MAX_ATTN_SETTINGS];
    ab_optim_config optim;
    long long steps, batch, eval_every, eval_batches, checkpoint_every, log_every;
    long long accumulate;  /* micro-batches per step and process (trainer.h) */
    double epochs;              /* dataset tasks: as given (0: steps given instead) */
    int eval_split, test_split; /* dataset tasks: split indices (test_split -1: none) */
    long long eval_rows;        /* rows of eval_split evaluated (all of it when 0 in the config) */
    uint64_t seed;
    int plateau_metric;         /* optim.schedule.plateau's metric: TRAIN_PLATEAU_NONE, _LOSS, or the
                                   index of the task's metric */
    bool plateau_maximise;      /* that metric is better higher (accuracy) */
} train_config;

#define TRAIN_PLATEAU_NONE (-2) /* no plateau schedule */
#define TRAIN_PLATEAU_LOSS (-1) /* the evaluation loss */

/* Parses and validates `root` (the attention variant and its options included). 0 or
 * AB_EINVAL / AB_ENOMEM with a one-line message; on error *c holds nothing to free. */
int train_config_parse(const json_t *root, train_config *c);
void train_config_free(train_config *c);

/* Applies `--set KEY=VALUE` overrides (dotted keys, JSON or bare values, config.h's
 * ab_config_set) to the config `root` as written. A key the file leaves out (its default
 * applies) may be set too: it must be a key of the canonical config (so a misspelt key
 * is still an error), an option of the task's kind (the canonical config leaves out
 * some that are off, e.g. the copy task's noise), or an option under
 * model.attention.set (the variant checks those). Setting `steps` or `epochs` alone
 * replaces the other. 0, or AB_EINVAL with a one-line message. */
int train_config_apply_sets(json_t *root, const char *const *sets, int n);

/* Keys a resumed run may change (NULL-terminated): name, label, description, steps,
 * epochs, eval_every, checkpoint_every, log_every. */
extern const char *const TRAIN_RESUMABLE_KEYS[];

/* Compares two canonical configs, ignoring TRAIN_RESUMABLE_KEYS at the top level.
 * 0 when equal; otherwise 1 with the first differing dotted key in `key`. */
int train_config_diff(const json_t *a, const json_t *b, char *key, size_t cap);

#endif
