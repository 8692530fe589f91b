/* softmax attention on CUDA (parallel mode of `softmax` and `stateful-softmax`): the
 * fused forward and backward of flash_softmax.cu (online softmax over key tiles in
 * shared memory, the rows' log-sum-exps saved for backward, no N x N buffer), with the
 * contract of the CPU version (softmax.c) but not its saved state: the CPU keeps the
 * N x N probabilities, this backend the output O and the log-sum-exp of every row,
 * B*H*N*(M + 1) floats (smx_cuda_saved_bytes), and its backward recomputes the
 * probabilities tile by tile. Workspace: B*H*N floats (backward's dO . O per row).
 * forward takes saved = NULL (out only). */
#include "softmax_cuda.h"

#include "cuda_util.cuh"
#include "flash_softmax.h"

extern "C" int smx_cuda_check_shape(const attn *a, const attn_shape *s) {
    (void)a;
    return flash_attn_check_shape("softmax", s);
}

extern "C" size_t smx_cuda_saved_bytes(const attn *a, const attn_shape *s) {
    (void)a;
    return flash_attn_saved_bytes(s);
}

extern "C" size_t smx_cuda_workspace_bytes(const attn *a, const attn_shape *s) {
    (void)a;
    return flash_attn_workspace_bytes(s);
}

extern "C" int smx_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                float *out, void *saved) {
    return flash_attn_forward(a, s, 0, q, k, v, out, saved);
}

extern "C" int smx_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                 const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    return flash_attn_backward(a, s, 0, q, k, v, dout, saved, dq, dk, dv);
}
