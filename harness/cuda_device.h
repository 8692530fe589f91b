/* The CUDA device as the rest of the harness sees it: initialisation, tracked device
 * memory, copies, synchronisation and device information. A plain C API, present in
 * every build: with CUDA it is harness/cuda_device.cu (compiled by nvcc, or by g++
 * against the emulator in the emulated build), without it harness/cuda_none.c, whose
 * calls fail with AB_EDEVICE and a message saying the build has no CUDA.
 *
 * One device (number 0) per process, one stream: every kernel, cuBLAS call and copy of
 * the library runs on ab_cuda_stream() (cuda_compat.h), in order. Library calls on the
 * device (attn_forward, ...) return once their work is queued; ab_cuda_sync() waits for
 * it and reports a failure that happened inside it. The copies below are synchronous. */
#ifndef AB_CUDA_DEVICE_H
#define AB_CUDA_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* True when this build has the CUDA backend (real, or the emulator). */
bool ab_cuda_built(void);
/* True when the backend is the CPU emulator (tests; the emulated attnbench binary). */
bool ab_cuda_emulated(void);

/* Selects the device (ab_cuda_select_device) and creates the stream and the cuBLAS handle, once per process;
 * later calls return the first call's result. Fails with AB_EDEVICE and "no CUDA
 * device: ..." when there is none (or no driver), or "this build has no CUDA backend". */
int ab_cuda_init(void);
/* Opens cuBLAS (dlopen; cuda_compat.h says why), once per process; ab_cuda_init calls
 * it. Needs no device, so tests on machines without a GPU check the loader too.
 * AB_EDEVICE with a message when the library or one of its functions is missing. */
int ab_cuda_load_cublas(void);
/* True once ab_cuda_init has succeeded (never initialises). */
bool ab_cuda_ready(void);
/* Before ab_cuda_init: use device `index` modulo the devices this process sees.
 * Without it, ab_cuda_init takes the launcher's rank on this node (the environment's
 * OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID), else 0. AB_EINVAL once
 * a device is chosen. */
int ab_cuda_select_device(int index);
/* The library's stream (cudaStream_t) as a pointer, for a library that takes one
 * (NCCL, loaded at run time); NULL before ab_cuda_init. */
void *ab_cuda_stream_handle(void);

/* Device memory through the tracked allocator (AB_DEV_CUDA): cudaMalloc plus
 * accounting. 0 and *out set; AB_ENOMEM with "out of device memory ..." (free and total
 * bytes in the message) when the device is full; AB_EDEVICE on other failures. A zero
 * size gives *out = NULL and 0. */
int ab_cuda_malloc(void **out, size_t bytes);
/* Frees what ab_cuda_malloc returned (NULL: nothing). */
void ab_cuda_free(void *p);

/* Synchronous copies (after the stream's earlier work) and an asynchronous memset. */
int ab_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
int ab_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);
int ab_cuda_memset(void *p, int value, size_t bytes);
/* Device-to-device copy queued on the library's stream (asynchronous, like memset). */
int ab_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes);
/* Waits for all queued work; reports an asynchronous failure. */
int ab_cuda_sync(void);
/* CUDA graphs of the library's stream. ab_cuda_graph_begin starts recording what the
 * library queues (kernels with their arguments as launched, device-to-device copies,
 * memsets, cuBLAS calls) instead of running it; ab_cuda_graph_end stops and, when
 * everything recorded may be replayed, makes *graph (else AB_EDEVICE, naming why; a
 * call that waits for the device or allocates while recording fails and spoils the
 * recording). ab_cuda_graph_launch queues the recorded work again, as recorded: the same
 * pointers and values, the memory's contents as they are then. Host code that ran
 * while recording does not run again. */
int ab_cuda_graph_begin(void);
int ab_cuda_graph_end(void **graph);
int ab_cuda_graph_launch(void *graph);
void ab_cuda_graph_destroy(void *graph);
/* cudaMemGetInfo: free and total device bytes (includes other processes' use). */
int ab_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

typedef struct {
    char name[256];
    int cc_major, cc_minor;     /* compute capability */
    int sm_count;               /* multiprocessors */
    int driver_version;         /* e.g. 13000 for 13.0 */
    int runtime_version;        /* cudart the binary runs with */
    int cublas_version;
    size_t total_bytes;
    bool emulated;
} ab_cuda_info;

/* Information about the device (initialises it). */
int ab_cuda_device_info(ab_cuda_info *info);

#ifdef __cplusplus
}
#endif

#endif
