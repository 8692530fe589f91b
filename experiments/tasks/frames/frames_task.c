/* The "frames" dataset task (frames_task.h). */
#include "frames_task.h"

#include "config.h"
#include "ctc.h"
#include "error.h"
#include "npy_splits.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { ARR_FRAMES = 0, ARR_LABELS = 1, ARR_LENGTHS = 2 };

typedef struct {
    npy_splits s;
    char *path;
    int classes, N, F;
    bool classes_given, causal;
    bool ctc;          /* targets "ctc": SPLIT.labels.npy holds label sequences */
    int S, max_labels; /* ctc: label slots in the file, the most labels of a row */
} frames_state;

/* A row's frames: its length, or N. */
static int row_frames(const ab_array *len, long long index, int N) {
    return len->count ? (int)npy_int_at(len, (size_t)index) : N;
}

static void frames_fill(const train_task *t, int split, long long index, int *tokens, float *frames, int *targets,
                        float *weights, int *length) {
    (void)tokens;
    const frames_state *st = t->priv;
    const ab_array *x = &st->s.arrays[split][ARR_FRAMES], *lab = &st->s.arrays[split][ARR_LABELS],
                   *len = &st->s.arrays[split][ARR_LENGTHS];
    const int N = st->N, n = row_frames(len, index, N);
    const size_t nf = (size_t)N * (size_t)st->F;
    memcpy(frames, (const float *)x->data + (size_t)index * nf, sizeof(float) * nf);
    *length = n;
    if (st->ctc) { /* the labels are a sequence (frames_fill_labels): no per-frame targets */
        memset(targets, 0, sizeof(int) * (size_t)N);
        memset(weights, 0, sizeof(float) * (size_t)N);
        return;
    }
    for (int i = 0; i < N; i++) {
        long long y = npy_int_at(lab, (size_t)index * (size_t)N + (size_t)i);
        bool scored = i < n && y >= 0;
        targets[i] = scored ? (int)y : 0;
        weights[i] = scored ? 1.0f : 0.0f;
    }
}

/* targets "ctc": the row's labels before its first -1 */
static void frames_fill_labels(const train_task *t, int split, long long index, int *labels, int *count) {
    const frames_state *st = t->priv;
    const ab_array *lab = &st->s.arrays[split][ARR_LABELS];
    int n = 0;
    for (int j = 0; j < st->S; j++) {
        long long y = npy_int_at(lab, (size_t)index * (size_t)st->S + (size_t)j);
        if (y < 0) break;
        labels[n++] = (int)y;
    }
    *count = n;
}

static json_t *frames_to_json(const train_task *t) {
    const frames_state *st = t->priv;
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string("frames"));
    json_object_set_new(o, "path", json_string(st->path));
    json_object_set_new(o, "classes", json_integer(st->classes));
    json_object_set_new(o, "causal", json_boolean(st->causal));
    json_object_set_new(o, "targets", json_string(st->ctc ? "ctc" : "frames"));
    json_object_set_new(o, "splits", npy_splits_names_json(&st->s));
    json_object_set_new(o, "rows", npy_splits_rows_json(&st->s));
    return o;
}

static void frames_destroy(train_task *t) {
    if (!t) return;
    frames_state *st = t->priv;
    if (st) {
        npy_splits_free(&st->s);
        free(st->path);
    }
    free(st);
    free(t);
}

static const char *const frames_keys[] = {"name", "path", "classes", "causal", "targets", "splits", "rows", NULL};

/* targets "ctc": labels (rows, S) integers in [-1, classes), each row's sequence its
 * entries before the first -1 and nothing but -1 after it, aligned to the row's frames
 * (count + repeats <= frames). Sets S and max_labels; *maxlab: the largest label. */
static int check_sequences(frames_state *st, const char *dir, int i, long long *maxlab) {
    const char *sp = st->s.names[i];
    const ab_array *lab = &st->s.arrays[i][ARR_LABELS], *len = &st->s.arrays[i][ARR_LENGTHS];
    if (lab->dtype == AB_F32 || lab->ndim != 2 || lab->shape[1] < 1 || lab->shape[1] > (1 << 24))
        return ab_fail(AB_EINVAL, "%s/%s.labels.npy: expected integer label sequences of shape (rows, S), padded with -1",
                       dir, sp);
    if (st->S && lab->shape[1] != st->S)
        return ab_fail(AB_EINVAL, "%s/%s.labels.npy: %lld label slots per row, but %s.labels.npy has %d", dir, sp,
                       (long long)lab->shape[1], st->s.names[0], st->S);
    st->S = (int)lab->shape[1];
    int seq[64], *buf = seq;
    if (st->S > 64 && !(buf = malloc(sizeof(int) * (size_t)st->S))) return ab_fail(AB_ENOMEM, "out of memory");
    int rc = 0;
    for (long long r = 0; r < st->s.rows[i] && !rc; r++) {
        int n = 0;
        for (int j = 0; j < st->S && !rc; j++) {
            const long long y = npy_int_at(lab, (size_t)r * (size_t)st->S + (size_t)j);
            if (y < -1 || (st->classes_given && y >= st->classes) || y >= (1 << 24))
                rc = ab_fail(AB_EINVAL, "%s/%s.labels.npy: label %lld at row %lld, slot %d is outside [-1, %s)", dir, sp, y,
                             r, j, st->classes_given ? "classes" : "2^24");
            else if (y >= 0 && n < j)
                rc = ab_fail(AB_EINVAL,
                             "%s/%s.labels.npy: label %lld at row %lld, slot %d follows the row's end (-1 at slot %d): "
                             "a sequence is padded with -1 at its end only",
                             dir, sp, y, r, j, n);
            else if (y >= 0) {
                buf[n++] = (int)y;
                if (y > *maxlab) *maxlab = y;
            }
        }
        const int T = row_frames(len, r, st->N), need = ctc_min_frames(buf, n);
        if (!rc && need > T)
            rc = ab_fail(AB_EINVAL,
                         "%s/%s.labels.npy: row %lld has %d labels with %d adjacent repeats, which need at least %d "
                         "frames; the row has %d",
                         dir, sp, r, n, need - n, need, T);
        if (n > st->max_labels) st->max_labels = n;
    }
    if (buf != seq) free(buf);
    return rc;
}

/* frames (rows, N, F) float32 and finite; labels (rows, N) integers in [-1, classes)
 * (or label sequences: check_sequences); lengths (rows) in [1, N]; N and F the same in
 * every split. */
static int check_data(frames_state *st, const char *dir) {
    long long maxlab = -1;
    st->N = st->F = 0;
    for (int i = 0; i < st->s.n; i++) {
        const char *sp = st->s.names[i];
        const ab_array *x = &st->s.arrays[i][ARR_FRAMES], *lab = &st->s.arrays[i][ARR_LABELS],
                       *len = &st->s.arrays[i][ARR_LENGTHS];
        if (x->dtype != AB_F32 || x->ndim != 3 || x->shape[1] < 1 || x->shape[2] < 1)
            return ab_fail(AB_EINVAL, "%s/%s.frames.npy: expected float32 frames of shape (rows, N, F)", dir, sp);
        if (x->shape[1] > (1 << 24) || x->shape[2] > (1 << 20))
            return ab_fail(AB_EINVAL, "%s/%s.frames.npy: %lld frames of %lld features is too large", dir, sp,
                           (long long)x->shape[1], (long long)x->shape[2]);
        if (st->N && (x->shape[1] != st->N || x->shape[2] != st->F))
            return ab_fail(AB_EINVAL, "%s/%s.frames.npy: rows of %lld x %lld, but %s.frames.npy has %d x %d", dir, sp,
                           (long long)x->shape[1], (long long)x->shape[2], st->s.names[0], st->N, st->F);
        st->N = (int)x->shape[1];
        st->F = (int)x->shape[2];
        const float *f = x->data;
        for (size_t j = 0; j < x->count; j++)
            if (!isfinite(f[j]))
                return ab_fail(AB_EINVAL, "%s/%s.frames.npy: value %zu is not finite", dir, sp, j);
        if (len->count) {
            if (len->dtype == AB_F32 || len->ndim != 1)
                return ab_fail(AB_EINVAL, "%s/%s.lengths.npy: expected integer lengths of shape (rows)", dir, sp);
            for (size_t j = 0; j < len->count; j++) {
                long long n = npy_int_at(len, j);
                if (n < 1 || n > st->N)
                    return ab_fail(AB_EINVAL, "%s/%s.lengths.npy: length %lld of row %zu is outside [1, %d]", dir, sp,
                                   n, j, st->N);
            }
        }
        if (st->ctc) {
            int rc = check_sequences(st, dir, i, &maxlab);
            if (rc) return rc;
            continue;
        }
        if (lab->dtype == AB_F32 || lab->ndim != 2 || lab->shape[1] != st->N)
            return ab_fail(AB_EINVAL, "%s/%s.labels.npy: expected integer labels of shape (rows, %d)", dir, sp, st->N);
        for (size_t j = 0; j < lab->count; j++) {
            long long y = npy_int_at(lab, j);
            if (y < -1 || (st->classes_given && y >= st->classes) || y >= (1 << 24))
                return ab_fail(AB_EINVAL, "%s/%s.labels.npy: label %lld at row %zu, frame %zu is outside [-1, %s)", dir,
                               sp, y, j / (size_t)st->N, j % (size_t)st->N, st->classes_given ? "classes" : "2^24");
            if (y > maxlab) maxlab = y;
        }
    }
    if (!st->classes_given) {
        if (maxlab < 0)
            return ab_fail(AB_EINVAL, "%s: no %s has a label (every label is -1)", dir, st->ctc ? "row" : "frame");
        st->classes = (int)maxlab + 1;
    }
    if (st->ctc && st->max_labels < 1) return ab_fail(AB_EINVAL, "%s: no row has a label (every label is -1)", dir);
    return 0;
}

static int frames_create(const json_t *obj, train_task **out) {
    int rc = ab_config_only_keys(obj, "task", frames_keys);
    if (rc) return rc;
    const char *path, *targets;
    long long classes;
    bool causal;
    if ((rc = ab_config_str(obj, "task", "path", true, NULL, &path))) return rc;
    if ((rc = ab_config_int(obj, "task", "classes", false, 0, 0, 1 << 24, &classes))) return rc;
    if ((rc = ab_config_bool(obj, "task", "causal", false, false, &causal))) return rc;
    if ((rc = ab_config_str(obj, "task", "targets", false, "frames", &targets))) return rc;
    if (strcmp(targets, "frames") != 0 && strcmp(targets, "ctc") != 0)
        return ab_fail(AB_EINVAL, "config: 'task.targets' = '%s' is not a kind of targets (frames: a class per frame; "
                                  "ctc: a label sequence per row)",
                       targets);
    train_task *t = calloc(1, sizeof *t);
    frames_state *st = calloc(1, sizeof *st);
    if (!t || !st || !(st->path = strdup(path))) {
        free(t);
        free(st);
        return ab_fail(AB_ENOMEM, "out of memory for the frames task");
    }
    t->priv = st;
    t->destroy = frames_destroy;
    st->classes = (int)classes;
    st->classes_given = classes > 0;
    st->causal = causal;
    st->ctc = strcmp(targets, "ctc") == 0;
    static const char *const suffixes[] = {"frames", "labels", "lengths"};
    static const bool required[] = {true, true, false};
    if ((rc = npy_splits_load(path, json_object_get(obj, "splits"), suffixes, required, 3, "task", &st->s)) ||
        (rc = check_data(st, path)) || (rc = npy_splits_check_rows(&st->s, json_object_get(obj, "rows"), "task"))) {
        frames_destroy(t);
        return rc;
    }
    t->name = "frames";
    t->input = TASK_INPUT_FRAMES;
    t->features = st->F;
    t->seq_len = st->N;
    t->causal = causal;
    t->head = st->ctc ? "ctc" : "categorical";
    t->classes = st->classes;
    t->n_metrics = 1;
    t->metrics[0] = st->ctc ? (task_metric){"per", TASK_METRIC_PER, NULL, NULL, false}
                            : (task_metric){"accuracy", TASK_METRIC_ACCURACY, NULL, NULL, false};
    if (st->ctc) {
        t->max_labels = st->max_labels;
        t->fill_labels = frames_fill_labels;
    }
    npy_splits_to_task(&st->s, t);
    t->fill = frames_fill;
    t->to_json = frames_to_json;
    *out = t;
    return 0;
}

const task_kind frames_task_kind = {
    "frames",
    "float feature sequences from .npy files with splits (SPLIT.frames.npy, SPLIT.labels.npy): a class per frame, "
    "or (targets ctc) a label sequence per row scored by CTC",
    frames_keys,
    frames_create,
};
