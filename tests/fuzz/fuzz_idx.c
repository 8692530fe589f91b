/* experiments/tasks/images/image_data.c: the IDX reader (plain or gzip) on any bytes, as
 * images (3 dimensions) and as labels (1 dimension) of a set of as many images as the
 * input's first dimension says, so that the label checks are reached. */
#include "error.h"
#include "fuzz_util.h"
#include "image_data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("input.idx", data, size);
    img_set s;
    int rc = img_read_idx_images(path, &s);
    if (rc) {
        fuzz_refused(rc, "img_read_idx_images");
    } else {
        if (s.n < 1 || s.rows < 1 || s.cols < 1 || s.image_bytes != (size_t)s.rows * (size_t)s.cols || !s.pixels)
            fuzz_fail("img_read_idx_images", "accepted %lld images of %d x %d", s.n, s.rows, s.cols);
        img_crc32(&s); /* reads every pixel */
        img_set_free(&s);
    }
    /* labels for a set of n images (n from the header, when it has one) */
    img_set t = {0};
    t.n = size >= 8 ? (long long)((uint32_t)data[4] << 24 | (uint32_t)data[5] << 16 | (uint32_t)data[6] << 8 | data[7])
                    : 1;
    rc = img_read_idx_labels(path, "images.idx", 10, &t);
    if (rc) {
        fuzz_refused(rc, "img_read_idx_labels");
    } else {
        for (long long i = 0; i < t.n; i++)
            if (t.labels[i] >= 10) fuzz_fail("img_read_idx_labels", "accepted label %d", t.labels[i]);
    }
    img_set_free(&t);
    fuzz_no_tracked_memory("IDX reader");
    return 0;
}
