/* Transformer encoder layer, in two normalisation orders:
 *
 *   post-norm (fast-transformers' TransformerEncoderLayer, the paper's library):
 *     r1 = x + Drop(Attn(x));  h1 = LN1(r1)
 *     r2 = h1 + Drop(FFN(h1)); out = LN2(r2)
 *   pre-norm:
 *     h1 = LN1(x);  r1 = x + Drop(Attn(h1))
 *     h2 = LN2(r1); out = r1 + Drop(FFN(h2))       (the model adds a final LN)
 *
 * FFN = dense -> ReLU -> Drop -> dense, so a layer has three dropout sites, all with
 * the same rate: attention output (site 0), FFN hidden (site 1), FFN output (site 2).
 * Site k of a layer draws its mask from (seed, stream_base + k) (layers.h).
 *
 * Tensors live on the device of the mha_dims passed to forward and backward (host
 * memory for the CPU, device memory for CUDA), where the layers run. Backward
 * accumulates (+=) into dx and the parameter gradients. */
#ifndef AB_MODELS_ENCODER_H
#define AB_MODELS_ENCODER_H

#include "layers.h"
#include "mha.h"
#include "table.h"

typedef struct {
    int C, H, F;     /* model width, heads, FFN width */
    float dropout;   /* rate of the three sites */
    bool pre_norm;
    bool causal;
    /* The attention's own parameters per layer (mha_carve_params): count (0: none, or
     * one block shared by the layers, carved by the model) and their max_len. */
    size_t attn_params;
    int attn_len;
    /* How the attention's own input is made (mha_aux; width 0: the variant reads none). */
    mha_aux aux;
} enc_config;

typedef struct {
    float *ln1_g, *ln1_b; /* (C) */
    mha_params attn;
    float *ln2_g, *ln2_b; /* (C) */
    float *w1, *b1;       /* (F, C), (F) */
    float *w2, *b2;       /* (C, F), (C) */
} enc_params;             /* also used for their gradients */

/* Kept from forward for backward (per layer). Masks are NULL when the layer was
 * carved without dropout; forward with train = false leaves them unused. */
typedef struct {
    float *ln1_mean, *ln1_rstd; /* (B, N) */
    float *ln1_out;             /* (B, N, C): h1 */
    mha_acts attn;
    uint8_t *mask_attn;         /* (B, N, C) */
    float *res1;                /* (B, N, C): r1 */
    float *ln2_mean, *ln2_rstd; /* (B, N) */
    float *ln2_out;             /* (B, N, C): post-norm: the output; pre-norm: h2 */
    float *hidden;              /* (B, N, F): Drop(ReLU(.)) inside the FFN */
    uint8_t *mask_hidden;       /* (B, N, F) */
    uint8_t *mask_ffn;          /* (B, N, C) */
    float *res2;                /* (B, N, C): post-norm: r2; pre-norm: the output */
} enc_acts;

/* Shared by all layers, contents not kept between calls. */
typedef struct {
    mha_scratch attn;
    float *branch;           /* (B, N, C): a residual branch's output */
    float *d1, *d2;          /* (B, N, C): gradients inside the layer */
    float *dhidden;          /* (B, N, F) */
} enc_scratch;

void enc_carve_params(tf_table *t, enc_params *p, const enc_config *c);
/* Per-layer activations for (B, N); masks only when with_dropout. */
void enc_carve_acts(tf_table *t, enc_acts *a, const enc_config *c, int B, int N, size_t attn_saved_bytes,
                    bool with_dropout);
void enc_carve_scratch(tf_table *t, enc_scratch *s, const enc_config *c, int B, int N);

/* The layer's output tensor inside its activations (ln2_out or res2). */
float *enc_output(const enc_config *c, const enc_acts *a);

/* x (B, N, C) -> enc_output(). Dropout when train and c->dropout > 0 (the masks must
 * have been carved), with masks from (seed, stream_base + site). */
int enc_forward(attn *a, const enc_config *c, const mha_dims *d, const mha_run *run, const float *x,
                const enc_params *p, enc_acts *act, enc_scratch *ws, bool train, uint64_t seed, uint64_t stream_base);
/* dx (B, N, C) += and g += from dout (B, N, C), for the forward just run (same train
 * flag). dout is not modified; dx must not alias dout. */
int enc_backward(attn *a, const enc_config *c, const mha_dims *d, float *dx, const enc_params *g, const float *dout,
                 const float *x, const enc_params *p, const enc_acts *act, enc_scratch *ws, bool train);

#endif
