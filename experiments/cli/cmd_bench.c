/* attnbench bench: runs the attention sweep of a config (experiments/driver/sweep.h)
 * and writes its run document, rewritten after each point. */
#include "commands.h"

#include "blas.h"
#include "cli_util.h"
#include "config.h"
#include "cuda_device.h"
#include "cuda_traffic.h"
#include "error.h"
#include "results.h"
#include "sweep.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t g_interrupted = 0;
static void on_signal(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static const char BENCH_USAGE[] =
    "usage: attnbench bench CONFIG.json [--set KEY=VALUE]... [--device cpu|cuda] [--out FILE] [--quiet]\n"
    "\n"
    "Runs the attention sweep of CONFIG (see experiments/sweep/): for every variant and\n"
    "length, forward and forward+backward time (median, p20, p80) and peak tracked\n"
    "memory; then the recurrent step time at each context length, and this machine's\n"
    "sgemm rate. --device cuda runs on the GPU (variants without a CUDA\n"
    "implementation are recorded as skipped, with the reason); on the instrumented CPU\n"
    "emulator (build/attnbench-emu) each point also counts the device memory\n"
    "traffic of one forward+backward (or step) and prints it beside the minimal bytes\n"
    "(experiments/sweep/README.md says how to read it). --set overrides a config\n"
    "value by its dotted path (e.g. --set repeats=3, --set lengths=[512,1024]). Writes\n"
    "FILE (default results/NAME.json, NAME from the config) after every point, and a\n"
    "TSV beside it.\n";

static const char *const TSV_COLUMNS[] = {
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

int cmd_bench(int argc, char **argv, const char *command_line) {
    const char *config_path = NULL, *out_path = NULL;
    const char *sets[64];
    int n_sets = 0;
    bool quiet = false;
    ab_device device = AB_DEV_CPU;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            fputs(BENCH_USAGE, stdout);
            return 0;
        } else if (strcmp(argv[i], "--set") == 0) {
            if (n_sets == 64) cli_die(AB_EXIT_USAGE, "too many --set options");
            sets[n_sets++] = cli_value(argc, argv, &i);
        } else if (strcmp(argv[i], "--out") == 0) out_path = cli_path_value(argc, argv, &i);
        else if (strcmp(argv[i], "--device") == 0) {
            device = cli_device_value(argc, argv, &i);
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
    if (device == AB_DEV_CUDA && ab_cuda_init()) cli_die(AB_EXIT_USAGE, "%s", ab_error());
    sweep_config c;
    int rc = sweep_config_parse(root, device, &c);
    if (rc) cli_die(cli_status_for(rc), "%s: %s", config_path, ab_error());
    c.interrupted = &g_interrupted;
    /* A variant the device has no implementation of is reported as skipped, with the
     * reason, at every point; the others run. */
    for (int i = 0; i < c.n_variants; i++) {
        attn_options o = {c.variants[i].variant, device, c.seed, c.variants[i].n_settings, c.variants[i].settings};
        attn *a;
        rc = attn_create(&o, &a);
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
    json_object_set_new(root, "device", json_string(ab_device_name(device)));
    ab_run *run = ab_run_begin(out_path, command_line, root, c.seed, TSV_COLUMNS);
    if (!run) cli_die(AB_EXIT_USAGE, "%s", ab_error());
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    int gemm_done;
    double gemm = sweep_measure_gemm(&c, c.dev, c.gemm_size, c.gemm_repeats, &gemm_done);
    json_t *g = json_object();
    json_object_set_new(g, "size", json_integer(c.gemm_size));
    json_object_set_new(g, "repeats", json_integer(gemm_done)); /* timed products (time_budget_s may cut them) */
    json_object_set_new(g, "gflops", ab_json_num(gemm));
    json_object_set_new(g, "device", json_string(ab_device_name(c.dev)));
    json_object_set_new(g, "threads", json_integer(ab_threads()));
    ab_run_set(run, "sgemm", g);
    if (!quiet && c.dev == AB_DEV_CPU)
        fprintf(stderr, "bench: sgemm %dx%d: %.1f GFLOP/s on %d threads\n", c.gemm_size, c.gemm_size, gemm, ab_threads());
    else if (!quiet)
        fprintf(stderr, "bench: sgemm %dx%d on the device (cuBLAS): %.1f GFLOP/s\n", c.gemm_size, c.gemm_size, gemm);
    int copy_done = 0;
    c.copy_gbps = c.copy_mib > 0 ? sweep_measure_copy(&c, c.dev, (size_t)c.copy_mib << 20, c.copy_repeats, &copy_done)
                                 : NAN;
    json_t *cp = json_object();
    json_object_set_new(cp, "mib", json_integer(c.copy_mib));
    json_object_set_new(cp, "repeats", json_integer(copy_done));
    json_object_set_new(cp, "gbps", ab_json_num(c.copy_gbps)); /* bytes read + bytes written, per second */
    json_object_set_new(cp, "device", json_string(ab_device_name(c.dev)));
    json_object_set_new(cp, "threads", json_integer(ab_threads()));
    ab_run_set(run, "copy", cp);
    if (!quiet && isfinite(c.copy_gbps))
        fprintf(stderr, "bench: copy of %d MiB on the %s: %.1f GB/s (read + write)\n", c.copy_mib,
                c.dev == AB_DEV_CPU ? "CPU" : "device", c.copy_gbps);
    if (ab_run_save(run)) cli_die(AB_EXIT_FAILURE, "%s", ab_error());

    int failed = 0;
    for (int vi = 0; vi < c.n_variants && !g_interrupted; vi++) {
        sweep_variant *sv = &c.variants[vi];
        /* Without an implementation on the device, a CPU object only describes the
         * variant's options in the skipped records. */
        const bool unsupported = sv->unsupported[0] != '\0';
        attn_options o = {sv->variant, unsupported ? AB_DEV_CPU : device, c.seed, sv->n_settings, sv->settings};
        attn *a;
        if ((rc = attn_create(&o, &a))) cli_die(cli_status_for(rc), "%s", attn_error());
        bool stop = false;
        for (int li = 0; li < c.n_lengths && sv->parallel && !g_interrupted; li++) {
            long long n = c.lengths[li];
            long long b = c.batch_scaled ? c.batch_tokens / n : c.batch_size;
            if (b < 1) b = 1;
            if (c.batch_scaled && b > c.batch_max) b = c.batch_max;
            attn_shape s = {(int)b, c.heads, (int)n, c.qk_dim, c.v_dim, c.causal, NULL};
            json_t *rec;
            if (unsupported || stop) {
                rec = sweep_base_record(sv, a, &s, "parallel");
                json_object_set_new(rec, "status", json_string("skipped"));
                json_object_set_new(rec, "reason", json_string(unsupported ? sv->unsupported
                                                                           : "ran out of time or memory at a smaller length"));
                sweep_null_timings(rec);
            } else {
                rec = sweep_run_point(&c, sv, a, &s, &stop);
            }
            const char *st = json_string_value(json_object_get(rec, "status"));
            if (strcmp(st, "failed") == 0) failed++;
            if (!quiet) {
                json_t *fb = json_object_get(json_object_get(rec, "fwd_bwd_ms"), "median");
                char note[96];
                fprintf(stderr, "bench: %-18s N=%-6lld B=%-4lld %-8s fwd+bwd %10.3f ms  peak %8.1f MiB%s\n", sv->label,
                        n, b, st, fb ? json_real_value(fb) : NAN,
                        json_integer_value(json_object_get(rec, "peak_bytes")) / 1048576.0,
                        traffic_note(rec, note, sizeof note));
            }
            if (ab_run_add(run, rec)) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
        }
        if (attn_has_step(a) && sv->recurrent) {
            stop = false;
            for (int ci = 0; ci < c.n_contexts && !g_interrupted; ci++) {
                json_t *rec;
                if (unsupported || stop) {
                    attn_shape s = {c.rec_batch, c.heads, (int)c.contexts[ci], c.qk_dim, c.v_dim, true, NULL};
                    rec = sweep_base_record(sv, a, &s, "recurrent");
                    json_object_set_new(rec, "context", json_integer(c.contexts[ci]));
                    json_object_set_new(rec, "status", json_string("skipped"));
                    json_object_set_new(rec, "reason", json_string(unsupported ? sv->unsupported
                                                                               : "ran out of time or memory at a shorter context"));
                } else {
                    rec = sweep_run_recurrent(&c, sv, a, c.contexts[ci], &stop);
                }
                if (!quiet) {
                    json_t *pp = json_object_get(rec, "per_position_ms");
                    char note[96];
                    fprintf(stderr, "bench: %-18s context=%-6lld %-8s step %10.4f ms%s\n", sv->label, c.contexts[ci],
                            json_string_value(json_object_get(rec, "status")), pp ? json_number_value(pp) : NAN,
                            traffic_note(rec, note, sizeof note));
                }
                if (ab_run_add(run, rec)) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
            }
        }
        attn_destroy(a);
    }
    json_t *summary = sweep_growth_summary(ab_run_records(run));
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
    if (!quiet) print_traffic(ab_run_records(run));
    const char *final = g_interrupted ? "interrupted" : failed ? "failed" : "ok";
    if (ab_run_finish(run, final)) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
    if (!quiet) fprintf(stderr, "bench: wrote %s (status %s)\n", out_path, final);
    sweep_config_free(&c);
    json_decref(root);
    return g_interrupted ? 130 : failed ? AB_EXIT_FAILURE : 0;
}
