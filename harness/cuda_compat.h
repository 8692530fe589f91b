/* The first include of every .cu source of attnbench.
 *
 * The .cu sources are built twice: by nvcc into the library (when the build has CUDA),
 * and by g++ with -DAB_CUDA_EMU against the CPU emulator in tests/cuda_emu/ (every
 * build: the emulated library the CUDA tests run on). So they stay plain CUDA C++ inside
 * the subset the emulator provides (tests/cuda_emu/cuda_emu.h lists it): no <<<>>>
 * (use AB_LAUNCH), no `extern __shared__` (use AB_DYN_SMEM), no inline PTX, cooperative
 * groups, wgmma/TMA or other libraries than cuBLAS and CUB. Tensor cores through
 * nvcuda::wmma (the shapes the emulator has: TF32 m16n16k8, bf16 m16n16k16).
 *
 * Error handling: every runtime call, cuBLAS call and launch is checked with the macros
 * below, which return the error code from the enclosing function (so it must return
 * int) after setting the message "<file>:<line>: <call>: <error string>" (ab_fail):
 * AB_ENOMEM for out-of-memory, AB_EDEVICE otherwise. Library code never exits. */
#ifndef AB_CUDA_COMPAT_H
#define AB_CUDA_COMPAT_H

#ifdef AB_CUDA_EMU
#include "cuda_emu.h"
#else
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
/* CUB is heavy to compile: a source that sorts defines AB_CUDA_CUB before including
 * this header (the emulator always has its cub::DeviceRadixSort::SortPairs). */
#ifdef AB_CUDA_CUB
#include <cub/device/device_radix_sort.cuh>
#endif
#endif

#include "cuda_blas.h"
#include "cuda_device.h"
#include "error.h"

#include <stddef.h>
#include <stdint.h>

/* cuBLAS calls: AB_CUBLAS(Sgemm)(...) calls cublasSgemm. In the real build cuBLAS is
 * not linked but opened with dlopen by ab_cuda_init (its initialisers take about 0.1 s
 * and 200 MB of address space per process, which runs that never touch the GPU should
 * not pay), and AB_CUBLAS(name) is the function of that name in this table; the
 * emulator defines the functions themselves. Add a field here (and its symbol to
 * cuda_device.cu's loader) before using another cuBLAS function. */
#ifdef AB_CUDA_EMU
#define AB_CUBLAS(name) cublas##name
#else
typedef struct {
    decltype(&cublasCreate) Create;
    decltype(&cublasDestroy) Destroy;
    decltype(&cublasSetStream) SetStream;
    decltype(&cublasGetVersion) GetVersion;
    decltype(&cublasGetStatusString) GetStatusString;
    decltype(&cublasSgemm) Sgemm;
    decltype(&cublasSgemmStridedBatched) SgemmStridedBatched;
    decltype(&cublasSetMathMode) SetMathMode;
} ab_cublas_api;
extern ab_cublas_api ab_cublas_fn;
#define AB_CUBLAS(name) (ab_cublas_fn.name)
#endif

/* The library's stream and cuBLAS handle (valid after ab_cuda_init). */
cudaStream_t ab_cuda_stream(void);
cublasHandle_t ab_cublas(void);

/* Set the message for a failed call and return its attnbench error code. */
int ab_cuda_fail(cudaError_t e, const char *file, int line, const char *what);
int ab_cublas_fail(cublasStatus_t st, const char *file, int line, const char *what);

#define AB_CUDA_CHECK(call)                                                                                            \
    do {                                                                                                               \
        cudaError_t ab_e_ = (call);                                                                                    \
        if (ab_e_ != cudaSuccess) return ab_cuda_fail(ab_e_, __FILE__, __LINE__, #call);                               \
    } while (0)

#define AB_CUBLAS_CHECK(call)                                                                                          \
    do {                                                                                                               \
        cublasStatus_t ab_s_ = (call);                                                                                 \
        if (ab_s_ != CUBLAS_STATUS_SUCCESS) return ab_cublas_fail(ab_s_, __FILE__, __LINE__, #call);                   \
    } while (0)

/* Propagates an attnbench error code (from a helper that already set the message). */
#define AB_TRY(expr)                                                                                                   \
    do {                                                                                                               \
        int ab_rc_ = (expr);                                                                                           \
        if (ab_rc_) return ab_rc_;                                                                                     \
    } while (0)

#define AB_CHECK_LAUNCH(kernel)                                                                                        \
    do {                                                                                                               \
        cudaError_t ab_e_ = cudaGetLastError();                                                                        \
        if (ab_e_ != cudaSuccess) return ab_cuda_fail(ab_e_, __FILE__, __LINE__, "launch of " #kernel);                \
    } while (0)

/* AB_LAUNCH(kernel, grid, block, smem_bytes, stream, args...): launches and checks.
 * On the emulator the closure copies the variables the arguments name (a captured
 * launch replays with the values of its launch, as a CUDA graph does).
 * `kernel` is a __global__ function or a pointer to one (for a template, take the
 * pointer first: auto *k = &my_kernel<4>;). grid and block are dim3 or integers. */
#ifdef AB_CUDA_EMU
namespace ab_emu {
template <class F> inline const void *func_addr(F *f) { return (const void *)f; }
/* The launch's arguments converted to the kernel's parameter types now, as a launch
 * does, and held by value in the closure (a recorded launch replays with them). */
template <class... P, class... A> inline auto launch_closure(void (*k)(P...), A &&...a) {
    return [k, args = std::tuple<typename std::decay<P>::type...>(std::forward<A>(a)...)]() { std::apply(k, args); };
}
} // namespace ab_emu
#define AB_LAUNCH(kernel, grid, block, smem, stream, ...)                                                              \
    do {                                                                                                               \
        ab_emu::launch_fn(#kernel, ab_emu::func_addr(kernel), dim3(grid), dim3(block), (smem), (stream),               \
                          ab_emu::launch_closure(kernel, ##__VA_ARGS__));                                              \
        AB_CHECK_LAUNCH(kernel);                                                                                       \
    } while (0)
/* Inside a kernel: `T *name` = the block's dynamic shared memory. */
#define AB_DYN_SMEM(T, name) T *name = reinterpret_cast<T *>(ab_emu::dyn_smem())
#else
#define AB_LAUNCH(kernel, grid, block, smem, stream, ...)                                                              \
    do {                                                                                                               \
        kernel<<<dim3(grid), dim3(block), (smem), (stream)>>>(__VA_ARGS__);                                            \
        AB_CHECK_LAUNCH(kernel);                                                                                       \
    } while (0)
#define AB_DYN_SMEM(T, name)                                                                                           \
    extern __shared__ __align__(32) unsigned char ab_dyn_smem_[];                                                      \
    T *name = reinterpret_cast<T *>(ab_dyn_smem_)
#endif

/* Launch limits every kernel respects (and the emulator enforces). */
#define AB_CUDA_MAX_GRID_X 2147483647LL
#define AB_CUDA_MAX_GRID_YZ 65535

/* Blocks for a grid-stride loop over n items with `per_block` items per block pass:
 * at least 1, at most `cap` (kernels loop over the rest). */
static inline unsigned ab_cuda_grid(long long n, long long per_block, long long cap) {
    long long g = (n + per_block - 1) / per_block;
    if (g < 1) g = 1;
    if (g > cap) g = cap;
    return (unsigned)g;
}

/* Threads per block for a loop over n items: a multiple of 32 in [32, max_threads]. */
static inline int ab_cuda_threads(long long n, int max_threads) {
    long long t = (n + 31) / 32 * 32;
    if (t < 32) t = 32;
    if (t > max_threads) t = max_threads;
    return (int)t;
}

#endif
