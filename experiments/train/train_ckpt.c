/* Training checkpoints: the blobs listed in trainer.h, written atomically through
 * models/checkpoint.h, and their checks on the way back. */
#include "trainer.h"

#include "blas.h"
#include "error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The model's parameters in host memory: the model's own on the CPU, else downloaded
 * into `host`. NULL with a message on failure. */
static const float *host_params(tf_model *m, float *host) {
    if (tf_device(m) == ATTN_DEVICE_CPU) return tf_params(m);
    return tf_params_download(m, host) ? NULL : host;
}

/* Reads the checkpoint's parameters into the model (through `host` on a device). */
static int read_params(const ab_ckpt_reader *r, tf_model *m, float *host) {
    size_t bytes = sizeof(float) * tf_param_count(m);
    if (tf_device(m) == ATTN_DEVICE_CPU) return ab_ckpt_read(r, AB_CKPT_PARAMS, tf_params(m), bytes);
    int rc = ab_ckpt_read(r, AB_CKPT_PARAMS, host, bytes);
    return rc ? rc : tf_params_upload(m, host);
}

int trainer_save(trainer *t, const char *path, double elapsed_s) {
    const float *params = host_params(t->model, t->host_params);
    if (!params) return AB_EDEVICE;
    ab_ckpt_writer *w;
    int rc = ab_ckpt_begin(path, &w);
    if (rc) return rc;
    ab_ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.step = (uint64_t)t->step;
    meta.n_params = tf_param_count(t->model);
    meta.seed = t->cfg.seed;
    meta.data_position = (uint64_t)t->step;
    meta.elapsed_s = elapsed_s;
    meta.extra[0] = (uint64_t)ab_threads();
    memcpy(&meta.extra[1], &t->step_s, sizeof(double));
    meta.rng[0] = (ab_rng){t->cfg.seed, TASK_STREAM_DATA, (uint64_t)t->step};
    ab_ckpt_add(w, "format", TRAIN_CKPT_FORMAT, strlen(TRAIN_CKPT_FORMAT));
    ab_ckpt_add_json(w, AB_CKPT_CONFIG, t->cfg.canon);
    ab_ckpt_add_meta(w, &meta);
    ab_ckpt_add(w, AB_CKPT_PARAMS, params, sizeof(float) * tf_param_count(t->model));
    ab_ckpt_add_optim(w, AB_CKPT_OPTIM, t->opt);
    ab_ckpt_add(w, "losses", t->losses, sizeof(double) * (size_t)t->step);
    return ab_ckpt_commit(w); /* reports the first failed add, if any */
}

int train_ckpt_open(const char *path, ab_ckpt_reader **out, json_t **config) {
    *out = NULL;
    *config = NULL;
    ab_ckpt_reader *r;
    int rc = ab_ckpt_open(path, &r);
    if (rc) return rc;
    const void *fmt;
    size_t n;
    if (!ab_ckpt_has(r, "format") || ab_ckpt_get(r, "format", &fmt, &n) || n != strlen(TRAIN_CKPT_FORMAT) ||
        memcmp(fmt, TRAIN_CKPT_FORMAT, n) != 0) {
        ab_ckpt_close(r);
        return ab_fail(AB_EINVAL, "%s: not a training checkpoint of this version (no '%s' format blob)", path,
                       TRAIN_CKPT_FORMAT);
    }
    if ((rc = ab_ckpt_get_json(r, AB_CKPT_CONFIG, config))) {
        ab_ckpt_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

/* The meta record, checked against the model. */
static int get_meta(const ab_ckpt_reader *r, const tf_model *m, ab_ckpt_meta *meta) {
    int rc = ab_ckpt_get_meta(r, meta);
    if (rc) return rc;
    if (meta->n_params != tf_param_count(m))
        return ab_fail(AB_EINVAL, "%s: the checkpoint holds %llu parameters, its config's model has %zu",
                       ab_ckpt_path(r), (unsigned long long)meta->n_params, tf_param_count(m));
    return 0;
}

int trainer_restore(trainer *t, const ab_ckpt_reader *r) {
    ab_ckpt_meta meta;
    int rc = get_meta(r, t->model, &meta);
    if (rc) return rc;
    if (meta.seed != t->cfg.seed)
        return ab_fail(AB_EINVAL, "%s: the checkpoint's seed %llu differs from the config's %llu", ab_ckpt_path(r),
                       (unsigned long long)meta.seed, (unsigned long long)t->cfg.seed);
    if (meta.step > (1ULL << 40))
        return ab_fail(AB_EINVAL, "%s: implausible step %llu", ab_ckpt_path(r), (unsigned long long)meta.step);
    long long step = (long long)meta.step;
    if (step > t->losses_cap) {
        double *p = realloc(t->losses, sizeof(double) * (size_t)step);
        if (!p) return ab_fail(AB_ENOMEM, "out of memory for %lld losses", step);
        t->losses = p;
        t->losses_cap = step;
    }
    if ((rc = ab_ckpt_read(r, "losses", t->losses, sizeof(double) * (size_t)step))) return rc;
    if ((rc = read_params(r, t->model, t->host_params))) return rc;
    if ((rc = ab_ckpt_get_optim(r, AB_CKPT_OPTIM, t->opt))) return rc;
    if (ab_optim_steps(t->opt) != step)
        return ab_fail(AB_EINVAL, "%s: the optimiser has taken %lld steps, the meta record says %lld", ab_ckpt_path(r),
                       ab_optim_steps(t->opt), step);
    t->step = step;
    t->elapsed_s = meta.elapsed_s;
    t->ckpt_threads = (int)meta.extra[0];
    memcpy(&t->step_s, &meta.extra[1], sizeof(double));
    return 0;
}

int train_ckpt_load_model(const char *path, int max_batch, attn_device device, train_config *cfg, tf_model **model,
                          ab_ckpt_meta *meta) {
    *model = NULL;
    memset(cfg, 0, sizeof *cfg);
    ab_ckpt_reader *r;
    json_t *config;
    int rc = train_ckpt_open(path, &r, &config);
    if (rc) return rc;
    rc = train_config_parse(config, cfg);
    json_decref(config);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ab_error());
        ab_ckpt_close(r);
        return ab_fail(AB_EINVAL, "%s: its config is not valid here: %s", path, msg);
    }
    ab_ckpt_meta m;
    cfg->model.device = device;
    float *host = NULL;
    if (!(rc = tf_create(&cfg->model, max_batch, model)) && !(rc = get_meta(r, *model, &m))) {
        if (device != ATTN_DEVICE_CPU && !(host = ab_alloc(sizeof(float) * tf_param_count(*model))))
            rc = ab_fail(AB_ENOMEM, "out of memory for a host copy of the parameters");
        if (!rc) rc = read_params(r, *model, host);
    }
    ab_free(host);
    ab_ckpt_close(r);
    if (rc) {
        tf_destroy(*model);
        *model = NULL;
        train_config_free(cfg);
        return rc;
    }
    if (meta) *meta = m;
    return 0;
}
