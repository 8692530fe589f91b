/* One direction's LSTM step, the element-wise pass between the step's matrix products
 * (lstm.h describes the stack around it): the CPU version (lstm_step.c) and the CUDA
 * one (lstm_cuda.cu), which the per-device layer table (layers_dev.h) offers as
 * ld_lstm_step_*. A header of its own below layers_dev.h, so that the stack (lstm.c)
 * reaches the step through the table and nothing here depends on lstm.c. */
#ifndef AB_MODELS_LSTM_STEP_H
#define AB_MODELS_LSTM_STEP_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int B, N, H;
    int k;               /* the step */
    bool reverse;        /* position k (forward) or L_b-1-k (reverse) */
    const int *lengths;  /* B lengths in memory of the device, or NULL: all N */
} lstm_step_shape;

/* For every active row b (k < L_b) at position p, j < H: the pre-activations
 * gates[b, p] (B, N, 4H; x W_ih^T + b) plus hw[b] (B, 4H; h_prev W_hh^T, NULL at
 * k = 0) -> gates[b, p] = i, f, g, o (in place); c (B, N, H) and out[b, p] (row
 * stride out_ld) get the new c and h, as do the state h, cs (B, H). At k = 0 the
 * inactive rows' state is set to 0; later steps leave it. */
void lstm_step_forward(const lstm_step_shape *s, float *gates, float *c, float *out, int out_ld, float *h,
                       float *cs, const float *hw);
/* The same step backwards, for every active row b at position p: dh = dout[b, p]
 * (row stride dout_ld) + dh_rec[b] (the carried gradient; ignored at the row's first
 * step k = L_b-1, and dh_rec may be NULL when k = max L_b - 1) and the carried dc in
 * dcs[b] (ignored likewise) give the pre-activation gate gradients, written to
 * dgates[b, p] (B, N, 4H) and dstep[b] (B, 4H; zero for inactive rows), and the
 * carried dc_prev into dcs[b]; hprev[b, p] (B, N, H) = h_prev (out at the previous
 * position of the direction, row stride out_ld; 0 at k = 0). */
void lstm_step_backward(const lstm_step_shape *s, float *dgates, float *dstep, float *hprev, float *dcs,
                        const float *dh_rec, const float *dout, int dout_ld, const float *gates, const float *c,
                        const float *out, int out_ld);

/* The same on CUDA (models/lstm_cuda.cu): device pointers (the shape itself on the
 * host), one thread per (b, j); 0 or an error code with the failed launch's message. */
int lstm_step_forward_cuda(const lstm_step_shape *s, float *gates, float *c, float *out, int out_ld, float *h,
                           float *cs, const float *hw);
int lstm_step_backward_cuda(const lstm_step_shape *s, float *dgates, float *dstep, float *hprev, float *dcs,
                            const float *dh_rec, const float *dout, int dout_ld, const float *gates,
                            const float *c, const float *out, int out_ld);

#ifdef __cplusplus
}
#endif

#endif
