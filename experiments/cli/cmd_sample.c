/* attnbench sample CHECKPOINT: ancestral sampling of whole rows (images) from a
 * training checkpoint of a task sampled value by value behind a start token
 * (train_task.samplable: the images and sequences tasks), each attention variant in
 * its own mode, with the sampling speed the paper reports (images/s at a batch,
 * seconds per image).
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
 * and lsh), "auto": recurrent where the variant has it. --complete F keeps the first
 * floor(F N) values of the test split's rows (row i mod the split's rows) and samples
 * the rest: the paper's completions.
 *
 * Output folder DIR: samples.npy (int32: (K, H, W, C) for image tasks, else (K, N)),
 * with --complete also originals.npy (the rows the prompts came from); for image tasks
 * samples.png, the grid (plots/samples.gp; with --complete each row of originals above
 * its completions) and samples.grid.tsv, its data; and sample.json
 * (schema "attnbench/sample/1": the run, mode, head, temperature, seed, K, batch, the
 * prompt length, wall time of the sampling alone, images/s, s/image, values/s). Every
 * file is replaced only by a complete new one. The grid is drawn last: without gnuplot
 * (or when it fails) it is one warning line, the rest is written and the exit status 0. */
#include "commands.h"

#include "blas.h"
#include "cli_util.h"
#include "config.h"
#include "cuda_device.h"
#include "error.h"
#include "fileio.h"
#include "layers.h"
#include "memory.h"
#include "npy.h"
#include "results.h"
#include "timer.h"
#include "trainer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SAMPLE_USAGE[] =
    "usage: attnbench sample CHECKPOINT [--n K] [--batch B] [--seed S] [--temperature T]\n"
    "                        [--mode auto|recurrent|recompute] [--complete FRACTION]\n"
    "                        [--variant NAME] [--estimate EVERY] [--out DIR] [--device cpu|cuda]\n"
    "       attnbench sample --config CONFIG.json [--set KEY=VALUE].. [options as above]\n"
    "\n"
    "Ancestral sampling of K rows (images) from the model of a training checkpoint whose\n"
    "task predicts its rows value by value (images, sequences), B rows at a time\n"
    "(default K 16, B 1; K must be a multiple of B). Each value is drawn from\n"
    "softmax(logits / T) (default T 1; 0: the likeliest value; a logistic-mixture head\n"
    "takes 1 or 0), the draw of row i's value j a pure function of the seed S (default\n"
    "the run's), i and j. Modes:\n"
    "recurrent (linear, polynomial, stateful-softmax: prefill, then one step per value),\n"
    "recompute (any variant: a full forward per value; softmax and lsh have only this),\n"
    "auto (the default: recurrent where the variant has it). --complete F keeps the\n"
    "first floor(F N) values of rows of the test split and samples the rest. Writes\n"
    "DIR/samples.npy (int32), with --complete DIR/originals.npy, for images the grid\n"
    "DIR/samples.png (gnuplot: without it a warning, the rest kept), and DIR/sample.json\n"
    "(images/s at batch B, seconds per image, values/s); DIR default results/NAME-samples.\n"
    "\n"
    "--config CONFIG.json (with --set overrides, as train) samples from the model the\n"
    "config initialises (its seed), no training: for speed on a model's shape, which does\n"
    "not depend on the weights. --variant NAME runs softmax's weights as stateful-softmax\n"
    "or the reverse (the same function; stateful-softmax trains as softmax). --estimate E\n"
    "measures speed only: the time to produce value j for all B rows at j = 0, E, 2E, ..\n"
    "and N-1 (recompute: the forward over the prefix; recurrent: one step after a prefill\n"
    "of j values, which is not timed), each the median of 3, integrated over every j by\n"
    "linear interpolation; writes DIR/sample.json only, marked as an estimate.\n";

static int argmax(const float *x, int n) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

/* A draw from softmax(x / T) with the uniform u in [0, 1): the first class whose
 * cumulative probability (in double, from the largest logit) exceeds u. */
static int draw(const float *x, int n, double T, double u) {
    if (!(T > 0)) return argmax(x, n);
    double mx = x[argmax(x, n)], z = 0;
    for (int i = 0; i < n; i++) z += exp(((double)x[i] - mx) / T);
    double c = 0, target = u * z;
    for (int i = 0; i < n; i++) {
        c += exp(((double)x[i] - mx) / T);
        if (c > target) return i;
    }
    return argmax(x, n); /* u z at the top of the sum's rounding: the likeliest class */
}

/* The first n tokens of each of the B rows of tokens (B, N), contiguous (B, n) in out. */
static const int *take_prefix(int *out, const int *tokens, int B, int N, int n) {
    for (int b = 0; b < B; b++) memcpy(out + (size_t)b * n, tokens + (size_t)b * N, sizeof(int) * (size_t)n);
    return out;
}

/* The grid of images (a pure function of the arrays): `n` images of h x w x c values
 * (channels last), `cols` to a row of the grid, one-pixel grey gaps; with `below`,
 * each row of the grid is followed by a row of the same positions from `below` (the
 * completions under their originals). Writes "x y r g b" lines to `path` (atomically)
 * and returns the grid's width and height. */
static void write_grid(const char *path, const int *img, const int *below, int n, int h, int w, int c, int cols,
                       int *gw, int *gh) {
    const int bands = (n + cols - 1) / cols, per_band = below ? 2 : 1;
    *gw = cols * (w + 1) - 1;
    *gh = bands * per_band * (h + 1) - 1;
    ab_atomic_file af;
    int rc = ab_atomic_open(&af, path);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    for (int y = 0; y < *gh; y++) {
        int band = y / (per_band * (h + 1)), yy = y % (per_band * (h + 1)), sub = yy / (h + 1), py = yy % (h + 1);
        const int *src = below && sub == 1 ? below : img;
        for (int x = 0; x < *gw; x++) {
            int col = x / (w + 1), px = x % (w + 1), k = band * cols + col;
            int rgb[3] = {128, 128, 128}; /* the gaps: mid-grey, apart from black and white images */
            if (px < w && py < h && k < n) {
                const int *p = src + (((size_t)k * h + py) * w + px) * c;
                for (int ch = 0; ch < 3; ch++) rgb[ch] = p[c == 3 ? ch : 0];
            }
            fprintf(af.f, "%d\t%d\t%d\t%d\t%d\n", x, y, rgb[0], rgb[1], rgb[2]);
        }
    }
    if ((rc = ab_atomic_commit(&af))) cli_die(cli_status_for(rc), "%s", ab_error());
}

/* Writes an int32 array atomically; dies with one line on failure. */
static void write_npy(const char *path, int ndim, const int64_t *shape, const int *data) {
    if (ab_npy_write(path, AB_I32, ndim, shape, data)) cli_die(AB_EXIT_USAGE, "%s", ab_error());
}

/* The model a training config initialises (its seed), with --set overrides and an
 * optional stand-in variant, for B rows on `device`. 0 or an error code with a message. */
static int config_model(const char *path, const char *const *sets, int n, const char *variant, int B, ab_device device,
                        train_config *cfg, tf_model **m) {
    *m = NULL;
    json_t *root = ab_config_load(path);
    if (!root) return AB_EINVAL;
    int rc = train_config_apply_sets(root, sets, n);
    if (!rc) rc = train_config_parse(root, cfg);
    json_decref(root);
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ab_error());
        return ab_fail(rc, "%s: %s", path, msg);
    }
    if (variant) {
        if (cfg->model.body != TF_BODY_TRANSFORMER)
            rc = ab_fail(AB_EINVAL, "%s: the model's body is %s: it has no attention variant to change", path,
                         tf_body_name(cfg->model.body));
        else if (!train_variant_interchangeable(cfg->model.attention, variant)) rc = AB_EINVAL;
        else cfg->model.attention = variant;
    }
    cfg->model.device = device;
    if (!rc) rc = tf_create_inference(&cfg->model, B, m);
    if (rc) train_config_free(cfg);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The sum over positions 0..pos[n-1] of a cost measured at pos[0] = 0 < pos[1] < ..,
 * linear in between. */
static double integrate(const int *pos, const double *cost, int n) {
    double total = cost[0];
    for (int p = 1; p < n; p++) { /* positions pos[p-1]+1 .. pos[p] */
        const double span = pos[p] - pos[p - 1];
        for (int j = pos[p - 1] + 1; j <= pos[p]; j++)
            total += cost[p - 1] + (cost[p] - cost[p - 1]) * (double)(j - pos[p - 1]) / span;
    }
    return total;
}

/* --estimate: the time to produce value j of B rows (logits of position j from the
 * inputs 0..j) at j = 0, every, 2 every, .., and N-1, each the median of 3 repeats;
 * recompute: one forward over the prefix of j + 1 inputs; recurrent: an untimed
 * prefill of j inputs (or of the one input at j = 0: the prefill is what sampling
 * times there), then one timed step (the repeats are the steps at j, j + 1, j + 2).
 * The inputs are the start token and then value 0: the time does not depend on them.
 * Returns the sum over all N positions, the cost between two measured positions
 * interpolated linearly; `at` and `secs` receive the measurements. The same for the
 * process's CPU time (*cpu_total, `cpu_secs`): each repeat's CPU seconds, their median
 * per position, integrated alike. */
static double estimate(tf_model *m, tf_gen *g, int B, int N, int start, int every, uint64_t attn_seed, int *tokens,
                       float *logits, json_t *at, json_t *secs, json_t *cpu_secs, double *cpu_total) {
    enum { REPEATS = 3 };
    int n_pts = 0, cap = N / every + 2;
    int *pos = malloc(sizeof(int) * (size_t)cap);
    double *cost = malloc(sizeof(double) * (size_t)cap), *cpu_cost = malloc(sizeof(double) * (size_t)cap);
    if (!pos || !cost || !cpu_cost) cli_die(AB_EXIT_FAILURE, "out of memory for the estimate's %d positions", cap);
    for (int j = 0; j < N; j += every) pos[n_pts++] = j;
    if (pos[n_pts - 1] != N - 1) pos[n_pts++] = N - 1;
    for (int b = 0; b < B; b++) {
        tokens[(size_t)b * N] = start;
        for (int j = 1; j < N; j++) tokens[(size_t)b * N + j] = 0;
    }
    int *prefix = malloc(sizeof(int) * (size_t)B * (size_t)N), *next = calloc((size_t)B, sizeof(int));
    if (!prefix || !next) cli_die(AB_EXIT_FAILURE, "out of memory for the estimate's inputs");
    for (int p = 0; p < n_pts; p++) {
        const int j = pos[p];
        double t[REPEATS], tc[REPEATS];
        int rc = 0;
        if (g) {
            rc = tf_gen_init(g);
            if (!rc) {
                const int P = j > 0 ? j : 1; /* j = 0: the timed prefill of the start token */
                uint64_t t0 = ab_now_ns(), c0 = ab_cpu_ns();
                rc = tf_gen_prefill(g, take_prefix(prefix, tokens, B, N, P), P, logits);
                double prefill_s = (double)(ab_now_ns() - t0) * 1e-9, prefill_cpu = (double)(ab_cpu_ns() - c0) * 1e-9;
                for (int r = 0; r < REPEATS && !rc; r++) {
                    if (j == 0) {
                        t[r] = prefill_s; /* one measurement: repeat it */
                        tc[r] = prefill_cpu;
                        continue;
                    }
                    if (tf_gen_position(g) >= N) { /* the last positions: a step from j again */
                        if (!(rc = tf_gen_init(g))) rc = tf_gen_prefill(g, take_prefix(prefix, tokens, B, N, j), j, logits);
                        if (rc) break;
                    }
                    t0 = ab_now_ns();
                    c0 = ab_cpu_ns();
                    rc = tf_gen_step(g, next, logits);
                    t[r] = (double)(ab_now_ns() - t0) * 1e-9;
                    tc[r] = (double)(ab_cpu_ns() - c0) * 1e-9;
                }
            }
        } else {
            for (int r = 0; r < REPEATS && !rc; r++) {
                uint64_t t0 = ab_now_ns(), c0 = ab_cpu_ns();
                rc = tf_last_logits(m, take_prefix(prefix, tokens, B, N, j + 1), B, j + 1, attn_seed, logits);
                t[r] = (double)(ab_now_ns() - t0) * 1e-9;
                tc[r] = (double)(ab_cpu_ns() - c0) * 1e-9;
            }
        }
        if (rc) cli_die(cli_status_for(rc), "sample --estimate: value %d: %s", j, ab_error());
        qsort(t, REPEATS, sizeof(double), cmp_double);
        qsort(tc, REPEATS, sizeof(double), cmp_double);
        cost[p] = t[REPEATS / 2];
        cpu_cost[p] = tc[REPEATS / 2];
        json_array_append_new(at, json_integer(j));
        json_array_append_new(secs, ab_json_num(cost[p]));
        json_array_append_new(cpu_secs, ab_json_num(cpu_cost[p]));
    }
    *cpu_total = integrate(pos, cpu_cost, n_pts);
    const double total = integrate(pos, cost, n_pts);
    free(pos);
    free(cost);
    free(cpu_cost);
    free(prefix);
    free(next);
    return total;
}

int cmd_sample(int argc, char **argv, const char *command_line) {
    const char *ckpt = NULL, *config_path = NULL, *out_dir = NULL, *mode_s = "auto", *variant = NULL;
    const char *sets[64];
    int n_sets = 0;
    long long K = 16, B = 1, every = 0;
    double temperature = 1.0, complete = 0.0;
    uint64_t seed = 0;
    bool have_seed = false;
    ab_device device = AB_DEV_CPU;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            fputs(SAMPLE_USAGE, stdout);
            return 0;
        } else if (strcmp(argv[i], "--n") == 0) K = cli_parse_int("--n", cli_value(argc, argv, &i), 1, 1 << 24);
        else if (strcmp(argv[i], "--batch") == 0) B = cli_parse_int("--batch", cli_value(argc, argv, &i), 1, 1 << 16);
        else if (strcmp(argv[i], "--seed") == 0) {
            seed = cli_parse_u64("--seed", cli_value(argc, argv, &i));
            have_seed = true;
        } else if (strcmp(argv[i], "--mode") == 0) {
            mode_s = cli_value(argc, argv, &i);
            if (strcmp(mode_s, "auto") && strcmp(mode_s, "recurrent") && strcmp(mode_s, "recompute"))
                cli_die(AB_EXIT_USAGE, "--mode %s: must be auto, recurrent or recompute", mode_s);
        } else if (strcmp(argv[i], "--temperature") == 0 || strcmp(argv[i], "--complete") == 0) {
            const char *name = argv[i], *v = cli_value(argc, argv, &i);
            char *end;
            double x = strtod(v, &end);
            bool temp = strcmp(name, "--temperature") == 0;
            if (!*v || *end || !(x >= 0) || x > (temp ? 1e6 : 1.0) || (!temp && x == 1.0))
                cli_die(AB_EXIT_USAGE, "%s %s: must be a number in %s", name, v,
                        temp ? "[0, 1e6] (0: the likeliest value)" : "[0, 1) (the fraction of each row kept)");
            *(temp ? &temperature : &complete) = x;
        } else if (strcmp(argv[i], "--out") == 0) out_dir = cli_path_value(argc, argv, &i);
        else if (strcmp(argv[i], "--config") == 0) config_path = cli_path_value(argc, argv, &i);
        else if (strcmp(argv[i], "--set") == 0) {
            if (n_sets == 64) cli_die(AB_EXIT_USAGE, "sample: too many --set options");
            sets[n_sets++] = cli_value(argc, argv, &i);
        } else if (strcmp(argv[i], "--variant") == 0) variant = cli_value(argc, argv, &i);
        else if (strcmp(argv[i], "--estimate") == 0)
            every = cli_parse_int("--estimate", cli_value(argc, argv, &i), 1, 1 << 30);
        else if (strcmp(argv[i], "--device") == 0) {
            device = cli_device_value(argc, argv, &i);
        } else if (argv[i][0] == '-') cli_die(AB_EXIT_USAGE, "sample: unknown argument '%s' (see attnbench sample --help)", argv[i]);
        else if (!ckpt) ckpt = argv[i];
        else cli_die(AB_EXIT_USAGE, "sample: more than one checkpoint given ('%s' and '%s')", ckpt, argv[i]);
    }
    if (!ckpt == !config_path)
        cli_die(AB_EXIT_USAGE, "sample: %s", ckpt ? "a CHECKPOINT and --config exclude each other"
                                                  : "a CHECKPOINT (e.g. results/NAME/checkpoint.bin) or --config "
                                                    "CONFIG.json is required");
    if (n_sets && !config_path) cli_die(AB_EXIT_USAGE, "sample: --set goes with --config (a checkpoint's config is fixed)");
    if (K % B) cli_die(AB_EXIT_USAGE, "sample: --n %lld is not a multiple of --batch %lld", K, B);
    if (every && complete > 0) cli_die(AB_EXIT_USAGE, "sample: --estimate and --complete exclude each other");
    if (device == AB_DEV_CUDA && ab_cuda_init()) cli_die(AB_EXIT_USAGE, "%s", ab_error());

    train_config cfg;
    tf_model *m;
    train_ckpt_state meta = {.step = -1};
    int rc = ckpt ? train_ckpt_load_model(ckpt, (int)B, device, variant, &cfg, &m, &meta)
                  : config_model(config_path, sets, n_sets, variant, (int)B, device, &cfg, &m);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    const train_task *task = cfg.task;
    if (!task->samplable || task->input != TASK_INPUT_TOKENS)
        cli_die(AB_EXIT_USAGE, "sample: the task '%s' is not predicted value by value behind a start token "
                               "(sample takes image and sequence tasks)", task->name);
    const bool mixture = cfg.model.head == TF_HEAD_LOGISTIC_MIXTURE;
    if (mixture && temperature != 0 && temperature != 1)
        cli_die(AB_EXIT_USAGE, "sample --temperature %g: a logistic-mixture head samples at 1 (ancestral) or takes "
                               "the most probable value at 0, nothing between", temperature);
    if (!have_seed) seed = cfg.seed;
    bool recurrent = strcmp(mode_s, "recurrent") == 0 || (strcmp(mode_s, "auto") == 0 && tf_has_recurrent(m));
    if (recurrent && !tf_has_recurrent(m)) cli_die(AB_EXIT_USAGE, "sample --mode recurrent: %s", ab_error());
    ab_clear_error();

    const int N = task->seq_len, V = tf_classes(m), start = task->classes, Bi = (int)B;
    const int P = (int)floor(complete * N); /* values kept from the test rows */
    int test = -1;
    if (complete > 0) {
        test = task_split_find(task, "test");
        if (test < 0) test = task->n_splits - 1;
        if (test < 0 || task->split_rows[test] < 1)
            cli_die(AB_EXIT_USAGE, "sample --complete: the task '%s' has no test rows to complete", task->name);
    }
    char dir[4096];
    if (out_dir) snprintf(dir, sizeof dir, "%s", out_dir);
    else snprintf(dir, sizeof dir, "results/%s-samples", cfg.name);
    if (ab_mkdir_p(dir)) cli_die(AB_EXIT_USAGE, "%s", ab_error());

    size_t KN = (size_t)K * (size_t)N;
    int *samples = malloc(sizeof(int) * KN), *originals = P > 0 ? malloc(sizeof(int) * KN) : NULL;
    int *tokens = malloc(sizeof(int) * (size_t)Bi * (size_t)N), *next = malloc(sizeof(int) * (size_t)Bi);
    float *logits = malloc(sizeof(float) * (size_t)Bi * (size_t)V);
    long long *rows = malloc(sizeof(long long) * (size_t)Bi);
    int *prefix = malloc(sizeof(int) * (size_t)Bi * (size_t)N); /* (B, j + 1) of tokens, contiguous */
    if (!samples || (P > 0 && !originals) || !tokens || !next || !logits || !rows || !prefix)
        cli_die(AB_EXIT_FAILURE, "out of memory for %lld samples of %d values", K, N);
    task_batch tb = {0};
    if (P > 0 && (rc = task_batch_alloc(task, Bi, &tb))) cli_die(cli_status_for(rc), "%s", ab_error());
    tf_gen *g = NULL;
    if (recurrent && (rc = tf_gen_create(m, Bi, N, &g))) cli_die(cli_status_for(rc), "%s", ab_error());
    const uint64_t attn_seed = tf_step_seed(cfg.seed, TRAIN_EVAL_STEP);
    tf_gen_set_seed(g, attn_seed); /* both modes draw the attention's random choices alike */
    /* the timed part's wall seconds and the process's CPU seconds (with one thread on a
     * machine shared with other work, the CPU time is what a quiet core would take) */
    double sample_s = 0, sample_cpu_s = 0;
    json_t *est_at = NULL, *est_s = NULL, *est_cpu = NULL;
    if (every) {
        K = B; /* an estimate is for one batch of rows */
        est_at = json_array();
        est_s = json_array();
        est_cpu = json_array();
        sample_s = estimate(m, g, Bi, N, start, (int)every, attn_seed, tokens, logits, est_at, est_s, est_cpu,
                            &sample_cpu_s);
    }

    for (long long i0 = 0; i0 < K && !every; i0 += B) {
        /* the prompts: START, then the first P values of test rows */
        for (int b = 0; b < Bi; b++) tokens[(size_t)b * N] = start;
        if (P > 0) {
            for (int b = 0; b < Bi; b++) rows[b] = (i0 + b) % task->split_rows[test];
            task_batch_fill_rows(task, test, rows, Bi, &tb);
            for (int b = 0; b < Bi; b++) {
                const int *x = tb.targets + (size_t)b * tb.N;
                memcpy(originals + (size_t)(i0 + b) * N, x, sizeof(int) * (size_t)N);
                memcpy(samples + (size_t)(i0 + b) * N, x, sizeof(int) * (size_t)P);
                for (int j = 1; j <= P && j < N; j++) tokens[(size_t)b * N + j] = x[j - 1];
            }
        }
        const uint64_t t0 = ab_now_ns(), c0 = ab_cpu_ns();
        for (int j = P; j < N; j++) {
            /* logits (B, V) predicting value j, from the inputs 0..j */
            if (recurrent) {
                if (j == P) {
                    rc = tf_gen_init(g);
                    if (!rc) rc = tf_gen_prefill(g, take_prefix(prefix, tokens, Bi, N, P + 1), P + 1, logits);
                } else {
                    rc = tf_gen_step(g, next, logits);
                }
            } else {
                rc = tf_last_logits(m, take_prefix(prefix, tokens, Bi, N, j + 1), Bi, j + 1, attn_seed, logits);
            }
            if (rc) cli_die(cli_status_for(rc), "sample: rows %lld.., value %d: %s", i0, j, ab_error());
            for (int b = 0; b < Bi; b++) {
                const uint64_t idx = (uint64_t)(i0 + b) * (uint64_t)N + (uint64_t)j;
                const float *lb = logits + (size_t)b * V;
                const double u = ab_rng_uniform(seed, TASK_STREAM_SAMPLE, idx);
                const int x = !mixture           ? draw(lb, V, temperature, u)
                              : temperature == 0 ? mixture_mode(lb, cfg.model.mixtures)
                                                 : mixture_sample(lb, cfg.model.mixtures, u,
                                                                  ab_rng_uniform(seed, TASK_STREAM_SAMPLE2, idx));
                samples[(size_t)(i0 + b) * N + j] = x;
                next[b] = x;
                if (j + 1 < N) tokens[(size_t)b * N + j + 1] = x;
            }
        }
        sample_s += (double)(ab_now_ns() - t0) * 1e-9;
        sample_cpu_s += (double)(ab_cpu_ns() - c0) * 1e-9;
    }

    /* outputs: the arrays, then the document (each replaced atomically) */
    char path[4400];
    int64_t shape[4] = {0};
    int nd = 0;
    if (every) {
        /* an estimate draws nothing */
    } else if (task->image_h > 0) {
        shape[0] = K, shape[1] = task->image_h, shape[2] = task->image_w, shape[3] = task->image_c;
        nd = 4;
    } else {
        shape[0] = K, shape[1] = N;
        nd = 2;
    }
    if (!every) {
        snprintf(path, sizeof path, "%s/samples.npy", dir);
        write_npy(path, nd, shape, samples);
    }
    if (originals) {
        snprintf(path, sizeof path, "%s/originals.npy", dir);
        write_npy(path, nd, shape, originals);
    }
    /* the grid of an image task: its data now, drawn by gnuplot (plots/samples.gp) once
     * sample.json is written (a figure that cannot be drawn loses no measurement) */
    const bool grid = task->image_h > 0 && !every;
    char tsv[4400], png[4400], ws[32], hs[32], title[256];
    if (grid) {
        const int h = task->image_h, w = task->image_w, c = task->image_c;
        int cols = originals ? (K < 8 ? (int)K : 8) : (int)ceil(sqrt((double)K)), gw, gh;
        snprintf(tsv, sizeof tsv, "%s/samples.grid.tsv", dir);
        write_grid(tsv, originals ? originals : samples, originals ? samples : NULL, (int)K, h, w, c, cols, &gw, &gh);
        snprintf(png, sizeof png, "%s/samples.png", dir);
        snprintf(ws, sizeof ws, "%d", gw);
        snprintf(hs, sizeof hs, "%d", gh);
        snprintf(title, sizeof title, "%s, %s, %s%s", cfg.name, cfg.model.attention ? cfg.model.attention : "",
                 originals ? "completions under the originals" : "samples", temperature == 1 ? "" : " (T != 1)");
    }
    const double images = (double)K, values = (double)K * (double)(N - P);
    json_t *doc = json_object();
    json_object_set_new(doc, "schema", json_string("attnbench/sample/1"));
    json_object_set_new(doc, "command", json_string(command_line));
    json_object_set_new(doc, "checkpoint", ckpt ? json_string(ckpt) : json_null());
    json_object_set_new(doc, "config", config_path ? json_string(config_path) : json_null());
    json_object_set_new(doc, "run", json_string(cfg.name));
    /* trained weights (a checkpoint at a step) or the config's initialisation */
    json_object_set_new(doc, "weights", json_string(ckpt ? "trained" : "initialised"));
    json_object_set_new(doc, "step", ckpt ? json_integer((json_int_t)meta.step) : json_null());
    json_object_set_new(doc, "model", json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "body", tf_body_name(cfg.model.body),
                                                "layers", cfg.model.layers, "d_model", cfg.model.d_model, "heads",
                                                cfg.model.heads, "d_ff", cfg.model.d_ff, "params",
                                                (int)tf_param_count(m)));
    json_object_set_new(doc, "task", json_string(task->name));
    json_object_set_new(doc, "variant", cfg.model.attention ? json_string(cfg.model.attention) : json_null());
    json_object_set_new(doc, "mode", json_string(recurrent ? "recurrent" : "recompute"));
    json_object_set_new(doc, "head", json_string(tf_head_name(cfg.model.head)));
    json_object_set_new(doc, "temperature", json_real(temperature));
    json_object_set_new(doc, "seed", json_integer((json_int_t)seed));
    json_object_set_new(doc, "n", json_integer(K));
    json_object_set_new(doc, "batch", json_integer(B));
    json_object_set_new(doc, "values_per_row", json_integer(N));
    json_object_set_new(doc, "complete", json_real(complete));
    json_object_set_new(doc, "prompt_values", json_integer(P));
    json_object_set_new(doc, "device", json_string(ab_device_name(device)));
    /* "sampled": whole rows drawn and timed; "estimated": --estimate's sum */
    json_object_set_new(doc, "method", json_string(every ? "estimated" : "sampled"));
    if (every)
        json_object_set_new(doc, "estimate",
                            json_pack("{s:I, s:i, s:o, s:o, s:o}", "every", (json_int_t)every, "repeats", 3, "positions",
                                      est_at, "seconds", est_s, "cpu_seconds", est_cpu));
    json_object_set_new(doc, "wall_s", ab_json_num(sample_s));
    json_object_set_new(doc, "images_per_s", ab_json_num(sample_s > 0 ? images / sample_s : NAN));
    json_object_set_new(doc, "s_per_image", ab_json_num(sample_s / images));
    json_object_set_new(doc, "values_per_s", ab_json_num(sample_s > 0 ? values / sample_s : NAN));
    json_object_set_new(doc, "cpu_s", ab_json_num(sample_cpu_s));
    json_object_set_new(doc, "cpu_s_per_image", ab_json_num(sample_cpu_s / images));
    json_object_set_new(doc, "threads", json_integer(ab_threads()));
    json_object_set_new(doc, "peak_bytes", json_integer((json_int_t)ab_mem_peak(AB_DEV_CPU)));
    if (device == AB_DEV_CUDA)
        json_object_set_new(doc, "device_peak_bytes", json_integer((json_int_t)ab_mem_peak(AB_DEV_CUDA)));
    json_object_set_new(doc, "machine", ab_machine_info());
    snprintf(path, sizeof path, "%s/sample.json", dir);
    cli_write_json(path, doc);
    fprintf(stderr, "sample: %lld rows of %d values (%d kept), %s, %s%.3g s/image, %.3g images/s at batch %lld -> %s\n",
            K, N, P, recurrent ? "recurrent" : "recompute", every ? "estimated " : "", sample_s / images,
            sample_s > 0 ? images / sample_s : NAN, B, dir);
    char why[600];
    if (grid && cli_draw("samples.gp", tsv, png, (const char *const[]){ws, hs, title, NULL}, why, sizeof why))
        cli_warn("sample: %s not drawn: %s (samples.npy, samples.grid.tsv and sample.json are written)", png, why);
    json_decref(doc);
    tf_gen_destroy(g);
    task_batch_free(&tb);
    tf_destroy(m);
    train_config_free(&cfg);
    free(samples);
    free(originals);
    free(tokens);
    free(next);
    free(logits);
    free(rows);
    free(prefix);
    return 0;
}
