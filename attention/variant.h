/* Internal: how a variant plugs into the registry. Not installed. */
#ifndef ATTN_VARIANT_H
#define ATTN_VARIANT_H

#include "attention.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One flat struct of every variant's options; each variant's option table says which
 * fields it reads. */
typedef enum { ATTN_COMBINE_MEAN = 0, ATTN_COMBINE_LOGSUMEXP = 1 } attn_combine;

typedef struct {
    double scale;    /* NaN: 1/sqrt(D) */
    int feature_map; /* linear: index among the maps it offers (fm_linear_choice, feature_maps.h) */
    double eps;      /* added to the denominator (linear, polynomial) */
    int chunk;       /* 0: automatic (linear, polynomial); chunk length (lsh) */
    double c;        /* polynomial constant */
    int rounds;      /* lsh hashing rounds */
    int bits;        /* lsh random rotations: 2*bits buckets */
    int combine;     /* attn_combine (lsh) */
    int features;    /* linear with feature_map=favor: random features; 0: automatic (2 D) */
    int window;      /* local: window length w */
    int proj_k;      /* linformer: rows k of the projections E, F */
    int share;       /* linformer: attn_lfm_share */
    int precision;   /* every variant: ab_precision (cuda_blas.h), fp32 or tf32 (CUDA only) */
    double gamma;    /* retention: decay for every head; NaN: 1 - 2^(-5-h) per head h */
    int gate;        /* gla: attn_gla_gate */
    int stride;      /* sparse: stride of the strided part; 0: round(sqrt(N)) */
} attn_params;

/* linformer's sharing of E and F (the Linformer paper's options): none (E and F per
 * layer, shared by the heads), kv (E = F per layer), layer (one E = F for every layer). */
typedef enum { ATTN_LFM_SHARE_NONE = 0, ATTN_LFM_SHARE_KV = 1, ATTN_LFM_SHARE_LAYER = 2 } attn_lfm_share;

/* gla's gate: one log-gate per key dimension ([B, H, N, D]) or one per head ([B, H, N]). */
typedef enum { ATTN_GLA_GATE_VECTOR = 0, ATTN_GLA_GATE_SCALAR = 1 } attn_gla_gate;

/* The allowed names of a choice option that come from another table (linear's
 * feature_map: from the feature maps' table), so that they are listed in one place. */
typedef struct {
    const char *(*name)(int c); /* the c-th allowed name, NULL past the last */
    const char *(*help)(void);  /* the option's help, which lists them */
} attn_choice_source;

typedef struct {
    const char *name;
    attn_opt_type type;
    size_t offset;              /* into attn_params */
    const char *def;            /* default as shown to users */
    const char *help;
    const char *const *choices; /* ATTN_OPT_CHOICE: NULL-terminated names, stored as index */
    double min, max;            /* allowed range, inclusive (ATTN_OPT_DOUBLE, ATTN_OPT_INT) */
    bool auto_ok;               /* "auto" is accepted and stored as NaN (double) or 0 (int) */
    const attn_choice_source *source; /* ATTN_OPT_CHOICE: names and help from elsewhere (then
                                       * choices and help are NULL), or NULL */
} attn_option_spec;

/* One backend's implementation of a variant. Shapes arrive validated (generic checks
 * and the variant's check_shape); tensor, saved, state and workspace pointers are
 * memory of that backend's device (device memory for CUDA backends: see
 * attention/cuda_util.cuh for their conventions); s->lengths is always host memory.
 * state_init also serves attn_state_reset. */
typedef struct {
    int (*check_shape)(const attn *a, const attn_shape *s); /* variant-specific checks, or NULL */
    size_t (*saved_bytes)(const attn *a, const attn_shape *s);
    size_t (*workspace_bytes)(const attn *a, const attn_shape *s);
    int (*forward)(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                   void *saved);
    /* forward takes saved = NULL (keeping nothing) when saved_bytes > 0 */
    bool forward_unsaved;
    int (*backward)(attn *a, const attn_shape *s, const float *q, const float *k, const float *v,
                    const float *dout, const void *saved, float *dq, float *dk, float *dv);
    /* Recurrent mode; all NULL for variants without one. */
    size_t (*state_bytes)(const attn *a, const attn_shape *s, int capacity);
    int (*state_init)(attn *a, const attn_shape *s, int capacity, void *state);
    int (*prefill)(attn *a, const attn_shape *s, int capacity, int prompt_len, const float *q, const float *k,
                   const float *v, float *out, void *state);
    int (*step)(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                const float *v, float *out);
    /* Workspace of the recurrent mode for a given capacity (may be NULL: none). */
    size_t (*step_workspace_bytes)(const attn *a, const attn_shape *s, int capacity);
    /* Whether step's device work is the same at every position (it reads neither t nor
     * host state that changes between steps), so that a recorded step may be replayed
     * (attn_step_replayable); NULL: no. */
    bool (*step_replayable)(const attn *a);
} attn_backend;

/* attn_backend.step_replayable of a step that never depends on its position. */
static inline bool attn_always(const attn *a) {
    (void)a;
    return true;
}

typedef struct {
    const char *name;
    const char *summary;
    const attn_option_spec *options;
    int n_options;
    void (*defaults)(attn_params *p);
    /* Useful floating-point operations of one forward (backward = false) or forward +
     * backward call at a validated shape, at the full length N; NAN where the count is
     * not well defined. Required. Backs attn_flops (the sweep's GFLOP/s figures). */
    double (*flops)(const attn *a, const attn_shape *s, bool backward);
    /* Non-causal only (efficient): attn_check_shape refuses a causal shape for it with
     * ATTN_EUNSUPPORTED, before the backend sees it. */
    bool noncausal_only;
    /* Learned parameters of the variant's own (linformer), all NULL for the others:
     * their count for sequences of up to max_len (0, or AB_EINVAL with a message when
     * it overflows), their initial values drawn into host memory (element j from
     * (seed, stream, j)), and whether one set serves every layer of a model. */
    int (*param_count)(const attn *a, int max_len, size_t *count);
    void (*param_init)(const attn *a, int max_len, uint64_t seed, uint64_t stream, float *params);
    bool (*params_shared_by_layers)(const attn *a);
    /* A per-position input of the variant's own (attention.h: attn_bind_aux), both NULL
     * for the others: its name and its floats per (b, h, position) at head size D. */
    const char *aux_name;
    int (*aux_width)(const attn *a, int qk_dim);
    const attn_backend *cpu;
    const attn_backend *cuda; /* NULL until the CUDA backend provides it */
} attn_variant;

struct attn {
    const attn_variant *v;
    const attn_backend *be;
    ab_device device;
    uint64_t seed;
    attn_params p;
    void *ws; /* workspace on the object's device, tracked allocator */
    size_t ws_bytes;
    /* Host scratch of an attention on CUDA, for what a call computes on the host before
     * uploading it (favor's random projection); tracked CPU memory, grown like ws. */
    void *host_ws;
    size_t host_ws_bytes;
    /* attn_bind_params: the variant's parameters and their gradient (NULL: none
     * computed), memory of the object's device, for sequences of up to param_len. */
    const float *params;
    float *param_grads;
    int param_len; /* 0 until bound */
    /* attn_bind_aux: the extra input and its gradient (NULL: none computed), memory of
     * the object's device; aux is NULL until bound. */
    const float *aux;
    float *aux_grad;
};

/* Ensures a->ws holds at least `bytes`; allocates (tracked) only when it must grow. */
int attn_ws_ensure(attn *a, size_t bytes);
/* The same for a->host_ws (CPU memory, whatever the object's device). */
int attn_host_ws_ensure(attn *a, size_t bytes);

/* The scale to use for head dimension D (option or 1/sqrt(D)). */
double attn_scale(const attn *a, int qk_dim);

/* Variants (one per file). */
extern const attn_variant attn_variant_softmax;
extern const attn_variant attn_variant_stateful_softmax;
extern const attn_variant attn_variant_linear;
extern const attn_variant attn_variant_polynomial;
extern const attn_variant attn_variant_lsh;
extern const attn_variant attn_variant_efficient;
extern const attn_variant attn_variant_local;
extern const attn_variant attn_variant_linformer;
extern const attn_variant attn_variant_retention;
extern const attn_variant attn_variant_sparse;
extern const attn_variant attn_variant_deltanet;
extern const attn_variant attn_variant_gla;

#ifdef __cplusplus
}
#endif

#endif
