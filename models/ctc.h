/* Connectionist temporal classification (Graves et al. 2006): the CTC loss of label
 * sequences given per-frame outputs, its gradient, best-path decoding and the edit
 * distance that phone and word error rates are made of. On the CPU (ctc.c) and CUDA
 * (ctc_cuda.cu); the formulas are ctc_core.h's, shared by both.
 *
 * Layout. B rows of N frames of K outputs: logits (B, N, K) row-major, as the model's
 * head writes them. Output 0 is the BLANK; output c + 1 stands for label c, so labels
 * are in [0, K - 1) (a phone set of P phones has K = P + 1). Row b has lengths[b]
 * valid frames T_b in [0, N] (NULL: all N) and counts[b] labels L_b in [0, S], the
 * first L_b entries of its row of labels (B, S); frames past T_b and label slots past
 * L_b are padding: never read, and their gradient is zero.
 *
 * Loss. nll_b = -log p(labels_b | frames 0..T_b-1 of row b), the sum over every
 * alignment (a path of one output per frame that gives the labels once repeats are
 * collapsed and blanks dropped), computed by the forward-backward recursion in log
 * space (ctc_core.h). A row with T_b = 0 has nll 0 when L_b = 0. A row whose labels
 * cannot be aligned to its frames (T_b < L_b + the number of adjacent repeated labels:
 * a repeat needs a blank between, ctc_min_frames) has p = 0: nll = +INFINITY and a zero
 * gradient (never NaN). The model refuses such rows before scoring them (transformer.h:
 * tf_loss_ctc); tasks check their data with ctc_min_frames when they load it.
 *
 * Reduction (what the training driver reports as the loss): the weighted mean of the
 * rows' nll, loss = sum_b w_b nll_b / sum_b w_b (nats per row: per utterance), with
 * weights (B) or NULL (all 1); a row of weight 0 is not scored (not read: its labels
 * may be anything). The statistics are ce_stats (layers.h): loss, weight_sum, counted
 * = the weighted rows, correct = the weighted rows whose best path is exactly their
 * labels. The sums run over rows in order, in double, from each row's log p in double.
 *
 * Gradient. dlogits (B, N, K) += w_b / weight_sum (softmax_t - occupancy_t) for the
 * frames t < T_b of each weighted row with a finite nll, where occupancy_t(k) is the
 * posterior probability that the alignment emits output k at t (the softmax is folded
 * in: the gradient is with respect to the logits).
 *
 * Workspace. The forward keeps each row's log-softmax normaliser per frame and its
 * alpha table (N x (2S + 1) doubles) in `ws` for the backward, which also uses it as
 * scratch; ctc_ws_bytes gives its size (the same on either device). Rows run in
 * parallel (OpenMP on the CPU; one block per row on CUDA, the states of a frame over
 * the block's threads, the frames in sequence). Each row's arithmetic is the same
 * sequence of double operations on both devices, so the two agree to the device's
 * exp and log (bit for bit on the CPU emulator); results never depend on the thread
 * count or the launch. */
#ifndef AB_MODELS_CTC_H
#define AB_MODELS_CTC_H

#include "layers.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CTC_BLANK 0 /* the output index of the blank; label c is output c + 1 */

typedef struct {
    int B; /* rows */
    int N; /* frames per row (the row stride of the logits) */
    int K; /* outputs per frame: the blank and K - 1 labels */
    int S; /* label slots per row (the row stride of the labels): the largest L_b */
} ctc_dims;

/* Bytes of the workspace for d (0 when a size overflows; ctc_dims_check says so). */
size_t ctc_ws_bytes(const ctc_dims *d);
/* 0, or AB_EINVAL naming the problem: B, N >= 1, K >= 2, S >= 0, and a workspace
 * size that fits in a size_t. */
int ctc_dims_check(const ctc_dims *d);

/* The loss (above): nll (B) receives each row's nll (0 for a row of weight 0), st the
 * statistics, ws the forward's tables. lengths NULL or B values in [0, N]; counts B
 * values in [0, S]; the labels of weighted rows in [0, K - 1); weights finite and
 * >= 0 (all checked by the caller). */
void ctc_forward(ce_stats *st, float *nll, const ctc_dims *d, const float *logits, const int *lengths,
                 const int *labels, const int *counts, const float *weights, void *ws);
/* dlogits (B, N, K) += the gradient (above) with weight_sum from the forward's st;
 * the same arguments as the forward that filled ws (which it reads and uses as
 * scratch). Nothing when weight_sum is not > 0. */
void ctc_backward(float *dlogits, const ctc_dims *d, const float *logits, const int *lengths, const int *labels,
                  const int *counts, const float *weights, double weight_sum, void *ws);

/* The same on CUDA (ctc_cuda.cu): every array in device memory (lengths too), st on
 * the host. The forward waits for the device (st is filled when it returns); the
 * backward returns once queued. 0, or an error code with the message of the failed
 * launch or copy. No size limit beyond memory: the kernels loop over frames, states
 * and outputs. */
int ctc_forward_cuda(ce_stats *st, float *nll, const ctc_dims *d, const float *logits, const int *lengths,
                     const int *labels, const int *counts, const float *weights, void *ws);
int ctc_backward_cuda(float *dlogits, const ctc_dims *d, const float *logits, const int *lengths, const int *labels,
                      const int *counts, const float *weights, double weight_sum, void *ws);

/* ---- decoding and scoring (host) ---- */

/* The fewest frames an alignment of labels (L) needs: L plus the number of adjacent
 * equal labels (each pair needs a blank between). */
int ctc_min_frames(const int *labels, int L);
/* Best-path (greedy) decoding of one row's frames x (T, K): the first largest output
 * of each frame, repeats collapsed, blanks dropped. Writes the labels (c for output
 * c + 1) into out (room for T) and returns their count. */
int ctc_best_path(const float *x, int T, int K, int *out);
/* The Levenshtein distance between hyp (nh) and ref (nr): the fewest substitutions,
 * deletions and insertions that turn one into the other. work: nr + 1 ints of scratch.
 * O(nh nr) time. */
int ctc_edit_distance(const int *hyp, int nh, const int *ref, int nr, int *work);
/* The edit distance between the best path of x (T, K) and ref (nr): the errors a
 * phone (or label) error rate sums, PER = sum of errors / sum of nr over a split.
 * work: T + nr + 1 ints of scratch. */
int ctc_best_path_errors(const float *x, int T, int K, const int *ref, int nr, int *work);

#ifdef __cplusplus
}
#endif

#endif
