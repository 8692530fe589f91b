/* models/lstm on the CPU: the stack's forward and backward against the double
 * reference (tests/reference/ref_lstm.c) on odd sizes (uni- and bidirectional, one
 * and two layers, lengths with 0, 1 and N, dropout between layers), the reference's
 * own gradient and the float one against central finite differences, padding (exact
 * zeros, no gradient, padding values never read), the state carried across positions
 * in each direction's order, bit-identical repeats, accumulation (+=), the
 * initialisation scheme and the refusals of bad calls.
 *
 * Error figures are tu_rel_err: max abs error over a tensor divided by the tensor's
 * max abs value. Activations and scratch are filled with NaN before use, so a read of
 * anything forward or backward did not write shows. TEST_VERBOSE=1 prints every
 * measured error. */
#include <criterion/criterion.h>

#include "error.h"
#include "layers.h"
#include "lstm.h"
#include "memory.h"
#include "ref_lstm.h"
#include "rng.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Forward against the double reference: per step a sum of I + H <= 9 float products
 * (OpenBLAS) plus expf/tanhf (<= 1 ulp each) and the cell update; the error carried
 * through c over 7 steps and a second layer grows to a few ulps of the O(0.5)
 * outputs. Measured <= 2.5e-7 (tensor-relative); 1e-5 is a 40x margin, while a wrong
 * gate order, a missing term or a padding leak gives 1e-2 and more. */
#define FWD_TOL 1e-5
/* Backward against the reference's exact gradient: the same sums plus the backward
 * chain through up to 7 steps and two layers (products of <= 4 rounded factors per
 * step, sums over <= 280 positions). Measured <= 4.6e-7; 1e-5 is a 20x margin. */
#define BWD_TOL 1e-5
/* The reference's exact gradient against central differences (h = 1e-5, double):
 * truncation h^2 |f'''| / 6 ~ 1e-11 and rounding 2^-53 |L| / h ~ 1e-11 for these O(1)
 * values. Measured <= 1.3e-9 (tensor-relative); 1e-7 leaves a 75x margin, while any
 * wrong term of the hand-written backward gives 1e-3 and more. */
#define FD_STEP 1e-5
#define REF_FD_TOL 1e-7
/* The float backward against the same differences: the float error above dominates
 * (measured <= 3.7e-7). 1e-5 as BWD_TOL. */
#define FLOAT_FD_TOL 1e-5
/* Accumulation: backward into gradients that start at G0 against G0 + (backward from
 * zero): the same products, added once more; the only difference is the order of the
 * additions of the two directions into dx and of the start value inside blocked
 * GEMMs, a few ulps of the tensor's scale (2^-23 = 1.2e-7 each). Measured <= 4.7e-8;
 * 1e-6 is the bound, while a backward that overwrites instead of adding misses by
 * |G0| / max, O(1) here. */
#define ACC_TOL 1e-6

/* ---- a stack on the CPU: its tables and buffers ---- */

typedef struct {
    lstm_config c;
    int B, N; /* carved maxima */
    tf_table pt, at, st;
    float *params, *grads;
    void *acts, *scratch;
    lstm_params p, g;
    lstm_acts a;
    lstm_scratch s;
} fixture;

/* Carves for batches up to B and lengths up to N (larger than the calls below use,
 * so calls run on the first rows of the buffers) and initialises the parameters
 * from `seed` with lstm_init_params. Activations and scratch start as NaN. */
static void fix_init(fixture *f, const lstm_config *c, int B, int N, bool with_dropout, uint64_t seed) {
    memset(f, 0, sizeof *f);
    f->c = *c;
    f->B = B;
    f->N = N;
    cr_assert_eq(lstm_check_config(c), 0, "%s", ab_error());
    tf_table_init(&f->pt, sizeof(float), 1);
    tf_table_begin(&f->pt, NULL);
    lstm_carve_params(&f->pt, &f->p, c);
    cr_assert_eq(f->pt.err, 0, "%s", ab_error());
    f->params = tu_alloc_f(f->pt.total);
    f->grads = tu_alloc_f(f->pt.total);
    tf_table_begin(&f->pt, f->grads);
    lstm_carve_params(&f->pt, &f->g, c);
    tf_table_begin(&f->pt, f->params);
    lstm_carve_params(&f->pt, &f->p, c);
    lstm_init_params(c, &f->p, seed, 0);

    tf_table_init(&f->at, 1, 64);
    tf_table_begin(&f->at, NULL);
    lstm_carve_acts(&f->at, &f->a, c, B, N, with_dropout);
    tf_table_init(&f->st, 1, 64);
    tf_table_begin(&f->st, NULL);
    lstm_carve_scratch(&f->st, &f->s, c, B, N);
    cr_assert(!f->at.err && !f->st.err, "%s", ab_error());
    f->acts = ab_alloc(f->at.total);
    f->scratch = ab_alloc(f->st.total);
    cr_assert(f->acts && f->scratch);
    memset(f->acts, 0xff, f->at.total);
    memset(f->scratch, 0xff, f->st.total);
    tf_table_begin(&f->at, f->acts);
    lstm_carve_acts(&f->at, &f->a, c, B, N, with_dropout);
    tf_table_begin(&f->st, f->scratch);
    lstm_carve_scratch(&f->st, &f->s, c, B, N);
}

static void fix_free(fixture *f) {
    free(f->params);
    free(f->grads);
    ab_free(f->acts);
    ab_free(f->scratch);
    tf_table_free(&f->pt);
    tf_table_free(&f->at);
    tf_table_free(&f->st);
}

/* The reference's view of a flat double array laid out as the parameter table. */
static ref_lstm_params ref_view(const fixture *f, double *base) {
    ref_lstm_params r;
    memset(&r, 0, sizeof r);
    for (int l = 0; l < f->c.layers; l++)
        for (int d = 0; d < lstm_dirs(&f->c); d++) {
            const lstm_dir_params *q = &f->p.dir[l][d];
            r.dir[l][d].w_ih = base + (q->w_ih - f->params);
            r.dir[l][d].w_hh = base + (q->w_hh - f->params);
            r.dir[l][d].b = base + (q->b - f->params);
        }
    return r;
}

static ref_lstm_cfg ref_cfg(const lstm_config *c) {
    ref_lstm_cfg r = {c->I, c->H, c->layers, c->bidirectional};
    return r;
}

static lstm_config config(int I, int H, int layers, bool bi, float dropout) {
    lstm_config c = {I, H, layers, bi, dropout};
    return c;
}

/* Every parameter tensor of the float gradients (by name) against a double one. */
static void expect_param_grads(const fixture *f, const double *want, double tol, const char *what) {
    for (int i = 0; i < f->pt.n; i++) {
        const tf_tensor *t = &f->pt.t[i];
        double e = tu_rel_err(f->grads + t->offset, want + t->offset, t->count, 1e-30);
        if (tu_verbose()) fprintf(stderr, "%s: d%s err %.3g\n", what, t->name, e);
        cr_expect_lt(e, tol, "%s: gradient of %s: err %g", what, t->name, e);
    }
}

static const char *case_name(char *buf, size_t n, const lstm_config *c, const int *lengths, int B) {
    int k = snprintf(buf, n, "L=%d %s lengths", c->layers, c->bidirectional ? "bi" : "uni");
    if (!lengths) snprintf(buf + k, n - (size_t)k, " none");
    for (int b = 0; lengths && b < B && (size_t)k < n; b++) k += snprintf(buf + k, n - (size_t)k, " %d", lengths[b]);
    return buf;
}

/* ---- forward and backward against the reference ---- */

/* One configuration: forward (train or not, with masks from seed when dropout) and
 * backward from a random dout into zeroed gradients, against the reference. */
static void ref_case(const lstm_config *c, int B, int N, const int *lengths, bool train, uint64_t seed) {
    fixture f;
    fix_init(&f, c, B + 1, N + 2, c->dropout > 0, seed);
    const int DH = lstm_out_width(c), L = c->layers;
    const size_t nx = (size_t)B * N * c->I, no = (size_t)B * N * DH;
    float *x = tu_normal(nx, seed, 1, 1.0), *dout = tu_normal(no, seed, 2, 1.0), *dx = tu_alloc_f(nx);
    lstm_dims d = {B, N, lengths, AB_DEV_CPU, 0};
    const uint64_t dseed = seed + 100, sbase = 0x1000;
    cr_assert_eq(lstm_stack_forward(c, &d, x, &f.p, &f.a, &f.s, train, dseed, sbase), 0, "%s", ab_error());
    cr_assert_eq(lstm_output(c, &f.a), f.a.layer[L - 1].out);

    /* the masks the reference applies: drawn here with layers.h's rule and stream */
    const bool drop = train && c->dropout > 0 && L > 1;
    uint8_t *masks[REF_LSTM_MAX_LAYERS] = {0};
    for (int l = 0; drop && l < L - 1; l++) {
        masks[l] = malloc(no);
        dropout_mask(masks[l], no, c->dropout, dseed, sbase + LSTM_DROPOUT_STREAM_STRIDE * (uint64_t)l);
        cr_expect(memcmp(masks[l], f.a.layer[l].mask, no) == 0, "layer %d: mask differs from dropout_mask", l);
    }
    ref_lstm_drop rd = {(const uint8_t *const *)masks, c->dropout};
    ref_lstm_cfg rc = ref_cfg(c);
    double *pd = tu_to_double(f.params, f.pt.total), *xd = tu_to_double(x, nx), *want = tu_alloc_d(no);
    ref_lstm_params rp = ref_view(&f, pd);
    ref_lstm_forward(&rc, &rp, xd, B, N, lengths, drop ? &rd : NULL, want);
    char name[128];
    case_name(name, sizeof name, c, lengths, B);
    const float *out = lstm_output(c, &f.a);
    double e = tu_rel_err(out, want, no, 1e-30);
    if (tu_verbose()) fprintf(stderr, "%s%s: forward err %.3g\n", name, drop ? " dropout" : "", e);
    cr_expect_lt(e, FWD_TOL, "%s: forward err %g", name, e);
    for (int b = 0; b < B; b++)
        for (int n = lengths ? lengths[b] : N; n < N; n++)
            for (int k = 0; k < DH; k++)
                cr_expect(out[((size_t)b * N + n) * DH + k] == 0.0f, "%s: padding output (%d, %d, %d) is not 0", name,
                          b, n, k);

    cr_assert_eq(lstm_stack_backward(c, &d, dx, &f.g, dout, x, &f.p, &f.a, &f.s, train), 0, "%s", ab_error());
    double *gd = tu_alloc_d(f.pt.total), *dxd = tu_alloc_d(nx), *doutd = tu_to_double(dout, no);
    ref_lstm_params rg = ref_view(&f, gd);
    ref_lstm_backward(&rc, &rp, xd, B, N, lengths, drop ? &rd : NULL, doutd, dxd, &rg);
    e = tu_rel_err(dx, dxd, nx, 1e-30);
    if (tu_verbose()) fprintf(stderr, "%s: dx err %.3g\n", name, e);
    cr_expect_lt(e, BWD_TOL, "%s: dx err %g", name, e);
    expect_param_grads(&f, gd, BWD_TOL, name);

    for (int l = 0; l < L - 1; l++) free(masks[l]);
    free(x), free(dout), free(dx), free(pd), free(xd), free(want), free(gd), free(dxd), free(doutd);
    fix_free(&f);
}

Test(lstm, forward_backward_match_reference) {
    const int B = 3, N = 7;
    const int edge[3] = {7, 0, 1}, mixed[3] = {3, 7, 5};
    const int *lens[3] = {NULL, edge, mixed};
    uint64_t seed = 10;
    for (int L = 1; L <= 2; L++)
        for (int bi = 0; bi < 2; bi++)
            for (int li = 0; li < 3; li++) {
                lstm_config c = config(5, 4, L, bi, 0.0f);
                ref_case(&c, B, N, lens[li], true, seed++);
            }
}

/* Dropout between layers: the masks of layers.h's rule at stride
 * LSTM_DROPOUT_STREAM_STRIDE, applied in training only. */
Test(lstm, dropout_between_layers) {
    const int lengths[3] = {7, 0, 4};
    for (int bi = 0; bi < 2; bi++) {
        lstm_config c = config(5, 4, 3, bi, 0.3f);
        ref_case(&c, 3, 7, lengths, true, 40 + (uint64_t)bi);
        ref_case(&c, 3, 7, lengths, false, 42 + (uint64_t)bi); /* evaluation: no dropout */
    }
}

/* Enough rows (B H >= 4096) for the step loops' threaded path, with lengths 0..N. */
Test(lstm, threaded_rows_match_reference) {
    const int B = 70, N = 4;
    int lengths[70];
    tu_fill_int(lengths, B, 50, 1, 0, N);
    lstm_config c = config(3, 64, 1, true, 0.0f);
    ref_case(&c, B, N, lengths, true, 51);
}

/* ---- gradients against finite differences ---- */

typedef struct {
    ref_lstm_cfg rc;
    ref_lstm_params rp;
    const double *x;
    int B, N;
    const int *lengths;
    const ref_lstm_drop *drop;
} fd_ctx;

static void fd_forward(void *ctx, double *out) {
    fd_ctx *c = ctx;
    ref_lstm_forward(&c->rc, &c->rp, c->x, c->B, c->N, c->lengths, c->drop, out);
}

/* A tiny stack (2 bidirectional layers with dropout between them, one padded row):
 * the reference's exact gradient and the float backward's, against central
 * differences of the reference's forward, for the input and every parameter. */
Test(lstm, gradients_match_finite_differences) {
    const int B = 2, N = 3, lengths[2] = {3, 2};
    lstm_config c = config(2, 2, 2, true, 0.25f);
    fixture f;
    fix_init(&f, &c, B, N, true, 60);
    const int DH = lstm_out_width(&c);
    const size_t nx = (size_t)B * N * c.I, no = (size_t)B * N * DH;
    float *x = tu_normal(nx, 60, 1, 1.0), *dout = tu_normal(no, 60, 2, 1.0), *dx = tu_alloc_f(nx);
    lstm_dims d = {B, N, lengths, AB_DEV_CPU, 0};
    cr_assert_eq(lstm_stack_forward(&c, &d, x, &f.p, &f.a, &f.s, true, 61, 0), 0, "%s", ab_error());
    cr_assert_eq(lstm_stack_backward(&c, &d, dx, &f.g, dout, x, &f.p, &f.a, &f.s, true), 0, "%s", ab_error());

    const uint8_t *masks[1] = {f.a.layer[0].mask};
    ref_lstm_drop rd = {masks, c.dropout};
    double *pd = tu_to_double(f.params, f.pt.total), *xd = tu_to_double(x, nx), *w = tu_to_double(dout, no);
    double *gd = tu_alloc_d(f.pt.total), *dxd = tu_alloc_d(nx);
    fd_ctx ctx = {ref_cfg(&c), ref_view(&f, pd), xd, B, N, lengths, &rd};
    ref_lstm_params rg = ref_view(&f, gd);
    ref_lstm_backward(&ctx.rc, &ctx.rp, xd, B, N, lengths, &rd, w, dxd, &rg);

    double *fd = tu_alloc_d(f.pt.total), *fdx = tu_alloc_d(nx);
    tu_fd_grad(fd_forward, &ctx, xd, nx, w, no, FD_STEP, fdx);
    tu_fd_grad(fd_forward, &ctx, pd, f.pt.total, w, no, FD_STEP, fd);
    /* the reference's gradient in double (tu_rel_err takes floats, whose rounding,
     * 6e-8, would hide what this checks) */
    double scale = fmax(tu_max_abs(fdx, nx), 1e-30), e = 0;
    for (size_t i = 0; i < nx; i++) e = fmax(e, fabs(dxd[i] - fdx[i]));
    if (tu_verbose()) fprintf(stderr, "reference dx vs fd: %.3g\n", e / scale);
    cr_expect_lt(e / scale, REF_FD_TOL, "reference dx against finite differences: %g", e / scale);
    for (int i = 0; i < f.pt.n; i++) {
        const tf_tensor *t = &f.pt.t[i];
        double s = fmax(tu_max_abs(fd + t->offset, t->count), 1e-30), m = 0;
        for (size_t j = 0; j < t->count; j++) m = fmax(m, fabs(gd[t->offset + j] - fd[t->offset + j]));
        if (tu_verbose()) fprintf(stderr, "reference d%s vs fd: %.3g\n", t->name, m / s);
        cr_expect_lt(m / s, REF_FD_TOL, "reference d%s against finite differences: %g", t->name, m / s);
    }
    /* the float backward against the differences */
    double ex = tu_rel_err(dx, fdx, nx, 1e-30);
    if (tu_verbose()) fprintf(stderr, "float dx vs fd: %.3g\n", ex);
    cr_expect_lt(ex, FLOAT_FD_TOL, "float dx against finite differences: %g", ex);
    expect_param_grads(&f, fd, FLOAT_FD_TOL, "float vs fd");
    free(x), free(dout), free(dx), free(pd), free(xd), free(w), free(gd), free(dxd), free(fd), free(fdx);
    fix_free(&f);
}

/* ---- padding ---- */

/* Padding positions: their output is exactly 0, dx there stays exactly as it was,
 * and neither what x holds there nor what dout holds there changes any result (the
 * same values with other padding contents, compared with ==). */
Test(lstm, padding_is_zero_and_never_read) {
    const int B = 3, N = 7, lengths[3] = {7, 0, 2};
    lstm_config c = config(5, 4, 2, true, 0.0f);
    const int DH = lstm_out_width(&c);
    const size_t nx = (size_t)B * N * c.I, no = (size_t)B * N * DH;
    float *x[2], *dout[2], *out[2], *dx[2], *grads[2];
    for (int r = 0; r < 2; r++) {
        fixture f;
        fix_init(&f, &c, B, N, false, 70);
        x[r] = tu_normal(nx, 70, 1, 1.0);
        dout[r] = tu_normal(no, 70, 2, 1.0);
        dx[r] = tu_alloc_f(nx);
        for (int b = 0; b < B; b++)
            for (int n = lengths[b]; n < N; n++) {
                for (int i = 0; i < c.I; i++) x[r][((size_t)b * N + n) * c.I + i] = r ? 1e4f * (float)(i + 1) : 0.0f;
                for (int k = 0; k < DH; k++) dout[r][((size_t)b * N + n) * DH + k] = r ? -3e3f : 0.0f;
            }
        lstm_dims d = {B, N, lengths, AB_DEV_CPU, 0};
        cr_assert_eq(lstm_stack_forward(&c, &d, x[r], &f.p, &f.a, &f.s, false, 0, 0), 0, "%s", ab_error());
        cr_assert_eq(lstm_stack_backward(&c, &d, dx[r], &f.g, dout[r], x[r], &f.p, &f.a, &f.s, false), 0, "%s",
                     ab_error());
        out[r] = tu_alloc_f(no);
        memcpy(out[r], lstm_output(&c, &f.a), sizeof(float) * no);
        grads[r] = tu_alloc_f(f.pt.total);
        memcpy(grads[r], f.grads, sizeof(float) * f.pt.total);
        if (r == 1) {
            for (size_t i = 0; i < no; i++) cr_assert(out[1][i] == out[0][i], "output %zu depends on padding", i);
            for (size_t i = 0; i < nx; i++) cr_assert(dx[1][i] == dx[0][i], "dx %zu depends on padding", i);
            for (size_t i = 0; i < f.pt.total; i++)
                cr_assert(grads[1][i] == grads[0][i], "parameter gradient %zu depends on padding", i);
        }
        fix_free(&f);
    }
    for (int b = 0; b < B; b++)
        for (int n = lengths[b]; n < N; n++) {
            for (int k = 0; k < DH; k++) cr_expect(out[1][((size_t)b * N + n) * DH + k] == 0.0f);
            for (int i = 0; i < c.I; i++) cr_expect(dx[1][((size_t)b * N + n) * c.I + i] == 0.0f);
        }
    /* while valid positions did get gradient */
    float mx = 0.0f;
    for (size_t i = 0; i < (size_t)N * c.I; i++) mx = fmaxf(mx, fabsf(dx[1][i]));
    cr_expect(mx > 0.0f, "no gradient reached row 0's input");
    for (int r = 0; r < 2; r++) free(x[r]), free(dout[r]), free(out[r]), free(dx[r]), free(grads[r]);
}

/* ---- the state carries ---- */

/* Perturbing x at position m of a row changes the forward direction's outputs at
 * positions >= m and the reverse direction's at positions <= m, and nothing else:
 * not the other direction's side (bit for bit), not the other row. */
Test(lstm, state_carries_in_each_direction) {
    const int B = 2, N = 7, lengths[2] = {7, 5}, m = 3;
    lstm_config c = config(3, 4, 1, true, 0.0f);
    const int H = c.H, DH = lstm_out_width(&c);
    const size_t nx = (size_t)B * N * c.I, no = (size_t)B * N * DH;
    fixture f;
    fix_init(&f, &c, B, N, false, 80);
    float *x = tu_normal(nx, 80, 1, 1.0), *base = tu_alloc_f(no);
    lstm_dims d = {B, N, lengths, AB_DEV_CPU, 0};
    cr_assert_eq(lstm_stack_forward(&c, &d, x, &f.p, &f.a, &f.s, false, 0, 0), 0, "%s", ab_error());
    memcpy(base, lstm_output(&c, &f.a), sizeof(float) * no);
    for (int i = 0; i < c.I; i++) x[(size_t)m * c.I + i] += 1.0f; /* row 0, position m */
    cr_assert_eq(lstm_stack_forward(&c, &d, x, &f.p, &f.a, &f.s, false, 0, 0), 0, "%s", ab_error());
    const float *out = lstm_output(&c, &f.a);
    for (int n = 0; n < N; n++)
        for (int dir = 0; dir < 2; dir++) {
            bool changed = false;
            for (int j = 0; j < H; j++) {
                size_t i = (size_t)n * DH + (size_t)dir * H + j;
                changed |= out[i] != base[i];
            }
            bool expect = dir == 0 ? n >= m : n <= m;
            cr_expect_eq(changed, expect, "direction %d position %d: changed %d, expected %d", dir, n, changed,
                         expect);
        }
    cr_expect(memcmp(out + (size_t)N * DH, base + (size_t)N * DH, sizeof(float) * (size_t)N * DH) == 0,
              "row 1 changed with row 0's input");

    /* two unidirectional layers: a change at position 0 reaches every later position */
    lstm_config c2 = config(3, 4, 2, false, 0.0f);
    fixture f2;
    fix_init(&f2, &c2, 1, N, false, 81);
    float *x2 = tu_normal((size_t)N * 3, 81, 1, 1.0), *b2 = tu_alloc_f((size_t)N * 4);
    lstm_dims d2 = {1, N, NULL, AB_DEV_CPU, 0};
    cr_assert_eq(lstm_stack_forward(&c2, &d2, x2, &f2.p, &f2.a, &f2.s, false, 0, 0), 0, "%s", ab_error());
    memcpy(b2, lstm_output(&c2, &f2.a), sizeof(float) * (size_t)N * 4);
    x2[0] += 0.5f;
    cr_assert_eq(lstm_stack_forward(&c2, &d2, x2, &f2.p, &f2.a, &f2.s, false, 0, 0), 0, "%s", ab_error());
    const float *o2 = lstm_output(&c2, &f2.a);
    for (int n = 0; n < N; n++) {
        bool changed = false;
        for (int j = 0; j < 4; j++) changed |= o2[n * 4 + j] != b2[n * 4 + j];
        cr_expect(changed, "position %d did not see the change at position 0", n);
    }
    free(x), free(base), free(x2), free(b2);
    fix_free(&f);
    fix_free(&f2);
}

/* ---- determinism and accumulation ---- */

/* One forward and backward (dropout in training, padding) on fresh NaN-filled
 * buffers; copies of the output, dx and the gradients. */
static void run_once(const lstm_config *c, int B, int N, const int *lengths, const float *x, const float *dout,
                     const float *g0, const float *dx0, float *out, float *dx, float *grads) {
    fixture f;
    fix_init(&f, c, B, N, true, 90);
    const size_t nx = (size_t)B * N * c->I, no = (size_t)B * N * lstm_out_width(c);
    if (g0) memcpy(f.grads, g0, sizeof(float) * f.pt.total);
    if (dx0) memcpy(dx, dx0, sizeof(float) * nx);
    else memset(dx, 0, sizeof(float) * nx);
    lstm_dims d = {B, N, lengths, AB_DEV_CPU, 0};
    cr_assert_eq(lstm_stack_forward(c, &d, x, &f.p, &f.a, &f.s, true, 91, 7), 0, "%s", ab_error());
    cr_assert_eq(lstm_stack_backward(c, &d, dx, &f.g, dout, x, &f.p, &f.a, &f.s, true), 0, "%s", ab_error());
    memcpy(out, lstm_output(c, &f.a), sizeof(float) * no);
    memcpy(grads, f.grads, sizeof(float) * f.pt.total);
    fix_free(&f);
}

static size_t param_count(const lstm_config *c) {
    tf_table t;
    lstm_params p;
    tf_table_init(&t, sizeof(float), 1);
    tf_table_begin(&t, NULL);
    lstm_carve_params(&t, &p, c);
    size_t n = t.total;
    tf_table_free(&t);
    return n;
}

Test(lstm, repeat_is_bit_identical_and_backward_accumulates) {
    const int B = 3, N = 7, lengths[3] = {5, 7, 1};
    lstm_config c = config(5, 4, 2, true, 0.2f);
    const size_t nx = (size_t)B * N * c.I, no = (size_t)B * N * lstm_out_width(&c), np = param_count(&c);
    float *x = tu_normal(nx, 92, 1, 1.0), *dout = tu_normal(no, 92, 2, 1.0);
    float *out[2], *dx[2], *g[2];
    for (int r = 0; r < 2; r++) {
        out[r] = tu_alloc_f(no), dx[r] = tu_alloc_f(nx), g[r] = tu_alloc_f(np);
        run_once(&c, B, N, lengths, x, dout, NULL, NULL, out[r], dx[r], g[r]);
    }
    cr_expect(memcmp(out[0], out[1], sizeof(float) * no) == 0, "outputs differ between two runs");
    cr_expect(memcmp(dx[0], dx[1], sizeof(float) * nx) == 0, "dx differs between two runs");
    cr_expect(memcmp(g[0], g[1], sizeof(float) * np) == 0, "gradients differ between two runs");

    /* from non-zero starting gradients: G0 + the gradient */
    float *g0 = tu_normal(np, 92, 3, 1.0), *dx0 = tu_normal(nx, 92, 4, 1.0);
    float *ga = tu_alloc_f(np), *dxa = tu_alloc_f(nx), *outa = tu_alloc_f(no);
    run_once(&c, B, N, lengths, x, dout, g0, dx0, outa, dxa, ga);
    double *wg = tu_alloc_d(np), *wx = tu_alloc_d(nx);
    for (size_t i = 0; i < np; i++) wg[i] = (double)g0[i] + g[0][i];
    for (size_t i = 0; i < nx; i++) wx[i] = (double)dx0[i] + dx[0][i];
    double eg = tu_rel_err(ga, wg, np, 1e-30), ex = tu_rel_err(dxa, wx, nx, 1e-30);
    if (tu_verbose()) fprintf(stderr, "accumulation: grads %.3g dx %.3g\n", eg, ex);
    cr_expect_lt(eg, ACC_TOL, "parameter gradients do not accumulate: %g", eg);
    cr_expect_lt(ex, ACC_TOL, "dx does not accumulate: %g", ex);
    /* dx of padding positions keeps its starting value exactly */
    for (int b = 0; b < B; b++)
        for (int n = lengths[b]; n < N; n++)
            for (int i = 0; i < c.I; i++) {
                size_t k = ((size_t)b * N + n) * c.I + i;
                cr_expect(dxa[k] == dx0[k], "padding dx (%d, %d) changed", b, n);
            }
    for (int r = 0; r < 2; r++) free(out[r]), free(dx[r]), free(g[r]);
    free(x), free(dout), free(g0), free(dx0), free(ga), free(dxa), free(outa), free(wg), free(wx);
}

/* ---- tables, initialisation, refusals ---- */

Test(lstm, tables_and_initialisation) {
    lstm_config c = config(5, 4, 2, true, 0.0f);
    fixture f;
    fix_init(&f, &c, 2, 3, false, 100);
    /* PyTorch's names and shapes, layer by layer, forward then reverse; one block */
    const char *names[] = {"weight_ih_l0", "weight_hh_l0", "bias_l0", "weight_ih_l0_reverse", "weight_hh_l0_reverse",
                           "bias_l0_reverse", "weight_ih_l1", "weight_hh_l1", "bias_l1", "weight_ih_l1_reverse",
                           "weight_hh_l1_reverse", "bias_l1_reverse"};
    cr_assert_eq(f.pt.n, 12);
    size_t off = 0;
    for (int i = 0; i < 12; i++) {
        const tf_tensor *t = &f.pt.t[i];
        cr_expect_str_eq(t->name, names[i]);
        cr_expect_eq(t->offset, off, "%s is not contiguous", t->name);
        cr_expect_eq(t->decay, i % 3 != 2, "%s: decay flag", t->name);
        off += t->count;
    }
    cr_expect_eq(f.pt.total, off);
    cr_expect_eq(f.pt.t[0].count, 16u * 5, "weight_ih_l0 is (4H, I)");
    cr_expect_eq(f.pt.t[6].count, 16u * 8, "weight_ih_l1 is (4H, 2H)");
    cr_expect_eq(f.pt.t[1].count, 16u * 4, "weight_hh is (4H, H)");
    /* the list is the table's order; values uniform(+-1/sqrt(H)) from (seed, base + k, j) */
    lstm_init_tensor list[LSTM_MAX_TENSORS];
    cr_assert_eq(lstm_init_list(&c, &f.p, list), 12);
    cr_expect_eq(lstm_init_list(&c, &f.p, NULL), 12);
    double lo = 1, hi = -1;
    for (int k = 0; k < 12; k++) {
        cr_expect_eq(list[k].p, f.params + f.pt.t[k].offset);
        cr_expect_eq(list[k].count, f.pt.t[k].count);
        cr_expect_eq(list[k].bound, 0.5);
        for (size_t j = 0; j < list[k].count; j++) {
            float want = (float)((2.0 * ab_rng_uniform(100, (uint64_t)k, j) - 1.0) * 0.5);
            cr_assert_eq(list[k].p[j], want, "tensor %d element %zu", k, j);
            lo = fmin(lo, list[k].p[j]);
            hi = fmax(hi, list[k].p[j]);
        }
    }
    /* inside the bound, and reaching near it: of 384 uniform draws none lands within
     * 0.1 of an end with probability 0.9^384 ~ 1e-18 (the fixed seed passes) */
    cr_expect(lo >= -0.5 && hi <= 0.5 && lo < -0.4 && hi > 0.4, "values span +-1/sqrt(H): [%g, %g]", lo, hi);
    /* activations: what the header's memory figures say, per position (B N = 6) */
    size_t per_pos = 0;
    for (int i = 0; i < f.at.n; i++)
        if (f.at.t[i].ndim == 3) per_pos += f.at.t[i].count * f.at.t[i].elem_size;
    cr_expect_eq(per_pos, 6u * 2 * 6 * 2 * 4 * 4, "6 D H floats per position and layer");
    fix_free(&f);
}

Test(lstm, bad_calls_are_refused) {
    lstm_config c = config(3, 4, 2, false, 0.5f);
    fixture f;
    fix_init(&f, &c, 2, 5, false, 110);
    float *x = tu_normal(2 * 5 * 3, 110, 1, 1.0);
    int bad[2] = {5, 6}, neg[2] = {-1, 2};
    lstm_dims d = {2, 5, bad, AB_DEV_CPU, 0};
    cr_expect_eq(lstm_stack_forward(&c, &d, x, &f.p, &f.a, &f.s, false, 0, 0), AB_EINVAL);
    cr_expect(strstr(ab_error(), "lengths[1] = 6") != NULL, "%s", ab_error());
    d.lengths = neg;
    cr_expect_eq(lstm_stack_forward(&c, &d, x, &f.p, &f.a, &f.s, false, 0, 0), AB_EINVAL);
    d.lengths = NULL;
    d.B = 3; /* more than carved */
    cr_expect_eq(lstm_stack_forward(&c, &d, x, &f.p, &f.a, &f.s, false, 0, 0), AB_EINVAL);
    d.B = 2;
    d.N = 0;
    cr_expect_eq(lstm_stack_forward(&c, &d, x, &f.p, &f.a, &f.s, false, 0, 0), AB_EINVAL);
    d.N = 5;
    /* dropout in training needs the masks */
    cr_expect_eq(lstm_stack_forward(&c, &d, x, &f.p, &f.a, &f.s, true, 0, 0), AB_EINVAL);
    cr_expect(strstr(ab_error(), "masks") != NULL, "%s", ab_error());
    cr_expect_eq(lstm_stack_forward(&c, &d, x, &f.p, &f.a, &f.s, false, 0, 0), 0, "%s", ab_error());
    /* configs */
    lstm_config bads[] = {config(0, 4, 1, false, 0), config(3, 0, 1, false, 0), config(3, 4, 0, false, 0),
                          config(3, 4, LSTM_MAX_LAYERS + 1, false, 0), config(3, 4, 1, false, 1.0f),
                          config(3, 4, 1, false, -0.1f)};
    for (size_t i = 0; i < sizeof bads / sizeof *bads; i++) {
        cr_expect_eq(lstm_check_config(&bads[i]), AB_EINVAL, "config %zu accepted", i);
        tf_table t;
        lstm_params p;
        tf_table_init(&t, sizeof(float), 1);
        tf_table_begin(&t, NULL);
        lstm_carve_params(&t, &p, &bads[i]);
        cr_expect_eq(t.err, AB_EINVAL, "config %zu carved", i);
        tf_table_free(&t);
    }
    free(x);
    fix_free(&f);
}
