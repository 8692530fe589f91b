/* The feature cache: a Kaldi archive, its index and a JSON key (feat_cache.h). */
#include "feat_cache.h"

#include "error.h"
#include "fileio.h"
#include "kaldi_ark.h"
#include "memory.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* Bump when the features computed from the same audio and options change. */
#define FC_IMPLEMENTATION 1

static char *with_ext(const char *prefix, const char *ext) {
    size_t n = strlen(prefix) + strlen(ext) + 1;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s%s", prefix, ext);
    return p;
}

/* The CRC-32 and size of a file's bytes. */
static int file_crc(const char *path, uLong *crc, long long *bytes) {
    int rc;
    FILE *f = ab_fopen_regular(path, "", &rc);
    if (!f) return rc;
    unsigned char buf[1 << 16];
    size_t k;
    *crc = crc32(0L, Z_NULL, 0);
    *bytes = 0;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
        *crc = crc32(*crc, buf, (uInt)k);
        *bytes += (long long)k;
    }
    rc = ferror(f) ? ab_fail(ab_io_code(errno), "cannot read %s: %s", path, strerror(errno)) : 0;
    fclose(f);
    return rc;
}

/* Adds "PATH\tSIZE\tMTIME\n" of a regular file to the CRC; whether it was one. */
static bool add_file(const char *path, uLong *crc) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return false;
    char line[PATH_MAX + 96];
    int n = snprintf(line, sizeof line, "%s\t%lld\t%lld.%09ld\n", path, (long long)st.st_size, (long long)st.st_mtim.tv_sec,
                     (long)st.st_mtim.tv_nsec);
    *crc = crc32(*crc, (const Bytef *)line, (uInt)(n < (int)sizeof line ? n : (int)sizeof line - 1));
    return true;
}

json_t *fc_key(const kd_dir *d, const fb_options *o) {
    uLong scp_crc;
    long long scp_bytes;
    if (file_crc(d->scp_path, &scp_crc, &scp_bytes)) return NULL;
    uLong ids = crc32(0L, Z_NULL, 0), audio = crc32(0L, Z_NULL, 0);
    long long files = 0;
    for (int i = 0; i < d->n; i++) {
        const kd_utt *u = &d->utts[i];
        ids = crc32(ids, (const Bytef *)u->id, (uInt)strlen(u->id));
        ids = crc32(ids, (const Bytef *)"\n", 1);
        if (!u->audio_command) {
            files += add_file(u->audio, &audio);
            continue;
        }
        /* a command: every word of it that names a file (its input, usually) */
        char *copy = strdup(u->audio), *save = NULL;
        if (!copy) {
            ab_fail(AB_ENOMEM, "out of memory");
            return NULL;
        }
        for (char *w = strtok_r(copy, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) files += add_file(w, &audio);
        free(copy);
    }
    json_t *fb = json_pack("{s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:b, s:b, s:s}", "sample_rate",
                           o->sample_rate, "num_mel_bins", o->num_mel_bins, "frame_length_ms",
                           o->frame_length_ms, "frame_shift_ms", o->frame_shift_ms, "preemph", o->preemph, "low_freq",
                           o->low_freq, "high_freq", o->high_freq, "dither", 0.0, "window", "povey", "snip_edges", 1,
                           "remove_dc_offset", 1, "log_floor", "FLT_EPSILON");
    json_t *key = json_pack("{s:i, s:o, s:{s:I, s:I}, s:i, s:I, s:{s:I, s:I}}", "implementation",
                            FC_IMPLEMENTATION, "fbank", fb, "wav_scp", "bytes",
                            (json_int_t)scp_bytes, "crc32", (json_int_t)scp_crc, "utterances", d->n,
                            "ids_crc32", (json_int_t)ids, "audio", "files", (json_int_t)files, "crc32",
                            (json_int_t)audio);
    if (!key) ab_fail(AB_ENOMEM, "out of memory");
    return key;
}

/* The CRC-32 of the features as stored: every utterance's floats, in order. */
static uint32_t features_crc(const kd_dir *d, int dim, float *const *feats, const int *frames) {
    uLong c = crc32_z(0L, Z_NULL, 0);
    for (int i = 0; i < d->n; i++)
        c = crc32_z(c, (const Bytef *)feats[i], sizeof(float) * (size_t)frames[i] * (size_t)dim);
    return (uint32_t)c;
}

int fc_load(const char *prefix, const json_t *key, const kd_dir *d, int dim, float **feats, int *frames,
            double *seconds) {
    char *jp = with_ext(prefix, ".json"), *ap = with_ext(prefix, ".ark");
    int rc = 0;
    json_t *j = NULL;
    ka_reader *r = NULL;
    if (!jp || !ap) {
        rc = ab_fail(AB_ENOMEM, "out of memory");
        goto done;
    }
    json_error_t err;
    struct stat st;
    if (stat(jp, &st) != 0 || !S_ISREG(st.st_mode) || !(j = json_load_file(jp, 0, &err))) goto done; /* no cache */
    const json_t *k = json_object_get(j, "key"), *crc = json_object_get(j, "features_crc32");
    if (!k || !json_equal((json_t *)k, (json_t *)key)) goto done; /* another key: stale */
    if (!json_is_integer(crc)) goto done; /* written before the features had a checksum: computed again */
    *seconds = json_number_value(json_object_get(j, "seconds"));
    if ((rc = ka_reader_open(ap, &r))) {
        char why[700];
        snprintf(why, sizeof why, "%s", ab_error());
        rc = ab_fail(rc, "feature cache %s: %s (delete %s to compute the features again)", jp, why, jp);
        goto done;
    }
    for (int i = 0; i <= d->n; i++) {
        const char *id;
        ka_matrix m;
        int got = ka_reader_next(r, &id, &m, NULL);
        if (got < 0) {
            char why[700];
            snprintf(why, sizeof why, "%s", ab_error());
            rc = ab_fail(got, "feature cache: %s (delete %s to compute the features again)", why, jp);
        } else if (got == 0 && i < d->n) {
            rc = ab_fail(AB_EINVAL, "feature cache %s: it ends after %d of its %d utterances (delete %s to compute the "
                                    "features again)", ap, i, d->n, jp);
        } else if (got == 1 && i == d->n) {
            rc = ab_fail(AB_EINVAL, "feature cache %s: more records than its %d utterances (delete %s to compute the "
                                    "features again)", ap, d->n, jp);
            ka_matrix_free(&m);
        } else if (got == 1 && (strcmp(id, d->utts[i].id) != 0 || m.cols != dim)) {
            rc = ab_fail(AB_EINVAL, "feature cache %s: record %d is '%s' with %d columns, expected '%s' with %d (delete "
                                    "%s to compute the features again)", ap, i + 1, id, m.cols, d->utts[i].id, dim, jp);
            ka_matrix_free(&m);
        } else if (got == 1) {
            feats[i] = m.data;
            frames[i] = m.rows;
        }
        if (rc || got == 0) break;
    }
    if (!rc && features_crc(d, dim, feats, frames) != (uint32_t)json_integer_value(crc))
        rc = ab_fail(AB_EINVAL, "feature cache %s: the features are not those written (their CRC-32 differs from the one "
                                "%s records; delete %s to compute the features again)", ap, jp, jp);
    if (rc)
        for (int i = 0; i < d->n; i++) {
            ab_free(feats[i]);
            feats[i] = NULL;
        }
    else rc = 1;
done:
    ka_reader_close(r);
    if (j) json_decref(j);
    free(jp);
    free(ap);
    return rc;
}

/* Whether the archive's absolute path, FOLDER/BASE.ark, could go into a .scp index (no
 * whitespace or control character), found before FOLDER is made, so that a refusal
 * leaves no folder behind: the real path of FOLDER's deepest existing ancestor, then the
 * rest of FOLDER as given, then BASE. */
static int check_index_name(const char *folder, const char *base) {
    char probe[PATH_MAX], real[PATH_MAX];
    if (snprintf(probe, sizeof probe, "%s", folder) >= (int)sizeof probe)
        return ab_fail(AB_EINVAL, "feature cache %s: the path is too long", folder);
    size_t keep = strlen(probe);
    while (!realpath(probe, real)) { /* up one component */
        char *slash = strrchr(probe, '/');
        if (!slash) {
            snprintf(probe, sizeof probe, ".");
            if (!realpath(probe, real))
                return ab_fail(ab_io_code(errno), "feature cache %s: %s", folder, strerror(errno));
            keep = 0;
            break;
        }
        *slash = '\0';
        keep = (size_t)(slash - probe);
        if (!*probe) { /* the root */
            snprintf(real, sizeof real, "/");
            break;
        }
    }
    const char *parts[3] = {real, folder + keep, base};
    for (int k = 0; k < 3; k++)
        if (!ka_index_name_ok(parts[k]))
            return ab_fail(AB_EINVAL, "feature cache %s/%s.ark: a path with whitespace or a control character "
                                      "cannot be written into a .scp index%s%s%s",
                           folder, base, k ? "" : " (its absolute path begins ", k ? "" : real, k ? "" : ")");
    return 0;
}

/* PREFIX split into its folder and base (in c1 and c2, strdup'd copies of it), checked:
 * the base names files, and the archive's absolute path can go into an index. */
static int split_prefix(const char *prefix, char *c1, char *c2, const char **folder, const char **base) {
    *folder = dirname(c1);
    *base = basename(c2);
    if (!**base || strcmp(*base, "/") == 0 || strcmp(*base, ".") == 0 || strcmp(*base, "..") == 0)
        return ab_fail(AB_EINVAL, "feature cache '%s': a prefix names files (FOLDER/NAME gives NAME.ark, NAME.scp, "
                                  "NAME.json)", prefix);
    return check_index_name(*folder, *base);
}

int fc_check_prefix(const char *prefix) {
    char *c1 = strdup(prefix), *c2 = strdup(prefix);
    const char *folder, *base;
    int rc = !c1 || !c2 ? ab_fail(AB_ENOMEM, "out of memory") : split_prefix(prefix, c1, c2, &folder, &base);
    free(c1);
    free(c2);
    return rc;
}

int fc_save(const char *prefix, const json_t *key, const kd_dir *d, int dim, float *const *feats, const int *frames,
            double seconds) {
    char *jp = with_ext(prefix, ".json"), *ap = with_ext(prefix, ".ark"), *sp = with_ext(prefix, ".scp");
    char *c1 = strdup(prefix), *c2 = strdup(prefix), *name = NULL;
    int rc = 0;
    ka_writer *w = NULL;
    if (!jp || !ap || !sp || !c1 || !c2) {
        rc = ab_fail(AB_ENOMEM, "out of memory");
        goto done;
    }
    /* the archive's absolute path for the index, which Kaldi reads from anywhere */
    const char *folder, *base;
    if ((rc = split_prefix(prefix, c1, c2, &folder, &base)) || (rc = ab_mkdir_p(folder))) goto done;
    char real[PATH_MAX];
    if (!realpath(folder, real)) {
        rc = ab_fail(ab_io_code(errno), "feature cache %s: %s", folder, strerror(errno));
        goto done;
    }
    size_t n = strlen(real) + strlen(base) + 8;
    if (!(name = malloc(n))) {
        rc = ab_fail(AB_ENOMEM, "out of memory");
        goto done;
    }
    snprintf(name, n, "%s/%s.ark", strcmp(real, "/") == 0 ? "" : real, base);
    if (remove(jp) != 0 && errno != ENOENT) {
        rc = ab_fail(ab_io_code(errno), "cannot remove %s: %s", jp, strerror(errno));
        goto done;
    }
    if ((rc = ka_writer_open(ap, sp, name, &w))) goto done;
    long long total = 0;
    for (int i = 0; i < d->n && !rc; i++) {
        rc = ka_writer_add(w, d->utts[i].id, frames[i], dim, feats[i]);
        total += frames[i];
    }
    if (rc) {
        ka_writer_abort(w);
        goto done;
    }
    if ((rc = ka_writer_commit(w))) goto done;
    json_t *doc = json_pack("{s:s, s:O, s:f, s:I, s:i, s:I}", "schema", "attnbench/feature-cache/1", "key", key,
                            "seconds", seconds, "frames", (json_int_t)total, "dim", dim, "features_crc32",
                            (json_int_t)features_crc(d, dim, feats, frames));
    ab_atomic_file af;
    if (!doc) rc = ab_fail(AB_ENOMEM, "out of memory");
    else if (!(rc = ab_atomic_open(&af, jp))) {
        errno = 0;
        if (json_dumpf(doc, af.f, JSON_INDENT(1) | JSON_SORT_KEYS) != 0 || fputc('\n', af.f) == EOF) {
            ab_atomic_abort(&af);
            rc = ab_fail(errno ? ab_io_code(errno) : AB_ESYSTEM, "cannot write %s: %s", jp,
                         errno ? strerror(errno) : "the write failed");
        } else {
            rc = ab_atomic_commit(&af);
        }
    }
    if (doc) json_decref(doc);
done:
    free(jp);
    free(ap);
    free(sp);
    free(c1);
    free(c2);
    free(name);
    return rc;
}
