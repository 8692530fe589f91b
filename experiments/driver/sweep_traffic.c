/* The traffic of a bench point (sweep.h, "memory traffic"): the minimal bytes of an
 * operation and the counted ones as a record's "traffic" object. */
#include "sweep.h"

#include "cuda_traffic.h"
#include "error.h"
#include "results.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void sweep_min_bytes_parallel(const attn_shape *s, size_t n_params, bool backward, double *read, double *write) {
    const double bh = (double)s->batch * s->heads, n = s->len;
    const double qk = bh * n * s->qk_dim * 4.0, vo = bh * n * s->v_dim * 4.0, par = (double)n_params * 4.0;
    *read = 2.0 * qk + vo + par; /* q, k, v, parameters */
    *write = vo;                 /* out */
    if (backward) {
        *read += vo;                     /* dout */
        *write += 2.0 * qk + vo + par;   /* dq, dk, dv, parameters' gradient */
    }
}

/* The variant of a with the same options on the CPU (NULL if it cannot be made): its
 * recurrent state is the algorithm's, without what a device backend adds (padding to
 * aligned boundaries, counters for its blocks). The precision is the device's only. */
static attn *cpu_twin(const attn *a) {
    const int vi = attn_variant_find(attn_name(a));
    char vals[16][64], set[16][160];
    const char *sets[16];
    int n = 0;
    const char *name, *def;
    for (int j = 0; n < 16 && attn_variant_option(vi, j, &name, &def, NULL); j++) {
        if (strcmp(name, "precision") == 0 || !attn_option_value(a, NULL, name, vals[n], sizeof vals[n]) ||
            strcmp(vals[n], def) == 0) /* a default (e.g. scale's "1/sqrt(D)") need not be given */
            continue;
        snprintf(set[n], sizeof set[n], "%s=%s", name, vals[n]);
        sets[n] = set[n];
        n++;
    }
    attn_options o = {attn_name(a), AB_DEV_CPU, 0, n, sets};
    attn *t = NULL;
    if (attn_create(&o, &t)) {
        ab_clear_error();
        return NULL;
    }
    return t;
}

int sweep_min_state_bytes(const attn *a, const attn_shape *s, int t, double *read, double *write) {
    if (t < 0) return ab_fail(AB_EINVAL, "sweep_min_state_bytes: position %d < 0", t);
    attn *twin = cpu_twin(a);
    if (twin) a = twin;
    /* A state that grows (a key/value cache) holds more at a larger capacity: its bytes
     * per position are its growth over G positions / G (a state may pad its parts to
     * 256-byte boundaries and keep a few fixed words: over G = 4096 positions that is
     * under a byte per position, rounded away to whole floats); the step must read the
     * t positions held and write one. */
    const int G = 4096;
    const size_t next = attn_state_bytes(a, s, t + 1), far = next ? attn_state_bytes(a, s, t + 1 + G) : 0;
    if (!next || !far) {
        attn_destroy(twin);
        return AB_EINVAL; /* no recurrent mode: the message is set */
    }
    if (far > next) {
        const double per_pos = 4.0 * floor((double)(far - next) / G / 4.0 + 0.5);
        *read = per_pos * t; /* the t positions held */
        *write = per_pos;    /* the new position */
    } else {
        *read = (double)next; /* a state of fixed size: read and rewritten */
        *write = (double)next;
    }
    attn_destroy(twin);
    return 0;
}

int sweep_min_bytes_step(const attn *a, const attn_shape *s, int t, double *read, double *write) {
    double sr = 0, sw = 0;
    const int rc = sweep_min_state_bytes(a, s, t, &sr, &sw);
    if (rc) return rc;
    const double bh = (double)s->batch * s->heads;
    *read = bh * (2.0 * s->qk_dim + s->v_dim) * 4.0 + sr; /* q, k, v; the state */
    *write = bh * s->v_dim * 4.0 + sw;                    /* out; the state */
    return 0;
}

static json_t *counts_json(json_t *o, const ab_traffic_counts *c) {
    json_object_set_new(o, "launches", json_integer((json_int_t)c->launches));
    json_object_set_new(o, "dram_read_bytes", json_integer((json_int_t)c->dram_read));
    json_object_set_new(o, "dram_write_bytes", json_integer((json_int_t)c->dram_write));
    json_object_set_new(o, "requested_read_bytes", json_integer((json_int_t)c->req_read));
    json_object_set_new(o, "requested_write_bytes", json_integer((json_int_t)c->req_write));
    return o;
}

json_t *sweep_traffic_json(const char *what, double min_read, double min_write) {
    ab_traffic_counts c;
    unsigned long long h2d, d2h;
    ab_cuda_traffic_total(&c, &h2d, &d2h);
    json_t *o = json_object();
    json_object_set_new(o, "what", json_string(what));
    counts_json(o, &c);
    json_object_set_new(o, "min_read_bytes", json_integer((json_int_t)min_read));
    json_object_set_new(o, "min_write_bytes", json_integer((json_int_t)min_write));
    const double min = min_read + min_write;
    json_object_set_new(o, "dram_over_min", ab_json_num(((double)c.dram_read + (double)c.dram_write) / min));
    json_object_set_new(o, "requested_over_min", ab_json_num(((double)c.req_read + (double)c.req_write) / min));
    json_object_set_new(o, "h2d_bytes", json_integer((json_int_t)h2d));
    json_object_set_new(o, "d2h_bytes", json_integer((json_int_t)d2h));
    json_t *by = json_array();
    const int n = ab_cuda_traffic_entries();
    for (int i = 0; i < n; i++) {
        ab_traffic_kind kind;
        ab_traffic_counts e;
        const char *name = ab_cuda_traffic_entry(i, &kind, &e);
        if (!name) break;
        json_t *x = json_object();
        json_object_set_new(x, "name", json_string(name));
        json_object_set_new(x, "kind", json_string(ab_traffic_kind_name(kind)));
        json_array_append_new(by, counts_json(x, &e));
    }
    json_object_set_new(o, "by_name", by);
    return o;
}
