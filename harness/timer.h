/* Monotonic clock. */
#ifndef AB_TIMER_H
#define AB_TIMER_H

#include <stdint.h>

uint64_t ab_now_ns(void);
static inline double ab_ms_since(uint64_t t0_ns) { return (double)(ab_now_ns() - t0_ns) * 1e-6; }

#endif
