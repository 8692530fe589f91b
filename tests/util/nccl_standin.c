/* A stand-in for libnccl.so.2 for the tests: the part of NCCL's C interface that
 * experiments/driver/dist_nccl.c calls, on the CUDA emulator's device memory (which is
 * host memory) and carried by MPI, so that `attnbench-emu train --device cuda --dist
 * nccl` runs the nccl engine's own code (its chunks, sends, receives, device sums and
 * all-gather) on a machine without GPUs or NCCL, for the dist suite to compare with the
 * mpi engine. Loaded through AB_NCCL_LIBRARY. Not NCCL: the collectives are MPI's,
 * done when ncclGroupEnd (or the all-gather) is called. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char internal[128];
} ncclUniqueId;

enum { OK = 0, SYSTEM_ERROR = 2, INVALID_ARGUMENT = 4 };

typedef struct {
    int rank, size;
} standin_comm;

typedef struct {
    int send; /* 1: send, 0: receive */
    void *buf;
    size_t count;
    int peer;
} pending;

static pending g_ops[256];
static int g_n, g_depth;

static size_t bytes_of(int type) { return type == 7 ? 4 : type == 0 || type == 1 ? 1 : 0; }

const char *ncclGetErrorString(int r) { return r == OK ? "no error" : "stand-in error"; }

int ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    memcpy(id->internal, "attnbench-nccl-standin", 22);
    return OK;
}

int ncclCommInitRank(void **comm, int nranks, ncclUniqueId id, int rank) {
    int size = 0, me = -1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (nranks != size || rank != me || memcmp(id.internal, "attnbench-nccl-standin", 22) != 0) return INVALID_ARGUMENT;
    standin_comm *c = malloc(sizeof *c);
    if (!c) return SYSTEM_ERROR;
    c->rank = rank;
    c->size = nranks;
    *comm = c;
    return OK;
}

int ncclCommDestroy(void *comm) {
    free(comm);
    return OK;
}

int ncclGroupStart(void) {
    g_depth++;
    return OK;
}

int ncclGroupEnd(void) {
    if (g_depth <= 0) return INVALID_ARGUMENT;
    if (--g_depth > 0) return OK;
    MPI_Request req[256];
    for (int i = 0; i < g_n; i++) {
        pending *p = &g_ops[i];
        int e = p->send ? MPI_Isend(p->buf, (int)p->count, MPI_BYTE, p->peer, 0, MPI_COMM_WORLD, &req[i])
                        : MPI_Irecv(p->buf, (int)p->count, MPI_BYTE, p->peer, 0, MPI_COMM_WORLD, &req[i]);
        if (e != MPI_SUCCESS) return SYSTEM_ERROR;
    }
    int e = MPI_Waitall(g_n, req, MPI_STATUSES_IGNORE);
    g_n = 0;
    return e == MPI_SUCCESS ? OK : SYSTEM_ERROR;
}

static int queue(int send, void *buf, size_t count, int type, int peer) {
    const size_t b = bytes_of(type);
    if (!b || g_n == 256 || count * b > 0x7fffffffu) return INVALID_ARGUMENT;
    g_ops[g_n++] = (pending){send, buf, count * b, peer};
    if (g_depth > 0) return OK; /* done at ncclGroupEnd */
    g_depth = 1;                /* alone: now */
    return ncclGroupEnd();
}

int ncclSend(const void *buf, size_t count, int type, int peer, void *comm, void *stream) {
    (void)comm, (void)stream;
    return queue(1, (void *)buf, count, type, peer);
}

int ncclRecv(void *buf, size_t count, int type, int peer, void *comm, void *stream) {
    (void)comm, (void)stream;
    return queue(0, buf, count, type, peer);
}

int ncclAllGather(const void *send, void *recv, size_t count, int type, void *comm, void *stream) {
    (void)comm, (void)stream;
    const size_t b = bytes_of(type);
    if (!b || count * b > 0x7fffffffu) return INVALID_ARGUMENT;
    return MPI_Allgather(send, (int)(count * b), MPI_BYTE, recv, (int)(count * b), MPI_BYTE, MPI_COMM_WORLD) ==
                   MPI_SUCCESS
               ? OK
               : SYSTEM_ERROR;
}
