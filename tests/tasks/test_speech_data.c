/* The speech experiment's data directories (experiments/tasks/speech/kaldi_dir.h,
 * speech_data.h, feat_cache.h, audio.h) and `attnbench features`, part of the
 * speech_data suite: a tiny corpus of synthetic WAVs that the tests write with
 * libsndfile (one read through a wav.scp command) loads end to end with the features
 * fbank.c computes from the same samples, phones through phones.txt, a lexicon or an
 * inventory built from the data or given; every kind of bad input is one line naming
 * the file and line; features through feats.scp (float and compressed archives); CMVN
 * per speaker and per utterance against a float64 computation; the cache (a second
 * load reads it, a change of options or audio recomputes, a damaged archive is
 * refused); the same features on 1 and 2 threads; the options from JSON; the CLI. */
#include <criterion/criterion.h>

#include "blas.h"
#include "data_command.h"
#include "error.h"
#include "fbank.h"
#include "kaldi_ark.h"
#include "memory.h"
#include "rng.h"
#include "speech_data.h"
#include "test_proc.h"
#include "test_util.h"

#include <jansson.h>
#include <math.h>
#include <sndfile.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FIX ATTNBENCH_SOURCE_DIR "/tests/fixtures/speech"

static char g_dir[600];
static char *g_out, *g_err;

/* The corpus reads one utterance through a command: allowed here (the policy's own
 * tests are test_speech_commands.c), refused again after each test. */
static void setup(void) {
    tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/speech-data-tmp");
    dc_policy p;
    dc_policy_default(&p);
    p.allowed = true;
    dc_set_policy(&p);
}
static void teardown(void) {
    dc_policy p;
    dc_policy_default(&p);
    dc_set_policy(&p);
    tp_rm_tree(g_dir);
    free(g_out);
    free(g_err);
    g_out = g_err = NULL;
}

TestSuite(speech_data, .init = setup, .fini = teardown, .timeout = 120);

/* A path in the scratch folder (tp_path). */
#define P(...) tp_path(g_dir, __VA_ARGS__)

static void put(const char *path, const char *text) { tp_write_bytes(path, text, strlen(text)); }

/* ---- the fixture corpus ---- */

/* Utterance u's sample i: two tones that differ per utterance, a slow glide, and
 * noise, at the 16-bit scale. */
static short sample(int u, long i, int rate) {
    const double t = (double)i / rate;
    double v = 3000 * sin(2 * M_PI * (200 + 150 * u) * t) + 1500 * sin(2 * M_PI * (900 + 700 * u + 400 * t) * t) +
               200 * ab_rng_normal(11, (uint64_t)u, (uint64_t)i);
    return (short)lrint(v);
}

static void write_wav(const char *path, int u, long n, int rate, int channels) {
    SF_INFO info = {.samplerate = rate, .channels = channels, .format = SF_FORMAT_WAV | SF_FORMAT_PCM_16};
    SNDFILE *sf = sf_open(path, SFM_WRITE, &info);
    cr_assert_not_null(sf, "cannot write %s: %s", path, sf_strerror(NULL));
    short *s = malloc(sizeof(short) * (size_t)n * channels);
    for (long i = 0; i < n; i++)
        for (int c = 0; c < channels; c++) s[i * channels + c] = sample(u + c, i, rate);
    cr_assert_eq(sf_writef_short(sf, s, n), n);
    sf_close(sf);
    free(s);
}

/* Lengths of the corpus's utterances (samples at 16 kHz): 0.25 s to 0.5 s. */
static const long LEN[4] = {4000, 6123, 8000, 5001};

/* DIR (under the scratch folder): u1..u4, u3's audio through a command, speakers s1
 * (u1, u2, u4) and s2 (u3), phones.txt with <eps>, a disambiguation symbol and "sil". */
static const char *corpus(const char *name) {
    char dir[900];
    snprintf(dir, sizeof dir, "%s", P("%s", name));
    mkdir(dir, 0755);
    char scp[5000] = "", line[1100];
    for (int u = 0; u < 4; u++) {
        char wav[1000];
        snprintf(wav, sizeof wav, "%s/u%d.wav", dir, u + 1);
        write_wav(wav, u, LEN[u], 16000, 1);
        if (u == 2) snprintf(line, sizeof line, "u%d cat %s |\n", u + 1, wav);
        else snprintf(line, sizeof line, "u%d %s\n", u + 1, wav);
        strcat(scp, line);
    }
    put(P("%s/wav.scp", name), scp);
    put(P("%s/text", name), "u1 a b sil a\nu2 b b c\nu3 sil c a\nu4 a\n");
    put(P("%s/utt2spk", name), "u1 s1\nu2 s1\nu3 s2\nu4 s1\n");
    put(P("%s/phones.txt", name), "<eps> 0\na 1\nb 2\nc 3\nsil 4\n#0 5\n");
    return P("%s", name);
}

static sd_options opts(void) {
    sd_options o;
    sd_options_default(&o);
    return o;
}

/* The features fbank.c computes from utterance u's samples. */
static float *expected_feats(int u, long *frames) {
    fb_options fo;
    fb_options_default(&fo);
    fbank *fb;
    cr_assert_eq(fb_create(&fo, &fb), 0);
    float *x = malloc(sizeof(float) * (size_t)LEN[u]);
    for (long i = 0; i < LEN[u]; i++) x[i] = sample(u, i, 16000);
    *frames = fb_frames(fb, LEN[u]);
    float *f = malloc(sizeof(float) * (size_t)*frames * 40);
    cr_assert_eq(fb_compute(fb, x, LEN[u], f), 0);
    fb_destroy(fb);
    free(x);
    return f;
}

Test(speech_data, a_corpus_loads_end_to_end) {
    char dir[900];
    snprintf(dir, sizeof dir, "%s", corpus("c"));
    sd_options o = opts();
    o.cmvn = SD_CMVN_NONE;
    o.drop = "sil";
    sd_data d;
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0, "%s", ab_error());
    cr_expect_eq(d.n, 4);
    cr_expect_eq(d.dim, 40);
    cr_expect_str_eq(d.features_from, "audio");
    cr_expect_not(d.cache_written);
    /* the inventory: phones.txt by id, less <eps>, #0 and the dropped sil */
    cr_assert_eq(d.phones.count, 3);
    cr_expect(!strcmp(d.phones.names[0], "a") && !strcmp(d.phones.names[1], "b") && !strcmp(d.phones.names[2], "c"));
    cr_expect(strstr(d.phones_from, "c/phones.txt"), "%s", d.phones_from);
    const int want_n[4] = {3, 3, 2, 1};
    const int want[4][3] = {{0, 1, 0}, {1, 1, 2}, {2, 0, 0}, {0, 0, 0}};
    cr_assert_eq(d.n_speakers, 2);
    cr_expect(!strcmp(d.speakers[0], "s1") && !strcmp(d.speakers[1], "s2"));
    const int spk[4] = {0, 0, 1, 0};
    long long frames = 0;
    for (int u = 0; u < 4; u++) {
        const sd_utt *x = &d.utts[u];
        char id[8];
        snprintf(id, sizeof id, "u%d", u + 1);
        cr_expect_str_eq(x->id, id);
        cr_expect_eq(x->speaker, spk[u], "%s", id);
        cr_assert_eq(x->n_phones, want_n[u], "%s", id);
        for (int k = 0; k < want_n[u]; k++) cr_expect_eq(x->phones[k], want[u][k], "%s phone %d", id, k);
        long t;
        float *f = expected_feats(u, &t);
        cr_assert_eq(x->frames, t, "%s: %d frames, expected %ld", id, x->frames, t);
        cr_expect_eq(t, 1 + (LEN[u] - 400) / 160);
        cr_expect(memcmp(x->feats, f, sizeof(float) * (size_t)t * 40) == 0,
                  "%s: the features differ from fbank.c's of the same samples%s", id, u == 2 ? " (read through cat)" : "");
        free(f);
        frames += t;
    }
    cr_expect_eq(d.frames, frames);
    cr_expect_eq(d.phone_tokens, 9);
    cr_expect_float_eq(d.seconds, (4000 + 6123 + 8000 + 5001) / 16000.0, 1e-12);
    sd_data_free(&d);
}

Test(speech_data, words_through_a_lexicon_and_built_or_given_inventories) {
    char dir[900];
    snprintf(dir, sizeof dir, "%s", corpus("w"));
    remove(P("w/phones.txt"));
    put(P("w/text"), "u1 hello world\nu2 world\nu3 hello hello\nu4 <noise>\n");
    /* the second line of a word is ignored; SIL is dropped */
    put(P("w/lexicon.txt"), "hello h e l o\nworld w o r l d\nhello x x\n<noise> SIL\nunused q\n");
    sd_options o = opts();
    o.cmvn = SD_CMVN_NONE;
    o.lexicon = P("w/lexicon.txt");
    o.drop = "SIL";
    sd_data d;
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0, "%s", ab_error());
    /* built from the lexicon: all its phones but SIL, sorted by byte value */
    const char *inv[] = {"d", "e", "h", "l", "o", "q", "r", "w"};
    cr_assert_eq(d.phones.count, 8);
    for (int i = 0; i < 8; i++) cr_expect_str_eq(d.phones.names[i], inv[i]);
    cr_expect_str_eq(d.phones_from, o.lexicon);
    const int u1[] = {2, 1, 3, 4, 7, 4, 6, 3, 0};
    cr_assert_eq(d.utts[0].n_phones, 9);
    for (int k = 0; k < 9; k++) cr_expect_eq(d.utts[0].phones[k], u1[k], "u1 phone %d", k);
    cr_expect_eq(d.utts[3].n_phones, 0, "u4 (only SIL) has no targets");
    /* another directory with this inventory: the same ids; a phone outside it refused */
    char dir2[900];
    snprintf(dir2, sizeof dir2, "%s", corpus("w2"));
    remove(P("w2/phones.txt"));
    put(P("w2/text"), "u1 w o r l d\nu2 h\nu3 o\nu4 d sil\n");
    sd_options o2 = opts();
    o2.cmvn = SD_CMVN_NONE;
    o2.drop = "sil";
    sd_data d2;
    cr_assert_eq(sd_load(dir2, &o2, &d.phones, &d2), 0, "%s", ab_error());
    cr_expect_str_eq(d2.phones_from, "given");
    cr_assert_eq(d2.phones.count, 8);
    const int w2[] = {7, 4, 6, 3, 0};
    for (int k = 0; k < 5; k++) cr_expect_eq(d2.utts[0].phones[k], w2[k]);
    cr_expect_eq(d2.utts[3].n_phones, 1);
    sd_data_free(&d2);
    put(P("w2/text"), "u1 w o\nu2 z\nu3 o\nu4 d\n");
    tu_expect_fail(sd_load(dir2, &o2, &d.phones, &d2), AB_EINVAL, "a phone outside the given inventory", "w2/text:2",
                "unknown phone 'z'", "the given inventory", NULL);
    o2.drop = "o";
    tu_expect_fail(sd_load(dir2, &o2, &d.phones, &d2), AB_EINVAL, "dropping a phone of the given inventory",
                "drop: 'o' is phone 4", NULL);
    /* built from the text (no lexicon): its symbols, sorted */
    put(P("w2/text"), "u1 zz b\nu2 a\nu3 b a\nu4 zz\n");
    o2.drop = NULL;
    cr_assert_eq(sd_load(dir2, &o2, NULL, &d2), 0, "%s", ab_error());
    cr_assert_eq(d2.phones.count, 3);
    cr_expect(!strcmp(d2.phones.names[0], "a") && !strcmp(d2.phones.names[1], "b") && !strcmp(d2.phones.names[2], "zz"));
    cr_expect_str_eq(d2.phones_from, "text");
    cr_expect(d2.utts[0].phones[0] == 2 && d2.utts[0].phones[1] == 1);
    sd_data_free(&d2);
    sd_data_free(&d);
}

/* One bad input: the corpus with `file` replaced by `text` (a format whose %1$s is the
 * corpus folder; `size` bytes of it, 0: up to its NUL; NULL: the file removed), loaded
 * with drop "sil" and optionally a lexicon; must fail with AB_EINVAL naming `must`. */
typedef struct {
    const char *what, *file, *text, *must1, *must2;
    bool lexicon;
    size_t size;
} bad_case;

static void check_bad(const bad_case *c, int i) {
    char name[32];
    snprintf(name, sizeof name, "bad%d", i);
    char dir[900];
    snprintf(dir, sizeof dir, "%s", corpus(name));
    char path[1000];
    snprintf(path, sizeof path, "%s/%s", dir, c->file);
    put(P("%s/lexicon.txt", name), "w1 a b\nw2 c\n");
    char text[2000];
    if (c->size) {
        tp_write_bytes(path, c->text, c->size);
    } else if (c->text) {
        snprintf(text, sizeof text, c->text, dir);
        put(path, text);
    } else {
        remove(path);
    }
    sd_options o = opts();
    o.drop = "sil";
    if (c->lexicon) o.lexicon = P("%s/lexicon.txt", name);
    sd_data d;
    tu_expect_fail(sd_load(dir, &o, NULL, &d), AB_EINVAL, c->what, c->must1, c->must2, NULL);
}

/* wav.scp's lines for u2..u4, after a bad one for u1 */
#define REST "u2 %1$s/u2.wav\nu3 %1$s/u3.wav\nu4 %1$s/u4.wav\n"

Test(speech_data, bad_directories_are_one_line_naming_file_and_line) {
    static const char nul[] = "u1 a\nu2 b\0c\n";
    const bad_case cases[] = {
        {"an utterance without audio", "text", "u1 a\nu9 b\n", "text:2", "'u9' has no audio: it is not in", false, 0},
        {"an unknown phone", "text", "u1 a\nu2 zz\n", "text:2", "unknown phone 'zz'", false, 0},
        {"a duplicate utterance in text", "text", "u1 a\nu2 b\n\nu1 c\n", "text:4", "'u1' again (first on line 1)", false, 0},
        {"a duplicate in wav.scp", "wav.scp", "u1 %1$s/u1.wav\nu1 %1$s/u2.wav\n", "wav.scp:2", "'u1' again", false, 0},
        {"a key alone in wav.scp", "wav.scp", "u1\n", "wav.scp:1", "'u1' alone on its line", false, 0},
        {"a spaced path in wav.scp", "wav.scp", "u1 %1$s/u1.wav extra\n" REST, "wav.scp:1", "neither a path", false, 0},
        {"an empty command", "wav.scp", "u1  |\n", "wav.scp:1", "an empty command", false, 0},
        {"standard input as audio", "wav.scp", "u1 -\n", "wav.scp:1", "standard input", false, 0},
        {"no speaker for an utterance", "utt2spk", "u1 s1\nu3 s2\n", "text:2", "'u2' has no speaker", false, 0},
        {"three fields in utt2spk", "utt2spk", "u1 s1 x\n", "utt2spk:1", "not UTTERANCE SPEAKER", false, 0},
        {"a phone id that is not a number", "phones.txt", "a 1\nb x\n", "phones.txt:2", "not SYMBOL INTEGER", false, 0},
        {"a phone id twice", "phones.txt", "a 1\nb 2\nc 1\nsil 4\n", "phones.txt:3", "id 1 again", false, 0},
        {"a phone symbol twice", "phones.txt", "a 1\nb 2\na 3\n", "phones.txt:3", "'a' again", false, 0},
        {"a dropped symbol not in phones.txt", "phones.txt", "a 1\nb 2\nc 3\n", "drop: 'sil'", "phones.txt", false, 0},
        {"a word not in the lexicon", "text", "u1 w1\nu2 w2 zz\nu3 w1\nu4 w2\n", "text:2", "word 'zz' is not in the lexicon",
         true, 0},
        {"a lexicon phone not in phones.txt", "lexicon.txt", "w1 a b\nw2 q\n", "lexicon.txt:2", "unknown phone 'q'", true, 0},
        {"a segments file", "segments", "u1 rec 0 1\n", "segments", "not supported", false, 0},
        {"neither wav.scp nor feats.scp", "wav.scp", NULL, "neither wav.scp nor feats.scp", NULL, false, 0},
        {"a NUL byte in text", "text", nul, "text:2", "NUL byte", false, sizeof nul - 1},
        {"an empty text", "text", "\n\n", "text", "no utterances", false, 0},
        {"a missing audio file", "wav.scp", "u1 %1$s/nothere.wav\n" REST, "wav.scp:1 (utterance 'u1')", "nothere.wav", false, 0},
        {"a failing command", "wav.scp", "u1 echo boom >&2; exit 3 |\n" REST, "wav.scp:1 (utterance 'u1')",
         "failed (exit status 3): boom", false, 0},
        {"a command without output", "wav.scp", "u1 true |\n" REST, "wav.scp:1", "wrote no audio", false, 0},
        {"a command writing no audio", "wav.scp", "u1 echo not audio |\n" REST, "wav.scp:1",
         "not audio that libsndfile reads", false, 0},
        {"a text file as audio", "wav.scp", "u1 %1$s/text\n" REST, "wav.scp:1", "not audio that libsndfile reads", false, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_bad(&cases[i], (int)i);
}

/* An optional file (utt2spk, phones.txt, feats.scp, segments) that is a symbolic link
 * leading nowhere, or into a loop, is refused naming it: a dangling utt2spk was taken
 * for absent, so CMVN silently became per utterance (issue 28, defect 8). A folder in
 * its place is refused too. */
Test(speech_data, an_optional_file_that_cannot_be_followed_is_refused) {
    static const char *const names[4] = {"utt2spk", "phones.txt", "feats.scp", "segments"};
    for (int i = 0; i < 4; i++)
        for (int kind = 0; kind < 3; kind++) {
            char name[32], dir[900], path[1000];
            snprintf(name, sizeof name, "o%d%d", i, kind);
            snprintf(dir, sizeof dir, "%s", corpus(name));
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            remove(path);
            if (kind == 0) cr_assert_eq(symlink("nowhere", path), 0);
            if (kind == 1) { /* a loop of two links */
                char other[1000];
                snprintf(other, sizeof other, "%s/other", dir);
                cr_assert_eq(symlink(other, path), 0);
                cr_assert_eq(symlink(path, other), 0);
            }
            if (kind == 2) cr_assert_eq(mkdir(path, 0755), 0);
            sd_options o = opts();
            sd_data d;
            int rc = sd_load(dir, &o, NULL, &d);
            char what[80];
            snprintf(what, sizeof what, "%s as %s", names[i], kind == 0 ? "a dangling link" : kind == 1 ? "a link loop" : "a folder");
            tu_expect_fail(rc, AB_EINVAL, what, path, NULL);
            if (!rc) sd_data_free(&d);
        }
}

Test(speech_data, bad_audio_is_refused) {
    char dir[900];
    snprintf(dir, sizeof dir, "%s", corpus("a"));
    sd_options o = opts();
    sd_data d;
    /* 8 kHz audio with the 16 kHz default; then computed at its rate when asked */
    write_wav(P("a/u2.wav"), 1, 3000, 8000, 1);
    tu_expect_fail(sd_load(dir, &o, NULL, &d), AB_EINVAL, "8 kHz audio", "wav.scp:2 (utterance 'u2')",
                "at 8000 Hz, the features expect 16000 Hz", NULL);
    for (int u = 0; u < 4; u++) write_wav(P("a/u%d.wav", u + 1), u, 3000, 8000, 1);
    cr_assert_eq(sd_options_set(&o, "sample_rate", "8000"), 0);
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0, "%s", ab_error());
    cr_expect_eq(d.utts[0].frames, 1 + (3000 - 200) / 80, "8 kHz: 200-sample frames every 80");
    sd_data_free(&d);
    o = opts();
    corpus("a");
    write_wav(P("a/u4.wav"), 3, 5000, 16000, 2);
    tu_expect_fail(sd_load(dir, &o, NULL, &d), AB_EINVAL, "stereo audio", "wav.scp:4", "2 channels", NULL);
    write_wav(P("a/u4.wav"), 3, 399, 16000, 1);
    tu_expect_fail(sd_load(dir, &o, NULL, &d), AB_EINVAL, "audio shorter than a frame", "wav.scp:4",
                "shorter than one frame of 400 samples", NULL);
    /* a WAV cut short: its header announces more samples than it holds */
    write_wav(P("a/u4.wav"), 3, 8000, 16000, 1);
    size_t n;
    unsigned char *b = tp_read_bytes(P("a/u4.wav"), &n);
    tp_write_bytes(P("a/u4.wav"), b, n / 2);
    free(b);
    tu_expect_fail(sd_load(dir, &o, NULL, &d), AB_EINVAL, "a truncated WAV", "wav.scp:4", "truncated", NULL);
    /* a float WAV holding a NaN, and a value that the 16-bit scale takes past the float
     * range (the fuzz target wav found the second at once: each was accepted, and made
     * the features, and through CMVN its speaker's, non-finite) */
    const float bad[2] = {NAN, 3e38f};
    for (int k = 0; k < 2; k++) {
        SF_INFO info = {.samplerate = 16000, .channels = 1, .format = SF_FORMAT_WAV | SF_FORMAT_FLOAT};
        SNDFILE *sf = sf_open(P("a/u4.wav"), SFM_WRITE, &info);
        cr_assert_not_null(sf, "%s", sf_strerror(NULL));
        float x[800];
        for (int i = 0; i < 800; i++) x[i] = i == 700 ? bad[k] : 0.1f * sinf(0.05f * i);
        sf_command(sf, SFC_SET_NORM_FLOAT, NULL, SF_FALSE);
        cr_assert_eq(sf_writef_float(sf, x, 800), 800);
        sf_close(sf);
        tu_expect_fail(sd_load(dir, &o, NULL, &d), AB_EINVAL, "a float sample that is not finite", "wav.scp:4",
                    "sample 700 (at ", k ? "3e+38" : "nan", "not a finite number", NULL);
    }
    /* a 42-byte FLAC whose STREAMINFO announces 2^35 samples (found by reading the
     * reader while writing the fuzz target wav): refused as truncated without asking
     * for the 128 GiB the count would take */
    unsigned char flac[42] = {'f', 'L', 'a', 'C', 0x80, 0, 0, 34, 0x10, 0, 0x10, 0};
    const uint64_t info = (uint64_t)16000 << 44 | (uint64_t)0 << 41 | (uint64_t)15 << 36 | (uint64_t)1 << 35;
    for (int i = 0; i < 8; i++) flac[18 + i] = (unsigned char)(info >> (56 - 8 * i));
    tp_write_bytes(P("a/u4.wav"), flac, sizeof flac);
    ab_mem_reset_peak(AB_DEV_CPU);
    const size_t before = ab_mem_peak(AB_DEV_CPU);
    tu_expect_fail(sd_load(dir, &o, NULL, &d), AB_EINVAL, "a FLAC announcing 2^35 samples", "wav.scp:4",
                "ends after 0 of its 34359738368 samples", NULL);
    /* at most the first 2^20 samples' buffer (4 MiB) besides the other utterances */
    cr_expect_leq(ab_mem_peak(AB_DEV_CPU), before + ((size_t)5 << 20), "peak %zu -> %zu", before,
                  ab_mem_peak(AB_DEV_CPU));
}

/* ---- features from archives ---- */

Test(speech_data, features_through_feats_scp) {
    mkdir(P("f"), 0755);
    /* u1 from a float archive the test writes, u2 from the committed compressed (CM)
     * fixture, 7 x 5 */
    float m[3 * 5];
    for (int i = 0; i < 15; i++) m[i] = (float)(i * 0.5 - 3);
    ka_writer *w;
    cr_assert_eq(ka_writer_open(P("f/a.ark"), P("f/a.scp"), P("f/a.ark"), &w), 0);
    cr_assert_eq(ka_writer_add(w, "u1", 3, 5, m), 0);
    cr_assert_eq(ka_writer_commit(w), 0);
    char scp[2000];
    snprintf(scp, sizeof scp, "u1 %s:3\nu2 %s/matrices.ark:167\n", P("f/a.ark"), FIX);
    put(P("f/feats.scp"), scp);
    put(P("f/text"), "u2 x\nu1 y x\n");
    sd_options o = opts();
    o.cmvn = SD_CMVN_NONE;
    sd_data d;
    cr_assert_eq(sd_load(P("f"), &o, NULL, &d), 0, "%s", ab_error());
    cr_expect_str_eq(d.features_from, "feats.scp");
    cr_expect_eq(d.dim, 5);
    cr_expect(d.utts[0].frames == 7 && d.utts[1].frames == 3);
    cr_expect(memcmp(d.utts[1].feats, m, sizeof m) == 0);
    ka_matrix cm;
    cr_assert_eq(ka_read_at(FIX "/matrices.ark", 167, "cm", &cm), 0);
    cr_expect(memcmp(d.utts[0].feats, cm.data, sizeof(float) * 35) == 0);
    ka_matrix_free(&cm);
    cr_expect_float_eq(d.seconds, 0.0, 0);
    sd_data_free(&d);
    /* another width (the CM2 fixture has 6 columns), a damaged archive, ranges */
    snprintf(scp, sizeof scp, "u1 %s:3\nu2 %s/matrices.ark:825\n", P("f/a.ark"), FIX);
    put(P("f/feats.scp"), scp);
    tu_expect_fail(sd_load(P("f"), &o, NULL, &d), AB_EINVAL, "archives of two widths", "feats.scp:1",
                "'u1' has 5 feature columns, 'u2' (line 2) has 6", NULL);
    size_t n;
    unsigned char *b = tp_read_bytes(P("f/a.ark"), &n);
    tp_write_bytes(P("f/a.ark"), b, n - 3);
    free(b);
    snprintf(scp, sizeof scp, "u1 %s:3\nu2 %s/matrices.ark:167\n", P("f/a.ark"), FIX);
    put(P("f/feats.scp"), scp);
    tu_expect_fail(sd_load(P("f"), &o, NULL, &d), AB_EINVAL, "a truncated archive", "feats.scp:1: ", "a.ark, offset 3",
                "truncated", NULL);
    put(P("f/feats.scp"), "u1 a.ark:3[0:1]\nu2 a.ark:3\n");
    tu_expect_fail(sd_load(P("f"), &o, NULL, &d), AB_EINVAL, "a row range", "feats.scp:1", "ranges", NULL);
    /* source=wav without wav.scp */
    o.source = KD_SOURCE_WAV;
    tu_expect_fail(sd_load(P("f"), &o, NULL, &d), AB_EINVAL, "source wav", "wav.scp", NULL);
}

/* ---- CMVN ---- */

/* x -> (x - mean) / sd over each group (speaker or utterance), in double from the
 * raw features; against the loader's float result. The tolerance: (x - mean) * scale
 * is rounded to float once (|values| below ~6: 4e-7) after float64 statistics. */
static void expect_cmvn(const sd_data *raw, const sd_data *got, bool per_speaker, bool norm_vars) {
    const int D = raw->dim, G = per_speaker ? raw->n_speakers : raw->n;
    for (int g = 0; g < G; g++) {
        double s[64] = {0}, q[64] = {0};
        long long cnt = 0;
        for (int i = 0; i < raw->n; i++) {
            if ((per_speaker ? raw->utts[i].speaker : i) != g) continue;
            for (int t = 0; t < raw->utts[i].frames; t++)
                for (int j = 0; j < D; j++) {
                    const double x = raw->utts[i].feats[(size_t)t * D + j];
                    s[j] += x;
                    q[j] += x * x;
                }
            cnt += raw->utts[i].frames;
        }
        for (int i = 0; i < raw->n; i++) {
            if ((per_speaker ? raw->utts[i].speaker : i) != g) continue;
            double worst = 0;
            for (int t = 0; t < raw->utts[i].frames; t++)
                for (int j = 0; j < D; j++) {
                    const double mean = s[j] / cnt, sd = sqrt(q[j] / cnt - mean * mean);
                    const double want = (raw->utts[i].feats[(size_t)t * D + j] - mean) / (norm_vars ? sd : 1.0);
                    worst = fmax(worst, fabs(got->utts[i].feats[(size_t)t * D + j] - want) / fmax(1.0, fabs(want)));
                }
            cr_expect_leq(worst, 1e-5, "utterance %s (%s CMVN%s): %.3g off", raw->utts[i].id,
                          per_speaker ? "speaker" : "utterance", norm_vars ? "" : ", means only", worst);
        }
    }
}

Test(speech_data, cmvn_per_speaker_and_per_utterance) {
    char dir[900];
    snprintf(dir, sizeof dir, "%s", corpus("n"));
    sd_options o = opts();
    o.cmvn = SD_CMVN_NONE;
    sd_data raw, d;
    cr_assert_eq(sd_load(dir, &o, NULL, &raw), 0, "%s", ab_error());
    const sd_cmvn modes[3] = {SD_CMVN_SPEAKER, SD_CMVN_UTTERANCE, SD_CMVN_SPEAKER};
    const bool vars[3] = {true, true, false};
    for (int k = 0; k < 3; k++) {
        o.cmvn = modes[k];
        o.norm_vars = vars[k];
        cr_assert_eq(sd_load(dir, &o, NULL, &d), 0, "%s", ab_error());
        expect_cmvn(&raw, &d, modes[k] == SD_CMVN_SPEAKER, vars[k]);
        sd_data_free(&d);
    }
    /* the default is per speaker with variances */
    o = opts();
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0, "%s", ab_error());
    expect_cmvn(&raw, &d, true, true);
    double all_mean, all_std;
    cr_assert_eq(sd_feature_stats(&d, NULL, NULL, &all_mean, &all_std), 0);
    /* each speaker's every dimension at mean 0 and variance 1, so all of them too
     * (up to the float rounding of the values, ~1e-7) */
    cr_expect(fabs(all_mean) < 1e-6 && fabs(all_std - 1) < 1e-6, "mean %g, std %g", all_mean, all_std);
    sd_data_free(&d);
    sd_data_free(&raw);
}

/* ---- the cache ---- */

static bool same_features(const sd_data *a, const sd_data *b) {
    if (a->n != b->n || a->dim != b->dim) return false;
    for (int i = 0; i < a->n; i++)
        if (a->utts[i].frames != b->utts[i].frames ||
            memcmp(a->utts[i].feats, b->utts[i].feats, sizeof(float) * (size_t)a->utts[i].frames * a->dim))
            return false;
    return true;
}

Test(speech_data, the_cache_is_read_back_and_recomputed_when_stale) {
    char dir[900];
    snprintf(dir, sizeof dir, "%s", corpus("k"));
    sd_options o = opts();
    o.cache = P("cache/k/feats");
    sd_data first, d;
    cr_assert_eq(sd_load(dir, &o, NULL, &first), 0, "%s", ab_error());
    cr_expect_str_eq(first.features_from, "audio");
    cr_expect(first.cache_written);
    cr_expect(tp_exists(P("cache/k/feats.ark")) && tp_exists(P("cache/k/feats.scp")) && tp_exists(P("cache/k/feats.json")));
    /* a second load reads it: the same features, duration and targets */
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0, "%s", ab_error());
    cr_expect_str_eq(d.features_from, "cache");
    cr_expect_not(d.cache_written);
    cr_expect(same_features(&first, &d), "the cached features differ");
    cr_expect_float_eq(d.seconds, first.seconds, 1e-9);
    cr_expect_eq(d.phone_tokens, first.phone_tokens);
    sd_data_free(&d);
    /* CMVN is applied after the cache: another CMVN still reads it */
    o.cmvn = SD_CMVN_UTTERANCE;
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0, "%s", ab_error());
    cr_expect_str_eq(d.features_from, "cache");
    sd_data_free(&d);
    o.cmvn = SD_CMVN_SPEAKER;
    /* its index, readable by Kaldi's tools: every line an absolute ARK:OFFSET */
    char *scp = tp_slurp(P("cache/k/feats.scp"), NULL), *save = NULL;
    int lines = 0;
    for (char *l = strtok_r(scp, "\n", &save); l; l = strtok_r(NULL, "\n", &save), lines++) {
        char key[16], where[900];
        cr_assert_eq(sscanf(l, "%15s %899s", key, where), 2);
        char *colon = strrchr(where, ':');
        *colon = '\0';
        cr_expect_eq(where[0], '/', "not an absolute path: %s", where);
        ka_matrix m;
        cr_assert_eq(ka_read_at(where, atoll(colon + 1), key, &m), 0, "%s", ab_error());
        cr_expect_eq(m.rows, first.utts[lines].frames);
        ka_matrix_free(&m);
    }
    cr_expect_eq(lines, 4);
    free(scp);
    /* another option: computed again, and the cache rewritten */
    cr_assert_eq(sd_options_set(&o, "preemph", "0.9"), 0);
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0, "%s", ab_error());
    cr_expect_str_eq(d.features_from, "audio");
    cr_expect(d.cache_written);
    cr_expect_not(same_features(&first, &d), "pre-emphasis 0.9 gave the same features");
    sd_data_free(&d);
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0);
    cr_expect_str_eq(d.features_from, "cache");
    sd_data_free(&d);
    /* other audio (another signal, same length): computed again */
    write_wav(P("k/u2.wav"), 3, LEN[1], 16000, 1);
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0);
    cr_expect_str_eq(d.features_from, "audio");
    sd_data_free(&d);
    /* the audio of a command: the file the command names is watched too */
    write_wav(P("k/u3.wav"), 0, LEN[2], 16000, 1);
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0);
    cr_expect_str_eq(d.features_from, "audio");
    sd_data_free(&d);
    /* a damaged archive under a matching key: refused, naming it */
    size_t n;
    unsigned char *b = tp_read_bytes(P("cache/k/feats.ark"), &n);
    tp_write_bytes(P("cache/k/feats.ark"), b, n - 100);
    free(b);
    tu_expect_fail(sd_load(dir, &o, NULL, &d), AB_EINVAL, "a damaged cache", "feature cache", "truncated",
                "delete", NULL);
    /* a broken key file: no cache, computed again and rewritten */
    put(P("cache/k/feats.json"), "{ not json");
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0, "%s", ab_error());
    cr_expect(!strcmp(d.features_from, "audio") && d.cache_written);
    sd_data_free(&d);
    /* one flipped bit in a stored float (the archive still parses): refused by the
     * features' CRC-32, which the cache had none of (issue 28) */
    b = tp_read_bytes(P("cache/k/feats.ark"), &n);
    b[n - 3] ^= 0x01; /* inside the last utterance's last float */
    tp_write_bytes(P("cache/k/feats.ark"), b, n);
    free(b);
    tu_expect_fail(sd_load(dir, &o, NULL, &d), AB_EINVAL, "a flipped value in the cache", "feature cache", "CRC-32",
                "delete", NULL);
    /* a cache written before the checksum (no features_crc32): computed again */
    json_t *meta = json_load_file(P("cache/k/feats.json"), 0, NULL);
    cr_assert_not_null(meta);
    json_object_del(meta, "features_crc32");
    cr_assert_eq(json_dump_file(meta, P("cache/k/feats.json"), 0), 0);
    json_decref(meta);
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0, "%s", ab_error());
    cr_expect(!strcmp(d.features_from, "audio") && d.cache_written, "an old cache without a checksum is rewritten");
    sd_data_free(&d);
    cr_assert_eq(sd_load(dir, &o, NULL, &d), 0, "%s", ab_error());
    cr_expect_str_eq(d.features_from, "cache");
    sd_data_free(&d);
    sd_data_free(&first);
}

Test(speech_data, the_same_features_on_one_and_two_threads) {
    char dir[900];
    snprintf(dir, sizeof dir, "%s", corpus("t"));
    sd_options o = opts();
    sd_data a, b;
    ab_set_threads(1);
    cr_assert_eq(sd_load(dir, &o, NULL, &a), 0, "%s", ab_error());
    ab_set_threads(2);
    cr_assert_eq(sd_load(dir, &o, NULL, &b), 0, "%s", ab_error());
    cr_expect(same_features(&a, &b), "1 and 2 threads computed other features");
    sd_data_free(&b);
    /* the first bad utterance in order is the one reported, whichever thread met it */
    put(P("t/wav.scp"), "u1 false |\nu2 false |\nu3 false |\nu4 false |\n");
    for (int k = 0; k < 5; k++)
        tu_expect_fail(sd_load(dir, &o, NULL, &b), AB_EINVAL, "every command failing", "wav.scp:1 (utterance 'u1')", NULL);
    sd_data_free(&a);
}

/* ---- options ---- */

Test(speech_data, options_from_text_and_json) {
    sd_options o = opts();
    tu_expect_fail(sd_options_set(&o, "mel_bins", "40"), AB_EINVAL, "an unknown key", "unknown speech data option 'mel_bins'",
                "num_mel_bins", NULL);
    tu_expect_fail(sd_options_set(&o, "num_mel_bins", "4x"), AB_EINVAL, "not a number", "num_mel_bins=4x", NULL);
    tu_expect_fail(sd_options_set(&o, "num_mel_bins", "2"), AB_EINVAL, "out of range", "[3, 1024]", NULL);
    tu_expect_fail(sd_options_set(&o, "cmvn", "global"), AB_EINVAL, "an unknown CMVN", "none, utterance or speaker", NULL);
    tu_expect_fail(sd_options_set(&o, "norm_vars", "yes"), AB_EINVAL, "not a boolean", "true or false", NULL);
    cr_assert_eq(sd_options_set(&o, "cmvn", "utterance"), 0);
    cr_assert_eq(sd_options_set(&o, "drop", "pau,sil"), 0);
    cr_expect(o.cmvn == SD_CMVN_UTTERANCE && !strcmp(o.drop, "pau,sil"));
    cr_assert_eq(sd_options_set(&o, "drop", ""), 0);
    cr_expect_null(o.drop);
    json_error_t e;
    json_t *j = json_loads("{\"num_mel_bins\": 80, \"preemph\": 0.5, \"cmvn\": \"none\", \"norm_vars\": false, "
                           "\"source\": \"wav\", \"phones\": \"p.txt\", \"lexicon\": null, \"high_freq\": -100}",
                           0, &e);
    o = opts();
    cr_assert_eq(sd_options_from_json(&o, j, "task.features"), 0, "%s", ab_error());
    cr_expect(o.fbank.num_mel_bins == 80 && o.fbank.preemph == 0.5 && o.cmvn == SD_CMVN_NONE && !o.norm_vars &&
              o.source == KD_SOURCE_WAV && !strcmp(o.phones, "p.txt") && !o.lexicon && o.fbank.high_freq == -100);
    json_t *back = sd_options_to_json(&o);
    sd_options o2 = opts();
    cr_assert_eq(sd_options_from_json(&o2, back, ""), 0, "%s", ab_error());
    json_t *again = sd_options_to_json(&o2);
    cr_expect(json_equal(back, again), "the options do not survive a round trip through JSON");
    json_decref(back);
    json_decref(again);
    json_decref(j);
    const char *bad[][2] = {
        {"{\"num_mel_bin\": 40}", "'task.features.num_mel_bin'"},
        {"{\"num_mel_bins\": 40.5}", "must be an integer"},
        {"{\"num_mel_bins\": 2000}", "outside [3, 1024]"},
        {"{\"cmvn\": 1}", "must be a string"},
        {"{\"cmvn\": \"global\"}", "task.features.cmvn"},
        {"{\"norm_vars\": \"true\"}", "true or false"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = json_loads(bad[i][0], 0, &e);
        cr_assert_not_null(j);
        o = opts();
        tu_expect_fail(sd_options_from_json(&o, j, "task.features"), AB_EINVAL, bad[i][0], bad[i][1], NULL);
        json_decref(j);
    }
}

/* ---- attnbench features ---- */

#define run(...)                                                                                                       \
    tp_run(g_dir, ATTNBENCH_EXE, NULL, TP_ARGV("--threads", "1", "--allow-commands", __VA_ARGS__, NULL), &g_out, &g_err)

Test(speech_data, the_features_command) {
    char dir[900];
    snprintf(dir, sizeof dir, "%s", corpus("cli"));
    int st = run("features", dir, "--set", "drop=sil", "--out", P("cc/feats"));
    cr_assert_eq(st, 0, "exit %d: %s", st, g_err);
    json_error_t e;
    json_t *j = json_loads(g_out, 0, &e);
    cr_assert_not_null(j, "not JSON (%s): %s", e.text, g_out);
    cr_expect_eq(json_integer_value(json_object_get(j, "utterances")), 4);
    cr_expect_eq(json_integer_value(json_object_get(j, "speakers")), 2);
    cr_expect_eq(json_integer_value(json_object_get(j, "phones")), 3);
    cr_expect_eq(json_integer_value(json_object_get(j, "phone_tokens")), 9);
    cr_expect_eq(json_integer_value(json_object_get(j, "frames")), 23 + 36 + 48 + 29);
    cr_expect_str_eq(json_string_value(json_object_get(j, "features_from")), "audio");
    cr_expect(json_is_true(json_object_get(j, "cache_written")));
    cr_expect_float_eq(json_real_value(json_object_get(j, "seconds")), 23124 / 16000.0, 1e-9);
    cr_expect_float_eq(json_real_value(json_object_get(j, "feature_std")), 1.0, 1e-6);
    cr_expect_eq(json_array_size(json_object_get(json_object_get(j, "per_dim"), "mean")), 40);
    json_decref(j);
    st = run("features", dir, "--set", "drop=sil", "--out", P("cc/feats"));
    cr_assert_eq(st, 0, "%s", g_err);
    j = json_loads(g_out, 0, &e);
    cr_expect_str_eq(json_string_value(json_object_get(j, "features_from")), "cache");
    json_decref(j);
    /* bad input: one line, exit 2 */
    st = run("features", P("nothere"));
    tp_usage_error(st, g_err, "a missing folder", TP_ARGV("nothere", NULL));
    st = run("features", dir, "--set", "mel_bins=40");
    tp_usage_error(st, g_err, "an unknown option", TP_ARGV("mel_bins", NULL));
    st = run("features", dir, "--set", "drop");
    tp_usage_error(st, g_err, "--set without =", TP_ARGV("KEY=VALUE", NULL));
    st = run("features", dir, "--set", "drop=pau");
    tp_usage_error(st, g_err, "dropping a symbol phones.txt lacks", TP_ARGV("drop: 'pau'", "cli/phones.txt", NULL));
    put(P("cli/text"), "u1 a\nu1 b\n");
    st = run("features", dir);
    tp_usage_error(st, g_err, "a duplicate utterance", TP_ARGV("cli/text:2", "'u1' again", NULL));
    st = run("features");
    tp_usage_error(st, g_err, "no directory", TP_ARGV("a data directory is needed", NULL));
    /* a cache whose archive path the .scp index cannot hold (whitespace): refused before
     * any feature is computed, and no folder is left behind (issue 28) */
    put(P("cli/text"), "u1 a\n");
    st = run("features", dir, "--out", P("nd/a b"));
    tp_usage_error(st, g_err, "whitespace in the cache's name", TP_ARGV("whitespace", "a b.ark", NULL));
    cr_expect(!tp_exists(P("nd")), "a refused cache left its folder");
    st = run("features", dir, "--out", P("sp ace/nd/x"));
    tp_usage_error(st, g_err, "whitespace in the cache's folder", TP_ARGV("whitespace", "sp ace", NULL));
    cr_expect(!tp_exists(P("sp ace")), "a refused cache left its folder");
    st = run("features", "--help");
    cr_expect_eq(st, 0);
    cr_expect(strstr(g_out, "usage: attnbench features"));
}
