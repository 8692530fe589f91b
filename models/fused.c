/* Fused position-wise layers (layers.h, "fused layers"): what the model's recurrent
 * step runs as one pass each on the device (models/layers_cuda.cu), here as the same
 * float operations in plain loops. Each equals the composition of the unfused layers
 * it replaces, up to where a bias is added (see layers.h). */
#include "layers.h"

#include <math.h>
#include <string.h>

#define FUSED_PAR_MIN 16384

void embedding_positions(float *out, const int *tokens, const float *wte, const float *table, int B, int N, int C,
                         int pos0) {
#pragma omp parallel for schedule(static) collapse(2) if ((size_t)B * N * C > FUSED_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            const size_t row = (size_t)b * N + n;
            const float *e = wte + (size_t)tokens[row] * C;
            float *o = out + row * C;
            if (!table) {
                memcpy(o, e, sizeof(float) * (size_t)C);
                continue;
            }
            const float *pe = table + (size_t)(pos0 + n) * C;
            for (int c = 0; c < C; c++) o[c] = e[c] + pe[c];
        }
}

void bias_heads_split(float *q, float *k, float *v, const float *qkv, const float *bias, int B, int N, int C, int H) {
    const int D = C / H;
#pragma omp parallel for schedule(static) collapse(2) if ((size_t)B * N * C > FUSED_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            const float *row = qkv + ((size_t)b * N + n) * 3 * C;
            for (int h = 0; h < H; h++) {
                const size_t dst = (((size_t)b * H + h) * N + n) * D;
                for (int d = 0; d < D; d++) {
                    const int c = h * D + d;
                    q[dst + d] = row[c] + bias[c];
                    k[dst + d] = row[C + c] + bias[C + c];
                    v[dst + d] = row[2 * C + c] + bias[2 * C + c];
                }
            }
        }
}

void bias_relu(float *x, const float *b, int BT, int F) {
#pragma omp parallel for schedule(static) if ((size_t)BT * F > FUSED_PAR_MIN)
    for (int i = 0; i < BT; i++) {
        float *xi = x + (size_t)i * F;
        for (int c = 0; c < F; c++) {
            const float y = xi[c] + b[c];
            xi[c] = y > 0.0f ? y : 0.0f;
        }
    }
}

void bias_residual_layernorm(float *res, float *out, float *mean, float *rstd, const float *x, const float *branch,
                             const float *bias, const float *g, const float *b, int BT, int C) {
#pragma omp parallel for schedule(static) if ((size_t)BT * C > FUSED_PAR_MIN)
    for (int i = 0; i < BT; i++) {
        const float *xi = x + (size_t)i * C, *bi = branch + (size_t)i * C;
        float *ri = res + (size_t)i * C;
        for (int c = 0; c < C; c++) ri[c] = xi[c] + (bi[c] + bias[c]);
    }
    if (out) layernorm_forward(out, mean, rstd, res, g, b, BT, C);
}
