/* TEMPORARY skeleton: replaced by the real implementation before this lands. */
#include "variant.h"
#include "../harness/error.h"
static void defaults_stateful_softmax(attn_params *p) { (void)p; }
static size_t zero_stateful_softmax(const attn *a, const attn_shape *s) { (void)a; (void)s; return 0; }
static int fwd_stateful_softmax(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out, void *saved) {
    (void)a; (void)s; (void)q; (void)k; (void)v; (void)out; (void)saved;
    return ab_fail(AB_EUNSUPPORTED, "not implemented yet");
}
static int bwd_stateful_softmax(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, const float *dout,
                  const void *saved, float *dq, float *dk, float *dv) {
    (void)a; (void)s; (void)q; (void)k; (void)v; (void)dout; (void)saved; (void)dq; (void)dk; (void)dv;
    return ab_fail(AB_EUNSUPPORTED, "not implemented yet");
}
static const attn_backend cpu_stateful_softmax = {.saved_bytes = zero_stateful_softmax, .workspace_bytes = zero_stateful_softmax, .forward = fwd_stateful_softmax, .backward = bwd_stateful_softmax};
const attn_variant attn_variant_stateful_softmax = {.name = "stateful-softmax", .summary = "not implemented yet", .options = NULL, .n_options = 0,
                                      .defaults = defaults_stateful_softmax, .cpu = &cpu_stateful_softmax};
