/* Internal: the model struct shared by transformer.c, model_loss.c and generate.c. Not
 * installed. */
#ifndef AB_MODELS_TRANSFORMER_INTERNAL_H
#define AB_MODELS_TRANSFORMER_INTERNAL_H

#include "ctc.h"
#include "encoder.h"
#include "lstm.h"
#include "transformer.h"

#include "attention.h"

#include "../harness/cuda_blas.h"

struct tf_model {
    tf_config cfg;      /* strings point at the copies below */
    char *variant;
    char **settings;  /* the attention's: the config's, then "precision=..." when not fp32 */
    int n_settings;
    enc_config enc;
    int max_batch, max_len;
    int fwd_len; /* the longest forward: max_len, or an inference model's cfg.forward_len */
    int classes;        /* K: head outputs */
    int width;          /* the body's output channels (C, or the LSTM's H or 2H) */
    ab_device dev;      /* cfg.device: where params, grads, acts and the attention live */
    long long row0;     /* tf_set_row_offset: the forward's rows' place in a larger batch */
    attn *att;          /* one attention object shared by the layers (reseeded per layer) */
    size_t attn_saved;  /* bytes of each layer's saved buffer (for max_batch, max_len) */

    tf_table ptab, atab;
    float *params, *grads;
    void *acts;

    /* parameters (and the same carving of the gradients); tok_emb for token input,
     * in_w (C, F) and in_b (C) for frame input */
    float *tok_emb, *in_w, *in_b, *head_w, *head_b, *lnf_g, *lnf_b;
    float *g_tok_emb, *g_in_w, *g_in_b, *g_head_w, *g_head_b, *g_lnf_g, *g_lnf_b;
    enc_params *lp, *lg; /* per layer */
    /* the attention's own parameters when one block serves every layer
     * (attn_params_shared_by_layers; NULL otherwise), and their gradient */
    float *attn_proj, *g_attn_proj;
    size_t attn_shared; /* floats of that block (0: per layer, in enc.attn_params, or none) */
    lstm_config lc;      /* LSTM body: I = d_model, H = lstm_hidden, cfg.layers layers */
    lstm_params lsp, lsg; /* LSTM body: parameters and their gradients */

    /* activations */
    int *tokens, *targets;           /* copies of the inputs: (B, N) each (tokens: token input) */
    float *frames;                   /* frame input: a copy of the frames (B, N, F) */
    int *lengths;                    /* (B): host memory on either device (attention.h) */
    float *weights;                  /* (B, N) */
    int *starts, *order;             /* CUDA: embedding_token_index of the tokens, (V + 1), (B, N) */
    void *ce_ws;                     /* CUDA: cross_entropy_forward_cuda's scratch */
    int *ctc_in;                     /* CTC head: the label inputs of tf_loss_ctc, memory of dev:
                                        (B) counts, (B) lengths, (B) weights, (B, S) labels */
    void *ctc_ws;                    /* CTC head: ctc_ws_bytes of (max_batch, max_len) */
    float *pos_table;                /* (max_len, C); NULL for a body without positions */
    float *emb;                      /* (B, N, C): layer 0's input */
    enc_acts *la;                    /* per layer */
    float *lnf_mean, *lnf_rstd, *lnf_out;
    float *logits, *nll;             /* (B, N, K), (B, N) */
    enc_scratch ws;
    lstm_acts lsa;                   /* LSTM body: kept from forward */
    lstm_scratch lsw;                /* LSTM body: scratch */
    float *dx_a, *dx_b;              /* (B, N, max(C, width)): gradients between layers */
    float *dlogits;                  /* (B, N, K) */

    /* CUDA: host staging of the inputs (one tracked host block made at creation),
     * laid out as their device tensors so that each group goes up in one copy:
     * tokens .. token_index (tokens, starts, order) and targets .. weights. */
    void *host_in;
    int *h_tokens, *h_starts, *h_order, *h_targets, *h_ctc;
    float *h_weights, *h_frames;

    /* the last forward */
    int B, N;
    int out_B, out_N;   /* the shape of the logits of the last forward_run (tf_forward's,
                           a generator's; 0 until one succeeds): tf_draw_last's rows */
    bool has_lengths, train, have_forward, have_loss;
    bool inference;     /* tf_set_inference: forwards keep nothing for backward */
    bool forward_only;  /* tf_create_inference: always inference; layer activations in
                           two sets used in turn, no saved buffer where the attention
                           can forward without one */
    bool infer_forward; /* the last forward ran in inference mode */
    unsigned long long forwards; /* whole forwards run (forward_run): one may have grown the
                                    attention's workspace, which a recorded step names */
    uint64_t seed;
    double weight_sum;
    bool has_weights;
    /* the last tf_loss_ctc: its inputs inside ctc_in (laid out for the forward's B) */
    const int *ctc_counts, *ctc_lengths, *ctc_labels;
    const float *ctc_weights;
};

/* A forward's input: tokens (B, N) or frames (B, N, F), host memory; or dev_tokens
 * (B, N) already in the model's device memory and checked (a generator's draws: an
 * inference forward, which needs no token index for an embedding backward). */
typedef struct {
    const int *tokens;
    const float *frames;
    const int *dev_tokens;
} tf_in;

/* The forward of the whole model for the input at positions pos0.. with the attention
 * run as `run` (NULL: parallel). Validates nothing (callers do). */
/* The model's precision for the device's matrix products while a call runs: enter
 * returns the one to restore with leave (tf_forward_run and tf_backward do it). */
ab_precision tf_precision_enter(const tf_model *m);
void tf_precision_leave(const tf_model *m, ab_precision p0);
int tf_forward_run(tf_model *m, const tf_in *in, int B, int N, int pos0, const int *lengths, bool train,
                   uint64_t seed, const mha_run *runs);
/* tf_forward_run of one position of B rows from device tokens, in two parts (a
 * generator's recorded step, generate.c), between tf_precision_enter and leave:
 * tf_step_input checks the fit and embeds the tokens at position pos0 (its work depends
 * on pos0); tf_step_body runs the layers (the attention as runs say) and the head, or,
 * with graph non-NULL, launches that recording of them instead (ab_cuda_graph_launch),
 * and leaves the model's record of its last forward as the full call would. */
int tf_step_input(tf_model *m, const int *dev_tokens, int B, int pos0);
int tf_step_body(tf_model *m, int B, uint64_t seed, const mha_run *runs, void *graph);
/* 0, or AB_EINVAL naming `what` when the model does not take tokens or one is
 * outside [0, vocab). */
int tf_check_tokens(const tf_model *m, const int *tokens, size_t n, const char *what);
/* The targets' range of a config: its classes, or the vocabulary when classes is 0. */
int tf_targets_of(const tf_config *c);
/* The CTC head's loss dimensions for B rows of N positions. */
ctc_dims tf_ctc_dims(const tf_config *c, int B, int N);
/* Layer l's input (the embedding for l = 0), and the head's input (the body's output). */
const float *tf_layer_input(const tf_model *m, int l);
const float *tf_body_output(const tf_model *m);

#endif
