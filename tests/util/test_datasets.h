/* Tiny datasets of the sequences and frames tasks, written as the tasks read them
 * (SPLIT.npy; SPLIT.frames.npy, SPLIT.labels.npy, SPLIT.lengths.npy) for the suites
 * that train on them (train_data, sample_run). The values come from one fixed
 * xorshift64* sequence per process (td_unif), so a test's data depend only on the
 * order of its own calls. */
#ifndef AB_TEST_DATASETS_H
#define AB_TEST_DATASETS_H

#include "npy.h"

#include <stdint.h>

/* sequence length; frames per row and features per frame */
enum { SEQ_L = 10, FR_N = 12, FR_F = 3 };
/* the splits and their rows */
extern const char *const TD_SPLITS[3];
extern const int TD_ROWS[3];

/* The next value of the fixed sequence, in [0, 1). */
double td_unif(void);
/* Writes an array of shape (a), (a, b) or (a, b, c) (nd of them); asserts success. */
void td_save(const char *path, ab_dtype t, int nd, int64_t a, int64_t b, int64_t c, const void *data);
/* Makes the folder dir (it must not exist) with the three splits of:
 * sequences: row tokens (s + i) mod 5, s uniform in 0..4; */
void td_write_sequences(const char *dir);
/* frames: features uniform in (-1, 1), label = [x0 > 0] + [x1 > 0], lengths 6..12,
 * padding frames 0 and labels -1; */
void td_write_frames(const char *dir);
/* ctc frames: runs of 2..4 frames each pointing at its class c in 0..2 (feature c =
 * 2 + noise, the others noise within +-0.3); a row's labels are its runs' classes with
 * adjacent equal ones merged, padded with -1; lengths 6..12, padding frames 0. */
void td_write_frames_ctc(const char *dir);

#endif
