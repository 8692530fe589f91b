/* "frames": classification of every frame of sequences of float feature vectors (or
 * recognition of a label sequence per row, targets "ctc"),
 * read from .npy files: a dataset task with splits (task.h) whose input is frames
 * (TASK_INPUT_FRAMES), e.g. speech features with per-frame labels. Non-causal by
 * default (the whole sequence is seen at once).
 *
 * Data (folder "path"): SPLIT.frames.npy, float32 (rows, N, F); SPLIT.labels.npy,
 * int32 or int64 (rows, N), each frame's class in [0, classes) or -1 for a frame that
 * is not scored; optionally SPLIT.lengths.npy (rows), each row's valid frames in
 * [1, N] (the rest is padding: masked, not scored). Splits: as npy_splits.h.
 *
 * Targets are the labels, weight 1 on valid labelled frames. Metric: accuracy (the
 * fraction of scored frames classified right). No generation.
 *
 * With targets "ctc" the task is a sequence recogniser (the model's ctc head,
 * models/ctc.h): SPLIT.labels.npy is int32 or int64 (rows, S), each row's LABEL
 * SEQUENCE in [0, classes) padded at its end with -1 (its labels are its entries
 * before the first -1; only -1 may follow), aligned to the row's frames by CTC. A row
 * needs at least as many frames as labels plus adjacent repeats (ctc_min_frames):
 * checked when the data loads, one line naming the file and row otherwise. The model's
 * label slots (max_labels) are the most labels a row of the data has. Metric: per
 * (the label error rate: the summed edit distances between each row's best path and
 * its labels over the summed label counts of the split).
 *
 * Options: name, path (required), classes (default: 1 + the largest label), causal
 * (default false), targets ("frames", the default, or "ctc"), splits, rows (as
 * sequences_task.h). */
#ifndef AB_FRAMES_TASK_H
#define AB_FRAMES_TASK_H

#include "task.h"

extern const task_kind frames_task_kind;

#endif
