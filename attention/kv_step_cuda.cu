/* The key/value cache step of stateful-softmax on CUDA, split over the context
 * ("flash-decoding"). The kernel is kv_step_cuda.cuh (shared with the kernel lab);
 * this file holds the split policy, the device's multiprocessor count and the entry
 * point stateful_softmax_cuda.cu calls.
 *
 * Problem: one new position for each of S = B*H slices; the context is n = t + 1
 * positions of K (D floats) and V (M floats) per slice. The step must read the cache
 * once: (D + M) * 4 * n * S bytes, e.g. 268 MB at B = 1, H = 8, D = M = 64, n = 64k.
 * That is all the step costs once the GPU is full: 80 us at an H100's 3.35 TB/s,
 * 56 us at an H200's 4.8 TB/s. The earlier kernel (one block per slice: 8 blocks on
 * 132 multiprocessors) took 9.16 ms there on an H200 (29 GB/s): the device was idle.
 *
 * Design:
 * - grid: S x splits blocks (flattened, grid-stride), each split a contiguous range of
 *   cache positions. splits = enough for S * splits >= KV_BLOCKS_PER_SM (4) x the
 *   multiprocessors (queried once: attn_cuda_sm_count), splits of KV_SPLIT_MIN (64) to
 *   KV_SPLIT_MAX (2048) positions. At S = 8 on 132 SMs: 66 splits of 993 positions at
 *   64k; 16 splits of 64 at 1k. With S >= 528 (B = 66 images of 8 heads) one split per
 *   slice: no partials, no combine.
 * - block: KV_THREADS = 256 threads (8 warps; the lab on an H200 at B = 1, H = 8:
 *   128 threads took 1.0-1.5x as long at contexts 1k-64k, 64 threads 1.2-2.7x). Scores: `lanes` lanes per key (16 at
 *   D = 64: 2 keys per warp per load, each lane one float4 of the row: 512 contiguous
 *   bytes per warp instruction), q in shared memory, 4 key groups loaded before their
 *   shuffle sums (8 independent 16-byte loads in flight per lane across the loop's
 *   unroll); the split's scores in shared memory (at most 8 KB). Then the split's max
 *   and sum (block reductions), p V with each thread owning one float4 of columns and
 *   a row slot (M = 64: 16 threads per row, 16 slots), the slots added through shared
 *   memory in slot order. Shared memory: (D + split + 4 * 256 + 4) floats, <= 12 KB at
 *   D = 64; registers: 72 per thread (ptxas, sm_90, float4 path), so 3 blocks of 256
 *   threads per SM and ~49 KB of loads in flight per SM (4 float4 per thread), above
 *   the ~20 KB per SM that Little's law asks for 3.35 TB/s at ~800 ns of latency.
 * - combine: the last block of a slice to finish (an atomic counter per slice, kept in
 *   the state after the caches, zero between steps) rescales and sums the splits'
 *   records (m, l, p V) in split order, so the result does not depend on which block
 *   finishes last. Chosen over a second kernel: one launch per step instead of two
 *   (a launch and the gap between two kernels is 2-4 us, which is the whole step at
 *   1k), and the records (splits x (M + 2) floats per slice, 17 KB at 64k) are read
 *   once from L2 by one block per slice. The counter lives in the state, not the
 *   workspace, because prefill and forward reuse the workspace between steps.
 * - the write of k_t, v_t into the cache is fused: the block whose split holds t writes
 *   them before it reads (a barrier orders them); the other blocks never touch row t.
 *   Each cache byte is read once per step, row t included.
 *
 * Expected on an H100 (estimates, nothing timed: there was no GPU): the step is one
 * launch, ~3-5 us at 1k-4k (launch latency and the combine's second round trip), and
 * within ~1.2x of cache bytes / bandwidth from 16k on: ~25 us at 16k and ~85 us at 64k
 * (H200: ~18 and ~60 us), against PyTorch's 105 and 293 us measured on the H200.
 * Measured on an H200 (2026-11-27, B = 1, H = 8, D = M = 64, 256 threads): the kernel
 * 15.7, 39 and 101 us at 1k, 16k and 64k (lab), 2.7 TB/s of the cache at 64k; as
 * `bench` times a step, 20-102 us, 0.16-0.33x PyTorch's.
 * What was tried first on a GPU (attention/lab/decode_step.cu): the automatic split count
 * against fixed ones (--split), 128 vs 256 threads, and KV_BLOCKS_PER_SM 2..8; at short
 * contexts whether the combine's atomic costs more than it saves.
 *
 * Numerics: float scores and sums as the earlier kernel; the combine's weights
 * exp(m_s - max m) <= 1, so no overflow; the result differs from one split's by float
 * rounding only (tests/attention/test_cuda_step.c measures it). */
#include "kv_step_cuda.cuh"

#include "step_cuda.h"

int kv_step_split_len_override = 0;

extern "C" int attn_cuda_sm_count(void) {
    static int sms = 0; /* the device does not change during a run */
    if (sms > 0) return sms;
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess || p.multiProcessorCount < 1) {
        (void)cudaGetLastError(); /* no device: the step then fails on its own call */
        return 1;
    }
    sms = p.multiProcessorCount;
    return sms;
}

static long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

extern "C" int kv_step_split_len(long long n_slices, int n, int sms, int override) {
    if (n < 1) n = 1;
    if (override > 0) return override < KV_SPLIT_MAX ? override : KV_SPLIT_MAX;
    const long long target = (long long)KV_BLOCKS_PER_SM * (sms > 0 ? sms : 1);
    const long long want = n_slices >= target ? 1 : ceil_div(target, n_slices); /* splits per slice */
    long long len = ceil_div(n, want);
    if (len < KV_SPLIT_MIN) len = KV_SPLIT_MIN;
    if (len > KV_SPLIT_MAX) len = KV_SPLIT_MAX;
    return (int)len;
}

extern "C" int kv_step_max_splits(long long n_slices, int capacity, int sms, int override) {
    if (capacity < 1) capacity = 1;
    if (override > 0) return (int)ceil_div(capacity, kv_step_split_len(n_slices, capacity, sms, override));
    /* splits = ceil(n / len(n)) <= the splits wanted per slice while len is set by
     * them or by KV_SPLIT_MIN, and ceil(capacity / KV_SPLIT_MAX) where KV_SPLIT_MAX caps
     * len: the larger of the two bounds every context up to capacity */
    const long long target = (long long)KV_BLOCKS_PER_SM * (sms > 0 ? sms : 1);
    long long want = n_slices >= target ? 1 : ceil_div(target, n_slices);
    const long long by_min = ceil_div(capacity, KV_SPLIT_MIN), by_max = ceil_div(capacity, KV_SPLIT_MAX);
    if (want > by_min) want = by_min;
    return (int)(want > by_max ? want : by_max);
}

extern "C" size_t kv_step_workspace_bytes(long long n_slices, int capacity, int M) {
    const int splits = kv_step_max_splits(n_slices, capacity, attn_cuda_sm_count(), kv_step_split_len_override);
    if (splits <= 1) return 0;
    return (size_t)n_slices * (size_t)splits * ((size_t)M + 2) * sizeof(float);
}

extern "C" size_t kv_step_counter_bytes(long long n_slices) {
    return ((size_t)n_slices * sizeof(unsigned) + 255u) & ~(size_t)255u;
}

extern "C" int kv_step_cuda(const float *q, const float *k, const float *v, float *kc, float *vc, float *out, void *ws,
                            size_t ws_bytes, unsigned *counters, long long n_slices, int capacity, int t, int D, int M,
                            float scale) {
    kv_step_args a;
    a.q = q, a.k = k, a.v = v, a.kc = kc, a.vc = vc, a.out = out;
    a.part = (float *)ws;
    a.count = counters;
    a.n_slices = n_slices;
    a.cap = capacity;
    a.D = D, a.M = M, a.t = t;
    a.scale = scale;
    a.lanes = 1;
    const int n = t + 1;
    a.split_len = kv_step_split_len(n_slices, n, attn_cuda_sm_count(), kv_step_split_len_override);
    a.splits = (int)ceil_div(n, a.split_len);
    if (a.splits > 1) {
        const size_t need = (size_t)n_slices * (size_t)a.splits * ((size_t)M + 2) * sizeof(float);
        if (!ws || ws_bytes < need)
            return ab_fail(AB_EINVAL, "stateful-softmax step: %d splits need %zu bytes of workspace, it has %zu",
                           a.splits, need, ws_bytes);
    }
    return kv_step_launch(a, KV_THREADS);
}
