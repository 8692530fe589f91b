/* The layers on the device their tensors live on: each call runs the CPU layer
 * (layers.h) or the CUDA one (layers_cuda.h) for `dev` through that device's table of
 * layers, ld_ops (as attention's calls reach a variant's attn_backend), so the blocks
 * built from them (mha.c, encoder.c, lstm.c) and the model (transformer.c) are written
 * once for both. Arguments as in layers.h, pointers in memory of `dev`; 0 or an error
 * code with its message (on the CPU always 0). In a build without CUDA there is no
 * table for AB_DEV_CUDA and its calls fail with AB_EDEVICE (a model cannot get there:
 * its attention fails first); a device outside the enum fails with AB_EINVAL. */
#ifndef AB_MODELS_LAYERS_DEV_H
#define AB_MODELS_LAYERS_DEV_H

#include "attention.h"
#include "../harness/cuda_blas.h"
#include "ctc.h"
#include "layers.h"
#include "lstm_step.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One device's layers. Each entry takes the arguments of its ld_* function below,
 * without the device. */
typedef struct {
    int (*zero)(void *p, size_t bytes);
    int (*copy)(void *dst, const void *src, size_t bytes);
    int (*rows_copy)(float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows, size_t cols);
    int (*draw_rows)(int *out, int *col, size_t col_ld, const float *x, size_t ld, int rows, const draw_spec *d);
    int (*embedding_forward)(float *out, const int *tokens, const float *wte, int BT, int C);
    int (*embedding_backward)(float *dwte, const float *dout, const int *tokens, const int *order, const int *starts,
                              int BT, int C, int V);
    int (*positions_add)(float *x, const float *table, int B, int N, int C, int pos0);
    int (*layernorm_forward)(float *out, float *mean, float *rstd, const float *x, const float *g, const float *b,
                             int BT, int C);
    int (*layernorm_backward)(float *dx, float *dg, float *db, const float *dout, const float *x, const float *g,
                              const float *mean, const float *rstd, int BT, int C);
    int (*dense_forward)(float *out, const float *x, const float *w, const float *b, int BT, int C, int OC);
    int (*dense_backward)(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, int BT,
                          int C, int OC);
    int (*dropout_forward)(float *out, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed,
                           uint64_t stream, uint64_t first);
    int (*dropout_backward)(float *dx, const float *dout, const uint8_t *mask, size_t n, float p);
    int (*ffn_forward)(float *out, float *hidden, uint8_t *mask, const float *x, const ffn_params *p, int BT, int C,
                       int F, float drop_p, uint64_t seed, uint64_t stream, uint64_t first);
    int (*ffn_backward)(float *dx, const ffn_grads *g, float *dhidden, const float *dout, const float *x,
                        const float *hidden, const uint8_t *mask, const ffn_params *p, int BT, int C, int F,
                        float drop_p);
    int (*heads_split)(float *q, float *k, float *v, const float *qkv, int B, int N, int C, int H);
    int (*heads_join)(float *dqkv, const float *dq, const float *dk, const float *dv, int B, int N, int C, int H);
    int (*heads_merge)(float *merged, const float *heads, int B, int N, int C, int H);
    int (*heads_unmerge)(float *heads, const float *merged, int B, int N, int C, int H);
    int (*embedding_positions)(float *out, const int *tokens, const float *wte, const float *table, int B, int N, int C,
                               int pos0);
    int (*bias_heads_split)(float *q, float *k, float *v, const float *qkv, const float *bias, int B, int N, int C,
                            int H);
    int (*bias_relu)(float *x, const float *b, int BT, int F);
    int (*bias_residual_layernorm)(float *res, float *out, float *mean, float *rstd, const float *x,
                                   const float *branch, const float *bias, const float *g, const float *b, int BT,
                                   int C);
    int (*residual_add)(float *out, const float *a, const float *b, size_t n);
    int (*residual_acc)(float *y, const float *x, size_t n);
    int (*scale)(float *x, size_t n, float s);
    int (*gate_act_forward)(float *x, size_t n, gate_act kind);
    int (*gate_act_backward)(float *d, const float *y, size_t n, gate_act kind);
    int (*cross_entropy_forward)(ce_stats *st, float *nll, const float *logits, const int *targets,
                                 const float *weights, int BT, int V, void *ws);
    int (*cross_entropy_backward)(float *dlogits, const float *logits, const int *targets, const float *weights,
                                  double weight_sum, int BT, int V);
    int (*mixture_forward)(ce_stats *st, float *nll, const float *out, const int *targets, const float *weights, int BT,
                           int K, void *ws);
    int (*mixture_backward)(float *dout, const float *out, const int *targets, const float *weights, double weight_sum,
                            int BT, int K);
    int (*ctc_forward)(ce_stats *st, float *nll, const ctc_dims *d, const float *logits, const int *lengths,
                       const int *labels, const int *counts, const float *weights, void *ws);
    int (*ctc_backward)(float *dlogits, const ctc_dims *d, const float *logits, const int *lengths, const int *labels,
                        const int *counts, const float *weights, double weight_sum, void *ws);
    int (*lstm_step_forward)(const lstm_step_shape *s, float *gates, float *c, float *out, int out_ld, float *h,
                             float *cs, const float *hw);
    int (*lstm_step_backward)(const lstm_step_shape *s, float *dgates, float *dstep, float *hprev, float *dcs,
                              const float *dh_rec, const float *dout, int dout_ld, const float *gates, const float *c,
                              const float *out, int out_ld);
    int (*gemm)(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                float beta, float *c, int ldc);
    /* scratch cross_entropy_forward and mixture_forward need (0: none) */
    size_t (*cross_entropy_ws_bytes)(int BT);
    /* the precision of the matrix products that follow (cuda_blas.h); returns the
     * previous one (a device without a choice: fp32, and nothing changes) */
    ab_precision (*set_gemm_precision)(ab_precision p);
    /* embedding_backward reads embedding_token_index's order and starts (else the tokens) */
    bool token_index;
} ld_ops;

/* The CPU's table (layers_cpu.c) and, in a build with CUDA, the CUDA device's
 * (layers_cuda_ops.c). */
extern const ld_ops ld_ops_cpu;
#ifdef ATTNBENCH_HAVE_CUDA
extern const ld_ops ld_ops_cuda;
#endif

int ld_zero(ab_device dev, void *p, size_t bytes);
int ld_copy(ab_device dev, void *dst, const void *src, size_t bytes);
/* rows x cols floats between row strides (logits rows for generation) */
int ld_rows_copy(ab_device dev, float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows,
                 size_t cols);
/* out[b] (rows ints) = the value drawn from row b of x (its outputs at x + b ld) as d
 * says (layers.h: draw_spec), and the same value into col[b col_ld] unless col is NULL
 * (a column of a table); one thread per row on CUDA, in the host's order. */
int ld_draw_rows(ab_device dev, int *out, int *col, size_t col_ld, const float *x, size_t ld, int rows,
                 const draw_spec *d);

int ld_embedding_forward(ab_device dev, float *out, const int *tokens, const float *wte, int BT, int C);
/* CPU: from tokens; CUDA: from embedding_token_index's order and starts (V + 1) */
int ld_embedding_backward(ab_device dev, float *dwte, const float *dout, const int *tokens, const int *order,
                          const int *starts, int BT, int C, int V);
int ld_positions_add(ab_device dev, float *x, const float *table, int B, int N, int C, int pos0);
int ld_layernorm_forward(ab_device dev, float *out, float *mean, float *rstd, const float *x, const float *g,
                         const float *b, int BT, int C);
int ld_layernorm_backward(ab_device dev, float *dx, float *dg, float *db, const float *dout, const float *x,
                          const float *g, const float *mean, const float *rstd, int BT, int C);
int ld_dense_forward(ab_device dev, float *out, const float *x, const float *w, const float *b, int BT, int C,
                     int OC);
int ld_dense_backward(ab_device dev, float *dx, float *dw, float *db, const float *dout, const float *x,
                      const float *w, int BT, int C, int OC);
/* first: the element of the (seed, stream) sequence that element 0 takes
 * (dropout_forward_at, layers.h) */
int ld_dropout_forward(ab_device dev, float *out, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed,
                       uint64_t stream, uint64_t first);
int ld_dropout_backward(ab_device dev, float *dx, const float *dout, const uint8_t *mask, size_t n, float p);
int ld_ffn_forward(ab_device dev, float *out, float *hidden, uint8_t *mask, const float *x, const ffn_params *p,
                   int BT, int C, int F, float drop_p, uint64_t seed, uint64_t stream, uint64_t first);
int ld_ffn_backward(ab_device dev, float *dx, const ffn_grads *g, float *dhidden, const float *dout,
                    const float *x, const float *hidden, const uint8_t *mask, const ffn_params *p, int BT, int C,
                    int F, float drop_p);
int ld_heads_split(ab_device dev, float *q, float *k, float *v, const float *qkv, int B, int N, int C, int H);
int ld_heads_join(ab_device dev, float *dqkv, const float *dq, const float *dk, const float *dv, int B, int N,
                  int C, int H);
int ld_heads_merge(ab_device dev, float *merged, const float *heads, int B, int N, int C, int H);
int ld_heads_unmerge(ab_device dev, float *heads, const float *merged, int B, int N, int C, int H);
/* The fused layers (layers.h: fused.c) */
int ld_embedding_positions(ab_device dev, float *out, const int *tokens, const float *wte, const float *table,
                           int B, int N, int C, int pos0);
int ld_bias_heads_split(ab_device dev, float *q, float *k, float *v, const float *qkv, const float *bias, int B,
                        int N, int C, int H);
int ld_bias_relu(ab_device dev, float *x, const float *b, int BT, int F);
int ld_bias_residual_layernorm(ab_device dev, float *res, float *out, float *mean, float *rstd, const float *x,
                               const float *branch, const float *bias, const float *g, const float *b, int BT,
                               int C);
int ld_residual_add(ab_device dev, float *out, const float *a, const float *b, size_t n);
int ld_residual_acc(ab_device dev, float *y, const float *x, size_t n);
int ld_scale(ab_device dev, float *x, size_t n, float s);
int ld_gate_act_forward(ab_device dev, float *x, size_t n, gate_act kind);
int ld_gate_act_backward(ab_device dev, float *d, const float *y, size_t n, gate_act kind);
/* Scratch the forward needs on dev (0 on the CPU). */
size_t ld_cross_entropy_ws_bytes(ab_device dev, int BT);
/* st on the host; on CUDA this waits for the device (the sums come back). */
int ld_cross_entropy_forward(ab_device dev, ce_stats *st, float *nll, const float *logits, const int *targets,
                             const float *weights, int BT, int V, void *ws);
int ld_cross_entropy_backward(ab_device dev, float *dlogits, const float *logits, const int *targets,
                              const float *weights, double weight_sum, int BT, int V);
/* The logistic mixture (layers.h: mixture_forward, mixture_backward); ws of
 * ld_cross_entropy_ws_bytes (the same scratch serves both). */
int ld_mixture_forward(ab_device dev, ce_stats *st, float *nll, const float *out, const int *targets,
                       const float *weights, int BT, int K, void *ws);
int ld_mixture_backward(ab_device dev, float *dout, const float *out, const int *targets, const float *weights,
                        double weight_sum, int BT, int K);
/* The CTC loss (ctc.h: ctc_forward, ctc_backward; ws of ctc_ws_bytes, in memory of dev) */
int ld_ctc_forward(ab_device dev, ce_stats *st, float *nll, const ctc_dims *d, const float *logits,
                   const int *lengths, const int *labels, const int *counts, const float *weights, void *ws);
int ld_ctc_backward(ab_device dev, float *dlogits, const ctc_dims *d, const float *logits, const int *lengths,
                    const int *labels, const int *counts, const float *weights, double weight_sum, void *ws);
/* One direction's LSTM step (lstm_step.h: lstm_step_forward, lstm_step_backward) */
int ld_lstm_step_forward(ab_device dev, const lstm_step_shape *s, float *gates, float *c, float *out, int out_ld,
                         float *h, float *cs, const float *hw);
int ld_lstm_step_backward(ab_device dev, const lstm_step_shape *s, float *dgates, float *dstep, float *hprev,
                          float *dcs, const float *dh_rec, const float *dout, int dout_ld, const float *gates,
                          const float *c, const float *out, int out_ld);

/* C = alpha op(A) op(B) + beta C (blas.h's ab_sgemm, cuda_blas.h's ab_cuda_sgemm) */
int ld_gemm(ab_device dev, bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
            const float *b, int ldb, float beta, float *c, int ldc);
/* The precision of the matrix products that follow on dev; returns the previous one,
 * to restore after (fp32 and no change on the CPU, or without a table). */
ab_precision ld_set_gemm_precision(ab_device dev, ab_precision p);
/* Whether ld_embedding_backward on dev reads embedding_token_index's order and starts
 * (CUDA) rather than the tokens (CPU), so the model carves and fills them. */
bool ld_token_index(ab_device dev);

#endif
