/* The sequence-copy task of the paper's Figure 2.
 *
 * Tokens: 0 padding, 1 separator, 2 .. S+1 the S symbols (S = "symbols", 10 in the
 * paper), so the vocabulary has S + 2 tokens.
 *
 * A row, for max_symbols = X: L ~ uniform{min_symbols .. X} symbols s_1..s_L, each
 * uniform over the S symbols (drawn from the row's cursor in that order: L, then
 * s_1..s_L), then the separator, then the same L symbols, then padding up to the
 * fixed length 2X + 1:
 *
 *     d = s_1 .. s_L  SEP  s_1 .. s_L  PAD ..           (2X + 1 tokens)
 *
 * The model sees N = 2X positions: tokens[i] = d[i] for i < 2L (the last copied
 * symbol is only a target) and padding after, targets[i] = d[i+1] (next-token
 * prediction), valid length 2L (the padding is masked out of the attention).
 * The loss weight is 1 on the predictions of the copied symbols, positions
 * i = L .. 2L-1 (the separator predicts s_1, ..., the copy of s_{L-1} predicts s_L),
 * and 0 elsewhere: the first half is random and cannot be predicted. The teacher-
 * forced accuracy on those positions is the copy accuracy.
 *
 * Generation: the prompt is s_1..s_L SEP (L + 1 tokens) and the expected
 * continuation s_1..s_L.
 *
 * Options (config "task"): name "copy", max_symbols (X, default 128), symbols (S,
 * default 10), min_symbols (default 1). */
#ifndef AB_COPY_TASK_H
#define AB_COPY_TASK_H

#include "task.h"

#define COPY_PAD 0
#define COPY_SEP 1
#define COPY_FIRST_SYMBOL 2

extern const task_kind copy_task_kind;

typedef struct {
    int max_symbols, symbols, min_symbols;
} copy_options;

/* The data row d (2X + 1 tokens) and its length L from the cursor. */
int copy_draw(const copy_options *o, ab_rng *rng, int *d);

#endif
