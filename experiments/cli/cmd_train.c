/* attnbench train: runs a training config (train_config.h) with periodic evaluation,
 * logging and checkpoints; --resume continues a run from its checkpoint. The run is the
 * driver's (train_run.h, which describes the output folder); this file parses the
 * command line, stops the run on a signal and maps the result to an exit status. */
#include "commands.h"

#include "cli_args.h"
#include "cli_util.h"
#include "dist.h"
#include "error.h"
#include "train_array.h"
#include "train_run.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t g_stop = 0;
static void on_signal(int sig) { g_stop = sig != 0; }

/* Installed once the run's data are loaded: a signal before that ends the process
 * (main.c's handler), one during the steps stops the run with a checkpoint. */
static void install_handler(void *ctx) {
    (void)ctx;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
}

static const char TRAIN_USAGE[] =
    "usage: attnbench train CONFIG.json [--set KEY=VALUE]... [--device cpu|cuda] [--out DIR]\n"
    "                       [--resume] [--overwrite] [--quiet]\n"
    "       attnbench train --resume --out DIR [--set KEY=VALUE]...\n"
    "       attnbench train CONFIG.json --array-index I [...]  |  --array-count\n"
    "       mpirun -np R attnbench train CONFIG.json --dist mpi|nccl [...]\n"
    "\n"
    "Trains the model of CONFIG (task, model, optimiser; configs in experiments/*/,\n"
    "tasks listed by `attnbench list`) for `steps` steps or, on a dataset task,\n"
    "`epochs` passes over its train split, with evaluation every eval_every steps and a\n"
    "checkpoint every checkpoint_every steps. --set overrides a config value by its\n"
    "dotted path (e.g. --set steps=2000, --set optim.lr=3e-4; setting steps or epochs\n"
    "alone replaces the other). Writes DIR/train.json, DIR/train.tsv and\n"
    "DIR/checkpoint.bin (DIR default: results/NAME). --resume continues the run in DIR\n"
    "from its checkpoint (CONFIG may then be left out; only name, label, description,\n"
    "steps, epochs, eval_every, checkpoint_every and log_every may differ from the\n"
    "checkpoint's config).\n"
    "--overwrite replaces a run already in DIR. Ctrl-C stops at the end of the step\n"
    "with a checkpoint (status \"interrupted\"). A progress bar is drawn when stderr is\n"
    "a terminal; otherwise one line per log point (--quiet: none).\n"
    "A training array (experiments/sweep/CLUSTER.md): CONFIG's \"array\" is a list of\n"
    "objects of overrides ([{\"seed\": 1}, {\"seed\": 2}]); --array-index I runs entry I\n"
    "(its overrides, then --set) in DIR/array-I (DIR: --out, default results/NAME), and\n"
    "refuses a folder of another entry; --array-count prints the number of entries.\n"
    "--dist mpi (or nccl, with --device cuda: one GPU per rank) trains one model on the\n"
    "R ranks that mpirun starts: each takes batch / R rows of every step, the gradients\n"
    "are summed across ranks in rank order (the same bits as one process with\n"
    "accumulate = R), rank 0 writes DIR. See experiments/driver/README.md.\n";

/* train's own options. */
typedef struct {
    bool resume, overwrite, array_count;
    int array_index; /* -1: none */
    const char *dist;
} train_opts;

static bool train_option(int argc, char **argv, int *i, void *ctx) {
    train_opts *o = ctx;
    if (strcmp(argv[*i], "--resume") == 0) o->resume = true;
    else if (strcmp(argv[*i], "--overwrite") == 0) o->overwrite = true;
    else if (strcmp(argv[*i], "--dist") == 0) o->dist = cli_value(argc, argv, i);
    else if (strcmp(argv[*i], "--array-count") == 0) o->array_count = true;
    else if (strcmp(argv[*i], "--array-index") == 0)
        o->array_index = (int)cli_parse_int("--array-index", cli_value(argc, argv, i), 0, 1000000);
    else return false;
    return true;
}

/* Runs the request and maps its result to an exit status (or dies with its line). */
static int run_and_exit(const train_run_request *req) {
    ab_dist *dist = req->dist;
    train_run_result res;
    int rc = train_run(req, &res);
    switch (res.status) {
    case TRAIN_RUN_OK: ab_dist_close(dist); return 0;
    case TRAIN_RUN_INTERRUPTED: ab_dist_close(dist); return 130;
    /* a run that began on a valid request and failed (diverged, a full disk) */
    case TRAIN_RUN_FAILED:
        if (dist) cli_die_rank(dist, AB_EXIT_FAILURE, ab_dist_size(dist) > 1);
        cli_die(AB_EXIT_FAILURE, "%s", ab_error());
    case TRAIN_RUN_REFUSED: break;
    }
    if (dist) cli_die_rank(dist, cli_status_for(rc), false);
    cli_die(cli_status_for(rc), "%s", ab_error());
}

/* --array-index I: entry I's config and overrides (train_array.h), in DIR/array-I. */
static int cmd_train_array(const cli_args *args, int index, bool resume, bool overwrite, const char *command_line,
                           ab_dist *dist) {
    train_array_task t;
    int rc = train_array_prepare(args->arg, index, args->out, &t);
    if (rc) {
        if (dist) cli_die_rank(dist, cli_status_for(rc), false);
        cli_die(cli_status_for(rc), "%s", ab_error());
    }
    const char *sets[CLI_MAX_SETS * 2];
    int n = 0;
    for (int i = 0; i < t.n_sets && n < CLI_MAX_SETS * 2; i++) sets[n++] = t.sets[i];
    for (int i = 0; i < args->n_sets && n < CLI_MAX_SETS * 2; i++) sets[n++] = args->sets[i];
    train_run_request req = {
        .config = t.config, .sets = sets, .n_sets = n, .out_dir = t.dir, .resume = resume, .overwrite = overwrite,
        .quiet = args->quiet, .device = args->device, .command_line = command_line, .stop = &g_stop,
        .on_start = install_handler, .dist = dist,
    };
    /* run_and_exit exits on a failure: the task's memory goes with the process */
    rc = run_and_exit(&req);
    train_array_free(&t);
    return rc;
}

int cmd_train(int argc, char **argv, const char *command_line) {
    train_opts o = {false, false, false, -1, NULL};
    cli_args args = {.cmd = "train", .usage = TRAIN_USAGE, .positional = "config",
                     .takes = CLI_DEVICE | CLI_OUT | CLI_SET | CLI_QUIET};
    cli_parse(argc, argv, &args, train_option, &o);
    if (o.array_count) {
        int n;
        int rc = train_array_count(args.arg, &n);
        if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
        printf("%d\n", n);
        return 0;
    }
    ab_dist_kind kind = AB_DIST_NONE;
    if (o.dist && ab_dist_kind_parse(o.dist, &kind)) cli_die(AB_EXIT_USAGE, "%s", ab_error());
    ab_dist *dist = NULL;
    if (kind != AB_DIST_NONE) {
        int rc = ab_dist_open(kind, args.device, &dist);
        if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    }
    if (o.array_index >= 0) return cmd_train_array(&args, o.array_index, o.resume, o.overwrite, command_line, dist);
    train_run_request req = {
        .config_path = args.arg, .sets = args.sets, .n_sets = args.n_sets, .out_dir = args.out,
        .resume = o.resume, .overwrite = o.overwrite, .quiet = args.quiet, .device = args.device,
        .command_line = command_line, .stop = &g_stop, .on_start = install_handler, .dist = dist,
    };
    return run_and_exit(&req);
}
