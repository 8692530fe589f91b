/* The harness suite's atomic writes and regular-file checks (harness/fileio.h) and the
 * JSON configs (harness/config.h) (part of test_harness; its scratch folder and
 * helpers are declared in test_harness.h). */
#include "test_harness.h"

/* ------------------------------------------------------------------------------------
 * Atomic writes (fileio.h)
 * ---------------------------------------------------------------------------------- */

TestSuite(fileio, .init = scratch_setup, .fini = scratch_teardown);

/* Number of entries in the scratch folder whose name contains `part`. */
static int count_named(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int c = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, part)) c++;
    closedir(d);
    return c;
}

Test(fileio, no_temporary_left_behind) {
    const float x[3] = {1, 2, 3};
    const int64_t s[1] = {3};
    for (int i = 0; i < 3; i++) cr_assert_eq(ab_npy_write(path_in("a.npy"), AB_F32, 1, s, x), 0);
    cr_assert_eq(count_named(g_dir, ".tmp."), 0, "a temporary file is left in %s", g_dir);
    cr_assert_eq(count_named(g_dir, "a.npy"), 1);
}

Test(fileio, missing_folder_fails_and_creates_nothing) {
    const float x[3] = {1, 2, 3};
    const int64_t s[1] = {3};
    char p[1024];
    snprintf(p, sizeof p, "%s/nosuchdir/out.npy", g_dir);
    ab_clear_error();
    int rc = ab_npy_write(p, AB_F32, 1, s, x);
    cr_assert_lt(rc, 0);
    cr_assert(strstr(ab_error(), p) != NULL, "message '%s' does not name the path", ab_error());
    cr_assert_not(tp_exists(path_in("nosuchdir")), "the missing folder was created");
    cr_assert_not(tp_exists(p));
}

Test(fileio, existing_file_replaced_whole) {
    float big[1000];
    for (int i = 0; i < 1000; i++) big[i] = (float)i;
    const int64_t sb[1] = {1000}, ss[1] = {2};
    const float small[2] = {-1, -2};
    cr_assert_eq(ab_npy_write(path_in("r.npy"), AB_F32, 1, sb, big), 0);
    cr_assert_eq(ab_npy_write(path_in("r.npy"), AB_F32, 1, ss, small), 0);
    size_t n;
    unsigned char *raw = tp_read_bytes(path_in("r.npy"), &n);
    cr_assert_eq(n, 128u + sizeof small, "old bytes remain after the new file's end");
    free(raw);
    ab_array a;
    cr_assert_eq(ab_npy_read(path_in("r.npy"), &a), 0, "%s", ab_error());
    cr_assert_eq(a.count, 2u);
    cr_assert_eq(memcmp(a.data, small, sizeof small), 0);
    ab_array_free(&a);
}

Test(fileio, abort_keeps_old_file) {
    tp_write_bytes(path_in("keep.txt"), "old", 3);
    ab_atomic_file af;
    cr_assert_eq(ab_atomic_open(&af, path_in("keep.txt")), 0, "%s", ab_error());
    fputs("new contents that must not appear", af.f);
    ab_atomic_abort(&af);
    size_t n;
    unsigned char *raw = tp_read_bytes(path_in("keep.txt"), &n);
    cr_assert_eq(n, 3u);
    cr_assert_eq(memcmp(raw, "old", 3), 0);
    free(raw);
    cr_assert_eq(count_named(g_dir, ".tmp."), 0);

    /* Until commit, readers still see the old file. */
    cr_assert_eq(ab_atomic_open(&af, path_in("keep.txt")), 0);
    fputs("new", af.f);
    fputs("er", af.f);
    raw = tp_read_bytes(path_in("keep.txt"), &n);
    cr_assert_eq(n, 3u);
    cr_assert_eq(memcmp(raw, "old", 3), 0);
    free(raw);
    cr_assert_eq(ab_atomic_commit(&af), 0, "%s", ab_error());
    raw = tp_read_bytes(path_in("keep.txt"), &n);
    cr_assert_eq(n, 5u);
    cr_assert_eq(memcmp(raw, "newer", 5), 0);
    free(raw);
}

/* A writer killed between open and commit (kill -9) leaves PATH.tmp.HOST.PID.N; the next
 * writer of PATH removes it (issue 28, defect 7: checkpoint-sized files piled up, even
 * past a resume that ran to the end). A live writer's temporary, another machine's (a
 * shared file system) and another file's are left alone. */
Test(fileio, a_dead_writers_temporary_is_removed_by_the_next_writer) {
    const char *path = path_in("ckpt.bin");
    tp_write_bytes(path, "old", 3);
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) { /* opens, writes half, and dies as kill -9 would have it */
        ab_atomic_file af;
        if (ab_atomic_open(&af, path) == 0) {
            fputs("half of a checkpoint", af.f);
            fflush(af.f);
        }
        raise(SIGKILL);
        _exit(3);
    }
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    cr_assert_eq(count_named(g_dir, ".tmp."), 1, "the dead writer's temporary is there");
    /* beside it: another machine's (a dead PID there means nothing here), another file's */
    char other_host[1100], other_file[1100];
    snprintf(other_host, sizeof other_host, "%s.tmp.some-other-node.%d.0", path, (int)child);
    tp_write_bytes(other_host, "x", 1);
    DIR *d = opendir(g_dir);
    for (struct dirent *e; (e = readdir(d));) /* the dead one's name, for another base */
        if (strstr(e->d_name, "ckpt.bin.tmp.") && !strstr(e->d_name, "some-other-node"))
            snprintf(other_file, sizeof other_file, "%s/x%s", g_dir, e->d_name);
    closedir(d);
    tp_write_bytes(other_file, "x", 1);
    /* a live writer of the same path, mid-write */
    ab_atomic_file live;
    cr_assert_eq(ab_atomic_open(&live, path), 0, "%s", ab_error());
    fputs("new", live.f);
    cr_assert_eq(count_named(g_dir, "ckpt.bin.tmp."), 3, "the dead writer's temporary is gone, the others stay");
    cr_expect(tp_exists(other_host) && tp_exists(other_file));
    /* a second writer while the first is live: the live one's temporary stays */
    ab_atomic_file second;
    cr_assert_eq(ab_atomic_open(&second, path), 0, "%s", ab_error());
    ab_atomic_abort(&second);
    cr_assert_eq(ab_atomic_commit(&live), 0, "the live writer's temporary was removed under it: %s", ab_error());
    cr_assert_eq(count_named(g_dir, "ckpt.bin.tmp."), 2, "other_host and other_file only");
    size_t n;
    unsigned char *raw = tp_read_bytes(path, &n);
    cr_expect(n == 3 && memcmp(raw, "new", 3) == 0);
    free(raw);
}

Test(fileio, mkdir_p) {
    char p[1024];
    snprintf(p, sizeof p, "%s/a/b/c", g_dir);
    cr_assert_eq(ab_mkdir_p(p), 0, "%s", ab_error());
    struct stat st;
    cr_assert(stat(p, &st) == 0 && S_ISDIR(st.st_mode));
    cr_assert_eq(ab_mkdir_p(p), 0, "existing folders are fine");
    tp_write_bytes(path_in("file"), "x", 1);
    snprintf(p, sizeof p, "%s/file/sub", g_dir);
    ab_clear_error();
    cr_assert_lt(ab_mkdir_p(p), 0, "a file in the way is an error");
    cr_assert_neq(ab_error()[0], '\0');
}

/* Issue 16: an empty path is not the root folder. */
Test(fileio, mkdir_p_refuses_an_empty_path) {
    ab_clear_error();
    cr_assert_eq(ab_mkdir_p(""), AB_EINVAL);
    cr_assert(strstr(ab_error(), "empty path"), "%s", ab_error());
}

/* Issue 16: inputs that are not regular files are refused at once. A FIFO used to
 * block the reader until some writer opened it (forever, in a script); alarm() turns
 * such a hang into a failure of this test. */
Test(fileio, fifo_and_folder_inputs_refused_without_blocking) {
    alarm(20);
    const char *fifo = path_in("input.fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0, "mkfifo: %s", strerror(errno));
    ab_array a;
    ab_clear_error();
    cr_assert_eq(ab_npy_read(fifo, &a), AB_EINVAL, "%s", ab_error());
    cr_assert(strstr(ab_error(), fifo) && strstr(ab_error(), "not a regular file (a FIFO)"), "%s", ab_error());
    cr_assert_null(a.data);
    ab_clear_error();
    cr_assert_null(ab_config_load(fifo));
    cr_assert(strstr(ab_error(), "cannot read config") && strstr(ab_error(), "not a regular file (a FIFO)"), "%s",
              ab_error());
    int rc = 0;
    cr_assert_null(ab_fopen_regular(fifo, "input", &rc));
    cr_assert_eq(rc, AB_EINVAL);
    cr_assert(strstr(ab_error(), "cannot read input "), "%s", ab_error());
    /* a folder, and a missing file */
    cr_assert_eq(ab_npy_read(g_dir, &a), AB_EINVAL);
    cr_assert(strstr(ab_error(), "not a regular file (a folder)"), "%s", ab_error());
    cr_assert_null(ab_config_load(path_in("missing.json")));
    cr_assert(strstr(ab_error(), "missing.json") && contains_nocase(ab_error(), "no such file"), "%s", ab_error());
    /* a regular file still reads */
    FILE *f = ab_fopen_regular(ATTNBENCH_SOURCE_DIR "/tests/harness/test_harness.c", "source", &rc);
    cr_assert_not_null(f, "%s", ab_error());
    cr_assert_eq(rc, 0);
    cr_assert_neq(fgetc(f), EOF);
    fclose(f);
    alarm(0);
}

/* ------------------------------------------------------------------------------------
 * Configs (config.h)
 * ---------------------------------------------------------------------------------- */

TestSuite(config, .init = scratch_setup, .fini = scratch_teardown);

/* Issue 16, defect 7: a dotted path with an empty segment names no key; it used to be
 * skipped ("--set .=1" and "--set ..=1" changed nothing and succeeded, "a..b" set
 * a.b). Each is an error like an unknown key, and the config is left as it was. */
Test(config, set_refuses_empty_keys) {
    json_error_t je;
    json_t *root = json_loads("{\"a\": {\"b\": 1}, \"c\": [1, 2]}", 0, &je);
    cr_assert_not_null(root);
    json_t *before = json_deep_copy(root);
    const char *bad[] = {".=1", "..=1", "...=1", ".a=1", "a.=1", "a..b=2", "c..0=5", "a.b.=3"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        for (int allow_new = 0; allow_new < 2; allow_new++) {
            ab_clear_error();
            cr_expect_eq(ab_config_set(root, bad[i], allow_new), AB_EINVAL, "--set %s (allow_new %d) accepted", bad[i],
                         allow_new);
            cr_expect(strstr(ab_error(), "--set ") && strstr(ab_error(), "empty key"), "--set %s: %s", bad[i],
                      ab_error());
            cr_expect(json_equal(root, before), "--set %s (allow_new %d) changed the config", bad[i], allow_new);
        }
    }
    /* what is fine stays fine */
    cr_assert_eq(ab_config_set(root, "a.b=7", false), 0, "%s", ab_error());
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(root, "a"), "b")), 7);
    cr_assert_eq(ab_config_set(root, "c.1=9", false), 0, "%s", ab_error());
    cr_assert_eq(json_integer_value(json_array_get(json_object_get(root, "c"), 1)), 9);
    cr_assert_eq(ab_config_set(root, "=1", false), AB_EINVAL);
    json_decref(before);
    json_decref(root);
}

/* Found by the fuzz target tests/fuzz/fuzz_config.c: a key that is not UTF-8 (jansson
 * refuses such keys) was dropped silently, and with allow_new a new object on the way
 * to it was freed by jansson and then used (`train --set 'model.attention.set.\xff.x=1'`
 * reached it). A plain-text value that is not UTF-8 was dropped silently too. Each is
 * now refused, the config unchanged. */
Test(config, set_refuses_keys_and_text_that_are_not_utf8) {
    json_error_t je;
    json_t *root = json_loads("{\"a\": {\"b\": 1}, \"c\": [1, 2]}", 0, &je);
    cr_assert_not_null(root);
    json_t *before = json_deep_copy(root);
    const char *bad_key[] = {"\xff=1", "a.\xfe\xff=1", "a.\x80.x=1", "new.\xc3.x=1", "a.b\xe2\x82=2"};
    for (size_t i = 0; i < sizeof bad_key / sizeof *bad_key; i++) {
        for (int allow_new = 0; allow_new < 2; allow_new++) {
            ab_clear_error();
            cr_expect_eq(ab_config_set(root, bad_key[i], allow_new), AB_EINVAL, "key %zu (allow_new %d) accepted", i,
                         allow_new);
            cr_expect(strstr(ab_error(), "not valid UTF-8"), "key %zu: %s", i, ab_error());
            cr_expect(json_equal(root, before), "key %zu (allow_new %d) changed the config", i, allow_new);
        }
    }
    ab_clear_error();
    cr_expect_eq(ab_config_set(root, "a.b=\xff\xfe", false), AB_EINVAL, "a value that is not UTF-8 accepted");
    cr_expect(strstr(ab_error(), "neither JSON nor UTF-8"), "%s", ab_error());
    cr_expect(json_equal(root, before), "a refused value changed the config");
    /* UTF-8 keys and text are fine, new ones included */
    cr_assert_eq(ab_config_set(root, "a.\xc3\xa9t\xc3\xa9=\xe2\x82\xac", true), 0, "%s", ab_error());
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(root, "a"), "\xc3\xa9t\xc3\xa9")),
                     "\xe2\x82\xac");
    cr_assert_eq(ab_config_set(root, "n.\xc3\xa9.x=1", true), 0, "%s", ab_error());
    json_decref(before);
    json_decref(root);
}

/* Names become file names, labels become TSV fields and legend entries. */
Test(config, names_and_labels) {
    json_error_t je;
    json_t *o = json_loads("{\"ok\": \"run-1 (a)\", \"slash\": \"../../x\", \"dot\": \".\", \"dots\": \"..\","
                           " \"empty\": \"\", \"nl\": \"a\\nb\", \"tab\": \"a\\tb\", \"num\": 3}",
                           0, &je);
    cr_assert_not_null(o, "%s", je.text);
    const char *v;
    cr_assert_eq(ab_config_file_name(o, "", "ok", true, NULL, &v), 0, "%s", ab_error());
    cr_assert_str_eq(v, "run-1 (a)");
    const char *bad[] = {"slash", "dot", "dots", "empty", "nl", "tab"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(ab_config_file_name(o, "", bad[i], true, NULL, &v), AB_EINVAL, "'%s' accepted as a name", bad[i]);
        cr_expect(strstr(ab_error(), "must be a non-empty file name"), "%s", ab_error());
    }
    cr_assert_eq(ab_config_file_name(o, "x", "num", true, NULL, &v), AB_EINVAL);
    cr_assert(strstr(ab_error(), "'x.num' must be a string"), "%s", ab_error());
    cr_assert_eq(ab_config_label(o, "", "slash", true, NULL, &v), 0, "a label may hold '/'");
    cr_assert_eq(ab_config_label(o, "", "nl", true, NULL, &v), AB_EINVAL);
    cr_assert(strstr(ab_error(), "'nl' must not hold control characters"), "%s", ab_error());
    cr_assert_eq(ab_config_label(o, "", "tab", true, NULL, &v), AB_EINVAL);
    cr_assert_eq(ab_config_label(o, "", "absent", false, "dflt", &v), 0);
    cr_assert_str_eq(v, "dflt");
    json_decref(o);
}

/* The run documents' "git": git's answer in the source tree compiled in (this is a
 * checkout, or a copy without .git: a commit of 40 hex digits, or null), unless the
 * environment names the commit (a binary copied away from its checkout: the GPU pack,
 * harness/scripts/gpu-pack.sh). */
Test(results, git_info_from_the_checkout_or_the_environment) {
    unsetenv("ATTNBENCH_GIT_COMMIT");
    unsetenv("ATTNBENCH_GIT_DIRTY");
    json_t *g = ab_git_info();
    json_t *c = json_object_get(g, "commit");
    if (json_is_string(c)) {
        const char *h = json_string_value(c);
        cr_expect(strlen(h) == 40 && strspn(h, "0123456789abcdef") == 40, "commit %s", h);
        cr_expect(json_is_boolean(json_object_get(g, "dirty")));
        const char *d = json_string_value(json_object_get(g, "diff_sha1"));
        if (json_is_true(json_object_get(g, "dirty"))) cr_expect(d && strlen(d) == 40, "diff_sha1 %s", d ? d : "null");
        else cr_expect_null(d, "a clean tree has no diff");
    } else {
        cr_expect(json_is_null(c) && json_is_null(json_object_get(g, "dirty")));
    }
    json_decref(g);
    const char *commit = "0123456789abcdef0123456789abcdef01234567";
    setenv("ATTNBENCH_GIT_COMMIT", commit, 1);
    g = ab_git_info();
    cr_expect_str_eq(json_string_value(json_object_get(g, "commit")), commit);
    cr_expect(json_is_null(json_object_get(g, "dirty")), "dirty unknown without ATTNBENCH_GIT_DIRTY");
    cr_expect(json_is_null(json_object_get(g, "diff_sha1")));
    json_decref(g);
    setenv("ATTNBENCH_GIT_DIFF_SHA1", "89abcdef0123456789abcdef0123456789abcdef", 1);
    g = ab_git_info();
    cr_expect_str_eq(json_string_value(json_object_get(g, "diff_sha1")), "89abcdef0123456789abcdef0123456789abcdef");
    json_decref(g);
    unsetenv("ATTNBENCH_GIT_DIFF_SHA1");
    const char *flags[3][2] = {{"0", "false"}, {"1", "true"}, {"yes", "true"}};
    for (int i = 0; i < 3; i++) {
        setenv("ATTNBENCH_GIT_DIRTY", flags[i][0], 1);
        g = ab_git_info();
        cr_expect(json_is_boolean(json_object_get(g, "dirty")) &&
                      json_is_true(json_object_get(g, "dirty")) == (strcmp(flags[i][1], "true") == 0),
                  "ATTNBENCH_GIT_DIRTY=%s", flags[i][0]);
        json_decref(g);
    }
}

/* Runs a shell command line in the scratch folder; its status. */
static int sh(const char *fmt, const char *arg) {
    char cmd[1600];
    snprintf(cmd, sizeof cmd, fmt, arg, arg, arg);
    return system(cmd);
}

/* First line of a command's output (static). */
static const char *sh_line(const char *fmt, const char *arg) {
    static char line[256];
    char cmd[1600];
    snprintf(cmd, sizeof cmd, fmt, arg, arg);
    line[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (p) {
        if (!fgets(line, sizeof line, p)) line[0] = '\0';
        pclose(p);
    }
    line[strcspn(line, "\n")] = '\0';
    return line;
}

/* A checkout of its own in the scratch folder: clean, then a tracked file changed (the
 * diff's object name, as git names it), then an untracked file only (not dirty). */
Test(fileio, git_info_of_a_dirty_checkout_names_its_diff) {
    if (system("git --version >/dev/null 2>&1") != 0) cr_skip_test("no git here");
    const char *repo = path_in("repo");
    char dir[700];
    snprintf(dir, sizeof dir, "%s", repo);
    cr_assert_eq(sh("mkdir -p '%s' && cd '%s' && git init -q . && printf 'a\\n' > f.txt && git add f.txt && "
                    "git -c user.name=t -c user.email=t@t commit -q -m one",
                    dir),
                 0);
    json_t *g = ab_git_info_at(dir);
    cr_expect(json_is_false(json_object_get(g, "dirty")));
    cr_expect(json_is_null(json_object_get(g, "diff_sha1")), "a clean tree has no diff");
    json_decref(g);
    cr_assert_eq(sh("printf 'b\\n' >> '%s/f.txt'", dir), 0);
    char want[64];
    snprintf(want, sizeof want, "%s", sh_line("git -C '%s' diff HEAD --binary | git hash-object --stdin", dir));
    cr_assert_eq(strlen(want), 40, "git's object name: '%s'", want);
    g = ab_git_info_at(dir);
    cr_expect(json_is_true(json_object_get(g, "dirty")));
    cr_expect_str_eq(json_string_value(json_object_get(g, "diff_sha1")), want);
    json_decref(g);
    cr_assert_eq(sh("cd '%s' && git checkout -q f.txt && printf 'x\\n' > new.txt", dir), 0);
    g = ab_git_info_at(dir);
    cr_expect(json_is_false(json_object_get(g, "dirty")), "untracked files do not make a tree dirty");
    cr_expect(json_is_null(json_object_get(g, "diff_sha1")));
    json_decref(g);
    g = ab_git_info_at(path_in("nothing"));
    cr_expect(json_is_null(json_object_get(g, "commit")) && json_is_null(json_object_get(g, "diff_sha1")));
    json_decref(g);
}
