/* Tiny datasets of the sequences and frames tasks (test_datasets.h). */
#include "test_datasets.h"

#include "error.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
double td_unif(void) { /* xorshift64*: fixed sequence, [0, 1) */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (double)((g_rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

void td_save(const char *path, ab_dtype t, int nd, int64_t a, int64_t b, int64_t c, const void *data) {
    int64_t shape[3] = {a, b, c};
    cr_assert_eq(ab_npy_write(path, t, nd, shape, data), 0, "%s", ab_error());
}

const char *const TD_SPLITS[3] = {"train", "valid", "test"};
const int TD_ROWS[3] = {40, 12, 10};

/* sequences: row tokens (s + i) mod 5, s uniform in 0..4 */
void td_write_sequences(const char *dir) {
    cr_assert_eq(mkdir(dir, 0755), 0);
    for (int sp = 0; sp < 3; sp++) {
        int n = TD_ROWS[sp], *x = malloc(sizeof(int) * n * SEQ_L);
        for (int r = 0; r < n; r++) {
            int s = (int)(td_unif() * 5);
            for (int i = 0; i < SEQ_L; i++) x[r * SEQ_L + i] = (s + i) % 5;
        }
        char path[1200];
        snprintf(path, sizeof path, "%s/%s.npy", dir, TD_SPLITS[sp]);
        td_save(path, AB_I32, 2, n, SEQ_L, 0, x);
        free(x);
    }
}

/* frames: N(0,1)-ish features, label = [x0 > 0] + [x1 > 0], lengths 6..12, padding
 * frames 0 and labels -1 */
void td_write_frames(const char *dir) {
    cr_assert_eq(mkdir(dir, 0755), 0);
    for (int sp = 0; sp < 3; sp++) {
        int n = TD_ROWS[sp];
        float *x = calloc((size_t)n * FR_N * FR_F, sizeof(float));
        int *y = malloc(sizeof(int) * n * FR_N), *len = malloc(sizeof(int) * n);
        for (int r = 0; r < n; r++) {
            len[r] = 6 + (int)(td_unif() * 7);
            for (int i = 0; i < FR_N; i++) {
                float *f = x + ((size_t)r * FR_N + i) * FR_F;
                if (i < len[r])
                    for (int j = 0; j < FR_F; j++) f[j] = (float)(td_unif() * 2 - 1);
                y[r * FR_N + i] = i < len[r] ? (f[0] > 0) + (f[1] > 0) : -1;
            }
        }
        char path[1200];
        snprintf(path, sizeof path, "%s/%s.frames.npy", dir, TD_SPLITS[sp]);
        td_save(path, AB_F32, 3, n, FR_N, FR_F, x);
        snprintf(path, sizeof path, "%s/%s.labels.npy", dir, TD_SPLITS[sp]);
        td_save(path, AB_I32, 2, n, FR_N, 0, y);
        snprintf(path, sizeof path, "%s/%s.lengths.npy", dir, TD_SPLITS[sp]);
        td_save(path, AB_I32, 1, n, 0, 0, len);
        free(x);
        free(y);
        free(len);
    }
}

/* ctc: each row is runs of 2..4 frames, every frame of a run pointing at the run's
 * class c in 0..2 (feature c = 2 + noise, the others noise within +-0.3); the row's
 * labels are its runs' classes with adjacent equal ones merged (a sequence of 1..6
 * labels), padded with -1; lengths 6..12, padding frames 0. */
void td_write_frames_ctc(const char *dir) {
    cr_assert_eq(mkdir(dir, 0755), 0);
    for (int sp = 0; sp < 3; sp++) {
        int n = TD_ROWS[sp];
        float *x = calloc((size_t)n * FR_N * FR_F, sizeof(float));
        int *y = malloc(sizeof(int) * n * FR_N), *len = malloc(sizeof(int) * n);
        for (int r = 0; r < n; r++) {
            len[r] = 6 + (int)(td_unif() * 7);
            int count = 0;
            for (int i = 0; i < FR_N; i++) y[r * FR_N + i] = -1;
            for (int t = 0; t < len[r];) {
                const int c = (int)(td_unif() * 3), run = 2 + (int)(td_unif() * 3);
                for (int i = t; i < len[r] && i < t + run; i++)
                    for (int j = 0; j < FR_F; j++) x[((size_t)r * FR_N + i) * FR_F + j] = (float)((td_unif() * 2 - 1) * 0.3 + 2.0 * (j == c));
                if (count == 0 || y[r * FR_N + count - 1] != c) y[r * FR_N + count++] = c;
                t += run;
            }
        }
        char path[1200];
        snprintf(path, sizeof path, "%s/%s.frames.npy", dir, TD_SPLITS[sp]);
        td_save(path, AB_F32, 3, n, FR_N, FR_F, x);
        snprintf(path, sizeof path, "%s/%s.labels.npy", dir, TD_SPLITS[sp]);
        td_save(path, AB_I32, 2, n, FR_N, 0, y);
        snprintf(path, sizeof path, "%s/%s.lengths.npy", dir, TD_SPLITS[sp]);
        td_save(path, AB_I32, 1, n, 0, 0, len);
        free(x);
        free(y);
        free(len);
    }
}
