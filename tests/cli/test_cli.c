/* The attnbench binary: help and list, one-line errors with exit status 2 for bad input
 * (and no output file left behind), and `op` results equal to the library's; `op
 * --device cuda` without a device, and end to end on the emulated binary
 * (attnbench-emu, whose CUDA device is the CPU emulator). */
#include "test_cli.h"

/* ------------------------------------------------------------------------------------
 * Running the binary
 * ---------------------------------------------------------------------------------- */

char g_dir[600];    /* this test's scratch folder */
char *g_stdout;     /* output of the last run */
char *g_stderr;

/* A path inside the scratch folder; the strings live until the test's teardown. */
static char **g_paths;
static size_t g_npaths;
const char *P(const char *name) {
    char *p = malloc(strlen(g_dir) + strlen(name) + 2);
    cr_assert_not_null(p);
    sprintf(p, "%s/%s", g_dir, name);
    g_paths = realloc(g_paths, sizeof *g_paths * (g_npaths + 1));
    cr_assert_not_null(g_paths);
    g_paths[g_npaths++] = p;
    return p;
}

/* Runs `exe` with the NULL-terminated arguments (and `env`, "NAME=VALUE" or NULL, added
 * to the environment), stdout and stderr captured in g_stdout / g_stderr; returns the
 * exit status (or 128 + signal). */
int run_exe_argv(const char *exe, const char *env, const char *const *args) {
    return tp_run(g_dir, exe, env, args, &g_stdout, &g_stderr);
}

int run_argv(const char *const *args) { return run_exe_argv(ATTNBENCH_EXE, NULL, args); }

/* run(arg, ..., NULL) */
#define run(...) run_argv(TP_ARGV(__VA_ARGS__))

/* Exit status 2 and exactly one line on stderr, "attnbench: error: ...", containing
 * every string of `must` (NULL-terminated). */
void expect_usage_error(int status, const char *what, const char *const *must) {
    cr_assert(tp_usage_error(status, g_stderr, what, must), "%s: not a one-line usage error", what);
}

/* ------------------------------------------------------------------------------------
 * Inputs
 * ---------------------------------------------------------------------------------- */

static void write_f32(const char *name, int ndim, const int64_t *shape, uint64_t stream) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    float *x = tu_alloc_f(n);
    tu_fill_normal(x, n, 2024, stream, 1.0);
    cr_assert_eq(ab_npy_write(P(name), AB_F32, ndim, shape, x), 0, "%s", ab_error());
    free(x);
}

static void setup(void) {
    task_list_install();
    tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/cli-tmp");

    const int64_t sq[4] = {B, H, N, D}, sv[4] = {B, H, N, M};
    write_f32("q.npy", 4, sq, 0);
    write_f32("k.npy", 4, sq, 1);
    write_f32("v.npy", 4, sv, 2);
    write_f32("dout.npy", 4, sv, 3);

    /* Bad tensors. */
    int32_t qi[NQ];
    for (size_t i = 0; i < NQ; i++) qi[i] = (int32_t)i;
    cr_assert_eq(ab_npy_write(P("q_int32.npy"), AB_I32, 4, sq, qi), 0);
    const int64_t s3[3] = {B, H, N * D};
    write_f32("q_3d.npy", 3, s3, 0);
    const int64_t skd[4] = {B, H, N, D + 1};
    write_f32("k_bad_d.npy", 4, skd, 1);
    const int64_t svn[4] = {B, H, N - 1, M};
    write_f32("v_bad_n.npy", 4, svn, 2);
    const int64_t sdm[4] = {B, H, N, M + 1};
    write_f32("dout_bad_m.npy", 4, sdm, 3);
    const int64_t sq0[4] = {B, H, 0, D};
    write_f32("q_zero_n.npy", 4, sq0, 0);

    /* Lengths. */
    const int64_t sb[1] = {B}, sb3[1] = {B + 1};
    const int32_t l32[B] = {N, 4}, l32big[B] = {N, N + 1}, l32wrong[B + 1] = {1, 2, 3};
    const int64_t l64[B] = {6, 0};
    const float lf[B] = {9, 4};
    cr_assert_eq(ab_npy_write(P("len32.npy"), AB_I32, 1, sb, l32), 0);
    cr_assert_eq(ab_npy_write(P("len64.npy"), AB_I64, 1, sb, l64), 0);
    cr_assert_eq(ab_npy_write(P("len_big.npy"), AB_I32, 1, sb, l32big), 0);
    cr_assert_eq(ab_npy_write(P("len_size.npy"), AB_I32, 1, sb3, l32wrong), 0);
    cr_assert_eq(ab_npy_write(P("len_f32.npy"), AB_F32, 1, sb, lf), 0);

    /* A file with a bad magic number. */
    FILE *f = fopen(P("bad_magic.npy"), "wb");
    cr_assert_not_null(f);
    fputs("\x93NUMPX\x01\x00garbage that is not a header", f);
    fclose(f);
}

static void teardown(void) {
    tp_rm_tree(g_dir);
    free(g_stdout);
    free(g_stderr);
    g_stdout = g_stderr = NULL;
    for (size_t i = 0; i < g_npaths; i++) free(g_paths[i]);
    free(g_paths);
    g_paths = NULL;
    g_npaths = 0;
}

TestSuite(cli, .init = setup, .fini = teardown);

/* ------------------------------------------------------------------------------------
 * help, list, global errors
 * ---------------------------------------------------------------------------------- */

Test(cli, help) {
    cr_assert_eq(run("--help", NULL), 0, "%s", g_stderr);
    cr_assert(strstr(g_stdout, "list") && strstr(g_stdout, "op"), "help: %s", g_stdout);
    cr_assert_eq(run("op", "--help", NULL), 0, "%s", g_stderr);
    cr_assert(strstr(g_stdout, "--variant") && strstr(g_stdout, "--out"), "op help: %s", g_stdout);
    cr_assert_eq(run("--version", NULL), 0);
    cr_assert(strstr(g_stdout, "attnbench"));
    /* No command: usage on stderr, status 2. */
    cr_assert_eq(run(NULL), 2);
    cr_assert(strstr(g_stderr, "usage"), "%s", g_stderr);
}

Test(cli, list_shows_variants_and_options) {
    cr_assert_eq(run("list", NULL), 0, "%s", g_stderr);
    cr_assert_str_empty(g_stderr);
    static const char *const words[] = {"softmax", "stateful-softmax", "linear", "polynomial", "lsh", "scale",
                                        "feature_map", "eps", "chunk", "c=", "rounds", "bits", "combine",
                                        "elu", "taylor", "logsumexp", "model heads", "categorical, logistic_mixture, ctc"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        cr_assert(strstr(g_stdout, words[i]), "list does not show '%s':\n%s", words[i], g_stdout);
    /* Every option the library lists is shown. */
    for (int i = 0; i < attn_variant_count(); i++) {
        const char *name;
        for (int j = 0; attn_variant_option(i, j, &name, NULL, NULL); j++) {
            char pat[64];
            snprintf(pat, sizeof pat, "%s=", name);
            cr_assert(strstr(g_stdout, pat), "list does not show option %s", name);
        }
    }
    const char *must[] = {"extra", NULL};
    expect_usage_error(run("list", "extra", NULL), "list extra", must);
    /* --threads is a global option, accepted after any command too. */
    cr_assert_eq(run("list", "--threads", "2", NULL), 0, "list --threads 2: %s", g_stderr);
    const char *must2[] = {"--threads", NULL};
    expect_usage_error(run("list", "--threads", NULL), "list --threads (no value)", must2);
}

/* The strings of a JSON array, compared with `want` (n of them, in order). */
static void expect_strings(json_t *arr, const char *const *want, int n, const char *what) {
    cr_assert(json_is_array(arr), "%s: not an array", what);
    cr_assert_eq((int)json_array_size(arr), n, "%s: %zu entries, want %d", what, json_array_size(arr), n);
    for (int k = 0; k < n; k++)
        cr_assert_str_eq(json_string_value(json_array_get(arr, (size_t)k)), want[k], "%s[%d]", what, k);
}

static const char *jstr(json_t *obj, const char *key) {
    const char *s = json_string_value(json_object_get(obj, key));
    cr_assert_not_null(s, "no string '%s'", key);
    return s;
}

/* list --json parses and is exactly the registry: every variant in order with its
 * summary, modes, devices and options (each with its type, default, help, choices or
 * range, auto), and every feature map with the choice options that offer it. */
Test(cli, list_json_is_the_registry) {
    cr_assert_eq(run("list", "--json", NULL), 0, "%s", g_stderr);
    cr_assert_str_empty(g_stderr);
    json_error_t jerr;
    json_t *doc = json_loads(g_stdout, 0, &jerr);
    cr_assert_not_null(doc, "list --json is not JSON: %s (line %d)", jerr.text, jerr.line);
    cr_assert_eq(json_object_size(doc), 6u, "schema, variants, feature_maps, tasks, bodies, heads");
    cr_assert_str_eq(jstr(doc, "schema"), "attnbench/list/1");

    json_t *vars = json_object_get(doc, "variants");
    cr_assert(json_is_array(vars));
    cr_assert_eq((int)json_array_size(vars), attn_variant_count());
    for (int i = 0; i < attn_variant_count(); i++) {
        json_t *v = json_array_get(vars, (size_t)i);
        const char *vn = attn_variant_name(i);
        cr_assert_eq(json_object_size(v), 8u, "%s: name, summary, options, modes, causal, params, input, devices", vn);
        json_t *input = json_object_get(v, "input");
        if (attn_variant_aux(i)) cr_assert_str_eq(json_string_value(input), attn_variant_aux(i), "%s: input", vn);
        else cr_assert(json_is_null(input), "%s: input is null for a variant reading only q, k, v", vn);
        cr_assert_str_eq(jstr(v, "name"), vn);
        cr_assert(json_is_boolean(json_object_get(v, "causal")), "%s: causal", vn);
        cr_assert_eq(json_is_true(json_object_get(v, "causal")), attn_variant_has_causal(i), "%s: causal", vn);
        cr_assert(json_is_boolean(json_object_get(v, "params")), "%s: params", vn);
        cr_assert_eq(json_is_true(json_object_get(v, "params")), attn_variant_has_params(i), "%s: params", vn);
        cr_assert_eq(attn_variant_has_params(i), strcmp(vn, "linformer") == 0, "%s: params", vn);
        cr_assert_str_eq(jstr(v, "summary"), attn_variant_summary(i));
        const char *modes[2] = {"parallel", "recurrent"}, *devices[2] = {"cpu", "cuda"};
        expect_strings(json_object_get(v, "modes"), modes, attn_variant_has_step(i) ? 2 : 1, vn);
        expect_strings(json_object_get(v, "devices"), devices, attn_variant_has_device(i, AB_DEV_CUDA) ? 2 : 1,
                       vn);
        json_t *opts = json_object_get(v, "options");
        cr_assert(json_is_array(opts));
        attn_option_info o;
        int j = 0;
        for (; attn_variant_option_info(i, j, &o); j++) {
            json_t *jo = json_array_get(opts, (size_t)j);
            cr_assert_not_null(jo, "%s: option %s is missing", vn, o.name);
            static const char *const types[] = {"double", "int", "choice"};
            cr_assert_str_eq(jstr(jo, "name"), o.name);
            cr_assert_str_eq(jstr(jo, "type"), types[o.type], "%s.%s", vn, o.name);
            cr_assert_str_eq(jstr(jo, "default"), o.def);
            cr_assert_str_eq(jstr(jo, "help"), o.help);
            cr_assert(json_is_boolean(json_object_get(jo, "auto")));
            cr_assert_eq(json_is_true(json_object_get(jo, "auto")), o.auto_ok, "%s.%s auto", vn, o.name);
            if (o.type == ATTN_OPT_CHOICE) {
                cr_assert_eq(json_object_size(jo), 6u, "%s.%s: no range for a choice", vn, o.name);
                const char *want[16];
                cr_assert_leq(o.n_choices, 16);
                for (int c = 0; c < o.n_choices; c++) want[c] = attn_variant_option_choice(i, j, c);
                expect_strings(json_object_get(jo, "choices"), want, o.n_choices, o.name);
            } else {
                cr_assert_eq(json_object_size(jo), 7u, "%s.%s: name, type, default, help, min, max, auto", vn, o.name);
                json_t *mn = json_object_get(jo, "min"), *mx = json_object_get(jo, "max");
                if (o.type == ATTN_OPT_INT) cr_assert(json_is_integer(mn) && json_is_integer(mx), "%s.%s", vn, o.name);
                /* Written with 17 digits: the doubles read back exactly. */
                cr_assert_eq(json_number_value(mn), o.min, "%s.%s min", vn, o.name);
                cr_assert_eq(json_number_value(mx), o.max, "%s.%s max", vn, o.name);
            }
        }
        cr_assert_eq((int)json_array_size(opts), j, "%s: %zu options listed, the registry has %d", vn,
                     json_array_size(opts), j);
    }

    json_t *maps = json_object_get(doc, "feature_maps");
    cr_assert(json_is_array(maps));
    cr_assert_eq((int)json_array_size(maps), attn_feature_map_count());
    int li = attn_variant_find("linear");
    const char *first;
    cr_assert(attn_variant_option(li, 0, &first, NULL, NULL));
    cr_assert_str_eq(first, "feature_map");
    for (int m = 0; m < attn_feature_map_count(); m++) {
        const char *name, *features, *help;
        cr_assert(attn_feature_map_info(m, &name, &features, &help));
        json_t *jm = json_array_get(maps, (size_t)m);
        cr_assert_str_eq(jstr(jm, "name"), name);
        cr_assert_str_eq(jstr(jm, "features"), features);
        cr_assert_str_eq(jstr(jm, "help"), help);
        /* Offered by linear's feature_map exactly when it is one of its choices. */
        bool offered = false;
        for (int c = 0; attn_variant_option_choice(li, 0, c); c++)
            offered |= strcmp(attn_variant_option_choice(li, 0, c), name) == 0;
        json_t *of = json_object_get(jm, "choice_of");
        cr_assert(json_is_array(of));
        cr_assert_eq(json_array_size(of), offered ? 1u : 0u, "%s", name);
        if (offered) {
            cr_assert_str_eq(jstr(json_array_get(of, 0), "variant"), "linear");
            cr_assert_str_eq(jstr(json_array_get(of, 0), "option"), "feature_map");
        }
    }
    cr_assert_str_eq(jstr(json_array_get(maps, 0), "name"), "elu");

    /* the training tasks with their config keys, the model bodies and heads */
    json_t *tasks = json_object_get(doc, "tasks");
    int nt = 0;
    for (; task_kind_at(nt); nt++) {
        const task_kind *k = task_kind_at(nt);
        json_t *jt = json_array_get(tasks, (size_t)nt);
        cr_assert_not_null(jt, "task %s is missing", k->name);
        cr_assert_str_eq(jstr(jt, "name"), k->name);
        cr_assert_str_eq(jstr(jt, "summary"), k->summary);
        int nk = 0;
        for (; k->keys[nk]; nk++) cr_assert_str_eq(json_string_value(json_array_get(json_object_get(jt, "keys"), nk)),
                                                   k->keys[nk]);
        cr_assert_eq(json_array_size(json_object_get(jt, "keys")), (size_t)nk, "%s keys", k->name);
    }
    cr_assert_eq(json_array_size(tasks), (size_t)nt);
    cr_assert_geq(nt, 3, "copy, sequences, frames");
    json_t *bodies = json_object_get(doc, "bodies");
    cr_assert_eq(json_array_size(bodies), (size_t)TF_BODY_COUNT);
    for (int b = 0; b < TF_BODY_COUNT; b++)
        cr_assert_str_eq(json_string_value(json_array_get(bodies, b)), tf_body_name((tf_body)b));
    json_t *heads = json_object_get(doc, "heads");
    cr_assert_eq(json_array_size(heads), (size_t)TF_HEAD_COUNT);
    for (int h = 0; h < TF_HEAD_COUNT; h++)
        cr_assert_str_eq(json_string_value(json_array_get(heads, h)), tf_head_name((tf_head)h));
    cr_assert_str_eq(json_string_value(json_array_get(heads, TF_HEAD_CTC)), "ctc");
    json_decref(doc);

    const char *must[] = {"extra", NULL};
    expect_usage_error(run("list", "--json", "extra", NULL), "list --json extra", must);
}

Test(cli, global_errors) {
    {
        const char *must[] = {"frobnicate", NULL};
        expect_usage_error(run("frobnicate", NULL), "unknown command", must);
    }
    {
        const char *must[] = {"--frobnicate", NULL};
        expect_usage_error(run("--frobnicate", "list", NULL), "unknown global option", must);
    }
    {
        const char *must[] = {"--threads", NULL};
        expect_usage_error(run("--threads", "many", "list", NULL), "--threads many", must);
        expect_usage_error(run("--threads", "0", "list", NULL), "--threads 0", must);
        expect_usage_error(run("--threads", NULL), "--threads without a value", must);
    }
}

/* ------------------------------------------------------------------------------------
 * op: bad input
 * ---------------------------------------------------------------------------------- */

typedef struct {
    const char *what;
    const char *args[24]; /* after "--threads 1 op", NULL-terminated; "@x" means P("x") */
    const char *must[4];
} bad_case;

static const bad_case BAD[] = {
    {"unknown variant",
     {"--variant", "nosuch", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--out", "@o"},
     {"nosuch", "softmax"}},
    {"unknown --set option",
     {"--variant", "softmax", "--set", "nosuch=1", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--out", "@o"},
     {"nosuch"}},
    {"--set without '='",
     {"--variant", "softmax", "--set", "scale", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--out", "@o"},
     {"scale"}},
    {"missing --q file",
     {"--variant", "softmax", "--q", "@missing.npy", "--k", "@k.npy", "--v", "@v.npy", "--out", "@o"},
     {"missing.npy"}},
    {"q of dtype int32",
     {"--variant", "softmax", "--q", "@q_int32.npy", "--k", "@k.npy", "--v", "@v.npy", "--out", "@o"},
     {"--q", "int32"}},
    {"q with 3 dims",
     {"--variant", "softmax", "--q", "@q_3d.npy", "--k", "@k.npy", "--v", "@v.npy", "--out", "@o"},
     {"--q", "dimension"}},
    {"q with N = 0",
     {"--variant", "softmax", "--q", "@q_zero_n.npy", "--k", "@k.npy", "--v", "@v.npy", "--out", "@o"},
     {"--q"}},
    {"k shape differs from q",
     {"--variant", "softmax", "--q", "@q.npy", "--k", "@k_bad_d.npy", "--v", "@v.npy", "--out", "@o"},
     {"--k"}},
    {"v with another N",
     {"--variant", "softmax", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v_bad_n.npy", "--out", "@o"},
     {"--v"}},
    {"dout shape differs from v",
     {"--variant", "softmax", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--dout", "@dout_bad_m.npy",
      "--out", "@o"},
     {"--dout"}},
    {"lengths of wrong size",
     {"--variant", "softmax", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--lengths", "@len_size.npy",
      "--out", "@o"},
     {"--lengths"}},
    {"lengths value > N",
     {"--variant", "softmax", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--lengths", "@len_big.npy",
      "--out", "@o"},
     {"lengths", "10"}},
    {"lengths as float32",
     {"--variant", "softmax", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--lengths", "@len_f32.npy",
      "--out", "@o"},
     {"--lengths", "float32"}},
    {"bad magic",
     {"--variant", "softmax", "--q", "@q.npy", "--k", "@k.npy", "--v", "@bad_magic.npy", "--out", "@o"},
     {"bad_magic.npy", "magic"}},
    {"--mode recurrent without --causal",
     {"--variant", "linear", "--mode", "recurrent", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--out",
      "@o"},
     {"causal"}},
    {"--mode recurrent for lsh",
     {"--variant", "lsh", "--causal", "--mode", "recurrent", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy",
      "--out", "@o"},
     {"lsh", "recurrent"}},
    {"--dout with --mode recurrent",
     {"--variant", "linear", "--causal", "--mode", "recurrent", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy",
      "--dout", "@dout.npy", "--out", "@o"},
     {"--dout"}},
    {"--lengths with --mode recurrent",
     {"--variant", "linear", "--causal", "--mode", "recurrent", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy",
      "--lengths", "@len32.npy", "--out", "@o"},
     {"--lengths"}},
    {"--mode bogus",
     {"--variant", "softmax", "--mode", "bogus", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--out", "@o"},
     {"bogus"}},
    {"--device bogus",
     {"--variant", "softmax", "--device", "gpu", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--out", "@o"},
     {"gpu"}},
    {"missing --out", {"--variant", "softmax", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy"}, {"--out"}},
    {"missing --variant", {"--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--out", "@o"}, {"--variant"}},
    {"missing --k", {"--variant", "softmax", "--q", "@q.npy", "--v", "@v.npy", "--out", "@o"}, {"--k"}},
    {"value missing at the end", {"--variant", "softmax", "--q", "@q.npy", "--k", "@k.npy", "--v"}, {"--v"}},
    {"unknown argument",
     {"--variant", "softmax", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--out", "@o", "--frob"},
     {"--frob"}},
    {"--seed negative",
     {"--variant", "softmax", "--seed", "-1", "--q", "@q.npy", "--k", "@k.npy", "--v", "@v.npy", "--out", "@o"},
     {"--seed"}},
};

/* Runs "--threads 1 op ARGS" with @names expanded into the scratch folder (out
 * folder @o -> `out_dir`). */
static int run_op(const char *const *args, const char *out_dir) {
    const char *full[64];
    int n = 0;
    full[n++] = "--threads";
    full[n++] = "1";
    full[n++] = "op";
    for (int i = 0; args[i]; i++) {
        const char *a = args[i];
        if (strcmp(a, "@o") == 0) a = out_dir;
        else if (a[0] == '@') a = P(a + 1);
        full[n++] = a;
    }
    full[n] = NULL;
    return run_argv(full);
}

Test(cli, op_bad_input_one_line_exit_2_no_output) {
    for (size_t c = 0; c < sizeof BAD / sizeof BAD[0]; c++) {
        char out[700];
        snprintf(out, sizeof out, "%s/out%zu", g_dir, c);
        int status = run_op(BAD[c].args, out);
        expect_usage_error(status, BAD[c].what, BAD[c].must);
        char p[800];
        snprintf(p, sizeof p, "%s/out.npy", out);
        cr_assert_not(tp_exists(p), "%s: %s was written", BAD[c].what, p);
    }
}

/* A file already in the output folder survives a later run that fails on bad input,
 * byte for byte, with no temporary file left beside it. */
Test(cli, op_failure_keeps_earlier_output) {
    cr_assert_eq(ab_mkdir_p(P("keep")), 0);
    const float old[4] = {1, 2, 3, 4};
    const int64_t s[1] = {4};
    cr_assert_eq(ab_npy_write(P("keep/out.npy"), AB_F32, 1, s, old), 0);
    size_t before_n;
    char *before = tp_slurp(P("keep/out.npy"), &before_n);
    static const int cases[] = {0, 7, 11, 13}; /* unknown variant, bad k, lengths > N, bad magic */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *bc = &BAD[cases[i]];
        expect_usage_error(run_op(bc->args, P("keep")), bc->what, bc->must);
        cr_assert(tp_exists(P("keep/out.npy")), "%s: out.npy removed", bc->what);
        size_t after_n;
        char *after = tp_slurp(P("keep/out.npy"), &after_n);
        cr_assert_eq(after_n, before_n, "%s: out.npy changed size", bc->what);
        cr_assert_eq(memcmp(before, after, after_n), 0, "%s: out.npy changed", bc->what);
        free(after);
    }
    free(before);
    DIR *d = opendir(P("keep"));
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    cr_assert_eq(n, 1, "only out.npy is in the folder");
}

/* ------------------------------------------------------------------------------------
 * op: results equal the library's
 * ---------------------------------------------------------------------------------- */

void load(const char *name, ab_array *a) { cr_assert_eq(ab_npy_read(P(name), a), 0, "%s", ab_error()); }

static void expect_shape4(const ab_array *a, int64_t b, int64_t h, int64_t n, int64_t x, const char *what) {
    cr_assert_eq(a->dtype, AB_F32, "%s dtype", what);
    cr_assert_eq(a->ndim, 4, "%s ndim", what);
    cr_assert(a->shape[0] == b && a->shape[1] == h && a->shape[2] == n && a->shape[3] == x,
              "%s has shape [%lld, %lld, %lld, %lld]", what, (long long)a->shape[0], (long long)a->shape[1],
              (long long)a->shape[2], (long long)a->shape[3]);
}

/* The library's forward (and backward when dq != NULL) on the fixture inputs, with one
 * thread like the binary's --threads 1, so results must be bit-identical. */
void library_op(const char *variant, int n_set, const char *const *set, uint64_t seed, bool causal,
                const int *lengths, float *out, float *dq, float *dk, float *dv) {
    ab_set_threads(1);
    attn_options o = {variant, AB_DEV_CPU, seed, n_set, set};
    attn *a = NULL;
    cr_assert_eq(attn_create(&o, &a), 0, "%s", attn_error());
    ab_array q, k, v, dout;
    load("q.npy", &q);
    load("k.npy", &k);
    load("v.npy", &v);
    load("dout.npy", &dout);
    attn_shape s = {B, H, N, D, M, causal, lengths};
    size_t sb = attn_saved_bytes(a, &s);
    void *saved = sb ? ab_alloc(sb) : NULL;
    cr_assert_eq(attn_forward(a, &s, q.data, k.data, v.data, out, saved), 0, "%s forward: %s", variant,
                 attn_error());
    if (dq)
        cr_assert_eq(attn_backward(a, &s, q.data, k.data, v.data, dout.data, saved, dq, dk, dv), 0,
                     "%s backward: %s", variant, attn_error());
    ab_free(saved);
    ab_array_free(&q);
    ab_array_free(&k);
    ab_array_free(&v);
    ab_array_free(&dout);
    attn_destroy(a);
}

static void expect_same(const char *file, const float *want, size_t n, int64_t x, const char *what) {
    ab_array a;
    load(file, &a);
    expect_shape4(&a, B, H, N, x, file);
    cr_assert_eq(a.count, n);
    const float *got = a.data;
    for (size_t i = 0; i < n; i++)
        cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0, "%s: %s[%zu] = %.9g, library gives %.9g", what,
                  file, i, got[i], want[i]);
    ab_array_free(&a);
}

static void check_op_variant(const char *variant, int n_set, const char *const *set) {
    char outdir[64];
    snprintf(outdir, sizeof outdir, "out-%s", variant);
    const char *args[32] = {"--threads", "1",  "op",     "--variant",  variant,       "--causal", "--seed",
                            "7",         "--q", P("q.npy"), "--k",      P("k.npy"),    "--v",      P("v.npy"),
                            "--dout",    P("dout.npy"), "--out", P(outdir)};
    int n = 18;
    for (int i = 0; i < n_set; i++) {
        args[n++] = "--set";
        args[n++] = set[i];
    }
    args[n] = NULL;
    int status = run_argv(args);
    cr_assert_eq(status, 0, "%s: exit %d: %s", variant, status, g_stderr);

    float *out = tu_alloc_f(NV), *dq = tu_alloc_f(NQ), *dk = tu_alloc_f(NQ), *dv = tu_alloc_f(NV);
    library_op(variant, n_set, set, 7, true, NULL, out, dq, dk, dv);
    char f[128];
    snprintf(f, sizeof f, "%s/out.npy", outdir);
    expect_same(f, out, NV, M, variant);
    snprintf(f, sizeof f, "%s/dq.npy", outdir);
    expect_same(f, dq, NQ, D, variant);
    snprintf(f, sizeof f, "%s/dk.npy", outdir);
    expect_same(f, dk, NQ, D, variant);
    snprintf(f, sizeof f, "%s/dv.npy", outdir);
    expect_same(f, dv, NV, M, variant);

    /* A later run that fails on bad input leaves all four files as they were. */
    char *before[4];
    size_t before_n[4];
    static const char *const names[4] = {"out.npy", "dq.npy", "dk.npy", "dv.npy"};
    for (int i = 0; i < 4; i++) {
        snprintf(f, sizeof f, "%s/%s", outdir, names[i]);
        before[i] = tp_slurp(P(f), &before_n[i]);
    }
    const char *bad[] = {"--threads", "1",        "op",         "--variant",       variant, "--causal",
                         "--q",       P("q.npy"), "--k",        P("k.npy"),        "--v",   P("v.npy"),
                         "--dout",    P("dout.npy"), "--lengths", P("len_big.npy"), "--out", P(outdir), NULL};
    const char *must[] = {"lengths", NULL};
    expect_usage_error(run_argv(bad), "lengths > N after a good run", must);
    for (int i = 0; i < 4; i++) {
        snprintf(f, sizeof f, "%s/%s", outdir, names[i]);
        size_t after_n;
        char *after = tp_slurp(P(f), &after_n);
        cr_assert(after_n == before_n[i] && memcmp(after, before[i], after_n) == 0, "%s changed", names[i]);
        free(after);
        free(before[i]);
    }
    free(out), free(dq), free(dk), free(dv);
}

Test(cli, op_softmax) { check_op_variant("softmax", 0, NULL); }
Test(cli, op_stateful_softmax) { check_op_variant("stateful-softmax", 0, NULL); }
Test(cli, op_linear) { check_op_variant("linear", 0, NULL); }
Test(cli, op_polynomial) { check_op_variant("polynomial", 0, NULL); }
Test(cli, op_lsh) { check_op_variant("lsh", 0, NULL); }
Test(cli, op_with_settings) {
    const char *lin[] = {"feature_map=taylor", "eps=1e-4"};
    check_op_variant("linear", 2, lin);
    const char *lsh[] = {"rounds=2", "bits=2", "chunk=4", "combine=logsumexp"};
    check_op_variant("lsh", 4, lsh);
}

Test(cli, op_forward_only_writes_out) {
    int status = run("--threads", "1", "op", "--variant", "softmax", "--q", P("q.npy"), "--k", P("k.npy"), "--v",
                     P("v.npy"), "--out", P("fwd/sub"), NULL);
    cr_assert_eq(status, 0, "%s", g_stderr);
    cr_assert(tp_exists(P("fwd/sub/out.npy")), "--out folder is created");
    cr_assert_not(tp_exists(P("fwd/sub/dq.npy")), "no gradients without --dout");
    float *out = tu_alloc_f(NV);
    library_op("softmax", 0, NULL, 0, false, NULL, out, NULL, NULL, NULL);
    expect_same("fwd/sub/out.npy", out, NV, M, "softmax non-causal");
    free(out);
}

Test(cli, op_recurrent_linear_matches_causal) {
    int status = run("--threads", "1", "op", "--variant", "linear", "--causal", "--mode", "recurrent", "--q",
                     P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy"), "--out", P("rec"), NULL);
    cr_assert_eq(status, 0, "%s", g_stderr);
    float *want = tu_alloc_f(NV);
    library_op("linear", 0, NULL, 0, true, NULL, want, NULL, NULL, NULL);
    ab_array got, v;
    load("rec/out.npy", &got);
    expect_shape4(&got, B, H, N, M, "recurrent out");
    load("v.npy", &v);
    double vmax = 0;
    for (size_t i = 0; i < NV; i++) vmax = fmax(vmax, fabs(((const float *)v.data)[i]));
    /* Both compute out_i = sum_j w_ij v_j / sum_j w_ij with w_ij = phi(q_i).phi(k_j) >= 0
     * (elu+1 features), only in another order (recurrent sums S = sum phi(k) v^T first,
     * the parallel form may form Q K^T per chunk). Float32 sums of N products of C = D
     * features have relative error <= (N + C) u in the numerator's absolute sum and the
     * denominator, so |diff| <= 2 (N + C + 2) u max|v| to first order; we allow
     * 4 (N + D + 2) FLT_EPSILON max|v| (FLT_EPSILON = 2u), i.e. 4x slack: ~1e-5 here. */
    double tol = 4.0 * (N + D + 2) * FLT_EPSILON * vmax;
    const float *g = got.data;
    for (size_t i = 0; i < NV; i++)
        cr_assert(fabs((double)g[i] - want[i]) <= tol, "out[%zu]: recurrent %.9g, causal parallel %.9g (tol %.3g)", i,
                  g[i], want[i], tol);
    ab_array_free(&got);
    ab_array_free(&v);
    free(want);
}

Test(cli, op_lengths_int32_and_int64) {
    /* int32 lengths {9, 4} and int64 lengths {6, 0}; compared with the library given the
     * same lengths; padded query rows are zero, and a length of 0 zeroes the batch. */
    static const struct {
        const char *file;
        int len[B];
    } cases[] = {{"len32.npy", {N, 4}}, {"len64.npy", {6, 0}}};
    static const char *const variants[] = {"softmax", "linear"};
    for (int vi = 0; vi < 2; vi++)
        for (int c = 0; c < 2; c++) {
            char dir[64], file[80];
            snprintf(dir, sizeof dir, "len-%s-%d", variants[vi], c);
            int status = run("--threads", "1", "op", "--variant", variants[vi], "--q", P("q.npy"), "--k", P("k.npy"),
                             "--v", P("v.npy"), "--lengths", P(cases[c].file), "--out", P(dir), NULL);
            cr_assert_eq(status, 0, "%s %s: %s", variants[vi], cases[c].file, g_stderr);
            float *want = tu_alloc_f(NV);
            library_op(variants[vi], 0, NULL, 0, false, cases[c].len, want, NULL, NULL, NULL);
            snprintf(file, sizeof file, "%s/out.npy", dir);
            expect_same(file, want, NV, M, cases[c].file);
            ab_array got;
            load(file, &got);
            const float *g = got.data;
            for (int b = 0; b < B; b++)
                for (int h = 0; h < H; h++)
                    for (int i = cases[c].len[b]; i < N; i++)
                        for (int m = 0; m < M; m++)
                            cr_assert_eq(g[(((size_t)b * H + h) * N + i) * M + m], 0.0f,
                                         "%s: padded row b=%d i=%d is not zero", cases[c].file, b, i);
            ab_array_free(&got);
            free(want);
        }
}
