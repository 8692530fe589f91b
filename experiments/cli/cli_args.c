/* The options several commands share (cli_args.h). */
#include "cli_args.h"

#include "cli_util.h"
#include "cuda_device.h"
#include "error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether argv[*i] is a common option the command takes (its value consumed). */
static bool common_option(int argc, char **argv, int *i, cli_args *a) {
    const char *o = argv[*i];
    if ((a->takes & CLI_DEVICE) && strcmp(o, "--device") == 0) {
        a->device = cli_device_value(argc, argv, i);
    } else if ((a->takes & CLI_SEED) && strcmp(o, "--seed") == 0) {
        a->seed = cli_parse_u64("--seed", cli_value(argc, argv, i));
        a->have_seed = true;
    } else if ((a->takes & CLI_OUT) && strcmp(o, "--out") == 0) {
        a->out = cli_path_value(argc, argv, i);
    } else if ((a->takes & CLI_SET) && strcmp(o, "--set") == 0) {
        const char *kv = cli_value(argc, argv, i);
        if (a->n_sets == CLI_MAX_SETS)
            cli_die(AB_EXIT_USAGE, "%s: too many --set options (at most %d)", a->cmd, CLI_MAX_SETS);
        a->sets[a->n_sets++] = kv;
    } else if ((a->takes & CLI_QUIET) && strcmp(o, "--quiet") == 0) {
        a->quiet = true;
    } else {
        return false;
    }
    return true;
}

void cli_parse(int argc, char **argv, cli_args *a, cli_own_fn own, void *ctx) {
    a->device = AB_DEV_CPU;
    a->seed = 0;
    a->have_seed = false;
    a->out = NULL;
    a->n_sets = 0;
    a->quiet = false;
    a->arg = NULL;
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i];
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            fputs(a->usage, stdout);
            exit(0);
        }
        if (common_option(argc, argv, &i, a) || (own && own(argc, argv, &i, ctx))) continue;
        if (o[0] == '-' || !a->positional)
            cli_die(AB_EXIT_USAGE, "%s: unknown argument '%s' (see attnbench %s --help)", a->cmd, o, a->cmd);
        if (a->arg)
            cli_die(AB_EXIT_USAGE, "%s: more than one %s given ('%s' and '%s')", a->cmd, a->positional, a->arg, o);
        a->arg = o;
    }
    /* The device is checked up front: a build without CUDA, or a machine without a
     * usable GPU, says so before any work (exit status 2: the request cannot be
     * served here). */
    if (a->device == AB_DEV_CUDA && ab_cuda_init()) cli_die(AB_EXIT_USAGE, "%s", ab_error());
}
