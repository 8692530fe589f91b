/* Adam and RAdam in double precision, written for clarity (see reference.h). */
#include "reference.h"

#include <math.h>
#include <stdlib.h>

double ref_optim_lr(const ref_optim_cfg *c, long long t) {
    double lr = c->lr;
    for (int i = 0; i < c->n_milestones; i++)
        if (t > c->milestones[i]) lr = lr * c->gamma;
    if (c->warmup > 0 && t < c->warmup) lr = lr * (double)t / (double)c->warmup;
    return lr;
}

double ref_optim_step(const ref_optim_cfg *c, long long t, int n, double *p, const double *g, double *m, double *v,
                      const bool *decay, int *rectified) {
    /* Clip by the global norm of the raw gradient. */
    double sq = 0;
    for (int i = 0; i < n; i++) sq += g[i] * g[i];
    double norm = sqrt(sq);
    double scale = 1.0;
    if (c->clip_norm > 0 && norm > c->clip_norm) scale = c->clip_norm / norm;

    double lr = ref_optim_lr(c, t);
    double b1 = c->beta1, b2 = c->beta2;
    double b1t = pow(b1, (double)t), b2t = pow(b2, (double)t);

    /* RAdam's variance rectification term. */
    double rho_inf = 2.0 / (1.0 - b2) - 1.0;
    double rho_t = rho_inf - 2.0 * (double)t * b2t / (1.0 - b2t);
    int rect = c->kind == 0 || rho_t >= c->threshold;
    double r_t = 0;
    if (c->kind == 1 && rect)
        r_t = sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t));

    for (int i = 0; i < n; i++) {
        double gi = g[i] * scale;
        double wd = decay[i] ? c->weight_decay : 0.0;
        if (!c->decoupled) gi = gi + wd * p[i];
        m[i] = b1 * m[i] + (1.0 - b1) * gi;
        v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
        double p_old = p[i];
        if (c->decoupled) p[i] = p[i] - lr * wd * p_old;
        if (c->kind == 0) {
            double m_hat = m[i] / (1.0 - b1t);
            double v_hat = v[i] / (1.0 - b2t);
            p[i] = p[i] - lr * m_hat / (sqrt(v_hat) + c->eps);
        } else if (rect) {
            double step = r_t * sqrt(1.0 - b2t) / (1.0 - b1t);
            p[i] = p[i] - lr * step * m[i] / (sqrt(v[i]) + c->eps);
        } else {
            p[i] = p[i] - lr * m[i] / (1.0 - b1t);
        }
    }
    if (rectified) *rectified = rect;
    return norm;
}
