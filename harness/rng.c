#include "rng.h"

#include "rng_core.h"

/* The arithmetic is in rng_core.h, shared with the CUDA code. */

void ab_philox4x32(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]) {
    ab_philox4x32_core(seed, stream, index, out);
}

double ab_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return ab_rng_uniform_core(seed, stream, index);
}

double ab_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    return ab_rng_normal_core(seed, stream, index);
}

double ab_rng_next_uniform(ab_rng *r) { return ab_rng_uniform(r->seed, r->stream, r->index++); }
double ab_rng_next_normal(ab_rng *r) { return ab_rng_normal(r->seed, r->stream, r->index++); }

uint32_t ab_rng_next_below(ab_rng *r, uint32_t n) {
    uint32_t w[4];
    ab_philox4x32(r->seed, r->stream, r->index++, w);
    return (uint32_t)(((uint64_t)w[0] * n) >> 32);
}
