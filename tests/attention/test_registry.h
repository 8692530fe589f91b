/* What the files of the registry suite share (test_registry.c defines it). */
#ifndef AB_TEST_REGISTRY_H
#define AB_TEST_REGISTRY_H

#include "attention.h"
#include "cuda_device.h"
#include "blas.h"
#include "error.h"
#include "feature_maps.h"
#include "memory.h"
#include "test_util.h"

#include <criterion/criterion.h>

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* attn_option_value that must succeed (a static buffer: one at a time). */
const char *val(const attn *a, const attn_shape *s, const char *key);

/* A CPU instance of `variant` with n settings, its parameters (if it has any) bound
 * for sequences of up to MAX_LEN positions, its own input (if it reads one: gla, deltanet)
 * bound to a constant in its range; asserts that it is made. */
attn *make(const char *variant, int n, const char *const *settings);

/* Whether variant i is causal only (deltanet): it refuses a non-causal shape with
 * ATTN_EUNSUPPORTED, saying so ("causal only"). */
bool causal_only(int i);

/* The shape {B, H, N, D, M, causal, lengths}. */
attn_shape shape(int B, int H, int N, int D, int M, bool causal, const int *lengths);

#endif
