/* A CPU emulation of the subset of CUDA that attnbench's .cu sources use, so that the
 * very same sources, compiled by g++ with -DAB_CUDA_EMU, run and are tested on machines
 * without a GPU (CI included). harness/cuda_compat.h includes this header instead of
 * the real CUDA headers in that build.
 *
 * What it provides, with the names and semantics of the real APIs:
 * - kernels: __global__/__device__/__host__/__forceinline__, __shared__ (function-static
 *   storage in one section: valid because blocks run one after another), dynamic shared
 *   memory (through AB_DYN_SMEM in cuda_compat.h), threadIdx/blockIdx/blockDim/gridDim,
 *   warpSize, __syncthreads(_count/_or/_and), __syncwarp, warp shuffles (__shfl_sync,
 *   _up, _down, _xor), __ballot_sync/__any_sync/__all_sync/__activemask, atomics, device
 *   math (with the uncontracted __fadd_rn, __fsub_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn),
 *   bfloat16 conversions, and warp matrix operations (nvcuda::wmma: TF32 m16n16k8 and
 *   bf16 m16n16k16, with their alignment rules; see "warp matrix operations" below).
 *   A launch runs the grid's blocks one after another; the threads of a block are
 *   cooperative fibers that switch only at barriers (__syncthreads, warp operations).
 * - runtime: cudaMalloc/Free (host memory, with an emulated capacity so out-of-memory
 *   paths can be tested: AB_EMU_DEVICE_MEMORY=bytes, default 4 GiB), cudaMemcpy(Async),
 *   cudaMemset(Async), streams and events (everything runs synchronously), stream
 *   capture and graphs (recorded, then replayed in order: see cudaStreamBeginCapture), device
 *   queries (one emulated device, or none with AB_EMU_NO_DEVICE=1), the last-error
 *   protocol (cudaGetLastError returns and clears the last failure, as the real one).
 * - cuBLAS: cublasCreate/Destroy/SetStream/SetMathMode/GetStatusString, cublasSgemm and
 *   cublasSgemmStridedBatched with their real column-major semantics and argument
 *   checks (beta == 0 never reads C).
 * - CUB: cub::DeviceRadixSort::SortPairs (stable, keys compared on bits
 *   [begin_bit, end_bit), the two-call temporary storage protocol).
 *
 * What it checks (each failure aborts with a message naming the kernel or call; these
 * are programming errors that a GPU would turn into hangs, wrong results or illegal
 * addresses):
 * - a __syncthreads not reached by every thread of the block (deadlock, or threads that
 *   exited while others wait), warp operations whose mask names lanes that do not exist,
 *   have exited, or are not waiting at the same operation; a shuffle reading a lane
 *   outside the mask;
 * - launch configurations: block size > 1024 or dims over the limits
 *   (cudaErrorInvalidValue, as the CUDA 13 runtime answers), grid dims over the limits
 *   (cudaErrorInvalidConfiguration), dynamic shared memory over 48 KiB without
 *   cudaFuncSetAttribute, or over 227 KiB;
 * - dynamic shared memory read or written past the bytes requested (rounded up to 32,
 *   its alignment; a guard page after it: SIGSEGV); dynamic and static shared memory are
 *   poisoned (0xff bytes: NaN floats) at every block start, so reading either before
 *   writing it shows;
 * - cudaMemcpy/Memset, cuBLAS and CUB arguments that are not inside device allocations
 *   of the right size, or copies whose kind does not match the pointers.
 *
 * Strict mode (AB_EMU_STRICT=1 in the environment, or ab_emu_set_strict(1) before the
 * allocations it should cover) adds four checks, at some cost in speed:
 * - threads of a block, and blocks of a grid, run in the opposite order (highest index
 *   first). A missing __syncthreads (or __syncwarp) between one thread's write and
 *   another's read of shared or global memory passes in one of the two orders only
 *   when the reader comes after the writer; running the suites in both orders shows
 *   it whichever side the writer is on (the stale value is poison or the old value);
 * - every device allocation is its own mapping whose data ends exactly at a guard page
 *   (the byte count rounded up to 4), with a guard page before it: a kernel reading or
 *   writing past the end of an allocation faults (SIGSEGV) instead of reading the
 *   allocator's padding. Pointers are then aligned to the byte count's alignment (4 at
 *   least), not to 256;
 * - device memory is inaccessible (PROT_NONE) except inside an emulated device
 *   operation (a kernel, a copy, a memset, a cuBLAS or CUB call): host code that
 *   dereferences a device pointer faults, as it would with a GPU;
 * - the elements of a wmma fragment are held by the lanes in a permuted order, so a
 *   kernel relying on a fragment's (unspecified) layout gives wrong results.
 *
 * What it does NOT catch: races that both orders hide (a reader between two writers,
 * or a value that is the same stale or fresh); out-of-bounds accesses to global memory
 * inside kernels that stay inside the allocation's pages before its start, or land in
 * another allocation (default mode: any that stay in host memory); asynchrony (streams
 * here are synchronous, so a missing synchronisation before a host read is invisible);
 * float rounding of the real cuBLAS (the emulated GEMM accumulates in double); the
 * interleaving of warps on real hardware (lockstep lanes, independent thread
 * scheduling); performance.
 *
 * Memory traffic (traffic.cpp; harness/cuda_traffic.h is its C interface): a roofline
 * without a GPU. In the traffic library (meson's attnbench_traffic, which attnbench-emu
 * and the traffic suite link; GCC builds without -Db_sanitize) the .cu sources are
 * compiled with GCC's ThreadSanitizer instrumentation at compile time only, and the
 * hooks it calls (__tsan_read4, __tsan_write16, ...: traffic.cpp defines them) count,
 * while counting is on (ab_emu_traffic_enable), every load and store a running kernel
 * makes to a device allocation. Per operation:
 * - requested bytes: the sum of the access sizes, loads and stores apart (the requests
 *   to L1/L2; a value the compiled code keeps in a register is not requested again: it is
 *   GCC's code at -O2, not nvcc's, that is counted);
 * - DRAM bytes under an ideal cache within the operation: 32 bytes for each distinct
 *   32-byte sector read, and for each written (a sector read and written counts in
 *   both); nothing is reused between operations (every launch starts cold: the
 *   conservative model);
 * - launches; a cuBLAS call is one launch (A and B read once, column by column, C read
 *   when beta != 0, C written), and so are CUB's sort (keys and values read and written
 *   once), a cudaMemset (written) and a device-to-device copy (read and written), each
 *   under its own name; host<->device copies are counted apart, in bytes.
 * Totals, and the same per name (a kernel's as AB_LAUNCH names it). Not modelled:
 * caches across kernels (L2 reuse between launches), the capacity of the cache within
 * one (an ideal cache never evicts: a tensor streamed twice counts once, however
 * large), coalescing beyond 32-byte sectors (scattered accesses cost their sectors, not
 * their transactions), shared-memory and register traffic, what atomics cost beyond
 * their bytes, and the traffic of the real cuBLAS's kernels (which read tiles of A and
 * B several times). The plain emulated library counts nothing (and
 * ab_emu_traffic_instrumented() says so).
 *
 * Single-threaded: launches and API calls from several host threads are serialised. */
#ifndef AB_CUDA_EMU_H
#define AB_CUDA_EMU_H

#ifndef __cplusplus
#error "cuda_emu.h is C++: compile .cu sources with g++ -x c++ (the emulated build does this)"
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <math.h>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

/* ---- qualifiers ---- */

#define __global__
#define __device__
#define __host__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline __attribute__((always_inline))
/* Static shared memory: function-static storage (blocks run one after another), all of
 * it in one section so that the emulator can poison it at every block start (on a GPU
 * it starts undefined in every block). Kernels that are templates would get their
 * statics elsewhere (GCC puts them in COMDAT sections): attnbench has none. */
#define __shared__ __attribute__((section("ab_emu_shared"))) static
#define __constant__ static
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __CUDA_ARCH_EMU__ 1

/* ---- vector types and built-in variables ---- */

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct __align__(8) float2 { float x, y; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) int2 { int x, y; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline int2 make_int2(int x, int y) { return int2{x, y}; }

extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
constexpr int warpSize = 32;

/* ---- runtime types ---- */

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorUnknown = 999,
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;

typedef enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
} cudaFuncAttribute;

typedef struct ab_emu_stream *cudaStream_t;
typedef struct ab_emu_event *cudaEvent_t;
typedef struct ab_emu_graph *cudaGraph_t;
typedef struct ab_emu_graph *cudaGraphExec_t;

typedef enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
} cudaStreamCaptureMode;

typedef enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2,
} cudaStreamCaptureStatus;
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int major, minor;
    int multiProcessorCount;
    int l2CacheSize;
};

cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **p, size_t bytes);
template <class T> static inline cudaError_t cudaMalloc(T **p, size_t bytes) { return cudaMalloc((void **)p, bytes); }
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s = 0);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
/* Stream capture and graphs. A capture records what is queued on the stream (kernel
 * launches with their arguments as evaluated at the launch, device-to-device copies,
 * memsets, cuBLAS GEMMs with their scalars) instead of running it; a launch of the
 * instantiated graph runs the records in order. While a capture is active, the calls
 * that would wait for the device or allocate (cudaMalloc, cudaFree, cudaMemcpy,
 * cudaMemset, copies between host and device, synchronisations) fail as they may on
 * a GPU (cudaErrorStreamCaptureUnsupported / Implicit) and invalidate the capture:
 * cudaStreamEndCapture then answers cudaErrorStreamCaptureInvalidated. The null stream
 * cannot be captured. Tests may make the next capture fail at its end
 * (ab_emu_spoil_next_capture(), a C entry point) to reach a caller's way out. */
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t ab_emu_func_set_attribute(const void *func, cudaFuncAttribute attr, int value);
template <class F> static inline cudaError_t cudaFuncSetAttribute(F *func, cudaFuncAttribute attr, int value) {
    return ab_emu_func_set_attribute((const void *)func, attr, value);
}

/* ---- the emulator's own interface (used by the macros of cuda_compat.h and tests) ---- */

namespace ab_emu {
/* Runs body() once per thread of every block of the grid. Sets the last error (and
 * runs nothing) on a bad configuration, like a real launch. */
void launch(const char *name, const void *func, dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
            void (*body)(void *), void *ctx);
/* Whether work queued on stream s is being captured (cudaStreamBeginCapture). */
bool capturing(cudaStream_t s);
/* Counts one thing the host hands the device (ab_emu_submission_count(): each launch,
 * copy, memset or GEMM queued directly, and a graph's launch once). */
void count_submission();
/* Records a launch into s's capture (after the checks of a launch): body(ctx) runs each
 * thread, ctx is kept alive by the record (release(ctx) when the graph goes). */
void record_launch(const char *name, const void *func, dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t s,
                   void (*body)(void *), void *ctx, void (*release)(void *));
template <class F>
inline void launch_fn(const char *name, const void *func, dim3 grid, dim3 block, size_t smem_bytes,
                      cudaStream_t stream, F &&f) {
    typedef typename std::decay<F>::type G;
    if (capturing(stream)) { /* the closure holds the arguments' values (AB_LAUNCH copies them) */
        G *held = new G(std::forward<F>(f));
        record_launch(name, func, grid, block, smem_bytes, stream, [](void *c) { (*static_cast<G *>(c))(); }, held,
                      [](void *c) { delete static_cast<G *>(c); });
        return;
    }
    count_submission();
    launch(name, func, grid, block, smem_bytes, stream, [](void *c) { (*static_cast<G *>(c))(); }, &f);
}
/* The dynamic shared memory of the running block (AB_DYN_SMEM). */
void *dyn_smem(void);
/* Barriers and warp exchange of the running thread. */
void syncthreads(void);
int syncthreads_count(int pred);
void syncwarp(unsigned mask, const char *what);
/* Publishes `bits` for the lanes in mask, waits until every lane of the mask has done
 * the same operation, and copies all 32 lanes' published bits into all[] (lanes outside
 * the mask: 0). */
void warp_gather(unsigned mask, uint64_t bits, uint64_t *all, const char *what);
/* warp_gather, returning lane src's bits (src must be in the mask). */
uint64_t warp_exchange(unsigned mask, uint64_t bits, int src_lane, const char *what);
unsigned activemask(void);
int lane_id(void);
/* Aborts with "cuda emulator: MESSAGE" and the running kernel's name. */
[[noreturn]] void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* True when [p, p + bytes) lies inside one device allocation (bytes may be 0). */
bool is_device_range(const void *p, size_t bytes);
/* Aborts unless [p, p + bytes) is device memory (what names the call and argument). */
void require_device(const void *p, size_t bytes, const char *what);
/* Bytes of emulated device memory (cudaMemGetInfo's total); the limit cudaMalloc
 * enforces. Tests may lower it to provoke out-of-memory. */
size_t device_memory(void);
void set_device_memory(size_t bytes);
/* Launches run so far (tests check that work happened on the "device"). The C entry
 * points ab_emu_launch_count() and ab_emu_op_count() (every operation a GPU's stream
 * would queue: launches, cuBLAS GEMMs, copies and memsets of at least one byte) serve
 * tests written in C; ab_emu_host_copy_count() counts the copies between host and
 * device memory among them (each a wait for the device on a GPU, where the host's
 * memory is not pinned). */
unsigned long long launch_count(void);
/* In strict mode, device memory is accessible while one of these lives (emulated
 * device operations open one); elsewhere it does nothing. */
struct device_window {
    device_window();
    ~device_window();
    device_window(const device_window &) = delete;
    device_window &operator=(const device_window &) = delete;
};
} // namespace ab_emu

/* ---- barriers and warp operations ---- */

static inline void __syncthreads(void) { ab_emu::syncthreads(); }
static inline int __syncthreads_count(int pred) { return ab_emu::syncthreads_count(pred); }
static inline int __syncthreads_or(int pred) { return ab_emu::syncthreads_count(pred) != 0; }
static inline int __syncthreads_and(int pred) {
    return ab_emu::syncthreads_count(pred != 0) == (int)(blockDim.x * blockDim.y * blockDim.z);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) { ab_emu::syncwarp(mask, "__syncwarp"); }
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}
static inline unsigned __activemask(void) { return ab_emu::activemask(); }

namespace ab_emu {
template <class T> inline uint64_t to_bits(T v) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffles move values of up to 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof v);
    return b;
}
template <class T> inline T from_bits(uint64_t b) {
    T v;
    std::memcpy(&v, &b, sizeof v);
    return v;
}
inline void check_width(int width, const char *what) {
    if (width < 1 || width > 32 || (width & (width - 1))) fatal("%s: width %d is not a power of two in [1, 32]", what, width);
}
} // namespace ab_emu

template <class T> static inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
    ab_emu::check_width(width, "__shfl_sync");
    int lane = ab_emu::lane_id(), base = lane & ~(width - 1);
    int src = base + (src_lane & (width - 1));
    return ab_emu::from_bits<T>(ab_emu::warp_exchange(mask, ab_emu::to_bits(var), src, "__shfl_sync"));
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    ab_emu::check_width(width, "__shfl_up_sync");
    int lane = ab_emu::lane_id(), base = lane & ~(width - 1);
    int src = lane - (int)delta;
    if (src < base) src = lane; /* below the segment: own value */
    return ab_emu::from_bits<T>(ab_emu::warp_exchange(mask, ab_emu::to_bits(var), src, "__shfl_up_sync"));
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    ab_emu::check_width(width, "__shfl_down_sync");
    int lane = ab_emu::lane_id(), base = lane & ~(width - 1);
    int src = lane + (int)delta;
    if (src >= base + width) src = lane; /* past the segment: own value */
    return ab_emu::from_bits<T>(ab_emu::warp_exchange(mask, ab_emu::to_bits(var), src, "__shfl_down_sync"));
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
    ab_emu::check_width(width, "__shfl_xor_sync");
    int lane = ab_emu::lane_id(), base = lane & ~(width - 1);
    int src = lane ^ lane_mask;
    if (src >= base + width) src = lane; /* a later segment: own value */
    return ab_emu::from_bits<T>(ab_emu::warp_exchange(mask, ab_emu::to_bits(var), src, "__shfl_xor_sync"));
}
/* Ballots: every lane of the mask publishes its predicate; each gets them all. */
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    uint64_t all[32];
    ab_emu::warp_gather(mask, pred ? 1u : 0u, all, "__ballot_sync");
    unsigned r = 0;
    for (int l = 0; l < 32; l++)
        if ((mask & (1u << l)) && all[l]) r |= 1u << l;
    return r;
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }

/* ---- atomics (fibers switch only at barriers, so a read-modify-write is atomic) ---- */

template <class T> static inline T atomicAdd(T *p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
template <class T> static inline T atomicSub(T *p, T v) {
    T old = *p;
    *p = old - v;
    return old;
}
template <class T> static inline T atomicMax(T *p, T v) {
    T old = *p;
    *p = old > v ? old : v;
    return old;
}
template <class T> static inline T atomicMin(T *p, T v) {
    T old = *p;
    *p = old < v ? old : v;
    return old;
}
template <class T> static inline T atomicExch(T *p, T v) {
    T old = *p;
    *p = v;
    return old;
}
template <class T> static inline T atomicCAS(T *p, T compare, T v) {
    T old = *p;
    if (old == compare) *p = v;
    return old;
}
template <class T> static inline T atomicOr(T *p, T v) {
    T old = *p;
    *p = old | v;
    return old;
}
template <class T> static inline T atomicAnd(T *p, T v) {
    T old = *p;
    *p = old & v;
    return old;
}

/* ---- device math and intrinsics ---- */

template <class A, class B> static inline typename std::common_type<A, B>::type min(A a, B b) {
    return b < a ? b : a;
}
template <class A, class B> static inline typename std::common_type<A, B>::type max(A a, B b) {
    return a < b ? b : a;
}
/* glibc declares its own __expf, __logf, __powf: macros keep them out of the way */
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __powf(x, y) powf(x, y)
static inline float __fdividef(float x, float y) { return x / y; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
/* Single IEEE operations that CUDA never contracts into a fused multiply-add. Out of
 * line, because g++ (like nvcc) fuses an inlined product into a following sum. */
static inline __attribute__((noinline)) float __fadd_rn(float a, float b) { return a + b; }
static inline __attribute__((noinline)) float __fsub_rn(float a, float b) { return a - b; }
static inline __attribute__((noinline)) float __fmul_rn(float a, float b) { return a * b; }
static inline __attribute__((noinline)) float __fdiv_rn(float a, float b) { return a / b; }
static inline __attribute__((noinline)) float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __float2int_rd(float x) { return (int)floorf(x); }
static inline int __float_as_int(float x) {
    int i;
    std::memcpy(&i, &x, 4);
    return i;
}
static inline unsigned __float_as_uint(float x) {
    unsigned i;
    std::memcpy(&i, &x, 4);
    return i;
}
static inline float __int_as_float(int i) {
    float x;
    std::memcpy(&x, &i, 4);
    return x;
}
static inline float __uint_as_float(unsigned i) {
    float x;
    std::memcpy(&x, &i, 4);
    return x;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
template <class T> static inline T __ldg(const T *p) { return *p; }

/* ---- bfloat16 (cuda_bf16.h) ---- */

struct __nv_bfloat16 {
    unsigned short __x;
};
/* Round to nearest even, as the device's conversion; NaN stays a (quiet) NaN. */
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h.__x = (unsigned short)((u >> 16) | 0x40u);
    else h.__x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

/* ---- warp matrix operations (nvcuda::wmma, mma.h) ----
 *
 * The shapes attnbench's kernels may use: TF32 m16n16k8 (matrix_a 16 x 8, matrix_b
 * 8 x 16, float accumulator 16 x 16) and bf16 m16n16k16 (float accumulator). A fragment
 * is a per-thread object holding num_elements of the warp's tile in x[]; which element
 * of the tile a lane's x[i] is, CUDA leaves unspecified. Here lane l's x[i] is element
 * i * 32 + l of the tile in row-major order; in strict mode (AB_EMU_STRICT) it is a
 * fixed pseudo-random permutation of that, a different one for each kind of fragment,
 * so a kernel that relies on a layout (applies a row mask to x[], or copies an
 * accumulator's x[] into a matrix_a fragment) gives wrong results there. What kernels
 * may do with x[] is what CUDA allows: the same operation on every element (scale,
 * exp, __float_to_tf32), fill_fragment, and moving whole tiles through memory.
 *
 * load_matrix_sync, store_matrix_sync and mma_sync are warp-collective: every lane of a
 * full warp (the block's size a multiple of 32) must reach the same call, or the
 * emulator reports it (a warp barrier, as __syncwarp, precedes each). A store does not
 * synchronise after it: another lane reading what a lane stored needs a __syncwarp.
 * The pointer must be 32-byte aligned and the leading dimension (elements) a multiple
 * of 16 bytes, as CUDA requires; both are checked.
 *
 * Numerics of mma_sync: TF32 operands keep their top 19 bits (the low 13 mantissa bits
 * are ignored, as the hardware does with values not rounded by __float_to_tf32); bf16
 * operands are exact; products are exact in float, summed in float in k order onto the
 * accumulator (the hardware's order and rounding inside a step are unspecified: tests
 * hold tensor-core results to tolerances measured for it). */

namespace ab_emu {
/* The current warp's staging area for mma_sync (floats; at least 3 * 256). */
float *wmma_stage(void);
/* The tile element held by lane `lane` as x[i] of a fragment of `kind` with n elements
 * per lane (see above; kind names the fragment's use, shape and type). */
int wmma_element(int kind, int n, int lane, int i);
inline void wmma_check_ptr(const void *p, unsigned ldm, size_t elem, const char *what) {
    if ((uintptr_t)p % 32 != 0) fatal("%s: pointer %p is not 32-byte aligned", what, p);
    if (((size_t)ldm * elem) % 16 != 0 || ldm == 0)
        fatal("%s: leading dimension %u (elements of %zu bytes) is not a multiple of 16 bytes", what, ldm, elem);
}
} // namespace ab_emu

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
} // namespace precision
enum layout_t { mem_row_major, mem_col_major };

/* Round to TF32 (10 explicit mantissa bits): to nearest, ties away from zero. */
static inline float __float_to_tf32(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
    float r;
    std::memcpy(&r, &u, 4);
    return r;
}

namespace detail {
template <class Use, int M, int N, int K> struct dims;
template <int M, int N, int K> struct dims<matrix_a, M, N, K> {
    static constexpr int rows = M, cols = K, kind = 0;
};
template <int M, int N, int K> struct dims<matrix_b, M, N, K> {
    static constexpr int rows = K, cols = N, kind = 1;
};
template <int M, int N, int K> struct dims<accumulator, M, N, K> {
    static constexpr int rows = M, cols = N, kind = 2;
};
template <class T> struct storage {
    typedef T type;
    static constexpr int kind = 0;
};
template <> struct storage<precision::tf32> {
    typedef float type;
    static constexpr int kind = 4;
};
template <> struct storage<__nv_bfloat16> {
    typedef __nv_bfloat16 type;
    static constexpr int kind = 8;
};
inline float to_float(float v) { return v; }
inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> inline T from_float(float v);
template <> inline float from_float<float>(float v) { return v; }
template <> inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <class S, int M, int N, int K> struct valid_shape : std::false_type {};
template <> struct valid_shape<precision::tf32, 16, 16, 8> : std::true_type {};
template <> struct valid_shape<__nv_bfloat16, 16, 16, 16> : std::true_type {};
template <> struct valid_shape<float, 16, 16, 8> : std::true_type {};  /* tf32's accumulator */
template <> struct valid_shape<float, 16, 16, 16> : std::true_type {}; /* bf16's accumulator */
} // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void> class fragment {
    static_assert(detail::valid_shape<T, M, N, K>::value,
                  "the emulator has wmma shapes tf32 m16n16k8 and bf16 m16n16k16 (float accumulators)");
    static_assert(std::is_same<Use, accumulator>::value == std::is_same<Layout, void>::value,
                  "matrix_a / matrix_b fragments take row_major or col_major; accumulators take none");

  public:
    typedef typename detail::storage<T>::type element_type;
    typedef detail::dims<Use, M, N, K> shape;
    static constexpr int num_elements = shape::rows * shape::cols / 32;
    /* which fragment this is, for the strict mode's permutation */
    static constexpr int kind = shape::kind + detail::storage<T>::kind + (M * 131 + N * 17 + K) * 16;
    element_type x[num_elements];
    /* tile element (row-major index) of x[i] on the calling lane */
    static int element(int i) { return ab_emu::wmma_element(kind, num_elements, ab_emu::lane_id(), i); }
};

template <class Use, int M, int N, int K, class T, class L>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const typename fragment<Use, M, N, K, T, L>::element_type &v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}

/* matrix_a / matrix_b from memory laid out as the fragment's layout says */
template <class Use, int M, int N, int K, class T, class L, class P>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const P *p, unsigned ldm) {
    typedef fragment<Use, M, N, K, T, L> F;
    static_assert(!std::is_same<L, void>::value, "an accumulator's load takes a layout_t");
    static_assert(std::is_same<typename std::remove_cv<P>::type, typename F::element_type>::value,
                  "load_matrix_sync: the pointer's type is not the fragment's element type");
    ab_emu::syncwarp(0xffffffffu, "wmma::load_matrix_sync");
    ab_emu::wmma_check_ptr(p, ldm, sizeof(P), "wmma::load_matrix_sync");
    const bool rm = std::is_same<L, row_major>::value;
    for (int i = 0; i < F::num_elements; i++) {
        const int e = F::element(i), r = e / F::shape::cols, c = e % F::shape::cols;
        f.x[i] = p[rm ? (size_t)r * ldm + c : (size_t)c * ldm + r];
    }
}

/* accumulator from memory (row- or column-major) */
template <int M, int N, int K, class T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T> &f, const T *p, unsigned ldm, layout_t layout) {
    typedef fragment<accumulator, M, N, K, T> F;
    ab_emu::syncwarp(0xffffffffu, "wmma::load_matrix_sync");
    ab_emu::wmma_check_ptr(p, ldm, sizeof(T), "wmma::load_matrix_sync");
    for (int i = 0; i < F::num_elements; i++) {
        const int e = F::element(i), r = e / F::shape::cols, c = e % F::shape::cols;
        f.x[i] = p[layout == mem_row_major ? (size_t)r * ldm + c : (size_t)c * ldm + r];
    }
}

template <int M, int N, int K, class T>
inline void store_matrix_sync(T *p, const fragment<accumulator, M, N, K, T> &f, unsigned ldm, layout_t layout) {
    typedef fragment<accumulator, M, N, K, T> F;
    ab_emu::syncwarp(0xffffffffu, "wmma::store_matrix_sync");
    ab_emu::wmma_check_ptr(p, ldm, sizeof(T), "wmma::store_matrix_sync");
    for (int i = 0; i < F::num_elements; i++) {
        const int e = F::element(i), r = e / F::shape::cols, c = e % F::shape::cols;
        p[layout == mem_row_major ? (size_t)r * ldm + c : (size_t)c * ldm + r] = f.x[i];
    }
}

namespace detail {
inline float tf32_bits(float v) { /* what the tensor core reads of a TF32 operand */
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u &= 0xffffe000u;
    float r;
    std::memcpy(&r, &u, 4);
    return r;
}
inline float operand(float v, bool tf32) { return tf32 ? tf32_bits(v) : v; }
inline float operand(__nv_bfloat16 v, bool) { return __bfloat162float(v); }
} // namespace detail

/* d = a b + c over the warp (d may be c). */
template <int M, int N, int K, class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, M, N, K, float> &d, const fragment<matrix_a, M, N, K, T, LA> &a,
                     const fragment<matrix_b, M, N, K, T, LB> &b, const fragment<accumulator, M, N, K, float> &c,
                     bool satf = false) {
    typedef fragment<matrix_a, M, N, K, T, LA> FA;
    typedef fragment<matrix_b, M, N, K, T, LB> FB;
    typedef fragment<accumulator, M, N, K, float> FC;
    const bool tf32 = std::is_same<T, precision::tf32>::value;
    ab_emu::syncwarp(0xffffffffu, "wmma::mma_sync");
    float *A = ab_emu::wmma_stage(), *B = A + 256, *C = B + 256; /* row-major M x K, K x N, M x N */
    for (int i = 0; i < FA::num_elements; i++) A[FA::element(i)] = detail::operand(a.x[i], tf32);
    for (int i = 0; i < FB::num_elements; i++) B[FB::element(i)] = detail::operand(b.x[i], tf32);
    for (int i = 0; i < FC::num_elements; i++) C[FC::element(i)] = c.x[i];
    ab_emu::syncwarp(0xffffffffu, "wmma::mma_sync"); /* every lane's share staged */
    float out[FC::num_elements];
    for (int i = 0; i < FC::num_elements; i++) {
        const int e = FC::element(i), r = e / N, col = e % N;
        float acc = C[e];
        for (int kk = 0; kk < K; kk++) acc += A[r * K + kk] * B[kk * N + col];
        if (satf) acc = acc != acc ? 0.0f : acc > 3.402823466e38f ? 3.402823466e38f : acc < -3.402823466e38f ? -3.402823466e38f : acc;
        out[i] = acc;
    }
    ab_emu::syncwarp(0xffffffffu, "wmma::mma_sync"); /* every lane has read the stage */
    for (int i = 0; i < FC::num_elements; i++) d.x[i] = out[i];
}
} // namespace wmma
} // namespace nvcuda

/* ---- cuBLAS ---- */

typedef struct ab_emu_cublas *cublasHandle_t;
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum {
    CUBLAS_DEFAULT_MATH = 0,
    CUBLAS_PEDANTIC_MATH = 2,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
} cublasMath_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
/* TF32_TENSOR_OP_MATH: the float GEMMs that follow round their operands to TF32 (to
 * nearest) before the products, as cuBLAS's TF32 kernels do. */
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode);
const char *cublasGetStatusString(cublasStatus_t st);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, long long strideA,
                                         const float *B, int ldb, long long strideB, const float *beta, float *C,
                                         int ldc, long long strideC, int batchCount);

/* ---- memory traffic (traffic.cpp; the model is in this file's first comment) ---- */

/* What an operation (or a sum of them) moved: launches, requested bytes (the sum of the
 * access sizes: L1/L2 request traffic) and DRAM bytes under an ideal cache within the
 * operation (32 x the distinct 32-byte sectors read, and written), loads and stores
 * apart. */
struct ab_emu_traffic_counts {
    unsigned long long launches, req_read, req_write, dram_read, dram_write;
};
/* The kinds of counted operations (ab_emu_traffic_entry's *kind). */
enum {
    AB_EMU_TRAFFIC_KERNEL = 0, /* a launch */
    AB_EMU_TRAFFIC_CUBLAS = 1, /* a cublasSgemm or cublasSgemmStridedBatched call */
    AB_EMU_TRAFFIC_MEMSET = 2, /* cudaMemset(Async) */
    AB_EMU_TRAFFIC_MEMCPY = 3, /* cudaMemcpy(Async) from device to device memory */
    AB_EMU_TRAFFIC_SORT = 4,   /* cub::DeviceRadixSort::SortPairs */
};
extern "C" {
/* 1 in the traffic library (its .cu sources instrumented), 0 in the plain emulated one,
 * where nothing is ever counted and the calls below report zeros. */
int ab_emu_traffic_instrumented(void);
/* Counting on or off (off at start; not inside an operation). */
void ab_emu_traffic_enable(int on);
/* Zeroes every counter and forgets the names (not inside an operation). */
void ab_emu_traffic_reset(void);
/* Sums since the last reset: every counted operation; host-to-device and
 * device-to-host copy bytes (any pointer may be NULL). */
void ab_emu_traffic_total(ab_emu_traffic_counts *c, unsigned long long *h2d, unsigned long long *d2h);
/* The operations by name, in order of first appearance since the last reset: their
 * number, and the i-th one's name (valid until the next reset; NULL past the end),
 * kind and sums. */
int ab_emu_traffic_entries(void);
const char *ab_emu_traffic_entry(int i, int *kind, ab_emu_traffic_counts *c);
}
namespace ab_emu {
/* The emulator's side (cuda_emu.cpp, and CUB below): allocations made and freed; an
 * operation's start (a kernel's name, or the call's), the ranges of device memory it
 * reads or writes (operations run by the emulator's own code, which is not
 * instrumented), its end; host<->device copies. All do nothing unless counting. */
void traffic_alloc(const void *p, size_t bytes);
void traffic_free(const void *p);
bool traffic_counting(void);
void traffic_begin(const char *name, int kind);
void traffic_range(const void *p, size_t bytes, bool write);
void traffic_end(void);
void traffic_transfer(size_t bytes, bool to_device);
} // namespace ab_emu

/* ---- CUB ---- */

namespace cub {
struct DeviceRadixSort {
    /* Stable sort of (key, value) pairs by the key bits [begin_bit, end_bit). First call
     * with d_temp_storage == NULL sets temp_storage_bytes; the second sorts. */
    template <class KeyT, class ValueT, class NumItemsT>
    static cudaError_t SortPairs(void *d_temp_storage, size_t &temp_storage_bytes, const KeyT *d_keys_in,
                                 KeyT *d_keys_out, const ValueT *d_values_in, ValueT *d_values_out, NumItemsT num_items,
                                 int begin_bit = 0, int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0) {
        static_assert(std::is_integral<KeyT>::value, "the emulated radix sort takes integer keys");
        (void)stream;
        const long long n = (long long)num_items;
        /* What CUB needs is about one more copy of keys and values plus a little. */
        const size_t need = (size_t)(n > 0 ? n : 0) * (sizeof(KeyT) + sizeof(ValueT)) + 256;
        if (!d_temp_storage) {
            temp_storage_bytes = need;
            return cudaSuccess;
        }
        if (n < 0 || begin_bit < 0 || end_bit > (int)(sizeof(KeyT) * 8) || begin_bit > end_bit ||
            temp_storage_bytes < need)
            return cudaErrorInvalidValue;
        ab_emu::require_device(d_temp_storage, temp_storage_bytes, "cub::DeviceRadixSort::SortPairs temp storage");
        if (n == 0) return cudaSuccess;
        const size_t kb = (size_t)n * sizeof(KeyT), vb = (size_t)n * sizeof(ValueT);
        ab_emu::require_device(d_keys_in, kb, "cub::DeviceRadixSort::SortPairs d_keys_in");
        ab_emu::require_device(d_keys_out, kb, "cub::DeviceRadixSort::SortPairs d_keys_out");
        ab_emu::require_device(d_values_in, vb, "cub::DeviceRadixSort::SortPairs d_values_in");
        ab_emu::require_device(d_values_out, vb, "cub::DeviceRadixSort::SortPairs d_values_out");
        ab_emu::device_window w;
        if (ab_emu::traffic_counting()) { /* keys and values read, then written, once */
            ab_emu::traffic_begin("cub::DeviceRadixSort::SortPairs", AB_EMU_TRAFFIC_SORT);
            ab_emu::traffic_range(d_keys_in, kb, false);
            ab_emu::traffic_range(d_values_in, vb, false);
            ab_emu::traffic_range(d_keys_out, kb, true);
            ab_emu::traffic_range(d_values_out, vb, true);
            ab_emu::traffic_end();
        }
        typedef typename std::make_unsigned<KeyT>::type U;
        const int bits = end_bit - begin_bit;
        const U field = bits >= (int)(sizeof(U) * 8) ? (U)~(U)0 : (U)(((U)1 << bits) - 1);
        const U flip = std::is_signed<KeyT>::value ? (U)((U)1 << (sizeof(U) * 8 - 1)) : (U)0;
        std::vector<std::pair<U, long long>> order((size_t)n);
        for (long long i = 0; i < n; i++) {
            U u;
            std::memcpy(&u, &d_keys_in[i], sizeof u);
            u = (U)(u ^ flip); /* signed keys sort by value: flip the sign bit */
            order[(size_t)i] = std::make_pair((U)((u >> begin_bit) & field), i);
        }
        std::stable_sort(order.begin(), order.end(),
                         [](const std::pair<U, long long> &a, const std::pair<U, long long> &b) {
                             return a.first < b.first;
                         });
        std::vector<KeyT> keys((size_t)n);
        std::vector<ValueT> vals((size_t)n);
        for (long long i = 0; i < n; i++) {
            keys[(size_t)i] = d_keys_in[order[(size_t)i].second];
            vals[(size_t)i] = d_values_in[order[(size_t)i].second];
        }
        std::memcpy(d_keys_out, keys.data(), kb);
        std::memcpy(d_values_out, vals.data(), vb);
        return cudaSuccess;
    }
};
} // namespace cub

#endif
