/* The speech experiment's Kaldi archives and filterbanks (experiments/tasks/speech/kaldi_ark.h,
 * fbank.h), part of the speech_data suite: float archives written and read back
 * (sequentially and by offset through their index), the committed fixtures of every
 * matrix type (FM, DM, CM, CM2, CM3: tests/speech/make_kaldi_fixtures.py wrote them
 * from Kaldi's documented layouts, with their values decoded in float64), the fixture
 * archive cut at every length, foreign and damaged objects (each one line, never an
 * allocation of what a header promises); the filterbanks against the double-precision
 * reference (tests/reference/ref_fbank.c) on synthetic signals, and the reference and
 * the filterbanks against torchaudio's Kaldi-compatible fbank of a clip of real speech
 * (tests/fixtures/speech/README.md). */
#include <criterion/criterion.h>

#include "error.h"
#include "fbank.h"
#include "kaldi_ark.h"
#include "memory.h"
#include "npy.h"
#include "ref_fbank.h"
#include "rng.h"
#include "test_proc.h"
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <sndfile.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIX ATTNBENCH_SOURCE_DIR "/tests/fixtures/speech"

static char g_dir[600];
static void setup(void) { tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/speech-kaldi-tmp"); }
static void teardown(void) { tp_rm_tree(g_dir); }

TestSuite(speech_kaldi, .init = setup, .fini = teardown, .timeout = 120);

static const char *P(const char *name) {
    static char bufs[8][800];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, 800, "%s/%s", g_dir, name);
    return b;
}

/* ---- archives ---- */

/* 3 matrices: 5 x 3, 1 x 7, 64 x 40 of seeded normals (times 10). */
static const int SH[3][2] = {{5, 3}, {1, 7}, {64, 40}};
static const char *const KEYS[3] = {"utt-a", "b_2", "x.y/z"};

static float *matrix(int i) {
    float *m = malloc(sizeof(float) * (size_t)SH[i][0] * SH[i][1]);
    for (int k = 0; k < SH[i][0] * SH[i][1]; k++) m[k] = (float)(10.0 * ab_rng_normal(7, (uint64_t)i, (uint64_t)k));
    return m;
}

static void write_three(const char *ark, const char *scp, const char *name) {
    ka_writer *w;
    cr_assert_eq(ka_writer_open(ark, scp, name, &w), 0, "%s", ab_error());
    for (int i = 0; i < 3; i++) {
        float *m = matrix(i);
        cr_assert_eq(ka_writer_add(w, KEYS[i], SH[i][0], SH[i][1], m), 0, "%s", ab_error());
        free(m);
    }
    cr_assert_eq(ka_writer_commit(w), 0, "%s", ab_error());
}

Test(speech_kaldi, float_archive_round_trip) {
    char ark[800], scp[800];
    snprintf(ark, sizeof ark, "%s", P("f.ark"));
    snprintf(scp, sizeof scp, "%s", P("f.scp"));
    write_three(ark, scp, ark);
    /* sequentially */
    ka_reader *r;
    cr_assert_eq(ka_reader_open(ark, &r), 0, "%s", ab_error());
    long long offs[3];
    for (int i = 0; i < 3; i++) {
        const char *key;
        ka_matrix m;
        cr_assert_eq(ka_reader_next(r, &key, &m, &offs[i]), 1, "record %d: %s", i, ab_error());
        cr_expect_str_eq(key, KEYS[i]);
        cr_expect_str_eq(m.format, "FM");
        cr_assert(m.rows == SH[i][0] && m.cols == SH[i][1], "record %d is %d x %d", i, m.rows, m.cols);
        float *want = matrix(i);
        cr_expect(memcmp(m.data, want, sizeof(float) * (size_t)m.rows * m.cols) == 0, "record %d's values differ", i);
        free(want);
        ka_matrix_free(&m);
    }
    const char *key;
    ka_matrix m;
    cr_expect_eq(ka_reader_next(r, &key, &m, NULL), 0, "the archive has more than 3 records");
    ka_reader_close(r);
    /* by offset, through the index */
    char *text = tp_slurp(scp, NULL), *save = NULL;
    int i = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save), i++) {
        char k[64], where[900];
        long long off;
        cr_assert_eq(sscanf(line, "%63s %899[^\n]", k, where), 2, "index line '%s'", line);
        char *colon = strrchr(where, ':');
        cr_assert(colon, "index line '%s' has no offset", line);
        *colon = '\0';
        off = atoll(colon + 1);
        cr_expect_str_eq(k, KEYS[i]);
        cr_expect_str_eq(where, ark);
        cr_expect_eq(off, offs[i], "record %d: index offset %lld, reader offset %lld", i, off, offs[i]);
        cr_assert_eq(ka_read_at(where, off, k, &m), 0, "%s", ab_error());
        float *want = matrix(i);
        cr_expect(m.rows == SH[i][0] && m.cols == SH[i][1] &&
                      memcmp(m.data, want, sizeof(float) * (size_t)m.rows * m.cols) == 0,
                  "record %d read by offset differs", i);
        free(want);
        ka_matrix_free(&m);
    }
    cr_expect_eq(i, 3);
    free(text);
}

Test(speech_kaldi, writer_refuses_bad_records_and_abort_keeps_the_old_files) {
    char ark[800], scp[800];
    snprintf(ark, sizeof ark, "%s", P("g.ark"));
    snprintf(scp, sizeof scp, "%s", P("g.scp"));
    write_three(ark, scp, ark);
    size_t n0;
    unsigned char *before = tp_read_bytes(ark, &n0);
    ka_writer *w;
    cr_assert_eq(ka_writer_open(ark, scp, ark, &w), 0, "%s", ab_error());
    float x[4] = {1, 2, 3, 4};
    tu_expect_fail(ka_writer_add(w, "a b", 2, 2, x), AB_EINVAL, "a key with a space", "a b", NULL);
    tu_expect_fail(ka_writer_add(w, "", 2, 2, x), AB_EINVAL, "an empty key", "empty key", NULL);
    tu_expect_fail(ka_writer_add(w, "k", 0, 2, x), AB_EINVAL, "no rows", "empty matrix", NULL);
    cr_expect_eq(ka_writer_add(w, "k", 2, 2, x), 0, "%s", ab_error());
    ka_writer_abort(w);
    size_t n1;
    unsigned char *after = tp_read_bytes(ark, &n1);
    cr_expect(n0 == n1 && memcmp(before, after, n0) == 0, "an abandoned write changed the archive");
    free(before);
    free(after);
    tu_expect_fail(ka_writer_open(P("h.ark"), P("h.scp"), "a name with spaces.ark", &w), AB_EINVAL, "a spaced name",
                "whitespace", NULL);
    cr_expect(!tp_exists(P("h.ark")) && !tp_exists(P("h.scp")));
}

/* The committed fixtures: matrices.scp's keys and offsets into matrices.ark. */
typedef struct {
    char key[32];
    long long off;
} fx_rec;

static int fixture_index(fx_rec *recs, int cap) {
    char *text = tp_slurp(FIX "/matrices.scp", NULL), *save = NULL;
    int n = 0;
    for (char *line = strtok_r(text, "\n", &save); line && n < cap; line = strtok_r(NULL, "\n", &save)) {
        cr_assert_eq(sscanf(line, "%31s matrices.ark:%lld", recs[n].key, &recs[n].off), 2, "fixture index '%s'", line);
        n++;
    }
    free(text);
    return n;
}

/* The decoded values against the fixture's float64 decoding (stored as float32). The
 * tolerance: the decoding in float32 (Kaldi's own arithmetic: a product and a sum or
 * two on numbers of the size of |min| + |range|, each rounded), plus the expected
 * value's rounding to float32: 4 float32 epsilons of that size. FM and DM are exact
 * (a copy, and the same double -> float rounding). */
static void expect_fixture_values(const char *key, const ka_matrix *m) {
    char path[300];
    snprintf(path, sizeof path, FIX "/matrices_%s.npy", key);
    ab_array want;
    cr_assert_eq(ab_npy_read(path, &want), 0, "%s", ab_error());
    cr_assert(want.ndim == 2 && want.shape[0] == m->rows && want.shape[1] == m->cols, "%s: %d x %d, expected %lld x %lld",
              key, m->rows, m->cols, (long long)want.shape[0], (long long)want.shape[1]);
    const float *w = want.data;
    double scale = 0;
    for (size_t i = 0; i < want.count; i++) scale = fmax(scale, fabs(w[i]));
    const bool exact = !strcmp(m->format, "FM") || !strcmp(m->format, "DM");
    const double tol = exact ? 0 : 4 * FLT_EPSILON * (scale + 8.0);
    double worst = 0;
    for (size_t i = 0; i < want.count; i++) worst = fmax(worst, fabs((double)m->data[i] - w[i]));
    cr_expect(worst <= tol, "%s (%s): values differ by up to %.3g (tolerance %.3g)", key, m->format, worst, tol);
    ab_array_free(&want);
}

Test(speech_kaldi, every_matrix_type_decodes_as_documented) {
    fx_rec recs[16];
    int n = fixture_index(recs, 16);
    cr_assert_eq(n, 6);
    const char *formats[] = {"FM", "DM", "CM", "CM", "CM2", "CM3"};
    for (int i = 0; i < n; i++) {
        ka_matrix m;
        cr_assert_eq(ka_read_at(FIX "/matrices.ark", recs[i].off, recs[i].key, &m), 0, "%s", ab_error());
        cr_expect_str_eq(m.format, formats[i], "%s", recs[i].key);
        expect_fixture_values(recs[i].key, &m);
        ka_matrix_free(&m);
    }
    /* and read in sequence */
    ka_reader *r;
    cr_assert_eq(ka_reader_open(FIX "/matrices.ark", &r), 0, "%s", ab_error());
    for (int i = 0; i < n; i++) {
        const char *key;
        ka_matrix m;
        long long off;
        cr_assert_eq(ka_reader_next(r, &key, &m, &off), 1, "%s", ab_error());
        cr_expect_str_eq(key, recs[i].key);
        cr_expect_eq(off, recs[i].off);
        expect_fixture_values(key, &m);
        ka_matrix_free(&m);
    }
    const char *key;
    ka_matrix m;
    cr_expect_eq(ka_reader_next(r, &key, &m, NULL), 0);
    ka_reader_close(r);
}

/* The fixture archive cut after every byte: read in sequence, each cut gives the
 * whole records before it and then either the clean end (a cut between records) or a
 * one-line "truncated" error; by offset, each record is read whole or refused. (The
 * checks count and describe the first failure, then one assertion: thousands of
 * Criterion assertions would take seconds.) */
static int g_bad;
static char g_first[600];

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...) {
    if (ok || g_bad++) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_first, sizeof g_first, fmt, ap);
    va_end(ap);
}

static bool one_line_with(int rc, const char *s) {
    return rc == AB_EINVAL && !strchr(ab_error(), '\n') && strstr(ab_error(), s);
}

Test(speech_kaldi, an_archive_cut_anywhere_is_refused_cleanly) {
    size_t size;
    unsigned char *all = tp_read_bytes(FIX "/matrices.ark", &size);
    fx_rec recs[16];
    int n = fixture_index(recs, 16);
    long long ends[16]; /* where each record ends: the next key's start, or the end */
    for (int i = 0; i < n; i++) ends[i] = i + 1 < n ? recs[i + 1].off - (long long)strlen(recs[i + 1].key) - 1 : (long long)size;
    const char *cut = P("cut.ark");
    g_bad = 0;
    int clean_ends = 0;
    for (size_t len = 1; len < size; len++) {
        remove(cut); /* not truncated: ext4 flushes a file rewritten after a truncation when it is closed */
        FILE *f = fopen(cut, "wb");
        check(f && fwrite(all, 1, len, f) == len && fclose(f) == 0, "cannot write %s", cut);
        int whole = 0;
        while (whole < n && ends[whole] <= (long long)len) whole++;
        const bool boundary = whole > 0 && ends[whole - 1] == (long long)len;
        ka_reader *r = NULL;
        int got = 0, rc = ka_reader_open(cut, &r);
        check(rc == 0, "cut at %zu: %s", len, ab_error());
        const char *key;
        ka_matrix m;
        while (r && (rc = ka_reader_next(r, &key, &m, NULL)) == 1) {
            got++;
            ka_matrix_free(&m);
        }
        ka_reader_close(r);
        check(got == whole, "cut at %zu: %d records read, %d are whole", len, got, whole);
        if (boundary) {
            check(rc == 0, "cut at %zu (between records): %s", len, ab_error());
            clean_ends++;
        } else {
            check(one_line_with(rc, "truncated"), "cut at %zu: rc %d: %s", len, rc, ab_error());
        }
        for (int i = 0; i < n; i++) {
            int r2 = ka_read_at(cut, recs[i].off, recs[i].key, &m);
            if (ends[i] <= (long long)len) {
                check(r2 == 0, "cut at %zu: record %d (whole) refused: %s", len, i, ab_error());
                ka_matrix_free(&m);
            } else if (recs[i].off >= (long long)len) {
                check(one_line_with(r2, "past the end"), "cut at %zu, record %d: %s", len, i, ab_error());
            } else {
                check(one_line_with(r2, "truncated") && strstr(ab_error(), recs[i].key), "cut at %zu, record %d: %s",
                      len, i, ab_error());
            }
        }
    }
    cr_expect_eq(g_bad, 0, "%d failed checks; the first: %s", g_bad, g_first);
    cr_expect_eq(clean_ends, n - 1, "cuts between records: %d", clean_ends);
    free(all);
}

/* Writes "KEY " + the bytes of an object. */
static const char *object_file(const char *name, const void *obj, size_t n) {
    const char *path = P(name);
    unsigned char *b = malloc(n + 2);
    memcpy(b, "k ", 2);
    memcpy(b + 2, obj, n);
    tp_write_bytes(path, b, n + 2);
    free(b);
    return path;
}

static int read_first(const char *path) {
    ka_reader *r;
    int rc = ka_reader_open(path, &r);
    if (rc) return rc;
    const char *key;
    ka_matrix m;
    rc = ka_reader_next(r, &key, &m, NULL);
    if (rc == 1) ka_matrix_free(&m);
    ka_reader_close(r);
    return rc;
}

Test(speech_kaldi, foreign_and_damaged_objects_are_one_line_errors) {
    tp_write_bytes(P("text.txt"), "hello world\n", 12);
    tu_expect_fail(read_first(P("text.txt")), AB_EINVAL, "a text file", "not a Kaldi binary object", "key 'hello'", NULL);
    const char tm[] = "utt1  [\n  1 2 3 ]\n";
    tp_write_bytes(P("tm.ark"), tm, sizeof tm - 1);
    tu_expect_fail(read_first(P("tm.ark")), AB_EINVAL, "a text-mode archive", "text-mode", NULL);
    const unsigned char fv[] = {0, 'B', 'F', 'V', ' ', 4, 1, 0, 0, 0, 0, 0, 0x80, 0x3f};
    tu_expect_fail(read_first(object_file("fv.ark", fv, sizeof fv)), AB_EINVAL, "a vector", "vector ('FV')", NULL);
    const unsigned char xx[] = {0, 'B', 'X', 'Y', 'Z', ' ', 1, 2, 3};
    tu_expect_fail(read_first(object_file("xx.ark", xx, sizeof xx)), AB_EINVAL, "another type", "'XYZ', not a matrix", NULL);
    const unsigned char nt[] = {0, 'B', 'F', 'M', 'X', 'Y', 'Z', 1, 2, 3};
    tu_expect_fail(read_first(object_file("nt.ark", nt, sizeof nt)), AB_EINVAL, "a long token", "not a matrix", NULL);
    const unsigned char s8[] = {0, 'B', 'F', 'M', ' ', 8, 1, 0, 0, 0, 0, 0, 0, 0, 4, 1, 0, 0, 0};
    tu_expect_fail(read_first(object_file("s8.ark", s8, sizeof s8)), AB_EINVAL, "an 8-byte size", "4-byte", NULL);
    const unsigned char ng[] = {0, 'B', 'C', 'M', '2', ' ', 0, 0, 0, 0, 0, 0, 0x80, 0x3f, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0};
    tu_expect_fail(read_first(object_file("ng.ark", ng, sizeof ng)), AB_EINVAL, "negative rows", "negative", NULL);
    const unsigned char em[] = {0, 'B', 'C', 'M', ' ', 0, 0, 0, 0, 0, 0, 0x80, 0x3f, 3, 0, 0, 0, 0, 0, 0, 0};
    tu_expect_fail(read_first(object_file("em.ark", em, sizeof em)), AB_EINVAL, "no columns", "empty matrix", NULL);
    const unsigned char nan[] = {0, 'B', 'F', 'M', ' ', 4, 1, 0, 0, 0, 4, 2, 0, 0, 0, 0, 0, 0x80, 0x3f, 0, 0, 0xc0, 0x7f};
    tu_expect_fail(read_first(object_file("nan.ark", nan, sizeof nan)), AB_EINVAL, "a NaN", "(0, 1)", "not finite", NULL);
    const unsigned char inf[] = {0, 'B', 'C', 'M', '3', ' ', 0, 0, 0x80, 0x7f, 0, 0, 0x80, 0x3f, 1, 0, 0, 0, 1, 0, 0, 0, 7};
    tu_expect_fail(read_first(object_file("inf.ark", inf, sizeof inf)), AB_EINVAL, "an infinite min", "not finite", NULL);
    const unsigned char ctl[] = {'a', 1, 'b', ' ', 0, 'B'};
    tp_write_bytes(P("ctl.ark"), ctl, sizeof ctl);
    tu_expect_fail(read_first(P("ctl.ark")), AB_EINVAL, "a control byte in a key", "0x01", NULL);
    /* a header promising 2^31 - 1 rows of 40 floats (344 GB): refused as truncated
     * before anything of that size is allocated */
    const unsigned char big[] = {0, 'B', 'F', 'M', ' ', 4, 0xff, 0xff, 0xff, 0x7f, 4, 40, 0, 0, 0, 1, 2, 3, 4};
    ab_mem_reset_peak(AB_DEV_CPU);
    size_t before = ab_mem_peak(AB_DEV_CPU);
    tu_expect_fail(read_first(object_file("big.ark", big, sizeof big)), AB_EINVAL, "a huge header", "truncated",
                "343597383520 bytes", NULL);
    cr_expect_leq(ab_mem_peak(AB_DEV_CPU), before + 4096, "the huge header was allocated (peak %zu -> %zu)", before,
                  ab_mem_peak(AB_DEV_CPU));
    const unsigned char bigcm[] = {0, 'B', 'C', 'M', ' ', 0, 0, 0, 0, 0, 0, 0x80, 0x3f, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff, 0x7f};
    tu_expect_fail(read_first(object_file("bigcm.ark", bigcm, sizeof bigcm)), AB_EINVAL, "a huge CM header", "truncated", NULL);
    cr_expect_leq(ab_mem_peak(AB_DEV_CPU), before + 4096);
    /* a DM header whose 8-byte values come to 2^64 + 64 bytes (64 once wrapped; seen
     * while writing the fuzz target kaldi_ark, which replays it): truncated, not a
     * 2^63-byte allocation */
    const unsigned char wrap[] = {0, 'B', 'D', 'M', ' ', 4, 0x02, 0x00, 0x01, 0x40, 4, 0x04, 0x00, 0xfe, 0x7f};
    unsigned char wrapped[sizeof wrap + 64] = {0};
    memcpy(wrapped, wrap, sizeof wrap);
    tu_expect_fail(read_first(object_file("wrap.ark", wrapped, sizeof wrapped)), AB_EINVAL, "a wrapping DM size",
                "truncated", "1073807362 x 2147352580", "more than 2^64 bytes", NULL);
    cr_expect_leq(ab_mem_peak(AB_DEV_CPU), before + 4096);
    /* files that are not archives */
    ka_reader *r;
    tu_expect_fail(ka_reader_open(P("missing.ark"), &r), AB_EINVAL, "a missing file", "missing.ark", NULL);
    tu_expect_fail(ka_reader_open(g_dir, &r), AB_EINVAL, "a folder", "not a regular file", NULL);
    ka_matrix m;
    tu_expect_fail(ka_read_at(FIX "/matrices.ark", 100000, "k", &m), AB_EINVAL, "an offset past the end", "past the end",
                NULL);
    tu_expect_fail(ka_read_at(FIX "/matrices.ark", 20, "k", &m), AB_EINVAL, "an offset inside a record",
                "not a Kaldi binary object", "offset 20", NULL);
}

/* ---- filterbanks ---- */

static ref_fbank_opts ref_opts(const fb_options *o) {
    return (ref_fbank_opts){o->sample_rate, o->num_mel_bins, o->frame_length_ms, o->frame_shift_ms,
                            o->preemph,     o->low_freq,     o->high_freq};
}

Test(speech_kaldi, frame_counts_and_refused_options) {
    fb_options o;
    fb_options_default(&o);
    fbank *fb;
    cr_assert_eq(fb_create(&o, &fb), 0, "%s", ab_error());
    /* 400-sample frames every 160: only whole frames (Kaldi's snip_edges) */
    const long long n[] = {0, 399, 400, 559, 560, 16000};
    const long long t[] = {0, 0, 1, 1, 2, 98};
    for (int i = 0; i < 6; i++) cr_expect_eq(fb_frames(fb, n[i]), t[i], "%lld samples", n[i]);
    cr_expect_eq(fb_dim(fb), 40);
    fb_destroy(fb);
    o.sample_rate = 8000;
    cr_assert_eq(fb_create(&o, &fb), 0, "%s", ab_error());
    cr_expect(fb_frame_length(fb) == 200 && fb_frame_shift(fb) == 80);
    fb_destroy(fb);
    struct {
        const char *what, *field, *must;
        double v;
    } bad[] = {
        {"2 bins", "bins", "num_mel_bins=2", 2},
        {"200 bins at 16 kHz", "bins", "covers no FFT bin", 200},
        {"a low edge at Nyquist", "low", "low_freq=8000", 8000},
        {"a high edge past Nyquist", "high", "high_freq=9000", 9000},
        {"a high edge below the low", "high", "high_freq=-7990", -7990},
        {"pre-emphasis 1.5", "pre", "preemph=1.5", 1.5},
        {"a frame of 1 sample", "len", "frame_length_ms=0.0625", 0.0625},
        {"a rate of 100 Hz", "rate", "sample_rate=100", 100},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fb_options_default(&o);
        if (!strcmp(bad[i].field, "bins")) o.num_mel_bins = (int)bad[i].v;
        if (!strcmp(bad[i].field, "low")) o.low_freq = bad[i].v;
        if (!strcmp(bad[i].field, "high")) o.high_freq = bad[i].v;
        if (!strcmp(bad[i].field, "pre")) o.preemph = bad[i].v;
        if (!strcmp(bad[i].field, "len")) o.frame_length_ms = bad[i].v;
        if (!strcmp(bad[i].field, "rate")) o.sample_rate = (int)bad[i].v;
        fb = NULL;
        tu_expect_fail(fb_create(&o, &fb), AB_EINVAL, bad[i].what, bad[i].must, NULL);
        cr_expect_null(fb);
    }
}

/* How far the fast filterbanks may be from the exact (float64) values, and why. The
 * FFT in float32 makes an error of a few float32 epsilons of the frame's largest
 * spectral amplitude in every bin; relative to a bin's own power P that is about
 * eps * sqrt(P_max / P), and in the log domain the same: a value d nats below its
 * frame's largest is off by about 1e-7 * exp(d / 2), plus ~1e-6 from the rest of
 * the float32 arithmetic. Measured on 9 whole festvox-ru utterances: at most 2.2e-5
 * within 5 nats of the frame's largest value, 2.8e-5 within 10, 6.7e-4 at 15 to 20
 * (torchaudio's own float32 computation is as far from its float64 one: 6.9e-4). So:
 * 1e-4 within 10 nats of the frame's largest value (86% of the values of speech), and
 * 2e-5 * exp(d / 2) beyond, capped at 2e-3. */
static void expect_near_exact(const char *what, const float *got, const double *exact, long T, int B) {
    double worst_near = 0, worst_far = 0, worst_ratio = 0;
    for (long t = 0; t < T; t++) {
        double mx = -INFINITY;
        for (int b = 0; b < B; b++) mx = fmax(mx, exact[t * B + b]);
        for (int b = 0; b < B; b++) {
            const double e = fabs((double)got[t * B + b] - exact[t * B + b]), d = mx - exact[t * B + b];
            if (d <= 10) worst_near = fmax(worst_near, e);
            else {
                worst_far = fmax(worst_far, e);
                worst_ratio = fmax(worst_ratio, e / fmin(2e-3, 2e-5 * exp(d / 2)));
            }
        }
    }
    cr_expect_leq(worst_near, 1e-4, "%s: %.3g off within 10 nats of the frame's largest value (tolerance 1e-4)", what,
                  worst_near);
    cr_expect_leq(worst_ratio, 1.0, "%s: %.3g off further down (%.3g of the tolerance)", what, worst_far, worst_ratio);
}

/* fast (fbank.c) and reference (ref_fbank.c) on the same samples */
static void compare_with_reference(const char *what, const fb_options *o, const float *x, long n) {
    fbank *fb;
    cr_assert_eq(fb_create(o, &fb), 0, "%s: %s", what, ab_error());
    const ref_fbank_opts ro = ref_opts(o);
    const long T = ref_fbank_frames(&ro, n);
    cr_assert_eq(fb_frames(fb, n), T, "%s", what);
    cr_assert_gt(T, 0, "%s", what);
    float *got = malloc(sizeof(float) * (size_t)T * o->num_mel_bins);
    double *xd = malloc(sizeof(double) * (size_t)n), *want = malloc(sizeof(double) * (size_t)T * o->num_mel_bins);
    for (long i = 0; i < n; i++) xd[i] = x[i];
    cr_assert_eq(fb_compute(fb, x, n, got), 0, "%s", ab_error());
    ref_fbank(&ro, xd, n, want);
    expect_near_exact(what, got, want, T, o->num_mel_bins);
    fb_destroy(fb);
    free(got);
    free(xd);
    free(want);
}

Test(speech_kaldi, filterbanks_match_the_reference_on_synthetic_signals) {
    /* 0.3 s at 16 kHz: a chirp from 100 Hz to 6 kHz over a DC offset, with noise, at
     * the 16-bit scale */
    const long n = 4800;
    float *x = malloc(sizeof(float) * n);
    for (long i = 0; i < n; i++) {
        const double s = (double)i / 16000;
        x[i] = (float)round(500 + 8000 * sin(2 * M_PI * (100 * s + 0.5 * (5900 / 0.3) * s * s)) +
                            300 * ab_rng_normal(3, 0, (uint64_t)i));
    }
    fb_options o;
    fb_options_default(&o);
    compare_with_reference("a chirp at 16 kHz, defaults", &o, x, n);
    /* other options: 8 kHz, 23 bins from 100 Hz to 200 Hz below Nyquist, 20 ms every
     * 8 ms, no pre-emphasis */
    o.sample_rate = 8000;
    o.num_mel_bins = 23;
    o.low_freq = 100;
    o.high_freq = -200;
    o.frame_length_ms = 20;
    o.frame_shift_ms = 8;
    o.preemph = 0;
    compare_with_reference("the chirp read as 8 kHz, other options", &o, x, n);
    /* silence and a constant: nothing left after the DC offset, every value at the
     * floor log(FLT_EPSILON), in both exactly */
    fb_options_default(&o);
    fbank *fb;
    cr_assert_eq(fb_create(&o, &fb), 0);
    for (int c = 0; c < 2; c++) {
        for (long i = 0; i < 800; i++) x[i] = c ? 1234.0f : 0.0f;
        float got[3 * 40];
        cr_assert_eq(fb_compute(fb, x, 800, got), 0);
        for (int k = 0; k < 3 * 40; k++)
            cr_expect_eq(got[k], logf(FLT_EPSILON), "%s: value %d is %.9g", c ? "a constant" : "silence", k, got[k]);
    }
    fb_destroy(fb);
    free(x);
}

/* The clip of real speech, 16-bit samples as floats. */
static float *read_clip(long *n) {
    SF_INFO info = {0};
    SNDFILE *sf = sf_open(FIX "/ru_0001_clip.wav", SFM_READ, &info);
    cr_assert_not_null(sf, "%s", sf_strerror(NULL));
    cr_assert(info.samplerate == 16000 && info.channels == 1);
    short *s = malloc(sizeof(short) * (size_t)info.frames);
    cr_assert_eq(sf_readf_short(sf, s, info.frames), info.frames);
    sf_close(sf);
    float *x = malloc(sizeof(float) * (size_t)info.frames);
    for (sf_count_t i = 0; i < info.frames; i++) x[i] = s[i];
    free(s);
    *n = (long)info.frames;
    return x;
}

Test(speech_kaldi, filterbanks_match_torchaudio_on_real_speech) {
    long n;
    float *x = read_clip(&n);
    ab_array ta;
    cr_assert_eq(ab_npy_read(FIX "/ru_0001_clip.fbank.npy", &ta), 0, "%s", ab_error());
    fb_options o;
    fb_options_default(&o);
    const ref_fbank_opts ro = ref_opts(&o);
    const long T = ref_fbank_frames(&ro, n);
    cr_assert(ta.ndim == 2 && ta.shape[0] == T && ta.shape[1] == 40, "fixture %lld x %lld, expected %ld x 40",
              (long long)ta.shape[0], (long long)ta.shape[1], T);
    const float *tv = ta.data;
    /* the reference against torchaudio (computed in float64, stored as float32): the
     * same definition, computed twice in double but for torchaudio's triangle weights,
     * which it computes in float32 in any case (an FFT bin's mel value, up to 2840,
     * rounded to 1.2e-4, in a triangle 69 mel wide: weights off by up to 4.3e-6,
     * measured against float64 ones; relative to a small weight that is more, and a
     * mel bin whose power sits in FFT bins of small weight shows it: 2.5e-5 on this
     * clip), and the fixture's rounding to float32 (at most 27 * 2^-24 = 1.6e-6):
     * 5e-5 */
    double *xd = malloc(sizeof(double) * (size_t)n), *want = malloc(sizeof(double) * (size_t)T * 40);
    for (long i = 0; i < n; i++) xd[i] = x[i];
    ref_fbank(&ro, xd, n, want);
    double worst = 0;
    for (long k = 0; k < T * 40; k++) worst = fmax(worst, fabs(want[k] - tv[k]));
    cr_expect_leq(worst, 5e-5, "the reference is %.3g from torchaudio's fbank (tolerance 5e-5)", worst);
    /* the fast filterbanks against both (the fixture as the exact values) */
    fbank *fb;
    cr_assert_eq(fb_create(&o, &fb), 0);
    float *got = malloc(sizeof(float) * (size_t)T * 40);
    cr_assert_eq(fb_compute(fb, x, n, got), 0);
    double *td = malloc(sizeof(double) * (size_t)T * 40);
    for (long k = 0; k < T * 40; k++) td[k] = tv[k];
    expect_near_exact("fbank.c against torchaudio", got, td, T, 40);
    expect_near_exact("fbank.c against the reference", got, want, T, 40);
    /* one filterbank object on 4 threads at once: the same bits as alone */
    float *par = malloc(sizeof(float) * (size_t)T * 40 * 4);
#pragma omp parallel for num_threads(4)
    for (int k = 0; k < 4; k++) fb_compute(fb, x, n, par + (size_t)k * T * 40);
    for (int k = 0; k < 4; k++)
        cr_expect(memcmp(par + (size_t)k * T * 40, got, sizeof(float) * (size_t)T * 40) == 0,
                  "thread %d computed other values", k);
    fb_destroy(fb);
    free(par);
    free(got);
    free(td);
    free(xd);
    free(want);
    free(x);
    ab_array_free(&ta);
}
