/* Plain double-precision DeltaNet (Schlag et al. 2021, the delta rule; the deltanet
 * variant): the sequential recurrence, one position at a time, and its gradient by the
 * reverse recurrence with every state kept (memory N D M per slice: for tests only).
 *
 *   qn = q / r_q, kn = k / r_k, r_x = sqrt(|x|^2 + eps)
 *   e_t = v_t - S_{t-1}^T kn_t,  S_t = S_{t-1} + beta_t kn_t e_t^T,  out_t = S_t^T qn_t
 *
 * Reverse pass, G = dL/dS_t (everything after t, then out_t's share):
 *   G += qn_t dout_t^T;  dqn_t = S_t dout_t
 *   de = beta_t G^T kn_t;  dv_t = de;  dbeta_t = (G^T kn_t) . e_t
 *   dkn_t = beta_t G e_t - S_{t-1} de;  G <- G - kn_t de^T   (dL/dS_{t-1})
 *   dx = (dxn - xn (xn . dxn)) / r_x   (through the normalisation). */
#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double normalise(const double *x, int D, double eps, double *xn) {
    double ss = 0;
    for (int d = 0; d < D; d++) ss += x[d] * x[d];
    double r = sqrt(ss + eps);
    for (int d = 0; d < D; d++) xn[d] = x[d] / r;
    return r;
}

/* dx = (dxn - xn (xn . dxn)) / r */
static void normalise_back(const double *xn, double r, const double *dxn, int D, double *dx) {
    double p = 0;
    for (int d = 0; d < D; d++) p += xn[d] * dxn[d];
    for (int d = 0; d < D; d++) dx[d] = (dxn[d] - xn[d] * p) / r;
}

/* One step: S (D x M) from S_{t-1} to S_t; e gets v - S_{t-1}^T kn. */
static void step(int D, int M, double *S, const double *kn, const double *v, double beta, double *e) {
    for (int m = 0; m < M; m++) {
        double u = 0;
        for (int d = 0; d < D; d++) u += S[(size_t)d * M + m] * kn[d];
        e[m] = v[m] - u;
    }
    for (int d = 0; d < D; d++)
        for (int m = 0; m < M; m++) S[(size_t)d * M + m] += beta * kn[d] * e[m];
}

void ref_deltanet(const ref_shape *s, double eps, const double *q, const double *k, const double *v,
                  const double *beta, double *out) {
    const int N = s->N, D = s->D, M = s->M;
    double *S = malloc(sizeof(double) * (size_t)D * M), *qn = malloc(sizeof(double) * D),
           *kn = malloc(sizeof(double) * D), *e = malloc(sizeof(double) * M);
    for (int b = 0; b < s->B; b++) {
        const int L = s->lengths ? s->lengths[b] : N;
        for (int h = 0; h < s->H; h++) {
            const size_t bh = (size_t)b * s->H + h;
            memset(S, 0, sizeof(double) * (size_t)D * M);
            for (int t = 0; t < N; t++) {
                double *o = out + (bh * N + t) * M;
                memset(o, 0, sizeof(double) * M);
                if (t >= L) continue;
                normalise(q + (bh * N + t) * D, D, eps, qn);
                normalise(k + (bh * N + t) * D, D, eps, kn);
                step(D, M, S, kn, v + (bh * N + t) * M, beta[bh * N + t], e);
                for (int d = 0; d < D; d++)
                    for (int m = 0; m < M; m++) o[m] += S[(size_t)d * M + m] * qn[d];
            }
        }
    }
    free(S), free(qn), free(kn), free(e);
}

/* The reverse pass of one slice of valid length L: states[t] = S_t (t = 0..L, S_0 = 0). */
static void slice_backward(int L, int D, int M, double eps, const double *q, const double *k, const double *beta,
                           const double *states, const double *es, const double *dout, double *dq, double *dk,
                           double *dv, double *dbeta) {
    double *G = calloc((size_t)D * M, sizeof(double)), *qn = malloc(sizeof(double) * D),
           *kn = malloc(sizeof(double) * D), *dqn = malloc(sizeof(double) * D), *dkn = malloc(sizeof(double) * D),
           *gk = malloc(sizeof(double) * M);
    for (int t = L - 1; t >= 0; t--) {
        const double *St = states + (size_t)(t + 1) * D * M, *Sp = states + (size_t)t * D * M;
        const double *e = es + (size_t)t * M, *g = dout + (size_t)t * M, bt = beta[t];
        const double rq = normalise(q + (size_t)t * D, D, eps, qn), rk = normalise(k + (size_t)t * D, D, eps, kn);
        for (int d = 0; d < D; d++) {
            dqn[d] = 0;
            for (int m = 0; m < M; m++) {
                G[(size_t)d * M + m] += qn[d] * g[m];
                dqn[d] += St[(size_t)d * M + m] * g[m];
            }
        }
        double db = 0;
        for (int m = 0; m < M; m++) {
            gk[m] = 0;
            for (int d = 0; d < D; d++) gk[m] += G[(size_t)d * M + m] * kn[d];
            db += gk[m] * e[m];
            dv[(size_t)t * M + m] = bt * gk[m]; /* de */
        }
        dbeta[t] = db;
        const double *de = dv + (size_t)t * M;
        for (int d = 0; d < D; d++) {
            double ge = 0, sde = 0;
            for (int m = 0; m < M; m++) {
                ge += G[(size_t)d * M + m] * e[m];
                sde += Sp[(size_t)d * M + m] * de[m];
            }
            dkn[d] = bt * ge - sde;
        }
        for (int d = 0; d < D; d++)
            for (int m = 0; m < M; m++) G[(size_t)d * M + m] -= kn[d] * de[m];
        normalise_back(qn, rq, dqn, D, dq + (size_t)t * D);
        normalise_back(kn, rk, dkn, D, dk + (size_t)t * D);
    }
    free(G), free(qn), free(kn), free(dqn), free(dkn), free(gk);
}

void ref_deltanet_backward(const ref_shape *s, double eps, const double *q, const double *k, const double *v,
                           const double *beta, const double *dout, double *dq, double *dk, double *dv, double *dbeta) {
    const int N = s->N, D = s->D, M = s->M;
    double *states = malloc(sizeof(double) * (size_t)(N + 1) * D * M), *es = malloc(sizeof(double) * (size_t)N * M);
    double *kn = malloc(sizeof(double) * D);
    memset(dq, 0, sizeof(double) * (size_t)s->B * s->H * N * D);
    memset(dk, 0, sizeof(double) * (size_t)s->B * s->H * N * D);
    memset(dv, 0, sizeof(double) * (size_t)s->B * s->H * N * M);
    memset(dbeta, 0, sizeof(double) * (size_t)s->B * s->H * N);
    for (int b = 0; b < s->B; b++) {
        const int L = s->lengths ? s->lengths[b] : N;
        for (int h = 0; h < s->H; h++) {
            const size_t bh = (size_t)b * s->H + h;
            memset(states, 0, sizeof(double) * (size_t)D * M);
            for (int t = 0; t < L; t++) {
                double *S = states + (size_t)(t + 1) * D * M;
                memcpy(S, S - (size_t)D * M, sizeof(double) * (size_t)D * M);
                normalise(k + (bh * N + t) * D, D, eps, kn);
                step(D, M, S, kn, v + (bh * N + t) * M, beta[bh * N + t], es + (size_t)t * M);
            }
            slice_backward(L, D, M, eps, q + bh * N * D, k + bh * N * D, beta + bh * N, states, es,
                           dout + bh * N * M, dq + bh * N * D, dk + bh * N * D, dv + bh * N * M, dbeta + bh * N);
        }
    }
    free(states), free(es), free(kn);
}
