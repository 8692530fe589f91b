/* Fused ("flash") softmax attention on CUDA: the host side of the kernels in
 * flash_softmax.cuh, and the attention-level forward and backward that softmax,
 * stateful-softmax (parallel mode and prefill) and local (the banded form) call.
 *
 * What it computes (per slice, queries and keys [0, L), base-2 scores x = cl q.k with
 * cl = scale log2(e); query i sees key j when j < L, i - j < w and j <= i (causal) or
 * j - i < w (non-causal), w the window, L for plain softmax):
 *   forward:  online softmax over key tiles: m_i = running max of x_ij, l_i = running
 *             sum of 2^(x_ij - m_i), O_i = running sum of 2^(x_ij - m_i) v_j, rescaled
 *             by 2^(m_old - m_new) when the max grows; out_i = O_i / l_i and
 *             lse_i = m_i + log2 l_i. No N x N buffer anywhere.
 *   backward: delta_i = dO_i . O_i; P_ij = 2^(x_ij - lse_i) recomputed from Q, K and the
 *             saved lse; dP = dO V^T, dS = P .* (dP - delta), dV = P^T dO,
 *             dK = scale dS^T Q, dQ = scale dS K (FlashAttention-2's backward).
 * Saved (flash_attn_saved_bytes): O (B H N M floats, rows [0, L) written) and lse (B H N
 * floats at the next 256-byte boundary): O(N M) per slice where the CPU backend keeps
 * the N x N probabilities. Workspace: delta, B H N floats. Padded rows (lengths) are
 * zero in out and the gradients; padded keys and rows are never read. Causal: key tiles
 * wholly above the diagonal (window: outside the band) are skipped, and only tiles
 * that cross the diagonal or a band edge (or L) evaluate the mask.
 *
 * dQ: a second pass (fl_bwd_dq_*: a block per query tile over its key tiles) rather
 * than atomics from the key-tile blocks. It recomputes S and dP (backward does 7 tile
 * products instead of 5, forward + backward 9 instead of 7), but it is deterministic:
 * the same inputs give the same bits on every run (the test suites check it, and
 * training runs replay), with no B H N D float atomics contending in L2 (at N = 16384,
 * B H = 16, causal: 2.2e9 atomic adds). The lab has the atomic variant
 * (fl_bwd_dkdv_simt<G, true>) to time the trade on a GPU.
 *
 * Kernels and sizes (256 threads per block everywhere; D, M <= 64: G = 1, <= 128: G = 2;
 * above 128 the row kernels; shared memory for D = M = 64 / 128):
 *   fp32 forward fl_fwd_simt<TR, G>: BQ = 16 TR query rows x 64 keys per step; a thread
 *     holds TR x 4 scores, TR x 4 G outputs, TR maxima and sums in registers. TR = 8
 *     (BQ = 128, G = 1): 102 KiB shared (Q 128 x 68, K 64 x 68, V 64 x 68, P 128 x 68),
 *     2 blocks (16 warps) per SM, <= 128 registers. TR = 4 (BQ = 64): P over K, 51 KiB,
 *     3 blocks per SM by registers (<= 85); G = 2: 99 KiB, 2 blocks. TR = 8 is used when
 *     it still gives 2 blocks per SM (B H ceil(N / 128) >= 2 SMs), else TR = 4 (more
 *     blocks for small N). The two give the same bits (same tiles of keys, same order).
 *   fp32 backward: fl_bwd_dkdv_simt (64 keys per block, dK and dV 4 x 4 G each per
 *     thread in registers over the query tiles; 102.5 / 166.5 KiB: 2 / 1 blocks per SM)
 *     and fl_bwd_dq_simt (64 queries per block; 85 / 149 KiB: 2 / 1).
 *   tf32 (precision=tf32, wmma m16n16k8): the same tiles, 8 warps each owning two
 *     16 x 16 fragments of a 64 x 64 score tile; S (and dP) go through shared memory for
 *     the masks, the exponentials and the per-row (per-column) steps, which 4 threads
 *     per row do there. Forward: O stays in those threads' registers (16 G floats each)
 *     and each key tile's P V is a fresh fragment product stored to shared memory and
 *     added after the row's rescale, so no per-row operation touches a fragment (the
 *     layout is unspecified) and there is no second pass over the keys (a two-pass
 *     forward, lse first, would compute Q K^T twice: +50% forward work; keeping O in
 *     shared memory would read and write it twice per tile through fragments). The
 *     backward's accumulators (dK, dV; dQ) are sums only: they stay in fragments.
 *     Shared: forward 85 / 149 KiB, dK dV 102.5 / 166.5, dQ 102 / 166.
 *
 * Why it should be fast on sm_90 (H100 / H200; nothing here has been timed: the machine
 * that wrote it has no GPU; attention/lab/flash_softmax.cu times every version):
 * - FFMA to shared-memory ratio: the score loop of the 128-row forward reads per 4 steps
 *   of d one float4 of Q per row (broadcast: 2 rows per warp, 1 wavefront) and 4 float4
 *   of K (16 rows per half-warp at stride 4 mod 32 floats: 2 wavefronts, no conflicts),
 *   for 128 FFMA per thread: 16 wavefronts per 128 warp-FFMA, i.e. shared memory at 50%
 *   of its 128 B/clock when the 4 schedulers issue an FFMA every clock (64 rows: 75%).
 *   P V has the same shape. FFMA are ~90% of the inner loops' instructions.
 * - Arithmetic intensity against L2: a 128-row block reads a 64-key tile of K and V
 *   (32 KiB at D = M = 64) per 2 x 128 x 64 x 128 = 2.1 MFLOP: 64 FLOP per byte, about
 *   1 TB/s of L2 at 60 TFLOP/s, well within H100's L2 bandwidth; HBM sees each slice's
 *   K and V roughly once per wave of blocks (the blocks of a slice walk the same keys).
 * - exp2 on the SFU: 4 TR per thread per key tile against 512 TR FFMA: ~6%.
 * - Causal balance: grid x = slices, y = query tiles in reverse (the longest rows
 *   first), so the long blocks start first and the short ones fill the tail.
 * Expected: the inner loops near 70% of FP32 peak (about 47 of 67 TFLOP/s on an H100
 * SXM), the kernels 50-60% overall; fwd + bwd then executes 9/7 of the useful flops of
 * a 5-product backward: around 1.0-1.2x PyTorch's SDPA (memory-efficient kernel, SIMT
 * fp32) at N = 4096-65536, memory O(N) (saved O and lse, delta), N = 65536 fits.
 * Measured on an H200 (2026-11-27): forward 28-32 TFLOP/s (128-row tiles 17.3 ms at
 * B = 2, H = 8, N = 16384, 0.84-1.10x SDPA over N = 1024-65536), backward 16 TFLOP/s
 * (68 ms there; 51 with the atomic dQ): fwd+bwd 0.96-1.59x SDPA, memory 0.90x.
 * What to try first on a GPU: lab_flash_softmax at the issue's shape, TR = 4 vs 8
 * (versions 2 and 3) and 8 rows per thread on 4 warps (version 4), the atomic dQ
 * (version 8) against the second pass (7); ptxas's
 * register counts (-Xptxas -v) against the launch bounds (spills); then a register
 * double buffer of the next K / V tile, Q in registers for D = 64, BQ = 32 tiles for
 * D = 128 backward (1 block per SM there). */
#include "flash_softmax.cuh"

#include "cuda_util.cuh"
#include "flash_softmax.h"

#include "../harness/memory.h"

#include <stdint.h>
#include <string.h>

int flash_cuda_force = 0;

flash_args flash_args_make(const float *q, long long sq, const float *k, long long sk, const float *v, long long sv,
                           long long so, long long sl, long long n_slices, int L, int D, int M, double scale,
                           bool causal, long long window) {
    flash_args a;
    memset(&a, 0, sizeof a);
    a.q = q, a.k = k, a.v = v;
    a.sq = sq, a.sk = sk, a.sv = sv, a.so = so, a.sl = sl;
    a.n_slices = n_slices;
    a.L = L, a.D = D, a.M = M;
    a.scale = (float)scale;
    a.cl = (float)(scale * 1.4426950408889634);
    a.causal = causal ? 1 : 0;
    a.window = window <= 0 || window >= L ? (L > 0 ? L : 1) : (int)window;
    return a;
}

static bool al16(const void *p) { return p == NULL || ((uintptr_t)p & 15u) == 0; }

/* Multiprocessors of the device (sizes the choice of forward tiles). */
static int sm_count(void) {
    static int n = 0;
    if (n == 0) {
        ab_cuda_info info;
        n = ab_cuda_device_info(&info) == 0 && info.sm_count > 0 ? info.sm_count : 132;
    }
    return n;
}

int flash_forward(const flash_args *in, int precision) {
    if (in->L <= 0 || in->n_slices <= 0) return 0;
    flash_args a = *in;
    a.vec_qk = a.D % 4 == 0 && a.sq % 4 == 0 && a.sk % 4 == 0 && al16(a.q) && al16(a.k);
    a.vec_vo = a.M % 4 == 0 && a.sv % 4 == 0 && a.so % 4 == 0 && al16(a.v) && al16(a.o) && al16(a.o2);
    const int big = a.D > a.M ? a.D : a.M;
    if (flash_cuda_force == 1 || big > 128) return fl_run_fwd_rows(a);
    const bool g2 = big > 64;
    if (precision == AB_PREC_TF32) return g2 ? fl_run_fwd_wmma<2>(a) : fl_run_fwd_wmma<1>(a);
    if (g2) return fl_run_fwd_simt<4, 2>(a);
    const bool tr8 = flash_cuda_force == 3 ||
                     (flash_cuda_force == 0 && a.n_slices * ((a.L + 127) / 128) >= 2LL * sm_count());
    return tr8 ? fl_run_fwd_simt<8, 1>(a) : fl_run_fwd_simt<4, 1>(a);
}

int flash_backward(const flash_args *in, int precision) {
    if (in->L <= 0 || in->n_slices <= 0) return 0;
    flash_args a = *in;
    a.vec_qk = a.D % 4 == 0 && a.sq % 4 == 0 && a.sk % 4 == 0 && al16(a.q) && al16(a.k) && al16(a.dq) && al16(a.dk);
    a.vec_vo = a.M % 4 == 0 && a.sv % 4 == 0 && a.so % 4 == 0 && al16(a.v) && al16(a.dv) && al16(a.dout) &&
               al16(a.o2);
    AB_TRY(fl_run_delta(a));
    const int big = a.D > a.M ? a.D : a.M;
    if (flash_cuda_force == 1 || big > 128) return fl_run_bwd_rows(a);
    const bool g2 = big > 64;
    if (precision == AB_PREC_TF32) return g2 ? fl_run_bwd_wmma<2>(a) : fl_run_bwd_wmma<1>(a);
    return g2 ? fl_run_bwd_simt<2, false>(a) : fl_run_bwd_simt<1, false>(a);
}

/* ---- attention level ---- */

static size_t align256(size_t x) { return (x + 255u) & ~(size_t)255u; }

static size_t rows_of(const attn_shape *s) { return (size_t)s->batch * (size_t)s->heads * (size_t)s->len; }

size_t flash_attn_saved_bytes(const attn_shape *s) {
    return align256(rows_of(s) * (size_t)s->v_dim * sizeof(float)) + rows_of(s) * sizeof(float);
}

size_t flash_attn_workspace_bytes(const attn_shape *s) { return rows_of(s) * sizeof(float); }

int flash_attn_check_shape(const char *variant, const attn_shape *s) {
    size_t n;
    if ((size_t)s->batch * (size_t)s->heads > (size_t)INT32_MAX)
        return ab_fail(AB_EINVAL, "%s: B*H = %d*%d slices is more than this implementation indexes", variant, s->batch,
                       s->heads);
    if (ab_mul_size(rows_of(s), (size_t)s->v_dim + 1, &n) || ab_mul_size(n, sizeof(float), &n) || n > SIZE_MAX - 512)
        return ab_fail(AB_EINVAL, "%s: B=%d H=%d N=%d M=%d: the saved O and log-sum-exps overflow size_t", variant,
                       s->batch, s->heads, s->len, s->v_dim);
    /* the row kernels (D or M above 128) hold 2 (D + M) floats per warp in shared memory */
    if ((s->qk_dim > 128 || s->v_dim > 128) && fl_rows_warp_floats(s->qk_dim, s->v_dim) * sizeof(float) > 227 * 1024)
        return ab_fail(AB_EINVAL, "%s on CUDA: D=%d M=%d: D + M at most %d", variant, s->qk_dim, s->v_dim,
                       (int)(227 * 1024 / sizeof(float) / 2));
    return 0;
}

int flash_attn_forward(attn *a, const attn_shape *s, long long window, const float *q, const float *k, const float *v,
                       float *out, void *saved) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const long long ND = (long long)N * D, NM = (long long)N * M;
    float *O = (float *)saved;
    float *lse = saved ? (float *)((char *)saved + align256(rows_of(s) * (size_t)M * sizeof(float))) : NULL;
    const double scale = attn_scale(a, D);
    return attn_cuda_runs(s, {{out, M, false}}, [&](long long s0, long long ns, int L) {
        flash_args fa = flash_args_make(q + s0 * ND, ND, k + s0 * ND, ND, v + s0 * NM, NM, NM, N, ns, L, D, M, scale,
                                        s->causal, window);
        fa.o = out + s0 * NM;
        if (saved) fa.o2 = O + s0 * NM, fa.lse = lse + s0 * N;
        return flash_forward(&fa, a->p.precision);
    });
}

int flash_attn_backward(attn *a, const attn_shape *s, long long window, const float *q, const float *k, const float *v,
                        const float *dout, const void *saved, float *dq, float *dk, float *dv) {
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const long long ND = (long long)N * D, NM = (long long)N * M;
    if (a->ws_bytes < flash_attn_workspace_bytes(s))
        return ab_fail(AB_EINVAL, "%s backward: workspace of %zu bytes, %zu needed", a->v->name, a->ws_bytes,
                       flash_attn_workspace_bytes(s));
    float *O = (float *)saved, *delta = (float *)a->ws;
    float *lse = (float *)((char *)saved + align256(rows_of(s) * (size_t)M * sizeof(float)));
    const double scale = attn_scale(a, D);
    return attn_cuda_runs(s, {{dq, D, false}, {dk, D, false}, {dv, M, false}}, [&](long long s0, long long ns, int L) {
        flash_args fa = flash_args_make(q + s0 * ND, ND, k + s0 * ND, ND, v + s0 * NM, NM, NM, N, ns, L, D, M, scale,
                                        s->causal, window);
        fa.o2 = O + s0 * NM, fa.lse = lse + s0 * N, fa.dout = dout + s0 * NM, fa.delta = delta + s0 * N;
        fa.dq = dq + s0 * ND, fa.dk = dk + s0 * ND, fa.dv = dv + s0 * NM;
        return flash_backward(&fa, a->p.precision);
    });
}
