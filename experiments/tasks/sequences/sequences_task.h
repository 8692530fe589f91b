/* "sequences": autoregressive modelling of token sequences read from .npy files, a
 * dataset task with splits (task.h) for any data that is a row of tokens (text as
 * bytes, images as pixel values in raster order, ...).
 *
 * Data (folder "path"): SPLIT.npy, int32 or int64 (rows, L), tokens in [0, vocab);
 * optionally SPLIT.lengths.npy (rows), each row's valid length in [1, L] (the rest
 * is padding). Splits: as npy_splits.h ("train" required).
 *
 * A row s_0 .. s_{L-1} is predicted token by token behind a start token (id vocab):
 *     tokens  = START s_0 .. s_{L-2}       (N = L positions; input vocabulary vocab + 1)
 *     targets = s_0 .. s_{L-1}             (classes = vocab)
 * weight 1 on the valid positions, 0 on padding. Metrics: accuracy (next token) and
 * bits_per_token (mean loss / ln 2: bits per dimension for pixel data).
 *
 * Generation: prompt k takes a row of the last split (uniform, from the cursor), a
 * prompt length P - 1 uniform in [0, len - 1], and gives START s_0 .. s_{P-2}; the
 * expected continuation is the rest of the row, s_{P-1} .. s_{len-1}.
 *
 * Options: name, path (required), vocab (default: 1 + the largest token in the data),
 * splits (list of names), rows (checked against the data: written by the canonical
 * config so that a resume on changed data is refused). */
#ifndef AB_SEQUENCES_TASK_H
#define AB_SEQUENCES_TASK_H

#include "task.h"

extern const task_kind sequences_task_kind;

#endif
