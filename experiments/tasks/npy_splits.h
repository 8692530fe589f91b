/* Dataset splits stored as .npy files in one folder (the generic dataset tasks,
 * sequences_task.h and frames_task.h): DIR/SPLIT.SUFFIX.npy per split and per array.
 *
 * The splits are found by name: those listed in the task's "splits" option, or else
 * every one of "train", "valid", "test" whose first array exists; "train" must be
 * there. Every array of a split must have the same number of rows (its first
 * dimension); a file that is missing, unreadable, of another dtype or shape, or
 * truncated is one line naming the file (AB_EINVAL). */
#ifndef AB_NPY_SPLITS_H
#define AB_NPY_SPLITS_H

#include "npy.h"
#include "task.h"

#include <jansson.h>
#include <stdbool.h>

#define NPY_SPLITS_MAX_ARRAYS 4

typedef struct {
    int n;                                             /* splits found */
    char names[TASK_MAX_SPLITS][32];
    long long rows[TASK_MAX_SPLITS];
    ab_array arrays[TASK_MAX_SPLITS][NPY_SPLITS_MAX_ARRAYS]; /* count 0: an optional array absent */
} npy_splits;

/* Loads the arrays named by `suffixes` (n_arrays of them; "SPLIT.SUFFIX.npy", or
 * "SPLIT.npy" for an empty suffix) for each split. `required[i]` false: the array may
 * be absent (count 0). `splits`: the config's list of split names (NULL: the default
 * search). `where` is the config location for messages ("task"). */
int npy_splits_load(const char *dir, const json_t *splits, const char *const *suffixes, const bool *required,
                    int n_arrays, const char *where, npy_splits *s);
void npy_splits_free(npy_splits *s);

/* Element (i) of an int32/int64 array as a long long. */
static inline long long npy_int_at(const ab_array *a, size_t i) {
    return a->dtype == AB_I64 ? (long long)((const int64_t *)a->data)[i] : (long long)((const int32_t *)a->data)[i];
}

/* Checks the "rows" option of a canonical config (an object split -> rows, as
 * npy_splits_rows_json writes it) against what was loaded; absent: nothing to check. */
int npy_splits_check_rows(const npy_splits *s, const json_t *rows, const char *where);
json_t *npy_splits_rows_json(const npy_splits *s);
json_t *npy_splits_names_json(const npy_splits *s);
/* Copies the split names and row counts into the task (its names point into s). */
void npy_splits_to_task(const npy_splits *s, train_task *t);

#endif
