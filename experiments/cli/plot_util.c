/* The figures of `attnbench plot` (plot_util.h): their data files and the gnuplot
 * scripts that draw them. */
#include "plot_util.h"

#include "cli_util.h"
#include "config.h"
#include "error.h"
#include "fileio.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* gnuplot -c SCRIPT ARGS...: the arguments as a NULL-terminated list */
#define TP(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A run's or variant's name as one word of the figure's data: the scripts split their
 * lists of names on blanks, and a tab or newline would split a TSV field or row. So
 * blanks, quotes and control characters become '_' (the legend shows that form). */
static void tsv_word(const char *in, char *out, size_t cap) {
    snprintf(out, cap, "%s", in);
    for (char *c = out; *c; c++)
        if (*c == ' ' || *c == '"' || *c == '\'' || (unsigned char)*c < 0x20 || *c == 0x7f) *c = '_';
    if (!*out) snprintf(out, cap, "_");
}

static void put_num(FILE *f, json_t *v) {
    if (json_is_number(v)) fprintf(f, "%.9g", json_number_value(v));
    else fputs("NaN", f);
}

/* Draws PNG and SVG from DATA with plots/SCRIPT_NAME (each replaced only by a complete new
 * figure), or dies with exit status 1 naming what was not drawn and why; the data file
 * stays. */
static void draw(const char *script_name, const char *data, const char *png, const char *svg, const char *title) {
    char why[600];
    const char *out = png;
    if (cli_draw(script_name, data, png, TP(title), why, sizeof why) ||
        cli_draw(script_name, data, out = svg, TP(title), why, sizeof why))
        cli_die(AB_EXIT_FAILURE, "plot: %s not drawn: %s (its data is in %s)", out, why, data);
    printf("plot: wrote %s and %s\n", png, svg);
}

json_t *plot_load_run(const char *in) {
    json_t *doc = ab_config_load(in);
    if (!doc) cli_die(AB_EXIT_USAGE, "%s", ab_error());
    json_t *schema = json_object_get(doc, "schema"), *recs = json_object_get(doc, "records");
    if (!json_is_string(schema) || strcmp(json_string_value(schema), "attnbench/run/1") != 0 || !json_is_array(recs))
        cli_die(AB_EXIT_USAGE, "%s: not an attnbench run document (schema attnbench/run/1 with records)", in);
    return doc;
}

/* A training run's document: records of kind "train" or "eval". */
bool plot_is_train_doc(json_t *doc) {
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(doc, "records"), i, r) {
        const char *k = json_string_value(json_object_get(r, "kind"));
        if (k && (strcmp(k, "train") == 0 || strcmp(k, "eval") == 0)) return true;
    }
    return false;
}

static void default_prefix(const char *in, const char *prefix, char *pre, size_t cap) {
    if (prefix) snprintf(pre, cap, "%s", prefix);
    else {
        snprintf(pre, cap, "%s", in);
        size_t n = strlen(pre);
        if (n > 5 && strcmp(pre + n - 5, ".json") == 0) pre[n - 5] = '\0';
    }
}

int plot_train(json_t **docs, const char **ins, int n, const char *prefix, const char *title) {
    char pre[4096], script[4096], data[4200], png[4200], svg[4200];
    default_prefix(ins[0], prefix, pre, sizeof pre);
    if (!cli_find_plot_script("figure2.gp", script, sizeof script))
        cli_die(AB_EXIT_USAGE, "plot: cannot find figure2.gp (set ATTNBENCH_PLOTS to the plots/ folder)");
    snprintf(data, sizeof data, "%s.plot.tsv", pre);
    snprintf(png, sizeof png, "%s.png", pre);
    snprintf(svg, sizeof svg, "%s.svg", pre);
    ab_atomic_file af;
    int rc = ab_atomic_open(&af, data);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    fputs("run\tkind\tstep\tloss\n", af.f);
    size_t rows = 0;
    for (int d = 0; d < n; d++) {
        if (!plot_is_train_doc(docs[d])) {
            ab_atomic_abort(&af);
            cli_die(AB_EXIT_USAGE, "%s: not a training run (plot sweeps and training runs separately)", ins[d]);
        }
        json_t *cfg = json_object_get(docs[d], "config");
        const char *label = json_string_value(json_object_get(cfg, "label"));
        if (!label) label = json_string_value(json_object_get(cfg, "name"));
        char lab[128];
        tsv_word(label ? label : ins[d], lab, sizeof lab);
        size_t i;
        json_t *r;
        json_array_foreach(json_object_get(docs[d], "records"), i, r) {
            const char *k = json_string_value(json_object_get(r, "kind"));
            if (!k || (strcmp(k, "train") && strcmp(k, "eval"))) continue;
            fprintf(af.f, "%s\t%s\t", lab, k);
            put_num(af.f, json_object_get(r, "step"));
            fputc('\t', af.f);
            put_num(af.f, json_object_get(r, strcmp(k, "train") == 0 ? "loss" : "eval_loss"));
            fputc('\n', af.f);
            rows++;
        }
    }
    if ((rc = ab_atomic_commit(&af))) cli_die(cli_status_for(rc), "%s", ab_error());
    if (rows == 0) cli_die(AB_EXIT_USAGE, "%s: no training records to plot", ins[0]);
    char deftitle[512];
    if (!title) {
        const char *task = json_string_value(json_object_get(docs[0], "task"));
        snprintf(deftitle, sizeof deftitle, "%s: loss per gradient step", task && strcmp(task, "copy") == 0 ? "Sequence copy" : task ? task : "training");
        title = deftitle;
    }
    draw("figure2.gp", data, png, svg, title);
    return 0;
}

int plot_sweep(json_t *doc, const char *in, const char *prefix, const char *title) {
    json_t *recs = json_object_get(doc, "records");
    char pre[4096];
    default_prefix(in, prefix, pre, sizeof pre);
    char script[4096];
    if (!cli_find_plot_script("figure1.gp", script, sizeof script))
        cli_die(AB_EXIT_USAGE, "plot: cannot find figure1.gp (set ATTNBENCH_PLOTS to the plots/ folder)");

    /* The figure's data: parallel-mode records only. */
    char data[4200], png[4200], svg[4200];
    snprintf(data, sizeof data, "%s.plot.tsv", pre);
    snprintf(png, sizeof png, "%s.png", pre);
    snprintf(svg, sizeof svg, "%s.svg", pre);
    ab_atomic_file af;
    int rc = ab_atomic_open(&af, data);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    fputs("kind\tvariant\tlen\tbatch\tstatus\tper_sample_fwd_bwd_ms\tpeak_bytes_per_sample\n", af.f);
    size_t i, rows = 0;
    json_t *r;
    json_array_foreach(recs, i, r) {
        json_t *kind = json_object_get(r, "kind"), *var = json_object_get(r, "variant"),
               *st = json_object_get(r, "status");
        if (!json_is_string(kind) || strcmp(json_string_value(kind), "parallel") != 0) continue;
        if (!json_is_string(var) || !json_is_string(st)) continue;
        char word[128];
        tsv_word(json_string_value(var), word, sizeof word);
        fprintf(af.f, "parallel\t%s\t", word);
        put_num(af.f, json_object_get(r, "len"));
        fputc('\t', af.f);
        put_num(af.f, json_object_get(r, "batch"));
        tsv_word(json_string_value(st), word, sizeof word);
        fprintf(af.f, "\t%s\t", word);
        put_num(af.f, json_object_get(r, "per_sample_fwd_bwd_ms"));
        fputc('\t', af.f);
        put_num(af.f, json_object_get(r, "peak_bytes_per_sample"));
        fputc('\n', af.f);
        rows++;
    }
    if ((rc = ab_atomic_commit(&af))) cli_die(cli_status_for(rc), "%s", ab_error());
    if (rows == 0) cli_die(AB_EXIT_USAGE, "%s: no parallel-mode records to plot", in);
    char deftitle[512];
    if (!title) {
        json_t *cfg = json_object_get(doc, "config");
        json_t *name = json_object_get(cfg, "name");
        json_t *causal = json_object_get(cfg, "causal");
        snprintf(deftitle, sizeof deftitle, "%s: attention forward+backward per sample (%s, H=%lld, D=%lld, M=%lld)",
                 json_is_string(name) ? json_string_value(name) : "sweep",
                 json_is_true(causal) ? "causal" : "non-causal",
                 (long long)json_integer_value(json_object_get(cfg, "heads")),
                 (long long)json_integer_value(json_object_get(cfg, "qk_dim")),
                 (long long)json_integer_value(json_object_get(cfg, "v_dim")));
        title = deftitle;
    }
    draw("figure1.gp", data, png, svg, title);
    return 0;
}
