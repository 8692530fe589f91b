/* Harness runtime: Philox RNG, tracked allocator, ab_sgemm, .npy files, atomic writes. */
#include "test_harness.h"

/* ------------------------------------------------------------------------------------
 * Helpers: a private scratch folder under the build's test folder, and raw file I/O.
 * ---------------------------------------------------------------------------------- */

char g_dir[600];

void scratch_setup(void) { tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/harness-tmp"); }

void scratch_teardown(void) { tp_rm_tree(g_dir); }

const char *path_in(const char *name) {
    static char p[1024];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    return p;
}

/* Case-insensitive strstr (strcasestr is a GNU extension). */
bool contains_nocase(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; hay++)
        if (strncasecmp(hay, needle, n) == 0) return true;
    return n == 0;
}

/* Builds a .npy file by hand: magic, version, header length (2 bytes for 1.x, 4 for
 * 2.x/3.x), the dict padded with spaces and a final '\n' so the preamble + header is a
 * multiple of 64, then `data`. Returns the byte count written into buf. */
static size_t make_npy(unsigned char *buf, int major, const char *dict, const void *data, size_t data_bytes) {
    size_t pre = major == 1 ? 10 : 12;
    size_t dl = strlen(dict);
    size_t total = pre + dl + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = dl + pad + 1;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = 0;
    buf[8] = (unsigned char)(hlen & 0xff);
    buf[9] = (unsigned char)((hlen >> 8) & 0xff);
    if (major != 1) {
        buf[10] = (unsigned char)((hlen >> 16) & 0xff);
        buf[11] = (unsigned char)((hlen >> 24) & 0xff);
    }
    memcpy(buf + pre, dict, dl);
    memset(buf + pre + dl, ' ', pad);
    buf[pre + dl + pad] = '\n';
    if (data_bytes) memcpy(buf + pre + hlen, data, data_bytes);
    return pre + hlen + data_bytes;
}

/* ------------------------------------------------------------------------------------
 * Philox4x32-10
 * ---------------------------------------------------------------------------------- */

/* Known-answer vectors published with Random123 (kat_vectors, philox4x32 R=10).
 * ab_philox4x32(seed, stream, index) uses counter = (index lo, index hi, stream lo,
 * stream hi) and key = (seed lo, seed hi). */
Test(rng, philox_known_answers) {
    static const struct {
        uint32_t ctr[4], key[2], want[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
         {0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
         {0xa4093822u, 0x299f31d0u},
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    for (size_t t = 0; t < sizeof kat / sizeof kat[0]; t++) {
        uint64_t index = (uint64_t)kat[t].ctr[1] << 32 | kat[t].ctr[0];
        uint64_t stream = (uint64_t)kat[t].ctr[3] << 32 | kat[t].ctr[2];
        uint64_t seed = (uint64_t)kat[t].key[1] << 32 | kat[t].key[0];
        uint32_t out[4];
        ab_philox4x32(seed, stream, index, out);
        for (int w = 0; w < 4; w++)
            cr_assert_eq(out[w], kat[t].want[w], "vector %zu word %d: got %08x, want %08x", t, w, out[w],
                         kat[t].want[w]);
    }
}

/* rng.h documents how uniform and normal numbers derive from the Philox words; the CUDA
 * backend relies on the same formulas, so pin them down. */
Test(rng, documented_derivation) {
    double worst = 0;
    for (uint64_t i = 0; i < 200000; i++) {
        uint32_t w[4];
        ab_philox4x32(42, 3, i, w);
        double u = ((double)(w[0] >> 8) + 0.5) / 16777216.0;
        cr_assert_eq(ab_rng_uniform(42, 3, i), u, "uniform index %llu", (unsigned long long)i);

        ab_philox4x32(42, 3, i >> 1, w);
        double u0 = ((double)(w[0] >> 8) + 0.5) / 16777216.0, u1 = ((double)(w[1] >> 8) + 0.5) / 16777216.0;
        double r = sqrt(-2.0 * log(u0)), a = 2.0 * M_PI * u1;
        double z = (i & 1) ? r * sin(a) : r * cos(a);
        double e = fabs(ab_rng_normal(42, 3, i) - z) / fmax(1.0, fabs(z));
        worst = fmax(worst, e);
        /* The same formula with libm: rng_core.h's log, sin and cos are within a few
         * ulps of libm's (and 2 pi u1 is rounded here): measured up to 2.7e-15
         * relative, so 2e-14 is a 7x margin; a wrong quadrant, sign or constant is
         * O(1). */
        cr_assert(e <= 2e-14, "normal index %llu: %.17g vs libm %.17g", (unsigned long long)i,
                  ab_rng_normal(42, 3, i), z);
    }
    cr_assert_gt(worst, 0.0, "no difference at all from libm over 200000 draws: is libm being called?");
}

/* The pieces of rng_core.h against libm on the whole domain they are used on:
 * u = (k + 1/2) / 2^24. log: measured within 1.0 DBL_EPSILON relative (over the
 * first and last 4096 k and 200000 random ones); sin and cos: within 7e-16 absolute
 * (libm's own argument 2 pi u is rounded). Bounds 4x and 3x those. */
Test(rng, core_log_sincos_accuracy) {
    double wl = 0, ws = 0;
    for (uint32_t t = 0; t < 4096 + 4096 + 200000; t++) {
        uint32_t k, w[4];
        ab_philox4x32(9, 9, t, w);
        k = t < 4096 ? t : t < 8192 ? 0xffffffu - (t - 4096) : w[2] >> 8;
        double u = ((double)k + 0.5) / 16777216.0;
        wl = fmax(wl, fabs(ab_rng_log_core(u) - log(u)) / fabs(log(u)));
        double s, c;
        ab_rng_sincos_2pi_core(u, &s, &c);
        ws = fmax(ws, fmax(fabs(s - sin(2.0 * M_PI * u)), fabs(c - cos(2.0 * M_PI * u))));
    }
    cr_assert_leq(wl, 4 * DBL_EPSILON, "log: worst relative error %.3g", wl);
    cr_assert_leq(ws, 2e-15, "sin/cos: worst absolute error %.3g", ws);
}

/* The normals are pinned bit for bit (a hash of 100000 of them): rng_core.h is written so
 * that no compiler contraction or library can change a bit, and the CUDA backend draws
 * the same doubles (test_cuda.c compares it with this). A change here changes every
 * seeded number of the project: update the constant only on purpose. */
Test(rng, normals_pinned_bit_for_bit) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the 8 bytes of each double */
    for (uint64_t i = 0; i < 100000; i++) {
        double z = ab_rng_normal(7, i % 5, i * 3);
        uint64_t b;
        memcpy(&b, &z, sizeof b);
        for (int k = 0; k < 8; k++) h = (h ^ ((b >> (8 * k)) & 0xff)) * 1099511628211ull;
    }
    cr_assert_eq(h, 0x9dbebf0047dc024cull, "hash of the normals %016llx", (unsigned long long)h);
}

#define N_DRAWS 200000
/* Every bound below is 5 standard errors of the estimator for N_DRAWS independent draws:
 * a correct generator lands outside with probability < 6e-7, and since the seed is fixed
 * the outcome is deterministic. */
#define N_SE 5.0

Test(rng, uniform_range_mean_variance) {
    double sum = 0, sum2 = 0, lo = 1, hi = 0;
    for (uint64_t i = 0; i < N_DRAWS; i++) {
        double u = ab_rng_uniform(1234, 7, i);
        cr_assert(u > 0.0 && u < 1.0, "draw %llu = %.17g is outside (0, 1)", (unsigned long long)i, u);
        lo = fmin(lo, u);
        hi = fmax(hi, u);
        sum += u;
        sum2 += (u - 0.5) * (u - 0.5);
    }
    double mean = sum / N_DRAWS, var = sum2 / N_DRAWS;
    /* Mean of U(0,1): 1/2, standard error sqrt(1/12 / n) = 6.5e-4. */
    double se_mean = sqrt(1.0 / 12.0 / N_DRAWS);
    cr_assert(fabs(mean - 0.5) < N_SE * se_mean, "mean %.6f", mean);
    /* Variance 1/12; (U - 1/2)^2 has variance E(U-1/2)^4 - (1/12)^2 = 1/80 - 1/144 = 1/180,
     * so the estimator's standard error is sqrt(1/180 / n) = 1.7e-4. */
    double se_var = sqrt(1.0 / 180.0 / N_DRAWS);
    cr_assert(fabs(var - 1.0 / 12.0) < N_SE * se_var, "variance %.6f", var);
    /* With 2^24 levels, 200k draws come within 1e-3 of both ends unless the generator
     * avoids them (expected gap ~ 1/n = 5e-6). */
    cr_assert(lo < 1e-3 && hi > 1.0 - 1e-3, "range [%g, %g]", lo, hi);
}

Test(rng, normal_mean_variance_tails) {
    double sum = 0, sum2 = 0, cross = 0;
    long beyond2 = 0;
    for (uint64_t i = 0; i < N_DRAWS; i++) {
        double z = ab_rng_normal(99, 0, i);
        cr_assert(isfinite(z));
        sum += z;
        sum2 += z * z;
        if (fabs(z) > 2.0) beyond2++;
        if (i & 1) cross += z * ab_rng_normal(99, 0, i - 1);
    }
    double mean = sum / N_DRAWS, var = sum2 / N_DRAWS - mean * mean;
    /* Standard error of the mean: 1/sqrt(n) = 2.2e-3. */
    cr_assert(fabs(mean) < N_SE / sqrt(N_DRAWS), "mean %.6f", mean);
    /* Var(Z^2) = 2 for a standard normal: standard error sqrt(2/n) = 3.2e-3. */
    cr_assert(fabs(var - 1.0) < N_SE * sqrt(2.0 / N_DRAWS), "variance %.6f", var);
    /* P(|Z| > 2) = 0.0455003; binomial standard error sqrt(p(1-p)/n) = 4.7e-4. */
    double p = 0.04550026389635842, frac = (double)beyond2 / N_DRAWS;
    cr_assert(fabs(frac - p) < N_SE * sqrt(p * (1 - p) / N_DRAWS), "fraction beyond 2 sigma %.6f", frac);
    /* The two normals of one Box-Muller pair (cos and sin) are independent: the mean of
     * their product over n/2 pairs has standard error sqrt(1 / (n/2)) = 3.2e-3. */
    double corr = cross / (N_DRAWS / 2);
    cr_assert(fabs(corr) < N_SE * sqrt(2.0 / N_DRAWS), "pair correlation %.6f", corr);
}

Test(rng, determinism_and_streams) {
    for (uint64_t i = 0; i < 100; i++) {
        cr_assert_eq(ab_rng_uniform(5, 1, i), ab_rng_uniform(5, 1, i));
        cr_assert_eq(ab_rng_normal(5, 1, i), ab_rng_normal(5, 1, i));
    }
    /* Different streams, seeds and indices give different words (a collision of all 128
     * bits has probability 2^-128). */
    uint32_t a[4], b[4], c[4], d[4];
    ab_philox4x32(5, 1, 10, a);
    ab_philox4x32(5, 2, 10, b);
    ab_philox4x32(6, 1, 10, c);
    ab_philox4x32(5, 1, 11, d);
    cr_assert_neq(memcmp(a, b, sizeof a), 0, "streams 1 and 2 agree");
    cr_assert_neq(memcmp(a, c, sizeof a), 0, "seeds 5 and 6 agree");
    cr_assert_neq(memcmp(a, d, sizeof a), 0, "indices 10 and 11 agree");
    /* High halves of the 64-bit arguments matter too. */
    ab_philox4x32(5, 1 + (1ull << 32), 10, b);
    ab_philox4x32(5 + (1ull << 32), 1, 10, c);
    ab_philox4x32(5, 1, 10 + (1ull << 32), d);
    cr_assert_neq(memcmp(a, b, sizeof a), 0);
    cr_assert_neq(memcmp(a, c, sizeof a), 0);
    cr_assert_neq(memcmp(a, d, sizeof a), 0);
    /* Over 1000 draws, streams 1 and 2 agree nowhere (2^24 levels: expected 6e-5 ties). */
    int same = 0;
    for (uint64_t i = 0; i < 1000; i++) same += ab_rng_uniform(5, 1, i) == ab_rng_uniform(5, 2, i);
    cr_assert_eq(same, 0);

    /* The cursor walks the same sequence as the indexed calls. */
    ab_rng r = ab_rng_make(5, 1);
    for (uint64_t i = 0; i < 10; i++) cr_assert_eq(ab_rng_next_uniform(&r), ab_rng_uniform(5, 1, i));
    r = ab_rng_make(5, 1);
    for (uint64_t i = 0; i < 10; i++) cr_assert_eq(ab_rng_next_normal(&r), ab_rng_normal(5, 1, i));
}

Test(rng, next_below_range_and_balance) {
    enum { K = 7, DRAWS = 70000 };
    long count[K] = {0};
    ab_rng r = ab_rng_make(11, 4);
    for (int i = 0; i < DRAWS; i++) {
        uint32_t x = ab_rng_next_below(&r, K);
        cr_assert_lt(x, (uint32_t)K);
        count[x]++;
    }
    /* Each bin is binomial(n, 1/7): mean 10000, sd sqrt(n p (1-p)) = 92.6; 5 sd. */
    double sd = sqrt(DRAWS * (1.0 / K) * (1.0 - 1.0 / K));
    for (int j = 0; j < K; j++)
        cr_assert(fabs(count[j] - DRAWS / (double)K) < N_SE * sd, "bin %d has %ld", j, count[j]);
    r = ab_rng_make(11, 4);
    cr_assert_eq(ab_rng_next_below(&r, 1), 0u);
}

/* ------------------------------------------------------------------------------------
 * Tracked allocator
 * ---------------------------------------------------------------------------------- */

Test(memory, current_and_peak) {
    size_t base = ab_mem_current(AB_DEV_CPU);
    ab_mem_reset_peak(AB_DEV_CPU);
    cr_assert_eq(ab_mem_peak(AB_DEV_CPU), base);

    void *a = ab_alloc(1000);
    cr_assert_not_null(a);
    cr_assert_eq(ab_mem_current(AB_DEV_CPU), base + 1000, "current grows by exactly the requested bytes");
    cr_assert_eq(ab_alloc_size(a), 1000u);
    void *b = ab_alloc(333);
    cr_assert_not_null(b);
    cr_assert_eq(ab_mem_current(AB_DEV_CPU), base + 1333);
    cr_assert_eq(ab_mem_peak(AB_DEV_CPU), base + 1333);
    ab_free(a);
    cr_assert_eq(ab_mem_current(AB_DEV_CPU), base + 333, "current shrinks by exactly the freed block");
    cr_assert_eq(ab_mem_peak(AB_DEV_CPU), base + 1333, "peak keeps the maximum");
    void *c = ab_alloc(10);
    cr_assert_eq(ab_mem_peak(AB_DEV_CPU), base + 1333, "a smaller allocation leaves the peak");
    ab_mem_reset_peak(AB_DEV_CPU);
    cr_assert_eq(ab_mem_peak(AB_DEV_CPU), base + 343, "reset sets the peak to current");
    ab_free(b);
    ab_free(c);
    cr_assert_eq(ab_mem_current(AB_DEV_CPU), base);
    cr_assert_eq(ab_mem_peak(AB_DEV_CPU), base + 343);
    ab_free(NULL); /* allowed, no effect */
    cr_assert_eq(ab_mem_current(AB_DEV_CPU), base);

    /* Other devices are accounted separately. */
    size_t g0 = ab_mem_current(AB_DEV_CUDA);
    ab_mem_account(AB_DEV_CUDA, 4096);
    cr_assert_eq(ab_mem_current(AB_DEV_CUDA), g0 + 4096);
    cr_assert_geq(ab_mem_peak(AB_DEV_CUDA), g0 + 4096);
    cr_assert_eq(ab_mem_current(AB_DEV_CPU), base);
    ab_mem_account(AB_DEV_CUDA, -4096);
    cr_assert_eq(ab_mem_current(AB_DEV_CUDA), g0);
}

Test(memory, alignment_and_calloc) {
    static const size_t sizes[] = {1, 3, 63, 64, 65, 1000, 4096, 100003};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = ab_alloc(sizes[i]);
        cr_assert_not_null(p);
        cr_assert_eq((uintptr_t)p % 64, 0u, "ab_alloc(%zu) = %p is not 64-byte aligned", sizes[i], (void *)p);
        memset(p, 0xAB, sizes[i]); /* the whole block is writable */
        ab_free(p);
        /* Same size again: the allocator is likely to hand back the bytes just dirtied. */
        unsigned char *z = ab_calloc(sizes[i]);
        cr_assert_not_null(z);
        cr_assert_eq((uintptr_t)z % 64, 0u);
        for (size_t j = 0; j < sizes[i]; j++) cr_assert_eq(z[j], 0, "ab_calloc(%zu)[%zu] = %d", sizes[i], j, z[j]);
        ab_free(z);
    }
}

Test(memory, zero_and_huge_requests_fail_cleanly) {
    size_t base = ab_mem_current(AB_DEV_CPU);
    ab_clear_error();
    cr_assert_null(ab_alloc(0));
    cr_assert_neq(ab_error()[0], '\0', "ab_alloc(0) leaves a message");
    ab_clear_error();
    cr_assert_null(ab_calloc(0));
    cr_assert_neq(ab_error()[0], '\0');

    static const size_t huge[] = {SIZE_MAX / 2, SIZE_MAX - 64, SIZE_MAX};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        ab_clear_error();
        cr_assert_null(ab_alloc(huge[i]), "ab_alloc(%zu) should fail", huge[i]);
        cr_assert_neq(ab_error()[0], '\0', "ab_alloc(%zu) leaves a message", huge[i]);
        cr_assert_eq(ab_mem_current(AB_DEV_CPU), base, "a failed allocation is not counted");
    }
}

Test(device, names_and_parsing) {
    /* One device type: the names --device and the results use, parsed back; anything
     * else refused with one line naming it. */
    cr_assert_str_eq(ab_device_name(AB_DEV_CPU), "cpu");
    cr_assert_str_eq(ab_device_name(AB_DEV_CUDA), "cuda");
    cr_assert_str_eq(ab_device_name(7), "unknown");
    for (ab_device d = AB_DEV_CPU; d < AB_DEV_COUNT; d++) {
        ab_device back = AB_DEV_COUNT;
        cr_assert_eq(ab_device_parse(ab_device_name(d), &back), 0);
        cr_assert_eq(back, d);
    }
    ab_device out = AB_DEV_CUDA;
    cr_assert_eq(ab_device_parse("gpu", &out), AB_EINVAL);
    cr_assert_eq(out, AB_DEV_CUDA, "left unchanged on failure");
    cr_assert_str_eq(ab_error(), "device 'gpu': must be cpu or cuda");
    cr_assert_eq(ab_device_parse(NULL, &out), AB_EINVAL);
    cr_assert(ab_dev_host_memory(AB_DEV_CPU));
    cr_assert_not(ab_dev_host_memory(AB_DEV_CUDA));
    cr_assert_eq(ab_dev_init(AB_DEV_CPU), 0);
}

Test(memory, mul_size_overflow) {
    size_t r = 12345;
    cr_assert_eq(ab_mul_size(6, 7, &r), 0);
    cr_assert_eq(r, 42u);
    cr_assert_eq(ab_mul_size(0, SIZE_MAX, &r), 0);
    cr_assert_eq(r, 0u);
    cr_assert_eq(ab_mul_size(SIZE_MAX, 1, &r), 0);
    cr_assert_eq(r, SIZE_MAX);
    cr_assert_eq(ab_mul_size(SIZE_MAX / 2 + 1, 2, &r), -1);
    cr_assert_eq(ab_mul_size(2, SIZE_MAX / 2 + 1, &r), -1);
    cr_assert_eq(ab_mul_size((size_t)1 << (sizeof(size_t) * 4), (size_t)1 << (sizeof(size_t) * 4), &r), -1);
    /* The largest exact product still passes: (2^32 - 1)(2^32 + 1) = 2^64 - 1 on 64-bit. */
    if (sizeof(size_t) == 8) {
        cr_assert_eq(ab_mul_size(0xffffffffu, (size_t)0x100000001ull, &r), 0);
        cr_assert_eq(r, SIZE_MAX);
    }
}

/* ------------------------------------------------------------------------------------
 * ab_sgemm against a plain double loop
 * ---------------------------------------------------------------------------------- */

/* Element (i, j) of op(X) for a row-major X with leading dimension ld. */
static double op_at(const float *x, int ld, bool trans, int i, int j) {
    return trans ? x[(size_t)j * ld + i] : x[(size_t)i * ld + j];
}

static void check_gemm(bool ta, bool tb, int m, int n, int k, int pad, float alpha, float beta, uint64_t seed) {
    /* op(A) is m x k: stored A is m x k (lda >= k) or k x m (lda >= m). */
    int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int lda = ac + pad, ldb = bc + pad, ldc = n + pad;
    size_t na = (size_t)(ar > 0 ? ar : 1) * lda, nb = (size_t)(br > 0 ? br : 1) * ldb, nc = (size_t)m * ldc;
    float *a = tu_alloc_f(na), *b = tu_alloc_f(nb), *c = tu_alloc_f(nc), *c0 = tu_alloc_f(nc);
    tu_fill_normal(a, na, seed, 1, 1.0);
    tu_fill_normal(b, nb, seed, 2, 1.0);
    tu_fill_normal(c0, nc, seed, 3, 1.0);
    /* Padding columns of C hold a sentinel that must survive; with beta = 0 the old
     * contents of C are NaN, which must not leak into the result (C may be scratch). */
    const float sentinel = -777.0f;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            size_t at = (size_t)i * ldc + j;
            if (j >= n) c0[at] = sentinel;
            else if (beta == 0.0f) c0[at] = NAN;
        }
    memcpy(c, c0, sizeof(float) * nc);
    ab_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            size_t at = (size_t)i * ldc + j;
            if (j >= n) {
                cr_assert_eq(c[at], sentinel, "ta=%d tb=%d m=%d n=%d k=%d: padding C[%d,%d] overwritten", ta, tb, m,
                             n, k, i, j);
                continue;
            }
            double want = 0, mag = 0;
            for (int l = 0; l < k; l++) {
                double t = op_at(a, lda, ta, i, l) * op_at(b, ldb, tb, l, j);
                want += t;
                mag += fabs(t);
            }
            want *= alpha;
            mag *= fabs(alpha);
            if (beta != 0.0f) {
                want += (double)beta * c0[at];
                mag += fabs((double)beta * c0[at]);
            }
            /* Standard bound for a float32 dot product of k terms in any order (with or
             * without FMA): |err| <= gamma_{k+2} * sum |terms|, gamma ~ (k+2) u with
             * u = FLT_EPSILON/2; using FLT_EPSILON gives a factor 2 of slack. */
            double tol = (k + 2) * FLT_EPSILON * mag + 1e-30;
            cr_assert(fabs(c[at] - want) <= tol, "ta=%d tb=%d m=%d n=%d k=%d beta=%g: C[%d,%d] = %.9g, want %.9g",
                      ta, tb, m, n, k, beta, i, j, c[at], want);
        }
    free(a);
    free(b);
    free(c);
    free(c0);
}

Test(blas, sgemm_matches_naive_loop) {
    /* m = 1 and n = 1 take ab_sgemm's matrix-vector path (sgemv) */
    static const int shapes[][3] = {{7, 5, 3},  {1, 1, 1},   {33, 17, 65}, {64, 48, 100},
                                    {5, 129, 9}, {1, 37, 19}, {23, 1, 41},  {1, 300, 257}};
    uint64_t seed = 100;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad <= 3; pad += 3) {
                    check_gemm(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], pad, 1.0f, 0.0f, seed++);
                    check_gemm(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], pad, 1.0f, 1.0f, seed++);
                    check_gemm(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], pad, -0.5f, 0.25f, seed++);
                }
}

Test(blas, sgemm_k_zero) {
    /* k = 0: C = beta C (the product is an empty sum). */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_gemm(ta, tb, 4, 3, 0, 2, 1.0f, 0.0f, 7);
            check_gemm(ta, tb, 4, 3, 0, 2, 1.0f, 1.0f, 8);
            check_gemm(ta, tb, 4, 3, 0, 0, 2.0f, 0.5f, 9);
        }
}

Test(blas, sgemm_inside_parallel_region) {
    /* Called from OpenMP threads (the variants' B*H loop): each thread's product must be
     * right on its own. */
    enum { T = 4, M = 9, N = 7, K = 11 };
    float a[T][M * K], b[T][K * N], c[T][M * N];
    for (int t = 0; t < T; t++) {
        tu_fill_normal(a[t], M * K, 50 + t, 0, 1.0);
        tu_fill_normal(b[t], K * N, 60 + t, 0, 1.0);
    }
#pragma omp parallel for num_threads(T)
    for (int t = 0; t < T; t++) ab_sgemm(false, false, M, N, K, 1.0f, a[t], K, b[t], N, 0.0f, c[t], N);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double want = 0, mag = 0;
                for (int l = 0; l < K; l++) {
                    want += (double)a[t][i * K + l] * b[t][l * N + j];
                    mag += fabs((double)a[t][i * K + l] * b[t][l * N + j]);
                }
                /* Same dot-product bound as above. */
                cr_assert(fabs(c[t][i * N + j] - want) <= (K + 2) * FLT_EPSILON * mag);
            }
}

Test(blas, threads_setting) {
    ab_set_threads(1);
    cr_assert_eq(ab_threads(), 1);
    ab_set_threads(3);
    cr_assert_eq(ab_threads(), 3);
    ab_set_threads(0);
    cr_assert_geq(ab_threads(), 1);
    cr_assert_not_null(ab_blas_config());
}

/* ------------------------------------------------------------------------------------
 * .npy files
 * ---------------------------------------------------------------------------------- */

TestSuite(npy, .init = scratch_setup, .fini = scratch_teardown);

static void roundtrip(ab_dtype t, int ndim, const int64_t *shape, const char *name) {
    size_t count = 1;
    for (int i = 0; i < ndim; i++) count *= (size_t)shape[i];
    size_t es = ab_dtype_size(t), bytes = count * es;
    unsigned char *data = malloc(bytes ? bytes : 1);
    /* Distinct, recognisable bytes (including negative values for the integer types). */
    for (size_t i = 0; i < count; i++) {
        if (t == AB_F32) ((float *)data)[i] = (float)ab_rng_normal(3, 0, i);
        else if (t == AB_I32) ((int32_t *)data)[i] = (int32_t)(i * 2654435761u);
        else ((int64_t *)data)[i] = (int64_t)(i * 0x9E3779B97F4A7C15ull);
    }
    const char *p = path_in(name);
    cr_assert_eq(ab_npy_write(p, t, ndim, shape, data), 0, "write %s: %s", name, ab_error());

    /* The NumPy format: preamble + header is a multiple of 64 bytes, ending in '\n'. */
    size_t n;
    unsigned char *raw = tp_read_bytes(p, &n);
    cr_assert_geq(n, 10u);
    cr_assert_eq(memcmp(raw, "\x93NUMPY\x01\x00", 8), 0, "%s: magic/version", name);
    size_t hlen = raw[8] | (size_t)raw[9] << 8;
    cr_assert_eq((10 + hlen) % 64, 0u, "%s: header ends at %zu", name, 10 + hlen);
    cr_assert_eq(raw[10 + hlen - 1], '\n', "%s: header must end in a newline", name);
    cr_assert_eq(n, 10 + hlen + bytes, "%s: file size", name);
    free(raw);

    ab_array a;
    cr_assert_eq(ab_npy_read(p, &a), 0, "read %s: %s", name, ab_error());
    cr_assert_eq(a.dtype, t);
    cr_assert_eq(a.ndim, ndim);
    for (int i = 0; i < ndim; i++) cr_assert_eq(a.shape[i], shape[i], "%s: dim %d", name, i);
    cr_assert_eq(a.count, count);
    if (bytes) {
        cr_assert_not_null(a.data);
        cr_assert_eq(memcmp(a.data, data, bytes), 0, "%s: data differ", name);
    }
    ab_array_free(&a);
    free(data);
}

Test(npy, roundtrip_dtypes_and_ranks) {
    static const int64_t s0[1] = {0}, s1[] = {5}, s2[] = {2, 3}, s4[] = {2, 3, 1, 5}, s1big[] = {1000};
    static const ab_dtype types[] = {AB_F32, AB_I32, AB_I64};
    char name[64];
    for (int t = 0; t < 3; t++) {
        snprintf(name, sizeof name, "r0_%d.npy", t);
        roundtrip(types[t], 0, s0, name);
        snprintf(name, sizeof name, "r1_%d.npy", t);
        roundtrip(types[t], 1, s1, name);
        snprintf(name, sizeof name, "r2_%d.npy", t);
        roundtrip(types[t], 2, s2, name);
        snprintf(name, sizeof name, "r4_%d.npy", t);
        roundtrip(types[t], 4, s4, name);
        snprintf(name, sizeof name, "r1big_%d.npy", t);
        roundtrip(types[t], 1, s1big, name);
    }
}

Test(npy, roundtrip_zero_size) {
    static const int64_t z2[] = {0, 3}, z4[] = {2, 0, 4, 1}, z1[] = {0};
    roundtrip(AB_F32, 2, z2, "z2.npy");
    roundtrip(AB_I64, 4, z4, "z4.npy");
    roundtrip(AB_I32, 1, z1, "z1.npy");
    ab_array a;
    cr_assert_eq(ab_npy_read(path_in("z2.npy"), &a), 0);
    cr_assert_eq(a.count, 0u);
    ab_array_free(&a);
}

Test(npy, header_is_numpy_format_byte_exact) {
    const float data[6] = {1, 2, 3, 4, 5, 6};
    const int64_t shape[2] = {2, 3};
    cr_assert_eq(ab_npy_write(path_in("h.npy"), AB_F32, 2, shape, data), 0, "%s", ab_error());
    unsigned char want[256];
    size_t wn = make_npy(want, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data, sizeof data);
    cr_assert_eq(wn, 128u + sizeof data, "hand-made header is 128 bytes");
    size_t n;
    unsigned char *got = tp_read_bytes(path_in("h.npy"), &n);
    cr_assert_eq(n, wn);
    cr_assert_eq(memcmp(got, want, n), 0, "header differs from NumPy's: %.*s", (int)(n - 24), (const char *)got + 10);
    free(got);

    /* 1-D is written (n,) and 0-D (), as NumPy does. */
    const int32_t v[5] = {1, 2, 3, 4, 5};
    const int64_t s1[1] = {5};
    cr_assert_eq(ab_npy_write(path_in("h1.npy"), AB_I32, 1, s1, v), 0);
    wn = make_npy(want, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (5,), }", v, sizeof v);
    got = tp_read_bytes(path_in("h1.npy"), &n);
    cr_assert_eq(n, wn);
    cr_assert_eq(memcmp(got, want, n), 0, "1-D header differs from NumPy's");
    free(got);

    const int64_t x = -5;
    cr_assert_eq(ab_npy_write(path_in("h0.npy"), AB_I64, 0, NULL, &x), 0);
    wn = make_npy(want, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (), }", &x, sizeof x);
    got = tp_read_bytes(path_in("h0.npy"), &n);
    cr_assert_eq(n, wn);
    cr_assert_eq(memcmp(got, want, n), 0, "0-D header differs from NumPy's");
    free(got);
}

Test(npy, reads_version_2_and_3) {
    const float data[4] = {1.5f, -2.0f, 3.25f, 0.0f};
    unsigned char buf[256];
    for (int major = 2; major <= 3; major++) {
        size_t n = make_npy(buf, major, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", data,
                            sizeof data);
        char name[32];
        snprintf(name, sizeof name, "v%d.npy", major);
        tp_write_bytes(path_in(name), buf, n);
        ab_array a;
        cr_assert_eq(ab_npy_read(path_in(name), &a), 0, "version %d.0: %s", major, ab_error());
        cr_assert_eq(a.ndim, 2);
        cr_assert_eq(a.shape[0], 2);
        cr_assert_eq(a.shape[1], 2);
        cr_assert_eq(memcmp(a.data, data, sizeof data), 0);
        ab_array_free(&a);
    }
    /* NumPy also writes dicts with double quotes and without a space; keys in any order. */
    size_t n = make_npy(buf, 1, "{\"shape\":(4,),\"fortran_order\":False,\"descr\":\"<f4\"}", data, sizeof data);
    tp_write_bytes(path_in("q.npy"), buf, n);
    ab_array a;
    cr_assert_eq(ab_npy_read(path_in("q.npy"), &a), 0, "%s", ab_error());
    cr_assert_eq(a.ndim, 1);
    cr_assert_eq(a.shape[0], 4);
    ab_array_free(&a);
}

/* A malformed file must be refused with a message that names the file and contains
 * `problem` (case-insensitive), and leave no data behind. */
static void expect_refused(const char *name, const char *problem) {
    const char *p = path_in(name);
    size_t cur = ab_mem_current(AB_DEV_CPU);
    ab_array a;
    ab_clear_error();
    int rc = ab_npy_read(p, &a);
    cr_assert_lt(rc, 0, "%s: accepted", name);
    const char *msg = ab_error();
    cr_assert(strstr(msg, p) != NULL, "%s: message '%s' does not name the file", name, msg);
    cr_assert(contains_nocase(msg, problem), "%s: message '%s' does not say '%s'", name, msg, problem);
    cr_assert(strchr(msg, '\n') == NULL, "%s: message is not one line", name);
    cr_assert_null(a.data);
    cr_assert_eq(ab_mem_current(AB_DEV_CPU), cur, "%s: memory leaked on failure", name);
}

Test(npy, malformed_files_refused) {
    const float data[6] = {1, 2, 3, 4, 5, 6};
    unsigned char buf[512];
    size_t n;

    expect_refused("missing.npy", "no such file");

    tp_write_bytes(path_in("empty.npy"), "", 0);
    expect_refused("empty.npy", "npy");

    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data, sizeof data);
    buf[1] = 'X';
    tp_write_bytes(path_in("magic.npy"), buf, n);
    expect_refused("magic.npy", "magic");

    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data, sizeof data);
    tp_write_bytes(path_in("trunc_header.npy"), buf, 40); /* header says 118 bytes */
    expect_refused("trunc_header.npy", "truncated");
    tp_write_bytes(path_in("trunc_prefix.npy"), buf, 11); /* inside the v1 length field's neighbourhood */
    expect_refused("trunc_prefix.npy", "truncated");

    tp_write_bytes(path_in("trunc_data.npy"), buf, n - 5);
    expect_refused("trunc_data.npy", "truncated");

    memcpy(buf + n, "xyz", 3);
    tp_write_bytes(path_in("trailing.npy"), buf, n + 3);
    expect_refused("trailing.npy", "trailing");

    n = make_npy(buf, 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", data, sizeof data);
    tp_write_bytes(path_in("big_endian.npy"), buf, n);
    expect_refused("big_endian.npy", ">f4");

    double d6[6] = {0};
    n = make_npy(buf, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", d6, sizeof d6);
    tp_write_bytes(path_in("float64.npy"), buf, n);
    expect_refused("float64.npy", "<f8");

    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", data, sizeof data);
    tp_write_bytes(path_in("fortran.npy"), buf, n);
    expect_refused("fortran.npy", "fortran");

    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data, sizeof data);
    buf[6] = 9;
    tp_write_bytes(path_in("version9.npy"), buf, n);
    expect_refused("version9.npy", "version 9.0");

    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, }", data, sizeof data);
    tp_write_bytes(path_in("noshape.npy"), buf, n);
    expect_refused("noshape.npy", "shape");

    n = make_npy(buf, 1, "{'fortran_order': False, 'shape': (2, 3), }", data, sizeof data);
    tp_write_bytes(path_in("nodescr.npy"), buf, n);
    expect_refused("nodescr.npy", "descr");

    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", data, sizeof data);
    tp_write_bytes(path_in("negdim.npy"), buf, n);
    expect_refused("negdim.npy", "shape");

    /* A shape whose byte count overflows size_t. */
    n = make_npy(buf, 1,
                 "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", data,
                 sizeof data);
    tp_write_bytes(path_in("overflow.npy"), buf, n);
    expect_refused("overflow.npy", "large");
}

/* A file that promises more data than it holds is refused as truncated before the
 * data is allocated: 24 bytes claiming 2^34 floats (64 GiB) must not become a request
 * for 64 GiB (issue 16: out of memory is exit status 1, bad input 2). */
Test(npy, short_file_with_a_huge_shape_is_truncated_not_allocated) {
    const float data[6] = {1, 2, 3, 4, 5, 6};
    unsigned char buf[512];
    size_t n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (17179869184,), }", data,
                        sizeof data);
    tp_write_bytes(path_in("huge.npy"), buf, n);
    ab_mem_reset_peak(AB_DEV_CPU);
    size_t base = ab_mem_current(AB_DEV_CPU);
    ab_array a;
    ab_clear_error();
    cr_assert_eq(ab_npy_read(path_in("huge.npy"), &a), AB_EINVAL, "%s", ab_error());
    cr_assert(strstr(ab_error(), "truncated data (24 of 68719476736 bytes)"), "%s", ab_error());
    cr_assert_lt(ab_mem_peak(AB_DEV_CPU) - base, 1u << 20, "refusing it allocated %zu bytes",
                 ab_mem_peak(AB_DEV_CPU) - base);
}

/* A whole file whose data is larger than this machine's memory and swap (sparse: it
 * takes no disk) is bad input, exit status 2, like other impossible sizes, not an
 * out-of-memory failure (exit 1): issue 28. */
Test(npy, a_file_larger_than_memory_is_bad_input) {
    const unsigned long long rows = (unsigned long long)(tp_memory_capacity() / (1 << 20)) + 1; /* rows of 1 MiB */
    char hdr[200];
    snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%llu, 262144), }", rows);
    unsigned char buf[512];
    size_t n = make_npy(buf, 1, hdr, NULL, 0);
    const char *p = path_in("larger.npy");
    tp_write_bytes(p, buf, n);
    if (truncate(p, (off_t)(n + rows * (1ull << 20))) != 0) cr_skip_test("no sparse file of %llu MiB here", rows);
    ab_array a;
    cr_assert_eq(ab_npy_read(p, &a), AB_EINVAL, "%s", ab_error());
    cr_assert(strstr(ab_error(), "more than this machine's memory and swap") && strstr(ab_error(), p), "%s",
              ab_error());
}

Test(npy, write_rejects_bad_arguments) {
    const float x[1] = {0};
    const int64_t neg[2] = {2, -1};
    ab_clear_error();
    cr_assert_lt(ab_npy_write(path_in("neg.npy"), AB_F32, 2, neg, x), 0);
    cr_assert_neq(ab_error()[0], '\0');
    cr_assert_not(tp_exists(path_in("neg.npy")), "a refused write leaves no file");
    cr_assert_lt(ab_npy_write(path_in("nd.npy"), AB_F32, AB_NPY_MAX_DIMS + 1, neg, x), 0);
    cr_assert_not(tp_exists(path_in("nd.npy")));
}
