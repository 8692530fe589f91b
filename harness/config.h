/* JSON configs: loading, dotted-path overrides (--set a.b=VALUE) and validation that
 * names the offending key. */
#ifndef AB_CONFIG_H
#define AB_CONFIG_H

#include <jansson.h>
#include <stdbool.h>

/* Loads a JSON object from PATH. NULL with a message naming the file, line and column. */
json_t *ab_config_load(const char *path);

/* Applies "a.b.c=VALUE": VALUE is parsed as JSON when it is valid JSON (numbers,
 * true/false, [lists], {objects}, "strings"), else taken as a plain string. The path
 * must exist in the config unless `allow_new` (so a misspelt key is an error). Array
 * elements are addressed by index ("variants.0.name"). Keys, and a VALUE taken as text,
 * must be UTF-8 (as JSON's are). 0, AB_EINVAL or AB_ENOMEM. */
int ab_config_set(json_t *root, const char *assignment, bool allow_new);

/* Checks that object `obj` (at dotted location `where`, "" for the root) has only the
 * keys in the NULL-terminated list `allowed`. 0 or AB_EINVAL naming the unknown key. */
int ab_config_only_keys(const json_t *obj, const char *where, const char *const *allowed);

/* Typed getters with defaults; each fails (AB_EINVAL, message naming where.key and what
 * was expected) on a value of the wrong type or outside [min, max]. A missing key gives
 * the default when `required` is false. */
int ab_config_int(const json_t *obj, const char *where, const char *key, bool required, long long def, long long min,
                  long long max, long long *out);
int ab_config_num(const json_t *obj, const char *where, const char *key, bool required, double def, double min,
                  double max, double *out);
int ab_config_bool(const json_t *obj, const char *where, const char *key, bool required, bool def, bool *out);
int ab_config_str(const json_t *obj, const char *where, const char *key, bool required, const char *def,
                  const char **out);
/* A string that becomes part of a file name (a run's "name": results/NAME...):
 * non-empty, no '/', not "." or "..", no control characters. */
int ab_config_file_name(const json_t *obj, const char *where, const char *key, bool required, const char *def,
                        const char **out);
/* A string shown in tables, legends and messages (a "label"): no control characters
 * (a newline would split a TSV row or a one-line message). */
int ab_config_label(const json_t *obj, const char *where, const char *key, bool required, const char *def,
                    const char **out);

#endif
