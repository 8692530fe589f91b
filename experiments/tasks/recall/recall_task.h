/* Multi-query associative recall (MQAR, after the Zoology study of Arora et al. 2023):
 * how much a model can recall from its fixed-size recurrent state.
 *
 * Tokens: 0 padding (unused: every row fills its N positions), 1 filler, the K keys
 * 2 .. K+1, the V values K+2 .. K+V+1; the vocabulary has K + V + 2 tokens.
 *
 * A row of N = `length` positions, drawn from the row's cursor in this order:
 *  1. P = `pairs` distinct keys (a partial Fisher-Yates shuffle of the K keys: draw i
 *     swaps position i with i + below(K - i)), then P values, each uniform over the V;
 *  2. the context: positions 0 .. 2P-1 hold key_1 value_1 .. key_P value_P;
 *  3. Q = `queries` distinct pairs to query (the same shuffle over the P pairs, its
 *     first Q);
 *  4. the query slots in the R = N - 2P positions after the context: Q distinct numbers
 *     from 0 .. R-Q-1 (the same shuffle over R - Q), sorted; slot j (j = 0 .. Q-1, in
 *     that order) starts at 2P + s_j + j and holds the j-th queried key followed by its
 *     value, so slots never overlap and the gaps are random;
 *  5. every other position after the context holds the filler.
 * Targets are the next token (targets[i] = tokens[i+1], the filler after the last), and
 * the loss weight is 1 exactly at the queried keys, whose target is the value stored
 * under the key in the context; 0 elsewhere (the context is random and cannot be
 * predicted). The teacher-forced accuracy on those positions is the recall accuracy;
 * chance is 1/V.
 *
 * Options (config "task"): name "recall", length (N, default 64), pairs (P, default 8),
 * queries (Q, default P; at most P), keys (K, default 64; at least P), values (V,
 * default 64). 2P + 2Q <= N. */
#ifndef AB_RECALL_TASK_H
#define AB_RECALL_TASK_H

#include "task.h"

#define RECALL_PAD 0
#define RECALL_FILL 1
#define RECALL_FIRST_KEY 2

extern const task_kind recall_task_kind;

typedef struct {
    int length, pairs, queries, keys, values;
} recall_options;

/* Scratch ints recall_draw needs for these options. */
size_t recall_scratch_ints(const recall_options *o);

/* Row tokens (N) from the cursor, as described above; query_at (Q ints) receives the
 * positions of the queried keys in increasing order. scratch: recall_scratch_ints. */
void recall_draw(const recall_options *o, ab_rng *rng, int *tokens, int *query_at, int *scratch);

#endif
