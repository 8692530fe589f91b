/* attnbench op: one attention call on tensors given as .npy files, so anyone can
 * cross-check a variant against their own implementation. The call is the driver's
 * (op_run.h); this file parses the command line. */
#include "cli_args.h"
#include "cli_util.h"
#include "commands.h"
#include "error.h"
#include "op_run.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

static const char OP_USAGE[] =
    "usage: attnbench op --variant NAME [--causal] [--set KEY=VALUE]... [--seed S]\n"
    "                    [--device cpu|cuda] [--mode parallel|recurrent]\n"
    "                    --q q.npy --k k.npy --v v.npy [--dout dout.npy] [--lengths lengths.npy]\n"
    "                    [--g g.npy | --beta beta.npy]\n"
    "                    [--max-len L] --out DIR [--threads N]\n"
    "\n"
    "Runs one attention call. q and k are float32 [B, H, N, D], v (and dout) float32\n"
    "[B, H, N, M], lengths int32 or int64 [B] (positions >= lengths[b] are padding).\n"
    "Writes DIR/out.npy; with --dout also DIR/dq.npy, DIR/dk.npy, DIR/dv.npy.\n"
    "--mode recurrent runs the recurrent step over t = 0..N-1 (variants that have one;\n"
    "needs --causal) and writes DIR/out.npy. `attnbench list` shows variants and options.\n"
    "A variant with learned parameters (linformer) gets them drawn from --seed (stream 0)\n"
    "for sequences of up to --max-len L positions (default N; N <= L) and writes them to\n"
    "DIR/params.npy (float32, flat, the variant's layout), with --dout their gradient to\n"
    "DIR/dparams.npy.\n"
    "gla reads its log-gate --g (float32 [B, H, N, D] with gate=vector, [B, H, N] with\n"
    "gate=scalar; values <= 0) and deltanet its rate --beta ([B, H, N], in [0, 1]); with\n"
    "--dout their gradient is written to DIR/dg.npy or DIR/dbeta.npy.\n";

/* op's own options, into the request. */
static bool op_option(int argc, char **argv, int *i, void *ctx) {
    op_request *r = ctx;
    const char *o = argv[*i];
    if (strcmp(o, "--variant") == 0) r->variant = cli_value(argc, argv, i);
    else if (strcmp(o, "--causal") == 0) r->causal = true;
    else if (strcmp(o, "--mode") == 0) {
        const char *m = cli_value(argc, argv, i);
        if (strcmp(m, "parallel") == 0) r->recurrent = false;
        else if (strcmp(m, "recurrent") == 0) r->recurrent = true;
        else cli_die(AB_EXIT_USAGE, "--mode %s: must be parallel or recurrent", m);
    } else if (strcmp(o, "--q") == 0) r->q = cli_value(argc, argv, i);
    else if (strcmp(o, "--k") == 0) r->k = cli_value(argc, argv, i);
    else if (strcmp(o, "--v") == 0) r->v = cli_value(argc, argv, i);
    else if (strcmp(o, "--dout") == 0) r->dout = cli_value(argc, argv, i);
    else if (strcmp(o, "--lengths") == 0) r->lengths = cli_value(argc, argv, i);
    else if (strcmp(o, "--g") == 0 || strcmp(o, "--beta") == 0) {
        r->aux_opt = o + 2;
        r->aux = cli_value(argc, argv, i);
    }
    else if (strcmp(o, "--max-len") == 0) {
        unsigned long long x = cli_parse_u64("--max-len", cli_value(argc, argv, i));
        if (x < 1 || x > INT_MAX) cli_die(AB_EXIT_USAGE, "--max-len %llu: must be 1..%d", x, INT_MAX);
        r->max_len = (int)x;
    } else return false;
    return true;
}

int cmd_op(int argc, char **argv, const char *command_line) {
    (void)command_line;
    op_request r;
    memset(&r, 0, sizeof r);
    cli_args a = {.cmd = "op", .usage = OP_USAGE, .takes = CLI_DEVICE | CLI_SEED | CLI_OUT | CLI_SET};
    cli_parse(argc, argv, &a, op_option, &r);
    r.settings = a.sets;
    r.n_settings = a.n_sets;
    r.seed = a.seed;
    r.device = a.device;
    r.out = a.out;
    if (!r.variant) cli_die(AB_EXIT_USAGE, "op: --variant is required (see attnbench list)");
    if (!r.q || !r.k || !r.v) cli_die(AB_EXIT_USAGE, "op: --q, --k and --v are required");
    if (!r.out) cli_die(AB_EXIT_USAGE, "op: --out DIR is required");
    if (r.recurrent && !r.causal)
        cli_die(AB_EXIT_USAGE, "op: --mode recurrent computes causal attention: add --causal");
    if (r.recurrent && r.dout) cli_die(AB_EXIT_USAGE, "op: --dout (backward) needs --mode parallel");
    if (r.recurrent && r.lengths) cli_die(AB_EXIT_USAGE, "op: --lengths needs --mode parallel");
    int rc = op_run(&r);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    return 0;
}
