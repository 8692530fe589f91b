/* Matrix products and thread control. All matrices row-major. */
#ifndef AB_BLAS_H
#define AB_BLAS_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C[m x n] = alpha * op(A) op(B) + beta * C, op(X) = X or X^T (row-major, leading
 * dimensions in elements). Runs on the calling thread alone when called from inside an
 * OpenMP parallel region (OpenBLAS's OpenMP build does this itself). */
void ab_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc);

/* Threads used by our OpenMP loops and by OpenBLAS. n <= 0: all cores. */
void ab_set_threads(int n);
int ab_threads(void);

/* OpenBLAS's build string, the core type it runs with (openblas_get_corename(), e.g.
 * "Haswell": the one chosen at load time, which OPENBLAS_CORETYPE overrides), and its
 * thread count. */
const char *ab_blas_config(void);
const char *ab_blas_corename(void);
int ab_blas_threads(void);
/* The OPENBLAS_CORETYPE worth setting for this CPU, or NULL. OpenBLAS picks its kernels
 * once, at load time, from the CPU model; on a model newer than the library (Debian
 * 12's 0.3.21 on a 5th-generation Xeon, say) it falls back to a generic core such as
 * "Prescott", whose sgemm ran 6x slower than the AVX-512 one on such a machine (18 vs
 * 109 GFLOP/s, one thread, n = 1024). Non-NULL only when the core in use is such a
 * fallback, OPENBLAS_CORETYPE is unset, and the CPU (with the OS) supports more:
 * "SkylakeX" with AVX-512 F, BW, DQ and VL, else "Haswell" with AVX2 and FMA. */
const char *ab_blas_better_core(void);
/* OpenBLAS's threading model (openblas_get_parallel()): 0 sequential, 1 pthreads,
 * 2 OpenMP; and its name ("sequential", "pthreads", "openmp", else "unknown"). */
int ab_blas_parallel(void);
const char *ab_blas_parallel_name(int model);

#ifdef __cplusplus
}
#endif

#endif
