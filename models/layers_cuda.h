/* The position-wise layers of layers.h on the CUDA device (models/layers_cuda.cu):
 * the same shapes, formulas, accumulation rules (backward +=) and dropout masks, with
 * device pointers, and an int result (0, or an error code with the message of the
 * failed launch or cuBLAS call). Calls return once their work is queued on the
 * library's stream (harness/cuda_device.h); they allocate nothing.
 *
 * Where the results stand against the CPU's (tests/models/test_model_cuda.c measures them):
 * - bit for bit: embedding forward and backward (each row of dwte adds its positions
 *   in position order, as the CPU), positions, dropout masks and outputs, ReLU and its
 *   backward, heads, residuals;
 * - to float rounding: dense (cuBLAS), layer normalisation (row sums in double in
 *   another order; fused multiply-adds), cross-entropy (double row sums in another
 *   order), the logistic mixture (the CPU's double expressions, mixture_core.h, but
 *   the device's exp, log1p and expm1), dropout's backward (dx += dout * scale, which the device may fuse);
 *   every reduction over rows (bias, gain and embedding gradients, the loss)
 *   runs in a fixed order that does not depend on the launch, so two runs give the
 *   same bits. No atomics. */
#ifndef AB_MODELS_LAYERS_CUDA_H
#define AB_MODELS_LAYERS_CUDA_H

#include "layers.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- copies ---- */

/* dst = src (bytes, device to device) and p = 0, queued on the stream. */
int copy_cuda(void *dst, const void *src, size_t bytes);
int zero_cuda(void *p, size_t bytes);
/* rows x cols floats from src (row stride src_ld) to dst (row stride dst_ld) */
int rows_copy_cuda(float *dst, long long dst_ld, const float *src, long long src_ld, long long rows,
                   long long cols);

/* out[b] = the value drawn from row b of x (row stride ld) as d says (layers_dev.h:
 * ld_draw_rows) */
int draw_rows_cuda(int *out, int *col, size_t col_ld, const float *x, size_t ld, int rows, const draw_spec *d);

/* ---- layers.h on the device ---- */

int embedding_forward_cuda(float *out, const int *tokens, const float *wte, int BT, int C);
/* dwte (V, C) += dout rows grouped by token: order (BT) and starts (V + 1) are
 * embedding_token_index's, in device memory (the model builds them on the host with
 * the tokens it uploads). One thread per element of dwte adds its token's rows in
 * position order: no atomics, the CPU's sums exactly. */
int embedding_backward_cuda(float *dwte, const float *dout, const int *order, const int *starts, int V, int C);

/* table (device) as positions_table's, x (B, N, C) += table[pos0 + n] */
int positions_add_cuda(float *x, const float *table, int B, int N, int C, int pos0);

/* One warp per row (mean and variance in double, two passes); dg, db: a column
 * reduction in double over fixed blocks of rows, added in block order. */
int layernorm_forward_cuda(float *out, float *mean, float *rstd, const float *x, const float *g, const float *b,
                           int BT, int C);
int layernorm_backward_cuda(float *dx, float *dg, float *db, const float *dout, const float *x, const float *g,
                            const float *mean, const float *rstd, int BT, int C);

/* cuBLAS products (ab_cuda_sgemm); db: the column reduction of layernorm's. */
int dense_forward_cuda(float *out, const float *x, const float *w, const float *b, int BT, int C, int OC);
int dense_backward_cuda(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, int BT,
                        int C, int OC);

/* The masks of layers.h: element g = first + i from word g % 4 of Philox block g / 4
 * (harness/rng_core.h on the device) into position i, one thread per block of four. */
int dropout_mask_cuda(uint8_t *mask, size_t n, float p, uint64_t seed, uint64_t stream, uint64_t first);
int dropout_forward_cuda(float *out, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed,
                         uint64_t stream, uint64_t first);
int dropout_backward_cuda(float *dx, const float *dout, const uint8_t *mask, size_t n, float p);

int relu_forward_cuda(float *x, size_t n);
int relu_backward_cuda(float *dx, const float *dout, const float *y, size_t n);
int ffn_forward_cuda(float *out, float *hidden, uint8_t *mask, const float *x, const ffn_params *p, int BT, int C,
                     int F, float drop_p, uint64_t seed, uint64_t stream, uint64_t first);
int ffn_backward_cuda(float *dx, const ffn_grads *g, float *dhidden, const float *dout, const float *x,
                      const float *hidden, const uint8_t *mask, const ffn_params *p, int BT, int C, int F,
                      float drop_p);

int heads_split_cuda(float *q, float *k, float *v, const float *qkv, int B, int N, int C, int H);
int heads_join_cuda(float *dqkv, const float *dq, const float *dk, const float *dv, int B, int N, int C, int H);
int heads_merge_cuda(float *merged, const float *heads, int B, int N, int C, int H);
int heads_unmerge_cuda(float *heads, const float *merged, int B, int N, int C, int H);

/* The fused layers of layers.h (fused.c): the same float operations; the layer norm's
 * a warp per row as layernorm_forward_cuda's. */
int embedding_positions_cuda(float *out, const int *tokens, const float *wte, const float *table, int B, int N, int C,
                             int pos0);
int bias_heads_split_cuda(float *q, float *k, float *v, const float *qkv, const float *bias, int B, int N, int C,
                          int H);
int bias_relu_cuda(float *x, const float *b, int BT, int F);
int bias_residual_layernorm_cuda(float *res, float *out, float *mean, float *rstd, const float *x,
                                 const float *branch, const float *bias, const float *g, const float *b, int BT,
                                 int C);

int residual_add_cuda(float *out, const float *a, const float *b, size_t n);
int residual_acc_cuda(float *y, const float *x, size_t n);
int scale_inplace_cuda(float *x, size_t n, float s);
int gate_act_forward_cuda(float *x, size_t n, gate_act kind);
int gate_act_backward_cuda(float *d, const float *y, size_t n, gate_act kind);

/* Device scratch of cross_entropy_forward_cuda for BT positions (bytes). */
size_t cross_entropy_cuda_ws_bytes(int BT);
/* As cross_entropy_forward: logits, targets, weights (or NULL), nll and ws (of
 * cross_entropy_cuda_ws_bytes) in device memory, st on the host. One warp per
 * position (max, sum of exponentials in double, first argmax); the sums over
 * positions in double by one block in a fixed order. Waits for the device: st is
 * filled when it returns. */
int cross_entropy_forward_cuda(ce_stats *st, float *nll, const float *logits, const int *targets,
                               const float *weights, int BT, int V, void *ws);
/* As cross_entropy_backward (weight_sum from the forward's st) */
int cross_entropy_backward_cuda(float *dlogits, const float *logits, const int *targets, const float *weights,
                                double weight_sum, int BT, int V);

/* As mixture_forward, with the scratch of cross_entropy_cuda_ws_bytes(BT) (the same
 * layout): one warp per position (lane 0 its -log P(target), the CPU's expressions of
 * mixture_core.h; the most probable value over the warp's lanes, each value's mass by
 * mix_bin_prob, which is the CPU's to ~1e-13 relative, so `correct` can differ from
 * the CPU's only where two values' masses tie that closely); the sums as the
 * cross-entropy's. Waits for the device: st is filled when it returns. */
int mixture_forward_cuda(ce_stats *st, float *nll, const float *out, const int *targets, const float *weights,
                         int BT, int K, void *ws);
/* As mixture_backward: one thread per position. */
int mixture_backward_cuda(float *dout, const float *out, const int *targets, const float *weights,
                          double weight_sum, int BT, int K);

#ifdef __cplusplus
}
#endif

#endif
