/* TEMPORARY skeleton: replaced by the real implementation before this lands. */
#include "variant.h"
#include "../harness/error.h"
static void defaults_softmax(attn_params *p) { (void)p; }
static size_t zero_softmax(const attn *a, const attn_shape *s) { (void)a; (void)s; return 0; }
static int fwd_softmax(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out, void *saved) {
    (void)a; (void)s; (void)q; (void)k; (void)v; (void)out; (void)saved;
    return ab_fail(AB_EUNSUPPORTED, "not implemented yet");
}
static int bwd_softmax(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, const float *dout,
                  const void *saved, float *dq, float *dk, float *dv) {
    (void)a; (void)s; (void)q; (void)k; (void)v; (void)dout; (void)saved; (void)dq; (void)dk; (void)dv;
    return ab_fail(AB_EUNSUPPORTED, "not implemented yet");
}
static const attn_backend cpu_softmax = {.saved_bytes = zero_softmax, .workspace_bytes = zero_softmax, .forward = fwd_softmax, .backward = bwd_softmax};
const attn_variant attn_variant_softmax = {.name = "softmax", .summary = "not implemented yet", .options = NULL, .n_options = 0,
                                      .defaults = defaults_softmax, .cpu = &cpu_softmax};
