/* The cli suite's --device cuda cases and the refusals of issue 16 (part of test_cli;
 * the suite is described in test_cli.c, its scratch folder and runners in
 * test_cli.h). */
#include "test_cli.h"

/* ------------------------------------------------------------------------------------
 * --device cuda
 * ---------------------------------------------------------------------------------- */

Test(cli, op_cuda_without_device) {
    /* The real binary where the build or the machine has no CUDA: one line, status 2. */
    if (ab_cuda_init() == 0) cr_skip_test("this machine has a CUDA device");
    int status = run("op", "--variant", "softmax", "--device", "cuda", "--q", P("q.npy"), "--k", P("k.npy"), "--v",
                     P("v.npy"), "--out", P("cuda-nodev"), NULL);
    const char *must[] = {"CUDA", NULL};
    expect_usage_error(status, "op --device cuda without a device", must);
    cr_assert_not(tp_exists(P("cuda-nodev/out.npy")));
}

/* op on the emulated binary: --device cuda against the library on the CPU. The two
 * differ by float summation order only (test_cuda.c: FWD_TOL, BWD_TOL). */
static void expect_close(const char *file, const float *want, size_t n, double tol, const char *what) {
    ab_array a;
    load(file, &a);
    cr_assert_eq(a.count, n);
    double *w = tu_to_double(want, n);
    double err = tu_rel_err(a.data, w, n, 1e-3);
    cr_assert(err <= tol, "%s: %s differs from the CPU library by %.3g (rel)", what, file, err);
    free(w);
    ab_array_free(&a);
}

Test(cli, op_cuda_emulated_equals_cpu) {
    static const char *const variants[] = {"softmax", "stateful-softmax", "linear", "polynomial",
                                           "lsh"}; /* lsh: seed 0 on both */
    for (int vi = 0; vi < 5; vi++) {
        char dir[64], f[96];
        snprintf(dir, sizeof dir, "cuda-%s", variants[vi]);
        const char *args[] = {"op",       "--variant", variants[vi], "--device", "cuda",          "--causal",
                              "--q",      P("q.npy"),  "--k",        P("k.npy"), "--v",           P("v.npy"),
                              "--dout",   P("dout.npy"), "--lengths", P("len32.npy"), "--out",     P(dir),
                              NULL};
        int status = run_exe_argv(ATTNBENCH_EMU_EXE, NULL, args);
        cr_assert_eq(status, 0, "%s: exit %d: %s", variants[vi], status, g_stderr);
        float *out = tu_alloc_f(NV), *dq = tu_alloc_f(NQ), *dk = tu_alloc_f(NQ), *dv = tu_alloc_f(NV);
        const int len[B] = {N, 4};
        library_op(variants[vi], 0, NULL, 0, true, len, out, dq, dk, dv);
        snprintf(f, sizeof f, "%s/out.npy", dir);
        expect_close(f, out, NV, 4e-5, variants[vi]);
        snprintf(f, sizeof f, "%s/dq.npy", dir);
        expect_close(f, dq, NQ, 1e-4, variants[vi]);
        snprintf(f, sizeof f, "%s/dk.npy", dir);
        expect_close(f, dk, NQ, 1e-4, variants[vi]);
        snprintf(f, sizeof f, "%s/dv.npy", dir);
        expect_close(f, dv, NV, 1e-4, variants[vi]);
        free(out), free(dq), free(dk), free(dv);
    }
    /* recurrent mode on the device: equals the causal forward */
    const char *rec[] = {"op",  "--variant", "stateful-softmax", "--device", "cuda", "--causal", "--mode", "recurrent",
                         "--q", P("q.npy"),  "--k",              P("k.npy"), "--v",  P("v.npy"), "--out",  P("cuda-rec"),
                         NULL};
    int status = run_exe_argv(ATTNBENCH_EMU_EXE, NULL, rec);
    cr_assert_eq(status, 0, "recurrent: exit %d: %s", status, g_stderr);
    float *out = tu_alloc_f(NV);
    library_op("stateful-softmax", 0, NULL, 0, true, NULL, out, NULL, NULL, NULL);
    expect_close("cuda-rec/out.npy", out, NV, 4e-5, "recurrent on cuda");
    free(out);
}

Test(cli, op_cuda_emulated_refusals) {
    /* A mode the variant lacks on the device (every variant has a CUDA implementation;
     * lsh has no recurrent mode there either), and no device at all: one line, status 2. */
    const char *lin[] = {"op", "--variant", "lsh", "--device", "cuda", "--causal", "--mode", "recurrent", "--q",
                         P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy"), "--out", P("cuda-lin"), NULL};
    const char *must_lin[] = {"lsh", "recurrent", NULL};
    expect_usage_error(run_exe_argv(ATTNBENCH_EMU_EXE, NULL, lin), "lsh recurrent on cuda", must_lin);
    const char *sm[] = {"op", "--variant", "softmax", "--device", "cuda", "--q", P("q.npy"), "--k", P("k.npy"),
                        "--v", P("v.npy"), "--out", P("cuda-nodev"), NULL};
    const char *must_dev[] = {"no CUDA device", NULL};
    expect_usage_error(run_exe_argv(ATTNBENCH_EMU_EXE, "AB_EMU_NO_DEVICE=1", sm), "no device", must_dev);
    cr_assert_not(tp_exists(P("cuda-lin/out.npy")) || tp_exists(P("cuda-nodev/out.npy")));
}

/* ------------------------------------------------------------------------------------
 * Issue 16: refusals that used to go wrong
 * ---------------------------------------------------------------------------------- */

/* Defect 3: `--out ''` was the root folder (ab_mkdir_p("") succeeded and outputs were
 * joined as "%s/%s": /out.npy, /q.npy, ...). Every command refuses it, and nothing
 * appears in the root folder (the tests may run as root). */
Test(cli, empty_out_refused_nothing_written_in_the_root) {
    static const char *const root_files[] = {"/out.npy",    "/q.npy",     "/k.npy",         "/v.npy",
                                             "/dout.npy",   "/train.json", "/train.tsv",     "/checkpoint.bin"};
    enum { N_ROOT = sizeof root_files / sizeof *root_files };
    bool there[N_ROOT];
    for (int i = 0; i < N_ROOT; i++) there[i] = tp_exists(root_files[i]);
    /* tp_usage_error only records failures (cr_expect): the root folder is cleaned
     * below whatever happened */
    const char *must[] = {"--out", "empty path", NULL};
    int st = run("--threads", "1", "op", "--variant", "softmax", "--q", P("q.npy"), "--k", P("k.npy"), "--v",
                 P("v.npy"), "--out", "", NULL);
    tp_usage_error(st, g_stderr, "op --out ''", must);
    st = run("inputs", "--shape", "1,1,2,2,2", "--out", "", NULL);
    tp_usage_error(st, g_stderr, "inputs --out ''", must);
    st = run("bench", ATTNBENCH_SOURCE_DIR "/experiments/sweep/smoke.json", "--out", "", NULL);
    tp_usage_error(st, g_stderr, "bench --out ''", must);
    st = run("--threads", "1", "train", ATTNBENCH_SOURCE_DIR "/experiments/copy/smoke.json", "--out", "", NULL);
    tp_usage_error(st, g_stderr, "train --out ''", must);
    st = run("generate", P("nothing.bin"), "--out", "", NULL);
    tp_usage_error(st, g_stderr, "generate --out ''", must);
    st = run("plot", P("nothing.json"), "--out", "", NULL);
    tp_usage_error(st, g_stderr, "plot --out ''", must);
    for (int i = 0; i < N_ROOT; i++) {
        bool made = !there[i] && tp_exists(root_files[i]);
        if (made) remove(root_files[i]); /* left by the bug: not kept */
        cr_expect_not(made, "%s was written", root_files[i]);
    }
}

/* Defect 9: a newline in a path (or in anything a message quotes) gave a two-line
 * error; the message is one line, the newline written as \n. */
Test(cli, newline_in_a_path_gives_one_line) {
    const char *must[] = {"no\\nsuch.npy", NULL};
    expect_usage_error(run("--threads", "1", "op", "--variant", "softmax", "--q", P("no\nsuch.npy"), "--k",
                           P("k.npy"), "--v", P("v.npy"), "--out", P("o"), NULL),
                       "--q with a newline", must);
    const char *must_tab[] = {"bad\\tname", NULL};
    expect_usage_error(run("--threads", "1", "op", "--variant", "bad\tname", "--q", P("q.npy"), "--k", P("k.npy"),
                           "--v", P("v.npy"), "--out", P("o"), NULL),
                       "variant with a tab", must_tab);
    const char *must_cfg[] = {"x\\ny.json", NULL};
    expect_usage_error(run("bench", P("x\ny.json"), NULL), "config path with a newline", must_cfg);
}

/* Defect 9: a FIFO given as an input blocked the command until some writer opened it.
 * Each command refuses it at once (one line, status 2); a run that hangs is killed
 * after 20 s and fails the test. */
static void expect_fifo_refused(const char *what, const char *const *args) {
    pid_t pid = tp_spawn(g_dir, ATTNBENCH_EXE, NULL, args);
    int status = tp_wait_for(g_dir, pid, 20, &g_stdout, &g_stderr);
    cr_expect_neq(status, 128 + 9, "%s: still blocked after 20 s", what);
    const char *must[] = {"not a regular file (a FIFO)", NULL};
    expect_usage_error(status, what, must);
}

Test(cli, fifo_inputs_refused_without_blocking) {
    const char *fifo = P("input.fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0, "mkfifo: %s", strerror(errno));
    expect_fifo_refused("op --q FIFO", TP_ARGV("--threads", "1", "op", "--variant", "softmax", "--q", fifo, "--k",
                                               P("k.npy"), "--v", P("v.npy"), "--out", P("o"), NULL));
    expect_fifo_refused("op --lengths FIFO",
                        TP_ARGV("--threads", "1", "op", "--variant", "softmax", "--q", P("q.npy"), "--k", P("k.npy"),
                                "--v", P("v.npy"), "--lengths", fifo, "--out", P("o"), NULL));
    expect_fifo_refused("bench FIFO", TP_ARGV("--threads", "1", "bench", fifo, "--out", P("b.json"), NULL));
    expect_fifo_refused("train FIFO", TP_ARGV("--threads", "1", "train", fifo, "--out", P("t"), NULL));
    expect_fifo_refused("plot FIFO", TP_ARGV("plot", fifo, NULL));
    expect_fifo_refused("generate FIFO", TP_ARGV("--threads", "1", "generate", fifo, NULL));
    /* a run folder whose checkpoint is a FIFO */
    cr_assert_eq(ab_mkdir_p(P("run")), 0);
    cr_assert_eq(mkfifo(P("run/checkpoint.bin"), 0600), 0, "mkfifo: %s", strerror(errno));
    expect_fifo_refused("train --resume with a FIFO checkpoint",
                        TP_ARGV("--threads", "1", "train", "--resume", "--out", P("run"), NULL));
    cr_assert_not(tp_exists(P("o/out.npy")) || tp_exists(P("b.json")) || tp_exists(P("t/train.json")));
}

/* Writes a .npy header for float32 `shape` and extends the file, sparse, to its full
 * size: gigabytes of zeros that take no disk. */
static void write_sparse_f32(const char *path, int ndim, const int64_t *shape) {
    char dict[256];
    int len = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        len += snprintf(dict + len, sizeof dict - (size_t)len, "%lld, ", (long long)shape[i]);
        count *= (uint64_t)shape[i];
    }
    len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
    size_t pad = (64 - (10 + (size_t)len + 1) % 64) % 64, hlen = (size_t)len + pad + 1;
    unsigned char head[512];
    memcpy(head, "\x93NUMPY\x01\x00", 8);
    head[8] = (unsigned char)(hlen & 0xff);
    head[9] = (unsigned char)(hlen >> 8);
    memcpy(head + 10, dict, (size_t)len);
    memset(head + 10 + len, ' ', pad);
    head[10 + hlen - 1] = '\n';
    tp_write_bytes(path, head, 10 + hlen);
    cr_assert_eq(truncate(path, (off_t)(10 + hlen + 4 * count)), 0, "truncate: %s", strerror(errno));
}

/* Runs `attnbench ARGS` (NULL-terminated) under `ulimit -v KB`, killed after 120 s. */
static int run_limited(long kb, const char *const *args) {
    char lim[32];
    snprintf(lim, sizeof lim, "%ld", kb);
    const char *full[64] = {"-c", TP_ULIMIT_SCRIPT, "sh", lim, ATTNBENCH_EXE};
    int n = 5;
    for (int i = 0; args[i]; i++) full[n++] = args[i];
    full[n] = NULL;
    return tp_wait_for(g_dir, tp_spawn(g_dir, "/bin/sh", NULL, full), 120, &g_stdout, &g_stderr);
}

/* Defect 9: out of memory was exit status 1 in some places and 2 in others (op's
 * inputs, train's checkpoint). The rule (cli_util.h, attnbench --help): always 1, with
 * one line. Here a valid 2 GiB .npy (sparse) under a 1.5 GB address-space limit, for
 * op; a 2 GiB checkpoint file for train --resume and generate (its header is read and
 * checked first: the file is what it says, then it cannot be held in memory). */
Test(cli, out_of_memory_is_exit_status_1_everywhere) {
    if (TEST_SANITIZED) cr_skip_test("needs an address-space limit, which a sanitized binary cannot start under");
    const int64_t big[4] = {1, 1, 1 << 27, 4}; /* 2 GiB */
    write_sparse_f32(P("big_q.npy"), 4, big);
    int st = run_limited(1500000, TP_ARGV("--threads", "1", "op", "--variant", "linear", "--q", P("big_q.npy"), "--k",
                                          P("k.npy"), "--v", P("v.npy"), "--out", P("oom"), NULL));
    cr_expect_eq(st, 1, "op out of memory: exit status %d: %s", st, g_stderr);
    cr_expect(strncmp(g_stderr, "attnbench: error: ", 18) == 0 && strstr(g_stderr, "out of memory") &&
                  strchr(g_stderr, '\n') == g_stderr + strlen(g_stderr) - 1,
              "op: not one line about memory: %s", g_stderr);
    cr_expect_not(tp_exists(P("oom/out.npy")));

    /* a checkpoint header promising 2 GiB, in a file of that size */
    const uint64_t file_bytes = 2ull << 30;
    unsigned char h[64] = {0x89, 'A', 'B', 'K', '\r', '\n', 0x1a, '\n'};
    uint32_t u32[7] = {1, 0x01020304u, 64, 64, 0, 0, 64}; /* version, order, sizes, count, capacity, alignment */
    memcpy(h + 8, u32, sizeof u32);
    const uint64_t data_off = 64;
    memcpy(h + 40, &data_off, 8);
    memcpy(h + 48, &file_bytes, 8);
    /* table CRC of an empty table (0), then the header CRC (zlib crc32 of the header
     * with its own field zero), computed here as the reader does */
    uint32_t crc = 0xffffffffu;
    for (int i = 0; i < 64; i++) {
        crc ^= h[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
    }
    crc ^= 0xffffffffu;
    memcpy(h + 36, &crc, 4);
    cr_assert_eq(ab_mkdir_p(P("bigrun")), 0);
    tp_write_bytes(P("bigrun/checkpoint.bin"), h, sizeof h);
    cr_assert_eq(truncate(P("bigrun/checkpoint.bin"), (off_t)file_bytes), 0, "truncate: %s", strerror(errno));
    st = run_limited(1500000, TP_ARGV("--threads", "1", "train", "--resume", "--out", P("bigrun"), NULL));
    cr_expect_eq(st, 1, "train --resume out of memory: exit status %d: %s", st, g_stderr);
    cr_expect(strstr(g_stderr, "cannot allocate") && strchr(g_stderr, '\n') == g_stderr + strlen(g_stderr) - 1,
              "train --resume: %s", g_stderr);
    st = run_limited(1500000, TP_ARGV("--threads", "1", "generate", P("bigrun/checkpoint.bin"), NULL));
    cr_expect_eq(st, 1, "generate out of memory: exit status %d: %s", st, g_stderr);
    /* without the limit the same file is refused as bad input: its table is not valid */
    st = run("--threads", "1", "generate", P("bigrun/checkpoint.bin"), NULL);
    const char *must[] = {"bad checkpoint table", NULL};
    expect_usage_error(st, "generate on the 2 GiB file without a limit", must);
}

/* Defect 4 and 9: plot passed the data file's name to a shell inside '...' (a quote in
 * a result's name ran commands, or broke the figure), and wrote labels raw into the
 * figure's data (a newline split a row). The scripts run no shell now; labels become
 * one word. */
static bool have_gnuplot(void) { return system("command -v gnuplot >/dev/null 2>&1") == 0; }

/* Every line of a TSV has `tabs` tabs; returns the line count. */
static int tsv_lines(const char *path, int tabs) {
    char *t = tp_slurp(path, NULL);
    int lines = 0, k = 0;
    for (char *c = t; *c; c++) {
        if (*c == '\t') k++;
        if (*c == '\n') {
            cr_expect_eq(k, tabs, "%s line %d has %d tabs", path, lines + 1, k);
            lines++;
            k = 0;
        }
    }
    free(t);
    return lines;
}

Test(cli, plot_names_with_quotes_and_newlines_run_no_shell) {
    if (!have_gnuplot()) cr_skip_test("gnuplot is not installed");
    cr_assert_eq(ab_mkdir_p(P("inj")), 0);
    /* a sweep (Figure 1) and two training runs (Figure 2), labels with quotes, blanks and
     * newlines, in files whose names would have run `touch INJECTED` */
    const char *sweep =
        "{\"schema\": \"attnbench/run/1\", \"config\": {\"name\": \"s\", \"causal\": true, \"heads\": 1, \"qk_dim\": 2,"
        " \"v_dim\": 2}, \"records\": ["
        "{\"kind\": \"parallel\", \"variant\": \"lin ear\\n'x'\", \"len\": 16, \"batch\": 4, \"status\": \"ok\","
        " \"per_sample_fwd_bwd_ms\": 0.1, \"peak_bytes_per_sample\": 1000},"
        "{\"kind\": \"parallel\", \"variant\": \"lin ear\\n'x'\", \"len\": 32, \"batch\": 2, \"status\": \"ok\","
        " \"per_sample_fwd_bwd_ms\": 0.3, \"peak_bytes_per_sample\": 2000},"
        "{\"kind\": \"parallel\", \"variant\": \"soft\", \"len\": 16, \"batch\": 4, \"status\": \"ok\","
        " \"per_sample_fwd_bwd_ms\": 0.2, \"peak_bytes_per_sample\": 3000},"
        "{\"kind\": \"parallel\", \"variant\": \"soft\", \"len\": 32, \"batch\": 2, \"status\": \"oom\","
        " \"per_sample_fwd_bwd_ms\": null, \"peak_bytes_per_sample\": null}]}";
    const char *name = "x';touch INJECTED;'";
    char path[900], tsv[900], png[900];
    snprintf(path, sizeof path, "%s/%s.json", P("inj"), name);
    tp_write_bytes(path, sweep, strlen(sweep));
    bool was_there = tp_exists("INJECTED");
    int st = run("plot", path, NULL);
    cr_expect_eq(st, 0, "plot of %s: %s", path, g_stderr);
    bool injected = !was_there && tp_exists("INJECTED");
    if (injected) remove("INJECTED");
    cr_expect_not(injected || tp_exists(P("inj/INJECTED")), "the file name ran a shell command");
    snprintf(tsv, sizeof tsv, "%s/%s.plot.tsv", P("inj"), name);
    snprintf(png, sizeof png, "%s/%s.svg", P("inj"), name);
    cr_expect_eq(tsv_lines(tsv, 6), 1 + 4);
    char *svg = tp_slurp(png, NULL);
    cr_expect(strstr(svg, "lin_ear__x_") && strstr(svg, "soft"), "Figure 1 legend lacks the variants");
    free(svg);

    const char *run_a = "{\"schema\": \"attnbench/run/1\", \"task\": \"copy\", \"config\": {\"name\": \"a\","
                        " \"label\": \"two\\nlines 'q' \\\"d\\\"\"}, \"records\": ["
                        "{\"kind\": \"eval\", \"step\": 0, \"eval_loss\": 2.0},"
                        "{\"kind\": \"train\", \"step\": 5, \"loss\": 1.5},"
                        "{\"kind\": \"train\", \"step\": 10, \"loss\": 1.2},"
                        "{\"kind\": \"eval\", \"step\": 10, \"eval_loss\": 1.1}]}";
    const char *run_b = "{\"schema\": \"attnbench/run/1\", \"task\": \"copy\", \"config\": {\"name\": \"b\"},"
                        " \"records\": [{\"kind\": \"train\", \"step\": 5, \"loss\": 1.7},"
                        "{\"kind\": \"train\", \"step\": 10, \"loss\": 1.0}]}";
    snprintf(path, sizeof path, "%s/%s.json", P("inj"), "it's run\na");
    tp_write_bytes(path, run_a, strlen(run_a));
    tp_write_bytes(P("inj/b.json"), run_b, strlen(run_b));
    st = run("plot", path, P("inj/b.json"), "--out", P("inj/fig 'two'"), NULL);
    cr_expect_eq(st, 0, "plot of training runs: %s", g_stderr);
    injected = !was_there && tp_exists("INJECTED");
    if (injected) remove("INJECTED");
    cr_expect_not(injected);
    cr_expect_eq(tsv_lines(P("inj/fig 'two'.plot.tsv"), 3), 1 + 6);
    svg = tp_slurp(P("inj/fig 'two'.svg"), NULL);
    cr_expect(strstr(svg, "two_lines__q___d_") && strstr(svg, ">b<"), "Figure 2 legend lacks the runs");
    free(svg);
}

/* Defect 9: main() did not free its copy of the arguments, so every run failed under a
 * leak checker. Checked with valgrind where it is installed and can run this build
 * (it cannot execute AVX-512 code: such a build skips). */
Test(cli, no_leak_at_exit) {
    if (TEST_SANITIZED)
        cr_skip_test("an AddressSanitizer build: LeakSanitizer checks every run, and valgrind cannot run it");
    if (system("command -v valgrind >/dev/null 2>&1") != 0) cr_skip_test("valgrind is not installed");
    const char *args[] = {"-c", "exec valgrind -q --leak-check=full --show-leak-kinds=definite "
                                "--errors-for-leak-kinds=definite --error-exitcode=99 \"$@\"",
                          "sh", ATTNBENCH_EXE, "--threads", "1", "list", NULL};
    int st = tp_wait_for(g_dir, tp_spawn(g_dir, "/bin/sh", NULL, args), 120, &g_stdout, &g_stderr);
    if (st == 128 + 4 || strstr(g_stderr, "unhandled instruction") || strstr(g_stderr, "Illegal"))
        cr_skip_test("valgrind cannot run this build's instructions");
    cr_expect_eq(st, 0, "valgrind: exit status %d: %s", st, g_stderr);
    cr_expect_null(strstr(g_stderr, "definitely lost"), "%s", g_stderr);
}
