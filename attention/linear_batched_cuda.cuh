/* Internal: linear and polynomial's batched CUDA path (linear_batched_cuda.cu: cuBLAS
 * strided-batched products over chunks) and the configuration the two paths of
 * linear_cuda.cu share. C++ (CUDA). */
#ifndef ATTN_LINEAR_BATCHED_CUDA_CUH
#define ATTN_LINEAR_BATCHED_CUDA_CUH

#include "feature_maps_cuda.cuh"

struct lin_cfg {
    fm_dev f;               /* f.W, f.WT: favor's projection on the device, once drawn */
    const fm_cuda_map *map; /* the launchers of the attention's feature map */
    int T, C, D, M, M1;
    double eps;
    bool scaled; /* log-scaled map (favor) */
};

/* The call's configuration: the attention's feature map (the CPU's, lin_feature_map),
 * the batched path's chunk, the sizes and eps. */
void lin_cfg_make(const attn *a, const attn_shape *s, lin_cfg *g);
/* favor: W drawn from the seed on the host, W and its transpose copied to the device
 * (W, WT, C x D and D x C), set as the configuration's. */
int lin_draw_projection(attn *a, lin_cfg &c, float *W, float *WT);
/* The batched path's workspace (all slices and chunks, or its budget lin_cuda_ws_floats),
 * forward and backward over every run of the shape, and the causal forward of a prefill
 * over P positions of n_slices slices that keeps the running state (and favor's key
 * shifts kls) in the recurrent state. 0 or an error code with a message. */
size_t lin_batched_workspace_bytes(const attn *a, const attn_shape *s);
int lin_batched_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out);
int lin_batched_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                         const float *dout, float *dq, float *dk, float *dv);
int lin_batched_prefill(attn *a, const lin_cfg &c, long long n_slices, int P, const float *q, const float *k,
                        const float *v, float *out, float *state, float *kls);

#endif
