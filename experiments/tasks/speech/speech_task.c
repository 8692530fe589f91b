/* The "speech" dataset task (speech_task.h). */
#include "speech_task.h"

#include "config.h"
#include "ctc.h"
#include "error.h"
#include "npy_splits.h"
#include "speech_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

enum { MAX_STACK = 64, MAX_POSITIONS = 1 << 24 };

static const char *const SPLITS[] = {"train", "valid", "test"};
#define N_SPLITS 3

typedef struct {
    sd_data data[TASK_MAX_SPLITS];  /* per split of s, in its order */
    npy_splits s;                   /* split names and rows only (no arrays) */
    char *path;                     /* the `path` option, or NULL with `dirs` */
    json_t *dirs;                   /* the `dirs` option as given (owned), or NULL */
    json_t *features;               /* the canonical feature options (owned) */
    char *cache;                    /* the cache folder, or NULL */
    int stack, subsample, max_frames_opt;
    int freq_masks, freq_width, time_masks, time_width; /* the `augment` option (speech_task.h) */
    int dim, N;                     /* filterbank dimensions D; model positions */
    uint32_t crc[TASK_MAX_SPLITS];
} speech_state;

/* The model positions of T frames: ceil(T / subsample). */
static int positions(const speech_state *st, int T) { return (T + st->subsample - 1) / st->subsample; }

static void speech_fill(const train_task *t, int split, long long index, int *tokens, float *frames, int *targets,
                        float *weights, int *length) {
    (void)tokens;
    const speech_state *st = t->priv;
    const sd_utt *u = &st->data[split].utts[index];
    const int D = st->dim, k = st->stack, s = st->subsample, T = u->frames, n = positions(st, T), N = st->N;
    const size_t F = (size_t)k * (size_t)D;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < k; i++) {
            int src = j * s + i;
            if (src > T - 1) src = T - 1; /* past the end: the last frame again */
            memcpy(frames + (size_t)j * F + (size_t)i * D, u->feats + (size_t)src * D, sizeof(float) * (size_t)D);
        }
    memset(frames + (size_t)n * F, 0, sizeof(float) * F * (size_t)(N - n));
    /* the labels are a sequence (speech_fill_labels): no per-position targets */
    memset(targets, 0, sizeof(int) * (size_t)N);
    memset(weights, 0, sizeof(float) * (size_t)N);
    *length = n;
}

/* SpecAugment-style masking of training row r (speech_task.h, `augment`): bands of
 * filterbank channels and spans of model positions set to 0, the features' mean after
 * CMVN. Draws, in this order: per frequency mask its width f = uniform{0..freq_width}
 * and first channel uniform{0..D-f}; per time mask its width w = uniform{0..min(
 * time_width, n)} and first position uniform{0..n-w} (n the row's positions). */
static void speech_augment(const train_task *t, ab_rng *rng, task_batch *b, int r) {
    const speech_state *st = t->priv;
    const int D = st->dim, k = st->stack, n = b->lengths[r];
    const size_t F = (size_t)k * (size_t)D;
    float *x = b->frames + (size_t)r * (size_t)b->N * F;
    for (int m = 0; m < st->freq_masks; m++) {
        const int f = (int)ab_rng_next_below(rng, (uint32_t)st->freq_width + 1);
        const int f0 = (int)ab_rng_next_below(rng, (uint32_t)(D - f) + 1);
        for (int j = 0; j < n; j++)
            for (int i = 0; i < k; i++) memset(x + (size_t)j * F + (size_t)i * D + f0, 0, sizeof(float) * (size_t)f);
    }
    for (int m = 0; m < st->time_masks; m++) {
        const int wmax = st->time_width < n ? st->time_width : n;
        const int w = (int)ab_rng_next_below(rng, (uint32_t)wmax + 1);
        const int t0 = (int)ab_rng_next_below(rng, (uint32_t)(n - w) + 1);
        memset(x + (size_t)t0 * F, 0, sizeof(float) * F * (size_t)w);
    }
}

static void speech_fill_labels(const train_task *t, int split, long long index, int *labels, int *count) {
    const speech_state *st = t->priv;
    const sd_utt *u = &st->data[split].utts[index];
    /* an utterance with an empty transcript has no phones (and may have no array):
     * memcpy from a null pointer is undefined even for 0 bytes */
    if (u->n_phones > 0) memcpy(labels, u->phones, sizeof(int) * (size_t)u->n_phones);
    *count = u->n_phones;
}

static const char *speech_row_name(const train_task *t, int split, long long index) {
    const speech_state *st = t->priv;
    return st->data[split].utts[index].id;
}

static const char *speech_label_name(const train_task *t, int label) {
    const speech_state *st = t->priv;
    return st->data[0].phones.names[label];
}

static json_t *speech_to_json(const train_task *t) {
    const speech_state *st = t->priv;
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string("speech"));
    if (st->path) json_object_set_new(o, "path", json_string(st->path));
    else json_object_set_new(o, "dirs", json_deep_copy(st->dirs));
    json_object_set_new(o, "features", json_deep_copy(st->features));
    json_object_set_new(o, "cache", st->cache ? json_string(st->cache) : json_null());
    json_object_set_new(o, "stack", json_integer(st->stack));
    json_object_set_new(o, "subsample", json_integer(st->subsample));
    json_object_set_new(o, "max_frames", json_integer(st->max_frames_opt));
    if (st->freq_masks || st->time_masks) /* absent when off: earlier runs' task options stay as they were */
        json_object_set_new(o, "augment",
                            json_pack("{s:i, s:i, s:i, s:i}", "freq_masks", st->freq_masks, "freq_width",
                                      st->freq_width, "time_masks", st->time_masks, "time_width", st->time_width));
    json_object_set_new(o, "rows", npy_splits_rows_json(&st->s));
    json_t *crc = json_object();
    for (int i = 0; i < st->s.n; i++) json_object_set_new(crc, st->s.names[i], json_integer(st->crc[i]));
    json_object_set_new(o, "crc32", crc);
    return o;
}

static void speech_destroy(train_task *t) {
    if (!t) return;
    speech_state *st = t->priv;
    if (st) {
        for (int i = 0; i < TASK_MAX_SPLITS; i++) sd_data_free(&st->data[i]);
        free(st->path);
        free(st->cache);
        json_decref(st->dirs);
        json_decref(st->features);
    }
    free(st);
    free(t);
}

static const char *const speech_keys[] = {"name",      "path",       "dirs", "features", "cache",   "stack",
                                          "subsample", "max_frames", "rows", "crc32",    "augment", NULL};

/* The `augment` option: {"freq_masks", "freq_width", "time_masks", "time_width"},
 * each 0 when left out; a width of 0 with masks, or masks of no width, is refused. */
static int parse_augment(const json_t *obj, speech_state *st) {
    const json_t *a = json_object_get(obj, "augment");
    if (!a || json_is_null(a)) return 0;
    if (!json_is_object(a))
        return ab_fail(AB_EINVAL, "config: 'task.augment' must be an object of freq_masks, freq_width, "
                                  "time_masks, time_width");
    static const char *const keys[] = {"freq_masks", "freq_width", "time_masks", "time_width", NULL};
    long long v[4];
    int rc = ab_config_only_keys(a, "task.augment", keys);
    for (int i = 0; !rc && i < 4; i++) rc = ab_config_int(a, "task.augment", keys[i], false, 0, 0, 1 << 20, &v[i]);
    if (rc) return rc;
    for (int i = 0; i < 4; i += 2)
        if ((v[i] > 0) != (v[i + 1] > 0))
            return ab_fail(AB_EINVAL, "config: 'task.augment': %s = %lld with %s = %lld: give both or neither", keys[i],
                           v[i], keys[i + 1], v[i + 1]);
    if (v[0] > 64 || v[2] > 64)
        return ab_fail(AB_EINVAL, "config: 'task.augment': at most 64 masks of each kind");
    st->freq_masks = (int)v[0];
    st->freq_width = (int)v[1];
    st->time_masks = (int)v[2];
    st->time_width = (int)v[3];
    return 0;
}

static bool is_dir(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISDIR(s.st_mode);
}

/* An entry of that name is there: a file, or what is then refused when it is read (a
 * folder, a symbolic link that leads nowhere), never taken for absent. */
static bool has_entry(const char *p) {
    struct stat s;
    return lstat(p, &s) == 0;
}

/* The CRC-32 of a split: every utterance's features and phone ids (and for the
 * training split, the inventory's names): what a resumed run must find again. */
static uint32_t data_crc(const sd_data *d, bool inventory) {
    uLong c = crc32(0L, Z_NULL, 0);
    for (int i = 0; i < d->n; i++) {
        const sd_utt *u = &d->utts[i];
        const unsigned char *p = (const unsigned char *)u->feats;
        size_t n = sizeof(float) * (size_t)u->frames * (size_t)d->dim;
        while (n) { /* crc32 takes a uInt length */
            uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
            c = crc32(c, p, k);
            p += k;
            n -= k;
        }
        if (u->n_phones) c = crc32(c, (const Bytef *)u->phones, (uInt)(sizeof(int) * (size_t)u->n_phones));
    }
    for (int i = 0; inventory && i < d->phones.count; i++)
        c = crc32(c, (const Bytef *)d->phones.names[i], (uInt)strlen(d->phones.names[i]) + 1);
    return (uint32_t)c;
}

/* The "crc32" option of a canonical config against the data. */
static int check_crc(const json_t *crc, const speech_state *st) {
    if (!crc) return 0;
    if (!json_is_object(crc))
        return ab_fail(AB_EINVAL, "config: 'task.crc32' must be an object of CRC-32 values per split");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)crc, k, v) {
        int i = -1;
        for (int j = 0; j < st->s.n; j++)
            if (strcmp(st->s.names[j], k) == 0) i = j;
        if (i < 0) return ab_fail(AB_EINVAL, "config: 'task.crc32.%s': the task has no split '%s'", k, k);
        if (!json_is_integer(v) || json_integer_value(v) != (json_int_t)st->crc[i])
            return ab_fail(AB_EINVAL,
                           "config: 'task.crc32.%s': the config says %s, the %s split's features and phones have "
                           "CRC-32 %lu (the data or the feature options changed since the run began?)",
                           k, json_is_integer(v) ? "another CRC-32" : "no number", k, (unsigned long)st->crc[i]);
    }
    for (int i = 0; i < st->s.n; i++)
        if (!json_object_get(crc, st->s.names[i]))
            return ab_fail(AB_EINVAL, "config: 'task.crc32' lacks the split '%s'", st->s.names[i]);
    return 0;
}

/* Each utterance of split i against the model's positions: no longer than N (when
 * max_frames is given), its phones aligned to its positions. Sets *longest and
 * *most (the most phones of an utterance). */
static int check_rows(speech_state *st, int i, int *longest, int *most) {
    const sd_data *d = &st->data[i];
    for (int r = 0; r < d->n; r++) {
        const sd_utt *u = &d->utts[r];
        const int n = positions(st, u->frames);
        if (st->max_frames_opt && n > st->max_frames_opt)
            return ab_fail(AB_EINVAL,
                           "%s split: utterance %s has %d frames, %d positions at subsample %d: more than "
                           "'task.max_frames' = %d (nothing is truncated: raise max_frames or subsample)",
                           st->s.names[i], u->id, u->frames, n, st->subsample, st->max_frames_opt);
        const int need = ctc_min_frames(u->phones, u->n_phones);
        if (need > n)
            return ab_fail(AB_EINVAL,
                           "%s split: utterance %s has %d phones with %d adjacent repeats, which need at least %d "
                           "positions; its %d frames give %d at subsample %d (a smaller 'task.subsample' fits them)",
                           st->s.names[i], u->id, u->n_phones, need - u->n_phones, need, u->frames, n, st->subsample);
        if (n > *longest) *longest = n;
        if (u->n_phones > *most) *most = u->n_phones;
    }
    return 0;
}

/* The directory of split `name` (a path into buf, or NULL when the split is absent). */
static const char *split_dir(const speech_state *st, const char *name, char *buf, size_t cap) {
    if (st->path) {
        snprintf(buf, cap, "%s/%s", st->path, name);
        return is_dir(buf) ? buf : NULL;
    }
    return json_string_value(json_object_get(st->dirs, name));
}

/* Reads `path` or `dirs`: exactly one, the directories there. */
static int parse_source(const json_t *obj, speech_state *st) {
    json_t *path = json_object_get(obj, "path"), *dirs = json_object_get(obj, "dirs");
    if (!path == !dirs)
        return ab_fail(AB_EINVAL, "config: the speech task needs exactly one of 'task.path' (a folder with train/, "
                                  "valid/, test/) and 'task.dirs' (split -> data directory)");
    if (path) {
        const char *p;
        int rc = ab_config_str(obj, "task", "path", true, NULL, &p);
        if (rc) return rc;
        if (!is_dir(p))
            return ab_fail(AB_EINVAL, "config: 'task.path' = '%s' is not a folder (experiments/speech/get-data.sh "
                                      "makes data/speech/festvox-ru)",
                           p);
        if (!(st->path = strdup(p))) return ab_fail(AB_ENOMEM, "out of memory");
        char buf[4200];
        snprintf(buf, sizeof buf, "%s/train", p);
        if (!is_dir(buf))
            return ab_fail(AB_EINVAL, "config: 'task.path': %s is not a folder (the training split's data directory)",
                           buf);
        return 0;
    }
    if (!json_is_object(dirs))
        return ab_fail(AB_EINVAL, "config: 'task.dirs' must be an object of data directories (train, valid, test)");
    const char *k;
    json_t *v;
    json_object_foreach(dirs, k, v) {
        bool known = false;
        for (int i = 0; i < N_SPLITS; i++) known |= strcmp(k, SPLITS[i]) == 0;
        if (!known) return ab_fail(AB_EINVAL, "config: 'task.dirs.%s': not a split of the speech task (train, valid, test)", k);
        if (!json_is_string(v) || !is_dir(json_string_value(v)))
            return ab_fail(AB_EINVAL, "config: 'task.dirs.%s' must name a data directory (%s is not a folder)", k,
                           json_is_string(v) ? json_string_value(v) : "the value");
    }
    if (!json_object_get(dirs, "train")) return ab_fail(AB_EINVAL, "config: 'task.dirs' lacks 'train'");
    st->dirs = json_deep_copy(dirs);
    return st->dirs ? 0 : ab_fail(AB_ENOMEM, "out of memory");
}

/* Loads every split present, train first (its inventory for the others). */
static int load_splits(const json_t *obj, speech_state *st) {
    sd_options o;
    sd_options_default(&o);
    json_t *fo = json_object_get(obj, "features");
    int rc;
    if (fo) {
        if (json_is_object(fo) && json_object_get(fo, "cache"))
            return ab_fail(AB_EINVAL, "config: 'task.features.cache': give the speech task's cache as 'task.cache' (a "
                                      "folder: a cache per split)");
        if ((rc = sd_options_from_json(&o, fo, "task.features"))) return rc;
    }
    char phones[4200];
    if (st->path && !o.phones) { /* the corpus's inventory, when it declares one */
        snprintf(phones, sizeof phones, "%s/phones.txt", st->path);
        if (has_entry(phones)) o.phones = phones;
    }
    if (!(st->features = sd_options_to_json(&o))) return ab_fail(AB_ENOMEM, "out of memory");
    json_object_del(st->features, "cache");
    for (int i = 0; i < N_SPLITS; i++) {
        char buf[4200], cache[4200];
        const char *dir = split_dir(st, SPLITS[i], buf, sizeof buf);
        if (!dir) continue;
        if (st->cache) {
            snprintf(cache, sizeof cache, "%s/%s", st->cache, SPLITS[i]);
            o.cache = cache;
        }
        const int j = st->s.n;
        if ((rc = sd_load(dir, &o, j ? &st->data[0].phones : NULL, &st->data[j]))) return rc;
        if (j && st->data[j].dim != st->data[0].dim)
            return ab_fail(AB_EINVAL, "%s: features of %d dimensions, but the training split's have %d", dir,
                           st->data[j].dim, st->data[0].dim);
        if (st->data[j].n < 1) return ab_fail(AB_EINVAL, "%s: the data directory has no utterance", dir);
        snprintf(st->s.names[j], sizeof st->s.names[j], "%s", SPLITS[i]);
        st->s.rows[j] = st->data[j].n;
        st->crc[j] = data_crc(&st->data[j], j == 0);
        st->s.n++;
    }
    st->dim = st->data[0].dim;
    if (st->data[0].phones.count < 1) return ab_fail(AB_EINVAL, "the training split has no phones");
    return 0;
}

static int speech_create(const json_t *obj, train_task **out) {
    int rc = ab_config_only_keys(obj, "task", speech_keys);
    if (rc) return rc;
    long long stack, subsample, max_frames;
    if ((rc = ab_config_int(obj, "task", "stack", false, 1, 1, MAX_STACK, &stack)) ||
        (rc = ab_config_int(obj, "task", "subsample", false, 1, 1, MAX_STACK, &subsample)) ||
        (rc = ab_config_int(obj, "task", "max_frames", false, 0, 0, MAX_POSITIONS, &max_frames)))
        return rc;
    json_t *cache = json_object_get(obj, "cache");
    if (cache && !json_is_null(cache) && (!json_is_string(cache) || !*json_string_value(cache)))
        return ab_fail(AB_EINVAL, "config: 'task.cache' must be a folder's path (or null: no cache)");
    train_task *t = calloc(1, sizeof *t);
    speech_state *st = calloc(1, sizeof *st);
    if (!t || !st) {
        free(t);
        free(st);
        return ab_fail(AB_ENOMEM, "out of memory for the speech task");
    }
    t->priv = st;
    t->destroy = speech_destroy;
    st->stack = (int)stack;
    st->subsample = (int)subsample;
    st->max_frames_opt = (int)max_frames;
    if ((rc = parse_augment(obj, st)) || (rc = parse_source(obj, st))) goto fail;
    if (cache && json_is_string(cache)) {
        const char *c = json_string_value(cache);
        if (!(st->cache = strdup(c))) {
            rc = ab_fail(AB_ENOMEM, "out of memory");
            goto fail;
        }
        if (!is_dir(c) && mkdir(c, 0777) != 0 && !is_dir(c)) {
            rc = ab_fail(AB_EINVAL, "config: 'task.cache': cannot make the folder %s", c);
            goto fail;
        }
    }
    if ((rc = load_splits(obj, st))) goto fail;
    int longest = 1, most = 0;
    for (int i = 0; i < st->s.n; i++)
        if ((rc = check_rows(st, i, &longest, &most))) goto fail;
    st->N = st->max_frames_opt ? st->max_frames_opt : longest;
    if ((long long)st->stack * st->dim > (1 << 20)) {
        rc = ab_fail(AB_EINVAL, "config: 'task.stack' = %d frames of %d features is too wide", st->stack, st->dim);
        goto fail;
    }
    if (st->freq_width > st->dim) {
        rc = ab_fail(AB_EINVAL, "config: 'task.augment': freq_width %d is wider than the %d filterbank channels",
                     st->freq_width, st->dim);
        goto fail;
    }
    if (most < 1) {
        rc = ab_fail(AB_EINVAL, "the speech data has no phone in any utterance (every transcript is empty)");
        goto fail;
    }
    if ((rc = npy_splits_check_rows(&st->s, json_object_get(obj, "rows"), "task")) ||
        (rc = check_crc(json_object_get(obj, "crc32"), st)))
        goto fail;

    t->name = "speech";
    t->input = TASK_INPUT_FRAMES;
    t->features = st->stack * st->dim;
    t->seq_len = st->N;
    t->causal = false;
    t->head = "ctc";
    t->classes = st->data[0].phones.count;
    t->max_labels = most;
    t->pad_to_longest = true;
    t->n_metrics = 1;
    t->metrics[0] = (task_metric){"per", TASK_METRIC_PER, NULL, NULL, false};
    npy_splits_to_task(&st->s, t);
    t->fill = speech_fill;
    t->fill_labels = speech_fill_labels;
    if (st->freq_masks || st->time_masks) t->augment = speech_augment;
    t->row_name = speech_row_name;
    t->label_name = speech_label_name;
    t->to_json = speech_to_json;
    *out = t;
    return 0;
fail:
    speech_destroy(t);
    return rc;
}

const task_kind speech_task_kind = {
    "speech",
    "phone recognition with CTC from Kaldi data directories (log-mel filterbanks or feats.scp; per)",
    speech_keys,
    speech_create,
};
