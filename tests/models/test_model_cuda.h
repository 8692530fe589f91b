/* What the files of the model_cuda suites share (test_model_cuda.c defines it): device
 * buffers, comparing a device result with the CPU's, and the tiny transformer on a
 * device (test_model_cuda_model.c). Built twice, as the suite is: against the real
 * library and against the emulated one (tests/meson.build). */
#ifndef AB_TEST_MODEL_CUDA_H
#define AB_TEST_MODEL_CUDA_H

#include <criterion/criterion.h>

#include "checkpoint.h"
#include "cuda_blas.h"
#include "cuda_device.h"
#include "device.h"
#include "error.h"
#include "layers.h"
#include "lstm.h"
#include "memory.h"
#include "optim.h"
#include "rng.h"
#include "test_model_util.h"
#include "test_util.h"
#include "transformer.h"
#ifdef TEST_CUDA_BACKEND
#include "layers_cuda.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef TEST_CUDA_EMU
/* The emulator's device capacity (tests/cuda_emu/cuda_emu.cpp). */
size_t ab_emu_device_memory(void);
void ab_emu_set_device_memory(size_t bytes);
/* Device operations queued so far: launches, GEMMs, copies, memsets (cuda_emu.cpp). */
unsigned long long ab_emu_op_count(void);
/* Those of them that copy between host and device memory. */
unsigned long long ab_emu_host_copy_count(void);
/* What the host handed the device: operations queued directly, a graph's launch once. */
unsigned long long ab_emu_submission_count(void);
/* The next stream capture fails at its end, as a GPU's may (cuda_emu.cpp). */
void ab_emu_spoil_next_capture(void);
#endif

/* Position-wise layers, forward and backward: the same formulas as the CPU's in another
 * summation order (cuBLAS, or the emulator's double-accumulated GEMM, against
 * OpenBLAS; row sums of a warp in double against a loop in double; fused
 * multiply-adds on the device). Sums over at most 40 terms of O(1) values: each side
 * is within test_layers.c's bounds of the exact result (measured <= 3e-7 there), so
 * 1e-5 covers both with a wide margin, while an indexing or formula error gives 1e-2
 * or more. Measured on the emulator: at most 1.3e-7 (FFN gradients; dense <= 8.7e-8,
 * layer norm <= 1.1e-7, cross-entropy 0). */
#define LAYER_TOL 1e-5

/* The whole model on CUDA against the model on the CPU: each is within test_model.c's
 * bounds of the double reference (logits <= 2.2e-7, gradients <= 1.3e-6 measured
 * there), so they agree within about the sum; the tolerances are test_model.c's
 * (1e-5 forward, 5e-5 gradients: 40x margins), while a missing term, a wrong mask or
 * a device buffer read before it is written (NaN on the emulator) is 1e-2 or worse.
 * Measured on the emulator: logits <= 2.5e-7, loss <= 3.7e-8 relative, gradients
 * <= 1.1e-6 per tensor (stateful-softmax; the others <= 6.9e-7). After one RAdam step
 * (its first is a momentum step, linear in the gradient, lr 1e-2) the parameters agree
 * to <= 9.1e-8 per tensor (a rounding of p): 1e-6 leaves 10x. linformer measures within
 * those figures (logits 1.8e-7, gradients 5.5e-7, a step 8e-8). */
#define MODEL_FWD_TOL 1e-5
#define MODEL_GRAD_TOL 5e-5
#define MODEL_STEP_TOL 1e-6

/* Skips the test when this build or machine has no CUDA device. */
void require_cuda(void);

/* Device copies of host data, and back; dfree releases a device buffer. */
void *dput(const void *h, size_t bytes);
void dget(void *h, const void *d, size_t bytes);
void dfree(void *d);
/* A malloc'ed copy of n floats. */
float *fdup(const float *x, size_t n);
/* Whether a device buffer holds the CPU's bytes exactly. */
bool dev_same(const void *d, const void *cpu, size_t bytes);
/* tu_rel_err of a device buffer against the CPU's float results (printed under
 * TEST_VERBOSE as `what`). */
double dev_err(const float *d, const float *cpu, size_t n, const char *what);

/* The tiny transformer of test_model_util.h on `dev`; make() creates it (skipping the
 * test where CUDA is not available); param_ranges() are its tensors' optimiser ranges
 * (malloc'ed). */
tf_config tiny_config(const char *variant, ab_device dev);
tf_model *make(const tf_config *c, int max_batch);
ab_optim_range *param_ranges(const tf_model *m);

#endif
