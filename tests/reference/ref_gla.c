/* Gated linear attention (the gla variant) in double, straight from its definition:
 * per slice, b_i = sum_{t<=i} g_t per key dimension (a scalar gate, W = 1, serves every
 * dimension), weights w_ijd = e^(b_id - b_jd) for j <= i (causal) or e^(-|b_id - b_jd|)
 * for every valid j (non-causal), o_i = scale sum_j sum_d q_id k_jd w_ijd v_j. O(N^2 D M),
 * no chunks, no recurrence. */
#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The valid length of batch b. */
static int valid(const ref_shape *s, int b) { return s->lengths ? s->lengths[b] : s->N; }

/* b (L x D): cumulative sums of the slice's gates, broadcast over D when W = 1. */
static double *cumulative(const ref_shape *s, int W, const double *g, int L) {
    double *b = calloc((size_t)(L > 0 ? L : 1) * s->D, sizeof *b);
    for (int t = 0; t < L; t++)
        for (int d = 0; d < s->D; d++)
            b[(size_t)t * s->D + d] = (t ? b[(size_t)(t - 1) * s->D + d] : 0.0) + g[(size_t)t * W + (W == 1 ? 0 : d)];
    return b;
}

/* Whether query i sees key j, and the weight of dimension d. */
static bool sees(const ref_shape *s, int i, int j) { return !s->causal || j <= i; }
static double weight(const double *b, int D, int i, int j, int d) {
    return exp(-fabs(b[(size_t)i * D + d] - b[(size_t)j * D + d]));
}

void ref_gla(const ref_shape *s, int W, double scale, const double *q, const double *k, const double *v,
             const double *g, double *out) {
    const int D = s->D, M = s->M, N = s->N;
    memset(out, 0, sizeof(double) * (size_t)s->B * s->H * N * M);
    for (int bh = 0; bh < s->B * s->H; bh++) {
        const int L = valid(s, bh / s->H);
        const double *qs = q + (size_t)bh * N * D, *ks = k + (size_t)bh * N * D, *vs = v + (size_t)bh * N * M;
        double *b = cumulative(s, W, g + (size_t)bh * N * W, L), *os = out + (size_t)bh * N * M;
        for (int i = 0; i < L; i++)
            for (int j = 0; j < L; j++) {
                if (!sees(s, i, j)) continue;
                double a = 0;
                for (int d = 0; d < D; d++) a += qs[(size_t)i * D + d] * ks[(size_t)j * D + d] * weight(b, D, i, j, d);
                for (int m = 0; m < M; m++) os[(size_t)i * M + m] += scale * a * vs[(size_t)j * M + m];
            }
        free(b);
    }
}

/* The gradients of sum(dout . out). Every term c_ijd = scale (dout_i . v_j) q_id k_jd
 * w_ijd has d c / d g_td = c_ijd for min(i, j) < t <= max(i, j) (g <= 0: the exponent is
 * the sum of those gates), added into dg through a difference array. */
void ref_gla_backward(const ref_shape *s, int W, double scale, const double *q, const double *k, const double *v,
                      const double *g, const double *dout, double *dq, double *dk, double *dv, double *dg) {
    const int D = s->D, M = s->M, N = s->N;
    const size_t BH = (size_t)s->B * s->H;
    memset(dq, 0, sizeof(double) * BH * N * D);
    memset(dk, 0, sizeof(double) * BH * N * D);
    memset(dv, 0, sizeof(double) * BH * N * M);
    memset(dg, 0, sizeof(double) * BH * N * W);
    double *diff = calloc((size_t)(N + 1) * W, sizeof *diff);
    for (size_t bh = 0; bh < BH; bh++) {
        const int L = valid(s, (int)(bh / s->H));
        const double *qs = q + bh * N * D, *ks = k + bh * N * D, *vs = v + bh * N * M, *dos = dout + bh * N * M;
        double *b = cumulative(s, W, g + bh * N * W, L);
        double *dqs = dq + bh * N * D, *dks = dk + bh * N * D, *dvs = dv + bh * N * M, *dgs = dg + bh * N * W;
        memset(diff, 0, sizeof(double) * (size_t)(N + 1) * W);
        for (int i = 0; i < L; i++)
            for (int j = 0; j < L; j++) {
                if (!sees(s, i, j)) continue;
                double dp = 0, a = 0;
                for (int m = 0; m < M; m++) dp += dos[(size_t)i * M + m] * vs[(size_t)j * M + m];
                const int lo = i < j ? i : j, hi = i < j ? j : i;
                for (int d = 0; d < D; d++) {
                    const double w = weight(b, D, i, j, d), qd = qs[(size_t)i * D + d], kd = ks[(size_t)j * D + d];
                    a += qd * kd * w;
                    dqs[(size_t)i * D + d] += scale * dp * kd * w;
                    dks[(size_t)j * D + d] += scale * dp * qd * w;
                    const double c = scale * dp * qd * kd * w;
                    const int x = W == 1 ? 0 : d;
                    diff[(size_t)(lo + 1) * W + x] += c;
                    diff[(size_t)(hi + 1) * W + x] -= c;
                }
                for (int m = 0; m < M; m++) dvs[(size_t)j * M + m] += scale * a * dos[(size_t)i * M + m];
            }
        for (int x = 0; x < W; x++) {
            double run = 0;
            for (int t = 0; t < L; t++) {
                run += diff[(size_t)t * W + x];
                dgs[(size_t)t * W + x] = run;
            }
        }
        free(b);
    }
    free(diff);
}
