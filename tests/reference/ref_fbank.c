/* Double-precision log-mel filterbanks from the definition (ref_fbank.h). */
#include "ref_fbank.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

static int frame_length(const ref_fbank_opts *o) { return (int)(o->sample_rate * o->frame_length_ms * 0.001); }
static int frame_shift(const ref_fbank_opts *o) { return (int)(o->sample_rate * o->frame_shift_ms * 0.001); }

long ref_fbank_frames(const ref_fbank_opts *o, long n) {
    const long L = frame_length(o), S = frame_shift(o);
    return n < L ? 0 : 1 + (n - L) / S;
}

static double mel(double hz) { return 1127.0 * log(1.0 + hz / 700.0); }

/* Triangle b's weight at mel value m: 0 outside (left, right), rising to 1 at the
 * centre and falling back. */
static double triangle(double left, double centre, double right, double m) {
    if (m <= left || m >= right) return 0.0;
    return m <= centre ? (m - left) / (centre - left) : (right - m) / (right - centre);
}

void ref_fbank(const ref_fbank_opts *o, const double *x, long n, double *out) {
    const int L = frame_length(o), S = frame_shift(o), B = o->num_mel_bins;
    int N = 1;
    while (N < L) N *= 2;
    const long T = ref_fbank_frames(o, n);
    const double nyquist = o->sample_rate / 2.0;
    const double high = o->high_freq > 0 ? o->high_freq : nyquist + o->high_freq;
    const double mlo = mel(o->low_freq), mhi = mel(high), step = (mhi - mlo) / (B + 1);
    double *f = calloc((size_t)N, sizeof(double)), *power = calloc((size_t)N / 2 + 1, sizeof(double));
    for (long t = 0; t < T; t++) {
        const double *s = x + t * S;
        /* the frame less its mean */
        double mean = 0;
        for (int i = 0; i < L; i++) mean += s[i];
        mean /= L;
        for (int i = 0; i < L; i++) f[i] = s[i] - mean;
        /* pre-emphasis, the first sample against itself */
        for (int i = L - 1; i > 0; i--) f[i] -= o->preemph * f[i - 1];
        f[0] -= o->preemph * f[0];
        /* the Povey window: a Hann window to the power 0.85 */
        for (int i = 0; i < L; i++) f[i] *= pow(0.5 - 0.5 * cos(2.0 * M_PI * i / (L - 1)), 0.85);
        for (int i = L; i < N; i++) f[i] = 0.0;
        /* |X_k|^2, X_k = sum_i f[i] e^{-2 pi i k i / N}, for k = 0 .. N/2 */
        for (int k = 0; k <= N / 2; k++) {
            double re = 0, im = 0;
            for (int i = 0; i < L; i++) {
                const double a = 2.0 * M_PI * (double)((long)k * i % N) / N;
                re += f[i] * cos(a);
                im -= f[i] * sin(a);
            }
            power[k] = re * re + im * im;
        }
        /* the triangles on the mel scale, at the bins' frequencies k * rate / N */
        for (int b = 0; b < B; b++) {
            double e = 0;
            for (int k = 0; k < N / 2; k++)
                e += triangle(mlo + b * step, mlo + (b + 1) * step, mlo + (b + 2) * step,
                              mel((double)k * o->sample_rate / N)) * power[k];
            out[t * B + b] = log(e > FLT_EPSILON ? e : FLT_EPSILON);
        }
    }
    free(f);
    free(power);
}
