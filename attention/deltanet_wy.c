/* The chunked form of deltanet's forward (Yang et al. 2024, the WY representation of
 * the products of the factors (I - beta_t kn_t kn_t^T)). Per chunk of n positions
 * with the state S before it (Kn, Qn: the chunk's normalised keys and queries, n x D;
 * V: n x M):
 *
 *   T = (I + strictly_lower(diag(beta) Kn Kn^T))^{-1} diag(beta)   (forward substitution:
 *       T[i, :] = beta_i (e_i - sum_{l<i} (kn_i . kn_l) T[l, :]), lower triangular)
 *   W = T Kn,  U = T V,  U' = U - W S = T Vs,  Vs = V - Kn S
 *   O = Qn S + lower_incl(Qn Kn^T) U',  S <- S + Kn^T U'
 * (computed as U' = T Vs: W is never formed).
 *
 * which gives the states and outputs of the recurrence at every position of the chunk
 * (u'_t = beta_t (v_t - S_{t-1}^T kn_t), the scan's beta_t e_t) in matrix products.
 *
 * Backward of a chunk, from its starting state S (saved by forward) and G = dL/dS after
 * it (X = (I + L)^{-1}, L = strictly_lower(diag(beta) A), A = Kn Kn^T, T = X diag(beta),
 * P = lower_incl(Qn Kn^T)), the chain rule through the products above in reverse:
 *   dU' = P^T dO + Kn G;  dP = lower_incl(dO U'^T);  dQn = dO S^T + dP Kn
 *   dKn = dP^T Qn + U' G^T;  dV = dVs = T^T dU';  dT = dU' Vs^T;  dKn -= dV S^T
 *   G <- G + Qn^T dO - Kn^T dV   (dL/dS before the chunk)
 *   dbeta_i = sum_r dT_ri X_ri + sum_{l<i} dL_il A_il,  dL = -X^T (dT diag(beta)) X^T
 *   dA = strictly_lower(diag(beta) dL);  dKn += (dA + dA^T) Kn
 * then dq, dk through the normalisation. Only the strictly lower part of dL is read,
 * so the entries of dT above X's support need no mask. */
#include "deltanet.h"

#include "cpu_util.h"

#include "small_gemm.h"

#include "../harness/blas.h"

#include <string.h>

size_t dn_wy_floats(int C, int D, int M) {
    const size_t c = (size_t)C;
    return 4 * c * (size_t)D + 7 * c * c + 3 * c * (size_t)M + 2 * c; /* the backward's; forward needs less */
}

/* Y (n x M) = X (n x D) W (D x M), overwritten: small_gemm.h's kernel where M fits it. */
static void rows_mul(int n, int D, int M, const float *X, const float *W, float *Y) {
    if (sg_fits(M)) sg_rows(n, D, M, X, D, W, M, Y, M);
    else ab_sgemm(false, false, n, M, D, 1.0f, X, D, W, M, 0.0f, Y, M);
}

/* W (D x M) += X^T Y, X (n x D), Y (n x M). */
static void outer_acc(int n, int D, int M, const float *X, const float *Y, float *W) {
    if (sg_fits(M)) sg_outer_acc(n, D, M, X, D, Y, M, W, M);
    else ab_sgemm(true, false, D, M, n, 1.0f, X, D, Y, M, 1.0f, W, M);
}

/* Vs = V - Kn S (n x M). */
static void values_less_state(int n, int D, int M, const float *Kn, const float *S, const float *v, float *Vs) {
    rows_mul(n, D, M, Kn, S, Vs);
    for (size_t i = 0; i < (size_t)n * M; i++) Vs[i] = v[i] - Vs[i];
}

bool dn_wy_usable(int C) { return C >= 2; }

/* X = (I + strictly_lower(diag(beta) A))^{-1} (n x n, unit lower triangular, row
 * stride n) by forward substitution: X[i, :] = e_i - beta_i sum_{l<i} A[i, l] X[l, :]. */
static void wy_inverse(int n, const float *A, const float *beta, float *X) {
    memset(X, 0, sizeof(float) * (size_t)n * n);
    for (int i = 0; i < n; i++) {
        float *xi = X + (size_t)i * n;
        const float *ai = A + (size_t)i * n;
        for (int l = 0; l < i; l++) {
            const float c = ai[l];
            const float *xl = X + (size_t)l * n;
            for (int j = 0; j <= l; j++) xi[j] -= c * xl[j];
        }
        for (int j = 0; j < i; j++) xi[j] *= beta[i];
        xi[i] = 1.0f;
    }
}

/* T = X diag(beta) (into T; X may be T). */
static void wy_scale_cols(int n, const float *X, const float *beta, float *T) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) T[(size_t)i * n + j] = X[(size_t)i * n + j] * beta[j];
}

/* Zeroes the entries above the diagonal of an n x n matrix. */
static void lower_incl(int n, float *P) {
    for (int i = 0; i < n; i++) memset(P + (size_t)i * n + i + 1, 0, sizeof(float) * (size_t)(n - 1 - i));
}

void dn_wy_chunk(int n, int D, int M, const float *q, const float *k, const float *v, const float *beta, float *S,
                 float *out, float *ws) {
    float *Kn = ws, *Qn = Kn + (size_t)n * D, *Vs = Qn + (size_t)n * D, *A = Vs + (size_t)n * M;
    float *T = A + (size_t)n * n, *U = T + (size_t)n * n;
    for (int i = 0; i < n; i++) {
        dn_normalise(k + (size_t)i * D, D, Kn + (size_t)i * D);
        if (out) dn_normalise(q + (size_t)i * D, D, Qn + (size_t)i * D);
    }
    ab_sgemm(false, true, n, n, D, 1.0f, Kn, D, Kn, D, 0.0f, A, n);
    wy_inverse(n, A, beta, T);
    wy_scale_cols(n, T, beta, T);
    values_less_state(n, D, M, Kn, S, v, Vs);
    rows_mul(n, n, M, T, Vs, U); /* U' */
    if (out) {
        ab_sgemm(false, true, n, n, D, 1.0f, Qn, D, Kn, D, 0.0f, A, n);
        lower_incl(n, A);
        rows_mul(n, D, M, Qn, S, out);
        ab_sgemm(false, false, n, M, n, 1.0f, A, n, U, M, 1.0f, out, M);
    }
    outer_acc(n, D, M, Kn, U, S);
}

/* ---- backward ---- */

typedef struct {
    float *Kn, *Qn, *dKn, *dQn; /* n x D */
    float *U, *dU, *Vs;         /* n x M: U', dU', V - Kn S */
    float *A, *X, *T, *P, *dP, *dT, *tmp; /* n x n */
    float *rk, *rq;                      /* n */
} wy_bwd;

static void wy_carve(float *w, int n, int D, int M, wy_bwd *b) {
    const size_t nd = (size_t)n * D, nm = (size_t)n * M, nn = (size_t)n * n;
    float **nds[4] = {&b->Kn, &b->Qn, &b->dKn, &b->dQn};
    for (int i = 0; i < 4; i++) *nds[i] = w, w += nd;
    b->U = w, w += nm;
    b->dU = w, w += nm;
    b->Vs = w, w += nm;
    float **nns[7] = {&b->A, &b->X, &b->T, &b->P, &b->dP, &b->dT, &b->tmp};
    for (int i = 0; i < 7; i++) *nns[i] = w, w += nn;
    b->rk = w, w += n;
    b->rq = w;
}

/* The chunk's forward again: Kn, Qn, A, X, T, Vs, U', P. */
static void wy_recompute(const wy_bwd *b, int n, int D, int M, const float *q, const float *k, const float *v,
                         const float *beta, const float *S) {
    for (int i = 0; i < n; i++) {
        b->rk[i] = dn_normalise(k + (size_t)i * D, D, b->Kn + (size_t)i * D);
        b->rq[i] = dn_normalise(q + (size_t)i * D, D, b->Qn + (size_t)i * D);
    }
    ab_sgemm(false, true, n, n, D, 1.0f, b->Kn, D, b->Kn, D, 0.0f, b->A, n);
    wy_inverse(n, b->A, beta, b->X);
    wy_scale_cols(n, b->X, beta, b->T);
    values_less_state(n, D, M, b->Kn, S, v, b->Vs);
    rows_mul(n, n, M, b->T, b->Vs, b->U);
    ab_sgemm(false, true, n, n, D, 1.0f, b->Qn, D, b->Kn, D, 0.0f, b->P, n);
    lower_incl(n, b->P);
}

/* dx = (dxn - xn (xn . dxn)) / r per row. */
static void wy_norm_back(int n, int D, const float *xn, const float *r, const float *dxn, float *dx) {
    for (int i = 0; i < n; i++) {
        const float *x = xn + (size_t)i * D, *g = dxn + (size_t)i * D;
        float p = 0;
        for (int d = 0; d < D; d++) p += x[d] * g[d];
        const float inv = 1.0f / r[i];
        for (int d = 0; d < D; d++) dx[(size_t)i * D + d] = (g[d] - x[d] * p) * inv;
    }
}

/* Through T = X diag(beta), X = (I + L)^{-1}, L = strictly_lower(diag(beta) A),
 * A = Kn Kn^T: dbeta (when not NULL) and dKn += (dA + dA^T) Kn. */
static void wy_back_solve(const wy_bwd *b, int n, int D, const float *beta, float *dbeta) {
    float *dX = b->dP; /* dP is spent */
    for (int r = 0; r < n; r++)
        for (int i = 0; i < n; i++) dX[(size_t)r * n + i] = b->dT[(size_t)r * n + i] * beta[i];
    if (dbeta)
        for (int i = 0; i < n; i++) {
            float s = 0;
            for (int r = i; r < n; r++) s += b->dT[(size_t)r * n + i] * b->X[(size_t)r * n + i];
            dbeta[i] = s;
        }
    /* dL = -X^T dX X^T; dA = strictly_lower(diag(beta) dL) */
    ab_sgemm(true, false, n, n, n, 1.0f, b->X, n, dX, n, 0.0f, b->tmp, n);
    ab_sgemm(false, true, n, n, n, -1.0f, b->tmp, n, b->X, n, 0.0f, b->dT, n);
    float *dA = b->dT;
    for (int i = 0; i < n; i++) {
        float s = 0;
        for (int l = 0; l < i; l++) {
            s += dA[(size_t)i * n + l] * b->A[(size_t)i * n + l];
            dA[(size_t)i * n + l] *= beta[i];
        }
        memset(dA + (size_t)i * n + i, 0, sizeof(float) * (size_t)(n - i));
        if (dbeta) dbeta[i] += s;
    }
    ab_sgemm(false, false, n, D, n, 1.0f, dA, n, b->Kn, D, 1.0f, b->dKn, D);
    ab_sgemm(true, false, n, D, n, 1.0f, dA, n, b->Kn, D, 1.0f, b->dKn, D);
}

void dn_wy_backward_chunk(int n, int D, int M, const float *q, const float *k, const float *v, const float *beta,
                          const float *S, float *G, const float *dout, float *dq, float *dk, float *dv, float *dbeta,
                          float *ws) {
    wy_bwd b;
    wy_carve(ws, n, D, M, &b);
    wy_recompute(&b, n, D, M, q, k, v, beta, S);
    /* dU' = Kn G + P^T dO;  dP = lower_incl(dO U'^T) */
    rows_mul(n, D, M, b.Kn, G, b.dU);
    ab_sgemm(true, false, n, M, n, 1.0f, b.P, n, dout, M, 1.0f, b.dU, M);
    ab_sgemm(false, true, n, n, M, 1.0f, dout, M, b.U, M, 0.0f, b.dP, n);
    lower_incl(n, b.dP);
    /* dQn = dO S^T + dP Kn;  dKn = dP^T Qn + U' G^T */
    ab_sgemm(false, true, n, D, M, 1.0f, dout, M, S, M, 0.0f, b.dQn, D);
    ab_sgemm(false, false, n, D, n, 1.0f, b.dP, n, b.Kn, D, 1.0f, b.dQn, D);
    ab_sgemm(true, false, n, D, n, 1.0f, b.dP, n, b.Qn, D, 0.0f, b.dKn, D);
    ab_sgemm(false, true, n, D, M, 1.0f, b.U, M, G, M, 1.0f, b.dKn, D);
    /* dV = T^T dU';  dT = dU' Vs^T;  dKn -= dV S^T;  G <- G + Qn^T dO - Kn^T dV */
    ab_sgemm(true, false, n, M, n, 1.0f, b.T, n, b.dU, M, 0.0f, dv, M);
    ab_sgemm(false, true, n, n, M, 1.0f, b.dU, M, b.Vs, M, 0.0f, b.dT, n);
    ab_sgemm(false, true, n, D, M, -1.0f, dv, M, S, M, 1.0f, b.dKn, D);
    outer_acc(n, D, M, b.Qn, dout, G);
    ab_sgemm(true, false, D, M, n, -1.0f, b.Kn, D, dv, M, 1.0f, G, M);
    wy_back_solve(&b, n, D, beta, dbeta);
    wy_norm_back(n, D, b.Qn, b.rq, b.dQn, dq);
    wy_norm_back(n, D, b.Kn, b.rk, b.dKn, dk);
}
