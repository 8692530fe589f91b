/* attnbench merge: joins the point documents of a sharded sweep (bench --point I)
 * into the run document of the whole sweep, checked (experiments/driver/sweep_points.h). */
#include "commands.h"

#include "cli_args.h"
#include "cli_util.h"
#include "error.h"
#include "sweep_points.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

static const char MERGE_USAGE[] =
    "usage: attnbench merge DOC.json... --out FILE [--quiet]\n"
    "\n"
    "Joins the documents of a sweep's points (attnbench bench CONFIG --point I) into the\n"
    "run document of the whole sweep, FILE (and a TSV beside it), the schema of an\n"
    "unsharded run's: attnbench plot draws it, experiments/sweep/table.py reads it.\n"
    "Refused (one line, exit status 2, FILE untouched): a file that is not a finished\n"
    "point document (truncated, foreign, still running), another config or machine\n"
    "class (CPU model, threads, BLAS core, GPU) or build than the first document's, a\n"
    "point held twice, and missing points (listed). A point after one of the same\n"
    "variant that ran out of time or memory is recorded as skipped, as a full run does.\n"
    "sgemm and copy: the median point's measurement. Exit status 1 when a point failed\n"
    "(the document is written, status failed). See experiments/sweep/CLUSTER.md.\n";

typedef struct {
    const char **docs;
    int n;
} merge_docs;

static bool merge_own(int argc, char **argv, int *i, void *ctx) {
    (void)argc;
    merge_docs *m = ctx;
    if (argv[*i][0] == '-') return false;
    m->docs[m->n++] = argv[*i];
    return true;
}

int cmd_merge(int argc, char **argv, const char *command_line) {
    cli_args args = {.cmd = "merge", .usage = MERGE_USAGE, .positional = NULL, .takes = CLI_OUT | CLI_QUIET};
    merge_docs m = {calloc((size_t)argc + 1, sizeof(char *)), 0};
    if (!m.docs) cli_die(AB_EXIT_FAILURE, "out of memory");
    cli_parse(argc, argv, &args, merge_own, &m);
    if (m.n == 0) cli_die(AB_EXIT_USAGE, "merge: no point documents given (see attnbench merge --help)");
    if (!args.out) cli_die(AB_EXIT_USAGE, "merge: --out FILE is required");
    sweep_merge_request req = {m.docs, m.n, args.out, command_line};
    bool failed;
    int rc = sweep_merge(&req, &failed);
    free(m.docs);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    if (!args.quiet) fprintf(stderr, "merge: wrote %s (%d documents, status %s)\n", args.out, m.n, failed ? "failed" : "ok");
    return failed ? AB_EXIT_FAILURE : 0;
}
