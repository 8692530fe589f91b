/* The summary of a loaded data directory (speech_summary.h). */
#include "speech_summary.h"

#include "error.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static json_t *doubles(const double *x, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(x[i]));
    return a;
}

json_t *sd_summary_json(const sd_data *d, const sd_options *o, const char *dir, const char *cache, double secs) {
    double *mean = malloc(sizeof(double) * (size_t)d->dim), *sd = malloc(sizeof(double) * (size_t)d->dim);
    double all_mean = 0, all_std = 0;
    if (!mean || !sd || sd_feature_stats(d, mean, sd, &all_mean, &all_std)) {
        free(mean);
        free(sd);
        ab_fail(AB_ENOMEM, "out of memory for the feature statistics");
        return NULL;
    }
    int min_t = d->utts[0].frames, max_t = d->utts[0].frames, empty = 0, short_targets = 0;
    for (int i = 0; i < d->n; i++) {
        const sd_utt *u = &d->utts[i];
        if (u->frames < min_t) min_t = u->frames;
        if (u->frames > max_t) max_t = u->frames;
        empty += u->n_phones == 0;
        short_targets += u->n_phones > u->frames;
    }
    json_t *inv = json_array();
    for (int i = 0; i < d->phones.count; i++) json_array_append_new(inv, json_string(d->phones.names[i]));
    json_t *doc = json_object();
    json_object_set_new(doc, "schema", json_string("attnbench/features/1"));
    json_object_set_new(doc, "data_dir", json_string(dir));
    json_object_set_new(doc, "features_from", json_string(d->features_from));
    /* features from feats.scp are read as they are: no cache */
    const bool cached = cache && strcmp(d->features_from, "feats.scp") != 0;
    json_object_set_new(doc, "cache", cached ? json_string(cache) : json_null());
    json_object_set_new(doc, "cache_written", json_boolean(d->cache_written));
    json_object_set_new(doc, "utterances", json_integer(d->n));
    json_object_set_new(doc, "speakers", json_integer(d->n_speakers));
    json_object_set_new(doc, "frames", json_integer(d->frames));
    json_object_set_new(doc, "frames_per_utterance",
                        json_pack("{s:i, s:f, s:i}", "min", min_t, "mean", (double)d->frames / d->n, "max", max_t));
    json_object_set_new(doc, "seconds", d->seconds > 0 ? json_real(d->seconds) : json_null());
    json_object_set_new(doc, "hours", d->seconds > 0 ? json_real(d->seconds / 3600) : json_null());
    json_object_set_new(doc, "dim", json_integer(d->dim));
    json_object_set_new(doc, "phones", json_integer(d->phones.count));
    json_object_set_new(doc, "phones_from", json_string(d->phones_from));
    json_object_set_new(doc, "inventory", inv);
    json_object_set_new(doc, "phone_tokens", json_integer(d->phone_tokens));
    json_object_set_new(doc, "empty_targets", json_integer(empty));
    json_object_set_new(doc, "targets_longer_than_frames", json_integer(short_targets));
    json_object_set_new(doc, "feature_mean", json_real(all_mean));
    json_object_set_new(doc, "feature_std", json_real(all_std));
    json_object_set_new(doc, "per_dim", json_pack("{s:o, s:o}", "mean", doubles(mean, d->dim), "std", doubles(sd, d->dim)));
    json_object_set_new(doc, "options", sd_options_to_json(o));
    json_object_set_new(doc, "time_s", json_real(secs));
    free(mean);
    free(sd);
    return doc;
}
