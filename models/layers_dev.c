/* Dispatch of the layers to the CPU (layers.h) or CUDA (layers_cuda.h). */
#include "layers_dev.h"

#include "../harness/device.h"
#include "../harness/error.h"

#include <string.h>

#ifdef ATTNBENCH_HAVE_CUDA
#include "layers_cuda.h"
/* CUDA: the call's result; CPU: the void call, then 0. */
#define DISPATCH(dev, cuda_call, cpu_call)                                                                             \
    do {                                                                                                               \
        if ((dev) == AB_DEV_CUDA) return cuda_call;                                                               \
        cpu_call;                                                                                                      \
        return 0;                                                                                                      \
    } while (0)
#else
#define NO_CUDA "this build has no CUDA backend (use the CPU)"
#define DISPATCH(dev, cuda_call, cpu_call)                                                                             \
    do {                                                                                                               \
        if ((dev) == AB_DEV_CUDA) return ab_fail(AB_EDEVICE, NO_CUDA);                                            \
        cpu_call;                                                                                                      \
        return 0;                                                                                                      \
    } while (0)
#endif

int ld_zero(ab_device dev, void *p, size_t bytes) {
    DISPATCH(dev, zero_cuda(p, bytes), if (bytes) memset(p, 0, bytes));
}

int ld_copy(ab_device dev, void *dst, const void *src, size_t bytes) {
    DISPATCH(dev, copy_cuda(dst, src, bytes), if (bytes && dst != src) memmove(dst, src, bytes));
}

static void rows_copy(float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) memcpy(dst + r * dst_ld, src + r * src_ld, sizeof(float) * cols);
}

int ld_rows_copy(ab_device dev, float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows,
                 size_t cols) {
    DISPATCH(dev, rows_copy_cuda(dst, (long long)dst_ld, src, (long long)src_ld, (long long)rows, (long long)cols),
             rows_copy(dst, dst_ld, src, src_ld, rows, cols));
}

int ld_embedding_forward(ab_device dev, float *out, const int *tokens, const float *wte, int BT, int C) {
    DISPATCH(dev, embedding_forward_cuda(out, tokens, wte, BT, C), embedding_forward(out, tokens, wte, BT, C));
}

int ld_embedding_backward(ab_device dev, float *dwte, const float *dout, const int *tokens, const int *order,
                          const int *starts, int BT, int C, int V) {
    (void)tokens, (void)order, (void)starts, (void)V;
    DISPATCH(dev, embedding_backward_cuda(dwte, dout, order, starts, V, C),
             embedding_backward(dwte, dout, tokens, BT, C));
}

int ld_positions_add(ab_device dev, float *x, const float *table, int B, int N, int C, int pos0) {
    DISPATCH(dev, positions_add_cuda(x, table, B, N, C, pos0), positions_add(x, table, B, N, C, pos0));
}

int ld_layernorm_forward(ab_device dev, float *out, float *mean, float *rstd, const float *x, const float *g,
                         const float *b, int BT, int C) {
    DISPATCH(dev, layernorm_forward_cuda(out, mean, rstd, x, g, b, BT, C),
             layernorm_forward(out, mean, rstd, x, g, b, BT, C));
}

int ld_layernorm_backward(ab_device dev, float *dx, float *dg, float *db, const float *dout, const float *x,
                          const float *g, const float *mean, const float *rstd, int BT, int C) {
    DISPATCH(dev, layernorm_backward_cuda(dx, dg, db, dout, x, g, mean, rstd, BT, C),
             layernorm_backward(dx, dg, db, dout, x, g, mean, rstd, BT, C));
}

int ld_dense_forward(ab_device dev, float *out, const float *x, const float *w, const float *b, int BT, int C,
                     int OC) {
    DISPATCH(dev, dense_forward_cuda(out, x, w, b, BT, C, OC), dense_forward(out, x, w, b, BT, C, OC));
}

int ld_dense_backward(ab_device dev, float *dx, float *dw, float *db, const float *dout, const float *x,
                      const float *w, int BT, int C, int OC) {
    DISPATCH(dev, dense_backward_cuda(dx, dw, db, dout, x, w, BT, C, OC),
             dense_backward(dx, dw, db, dout, x, w, BT, C, OC));
}

int ld_dropout_forward(ab_device dev, float *out, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed,
                       uint64_t stream) {
    DISPATCH(dev, dropout_forward_cuda(out, mask, x, n, p, seed, stream),
             dropout_forward(out, mask, x, n, p, seed, stream));
}

int ld_dropout_backward(ab_device dev, float *dx, const float *dout, const uint8_t *mask, size_t n, float p) {
    DISPATCH(dev, dropout_backward_cuda(dx, dout, mask, n, p), dropout_backward(dx, dout, mask, n, p));
}

int ld_ffn_forward(ab_device dev, float *out, float *hidden, uint8_t *mask, const float *x, const ffn_params *p,
                   int BT, int C, int F, float drop_p, uint64_t seed, uint64_t stream) {
    DISPATCH(dev, ffn_forward_cuda(out, hidden, mask, x, p, BT, C, F, drop_p, seed, stream),
             ffn_forward(out, hidden, mask, x, p, BT, C, F, drop_p, seed, stream));
}

int ld_ffn_backward(ab_device dev, float *dx, const ffn_grads *g, float *dhidden, const float *dout,
                    const float *x, const float *hidden, const uint8_t *mask, const ffn_params *p, int BT, int C,
                    int F, float drop_p) {
    DISPATCH(dev, ffn_backward_cuda(dx, g, dhidden, dout, x, hidden, mask, p, BT, C, F, drop_p),
             ffn_backward(dx, g, dhidden, dout, x, hidden, mask, p, BT, C, F, drop_p));
}

int ld_heads_split(ab_device dev, float *q, float *k, float *v, const float *qkv, int B, int N, int C, int H) {
    DISPATCH(dev, heads_split_cuda(q, k, v, qkv, B, N, C, H), heads_split(q, k, v, qkv, B, N, C, H));
}

int ld_heads_join(ab_device dev, float *dqkv, const float *dq, const float *dk, const float *dv, int B, int N,
                  int C, int H) {
    DISPATCH(dev, heads_join_cuda(dqkv, dq, dk, dv, B, N, C, H), heads_join(dqkv, dq, dk, dv, B, N, C, H));
}

int ld_heads_merge(ab_device dev, float *merged, const float *heads, int B, int N, int C, int H) {
    DISPATCH(dev, heads_merge_cuda(merged, heads, B, N, C, H), heads_merge(merged, heads, B, N, C, H));
}

int ld_heads_unmerge(ab_device dev, float *heads, const float *merged, int B, int N, int C, int H) {
    DISPATCH(dev, heads_unmerge_cuda(heads, merged, B, N, C, H), heads_unmerge(heads, merged, B, N, C, H));
}

int ld_embedding_positions(ab_device dev, float *out, const int *tokens, const float *wte, const float *table,
                           int B, int N, int C, int pos0) {
    DISPATCH(dev, embedding_positions_cuda(out, tokens, wte, table, B, N, C, pos0),
             embedding_positions(out, tokens, wte, table, B, N, C, pos0));
}

int ld_bias_heads_split(ab_device dev, float *q, float *k, float *v, const float *qkv, const float *bias, int B,
                        int N, int C, int H) {
    DISPATCH(dev, bias_heads_split_cuda(q, k, v, qkv, bias, B, N, C, H), bias_heads_split(q, k, v, qkv, bias, B, N, C, H));
}

int ld_bias_relu(ab_device dev, float *x, const float *b, int BT, int F) {
    DISPATCH(dev, bias_relu_cuda(x, b, BT, F), bias_relu(x, b, BT, F));
}

int ld_bias_residual_layernorm(ab_device dev, float *res, float *out, float *mean, float *rstd, const float *x,
                               const float *branch, const float *bias, const float *g, const float *b, int BT,
                               int C) {
    DISPATCH(dev, bias_residual_layernorm_cuda(res, out, mean, rstd, x, branch, bias, g, b, BT, C),
             bias_residual_layernorm(res, out, mean, rstd, x, branch, bias, g, b, BT, C));
}

int ld_residual_add(ab_device dev, float *out, const float *a, const float *b, size_t n) {
    DISPATCH(dev, residual_add_cuda(out, a, b, n), residual_add(out, a, b, n));
}

int ld_residual_acc(ab_device dev, float *y, const float *x, size_t n) {
    DISPATCH(dev, residual_acc_cuda(y, x, n), residual_acc(y, x, n));
}

size_t ld_cross_entropy_ws_bytes(ab_device dev, int BT) {
#ifdef ATTNBENCH_HAVE_CUDA
    if (dev == AB_DEV_CUDA) return cross_entropy_cuda_ws_bytes(BT);
#else
    (void)BT;
#endif
    (void)dev;
    return 0;
}

int ld_cross_entropy_forward(ab_device dev, ce_stats *st, float *nll, const float *logits, const int *targets,
                             const float *weights, int BT, int V, void *ws) {
    (void)ws;
    DISPATCH(dev, cross_entropy_forward_cuda(st, nll, logits, targets, weights, BT, V, ws),
             cross_entropy_forward(st, nll, logits, targets, weights, BT, V));
}

int ld_cross_entropy_backward(ab_device dev, float *dlogits, const float *logits, const int *targets,
                              const float *weights, double weight_sum, int BT, int V) {
    DISPATCH(dev, cross_entropy_backward_cuda(dlogits, logits, targets, weights, weight_sum, BT, V),
             cross_entropy_backward(dlogits, logits, targets, weights, weight_sum, BT, V));
}

int ld_mixture_forward(ab_device dev, ce_stats *st, float *nll, const float *out, const int *targets,
                       const float *weights, int BT, int K, void *ws) {
    (void)ws;
    DISPATCH(dev, mixture_forward_cuda(st, nll, out, targets, weights, BT, K, ws),
             mixture_forward(st, nll, out, targets, weights, BT, K));
}

int ld_mixture_backward(ab_device dev, float *dout, const float *out, const int *targets, const float *weights,
                        double weight_sum, int BT, int K) {
    DISPATCH(dev, mixture_backward_cuda(dout, out, targets, weights, weight_sum, BT, K),
             mixture_backward(dout, out, targets, weights, weight_sum, BT, K));
}

int ld_ctc_forward(ab_device dev, ce_stats *st, float *nll, const ctc_dims *d, const float *logits,
                   const int *lengths, const int *labels, const int *counts, const float *weights, void *ws) {
    DISPATCH(dev, ctc_forward_cuda(st, nll, d, logits, lengths, labels, counts, weights, ws),
             ctc_forward(st, nll, d, logits, lengths, labels, counts, weights, ws));
}

int ld_ctc_backward(ab_device dev, float *dlogits, const ctc_dims *d, const float *logits, const int *lengths,
                    const int *labels, const int *counts, const float *weights, double weight_sum, void *ws) {
    DISPATCH(dev, ctc_backward_cuda(dlogits, d, logits, lengths, labels, counts, weights, weight_sum, ws),
             ctc_backward(dlogits, d, logits, lengths, labels, counts, weights, weight_sum, ws));
}

int ld_lstm_step_forward(ab_device dev, const lstm_step_shape *s, float *gates, float *c, float *out, int out_ld,
                         float *h, float *cs, const float *hw) {
    DISPATCH(dev, lstm_step_forward_cuda(s, gates, c, out, out_ld, h, cs, hw),
             lstm_step_forward(s, gates, c, out, out_ld, h, cs, hw));
}

int ld_lstm_step_backward(ab_device dev, const lstm_step_shape *s, float *dgates, float *dstep, float *hprev,
                          float *dcs, const float *dh_rec, const float *dout, int dout_ld, const float *gates,
                          const float *c, const float *out, int out_ld) {
    DISPATCH(dev,
             lstm_step_backward_cuda(s, dgates, dstep, hprev, dcs, dh_rec, dout, dout_ld, gates, c, out, out_ld),
             lstm_step_backward(s, dgates, dstep, hprev, dcs, dh_rec, dout, dout_ld, gates, c, out, out_ld));
}
