/* attnbench op: one attention call on tensors given as .npy files, so anyone can
 * cross-check a variant against their own implementation. */
#include "attention.h"
#include "cli_util.h"
#include "commands.h"
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
    "                    --out DIR [--threads N]\n"
    "\n"
    "Runs one attention call. q and k are float32 [B, H, N, D], v (and dout) float32\n"
    "[B, H, N, M], lengths int32 or int64 [B] (positions >= lengths[b] are padding).\n"
    "Writes DIR/out.npy; with --dout also DIR/dq.npy, DIR/dk.npy, DIR/dv.npy.\n"
    "--mode recurrent runs the recurrent step over t = 0..N-1 (variants that have one;\n"
    "needs --causal) and writes DIR/out.npy. `attnbench list` shows variants and options.\n";

#define MAX_SETTINGS 64

typedef struct {
    const char *variant, *q, *k, *v, *dout, *lengths, *out;
    bool causal, recurrent;
    attn_device device;
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
            const char *d = cli_value(argc, argv, &i);
            if (strcmp(d, "cpu") == 0) a->device = ATTN_DEVICE_CPU;
            else if (strcmp(d, "cuda") == 0) a->device = ATTN_DEVICE_CUDA;
            else cli_die(AB_EXIT_USAGE, "--device %s: must be cpu or cuda", d);
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
        else if (strcmp(o, "--out") == 0) a->out = cli_value(argc, argv, &i);
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
    if (rc) cli_die(AB_EXIT_USAGE, "%s: %s", what, ab_error());
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
    if (ab_npy_write(path, AB_F32, 4, like->shape, data)) cli_die(AB_EXIT_USAGE, "%s", ab_error());
}

static float *alloc_or_die(size_t bytes) {
    float *p = ab_alloc(bytes ? bytes : 1);
    if (!p) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
    return p;
}

int cmd_op(int argc, char **argv) {
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
        lengths = malloc(sizeof(int) * (size_t)s.batch);
        if (!lengths) cli_die(AB_EXIT_FAILURE, "out of memory");
        for (int b = 0; b < s.batch; b++) {
            long long x = len.dtype == AB_I32 ? ((const int32_t *)len.data)[b] : ((const int64_t *)len.data)[b];
            if (x < 0 || x > s.len)
                cli_die(AB_EXIT_USAGE, "--lengths (%s): lengths[%d] = %lld is outside [0, N=%d]", a.lengths, b, x,
                        s.len);
            lengths[b] = (int)x;
        }
        s.lengths = lengths;
    }
    if ((rc = attn_check_shape(at, &s))) cli_die(cli_status_for(rc), "%s", attn_error());
    if (a.recurrent && !attn_has_step(at))
        cli_die(AB_EXIT_USAGE, "variant '%s' has no recurrent mode (use --mode parallel)", a.variant);
    if ((rc = ab_mkdir_p(a.out))) cli_die(AB_EXIT_USAGE, "--out: %s", ab_error());

    size_t out_bytes = v.count * sizeof(float);
    float *out = alloc_or_die(out_bytes);
    if (!a.recurrent) {
        size_t saved_bytes = attn_saved_bytes(at, &s);
        void *saved = saved_bytes ? ab_alloc(saved_bytes) : NULL;
        if (saved_bytes && !saved) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
        if ((rc = attn_forward(at, &s, q.data, k.data, v.data, out, saved)))
            cli_die(cli_status_for(rc), "forward: %s", attn_error());
        if (a.dout) {
            float *dq = alloc_or_die(q.count * sizeof(float));
            float *dk = alloc_or_die(k.count * sizeof(float));
            float *dv = alloc_or_die(v.count * sizeof(float));
            if ((rc = attn_backward(at, &s, q.data, k.data, v.data, dout.data, saved, dq, dk, dv)))
                cli_die(cli_status_for(rc), "backward: %s", attn_error());
            write_out(a.out, "out.npy", &v, out);
            write_out(a.out, "dq.npy", &q, dq);
            write_out(a.out, "dk.npy", &k, dk);
            write_out(a.out, "dv.npy", &v, dv);
            ab_free(dq);
            ab_free(dk);
            ab_free(dv);
        } else {
            write_out(a.out, "out.npy", &v, out);
        }
        ab_free(saved);
    } else {
        /* Recurrent: gather position t of every (b, h) into [B, H, X] buffers and step. */
        int B = s.batch, H = s.heads, N = s.len, D = s.qk_dim, M = s.v_dim;
        size_t state_bytes = attn_state_bytes(at, &s, N);
        if (!state_bytes) cli_die(AB_EXIT_USAGE, "%s", attn_error());
        void *state = ab_alloc(state_bytes);
        if (!state) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
        size_t bh = (size_t)B * H;
        float *qt = alloc_or_die(bh * D * sizeof(float)), *kt = alloc_or_die(bh * D * sizeof(float));
        float *vt = alloc_or_die(bh * M * sizeof(float)), *ot = alloc_or_die(bh * M * sizeof(float));
        if ((rc = attn_state_init(at, &s, N, state))) cli_die(cli_status_for(rc), "%s", attn_error());
        const float *Q = q.data, *K = k.data, *V = v.data;
        for (int t = 0; t < N; t++) {
            for (size_t i = 0; i < bh; i++) {
                memcpy(qt + i * D, Q + (i * N + t) * D, sizeof(float) * D);
                memcpy(kt + i * D, K + (i * N + t) * D, sizeof(float) * D);
                memcpy(vt + i * M, V + (i * N + t) * M, sizeof(float) * M);
            }
            if ((rc = attn_step(at, &s, N, state, t, qt, kt, vt, ot)))
                cli_die(cli_status_for(rc), "step %d: %s", t, attn_error());
            for (size_t i = 0; i < bh; i++) memcpy(out + (i * N + t) * M, ot + i * M, sizeof(float) * M);
        }
        write_out(a.out, "out.npy", &v, out);
        ab_free(qt);
        ab_free(kt);
        ab_free(vt);
        ab_free(ot);
        ab_free(state);
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
