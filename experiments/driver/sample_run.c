/* Sampling rows from a model, and its timing (sample_run.h). */
#include "sample_run.h"

#include "blas.h"
#include "config.h"
#include "cuda_traffic.h"
#include "device.h"
#include "draw_core.h"
#include "error.h"
#include "fileio.h"
#include "layers.h"
#include "memory.h"
#include "results.h"
#include "sweep.h"
#include "timer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool sample_mode_parse(const char *s, sample_mode *mode) {
    if (strcmp(s, "auto") == 0) *mode = SAMPLE_MODE_AUTO;
    else if (strcmp(s, "recurrent") == 0) *mode = SAMPLE_MODE_RECURRENT;
    else if (strcmp(s, "recompute") == 0) *mode = SAMPLE_MODE_RECOMPUTE;
    else return false;
    return true;
}

int sample_draw(const float *x, int n, double T, double u) { return draw_categorical_core(x, n, T, u); }

/* The first n tokens of each of the B rows of tokens (B, N), contiguous (B, n) in out. */
static const int *take_prefix(int *out, const int *tokens, int B, int N, int n) {
    for (int b = 0; b < B; b++) memcpy(out + (size_t)b * n, tokens + (size_t)b * N, sizeof(int) * (size_t)n);
    return out;
}

/* The message of the failure just seen, prefixed (ab_error's buffer is the one
 * ab_fail writes: it is copied first). */
static int fail_with(int rc, const char *prefix) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ab_error());
    return ab_fail(rc, "%s%s", prefix, msg);
}

int sample_grid_write(const char *path, const int *img, const int *below, int n, int h, int w, int c, int cols,
                      int *gw, int *gh) {
    const int bands = (n + cols - 1) / cols, per_band = below ? 2 : 1;
    *gw = cols * (w + 1) - 1;
    *gh = bands * per_band * (h + 1) - 1;
    ab_atomic_file af;
    int rc = ab_atomic_open(&af, path);
    if (rc) return rc;
    for (int y = 0; y < *gh; y++) {
        int band = y / (per_band * (h + 1)), yy = y % (per_band * (h + 1)), sub = yy / (h + 1), py = yy % (h + 1);
        const int *src = below && sub == 1 ? below : img;
        for (int x = 0; x < *gw; x++) {
            int col = x / (w + 1), px = x % (w + 1), k = band * cols + col;
            int rgb[3] = {128, 128, 128}; /* the gaps: mid-grey, apart from black and white images */
            if (px < w && py < h && k < n) {
                const int *p = src + (((size_t)k * h + py) * w + px) * c;
                for (int ch = 0; ch < 3; ch++) rgb[ch] = p[c == 3 ? ch : 0];
            }
            fprintf(af.f, "%d\t%d\t%d\t%d\t%d\n", x, y, rgb[0], rgb[1], rgb[2]);
        }
    }
    return ab_atomic_commit(&af);
}

/* The model a training config initialises (its seed), with --set overrides and an
 * optional stand-in variant, for B rows on `device`, forwards of at most forward_len
 * positions (0: max_len). 0 or an error code with a message. */
static int config_model(const sample_source *src, int B, int forward_len, train_config *cfg, tf_model **m) {
    *m = NULL;
    json_t *root = ab_config_load(src->config);
    if (!root) return AB_EINVAL;
    int rc = train_config_apply_sets(root, src->sets, src->n_sets);
    if (!rc) rc = train_config_parse(root, cfg);
    json_decref(root);
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ab_error());
        return ab_fail(rc, "%s: %s", src->config, msg);
    }
    if (src->variant) {
        if (cfg->model.body != TF_BODY_TRANSFORMER)
            rc = ab_fail(AB_EINVAL, "%s: the model's body is %s: it has no attention variant to change", src->config,
                         tf_body_name(cfg->model.body));
        else if (!train_variant_interchangeable(cfg->model.attention, src->variant)) rc = AB_EINVAL;
        else cfg->model.attention = src->variant;
    }
    cfg->model.device = src->device;
    cfg->model.forward_len = forward_len;
    if (!rc) rc = tf_create_inference(&cfg->model, B, m);
    if (rc) train_config_free(cfg);
    return rc;
}

/* The request against the model: sample_open's checks, in the order the command has
 * always made them (the first refusal is the one reported). */
static int check_request(sample_session *s) {
    const train_task *task = s->cfg.task;
    const sample_opts *o = &s->opts;
    if (!task->samplable || task->input != TASK_INPUT_TOKENS)
        return ab_fail(AB_EINVAL, "sample: the task '%s' is not predicted value by value behind a start token "
                                  "(sample takes image and sequence tasks)", task->name);
    if (s->cfg.model.head == TF_HEAD_LOGISTIC_MIXTURE && o->temperature != 0 && o->temperature != 1)
        return ab_fail(AB_EINVAL, "sample --temperature %g: a logistic-mixture head samples at 1 (ancestral) or "
                                  "takes the most probable value at 0, nothing between", o->temperature);
    s->seed = o->have_seed ? o->seed : s->cfg.seed;
    s->recurrent = o->mode == SAMPLE_MODE_RECURRENT || (o->mode == SAMPLE_MODE_AUTO && tf_has_recurrent(s->m));
    if (s->recurrent && !tf_has_recurrent(s->m)) return fail_with(AB_EINVAL, "sample --mode recurrent: ");
    ab_clear_error();
    s->N = task->seq_len;
    if (o->graph && (s->src.device != AB_DEV_CUDA || !s->recurrent))
        return ab_fail(AB_EINVAL, "sample --graph: records a recurrent step on CUDA, and this %s",
                       s->src.device != AB_DEV_CUDA ? "runs on the CPU (--device cuda)"
                                                    : "model samples by recomputation");
    if (o->traffic) {
        if (!s->recurrent)
            return ab_fail(AB_EINVAL, "sample --traffic: counts a recurrent step, and this model samples by "
                                      "recomputation (variant '%s')", s->cfg.model.attention);
        if (s->src.device != AB_DEV_CUDA || !ab_cuda_traffic_counted())
            return ab_fail(AB_EINVAL, "sample --traffic: this process does not count memory traffic (the "
                                      "emulated build does: attnbench-emu ... --device cuda)");
        if (o->traffic >= s->N)
            return ab_fail(AB_EINVAL, "sample --traffic %d: a row has positions 0..%d (the step at position 0 is "
                                      "the prefill)", o->traffic, s->N - 1);
    }
    s->P = (int)floor(o->complete * s->N); /* values kept from the test rows */
    s->test = -1;
    if (o->complete > 0) {
        s->test = task_split_find(task, "test");
        if (s->test < 0) s->test = task->n_splits - 1;
        if (s->test < 0 || task->split_rows[s->test] < 1)
            return ab_fail(AB_EINVAL, "sample --complete: the task '%s' has no test rows to complete", task->name);
    }
    return 0;
}

static int open_model(sample_session *s, int forward_len) {
    const sample_source *src = &s->src;
    int rc = src->checkpoint ? train_ckpt_load_model(src->checkpoint, s->opts.batch, forward_len, src->device,
                                                     src->variant, &s->cfg, &s->m, &s->meta)
                             : config_model(src, s->opts.batch, forward_len, &s->cfg, &s->m);
    if (rc) s->m = NULL;
    return rc;
}

int sample_opts_check(const sample_opts *o) {
    if (o->batch < 1 || o->n % o->batch)
        return ab_fail(AB_EINVAL, "sample: --n %lld is not a multiple of --batch %d", o->n, o->batch);
    if (o->estimate && o->complete > 0) return ab_fail(AB_EINVAL, "sample: --estimate and --complete exclude each other");
    if (o->traffic && (o->estimate || o->complete > 0))
        return ab_fail(AB_EINVAL, "sample: --traffic excludes --%s", o->estimate ? "estimate" : "complete");
    if (o->graph && o->estimate) /* each timed step follows its own prefill: it would time the recording */
        return ab_fail(AB_EINVAL, "sample: --graph excludes --estimate (each estimated step is the first after a "
                                  "prefill, which records the graph)");
    return 0;
}

void sample_summary(const sample_session *s, const sample_result *r, const char *dir, char *buf, size_t cap) {
    if (r->traffic) {
        const json_t *t = r->traffic;
        snprintf(buf, cap, "sample: the step at position %d, batch %d: %.4g MiB moved, %.3gx its minimal bytes, %lld "
                 "operations -> %s", s->opts.traffic, s->opts.batch,
                 (json_number_value(json_object_get(t, "dram_read_bytes")) +
                  json_number_value(json_object_get(t, "dram_write_bytes"))) / 1048576.0,
                 json_number_value(json_object_get(t, "dram_over_min")),
                 (long long)json_integer_value(json_object_get(t, "launches")), dir);
        return;
    }
    const double images = (double)r->n;
    const int n = snprintf(buf, cap, "sample: %lld rows of %d values (%d kept), %s, %s%.3g s/image, %.3g images/s at "
                           "batch %d -> %s", r->n, s->N, s->P, s->recurrent ? "recurrent" : "recompute",
                           r->samples ? "" : "estimated ", r->wall_s / images, r->wall_s > 0 ? images / r->wall_s : NAN,
                           s->opts.batch, dir);
    if (!s->opts.graph || n < 0 || (size_t)n >= cap) return;
    if (r->graph_note[0]) snprintf(buf + n, cap - (size_t)n, " (steps without a CUDA graph: %s)", r->graph_note);
    else snprintf(buf + n, cap - (size_t)n, " (%lld CUDA graph launches)", r->graph_launches);
}

void sample_grid_title(const sample_session *s, const sample_result *r, char *buf, size_t cap) {
    snprintf(buf, cap, "%s, %s, %s%s", s->cfg.name, s->cfg.model.attention ? s->cfg.model.attention : "",
             r->originals ? "completions under the originals" : "samples", s->opts.temperature == 1 ? "" : " (T != 1)");
}

int sample_open(sample_session *s, const sample_source *src, const sample_opts *opts) {
    memset(s, 0, sizeof *s);
    s->src = *src;
    s->opts = *opts;
    s->meta.step = -1;
    /* Sampling as an RNN from the start token runs no forward longer than that token's
     * prefill: a model sized for it needs (B, 1) activations, not (B, N) (MNIST's shape
     * at batch 4096: 145 GB for the whole rows). Completions and estimates prefill
     * longer prompts, recomputation whole prefixes: the model's full length. */
    const bool short_fwd = opts->mode != SAMPLE_MODE_RECOMPUTE && opts->complete == 0 && opts->estimate == 0;
    /* (--traffic, too: it prefills the start token and steps from there, as sampling) */
    int rc = open_model(s, short_fwd ? 1 : 0);
    if (!rc && short_fwd && opts->mode == SAMPLE_MODE_AUTO && !tf_has_recurrent(s->m)) {
        /* auto resolves to recomputation for this variant: the full length after all */
        sample_close(s);
        ab_clear_error();
        rc = open_model(s, 0);
    }
    if (rc) return rc;
    if ((rc = check_request(s))) sample_close(s);
    return rc;
}

void sample_close(sample_session *s) {
    if (!s->m) return;
    tf_destroy(s->m);
    train_config_free(&s->cfg);
    s->m = NULL;
}

void sample_result_free(sample_result *r) {
    free(r->samples);
    free(r->originals);
    free(r->at);
    free(r->secs);
    free(r->cpu_secs);
    json_decref(r->traffic);
    memset(r, 0, sizeof *r);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The sum over positions 0..pos[n-1] of a cost measured at pos[0] = 0 < pos[1] < ..,
 * linear in between. */
static double integrate(const int *pos, const double *cost, int n) {
    double total = cost[0];
    for (int p = 1; p < n; p++) { /* positions pos[p-1]+1 .. pos[p] */
        const double span = pos[p] - pos[p - 1];
        for (int j = pos[p - 1] + 1; j <= pos[p]; j++)
            total += cost[p - 1] + (cost[p] - cost[p - 1]) * (double)(j - pos[p - 1]) / span;
    }
    return total;
}

/* The buffers a run draws with: B rows of N tokens, their contiguous prefixes, the
 * values just drawn, the logits (B, V). */
typedef struct {
    int *tokens, *prefix, *next;
    float *logits;
} sample_bufs;

enum { EST_REPEATS = 3 };

/* The draw of value j of rows i0.. (the uniforms of row b at i0 + b, value j). */
static draw_spec draw_at(const sample_session *s, long long i0, int j) {
    const draw_spec d = {s->cfg.model.head == TF_HEAD_LOGISTIC_MIXTURE,
                         0,
                         s->opts.temperature,
                         s->seed,
                         TASK_STREAM_SAMPLE,
                         TASK_STREAM_SAMPLE2,
                         (uint64_t)i0 * (uint64_t)s->N + (uint64_t)j,
                         (uint64_t)s->N};
    return d;
}

/* Whether sampling draws on the device (sample_rows; as an RNN the draws then stay
 * there) */
static bool draws_on_device(const sample_session *s) {
    return !(s->cfg.model.head == TF_HEAD_LOGISTIC_MIXTURE && s->opts.temperature == 0);
}

/* The generator's draw d, kept on the device, and a wait for the device (the estimate
 * times each operation alone). */
static int draw_and_wait(sample_session *s, tf_gen *g, const draw_spec *d) {
    int rc = tf_gen_draw(g, d);
    return rc ? rc : ab_dev_sync(tf_device(s->m));
}

/* One recurrent step of the estimate as sampling makes it: with the draws kept on the
 * device, a step from the last draws and the next draw, waited for; otherwise a step
 * from k->next with its logits copied back. */
static int estimate_step(sample_session *s, tf_gen *g, sample_bufs *k, int j) {
    if (!draws_on_device(s)) return tf_gen_step(g, k->next, k->logits);
    const draw_spec d = draw_at(s, 0, j);
    int rc = tf_gen_step(g, NULL, NULL);
    return rc ? rc : draw_and_wait(s, g, &d);
}

/* The time of value j of B rows, REPEATS times into t and tc (wall and CPU seconds):
 * recompute: one forward over the prefix of j + 1 inputs; recurrent: an untimed prefill
 * of j inputs (or of the one input at j = 0: the prefill is what sampling times there),
 * then one timed step (the repeats are the steps at j, j + 1, j + 2), each with its
 * draw where sampling draws on the device. */
static int estimate_at(sample_session *s, tf_gen *g, uint64_t attn_seed, sample_bufs *k, int j, double *t, double *tc) {
    const int B = s->opts.batch, N = s->N;
    const bool kept = draws_on_device(s);
    float *logits = kept ? NULL : k->logits;
    int rc = 0;
    if (!g) {
        const draw_spec d = draw_at(s, 0, j);
        for (int r = 0; r < EST_REPEATS && !rc; r++) {
            uint64_t t0 = ab_now_ns(), c0 = ab_cpu_ns();
            rc = tf_last_logits(s->m, take_prefix(k->prefix, k->tokens, B, N, j + 1), B, j + 1, attn_seed, logits);
            if (!rc && kept) rc = tf_draw_last(s->m, &d, k->next);
            t[r] = (double)(ab_now_ns() - t0) * 1e-9;
            tc[r] = (double)(ab_cpu_ns() - c0) * 1e-9;
        }
        return rc;
    }
    if ((rc = tf_gen_init(g))) return rc;
    const int P = j > 0 ? j : 1; /* j = 0: the timed prefill of the start token */
    const draw_spec d = draw_at(s, 0, P - 1);
    uint64_t t0 = ab_now_ns(), c0 = ab_cpu_ns();
    rc = tf_gen_prefill(g, take_prefix(k->prefix, k->tokens, B, N, P), P, logits);
    if (!rc && kept) rc = draw_and_wait(s, g, &d);
    double prefill_s = (double)(ab_now_ns() - t0) * 1e-9, prefill_cpu = (double)(ab_cpu_ns() - c0) * 1e-9;
    for (int r = 0; r < EST_REPEATS && !rc; r++) {
        if (j == 0) {
            t[r] = prefill_s; /* one measurement: repeat it */
            tc[r] = prefill_cpu;
            continue;
        }
        if (tf_gen_position(g) >= N) { /* the last positions: a step from j again */
            if (!(rc = tf_gen_init(g)) &&
                !(rc = tf_gen_prefill(g, take_prefix(k->prefix, k->tokens, B, N, j), j, logits)) && kept)
                rc = draw_and_wait(s, g, &d); /* the timed step alone */
            if (rc) break;
        }
        t0 = ab_now_ns();
        c0 = ab_cpu_ns();
        rc = estimate_step(s, g, k, tf_gen_position(g));
        t[r] = (double)(ab_now_ns() - t0) * 1e-9;
        tc[r] = (double)(ab_cpu_ns() - c0) * 1e-9;
    }
    return rc;
}

/* The estimate: the time to produce value j of B rows (logits of position j from the
 * inputs 0..j) at j = 0, every, 2 every, .., and N-1, each the median of the repeats,
 * summed over all N positions with the cost between two measured positions
 * interpolated linearly; the same for the process's CPU time. The inputs are the start
 * token and then value 0: the time does not depend on them. */
static int estimate(sample_session *s, tf_gen *g, uint64_t attn_seed, sample_bufs *k, sample_result *r) {
    const int B = s->opts.batch, N = s->N, every = s->opts.estimate, start = s->cfg.task->classes;
    const int cap = N / every + 2;
    r->at = malloc(sizeof(int) * (size_t)cap);
    r->secs = malloc(sizeof(double) * (size_t)cap);
    r->cpu_secs = malloc(sizeof(double) * (size_t)cap);
    if (!r->at || !r->secs || !r->cpu_secs)
        return ab_fail(AB_ENOMEM, "out of memory for the estimate's %d positions", cap);
    int n = 0;
    for (int j = 0; j < N; j += every) r->at[n++] = j;
    if (r->at[n - 1] != N - 1) r->at[n++] = N - 1;
    for (int b = 0; b < B; b++) {
        k->tokens[(size_t)b * N] = start;
        for (int j = 1; j < N; j++) k->tokens[(size_t)b * N + j] = 0;
        k->next[b] = 0;
    }
    for (int p = 0; p < n; p++) {
        double t[EST_REPEATS], tc[EST_REPEATS];
        int rc = estimate_at(s, g, attn_seed, k, r->at[p], t, tc);
        if (rc) {
            char prefix[64];
            snprintf(prefix, sizeof prefix, "sample --estimate: value %d: ", r->at[p]);
            return fail_with(rc, prefix);
        }
        qsort(t, EST_REPEATS, sizeof(double), cmp_double);
        qsort(tc, EST_REPEATS, sizeof(double), cmp_double);
        r->secs[p] = t[EST_REPEATS / 2];
        r->cpu_secs[p] = tc[EST_REPEATS / 2];
    }
    r->n_points = n;
    r->n = B; /* an estimate is for one batch of rows */
    r->wall_s = integrate(r->at, r->secs, n);
    r->cpu_s = integrate(r->at, r->cpu_secs, n);
    return 0;
}

/* The least a step at position t of B rows and its draw must move (sample_run.h):
 * read and write bytes, and their parts in *parts. */
static int step_min_bytes(const sample_session *s, int t, double *read, double *write, json_t **parts) {
    const tf_model *m = s->m;
    const tf_config *c = &s->cfg.model;
    const int B = s->opts.batch;
    size_t tok = 0;
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *e = tf_param_tensor(m, i);
        if (strcmp(e->name, "tok_emb") == 0) tok = e->count;
    }
    const double rows = B < c->vocab ? B : c->vocab;
    const double weights = 4.0 * (double)(tf_param_count(m) - tok), emb = 4.0 * (rows + 1.0) * c->d_model;
    const attn_shape sh = tf_gen_step_shape(m, B);
    double sr = 0, sw = 0;
    int rc = sweep_min_state_bytes(tf_attention(m), &sh, t, &sr, &sw);
    if (rc) return rc;
    sr *= c->layers;
    sw *= c->layers;
    const double values = 4.0 * B;
    *read = weights + emb + sr + values;
    *write = sw + values;
    *parts = json_pack("{s:I, s:I, s:I, s:I, s:I}", "weights_read_bytes", (json_int_t)weights, "embedding_read_bytes",
                       (json_int_t)emb, "state_read_bytes", (json_int_t)sr, "state_write_bytes", (json_int_t)sw,
                       "values_bytes", (json_int_t)values);
    return *parts ? 0 : ab_fail(AB_ENOMEM, "out of memory for the traffic's record");
}

/* The traffic of the step at position T (sample_run.h): the start token's prefill and
 * steps to T - 1, as sampling makes them, then the step at T and its draw counted. */
static int count_traffic(sample_session *s, tf_gen *g, sample_bufs *k, sample_result *r) {
    const int B = s->opts.batch, T = s->opts.traffic;
    const bool kept = draws_on_device(s);
    float *logits = kept ? NULL : k->logits;
    for (int b = 0; b < B; b++) k->prefix[b] = s->cfg.task->classes, k->next[b] = 0;
    int rc = tf_gen_init(g);
    if (!rc) rc = tf_gen_prefill(g, k->prefix, 1, logits);
    if (!rc && kept) {
        const draw_spec d = draw_at(s, 0, 0);
        rc = draw_and_wait(s, g, &d);
    }
    while (!rc && tf_gen_position(g) < T) rc = estimate_step(s, g, k, tf_gen_position(g));
    if (!rc) rc = ab_dev_sync(tf_device(s->m));
    if (rc) return fail_with(rc, "sample --traffic: the steps before: ");
    double min_r, min_w;
    json_t *parts = NULL;
    if ((rc = step_min_bytes(s, T, &min_r, &min_w, &parts))) return fail_with(rc, "sample --traffic: ");
    ab_cuda_traffic_start();
    rc = estimate_step(s, g, k, tf_gen_position(g));
    if (!rc) rc = ab_dev_sync(tf_device(s->m));
    ab_cuda_traffic_stop();
    if (rc) {
        json_decref(parts);
        return fail_with(rc, "sample --traffic: the step: ");
    }
    r->traffic = sweep_traffic_json("model step and draw", min_r, min_w);
    if (!r->traffic) {
        json_decref(parts);
        return ab_fail(AB_ENOMEM, "out of memory for the traffic's record");
    }
    json_object_set_new(r->traffic, "position", json_integer(T));
    json_object_set_new(r->traffic, "min_parts", parts);
    r->n = B;
    return 0;
}

/* Rows i0 .. i0 + B - 1: the prompts (START, then the first P values of test rows, the
 * originals kept), then value by value, timed from the first logits to the last draw. */
static int sample_rows(sample_session *s, tf_gen *g, uint64_t attn_seed, sample_bufs *k, task_batch *tb,
                       long long *rows, long long i0, sample_result *r) {
    const train_task *task = s->cfg.task;
    const int B = s->opts.batch, N = s->N, P = s->P, V = tf_classes(s->m), K = s->cfg.model.mixtures;
    for (int b = 0; b < B; b++) k->tokens[(size_t)b * N] = task->classes; /* the start token */
    if (P > 0) {
        for (int b = 0; b < B; b++) rows[b] = (i0 + b) % task->split_rows[s->test];
        task_batch_fill_rows(task, s->test, rows, B, tb);
        for (int b = 0; b < B; b++) {
            const int *x = tb->targets + (size_t)b * tb->N;
            memcpy(r->originals + (size_t)(i0 + b) * N, x, sizeof(int) * (size_t)N);
            memcpy(r->samples + (size_t)(i0 + b) * N, x, sizeof(int) * (size_t)P);
            for (int j = 1; j <= P && j < N; j++) k->tokens[(size_t)b * N + j] = x[j - 1];
        }
    }
    /* the draws on the model's device (the logits stay there), but a mixture's most
     * probable value (T = 0), which the host computes from them. As an RNN the draws
     * stay there too (tf_gen_draw: each the next step's input), and come back once. */
    const bool on_device = draws_on_device(s), kept = on_device && g;
    float *logits = on_device ? NULL : k->logits;
    const uint64_t t0 = ab_now_ns(), c0 = ab_cpu_ns();
    for (int j = P; j < N; j++) {
        /* logits (B, V) predicting value j, from the inputs 0..j */
        int rc;
        if (!g) {
            const int *in = take_prefix(k->prefix, k->tokens, B, N, j + 1);
            rc = tf_last_logits(s->m, in, B, j + 1, attn_seed, logits);
        } else if (j > P) {
            rc = tf_gen_step(g, kept ? NULL : k->next, logits);
        } else if (!(rc = tf_gen_init(g))) {
            rc = tf_gen_prefill(g, take_prefix(k->prefix, k->tokens, B, N, P + 1), P + 1, logits);
        }
        if (!rc && on_device) {
            const draw_spec d = draw_at(s, i0, j);
            rc = kept ? tf_gen_draw(g, &d) : tf_draw_last(s->m, &d, k->next);
        }
        if (rc) {
            char prefix[96];
            snprintf(prefix, sizeof prefix, "sample: rows %lld.., value %d: ", i0, j);
            return fail_with(rc, prefix);
        }
        for (int b = 0; !kept && b < B; b++) {
            const int x = on_device ? k->next[b] : mixture_mode(k->logits + (size_t)b * V, K);
            r->samples[(size_t)(i0 + b) * N + j] = x;
            k->next[b] = x;
            if (j + 1 < N) k->tokens[(size_t)b * N + j + 1] = x;
        }
    }
    if (kept) { /* the generator's table (B x N, its capacity): values P..N-1 */
        int rc = tf_gen_draws(g, k->tokens);
        if (rc) return fail_with(rc, "sample: the drawn values: ");
        for (int b = 0; b < B; b++)
            memcpy(r->samples + (size_t)(i0 + b) * N + P, k->tokens + (size_t)b * N + P, sizeof(int) * (size_t)(N - P));
    }
    r->wall_s += (double)(ab_now_ns() - t0) * 1e-9;
    r->cpu_s += (double)(ab_cpu_ns() - c0) * 1e-9;
    return 0;
}

int sample_run(sample_session *s, sample_result *r) {
    memset(r, 0, sizeof *r);
    const int B = s->opts.batch, N = s->N, P = s->P, V = tf_classes(s->m);
    const long long K = s->opts.n;
    const bool draws = !s->opts.estimate && !s->opts.traffic;
    sample_bufs k = {malloc(sizeof(int) * (size_t)B * (size_t)N), malloc(sizeof(int) * (size_t)B * (size_t)N),
                     calloc((size_t)B, sizeof(int)), malloc(sizeof(float) * (size_t)B * (size_t)V)};
    long long *rows = malloc(sizeof(long long) * (size_t)B);
    if (draws) {
        r->samples = malloc(sizeof(int) * (size_t)K * (size_t)N);
        r->originals = P > 0 ? malloc(sizeof(int) * (size_t)K * (size_t)N) : NULL;
    }
    task_batch tb = {0};
    tf_gen *g = NULL;
    int rc = 0;
    if (!k.tokens || !k.prefix || !k.next || !k.logits || !rows || (draws && !r->samples) ||
        (draws && P > 0 && !r->originals))
        rc = ab_fail(AB_ENOMEM, "out of memory for %lld samples of %d values", K, N);
    if (!rc && P > 0) rc = task_batch_alloc(s->cfg.task, B, &tb);
    if (!rc && s->recurrent) rc = tf_gen_create(s->m, B, N, &g);
    if (!rc && g && s->opts.graph) rc = tf_gen_set_graph(g, true);
    const uint64_t attn_seed = tf_step_seed(s->cfg.seed, TRAIN_EVAL_STEP);
    tf_gen_set_seed(g, attn_seed); /* both modes draw the attention's random choices alike */
    if (!rc && s->opts.traffic) rc = count_traffic(s, g, &k, r);
    else if (!rc && !draws) rc = estimate(s, g, attn_seed, &k, r);
    for (long long i0 = 0; !rc && draws && i0 < K; i0 += B) rc = sample_rows(s, g, attn_seed, &k, &tb, rows, i0, r);
    if (!rc && draws) r->n = K;
    if (g) {
        const char *note = tf_gen_graph_note(g, &r->graph_records, &r->graph_launches);
        snprintf(r->graph_note, sizeof r->graph_note, "%s", note ? note : "");
    }
    tf_gen_destroy(g);
    task_batch_free(&tb);
    free(k.tokens);
    free(k.prefix);
    free(k.next);
    free(k.logits);
    free(rows);
    if (rc) sample_result_free(r);
    return rc;
}

/* The estimate's object: its step, repeats, and each measured position's medians. */
static json_t *estimate_json(const sample_session *s, const sample_result *r) {
    json_t *at = json_array(), *secs = json_array(), *cpu = json_array();
    for (int p = 0; p < r->n_points; p++) {
        json_array_append_new(at, json_integer(r->at[p]));
        json_array_append_new(secs, ab_json_num(r->secs[p]));
        json_array_append_new(cpu, ab_json_num(r->cpu_secs[p]));
    }
    return json_pack("{s:I, s:i, s:o, s:o, s:o}", "every", (json_int_t)s->opts.estimate, "repeats", EST_REPEATS,
                     "positions", at, "seconds", secs, "cpu_seconds", cpu);
}

json_t *sample_document(const sample_session *s, const sample_result *r, const char *command_line) {
    const train_config *cfg = &s->cfg;
    const sample_source *src = &s->src;
    const bool est = s->opts.estimate > 0;
    const double images = (double)r->n, values = (double)r->n * (double)(s->N - s->P), t = r->wall_s;
    json_t *doc = json_object();
    json_object_set_new(doc, "schema", json_string("attnbench/sample/1"));
    json_object_set_new(doc, "command", json_string(command_line));
    json_object_set_new(doc, "checkpoint", src->checkpoint ? json_string(src->checkpoint) : json_null());
    json_object_set_new(doc, "config", src->config ? json_string(src->config) : json_null());
    json_object_set_new(doc, "run", json_string(cfg->name));
    /* trained weights (a checkpoint at a step) or the config's initialisation */
    json_object_set_new(doc, "weights", json_string(src->checkpoint ? "trained" : "initialised"));
    json_object_set_new(doc, "step", src->checkpoint ? json_integer((json_int_t)s->meta.step) : json_null());
    json_object_set_new(doc, "model", json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "body", tf_body_name(cfg->model.body),
                                                "layers", cfg->model.layers, "d_model", cfg->model.d_model, "heads",
                                                cfg->model.heads, "d_ff", cfg->model.d_ff, "params",
                                                (int)tf_param_count(s->m)));
    json_object_set_new(doc, "task", json_string(cfg->task->name));
    json_object_set_new(doc, "variant", cfg->model.attention ? json_string(cfg->model.attention) : json_null());
    json_object_set_new(doc, "mode", json_string(s->recurrent ? "recurrent" : "recompute"));
    json_object_set_new(doc, "head", json_string(tf_head_name(cfg->model.head)));
    json_object_set_new(doc, "temperature", json_real(s->opts.temperature));
    /* where the values are drawn: on the model's device, and as an RNN kept there from
     * step to step (copied back once per batch), or on the host from copied logits */
    json_object_set_new(doc, "draws", json_string(!draws_on_device(s) ? "host"
                                                  : s->recurrent      ? "device, kept"
                                                                      : "device"));
    if (s->recurrent) /* the steps as one CUDA graph: asked for, made, launched, or why not */
        json_object_set_new(doc, "graph", json_pack("{s:b, s:I, s:I, s:o}", "asked", s->opts.graph, "records",
                                                    (json_int_t)r->graph_records, "launches",
                                                    (json_int_t)r->graph_launches, "note",
                                                    r->graph_note[0] ? json_string(r->graph_note) : json_null()));
    json_object_set_new(doc, "seed", json_integer((json_int_t)s->seed));
    json_object_set_new(doc, "n", json_integer(r->n));
    json_object_set_new(doc, "batch", json_integer(s->opts.batch));
    json_object_set_new(doc, "values_per_row", json_integer(s->N));
    json_object_set_new(doc, "complete", json_real(s->opts.complete));
    json_object_set_new(doc, "prompt_values", json_integer(s->P));
    json_object_set_new(doc, "device", json_string(ab_device_name(src->device)));
    /* "sampled": whole rows drawn and timed; "estimated": the estimate's sum;
     * "traffic": one step's memory traffic counted, nothing timed */
    json_object_set_new(doc, "method", json_string(r->traffic ? "traffic" : est ? "estimated" : "sampled"));
    if (est) json_object_set_new(doc, "estimate", estimate_json(s, r));
    if (r->traffic) {
        json_object_set(doc, "traffic", r->traffic);
    } else {
        json_object_set_new(doc, "wall_s", ab_json_num(t));
        json_object_set_new(doc, "images_per_s", ab_json_num(t > 0 ? images / t : NAN));
        json_object_set_new(doc, "s_per_image", ab_json_num(t / images));
        json_object_set_new(doc, "values_per_s", ab_json_num(t > 0 ? values / t : NAN));
        json_object_set_new(doc, "cpu_s", ab_json_num(r->cpu_s));
        json_object_set_new(doc, "cpu_s_per_image", ab_json_num(r->cpu_s / images));
    }
    json_object_set_new(doc, "threads", json_integer(ab_threads()));
    json_object_set_new(doc, "peak_bytes", json_integer((json_int_t)ab_mem_peak(AB_DEV_CPU)));
    if (src->device == AB_DEV_CUDA)
        json_object_set_new(doc, "device_peak_bytes", json_integer((json_int_t)ab_mem_peak(AB_DEV_CUDA)));
    json_object_set_new(doc, "machine", ab_machine_info());
    json_object_set_new(doc, "git", ab_git_info()); /* the source's commit, and whether it was clean */
    return doc;
}
