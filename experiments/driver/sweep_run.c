/* A sweep run (sweep_run.h): the order of the points, the skips, the run document and
 * the progress lines of `attnbench bench`. */
#include "sweep_run.h"

#include "blas.h"
#include "config.h"
#include "error.h"
#include "results.h"
#include "sweep.h"
#include "sweep_points.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const sweep_tsv_columns[] = {
    "kind", "variant", "len", "context", "batch", "heads", "qk_dim", "v_dim", "causal", "status",
    "fwd_ms.median", "fwd_ms.p20", "fwd_ms.p80", "fwd_bwd_ms.median", "fwd_bwd_ms.p20", "fwd_bwd_ms.p80",
    "per_sample_fwd_ms", "per_sample_fwd_bwd_ms", "peak_bytes", "peak_bytes_per_sample", "fwd_bwd_gflops",
    "per_position_ms", "state_bytes", "traffic.launches", "traffic.dram_read_bytes", "traffic.dram_write_bytes",
    "traffic.requested_read_bytes", "traffic.requested_write_bytes", "traffic.min_read_bytes",
    "traffic.min_write_bytes", "traffic.dram_over_min", NULL};

/* A record's traffic for its progress line ("" without): launches, DRAM MiB and
 * their ratio to the op's minimal bytes. */
static const char *traffic_note(json_t *rec, char *buf, size_t size) {
    json_t *t = json_object_get(rec, "traffic");
    buf[0] = '\0';
    if (json_is_object(t))
        snprintf(buf, size, "  traffic %lld launches, DRAM %.3f MiB = %.2fx min",
                 (long long)json_integer_value(json_object_get(t, "launches")),
                 ((double)json_integer_value(json_object_get(t, "dram_read_bytes")) +
                  (double)json_integer_value(json_object_get(t, "dram_write_bytes"))) / 1048576.0,
                 json_number_value(json_object_get(t, "dram_over_min")));
    return buf;
}

/* The points' traffic (records with a "traffic" object) as a table on stdout. */
static void print_traffic(json_t *records) {
    size_t i;
    json_t *r;
    bool header = false;
    const double mib = 1048576.0;
    json_array_foreach(records, i, r) {
        json_t *t = json_object_get(r, "traffic");
        if (!json_is_object(t)) continue;
        if (!header) {
            printf("memory traffic of one forward+backward (parallel) or one step (recurrent), MiB; DRAM: distinct\n"
                   "32-byte sectors per launch; requested: sum of access sizes; min: inputs read + outputs written\n");
            printf("%-18s %-10s %8s %10s %10s %10s %10s %8s %8s\n", "variant", "N/context", "launches", "dram rd",
                   "dram wr", "requested", "min", "dram/min", "req/min");
            header = true;
        }
        const bool rec = strcmp(json_string_value(json_object_get(r, "kind")), "recurrent") == 0;
        char at[32];
        snprintf(at, sizeof at, "%s%lld", rec ? "ctx " : "",
                 (long long)json_integer_value(json_object_get(r, rec ? "context" : "len")));
#define TV(key) ((double)json_integer_value(json_object_get(t, key)))
        printf("%-18s %-10s %8lld %10.3f %10.3f %10.3f %10.3f %8.2f %8.2f\n",
               json_string_value(json_object_get(r, "variant")), at, (long long)TV("launches"),
               TV("dram_read_bytes") / mib, TV("dram_write_bytes") / mib,
               (TV("requested_read_bytes") + TV("requested_write_bytes")) / mib,
               (TV("min_read_bytes") + TV("min_write_bytes")) / mib,
               json_number_value(json_object_get(t, "dram_over_min")),
               json_number_value(json_object_get(t, "requested_over_min")));
#undef TV
    }
}

/* The config of the request, --set applied, and parsed for its device; every variant
 * created once on the device, those without an implementation there marked. */
static int load_config(const sweep_run_request *req, json_t **root_out, sweep_config *c) {
    if (!req->config_path) return ab_fail(AB_EINVAL, "bench: a CONFIG.json is required (see experiments/sweep/)");
    json_t *root = ab_config_load(req->config_path);
    if (!root) return AB_EINVAL; /* the message is ab_config_load's */
    int rc;
    for (int i = 0; i < req->n_sets; i++)
        if (ab_config_set(root, req->sets[i], false)) {
            json_decref(root);
            return AB_EINVAL;
        }
    if ((rc = sweep_config_parse(root, req->device, c))) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", ab_error());
        json_decref(root);
        return ab_fail(rc, "%s: %s", req->config_path, msg);
    }
    /* A variant the device has no implementation of is reported as skipped, with the
     * reason, at every point; the others run. */
    for (int i = 0; i < c->n_variants; i++) {
        attn_options o = {c->variants[i].variant, req->device, c->seed, c->variants[i].n_settings,
                          c->variants[i].settings};
        attn *a;
        rc = attn_create(&o, &a);
        if (rc == AB_EUNSUPPORTED) {
            snprintf(c->variants[i].unsupported, sizeof c->variants[i].unsupported, "%s", attn_error());
            if (!req->quiet) fprintf(stderr, "bench: %s: skipped (%s)\n", c->variants[i].label, attn_error());
            /* its records describe the CPU object (run_variants), whose step decides
             * whether it has recurrent points */
            o.device = AB_DEV_CPU;
            rc = attn_create(&o, &a);
        }
        if (rc) {
            sweep_config_free(c);
            json_decref(root);
            /* out of memory is the machine's; any other refusal, the config's */
            return rc == AB_ENOMEM ? AB_ENOMEM : AB_EINVAL;
        }
        c->variants[i].has_step = attn_has_step(a);
        attn_destroy(a);
    }
    *root_out = root;
    return 0;
}

/* The machine's sgemm rate and copy bandwidth into the document. */
static void measure_machine(sweep_config *c, ab_run *run, bool quiet) {
    int gemm_done;
    double gemm = sweep_measure_gemm(c, c->dev, c->gemm_size, c->gemm_repeats, &gemm_done);
    json_t *g = json_object();
    json_object_set_new(g, "size", json_integer(c->gemm_size));
    json_object_set_new(g, "repeats", json_integer(gemm_done)); /* timed products (time_budget_s may cut them) */
    json_object_set_new(g, "gflops", ab_json_num(gemm));
    json_object_set_new(g, "device", json_string(ab_device_name(c->dev)));
    json_object_set_new(g, "threads", json_integer(ab_threads()));
    ab_run_set(run, "sgemm", g);
    if (!quiet && c->dev == AB_DEV_CPU)
        fprintf(stderr, "bench: sgemm %dx%d: %.1f GFLOP/s on %d threads\n", c->gemm_size, c->gemm_size, gemm,
                ab_threads());
    else if (!quiet)
        fprintf(stderr, "bench: sgemm %dx%d on the device (cuBLAS): %.1f GFLOP/s\n", c->gemm_size, c->gemm_size, gemm);
    int copy_done = 0;
    c->copy_gbps = c->copy_mib > 0
                       ? sweep_measure_copy(c, c->dev, (size_t)c->copy_mib << 20, c->copy_repeats, &copy_done)
                       : NAN;
    json_t *cp = json_object();
    json_object_set_new(cp, "mib", json_integer(c->copy_mib));
    json_object_set_new(cp, "repeats", json_integer(copy_done));
    json_object_set_new(cp, "gbps", ab_json_num(c->copy_gbps)); /* bytes read + bytes written, per second */
    json_object_set_new(cp, "device", json_string(ab_device_name(c->dev)));
    json_object_set_new(cp, "threads", json_integer(ab_threads()));
    ab_run_set(run, "copy", cp);
    if (!quiet && isfinite(c->copy_gbps))
        fprintf(stderr, "bench: copy of %d MiB on the %s: %.1f GB/s (read + write)\n", c->copy_mib,
                c->dev == AB_DEV_CPU ? "CPU" : "device", c->copy_gbps);
}

static bool stopped(const sweep_run_request *req) { return req->stop && *req->stop; }

/* The parallel side of one variant: a record per length. 0 or the code of a document
 * that could not be written; *failed counts the failed points. */
static int run_parallel(const sweep_run_request *req, const sweep_config *c, const sweep_variant *sv, attn *a,
                        ab_run *run, int *failed, int from, int to) {
    const bool unsupported = sv->unsupported[0] != '\0';
    bool stop = false;
    for (int li = from; li < to && sv->parallel && !stopped(req); li++) {
        long long n = c->lengths[li];
        long long b = c->batch_scaled ? c->batch_tokens / n : c->batch_size;
        if (b < 1) b = 1;
        if (c->batch_scaled && b > c->batch_max) b = c->batch_max;
        attn_shape s = {(int)b, c->heads, (int)n, c->qk_dim, c->v_dim, c->causal, NULL};
        json_t *rec;
        if (unsupported || stop) {
            rec = sweep_base_record(sv, a, &s, "parallel");
            json_object_set_new(rec, "status", json_string("skipped"));
            json_object_set_new(rec, "reason", json_string(unsupported ? sv->unsupported
                                                                       : "ran out of time or memory at a smaller length"));
            sweep_null_timings(rec);
        } else {
            rec = sweep_run_point(c, sv, a, &s, &stop);
        }
        const char *st = json_string_value(json_object_get(rec, "status"));
        if (strcmp(st, "failed") == 0) (*failed)++;
        if (!req->quiet) {
            json_t *fb = json_object_get(json_object_get(rec, "fwd_bwd_ms"), "median");
            char note[96];
            fprintf(stderr, "bench: %-18s N=%-6lld B=%-4lld %-8s fwd+bwd %10.3f ms  peak %8.1f MiB%s\n", sv->label, n,
                    b, st, fb ? json_real_value(fb) : NAN,
                    json_integer_value(json_object_get(rec, "peak_bytes")) / 1048576.0,
                    traffic_note(rec, note, sizeof note));
        }
        int rc = ab_run_add(run, rec);
        if (rc) return rc;
    }
    return 0;
}

/* The recurrent side of one variant: a record per context. 0 or the code of a document
 * that could not be written. */
static int run_recurrent(const sweep_run_request *req, const sweep_config *c, const sweep_variant *sv, attn *a,
                         ab_run *run, int from, int to) {
    const bool unsupported = sv->unsupported[0] != '\0';
    bool stop = false;
    for (int ci = from; ci < to && !stopped(req); ci++) {
        json_t *rec;
        if (unsupported || stop) {
            attn_shape s = {c->rec_batch, c->heads, (int)c->contexts[ci], c->qk_dim, c->v_dim, true, NULL};
            rec = sweep_base_record(sv, a, &s, "recurrent");
            json_object_set_new(rec, "context", json_integer(c->contexts[ci]));
            json_object_set_new(rec, "status", json_string("skipped"));
            json_object_set_new(rec, "reason", json_string(unsupported ? sv->unsupported
                                                                       : "ran out of time or memory at a shorter context"));
        } else {
            rec = sweep_run_recurrent(c, sv, a, c->contexts[ci], &stop);
        }
        if (!req->quiet) {
            json_t *pp = json_object_get(rec, "per_position_ms");
            char note[96];
            fprintf(stderr, "bench: %-18s context=%-6lld %-8s step %10.4f ms%s\n", sv->label, c->contexts[ci],
                    json_string_value(json_object_get(rec, "status")), pp ? json_number_value(pp) : NAN,
                    traffic_note(rec, note, sizeof note));
        }
        int rc = ab_run_add(run, rec);
        if (rc) return rc;
    }
    return 0;
}

/* Every variant's points in order (or only `only`'s, when not NULL); 0, or the code of
 * an error with res->status set. */
static int run_variants(const sweep_run_request *req, sweep_config *c, ab_run *run, int *failed,
                        sweep_run_result *res, const sweep_point *only) {
    for (int vi = 0; vi < c->n_variants && !stopped(req); vi++) {
        sweep_variant *sv = &c->variants[vi];
        if (only && only->variant != vi) continue;
        /* Without an implementation on the device, a CPU object only describes the
         * variant's options in the skipped records. */
        const bool unsupported = sv->unsupported[0] != '\0';
        attn_options o = {sv->variant, unsupported ? AB_DEV_CPU : req->device, c->seed, sv->n_settings,
                          sv->settings};
        attn *a;
        int rc = attn_create(&o, &a);
        if (rc) {
            res->status = SWEEP_RUN_ERROR;
            return rc;
        }
        if (!only) {
            rc = run_parallel(req, c, sv, a, run, failed, 0, c->n_lengths);
            if (!rc && attn_has_step(a) && sv->recurrent) rc = run_recurrent(req, c, sv, a, run, 0, c->n_contexts);
        } else if (!only->recurrent) {
            rc = run_parallel(req, c, sv, a, run, failed, only->pos, only->pos + 1);
        } else {
            rc = run_recurrent(req, c, sv, a, run, only->pos, only->pos + 1);
        }
        attn_destroy(a);
        if (rc) {
            res->status = SWEEP_RUN_FAILED;
            return rc;
        }
    }
    return 0;
}

/* The growth exponents, on stderr. */
static void print_growth(json_t *summary) {
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

int sweep_run(const sweep_run_request *req, sweep_run_result *res) {
    memset(res, 0, sizeof *res);
    res->status = SWEEP_RUN_ERROR;
    json_t *root = NULL;
    sweep_config c;
    int rc = load_config(req, &root, &c);
    if (rc) return res->code = rc;
    c.interrupted = req->stop;
    char default_out[512], point_out[600];
    const char *out_path = req->out_path;
    if (!out_path) {
        snprintf(default_out, sizeof default_out, "results/%s.json", c.name);
        out_path = default_out;
    }
    /* A point of a sharded run: its own document, beside the whole run's. */
    sweep_point *points = NULL, *only = NULL;
    int n_points = 0, failed = 0;
    ab_run *run = NULL;
    if (req->one_point) {
        rc = sweep_points_list(&c, &points, &n_points);
        if (!rc && (req->point < 0 || req->point >= n_points))
            rc = ab_fail(AB_EINVAL, "bench: --point %d: this sweep has points 0..%d (attnbench bench %s --points)",
                         req->point, n_points - 1, req->config_path);
        if (!rc) {
            only = &points[req->point];
            rc = sweep_point_path(out_path, req->point, point_out, sizeof point_out);
            out_path = point_out;
        }
    }
    json_object_set_new(root, "device", json_string(ab_device_name(req->device)));
    if (!rc) {
        run = ab_run_begin(out_path, req->command_line, root, c.seed, sweep_tsv_columns);
        /* an output path that cannot be written is the request's */
        if (!run) rc = ab_fail(AB_EIO, "%s", ab_error());
    }
    if (!rc && only) ab_run_set(run, "points", sweep_points_marker(&c, points, n_points, only->index));
    if (!rc && req->on_start) req->on_start(req->ctx);
    if (!rc) measure_machine(&c, run, req->quiet);
    if (!rc && (rc = ab_run_save(run))) res->status = SWEEP_RUN_FAILED;
    if (!rc) rc = run_variants(req, &c, run, &failed, res, only);
    if (rc) {
        ab_run_discard(run);
    } else {
        json_t *summary = sweep_growth_summary(ab_run_records(run));
        if (!req->quiet) print_growth(summary);
        ab_run_set(run, "summary", summary);
        if (!req->quiet) print_traffic(ab_run_records(run));
        const char *final = stopped(req) ? "interrupted" : failed ? "failed" : "ok";
        if ((rc = ab_run_finish(run, final))) {
            res->status = SWEEP_RUN_FAILED;
        } else {
            if (!req->quiet) fprintf(stderr, "bench: wrote %s (status %s)\n", out_path, final);
            res->status = stopped(req) ? SWEEP_RUN_INTERRUPTED : failed ? SWEEP_RUN_POINTS_FAILED : SWEEP_RUN_OK;
        }
    }
    free(points);
    sweep_config_free(&c);
    json_decref(root);
    return res->code = rc;
}

int sweep_points_doc(const sweep_run_request *req, json_t **doc) {
    *doc = NULL;
    json_t *root = NULL;
    sweep_config c;
    int rc = load_config(req, &root, &c);
    if (rc) return rc;
    char default_out[512], path[600];
    const char *out_path = req->out_path;
    if (!out_path) {
        snprintf(default_out, sizeof default_out, "results/%s.json", c.name);
        out_path = default_out;
    }
    json_object_set_new(root, "device", json_string(ab_device_name(req->device))); /* as a run records it */
    sweep_point *points = NULL;
    int n = 0;
    rc = sweep_points_list(&c, &points, &n);
    json_t *d = json_object(), *list = json_array();
    json_object_set_new(d, "schema", json_string("attnbench/points/1"));
    json_object_set_new(d, "name", json_string(c.name));
    json_object_set_new(d, "count", json_integer(n));
    json_object_set_new(d, "document", json_string(out_path));
    for (int i = 0; i < n && !rc; i++) {
        if ((rc = sweep_point_path(out_path, i, path, sizeof path))) break;
        json_t *p = sweep_point_json(&c, &points[i]);
        json_object_set_new(p, "document", json_string(path));
        json_object_set_new(p, "done", json_boolean(sweep_point_done(path, root, i, n)));
        json_array_append_new(list, p);
    }
    json_object_set_new(d, "points", list);
    free(points);
    sweep_config_free(&c);
    json_decref(root);
    if (rc) json_decref(d);
    else *doc = d;
    return rc;
}
