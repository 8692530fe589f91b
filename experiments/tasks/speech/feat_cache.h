/* The feature cache (experiments/speech/README.md): the features of a data
 * directory's utterances, computed once from the audio, kept as a Kaldi archive
 * PREFIX.ark with its index PREFIX.scp (float matrices, readable by Kaldi's tools) and
 * PREFIX.json, which says what they were computed from:
 *
 *   {"schema": "attnbench/feature-cache/1",
 *    "key": {"implementation": 1, "fbank": {the options}, "wav_scp": {"bytes", "crc32"},
 *            "utterances": N, "ids_crc32": ..., "audio": {"files", "crc32"}},
 *    "seconds": audio seconds, "frames": total frames, "dim": D,
 *    "features_crc32": the CRC-32 of every utterance's floats, in order}
 *
 * The key holds the feature options, the CRC-32 of wav.scp's bytes and of the
 * utterance ids in order, and the CRC-32 of the size and modification time of every
 * audio file (for a command, of every word of it that names an existing file, e.g. the
 * .wv1 file of a sph2pipe command): a change of any of them makes the cache stale, and
 * the features are computed again and the cache rewritten. "implementation" changes
 * when the computation does. CMVN is applied after the cache: it does not enter it.
 *
 * Writing: the archive and index are written as temporary files and renamed into
 * place, PREFIX.json last (it is removed first), so a cache is either complete or
 * ignored. A cache whose key matches but whose archive does not hold exactly the
 * utterances in order, or whose floats do not match features_crc32 (a damaged file,
 * a flipped value), is an error naming it, not recomputed; one written before
 * features_crc32 existed is recomputed. */
#ifndef AB_SPEECH_FEAT_CACHE_H
#define AB_SPEECH_FEAT_CACHE_H

#include "fbank.h"
#include "kaldi_dir.h"

#include <jansson.h>

/* The key of directory d's features under options o (a new reference), or NULL with
 * a message. */
json_t *fc_key(const kd_dir *d, const fb_options *o);

/* Loads PREFIX.ark when PREFIX.json holds `key`: 1 with feats[i] (frames[i] x dim
 * floats, tracked allocator) for every utterance of d and the audio's *seconds; 0 when
 * there is no cache for this key (no PREFIX.json, an unreadable one, another key);
 * negative with a message when the cache is damaged. */
int fc_load(const char *prefix, const json_t *key, const kd_dir *d, int dim, float **feats, int *frames,
            double *seconds);

/* Whether PREFIX can hold a cache: its last component names files, and the archive's
 * absolute path has no whitespace or control character (the .scp index could not hold
 * it). Checked before any feature is computed or any folder made; AB_EINVAL. */
int fc_check_prefix(const char *prefix);

/* Writes the cache (making PREFIX's folder when needed). */
int fc_save(const char *prefix, const json_t *key, const kd_dir *d, int dim, float *const *feats, const int *frames,
            double seconds);

#endif
