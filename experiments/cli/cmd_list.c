/* attnbench list: every variant, its options and their defaults; with --json the whole
 * registry (variants, options, modes, devices, feature maps) as one JSON document, for
 * programs (the cross-check reads its variants and modes from it).
 *
 * Schema "attnbench/list/1":
 *   {"schema": "attnbench/list/1",
 *    "variants": [{"name", "summary",
 *                  "options": [{"name", "type": "double" | "int" | "choice",
 *                               "default" (text, as shown to users), "help",
 *                               "choices": [names] (choice only),
 *                               "min", "max" (double and int only: the allowed range,
 *                                             inclusive; numbers, integers for int),
 *                               "auto": whether "auto" is accepted}],
 *                  "modes": ["parallel"] or ["parallel", "recurrent"],
 *                  "causal": whether it takes causal shapes (false: non-causal only),
 *                  "params": whether it has learned parameters of its own (sized for a
 *                            max_len; `op` draws them from --seed),
 *                  "devices": the devices this build runs it on, "cpu" first}],
 *    "feature_maps": [{"name", "features" (feature count for input size D, a formula),
 *                      "help", "choice_of": [{"variant", "option"}: the choice options
 *                                            that offer it]}],
 *    "tasks": [{"name", "summary", "keys": [the keys of its config object]}],
 *    "bodies": [the model bodies: "transformer", ...],
 *    "heads": [the model heads (set by the task): "categorical", ...]}
 * Variants, options, choices, feature maps and tasks appear in registry order. */
#include "attention.h"
#include "cli_util.h"
#include "commands.h"
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
    "\"attnbench/list/1\").";

static json_t *string_or_null(const char *s) { return s ? json_string(s) : json_null(); }

static json_t *option_json(int i, int j) {
    attn_option_info o;
    attn_variant_option_info(i, j, &o);
    static const char *const types[] = {[ATTN_OPT_DOUBLE] = "double", [ATTN_OPT_INT] = "int",
                                        [ATTN_OPT_CHOICE] = "choice"};
    json_t *r = json_object();
    json_object_set_new(r, "name", json_string(o.name));
    json_object_set_new(r, "type", json_string(types[o.type]));
    json_object_set_new(r, "default", string_or_null(o.def));
    json_object_set_new(r, "help", string_or_null(o.help));
    if (o.type == ATTN_OPT_CHOICE) {
        json_t *c = json_array();
        for (int k = 0; k < o.n_choices; k++) json_array_append_new(c, json_string(attn_variant_option_choice(i, j, k)));
        json_object_set_new(r, "choices", c);
    } else if (o.type == ATTN_OPT_INT) {
        json_object_set_new(r, "min", json_integer((json_int_t)o.min));
        json_object_set_new(r, "max", json_integer((json_int_t)o.max));
    } else {
        json_object_set_new(r, "min", json_real(o.min));
        json_object_set_new(r, "max", json_real(o.max));
    }
    json_object_set_new(r, "auto", json_boolean(o.auto_ok));
    return r;
}

static json_t *variant_json(int i) {
    json_t *v = json_object();
    json_object_set_new(v, "name", json_string(attn_variant_name(i)));
    json_object_set_new(v, "summary", json_string(attn_variant_summary(i)));
    json_t *opts = json_array();
    for (int j = 0; attn_variant_option(i, j, NULL, NULL, NULL); j++) json_array_append_new(opts, option_json(i, j));
    json_object_set_new(v, "options", opts);
    json_t *modes = json_array();
    json_array_append_new(modes, json_string("parallel"));
    if (attn_variant_has_step(i)) json_array_append_new(modes, json_string("recurrent"));
    json_object_set_new(v, "modes", modes);
    json_object_set_new(v, "causal", json_boolean(attn_variant_has_causal(i)));
    json_object_set_new(v, "params", json_boolean(attn_variant_has_params(i)));
    json_t *devs = json_array();
    json_array_append_new(devs, json_string("cpu"));
    if (attn_variant_has_device(i, AB_DEV_CUDA)) json_array_append_new(devs, json_string("cuda"));
    json_object_set_new(v, "devices", devs);
    return v;
}

/* The choice options (of any variant) that offer a value called `name`. */
static json_t *choice_of_json(const char *name) {
    json_t *a = json_array();
    for (int i = 0; i < attn_variant_count(); i++) {
        attn_option_info o;
        for (int j = 0; attn_variant_option_info(i, j, &o); j++)
            for (int k = 0; o.type == ATTN_OPT_CHOICE && k < o.n_choices; k++)
                if (strcmp(attn_variant_option_choice(i, j, k), name) == 0) {
                    json_t *e = json_object();
                    json_object_set_new(e, "variant", json_string(attn_variant_name(i)));
                    json_object_set_new(e, "option", json_string(o.name));
                    json_array_append_new(a, e);
                }
    }
    return a;
}

static void print_json(void) {
    json_t *doc = json_object();
    json_object_set_new(doc, "schema", json_string("attnbench/list/1"));
    json_t *vars = json_array();
    for (int i = 0; i < attn_variant_count(); i++) json_array_append_new(vars, variant_json(i));
    json_object_set_new(doc, "variants", vars);
    json_t *maps = json_array();
    const char *name, *features, *help;
    for (int i = 0; attn_feature_map_info(i, &name, &features, &help); i++) {
        json_t *m = json_object();
        json_object_set_new(m, "name", json_string(name));
        json_object_set_new(m, "features", json_string(features));
        json_object_set_new(m, "help", json_string(help));
        json_object_set_new(m, "choice_of", choice_of_json(name));
        json_array_append_new(maps, m);
    }
    json_object_set_new(doc, "feature_maps", maps);
    json_t *tasks = json_array();
    for (int i = 0; task_kind_at(i); i++) {
        const task_kind *k = task_kind_at(i);
        json_t *t = json_object(), *keys = json_array();
        json_object_set_new(t, "name", json_string(k->name));
        json_object_set_new(t, "summary", json_string(k->summary));
        for (int j = 0; k->keys[j]; j++) json_array_append_new(keys, json_string(k->keys[j]));
        json_object_set_new(t, "keys", keys);
        json_array_append_new(tasks, t);
    }
    json_object_set_new(doc, "tasks", tasks);
    json_t *bodies = json_array();
    for (int b = 0; b < TF_BODY_COUNT; b++) json_array_append_new(bodies, json_string(tf_body_name((tf_body)b)));
    json_object_set_new(doc, "bodies", bodies);
    json_t *heads = json_array();
    for (int h = 0; h < TF_HEAD_COUNT; h++) json_array_append_new(heads, json_string(tf_head_name((tf_head)h)));
    json_object_set_new(doc, "heads", heads);
    /* 17 digits: the ranges' doubles read back exactly. */
    if (json_dumpf(doc, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) != 0 ||
        putchar('\n') == EOF || fflush(stdout) != 0)
        cli_die(AB_EXIT_FAILURE, "list --json: cannot write to standard output");
    json_decref(doc);
}

int cmd_list(int argc, char **argv, const char *command_line) {
    (void)command_line;
    bool json = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            puts(LIST_USAGE);
            return 0;
        }
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
            continue;
        }
        cli_die(AB_EXIT_USAGE, "list takes no argument '%s'", argv[i]);
    }
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
