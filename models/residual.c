/* Residual connections: element-wise sums. */
#include "layers.h"

#include <math.h>

#define RES_PAR_MIN 16384

void residual_add(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static) if (n > RES_PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void residual_acc(float *y, const float *x, size_t n) {
#pragma omp parallel for schedule(static) if (n > RES_PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void gate_act_forward(float *x, size_t n, gate_act kind) {
    if (kind == GATE_ACT_LOGSIGMOID16) {
        /* log sigmoid(z) = -softplus(-z) = min(z, 0) - log1p(exp(-|z|)), exact for any z */
        for (size_t i = 0; i < n; i++) x[i] = (fminf(x[i], 0.0f) - log1pf(expf(-fabsf(x[i])))) * 0.0625f;
    } else {
        for (size_t i = 0; i < n; i++) x[i] = 1.0f / (1.0f + expf(-x[i]));
    }
}

void gate_act_backward(float *d, const float *y, size_t n, gate_act kind) {
    if (kind == GATE_ACT_LOGSIGMOID16) {
        /* d/dz log sigmoid(z) = sigmoid(-z) = 1 - exp(log sigmoid(z)) = -expm1(16 y) */
        for (size_t i = 0; i < n; i++) d[i] *= -expm1f(16.0f * y[i]) * 0.0625f;
    } else {
        for (size_t i = 0; i < n; i++) d[i] *= y[i] * (1.0f - y[i]);
    }
}

void scale_inplace(float *x, size_t n, float s) {
#pragma omp parallel for schedule(static) if (n > RES_PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}
