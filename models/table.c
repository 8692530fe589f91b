#include "table.h"

#include "../harness/error.h"
#include "../harness/memory.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tf_table_init(tf_table *t, size_t unit, size_t align) {
    memset(t, 0, sizeof *t);
    t->unit = unit;
    t->align = align ? align : 1;
}

void tf_table_begin(tf_table *t, void *base) {
    t->n = 0;
    t->total = 0;
    t->base = base;
    t->prefix[0] = '\0';
    t->err = 0;
}

void tf_table_free(tf_table *t) {
    free(t->t);
    t->t = NULL;
    t->n = t->cap = 0;
}

void tf_table_prefix(tf_table *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->prefix, sizeof t->prefix, fmt, ap);
    va_end(ap);
}

void *tf_carve(tf_table *t, const char *name, size_t elem_size, bool decay, int ndim, int64_t d0, int64_t d1,
               int64_t d2, int64_t d3) {
    if (t->err) return NULL;
    int64_t d[TF_MAX_DIMS] = {d0, d1, d2, d3};
    if (ndim < 1 || ndim > TF_MAX_DIMS || elem_size == 0 || elem_size % t->unit != 0) {
        t->err = ab_fail(AB_EINVAL, "tensor %s%s: bad shape or element size", t->prefix, name);
        return NULL;
    }
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (d[i] < 0 || ab_mul_size(count, (size_t)d[i], &count)) {
            t->err = ab_fail(AB_EINVAL, "tensor %s%s: size overflows", t->prefix, name);
            return NULL;
        }
    }
    size_t units, off = (t->total + t->align - 1) / t->align * t->align;
    if (ab_mul_size(count, elem_size / t->unit, &units) || off < t->total || off + units < off ||
        (off + units) > SIZE_MAX / t->unit) {
        t->err = ab_fail(AB_EINVAL, "tensor %s%s: size overflows", t->prefix, name);
        return NULL;
    }
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        tf_tensor *nt = realloc(t->t, sizeof *nt * (size_t)cap);
        if (!nt) {
            t->err = ab_fail(AB_ENOMEM, "out of memory for a size table");
            return NULL;
        }
        t->t = nt;
        t->cap = cap;
    }
    tf_tensor *e = &t->t[t->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s%s", t->prefix, name);
    e->offset = off;
    e->count = count;
    e->elem_size = elem_size;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = d[i];
    e->decay = decay;
    t->total = off + units;
    if (!t->base || count == 0) return NULL;
    return t->base + off * t->unit;
}

size_t tf_table_bytes(const tf_table *t) {
    const size_t a = t->align * t->unit, bytes = t->total * t->unit, pad = (a - bytes % a) % a;
    return bytes > SIZE_MAX - pad ? SIZE_MAX : bytes + pad; /* SIZE_MAX: no allocation gets it */
}

const tf_tensor *tf_table_find(const tf_table *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->t[i].name, name) == 0) return &t->t[i];
    return NULL;
}
