/* experiments/tasks/speech/kaldi_dir.c and speech_data.c: a Kaldi data directory made of the
 * input, read as the speech task reads a split (kd_read, then sd_load: the features,
 * CMVN per speaker) and then as it reads another split, with the first one's phone
 * inventory given.
 *
 * Input: sections "\0@@NAME\n" followed by the file's bytes, up to the next "\0@@" or
 * the end (as fuzz_train_checkpoint's), each written as the file NAME of the data
 * directory; bytes before the first section are ignored. NAME is one of wav.scp,
 * feats.scp, text, utt2spk, phones.txt, lexicon, segments (refused when present) and
 * the data files a.ark, b.ark, a.wav, b.wav; the section "drop" is the option of that
 * name (symbols left out of the targets), not a file. With a lexicon section the text
 * holds words (the option lexicon names DIR/lexicon). Other names end the input.
 *
 * The directory is the process's scratch folder, and the reading runs from there (the
 * paths of wav.scp and feats.scp are relative to the current folder, as in Kaldi), so
 * "u1 a.ark:6" in feats.scp reaches the archive a.ark of the same input: kaldi_ark's
 * reader behind the directory's. Only the input's own files are read: sd_load is not
 * called when an entry names a path with '/' or a command (a wav.scp line ending in
 * '|' would run it through /bin/sh); kd_read parses them all the same. Audio is decoded
 * (libsndfile, then the filterbank) only from the input's WAV files, so its cost is
 * bounded by the input's size.
 *
 * An accepted directory has utterances, each with a speaker, phone ids inside the
 * inventory; loaded, each has frames of the same width, finite features (after CMVN);
 * and read again with its own inventory given, the same utterances, phone ids and
 * features. */
#include "error.h"
#include "fuzz_util.h"
#include "kaldi_dir.h"
#include "speech_data.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MARK "\0@@"
#define MARK_LEN 3

/* The files a section may be (the names removed before each input). */
static const char *const FILES[] = {"wav.scp", "feats.scp", "text", "utt2spk", "phones.txt", "lexicon",
                                    "segments", "a.ark", "b.ark", "a.wav", "b.wav"};
enum { N_FILES = sizeof FILES / sizeof FILES[0] };

static const uint8_t *find_mark(const uint8_t *p, const uint8_t *end) {
    for (; end - p >= MARK_LEN; p++)
        if (memcmp(p, MARK, MARK_LEN) == 0) return p;
    return NULL;
}

/* Writes the input's sections into the scratch folder; the drop option (NUL-free, or
 * NULL) into `drop` (malloc'ed), whether a lexicon was written into *lexicon. */
static void write_dir(const uint8_t *data, size_t size, char **drop, bool *lexicon) {
    for (int i = 0; i < N_FILES; i++) unlink(fuzz_path(FILES[i]));
    *drop = NULL;
    *lexicon = false;
    const uint8_t *end = data + size, *p = find_mark(data, end);
    while (p) {
        const uint8_t *name = p + MARK_LEN, *nl = memchr(name, '\n', (size_t)(end - name));
        if (!nl || nl - name > 15) break;
        char nm[16];
        memcpy(nm, name, (size_t)(nl - name));
        nm[nl - name] = '\0';
        const uint8_t *body = nl + 1, *next = find_mark(body, end);
        const size_t n = (size_t)((next ? next : end) - body);
        if (strcmp(nm, "drop") == 0) {
            free(*drop);
            *drop = strndup((const char *)body, n); /* up to a NUL byte */
        } else {
            int k = 0;
            while (k < N_FILES && strcmp(nm, FILES[k]) != 0) k++;
            if (k == N_FILES) break;
            fuzz_file(nm, body, n);
            if (k == 5) *lexicon = true;
        }
        p = next;
    }
}

/* What kd_read's result must satisfy; whether sd_load may follow it (only the input's
 * own files named, no command). */
static bool check_dir(const kd_dir *d) {
    if (d->n < 1 || d->n_speakers < 1 || d->n_speakers > d->n || d->phones.count < 1)
        fuzz_fail("kd_read", "accepted %d utterances of %d speakers, %d phones", d->n, d->n_speakers, d->phones.count);
    if (d->source != KD_SOURCE_WAV && d->source != KD_SOURCE_FEATS) fuzz_fail("kd_read", "source %d", (int)d->source);
    bool local = true;
    for (int i = 0; i < d->n; i++) {
        const kd_utt *u = &d->utts[i];
        if (!u->id || !u->id[0]) fuzz_fail("kd_read", "utterance %d has no id", i);
        if (u->speaker < 0 || u->speaker >= d->n_speakers)
            fuzz_fail("kd_read", "utterance '%s' has speaker %d of %d", u->id, u->speaker, d->n_speakers);
        if (u->n_phones < 0 || (u->n_phones > 0 && !u->phones)) fuzz_fail("kd_read", "utterance '%s' phones", u->id);
        for (int k = 0; k < u->n_phones; k++)
            if (u->phones[k] < 0 || u->phones[k] >= d->phones.count)
                fuzz_fail("kd_read", "utterance '%s' has phone id %d of %d", u->id, u->phones[k], d->phones.count);
        const char *file = d->source == KD_SOURCE_FEATS ? u->feats_path : u->audio;
        if (!file || !file[0]) fuzz_fail("kd_read", "utterance '%s' has no %s", u->id, d->source == KD_SOURCE_FEATS ? "features" : "audio");
        if (d->source == KD_SOURCE_FEATS && u->feats_offset < 0)
            fuzz_fail("kd_read", "utterance '%s' at offset %lld", u->id, u->feats_offset);
        if (u->audio_command || strchr(file, '/')) local = false;
    }
    for (int i = 0; i < d->phones.count; i++)
        if (!d->phones.names[i] || !d->phones.names[i][0]) fuzz_fail("kd_read", "phone %d has no name", i);
    return local;
}

static void check_data(const sd_data *s, const kd_dir *d) {
    if (s->n != d->n || s->dim < 1 || s->phones.count != d->phones.count)
        fuzz_fail("sd_load", "%d utterances of %d features, %d phones (the directory: %d utterances, %d phones)", s->n,
                  s->dim, s->phones.count, d->n, d->phones.count);
    long long frames = 0;
    for (int i = 0; i < s->n; i++) {
        const sd_utt *u = &s->utts[i];
        if (strcmp(u->id, d->utts[i].id) != 0 || u->n_phones != d->utts[i].n_phones ||
            (u->n_phones && memcmp(u->phones, d->utts[i].phones, sizeof(int) * (size_t)u->n_phones) != 0))
            fuzz_fail("sd_load", "utterance %d ('%s') is not the directory's", i, u->id);
        if (u->frames < 1 || !u->feats) fuzz_fail("sd_load", "utterance '%s' has %d frames", u->id, u->frames);
        for (size_t k = 0; k < (size_t)u->frames * (size_t)s->dim; k++)
            if (!isfinite(u->feats[k]))
                fuzz_fail("sd_load", "utterance '%s': feature %zu (frame %zu) is %g", u->id, k, k / (size_t)s->dim,
                          (double)u->feats[k]);
        frames += u->frames;
    }
    if (frames != s->frames) fuzz_fail("sd_load", "%lld frames, the utterances hold %lld", s->frames, frames);
}

static bool same_data(const sd_data *a, const sd_data *b) {
    if (a->n != b->n || a->dim != b->dim || a->phones.count != b->phones.count || a->n_speakers != b->n_speakers)
        return false;
    for (int i = 0; i < a->phones.count; i++)
        if (strcmp(a->phones.names[i], b->phones.names[i]) != 0) return false;
    for (int i = 0; i < a->n; i++) {
        const sd_utt *u = &a->utts[i], *v = &b->utts[i];
        if (strcmp(u->id, v->id) != 0 || u->speaker != v->speaker || u->frames != v->frames ||
            u->n_phones != v->n_phones ||
            (u->n_phones && memcmp(u->phones, v->phones, sizeof(int) * (size_t)u->n_phones) != 0) ||
            memcmp(u->feats, v->feats, sizeof(float) * (size_t)u->frames * (size_t)a->dim) != 0)
            return false;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int home = -1;
    if (home < 0 && (home = open(".", O_RDONLY | O_DIRECTORY)) < 0) {
        perror("fuzz: open .");
        abort();
    }
    char *drop;
    bool lexicon;
    write_dir(data, size, &drop, &lexicon);
    const char *dir = fuzz_dir();
    if (chdir(dir) != 0) {
        perror("fuzz: chdir");
        abort();
    }

    kd_options ko = {KD_SOURCE_AUTO, lexicon ? "lexicon" : NULL, NULL, drop, NULL};
    kd_dir d;
    int rc = kd_read(".", &ko, &d);
    if (rc) {
        fuzz_refused(rc, "kd_read");
    } else if (check_dir(&d)) {
        sd_options o;
        sd_options_default(&o);
        o.lexicon = ko.lexicon;
        o.drop = drop;
        sd_data s;
        if ((rc = sd_load(".", &o, NULL, &s))) {
            fuzz_refused(rc, "sd_load");
        } else {
            check_data(&s, &d);
            /* another split of the same data: the first one's inventory given */
            sd_data t;
            if ((rc = sd_load(".", &o, &s.phones, &t)))
                fuzz_fail("sd_load", "refused with its own inventory given: %s", ab_error());
            if (!same_data(&s, &t) || strcmp(t.phones_from, "given") != 0)
                fuzz_fail("sd_load", "read with its own inventory given, another data set");
            sd_data_free(&t);
            sd_data_free(&s);
        }
    }
    kd_dir_free(&d); /* zeroed by a refusal: nothing to free then */

    if (fchdir(home) != 0) {
        perror("fuzz: fchdir");
        abort();
    }
    free(drop);
    fuzz_no_tracked_memory("Kaldi data directory");
    return 0;
}
