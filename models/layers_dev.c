/* The checked entry points of layers_dev.h: each finds the device's table of layers
 * (ld_ops) by the device's index and calls its entry. The one place in the models that
 * knows which devices this build has. */
#include "layers_dev.h"

#include "../harness/error.h"

/* Each device's table, indexed by ab_device; a build without CUDA has none for it. */
static const ld_ops *const g_ops[AB_DEV_COUNT] = {
    [AB_DEV_CPU] = &ld_ops_cpu,
#ifdef ATTNBENCH_HAVE_CUDA
    [AB_DEV_CUDA] = &ld_ops_cuda,
#endif
};

static const ld_ops *ops_of(ab_device dev) { return (unsigned)dev < AB_DEV_COUNT ? g_ops[dev] : NULL; }

/* The error of a device without a table. */
static int no_ops(ab_device dev) {
    if ((unsigned)dev >= AB_DEV_COUNT) return ab_fail(AB_EINVAL, "unknown device %d", (int)dev);
    return ab_fail(AB_EDEVICE, "this build has no CUDA backend (use the CPU)");
}

int ld_zero(ab_device dev, void *p, size_t bytes) {
    const ld_ops *o = ops_of(dev);
    return o ? o->zero(p, bytes) : no_ops(dev);
}

int ld_copy(ab_device dev, void *dst, const void *src, size_t bytes) {
    const ld_ops *o = ops_of(dev);
    return o ? o->copy(dst, src, bytes) : no_ops(dev);
}

int ld_rows_copy(ab_device dev, float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows, size_t cols) {
    const ld_ops *o = ops_of(dev);
    return o ? o->rows_copy(dst, dst_ld, src, src_ld, rows, cols) : no_ops(dev);
}

int ld_draw_rows(ab_device dev, int *out, int *col, size_t col_ld, const float *x, size_t ld, int rows,
                 const draw_spec *d) {
    const ld_ops *o = ops_of(dev);
    return o ? o->draw_rows(out, col, col_ld, x, ld, rows, d) : no_ops(dev);
}

int ld_embedding_forward(ab_device dev, float *out, const int *tokens, const float *wte, int BT, int C) {
    const ld_ops *o = ops_of(dev);
    return o ? o->embedding_forward(out, tokens, wte, BT, C) : no_ops(dev);
}

int ld_embedding_backward(ab_device dev, float *dwte, const float *dout, const int *tokens, const int *order,
                          const int *starts, int BT, int C, int V) {
    const ld_ops *o = ops_of(dev);
    return o ? o->embedding_backward(dwte, dout, tokens, order, starts, BT, C, V) : no_ops(dev);
}

int ld_positions_add(ab_device dev, float *x, const float *table, int B, int N, int C, int pos0) {
    const ld_ops *o = ops_of(dev);
    return o ? o->positions_add(x, table, B, N, C, pos0) : no_ops(dev);
}

int ld_layernorm_forward(ab_device dev, float *out, float *mean, float *rstd, const float *x, const float *g,
                         const float *b, int BT, int C) {
    const ld_ops *o = ops_of(dev);
    return o ? o->layernorm_forward(out, mean, rstd, x, g, b, BT, C) : no_ops(dev);
}

int ld_layernorm_backward(ab_device dev, float *dx, float *dg, float *db, const float *dout, const float *x,
                          const float *g, const float *mean, const float *rstd, int BT, int C) {
    const ld_ops *o = ops_of(dev);
    return o ? o->layernorm_backward(dx, dg, db, dout, x, g, mean, rstd, BT, C) : no_ops(dev);
}

int ld_dense_forward(ab_device dev, float *out, const float *x, const float *w, const float *b, int BT, int C, int OC) {
    const ld_ops *o = ops_of(dev);
    return o ? o->dense_forward(out, x, w, b, BT, C, OC) : no_ops(dev);
}

int ld_dense_backward(ab_device dev, float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                      int BT, int C, int OC) {
    const ld_ops *o = ops_of(dev);
    return o ? o->dense_backward(dx, dw, db, dout, x, w, BT, C, OC) : no_ops(dev);
}

int ld_dropout_forward(ab_device dev, float *out, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed,
                       uint64_t stream, uint64_t first) {
    const ld_ops *o = ops_of(dev);
    return o ? o->dropout_forward(out, mask, x, n, p, seed, stream, first) : no_ops(dev);
}

int ld_dropout_backward(ab_device dev, float *dx, const float *dout, const uint8_t *mask, size_t n, float p) {
    const ld_ops *o = ops_of(dev);
    return o ? o->dropout_backward(dx, dout, mask, n, p) : no_ops(dev);
}

int ld_ffn_forward(ab_device dev, float *out, float *hidden, uint8_t *mask, const float *x, const ffn_params *p, int BT,
                   int C, int F, float drop_p, uint64_t seed, uint64_t stream, uint64_t first) {
    const ld_ops *o = ops_of(dev);
    return o ? o->ffn_forward(out, hidden, mask, x, p, BT, C, F, drop_p, seed, stream, first) : no_ops(dev);
}

int ld_ffn_backward(ab_device dev, float *dx, const ffn_grads *g, float *dhidden, const float *dout, const float *x,
                    const float *hidden, const uint8_t *mask, const ffn_params *p, int BT, int C, int F, float drop_p) {
    const ld_ops *o = ops_of(dev);
    return o ? o->ffn_backward(dx, g, dhidden, dout, x, hidden, mask, p, BT, C, F, drop_p) : no_ops(dev);
}

int ld_heads_split(ab_device dev, float *q, float *k, float *v, const float *qkv, int B, int N, int C, int H) {
    const ld_ops *o = ops_of(dev);
    return o ? o->heads_split(q, k, v, qkv, B, N, C, H) : no_ops(dev);
}

int ld_heads_join(ab_device dev, float *dqkv, const float *dq, const float *dk, const float *dv, int B, int N, int C,
                  int H) {
    const ld_ops *o = ops_of(dev);
    return o ? o->heads_join(dqkv, dq, dk, dv, B, N, C, H) : no_ops(dev);
}

int ld_heads_merge(ab_device dev, float *merged, const float *heads, int B, int N, int C, int H) {
    const ld_ops *o = ops_of(dev);
    return o ? o->heads_merge(merged, heads, B, N, C, H) : no_ops(dev);
}

int ld_heads_unmerge(ab_device dev, float *heads, const float *merged, int B, int N, int C, int H) {
    const ld_ops *o = ops_of(dev);
    return o ? o->heads_unmerge(heads, merged, B, N, C, H) : no_ops(dev);
}

int ld_embedding_positions(ab_device dev, float *out, const int *tokens, const float *wte, const float *table, int B,
                           int N, int C, int pos0) {
    const ld_ops *o = ops_of(dev);
    return o ? o->embedding_positions(out, tokens, wte, table, B, N, C, pos0) : no_ops(dev);
}

int ld_bias_heads_split(ab_device dev, float *q, float *k, float *v, const float *qkv, const float *bias, int B, int N,
                        int C, int H) {
    const ld_ops *o = ops_of(dev);
    return o ? o->bias_heads_split(q, k, v, qkv, bias, B, N, C, H) : no_ops(dev);
}

int ld_bias_relu(ab_device dev, float *x, const float *b, int BT, int F) {
    const ld_ops *o = ops_of(dev);
    return o ? o->bias_relu(x, b, BT, F) : no_ops(dev);
}

int ld_bias_residual_layernorm(ab_device dev, float *res, float *out, float *mean, float *rstd, const float *x,
                               const float *branch, const float *bias, const float *g, const float *b, int BT, int C) {
    const ld_ops *o = ops_of(dev);
    return o ? o->bias_residual_layernorm(res, out, mean, rstd, x, branch, bias, g, b, BT, C) : no_ops(dev);
}

int ld_residual_add(ab_device dev, float *out, const float *a, const float *b, size_t n) {
    const ld_ops *o = ops_of(dev);
    return o ? o->residual_add(out, a, b, n) : no_ops(dev);
}

int ld_scale(ab_device dev, float *x, size_t n, float s) {
    const ld_ops *o = ops_of(dev);
    return o ? o->scale(x, n, s) : no_ops(dev);
}

int ld_gate_act_forward(ab_device dev, float *x, size_t n, gate_act kind) {
    const ld_ops *o = ops_of(dev);
    return o ? o->gate_act_forward(x, n, kind) : no_ops(dev);
}

int ld_gate_act_backward(ab_device dev, float *d, const float *y, size_t n, gate_act kind) {
    const ld_ops *o = ops_of(dev);
    return o ? o->gate_act_backward(d, y, n, kind) : no_ops(dev);
}

int ld_residual_acc(ab_device dev, float *y, const float *x, size_t n) {
    const ld_ops *o = ops_of(dev);
    return o ? o->residual_acc(y, x, n) : no_ops(dev);
}

int ld_cross_entropy_forward(ab_device dev, ce_stats *st, float *nll, const float *logits, const int *targets,
                             const float *weights, int BT, int V, void *ws) {
    const ld_ops *o = ops_of(dev);
    return o ? o->cross_entropy_forward(st, nll, logits, targets, weights, BT, V, ws) : no_ops(dev);
}

int ld_cross_entropy_backward(ab_device dev, float *dlogits, const float *logits, const int *targets,
                              const float *weights, double weight_sum, int BT, int V) {
    const ld_ops *o = ops_of(dev);
    return o ? o->cross_entropy_backward(dlogits, logits, targets, weights, weight_sum, BT, V) : no_ops(dev);
}

int ld_mixture_forward(ab_device dev, ce_stats *st, float *nll, const float *out, const int *targets,
                       const float *weights, int BT, int K, void *ws) {
    const ld_ops *o = ops_of(dev);
    return o ? o->mixture_forward(st, nll, out, targets, weights, BT, K, ws) : no_ops(dev);
}

int ld_mixture_backward(ab_device dev, float *dout, const float *out, const int *targets, const float *weights,
                        double weight_sum, int BT, int K) {
    const ld_ops *o = ops_of(dev);
    return o ? o->mixture_backward(dout, out, targets, weights, weight_sum, BT, K) : no_ops(dev);
}

int ld_ctc_forward(ab_device dev, ce_stats *st, float *nll, const ctc_dims *d, const float *logits, const int *lengths,
                   const int *labels, const int *counts, const float *weights, void *ws) {
    const ld_ops *o = ops_of(dev);
    return o ? o->ctc_forward(st, nll, d, logits, lengths, labels, counts, weights, ws) : no_ops(dev);
}

int ld_ctc_backward(ab_device dev, float *dlogits, const ctc_dims *d, const float *logits, const int *lengths,
                    const int *labels, const int *counts, const float *weights, double weight_sum, void *ws) {
    const ld_ops *o = ops_of(dev);
    return o ? o->ctc_backward(dlogits, d, logits, lengths, labels, counts, weights, weight_sum, ws) : no_ops(dev);
}

int ld_lstm_step_forward(ab_device dev, const lstm_step_shape *s, float *gates, float *c, float *out, int out_ld,
                         float *h, float *cs, const float *hw) {
    const ld_ops *o = ops_of(dev);
    return o ? o->lstm_step_forward(s, gates, c, out, out_ld, h, cs, hw) : no_ops(dev);
}

int ld_lstm_step_backward(ab_device dev, const lstm_step_shape *s, float *dgates, float *dstep, float *hprev,
                          float *dcs, const float *dh_rec, const float *dout, int dout_ld, const float *gates,
                          const float *c, const float *out, int out_ld) {
    const ld_ops *o = ops_of(dev);
    return o ? o->lstm_step_backward(s, dgates, dstep, hprev, dcs, dh_rec, dout, dout_ld, gates, c, out,
                                     out_ld) : no_ops(dev);
}
int ld_gemm(ab_device dev, bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
            const float *b, int ldb, float beta, float *c, int ldc) {
    const ld_ops *o = ops_of(dev);
    return o ? o->gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) : no_ops(dev);
}

size_t ld_cross_entropy_ws_bytes(ab_device dev, int BT) {
    const ld_ops *o = ops_of(dev);
    return o ? o->cross_entropy_ws_bytes(BT) : 0;
}

ab_precision ld_set_gemm_precision(ab_device dev, ab_precision p) {
    const ld_ops *o = ops_of(dev);
    return o ? o->set_gemm_precision(p) : AB_PREC_FP32;
}

bool ld_token_index(ab_device dev) {
    const ld_ops *o = ops_of(dev);
    return o && o->token_index;
}
