/* Sinusoidal positions (Vaswani et al. 2017), added to the embeddings. */
#include "layers.h"

#include <math.h>

void positions_table(float *table, int N, int C) {
    for (int p = 0; p < N; p++)
        for (int c = 0; c < C; c++) {
            int i2 = c & ~1; /* 2i for both channels of a pair */
            double angle = (double)p * exp(-log(10000.0) * (double)i2 / (double)C);
            table[(size_t)p * C + c] = (float)((c & 1) ? cos(angle) : sin(angle));
        }
}

void positions_add(float *x, const float *table, int B, int N, int C, int pos0) {
#pragma omp parallel for schedule(static) collapse(2) if ((size_t)B * N * C > 16384)
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            float *row = x + ((size_t)b * N + n) * C;
            const float *pe = table + (size_t)(pos0 + n) * C;
            for (int c = 0; c < C; c++) row[c] += pe[c];
        }
}
