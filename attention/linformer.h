/* Internal: linformer's layout of parameters and saved state, shared by its CPU
 * (linformer.c) and CUDA (linformer_cuda.cu) backends. */
#ifndef ATTN_LINFORMER_H
#define ATTN_LINFORMER_H

#include "variant.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* E and F inside the bound parameters: E [k x ld] first, F after it (share=none), or
 * F = E (kv, layer); ld = the max_len they were bound for. */
static inline const float *lfm_E(const attn *a) { return a->params; }
static inline const float *lfm_F(const attn *a) {
    return a->p.share == ATTN_LFM_SHARE_NONE ? a->params + (size_t)a->p.proj_k * (size_t)a->param_len : a->params;
}
static inline float *lfm_dE(const attn *a) { return a->param_grads; }
static inline float *lfm_dF(const attn *a) {
    if (!a->param_grads) return NULL;
    return a->p.share == ATTN_LFM_SHARE_NONE ? a->param_grads + (size_t)a->p.proj_k * (size_t)a->param_len
                                             : a->param_grads;
}

/* The saved buffer, per slice bh in order: A [N x k] (the softmax probabilities, rows
 * < L written), Kp [k x D], Vp [k x M]. In floats. */
static inline size_t lfm_saved_slice_floats(const attn *a, const attn_shape *s) {
    return (size_t)a->p.proj_k * ((size_t)s->len + (size_t)s->qk_dim + (size_t)s->v_dim);
}

#ifdef __cplusplus
}
#endif

#endif
