/* Optimisers for flat parameter arrays: Adam (Kingma & Ba 2015) and RAdam (Liu et al.
 * 2019), with weight decay, clipping by the global gradient norm and a step learning-
 * rate schedule. The optimiser knows nothing of the model: it sees n floats of
 * parameters and n floats of gradients, and a list of ranges saying which of them
 * are decayed.
 *
 * One step t = 1, 2, ... (t counts the steps taken, including this one):
 *
 *   norm  = sqrt(sum_i g_i^2)                       (raw gradient, summed in double)
 *   g     = g * c,  c = min(1, clip_norm / norm)     (clip_norm = 0: c = 1)
 *   lr_t  = lr * gamma^k * w_t * r                   k = number of milestones < t,
 *                                                    w_t = min(1, t / warmup) (1 if warmup = 0),
 *                                                    r the plateau factor (1 without one)
 *   decayed ranges, L2 decay:         g += wd * p    (after clipping)
 *   m     = beta1 m + (1 - beta1) g
 *   v     = beta2 v + (1 - beta2) g^2
 *   decayed ranges, decoupled decay:  p *= 1 - lr_t * wd
 *
 *   Adam:  p -= lr_t * m_hat / (sqrt(v_hat) + eps),  m_hat = m / (1 - beta1^t),
 *                                                    v_hat = v / (1 - beta2^t)
 *   RAdam: rho_inf = 2 / (1 - beta2) - 1,
 *          rho_t   = rho_inf - 2 t beta2^t / (1 - beta2^t)
 *          if rho_t >= rectify_threshold (5):
 *              r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))
 *              p -= lr_t * r_t * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)
 *          else (un-adapted momentum):
 *              p -= lr_t * m / (1 - beta1^t)
 *
 * Choices where the papers leave room, following the RAdam authors' reference
 * implementation (LiyuanLucasLiu/RAdam, radam.py, class RAdam):
 * - The rectified step uses the threshold `rho_t >= 5` (the paper's Algorithm 2 says
 *   rho_t > 4; the code uses 5 as "more conservative since it's an approximated
 *   value"; PyTorch's torch.optim.RAdam uses rho_t > 5 — the same steps in practice,
 *   since rho_t is never exactly 5). With beta2 = 0.999, rho_5 = 4.996 and
 *   rho_6 = 5.994: the first five steps are momentum steps and step 6 is the first
 *   rectified one (the paper's "> 4" would already rectify step 5). The threshold is
 *   a config field (it must be > 4, where r_t is real).
 * - RAdam's eps is added to sqrt(v) before the bias correction (as in the reference
 *   code); Adam's eps is added to sqrt(v_hat) (as in Kingma & Ba and PyTorch).
 * - Weight decay is decoupled by default (p *= 1 - lr_t * wd, applied in both RAdam
 *   branches), as the RAdam reference code applies it and as AdamW does; set
 *   decoupled_decay = false for classic L2 (wd * p added to the clipped gradient).
 * - Clipping scales by exactly clip_norm / norm (no epsilon) when norm > clip_norm,
 *   and never modifies the caller's gradient array.
 * - A gradient whose norm is not finite (NaN or inf anywhere) is refused: the step
 *   returns AB_EINVAL and leaves parameters, moments and the step count untouched.
 *
 * Reduce on plateau (schedule.plateau, PyTorch's ReduceLROnPlateau in mode "min",
 * threshold mode "rel", no cooldown): whoever evaluates the model reports a value
 * after each evaluation with ab_optim_plateau (lower is better: the caller negates a
 * metric it wants higher). With best the lowest value so far (+inf at first), a value
 * improves when it is below best - threshold |best|; otherwise the evaluation is a bad
 * one. After more than `patience` bad evaluations in a row, the factor r becomes
 * max(r factor, min_lr / lr) (when that is lower) and the count restarts. NaN never
 * improves. With begin_below finite, values are ignored (neither bad nor a best) until
 * the first one below it, which starts the rule as the first value would: a CTC model
 * that sits at 100% PER while it learns to emit anything but blanks is not counted as
 * stuck there (the state needs nothing more: the rule has started exactly when best <
 * begin_below). The driver reports a maximised metric negated, begin_below too. The state (r, best, the bad count, the reductions) is part of the
 * optimiser's state blob, so a resumed run continues it bit for bit. The optimiser
 * does not interpret the metric's name: the driver does (experiments/driver/).
 *
 * Arithmetic: m and v are float32 like the parameters; the per-step scalars (lr_t,
 * bias corrections, r_t) are computed in double and rounded once. Results do not
 * depend on the number of OpenMP threads: the norm is summed over fixed blocks of
 * 4096 entries (each in double, in order) whose partial sums are then added in block
 * order, and the update is elementwise. Repeated runs are bit-identical.
 *
 * Memory: m, v, the norm partials and a serialisable state header live in one block
 * from the tracked allocator, made at creation; a step allocates nothing.
 *
 * Devices: ab_optim_create_on(AB_DEV_CUDA, ...) keeps m, v (and the norm partials and
 * ranges) in one device allocation (tracked on AB_DEV_CUDA), the header and a copy of
 * the partials on the host; ab_optim_step then takes DEVICE pointers (e.g. tf_params()
 * and tf_grads() of a model on CUDA) and runs the norm and the update as kernels
 * (models/optim_cuda.cu). The results are the CPU's bit for bit: the same block sums
 * (one thread per block of 4096, in index order, in double) added on the host in block
 * order, and the same float operations in the same order (IEEE intrinsics that are
 * never contracted). A step waits for the device once (the partials come back to the
 * host, where the norm is checked and the clipping factor chosen) and returns with
 * the update queued. The state calls copy: ab_optim_get_state downloads m and v into
 * a host copy (allocated by the first call and kept), ab_optim_set_state uploads them.
 */
#ifndef AB_OPTIM_H
#define AB_OPTIM_H

#include "checkpoint.h"
#include "memory.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { AB_OPTIM_ADAM = 0, AB_OPTIM_RADAM = 1 } ab_optim_kind;

#define AB_OPTIM_MAX_MILESTONES 32

typedef struct {
    ab_optim_kind kind;       /* default RAdam (the paper's optimiser for every experiment) */
    double lr;                /* >= 0, default 1e-3 */
    double beta1, beta2;      /* in [0, 1), default 0.9, 0.999 */
    double eps;               /* > 0, default 1e-8 */
    double weight_decay;      /* >= 0, default 0 */
    bool decoupled_decay;     /* default true: p *= 1 - lr_t wd; false: g += wd p (L2) */
    double clip_norm;         /* >= 0, 0 = no clipping (default) */
    double rectify_threshold; /* RAdam only: rectified step when rho_t >= this; > 4, default 5 */
    /* Step schedule: lr is multiplied by gamma after each milestone step, e.g.
     * milestones {3000}, gamma 0.1: steps 1..3000 use lr, steps 3001.. use lr * 0.1. */
    int n_milestones;                              /* 0..AB_OPTIM_MAX_MILESTONES */
    long long milestones[AB_OPTIM_MAX_MILESTONES]; /* strictly increasing, >= 1 */
    double gamma;                                  /* > 0, default 0.1 */
    long long warmup;                              /* >= 0: linear warm-up steps, 0 = none */
    /* Reduce on plateau (above); off when plateau_metric is "" (the default). */
    char plateau_metric[32];    /* the name of the watched metric, for the driver */
    double plateau_factor;      /* in (0, 1), default 0.5 (the paper's halving) */
    long long plateau_patience; /* >= 0 bad evaluations tolerated, default 10 (PyTorch's) */
    double plateau_threshold;   /* >= 0: relative improvement needed, default 1e-4 (PyTorch's) */
    double plateau_min_lr;      /* >= 0: the lr r never goes below, default 0 */
    double plateau_begin_below; /* the rule starts at the first value below it; default +inf */
} ab_optim_config;

/* The defaults listed above. */
void ab_optim_config_default(ab_optim_config *c);
/* 0, or AB_EINVAL with a message naming the offending field (by its JSON key). */
int ab_optim_config_validate(const ab_optim_config *c);
/* "adam" / "radam" and back (-1 for an unknown name). */
const char *ab_optim_kind_name(ab_optim_kind k);
int ab_optim_kind_find(const char *name);

/* Parses an optimiser config object, e.g.
 *   {"kind": "radam", "lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
 *    "weight_decay": 0, "decoupled_weight_decay": true, "clip_norm": 1.0,
 *    "rectify_threshold": 5,
 *    "schedule": {"milestones": [3000], "gamma": 0.1, "warmup": 0,
 *                 "plateau": {"metric": "per", "factor": 0.5, "patience": 10,
 *                             "threshold": 1e-4, "min_lr": 0, "begin_below": 0.95}}}
 * ("plateau" is optional, its "metric" required, "begin_below" absent for +inf: any non-empty name of at most 31
 * characters; the driver checks that it names something it evaluates).
 * Every key is optional (defaults above); unknown keys, wrong types and values out of
 * range are AB_EINVAL with a message naming the key as `where.key` ("" for `where`
 * when the object is the root). */
int ab_optim_config_from_json(const json_t *obj, const char *where, ab_optim_config *out);
/* The config as a JSON object with every key (new reference; "plateau" only when the
 * schedule has one), for results and checkpoints; ab_optim_config_from_json reads it
 * back exactly. NULL on out of memory. */
json_t *ab_optim_config_to_json(const ab_optim_config *c);

/* Learning rate of step t (1-based) under the schedule: lr * gamma^k * w_t above
 * (gamma^k by repeated multiplication in double), without the plateau factor. */
double ab_optim_schedule_lr(const ab_optim_config *c, long long t);
/* Whether the schedule reduces on plateau. */
bool ab_optim_config_has_plateau(const ab_optim_config *c);

/* A range [offset, offset + count) of the parameter array and whether weight decay
 * applies to it (false for biases and layer-norm gains, say). */
typedef struct {
    size_t offset, count;
    bool decay;
} ab_optim_range;

typedef struct ab_optim ab_optim;

/* Creates an optimiser for n > 0 parameters with zeroed moments and step 0. `ranges`
 * (n_ranges entries, in any order) must cover [0, n) exactly, without gaps or overlap;
 * ranges = NULL with n_ranges = 0 means one decayed range [0, n). Empty ranges are
 * allowed and ignored. 0, or AB_EINVAL / AB_ENOMEM with a message. On the CPU. */
int ab_optim_create(const ab_optim_config *c, size_t n, const ab_optim_range *ranges, int n_ranges, ab_optim **out);
/* The same on device `dev` (AB_DEV_CPU or AB_DEV_CUDA): its moments in memory of that
 * device, and ab_optim_step's arrays too. CUDA without a device or in a build without
 * CUDA: AB_EDEVICE ("no CUDA device: ..."). */
int ab_optim_create_on(ab_device dev, const ab_optim_config *c, size_t n, const ab_optim_range *ranges, int n_ranges,
                       ab_optim **out);
void ab_optim_destroy(ab_optim *o);
ab_device ab_optim_device(const ab_optim *o);

/* What one step did, for the training log. */
typedef struct {
    long long step;    /* t of the step just taken */
    double lr;         /* lr_t */
    double grad_norm;  /* global L2 norm of the raw gradient (before clipping) */
    double clip_scale; /* factor the gradient was multiplied by (1 when not clipped) */
    double rho;        /* RAdam: rho_t (0 for Adam) */
    bool rectified;    /* RAdam: the rectified adaptive step was taken; Adam: true */
} ab_optim_info;

/* One step: params (n floats) updated in place from grad (n floats, read only; the two
 * must not overlap), both in memory of the optimiser's device. `info` may be NULL. 0,
 * or AB_EINVAL (NULL arrays, or a non-finite gradient norm: nothing changed), or (CUDA)
 * a device error. One thread at a time per optimiser; the step itself runs on the
 * OpenMP threads (CPU) or the device. */
int ab_optim_step(ab_optim *o, float *params, const float *grad, ab_optim_info *info);

long long ab_optim_steps(const ab_optim *o); /* steps taken so far */
/* The learning rate step t would use: ab_optim_schedule_lr times the plateau factor. */
double ab_optim_lr(const ab_optim *o, long long t);

/* The reduce-on-plateau state (above). */
typedef struct {
    double factor;      /* r, the lr's current multiplier: 1, then lowered by reductions */
    double best;        /* the lowest value so far (+inf before the first) */
    long long bad;      /* bad evaluations since the last improvement or reduction */
    int reductions;     /* reductions so far */
} ab_optim_plateau_state;

/* Reports the value of the watched metric after an evaluation (lower is better) and
 * applies the rule above; *reduced (may be NULL) says whether r was lowered. AB_EINVAL
 * when the config has no plateau schedule. */
int ab_optim_plateau(ab_optim *o, double value, bool *reduced);
void ab_optim_plateau_get(const ab_optim *o, ab_optim_plateau_state *st);
const ab_optim_config *ab_optim_get_config(const ab_optim *o);
/* Changes the config of a live optimiser (e.g. lr on resume); the kind cannot change. */
int ab_optim_set_config(ab_optim *o, const ab_optim_config *c);

/* The optimiser's complete state as one contiguous byte blob in host memory: a 64-byte
 * header (magic "ABOPTIM", version, kind, n, step; with a plateau schedule version 2,
 * which also holds the plateau state) followed by m[n] and v[n]
 * (float32, native byte order), the same on either device. The pointer stays valid,
 * and its contents current, until the next step or destroy; `ab_optim_set_state` on an
 * optimiser of the same kind and n (on either device) restores it exactly, so
 * continuing gives bit-identical parameters. The config is not part of the state
 * (store it beside, e.g. as the checkpoint's config JSON). On CUDA this downloads m
 * and v into the host copy (waits for the device): 0, or an error code with *data =
 * NULL and *bytes = 0. A version 1 state (no plateau) restores the plateau state to
 * its start. */
int ab_optim_get_state(ab_optim *o, const void **data, size_t *bytes);
/* ab_optim_get_state without the result (on a CUDA failure *data is NULL and *bytes
 * 0; the CPU cannot fail). */
void ab_optim_state(ab_optim *o, const void **data, size_t *bytes);
/* 0, or AB_EINVAL naming what differs (not an optimiser state, other kind, other n,
 * wrong size, a negative or non-finite second moment); nothing is changed on error.
 * On CUDA the moments are uploaded (a failed upload is a device error). */
int ab_optim_set_state(ab_optim *o, const void *data, size_t bytes);

/* The optimiser's state as one checkpoint blob (harness/checkpoint.h), and back into
 * an optimiser of the same kind and size (ab_optim_set_state); errors name the file
 * and blob (optim_ckpt.c). A failure to get the state poisons the writer. */
int ab_ckpt_add_optim(ab_ckpt_writer *w, const char *name, ab_optim *o);
int ab_ckpt_get_optim(const ab_ckpt_reader *r, const char *name, ab_optim *o);

#endif
