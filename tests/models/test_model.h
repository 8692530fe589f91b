/* What the files of the model suite share (test_model.c defines it): a mid-sized model
 * and its batches for the step-level checks. */
#ifndef AB_TEST_MODEL_H
#define AB_TEST_MODEL_H

#include <criterion/criterion.h>

#include "error.h"
#include "lstm.h"
#include "memory.h"
#include "optim.h"
#include "ref_mixture.h"
#include "ref_model.h"
#include "rng.h"
#include "test_model_util.h"
#include "test_util.h"
#include "transformer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A mid-sized model for the step-level checks. */
tf_config mid_config(const char *variant, float dropout);

/* A batch of B rows of N random tokens and targets below V, row i of length
 * N - 7i mod N (weights 1 within it, 0 past it). */
typedef struct {
    int B, N;
    int *tokens, *targets, lengths[8];
    float *weights;
} batch;
batch make_batch(int B, int N, int V, uint64_t seed);
void free_batch(batch *b);

/* One forward, loss and backward on the batch (gradients zeroed first); the loss. */
double train_step(tf_model *m, const batch *b, uint64_t seed);

#endif
