/* The CUDA device layer (cuda_device.h): initialisation, tracked device memory,
 * copies, device information, and the error reporting of cuda_compat.h's macros. */
#include "cuda_compat.h"

#include "cuda_traffic.h"
#include "memory.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef AB_CUDA_EMU
ab_cublas_api ab_cublas_fn;
#endif

namespace {

struct device_state {
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    bool tried = false, ok = false;
    int rc = 0;
    int want = -1; /* ab_cuda_select_device: the device's index among those this process sees (-1: none) */
    int dev = 0;  /* the device chosen (want modulo the count) */
    char msg[512] = "";
    cudaStream_t stream = nullptr;
    cublasHandle_t cublas = nullptr;
    /* live allocations: pointer and size (few at a time: a linear table is enough) */
    struct block {
        void *p;
        size_t bytes;
    } *blocks = nullptr;
    size_t n_blocks = 0, cap_blocks = 0;
};

device_state g;

const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Records a live allocation; false when the table cannot grow. */
bool remember(void *p, size_t bytes) {
    if (g.n_blocks == g.cap_blocks) {
        size_t cap = g.cap_blocks ? 2 * g.cap_blocks : 64;
        void *nb = realloc(g.blocks, cap * sizeof *g.blocks);
        if (!nb) return false;
        g.blocks = (device_state::block *)nb;
        g.cap_blocks = cap;
    }
    g.blocks[g.n_blocks].p = p;
    g.blocks[g.n_blocks].bytes = bytes;
    g.n_blocks++;
    return true;
}

/* Removes p from the table; its size, or 0 when it was not there. */
size_t forget(void *p) {
    for (size_t i = 0; i < g.n_blocks; i++)
        if (g.blocks[i].p == p) {
            size_t bytes = g.blocks[i].bytes;
            g.blocks[i] = g.blocks[--g.n_blocks];
            return bytes;
        }
    return 0;
}

#define AB_STR_(x) #x
#define AB_XSTR(x) AB_STR_(x) /* the name after macro expansion: cublasSgemm -> "cublasSgemm_v2" */

#ifndef AB_CUDA_EMU
/* Opens cuBLAS of this build's major version and fills ab_cublas_fn (cuda_compat.h);
 * under g.mu. */
int load_cublas() {
    if (ab_cublas_fn.Sgemm) return 0;
    const char *lib = "libcublas.so." AB_XSTR(CUBLAS_VER_MAJOR);
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) return ab_fail(AB_EDEVICE, "no CUDA device: cannot load cuBLAS: %s", dlerror());
    ab_cublas_api f;
#define AB_LOAD(field, fn)                                                                                             \
    if (!(*(void **)&f.field = dlsym(h, AB_XSTR(fn))))                                                                 \
        return ab_fail(AB_EDEVICE, "no CUDA device: %s lacks %s", lib, AB_XSTR(fn));
    AB_LOAD(Create, cublasCreate)
    AB_LOAD(Destroy, cublasDestroy)
    AB_LOAD(SetStream, cublasSetStream)
    AB_LOAD(GetVersion, cublasGetVersion)
    AB_LOAD(GetStatusString, cublasGetStatusString)
    AB_LOAD(Sgemm, cublasSgemm)
    AB_LOAD(SgemmStridedBatched, cublasSgemmStridedBatched)
    AB_LOAD(SetMathMode, cublasSetMathMode)
#undef AB_LOAD
    ab_cublas_fn = f;
    return 0;
}
#else
int load_cublas() { return 0; }
#endif

int init_locked() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ab_fail(AB_EDEVICE, "no CUDA device: %s (%s)%s", cudaGetErrorString(e), cudaGetErrorName(e),
                       e == cudaErrorInsufficientDriver ? ": no NVIDIA driver, or one older than this CUDA runtime" : "");
    }
    if (n < 1) return ab_fail(AB_EDEVICE, "no CUDA device: the driver reports none");
    /* no device chosen: the launcher's rank among the processes on this node, where it
     * says (mpirun, Slurm), so that the ranks of a job spread over the node's GPUs */
    if (g.want < 0) {
        g.want = 0;
        const char *vars[3] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
        for (int i = 0; i < 3; i++) {
            const char *v = getenv(vars[i]);
            if (v && *v >= '0' && *v <= '9') {
                g.want = atoi(v);
                break;
            }
        }
    }
    const int dev = g.dev = g.want % n;
    AB_CUDA_CHECK(cudaSetDevice(dev));
    /* The library carries machine code for sm_80 and sm_90 and PTX for compute_90
     * (meson.build): older GPUs could not run its kernels. */
    cudaDeviceProp p;
    AB_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    if (p.major < 8)
        return ab_fail(AB_EDEVICE, "no CUDA device: %s has compute capability %d.%d; this build runs on 8.0 and newer",
                       p.name, p.major, p.minor);
    AB_CUDA_CHECK(cudaStreamCreate(&g.stream));
    AB_TRY(load_cublas());
    AB_CUBLAS_CHECK(AB_CUBLAS(Create)(&g.cublas));
    AB_CUBLAS_CHECK(AB_CUBLAS(SetStream)(g.cublas, g.stream));
    return 0;
}

} // namespace

int ab_cuda_fail(cudaError_t e, const char *file, int line, const char *what) {
    cudaGetLastError(); /* a failed call leaves its error as the "last error": clear it */
    int code = e == cudaErrorMemoryAllocation ? AB_ENOMEM : AB_EDEVICE;
    return ab_fail(code, "%s:%d: %s: %s (%s)", base_name(file), line, what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int ab_cublas_fail(cublasStatus_t st, const char *file, int line, const char *what) {
    int code = st == CUBLAS_STATUS_ALLOC_FAILED ? AB_ENOMEM : AB_EDEVICE;
    return ab_fail(code, "%s:%d: %s: cuBLAS status %d: %s", base_name(file), line, what, (int)st,
                   AB_CUBLAS(GetStatusString)(st));
}

cudaStream_t ab_cuda_stream(void) { return g.stream; }
cublasHandle_t ab_cublas(void) { return g.cublas; }

extern "C" bool ab_cuda_built(void) { return true; }

extern "C" bool ab_cuda_emulated(void) {
#ifdef AB_CUDA_EMU
    return true;
#else
    return false;
#endif
}

extern "C" int ab_cuda_load_cublas(void) {
    pthread_mutex_lock(&g.mu);
    int rc = load_cublas();
    pthread_mutex_unlock(&g.mu);
    return rc;
}

extern "C" int ab_cuda_init(void) {
    pthread_mutex_lock(&g.mu);
    if (!g.tried) {
        g.tried = true;
        g.rc = init_locked();
        g.ok = g.rc == 0;
        if (!g.ok) snprintf(g.msg, sizeof g.msg, "%s", ab_error());
    }
    int rc = g.rc;
    pthread_mutex_unlock(&g.mu);
    if (rc) return ab_fail(rc, "%s", g.msg);
    return 0;
}

extern "C" int ab_cuda_select_device(int index) {
    pthread_mutex_lock(&g.mu);
    const bool late = g.tried;
    if (!late) g.want = index < 0 ? 0 : index;
    pthread_mutex_unlock(&g.mu);
    return late ? ab_fail(AB_EINVAL, "ab_cuda_select_device: the CUDA device is already chosen") : 0;
}

extern "C" void *ab_cuda_stream_handle(void) { return (void *)ab_cuda_stream(); }

extern "C" bool ab_cuda_ready(void) {
    pthread_mutex_lock(&g.mu);
    bool ok = g.ok;
    pthread_mutex_unlock(&g.mu);
    return ok;
}

extern "C" int ab_cuda_malloc(void **out, size_t bytes) {
    if (!out) return ab_fail(AB_EINVAL, "ab_cuda_malloc: NULL output");
    *out = NULL;
    if (bytes == 0) return 0;
    AB_TRY(ab_cuda_init());
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) cudaGetLastError();
        if (e == cudaErrorMemoryAllocation)
            return ab_fail(AB_ENOMEM, "out of device memory allocating %zu bytes (%zu of %zu bytes free)", bytes,
                           free_b, total_b);
        return ab_fail(AB_EDEVICE, "cudaMalloc of %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    pthread_mutex_lock(&g.mu);
    bool ok = remember(p, bytes);
    pthread_mutex_unlock(&g.mu);
    if (!ok) {
        cudaFree(p);
        return ab_fail(AB_ENOMEM, "out of host memory tracking a device allocation");
    }
    ab_mem_account(AB_DEV_CUDA, (long long)bytes);
    *out = p;
    return 0;
}

extern "C" void ab_cuda_free(void *p) {
    if (!p) return;
    pthread_mutex_lock(&g.mu);
    size_t bytes = forget(p);
    pthread_mutex_unlock(&g.mu);
    if (!bytes) {
        /* Freeing memory the tracker did not hand out is a programming error. */
        fprintf(stderr, "attnbench: ab_cuda_free of a pointer not from ab_cuda_malloc\n");
        abort();
    }
    /* cudaFree waits for the device; an error here (a failed earlier kernel) is
     * reported by the next checked call, so it is only cleared. */
    if (cudaFree(p) != cudaSuccess) cudaGetLastError();
    ab_mem_account(AB_DEV_CUDA, -(long long)bytes);
}

static int copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return 0;
    AB_TRY(ab_cuda_init());
    AB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, g.stream));
    AB_CUDA_CHECK(cudaStreamSynchronize(g.stream));
    return 0;
}

extern "C" int ab_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) {
    return copy(dst, src, bytes, cudaMemcpyHostToDevice);
}
extern "C" int ab_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes) {
    return copy(dst, src, bytes, cudaMemcpyDeviceToHost);
}

extern "C" int ab_cuda_memset(void *p, int value, size_t bytes) {
    if (bytes == 0) return 0;
    AB_TRY(ab_cuda_init());
    AB_CUDA_CHECK(cudaMemsetAsync(p, value, bytes, g.stream));
    return 0;
}

extern "C" int ab_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return 0;
    AB_TRY(ab_cuda_init());
    AB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g.stream));
    return 0;
}

extern "C" int ab_cuda_sync(void) {
    AB_TRY(ab_cuda_init());
    /* also reports a failure inside earlier kernels (asynchronous errors) */
    AB_CUDA_CHECK(cudaStreamSynchronize(g.stream));
    return 0;
}

extern "C" int ab_cuda_graph_begin(void) {
    AB_TRY(ab_cuda_init());
    AB_CUDA_CHECK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeGlobal));
    return 0;
}

extern "C" int ab_cuda_graph_end(void **graph) {
    *graph = NULL;
    cudaGraph_t gr = NULL;
    const cudaError_t e = cudaStreamEndCapture(g.stream, &gr);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* a spoilt capture leaves no sticky error */
        return ab_fail(AB_EDEVICE, "CUDA graph: the recording failed (%s: %s)", cudaGetErrorName(e),
                       cudaGetErrorString(e));
    }
    cudaGraphExec_t ex = NULL;
    const cudaError_t ei = cudaGraphInstantiate(&ex, gr, 0);
    (void)cudaGraphDestroy(gr);
    if (ei != cudaSuccess) return ab_cuda_fail(ei, __FILE__, __LINE__, "cudaGraphInstantiate");
    *graph = (void *)ex;
    return 0;
}

extern "C" int ab_cuda_graph_launch(void *graph) {
    if (!graph) return ab_fail(AB_EINVAL, "ab_cuda_graph_launch: NULL graph");
    AB_CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, g.stream));
    return 0;
}

extern "C" void ab_cuda_graph_destroy(void *graph) {
    if (graph) (void)cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

extern "C" int ab_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    AB_TRY(ab_cuda_init());
    AB_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return 0;
}

extern "C" int ab_cuda_device_info(ab_cuda_info *info) {
    if (!info) return ab_fail(AB_EINVAL, "ab_cuda_device_info: NULL");
    memset(info, 0, sizeof *info);
    AB_TRY(ab_cuda_init());
    cudaDeviceProp p;
    AB_CUDA_CHECK(cudaGetDeviceProperties(&p, g.dev));
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->total_bytes = p.totalGlobalMem;
    AB_CUDA_CHECK(cudaDriverGetVersion(&info->driver_version));
    AB_CUDA_CHECK(cudaRuntimeGetVersion(&info->runtime_version));
#ifdef AB_CUDA_EMU
    info->cublas_version = 0;
    info->emulated = true;
#else
    AB_CUBLAS_CHECK(AB_CUBLAS(GetVersion)(g.cublas, &info->cublas_version));
    info->emulated = false;
#endif
    return 0;
}

/* ---- memory traffic (cuda_traffic.h): the emulator's counters, or none ---- */

#ifdef AB_CUDA_EMU
static ab_traffic_counts traffic_counts(const ab_emu_traffic_counts &e) {
    ab_traffic_counts c;
    c.launches = e.launches;
    c.req_read = e.req_read;
    c.req_write = e.req_write;
    c.dram_read = e.dram_read;
    c.dram_write = e.dram_write;
    return c;
}
static_assert((int)AB_TRAFFIC_KERNEL == AB_EMU_TRAFFIC_KERNEL && (int)AB_TRAFFIC_CUBLAS == AB_EMU_TRAFFIC_CUBLAS &&
                  (int)AB_TRAFFIC_MEMSET == AB_EMU_TRAFFIC_MEMSET && (int)AB_TRAFFIC_MEMCPY == AB_EMU_TRAFFIC_MEMCPY &&
                  (int)AB_TRAFFIC_SORT == AB_EMU_TRAFFIC_SORT,
              "the kinds of cuda_traffic.h are the emulator's");

extern "C" bool ab_cuda_traffic_counted(void) { return ab_emu_traffic_instrumented() != 0; }
extern "C" void ab_cuda_traffic_start(void) {
    ab_emu_traffic_enable(0);
    ab_emu_traffic_reset();
    ab_emu_traffic_enable(1);
}
extern "C" void ab_cuda_traffic_stop(void) { ab_emu_traffic_enable(0); }
extern "C" void ab_cuda_traffic_total(ab_traffic_counts *c, unsigned long long *h2d_bytes,
                                      unsigned long long *d2h_bytes) {
    ab_emu_traffic_counts e;
    ab_emu_traffic_total(&e, h2d_bytes, d2h_bytes);
    if (c) *c = traffic_counts(e);
}
extern "C" int ab_cuda_traffic_entries(void) { return ab_emu_traffic_entries(); }
extern "C" const char *ab_cuda_traffic_entry(int i, ab_traffic_kind *kind, ab_traffic_counts *c) {
    ab_emu_traffic_counts e;
    int k = 0;
    const char *name = ab_emu_traffic_entry(i, &k, &e);
    if (!name) return nullptr;
    if (kind) *kind = (ab_traffic_kind)k;
    if (c) *c = traffic_counts(e);
    return name;
}
#else /* a GPU: nothing counted */
extern "C" bool ab_cuda_traffic_counted(void) { return false; }
extern "C" void ab_cuda_traffic_start(void) {}
extern "C" void ab_cuda_traffic_stop(void) {}
extern "C" void ab_cuda_traffic_total(ab_traffic_counts *c, unsigned long long *h2d_bytes,
                                      unsigned long long *d2h_bytes) {
    if (c) memset(c, 0, sizeof *c);
    if (h2d_bytes) *h2d_bytes = 0;
    if (d2h_bytes) *d2h_bytes = 0;
}
extern "C" int ab_cuda_traffic_entries(void) { return 0; }
extern "C" const char *ab_cuda_traffic_entry(int i, ab_traffic_kind *kind, ab_traffic_counts *c) {
    (void)i, (void)kind, (void)c;
    return nullptr;
}
#endif

extern "C" const char *ab_traffic_kind_name(ab_traffic_kind k) {
    switch (k) {
    case AB_TRAFFIC_KERNEL: return "kernel";
    case AB_TRAFFIC_CUBLAS: return "cublas";
    case AB_TRAFFIC_MEMSET: return "memset";
    case AB_TRAFFIC_MEMCPY: return "memcpy";
    case AB_TRAFFIC_SORT: return "sort";
    }
    return "?";
}
