/* Adam and RAdam on flat float arrays; the update rules are written out in optim.h. */
#include "optim.h"

#include "optim_cuda.h"

#include "bytes.h"
#include "config.h"
#include "device.h"
#include "error.h"
#include "memory.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The state block: | header (64 B) | m (n floats) | v (n floats) | partials (doubles) |
 * ranges |. The first three parts are the serialised state (ab_optim_state).
 * On CUDA the host block is | header | partials | ranges | and the device block
 * | m | v | partials | ranges (optim_cuda_range) |; the serialised state is put
 * together in a host copy (`mirror`) when asked for. */
#define STATE_HEADER 64u
#define STATE_VERSION 1u         /* written without a plateau schedule */
#define STATE_VERSION_PLATEAU 2u /* written with one */
static const char STATE_MAGIC[8] = {'A', 'B', 'O', 'P', 'T', 'I', 'M', '\0'};
/* Header fields (native byte order): magic @0, u32 version @8, u32 kind @12,
 * u64 n @16, u64 step @24, u32 sizeof(float) @32; version 1: the rest is zero;
 * version 2, the plateau state: u32 reductions @36, f64 factor @40, f64 best @48,
 * u64 bad @56. */

/* The gradient norm is summed per block of NORM_BLOCK entries; the update runs over
 * chunks of UPDATE_CHUNK entries. Both are fixed, so results do not depend on the
 * number of threads. Below PARALLEL_MIN entries everything runs on one thread. */
#define NORM_BLOCK 4096u
#define UPDATE_CHUNK 4096u
#define PARALLEL_MIN 32768u

struct ab_optim {
    ab_optim_config cfg;
    ab_device dev;
    size_t n;
    long long step;
    unsigned char *block; /* the one tracked host allocation */
    float *m, *v;         /* (n) each, memory of dev */
    double *partials;     /* (n_blocks), host */
    size_t n_blocks;
    ab_optim_range *ranges; /* sorted, non-empty, adjacent ranges of equal flag merged (host) */
    int n_ranges;
    /* CUDA */
    void *dblock;                 /* the one device allocation */
    double *dpartials;            /* (n_blocks) */
    optim_cuda_range *dranges;    /* (n_ranges) */
    unsigned char *mirror;        /* header + m + v on the host, made by the first ab_optim_get_state */
    ab_optim_plateau_state plateau;
};

/* ------------------------------------------------------------------------------------
 * Config
 * ---------------------------------------------------------------------------------- */

void ab_optim_config_default(ab_optim_config *c) {
    memset(c, 0, sizeof *c);
    c->kind = AB_OPTIM_RADAM;
    c->lr = 1e-3;
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-8;
    c->weight_decay = 0.0;
    c->decoupled_decay = true;
    c->clip_norm = 0.0;
    c->rectify_threshold = 5.0;
    c->n_milestones = 0;
    c->gamma = 0.1;
    c->warmup = 0;
    c->plateau_metric[0] = '\0';
    c->plateau_factor = 0.5;
    c->plateau_patience = 10;
    c->plateau_threshold = 1e-4;
    c->plateau_min_lr = 0.0;
    c->plateau_begin_below = INFINITY;
}

bool ab_optim_config_has_plateau(const ab_optim_config *c) { return c->plateau_metric[0] != '\0'; }

const char *ab_optim_kind_name(ab_optim_kind k) {
    switch (k) {
    case AB_OPTIM_ADAM: return "adam";
    case AB_OPTIM_RADAM: return "radam";
    }
    return "?";
}

int ab_optim_kind_find(const char *name) {
    if (!name) return -1;
    if (strcmp(name, "adam") == 0) return AB_OPTIM_ADAM;
    if (strcmp(name, "radam") == 0) return AB_OPTIM_RADAM;
    return -1;
}

/* Formats the failure "PREFIX'WHERE.KEY' ..." where PREFIX is "config: " for JSON
 * (where may be "") and "optimiser config: " for a struct (where == NULL). */
static int bad_key(const char *where, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad_key(const char *where, const char *key, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (!where) return ab_fail(AB_EINVAL, "optimiser config: '%s' %s", key, what);
    return ab_fail(AB_EINVAL, "config: '%s%s%s' %s", where, *where ? "." : "", key, what);
}

static int validate(const ab_optim_config *c, const char *where) {
    if (c->kind != AB_OPTIM_ADAM && c->kind != AB_OPTIM_RADAM)
        return bad_key(where, "kind", "= %d is not an optimiser (adam, radam)", (int)c->kind);
    if (!(c->lr >= 0.0 && isfinite(c->lr))) return bad_key(where, "lr", "= %g must be finite and >= 0", c->lr);
    if (!(c->beta1 >= 0.0 && c->beta1 < 1.0)) return bad_key(where, "beta1", "= %g must be in [0, 1)", c->beta1);
    if (!(c->beta2 >= 0.0 && c->beta2 < 1.0)) return bad_key(where, "beta2", "= %g must be in [0, 1)", c->beta2);
    if (!(c->eps > 0.0 && isfinite(c->eps)))
        return bad_key(where, "eps", "= %g must be finite and > 0 (0 gives 0/0 for a gradient that stays zero)",
                       c->eps);
    if (!(c->weight_decay >= 0.0 && isfinite(c->weight_decay)))
        return bad_key(where, "weight_decay", "= %g must be finite and >= 0", c->weight_decay);
    if (!(c->clip_norm >= 0.0 && isfinite(c->clip_norm)))
        return bad_key(where, "clip_norm", "= %g must be finite and >= 0 (0 = no clipping)", c->clip_norm);
    if (!(c->rectify_threshold > 4.0 && isfinite(c->rectify_threshold)))
        return bad_key(where, "rectify_threshold", "= %g must be finite and > 4 (r_t is not real below)",
                       c->rectify_threshold);
    if (c->n_milestones < 0 || c->n_milestones > AB_OPTIM_MAX_MILESTONES)
        return bad_key(where, "schedule.milestones", "has %d entries, at most %d are allowed", c->n_milestones,
                       AB_OPTIM_MAX_MILESTONES);
    for (int i = 0; i < c->n_milestones; i++) {
        if (c->milestones[i] < 1)
            return bad_key(where, "schedule.milestones", "entry %d = %lld must be a step >= 1", i, c->milestones[i]);
        if (i > 0 && c->milestones[i] <= c->milestones[i - 1])
            return bad_key(where, "schedule.milestones", "entry %d = %lld must be greater than the one before (%lld)",
                           i, c->milestones[i], c->milestones[i - 1]);
    }
    if (!(c->gamma > 0.0 && isfinite(c->gamma)))
        return bad_key(where, "schedule.gamma", "= %g must be finite and > 0", c->gamma);
    if (c->warmup < 0) return bad_key(where, "schedule.warmup", "= %lld must be >= 0 (0 = none)", c->warmup);
    if (memchr(c->plateau_metric, '\0', sizeof c->plateau_metric) == NULL)
        return bad_key(where, "schedule.plateau.metric", "is not a string of at most %zu characters",
                       sizeof c->plateau_metric - 1);
    if (!(c->plateau_factor > 0.0 && c->plateau_factor < 1.0))
        return bad_key(where, "schedule.plateau.factor", "= %g must be in (0, 1)", c->plateau_factor);
    if (c->plateau_patience < 0)
        return bad_key(where, "schedule.plateau.patience", "= %lld must be >= 0", c->plateau_patience);
    if (!(c->plateau_threshold >= 0.0 && isfinite(c->plateau_threshold)))
        return bad_key(where, "schedule.plateau.threshold", "= %g must be finite and >= 0", c->plateau_threshold);
    if (!(c->plateau_min_lr >= 0.0 && isfinite(c->plateau_min_lr)))
        return bad_key(where, "schedule.plateau.min_lr", "= %g must be finite and >= 0", c->plateau_min_lr);
    if (isnan(c->plateau_begin_below) || c->plateau_begin_below == -INFINITY)
        return bad_key(where, "schedule.plateau.begin_below", "= %g must be a number (or +inf: from the first value)",
                       c->plateau_begin_below);
    return 0;
}

int ab_optim_config_validate(const ab_optim_config *c) {
    if (!c) return ab_fail(AB_EINVAL, "optimiser config: NULL");
    return validate(c, NULL);
}

int ab_optim_config_from_json(const json_t *obj, const char *where, ab_optim_config *out) {
    if (!where) where = "";
    if (!json_is_object(obj)) {
        if (*where) return ab_fail(AB_EINVAL, "config: '%s' must be an object", where);
        return ab_fail(AB_EINVAL, "config: the optimiser config must be an object");
    }
    static const char *const keys[] = {"kind",      "lr",        "beta1",  "beta2",
                                       "eps",       "weight_decay", "decoupled_weight_decay",
                                       "clip_norm", "rectify_threshold", "schedule",
                                       NULL};
    int rc = ab_config_only_keys(obj, where, keys);
    if (rc) return rc;
    ab_optim_config c;
    ab_optim_config_default(&c);

    const char *kind;
    if ((rc = ab_config_str(obj, where, "kind", false, ab_optim_kind_name(c.kind), &kind))) return rc;
    int k = ab_optim_kind_find(kind);
    if (k < 0) return bad_key(where, "kind", "= '%s' is not an optimiser (adam, radam)", kind);
    c.kind = (ab_optim_kind)k;

    /* Types here, ranges in validate() below (one place for the rules). */
    const double big = DBL_MAX;
    if ((rc = ab_config_num(obj, where, "lr", false, c.lr, -big, big, &c.lr))) return rc;
    if ((rc = ab_config_num(obj, where, "beta1", false, c.beta1, -big, big, &c.beta1))) return rc;
    if ((rc = ab_config_num(obj, where, "beta2", false, c.beta2, -big, big, &c.beta2))) return rc;
    if ((rc = ab_config_num(obj, where, "eps", false, c.eps, -big, big, &c.eps))) return rc;
    if ((rc = ab_config_num(obj, where, "weight_decay", false, c.weight_decay, -big, big, &c.weight_decay)))
        return rc;
    if ((rc = ab_config_bool(obj, where, "decoupled_weight_decay", false, c.decoupled_decay, &c.decoupled_decay)))
        return rc;
    if ((rc = ab_config_num(obj, where, "clip_norm", false, c.clip_norm, -big, big, &c.clip_norm))) return rc;
    if ((rc = ab_config_num(obj, where, "rectify_threshold", false, c.rectify_threshold, -big, big,
                            &c.rectify_threshold)))
        return rc;

    const json_t *sched = json_object_get(obj, "schedule");
    if (sched) {
        char sw[256];
        snprintf(sw, sizeof sw, "%s%sschedule", where, *where ? "." : "");
        if (!json_is_object(sched)) return ab_fail(AB_EINVAL, "config: '%s' must be an object", sw);
        static const char *const skeys[] = {"milestones", "gamma", "warmup", "plateau", NULL};
        if ((rc = ab_config_only_keys(sched, sw, skeys))) return rc;
        if ((rc = ab_config_num(sched, sw, "gamma", false, c.gamma, -big, big, &c.gamma))) return rc;
        if ((rc = ab_config_int(sched, sw, "warmup", false, c.warmup, LLONG_MIN, LLONG_MAX, &c.warmup))) return rc;
        const json_t *ms = json_object_get(sched, "milestones");
        if (ms) {
            if (!json_is_array(ms))
                return ab_fail(AB_EINVAL, "config: '%s.milestones' must be a list of steps, e.g. [3000]", sw);
            if (json_array_size(ms) > AB_OPTIM_MAX_MILESTONES)
                return ab_fail(AB_EINVAL, "config: '%s.milestones' has %zu entries, at most %d are allowed", sw,
                               json_array_size(ms), AB_OPTIM_MAX_MILESTONES);
            c.n_milestones = (int)json_array_size(ms);
            for (int i = 0; i < c.n_milestones; i++) {
                const json_t *e = json_array_get(ms, (size_t)i);
                if (!json_is_integer(e))
                    return ab_fail(AB_EINVAL, "config: '%s.milestones' entry %d must be an integer step", sw, i);
                c.milestones[i] = json_integer_value(e);
            }
        }
        const json_t *pl = json_object_get(sched, "plateau");
        if (pl) {
            char pw[300];
            snprintf(pw, sizeof pw, "%s.plateau", sw);
            if (!json_is_object(pl))
                return ab_fail(AB_EINVAL, "config: '%s' must be an object {\"metric\": NAME, \"factor\": 0.5, ...}", pw);
            static const char *const pkeys[] = {"metric", "factor", "patience", "threshold", "min_lr", "begin_below", NULL};
            if ((rc = ab_config_only_keys(pl, pw, pkeys))) return rc;
            const char *metric;
            if ((rc = ab_config_str(pl, pw, "metric", true, NULL, &metric))) return rc;
            if (!*metric || strlen(metric) >= sizeof c.plateau_metric)
                return ab_fail(AB_EINVAL, "config: '%s.metric' = '%s' must be a metric's name of 1 to %zu characters", pw,
                               metric, sizeof c.plateau_metric - 1);
            snprintf(c.plateau_metric, sizeof c.plateau_metric, "%s", metric);
            if ((rc = ab_config_num(pl, pw, "factor", false, c.plateau_factor, -big, big, &c.plateau_factor))) return rc;
            if ((rc = ab_config_int(pl, pw, "patience", false, c.plateau_patience, LLONG_MIN, LLONG_MAX,
                                    &c.plateau_patience)))
                return rc;
            if ((rc = ab_config_num(pl, pw, "threshold", false, c.plateau_threshold, -big, big, &c.plateau_threshold)))
                return rc;
            if ((rc = ab_config_num(pl, pw, "min_lr", false, c.plateau_min_lr, -big, big, &c.plateau_min_lr))) return rc;
            if (json_object_get(pl, "begin_below") &&
                (rc = ab_config_num(pl, pw, "begin_below", false, 0.0, -big, big, &c.plateau_begin_below)))
                return rc;
        }
    }
    if ((rc = validate(&c, where))) return rc;
    *out = c;
    return 0;
}

json_t *ab_optim_config_to_json(const ab_optim_config *c) {
    json_t *ms = json_array();
    if (!ms) return NULL;
    for (int i = 0; i < c->n_milestones; i++) json_array_append_new(ms, json_integer(c->milestones[i]));
    json_t *o = json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:b, s:f, s:f, s:{s:o, s:f, s:I}}", "kind",
                          ab_optim_kind_name(c->kind), "lr", c->lr, "beta1", c->beta1, "beta2", c->beta2, "eps", c->eps,
                          "weight_decay", c->weight_decay, "decoupled_weight_decay", (int)c->decoupled_decay,
                          "clip_norm", c->clip_norm, "rectify_threshold", c->rectify_threshold, "schedule",
                          "milestones", ms, "gamma", c->gamma, "warmup", (json_int_t)c->warmup);
    if (o && ab_optim_config_has_plateau(c)) {
        json_t *pl = json_pack("{s:s, s:f, s:I, s:f, s:f}", "metric", c->plateau_metric, "factor", c->plateau_factor,
                               "patience", (json_int_t)c->plateau_patience, "threshold", c->plateau_threshold,
                               "min_lr", c->plateau_min_lr);
        if (pl && isfinite(c->plateau_begin_below) &&
            json_object_set_new(pl, "begin_below", json_real(c->plateau_begin_below))) {
            json_decref(pl);
            pl = NULL;
        }
        if (!pl || json_object_set_new(json_object_get(o, "schedule"), "plateau", pl)) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

double ab_optim_schedule_lr(const ab_optim_config *c, long long t) {
    double lr = c->lr;
    for (int i = 0; i < c->n_milestones; i++)
        if (t > c->milestones[i]) lr *= c->gamma;
    if (c->warmup > 0 && t < c->warmup) lr *= (double)t / (double)c->warmup;
    return lr;
}

/* ------------------------------------------------------------------------------------
 * Lifetime and ranges
 * ---------------------------------------------------------------------------------- */

static int cmp_range(const void *a, const void *b) {
    const ab_optim_range *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return 0;
}

/* Sorts a copy of the ranges, checks they tile [0, n), merges neighbours with the same
 * flag. `out` has room for n_in entries (or 1); returns the count or a negative code. */
static int tidy_ranges(size_t n, const ab_optim_range *in, int n_in, ab_optim_range *out) {
    if (!in) {
        out[0] = (ab_optim_range){0, n, true};
        return 1;
    }
    int k = 0;
    for (int i = 0; i < n_in; i++) {
        if (in[i].offset > n || in[i].count > n - in[i].offset)
            return ab_fail(AB_EINVAL, "optimiser ranges: range %d [%zu, %zu + %zu) goes past the %zu parameters", i,
                           in[i].offset, in[i].offset, in[i].count, n);
        if (in[i].count) out[k++] = in[i];
    }
    qsort(out, (size_t)k, sizeof *out, cmp_range);
    size_t end = 0;
    int m = 0;
    for (int i = 0; i < k; i++) {
        if (out[i].offset > end)
            return ab_fail(AB_EINVAL, "optimiser ranges: parameters [%zu, %zu) are in no range (ranges must cover [0, %zu))",
                           end, out[i].offset, n);
        if (out[i].offset < end)
            return ab_fail(AB_EINVAL, "optimiser ranges: [%zu, %zu) overlaps the range before it (which ends at %zu)",
                           out[i].offset, out[i].offset + out[i].count, end);
        end = out[i].offset + out[i].count;
        if (m > 0 && out[m - 1].decay == out[i].decay) out[m - 1].count += out[i].count;
        else out[m++] = out[i];
    }
    if (end != n)
        return ab_fail(AB_EINVAL, "optimiser ranges: parameters [%zu, %zu) are in no range (ranges must cover [0, %zu))",
                       end, n, n);
    return m;
}


int ab_optim_create(const ab_optim_config *c, size_t n, const ab_optim_range *ranges, int n_ranges, ab_optim **out) {
    return ab_optim_create_on(AB_DEV_CPU, c, n, ranges, n_ranges, out);
}

/* CUDA: the device block (m, v zeroed; the ranges uploaded). */
static int create_device_block(ab_optim *o) {
    size_t mv = 2 * o->n * sizeof(float), part = o->n_blocks * sizeof(double);
    size_t rng = (size_t)o->n_ranges * sizeof(optim_cuda_range);
    optim_cuda_range *h = malloc(rng);
    if (!h) return ab_fail(AB_ENOMEM, "out of memory");
    for (int r = 0; r < o->n_ranges; r++)
        h[r] = (optim_cuda_range){o->ranges[r].offset, o->ranges[r].count, o->ranges[r].decay};
    int rc = ab_dev_malloc(o->dev, &o->dblock, mv + part + rng);
    if (!rc) {
        unsigned char *d = o->dblock;
        o->m = (float *)d;
        o->v = o->m + o->n;
        o->dpartials = (double *)(d + mv); /* 8-aligned: mv is a multiple of 8 */
        o->dranges = (optim_cuda_range *)(d + mv + part); /* 8-aligned as well */
        rc = ab_dev_memset(o->dev, o->m, 0, mv);
        if (!rc) rc = ab_dev_upload(o->dev, o->dranges, h, rng);
    }
    free(h);
    return rc;
}

int ab_optim_create_on(ab_device dev, const ab_optim_config *c, size_t n, const ab_optim_range *ranges, int n_ranges,
                       ab_optim **out) {
    *out = NULL;
    int rc = ab_optim_config_validate(c);
    if (rc) return rc;
    if ((unsigned)dev >= AB_DEV_COUNT) return ab_fail(AB_EINVAL, "optimiser: unknown device %d", (int)dev);
    if (n == 0) return ab_fail(AB_EINVAL, "optimiser: no parameters (n = 0)");
    if (n_ranges < 0 || (n_ranges > 0 && !ranges) || (ranges && n_ranges == 0))
        return ab_fail(AB_EINVAL, "optimiser ranges: %d ranges at %p (give NULL and 0 for one decayed range)", n_ranges,
                       (const void *)ranges);

    const bool host = ab_dev_host_memory(dev); /* else m, v (and a copy of the ranges) on the device */
    size_t n_blocks = (n + NORM_BLOCK - 1) / NORM_BLOCK;
    size_t n_slots = ranges ? (size_t)n_ranges : 1;
    size_t mv, part, rng, total;
    if (ab_mul_size(n, 2 * sizeof(float), &mv) || ab_mul_size(n_blocks, sizeof(double), &part) ||
        ab_mul_size(n_slots, sizeof(ab_optim_range), &rng) || mv > SIZE_MAX - STATE_HEADER - part - rng)
        return ab_fail(AB_ENOMEM, "optimiser: state for %zu parameters does not fit in memory", n);
    if (!host) mv = 0; /* m and v live on the device */
    total = STATE_HEADER + mv + part + rng;

    ab_optim *o = calloc(1, sizeof *o);
    if (!o) return ab_fail(AB_ENOMEM, "out of memory");
    o->block = ab_calloc(total);
    if (!o->block) {
        free(o);
        return AB_ENOMEM; /* ab_alloc left the message */
    }
    o->cfg = *c;
    o->dev = dev;
    o->n = n;
    o->m = (float *)(o->block + STATE_HEADER);
    o->v = o->m + n;
    o->partials = (double *)(o->block + STATE_HEADER + mv); /* 8-aligned: mv is a multiple of 8 */
    o->n_blocks = n_blocks;
    o->ranges = (ab_optim_range *)(o->block + STATE_HEADER + mv + part);
    rc = tidy_ranges(n, ranges, n_ranges, o->ranges);
    if (rc < 0) {
        ab_optim_destroy(o);
        return rc;
    }
    o->n_ranges = rc;
    o->plateau = (ab_optim_plateau_state){1.0, INFINITY, 0, 0};
    if (!host && (rc = create_device_block(o))) {
        ab_optim_destroy(o);
        return rc;
    }

    memcpy(o->block, STATE_MAGIC, 8);
    ab_put_u32(o->block + 8, STATE_VERSION);
    ab_put_u32(o->block + 12, (uint32_t)c->kind);
    ab_put_u64(o->block + 16, (uint64_t)n);
    ab_put_u64(o->block + 24, 0);
    ab_put_u32(o->block + 32, (uint32_t)sizeof(float));
    *out = o;
    return 0;
}

void ab_optim_destroy(ab_optim *o) {
    if (!o) return;
    ab_free(o->block);
    ab_free(o->mirror);
    if (o->dblock) ab_dev_free(o->dev, o->dblock);
    free(o);
}

ab_device ab_optim_device(const ab_optim *o) { return o->dev; }
long long ab_optim_steps(const ab_optim *o) { return o->step; }
double ab_optim_lr(const ab_optim *o, long long t) { return ab_optim_schedule_lr(&o->cfg, t) * o->plateau.factor; }
void ab_optim_plateau_get(const ab_optim *o, ab_optim_plateau_state *st) { *st = o->plateau; }

int ab_optim_plateau(ab_optim *o, double value, bool *reduced) {
    if (reduced) *reduced = false;
    const ab_optim_config *c = &o->cfg;
    if (!ab_optim_config_has_plateau(c))
        return ab_fail(AB_EINVAL, "optimiser: the schedule has no plateau (schedule.plateau) to report a value to");
    ab_optim_plateau_state *p = &o->plateau;
    const double bb = c->plateau_begin_below;
    if (isfinite(bb) && !(p->best < bb) && !(value < bb)) return 0; /* not started */
    const bool improved = isinf(p->best) ? value < p->best : value < p->best - c->plateau_threshold * fabs(p->best);
    if (improved) {
        p->best = value;
        p->bad = 0;
    } else {
        p->bad++;
    }
    if (p->bad > c->plateau_patience) {
        const double floor = c->lr > 0 ? c->plateau_min_lr / c->lr : 0.0;
        const double next = p->factor * c->plateau_factor > floor ? p->factor * c->plateau_factor : floor;
        if (next < p->factor) {
            p->factor = next;
            p->reductions++;
            if (reduced) *reduced = true;
        }
        p->bad = 0;
    }
    return 0;
}
const ab_optim_config *ab_optim_get_config(const ab_optim *o) { return &o->cfg; }

int ab_optim_set_config(ab_optim *o, const ab_optim_config *c) {
    int rc = ab_optim_config_validate(c);
    if (rc) return rc;
    if (c->kind != o->cfg.kind)
        return ab_fail(AB_EINVAL, "optimiser: cannot change the kind from %s to %s on a live optimiser",
                       ab_optim_kind_name(o->cfg.kind), ab_optim_kind_name(c->kind));
    o->cfg = *c;
    return 0;
}

/* ------------------------------------------------------------------------------------
 * The step
 * ---------------------------------------------------------------------------------- */

/* Per-step scalars, rounded to float once (optim_cuda.h, shared with the kernels). */
typedef ab_optim_coef step_coef;

/* Adaptive update (Adam, rectified RAdam) of `count` entries. Kept free of branches so
 * the compiler can vectorise it (GCC does when sqrtf need not set errno). */
static void update_adaptive(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                            size_t count, const step_coef *k, float keep, float l2) {
    const float gs = k->gscale, b1 = k->b1, c1 = k->c1, b2 = k->b2, c2 = k->c2;
    const float alpha = k->alpha, vs = k->vscale, eps = k->eps;
    for (size_t i = 0; i < count; i++) {
        float gi = g[i] * gs + l2 * p[i];
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        p[i] = keep * p[i] - alpha * mi / (sqrtf(vi) * vs + eps);
    }
}

/* RAdam's un-adapted momentum step: v is still updated. */
static void update_momentum(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                            size_t count, const step_coef *k, float keep, float l2) {
    const float gs = k->gscale, b1 = k->b1, c1 = k->c1, b2 = k->b2, c2 = k->c2, alpha = k->alpha;
    for (size_t i = 0; i < count; i++) {
        float gi = g[i] * gs + l2 * p[i];
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        p[i] = keep * p[i] - alpha * mi;
    }
}

/* sqrt(sum g_i^2): per-block sums in double in index order, then the block sums in
 * block order; independent of the thread count. On CUDA the block sums are computed
 * on the device the same way and copied back (which waits for the device). */
static int norm_partials_cpu(ab_optim *o, const float *g) {
    const size_t n = o->n, nb = o->n_blocks;
    double *part = o->partials;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * NORM_BLOCK, hi = lo + NORM_BLOCK < n ? lo + NORM_BLOCK : n;
        double s = 0.0;
        for (size_t i = lo; i < hi; i++) s += (double)g[i] * (double)g[i];
        part[b] = s;
    }
    return 0;
}

/* The update on the CPU: ranges in chunks of UPDATE_CHUNK over the OpenMP threads. */
static void update_cpu(ab_optim *o, float *params, const float *grad, const step_coef *k, bool adaptive) {
    const size_t n = o->n;
    const int nr = o->n_ranges;
    const ab_optim_range *rg = o->ranges;
    float *m = o->m, *v = o->v;
#pragma omp parallel if (n >= PARALLEL_MIN)
    for (int r = 0; r < nr; r++) {
        const size_t off = rg[r].offset, cnt = rg[r].count;
        const float keep = rg[r].decay ? k->keep : 1.0f;
        const float l2 = rg[r].decay ? k->l2 : 0.0f;
        const size_t nchunks = (cnt + UPDATE_CHUNK - 1) / UPDATE_CHUNK;
#pragma omp for schedule(static) nowait
        for (size_t ch = 0; ch < nchunks; ch++) {
            size_t lo = off + ch * UPDATE_CHUNK;
            size_t len = cnt - ch * UPDATE_CHUNK < UPDATE_CHUNK ? cnt - ch * UPDATE_CHUNK : UPDATE_CHUNK;
            if (adaptive) update_adaptive(params + lo, grad + lo, m + lo, v + lo, len, k, keep, l2);
            else update_momentum(params + lo, grad + lo, m + lo, v + lo, len, k, keep, l2);
        }
    }
}

static int update_on_cpu(ab_optim *o, float *params, const float *grad, const step_coef *k, bool adaptive) {
    update_cpu(o, params, grad, k, adaptive);
    return 0;
}

#ifdef ATTNBENCH_HAVE_CUDA
static int norm_partials_cuda(ab_optim *o, const float *g) {
    int rc = optim_cuda_norm_partials(o->dpartials, g, o->n, NORM_BLOCK);
    if (rc) return rc;
    return ab_dev_download(o->dev, o->partials, o->dpartials, o->n_blocks * sizeof(double));
}

static int update_on_cuda(ab_optim *o, float *params, const float *grad, const step_coef *k, bool adaptive) {
    return optim_cuda_update(params, grad, o->m, o->v, o->n, o->dranges, o->n_ranges, k, adaptive);
}
#endif

/* The optimiser's two passes on each device, found by the device's index as the
 * layers' (models/layers_dev.h): the block sums of squares of the gradient into the
 * host's o->partials, and the update of the parameters and moments. A build without
 * CUDA has no entry for it (its optimiser cannot be made there: the device block's
 * allocation fails first). */
typedef struct {
    int (*norm_partials)(ab_optim *o, const float *g);
    int (*update)(ab_optim *o, float *params, const float *grad, const step_coef *k, bool adaptive);
} optim_ops;

static const optim_ops g_ops[AB_DEV_COUNT] = {
    [AB_DEV_CPU] = {norm_partials_cpu, update_on_cpu},
#ifdef ATTNBENCH_HAVE_CUDA
    [AB_DEV_CUDA] = {norm_partials_cuda, update_on_cuda},
#endif
};

/* The passes of o's device, or NULL with the message set. */
static const optim_ops *ops_of(const ab_optim *o) {
    if (!g_ops[o->dev].update) {
        ab_fail(AB_EDEVICE, "this build has no CUDA backend");
        return NULL;
    }
    return &g_ops[o->dev];
}

static int grad_norm(ab_optim *o, const float *g, double *norm) {
    const optim_ops *ops = ops_of(o);
    if (!ops) return AB_EDEVICE;
    int rc = ops->norm_partials(o, g);
    if (rc) return rc;
    double s = 0.0;
    for (size_t b = 0; b < o->n_blocks; b++) s += o->partials[b];
    *norm = sqrt(s);
    return 0;
}

int ab_optim_step(ab_optim *o, float *params, const float *grad, ab_optim_info *info) {
    if (!params || !grad) return ab_fail(AB_EINVAL, "optimiser step: NULL %s", params ? "gradient" : "parameters");
    const ab_optim_config *c = &o->cfg;
    double norm = 0.0;
    int rc = grad_norm(o, grad, &norm);
    if (rc) return rc;
    if (!isfinite(norm))
        return ab_fail(AB_EINVAL, "optimiser step %lld: the gradient norm is %s (NaN or infinite gradients); "
                                  "parameters left unchanged",
                       o->step + 1, isnan(norm) ? "nan" : "inf");
    const long long t = o->step + 1;
    const double clip = (c->clip_norm > 0.0 && norm > c->clip_norm) ? c->clip_norm / norm : 1.0;
    const double lr = ab_optim_lr(o, t);
    const double bc1 = 1.0 - pow(c->beta1, (double)t);
    const double bc2 = 1.0 - pow(c->beta2, (double)t);

    step_coef k;
    k.gscale = (float)clip;
    k.b1 = (float)c->beta1;
    k.c1 = (float)(1.0 - c->beta1);
    k.b2 = (float)c->beta2;
    k.c2 = (float)(1.0 - c->beta2);
    k.eps = (float)c->eps;
    k.keep = c->decoupled_decay ? (float)(1.0 - lr * c->weight_decay) : 1.0f;
    k.l2 = c->decoupled_decay ? 0.0f : (float)c->weight_decay;

    bool adaptive = true;
    double rho = 0.0;
    if (c->kind == AB_OPTIM_ADAM) {
        k.alpha = (float)(lr / bc1);
        k.vscale = (float)(1.0 / sqrt(bc2));
    } else {
        const double rho_inf = 2.0 / (1.0 - c->beta2) - 1.0;
        const double b2t = pow(c->beta2, (double)t);
        rho = rho_inf - 2.0 * (double)t * b2t / (1.0 - b2t);
        adaptive = rho >= c->rectify_threshold;
        if (adaptive) {
            double r = sqrt((rho - 4.0) * (rho - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho));
            k.alpha = (float)(lr * r * sqrt(bc2) / bc1);
        } else {
            k.alpha = (float)(lr / bc1);
        }
        k.vscale = 1.0f;
    }

    if ((rc = ops_of(o)->update(o, params, grad, &k, adaptive))) return rc; /* grad_norm checked ops_of */
    o->step = t;
    if (info) {
        info->step = t;
        info->lr = lr;
        info->grad_norm = norm;
        info->clip_scale = clip;
        info->rho = rho;
        info->rectified = adaptive;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------
 * State
 * ---------------------------------------------------------------------------------- */

int ab_optim_get_state(ab_optim *o, const void **data, size_t *bytes) {
    *data = NULL;
    *bytes = 0;
    ab_put_u64(o->block + 24, (uint64_t)o->step);
    if (ab_optim_config_has_plateau(&o->cfg)) {
        ab_put_u32(o->block + 8, STATE_VERSION_PLATEAU);
        ab_put_u32(o->block + 36, (uint32_t)o->plateau.reductions);
        memcpy(o->block + 40, &o->plateau.factor, 8);
        memcpy(o->block + 48, &o->plateau.best, 8);
        ab_put_u64(o->block + 56, (uint64_t)o->plateau.bad);
    } else {
        ab_put_u32(o->block + 8, STATE_VERSION);
        memset(o->block + 36, 0, STATE_HEADER - 36);
    }
    const size_t total = STATE_HEADER + 2 * o->n * sizeof(float);
    if (ab_dev_host_memory(o->dev)) {
        *data = o->block;
        *bytes = total;
        return 0;
    }
    if (!o->mirror && !(o->mirror = ab_alloc(total))) return AB_ENOMEM;
    memcpy(o->mirror, o->block, STATE_HEADER);
    int rc = ab_dev_download(o->dev, o->mirror + STATE_HEADER, o->m, 2 * o->n * sizeof(float));
    if (rc) return rc;
    *data = o->mirror;
    *bytes = total;
    return 0;
}

void ab_optim_state(ab_optim *o, const void **data, size_t *bytes) {
    if (ab_optim_get_state(o, data, bytes)) {
        *data = NULL;
        *bytes = 0;
    }
}

int ab_optim_set_state(ab_optim *o, const void *data, size_t bytes) {
    const unsigned char *p = data;
    if (!p || bytes < STATE_HEADER || memcmp(p, STATE_MAGIC, 8) != 0)
        return ab_fail(AB_EINVAL, "optimiser state: not an attnbench optimiser state (%zu bytes, wrong magic)", bytes);
    uint32_t version = ab_get_u32(p + 8), kind = ab_get_u32(p + 12), fsize = ab_get_u32(p + 32);
    uint64_t n = ab_get_u64(p + 16), step = ab_get_u64(p + 24);
    if (version != STATE_VERSION && version != STATE_VERSION_PLATEAU)
        return ab_fail(AB_EINVAL, "optimiser state: format version %u, this build reads %u and %u", version,
                       STATE_VERSION, STATE_VERSION_PLATEAU);
    if (kind != (uint32_t)o->cfg.kind)
        return ab_fail(AB_EINVAL, "optimiser state: it is %s state, this optimiser is %s",
                       kind <= AB_OPTIM_RADAM ? ab_optim_kind_name((ab_optim_kind)kind) : "unknown",
                       ab_optim_kind_name(o->cfg.kind));
    if (n != (uint64_t)o->n)
        return ab_fail(AB_EINVAL, "optimiser state: it is for %llu parameters, this optimiser has %zu",
                       (unsigned long long)n, o->n);
    if (fsize != sizeof(float)) return ab_fail(AB_EINVAL, "optimiser state: %u-byte floats, expected 4", fsize);
    ab_optim_plateau_state pl = {1.0, INFINITY, 0, 0};
    if (version == STATE_VERSION) {
        for (size_t i = 36; i < STATE_HEADER; i++)
            if (p[i]) return ab_fail(AB_EINVAL, "optimiser state: malformed header (byte %zu is not zero)", i);
    } else {
        uint32_t red = ab_get_u32(p + 36);
        uint64_t bad = ab_get_u64(p + 56);
        memcpy(&pl.factor, p + 40, 8);
        memcpy(&pl.best, p + 48, 8);
        if (!(pl.factor > 0.0 && pl.factor <= 1.0) || isnan(pl.best) || pl.best == -INFINITY || red > INT32_MAX ||
            bad > (uint64_t)LLONG_MAX)
            return ab_fail(AB_EINVAL,
                           "optimiser state: malformed plateau state (factor %g, best %g, %llu bad evaluations, %u "
                           "reductions)",
                           pl.factor, pl.best, (unsigned long long)bad, red);
        pl.reductions = (int)red;
        pl.bad = (long long)bad;
    }
    size_t want = STATE_HEADER + 2 * o->n * sizeof(float);
    if (bytes != want)
        return ab_fail(AB_EINVAL, "optimiser state: %zu bytes, expected %zu for %zu parameters", bytes, want, o->n);
    if (step > (uint64_t)LLONG_MAX) return ab_fail(AB_EINVAL, "optimiser state: step %llu is out of range",
                                                   (unsigned long long)step);
    const unsigned char *mv = p + STATE_HEADER; /* may be unaligned: read with memcpy */
    for (size_t i = 0; i < 2 * o->n; i++) {
        float x;
        memcpy(&x, mv + i * sizeof(float), sizeof x);
        if (!isfinite(x) || (i >= o->n && x < 0.0f))
            return ab_fail(AB_EINVAL, "optimiser state: %s moment %zu is %g (must be finite%s)",
                           i < o->n ? "first" : "second", i % o->n, (double)x, i < o->n ? "" : " and >= 0");
    }
    if (ab_dev_host_memory(o->dev)) {
        memmove(o->m, mv, 2 * o->n * sizeof(float)); /* data may be our own block */
    } else {
        int rc = ab_dev_upload(o->dev, o->m, mv, 2 * o->n * sizeof(float));
        if (rc) return rc;
    }
    o->step = (long long)step;
    o->plateau = pl;
    ab_put_u64(o->block + 24, step);
    return 0;
}
