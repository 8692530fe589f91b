/* The activation that makes a variant's own input (layers.h gate_act: gla's log-gate,
 * deltanet's rate) on CUDA against the CPU (part of test_model_cuda; the suite's
 * purpose and tolerances are described in test_model_cuda.c, its shared helpers in
 * test_model_cuda.h). */
#include "test_model_cuda.h"

#ifdef TEST_CUDA_BACKEND

/* Both kinds, forward and backward, over pre-activations from -40 to 40 (past the
 * ranges where sigmoid saturates and log sigmoid turns linear). The device evaluates
 * the same float formulas with its own expf/log1pf/expm1f, each within a few ulp:
 * LAYER_TOL (tensor-relative) bounds that with a wide margin, while a wrong formula
 * (a sign, the 1/16, the derivative's 1 - y) is off by 1e-2 or more. */
Test(layers_cuda, gate_activations) {
    require_cuda();
    const size_t n = 801;
    float *z = tu_alloc_f(n), *y = tu_alloc_f(n), *d = tu_normal(n, 5, 1, 1.0), *dz = tu_alloc_f(n);
    for (size_t i = 0; i < n; i++) z[i] = -40.0f + 0.1f * (float)i;
    for (int kind = 0; kind < 2; kind++) {
        memcpy(y, z, sizeof(float) * n);
        gate_act_forward(y, n, (gate_act)kind);
        float *d_y = dput(z, sizeof(float) * n);
        cr_assert_eq(gate_act_forward_cuda(d_y, n, (gate_act)kind), 0, "%s", ab_error());
        cr_expect_lt(dev_err(d_y, y, n, kind ? "sigmoid" : "logsigmoid/16"), LAYER_TOL);
        memcpy(dz, d, sizeof(float) * n);
        gate_act_backward(dz, y, n, (gate_act)kind);
        float *d_d = dput(d, sizeof(float) * n), *d_yc = dput(y, sizeof(float) * n);
        cr_assert_eq(gate_act_backward_cuda(d_d, d_yc, n, (gate_act)kind), 0, "%s", ab_error());
        cr_expect_lt(dev_err(d_d, dz, n, kind ? "sigmoid backward" : "logsigmoid/16 backward"), LAYER_TOL);
        dfree(d_y);
        dfree(d_d);
        dfree(d_yc);
    }
    free(z);
    free(y);
    free(d);
    free(dz);
}

#endif
