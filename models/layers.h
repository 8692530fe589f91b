/* Position-wise layers of the transformer, each a paired forward/backward (llm.c
 * style), on the CPU: the pointers are host memory. layers_cuda.h has the same layers
 * on the CUDA device (device pointers), and layers_dev.h calls the one of a device.
 *
 * Conventions:
 * - Row-major, BT = B*N rows of C channels: x (BT, C) is the (B, N, C) tensor.
 * - Dense layers compute out = x W^T + b with W stored (OC, C) (PyTorch's nn.Linear
 *   layout: row o of W holds the weights into output channel o).
 * - Backward functions ACCUMULATE into every gradient they write (+=), parameter and
 *   input gradients alike, so callers zero them first (tf_zero_grad for parameters).
 *   A NULL input gradient is skipped.
 * - Deterministic: per-row work is split over threads with static schedules and every
 *   reduction over rows (bias, gain, embedding gradients) runs per column in row order,
 *   so results do not depend on how threads are scheduled; matrix products go through
 *   ab_sgemm (OpenBLAS, reproducible for a fixed thread count). */
#ifndef AB_MODELS_LAYERS_H
#define AB_MODELS_LAYERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- token embedding (embedding.c) ---- */

/* out (BT, C) = wte[tokens] ; tokens (BT) in [0, V) (checked by the caller); wte (V, C) */
void embedding_forward(float *out, const int *tokens, const float *wte, int BT, int C);
/* dwte (V, C) += scatter of dout (BT, C) by token: row v of dwte adds the rows of
 * dout whose token is v, one after another in position order. */
void embedding_backward(float *dwte, const float *dout, const int *tokens, int BT, int C);
/* The positions grouped by token (a stable counting sort, for the CUDA backward):
 * order (BT) lists the positions of token 0 in increasing order, then those of token
 * 1, ...; positions of token v are order[starts[v] .. starts[v + 1]), starts (V + 1). */
void embedding_token_index(int *order, int *starts, const int *tokens, int BT, int V);

/* ---- sinusoidal positions (positions.c); no parameters, backward is the identity ---- */

/* table (N, C): even channel 2i at position p is sin(p / 10000^(2i/C)), odd channel
 * 2i+1 is cos of the same angle (computed in double, rounded to float). */
void positions_table(float *table, int N, int C);
/* x (B, N, C) += table[pos0 + n] (table has at least pos0 + N rows) */
void positions_add(float *x, const float *table, int B, int N, int C, int pos0);

/* ---- layer normalisation (layernorm.c) ---- */

#define LN_EPS 1e-5f /* PyTorch's default */

/* out (BT, C) = (x - mean) * rstd * g + b per row; saves mean, rstd (BT). out may not
 * alias x. */
void layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *g, const float *b, int BT,
                       int C);
/* dx (BT, C), dg (C), db (C) += ...  from dout (BT, C) and the saved mean, rstd */
void layernorm_backward(float *dx, float *dg, float *db, const float *dout, const float *x, const float *g,
                        const float *mean, const float *rstd, int BT, int C);

/* ---- dense (dense.c) ---- */

/* out (BT, OC) = x (BT, C) W^T + b; W (OC, C), b (OC) or NULL */
void dense_forward(float *out, const float *x, const float *w, const float *b, int BT, int C, int OC);
/* dx (BT, C) += dout W ; dw (OC, C) += dout^T x ; db (OC) += column sums of dout.
 * dx and db may be NULL. */
void dense_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, int BT,
                    int C, int OC);

/* ---- dropout (dropout.c) ----
 * Element i of a site's tensor is kept iff (w >> 8) < round((1 - p) 2^24), where w is
 * word (i mod 4) of ab_philox4x32(seed, stream, i / 4): a pure function of (seed,
 * stream, i), so any backend and any thread draws the same mask. Kept elements are
 * scaled by 1 / (1 - p) (inverted dropout). The mask is stored (one byte per element)
 * so backward reads it instead of drawing it again. */

/* The keep threshold for rate p, in [0, 2^24]. */
uint32_t dropout_threshold(float p);
/* mask (n) = keep flags (0/1) of elements 0..n-1 */
void dropout_mask(uint8_t *mask, size_t n, float p, uint64_t seed, uint64_t stream);
/* out (n) = x * mask / (1 - p), drawing the mask into `mask`; out may equal x. */
void dropout_forward(float *out, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed, uint64_t stream);
/* The same for elements first .. first + n - 1 of the (seed, stream) sequence (element
 * first + i into position i; out and x may be NULL for the mask alone): a batch's rows
 * r0.. drawn as the rows r0.. of a larger batch with the same row size, which is how a
 * micro-batch (trainer.h, accumulate) draws the masks of its rows in the whole batch. */
void dropout_forward_at(float *out, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed, uint64_t stream,
                        uint64_t first);
void dropout_mask_at(uint8_t *mask, size_t n, float p, uint64_t seed, uint64_t stream, uint64_t first);
/* dx (n) += dout * mask / (1 - p) */
void dropout_backward(float *dx, const float *dout, const uint8_t *mask, size_t n, float p);

/* ---- feed-forward block (ffn.c): dense -> ReLU -> dropout -> dense ---- */

/* ReLU in place: x = max(x, 0) */
void relu_forward(float *x, size_t n);
/* dx += dout where y > 0 (y: the ReLU's output, or that output after dropout: an
 * element dropped there also has dout = 0, so the result is the same) */
void relu_backward(float *dx, const float *dout, const float *y, size_t n);

typedef struct {
    const float *w1, *b1; /* (F, C), (F) */
    const float *w2, *b2; /* (C, F), (C) */
} ffn_params;
typedef struct {
    float *w1, *b1, *w2, *b2;
} ffn_grads;

/* out (BT, C) = dense2(drop(relu(dense1(x)))); hidden (BT, F) keeps drop(relu(.)) for
 * backward; mask (BT, F) is the hidden dropout's mask, or NULL for no dropout (p = 0
 * or evaluation), drawn from element `first` on (dropout_forward_at). */
void ffn_forward(float *out, float *hidden, uint8_t *mask, const float *x, const ffn_params *p, int BT, int C, int F,
                 float drop_p, uint64_t seed, uint64_t stream, uint64_t first);
/* dx (BT, C) and the parameter gradients += ...; dhidden (BT, F) is scratch (its
 * contents are overwritten). */
void ffn_backward(float *dx, const ffn_grads *g, float *dhidden, const float *dout, const float *x,
                  const float *hidden, const uint8_t *mask, const ffn_params *p, int BT, int C, int F, float drop_p);

/* ---- attention heads (heads.c): projections (B, N, C) <-> the attention library's
 * layout (B, H, N, D), D = C / H; channel h*D + d is dimension d of head h ---- */

/* qkv (B, N, 3C) -> q, k, v (B, H, N, D) (from the thirds [0, C), [C, 2C), [2C, 3C)) */
void heads_split(float *q, float *k, float *v, const float *qkv, int B, int N, int C, int H);
/* dq, dk, dv (B, H, N, D) -> dqkv (B, N, 3C), overwritten: the backward of heads_split */
void heads_join(float *dqkv, const float *dq, const float *dk, const float *dv, int B, int N, int C, int H);
/* heads (B, H, N, D) -> merged (B, N, C) */
void heads_merge(float *merged, const float *heads, int B, int N, int C, int H);
/* merged (B, N, C) -> heads (B, H, N, D), overwritten: the backward of heads_merge */
void heads_unmerge(float *heads, const float *merged, int B, int N, int C, int H);

/* ---- fused layers (fused.c): the model's recurrent step runs these, one pass each on
 * the device, instead of the chains they replace ---- */

/* out (B, N, C) = wte[tokens] + table[pos0 + n] (table NULL: wte[tokens]): embedding_forward
 * then positions_add, the same bits. */
void embedding_positions(float *out, const int *tokens, const float *wte, const float *table, int B, int N, int C,
                         int pos0);
/* heads_split of qkv + bias (bias: 3C, one per column of qkv): the split of a dense
 * layer's output computed without its bias. */
void bias_heads_split(float *q, float *k, float *v, const float *qkv, const float *bias, int B, int N, int C, int H);
/* x (BT, F) = relu(x + b): a dense layer's bias and the ReLU after it. */
void bias_relu(float *x, const float *b, int BT, int F);
/* res (BT, C) = x + (branch + bias), then, when out is not NULL, out = layernorm(res)
 * with its mean and rstd (layernorm_forward's arithmetic): a residual around a dense
 * layer computed without its bias, and the norm after it. */
void bias_residual_layernorm(float *res, float *out, float *mean, float *rstd, const float *x, const float *branch,
                             const float *bias, const float *g, const float *b, int BT, int C);

/* ---- residual connections (residual.c) ---- */

/* out (n) = a + b */
void residual_add(float *out, const float *a, const float *b, size_t n);
/* y (n) += x */
void residual_acc(float *y, const float *x, size_t n);
/* x (n) *= s (one rounded product per element: the gradient's micro-batch weights) */
void scale_inplace(float *x, size_t n, float s);

/* ---- the activation of a variant's input (residual.c; mha.c makes the input) ----
 * GATE_ACT_LOGSIGMOID16: y = log(sigmoid(z)) / 16 (gla's log-gate, <= 0, a decay
 * exp(y) in (0.5^(1/16), 1) near z = 0); GATE_ACT_SIGMOID: y = sigmoid(z) (deltanet's
 * rate, in (0, 1)). Forward turns z into y in place; backward turns dy into dz in
 * place, from y (logsigmoid/16: dz = dy (1 - exp(16 y)) / 16; sigmoid: dy y (1 - y)). */
typedef enum { GATE_ACT_LOGSIGMOID16 = 0, GATE_ACT_SIGMOID = 1 } gate_act;
void gate_act_forward(float *x, size_t n, gate_act kind);
void gate_act_backward(float *d, const float *y, size_t n, gate_act kind);

/* ---- softmax cross-entropy with per-position weights (cross_entropy.c) ---- */

typedef struct {
    double loss;         /* sum(w * nll) / sum(w); 0 when sum(w) = 0 */
    double weight_sum;   /* sum(w) */
    long long correct;   /* positions with w > 0 whose first argmax is the target */
    long long counted;   /* positions with w > 0 */
} ce_stats;

/* logits (BT, V), targets (BT), weights (BT) or NULL for all ones -> st. nll (BT) is
 * scratch that receives each position's -log softmax(logits)[target] (0 where w = 0).
 * Positions with w = 0 are not read beyond their weight (their target may be
 * anything, e.g. -1 for padding). Targets of weighted positions must be in [0, V) and
 * weights finite and >= 0 (checked by the caller). The sum runs over positions in
 * order, in double. */
void cross_entropy_forward(ce_stats *st, float *nll, const float *logits, const int *targets, const float *weights,
                           int BT, int V);
/* dlogits (BT, V) += w_i / weight_sum (softmax(logits_i) - onehot(target_i));
 * nothing when weight_sum = 0. */
void cross_entropy_backward(float *dlogits, const float *logits, const int *targets, const float *weights,
                            double weight_sum, int BT, int V);

/* ---- discretised logistic mixture of one 8-bit value per position (mixture.c;
 * PixelCNN++'s head, as the paper's image experiments use it) ----
 *
 * Each position has 3K outputs (K components): K mixture logits, then K means, then
 * K raw log-scales. Value v in 0..255 stands for x = 2v/255 - 1 in [-1, 1], its bin
 * for [x - 1/255, x + 1/255] (bin 0 extends to -inf, bin 255 to +inf); log-scales are
 * clamped below at -7 (PixelCNN++; no gradient where the clamp holds). log P(v) =
 * logsumexp_k(log pi_k + log p_k(v)), p_k(v) = sigma((x + 1/255 - mu)/s) -
 * sigma((x - 1/255 - mu)/s), the CDF up to x + 1/255 at v = 0 and 1 - CDF from
 * x - 1/255 at v = 255, all in log space; where a middle bin's mass is below 1e-5,
 * PixelCNN++'s fallback log pdf(x) + log(2/255). mixture_core.h has every formula.
 *
 * Statistics (ce_stats, as the cross-entropy's): loss = sum(w nll) / sum(w) with
 * nll = -log P(target) (nats); correct counts the weighted positions whose target is
 * the most probable value (mixture_mode), counted the weighted positions. */

/* log P(v) of one position (p: its 3K outputs), v in 0..255 */
double mixture_log_prob(const float *p, int K, int v);
/* The most probable value of a position: the first v with the largest probability,
 * the probabilities computed from the component CDFs at the 255 bin edges (the exact
 * discretised masses; they differ from exp(mixture_log_prob) only in bins where the
 * fallback applies, each under 1e-5, so the two agree but in near-ties). */
int mixture_mode(const float *p, int K);
/* A sample of a position's distribution from two uniform draws u1, u2 in [0, 1): the
 * component is the first k whose cumulative softmax weight exceeds u1 (times the
 * total), then x = mu_k + s_k (log u - log(1 - u)) with u = u2 kept within
 * [1e-5, 1 - 1e-5] (PixelCNN++), and v = round((x + 1) 255/2) clamped to 0..255 (ties
 * round up). A pure function of its arguments. */
int mixture_sample(const float *p, int K, double u1, double u2);

/* One value drawn per row from a head's outputs (sampling; draw_core.h has the
 * functions, the same on both devices): row b's uniforms are ab_rng_uniform(seed,
 * stream, i) (and, for a mixture, ab_rng_uniform(seed, stream2, i)) at i = idx0 + b
 * idx_stride. */
typedef struct {
    bool mixture;       /* a logistic-mixture head's 3n outputs (mixture_sample); else n logits */
    int n;              /* classes, or the mixture's components */
    double temperature; /* logits: > 0 samples softmax(x / T), 0 the first largest; a mixture samples (1) */
    uint64_t seed, stream, stream2, idx0, idx_stride;
} draw_spec;
/* out (BT, 3K), targets (BT) in 0..255 for weighted positions, weights (BT) or NULL
 * (all ones) -> st; nll (BT) receives -log P(target) (0 where w = 0). As
 * cross_entropy_forward otherwise (unweighted positions are not read). */
void mixture_forward(ce_stats *st, float *nll, const float *out, const int *targets, const float *weights, int BT,
                     int K);
/* dout (BT, 3K) += w_i / weight_sum d(-log P_i(target_i)) / d out_i; nothing when
 * weight_sum = 0. */
void mixture_backward(float *dout, const float *out, const int *targets, const float *weights, double weight_sum,
                      int BT, int K);

#ifdef __cplusplus
}
#endif

#endif
