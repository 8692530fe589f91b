/* Counter-based random numbers (Philox4x32-10, Salmon et al. 2011).
 *
 * A number is a pure function of (seed, stream, index): no hidden state, so the CUDA
 * backend reproduces exactly the same values element by element, and any element can
 * be drawn in any order from any thread.
 *
 * Layout of one Philox call: key = (seed low 32, seed high 32), counter =
 * (index low, index high, stream low, stream high); it yields four 32-bit words.
 *   ab_rng_uniform(seed, stream, i): word 0 of block i, as ((w >> 8) + 0.5) / 2^24, in (0, 1)
 *   ab_rng_normal(seed, stream, i):  block i/2, Box-Muller in double on u0, u1 = words 0
 *       and 1 converted as the uniform's word: r = sqrt(-2 ln u0), z = r cos(2 pi u1)
 *       for even i, r sin(2 pi u1) for odd i, with ln, sin and cos computed by
 *       rng_core.h from exactly rounded operations (not libm, whose last bits differ
 *       between glibc, its FMA code path and CUDA): the same double on every machine
 *       and on the GPU.
 */
#ifndef AB_RNG_H
#define AB_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void ab_philox4x32(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]);
double ab_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
double ab_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

/* A cursor over one stream, for code that just wants "the next number". */
typedef struct {
    uint64_t seed, stream, index;
} ab_rng;

static inline ab_rng ab_rng_make(uint64_t seed, uint64_t stream) {
    ab_rng r = {seed, stream, 0};
    return r;
}
double ab_rng_next_uniform(ab_rng *r);
double ab_rng_next_normal(ab_rng *r);
/* Uniform integer in [0, n), n > 0 (rejection-free multiply-shift; bias < 2^-32 * n). */
uint32_t ab_rng_next_below(ab_rng *r, uint32_t n);

#ifdef __cplusplus
}
#endif

#endif
