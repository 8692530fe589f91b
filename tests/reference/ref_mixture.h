/* Plain double-precision reference of the discretised logistic mixture head
 * (models/layers.h: mixture_*), written from the formulas for clarity and with other
 * expressions than the library's (the bin mass as a difference of two sigmoids, on the
 * side of the mean where it does not cancel; gradients as sigma'(z) / mass). Used only
 * by the tests. One position's 3K numbers: K mixture logits, K means, K raw log-scales
 * (clamped below at -7); value v in 0..255 is x = 2v/255 - 1, bin half-width 1/255;
 * edge bins open to -inf and +inf; a middle bin of mass <= 1e-5 takes PixelCNN++'s
 * fallback log pdf(x) + log(2/255). */
#ifndef AB_REF_MIXTURE_H
#define AB_REF_MIXTURE_H

/* log P(v) of one position */
double ref_mixture_log_prob(const double *p, int K, int v);
/* g (3K) = d log P(v) / d p, analytic (0 for a log-scale below the clamp) */
void ref_mixture_log_prob_grad(const double *p, int K, int v, double *g);
/* The exact bin masses P(v), v = 0..255, without the fallback (differences of the
 * component CDFs). */
void ref_mixture_probs(const double *p, int K, double *P);
/* The weighted mean NLL over BT positions (out (BT, 3K); weights NULL: all ones;
 * positions of weight 0 are not read), and with dout non-NULL its gradient, written
 * (dout (BT, 3K)). 0 when the weights sum to 0. */
double ref_mixture_nll(const double *out, const int *targets, const double *weights, int BT, int K, double *dout);

#endif
