/* Training checkpoints: the blobs listed in trainer.h, written atomically through
 * harness/checkpoint.h, and their checks on the way back (both formats). */
#include "trainer.h"

#include "blas.h"
#include "bytes.h"
#include "error.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE_BLOB "state"
#define LOSSES_BLOB "losses"
/* Format 1's binary meta record: u32 version (1), u32 cursors (4), u64 step, n_params,
 * seed, data position, data epoch, f64 elapsed_s, u64 extra[4] (extra[0] the thread
 * count, extra[1] the bits of the double step_s), 4 cursors of u64 seed, stream, index
 * (cursor 0: the data cursor (seed, TASK_STREAM_DATA, step), the others zero). */
#define V1_META_BLOB "meta"
#define V1_META_BYTES (8u + 8u * 6u + 8u * 4u + 24u * 4u)

/* The model's parameters in host memory: the model's own on the CPU, else downloaded
 * into `host`. NULL with a message on failure. */
static const float *host_params(tf_model *m, float *host) {
    if (tf_device(m) == AB_DEV_CPU) return tf_params(m);
    return tf_params_download(m, host) ? NULL : host;
}

/* Reads the checkpoint's parameters into the model (through `host` on a device). */
static int read_params(const ab_ckpt_reader *r, tf_model *m, float *host) {
    size_t bytes = sizeof(float) * tf_param_count(m);
    if (tf_device(m) == AB_DEV_CPU) return ab_ckpt_read(r, AB_CKPT_PARAMS, tf_params(m), bytes);
    int rc = ab_ckpt_read(r, AB_CKPT_PARAMS, host, bytes);
    return rc ? rc : tf_params_upload(m, host);
}

/* A model to run from (sample, generate, decode) needs finite parameters: a checkpoint
 * of a run that diverged holds NaN or infinities, which would give NaN outputs (sample
 * wrote images of zeros and exited 0). Bad input: AB_EINVAL naming the first. */
static int check_finite(const char *path, const float *p, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p[i]) && bad++ == 0) first = i;
    if (bad)
        return ab_fail(AB_EINVAL, "%s: %zu of its %zu parameters are not finite (the first, %zu, is %g): the run "
                                  "diverged, there is no model to run", path, bad, n, first, (double)p[first]);
    return 0;
}

int trainer_save(trainer *t, const char *path, double elapsed_s, double cpu_s) {
    const float *params = host_params(t->model, t->host_params);
    if (!params) return AB_EDEVICE;
    ab_ckpt_writer *w;
    int rc = ab_ckpt_begin(path, &w);
    if (rc) return rc;
    json_t *st = json_object();
    json_object_set_new(st, "step", json_integer(t->step));
    json_object_set_new(st, "n_params", json_integer((json_int_t)tf_param_count(t->model)));
    /* the seed is a u64: kept as its decimal string (a JSON integer is signed) */
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)t->cfg.seed);
    json_object_set_new(st, "seed", json_string(seed));
    json_object_set_new(st, "elapsed_s", json_real(elapsed_s));
    json_object_set_new(st, "step_s", json_real(t->step_s));
    /* unknown CPU times (a run begun by an earlier release) stay unknown: null */
    json_object_set_new(st, "cpu_s", isfinite(cpu_s) ? json_real(cpu_s) : json_null());
    json_object_set_new(st, "step_cpu_s", isfinite(t->step_cpu_s) ? json_real(t->step_cpu_s) : json_null());
    json_object_set_new(st, "positions", json_real(t->positions));
    json_object_set_new(st, "threads", json_integer(ab_threads()));
    ab_ckpt_add(w, "format", TRAIN_CKPT_FORMAT, strlen(TRAIN_CKPT_FORMAT));
    ab_ckpt_add_json(w, AB_CKPT_CONFIG, t->cfg.canon);
    ab_ckpt_add_json(w, STATE_BLOB, st);
    json_decref(st);
    ab_ckpt_add(w, AB_CKPT_PARAMS, params, sizeof(float) * tf_param_count(t->model));
    ab_ckpt_add_optim(w, AB_CKPT_OPTIM, t->opt);
    ab_ckpt_add(w, LOSSES_BLOB, t->losses, sizeof(double) * (size_t)t->step);
    return ab_ckpt_commit(w); /* reports the first failed add, if any */
}

/* The format blob: 2 for this release, 1 for the one before, 0 (with a message) else. */
static int format_of(const ab_ckpt_reader *r, const char *path) {
    const void *fmt;
    size_t n;
    if (ab_ckpt_has(r, "format") && !ab_ckpt_get(r, "format", &fmt, &n)) {
        if (n == strlen(TRAIN_CKPT_FORMAT) && memcmp(fmt, TRAIN_CKPT_FORMAT, n) == 0) return 2;
        if (n == strlen(TRAIN_CKPT_FORMAT_V1) && memcmp(fmt, TRAIN_CKPT_FORMAT_V1, n) == 0) return 1;
    }
    ab_fail(AB_EINVAL, "%s: not a training checkpoint of this version (no '%s' or '%s' format blob)", path,
            TRAIN_CKPT_FORMAT, TRAIN_CKPT_FORMAT_V1);
    return 0;
}

int train_ckpt_open(const char *path, ab_ckpt_reader **out, json_t **config) {
    *out = NULL;
    *config = NULL;
    ab_ckpt_reader *r;
    int rc = ab_ckpt_open(path, &r);
    if (rc) return rc;
    if (!format_of(r, path)) {
        ab_ckpt_close(r);
        return AB_EINVAL;
    }
    if ((rc = ab_ckpt_get_json(r, AB_CKPT_CONFIG, config))) {
        ab_ckpt_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

/* Format 1's meta record, checked: the data position and cursor it also holds were
 * functions of the step (a generator task's batch t is drawn from (seed, DATA, t)). */
static int get_state_v1(const ab_ckpt_reader *r, train_ckpt_state *st) {
    const void *data;
    size_t n;
    int rc = ab_ckpt_get(r, V1_META_BLOB, &data, &n);
    if (rc) return rc;
    const unsigned char *b = data;
    if (n != V1_META_BYTES || ab_get_u32(b) != 1 || ab_get_u32(b + 4) != 4)
        return ab_fail(AB_EINVAL, "%s: blob '%s' is not a version 1 meta record of %u bytes", ab_ckpt_path(r),
                       V1_META_BLOB, V1_META_BYTES);
    uint64_t step = ab_get_u64(b + 8), n_params = ab_get_u64(b + 16), seed = ab_get_u64(b + 24);
    uint64_t position = ab_get_u64(b + 32), elapsed = ab_get_u64(b + 48), threads = ab_get_u64(b + 56);
    uint64_t step_s = ab_get_u64(b + 64);
    const unsigned char *cur = b + 88; /* cursor 0: seed, stream, index */
    if (position != step || ab_get_u64(cur) != seed || ab_get_u64(cur + 8) != TASK_STREAM_DATA ||
        ab_get_u64(cur + 16) != step)
        return ab_fail(AB_EINVAL, "%s: the meta record's data position does not match its step %llu", ab_ckpt_path(r),
                       (unsigned long long)step);
    if (step > (1ULL << 40) || threads > 1 << 20)
        return ab_fail(AB_EINVAL, "%s: implausible meta record (step %llu, %llu threads)", ab_ckpt_path(r),
                       (unsigned long long)step, (unsigned long long)threads);
    st->step = (long long)step;
    st->n_params = (size_t)n_params;
    st->seed = seed;
    memcpy(&st->elapsed_s, &elapsed, 8);
    memcpy(&st->step_s, &step_s, 8);
    st->threads = (int)threads;
    st->cpu_s = st->step_cpu_s = NAN;
    st->positions = -1;
    return 0;
}

static int state_num(const json_t *o, const char *key, const ab_ckpt_reader *r, double *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v))
        return ab_fail(AB_EINVAL, "%s: blob '%s' lacks the number '%s'", ab_ckpt_path(r), STATE_BLOB, key);
    *out = json_number_value(v);
    return 0;
}

int train_ckpt_get_state(const ab_ckpt_reader *r, train_ckpt_state *st) {
    memset(st, 0, sizeof *st);
    if (!ab_ckpt_has(r, STATE_BLOB)) return get_state_v1(r, st);
    json_t *o;
    int rc = ab_ckpt_get_json(r, STATE_BLOB, &o);
    if (rc) return rc;
    json_t *step = json_object_get(o, "step"), *np = json_object_get(o, "n_params"), *th = json_object_get(o, "threads");
    const char *seed = json_string_value(json_object_get(o, "seed"));
    char *end = NULL;
    unsigned long long sd = seed ? strtoull(seed, &end, 10) : 0;
    if (!json_is_integer(step) || json_integer_value(step) < 0 || json_integer_value(step) > (1LL << 40) ||
        !json_is_integer(np) || json_integer_value(np) < 0 || !json_is_integer(th) || json_integer_value(th) < 0 ||
        !seed || !*seed || *end)
        rc = ab_fail(AB_EINVAL, "%s: blob '%s' is not a training state (step, n_params, seed, threads)",
                     ab_ckpt_path(r), STATE_BLOB);
    if (!rc) rc = state_num(o, "elapsed_s", r, &st->elapsed_s);
    if (!rc) rc = state_num(o, "step_s", r, &st->step_s);
    /* added later: absent in older checkpoints, null when unknown */
    json_t *cpu = json_object_get(o, "cpu_s"), *scpu = json_object_get(o, "step_cpu_s"),
           *pos = json_object_get(o, "positions");
    st->cpu_s = json_is_number(cpu) ? json_number_value(cpu) : NAN;
    st->step_cpu_s = json_is_number(scpu) ? json_number_value(scpu) : NAN;
    st->positions = json_is_number(pos) && json_number_value(pos) >= 0 ? json_number_value(pos) : -1;
    if (!rc && ((cpu && !json_is_null(cpu) && !json_is_number(cpu)) ||
                (scpu && !json_is_null(scpu) && !json_is_number(scpu)) ||
                (pos && !(json_is_number(pos) && json_number_value(pos) >= 0))))
        rc = ab_fail(AB_EINVAL, "%s: blob '%s' has a cpu_s, step_cpu_s or positions that is not a number",
                     ab_ckpt_path(r), STATE_BLOB);
    if (!rc) {
        st->step = (long long)json_integer_value(step);
        st->n_params = (size_t)json_integer_value(np);
        st->threads = (int)json_integer_value(th);
        st->seed = (uint64_t)sd;
    }
    json_decref(o);
    return rc;
}

/* The state record, checked against the model. */
static int get_state(const ab_ckpt_reader *r, const tf_model *m, train_ckpt_state *st) {
    int rc = train_ckpt_get_state(r, st);
    if (rc) return rc;
    if (st->n_params != tf_param_count(m))
        return ab_fail(AB_EINVAL, "%s: the checkpoint holds %zu parameters, its config's model has %zu",
                       ab_ckpt_path(r), st->n_params, tf_param_count(m));
    return 0;
}

int train_ckpt_check_model(const ab_ckpt_reader *r, const tf_config *model, train_ckpt_state *out) {
    train_ckpt_state st;
    int rc = train_ckpt_get_state(r, &st);
    if (rc) return rc;
    size_t want;
    if ((rc = tf_param_count_for(model, &want))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ab_error());
        return ab_fail(rc == AB_ENOMEM ? rc : AB_EINVAL, "%s: its config's model is not valid: %s", ab_ckpt_path(r),
                       msg);
    }
    if (st.n_params != want)
        return ab_fail(AB_EINVAL, "%s: the checkpoint holds %zu parameters, its config's model has %zu",
                       ab_ckpt_path(r), st.n_params, want);
    const void *p;
    size_t bytes;
    if ((rc = ab_ckpt_get(r, AB_CKPT_PARAMS, &p, &bytes))) return rc;
    if (want > SIZE_MAX / sizeof(float) || bytes != want * sizeof(float))
        return ab_fail(AB_EINVAL, "%s: blob '%s' has %zu bytes, its config's model has %zu parameters",
                       ab_ckpt_path(r), AB_CKPT_PARAMS, bytes, want);
    if (out) *out = st;
    return 0;
}

int trainer_restore(trainer *t, const ab_ckpt_reader *r) {
    train_ckpt_state st;
    int rc = get_state(r, t->model, &st);
    if (rc) return rc;
    if (st.seed != t->cfg.seed)
        return ab_fail(AB_EINVAL, "%s: the checkpoint's seed %llu differs from the config's %llu", ab_ckpt_path(r),
                       (unsigned long long)st.seed, (unsigned long long)t->cfg.seed);
    long long step = st.step;
    if (step > t->losses_cap) {
        double *p = realloc(t->losses, sizeof(double) * (size_t)step);
        if (!p) return ab_fail(AB_ENOMEM, "out of memory for %lld losses", step);
        t->losses = p;
        t->losses_cap = step;
    }
    if ((rc = ab_ckpt_read(r, LOSSES_BLOB, t->losses, sizeof(double) * (size_t)step))) return rc;
    if ((rc = read_params(r, t->model, t->host_params))) return rc;
    if ((rc = ab_ckpt_get_optim(r, AB_CKPT_OPTIM, t->opt))) return rc;
    if (ab_optim_steps(t->opt) != step)
        return ab_fail(AB_EINVAL, "%s: the optimiser has taken %lld steps, the state record says %lld", ab_ckpt_path(r),
                       ab_optim_steps(t->opt), step);
    t->step = step;
    t->elapsed_s = st.elapsed_s;
    t->ckpt_threads = st.threads;
    t->step_s = st.step_s;
    t->cpu_s = st.cpu_s;
    t->step_cpu_s = st.step_cpu_s;
    /* a checkpoint without the count: every batch had N = the task's length then */
    t->positions = st.positions >= 0 ? st.positions : (double)step * (double)t->cfg.batch * t->cfg.task->seq_len;
    return 0;
}

bool train_variant_interchangeable(const char *a, const char *b) {
    if (!a || !b) return ab_fail(AB_EINVAL, "no attention variant given"), false;
    if (strcmp(a, b) == 0) return true;
    const bool sa = strcmp(a, "softmax") == 0 || strcmp(a, "stateful-softmax") == 0;
    const bool sb = strcmp(b, "softmax") == 0 || strcmp(b, "stateful-softmax") == 0;
    if (sa && sb) return true;
    ab_fail(AB_EINVAL, "variant '%s' computes another function than the model's '%s': only softmax and stateful-softmax "
                       "stand in for each other",
            b, a);
    return false;
}

int train_ckpt_load_model(const char *path, int max_batch, int forward_len, ab_device device, const char *variant,
                          train_config *cfg, tf_model **model, train_ckpt_state *state) {
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
    if (variant) {
        if (cfg->model.body != TF_BODY_TRANSFORMER) {
            rc = ab_fail(AB_EINVAL, "%s: the model's body is %s: it has no attention variant to change", path,
                         tf_body_name(cfg->model.body));
            ab_ckpt_close(r);
            train_config_free(cfg);
            return rc;
        }
        if (!train_variant_interchangeable(cfg->model.attention, variant)) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", ab_error());
            ab_ckpt_close(r);
            train_config_free(cfg);
            return ab_fail(AB_EINVAL, "%s: %s", path, msg);
        }
        cfg->model.attention = variant;
    }
    train_ckpt_state st;
    cfg->model.device = device;
    cfg->model.forward_len = forward_len;
    float *host = NULL;
    /* the sizes first: the model is only allocated for parameters that fit it */
    if (!(rc = train_ckpt_check_model(r, &cfg->model, &st)) && !(rc = tf_create_inference(&cfg->model, max_batch, model)) &&
        !(rc = get_state(r, *model, &st))) {
        if (device != AB_DEV_CPU && !(host = ab_alloc(sizeof(float) * tf_param_count(*model))))
            rc = ab_fail(AB_ENOMEM, "out of memory for a host copy of the parameters");
        if (!rc) rc = read_params(r, *model, host);
        if (!rc) rc = check_finite(path, host ? host : tf_params(*model), tf_param_count(*model));
    }
    ab_free(host);
    ab_ckpt_close(r);
    if (rc) {
        tf_destroy(*model);
        *model = NULL;
        train_config_free(cfg);
        return rc;
    }
    if (state) *state = st;
    return 0;
}
