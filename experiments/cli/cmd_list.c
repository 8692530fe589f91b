/* attnbench list: every variant, its options and their defaults; with --json the whole
 * registry (variants, options, modes, devices, feature maps) as one JSON document, for
 * programs (the document and its schema: experiments/driver/list_doc.h). */
#include "attention.h"
#include "cli_args.h"
#include "cli_util.h"
#include "commands.h"
#include "list_doc.h"
#include "task.h"
#include "transformer.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static const char LIST_USAGE[] =
    "usage: attnbench list [--json]\n"
    "Prints every attention variant with its options, defaults, modes and the devices\n"
    "this build runs it on, then the tasks, model bodies and heads of `attnbench train`.\n"
    "--json: the same and the feature maps as one JSON document (schema\n"
    "\"attnbench/list/1\").\n";

/* list's one option, --json; anything else is refused in list's words. */
static bool list_option(int argc, char **argv, int *i, void *ctx) {
    (void)argc;
    if (strcmp(argv[*i], "--json") != 0) cli_die(AB_EXIT_USAGE, "list takes no argument '%s'", argv[*i]);
    *(bool *)ctx = true;
    return true;
}

static void print_json(void) {
    json_t *doc = list_doc_json();
    /* 17 digits: the ranges' doubles read back exactly. */
    if (json_dumpf(doc, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) != 0 ||
        putchar('\n') == EOF || fflush(stdout) != 0)
        cli_die(AB_EXIT_FAILURE, "list --json: cannot write to standard output");
    json_decref(doc);
}

int cmd_list(int argc, char **argv, const char *command_line) {
    (void)command_line;
    bool json = false;
    cli_args a = {.cmd = "list", .usage = LIST_USAGE};
    cli_parse(argc, argv, &a, list_option, &json);
    if (json) {
        print_json();
        return 0;
    }
    for (int i = 0; i < attn_variant_count(); i++) {
        printf("%s\n    %s\n    modes: parallel (forward, backward)%s%s\n    devices: cpu%s\n", attn_variant_name(i),
               attn_variant_summary(i), attn_variant_has_step(i) ? ", recurrent (step, prefill)" : "",
               attn_variant_has_causal(i) ? "" : "; non-causal only",
               attn_variant_has_device(i, AB_DEV_CUDA) ? ", cuda" : "");
        if (attn_variant_has_params(i))
            printf("    learned parameters: sized for a max_len (the model's; op: --max-len, default N); a "
                   "shorter sequence uses their first columns\n");
        if (attn_variant_aux(i))
            printf("    reads one more input, %s (op: --%s FILE.npy; models compute it from the layer input)\n",
                   attn_variant_aux(i), attn_variant_aux(i));
        const char *name, *def, *help;
        for (int j = 0; attn_variant_option(i, j, &name, &def, &help); j++)
            printf("    --set %s=VALUE   default %s: %s\n", name, def, help);
        if (i + 1 < attn_variant_count()) putchar('\n');
    }
    printf("\ntasks (attnbench train, config key task.name):\n");
    for (int i = 0; task_kind_at(i); i++) {
        const task_kind *k = task_kind_at(i);
        printf("    %s: %s\n        keys:", k->name, k->summary);
        for (int j = 0; k->keys[j]; j++) printf(" %s", k->keys[j]);
        putchar('\n');
    }
    printf("\nmodel bodies (model.body): %s\n", tf_body_names());
    printf("model heads (set by the task): %s\n", tf_head_names());
    printf("    categorical: a softmax over classes per position (cross-entropy)\n"
           "    logistic_mixture: a discretised logistic mixture of one 8-bit value per position\n"
           "    ctc: classes + the blank per position, the CTC loss of a label sequence per row\n");
    return 0;
}
