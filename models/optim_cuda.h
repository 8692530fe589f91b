/* Internal: the optimiser's kernels on CUDA (models/optim_cuda.cu), called by optim.c
 * for an optimiser created on AB_DEV_CUDA. Not installed.
 *
 * Same results as the CPU, bit for bit (given the same parameters and gradients):
 * - the norm partials are the CPU's: one thread per block of `block` entries adds
 *   g_i^2 in double in index order (each product is exact in double, so a fused
 *   multiply-add gives the same sums); optim.c adds the partials on the host in
 *   block order, as on the CPU;
 * - the update is the CPU's expression, operation by operation, with the IEEE
 *   round-to-nearest intrinsics (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn), which
 *   the compiler never fuses; the CPU side is C11 without contraction. */
#ifndef AB_OPTIM_CUDA_H
#define AB_OPTIM_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The per-step scalars of the update (optim.h), rounded to float once. */
typedef struct {
    float gscale;   /* clipping factor */
    float b1, c1;   /* beta1, 1 - beta1 */
    float b2, c2;   /* beta2, 1 - beta2 */
    float alpha;    /* step size multiplying m (or m / denom) */
    float vscale;   /* denom = sqrt(v) * vscale + eps */
    float eps;
    float keep;     /* decoupled decay factor for decayed ranges */
    float l2;       /* L2 coefficient for decayed ranges */
} ab_optim_coef;

/* A range of the parameter array in device memory (ab_optim_range's fields). */
typedef struct {
    size_t offset, count;
    int decay;
} optim_cuda_range;

/* partials[b] = sum of g_i^2 over i in [b block, (b + 1) block) ∩ [0, n) (device). */
int optim_cuda_norm_partials(double *partials, const float *g, size_t n, size_t block);
/* One step of the n parameters p (device arrays p, g, m, v of n floats) over the
 * ranges (device array of n_ranges covering [0, n)): adaptive (Adam, rectified RAdam)
 * or momentum (RAdam's first steps). */
int optim_cuda_update(float *p, const float *g, float *m, float *v, size_t n, const optim_cuda_range *ranges,
                      int n_ranges, const ab_optim_coef *k, bool adaptive);

#ifdef __cplusplus
}
#endif

#endif
