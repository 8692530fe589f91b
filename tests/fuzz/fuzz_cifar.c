/* experiments/tasks/images/image_data.c: the CIFAR-10 binary reader on any bytes, as one file
 * and as the same file twice (one set from several files). */
#include "error.h"
#include "fuzz_util.h"
#include "image_data.h"

static void read_files(const char *const *paths, int n, size_t size) {
    img_set s;
    int rc = img_read_cifar(paths, n, &s);
    if (rc) {
        fuzz_refused(rc, "img_read_cifar");
    } else {
        if (s.n < 1 || (size_t)s.n * 3073 != (size_t)n * size || s.image_bytes != 3072 || !s.labels)
            fuzz_fail("img_read_cifar", "accepted %lld records from %d files of %zu bytes", s.n, n, size);
        for (long long i = 0; i < s.n; i++)
            if (s.labels[i] >= 10) fuzz_fail("img_read_cifar", "accepted label %d", s.labels[i]);
        img_crc32(&s);
        img_set_free(&s);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("data_batch.bin", data, size);
    const char *paths[2] = {path, path};
    read_files(paths, 1, size);
    read_files(paths, 2, size);
    fuzz_no_tracked_memory("CIFAR-10 reader");
    return 0;
}
