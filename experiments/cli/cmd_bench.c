/* attnbench bench: runs the attention sweep of a config (experiments/driver/sweep.h)
 * and writes its run document, rewritten after each point. The run is the driver's
 * (sweep_run.h); this file parses the command line, stops the sweep on a signal and
 * maps the result to an exit status. */
#include "commands.h"

#include "cli_args.h"
#include "cli_util.h"
#include "error.h"
#include "sweep_run.h"

#include <signal.h>
#include <stdio.h>

static volatile sig_atomic_t g_interrupted = 0;
static void on_signal(int sig) {
    (void)sig;
    g_interrupted = 1;
}

/* Installed once the run document exists: a signal before that ends the process
 * (main.c's handler), one during the measurements stops the sweep. */
static void install_handler(void *ctx) {
    (void)ctx;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
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

int cmd_bench(int argc, char **argv, const char *command_line) {
    cli_args args = {.cmd = "bench", .usage = BENCH_USAGE, .positional = "config",
                     .takes = CLI_DEVICE | CLI_OUT | CLI_SET | CLI_QUIET};
    cli_parse(argc, argv, &args, NULL, NULL);
    sweep_run_request req = {
        .config_path = args.arg, .sets = args.sets, .n_sets = args.n_sets, .out_path = args.out,
        .quiet = args.quiet, .device = args.device, .command_line = command_line, .stop = &g_interrupted,
        .on_start = install_handler,
    };
    sweep_run_result res;
    int rc = sweep_run(&req, &res);
    switch (res.status) {
    case SWEEP_RUN_OK: return 0;
    case SWEEP_RUN_INTERRUPTED: return 130;
    case SWEEP_RUN_POINTS_FAILED: return AB_EXIT_FAILURE;
    /* the run document could not be written on (a full disk) */
    case SWEEP_RUN_FAILED: cli_die(AB_EXIT_FAILURE, "%s", ab_error());
    case SWEEP_RUN_ERROR: break;
    }
    cli_die(cli_status_for(rc), "%s", ab_error());
}
