/* stateful-softmax on the CPU: softmax attention (forward and backward are the
 * `softmax` code) plus a recurrent mode with a key/value cache.
 *
 * State: K cache (B, H, capacity, D), then, at a 64-byte
 * boundary, V cache (B, H, capacity, M). Step t writes k_t, v_t at position t in place
 * and attends q_t over positions 0..t: O(t D + t M) per slice. Prefill copies the
 * prompt's keys and values into the cache and, when out is wanted, computes the prompt's
 * causal outputs in row blocks (scores of one block at a time in the step workspace,
 * nothing of size P x P). */
#include "softmax_cpu.h"

#include "cpu_util.h"
#include "softmax_cuda.h"

#include "../harness/error.h"

#include <string.h>

static size_t kcache_bytes(const attn_shape *s, int capacity) {
    return attn_align64((size_t)s->batch * (size_t)s->heads * (size_t)capacity * (size_t)s->qk_dim * sizeof(float));
}

static size_t ss_state_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)a;
    return kcache_bytes(s, capacity) +
           (size_t)s->batch * (size_t)s->heads * (size_t)capacity * (size_t)s->v_dim * sizeof(float);
}

/* The cache's contents beyond the positions held are never read: nothing to clear. */
static int ss_state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    (void)a;
    (void)s;
    (void)capacity;
    (void)state;
    return 0;
}

/* Thread slots and their sizes: step needs `capacity` scores per slot; prefill needs a
 * row block of scores (SMX_ROW_BLOCK x capacity) per slot. */
static int step_slots(const attn_shape *s) { return attn_outer_threads(s->batch * s->heads); }
static int prefill_slots(const attn_shape *s, int len) {
    long items = (long)s->batch * s->heads * smx_n_blocks(len);
    return attn_outer_threads(items > 1 << 30 ? 1 << 30 : (int)items);
}
static size_t step_slot_bytes(int capacity) { return attn_align64((size_t)capacity * sizeof(float)); }
static size_t prefill_slot_bytes(int capacity) {
    int rb = capacity < SMX_ROW_BLOCK ? capacity : SMX_ROW_BLOCK;
    return attn_align64((size_t)rb * (size_t)capacity * sizeof(float));
}

static size_t ss_step_workspace_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)a;
    size_t st = (size_t)step_slots(s) * step_slot_bytes(capacity);
    size_t pf = (size_t)prefill_slots(s, capacity) * prefill_slot_bytes(capacity);
    return st > pf ? st : pf;
}

static int ss_prefill(attn *a, const attn_shape *s, int capacity, int P, const float *q, const float *k,
                      const float *v, float *out, void *state) {
    const int H = s->heads, D = s->qk_dim, M = s->v_dim, BH = s->batch * H;
    float *kc = state, *vc = (float *)((char *)state + kcache_bytes(s, capacity));
    const size_t cd = (size_t)capacity * D, cm = (size_t)capacity * M;
    const int nt_copy = attn_outer_threads(BH);
#pragma omp parallel for schedule(static) num_threads(nt_copy) if (nt_copy > 1)
    for (int bh = 0; bh < BH; bh++) {
        memcpy(kc + bh * cd, k + (size_t)bh * P * D, sizeof(float) * (size_t)P * D);
        memcpy(vc + bh * cm, v + (size_t)bh * P * M, sizeof(float) * (size_t)P * M);
    }
    if (!out) return 0;
    /* Causal attention of the prompt over the cache, block by block (as softmax's
     * forward, but the probabilities go to a per-slot scratch block). */
    const int nblk = smx_n_blocks(P);
    const long items = (long)BH * nblk;
    const int nt = prefill_slots(s, P);
    const bool inner = nt == 1 && ab_threads() > 1;
    const float scale = (float)attn_scale(a, D);
    const size_t slot_bytes = prefill_slot_bytes(capacity);
    char *ws = a->ws;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (long it = 0; it < items; it++) {
        int bh = (int)(it / nblk), blk = nblk - 1 - (int)(it % nblk);
        int r0 = blk * SMX_ROW_BLOCK, r1 = r0 + SMX_ROW_BLOCK < P ? r0 + SMX_ROW_BLOCK : P;
        float *pb = (float *)(ws + (size_t)omp_get_thread_num() * slot_bytes);
        smx_block_forward(q + (size_t)bh * P * D, kc + bh * cd, vc + bh * cm, out + (size_t)bh * P * M, pb,
                          (size_t)r1, r0, r1, r1, D, M, true, scale, inner);
    }
    return 0;
}

static int ss_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                   const float *v, float *out) {
    const int H = s->heads, D = s->qk_dim, M = s->v_dim, BH = s->batch * H;
    float *kc = state, *vc = (float *)((char *)state + kcache_bytes(s, capacity));
    const size_t cd = (size_t)capacity * D, cm = (size_t)capacity * M;
    const int nt = step_slots(s);
    const float scale = (float)attn_scale(a, D);
    const size_t slot_bytes = step_slot_bytes(capacity);
    char *ws = a->ws;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int bh = 0; bh < BH; bh++) {
        float *ks = kc + bh * cd, *vs = vc + bh * cm;
        float *sc = (float *)(ws + (size_t)omp_get_thread_num() * slot_bytes);
        memcpy(ks + (size_t)t * D, k + (size_t)bh * D, sizeof(float) * (size_t)D);
        memcpy(vs + (size_t)t * M, v + (size_t)bh * M, sizeof(float) * (size_t)M);
        /* scores (1, t+1) = scale q_t K[0:t+1]^T, softmax, out (1, M) = p V[0:t+1] */
        ab_sgemm(false, true, 1, t + 1, D, scale, q + (size_t)bh * D, D, ks, D, 0.0f, sc, t + 1);
        smx_softmax_row(sc, t + 1);
        ab_sgemm(false, false, 1, M, t + 1, 1.0f, sc, t + 1, vs, M, 0.0f, out + (size_t)bh * M, M);
    }
    return 0;
}

static const attn_backend cpu_stateful_softmax = {
    .check_shape = smx_check_shape,
    .saved_bytes = smx_saved_bytes,
    .workspace_bytes = smx_workspace_bytes,
    .forward = smx_forward,
    .forward_unsaved = true,
    .backward = smx_backward,
    .state_bytes = ss_state_bytes,
    .state_init = ss_state_init,
    .prefill = ss_prefill,
    .step = ss_step,
    .step_workspace_bytes = ss_step_workspace_bytes,
};

#ifdef ATTNBENCH_HAVE_CUDA
/* Its own saved state (O and the rows' log-sum-exps, O(N M) per slice: softmax_cuda.cu)
 * and shape checks. */
static const attn_backend cuda_stateful_softmax = {
    .check_shape = smx_cuda_check_shape,
    .saved_bytes = smx_cuda_saved_bytes,
    .workspace_bytes = smx_cuda_workspace_bytes,
    .forward = smx_cuda_forward,
    .forward_unsaved = true,
    .backward = smx_cuda_backward,
    .state_bytes = ss_cuda_state_bytes,
    .state_init = ss_cuda_state_init,
    .prefill = ss_cuda_prefill,
    .step = ss_cuda_step,
    .step_workspace_bytes = ss_cuda_step_workspace_bytes,
};
#define CUDA_STATEFUL_SOFTMAX (&cuda_stateful_softmax)
#else
#define CUDA_STATEFUL_SOFTMAX NULL
#endif

const attn_variant attn_variant_stateful_softmax = {
    .name = "stateful-softmax",
    .summary = "softmax with a key/value cache: recurrent step appends to a preallocated cache, O(t) per step",
    .options = smx_options,
    .n_options = SMX_N_OPTIONS,
    .defaults = smx_defaults,
    .flops = smx_flops,
    .cpu = &cpu_stateful_softmax,
    .cuda = CUDA_STATEFUL_SOFTMAX,
};
