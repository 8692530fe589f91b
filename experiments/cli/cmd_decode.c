/* attnbench decode CHECKPOINT: the best paths of a CTC model on rows of a split with
 * the label (phone) error rate over them (driver/decode_run.h runs it; here the options
 * and the document printed). */
#include "commands.h"

#include "cli_args.h"
#include "cli_util.h"
#include "decode_run.h"
#include "error.h"

#include <stdio.h>
#include <string.h>

static const char DECODE_USAGE[] =
    "usage: attnbench decode CHECKPOINT [--split NAME] [--n K] [--batch B] [--out FILE] [--device cpu|cuda]\n"
    "\n"
    "Loads the CTC model of a training checkpoint (the speech task, or the frames task\n"
    "with targets ctc) and its task's data, decodes the first K rows of the split NAME\n"
    "(default: test, else the run's evaluation split; K default 5, 0: every row) by\n"
    "best path, in batches of B (default: the run's batch), in evaluation mode as the\n"
    "run evaluates, and prints a JSON document: for each row its name (the utterance\n"
    "id), the reference and the decoded labels (phones) as text, its errors (the edit\n"
    "distance: substitutions, deletions, insertions) and reference length; and the\n"
    "error rate over those rows (per: summed errors / summed reference lengths; with\n"
    "--n 0, the run's own figure for the split). --out also writes it to FILE.\n";

static bool decode_option(int argc, char **argv, int *i, void *ctx) {
    decode_opts *o = ctx;
    if (strcmp(argv[*i], "--n") == 0) o->n = cli_parse_int("--n", cli_value(argc, argv, i), 0, 1LL << 40);
    else if (strcmp(argv[*i], "--batch") == 0) o->batch = (int)cli_parse_int("--batch", cli_value(argc, argv, i), 1, 1 << 16);
    else if (strcmp(argv[*i], "--split") == 0) o->split = cli_value(argc, argv, i);
    else return false;
    return true;
}

int cmd_decode(int argc, char **argv, const char *command_line) {
    decode_opts o = {.n = 5};
    cli_args a = {.cmd = "decode", .usage = DECODE_USAGE, .positional = "checkpoint", .takes = CLI_DEVICE | CLI_OUT};
    cli_parse(argc, argv, &a, decode_option, &o);
    if (!a.arg) cli_die(AB_EXIT_USAGE, "decode: a CHECKPOINT (e.g. results/NAME/checkpoint.bin) is required");
    o.device = a.device;
    decode_result r;
    int rc = decode_run(a.arg, &o, &r);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    json_t *doc = decode_document(&r, a.arg, a.device, command_line);
    if (a.out) cli_write_json(a.out, doc);
    json_dumpf(doc, stdout, CLI_JSON_FLAGS);
    fputc('\n', stdout);
    json_decref(doc);
    decode_result_free(&r);
    return 0;
}
