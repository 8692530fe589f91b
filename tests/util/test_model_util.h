/* Shared helpers of the model suites (test_model, test_model_cuda, test_train): the
 * tiny transformer they check, the double reference's view of a model's parameters,
 * and the frames + LSTM model composed from the double references. */
#ifndef AB_TEST_MODEL_UTIL_H
#define AB_TEST_MODEL_UTIL_H

#include "ref_lstm.h"
#include "ref_model.h"
#include "transformer.h"

/* The defaults with V = 5, max_len = 6, C = 8, 2 heads, 2 layers, F = 16, no dropout,
 * seed 3 and the given attention variant. */

/* The finite-difference step of the model tests (central differences of the double
 * reference loss). */
#define FD_STEP 1e-5

/* Logits and loss: two layers and the head, each stage ~1e-7 relative in float32;
 * measured <= 2.2e-7 (logits, tensor-relative) and <= 3e-8 (loss, relative); 1e-5 is a
 * 45x margin. Gradients: the float backward through the whole model against finite
 * differences of the double reference loss (h = 1e-5, accurate to ~1e-10): measured
 * <= 1.3e-6 per tensor (tensor-relative); 5e-5 leaves 40x, while a missing term in any
 * layer gives 1e-2 or more. The frame-input cases (the dense projection F = 3 -> C in
 * place of the embedding, non-causal) add one short sum per position and measure
 * within those figures (logits <= 1.2e-7, gradients <= 4.5e-7). */
#define MODEL_FWD_TOL 1e-5
#define MODEL_GRAD_TOL 5e-5

/* What the reference loss of a model test needs (tu_fd_grad's context). */
typedef struct {
    const tf_model *m;
    ref_model_cfg rc;
    double *pd;
    const int *tokens, *targets, *lengths;
    const double *frames; /* frame input: (B, N, F) */
    int F;
    double *weights;
    int B, N;
} tm_model_ctx;

tf_config tm_tiny_config(const char *variant);

/* tf_create(c, max_batch) asserted to succeed (Criterion). */
tf_model *tm_make(const tf_config *c, int max_batch);
/* The parameter tensor of that name, or NULL. */
const tf_tensor *tm_find_param(const tf_model *m, const char *name);
/* The reference's config of a transformer config (softmax-like variants as softmax,
 * linformer with its k= and share= settings, the rest as linear elu+1). */
ref_model_cfg tm_ref_cfg(const tf_config *c);
/* tf_create(c, max_batch) expected to fail with a one-line message containing needle. */
void tm_expect_create_error(const tf_config *c, int max_batch, const char *needle);

/* The reference's parameter pointers into pd, a double copy of the model's parameters,
 * by name (a transformer body; token or frame input); asserts that every tensor of
 * the model has exactly one place. */
ref_params tm_ref_params(const tf_model *m, const double *pd);

/* The tiny frames + LSTM model: frame input (F = 3), C = 4, an LSTM body of H = 3
 * units per direction, bidirectional, 2 layers (not causal), 4 classes, no dropout,
 * max_len 7, seed 3. */
tf_config tm_tiny_lstm_config(void);

/* The frames + LSTM model (TF_INPUT_FRAMES, TF_BODY_LSTM, categorical head) in double,
 * composed of ref_dense (input projection F -> C, head D H -> K), ref_lstm's stack
 * and the weighted cross-entropy. Pointers into a double array laid out as the
 * model's parameters (or gradients). */
typedef struct {
    int F, C, H, layers, K;
    bool bidirectional;
    double *in_w, *in_b, *head_w, *head_b; /* (C, F), (C), (K, D H), (K) */
    ref_lstm_params lstm;
} tm_ref_lstm;

/* The view of pd (tf_param_count(m) doubles) by the model's tensor names (in.w, in.b,
 * lstm.weight_ih_lK[_reverse], lstm.weight_hh_lK[_reverse], lstm.bias_lK[_reverse],
 * head.w, head.b); asserts that every tensor has exactly one place and every place a
 * tensor, with the shape the reference expects. */
tm_ref_lstm tm_ref_lstm_view(const tf_model *m, double *pd);
/* frames (B, N, F) -> logits (B, N, K); lengths NULL or B values; drop NULL: none. */
void tm_ref_lstm_logits(const tm_ref_lstm *r, const double *frames, int B, int N, const int *lengths,
                        const ref_lstm_drop *drop, double *logits);
/* The loss (ref_cross_entropy of the logits; weights NULL: all 1) and its exact
 * gradient (back-propagation through the head, the LSTM and the input projection)
 * ADDED to g, a view of a gradient array (g may be NULL: loss only). */
double tm_ref_lstm_loss(const tm_ref_lstm *r, const double *frames, int B, int N, const int *lengths,
                        const ref_lstm_drop *drop, const int *targets, const double *weights, const tm_ref_lstm *g);

/* The exact gradient of sum(logits * dl) (dl: d loss / d logits, (B, N, K)) with
 * respect to every parameter, back-propagated through the head, the LSTM and the input
 * projection, ADDED to g: the model's gradient for any loss of its logits. */
void tm_ref_lstm_backprop(const tm_ref_lstm *r, const double *frames, int B, int N, const int *lengths,
                          const ref_lstm_drop *drop, const double *dl, const tm_ref_lstm *g);

#endif
