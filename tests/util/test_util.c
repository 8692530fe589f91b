#include "test_util.h"

#include "error.h"
#include "rng.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void tu_fill_normal(float *x, size_t n, uint64_t seed, uint64_t stream, double sd) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(sd * ab_rng_normal(seed, stream, i));
}

float *tu_normal(size_t n, uint64_t seed, uint64_t stream, double sd) {
    float *x = tu_alloc_f(n);
    tu_fill_normal(x, n, seed, stream, sd);
    return x;
}

void tu_fill_int(int *x, size_t n, uint64_t seed, uint64_t stream, int lo, int hi) {
    ab_rng r = ab_rng_make(seed, stream);
    for (size_t i = 0; i < n; i++) x[i] = lo + (int)ab_rng_next_below(&r, (uint32_t)(hi - lo + 1));
}

void tu_problem_init(tu_problem *p, int B, int H, int N, int D, int M, bool causal, const int *lengths,
                     uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->s = (attn_shape){.batch = B, .heads = H, .len = N, .qk_dim = D, .v_dim = M, .causal = causal};
    if (lengths) {
        cr_assert(B <= 8);
        memcpy(p->lengths, lengths, sizeof(int) * (size_t)B);
        p->s.lengths = p->lengths;
    }
    p->nq = (size_t)B * H * N * D;
    p->nv = (size_t)B * H * N * M;
    p->q = tu_alloc_f(p->nq);
    p->k = tu_alloc_f(p->nq);
    p->v = tu_alloc_f(p->nv);
    p->dout = tu_alloc_f(p->nv);
    tu_fill_normal(p->q, p->nq, seed, 1, 1.0);
    tu_fill_normal(p->k, p->nq, seed, 2, 1.0);
    tu_fill_normal(p->v, p->nv, seed, 3, 1.0);
    tu_fill_normal(p->dout, p->nv, seed, 4, 1.0);
}

void tu_problem_free(tu_problem *p) {
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->dout);
}

static int valid_len(const attn_shape *s, int b) { return s->lengths ? s->lengths[b] : s->len; }

void tu_assert_padded_zero(const attn_shape *s, const float *x, int X, const char *what) {
    for (int b = 0; b < s->batch; b++)
        for (int h = 0; h < s->heads; h++)
            for (int i = valid_len(s, b); i < s->len; i++)
                for (int c = 0; c < X; c++) {
                    float e = x[(((size_t)b * s->heads + h) * s->len + i) * X + c];
                    cr_assert(e == 0.0f, "%s[b=%d h=%d i=%d c=%d] = %g in a padded row (length %d), expected 0", what,
                              b, h, i, c, (double)e, valid_len(s, b));
                }
}

void tu_gather(const attn_shape *s, const float *src, float *dst, int t, int X) {
    for (int bh = 0; bh < s->batch * s->heads; bh++)
        memcpy(dst + (size_t)bh * X, src + ((size_t)bh * s->len + t) * X, sizeof(float) * (size_t)X);
}

void tu_scatter(const attn_shape *s, const float *src, float *dst, int t, int X) {
    for (int bh = 0; bh < s->batch * s->heads; bh++)
        memcpy(dst + ((size_t)bh * s->len + t) * X, src + (size_t)bh * X, sizeof(float) * (size_t)X);
}

void tu_run_recurrent(attn *a, const tu_problem *p, int capacity, int P, bool with_out, const float *aux, int W,
                      float *got) {
    const attn_shape *s = &p->s;
    const int N = s->len, D = s->qk_dim, M = s->v_dim;
    const size_t bh = (size_t)s->batch * s->heads;
    attn_state *st = NULL;
    cr_assert_eq(attn_state_create(a, s, capacity, &st), 0, "%s", attn_error());
    if (P > 0) {
        float *pq = tu_prefix(s, p->q, P, D), *pk = tu_prefix(s, p->k, P, D), *pv = tu_prefix(s, p->v, P, M);
        float *pa = aux ? tu_prefix(s, aux, P, W) : NULL, *po = with_out ? tu_alloc_f(bh * P * M) : NULL;
        if (pa) cr_assert_eq(attn_bind_aux(a, pa, NULL), 0, "%s", attn_error());
        cr_assert_eq(attn_prefill(a, st, P, pq, pk, pv, po), 0, "prefill %d: %s", P, attn_error());
        attn_shape ps = *s;
        ps.len = P;
        float *row = tu_alloc_f(bh * M);
        for (int t = 0; po && t < P; t++) {
            tu_gather(&ps, po, row, t, M);
            tu_scatter(s, row, got, t, M);
        }
        free(row), free(pq), free(pk), free(pv), free(pa), free(po);
    }
    float *q = tu_alloc_f(bh * D), *k = tu_alloc_f(bh * D), *v = tu_alloc_f(bh * M), *o = tu_alloc_f(bh * M);
    float *at = aux ? tu_alloc_f(bh * W) : NULL;
    if (at) cr_assert_eq(attn_bind_aux(a, at, NULL), 0, "%s", attn_error());
    for (int t = P; t < N; t++) {
        tu_gather(s, p->q, q, t, D);
        tu_gather(s, p->k, k, t, D);
        tu_gather(s, p->v, v, t, M);
        if (at) tu_gather(s, aux, at, t, W);
        cr_assert_eq(attn_step(a, st, t, q, k, v, o), 0, "step %d: %s", t, attn_error());
        tu_scatter(s, o, got, t, M);
    }
    free(q), free(k), free(v), free(o), free(at);
    attn_state_destroy(st);
}

float *tu_prefix(const attn_shape *s, const float *src, int P, int X) {
    float *dst = tu_alloc_f((size_t)s->batch * s->heads * (size_t)(P ? P : 1) * X);
    for (int bh = 0; bh < s->batch * s->heads; bh++)
        memcpy(dst + (size_t)bh * P * X, src + (size_t)bh * s->len * X, sizeof(float) * (size_t)P * X);
    return dst;
}

double *tu_to_double(const float *x, size_t n) {
    double *d = malloc(sizeof(double) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

float *tu_alloc_f(size_t n) { return calloc(n ? n : 1, sizeof(float)); }
double *tu_alloc_d(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

double tu_max_abs(const double *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

int tu_argmax(const float *x, int n) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

double tu_rel_err(const float *got, const double *want, size_t n, double floor) {
    double scale = fmax(tu_max_abs(want, n), floor), err = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (isnan(e)) return INFINITY;
        err = fmax(err, e);
    }
    return err / scale;
}

void tu_fd_grad(tu_forward_fn f, void *ctx, double *x, size_t nx, const double *w, size_t nout, double h,
                double *grad) {
    double *out = malloc(sizeof(double) * nout);
    for (size_t i = 0; i < nx; i++) {
        double x0 = x[i], lp = 0, lm = 0;
        x[i] = x0 + h;
        f(ctx, out);
        for (size_t j = 0; j < nout; j++) lp += out[j] * w[j];
        x[i] = x0 - h;
        f(ctx, out);
        for (size_t j = 0; j < nout; j++) lm += out[j] * w[j];
        x[i] = x0;
        grad[i] = (lp - lm) / (2 * h);
    }
    free(out);
}

bool tu_verbose(void) { return getenv("TEST_VERBOSE") != NULL; }

void tu_expect_fail(int rc, int code, const char *what, ...) {
    cr_expect_eq(rc, code, "%s: rc %d, expected %d (message: %s)", what, rc, code, ab_error());
    const char *m = ab_error();
    cr_expect(!strchr(m, '\n'), "%s: the message is not one line: %s", what, m);
    va_list ap;
    va_start(ap, what);
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
        cr_expect(strstr(m, s), "%s: the message lacks '%s': %s", what, s, m);
    va_end(ap);
}
