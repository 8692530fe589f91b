/* The CUDA semantics attnbench relies on, checked with the kernels and runners of
 * cuda_selftest.cu: barriers, static and dynamic shared memory, warp shuffles and
 * ballots, atomics, 3-D indices, launch limits, cuBLAS's column-major GEMM (all
 * transpose combinations against ab_sgemm), the row-major wrappers of cuda_blas.h, and
 * CUB's radix sort (stable, bit ranges, temporary storage protocol).
 *
 * test_cuda_selftest_emu runs them on the emulator (every build), together with the
 * misuse the emulator must report (a barrier not reached by every thread, a shuffle
 * naming an exited lane, shared memory read past its end, a copy with the wrong kind);
 * test_cuda_selftest runs the same checks on a real GPU (skipped without one), which is
 * how the emulator's answers are confirmed to be the real ones. */
#include "blas.h"
#include "cuda_blas.h"
#include "cuda_device.h"
#include "device.h"
#include "error.h"
#include "test_sanitized.h"
#include "test_util.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int selftest_tree_sum(const int *x, int blocks, int threads, int *out);
int selftest_reverse(const float *x, float *y, int blocks, int n, int threads);
int selftest_reverse_large(const float *x, float *y, int n);
int selftest_sync_count(int threads, int *out4);
int selftest_warp(const int *x, int threads, int *out);
int selftest_shfl_types(const float *xf, const double *xd, float *yf, double *yd);
int selftest_atomics(const int *x, long long n, int bins, int blocks, int *hist, float *sum);
int selftest_indices(const unsigned grid[3], const unsigned block[3], int *out);
int selftest_launch(int threads);
int selftest_graph(const float *x, const float *x2, int n, float a, float b, float *out_before, float *y1,
                   float *z1, float *c1, float *y2, int *w2, int *refused);
int selftest_partial_barrier(void);
int selftest_exited_lane(void);
int selftest_smem_overflow(int n);
int selftest_bad_copy(void);
int selftest_racy_shift(float *y, int threads);
int selftest_global_past_end(int n);
int selftest_stale_static(float *out, int blocks);
int selftest_cublas(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, long long sa,
                    const float *B, int ldb, long long sb, float beta, float *C, int ldc, long long sc, int batch,
                    size_t na, size_t nb, size_t nc);
int selftest_cublas_bad_lda(void);
int selftest_sort(const unsigned *keys, const int *vals, int n, int begin_bit, int end_bit, unsigned *keys_out,
                  int *vals_out, size_t *temp_bytes);

int selftest_wmma(int bf16, int a_col, int b_col, int round, int M, int N, int K, const float *A, const float *B,
                  float *C);
int selftest_wmma_roundtrip(const float *in, float *out);
#ifdef TEST_CUDA_EMU
int selftest_wmma_layout_reliant(const float *in, const float *scale, float *out);
int selftest_wmma_misaligned(void);
int selftest_wmma_divergent(void);
#endif

static void require_device(void) {
    if (ab_cuda_init()) cr_skip_test("no CUDA here: %s", ab_error());
}

/* ---- barriers, shared memory ---- */

Test(cuda_selftest, tree_sum_needs_every_barrier) {
    require_device();
    enum { BLOCKS = 3, T = 256 };
    int x[BLOCKS * T], out[BLOCKS];
    tu_fill_int(x, BLOCKS * T, 1, 0, -1000, 1000);
    cr_assert_eq(selftest_tree_sum(x, BLOCKS, T, out), 0, "%s", ab_error());
    for (int b = 0; b < BLOCKS; b++) {
        int want = 0;
        for (int t = 0; t < T; t++) want += x[b * T + t];
        cr_assert_eq(out[b], want, "block %d: %d, want %d", b, out[b], want);
    }
}

Test(cuda_selftest, dynamic_shared_memory) {
    require_device();
    enum { BLOCKS = 4, N = 1000 };
    float *x = tu_alloc_f(BLOCKS * N), *y = tu_alloc_f(BLOCKS * N);
    tu_fill_normal(x, BLOCKS * N, 2, 0, 1.0);
    cr_assert_eq(selftest_reverse(x, y, BLOCKS, N, 128), 0, "%s", ab_error());
    for (int b = 0; b < BLOCKS; b++)
        for (int i = 0; i < N; i++) cr_assert_eq(y[b * N + i], x[b * N + N - 1 - i], "block %d entry %d", b, i);
    /* 80 KB: above the default 48 KiB, allowed by cudaFuncSetAttribute */
    enum { L = 20000 };
    float *xl = tu_alloc_f(L), *yl = tu_alloc_f(L);
    tu_fill_normal(xl, L, 3, 0, 1.0);
    cr_assert_eq(selftest_reverse_large(xl, yl, L), 0, "%s", ab_error());
    for (int i = 0; i < L; i++) cr_assert_eq(yl[i], xl[L - 1 - i], "large: entry %d", i);
    free(x), free(y), free(xl), free(yl);
}

Test(cuda_selftest, syncthreads_count_or_and) {
    require_device();
    int out[4];
    cr_assert_eq(selftest_sync_count(96, out), 0, "%s", ab_error());
    cr_assert(out[0] == 32 && out[1] == 1 && out[2] == 0 && out[3] == 1, "count %d or %d and %d and(1) %d", out[0],
              out[1], out[2], out[3]);
}

/* ---- warps ---- */

Test(cuda_selftest, shuffles_and_ballots) {
    require_device();
    enum { T = 64 };
    int x[T], out[T * 8];
    tu_fill_int(x, T, 4, 0, 1, 100);
    cr_assert_eq(selftest_warp(x, T, out), 0, "%s", ab_error());
    for (int t = 0; t < T; t++) {
        const int w = t / 32, lane = t % 32, *o = out + t * 8;
        int sum = 0, prefix = 0, seg = 0;
        for (int l = 0; l < 32; l++) sum += x[w * 32 + l];
        for (int l = 0; l <= lane; l++) prefix += x[w * 32 + l];
        for (int l = lane & ~7; l < (lane & ~7) + 8; l++) seg += x[w * 32 + l];
        cr_assert_eq(o[0], sum, "xor sum, thread %d", t);
        if (lane == 0) cr_assert_eq(o[1], sum, "down sum at lane 0, thread %d", t);
        cr_assert_eq(o[2], x[w * 32 + 5], "broadcast of lane 5, thread %d", t);
        cr_assert_eq(o[3], prefix, "up-shuffle prefix sum, thread %d", t);
        cr_assert_eq(o[4], seg, "xor sum in segments of 8, thread %d", t);
        cr_assert_eq((unsigned)o[5], 0xaaaaaaaau, "ballot of odd lanes, thread %d: %08x", t, (unsigned)o[5]);
        cr_assert_eq(o[6], 1, "any(lane == 7)");
        cr_assert_eq(o[7], 1, "all(x > 0)");
    }
    /* down shuffles: lane i holds the sum of lanes i.. (tree), so lane 1 is not the sum */
    cr_assert_neq(out[1 * 8 + 1], out[0 * 8 + 1]);
}

Test(cuda_selftest, shuffles_move_float_and_double_bits) {
    require_device();
    float xf[64], yf[64];
    double xd[64], yd[64];
    for (int i = 0; i < 64; i++) {
        xf[i] = (float)(i * 1.25 - 7.0);
        xd[i] = i * 1e-300 + 1.0 / (i + 1);
    }
    cr_assert_eq(selftest_shfl_types(xf, xd, yf, yd), 0, "%s", ab_error());
    for (int i = 0; i < 64; i++) {
        cr_assert_eq(yf[i], xf[i ^ 1], "float xor shuffle at %d", i);
        cr_assert_eq(yd[i], xd[(i & ~31) + 31 - (i & 31)], "double shuffle at %d", i);
    }
}

/* ---- atomics and indices ---- */

Test(cuda_selftest, atomics_from_every_block) {
    require_device();
    enum { N = 10000, BINS = 7 };
    int *x = malloc(sizeof(int) * N), hist[BINS], want[BINS] = {0};
    tu_fill_int(x, N, 5, 0, 0, 1000);
    float sum;
    double wsum = 0;
    for (int i = 0; i < N; i++) want[x[i] % BINS]++, wsum += x[i];
    cr_assert_eq(selftest_atomics(x, N, BINS, 5, hist, &sum), 0, "%s", ab_error());
    for (int b = 0; b < BINS; b++) cr_assert_eq(hist[b], want[b], "bin %d: %d, want %d", b, hist[b], want[b]);
    /* float additions in any order: relative error below N * 2^-24 = 6e-4; measured 0 on
     * the emulator (sums of integers below 2^24 are exact) */
    cr_assert(fabs(sum - wsum) <= 6e-4 * wsum, "sum %g, want %g", (double)sum, wsum);
    free(x);
}

Test(cuda_selftest, three_dimensional_indices) {
    require_device();
    const unsigned grid[3] = {3, 2, 2}, block[3] = {4, 3, 2};
    enum { N = 3 * 2 * 2 * 4 * 3 * 2 };
    int out[N];
    cr_assert_eq(selftest_indices(grid, block, out), 0, "%s", ab_error());
    for (int i = 0; i < N; i++) cr_assert_eq(out[i], i, "slot %d holds %d", i, out[i]);
}

Test(cuda_selftest, launch_limits) {
    require_device();
    cr_assert_eq(selftest_launch(1024), 0, "%s", ab_error());
    ab_clear_error();
    int rc = selftest_launch(1025);
    cr_assert_eq(rc, AB_EDEVICE, "a block of 1025 threads: rc %d", rc);
    /* The CUDA 13 runtime answers cudaErrorInvalidValue ("invalid argument", seen on an
     * H100), older ones cudaErrorInvalidConfiguration: a GPU may give either; the
     * emulator gives the first. */
    const char *e = ab_error();
    bool invalid_value = strstr(e, "invalid argument") != NULL;
#ifdef TEST_CUDA_EMU
    bool named = invalid_value;
#else
    bool named = invalid_value || strstr(e, "invalid configuration") != NULL;
#endif
    cr_assert(strstr(e, "launch of nothing_kernel") && named, "message: %s", e);
    /* the failed launch's error was cleared: the next launch works */
    cr_assert_eq(selftest_launch(32), 0, "%s", ab_error());
}

/* A graph of the library's stream replays what was recorded (a kernel with the
 * arguments it was launched with, a copy, a memset, a cuBLAS GEMM), runs nothing while
 * recording, reads the memory as it is at each launch; a synchronous copy while
 * recording is refused and spoils the recording, and the stream works afterwards. All
 * values are exact in float (small integers and halves), so equality is asserted. */
Test(cuda_selftest, graph_replays_what_was_recorded) {
    require_device();
    enum { n = 300 };
    float x[n], x2[n], before[n], y1[n], z1[n], y2[n], c1[4];
    int w2[n], refused[3] = {0, 0, 0};
    for (int i = 0; i < n; i++) x[i] = (float)(i % 17) - 8.0f, x2[i] = (float)(i % 5) + 0.5f;
    cr_assert_eq(selftest_graph(x, x2, n, 3.0f, 0.5f, before, y1, z1, c1, y2, w2, refused), 0, "%s", ab_error());
    for (int i = 0; i < n; i++) {
        cr_assert_eq(before[i], 0.0f, "y[%d] = %g before the first launch: recording ran the kernel", i, before[i]);
        cr_assert_eq(y1[i], 3.0f * x[i] + 0.5f, "launch 1: y[%d] = %g", i, y1[i]);
        cr_assert_eq(z1[i], y1[i], "launch 1: the copy z[%d] = %g", i, z1[i]);
        cr_assert_eq(y2[i], 3.0f * x2[i] + 0.5f, "launch 2 (new x): y[%d] = %g", i, y2[i]);
        cr_assert_eq(w2[i], 0x01010101, "launch 2: the memset w[%d] = %#x", i, w2[i]);
    }
    /* ab_cuda_sgemm is row-major: [1 2; 3 4] [5 6; 7 8] = [19 22; 43 50] */
    const float c_want[4] = {19, 22, 43, 50};
    for (int i = 0; i < 4; i++) cr_assert_eq(c1[i], c_want[i], "C[%d] = %g", i, c1[i]);
    cr_assert(refused[0], "a synchronous copy while recording was not refused");
    cr_assert(refused[1], "a spoilt recording still made a graph");
    cr_assert(refused[2], "the stream does not work after a spoilt recording: %s", ab_error());
}

/* ---- cuBLAS ---- */

/* col-major C (m x n, ldc) = op(A) op(B): as row-major data, C^T (n x m) =
 * op(B)^T op(A)^T, where the row-major view of a col-major X is X^T. So ab_sgemm with
 * the operands swapped and the same transpose flags gives the reference. */
static void check_cublas(int ta, int tb, int batch, float beta) {
    const int m = 5, n = 4, k = 3;
    const int lda = (ta ? k : m) + 2, ldb = (tb ? n : k) + 1, ldc = m + 3; /* padded */
    const int ca = ta ? m : k, cb = tb ? k : n;
    const long long sa = (long long)lda * ca + 5, sb = (long long)ldb * cb + 1, sc = (long long)ldc * n + 2;
    const size_t na = (size_t)sa * batch, nb = (size_t)sb * batch, nc = (size_t)sc * batch;
    float *A = tu_alloc_f(na), *B = tu_alloc_f(nb), *C = tu_alloc_f(nc), *want = tu_alloc_f(nc);
    tu_fill_normal(A, na, 6, 0, 1.0);
    tu_fill_normal(B, nb, 6, 1, 1.0);
    tu_fill_normal(C, nc, 6, 2, 1.0);
    if (beta == 0.0f)
        for (size_t i = 0; i < nc; i++) C[i] = NAN; /* beta = 0: C is not read */
    memcpy(want, C, sizeof(float) * nc);
    for (int b = 0; b < batch; b++)
        ab_sgemm(tb, ta, n, m, k, 0.75f, B + b * sb, ldb, A + b * sa, lda, beta, want + b * sc, ldc);
    cr_assert_eq(selftest_cublas(ta, tb, m, n, k, 0.75f, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch, na, nb, nc),
                 0, "%s", ab_error());
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                size_t e = (size_t)b * sc + (size_t)j * ldc + i;
                /* k = 3 products: float rounding only, a few units of 2^-24 relative
                 * (measured: up to 1e-7); a wrong operand or transpose is O(1) */
                cr_assert(fabsf(C[e] - want[e]) <= 1e-5f * (1.0f + fabsf(want[e])),
                          "ta=%d tb=%d batch=%d beta=%g: C[%d][%d] of entry %d = %g, want %g", ta, tb, batch,
                          (double)beta, i, j, b, (double)C[e], (double)want[e]);
            }
    /* everything outside the m x n matrices (padding rows, gaps between entries) is
     * untouched */
    for (size_t e = 0; e < nc; e++) {
        size_t b = e / (size_t)sc, r = e % (size_t)sc, j = r / (size_t)ldc, i = r % (size_t)ldc;
        if (b < (size_t)batch && j < (size_t)n && i < (size_t)m) continue;
        cr_assert(memcmp(&C[e], &want[e], sizeof(float)) == 0, "ta=%d tb=%d batch=%d: entry %zu outside C written",
                  ta, tb, batch, e);
    }
    free(A), free(B), free(C), free(want);
}

Test(cuda_selftest, cublas_column_major_all_transposes) {
    require_device();
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int batch = 1; batch <= 3; batch += 2) {
                check_cublas(ta, tb, batch, 0.0f);
                check_cublas(ta, tb, batch, 0.5f);
            }
    cr_assert_eq(selftest_cublas_bad_lda(), 0, "%s", ab_error());
}

Test(cuda_selftest, row_major_wrappers_all_transposes) {
    /* cuda_blas.h against ab_sgemm on the same row-major data. */
    require_device();
    const int m = 6, n = 5, k = 4, batch = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            const int lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 1;
            const long long sa = (long long)lda * (ta ? k : m), sb = (long long)ldb * (tb ? n : k),
                            sc = (long long)ldc * m;
            float *A = tu_alloc_f((size_t)sa * batch), *B = tu_alloc_f((size_t)sb * batch);
            float *C = tu_alloc_f((size_t)sc * batch), *want = tu_alloc_f((size_t)sc * batch);
            tu_fill_normal(A, (size_t)sa * batch, 7, 0, 1.0);
            tu_fill_normal(B, (size_t)sb * batch, 7, 1, 1.0);
            tu_fill_normal(want, (size_t)sc * batch, 7, 2, 1.0);
            memcpy(C, want, sizeof(float) * (size_t)sc * batch);
            for (int b = 0; b < batch; b++)
                ab_sgemm(ta, tb, m, n, k, 1.5f, A + b * sa, lda, B + b * sb, ldb, 0.25f, want + b * sc, ldc);
            void *dA, *dB, *dC;
            cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &dA, sizeof(float) * (size_t)sa * batch), 0);
            cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &dB, sizeof(float) * (size_t)sb * batch), 0);
            cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &dC, sizeof(float) * (size_t)sc * batch), 0);
            cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dA, A, sizeof(float) * (size_t)sa * batch), 0);
            cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dB, B, sizeof(float) * (size_t)sb * batch), 0);
            cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dC, C, sizeof(float) * (size_t)sc * batch), 0);
            /* entry 0 alone (cublasSgemm), then all three (strided batched) from entry 1 */
            cr_assert_eq(ab_cuda_sgemm(ta, tb, m, n, k, 1.5f, dA, lda, dB, ldb, 0.25f, dC, ldc), 0, "%s", ab_error());
            cr_assert_eq(ab_cuda_sgemm_batched(ta, tb, m, n, k, 1.5f, (float *)dA + sa, lda, sa, (float *)dB + sb, ldb,
                                               sb, 0.25f, (float *)dC + sc, ldc, sc, batch - 1),
                         0, "%s", ab_error());
            cr_assert_eq(ab_dev_download(AB_DEV_CUDA, C, dC, sizeof(float) * (size_t)sc * batch), 0);
            /* k = 4 products: float rounding only, as in check_cublas */
            for (size_t e = 0; e < (size_t)sc * batch; e++)
                cr_assert(fabsf(C[e] - want[e]) <= 1e-5f * (1.0f + fabsf(want[e])), "ta=%d tb=%d: entry %zu = %g, want %g",
                          ta, tb, e, (double)C[e], (double)want[e]);
            ab_dev_free(AB_DEV_CUDA, dA), ab_dev_free(AB_DEV_CUDA, dB), ab_dev_free(AB_DEV_CUDA, dC);
            free(A), free(B), free(C), free(want);
        }
}

/* ---- CUB ---- */

static void check_sort(int n, int begin_bit, int end_bit, uint64_t seed) {
    unsigned *keys = malloc(sizeof(unsigned) * n), *ko = malloc(sizeof(unsigned) * n);
    int *vals = malloc(sizeof(int) * n), *vo = malloc(sizeof(int) * n), *r = malloc(sizeof(int) * n);
    tu_fill_int(r, (size_t)n, seed, 0, 0, 1 << 20);
    for (int i = 0; i < n; i++) {
        keys[i] = (unsigned)r[i] * 2654435761u; /* all 32 bits in use, many equal low bytes */
        vals[i] = i;
    }
    size_t temp = 0;
    cr_assert_eq(selftest_sort(keys, vals, n, begin_bit, end_bit, ko, vo, &temp), 0, "%s", ab_error());
    cr_assert_gt(temp, 0u);
    const unsigned field = end_bit - begin_bit >= 32 ? 0xffffffffu : ((1u << (end_bit - begin_bit)) - 1u);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(ko[i], keys[vo[i]], "key %d does not travel with its value", i);
        if (i == 0) continue;
        unsigned a = (ko[i - 1] >> begin_bit) & field, b = (ko[i] >> begin_bit) & field;
        cr_assert_leq(a, b, "bits [%d, %d): not sorted at %d", begin_bit, end_bit, i);
        if (a == b) cr_assert_lt(vo[i - 1], vo[i], "bits [%d, %d): equal keys out of order at %d (not stable)",
                                 begin_bit, end_bit, i);
    }
    free(keys), free(ko), free(vals), free(vo), free(r);
}

Test(cuda_selftest, radix_sort_stable_on_bit_ranges) {
    require_device();
    check_sort(1000, 0, 32, 8);
    check_sort(1000, 0, 8, 9);  /* 256 buckets, about 4 keys each */
    check_sort(1000, 4, 12, 10);
    check_sort(1, 0, 32, 11);
}

/* ---- warp matrix operations (wmma) and cuBLAS's TF32 mode ---- */

/* bf16 of x, rounded to nearest even (the device's __float2bfloat16_rn) */
static float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* C (M x N) against the double product of A (M x K) and B (K x N), both row-major:
 * every |error| <= tol_rel * S_ij with S_ij = sum_k |a_ik b_kj| (the scale of the
 * rounding errors of a dot product); returns the largest error / S_ij. */
static double check_product(const float *C, const float *A, const float *B, int M, int N, int K, double tol_rel,
                            const char *what) {
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double want = 0, S = 0;
            for (int k = 0; k < K; k++) {
                want += (double)A[(size_t)i * K + k] * B[(size_t)k * N + j];
                S += fabs((double)A[(size_t)i * K + k] * B[(size_t)k * N + j]);
            }
            const double e = fabs(C[(size_t)i * N + j] - want) / S;
            cr_assert(e <= tol_rel, "%s: C[%d][%d] = %.9g, want %.9g (error %.3g of the scale %.3g, allowed %.3g)", what,
                      i, j, (double)C[(size_t)i * N + j], want, e, S, tol_rel);
            worst = e > worst ? e : worst;
        }
    return worst;
}

Test(cuda_selftest, wmma_tf32_products_in_every_layout) {
    /* TF32 m16n16k8 tiles, A and B row- or column-major, elements rounded with
     * __float_to_tf32 or left for the tensor cores to cut. Each operand carries a
     * relative error of at most 2^-11 (rounded) or 2^-10 (cut); the products are exact
     * in float and K = 40 of them are summed in float: |error| <= (2 u + K 2^-24) S.
     * And the rounding must be visible: some entry's error above 2^-16 S, far beyond
     * what fp32 arithmetic would give (K 2^-24 = 2.4e-6). */
    require_device();
    enum { M = 32, N = 48, K = 40 };
    float *A = tu_alloc_f(M * K), *B = tu_alloc_f(K * N), *At = tu_alloc_f(M * K), *Bt = tu_alloc_f(K * N);
    float *C = tu_alloc_f(M * N);
    tu_fill_normal(A, M * K, 80, 0, 1.0);
    tu_fill_normal(B, K * N, 80, 1, 1.0);
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) At[(size_t)k * M + i] = A[(size_t)i * K + k];
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) Bt[(size_t)j * K + k] = B[(size_t)k * N + j];
    for (int a_col = 0; a_col < 2; a_col++)
        for (int b_col = 0; b_col < 2; b_col++)
            for (int round = 0; round < 2; round++) {
                char what[96];
                snprintf(what, sizeof what, "tf32 a_col=%d b_col=%d round=%d", a_col, b_col, round);
                cr_assert_eq(selftest_wmma(0, a_col, b_col, round, M, N, K, a_col ? At : A, b_col ? Bt : B, C), 0, "%s",
                             ab_error());
                const double u = round ? ldexp(1, -11) : ldexp(1, -10);
                const double worst = check_product(C, A, B, M, N, K, 2 * u + K * ldexp(1, -24), what);
                cr_assert(worst > ldexp(1, -16), "%s: largest error %.3g of the scale: no TF32 rounding seen", what,
                          worst);
            }
    free(A), free(B), free(At), free(Bt), free(C);
}

Test(cuda_selftest, wmma_bf16_products) {
    /* bf16 m16n16k16: against the double product of the bf16-rounded operands, so only
     * the float sums of K = 64 exact products remain: |error| <= K 2^-24 S. */
    require_device();
    enum { M = 48, N = 32, K = 64 };
    float *A = tu_alloc_f(M * K), *B = tu_alloc_f(K * N), *C = tu_alloc_f(M * N);
    tu_fill_normal(A, M * K, 81, 0, 1.0);
    tu_fill_normal(B, K * N, 81, 1, 1.0);
    cr_assert_eq(selftest_wmma(1, 0, 0, 0, M, N, K, A, B, C), 0, "%s", ab_error());
    for (int i = 0; i < M * K; i++) A[i] = bf16_round(A[i]);
    for (int i = 0; i < K * N; i++) B[i] = bf16_round(B[i]);
    check_product(C, A, B, M, N, K, K * ldexp(1, -24), "bf16");
    free(A), free(B), free(C);
}

Test(cuda_selftest, wmma_accumulator_through_memory) {
    /* store in one layout, load in the other (a transpose), an elementwise +1: exact */
    require_device();
    float in[256], out[256];
    for (int i = 0; i < 256; i++) in[i] = (float)(i * 3 - 100);
    cr_assert_eq(selftest_wmma_roundtrip(in, out), 0, "%s", ab_error());
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            cr_assert_eq(out[r * 16 + c], in[c * 16 + r] + 1.0f, "out[%d][%d] = %g", r, c, (double)out[r * 16 + c]);
}

Test(cuda_selftest, cublas_follows_the_gemm_precision) {
    /* ab_cuda_sgemm in fp32: errors of float sums only, |error| <= K 2^-24 S; in tf32
     * (cuBLAS's TF32 math mode): operands rounded to TF32 too, <= (2^-10 + K 2^-24) S,
     * with the rounding visible (some error above 2^-16 S); the precision set is given
     * back, so fp32 again after. K = 256. */
    require_device();
    enum { M = 32, N = 24, K = 256 };
    float *A = tu_alloc_f(M * K), *B = tu_alloc_f(K * N), *C = tu_alloc_f(M * N);
    tu_fill_normal(A, M * K, 82, 0, 1.0);
    tu_fill_normal(B, K * N, 82, 1, 1.0);
    void *dA, *dB, *dC;
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &dA, sizeof(float) * M * K), 0);
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &dB, sizeof(float) * K * N), 0);
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &dC, sizeof(float) * M * N), 0);
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dA, A, sizeof(float) * M * K), 0);
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, dB, B, sizeof(float) * K * N), 0);
    const ab_precision precs[3] = {AB_PREC_FP32, AB_PREC_TF32, AB_PREC_FP32};
    for (int t = 0; t < 3; t++) {
        const ab_precision p0 = ab_cuda_set_gemm_precision(precs[t]);
        cr_assert_eq(p0, AB_PREC_FP32);
        cr_assert_eq(ab_cuda_sgemm(false, false, M, N, K, 1.0f, dA, K, dB, N, 0.0f, dC, N), 0, "%s", ab_error());
        cr_assert_eq(ab_cuda_set_gemm_precision(p0), precs[t]);
        cr_assert_eq(ab_dev_download(AB_DEV_CUDA, C, dC, sizeof(float) * M * N), 0);
        const bool tf32 = precs[t] == AB_PREC_TF32;
        const double worst = check_product(C, A, B, M, N, K, (tf32 ? ldexp(1, -10) : 0) + K * ldexp(1, -24),
                                           ab_precision_name(precs[t]));
        if (tf32) cr_assert(worst > ldexp(1, -16), "tf32: largest error %.3g of the scale: no TF32 rounding", worst);
    }
    ab_dev_free(AB_DEV_CUDA, dA), ab_dev_free(AB_DEV_CUDA, dB), ab_dev_free(AB_DEV_CUDA, dC);
    free(A), free(B), free(C);
}

/* ---- misuse the emulator reports (it aborts with a message: a GPU would hang or
 * compute garbage) ---- */

#ifdef TEST_CUDA_EMU
Test(cuda_emulator, partial_barrier_aborts, .signal = SIGABRT) {
    require_device();
    selftest_partial_barrier();
}

Test(cuda_emulator, shuffle_naming_an_exited_lane_aborts, .signal = SIGABRT) {
    require_device();
    selftest_exited_lane();
}

Test(cuda_emulator, shared_memory_past_the_end_faults, .signal = TEST_SIGSEGV) {
    TEST_SKIP_FAULT_UNDER_SANITIZER();
    require_device();
    selftest_smem_overflow(64);
}

Test(cuda_emulator, copy_with_the_wrong_kind_aborts, .signal = SIGABRT) {
    require_device();
    selftest_bad_copy();
}

/* Strict mode (AB_EMU_STRICT=1; the *_strict suites run the CUDA suites in it) makes
 * three GPU failures show that the default mode lets pass. */
void ab_emu_set_strict(int on);

Test(cuda_emulator, strict_mode_shows_a_missing_barrier) {
    require_device();
    enum { T = 64 };
    float y[T];
    /* Default order: the race is hidden (this is what the default mode cannot catch). */
    ab_emu_set_strict(0);
    cr_assert_eq(selftest_racy_shift(y, T), 0, "%s", ab_error());
    for (int t = 1; t < T; t++) cr_assert_eq(y[t], (float)t);
    /* Reverse order: every thread but the last reads its neighbour's slot before the
     * neighbour wrote it. */
    ab_emu_set_strict(1);
    cr_assert_eq(selftest_racy_shift(y, T), 0, "%s", ab_error());
    int stale = 0;
    for (int t = 1; t < T; t++) stale += isnan(y[t]);
    cr_assert_eq(stale, T - 1);
}

Test(cuda_emulator, strict_mode_faults_on_a_global_read_past_the_end, .signal = TEST_SIGSEGV) {
    TEST_SKIP_FAULT_UNDER_SANITIZER();
    require_device();
    ab_emu_set_strict(1);
    selftest_global_past_end(5); /* 20 bytes: not a multiple of any alignment above 4 */
}

Test(cuda_emulator, strict_mode_faults_on_host_access_to_device_memory, .signal = TEST_SIGSEGV) {
    TEST_SKIP_FAULT_UNDER_SANITIZER();
    require_device();
    ab_emu_set_strict(1);
    void *d;
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &d, 64), 0);
    volatile float *p = (volatile float *)d;
    (void)p[0];
}

Test(cuda_emulator, strict_mode_leaves_correct_code_alone) {
    /* The same reads through the API work in strict mode. */
    require_device();
    ab_emu_set_strict(1);
    void *d;
    float h[5] = {1, 2, 3, 4, 5}, g[5];
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &d, sizeof h), 0);
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d, h, sizeof h), 0);
    cr_assert_eq(ab_dev_download(AB_DEV_CUDA, g, d, sizeof g), 0);
    cr_assert_arr_eq(g, h, sizeof h);
    ab_dev_free(AB_DEV_CUDA, d);
}

Test(cuda_emulator, static_shared_memory_is_poisoned_at_every_block) {
    /* Each block reads its static shared variable before writing it: NaN in every
     * block, never the value the block before left there. */
    require_device();
    enum { BLOCKS = 4 };
    float out[BLOCKS];
    cr_assert_eq(selftest_stale_static(out, BLOCKS), 0, "%s", ab_error());
    for (int b = 0; b < BLOCKS; b++) cr_assert(isnan(out[b]), "block %d read %g", b, out[b]);
}

Test(cuda_emulator, strict_mode_shows_a_wmma_layout_dependence) {
    /* A kernel that scales an accumulator's rows in registers by assuming which tile
     * element each x[i] is: right in the default mode (whose layout it assumes), wrong
     * in strict mode (a permuted layout, as a GPU's is another). */
    require_device();
    float in[256], scale[16], out[256];
    for (int i = 0; i < 256; i++) in[i] = (float)(i % 7 + 1);
    for (int r = 0; r < 16; r++) scale[r] = (float)(r + 2);
    for (int strict = 0; strict < 2; strict++) {
        ab_emu_set_strict(strict);
        cr_assert_eq(selftest_wmma_layout_reliant(in, scale, out), 0, "%s", ab_error());
        int wrong = 0;
        for (int e = 0; e < 256; e++) wrong += out[e] != in[e] * scale[e / 16];
        if (strict) cr_assert_gt(wrong, 128, "strict mode: only %d of 256 entries wrong", wrong);
        else cr_assert_eq(wrong, 0, "default mode: %d entries wrong", wrong);
    }
}

Test(cuda_emulator, wmma_misaligned_pointer_aborts, .signal = SIGABRT) {
    require_device();
    selftest_wmma_misaligned();
}

Test(cuda_emulator, wmma_in_half_a_warp_aborts, .signal = SIGABRT) {
    require_device();
    selftest_wmma_divergent();
}

Test(cuda_emulator, fresh_device_memory_is_poisoned) {
    /* cudaMalloc'ed memory reads as NaN until written, so reading it first shows. */
    require_device();
    void *d;
    float h[4];
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &d, sizeof h), 0);
    cr_assert_eq(ab_dev_download(AB_DEV_CUDA, h, d, sizeof h), 0);
    for (int i = 0; i < 4; i++) cr_assert(isnan(h[i]));
    ab_dev_free(AB_DEV_CUDA, d);
    cr_assert(ab_cuda_emulated());
}
#endif
