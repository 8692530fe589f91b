/* Inverted dropout with a counter-based mask (see layers.h for the exact rule).
 * One Philox call gives the flags of four consecutive elements. */
#include "layers.h"

#include "../harness/rng.h"

#include <math.h>

#define DROP_PAR_MIN 16384

uint32_t dropout_threshold(float p) {
    double keep = 1.0 - (double)p;
    if (keep <= 0) return 0;
    if (keep >= 1) return 1u << 24;
    return (uint32_t)llround(keep * 16777216.0);
}

/* The blocks of elements first .. first+n-1 of the stream: block jb holds elements
 * 4 jb .. 4 jb + 3 of the whole sequence; element g (>= first) goes to position g - first. */
void dropout_mask_at(uint8_t *mask, size_t n, float p, uint64_t seed, uint64_t stream, uint64_t first) {
    dropout_forward_at(NULL, mask, NULL, n, p, seed, stream, first);
}

void dropout_mask(uint8_t *mask, size_t n, float p, uint64_t seed, uint64_t stream) {
    dropout_mask_at(mask, n, p, seed, stream, 0);
}

void dropout_forward_at(float *out, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed, uint64_t stream,
                        uint64_t first) {
    if (n == 0) return;
    uint32_t thr = dropout_threshold(p);
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    const uint64_t b0 = first / 4, nblocks = (first + n + 3) / 4 - b0;
#pragma omp parallel for schedule(static) if (n > DROP_PAR_MIN)
    for (uint64_t j = 0; j < nblocks; j++) {
        uint32_t w[4];
        ab_philox4x32(seed, stream, b0 + j, w);
        for (uint64_t e = 0; e < 4; e++) {
            const uint64_t g = 4 * (b0 + j) + e;
            if (g < first) continue;
            if (g >= first + n) break;
            const size_t i = (size_t)(g - first);
            uint8_t keep = (uint8_t)((w[e] >> 8) < thr);
            mask[i] = keep;
            if (out) out[i] = keep ? x[i] * scale : 0.0f;
        }
    }
}

void dropout_forward(float *out, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed, uint64_t stream) {
    dropout_forward_at(out, mask, x, n, p, seed, stream, 0);
}

void dropout_backward(float *dx, const float *dout, const uint8_t *mask, size_t n, float p) {
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
#pragma omp parallel for schedule(static) if (n > DROP_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        if (mask[i]) dx[i] += dout[i] * scale;
}
