/* The optimiser's state in a checkpoint (optim.h): one blob of ab_optim_get_state. */
#include "optim.h"

#include "checkpoint.h"
#include "error.h"

#include <stdio.h>

int ab_ckpt_add_optim(ab_ckpt_writer *w, const char *name, ab_optim *o) {
    if (!w) return ab_fail(AB_EINVAL, "checkpoint: add on a NULL writer");
    if (!o) return ab_ckpt_poison(w, ab_fail(AB_EINVAL, "checkpoint: blob '%s': no optimiser", name));
    const void *p;
    size_t n;
    int rc = ab_optim_get_state(o, &p, &n);
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ab_error());
        return ab_ckpt_poison(w, ab_fail(rc, "checkpoint: blob '%s': %s", name, msg));
    }
    return ab_ckpt_add(w, name, p, n);
}

int ab_ckpt_get_optim(const ab_ckpt_reader *r, const char *name, ab_optim *o) {
    const void *p;
    size_t n;
    int rc = ab_ckpt_get(r, name, &p, &n);
    if (rc) return rc;
    rc = ab_optim_set_state(o, p, n);
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ab_error());
        return ab_fail(rc, "%s: blob '%s': %s", ab_ckpt_path(r), name, msg);
    }
    return 0;
}
