/* Clocks: monotonic wall time, and the CPU time of the whole process. */
#ifndef AB_TIMER_H
#define AB_TIMER_H

#include <stdint.h>

/* Monotonic wall clock, nanoseconds from an arbitrary origin. */
uint64_t ab_now_ns(void);
static inline double ab_ms_since(uint64_t t0_ns) { return (double)(ab_now_ns() - t0_ns) * 1e-6; }

/* CPU time consumed by the process so far (user + system, every thread), nanoseconds
 * (CLOCK_PROCESS_CPUTIME_ID). On a machine shared with other work it measures what a
 * computation costs, where wall time also measures the others: at one thread it is
 * about the wall time of an idle machine. Threads that spin while waiting (OpenMP's
 * active wait policy) count as busy. */
uint64_t ab_cpu_ns(void);

#endif
