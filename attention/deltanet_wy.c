/* The chunked form of deltanet's forward (Yang et al. 2024, the WY representation of
 * the products of the factors (I - beta_t kn_t kn_t^T)). Per chunk of n positions
 * with the state S before it (Kn, Qn: the chunk's normalised keys and queries, n x D;
 * V: n x M):
 *
 *   T = (I + strictly_lower(diag(beta) Kn Kn^T))^{-1} diag(beta)   (forward substitution:
 *       T[i, :] = beta_i (e_i - sum_{l<i} (kn_i . kn_l) T[l, :]), lower triangular)
 *   W = T Kn,  U = T V,  U' = U - W S
 *   O = Qn S + lower_incl(Qn Kn^T) U',  S <- S + Kn^T U'
 *
 * which gives the states and outputs of the recurrence at every position of the chunk
 * (u'_t = beta_t (v_t - S_{t-1}^T kn_t), the scan's beta_t e_t) in matrix products. */
#include "deltanet.h"

#include "cpu_util.h"

#include "../harness/blas.h"

#include <string.h>

size_t dn_wy_floats(int C, int D, int M) {
    const size_t c = (size_t)C;
    return 3 * c * (size_t)D + 2 * c * c + c * (size_t)M;
}

bool dn_wy_usable(const attn *a, int n, int C, int D, int M) {
    (void)a, (void)n, (void)D, (void)M;
    return C >= 2;
}

/* T (n x n, lower triangular, row stride n) from A = Kn Kn^T and beta. */
static void wy_solve(int n, const float *A, const float *beta, float *T) {
    memset(T, 0, sizeof(float) * (size_t)n * n);
    for (int i = 0; i < n; i++) {
        float *ti = T + (size_t)i * n;
        const float *ai = A + (size_t)i * n;
        for (int l = 0; l < i; l++) {
            const float c = ai[l];
            const float *tl = T + (size_t)l * n;
            for (int j = 0; j <= l; j++) ti[j] -= c * tl[j];
        }
        for (int j = 0; j < i; j++) ti[j] *= beta[i];
        ti[i] = beta[i];
    }
}

void dn_wy_chunk(int n, int D, int M, const float *q, const float *k, const float *v, const float *beta, float *S,
                 float *out, float *ws) {
    float *Kn = ws, *Qn = Kn + (size_t)n * D, *W = Qn + (size_t)n * D, *A = W + (size_t)n * D;
    float *T = A + (size_t)n * n, *U = T + (size_t)n * n;
    for (int i = 0; i < n; i++) {
        dn_normalise(k + (size_t)i * D, D, Kn + (size_t)i * D);
        if (out) dn_normalise(q + (size_t)i * D, D, Qn + (size_t)i * D);
    }
    ab_sgemm(false, true, n, n, D, 1.0f, Kn, D, Kn, D, 0.0f, A, n);
    wy_solve(n, A, beta, T);
    ab_sgemm(false, false, n, D, n, 1.0f, T, n, Kn, D, 0.0f, W, D);
    ab_sgemm(false, false, n, M, n, 1.0f, T, n, v, M, 0.0f, U, M);
    ab_sgemm(false, false, n, M, D, -1.0f, W, D, S, M, 1.0f, U, M); /* U' */
    if (out) {
        ab_sgemm(false, true, n, n, D, 1.0f, Qn, D, Kn, D, 0.0f, A, n);
        for (int i = 0; i < n; i++) memset(A + (size_t)i * n + i + 1, 0, sizeof(float) * (size_t)(n - 1 - i));
        ab_sgemm(false, false, n, M, D, 1.0f, Qn, D, S, M, 0.0f, out, M);
        ab_sgemm(false, false, n, M, n, 1.0f, A, n, U, M, 1.0f, out, M);
    }
    ab_sgemm(true, false, D, M, n, 1.0f, Kn, D, U, M, 1.0f, S, M);
}
