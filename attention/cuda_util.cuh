/* Internal: what the CUDA variants (attention/<variant>_cuda.cu) share: block reductions,
 * runs of equal valid lengths, and small copy / zero kernels. C++ (CUDA) only.
 *
 * Conventions of the CUDA backends (see also harness/cuda_compat.h):
 * - every host function returns 0 or an error code and checks every runtime call,
 *   cuBLAS call and launch (AB_CUDA_CHECK, AB_CUBLAS_CHECK, AB_LAUNCH, AB_TRY);
 * - all work goes on ab_cuda_stream(); nothing synchronises inside forward, backward or
 *   step (the caller does, with ab_cuda_sync, when it needs the results on the host);
 * - indices that can exceed 2^31 (elements of a tensor, rows times slices) are long
 *   long; grids loop (grid-stride) so no size is limited by grid dimensions;
 * - nothing is allocated inside a call: workspace comes from a->ws (device memory,
 *   sized by the backend's workspace_bytes / step_workspace_bytes); a recurrent state's
 *   memory comes from the registry (state_bytes, device memory);
 * - lengths stay in host memory (attn_shape): loop over attn_run_at's runs
 *   (attn_cuda_runs) and pass the run's length to the kernels as a number; padded rows
 *   of outputs and gradients are set to zero (attn_cuda_runs' `zero`, or
 *   attn_cuda_zero_tail), padded inputs are never read;
 * - matrix products go through ab_cuda_sgemm / ab_cuda_sgemm_batched (row-major);
 * - meson 1.0 writes no dependency files for nvcc's objects: after editing a header,
 *   `bash harness/scripts/build.sh` rebuilds them (it touches the .cu files when a
 *   header is newer than the library), a bare `ninja -C build` does not.
 *
 * Adding a variant's CUDA backend:
 * 1. attention/<variant>_cuda.h: extern "C" declarations of the backend functions (the
 *    attn_backend signatures of variant.h); attention/<variant>_cuda.cu: their
 *    definitions, including cuda_util.cuh first.
 * 2. meson.build: add the .cu path to `cuda_sources` (the real and the emulated library
 *    both take it from there).
 * 3. <variant>.c: under #ifdef ATTNBENCH_HAVE_CUDA, a static const attn_backend table of
 *    those functions (check_shape and saved_bytes may be the CPU's), and `.cuda = ` it
 *    in the attn_variant (NULL otherwise), as softmax.c does.
 * 4. tests/attention/test_cuda.c: its cases in CUDA_VARIANTS; the suite then compares it with the
 *    CPU on every shape (forward, backward, steps and prefill when it has them), on the
 *    emulator in every build and on a GPU where there is one. */
#ifndef ATTN_CUDA_UTIL_CUH
#define ATTN_CUDA_UTIL_CUH

#include "../harness/cuda_compat.h"
#include "variant.h"

#include <math.h>
#include <initializer_list>

/* Loop unrolling hints for nvcc (g++ of the emulated build does not know the pragma). */
#ifdef AB_CUDA_EMU
#define AB_UNROLL
#define AB_UNROLL_4
#else
#define AB_UNROLL _Pragma("unroll")
#define AB_UNROLL_4 _Pragma("unroll 4")
#endif

/* ---- reductions (1-D blocks whose size is a multiple of 32; every thread calls) ---- */

__device__ __forceinline__ float attn_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float attn_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum (is_max false) or maximum over the block; every thread gets the result. Ends
 * with a barrier, so calls may follow each other. */
__device__ inline float attn_block_reduce(float v, bool is_max) {
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float identity = is_max ? -INFINITY : 0.0f;
    v = is_max ? attn_warp_max(v) : attn_warp_sum(v);
    if (lane == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? red[lane] : identity;
        v = is_max ? attn_warp_max(v) : attn_warp_sum(v);
        if (lane == 0) red[0] = v;
    }
    __syncthreads();
    v = red[0];
    __syncthreads();
    return v;
}

__device__ __forceinline__ float attn_block_sum(float v) { return attn_block_reduce(v, false); }
__device__ __forceinline__ float attn_block_max(float v) { return attn_block_reduce(v, true); }

/* ---- runs of batch entries with the same valid length ---- */

/* Batch entries [b0, b1) all have valid length len; their slices are the contiguous
 * range [b0 * H, b1 * H). Without lengths there is one run: all of B at length N.
 * Loop: for (int b = 0; b < B; ) { attn_run r = attn_run_at(s, b); ...; b = r.b1; } */
typedef struct {
    int b0, b1, len;
} attn_run;

static inline attn_run attn_run_at(const attn_shape *s, int b0) {
    attn_run r = {b0, s->batch, s->len};
    if (s->lengths) {
        r.len = s->lengths[b0];
        r.b1 = b0 + 1;
        while (r.b1 < s->batch && s->lengths[r.b1] == r.len) r.b1++;
    }
    return r;
}

/* ---- small kernels (cuda_util.cu) ---- */

/* Sets elements [start, slice_elems) of each of n_slices consecutive slices of
 * slice_elems floats to zero (e.g. the padded rows L..N-1 of every slice:
 * start = L * X, slice_elems = N * X). Queued on the library's stream. */
int attn_cuda_zero_tail(float *x, long long n_slices, long long slice_elems, long long start);

/* For each of n_slices slices: copies `elems` floats from src + i * src_stride to
 * dst + i * dst_stride (e.g. appending rows to a key/value cache). */
int attn_cuda_copy_slices(float *dst, long long dst_stride, const float *src, long long src_stride,
                          long long n_slices, long long elems);

/* ---- the loop over runs that every backend's forward and backward makes ---- */

/* A tensor of N rows of `width` floats per slice whose rows a run leaves unwritten:
 * rows L..N-1 of each of the run's slices, or all N rows (`all`: a backward that
 * accumulates into it). */
struct attn_zero_rows {
    float *x;
    int width;
    bool all;
};

/* For each run of attn_run_at: the rows of `zero` it leaves unwritten set to zero, then,
 * when its length L > 0, fn(s0, ns, L) with the run's slices [s0, s0 + ns) (fn returns
 * 0 or an error code, which stops the loop and is returned). */
template <class F>
static inline int attn_cuda_runs(const attn_shape *s, std::initializer_list<attn_zero_rows> zero, F &&fn) {
    const long long N = s->len;
    for (int b = 0; b < s->batch;) {
        const attn_run r = attn_run_at(s, b);
        b = r.b1;
        const long long s0 = (long long)r.b0 * s->heads, ns = (long long)(r.b1 - r.b0) * s->heads;
        for (const attn_zero_rows &z : zero)
            AB_TRY(attn_cuda_zero_tail(z.x + s0 * N * z.width, ns, N * z.width, z.all ? 0 : (long long)r.len * z.width));
        if (r.len > 0) AB_TRY(fn(s0, ns, r.len));
    }
    return 0;
}


#endif
