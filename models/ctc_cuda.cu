/* The CTC loss on CUDA (ctc.h: ctc_forward_cuda, ctc_backward_cuda) with the CPU's
 * formulas (ctc_core.h) and workspace layout.
 *
 * One block per row (grid-stride over rows past 65535): the frames' log-softmax
 * normalisers over the block's threads, then the alpha recursion frame by frame (it
 * is sequential in time), the 2L + 1 states of a frame over the threads with a
 * barrier between frames; thread 0 then takes log p and the best-path check. The
 * backward runs the beta recursion the same way from the last frame, and per frame
 * gives each output to a thread, which sums the occupancy of its states in state
 * order (the blank: the even states; a label: the states of that label) and writes
 * its gradient. Every row's arithmetic is the CPU's sequence of double operations, so
 * the results are the CPU's up to the device's exp and log (bit for bit on the
 * emulator). The loss sums run in row order on one thread (a batch has few rows). No
 * atomics; no size limit but memory: every loop strides over frames, states, outputs
 * and rows.
 *
 * Speed (unmeasured, no GPU was available): a row costs T barriers forward and
 * backward; with few rows per batch the device is mostly idle, but the loss is small
 * next to the model's products at the paper's sizes. */
#include "../harness/cuda_compat.h"

#include "ctc.h"
#include "ctc_core.h"

#include <math.h>

#define CTC_THREADS 128
#define MAX_BLOCKS 65535LL

static unsigned row_grid(int B) { return ab_cuda_grid(B, 1, MAX_BLOCKS); }
static int row_threads(const ctc_dims *d) {
    const long long Sx = 2LL * d->S + 1;
    return ab_cuda_threads(Sx > d->K ? Sx : d->K, CTC_THREADS);
}

__global__ void ctc_forward_kernel(float *nll, ctc_dims d, const float *logits, const int *lengths, const int *labels,
                                   const int *counts, const float *weights, double *ws) {
    const int B = d.B, N = d.N, K = d.K, S = d.S;
    const size_t Sx = 2 * (size_t)S + 1;
    double *logp = ws + 4, *flags = ws + 4 + B;
    for (int b = blockIdx.x; b < B; b += gridDim.x) {
        const float wb = weights ? weights[b] : 1.0f;
        if (!(wb > 0.0f)) { /* the same for every thread of the block */
            if (threadIdx.x == 0) {
                nll[b] = 0.0f;
                logp[b] = 0.0;
                flags[b] = 0.0;
            }
            continue;
        }
        const int T = lengths ? lengths[b] : N, L = counts[b], Sb = 2 * L + 1;
        const float *x = logits + (size_t)b * N * K;
        const int *lab = labels + (size_t)b * S;
        double *lse = ws + ctc_row_offset(B, N, S, K, b), *alpha = lse + N;
        for (int t = threadIdx.x; t < T; t += blockDim.x) lse[t] = ctc_frame_lse(x + (size_t)t * K, K);
        __syncthreads();
        for (int t = 0; t < T; t++) {
            double *cur = alpha + (size_t)t * Sx;
            const double *prev = t ? cur - Sx : NULL;
            for (int s = threadIdx.x; s < Sb; s += blockDim.x)
                cur[s] = ctc_alpha(prev, t, s, lab, x + (size_t)t * K, lse[t]);
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            const double lp = T == 0 ? (L == 0 ? 0.0 : -INFINITY) : ctc_log_prob(alpha + (size_t)(T - 1) * Sx, Sb);
            logp[b] = lp;
            nll[b] = (float)-lp;
            flags[b] = 2.0 + ctc_best_path_is(x, T, K, lab, L);
        }
    }
}

/* The loss sums in row order, as the CPU's. */
__global__ void ctc_sum_kernel(double *ws, const float *weights, int B) {
    const double *logp = ws + 4, *flags = ws + 4 + B;
    double sw = 0, swl = 0, correct = 0, counted = 0;
    for (int b = 0; b < B; b++) {
        if (!((int)flags[b] & 2)) continue;
        const double wb = weights ? weights[b] : 1.0;
        sw += wb;
        swl += wb * -logp[b];
        correct += (int)flags[b] & 1;
        counted += 1;
    }
    ws[0] = sw, ws[1] = swl, ws[2] = correct, ws[3] = counted;
}

extern "C" int ctc_forward_cuda(ce_stats *st, float *nll, const ctc_dims *d, const float *logits, const int *lengths,
                                const int *labels, const int *counts, const float *weights, void *ws) {
    double *w = (double *)ws;
    AB_LAUNCH(ctc_forward_kernel, row_grid(d->B), row_threads(d), 0, ab_cuda_stream(), nll, *d, logits, lengths,
              labels, counts, weights, w);
    AB_LAUNCH(ctc_sum_kernel, 1, 1, 0, ab_cuda_stream(), w, weights, d->B);
    double h[4];
    AB_TRY(ab_cuda_memcpy_d2h(h, w, sizeof h)); /* waits for the kernels */
    st->weight_sum = h[0];
    st->loss = h[0] > 0 ? h[1] / h[0] : 0.0;
    st->correct = (long long)h[2];
    st->counted = (long long)h[3];
    return 0;
}

__global__ void ctc_backward_kernel(float *dlogits, ctc_dims d, const float *logits, const int *lengths,
                                    const int *labels, const int *counts, const float *weights, double weight_sum,
                                    double *ws) {
    const int B = d.B, N = d.N, K = d.K, S = d.S;
    const size_t Sx = 2 * (size_t)S + 1;
    const double *logp = ws + 4;
    for (int b = blockIdx.x; b < B; b += gridDim.x) {
        const float wb = weights ? weights[b] : 1.0f;
        const double lp = logp[b];
        if (!(wb > 0.0f) || lp == -INFINITY) continue; /* the same for every thread */
        const int T = lengths ? lengths[b] : N, L = counts[b], Sb = 2 * L + 1;
        const float *x = logits + (size_t)b * N * K;
        float *dl = dlogits + (size_t)b * N * K;
        const int *lab = labels + (size_t)b * S;
        double *lse = ws + ctc_row_offset(B, N, S, K, b), *alpha = lse + N, *beta = alpha + (size_t)N * Sx;
        double *gamma = beta + 2 * Sx, *cur = beta, *nxt = beta + Sx;
        const double scale = (double)wb / weight_sum;
        for (int s = threadIdx.x; s < Sb; s += blockDim.x) cur[s] = s >= Sb - 2 ? 0.0 : -INFINITY;
        __syncthreads();
        for (int t = T - 1; t >= 0; t--) {
            const double *a = alpha + (size_t)t * Sx;
            const float *xt = x + (size_t)t * K;
            for (int s = threadIdx.x; s < Sb; s += blockDim.x) gamma[s] = exp(a[s] + cur[s] - lp);
            __syncthreads();
            for (int k = threadIdx.x; k < K; k += blockDim.x) {
                double occ = 0.0;
                if (k == CTC_BLANK) {
                    for (int s = 0; s < Sb; s += 2) occ += gamma[s];
                } else {
                    for (int j = 0; j < L; j++)
                        if (lab[j] + 1 == k) occ += gamma[2 * j + 1];
                }
                dl[(size_t)t * K + k] += (float)(scale * (exp((double)xt[k] - lse[t]) - occ));
            }
            if (t > 0)
                for (int s = threadIdx.x; s < Sb; s += blockDim.x) nxt[s] = ctc_beta(cur, s, Sb, lab, xt, lse[t]);
            __syncthreads();
            double *tmp = cur;
            cur = nxt;
            nxt = tmp;
        }
    }
}

extern "C" int ctc_backward_cuda(float *dlogits, const ctc_dims *d, const float *logits, const int *lengths,
                                 const int *labels, const int *counts, const float *weights, double weight_sum,
                                 void *ws) {
    if (!(weight_sum > 0)) return 0;
    AB_LAUNCH(ctc_backward_kernel, row_grid(d->B), row_threads(d), 0, ab_cuda_stream(), dlogits, *d, logits, lengths,
              labels, counts, weights, weight_sum, (double *)ws);
    return 0;
}
