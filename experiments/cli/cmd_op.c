/* attnbench op: one attention call on tensors given as .npy files, so anyone can
 * cross-check a variant against their own implementation. */
#include "attention.h"
#include "cli_util.h"
#include "commands.h"
#include "device.h"
#include "error.h"
#include "fileio.h"
#include "memory.h"
#include "npy.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char OP_USAGE[] =
    "usage: attnbench op --variant NAME [--causal] [--set KEY=VALUE]... [--seed S]\n"
    "                    [--device cpu|cuda] [--mode parallel|recurrent]\n"
    "                    --q q.npy --k k.npy --v v.npy [--dout dout.npy] [--lengths lengths.npy]\n"
    "                    [--max-len L] --out DIR [--threads N]\n"
    "\n"
    "Runs one attention call. q and k are float32 [B, H, N, D], v (and dout) float32\n"
    "[B, H, N, M], lengths int32 or int64 [B] (positions >= lengths[b] are padding).\n"
    "Writes DIR/out.npy; with --dout also DIR/dq.npy, DIR/dk.npy, DIR/dv.npy.\n"
    "--mode recurrent runs the recurrent step over t = 0..N-1 (variants that have one;\n"
    "needs --causal) and writes DIR/out.npy. `attnbench list` shows variants and options.\n"
    "A variant with learned parameters (linformer) gets them drawn from --seed (stream 0)\n"
    "for sequences of up to --max-len L positions (default N; N <= L) and writes them to\n"
    "DIR/params.npy (float32, flat, the variant's layout), with --dout their gradient to\n"
    "DIR/dparams.npy.\n";

#define MAX_SETTINGS 64

typedef struct {
    const char *variant, *q, *k, *v, *dout, *lengths, *out;
    bool causal, recurrent;
    int max_len; /* 0: N */
    ab_device device;
    uint64_t seed;
    const char *settings[MAX_SETTINGS];
    int n_settings;
} op_args;

static void parse_args(int argc, char **argv, op_args *a) {
    memset(a, 0, sizeof *a);
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i];
        if (strcmp(o, "--help") == 0) {
            fputs(OP_USAGE, stdout);
            exit(0);
        } else if (strcmp(o, "--variant") == 0) a->variant = cli_value(argc, argv, &i);
        else if (strcmp(o, "--causal") == 0) a->causal = true;
        else if (strcmp(o, "--set") == 0) {
            const char *s = cli_value(argc, argv, &i);
            if (a->n_settings == MAX_SETTINGS) cli_die(AB_EXIT_USAGE, "too many --set options (at most %d)", MAX_SETTINGS);
            a->settings[a->n_settings++] = s;
        } else if (strcmp(o, "--seed") == 0) a->seed = cli_parse_u64("--seed", cli_value(argc, argv, &i));
        else if (strcmp(o, "--device") == 0) {
            a->device = cli_device_value(argc, argv, &i);
        } else if (strcmp(o, "--mode") == 0) {
            const char *m = cli_value(argc, argv, &i);
            if (strcmp(m, "parallel") == 0) a->recurrent = false;
            else if (strcmp(m, "recurrent") == 0) a->recurrent = true;
            else cli_die(AB_EXIT_USAGE, "--mode %s: must be parallel or recurrent", m);
        } else if (strcmp(o, "--q") == 0) a->q = cli_value(argc, argv, &i);
        else if (strcmp(o, "--k") == 0) a->k = cli_value(argc, argv, &i);
        else if (strcmp(o, "--v") == 0) a->v = cli_value(argc, argv, &i);
        else if (strcmp(o, "--dout") == 0) a->dout = cli_value(argc, argv, &i);
        else if (strcmp(o, "--lengths") == 0) a->lengths = cli_value(argc, argv, &i);
        else if (strcmp(o, "--max-len") == 0) {
            unsigned long long x = cli_parse_u64("--max-len", cli_value(argc, argv, &i));
            if (x < 1 || x > INT_MAX) cli_die(AB_EXIT_USAGE, "--max-len %llu: must be 1..%d", x, INT_MAX);
            a->max_len = (int)x;
        }
        else if (strcmp(o, "--out") == 0) a->out = cli_path_value(argc, argv, &i);
        else cli_die(AB_EXIT_USAGE, "op: unknown argument '%s' (see attnbench op --help)", o);
    }
    if (!a->variant) cli_die(AB_EXIT_USAGE, "op: --variant is required (see attnbench list)");
    if (!a->q || !a->k || !a->v) cli_die(AB_EXIT_USAGE, "op: --q, --k and --v are required");
    if (!a->out) cli_die(AB_EXIT_USAGE, "op: --out DIR is required");
    if (a->recurrent && !a->causal)
        cli_die(AB_EXIT_USAGE, "op: --mode recurrent computes causal attention: add --causal");
    if (a->recurrent && a->dout) cli_die(AB_EXIT_USAGE, "op: --dout (backward) needs --mode parallel");
    if (a->recurrent && a->lengths) cli_die(AB_EXIT_USAGE, "op: --lengths needs --mode parallel");
}

static void load(const char *path, const char *what, ab_array *arr) {
    int rc = ab_npy_read(path, arr);
    if (rc) cli_die(cli_status_for(rc), "%s: %s", what, ab_error()); /* out of memory: 1 */
}

static void need_f32_4d(const char *what, const char *path, const ab_array *a) {
    if (a->dtype != AB_F32)
        cli_die(AB_EXIT_USAGE, "%s (%s): dtype %s, need float32", what, path, ab_dtype_name(a->dtype));
    if (a->ndim != 4) cli_die(AB_EXIT_USAGE, "%s (%s): %d dimensions, need 4 [B, H, N, X]", what, path, a->ndim);
    for (int i = 0; i < 4; i++)
        if (a->shape[i] < 1 || a->shape[i] > INT_MAX)
            cli_die(AB_EXIT_USAGE, "%s (%s): dimension %d is %lld, need 1..%d", what, path, i, (long long)a->shape[i],
                    INT_MAX);
}

static void shape_str(const ab_array *a, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < a->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static void write_out(const char *dir, const char *name, const ab_array *like, const float *data) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        cli_die(AB_EXIT_USAGE, "--out %s: path too long", dir);
    int rc = ab_npy_write(path, AB_F32, 4, like->shape, data);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
}

/* A flat float32 array of n values (the variant's parameters or their gradient). */
static void write_flat(const char *dir, const char *name, const float *data, size_t n) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        cli_die(AB_EXIT_USAGE, "--out %s: path too long", dir);
    int64_t shape[1] = {(int64_t)n};
    int rc = ab_npy_write(path, AB_F32, 1, shape, data);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
}

static float *alloc_or_die(size_t bytes) {
    float *p = ab_alloc(bytes ? bytes : 1);
    if (!p) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
    return p;
}

/* Tensors on the attention's device: on the CPU the host buffers themselves (inputs)
 * or tracked host buffers; on CUDA device buffers filled from and copied back to host
 * buffers. Failures end the command (out of memory, device errors: exit status 1). */
static void *dev_alloc(ab_device d, size_t bytes) {
    void *p = NULL;
    if (ab_dev_malloc(d, &p, bytes ? bytes : 1)) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
    return p;
}

static void dev_free(ab_device d, void *p) { ab_dev_free(d, p); }

/* The device copy of host data (on the CPU: the host data itself, not copied). */
static const float *dev_input(ab_device d, const float *host, size_t n) {
    if (d == AB_DEV_CPU) return host;
    float *p = dev_alloc(d, n * sizeof(float));
    if (ab_dev_upload(d, p, host, n * sizeof(float))) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
    return p;
}

static void dev_input_free(ab_device d, const float *p) {
    if (d != AB_DEV_CPU) dev_free(d, (void *)p);
}

static void dev_upload(ab_device d, float *dev, const float *host, size_t n) {
    if (ab_dev_upload(d, dev, host, n * sizeof(float))) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
}

static void dev_download(ab_device d, float *host, const float *dev, size_t n) {
    if (ab_dev_download(d, host, dev, n * sizeof(float))) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
}

int cmd_op(int argc, char **argv, const char *command_line) {
    (void)command_line;
    op_args a;
    parse_args(argc, argv, &a);

    /* Create the attention first: an unknown variant or option fails before any file is read. */
    attn_options opt = {a.variant, a.device, a.seed, a.n_settings, a.settings};
    attn *at = NULL;
    int rc = attn_create(&opt, &at);
    /* Every refusal here is about the request (variant, options, device): exit 2. */
    if (rc) cli_die(rc == AB_ENOMEM ? AB_EXIT_FAILURE : AB_EXIT_USAGE, "%s", attn_error());

    ab_array q, k, v, dout = {0}, len = {0};
    load(a.q, "--q", &q);
    load(a.k, "--k", &k);
    load(a.v, "--v", &v);
    need_f32_4d("--q", a.q, &q);
    need_f32_4d("--k", a.k, &k);
    need_f32_4d("--v", a.v, &v);
    char s1[96], s2[96];
    shape_str(&q, s1, sizeof s1);
    shape_str(&k, s2, sizeof s2);
    if (memcmp(q.shape, k.shape, sizeof(int64_t) * 4) != 0)
        cli_die(AB_EXIT_USAGE, "--k has shape %s but --q has %s: q and k must both be [B, H, N, D]", s2, s1);
    shape_str(&v, s2, sizeof s2);
    if (memcmp(q.shape, v.shape, sizeof(int64_t) * 3) != 0)
        cli_die(AB_EXIT_USAGE, "--v has shape %s but --q has %s: v must be [B, H, N, M] with q's B, H, N", s2, s1);
    if (a.dout) {
        load(a.dout, "--dout", &dout);
        need_f32_4d("--dout", a.dout, &dout);
        if (memcmp(dout.shape, v.shape, sizeof(int64_t) * 4) != 0) {
            shape_str(&dout, s1, sizeof s1);
            cli_die(AB_EXIT_USAGE, "--dout has shape %s but --v has %s: they must match", s1, s2);
        }
    }
    attn_shape s = {(int)q.shape[0], (int)q.shape[1], (int)q.shape[2], (int)q.shape[3], (int)v.shape[3], a.causal,
                    NULL};
    int *lengths = NULL;
    if (a.lengths) {
        load(a.lengths, "--lengths", &len);
        if (len.dtype == AB_F32) cli_die(AB_EXIT_USAGE, "--lengths (%s): dtype float32, need int32 or int64", a.lengths);
        if (len.ndim != 1 || len.shape[0] != s.batch) {
            shape_str(&len, s1, sizeof s1);
            cli_die(AB_EXIT_USAGE, "--lengths (%s) has shape %s, need [B] = [%d]", a.lengths, s1, s.batch);
        }
        for (int b = 0; b < s.batch; b++) { /* checked before the copy is allocated */
            long long x = len.dtype == AB_I32 ? ((const int32_t *)len.data)[b] : ((const int64_t *)len.data)[b];
            if (x < 0 || x > s.len)
                cli_die(AB_EXIT_USAGE, "--lengths (%s): lengths[%d] = %lld is outside [0, N=%d]", a.lengths, b, x,
                        s.len);
        }
        lengths = malloc(sizeof(int) * (size_t)s.batch);
        if (!lengths) cli_die(AB_EXIT_FAILURE, "out of memory");
        for (int b = 0; b < s.batch; b++)
            lengths[b] = (int)(len.dtype == AB_I32 ? ((const int32_t *)len.data)[b] : ((const int64_t *)len.data)[b]);
        s.lengths = lengths;
    }
    if ((rc = attn_check_shape(at, &s))) cli_die(cli_status_for(rc), "%s", attn_error());
    /* the variant's own parameters, drawn from the seed, and their gradient */
    const int max_len = a.max_len ? a.max_len : s.len;
    size_t np = 0;
    if ((rc = attn_param_count(at, max_len, &np))) cli_die(cli_status_for(rc), "%s", attn_error());
    if (a.max_len && np == 0) cli_die(AB_EXIT_USAGE, "--max-len: variant '%s' has no parameters", a.variant);
    if (max_len < s.len) cli_die(AB_EXIT_USAGE, "--max-len %d is shorter than the sequences (N=%d)", max_len, s.len);
    float *params = NULL, *dparams = NULL, *params_dev = NULL, *dparams_dev = NULL;
    if (np) {
        params = alloc_or_die(np * sizeof(float));
        dparams = alloc_or_die(np * sizeof(float));
        if ((rc = attn_param_init(at, max_len, a.seed, 0, params))) cli_die(cli_status_for(rc), "%s", attn_error());
        params_dev = (float *)dev_input(a.device, params, np);
        dparams_dev = dev_alloc(a.device, np * sizeof(float));
        if ((rc = ab_dev_memset(a.device, dparams_dev, 0, np * sizeof(float))))
            cli_die(AB_EXIT_FAILURE, "%s", ab_error());
        if ((rc = attn_bind_params(at, max_len, params_dev, dparams_dev))) cli_die(cli_status_for(rc), "%s", attn_error());
    }
    if (a.recurrent && !attn_has_step(at))
        cli_die(AB_EXIT_USAGE, "variant '%s' has no recurrent mode (use --mode parallel)", a.variant);
    if ((rc = ab_mkdir_p(a.out))) cli_die(cli_status_for(rc), "--out: %s", ab_error());

    const ab_device dev = a.device;
    size_t out_bytes = v.count * sizeof(float);
    float *out = alloc_or_die(out_bytes);
    if (!a.recurrent) {
        const float *dq_in = dev_input(dev, q.data, q.count), *dk_in = dev_input(dev, k.data, k.count);
        const float *dv_in = dev_input(dev, v.data, v.count);
        float *out_dev = dev_alloc(dev, out_bytes);
        size_t saved_bytes = attn_saved_bytes(at, &s);
        void *saved = saved_bytes ? dev_alloc(dev, saved_bytes) : NULL;
        if ((rc = attn_forward(at, &s, dq_in, dk_in, dv_in, out_dev, saved)))
            cli_die(cli_status_for(rc), "forward: %s", attn_error());
        dev_download(dev, out, out_dev, v.count);
        if (a.dout) {
            const float *ddo = dev_input(dev, dout.data, dout.count);
            float *dq = alloc_or_die(q.count * sizeof(float));
            float *dk = alloc_or_die(k.count * sizeof(float));
            float *dv = alloc_or_die(v.count * sizeof(float));
            float *ddq = dev_alloc(dev, q.count * sizeof(float)), *ddk = dev_alloc(dev, k.count * sizeof(float));
            float *ddv = dev_alloc(dev, v.count * sizeof(float));
            if ((rc = attn_backward(at, &s, dq_in, dk_in, dv_in, ddo, saved, ddq, ddk, ddv)))
                cli_die(cli_status_for(rc), "backward: %s", attn_error());
            dev_download(dev, dq, ddq, q.count);
            dev_download(dev, dk, ddk, k.count);
            dev_download(dev, dv, ddv, v.count);
            write_out(a.out, "out.npy", &v, out);
            write_out(a.out, "dq.npy", &q, dq);
            write_out(a.out, "dk.npy", &k, dk);
            write_out(a.out, "dv.npy", &v, dv);
            if (np) {
                dev_download(dev, dparams, dparams_dev, np);
                write_flat(a.out, "dparams.npy", dparams, np);
            }
            dev_input_free(dev, ddo);
            dev_free(dev, ddq);
            dev_free(dev, ddk);
            dev_free(dev, ddv);
            ab_free(dq);
            ab_free(dk);
            ab_free(dv);
        } else {
            write_out(a.out, "out.npy", &v, out);
        }
        if (np) write_flat(a.out, "params.npy", params, np);
        if (saved) dev_free(dev, saved);
        dev_free(dev, out_dev);
        dev_input_free(dev, dq_in);
        dev_input_free(dev, dk_in);
        dev_input_free(dev, dv_in);
    } else {
        /* Recurrent: gather position t of every (b, h) into [B, H, X] buffers and step. */
        int B = s.batch, H = s.heads, N = s.len, D = s.qk_dim, M = s.v_dim;
        attn_state *state = NULL;
        if ((rc = attn_state_create(at, &s, N, &state))) cli_die(cli_status_for(rc), "%s", attn_error());
        size_t bh = (size_t)B * H;
        float *qt = alloc_or_die(bh * D * sizeof(float)), *kt = alloc_or_die(bh * D * sizeof(float));
        float *vt = alloc_or_die(bh * M * sizeof(float)), *ot = alloc_or_die(bh * M * sizeof(float));
        float *dqt = dev_alloc(dev, bh * D * sizeof(float)), *dkt = dev_alloc(dev, bh * D * sizeof(float));
        float *dvt = dev_alloc(dev, bh * M * sizeof(float)), *ot_dev = dev_alloc(dev, bh * M * sizeof(float));
        const float *Q = q.data, *K = k.data, *V = v.data;
        for (int t = 0; t < N; t++) {
            for (size_t i = 0; i < bh; i++) {
                memcpy(qt + i * D, Q + (i * N + t) * D, sizeof(float) * D);
                memcpy(kt + i * D, K + (i * N + t) * D, sizeof(float) * D);
                memcpy(vt + i * M, V + (i * N + t) * M, sizeof(float) * M);
            }
            dev_upload(dev, dqt, qt, bh * D);
            dev_upload(dev, dkt, kt, bh * D);
            dev_upload(dev, dvt, vt, bh * M);
            if ((rc = attn_step(at, state, t, dqt, dkt, dvt, ot_dev)))
                cli_die(cli_status_for(rc), "step %d: %s", t, attn_error());
            dev_download(dev, ot, ot_dev, bh * M);
            for (size_t i = 0; i < bh; i++) memcpy(out + (i * N + t) * M, ot + i * M, sizeof(float) * M);
        }
        write_out(a.out, "out.npy", &v, out);
        dev_free(dev, dqt);
        dev_free(dev, dkt);
        dev_free(dev, dvt);
        dev_free(dev, ot_dev);
        ab_free(qt);
        ab_free(kt);
        ab_free(vt);
        ab_free(ot);
        attn_state_destroy(state);
    }
    if (np) {
        dev_input_free(dev, params_dev);
        dev_free(dev, dparams_dev);
        ab_free(params);
        ab_free(dparams);
    }
    ab_free(out);
    free(lengths);
    ab_array_free(&q);
    ab_array_free(&k);
    ab_array_free(&v);
    ab_array_free(&dout);
    ab_array_free(&len);
    attn_destroy(at);
    return 0;
}
