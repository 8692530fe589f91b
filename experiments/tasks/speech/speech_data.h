/* The speech experiment's data (experiments/speech/README.md): a Kaldi data directory
 * loaded into memory, each utterance as its feature frames and its phone ids.
 *
 * Features: from the audio of wav.scp (40 log-mel filterbanks, fbank.h), optionally
 * through a cache (feat_cache.h), or precomputed in Kaldi archives through feats.scp
 * (kaldi_ark.h); then mean and variance normalisation (CMVN) as Kaldi's apply-cmvn
 * --norm-vars=true: per speaker (utt2spk; without it each utterance is its own
 * speaker), or per utterance, or none. Targets: the phones of `text` (or its words
 * through a lexicon) as ids 0..P-1 of the phone inventory (kaldi_dir.h), dropped
 * symbols left out. The CTC blank is not among them: the model adds it (as class P, or
 * shifts the phones by one; its choice).
 *
 * Frame stacking and subsampling are the task's business, not done here.
 *
 * Every failure is one line through ab_fail (harness/error.h): AB_EINVAL for bad input
 * (naming the file and line, or the option), AB_ENOMEM, AB_EIO. */
#ifndef AB_SPEECH_SPEECH_DATA_H
#define AB_SPEECH_SPEECH_DATA_H

#include "fbank.h"
#include "kaldi_dir.h"

#include <jansson.h>
#include <stdbool.h>

typedef enum { SD_CMVN_NONE = 0, SD_CMVN_UTTERANCE, SD_CMVN_SPEAKER } sd_cmvn;

/* What to load and how. The strings are not copied: they must outlive sd_load. */
typedef struct {
    fb_options fbank;   /* features from audio (defaults: fb_options_default) */
    kd_source source;   /* KD_SOURCE_AUTO (default): feats.scp when present, else wav.scp */
    sd_cmvn cmvn;       /* SD_CMVN_SPEAKER (default) */
    bool norm_vars;     /* true (default): divide by the standard deviation too */
    const char *lexicon; /* NULL (default): text holds phones */
    const char *phones;  /* a phones.txt; NULL (default): DIR/phones.txt when present, else built */
    const char *drop;    /* symbols left out of the targets, comma-separated; NULL (default): none */
    const char *cache;   /* feature cache prefix (PREFIX.ark/.scp/.json); NULL (default): none */
} sd_options;

void sd_options_default(sd_options *o);

/* Sets one option from text, as `--set KEY=VALUE` gives it: keys sample_rate,
 * num_mel_bins, frame_length_ms, frame_shift_ms, preemph, low_freq, high_freq (the
 * fbank options), source (auto, wav, feats), cmvn (speaker, utterance, none),
 * norm_vars (true, false), lexicon, phones, drop, cache (strings; "" unsets). `value`
 * is kept, not copied. AB_EINVAL for an unknown key or a bad value. */
int sd_options_set(sd_options *o, const char *key, const char *value);

/* Sets the options an object of a JSON config holds (the same keys; numbers, booleans
 * and strings, null for an unset string), each checked: an unknown key, a value of
 * the wrong type or outside its range is AB_EINVAL naming `where`.KEY. The strings
 * point into obj. */
int sd_options_from_json(sd_options *o, const json_t *obj, const char *where);

/* Every option as a JSON object (unset strings as null): a run document's record of
 * them. NULL when out of memory. */
json_t *sd_options_to_json(const sd_options *o);

typedef struct {
    char *id;
    int speaker; /* index into sd_data.speakers */
    int frames;  /* T >= 1 */
    float *feats; /* T x dim, row by row (tracked allocator) */
    int n_phones; /* >= 0 (an utterance with an empty transcript has none) */
    int *phones;  /* the targets, ids in 0..phones.count-1 */
} sd_utt;

typedef struct {
    int n;
    sd_utt *utts; /* in the order of the directory's text */
    int dim;      /* feature dimension (num_mel_bins, or the archives' columns) */
    kd_phones phones; /* the inventory: phones.count = P, names[0..P-1] */
    char *phones_from; /* a phones.txt path, "given", "text" or the lexicon's path */
    int n_speakers;
    char **speakers;
    long long frames;       /* over every utterance */
    long long phone_tokens; /* targets over every utterance */
    double seconds;         /* audio duration; 0 when the features came from feats.scp */
    const char *features_from; /* "audio", "cache" (read from it), "feats.scp" */
    bool cache_written;        /* the features were computed and the cache (re)written */
} sd_data;

/* Loads the data directory `dir`. `inventory`: NULL, or the phones to use (another
 * split's: valid and test must use the training split's ids); `o->phones` is then not
 * read. */
int sd_load(const char *dir, const sd_options *o, const kd_phones *inventory, sd_data *out);
void sd_data_free(sd_data *d);

/* Mean and standard deviation of every feature dimension over all frames (mean, std:
 * d->dim doubles each), and over all values together (all_mean, all_std; each may be
 * NULL). 0 or AB_ENOMEM. */
int sd_feature_stats(const sd_data *d, double *mean, double *std, double *all_mean, double *all_std);

#endif
