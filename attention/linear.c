/* TEMPORARY skeleton: replaced by the real implementation before this lands. */
#include "variant.h"
#include "../harness/error.h"
static void defaults_linear(attn_params *p) { (void)p; }
static size_t zero_linear(const attn *a, const attn_shape *s) { (void)a; (void)s; return 0; }
static int fwd_linear(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out, void *saved) {
    (void)a; (void)s; (void)q; (void)k; (void)v; (void)out; (void)saved;
    return ab_fail(AB_EUNSUPPORTED, "not implemented yet");
}
static int bwd_linear(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, const float *dout,
                  const void *saved, float *dq, float *dk, float *dv) {
    (void)a; (void)s; (void)q; (void)k; (void)v; (void)dout; (void)saved; (void)dq; (void)dk; (void)dv;
    return ab_fail(AB_EUNSUPPORTED, "not implemented yet");
}
static const attn_backend cpu_linear = {.saved_bytes = zero_linear, .workspace_bytes = zero_linear, .forward = fwd_linear, .backward = bwd_linear};
const attn_variant attn_variant_linear = {.name = "linear", .summary = "not implemented yet", .options = NULL, .n_options = 0,
                                      .defaults = defaults_linear, .cpu = &cpu_linear};
static void defaults_polynomial(attn_params *p) { (void)p; }
static size_t zero_polynomial(const attn *a, const attn_shape *s) { (void)a; (void)s; return 0; }
static int fwd_polynomial(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out, void *saved) {
    (void)a; (void)s; (void)q; (void)k; (void)v; (void)out; (void)saved;
    return ab_fail(AB_EUNSUPPORTED, "not implemented yet");
}
static int bwd_polynomial(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, const float *dout,
                  const void *saved, float *dq, float *dk, float *dv) {
    (void)a; (void)s; (void)q; (void)k; (void)v; (void)dout; (void)saved; (void)dq; (void)dk; (void)dv;
    return ab_fail(AB_EUNSUPPORTED, "not implemented yet");
}
static const attn_backend cpu_polynomial = {.saved_bytes = zero_polynomial, .workspace_bytes = zero_polynomial, .forward = fwd_polynomial, .backward = bwd_polynomial};
const attn_variant attn_variant_polynomial = {.name = "polynomial", .summary = "not implemented yet", .options = NULL, .n_options = 0,
                                      .defaults = defaults_polynomial, .cpu = &cpu_polynomial};
