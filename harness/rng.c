#include "rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void ab_philox4x32(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32);
    uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

static double to_unit(uint32_t w) { return ((double)(w >> 8) + 0.5) * (1.0 / 16777216.0); }

double ab_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t w[4];
    ab_philox4x32(seed, stream, index, w);
    return to_unit(w[0]);
}

double ab_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t w[4];
    ab_philox4x32(seed, stream, index >> 1, w);
    double r = sqrt(-2.0 * log(to_unit(w[0])));
    double a = 6.283185307179586476925 * to_unit(w[1]);
    return (index & 1) ? r * sin(a) : r * cos(a);
}

double ab_rng_next_uniform(ab_rng *r) { return ab_rng_uniform(r->seed, r->stream, r->index++); }
double ab_rng_next_normal(ab_rng *r) { return ab_rng_normal(r->seed, r->stream, r->index++); }

uint32_t ab_rng_next_below(ab_rng *r, uint32_t n) {
    uint32_t w[4];
    ab_philox4x32(r->seed, r->stream, r->index++, w);
    return (uint32_t)(((uint64_t)w[0] * n) >> 32);
}
