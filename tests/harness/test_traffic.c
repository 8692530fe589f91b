/* The emulator's memory traffic counting (tests/cuda_emu/cuda_emu.h, "Memory traffic";
 * harness/cuda_traffic.h), on kernels whose traffic is known by construction
 * (traffic_kernels.cu), on cuBLAS, CUB, memsets and copies; then the attention kernels
 * held to their traffic (traffic_util.h).
 *
 * Linked to the traffic library where the build has it; elsewhere (a sanitized build,
 * a compiler other than GCC) every test skips, saying why. */
#include "cuda_device.h"
#include "cuda_traffic.h"
#include "device.h"
#include "error.h"
#include "test_util.h"
#include "traffic_util.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int traffic_copy(const float *x, float *y, long long n, int blocks);
int traffic_twice(const float *x, float *y, long long n);
int traffic_strided(const float *x, float *y, long long n, int stride);
int traffic_smem_reverse(const float *x, float *y, int blocks, int n);
int traffic_local_array(const float *x, float *y, long long n);
int traffic_atomic(const int *x, long long n, int *hist, int bins);
int traffic_add4(const float *x, float *y, long long n4);
int traffic_sgemm(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, long long sa,
                  const float *B, int ldb, long long sb, float beta, float *C, int ldc, long long sc, int batch);
int traffic_d2d(void *dst, const void *src, size_t bytes);
int traffic_sort(void *temp, size_t *temp_bytes, const unsigned *keys, unsigned *keys_out, const int *vals,
                 int *vals_out, int n);

/* ---- helpers ---- */

static void require_counting(void) {
    cr_assert_eq(ab_cuda_init(), 0, "the emulated device: %s", ab_error());
#if TEST_TRAFFIC_EXPECTED
    /* the build has the traffic library: a test binary that does not count is a broken link */
    cr_assert(ab_cuda_traffic_counted(), "the build has the traffic library, but this binary does not count");
#endif
    if (!ab_cuda_traffic_counted()) cr_skip_test("%s", TT_NOT_COUNTED);
}

/* n floats on the device: normal(0, 1) from (1, stream), or zero. */
static float *dev_floats(size_t n, uint64_t stream, bool zero) {
    float *d = NULL, *h = zero ? tu_alloc_f(n) : tu_normal(n, 1, stream, 1.0);
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, (void **)&d, n * sizeof(float)), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d, h, n * sizeof(float)), 0, "%s", ab_error());
    free(h);
    return d;
}

static ab_traffic_counts total(void) {
    ab_traffic_counts c;
    ab_cuda_traffic_total(&c, NULL, NULL);
    return c;
}

/* The counts of the operation named `name` since the last start (asserted present). */
static ab_traffic_counts entry(const char *name, ab_traffic_kind want_kind) {
    for (int i = 0, n = ab_cuda_traffic_entries(); i < n; i++) {
        ab_traffic_kind kind;
        ab_traffic_counts c;
        const char *nm = ab_cuda_traffic_entry(i, &kind, &c);
        if (strcmp(nm, name) == 0) {
            cr_assert_eq(kind, want_kind, "%s: kind %s, want %s", name, ab_traffic_kind_name(kind),
                         ab_traffic_kind_name(want_kind));
            return c;
        }
    }
    cr_assert_fail("no operation named %s was counted", name);
    return (ab_traffic_counts){0};
}

#define EXPECT_COUNTS(c, l, rr, rw, dr, dw)                                                                            \
    do {                                                                                                               \
        cr_expect_eq((c).launches, (unsigned long long)(l), "launches %llu, want %llu", (c).launches,                 \
                     (unsigned long long)(l));                                                                         \
        cr_expect_eq((c).req_read, (unsigned long long)(rr), "requested reads %llu, want %llu", (c).req_read,          \
                     (unsigned long long)(rr));                                                                        \
        cr_expect_eq((c).req_write, (unsigned long long)(rw), "requested writes %llu, want %llu", (c).req_write,       \
                     (unsigned long long)(rw));                                                                        \
        cr_expect_eq((c).dram_read, (unsigned long long)(dr), "DRAM reads %llu, want %llu", (c).dram_read,             \
                     (unsigned long long)(dr));                                                                        \
        cr_expect_eq((c).dram_write, (unsigned long long)(dw), "DRAM writes %llu, want %llu", (c).dram_write,          \
                     (unsigned long long)(dw));                                                                        \
    } while (0)

/* Device allocations are 256-byte aligned (cudaMalloc's alignment, the emulator's
 * default mode: this suite runs without AB_EMU_STRICT), so an array of a multiple of 8
 * floats covers whole 32-byte sectors and the expected DRAM bytes are exact. */

/* ---- kernels with known traffic ---- */

Test(traffic, copy_moves_twice_its_bytes) {
    require_counting();
    const long long n = 4096; /* 16 KiB: 512 sectors */
    float *x = dev_floats(n, 1, false), *y = dev_floats(n, 2, true);
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_copy(x, y, n, 3), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    EXPECT_COUNTS(total(), 1, 4 * n, 4 * n, 4 * n, 4 * n);
    EXPECT_COUNTS(entry("copy_kernel", AB_TRAFFIC_KERNEL), 1, 4 * n, 4 * n, 4 * n, 4 * n);
    cr_expect_eq(ab_cuda_traffic_entries(), 1);
    ab_dev_free(AB_DEV_CUDA, x);
    ab_dev_free(AB_DEV_CUDA, y);
}

Test(traffic, reading_twice_doubles_requests_not_dram) {
    require_counting();
    const long long n = 2048;
    float *x = dev_floats(n, 1, false), *y = dev_floats(n, 2, true);
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_twice(x, y, n), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    EXPECT_COUNTS(total(), 1, 8 * n, 4 * n, 4 * n, 4 * n);
    ab_dev_free(AB_DEV_CUDA, x);
    ab_dev_free(AB_DEV_CUDA, y);
}

Test(traffic, strided_reads_count_whole_sectors) {
    require_counting();
    const long long n = 512;
    float *x = dev_floats(8 * n, 1, false), *y = dev_floats(n, 2, true);
    /* stride 8 floats = 32 bytes: one sector read for every 4 bytes requested */
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_strided(x, y, n, 8), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    EXPECT_COUNTS(total(), 1, 4 * n, 4 * n, 32 * n, 4 * n);
    /* stride 2: every sector of the first 2n floats, half of each used */
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_strided(x, y, n, 2), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    EXPECT_COUNTS(total(), 1, 4 * n, 4 * n, 8 * n, 4 * n);
    ab_dev_free(AB_DEV_CUDA, x);
    ab_dev_free(AB_DEV_CUDA, y);
}

Test(traffic, launches_do_not_share_a_cache) {
    require_counting();
    const long long n = 1024;
    float *x = dev_floats(n, 1, false), *y = dev_floats(n, 2, true);
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_copy(x, y, n, 2), 0, "%s", ab_error());
    cr_assert_eq(traffic_copy(y, x, n, 2), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    /* the second launch reads what the first wrote: read again from DRAM */
    EXPECT_COUNTS(total(), 2, 8 * n, 8 * n, 8 * n, 8 * n);
    EXPECT_COUNTS(entry("copy_kernel", AB_TRAFFIC_KERNEL), 2, 8 * n, 8 * n, 8 * n, 8 * n);
    ab_dev_free(AB_DEV_CUDA, x);
    ab_dev_free(AB_DEV_CUDA, y);
}

Test(traffic, shared_memory_and_the_stack_are_not_device_memory) {
    require_counting();
    const int blocks = 4, n = 200; /* 800 bytes a block: 25 sectors */
    float *x = dev_floats((size_t)blocks * n, 1, false), *y = dev_floats((size_t)blocks * n, 2, true);
    const long long bytes = 4LL * blocks * n;
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_smem_reverse(x, y, blocks, n), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    EXPECT_COUNTS(total(), 1, bytes, bytes, bytes, bytes);
    /* a local array the compiler keeps on the thread's stack: only y's stores count (x
     * is read once or more, as the compiler chooses; its sectors once) */
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_local_array(x, y, (long long)blocks * n), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    ab_traffic_counts c = total();
    cr_expect_eq(c.req_write, (unsigned long long)bytes);
    cr_expect_eq(c.dram_read, (unsigned long long)bytes);
    cr_expect_eq(c.dram_write, (unsigned long long)bytes);
    cr_expect(c.req_read >= (unsigned long long)bytes && c.req_read <= 16ULL * bytes, "requested reads %llu",
              c.req_read);
    ab_dev_free(AB_DEV_CUDA, x);
    ab_dev_free(AB_DEV_CUDA, y);
}

Test(traffic, atomics_read_and_write_their_word) {
    require_counting();
    const long long n = 1024;
    const int bins = 8; /* 32 bytes: one sector */
    int *hx = malloc(n * sizeof(int)), *x = NULL, *hist = NULL;
    tu_fill_int(hx, n, 1, 7, 0, 1000);
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, (void **)&x, n * sizeof(int)), 0);
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, x, hx, n * sizeof(int)), 0);
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, (void **)&hist, bins * sizeof(int)), 0);
    cr_assert_eq(ab_dev_memset(AB_DEV_CUDA, hist, 0, bins * sizeof(int)), 0);
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_atomic(x, n, hist, bins), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    /* x read once; each atomic reads and writes 4 bytes of the one sector of hist */
    EXPECT_COUNTS(total(), 1, 4 * n + 4 * n, 4 * n, 4 * n + 32, 32);
    free(hx);
    ab_dev_free(AB_DEV_CUDA, x);
    ab_dev_free(AB_DEV_CUDA, hist);
}

Test(traffic, vector_accesses_count_their_16_bytes) {
    require_counting();
    const long long n4 = 300; /* 4800 bytes: 150 sectors */
    float *x = dev_floats(4 * n4, 1, false), *y = dev_floats(4 * n4, 2, false);
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_add4(x, y, n4), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    EXPECT_COUNTS(total(), 1, 32 * n4, 16 * n4, 32 * n4, 16 * n4);
    ab_dev_free(AB_DEV_CUDA, x);
    ab_dev_free(AB_DEV_CUDA, y);
}

Test(traffic, nothing_is_counted_outside_start_and_stop) {
    require_counting();
    const long long n = 512;
    float *x = dev_floats(n, 1, false), *y = dev_floats(n, 2, true);
    ab_cuda_traffic_start();
    ab_cuda_traffic_stop();
    cr_assert_eq(traffic_copy(x, y, n, 1), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_memset(AB_DEV_CUDA, y, 0, 4 * n), 0);
    EXPECT_COUNTS(total(), 0, 0, 0, 0, 0);
    cr_expect_eq(ab_cuda_traffic_entries(), 0);
    /* start zeroes what an earlier counting left */
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_copy(x, y, n, 1), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    ab_cuda_traffic_start();
    ab_cuda_traffic_stop();
    EXPECT_COUNTS(total(), 0, 0, 0, 0, 0);
    ab_dev_free(AB_DEV_CUDA, x);
    ab_dev_free(AB_DEV_CUDA, y);
}

/* ---- the emulator's own operations ---- */

Test(traffic, cublas_reads_each_operand_once) {
    require_counting();
    /* column-major C (m x n) = A (m x k) B (k x n); every column a multiple of 8 floats */
    const int m = 32, n = 16, k = 8;
    float *A = dev_floats((size_t)m * k, 1, false), *B = dev_floats((size_t)k * n, 2, false);
    float *C = dev_floats((size_t)m * n, 3, true);
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_sgemm(0, 0, m, n, k, 1.0f, A, m, 0, B, k, 0, 0.0f, C, m, 0, 1), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    const long long ab = 4LL * (m * k + k * n), c = 4LL * m * n;
    EXPECT_COUNTS(entry("cublasSgemm", AB_TRAFFIC_CUBLAS), 1, ab, c, ab, c);
    /* beta != 0 reads C too */
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_sgemm(0, 0, m, n, k, 1.0f, A, m, 0, B, k, 0, 1.0f, C, m, 0, 1), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    EXPECT_COUNTS(total(), 1, ab + c, c, ab + c, c);
    ab_dev_free(AB_DEV_CUDA, A);
    ab_dev_free(AB_DEV_CUDA, B);
    ab_dev_free(AB_DEV_CUDA, C);
}

Test(traffic, cublas_counts_elements_not_the_gaps_between_columns) {
    require_counting();
    /* A is the top 32 rows of a 40-row matrix (lda 40: 160 bytes, 5 whole sectors, per
     * column): its 8 rows past the 32 are never read */
    const int m = 32, n = 16, k = 8, lda = 40;
    float *A = dev_floats((size_t)lda * k, 1, false), *B = dev_floats((size_t)k * n, 2, false);
    float *C = dev_floats((size_t)m * n, 3, true);
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_sgemm(0, 0, m, n, k, 1.0f, A, lda, 0, B, k, 0, 0.0f, C, m, 0, 1), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    const long long ab = 4LL * (m * k + k * n), c = 4LL * m * n;
    EXPECT_COUNTS(total(), 1, ab, c, ab, c);
    ab_dev_free(AB_DEV_CUDA, A);
    ab_dev_free(AB_DEV_CUDA, B);
    ab_dev_free(AB_DEV_CUDA, C);
}

Test(traffic, batched_cublas_is_one_launch_and_reads_a_shared_operand_once) {
    require_counting();
    /* 4 products C_b = A B_b with A broadcast (stride 0): A requested 4 times, read from
     * DRAM once */
    const int m = 16, n = 8, k = 8, batch = 4;
    float *A = dev_floats((size_t)m * k, 1, false), *B = dev_floats((size_t)k * n * batch, 2, false);
    float *C = dev_floats((size_t)m * n * batch, 3, true);
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_sgemm(0, 0, m, n, k, 1.0f, A, m, 0, B, k, (long long)k * n, 0.0f, C, m, (long long)m * n,
                               batch),
                 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    const long long a = 4LL * m * k, b = 4LL * k * n * batch, c = 4LL * m * n * batch;
    EXPECT_COUNTS(entry("cublasSgemmStridedBatched", AB_TRAFFIC_CUBLAS), 1, batch * a + b, c, a + b, c);
    ab_dev_free(AB_DEV_CUDA, A);
    ab_dev_free(AB_DEV_CUDA, B);
    ab_dev_free(AB_DEV_CUDA, C);
}

Test(traffic, memsets_copies_and_transfers) {
    require_counting();
    const size_t bytes = 4096;
    float *x = dev_floats(bytes / 4, 1, false), *y = dev_floats(bytes / 4, 2, true);
    float *h = tu_alloc_f(bytes / 4);
    ab_cuda_traffic_start();
    cr_assert_eq(ab_dev_memset(AB_DEV_CUDA, y, 0, 1000), 0, "%s", ab_error()); /* 1000 bytes: 32 sectors */
    cr_assert_eq(traffic_d2d(y, x, bytes), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, x, h, bytes), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_download(AB_DEV_CUDA, h, y, 512), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_sync(AB_DEV_CUDA), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    EXPECT_COUNTS(entry("cudaMemset", AB_TRAFFIC_MEMSET), 1, 0, 1000, 0, 1024);
    EXPECT_COUNTS(entry("cudaMemcpy(DeviceToDevice)", AB_TRAFFIC_MEMCPY), 1, bytes, bytes, bytes, bytes);
    /* host<->device copies are not device traffic: counted apart */
    unsigned long long h2d, d2h;
    ab_traffic_counts c;
    ab_cuda_traffic_total(&c, &h2d, &d2h);
    EXPECT_COUNTS(c, 2, bytes, 1000 + bytes, bytes, 1024 + bytes);
    cr_expect_eq(h2d, bytes);
    cr_expect_eq(d2h, 512);
    cr_expect_eq(ab_cuda_traffic_entries(), 2);
    free(h);
    ab_dev_free(AB_DEV_CUDA, x);
    ab_dev_free(AB_DEV_CUDA, y);
}

Test(traffic, radix_sort_reads_and_writes_its_pairs_once) {
    require_counting();
    const int n = 1000; /* 4000 bytes per array: 125 sectors */
    unsigned *keys = NULL, *keys_out = NULL;
    int *vals = NULL, *vals_out = NULL;
    void *temp = NULL;
    int *hk = malloc(n * sizeof(int));
    tu_fill_int(hk, n, 1, 8, 0, 1 << 20);
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, (void **)&keys, n * 4), 0);
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, (void **)&keys_out, n * 4), 0);
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, (void **)&vals, n * 4), 0);
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, (void **)&vals_out, n * 4), 0);
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, keys, hk, n * 4), 0);
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, vals, hk, n * 4), 0);
    size_t temp_bytes = 0;
    cr_assert_eq(traffic_sort(NULL, &temp_bytes, keys, keys_out, vals, vals_out, n), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &temp, temp_bytes), 0);
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_sort(temp, &temp_bytes, keys, keys_out, vals, vals_out, n), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    EXPECT_COUNTS(entry("cub::DeviceRadixSort::SortPairs", AB_TRAFFIC_SORT), 1, 8 * n, 8 * n, 8 * n, 8 * n);
    free(hk);
    ab_dev_free(AB_DEV_CUDA, keys);
    ab_dev_free(AB_DEV_CUDA, keys_out);
    ab_dev_free(AB_DEV_CUDA, vals);
    ab_dev_free(AB_DEV_CUDA, vals_out);
    ab_dev_free(AB_DEV_CUDA, temp);
}

Test(traffic, the_names_add_up_to_the_total) {
    require_counting();
    const long long n = 1024;
    float *x = dev_floats(n, 1, false), *y = dev_floats(n, 2, true);
    ab_cuda_traffic_start();
    cr_assert_eq(traffic_copy(x, y, n, 2), 0, "%s", ab_error());
    cr_assert_eq(traffic_twice(y, x, n), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_memset(AB_DEV_CUDA, y, 0, 4 * n), 0);
    cr_assert_eq(traffic_copy(x, y, n, 2), 0, "%s", ab_error());
    ab_cuda_traffic_stop();
    ab_traffic_counts sum = {0}, t = total();
    const char *want[] = {"copy_kernel", "twice_kernel", "cudaMemset"};
    cr_assert_eq(ab_cuda_traffic_entries(), 3);
    for (int i = 0; i < 3; i++) {
        ab_traffic_counts c;
        const char *name = ab_cuda_traffic_entry(i, NULL, &c);
        cr_expect_str_eq(name, want[i], "operations in order of first appearance");
        sum.launches += c.launches, sum.req_read += c.req_read, sum.req_write += c.req_write;
        sum.dram_read += c.dram_read, sum.dram_write += c.dram_write;
    }
    cr_expect_null(ab_cuda_traffic_entry(3, NULL, NULL));
    EXPECT_COUNTS(sum, t.launches, t.req_read, t.req_write, t.dram_read, t.dram_write);
    EXPECT_COUNTS(t, 4, 4 * n + 8 * n + 4 * n, 4 * n + 4 * n + 4 * n + 4 * n, 12 * n, 16 * n);
    ab_dev_free(AB_DEV_CUDA, x);
    ab_dev_free(AB_DEV_CUDA, y);
}

/* ---- the attention kernels held to their traffic ---- */

/* The fast kernels held to the traffic their checks below name. Each check measures
 * today's kernels and prints its ratio (in the test log); it asserts its threshold only
 * for a name in this list, so that holding a kernel to it is uncommenting one line
 * here, once the kernel that meets it has landed. */
static const char *const HELD_TO_TRAFFIC[] = {
    "linear", /* linear (elu) causal forward+backward: DRAM bytes <= 3x the minimal */
    "softmax", /* softmax causal forward+backward: DRAM bytes grow as N between N = 512 and 2048 */
    "decode", /* stateful-softmax step: reads its key/value cache once */
    NULL,
};

static bool held(const char *name) {
    for (int i = 0; HELD_TO_TRAFFIC[i]; i++)
        if (strcmp(HELD_TO_TRAFFIC[i], name) == 0) return true;
    return false;
}

/* The checks' shape: one batch entry of 2 heads, D = M = 16 (small for the emulator,
 * and what the BEFORE table of experiments/sweep/TRAFFIC.md measures). */
static attn_shape shape(int n) { return (attn_shape){1, 2, n, 16, 16, true, NULL}; }

Test(traffic_held, linear_forward_backward_moves_at_most_3x_its_bytes, .timeout = 300) {
    require_counting();
    attn_shape s = shape(2048);
    tt_traffic t;
    cr_assert_eq(tt_fwd_bwd("linear", NULL, 0, &s, 1, &t), 0, "%s", attn_error());
    tt_print("linear causal fwd+bwd N=2048", &t);
    const double ratio = tt_dram(&t) / tt_min(&t);
    cr_expect(ratio > 1.0, "DRAM/min %.3f: the inputs must be read and the outputs written", ratio);
    /* 3x: q, k, v, dout read and out, dq, dk, dv written once each is 1x; a chunked
     * kernel that also writes and reads back per-chunk states of D x M per chunk of 64
     * (its forward and its backward) adds well under 1x at D = M = 16, and recomputing
     * the forward in the backward another 1x at most. */
    if (held("linear")) cr_expect_leq(ratio, 3.0, "linear fwd+bwd moves %.2fx its minimal bytes (held to 3x)", ratio);
}

Test(traffic_held, softmax_traffic_grows_as_n, .timeout = 600) {
    require_counting();
    tt_traffic t512, t2048;
    attn_shape s = shape(512);
    cr_assert_eq(tt_fwd_bwd("softmax", NULL, 0, &s, 1, &t512), 0, "%s", attn_error());
    tt_print("softmax causal fwd+bwd N=512", &t512);
    s = shape(2048);
    cr_assert_eq(tt_fwd_bwd("softmax", NULL, 0, &s, 1, &t2048), 0, "%s", attn_error());
    tt_print("softmax causal fwd+bwd N=2048", &t2048);
    const double exponent = log(tt_dram(&t2048) / tt_dram(&t512)) / log(4.0);
    fprintf(stderr, "traffic: softmax DRAM bytes grow as N^%.3f between N = 512 and 2048\n", exponent);
    cr_expect(exponent > 0.5, "DRAM bytes grow as N^%.3f: less than the inputs' own growth", exponent);
    /* 1.1: traffic linear in N gives 1 (a little less with fixed costs), the N x N
     * probabilities written and read back give about 2; 1.1 admits an N^2 part of at
     * most about 5% of the bytes at N = 512. */
    if (held("softmax")) cr_expect_leq(exponent, 1.1, "softmax's DRAM bytes grow as N^%.2f (held to N^1.1)", exponent);
}

Test(traffic_held, decode_step_reads_the_cache_once, .timeout = 300) {
    require_counting();
    attn_shape s = shape(1024); /* the step at position 1024, after a prefill of 1024 */
    tt_traffic t;
    cr_assert_eq(tt_step("stateful-softmax", NULL, 0, &s, 1, &t), 0, "%s", attn_error());
    tt_print("stateful-softmax step at 1024", &t);
    const double ratio = (double)t.total.dram_read / t.min_read;
    fprintf(stderr, "traffic: the step's DRAM reads are %.3fx its minimal reads (the cache and q, k, v)\n", ratio);
    cr_expect(ratio > 0.99, "DRAM reads %.3fx the minimal: the cache is not read whole", ratio);
    /* 1.15: the cache (D + M floats a position) read once plus q, k, v is 1x; a score
     * per position written and read back between kernels, even three passes over it,
     * adds 3/(D + M) ~ 9% at D = M = 16; a second read of K or V adds 50%. */
    if (held("decode"))
        cr_expect_leq(ratio, 1.15, "the decode step reads %.2fx its minimal bytes (held to 1.15x)", ratio);
}
