/* The fused softmax attention kernels (forward and backward), shared by the library
 * (attention/flash_softmax.cu, whose header comment has the design, the sizes and the
 * performance notes) and the kernel lab (attention/lab/flash_softmax.cu), so the lab
 * measures the code that ships. C++ (CUDA); include after harness/cuda_compat.h.
 *
 * Kernels (every one takes a flash_args, attention/flash_softmax.h):
 *   fl_fwd_simt<TR, G>        fp32 forward: 16 TR query rows x 64 keys per step, 256
 *                             threads as 16 x 16, a thread TR rows x 4 keys of S and TR
 *                             rows x 4 G columns of O in registers; online softmax.
 *   fl_delta                  backward's delta_i = dO_i . O_i (a warp per row).
 *   fl_bwd_dkdv_simt<G, A>    fp32: a block per 64 keys, dK and dV in registers across
 *                             the query tiles (A: also dQ by atomics, the lab's variant).
 *   fl_bwd_dq_simt<G>         fp32: a block per 64 queries, dQ in registers across the
 *                             key tiles (the deterministic second pass).
 *   fl_fwd_wmma<G>, fl_bwd_dkdv_wmma<G>, fl_bwd_dq_wmma<G>
 *                             the same with the products on the tensor cores (TF32
 *                             m16n16k8), S and P through shared memory (the fragment
 *                             layout is unspecified: every per-row or per-column step
 *                             reads and writes shared memory, never fragment elements).
 *   fl_fwd_rows, fl_bwd_dkdv_rows, fl_bwd_dq_rows
 *                             generic: a warp per row, any D and M (the fallback above
 *                             128, and the lab's naive version).
 * G is the number of 64-column groups of the head dims (D, M <= 64 G; G = 1 or 2).
 * The launchers fl_run_* (bottom) size the shared memory, raise the limit above 48 KiB
 * (checked) and launch on the library's stream (checked).
 *
 * The kernels live in flash_softmax_tiles.cuh (tile sizes, geometry, masks, moves of
 * tiles), flash_softmax_simt.cuh (fp32), flash_softmax_wmma.cuh (TF32) and
 * flash_softmax_rows.cuh (a warp per row); this file holds the launchers. */
#ifndef ATTN_FLASH_SOFTMAX_CUH
#define ATTN_FLASH_SOFTMAX_CUH

#include "flash_softmax_rows.cuh"
#include "flash_softmax_simt.cuh"
#include "flash_softmax_wmma.cuh"

/* ---- launchers (grid: x = slices, y = tiles of the slice; both loop past the limits) ---- */

template <class K>
static inline int fl_launch(K *kernel, long long tiles, int threads, size_t smem, const flash_args &a) {
    if (smem > 48 * 1024)
        AB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid((unsigned)(a.n_slices < AB_CUDA_MAX_GRID_X ? a.n_slices : AB_CUDA_MAX_GRID_X),
                    (unsigned)(tiles < AB_CUDA_MAX_GRID_YZ ? tiles : AB_CUDA_MAX_GRID_YZ));
    AB_LAUNCH(kernel, grid, threads, smem, ab_cuda_stream(), a);
    return 0;
}

template <int TR, int G, int NT = FL_THREADS> static inline int fl_run_fwd_simt(const flash_args &a) {
    auto *k = &fl_fwd_simt<TR, G, NT>;
    constexpr int BQ = NT / 16 * TR;
    return fl_launch(k, (a.L + BQ - 1) / BQ, NT, fl_fwd_simt_smem<TR, G, NT>(a.D, a.M), a);
}

template <int G> static inline int fl_run_fwd_wmma(const flash_args &a) {
    auto *k = &fl_fwd_wmma<G>;
    return fl_launch(k, (a.L + FL_BK - 1) / FL_BK, FL_THREADS, fl_fwd_wmma_smem(a.D, a.M), a);
}

/* The row kernels' block: FL_ROWS_WARPS warps when their rows fit 48 KiB, else one
 * (with the limit raised). The caller has checked that one warp's rows fit. */
static inline int fl_rows_warps(const flash_args &a) {
    return fl_rows_warp_floats(a.D, a.M) * sizeof(float) * FL_ROWS_WARPS <= 48 * 1024 ? FL_ROWS_WARPS : 1;
}

static inline int fl_run_rows(void (*kernel)(flash_args), const flash_args &a) {
    const int nw = fl_rows_warps(a);
    const size_t smem = fl_rows_warp_floats(a.D, a.M) * sizeof(float) * nw;
    if (smem > 48 * 1024)
        AB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    AB_LAUNCH(kernel, ab_cuda_grid(a.n_slices * a.L, nw, AB_CUDA_MAX_GRID_X), 32 * nw, smem, ab_cuda_stream(), a);
    return 0;
}

static inline int fl_run_fwd_rows(const flash_args &a) { return fl_run_rows(fl_fwd_rows, a); }

static inline int fl_run_delta(const flash_args &a) {
    AB_LAUNCH(fl_delta, ab_cuda_grid(a.n_slices * a.L, 8, 1 << 20), 256, 0, ab_cuda_stream(), a);
    return 0;
}

/* Backward after fl_run_delta. ATOMIC_DQ: dq must be zero beforehand. */
template <int G, bool ATOMIC_DQ> static inline int fl_run_bwd_simt(const flash_args &a) {
    const long long tiles = (a.L + FL_BK - 1) / FL_BK;
    auto *kd = &fl_bwd_dkdv_simt<G, ATOMIC_DQ>;
    AB_TRY(fl_launch(kd, tiles, FL_THREADS, fl_bwd_dkdv_smem(a.D, a.M), a));
    if (ATOMIC_DQ) return 0;
    auto *kq = &fl_bwd_dq_simt<G>;
    return fl_launch(kq, tiles, FL_THREADS, fl_bwd_dq_smem(a.D, a.M), a);
}

template <int G> static inline int fl_run_bwd_wmma(const flash_args &a) {
    const long long tiles = (a.L + FL_BK - 1) / FL_BK;
    auto *kd = &fl_bwd_dkdv_wmma<G>;
    AB_TRY(fl_launch(kd, tiles, FL_THREADS, fl_bwd_dkdv_wmma_smem(a.D, a.M), a));
    auto *kq = &fl_bwd_dq_wmma<G>;
    return fl_launch(kq, tiles, FL_THREADS, fl_bwd_dq_wmma_smem(a.D, a.M), a);
}

static inline int fl_run_bwd_rows(const flash_args &a) {
    AB_TRY(fl_run_rows(fl_bwd_dkdv_rows, a));
    return fl_run_rows(fl_bwd_dq_rows, a);
}

#endif
