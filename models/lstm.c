/* LSTM stack (lstm.h): the parameter/activation/scratch tables, initialisation, the
 * step loops of forward and backward on the device of lstm_dims (matrix products
 * and the element-wise step, ld_lstm_step_*, through the device's table of layers,
 * layers_dev.h; the CPU version of that step is lstm_step.c). */
#include "lstm.h"

#include "layers_dev.h"

#include "../harness/device.h"
#include "../harness/error.h"
#include "../harness/rng.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Evaluates a call returning an error code; returns it from the caller on failure. */
#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        int rc_ = (call);                                                                                              \
        if (rc_) return rc_;                                                                                           \
    } while (0)

/* ---- configuration ---- */

int lstm_check_config(const lstm_config *c) {
    if (!c) return ab_fail(AB_EINVAL, "lstm: NULL config");
    if (c->I < 1 || c->H < 1) return ab_fail(AB_EINVAL, "lstm: widths must be >= 1 (I = %d, H = %d)", c->I, c->H);
    if (c->layers < 1 || c->layers > LSTM_MAX_LAYERS)
        return ab_fail(AB_EINVAL, "lstm: layers = %d outside [1, %d]", c->layers, LSTM_MAX_LAYERS);
    if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
        return ab_fail(AB_EINVAL, "lstm: dropout %g outside [0, 1)", (double)c->dropout);
    if (c->H > (1 << 28) || c->I > (1 << 28)) return ab_fail(AB_EINVAL, "lstm: widths too large");
    return 0;
}

int lstm_dirs(const lstm_config *c) { return c->bidirectional ? 2 : 1; }
int lstm_out_width(const lstm_config *c) { return lstm_dirs(c) * c->H; }
int lstm_in_width(const lstm_config *c, int layer) { return layer == 0 ? c->I : lstm_out_width(c); }

/* ---- size tables ---- */

/* Refuses a bad config in a table pass (its message set). */
static bool table_config_ok(tf_table *t, const lstm_config *c) {
    if (t->err) return false;
    int rc = lstm_check_config(c);
    if (rc) t->err = rc;
    return rc == 0;
}

void lstm_carve_params(tf_table *t, lstm_params *p, const lstm_config *c) {
    memset(p, 0, sizeof *p);
    if (!table_config_ok(t, c)) return;
    const int64_t G = 4 * (int64_t)c->H;
    char name[TF_NAME_MAX];
    for (int l = 0; l < c->layers; l++)
        for (int dir = 0; dir < lstm_dirs(c); dir++) {
            const char *suffix = dir ? "_reverse" : "";
            lstm_dir_params *q = &p->dir[l][dir];
            snprintf(name, sizeof name, "weight_ih_l%d%s", l, suffix);
            q->w_ih = tf_carve_f(t, name, true, 2, G, lstm_in_width(c, l), 0, 0);
            snprintf(name, sizeof name, "weight_hh_l%d%s", l, suffix);
            q->w_hh = tf_carve_f(t, name, true, 2, G, c->H, 0, 0);
            snprintf(name, sizeof name, "bias_l%d%s", l, suffix);
            q->b = tf_carve_f(t, name, false, 1, G, 0, 0, 0);
        }
}

void lstm_carve_acts(tf_table *t, lstm_acts *a, const lstm_config *c, int B, int N, bool with_dropout) {
    memset(a, 0, sizeof *a);
    a->max_B = B;
    a->max_N = N;
    a->with_dropout = with_dropout;
    if (!table_config_ok(t, c)) return;
    const int64_t H = c->H, DH = lstm_out_width(c);
    char name[TF_NAME_MAX];
    a->lengths = tf_carve(t, "lengths", sizeof(int), false, 1, B, 0, 0, 0);
    for (int l = 0; l < c->layers; l++) {
        lstm_layer_acts *la = &a->layer[l];
        for (int dir = 0; dir < lstm_dirs(c); dir++) {
            const char *suffix = dir ? "_reverse" : "";
            snprintf(name, sizeof name, "l%d.gates%s", l, suffix);
            la->gates[dir] = tf_carve_f(t, name, false, 3, B, N, 4 * H, 0);
            snprintf(name, sizeof name, "l%d.c%s", l, suffix);
            la->c[dir] = tf_carve_f(t, name, false, 3, B, N, H, 0);
        }
        snprintf(name, sizeof name, "l%d.out", l);
        la->out = tf_carve_f(t, name, false, 3, B, N, DH, 0);
        if (with_dropout && l < c->layers - 1) {
            snprintf(name, sizeof name, "l%d.drop", l);
            la->drop = tf_carve_f(t, name, false, 3, B, N, DH, 0);
            snprintf(name, sizeof name, "l%d.drop_mask", l);
            la->mask = tf_carve(t, name, 1, false, 3, B, N, DH, 0);
        }
    }
}

void lstm_carve_scratch(tf_table *t, lstm_scratch *s, const lstm_config *c, int B, int N) {
    memset(s, 0, sizeof *s);
    if (!table_config_ok(t, c)) return;
    const int64_t H = c->H, DH = lstm_out_width(c);
    s->step = tf_carve_f(t, "step", false, 2, B, 4 * H, 0, 0);
    s->h = tf_carve_f(t, "h", false, 2, B, H, 0, 0);
    s->c = tf_carve_f(t, "c", false, 2, B, H, 0, 0);
    s->dgates = tf_carve_f(t, "dgates", false, 3, B, N, 4 * H, 0);
    s->hprev = tf_carve_f(t, "hprev", false, 3, B, N, H, 0);
    if (c->layers > 1) { /* gradients between layers */
        s->d0 = tf_carve_f(t, "d0", false, 3, B, N, DH, 0);
        s->d1 = tf_carve_f(t, "d1", false, 3, B, N, DH, 0);
    }
}

/* ---- initialisation ---- */

int lstm_init_list(const lstm_config *c, const lstm_params *p, lstm_init_tensor *out) {
    if (lstm_check_config(c)) return 0;
    const double bound = 1.0 / sqrt((double)c->H);
    const size_t G = 4 * (size_t)c->H;
    int n = 0;
    for (int l = 0; l < c->layers; l++)
        for (int dir = 0; dir < lstm_dirs(c); dir++) {
            const lstm_dir_params *q = &p->dir[l][dir];
            if (out) {
                out[n] = (lstm_init_tensor){q->w_ih, G * (size_t)lstm_in_width(c, l), bound};
                out[n + 1] = (lstm_init_tensor){q->w_hh, G * (size_t)c->H, bound};
                out[n + 2] = (lstm_init_tensor){q->b, G, bound};
            }
            n += 3;
        }
    return n;
}

void lstm_init_params(const lstm_config *c, const lstm_params *host, uint64_t seed, uint64_t stream_base) {
    lstm_init_tensor t[LSTM_MAX_TENSORS];
    int n = lstm_init_list(c, host, t);
    for (int k = 0; k < n; k++)
        for (size_t j = 0; j < t[k].count; j++)
            t[k].p[j] = (float)((2.0 * ab_rng_uniform(seed, stream_base + (uint64_t)k, j) - 1.0) * t[k].bound);
}

/* ---- the stack ---- */

static int check_call(const lstm_config *c, const lstm_dims *d, const lstm_acts *a, const char *what) {
    TRY(lstm_check_config(c));
    if (!d) return ab_fail(AB_EINVAL, "%s: NULL dims", what);
    if ((unsigned)d->device >= AB_DEV_COUNT)
        return ab_fail(AB_EINVAL, "%s: unknown device %d", what, (int)d->device);
    if (d->B < 1 || d->N < 1 || d->B > a->max_B || d->N > a->max_N)
        return ab_fail(AB_EINVAL, "%s: batch %d and length %d must be in [1, %d] and [1, %d] (as carved)", what,
                       d->B, d->N, a->max_B, a->max_N);
    /* the widest tensor of a call, B N rows of 4H, I or D H, indexed by int products */
    int64_t widest = 4 * (int64_t)c->H;
    if (c->I > widest) widest = c->I;
    if ((int64_t)d->B * d->N * widest > INT32_MAX)
        return ab_fail(AB_EINVAL, "%s: batch %d x length %d is too large for one call", what, d->B, d->N);
    if (d->lengths)
        for (int b = 0; b < d->B; b++)
            if (d->lengths[b] < 0 || d->lengths[b] > d->N)
                return ab_fail(AB_EINVAL, "%s: lengths[%d] = %d outside [0, %d]", what, b, d->lengths[b], d->N);
    return 0;
}

/* The number of steps (the longest row) and whether any position is padding. */
static int steps_of(const lstm_dims *d, bool *padded) {
    int kmax = d->lengths ? 0 : d->N;
    *padded = false;
    for (int b = 0; d->lengths && b < d->B; b++) {
        if (d->lengths[b] > kmax) kmax = d->lengths[b];
        if (d->lengths[b] < d->N) *padded = true;
    }
    return kmax;
}

static bool use_dropout(const lstm_config *c, bool train) { return train && c->dropout > 0.0f && c->layers > 1; }

/* The input of layer l (x for layer 0). */
static const float *layer_input(const lstm_acts *a, const float *x, int l, bool drop) {
    if (l == 0) return x;
    return drop ? a->layer[l - 1].drop : a->layer[l - 1].out;
}

static int dir_forward(const lstm_config *c, const lstm_dims *d, int l, int dir, const float *x,
                       const lstm_dir_params *p, lstm_layer_acts *la, const int *dlen, int kmax, lstm_scratch *ws) {
    const int B = d->B, N = d->N, H = c->H, DH = lstm_out_width(c);
    const ab_device dev = d->device;
    /* the input part of every position at once: gates = x W_ih^T + b */
    TRY(ld_dense_forward(dev, la->gates[dir], x, p->w_ih, p->b, B * N, lstm_in_width(c, l), 4 * H));
    lstm_step_shape s = {B, N, H, 0, dir == 1, dlen};
    for (int k = 0; k < kmax; k++) {
        s.k = k;
        if (k > 0) TRY(ld_dense_forward(dev, ws->step, ws->h, p->w_hh, NULL, B, H, 4 * H)); /* h W_hh^T */
        TRY(ld_lstm_step_forward(dev, &s, la->gates[dir], la->c[dir], la->out + (size_t)dir * H, DH, ws->h, ws->c,
                                 k > 0 ? ws->step : NULL));
    }
    return 0;
}

int lstm_stack_forward(const lstm_config *c, const lstm_dims *d, const float *x, const lstm_params *p,
                       lstm_acts *act, lstm_scratch *ws, bool train, uint64_t seed, uint64_t stream_base) {
    TRY(check_call(c, d, act, "lstm_stack_forward"));
    const bool drop = use_dropout(c, train);
    if (drop && !act->with_dropout)
        return ab_fail(AB_EINVAL, "lstm_stack_forward: dropout requested but no masks were carved");
    const ab_device dev = d->device;
    const size_t n = (size_t)d->B * d->N * lstm_out_width(c);
    bool padded;
    const int kmax = steps_of(d, &padded);
    const int *dlen = NULL;
    if (d->lengths) {
        TRY(ab_dev_upload(dev, act->lengths, d->lengths, sizeof(int) * (size_t)d->B));
        dlen = act->lengths;
    }
    for (int l = 0; l < c->layers; l++) {
        lstm_layer_acts *la = &act->layer[l];
        if (padded) TRY(ld_zero(dev, la->out, sizeof(float) * n)); /* the steps write only valid positions */
        const float *in = layer_input(act, x, l, drop);
        for (int dir = 0; dir < lstm_dirs(c); dir++)
            TRY(dir_forward(c, d, l, dir, in, &p->dir[l][dir], la, dlen, kmax, ws));
        if (drop && l < c->layers - 1)
            TRY(ld_dropout_forward(dev, la->drop, la->mask, la->out, n, c->dropout, seed,
                                   stream_base + LSTM_DROPOUT_STREAM_STRIDE * (uint64_t)l,
                                   (uint64_t)d->row0 * (uint64_t)d->N * (uint64_t)lstm_out_width(c)));
    }
    return 0;
}

const float *lstm_output(const lstm_config *c, const lstm_acts *a) { return a->layer[c->layers - 1].out; }

/* One direction of layer l backwards: dout is the layer's output gradient (B, N, D H),
 * x its input; dx (B, N, In) += (may be NULL) and g +=. */
static int dir_backward(const lstm_config *c, const lstm_dims *d, int l, int dir, float *dx,
                        const lstm_dir_params *g, const float *dout, const float *x, const lstm_dir_params *p,
                        const lstm_layer_acts *la, const int *dlen, int kmax, bool padded, lstm_scratch *ws) {
    const int B = d->B, N = d->N, H = c->H, DH = lstm_out_width(c), rows = d->B * d->N;
    const ab_device dev = d->device;
    if (padded) { /* the steps write only valid positions; the products below read all */
        TRY(ld_zero(dev, ws->dgates, sizeof(float) * (size_t)rows * 4 * H));
        TRY(ld_zero(dev, ws->hprev, sizeof(float) * (size_t)rows * H));
    }
    lstm_step_shape s = {B, N, H, 0, dir == 1, dlen};
    const size_t off = (size_t)dir * H;
    for (int k = kmax - 1; k >= 0; k--) {
        s.k = k;
        TRY(ld_lstm_step_backward(dev, &s, ws->dgates, ws->step, ws->hprev, ws->c, k < kmax - 1 ? ws->h : NULL,
                                  dout + off, DH, la->gates[dir], la->c[dir], la->out + off, DH));
        /* the carried dh of the previous step: dstep (B, 4H) W_hh (4H, H) */
        if (k > 0) TRY(ld_gemm(dev, false, false, B, H, 4 * H, 1.0f, ws->step, 4 * H, p->w_hh, H, 0.0f, ws->h, H));
    }
    /* dW_hh += dgates^T h_prev; dx += dgates W_ih, dW_ih += dgates^T x, db += sums */
    TRY(ld_dense_backward(dev, NULL, g->w_hh, NULL, ws->dgates, ws->hprev, p->w_hh, rows, H, 4 * H));
    return ld_dense_backward(dev, dx, g->w_ih, g->b, ws->dgates, x, p->w_ih, rows, lstm_in_width(c, l), 4 * H);
}

int lstm_stack_backward(const lstm_config *c, const lstm_dims *d, float *dx, const lstm_params *g,
                        const float *dout, const float *x, const lstm_params *p, const lstm_acts *act,
                        lstm_scratch *ws, bool train) {
    TRY(check_call(c, d, act, "lstm_stack_backward"));
    const bool drop = use_dropout(c, train);
    if (drop && !act->with_dropout)
        return ab_fail(AB_EINVAL, "lstm_stack_backward: dropout requested but no masks were carved");
    const ab_device dev = d->device;
    const size_t n = (size_t)d->B * d->N * lstm_out_width(c);
    bool padded;
    const int kmax = steps_of(d, &padded);
    const int *dlen = d->lengths ? act->lengths : NULL;
    const float *dcur = dout; /* gradient of layer l's output */
    for (int l = c->layers - 1; l >= 0; l--) {
        float *din = dx; /* gradient of layer l's input */
        if (l > 0) {
            din = dcur == ws->d0 ? ws->d1 : ws->d0;
            TRY(ld_zero(dev, din, sizeof(float) * n));
        }
        const float *in = layer_input(act, x, l, drop);
        for (int dir = 0; dir < lstm_dirs(c); dir++)
            TRY(dir_backward(c, d, l, dir, din, &g->dir[l][dir], dcur, in, &p->dir[l][dir], &act->layer[l], dlen,
                             kmax, padded, ws));
        if (l == 0) break;
        if (drop) { /* through layer l-1's dropout, into the other buffer (dcur is spent) */
            float *dd = din == ws->d0 ? ws->d1 : ws->d0;
            TRY(ld_zero(dev, dd, sizeof(float) * n));
            TRY(ld_dropout_backward(dev, dd, din, act->layer[l - 1].mask, n, c->dropout));
            dcur = dd;
        } else {
            dcur = din;
        }
    }
    return 0;
}
