/* harness/config.c: a JSON config file, then `--set KEY=VALUE` assignments on it, then
 * the typed getters on every key it ends up with. The input is the file's bytes, then
 * (after the first NUL byte) the assignments, separated by NUL bytes. */
#include "config.h"
#include "error.h"
#include "fuzz_util.h"

#include <stdlib.h>
#include <string.h>

static void check(int rc, const char *what) {
    if (rc) fuzz_refused(rc, what);
}

/* Every getter on obj.key: each returns 0 or refuses with a message. */
static void getters(const json_t *obj, const char *key) {
    long long i;
    double d;
    bool b;
    const char *s;
    check(ab_config_int(obj, "root", key, false, 0, -1000, 1000, &i), "ab_config_int");
    check(ab_config_num(obj, "root", key, true, 0, -1e300, 1e300, &d), "ab_config_num");
    check(ab_config_bool(obj, "root", key, false, false, &b), "ab_config_bool");
    check(ab_config_str(obj, "root", key, true, NULL, &s), "ab_config_str");
    if (ab_config_file_name(obj, "root", key, true, NULL, &s) == 0 &&
        (!*s || strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0))
        fuzz_fail("ab_config_file_name", "accepted '%s' as a file name", s);
    if (ab_config_label(obj, "root", key, true, NULL, &s) == 0)
        for (const unsigned char *p = (const unsigned char *)s; *p; p++)
            if (*p < 0x20 || *p == 0x7f) fuzz_fail("ab_config_label", "accepted a control character");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t file_bytes = nul ? (size_t)(nul - data) : size;
    json_t *root = ab_config_load(fuzz_file("config.json", data, file_bytes));
    if (!root) {
        fuzz_refused(AB_EINVAL, "ab_config_load");
        return 0;
    }
    /* the assignments: a NUL-terminated copy of what follows the file */
    size_t rest = nul ? size - file_bytes - 1 : 0;
    char *sets = malloc(rest + 1);
    if (!sets) abort();
    if (rest) memcpy(sets, nul + 1, rest);
    sets[rest] = '\0';
    int n = 0;
    for (char *a = sets; a < sets + rest; a += strlen(a) + 1, n++)
        check(ab_config_set(root, a, n % 2 == 1), "ab_config_set");
    free(sets);

    static const char *const allowed[] = {"name", "steps", "model", NULL};
    check(ab_config_only_keys(root, "", allowed), "ab_config_only_keys");
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        getters(root, key);
        if (json_is_object(v)) {
            const char *k2;
            json_t *v2;
            json_object_foreach(v, k2, v2) getters(v, k2);
        }
    }
    json_decref(root);
    return 0;
}
