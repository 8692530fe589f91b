/* The figures of `attnbench plot`, for the command only: a run document read and
 * checked, and Figure 1 (a sweep) or Figure 2 (training runs) drawn from it with
 * gnuplot, its data written first as PREFIX.plot.tsv. Every error ends the process
 * with one line (cli_die): exit status 2 for the input, 1 for a figure not drawn. */
#ifndef AB_PLOT_UTIL_H
#define AB_PLOT_UTIL_H

#include <jansson.h>
#include <stdbool.h>

/* The run document at `in` (schema attnbench/run/1 with records). */
json_t *plot_load_run(const char *in);
/* Whether doc is a training run's: records of kind "train" or "eval". */
bool plot_is_train_doc(json_t *doc);
/* Figure 2 from n training runs (docs read from ins); PREFIX NULL: the first input's
 * name without .json; title NULL: from the task. Returns 0. */
int plot_train(json_t **docs, const char **ins, int n, const char *prefix, const char *title);
/* Figure 1 from a sweep's document doc (read from in), the same defaults. Returns 0. */
int plot_sweep(json_t *doc, const char *in, const char *prefix, const char *title);

#endif
