/* Dataset splits as .npy files (npy_splits.h). */
#include "npy_splits.h"

#include "error.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const char *const DEFAULT_SPLITS[] = {"train", "valid", "test"};

static void path_of(char *buf, size_t cap, const char *dir, const char *split, const char *suffix) {
    snprintf(buf, cap, "%s/%s%s%s.npy", dir, split, *suffix ? "." : "", suffix);
}

static bool is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

void npy_splits_free(npy_splits *s) {
    for (int i = 0; i < TASK_MAX_SPLITS; i++)
        for (int j = 0; j < NPY_SPLITS_MAX_ARRAYS; j++) ab_array_free(&s->arrays[i][j]);
    memset(s, 0, sizeof *s);
}

static int add_split(npy_splits *s, const char *name, const char *where) {
    if (s->n == TASK_MAX_SPLITS) return ab_fail(AB_EINVAL, "config: '%s.splits' has more than %d splits", where, TASK_MAX_SPLITS);
    if (!*name || strlen(name) >= sizeof s->names[0] || strchr(name, '/') || strchr(name, '.'))
        return ab_fail(AB_EINVAL, "config: '%s.splits': '%s' is not a split name (a plain name without '/' or '.')",
                       where, name);
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0) return ab_fail(AB_EINVAL, "config: '%s.splits' names '%s' twice", where, name);
    snprintf(s->names[s->n++], sizeof s->names[0], "%s", name);
    return 0;
}

int npy_splits_load(const char *dir, const json_t *splits, const char *const *suffixes, const bool *required,
                    int n_arrays, const char *where, npy_splits *s) {
    memset(s, 0, sizeof *s);
    char path[4200];
    int rc = 0;
    if (splits) {
        if (!json_is_array(splits) || json_array_size(splits) == 0)
            return ab_fail(AB_EINVAL, "config: '%s.splits' must be a non-empty list of split names", where);
        size_t i;
        json_t *v;
        json_array_foreach(splits, i, v) {
            if (!json_is_string(v)) return ab_fail(AB_EINVAL, "config: '%s.splits.%zu' must be a string", where, i);
            if ((rc = add_split(s, json_string_value(v), where))) return rc;
        }
    } else {
        for (int i = 0; i < 3; i++) {
            path_of(path, sizeof path, dir, DEFAULT_SPLITS[i], suffixes[0]);
            if (is_file(path) && (rc = add_split(s, DEFAULT_SPLITS[i], where))) return rc;
        }
    }
    bool train = false;
    for (int i = 0; i < s->n; i++) train |= strcmp(s->names[i], "train") == 0;
    if (!train) {
        path_of(path, sizeof path, dir, "train", suffixes[0]);
        return ab_fail(AB_EINVAL, "%s: no training split (the file is missing or '%s.splits' leaves out \"train\")",
                       path, where);
    }
    for (int i = 0; i < s->n && !rc; i++) {
        for (int j = 0; j < n_arrays && !rc; j++) {
            path_of(path, sizeof path, dir, s->names[i], suffixes[j]);
            if (!required[j] && !is_file(path)) continue;
            if ((rc = ab_npy_read(path, &s->arrays[i][j]))) break;
            const ab_array *a = &s->arrays[i][j];
            if (a->ndim < 1 || a->shape[0] < 1) {
                rc = ab_fail(AB_EINVAL, "%s: an array of rows needs at least one dimension and one row", path);
                break;
            }
            if (j == 0) s->rows[i] = a->shape[0];
            else if (a->shape[0] != s->rows[i]) {
                char first[4200];
                path_of(first, sizeof first, dir, s->names[i], suffixes[0]);
                rc = ab_fail(AB_EINVAL, "%s: %lld rows, but %s has %lld", path, (long long)a->shape[0], first,
                             s->rows[i]);
            }
        }
    }
    if (rc) npy_splits_free(s);
    return rc;
}

int npy_splits_check_rows(const npy_splits *s, const json_t *rows, const char *where) {
    if (!rows) return 0;
    if (!json_is_object(rows)) return ab_fail(AB_EINVAL, "config: '%s.rows' must be an object of row counts", where);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)rows, k, v) {
        int i = 0;
        while (i < s->n && strcmp(s->names[i], k) != 0) i++;
        if (i == s->n) return ab_fail(AB_EINVAL, "config: '%s.rows.%s': the data has no split '%s'", where, k, k);
        if (!json_is_integer(v) || json_integer_value(v) != s->rows[i])
            return ab_fail(AB_EINVAL,
                           "config: '%s.rows.%s': the config says %s rows, the data has %lld (the data changed "
                           "since the run began?)",
                           where, k, json_is_integer(v) ? "a different number of" : "no number of", s->rows[i]);
    }
    for (int i = 0; i < s->n; i++)
        if (!json_object_get(rows, s->names[i]))
            return ab_fail(AB_EINVAL, "config: '%s.rows' lacks split '%s' of the data", where, s->names[i]);
    return 0;
}

json_t *npy_splits_rows_json(const npy_splits *s) {
    json_t *o = json_object();
    for (int i = 0; i < s->n; i++) json_object_set_new(o, s->names[i], json_integer(s->rows[i]));
    return o;
}

json_t *npy_splits_names_json(const npy_splits *s) {
    json_t *a = json_array();
    for (int i = 0; i < s->n; i++) json_array_append_new(a, json_string(s->names[i]));
    return a;
}

void npy_splits_to_task(const npy_splits *s, train_task *t) {
    t->n_splits = s->n;
    for (int i = 0; i < s->n; i++) {
        t->split_names[i] = s->names[i];
        t->split_rows[i] = s->rows[i];
    }
}
