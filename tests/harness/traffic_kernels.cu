/* Small kernels whose memory traffic is known by construction, and host runners for
 * them, called by test_traffic.c to check the emulator's traffic counting
 * (tests/cuda_emu/cuda_emu.h, "Memory traffic"). Compiled only against the emulator,
 * with the traffic library's instrumentation where the build has it.
 *
 * Every runner takes device pointers (the test allocates and fills them) and returns 0
 * or an attnbench error code with a message. */
#include "cuda_compat.h"

/* y[i] = x[i]: each element read once and written once. */
__global__ void copy_kernel(const float *x, float *y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = x[i];
}

/* y[i] = x[i] * x[n - 1 - i]: every element of x read twice (by two threads). */
__global__ void twice_kernel(const float *x, float *y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = x[i] * x[n - 1 - i];
}

/* y[i] = x[i * stride]: one float of every `stride`. */
__global__ void strided_kernel(const float *x, float *y, long long n, int stride) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = x[i * stride];
}

/* Each block reverses its slice of n floats through dynamic shared memory: the shared
 * memory's reads and writes are not device memory and are not counted. */
__global__ void smem_reverse_kernel(const float *x, float *y, int n) {
    AB_DYN_SMEM(float, s);
    const long long base = (long long)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = x[base + i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[base + i] = s[n - 1 - i];
}

/* A local array indexed at run time (kept in memory by the compiler: the thread's
 * stack, not device memory): only x and y are counted. */
__global__ void local_array_kernel(const float *x, float *y, long long n) {
    float buf[16];
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        for (int j = 0; j < 16; j++) buf[j] = x[i] + (float)j;
        y[i] = buf[(int)(i & 15)];
    }
}

/* hist[x[i] % bins] += 1 with atomicAdd: each atomic reads and writes its word. */
__global__ void atomic_kernel(const int *x, long long n, int *hist, int bins) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        atomicAdd(&hist[x[i] % bins], 1);
}

/* y[i] += x[i] for float4 elements (16-byte loads and stores). */
__global__ void add4_kernel(const float4 *x, float4 *y, long long n4) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += step) {
        float4 a = x[i], b = y[i];
        y[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
}

/* ---- runners ---- */

extern "C" int traffic_copy(const float *x, float *y, long long n, int blocks) {
    AB_LAUNCH(copy_kernel, blocks, 128, 0, ab_cuda_stream(), x, y, n);
    return 0;
}

extern "C" int traffic_twice(const float *x, float *y, long long n) {
    AB_LAUNCH(twice_kernel, 4, 128, 0, ab_cuda_stream(), x, y, n);
    return 0;
}

extern "C" int traffic_strided(const float *x, float *y, long long n, int stride) {
    AB_LAUNCH(strided_kernel, 2, 64, 0, ab_cuda_stream(), x, y, n, stride);
    return 0;
}

extern "C" int traffic_smem_reverse(const float *x, float *y, int blocks, int n) {
    AB_LAUNCH(smem_reverse_kernel, blocks, 64, (size_t)n * sizeof(float), ab_cuda_stream(), x, y, n);
    return 0;
}

extern "C" int traffic_local_array(const float *x, float *y, long long n) {
    AB_LAUNCH(local_array_kernel, 2, 64, 0, ab_cuda_stream(), x, y, n);
    return 0;
}

extern "C" int traffic_atomic(const int *x, long long n, int *hist, int bins) {
    AB_LAUNCH(atomic_kernel, 2, 64, 0, ab_cuda_stream(), x, n, hist, bins);
    return 0;
}

extern "C" int traffic_add4(const float *x, float *y, long long n4) {
    AB_LAUNCH(add4_kernel, 2, 64, 0, ab_cuda_stream(), (const float4 *)x, (float4 *)y, n4);
    return 0;
}

/* C = alpha op(A) op(B) + beta C through cuBLAS (column-major, as cublasSgemm), or
 * its strided-batched form when batch > 1. */
extern "C" int traffic_sgemm(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, long long sa,
                             const float *B, int ldb, long long sb, float beta, float *C, int ldc, long long sc,
                             int batch) {
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (batch == 1)
        AB_CUBLAS_CHECK(AB_CUBLAS(Sgemm)(ab_cublas(), oa, ob, m, n, k, &alpha, A, lda, B, ldb, &beta, C, ldc));
    else
        AB_CUBLAS_CHECK(AB_CUBLAS(SgemmStridedBatched)(ab_cublas(), oa, ob, m, n, k, &alpha, A, lda, sa, B, ldb, sb,
                                                      &beta, C, ldc, sc, batch));
    return 0;
}

/* A device-to-device copy (cudaMemcpy), as the library makes none itself. */
extern "C" int traffic_d2d(void *dst, const void *src, size_t bytes) {
    AB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ab_cuda_stream()));
    return 0;
}

/* CUB's radix sort of n (key, value) pairs (temp: at least *temp_bytes of device
 * memory; a NULL temp sets *temp_bytes). */
extern "C" int traffic_sort(void *temp, size_t *temp_bytes, const unsigned *keys, unsigned *keys_out, const int *vals,
                            int *vals_out, int n) {
    AB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, *temp_bytes, keys, keys_out, vals, vals_out, n, 0, 32,
                                                  ab_cuda_stream()));
    return 0;
}
