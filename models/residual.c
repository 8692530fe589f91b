/* Residual connections: element-wise sums. */
#include "layers.h"

#define RES_PAR_MIN 16384

void residual_add(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static) if (n > RES_PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void residual_acc(float *y, const float *x, size_t n) {
#pragma omp parallel for schedule(static) if (n > RES_PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void scale_inplace(float *x, size_t n, float s) {
#pragma omp parallel for schedule(static) if (n > RES_PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}
