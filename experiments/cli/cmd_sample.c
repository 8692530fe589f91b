/* attnbench sample CHECKPOINT: rows (images) sampled from a checkpoint's model and the speed
 * (driver/sample_run.h). Here the options and the files, each replaced only by a complete new
 * one: DIR/samples.npy (int32: (K, H, W, C) for images, else (K, N)), with --complete DIR/originals.npy,
 * for images samples.grid.tsv and samples.png (drawn last: without gnuplot one warning), sample.json. */
#include "commands.h"

#include "cli_args.h"
#include "cli_util.h"
#include "error.h"
#include "fileio.h"
#include "npy.h"
#include "sample_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SAMPLE_USAGE[] =
    "usage: attnbench sample CHECKPOINT [--n K] [--batch B] [--seed S] [--temperature T]\n"
    "                        [--mode auto|recurrent|recompute] [--complete FRACTION]\n"
    "                        [--variant NAME] [--estimate EVERY] [--traffic T] [--graph]\n"
    "                        [--out DIR] [--device cpu|cuda]\n"
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
    "linear interpolation; writes DIR/sample.json only, marked as an estimate.\n"
    "--traffic T (attnbench-emu --device cuda, recurrent modes) counts the device memory\n"
    "one step at position T and its draw move, after sampling's prefill and steps before\n"
    "it, beside the least such a step must move (its weights, the attention states, the\n"
    "values in and out): DIR/sample.json only, \"method\": \"traffic\", nothing timed.\n"
    "--graph (--device cuda, recurrent) runs each step's layers and head as one CUDA graph,\n"
    "recorded after each prefill (the same values; sample.json's \"graph\" says if it ran).\n";

typedef struct { /* sample's own options */
    sample_opts opts;
    const char *config, *variant;
} sample_cli;

static bool sample_option(int argc, char **argv, int *i, void *ctx) {
    sample_cli *o = ctx;
    const char *name = argv[*i];
    if (strcmp(name, "--n") == 0) o->opts.n = cli_parse_int("--n", cli_value(argc, argv, i), 1, 1 << 24);
    else if (strcmp(name, "--batch") == 0) o->opts.batch = (int)cli_parse_int("--batch", cli_value(argc, argv, i), 1, 1 << 16);
    else if (strcmp(name, "--mode") == 0) {
        const char *v = cli_value(argc, argv, i);
        if (!sample_mode_parse(v, &o->opts.mode))
            cli_die(AB_EXIT_USAGE, "--mode %s: must be auto, recurrent or recompute", v);
    } else if (strcmp(name, "--temperature") == 0 || strcmp(name, "--complete") == 0) {
        const char *v = cli_value(argc, argv, i);
        char *end;
        double x = strtod(v, &end);
        bool temp = strcmp(name, "--temperature") == 0;
        if (!*v || *end || !(x >= 0) || x > (temp ? 1e6 : 1.0) || (!temp && x == 1.0))
            cli_die(AB_EXIT_USAGE, "%s %s: must be a number in %s", name, v,
                    temp ? "[0, 1e6] (0: the likeliest value)" : "[0, 1) (the fraction of each row kept)");
        *(temp ? &o->opts.temperature : &o->opts.complete) = x;
    } else if (strcmp(name, "--config") == 0) o->config = cli_path_value(argc, argv, i);
    else if (strcmp(name, "--variant") == 0) o->variant = cli_value(argc, argv, i);
    else if (strcmp(name, "--estimate") == 0) o->opts.estimate = (int)cli_parse_int(name, cli_value(argc, argv, i), 1, 1 << 30);
    else if (strcmp(name, "--traffic") == 0) o->opts.traffic = (int)cli_parse_int(name, cli_value(argc, argv, i), 1, 1 << 30);
    else if (strcmp(name, "--graph") == 0) o->opts.graph = true;
    else return false;
    return true;
}

/* The arrays, the grid's data, sample.json, the summary line, then the grid drawn (a
 * figure that cannot be drawn loses no measurement). */
static void write_outputs(const sample_session *s, const sample_result *r, const char *dir, const char *command_line) {
    const train_task *task = s->cfg.task;
    const bool grid = task->image_h > 0 && r->samples;
    char path[4400], tsv[4400], png[4400], ws[32], hs[32], title[256], why[600], line[600];
    const int64_t shape[4] = {r->n, task->image_h > 0 ? task->image_h : s->N, task->image_w, task->image_c};
    const int nd = task->image_h > 0 ? 4 : 2;
    const int *arrays[2] = {r->samples, r->originals};
    for (int k = 0; k < 2; k++) {
        if (!arrays[k]) continue; /* an estimate draws nothing; originals come with --complete */
        snprintf(path, sizeof path, "%s/%s.npy", dir, k ? "originals" : "samples");
        if (ab_npy_write(path, AB_I32, nd, shape, arrays[k])) cli_die(AB_EXIT_USAGE, "%s", ab_error());
    }
    if (grid) {
        const int cols = r->originals ? (r->n < 8 ? (int)r->n : 8) : (int)ceil(sqrt((double)r->n));
        int gw, gh, rc;
        snprintf(tsv, sizeof tsv, "%s/samples.grid.tsv", dir);
        if ((rc = sample_grid_write(tsv, r->originals ? r->originals : r->samples, r->originals ? r->samples : NULL,
                                    (int)r->n, task->image_h, task->image_w, task->image_c, cols, &gw, &gh)))
            cli_die(cli_status_for(rc), "%s", ab_error());
        snprintf(png, sizeof png, "%s/samples.png", dir);
        snprintf(ws, sizeof ws, "%d", gw);
        snprintf(hs, sizeof hs, "%d", gh);
        sample_grid_title(s, r, title, sizeof title);
    }
    json_t *doc = sample_document(s, r, command_line);
    snprintf(path, sizeof path, "%s/sample.json", dir);
    cli_write_json(path, doc);
    json_decref(doc);
    sample_summary(s, r, dir, line, sizeof line);
    fprintf(stderr, "%s\n", line);
    if (grid && cli_draw("samples.gp", tsv, png, (const char *const[]){ws, hs, title, NULL}, why, sizeof why))
        cli_warn("sample: %s not drawn: %s (samples.npy, samples.grid.tsv and sample.json are written)", png, why);
}

int cmd_sample(int argc, char **argv, const char *command_line) {
    sample_cli o = {.opts = {.n = 16, .batch = 1, .temperature = 1.0, .mode = SAMPLE_MODE_AUTO}};
    cli_args a = {.cmd = "sample", .usage = SAMPLE_USAGE, .positional = "checkpoint",
                  .takes = CLI_DEVICE | CLI_SEED | CLI_OUT | CLI_SET};
    cli_parse(argc, argv, &a, sample_option, &o);
    const char *ckpt = a.arg;
    if (!ckpt == !o.config)
        cli_die(AB_EXIT_USAGE, "sample: %s", ckpt ? "a CHECKPOINT and --config exclude each other"
                                                  : "a CHECKPOINT (e.g. results/NAME/checkpoint.bin) or --config "
                                                    "CONFIG.json is required");
    if (a.n_sets && !o.config) cli_die(AB_EXIT_USAGE, "sample: --set goes with --config (a checkpoint's config is fixed)");
    if (sample_opts_check(&o.opts)) cli_die(AB_EXIT_USAGE, "%s", ab_error());
    o.opts.seed = a.seed, o.opts.have_seed = a.have_seed;
    const sample_source src = {ckpt, o.config, a.sets, a.n_sets, o.variant, a.device};
    sample_session s;
    sample_result r;
    int rc = sample_open(&s, &src, &o.opts);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    char dir[4096]; /* made before the work: a folder that cannot be made costs no sampling */
    if (a.out) snprintf(dir, sizeof dir, "%s", a.out);
    else snprintf(dir, sizeof dir, "results/%s-samples", s.cfg.name);
    if (ab_mkdir_p(dir)) cli_die(AB_EXIT_USAGE, "%s", ab_error());
    if ((rc = sample_run(&s, &r))) cli_die(cli_status_for(rc), "%s", ab_error());
    write_outputs(&s, &r, dir, command_line);
    sample_result_free(&r);
    sample_close(&s);
    return 0;
}
