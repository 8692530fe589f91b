/* The CUDA device's table of layers (layers_dev.h), built from the CUDA entry points
 * (layers_cuda.h, ctc.h, lstm_step.h, cuda_blas.h); most have the table's signature
 * already, the others get a line of adaptation here. Empty in a build without CUDA:
 * layers_dev.c then has no table for the device. */
#include "layers_dev.h"

#ifdef ATTNBENCH_HAVE_CUDA

#include "layers_cuda.h"

static int cuda_rows_copy(float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows, size_t cols) {
    return rows_copy_cuda(dst, (long long)dst_ld, src, (long long)src_ld, (long long)rows, (long long)cols);
}

static int cuda_embedding_backward(float *dwte, const float *dout, const int *tokens, const int *order,
                                   const int *starts, int BT, int C, int V) {
    (void)tokens, (void)BT;
    return embedding_backward_cuda(dwte, dout, order, starts, V, C);
}

const ld_ops ld_ops_cuda = {
    .zero = zero_cuda,
    .copy = copy_cuda,
    .rows_copy = cuda_rows_copy,
    .draw_rows = draw_rows_cuda,
    .embedding_forward = embedding_forward_cuda,
    .embedding_backward = cuda_embedding_backward,
    .positions_add = positions_add_cuda,
    .layernorm_forward = layernorm_forward_cuda,
    .layernorm_backward = layernorm_backward_cuda,
    .dense_forward = dense_forward_cuda,
    .dense_backward = dense_backward_cuda,
    .dropout_forward = dropout_forward_cuda,
    .dropout_backward = dropout_backward_cuda,
    .ffn_forward = ffn_forward_cuda,
    .ffn_backward = ffn_backward_cuda,
    .heads_split = heads_split_cuda,
    .heads_join = heads_join_cuda,
    .heads_merge = heads_merge_cuda,
    .heads_unmerge = heads_unmerge_cuda,
    .embedding_positions = embedding_positions_cuda,
    .bias_heads_split = bias_heads_split_cuda,
    .bias_relu = bias_relu_cuda,
    .bias_residual_layernorm = bias_residual_layernorm_cuda,
    .residual_add = residual_add_cuda,
    .residual_acc = residual_acc_cuda,
    .scale = scale_inplace_cuda,
    .gate_act_forward = gate_act_forward_cuda,
    .gate_act_backward = gate_act_backward_cuda,
    .cross_entropy_forward = cross_entropy_forward_cuda,
    .cross_entropy_backward = cross_entropy_backward_cuda,
    .mixture_forward = mixture_forward_cuda,
    .mixture_backward = mixture_backward_cuda,
    .ctc_forward = ctc_forward_cuda,
    .ctc_backward = ctc_backward_cuda,
    .lstm_step_forward = lstm_step_forward_cuda,
    .lstm_step_backward = lstm_step_backward_cuda,
    .gemm = ab_cuda_sgemm,
    .cross_entropy_ws_bytes = cross_entropy_cuda_ws_bytes,
    .set_gemm_precision = ab_cuda_set_gemm_precision,
    .token_index = true,
};

#else
/* ISO C wants a translation unit to declare something. */
typedef int ld_no_cuda_table;
#endif
