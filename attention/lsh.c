/* TEMPORARY skeleton: replaced by the real implementation before this lands. */
#include "variant.h"
#include "../harness/error.h"
static void defaults_lsh(attn_params *p) { (void)p; }
static size_t zero_lsh(const attn *a, const attn_shape *s) { (void)a; (void)s; return 0; }
static int fwd_lsh(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out, void *saved) {
    (void)a; (void)s; (void)q; (void)k; (void)v; (void)out; (void)saved;
    return ab_fail(AB_EUNSUPPORTED, "not implemented yet");
}
static int bwd_lsh(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, const float *dout,
                  const void *saved, float *dq, float *dk, float *dv) {
    (void)a; (void)s; (void)q; (void)k; (void)v; (void)dout; (void)saved; (void)dq; (void)dk; (void)dv;
    return ab_fail(AB_EUNSUPPORTED, "not implemented yet");
}
static const attn_backend cpu_lsh = {.saved_bytes = zero_lsh, .workspace_bytes = zero_lsh, .forward = fwd_lsh, .backward = bwd_lsh};
const attn_variant attn_variant_lsh = {.name = "lsh", .summary = "not implemented yet", .options = NULL, .n_options = 0,
                                      .defaults = defaults_lsh, .cpu = &cpu_lsh};
