/* A training array's entries (train_array.h). */
#include "train_array.h"

#include "config.h"
#include "error.h"
#include "fileio.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The config's "array", checked: a non-empty list of objects of JSON values. */
static int array_of(const json_t *root, const char *path, const json_t **arr) {
    *arr = json_object_get(root, "array");
    if (!*arr)
        return ab_fail(AB_EINVAL, "%s: no 'array' (a training array: a list of objects of dotted-key overrides)",
                       path);
    if (!json_is_array(*arr) || json_array_size(*arr) == 0)
        return ab_fail(AB_EINVAL, "%s: 'array' must be a non-empty list of objects of dotted-key overrides", path);
    size_t i;
    json_t *e;
    json_array_foreach(*arr, i, e) {
        if (!json_is_object(e)) return ab_fail(AB_EINVAL, "%s: 'array.%zu' must be an object", path, i);
        const char *k;
        json_t *v;
        json_object_foreach(e, k, v) if (!*k || strcmp(k, "array") == 0 || strchr(k, '='))
            return ab_fail(AB_EINVAL, "%s: 'array.%zu': '%s' is not a key to override", path, i, k);
    }
    return 0;
}

int train_array_count(const char *config_path, int *count) {
    *count = 0;
    if (!config_path) return ab_fail(AB_EINVAL, "train: --array-count needs a CONFIG.json");
    json_t *root = ab_config_load(config_path);
    if (!root) return AB_EINVAL;
    const json_t *arr;
    int rc = array_of(root, config_path, &arr);
    if (!rc) *count = (int)json_array_size(arr);
    json_decref(root);
    return rc;
}

void train_array_free(train_array_task *t) {
    json_decref(t->config);
    for (int i = 0; i < t->n_sets; i++) free(t->sets[i]);
    free(t->sets);
    memset(t, 0, sizeof *t);
}

/* The folder's marker against this task: 0 when it is this entry's or there is none
 * (then written). */
static int check_marker(train_array_task *t, int index, const json_t *entry) {
    char path[4200], ckpt[4200], doc[4200];
    snprintf(path, sizeof path, "%s/array.json", t->dir);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.bin", t->dir);
    snprintf(doc, sizeof doc, "%s/train.json", t->dir);
    struct stat st;
    if (stat(path, &st) == 0) {
        json_t *m = json_load_file(path, JSON_REJECT_DUPLICATES, NULL);
        json_t *mi = json_object_get(m, "index");
        int rc = 0;
        if (!json_is_integer(mi))
            rc = ab_fail(AB_EINVAL, "%s: not an array task's marker (damaged?)", path);
        else if (json_integer_value(mi) != index)
            rc = ab_fail(AB_EINVAL, "%s holds array task %lld's run, not task %d's", t->dir,
                         (long long)json_integer_value(mi), index);
        else if (!json_equal(json_object_get(m, "set"), entry))
            rc = ab_fail(AB_EINVAL, "%s holds array task %d's run with other overrides (the config's 'array.%d' "
                                    "changed)", t->dir, index, index);
        json_decref(m);
        return rc;
    }
    if (stat(ckpt, &st) == 0 || stat(doc, &st) == 0)
        return ab_fail(AB_EINVAL, "%s holds a run that is not array task %d's (no array.json)", t->dir, index);
    int rc = ab_mkdir_p(t->dir);
    if (rc) return rc;
    json_t *m = json_pack("{s:i, s:i, s:O}", "index", index, "count", t->count, "set", entry);
    ab_atomic_file af;
    if (!m) return ab_fail(AB_ENOMEM, "out of memory");
    if ((rc = ab_atomic_open(&af, path))) {
        json_decref(m);
        return rc;
    }
    if (json_dumpf(m, af.f, JSON_INDENT(1) | JSON_PRESERVE_ORDER) != 0) {
        ab_atomic_abort(&af);
        json_decref(m);
        return ab_fail(AB_ESYSTEM, "cannot write %s", path);
    }
    fputc('\n', af.f);
    json_decref(m);
    return ab_atomic_commit(&af);
}

int train_array_prepare(const char *config_path, int index, const char *out_dir, train_array_task *t) {
    memset(t, 0, sizeof *t);
    if (!config_path) return ab_fail(AB_EINVAL, "train: --array-index needs the CONFIG.json that holds the array");
    json_t *root = ab_config_load(config_path);
    if (!root) return AB_EINVAL;
    const json_t *arr;
    int rc = array_of(root, config_path, &arr);
    const char *name = NULL;
    if (!rc) rc = ab_config_file_name(root, "", "name", true, NULL, &name);
    if (!rc) t->count = (int)json_array_size(arr);
    if (!rc && (index < 0 || index >= t->count))
        rc = ab_fail(AB_EINVAL, "train: --array-index %d: %s's array has entries 0..%d", index, config_path,
                     t->count - 1);
    const json_t *entry = rc ? NULL : json_array_get(arr, (size_t)index);
    if (!rc) {
        int w = out_dir ? snprintf(t->dir, sizeof t->dir, "%s/array-%d", out_dir, index)
                        : snprintf(t->dir, sizeof t->dir, "results/%s/array-%d", name, index);
        if (w < 0 || (size_t)w >= sizeof t->dir) rc = ab_fail(AB_EINVAL, "train: --out: the path is too long");
    }
    if (!rc) {
        t->sets = calloc(json_object_size(entry) + 1, sizeof *t->sets);
        if (!t->sets) rc = ab_fail(AB_ENOMEM, "out of memory");
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)entry, k, v) {
            if (rc) break;
            char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            size_t n = text ? strlen(k) + strlen(text) + 2 : 0;
            char *kv = text ? malloc(n) : NULL;
            if (!kv) rc = ab_fail(AB_ENOMEM, "out of memory");
            else snprintf(kv, n, "%s=%s", k, text);
            free(text);
            if (kv) t->sets[t->n_sets++] = kv;
        }
    }
    if (!rc) rc = check_marker(t, index, entry);
    if (!rc) {
        t->config = root;
        json_object_del(t->config, "array");
        return 0;
    }
    json_decref(root);
    train_array_free(t);
    return rc;
}
