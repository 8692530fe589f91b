/* Row-major matrix products on the CUDA device (cuBLAS on the library's stream), the
 * device counterpart of blas.h. cuBLAS is column-major: a row-major X (r x c, leading
 * dimension ld) is the column-major X^T, so C = op(A) op(B) is computed as
 * C^T = op(B)^T op(A)^T, i.e. cuBLAS with the operands swapped (cuda_blas.cu). */
#ifndef AB_CUDA_BLAS_H
#define AB_CUDA_BLAS_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The arithmetic of the device's float matrix products: fp32 (IEEE single precision
 * throughout), or tf32 (operands rounded to TF32, 10 mantissa bits, on the tensor cores;
 * products and sums in fp32). The attention variants' and the model's `precision`
 * option chooses; their values are these. */
typedef enum { AB_PREC_FP32 = 0, AB_PREC_TF32 = 1 } ab_precision;
#define AB_PREC_COUNT 2
const char *ab_precision_name(ab_precision p);

/* Sets the precision of the ab_cuda_sgemm* calls that follow (cuBLAS's math mode:
 * CUBLAS_DEFAULT_MATH for fp32, CUBLAS_TF32_TENSOR_OP_MATH for tf32) and returns the
 * previous one, so a caller restores it: p0 = ab_cuda_set_gemm_precision(p); ...;
 * ab_cuda_set_gemm_precision(p0). Process-wide (one cuBLAS handle); fp32 at start. */
ab_precision ab_cuda_set_gemm_precision(ab_precision p);

/* C[m x n] = alpha op(A) op(B) + beta C, op(X) = X or X^T, row-major, device pointers,
 * leading dimensions in elements. beta == 0: C is not read. Returns 0 or an error code
 * (AB_EINVAL for bad sizes, AB_EDEVICE / AB_ENOMEM from cuBLAS) with a message. */
int ab_cuda_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                  const float *b, int ldb, float beta, float *c, int ldc);

/* `batch` independent products: product i uses a + i * stride_a, b + i * stride_b and
 * c + i * stride_c (strides in elements; 0 reuses one matrix). Any batch count (split
 * into calls of at most 65535). */
int ab_cuda_sgemm_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                          long long stride_a, const float *b, int ldb, long long stride_b, float beta, float *c,
                          int ldc, long long stride_c, long long batch);

#ifdef __cplusplus
}
#endif

#endif
