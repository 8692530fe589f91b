/* "frames": classification of every frame of sequences of float feature vectors,
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
 * Options: name, path (required), classes (default: 1 + the largest label), causal
 * (default false), splits, rows (as sequences_task.h). */
#ifndef AB_FRAMES_TASK_H
#define AB_FRAMES_TASK_H

#include "task.h"

extern const task_kind frames_task_kind;

#endif
