/* Plain double-precision Efficient Attention (Shen et al.), written from its definition:
 *   Q'_id = exp(q_id) / sum_e exp(q_ie)            (each query row over its D features)
 *   K'_jd = exp(k_jd) / sum_{j' < L} exp(k_j'd)    (each key feature over the valid positions)
 *   out_i = sum_d Q'_id sum_{j < L} K'_jd v_j       (i < L; padded rows zero)
 * with the maxima subtracted inside the exponentials (they cancel). */
#include "reference.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

void ref_efficient(const ref_shape *s, const double *q, const double *k, const double *v, double *out) {
    const int N = s->N, D = s->D, M = s->M;
    double *kp = malloc(sizeof(double) * (size_t)N * D), *ctx = malloc(sizeof(double) * (size_t)D * M);
    double *qp = malloc(sizeof(double) * (size_t)D);
    for (int b = 0; b < s->B; b++) {
        int L = s->lengths ? s->lengths[b] : N;
        for (int h = 0; h < s->H; h++) {
            size_t slice = (size_t)b * s->H + (size_t)h;
            const double *qs = q + slice * N * D, *ks = k + slice * N * D, *vs = v + slice * N * M;
            double *os = out + slice * N * M;
            for (int d = 0; d < D; d++) {
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < L; j++) mx = fmax(mx, ks[(size_t)j * D + d]);
                for (int j = 0; j < L; j++) sum += exp(ks[(size_t)j * D + d] - mx);
                for (int j = 0; j < L; j++) kp[(size_t)j * D + d] = exp(ks[(size_t)j * D + d] - mx) / sum;
            }
            for (int d = 0; d < D; d++)
                for (int m = 0; m < M; m++) {
                    double c = 0;
                    for (int j = 0; j < L; j++) c += kp[(size_t)j * D + d] * vs[(size_t)j * M + m];
                    ctx[(size_t)d * M + m] = c;
                }
            for (int i = 0; i < N; i++) {
                double *o = os + (size_t)i * M;
                for (int m = 0; m < M; m++) o[m] = 0;
                if (i >= L) continue;
                double mx = -INFINITY, sum = 0;
                for (int d = 0; d < D; d++) mx = fmax(mx, qs[(size_t)i * D + d]);
                for (int d = 0; d < D; d++) sum += exp(qs[(size_t)i * D + d] - mx);
                for (int d = 0; d < D; d++) qp[d] = exp(qs[(size_t)i * D + d] - mx) / sum;
                for (int m = 0; m < M; m++)
                    for (int d = 0; d < D; d++) o[m] += qp[d] * ctx[(size_t)d * M + m];
            }
        }
    }
    free(kp);
    free(ctx);
    free(qp);
}
