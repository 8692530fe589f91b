/* The recurrent step of linear and polynomial attention on CUDA as one fused kernel
 * (the kernel is linear_step_cuda.cuh, shared with the kernel lab; linear_cuda.cu's
 * lin_cuda_step calls lin_step_cuda here).
 *
 * Problem: per slice (S = B*H of them) the state Saug = [S, Z] (C x (M+1) floats,
 * rows of M+1) and one position: Saug += phi(k) [v, 1]^T, then
 * out = phi(q)^T S / (phi(q)^T Z + eps). Memory-bound: the state is read and written
 * once, 8 C (M+1) bytes per slice (elu, D = M = 64, B*H = 8: 266 KB, 0.1 us at
 * 3.35 TB/s); at that size the step is latency: the launch, one round trip for the
 * loads, and whatever serial work a thread does. The earlier step was two kernels
 * (update, then the division), three for favor: 15 us measured on an H200 at B = 1,
 * H = 8, D = M = 64 (PyTorch: 109 us).
 *
 * Design (one kernel; favor with C D > LS_FAVOR_FUSED_MAX: two):
 * - grid: S x tiles x row splits blocks. A tile is `cols` consecutive columns of the
 *   state (all M+1 of them while M < LS_MAX_COLS = 256: one tile), a row split a range
 *   of the C feature rows, as many splits as make the blocks reach LS_BLOCKS_PER_SM (4)
 *   per SM with at least LS_ROWS_PER_THREAD (4) rows per thread. elu, D = M = 64,
 *   S = 8 on 132 SMs: 6 splits of 11 rows (48 blocks, each thread 4 rows: one round of
 *   loads); polynomial D = 64 (C = 4161): 66 splits of 64 rows (528 blocks); MNIST's
 *   sampling at batch 256 (S = 2048, D = 32, M1 = 33): one block per slice.
 * - block: LS_THREADS = 256 threads as lanes x cols (cols = M+1 = 65: 3 lanes, 195
 *   threads busy): consecutive threads take consecutive columns of a row, so a warp's
 *   loads and stores of S are 128 contiguous bytes when the tile is the whole row (the
 *   state of a slice is then one contiguous block walked by row). The block first
 *   stages phi(q) and phi(k) of its rows in shared memory (LS_CHUNK rows at a time,
 *   each feature computed once, not once per column), then every thread updates its
 *   rows of its column in registers (S read once, written once, the sum
 *   phi(q)_c S_cj in double, as the earlier kernel and the CPU's step in spirit). The
 *   lanes' sums meet in shared memory in lane order.
 * - the division: with one block per slice it divides at once (the block holds the
 *   denominator column). With several, each block writes its partial sums (M+1
 *   doubles), and the slice's last block (an atomic counter per slice, in the state
 *   after its other parts, zero between steps) adds them in row-split order and
 *   divides: the same result whichever block finishes last. A second kernel was the
 *   alternative; this saves its launch (~2-3 us, as much as the step itself).
 * - favor: its features need the maxima of all C log-features of q and k (the shifts
 *   that keep exp in range). Where C D <= LS_FAVOR_FUSED_MAX (16384: D = 64 with the
 *   default 2 D = 128 features) every block computes all of them (C D multiply-adds of
 *   q and k with W from L2, 16 K here) and its rows' features; above that a features
 *   kernel (one block per slice and q or k) writes them into the workspace first. The
 *   slice's new key shift is stored by the last block (the one block), after every
 *   block of the slice has read the old one.
 *
 * Expected on an H100 (nothing timed, no GPU here): elu B = 1, H = 8, D = M = 64:
 * the launch (~2-3 us), the features and one round of S loads (~1 us), the partials,
 * the counter and the last block's read of 6 x 65 doubles (~1 us): ~4-5 us against
 * 15 us before; polynomial D = 64 (1.08 MB of state per slice): bandwidth-bound at
 * ~9 MB per step, ~5 us. What to try first on a GPU (attention/lab/linear_step.cu):
 * one block per slice with 1024 threads against the row splits (no counter, more
 * serial rows), LS_BLOCKS_PER_SM 2..8, LS_ROWS_PER_THREAD 2..16.
 *
 * Numerics: the features are the chunked path's (the same float operations as
 * feature_maps_cuda.cu and favor_cuda.cu); the update is S + phi(k) v in float (favor:
 * S e^(c_old - c_new) + (phi(k) e^(sk - c_new)) v), the output sums in double, the
 * division as before: out = (float)num * (float)(1 / ((double)(float)den + eps)). */
#include "linear_step_cuda.cuh"

#include "step_cuda.h"

int lin_step_rows_override = 0, lin_step_cols_override = 0;

static size_t align256(size_t x) { return (x + 255u) & ~(size_t)255u; }

extern "C" size_t lin_step_counter_offset(size_t base_bytes) { return align256(base_bytes); }

extern "C" size_t lin_step_counter_bytes(long long n_slices) {
    return align256((size_t)n_slices * sizeof(unsigned));
}

static ls_plan plan_of(long long n_slices, long long C, int M) {
    return ls_make_plan(n_slices, C, M, LS_THREADS, attn_cuda_sm_count(), lin_step_rows_override,
                        lin_step_cols_override);
}

extern "C" void lin_step_plan(long long n_slices, long long C, int M, int sms, int plan[4]) {
    const ls_plan p = ls_make_plan(n_slices, C, M, LS_THREADS, sms, lin_step_rows_override, lin_step_cols_override);
    plan[0] = p.tiles, plan[1] = p.cols, plan[2] = p.rsplits, plan[3] = p.row_split;
}

/* [partial sums: n x rsplits x M1 doubles][favor's features: 2 n C + 2 n floats] */
static size_t part_bytes(long long n_slices, const ls_plan &p, int M) {
    if (p.tiles == 1 && p.rsplits == 1) return 0;
    return align256((size_t)n_slices * (size_t)p.rsplits * ((size_t)M + 1) * sizeof(double));
}

static size_t feat_bytes(long long n_slices, long long C, int D, int favor) {
    fm_dev f;
    f.C = (int)C, f.D = D;
    if (!favor || ls_favor_fused(f)) return 0;
    return (2 * (size_t)n_slices * (size_t)C + 2 * (size_t)n_slices) * sizeof(float);
}

extern "C" size_t lin_step_workspace_bytes(long long n_slices, int C, int D, int M, int favor) {
    return part_bytes(n_slices, plan_of(n_slices, C, M), M) + feat_bytes(n_slices, C, D, favor);
}

int lin_step_cuda(const fm_step_args &s, int kind, unsigned *counters, size_t ws_bytes) {
    const ls_plan p = plan_of(s.n_slices, s.f.C, s.M);
    const size_t pb = part_bytes(s.n_slices, p, s.M), fb = feat_bytes(s.n_slices, s.f.C, s.f.D, kind == FM_FAVOR);
    if (pb + fb > ws_bytes)
        return ab_fail(AB_EINVAL, "linear step: %zu bytes of workspace needed, %zu held", pb + fb, ws_bytes);
    ls_args a;
    a.f = s.f;
    a.S = s.S;
    a.shift = s.shift;
    a.q = s.q, a.k = s.k, a.v = s.v;
    a.out = s.out;
    a.part = (double *)s.ws;
    a.feat = (const float *)((char *)s.ws + pb);
    a.count = counters;
    a.n_slices = s.n_slices;
    a.M = s.M;
    a.t = s.t;
    a.eps = s.eps;
    return ls_step_launch(a, kind, p, LS_THREADS);
}
