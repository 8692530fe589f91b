/* A JSON summary of a loaded Kaldi data directory (speech_data.h), what `attnbench
 * features` prints so a user can check a directory before training on it: schema
 * "attnbench/features/1", with utterances, speakers, frames, audio duration, the phone
 * inventory and counts, the features' mean and standard deviation (overall and per
 * dimension), the options and the time the loading took. */
#ifndef AB_SPEECH_SUMMARY_H
#define AB_SPEECH_SUMMARY_H

#include "speech_data.h"

#include <jansson.h>

/* The summary of `d`, loaded from `dir` with options `o` (cache: the cache's prefix
 * given, or NULL) in `secs` seconds. NULL with AB_ENOMEM's message when out of memory. */
json_t *sd_summary_json(const sd_data *d, const sd_options *o, const char *dir, const char *cache, double secs);

#endif
