/* The attention sweep (Figure 1) behind `attnbench bench`: its config
 * (sweep_config.c), its measurements (sweep_measure.c) and the run of them that writes
 * the run document (sweep_run.h, which experiments/cli/cmd_bench.c calls).
 *
 * For every (variant, N) it times forward and forward+backward of the attention
 * alone, records peak tracked memory (inputs, outputs, gradients, saved state and
 * workspace), and marks a variant `skipped` at larger N once it ran out of time or
 * memory; then the recurrent side (time per generated position against context). */
#ifndef AB_SWEEP_H
#define AB_SWEEP_H

#include "attention.h"
#include "device.h"

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

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
    bool has_step;            /* it has a recurrent step where it runs (set by the run, not the parser) */
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
    /* machine copy bandwidth: MiB copied (0: not measured) and timed copies; the rate
     * measured (GB/s, read + write bytes; NAN until measured), which puts a memory
     * floor beside each point's time */
    int copy_mib, copy_repeats;
    double copy_gbps;
    /* set by a signal handler: measurements stop early when it becomes non-zero */
    const volatile sig_atomic_t *interrupted;
} sweep_config;

/* Parses and validates a sweep config (every variant is created once on the CPU to
 * check its options) for device `dev`. 0 or AB_EINVAL with a one-line message naming
 * the dotted key (AB_ENOMEM when out of memory); on failure nothing is left to free. */
int sweep_config_parse(const json_t *root, ab_device dev, sweep_config *c);
/* Frees the strings parse made. */
void sweep_config_free(sweep_config *c);

/* The machine's sgemm rate (GFLOP/s) on the device (OpenBLAS or cuBLAS) for n x n
 * products: the median of up to `repeats` timed products after a warm-up, fewer once
 * the measurement has used c->time_budget_s (at least one: the warm-up's time when it
 * alone used the budget). Stops within about a second when *c->interrupted becomes
 * non-zero (the rate of the products done, or NAN without any). *done: the timed
 * products the rate comes from. NAN (and 0) on failure. */
double sweep_measure_gemm(const sweep_config *c, ab_device d, int n, int repeats, int *done);
/* The device's copy bandwidth (GB/s, counting the bytes read and the bytes written):
 * the median of up to `repeats` timed copies of `bytes` within the device's memory
 * (OpenMP threads over chunks of memcpy on the CPU; cudaMemcpyAsync device to device
 * on CUDA) after a warm-up, bounded by c->time_budget_s like the sgemm. The roofline's
 * memory floor of an op is its minimal bytes (sweep_min_bytes_*) at this rate.
 * *done: the timed copies. NAN (and 0) on failure or when interrupted first. */
double sweep_measure_copy(const sweep_config *c, ab_device d, size_t bytes, int repeats, int *done);
/* A record of a variant at a shape, with no measurement (kind "parallel" or
 * "recurrent"): the base of every record, and of "skipped" ones. */
json_t *sweep_base_record(const sweep_variant *sv, const attn *a, const attn_shape *s, const char *kind);
/* Sets every timing key a record lacks to null. */
void sweep_null_timings(json_t *r);
/* One parallel point: forward and forward+backward times, peak memory; status "ok",
 * "oom", "timeout" or "failed". *stop_variant is set when the variant's larger
 * lengths should be skipped. */
json_t *sweep_run_point(const sweep_config *c, const sweep_variant *sv, attn *a, const attn_shape *s,
                        bool *stop_variant);
/* One recurrent point: time per generated position after a prompt of `context`. */
json_t *sweep_run_recurrent(const sweep_config *c, const sweep_variant *sv, attn *a, long long context,
                            bool *stop_variant);
/* Least-squares slope of log(per-sample fwd+bwd time) on log(N) per variant. */
json_t *sweep_growth_summary(json_t *records);

/* ---- memory traffic (sweep_traffic.c; harness/cuda_traffic.h) ---- */

/* The bytes an operation must move at least: its inputs read once and its outputs
 * written once (what a perfect kernel reading and writing nothing else would move).
 * Forward (backward false): q, k (B H N D each) and v (B H N M) read, out (B H N M)
 * written, and the variant's own parameters read (n_params floats: linformer's
 * projections, 0 for the others). Forward+backward: also dout read, dq, dk, dv and the
 * parameters' gradient written. */
void sweep_min_bytes_parallel(const attn_shape *s, size_t n_params, bool backward, double *read, double *write);
/* The same for one recurrent step at position t (s->len ignored): q, k, v of the
 * position read and out written (B H (2D + M) and B H M floats), and the state: a
 * state that grows with the positions it holds (a key/value cache) has its t
 * positions read and the new position written (its bytes per position: its growth in
 * attn_state_bytes, without the padding and fixed words a state may also hold); the
 * state is the variant's on the CPU with the same options (a device backend's may add
 * padding and counters for its blocks, which the operation does not need);
 * a state of fixed size (linear attention's sums) is read and written whole (an upper
 * bound of what must be written where part of it never changes: FAVOR's W, a sliding
 * window's ring). 0, or an error code with a message. */
int sweep_min_bytes_step(const attn *a, const attn_shape *s, int t, double *read, double *write);
/* The state's part of that alone (what a whole model's step must read and write of each
 * layer's attention state, beside its weights). */
int sweep_min_state_bytes(const attn *a, const attn_shape *s, int t, double *read, double *write);
/* The counts of the last ab_cuda_traffic_start .. stop (what: "forward+backward" or
 * "step") beside the minimal bytes: totals, their ratios to the minimum, host<->device
 * copies, and every operation by name (a record's "traffic"). */
json_t *sweep_traffic_json(const char *what, double min_read, double min_write);

#endif


