/* Memory traffic of an attention variant on the emulated device, for the suites that
 * hold a CUDA kernel to the bytes it moves (test_traffic.c; the model of the counts is
 * in tests/cuda_emu/cuda_emu.h, "Memory traffic").
 *
 *     tt_traffic t;
 *     attn_shape s = {1, 2, 512, 16, 16, true, NULL};
 *     cr_assert_eq(tt_fwd_bwd("linear", NULL, 0, &s, 1, &t), 0, "%s", attn_error());
 *     if (!t.counted) cr_skip_test("%s", TT_NOT_COUNTED);
 *     cr_expect_leq(tt_dram(&t), 3.0 * tt_min(&t));
 *
 * Link with traffic_dep (the traffic library where the build has it). */
#ifndef AB_TRAFFIC_UTIL_H
#define AB_TRAFFIC_UTIL_H

#include "attention.h"
#include "cuda_traffic.h"

#include <stdbool.h>
#include <stdint.h>

#define TT_NOT_COUNTED                                                                                                 \
    "this build does not count memory traffic (the traffic library is built by GCC in builds without "                 \
    "-Db_sanitize: ThreadSanitizer's instrumentation, which counts, cannot be combined with AddressSanitizer's)"

typedef struct {
    bool counted;                    /* false: this build counts nothing (the counts are zero) */
    ab_traffic_counts total;         /* the operation's device operations together */
    unsigned long long h2d, d2h;     /* host<->device copy bytes during it */
    double min_read, min_write;      /* its inputs read and outputs written once (sweep.h) */
    int position;                    /* tt_step: the position counted */
} tt_traffic;

/* One forward+backward (with `saved`, as training runs it) of `variant` with its
 * settings ("key=value", may be NULL when n_settings is 0) at shape s on the emulated
 * device, its inputs normal(0, 1) from `seed`, counted alone (the state the variant
 * keeps between calls allocated first: attn_reserve). 0, or an error code with a
 * message (attn_error()). */
int tt_fwd_bwd(const char *variant, const char *const *settings, int n_settings, const attn_shape *s, uint64_t seed,
               tt_traffic *out);
/* One recurrent step at position t = s->len after a prefill of s->len positions
 * (s->len may be 0: the first step), counted alone. */
int tt_step(const char *variant, const char *const *settings, int n_settings, const attn_shape *s, uint64_t seed,
            tt_traffic *out);

/* After either call, ab_cuda_traffic_entries / ab_cuda_traffic_entry give the counted
 * operation's counts by kernel (or call) name, until the next count starts. */

/* DRAM bytes (read + written), requested bytes, minimal bytes. */
double tt_dram(const tt_traffic *t);
double tt_requested(const tt_traffic *t);
double tt_min(const tt_traffic *t);
/* Prints a line with the counts and ratios, then the last operation's counts by name
 * (ab_cuda_traffic_entry), to stderr: what a failing check shows. */
void tt_print(const char *label, const tt_traffic *t);

#endif
