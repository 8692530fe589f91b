/* The registry: variant names, options and defaults, option parsing and its errors,
 * shape checks, recurrent-mode misuse, workspace reuse, FLOP counts and the feature
 * maps' table. Properties every variant must have are checked by iterating the
 * registry (a new variant is checked without editing this file); the known variants'
 * specifics by name. */
#include "test_registry.h"

/* The variants these tests know by name, whether each has a recurrent step
 * (stateful-softmax's key/value cache, the two linear variants and local's ring are
 * RNNs; softmax, lsh, efficient and linformer are not) and whether it takes causal
 * shapes (all but efficient and linformer). The registry may hold more. */
static const struct {
    const char *name;
    bool step, causal;
} KNOWN[] = {
    {"softmax", false, true}, {"stateful-softmax", true, true}, {"linear", true, true}, {"polynomial", true, true},
    {"lsh", false, true},     {"efficient", false, false},      {"local", true, true},
    {"linformer", false, false},
    {"retention", true, true},
    {"sparse", true, true},
    {"gla", true, true},
    {"deltanet", true, true},
};
#define N_KNOWN ((int)(sizeof KNOWN / sizeof KNOWN[0]))


/* ---- helpers ---- */

/* attn_option_value that must succeed. */
const char *val(const attn *a, const attn_shape *s, const char *key) {
    static char buf[64];
    const char *r = attn_option_value(a, s, key, buf, sizeof buf);
    cr_assert_not_null(r, "%s has no option %s", attn_name(a), key);
    return r;
}

/* The longest sequence of these tests: a variant with parameters of its own
 * (linformer) gets them for it from make(), zeros with no gradient (host memory that
 * the tracked allocator does not count, kept for the process). */
#define MAX_LEN 64

/* A variant with an input of its own (gla's log-gate g, deltanet's rate beta) gets one
 * from make(): AUX_FLOATS floats of one value inside its range (g = -0.1: a decay of
 * 0.905 a step; beta = 0.5), no gradient; enough for every shape of these suites
 * (B H N W <= 2^22), whose generic checks (shapes, workspace, errors) do not depend on
 * the values. */
#define AUX_FLOATS ((size_t)1 << 22)

static void bind_aux(attn *a) {
    static float *gate, *rate;
    const char *name = attn_aux_name(a);
    if (!name) return;
    const bool is_g = strcmp(name, "g") == 0;
    cr_assert(is_g || strcmp(name, "beta") == 0, "make(): no test value for the input %s", name);
    float **pool = is_g ? &gate : &rate;
    if (!*pool) {
        *pool = malloc(AUX_FLOATS * sizeof(float));
        cr_assert_not_null(*pool);
        for (size_t i = 0; i < AUX_FLOATS; i++) (*pool)[i] = is_g ? -0.1f : 0.5f;
    }
    cr_assert_eq(attn_bind_aux(a, *pool, NULL), 0, "%s", attn_error());
}

attn *make(const char *variant, int n, const char *const *settings) {
    static float *pool;
    static size_t pool_n;
    attn_options o = {variant, AB_DEV_CPU, 1, n, settings};
    attn *a = NULL;
    int rc = attn_create(&o, &a);
    cr_assert_eq(rc, 0, "attn_create(%s): %s", variant, attn_error());
    cr_assert_not_null(a);
    size_t np;
    cr_assert_eq(attn_param_count(a, MAX_LEN, &np), 0, "%s", attn_error());
    if (np > 0) {
        if (np > pool_n) {
            free(pool);
            pool = calloc(np, sizeof(float));
            pool_n = np;
            cr_assert_not_null(pool);
        }
        cr_assert_eq(attn_bind_params(a, MAX_LEN, pool, NULL), 0, "%s", attn_error());
    }
    bind_aux(a);
    return a;
}

/* attn_create must fail with `code`, leave *out NULL, and give a one-line message
 * that contains every string of `must` (NULL-terminated). */
static void expect_create_fails(const char *variant, const char *setting, int code, const char *const *must) {
    const char *settings[1] = {setting};
    attn_options o = {variant, AB_DEV_CPU, 1, setting ? 1 : 0, settings};
    attn *a = (attn *)&o; /* must be reset to NULL */
    ab_clear_error();
    int rc = attn_create(&o, &a);
    cr_assert_eq(rc, code, "attn_create(%s, %s) returned %d, want %d (%s)", variant, setting ? setting : "-", rc,
                 code, attn_error());
    cr_assert_null(a, "attn_create leaves *out NULL on failure");
    const char *msg = attn_error();
    cr_assert_neq(msg[0], '\0', "no message");
    cr_assert_null(strchr(msg, '\n'), "message is not one line: %s", msg);
    for (int i = 0; must && must[i]; i++)
        cr_assert(strstr(msg, must[i]) != NULL, "attn_create(%s, %s): message '%s' lacks '%s'", variant,
                  setting ? setting : "-", msg, must[i]);
    /* the registry's check without an object says the same */
    char want[512];
    snprintf(want, sizeof want, "%s", msg);
    ab_clear_error();
    cr_assert_eq(attn_variant_check(&o), code, "attn_variant_check(%s, %s)", variant, setting ? setting : "-");
    cr_assert_str_eq(attn_error(), want);
}

attn_shape shape(int B, int H, int N, int D, int M, bool causal, const int *lengths) {
    attn_shape s = {B, H, N, D, M, causal, lengths};
    return s;
}

bool causal_only(int i) {
    attn *a = make(attn_variant_name(i), 0, NULL);
    ab_clear_error();
    const int rc = attn_check_shape(a, &(attn_shape){1, 1, 4, 4, 4, false, NULL});
    const bool only = rc == ATTN_EUNSUPPORTED && strstr(attn_error(), "causal only") != NULL;
    attn_destroy(a);
    return only;
}

/* The shape check must fail with a one-line message containing `must`. */
static void expect_shape_bad(const attn *a, attn_shape s, const char *must) {
    ab_clear_error();
    int rc = attn_check_shape(a, &s);
    cr_assert_lt(rc, 0, "shape B=%d H=%d N=%d D=%d M=%d accepted", s.batch, s.heads, s.len, s.qk_dim, s.v_dim);
    const char *msg = attn_error();
    cr_assert(strstr(msg, must) != NULL, "message '%s' lacks '%s'", msg, must);
    cr_assert_null(strchr(msg, '\n'));
    cr_assert_eq(attn_saved_bytes(a, &s), 0u, "saved bytes of a rejected shape");
}

/* ---- names and modes ---- */

Test(registry, names_and_modes) {
    const int n = attn_variant_count();
    cr_assert_geq(n, N_KNOWN);
    /* Every registered variant: a unique non-empty name that finds it, a summary, and
     * the same recurrent mode as an object created from it. */
    for (int i = 0; i < attn_variant_count(); i++) {
        const char *name = attn_variant_name(i);
        cr_assert_not_null(name);
        cr_assert_neq(name[0], '\0');
        cr_assert_eq(attn_variant_find(name), i, "%s is found at another index", name);
        cr_assert_not_null(attn_variant_summary(i));
        cr_assert_neq(attn_variant_summary(i)[0], '\0', "%s has no summary", name);
        attn *a = make(name, 0, NULL);
        cr_assert_str_eq(attn_name(a), name);
        cr_assert_eq(attn_has_step(a), attn_variant_has_step(i), "has_step(%s)", name);
        attn_destroy(a);
    }
    /* The known variants are there, with the modes they are known for. */
    for (int v = 0; v < N_KNOWN; v++) {
        int i = attn_variant_find(KNOWN[v].name);
        cr_assert_geq(i, 0, "variant %s is missing", KNOWN[v].name);
        cr_assert_str_eq(attn_variant_name(i), KNOWN[v].name);
        cr_assert_eq(attn_variant_has_step(i), KNOWN[v].step, "has_step(%s)", KNOWN[v].name);
        cr_assert_eq(attn_variant_has_causal(i), KNOWN[v].causal, "has_causal(%s)", KNOWN[v].name);
    }
    cr_assert_not(attn_variant_has_causal(-1));
    cr_assert_not(attn_variant_has_causal(n));
    cr_assert_eq(attn_variant_find("nosuch"), -1);
    cr_assert_eq(attn_variant_find(NULL), -1);
    cr_assert_eq(attn_variant_find("Softmax"), -1, "names are case-sensitive");
    cr_assert_null(attn_variant_name(-1));
    cr_assert_null(attn_variant_name(n));
    cr_assert_not(attn_variant_has_step(n));
    cr_assert_not(attn_variant_option(n, 0, NULL, NULL, NULL));
    cr_assert_not(attn_variant_option(0, -1, NULL, NULL, NULL));
    attn_option_info info;
    cr_assert_not(attn_variant_option_info(n, 0, &info));
    cr_assert_not(attn_variant_option_info(0, -1, &info));
    cr_assert_null(attn_variant_option_choice(n, 0, 0));
    attn_destroy(NULL); /* allowed */
}

/* ---- options and defaults ---- */

typedef struct {
    const char *variant, *name, *def;
    bool numeric;     /* compare defaults as numbers */
    const char *help; /* a word the help must contain (allowed values), or NULL */
} opt_expect;

static const opt_expect OPTIONS[] = {
    {"softmax", "scale", "1/sqrt(D)", false, NULL},
    {"stateful-softmax", "scale", "1/sqrt(D)", false, NULL},
    {"linear", "feature_map", "elu", false, "taylor"},
    {"linear", "eps", "1e-6", true, NULL},
    {"linear", "chunk", "auto", false, NULL},
    {"polynomial", "c", "1", true, NULL},
    {"polynomial", "scale", "1/sqrt(D)", false, NULL},
    {"polynomial", "eps", "1e-6", true, NULL},
    {"polynomial", "chunk", "auto", false, NULL},
    {"lsh", "rounds", "1", true, NULL},
    {"lsh", "bits", "8", true, NULL},
    {"lsh", "chunk", "32", true, NULL},
    {"lsh", "combine", "mean", false, "logsumexp"},
    {"lsh", "scale", "1/sqrt(D)", false, NULL},
    {"linear", "features", "auto", false, "favor"},
    {"local", "window", "256", true, NULL},
    {"local", "scale", "1/sqrt(D)", false, NULL},
    {"linformer", "k", "256", true, NULL},
    {"linformer", "share", "none", false, "layer"},
    {"linformer", "scale", "1/sqrt(D)", false, NULL},
};

/* Defaults written as "1/sqrt(D)" may be spelt with spaces or another case. */
static bool same_text_loosely(const char *got, const char *want) {
    for (;;) {
        while (*got == ' ') got++;
        while (*want == ' ') want++;
        if (!*got || !*want) return *got == *want;
        if ((*got | 32) != (*want | 32)) return false;
        got++;
        want++;
    }
}

Test(registry, options_and_defaults) {
    for (size_t e = 0; e < sizeof OPTIONS / sizeof OPTIONS[0]; e++) {
        const opt_expect *x = &OPTIONS[e];
        int i = attn_variant_find(x->variant);
        cr_assert_geq(i, 0);
        bool found = false;
        const char *name, *def, *help;
        for (int j = 0; attn_variant_option(i, j, &name, &def, &help); j++) {
            cr_assert_not_null(name);
            if (strcmp(name, x->name) != 0) continue;
            found = true;
            cr_assert_not_null(def);
            cr_assert_not_null(help);
            cr_assert_neq(help[0], '\0', "%s.%s has no help", x->variant, x->name);
            if (x->numeric) {
                char *end;
                double got = strtod(def, &end);
                cr_assert(*def && *end == '\0', "%s.%s default '%s' is not a number", x->variant, x->name, def);
                /* Defaults are short decimal literals: equal up to the last bit of parsing. */
                cr_assert(fabs(got - strtod(x->def, NULL)) <= 1e-12 * fabs(got), "%s.%s default %s, want %s",
                          x->variant, x->name, def, x->def);
            } else {
                cr_assert(same_text_loosely(def, x->def), "%s.%s default '%s', want '%s'", x->variant, x->name, def,
                          x->def);
            }
            if (x->help) cr_assert(strstr(help, x->help) != NULL, "%s.%s help '%s' does not list '%s'", x->variant,
                                   x->name, help, x->help);
        }
        cr_assert(found, "variant %s has no option %s", x->variant, x->name);
    }
}

Test(registry, every_documented_value_accepted) {
    static const struct {
        const char *variant, *setting;
    } ok[] = {
        {"softmax", "scale=0.125"},        {"stateful-softmax", "scale=2"},  {"linear", "feature_map=elu"},
        {"linear", "feature_map=taylor"}, {"linear", "eps=1e-3"},
        {"linear", "chunk=auto"},         {"linear", "chunk=16"},           {"polynomial", "c=0.5"},
        {"polynomial", "scale=0.2"},      {"polynomial", "chunk=auto"},     {"polynomial", "eps=1e-6"},
        {"lsh", "rounds=4"},              {"lsh", "bits=4"},                {"lsh", "chunk=29"},
        {"lsh", "combine=mean"},          {"lsh", "combine=logsumexp"},     {"lsh", "scale=0.5"},
        {"linear", "feature_map=favor"},  {"linear", "features=7"},         {"linear", "features=auto"},
        {"local", "window=1"},            {"local", "window=4096"},         {"local", "scale=-0.5"},
        {"linformer", "k=1"},             {"linformer", "share=kv"},        {"linformer", "share=layer"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        const char *s[1] = {ok[i].setting};
        attn_options o = {ok[i].variant, AB_DEV_CPU, 0, 1, s};
        attn *a = NULL;
        int rc = attn_create(&o, &a);
        cr_assert_eq(rc, 0, "%s %s: %s", ok[i].variant, ok[i].setting, attn_error());
        attn_destroy(a);
    }
    /* Several settings at once; a later one wins. */
    const char *many[] = {"feature_map=taylor", "eps=0.01", "chunk=8", "eps=0.02"};
    attn *a = make("linear", 4, many);
    cr_assert_str_eq(val(a, NULL, "feature_map"), "taylor");
    cr_assert_eq(strtod(val(a, NULL, "eps"), NULL), 0.02);
    cr_assert_eq(strtol(val(a, NULL, "chunk"), NULL, 10), 8);
    attn_destroy(a);
}

/* ---- attn_create errors ---- */

Test(registry, create_errors) {
    /* Unknown variant: the message names it and lists every registered one. */
    {
        const char *must[32] = {"nosuch"};
        cr_assert_lt(attn_variant_count(), 31);
        for (int i = 0; i < attn_variant_count(); i++) must[1 + i] = attn_variant_name(i);
        expect_create_fails("nosuch", NULL, ATTN_EINVAL, must);
    }
    /* Unknown option: named, for every variant. */
    for (int i = 0; i < attn_variant_count(); i++) {
        const char *name = attn_variant_name(i);
        const char *must[] = {"frobnicate", NULL};
        expect_create_fails(name, "frobnicate=1", ATTN_EINVAL, must);
    }
    /* An option of another variant is unknown here. */
    {
        const char *must[] = {"rounds", NULL};
        expect_create_fails("linear", "rounds=2", ATTN_EINVAL, must);
    }
    /* Malformed settings (no '=', empty key). */
    {
        const char *must[] = {"scale", NULL};
        expect_create_fails("softmax", "scale", ATTN_EINVAL, must);
        const char *must2[] = {"=1", NULL};
        expect_create_fails("softmax", "=1", ATTN_EINVAL, must2);
    }
    /* Non-numeric values. */
    static const struct {
        const char *variant, *setting, *name;
    } bad_value[] = {
        {"softmax", "scale=abc", "scale"},    {"softmax", "scale=", "scale"},       {"softmax", "scale=nan", "scale"},
        {"softmax", "scale=inf", "scale"},    {"linear", "eps=1e-6x", "eps"},       {"lsh", "rounds=two", "rounds"},
        {"lsh", "rounds=1.5", "rounds"},      {"lsh", "bits=", "bits"},             {"polynomial", "c=one", "c"},
        {"linear", "chunk=fast", "chunk"},
    };
    for (size_t i = 0; i < sizeof bad_value / sizeof bad_value[0]; i++) {
        const char *must[] = {bad_value[i].name, NULL};
        expect_create_fails(bad_value[i].variant, bad_value[i].setting, ATTN_EINVAL, must);
    }
    /* Out of range: zero hashing rounds or rotations, a negative epsilon or chunk. */
    static const struct {
        const char *variant, *setting, *name;
    } out_of_range[] = {
        {"lsh", "rounds=0", "rounds"},  {"lsh", "bits=0", "bits"},         {"lsh", "chunk=-1", "chunk"},
        {"linear", "eps=-1", "eps"},    {"polynomial", "eps=-1e-3", "eps"}, {"linear", "chunk=-4", "chunk"},
        {"lsh", "rounds=99999999999", "rounds"},
        {"local", "window=0", "window"}, {"linear", "features=0", "features"}, {"linear", "features=65537", "features"},
        {"linformer", "k=0", "k"},       {"linformer", "k=1048577", "k"},
    };
    for (size_t i = 0; i < sizeof out_of_range / sizeof out_of_range[0]; i++) {
        const char *must[] = {out_of_range[i].name, NULL};
        expect_create_fails(out_of_range[i].variant, out_of_range[i].setting, ATTN_EINVAL, must);
    }
    /* Unknown choice: the message names the value and the allowed ones. */
    {
        const char *must[] = {"relu", "elu", "taylor", NULL};
        expect_create_fails("linear", "feature_map=relu", ATTN_EINVAL, must);
        const char *must2[] = {"max", "mean", "logsumexp", NULL};
        expect_create_fails("lsh", "combine=max", ATTN_EINVAL, must2);
    }
    /* NULL arguments and a bad settings list. */
    attn *a = NULL;
    cr_assert_eq(attn_create(NULL, &a), ATTN_EINVAL);
    attn_options o = {"softmax", AB_DEV_CPU, 0, 0, NULL};
    cr_assert_eq(attn_create(&o, NULL), ATTN_EINVAL);
    o.n_settings = 2; /* but no list */
    cr_assert_eq(attn_create(&o, &a), ATTN_EINVAL);
    o.n_settings = -1;
    cr_assert_eq(attn_create(&o, &a), ATTN_EINVAL);
    o.n_settings = 0;
    o.device = 7; /* outside the enum */
    cr_assert_eq(attn_create(&o, &a), ATTN_EINVAL);
}

Test(registry, check_without_objects) {
    /* attn_variant_check accepts what attn_create accepts, and attn_variant_params
     * answers what the object's attn_param_count and attn_params_shared_by_layers do. */
    static const struct {
        const char *variant, *setting;
    } ok[] = {{"softmax", NULL}, {"linformer", NULL}, {"linformer", "k=8"}, {"linformer", "share=kv"},
              {"linformer", "share=layer"}, {"lsh", "rounds=2"}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        const char *settings[1] = {ok[i].setting};
        attn_options o = {ok[i].variant, AB_DEV_CPU, 3, ok[i].setting ? 1 : 0, settings};
        cr_assert_eq(attn_variant_check(&o), 0, "%s %s: %s", ok[i].variant, ok[i].setting, attn_error());
        attn *a;
        cr_assert_eq(attn_create(&o, &a), 0, "%s", attn_error());
        size_t want, got;
        bool shared;
        cr_assert_eq(attn_param_count(a, 64, &want), 0, "%s", attn_error());
        cr_assert_eq(attn_variant_params(&o, 64, &got, &shared), 0, "%s", attn_error());
        cr_assert_eq(got, want, "%s %s: %zu parameters, the object has %zu", ok[i].variant, ok[i].setting, got, want);
        cr_assert_eq(shared, attn_params_shared_by_layers(a));
        attn_destroy(a);
    }
    attn_options o = {"softmax", 7, 0, 0, NULL}; /* a device outside the enum */
    cr_assert_eq(attn_variant_check(&o), ATTN_EINVAL);
    cr_assert_eq(attn_variant_check(NULL), ATTN_EINVAL);
}

Test(registry, devices_of_variants) {
    /* Every variant runs on the CPU; on CUDA only where the build has its backend (none
     * in a build without CUDA); bad indices and devices are false. */
    for (int i = 0; i < attn_variant_count(); i++) {
        const char *name = attn_variant_name(i);
        cr_assert(attn_variant_has_device(i, AB_DEV_CPU), "%s on cpu", name);
        if (!ab_cuda_built()) cr_assert_not(attn_variant_has_device(i, AB_DEV_CUDA), "%s on cuda", name);
        cr_assert_not(attn_variant_has_device(i, 7));
    }
    cr_assert_not(attn_variant_has_device(-1, AB_DEV_CPU));
    cr_assert_not(attn_variant_has_device(attn_variant_count(), AB_DEV_CPU));
}

Test(registry, cuda_without_backend) {
    /* Without CUDA in the build or without a device: ATTN_EDEVICE for every variant;
     * with a device: ATTN_EUNSUPPORTED for variants that have no CUDA implementation. */
    for (int i = 0; i < attn_variant_count(); i++) {
        const char *name = attn_variant_name(i);
        attn_options o = {name, AB_DEV_CUDA, 0, 0, NULL};
        attn *a = NULL;
        ab_clear_error();
        int rc = attn_create(&o, &a);
        if (rc == 0) { /* this build and machine run the variant's CUDA backend */
            cr_assert_not_null(a);
            attn_destroy(a);
            continue;
        }
        cr_assert(rc == ATTN_EDEVICE || rc == ATTN_EUNSUPPORTED, "%s on cuda: %d (%s)", name, rc, attn_error());
        cr_assert_null(a);
        cr_assert(strstr(attn_error(), "CUDA") != NULL, "message '%s' does not mention CUDA", attn_error());
    }
}

/* ---- option values ---- */


Test(registry, option_values) {
    char buf[64];
    attn *a = make("softmax", 0, NULL);
    attn_shape s16 = shape(1, 1, 4, 16, 3, false, NULL), s5 = shape(1, 1, 4, 5, 3, false, NULL);
    /* scale resolves to 1/sqrt(D) for a shape; %.9g text keeps float precision. */
    cr_assert(fabs(strtod(val(a, &s16, "scale"), NULL) - 0.25) < 1e-9);
    cr_assert(fabs(strtod(val(a, &s5, "scale"), NULL) - 1 / sqrt(5.0)) < 1e-8, "%s",
              buf);
    /* Without a shape, the default as text. */
    cr_assert(same_text_loosely(val(a, NULL, "scale"), "1/sqrt(D)"), "%s", buf);
    cr_assert_null(attn_option_value(a, NULL, "nosuch", buf, sizeof buf));
    cr_assert_null(attn_option_value(a, NULL, "eps", buf, sizeof buf), "softmax has no eps");
    attn_destroy(a);

    const char *set[] = {"scale=0.125"};
    a = make("softmax", 1, set);
    cr_assert_eq(strtod(val(a, &s16, "scale"), NULL), 0.125, "explicit scale wins");
    cr_assert_eq(strtod(val(a, NULL, "scale"), NULL), 0.125);
    attn_destroy(a);

    a = make("linear", 0, NULL);
    cr_assert_str_eq(val(a, &s16, "feature_map"), "elu");
    cr_assert_eq(strtod(val(a, &s16, "eps"), NULL), 1e-6);
    cr_assert_str_eq(val(a, NULL, "chunk"), "auto");
    attn_destroy(a);

    const char *lset[] = {"rounds=3", "bits=5", "chunk=29", "combine=logsumexp", "scale=0.3"};
    a = make("lsh", 5, lset);
    cr_assert_str_eq(val(a, NULL, "rounds"), "3");
    cr_assert_str_eq(val(a, NULL, "bits"), "5");
    cr_assert_str_eq(val(a, NULL, "chunk"), "29");
    cr_assert_str_eq(val(a, NULL, "combine"), "logsumexp");
    cr_assert_eq(strtod(val(a, &s5, "scale"), NULL), 0.3);
    attn_destroy(a);

    a = make("lsh", 0, NULL);
    cr_assert_str_eq(val(a, NULL, "rounds"), "1");
    cr_assert_str_eq(val(a, NULL, "bits"), "8");
    cr_assert_str_eq(val(a, NULL, "chunk"), "32");
    cr_assert_str_eq(val(a, NULL, "combine"), "mean");
    attn_destroy(a);

    const char *pset[] = {"c=2.5"};
    a = make("polynomial", 1, pset);
    cr_assert_eq(strtod(val(a, NULL, "c"), NULL), 2.5);
    cr_assert(fabs(strtod(val(a, &s16, "scale"), NULL) - 0.25) < 1e-9);
    attn_destroy(a);
}

/* ---- shape checks ---- */

Test(registry, check_shape) {
    for (int i = 0; i < attn_variant_count(); i++) {
        const char *name = attn_variant_name(i);
        attn *a = make(name, 0, NULL);
        /* Every size must be >= 1; the message shows the offending size. */
        expect_shape_bad(a, shape(0, 1, 4, 4, 4, false, NULL), "B=0");
        expect_shape_bad(a, shape(1, 0, 4, 4, 4, false, NULL), "H=0");
        expect_shape_bad(a, shape(1, 1, 0, 4, 4, false, NULL), "N=0");
        expect_shape_bad(a, shape(1, 1, 4, 0, 4, false, NULL), "D=0");
        expect_shape_bad(a, shape(1, 1, 4, 4, 0, false, NULL), "M=0");
        expect_shape_bad(a, shape(-2, 1, 4, 4, 4, true, NULL), "B=-2");
        expect_shape_bad(a, shape(1, -1, 4, 4, 4, true, NULL), "H=-1");
        expect_shape_bad(a, shape(1, 1, -5, 4, 4, true, NULL), "N=-5");
        expect_shape_bad(a, shape(1, 1, 4, -3, 4, true, NULL), "D=-3");
        expect_shape_bad(a, shape(1, 1, 4, 4, INT_MIN, true, NULL), "M=");
        /* Products that overflow size_t (2^31 each: 2^124 elements). */
        expect_shape_bad(a, shape(INT_MAX, INT_MAX, INT_MAX, INT_MAX, 1, false, NULL), "overflow");
        expect_shape_bad(a, shape(1 << 20, 1 << 20, 1 << 20, 1, 1 << 20, true, NULL), "overflow");
        /* Lengths outside [0, N]. */
        int bad1[2] = {4, 5}, bad2[2] = {-1, 2};
        expect_shape_bad(a, shape(2, 1, 4, 4, 4, false, bad1), "lengths");
        expect_shape_bad(a, shape(2, 1, 4, 4, 4, true, bad2), "lengths");
        cr_assert_lt(attn_check_shape(a, NULL), 0);
        cr_assert_lt(attn_check_shape(NULL, &(attn_shape){1, 1, 1, 1, 1, false, NULL}), 0);

        /* Good shapes: N = 1, odd sizes, N not a multiple of any chunk, lengths at both
         * ends of [0, N], causal and not. */
        int good_len[3] = {0, 37, 12};
        attn_shape good[] = {
            shape(1, 1, 1, 1, 1, false, NULL),  shape(1, 1, 1, 1, 1, true, NULL),
            shape(2, 3, 37, 5, 3, false, NULL), shape(2, 3, 37, 5, 3, true, NULL),
            shape(3, 2, 37, 8, 8, true, good_len), shape(3, 2, 37, 8, 8, false, good_len),
            shape(1, 4, 64, 16, 32, true, NULL),
        };
        for (size_t g = 0; g < sizeof good / sizeof good[0]; g++) {
            ab_clear_error();
            int rc = attn_check_shape(a, &good[g]);
            if (good[g].causal && !attn_variant_has_causal(i)) {
                /* A non-causal-only variant refuses every causal shape, saying why. */
                cr_assert_eq(rc, ATTN_EUNSUPPORTED, "%s: causal shape %zu: %d", name, g, rc);
                cr_assert(strstr(attn_error(), "non-causal") != NULL && strstr(attn_error(), name) != NULL,
                          "%s: '%s'", name, attn_error());
                cr_assert_eq(attn_saved_bytes(a, &good[g]), 0u);
                cr_assert(isnan(attn_flops(a, &good[g], false)));
                continue;
            }
            if (!good[g].causal && causal_only(i)) {
                /* A causal-only variant refuses every non-causal shape, saying why. */
                cr_assert_eq(rc, ATTN_EUNSUPPORTED, "%s: non-causal shape %zu: %d", name, g, rc);
                cr_assert(strstr(attn_error(), "causal only") != NULL && strstr(attn_error(), name) != NULL,
                          "%s: '%s'", name, attn_error());
                cr_assert_eq(attn_saved_bytes(a, &good[g]), 0u);
                cr_assert(isnan(attn_flops(a, &good[g], false)));
                continue;
            }
            cr_assert_eq(rc, 0, "%s: shape %zu rejected: %s", name, g, attn_error());
        }
        attn_destroy(a);
    }
}

/* ---- recurrent mode misuse ---- */

Test(recurrent, variants_without_step) {
    /* Every variant without a recurrent mode (softmax and lsh among them). */
    int n_no_step = 0;
    for (int v = 0; v < attn_variant_count(); v++) {
        if (attn_variant_has_step(v)) continue;
        n_no_step++;
        const char *name = attn_variant_name(v);
        attn *a = make(name, 0, NULL);
        attn_shape s = shape(1, 2, 1, 4, 4, true, NULL);
        cr_assert_eq(attn_state_bytes(a, &s, 8), 0u, "%s has no state", name);
        attn_state *st = NULL;
        ab_clear_error();
        cr_assert_eq(attn_state_create(a, &s, 8, &st), ATTN_EUNSUPPORTED);
        cr_assert_null(st);
        cr_assert(strstr(attn_error(), name) != NULL, "message '%s' does not name the variant", attn_error());
        /* A state of another variant cannot be stepped by this one. */
        attn *lin = make("linear", 0, NULL);
        cr_assert_eq(attn_state_create(lin, &s, 8, &st), 0, "%s", attn_error());
        float q[8] = {0}, k[8] = {0}, vv[8] = {0}, out[8];
        cr_assert_eq(attn_step(a, st, 0, q, k, vv, out), ATTN_EUNSUPPORTED);
        cr_assert_eq(attn_prefill(a, st, 1, q, k, vv, out), ATTN_EUNSUPPORTED);
        attn_state_destroy(st);
        attn_destroy(lin);
        attn_destroy(a);
    }
    cr_assert_geq(n_no_step, 2, "softmax and lsh have no recurrent mode");
}

enum { RB = 2, RH = 3, RD = 5, RM = 3 };

/* A linear object, its recurrent shape and one step's inputs. */
typedef struct {
    attn *a;
    attn_shape s;
    float q[RB * RH * RD], k[RB * RH * RD], v[RB * RH * RM], out[RB * RH * RM];
} rec_fixture;

static void rec_make(rec_fixture *f, const char *variant) {
    f->a = make(variant, 0, NULL);
    f->s = shape(RB, RH, 1, RD, RM, true, NULL);
    tu_fill_normal(f->q, RB * RH * RD, 17, 0, 1.0);
    tu_fill_normal(f->k, RB * RH * RD, 17, 1, 1.0);
    tu_fill_normal(f->v, RB * RH * RM, 17, 2, 1.0);
}

static attn_state *rec_state(rec_fixture *f, int capacity) {
    size_t n = attn_state_bytes(f->a, &f->s, capacity);
    cr_assert_gt(n, 0u, "state bytes: %s", attn_error());
    attn_state *st = NULL;
    cr_assert_eq(attn_state_create(f->a, &f->s, capacity, &st), 0, "%s", attn_error());
    cr_assert_not_null(st);
    return st;
}

static void expect_rc_msg(int rc, const char *what) {
    cr_assert_lt(rc, 0, "%s was accepted", what);
    cr_assert_neq(attn_error()[0], '\0', "%s: no message", what);
}

/* Creating a state for a shape that has none fails, leaves *out NULL, says why. */
static void expect_no_state(attn *a, const attn_shape *s, int capacity, const char *what) {
    attn_state *st = (attn_state *)&st; /* not NULL: the call must reset it */
    ab_clear_error();
    expect_rc_msg(attn_state_create(a, s, capacity, &st), what);
    cr_assert_null(st, "%s: output not reset", what);
}

Test(recurrent, linear_shape_misuse) {
    rec_fixture f;
    rec_make(&f, "linear");

    attn_shape nc = f.s;
    nc.causal = false;
    cr_assert_eq(attn_state_bytes(f.a, &nc, 4), 0u, "non-causal shape has no state");
    expect_no_state(f.a, &nc, 4, "non-causal state");
    cr_assert(strstr(attn_error(), "causal") != NULL, "%s", attn_error());

    int lengths[RB] = {1, 1};
    attn_shape ls = f.s;
    ls.lengths = lengths;
    cr_assert_eq(attn_state_bytes(f.a, &ls, 4), 0u);
    expect_no_state(f.a, &ls, 4, "lengths in recurrent mode");

    cr_assert_eq(attn_state_bytes(f.a, &f.s, 0), 0u);
    expect_no_state(f.a, &f.s, 0, "capacity 0");
    expect_no_state(f.a, &f.s, -3, "capacity -3");
    expect_rc_msg(attn_state_create(f.a, &f.s, 4, NULL), "NULL output");

    attn_shape zero = f.s;
    zero.qk_dim = 0;
    expect_no_state(f.a, &zero, 4, "D = 0");

    /* Something that is not a state. */
    attn_state *bogus = (attn_state *)f.q;
    ab_clear_error();
    expect_rc_msg(attn_step(f.a, bogus, 0, f.q, f.k, f.v, f.out), "step on a non-state");
    cr_assert(strstr(attn_error(), "state") != NULL, "%s", attn_error());
    expect_rc_msg(attn_step(f.a, NULL, 0, f.q, f.k, f.v, f.out), "step on NULL");
    expect_rc_msg(attn_prefill(f.a, NULL, 1, f.q, f.k, f.v, f.out), "prefill on NULL");
    expect_rc_msg(attn_state_reset(f.a, NULL), "reset of NULL");
    cr_assert_eq(attn_state_len(NULL), -1);
    cr_assert_null(attn_state_shape(NULL));
    attn_state_destroy(NULL); /* no-op */
    attn_destroy(f.a);
}

Test(recurrent, linear_step_order_and_capacity) {
    rec_fixture f;
    rec_make(&f, "linear");
    const int cap = 2;
    attn_state *st = rec_state(&f, cap);
    const attn_shape *ss = attn_state_shape(st);
    cr_assert(ss && ss->batch == RB && ss->heads == RH && ss->qk_dim == RD && ss->v_dim == RM && ss->len == cap);

    /* t must equal the number of positions held. */
    ab_clear_error();
    expect_rc_msg(attn_step(f.a, st, 1, f.q, f.k, f.v, f.out), "step t=1 on an empty state");
    expect_rc_msg(attn_step(f.a, st, -1, f.q, f.k, f.v, f.out), "step t=-1");
    cr_assert_eq(attn_step(f.a, st, 0, f.q, f.k, f.v, f.out), 0, "%s", attn_error());
    expect_rc_msg(attn_step(f.a, st, 0, f.q, f.k, f.v, f.out), "step t=0 again");
    /* A state is used with the object that made it. */
    attn *other = make("linear", 0, NULL);
    expect_rc_msg(attn_step(other, st, 1, f.q, f.k, f.v, f.out), "another object's state");
    cr_assert(strstr(attn_error(), "another") != NULL, "%s", attn_error());
    attn_destroy(other);
    expect_rc_msg(attn_step(f.a, st, 1, NULL, f.k, f.v, f.out), "NULL q");
    /* A failed call leaves the state where it was. */
    cr_assert_eq(attn_state_len(st), 1);
    cr_assert_eq(attn_step(f.a, st, 1, f.q, f.k, f.v, f.out), 0, "%s", attn_error());
    /* Full. */
    ab_clear_error();
    expect_rc_msg(attn_step(f.a, st, 2, f.q, f.k, f.v, f.out), "step past capacity");
    cr_assert(strstr(attn_error(), "capacity") != NULL, "%s", attn_error());
    /* Resetting empties it. */
    cr_assert_eq(attn_state_reset(f.a, st), 0);
    cr_assert_eq(attn_state_len(st), 0);
    cr_assert_eq(attn_step(f.a, st, 0, f.q, f.k, f.v, f.out), 0, "%s", attn_error());
    attn_state_destroy(st);
    attn_destroy(f.a);
}

Test(recurrent, linear_prefill_misuse) {
    rec_fixture f;
    rec_make(&f, "linear");
    const int cap = 3, P = 4;
    float q[RB * RH * P * RD], k[RB * RH * P * RD], v[RB * RH * P * RM], out[RB * RH * P * RM];
    tu_fill_normal(q, sizeof q / sizeof q[0], 18, 0, 1.0);
    tu_fill_normal(k, sizeof k / sizeof k[0], 18, 1, 1.0);
    tu_fill_normal(v, sizeof v / sizeof v[0], 18, 2, 1.0);
    attn_state *st = rec_state(&f, cap);
    ab_clear_error();
    expect_rc_msg(attn_prefill(f.a, st, P, q, k, v, out), "prefill of 4 into capacity 3");
    expect_rc_msg(attn_prefill(f.a, st, -1, q, k, v, out), "prefill of -1");
    /* The refused prefill left the state empty: a prefill that fits works, with the
     * prompt's output optional. */
    cr_assert_eq(attn_prefill(f.a, st, 2, q, k, v, NULL), 0, "%s", attn_error());
    expect_rc_msg(attn_prefill(f.a, st, 1, q, k, v, out), "prefill of a non-empty state");
    expect_rc_msg(attn_step(f.a, st, 0, f.q, f.k, f.v, f.out), "step t=0 after a prefill of 2");
    cr_assert_eq(attn_step(f.a, st, 2, f.q, f.k, f.v, f.out), 0, "%s", attn_error());
    expect_rc_msg(attn_step(f.a, st, 3, f.q, f.k, f.v, f.out), "step past capacity after prefill");
    attn_state_destroy(st);
    attn_destroy(f.a);
}

Test(recurrent, state_size_by_variant) {
    attn_shape s = shape(2, 2, 1, 8, 4, true, NULL);
    /* Linear and polynomial states are (S, Z): constant in the capacity (the paper's
     * point); the key/value cache of stateful-softmax grows with it. */
    static const char *const constant[] = {"linear", "polynomial"};
    for (int v = 0; v < 2; v++) {
        attn *a = make(constant[v], 0, NULL);
        size_t small = attn_state_bytes(a, &s, 4), large = attn_state_bytes(a, &s, 4096);
        cr_assert_gt(small, 0u, "%s: %s", constant[v], attn_error());
        cr_assert_eq(small, large, "%s state grows with capacity: %zu vs %zu", constant[v], small, large);
        attn_destroy(a);
    }
    /* favor: S, Z of C = 2 D features plus each slice's key shift and the projection W
     * (and its transpose): constant too. */
    const char *favor[] = {"feature_map=favor"};
    attn *fa = make("linear", 1, favor);
    size_t fsmall = attn_state_bytes(fa, &s, 4), flarge = attn_state_bytes(fa, &s, 1 << 20);
    cr_assert_eq(fsmall, flarge);
    cr_assert_geq(fsmall, (size_t)4 * 16 * (4 + 1) * sizeof(float) + 2 * 16 * 8 * sizeof(float), "%zu", fsmall);
    attn_destroy(fa);
    /* local: a ring of min(window, capacity) keys and values: it grows up to the window
     * (256 by default) and no further. */
    attn *la = make("local", 0, NULL);
    size_t l4 = attn_state_bytes(la, &s, 4), l256 = attn_state_bytes(la, &s, 256), lbig = attn_state_bytes(la, &s, 1 << 20);
    cr_assert_lt(l4, l256);
    cr_assert_eq(l256, lbig, "local's state grows past its window: %zu vs %zu", l256, lbig);
    cr_assert_geq(l256, (size_t)256 * 4 * (8 + 4) * sizeof(float));
    attn_destroy(la);
    attn *a = make("stateful-softmax", 0, NULL);
    size_t small = attn_state_bytes(a, &s, 4), large = attn_state_bytes(a, &s, 4096);
    cr_assert_gt(small, 0u, "%s", attn_error());
    /* A cache of 4096 keys and values of B*H = 4 heads holds at least
     * 4096 * 4 * (D + M) floats. */
    cr_assert_geq(large, (size_t)4096 * 4 * (8 + 4) * sizeof(float), "cache of %zu bytes", large);
    cr_assert_gt(large, small);
    attn_destroy(a);
}
