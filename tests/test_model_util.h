/* Shared helpers of the model suites (test_model, test_model_cuda, test_train): the
 * tiny transformer they check, and the double reference's view of a model's
 * parameters. */
#ifndef AB_TEST_MODEL_UTIL_H
#define AB_TEST_MODEL_UTIL_H

#include "ref_model.h"
#include "transformer.h"

/* The defaults with V = 5, max_len = 6, C = 8, 2 heads, 2 layers, F = 16, no dropout,
 * seed 3 and the given attention variant. */
tf_config tm_tiny_config(const char *variant);

/* The reference's parameter pointers into pd, a double copy of the model's parameters,
 * by name; asserts that every tensor of the model has exactly one place. */
ref_params tm_ref_params(const tf_model *m, const double *pd);

#endif
