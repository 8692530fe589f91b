/* A sweep run (sweep.h): the config read and checked, every variant's points measured
 * in order, and the run document written after each point. What `attnbench bench`
 * does, callable without the command line: the CLI parses, installs its signal
 * handler and maps the result to an exit status. */
#ifndef AB_SWEEP_RUN_H
#define AB_SWEEP_RUN_H

#include "attention.h"

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>

typedef struct {
    const char *config_path;  /* CONFIG.json (experiments/sweep/) */
    const char *const *sets;  /* "KEY=VALUE" overrides (ab_config_set) */
    int n_sets;
    const char *out_path;     /* FILE; NULL: results/NAME.json */
    bool quiet;               /* no progress lines on stderr, no traffic table on stdout */
    ab_device device;
    const char *command_line; /* recorded in the run document */
    /* Set (to nonzero) by a signal handler: the sweep stops after the point in flight
     * (status "interrupted"). NULL: never. */
    volatile sig_atomic_t *stop;
    /* Called once the run document exists, before the first measurement: where the CLI
     * installs the handler that sets *stop. NULL: none. */
    void (*on_start)(void *ctx);
    void *ctx;
    /* A sharded run (sweep_points.c): with one_point, only the point of index `point`
     * (sweep_points) is measured, into its own document (out_path: the whole run's,
     * from which the point's is derived by sweep_point_path), marked with "points". */
    bool one_point;
    int point;
} sweep_run_request;

typedef enum {
    SWEEP_RUN_OK,           /* every point measured or skipped */
    SWEEP_RUN_INTERRUPTED,  /* *stop was set: the document says "interrupted" */
    SWEEP_RUN_POINTS_FAILED, /* a point failed (its record says why): the document says "failed" */
    SWEEP_RUN_ERROR,        /* an error: the code says whose (AB_EINVAL, AB_EIO, AB_EUNSUPPORTED:
                             * the request's; the others: a resource's) */
    SWEEP_RUN_FAILED,       /* the run document could not be written on: a failure of the
                             * run whatever its code */
} sweep_run_status;

typedef struct {
    sweep_run_status status;
    int code;              /* 0, or the error code (ab_error() has the message) */
} sweep_run_result;

/* The TSV columns of a sweep's run document (NULL-terminated), shared with merge. */
extern const char *const sweep_tsv_columns[];

/* Runs the request; returns res->code. Never exits: every error is returned with its
 * one-line message (ab_fail), in the words `attnbench bench` prints. */
int sweep_run(const sweep_run_request *req, sweep_run_result *res);

/* The points of the request's sweep (sweep_points.h), what `attnbench bench --points`
 * prints: {"schema": "attnbench/points/1", "name", "count", "document" (the whole
 * run's), "points": [{"index", "kind", "variant", "len" or "context", "document" (the
 * point's), "done" (sweep_point_done: a resubmission skips it)}]}. Nothing is
 * measured. 0 or an error code with its message. */
int sweep_points_doc(const sweep_run_request *req, json_t **doc);

#endif
