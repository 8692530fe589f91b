/* Kaldi-compatible log-mel filterbanks with FFTW (fbank.h). */
#include "fbank.h"

#include "error.h"
#include "memory.h"

#include <fftw3.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct fbank {
    fb_options o;
    int win, shift, pad, bins;
    float *window;  /* (win) the Povey window */
    int *first;     /* (bins) first FFT bin of each triangle */
    int *len;       /* (bins) how many FFT bins it covers */
    float *weights; /* the triangles' weights, one after the other */
    fftwf_plan plan;
};

void fb_options_default(fb_options *o) {
    o->sample_rate = 16000;
    o->num_mel_bins = 40;
    o->frame_length_ms = 25.0;
    o->frame_shift_ms = 10.0;
    o->preemph = 0.97;
    o->low_freq = 20.0;
    o->high_freq = 0.0;
}

/* FFTW's planner (and plan destruction) is not thread-safe; executing a plan is. */
static pthread_mutex_t g_plan_lock = PTHREAD_MUTEX_INITIALIZER;

static double mel_scale(double f) { return 1127.0 * log(1.0 + f / 700.0); }

void fb_destroy(fbank *fb) {
    if (!fb) return;
    if (fb->plan) {
        pthread_mutex_lock(&g_plan_lock);
        fftwf_destroy_plan(fb->plan);
        pthread_mutex_unlock(&g_plan_lock);
    }
    free(fb->window);
    free(fb->first);
    free(fb->len);
    free(fb->weights);
    free(fb);
}

int fb_create(const fb_options *o, fbank **out) {
    *out = NULL;
    if (o->sample_rate < 1000 || o->sample_rate > 384000)
        return ab_fail(AB_EINVAL, "sample_rate=%d: expected a rate in Hz between 1000 and 384000", o->sample_rate);
    if (!(o->frame_length_ms > 0) || !(o->frame_shift_ms > 0) || o->frame_length_ms > 1000 || o->frame_shift_ms > 1000)
        return ab_fail(AB_EINVAL, "frame_length_ms=%g, frame_shift_ms=%g: expected durations in (0, 1000] ms",
                       o->frame_length_ms, o->frame_shift_ms);
    /* the frame and shift in samples, truncated as Kaldi and torchaudio do */
    int win = (int)(o->sample_rate * o->frame_length_ms * 0.001), shift = (int)(o->sample_rate * o->frame_shift_ms * 0.001);
    if (win < 2 || shift < 1)
        return ab_fail(AB_EINVAL, "frame_length_ms=%g, frame_shift_ms=%g at %d Hz: a frame of %d samples every %d (need "
                                  "at least 2 and 1)",
                       o->frame_length_ms, o->frame_shift_ms, o->sample_rate, win, shift);
    if (o->num_mel_bins < 3 || o->num_mel_bins > 1024)
        return ab_fail(AB_EINVAL, "num_mel_bins=%d: expected 3..1024", o->num_mel_bins);
    if (!(o->preemph >= 0 && o->preemph <= 1)) return ab_fail(AB_EINVAL, "preemph=%g: expected 0..1", o->preemph);
    const double nyquist = 0.5 * o->sample_rate;
    const double high = o->high_freq > 0 ? o->high_freq : nyquist + o->high_freq;
    if (!(o->low_freq >= 0 && o->low_freq < nyquist) || !(high > o->low_freq && high <= nyquist))
        return ab_fail(AB_EINVAL, "low_freq=%g, high_freq=%g: the triangles must span a range inside (0, %g] Hz "
                                  "(high_freq <= 0 counts down from Nyquist)",
                       o->low_freq, o->high_freq, nyquist);
    fbank *fb = calloc(1, sizeof *fb);
    if (!fb) return ab_fail(AB_ENOMEM, "out of memory");
    fb->o = *o;
    fb->win = win;
    fb->shift = shift;
    fb->bins = o->num_mel_bins;
    fb->pad = 1;
    while (fb->pad < win) fb->pad *= 2;
    const int half = fb->pad / 2;
    fb->window = malloc(sizeof(float) * (size_t)win);
    fb->first = malloc(sizeof(int) * (size_t)fb->bins);
    fb->len = malloc(sizeof(int) * (size_t)fb->bins);
    fb->weights = malloc(sizeof(float) * (size_t)fb->bins * (size_t)half);
    if (!fb->window || !fb->first || !fb->len || !fb->weights) {
        fb_destroy(fb);
        return ab_fail(AB_ENOMEM, "out of memory");
    }
    const double a = 2.0 * M_PI / (win - 1);
    for (int i = 0; i < win; i++) fb->window[i] = (float)pow(0.5 - 0.5 * cos(a * i), 0.85);
    /* The triangles in the mel domain, sampled at the FFT bins below Nyquist (Kaldi's
     * MelBanks; the Nyquist bin would have weight 0 with high_freq at Nyquist). */
    const double mlo = mel_scale(o->low_freq), mhi = mel_scale(high), delta = (mhi - mlo) / (fb->bins + 1);
    const double bin_hz = (double)o->sample_rate / fb->pad;
    int nw = 0;
    for (int b = 0; b < fb->bins; b++) {
        const double left = mlo + b * delta, centre = mlo + (b + 1) * delta, right = mlo + (b + 2) * delta;
        fb->first[b] = -1;
        fb->len[b] = 0;
        for (int k = 0; k < half; k++) {
            const double m = mel_scale(bin_hz * k);
            if (m > left && m < right) {
                const double w = m <= centre ? (m - left) / (centre - left) : (right - m) / (right - centre);
                if (fb->first[b] < 0) fb->first[b] = k;
                fb->weights[nw + (k - fb->first[b])] = (float)w;
                fb->len[b] = k - fb->first[b] + 1;
            }
        }
        if (fb->first[b] < 0) {
            int bins = fb->bins;
            fb_destroy(fb);
            return ab_fail(AB_EINVAL, "num_mel_bins=%d: triangle %d covers no FFT bin (too many triangles for a %d-point "
                                      "FFT between %g and %g Hz)",
                           bins, b, 2 * half, o->low_freq, high);
        }
        nw += fb->len[b];
    }
    float *in = ab_alloc(sizeof(float) * (size_t)fb->pad);
    fftwf_complex *spec = ab_alloc(sizeof(fftwf_complex) * (size_t)(half + 1));
    if (in && spec) {
        /* FFTW_ESTIMATE: the plan does not depend on timings, so every run computes the
         * same numbers; arrays from ab_alloc (64-byte aligned) like every later call's */
        pthread_mutex_lock(&g_plan_lock);
        fb->plan = fftwf_plan_dft_r2c_1d(fb->pad, in, spec, FFTW_ESTIMATE);
        pthread_mutex_unlock(&g_plan_lock);
    }
    ab_free(in);
    ab_free(spec);
    if (!fb->plan) {
        fb_destroy(fb);
        return ab_fail(AB_ENOMEM, "out of memory for the FFT plan");
    }
    *out = fb;
    return 0;
}

long long fb_frames(const fbank *fb, long long n) { return n < fb->win ? 0 : 1 + (n - fb->win) / fb->shift; }
int fb_dim(const fbank *fb) { return fb->bins; }
int fb_frame_length(const fbank *fb) { return fb->win; }
int fb_frame_shift(const fbank *fb) { return fb->shift; }

int fb_compute(const fbank *fb, const float *samples, long long n, float *out) {
    const long long frames = fb_frames(fb, n);
    const int win = fb->win, pad = fb->pad, half = pad / 2;
    const float pre = (float)fb->o.preemph;
    float *x = ab_alloc(sizeof(float) * (size_t)(pad + half + 1));
    fftwf_complex *spec = ab_alloc(sizeof(fftwf_complex) * (size_t)(half + 1));
    if (!x || !spec) {
        ab_free(x);
        ab_free(spec);
        return ab_fail(AB_ENOMEM, "out of memory for the FFT of one frame");
    }
    float *power = x + pad;
    for (long long t = 0; t < frames; t++) {
        const float *s = samples + t * fb->shift;
        double sum = 0;
        for (int i = 0; i < win; i++) sum += s[i];
        const float mean = (float)(sum / win);
        for (int i = 0; i < win; i++) x[i] = s[i] - mean;
        for (int i = win - 1; i > 0; i--) x[i] -= pre * x[i - 1];
        x[0] -= pre * x[0];
        for (int i = 0; i < win; i++) x[i] *= fb->window[i];
        for (int i = win; i < pad; i++) x[i] = 0.0f;
        fftwf_execute_dft_r2c(fb->plan, x, spec);
        for (int k = 0; k < half; k++) power[k] = spec[k][0] * spec[k][0] + spec[k][1] * spec[k][1];
        float *o = out + t * fb->bins;
        const float *w = fb->weights;
        for (int b = 0; b < fb->bins; b++) {
            const float *p = power + fb->first[b];
            double e = 0;
            for (int j = 0; j < fb->len[b]; j++) e += (double)w[j] * p[j];
            w += fb->len[b];
            const float ef = (float)e;
            o[b] = logf(ef > FLT_EPSILON ? ef : FLT_EPSILON);
        }
    }
    ab_free(x);
    ab_free(spec);
    return 0;
}
