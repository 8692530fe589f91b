#include "blas.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <strings.h>

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
    /* A product with one row or one column is a matrix-vector product: OpenBLAS's sgemm
     * takes its small-matrix kernel there, which at m = 1 ran 5-8x slower than sgemv
     * (the dense layers of one generated position: (1, 256) x (256, 1024)). */
    /* sgemv scales y by beta first; with beta = 0 the old contents (maybe NaN scratch)
     * must not survive, whatever a BLAS does with 0 * NaN */
    if (beta == 0.0f && (m == 1 || n == 1))
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) c[(size_t)i * ldc + j] = 0.0f;
    if (m == 1) { /* c[0, :] = alpha op(B)^T a' + beta c, a' = row 0 of op(A) */
        const int inc_a = trans_a ? lda : 1;
        if (trans_b) cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, alpha, b, ldb, a, inc_a, beta, c, 1);
        else cblas_sgemv(CblasRowMajor, CblasTrans, k, n, alpha, b, ldb, a, inc_a, beta, c, 1);
        return;
    }
    if (n == 1) { /* c[:, 0] = alpha op(A) b' + beta c, b' = column 0 of op(B) */
        const int inc_b = trans_b ? 1 : ldb;
        if (trans_a) cblas_sgemv(CblasRowMajor, CblasTrans, k, m, alpha, a, lda, b, inc_b, beta, c, ldc);
        else cblas_sgemv(CblasRowMajor, CblasNoTrans, m, k, alpha, a, lda, b, inc_b, beta, c, ldc);
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

const char *ab_blas_better_core(void) {
    /* the cores OpenBLAS's DYNAMIC_ARCH falls back to (no AVX2 kernels) */
    static const char *const generic[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                                          "Katmai", "Coppermine", "Northwood", "Banias", "Unknown"};
    const char *env = getenv("OPENBLAS_CORETYPE"), *core = openblas_get_corename();
    if ((env && *env) || !core) return NULL;
    bool fallback = false;
    for (size_t i = 0; i < sizeof generic / sizeof generic[0]; i++)
        if (strcasecmp(core, generic[i]) == 0) fallback = true;
    if (!fallback) return NULL;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    /* libgcc sets the AVX features only where the OS saves their registers (XCR0) */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}
int ab_blas_parallel(void) { return openblas_get_parallel(); }

const char *ab_blas_parallel_name(int model) {
    switch (model) {
    case 0: return "sequential";
    case 1: return "pthreads";
    case 2: return "openmp";
    default: return "unknown";
    }
}
