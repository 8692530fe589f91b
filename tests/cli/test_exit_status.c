/* The exit statuses README.md lists ("Exit status"), for the failures that are the
 * system's, not the input's, part of the cli suite: a write that fails for want of
 * space (a file-size limit: EFBIG, as a full disk's ENOSPC) is status 1, a resource
 * failure, with one line and no partial file; an output path that cannot be made (a
 * file in the way) is status 2, the user's input (issue 28: the statuses documented in
 * one place and followed). */
#include <criterion/criterion.h>

#include "test_proc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_dir[600];
static char *g_out, *g_err;

static void setup(void) { tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/exit-status-tmp"); }
static void teardown(void) {
    tp_rm_tree(g_dir);
    free(g_out);
    free(g_err);
    g_out = g_err = NULL;
}

TestSuite(exit_status, .init = setup, .fini = teardown, .timeout = 120);

#define P(...) tp_path(g_dir, __VA_ARGS__)

Test(exit_status, a_write_without_space_is_1_a_path_in_the_way_is_2) {
    /* 16 blocks of 512 bytes at most per file; SIGXFSZ ignored, so the write fails with
     * EFBIG instead of killing the process */
    const char *script = "trap '' XFSZ; ulimit -f 16; exec \"$@\"";
    char out[1000];
    snprintf(out, sizeof out, "%s", P("inputs"));
    int st = tp_wait_for(g_dir,
                         tp_spawn(g_dir, "/bin/sh", NULL,
                                  TP_ARGV("-c", script, "sh", ATTNBENCH_EXE, "--threads", "1", "inputs", "--shape",
                                          "1,2,512,64,64", "--out", out, NULL)),
                         60, &g_out, &g_err);
    cr_expect_eq(st, 1, "a write past the size limit: exit status %d (%s)", st, g_err);
    cr_expect(strncmp(g_err, "attnbench: error: ", 18) == 0 && strchr(g_err, '\n') == g_err + strlen(g_err) - 1,
              "not one line: %s", g_err);
    cr_expect(strstr(g_err, "cannot write") && strstr(g_err, "q.npy"), "names the file: %s", g_err);
    cr_expect(!tp_exists(P("inputs/q.npy")), "a partial file was left");
    /* the same command with a regular file where its folder should be: the input's fault */
    tp_write_bytes(P("file"), "x", 1);
    st = tp_run(g_dir, ATTNBENCH_EXE, NULL,
                TP_ARGV("--threads", "1", "inputs", "--shape", "1,2,512,64,64", "--out", P("file/sub"), NULL), &g_out,
                &g_err);
    tp_usage_error(st, g_err, "a file in the way of --out", TP_ARGV("a file is in the way", NULL));
}
