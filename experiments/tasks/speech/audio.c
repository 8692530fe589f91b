/* The audio of a wav.scp entry (audio.h). */
#include "audio.h"

#include "data_command.h"
#include "error.h"
#include "fileio.h"
#include "memory.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sndfile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void au_free(au_signal *s) {
    if (!s) return;
    ab_free(s->samples);
    memset(s, 0, sizeof *s);
}

/* libsndfile reports why an open failed through a global (sf_strerror(NULL)): opens
 * are serialised so that the message read is this open's. */
static pthread_mutex_t g_open_lock = PTHREAD_MUTEX_INITIALIZER;

/* A WAV file shorter than its header announces: libsndfile reads what is there, and
 * notes the difference in its log as "data : ANNOUNCED (should be PRESENT)". Only for
 * files: a WAV streamed through a pipe may announce a size it does not know (a
 * command stopping early is caught by its exit status). */
static int check_truncated(SNDFILE *sf, const char *where) {
    char log[4096] = "";
    sf_command(sf, SFC_GET_LOG_INFO, log, sizeof log);
    for (const char *l = log; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        long long said, is;
        if (sscanf(l, "data : %lld (should be %lld)", &said, &is) == 2 && said > is)
            return ab_fail(AB_EINVAL, "%s: truncated: the WAV header announces %lld bytes of samples, the file holds %lld",
                           where, said, is);
    }
    return 0;
}

/* Decodes an open SNDFILE into out->samples. */
static int decode(SNDFILE *sf, const SF_INFO *info, const char *where, au_signal *out) {
    if (info->channels != 1)
        return ab_fail(AB_EINVAL, "%s: the audio has %d channels; one is needed (select one in wav.scp, e.g. "
                                  "'sox FILE -t wav - remix 1 |')",
                       where, info->channels);
    if (info->frames <= 0) return ab_fail(AB_EINVAL, "%s: the audio holds no samples", where);
    if (info->samplerate <= 0) return ab_fail(AB_EINVAL, "%s: the audio's sample rate is %d Hz", where, info->samplerate);
    if ((unsigned long long)info->frames > ((size_t)1 << 40) / sizeof(float))
        return ab_fail(AB_EINVAL, "%s: the audio claims %lld samples, more than is plausible", where,
                       (long long)info->frames);
    /* The count is the header's claim (a 42-byte FLAC's STREAMINFO may announce 2^35
     * samples): the buffer grows with what is decoded, from at most 2^20 samples,
     * doubling up to the count, so a file holding few samples costs little. */
    const sf_count_t first = (sf_count_t)1 << 20;
    sf_count_t cap = info->frames < first ? info->frames : first;
    float *x = ab_alloc((size_t)cap * sizeof(float));
    if (!x) return ab_fail(AB_ENOMEM, "%s: out of memory for %lld samples", where, (long long)cap);
    sf_count_t got = 0;
    while (got < info->frames) {
        if (got == cap) {
            const sf_count_t bigger = cap > info->frames / 2 ? info->frames : 2 * cap;
            /* samples decoded, not claimed: audio that really is larger than memory */
            const char *big = ab_too_large((size_t)bigger * sizeof(float));
            if (big) {
                ab_free(x);
                return ab_fail(AB_EINVAL, "%s: %lld samples decoded and more to come, %s", where, (long long)got, big);
            }
            float *y = ab_alloc((size_t)bigger * sizeof(float));
            if (!y) {
                ab_free(x);
                return ab_fail(AB_ENOMEM, "%s: out of memory for %lld samples", where, (long long)bigger);
            }
            memcpy(y, x, (size_t)got * sizeof(float));
            ab_free(x);
            x = y;
            cap = bigger;
        }
        sf_count_t k = sf_readf_float(sf, x + got, cap - got);
        if (k <= 0) break;
        got += k;
    }
    if (got < info->frames) {
        ab_free(x);
        const char *why = sf_strerror(sf);
        return ab_fail(AB_EINVAL, "%s: the audio ends after %lld of its %lld samples%s%s", where, (long long)got,
                       (long long)info->frames, sf_error(sf) ? ": " : " (truncated)", sf_error(sf) ? why : "");
    }
    /* libsndfile's normalised floats (a 16-bit sample s reads as s / 32768) back at
     * the 16-bit integer scale Kaldi computes features on. A float file may hold NaN
     * or infinity, or a value that the scaling takes past the float range: refused, as
     * the archives' non-finite values are (one would make every feature of its
     * speaker NaN through CMVN). */
    for (sf_count_t i = 0; i < got; i++) {
        const float v = x[i];
        x[i] = v * 32768.0f;
        if (!isfinite(x[i])) {
            ab_free(x);
            return ab_fail(AB_EINVAL, "%s: sample %lld (at %.4f s) is %g: not a finite number at the 16-bit scale",
                           where, (long long)i, (double)i / info->samplerate, (double)v);
        }
    }
    out->samples = x;
    out->n = (long long)got;
    out->rate = info->samplerate;
    return 0;
}

/* ---- a file ---- */

static int read_file(const char *path, const char *where, au_signal *out) {
    int rc;
    FILE *f = ab_fopen_regular(path, "audio", &rc);
    if (!f) {
        char why[512];
        snprintf(why, sizeof why, "%s", ab_error());
        return ab_fail(rc, "%s: %s", where, why);
    }
    SF_INFO info;
    memset(&info, 0, sizeof info);
    pthread_mutex_lock(&g_open_lock);
    SNDFILE *sf = sf_open_fd(fileno(f), SFM_READ, &info, 0);
    char why[256] = "";
    if (!sf) snprintf(why, sizeof why, "%s", sf_strerror(NULL));
    pthread_mutex_unlock(&g_open_lock);
    if (!sf) {
        fclose(f);
        return ab_fail(AB_EINVAL, "%s: %s: not audio that libsndfile reads (%s)", where, path, why);
    }
    if (!(rc = check_truncated(sf, where))) rc = decode(sf, &info, where, out);
    sf_close(sf);
    fclose(f);
    return rc;
}

/* ---- a command's output, in memory ---- */

typedef struct {
    unsigned char *data;
    size_t size, cap;
} buffer;

typedef struct {
    const buffer *b;
    sf_count_t pos;
} vio_state;

static sf_count_t vio_len(void *u) { return (sf_count_t)((vio_state *)u)->b->size; }
static sf_count_t vio_seek(sf_count_t off, int whence, void *u) {
    vio_state *s = u;
    sf_count_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? s->pos : (sf_count_t)s->b->size;
    sf_count_t p = base + off;
    if (p < 0) p = 0;
    if (p > (sf_count_t)s->b->size) p = (sf_count_t)s->b->size;
    s->pos = p;
    return p;
}
static sf_count_t vio_read(void *ptr, sf_count_t count, void *u) {
    vio_state *s = u;
    sf_count_t left = (sf_count_t)s->b->size - s->pos;
    if (count > left) count = left;
    if (count > 0) memcpy(ptr, s->b->data + s->pos, (size_t)count);
    s->pos += count;
    return count;
}
static sf_count_t vio_write(const void *ptr, sf_count_t count, void *u) {
    (void)ptr;
    (void)count;
    (void)u;
    return 0;
}
static sf_count_t vio_tell(void *u) { return ((vio_state *)u)->pos; }

static int read_command(const char *cmd, const char *where, au_signal *out) {
    buffer outb = {0};
    int rc = dc_run(cmd, where, &outb.data, &outb.size);
    outb.cap = outb.size;
    if (!rc) {
        vio_state st = {&outb, 0};
        SF_VIRTUAL_IO vio = {vio_len, vio_seek, vio_read, vio_write, vio_tell};
        SF_INFO info;
        memset(&info, 0, sizeof info);
        pthread_mutex_lock(&g_open_lock);
        SNDFILE *sf = sf_open_virtual(&vio, SFM_READ, &info, &st);
        char why[256] = "";
        if (!sf) snprintf(why, sizeof why, "%s", sf_strerror(NULL));
        pthread_mutex_unlock(&g_open_lock);
        if (!sf) {
            rc = ab_fail(AB_EINVAL, "%s: the output of '%s' (%zu bytes) is not audio that libsndfile reads (%s)", where,
                         cmd, outb.size, why);
        } else {
            rc = decode(sf, &info, where, out);
            sf_close(sf);
        }
    }
    free(outb.data);
    return rc;
}

int au_read(const char *spec, bool is_command, const char *where, au_signal *out) {
    memset(out, 0, sizeof *out);
    return is_command ? read_command(spec, where, out) : read_file(spec, where, out);
}
