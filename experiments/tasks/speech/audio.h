/* The audio of a wav.scp entry (experiments/speech/README.md), read with libsndfile:
 * a file, or the standard output of a command (Kaldi's "extended filename": a line
 * ending in '|', e.g. "sph2pipe -f wav -p -c 1 X.wv1 |" in WSJ's data directories),
 * run with /bin/sh as Kaldi does, under the user's policy (data_command.h: only when
 * allowed, in a process group of its own, with a time and an output limit), read whole
 * into memory and decoded from there (libsndfile's virtual I/O). Any format libsndfile reads (WAV, FLAC, NIST SPHERE
 * without shorten compression, ...).
 *
 * Samples are floats at 16-bit integer scale, as Kaldi reads them: a 16-bit file's
 * samples are its integers exactly (-32768..32767); other encodings are scaled to the
 * same range (libsndfile's normalised value times 32768). One channel only: a
 * multi-channel file is refused (Kaldi's convention: pick a channel in the command,
 * e.g. "sox X.wav -t wav - remix 1 |").
 *
 * Every failure is one line naming the entry (`where`, e.g. "data/train/wav.scp:12
 * (utterance X)"): AB_EINVAL for a missing or unreadable file, a command that fails
 * (its exit status and the last line it wrote to stderr) or writes nothing, data
 * libsndfile does not decode, several channels, no samples, fewer samples than the header
 * announces, a sample that is not finite at the 16-bit scale (a float file's NaN,
 * infinity or value past 1e34); AB_ENOMEM, AB_EIO. A header's sample count is not
 * trusted for memory: the samples are stored as they decode.
 * Thread-safe (several utterances may be read at once). */
#ifndef AB_SPEECH_AUDIO_H
#define AB_SPEECH_AUDIO_H

#include <stdbool.h>

typedef struct {
    float *samples; /* n samples (tracked allocator) */
    long long n;
    int rate; /* Hz, as the file says */
} au_signal;

/* Reads `spec`: a path, or with is_command a shell command (without the final '|')
 * whose standard output is the audio. */
int au_read(const char *spec, bool is_command, const char *where, au_signal *out);
void au_free(au_signal *s);

#endif
