/* experiments/driver/train_ckpt.c: what `attnbench generate` and `attnbench train
 * --resume` read from a training checkpoint (its config, state record, parameters,
 * optimiser state and losses), behind a valid container: the blobs of the input are
 * written with the checkpoint writer (harness/checkpoint.h), so every mutation reaches
 * the training checkpoint's own checks (the container's are fuzz_checkpoint's).
 *
 * Input: sections "\0@@NAME\n" followed by the blob's bytes, up to the next "\0@@" or
 * the end (make_corpus.py turns real checkpoints into this form); bytes before the
 * first section are ignored. Names the writer refuses end the input.
 *
 * Then (1) generate's path, train_ckpt_load_model, and (2) resume's path without a
 * config file: train_ckpt_open, train_config_parse of the checkpoint's config,
 * train_ckpt_check_model, trainer_create, trainer_restore. A config may ask for a large
 * model or batch: that is a request the user makes by choosing the checkpoint (its
 * parameters are checked against it before anything is allocated), not a fault of the
 * reader, so models whose activations would pass about 256 MB are not built here
 * (libFuzzer reports an allocation over 2 GB as a crash). */
#include "checkpoint.h"
#include "error.h"
#include "fuzz_util.h"
#include "task_list.h"
#include "trainer.h"

#include <string.h>

#define MARK "\0@@"
#define MARK_LEN 3

/* The next section mark in [p, end), or NULL. */
static const uint8_t *find_mark(const uint8_t *p, const uint8_t *end) {
    for (; end - p >= MARK_LEN; p++)
        if (memcmp(p, MARK, MARK_LEN) == 0) return p;
    return NULL;
}

/* Writes the input's sections as a checkpoint at `path`; false if the writer refuses. */
static bool write_blobs(const char *path, const uint8_t *data, size_t size) {
    ab_ckpt_writer *w;
    if (ab_ckpt_begin(path, &w)) return false;
    const uint8_t *end = data + size, *p = find_mark(data, end);
    while (p) {
        const uint8_t *name = p + MARK_LEN, *nl = memchr(name, '\n', (size_t)(end - name));
        if (!nl || nl - name > AB_CKPT_NAME_MAX) break;
        char nm[AB_CKPT_NAME_MAX + 1];
        memcpy(nm, name, (size_t)(nl - name));
        nm[nl - name] = '\0';
        const uint8_t *body = nl + 1, *next = find_mark(body, end);
        const size_t n = (size_t)((next ? next : end) - body);
        if (ab_ckpt_add(w, nm, n ? body : NULL, n)) break; /* a name the writer refuses poisons it */
        p = next;
    }
    return ab_ckpt_commit(w) == 0;
}

/* Whether a model of this config, on `batch` rows, has activations of at most about
 * 2^26 floats (a coarse count: every layer's widths and attention's N x N per head). */
static bool small_run(const tf_config *m, long long batch) {
    double per_position = 8.0 * m->d_model + m->d_ff + (double)m->heads * m->max_len + 8.0 * m->lstm_hidden +
                          m->features + 3.0 * m->classes + 3.0 * m->mixtures + m->vocab;
    return (double)batch * m->max_len * (m->layers + 2) * per_position <= (double)(1 << 26);
}

static void generate_path(const char *path) {
    train_config cfg;
    json_t *config;
    ab_ckpt_reader *r;
    /* the size check first, on the config as load_model will parse it */
    if (train_ckpt_open(path, &r, &config)) return;
    int rc = train_config_parse(config, &cfg);
    json_decref(config);
    ab_ckpt_close(r);
    if (rc) return;
    bool small = small_run(&cfg.model, 2);
    train_config_free(&cfg);
    if (!small) return;
    tf_model *m;
    train_ckpt_state st;
    rc = train_ckpt_load_model(path, 2, 0, AB_DEV_CPU, NULL, &cfg, &m, &st);
    if (rc) {
        fuzz_refused(rc, "train_ckpt_load_model");
        return;
    }
    if (tf_param_count(m) != st.n_params)
        fuzz_fail("train_ckpt_load_model", "a model of %zu parameters from a state of %zu", tf_param_count(m),
                  st.n_params);
    tf_destroy(m);
    train_config_free(&cfg);
}

static void resume_path(const char *path) {
    ab_ckpt_reader *r;
    json_t *config;
    int rc = train_ckpt_open(path, &r, &config);
    if (rc) {
        fuzz_refused(rc, "train_ckpt_open");
        return;
    }
    train_config cfg;
    rc = train_config_parse(config, &cfg);
    json_decref(config);
    if (rc) {
        fuzz_refused(rc, "train_config_parse");
    } else if ((rc = train_ckpt_check_model(r, &cfg.model, NULL))) {
        fuzz_refused(rc, "train_ckpt_check_model");
        train_config_free(&cfg);
    } else if (!small_run(&cfg.model, cfg.batch)) {
        train_config_free(&cfg);
    } else {
        trainer *t;
        if ((rc = trainer_create(&cfg, &t))) { /* takes cfg */
            fuzz_refused(rc, "trainer_create");
        } else {
            if ((rc = trainer_restore(t, r))) fuzz_refused(rc, "trainer_restore");
            trainer_destroy(t);
        }
    }
    ab_ckpt_close(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    task_list_install();
    const char *path = fuzz_path("train.ckpt");
    if (write_blobs(path, data, size)) {
        generate_path(path);
        resume_path(path);
    }
    fuzz_no_tracked_memory("training checkpoint");
    return 0;
}
