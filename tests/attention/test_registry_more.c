/* The registry suite's workspace reuse, the full description of every option, FLOP
 * counts and the feature maps' table (part of test_registry; the suite is described
 * in test_registry.c, its known variants and helpers in test_registry.h). */
#include "test_registry.h"

/* ---- workspace reuse ---- */

/* Runs forward (and backward) twice at one shape: the second pass must not allocate
 * (peak unchanged after a reset) nor change the workspace size. */
static void check_no_realloc_set(const char *variant, int n_set, const char *const *set, attn_shape s, bool backward) {
    attn *a = make(variant, n_set, set);
    size_t nq = (size_t)s.batch * s.heads * s.len * s.qk_dim, nv = (size_t)s.batch * s.heads * s.len * s.v_dim;
    float *q = tu_alloc_f(nq), *k = tu_alloc_f(nq), *v = tu_alloc_f(nv), *out = tu_alloc_f(nv);
    float *dout = tu_alloc_f(nv), *dq = tu_alloc_f(nq), *dk = tu_alloc_f(nq), *dv = tu_alloc_f(nv);
    tu_fill_normal(q, nq, 21, 0, 1.0);
    tu_fill_normal(k, nq, 21, 1, 1.0);
    tu_fill_normal(v, nv, 21, 2, 1.0);
    tu_fill_normal(dout, nv, 21, 3, 1.0);
    size_t sb = attn_saved_bytes(a, &s);
    void *saved = malloc(sb ? sb : 1);
    for (int pass = 0; pass < 2; pass++) {
        size_t ws = attn_workspace_bytes(a), cur = ab_mem_current(AB_DEV_CPU);
        ab_mem_reset_peak(AB_DEV_CPU);
        int rc = attn_forward(a, &s, q, k, v, out, saved);
        cr_assert_eq(rc, 0, "%s forward: %s", variant, attn_error());
        if (backward) {
            rc = attn_backward(a, &s, q, k, v, dout, saved, dq, dk, dv);
            cr_assert_eq(rc, 0, "%s backward: %s", variant, attn_error());
        }
        if (pass == 1) {
            cr_assert_eq(ab_mem_peak(AB_DEV_CPU), cur, "%s: repeated call allocated %zu bytes", variant,
                         ab_mem_peak(AB_DEV_CPU) - cur);
            cr_assert_eq(attn_workspace_bytes(a), ws, "%s: workspace changed", variant);
        }
        cr_assert_eq(ab_mem_current(AB_DEV_CPU), cur + (attn_workspace_bytes(a) - ws),
                     "%s: a call leaks tracked memory", variant);
    }
    free(q), free(k), free(v), free(out), free(dout), free(dq), free(dk), free(dv), free(saved);
    attn_destroy(a);
}

static void check_no_realloc(const char *variant, attn_shape s, bool backward) {
    check_no_realloc_set(variant, 0, NULL, s, backward);
}

Test(workspace, repeated_forward_allocates_nothing) {
    int lengths[2] = {50, 0};
    for (int i = 0; i < attn_variant_count(); i++) {
        const char *name = attn_variant_name(i);
        const bool causal = attn_variant_has_causal(i); /* causal where the variant has it */
        check_no_realloc(name, shape(2, 2, 64, 8, 8, causal, NULL), false);
        check_no_realloc(name, shape(2, 2, 64, 8, 8, causal_only(i), lengths), false);
        check_no_realloc(name, shape(2, 3, 37, 5, 3, causal, NULL), true);
    }
    /* favor draws its projection into the workspace at every call: nothing allocated */
    const char *favor[] = {"feature_map=favor"};
    check_no_realloc_set("linear", 1, favor, shape(2, 3, 37, 5, 3, true, NULL), true);
    check_no_realloc_set("linear", 1, favor, shape(2, 2, 64, 8, 8, false, lengths), true);
}

Test(workspace, reserve_then_calls_allocate_nothing) {
    attn_shape sc = shape(2, 2, 48, 8, 4, true, NULL);
    size_t nq = (size_t)2 * 2 * 48 * 8, nv = (size_t)2 * 2 * 48 * 4;
    float *q = tu_alloc_f(nq), *k = tu_alloc_f(nq), *v = tu_alloc_f(nv), *out = tu_alloc_f(nv);
    float *dq = tu_alloc_f(nq), *dk = tu_alloc_f(nq), *dv = tu_alloc_f(nv);
    tu_fill_normal(q, nq, 22, 0, 1.0);
    tu_fill_normal(k, nq, 22, 1, 1.0);
    tu_fill_normal(v, nv, 22, 2, 1.0);
    for (int i = 0; i < attn_variant_count(); i++) {
        const char *name = attn_variant_name(i);
        attn *a = make(name, 0, NULL);
        attn_shape s = sc;
        s.causal = attn_variant_has_causal(i);
        size_t sb = attn_saved_bytes(a, &s);
        void *saved = malloc(sb ? sb : 1);
        cr_assert_eq(attn_reserve(a, &s), 0, "%s: %s", name, attn_error());
        size_t cur = ab_mem_current(AB_DEV_CPU), ws = attn_workspace_bytes(a);
        ab_mem_reset_peak(AB_DEV_CPU);
        cr_assert_eq(attn_forward(a, &s, q, k, v, out, saved), 0, "%s: %s", name, attn_error());
        cr_assert_eq(attn_backward(a, &s, q, k, v, out, saved, dq, dk, dv), 0, "%s: %s", name, attn_error());
        cr_assert_eq(ab_mem_peak(AB_DEV_CPU), cur, "%s: forward/backward after reserve allocated", name);
        cr_assert_eq(attn_workspace_bytes(a), ws);
        /* Reserving a bad shape fails. */
        attn_shape bad = s;
        bad.len = 0;
        cr_assert_lt(attn_reserve(a, &bad), 0);
        free(saved);
        attn_destroy(a);
    }
    free(q), free(k), free(v), free(out), free(dq), free(dk), free(dv);
}

Test(workspace, steps_allocate_nothing) {
    enum { B = 2, H = 2, D = 6, M = 3, CAP = 12 };
    attn_shape s = shape(B, H, 1, D, M, true, NULL);
    float q[B * H * D], k[B * H * D], v[B * H * M], out[B * H * M];
    /* Every variant with a recurrent mode, and favor (its state draws its projection at
     * step 0, in the step workspace), and local with a window shorter than CAP (the ring
     * wraps). */
    const char *favor[] = {"feature_map=favor"}, *window[] = {"window=5"};
    for (int i = 0; i < attn_variant_count() + 2; i++) {
        if (i < attn_variant_count() && !attn_variant_has_step(i)) continue;
        const char *name = i < attn_variant_count() ? attn_variant_name(i) : i == attn_variant_count() ? "linear" : "local";
        attn *a = i < attn_variant_count() ? make(name, 0, NULL) : make(name, 1, i == attn_variant_count() ? favor : window);
        size_t n = attn_state_bytes(a, &s, CAP);
        cr_assert_gt(n, 0u, "%s: %s", name, attn_error());
        attn_state *st = NULL;
        cr_assert_eq(attn_state_create(a, &s, CAP, &st), 0, "%s: %s", name, attn_error());
        size_t cur = ab_mem_current(AB_DEV_CPU);
        ab_mem_reset_peak(AB_DEV_CPU);
        for (int t = 0; t < CAP; t++) {
            tu_fill_normal(q, B * H * D, 23, (uint64_t)3 * t, 1.0);
            tu_fill_normal(k, B * H * D, 23, (uint64_t)3 * t + 1, 1.0);
            tu_fill_normal(v, B * H * M, 23, (uint64_t)3 * t + 2, 1.0);
            cr_assert_eq(attn_step(a, st, t, q, k, v, out), 0, "%s t=%d: %s", name, t,
                         attn_error());
        }
        cr_assert_eq(ab_mem_peak(AB_DEV_CPU), cur, "%s: steps allocated %zu bytes", name,
                     ab_mem_peak(AB_DEV_CPU) - cur);
        attn_state_destroy(st);
        attn_destroy(a);
    }
}

/* ---- every option, fully described ---- */

/* attn_create with one "name=value" setting: its return code (the object is freed). */
static int try_setting(const char *variant, const char *name, const char *value) {
    char setting[160];
    snprintf(setting, sizeof setting, "%s=%s", name, value);
    const char *set[1] = {setting};
    attn_options o = {variant, AB_DEV_CPU, 1, 1, set};
    attn *a = NULL;
    int rc = attn_create(&o, &a);
    attn_destroy(a);
    return rc;
}

static int try_number(const char *variant, const char *name, double x) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.17g", x); /* 17 digits: reads back as x exactly */
    return try_setting(variant, name, buf);
}

/* For every option of every variant (what `attnbench list --json` shows): the full
 * description agrees with attn_variant_option; the default shown is what a new object
 * holds; every listed choice is accepted, reads back, and is named by the help; the
 * ends of a numeric range are accepted and values past them refused; "auto" is
 * accepted exactly where the description says so. */
Test(registry, every_option_described) {
    for (int i = 0; i < attn_variant_count(); i++) {
        const char *vn = attn_variant_name(i);
        attn *fresh = make(vn, 0, NULL);
        attn_option_info o;
        for (int j = 0; attn_variant_option_info(i, j, &o); j++) {
            const char *name, *def, *help;
            cr_assert(attn_variant_option(i, j, &name, &def, &help));
            cr_assert_str_eq(o.name, name);
            cr_assert_str_eq(o.def, def);
            cr_assert_str_eq(o.help, help);
            cr_assert_neq(o.help[0], '\0', "%s.%s has no help", vn, o.name);
            const char *now = val(fresh, NULL, o.name);
            char *end;
            if (o.type == ATTN_OPT_CHOICE) {
                cr_assert_gt(o.n_choices, 0, "%s.%s has no choices", vn, o.name);
                cr_assert_str_eq(now, o.def, "%s.%s: default shown %s, a new object holds %s", vn, o.name, o.def, now);
                for (int c = 0; c < o.n_choices; c++) {
                    const char *ch = attn_variant_option_choice(i, j, c);
                    cr_assert_not_null(ch);
                    cr_assert(strstr(o.help, ch) != NULL, "%s.%s help '%s' does not name %s", vn, o.name, o.help, ch);
                    char setting[128];
                    snprintf(setting, sizeof setting, "%s=%s", o.name, ch);
                    const char *set[1] = {setting};
                    if (strcmp(o.name, "precision") == 0 && strcmp(ch, "fp32") != 0) {
                        /* the CPU computes in fp32 only: refused there, by name */
                        attn_options oc = {vn, AB_DEV_CPU, 1, 1, set};
                        attn *r = NULL;
                        cr_assert_eq(attn_create(&oc, &r), ATTN_EINVAL, "%s %s on the CPU not refused", vn, setting);
                        cr_assert_null(r);
                        cr_assert(strstr(attn_error(), "CPU") && strstr(attn_error(), ch), "%s", attn_error());
                        continue;
                    }
                    attn *a = make(vn, 1, set);
                    cr_assert_str_eq(val(a, NULL, o.name), ch);
                    attn_destroy(a);
                }
                cr_assert_null(attn_variant_option_choice(i, j, o.n_choices));
                cr_assert_null(attn_variant_option_choice(i, j, -1));
            } else {
                cr_assert_null(attn_variant_option_choice(i, j, 0), "%s.%s is not a choice", vn, o.name);
                cr_assert_leq(o.min, o.max, "%s.%s", vn, o.name);
                double d = strtod(o.def, &end);
                if (*o.def && *end == '\0') {
                    /* A numeric default, shown by the object with %.9g (int: %d): equal to
                     * 9 significant digits, relative rounding below 5e-9. */
                    cr_assert(fabs(strtod(now, NULL) - d) <= 5e-9 * fabs(d), "%s.%s default %s, holds %s", vn,
                              o.name, o.def, now);
                    cr_assert(d >= o.min && d <= o.max, "%s.%s default %s outside [%g, %g]", vn, o.name, o.def,
                              o.min, o.max);
                } else {
                    /* A default resolved per shape (1/sqrt(D), auto): shown as such. */
                    cr_assert(o.auto_ok, "%s.%s: default '%s' is not a number and auto is refused", vn, o.name,
                              o.def);
                    cr_assert_str_eq(now, o.def, "%s.%s", vn, o.name);
                }
                cr_assert_eq(try_number(vn, o.name, o.min), 0, "%s.%s = min %g: %s", vn, o.name, o.min,
                             attn_error());
                cr_assert_eq(try_number(vn, o.name, o.max), 0, "%s.%s = max %g: %s", vn, o.name, o.max,
                             attn_error());
                if (o.type == ATTN_OPT_INT) {
                    cr_assert_lt(try_number(vn, o.name, o.min - 1), 0, "%s.%s below its range", vn, o.name);
                    cr_assert_lt(try_number(vn, o.name, o.max + 1), 0, "%s.%s above its range", vn, o.name);
                } else {
                    /* One millionth past each end (of the end's size, or of 1 near 0); the
                     * full double range has no finite value past it. */
                    if (o.min > -DBL_MAX)
                        cr_assert_lt(try_number(vn, o.name, o.min - fmax(fabs(o.min), 1.0) * 1e-6), 0,
                                     "%s.%s below its range", vn, o.name);
                    if (o.max < DBL_MAX)
                        cr_assert_lt(try_number(vn, o.name, o.max + fmax(fabs(o.max), 1.0) * 1e-6), 0,
                                     "%s.%s above its range", vn, o.name);
                }
            }
            int rc = try_setting(vn, o.name, "auto");
            if (o.auto_ok) cr_assert_eq(rc, 0, "%s.%s=auto: %s", vn, o.name, attn_error());
            else cr_assert_lt(rc, 0, "%s.%s=auto accepted", vn, o.name);
        }
        attn_destroy(fresh);
    }
}

/* ---- FLOP counts ---- */

static double flops_of(const char *variant, const char *setting, attn_shape s, bool backward) {
    const char *set[1] = {setting};
    attn *a = make(variant, setting ? 1 : 0, set);
    double f = attn_flops(a, &s, backward);
    attn_destroy(a);
    return f;
}

/* Counted by hand at B = 2, H = 3 (6 slices), N = 10, D = 4, M = 6. Every count is an
 * integer far below 2^53, exact in double: compared with ==. */
Test(registry, flops_known_shapes) {
    const attn_shape nc = shape(2, 3, 10, 4, 6, false, NULL), ca = shape(2, 3, 10, 4, 6, true, NULL);
    /* softmax, stateful-softmax: 2 (D + M) per (query, key) pair and slice, over N^2
     * pairs, N (N + 1) / 2 when causal; forward + backward 3 times the forward:
     *   2 * 100 * 10 * 6 = 12000, causal 2 * 55 * 10 * 6 = 6600; 36000, 19800. */
    static const char *const quad[] = {"softmax", "stateful-softmax"};
    for (int v = 0; v < 2; v++) {
        cr_assert_eq(flops_of(quad[v], NULL, nc, false), 12000.0, "%s", quad[v]);
        cr_assert_eq(flops_of(quad[v], NULL, ca, false), 6600.0, "%s", quad[v]);
        cr_assert_eq(flops_of(quad[v], NULL, nc, true), 36000.0, "%s", quad[v]);
        cr_assert_eq(flops_of(quad[v], NULL, ca, true), 19800.0, "%s", quad[v]);
    }
    /* linear and polynomial, scan form: 4 N C (M + 1) per slice, C the feature count,
     * causal or not; forward + backward 3 times the forward:
     *   elu C = D = 4:                4 * 10 * 4 * 7 * 6 = 6720, 20160;
     *   taylor C = 1 + D = 5:         4 * 10 * 5 * 7 * 6 = 8400, 25200;
     *   polynomial C = 1 + D + D^2 = 21: 4 * 10 * 21 * 7 * 6 = 35280, 105840. */
    cr_assert_eq(flops_of("linear", NULL, nc, false), 6720.0);
    cr_assert_eq(flops_of("linear", "feature_map=elu", ca, false), 6720.0);
    cr_assert_eq(flops_of("linear", NULL, ca, true), 20160.0);
    cr_assert_eq(flops_of("linear", "feature_map=taylor", nc, false), 8400.0);
    cr_assert_eq(flops_of("linear", "feature_map=taylor", ca, true), 25200.0);
    cr_assert_eq(flops_of("polynomial", NULL, nc, false), 35280.0);
    cr_assert_eq(flops_of("polynomial", "c=0.5", ca, true), 105840.0);
    /* The chunk length changes the order of the sums, not the count. */
    cr_assert_eq(flops_of("linear", "chunk=3", ca, false), 6720.0);
    /* favor: the scan form with C = features (default 2 D = 8):
     *   4 * 10 * 8 * 7 * 6 = 13440, features=5: 8400; the W x products are not counted. */
    cr_assert_eq(flops_of("linear", "feature_map=favor", nc, false), 13440.0);
    cr_assert_eq(flops_of("linear", "feature_map=favor", ca, true), 3 * 13440.0);
    const char *fav5[] = {"feature_map=favor", "features=5"};
    attn *f5 = make("linear", 2, fav5);
    cr_assert_eq(attn_flops(f5, &nc, false), 8400.0);
    attn_destroy(f5);
    /* efficient: C = K'^T V and Q' C, 2 N D M each: 4 * 10 * 4 * 6 * 6 = 5760; 17280. */
    cr_assert_eq(flops_of("efficient", NULL, nc, false), 5760.0);
    cr_assert_eq(flops_of("efficient", NULL, nc, true), 17280.0);
    /* local, window 3: causal pairs sum_i min(i + 1, 3) = 1 + 2 + 8 * 3 = 27, non-causal
     * sum_i #{j : |i - j| < 3} = 3 + 4 + 6 * 5 + 4 + 3 = 44; 2 (D + M) = 20 per pair and
     * slice: 3240 and 5280; with a window >= N the softmax counts (6600, 12000). */
    cr_assert_eq(flops_of("local", "window=3", ca, false), 3240.0);
    cr_assert_eq(flops_of("local", "window=3", nc, false), 5280.0);
    cr_assert_eq(flops_of("local", "window=3", ca, true), 3 * 3240.0);
    cr_assert_eq(flops_of("local", "window=10", ca, false), 6600.0);
    cr_assert_eq(flops_of("local", NULL, nc, false), 12000.0);
    /* linformer, k = 3: E K, F V, Q Kp^T, A Vp, 2 N k D or 2 N k M each: per slice
     * 2 * 10 * 3 * (2 * 4 + 2 * 6) = 1200, times B H = 6: 7200; backward twice that. */
    cr_assert_eq(flops_of("linformer", "k=3", nc, false), 7200.0);
    cr_assert_eq(flops_of("linformer", "k=3", nc, true), 21600.0);
    /* lsh: not counted. */
    cr_assert(isnan(flops_of("lsh", NULL, nc, false)));
    cr_assert(isnan(flops_of("lsh", NULL, ca, true)));
    /* Counted at the full length: lengths do not change it. */
    int lengths[2] = {3, 0};
    attn_shape withlen = nc;
    withlen.lengths = lengths;
    cr_assert_eq(flops_of("softmax", NULL, withlen, false), 12000.0);
}

/* Every variant: a count that is NAN or positive, forward + backward at least the
 * forward; NAN with a message for a rejected shape or NULL arguments. */
Test(registry, flops_every_variant) {
    for (int i = 0; i < attn_variant_count(); i++) {
        const char *name = attn_variant_name(i);
        attn *a = make(name, 0, NULL);
        attn_shape s = shape(2, 2, 33, 5, 3, attn_variant_has_causal(i), NULL);
        double f = attn_flops(a, &s, false), fb = attn_flops(a, &s, true);
        cr_assert(isnan(f) == isnan(fb), "%s", name);
        if (!isnan(f)) {
            cr_assert(f > 0 && isfinite(f), "%s: %g", name, f);
            cr_assert_geq(fb, f, "%s", name);
        }
        attn_shape bad = s;
        bad.len = 0;
        ab_clear_error();
        cr_assert(isnan(attn_flops(a, &bad, false)), "%s counts a rejected shape", name);
        cr_assert(strstr(attn_error(), "N=0") != NULL, "%s: '%s'", name, attn_error());
        cr_assert(isnan(attn_flops(a, NULL, false)));
        attn_destroy(a);
    }
    attn_shape s = shape(1, 1, 1, 1, 1, false, NULL);
    cr_assert(isnan(attn_flops(NULL, &s, true)));
}

/* ---- the feature maps' table ---- */

Test(feature_maps, table_sizes_and_listing) {
    /* Feature counts C for input size D, as the entries' formulas say: elu D, taylor
     * 1 + D, poly 1 + D + D^2. */
    static const int Ds[] = {1, 2, 7, 64};
    for (size_t t = 0; t < sizeof Ds / sizeof Ds[0]; t++) {
        size_t D = (size_t)Ds[t];
        cr_assert_eq(fm_dim(FM_ELU, Ds[t]), D);
        cr_assert_eq(fm_dim(FM_TAYLOR, Ds[t]), 1 + D);
        cr_assert_eq(fm_dim(FM_POLY, Ds[t]), 1 + D + D * D);
        fm_spec f;
        fm_init(&f, FM_TAYLOR, Ds[t], 0.0, 1.0);
        cr_assert_eq(f.C, (int)(1 + D));
        cr_assert_eq(f.map, &fm_maps[FM_TAYLOR]);
    }
    cr_assert_str_eq(fm_maps[FM_ELU].name, "elu");
    cr_assert_str_eq(fm_maps[FM_ELU].features, "D");
    cr_assert_str_eq(fm_maps[FM_TAYLOR].name, "taylor");
    cr_assert_str_eq(fm_maps[FM_TAYLOR].features, "1 + D");
    cr_assert_str_eq(fm_maps[FM_POLY].name, "poly");
    cr_assert_str_eq(fm_maps[FM_POLY].features, "1 + D + D^2");
    cr_assert_eq(fm_dim(FM_POLY, 64), 4161u);

    /* Every entry: a unique name that finds it, a formula and a help, its functions,
     * a size of at least D; CUDA kernels for the known maps exactly when the build has
     * CUDA. The public listing (attnbench list) is the table. */
    cr_assert_eq(attn_feature_map_count(), fm_n_maps);
    for (int i = 0; i < fm_n_maps; i++) {
        const fm_map *m = &fm_maps[i];
        cr_assert(m->name && m->name[0] && m->features && m->features[0] && m->help && m->help[0], "entry %d", i);
        cr_assert_eq(fm_find(m->name), i, "%s", m->name);
        cr_assert(m->dim && m->forward && m->backward, "%s", m->name);
        cr_assert_geq(m->dim(5, NULL), 5u, "%s", m->name);
        const char *name, *features, *help;
        cr_assert(attn_feature_map_info(i, &name, &features, &help));
        cr_assert_str_eq(name, m->name);
        cr_assert_str_eq(features, m->features);
        cr_assert_str_eq(help, m->help);
    }
    for (int k = FM_ELU; k <= FM_POLY; k++) cr_assert_eq(fm_maps[k].cuda != NULL, ab_cuda_built(), "%s", fm_maps[k].name);
    cr_assert_not(attn_feature_map_info(fm_n_maps, NULL, NULL, NULL));
    cr_assert_not(attn_feature_map_info(-1, NULL, NULL, NULL));
    cr_assert_eq(fm_find("nosuch"), -1);
    cr_assert_eq(fm_find(NULL), -1);

    /* linear's feature_map choices are the entries marked for it, in table order (elu
     * and taylor first; not polynomial's exact map), and its help names each as
     * "NAME (what it is)". */
    int li = attn_variant_find("linear"), oj = -1;
    attn_option_info o;
    for (int j = 0; attn_variant_option_info(li, j, &o); j++)
        if (strcmp(o.name, "feature_map") == 0) oj = j;
    cr_assert_geq(oj, 0);
    attn_variant_option_info(li, oj, &o);
    int c = 0;
    for (int i = 0; i < fm_n_maps; i++) {
        if (!fm_maps[i].linear_choice) continue;
        cr_assert_eq(fm_linear_choice(c), &fm_maps[i]);
        cr_assert_str_eq(attn_variant_option_choice(li, oj, c), fm_maps[i].name);
        char item[256];
        snprintf(item, sizeof item, "%s (%s)", fm_maps[i].name, fm_maps[i].help);
        cr_assert(strstr(o.help, item) != NULL, "help '%s' lacks '%s'", o.help, item);
        c++;
    }
    cr_assert_eq(o.n_choices, c);
    cr_assert_null(fm_linear_choice(c));
    cr_assert_str_eq(attn_variant_option_choice(li, oj, 0), "elu");
    cr_assert_str_eq(attn_variant_option_choice(li, oj, 1), "taylor");
    cr_assert_not(fm_maps[FM_POLY].linear_choice);
    cr_assert(strncmp(o.help, "elu (elu(x)+1)", 14) == 0, "%s", o.help);
}
