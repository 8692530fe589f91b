/* stateful-softmax on CUDA: the recurrent mode (forward and backward are softmax's,
 * softmax_cuda.cu), as on the CPU (stateful_softmax.c).
 *
 * State (device memory, capacity fixed at creation, never reallocated): K cache
 * (B, H, capacity, D), then at a 256-byte boundary the V cache (B, H, capacity, M),
 * then at a 256-byte boundary one counter per slice for the step (zero between steps).
 * Step t is one kernel (kv_step_cuda.cu): it writes k_t, v_t into position t of every
 * slice and attends q_t over positions 0..t split over thread blocks, the splits'
 * partial results in the step workspace (kv_step_workspace_bytes).
 * Prefill copies the prompt's keys and values into the cache and, when out is wanted,
 * computes the prompt's causal outputs with softmax's fused forward (flash_softmax.cu)
 * reading the keys and values from the cache: no workspace, nothing of size P x P.
 */
#include "softmax_cuda.h"

#include "cuda_util.cuh"
#include "step_cuda.h"
#include "flash_softmax.h"

#include <math.h>

static size_t align256(size_t x) { return (x + 255u) & ~(size_t)255u; }

static size_t kcache_bytes(const attn_shape *s, int capacity) {
    return align256((size_t)s->batch * (size_t)s->heads * (size_t)capacity * (size_t)s->qk_dim * sizeof(float));
}

static size_t caches_bytes(const attn_shape *s, int capacity) {
    return kcache_bytes(s, capacity) +
           align256((size_t)s->batch * (size_t)s->heads * (size_t)capacity * (size_t)s->v_dim * sizeof(float));
}

static unsigned *counters_of(const attn_shape *s, int capacity, void *state) {
    return (unsigned *)((char *)state + caches_bytes(s, capacity));
}

extern "C" size_t ss_cuda_state_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)a;
    return caches_bytes(s, capacity) + kv_step_counter_bytes((long long)s->batch * s->heads);
}

/* The cache beyond the positions held is never read: only the step's counters are
 * cleared. */
extern "C" int ss_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    (void)a;
    const size_t bytes = kv_step_counter_bytes((long long)s->batch * s->heads);
    AB_CUDA_CHECK(cudaMemsetAsync(counters_of(s, capacity, state), 0, bytes, ab_cuda_stream()));
    return 0;
}

/* Step: the splits' partial results (kv_step_workspace_bytes); the prefill needs none
 * (the fused forward reads the cache). */
extern "C" size_t ss_cuda_step_workspace_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)a;
    return kv_step_workspace_bytes((long long)s->batch * s->heads, capacity, s->v_dim);
}

extern "C" int ss_cuda_prefill(attn *a, const attn_shape *s, int capacity, int P, const float *q, const float *k,
                               const float *v, float *out, void *state) {
    const int D = s->qk_dim, M = s->v_dim;
    const long long BH = (long long)s->batch * s->heads, cap = capacity;
    float *kc = (float *)state, *vc = (float *)((char *)state + kcache_bytes(s, capacity));
    AB_TRY(attn_cuda_copy_slices(kc, cap * D, k, (long long)P * D, BH, (long long)P * D));
    AB_TRY(attn_cuda_copy_slices(vc, cap * M, v, (long long)P * M, BH, (long long)P * M));
    if (!out || P == 0) return 0;
    /* causal attention of the prompt over the cache's first P positions */
    flash_args fa = flash_args_make(q, (long long)P * D, kc, cap * D, vc, cap * M, (long long)P * M, 0, BH, P, D, M,
                                    attn_scale(a, D), true, 0);
    fa.o = out;
    return flash_forward(&fa, a->p.precision);
}

extern "C" int ss_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q,
                            const float *k, const float *v, float *out) {
    const int D = s->qk_dim, M = s->v_dim;
    const long long BH = (long long)s->batch * s->heads;
    float *kc = (float *)state, *vc = (float *)((char *)state + kcache_bytes(s, capacity));
    return kv_step_cuda(q, k, v, kc, vc, out, a->ws, a->ws_bytes, counters_of(s, capacity, state), BH, capacity, t, D,
                        M, (float)attn_scale(a, D));
}
