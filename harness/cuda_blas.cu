/* Row-major GEMM on cuBLAS (see cuda_blas.h for the operand swap). */
#include "cuda_compat.h"

/* cuBLAS batch counts per call (grid dimension limits in some of its kernels). */
#define MAX_BATCH_PER_CALL 65535LL

/* The precision asked for, and the math mode the handle has (set lazily, before a
 * product: -1 until the first). */
static ab_precision g_prec = AB_PREC_FP32;
static int g_handle_prec = -1;

extern "C" const char *ab_precision_name(ab_precision p) {
    return p == AB_PREC_FP32 ? "fp32" : p == AB_PREC_TF32 ? "tf32" : "?";
}

extern "C" ab_precision ab_cuda_set_gemm_precision(ab_precision p) {
    const ab_precision old = g_prec;
    g_prec = p;
    return old;
}

extern "C" int ab_cuda_sgemm_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                                     int lda, long long stride_a, const float *b, int ldb, long long stride_b,
                                     float beta, float *c, int ldc, long long stride_c, long long batch) {
    if (m < 0 || n < 0 || k < 0 || batch < 0)
        return ab_fail(AB_EINVAL, "ab_cuda_sgemm: negative size (m=%d n=%d k=%d batch=%lld)", m, n, k, batch);
    /* Row-major leading dimensions: A is m x k (or k x m transposed), B k x n (n x k). */
    const int cols_a = trans_a ? m : k, cols_b = trans_b ? k : n;
    if (lda < (cols_a > 1 ? cols_a : 1) || ldb < (cols_b > 1 ? cols_b : 1) || ldc < (n > 1 ? n : 1))
        return ab_fail(AB_EINVAL, "ab_cuda_sgemm: leading dimension too small (lda=%d ldb=%d ldc=%d for m=%d n=%d k=%d)",
                       lda, ldb, ldc, m, n, k);
    if (m == 0 || n == 0 || batch == 0) return 0;
    AB_TRY(ab_cuda_init());
    cublasHandle_t h = ab_cublas();
    if ((int)g_prec != g_handle_prec) {
        AB_CUBLAS_CHECK(AB_CUBLAS(SetMathMode)(h, g_prec == AB_PREC_TF32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
        g_handle_prec = (int)g_prec;
    }
    /* Column-major view: C^T (n x m) = op(B)^T (n x k) op(A)^T (k x m). */
    const cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    for (long long i = 0; i < batch; i += MAX_BATCH_PER_CALL) {
        long long nb = batch - i < MAX_BATCH_PER_CALL ? batch - i : MAX_BATCH_PER_CALL;
        if (nb == 1)
            AB_CUBLAS_CHECK(AB_CUBLAS(Sgemm)(h, ob, oa, n, m, k, &alpha, b + i * stride_b, ldb, a + i * stride_a, lda,
                                        &beta, c + i * stride_c, ldc));
        else
            AB_CUBLAS_CHECK(AB_CUBLAS(SgemmStridedBatched)(h, ob, oa, n, m, k, &alpha, b + i * stride_b, ldb, stride_b,
                                                      a + i * stride_a, lda, stride_a, &beta, c + i * stride_c, ldc,
                                                      stride_c, (int)nb));
    }
    return 0;
}

extern "C" int ab_cuda_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                             const float *b, int ldb, float beta, float *c, int ldc) {
    return ab_cuda_sgemm_batched(trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}
