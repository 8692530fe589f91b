/* Size tables (the llm.c way): a model's parameters, gradients and activations each
 * live in one allocation, carved into named tensors by a table of offsets and counts.
 *
 * A table is built by running the same sequence of tf_carve() calls twice: first on an
 * unbound table (base NULL), which only records names, offsets and the total size;
 * then, after the caller has allocated `total` units, on the bound table, which records
 * the same entries again and hands out pointers. Code that describes a layer's buffers
 * therefore exists once and serves both sizing and binding.
 *
 * Units: a parameter table counts floats (unit 4 bytes, no padding between tensors, so
 * the parameters are one flat float array an optimiser can walk); an activation table
 * counts bytes (unit 1) and starts every tensor on a 64-byte boundary. */
#ifndef AB_MODELS_TABLE_H
#define AB_MODELS_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TF_NAME_MAX 64
#define TF_MAX_DIMS 4

typedef struct {
    char name[TF_NAME_MAX];   /* e.g. "layers.2.ffn.w1" */
    size_t offset;            /* from the buffer start, in the table's units */
    size_t count;             /* elements */
    size_t elem_size;         /* bytes per element: 4 (float) or 1 (byte) */
    int ndim;
    int64_t shape[TF_MAX_DIMS];
    bool decay;               /* parameters: weight decay applies (dense weights only) */
} tf_tensor;

typedef struct {
    tf_tensor *t;             /* entries (malloc'ed metadata) */
    int n, cap;
    size_t total;             /* units so far */
    size_t unit;              /* bytes per offset unit: 4 (parameters) or 1 (activations) */
    size_t align;             /* alignment of each tensor, in units */
    char *base;               /* NULL while sizing; the allocation while binding */
    char prefix[TF_NAME_MAX]; /* prepended to names */
    int err;                  /* first error (AB_ENOMEM / AB_EINVAL), message already set */
} tf_table;

void tf_table_init(tf_table *t, size_t unit, size_t align);
/* Starts a pass: binding to `base` (or sizing when NULL); entries are recorded anew. */
void tf_table_begin(tf_table *t, void *base);
void tf_table_free(tf_table *t);
void tf_table_prefix(tf_table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Adds a tensor of `elem_size`-byte elements and shape d[0..ndim-1] (count = product;
 * a count of 0 is allowed and gives NULL). Returns its address while binding, NULL
 * while sizing. Errors (overflow, bad element size) are kept in t->err. */
void *tf_carve(tf_table *t, const char *name, size_t elem_size, bool decay, int ndim, int64_t d0, int64_t d1,
               int64_t d2, int64_t d3);

static inline float *tf_carve_f(tf_table *t, const char *name, bool decay, int ndim, int64_t d0, int64_t d1,
                                int64_t d2, int64_t d3) {
    return (float *)tf_carve(t, name, sizeof(float), decay, ndim, d0, d1, d2, d3);
}

/* The bytes to allocate for the table: its total, rounded up to its alignment. Device
 * memory is aligned as its size is (cudaMalloc: 256; the strict emulator's: the
 * largest power of two dividing the size, with the data ending at a guard page), so
 * an allocation of a whole number of alignments puts every tensor at its alignment,
 * where one of, say, 4 mod 8 bytes would leave doubles carved at 64-byte offsets on
 * 4-byte addresses. */
size_t tf_table_bytes(const tf_table *t);

/* The entry named `name`, or NULL. */
const tf_tensor *tf_table_find(const tf_table *t, const char *name);

#endif
