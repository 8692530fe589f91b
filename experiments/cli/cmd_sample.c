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
 * file is replaced only by a complete new one. */
#include "commands.h"

#include "blas.h"
#include "cli_util.h"
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
#include <unistd.h>

static const char SAMPLE_USAGE[] =
    "usage: attnbench sample CHECKPOINT [--n K] [--batch B] [--seed S] [--temperature T]\n"
    "                        [--mode auto|recurrent|recompute] [--complete FRACTION]\n"
    "                        [--out DIR] [--device cpu|cuda]\n"
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
    "DIR/samples.png (gnuplot), and DIR/sample.json\n"
    "(images/s at batch B, seconds per image, values/s); DIR default results/NAME-samples.\n";

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

int cmd_sample(int argc, char **argv, const char *command_line) {
    const char *ckpt = NULL, *out_dir = NULL, *mode_s = "auto";
    long long K = 16, B = 1;
    double temperature = 1.0, complete = 0.0;
    uint64_t seed = 0;
    bool have_seed = false;
    attn_device device = ATTN_DEVICE_CPU;
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
        else if (strcmp(argv[i], "--device") == 0) {
            const char *d = cli_value(argc, argv, &i);
            if (strcmp(d, "cuda") == 0) device = ATTN_DEVICE_CUDA;
            else if (strcmp(d, "cpu") == 0) device = ATTN_DEVICE_CPU;
            else cli_die(AB_EXIT_USAGE, "--device %s: must be cpu or cuda", d);
        } else if (argv[i][0] == '-') cli_die(AB_EXIT_USAGE, "sample: unknown argument '%s' (see attnbench sample --help)", argv[i]);
        else if (!ckpt) ckpt = argv[i];
        else cli_die(AB_EXIT_USAGE, "sample: more than one checkpoint given ('%s' and '%s')", ckpt, argv[i]);
    }
    if (!ckpt) cli_die(AB_EXIT_USAGE, "sample: a CHECKPOINT (e.g. results/NAME/checkpoint.bin) is required");
    if (K % B) cli_die(AB_EXIT_USAGE, "sample: --n %lld is not a multiple of --batch %lld", K, B);
    if (device == ATTN_DEVICE_CUDA && ab_cuda_init()) cli_die(AB_EXIT_USAGE, "%s", ab_error());

    train_config cfg;
    tf_model *m;
    train_ckpt_state meta;
    int rc = train_ckpt_load_model(ckpt, (int)B, device, &cfg, &m, &meta);
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
    double sample_s = 0;

    for (long long i0 = 0; i0 < K; i0 += B) {
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
        const uint64_t t0 = ab_now_ns();
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
    }

    /* outputs: the arrays, then the document (each replaced atomically) */
    char path[4400];
    int64_t shape[4];
    int nd;
    if (task->image_h > 0) {
        shape[0] = K, shape[1] = task->image_h, shape[2] = task->image_w, shape[3] = task->image_c;
        nd = 4;
    } else {
        shape[0] = K, shape[1] = N;
        nd = 2;
    }
    snprintf(path, sizeof path, "%s/samples.npy", dir);
    write_npy(path, nd, shape, samples);
    if (originals) {
        snprintf(path, sizeof path, "%s/originals.npy", dir);
        write_npy(path, nd, shape, originals);
    }
    /* the grid of an image task, drawn by gnuplot (plots/samples.gp) to a temporary
     * name, then renamed over DIR/samples.png */
    if (task->image_h > 0) {
        const int h = task->image_h, w = task->image_w, c = task->image_c;
        int cols = originals ? (K < 8 ? (int)K : 8) : (int)ceil(sqrt((double)K)), gw, gh;
        char tsv[4400], png[4400], tmp[4500], script[4096], ws[32], hs[32], title[256];
        snprintf(tsv, sizeof tsv, "%s/samples.grid.tsv", dir);
        write_grid(tsv, originals ? originals : samples, originals ? samples : NULL, (int)K, h, w, c, cols, &gw, &gh);
        snprintf(png, sizeof png, "%s/samples.png", dir);
        snprintf(tmp, sizeof tmp, "%s/samples.tmp.%d.png", dir, (int)getpid());
        snprintf(ws, sizeof ws, "%d", gw);
        snprintf(hs, sizeof hs, "%d", gh);
        snprintf(title, sizeof title, "%s, %s, %s%s", cfg.name, cfg.model.attention ? cfg.model.attention : "",
                 originals ? "completions under the originals" : "samples", temperature == 1 ? "" : " (T != 1)");
        if (!cli_find_plot_script("samples.gp", script, sizeof script))
            cli_die(AB_EXIT_FAILURE, "sample: plots/samples.gp not found (set ATTNBENCH_PLOTS to the plots folder)");
        if (cli_gnuplot(script, (const char *const[]){tsv, tmp, ws, hs, title, NULL}) != 0 || rename(tmp, png) != 0) {
            remove(tmp);
            cli_die(AB_EXIT_FAILURE, "sample: gnuplot failed to draw %s (is gnuplot installed? harness/scripts/setup.sh "
                                     "installs it)", png);
        }
    }
    const double images = (double)K, values = (double)K * (double)(N - P);
    json_t *doc = json_object();
    json_object_set_new(doc, "schema", json_string("attnbench/sample/1"));
    json_object_set_new(doc, "command", json_string(command_line));
    json_object_set_new(doc, "checkpoint", json_string(ckpt));
    json_object_set_new(doc, "run", json_string(cfg.name));
    json_object_set_new(doc, "step", json_integer((json_int_t)meta.step));
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
    json_object_set_new(doc, "device", json_string(device == ATTN_DEVICE_CUDA ? "cuda" : "cpu"));
    json_object_set_new(doc, "wall_s", ab_json_num(sample_s));
    json_object_set_new(doc, "images_per_s", ab_json_num(sample_s > 0 ? images / sample_s : NAN));
    json_object_set_new(doc, "s_per_image", ab_json_num(sample_s / images));
    json_object_set_new(doc, "values_per_s", ab_json_num(sample_s > 0 ? values / sample_s : NAN));
    json_object_set_new(doc, "threads", json_integer(ab_threads()));
    json_object_set_new(doc, "peak_bytes", json_integer((json_int_t)ab_mem_peak(AB_DEV_CPU)));
    if (device == ATTN_DEVICE_CUDA)
        json_object_set_new(doc, "device_peak_bytes", json_integer((json_int_t)ab_mem_peak(AB_DEV_CUDA)));
    json_object_set_new(doc, "machine", ab_machine_info());
    snprintf(path, sizeof path, "%s/sample.json", dir);
    ab_atomic_file af;
    if ((rc = ab_atomic_open(&af, path))) cli_die(cli_status_for(rc), "%s", ab_error());
    const size_t flags = JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9);
    if (json_dumpf(doc, af.f, flags) != 0) {
        ab_atomic_abort(&af);
        cli_die(AB_EXIT_FAILURE, "cannot write %s", path);
    }
    fputc('\n', af.f);
    if ((rc = ab_atomic_commit(&af))) cli_die(cli_status_for(rc), "%s", ab_error());
    fprintf(stderr, "sample: %lld rows of %d values (%d kept), %s, %.3g s/image, %.3g images/s at batch %lld -> %s\n", K,
            N, P, recurrent ? "recurrent" : "recompute", sample_s / images, sample_s > 0 ? images / sample_s : NAN, B,
            dir);
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
