#include "config.h"

#include "error.h"
#include "fileio.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_t *ab_config_load(const char *path) {
    int rc;
    FILE *f = ab_fopen_regular(path, "config", &rc); /* a FIFO is refused, not waited on */
    if (!f) return NULL;
    json_error_t err;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &err);
    fclose(f);
    if (!root) {
        if (err.line <= 0) ab_fail(AB_EINVAL, "cannot read config %s: %s", path, err.text);
        else ab_fail(AB_EINVAL, "config %s:%d:%d: %s", path, err.line, err.column, err.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        ab_fail(AB_EINVAL, "config %s: the top level must be a JSON object", path);
        return NULL;
    }
    return root;
}

static bool is_index(const char *s, size_t *idx) {
    if (!*s) return false;
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*end) return false;
    *idx = v;
    return true;
}

int ab_config_set(json_t *root, const char *assignment, bool allow_new) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) return ab_fail(AB_EINVAL, "--set %s: expected KEY=VALUE", assignment);
    /* Every dotted segment must be a key: ".", "..", ".a" or "a..b" name nothing, and
     * strtok_r below would skip the empty segments (".=1" was silently ignored). */
    const int klen = (int)(eq - assignment);
    char *path = strndup(assignment, (size_t)klen);
    if (!path) return ab_fail(AB_ENOMEM, "out of memory");
    if (path[0] == '.' || path[klen - 1] == '.' || strstr(path, "..")) {
        free(path);
        return ab_fail(AB_EINVAL, "--set %.*s: empty key in the dotted path (KEY=VALUE, KEY like a.b.c)", klen,
                       assignment);
    }
    /* JSON keys and strings are UTF-8: jansson refuses anything else, so a key or
     * plain-text value that is not would otherwise be dropped silently (or, for a new
     * object on the way, freed and then used). json_stringn is its check. */
    json_t *utf8 = json_stringn(path, (size_t)klen);
    if (!utf8) {
        free(path);
        return ab_fail(AB_EINVAL, "--set %.*s: the key is not valid UTF-8", klen, assignment);
    }
    json_decref(utf8);
    const char *text = eq + 1;
    json_error_t err;
    json_t *val = json_loads(text, JSON_DECODE_ANY, &err);
    if (!val) val = json_string(text);
    if (!val) {
        free(path);
        return ab_fail(AB_EINVAL, "--set %.*s: the value is neither JSON nor UTF-8 text", klen, assignment);
    }
    int rc = 0;
    json_t *cur = root;
    char *save = NULL;
    char *tok = strtok_r(path, ".", &save);
    while (tok) {
        char *next = strtok_r(NULL, ".", &save);
        size_t idx;
        if (json_is_object(cur)) {
            json_t *child = json_object_get(cur, tok);
            if (!next) {
                if (!child && !allow_new) {
                    rc = ab_fail(AB_EINVAL, "--set %.*s: the config has no key '%s'", (int)(eq - assignment),
                                 assignment, tok);
                    break;
                }
                if (json_object_set(cur, tok, val)) rc = ab_fail(AB_ENOMEM, "out of memory");
                break;
            }
            if (!child) {
                if (!allow_new) {
                    rc = ab_fail(AB_EINVAL, "--set %.*s: the config has no key '%s'", (int)(eq - assignment),
                                 assignment, tok);
                    break;
                }
                child = json_object();
                if (json_object_set_new(cur, tok, child)) { /* frees child */
                    rc = ab_fail(AB_ENOMEM, "out of memory");
                    break;
                }
            }
            cur = child;
        } else if (json_is_array(cur) && is_index(tok, &idx)) {
            if (idx >= json_array_size(cur)) {
                rc = ab_fail(AB_EINVAL, "--set %.*s: index %zu is past the end (%zu elements)", (int)(eq - assignment),
                             assignment, idx, json_array_size(cur));
                break;
            }
            if (!next) {
                if (json_array_set(cur, idx, val)) rc = ab_fail(AB_ENOMEM, "out of memory");
                break;
            }
            cur = json_array_get(cur, idx);
        } else {
            rc = ab_fail(AB_EINVAL, "--set %.*s: '%s' is not inside an object or list", (int)(eq - assignment),
                         assignment, tok);
            break;
        }
        tok = next;
    }
    json_decref(val);
    free(path);
    return rc;
}

int ab_config_only_keys(const json_t *obj, const char *where, const char *const *allowed) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        bool ok = false;
        for (int i = 0; allowed[i]; i++)
            if (strcmp(allowed[i], key) == 0) ok = true;
        if (!ok) {
            char list[512];
            size_t n = 0;
            for (int i = 0; allowed[i] && n < sizeof list; i++)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", allowed[i]);
            return ab_fail(AB_EINVAL, "config: unknown key '%s%s%s' (allowed here: %s)", where, *where ? "." : "", key,
                           list);
        }
    }
    return 0;
}

static json_t *get(const json_t *obj, const char *where, const char *key, bool required, int *rc) {
    json_t *v = json_object_get(obj, key);
    *rc = 0;
    if (!v && required)
        *rc = ab_fail(AB_EINVAL, "config: missing key '%s%s%s'", where, *where ? "." : "", key);
    return v;
}

int ab_config_int(const json_t *obj, const char *where, const char *key, bool required, long long def, long long min,
                  long long max, long long *out) {
    int rc;
    json_t *v = get(obj, where, key, required, &rc);
    if (rc) return rc;
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return ab_fail(AB_EINVAL, "config: '%s%s%s' must be an integer", where, *where ? "." : "", key);
    long long x = json_integer_value(v);
    if (x < min || x > max)
        return ab_fail(AB_EINVAL, "config: '%s%s%s' = %lld is outside [%lld, %lld]", where, *where ? "." : "", key, x,
                       min, max);
    *out = x;
    return 0;
}

int ab_config_num(const json_t *obj, const char *where, const char *key, bool required, double def, double min,
                  double max, double *out) {
    int rc;
    json_t *v = get(obj, where, key, required, &rc);
    if (rc) return rc;
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return ab_fail(AB_EINVAL, "config: '%s%s%s' must be a number", where, *where ? "." : "", key);
    double x = json_number_value(v);
    if (!(x >= min && x <= max))
        return ab_fail(AB_EINVAL, "config: '%s%s%s' = %g is outside [%g, %g]", where, *where ? "." : "", key, x, min,
                       max);
    *out = x;
    return 0;
}

int ab_config_bool(const json_t *obj, const char *where, const char *key, bool required, bool def, bool *out) {
    int rc;
    json_t *v = get(obj, where, key, required, &rc);
    if (rc) return rc;
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return ab_fail(AB_EINVAL, "config: '%s%s%s' must be true or false", where, *where ? "." : "", key);
    *out = json_is_true(v);
    return 0;
}

int ab_config_str(const json_t *obj, const char *where, const char *key, bool required, const char *def,
                  const char **out) {
    int rc;
    json_t *v = get(obj, where, key, required, &rc);
    if (rc) return rc;
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_string(v))
        return ab_fail(AB_EINVAL, "config: '%s%s%s' must be a string", where, *where ? "." : "", key);
    *out = json_string_value(v);
    return 0;
}

static bool has_control(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) return true;
    return false;
}

int ab_config_file_name(const json_t *obj, const char *where, const char *key, bool required, const char *def,
                        const char **out) {
    int rc = ab_config_str(obj, where, key, required, def, out);
    if (rc) return rc;
    const char *s = *out;
    if (!s) return 0;
    if (!*s || strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0 || has_control(s)) {
        return ab_fail(AB_EINVAL,
                       "config: '%s%s%s' = '%s' must be a non-empty file name (no '/', not '.' or '..', no control "
                       "characters)",
                       where, *where ? "." : "", key, s);
    }
    return 0;
}

int ab_config_label(const json_t *obj, const char *where, const char *key, bool required, const char *def,
                    const char **out) {
    int rc = ab_config_str(obj, where, key, required, def, out);
    if (rc) return rc;
    if (*out && has_control(*out))
        return ab_fail(AB_EINVAL, "config: '%s%s%s' must not hold control characters (newlines, tabs, ...)", where,
                       *where ? "." : "", key);
    return 0;
}
