/* Run documents and checkpoints of `attnbench train` for the suites that train end to
 * end (train_cli, train_data, images, speech_task): a train.json loaded, its numbers
 * and records, a checkpoint's blobs, and the per-step losses. Failures are Criterion
 * assertions of the calling test. The names are those the suites gave their own
 * copies before these were shared, so their tests read as before. */
#ifndef AB_TEST_RUN_H
#define AB_TEST_RUN_H

#include <jansson.h>
#include <stddef.h>
#include <sys/types.h>

/* The JSON document at `path` (asserted to parse); json_decref it. */
json_t *load(const char *path);

/* The number `key` of object `o` (asserted to be one). */
double num(json_t *o, const char *key);

/* The first and the last record of `kind` ("eval", "test", ...) in doc's "records"
 * (asserted: at least one). */
void records(json_t *doc, const char *kind, json_t **first, json_t **last);

/* The blob `name` of the checkpoint at `path`, copied (malloc'ed); *n its size. */
void *blob(const char *path, const char *name, size_t *n);

/* The blobs a resumed run must reproduce exactly: parameters, optimiser state and the
 * losses (the state and config blobs hold times and the resumable keys). `what` names
 * the comparison in the failure message. */
void expect_same_state(const char *a, const char *b, const char *what);

/* The per-step losses ("step_loss") of the run document at `path`, malloc'ed; *n
 * their count. */
double *step_losses(const char *path, size_t *n);

/* The step a training checkpoint was taken at (-1: it cannot be opened). */
long long ckpt_step(const char *path);

/* Waits until the checkpoint of a running process reaches `step` (or the process
 * ends, or 60 s pass). Returns the step seen. */
long long wait_for_checkpoint(pid_t pid, const char *path, long long step);

#endif
