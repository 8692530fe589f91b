/* experiments/tasks/speech/audio.c: audio read with libsndfile (au_read of a file, as a
 * wav.scp line UTT PATH gives it) on any bytes: WAV, and whatever else libsndfile
 * recognises in them (AIFF, AU, FLAC, NIST SPHERE, ...). Commands (a wav.scp line
 * ending in '|') are not fuzzed: their output goes through the same decoding.
 *
 * A refusal is never out of memory (the samples are stored as they decode, whatever
 * count the header announces). An accepted signal has at least one sample, a positive rate and finite samples.
 * Then the filterbank (fbank.h, at the file's own rate when fb_create accepts it)
 * computes its features, as the speech data does: they are finite when the samples
 * are within 1e6 of zero (the 16-bit scale is +-32768; far beyond it the power
 * spectrum of a frame may pass the float range, which is the audio's doing, not the
 * reader's). Only the first 10 s at 16 kHz (160,000 samples) go through the
 * filterbank, so that no input runs long under the sanitizers: a compressed format can
 * announce many samples in few bytes (the reader is held to its own bound). */
#include "audio.h"
#include "error.h"
#include "fbank.h"
#include "fuzz_util.h"
#include "memory.h"

#include <math.h>
#include <string.h>

enum { FBANK_SAMPLES = 160000 };

static void features(const au_signal *s) {
    fb_options o;
    fb_options_default(&o);
    o.sample_rate = s->rate;
    fbank *fb;
    if (fb_create(&o, &fb)) return; /* a rate the filterbank cannot use (the speech data refuses it sooner) */
    const long long n = s->n < FBANK_SAMPLES ? s->n : FBANK_SAMPLES;
    const long long frames = fb_frames(fb, n);
    if (frames > 0) {
        bool small = true;
        for (long long i = 0; i < n && small; i++) small = fabsf(s->samples[i]) <= 1e6f;
        float *f = ab_alloc(sizeof(float) * (size_t)frames * (size_t)fb_dim(fb));
        if (!f) fuzz_fail("fb_compute", "out of memory for %lld frames", frames);
        int rc = fb_compute(fb, s->samples, n, f);
        if (rc) fuzz_fail("fb_compute", "%s", ab_error());
        for (long long k = 0; small && k < frames * fb_dim(fb); k++)
            if (!isfinite(f[k]))
                fuzz_fail("fb_compute", "feature %lld (frame %lld) is %g", k, k / fb_dim(fb), (double)f[k]);
        ab_free(f);
    }
    fb_destroy(fb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("input.wav", data, size);
    au_signal s;
    int rc = au_read(path, false, "wav.scp:1 (utterance 'u')", &s);
    if (rc) {
        fuzz_refused(rc, "au_read");
        /* a header's sample count is not trusted for memory (audio.h) */
        if (rc == AB_ENOMEM) fuzz_fail("au_read", "out of memory on a small input: %s", ab_error());
        if (s.samples || s.n) fuzz_fail("au_read", "refused, with %lld samples left", s.n);
    } else {
        if (s.n < 1 || s.rate < 1 || !s.samples) fuzz_fail("au_read", "accepted %lld samples at %d Hz", s.n, s.rate);
        for (long long i = 0; i < s.n; i++)
            if (!isfinite(s.samples[i])) fuzz_fail("au_read", "sample %lld is %g", i, (double)s.samples[i]);
        features(&s);
        au_free(&s);
    }
    fuzz_no_tracked_memory("audio reader");
    return 0;
}
