/* Data-parallel communication (dist.h): the none and mpi engines, and the rank-order
 * sum they share with the nccl engine (dist_nccl.c). */
#include "dist.h"

#include "device.h"
#include "dist_internal.h"
#include "error.h"
#include "timer.h"

#include <stdlib.h>
#include <string.h>

#ifdef AB_HAVE_MPI
#include <mpi.h>
#endif

const char *ab_dist_kind_name(ab_dist_kind k) {
    switch (k) {
    case AB_DIST_NONE: return "none";
    case AB_DIST_MPI: return "mpi";
    case AB_DIST_NCCL: return "nccl";
    }
    return NULL;
}

int ab_dist_kind_parse(const char *s, ab_dist_kind *k) {
    for (int i = 0; i <= AB_DIST_NCCL; i++)
        if (strcmp(s, ab_dist_kind_name((ab_dist_kind)i)) == 0) {
            *k = (ab_dist_kind)i;
            return 0;
        }
    return ab_fail(AB_EINVAL, "--dist %s: unknown (none, mpi or nccl)", s);
}

bool ab_dist_built(ab_dist_kind k, const char **why) {
    const char *w = NULL;
#ifndef AB_HAVE_MPI
    if (k != AB_DIST_NONE) w = "this build has no MPI (install libopenmpi-dev and rebuild)";
#endif
    if (!w && k == AB_DIST_NCCL && !dist_nccl_built()) w = "this build has no CUDA backend (nccl runs on CUDA devices)";
    if (why) *why = w;
    return w == NULL;
}

void ab_dist_add_floats(float *acc, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] = acc[i] + x[i];
}

ab_dist_kind ab_dist_kind_of(const ab_dist *d) { return d ? d->kind : AB_DIST_NONE; }
int ab_dist_rank(const ab_dist *d) { return d ? d->rank : 0; }
int ab_dist_size(const ab_dist *d) { return d ? d->size : 1; }
double ab_dist_comm_seconds(const ab_dist *d) { return d ? d->comm_s : 0.0; }
double ab_dist_comm_bytes(const ab_dist *d) { return d ? d->comm_bytes : 0.0; }

float *dist_stage(ab_dist *d, size_t floats) {
    if (floats <= d->stage_cap) return d->stage;
    float *p = realloc(d->stage, sizeof(float) * floats);
    if (!p) {
        ab_fail(AB_ENOMEM, "out of memory for %zu floats of communication buffers", floats);
        return NULL;
    }
    d->stage = p;
    d->stage_cap = floats;
    return p;
}

#ifdef AB_HAVE_MPI
static int mpi_failed(int err, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", err);
    return ab_fail(AB_EIO, "MPI: %s failed: %s", what, msg);
}
#define MPI_TRY(call, what)                                                                                            \
    do {                                                                                                               \
        int e_ = (call);                                                                                               \
        if (e_ != MPI_SUCCESS) return mpi_failed(e_, what);                                                            \
    } while (0)

int dist_mpi_start(ab_dist *d) {
    int inited = 0;
    MPI_TRY(MPI_Initialized(&inited), "MPI_Initialized");
    if (!inited) {
        MPI_TRY(MPI_Init(NULL, NULL), "MPI_Init");
        d->mpi_owned = true;
    }
    /* errors come back as codes (the default handler aborts without a word of ours) */
    MPI_TRY(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    MPI_TRY(MPI_Comm_rank(MPI_COMM_WORLD, &d->rank), "MPI_Comm_rank");
    MPI_TRY(MPI_Comm_size(MPI_COMM_WORLD, &d->size), "MPI_Comm_size");
    return 0;
}

/* The rank-order sum on host memory: all-to-all of the chunks, their sum by the
 * chunk's owner, all-gather. */
static int mpi_sum_host(ab_dist *d, float *x, size_t n) {
    const size_t R = (size_t)d->size, c = (n + R - 1) / R;
    if (c > (size_t)0x7fffffff) return ab_fail(AB_EINVAL, "MPI: %zu floats per rank is more than one call sends", c);
    float *buf = dist_stage(d, 2 * R * c);
    if (!buf) return AB_ENOMEM;
    float *send = buf, *recv = buf + R * c;
    memcpy(send, x, sizeof(float) * n);
    memset(send + n, 0, sizeof(float) * (R * c - n));
    MPI_TRY(MPI_Alltoall(send, (int)c, MPI_FLOAT, recv, (int)c, MPI_FLOAT, MPI_COMM_WORLD), "MPI_Alltoall");
    float *mine = send; /* the sum of this rank's chunk, in rank order */
    memcpy(mine, recv, sizeof(float) * c);
    for (size_t r = 1; r < R; r++) ab_dist_add_floats(mine, recv + r * c, c);
    MPI_TRY(MPI_Allgather(mine, (int)c, MPI_FLOAT, recv, (int)c, MPI_FLOAT, MPI_COMM_WORLD), "MPI_Allgather");
    memcpy(x, recv, sizeof(float) * n);
    d->comm_bytes += 2.0 * (double)(R - 1) * (double)c * sizeof(float);
    return 0;
}
#endif

int ab_dist_open(ab_dist_kind kind, ab_device device, ab_dist **out) {
    *out = NULL;
    const char *why;
    if (!ab_dist_built(kind, &why)) return ab_fail(AB_EUNSUPPORTED, "--dist %s: %s", ab_dist_kind_name(kind), why);
    ab_dist *d = calloc(1, sizeof *d);
    if (!d) return ab_fail(AB_ENOMEM, "out of memory");
    d->kind = kind;
    d->size = 1;
    d->device = device;
    int rc = 0;
#ifdef AB_HAVE_MPI
    if (kind != AB_DIST_NONE) rc = dist_mpi_start(d);
    if (!rc && kind == AB_DIST_NCCL) rc = dist_nccl_start(d);
#endif
    if (rc) {
        ab_dist_close(d);
        return rc;
    }
    *out = d;
    return 0;
}

void ab_dist_close(ab_dist *d) {
    if (!d) return;
    if (d->kind == AB_DIST_NCCL) dist_nccl_stop(d);
#ifdef AB_HAVE_MPI
    if (d->mpi_owned) {
        int fin = 0;
        if (MPI_Finalized(&fin) == MPI_SUCCESS && !fin) MPI_Finalize();
    }
#endif
    free(d->stage);
    free(d);
}

int ab_dist_sum_floats(ab_dist *d, ab_device mem, float *x, size_t n) {
    if (!d || d->size == 1 || n == 0) return 0;
    const uint64_t t0 = ab_now_ns();
    int rc = 0;
    if (d->kind == AB_DIST_NCCL) {
        rc = dist_nccl_sum(d, mem, x, n);
    } else {
#ifdef AB_HAVE_MPI
        if (ab_dev_host_memory(mem)) {
            rc = mpi_sum_host(d, x, n);
        } else {
            /* device memory through a host copy (the nccl engine keeps it on the device) */
            float *h = malloc(sizeof(float) * n);
            if (!h) return ab_fail(AB_ENOMEM, "out of memory for %zu floats of gradients", n);
            rc = ab_dev_download(mem, h, x, sizeof(float) * n);
            if (!rc) rc = mpi_sum_host(d, h, n);
            if (!rc) rc = ab_dev_upload(mem, x, h, sizeof(float) * n);
            free(h);
        }
#else
        rc = ab_fail(AB_EUNSUPPORTED, "this build has no MPI");
#endif
    }
    d->comm_s += (double)(ab_now_ns() - t0) * 1e-9;
    return rc;
}

int ab_dist_allgather(ab_dist *d, const void *mine, size_t bytes, void *all) {
    if (!d || d->size == 1) {
        memcpy(all, mine, bytes);
        return 0;
    }
#ifdef AB_HAVE_MPI
    if (bytes > (size_t)0x7fffffff) return ab_fail(AB_EINVAL, "MPI: %zu bytes is more than one call sends", bytes);
    const uint64_t t0 = ab_now_ns();
    MPI_TRY(MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD), "MPI_Allgather");
    d->comm_s += (double)(ab_now_ns() - t0) * 1e-9;
    d->comm_bytes += (double)(d->size - 1) * (double)bytes;
    return 0;
#else
    return ab_fail(AB_EUNSUPPORTED, "this build has no MPI");
#endif
}

int ab_dist_barrier(ab_dist *d) {
    if (!d || d->size == 1) return 0;
#ifdef AB_HAVE_MPI
    const uint64_t t0 = ab_now_ns();
    MPI_TRY(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    d->comm_s += (double)(ab_now_ns() - t0) * 1e-9;
#endif
    return 0;
}

void ab_dist_abort(ab_dist *d, int status) {
    if (!d || d->kind == AB_DIST_NONE) return;
#ifdef AB_HAVE_MPI
    MPI_Abort(MPI_COMM_WORLD, status);
#else
    (void)status;
#endif
}
