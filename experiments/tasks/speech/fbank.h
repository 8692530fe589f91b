/* Log-mel filterbank features, computed as Kaldi's compute-fbank-feats computes them
 * (and torchaudio.compliance.kaldi.fbank), with FFTW (single precision, real to
 * complex). experiments/speech/README.md gives the definition; in short, per frame of
 * `frame_length_ms` (25) every `frame_shift_ms` (10), frames wholly inside the signal
 * (Kaldi's snip_edges=true: 1 + (n - L) / S frames of n samples, none when n < L):
 *
 *   remove the frame's mean (DC offset); pre-emphasis x[i] -= preemph * x[i-1] from
 *   the end down to i = 1, and x[0] -= preemph * x[0]; the Povey window
 *   (0.5 - 0.5 cos(2 pi i / (L - 1)))^0.85; zeros up to the next power of two; the
 *   power spectrum |X_k|^2; num_mel_bins triangles equally spaced on the mel scale
 *   mel(f) = 1127 ln(1 + f / 700) between low_freq and high_freq (each from its left
 *   neighbour's centre to its right neighbour's, peak 1 at its centre, weights taken at
 *   the FFT bins' frequencies k * rate / N for k < N / 2); log(max(e, FLT_EPSILON)).
 *
 * No dither (Kaldi's default is dither 1, random noise: 0 keeps the features a pure
 * function of the audio), no energy coefficient. The FFT plan is made once per
 * fb_create with FFTW_ESTIMATE (a planner that measures could pick another algorithm
 * on another run, and with it other roundings), and reused by every call. */
#ifndef AB_SPEECH_FBANK_H
#define AB_SPEECH_FBANK_H

typedef struct {
    int sample_rate;        /* Hz the audio must have (16000) */
    int num_mel_bins;       /* feature dimension (40) */
    double frame_length_ms; /* 25 */
    double frame_shift_ms;  /* 10 */
    double preemph;         /* pre-emphasis coefficient in [0, 1] (0.97) */
    double low_freq;        /* Hz, lower edge of the first triangle (20) */
    double high_freq;       /* Hz, upper edge of the last; <= 0: that much below Nyquist (0: Nyquist) */
} fb_options;

void fb_options_default(fb_options *o);

typedef struct fbank fbank;

/* Checks the options (AB_EINVAL naming the bad one: a frame shorter than 2 samples, a
 * frequency range outside (0, Nyquist], fewer than 3 bins, or so many that a triangle
 * covers no FFT bin) and makes the window, the triangles and the FFT plan. */
int fb_create(const fb_options *o, fbank **out);
void fb_destroy(fbank *fb);

/* Frames of n samples (0 when n is shorter than one frame). */
long long fb_frames(const fbank *fb, long long n);
int fb_dim(const fbank *fb);
int fb_frame_length(const fbank *fb); /* samples */
int fb_frame_shift(const fbank *fb);  /* samples */

/* The features of n samples (16-bit integer scale, audio.h) into out: fb_frames(n) x
 * num_mel_bins floats, row by row. Thread-safe: one fbank serves many threads (the
 * scratch is per call). 0, or AB_ENOMEM. */
int fb_compute(const fbank *fb, const float *samples, long long n, float *out);

#endif
