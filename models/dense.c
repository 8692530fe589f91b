/* Dense layer: out = x W^T + b, W (OC, C) as PyTorch's nn.Linear. */
#include "layers.h"

#include "../harness/blas.h"

#include <string.h>

void dense_forward(float *out, const float *x, const float *w, const float *b, int BT, int C, int OC) {
    /* out starts as the bias rows, then one GEMM adds x W^T on top */
    if (b) {
#pragma omp parallel for schedule(static) if ((size_t)BT * OC > 16384)
        for (int i = 0; i < BT; i++) memcpy(out + (size_t)i * OC, b, sizeof(float) * (size_t)OC);
    }
    ab_sgemm(false, true, BT, OC, C, 1.0f, x, C, w, C, b ? 1.0f : 0.0f, out, OC);
}

void dense_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, int BT,
                    int C, int OC) {
    if (dx) ab_sgemm(false, false, BT, C, OC, 1.0f, dout, OC, w, C, 1.0f, dx, C);   /* (BT,OC)(OC,C) */
    ab_sgemm(true, false, OC, C, BT, 1.0f, dout, OC, x, C, 1.0f, dw, C);             /* (OC,BT)(BT,C) */
    if (db) {
        /* column sums in row order per block of channels, in double */
        const int CB = 16;
        int nblocks = (OC + CB - 1) / CB;
#pragma omp parallel for schedule(static) if ((size_t)BT * OC > 16384 && nblocks > 1)
        for (int cb = 0; cb < nblocks; cb++) {
            int c0 = cb * CB, c1 = c0 + CB < OC ? c0 + CB : OC;
            double s[16] = {0};
            for (int i = 0; i < BT; i++) {
                const float *di = dout + (size_t)i * OC;
                for (int c = c0; c < c1; c++) s[c - c0] += di[c];
            }
            for (int c = c0; c < c1; c++) db[c] += (float)s[c - c0];
        }
    }
}
