/* attnbench plot RESULT.json: draws a sweep's Figure 1 (PNG and SVG) with gnuplot. */
#include "cli_util.h"
#include "commands.h"
#include "config.h"
#include "error.h"
#include "fileio.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char PLOT_USAGE[] =
    "usage: attnbench plot RESULT.json [--out PREFIX] [--title TEXT]\n"
    "\n"
    "Draws the two panels of Figure 1 (time and peak memory per sample against N,\n"
    "log-log, one line per variant) from a result of `attnbench bench`, with\n"
    "plots/figure1.gp. Writes PREFIX.png and PREFIX.svg (default PREFIX: RESULT\n"
    "without .json) and PREFIX.plot.tsv, the data the figure was drawn from.\n";

/* Where plots/figure1.gp is: $ATTNBENCH_PLOTS, the source tree, or the installed copy. */
static const char *find_script(char *buf, size_t cap) {
    const char *env = getenv("ATTNBENCH_PLOTS");
    const char *dirs[3] = {env, ATTNBENCH_SOURCE_DIR "/plots", ATTNBENCH_DATADIR "/plots"};
    struct stat st;
    for (int i = 0; i < 3; i++) {
        if (!dirs[i]) continue;
        snprintf(buf, cap, "%s/figure1.gp", dirs[i]);
        if (stat(buf, &st) == 0) return buf;
    }
    return NULL;
}

static int run_gnuplot(const char *script, const char *data, const char *out, const char *title) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execlp("gnuplot", "gnuplot", "-c", script, data, out, title, (char *)NULL);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void put_num(FILE *f, json_t *v) {
    if (json_is_number(v)) fprintf(f, "%.9g", json_number_value(v));
    else fputs("NaN", f);
}

int cmd_plot(int argc, char **argv) {
    const char *in = NULL, *prefix = NULL, *title = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            fputs(PLOT_USAGE, stdout);
            return 0;
        } else if (strcmp(argv[i], "--out") == 0) prefix = cli_value(argc, argv, &i);
        else if (strcmp(argv[i], "--title") == 0) title = cli_value(argc, argv, &i);
        else if (argv[i][0] == '-') cli_die(AB_EXIT_USAGE, "plot: unknown argument '%s'", argv[i]);
        else if (!in) in = argv[i];
        else cli_die(AB_EXIT_USAGE, "plot: more than one result given");
    }
    if (!in) cli_die(AB_EXIT_USAGE, "plot: a RESULT.json from `attnbench bench` is required");
    json_t *doc = ab_config_load(in);
    if (!doc) cli_die(AB_EXIT_USAGE, "%s", ab_error());
    json_t *schema = json_object_get(doc, "schema"), *recs = json_object_get(doc, "records");
    if (!json_is_string(schema) || strcmp(json_string_value(schema), "attnbench/run/1") != 0 || !json_is_array(recs))
        cli_die(AB_EXIT_USAGE, "%s: not an attnbench run document (schema attnbench/run/1 with records)", in);

    char pre[4096];
    if (prefix) snprintf(pre, sizeof pre, "%s", prefix);
    else {
        snprintf(pre, sizeof pre, "%s", in);
        size_t n = strlen(pre);
        if (n > 5 && strcmp(pre + n - 5, ".json") == 0) pre[n - 5] = '\0';
    }
    char script[4096];
    if (!find_script(script, sizeof script))
        cli_die(AB_EXIT_USAGE, "plot: cannot find figure1.gp (set ATTNBENCH_PLOTS to the plots/ folder)");

    /* The figure's data: parallel-mode records only. */
    char data[4200], png[4200], svg[4200];
    snprintf(data, sizeof data, "%s.plot.tsv", pre);
    snprintf(png, sizeof png, "%s.png", pre);
    snprintf(svg, sizeof svg, "%s.svg", pre);
    ab_atomic_file af;
    if (ab_atomic_open(&af, data)) cli_die(AB_EXIT_USAGE, "%s", ab_error());
    fputs("kind\tvariant\tlen\tbatch\tstatus\tper_sample_fwd_bwd_ms\tpeak_bytes_per_sample\n", af.f);
    size_t i, rows = 0;
    json_t *r;
    json_array_foreach(recs, i, r) {
        json_t *kind = json_object_get(r, "kind"), *var = json_object_get(r, "variant"),
               *st = json_object_get(r, "status");
        if (!json_is_string(kind) || strcmp(json_string_value(kind), "parallel") != 0) continue;
        if (!json_is_string(var) || !json_is_string(st)) continue;
        fprintf(af.f, "parallel\t%s\t", json_string_value(var));
        put_num(af.f, json_object_get(r, "len"));
        fputc('\t', af.f);
        put_num(af.f, json_object_get(r, "batch"));
        fprintf(af.f, "\t%s\t", json_string_value(st));
        put_num(af.f, json_object_get(r, "per_sample_fwd_bwd_ms"));
        fputc('\t', af.f);
        put_num(af.f, json_object_get(r, "peak_bytes_per_sample"));
        fputc('\n', af.f);
        rows++;
    }
    if (ab_atomic_commit(&af)) cli_die(AB_EXIT_USAGE, "%s", ab_error());
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
    if (run_gnuplot(script, data, png, title) != 0 || run_gnuplot(script, data, svg, title) != 0)
        cli_die(AB_EXIT_FAILURE, "plot: gnuplot failed (is gnuplot installed? harness/scripts/setup.sh installs it)");
    printf("plot: wrote %s and %s\n", png, svg);
    json_decref(doc);
    return 0;
}
