/* The sweep's measurements (sweep.h): timing and memory of one point, the recurrent
 * step, the machine's sgemm rate, the growth summary. */
#include "sweep.h"

#include "blas.h"
#include "cuda_blas.h"
#include "cuda_device.h"
#include "cuda_traffic.h"
#include "error.h"
#include "memory.h"
#include "results.h"
#include "rng.h"
#include "timer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A variant's input of its own (attn_bind_aux: gla's log-gate g, deltanet's rate beta)
 * for the timings: `count` floats on device d, drawn once per point as a typical value
 * of its range plus small noise, center + spread * normal(seed, stream, i), clamped to
 * the range: g = -0.1 +- 0.02 (<= 0: a decay of about 0.9 a step), beta = 0.5 +- 0.1
 * (in [0, 1]). *out stays NULL for a variant without one. */
static int aux_fill_dev(attn *a, ab_device d, size_t count, uint64_t seed, uint64_t stream, float **out) {
    *out = NULL;
    const char *name = attn_aux_name(a);
    if (!name) return 0;
    const bool is_g = strcmp(name, "g") == 0;
    const double center = is_g ? -0.1 : 0.5, spread = is_g ? 0.02 : 0.1, lo = is_g ? -1e30 : 0.0,
                 hi = is_g ? 0.0 : 1.0;
    float *h = ab_alloc(count * sizeof(float));
    if (!h) return ab_fail(AB_ENOMEM, "input %s of %zu floats: out of memory", name, count);
    fill_normal(h, count, seed, stream);
    for (size_t i = 0; i < count; i++) {
        double x = center + spread * h[i];
        h[i] = (float)(x < lo ? lo : x > hi ? hi : x);
    }
    int rc = ab_dev_malloc(d, (void **)out, count * sizeof(float));
    if (!rc) rc = ab_dev_upload(d, *out, h, count * sizeof(float));
    ab_free(h);
    return rc;
}

/* The largest share of one n x n product run by a single BLAS call: about a second of
 * a CPU core's work (69 GFLOP), or of a slow GPU's (1.1 TFLOP). A BLAS call cannot be
 * stopped part-way, so a product is computed in row panels of at most this many FLOPs
 * and an interruption is seen between them: Ctrl-C or SIGTERM ends a measurement
 * within about a second, whatever the size (one call of n = 16384 is 8.8 TFLOP,
 * minutes on a CPU). Sizes up to 3250 on the CPU, 8192 on a device, are one call, as
 * before. */
#define GEMM_PANEL_FLOPS_CPU (1LL << 36)
#define GEMM_PANEL_FLOPS_DEVICE (1LL << 40)

/* x[i] = normal(1, stream, i) for i < n on device d (through the host buffer `stage`
 * of n floats on a device), in chunks of 2^24 (a fraction of a second), stopping
 * early when interrupted: 0, 1 when interrupted, or an error code. */
static int gemm_fill(const sweep_config *cfg, ab_device d, float *x, size_t n, uint64_t stream, float *stage) {
    const size_t chunk = (size_t)1 << 24;
    float *h = d == AB_DEV_CPU ? x : stage;
    for (size_t off = 0; off < n; off += chunk) {
        if (cfg->interrupted && *cfg->interrupted) return 1;
        size_t len = n - off < chunk ? n - off : chunk;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < len; i++) h[off + i] = (float)ab_rng_normal(1, stream, off + i);
        if (d != AB_DEV_CPU) {
            int rc = ab_dev_upload(d, x + off, h + off, len * sizeof(float));
            if (rc) return rc;
        }
    }
    return 0;
}

/* c = a b (n x n, row-major) on device d, panel by panel. 0, 1 when interrupted
 * before the end, or an error code. */
static int gemm_panels(const sweep_config *cfg, ab_device d, int n, const float *a, const float *b, float *c) {
    long long rows = (d == AB_DEV_CPU ? GEMM_PANEL_FLOPS_CPU : GEMM_PANEL_FLOPS_DEVICE) / (2LL * n * n);
    if (rows < 1) rows = 1;
    for (long long r0 = 0; r0 < n; r0 += rows) {
        if (cfg->interrupted && *cfg->interrupted) return 1;
        int m = (int)(n - r0 < rows ? n - r0 : rows);
        const float *ap = a + r0 * n;
        float *cp = c + r0 * n;
        int rc = 0;
        if (d == AB_DEV_CPU) ab_sgemm(false, false, m, n, n, 1.0f, ap, n, b, n, 0.0f, cp, n);
        else rc = ab_cuda_sgemm(false, false, m, n, n, 1.0f, ap, n, b, n, 0.0f, cp, n);
        if (!rc && r0 + rows < n) rc = ab_dev_sync(d); /* the next check of the flag waits for this panel */
        if (rc) return rc;
    }
    return 0;
}

double sweep_measure_gemm(const sweep_config *cfg, ab_device d, int n, int repeats, int *done) {
    *done = 0;
    if (n <= 0) return NAN;
    size_t bytes = (size_t)n * n * sizeof(float);
    float *a = NULL, *b = NULL, *c = NULL, *stage = d == AB_DEV_CPU ? NULL : ab_alloc(bytes);
    double *ms = malloc(sizeof(double) * (size_t)repeats);
    double rate = NAN;
    if (ms && (d == AB_DEV_CPU || stage) && !ab_dev_malloc(d, (void **)&a, bytes) &&
        !ab_dev_malloc(d, (void **)&b, bytes) && !ab_dev_malloc(d, (void **)&c, bytes) &&
        !gemm_fill(cfg, d, a, (size_t)n * n, 0, stage) && !gemm_fill(cfg, d, b, (size_t)n * n, 1, stage) &&
        !ab_dev_memset(d, c, 0, bytes)) {
        /* The repeats stop once the measurement (warm-up included) has used the
         * config's time_budget_s, as a point's do; when the warm-up alone took that
         * long, it is the one sample. */
        const double budget_ms = cfg->time_budget_s * 1e3;
        double spent_ms = 0, warm_ms = 0;
        int k = 0, rc = 0;
        for (int r = -1; r < repeats && rc == 0 && spent_ms < budget_ms; r++) { /* r = -1: warm-up */
            rc = ab_dev_sync(d);
            uint64_t t0 = ab_now_ns();
            if (!rc) rc = gemm_panels(cfg, d, n, a, b, c);
            if (!rc) rc = ab_dev_sync(d);
            double t = ab_ms_since(t0);
            spent_ms += t;
            if (rc) break;
            if (r < 0) warm_ms = t;
            else ms[k++] = t;
        }
        if (rc == 0 && k == 0) ms[k++] = warm_ms; /* the budget went on the warm-up */
        if (k > 0 && rc >= 0) { /* interrupted (1): the samples so far */
            qsort(ms, (size_t)k, sizeof *ms, cmp_double);
            rate = 2.0 * n * (double)n * n / (quantile(ms, k, 0.5) * 1e-3) * 1e-9;
            *done = k;
        }
    }
    free(ms);
    ab_free(stage);
    ab_dev_free(d, a);
    ab_dev_free(d, b);
    ab_dev_free(d, c);
    return rate;
}

/* dst = src (bytes) on device d: OpenMP threads over chunks of memcpy on the CPU. */
static int copy_once(ab_device d, void *dst, const void *src, size_t bytes) {
    if (d != AB_DEV_CPU) return ab_dev_copy(d, dst, src, bytes);
    const size_t chunk = (size_t)1 << 20;
    const long long n = (long long)((bytes + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < n; i++) {
        size_t off = (size_t)i * chunk, len = bytes - off < chunk ? bytes - off : chunk;
        memcpy((char *)dst + off, (const char *)src + off, len);
    }
    return 0;
}

double sweep_measure_copy(const sweep_config *cfg, ab_device d, size_t bytes, int repeats, int *done) {
    *done = 0;
    if (bytes == 0 || repeats < 1) return NAN;
    void *a = NULL, *b = NULL;
    double *ms = malloc(sizeof(double) * (size_t)repeats);
    double rate = NAN;
    /* both buffers written first: the copies then measure memory, not page faults */
    if (ms && !ab_dev_malloc(d, &a, bytes) && !ab_dev_malloc(d, &b, bytes) && !ab_dev_memset(d, a, 1, bytes) &&
        !ab_dev_memset(d, b, 0, bytes)) {
        const double budget_ms = cfg->time_budget_s * 1e3;
        double spent_ms = 0;
        int k = 0, rc = 0;
        for (int r = -1; r < repeats && rc == 0 && spent_ms < budget_ms; r++) { /* r = -1: warm-up */
            if (cfg->interrupted && *cfg->interrupted) break;
            rc = ab_dev_sync(d);
            uint64_t t0 = ab_now_ns();
            if (!rc) rc = copy_once(d, b, a, bytes);
            if (!rc) rc = ab_dev_sync(d);
            double t = ab_ms_since(t0);
            spent_ms += t;
            if (!rc && r >= 0) ms[k++] = t;
        }
        if (rc == 0 && k > 0) {
            qsort(ms, (size_t)k, sizeof *ms, cmp_double);
            rate = 2.0 * (double)bytes / (quantile(ms, k, 0.5) * 1e-3) * 1e-9;
            *done = k;
        }
    }
    free(ms);
    ab_dev_free(d, a);
    ab_dev_free(d, b);
    return rate;
}

/* ---- one parallel point ---- */

typedef struct {
    const char *status;
    double fwd_bwd_first_ms;
} point_result;

json_t *sweep_base_record(const sweep_variant *sv, const attn *a, const attn_shape *s, const char *kind) {
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

void sweep_null_timings(json_t *r) {
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

json_t *sweep_run_point(const sweep_config *c, const sweep_variant *sv, attn *a, const attn_shape *s,
                         bool *stop_variant) {
    const ab_device dev = c->dev;
    json_t *rec = sweep_base_record(sv, a, s, "parallel");
    size_t bh = (size_t)s->batch * s->heads;
    size_t nq = bh * s->len * s->qk_dim, nv = bh * s->len * s->v_dim;
    size_t saved_bytes = attn_saved_bytes(a, s);
    size_t ws_bytes = attn_workspace_need(a, s);
    /* a variant's own parameters (linformer), for this length, and their gradient */
    size_t np = 0;
    if (attn_param_count(a, s->len, &np)) np = 0; /* the shape check above would have failed first */
    double need = (double)sizeof(float) * (3.0 * nq + 5.0 * nv + 2.0 * np) + (double)saved_bytes + (double)ws_bytes;
    json_object_set_new(rec, "estimated_bytes", json_real(need));
    if (need > c->memory_limit_bytes) {
        json_object_set_new(rec, "status", json_string("oom"));
        json_object_set_new(rec, "reason", json_string("estimated memory exceeds memory_limit_gib"));
        sweep_null_timings(rec);
        *stop_variant = true;
        return rec;
    }
    /* Everything the call touches, through the tracked allocator of the device; peak
     * measured from here. On CUDA the inputs are generated on the host (stage) and
     * copied over. */
    size_t base = ab_mem_current(dev);
    ab_mem_reset_peak(dev);
    float *q = NULL, *k = NULL, *v = NULL, *out = NULL, *dout = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    float *par = NULL, *dpar = NULL, *hpar = NULL;
    void *saved = NULL;
    float *stage = NULL;
    int rc = 0;
    if (dev != AB_DEV_CPU && !(stage = ab_alloc((nq > nv ? nq : nv) * 4))) rc = AB_ENOMEM;
    if (!rc && np) {
        /* drawn from the sweep's seed on the host (stream 4), uploaded, bound */
        rc = ab_dev_malloc(dev, (void **)&par, np * 4);
        if (!rc) rc = ab_dev_malloc(dev, (void **)&dpar, np * 4);
        if (!rc && !(hpar = dev == AB_DEV_CPU ? par : ab_alloc(np * 4))) rc = AB_ENOMEM;
        if (!rc) rc = attn_param_init(a, s->len, c->seed, 4, hpar);
        if (!rc && dev != AB_DEV_CPU) rc = ab_dev_upload(dev, par, hpar, np * 4);
        if (!rc) rc = ab_dev_memset(dev, dpar, 0, np * 4);
        if (!rc) rc = attn_bind_params(a, s->len, par, dpar);
        if (hpar != par) ab_free(hpar);
    }
    if (!rc) rc = ab_dev_malloc(dev, (void **)&q, nq * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&k, nq * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&v, nv * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&out, nv * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&dout, nv * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&dq, nq * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&dk, nq * 4);
    if (!rc) rc = ab_dev_malloc(dev, (void **)&dv, nv * 4);
    if (!rc) rc = ab_dev_malloc(dev, &saved, saved_bytes);
    /* a variant's own input (stream 5) and its gradient buffer, bound */
    const size_t naux = bh * (size_t)s->len * (size_t)attn_aux_width(a, s->qk_dim);
    float *aux = NULL, *daux = NULL;
    if (!rc) rc = aux_fill_dev(a, dev, naux, c->seed, 5, &aux);
    if (!rc && aux) rc = ab_dev_malloc(dev, (void **)&daux, naux * 4);
    if (!rc && aux) rc = attn_bind_aux(a, aux, daux);
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
            for (int r = 0; r < reps && !rc && !*c->interrupted; r++) {
                uint64_t t1 = ab_now_ns();
                rc = attn_forward(a, s, q, k, v, out, saved);
                rs = sync_ms(dev, t1, &fwd_ms[n_fwd++]);
                if (!rc) rc = rs;
            }
            for (int r = 0; r < reps && !rc && !*c->interrupted; r++) {
                uint64_t t1 = ab_now_ns();
                rc = attn_forward(a, s, q, k, v, out, saved);
                if (!rc) rc = attn_backward(a, s, q, k, v, dout, saved, dq, dk, dv);
                rs = sync_ms(dev, t1, &fb_ms[n_fb++]);
                if (!rc) rc = rs;
            }
            /* Memory traffic (the instrumented emulator): one more forward+backward,
             * counted, after the timed ones. */
            if (!rc && !*c->interrupted && dev == AB_DEV_CUDA && ab_cuda_traffic_counted()) {
                ab_cuda_traffic_start();
                rc = attn_forward(a, s, q, k, v, out, saved);
                if (!rc) rc = attn_backward(a, s, q, k, v, dout, saved, dq, dk, dv);
                if (!rc) rc = ab_dev_sync(dev);
                ab_cuda_traffic_stop();
                double min_r, min_w;
                sweep_min_bytes_parallel(s, np, true, &min_r, &min_w);
                if (!rc) json_object_set_new(rec, "traffic", sweep_traffic_json("forward+backward", min_r, min_w));
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
        /* The variant's own count (attn_flops); NAN where it has none (lsh). */
        double ff = attn_flops(a, s, false), fbf = attn_flops(a, s, true);
        json_object_set_new(rec, "fwd_gflops", ab_json_num(ff / (fwd_med * 1e-3) * 1e-9));
        json_object_set_new(rec, "fwd_bwd_gflops", ab_json_num(fbf / (fb_med * 1e-3) * 1e-9));
        /* The memory floor: the op's minimal bytes at the measured copy bandwidth. */
        if (isfinite(c->copy_gbps) && c->copy_gbps > 0) {
            double fr, fw, br, bw;
            sweep_min_bytes_parallel(s, np, false, &fr, &fw);
            sweep_min_bytes_parallel(s, np, true, &br, &bw);
            const double floor_f = (fr + fw) / (c->copy_gbps * 1e9) * 1e3, floor_fb = (br + bw) / (c->copy_gbps * 1e9) * 1e3;
            json_object_set_new(rec, "floor_fwd_ms", ab_json_num(floor_f));
            json_object_set_new(rec, "floor_fwd_bwd_ms", ab_json_num(floor_fb));
            json_object_set_new(rec, "fwd_over_floor", ab_json_num(fwd_med / floor_f));
            json_object_set_new(rec, "fwd_bwd_over_floor", ab_json_num(fb_med / floor_fb));
        }
        device_memory_json(rec, dev);
    }
    json_object_set_new(rec, "process_peak_rss_bytes", json_integer((json_int_t)ab_process_peak_rss()));
    sweep_null_timings(rec);
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
    ab_dev_free(dev, par);
    ab_dev_free(dev, dpar);
    ab_dev_free(dev, aux);
    ab_dev_free(dev, daux);
    return rec;
}

/* ---- one recurrent point: time per generated position after a prompt of T ---- */

json_t *sweep_run_recurrent(const sweep_config *c, const sweep_variant *sv, attn *a, long long context,
                             bool *stop_variant) {
    const ab_device dev = c->dev;
    attn_shape s = {c->rec_batch, c->heads, (int)(context > 0 ? context : 1), c->qk_dim, c->v_dim, true, NULL};
    json_t *rec = sweep_base_record(sv, a, &s, "recurrent");
    json_object_set_new(rec, "context", json_integer(context));
    json_object_set_new(rec, "steps", json_integer(c->rec_steps));
    /* Memory traffic (the instrumented emulator): one more step, counted, at position
     * `context` before the timed ones; the state holds one more position for it. */
    const bool traffic = dev == AB_DEV_CUDA && ab_cuda_traffic_counted();
    int cap = (int)context + c->rec_steps + (traffic ? 1 : 0);
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
    /* a variant's own input: the prompt's (stream 16), then the steps' (stream 17) */
    const size_t waux = (size_t)attn_aux_width(a, s.qk_dim);
    float *aux = NULL, *auxt = NULL;
    if (!rc) rc = aux_fill_dev(a, dev, np * waux, c->seed, 16, &aux);
    if (!rc) rc = aux_fill_dev(a, dev, bh * waux, c->seed, 17, &auxt);
    if (!rc && aux) rc = attn_bind_aux(a, aux, NULL);
    double prefill_ms = NAN;
    if (!rc) {
        rc = ab_dev_sync(dev);
        uint64_t t0 = ab_now_ns();
        if (!rc && context > 0) rc = attn_prefill(a, state, (int)context, q, k, v, NULL);
        int rs = sync_ms(dev, t0, &prefill_ms);
        if (!rc) rc = rs;
        if (!rc && auxt) rc = attn_bind_aux(a, auxt, NULL);
        /* traffic: the step at position `context` counted first; the timed steps follow */
        int first = (int)context;
        if (!rc && traffic && !*c->interrupted) {
            double min_r, min_w;
            rc = sweep_min_bytes_step(a, &s, (int)context, &min_r, &min_w);
            if (!rc) {
                ab_cuda_traffic_start();
                rc = attn_step(a, state, (int)context, qt, kt, vt, ot);
                if (!rc) rc = ab_dev_sync(dev);
                ab_cuda_traffic_stop();
                first++;
            }
            if (!rc) {
                json_t *tr = sweep_traffic_json("step", min_r, min_w);
                json_object_set_new(tr, "position", json_integer(context));
                json_object_set_new(rec, "traffic", tr);
            }
        }
        for (int t = 0; t < c->rec_steps && !rc; t++) {
            uint64_t t1 = ab_now_ns();
            rc = attn_step(a, state, first + t, qt, kt, vt, ot);
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
        /* the memory floor of a step: its minimal bytes (at position context + 1, the
         * middle of the timed steps' range is within a few positions of it) at the
         * measured copy bandwidth */
        double min_r, min_w;
        if (isfinite(c->copy_gbps) && c->copy_gbps > 0 && !sweep_min_bytes_step(a, &s, (int)context, &min_r, &min_w)) {
            const double floor_ms = (min_r + min_w) / (c->copy_gbps * 1e9) * 1e3;
            json_object_set_new(rec, "floor_step_ms", ab_json_num(floor_ms));
            json_object_set_new(rec, "step_over_floor", ab_json_num(med / floor_ms));
        }
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
    ab_dev_free(dev, aux);
    ab_dev_free(dev, auxt);
    return rec;
}

/* ---- summary: how time grows with N ---- */

/* Least-squares slope of log(per-sample fwd+bwd time) against log(N) over a
 * variant's ok points: 1 for linear growth, 2 for quadratic. */
json_t *sweep_growth_summary(json_t *records) {
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

