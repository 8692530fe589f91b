/* The arithmetic of rng.h as inline functions that compile as C (harness/rng.c), as
 * C++ and as CUDA device code (attention/lsh_cuda.cu), so that a number drawn on the
 * GPU is the very same double as on the CPU, bit for bit.
 *
 * Why not libm: Box-Muller needs log, sin and cos, and neither glibc nor CUDA's math
 * library is correctly rounded; they differ from each other (and glibc from itself
 * between its FMA and non-FMA code paths) in the last bit of some results. Here
 * everything is built from operations IEEE 754 defines exactly (+, -, *, /, sqrt,
 * fma, floor, frexp), in a fixed order:
 * - log(x): x = m 2^e with m in [sqrt(1/2), sqrt(2)) (frexp), s = (m - 1) / (m + 1),
 *   log m = 2 atanh(s) = 2s (1 + s^2/3 + s^4/5 + ... + s^22/23) (|s| <= 0.172: the
 *   truncation is below 1e-18 relative), plus e ln 2 with ln 2 split in two.
 * - sin and cos of 2 pi u (u in (0, 1), 25 significant bits): 4u = n + f exactly with
 *   n an integer and |f| <= 1/2, x = f pi/2, then Taylor polynomials of sin x (to
 *   x^21) and cos x (to x^20) on |x| <= pi/4 (truncation below 1e-19), and the
 *   quadrant n mod 4.
 * Accuracy: within a few units in the last place of the correctly rounded results
 * (tests/harness/test_harness.c compares with libm).
 *
 * Contraction: compilers may fuse a product feeding an addition into one fma (nvcc
 * does by default, g++ does for C++), which would change results between builds.
 * The code below never lets a rounded product feed an addition: every such place is
 * an explicit fma(), and the remaining products are exact or feed only
 * multiplications, divisions, square roots and fma operands. Keep it that way. */
#ifndef AB_RNG_CORE_H
#define AB_RNG_CORE_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define AB_RNG_HD __host__ __device__
#else
#define AB_RNG_HD
#endif

#define AB_PHILOX_M0 0xD2511F53u
#define AB_PHILOX_M1 0xCD9E8D57u
#define AB_PHILOX_W0 0x9E3779B9u
#define AB_PHILOX_W1 0xBB67AE85u

/* Philox4x32-10: key = (seed lo, seed hi), counter = (index lo, index hi, stream lo,
 * stream hi). */
static inline AB_RNG_HD void ab_philox4x32_core(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32);
    uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)AB_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)AB_PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += AB_PHILOX_W0;
        k1 += AB_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* A Philox word as a double in (0, 1): ((w >> 8) + 0.5) / 2^24, exact. */
static inline AB_RNG_HD double ab_rng_unit_core(uint32_t w) {
    return ((double)(w >> 8) + 0.5) * (1.0 / 16777216.0);
}

/* Natural logarithm of a positive normal double (see the top of the file). */
static inline AB_RNG_HD double ab_rng_log_core(double x) {
    int e;
    double m = frexp(x, &e); /* x = m 2^e, m in [1/2, 1): exact */
    if (m < 0x1.6a09e667f3bcdp-1) { /* sqrt(1/2) */
        m = m * 2.0;                /* exact */
        e -= 1;
    }
    const double f = m - 1.0; /* exact (Sterbenz) */
    const double s = f / (2.0 + f);
    const double t = s * s;
    double p = 0x1.642c8590b2164p-5; /* 1/23 */
    p = fma(p, t, 0x1.8618618618618p-5); /* 1/21 */
    p = fma(p, t, 0x1.af286bca1af28p-5); /* 1/19 */
    p = fma(p, t, 0x1.e1e1e1e1e1e1ep-5); /* 1/17 */
    p = fma(p, t, 0x1.1111111111111p-4); /* 1/15 */
    p = fma(p, t, 0x1.3b13b13b13b14p-4); /* 1/13 */
    p = fma(p, t, 0x1.745d1745d1746p-4); /* 1/11 */
    p = fma(p, t, 0x1.c71c71c71c71cp-4); /* 1/9 */
    p = fma(p, t, 0x1.2492492492492p-3); /* 1/7 */
    p = fma(p, t, 0x1.999999999999ap-3); /* 1/5 */
    p = fma(p, t, 0x1.5555555555555p-2); /* 1/3 */
    const double hs = 2.0 * s;                 /* exact */
    const double lm = fma(hs * t, p, hs);      /* log m = 2s + 2s t p */
    const double de = (double)e;
    /* e ln2 with ln2 = hi + lo; e hi is exact (|e| < 2^11, hi has 32 bits) */
    return fma(de, 0x1.62e42fee00000p-1, fma(de, 0x1.a39ef35793c76p-33, lm));
}

/* sin and cos of 2 pi u for u in [0, 1) with at most 50 significant bits (so that 4u
 * and its fraction are exact). */
static inline AB_RNG_HD void ab_rng_sincos_2pi_core(double u, double *sin_out, double *cos_out) {
    const double y = u * 4.0;             /* exact */
    const double n = floor(y + 0.5);      /* nearest integer, 0..4 */
    const double f = y - n;               /* exact, in [-1/2, 1/2] */
    const double x = f * 0x1.921fb54442d18p+0; /* f pi/2, |x| <= pi/4 */
    const double t = x * x;
    double ps = 0x1.71b8ef6dcf572p-66; /* 1/21! */
    ps = fma(ps, t, -0x1.2f49b46814157p-57); /* -1/19! */
    ps = fma(ps, t, 0x1.952c77030ad4ap-49);  /* 1/17! */
    ps = fma(ps, t, -0x1.ae7f3e733b81fp-41); /* -1/15! */
    ps = fma(ps, t, 0x1.6124613a86d09p-33);  /* 1/13! */
    ps = fma(ps, t, -0x1.ae64567f544e4p-26); /* -1/11! */
    ps = fma(ps, t, 0x1.71de3a556c734p-19);  /* 1/9! */
    ps = fma(ps, t, -0x1.a01a01a01a01ap-13); /* -1/7! */
    ps = fma(ps, t, 0x1.1111111111111p-7);   /* 1/5! */
    ps = fma(ps, t, -0x1.5555555555555p-3);  /* -1/3! */
    const double sx = fma(x * t, ps, x);     /* sin x = x + x^3 ps */
    double pc = 0x1.e542ba4020225p-62;       /* 1/20! */
    pc = fma(pc, t, -0x1.6827863b97d97p-53); /* -1/18! */
    pc = fma(pc, t, 0x1.ae7f3e733b81fp-45);  /* 1/16! */
    pc = fma(pc, t, -0x1.93974a8c07c9dp-37); /* -1/14! */
    pc = fma(pc, t, 0x1.1eed8eff8d898p-29);  /* 1/12! */
    pc = fma(pc, t, -0x1.27e4fb7789f5cp-22); /* -1/10! */
    pc = fma(pc, t, 0x1.a01a01a01a01ap-16);  /* 1/8! */
    pc = fma(pc, t, -0x1.6c16c16c16c17p-10); /* -1/6! */
    pc = fma(pc, t, 0x1.5555555555555p-5);   /* 1/4! */
    const double cx = fma(t, fma(t, pc, -0.5), 1.0); /* cos x = 1 - t/2 + t^2 pc */
    /* 2 pi u = n pi/2 + x */
    switch ((int)n & 3) {
    case 0: *sin_out = sx, *cos_out = cx; break;
    case 1: *sin_out = cx, *cos_out = -sx; break;
    case 2: *sin_out = -sx, *cos_out = -cx; break;
    default: *sin_out = -cx, *cos_out = sx; break;
    }
}

/* ab_rng_uniform and ab_rng_normal of rng.h. */
static inline AB_RNG_HD double ab_rng_uniform_core(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t w[4];
    ab_philox4x32_core(seed, stream, index, w);
    return ab_rng_unit_core(w[0]);
}

static inline AB_RNG_HD double ab_rng_normal_core(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t w[4];
    ab_philox4x32_core(seed, stream, index >> 1, w);
    const double r = sqrt(-2.0 * ab_rng_log_core(ab_rng_unit_core(w[0])));
    double s, c;
    ab_rng_sincos_2pi_core(ab_rng_unit_core(w[1]), &s, &c);
    return (index & 1) ? r * s : r * c;
}

#endif
