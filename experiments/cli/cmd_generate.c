/* attnbench generate CHECKPOINT: autoregressive generation from a training checkpoint,
 * scored against the task's expected continuation, with the decoding speed
 * (driver/gen_run.h runs it; here the options and the document printed). */
#include "commands.h"

#include "cli_args.h"
#include "cli_util.h"
#include "error.h"
#include "gen_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char GEN_USAGE[] =
    "usage: attnbench generate CHECKPOINT [--n K] [--seed S] [--mode auto|recurrent|recompute]\n"
    "                          [--temperature T] [--out FILE] [--tokens] [--device cpu|cuda]\n"
    "\n"
    "Loads the model of a training checkpoint, draws K prompts (default 64) from the\n"
    "task's distribution (seed S, default the run's seed; the prompts differ from the\n"
    "training and evaluation rows), decodes each (greedily, or with --temperature T > 0\n"
    "by sampling from softmax(logits / T), the draws a pure function of S, the prompt\n"
    "and the position) and scores the tokens against\n"
    "the expected continuation. Modes: recurrent (linear, polynomial, stateful-softmax:\n"
    "parallel prefill of the prompt, then one RNN step per token), recompute (any\n"
    "variant: a full forward per token; softmax and lsh have only this), auto (the\n"
    "default: recurrent where the variant has it). Prints a JSON document: mode,\n"
    "accuracy (fraction of generated tokens right: for the copy task, the copy\n"
    "accuracy), exact_rate (prompts copied without a mistake), tokens generated, wall\n"
    "time, tokens/s; --tokens adds the generated tokens; --out also writes it to FILE.\n";

static bool gen_option(int argc, char **argv, int *i, void *ctx) {
    gen_opts *o = ctx;
    if (strcmp(argv[*i], "--n") == 0) o->n = cli_parse_int("--n", cli_value(argc, argv, i), 1, 1 << 24);
    else if (strcmp(argv[*i], "--mode") == 0) {
        const char *v = cli_value(argc, argv, i);
        if (!sample_mode_parse(v, &o->mode)) cli_die(AB_EXIT_USAGE, "--mode %s: must be auto, recurrent or recompute", v);
    } else if (strcmp(argv[*i], "--temperature") == 0) {
        const char *v = cli_value(argc, argv, i);
        char *end;
        o->temperature = strtod(v, &end);
        if (!*v || *end || !(o->temperature >= 0) || o->temperature > 1e6)
            cli_die(AB_EXIT_USAGE, "--temperature %s: must be a number in [0, 1e6] (0: greedy)", v);
    } else if (strcmp(argv[*i], "--tokens") == 0) o->keep_tokens = true;
    else return false;
    return true;
}

int cmd_generate(int argc, char **argv, const char *command_line) {
    gen_opts o = {.n = 64, .mode = SAMPLE_MODE_AUTO};
    cli_args a = {.cmd = "generate", .usage = GEN_USAGE, .positional = "checkpoint",
                  .takes = CLI_DEVICE | CLI_SEED | CLI_OUT};
    cli_parse(argc, argv, &a, gen_option, &o);
    if (!a.arg) cli_die(AB_EXIT_USAGE, "generate: a CHECKPOINT (e.g. results/NAME/checkpoint.bin) is required");
    o.seed = a.seed, o.have_seed = a.have_seed, o.device = a.device;
    gen_result r;
    int rc = gen_run(a.arg, &o, &r);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    json_t *doc = gen_document(&r, &o, a.arg, command_line);
    if (a.out) cli_write_json(a.out, doc);
    json_dumpf(doc, stdout, CLI_JSON_FLAGS);
    fputc('\n', stdout);
    json_decref(doc);
    gen_result_free(&r);
    return 0;
}
