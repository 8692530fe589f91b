/* The sweep's config (sweep.h): parsing and validation. */
#include "sweep.h"

#include "config.h"
#include "cuda_device.h"
#include "error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
        if ((rc = ab_config_label(v, where, "label", false, sv->variant, &label))) return rc;
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
                if (!(sv->owned[sv->n_settings] = strdup(buf))) return ab_fail(AB_ENOMEM, "out of memory");
                sv->settings[sv->n_settings] = sv->owned[sv->n_settings];
                sv->n_settings++;
            }
        }
        /* Validate the variant and its options now, before anything runs (the
         * registry's check: nothing is created). */
        attn_options o = {sv->variant, AB_DEV_CPU, 0, sv->n_settings, sv->settings};
        if ((rc = attn_variant_check(&o))) {
            char msg[512]; /* copied: ab_fail writes the buffer attn_error() points to */
            snprintf(msg, sizeof msg, "%s", attn_error());
            return ab_fail(AB_EINVAL, "config: %s: %s", where, msg);
        }
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

static int parse(const json_t *root, ab_device dev, sweep_config *c) {
    static const char *const top[] = {"name", "description", "variants", "lengths", "heads", "qk_dim", "v_dim",
                                      "causal", "batch", "warmup", "repeats", "time_budget_s", "memory_limit_gib",
                                      "seed", "recurrent", "gemm", "copy", NULL};
    int rc = ab_config_only_keys(root, "", top);
    if (rc) return rc;
    c->dev = dev;
    long long x;
    double d;
    /* the name makes the default output results/NAME.json: a plain file name, so a
     * config cannot write outside results/ ("../../x") */
    if ((rc = ab_config_file_name(root, "", "name", true, NULL, &c->name))) return rc;
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
    /* A non-causal-only variant (efficient) has no point in a causal sweep: said here,
     * before anything runs, rather than as a failed record at every length. */
    for (int i = 0; c->causal && i < c->n_variants; i++)
        if (!attn_variant_has_causal(attn_variant_find(c->variants[i].variant)))
            return ab_fail(AB_EINVAL, "config: variants.%d: variant '%s' is non-causal only, and this sweep is causal "
                                      "(\"causal\": false for a non-causal sweep)",
                           i, c->variants[i].variant);
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
        /* 16384: 3 GiB of matrices and 8.8 TFLOP per product (a GPU's second, a CPU's
         * minute); the measurement is also bounded by time_budget_s */
        if ((rc = ab_config_int(gemm, "gemm", "size", false, 2048, 0, 16384, &x))) return rc;
        c->gemm_size = (int)x;
        if ((rc = ab_config_int(gemm, "gemm", "repeats", false, 5, 1, 1000, &x))) return rc;
        c->gemm_repeats = (int)x;
    }
    /* the copy bandwidth: 64 MiB by default (twice that moved per copy: beyond a CPU's
     * last-level cache and an H100's 50 MB L2; the GPU configs ask for 256) */
    c->copy_mib = 64;
    c->copy_repeats = 5;
    c->copy_gbps = NAN;
    json_t *copy = json_object_get(root, "copy");
    if (copy) {
        if (!json_is_object(copy)) return ab_fail(AB_EINVAL, "config: 'copy' must be an object");
        static const char *const ckeys[] = {"mib", "repeats", NULL};
        if ((rc = ab_config_only_keys(copy, "copy", ckeys))) return rc;
        if ((rc = ab_config_int(copy, "copy", "mib", false, 64, 0, 16384, &x))) return rc;
        c->copy_mib = (int)x;
        if ((rc = ab_config_int(copy, "copy", "repeats", false, 5, 1, 1000, &x))) return rc;
        c->copy_repeats = (int)x;
    }
    return 0;
}

int sweep_config_parse(const json_t *root, ab_device dev, sweep_config *c) {
    memset(c, 0, sizeof *c);
    int rc = parse(root, dev, c);
    if (rc) sweep_config_free(c); /* the settings of the variants parsed before the error */
    return rc;
}

void sweep_config_free(sweep_config *c) {
    for (int i = 0; i < c->n_variants; i++)
        for (int j = 0; j < c->variants[i].n_settings; j++) free(c->variants[i].owned[j]);
    c->n_variants = 0;
}
