/* linear and polynomial attention on CUDA, with the options, contract and results of
 * the CPU version (linear.c): out_i = phi(q_i)^T S_i / (phi(q_i)^T Z_i + eps), where
 * S_i, Z_i sum phi(k_j) v_j^T, phi(k_j) over the allowed keys (j <= i when causal,
 * j < L otherwise; positions >= L are padding: never read, zero output and gradient).
 *
 * Two paths. The FUSED path (linear_chunk.cuh for elu, taylor and favor; poly_chunk.cuh
 * for polynomial) is taken wherever its shared tiles fit; the BATCHED path (cuBLAS
 * strided-batched GEMMs over chunks) serves the rest (feature
 * counts too large for the tiles, e.g. favor with thousands of features) and, with
 * lin_cuda_path = 1, the kernel lab's version 1 and the tests: it is in
 * linear_batched_cuda.cu, with its design.
 *
 * ==== The fused path (linear, D = M = 64 as the worked example) ====
 *
 * Shape of the work. A slice's L positions are cut into chunks of T rows and the chunks
 * into segments; one block of 256 threads (8 warps) owns a (slice, segment) and walks
 * its chunks carrying the state S [C x M] and z [C] in shared memory. Segments per slice:
 * min(chunks, max(1, floor(target / slices))), target = 2 blocks per multiprocessor (knob
 * lin_chunk_blocks; 264 on a 132-SM H100). A segment's entering state comes from
 * lc_state_kernel (its own sum phi(K)^T V, z) and lc_scan_kernel (exclusive prefix over
 * the segments, in double); with one segment per slice neither runs.
 *   B*H = 16, N = 4096, T = 32: 128 chunks per slice, 16 segments of 8 chunks: 256 blocks
 *   B*H = 16, N = 65536: 2048 chunks, 16 segments of 128 chunks: 256 blocks (a ceiling
 *   here made 17 segments, 272 blocks: a second wave of 8 blocks, slow on an H200)
 *   B*H = 8, N = 65536 (the B*N = 65536 sweep point): 33 segments of 63 chunks: 264 blocks
 * Per chunk (forward): load the q, k, v rows (float4), features into shared tiles
 * (Qf, Kf; no feature buffer in global memory), A = Qf Kf^T masked and O = Qf S, then
 * O += A V (k cut at the diagonal) and den = A 1 + Qf z, out = O / (den + eps), S += Kf^T V,
 * z += Kf^T 1: five barriers, every product a tile product (lc_mm: fp32 register tiles of
 * 4 x 4 with conflict-free shared loads, or tf32 wmma m16n16k8 with tiles above the
 * diagonal skipped). Backward pass 1 (lc_dq_kernel, chunks in order): O and den again,
 * 1/(den+eps) and (dout.out)/(den+eps) per position (kept: two floats per position), G,
 * dphiQ = G S^T - gd z^T + B Kf with B = (G V^T - gd) masked, dq through the map's
 * backward, and the segment's own R = Qf^T G; a suffix scan; pass 2 (lc_dkv_kernel,
 * chunks in reverse): dphiK = V R^T + r + B^T Qf, dV = Kf R + A^T G, dk.
 *
 * Chunk T = 32 (chunk option rounded up to 16..64; auto 32): the T x T products grow with
 * T (T (C + M) per position of the 2 C M of the state products) and the tiles must fit
 * shared memory; 32 keeps two backward blocks per multiprocessor.
 * Shared memory per block, T = 32 (fp32 / tf32; tf32 rows are padded to 16 bytes for
 * wmma, fp32 rows to an odd stride): elu and taylor forward 72 / 76 KB, pass 1 99 / 104 KB,
 * pass 2 91 / 95 KB: 3, 2, 2 blocks per H100 multiprocessor (228 KB); favor (C = 128)
 * 106 / 110, 168 / 175, 143 / 149 KB: 2, 1, 1. Registers (ptxas, sm_90, no spills): 48-66
 * forward and state kernels, 56-112 backward (taylor's tf32 pass 1 the most).
 *
 * Bytes per position and head, in units of one D = 64 row (256 bytes), against the
 * minimal 4 (q, k, v, out) forward and 8 (q, k, v, out, dout, dq, dk, dv) for both:
 *   forward: lc_state_kernel reads k, v (2; skipped with one segment), the forward
 *     kernel q, k, v and writes out (4); the segment states (C M + C floats, written,
 *     scanned, read: 4 passes) add 4 x 4168 / (segment length) floats: 0.25 rows at
 *     segments of 256 positions (N = 4096, B*H = 16), 0.03 at 2000 (N = 65536) -> 6.0-6.3
 *   backward: the state kernel again (2 + states), pass 1 q, k, v, dout, dq (5, + 2 floats
 *     of scalars), the R records (as the states), pass 2 q, k, v, dout, dk, dv (6, + the
 *     scalars) -> 13.1-13.6
 *   both: about 19.2-19.9 rows against 8: 2.4-2.5x the memory floor in bytes (with one
 *     segment per slice, no state kernels: 4 + 11 = 15, 1.9x).
 * Expected on an H100 (nothing timed here): forward+backward at B*N = 65536, H = 8
 * moves about 2.6 GB; in tf32 each chunk's tensor work (about 0.4 M multiply-adds
 * forward, 1.3 M backward, at ~50% of wmma's rate) is about as long as its loads, so the
 * kernels should run near the copy bandwidth with two or three blocks per SM overlapping
 * each other's loads: ~0.8-1.0 ms (the target: 3 x the floor = 0.75 ms on an H200), 9-12x
 * faster than the batched path's 9.3 ms. In fp32 the register tiles are bound by
 * shared-memory issue at about half the fp32 rate: 66 GFLOP of tile products at
 * ~25-30 TFLOP/s, ~2.5 ms; at PyTorch's B = 2, H = 8 shapes that is ~0.3 ms at N = 4096
 * (PyTorch 1.24 ms) and ~5 ms at N = 65536 (11.3 ms): under the 0.5x target.
 * Measured on an H200 (2026-11-27, experiments/sweep/RESULTS.md): far slower than that.
 * fp32 fwd+bwd 0.97 ms at B = 2, H = 8, N = 4096 and 14.5 ms at 65536 (PyTorch's chunked
 * form 2.07 and 11.3), tf32 0.79 and 11.7 ms; 3.4-4.5 TFLOP/s, 21-26x the memory floor.
 * The tiles are not what bounds it (2-3 us of products per chunk): each block spends
 * ~20-40 us per chunk, so the loads and barriers of the serial chunk loop are the next
 * thing to profile (prefetch of the next chunk's rows; fewer barriers).
 * favor: the projections add C D per row (3xtf32 on the tensor cores); its key shift is
 * the segments' largest key log-feature, found by the state kernel (the batched path's
 * pass over the keys with one block per slice was favor's N^1.56: favor_cuda.cu).
 *
 * What to try first with a GPU (attention/lab/linear_chunk.cu):
 *   build/attention/lab/lab_linear_chunk                     (B=8 H=8 N=8192 D=M=64, causal)
 *   build/attention/lab/lab_linear_chunk --shape 2,8,4096,64,64 --reps 50
 *   build/attention/lab/lab_linear_chunk --shape 1,8,65536,64,64 --causal 0
 *   LAB_MAP=favor build/attention/lab/lab_linear_chunk --version 3
 * Compare versions 2-3 (the defaults) with 4-8 (chunk 16 / 64, 128 threads, 4 or 1
 * blocks per SM) and with 1 (the batched path); then, under Nsight Compute, the DRAM
 * throughput of lc_dq_kernel and lc_dkv_kernel: if they are latency-bound (loads not
 * overlapping compute), prefetch; if fp32 is shared-memory bound, 4 x 8 micro-tiles
 * with 128 threads.
 * Prefetch is built, not yet timed: with lin_chunk_prefetch = 1 (lab versions 13, 14;
 * gpu-check's step lab-linear-chunk-prefetch) elu's four kernels fetch the next
 * chunk's rows into registers (lc_stage: two float4 per thread per tensor at T = 32,
 * D = M = 64, 256 threads) before working on the current chunk, so a chunk's loads are
 * in flight during the previous chunk's products instead of one trip to memory per
 * float4 at the chunk's start with the block waiting at a barrier (lc_load issues a
 * thread's loads one after the other: 6 trips a chunk forward, 8 in each backward
 * pass). Why this first: tf32 cut the products' share (~4x fewer instructions than
 * fp32's register tiles) but the H200's time a chunk only from 30 to 25 us (forward
 * with its state kernel, B = 8, H = 8, N = 8192, 64 chunks a block: lab/runs/h200/
 * 4-after.log), so most of a chunk is neither the products nor bandwidth.
 * Registers (ptxas, sm_90, no spills) go up to 96-128 (forward fp32 56 -> 128, dq 72 ->
 * 128, dkv 56 -> 128; tf32 forward 56 -> 96): two blocks of 256 threads per SM still
 * fit, the number the segments aim for. The results are the plain kernels' bit for bit
 * (test cuda_lchunk::prefetch_moves_the_same_values).
 *
 * ==== polynomial (poly_chunk.cuh) ====
 * The same blocks and passes; within a chunk A = (c + scale Q K^T)^2 directly (a T x T
 * product of q and k); the state lives in the block's global record and is streamed
 * through shared memory in slabs ([c, lin x], then scale x_a x_b for each a and b >= a
 * rounded down to 16: the quadratic features taken symmetric, weights on the query
 * side, 2640 rows at D = 64 instead of 1 + D + D^2 = 4161, 0.68 MB at M = 64), whose
 * feature tiles are formed from the q, k rows and dropped. Chunk 48 at D = M = 64 (the
 * backward's tiles; 191 KB), one block per multiprocessor aimed for. Its cost is the
 * state's streaming: 2 C M floats per chunk (the forward kernel; its state kernel as
 * much), 13 C M per chunk for forward and backward (state kernels 2 + 2, forward 2,
 * pass 1 5, pass 2 2): ~185 KB per position at T = 48, against 2 C M multiply-adds per
 * position per pass in products. In L2 where the live records fit (one per resident
 * block: ~90 MB at 132 blocks exceed an H100's 50 MB, so partly DRAM): expected 16-32 ms
 * forward+backward at B*N = 65536, H = 8 in tf32 (the batched path took 632-918 ms;
 * 15-30x linear's expected time, not the 10x asked). Measured on an H200 in fp32: 530 ms
 * at N = 65536, 73x linear's 7.2 ms. What would close the gap: larger chunks (the
 * streaming is per chunk: O kept in registers and the slab tiles per warp would allow
 * 128 rows), state updates batched over several chunks, fewer live records (so that
 * they stay in L2).
 *
 * Recurrent step: one fused kernel (linear_step_cuda.cu) updates S += phi(k) vaug^T,
 * forms Oaug = phi(q)^T S in the same pass over S and divides (the maps' own step
 * launchers, fm_cuda_map.step, are the earlier two-kernel step, which the kernel lab
 * keeps as its baseline); the state ends with the step's counters. Prefill is the
 * causal forward on the prompt with the running state kept in the recurrent state
 * itself (no token-by-token loop); the step is memory-bound: S (C (M+1) floats per
 * slice) read and written once. */
#include "linear_batched_cuda.cuh"
#include "linear_chunk.cuh"
#include "poly_chunk.cuh"

#include "linear_cuda.h"
#include "step_cuda.h"

extern "C" {
#include "favor.h"
}

#include <limits.h>
#include <math.h>

/* ---- the fused chunked kernels (linear_chunk.cuh) ---- */

int lin_cuda_path = 0;
long long lin_chunk_blocks = 0;
int lin_chunk_threads = 256;
int lin_chunk_prefetch = 0;

#define FUSED_AUTO_CHUNK 32
#define FUSED_MAX_CHUNK 64

/* The device's multiprocessors and opt-in shared memory per block (asked once). */
struct dev_limits {
    int sms;
    size_t smem;
};
static dev_limits device_limits(void) {
    static const dev_limits lim = [] {
        dev_limits l = {1, 48 * 1024};
        int dev = 0;
        cudaDeviceProp p;
        if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess) {
            l.sms = p.multiProcessorCount > 0 ? p.multiProcessorCount : 1;
            l.smem = p.sharedMemPerBlockOptin > l.smem ? p.sharedMemPerBlockOptin : l.smem;
        }
        cudaGetLastError(); /* a failed query is not the caller's error */
        return l;
    }();
    return lim;
}

/* Whether a call at shape s goes through the fused kernels (the map has them, the
 * shared tiles fit at some chunk of 16..64 rows, lin_cuda_path is not "batched"), and
 * its configuration. The chunk: the option rounded up to a multiple of 16 and at most
 * 64 (auto: 32), lowered by 16 until the tiles of the largest kernel fit. */
static bool fused_cfg(const attn *a, const attn_shape *s, lc_cfg *o) {
    if (lin_cuda_path == 1) return false;
    fm_spec sp;
    lin_feature_map(a, s->qk_dim, &sp);
    if (sp.kind == FM_ELU) o->map = LC_MAP_ELU;
    else if (sp.kind == FM_TAYLOR) o->map = LC_MAP_TAYLOR;
    else if (sp.kind == FM_FAVOR) o->map = LC_MAP_FAVOR;
    else return false;
    o->prec = a->p.precision == AB_PREC_TF32 ? LC_TF32 : LC_FP32;
    o->threads = lin_chunk_threads;
    o->prefetch = lin_chunk_prefetch;
    o->D = s->qk_dim, o->M = s->v_dim, o->C = sp.C;
    o->eps = a->p.eps;
    o->W = o->WT = NULL;
    const dev_limits lim = device_limits();
    o->target = lin_chunk_blocks > 0 ? lin_chunk_blocks : 2LL * lim.sms;
    int T = a->p.chunk > 0 ? lc_round16(a->p.chunk < FUSED_MAX_CHUNK ? a->p.chunk : FUSED_MAX_CHUNK) : FUSED_AUTO_CHUNK;
    for (; T >= 16; T -= 16) {
        o->T = T;
        if (lc_smem_bytes(*o, LC_K_DQ) <= lim.smem && lc_smem_bytes(*o, LC_K_DKV) <= lim.smem) return true;
    }
    return false;
}

/* The same for polynomial (poly_chunk.cuh): chunk auto 64, lowered until its backward's
 * tiles fit (48 at D = M = 64); one block per multiprocessor aimed for (each walks a
 * 1 MB state at D = M = 64 through L2). */
static bool poly_cfg(const attn *a, const attn_shape *s, lp_cfg *o) {
    if (lin_cuda_path == 1) return false;
    fm_spec sp;
    lin_feature_map(a, s->qk_dim, &sp);
    if (sp.kind != FM_POLY) return false;
    o->prec = a->p.precision == AB_PREC_TF32 ? LC_TF32 : LC_FP32;
    o->threads = lin_chunk_threads;
    o->D = s->qk_dim, o->M = s->v_dim;
    o->eps = a->p.eps;
    o->c = a->p.c;
    o->scale = attn_scale(a, s->qk_dim);
    const dev_limits lim = device_limits();
    o->target = lin_chunk_blocks > 0 ? lin_chunk_blocks : lim.sms;
    int T = a->p.chunk > 0 ? lc_round16(a->p.chunk < FUSED_MAX_CHUNK ? a->p.chunk : FUSED_MAX_CHUNK) : FUSED_MAX_CHUNK;
    for (; T >= 16; T -= 16) {
        o->T = T;
        if (lp_smem_bytes(*o, LC_K_DQ) <= lim.smem && lp_smem_bytes(*o, LC_K_DKV) <= lim.smem) return true;
    }
    return false;
}

/* Floats in front of the fused path's workspace: favor's padded projection W, WT. */
static size_t fused_front_floats(const lc_cfg &o) {
    if (o.map != LC_MAP_FAVOR) return 0;
    return 2 * (((size_t)lc_round16(o.C) * (size_t)lc_round16(o.D) + 63) / 64 * 64);
}

extern "C" size_t lin_cuda_workspace_bytes(const attn *a, const attn_shape *s) {
    lp_cfg po;
    if (poly_cfg(a, s, &po)) return lp_workspace_floats(po, (long long)s->batch * s->heads, s->len) * sizeof(float);
    lc_cfg o;
    if (!fused_cfg(a, s, &o)) return lin_batched_workspace_bytes(a, s);
    return (fused_front_floats(o) + lc_workspace_floats(o, (long long)s->batch * s->heads, s->len)) * sizeof(float);
}

/* favor's projection for the fused kernels: W drawn from the seed on the host (the CPU's
 * favor_draw), padded to Wp [Cp x Dp] and WTp [Dp x Cp], and copied (asynchronously) to
 * the front of the workspace. The host copies are kept in the host scratch under a tag
 * (seed, sizes and a hash of the padded arrays), so a call with the seed of the last
 * one skips the draw (m D normals and a Gram-Schmidt: about 0.5 ms on the host at D = 64,
 * m = 128, twice per training step otherwise). Sets o.W, o.WT; *ws moves past them. */
struct wtag {
    uint64_t magic, seed;
    int D, C;
    uint64_t hash;
};
#define WTAG_MAGIC 0x6c696e6368756e6bull

static uint64_t hash_floats(const float *x, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const uint32_t *w = (const uint32_t *)x;
    for (size_t i = 0; i < n; i++) h = (h ^ w[i]) * 1099511628211ull;
    return h;
}

static int fused_front(attn *a, lc_cfg &o, float **ws) {
    if (o.map != LC_MAP_FAVOR) return 0;
    const size_t n = (size_t)lc_round16(o.C) * (size_t)lc_round16(o.D), tb = 64;
    /* the raw W, then favor_draw's scratch of doubles: at an 8-byte boundary (C D may be odd) */
    const size_t raw = ((size_t)o.C * o.D * sizeof(float) + 7) / 8 * 8;
    AB_TRY(attn_host_ws_ensure(a, tb + 2 * n * sizeof(float) + raw + favor_draw_scratch(o.D)));
    wtag *tag = (wtag *)a->host_ws;
    float *Wp = (float *)((char *)a->host_ws + tb), *WTp = Wp + n, *Wraw = WTp + n;
    if (!(tag->magic == WTAG_MAGIC && tag->seed == a->seed && tag->D == o.D && tag->C == o.C &&
          tag->hash == hash_floats(Wp, 2 * n))) {
        favor_draw(a->seed, o.D, o.C, (char *)(Wraw) + raw, Wraw);
        lc_favor_pad(Wraw, o.C, o.D, Wp, WTp);
        *tag = wtag{WTAG_MAGIC, a->seed, o.D, o.C, hash_floats(Wp, 2 * n)};
    }
    float *dW = *ws, *dWT = dW + (n + 63) / 64 * 64;
    AB_CUDA_CHECK(cudaMemcpyAsync(dW, Wp, n * sizeof(float), cudaMemcpyHostToDevice, ab_cuda_stream()));
    AB_CUDA_CHECK(cudaMemcpyAsync(dWT, WTp, n * sizeof(float), cudaMemcpyHostToDevice, ab_cuda_stream()));
    o.W = dW, o.WT = dWT;
    *ws += fused_front_floats(o);
    return 0;
}

/* ---- entry points ---- */


extern "C" int lin_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                float *out, void *saved) {
    (void)saved;
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const long long ND = (long long)N * D, NM = (long long)N * M;
    lp_cfg po;
    if (poly_cfg(a, s, &po))
        return attn_cuda_runs(s, {{out, M, false}}, [&](long long s0, long long ns, int L) {
            return lp_forward(po, (float *)a->ws, ns, N, L, s->causal, q + s0 * ND, k + s0 * ND, v + s0 * NM,
                              out + s0 * NM, NULL);
        });
    lc_cfg o;
    if (fused_cfg(a, s, &o)) {
        float *ws = (float *)a->ws;
        AB_TRY(fused_front(a, o, &ws));
        return attn_cuda_runs(s, {{out, M, false}}, [&](long long s0, long long ns, int L) {
            return lc_forward(o, ws, ns, N, L, s->causal, q + s0 * ND, k + s0 * ND, v + s0 * NM, out + s0 * NM, NULL,
                              NULL);
        });
    }
    return lin_batched_forward(a, s, q, k, v, out);
}

extern "C" int lin_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                                 const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    (void)saved;
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const long long ND = (long long)N * D, NM = (long long)N * M;
    lp_cfg po;
    if (poly_cfg(a, s, &po))
        return attn_cuda_runs(s, {{dq, D, false}, {dk, D, false}, {dv, M, false}},
                              [&](long long s0, long long ns, int L) {
                                  return lp_backward(po, (float *)a->ws, ns, N, L, s->causal, q + s0 * ND,
                                                     k + s0 * ND, v + s0 * NM, dout + s0 * NM, dq + s0 * ND,
                                                     dk + s0 * ND, dv + s0 * NM);
                              });
    lc_cfg o;
    if (fused_cfg(a, s, &o)) {
        float *ws = (float *)a->ws;
        AB_TRY(fused_front(a, o, &ws));
        return attn_cuda_runs(s, {{dq, D, false}, {dk, D, false}, {dv, M, false}},
                              [&](long long s0, long long ns, int L) {
                                  return lc_backward(o, ws, ns, N, L, s->causal, q + s0 * ND, k + s0 * ND,
                                                     v + s0 * NM, dout + s0 * NM, dq + s0 * ND, dk + s0 * ND,
                                                     dv + s0 * NM);
                              });
    }
    return lin_batched_backward(a, s, q, k, v, dout, dq, dk, dv);
}

/* ---- recurrent mode ---- */

static size_t state_floats(const lin_cfg &c, const attn_shape *s) {
    return (size_t)s->batch * (size_t)s->heads * (size_t)c.C * (size_t)c.M1;
}

/* The CPU's layout (lin_state_layout), then the fused step's counters, one per slice
 * (linear_step_cuda.cu). */
static size_t counters_offset(const attn *a, const attn_shape *s) {
    size_t c_off, w_off, total;
    lin_state_layout(a, s, &c_off, &w_off, &total);
    return lin_step_counter_offset(total);
}

extern "C" size_t lin_cuda_state_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)capacity;
    return counters_offset(a, s) + lin_step_counter_bytes((long long)s->batch * s->heads);
}

/* Clears S and the step's counters; a log-scaled map's key shifts and W are set at the
 * first position. */
extern "C" int lin_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    (void)capacity;
    lin_cfg c;
    lin_cfg_make(a, s, &c);
    AB_CUDA_CHECK(cudaMemsetAsync(state, 0, state_floats(c, s) * sizeof(float), ab_cuda_stream()));
    AB_CUDA_CHECK(cudaMemsetAsync((char *)state + counters_offset(a, s), 0,
                                  lin_step_counter_bytes((long long)s->batch * s->heads), ab_cuda_stream()));
    return 0;
}

extern "C" size_t lin_cuda_step_workspace_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)capacity;
    fm_spec sp;
    lin_feature_map(a, s->qk_dim, &sp);
    return lin_step_workspace_bytes((long long)s->batch * s->heads, sp.C, s->qk_dim, s->v_dim, sp.kind == FM_FAVOR);
}

/* favor: the state's own W and WT (lin_state_layout), drawn with the seed the attention
 * has at the state's first position; c.f then points at them. */
static int state_projection(attn *a, const attn_shape *s, lin_cfg &c, void *state, bool draw, float **kls) {
    size_t c_off, w_off, total;
    lin_state_layout(a, s, &c_off, &w_off, &total);
    *kls = (float *)((char *)state + c_off);
    float *W = (float *)((char *)state + w_off);
    float *WT = (float *)((char *)W + ((size_t)c.C * c.D * sizeof(float) + 63) / 64 * 64); /* 64-byte aligned */
    if (draw) return lin_draw_projection(a, c, W, WT);
    c.f.W = W;
    c.f.WT = WT;
    return 0;
}

extern "C" int lin_cuda_prefill(attn *a, const attn_shape *s, int capacity, int P, const float *q, const float *k,
                                const float *v, float *out, void *state) {
    (void)capacity;
    attn_shape ps = *s;
    ps.len = P;
    lin_cfg c;
    lin_cfg_make(a, &ps, &c);
    float *kls = NULL;
    if (c.scaled) AB_TRY(state_projection(a, s, c, state, true, &kls));
    lp_cfg po;
    if (poly_cfg(a, &ps, &po))
        return lp_forward(po, (float *)a->ws, (long long)s->batch * s->heads, P, P, true, q, k, v, out, (float *)state);
    lc_cfg o;
    if (fused_cfg(a, &ps, &o)) {
        /* the causal forward's segment scan writes the final Saug (and favor's key shift)
         * into the state; the outputs when asked for */
        float *ws = (float *)a->ws;
        AB_TRY(fused_front(a, o, &ws));
        return lc_forward(o, ws, (long long)s->batch * s->heads, P, P, true, q, k, v, out, (float *)state, kls);
    }
    /* The state is empty here; cleared again so the prefill never builds on stale sums. */
    AB_CUDA_CHECK(cudaMemsetAsync(state, 0, state_floats(c, s) * sizeof(float), ab_cuda_stream()));
    return lin_batched_prefill(a, c, (long long)s->batch * s->heads, P, q, k, v, out, (float *)state, kls);
}

extern "C" int lin_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q,
                             const float *k, const float *v, float *out) {
    (void)capacity;
    lin_cfg c;
    lin_cfg_make(a, s, &c);
    float *kls = NULL;
    if (c.scaled) AB_TRY(state_projection(a, s, c, state, t == 0, &kls));
    fm_step_args args;
    args.f = c.f;
    args.S = (float *)state;
    args.shift = kls;
    args.q = q, args.k = k, args.v = v;
    args.out = out;
    args.ws = (float *)a->ws;
    args.n_slices = (long long)s->batch * s->heads;
    args.M = c.M;
    args.t = t;
    args.eps = c.eps;
    fm_spec sp;
    lin_feature_map(a, s->qk_dim, &sp);
    return lin_step_cuda(args, sp.kind, (unsigned *)((char *)state + counters_offset(a, s)), a->ws_bytes);
}
