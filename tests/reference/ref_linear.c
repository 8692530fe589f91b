/* Plain double-precision linear attention: the similarity is computed directly for
 * every (i, j) pair, out_i = sum_j sim_ij v_j / (sum_j sim_ij + eps). */
#include "reference.h"

#include <math.h>
#include <stddef.h>

/* Same floor as the library's taylor map (attention/feature_maps.h): below it the
 * direction is x / floor, so a zero vector has cosine 0 with everything. */
#define REF_TAYLOR_FLOOR 1e-12

static double elu1(double x) { return x > 0 ? x + 1 : exp(x); }

static double sim_of(ref_sim sim, int D, double c, double scale, const double *q, const double *k) {
    double dot = 0, qq = 0, kk = 0, s = 0;
    switch (sim) {
    case REF_SIM_ELU:
        for (int a = 0; a < D; a++) s += elu1(q[a]) * elu1(k[a]);
        return s;
    case REF_SIM_TAYLOR:
        for (int a = 0; a < D; a++) {
            dot += q[a] * k[a];
            qq += q[a] * q[a];
            kk += k[a] * k[a];
        }
        return 1 + dot / (fmax(sqrt(qq), REF_TAYLOR_FLOOR) * fmax(sqrt(kk), REF_TAYLOR_FLOOR));
    case REF_SIM_POLY:
        for (int a = 0; a < D; a++) dot += q[a] * k[a];
        return (c + scale * dot) * (c + scale * dot);
    }
    return 0;
}

void ref_linear(const ref_shape *s, ref_sim sim, double c, double scale, double eps, const double *q,
                const double *k, const double *v, double *out) {
    const int N = s->N, D = s->D, M = s->M;
    for (int b = 0; b < s->B; b++) {
        int L = s->lengths ? s->lengths[b] : N;
        for (int h = 0; h < s->H; h++) {
            size_t bh = (size_t)b * s->H + h;
            const double *qs = q + bh * N * D, *ks = k + bh * N * D, *vs = v + bh * N * M;
            double *os = out + bh * N * M;
            for (int i = 0; i < N; i++) {
                double *oi = os + (size_t)i * M;
                for (int m = 0; m < M; m++) oi[m] = 0;
                if (i >= L) continue; /* padded query row: zero */
                double den = 0;
                int last = s->causal ? i : L - 1;
                for (int j = 0; j <= last; j++) {
                    double w = sim_of(sim, D, c, scale, qs + (size_t)i * D, ks + (size_t)j * D);
                    den += w;
                    for (int m = 0; m < M; m++) oi[m] += w * vs[(size_t)j * M + m];
                }
                for (int m = 0; m < M; m++) oi[m] /= den + eps;
            }
        }
    }
}
