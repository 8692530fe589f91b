/* The "images" dataset task (images_task.h). */
#include "images_task.h"

#include "config.h"
#include "error.h"
#include "image_data.h"
#include "npy_splits.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { START = 256, VALUES = 256, IDX_CLASSES = 10, MAX_LEN = 1 << 24 };

static const char *const DATASETS[] = {"mnist", "fashion-mnist", "cifar10", NULL};
static const char *const HEADS[] = {"categorical", "logistic_mixture", NULL};

typedef struct {
    img_set train, test;   /* the training and test files, whole */
    char *path;
    const char *dataset;   /* one of DATASETS */
    const char *head;      /* one of HEADS */
    int mixtures, L;
    long long valid_rows, train_rows, test_rows; /* the options as given (0: none / all) */
    npy_splits s;          /* split names and rows only (no arrays): rows JSON and check */
    const img_set *set[TASK_MAX_SPLITS];
    long long base[TASK_MAX_SPLITS]; /* the split's first image in its set */
    int test_split;
    uint32_t crc_train, crc_test;
} img_state;

static void img_fill(const train_task *t, int split, long long index, int *tokens, float *frames, int *targets,
                     float *weights, int *length) {
    (void)frames;
    const img_state *st = t->priv;
    const int L = st->L;
    img_raster(st->set[split], st->base[split] + index, targets);
    tokens[0] = START;
    for (int i = 1; i < L; i++) tokens[i] = targets[i - 1];
    for (int i = 0; i < L; i++) weights[i] = 1.0f;
    *length = L;
}

static void img_prompt(const train_task *t, ab_rng *rng, int *prompt, int *P, int *expected, int *G) {
    const img_state *st = t->priv;
    const int sp = st->test_split, L = st->L;
    long long index = (long long)ab_rng_next_below(rng, (uint32_t)t->split_rows[sp]);
    int p = (int)ab_rng_next_below(rng, (uint32_t)L); /* values of the image in the prompt */
    img_raster(st->set[sp], st->base[sp] + index, expected); /* expected holds max_gen = L ints */
    prompt[0] = START;
    for (int i = 0; i < p; i++) prompt[i + 1] = expected[i];
    memmove(expected, expected + p, sizeof(int) * (size_t)(L - p));
    *P = p + 1;
    *G = L - p;
}

static json_t *img_to_json(const train_task *t) {
    const img_state *st = t->priv;
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string("images"));
    json_object_set_new(o, "dataset", json_string(st->dataset));
    json_object_set_new(o, "path", json_string(st->path));
    json_object_set_new(o, "head", json_string(st->head));
    if (st->mixtures) json_object_set_new(o, "mixtures", json_integer(st->mixtures));
    json_object_set_new(o, "valid_rows", json_integer(st->valid_rows));
    json_object_set_new(o, "train_rows", json_integer(st->train_rows));
    json_object_set_new(o, "test_rows", json_integer(st->test_rows));
    json_object_set_new(o, "rows", npy_splits_rows_json(&st->s));
    json_t *crc = json_object();
    json_object_set_new(crc, "train", json_integer(st->crc_train));
    json_object_set_new(crc, "test", json_integer(st->crc_test));
    json_object_set_new(o, "crc32", crc);
    return o;
}

static void img_destroy(train_task *t) {
    if (!t) return;
    img_state *st = t->priv;
    if (st) {
        img_set_free(&st->train);
        img_set_free(&st->test);
        free(st->path);
    }
    free(st);
    free(t);
}

static const char *const img_keys[] = {"name",      "dataset",   "path",       "head", "mixtures", "valid_rows",
                                       "train_rows", "test_rows", "rows",       "crc32", NULL};

static bool is_file(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISREG(s.st_mode);
}

static bool is_dir(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISDIR(s.st_mode);
}

/* DIR/NAME, or DIR/NAME.gz when only that exists; "missing" when neither does. */
static int idx_path(const char *dir, const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%s", dir, name);
    if (is_file(buf)) return 0;
    snprintf(buf, cap, "%s/%s.gz", dir, name);
    if (is_file(buf)) return 0;
    snprintf(buf, cap, "%s/%s", dir, name);
    return ab_fail(AB_EINVAL, "%s: missing (nor %s.gz beside it; experiments/images/get-data.sh puts the data there)",
                   buf, name);
}

static int load_idx(img_state *st, const char *dir) {
    static const char *const names[2][2] = {{"train-images-idx3-ubyte", "train-labels-idx1-ubyte"},
                                            {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}};
    img_set *sets[2] = {&st->train, &st->test};
    char ip[4200], lp[4200];
    for (int i = 0; i < 2; i++) {
        int rc;
        if ((rc = idx_path(dir, names[i][0], ip, sizeof ip)) || (rc = idx_path(dir, names[i][1], lp, sizeof lp)) ||
            (rc = img_read_idx_images(ip, sets[i])) || (rc = img_read_idx_labels(lp, ip, IDX_CLASSES, sets[i])))
            return rc;
    }
    if (st->train.rows != st->test.rows || st->train.cols != st->test.cols)
        return ab_fail(AB_EINVAL, "%s/%s: images of %d x %d pixels, but the training images are %d x %d", dir,
                       names[1][0], st->test.rows, st->test.cols, st->train.rows, st->train.cols);
    return 0;
}

static int load_cifar(img_state *st, const char *dir) {
    char sub[4200], paths[6][4300];
    snprintf(sub, sizeof sub, "%s/data_batch_1.bin", dir);
    const char *d = dir;
    if (!is_file(sub)) { /* the folder the official release unpacks to, inside dir */
        snprintf(sub, sizeof sub, "%s/cifar-10-batches-bin", dir);
        char probe[4300];
        snprintf(probe, sizeof probe, "%s/data_batch_1.bin", sub);
        if (is_file(probe)) d = sub;
    }
    for (int i = 0; i < 5; i++) snprintf(paths[i], sizeof paths[i], "%s/data_batch_%d.bin", d, i + 1);
    snprintf(paths[5], sizeof paths[5], "%s/test_batch.bin", d);
    for (int i = 0; i < 6; i++)
        if (!is_file(paths[i]))
            return ab_fail(AB_EINVAL, "%s: missing (the CIFAR-10 binary release; experiments/images/get-data.sh "
                                      "--cifar10 SOURCE puts it there)",
                           paths[i]);
    const char *tr[5] = {paths[0], paths[1], paths[2], paths[3], paths[4]}, *te[1] = {paths[5]};
    int rc = img_read_cifar(tr, 5, &st->train);
    if (!rc) rc = img_read_cifar(te, 1, &st->test);
    return rc;
}

/* The "crc32" option of a canonical config against the data. */
static int check_crc(const json_t *crc, const img_state *st) {
    if (!crc) return 0;
    if (!json_is_object(crc))
        return ab_fail(AB_EINVAL, "config: 'task.crc32' must be an object of CRC-32 values (\"train\", \"test\")");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)crc, k, v) {
        bool train = strcmp(k, "train") == 0;
        if (!train && strcmp(k, "test") != 0)
            return ab_fail(AB_EINVAL, "config: 'task.crc32.%s': the data has no file '%s' (train, test)", k, k);
        uint32_t have = train ? st->crc_train : st->crc_test;
        if (!json_is_integer(v) || json_integer_value(v) != (json_int_t)have)
            return ab_fail(AB_EINVAL,
                           "config: 'task.crc32.%s': the config says %s, the %s images and labels in %s have CRC-32 "
                           "%lu (the data changed since the run began?)",
                           k, json_is_integer(v) ? "another CRC-32" : "no number", k, st->path, (unsigned long)have);
    }
    if (!json_object_get(crc, "train") || !json_object_get(crc, "test"))
        return ab_fail(AB_EINVAL, "config: 'task.crc32' lacks '%s'", json_object_get(crc, "train") ? "test" : "train");
    return 0;
}

static int find(const char *const *list, const char *name) {
    for (int i = 0; list[i]; i++)
        if (strcmp(list[i], name) == 0) return i;
    return -1;
}

static void add_split(img_state *st, const char *name, const img_set *set, long long base, long long rows) {
    int i = st->s.n++;
    snprintf(st->s.names[i], sizeof st->s.names[i], "%s", name);
    st->s.rows[i] = rows;
    st->set[i] = set;
    st->base[i] = base;
}

static int img_create(const json_t *obj, train_task **out) {
    int rc = ab_config_only_keys(obj, "task", img_keys);
    if (rc) return rc;
    const char *dataset, *path, *head;
    long long mixtures, valid_rows, train_rows, test_rows;
    if ((rc = ab_config_str(obj, "task", "dataset", true, NULL, &dataset))) return rc;
    if (find(DATASETS, dataset) < 0)
        return ab_fail(AB_EINVAL, "config: 'task.dataset' = '%s' is not a data set of the images task (mnist, "
                                  "fashion-mnist, cifar10)",
                       dataset);
    if ((rc = ab_config_str(obj, "task", "path", true, NULL, &path))) return rc;
    if ((rc = ab_config_str(obj, "task", "head", false, "categorical", &head))) return rc;
    if (find(HEADS, head) < 0)
        return ab_fail(AB_EINVAL,
                       "config: 'task.head' = '%s' is not a head of the images task (categorical, logistic_mixture)",
                       head);
    const bool mixture = strcmp(head, "logistic_mixture") == 0;
    if (!mixture && json_object_get(obj, "mixtures"))
        return ab_fail(AB_EINVAL, "config: 'task.mixtures' is for 'task.head' = 'logistic_mixture' (the head is '%s')",
                       head);
    if ((rc = ab_config_int(obj, "task", "mixtures", false, 10, 1, 1024, &mixtures))) return rc;
    if ((rc = ab_config_int(obj, "task", "valid_rows", false, 0, 0, 1LL << 40, &valid_rows)) ||
        (rc = ab_config_int(obj, "task", "train_rows", false, 0, 0, 1LL << 40, &train_rows)) ||
        (rc = ab_config_int(obj, "task", "test_rows", false, 0, 0, 1LL << 40, &test_rows)))
        return rc;
    if (!is_dir(path))
        return ab_fail(AB_EINVAL, "config: 'task.path' = '%s' is not a folder (experiments/images/get-data.sh makes "
                                  "data/%s)",
                       path, dataset);

    train_task *t = calloc(1, sizeof *t);
    img_state *st = calloc(1, sizeof *st);
    if (!t || !st || !(st->path = strdup(path))) {
        free(t);
        free(st);
        return ab_fail(AB_ENOMEM, "out of memory for the images task");
    }
    t->priv = st;
    t->destroy = img_destroy;
    st->dataset = DATASETS[find(DATASETS, dataset)];
    st->head = HEADS[find(HEADS, head)];
    st->mixtures = mixture ? (int)mixtures : 0;
    st->valid_rows = valid_rows;
    st->train_rows = train_rows;
    st->test_rows = test_rows;
    rc = strcmp(dataset, "cifar10") == 0 ? load_cifar(st, path) : load_idx(st, path);
    if (rc) goto fail;
    if (st->train.image_bytes > MAX_LEN) {
        rc = ab_fail(AB_EINVAL, "%s: images of %zu values are longer than the longest sequence (2^24)", path,
                     st->train.image_bytes);
        goto fail;
    }
    st->L = (int)st->train.image_bytes;
    st->crc_train = img_crc32(&st->train);
    st->crc_test = img_crc32(&st->test);

    const long long n_train = st->train.n, n_test = st->test.n;
    if (valid_rows >= n_train) {
        rc = ab_fail(AB_EINVAL, "config: 'task.valid_rows' = %lld leaves no training images (the training file of %s "
                                "holds %lld)",
                     valid_rows, path, n_train);
        goto fail;
    }
    const long long pool = n_train - valid_rows;
    if (train_rows > pool) {
        rc = ab_fail(AB_EINVAL, "config: 'task.train_rows' = %lld is more than the %lld training images of %s%s (0: all)",
                     train_rows, pool, path, valid_rows ? " left after 'valid_rows'" : "");
        goto fail;
    }
    if (test_rows > n_test) {
        rc = ab_fail(AB_EINVAL, "config: 'task.test_rows' = %lld is more than the %lld test images of %s (0: all)",
                     test_rows, n_test, path);
        goto fail;
    }
    add_split(st, "train", &st->train, 0, train_rows ? train_rows : pool);
    if (valid_rows) add_split(st, "valid", &st->train, pool, valid_rows);
    st->test_split = st->s.n;
    add_split(st, "test", &st->test, 0, test_rows ? test_rows : n_test);
    if ((rc = npy_splits_check_rows(&st->s, json_object_get(obj, "rows"), "task")) ||
        (rc = check_crc(json_object_get(obj, "crc32"), st)))
        goto fail;

    t->name = "images";
    t->input = TASK_INPUT_TOKENS;
    t->vocab = VALUES + 1;
    t->seq_len = st->L;
    t->causal = true;
    t->head = st->head;
    t->classes = VALUES;
    t->mixtures = st->mixtures;
    t->samplable = true; /* start token VALUES = classes */
    t->image_h = st->train.rows;
    t->image_w = st->train.cols;
    t->image_c = st->train.channels;
    t->n_metrics = 0;
    t->metrics[t->n_metrics++] = (task_metric){"bits_per_dim", TASK_METRIC_BITS, NULL, NULL, false};
    if (!mixture) t->metrics[t->n_metrics++] = (task_metric){"accuracy", TASK_METRIC_ACCURACY, NULL, NULL, false};
    npy_splits_to_task(&st->s, t);
    t->fill = img_fill;
    t->max_prompt = st->L;
    t->max_gen = st->L;
    t->prompt = img_prompt;
    t->to_json = img_to_json;
    *out = t;
    return 0;
fail:
    img_destroy(t);
    return rc;
}

const task_kind images_task_kind = {
    "images",
    "autoregressive modelling of images pixel value by pixel value (MNIST, Fashion-MNIST, CIFAR-10; bits/dim)",
    img_keys,
    img_create,
};
