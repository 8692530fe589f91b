/* Feed-forward block as in the paper's library (fast-transformers'
 * TransformerEncoderLayer): dense (C -> F) -> ReLU -> dropout -> dense (F -> C).
 * The output dropout of the residual branch belongs to the encoder layer. */
#include "layers.h"

#include <string.h>

#define FFN_PAR_MIN 16384

void relu_forward(float *x, size_t n) {
#pragma omp parallel for schedule(static) if (n > FFN_PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void relu_backward(float *dx, const float *dout, const float *y, size_t n) {
#pragma omp parallel for schedule(static) if (n > FFN_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        if (y[i] > 0.0f) dx[i] += dout[i];
}

void ffn_forward(float *out, float *hidden, uint8_t *mask, const float *x, const ffn_params *p, int BT, int C, int F,
                 float drop_p, uint64_t seed, uint64_t stream, uint64_t first) {
    size_t nh = (size_t)BT * F;
    dense_forward(hidden, x, p->w1, p->b1, BT, C, F); /* (BT, F) */
    relu_forward(hidden, nh);
    if (mask) dropout_forward_at(hidden, mask, hidden, nh, drop_p, seed, stream, first);
    dense_forward(out, hidden, p->w2, p->b2, BT, F, C); /* (BT, C) */
}

void ffn_backward(float *dx, const ffn_grads *g, float *dhidden, const float *dout, const float *x,
                  const float *hidden, const uint8_t *mask, const ffn_params *p, int BT, int C, int F, float drop_p) {
    size_t nh = (size_t)BT * F;
    /* dhidden = d(drop(relu(h))) */
    memset(dhidden, 0, sizeof(float) * nh);
    dense_backward(dhidden, g->w2, g->b2, dout, hidden, p->w2, BT, F, C);
    /* through dropout and ReLU in place: element-wise, each element read before it is
     * written, and hidden > 0 exactly where both the mask kept it and the ReLU passed */
    float scale = mask ? 1.0f / (1.0f - drop_p) : 1.0f;
#pragma omp parallel for schedule(static) if (nh > FFN_PAR_MIN)
    for (size_t i = 0; i < nh; i++) dhidden[i] = hidden[i] > 0.0f ? dhidden[i] * scale : 0.0f;
    dense_backward(dx, g->w1, g->b1, dhidden, x, p->w1, BT, C, F);
}
