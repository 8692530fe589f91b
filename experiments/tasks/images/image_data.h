/* Readers of the image data sets of the images experiment (experiments/images/README.md):
 * IDX files of unsigned bytes (MNIST, Fashion-MNIST), plain or gzip-compressed, and the
 * binary release of CIFAR-10.
 *
 * IDX: a big-endian header, the magic 0x00 0x00 TYPE NDIM (TYPE 0x08: unsigned bytes)
 * and NDIM dimensions of 4 bytes each, then the elements in row-major order. Images
 * are (n, rows, cols), labels (n). A file whose first two bytes are the gzip magic is
 * decompressed on the fly (zlib's gzread); any other file is read as it is.
 *
 * CIFAR-10 binary: records of 1 label byte and 3072 pixel bytes (32 x 32 x 3: the R
 * plane, then G, then B, each row-major), 10,000 per file in the official release
 * (data_batch_1.bin .. data_batch_5.bin, test_batch.bin); any whole number of records
 * is read.
 *
 * Every failure is one line naming the file, AB_EINVAL through ab_fail (harness/error.h):
 * a missing or non-regular file, a file that is not of the format (magic, element type,
 * number of dimensions), a zero or oversized dimension, a file shorter than its header
 * announces (truncated) or longer (bytes after the data), a gzip stream that does not
 * decompress, a label count different from the image count, a label outside
 * [0, classes). AB_ENOMEM when the data does not fit in memory, AB_EIO when reading
 * fails. There is no size limit beyond what size_t and int can index: a header that
 * announces more data than the file has is refused as truncated, without allocating
 * what it announced. */
#ifndef AB_IMAGES_IMAGE_DATA_H
#define AB_IMAGES_IMAGE_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* n images of rows x cols pixels of `channels` values (bytes 0..255) each, and their
 * labels. */
typedef struct {
    long long n;
    int rows, cols, channels; /* channels 1 (greyscale) or 3 (RGB) */
    bool planar;              /* channels stored as planes (CIFAR-10: R plane, G, B); else interleaved */
    size_t image_bytes;       /* rows * cols * channels */
    unsigned char *pixels;    /* n * image_bytes (tracked allocator) */
    unsigned char *labels;    /* n labels in [0, classes), or NULL when none were read */
    int classes;
} img_set;

/* Reads an IDX file of images: unsigned bytes of shape (n, rows, cols), n, rows and
 * cols >= 1, rows * cols < 2^31. Fills s (channels 1, no labels yet). */
int img_read_idx_images(const char *path, img_set *s);

/* Reads an IDX file of labels (unsigned bytes, shape (n)) for the images already in s:
 * its count must be s->n and every label in [0, classes). `images_path` names the
 * images' file in the count message. */
int img_read_idx_labels(const char *path, const char *images_path, int classes, img_set *s);

/* Reads CIFAR-10 binary files one after the other into one set (32 x 32 x 3, planar,
 * labels in [0, 10)): each file a whole number (>= 1) of 3073-byte records. */
int img_read_cifar(const char *const *paths, int n_paths, img_set *s);

void img_set_free(img_set *s);

/* The values of one image as the sequence the model reads: raster order (row by row,
 * left to right), the channels of each pixel in turn (R, G, B). out: image_bytes ints. */
void img_raster(const img_set *s, long long index, int *out);

/* CRC-32 (zlib's) of the pixels and then the labels: a fingerprint of the data. */
uint32_t img_crc32(const img_set *s);

#endif
