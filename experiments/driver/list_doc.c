/* The registry as one JSON document (list_doc.h). */
#include "list_doc.h"

#include "attention.h"
#include "task.h"
#include "transformer.h"

#include <string.h>

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
    const char *aux = attn_variant_aux(i);
    json_object_set_new(v, "input", aux ? json_string(aux) : json_null());
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

json_t *list_doc_json(void) {
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
    return doc;
}
