/* attnbench features DATA_DIR: loads a Kaldi data directory as the speech task will
 * (experiments/tasks/speech/speech_data.h: features from the audio, a cache or feats.scp;
 * CMVN; phone targets) and prints a JSON summary (speech_summary.h), so a user can check
 * a directory before training on it. */
#include "commands.h"

#include "cli_args.h"
#include "cli_util.h"
#include "error.h"
#include "speech_data.h"
#include "speech_summary.h"
#include "timer.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static const char FEATURES_USAGE[] =
    "usage: attnbench features DATA_DIR [--out PREFIX] [--set KEY=VALUE]..\n"
    "\n"
    "Loads the Kaldi data directory DATA_DIR (wav.scp or feats.scp, text, optional\n"
    "utt2spk and phones.txt; experiments/speech/README.md): computes the 40 log-mel\n"
    "filterbanks of every utterance of text from its audio (or reads them from the\n"
    "archives of feats.scp), normalises them (CMVN per speaker by default) and maps the\n"
    "transcripts to phone ids. --out PREFIX caches the features computed from audio in\n"
    "PREFIX.ark, .scp and .json (a Kaldi archive and index, and what they were computed\n"
    "from): a later run with the same audio and options reads them back instead. Prints\n"
    "a JSON summary: utterances, speakers, frames, audio duration, the phone inventory\n"
    "and counts, the features' mean and standard deviation (overall and per dimension),\n"
    "the time taken.\n"
    "\n"
    "Options (--set KEY=VALUE): sample_rate (16000), num_mel_bins (40), frame_length_ms\n"
    "(25), frame_shift_ms (10), preemph (0.97), low_freq (20), high_freq (0: Nyquist),\n"
    "source (auto, wav, feats), cmvn (speaker, utterance, none), norm_vars (true),\n"
    "lexicon (PATH: text holds words), phones (PATH of a phones.txt), drop (symbols left\n"
    "out of the targets, comma-separated, e.g. pau,sil).\n";

/* features' own arguments: --set (each option checked as it comes), the data
 * directory, and the refusals in features' words. */
typedef struct {
    sd_options o;
    const char *dir;
} features_args;

static bool features_option(int argc, char **argv, int *i, void *ctx) {
    features_args *f = ctx;
    const char *arg = argv[*i];
    if (strcmp(arg, "--set") == 0) {
        const char *kv = cli_value(argc, argv, i);
        const char *eq = strchr(kv, '=');
        if (!eq || eq == kv) cli_die(AB_EXIT_USAGE, "features: --set %s: expected KEY=VALUE", kv);
        char key[64];
        if ((size_t)(eq - kv) >= sizeof key) cli_die(AB_EXIT_USAGE, "features: --set %s: unknown option", kv);
        memcpy(key, kv, (size_t)(eq - kv));
        key[eq - kv] = '\0';
        if (strcmp(key, "cache") == 0) cli_die(AB_EXIT_USAGE, "features: the cache is given with --out PREFIX");
        int rc = sd_options_set(&f->o, key, eq + 1);
        if (rc) cli_die(cli_status_for(rc), "features: %s", ab_error());
    } else if (arg[0] == '-' && arg[1]) {
        cli_die(AB_EXIT_USAGE, "features: unknown option '%s' (see attnbench features --help)", arg);
    } else if (!f->dir) {
        f->dir = arg;
    } else {
        cli_die(AB_EXIT_USAGE, "features: one data directory only ('%s' and '%s')", f->dir, arg);
    }
    return true;
}

int cmd_features(int argc, char **argv, const char *command_line) {
    (void)command_line;
    features_args f = {.dir = NULL};
    sd_options_default(&f.o);
    cli_args a = {.cmd = "features", .usage = FEATURES_USAGE, .takes = CLI_OUT};
    cli_parse(argc, argv, &a, features_option, &f);
    const char *dir = f.dir, *out = a.out;
    if (!dir) cli_die(AB_EXIT_USAGE, "features: a data directory is needed (see attnbench features --help)");
    f.o.cache = out;
    uint64_t t0 = ab_now_ns();
    sd_data d;
    int rc = sd_load(dir, &f.o, NULL, &d);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    const double secs = ab_ms_since(t0) * 1e-3;
    json_t *doc = sd_summary_json(&d, &f.o, dir, out, secs);
    if (!doc) cli_die(AB_EXIT_FAILURE, "%s", ab_error());
    if (json_dumpf(doc, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)) != 0 ||
        fputc('\n', stdout) == EOF || fflush(stdout) != 0)
        cli_die(AB_EXIT_FAILURE, "cannot write the summary to stdout");
    json_decref(doc);
    sd_data_free(&d);
    return 0;
}
