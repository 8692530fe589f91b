/* A Kaldi data directory loaded into memory: options, features, CMVN
 * (speech_data.h). */
#include "speech_data.h"

#include "audio.h"
#include "config.h"
#include "error.h"
#include "feat_cache.h"
#include "kaldi_ark.h"
#include "memory.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- options ---- */

typedef enum { OPT_INT, OPT_NUM, OPT_BOOL, OPT_STR, OPT_SOURCE, OPT_CMVN } opt_type;

typedef struct {
    const char *key;
    opt_type type;
    double min, max; /* numbers */
} opt_spec;

static const opt_spec OPTS[] = {
    {"sample_rate", OPT_INT, 1000, 384000},
    {"num_mel_bins", OPT_INT, 3, 1024},
    {"frame_length_ms", OPT_NUM, 1e-3, 1000},
    {"frame_shift_ms", OPT_NUM, 1e-3, 1000},
    {"preemph", OPT_NUM, 0, 1},
    {"low_freq", OPT_NUM, 0, 192000},
    {"high_freq", OPT_NUM, -192000, 192000},
    {"source", OPT_SOURCE, 0, 0},
    {"cmvn", OPT_CMVN, 0, 0},
    {"norm_vars", OPT_BOOL, 0, 0},
    {"lexicon", OPT_STR, 0, 0},
    {"phones", OPT_STR, 0, 0},
    {"drop", OPT_STR, 0, 0},
    {"cache", OPT_STR, 0, 0},
};
enum { N_OPTS = sizeof OPTS / sizeof OPTS[0] };
static const char *const SOURCE_NAMES[] = {"auto", "wav", "feats"};
static const char *const CMVN_NAMES[] = {"none", "utterance", "speaker"};

void sd_options_default(sd_options *o) {
    memset(o, 0, sizeof *o);
    fb_options_default(&o->fbank);
    o->source = KD_SOURCE_AUTO;
    o->cmvn = SD_CMVN_SPEAKER;
    o->norm_vars = true;
}

/* The fields behind each key. */
static void *field(sd_options *o, const char *key) {
    if (!strcmp(key, "sample_rate")) return &o->fbank.sample_rate;
    if (!strcmp(key, "num_mel_bins")) return &o->fbank.num_mel_bins;
    if (!strcmp(key, "frame_length_ms")) return &o->fbank.frame_length_ms;
    if (!strcmp(key, "frame_shift_ms")) return &o->fbank.frame_shift_ms;
    if (!strcmp(key, "preemph")) return &o->fbank.preemph;
    if (!strcmp(key, "low_freq")) return &o->fbank.low_freq;
    if (!strcmp(key, "high_freq")) return &o->fbank.high_freq;
    if (!strcmp(key, "source")) return &o->source;
    if (!strcmp(key, "cmvn")) return &o->cmvn;
    if (!strcmp(key, "norm_vars")) return &o->norm_vars;
    if (!strcmp(key, "lexicon")) return &o->lexicon;
    if (!strcmp(key, "phones")) return &o->phones;
    if (!strcmp(key, "drop")) return &o->drop;
    return &o->cache;
}

static const opt_spec *find_opt(const char *key) {
    for (int i = 0; i < N_OPTS; i++)
        if (strcmp(OPTS[i].key, key) == 0) return &OPTS[i];
    return NULL;
}

static int unknown_key(const char *where, const char *key) {
    char list[400];
    size_t n = 0;
    for (int i = 0; i < N_OPTS; i++) n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", OPTS[i].key);
    return ab_fail(AB_EINVAL, "unknown speech data option '%s%s%s' (options: %s)", where, *where ? "." : "", key, list);
}

static int name_index(const char *const *names, int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], s) == 0) return i;
    return -1;
}

int sd_options_set(sd_options *o, const char *key, const char *value) {
    const opt_spec *s = find_opt(key);
    if (!s) return unknown_key("", key);
    void *f = field(o, key);
    char *end;
    errno = 0;
    switch (s->type) {
    case OPT_INT: {
        long long v = strtoll(value, &end, 10);
        if (end == value || *end || errno || v < s->min || v > s->max)
            return ab_fail(AB_EINVAL, "%s=%s: expected an integer in [%g, %g]", key, value, s->min, s->max);
        *(int *)f = (int)v;
        return 0;
    }
    case OPT_NUM: {
        double v = strtod(value, &end);
        if (end == value || *end || errno || !(v >= s->min && v <= s->max))
            return ab_fail(AB_EINVAL, "%s=%s: expected a number in [%g, %g]", key, value, s->min, s->max);
        *(double *)f = v;
        return 0;
    }
    case OPT_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "1")) *(bool *)f = true;
        else if (!strcmp(value, "false") || !strcmp(value, "0")) *(bool *)f = false;
        else return ab_fail(AB_EINVAL, "%s=%s: expected true or false", key, value);
        return 0;
    case OPT_STR: *(const char **)f = *value ? value : NULL; return 0;
    case OPT_SOURCE:
    case OPT_CMVN: {
        const char *const *names = s->type == OPT_SOURCE ? SOURCE_NAMES : CMVN_NAMES;
        int i = name_index(names, 3, value);
        if (i < 0) return ab_fail(AB_EINVAL, "%s=%s: expected %s, %s or %s", key, value, names[0], names[1], names[2]);
        if (s->type == OPT_SOURCE) o->source = (kd_source)i;
        else o->cmvn = (sd_cmvn)i;
        return 0;
    }
    }
    return 0;
}

int sd_options_from_json(sd_options *o, const json_t *obj, const char *where) {
    if (!json_is_object(obj)) return ab_fail(AB_EINVAL, "config: '%s' must be an object", where);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        const opt_spec *s = find_opt(key);
        if (!s) return unknown_key(where, key);
        void *f = field(o, key);
        int rc = 0;
        switch (s->type) {
        case OPT_INT: {
            long long x;
            if (!(rc = ab_config_int(obj, where, key, true, 0, (long long)s->min, (long long)s->max, &x))) *(int *)f = (int)x;
            break;
        }
        case OPT_NUM: rc = ab_config_num(obj, where, key, true, 0, s->min, s->max, (double *)f); break;
        case OPT_BOOL: rc = ab_config_bool(obj, where, key, true, false, (bool *)f); break;
        case OPT_STR:
            if (json_is_null(v)) *(const char **)f = NULL;
            else rc = ab_config_str(obj, where, key, true, NULL, (const char **)f);
            break;
        case OPT_SOURCE:
        case OPT_CMVN: {
            const char *str;
            if ((rc = ab_config_str(obj, where, key, true, NULL, &str))) break;
            char w[300];
            snprintf(w, sizeof w, "%s%s%s", where, *where ? "." : "", key);
            rc = sd_options_set(o, key, str);
            if (rc) {
                char msg[600];
                snprintf(msg, sizeof msg, "%s", ab_error());
                rc = ab_fail(rc, "config: '%s': %s", w, msg);
            }
            break;
        }
        }
        if (rc) return rc;
        if (s->type == OPT_STR && *(const char **)f && !**(const char **)f) *(const char **)f = NULL;
    }
    return 0;
}

json_t *sd_options_to_json(const sd_options *o) {
    const fb_options *f = &o->fbank;
    return json_pack("{s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:s, s:s, s:b, s:s?, s:s?, s:s?, s:s?}", "sample_rate",
                     f->sample_rate, "num_mel_bins", f->num_mel_bins, "frame_length_ms", f->frame_length_ms,
                     "frame_shift_ms", f->frame_shift_ms, "preemph", f->preemph, "low_freq", f->low_freq, "high_freq",
                     f->high_freq, "source", SOURCE_NAMES[o->source], "cmvn", CMVN_NAMES[o->cmvn], "norm_vars",
                     (int)o->norm_vars, "lexicon", o->lexicon, "phones", o->phones, "drop", o->drop, "cache", o->cache);
}

/* ---- features, one utterance at a time on several threads ---- */

/* The first failure in utterance order, whatever the threads' timing: an utterance
 * after a failed one is skipped, every one before it still runs. */
typedef struct {
    int n;
    atomic_int first_bad; /* n when none */
    int *code;
    char **msg;
} failures;

static int failures_init(failures *f, int n) {
    f->n = n;
    atomic_init(&f->first_bad, n);
    f->code = calloc((size_t)n, sizeof(int));
    f->msg = calloc((size_t)n, sizeof(char *));
    if (!f->code || !f->msg) {
        free(f->code);
        free(f->msg);
        return ab_fail(AB_ENOMEM, "out of memory");
    }
    return 0;
}

static bool failures_skip(failures *f, int i) { return i > atomic_load(&f->first_bad); }

static void failures_add(failures *f, int i, int code) {
    f->code[i] = code;
    f->msg[i] = strdup(ab_error());
    int cur = atomic_load(&f->first_bad);
    while (i < cur && !atomic_compare_exchange_weak(&f->first_bad, &cur, i)) {
    }
}

/* The first failure's code (message set on this thread), or 0; frees. */
static int failures_end(failures *f) {
    int i = atomic_load(&f->first_bad), rc = 0;
    if (i < f->n) rc = ab_fail(f->code[i], "%s", f->msg[i] ? f->msg[i] : "out of memory");
    for (int k = 0; k < f->n; k++) free(f->msg[k]);
    free(f->code);
    free(f->msg);
    return rc;
}

/* The features of utterance i from its audio. */
static int utt_from_audio(const kd_dir *d, int i, const fbank *fb, int rate, float **feats, int *frames, double *secs) {
    const kd_utt *u = &d->utts[i];
    char where[1400];
    snprintf(where, sizeof where, "%s:%d (utterance '%s')", d->scp_path, u->scp_line, u->id);
    au_signal s;
    int rc = au_read(u->audio, u->audio_command, where, &s);
    if (rc) return rc;
    long long t = fb_frames(fb, s.n);
    if (s.rate != rate)
        rc = ab_fail(AB_EINVAL, "%s: the audio is at %d Hz, the features expect %d Hz (set sample_rate=%d to compute them "
                                "at its rate; nothing is resampled)", where, s.rate, rate, s.rate);
    else if (t == 0)
        rc = ab_fail(AB_EINVAL, "%s: %lld samples (%.4f s), shorter than one frame of %d samples", where, s.n,
                     (double)s.n / s.rate, fb_frame_length(fb));
    else if (t > INT_MAX / fb_dim(fb))
        rc = ab_fail(AB_EINVAL, "%s: %lld frames, more than one utterance may have", where, t);
    else if (!(*feats = ab_alloc((size_t)t * (size_t)fb_dim(fb) * sizeof(float))))
        rc = ab_fail(AB_ENOMEM, "%s: out of memory for %lld frames", where, t);
    else if (!(rc = fb_compute(fb, s.samples, s.n, *feats))) {
        *frames = (int)t;
        *secs = (double)s.n / s.rate;
    }
    au_free(&s);
    return rc;
}

static int compute_from_audio(const kd_dir *d, const fbank *fb, int rate, float **feats, int *frames, double *seconds) {
    failures fl;
    double *secs = calloc((size_t)d->n, sizeof(double));
    int rc = secs ? failures_init(&fl, d->n) : ab_fail(AB_ENOMEM, "out of memory");
    if (rc) {
        free(secs);
        return rc;
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < d->n; i++) {
        if (failures_skip(&fl, i)) continue;
        int r = utt_from_audio(d, i, fb, rate, &feats[i], &frames[i], &secs[i]);
        if (r) failures_add(&fl, i, r);
    }
    rc = failures_end(&fl);
    *seconds = 0;
    for (int i = 0; i < d->n; i++) *seconds += secs[i]; /* in order: the same sum on any number of threads */
    free(secs);
    return rc;
}

/* The features of every utterance from feats.scp. */
static int read_from_archives(const kd_dir *d, float **feats, int *frames, int *dim) {
    int *cols = calloc((size_t)d->n, sizeof(int));
    failures fl;
    int rc = cols ? failures_init(&fl, d->n) : ab_fail(AB_ENOMEM, "out of memory");
    if (rc) {
        free(cols);
        return rc;
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < d->n; i++) {
        if (failures_skip(&fl, i)) continue;
        const kd_utt *u = &d->utts[i];
        ka_matrix m;
        int r = ka_read_at(u->feats_path, u->feats_offset, u->id, &m);
        if (r) {
            char msg[900];
            snprintf(msg, sizeof msg, "%s", ab_error());
            failures_add(&fl, i, ab_fail(r, "%s:%d: %s", d->scp_path, u->scp_line, msg));
            continue;
        }
        feats[i] = m.data;
        frames[i] = m.rows;
        cols[i] = m.cols;
    }
    rc = failures_end(&fl);
    for (int i = 1; !rc && i < d->n; i++)
        if (cols[i] != cols[0])
            rc = ab_fail(AB_EINVAL, "%s:%d: utterance '%s' has %d feature columns, '%s' (line %d) has %d", d->scp_path,
                         d->utts[i].scp_line, d->utts[i].id, cols[i], d->utts[0].id, d->utts[0].scp_line, cols[0]);
    *dim = cols[0];
    free(cols);
    return rc;
}

/* ---- CMVN ---- */

/* Kaldi's apply-cmvn: per group (speaker or utterance), x -> (x - mean) / sd, sd
 * from the group's variance floored at 1e-20 (or x - mean without norm_vars); the
 * statistics in double. */
static int apply_cmvn(sd_data *d, bool per_speaker, bool norm_vars) {
    const int G = per_speaker ? d->n_speakers : d->n, D = d->dim;
    double *sum = calloc((size_t)G * D, sizeof(double)), *sq = calloc((size_t)G * D, sizeof(double));
    long long *cnt = calloc((size_t)G, sizeof(long long));
    if (!sum || !sq || !cnt) {
        free(sum);
        free(sq);
        free(cnt);
        return ab_fail(AB_ENOMEM, "out of memory for the CMVN statistics");
    }
    for (int i = 0; i < d->n; i++) {
        const sd_utt *u = &d->utts[i];
        const int g = per_speaker ? u->speaker : i;
        double *s = sum + (size_t)g * D, *q = sq + (size_t)g * D;
        for (int t = 0; t < u->frames; t++) {
            const float *x = u->feats + (size_t)t * D;
            for (int j = 0; j < D; j++) {
                s[j] += x[j];
                q[j] += (double)x[j] * x[j];
            }
        }
        cnt[g] += u->frames;
    }
    /* sum becomes the mean, sq the scale */
    for (int g = 0; g < G; g++)
        for (int j = 0; j < D; j++) {
            const size_t k = (size_t)g * D + j;
            if (!cnt[g]) continue;
            const double mean = sum[k] / cnt[g];
            double var = sq[k] / cnt[g] - mean * mean;
            if (var < 1e-20) var = 1e-20;
            sum[k] = mean;
            sq[k] = norm_vars ? 1.0 / sqrt(var) : 1.0;
        }
#pragma omp parallel for schedule(dynamic, 4)
    for (int i = 0; i < d->n; i++) {
        sd_utt *u = &d->utts[i];
        const size_t g = (size_t)(per_speaker ? u->speaker : i) * D;
        for (int t = 0; t < u->frames; t++) {
            float *x = u->feats + (size_t)t * D;
            for (int j = 0; j < D; j++) x[j] = (float)((x[j] - sum[g + j]) * sq[g + j]);
        }
    }
    free(sum);
    free(sq);
    free(cnt);
    return 0;
}

/* ---- loading ---- */

void sd_data_free(sd_data *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        free(d->utts[i].id);
        ab_free(d->utts[i].feats);
        free(d->utts[i].phones);
    }
    free(d->utts);
    kd_phones_free(&d->phones);
    free(d->phones_from);
    for (int i = 0; i < d->n_speakers; i++) free(d->speakers[i]);
    free(d->speakers);
    memset(d, 0, sizeof *d);
}

int sd_load(const char *dir, const sd_options *o, const kd_phones *inventory, sd_data *out) {
    memset(out, 0, sizeof *out);
    kd_options ko = {o->source, o->lexicon, o->phones, o->drop, inventory};
    kd_dir d;
    int rc = kd_read(dir, &ko, &d);
    if (rc) return rc;
    float **feats = calloc((size_t)d.n, sizeof(float *));
    int *frames = calloc((size_t)d.n, sizeof(int));
    fbank *fb = NULL;
    json_t *key = NULL;
    int dim = 0;
    double seconds = 0;
    if (!feats || !frames) {
        rc = ab_fail(AB_ENOMEM, "out of memory");
        goto done;
    }
    if (d.source == KD_SOURCE_FEATS) {
        rc = read_from_archives(&d, feats, frames, &dim);
        out->features_from = "feats.scp";
    } else {
        if ((rc = fb_create(&o->fbank, &fb))) goto done;
        dim = fb_dim(fb);
        int got = 0;
        if (o->cache) {
            if ((rc = fc_check_prefix(o->cache))) goto done;
            if (!(key = fc_key(&d, &o->fbank))) {
                rc = AB_EINVAL;
                goto done;
            }
            if ((got = fc_load(o->cache, key, &d, dim, feats, frames, &seconds)) < 0) {
                rc = got;
                goto done;
            }
        }
        out->features_from = got ? "cache" : "audio";
        if (!got && !(rc = compute_from_audio(&d, fb, o->fbank.sample_rate, feats, frames, &seconds)) && o->cache) {
            rc = fc_save(o->cache, key, &d, dim, feats, frames, seconds);
            out->cache_written = !rc;
        }
    }
    if (rc) goto done;
    /* the utterances, their names and targets moved out of d */
    if (!(out->utts = calloc((size_t)d.n, sizeof *out->utts))) {
        rc = ab_fail(AB_ENOMEM, "out of memory");
        goto done;
    }
    out->n = d.n;
    out->dim = dim;
    out->seconds = seconds;
    for (int i = 0; i < d.n; i++) {
        sd_utt *u = &out->utts[i];
        u->id = d.utts[i].id;
        u->speaker = d.utts[i].speaker;
        u->n_phones = d.utts[i].n_phones;
        u->phones = d.utts[i].phones;
        u->frames = frames[i];
        u->feats = feats[i];
        d.utts[i].id = NULL;
        d.utts[i].phones = NULL;
        feats[i] = NULL;
        out->frames += u->frames;
        out->phone_tokens += u->n_phones;
    }
    out->phones = d.phones;
    memset(&d.phones, 0, sizeof d.phones);
    out->phones_from = d.phones_from;
    d.phones_from = NULL;
    out->n_speakers = d.n_speakers;
    out->speakers = d.speakers;
    d.speakers = NULL;
    d.n_speakers = 0;
    if (o->cmvn != SD_CMVN_NONE) rc = apply_cmvn(out, o->cmvn == SD_CMVN_SPEAKER, o->norm_vars);
done:
    if (feats)
        for (int i = 0; i < d.n; i++) ab_free(feats[i]);
    free(feats);
    free(frames);
    fb_destroy(fb);
    if (key) json_decref(key);
    kd_dir_free(&d);
    if (rc) sd_data_free(out);
    return rc;
}

int sd_feature_stats(const sd_data *d, double *mean, double *std, double *all_mean, double *all_std) {
    const int D = d->dim;
    double *s = calloc((size_t)D, sizeof(double)), *q = calloc((size_t)D, sizeof(double));
    if (!s || !q) {
        free(s);
        free(q);
        return ab_fail(AB_ENOMEM, "out of memory");
    }
    for (int i = 0; i < d->n; i++)
        for (int t = 0; t < d->utts[i].frames; t++) {
            const float *x = d->utts[i].feats + (size_t)t * D;
            for (int j = 0; j < D; j++) {
                s[j] += x[j];
                q[j] += (double)x[j] * x[j];
            }
        }
    double S = 0, Q = 0, n = (double)d->frames;
    for (int j = 0; j < D; j++) {
        S += s[j];
        Q += q[j];
        double m = n > 0 ? s[j] / n : 0, v = n > 0 ? q[j] / n - m * m : 0;
        if (mean) mean[j] = m;
        if (std) std[j] = sqrt(v > 0 ? v : 0);
    }
    double m = n > 0 ? S / (n * D) : 0, v = n > 0 ? Q / (n * D) - m * m : 0;
    if (all_mean) *all_mean = m;
    if (all_std) *all_std = sqrt(v > 0 ? v : 0);
    free(s);
    free(q);
    return 0;
}
