/* harness/npy.c: ab_npy_read on any bytes. An accepted file is consistent: a shape of at
 * most AB_NPY_MAX_DIMS non-negative dimensions whose product is the count, and data
 * exactly when there are elements. */
#include "fuzz_util.h"
#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ab_array a;
    int rc = ab_npy_read(fuzz_file("input.npy", data, size), &a);
    if (rc) {
        fuzz_refused(rc, "ab_npy_read");
    } else {
        if (a.ndim < 0 || a.ndim > AB_NPY_MAX_DIMS) fuzz_fail("ab_npy_read", "accepted %d dimensions", a.ndim);
        size_t count = 1;
        for (int i = 0; i < a.ndim; i++) {
            if (a.shape[i] < 0) fuzz_fail("ab_npy_read", "accepted dimension %d = %lld", i, (long long)a.shape[i]);
            count *= (size_t)a.shape[i];
        }
        if (count != a.count) fuzz_fail("ab_npy_read", "count %zu, shape's product %zu", a.count, count);
        if ((a.count > 0) != (a.data != NULL)) fuzz_fail("ab_npy_read", "%zu elements, data %p", a.count, a.data);
        if (a.count * ab_dtype_size(a.dtype) > size) fuzz_fail("ab_npy_read", "more data than the file holds");
        ab_array_free(&a);
    }
    fuzz_no_tracked_memory("ab_npy_read");
    return 0;
}
