/* One attention call on .npy tensors (op_run.h). Every buffer is freed on every path:
 * the call returns its errors instead of ending the process. */
#include "op_run.h"

#include "device.h"
#include "error.h"
#include "fileio.h"
#include "memory.h"
#include "npy.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An allocation or a copy that failed on a valid request is the machine's: its code is
 * kept when it says so, else it is a device failure. */
static int machine_code(int rc) { return rc == AB_EINVAL || rc == AB_EIO || rc == AB_EUNSUPPORTED ? AB_EDEVICE : rc; }

static int load(const char *path, const char *what, ab_array *arr) {
    int rc = ab_npy_read(path, arr);
    if (rc) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", ab_error());
        return ab_fail(rc, "%s: %s", what, msg);
    }
    return 0;
}

static int need_f32_4d(const char *what, const char *path, const ab_array *a) {
    if (a->dtype != AB_F32)
        return ab_fail(AB_EINVAL, "%s (%s): dtype %s, need float32", what, path, ab_dtype_name(a->dtype));
    if (a->ndim != 4) return ab_fail(AB_EINVAL, "%s (%s): %d dimensions, need 4 [B, H, N, X]", what, path, a->ndim);
    for (int i = 0; i < 4; i++)
        if (a->shape[i] < 1 || a->shape[i] > INT_MAX)
            return ab_fail(AB_EINVAL, "%s (%s): dimension %d is %lld, need 1..%d", what, path, i,
                           (long long)a->shape[i], INT_MAX);
    return 0;
}

static void shape_str(const ab_array *a, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < a->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* DIR/NAME as a float32 array of `ndim` dimensions. */
static int write_npy(const char *dir, const char *name, int ndim, const int64_t *shape, const float *data) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return ab_fail(AB_EINVAL, "--out %s: path too long", dir);
    return ab_npy_write(path, AB_F32, ndim, shape, data);
}

static int write_out(const char *dir, const char *name, const ab_array *like, const float *data) {
    return write_npy(dir, name, 4, like->shape, data);
}

/* A flat float32 array of n values (the variant's parameters or their gradient). */
static int write_flat(const char *dir, const char *name, const float *data, size_t n) {
    int64_t shape[1] = {(int64_t)n};
    return write_npy(dir, name, 1, shape, data);
}

/* Tensors on the attention's device: on the CPU the host buffers themselves (inputs)
 * or tracked host buffers; on CUDA device buffers filled from and copied back to host
 * buffers. */
static int host_alloc(float **p, size_t bytes) {
    *p = ab_alloc(bytes ? bytes : 1);
    return *p ? 0 : machine_code(AB_ENOMEM);
}

static int dev_alloc(ab_device d, float **p, size_t bytes) {
    void *v = NULL;
    int rc = ab_dev_malloc(d, &v, bytes ? bytes : 1);
    *p = v;
    return rc ? machine_code(rc) : 0;
}

static void dev_free(ab_device d, const float *p) {
    if (p) ab_dev_free(d, (void *)p);
}

/* The device copy of host data (on the CPU: the host data itself, not copied). */
static int dev_input(ab_device d, const float **out, const float *host, size_t n) {
    *out = NULL;
    if (d == AB_DEV_CPU) {
        *out = host;
        return 0;
    }
    float *p;
    int rc = dev_alloc(d, &p, n * sizeof(float));
    if (!rc && (rc = ab_dev_upload(d, p, host, n * sizeof(float)))) {
        dev_free(d, p);
        return machine_code(rc);
    }
    *out = p;
    return rc;
}

static void dev_input_free(ab_device d, const float *p) {
    if (d != AB_DEV_CPU) dev_free(d, p);
}

static int dev_download(ab_device d, float *host, const float *dev, size_t n) {
    int rc = ab_dev_download(d, host, dev, n * sizeof(float));
    return rc ? machine_code(rc) : 0;
}

/* What a call holds: the attention, the tensors read, the variant's parameters. */
typedef struct {
    const op_request *r;
    attn *at;
    ab_array q, k, v, dout, len, aux;
    int *lengths;
    int aux_w;            /* floats per (b, h, position) of the variant's input; 0: none */
    const float *aux_dev; /* bound on the device */
    float *daux, *daux_dev;
    attn_shape s;
    size_t np;
    float *params, *dparams, *out;
    const float *params_dev;
    float *dparams_dev;
} op_call;

static void op_call_free(op_call *c) {
    ab_device d = c->r->device;
    if (c->np) {
        dev_input_free(d, c->params_dev);
        dev_free(d, c->dparams_dev);
    }
    if (c->aux_w) {
        dev_input_free(d, c->aux_dev);
        dev_free(d, c->daux_dev);
    }
    ab_free(c->daux);
    ab_array_free(&c->aux);
    ab_free(c->params);
    ab_free(c->dparams);
    ab_free(c->out);
    free(c->lengths);
    ab_array_free(&c->q);
    ab_array_free(&c->k);
    ab_array_free(&c->v);
    ab_array_free(&c->dout);
    ab_array_free(&c->len);
    attn_destroy(c->at);
}

/* q, k, v (and dout) read and checked against each other. */
static int read_tensors(op_call *c) {
    const op_request *r = c->r;
    int rc;
    if ((rc = load(r->q, "--q", &c->q)) || (rc = load(r->k, "--k", &c->k)) || (rc = load(r->v, "--v", &c->v)))
        return rc;
    if ((rc = need_f32_4d("--q", r->q, &c->q)) || (rc = need_f32_4d("--k", r->k, &c->k)) ||
        (rc = need_f32_4d("--v", r->v, &c->v)))
        return rc;
    char s1[96], s2[96];
    shape_str(&c->q, s1, sizeof s1);
    shape_str(&c->k, s2, sizeof s2);
    if (memcmp(c->q.shape, c->k.shape, sizeof(int64_t) * 4) != 0)
        return ab_fail(AB_EINVAL, "--k has shape %s but --q has %s: q and k must both be [B, H, N, D]", s2, s1);
    shape_str(&c->v, s2, sizeof s2);
    if (memcmp(c->q.shape, c->v.shape, sizeof(int64_t) * 3) != 0)
        return ab_fail(AB_EINVAL, "--v has shape %s but --q has %s: v must be [B, H, N, M] with q's B, H, N", s2,
                       s1);
    if (r->dout) {
        if ((rc = load(r->dout, "--dout", &c->dout)) || (rc = need_f32_4d("--dout", r->dout, &c->dout))) return rc;
        if (memcmp(c->dout.shape, c->v.shape, sizeof(int64_t) * 4) != 0) {
            shape_str(&c->dout, s1, sizeof s1);
            return ab_fail(AB_EINVAL, "--dout has shape %s but --v has %s: they must match", s1, s2);
        }
    }
    attn_shape s = {(int)c->q.shape[0], (int)c->q.shape[1], (int)c->q.shape[2], (int)c->q.shape[3],
                    (int)c->v.shape[3], r->causal, NULL};
    c->s = s;
    return 0;
}

/* --lengths: int32 or int64 [B], each in [0, N]. */
static int read_lengths(op_call *c) {
    const op_request *r = c->r;
    const ab_array *len = &c->len;
    int rc = load(r->lengths, "--lengths", &c->len);
    if (rc) return rc;
    if (len->dtype == AB_F32)
        return ab_fail(AB_EINVAL, "--lengths (%s): dtype float32, need int32 or int64", r->lengths);
    if (len->ndim != 1 || len->shape[0] != c->s.batch) {
        char s1[96];
        shape_str(len, s1, sizeof s1);
        return ab_fail(AB_EINVAL, "--lengths (%s) has shape %s, need [B] = [%d]", r->lengths, s1, c->s.batch);
    }
    for (int b = 0; b < c->s.batch; b++) { /* checked before the copy is allocated */
        long long x = len->dtype == AB_I32 ? ((const int32_t *)len->data)[b] : ((const int64_t *)len->data)[b];
        if (x < 0 || x > c->s.len)
            return ab_fail(AB_EINVAL, "--lengths (%s): lengths[%d] = %lld is outside [0, N=%d]", r->lengths, b, x,
                           c->s.len);
    }
    c->lengths = malloc(sizeof(int) * (size_t)c->s.batch);
    if (!c->lengths) return ab_fail(AB_ENOMEM, "out of memory");
    for (int b = 0; b < c->s.batch; b++)
        c->lengths[b] =
            (int)(len->dtype == AB_I32 ? ((const int32_t *)len->data)[b] : ((const int64_t *)len->data)[b]);
    c->s.lengths = c->lengths;
    return 0;
}

/* The variant's own parameters, drawn from the seed, and their gradient, bound. */
static int bind_params(op_call *c) {
    const op_request *r = c->r;
    const int max_len = r->max_len ? r->max_len : c->s.len;
    int rc;
    if ((rc = attn_param_count(c->at, max_len, &c->np))) return rc;
    if (r->max_len && c->np == 0) return ab_fail(AB_EINVAL, "--max-len: variant '%s' has no parameters", r->variant);
    if (max_len < c->s.len)
        return ab_fail(AB_EINVAL, "--max-len %d is shorter than the sequences (N=%d)", max_len, c->s.len);
    if (!c->np) return 0;
    if ((rc = host_alloc(&c->params, c->np * sizeof(float))) || (rc = host_alloc(&c->dparams, c->np * sizeof(float))))
        return rc;
    if ((rc = attn_param_init(c->at, max_len, r->seed, 0, c->params))) return rc;
    if ((rc = dev_input(r->device, &c->params_dev, c->params, c->np)) ||
        (rc = dev_alloc(r->device, &c->dparams_dev, c->np * sizeof(float))))
        return rc;
    if ((rc = ab_dev_memset(r->device, c->dparams_dev, 0, c->np * sizeof(float))))
        return machine_code(rc);
    return attn_bind_params(c->at, max_len, (float *)c->params_dev, c->dparams_dev);
}

/* The variant's own input (gla's g, deltanet's beta): read, checked against q's shape,
 * and bound with a gradient buffer. */
static int bind_aux(op_call *c) {
    const op_request *r = c->r;
    const char *name = attn_aux_name(c->at);
    if (!name) {
        if (r->aux) return ab_fail(AB_EINVAL, "--%s: variant '%s' takes no input beside q, k and v", r->aux_opt, r->variant);
        return 0;
    }
    if (!r->aux) return ab_fail(AB_EINVAL, "variant '%s' reads the input %s: give it with --%s FILE.npy", r->variant, name, name);
    if (strcmp(r->aux_opt, name) != 0)
        return ab_fail(AB_EINVAL, "--%s: variant '%s' reads %s (--%s FILE.npy)", r->aux_opt, r->variant, name, name);
    char opt[32];
    snprintf(opt, sizeof opt, "--%s", name);
    int rc = load(r->aux, opt, &c->aux);
    if (rc) return rc;
    const int w = attn_aux_width(c->at, c->s.qk_dim);
    const int nd = w == 1 ? 3 : 4;
    const int64_t want[4] = {c->s.batch, c->s.heads, c->s.len, w};
    if (c->aux.dtype != AB_F32)
        return ab_fail(AB_EINVAL, "%s (%s): dtype %s, need float32", opt, r->aux, ab_dtype_name(c->aux.dtype));
    if (c->aux.ndim != nd || memcmp(c->aux.shape, want, sizeof(int64_t) * (size_t)nd) != 0) {
        char got[96];
        shape_str(&c->aux, got, sizeof got);
        if (nd == 3)
            return ab_fail(AB_EINVAL, "%s (%s) has shape %s, need [B, H, N] = [%d, %d, %d]", opt, r->aux, got,
                           c->s.batch, c->s.heads, c->s.len);
        return ab_fail(AB_EINVAL, "%s (%s) has shape %s, need [B, H, N, %d] = [%d, %d, %d, %d]", opt, r->aux, got,
                       w, c->s.batch, c->s.heads, c->s.len, w);
    }
    c->aux_w = w;
    const size_t n = c->aux.count;
    if ((rc = host_alloc(&c->daux, n * sizeof(float))) || (rc = dev_input(r->device, &c->aux_dev, c->aux.data, n)) ||
        (rc = dev_alloc(r->device, &c->daux_dev, n * sizeof(float))))
        return rc;
    return attn_bind_aux(c->at, c->aux_dev, c->daux_dev);
}

/* The gradients of the backward, copied back and written. */
static int backward(op_call *c, const float *dq_in, const float *dk_in, const float *dv_in, const void *saved) {
    const ab_device dev = c->r->device;
    const char *dir = c->r->out;
    const size_t nq = c->q.count, nk = c->k.count, nv = c->v.count;
    const float *ddo = NULL;
    float *dq = NULL, *dk = NULL, *dv = NULL, *ddq = NULL, *ddk = NULL, *ddv = NULL;
    int rc;
    if ((rc = dev_input(dev, &ddo, c->dout.data, c->dout.count)) || (rc = host_alloc(&dq, nq * sizeof(float))) ||
        (rc = host_alloc(&dk, nk * sizeof(float))) || (rc = host_alloc(&dv, nv * sizeof(float))) ||
        (rc = dev_alloc(dev, &ddq, nq * sizeof(float))) || (rc = dev_alloc(dev, &ddk, nk * sizeof(float))) ||
        (rc = dev_alloc(dev, &ddv, nv * sizeof(float))))
        goto done;
    if ((rc = attn_backward(c->at, &c->s, dq_in, dk_in, dv_in, ddo, saved, ddq, ddk, ddv))) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", attn_error());
        rc = ab_fail(rc, "backward: %s", msg);
        goto done;
    }
    if ((rc = dev_download(dev, dq, ddq, nq)) || (rc = dev_download(dev, dk, ddk, nk)) ||
        (rc = dev_download(dev, dv, ddv, nv)))
        goto done;
    if ((rc = write_out(dir, "out.npy", &c->v, c->out)) || (rc = write_out(dir, "dq.npy", &c->q, dq)) ||
        (rc = write_out(dir, "dk.npy", &c->k, dk)) || (rc = write_out(dir, "dv.npy", &c->v, dv)))
        goto done;
    if (c->aux_w && !(rc = dev_download(dev, c->daux, c->daux_dev, c->aux.count))) {
        char name[40];
        snprintf(name, sizeof name, "d%s.npy", attn_aux_name(c->at));
        rc = write_npy(dir, name, c->aux.ndim, c->aux.shape, c->daux);
        if (rc) goto done;
    }
    if (c->np && !(rc = dev_download(dev, c->dparams, c->dparams_dev, c->np)))
        rc = write_flat(dir, "dparams.npy", c->dparams, c->np);
done:
    if (ddo) dev_input_free(dev, ddo);
    dev_free(dev, ddq);
    dev_free(dev, ddk);
    dev_free(dev, ddv);
    ab_free(dq);
    ab_free(dk);
    ab_free(dv);
    return rc;
}

/* The forward (and with dout the backward) over the whole sequences. */
static int run_parallel(op_call *c) {
    const ab_device dev = c->r->device;
    const float *dq_in = NULL, *dk_in = NULL, *dv_in = NULL;
    float *out_dev = NULL, *saved = NULL;
    int rc;
    if ((rc = dev_input(dev, &dq_in, c->q.data, c->q.count)) || (rc = dev_input(dev, &dk_in, c->k.data, c->k.count)) ||
        (rc = dev_input(dev, &dv_in, c->v.data, c->v.count)) ||
        (rc = dev_alloc(dev, &out_dev, c->v.count * sizeof(float))))
        goto done;
    size_t saved_bytes = attn_saved_bytes(c->at, &c->s);
    if (saved_bytes && (rc = dev_alloc(dev, &saved, saved_bytes))) goto done;
    if ((rc = attn_forward(c->at, &c->s, dq_in, dk_in, dv_in, out_dev, saved))) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", attn_error());
        rc = ab_fail(rc, "forward: %s", msg);
        goto done;
    }
    if ((rc = dev_download(dev, c->out, out_dev, c->v.count))) goto done;
    if (c->r->dout) rc = backward(c, dq_in, dk_in, dv_in, saved);
    else rc = write_out(c->r->out, "out.npy", &c->v, c->out);
    if (!rc && c->np) rc = write_flat(c->r->out, "params.npy", c->params, c->np);
done:
    dev_free(dev, saved);
    dev_free(dev, out_dev);
    if (dq_in) dev_input_free(dev, dq_in);
    if (dk_in) dev_input_free(dev, dk_in);
    if (dv_in) dev_input_free(dev, dv_in);
    return rc;
}

/* Recurrent: gather position t of every (b, h) into [B, H, X] buffers and step. */
static int run_recurrent(op_call *c) {
    const ab_device dev = c->r->device;
    const int B = c->s.batch, H = c->s.heads, N = c->s.len, D = c->s.qk_dim, M = c->s.v_dim;
    const size_t bh = (size_t)B * H;
    attn_state *state = NULL;
    float *qt = NULL, *kt = NULL, *vt = NULL, *ot = NULL, *dqt = NULL, *dkt = NULL, *dvt = NULL, *ot_dev = NULL;
    float *at = NULL, *dat = NULL; /* the variant's input at position t */
    const int W = c->aux_w;
    int rc;
    if ((rc = attn_state_create(c->at, &c->s, N, &state))) return rc;
    if (W && ((rc = host_alloc(&at, bh * W * sizeof(float))) || (rc = dev_alloc(dev, &dat, bh * W * sizeof(float))) ||
              (rc = attn_bind_aux(c->at, dat, NULL))))
        goto done;
    if ((rc = host_alloc(&qt, bh * D * sizeof(float))) || (rc = host_alloc(&kt, bh * D * sizeof(float))) ||
        (rc = host_alloc(&vt, bh * M * sizeof(float))) || (rc = host_alloc(&ot, bh * M * sizeof(float))) ||
        (rc = dev_alloc(dev, &dqt, bh * D * sizeof(float))) || (rc = dev_alloc(dev, &dkt, bh * D * sizeof(float))) ||
        (rc = dev_alloc(dev, &dvt, bh * M * sizeof(float))) || (rc = dev_alloc(dev, &ot_dev, bh * M * sizeof(float))))
        goto done;
    const float *Q = c->q.data, *K = c->k.data, *V = c->v.data;
    for (int t = 0; t < N; t++) {
        for (size_t i = 0; i < bh; i++) {
            memcpy(qt + i * D, Q + (i * N + t) * D, sizeof(float) * D);
            memcpy(kt + i * D, K + (i * N + t) * D, sizeof(float) * D);
            memcpy(vt + i * M, V + (i * N + t) * M, sizeof(float) * M);
            if (W) memcpy(at + i * W, (const float *)c->aux.data + (i * N + t) * W, sizeof(float) * W);
        }
        if (W && (rc = ab_dev_upload(dev, dat, at, bh * W * sizeof(float)))) {
            rc = machine_code(rc);
            goto done;
        }
        if ((rc = ab_dev_upload(dev, dqt, qt, bh * D * sizeof(float))) ||
            (rc = ab_dev_upload(dev, dkt, kt, bh * D * sizeof(float))) ||
            (rc = ab_dev_upload(dev, dvt, vt, bh * M * sizeof(float)))) {
            rc = machine_code(rc);
            goto done;
        }
        if ((rc = attn_step(c->at, state, t, dqt, dkt, dvt, ot_dev))) {
            char msg[2048];
            snprintf(msg, sizeof msg, "%s", attn_error());
            rc = ab_fail(rc, "step %d: %s", t, msg);
            goto done;
        }
        if ((rc = dev_download(dev, ot, ot_dev, bh * M))) goto done;
        for (size_t i = 0; i < bh; i++) memcpy(c->out + (i * N + t) * M, ot + i * M, sizeof(float) * M);
    }
    rc = write_out(c->r->out, "out.npy", &c->v, c->out);
done:
    dev_free(dev, dqt);
    dev_free(dev, dkt);
    dev_free(dev, dvt);
    dev_free(dev, ot_dev);
    ab_free(qt);
    ab_free(kt);
    ab_free(vt);
    ab_free(ot);
    dev_free(dev, dat);
    ab_free(at);
    attn_state_destroy(state);
    return rc;
}

/* Everything before the computation: the attention, the tensors, the parameters, the
 * output folder. */
static int prepare(op_call *c) {
    const op_request *r = c->r;
    /* the attention first: an unknown variant or option fails before any file is read */
    attn_options opt = {r->variant, r->device, r->seed, r->n_settings, r->settings};
    int rc = attn_create(&opt, &c->at);
    /* every refusal here is about the request (variant, options, device) */
    if (rc) return rc == AB_ENOMEM ? AB_ENOMEM : AB_EINVAL;
    if ((rc = read_tensors(c))) return rc;
    if (r->lengths && (rc = read_lengths(c))) return rc;
    if ((rc = attn_check_shape(c->at, &c->s)) || (rc = bind_params(c)) || (rc = bind_aux(c))) return rc;
    if (r->recurrent && !attn_has_step(c->at))
        return ab_fail(AB_EINVAL, "variant '%s' has no recurrent mode (use --mode parallel)", r->variant);
    if ((rc = ab_mkdir_p(r->out))) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", ab_error());
        return ab_fail(rc, "--out: %s", msg);
    }
    return host_alloc(&c->out, c->v.count * sizeof(float));
}

int op_run(const op_request *r) {
    op_call c;
    memset(&c, 0, sizeof c);
    c.r = r;
    int rc = prepare(&c);
    if (!rc) rc = r->recurrent ? run_recurrent(&c) : run_parallel(&c);
    op_call_free(&c);
    return rc;
}
