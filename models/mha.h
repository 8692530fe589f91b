/* Multi-head attention block: fused Q, K, V projection (C -> 3C), split into heads in
 * the attention library's layout [B, H, N, D] (D = C / H; channel h*D + d of a
 * projection is dimension d of head h), the attention call through attention.h (any
 * registered variant, its options, causal flag and key lengths), merge of the heads
 * back to (B, N, C), and the output projection (C -> C).
 *
 * The tensors live on the device of mha_dims.device (host memory for the CPU, device
 * memory for CUDA; the attention object must be of the same device), and the layers
 * run there (layers_dev.h). Backward accumulates (+=) into dx and the parameter
 * gradients, like the layers. */
#ifndef AB_MODELS_MHA_H
#define AB_MODELS_MHA_H

#include "attention.h"
#include "layers.h"
#include "table.h"

#include <stdbool.h>

typedef struct {
    int B, N, C, H;      /* batch, length, model width, heads */
    bool causal;
    const int *lengths;  /* NULL or B valid lengths (keys and queries past them are padding); host memory */
    ab_device device;    /* where the tensors are (AB_DEV_CPU when left zero) */
    long long row0;      /* the rows' place in a larger batch: row b draws the dropout masks of
                            row row0 + b of it (dropout_forward_at); 0 for a whole batch */
} mha_dims;

/* How a block makes the attention's own input (attention.h: attn_bind_aux) from its
 * input x (B, N, C): y = act(x W1 W2 + b) with a low-rank pair W1 (C -> rank), W2
 * (rank -> H W), or y = act(x W1 + b) at rank 0, then split into heads [B, H, N, W].
 * gla's log-gate g: rank 16, act log(sigmoid(.)) / 16 (GLA's rule); deltanet's rate
 * beta: rank 0, act sigmoid. width 0: the variant reads no input of its own. */
typedef struct {
    int width;    /* W per head (0: none) */
    int rank;     /* 0: one projection */
    gate_act act;
} mha_aux;

/* The block's rule for the input `name` of width W per head (attn_variant_aux_of):
 * 0, or AB_EINVAL for a name no rule is known for. name NULL: none (width 0). */
int mha_aux_of(const char *name, int width, mha_aux *out);

typedef struct {
    float *wqkv, *bqkv; /* (3C, C), (3C): rows [0,C) make q, [C,2C) k, [2C,3C) v */
    float *wo, *bo;     /* (C, C), (C) */
    /* The attention's own parameters (attention.h: attn_param_count for max_len
     * proj_len; linformer's projections), or NULL for a variant without any. Bound to
     * the attention by forward (and, with the gradient's, by backward). */
    float *proj;
    int proj_len;
    /* The projection to the attention's own input (mha_aux; all NULL without one):
     * aux_w1 (rank, C) and aux_w2 (H W, rank), or aux_w1 (H W, C) alone at rank 0;
     * aux_b (H W). */
    float *aux_w1, *aux_w2, *aux_b;
    mha_aux aux;
} mha_params;           /* also used for their gradients */

/* Kept from forward for backward (per layer). */
typedef struct {
    float *q, *k, *v; /* (B, H, N, D) */
    float *merged;    /* (B, N, C): attention output with heads merged (input of wo) */
    void *saved;      /* attn_saved_bytes() of the variant (NULL when it saves nothing) */
    float *aux;       /* (B, H, N, W): the attention's own input (mha_aux), bound to it */
    float *aux_z1;    /* (B, N, rank): x W1 of a low-rank projection */
} mha_acts;

/* Shared by all blocks, contents not kept between calls. */
typedef struct {
    float *qkv;            /* (B, N, 3C): projections before the split; their gradient in backward */
    float *att;            /* (B, H, N, D): attention output; its gradient in backward */
    float *dq, *dk, *dv;   /* (B, H, N, D) */
    float *dmerged;        /* (B, N, C) */
    float *aux_z;          /* (B, N, H W): the input before its split; its gradient */
    float *daux;           /* (B, H, N, W): the input's gradient from the attention */
    float *aux_dz1;        /* (B, N, rank) */
} mha_scratch;

/* How forward runs the attention: the parallel call (training, recomputation), or the
 * recurrent state's prefill (positions 0..N-1 of a prompt) or one step (N = 1 at
 * position t). */
/* MHA_INFER: the parallel call for a forward no backward follows: the attention keeps
 * nothing where it can (attn_can_forward_unsaved) */
typedef enum { MHA_PARALLEL = 0, MHA_PREFILL = 1, MHA_STEP = 2, MHA_INFER = 3 } mha_mode;
typedef struct {
    mha_mode mode;
    attn_state *state; /* recurrent modes: the layer's state (attention.h) */
    int t;             /* MHA_STEP: the position */
} mha_run;

/* Parameters into a parameter table (names wqkv, bqkv, wo, bo under the prefix, then
 * proj of proj_count floats when proj_count > 0: the attention's own, for sequences of
 * up to proj_len positions; then aux.w1, aux.w2 (rank > 0) and aux.b when aux->width >
 * 0, for H heads). */
void mha_carve_params(tf_table *t, mha_params *p, int C, int H, size_t proj_count, int proj_len, const mha_aux *aux);
/* Per-layer activations for (B, N) with `saved_bytes` for the attention. */
void mha_carve_acts(tf_table *t, mha_acts *a, int B, int N, int C, int H, size_t saved_bytes, const mha_aux *aux);
/* Shared scratch for (B, N). */
void mha_carve_scratch(tf_table *t, mha_scratch *s, int B, int N, int C, int H, const mha_aux *aux);

/* The attention shape of these dims (D = M = C / H). */
attn_shape mha_shape(const mha_dims *d);

/* out (B, N, C) = wo(merge(attn(split(wqkv x + bqkv)))) + bo; x (B, N, C).
 * run NULL: parallel. 0 or an error code (the attention's message). */
int mha_forward(attn *a, const mha_dims *d, const mha_run *run, float *out, const float *x, const mha_params *p,
                mha_acts *act, mha_scratch *ws);
/* The recurrent step (run->mode MHA_STEP, N = 1) in four device operations:
 * out (B, 1, C) = wo(attn_step(split(wqkv x) + bqkv)), WITHOUT the output bias bo,
 * which the caller adds where it adds the residual (ld_bias_residual_layernorm). No
 * merge: at N = 1 the heads' layout (B, H, 1, D) is the merged one (B, 1, C). What
 * backward would need (act->merged) is not kept: the step is inference only. */
int mha_step_forward(attn *a, const mha_dims *d, const mha_run *run, float *out, const float *x, const mha_params *p,
                     mha_acts *act, mha_scratch *ws);
/* dx (B, N, C) += and the gradients g += from dout (B, N, C) (dout is not modified) */
int mha_backward(attn *a, const mha_dims *d, float *dx, const mha_params *g, const float *dout, const float *x,
                 const mha_params *p, const mha_acts *act, mha_scratch *ws);

#endif
