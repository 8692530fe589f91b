#include "npy.h"

#include "error.h"
#include "fileio.h"
#include "memory.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char NPY_MAGIC[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

const char *ab_dtype_name(ab_dtype t) {
    switch (t) {
    case AB_F32: return "float32";
    case AB_I32: return "int32";
    case AB_I64: return "int64";
    }
    return "?";
}

size_t ab_dtype_size(ab_dtype t) { return t == AB_I64 ? 8 : 4; }

static const char *descr_of(ab_dtype t) { return t == AB_F32 ? "<f4" : t == AB_I32 ? "<i4" : "<i8"; }

void ab_array_free(ab_array *a) {
    if (!a) return;
    ab_free(a->data);
    a->data = NULL;
    a->count = 0;
}

/* Finds 'key' in the header dict and returns a pointer just after its colon. */
static const char *dict_value(const char *hdr, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *p = strstr(hdr, pat);
    if (!p) {
        snprintf(pat, sizeof pat, "\"%s\"", key);
        p = strstr(hdr, pat);
    }
    if (!p) return NULL;
    p += strlen(pat);
    while (isspace((unsigned char)*p)) p++;
    if (*p != ':') return NULL;
    p++;
    while (isspace((unsigned char)*p)) p++;
    return p;
}

static int parse_header(const char *path, const char *hdr, ab_array *out) {
    const char *d = dict_value(hdr, "descr");
    if (!d || (*d != '\'' && *d != '"')) return ab_fail(AB_EINVAL, "%s: malformed .npy header (no 'descr')", path);
    char q = *d++;
    const char *e = strchr(d, q);
    if (!e || e - d > 15) return ab_fail(AB_EINVAL, "%s: malformed .npy header ('descr')", path);
    char descr[16];
    memcpy(descr, d, (size_t)(e - d));
    descr[e - d] = '\0';
    if (strcmp(descr, "<f4") == 0) out->dtype = AB_F32;
    else if (strcmp(descr, "<i4") == 0) out->dtype = AB_I32;
    else if (strcmp(descr, "<i8") == 0) out->dtype = AB_I64;
    else
        return ab_fail(AB_EINVAL,
                       "%s: dtype '%s' is not supported (need little-endian float32 '<f4', int32 '<i4' or int64 '<i8')",
                       path, descr);

    const char *f = dict_value(hdr, "fortran_order");
    if (!f) return ab_fail(AB_EINVAL, "%s: malformed .npy header (no 'fortran_order')", path);
    if (strncmp(f, "True", 4) == 0)
        return ab_fail(AB_EINVAL, "%s: Fortran-order arrays are not supported (save with C order)", path);
    if (strncmp(f, "False", 5) != 0) return ab_fail(AB_EINVAL, "%s: malformed .npy header ('fortran_order')", path);

    const char *s = dict_value(hdr, "shape");
    if (!s || *s != '(') return ab_fail(AB_EINVAL, "%s: malformed .npy header (no 'shape')", path);
    s++;
    out->ndim = 0;
    out->count = 1;
    for (;;) {
        while (isspace((unsigned char)*s) || *s == ',') s++;
        if (*s == ')') break;
        if (!isdigit((unsigned char)*s)) return ab_fail(AB_EINVAL, "%s: malformed .npy header ('shape')", path);
        if (out->ndim == AB_NPY_MAX_DIMS)
            return ab_fail(AB_EINVAL, "%s: more than %d dimensions", path, AB_NPY_MAX_DIMS);
        errno = 0;
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || v > (unsigned long long)INT64_MAX)
            return ab_fail(AB_EINVAL, "%s: dimension out of range in 'shape'", path);
        s = end;
        out->shape[out->ndim++] = (int64_t)v;
        if (ab_mul_size(out->count, (size_t)v, &out->count) != 0)
            return ab_fail(AB_EINVAL, "%s: shape too large", path);
    }
    return 0;
}

int ab_npy_read(const char *path, ab_array *out) {
    memset(out, 0, sizeof *out);
    int rc;
    FILE *f = ab_fopen_regular(path, "", &rc);
    if (!f) return rc;
    unsigned char pre[12];
    char *hdr = NULL;
    size_t got = fread(pre, 1, 10, f);
    if (got == 0) {
        rc = ab_fail(AB_EINVAL, "%s: empty file, not a .npy file", path);
        goto done;
    }
    if (got < 10 && memcmp(pre, NPY_MAGIC, got < 6 ? got : 6) == 0) {
        rc = ab_fail(AB_EINVAL, "%s: truncated .npy preamble (%zu bytes)", path, got);
        goto done;
    }
    if (got < 10 || memcmp(pre, NPY_MAGIC, 6) != 0) {
        rc = ab_fail(AB_EINVAL, "%s: not a .npy file (bad magic)", path);
        goto done;
    }
    unsigned major = pre[6];
    size_t hlen;
    if (major == 1) {
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    } else if (major == 2 || major == 3) {
        if (fread(pre + 10, 1, 2, f) != 2) {
            rc = ab_fail(AB_EINVAL, "%s: truncated .npy header", path);
            goto done;
        }
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)pre[10] << 16) | ((size_t)pre[11] << 24);
    } else {
        rc = ab_fail(AB_EINVAL, "%s: unsupported .npy version %u.%u", path, major, (unsigned)pre[7]);
        goto done;
    }
    if (hlen > (1u << 20)) {
        rc = ab_fail(AB_EINVAL, "%s: .npy header length %zu is implausible", path, hlen);
        goto done;
    }
    hdr = malloc(hlen + 1);
    if (!hdr) {
        rc = ab_fail(AB_ENOMEM, "out of memory reading %s", path);
        goto done;
    }
    if (fread(hdr, 1, hlen, f) != hlen) {
        rc = ab_fail(AB_EINVAL, "%s: truncated .npy header", path);
        goto done;
    }
    hdr[hlen] = '\0';
    if ((rc = parse_header(path, hdr, out)) != 0) goto done;

    size_t bytes;
    if (ab_mul_size(out->count, ab_dtype_size(out->dtype), &bytes) != 0) {
        rc = ab_fail(AB_EINVAL, "%s: shape too large", path);
        goto done;
    }
    /* The data must be there before it is allocated: a short file that promises a
     * huge shape is bad input (truncated), not a request for that much memory. */
    long here = ftell(f);
    struct stat st;
    if (here >= 0 && fstat(fileno(f), &st) == 0 && (uint64_t)st.st_size - (uint64_t)here < (uint64_t)bytes) {
        rc = ab_fail(AB_EINVAL, "%s: truncated data (%llu of %zu bytes)", path,
                     (unsigned long long)((uint64_t)st.st_size - (uint64_t)here), bytes);
        goto done;
    }
    const char *big = ab_too_large(bytes);
    if (big) {
        rc = ab_fail(AB_EINVAL, "%s: %zu bytes of data, %s", path, bytes, big);
        goto done;
    }
    if (bytes > 0) {
        out->data = ab_alloc(bytes);
        if (!out->data) {
            rc = ab_fail(AB_ENOMEM, "out of memory reading %s (%zu bytes)", path, bytes);
            goto done;
        }
        size_t n = fread(out->data, 1, bytes, f);
        if (n != bytes) {
            rc = ab_fail(AB_EINVAL, "%s: truncated data (%zu of %zu bytes)", path, n, bytes);
            goto done;
        }
    }
    if (fgetc(f) != EOF) {
        rc = ab_fail(AB_EINVAL, "%s: trailing bytes after the data (shape says %zu elements)", path, out->count);
        goto done;
    }
done:
    free(hdr);
    fclose(f);
    if (rc != 0) ab_array_free(out);
    return rc;
}

int ab_npy_write(const char *path, ab_dtype dtype, int ndim, const int64_t *shape, const void *data) {
    if (ndim < 0 || ndim > AB_NPY_MAX_DIMS) return ab_fail(AB_EINVAL, "%s: bad number of dimensions %d", path, ndim);
    char dict[512];
    int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr_of(dtype));
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return ab_fail(AB_EINVAL, "%s: negative dimension", path);
        len += snprintf(dict + len, sizeof dict - (size_t)len, "%" PRId64 ",%s", shape[i],
                        (i + 1 < ndim) ? " " : "");
        if (ab_mul_size(count, (size_t)shape[i], &count) != 0) return ab_fail(AB_EINVAL, "%s: shape too large", path);
    }
    /* NumPy writes (n,) for 1-D and (a, b) otherwise; drop the trailing comma for ndim > 1. */
    if (ndim > 1) len--;
    len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
    /* Pad with spaces so magic + 4 + header is a multiple of 64, ending in '\n'. */
    size_t total = 10 + (size_t)len + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)len + pad + 1;

    ab_atomic_file af;
    int rc = ab_atomic_open(&af, path);
    if (rc) return rc;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    fwrite(pre, 1, 10, af.f);
    fwrite(dict, 1, (size_t)len, af.f);
    for (size_t i = 0; i < pad; i++) fputc(' ', af.f);
    fputc('\n', af.f);
    if (count > 0) fwrite(data, ab_dtype_size(dtype), count, af.f);
    return ab_atomic_commit(&af);
}
