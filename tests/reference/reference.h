/* Plain double-precision references, written for clarity, used only by the tests.
 * Layout as in attention.h: q, k [B, H, N, D]; v, out [B, H, N, M]; lengths NULL or
 * B valid lengths (padded query rows give zero output). */
#ifndef AB_REFERENCE_H
#define AB_REFERENCE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int B, H, N, D, M;
    bool causal;
    const int *lengths;
} ref_shape;

/* softmax(scale q.k) attention with causal and lengths masks. */
void ref_softmax(const ref_shape *s, double scale, const double *q, const double *k, const double *v, double *out);

/* Sliding-window softmax (the local variant): query i sees keys i - window < j <= i
 * (causal) or |i - j| < window, j < lengths[b]. */
void ref_local(const ref_shape *s, long long window, double scale, const double *q, const double *k, const double *v,
               double *out);

/* Strided sparse attention (the sparse variant): query i sees keys j < lengths[b] with
 * |i - j| < window or |i - j| mod stride == 0, and j <= i when causal (window, stride
 * >= 1). ref_sparse_allowed is that rule for one pair (ignoring lengths). */
bool ref_sparse_allowed(bool causal, long long window, long long stride, int i, int j);
void ref_sparse(const ref_shape *s, long long window, long long stride, double scale, const double *q,
                const double *k, const double *v, double *out);

/* Efficient Attention (Shen et al.), non-causal: softmax of each query row over D,
 * softmax of each key feature over the valid positions, out = Q' (K'^T V); padded rows
 * zero (s->causal is ignored). */
void ref_efficient(const ref_shape *s, const double *q, const double *k, const double *v, double *out);

/* Linformer (the linformer variant), non-causal (s->causal is ignored): per slice
 * Kp = E[:, :L] k[:L], Vp = F[:, :L] v[:L] (E, F: P rows of ld >= N columns, the heads
 * sharing them), out_i = softmax_r(scale q_i . Kp_r) Vp for i < L, padded rows zero.
 * Backward (overwrites dq, dk, dv, dE, dF; dE and dF are P x ld, the columns >= every
 * L zero): the gradients of sum(dout . out). With E = F (share kv) the parameter's
 * gradient is dE + dF. */
void ref_linformer(const ref_shape *s, int P, int ld, const double *E, const double *F, double scale, const double *q,
                   const double *k, const double *v, double *out);
void ref_linformer_backward(const ref_shape *s, int P, int ld, const double *E, const double *F, double scale,
                            const double *q, const double *k, const double *v, const double *dout, double *dq,
                            double *dk, double *dv, double *dE, double *dF);

/* Gated linear attention (the gla variant): g [B, H, N, W] the log-gates (W = D: one per
 * key dimension; W = 1: one per head and position), b_i = sum_{t<=i} g_t, out_i = scale
 * sum_j sum_d q_id k_jd w_ijd v_j with w_ijd = e^(b_id - b_jd) over j <= i (causal) or
 * e^(-|b_id - b_jd|) over every valid j. The backward overwrites dq, dk, dv and dg (the
 * gradients of sum(dout . out)); padded rows zero. */
void ref_gla(const ref_shape *s, int W, double scale, const double *q, const double *k, const double *v,
             const double *g, double *out);
void ref_gla_backward(const ref_shape *s, int W, double scale, const double *q, const double *k, const double *v,
                      const double *g, const double *dout, double *dq, double *dk, double *dv, double *dg);

/* FAVOR+ (attention/favor.h): W [m x D] from seed (Gram-Schmidt of Philox Gaussian
 * blocks, rows scaled by chi norms, each entry rounded to float as the library does);
 * phi(x) = m^-1/2 exp(W x' - |x'|^2/2), x' = D^-1/4 x (unshifted, in double); and linear
 * attention with those features and eps. */
void ref_favor_projection(uint64_t seed, int D, int m, double *W);
void ref_favor_features(const double *W, int D, int m, const double *x, double *phi);
void ref_favor(const ref_shape *s, const double *W, int m, double eps, const double *q, const double *k,
               const double *v, double *out);

/* Linear attention with an explicit similarity: out_i = sum_j sim(q_i,k_j) v_j /
 * (sum_j sim(q_i,k_j) + eps), over allowed j. fmap: 0 elu+1, 1 taylor (1 + cos),
 * 2 polynomial (c + scale q.k)^2 computed directly (no feature map). */
typedef enum { REF_SIM_ELU = 0, REF_SIM_TAYLOR = 1, REF_SIM_POLY = 2 } ref_sim;
void ref_linear(const ref_shape *s, ref_sim sim, double c, double scale, double eps, const double *q,
                const double *k, const double *v, double *out);

/* Retention (RetNet): out_i = scale sum_j gamma[h]^|i-j| (q_i . k_j) v_j over j <= i
 * (causal) or all j, j < lengths[b]; padded rows zero. gamma holds one decay per head.
 * The backward overwrites dq, dk, dv with the gradients of sum(dout . out). */
void ref_retention(const ref_shape *s, const double *gamma, double scale, const double *q, const double *k,
                   const double *v, double *out);
void ref_retention_backward(const ref_shape *s, const double *gamma, double scale, const double *q, const double *k,
                            const double *v, const double *dout, double *dq, double *dk, double *dv);

/* LSH attention given explicit buckets: buckets[((r * B + b) * H + h) * N + i] for
 * round r; keys are the L2-normalised queries; chunk, rounds, combine (0 mean,
 * 1 logsumexp) as in the lsh variant. Per round: stable sort of the valid positions
 * by bucket, chunks of `chunk`, a query attends to its chunk and the previous one
 * (none before chunk 0), causal by original position, itself only when nothing else
 * is allowed (then o = v_i and the round's logsumexp is the self score). Buckets of
 * padded positions are not read. */
void ref_lsh(const ref_shape *s, int rounds, int chunk, int combine, double scale, const int *buckets,
             const double *q, const double *v, double *out);

/* Softmax attention with shared query/key (k = q / max(|q|, 1e-12)) over all valid
 * positions, with the self rule above: what ref_lsh gives when one chunk covers the
 * sequence. */
void ref_shared_qk_softmax(const ref_shape *s, double scale, const double *q, const double *v, double *out);

/* DeltaNet (the deltanet variant), causal: per slice, with qn, kn the L2-normalised
 * q, k (x / sqrt(|x|^2 + eps)), S_0 = 0, S_t = S_{t-1} + beta_t kn_t (v_t - S_{t-1}^T
 * kn_t)^T (D x M), out_t = S_t^T qn_t; beta [B, H, N]; positions >= lengths[b] output
 * zero and are never read (s->causal is ignored). Backward (overwrites dq, dk, dv,
 * dbeta): the gradients of sum(dout . out) by the reverse recurrence, all N states
 * kept; padded positions get zero. */
void ref_deltanet(const ref_shape *s, double eps, const double *q, const double *k, const double *v,
                  const double *beta, double *out);
void ref_deltanet_backward(const ref_shape *s, double eps, const double *q, const double *k, const double *v,
                           const double *beta, const double *dout, double *dq, double *dk, double *dv, double *dbeta);

/* Adam (Kingma & Ba 2015, Algorithm 1) and RAdam (Liu et al. 2019, as the authors'
 * radam.py computes it) in double, one step at a time, written from the published
 * rules with no attention to speed. kind: 0 Adam, 1 RAdam. */
typedef struct {
    int kind;
    double lr, beta1, beta2, eps;
    double weight_decay;
    bool decoupled;    /* p -= lr_t * wd * p; else g += wd * p */
    double clip_norm;  /* 0: none */
    double threshold;  /* RAdam: rectified step when rho_t >= threshold */
    int n_milestones;
    const long long *milestones;
    double gamma;
    long long warmup;
} ref_optim_cfg;

/* lr_t of step t (1-based): lr times gamma for every milestone m < t, times t/warmup
 * during the warm-up. */
double ref_optim_lr(const ref_optim_cfg *c, long long t);
/* Step t on n parameters; decay[i] says whether parameter i is decayed. Updates p, m
 * and v; returns the gradient norm before clipping; *rectified (may be NULL) tells
 * whether RAdam took its rectified step (always 1 for Adam). */
double ref_optim_step(const ref_optim_cfg *c, long long t, int n, double *p, const double *g, double *m, double *v,
                      const bool *decay, int *rectified);

#endif
