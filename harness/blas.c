#include "blas.h"

#include <cblas.h>
#include <omp.h>

/* OpenBLAS extensions (declared in its cblas.h too, repeated for clarity and for
 * cblas.h files that lack some of them). */
extern char *openblas_get_config(void);
extern char *openblas_get_corename(void);
extern void openblas_set_num_threads(int);
extern int openblas_get_num_threads(void);
extern int openblas_get_parallel(void);

void ab_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        /* BLAS would leave C untouched for beta == 1 only; make k == 0 mean alpha*0. */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
                alpha, a, lda, b, ldb, beta, c, ldc);
}

static int g_threads = 0;

void ab_set_threads(int n) {
    if (n <= 0) n = omp_get_num_procs();
    g_threads = n;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int ab_threads(void) { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

const char *ab_blas_config(void) { return openblas_get_config(); }
const char *ab_blas_corename(void) { return openblas_get_corename(); }
int ab_blas_threads(void) { return openblas_get_num_threads(); }
int ab_blas_parallel(void) { return openblas_get_parallel(); }

const char *ab_blas_parallel_name(int model) {
    switch (model) {
    case 0: return "sequential";
    case 1: return "pthreads";
    case 2: return "openmp";
    default: return "unknown";
    }
}
