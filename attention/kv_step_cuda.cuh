/* The key/value cache step of stateful-softmax on the device, split over the context
 * ("flash-decoding"): the kernel and its launcher, in a header so that the library
 * (kv_step_cuda.cu) and the kernel lab (attention/lab/decode_step.cu) run the same
 * code. Design, and why it should be fast on an H100, in kv_step_cuda.cu. C++ (CUDA)
 * only; include cuda_util.cuh first. */
#ifndef ATTN_KV_STEP_CUDA_CUH
#define ATTN_KV_STEP_CUDA_CUH

#include "cuda_util.cuh"

#include <stdint.h>


#define KV_THREADS 256     /* threads per block (8 warps; 128 was 1.2-1.5x slower on an H200 at contexts 1k-64k) */
#define KV_SPLIT_MIN 64    /* positions per split at least (unless the context is shorter) */
#define KV_SPLIT_MAX 2048  /* positions per split at most: the split's scores in shared memory */
#define KV_BLOCKS_PER_SM 4 /* blocks the automatic split count aims at, per multiprocessor */
#define KV_UNROLL 4        /* key groups a warp loads before it reduces them */

/* One step's problem. part: per slice, splits records of M + 2 floats (max, sum, the
 * unnormalised p V partial); count: one counter per slice (zero before and after). */
struct kv_step_args {
    const float *q, *k, *v; /* [S, D], [S, D], [S, M] */
    float *kc, *vc;         /* caches [S, cap, D], [S, cap, M] */
    float *out;             /* [S, M] */
    float *part;
    unsigned *count;
    long long n_slices, cap;
    int D, M, t;
    int split_len, splits; /* positions per split, ceil((t + 1) / split_len) splits */
    int lanes;             /* lanes per key in the score pass (a power of two <= 32) */
    float scale;
};

/* Shared memory of the kernel (floats): q (D rounded up to 4), the split's scores (or,
 * in the block that combines, the splits' weights), the row slots' partial outputs
 * (blockDim * VEC), and one int flag. */
static __host__ __device__ inline int kv_smem_floats(int D, int split_len, int splits, int threads, int vec) {
    const int Dp = (D + 3) & ~3;
    const int sc = ((split_len > splits ? split_len : splits) + 3) & ~3;
    return Dp + sc + threads * vec + 4;
}

template <int VEC> struct kv_vec;
template <> struct kv_vec<1> {
    typedef float type;
    static __device__ __forceinline__ float dot(const float *q, const float *k) { return q[0] * k[0]; }
};
template <> struct kv_vec<4> {
    typedef float4 type;
    static __device__ __forceinline__ float dot(const float *q, const float *k) {
        const float4 a = *reinterpret_cast<const float4 *>(q), b = *reinterpret_cast<const float4 *>(k);
        return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
    }
};

/* Grid: one block per (slice, split), grid-stride over them (flattened, split fastest).
 * Block: NT threads (KV_THREADS in the library; the lab tries others).
 *  1. the block whose split holds position t writes k_t, v_t into the caches;
 *  2. scores of the split's keys: `lanes` lanes per key (q in shared memory, VEC-wide
 *     loads of K, a shuffle sum over the lanes), KV_UNROLL keys in flight per lane group;
 *  3. the split's maximum m and sum l of exp(s - m), exp(s - m) in place;
 *  4. p V over the split: threads over VEC-wide column groups x row slots, the slots'
 *     partials added in slot order through shared memory;
 *  5. one split: out = (p V) / l. Several: the record (m, l, p V) into part, a fence, the
 *     slice's counter incremented; the block that brings it to `splits` combines the
 *     records in split order (weights exp(m_s - max m)) and writes out, then clears the
 *     counter for the next step. */
template <int VEC, int NT> static __global__ void __launch_bounds__(NT) kv_split_kernel(kv_step_args a) {
    AB_DYN_SMEM(float, smem);
    const int D = a.D, M = a.M, T = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nwarps = T >> 5, G = a.lanes, kpw = 32 / G, sub = lane / G, gl = lane % G;
    const int Dp = (D + 3) & ~3;
    const int sc_len = ((a.split_len > a.splits ? a.split_len : a.splits) + 3) & ~3;
    float *qs = smem, *sc = qs + Dp, *slot_part = sc + sc_len;
    int *flag = reinterpret_cast<int *>(slot_part + T * VEC);
    const int n = a.t + 1;
    const int cols = (M + VEC - 1) / VEC;       /* column groups of VEC floats */
    const int tpr = cols < T ? cols : T;         /* threads per row */
    const int slots = T / tpr, slot = tid / tpr, cg = tid % tpr;
    const int rec = M + 2;
    for (long long item = blockIdx.x; item < a.n_slices * a.splits; item += gridDim.x) {
        const long long bh = item / a.splits;
        const int sp = (int)(item % a.splits);
        const int j0 = sp * a.split_len, j1 = j0 + a.split_len < n ? j0 + a.split_len : n, len = j1 - j0;
        float *ks = a.kc + bh * a.cap * D, *vs = a.vc + bh * a.cap * M;
        if (j1 == n) { /* 1. this split holds position t */
            for (int d = tid; d < D; d += T) ks[(long long)a.t * D + d] = a.k[bh * D + d];
            for (int m = tid; m < M; m += T) vs[(long long)a.t * M + m] = a.v[bh * M + m];
        }
        for (int d = tid; d < D; d += T) qs[d] = a.q[bh * D + d];
        __syncthreads(); /* q staged; k_t, v_t visible to the block */
        /* 2. scores: lane group `sub` of warp `warp` takes keys base + u * stride + sub */
        const float *kbase = ks + (long long)j0 * D;
        const int stride = nwarps * kpw;
        float mx = -INFINITY;
        for (int base = warp * kpw; base < len; base += KV_UNROLL * stride) {
            float dot[KV_UNROLL];
AB_UNROLL
            for (int u = 0; u < KV_UNROLL; u++) {
                const int j = base + u * stride + sub;
                float acc = 0.0f;
                if (j < len) {
                    const float *kr = kbase + (long long)j * D;
                    for (int d = gl * VEC; d < D; d += G * VEC) acc += kv_vec<VEC>::dot(qs + d, kr + d);
                }
                dot[u] = acc;
            }
AB_UNROLL
            for (int u = 0; u < KV_UNROLL; u++) {
                float s = dot[u];
                for (int o = G >> 1; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                const int j = base + u * stride + sub;
                if (j < len && gl == 0) {
                    s *= a.scale;
                    sc[j] = s;
                    mx = fmaxf(mx, s);
                }
            }
        }
        /* 3. the split's softmax statistics (attn_block_max's barrier makes sc visible) */
        const float m = attn_block_max(mx);
        float l = 0.0f;
        for (int j = tid; j < len; j += T) {
            const float e = expf(sc[j] - m);
            sc[j] = e;
            l += e;
        }
        l = attn_block_sum(l); /* ends with a barrier: every probability is visible */
        /* 4. p V: slot `slot` adds rows slot, slot + slots, ... of its column group */
        const float *vbase = vs + (long long)j0 * M;
        float *rec_out = a.part + (bh * a.splits + sp) * rec;
        const float inv = 1.0f / l;
        for (int c0 = 0; c0 < cols; c0 += tpr) {
            const int c = c0 + cg;
            float acc[VEC];
AB_UNROLL
            for (int e = 0; e < VEC; e++) acc[e] = 0.0f;
            if (slot < slots && c < cols) {
AB_UNROLL_4
                for (int j = slot; j < len; j += slots) {
                    const float p = sc[j];
                    const float *vr = vbase + (long long)j * M + c * VEC;
                    if (VEC == 4) {
                        const float4 x = *reinterpret_cast<const float4 *>(vr);
                        acc[0] += p * x.x;
                        acc[VEC > 1 ? 1 : 0] += p * x.y;
                        acc[VEC > 2 ? 2 : 0] += p * x.z;
                        acc[VEC > 3 ? 3 : 0] += p * x.w;
                    } else {
                        acc[0] += p * vr[0];
                    }
                }
            }
            if (slot < slots)
AB_UNROLL
                for (int e = 0; e < VEC; e++) slot_part[(slot * tpr + cg) * VEC + e] = acc[e];
            __syncthreads();
            if (slot == 0 && c < cols) {
                for (int e = 0; e < VEC; e++) {
                    const int col = c * VEC + e;
                    if (col >= M) break;
                    float sum = 0.0f;
                    for (int s = 0; s < slots; s++) sum += slot_part[(s * tpr + cg) * VEC + e];
                    if (a.splits == 1) a.out[bh * M + col] = sum * inv;
                    else rec_out[2 + col] = sum;
                }
            }
            __syncthreads();
        }
        if (a.splits > 1) {
            /* 5. the record, then the slice's counter */
            if (tid == 0) {
                rec_out[0] = m;
                rec_out[1] = l;
            }
            __threadfence(); /* this thread's part of the record reaches the device before the count */
            __syncthreads();
            if (tid == 0) {
                const unsigned prev = atomicAdd(&a.count[bh], 1u);
                *flag = prev == (unsigned)a.splits - 1u;
                __threadfence(); /* the others' records are read after the count */
            }
            __syncthreads();
            if (*flag) {
                /* the last block of the slice: combine the records in split order
                 * (volatile: read from the device, never from a stale cache line) */
                volatile const float *P = a.part + bh * a.splits * rec;
                float gm = -INFINITY;
                for (int s = tid; s < a.splits; s += T) gm = fmaxf(gm, P[(long long)s * rec]);
                gm = attn_block_max(gm);
                float L = 0.0f;
                for (int s = tid; s < a.splits; s += T) {
                    const float w = expf(P[(long long)s * rec] - gm);
                    sc[s] = w;
                    L += w * P[(long long)s * rec + 1];
                }
                L = attn_block_sum(L); /* ends with a barrier: the weights are visible */
                const float invL = 1.0f / L;
                for (int col = tid; col < M; col += T) {
                    float acc = 0.0f;
                    for (int s = 0; s < a.splits; s++) acc += sc[s] * P[(long long)s * rec + 2 + col];
                    a.out[bh * M + col] = acc * invL;
                }
                if (tid == 0) a.count[bh] = 0u; /* ready for the next step */
            }
        }
        __syncthreads(); /* the next item reuses the shared memory */
    }
}

/* Lanes per key: the smallest power of two whose lanes cover a key row with one VEC-wide
 * load each, at most a warp. */
static inline int kv_lanes(int D, int vec) {
    const int need = (D + vec - 1) / vec;
    int g = 1;
    while (g < need && g < 32) g *= 2;
    return g;
}

template <int NT> static inline int kv_step_launch_nt(kv_step_args a) {
    const bool v4 = a.D % 4 == 0 && a.M % 4 == 0 && (uintptr_t)a.kc % 16 == 0 && (uintptr_t)a.vc % 16 == 0;
    const int vec = v4 ? 4 : 1;
    a.lanes = kv_lanes(a.D, vec);
    const size_t smem = (size_t)kv_smem_floats(a.D, a.split_len, a.splits, NT, vec) * sizeof(float);
    const unsigned grid = ab_cuda_grid(a.n_slices * a.splits, 1, AB_CUDA_MAX_GRID_X);
    auto *kv_split_kernel_t = v4 ? &kv_split_kernel<4, NT> : &kv_split_kernel<1, NT>;
    if (smem > 48 * 1024)
        AB_CUDA_CHECK(cudaFuncSetAttribute(kv_split_kernel_t, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    AB_LAUNCH(kv_split_kernel_t, grid, NT, smem, ab_cuda_stream(), a);
    return 0;
}

/* Launches the step (a.split_len and a.splits set by the caller; a.lanes here) with
 * blocks of `threads` threads: KV_THREADS in the library, 64 or 256 in the lab. */
static inline int kv_step_launch(kv_step_args a, int threads) {
    switch (threads) {
    case 64: return kv_step_launch_nt<64>(a);
    case 128: return kv_step_launch_nt<128>(a);
    case 256: return kv_step_launch_nt<256>(a);
    default: return ab_fail(AB_EINVAL, "kv step: %d threads per block (64, 128 or 256)", threads);
    }
}

#endif
