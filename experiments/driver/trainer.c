/* Training state, one step, evaluation (trainer.h). */
#include "trainer.h"

#include "device.h"
#include "error.h"
#include "layers_dev.h"
#include "memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Losses room allocated by trainer_create (512 KiB); more as steps complete. */
#define TRAIN_LOSSES_START (1LL << 16)

void trainer_destroy(trainer *t) {
    if (!t) return;
    if (t->acc) ab_dev_free(tf_device(t->model), t->acc);
    tf_destroy(t->model);
    ab_optim_destroy(t->opt);
    ab_free(t->host_params);
    ab_free(t->host_logits);
    ab_free(t->order);
    ab_free(t->rows);
    task_batch_free(&t->batch);
    free(t->losses);
    train_config_free(&t->cfg);
    free(t);
}

int trainer_create(train_config *cfg, trainer **out) { return trainer_create_dist(cfg, NULL, out); }

int trainer_create_dist(train_config *cfg, ab_dist *dist, trainer **out) {
    *out = NULL;
    const long long K = (long long)ab_dist_size(dist) * cfg->accumulate;
    if (cfg->batch % K != 0) {
        const long long B = cfg->batch, A = cfg->accumulate;
        train_config_free(cfg);
        return ab_fail(AB_EINVAL, "batch %lld does not divide into %d rank%s x accumulate %lld = %lld equal micro-batches",
                       B, ab_dist_size(dist), ab_dist_size(dist) > 1 ? "s" : "", A, K);
    }
    trainer *t = calloc(1, sizeof *t);
    if (!t) {
        train_config_free(cfg);
        return ab_fail(AB_ENOMEM, "out of memory");
    }
    t->cfg = *cfg;
    t->cfg.model.attn_settings = (const char *const *)t->cfg.attn_settings; /* into the moved copy */
    memset(cfg, 0, sizeof *cfg);
    t->dist = dist;
    t->micro_rows = (int)(t->cfg.batch / K);
    int rc = tf_create(&t->cfg.model, t->micro_rows, &t->model);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ab_error());
        trainer_destroy(t);
        return ab_fail(rc, "config: model: %s", msg);
    }
    int n = tf_param_tensor_count(t->model);
    ab_optim_range *ranges = calloc((size_t)n, sizeof *ranges);
    if (!ranges) {
        trainer_destroy(t);
        return ab_fail(AB_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        const tf_tensor *p = tf_param_tensor(t->model, i);
        ranges[i] = (ab_optim_range){p->offset, p->count, p->decay};
    }
    rc = ab_optim_create_on(tf_device(t->model), &t->cfg.optim, tf_param_count(t->model), ranges, n,
                            &t->opt);
    free(ranges);
    if (!rc && tf_device(t->model) != AB_DEV_CPU && !(t->host_params = ab_alloc(sizeof(float) * tf_param_count(t->model))))
        rc = ab_fail(AB_ENOMEM, "out of memory for a host copy of %zu parameters", tf_param_count(t->model));
    if (!rc && K > 1) rc = ab_dev_malloc(tf_device(t->model), (void **)&t->acc, sizeof(float) * tf_param_count(t->model));
    if (!rc) rc = task_batch_alloc(t->cfg.task, (int)t->cfg.batch, &t->batch);
    const train_task *task = t->cfg.task;
    t->order_epoch = -1;
    if (!rc && task_is_dataset(task)) {
        t->train_split = task_split_find(task, "train");
        long long n = task->split_rows[t->train_split];
        if (!(t->order = ab_alloc(sizeof(long long) * (size_t)n)) ||
            !(t->rows = ab_alloc(sizeof(long long) * (size_t)t->cfg.batch)))
            rc = ab_fail(AB_ENOMEM, "out of memory for the order of %lld training rows", n);
    }
    if (!rc && task_metrics_need_logits(task)) {
        size_t n = (size_t)t->cfg.batch * (size_t)task->seq_len * (size_t)tf_classes(t->model);
        if (!(t->host_logits = ab_alloc(sizeof(float) * n)))
            rc = ab_fail(AB_ENOMEM, "out of memory for a batch of logits (%zu floats)", n);
    }
    if (!rc) {
        /* the list grows as steps complete (trainer_step, trainer_restore): `steps` may
         * be up to 2^40, 8 TiB of losses if allocated up front */
        t->losses_cap = t->cfg.steps < TRAIN_LOSSES_START ? (t->cfg.steps > 0 ? t->cfg.steps : 1) : TRAIN_LOSSES_START;
        t->losses = calloc((size_t)t->losses_cap, sizeof(double));
        if (!t->losses) rc = ab_fail(AB_ENOMEM, "out of memory for %lld losses", t->losses_cap);
    }
    if (rc) {
        trainer_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* The head's loss of the batch's last forward: per-position targets, or (the ctc
 * head) label sequences, every row of weight 1. */
static int batch_loss(tf_model *m, const task_batch *b, ce_stats *st) {
    if (tf_get_config(m)->head == TF_HEAD_CTC) {
        if (!b->labels) return ab_fail(AB_EINVAL, "the model's head is ctc, but the task's batch has no label sequences");
        return tf_loss_ctc(m, b->labels, b->label_counts, NULL, st);
    }
    return tf_loss(m, b->targets, b->weights, st);
}

int train_step(tf_model *m, ab_optim *o, const task_batch *b, uint64_t run_seed, long long step,
               train_step_info *info) {
    memset(info, 0, sizeof *info);
    info->loss = NAN;
    tf_zero_grad(m);
    uint64_t seed = tf_step_seed(run_seed, (uint64_t)step);
    int rc = b->frames ? tf_forward_frames(m, b->frames, b->rows, b->N, b->lengths, true, seed)
                       : tf_forward(m, b->tokens, b->rows, b->N, b->lengths, true, seed);
    if (rc) return rc;
    ce_stats st;
    if ((rc = batch_loss(m, b, &st))) return rc;
    info->loss = st.loss;
    info->st = (task_loss_stats){st.loss, st.weight_sum, st.correct, st.counted};
    if (!isfinite(st.loss)) {
        info->diverged = true;
        return ab_fail(AB_EINVAL, "training diverged: the loss is %s at step %lld", isnan(st.loss) ? "NaN" : "infinite",
                       step);
    }
    if ((rc = tf_backward(m))) return rc;
    ab_optim_info oi;
    rc = ab_optim_step(o, tf_params(m), tf_grads(m), &oi);
    if (rc) {
        /* the only refusal of a step with valid arrays: a non-finite gradient norm */
        info->diverged = true;
        return ab_fail(AB_EINVAL, "training diverged: the gradient is not finite at step %lld (loss %g)", step,
                       st.loss);
    }
    info->grad_norm = oi.grad_norm;
    info->lr = oi.lr;
    info->clip_scale = oi.clip_scale;
    return 0;
}

/* The order of `epoch` over the training split in t->order (kept until another
 * epoch is needed). */
static void use_epoch(trainer *t, long long epoch) {
    if (t->order_epoch == epoch) return;
    task_epoch_order(t->cfg.seed, (uint64_t)epoch, t->cfg.task->split_rows[t->train_split], t->order);
    t->order_epoch = epoch;
}

int trainer_fill_step(trainer *t, long long step) {
    const train_task *task = t->cfg.task;
    if (!task_is_dataset(task)) {
        task_batch_fill(task, t->cfg.seed, TASK_STREAM_DATA, (uint64_t)step, &t->batch);
        return 0;
    }
    const long long n = task->split_rows[t->train_split], B = t->cfg.batch;
    for (long long r = 0; r < B; r++) {
        long long pos = (step - 1) * B + r;
        use_epoch(t, pos / n);
        t->rows[r] = t->order[pos % n];
    }
    task_batch_fill_rows(task, t->train_split, t->rows, (int)B, &t->batch);
    if (task->augment)
        for (int r = 0; r < t->batch.rows; r++) {
            ab_rng rng = task_row_rng(t->cfg.seed, TASK_STREAM_AUGMENT, (uint64_t)step, (uint64_t)r);
            task->augment(task, &rng, &t->batch, r);
        }
    return 0;
}

/* The logits of the last forward on the host (rows N K floats), when a metric needs them. */
static const float *logits_for_metrics(trainer *t, int *rc) {
    *rc = 0;
    if (!t->host_logits) return NULL;
    if (tf_device(t->model) == AB_DEV_CPU) return tf_logits(t->model);
    *rc = tf_logits_download(t->model, t->host_logits);
    return t->host_logits;
}

/* What each rank adds to a step of micro-batches, summed in rank order. */
typedef struct {
    double swl, w;                 /* sum of loss_k W_k, sum of W_k */
    double correct, counted;
    double bad;                    /* a micro-batch's loss was not finite */
    double sums[TASK_MAX_METRICS][TASK_METRIC_SUMS];
} micro_stats;

/* This rank's micro-batches of step s (trainer.h, "Micro-batches"): their forwards,
 * losses and backwards, the weighted gradient sum in t->acc, and the statistics. A
 * micro-batch with a loss that is not finite ends the rank's part (the caller learns
 * of it from every rank's statistics, so that all ranks stop together). */
static int micro_batches(trainer *t, long long s, micro_stats *ms) {
    tf_model *m = t->model;
    const ab_device dev = tf_device(m);
    const size_t P = tf_param_count(m);
    const int A = (int)t->cfg.accumulate, b = t->micro_rows, rank = ab_dist_rank(t->dist);
    const uint64_t seed = tf_step_seed(t->cfg.seed, (uint64_t)s);
    const bool logits = task_metrics_need_logits(t->cfg.task);
    memset(ms, 0, sizeof *ms);
    int rc = 0;
    for (int a = 0; a < A && !rc; a++) {
        const int r0 = (rank * A + a) * b;
        task_batch v;
        task_batch_view(&t->batch, r0, b, &v);
        tf_set_row_offset(m, r0);
        if ((rc = tf_zero_grad(m))) break;
        rc = v.frames ? tf_forward_frames(m, v.frames, b, v.N, v.lengths, true, seed)
                      : tf_forward(m, v.tokens, b, v.N, v.lengths, true, seed);
        ce_stats st;
        if (rc || (rc = batch_loss(m, &v, &st))) break;
        if (!isfinite(st.loss)) {
            ms->bad = 1;
            break;
        }
        task_loss_stats ts = {st.loss, st.weight_sum, st.correct, st.counted};
        const float *lg = logits ? logits_for_metrics(t, &rc) : NULL;
        if (rc) break;
        task_metrics_add(t->cfg.task, &v, &ts, lg, ms->sums);
        if ((rc = tf_backward(m))) break;
        float *g = tf_grads(m);
        if ((rc = ld_scale(dev, g, P, (float)st.weight_sum))) break;
        rc = a == 0 ? ld_copy(dev, t->acc, g, sizeof(float) * P) : ld_residual_acc(dev, t->acc, g, P);
        ms->swl += st.loss * st.weight_sum;
        ms->w += st.weight_sum;
        ms->correct += (double)st.correct;
        ms->counted += (double)st.counted;
    }
    tf_set_row_offset(m, 0);
    return rc;
}

/* Step s over K > 1 micro-batches: this rank's, every rank's statistics and gradient
 * sums, the update. */
static int micro_step(trainer *t, long long s, train_step_info *info) {
    tf_model *m = t->model;
    const ab_device dev = tf_device(m);
    const size_t P = tf_param_count(m);
    const int R = ab_dist_size(t->dist);
    micro_stats mine, *all = malloc(sizeof(micro_stats) * (size_t)R);
    if (!all) return ab_fail(AB_ENOMEM, "out of memory");
    int rc = micro_batches(t, s, &mine);
    /* a rank that failed outright cannot take part in the sums: it ends the job (the
     * caller aborts every rank); the others wait for it in the collective below */
    if (rc) {
        free(all);
        return rc;
    }
    if ((rc = ab_dist_allgather(t->dist, &mine, sizeof mine, all))) {
        free(all);
        return rc;
    }
    micro_stats tot = all[0];
    for (int r = 1; r < R; r++) {
        tot.swl += all[r].swl;
        tot.w += all[r].w;
        tot.correct += all[r].correct;
        tot.counted += all[r].counted;
        tot.bad += all[r].bad;
        for (int i = 0; i < TASK_MAX_METRICS; i++)
            for (int j = 0; j < TASK_METRIC_SUMS; j++) tot.sums[i][j] += all[r].sums[i][j];
    }
    free(all);
    info->loss = tot.w > 0 ? tot.swl / tot.w : NAN;
    info->st = (task_loss_stats){info->loss, tot.w, (long long)tot.correct, (long long)tot.counted};
    memcpy(t->step_sums, tot.sums, sizeof tot.sums);
    t->have_step_sums = true;
    if (tot.bad > 0 || !isfinite(info->loss)) {
        info->diverged = true;
        info->loss = NAN;
        return ab_fail(AB_EINVAL, "training diverged: the loss is not finite at step %lld", s);
    }
    if ((rc = ab_dist_sum_floats(t->dist, dev, t->acc, P))) return rc;
    float *g = tf_grads(m);
    if ((rc = ld_copy(dev, g, t->acc, sizeof(float) * P)) || (rc = ld_scale(dev, g, P, (float)(1.0 / tot.w))))
        return rc;
    ab_optim_info oi;
    if (ab_optim_step(t->opt, tf_params(m), g, &oi)) {
        info->diverged = true;
        return ab_fail(AB_EINVAL, "training diverged: the gradient is not finite at step %lld (loss %g)", s,
                       info->loss);
    }
    info->grad_norm = oi.grad_norm;
    info->lr = oi.lr;
    info->clip_scale = oi.clip_scale;
    return 0;
}

int trainer_step(trainer *t, train_step_info *info) {
    long long s = t->step + 1;
    memset(info, 0, sizeof *info);
    int rc = trainer_fill_step(t, s);
    const bool micro = t->micro_rows < t->cfg.batch;
    if (!rc) rc = micro ? micro_step(t, s, info) : train_step(t->model, t->opt, &t->batch, t->cfg.seed, s, info);
    if (rc) return rc;
    if (s > t->losses_cap) {
        long long cap = 2 * t->losses_cap > s ? 2 * t->losses_cap : s;
        double *p = realloc(t->losses, sizeof(double) * (size_t)cap);
        if (!p) return ab_fail(AB_ENOMEM, "out of memory for %lld losses", cap);
        t->losses = p;
        t->losses_cap = cap;
    }
    t->losses[s - 1] = info->loss;
    t->step = s;
    t->positions += (double)t->batch.rows * (double)t->batch.N;
    return 0;
}

bool trainer_has_eval(const trainer *t) {
    return task_is_dataset(t->cfg.task) ? t->cfg.eval_rows > 0 : t->cfg.eval_batches > 0;
}

/* One evaluation batch already in t->batch: forward, loss, sums, in pieces of at
 * most micro_rows rows (the model's batch). */
static int eval_batch(trainer *t, uint64_t seed, double *swl, double *sw, long long *counted,
                      double sums[][TASK_METRIC_SUMS]) {
    for (int r0 = 0; r0 < t->batch.rows; r0 += t->micro_rows) {
        task_batch piece, *b = &t->batch;
        if (t->micro_rows < t->batch.rows) {
            task_batch_view(&t->batch, r0, t->batch.rows - r0 < t->micro_rows ? t->batch.rows - r0 : t->micro_rows,
                            &piece);
            b = &piece;
        }
        int rc = b->frames ? tf_forward_frames(t->model, b->frames, b->rows, b->N, b->lengths, false, seed)
                           : tf_forward(t->model, b->tokens, b->rows, b->N, b->lengths, false, seed);
        ce_stats st;
        if (!rc) rc = batch_loss(t->model, b, &st);
        if (rc) return rc;
        const float *logits = logits_for_metrics(t, &rc);
        if (rc) return rc;
        *swl += st.loss * st.weight_sum;
        *sw += st.weight_sum;
        *counted += st.counted;
        task_loss_stats ts = {st.loss, st.weight_sum, st.correct, st.counted};
        task_metrics_add(t->cfg.task, b, &ts, logits, sums);
    }
    return 0;
}

int trainer_eval(trainer *t, int split, long long rows, train_eval_info *e) {
    memset(e, 0, sizeof *e);
    const train_task *task = t->cfg.task;
    double swl = 0, sw = 0, sums[TASK_MAX_METRICS][TASK_METRIC_SUMS];
    memset(sums, 0, sizeof sums);
    long long counted = 0, done = 0;
    uint64_t seed = tf_step_seed(t->cfg.seed, TRAIN_EVAL_STEP);
    int rc = 0;
    tf_set_inference(t->model, true); /* no backward follows an evaluation forward */
    if (!task_is_dataset(task)) {
        for (long long k = 0; k < t->cfg.eval_batches && !rc; k++) {
            task_batch_fill(task, t->cfg.seed, TASK_STREAM_EVAL, (uint64_t)k, &t->batch);
            rc = eval_batch(t, seed, &swl, &sw, &counted, sums);
            done += t->batch.rows;
        }
    } else {
        if (split < 0) {
            split = t->cfg.eval_split;
            rows = t->cfg.eval_rows;
        }
        if (rows <= 0 || rows > task->split_rows[split]) rows = task->split_rows[split];
        for (long long r0 = 0; r0 < rows && !rc; r0 += t->cfg.batch) {
            int n = (int)(rows - r0 < t->cfg.batch ? rows - r0 : t->cfg.batch);
            for (int r = 0; r < n; r++) t->rows[r] = r0 + r;
            task_batch_fill_rows(task, split, t->rows, n, &t->batch);
            rc = eval_batch(t, seed, &swl, &sw, &counted, sums);
            done += n;
        }
    }
    tf_set_inference(t->model, false);
    if (rc) return rc;
    e->loss = sw > 0 ? swl / sw : NAN;
    task_metrics_values(task, sums, e->metrics);
    e->counted = counted;
    e->rows = done;
    return 0;
}

int trainer_plateau(trainer *t, const train_eval_info *e, bool *reduced) {
    if (reduced) *reduced = false;
    const int i = t->cfg.plateau_metric;
    if (i == TRAIN_PLATEAU_NONE) return 0;
    const double v = i == TRAIN_PLATEAU_LOSS ? e->loss : e->metrics[i];
    return ab_optim_plateau(t->opt, t->cfg.plateau_maximise ? -v : v, reduced);
}

int trainer_step_metrics(trainer *t, const train_step_info *info, double *values) {
    if (t->have_step_sums) { /* micro-batches: their sums, made during the step */
        task_metrics_values(t->cfg.task, t->step_sums, values);
        return 0;
    }
    double sums[TASK_MAX_METRICS][TASK_METRIC_SUMS];
    memset(sums, 0, sizeof sums);
    int rc;
    const float *logits = logits_for_metrics(t, &rc);
    if (rc) return rc;
    task_metrics_add(t->cfg.task, &t->batch, &info->st, logits, sums);
    task_metrics_values(t->cfg.task, sums, values);
    return 0;
}
