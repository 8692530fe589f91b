/* Generation from a checkpoint, scored and timed (gen_run.h). */
#include "gen_run.h"

#include "blas.h"
#include "error.h"
#include "memory.h"
#include "results.h"
#include "timer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The request against the model, in the order the command has always checked it. */
static int check_request(const train_task *task, tf_model *m, const gen_opts *o, gen_result *r) {
    if (task->max_prompt <= 0 || !task->prompt)
        return ab_fail(AB_EINVAL, "generate: the task '%s' has no generation prompts", task->name);
    r->seed = o->have_seed ? o->seed : r->cfg.seed;
    r->recurrent = o->mode == SAMPLE_MODE_RECURRENT || (o->mode == SAMPLE_MODE_AUTO && tf_has_recurrent(m));
    if (r->recurrent && !tf_has_recurrent(m)) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ab_error());
        return ab_fail(AB_EINVAL, "generate --mode recurrent: %s", msg);
    }
    ab_clear_error();
    if (task->input != TASK_INPUT_TOKENS)
        return ab_fail(AB_EINVAL, "generate: the task '%s' does not take tokens", task->name);
    return 0;
}

/* Prompt k: drawn, decoded into seq after it (P + G tokens), scored. */
static int gen_prompt(tf_model *m, tf_gen *g, const gen_opts *o, long long k, int *prompt, int *expected, int *seq,
                      float *logits, gen_result *r) {
    const train_task *task = r->cfg.task;
    const int N = task->seq_len, V = tf_classes(m);
    const uint64_t attn_seed = tf_step_seed(r->cfg.seed, TRAIN_EVAL_STEP);
    ab_rng rng = task_row_rng(r->seed, TASK_STREAM_GEN, (uint64_t)k, 0);
    int P, G;
    task->prompt(task, &rng, prompt, &P, expected, &G);
    memcpy(seq, prompt, sizeof(int) * (size_t)P);
    uint64_t t0 = ab_now_ns();
    for (int j = 0; j < G; j++) {
        int rc;
        if (!g) rc = tf_last_logits(m, seq, 1, P + j, attn_seed, logits);
        else if (j > 0) rc = tf_gen_step(g, &seq[P + j - 1], logits);
        else if (!(rc = tf_gen_init(g))) rc = tf_gen_prefill(g, seq, P, logits);
        if (rc) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", ab_error());
            return ab_fail(rc, "generate: prompt %lld, token %d: %s", k, j, msg);
        }
        const uint64_t idx = (uint64_t)k * (uint64_t)(N + 1) + (uint64_t)j;
        seq[P + j] = o->temperature > 0
                         ? sample_draw(logits, V, o->temperature, ab_rng_uniform(r->seed, TASK_STREAM_SAMPLE, idx))
                         : sample_draw(logits, V, 0, 0); /* greedy: the first largest */
    }
    r->wall_s += (double)(ab_now_ns() - t0) * 1e-9;
    bool all = true;
    for (int j = 0; j < G; j++) {
        bool ok = seq[P + j] == expected[j];
        r->correct += ok;
        all &= ok;
    }
    r->exact += all;
    r->generated += G;
    r->prompt_tokens += P;
    if (r->tokens) {
        json_t *row = json_array();
        for (int j = 0; j < G; j++) json_array_append_new(row, json_integer(seq[P + j]));
        json_array_append_new(r->tokens, row);
    }
    return 0;
}

int gen_run(const char *checkpoint, const gen_opts *opts, gen_result *r) {
    memset(r, 0, sizeof *r);
    tf_model *m;
    int rc = train_ckpt_load_model(checkpoint, 1, 0, opts->device, NULL, &r->cfg, &m, &r->meta);
    if (rc) {
        memset(r, 0, sizeof *r);
        return rc;
    }
    const train_task *task = r->cfg.task;
    int *prompt = NULL, *expected = NULL, *seq = NULL;
    float *logits = NULL;
    tf_gen *g = NULL;
    if ((rc = check_request(task, m, opts, r))) goto done;
    const int N = task->seq_len;
    prompt = malloc(sizeof(int) * (size_t)N);
    expected = malloc(sizeof(int) * (size_t)(task->max_gen + 1));
    seq = malloc(sizeof(int) * (size_t)(N + 1));
    logits = malloc(sizeof(float) * (size_t)tf_classes(m));
    if (!prompt || !expected || !seq || !logits) {
        rc = ab_fail(AB_ENOMEM, "out of memory");
        goto done;
    }
    if (r->recurrent && (rc = tf_gen_create(m, 1, N, &g))) goto done;
    /* both modes draw the attention's random choices alike */
    tf_gen_set_seed(g, tf_step_seed(r->cfg.seed, TRAIN_EVAL_STEP));
    r->tokens = opts->keep_tokens ? json_array() : NULL;
    for (long long k = 0; k < opts->n && !rc; k++) rc = gen_prompt(m, g, opts, k, prompt, expected, seq, logits, r);
    r->prompts = opts->n;
    r->accuracy = r->generated ? (double)r->correct / (double)r->generated : NAN;
    r->exact_rate = (double)r->exact / (double)opts->n;
done:
    tf_gen_destroy(g);
    tf_destroy(m);
    free(prompt);
    free(expected);
    free(seq);
    free(logits);
    if (rc) gen_result_free(r);
    return rc;
}

void gen_result_free(gen_result *r) {
    if (r->cfg.task) train_config_free(&r->cfg);
    json_decref(r->tokens);
    memset(r, 0, sizeof *r);
}

json_t *gen_document(gen_result *r, const gen_opts *opts, const char *checkpoint, const char *command_line) {
    const train_config *cfg = &r->cfg;
    json_t *doc = json_object();
    json_object_set_new(doc, "schema", json_string("attnbench/generate/1"));
    json_object_set_new(doc, "command", json_string(command_line));
    json_object_set_new(doc, "checkpoint", json_string(checkpoint));
    json_object_set_new(doc, "run", json_string(cfg->name));
    json_object_set_new(doc, "step", json_integer((json_int_t)r->meta.step));
    json_object_set_new(doc, "task", json_string(cfg->task->name));
    json_object_set_new(doc, "variant", json_string(cfg->model.attention));
    json_object_set_new(doc, "mode", json_string(r->recurrent ? "recurrent" : "recompute"));
    json_object_set_new(doc, "decoding", json_string(opts->temperature > 0 ? "sample" : "greedy"));
    json_object_set_new(doc, "temperature", json_real(opts->temperature));
    json_object_set_new(doc, "device", json_string(ab_device_name(opts->device)));
    json_object_set_new(doc, "seed", json_integer((json_int_t)r->seed));
    json_object_set_new(doc, "prompts", json_integer(r->prompts));
    json_object_set_new(doc, "prompt_tokens", json_integer(r->prompt_tokens));
    json_object_set_new(doc, "tokens_generated", json_integer(r->generated));
    json_object_set_new(doc, "correct", json_integer(r->correct));
    json_object_set_new(doc, "accuracy", ab_json_num(r->accuracy));
    json_object_set_new(doc, "exact_sequences", json_integer(r->exact));
    json_object_set_new(doc, "exact_rate", ab_json_num(r->exact_rate));
    json_object_set_new(doc, "wall_s", ab_json_num(r->wall_s));
    json_object_set_new(doc, "tokens_per_s", ab_json_num(r->wall_s > 0 ? (double)r->generated / r->wall_s : NAN));
    json_object_set_new(doc, "threads", json_integer(ab_threads()));
    json_object_set_new(doc, "peak_bytes", json_integer((json_int_t)ab_mem_peak(AB_DEV_CPU)));
    if (opts->device == AB_DEV_CUDA)
        json_object_set_new(doc, "device_peak_bytes", json_integer((json_int_t)ab_mem_peak(AB_DEV_CUDA)));
    json_object_set_new(doc, "machine", ab_machine_info());
    json_object_set_new(doc, "git", ab_git_info()); /* the source's commit, and whether it was clean */
    if (r->tokens) {
        json_object_set_new(doc, "generated", r->tokens);
        r->tokens = NULL;
    }
    return doc;
}
