/* Internal: the model struct shared by transformer.c and generate.c. Not installed. */
#ifndef AB_MODELS_TRANSFORMER_INTERNAL_H
#define AB_MODELS_TRANSFORMER_INTERNAL_H

#include "encoder.h"
#include "transformer.h"

#include "attention.h"

struct tf_model {
    tf_config cfg;      /* strings point at the copies below */
    char *variant;
    char **settings;
    enc_config enc;
    int max_batch, max_len;
    attn_device dev;    /* cfg.device: where params, grads, acts and the attention live */
    attn *att;          /* one attention object shared by the layers (reseeded per layer) */
    size_t attn_saved;  /* bytes of each layer's saved buffer (for max_batch, max_len) */

    tf_table ptab, atab;
    float *params, *grads;
    void *acts;

    /* parameters (and the same carving of the gradients) */
    float *tok_emb, *head_w, *head_b, *lnf_g, *lnf_b;
    float *g_tok_emb, *g_head_w, *g_head_b, *g_lnf_g, *g_lnf_b;
    enc_params *lp, *lg; /* per layer */

    /* activations */
    int *tokens, *targets;           /* copies of the inputs: (B, N) each */
    int *lengths;                    /* (B): host memory on either device (attention.h) */
    float *weights;                  /* (B, N) */
    int *starts, *order;             /* CUDA: embedding_token_index of the tokens, (V + 1), (B, N) */
    void *ce_ws;                     /* CUDA: cross_entropy_forward_cuda's scratch */
    float *pos_table;                /* (max_len, C) */
    float *emb;                      /* (B, N, C): layer 0's input */
    enc_acts *la;                    /* per layer */
    float *lnf_mean, *lnf_rstd, *lnf_out;
    float *logits, *nll;             /* (B, N, V), (B, N) */
    enc_scratch ws;
    float *dx_a, *dx_b;              /* (B, N, C): gradients between layers */
    float *dlogits;                  /* (B, N, V) */

    /* CUDA: host staging of the inputs (one tracked host block made at creation),
     * laid out as their device tensors so that each group goes up in one copy:
     * tokens .. token_index (tokens, starts, order) and targets .. weights. */
    void *host_in;
    int *h_tokens, *h_starts, *h_order, *h_targets;
    float *h_weights;

    /* the last forward */
    int B, N;
    bool has_lengths, train, have_forward, have_loss;
    uint64_t seed;
    double weight_sum;
    bool has_weights;
};

/* The forward of the whole model for tokens (B, N) at positions pos0.. with the
 * attention run as `run` (NULL: parallel). Validates nothing (callers do). */
int tf_forward_run(tf_model *m, const int *tokens, int B, int N, int pos0, const int *lengths, bool train,
                   uint64_t seed, const mha_run *runs);

#endif
