/* Reference LSTM stack in double: see ref_lstm.h. */
#include "ref_lstm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static int dirs_of(const ref_lstm_cfg *c) { return c->bidirectional ? 2 : 1; }
static int in_width(const ref_lstm_cfg *c, int l) { return l == 0 ? c->I : dirs_of(c) * c->H; }

/* What one direction of one layer computes over one sequence of L positions, kept
 * for its backward, indexed by time t (not by step). */
typedef struct {
    double *gates; /* (L, 4H): i, f, g, o after their nonlinearities */
    double *c;     /* (L, H) */
    double *h;     /* (L, H) */
} dir_run;

/* The position of step s (0..L-1) of a direction, and the previous position in
 * the direction's order (-1 at its first step). */
static int pos_of(int s, int L, bool reverse) { return reverse ? L - 1 - s : s; }
static int prev_of(int s, int L, bool reverse) { return s == 0 ? -1 : pos_of(s - 1, L, reverse); }

/* x: L rows of width In with row stride ldx. */
static void dir_forward(const ref_lstm_dir *p, int In, int H, const double *x, long ldx, int L, bool reverse,
                        dir_run *r) {
    for (int s = 0; s < L; s++) {
        int t = pos_of(s, L, reverse), tp = prev_of(s, L, reverse);
        const double *xt = x + t * ldx;
        const double *hp = tp >= 0 ? r->h + (long)tp * H : NULL, *cp = tp >= 0 ? r->c + (long)tp * H : NULL;
        double *gt = r->gates + (long)t * 4 * H;
        for (int q = 0; q < 4 * H; q++) {
            double z = p->b[q];
            for (int i = 0; i < In; i++) z += p->w_ih[(long)q * In + i] * xt[i];
            for (int i = 0; hp && i < H; i++) z += p->w_hh[(long)q * H + i] * hp[i];
            gt[q] = (q >= 2 * H && q < 3 * H) ? tanh(z) : sigmoid(z);
        }
        for (int j = 0; j < H; j++) {
            double ig = gt[j], fg = gt[H + j], gg = gt[2 * H + j], og = gt[3 * H + j];
            double c = fg * (cp ? cp[j] : 0.0) + ig * gg;
            r->c[(long)t * H + j] = c;
            r->h[(long)t * H + j] = og * tanh(c);
        }
    }
}

/* dh: (L, H) gradient of this direction's outputs (row stride ldd); dx (L rows of
 * stride ldx) += when not NULL, g +=. */
static void dir_backward(const ref_lstm_dir *p, const ref_lstm_dir *g, int In, int H, const double *x, long ldx,
                         int L, bool reverse, const dir_run *r, const double *dh_out, long ldd, double *dx) {
    double *dh_next = calloc((size_t)H, sizeof(double)), *dc_next = calloc((size_t)H, sizeof(double));
    double *dz = malloc(sizeof(double) * 4 * (size_t)H);
    for (int s = L - 1; s >= 0; s--) {
        int t = pos_of(s, L, reverse), tp = prev_of(s, L, reverse);
        const double *gt = r->gates + (long)t * 4 * H, *xt = x + t * ldx;
        const double *hp = tp >= 0 ? r->h + (long)tp * H : NULL, *cp = tp >= 0 ? r->c + (long)tp * H : NULL;
        for (int j = 0; j < H; j++) {
            double ig = gt[j], fg = gt[H + j], gg = gt[2 * H + j], og = gt[3 * H + j];
            double tc = tanh(r->c[(long)t * H + j]);
            double dh = dh_out[t * ldd + j] + dh_next[j];
            double dc = dc_next[j] + dh * og * (1 - tc * tc);
            dz[j] = dc * gg * ig * (1 - ig);
            dz[H + j] = dc * (cp ? cp[j] : 0.0) * fg * (1 - fg);
            dz[2 * H + j] = dc * ig * (1 - gg * gg);
            dz[3 * H + j] = dh * tc * og * (1 - og);
            dc_next[j] = dc * fg;
        }
        for (int j = 0; j < H; j++) dh_next[j] = 0;
        for (int q = 0; q < 4 * H; q++) {
            g->b[q] += dz[q];
            for (int i = 0; i < In; i++) {
                g->w_ih[(long)q * In + i] += dz[q] * xt[i];
                if (dx) dx[t * ldx + i] += dz[q] * p->w_ih[(long)q * In + i];
            }
            for (int i = 0; hp && i < H; i++) {
                g->w_hh[(long)q * H + i] += dz[q] * hp[i];
                dh_next[i] += dz[q] * p->w_hh[(long)q * H + i];
            }
        }
    }
    free(dh_next);
    free(dc_next);
    free(dz);
}

/* Every layer's input and output and every direction's run, for one sequence. */
typedef struct {
    int L;
    double *in[REF_LSTM_MAX_LAYERS + 1]; /* in[l] (L, width): layer l's input (after dropout); in[layers] the output */
    double *raw[REF_LSTM_MAX_LAYERS];    /* (L, D H): layer l's output before dropout */
    dir_run run[REF_LSTM_MAX_LAYERS][2];
} seq_run;

static void seq_forward(const ref_lstm_cfg *c, const ref_lstm_params *p, const double *x, int b, int N, int L,
                        const ref_lstm_drop *drop, seq_run *sr) {
    int H = c->H, D = dirs_of(c), DH = D * H;
    sr->L = L;
    sr->in[0] = malloc(sizeof(double) * ((size_t)L * c->I + 1));
    memcpy(sr->in[0], x + (long)b * N * c->I, sizeof(double) * (size_t)L * c->I);
    for (int l = 0; l < c->layers; l++) {
        int In = in_width(c, l);
        sr->raw[l] = malloc(sizeof(double) * ((size_t)L * DH + 1));
        for (int dir = 0; dir < D; dir++) {
            dir_run *r = &sr->run[l][dir];
            r->gates = malloc(sizeof(double) * ((size_t)L * 4 * H + 1));
            r->c = malloc(sizeof(double) * ((size_t)L * H + 1));
            r->h = malloc(sizeof(double) * ((size_t)L * H + 1));
            dir_forward(&p->dir[l][dir], In, H, sr->in[l], In, L, dir == 1, r);
            for (int t = 0; t < L; t++)
                for (int j = 0; j < H; j++) sr->raw[l][(long)t * DH + dir * H + j] = r->h[(long)t * H + j];
        }
        sr->in[l + 1] = malloc(sizeof(double) * ((size_t)L * DH + 1));
        for (int t = 0; t < L; t++)
            for (int k = 0; k < DH; k++) {
                double v = sr->raw[l][(long)t * DH + k];
                if (drop && drop->masks && l < c->layers - 1) {
                    const uint8_t *m = drop->masks[l] + ((long)b * N + t) * DH;
                    v = m[k] ? v / (1.0 - drop->p) : 0.0;
                }
                sr->in[l + 1][(long)t * DH + k] = v;
            }
    }
}

static void seq_free(const ref_lstm_cfg *c, seq_run *sr) {
    for (int l = 0; l <= c->layers; l++) free(sr->in[l]);
    for (int l = 0; l < c->layers; l++) {
        free(sr->raw[l]);
        for (int dir = 0; dir < dirs_of(c); dir++) {
            free(sr->run[l][dir].gates);
            free(sr->run[l][dir].c);
            free(sr->run[l][dir].h);
        }
    }
}

void ref_lstm_forward(const ref_lstm_cfg *c, const ref_lstm_params *p, const double *x, int B, int N,
                      const int *lengths, const ref_lstm_drop *drop, double *out) {
    int DH = dirs_of(c) * c->H;
    memset(out, 0, sizeof(double) * (size_t)B * N * DH);
    for (int b = 0; b < B; b++) {
        seq_run sr;
        int L = lengths ? lengths[b] : N;
        seq_forward(c, p, x, b, N, L, drop, &sr);
        /* the last layer has no dropout: its output is raw */
        memcpy(out + (long)b * N * DH, sr.raw[c->layers - 1], sizeof(double) * (size_t)L * DH);
        seq_free(c, &sr);
    }
}

void ref_lstm_backward(const ref_lstm_cfg *c, const ref_lstm_params *p, const double *x, int B, int N,
                       const int *lengths, const ref_lstm_drop *drop, const double *dout, double *dx,
                       const ref_lstm_params *g) {
    int H = c->H, D = dirs_of(c), DH = D * H;
    for (int b = 0; b < B; b++) {
        seq_run sr;
        int L = lengths ? lengths[b] : N;
        seq_forward(c, p, x, b, N, L, drop, &sr);
        /* d: gradient of layer l's output (L, D H), starting from dout's valid rows */
        double *d = malloc(sizeof(double) * ((size_t)L * DH + 1));
        memcpy(d, dout + (long)b * N * DH, sizeof(double) * (size_t)L * DH);
        for (int l = c->layers - 1; l >= 0; l--) {
            int In = in_width(c, l);
            double *din = calloc((size_t)L * In + 1, sizeof(double)); /* gradient of layer l's input */
            for (int dir = 0; dir < D; dir++)
                dir_backward(&p->dir[l][dir], &g->dir[l][dir], In, H, sr.in[l], In, L, dir == 1, &sr.run[l][dir],
                             d + dir * H, DH, din);
            free(d);
            if (l > 0 && drop && drop->masks) { /* through layer l-1's dropout */
                for (int t = 0; t < L; t++)
                    for (int k = 0; k < DH; k++) {
                        const uint8_t *m = drop->masks[l - 1] + ((long)b * N + t) * DH;
                        din[(long)t * DH + k] = m[k] ? din[(long)t * DH + k] / (1.0 - drop->p) : 0.0;
                    }
            }
            if (l == 0 && dx)
                for (long i = 0; i < (long)L * In; i++) dx[(long)b * N * In + i] += din[i];
            d = din;
        }
        free(d);
        seq_free(c, &sr);
    }
}
