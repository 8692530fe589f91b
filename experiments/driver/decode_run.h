/* The best paths of a CTC model (the speech task, or the frames task with targets
 * "ctc") on rows of a split, each against its reference labels, with the label (phone)
 * error rate over those rows: what `attnbench decode` runs, as a library (errors are
 * AB_* codes with one line in ab_error(); nothing here exits).
 *
 * The rows are the split's first K in order, in batches, through the model in
 * evaluation mode with the seed of the run's evaluations (tf_step_seed(seed,
 * TRAIN_EVAL_STEP)), as training evaluates: over the whole split (K 0) the error rate
 * is the run's own for that split. Best path: the first largest output of each
 * position, repeats collapsed, blanks dropped (models/ctc.h). */
#ifndef AB_DECODE_RUN_H
#define AB_DECODE_RUN_H

#include "trainer.h"

#include <jansson.h>

typedef struct {
    const char *split; /* NULL: test, else the run's evaluation split */
    long long n;       /* the first n rows; 0: every row */
    int batch;         /* 0: the run's batch */
    ab_device device;
} decode_opts;

typedef struct {
    train_config cfg;      /* the run's config (decode_result_free) */
    train_ckpt_state meta; /* the checkpoint's step */
    int split;             /* its index in cfg.task */
    long long rows;        /* rows decoded */
    long long errors;      /* summed edit distances */
    long long ref_labels;  /* summed reference lengths */
    long long exact;       /* rows without an error */
    double per;            /* errors / ref_labels (NaN without labels) */
    /* each row: {row, id, positions, ref, hyp (labels as text), errors, ref_len} */
    json_t *utterances;
} decode_result;

/* Loads the checkpoint's CTC model and its task's data and decodes the rows into *r
 * (decode_result_free). AB_EINVAL for a model without a ctc head or an unknown split. */
int decode_run(const char *checkpoint, const decode_opts *opts, decode_result *r);
/* The document of a run, schema "attnbench/decode/1", with the source's git
 * (harness/results.h: ab_git_info) (it takes over r->utterances). */
json_t *decode_document(decode_result *r, const char *checkpoint, ab_device device, const char *command_line);
void decode_result_free(decode_result *r);

#endif
