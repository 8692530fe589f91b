/* Training state, one step, evaluation (trainer.h). */
#include "trainer.h"

#include "error.h"
#include "memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void trainer_destroy(trainer *t) {
    if (!t) return;
    tf_destroy(t->model);
    ab_optim_destroy(t->opt);
    ab_free(t->host_params);
    task_batch_free(&t->batch);
    free(t->losses);
    train_config_free(&t->cfg);
    free(t);
}

int trainer_create(train_config *cfg, trainer **out) {
    *out = NULL;
    trainer *t = calloc(1, sizeof *t);
    if (!t) {
        train_config_free(cfg);
        return ab_fail(AB_ENOMEM, "out of memory");
    }
    t->cfg = *cfg;
    t->cfg.model.attn_settings = (const char *const *)t->cfg.attn_settings; /* into the moved copy */
    memset(cfg, 0, sizeof *cfg);
    int rc = tf_create(&t->cfg.model, (int)t->cfg.batch, &t->model);
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
    rc = ab_optim_create_on((ab_device)tf_device(t->model), &t->cfg.optim, tf_param_count(t->model), ranges, n,
                            &t->opt);
    free(ranges);
    if (!rc && tf_device(t->model) != ATTN_DEVICE_CPU && !(t->host_params = ab_alloc(sizeof(float) * tf_param_count(t->model))))
        rc = ab_fail(AB_ENOMEM, "out of memory for a host copy of %zu parameters", tf_param_count(t->model));
    if (!rc) rc = task_batch_alloc(t->cfg.task, (int)t->cfg.batch, &t->batch);
    if (!rc) {
        t->losses_cap = t->cfg.steps > 0 ? t->cfg.steps : 1;
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

int train_step(tf_model *m, ab_optim *o, const task_batch *b, uint64_t run_seed, long long step,
               train_step_info *info) {
    memset(info, 0, sizeof *info);
    info->loss = NAN;
    tf_zero_grad(m);
    int rc = tf_forward(m, b->tokens, b->B, b->N, b->lengths, true, tf_step_seed(run_seed, (uint64_t)step));
    if (rc) return rc;
    ce_stats st;
    if ((rc = tf_loss(m, b->targets, b->weights, &st))) return rc;
    info->loss = st.loss;
    info->correct = st.correct;
    info->counted = st.counted;
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

int trainer_step(trainer *t, train_step_info *info) {
    long long s = t->step + 1;
    task_batch_fill(t->cfg.task, t->cfg.seed, TASK_STREAM_DATA, (uint64_t)s, &t->batch);
    int rc = train_step(t->model, t->opt, &t->batch, t->cfg.seed, s, info);
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
    return 0;
}

int trainer_eval(trainer *t, train_eval_info *e) {
    memset(e, 0, sizeof *e);
    double swl = 0, sw = 0;
    long long correct = 0, counted = 0;
    uint64_t seed = tf_step_seed(t->cfg.seed, TRAIN_EVAL_STEP);
    for (long long k = 0; k < t->cfg.eval_batches; k++) {
        task_batch_fill(t->cfg.task, t->cfg.seed, TASK_STREAM_EVAL, (uint64_t)k, &t->batch);
        int rc = tf_forward(t->model, t->batch.tokens, t->batch.B, t->batch.N, t->batch.lengths, false, seed);
        ce_stats st;
        if (!rc) rc = tf_loss(t->model, t->batch.targets, t->batch.weights, &st);
        if (rc) return rc;
        swl += st.loss * st.weight_sum;
        sw += st.weight_sum;
        correct += st.correct;
        counted += st.counted;
    }
    e->loss = sw > 0 ? swl / sw : NAN;
    e->accuracy = counted > 0 ? (double)correct / (double)counted : NAN;
    e->counted = counted;
    return 0;
}
