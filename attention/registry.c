/* The registry of variants, option parsing, and the checked entry points of
 * attention.h that dispatch to a variant's backend. */
#include "feature_maps.h"
#include "variant.h"

#include "../harness/cuda_blas.h"
#include "../harness/cuda_device.h"
#include "../harness/device.h"
#include "../harness/error.h"
#include "../harness/memory.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const attn_variant *const g_variants[] = {
    &attn_variant_softmax, &attn_variant_stateful_softmax, &attn_variant_linear,
    &attn_variant_polynomial, &attn_variant_lsh, &attn_variant_efficient, &attn_variant_local,
    &attn_variant_linformer, &attn_variant_retention, &attn_variant_sparse, &attn_variant_gla,
    &attn_variant_deltanet,
};
#define N_VARIANTS ((int)(sizeof g_variants / sizeof g_variants[0]))

int attn_variant_count(void) { return N_VARIANTS; }
const char *attn_variant_name(int i) { return (i >= 0 && i < N_VARIANTS) ? g_variants[i]->name : NULL; }
const char *attn_variant_summary(int i) { return (i >= 0 && i < N_VARIANTS) ? g_variants[i]->summary : NULL; }
bool attn_variant_has_step(int i) { return i >= 0 && i < N_VARIANTS && g_variants[i]->cpu->step != NULL; }
bool attn_variant_has_causal(int i) { return i >= 0 && i < N_VARIANTS && !g_variants[i]->noncausal_only; }
bool attn_variant_has_params(int i) { return i >= 0 && i < N_VARIANTS && g_variants[i]->param_count != NULL; }
bool attn_variant_has_device(int i, ab_device d) {
    if (i < 0 || i >= N_VARIANTS) return false;
    return d == AB_DEV_CPU ? true : d == AB_DEV_CUDA ? g_variants[i]->cuda != NULL : false;
}

/* Options every variant has, after its own (attn_variant_option lists them last). */
static const char *const precision_choices[] = {"fp32", "tf32", NULL};
static const attn_option_spec common_options[] = {
    {.name = "precision",
     .type = ATTN_OPT_CHOICE,
     .offset = offsetof(attn_params, precision),
     .def = "fp32",
     .help = "arithmetic of the CUDA backend's matrix products: fp32 (IEEE single precision) or tf32 (operands "
             "rounded to TF32, 10 mantissa bits, on the tensor cores; sums in fp32). The CPU computes in fp32 only",
     .choices = precision_choices},
};
#define N_COMMON ((int)(sizeof common_options / sizeof common_options[0]))
_Static_assert(AB_PREC_FP32 == 0 && AB_PREC_TF32 == 1 && AB_PREC_COUNT == 2, "precision_choices follow ab_precision");

static int n_opts(const attn_variant *v) { return v->n_options + N_COMMON; }
static const attn_option_spec *opt_of(const attn_variant *v, int j) {
    return j < v->n_options ? &v->options[j] : &common_options[j - v->n_options];
}

/* Allowed name c of a choice option (its own list, or its source's), NULL past the last. */
static const char *choice_at(const attn_option_spec *o, int c) {
    if (o->type != ATTN_OPT_CHOICE || c < 0) return NULL;
    if (o->source) return o->source->name(c);
    for (int i = 0; i <= c; i++)
        if (!o->choices[i]) return NULL;
    return o->choices[c];
}

static const char *help_of(const attn_option_spec *o) { return o->source ? o->source->help() : o->help; }

static const attn_option_spec *option_at(int i, int j) {
    if (i < 0 || i >= N_VARIANTS || j < 0 || j >= n_opts(g_variants[i])) return NULL;
    return opt_of(g_variants[i], j);
}

bool attn_variant_option(int i, int j, const char **name, const char **def, const char **help) {
    const attn_option_spec *o = option_at(i, j);
    if (!o) return false;
    if (name) *name = o->name;
    if (def) *def = o->def;
    if (help) *help = help_of(o);
    return true;
}

bool attn_variant_option_info(int i, int j, attn_option_info *info) {
    const attn_option_spec *o = option_at(i, j);
    if (!o || !info) return false;
    memset(info, 0, sizeof *info);
    info->name = o->name;
    info->def = o->def;
    info->help = help_of(o);
    info->type = o->type;
    if (o->type == ATTN_OPT_CHOICE)
        while (choice_at(o, info->n_choices)) info->n_choices++;
    else {
        info->min = o->min;
        info->max = o->max;
    }
    info->auto_ok = o->auto_ok;
    return true;
}

const char *attn_variant_option_choice(int i, int j, int c) {
    const attn_option_spec *o = option_at(i, j);
    return o ? choice_at(o, c) : NULL;
}

int attn_feature_map_count(void) { return fm_n_maps; }

bool attn_feature_map_info(int i, const char **name, const char **features, const char **help) {
    if (i < 0 || i >= fm_n_maps) return false;
    if (name) *name = fm_maps[i].name;
    if (features) *features = fm_maps[i].features;
    if (help) *help = fm_maps[i].help;
    return true;
}

int attn_variant_find(const char *name) {
    for (int i = 0; name && i < N_VARIANTS; i++)
        if (strcmp(g_variants[i]->name, name) == 0) return i;
    return -1;
}

const char *attn_error(void) { return ab_error(); }

/* ---- options ---- */

static void option_list(const attn_variant *v, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int j = 0; j < n_opts(v) && n < cap; j++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", j ? ", " : "", opt_of(v, j)->name);
}

static int parse_setting(const attn_variant *v, attn_params *p, const char *setting) {
    const char *eq = strchr(setting, '=');
    if (!eq || eq == setting)
        return ab_fail(AB_EINVAL, "option '%s' is not of the form KEY=VALUE", setting);
    size_t klen = (size_t)(eq - setting);
    const char *val = eq + 1;
    const attn_option_spec *o = NULL;
    for (int j = 0; j < n_opts(v); j++)
        if (strlen(opt_of(v, j)->name) == klen && strncmp(opt_of(v, j)->name, setting, klen) == 0) o = opt_of(v, j);
    if (!o) {
        char list[256];
        option_list(v, list, sizeof list);
        return ab_fail(AB_EINVAL, "variant '%s' has no option '%.*s' (its options: %s)", v->name, (int)klen, setting,
                       list);
    }
    char *field = (char *)p + o->offset;
    if (o->auto_ok && strcmp(val, "auto") == 0) {
        if (o->type == ATTN_OPT_DOUBLE) *(double *)field = NAN;
        else *(int *)field = 0;
        return 0;
    }
    switch (o->type) {
    case ATTN_OPT_DOUBLE: {
        char *end;
        errno = 0;
        double x = strtod(val, &end);
        if (*val == '\0' || *end != '\0' || errno || !isfinite(x))
            return ab_fail(AB_EINVAL, "option %s=%s: not a finite number", o->name, val);
        if (x < o->min || x > o->max)
            return ab_fail(AB_EINVAL, "option %s=%s: out of range [%g, %g]", o->name, val, o->min, o->max);
        *(double *)field = x;
        return 0;
    }
    case ATTN_OPT_INT: {
        char *end;
        errno = 0;
        long x = strtol(val, &end, 10);
        if (*val == '\0' || *end != '\0' || errno)
            return ab_fail(AB_EINVAL, "option %s=%s: not an integer", o->name, val);
        if ((double)x < o->min || (double)x > o->max)
            return ab_fail(AB_EINVAL, "option %s=%s: out of range [%.0f, %.0f]", o->name, val, o->min, o->max);
        *(int *)field = (int)x;
        return 0;
    }
    case ATTN_OPT_CHOICE:
        for (int c = 0; choice_at(o, c); c++)
            if (strcmp(choice_at(o, c), val) == 0) {
                *(int *)field = c;
                return 0;
            }
        {
            char list[256];
            size_t n = 0;
            list[0] = '\0';
            for (int c = 0; choice_at(o, c) && n < sizeof list; c++)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", c ? ", " : "", choice_at(o, c));
            return ab_fail(AB_EINVAL, "option %s=%s: must be one of %s", o->name, val, list);
        }
    }
    return ab_fail(AB_EINVAL, "option %s: internal type error", o->name);
}

/* The variant opt names, or NULL with the message set. */
static const attn_variant *variant_of(const attn_options *opt) {
    int vi = attn_variant_find(opt->variant);
    if (vi < 0) {
        char list[256];
        size_t n = 0;
        for (int i = 0; i < N_VARIANTS && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", g_variants[i]->name);
        ab_fail(AB_EINVAL, "unknown attention variant '%s' (known: %s)", opt->variant ? opt->variant : "(null)", list);
        return NULL;
    }
    return g_variants[vi];
}

/* opt's settings over v's defaults into *p, checked against v's option table, and
 * the precision against the device: 0, or AB_EINVAL with the message attn_create
 * gives. */
static int settings_of(const attn_variant *v, const attn_options *opt, attn_params *p) {
    memset(p, 0, sizeof *p);
    v->defaults(p);
    if (opt->n_settings < 0 || (opt->n_settings > 0 && !opt->settings))
        return ab_fail(AB_EINVAL, "attn_create: bad settings list");
    for (int i = 0; i < opt->n_settings; i++) {
        int rc = parse_setting(v, p, opt->settings[i]);
        if (rc) return rc;
    }
    if (p->precision != AB_PREC_FP32 && opt->device != AB_DEV_CUDA)
        return ab_fail(AB_EINVAL, "option precision=%s: the CPU computes in fp32 only (use --device cuda, or "
                                  "precision=fp32)",
                       ab_precision_name((ab_precision)p->precision));
    return 0;
}

/* The object attn_create would make, without its device: on the caller's stack, for
 * the questions its variant and parameters answer (the parameter count). */
static int describe(const attn_options *opt, attn *a) {
    if (!opt) return ab_fail(AB_EINVAL, "attn_variant_check: NULL options");
    memset(a, 0, sizeof *a);
    const attn_variant *v = variant_of(opt);
    if (!v) return AB_EINVAL;
    if ((unsigned)opt->device >= AB_DEV_COUNT) return ab_fail(AB_EINVAL, "unknown device %d", (int)opt->device);
    int rc = settings_of(v, opt, &a->p);
    if (rc) return rc;
    a->v = v;
    a->be = v->cpu;
    a->device = opt->device;
    a->seed = opt->seed;
    return 0;
}

int attn_variant_check(const attn_options *opt) {
    attn a;
    return describe(opt, &a);
}

int attn_variant_params(const attn_options *opt, int max_len, size_t *count, bool *shared) {
    if (!count || !shared) return ab_fail(AB_EINVAL, "attn_variant_params: NULL argument");
    *count = 0;
    *shared = false;
    attn a;
    int rc = describe(opt, &a);
    if (rc || (rc = attn_param_count(&a, max_len, count))) return rc;
    *shared = attn_params_shared_by_layers(&a);
    return 0;
}

int attn_variant_aux_of(const attn_options *opt, int qk_dim, const char **name, int *width) {
    if (!name || !width) return ab_fail(AB_EINVAL, "attn_variant_aux_of: NULL argument");
    *name = NULL;
    *width = 0;
    attn a;
    int rc = describe(opt, &a);
    if (rc) return rc;
    *name = attn_aux_name(&a);
    *width = attn_aux_width(&a, qk_dim);
    return 0;
}

int attn_create(const attn_options *opt, attn **out) {
    if (!opt || !out) return ab_fail(AB_EINVAL, "attn_create: NULL argument");
    *out = NULL;
    const attn_variant *v = variant_of(opt);
    if (!v) return AB_EINVAL;
    const attn_backend *be = NULL;
    if (opt->device == AB_DEV_CPU) be = v->cpu;
    else if (opt->device == AB_DEV_CUDA) {
        /* No CUDA in the build, or no device: "this build has no CUDA backend ..." or
         * "no CUDA device: ..." (AB_EDEVICE). */
        int rc = ab_cuda_init();
        if (rc) return rc;
        be = v->cuda;
        if (!be)
            return ab_fail(AB_EUNSUPPORTED, "variant '%s' has no CUDA implementation yet (use --device cpu)",
                           v->name);
    } else
        return ab_fail(AB_EINVAL, "unknown device %d", (int)opt->device);

    attn_params p;
    int rc = settings_of(v, opt, &p);
    if (rc) return rc;
    attn *a = calloc(1, sizeof *a);
    if (!a) return ab_fail(AB_ENOMEM, "out of memory");
    a->v = v;
    a->be = be;
    a->device = opt->device;
    a->seed = opt->seed;
    a->p = p;
    *out = a;
    return 0;
}

/* Memory of the attention's device, from the tracked allocator. */
static int dev_alloc(ab_device dev, size_t bytes, void **out) { return ab_dev_malloc(dev, out, bytes); }
static void dev_free(ab_device dev, void *p) { ab_dev_free(dev, p); }

void attn_destroy(attn *a) {
    if (!a) return;
    dev_free(a->device, a->ws);
    ab_free(a->host_ws);
    free(a);
}

const char *attn_name(const attn *a) { return a ? a->v->name : NULL; }
bool attn_has_step(const attn *a) { return a && a->be->step != NULL; }
void attn_reseed(attn *a, uint64_t seed) {
    if (a) a->seed = seed;
}

double attn_scale(const attn *a, int qk_dim) { return isnan(a->p.scale) ? 1.0 / sqrt((double)qk_dim) : a->p.scale; }

const char *attn_option_value(const attn *a, const attn_shape *s, const char *key, char *buf, size_t cap) {
    if (!a || !key || !buf || cap == 0) return NULL;
    for (int j = 0; j < n_opts(a->v); j++) {
        const attn_option_spec *o = opt_of(a->v, j);
        if (strcmp(o->name, key) != 0) continue;
        const char *field = (const char *)&a->p + o->offset;
        switch (o->type) {
        case ATTN_OPT_DOUBLE: {
            double x = *(const double *)field;
            if (isnan(x) && strcmp(o->name, "scale") == 0 && s) x = attn_scale(a, s->qk_dim);
            if (isnan(x)) snprintf(buf, cap, "%s", o->def);
            else snprintf(buf, cap, "%.9g", x);
            break;
        }
        case ATTN_OPT_INT: {
            int x = *(const int *)field;
            if (x == 0 && o->auto_ok) snprintf(buf, cap, "auto");
            else snprintf(buf, cap, "%d", x);
            break;
        }
        case ATTN_OPT_CHOICE: snprintf(buf, cap, "%s", choice_at(o, *(const int *)field)); break;
        }
        return buf;
    }
    return NULL;
}

/* ---- parameters of the variant's own ---- */

int attn_param_count(const attn *a, int max_len, size_t *count) {
    if (!a || !count) return ab_fail(AB_EINVAL, "attn_param_count: NULL argument");
    *count = 0;
    if (!a->v->param_count) return 0;
    if (max_len < 1) return ab_fail(AB_EINVAL, "variant '%s': max_len %d must be >= 1", a->v->name, max_len);
    return a->v->param_count(a, max_len, count);
}

bool attn_params_shared_by_layers(const attn *a) {
    return a && a->v->params_shared_by_layers && a->v->params_shared_by_layers(a);
}

int attn_param_init(const attn *a, int max_len, uint64_t seed, uint64_t stream, float *params) {
    size_t n;
    int rc = attn_param_count(a, max_len, &n);
    if (rc || n == 0) return rc;
    if (!params) return ab_fail(AB_EINVAL, "attn_param_init: NULL parameters");
    a->v->param_init(a, max_len, seed, stream, params);
    return 0;
}

int attn_bind_params(attn *a, int max_len, const float *params, float *grads) {
    size_t n;
    int rc = attn_param_count(a, max_len, &n);
    if (rc) return rc;
    if (n == 0) return ab_fail(AB_EINVAL, "variant '%s' has no parameters to bind", a->v->name);
    if (!params) return ab_fail(AB_EINVAL, "attn_bind_params: NULL parameters");
    a->params = params;
    a->param_grads = grads;
    a->param_len = max_len;
    return 0;
}

/* A call at shape s has what it needs of the parameters: bound, for a length that fits. */
static int check_params(const attn *a, const attn_shape *s) {
    if (!a->v->param_count) return 0;
    if (a->param_len == 0)
        return ab_fail(AB_EINVAL, "variant '%s' has learned parameters: bind them first (attn_bind_params)",
                       a->v->name);
    if (s->len > a->param_len)
        return ab_fail(AB_EINVAL, "variant '%s': sequence length N=%d exceeds the max_len %d its parameters were "
                                  "built for",
                       a->v->name, s->len, a->param_len);
    return 0;
}

/* ---- per-position input of the variant's own ---- */

const char *attn_variant_aux(int i) { return (i >= 0 && i < N_VARIANTS) ? g_variants[i]->aux_name : NULL; }
const char *attn_aux_name(const attn *a) { return a ? a->v->aux_name : NULL; }
int attn_aux_width(const attn *a, int qk_dim) {
    return a && a->v->aux_width && qk_dim > 0 ? a->v->aux_width(a, qk_dim) : 0;
}

int attn_bind_aux(attn *a, const float *aux, float *daux) {
    if (!a) return ab_fail(AB_EINVAL, "attn_bind_aux: NULL attention");
    if (!a->v->aux_name) return ab_fail(AB_EINVAL, "variant '%s' takes no input beside q, k and v", a->v->name);
    if (!aux) return ab_fail(AB_EINVAL, "attn_bind_aux: NULL %s", a->v->aux_name);
    a->aux = aux;
    a->aux_grad = daux;
    return 0;
}

/* A call of a variant with an extra input has it bound. */
static int check_aux(const attn *a) {
    if (!a->v->aux_name || a->aux) return 0;
    return ab_fail(AB_EINVAL, "variant '%s' reads the input %s: bind it first (attn_bind_aux)", a->v->name,
                   a->v->aux_name);
}

/* ---- workspace ---- */

int attn_ws_ensure(attn *a, size_t bytes) {
    if (bytes <= a->ws_bytes) return 0;
    dev_free(a->device, a->ws);
    a->ws = NULL;
    a->ws_bytes = 0;
    int rc = dev_alloc(a->device, bytes, &a->ws);
    if (rc == AB_ENOMEM) {
        char msg[512]; /* copied: ab_fail writes the buffer ab_error() points to */
        snprintf(msg, sizeof msg, "%s", ab_error());
        return ab_fail(AB_ENOMEM, "attention workspace of %zu bytes: %s", bytes, msg);
    }
    if (rc) return rc;
    a->ws_bytes = bytes;
    return 0;
}

int attn_host_ws_ensure(attn *a, size_t bytes) {
    if (bytes <= a->host_ws_bytes) return 0;
    ab_free(a->host_ws);
    a->host_ws_bytes = 0;
    if (!(a->host_ws = ab_alloc(bytes))) return ab_fail(AB_ENOMEM, "attention host scratch of %zu bytes: out of memory", bytes);
    a->host_ws_bytes = bytes;
    return 0;
}

size_t attn_workspace_bytes(const attn *a) { return a ? a->ws_bytes : 0; }

/* The device's matrix products follow the object's precision option during a call
 * (cuBLAS's math mode; the kernels read a->p.precision themselves). */
static ab_precision prec_enter(const attn *a) {
    return a->device == AB_DEV_CUDA ? ab_cuda_set_gemm_precision((ab_precision)a->p.precision) : AB_PREC_FP32;
}
static void prec_leave(const attn *a, ab_precision p0) {
    if (a->device == AB_DEV_CUDA) ab_cuda_set_gemm_precision(p0);
}

/* ---- checked entry points ---- */

static int check_dims(const attn_shape *s) {
    if (s->batch < 1 || s->heads < 1 || s->len < 1 || s->qk_dim < 1 || s->v_dim < 1)
        return ab_fail(AB_EINVAL, "shape B=%d H=%d N=%d D=%d M=%d: every size must be >= 1", s->batch, s->heads,
                       s->len, s->qk_dim, s->v_dim);
    size_t n, bh;
    /* Every tensor's element count must fit in size_t and in int64 (CUDA indexing). */
    int dmax = s->qk_dim > s->v_dim ? s->qk_dim : s->v_dim;
    if (ab_mul_size((size_t)s->batch, (size_t)s->heads, &bh) || bh > (size_t)INT32_MAX ||
        ab_mul_size(bh, (size_t)s->len, &n) ||
        ab_mul_size(n, (size_t)dmax, &n) || ab_mul_size(n, sizeof(float), &n) || n > (size_t)INT64_MAX)
        return ab_fail(AB_EINVAL, "shape B=%d H=%d N=%d D=%d M=%d: tensor size overflows", s->batch, s->heads, s->len,
                       s->qk_dim, s->v_dim);
    return 0;
}

int attn_check_shape(const attn *a, const attn_shape *s) {
    if (!a || !s) return ab_fail(AB_EINVAL, "NULL attention or shape");
    int rc = check_dims(s);
    if (rc) return rc;
    if (s->lengths)
        for (int b = 0; b < s->batch; b++)
            if (s->lengths[b] < 0 || s->lengths[b] > s->len)
                return ab_fail(AB_EINVAL, "lengths[%d] = %d is outside [0, N=%d]", b, s->lengths[b], s->len);
    if (s->causal && a->v->noncausal_only)
        return ab_fail(AB_EUNSUPPORTED, "variant '%s' is non-causal only: it has no causal form (use a non-causal "
                                        "model or shape, or another variant)",
                       a->v->name);
    return a->be->check_shape ? a->be->check_shape(a, s) : 0;
}

size_t attn_saved_bytes(const attn *a, const attn_shape *s) {
    if (attn_check_shape(a, s)) return 0;
    return a->be->saved_bytes(a, s);
}

size_t attn_workspace_need(const attn *a, const attn_shape *s) {
    if (attn_check_shape(a, s)) return 0;
    return a->be->workspace_bytes(a, s);
}

double attn_flops(const attn *a, const attn_shape *s, bool backward) {
    if (attn_check_shape(a, s)) return NAN;
    return a->v->flops(a, s, backward);
}

int attn_reserve(attn *a, const attn_shape *s) {
    int rc = attn_check_shape(a, s);
    if (rc) return rc;
    return attn_ws_ensure(a, a->be->workspace_bytes(a, s));
}

int attn_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                 void *saved) {
    int rc = attn_reserve(a, s);
    if (rc) return rc;
    if (!q || !k || !v || !out) return ab_fail(AB_EINVAL, "attn_forward: NULL tensor");
    if ((rc = check_params(a, s)) || (rc = check_aux(a))) return rc;
    if (!saved && !a->be->forward_unsaved && a->be->saved_bytes(a, s) > 0)
        return ab_fail(AB_EINVAL, "attn_forward: NULL saved buffer (%s on this device keeps its saved state)", a->v->name);
    const ab_precision p0 = prec_enter(a);
    rc = a->be->forward(a, s, q, k, v, out, saved);
    prec_leave(a, p0);
    return rc;
}

bool attn_can_forward_unsaved(const attn *a) {
    if (!a) return false;
    if (a->be->forward_unsaved) return true;
    /* a variant that saves nothing at any shape */
    attn_shape s = {1, 1, 2, 1, 1, false, NULL};
    return a->be->saved_bytes(a, &s) == 0 && (s.causal = true, a->be->saved_bytes(a, &s) == 0);
}

int attn_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, const float *dout,
                  const void *saved, float *dq, float *dk, float *dv) {
    int rc = attn_reserve(a, s);
    if (rc) return rc;
    if (!q || !k || !v || !dout || !dq || !dk || !dv) return ab_fail(AB_EINVAL, "attn_backward: NULL tensor");
    if ((rc = check_params(a, s)) || (rc = check_aux(a))) return rc;
    if (!saved && a->be->saved_bytes(a, s) > 0) return ab_fail(AB_EINVAL, "attn_backward: NULL saved buffer");
    const ab_precision p0 = prec_enter(a);
    rc = a->be->backward(a, s, q, k, v, dout, saved, dq, dk, dv);
    prec_leave(a, p0);
    return rc;
}

/* ---- recurrent mode ----
 *
 * A state is a host object holding its bookkeeping (owner, shape, capacity, positions
 * held) and a pointer to its contents in memory of the owner's device, so the checks
 * below never touch device memory. */

#define STATE_MAGIC 0x7374617465763032ULL /* "statev02" */

struct attn_state {
    uint64_t magic;
    const attn *owner;
    ab_device device;
    attn_shape shape; /* len = capacity, causal, no lengths */
    int capacity, count;
    void *mem; /* the backend's state, state_bytes of the owner's device memory */
    size_t bytes;
};

static int check_recurrent(const attn *a, const attn_shape *s, int capacity) {
    if (!a || !s) return ab_fail(AB_EINVAL, "NULL attention or shape");
    if (!a->be->step) return ab_fail(AB_EUNSUPPORTED, "variant '%s' has no recurrent mode", a->v->name);
    if (!s->causal) return ab_fail(AB_EINVAL, "recurrent mode computes causal attention: the shape must be causal");
    if (s->lengths) return ab_fail(AB_EUNSUPPORTED, "recurrent mode does not take lengths");
    if (capacity < 1) return ab_fail(AB_EINVAL, "recurrent state capacity %d must be >= 1", capacity);
    attn_shape t = *s;
    t.len = capacity;
    int rc = check_dims(&t);
    if (rc) return rc;
    return a->be->check_shape ? a->be->check_shape(a, &t) : 0;
}

/* The state is valid and belongs to a (whose variant must have a recurrent mode). */
static int check_state(const attn *a, const attn_state *st) {
    if (!a) return ab_fail(AB_EINVAL, "NULL attention");
    if (!a->be->step) return ab_fail(AB_EUNSUPPORTED, "variant '%s' has no recurrent mode", a->v->name);
    if (!st || st->magic != STATE_MAGIC) return ab_fail(AB_EINVAL, "not a recurrent state (use attn_state_create)");
    if (st->owner != a)
        return ab_fail(AB_EINVAL, "recurrent state belongs to another attention object (a state is used with the "
                                  "object that created it)");
    return 0;
}

size_t attn_state_bytes(const attn *a, const attn_shape *s, int capacity) {
    if (check_recurrent(a, s, capacity)) return 0;
    return a->be->state_bytes(a, s, capacity);
}

static int ensure_step_ws(attn *a, const attn_shape *s, int capacity) {
    if (!a->be->step_workspace_bytes) return 0;
    return attn_ws_ensure(a, a->be->step_workspace_bytes(a, s, capacity));
}

int attn_state_create(attn *a, const attn_shape *s, int capacity, attn_state **out) {
    if (!out) return ab_fail(AB_EINVAL, "attn_state_create: NULL output");
    *out = NULL;
    int rc = check_recurrent(a, s, capacity);
    if (rc) return rc;
    if ((rc = ensure_step_ws(a, s, capacity))) return rc;
    attn_state *st = calloc(1, sizeof *st);
    if (!st) return ab_fail(AB_ENOMEM, "out of memory");
    st->magic = STATE_MAGIC;
    st->owner = a;
    st->device = a->device;
    st->shape = *s;
    st->shape.len = capacity;
    st->shape.lengths = NULL;
    st->capacity = capacity;
    st->bytes = a->be->state_bytes(a, s, capacity);
    if (st->bytes && (rc = dev_alloc(a->device, st->bytes, &st->mem))) {
        char msg[512]; /* copied: ab_fail writes the buffer ab_error() points to */
        snprintf(msg, sizeof msg, "%s", ab_error());
        size_t bytes = st->bytes;
        free(st);
        return ab_fail(rc, "recurrent state of %zu bytes: %s", bytes, msg);
    }
    if ((rc = a->be->state_init(a, &st->shape, capacity, st->mem))) {
        attn_state_destroy(st);
        return rc;
    }
    *out = st;
    return 0;
}

void attn_state_destroy(attn_state *st) {
    if (!st) return;
    dev_free(st->device, st->mem);
    st->magic = 0;
    free(st);
}

int attn_state_reset(attn *a, attn_state *st) {
    int rc = check_state(a, st);
    if (rc) return rc;
    if ((rc = a->be->state_init(a, &st->shape, st->capacity, st->mem))) return rc;
    st->count = 0;
    return 0;
}

int attn_state_len(const attn_state *st) { return st && st->magic == STATE_MAGIC ? st->count : -1; }
int attn_state_capacity(const attn_state *st) { return st && st->magic == STATE_MAGIC ? st->capacity : -1; }
const attn_shape *attn_state_shape(const attn_state *st) {
    return st && st->magic == STATE_MAGIC ? &st->shape : NULL;
}

int attn_prefill(attn *a, attn_state *st, int prompt_len, const float *q, const float *k, const float *v,
                 float *out) {
    int rc = check_state(a, st);
    if (rc) return rc;
    if (prompt_len < 0 || prompt_len > st->capacity)
        return ab_fail(AB_EINVAL, "prompt of %d positions does not fit a state of capacity %d", prompt_len,
                       st->capacity);
    if (st->count != 0)
        return ab_fail(AB_EINVAL, "prefill needs an empty state (it holds %d positions)", st->count);
    if (prompt_len == 0) return 0;
    if (!q || !k || !v) return ab_fail(AB_EINVAL, "attn_prefill: NULL tensor");
    if ((rc = check_aux(a))) return rc;
    attn_shape ps = st->shape;
    ps.len = prompt_len;
    if ((rc = attn_reserve(a, &ps))) return rc;
    if ((rc = ensure_step_ws(a, &st->shape, st->capacity))) return rc;
    const ab_precision p0 = prec_enter(a);
    rc = a->be->prefill(a, &st->shape, st->capacity, prompt_len, q, k, v, out, st->mem);
    prec_leave(a, p0);
    if (rc == 0) st->count = prompt_len;
    return rc;
}

bool attn_step_replayable(const attn *a) {
    return a && a->be->step && a->be->step_replayable && a->be->step_replayable(a);
}

int attn_state_set_len(attn_state *st, int len) {
    if (!st) return ab_fail(AB_EINVAL, "attn_state_set_len: NULL state");
    if (len < 0 || len > st->capacity)
        return ab_fail(AB_EINVAL, "attn_state_set_len: %d positions is outside 0..capacity=%d", len, st->capacity);
    st->count = len;
    return 0;
}

int attn_step(attn *a, attn_state *st, int t, const float *q, const float *k, const float *v, float *out) {
    int rc = check_state(a, st);
    if (rc) return rc;
    if (t != st->count)
        return ab_fail(AB_EINVAL, "step at position %d, but the state holds %d positions", t, st->count);
    if (t >= st->capacity) return ab_fail(AB_EINVAL, "recurrent state is full (capacity %d)", st->capacity);
    if (!q || !k || !v || !out) return ab_fail(AB_EINVAL, "attn_step: NULL tensor");
    if ((rc = check_aux(a))) return rc;
    if ((rc = ensure_step_ws(a, &st->shape, st->capacity))) return rc;
    const ab_precision p0 = prec_enter(a);
    rc = a->be->step(a, &st->shape, st->capacity, st->mem, t, q, k, v, out);
    prec_leave(a, p0);
    if (rc == 0) st->count = t + 1;
    return rc;
}
