/* Softmax cross-entropy over V classes per position, weighted:
 * loss = sum_i w_i nll_i / sum_i w_i, nll_i = logsumexp(logits_i) - logits_i[t_i]. */
#include "layers.h"

#include <math.h>

#define CE_PAR_MIN 4096

void cross_entropy_forward(ce_stats *st, float *nll, const float *logits, const int *targets, const float *weights,
                           int BT, int V) {
    /* per-position values in parallel, then the sums in position order */
#pragma omp parallel for schedule(static) if ((size_t)BT * V > CE_PAR_MIN)
    for (int i = 0; i < BT; i++) {
        float w = weights ? weights[i] : 1.0f;
        if (!(w > 0.0f)) {
            nll[i] = 0.0f;
            continue;
        }
        const float *li = logits + (size_t)i * V;
        float mx = li[0];
        for (int v = 1; v < V; v++) mx = li[v] > mx ? li[v] : mx;
        double s = 0;
        for (int v = 0; v < V; v++) s += exp((double)li[v] - mx);
        nll[i] = (float)(log(s) + mx - (double)li[targets[i]]);
    }
    double sw = 0, swl = 0;
    long long correct = 0, counted = 0;
    for (int i = 0; i < BT; i++) {
        float w = weights ? weights[i] : 1.0f;
        if (!(w > 0.0f)) continue;
        const float *li = logits + (size_t)i * V;
        int am = 0;
        for (int v = 1; v < V; v++)
            if (li[v] > li[am]) am = v;
        correct += am == targets[i];
        counted++;
        sw += w;
        swl += (double)w * nll[i];
    }
    st->weight_sum = sw;
    st->loss = sw > 0 ? swl / sw : 0.0;
    st->correct = correct;
    st->counted = counted;
}

void cross_entropy_backward(float *dlogits, const float *logits, const int *targets, const float *weights,
                            double weight_sum, int BT, int V) {
    if (!(weight_sum > 0)) return;
#pragma omp parallel for schedule(static) if ((size_t)BT * V > CE_PAR_MIN)
    for (int i = 0; i < BT; i++) {
        float w = weights ? weights[i] : 1.0f;
        if (!(w > 0.0f)) continue;
        const float *li = logits + (size_t)i * V;
        float *di = dlogits + (size_t)i * V;
        float mx = li[0];
        for (int v = 1; v < V; v++) mx = li[v] > mx ? li[v] : mx;
        double s = 0;
        for (int v = 0; v < V; v++) s += exp((double)li[v] - mx);
        double scale = (double)w / weight_sum;
        for (int v = 0; v < V; v++) {
            double pv = exp((double)li[v] - mx) / s;
            di[v] += (float)(scale * (pv - (v == targets[i])));
        }
    }
}
