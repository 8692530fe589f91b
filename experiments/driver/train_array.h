/* A training array: one config, many runs (seeds, learning rates, variants), each a
 * task of a Slurm job array (harness/scripts/slurm-train.sh) or run by hand.
 *
 * The config's top-level key "array" is a list of objects, each a run's overrides by
 * dotted key, as --set takes them: "array": [{"seed": 1}, {"seed": 2, "optim.lr": 3e-4}].
 * `attnbench train CONFIG --array-index I` runs entry I: the config without "array",
 * the entry's overrides applied first (as --set KEY=VALUE, so setting steps or epochs
 * alone replaces the other), then the command line's --set. Its folder is
 * DIR/array-I (DIR: --out, default results/NAME), holding array.json (the index and
 * the overrides) beside the run's files; a run there (--resume, --overwrite) must be
 * the same entry's: another index's folder is refused. */
#ifndef AB_TRAIN_ARRAY_H
#define AB_TRAIN_ARRAY_H

#include <jansson.h>
#include <stddef.h>

typedef struct {
    json_t *config;  /* the config without "array" (owned) */
    char **sets;     /* entry I's overrides as "KEY=VALUE" (owned) */
    int n_sets;
    int count;       /* the array's entries */
    char dir[4096];  /* the run's folder, DIR/array-I */
} train_array_task;

/* The number of entries of the config at path (its "array"). 0 or AB_EINVAL with a
 * one-line message (no "array", not a list of objects, a value that is no JSON). */
int train_array_count(const char *config_path, int *count);

/* Entry `index` of the config at path, for a run whose --out is out_dir (NULL:
 * results/NAME). Checks the folder's array.json when there is one (another index's, or
 * another entry's overrides: AB_EINVAL) and writes it when there is none (the folder
 * made). 0, or an error code with a one-line message; t is freed on failure. */
int train_array_prepare(const char *config_path, int index, const char *out_dir, train_array_task *t);
void train_array_free(train_array_task *t);

#endif
