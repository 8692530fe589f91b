/* Best-path decoding of a split with its error rate (decode_run.h). */
#include "decode_run.h"

#include "blas.h"
#include "ctc.h"
#include "error.h"
#include "memory.h"
#include "results.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Labels as text: the task's names, or numbers, separated by spaces. */
static json_t *labels_text(const train_task *t, const int *x, int n) {
    size_t cap = 64, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = '\0';
    for (int i = 0; i < n; i++) {
        char num[32];
        const char *w = t->label_name ? t->label_name(t, x[i]) : (snprintf(num, sizeof num, "%d", x[i]), num);
        size_t k = strlen(w);
        if (len + k + 2 > cap) {
            while (len + k + 2 > cap) cap *= 2;
            char *p = realloc(s, cap);
            if (!p) {
                free(s);
                return NULL;
            }
            s = p;
        }
        if (i) s[len++] = ' ';
        memcpy(s + len, w, k + 1);
        len += k;
    }
    json_t *j = json_string(s);
    free(s);
    return j;
}

/* The run's batch from the checkpoint's config (1 where it has none in range). */
static int run_batch(const char *checkpoint, int *batch) {
    ab_ckpt_reader *r;
    json_t *config;
    int rc = train_ckpt_open(checkpoint, &r, &config);
    if (rc) return rc;
    ab_ckpt_close(r);
    json_t *b = json_object_get(config, "batch");
    *batch = json_is_integer(b) && json_integer_value(b) >= 1 && json_integer_value(b) <= (1 << 16)
                 ? (int)json_integer_value(b)
                 : 1;
    json_decref(config);
    return 0;
}

/* The split decoded: the named one, else test, else the run's evaluation split. */
static int find_split(const train_config *cfg, const char *name, int *split) {
    const train_task *task = cfg->task;
    if (name) {
        if ((*split = task_split_find(task, name)) < 0) {
            char names[256];
            task_split_names(task, names, sizeof names);
            return ab_fail(AB_EINVAL, "decode --split %s: the task has no such split (%s)", name, names);
        }
    } else {
        *split = task_split_find(task, "test");
        if (*split < 0) *split = cfg->eval_split;
    }
    return 0;
}

/* Row r0 + i of the batch just run: its best path against its reference, counted. */
static void score_row(decode_result *r, const task_batch *b, const float *logits, int C, int i, long long row, int *hyp,
                      int *work) {
    const train_task *task = r->cfg.task;
    const float *x = logits + (size_t)i * (size_t)b->N * (size_t)C;
    const int *ref = b->labels + (size_t)i * (size_t)b->S, nr = b->label_counts[i];
    const int nh = ctc_best_path(x, b->lengths[i], C, hyp);
    const int e = ctc_edit_distance(hyp, nh, ref, nr, work);
    r->errors += e;
    r->ref_labels += nr;
    r->exact += e == 0;
    json_t *u = json_object();
    char num[32];
    snprintf(num, sizeof num, "%lld", row);
    json_object_set_new(u, "row", json_integer(row));
    json_object_set_new(u, "id", json_string(task->row_name ? task->row_name(task, r->split, row) : num));
    json_object_set_new(u, "positions", json_integer(b->lengths[i]));
    json_object_set_new(u, "ref", labels_text(task, ref, nr));
    json_object_set_new(u, "hyp", labels_text(task, hyp, nh));
    json_object_set_new(u, "errors", json_integer(e));
    json_object_set_new(u, "ref_len", json_integer(nr));
    json_array_append_new(r->utterances, u);
}

/* The rows through the model, batch by batch, each row scored. */
static int decode_rows(decode_result *r, tf_model *m, int batch, task_batch *b) {
    const train_task *task = r->cfg.task;
    const int C = tf_classes(m), N = task->seq_len, S = task->max_labels;
    float *logits = ab_alloc(sizeof(float) * (size_t)batch * (size_t)N * (size_t)C);
    int *hyp = malloc(sizeof(int) * (size_t)N), *work = malloc(sizeof(int) * ((size_t)N + (size_t)S + 1));
    long long *idx = malloc(sizeof(long long) * (size_t)batch);
    int rc = !logits || !hyp || !work || !idx ? ab_fail(AB_ENOMEM, "out of memory") : 0;
    const uint64_t seed = tf_step_seed(r->cfg.seed, TRAIN_EVAL_STEP);
    for (long long r0 = 0; r0 < r->rows && !rc; r0 += batch) {
        const int n = (int)(r->rows - r0 < batch ? r->rows - r0 : batch);
        for (int i = 0; i < n; i++) idx[i] = r0 + i;
        task_batch_fill_rows(task, r->split, idx, n, b);
        rc = b->frames ? tf_forward_frames(m, b->frames, n, b->N, b->lengths, false, seed)
                       : tf_forward(m, b->tokens, n, b->N, b->lengths, false, seed);
        if (!rc) rc = tf_logits_download(m, logits);
        if (rc) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", ab_error());
            rc = ab_fail(rc, "decode: rows %lld..%lld: %s", r0, r0 + n - 1, msg);
            break;
        }
        for (int i = 0; i < n; i++) score_row(r, b, logits, C, i, r0 + i, hyp, work);
    }
    ab_free(logits);
    free(hyp);
    free(work);
    free(idx);
    return rc;
}

int decode_run(const char *checkpoint, const decode_opts *opts, decode_result *r) {
    memset(r, 0, sizeof *r);
    /* the config first, for the run's batch (and a refusal of the file as the command
     * has always made it, whatever --batch) */
    int batch, rc;
    if ((rc = run_batch(checkpoint, &batch))) return rc;
    if (opts->batch) batch = opts->batch;
    tf_model *m;
    if ((rc = train_ckpt_load_model(checkpoint, batch, 0, opts->device, NULL, &r->cfg, &m, &r->meta))) {
        memset(r, 0, sizeof *r);
        return rc;
    }
    const train_task *task = r->cfg.task;
    task_batch b = {0};
    if (tf_get_config(m)->head != TF_HEAD_CTC || !task->fill_labels || !task_is_dataset(task))
        rc = ab_fail(AB_EINVAL, "decode: the model of %s has no ctc head (task '%s'): nothing to decode", checkpoint,
                     task->name);
    if (!rc) rc = find_split(&r->cfg, opts->split, &r->split);
    if (!rc) {
        const long long all = task->split_rows[r->split];
        r->rows = opts->n == 0 || opts->n > all ? all : opts->n;
        rc = task_batch_alloc(task, batch, &b);
    }
    if (!rc) {
        r->utterances = json_array();
        rc = decode_rows(r, m, batch, &b);
    }
    r->per = r->ref_labels ? (double)r->errors / (double)r->ref_labels : NAN;
    task_batch_free(&b);
    tf_destroy(m);
    if (rc) decode_result_free(r);
    return rc;
}

void decode_result_free(decode_result *r) {
    if (r->cfg.task) train_config_free(&r->cfg);
    json_decref(r->utterances);
    memset(r, 0, sizeof *r);
}

json_t *decode_document(decode_result *r, const char *checkpoint, ab_device device, const char *command_line) {
    const train_config *cfg = &r->cfg;
    const train_task *task = cfg->task;
    json_t *doc = json_object();
    json_object_set_new(doc, "schema", json_string("attnbench/decode/1"));
    json_object_set_new(doc, "command", json_string(command_line));
    json_object_set_new(doc, "checkpoint", json_string(checkpoint));
    json_object_set_new(doc, "run", json_string(cfg->name));
    json_object_set_new(doc, "label", json_string(cfg->label));
    json_object_set_new(doc, "step", json_integer((json_int_t)r->meta.step));
    json_object_set_new(doc, "task", json_string(task->name));
    json_object_set_new(doc, "body", json_string(tf_body_name(cfg->model.body)));
    if (cfg->model.body == TF_BODY_TRANSFORMER) json_object_set_new(doc, "variant", json_string(cfg->model.attention));
    json_object_set_new(doc, "split", json_string(task->split_names[r->split]));
    json_object_set_new(doc, "rows", json_integer(r->rows));
    json_object_set_new(doc, "split_rows", json_integer(task->split_rows[r->split]));
    json_object_set_new(doc, "decoding", json_string("best path"));
    json_object_set_new(doc, "errors", json_integer(r->errors));
    json_object_set_new(doc, "ref_labels", json_integer(r->ref_labels));
    json_object_set_new(doc, "per", ab_json_num(r->per));
    json_object_set_new(doc, "exact_rows", json_integer(r->exact));
    json_object_set_new(doc, "device", json_string(device == AB_DEV_CUDA ? "cuda" : "cpu"));
    json_object_set_new(doc, "threads", json_integer(ab_threads()));
    json_object_set_new(doc, "git", ab_git_info()); /* the source's commit, and whether it was clean */
    json_object_set_new(doc, "utterances", r->utterances);
    r->utterances = NULL;
    return doc;
}
