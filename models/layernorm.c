/* Layer normalisation over the channels of each row, with learnable gain and bias.
 *
 * Forward: mu = mean(x), var = mean((x - mu)^2) (two passes, in double),
 * rstd = 1 / sqrt(var + eps), xhat = (x - mu) rstd, out = xhat g + b.
 * Backward, per row with dxhat = dout g:
 *   dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)),
 *   dg = sum over rows of dout xhat,  db = sum over rows of dout.
 * The row part is split over rows, the dg/db sums over blocks of channels (each
 * block walks the rows in order: deterministic). */
#include "layers.h"

#include <math.h>

#define LN_PAR_MIN 16384

void layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *g, const float *b, int BT,
                       int C) {
#pragma omp parallel for schedule(static) if ((size_t)BT * C > LN_PAR_MIN)
    for (int i = 0; i < BT; i++) {
        const float *xi = x + (size_t)i * C;
        float *oi = out + (size_t)i * C;
        double m = 0;
        for (int c = 0; c < C; c++) m += xi[c];
        m /= C;
        double v = 0;
        for (int c = 0; c < C; c++) {
            double d = xi[c] - m;
            v += d * d;
        }
        v /= C;
        float mf = (float)m, rs = (float)(1.0 / sqrt(v + (double)LN_EPS));
        for (int c = 0; c < C; c++) oi[c] = (xi[c] - mf) * rs * g[c] + b[c];
        mean[i] = mf;
        rstd[i] = rs;
    }
}

void layernorm_backward(float *dx, float *dg, float *db, const float *dout, const float *x, const float *g,
                        const float *mean, const float *rstd, int BT, int C) {
    if (dx) {
#pragma omp parallel for schedule(static) if ((size_t)BT * C > LN_PAR_MIN)
        for (int i = 0; i < BT; i++) {
            const float *xi = x + (size_t)i * C, *di = dout + (size_t)i * C;
            float m = mean[i], rs = rstd[i];
            double s1 = 0, s2 = 0; /* sum dxhat, sum dxhat xhat */
            for (int c = 0; c < C; c++) {
                double dxh = (double)di[c] * g[c];
                s1 += dxh;
                s2 += dxh * ((xi[c] - m) * rs);
            }
            float m1 = (float)(s1 / C), m2 = (float)(s2 / C);
            float *dxi = dx + (size_t)i * C;
            for (int c = 0; c < C; c++) {
                float xh = (xi[c] - m) * rs;
                dxi[c] += rs * (di[c] * g[c] - m1 - xh * m2);
            }
        }
    }
    const int CB = 16;
    int nblocks = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static) if ((size_t)BT * C > LN_PAR_MIN && nblocks > 1)
    for (int cb = 0; cb < nblocks; cb++) {
        int c0 = cb * CB, c1 = c0 + CB < C ? c0 + CB : C;
        double sg[16] = {0}, sb[16] = {0};
        for (int i = 0; i < BT; i++) {
            const float *xi = x + (size_t)i * C, *di = dout + (size_t)i * C;
            float m = mean[i], rs = rstd[i];
            for (int c = c0; c < c1; c++) {
                sg[c - c0] += (double)di[c] * ((xi[c] - m) * rs);
                sb[c - c0] += di[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dg[c] += (float)sg[c - c0];
            db[c] += (float)sb[c - c0];
        }
    }
}
