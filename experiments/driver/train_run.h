/* A training run: a config (train_config.h) trained with periodic evaluation, logging
 * and checkpoints into an output folder, or a run there continued from its checkpoint.
 * What `attnbench train` does, callable without the command line: the CLI parses,
 * installs its signal handler and maps the result to an exit status.
 *
 * Output folder DIR (default results/NAME/):
 *   train.json       the run document (harness/results.h): config (canonical),
 *                    seed, machine, git, started, finished, status, records (one
 *                    "train" record per log point, one "eval" record per evaluation),
 *                    step_loss (the loss of every step), summary; rewritten atomically
 *                    at every log, evaluation and checkpoint point
 *   train.tsv        the records as a table (gnuplot, figure 2)
 *   checkpoint.bin   the training state (trainer.h), rewritten atomically every
 *                    checkpoint_every steps, at the end and on an interruption
 *
 * A resumed run keeps the earlier records up to the checkpoint's step (those after it
 * are dropped: the resumed run computes the same steps again, bit for bit on the same
 * number of threads).
 *
 * Data-parallel ranks (request.dist, dist.h): every rank runs this same function with
 * the same request; each trains its slice of every batch (trainer.h, "Micro-batches"),
 * all evaluate (the results are the same on every rank), and rank 0 alone writes DIR
 * (the document, the table, the checkpoints; the summary adds ranks, the engine, and
 * rank 0's time and bytes spent communicating). The ranks agree before the first step
 * (a rank that refuses makes all refuse) and on a stop (*stop set on any rank stops
 * all at the same step). A resume may use another number of ranks that divides the
 * batch (the steps then differ from an uninterrupted run's by float rounding). */
#ifndef AB_TRAIN_RUN_H
#define AB_TRAIN_RUN_H

#include "attention.h"
#include "dist.h"

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>

typedef struct {
    const char *config_path;  /* CONFIG.json; NULL with resume: the checkpoint's config */
    const json_t *config;     /* or the config itself (copied), in place of config_path */
    const char *const *sets;  /* "KEY=VALUE" overrides (train_config_apply_sets) */
    int n_sets;
    const char *out_dir;      /* DIR; NULL: results/NAME (NAME the config's) */
    bool resume, overwrite;
    bool quiet;               /* no progress bar, log lines or final message on stderr */
    ab_device device;
    const char *command_line; /* recorded in the run document */
    /* Set (to nonzero) by a signal handler: the run stops at the end of the step, with
     * a checkpoint (status "interrupted"). NULL: never. */
    volatile sig_atomic_t *stop;
    /* Called once, just before the first step (after the data are loaded and the model
     * built): where the CLI installs the handler that sets *stop, so that a signal
     * during the loading still ends the process. NULL: none. */
    void (*on_start)(void *ctx);
    /* Called after each step, once its records and files are written. NULL: none. */
    void (*on_step)(void *ctx, long long step);
    void *ctx;
    ab_dist *dist;            /* data-parallel ranks (NULL: one process) */
} train_run_request;

typedef enum {
    TRAIN_RUN_OK,          /* the run reached its last step (or was complete already) */
    TRAIN_RUN_INTERRUPTED, /* *stop was set: a checkpoint written, status "interrupted" */
    TRAIN_RUN_REFUSED,     /* the request was refused, or its run document could not be
                            * started: no step was run */
    TRAIN_RUN_FAILED,      /* the run began and failed (its document says "failed" with the
                            * reason, where it could be written) */
} train_run_status;

typedef struct {
    train_run_status status;
    /* 0, or the error code (ab_error() has the one-line message): on a refusal the
     * code says whose fault it is (AB_EINVAL, AB_EIO, AB_EUNSUPPORTED: the request's;
     * the others: a resource's); a failed run is a failure of the run whatever its
     * code (it began on a valid request). */
    int code;
    long long step;        /* the last step done (0 when none) */
    char dir[4096];        /* DIR */
} train_run_result;

/* Runs the request; returns res->code. Never exits: every error is returned with its
 * message (ab_fail), in the words `attnbench train` prints. */
int train_run(const train_run_request *req, train_run_result *res);

#endif
