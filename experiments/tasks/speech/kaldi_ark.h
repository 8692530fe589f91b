/* Kaldi binary archives of matrices (experiments/speech/README.md): reading a matrix
 * at an offset (a feats.scp entry PATH:OFFSET), reading an archive record by record,
 * and writing float matrices into an archive with its .scp index.
 *
 * An archive is records "KEY " + object; a binary object starts with the two bytes
 * "\0B" and a token followed by a space. The matrix objects read here (little-endian,
 * as Kaldi writes them on every machine it runs on):
 *
 *   "FM " / "DM "   float / double matrix: 0x04, int32 rows, 0x04, int32 cols, then
 *                   rows x cols values row by row (doubles are converted to float)
 *   "CM "           compressed, one byte per value with column headers: a global
 *                   header (float min, float range, int32 rows, int32 cols), then per
 *                   column four uint16 (percentiles 0, 25, 75, 100: each min + range *
 *                   q / 65535), then the bytes column by column; a byte c decodes
 *                   piecewise linearly between the percentiles: c in [0, 64] from p0 to
 *                   p25, (64, 192] from p25 to p75, (192, 255] from p75 to p100
 *   "CM2 "          the global header, then uint16 q row by row: min + range * q / 65535
 *   "CM3 "          the global header, then uint8 q row by row: min + range * q / 255
 *
 * CM is what Kaldi's copy-feats --compress=true and the feature scripts' default
 * compression write. Text-mode objects, vectors and other types are refused.
 *
 * Every failure is one line naming the file, the offset and, when known, the key:
 * AB_EINVAL for a foreign, malformed or truncated object (a header announcing more
 * bytes than the file holds from there is refused before anything is allocated; an
 * empty matrix, a value that is not finite), AB_EIO when reading fails, AB_ENOMEM. */
#ifndef AB_SPEECH_KALDI_ARK_H
#define AB_SPEECH_KALDI_ARK_H

#include <stdbool.h>
#include <stdio.h>

/* A matrix read from an archive: rows x cols floats, row by row (tracked allocator). */
typedef struct {
    int rows, cols;
    float *data;
    char format[4]; /* the object's token: "FM", "DM", "CM", "CM2" or "CM3" */
} ka_matrix;

void ka_matrix_free(ka_matrix *m);

/* Reads the matrix object that starts at byte `offset` of the file `path` (the "\0B"
 * of an archive record, as a feats.scp line PATH:OFFSET gives it; 0 for a file holding
 * one object). `key` (or NULL) names it in messages. */
int ka_read_at(const char *path, long long offset, const char *key, ka_matrix *m);

/* ---- sequential reading ---- */

typedef struct ka_reader ka_reader;

int ka_reader_open(const char *path, ka_reader **out);
/* The next record: 1 with its key (valid until the next call) and matrix (the
 * caller's, ka_matrix_free) and the offset of its object, 0 at the end of the archive,
 * or a negative error code with a message. */
int ka_reader_next(ka_reader *r, const char **key, ka_matrix *m, long long *offset);
void ka_reader_close(ka_reader *r);

/* ---- writing ---- */

typedef struct ka_writer ka_writer;

/* Whether a .scp index can hold `s` as a name: no whitespace or control character. */
bool ka_index_name_ok(const char *s);

/* Starts PATH.ark and PATH.scp... as temporary files: they appear under their names
 * (ark_path, scp_path) only at ka_writer_commit, so an old archive survives a failed
 * or abandoned write. scp lines name the archive as `ark_name` (e.g. its absolute path). */
int ka_writer_open(const char *ark_path, const char *scp_path, const char *ark_name, ka_writer **out);
/* Appends the record KEY (non-empty, no whitespace) holding rows x cols floats as a
 * Kaldi float matrix ("FM"), and its line "KEY ARK_NAME:OFFSET" to the index. */
int ka_writer_add(ka_writer *w, const char *key, int rows, int cols, const float *data);
/* Flushes, syncs and renames both files into place; frees w (also on failure). */
int ka_writer_commit(ka_writer *w);
/* Removes the temporary files and frees w. */
void ka_writer_abort(ka_writer *w);

#endif
