/* The CPU's table of layers (layers_dev.h): the layers of layers.h, ctc.h and
 * lstm_step.h, which cannot fail, wrapped to return 0; matrix products through
 * OpenBLAS (blas.h). */
#include "layers_dev.h"

#include "../harness/blas.h"
#include "../harness/rng.h"
#include "draw_core.h"

#include <string.h>

static int cpu_zero(void *p, size_t bytes) {
    if (bytes) memset(p, 0, bytes);
    return 0;
}

static int cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) memmove(dst, src, bytes);
    return 0;
}

static int cpu_rows_copy(float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) memcpy(dst + r * dst_ld, src + r * src_ld, sizeof(float) * cols);
    return 0;
}

static int cpu_draw_rows(int *out, int *col, size_t col_ld, const float *x, size_t ld, int rows,
                         const draw_spec *d) {
#pragma omp parallel for schedule(static) if (rows > 64)
    for (int b = 0; b < rows; b++) {
        const uint64_t i = d->idx0 + (uint64_t)b * d->idx_stride;
        const float *r = x + (size_t)b * ld;
        const double u = ab_rng_uniform(d->seed, d->stream, i);
        const int v = d->mixture ? draw_mixture_core(r, d->n, u, ab_rng_uniform(d->seed, d->stream2, i))
                                 : draw_categorical_core(r, d->n, d->temperature, u);
        out[b] = v;
        if (col) col[(size_t)b * col_ld] = v;
    }
    return 0;
}

static int cpu_embedding_forward(float *out, const int *tokens, const float *wte, int BT, int C) {
    embedding_forward(out, tokens, wte, BT, C);
    return 0;
}

static int cpu_embedding_backward(float *dwte, const float *dout, const int *tokens, const int *order,
                                  const int *starts, int BT, int C, int V) {
    (void)order, (void)starts, (void)V;
    embedding_backward(dwte, dout, tokens, BT, C);
    return 0;
}

static int cpu_positions_add(float *x, const float *table, int B, int N, int C, int pos0) {
    positions_add(x, table, B, N, C, pos0);
    return 0;
}

static int cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *g, const float *b,
                                 int BT, int C) {
    layernorm_forward(out, mean, rstd, x, g, b, BT, C);
    return 0;
}

static int cpu_layernorm_backward(float *dx, float *dg, float *db, const float *dout, const float *x, const float *g,
                                  const float *mean, const float *rstd, int BT, int C) {
    layernorm_backward(dx, dg, db, dout, x, g, mean, rstd, BT, C);
    return 0;
}

static int cpu_dense_forward(float *out, const float *x, const float *w, const float *b, int BT, int C, int OC) {
    dense_forward(out, x, w, b, BT, C, OC);
    return 0;
}

static int cpu_dense_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                              int BT, int C, int OC) {
    dense_backward(dx, dw, db, dout, x, w, BT, C, OC);
    return 0;
}

static int cpu_dropout_forward(float *out, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed,
                               uint64_t stream, uint64_t first) {
    dropout_forward_at(out, mask, x, n, p, seed, stream, first);
    return 0;
}

static int cpu_dropout_backward(float *dx, const float *dout, const uint8_t *mask, size_t n, float p) {
    dropout_backward(dx, dout, mask, n, p);
    return 0;
}

static int cpu_ffn_forward(float *out, float *hidden, uint8_t *mask, const float *x, const ffn_params *p, int BT, int C,
                           int F, float drop_p, uint64_t seed, uint64_t stream, uint64_t first) {
    ffn_forward(out, hidden, mask, x, p, BT, C, F, drop_p, seed, stream, first);
    return 0;
}

static int cpu_ffn_backward(float *dx, const ffn_grads *g, float *dhidden, const float *dout, const float *x,
                            const float *hidden, const uint8_t *mask, const ffn_params *p, int BT, int C, int F,
                            float drop_p) {
    ffn_backward(dx, g, dhidden, dout, x, hidden, mask, p, BT, C, F, drop_p);
    return 0;
}

static int cpu_heads_split(float *q, float *k, float *v, const float *qkv, int B, int N, int C, int H) {
    heads_split(q, k, v, qkv, B, N, C, H);
    return 0;
}

static int cpu_heads_join(float *dqkv, const float *dq, const float *dk, const float *dv, int B, int N, int C, int H) {
    heads_join(dqkv, dq, dk, dv, B, N, C, H);
    return 0;
}

static int cpu_heads_merge(float *merged, const float *heads, int B, int N, int C, int H) {
    heads_merge(merged, heads, B, N, C, H);
    return 0;
}

static int cpu_heads_unmerge(float *heads, const float *merged, int B, int N, int C, int H) {
    heads_unmerge(heads, merged, B, N, C, H);
    return 0;
}

static int cpu_embedding_positions(float *out, const int *tokens, const float *wte, const float *table, int B, int N,
                                   int C, int pos0) {
    embedding_positions(out, tokens, wte, table, B, N, C, pos0);
    return 0;
}

static int cpu_bias_heads_split(float *q, float *k, float *v, const float *qkv, const float *bias, int B, int N, int C,
                                int H) {
    bias_heads_split(q, k, v, qkv, bias, B, N, C, H);
    return 0;
}

static int cpu_bias_relu(float *x, const float *b, int BT, int F) {
    bias_relu(x, b, BT, F);
    return 0;
}

static int cpu_bias_residual_layernorm(float *res, float *out, float *mean, float *rstd, const float *x,
                                       const float *branch, const float *bias, const float *g, const float *b, int BT,
                                       int C) {
    bias_residual_layernorm(res, out, mean, rstd, x, branch, bias, g, b, BT, C);
    return 0;
}

static int cpu_residual_add(float *out, const float *a, const float *b, size_t n) {
    residual_add(out, a, b, n);
    return 0;
}

static int cpu_scale(float *x, size_t n, float s) {
    scale_inplace(x, n, s);
    return 0;
}

static int cpu_gate_act_forward(float *x, size_t n, gate_act kind) {
    gate_act_forward(x, n, kind);
    return 0;
}

static int cpu_gate_act_backward(float *d, const float *y, size_t n, gate_act kind) {
    gate_act_backward(d, y, n, kind);
    return 0;
}

static int cpu_residual_acc(float *y, const float *x, size_t n) {
    residual_acc(y, x, n);
    return 0;
}

static int cpu_cross_entropy_forward(ce_stats *st, float *nll, const float *logits, const int *targets,
                                     const float *weights, int BT, int V, void *ws) {
    (void)ws;
    cross_entropy_forward(st, nll, logits, targets, weights, BT, V);
    return 0;
}

static int cpu_cross_entropy_backward(float *dlogits, const float *logits, const int *targets, const float *weights,
                                      double weight_sum, int BT, int V) {
    cross_entropy_backward(dlogits, logits, targets, weights, weight_sum, BT, V);
    return 0;
}

static int cpu_mixture_forward(ce_stats *st, float *nll, const float *out, const int *targets, const float *weights,
                               int BT, int K, void *ws) {
    (void)ws;
    mixture_forward(st, nll, out, targets, weights, BT, K);
    return 0;
}

static int cpu_mixture_backward(float *dout, const float *out, const int *targets, const float *weights,
                                double weight_sum, int BT, int K) {
    mixture_backward(dout, out, targets, weights, weight_sum, BT, K);
    return 0;
}

static int cpu_ctc_forward(ce_stats *st, float *nll, const ctc_dims *d, const float *logits, const int *lengths,
                           const int *labels, const int *counts, const float *weights, void *ws) {
    ctc_forward(st, nll, d, logits, lengths, labels, counts, weights, ws);
    return 0;
}

static int cpu_ctc_backward(float *dlogits, const ctc_dims *d, const float *logits, const int *lengths,
                            const int *labels, const int *counts, const float *weights, double weight_sum, void *ws) {
    ctc_backward(dlogits, d, logits, lengths, labels, counts, weights, weight_sum, ws);
    return 0;
}

static int cpu_lstm_step_forward(const lstm_step_shape *s, float *gates, float *c, float *out, int out_ld, float *h,
                                 float *cs, const float *hw) {
    lstm_step_forward(s, gates, c, out, out_ld, h, cs, hw);
    return 0;
}

static int cpu_lstm_step_backward(const lstm_step_shape *s, float *dgates, float *dstep, float *hprev, float *dcs,
                                  const float *dh_rec, const float *dout, int dout_ld, const float *gates,
                                  const float *c, const float *out, int out_ld) {
    lstm_step_backward(s, dgates, dstep, hprev, dcs, dh_rec, dout, dout_ld, gates, c, out, out_ld);
    return 0;
}

static int cpu_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                    int ldb, float beta, float *c, int ldc) {
    ab_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return 0;
}
static size_t cpu_cross_entropy_ws_bytes(int BT) {
    (void)BT;
    return 0;
}

/* The CPU computes in fp32 only (the configs refuse another precision for it). */
static ab_precision cpu_set_gemm_precision(ab_precision p) {
    (void)p;
    return AB_PREC_FP32;
}

const ld_ops ld_ops_cpu = {
    .zero = cpu_zero,
    .copy = cpu_copy,
    .rows_copy = cpu_rows_copy,
    .draw_rows = cpu_draw_rows,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .positions_add = cpu_positions_add,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .dense_forward = cpu_dense_forward,
    .dense_backward = cpu_dense_backward,
    .dropout_forward = cpu_dropout_forward,
    .dropout_backward = cpu_dropout_backward,
    .ffn_forward = cpu_ffn_forward,
    .ffn_backward = cpu_ffn_backward,
    .heads_split = cpu_heads_split,
    .heads_join = cpu_heads_join,
    .heads_merge = cpu_heads_merge,
    .heads_unmerge = cpu_heads_unmerge,
    .embedding_positions = cpu_embedding_positions,
    .bias_heads_split = cpu_bias_heads_split,
    .bias_relu = cpu_bias_relu,
    .bias_residual_layernorm = cpu_bias_residual_layernorm,
    .residual_add = cpu_residual_add,
    .residual_acc = cpu_residual_acc,
    .scale = cpu_scale,
    .gate_act_forward = cpu_gate_act_forward,
    .gate_act_backward = cpu_gate_act_backward,
    .cross_entropy_forward = cpu_cross_entropy_forward,
    .cross_entropy_backward = cpu_cross_entropy_backward,
    .mixture_forward = cpu_mixture_forward,
    .mixture_backward = cpu_mixture_backward,
    .ctc_forward = cpu_ctc_forward,
    .ctc_backward = cpu_ctc_backward,
    .lstm_step_forward = cpu_lstm_step_forward,
    .lstm_step_backward = cpu_lstm_step_backward,
    .gemm = cpu_gemm,
    .cross_entropy_ws_bytes = cpu_cross_entropy_ws_bytes,
    .set_gemm_precision = cpu_set_gemm_precision,
    .token_index = false,
};
