/* What the CUDA suite's files share (tests/attention/test_cuda.c defines it): the variants' cases,
 * device buffers, running a problem on both devices and comparing them, and the
 * tolerances with their reasons. Built twice, as test_cuda.c is: against the real
 * library and against the emulated one (tests/meson.build). */
#ifndef AB_TEST_CUDA_UTIL_H
#define AB_TEST_CUDA_UTIL_H

#include "attention.h"
#include "test_util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CUDA vs CPU, forward. Both are float32 with the same formulas and different summation
 * orders (cuBLAS or the emulator's double-accumulated GEMM vs OpenBLAS's blocking; float
 * row sums in a block reduction vs double on the CPU). Each side is within the CPU
 * suite's bound of the double reference (test_softmax.c FWD_TOL: the worst-case float
 * sum over N <= 300 terms, 2e-5), so they agree within twice that. Measured on the
 * emulator: up to 6e-7 (60x margin). A mask or indexing error is O(1e-2) or more. */
#define FWD_TOL 4e-5
/* Backward: the same argument with the CPU suite's BWD_TOL (5e-5) on each side.
 * Measured on the emulator: up to 7e-7. lsh (sums over at most 2 chunk keys per row
 * and R rounds, the same buckets on both devices) measures up to 2.1e-7 forward and
 * 4.7e-7 backward. */
#define BWD_TOL 1e-4
/* Recurrent steps and prefill vs the forward of the same device: same products in
 * another order (one row against the cache vs blocks of rows), so the forward's bound.
 * Measured on the emulator: up to 4e-7. */
#define STEP_TOL FWD_TOL
/* linear (elu, taylor) is within the same bounds with more room: features >= 0 (elu) or
 * a constant 1 dominating (taylor), no cancellation; measured up to 8e-7 (out, dq, dk,
 * dv, steps). polynomial: its features have mixed signs, so where c + scale q.k nearly
 * cancels, the float sums over C = 1 + D + D^2 terms lose digits on either side (the CPU
 * suite, test_linear.c, documents up to 1e-4 relative in its recurrent check): its
 * tolerances are 4x the above. Measured on the emulator: D = 8: up to 2.7e-5 (dk, c=0.5
 * scale=0.3), out 2.4e-6, steps 1.5e-5; D = 48 (C = 2353): dk 6.4e-5, dq 4.4e-5, out
 * 1.2e-5 (6x margin at the worst). favor, efficient and local are within the plain
 * bounds (positive features or probabilities, sums over at most N keys): measured on
 * the emulator up to 9.4e-7 (favor, with keys large enough to need the shifts), 2.2e-7
 * (efficient), 4.5e-7 (local, steps included); at N = 1 the floored dq, dk figures reach
 * 2e-6 of 1e-5. */
#define POLY_TOL_FACTOR 4.0
/* precision=tf32 (cases whose settings say so): the fused kernels' products round their
 * operands to TF32 (unit roundoff 2^-11 = 4.9e-4, 8192 times float's) on the tensor
 * cores and sum in float; favor's projections, which go into exponentials, are split
 * into two TF32 parts (about float accuracy). An output is a ratio of sums of products
 * of two rounded operands each, so its error is a few units of 4.9e-4 relative to the
 * terms: TF32_TOL_FACTOR makes the bounds 100 x FWD_TOL = 4e-3 forward and 1e-2
 * backward (polynomial 4x that). Measured on the emulator (whose tensor-core products
 * are exact and summed in float; the hardware's order differs): elu, taylor, favor out
 * up to 8.9e-4, steps 8.2e-4, dq, dk, dv up to 1.8e-3 (5.5x margin); at N = 1 the
 * floored dq, dk (floor 1) 1.8e-3; polynomial out 1.9e-3, dq 5.7e-3, dk 1.0e-2 (4x
 * margin: c + scale q.k cancelling, as in fp32). The fused kernels in fp32 (the plain
 * bounds): elu, taylor out 3.9e-7, backward 1.4e-6; favor 5.8e-7 and 3.5e-6 (keys
 * large enough for the shifts); at N = 1 (floor 0.1) 5.6e-6; polynomial out 1.2e-5,
 * backward 6.4e-5 (D = 48), steps 1.3e-5. */
#define TF32_TOL_FACTOR 100.0

typedef struct {
    const char *variant;
    const char *settings[4];
    int n_settings;
    bool expected; /* the backend must exist (a missing one fails the suite) */
} cuda_variant;

typedef struct {
    float *out, *dq, *dk, *dv;
} grads;

const char *label(const cuda_variant *cv, char *buf, size_t cap);
attn *make(const cuda_variant *cv, ab_device dev);
/* Skips the test when there is no CUDA here (build or device); fails when an expected
 * variant has no CUDA backend. */
void require_cuda(void);

/* Device buffers (dpoison: filled with NaN bytes). */
float *dalloc(size_t n);
float *dupload(const float *h, size_t n);
float *dpoison(size_t n);
void ddownload(float *h, const float *d, size_t n);
void dfree(void *d);

void grads_alloc(grads *g, const tu_problem *p);
void grads_free(grads *g);
void run_cpu(const cuda_variant *cv, const tu_problem *p, grads *g);
void run_cuda(const cuda_variant *cv, const tu_problem *p, grads *g, bool repeat);

/* Variants whose CUDA backend runs softmax's fused kernels and saves O and the rows'
 * log-sum-exps (softmax, stateful-softmax, local), and those bytes for a shape:
 * B*H*N*M floats rounded up to 256 bytes, then B*H*N floats. */
bool tc_flash_saves(const char *variant);
size_t tc_flash_saved_bytes(const attn_shape *s);

/* The tolerance factor of a variant (polynomial's mixed-sign features: POLY_TOL_FACTOR). */
double tol_factor(const cuda_variant *cv);
void expect_close_floor(const float *got, const float *want, size_t n, double tol, double floor, const char *what,
                        const char *ctx);
void expect_close(const float *got, const float *want, size_t n, double tol, const char *what, const char *ctx);

/* CUDA == CPU for one variant and problem, forward and backward (dq and dk judged at the
 * scale max(max |want|, qk_floor)); check_parallel makes the problem (a causal one is
 * skipped for a non-causal-only variant). */
void check_problem_floor(const cuda_variant *cv, tu_problem *pp, bool repeat, double qk_floor);
void check_problem(const cuda_variant *cv, tu_problem *p, bool repeat);
void check_parallel_floor(const cuda_variant *cv, int B, int H, int N, int D, int M, bool causal, const int *lengths,
                          uint64_t seed, bool repeat, double qk_floor);
void check_parallel(const cuda_variant *cv, int B, int H, int N, int D, int M, bool causal, const int *lengths,
                    uint64_t seed, bool repeat);
/* prefill(P) (P < 0: none) then steps P..N-1 on the device, against the causal forward
 * of the CPU and of the device. with_out: the prefill returns its outputs. */
void check_recurrent(const cuda_variant *cv, int B, int H, int N, int D, int M, int capacity, int P, bool with_out,
                     uint64_t seed);

#endif
