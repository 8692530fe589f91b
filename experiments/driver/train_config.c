/* Training config parsing, canonical form and comparison (train_config.h). */
#include "train_config.h"

#include "attention.h"
#include "config.h"
#include "cuda_blas.h"
#include "error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const TRAIN_RESUMABLE_KEYS[] = {"name",       "label",     "description",      "steps", "epochs",
                                            "eval_every", "log_every", "checkpoint_every", NULL};

void train_config_free(train_config *c) {
    if (!c) return;
    task_destroy(c->task);
    for (int i = 0; i < TRAIN_MAX_ATTN_SETTINGS; i++) free(c->attn_settings[i]);
    json_decref(c->canon);
    memset(c, 0, sizeof *c);
}

/* model.attention: {"variant": NAME, "set": {KEY: VALUE, ...}} -> settings "KEY=VALUE" */
static int parse_attention(const json_t *obj, train_config *c, json_t *canon_model) {
    const char *where = "model.attention";
    if (!json_is_object(obj))
        return ab_fail(AB_EINVAL, "config: '%s' must be an object {\"variant\": NAME, \"set\": {...}}", where);
    static const char *const keys[] = {"variant", "set", NULL};
    int rc = ab_config_only_keys(obj, where, keys);
    if (rc) return rc;
    const char *variant;
    if ((rc = ab_config_str(obj, where, "variant", true, NULL, &variant))) return rc;
    if (attn_variant_find(variant) < 0)
        return ab_fail(AB_EINVAL, "config: 'model.attention.variant' = '%s' is not an attention variant (see attnbench list)",
                       variant);
    json_t *set = json_object_get(obj, "set");
    json_t *cset = json_object();
    if (set && !json_is_object(set)) {
        json_decref(cset);
        return ab_fail(AB_EINVAL, "config: 'model.attention.set' must be an object of option values");
    }
    int n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(set, key, val) {
        char buf[256];
        if (n == TRAIN_MAX_ATTN_SETTINGS) rc = ab_fail(AB_EINVAL, "config: 'model.attention.set' has more than %d options",
                                                      TRAIN_MAX_ATTN_SETTINGS);
        else if (json_is_string(val)) snprintf(buf, sizeof buf, "%s=%s", key, json_string_value(val));
        else if (json_is_integer(val)) snprintf(buf, sizeof buf, "%s=%lld", key, (long long)json_integer_value(val));
        else if (json_is_real(val)) snprintf(buf, sizeof buf, "%s=%.17g", key, json_real_value(val));
        else rc = ab_fail(AB_EINVAL, "config: 'model.attention.set.%s' must be a string or a number", key);
        if (rc) break;
        if (!(c->attn_settings[n++] = strdup(buf))) rc = ab_fail(AB_ENOMEM, "out of memory");
        if (rc) break;
        json_object_set(cset, key, val);
    }
    if (rc) {
        json_decref(cset);
        return rc;
    }
    /* the registry checks its options now (names, values), against the variant's
     * option table: nothing is created */
    attn_options o = {variant, AB_DEV_CPU, 0, n, (const char *const *)c->attn_settings};
    if ((rc = attn_variant_check(&o))) {
        char msg[512]; /* copied: ab_fail writes the buffer attn_error() points to */
        snprintf(msg, sizeof msg, "%s", attn_error());
        json_decref(cset);
        return ab_fail(AB_EINVAL, "config: 'model.attention': %s", msg);
    }
    json_t *ca = json_object();
    json_object_set_new(ca, "variant", json_string(variant));
    json_object_set_new(ca, "set", cset);
    json_object_set_new(canon_model, "attention", ca);
    c->model.n_attn_settings = n;
    c->model.attn_settings = (const char *const *)c->attn_settings;
    return 0;
}

static int parse_model(const json_t *obj, train_config *c, json_t *canon, bool causal) {
    const char *where = "model";
    if (!json_is_object(obj)) return ab_fail(AB_EINVAL, "config: 'model' must be an object");
    const char *body_name;
    int rc = ab_config_str(obj, where, "body", false, "transformer", &body_name);
    if (rc) return rc;
    int body = tf_body_find(body_name);
    if (body < 0)
        return ab_fail(AB_EINVAL, "config: 'model.body' = '%s' is not a body (one of: %s)", body_name, tf_body_names());
    static const char *const tf_keys[] = {"body",     "d_model",    "heads",     "layers",    "d_ff", "dropout",
                                          "pre_norm", "final_norm", "attention", "precision", NULL};
    static const char *const lstm_keys[] = {"body",    "d_model",  "layers", "hidden", "bidirectional",
                                            "dropout", "precision", NULL};
    if ((rc = ab_config_only_keys(obj, where, body == TF_BODY_LSTM ? lstm_keys : tf_keys))) return rc;
    tf_config d;
    tf_config_default(&d);
    tf_config *m = &c->model;
    m->body = (tf_body)body;
    long long x;
    double f;
    json_t *cm = json_object();
    json_object_set_new(canon, "model", cm);
    json_object_set_new(cm, "body", json_string(tf_body_name(m->body)));
    /* precision: fp32 (the default, left out of the canonical config, as before the
     * key existed) or tf32 (the CUDA device's tensor cores; the device is checked when
     * the model is made) */
    const char *prec;
    if ((rc = ab_config_str(obj, where, "precision", false, "fp32", &prec))) return rc;
    if (strcmp(prec, "fp32") == 0) m->precision = AB_PREC_FP32;
    else if (strcmp(prec, "tf32") == 0) m->precision = AB_PREC_TF32;
    else return ab_fail(AB_EINVAL, "config: 'model.precision' = '%s' is not a precision (fp32 or tf32)", prec);
    if (m->precision != AB_PREC_FP32) json_object_set_new(cm, "precision", json_string(prec));
    if ((rc = ab_config_int(obj, where, "d_model", false, d.d_model, 1, 1 << 20, &x))) return rc;
    m->d_model = (int)x;
    if (m->body == TF_BODY_LSTM) {
        if ((rc = ab_config_int(obj, where, "layers", false, d.layers, 1, 1024, &x))) return rc;
        m->layers = (int)x;
        if ((rc = ab_config_int(obj, where, "hidden", false, d.lstm_hidden, 1, 1 << 20, &x))) return rc;
        m->lstm_hidden = (int)x;
        if ((rc = ab_config_bool(obj, where, "bidirectional", false, !causal, &m->bidirectional))) return rc;
        if (causal && m->bidirectional)
            return ab_fail(AB_EINVAL, "config: 'model.bidirectional': the task is causal, so its LSTM cannot look "
                                      "ahead (set it to false)");
        if ((rc = ab_config_num(obj, where, "dropout", false, 0.0, 0.0, 0.999, &f))) return rc;
        m->dropout = (float)f;
        json_object_set_new(cm, "d_model", json_integer(m->d_model));
        json_object_set_new(cm, "layers", json_integer(m->layers));
        json_object_set_new(cm, "hidden", json_integer(m->lstm_hidden));
        json_object_set_new(cm, "bidirectional", json_boolean(m->bidirectional));
        json_object_set_new(cm, "dropout", json_real(f));
        return 0;
    }
    if ((rc = ab_config_int(obj, where, "heads", false, d.heads, 1, 1 << 16, &x))) return rc;
    m->heads = (int)x;
    if (m->d_model % m->heads)
        return ab_fail(AB_EINVAL, "config: 'model.d_model' = %d is not divisible by 'model.heads' = %d", m->d_model,
                       m->heads);
    if ((rc = ab_config_int(obj, where, "layers", false, d.layers, 1, 1024, &x))) return rc;
    m->layers = (int)x;
    if ((rc = ab_config_int(obj, where, "d_ff", false, 4LL * m->d_model, 1, 1 << 24, &x))) return rc;
    m->d_ff = (int)x;
    if ((rc = ab_config_num(obj, where, "dropout", false, d.dropout, 0.0, 0.999, &f))) return rc;
    m->dropout = (float)f;
    if ((rc = ab_config_bool(obj, where, "pre_norm", false, d.pre_norm, &m->pre_norm))) return rc;
    if ((rc = ab_config_bool(obj, where, "final_norm", false, d.final_norm, &m->final_norm))) return rc;
    json_object_set_new(cm, "d_model", json_integer(m->d_model));
    json_object_set_new(cm, "heads", json_integer(m->heads));
    json_object_set_new(cm, "layers", json_integer(m->layers));
    json_object_set_new(cm, "d_ff", json_integer(m->d_ff));
    json_object_set_new(cm, "dropout", json_real(f));
    json_object_set_new(cm, "pre_norm", json_boolean(m->pre_norm));
    json_object_set_new(cm, "final_norm", json_boolean(m->final_norm));
    json_t *att = json_object_get(obj, "attention");
    if (!att) return ab_fail(AB_EINVAL, "config: missing key 'model.attention' ({\"variant\": NAME, \"set\": {...}})");
    return parse_attention(att, c, cm);
}

/* The dataset keys: epochs (or steps), eval_split, eval_rows, test_split. */
static int parse_dataset_keys(const json_t *root, train_config *c) {
    const train_task *t = c->task;
    int train = task_split_find(t, "train");
    char names[256];
    task_split_names(t, names, sizeof names);
    if (train < 0) return ab_fail(AB_EINVAL, "config: the task's data has no \"train\" split (it has: %s)", names);
    int rc;
    json_t *ep = json_object_get(root, "epochs");
    if (ep) {
        if ((rc = ab_config_num(root, "", "epochs", true, 0, 1e-9, 1e9, &c->epochs))) return rc;
        double steps = ceil(c->epochs * (double)t->split_rows[train] / (double)c->batch);
        if (steps > (double)(1LL << 40)) return ab_fail(AB_EINVAL, "config: 'epochs' = %g is too many steps", c->epochs);
        if (json_object_get(root, "steps") && (double)c->steps != steps)
            return ab_fail(AB_EINVAL,
                           "config: 'steps' = %lld and 'epochs' = %g disagree (%g epochs of %lld rows in batches of %lld "
                           "are %.0f steps): give one of them",
                           c->steps, c->epochs, c->epochs, t->split_rows[train], c->batch, steps);
        c->steps = (long long)steps;
    }
    const char *def_eval = task_split_find(t, "valid") >= 0 ? "valid" : task_split_find(t, "test") >= 0 ? "test" : "train";
    const char *es, *ts;
    if ((rc = ab_config_str(root, "", "eval_split", false, def_eval, &es))) return rc;
    if ((c->eval_split = task_split_find(t, es)) < 0)
        return ab_fail(AB_EINVAL, "config: 'eval_split' = '%s' is not a split of the task's data (it has: %s)", es, names);
    const char *def_test = task_split_find(t, "test") >= 0 && strcmp(es, "test") != 0 ? "test" : "";
    if ((rc = ab_config_str(root, "", "test_split", false, def_test, &ts))) return rc;
    c->test_split = -1;
    if (*ts && (c->test_split = task_split_find(t, ts)) < 0)
        return ab_fail(AB_EINVAL, "config: 'test_split' = '%s' is not a split of the task's data (it has: %s; \"\" for "
                                  "none)",
                       ts, names);
    long long rows;
    if ((rc = ab_config_int(root, "", "eval_rows", false, 0, 0, 1LL << 40, &rows))) return rc;
    if (rows > t->split_rows[c->eval_split])
        return ab_fail(AB_EINVAL, "config: 'eval_rows' = %lld is more than the %lld rows of split '%s' (0: all of them)",
                       rows, t->split_rows[c->eval_split], es);
    c->eval_rows = rows == 0 ? t->split_rows[c->eval_split] : rows;
    if (json_object_get(root, "eval_batches"))
        return ab_fail(AB_EINVAL, "config: 'eval_batches' is for generator tasks; a dataset task evaluates 'eval_rows' "
                                  "rows of 'eval_split'");
    if (c->epochs > 0) json_object_set_new(c->canon, "epochs", json_real(c->epochs));
    json_object_set_new(c->canon, "eval_split", json_string(es));
    json_object_set_new(c->canon, "eval_rows", json_integer(rows));
    json_object_set_new(c->canon, "test_split", json_string(ts));
    return 0;
}

/* optim.schedule.plateau: its metric is "loss" (the evaluation loss) or one of the
 * task's metrics, evaluated during training. */
static int parse_plateau(train_config *c) {
    c->plateau_metric = TRAIN_PLATEAU_NONE;
    c->plateau_maximise = false;
    if (!ab_optim_config_has_plateau(&c->optim)) return 0;
    const char *name = c->optim.plateau_metric;
    const train_task *t = c->task;
    if (strcmp(name, "loss") == 0) c->plateau_metric = TRAIN_PLATEAU_LOSS;
    for (int i = 0; i < t->n_metrics; i++)
        if (strcmp(name, t->metrics[i].name) == 0) {
            c->plateau_metric = i;
            c->plateau_maximise = task_metric_maximised(&t->metrics[i]);
        }
    if (c->plateau_metric == TRAIN_PLATEAU_NONE) {
        char names[256] = "loss";
        size_t n = strlen(names);
        for (int i = 0; i < t->n_metrics && n < sizeof names; i++)
            n += (size_t)snprintf(names + n, sizeof names - n, ", %s", t->metrics[i].name);
        return ab_fail(AB_EINVAL, "config: 'optim.schedule.plateau.metric' = '%s' is not evaluated by task '%s' (one of: %s)",
                       name, t->name, names);
    }
    if (c->eval_every <= 0 || (!task_is_dataset(t) && c->eval_batches <= 0))
        return ab_fail(AB_EINVAL, "config: 'optim.schedule.plateau' needs evaluations during training (eval_every > 0%s)",
                       task_is_dataset(t) ? "" : " and eval_batches > 0");
    return 0;
}

int train_config_parse(const json_t *root, train_config *c) {
    memset(c, 0, sizeof *c);
    static const char *const keys[] = {"name",       "label",     "description",  "task",       "model",
                                       "optim",      "steps",     "epochs",       "batch",      "eval_every",
                                       "eval_batches", "eval_split", "eval_rows", "test_split", "checkpoint_every",
                                       "log_every",  "seed",      "accumulate", NULL};
    if (!json_is_object(root)) return ab_fail(AB_EINVAL, "config: the top level must be an object");
    int rc = ab_config_only_keys(root, "", keys);
    if (rc) return rc;
    c->canon = json_object();
    if (!c->canon) return ab_fail(AB_ENOMEM, "out of memory");
    const char *name, *label, *desc;
    long long x;
    tf_config_default(&c->model);
    if ((rc = ab_config_file_name(root, "", "name", true, NULL, &name))) goto fail;
    if ((rc = ab_config_label(root, "", "label", false, name, &label))) goto fail;
    if ((rc = ab_config_str(root, "", "description", false, "", &desc))) goto fail;
    json_object_set_new(c->canon, "name", json_string(name));
    json_object_set_new(c->canon, "label", json_string(label));
    json_object_set_new(c->canon, "description", json_string(desc));

    json_t *task = json_object_get(root, "task");
    if (!task) {
        rc = ab_fail(AB_EINVAL, "config: missing key 'task' (e.g. {\"name\": \"copy\", \"max_symbols\": 128})");
        goto fail;
    }
    if ((rc = task_create(task, &c->task))) goto fail;
    json_object_set_new(c->canon, "task", c->task->to_json(c->task));

    json_t *model = json_object_get(root, "model");
    if (!model) {
        rc = ab_fail(AB_EINVAL, "config: missing key 'model'");
        goto fail;
    }
    if ((rc = parse_model(model, c, c->canon, c->task->causal))) goto fail;
    c->model.input = c->task->input == TASK_INPUT_FRAMES ? TF_INPUT_FRAMES : TF_INPUT_TOKENS;
    c->model.vocab = c->task->vocab;
    c->model.features = c->task->features;
    c->model.classes = c->task->classes;
    if (tf_head_find(c->task->head) < 0) {
        rc = ab_fail(AB_EINVAL, "config: the task's head '%s' is not one the model has (%s)", c->task->head,
                     tf_head_names());
        goto fail;
    }
    c->model.head = (tf_head)tf_head_find(c->task->head);
    c->model.mixtures = c->task->mixtures;
    c->model.max_labels = c->task->max_labels;
    if (c->model.head == TF_HEAD_CTC && (!task_is_dataset(c->task) || !c->task->fill_labels || c->task->max_labels < 1)) {
        rc = ab_fail(AB_EINVAL, "config: task '%s' has the ctc head but no label sequences (a dataset task with "
                                "max_labels and fill_labels)",
                     c->task->name);
        goto fail;
    }
    c->model.max_len = c->task->seq_len;
    c->model.causal = c->task->causal;
    c->model.attention = c->model.body == TF_BODY_TRANSFORMER
                             ? json_string_value(json_object_get(
                                   json_object_get(json_object_get(c->canon, "model"), "attention"), "variant"))
                             : NULL;

    ab_optim_config_default(&c->optim);
    json_t *optim = json_object_get(root, "optim");
    if (optim && (rc = ab_optim_config_from_json(optim, "optim", &c->optim))) goto fail;
    json_t *co = ab_optim_config_to_json(&c->optim);
    if (!co) {
        rc = ab_fail(AB_ENOMEM, "out of memory");
        goto fail;
    }
    json_object_set_new(c->canon, "optim", co);

    struct {
        const char *key;
        long long def, min, max;
        long long *out;
    } ints[] = {
        {"steps", 1000, 0, 1LL << 40, &c->steps},
        {"batch", 64, 1, 1 << 20, &c->batch},
        {"eval_every", 100, 0, 1LL << 40, &c->eval_every},
        {"eval_batches", 4, 0, 1 << 20, &c->eval_batches},
        {"checkpoint_every", 500, 0, 1LL << 40, &c->checkpoint_every},
        {"log_every", 10, 1, 1LL << 40, &c->log_every},
        {"seed", 1, 0, INT64_MAX, &x},
        {"accumulate", 1, 1, 1 << 20, &c->accumulate},
    };
    const bool dataset = task_is_dataset(c->task);
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        if (dataset && strcmp(ints[i].key, "eval_batches") == 0) continue; /* parse_dataset_keys */
        if ((rc = ab_config_int(root, "", ints[i].key, false, ints[i].def, ints[i].min, ints[i].max, ints[i].out)))
            goto fail;
    }
    if (dataset) {
        if ((rc = parse_dataset_keys(root, c))) goto fail;
    } else {
        static const char *const ds_keys[] = {"epochs", "eval_split", "eval_rows", "test_split", NULL};
        for (int i = 0; ds_keys[i]; i++)
            if (json_object_get(root, ds_keys[i])) {
                rc = ab_fail(AB_EINVAL, "config: '%s' is for dataset tasks; task '%s' draws its rows from a generator",
                             ds_keys[i], c->task->name);
                goto fail;
            }
    }
    if (c->batch % c->accumulate != 0) {
        rc = ab_fail(AB_EINVAL, "config: 'accumulate' %lld does not divide 'batch' %lld into equal micro-batches",
                     c->accumulate, c->batch);
        goto fail;
    }
    /* accumulate: left out of the canonical config at 1, as configs before it had it */
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if (!(dataset && strcmp(ints[i].key, "eval_batches") == 0) &&
            !(strcmp(ints[i].key, "accumulate") == 0 && c->accumulate == 1))
            json_object_set_new(c->canon, ints[i].key, json_integer(*ints[i].out));
    if ((rc = parse_plateau(c))) goto fail;
    c->seed = (uint64_t)x;
    c->model.seed = c->seed;
    /* pointers into the canonical config (stable: canon is not modified again) */
    c->name = json_string_value(json_object_get(c->canon, "name"));
    c->label = json_string_value(json_object_get(c->canon, "label"));
    return 0;
fail:
    train_config_free(c);
    return rc;
}

static bool resumable(const char *key) {
    for (int i = 0; TRAIN_RESUMABLE_KEYS[i]; i++)
        if (strcmp(TRAIN_RESUMABLE_KEYS[i], key) == 0) return true;
    return false;
}

static int diff(const json_t *a, const json_t *b, const char *path, bool top, char *key, size_t cap) {
    if (json_is_object(a) && json_is_object(b)) {
        const char *k;
        json_t *v;
        char sub[512];
        for (int pass = 0; pass < 2; pass++) {
            const json_t *x = pass ? b : a, *y = pass ? a : b;
            json_object_foreach((json_t *)x, k, v) {
                if (top && resumable(k)) continue;
                snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", k);
                json_t *w = json_object_get(y, k);
                if (!w) {
                    snprintf(key, cap, "%s", sub);
                    return 1;
                }
                if (!pass && diff(v, w, sub, false, key, cap)) return 1;
            }
        }
        return 0;
    }
    if (!json_equal((json_t *)a, (json_t *)b)) {
        snprintf(key, cap, "%s", *path ? path : "(the whole config)");
        return 1;
    }
    return 0;
}

int train_config_diff(const json_t *a, const json_t *b, char *key, size_t cap) { return diff(a, b, "", true, key, cap); }

/* ---- --set KEY=VALUE ---- */

/* Whether the dotted path names a value inside `obj`. */
static bool has_path(const json_t *obj, const char *path) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    char *save = NULL;
    const json_t *cur = obj;
    for (char *tok = strtok_r(buf, ".", &save); tok; tok = strtok_r(NULL, ".", &save)) {
        if (!json_is_object(cur)) return false;
        cur = json_object_get(cur, tok);
        if (!cur) return false;
    }
    return true;
}

/* Whether `key` is "task.X" with X an option of the config's task kind. */
static bool task_option(const json_t *root, const char *key) {
    if (strncmp(key, "task.", 5) != 0) return false;
    const task_kind *k = task_kind_find(json_string_value(json_object_get(json_object_get(root, "task"), "name")));
    if (!k) return false;
    for (int i = 0; k->keys[i]; i++)
        if (strcmp(k->keys[i], key + 5) == 0) return true;
    return false;
}

int train_config_apply_sets(json_t *root, const char *const *sets, int n) {
    json_t *canon = NULL;
    int rc = 0;
    /* steps and epochs are two forms of a run's length: setting one alone replaces the
     * other (a checkpoint's config holds both) */
    bool set_steps = false, set_epochs = false;
    for (int i = 0; i < n; i++) {
        set_steps |= strncmp(sets[i], "steps=", 6) == 0;
        set_epochs |= strncmp(sets[i], "epochs=", 7) == 0;
    }
    if (set_steps != set_epochs) json_object_del(root, set_steps ? "epochs" : "steps");
    for (int i = 0; i < n && !rc; i++) {
        bool length = strncmp(sets[i], "steps=", 6) == 0 || strncmp(sets[i], "epochs=", 7) == 0;
        if (ab_config_set(root, sets[i], length) == 0) continue;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ab_error());
        const char *eq = strchr(sets[i], '=');
        char key[512];
        snprintf(key, sizeof key, "%.*s", eq ? (int)(eq - sets[i]) : 0, sets[i]);
        if (!eq || !*key) {
            rc = ab_fail(AB_EINVAL, "%s", msg);
            break;
        }
        if (!canon) {
            train_config c;
            if ((rc = train_config_parse(root, &c))) break;
            canon = json_incref(c.canon);
            train_config_free(&c);
        }
        /* accumulate: a key the canonical config leaves out at its default */
        bool known = has_path(canon, key) || task_option(root, key) || strncmp(key, "model.attention.set.", 20) == 0 ||
                     strcmp(key, "accumulate") == 0;
        if (!known || ab_config_set(root, sets[i], true)) rc = ab_fail(AB_EINVAL, "%s", msg);
    }
    json_decref(canon);
    return rc;
}
