/* Plain double-precision reference of the LSTM stack (models/lstm.h), written for
 * clarity: one sequence at a time, one time step at a time, every sum a loop. Used
 * only by the tests. Layouts as in lstm.h: x (B, N, I), output (B, N, D H) with the
 * forward direction in channels [0, H) and the reverse one in [H, 2H); W_ih (4H, In),
 * W_hh (4H, H), b (4H), gate order i, f, g, o. */
#ifndef AB_REF_LSTM_H
#define AB_REF_LSTM_H

#include <stdbool.h>
#include <stdint.h>

#define REF_LSTM_MAX_LAYERS 8

typedef struct {
    int I, H, layers;
    bool bidirectional;
} ref_lstm_cfg;

typedef struct {
    double *w_ih, *w_hh, *b;
} ref_lstm_dir;

typedef struct {
    ref_lstm_dir dir[REF_LSTM_MAX_LAYERS][2]; /* [layer][0 forward, 1 reverse] */
} ref_lstm_params;                            /* also their gradients */

/* Dropout between layers: masks[l] (B, N, D H) for l < layers - 1 (NULL: no dropout)
 * and the rate: layer l + 1 reads out_l * mask / (1 - p). */
typedef struct {
    const uint8_t *const *masks;
    double p;
} ref_lstm_drop;

/* The stack's output (B, N, D H) for x (B, N, I); lengths NULL (all N) or B values
 * in [0, N]; drop NULL: none. Padding positions of the output are 0. */
void ref_lstm_forward(const ref_lstm_cfg *c, const ref_lstm_params *p, const double *x, int B, int N,
                      const int *lengths, const ref_lstm_drop *drop, double *out);
/* The exact gradient (back-propagation through time) of sum(out * dout) with respect
 * to x and every parameter, ADDED to dx (may be NULL) and g. */
void ref_lstm_backward(const ref_lstm_cfg *c, const ref_lstm_params *p, const double *x, int B, int N,
                       const int *lengths, const ref_lstm_drop *drop, const double *dout, double *dx,
                       const ref_lstm_params *g);

#endif
