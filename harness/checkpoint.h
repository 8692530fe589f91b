/* Checkpoints: named byte blobs in one file, written atomically, read back with every
 * byte checked.
 *
 * File layout (version 1). Integers are in the writer's native byte order, which the
 * header records; blobs are raw bytes (float arrays in native order).
 *
 *   header, 64 bytes
 *     0  magic        89 'A' 'B' 'K' 0D 0A 1A 0A  (like PNG's: a high-bit byte, CR LF,
 *                     ^Z and LF show 7-bit and text-mode transfers)
 *     8  u32 version  1
 *    12  u32 byte order tag 0x01020304
 *    16  u32 header bytes (64)     20  u32 table entry bytes (64)
 *    24  u32 count (blobs)         28  u32 capacity (table slots, >= count)
 *    32  u32 alignment (64)        36  u32 CRC32 of the header with this field zero
 *    40  u64 data offset = 64 + 64 * capacity rounded up to the alignment
 *    48  u64 file bytes            56  u32 CRC32 of the whole table   60  u32 zero
 *   table, capacity entries of 64 bytes (unused ones all zero)
 *     0  name, at most AB_CKPT_NAME_MAX printable ASCII characters (no spaces),
 *        NUL-padded to 40 bytes
 *    40  u64 offset   48  u64 bytes   56  u32 CRC32 of the blob (zlib)   60  u32 zero
 *   blobs, in table order, each at the next multiple of the alignment after the one
 *   before (the first at the data offset), zero bytes between them, the file ending
 *   with the last blob.
 *
 * The reader checks all of it: every byte of the file is covered by a CRC or must be
 * zero, so any damage is refused, never misread, and no byte sequence crashes it.
 * Messages name the file: "not an attnbench checkpoint", "checkpoint format version
 * X, this build reads 1", "truncated checkpoint (N bytes, its header says M)",
 * "blob 'params' is corrupt (CRC mismatch)", ...
 *
 * The container knows nothing of models or training runs; the helpers at the end write
 * and read JSON values (models/optim.h adds the optimiser's state).
 */
#ifndef AB_CHECKPOINT_H
#define AB_CHECKPOINT_H


#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AB_CKPT_VERSION 1
#define AB_CKPT_NAME_MAX 39  /* characters in a blob name */
#define AB_CKPT_MAX_BLOBS 64 /* blobs one writer can add (the table is reserved up front) */

/* Conventional blob names. */
#define AB_CKPT_PARAMS "params" /* the model's flat float parameters */
#define AB_CKPT_OPTIM "optim"   /* ab_ckpt_add_optim */
#define AB_CKPT_CONFIG "config" /* the run's config, ab_ckpt_add_json */

/* ---- writing ---- */

typedef struct ab_ckpt_writer ab_ckpt_writer;

/* Starts a checkpoint at PATH: blobs go to a temporary file beside it (PATH.tmp.*);
 * PATH itself is only replaced by a complete, synced file at commit. 0 or AB_EIO /
 * AB_ENOMEM with a message. */
int ab_ckpt_begin(const char *path, ab_ckpt_writer **out);
/* Appends a blob, streamed to the file now (data is not kept). Names are unique,
 * 1..AB_CKPT_NAME_MAX printable ASCII characters without spaces. `data` may be NULL
 * when bytes == 0. After a failed add the writer is poisoned: commit fails. */
int ab_ckpt_add(ab_ckpt_writer *w, const char *name, const void *data, size_t bytes);
/* Writes the header and table, flushes, fsyncs and renames over PATH. Frees the
 * writer whatever happens; on failure the temporary file is removed and an existing
 * PATH is untouched. */
int ab_ckpt_commit(ab_ckpt_writer *w);
/* Marks the writer failed with error code rc (a helper that could not produce its
 * blob): commit then fails. Returns rc. */
int ab_ckpt_poison(ab_ckpt_writer *w, int rc);
/* Gives up: removes the temporary file and frees the writer (NULL is fine). */
void ab_ckpt_abort(ab_ckpt_writer *w);

/* ---- reading ---- */

typedef struct ab_ckpt_reader ab_ckpt_reader;

/* Reads and validates the whole file (magic, byte order, version, header and table
 * CRCs, layout against the file size, padding, names, every blob's CRC); a file whose
 * header is wrong is refused before the rest is read. The blobs stay in memory (tracked
 * allocator) until close. 0, or
 * AB_EINVAL (not a checkpoint, damaged, truncated, other version) / AB_EIO /
 * AB_ENOMEM with a message naming PATH. */
int ab_ckpt_open(const char *path, ab_ckpt_reader **out);
void ab_ckpt_close(ab_ckpt_reader *r);
const char *ab_ckpt_path(const ab_ckpt_reader *r);
int ab_ckpt_count(const ab_ckpt_reader *r);
/* Name of blob i (0 <= i < count, in file order), NULL outside. */
const char *ab_ckpt_name(const ab_ckpt_reader *r, int i);
bool ab_ckpt_has(const ab_ckpt_reader *r, const char *name);
/* Points at a blob inside the reader (64-byte aligned, so a float blob can be used in
 * place; valid until close). 0 or AB_EINVAL "no blob 'x'". */
int ab_ckpt_get(const ab_ckpt_reader *r, const char *name, const void **data, size_t *bytes);
/* Copies a blob of exactly `expected` bytes into dst; AB_EINVAL "blob 'params' has
 * 1234 bytes, expected 5678" or "no blob" otherwise (dst untouched). */
int ab_ckpt_read(const ab_ckpt_reader *r, const char *name, void *dst, size_t expected);

/* ---- common blobs ---- */

/* A JSON value as compact text (reals with 17 significant digits, so numbers read
 * back exactly). */
int ab_ckpt_add_json(ab_ckpt_writer *w, const char *name, const json_t *value);
/* Parses it back (new reference in *out); AB_EINVAL naming the blob if it is missing
 * or not valid JSON. */
int ab_ckpt_get_json(const ab_ckpt_reader *r, const char *name, json_t **out);

#endif
