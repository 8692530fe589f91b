/* Attention heads: the projections' (B, N, C) rows <-> the attention library's
 * (B, H, N, D) layout. Pure copies, so the backward of a split is a join (and of a
 * merge an unmerge) and every result is exact. */
#include "layers.h"

#include <string.h>

#define HEADS_PAR_MIN 16384

void heads_split(float *q, float *k, float *v, const float *qkv, int B, int N, int C, int H) {
    int D = C / H;
#pragma omp parallel for schedule(static) collapse(2) if ((size_t)B * N * C > HEADS_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            const float *row = qkv + ((size_t)b * N + n) * 3 * C;
            for (int h = 0; h < H; h++) {
                size_t dst = (((size_t)b * H + h) * N + n) * D;
                memcpy(q + dst, row + h * D, sizeof(float) * (size_t)D);
                memcpy(k + dst, row + C + h * D, sizeof(float) * (size_t)D);
                memcpy(v + dst, row + 2 * C + h * D, sizeof(float) * (size_t)D);
            }
        }
}

void heads_join(float *dqkv, const float *dq, const float *dk, const float *dv, int B, int N, int C, int H) {
    int D = C / H;
#pragma omp parallel for schedule(static) collapse(2) if ((size_t)B * N * C > HEADS_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            float *row = dqkv + ((size_t)b * N + n) * 3 * C;
            for (int h = 0; h < H; h++) {
                size_t src = (((size_t)b * H + h) * N + n) * D;
                memcpy(row + h * D, dq + src, sizeof(float) * (size_t)D);
                memcpy(row + C + h * D, dk + src, sizeof(float) * (size_t)D);
                memcpy(row + 2 * C + h * D, dv + src, sizeof(float) * (size_t)D);
            }
        }
}

void heads_merge(float *merged, const float *heads, int B, int N, int C, int H) {
    int D = C / H;
#pragma omp parallel for schedule(static) collapse(2) if ((size_t)B * N * C > HEADS_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            float *row = merged + ((size_t)b * N + n) * C;
            for (int h = 0; h < H; h++)
                memcpy(row + h * D, heads + (((size_t)b * H + h) * N + n) * D, sizeof(float) * (size_t)D);
        }
}

void heads_unmerge(float *heads, const float *merged, int B, int N, int C, int H) {
    int D = C / H;
#pragma omp parallel for schedule(static) collapse(2) if ((size_t)B * N * C > HEADS_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            const float *row = merged + ((size_t)b * N + n) * C;
            for (int h = 0; h < H; h++)
                memcpy(heads + (((size_t)b * H + h) * N + n) * D, row + h * D, sizeof(float) * (size_t)D);
        }
}
