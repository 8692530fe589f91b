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

/* ---- the linear / polynomial step ---- */

/* Rows per block (row split) and columns per tile of the fused linear step; 0 (the
 * defaults): automatic (ls_make_plan, linear_step_cuda.cuh). Tests and the lab set them. */
extern int lin_step_rows_override, lin_step_cols_override;

/* The blocks of a step on a device of `sms` multiprocessors (with the overrides):
 * plan[0] column tiles of plan[1] columns, plan[2] row splits of plan[3] rows. */
void lin_step_plan(long long n_slices, long long C, int M, int sms, int plan[4]);

/* Offset of the step's counters in a linear state whose other parts take base_bytes,
 * and the bytes they take after it. */
size_t lin_step_counter_offset(size_t base_bytes);
size_t lin_step_counter_bytes(long long n_slices);
/* Bytes of step workspace for n_slices slices, C features, M value columns; favor: the
 * map is favor (whose features may need a kernel and workspace of their own). */
size_t lin_step_workspace_bytes(long long n_slices, int C, int D, int M, int favor);

#ifdef __cplusplus
}

/* One fused step (linear_step_cuda.cu) of fm_step_args (feature_maps_cuda.cuh) for map
 * `kind` (fm_kind); counters: lin_step_counter_bytes of the state, zero; ws_bytes: the
 * size of a.ws. */
struct fm_step_args;
int lin_step_cuda(const fm_step_args &a, int kind, unsigned *counters, size_t ws_bytes);
#endif

#endif
