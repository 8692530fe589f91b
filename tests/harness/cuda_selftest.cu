/* Small kernels whose results depend on the CUDA semantics the emulator must get right
 * (barriers, shared memory, shuffles, ballots, atomics, thread and block indices), and
 * host runners for them and for cuBLAS and CUB, called by test_cuda_selftest.c.
 *
 * Built twice like the library: against the emulator (always: the emulator's
 * self-test) and by nvcc when the build has CUDA (on a GPU the same checks confirm
 * that the emulator's answers are the real ones). Every runner returns 0 or an
 * attnbench error code with a message. */
#define AB_CUDA_CUB
#include "cuda_compat.h"

#include "memory.h"

#include <stdint.h>
#include <string.h>

#define CHECK_ALLOC(p, bytes) AB_TRY(ab_cuda_malloc((void **)&(p), (bytes)))

/* ---- barriers and shared memory ---- */

/* Tree sum in static shared memory: each level reads what other threads wrote at the
 * level before, so it is right only if every __syncthreads does its job. */
__global__ void tree_sum_kernel(const int *x, int *out) {
    __shared__ int buf[256];
    const int t = threadIdx.x;
    buf[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) buf[t] += buf[t + half];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = buf[0];
}

/* Reverses each block's slice through dynamic shared memory (n floats per block). */
__global__ void reverse_kernel(const float *x, float *y, int n) {
    AB_DYN_SMEM(float, s);
    const int t = threadIdx.x;
    const long long base = (long long)blockIdx.x * n;
    for (int i = t; i < n; i += blockDim.x) s[i] = x[base + i];
    __syncthreads();
    for (int i = t; i < n; i += blockDim.x) y[base + i] = s[n - 1 - i];
}

/* __syncthreads_count / _or / _and of (tid % 3 == 0). */
__global__ void sync_count_kernel(int *out) {
    const int p = threadIdx.x % 3 == 0;
    int c = __syncthreads_count(p), o = __syncthreads_or(p), a = __syncthreads_and(p);
    int a1 = __syncthreads_and(1);
    if (threadIdx.x == 0) {
        out[0] = c;
        out[1] = o;
        out[2] = a;
        out[3] = a1;
    }
}

/* ---- warps ---- */

/* Per thread, in out[tid * 8 + ...]: warp sum by xor shuffles, by down shuffles (lane
 * 0's value is the sum), broadcast of lane 5, inclusive prefix sum by up shuffles,
 * xor sum within segments of 8 lanes, ballot of odd lanes, any(lane == 7), all(x > 0). */
__global__ void warp_kernel(const int *x, int *out) {
    const int t = threadIdx.x, lane = t & 31;
    const int v = x[t];
    int s = v;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    int d = v;
    for (int o = 16; o > 0; o >>= 1) d += __shfl_down_sync(0xffffffffu, d, o);
    int b = __shfl_sync(0xffffffffu, v, 5);
    int p = v;
    for (int o = 1; o < 32; o <<= 1) {
        int u = __shfl_up_sync(0xffffffffu, p, o);
        if (lane >= o) p += u;
    }
    int seg = v;
    for (int o = 4; o > 0; o >>= 1) seg += __shfl_xor_sync(0xffffffffu, seg, o, 8);
    unsigned bal = __ballot_sync(0xffffffffu, lane & 1);
    int any = __any_sync(0xffffffffu, lane == 7), all = __all_sync(0xffffffffu, v > 0);
    __syncwarp();
    int *o8 = out + t * 8;
    o8[0] = s;
    o8[1] = d;
    o8[2] = b;
    o8[3] = p;
    o8[4] = seg;
    o8[5] = (int)bal;
    o8[6] = any;
    o8[7] = all;
}

/* Float and double shuffles move the bits unchanged. */
__global__ void shfl_types_kernel(const float *xf, const double *xd, float *yf, double *yd) {
    const int t = threadIdx.x;
    yf[t] = __shfl_xor_sync(0xffffffffu, xf[t], 1);
    yd[t] = __shfl_sync(0xffffffffu, xd[t], 31 - (t & 31));
}

/* ---- atomics and indices ---- */

/* Histogram of x into `bins` counters and the float sum of x, from every block. */
__global__ void atomic_kernel(const int *x, long long n, int bins, int *hist, float *sum) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        atomicAdd(&hist[x[i] % bins], 1);
        atomicAdd(sum, (float)x[i]);
    }
}

/* Each thread of a 3-D grid of 3-D blocks writes its global linear index at its slot. */
__global__ void index_kernel(int *out) {
    const unsigned bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned nt = blockDim.x * blockDim.y * blockDim.z;
    out[bx * nt + tx] = (int)(bx * nt + tx);
}

/* ---- misuse the emulator reports ---- */

/* Only the first half of the block reaches the barrier. */
__global__ void partial_barrier_kernel(int *out) {
    if (threadIdx.x < blockDim.x / 2) __syncthreads();
    out[threadIdx.x] = 1;
}

/* Lane 31 exits before the warp's shuffle that names it. */
__global__ void exited_lane_kernel(int *out) {
    if ((threadIdx.x & 31) == 31) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

/* Reads one float past the dynamic shared memory it was given. */
__global__ void smem_overflow_kernel(float *out, int n) {
    AB_DYN_SMEM(float, s);
    s[threadIdx.x] = 1.0f;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = s[n];
}

__global__ void nothing_kernel(int *out) { out[0] = 1; }

/* A race: each thread writes its slot of shared memory and, with no barrier between,
 * reads its lower neighbour's. Wrong on a GPU; the emulator's default order (threads in
 * index order, switching at barriers) happens to hide it, strict mode's reverse order
 * shows it (the neighbour's slot still holds the poison: NaN). */
__global__ void racy_shift_kernel(float *y) {
    AB_DYN_SMEM(float, s);
    const int t = threadIdx.x;
    s[t] = (float)(t + 1);
    y[t] = t > 0 ? s[t - 1] : 0.0f; /* missing __syncthreads() before this read */
}

/* Reads static shared memory before any thread of the block wrote it (a bug: on a GPU
 * it holds whatever was there), then writes it: the emulator poisons static shared
 * memory at every block start, so every block reads NaN, not the previous block's
 * value. */
__global__ void stale_static_kernel(float *out) {
    __shared__ float carried;
    if (threadIdx.x == 0) out[blockIdx.x] = carried;
    __syncthreads();
    if (threadIdx.x == 0) carried = (float)blockIdx.x;
}

/* Reads one element past the end of x (n floats). */
__global__ void global_past_end_kernel(const float *x, float *out, int n) {
    if (threadIdx.x == 0) out[0] = x[n];
}

/* ---- runners ---- */

extern "C" int selftest_tree_sum(const int *x, int blocks, int threads, int *out) {
    int *dx, *dout;
    CHECK_ALLOC(dx, sizeof(int) * blocks * threads);
    CHECK_ALLOC(dout, sizeof(int) * blocks);
    AB_TRY(ab_cuda_memcpy_h2d(dx, x, sizeof(int) * blocks * threads));
    AB_LAUNCH(tree_sum_kernel, blocks, threads, 0, ab_cuda_stream(), dx, dout);
    AB_TRY(ab_cuda_memcpy_d2h(out, dout, sizeof(int) * blocks));
    ab_cuda_free(dx);
    ab_cuda_free(dout);
    return 0;
}

extern "C" int selftest_reverse(const float *x, float *y, int blocks, int n, int threads) {
    float *dx, *dy;
    CHECK_ALLOC(dx, sizeof(float) * blocks * n);
    CHECK_ALLOC(dy, sizeof(float) * blocks * n);
    AB_TRY(ab_cuda_memcpy_h2d(dx, x, sizeof(float) * blocks * n));
    AB_LAUNCH(reverse_kernel, blocks, threads, sizeof(float) * n, ab_cuda_stream(), dx, dy, n);
    AB_TRY(ab_cuda_memcpy_d2h(y, dy, sizeof(float) * blocks * n));
    ab_cuda_free(dx);
    ab_cuda_free(dy);
    return 0;
}

/* Dynamic shared memory above 48 KiB after cudaFuncSetAttribute. */
extern "C" int selftest_reverse_large(const float *x, float *y, int n) {
    float *dx, *dy;
    CHECK_ALLOC(dx, sizeof(float) * n);
    CHECK_ALLOC(dy, sizeof(float) * n);
    AB_TRY(ab_cuda_memcpy_h2d(dx, x, sizeof(float) * n));
    AB_CUDA_CHECK(cudaFuncSetAttribute(reverse_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)(sizeof(float) * n)));
    AB_LAUNCH(reverse_kernel, 1, 256, sizeof(float) * n, ab_cuda_stream(), dx, dy, n);
    AB_TRY(ab_cuda_memcpy_d2h(y, dy, sizeof(float) * n));
    ab_cuda_free(dx);
    ab_cuda_free(dy);
    return 0;
}

extern "C" int selftest_sync_count(int threads, int *out4) {
    int *d;
    CHECK_ALLOC(d, sizeof(int) * 4);
    AB_LAUNCH(sync_count_kernel, 1, threads, 0, ab_cuda_stream(), d);
    AB_TRY(ab_cuda_memcpy_d2h(out4, d, sizeof(int) * 4));
    ab_cuda_free(d);
    return 0;
}

extern "C" int selftest_warp(const int *x, int threads, int *out) {
    int *dx, *dout;
    CHECK_ALLOC(dx, sizeof(int) * threads);
    CHECK_ALLOC(dout, sizeof(int) * threads * 8);
    AB_TRY(ab_cuda_memcpy_h2d(dx, x, sizeof(int) * threads));
    AB_LAUNCH(warp_kernel, 1, threads, 0, ab_cuda_stream(), dx, dout);
    AB_TRY(ab_cuda_memcpy_d2h(out, dout, sizeof(int) * threads * 8));
    ab_cuda_free(dx);
    ab_cuda_free(dout);
    return 0;
}

extern "C" int selftest_shfl_types(const float *xf, const double *xd, float *yf, double *yd) {
    float *dxf, *dyf;
    double *dxd, *dyd;
    CHECK_ALLOC(dxf, sizeof(float) * 64);
    CHECK_ALLOC(dyf, sizeof(float) * 64);
    CHECK_ALLOC(dxd, sizeof(double) * 64);
    CHECK_ALLOC(dyd, sizeof(double) * 64);
    AB_TRY(ab_cuda_memcpy_h2d(dxf, xf, sizeof(float) * 64));
    AB_TRY(ab_cuda_memcpy_h2d(dxd, xd, sizeof(double) * 64));
    AB_LAUNCH(shfl_types_kernel, 1, 64, 0, ab_cuda_stream(), dxf, dxd, dyf, dyd);
    AB_TRY(ab_cuda_memcpy_d2h(yf, dyf, sizeof(float) * 64));
    AB_TRY(ab_cuda_memcpy_d2h(yd, dyd, sizeof(double) * 64));
    ab_cuda_free(dxf);
    ab_cuda_free(dyf);
    ab_cuda_free(dxd);
    ab_cuda_free(dyd);
    return 0;
}

extern "C" int selftest_atomics(const int *x, long long n, int bins, int blocks, int *hist, float *sum) {
    int *dx, *dh;
    float *ds;
    CHECK_ALLOC(dx, sizeof(int) * n);
    CHECK_ALLOC(dh, sizeof(int) * bins);
    CHECK_ALLOC(ds, sizeof(float));
    AB_TRY(ab_cuda_memcpy_h2d(dx, x, sizeof(int) * n));
    AB_TRY(ab_cuda_memset(dh, 0, sizeof(int) * bins));
    AB_TRY(ab_cuda_memset(ds, 0, sizeof(float)));
    AB_LAUNCH(atomic_kernel, blocks, 128, 0, ab_cuda_stream(), dx, n, bins, dh, ds);
    AB_TRY(ab_cuda_memcpy_d2h(hist, dh, sizeof(int) * bins));
    AB_TRY(ab_cuda_memcpy_d2h(sum, ds, sizeof(float)));
    ab_cuda_free(dx);
    ab_cuda_free(dh);
    ab_cuda_free(ds);
    return 0;
}

extern "C" int selftest_indices(const unsigned grid[3], const unsigned block[3], int *out) {
    const size_t n = (size_t)grid[0] * grid[1] * grid[2] * block[0] * block[1] * block[2];
    int *d;
    CHECK_ALLOC(d, sizeof(int) * n);
    AB_TRY(ab_cuda_memset(d, 0xff, sizeof(int) * n));
    AB_LAUNCH(index_kernel, dim3(grid[0], grid[1], grid[2]), dim3(block[0], block[1], block[2]), 0,
              ab_cuda_stream(), d);
    AB_TRY(ab_cuda_memcpy_d2h(out, d, sizeof(int) * n));
    ab_cuda_free(d);
    return 0;
}

static int launch_nothing(int threads, int *d) {
    AB_LAUNCH(nothing_kernel, 1, threads, 0, ab_cuda_stream(), d);
    return 0;
}

/* A launch with `threads` threads per block (over 1024 is refused). */
extern "C" int selftest_launch(int threads) {
    int *d;
    CHECK_ALLOC(d, sizeof(int));
    int rc = launch_nothing(threads, d);
    if (!rc) rc = ab_cuda_sync();
    ab_cuda_free(d);
    return rc;
}

/* ---- CUDA graphs of the library's stream ---- */

__global__ void axpb_kernel(const float *x, float *y, float a, float b, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

/* Records y = a x + b (a kernel), z = y (a copy), w = 0x01 bytes (a memset) and
 * C = A B (cuBLAS, 2 x 2) into a graph, then: out_before = y before any launch (zero:
 * recording runs nothing); launch 1 -> y1, z1, c1; x2 uploaded, w cleared, launch 2 ->
 * y2, w2. The kernel's a is changed after it was recorded: the graph keeps the value it
 * was launched with. Then a recording spoilt by a synchronous copy: refused[0] = that
 * copy failed, refused[1] = the end of the recording failed, refused[2] = the stream
 * works afterwards. */
static int graph_run(const float *x, const float *x2, int n, float a, float b, float *dx, float *dy, float *dz,
                     int *dw, float *dm, float *out_before, float *y1, float *z1, float *c1, float *y2, int *w2,
                     int *refused) {
    const float A[4] = {1, 2, 3, 4}, B[4] = {5, 6, 7, 8};
    const size_t fb = sizeof(float) * (size_t)n;
    AB_TRY(ab_cuda_memcpy_h2d(dx, x, fb));
    AB_TRY(ab_cuda_memcpy_h2d(dm, A, sizeof A));
    AB_TRY(ab_cuda_memcpy_h2d(dm + 4, B, sizeof B));
    AB_TRY(ab_cuda_memset(dy, 0, fb));
    AB_TRY(ab_cuda_memset(dz, 0, fb));
    AB_TRY(ab_cuda_memset(dw, 0, sizeof(int) * (size_t)n));
    AB_TRY(ab_cuda_sync());
    void *graph = NULL;
    float av = a;
    AB_TRY(ab_cuda_graph_begin());
    int rc = 0;
    AB_LAUNCH(axpb_kernel, (n + 127) / 128, 128, 0, ab_cuda_stream(), dx, dy, av, b, n);
    av = -1000.0f; /* not what the graph uses */
    if (!rc) rc = ab_cuda_memcpy_d2d(dz, dy, fb);
    if (!rc) rc = ab_cuda_memset(dw, 0x01, sizeof(int) * (size_t)n);
    if (!rc) rc = ab_cuda_sgemm(false, false, 2, 2, 2, 1.0f, dm, 2, dm + 4, 2, 0.0f, dm + 8, 2);
    const int rc_end = ab_cuda_graph_end(&graph);
    if (rc || rc_end) {
        ab_cuda_graph_destroy(graph);
        return rc ? rc : rc_end;
    }
    rc = ab_cuda_memcpy_d2h(out_before, dy, fb);
    if (!rc) rc = ab_cuda_graph_launch(graph);
    if (!rc) rc = ab_cuda_memcpy_d2h(y1, dy, fb);
    if (!rc) rc = ab_cuda_memcpy_d2h(z1, dz, fb);
    if (!rc) rc = ab_cuda_memcpy_d2h(c1, dm + 8, 4 * sizeof(float));
    if (!rc) rc = ab_cuda_memcpy_h2d(dx, x2, fb);
    if (!rc) rc = ab_cuda_memset(dw, 0, sizeof(int) * (size_t)n);
    if (!rc) rc = ab_cuda_graph_launch(graph);
    if (!rc) rc = ab_cuda_memcpy_d2h(y2, dy, fb);
    if (!rc) rc = ab_cuda_memcpy_d2h(w2, dw, sizeof(int) * (size_t)n);
    ab_cuda_graph_destroy(graph);
    (void)av;
    if (rc) return rc;
    /* a synchronous copy while recording */
    AB_TRY(ab_cuda_graph_begin());
    float h;
    refused[0] = ab_cuda_memcpy_d2h(&h, dy, sizeof h) != 0;
    graph = NULL;
    refused[1] = ab_cuda_graph_end(&graph) != 0 && graph == NULL;
    ab_cuda_graph_destroy(graph);
    ab_clear_error();
    refused[2] = ab_cuda_memset(dw, 0, sizeof(int)) == 0 && ab_cuda_sync() == 0;
    return 0;
}

extern "C" int selftest_graph(const float *x, const float *x2, int n, float a, float b, float *out_before, float *y1,
                              float *z1, float *c1, float *y2, int *w2, int *refused) {
    float *dx = NULL, *dy = NULL, *dz = NULL, *dm = NULL;
    int *dw = NULL;
    const size_t fb = sizeof(float) * (size_t)n;
    int rc = ab_cuda_malloc((void **)&dx, fb);
    if (!rc) rc = ab_cuda_malloc((void **)&dy, fb);
    if (!rc) rc = ab_cuda_malloc((void **)&dz, fb);
    if (!rc) rc = ab_cuda_malloc((void **)&dw, sizeof(int) * (size_t)n);
    if (!rc) rc = ab_cuda_malloc((void **)&dm, 12 * sizeof(float));
    if (!rc) rc = graph_run(x, x2, n, a, b, dx, dy, dz, dw, dm, out_before, y1, z1, c1, y2, w2, refused);
    ab_cuda_free(dx), ab_cuda_free(dy), ab_cuda_free(dz), ab_cuda_free(dw), ab_cuda_free(dm);
    return rc;
}

extern "C" int selftest_partial_barrier(void) {
    int *d;
    CHECK_ALLOC(d, sizeof(int) * 64);
    AB_LAUNCH(partial_barrier_kernel, 1, 64, 0, ab_cuda_stream(), d);
    return ab_cuda_sync();
}

extern "C" int selftest_exited_lane(void) {
    int *d;
    CHECK_ALLOC(d, sizeof(int) * 32);
    AB_LAUNCH(exited_lane_kernel, 1, 32, 0, ab_cuda_stream(), d);
    return ab_cuda_sync();
}

extern "C" int selftest_smem_overflow(int n) {
    float *d;
    CHECK_ALLOC(d, sizeof(float));
    AB_LAUNCH(smem_overflow_kernel, 1, 32, sizeof(float) * n, ab_cuda_stream(), d, n);
    return ab_cuda_sync();
}

extern "C" int selftest_racy_shift(float *y, int threads) {
    float *d;
    CHECK_ALLOC(d, sizeof(float) * threads);
    AB_LAUNCH(racy_shift_kernel, 1, threads, sizeof(float) * threads, ab_cuda_stream(), d);
    AB_TRY(ab_cuda_memcpy_d2h(y, d, sizeof(float) * threads));
    ab_cuda_free(d);
    return 0;
}

extern "C" int selftest_stale_static(float *out, int blocks) {
    float *d;
    CHECK_ALLOC(d, sizeof(float) * blocks);
    AB_LAUNCH(stale_static_kernel, blocks, 32, 0, ab_cuda_stream(), d);
    AB_TRY(ab_cuda_memcpy_d2h(out, d, sizeof(float) * blocks));
    ab_cuda_free(d);
    return 0;
}

extern "C" int selftest_global_past_end(int n) {
    float *x, *out;
    CHECK_ALLOC(x, sizeof(float) * n);
    CHECK_ALLOC(out, sizeof(float));
    AB_LAUNCH(global_past_end_kernel, 1, 32, 0, ab_cuda_stream(), x, out, n);
    return ab_cuda_sync();
}

/* cudaMemcpy told HostToDevice with a host destination. */
extern "C" int selftest_bad_copy(void) {
    float host[4] = {0}, src[4] = {0};
    AB_CUDA_CHECK(cudaMemcpy(host, src, sizeof host, cudaMemcpyHostToDevice));
    return 0;
}

/* ---- cuBLAS, column-major, as called directly ---- */

/* C (col-major m x n, ldc) = alpha op(A) op(B) + beta C, batched with strides, on
 * host arrays copied to the device and back. A has lda * (cols of A) floats per batch
 * entry, etc. (strides given by the caller). batch == 1 uses cublasSgemm. */
extern "C" int selftest_cublas(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, long long sa,
                               const float *B, int ldb, long long sb, float beta, float *C, int ldc, long long sc,
                               int batch, size_t na, size_t nb, size_t nc) {
    AB_TRY(ab_cuda_init());
    float *dA, *dB, *dC;
    CHECK_ALLOC(dA, sizeof(float) * na);
    CHECK_ALLOC(dB, sizeof(float) * nb);
    CHECK_ALLOC(dC, sizeof(float) * nc);
    AB_TRY(ab_cuda_memcpy_h2d(dA, A, sizeof(float) * na));
    AB_TRY(ab_cuda_memcpy_h2d(dB, B, sizeof(float) * nb));
    AB_TRY(ab_cuda_memcpy_h2d(dC, C, sizeof(float) * nc));
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (batch == 1)
        AB_CUBLAS_CHECK(AB_CUBLAS(Sgemm)(ab_cublas(), oa, ob, m, n, k, &alpha, dA, lda, dB, ldb, &beta, dC, ldc));
    else
        AB_CUBLAS_CHECK(AB_CUBLAS(SgemmStridedBatched)(ab_cublas(), oa, ob, m, n, k, &alpha, dA, lda, sa, dB, ldb, sb,
                                                  &beta, dC, ldc, sc, batch));
    AB_TRY(ab_cuda_memcpy_d2h(C, dC, sizeof(float) * nc));
    ab_cuda_free(dA);
    ab_cuda_free(dB);
    ab_cuda_free(dC);
    return 0;
}

/* cuBLAS argument checking: lda smaller than the rows of A is refused. */
extern "C" int selftest_cublas_bad_lda(void) {
    AB_TRY(ab_cuda_init());
    float *d;
    CHECK_ALLOC(d, sizeof(float) * 16);
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st = AB_CUBLAS(Sgemm)(ab_cublas(), CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 2, &one, d, 3, d, 4, &zero, d, 4);
    ab_cuda_free(d);
    return st == CUBLAS_STATUS_INVALID_VALUE ? 0 : ab_fail(AB_EDEVICE, "cuBLAS status %d for lda < m", (int)st);
}

/* ---- CUB ---- */

/* Stable sort of (key, value) pairs by key bits [begin_bit, end_bit), through the
 * two-call temporary storage protocol. *temp_bytes receives the size asked for. */
extern "C" int selftest_sort(const unsigned *keys, const int *vals, int n, int begin_bit, int end_bit,
                             unsigned *keys_out, int *vals_out, size_t *temp_bytes) {
    AB_TRY(ab_cuda_init());
    unsigned *dk, *dko;
    int *dv, *dvo;
    CHECK_ALLOC(dk, sizeof(unsigned) * n);
    CHECK_ALLOC(dko, sizeof(unsigned) * n);
    CHECK_ALLOC(dv, sizeof(int) * n);
    CHECK_ALLOC(dvo, sizeof(int) * n);
    AB_TRY(ab_cuda_memcpy_h2d(dk, keys, sizeof(unsigned) * n));
    AB_TRY(ab_cuda_memcpy_h2d(dv, vals, sizeof(int) * n));
    size_t bytes = 0;
    AB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, bytes, dk, dko, dv, dvo, n, begin_bit, end_bit,
                                                  ab_cuda_stream()));
    *temp_bytes = bytes;
    void *tmp;
    CHECK_ALLOC(tmp, bytes);
    AB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(tmp, bytes, dk, dko, dv, dvo, n, begin_bit, end_bit,
                                                  ab_cuda_stream()));
    AB_TRY(ab_cuda_memcpy_d2h(keys_out, dko, sizeof(unsigned) * n));
    AB_TRY(ab_cuda_memcpy_d2h(vals_out, dvo, sizeof(int) * n));
    ab_cuda_free(tmp);
    ab_cuda_free(dk);
    ab_cuda_free(dko);
    ab_cuda_free(dv);
    ab_cuda_free(dvo);
    return 0;
}

/* ---- warp matrix operations (nvcuda::wmma) ---- */

using namespace nvcuda;

/* C (M x N, row-major, ldc N) = A B, one warp per 16 x 16 tile of C (warps of the block
 * over the tiles), A (M x K) and B (K x N) read straight from global memory in the
 * layouts asked for (a_col: A stored column-major, lda M; else row-major, lda K; b_col
 * the same for B). TF32 m16n16k8; `round`: the fragments' elements rounded with
 * __float_to_tf32 (else the tensor cores ignore their low mantissa bits). */
template <class LA, class LB>
__device__ void wmma_tf32_tile(const float *A, const float *B, float *C, int M, int N, int K, bool round, int tile) {
    const int tm = tile / (N / 16), tn = tile % (N / 16);
    const bool a_col = std::is_same<LA, wmma::col_major>::value, b_col = std::is_same<LB, wmma::col_major>::value;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k0 = 0; k0 < K; k0 += 8) {
        wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LA> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB> b;
        wmma::load_matrix_sync(a, a_col ? A + (size_t)k0 * M + tm * 16 : A + (size_t)tm * 16 * K + k0, a_col ? M : K);
        wmma::load_matrix_sync(b, b_col ? B + (size_t)tn * 16 * K + k0 : B + (size_t)k0 * N + tn * 16, b_col ? K : N);
        if (round) {
            for (int i = 0; i < a.num_elements; i++) a.x[i] = wmma::__float_to_tf32(a.x[i]);
            for (int i = 0; i < b.num_elements; i++) b.x[i] = wmma::__float_to_tf32(b.x[i]);
        }
        wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(C + (size_t)tm * 16 * N + tn * 16, acc, N, wmma::mem_row_major);
}

template <class LA, class LB>
__global__ void wmma_tf32_kernel(const float *A, const float *B, float *C, int M, int N, int K, int round) {
    const int warps = blockDim.x / 32, tiles = (M / 16) * (N / 16);
    for (int t = blockIdx.x * warps + threadIdx.x / 32; t < tiles; t += gridDim.x * warps)
        wmma_tf32_tile<LA, LB>(A, B, C, M, N, K, round != 0, t);
}

/* The same with bf16 operands (m16n16k16), both row-major. */
__global__ void wmma_bf16_kernel(const __nv_bfloat16 *A, const __nv_bfloat16 *B, float *C, int M, int N, int K) {
    const int warps = blockDim.x / 32, tiles = (M / 16) * (N / 16);
    for (int t = blockIdx.x * warps + threadIdx.x / 32; t < tiles; t += gridDim.x * warps) {
        const int tm = t / (N / 16), tn = t % (N / 16);
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int k0 = 0; k0 < K; k0 += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
            wmma::load_matrix_sync(a, A + (size_t)tm * 16 * K + k0, K);
            wmma::load_matrix_sync(b, B + (size_t)k0 * N + tn * 16, N);
            wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(C + (size_t)tm * 16 * N + tn * 16, acc, N, wmma::mem_row_major);
    }
}

__global__ void to_bf16_kernel(const float *x, __nv_bfloat16 *y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

/* An accumulator through shared memory and back (store, then load in the other
 * layout), plus 1 on every element: out (16 x 16, row-major) = in^T + 1. */
__global__ void wmma_roundtrip_kernel(const float *in, float *out) {
    __shared__ __align__(32) float tile[256];
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> f;
    wmma::load_matrix_sync(f, in, 16, wmma::mem_row_major);
    wmma::store_matrix_sync(tile, f, 16, wmma::mem_col_major);
    __syncwarp();
    wmma::load_matrix_sync(f, tile, 16, wmma::mem_row_major);
    for (int i = 0; i < f.num_elements; i++) f.x[i] += 1.0f;
    wmma::store_matrix_sync(out, f, 16, wmma::mem_row_major);
}

static int wmma_launch_tf32(int a_col, int b_col, const float *dA, const float *dB, float *dC, int M, int N, int K,
                            int round) {
    const unsigned grid = ab_cuda_grid((long long)(M / 16) * (N / 16), 4, 1024);
    auto *k = a_col ? (b_col ? &wmma_tf32_kernel<wmma::col_major, wmma::col_major>
                             : &wmma_tf32_kernel<wmma::col_major, wmma::row_major>)
                    : (b_col ? &wmma_tf32_kernel<wmma::row_major, wmma::col_major>
                             : &wmma_tf32_kernel<wmma::row_major, wmma::row_major>);
    AB_LAUNCH(k, grid, 128, 0, ab_cuda_stream(), dA, dB, dC, M, N, K, round);
    return 0;
}

/* C = A B through wmma (host arrays; M, N multiples of 16, K of 8 (tf32) or 16 (bf16));
 * A, B in the layouts a_col / b_col (bf16: row-major only); bf16: A and B are rounded
 * to bf16 on the device first. */
extern "C" int selftest_wmma(int bf16, int a_col, int b_col, int round, int M, int N, int K, const float *A,
                             const float *B, float *C) {
    float *dA, *dB, *dC;
    CHECK_ALLOC(dA, sizeof(float) * M * K);
    CHECK_ALLOC(dB, sizeof(float) * K * N);
    CHECK_ALLOC(dC, sizeof(float) * M * N);
    AB_TRY(ab_cuda_memcpy_h2d(dA, A, sizeof(float) * M * K));
    AB_TRY(ab_cuda_memcpy_h2d(dB, B, sizeof(float) * K * N));
    if (bf16) {
        __nv_bfloat16 *hA, *hB;
        CHECK_ALLOC(hA, sizeof(__nv_bfloat16) * M * K);
        CHECK_ALLOC(hB, sizeof(__nv_bfloat16) * K * N);
        AB_LAUNCH(to_bf16_kernel, 64, 256, 0, ab_cuda_stream(), dA, hA, (long long)M * K);
        AB_LAUNCH(to_bf16_kernel, 64, 256, 0, ab_cuda_stream(), dB, hB, (long long)K * N);
        AB_LAUNCH(wmma_bf16_kernel, ab_cuda_grid((long long)(M / 16) * (N / 16), 4, 1024), 128, 0, ab_cuda_stream(), hA,
                  hB, dC, M, N, K);
        ab_cuda_free(hA);
        ab_cuda_free(hB);
    } else {
        AB_TRY(wmma_launch_tf32(a_col, b_col, dA, dB, dC, M, N, K, round));
    }
    AB_TRY(ab_cuda_memcpy_d2h(C, dC, sizeof(float) * M * N));
    ab_cuda_free(dA);
    ab_cuda_free(dB);
    ab_cuda_free(dC);
    return 0;
}

extern "C" int selftest_wmma_roundtrip(const float *in, float *out) {
    float *d;
    CHECK_ALLOC(d, sizeof(float) * 512);
    AB_TRY(ab_cuda_memcpy_h2d(d, in, sizeof(float) * 256));
    AB_LAUNCH(wmma_roundtrip_kernel, 1, 32, 0, ab_cuda_stream(), d, d + 256);
    AB_TRY(ab_cuda_memcpy_d2h(out, d + 256, sizeof(float) * 256));
    ab_cuda_free(d);
    return 0;
}

#ifdef AB_CUDA_EMU
/* ---- wmma misuse the emulator reports ---- */

/* Relies on the emulator's default layout (lane l's x[i] is row (32 i + l) / 16 of the
 * tile) to scale the rows of an accumulator in registers: right in the default mode by
 * accident, wrong in strict mode (and on a GPU, whose layout is another). */
__global__ void wmma_layout_reliant_kernel(const float *in, const float *row_scale, float *out) {
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> f;
    wmma::load_matrix_sync(f, in, 16, wmma::mem_row_major);
    const int lane = threadIdx.x & 31;
    for (int i = 0; i < f.num_elements; i++) f.x[i] *= row_scale[(i * 32 + lane) / 16];
    wmma::store_matrix_sync(out, f, 16, wmma::mem_row_major);
}

/* A load from a pointer 4 bytes past a 32-byte boundary. */
__global__ void wmma_misaligned_kernel(const float *in, float *out) {
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> f;
    wmma::load_matrix_sync(f, in + 1, 16, wmma::mem_row_major);
    wmma::store_matrix_sync(out, f, 16, wmma::mem_row_major);
}

/* Only half of the warp reaches mma_sync. */
__global__ void wmma_divergent_kernel(float *out) {
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> c;
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b;
    wmma::fill_fragment(c, 0.0f);
    wmma::fill_fragment(a, 1.0f);
    wmma::fill_fragment(b, 1.0f);
    if ((threadIdx.x & 31) < 16) wmma::mma_sync(c, a, b, c);
    wmma::store_matrix_sync(out, c, 16, wmma::mem_row_major);
}

extern "C" int selftest_wmma_layout_reliant(const float *in, const float *scale, float *out) {
    float *d;
    CHECK_ALLOC(d, sizeof(float) * 528);
    AB_TRY(ab_cuda_memcpy_h2d(d, in, sizeof(float) * 256));
    AB_TRY(ab_cuda_memcpy_h2d(d + 512, scale, sizeof(float) * 16));
    AB_LAUNCH(wmma_layout_reliant_kernel, 1, 32, 0, ab_cuda_stream(), d, d + 512, d + 256);
    AB_TRY(ab_cuda_memcpy_d2h(out, d + 256, sizeof(float) * 256));
    ab_cuda_free(d);
    return 0;
}

extern "C" int selftest_wmma_misaligned(void) {
    float *d;
    CHECK_ALLOC(d, sizeof(float) * 1024);
    AB_TRY(ab_cuda_memset(d, 0, sizeof(float) * 1024));
    AB_LAUNCH(wmma_misaligned_kernel, 1, 32, 0, ab_cuda_stream(), d, d + 512);
    return ab_cuda_sync();
}

extern "C" int selftest_wmma_divergent(void) {
    float *d;
    CHECK_ALLOC(d, sizeof(float) * 256);
    AB_LAUNCH(wmma_divergent_kernel, 1, 32, 0, ab_cuda_stream(), d);
    return ab_cuda_sync();
}
#endif
