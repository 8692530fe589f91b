/* attnbench decode CHECKPOINT: the best paths of a CTC model (the speech task, or the
 * frames task with targets "ctc") on rows of a split, each against its reference
 * labels, with the label (phone) error rate over those rows.
 *
 * The rows are the split's first K in order, in batches, through the model in
 * evaluation mode with the seed of the run's evaluations (tf_step_seed(seed,
 * TRAIN_EVAL_STEP)), as `attnbench train` evaluates: over the whole split (--n 0) the
 * error rate is the run's own for that split. Best path: the first largest output of
 * each position, repeats collapsed, blanks dropped (models/ctc.h). */
#include "commands.h"

#include "blas.h"
#include "cli_util.h"
#include "ctc.h"
#include "cuda_device.h"
#include "error.h"
#include "fileio.h"
#include "memory.h"
#include "results.h"
#include "trainer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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

/* Labels as text: the task's names, or numbers, separated by spaces. */
static json_t *labels_text(const train_task *t, const int *x, int n) {
    size_t cap = 64, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = '\0';
    for (int i = 0; i < n; i++) {
        char num[32];
        const char *w = t->label_name ? t->label_name(t, x[i]) : (snprintf(num, sizeof num, "%d", x[i]), num);
        size_t k = strlen(w);
        if (len + k + 2 > cap) {
            while (len + k + 2 > cap) cap *= 2;
            char *p = realloc(s, cap);
            if (!p) {
                free(s);
                return NULL;
            }
            s = p;
        }
        if (i) s[len++] = ' ';
        memcpy(s + len, w, k + 1);
        len += k;
    }
    json_t *j = json_string(s);
    free(s);
    return j;
}

int cmd_decode(int argc, char **argv, const char *command_line) {
    const char *ckpt = NULL, *out = NULL, *split_name = NULL;
    long long K = 5, batch = 0;
    ab_device device = AB_DEV_CPU;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            fputs(DECODE_USAGE, stdout);
            return 0;
        } else if (strcmp(argv[i], "--n") == 0) K = cli_parse_int("--n", cli_value(argc, argv, &i), 0, 1LL << 40);
        else if (strcmp(argv[i], "--batch") == 0) batch = cli_parse_int("--batch", cli_value(argc, argv, &i), 1, 1 << 16);
        else if (strcmp(argv[i], "--split") == 0) split_name = cli_value(argc, argv, &i);
        else if (strcmp(argv[i], "--out") == 0) out = cli_path_value(argc, argv, &i);
        else if (strcmp(argv[i], "--device") == 0) {
            device = cli_device_value(argc, argv, &i);
        } else if (argv[i][0] == '-') cli_die(AB_EXIT_USAGE, "decode: unknown argument '%s' (see attnbench decode --help)", argv[i]);
        else if (!ckpt) ckpt = argv[i];
        else cli_die(AB_EXIT_USAGE, "decode: more than one checkpoint given ('%s' and '%s')", ckpt, argv[i]);
    }
    if (!ckpt) cli_die(AB_EXIT_USAGE, "decode: a CHECKPOINT (e.g. results/NAME/checkpoint.bin) is required");
    if (device == AB_DEV_CUDA && ab_cuda_init()) cli_die(AB_EXIT_USAGE, "%s", ab_error());

    /* the run's batch unless given: the config first, for its batch and its task */
    ab_ckpt_reader *r;
    json_t *config;
    int rc = train_ckpt_open(ckpt, &r, &config);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    ab_ckpt_close(r);
    if (!batch) {
        json_t *b = json_object_get(config, "batch");
        batch = json_is_integer(b) && json_integer_value(b) >= 1 && json_integer_value(b) <= (1 << 16)
                    ? json_integer_value(b)
                    : 1;
    }
    json_decref(config);
    train_config cfg;
    tf_model *m;
    train_ckpt_state meta;
    if ((rc = train_ckpt_load_model(ckpt, (int)batch, device, NULL, &cfg, &m, &meta)))
        cli_die(cli_status_for(rc), "%s", ab_error());
    const train_task *task = cfg.task;
    if (tf_get_config(m)->head != TF_HEAD_CTC || !task->fill_labels || !task_is_dataset(task))
        cli_die(AB_EXIT_USAGE, "decode: the model of %s has no ctc head (task '%s'): nothing to decode", ckpt,
                task->name);
    int split;
    if (split_name) {
        if ((split = task_split_find(task, split_name)) < 0) {
            char names[256];
            task_split_names(task, names, sizeof names);
            cli_die(AB_EXIT_USAGE, "decode --split %s: the task has no such split (%s)", split_name, names);
        }
    } else {
        split = task_split_find(task, "test");
        if (split < 0) split = cfg.eval_split;
    }
    const long long rows = K == 0 || K > task->split_rows[split] ? task->split_rows[split] : K;

    task_batch b;
    if ((rc = task_batch_alloc(task, (int)batch, &b))) cli_die(cli_status_for(rc), "%s", ab_error());
    const int C = tf_classes(m), N = task->seq_len, S = task->max_labels;
    float *logits = ab_alloc(sizeof(float) * (size_t)batch * (size_t)N * (size_t)C);
    int *hyp = malloc(sizeof(int) * (size_t)N), *work = malloc(sizeof(int) * ((size_t)N + (size_t)S + 1));
    long long *idx = malloc(sizeof(long long) * (size_t)batch);
    if (!logits || !hyp || !work || !idx) cli_die(AB_EXIT_FAILURE, "out of memory");
    const uint64_t seed = tf_step_seed(cfg.seed, TRAIN_EVAL_STEP);
    json_t *utts = json_array();
    long long errors = 0, ref_total = 0, exact = 0;
    for (long long r0 = 0; r0 < rows; r0 += batch) {
        const int n = (int)(rows - r0 < batch ? rows - r0 : batch);
        for (int i = 0; i < n; i++) idx[i] = r0 + i;
        task_batch_fill_rows(task, split, idx, n, &b);
        rc = b.frames ? tf_forward_frames(m, b.frames, n, b.N, b.lengths, false, seed)
                      : tf_forward(m, b.tokens, n, b.N, b.lengths, false, seed);
        if (!rc) rc = tf_logits_download(m, logits);
        if (rc) cli_die(cli_status_for(rc), "decode: rows %lld..%lld: %s", r0, r0 + n - 1, ab_error());
        for (int i = 0; i < n; i++) {
            const float *x = logits + (size_t)i * (size_t)b.N * (size_t)C;
            const int *ref = b.labels + (size_t)i * (size_t)b.S, nr = b.label_counts[i];
            const int nh = ctc_best_path(x, b.lengths[i], C, hyp);
            const int e = ctc_edit_distance(hyp, nh, ref, nr, work);
            errors += e;
            ref_total += nr;
            exact += e == 0;
            json_t *u = json_object();
            char num[32];
            snprintf(num, sizeof num, "%lld", r0 + i);
            json_object_set_new(u, "row", json_integer(r0 + i));
            json_object_set_new(u, "id", json_string(task->row_name ? task->row_name(task, split, r0 + i) : num));
            json_object_set_new(u, "positions", json_integer(b.lengths[i]));
            json_object_set_new(u, "ref", labels_text(task, ref, nr));
            json_object_set_new(u, "hyp", labels_text(task, hyp, nh));
            json_object_set_new(u, "errors", json_integer(e));
            json_object_set_new(u, "ref_len", json_integer(nr));
            json_array_append_new(utts, u);
        }
    }
    json_t *doc = json_object();
    json_object_set_new(doc, "schema", json_string("attnbench/decode/1"));
    json_object_set_new(doc, "command", json_string(command_line));
    json_object_set_new(doc, "checkpoint", json_string(ckpt));
    json_object_set_new(doc, "run", json_string(cfg.name));
    json_object_set_new(doc, "label", json_string(cfg.label));
    json_object_set_new(doc, "step", json_integer((json_int_t)meta.step));
    json_object_set_new(doc, "task", json_string(task->name));
    json_object_set_new(doc, "body", json_string(tf_body_name(cfg.model.body)));
    if (cfg.model.body == TF_BODY_TRANSFORMER) json_object_set_new(doc, "variant", json_string(cfg.model.attention));
    json_object_set_new(doc, "split", json_string(task->split_names[split]));
    json_object_set_new(doc, "rows", json_integer(rows));
    json_object_set_new(doc, "split_rows", json_integer(task->split_rows[split]));
    json_object_set_new(doc, "decoding", json_string("best path"));
    json_object_set_new(doc, "errors", json_integer(errors));
    json_object_set_new(doc, "ref_labels", json_integer(ref_total));
    json_object_set_new(doc, "per", ab_json_num(ref_total ? (double)errors / (double)ref_total : NAN));
    json_object_set_new(doc, "exact_rows", json_integer(exact));
    json_object_set_new(doc, "device", json_string(ab_device_name(device)));
    json_object_set_new(doc, "threads", json_integer(ab_threads()));
    json_object_set_new(doc, "utterances", utts);
    if (out) cli_write_json(out, doc);
    json_dumpf(doc, stdout, CLI_JSON_FLAGS);
    fputc('\n', stdout);
    json_decref(doc);
    task_batch_free(&b);
    ab_free(logits);
    free(hyp);
    free(work);
    free(idx);
    tf_destroy(m);
    train_config_free(&cfg);
    return 0;
}
