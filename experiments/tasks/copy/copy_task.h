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
 * Noisy copy (option noise = p > 0; not in the paper): after the row is drawn, each
 * copied symbol in turn is replaced, with probability p, by a symbol drawn uniformly
 * from the S (possibly the same one): one uniform draw per copied symbol, then one
 * symbol draw where it is replaced, from the same cursor after s_1..s_L. The noise is
 * in the data row, so in the tokens and the targets of the copy; the first half, the
 * prompt and the expected continuation stay clean. A copied target is then the symbol
 * to copy with probability 1 - p + p/S and each other symbol with probability p/S,
 * independently of everything the model sees, so no model has an expected loss below
 * the entropy of that distribution (copy_loss_floor) and no teacher-forced accuracy
 * above 1 - p + p/S: the loss has a floor above zero. With p = 0 nothing is drawn and
 * the rows are those of the noiseless task bit for bit.
 *
 * Options (config "task"): name "copy", max_symbols (X, default 128), symbols (S,
 * default 10), min_symbols (default 1), noise (p in [0, 1], default 0; written to
 * results and checkpoints only when it is not 0, so that runs from before the option
 * resume unchanged). */
#ifndef AB_COPY_TASK_H
#define AB_COPY_TASK_H

#include "task.h"

#define COPY_PAD 0
#define COPY_SEP 1
#define COPY_FIRST_SYMBOL 2

extern const task_kind copy_task_kind;

typedef struct {
    int max_symbols, symbols, min_symbols;
    double noise;
} copy_options;

/* The data row d (2X + 1 tokens) and its length L from the cursor. */
int copy_draw(const copy_options *o, ab_rng *rng, int *d);

/* The lowest expected loss (nats) of a copied symbol's prediction with noise p over S
 * symbols: -(q ln q + (S - 1) (p/S) ln(p/S)), q = 1 - p + p/S; 0 when p = 0. */
double copy_loss_floor(double noise, int symbols);

#endif
