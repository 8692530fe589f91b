/* Lab: device-to-device copy of B*H*N*D floats, the memory floor every bandwidth-bound
 * kernel of attnbench is compared with (one read and one write of each byte).
 *   version 1: one float per thread, grid-stride loop
 *   version 2: float4 per thread (16-byte accesses; n a multiple of 4 here)
 *   version 3: cudaMemcpyAsync (the driver's copy)
 * Reference: the input itself (a copy is exact). */
#include "lab.h"

__global__ void copy_v1(const float *x, float *y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = x[i];
}

__global__ void copy_v2(const float4 *x, float4 *y, long long n4) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
        y[i] = x[i];
}

static int run(int v, const float *x, float *y, long long n) {
    switch (v) {
    case 1: AB_LAUNCH(copy_v1, ab_cuda_grid(n, 256, 1 << 16), 256, 0, ab_cuda_stream(), x, y, n); return 0;
    case 2:
        AB_LAUNCH(copy_v2, ab_cuda_grid(n / 4, 256, 1 << 16), 256, 0, ab_cuda_stream(), (const float4 *)x, (float4 *)y,
                  n / 4);
        return 0;
    default:
        AB_CUDA_CHECK(cudaMemcpyAsync(y, x, sizeof(float) * n, cudaMemcpyDeviceToDevice, ab_cuda_stream()));
        return 0;
    }
}

int main(int argc, char **argv) {
    lab_opts o = lab_defaults(8, 8, 65536, 64, 64, 0);
    if (lab_parse(argc, argv, &o, "lab copy: device memory copy bandwidth (the memory floor)")) return 2;
    const long long n = (long long)o.B * o.H * o.N * o.D / 4 * 4;
    float *hx;
    float *x = lab_random((size_t)n, 1, 1.0f, &hx), *y = lab_zeros((size_t)n);
    std::vector<double> want(hx, hx + n);
    static const char *names[4] = {"", "float per thread", "float4 per thread", "cudaMemcpyAsync"};
    int failed = 0;
    for (int v = 1; v <= 3; v++) {
        if (!lab_wants(&o, v)) continue;
        LAB_CHECK(ab_cuda_memset(y, 0, sizeof(float) * n));
        LAB_CHECK(run(v, x, y, n));
        const double err = lab_max_err(y, want.data(), (size_t)n);
        const double ms = o.check_only ? -1 : lab_time_ms(o.reps, [&] { return run(v, x, y, n); });
        failed += lab_report(v, names[v], err, 0.0, ms, 0.0, 8.0 * n);
    }
    free(hx);
    ab_cuda_free(x);
    ab_cuda_free(y);
    return failed ? 1 : 0;
}
