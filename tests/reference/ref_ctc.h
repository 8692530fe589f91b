/* Plain double-precision reference of CTC (models/ctc.h), written for clarity and
 * with another method than the library's: the forward-backward recursion in
 * probability space, rescaled at every frame (Rabiner's scaling), instead of log
 * space; and for tiny problems the sum over every path. Used only by the tests.
 *
 * One row: logits (T, K) of T frames and K outputs, output 0 the blank and output
 * c + 1 label c; labels (L) in [0, K - 1). A path is one output per frame; it maps to
 * a label sequence by collapsing repeats and then dropping blanks, and
 * p(labels) = sum over the paths that map to the labels of prod_t softmax(logits_t)
 * at the path's output. */
#ifndef AB_REF_CTC_H
#define AB_REF_CTC_H

/* -log p(labels) as the sum over all K^T paths (tiny T and K only). INFINITY when no
 * path maps to the labels. T = 0: the empty path, 0 when L = 0. */
double ref_ctc_nll_brute(const double *logits, int T, int K, const int *labels, int L);

/* -log p(labels) by the scaled forward recursion over the extended sequence (a blank
 * before, between and after the labels), and with grad non-NULL (T, K) its gradient
 * with respect to the logits: softmax(logits_t) - the posterior occupancy of each
 * output at t (from the scaled forward and backward variables). INFINITY, and a zero
 * gradient, when no alignment exists. */
double ref_ctc_nll(const double *logits, int T, int K, const int *labels, int L, double *grad);

/* The best path: the first largest output of every frame, repeats collapsed, blanks
 * dropped; writes the labels (c for output c + 1) into out (room for T) and returns
 * their count. */
int ref_ctc_best_path(const double *logits, int T, int K, int *out);

/* The Levenshtein distance between a (na) and b (nb) from the full dynamic-programming
 * table: the fewest substitutions, deletions and insertions turning a into b. */
int ref_edit_distance(const int *a, int na, const int *b, int nb);

#endif
