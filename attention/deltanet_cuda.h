/* Internal: the CUDA backend of `deltanet` (deltanet_cuda.cu: the scan, the recurrent
 * mode and the choice of form; deltanet_wy_cuda.cu: the chunked form). deltanet.c puts these
 * functions into its attn_backend table when the build has CUDA (ATTNBENCH_HAVE_CUDA);
 * check_shape, saved_bytes (the state at the start of every chunk, the CPU's layout)
 * and state_bytes (S per slice) are the CPU's. */
#ifndef ATTN_DELTANET_CUDA_H
#define ATTN_DELTANET_CUDA_H

#include "variant.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The workspace the backend sizes itself to (bytes): slices and blocks
 * go in groups that keep it under this (default 1 GiB). The tests lower it to take the
 * grouped paths. */
extern size_t dn_cuda_ws_cap;
#define DN_CUDA_WS_CAP_DEFAULT ((size_t)1 << 30)

/* The warps of the chunked form's carry kernels: 0 (the default) chooses (about 8 rows
 * of S a warp, at most 8); 1..8 asks for that many (fewer where shared memory does not
 * fit them). The tests and the kernel lab set it to compare; set it between calls only. */
extern int dn_cuda_carry_warps;

/* Blocks of a grid-stride launch at most. */
#define DN_MAX_BLOCKS 65535LL

/* ---- the chunked (WY) form (deltanet_wy_cuda.cu), which deltanet_cuda.cu calls ---- */

/* Whether chunks of C positions at key size D take the chunked form on CUDA (every
 * kernel's shared memory fits); the scan runs otherwise. */
bool dn_wy_on_cuda(int C, int D);
/* Its workspace (bytes) for chunks of C. */
size_t dn_wy_cuda_workspace_bytes(const attn_shape *s, int C);
/* Forward and backward of slices [s0, s0 + ns) of valid length L, with the arguments of
 * dn_cuda_forward and dn_cuda_backward; states (forward, when not NULL): the final
 * states (prefill). */
int dn_wy_cuda_forward(attn *a, const attn_shape *s, long long s0, long long ns, int L, const float *q,
                       const float *k, const float *v, float *out, float *saved, float *states);
int dn_wy_cuda_backward(attn *a, const attn_shape *s, long long s0, long long ns, int L, const float *q,
                        const float *k, const float *v, const float *dout, const float *saved, float *dq, float *dk,
                        float *dv);

/* ---- the backend's table entries ---- */

size_t dn_cuda_workspace_bytes(const attn *a, const attn_shape *s);
int dn_cuda_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                    void *saved);
int dn_cuda_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                     const float *dout, const void *saved, float *dq, float *dk, float *dv);
int dn_cuda_state_init(attn *a, const attn_shape *s, int capacity, void *state);
int dn_cuda_prefill(attn *a, const attn_shape *s, int capacity, int prompt_len, const float *q, const float *k,
                    const float *v, float *out, void *state);
int dn_cuda_step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                 const float *v, float *out);

#ifdef __cplusplus
}
#endif

#endif
