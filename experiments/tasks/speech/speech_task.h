/* "speech": phone recognition with CTC from Kaldi data directories (the paper's third
 * experiment, Table 3), a dataset task with splits (experiments/driver/task.h).
 *
 * Data: the splits "train" (required), "valid" and "test" (each optional), each a
 * Kaldi data directory loaded by speech_data.h (40 log-mel filterbanks from wav.scp,
 * or features from feats.scp; CMVN; the phones of `text`, or its words through a
 * lexicon). Either `path`, a folder whose subfolders train/, valid/, test/ are the
 * directories (those present; experiments/speech/get-data.sh makes such a folder), or
 * `dirs`, an object naming each split's directory (WSJ as Kaldi prepares it:
 * {"train": "data/train_si284", "valid": "data/test_dev93", "test":
 * "data/test_eval92"}). The phone inventory is the training split's (valid and test
 * are loaded with its ids; a phone they have and it lacks is refused); with `path`
 * and no `features.phones`, PATH/phones.txt is the inventory when it exists. Every
 * split is loaded once, when the task is created, and kept in memory; the features
 * computed from audio are cached in Kaldi archives under `cache` (CACHE/SPLIT.ark,
 * .scp, .json: feat_cache.h) when it is given, and read from there by later runs.
 *
 * A row is one utterance. Its T feature frames of D dimensions (D = 40) become T' =
 * ceil(T / subsample) model positions: position j holds the `stack` frames j s ..
 * j s + k - 1 (k = stack, s = subsample) side by side, F = k D features, a frame past
 * the last one repeating the last one. stack 1, subsample 1 (the defaults) is the
 * paper's input, the 40 filterbanks at 100 frames a second; stack 3, subsample 3 is
 * a common way to run a transformer over a third of the positions, each seeing 30 ms.
 * The positions go through the model's dense projection (frame input), a non-causal
 * body and the ctc head: classes = the phones P (the model adds the blank). Targets:
 * the utterance's phones, all of them (a label sequence per row); the model's N is
 * the longest row's T' (or `max_frames`), and a batch is cut to its own longest row
 * (pad_to_longest), so short utterances are not computed over the longest one's
 * positions.
 *
 * Refused when the task loads, one line naming the split and utterance (AB_EINVAL):
 * a row longer than max_frames (when given; nothing is truncated) and a row whose
 * phones cannot be aligned to its T' positions (fewer than the phones plus their
 * adjacent repeats, ctc_min_frames: a smaller subsample fits them). Nothing is dropped.
 *
 * Metric: per (the phone error rate: the summed edit distances between each
 * utterance's best path and its phones, over the summed phones of the split). No
 * generation; attnbench decode shows utterances (row_name: the utterance id;
 * label_name: the phone).
 *
 * Options: name; path or dirs (one of them); features (an object of
 * speech_data.h's options: sample_rate, num_mel_bins, frame_length_ms,
 * frame_shift_ms, preemph, low_freq, high_freq, source, cmvn, norm_vars, lexicon,
 * phones, drop; not cache); cache (a folder; default none); stack (1..64, default
 * 1); subsample (1..64, default 1); max_frames (the model's positions N, 0 (the
 * default): the longest row's); rows (split -> utterances) and crc32 (split -> the
 * CRC-32 of its features, phone ids and, for train, the inventory), which the
 * canonical config writes and a later load checks, so that a resume on changed data
 * is refused; augment (default none: not in the canonical config), SpecAugment-style
 * masks on the training batches only: {"freq_masks": F, "freq_width": WF,
 * "time_masks": T, "time_width": WT}, F bands of 0..WF of the D filterbank channels
 * (WF <= D; each band set to 0 in every stacked frame of every position) and T spans of
 * 0..WT model positions (all features set to 0), widths and places drawn per row and
 * step from the TASK_STREAM_AUGMENT cursor (speech_augment in speech_task.c gives the
 * order of the draws); 0 is the features' mean after CMVN. */
#ifndef AB_SPEECH_TASK_H
#define AB_SPEECH_TASK_H

#include "task.h"

extern const task_kind speech_task_kind;

#endif
