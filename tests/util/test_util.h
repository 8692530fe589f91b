/* Shared helpers for the Criterion suites: seeded random tensors and attention
 * problems, float/double conversion, error norms, and central finite differences. */
#ifndef AB_TEST_UTIL_H
#define AB_TEST_UTIL_H

#include "attention.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* n normal(0, sd) floats from (seed, stream) (harness RNG, so reproducible). */
void tu_fill_normal(float *x, size_t n, uint64_t seed, uint64_t stream, double sd);
/* The same in a new array (malloc'ed). */
float *tu_normal(size_t n, uint64_t seed, uint64_t stream, double sd);
/* Uniform integers in [lo, hi] into an int array. */
void tu_fill_int(int *x, size_t n, uint64_t seed, uint64_t stream, int lo, int hi);

/* An attention problem: its shape (the lengths, B <= 8 of them, copied in) and q, k,
 * v, dout normal(0, 1) from streams 1 to 4 of `seed`. */
typedef struct {
    attn_shape s;
    int lengths[8];
    float *q, *k, *v, *dout;
    size_t nq, nv; /* elements of q/k and of v/out */
} tu_problem;
void tu_problem_init(tu_problem *p, int B, int H, int N, int D, int M, bool causal, const int *lengths,
                     uint64_t seed);
void tu_problem_free(tu_problem *p);

/* Rows i >= lengths[b] of a [B, H, N, X] tensor are exactly zero (asserted; `what`
 * names the tensor). */
void tu_assert_padded_zero(const attn_shape *s, const float *x, int X, const char *what);

/* Recurrent mode on [B, H, N, X] tensors: tu_gather copies position t of every slice
 * into dst [B, H, X], tu_scatter copies it back; tu_prefix returns positions [0, P)
 * as a new [B, H, P, X] tensor (malloc'ed). */
void tu_gather(const attn_shape *s, const float *src, float *dst, int t, int X);
void tu_scatter(const attn_shape *s, const float *src, float *dst, int t, int X);
float *tu_prefix(const attn_shape *s, const float *src, int P, int X);
/* The recurrent mode of a (a CPU object) over p: a state of `capacity` positions, a
 * prefill of positions [0, P) (none when P = 0), then one step per position [P, N). The
 * outputs go into got [B, H, N, M]: the steps' rows, and the prefill's when with_out
 * (else rows [0, P) are left as they are). aux (NULL: the variant reads none) is its own
 * input [B, H, N, W], bound as the prefill's and each step's slice. Asserts every call. */
void tu_run_recurrent(attn *a, const tu_problem *p, int capacity, int P, bool with_out, const float *aux, int W,
                      float *got);

double *tu_to_double(const float *x, size_t n); /* malloc'ed copy */
float *tu_alloc_f(size_t n);                     /* malloc'ed, zeroed */
double *tu_alloc_d(size_t n);                    /* malloc'ed, zeroed */

/* max |got - want| / max(max |want|, floor): one relative figure per tensor, so tiny
 * entries are judged against the tensor's scale rather than themselves. */
double tu_rel_err(const float *got, const double *want, size_t n, double floor);
double tu_max_abs(const double *x, size_t n);
/* The index of the first largest of x[0..n). */
int tu_argmax(const float *x, int n);

/* Central finite differences of L(x) = sum(out(x) * w) with respect to every entry of
 * x (double precision): grad[i] = (L(x + h e_i) - L(x - h e_i)) / 2h. `f` computes out
 * from the current contents of the buffers it was given in ctx; x is one of them. */
typedef void (*tu_forward_fn)(void *ctx, double *out);
void tu_fd_grad(tu_forward_fn f, void *ctx, double *x, size_t nx, const double *w, size_t nout, double h,
                double *grad);

/* Whether TEST_VERBOSE is set: the suites then print every error they measure. */
bool tu_verbose(void);

/* The library's refusal: rc is `code` and ab_error() one line holding every string of
 * the NULL-terminated list that follows `what` (which names the case in failures). */
void tu_expect_fail(int rc, int code, const char *what, ...);

#endif
