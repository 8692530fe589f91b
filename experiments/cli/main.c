/* attnbench: the command-line driver. */
#include "blas.h"
#include "cli_util.h"
#include "commands.h"
#include "data_command.h"
#include "task_list.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const cli_command cli_commands[] = {
    {"list", cmd_list, "list", "every attention variant with its options and defaults"},
    {"op", cmd_op, "op", "one attention call on .npy tensors (forward, backward, recurrent)"},
    {"inputs", cmd_inputs, "inputs", "write seeded random q, k, v, dout .npy files for op"},
    {"bench", cmd_bench, "bench CONFIG.json", "the attention sweep over sequence lengths (Figure 1) -> results/"},
    {"merge", cmd_merge, "merge DOC.json..",
     "join the documents of a sweep's points (bench --point I) into\n"
     "the sweep's run document, checked"},
    {"plot", cmd_plot, "plot RESULT.json..",
     "draw a figure (PNG and SVG) with gnuplot: a sweep's Figure 1, or\n"
     "the loss curves of training runs (Figure 2)"},
    {"train", cmd_train, "train CONFIG.json", "train a model (e.g. the copy task, experiments/copy/) -> results/NAME/"},
    {"generate", cmd_generate, "generate CHECKPOINT", "greedy generation from a training checkpoint: accuracy and tokens/s"},
    {"sample", cmd_sample, "sample CHECKPOINT", "ancestral sampling (or completion) of images or rows: images/s"},
    {"decode", cmd_decode, "decode CHECKPOINT",
     "best-path decoding of a CTC model (speech) on rows of a split,\n"
     "against their references, with the phone error rate"},
    {"features", cmd_features, "features DATA_DIR",
     "load a Kaldi data directory (log-mel features, CMVN, phone\n"
     "targets) as the speech task will, and print a summary"},
    {NULL, NULL, NULL, NULL},
};

static const char USAGE_HEAD[] = "usage: attnbench [--threads N] [--allow-commands] COMMAND [ARGS]\n\nCommands:\n";
static const char USAGE_TAIL[] =
    "Run `attnbench COMMAND --help` for a command's arguments.\n"
    "\n"
    "Options:\n"
    "  --threads N          threads for OpenMP loops and OpenBLAS (default: all cores)\n"
    "  --allow-commands     run the commands of data directories (wav.scp lines ending\n"
    "                       in '|'); without it they are refused, also when a checkpoint\n"
    "                       names the directory\n"
    "  --command-timeout S  such a command is killed after S seconds (default 60)\n"
    "  --command-max-mb MB  ... or when it has written more than MB MiB (default 1024)\n"
    "  --help               this text\n"
    "  --version            the version\n"
    "  --blas-core          the core type whose kernels OpenBLAS runs (where OpenBLAS\n"
    "                       falls back to generic kernels on a CPU it does not know,\n"
    "                       attnbench sets OPENBLAS_CORETYPE and starts again)\n"
    "\n"
    "Exit status (every command; README.md, \"Exit status\"): 0 done; 1 a resource or\n"
    "system failure on a valid request (out of memory, on the host or a device; a full\n"
    "disk; an I/O error; device errors; a diverged training run); 2 bad input or usage\n"
    "(options, configs, files, paths, inputs larger than memory; one line\n"
    "'attnbench: error: ...' on stderr, and no file already there is changed);\n"
    "130 interrupted (Ctrl-C, SIGTERM) in train and bench, with what was done written.\n";

/* OpenBLAS chose its kernels when it loaded. Where it fell back to a generic core on a
 * CPU it does not know (ab_blas_better_core, harness/blas.h), the process starts again
 * with OPENBLAS_CORETYPE set, so that every measurement runs the CPU's own kernels; a
 * result's machine section names the core and who set it (openblas_coretype_by). */
static void blas_core_reexec(char **argv) {
    const char *core = ab_blas_better_core();
    if (!core) return;
    if (setenv("OPENBLAS_CORETYPE", core, 1) == 0 && setenv("ATTNBENCH_SET_CORETYPE", core, 1) == 0)
        execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("ATTNBENCH_SET_CORETYPE");
    fprintf(stderr, "attnbench: warning: OpenBLAS runs its generic %s kernels here; OPENBLAS_CORETYPE=%s is faster\n",
            ab_blas_corename(), core);
}

/* The usage text: the commands' lines come from the table (a summary's further lines
 * are indented under its first). */
static void usage(FILE *f) {
    fputs(USAGE_HEAD, f);
    for (const cli_command *c = cli_commands; c->name; c++) {
        fprintf(f, "  %-20s ", c->synopsis);
        for (const char *p = c->summary; *p; p++) {
            fputc(*p, f);
            if (*p == '\n') fprintf(f, "%23s", "");
        }
        fputc('\n', f);
    }
    fputs(USAGE_TAIL, f);
}

/* Runs command `cmd` with its arguments (sub_argv, without the global options); argv is
 * the whole command line, recorded by the commands that write a run document. */
static int run_command(const char *cmd, int argc, char **argv, int sub_argc, char **sub_argv) {
    if (strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    const cli_command *c = cli_commands;
    while (c->name && strcmp(c->name, cmd) != 0) c++;
    if (!c->name) {
        char names[256];
        size_t n = 0;
        for (const cli_command *k = cli_commands; k->name && n < sizeof names; k++)
            n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", k == cli_commands ? "" : ", ", k->name);
        cli_die(AB_EXIT_USAGE, "unknown command '%s' (commands: %s; see attnbench --help)", cmd, names);
    }
    /* The command line, recorded in a run document so it can be rerun. */
    size_t n = 1;
    for (int j = 0; j < argc; j++) n += strlen(argv[j]) + 1;
    char *line = malloc(n);
    if (!line) cli_die(AB_EXIT_FAILURE, "out of memory");
    line[0] = '\0';
    for (int j = 0; j < argc; j++) {
        strcat(line, argv[j]);
        if (j + 1 < argc) strcat(line, " ");
    }
    int rc = c->run(sub_argc, sub_argv, line);
    free(line);
    return rc;
}

/* A signal that ends attnbench ends the commands of data directories it runs too (their
 * own process groups do not get a terminal's Ctrl-C), then attnbench as the signal
 * would have. train and bench replace this for SIGINT and SIGTERM once their data is
 * loaded (they stop cleanly, and no command runs after loading). */
static void on_fatal_signal(int sig) {
    dc_kill_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* The options every command takes (before or after its name): true if argv[*i] is one,
 * its value consumed. */
static bool global_option(int argc, char **argv, int *i, int *threads, dc_policy *pol) {
    if (strcmp(argv[*i], "--threads") == 0) {
        *threads = (int)cli_parse_int("--threads", cli_value(argc, argv, i), 1, 4096);
    } else if (strcmp(argv[*i], "--allow-commands") == 0) {
        pol->allowed = true;
    } else if (strcmp(argv[*i], "--command-timeout") == 0) {
        pol->timeout_s = (double)cli_parse_int("--command-timeout", cli_value(argc, argv, i), 1, 86400 * 7);
    } else if (strcmp(argv[*i], "--command-max-mb") == 0) {
        pol->max_bytes = (size_t)cli_parse_int("--command-max-mb", cli_value(argc, argv, i), 1, 1 << 20) << 20;
    } else {
        return false;
    }
    return true;
}

int main(int argc, char **argv) {
    blas_core_reexec(argv);
    task_list_install();
    int threads = 0, i = 1;
    dc_policy pol;
    dc_policy_default(&pol);
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("attnbench %s\n", ATTNBENCH_VERSION);
            return 0;
        } else if (strcmp(argv[i], "--blas-core") == 0) {
            printf("%s\n", ab_blas_corename());
            return 0;
        } else if (global_option(argc, argv, &i, &threads, &pol)) {
            continue;
        } else {
            cli_die(AB_EXIT_USAGE, "unknown option %s (see attnbench --help)", argv[i]);
        }
    }
    if (i >= argc) {
        usage(stderr);
        return AB_EXIT_USAGE;
    }
    /* The global options may also follow the command name: they are taken out here, so
     * the commands never see them. */
    const char *cmd = argv[i];
    char **sub_argv = malloc(sizeof(char *) * (size_t)argc);
    if (!sub_argv) cli_die(AB_EXIT_FAILURE, "out of memory");
    int sub_argc = 0;
    for (int j = i + 1; j < argc; j++) {
        if (!global_option(argc, argv, &j, &threads, &pol)) sub_argv[sub_argc++] = argv[j];
    }
    sub_argv[sub_argc] = NULL;
    ab_set_threads(threads);
    dc_set_policy(&pol);
    signal(SIGINT, on_fatal_signal);
    signal(SIGTERM, on_fatal_signal);
    signal(SIGHUP, on_fatal_signal);
    atexit(dc_kill_all); /* an exit (cli_die) while another thread waits on a command */
    int rc = run_command(cmd, argc, argv, sub_argc, sub_argv);
    free(sub_argv); /* a leak checker runs the whole test suite through here */
    return rc;
}