/* main() of the suites built against the real CUDA library (test_cuda, test_model_cuda,
 * test_cuda_selftest): without a usable device every test skips, and the binary exits
 * with 77 so that meson counts the suite as skipped. Before that it checks what needs
 * no device: that cuBLAS, which the library opens at run time (cuda_compat.h), loads
 * with every function the library uses, so machines without a GPU (CI) check it too. */
#include "cuda_device.h"
#include "error.h"

#include <criterion/criterion.h>

#include <stdio.h>

int main(int argc, char *argv[]) {
    if (ab_cuda_built() && !ab_cuda_emulated() && ab_cuda_load_cublas()) {
        fprintf(stderr, "FAIL: %s\n", ab_error());
        return 1;
    }
    if (ab_cuda_init()) {
        fprintf(stderr, "skipped: %s\n", ab_error());
        return 77;
    }
    struct criterion_test_set *tests = criterion_initialize();
    int result = 0;
    if (criterion_handle_args(argc, argv, true)) result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    return result;
}
