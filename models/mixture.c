/* The discretised logistic mixture head on the CPU (layers.h; the formulas are
 * mixture_core.h's, shared with the CUDA kernels): the weighted mean NLL of one 8-bit
 * value per position, its gradient, and the most probable value and sampling for
 * generation. Per-position work runs in parallel with a static schedule; the sums over
 * positions run in position order in double, and the count of correct positions is an
 * integer sum, so nothing depends on the thread count. */
#include "layers.h"

#include "draw_core.h"
#include "mixture_core.h"

#include <math.h>

double mixture_log_prob(const float *p, int K, int v) { return mix_log_prob(p, K, v); }

/* sigma(z_j) and sigma(-z_j) at the edges from j0 to the end (up: j0, j0 + 1, ...,
 * 254, edges at or above the mean, where t = exp(-z) and sigma(z) = 1/(1+t); down: j0,
 * j0 - 1, ..., 0, edges below it, where t = exp(z) and sigma(-z) = 1/(1+t)), from t at
 * j0 and the ratio r = exp(-2h/s) between neighbours: |z| grows by 2h/s per edge away
 * from the mean, so t is a geometric sequence. Four interleaved chains (ratio r^4)
 * keep the multiplications independent. */
static void edges_up(double *sp, double *sm, int j0, double t, double r) {
    const double r2 = r * r, r4 = r2 * r2;
    double t0 = t, t1 = t * r, t2 = t * r2, t3 = t * r2 * r;
    int j = j0;
    for (; j + 3 < MIX_VALUES - 1; j += 4) {
        const double q0 = 1.0 / (1.0 + t0), q1 = 1.0 / (1.0 + t1), q2 = 1.0 / (1.0 + t2), q3 = 1.0 / (1.0 + t3);
        sp[j] = q0, sp[j + 1] = q1, sp[j + 2] = q2, sp[j + 3] = q3;
        sm[j] = t0 * q0, sm[j + 1] = t1 * q1, sm[j + 2] = t2 * q2, sm[j + 3] = t3 * q3;
        t0 *= r4, t1 *= r4, t2 *= r4, t3 *= r4;
    }
    const double rest[3] = {t0, t1, t2};
    for (int l = 0; j < MIX_VALUES - 1; j++, l++) {
        const double q = 1.0 / (1.0 + rest[l]);
        sp[j] = q;
        sm[j] = rest[l] * q;
    }
}

static void edges_down(double *sp, double *sm, int j0, double t, double r) {
    const double r2 = r * r, r4 = r2 * r2;
    double t0 = t, t1 = t * r, t2 = t * r2, t3 = t * r2 * r;
    int j = j0;
    for (; j - 3 >= 0; j -= 4) {
        const double q0 = 1.0 / (1.0 + t0), q1 = 1.0 / (1.0 + t1), q2 = 1.0 / (1.0 + t2), q3 = 1.0 / (1.0 + t3);
        sm[j] = q0, sm[j - 1] = q1, sm[j - 2] = q2, sm[j - 3] = q3;
        sp[j] = t0 * q0, sp[j - 1] = t1 * q1, sp[j - 2] = t2 * q2, sp[j - 3] = t3 * q3;
        t0 *= r4, t1 *= r4, t2 *= r4, t3 *= r4;
    }
    const double rest[3] = {t0, t1, t2};
    for (int l = 0; j >= 0; j--, l++) {
        const double q = 1.0 / (1.0 + rest[l]);
        sm[j] = q;
        sp[j] = rest[l] * q;
    }
}

/* The first value with the largest probability: the masses of mix_bin_prob, with the
 * sigmoids at the edges from two geometric sequences (edges_up, edges_down) instead of
 * one exp each
 * (5x faster; the chains' rounding, j ulps after j steps, keeps every mass within
 * ~1e-13 relative of mix_bin_prob's). */
int mixture_mode(const float *p, int K) {
    double P[MIX_VALUES], sp[MIX_VALUES - 1], sm[MIX_VALUES - 1];
    for (int v = 0; v < MIX_VALUES; v++) P[v] = 0.0;
    const double lse = mix_logit_lse(p, K);
    for (int k = 0; k < K; k++) {
        const double pi = exp((double)p[k] - lse), u = exp(-mix_log_scale(p[2 * K + k])), mu = p[K + k];
        const double d = 2.0 * MIX_HALF_BIN * u, r = exp(-d), wmid = pi * -expm1(-d);
        /* j0: the first edge at or above the mean, (2 j - 254) / 255 >= mu (255: none) */
        const double jf = ceil((mu * 255.0 + 254.0) / 2.0);
        const int j0 = !(jf >= 0.0) ? 0 : jf > MIX_VALUES - 1 ? MIX_VALUES - 1 : (int)jf;
        if (j0 < MIX_VALUES - 1) edges_up(sp, sm, j0, exp(-u * (mix_edge(j0) - mu)), r);
        if (j0 > 0) edges_down(sp, sm, j0 - 1, exp(u * (mix_edge(j0 - 1) - mu)), r);
        P[0] = fma(pi, sp[0], P[0]);
        for (int v = 1; v < MIX_VALUES - 1; v++) P[v] = fma(wmid, sp[v] * sm[v - 1], P[v]);
        P[MIX_VALUES - 1] = fma(pi, sm[MIX_VALUES - 2], P[MIX_VALUES - 1]);
    }
    int am = 0;
    for (int v = 1; v < MIX_VALUES; v++)
        if (P[v] > P[am]) am = v;
    return am;
}

int mixture_sample(const float *p, int K, double u1, double u2) { return draw_mixture_core(p, K, u1, u2); }

void mixture_forward(ce_stats *st, float *nll, const float *out, const int *targets, const float *weights, int BT,
                     int K) {
    const size_t P3 = 3 * (size_t)K;
    long long correct = 0;
#pragma omp parallel for schedule(static) reduction(+ : correct) if (BT > 1)
    for (int i = 0; i < BT; i++) {
        float w = weights ? weights[i] : 1.0f;
        if (!(w > 0.0f)) {
            nll[i] = 0.0f;
            continue;
        }
        const float *p = out + (size_t)i * P3;
        nll[i] = (float)-mix_log_prob(p, K, targets[i]);
        correct += mixture_mode(p, K) == targets[i];
    }
    double sw = 0, swl = 0;
    long long counted = 0;
    for (int i = 0; i < BT; i++) {
        float w = weights ? weights[i] : 1.0f;
        if (!(w > 0.0f)) continue;
        counted++;
        sw += w;
        swl += (double)w * nll[i];
    }
    st->weight_sum = sw;
    st->loss = sw > 0 ? swl / sw : 0.0;
    st->correct = correct;
    st->counted = counted;
}

void mixture_backward(float *dout, const float *out, const int *targets, const float *weights, double weight_sum,
                      int BT, int K) {
    if (!(weight_sum > 0)) return;
    const size_t P3 = 3 * (size_t)K;
#pragma omp parallel for schedule(static) if (BT > 1)
    for (int i = 0; i < BT; i++) {
        float w = weights ? weights[i] : 1.0f;
        if (!(w > 0.0f)) continue;
        const float *p = out + (size_t)i * P3;
        mix_grad(dout + (size_t)i * P3, p, K, targets[i], mix_log_prob(p, K, targets[i]), (double)w / weight_sum);
    }
}
