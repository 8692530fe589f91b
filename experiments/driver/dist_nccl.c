/* The nccl engine of dist.h: the rank-order sum on device memory with NCCL's
 * point-to-point sends and receives (the all-to-all of the chunks), the owner's sum of
 * its chunks in rank order (the same float additions as the other engines, as a
 * device kernel: ld_residual_acc), and NCCL's all-gather. libnccl.so.2 (or the library
 * AB_NCCL_LIBRARY names) is opened at run time, as cuBLAS is, so that the build needs
 * neither its headers nor the library; MPI starts the ranks and carries NCCL's unique
 * id from rank 0 to the others. Each rank uses the CUDA device of its rank among the
 * ranks on its node (modulo the devices it sees). */
#include "dist_internal.h"

#include "cuda_device.h"
#include "device.h"
#include "error.h"
#include "layers_dev.h"

#include <stdlib.h>
#include <string.h>

bool dist_nccl_built(void) { return ab_cuda_built(); }

#ifndef AB_HAVE_MPI
int dist_nccl_start(ab_dist *d) {
    (void)d;
    return ab_fail(AB_EUNSUPPORTED, "--dist nccl: this build has no MPI");
}
void dist_nccl_stop(ab_dist *d) { (void)d; }
int dist_nccl_sum(ab_dist *d, ab_device mem, float *x, size_t n) {
    (void)d, (void)mem, (void)x, (void)n;
    return ab_fail(AB_EUNSUPPORTED, "--dist nccl: this build has no MPI");
}
#else
#include <dlfcn.h>
#include <mpi.h>

/* The part of NCCL's C interface used here (nccl.h, stable since NCCL 2.7): results
 * are ints (0: ncclSuccess), a communicator and a stream are pointers, the unique id is
 * 128 bytes passed by value, ncclFloat32 is 7. */
typedef struct {
    char internal[128];
} nccl_unique_id;
enum { NCCL_FLOAT32 = 7 };

typedef struct {
    void *lib, *comm;
    int (*get_unique_id)(nccl_unique_id *);
    int (*comm_init_rank)(void **, int, nccl_unique_id, int);
    int (*comm_destroy)(void *);
    int (*group_start)(void);
    int (*group_end)(void);
    int (*send)(const void *, size_t, int, int, void *, void *);
    int (*recv)(void *, size_t, int, int, void *, void *);
    int (*all_gather)(const void *, void *, size_t, int, void *, void *);
    const char *(*error_string)(int);
    float *buf; /* device: 2 R c floats (grown) */
    size_t buf_cap;
} nccl_state;

static int nccl_failed(const nccl_state *s, int r, const char *what) {
    return ab_fail(AB_EDEVICE, "NCCL: %s failed: %s (%d)", what, s->error_string ? s->error_string(r) : "?", r);
}
#define NCCL_TRY(s, call, what)                                                                                        \
    do {                                                                                                               \
        int r_ = (call);                                                                                               \
        if (r_ != 0) return nccl_failed(s, r_, what);                                                                  \
    } while (0)

static int load(nccl_state *s) {
    const char *name = getenv("AB_NCCL_LIBRARY");
    if (!name || !*name) name = "libnccl.so.2";
    if (!(s->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)))
        return ab_fail(AB_EUNSUPPORTED,
                       "--dist nccl: cannot load %s: %s (set AB_NCCL_LIBRARY to the library's path, e.g. the one "
                       "PyTorch ships)",
                       name, dlerror());
#define LOAD(field, sym)                                                                                               \
    if (!(*(void **)&s->field = dlsym(s->lib, sym))) return ab_fail(AB_EUNSUPPORTED, "--dist nccl: %s lacks %s", name, sym);
    LOAD(get_unique_id, "ncclGetUniqueId")
    LOAD(comm_init_rank, "ncclCommInitRank")
    LOAD(comm_destroy, "ncclCommDestroy")
    LOAD(group_start, "ncclGroupStart")
    LOAD(group_end, "ncclGroupEnd")
    LOAD(send, "ncclSend")
    LOAD(recv, "ncclRecv")
    LOAD(all_gather, "ncclAllGather")
    LOAD(error_string, "ncclGetErrorString")
#undef LOAD
    return 0;
}

int dist_nccl_start(ab_dist *d) {
    if (d->device != AB_DEV_CUDA) return ab_fail(AB_EINVAL, "--dist nccl sums on CUDA devices: use it with --device cuda");
    nccl_state *s = calloc(1, sizeof *s);
    if (!s) return ab_fail(AB_ENOMEM, "out of memory");
    d->nccl = s;
    int rc = load(s);
    if (rc) return rc;
    /* the device of this rank among its node's ranks, before CUDA starts */
    MPI_Comm node;
    int local = 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_rank(node, &local);
        MPI_Comm_free(&node);
    }
    /* the command line may have started CUDA already (on the device the launcher's
     * local rank chose: ab_cuda_init) */
    if (!ab_cuda_ready() && (rc = ab_cuda_select_device(local))) return rc;
    if ((rc = ab_dev_init(AB_DEV_CUDA))) return rc;
    nccl_unique_id id;
    memset(&id, 0, sizeof id);
    if (d->rank == 0) NCCL_TRY(s, s->get_unique_id(&id), "ncclGetUniqueId");
    if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        return ab_fail(AB_EIO, "MPI: MPI_Bcast of NCCL's unique id failed");
    NCCL_TRY(s, s->comm_init_rank(&s->comm, d->size, id, d->rank), "ncclCommInitRank");
    return 0;
}

void dist_nccl_stop(ab_dist *d) {
    nccl_state *s = d->nccl;
    if (!s) return;
    if (s->buf) ab_dev_free(AB_DEV_CUDA, s->buf);
    if (s->comm) s->comm_destroy(s->comm);
    if (s->lib) dlclose(s->lib);
    free(s);
    d->nccl = NULL;
}

int dist_nccl_sum(ab_dist *d, ab_device mem, float *x, size_t n) {
    nccl_state *s = d->nccl;
    if (mem != AB_DEV_CUDA) return ab_fail(AB_EINVAL, "--dist nccl sums device memory (the parameters are on the CPU)");
    const size_t R = (size_t)d->size, c = (n + R - 1) / R;
    int rc;
    if (2 * R * c > s->buf_cap) {
        if (s->buf) ab_dev_free(AB_DEV_CUDA, s->buf);
        s->buf = NULL;
        s->buf_cap = 0;
        if ((rc = ab_dev_malloc(AB_DEV_CUDA, (void **)&s->buf, sizeof(float) * 2 * R * c))) return rc;
        s->buf_cap = 2 * R * c;
    }
    float *send = s->buf, *recv = s->buf + R * c;
    if ((rc = ab_dev_copy(AB_DEV_CUDA, send, x, sizeof(float) * n)) ||
        (rc = ab_dev_memset(AB_DEV_CUDA, send + n, 0, sizeof(float) * (R * c - n))))
        return rc;
    void *stream = ab_cuda_stream_handle();
    NCCL_TRY(s, s->group_start(), "ncclGroupStart");
    for (size_t r = 0; r < R; r++) {
        NCCL_TRY(s, s->send(send + r * c, c, NCCL_FLOAT32, (int)r, s->comm, stream), "ncclSend");
        NCCL_TRY(s, s->recv(recv + r * c, c, NCCL_FLOAT32, (int)r, s->comm, stream), "ncclRecv");
    }
    NCCL_TRY(s, s->group_end(), "ncclGroupEnd");
    /* this rank's chunk: the ranks' pieces added in rank order */
    float *mine = send;
    if ((rc = ab_dev_copy(AB_DEV_CUDA, mine, recv, sizeof(float) * c))) return rc;
    for (size_t r = 1; r < R; r++)
        if ((rc = ld_residual_acc(AB_DEV_CUDA, mine, recv + r * c, c))) return rc;
    NCCL_TRY(s, s->all_gather(mine, recv, c, NCCL_FLOAT32, s->comm, stream), "ncclAllGather");
    if ((rc = ab_dev_copy(AB_DEV_CUDA, x, recv, sizeof(float) * n))) return rc;
    d->comm_bytes += 2.0 * (double)(R - 1) * (double)c * sizeof(float);
    return ab_dev_sync(AB_DEV_CUDA);
}
#endif
