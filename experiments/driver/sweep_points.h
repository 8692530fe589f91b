/* A sweep cut into points, for running it as many jobs (a Slurm job array,
 * harness/scripts/slurm-sweep.sh) and joining their documents again
 * (experiments/sweep/CLUSTER.md).
 *
 * A point is the sweep's unit of work: one variant at one length (a "parallel"
 * record) or at one context (a "recurrent" record), in the order a full run measures
 * them (each variant's lengths, then its contexts). `attnbench bench --point I`
 * measures point I alone, into its own run document (the schema of a full run's, with
 * one record and a "points" object saying which point it holds); `attnbench merge`
 * joins such documents into the document of the whole sweep, checked. */
#ifndef AB_SWEEP_POINTS_H
#define AB_SWEEP_POINTS_H

#include "sweep.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    int index;
    bool recurrent; /* kind "recurrent" (len: a context) or "parallel" (len: N) */
    int variant;    /* index into c->variants */
    int pos;        /* index into c->lengths or c->contexts */
    long long len;
} sweep_point;

/* The points of a parsed config, whose variants' has_step is set (sweep_run.c does),
 * in a malloc'ed array. 0 or AB_ENOMEM. */
int sweep_points_list(const sweep_config *c, sweep_point **out, int *n);
/* {"index", "kind", "variant" (the label), "len" or "context"}. */
json_t *sweep_point_json(const sweep_config *c, const sweep_point *p);
/* A point document's "points" object: {"count": n, "held": [index], "list": [the
 * point's sweep_point_json]}. */
json_t *sweep_points_marker(const sweep_config *c, const sweep_point *pts, int n, int index);
/* The document of point `index` of a run whose document is `run_out`: run_out without
 * its ".json", then ".point-INDEX.json" (results/NAME.json -> results/NAME.point-3.json).
 * 0 or AB_EINVAL when it does not fit in cap. */
int sweep_point_path(const char *run_out, int index, char *buf, size_t cap);
/* Whether `path` holds point `index` of `count`, finished with status "ok", of the
 * config `config` (as recorded: the file with --set applied and "device"): what a
 * resubmission skips. Never fails: an absent, unreadable or foreign file is false. */
bool sweep_point_done(const char *path, const json_t *config, int index, int count);

typedef struct {
    const char *const *docs; /* the point documents */
    int n_docs;
    const char *out_path;    /* the whole run's document (and its .tsv beside it) */
    const char *command_line;
} sweep_merge_request;

/* Joins the point documents into the run document of the whole sweep at out_path,
 * written once, atomically (an existing file is replaced only by a complete one).
 * Checks: each file is a finished point document (schema attnbench/run/1, a "points"
 * object, status "ok" or "failed", its records those of its points); every document
 * has the first one's config and machine class (sweep_machine_class) and build (git
 * commit); no point is held twice; no point is missing (the missing ones are listed).
 * A record after a point that ran out of time or memory (status oom, timeout or
 * failed) of the same variant and kind becomes "skipped", as a full run records it
 * (with "point_status": what its own point measured). sgemm and copy: the point
 * document's whose rate is the median; every point's rate is in "points". 0, AB_EINVAL
 * (a one-line message naming the file and the problem) or the write's error code.
 * *failed: the merged status is "failed" (a point failed). */
int sweep_merge(const sweep_merge_request *req, bool *failed);

/* The machine class points must share to be merged: {"cpu", "threads", "blas_core",
 * "gpu"} from a run document's "machine" (gpu: the device's name, or null). */
json_t *sweep_machine_class(const json_t *doc);

#endif
