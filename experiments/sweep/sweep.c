/* attnbench bench: the attention sweep over sequence lengths (the paper's Figure 1)
 * and the recurrent side (time per generated position against context length).
 *
 * For every (variant, N) it times forward and forward+backward of the attention
 * alone, records peak tracked memory (inputs, outputs, gradients, saved state and
 * workspace), and marks a variant `skipped` at larger N once it ran out of time or
 * memory. The run document is rewritten after each point. */
#include "sweep.h"

#include "attention.h"
#include "blas.h"
#include "cli_util.h"
#include "config.h"
#include "cuda_blas.h"
#include "cuda_device.h"
#include "device.h"
#include "error.h"
#include "memory.h"
#include "results.h"
#include "rng.h"
#include "timer.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_VARIANTS 32
#define MAX_LENGTHS 64
#define MAX_SETTINGS 16

typedef struct {
    char label[64];
    const char *variant;
    const char *settings[MAX_SETTINGS];
    char *owned[MAX_SETTINGS];
    int n_settings;
    bool parallel, recurrent; /* which sides of the sweep run it ("modes") */
    char unsupported[256];    /* non-empty: the device has no implementation of it (why) */
} sweep_variant;

typedef struct {
    const char *name;
    sweep_variant variants[MAX_VARIANTS];
    int n_variants;
    long long lengths[MAX_LENGTHS];
    int n_lengths;
    int heads, qk_dim, v_dim;
    bool causal;
    bool batch_scaled;
    long long batch_size, batch_tokens, batch_max;
    int warmup, repeats;
    double time_budget_s, memory_limit_bytes;
    ab_device dev; /* where the attention runs (--device) */
    uint64_t seed;
    /* recurrent side */
    long long contexts[MAX_LENGTHS];
    int n_contexts;
    int rec_steps, rec_batch;
    /* machine gemm rate */
    int gemm_size, gemm_repeats;
} sweep_config;

static volatile sig_atomic_t g_interrupted = 0;
static void on_signal(int sig) {
    (void)sig;
    g_interrupted = 1;
}

/* ---- config ---- */

static int parse_variants(const json_t *arr, sweep_config *c) {
    if (!json_is_array(arr) || json_array_size(arr) == 0)
        return ab_fail(AB_EINVAL, "config: 'variants' must be a non-empty list");
    if (json_array_size(arr) > MAX_VARIANTS) return ab_fail(AB_EINVAL, "config: at most %d variants", MAX_VARIANTS);
    static const char *const keys[] = {"label", "variant", "set", "modes", NULL};
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        char where[32];
        snprintf(where, sizeof where, "variants.%zu", i);
        if (!json_is_object(v)) return ab_fail(AB_EINVAL, "config: '%s' must be an object", where);
        int rc = ab_config_only_keys(v, where, keys);
        if (rc) return rc;
        sweep_variant *sv = &c->variants[c->n_variants++];
        const char *label;
        if ((rc = ab_config_str(v, where, "variant", true, NULL, &sv->variant))) return rc;
        if ((rc = ab_config_str(v, where, "label", false, sv->variant, &label))) return rc;
        snprintf(sv->label, sizeof sv->label, "%s", label);
        /* "modes": ["parallel", "recurrent"] (default both; recurrent only applies to
         * variants with a step). */
        json_t *modes = json_object_get(v, "modes");
        sv->parallel = sv->recurrent = modes == NULL;
        if (modes) {
            size_t mi;
            json_t *m;
            if (!json_is_array(modes) || json_array_size(modes) == 0)
                return ab_fail(AB_EINVAL, "config: '%s.modes' must be a non-empty list of \"parallel\", \"recurrent\"", where);
            json_array_foreach(modes, mi, m) {
                const char *ms = json_string_value(m);
                if (ms && strcmp(ms, "parallel") == 0) sv->parallel = true;
                else if (ms && strcmp(ms, "recurrent") == 0) sv->recurrent = true;
                else return ab_fail(AB_EINVAL, "config: '%s.modes.%zu' must be \"parallel\" or \"recurrent\"", where, mi);
            }
        }
        json_t *set = json_object_get(v, "set");
        if (set) {
            if (!json_is_object(set)) return ab_fail(AB_EINVAL, "config: '%s.set' must be an object", where);
            const char *key;
            json_t *val;
            json_object_foreach(set, key, val) {
                if (sv->n_settings == MAX_SETTINGS) return ab_fail(AB_EINVAL, "config: too many settings in %s", where);
                char buf[256];
                if (json_is_string(val)) snprintf(buf, sizeof buf, "%s=%s", key, json_string_value(val));
                else if (json_is_integer(val)) snprintf(buf, sizeof buf, "%s=%lld", key, (long long)json_integer_value(val));
                else if (json_is_real(val)) snprintf(buf, sizeof buf, "%s=%.17g", key, json_real_value(val));
                else return ab_fail(AB_EINVAL, "config: '%s.set.%s' must be a string or a number", where, key);
                sv->owned[sv->n_settings] = strdup(buf);
                sv->settings[sv->n_settings] = sv->owned[sv->n_settings];
                sv->n_settings++;
            }
        }
        /* Validate the variant and its options now, before anything runs. */
        attn_options o = {sv->variant, ATTN_DEVICE_CPU, 0, sv->n_settings, sv->settings};
        attn *a;
        if ((rc = attn_create(&o, &a))) {
            char msg[512]; /* copied: ab_fail writes the buffer attn_error() points to */
            snprintf(msg, sizeof msg, "%s", attn_error());
            return ab_fail(AB_EINVAL, "config: %s: %s", where, msg);
        }
        attn_destroy(a);
    }
    return 0;
}

static int parse_int_list(const json_t *arr, const char *name, long long *out, int *n, long long min, long long max) {
    if (!json_is_array(arr)) return ab_fail(AB_EINVAL, "config: '%s' must be a list of integers", name);
    if (json_array_size(arr) > MAX_LENGTHS) return ab_fail(AB_EINVAL, "config: '%s' has more than %d entries", name, MAX_LENGTHS);
    size_t i;
    json_t *v;
    *n = 0;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
            return ab_fail(AB_EINVAL, "config: '%s.%zu' must be an integer in [%lld, %lld]", name, i, min, max);
        out[(*n)++] = json_integer_value(v);
    }
    return 0;
}

static int parse_config(const json_t *root, ab_device dev, sweep_config *c) {
    static const char *const top[] = {"name", "description", "variants", "lengths", "heads", "qk_dim", "v_dim",
                                      "causal", "batch", "warmup", "repeats", "time_budget_s", "memory_limit_gib",
                                      "seed", "recurrent", "gemm", NULL};
    int rc = ab_config_only_keys(root, "", top);
    if (rc) return rc;
    memset(c, 0, sizeof *c);
    c->dev = dev;
    long long x;
    double d;
    if ((rc = ab_config_str(root, "", "name", true, NULL, &c->name))) return rc;
    const char *desc;
    if ((rc = ab_config_str(root, "", "description", false, "", &desc))) return rc;
    if ((rc = parse_variants(json_object_get(root, "variants"), c))) return rc;
    json_t *lens = json_object_get(root, "lengths");
    if (!lens) return ab_fail(AB_EINVAL, "config: missing key 'lengths'");
    if ((rc = parse_int_list(lens, "lengths", c->lengths, &c->n_lengths, 1, 1 << 24))) return rc;
    if ((rc = ab_config_int(root, "", "heads", true, 0, 1, 4096, &x))) return rc;
    c->heads = (int)x;
    if ((rc = ab_config_int(root, "", "qk_dim", true, 0, 1, 65536, &x))) return rc;
    c->qk_dim = (int)x;
    if ((rc = ab_config_int(root, "", "v_dim", true, 0, 1, 65536, &x))) return rc;
    c->v_dim = (int)x;
    if ((rc = ab_config_bool(root, "", "causal", true, true, &c->causal))) return rc;
    json_t *batch = json_object_get(root, "batch");
    if (!batch || !json_is_object(batch)) return ab_fail(AB_EINVAL, "config: 'batch' must be an object {\"rule\": \"fixed\"|\"scaled\", ...}");
    static const char *const bkeys[] = {"rule", "size", "tokens", "max", NULL};
    if ((rc = ab_config_only_keys(batch, "batch", bkeys))) return rc;
    const char *rule;
    if ((rc = ab_config_str(batch, "batch", "rule", true, NULL, &rule))) return rc;
    if (strcmp(rule, "fixed") == 0) {
        c->batch_scaled = false;
        if ((rc = ab_config_int(batch, "batch", "size", true, 1, 1, 1 << 20, &c->batch_size))) return rc;
    } else if (strcmp(rule, "scaled") == 0) {
        /* The paper's rule: batch * N constant (= tokens), at least 1. */
        c->batch_scaled = true;
        if ((rc = ab_config_int(batch, "batch", "tokens", true, 0, 1, 1LL << 32, &c->batch_tokens))) return rc;
        if ((rc = ab_config_int(batch, "batch", "max", false, 1 << 20, 1, 1 << 20, &c->batch_max))) return rc;
    } else
        return ab_fail(AB_EINVAL, "config: 'batch.rule' = '%s': must be \"fixed\" or \"scaled\"", rule);
    if ((rc = ab_config_int(root, "", "warmup", false, 1, 0, 1000, &x))) return rc;
    c->warmup = (int)x;
    if ((rc = ab_config_int(root, "", "repeats", false, 5, 1, 100000, &x))) return rc;
    c->repeats = (int)x;
    if ((rc = ab_config_num(root, "", "time_budget_s", false, 30, 1e-3, 1e6, &c->time_budget_s))) return rc;
    /* Default: 3/4 of the host's memory on the CPU; the device's memory on CUDA (where
     * an allocation that does not fit fails cleanly and is recorded as oom). */
    double avail = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) * 0.75;
    if (c->dev == AB_DEV_CUDA) {
        size_t free_b = 0, total_b = 0;
        if ((rc = ab_cuda_mem_info(&free_b, &total_b))) return rc;
        avail = (double)total_b;
    }
    if ((rc = ab_config_num(root, "", "memory_limit_gib", false, avail / 1073741824.0, 1e-6, 1e6, &d))) return rc;
    c->memory_limit_bytes = d * 1073741824.0;
    if ((rc = ab_config_int(root, "", "seed", false, 0, 0, INT64_MAX, &x))) return rc;
    c->seed = (uint64_t)x;
    json_t *rec = json_object_get(root, "recurrent");
    if (rec) {
        if (!json_is_object(rec)) return ab_fail(AB_EINVAL, "config: 'recurrent' must be an object");
        static const char *const rkeys[] = {"contexts", "steps", "batch", NULL};
        if ((rc = ab_config_only_keys(rec, "recurrent", rkeys))) return rc;
        json_t *ctx = json_object_get(rec, "contexts");
        if (!ctx) return ab_fail(AB_EINVAL, "config: missing key 'recurrent.contexts'");
        if ((rc = parse_int_list(ctx, "recurrent.contexts", c->contexts, &c->n_contexts, 0, 1 << 24))) return rc;
        if ((rc = ab_config_int(rec, "recurrent", "steps", false, 32, 1, 1 << 20, &x))) return rc;
        c->rec_steps = (int)x;
        if ((rc = ab_config_int(rec, "recurrent", "batch", false, 1, 1, 1 << 16, &x))) return rc;
        c->rec_batch = (int)x;
    }
    c->gemm_size = 2048;
    c->gemm_repeats = 5;
    json_t *gemm = json_object_get(root, "gemm");
    if (gemm) {
        if (!json_is_object(gemm)) return ab_fail(AB_EINVAL, "config: 'gemm' must be an object");
        static const char *const gkeys[] = {"size", "repeats", NULL};
        if ((rc = ab_config_only_keys(gemm, "gemm", gkeys))) return rc;
        if ((rc = ab_config_int(gemm, "gemm", "size", false, 2048, 0, 32768, &x))) return rc;
        c->gemm_size = (int)x;
        if ((rc = ab_config_int(gemm, "gemm", "repeats", false, 5, 1, 1000, &x))) return rc;
        c->gemm_repeats = (int)x;
    }
    return 0;
}

/* ---- measurement helpers ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Quantile by linear interpolation of the sorted samples. */
static double quantile(const double *sorted, int n, double p) {
    if (n == 0) return NAN;
    double pos = p * (n - 1);
    int lo = (int)floor(pos);
    int hi = lo + 1 < n ? lo + 1 : lo;
    return sorted[lo] + (pos - lo) * (sorted[hi] - sorted[lo]);
}

static json_t *stats_json(double *ms, int n) {
    qsort(ms, (size_t)n, sizeof *ms, cmp_double);
    json_t *o = json_object();
    json_object_set_new(o, "median", ab_json_num(quantile(ms, n, 0.5)));
    json_object_set_new(o, "p20", ab_json_num(quantile(ms, n, 0.2)));
    json_object_set_new(o, "p80", ab_json_num(quantile(ms, n, 0.8)));
    json_object_set_new(o, "n", json_integer(n));
    return o;
}

static void fill_normal(float *x, size_t n, uint64_t seed, uint64_t stream) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = (float)ab_rng_normal(seed, stream, i);
}

/* Useful floating-point operations of one call, where well defined: the quadratic
 * softmax products (half of them when causal), and the scan form of linear attention
 * (feature dimension C, values augmented by the denominator's column). NAN otherwise. */
static double flops(const char *variant, const attn *a, const attn_shape *s, bool backward) {
    double bh = (double)s->batch * s->heads, n = s->len, D = s->qk_dim, M = s->v_dim;
    if (strcmp(variant, "softmax") == 0 || strcmp(variant, "stateful-softmax") == 0) {
        double pairs = s->causal ? n * (n + 1) / 2 : n * n;
        double fwd = 2 * pairs * (D + M) * bh;
        return backward ? 3 * fwd : fwd;
    }
    double C;
    if (strcmp(variant, "linear") == 0) {
        char buf[32];
        const char *fm = attn_option_value(a, s, "feature_map", buf, sizeof buf);
        C = (fm && strcmp(fm, "taylor") == 0) ? D + 1 : D;
    } else if (strcmp(variant, "polynomial") == 0) {
        C = 1 + D + D * D;
    } else
        return NAN;
    double fwd = 4 * n * C * (M + 1) * bh;
    return backward ? 3 * fwd : fwd;
}

static json_t *options_json(const attn *a, const attn_shape *s) {
    json_t *o = json_object();
    int vi = attn_variant_find(attn_name(a));
    const char *name;
    char buf[64];
    for (int j = 0; attn_variant_option(vi, j, &name, NULL, NULL); j++) {
        const char *v = attn_option_value(a, s, name, buf, sizeof buf);
        char *end;
        double d = strtod(v, &end);
        json_object_set_new(o, name, (*end == '\0' && end != v) ? json_real(d) : json_string(v));
    }
    return o;
}

/* Fills n floats of x (on device d) with normal(seed, stream) numbers, through the
 * host buffer `stage` (n floats) when x is device memory. */
static int fill_normal_dev(ab_device d, float *x, size_t n, uint64_t seed, uint64_t stream, float *stage) {
    if (d == AB_DEV_CPU) {
        fill_normal(x, n, seed, stream);
        return 0;
    }
    fill_normal(stage, n, seed, stream);
    return ab_dev_upload(d, x, stage, n * sizeof(float));
}

/* The machine's sgemm rate (GFLOP/s) on the device: OpenBLAS or cuBLAS. */
static double measure_gemm(ab_device d, int n, int repeats) {
    if (n <= 0) return NAN;
    size_t bytes = (size_t)n * n * sizeof(float);
    float *a = NULL, *b = NULL, *c = NULL, *stage = d == AB_DEV_CPU ? NULL : ab_alloc(bytes);
    double *ms = malloc(sizeof(double) * (size_t)repeats);
    double rate = NAN;
    if (ms && (d == AB_DEV_CPU || stage) && !ab_dev_malloc(d, (void **)&a, bytes) &&
        !ab_dev_malloc(d, (void **)&b, bytes) && !ab_dev_malloc(d, (void **)&c, bytes) &&
        !fill_normal_dev(d, a, (size_t)n * n, 1, 0, stage) && !fill_normal_dev(d, b, (size_t)n * n, 1, 1, stage) &&
        !ab_dev_memset(d, c, 0, bytes)) {
        int rc = 0;
        for (int r = -1; r < repeats && !rc; r++) { /* r = -1: warm-up */
            rc = ab_dev_sync(d);
            uint64_t t0 = ab_now_ns();
            if (!rc && d == AB_DEV_CPU) ab_sgemm(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            else if (!rc) rc = ab_cuda_sgemm(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            if (!rc) rc = ab_dev_sync(d);
            if (r >= 0) ms[r] = ab_ms_since(t0);
        }
        if (!rc) {
            qsort(ms, (size_t)repeats, sizeof *ms, cmp_double);
            rate = 2.0 * n * (double)n * n / (quantile(ms, repeats, 0.5) * 1e-3) * 1e-9;
        }
    }
    free(ms);
    ab_free(stage);
    ab_dev_free(d, a);
    ab_dev_free(d, b);
    ab_dev_free(d, c);
    return rate;
}

/* ---- one parallel point ---- */

typedef struct {
    const char *status;
    double fwd_bwd_first_ms;
} point_result;

static json_t *base_record(const sweep_variant *sv, const attn *a, const attn_shape *s, const char *kind) {
    json_t *r = json_object();
    json_object_set_new(r, "kind", json_string(kind));
    json_object_set_new(r, "variant", json_string(sv->label));
    json_object_set_new(r, "variant_name", json_string(sv->variant));
    json_object_set_new(r, "options", options_json(a, s));
    json_object_set_new(r, "len", json_integer(s->len));
    json_object_set_new(r, "batch", json_integer(s->batch));
    json_object_set_new(r, "heads", json_integer(s->heads));
    json_object_set_new(r, "qk_dim", json_integer(s->qk_dim));
    json_object_set_new(r, "v_dim", json_integer(s->v_dim));
    json_object_set_new(r, "causal", json_boolean(s->causal));
    return r;
}

static void null_timings(json_t *r) {
    const char *keys[] = {"fwd_ms", "fwd_bwd_ms", "per_sample_fwd_ms", "per_sample_fwd_bwd_ms", "peak_bytes",
                          "peak_bytes_per_sample", "fwd_gflops", "fwd_bwd_gflops"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!json_object_get(r, keys[i])) json_object_set_new(r, keys[i], json_null());
}

/* Timing on a device: the clock is read after waiting for the device's queued work,
 * so a CUDA call's time is its full execution (the same host timer on both devices). */
static int sync_ms(ab_device d, uint64_t t0, double *ms) {
    int rc = ab_dev_sync(d);
    *ms = ab_ms_since(t0);
    return rc;
}

/* The device's own view of its memory (cudaMemGetInfo: everything in use on the GPU,
 * the CUDA context and cuBLAS workspace included), next to the tracked figure. */
static void device_memory_json(json_t *rec, ab_device d) {
    size_t free_b = 0, total_b = 0;
    if (d != AB_DEV_CUDA) return;
    if (ab_cuda_mem_info(&free_b, &total_b) == 0) {
        json_object_set_new(rec, "device_used_bytes", json_integer((json_int_t)(total_b - free_b)));
        json_object_set_new(rec, "device_total_bytes", json_integer((json_int_t)total_b));
    }
}

static json_t *run_point(const sweep_config *c, const sweep_variant *sv, attn *a, const attn_shape *s,
                         bool *stop_variant) {
    const ab_device dev = c->dev;
    json_t *rec = base_record(sv, a, s, "parallel");
    size_t bh = (size_t)s->batch * s->heads;
    size_t nq = bh * s->len * s->qk_dim, nv = bh * s->len * s->v_dim;
    size_t saved_bytes = attn_saved_bytes(a, s);
    size_t ws_bytes = attn_workspace_need(a, s);
    double need = (double)sizeof(float) * (3.0 * nq + 5.0 * nv) + (double)saved_bytes + (double)ws_bytes;
    json_object_set_new(rec, "estimated_bytes", json_real(need));
    if (need > c->memory_limit_bytes) {
        json_object_set_new(rec, "status", json_string("oom"));
        json_object_set_new(rec, "reason", json_string("estimated memory exceeds memory_limit_gib"));
        null_timings(rec);
        *stop_variant = true;
        return rec;
    }
    /* Everything the call touches, through the tracked allocator of the device; peak
     * measured from here. On CUDA the inputs are generated on the host (stage) and
     * copied over. */
    size_t base = ab_mem_current(dev);
    ab_mem_reset_peak(dev);
    float *q = NULL, *k = NULL, *v = NULL, *out = NULL, *dout = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    void *saved = NULL;
    float *stage = NULL;
    int rc = 0;
    if (dev != AB_DEV_CPU && !(stage = ab_alloc((nq > nv ? nq : nv) * 4))) rc = AB_ENOMEM;
    if (!rc) rc = ab_dev_malloc(dev, (void **)&q, nq * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&k, nq * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&v, nv * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&out, nv * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&dout, nv * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&dq, nq * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&dk, nq * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&dv, nv * 4);
    if (!rc) rc = ab_dev_malloc(dev, &saved, saved_bytes);
    if (!rc) rc = attn_reserve(a, s);
    if (!rc) rc = fill_normal_dev(dev, q, nq, c->seed, 0, stage);
    if (!rc) rc = fill_normal_dev(dev, k, nq, c->seed, 1, stage);
    if (!rc) rc = fill_normal_dev(dev, v, nv, c->seed, 2, stage);
    if (!rc) rc = fill_normal_dev(dev, dout, nv, c->seed, 3, stage);
    if (!rc) rc = ab_dev_memset(dev, out, 0, nv * 4);
    if (!rc) rc = ab_dev_memset(dev, dq, 0, nq * 4);
    if (!rc) rc = ab_dev_memset(dev, dk, 0, nq * 4);
    if (!rc) rc = ab_dev_memset(dev, dv, 0, nv * 4);
    if (!rc && saved) rc = ab_dev_memset(dev, saved, 0, saved_bytes);
    ab_free(stage);
    const char *status = "ok";
    if (rc == AB_ENOMEM) {
        status = "oom";
        json_object_set_new(rec, "reason", json_string(ab_error()));
        *stop_variant = true;
    } else if (rc) {
        status = "failed";
        json_object_set_new(rec, "reason", json_string(ab_error()));
        *stop_variant = true;
    }
    int max_rep = c->repeats;
    double *fwd_ms = calloc((size_t)max_rep, sizeof(double)), *fb_ms = calloc((size_t)max_rep, sizeof(double));
    int n_fwd = 0, n_fb = 0;
    if (rc == 0) {
        /* First call (forward + backward), also the time-budget probe. */
        double first;
        uint64_t t0 = ab_now_ns();
        rc = attn_forward(a, s, q, k, v, out, saved);
        if (!rc) rc = attn_backward(a, s, q, k, v, dout, saved, dq, dk, dv);
        int rs = sync_ms(dev, t0, &first);
        if (!rc) rc = rs;
        json_object_set_new(rec, "first_call_ms", json_real(first));
        if (rc) {
            status = rc == AB_ENOMEM ? "oom" : "failed";
            json_object_set_new(rec, "reason", json_string(ab_error()));
            *stop_variant = true;
        } else if (first > c->time_budget_s * 1e3) {
            status = "timeout";
            json_object_set_new(rec, "reason", json_string("one forward+backward call exceeded time_budget_s"));
            *stop_variant = true;
        } else {
            double budget_ms = c->time_budget_s * 1e3;
            /* Repeats shrink so a point stays near its budget: fwd + fwd+bwd ~ 1.5x first. */
            int reps = (int)fmin((double)max_rep, fmax(1.0, floor(budget_ms / (1.5 * first))));
            for (int w = 1; w < c->warmup && !rc; w++) {
                rc = attn_forward(a, s, q, k, v, out, saved);
                if (!rc) rc = attn_backward(a, s, q, k, v, dout, saved, dq, dk, dv);
                if (!rc) rc = ab_dev_sync(dev);
            }
            for (int r = 0; r < reps && !rc && !g_interrupted; r++) {
                uint64_t t1 = ab_now_ns();
                rc = attn_forward(a, s, q, k, v, out, saved);
                rs = sync_ms(dev, t1, &fwd_ms[n_fwd++]);
                if (!rc) rc = rs;
            }
            for (int r = 0; r < reps && !rc && !g_interrupted; r++) {
                uint64_t t1 = ab_now_ns();
                rc = attn_forward(a, s, q, k, v, out, saved);
                if (!rc) rc = attn_backward(a, s, q, k, v, dout, saved, dq, dk, dv);
                rs = sync_ms(dev, t1, &fb_ms[n_fb++]);
                if (!rc) rc = rs;
            }
            if (rc) {
                status = rc == AB_ENOMEM ? "oom" : "failed";
                json_object_set_new(rec, "reason", json_string(ab_error()));
                *stop_variant = true;
            }
        }
    }
    json_object_set_new(rec, "status", json_string(status));
    size_t peak = ab_mem_peak(dev) - base;
    if (strcmp(status, "ok") == 0 && n_fwd > 0 && n_fb > 0) {
        double fwd_med, fb_med;
        json_t *fs = stats_json(fwd_ms, n_fwd), *fbs = stats_json(fb_ms, n_fb);
        fwd_med = json_real_value(json_object_get(fs, "median"));
        fb_med = json_real_value(json_object_get(fbs, "median"));
        json_object_set_new(rec, "fwd_ms", fs);
        json_object_set_new(rec, "fwd_bwd_ms", fbs);
        json_object_set_new(rec, "per_sample_fwd_ms", ab_json_num(fwd_med / s->batch));
        json_object_set_new(rec, "per_sample_fwd_bwd_ms", ab_json_num(fb_med / s->batch));
        json_object_set_new(rec, "peak_bytes", json_integer((json_int_t)peak));
        json_object_set_new(rec, "peak_bytes_per_sample", ab_json_num((double)peak / s->batch));
        json_object_set_new(rec, "saved_bytes", json_integer((json_int_t)saved_bytes));
        json_object_set_new(rec, "workspace_bytes", json_integer((json_int_t)attn_workspace_bytes(a)));
        double ff = flops(sv->variant, a, s, false), fbf = flops(sv->variant, a, s, true);
        json_object_set_new(rec, "fwd_gflops", ab_json_num(ff / (fwd_med * 1e-3) * 1e-9));
        json_object_set_new(rec, "fwd_bwd_gflops", ab_json_num(fbf / (fb_med * 1e-3) * 1e-9));
        device_memory_json(rec, dev);
    }
    json_object_set_new(rec, "process_peak_rss_bytes", json_integer((json_int_t)ab_process_peak_rss()));
    null_timings(rec);
    free(fwd_ms);
    free(fb_ms);
    ab_dev_free(dev, q);
    ab_dev_free(dev, k);
    ab_dev_free(dev, v);
    ab_dev_free(dev, out);
    ab_dev_free(dev, dout);
    ab_dev_free(dev, dq);
    ab_dev_free(dev, dk);
    ab_dev_free(dev, dv);
    ab_dev_free(dev, saved);
    return rec;
}

/* ---- one recurrent point: time per generated position after a prompt of T ---- */

static json_t *run_recurrent(const sweep_config *c, const sweep_variant *sv, attn *a, long long context,
                             bool *stop_variant) {
    const ab_device dev = c->dev;
    attn_shape s = {c->rec_batch, c->heads, (int)(context > 0 ? context : 1), c->qk_dim, c->v_dim, true, NULL};
    json_t *rec = base_record(sv, a, &s, "recurrent");
    json_object_set_new(rec, "context", json_integer(context));
    json_object_set_new(rec, "steps", json_integer(c->rec_steps));
    int cap = (int)context + c->rec_steps;
    size_t bh = (size_t)s.batch * s.heads;
    size_t state_bytes = attn_state_bytes(a, &s, cap);
    const char *status = "ok";
    double *ms = calloc((size_t)c->rec_steps, sizeof(double));
    size_t base = ab_mem_current(dev);
    ab_mem_reset_peak(dev);
    size_t np = bh * (size_t)(context > 0 ? context : 1);
    float *q = NULL, *k = NULL, *v = NULL, *qt = NULL, *kt = NULL, *vt = NULL, *ot = NULL, *stage = NULL;
    attn_state *state = NULL;
    int rc = state_bytes ? 0 : AB_EINVAL;
    if (!rc && (double)state_bytes + 4.0 * np * (2 * s.qk_dim + s.v_dim) > c->memory_limit_bytes) {
        rc = ab_fail(AB_ENOMEM, "estimated memory exceeds memory_limit_gib");
    }
    size_t nmax = np * (size_t)(s.qk_dim > s.v_dim ? s.qk_dim : s.v_dim);
    if (!rc && dev != AB_DEV_CPU && !(stage = ab_alloc(nmax * 4))) rc = AB_ENOMEM;
    if (!rc) rc = attn_state_create(a, &s, cap, &state);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&q, np * s.qk_dim * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&k, np * s.qk_dim * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&v, np * s.v_dim * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&qt, bh * s.qk_dim * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&kt, bh * s.qk_dim * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&vt, bh * s.v_dim * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&ot, bh * s.v_dim * 4);
    if (!rc) rc = fill_normal_dev(dev, q, np * s.qk_dim, c->seed, 10, stage);
    if (!rc) rc = fill_normal_dev(dev, k, np * s.qk_dim, c->seed, 11, stage);
    if (!rc) rc = fill_normal_dev(dev, v, np * s.v_dim, c->seed, 12, stage);
    if (!rc) rc = fill_normal_dev(dev, qt, bh * s.qk_dim, c->seed, 13, stage);
    if (!rc) rc = fill_normal_dev(dev, kt, bh * s.qk_dim, c->seed, 14, stage);
    if (!rc) rc = fill_normal_dev(dev, vt, bh * s.v_dim, c->seed, 15, stage);
    ab_free(stage);
    double prefill_ms = NAN;
    if (!rc) {
        rc = ab_dev_sync(dev);
        uint64_t t0 = ab_now_ns();
        if (!rc && context > 0) rc = attn_prefill(a, state, (int)context, q, k, v, NULL);
        int rs = sync_ms(dev, t0, &prefill_ms);
        if (!rc) rc = rs;
        for (int t = 0; t < c->rec_steps && !rc; t++) {
            uint64_t t1 = ab_now_ns();
            rc = attn_step(a, state, (int)context + t, qt, kt, vt, ot);
            rs = sync_ms(dev, t1, &ms[t]);
            if (!rc) rc = rs;
        }
    }
    if (rc) {
        status = rc == AB_ENOMEM ? "oom" : "failed";
        json_object_set_new(rec, "reason", json_string(ab_error()));
        *stop_variant = true;
    }
    json_object_set_new(rec, "status", json_string(status));
    if (!rc) {
        json_t *st = stats_json(ms, c->rec_steps);
        double med = json_real_value(json_object_get(st, "median"));
        json_object_set_new(rec, "step_ms", st);
        json_object_set_new(rec, "per_position_ms", ab_json_num(med));
        json_object_set_new(rec, "positions_per_s", ab_json_num(s.batch * 1e3 / med));
        json_object_set_new(rec, "prefill_ms", ab_json_num(prefill_ms));
        json_object_set_new(rec, "state_bytes", json_integer((json_int_t)state_bytes));
        json_object_set_new(rec, "peak_bytes", json_integer((json_int_t)(ab_mem_peak(dev) - base)));
        device_memory_json(rec, dev);
    } else {
        json_object_set_new(rec, "step_ms", json_null());
        json_object_set_new(rec, "per_position_ms", json_null());
    }
    free(ms);
    attn_state_destroy(state);
    ab_dev_free(dev, q);
    ab_dev_free(dev, k);
    ab_dev_free(dev, v);
    ab_dev_free(dev, qt);
    ab_dev_free(dev, kt);
    ab_dev_free(dev, vt);
    ab_dev_free(dev, ot);
    return rec;
}

/* ---- summary: how time grows with N ---- */

/* Least-squares slope of log(per-sample fwd+bwd time) against log(N) over a
 * variant's ok points: 1 for linear growth, 2 for quadratic. */
static json_t *growth_summary(json_t *records) {
    json_t *out = json_object();
    size_t i;
    json_t *r;
    json_array_foreach(records, i, r) {
        const char *kind = json_string_value(json_object_get(r, "kind"));
        const char *var = json_string_value(json_object_get(r, "variant"));
        if (!kind || strcmp(kind, "parallel") != 0 || !var || json_object_get(out, var)) continue;
        double sx = 0, sy = 0, sxx = 0, sxy = 0;
        int n = 0;
        long long lo = 0, hi = 0;
        size_t j;
        json_t *q;
        json_array_foreach(records, j, q) {
            const char *k2 = json_string_value(json_object_get(q, "kind"));
            const char *v2 = json_string_value(json_object_get(q, "variant"));
            const char *st = json_string_value(json_object_get(q, "status"));
            json_t *t = json_object_get(q, "per_sample_fwd_bwd_ms");
            if (!k2 || strcmp(k2, "parallel") || !v2 || strcmp(v2, var) || !st || strcmp(st, "ok") || !json_is_number(t))
                continue;
            long long len = json_integer_value(json_object_get(q, "len"));
            double x = log((double)len), y = log(json_number_value(t));
            sx += x, sy += y, sxx += x * x, sxy += x * y, n++;
            if (!lo || len < lo) lo = len;
            if (len > hi) hi = len;
        }
        json_t *e = json_object();
        double den = n * sxx - sx * sx;
        json_object_set_new(e, "fwd_bwd_time_exponent", n >= 2 && den > 0 ? ab_json_num((n * sxy - sx * sy) / den) : json_null());
        json_object_set_new(e, "points", json_integer(n));
        json_object_set_new(e, "len_min", json_integer(lo));
        json_object_set_new(e, "len_max", json_integer(hi));
        json_object_set_new(out, var, e);
    }
    return out;
}

/* ---- the command ---- */

static const char BENCH_USAGE[] =
    "usage: attnbench bench CONFIG.json [--set KEY=VALUE]... [--device cpu|cuda] [--out FILE] [--quiet]\n"
    "\n"
    "Runs the attention sweep of CONFIG (see experiments/sweep/): for every variant and\n"
    "length, forward and forward+backward time (median, p20, p80) and peak tracked\n"
    "memory; then the recurrent step time at each context length, and this machine's\n"
    "sgemm rate. --device cuda runs on the GPU (variants without a CUDA\n"
    "implementation are recorded as skipped, with the reason). --set overrides a config\n"
    "value by its dotted path (e.g. --set repeats=3, --set lengths=[512,1024]). Writes\n"
    "FILE (default results/NAME.json, NAME from the config) after every point, and a\n"
    "TSV beside it.\n";

static const char *const TSV_COLUMNS[] = {
    "kind", "variant", "len", "context", "batch", "heads", "qk_dim", "v_dim", "causal", "status",
    "fwd_ms.median", "fwd_ms.p20", "fwd_ms.p80", "fwd_bwd_ms.median", "fwd_bwd_ms.p20", "fwd_bwd_ms.p80",
    "per_sample_fwd_ms", "per_sample_fwd_bwd_ms", "peak_bytes", "peak_bytes_per_sample", "fwd_bwd_gflops",
    "per_position_ms", "state_bytes", NULL};

int sweep_main(int argc, char **argv, const char *command_line) {
    const char *config_path = NULL, *out_path = NULL;
    const char *sets[64];
    int n_sets = 0;
    bool quiet = false;
    attn_device device = ATTN_DEVICE_CPU;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            fputs(BENCH_USAGE, stdout);
            return 0;
        } else if (strcmp(argv[i], "--set") == 0) {
            if (n_sets == 64) cli_die(AB_EXIT_USAGE, "too many --set options");
            sets[n_sets++] = cli_value(argc, argv, &i);
        } else if (strcmp(argv[i], "--out") == 0) out_path = cli_value(argc, argv, &i);
        else if (strcmp(argv[i], "--device") == 0) {
            const char *d = cli_value(argc, argv, &i);
            if (strcmp(d, "cpu") == 0) device = ATTN_DEVICE_CPU;
            else if (strcmp(d, "cuda") == 0) device = ATTN_DEVICE_CUDA;
            else cli_die(AB_EXIT_USAGE, "--device %s: must be cpu or cuda", d);
        } else if (strcmp(argv[i], "--quiet") == 0) quiet = true;
        else if (argv[i][0] == '-') cli_die(AB_EXIT_USAGE, "bench: unknown argument '%s' (see attnbench bench --help)", argv[i]);
        else if (!config_path) config_path = argv[i];
        else cli_die(AB_EXIT_USAGE, "bench: more than one config given ('%s' and '%s')", config_path, argv[i]);
    }
    if (!config_path) cli_die(AB_EXIT_USAGE, "bench: a CONFIG.json is required (see experiments/sweep/)");
    json_t *root = ab_config_load(config_path);
    if (!root) cli_die(AB_EXIT_USAGE, "%s", ab_error());
    for (int i = 0; i < n_sets; i++)
        if (ab_config_set(root, sets[i], false)) cli_die(AB_EXIT_USAGE, "%s", ab_error());
    /* The device is checked up front: a build without CUDA, or a machine without a GPU,
     * says so before any work (exit status 2: the request cannot be served here). */
    if (device == ATTN_DEVICE_CUDA && ab_cuda_init()) cli_die(AB_EXIT_USAGE, "%s", ab_error());
    sweep_config c;
    if (parse_config(root, (ab_device)device, &c)) cli_die(AB_EXIT_USAGE, "%s: %s", config_path, ab_error());
    /* A variant the device has no implementation of is reported as skipped, with the
     * reason, at every point; the others run. */
    for (int i = 0; i < c.n_variants; i++) {
        attn_options o = {c.variants[i].variant, device, c.seed, c.variants[i].n_settings, c.variants[i].settings};
        attn *a;
        int rc = attn_create(&o, &a);
        if (rc == AB_EUNSUPPORTED) {
            snprintf(c.variants[i].unsupported, sizeof c.variants[i].unsupported, "%s", attn_error());
            if (!quiet) fprintf(stderr, "bench: %s: skipped (%s)\n", c.variants[i].label, attn_error());
            continue;
        }
        if (rc) cli_die(rc == AB_ENOMEM ? AB_EXIT_FAILURE : AB_EXIT_USAGE, "%s", attn_error());
        attn_destroy(a);
    }
    char default_out[512];
    if (!out_path) {
        snprintf(default_out, sizeof default_out, "results/%s.json", c.name);
        out_path = default_out;
    }
    json_object_set_new(root, "device", json_string(device == ATTN_DEVICE_CUDA ? "cuda" : "cpu"));
    ab_run *run = ab_run_begin(out_path, command_line, root, c.seed, TSV_COLUMNS);
    if (!run) cli_die(AB_EXIT_USAGE, "%s", ab_error());
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    double gemm = measure_gemm(c.dev, c.gemm_size, c.gemm_repeats);
    json_t *g = json_object();
    json_object_set_new(g, "size", json_integer(c.gemm_size));
    json_object_set_new(g, "gflops", ab_json_num(gemm));
    json_object_set_new(g, "device", json_string(ab_dev_name(c.dev)));
    json_object_set_new(g, "threads", json_integer(ab_threads()));
    ab_run_set(run, "sgemm", g);
    if (!quiet && c.dev == AB_DEV_CPU)
        fprintf(stderr, "bench: sgemm %dx%d: %.1f GFLOP/s on %d threads\n", c.gemm_size, c.gemm_size, gemm, ab_threads());
    else if (!quiet)
        fprintf(stderr, "bench: sgemm %dx%d on the device (cuBLAS): %.1f GFLOP/s\n", c.gemm_size, c.gemm_size, gemm);
    if (ab_run_save(run)) cli_die(AB_EXIT_FAILURE, "%s", ab_error());

    int failed = 0;
    for (int vi = 0; vi < c.n_variants && !g_interrupted; vi++) {
        sweep_variant *sv = &c.variants[vi];
        /* Without an implementation on the device, a CPU object only describes the
         * variant's options in the skipped records. */
        const bool unsupported = sv->unsupported[0] != '\0';
        attn_options o = {sv->variant, unsupported ? ATTN_DEVICE_CPU : device, c.seed, sv->n_settings, sv->settings};
        attn *a;
        if (attn_create(&o, &a)) cli_die(AB_EXIT_USAGE, "%s", attn_error());
        bool stop = false;
        for (int li = 0; li < c.n_lengths && sv->parallel && !g_interrupted; li++) {
            long long n = c.lengths[li];
            long long b = c.batch_scaled ? c.batch_tokens / n : c.batch_size;
            if (b < 1) b = 1;
            if (c.batch_scaled && b > c.batch_max) b = c.batch_max;
            attn_shape s = {(int)b, c.heads, (int)n, c.qk_dim, c.v_dim, c.causal, NULL};
            json_t *rec;
            if (unsupported || stop) {
                rec = base_record(sv, a, &s, "parallel");
                json_object_set_new(rec, "status", json_string("skipped"));
                json_object_set_new(rec, "reason", json_string(unsupported ? sv->unsupported
                                                                           : "ran out of time or memory at a smaller length"));
                null_timings(rec);
            } else {
                rec = run_point(&c, sv, a, &s, &stop);
            }
            const char *st = json_string_value(json_object_get(rec, "status"));
            if (strcmp(st, "failed") == 0) failed++;
            if (!quiet) {
                json_t *fb = json_object_get(json_object_get(rec, "fwd_bwd_ms"), "median");
                fprintf(stderr, "bench: %-18s N=%-6lld B=%-4lld %-8s fwd+bwd %10.3f ms  peak %8.1f MiB\n", sv->label, n,
                        b, st, fb ? json_real_value(fb) : NAN,
                        json_integer_value(json_object_get(rec, "peak_bytes")) / 1048576.0);
            }
            if (ab_run_add(run, rec)) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
        }
        if (attn_has_step(a) && sv->recurrent) {
            stop = false;
            for (int ci = 0; ci < c.n_contexts && !g_interrupted; ci++) {
                json_t *rec;
                if (unsupported || stop) {
                    attn_shape s = {c.rec_batch, c.heads, (int)c.contexts[ci], c.qk_dim, c.v_dim, true, NULL};
                    rec = base_record(sv, a, &s, "recurrent");
                    json_object_set_new(rec, "context", json_integer(c.contexts[ci]));
                    json_object_set_new(rec, "status", json_string("skipped"));
                    json_object_set_new(rec, "reason", json_string(unsupported ? sv->unsupported
                                                                               : "ran out of time or memory at a shorter context"));
                } else {
                    rec = run_recurrent(&c, sv, a, c.contexts[ci], &stop);
                }
                if (!quiet) {
                    json_t *pp = json_object_get(rec, "per_position_ms");
                    fprintf(stderr, "bench: %-18s context=%-6lld %-8s step %10.4f ms\n", sv->label, c.contexts[ci],
                            json_string_value(json_object_get(rec, "status")), pp ? json_number_value(pp) : NAN);
                }
                if (ab_run_add(run, rec)) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
            }
        }
        attn_destroy(a);
    }
    json_t *summary = growth_summary(ab_run_records(run));
    if (!quiet) {
        const char *var;
        json_t *e;
        json_object_foreach(summary, var, e) {
            json_t *x = json_object_get(e, "fwd_bwd_time_exponent");
            if (json_is_number(x))
                fprintf(stderr, "bench: %-18s time per sample grows as N^%.2f over N = %lld..%lld\n", var,
                        json_number_value(x), (long long)json_integer_value(json_object_get(e, "len_min")),
                        (long long)json_integer_value(json_object_get(e, "len_max")));
        }
    }
    ab_run_set(run, "summary", summary);
    const char *final = g_interrupted ? "interrupted" : failed ? "failed" : "ok";
    if (ab_run_finish(run, final)) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
    if (!quiet) fprintf(stderr, "bench: wrote %s (status %s)\n", out_path, final);
    for (int i = 0; i < c.n_variants; i++)
        for (int j = 0; j < c.variants[i].n_settings; j++) free(c.variants[i].owned[j]);
    json_decref(root);
    return g_interrupted ? 130 : failed ? AB_EXIT_FAILURE : 0;
}
