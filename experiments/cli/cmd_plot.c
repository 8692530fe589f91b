/* attnbench plot RESULT.json...: draws a sweep's Figure 1, or the loss curves of
 * training runs (Figure 2), as PNG and SVG with gnuplot (plot_util.h). */
#include "cli_args.h"
#include "cli_util.h"
#include "commands.h"
#include "plot_util.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static const char PLOT_USAGE[] =
    "usage: attnbench plot RESULT.json... [--out PREFIX] [--title TEXT]\n"
    "\n"
    "From a result of `attnbench bench`: the two panels of Figure 1 (time and peak\n"
    "memory per sample against N, log-log, one line per variant), plots/figure1.gp.\n"
    "From one or more results of `attnbench train` (their train.json): Figure 2, the\n"
    "loss against the gradient step, log y, one colour per run labelled with its\n"
    "config's label (line: training loss per log interval; points: evaluation loss),\n"
    "plots/figure2.gp. Writes PREFIX.png and PREFIX.svg (default PREFIX: the first\n"
    "RESULT without .json) and PREFIX.plot.tsv, the data the figure was drawn from,\n"
    "written first: without gnuplot (or when it fails) the .plot.tsv is kept, the figures\n"
    "already there are left as they were, and the exit status is 1.\n";

#define MAX_INPUTS 32

/* plot's own arguments: --title and the results (any number of positional ones). */
typedef struct {
    const char *ins[MAX_INPUTS], *title;
    int n_in;
} plot_args;

static bool plot_option(int argc, char **argv, int *i, void *ctx) {
    plot_args *p = ctx;
    const char *o = argv[*i];
    if (strcmp(o, "--title") == 0) p->title = cli_value(argc, argv, i);
    else if (o[0] == '-') cli_die(AB_EXIT_USAGE, "plot: unknown argument '%s'", o);
    else if (p->n_in == MAX_INPUTS) cli_die(AB_EXIT_USAGE, "plot: at most %d results", MAX_INPUTS);
    else p->ins[p->n_in++] = o;
    return true;
}

int cmd_plot(int argc, char **argv, const char *command_line) {
    (void)command_line;
    plot_args p = {.n_in = 0};
    cli_args a = {.cmd = "plot", .usage = PLOT_USAGE, .takes = CLI_OUT};
    cli_parse(argc, argv, &a, plot_option, &p);
    const int n_in = p.n_in;
    if (n_in == 0) cli_die(AB_EXIT_USAGE, "plot: a RESULT.json from `attnbench bench` or `attnbench train` is required");
    json_t *docs[MAX_INPUTS];
    for (int i = 0; i < n_in; i++) docs[i] = plot_load_run(p.ins[i]);
    if (plot_is_train_doc(docs[0])) {
        int rc = plot_train(docs, p.ins, n_in, a.out, p.title);
        for (int i = 0; i < n_in; i++) json_decref(docs[i]);
        return rc;
    }
    if (n_in > 1) cli_die(AB_EXIT_USAGE, "plot: a sweep's figure takes one result (%d given)", n_in);
    int rc = plot_sweep(docs[0], p.ins[0], a.out, p.title);
    json_decref(docs[0]);
    return rc;
}
