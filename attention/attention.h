/* attnbench attention library: one interface, twelve variants, CPU and CUDA.
 *
 * Tensors are float32, contiguous, row-major:
 *   q, k      [B, H, N, D]
 *   v, out    [B, H, N, M]
 * Variants are chosen by name from a registry ("softmax", "stateful-softmax",
 * "linear", "polynomial", "lsh", "efficient", "local", "linformer", "retention", "sparse",
 * "gla", "deltanet") and configured with
 * "key=value"
 * settings whose names and defaults `attn_variant_option` lists.
 *
 * Contract:
 * - Every call returns 0 or a negative code (ATTN_E*) and leaves a one-line message
 *   for attn_error() on the calling thread; nothing exits or aborts on bad input.
 * - attn_forward saves what its backward needs into a caller-provided buffer of
 *   attn_saved_bytes(); attn_backward reads only that and the inputs, and overwrites
 *   dq, dk and dv (it does not accumulate). A forward no backward follows may pass no
 *   buffer where attn_can_forward_unsaved() says so.
 * - Workspace is owned by the attn object, taken from the tracked allocator of its
 *   device on the first call for a shape and reused: repeated calls at one shape
 *   allocate nothing. attn_reserve() does that allocation up front.
 * - lengths (optional, B ints, always host memory): positions >= lengths[b] are
 *   padding: never attended to (never read); their output rows and their gradients
 *   are zero.
 * - Recurrent mode: an attn_state (attn_state_create) holds up to `capacity`
 *   positions in memory of the attention's device (attn_state_bytes() of it, from the
 *   tracked allocator, allocated once); attn_prefill runs a prompt of P positions in
 *   one parallel call and leaves the state after it; attn_step then advances one
 *   position for all B x H at once. Steps over t = 0..N-1 equal the causal forward.
 *   The state is an opaque object (its bookkeeping on the host, its contents on the
 *   device) and belongs to the attn object that created it.
 * - Devices: with AB_DEV_CUDA every tensor argument (q, k, v, out, saved, dout,
 *   dq, dk, dv, and the step's inputs and outputs) is a device pointer (from
 *   ab_cuda_malloc, harness/cuda_device.h, or cudaMalloc), and calls return once their
 *   work is queued on the library's stream: synchronise (ab_cuda_sync, or a copy back)
 *   before reading results on the host. attn_create fails with ATTN_EDEVICE ("no CUDA
 *   device: ...") when the build has no CUDA backend or the machine no usable GPU, and
 *   with ATTN_EUNSUPPORTED when the variant has no CUDA implementation.
 * - Parameters: a variant may have learned parameters of its own (linformer's
 *   projections; attn_param_count says how many, 0 for every other variant). They are
 *   sized for the longest sequence the caller will run (max_len), drawn by
 *   attn_param_init, owned by the caller (a model keeps them in its parameter block)
 *   and bound with attn_bind_params before forward; backward ADDS their gradient into
 *   the bound gradient buffer (as a model's layers do), so several layers bound to one
 *   block sum their gradients there.
 * - Inputs of the variant's own: a variant may read one more per-position input beside
 *   q, k and v (gla's log-gate g, deltanet's rate beta; attn_variant_aux names it,
 *   NULL for the others) of W = attn_aux_width floats per (b, h, position): [B, H, N, W]
 *   for forward and backward, [B, H, P, W] for prefill, [B, H, W] for step, memory of
 *   the attention's device. It is bound (attn_bind_aux) before those calls, which read
 *   the bound pointer (kept, not copied) until it is bound again; backward OVERWRITES
 *   the bound gradient buffer of the same size (as dq, dk, dv; NULL: none computed).
 *   Such a variant refuses the calls until an input is bound. Its range is the
 *   variant's (g <= 0, beta in [0, 1]) and is the caller's to keep: it is not checked.
 * - Not thread-safe per object: one attn object is used by one thread at a time
 *   (it parallelises internally with OpenMP on the CPU).
 */
#ifndef ATTNBENCH_ATTENTION_H
#define ATTNBENCH_ATTENTION_H

#include "device_type.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    ATTN_OK = 0,
    ATTN_EINVAL = -1,       /* bad input: shape, option, value */
    ATTN_ENOMEM = -2,       /* out of memory */
    ATTN_EUNSUPPORTED = -3, /* valid but not supported by this variant/device */
    ATTN_EIO = -4,
    ATTN_EDEVICE = -5, /* device (CUDA) failure or no device */
};

/* Devices are harness's ab_device (device_type.h: AB_DEV_CPU, AB_DEV_CUDA), the one
 * device type of the library, the models and the tools. The names below are the
 * library's earlier spelling, kept as aliases for programs written against it; nothing
 * in attnbench itself uses them. */
typedef ab_device attn_device;
#define ATTN_DEVICE_CPU AB_DEV_CPU
#define ATTN_DEVICE_CUDA AB_DEV_CUDA

typedef struct {
    int batch, heads, len, qk_dim, v_dim; /* B, H, N, D, M */
    bool causal;
    const int *lengths; /* NULL, or B valid lengths in [0, N] (host memory) */
} attn_shape;

typedef struct {
    const char *variant;          /* registry name */
    ab_device device;             /* where tensors live and the work runs */
    uint64_t seed;                /* random choices (LSH rotations, FAVOR+ features) derive from it */
    int n_settings;               /* number of "key=value" strings */
    const char *const *settings;  /* variant options, see attn_variant_option */
} attn_options;

typedef struct attn attn;
typedef struct attn_state attn_state;

/* ---- registry ---- */

int attn_variant_count(void);
const char *attn_variant_name(int i);
const char *attn_variant_summary(int i);
bool attn_variant_has_step(int i);
/* Whether variant i computes causal attention too; false for a non-causal-only variant
 * (efficient), which refuses a causal shape with ATTN_EUNSUPPORTED. */
bool attn_variant_has_causal(int i);
/* Whether variant i has learned parameters of its own (linformer; attn_param_count). */
bool attn_variant_has_params(int i);
/* Whether this build has an implementation of variant i on device d (whether the
 * machine has such a device is attn_create's answer). */
bool attn_variant_has_device(int i, ab_device d);
/* Options of variant i: name, default as text, help (includes the allowed values).
 * Returns false past the last option. */
bool attn_variant_option(int i, int j, const char **name, const char **def, const char **help);
/* Index of a variant by name, or -1. */
int attn_variant_find(const char *name);

typedef enum { ATTN_OPT_DOUBLE, ATTN_OPT_INT, ATTN_OPT_CHOICE } attn_opt_type;

/* Everything the registry knows about option j of variant i (attnbench list --json). */
typedef struct {
    const char *name, *def, *help; /* as attn_variant_option */
    attn_opt_type type;
    int n_choices;    /* ATTN_OPT_CHOICE: number of allowed names (attn_variant_option_choice) */
    double min, max;  /* ATTN_OPT_DOUBLE, ATTN_OPT_INT: allowed range, inclusive */
    bool auto_ok;     /* "auto" is accepted (the default, resolved per shape) */
} attn_option_info;

/* Fills *info for option j of variant i; false past the last option. */
bool attn_variant_option_info(int i, int j, attn_option_info *info);
/* Allowed name c of choice option j of variant i, or NULL past the last (or when the
 * option is not a choice). */
const char *attn_variant_option_choice(int i, int j, int c);

/* Feature maps of the linear-attention variants: name, feature count for input size
 * D (a formula in D, e.g. "1 + D"), and what the map is. Returns false past the last.
 * `linear` offers some of them as its feature_map choices; `polynomial` uses "poly". */
int attn_feature_map_count(void);
bool attn_feature_map_info(int i, const char **name, const char **features, const char **help);

/* Checks what attn_create would check of opt without creating anything: the variant's
 * name, the device (one of ab_device's), and the settings against the variant's
 * option table (names, values, ranges, and precision against the device). 0, or
 * AB_EINVAL with the message attn_create would give. Whether this build and machine can
 * run the variant on the device is attn_variant_has_device's and attn_create's answer. */
int attn_variant_check(const attn_options *opt);
/* The same check, then the learned parameters of the variant's own that the object
 * attn_create would make has for sequences of up to max_len (attn_param_count) and
 * whether one set serves every layer (attn_params_shared_by_layers), without making it. */
int attn_variant_params(const attn_options *opt, int max_len, size_t *count, bool *shared);

/* ---- lifetime ---- */

int attn_create(const attn_options *opt, attn **out);
void attn_destroy(attn *a);
const char *attn_name(const attn *a);
bool attn_has_step(const attn *a);
/* The effective value of option `key` as text (defaults resolved for this shape
 * when s is not NULL, e.g. scale = 1/sqrt(D)); NULL if the variant has no such key. */
const char *attn_option_value(const attn *a, const attn_shape *s, const char *key, char *buf, size_t cap);
/* Changes the seed (e.g. fresh LSH rotations or FAVOR+ features per training step). */
void attn_reseed(attn *a, uint64_t seed);

/* ---- parameters of the variant's own ---- */

/* Floats of the variant's learned parameters for sequences of up to max_len positions
 * (one attention object: a model layer). 0 for variants without parameters (whatever
 * max_len). AB_EINVAL (message) for max_len < 1 or a count that overflows. */
int attn_param_count(const attn *a, int max_len, size_t *count);
/* Whether every layer of a model shares one set of the parameters (linformer's
 * share=layer): the model then keeps one block and binds it to every layer. */
bool attn_params_shared_by_layers(const attn *a);
/* Draws the initial parameters into host memory `params` (attn_param_count floats):
 * element j from (seed, stream, j) of harness/rng.h, the variant's rule (attention
 * README). Nothing to do for a variant without parameters. */
int attn_param_init(const attn *a, int max_len, uint64_t seed, uint64_t stream, float *params);
/* Binds the parameters (attn_param_count(max_len) floats, memory of the attention's
 * device) for the next calls, and their gradient buffer of the same size (or NULL:
 * backward then computes no parameter gradient). The pointers are kept, not copied.
 * Calls at a length N > max_len are refused. A variant with parameters refuses forward
 * and backward until they are bound. */
int attn_bind_params(attn *a, int max_len, const float *params, float *grads);

/* ---- per-position input of the variant's own ---- */

/* Name of variant i's extra input ("g" for gla, "beta" for deltanet), or NULL when it
 * reads only q, k and v (and for i out of range). */
const char *attn_variant_aux(int i);
/* The same for an object, and its floats W per (b, h, position) at head size qk_dim
 * (gla: D with gate=vector, 1 with gate=scalar; deltanet: 1); 0 for a variant without. */
const char *attn_aux_name(const attn *a);
int attn_aux_width(const attn *a, int qk_dim);
/* Binds the extra input for the next calls (see the contract above) and its gradient
 * buffer (NULL: backward computes none). AB_EINVAL for a variant without one or a NULL
 * input. */
int attn_bind_aux(attn *a, const float *aux, float *daux);
/* attn_variant_check, then the name and width the object attn_create would make has
 * (NULL and 0 for a variant without an input of its own), without making it. */
int attn_variant_aux_of(const attn_options *opt, int qk_dim, const char **name, int *width);

/* ---- parallel (training) mode ---- */

/* Validates the shape for this variant (sizes, overflow, lengths, chunking). */
int attn_check_shape(const attn *a, const attn_shape *s);
/* Bytes forward saves for backward; 0 (with a message) when the shape is rejected,
 * and also 0 for variants that save nothing. */
size_t attn_saved_bytes(const attn *a, const attn_shape *s);
/* Allocates the workspace for this shape now (optional; forward does it on demand). */
int attn_reserve(attn *a, const attn_shape *s);
/* Bytes of workspace the object holds now. */
size_t attn_workspace_bytes(const attn *a);
/* Bytes of workspace a parallel call at this shape needs (0 on a bad shape), so a
 * caller can decide whether a run fits before allocating anything. */
size_t attn_workspace_need(const attn *a, const attn_shape *s);
/* Useful floating-point operations of one forward call (backward = false) or of one
 * forward plus one backward call (true) at this shape, counted at the full length N
 * (lengths are not taken into account); the rules are the variant's (e.g. softmax: the
 * two N x N products, half of them when causal). NAN where the count is not well
 * defined for the variant (lsh) or the shape is rejected (with a message). */
double attn_flops(const attn *a, const attn_shape *s, bool backward);
int attn_forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                 void *saved);
/* Whether attn_forward takes saved = NULL: a forward no backward follows (inference,
 * evaluation, generation by recomputation), which then keeps nothing. True for the
 * variants that save nothing, and for softmax and stateful-softmax on the CPU, which
 * then hold one row block of scores per thread in their workspace instead of writing
 * the N x N probabilities (at N = 3072 that is 38 MB per head, beyond the caches). */
bool attn_can_forward_unsaved(const attn *a);
int attn_backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                  const float *dout, const void *saved, float *dq, float *dk, float *dv);

/* ---- recurrent (generation) mode ---- */

/* Bytes of device memory a recurrent state for `capacity` positions of shape s takes
 * (s->len is ignored, s->causal must be true, s->lengths NULL); 0 (with a message)
 * when the variant has no recurrent mode or the shape is rejected. */
size_t attn_state_bytes(const attn *a, const attn_shape *s, int capacity);
/* Creates an empty state (position 0 next) for `capacity` positions of shape s, with
 * its memory on the attention's device (tracked allocator), and the step workspace
 * reserved: steps allocate nothing. ATTN_ENOMEM when it does not fit. */
int attn_state_create(attn *a, const attn_shape *s, int capacity, attn_state **out);
void attn_state_destroy(attn_state *st);
/* Empties a state (position 0 next). */
int attn_state_reset(attn *a, attn_state *st);
/* Positions the state holds (the t of the next step), and its capacity; -1 for NULL. */
int attn_state_len(const attn_state *st);
int attn_state_capacity(const attn_state *st);
/* The state's shape (len = capacity), or NULL. */
const attn_shape *attn_state_shape(const attn_state *st);
/* Runs positions 0..P-1 of an empty state in one parallel call: q, k [B,H,P,D],
 * v [B,H,P,M] -> out [B,H,P,M] (may be NULL), and leaves the state at position P. */
int attn_prefill(attn *a, attn_state *st, int prompt_len, const float *q, const float *k, const float *v,
                 float *out);
/* Position t (t must equal attn_state_len): q, k [B,H,D], v [B,H,M] -> out [B,H,M].
 * A failed call leaves the state as it was. */
int attn_step(attn *a, attn_state *st, int t, const float *q, const float *k, const float *v, float *out);
/* Whether attn_step queues the same device work at every position (same kernels,
 * arguments and pointers; the state changes in device memory only), so that a step
 * recorded once (a CUDA graph) may be replayed at later positions. True for the CUDA
 * steps of linear (every feature map but favor, whose features depend on the first
 * position), polynomial, retention, gla and deltanet; false elsewhere (a key/value
 * cache's step depends on its position). */
bool attn_step_replayable(const attn *a);
/* For a caller that replays recorded steps: sets the positions the state holds (0..its
 * capacity) without running anything, as the replayed steps left them. */
int attn_state_set_len(attn_state *st, int len);

/* ---- errors ---- */

const char *attn_error(void);

#ifdef __cplusplus
}
#endif

#endif
