/* A Kaldi data directory (experiments/speech/README.md): its text files read,
 * checked against each other, and the targets mapped to phone ids. No audio or
 * feature is read here (speech_data.h does that).
 *
 *   wav.scp     UTT PATH, or UTT COMMAND... |   (the audio; a command's stdout is it)
 *   feats.scp   UTT ARCHIVE:OFFSET, or UTT FILE (a file holding one matrix)
 *   text        UTT PHONE PHONE ...   or, with a lexicon, UTT WORD WORD ...
 *   utt2spk     UTT SPEAKER (optional: without it each utterance is its own speaker)
 *   phones.txt  SYMBOL INTEGER (Kaldi's symbol table; optional)
 *   lexicon     WORD PHONE PHONE ... (Kaldi's lexicon.txt; the first line of a word
 *               is its pronunciation, later ones are ignored)
 *
 * Each line is a key, whitespace, and the rest; blank lines are skipped; paths are
 * taken relative to the current folder, as Kaldi does. The utterances are those of
 * `text`, in its order; every one must have its audio (or features) and, when utt2spk
 * exists, its speaker. Entries of wav.scp, feats.scp and utt2spk for utterances not in
 * `text` are ignored. A `segments` file is refused (not supported).
 *
 * The phone inventory, ids 0..P-1: a given one (another split's); else a phones.txt
 * (the option, or DIR/phones.txt when present): its symbols in the order of their ids,
 * less <eps>, the disambiguation symbols #0, #1, ... and the dropped symbols; else
 * built from the data: every phone of the text (or of the lexicon) less the dropped
 * ones, sorted by byte value. Dropped symbols (e.g. "pau,sil") are left out of the
 * targets wherever they occur.
 *
 * Every problem is one line naming the file and line, AB_EINVAL: a malformed line, a
 * duplicate id, an utterance without audio, features or speaker, an unknown phone or
 * word, a dropped symbol that the inventory's source does not hold. */
#ifndef AB_SPEECH_KALDI_DIR_H
#define AB_SPEECH_KALDI_DIR_H

#include <stdbool.h>

/* The phone inventory: id i is names[i], i in 0..count-1. */
typedef struct {
    int count;
    char **names;
} kd_phones;

void kd_phones_free(kd_phones *p);
int kd_phones_copy(const kd_phones *src, kd_phones *dst);

typedef enum { KD_SOURCE_AUTO = 0, KD_SOURCE_WAV, KD_SOURCE_FEATS } kd_source;

typedef struct {
    kd_source source;           /* AUTO: feats.scp when the folder has one, else wav.scp */
    const char *lexicon;        /* NULL: text holds phones; else text holds words of this lexicon */
    const char *phones;         /* a phones.txt; NULL: DIR/phones.txt when present, else built */
    const char *drop;           /* symbols left out of the targets, comma-separated; NULL or "": none */
    const kd_phones *inventory; /* non-NULL: these phones (ids as given); `phones` is then not read */
} kd_options;

typedef struct {
    char *id;
    int speaker; /* index into kd_dir.speakers */
    /* from wav.scp (source wav) */
    char *audio;        /* a path, or a command without its '|' */
    bool audio_command; /* audio is a command */
    /* from feats.scp (source feats) */
    char *feats_path;
    long long feats_offset;
    int scp_line; /* the line of wav.scp or feats.scp */
    int text_line;
    int n_phones;
    int *phones; /* the targets: ids into kd_dir.phones */
} kd_utt;

typedef struct {
    char *dir;
    kd_source source;  /* WAV or FEATS: where the features come from */
    char *scp_path;    /* DIR/wav.scp or DIR/feats.scp */
    char *text_path;   /* DIR/text */
    int n;
    kd_utt *utts; /* in the order of text */
    int n_speakers;
    char **speakers;   /* in order of first appearance */
    bool has_utt2spk;
    kd_phones phones;
    char *phones_from; /* where the inventory came from: a phones.txt path, "given", "text" or the lexicon's path */
} kd_dir;

int kd_read(const char *dir, const kd_options *o, kd_dir *out);
void kd_dir_free(kd_dir *d);

#endif
