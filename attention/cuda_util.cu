/* Small kernels shared by the CUDA variants (cuda_util.cuh). */
#include "cuda_util.cuh"

#define THREADS 256
#define MAX_BLOCKS 65535LL /* enough blocks to fill any device; the loops do the rest */

__global__ void zero_tail_kernel(float *x, long long n_slices, long long slice_elems, long long start) {
    const long long per = slice_elems - start, total = n_slices * per;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x)
        x[(e / per) * slice_elems + start + e % per] = 0.0f;
}

int attn_cuda_zero_tail(float *x, long long n_slices, long long slice_elems, long long start) {
    const long long per = slice_elems - start;
    if (n_slices <= 0 || per <= 0) return 0;
    if (start == 0) {
        AB_CUDA_CHECK(cudaMemsetAsync(x, 0, (size_t)(n_slices * slice_elems) * sizeof(float), ab_cuda_stream()));
        return 0;
    }
    AB_LAUNCH(zero_tail_kernel, ab_cuda_grid(n_slices * per, THREADS, MAX_BLOCKS), THREADS, 0, ab_cuda_stream(), x,
              n_slices, slice_elems, start);
    return 0;
}

__global__ void copy_slices_kernel(float *dst, long long dst_stride, const float *src, long long src_stride,
                                   long long n_slices, long long elems) {
    const long long total = n_slices * elems;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        long long i = e / elems, c = e % elems;
        dst[i * dst_stride + c] = src[i * src_stride + c];
    }
}

int attn_cuda_copy_slices(float *dst, long long dst_stride, const float *src, long long src_stride,
                          long long n_slices, long long elems) {
    if (n_slices <= 0 || elems <= 0) return 0;
    AB_LAUNCH(copy_slices_kernel, ab_cuda_grid(n_slices * elems, THREADS, MAX_BLOCKS), THREADS, 0, ab_cuda_stream(),
              dst, dst_stride, src, src_stride, n_slices, elems);
    return 0;
}
