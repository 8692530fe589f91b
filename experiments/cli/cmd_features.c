/* attnbench features DATA_DIR: loads a Kaldi data directory as the speech task will
 * (experiments/tasks/speech/speech_data.h: features from the audio, a cache or feats.scp;
 * CMVN; phone targets) and prints a JSON summary, so a user can check a directory
 * before training on it. */
#include "commands.h"

#include "cli_util.h"
#include "error.h"
#include "memory.h"
#include "speech_data.h"
#include "timer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
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

static json_t *doubles(const double *x, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(x[i]));
    return a;
}

int cmd_features(int argc, char **argv, const char *command_line) {
    (void)command_line;
    const char *dir = NULL, *out = NULL;
    sd_options o;
    sd_options_default(&o);
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(FEATURES_USAGE, stdout);
            return 0;
        } else if (strcmp(argv[i], "--out") == 0) {
            out = cli_path_value(argc, argv, &i);
        } else if (strcmp(argv[i], "--set") == 0) {
            const char *kv = cli_value(argc, argv, &i);
            const char *eq = strchr(kv, '=');
            if (!eq || eq == kv) cli_die(AB_EXIT_USAGE, "features: --set %s: expected KEY=VALUE", kv);
            char key[64];
            if ((size_t)(eq - kv) >= sizeof key) cli_die(AB_EXIT_USAGE, "features: --set %s: unknown option", kv);
            memcpy(key, kv, (size_t)(eq - kv));
            key[eq - kv] = '\0';
            if (strcmp(key, "cache") == 0) cli_die(AB_EXIT_USAGE, "features: the cache is given with --out PREFIX");
            int rc = sd_options_set(&o, key, eq + 1);
            if (rc) cli_die(cli_status_for(rc), "features: %s", ab_error());
        } else if (argv[i][0] == '-' && argv[i][1]) {
            cli_die(AB_EXIT_USAGE, "features: unknown option '%s' (see attnbench features --help)", argv[i]);
        } else if (!dir) {
            dir = argv[i];
        } else {
            cli_die(AB_EXIT_USAGE, "features: one data directory only ('%s' and '%s')", dir, argv[i]);
        }
    }
    if (!dir) cli_die(AB_EXIT_USAGE, "features: a data directory is needed (see attnbench features --help)");
    o.cache = out;
    uint64_t t0 = ab_now_ns();
    sd_data d;
    int rc = sd_load(dir, &o, NULL, &d);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    const double secs = ab_ms_since(t0) * 1e-3;

    double *mean = malloc(sizeof(double) * (size_t)d.dim), *sd = malloc(sizeof(double) * (size_t)d.dim);
    double all_mean = 0, all_std = 0;
    if (!mean || !sd || sd_feature_stats(&d, mean, sd, &all_mean, &all_std))
        cli_die(AB_EXIT_FAILURE, "out of memory for the feature statistics");
    int min_t = d.utts[0].frames, max_t = d.utts[0].frames, empty = 0, short_targets = 0;
    for (int i = 0; i < d.n; i++) {
        const sd_utt *u = &d.utts[i];
        if (u->frames < min_t) min_t = u->frames;
        if (u->frames > max_t) max_t = u->frames;
        empty += u->n_phones == 0;
        short_targets += u->n_phones > u->frames;
    }
    json_t *inv = json_array();
    for (int i = 0; i < d.phones.count; i++) json_array_append_new(inv, json_string(d.phones.names[i]));
    json_t *doc = json_object();
    json_object_set_new(doc, "schema", json_string("attnbench/features/1"));
    json_object_set_new(doc, "data_dir", json_string(dir));
    json_object_set_new(doc, "features_from", json_string(d.features_from));
    /* features from feats.scp are read as they are: no cache */
    const bool cached = out && strcmp(d.features_from, "feats.scp") != 0;
    json_object_set_new(doc, "cache", cached ? json_string(out) : json_null());
    json_object_set_new(doc, "cache_written", json_boolean(d.cache_written));
    json_object_set_new(doc, "utterances", json_integer(d.n));
    json_object_set_new(doc, "speakers", json_integer(d.n_speakers));
    json_object_set_new(doc, "frames", json_integer(d.frames));
    json_object_set_new(doc, "frames_per_utterance",
                        json_pack("{s:i, s:f, s:i}", "min", min_t, "mean", (double)d.frames / d.n, "max", max_t));
    json_object_set_new(doc, "seconds", d.seconds > 0 ? json_real(d.seconds) : json_null());
    json_object_set_new(doc, "hours", d.seconds > 0 ? json_real(d.seconds / 3600) : json_null());
    json_object_set_new(doc, "dim", json_integer(d.dim));
    json_object_set_new(doc, "phones", json_integer(d.phones.count));
    json_object_set_new(doc, "phones_from", json_string(d.phones_from));
    json_object_set_new(doc, "inventory", inv);
    json_object_set_new(doc, "phone_tokens", json_integer(d.phone_tokens));
    json_object_set_new(doc, "empty_targets", json_integer(empty));
    json_object_set_new(doc, "targets_longer_than_frames", json_integer(short_targets));
    json_object_set_new(doc, "feature_mean", json_real(all_mean));
    json_object_set_new(doc, "feature_std", json_real(all_std));
    json_object_set_new(doc, "per_dim", json_pack("{s:o, s:o}", "mean", doubles(mean, d.dim), "std", doubles(sd, d.dim)));
    json_object_set_new(doc, "options", sd_options_to_json(&o));
    json_object_set_new(doc, "time_s", json_real(secs));
    if (json_dumpf(doc, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)) != 0 ||
        fputc('\n', stdout) == EOF || fflush(stdout) != 0)
        cli_die(AB_EXIT_FAILURE, "cannot write the summary to stdout");
    json_decref(doc);
    free(mean);
    free(sd);
    sd_data_free(&d);
    return 0;
}
