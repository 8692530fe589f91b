/* NumPy .npy files: float32, int32 and int64, little-endian, C order; versions 1.0,
 * 2.0 and 3.0 on reading, 1.0 on writing. Anything else is refused with a message. */
#ifndef AB_NPY_H
#define AB_NPY_H

#include <stddef.h>
#include <stdint.h>

#define AB_NPY_MAX_DIMS 8

typedef enum { AB_F32 = 0, AB_I32 = 1, AB_I64 = 2 } ab_dtype;

typedef struct {
    ab_dtype dtype;
    int ndim;
    int64_t shape[AB_NPY_MAX_DIMS];
    size_t count; /* product of shape (1 for ndim == 0) */
    void *data;   /* from ab_alloc (NULL when count == 0) */
} ab_array;

const char *ab_dtype_name(ab_dtype t);
size_t ab_dtype_size(ab_dtype t);

/* Reads PATH into *out. 0, or AB_EINVAL / AB_EIO / AB_ENOMEM with a message that
 * names the file and the problem (wrong magic, unsupported dtype, Fortran order,
 * truncated data, trailing bytes, ...). */
int ab_npy_read(const char *path, ab_array *out);
/* Writes atomically (see fileio.h). */
int ab_npy_write(const char *path, ab_dtype dtype, int ndim, const int64_t *shape, const void *data);
void ab_array_free(ab_array *a);

#endif
