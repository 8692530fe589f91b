/* What the files of the layers suite share (test_layers.c defines it): the tolerances
 * with their reasons, gradient checks against finite differences of a double
 * reference, and the thread count. */
#ifndef AB_TEST_LAYERS_H
#define AB_TEST_LAYERS_H

#include <criterion/criterion.h>

#include "attention.h"
#include "encoder.h"
#include "layers.h"
#include "mha.h"
#include "mixture_core.h"
#include "ref_mixture.h"
#include "ref_model.h"
#include "rng.h"
#include "test_util.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FD_STEP 1e-5

/* Forward of the position-wise layers (sums of <= 33 float products against double):
 * measured <= 3e-7 (tensor-relative); 1e-5 is a 30x margin and far below any indexing
 * or formula error (1e-3 and up). */
#define FWD_TOL 1e-5
/* Backward of the position-wise layers: measured <= 1.5e-7; 1e-5 as above. */
#define BWD_TOL 1e-5
/* Attention block and encoder layer: a chain of up to nine float32 stages (projections,
 * attention, LN, FFN), each adding ~1e-7 relative; LN's division by a row's standard
 * deviation can amplify by a few. Measured forward <= 3e-7 and backward <= 4.2e-7;
 * 2e-5 leaves a factor of about 50, while a wrong term (a missing residual, scale,
 * mask or transpose) gives errors of 1e-2 to 1. */
#define BLOCK_TOL 2e-5

#define MAXT 16
/* Tensors a double reference reads (double copies, perturbed by the finite
 * differences) and the float gradients the layer's backward produced for them. */
typedef struct {
    int nt;
    const char *name[MAXT];
    double *x[MAXT];
    size_t n[MAXT];
    const float *grad[MAXT];
} gcheck;

/* n floats of 1 + sd * normal (layer-norm gains) */
void fill_gain(float *x, size_t n, uint64_t seed, uint64_t stream, double sd);
void gadd(gcheck *g, const char *name, double *x, size_t n, const float *grad);
/* Every gradient in g against finite differences of sum(fwd(ctx) * w). */
void check_grads(const gcheck *g, tu_forward_fn fwd, void *ctx, const double *w, size_t nout, double tol,
                 const char *what);
/* tu_rel_err of a forward result (printed under TEST_VERBOSE). */
double fwd_err(const float *got, const double *want, size_t n);
void set_threads(int n);

#endif
