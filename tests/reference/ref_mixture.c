/* The discretised logistic mixture in double (ref_mixture.h). */
#include "ref_mixture.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define HALF (1.0 / 255.0)

static double sig(double z) { return 1.0 / (1.0 + exp(-z)); }
static double log_sig(double z) { return z >= 0 ? -log1p(exp(-z)) : z - log1p(exp(z)); }

/* log p_k(v) of the component (mu, raw log-scale) and its derivatives by mu and by
 * the raw log-scale */
static double component(double mu, double raw, int v, double *dmu, double *draw) {
    const int clamped = raw < -7.0;
    const double ls = clamped ? -7.0 : raw, s = exp(ls), x = 2.0 * v / 255.0 - 1.0;
    const double plus = (x + HALF - mu) / s, minus = (x - HALF - mu) / s, mid = (x - mu) / s;
    double L, dplus = 0, dminus = 0, dmid = 0, dls_extra = 0;
    if (v == 0) {
        L = log_sig(plus);
        dplus = sig(-plus);
    } else if (v == 255) {
        L = log_sig(-minus);
        dminus = -sig(minus);
    } else {
        const double delta = minus > 0 ? sig(-minus) - sig(-plus) : sig(plus) - sig(minus);
        if (delta > 1e-5) {
            L = log(delta);
            dplus = sig(plus) * sig(-plus) / delta;
            dminus = -sig(minus) * sig(-minus) / delta;
        } else {
            /* log of the logistic density at x times the bin width */
            L = log_sig(mid) + log_sig(-mid) - ls + log(2.0 / 255.0);
            dmid = sig(-mid) - sig(mid);
            dls_extra = -1.0;
        }
    }
    /* each z = (. - mu) / s: dz/dmu = -1/s, dz/dls = -z */
    *dmu = -(dplus + dminus + dmid) / s;
    *draw = clamped ? 0.0 : -(dplus * plus + dminus * minus + dmid * mid) + dls_extra;
    return L;
}

static double log_softmax_norm(const double *logits, int K) {
    double mx = logits[0], s = 0;
    for (int k = 1; k < K; k++) mx = fmax(mx, logits[k]);
    for (int k = 0; k < K; k++) s += exp(logits[k] - mx);
    return mx + log(s);
}

double ref_mixture_log_prob(const double *p, int K, int v) {
    const double norm = log_softmax_norm(p, K);
    double *t = malloc(sizeof(double) * (size_t)K), mx = -INFINITY, s = 0, d0, d1;
    for (int k = 0; k < K; k++) {
        t[k] = p[k] - norm + component(p[K + k], p[2 * K + k], v, &d0, &d1);
        mx = fmax(mx, t[k]);
    }
    for (int k = 0; k < K; k++) s += exp(t[k] - mx);
    free(t);
    return mx + log(s);
}

void ref_mixture_log_prob_grad(const double *p, int K, int v, double *g) {
    const double norm = log_softmax_norm(p, K), lp = ref_mixture_log_prob(p, K, v);
    for (int k = 0; k < K; k++) {
        double dmu, draw;
        const double lc = component(p[K + k], p[2 * K + k], v, &dmu, &draw);
        const double pi = exp(p[k] - norm), r = exp(p[k] - norm + lc - lp);
        g[k] = r - pi; /* d/dlogit_k of log pi_j is [j = k] - pi_k; weighted by the r_j */
        g[K + k] = r * dmu;
        g[2 * K + k] = r * draw;
    }
}

void ref_mixture_probs(const double *p, int K, double *P) {
    const double norm = log_softmax_norm(p, K);
    for (int v = 0; v < 256; v++) P[v] = 0;
    for (int k = 0; k < K; k++) {
        const double pi = exp(p[k] - norm), mu = p[K + k], s = exp(fmax(p[2 * K + k], -7.0));
        for (int v = 0; v < 256; v++) {
            const double x = 2.0 * v / 255.0 - 1.0, plus = (x + HALF - mu) / s, minus = (x - HALF - mu) / s;
            double m;
            if (v == 0) m = sig(plus);
            else if (v == 255) m = sig(-minus);
            else m = minus > 0 ? sig(-minus) - sig(-plus) : sig(plus) - sig(minus);
            P[v] += pi * m;
        }
    }
}

double ref_mixture_nll(const double *out, const int *targets, const double *weights, int BT, int K, double *dout) {
    double sw = 0, swl = 0;
    for (int i = 0; i < BT; i++) {
        const double w = weights ? weights[i] : 1.0;
        if (w > 0) {
            sw += w;
            swl += w * -ref_mixture_log_prob(out + (size_t)i * 3 * K, K, targets[i]);
        }
    }
    if (dout) {
        memset(dout, 0, sizeof(double) * (size_t)BT * 3 * K);
        for (int i = 0; sw > 0 && i < BT; i++) {
            const double w = weights ? weights[i] : 1.0;
            if (!(w > 0)) continue;
            ref_mixture_log_prob_grad(out + (size_t)i * 3 * K, K, targets[i], dout + (size_t)i * 3 * K);
            for (int j = 0; j < 3 * K; j++) dout[(size_t)i * 3 * K + j] *= -w / sw;
        }
    }
    return sw > 0 ? swl / sw : 0.0;
}
