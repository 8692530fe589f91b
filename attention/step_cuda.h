/* Internal: the recurrent step kernels of the CUDA backends (attention/kv_step_cuda.cu,
 * attention/linear_step_cuda.cu): what the variants' backends, the tests and the kernel
 * lab call. The kernels themselves are in kv_step_cuda.cuh and linear_step_cuda.cuh,
 * which the lab includes, so that it measures the code that ships. */
#ifndef ATTN_STEP_CUDA_H
#define ATTN_STEP_CUDA_H

#include "attention.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the key/value cache step (stateful-softmax) ---- */

/* Positions per split of the context; 0 (the default): automatic (kv_step_split_len).
 * Tests and the lab set it to try split counts; a state created before a change is
 * still served (its workspace grows at the next step if it must). */
extern int kv_step_split_len_override;

/* The multiprocessors of the device (queried once, then cached; 1 on the emulator). */
int attn_cuda_sm_count(void);

/* Positions per split for a context of n positions over n_slices slices on a device of
 * `sms` multiprocessors: splits of at least KV_SPLIT_MIN positions (unless the
 * context is shorter), at most KV_SPLIT_MAX, as many as make n_slices * splits reach
 * KV_BLOCKS_PER_SM * sms blocks. override > 0 replaces the rule (at most
 * KV_SPLIT_MAX). */
int kv_step_split_len(long long n_slices, int n, int sms, int override);
/* The most splits a context of up to `capacity` positions gets (the workspace's size). */
int kv_step_max_splits(long long n_slices, int capacity, int sms, int override);

/* Bytes of step workspace (the splits' partial results) and of the counters the state
 * keeps after its caches (one per slice, zero between steps). */
size_t kv_step_workspace_bytes(long long n_slices, int capacity, int M);
size_t kv_step_counter_bytes(long long n_slices);

/* One step of attention over a key/value cache, for n_slices slices: writes k_t, v_t
 * into position t of the caches (kc [n_slices, cap, D], vc [n_slices, cap, M]), then
 * out = softmax(scale q K[0..t]^T) V[0..t]. ws: kv_step_workspace_bytes of device
 * memory; counters: kv_step_counter_bytes, zero (as the step leaves them). */
int kv_step_cuda(const float *q, const float *k, const float *v, float *kc, float *vc, float *out, void *ws,
                 size_t ws_bytes, unsigned *counters, long long n_slices, int capacity, int t, int D, int M,
                 float scale);

#ifdef __cplusplus
}
#endif

#endif
