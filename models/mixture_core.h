/* The arithmetic of the discretised logistic mixture head (layers.h: mixture_*) as
 * inline functions that compile as C (models/mixture.c), as C++ (the CPU emulator of
 * CUDA) and as CUDA device code (models/layers_cuda.cu), so that both backends evaluate
 * the very same expressions. Everything runs in double from the float outputs.
 *
 * One position's 3K outputs p (K components), in this order:
 *   p[k]         the mixture logit of component k      (pi = softmax(p[0..K)))
 *   p[K + k]     its mean mu_k, in the units of x
 *   p[2K + k]    its raw log-scale; ls_k = max(raw, MIX_LOG_SCALE_MIN), s_k = exp(ls_k)
 * Value v in 0..255 is x_v = 2 v / 255 - 1 in [-1, 1]; its bin is [x_v - h, x_v + h]
 * with h = 1/255, except that bin 0 reaches down to -inf and bin 255 up to +inf. With
 * sigma the logistic function, a = (x_v + h - mu) / s, b = (x_v - h - mu) / s:
 *   v = 0:    log p_k = log sigma(a)                   = -softplus(-a)
 *   v = 255:  log p_k = log (1 - sigma(b))             = -softplus(b)
 *   else:     log p_k = log (sigma(a) - sigma(b))
 *                     = -softplus(-a) - softplus(b) + log(1 - exp(-(a - b)))
 *             (the identity sigma(a) - sigma(b) = sigma(a) sigma(-b) (1 - e^{b - a}):
 *             a sum of logs, no cancellation, for any a and b), and where that mass
 *             is below MIX_TINY_MASS (1e-5) PixelCNN++'s fallback instead: the log
 *             density at the centre times the bin width,
 *                       log p_k = m - ls - 2 softplus(m) + log(2/255),  m = (x_v - mu) / s.
 *   log P(v) = logsumexp_k (log pi_k + log p_k(v)).
 * The clamp of the log-scale at -7 is PixelCNN++'s (its gradient is 0 below -7: the
 * raw output gets none where the clamp is active, raw < -7). The loss and gradient
 * functions are the same expressions on both backends; results differ only where
 * glibc's and CUDA's exp, log1p and expm1 round differently (an ulp or two). */
#ifndef AB_MODELS_MIXTURE_CORE_H
#define AB_MODELS_MIXTURE_CORE_H

#include <math.h>

#ifdef __CUDACC__
#define MIX_HD __host__ __device__
#else
#define MIX_HD
#endif

#define MIX_VALUES 256
#define MIX_LOG_SCALE_MIN (-7.0)
#define MIX_HALF_BIN (1.0 / 255.0)
#define MIX_TINY_MASS 1e-5
#define MIX_LOG_TINY_MASS (-11.512925464970229) /* log(1e-5) */
#define MIX_LOG_BIN_WIDTH (-4.848116364598481) /* log(2/255) */

static inline MIX_HD double mix_softplus(double z) { return z > 0.0 ? z + log1p(exp(-z)) : log1p(exp(z)); }

static inline MIX_HD double mix_sigmoid(double z) {
    if (z >= 0.0) return 1.0 / (1.0 + exp(-z));
    const double e = exp(z);
    return e / (1.0 + e);
}

/* sigma(z) and sigma(-z) = 1 - sigma(z), each to full relative precision */
static inline MIX_HD void mix_sigmoid_pair(double z, double *sp, double *sm) {
    const double t = exp(-fabs(z)), q = 1.0 / (1.0 + t);
    if (z >= 0.0) {
        *sp = q;
        *sm = t * q;
    } else {
        *sp = t * q;
        *sm = q;
    }
}

/* x_v = 2 v / 255 - 1 */
static inline MIX_HD double mix_x(int v) { return (double)(2 * v - 255) / 255.0; }
/* the edge between bins j and j + 1 (j = 0..254): x_j + 1/255 */
static inline MIX_HD double mix_edge(int j) { return (double)(2 * j - 254) / 255.0; }
/* the clamped log-scale */
static inline MIX_HD double mix_log_scale(float raw) {
    return raw < (float)MIX_LOG_SCALE_MIN ? MIX_LOG_SCALE_MIN : (double)raw;
}

/* log p(v) of one component (mean mu, clamped log-scale ls); with g non-NULL also
 * g[0] = d log p / d mu and g[1] = d log p / d ls. */
static inline MIX_HD double mix_component(double mu, double ls, int v, double *g) {
    const double u = exp(-ls), c = mix_x(v) - mu;
    double lp, dmu, dls;
    if (v == 0) {
        const double a = u * (c + MIX_HALF_BIN), sa = mix_sigmoid(-a);
        lp = -mix_softplus(-a);
        dmu = -u * sa;
        dls = -a * sa;
    } else if (v == MIX_VALUES - 1) {
        const double b = u * (c - MIX_HALF_BIN), sb = mix_sigmoid(b);
        lp = -mix_softplus(b);
        dmu = u * sb;
        dls = b * sb;
    } else {
        const double a = u * (c + MIX_HALF_BIN), b = u * (c - MIX_HALF_BIN), d = 2.0 * MIX_HALF_BIN * u;
        const double mid = -mix_softplus(-a) - mix_softplus(b) + log(-expm1(-d));
        if (mid > MIX_LOG_TINY_MASS) {
            /* d/da = sigma(-a) + 1/expm1(d), d/db = -sigma(b) - 1/expm1(d) */
            const double sa = mix_sigmoid(-a), sb = mix_sigmoid(b);
            lp = mid;
            dmu = -u * (sa - sb);
            dls = -(a * sa - b * sb + d / expm1(d));
        } else {
            const double m = u * c, t = 1.0 - 2.0 * mix_sigmoid(m); /* d/dm (m - 2 softplus(m)) */
            lp = m - ls - 2.0 * mix_softplus(m) + MIX_LOG_BIN_WIDTH;
            dmu = -u * t;
            dls = -m * t - 1.0;
        }
    }
    if (g) {
        g[0] = dmu;
        g[1] = dls;
    }
    return lp;
}

/* logsumexp of the K logits p[0..K) (max, then the sum in index order) */
static inline MIX_HD double mix_logit_lse(const float *p, int K) {
    float mx = p[0];
    for (int k = 1; k < K; k++) mx = p[k] > mx ? p[k] : mx;
    double s = 0.0;
    for (int k = 0; k < K; k++) s += exp((double)p[k] - mx);
    return (double)mx + log(s);
}

/* log P(v) of one position (p: its 3K outputs) */
static inline MIX_HD double mix_log_prob(const float *p, int K, int v) {
    const double lse = mix_logit_lse(p, K);
    /* logsumexp over the components in one pass (running maximum) */
    double mx = -INFINITY, s = 0.0;
    for (int k = 0; k < K; k++) {
        const double t = ((double)p[k] - lse) + mix_component(p[K + k], mix_log_scale(p[2 * K + k]), v, 0);
        if (t > mx) {
            s = s * exp(mx - t) + 1.0;
            mx = t;
        } else {
            s += exp(t - mx);
        }
    }
    return mx + log(s);
}

/* g (3K) += scale * d(-log P(v)) / d p, P(v) = exp(logp) (from mix_log_prob):
 * logits pi_k - r_k, means and log-scales -r_k d log p_k, with the responsibilities
 * r_k = pi_k p_k(v) / P(v); nothing for a log-scale held by the clamp. */
static inline MIX_HD void mix_grad(float *g, const float *p, int K, int v, double logp, double scale) {
    const double lse = mix_logit_lse(p, K);
    for (int k = 0; k < K; k++) {
        double d[2];
        const float raw = p[2 * K + k];
        const double lpi = (double)p[k] - lse;
        const double lc = mix_component(p[K + k], mix_log_scale(raw), v, d);
        const double r = exp(lpi + lc - logp);
        g[k] += (float)(scale * (exp(lpi) - r));
        g[K + k] += (float)(scale * (-r * d[0]));
        if (!(raw < (float)MIX_LOG_SCALE_MIN)) g[2 * K + k] += (float)(scale * (-r * d[1]));
    }
}

/* The probability of value v from the component CDFs at the bin edges (the exact
 * discretised mass, without the fallback): sum_k pi_k p_k(v) with
 * p_k(v) = sigma(z_v) sigma(-z_{v-1}) (1 - exp(-2 h / s_k)), z_j = (edge_j - mu_k) / s_k
 * (sigma(z_0) at v = 0, sigma(-z_254) at v = 255): products of positive numbers, so
 * accurate to a few ulps. lse: mix_logit_lse(p, K). The device's most probable value
 * (layers_cuda.cu) evaluates this per value; the CPU's (mixture.c: mixture_mode) the
 * same masses with the edge sigmoids from geometric sequences (within ~1e-13). */
static inline MIX_HD double mix_bin_prob(const float *p, int K, int v, double lse) {
    double P = 0.0;
    for (int k = 0; k < K; k++) {
        const double pi = exp((double)p[k] - lse), u = exp(-mix_log_scale(p[2 * K + k])), mu = p[K + k];
        double hi = 1.0, lo = 1.0, sp, sm;
        double w = pi;
        if (v < MIX_VALUES - 1) {
            mix_sigmoid_pair(u * (mix_edge(v) - mu), &sp, &sm);
            hi = sp;
        }
        if (v > 0) {
            mix_sigmoid_pair(u * (mix_edge(v - 1) - mu), &sp, &sm);
            lo = sm;
        }
        if (v > 0 && v < MIX_VALUES - 1) w = pi * -expm1(-2.0 * MIX_HALF_BIN * u);
        P = fma(w, hi * lo, P);
    }
    return P;
}

#endif
