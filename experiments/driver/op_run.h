/* One attention call on tensors read from .npy files (what `attnbench op` does): the
 * forward (with a gradient, the backward) or the recurrent steps, the results written
 * as .npy files into a folder. */
#ifndef AB_OP_RUN_H
#define AB_OP_RUN_H

#include "attention.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const char *variant;
    const char *const *settings; /* the variant's "KEY=VALUE" options */
    int n_settings;
    uint64_t seed;               /* the variant's parameters (stream 0) */
    ab_device device;
    bool causal;
    bool recurrent;              /* the recurrent steps over t = 0..N-1 (needs causal, no dout
                                  * or lengths) */
    int max_len;                 /* the parameters' longest sequence; 0: N */
    /* .npy files: q, k, v required; dout (the backward) and lengths may be NULL */
    const char *q, *k, *v, *dout, *lengths;
    /* the variant's own input (attn_variant_aux: gla's g, deltanet's beta): its option's
     * name as given ("g", "beta"; checked against the variant's) and its .npy file,
     * [B, H, N] when it is one float per position, else [B, H, N, W]; NULL: none */
    const char *aux_opt, *aux;
    const char *out;             /* the folder of out.npy (dq, dk, dv, d<aux>, params, dparams .npy) */
} op_request;

/* Runs the call and writes its results. 0, or the error code with a one-line message
 * (the words of `attnbench op`): AB_EINVAL, AB_EIO, AB_EUNSUPPORTED for the request
 * (variant, options, files, shapes), AB_ENOMEM, AB_EDEVICE, AB_ESYSTEM for the machine. */
int op_run(const op_request *r);

#endif
