/* LSTM layers, unidirectional or bidirectional, stacked: a non-transformer body over
 * (B, N, I) inputs, with forward and backward on the CPU or a CUDA device.
 *
 * Semantics: PyTorch's nn.LSTM (batch_first) with one bias vector per direction (the
 * sum of PyTorch's bias_ih and bias_hh), gate order i, f, g, o:
 *   gates_t = x_t W_ih^T + h_{t-1} W_hh^T + b      W_ih (4H, In), W_hh (4H, H), b (4H)
 *   i, f, o = sigmoid of their quarter of gates_t, g = tanh of its quarter
 *   c_t = f * c_{t-1} + i * g ;  h_t = o * tanh(c_t) ;  h_{-1} = c_{-1} = 0
 * Row b of a batch has L_b = lengths[b] valid positions (N without lengths). The
 * forward direction runs t = 0..L_b-1, the reverse direction t = L_b-1 down to 0 from
 * the zero state, so padding never influences a valid position. The output of a
 * padding position (t >= L_b) is exactly 0 and receives no gradient (whatever dout
 * holds there; dx there stays as it was). Padding entries of the input x must be
 * finite (their values are otherwise never used: they meet zero gradients in dW_ih).
 *
 * A layer writes (B, N, D H), D = 2 directions when bidirectional (forward in channels
 * [0, H), reverse in [H, 2H)) else 1. Layer 0 reads width I, later layers D H. Between
 * layers (on every layer's output but the last) optional dropout of rate c->dropout,
 * in training only: layer l's mask is drawn from (seed, stream_base +
 * LSTM_DROPOUT_STREAM_STRIDE l) with the rule of layers.h (dropout_forward).
 *
 * How it runs (CPU and CUDA alike, on the device of lstm_dims.device through
 * layers_dev.h): per layer and direction one GEMM for x W_ih^T + b over all B N rows,
 * then steps k = 0..max(L_b)-1 in which row b is active when k < L_b, at position
 * p_b = k (forward) or L_b-1-k (reverse): one (B, H) x (H, 4H) GEMM of the previous
 * h, then one element-wise pass (a kernel on CUDA) adding the input part at (b, p_b),
 * applying the nonlinearities and updating c and h. Backward runs the steps in reverse
 * with the carried dh, dc: per step the element-wise pass, then dh_prev = dgates W_hh
 * (one GEMM); after the loop one GEMM each for dW_hh += dgates^T h_prev (over all
 * B N rows at once, h_prev gathered during the steps), dx += dgates W_ih,
 * dW_ih += dgates^T x, and the column sums db += sum dgates. Backward ACCUMULATES
 * (+=) into dx and every parameter gradient (zero them first). Deterministic: no
 * atomics, every sum in a fixed order, so two runs give the same bits (on the CPU
 * for a fixed OpenMP/OpenBLAS thread count, as the other layers).
 *
 * Memory (all carved up front from size tables, table.h; nothing allocated per call):
 * - activations kept from forward for backward, per position of each layer:
 *   per direction the four gate activations (4H floats) and c (H floats), and the
 *   layer's output h (D H floats): 6 D H floats, 48 H bytes bidirectional (H = 320:
 *   15 KiB per position per layer); a layer followed by dropout (training) adds its
 *   dropped output (D H floats) and mask (D H bytes). Plus B ints (the lengths).
 * - scratch shared by all layers, not kept: 5 H floats per position (backward's
 *   gate gradients and gathered h_prev), plus 2 D H with more than one layer (the
 *   gradients between layers), and 6 H floats per batch row (the running state and
 *   one step's products).
 * The tensors of one call (B, N) are the first B N rows of buffers carved for the
 * maxima (max_B, max_N).
 *
 * Devices: with AB_DEV_CUDA the tensors (x, dx, dout, parameters, gradients,
 * activations, scratch) are device memory; lengths are always host memory (forward
 * copies them into the activations, one synchronous upload per call). CUDA calls
 * return once their work is queued. Results agree with the CPU's to float rounding
 * (cuBLAS against OpenBLAS, the device's expf/tanhf); dropout masks are the same
 * bits. */
#ifndef AB_MODELS_LSTM_H
#define AB_MODELS_LSTM_H

#include "attention.h"
#include "table.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LSTM_MAX_LAYERS 16
/* Parameter tensors of a stack: 3 per direction and layer. */
#define LSTM_MAX_TENSORS (LSTM_MAX_LAYERS * 2 * 3)
/* Dropout streams of consecutive layers are this far apart: the per-layer stride of
 * the encoder's dropout sites (transformer.h), so a model passes its dropout stream
 * base and layer l of either body draws from the same place. */
#define LSTM_DROPOUT_STREAM_STRIDE 4

typedef struct {
    int I;              /* input width of layer 0 */
    int H;              /* hidden width per direction */
    int layers;         /* 1 <= layers <= LSTM_MAX_LAYERS */
    bool bidirectional;
    float dropout;      /* rate in [0, 1) between layers (training only) */
} lstm_config;

/* The call's shape and device (as mha_dims). */
typedef struct {
    int B, N;            /* batch and length, at most the carved maxima */
    const int *lengths;  /* NULL (all N) or B valid lengths in [0, N]; host memory */
    ab_device device;    /* where the tensors are (AB_DEV_CPU when left zero) */
    long long row0;      /* as mha_dims.row0: row b draws the dropout masks of row row0 + b */
} lstm_dims;

typedef struct {
    float *w_ih; /* (4H, In): rows [0,H) i, [H,2H) f, [2H,3H) g, [3H,4H) o */
    float *w_hh; /* (4H, H) */
    float *b;    /* (4H) */
} lstm_dir_params;

typedef struct {
    lstm_dir_params dir[LSTM_MAX_LAYERS][2]; /* [layer][0 forward, 1 reverse] */
} lstm_params;                               /* also used for their gradients */

/* Kept from forward for backward, per layer. Padding positions of gates and c are
 * never written nor read. */
typedef struct {
    float *gates[2]; /* (B, N, 4H) per direction: i, f, g, o after their nonlinearities */
    float *c[2];     /* (B, N, H) per direction: cell states */
    float *out;      /* (B, N, D H): h of the directions; 0 at padding */
    float *drop;     /* (B, N, D H): out after dropout, the next layer's input (NULL: none) */
    uint8_t *mask;   /* (B, N, D H): its mask (NULL: none) */
} lstm_layer_acts;

typedef struct {
    lstm_layer_acts layer[LSTM_MAX_LAYERS];
    int *lengths;      /* (max_B): the forward's lengths, on the device */
    int max_B, max_N;  /* what was carved */
    bool with_dropout; /* masks carved for layers 0..L-2 */
} lstm_acts;

/* Shared by all layers and directions, contents not kept between calls. */
typedef struct {
    float *step;   /* (B, 4H): one step's h_prev W_hh^T; in backward its gate gradients */
    float *h, *c;  /* (B, H): the running state; in backward the carried dh, dc */
    float *dgates; /* (B, N, 4H): gradients of the pre-activation gates of a direction */
    float *hprev;  /* (B, N, H): h_prev of every valid position of a direction */
    float *d0, *d1; /* (B, N, D H): gradients of layer inputs and outputs */
} lstm_scratch;

/* 0, or AB_EINVAL with a message (widths >= 1, layers in [1, LSTM_MAX_LAYERS],
 * dropout in [0, 1)). */
int lstm_check_config(const lstm_config *c);
/* Directions (1 or 2), input width of layer l (I or D H) and the output width D H. */
int lstm_dirs(const lstm_config *c);
int lstm_in_width(const lstm_config *c, int layer);
int lstm_out_width(const lstm_config *c);

/* Parameters into a parameter table, layer by layer, forward direction then reverse,
 * named as PyTorch's (weight_ih_l0, weight_hh_l0, bias_l0, weight_ih_l0_reverse, ...;
 * bias_lK stands for bias_ih_lK + bias_hh_lK); weights decay, biases do not. */
void lstm_carve_params(tf_table *t, lstm_params *p, const lstm_config *c);
/* Activations for batches up to B and lengths up to N; dropout masks and outputs
 * for layers 0..L-2 only when with_dropout (needed by training with dropout > 0). */
void lstm_carve_acts(tf_table *t, lstm_acts *a, const lstm_config *c, int B, int N, bool with_dropout);
/* Scratch for batches up to B and lengths up to N (the same maxima as the acts). */
void lstm_carve_scratch(tf_table *t, lstm_scratch *s, const lstm_config *c, int B, int N);

/* Initialisation (PyTorch's: every weight and bias uniform(-1/sqrt(H), 1/sqrt(H))).
 * The parameter tensors in carve order with their counts and bounds; returns how many
 * (<= LSTM_MAX_TENSORS). A model draws them with its own streams (e.g. the table
 * index, as transformer.h) as (2 ab_rng_uniform - 1) * bound. */
typedef struct {
    float *p;     /* in the lstm_params given */
    size_t count;
    double bound;
} lstm_init_tensor;
int lstm_init_list(const lstm_config *c, const lstm_params *p, lstm_init_tensor *out);
/* Draws every tensor of lstm_init_list into HOST memory: element j of tensor k is
 * (2 ab_rng_uniform(seed, stream_base + k, j) - 1) * bound. */
void lstm_init_params(const lstm_config *c, const lstm_params *host, uint64_t seed, uint64_t stream_base);

/* x (B, N, I) -> the last layer's output (B, N, D H), lstm_output(). train: dropout
 * between layers when c->dropout > 0 (the acts must have been carved with_dropout).
 * 0 or an error code with its message (bad shape or lengths: AB_EINVAL). */
int lstm_stack_forward(const lstm_config *c, const lstm_dims *d, const float *x, const lstm_params *p,
                       lstm_acts *act, lstm_scratch *ws, bool train, uint64_t seed, uint64_t stream_base);
/* The output of the last forward (device memory on CUDA). */
const float *lstm_output(const lstm_config *c, const lstm_acts *a);
/* dx (B, N, I) += (dx may be NULL) and g += from dout (B, N, D H), for the forward
 * just run with the same c, d, x, p and train flag. dout is not modified. */
int lstm_stack_backward(const lstm_config *c, const lstm_dims *d, float *dx, const lstm_params *g,
                        const float *dout, const float *x, const lstm_params *p, const lstm_acts *act,
                        lstm_scratch *ws, bool train);

#ifdef __cplusplus
}
#endif

#endif
