/* Plain double-precision reference of Kaldi's log-mel filterbanks
 * (experiments/tasks/speech/fbank.h), written from the definition for clarity: every frame
 * cut, centred, pre-emphasised and windowed in double, its power spectrum by a direct
 * DFT (a sum per frequency, no FFT), each triangle's weight evaluated where it is
 * used. Used only by the tests. */
#ifndef AB_REF_FBANK_H
#define AB_REF_FBANK_H

typedef struct {
    int sample_rate, num_mel_bins;
    double frame_length_ms, frame_shift_ms, preemph, low_freq, high_freq;
} ref_fbank_opts;

/* Frames of n samples (snip_edges: whole frames only). */
long ref_fbank_frames(const ref_fbank_opts *o, long n);

/* The log-mel energies of x (n samples): ref_fbank_frames x num_mel_bins doubles. */
void ref_fbank(const ref_fbank_opts *o, const double *x, long n, double *out);

#endif
