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
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

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
    "       attnbench bench CONFIG.json [...] --points [--json]\n"
    "       attnbench bench CONFIG.json [...] --point I\n"
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
    "TSV beside it.\n"
    "\n"
    "A sweep in pieces (experiments/sweep/CLUSTER.md): --points lists its points, one\n"
    "variant at one length or context each, as a TSV (index, kind, variant, len or\n"
    "context, the point's document, done: 1 when that document holds the point,\n"
    "finished ok, of this config), or with --json as one document. --point I measures\n"
    "point I alone (and the machine's sgemm and copy rates) into its own document,\n"
    "FILE without .json plus .point-I.json (results/NAME.point-I.json); attnbench\n"
    "merge joins them.\n";

typedef struct {
    bool points, json, one_point;
    int point;
} bench_opts;

static bool bench_own(int argc, char **argv, int *i, void *ctx) {
    bench_opts *o = ctx;
    if (strcmp(argv[*i], "--points") == 0) o->points = true;
    else if (strcmp(argv[*i], "--json") == 0) o->json = true;
    else if (strcmp(argv[*i], "--point") == 0) {
        o->one_point = true;
        o->point = (int)cli_parse_int("--point", cli_value(argc, argv, i), 0, 1000000);
    } else
        return false;
    return true;
}

/* --points: the TSV (or JSON) of the sweep's points. */
static int print_points(const sweep_run_request *req, bool as_json) {
    json_t *doc;
    int rc = sweep_points_doc(req, &doc);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    if (as_json) {
        json_dumpf(doc, stdout, CLI_JSON_FLAGS);
        fputc('\n', stdout);
    } else {
        printf("index\tkind\tvariant\tlen\tdocument\tdone\n");
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(doc, "points"), i, p) {
            const char *kind = json_string_value(json_object_get(p, "kind"));
            json_t *len = json_object_get(p, strcmp(kind, "recurrent") == 0 ? "context" : "len");
            printf("%lld\t%s\t%s\t%lld\t%s\t%d\n", (long long)json_integer_value(json_object_get(p, "index")), kind,
                   json_string_value(json_object_get(p, "variant")), (long long)json_integer_value(len),
                   json_string_value(json_object_get(p, "document")), json_is_true(json_object_get(p, "done")));
        }
    }
    json_decref(doc);
    return fflush(stdout) == 0 ? 0 : AB_EXIT_FAILURE;
}

int cmd_bench(int argc, char **argv, const char *command_line) {
    cli_args args = {.cmd = "bench", .usage = BENCH_USAGE, .positional = "config",
                     .takes = CLI_DEVICE | CLI_OUT | CLI_SET | CLI_QUIET};
    bench_opts opts = {0};
    cli_parse(argc, argv, &args, bench_own, &opts);
    if (opts.json && !opts.points) cli_die(AB_EXIT_USAGE, "bench: --json goes with --points");
    if (opts.points && opts.one_point) cli_die(AB_EXIT_USAGE, "bench: --points and --point: one or the other");
    sweep_run_request req = {
        .config_path = args.arg, .sets = args.sets, .n_sets = args.n_sets, .out_path = args.out,
        .quiet = args.quiet, .device = args.device, .command_line = command_line, .stop = &g_interrupted,
        .on_start = install_handler, .one_point = opts.one_point, .point = opts.point,
    };
    if (opts.points) return print_points(&req, opts.json);
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
