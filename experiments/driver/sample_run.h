/* Ancestral sampling of whole rows (images) from a model of a task sampled value by
 * value behind a start token (train_task.samplable: the images and sequences tasks),
 * each attention variant in its own mode, with the sampling speed the paper reports
 * (images/s at a batch, seconds per image): what `attnbench sample` runs, as a library
 * (errors are AB_* codes with one line in ab_error(); nothing here exits).
 *
 * Row i of the output is a pure function of (seed, i) and the model: the uniform draw
 * of its value at position j is ab_rng_uniform(seed, TASK_STREAM_SAMPLE, i N + j)
 * (with a logistic-mixture head: the component; the value within it from
 * TASK_STREAM_SAMPLE2 at the same index),
 * whatever the batch, the mode and the device (up to the logits' rounding, which
 * decides a draw only when it falls within rounding of a class boundary).
 *
 * Modes: "recurrent" (linear, polynomial as RNNs with a parallel prefill of the
 * prompt, stateful-softmax with its key/value cache), "recompute" (every variant: a
 * full forward over the prefix for each new value, as the paper samples with softmax
 * and lsh), "auto": recurrent where the variant has it. Completion (complete F) keeps
 * the first floor(F N) values of the test split's rows (row i mod the split's rows)
 * and samples the rest: the paper's completions. */
#ifndef AB_SAMPLE_RUN_H
#define AB_SAMPLE_RUN_H

#include "trainer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum { SAMPLE_MODE_AUTO, SAMPLE_MODE_RECURRENT, SAMPLE_MODE_RECOMPUTE } sample_mode;

/* "auto", "recurrent" or "recompute" into *mode; false for anything else. */
bool sample_mode_parse(const char *s, sample_mode *mode);

/* A draw from softmax(x / T) with the uniform u in [0, 1): the first class whose
 * cumulative probability (in double, from the largest logit) exceeds u; T = 0: the
 * first largest logit. */
int sample_draw(const float *x, int n, double T, double u);

/* Where the model comes from: a training checkpoint (trained weights), or a training
 * config with --set overrides (the weights it initialises: for speed on a model's
 * shape, which does not depend on the weights); exactly one of the two. */
typedef struct {
    const char *checkpoint;
    const char *config;
    const char *const *sets; /* KEY=VALUE, with config only */
    int n_sets;
    const char *variant;     /* NULL, or a stand-in variant (train_variant_interchangeable) */
    ab_device device;
} sample_source;

typedef struct {
    long long n;        /* rows to draw, a multiple of batch */
    int batch;          /* rows at a time */
    double temperature; /* [0, 1e6]; a logistic-mixture head takes 0 or 1 */
    double complete;    /* [0, 1): the fraction of each test row kept */
    int estimate;       /* 0, or E > 0: measure speed only, at every E-th position */
    int traffic;        /* 0, or T > 0: count the memory traffic of one recurrent step at
                           position T and its draw (the instrumented emulator), nothing else */
    bool graph;         /* recurrent, on CUDA: each step's layers and head as one CUDA graph
                           (tf_gen_set_graph) */
    sample_mode mode;
    uint64_t seed;      /* the draws' seed, when have_seed; else the run's */
    bool have_seed;
} sample_opts;

/* A model opened for sampling, with what the options resolve to. */
typedef struct {
    sample_source src;
    sample_opts opts;
    train_config cfg;
    tf_model *m;
    train_ckpt_state meta; /* the checkpoint's step (-1 for a config) */
    bool recurrent;        /* the mode the options resolve to */
    uint64_t seed;         /* the draws' seed */
    int N;                 /* values per row */
    int P;                 /* values kept from a test row (completion), else 0 */
    int test;              /* the split completions come from, -1 without */
} sample_session;

/* What sample_run produced. */
typedef struct {
    long long n;          /* rows drawn (an estimate: one batch) */
    int *samples;         /* (n, N): NULL for an estimate */
    int *originals;       /* (n, N) the rows the prompts came from: NULL without completion */
    double wall_s, cpu_s; /* the sampling alone (an estimate: its sum over the row) */
    /* an estimate: the positions measured and their median wall and CPU seconds */
    int n_points;
    int *at;
    double *secs, *cpu_secs;
    json_t *traffic;      /* traffic: the counts beside the step's minimal bytes (owned) */
    /* recurrent: the CUDA graph's recordings and launches (tf_gen_graph_note), and why
     * the steps ran without one ("" while one ran or could) */
    long long graph_records, graph_launches;
    char graph_note[320];
} sample_result;

/* The options' own checks, before any model: n a multiple of batch; an estimate, a
 * completion and a traffic count exclude each other; a graph excludes an estimate. 0, or AB_EINVAL with one line
 * ("sample: ..."). */
int sample_opts_check(const sample_opts *o);
/* Loads the model (batch opts->batch) and checks the request against it: a task
 * sampled value by value, a temperature the head takes, the mode the variant has, test
 * rows to complete; for traffic, a recurrent mode on CUDA in a process that counts
 * traffic (harness/cuda_traffic.h) and a position inside the row. On success the session owns the model (sample_close). Errors: the
 * checkpoint's or config's (AB_EINVAL etc.), AB_EINVAL for a refused request. */
int sample_open(sample_session *s, const sample_source *src, const sample_opts *opts);
/* Draws the rows (or measures the estimate, or counts the traffic) into *r
 * (sample_result_free). The traffic: a prefill of the start token and T - 1 further
 * values, its draw, then one step at position T with its draw (the draws kept on the
 * device where sampling keeps them) counted, against the least such a step must move:
 * the weights read once (the token embedding's rows of the batch only, and one row of
 * the positions), each layer's attention state as sweep_min_state_bytes has it, the B
 * values in and out; the logits and every activation between the layers are the
 * implementation's, not the floor's. */
int sample_run(sample_session *s, sample_result *r);
/* The document of a run, schema "attnbench/sample/1" (the run, mode, head,
 * temperature, seed, n, batch, the prompt length, wall time of the sampling alone,
 * images/s, s/image, values/s, CPU time, memory, machine, the source's git
 * (harness/results.h: ab_git_info); for traffic "method":
 * "traffic", the counts in "traffic" and no times). NULL when out of memory. */
json_t *sample_document(const sample_session *s, const sample_result *r, const char *command_line);
/* The one-line summary of a run into buf ("sample: ... -> DIR"): rows, mode, s/image
 * and images/s at the batch; for a traffic count the MiB moved, the ratio to the
 * minimal bytes and the operations. */
void sample_summary(const sample_session *s, const sample_result *r, const char *dir, char *buf, size_t cap);
/* The grid's title: the run, the variant, samples or completions, a temperature not 1. */
void sample_grid_title(const sample_session *s, const sample_result *r, char *buf, size_t cap);
void sample_result_free(sample_result *r);
void sample_close(sample_session *s);

/* The grid of images (a pure function of the arrays): `n` images of h x w x c values
 * (channels last), `cols` to a row of the grid, one-pixel grey gaps; with `below`,
 * each row of the grid is followed by a row of the same positions from `below` (the
 * completions under their originals). Writes "x y r g b" lines to `path` (replaced
 * only by a complete file) and the grid's width and height; 0 or an error code. */
int sample_grid_write(const char *path, const int *img, const int *below, int n, int h, int w, int c, int cols,
                      int *gw, int *gh);

#endif
