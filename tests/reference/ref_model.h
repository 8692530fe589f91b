/* Plain double-precision reference of the transformer (models/), written for clarity:
 * no BLAS, no threads, every formula spelled out once. Used only by the tests.
 * Layouts as in models/: activations (B, N, C) row-major, dense weights (OUT, IN)
 * with out = x W^T + b, attention heads [B, H, N, D] with channel h*D + d. */
#ifndef AB_REF_MODEL_H
#define AB_REF_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#define REF_MAX_LAYERS 8

typedef enum {
    REF_ATTN_SOFTMAX = 0,
    REF_ATTN_LINEAR_ELU = 1,
    REF_ATTN_LINFORMER = 2,
    REF_ATTN_GLA = 3,      /* ref_gla, scale 1/sqrt(D), the gate made by the block (aux_*) */
    REF_ATTN_DELTANET = 4  /* ref_deltanet, eps 1e-6, the rate made by the block (aux_*) */
} ref_attn;

typedef struct {
    int V, C, H, L, F;
    bool pre_norm, final_norm, causal;
    ref_attn attn; /* softmax with scale 1/sqrt(D), linear elu+1 with eps 1e-6, or
                      linformer (ref_linformer, scale 1/sqrt(D)) */
    int lin_k, lin_len; /* linformer: rows k of E and F, and their columns (max_len) */
    bool lin_one;       /* linformer: F = E (share kv or layer) */
    /* gla and deltanet: the block makes the attention's input y = act(x W1 [W2] + b),
     * W per head (gla: D vector, 1 scalar; deltanet: 1), rank 0: W1 alone; act 0:
     * log(sigmoid(.)) / 16, 1: sigmoid (models/mha.h: mha_aux) */
    int aux_w, aux_rank, aux_act;
} ref_model_cfg;

typedef struct {
    const double *ln1_g, *ln1_b, *wqkv, *bqkv, *wo, *bo, *ln2_g, *ln2_b, *w1, *b1, *w2, *b2;
    const double *proj; /* linformer: E (k x lin_len), then F unless lin_one */
    const double *aux_w1, *aux_w2, *aux_b; /* gla, deltanet: (rank or H W, C), (H W, rank), (H W) */
} ref_layer_params;

typedef struct {
    const double *tok_emb; /* (V, C): token input */
    const double *in_w, *in_b; /* (C, F_in), (C): frame input's dense projection */
    ref_layer_params layer[REF_MAX_LAYERS];
    const double *lnf_g, *lnf_b; /* final LN (when final_norm) */
    const double *head_w, *head_b; /* (V, C), (V) */
} ref_params;

/* Dropout masks of one layer (NULL: no dropout) and their rate. */
typedef struct {
    const uint8_t *attn, *hidden, *ffn; /* (B,N,C), (B,N,F), (B,N,C) */
    double p;
} ref_masks;

void ref_layernorm(const double *x, const double *g, const double *b, int BT, int C, double *out);
void ref_dense(const double *x, const double *w, const double *b, int BT, int IN, int OUT, double *out);
/* y = x * mask / (1 - p) */
void ref_dropout(const double *x, const uint8_t *mask, double p, long n, double *out);
/* dense -> relu -> dropout(mask, may be NULL) -> dense */
void ref_ffn(const double *x, const double *w1, const double *b1, const double *w2, const double *b2,
             const uint8_t *mask, double p, int BT, int C, int F, double *out);
/* Multi-head attention block: x (B, N, C) -> out (B, N, C). */
void ref_mha(const ref_model_cfg *c, const ref_layer_params *p, const double *x, int B, int N, const int *lengths,
             double *out);
/* One encoder layer (post- or pre-norm per c->pre_norm); masks may be NULL. */
void ref_encoder_layer(const ref_model_cfg *c, const ref_layer_params *p, const double *x, int B, int N,
                       const int *lengths, const ref_masks *masks, double *out);
/* The whole model without dropout: tokens (B, N) -> logits (B, N, V). */
void ref_model_logits(const ref_model_cfg *c, const ref_params *p, const int *tokens, int B, int N,
                      const int *lengths, double *logits);
/* The same for frame input: frames (B, N, F_in) -> frames W_in^T + b_in + positions,
 * then the layers, final LN and head as above. */
void ref_model_logits_frames(const ref_model_cfg *c, const ref_params *p, const double *frames, int F_in, int B,
                             int N, const int *lengths, double *logits);
/* sum(w * nll) / sum(w) over positions with w > 0 (weights NULL: all 1). */
double ref_cross_entropy(const double *logits, const int *targets, const double *weights, int BT, int V);

#endif
