/* The commands of data directories (experiments/tasks/speech/data_command.h), part of the
 * speech_data suite: refused unless the user allows them (in the library, in
 * `features`, and when `decode` reloads a checkpoint's data: test_speech_task.c); a
 * command past its time or output limit is killed with every process of its group;
 * a process a command leaves in the background is killed when it ends; SIGTERM, SIGINT
 * and SIGHUP to attnbench end the command's group too, and kill -9 ends its shell (the
 * parent-death signal). Issue 28, defects 4, 5 and 6. */
#include <criterion/criterion.h>

#include "audio.h"
#include "data_command.h"
#include "error.h"
#include "speech_data.h"
#include "test_proc.h"

#include <math.h>
#include <signal.h>
#include <sndfile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char g_dir[600];
static char *g_out, *g_err;

static void setup(void) { tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/speech-commands-tmp"); }
static void teardown(void) {
    dc_policy p;
    dc_policy_default(&p);
    dc_set_policy(&p);
    tp_rm_tree(g_dir);
    free(g_out);
    free(g_err);
    g_out = g_err = NULL;
}

TestSuite(speech_commands, .init = setup, .fini = teardown, .timeout = 120);

#define P(...) tp_path(g_dir, __VA_ARGS__)

static void put(const char *path, const char *text) { tp_write_bytes(path, text, strlen(text)); }

/* Waits up to `seconds` for `path` to exist. */
static bool wait_for_file(const char *path, double seconds) {
    const double end = tp_now_s() + seconds;
    while (tp_now_s() < end) {
        if (tp_exists(path)) return true;
        tp_sleep_s(0.02);
    }
    return tp_exists(path);
}

/* A quarter second of a 440 Hz tone, 16 kHz, 16-bit. */
static void write_wav(const char *path) {
    enum { N = 4000 };
    short s[N];
    for (int i = 0; i < N; i++) s[i] = (short)lrint(8000 * sin(2 * M_PI * 440 * i / 16000.0));
    SF_INFO info = {.samplerate = 16000, .channels = 1, .format = SF_FORMAT_WAV | SF_FORMAT_PCM_16};
    SNDFILE *sf = sf_open(path, SFM_WRITE, &info);
    cr_assert_not_null(sf, "cannot write %s: %s", path, sf_strerror(NULL));
    cr_assert_eq(sf_writef_short(sf, s, N), N);
    sf_close(sf);
}

/* A data directory DIR of one utterance u1 (phones a b) whose wav.scp value is `value`
 * (a path, or a command ending in '|'); DIR/u1.wav is a good WAV. */
static const char *data_dir(const char *name, const char *value) {
    mkdir(P("%s", name), 0755);
    write_wav(P("%s/u1.wav", name));
    char line[3000];
    snprintf(line, sizeof line, "u1 %s\n", value);
    put(P("%s/wav.scp", name), line);
    put(P("%s/text", name), "u1 a b\n");
    return P("%s", name);
}

static void allow(double timeout_s, size_t max_bytes) {
    dc_policy p = {true, timeout_s, max_bytes};
    dc_set_policy(&p);
}

/* The library refuses a command unless allowed, naming the option; a path needs no
 * consent; allowed, the command's output is the audio. */
Test(speech_commands, a_command_runs_only_when_allowed) {
    char cmd[2000], dir[1000];
    snprintf(cmd, sizeof cmd, "cat %s |", P("d/u1.wav"));
    snprintf(dir, sizeof dir, "%s", data_dir("d", cmd));
    sd_options o;
    sd_options_default(&o);
    sd_data d;
    int rc = sd_load(dir, &o, NULL, &d);
    cr_expect_eq(rc, AB_EINVAL, "not allowed: rc %d (%s)", rc, ab_error());
    cr_expect(strstr(ab_error(), "--allow-commands") && strstr(ab_error(), "wav.scp:1") &&
                  strstr(ab_error(), "cat ") && !strchr(ab_error(), '\n'),
              "the refusal names the entry, the command and the option: %s", ab_error());
    /* a command of 3000 bytes: the refusal still names the option (it was cut off) */
    char longcmd[3100];
    memset(longcmd, 'x', 3000);
    snprintf(longcmd + 3000, sizeof longcmd - 3000, " |");
    char line[3200];
    snprintf(line, sizeof line, "u1 %s\n", longcmd);
    put(P("d/wav.scp"), line);
    cr_expect_eq(sd_load(dir, &o, NULL, &d), AB_EINVAL);
    cr_expect(strstr(ab_error(), "--allow-commands") && strstr(ab_error(), "xxx..."), "a long command: %s", ab_error());
    snprintf(line, sizeof line, "u1 %s\n", cmd);
    put(P("d/wav.scp"), line);
    allow(DC_DEFAULT_TIMEOUT_S, (size_t)DC_DEFAULT_MAX_MB << 20);
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0, "%s", ab_error());
    cr_expect_eq(d.n, 1);
    cr_expect_eq(d.utts[0].frames, (4000 - 400) / 160 + 1, "25 ms frames every 10 ms of 4000 samples");
    sd_data_free(&d);
}

/* A command running past its time limit is killed, with what it started in the
 * background (its process group), and refused at once. */
Test(speech_commands, a_command_past_its_time_limit_is_killed_with_its_group) {
    char cmd[2000], dir[1000];
    snprintf(cmd, sizeof cmd, "(sleep 2; touch %s) & sleep 30; cat %s |", P("late"), P("t/u1.wav"));
    snprintf(dir, sizeof dir, "%s", data_dir("t", cmd));
    allow(1, (size_t)1 << 20);
    sd_options o;
    sd_options_default(&o);
    sd_data d;
    const double t0 = tp_now_s();
    int rc = sd_load(dir, &o, NULL, &d);
    const double took = tp_now_s() - t0;
    cr_expect_eq(rc, AB_EINVAL, "rc %d (%s)", rc, ab_error());
    cr_expect(strstr(ab_error(), "time limit of 1 s") && strstr(ab_error(), "--command-timeout"), "%s", ab_error());
    /* 1 s limit; the poll wakes within a millisecond of it; 2 s of slack for a loaded machine */
    cr_expect_lt(took, 3.0, "the command was stopped at its limit: %.2f s", took);
    tp_sleep_s(2.5); /* the background sleep 2 would have touched `late` by now */
    cr_expect(!tp_exists(P("late")), "a process of the command's group outlived it");
}

/* A command writing more than the output limit is killed and refused (it was buffered
 * without bound, into an out-of-memory exit). */
Test(speech_commands, a_command_past_its_output_limit_is_killed) {
    char dir[1000];
    snprintf(dir, sizeof dir, "%s", data_dir("z", "cat /dev/zero |"));
    allow(30, (size_t)2 << 20);
    sd_options o;
    sd_options_default(&o);
    sd_data d;
    const double t0 = tp_now_s();
    int rc = sd_load(dir, &o, NULL, &d);
    cr_expect_eq(rc, AB_EINVAL, "rc %d (%s)", rc, ab_error());
    cr_expect(strstr(ab_error(), "output limit of 2 MiB") && strstr(ab_error(), "--command-max-mb"), "%s", ab_error());
    cr_expect_lt(tp_now_s() - t0, 10.0, "stopped at 2 MiB, not at the 30 s limit");
}

/* A command that succeeds but leaves a process in the background: the process is
 * killed when the command ends (it would run on after attnbench). */
Test(speech_commands, what_a_command_leaves_behind_is_killed) {
    char cmd[2000], dir[1000];
    snprintf(cmd, sizeof cmd, "(sleep 1; touch %s) & cat %s |", P("late"), P("b/u1.wav"));
    snprintf(dir, sizeof dir, "%s", data_dir("b", cmd));
    allow(30, (size_t)64 << 20);
    sd_options o;
    sd_options_default(&o);
    sd_data d;
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0, "%s", ab_error());
    sd_data_free(&d);
    tp_sleep_s(1.5);
    cr_expect(!tp_exists(P("late")), "the command's background process outlived it");
}

#define run(...) tp_run(g_dir, ATTNBENCH_EXE, NULL, TP_ARGV("--threads", "1", __VA_ARGS__, NULL), &g_out, &g_err)

/* `features`: refused without --allow-commands (nothing written), run with it; the
 * limits as options; bad values of them are usage errors. */
Test(speech_commands, the_cli_asks_for_consent_and_takes_the_limits) {
    char cmd[2000], dir[1000];
    snprintf(cmd, sizeof cmd, "cat %s |", P("c/u1.wav"));
    snprintf(dir, sizeof dir, "%s", data_dir("c", cmd));
    int st = run("features", dir, "--out", P("cache/f"));
    tp_usage_error(st, g_err, "a command without consent", TP_ARGV("--allow-commands", "wav.scp:1", NULL));
    cr_expect(!tp_exists(P("cache")), "a refused run wrote its cache");
    st = run("--allow-commands", "features", dir, "--out", P("cache/f"));
    cr_expect_eq(st, 0, "allowed: %s", g_err);
    st = run("features", dir, "--allow-commands"); /* after the command name too */
    cr_expect_eq(st, 0, "allowed after the command's name: %s", g_err);
    put(P("c/wav.scp"), "u1 cat /dev/zero |\n");
    st = run("--allow-commands", "--command-max-mb", "1", "features", dir);
    tp_usage_error(st, g_err, "the output limit", TP_ARGV("output limit of 1 MiB", NULL));
    put(P("c/wav.scp"), "u1 sleep 30 |\n");
    st = run("--allow-commands", "--command-timeout", "1", "features", dir);
    tp_usage_error(st, g_err, "the time limit", TP_ARGV("time limit of 1 s", NULL));
    st = run("--command-timeout", "0", "features", dir);
    tp_usage_error(st, g_err, "a zero timeout", TP_ARGV("--command-timeout", NULL));
    st = run("--command-max-mb", "lots", "features", dir);
    tp_usage_error(st, g_err, "a bad size", TP_ARGV("--command-max-mb", NULL));
}

/* SIGTERM, SIGINT and SIGHUP to attnbench alone (not to its process group, as a
 * terminal's Ctrl-C would) end the command's group with it. */
Test(speech_commands, a_signal_to_attnbench_ends_the_command) {
    const int sigs[3] = {SIGTERM, SIGINT, SIGHUP};
    for (int k = 0; k < 3; k++) {
        char cmd[3000], name[16], started[1000], late[1000];
        snprintf(name, sizeof name, "s%d", k);
        snprintf(started, sizeof started, "%s", P("started%d", k));
        snprintf(late, sizeof late, "%s", P("late%d", k));
        snprintf(cmd, sizeof cmd, "touch %s; (sleep 2; touch %s) & sleep 60; cat %s/u1.wav |", started, late, P("%s", name));
        const char *dir = data_dir(name, cmd);
        pid_t pid = tp_spawn(g_dir, ATTNBENCH_EXE, NULL, TP_ARGV("--threads", "1", "--allow-commands", "features", dir, NULL));
        cr_assert(wait_for_file(started, 20), "signal %d: the command did not start", sigs[k]);
        kill(pid, sigs[k]);
        int st = tp_wait_for(g_dir, pid, 10, &g_out, &g_err);
        cr_expect_eq(st, 128 + sigs[k], "signal %d: attnbench ended with status %d", sigs[k], st);
        tp_sleep_s(2.5);
        cr_expect(!tp_exists(late), "signal %d: a process of the command outlived attnbench", sigs[k]);
    }
}

/* kill -9 of attnbench: its handlers cannot run, but the kernel kills the command's
 * shell (the parent-death signal), which here is the command itself (exec). */
Test(speech_commands, kill_9_of_attnbench_ends_the_command_shell) {
    char cmd[3200], pidfile[1000];
    snprintf(pidfile, sizeof pidfile, "%s", P("cmd.pid"));
    snprintf(cmd, sizeof cmd, "echo $$ > %s.tmp && mv %s.tmp %s && exec sleep 60 |", pidfile, pidfile, pidfile);
    const char *dir = data_dir("k", cmd);
    pid_t pid = tp_spawn(g_dir, ATTNBENCH_EXE, NULL, TP_ARGV("--threads", "1", "--allow-commands", "features", dir, NULL));
    cr_assert(wait_for_file(pidfile, 20), "the command did not start");
    tp_sleep_s(0.2); /* the exec */
    char *txt = tp_slurp(pidfile, NULL);
    const pid_t child = (pid_t)atol(txt);
    free(txt);
    cr_assert_gt(child, 1);
    cr_assert_eq(kill(child, 0), 0, "the command runs before attnbench is killed");
    kill(pid, SIGKILL);
    int st = tp_wait_for(g_dir, pid, 10, &g_out, &g_err);
    cr_expect_eq(st, 128 + SIGKILL);
    /* gone, or a zombie waiting for whichever process adopted it to reap it */
    bool gone = false;
    for (int i = 0; i < 150 && !gone; i++) {
        char stat_path[64], state = 0;
        snprintf(stat_path, sizeof stat_path, "/proc/%d/stat", (int)child);
        FILE *f = fopen(stat_path, "r");
        if (!f) gone = true;
        else {
            if (fscanf(f, "%*d (%*[^)]) %c", &state) == 1 && (state == 'Z' || state == 'X')) gone = true;
            fclose(f);
        }
        if (!gone) tp_sleep_s(0.02);
    }
    cr_expect(gone, "the command (pid %d) outlived attnbench's kill -9 by 3 s", (int)child);
}
