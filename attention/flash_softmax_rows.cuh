/* The fused softmax kernels' generic form: a warp per row, any D and M (the fallback
 * above 128, and the kernel lab's naive version; flash_softmax.cuh). C++ (CUDA). */
#ifndef ATTN_FLASH_SOFTMAX_ROWS_CUH
#define ATTN_FLASH_SOFTMAX_ROWS_CUH

#include "flash_softmax_tiles.cuh"

/* ---- generic: a warp per row, any D and M ----
 *
 * The row's vectors live in shared memory, each lane its elements c = lane + 32 t (so
 * no lane reads another's: no barrier); dot products are warp sums. Shared per warp:
 * 2 (D + M) floats (fl_rows_smem). */
static __host__ __device__ __forceinline__ size_t fl_rows_warp_floats(int D, int M) { return (size_t)2 * ((size_t)D + (size_t)M); }

static __global__ void fl_fwd_rows(flash_args a) {
    AB_DYN_SMEM(float, sm);
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5, D = a.D, M = a.M;
    float *qv = sm + (threadIdx.x >> 5) * fl_rows_warp_floats(D, M), *ov = qv + D;
    const long long rows = a.n_slices * a.L;
    for (long long r = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += (long long)gridDim.x * wpb) {
        const long long sl = r / a.L;
        const int i = (int)(r - sl * a.L);
        const float *qr = a.q + sl * a.sq + (long long)i * D, *kg = a.k + sl * a.sk, *vg = a.v + sl * a.sv;
        for (int c = lane; c < D; c += 32) qv[c] = qr[c];
        for (int c = lane; c < M; c += 32) ov[c] = 0.0f;
        int kb, ke;
        fl_keys_of(a, i, i + 1, &kb, &ke); /* every key of the range is valid for row i */
        float m = -INFINITY, l = 0.0f;
        for (int j = kb; j < ke; j++) {
            const float *kr = kg + (long long)j * D, *vr = vg + (long long)j * M;
            float s = 0.0f;
            for (int c = lane; c < D; c += 32) s = fmaf(qv[c], kr[c], s);
            s = fl_warp_sum(s) * a.cl;
            const float mn = fmaxf(m, s), al = exp2f(m - mn), p = exp2f(s - mn);
            l = l * al + p;
            m = mn;
            for (int c = lane; c < M; c += 32) ov[c] = fmaf(p, vr[c], ov[c] * al);
        }
        const float inv = 1.0f / l;
        float *orow = a.o + sl * a.so + (long long)i * M;
        for (int c = lane; c < M; c += 32) orow[c] = ov[c] * inv;
        if (a.o2)
            for (int c = lane; c < M; c += 32) a.o2[sl * a.so + (long long)i * M + c] = ov[c] * inv;
        if (a.lse && lane == 0) a.lse[sl * a.sl + i] = m + log2f(l);
    }
}

static __global__ void fl_bwd_dkdv_rows(flash_args a) {
    AB_DYN_SMEM(float, sm);
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5, D = a.D, M = a.M;
    float *kv = sm + (threadIdx.x >> 5) * fl_rows_warp_floats(D, M), *vv = kv + D, *dk = vv + M, *dv = dk + D;
    const long long rows = a.n_slices * a.L;
    for (long long r = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += (long long)gridDim.x * wpb) {
        const long long sl = r / a.L;
        const int j = (int)(r - sl * a.L);
        const float *kr = a.k + sl * a.sk + (long long)j * D, *vr = a.v + sl * a.sv + (long long)j * M;
        for (int c = lane; c < D; c += 32) kv[c] = kr[c], dk[c] = 0.0f;
        for (int c = lane; c < M; c += 32) vv[c] = vr[c], dv[c] = 0.0f;
        int ib, ie;
        fl_queries_of(a, j, j + 1, &ib, &ie); /* every query of the range sees key j */
        for (int i = ib; i < ie; i++) {
            const float *qr = a.q + sl * a.sq + (long long)i * D, *gr = a.dout + sl * a.so + (long long)i * M;
            float s = 0.0f, dp = 0.0f;
            for (int c = lane; c < D; c += 32) s = fmaf(qr[c], kv[c], s);
            for (int c = lane; c < M; c += 32) dp = fmaf(gr[c], vv[c], dp);
            s = fl_warp_sum(s);
            dp = fl_warp_sum(dp);
            const float p = exp2f(s * a.cl - a.lse[sl * a.sl + i]), ds = p * (dp - a.delta[sl * a.sl + i]);
            for (int c = lane; c < M; c += 32) dv[c] = fmaf(p, gr[c], dv[c]);
            for (int c = lane; c < D; c += 32) dk[c] = fmaf(ds, qr[c], dk[c]);
        }
        float *dkr = a.dk + sl * a.sk + (long long)j * D, *dvr = a.dv + sl * a.sv + (long long)j * M;
        for (int c = lane; c < D; c += 32) dkr[c] = dk[c] * a.scale;
        for (int c = lane; c < M; c += 32) dvr[c] = dv[c];
    }
}

static __global__ void fl_bwd_dq_rows(flash_args a) {
    AB_DYN_SMEM(float, sm);
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5, D = a.D, M = a.M;
    float *qv = sm + (threadIdx.x >> 5) * fl_rows_warp_floats(D, M), *gv = qv + D, *dq = gv + M;
    const long long rows = a.n_slices * a.L;
    for (long long r = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += (long long)gridDim.x * wpb) {
        const long long sl = r / a.L;
        const int i = (int)(r - sl * a.L);
        const float *qr = a.q + sl * a.sq + (long long)i * D, *gr = a.dout + sl * a.so + (long long)i * M;
        const float *kg = a.k + sl * a.sk, *vg = a.v + sl * a.sv;
        for (int c = lane; c < D; c += 32) qv[c] = qr[c], dq[c] = 0.0f;
        for (int c = lane; c < M; c += 32) gv[c] = gr[c];
        const float lse = a.lse[sl * a.sl + i], del = a.delta[sl * a.sl + i];
        int kb, ke;
        fl_keys_of(a, i, i + 1, &kb, &ke);
        for (int j = kb; j < ke; j++) {
            const float *kr = kg + (long long)j * D, *vr = vg + (long long)j * M;
            float s = 0.0f, dp = 0.0f;
            for (int c = lane; c < D; c += 32) s = fmaf(qv[c], kr[c], s);
            for (int c = lane; c < M; c += 32) dp = fmaf(gv[c], vr[c], dp);
            s = fl_warp_sum(s);
            dp = fl_warp_sum(dp);
            const float p = exp2f(s * a.cl - lse), ds = p * (dp - del);
            for (int c = lane; c < D; c += 32) dq[c] = fmaf(ds, kr[c], dq[c]);
        }
        float *dqr = a.dq + sl * a.sq + (long long)i * D;
        for (int c = lane; c < D; c += 32) dqr[c] = dq[c] * a.scale;
    }
}

#endif
