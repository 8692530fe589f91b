/* A sweep's points and the merge of their documents (sweep_points.h). */
#include "sweep_points.h"

#include "error.h"
#include "fileio.h"
#include "results.h"
#include "sweep_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sweep_points_list(const sweep_config *c, sweep_point **out, int *n) {
    *out = NULL;
    *n = 0;
    size_t cap = (size_t)c->n_variants * (size_t)(c->n_lengths + c->n_contexts) + 1;
    sweep_point *p = calloc(cap, sizeof *p);
    if (!p) return ab_fail(AB_ENOMEM, "out of memory");
    int k = 0;
    for (int v = 0; v < c->n_variants; v++) {
        const sweep_variant *sv = &c->variants[v];
        for (int i = 0; sv->parallel && i < c->n_lengths; i++, k++)
            p[k] = (sweep_point){k, false, v, i, c->lengths[i]};
        for (int i = 0; sv->recurrent && sv->has_step && i < c->n_contexts; i++, k++)
            p[k] = (sweep_point){k, true, v, i, c->contexts[i]};
    }
    *out = p;
    *n = k;
    return 0;
}

json_t *sweep_point_json(const sweep_config *c, const sweep_point *p) {
    json_t *j = json_object();
    json_object_set_new(j, "index", json_integer(p->index));
    json_object_set_new(j, "kind", json_string(p->recurrent ? "recurrent" : "parallel"));
    json_object_set_new(j, "variant", json_string(c->variants[p->variant].label));
    json_object_set_new(j, p->recurrent ? "context" : "len", json_integer(p->len));
    return j;
}

json_t *sweep_points_marker(const sweep_config *c, const sweep_point *pts, int n, int index) {
    json_t *m = json_object();
    json_object_set_new(m, "count", json_integer(n));
    json_t *held = json_array(), *list = json_array();
    json_array_append_new(held, json_integer(index));
    json_array_append_new(list, sweep_point_json(c, &pts[index]));
    json_object_set_new(m, "held", held);
    json_object_set_new(m, "list", list);
    return m;
}

int sweep_point_path(const char *run_out, int index, char *buf, size_t cap) {
    size_t n = strlen(run_out);
    if (n > 5 && strcmp(run_out + n - 5, ".json") == 0) n -= 5;
    int w = snprintf(buf, cap, "%.*s.point-%d.json", (int)n, run_out, index);
    if (w < 0 || (size_t)w >= cap) return ab_fail(AB_EINVAL, "bench: --out %s: the path is too long", run_out);
    return 0;
}

/* The document at path, or NULL with a one-line message (AB_EINVAL in *rc: missing,
 * not a regular file, not complete JSON; AB_EIO: unreadable). */
static json_t *load_doc(const char *path, int *rc) {
    FILE *f = ab_fopen_regular(path, "point document", rc);
    if (!f) return NULL;
    json_error_t je;
    json_t *doc = json_loadf(f, JSON_REJECT_DUPLICATES, &je);
    fclose(f);
    if (!doc) {
        *rc = ab_fail(AB_EINVAL, "merge: %s: not a complete JSON document (line %d: %s); run its point again", path,
                      je.line, je.text);
        return NULL;
    }
    return doc;
}

/* The value a record has for its point: "len" or "context". */
static json_t *point_len(const json_t *p, bool recurrent) { return json_object_get(p, recurrent ? "context" : "len"); }

/* Whether point entry p (sweep_point_json) describes record r. */
static bool record_is_point(const json_t *r, const json_t *p) {
    const char *pk = json_string_value(json_object_get(p, "kind"));
    const char *rk = json_string_value(json_object_get(r, "kind"));
    const char *pv = json_string_value(json_object_get(p, "variant"));
    const char *rv = json_string_value(json_object_get(r, "variant"));
    if (!pk || !rk || !pv || !rv || strcmp(pk, rk) || strcmp(pv, rv)) return false;
    const bool rec = strcmp(pk, "recurrent") == 0;
    json_t *a = point_len(p, rec), *b = point_len(r, rec);
    return json_is_integer(a) && json_is_integer(b) && json_integer_value(a) == json_integer_value(b);
}

/* Checks the shape of a point document: 0, or AB_EINVAL with a message naming path. */
static int check_point_doc(const char *path, const json_t *doc) {
    const char *schema = json_string_value(json_object_get(doc, "schema"));
    if (!json_is_object(doc) || !schema || strcmp(schema, "attnbench/run/1") != 0)
        return ab_fail(AB_EINVAL, "merge: %s: not an attnbench run document (no schema attnbench/run/1)", path);
    json_t *pts = json_object_get(doc, "points");
    if (!json_is_object(pts))
        return ab_fail(AB_EINVAL, "merge: %s: not a point document of a sharded sweep (attnbench bench --point I "
                                  "writes them)", path);
    json_t *count = json_object_get(pts, "count"), *held = json_object_get(pts, "held");
    json_t *list = json_object_get(pts, "list"), *records = json_object_get(doc, "records");
    if (!json_is_integer(count) || json_integer_value(count) < 1 || json_integer_value(count) > 1000000 ||
        !json_is_array(held) || !json_is_array(list) || json_array_size(held) != json_array_size(list) ||
        json_array_size(held) == 0 || !json_is_object(json_object_get(doc, "config")) || !json_is_array(records))
        return ab_fail(AB_EINVAL, "merge: %s: a damaged point document (its \"points\", \"config\" or \"records\")",
                       path);
    const char *status = json_string_value(json_object_get(doc, "status"));
    if (!status || (strcmp(status, "ok") != 0 && strcmp(status, "failed") != 0))
        return ab_fail(AB_EINVAL, "merge: %s: not finished (status %s); run its point again", path,
                       status ? status : "missing");
    if (json_array_size(records) != json_array_size(held))
        return ab_fail(AB_EINVAL, "merge: %s: %zu records for %zu points", path, json_array_size(records),
                       json_array_size(held));
    size_t i;
    json_t *h;
    json_array_foreach(held, i, h) {
        json_t *p = json_array_get(list, i);
        if (!json_is_integer(h) || json_integer_value(h) < 0 || json_integer_value(h) >= json_integer_value(count) ||
            !json_equal(json_object_get(p, "index"), h))
            return ab_fail(AB_EINVAL, "merge: %s: points.held.%zu is not a point of this sweep", path, i);
        if (!record_is_point(json_array_get(records, i), p))
            return ab_fail(AB_EINVAL, "merge: %s: records.%zu is not its point %lld", path, i,
                           (long long)json_integer_value(h));
    }
    return 0;
}

json_t *sweep_machine_class(const json_t *doc) {
    json_t *m = json_object_get(doc, "machine"), *c = json_object();
    static const char *const keys[] = {"cpu", "threads", "blas_core"};
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(m, keys[i]);
        json_object_set_new(c, keys[i], v ? json_deep_copy(v) : json_null());
    }
    json_t *g = json_object_get(json_object_get(m, "gpu"), "name");
    json_object_set_new(c, "gpu", g ? json_deep_copy(g) : json_null());
    return c;
}

/* The first key whose values differ between two objects ("" when none does). */
static const char *first_difference(const json_t *a, const json_t *b) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)a, k, v) if (!json_equal(v, json_object_get(b, k))) return k;
    json_object_foreach((json_t *)b, k, v) if (!json_object_get(a, k)) return k;
    return "";
}

bool sweep_point_done(const char *path, const json_t *config, int index, int count) {
    int rc;
    FILE *f = ab_fopen_regular(path, "point document", &rc);
    if (!f) {
        ab_clear_error();
        return false;
    }
    json_t *doc = json_loadf(f, JSON_REJECT_DUPLICATES, NULL);
    fclose(f);
    bool done = doc && check_point_doc(path, doc) == 0;
    ab_clear_error();
    if (done) {
        json_t *pts = json_object_get(doc, "points");
        done = strcmp(json_string_value(json_object_get(doc, "status")), "ok") == 0 &&
               json_equal(json_object_get(doc, "config"), config) &&
               json_integer_value(json_object_get(pts, "count")) == count &&
               json_array_size(json_object_get(pts, "held")) == 1 &&
               json_integer_value(json_array_get(json_object_get(pts, "held"), 0)) == index;
    }
    json_decref(doc);
    return done;
}

/* A record as a full run records a point after its variant ran out of time or memory. */
static json_t *skipped_like_full_run(const json_t *r) {
    static const char *const keep[] = {"kind", "variant", "variant_name", "options", "len", "batch", "heads",
                                       "qk_dim", "v_dim", "causal", "context", NULL};
    const bool rec = strcmp(json_string_value(json_object_get(r, "kind")), "recurrent") == 0;
    json_t *s = json_object();
    for (int i = 0; keep[i]; i++) {
        json_t *v = json_object_get(r, keep[i]);
        if (v) json_object_set_new(s, keep[i], json_deep_copy(v));
    }
    json_object_set_new(s, "status", json_string("skipped"));
    json_object_set_new(s, "reason", json_string(rec ? "ran out of time or memory at a shorter context"
                                                     : "ran out of time or memory at a smaller length"));
    if (!rec) sweep_null_timings(s);
    json_object_set_new(s, "point_status", json_deep_copy(json_object_get(r, "status")));
    return s;
}

typedef struct {
    const json_t *doc;
    double rate;
} rated;

static int cmp_rated(const void *a, const void *b) {
    double x = ((const rated *)a)->rate, y = ((const rated *)b)->rate;
    if (isnan(x) || isnan(y)) return isnan(x) - isnan(y); /* unmeasured last */
    return (x > y) - (x < y);
}

/* docs[] (n, in the order of their lowest point) sorted by key.rate_key: the
 * median one's `key` object, a copy. rates: every document's rate, in order. */
static json_t *median_measurement(json_t *const *docs, int n, const char *key, const char *rate_key,
                                  json_t *rates) {
    rated *r = calloc((size_t)n, sizeof *r);
    if (!r) return NULL;
    int m = 0;
    for (int i = 0; i < n; i++) {
        json_t *v = json_object_get(json_object_get(docs[i], key), rate_key);
        json_array_append_new(rates, v && json_is_number(v) ? json_real(json_number_value(v)) : json_null());
        r[i] = (rated){docs[i], json_is_number(v) ? json_number_value(v) : NAN};
        if (!isnan(r[i].rate)) m++;
    }
    qsort(r, (size_t)n, sizeof *r, cmp_rated);
    json_t *obj = json_object_get(r[m > 0 ? (m - 1) / 2 : 0].doc, key);
    free(r);
    return obj ? json_deep_copy(obj) : json_null();
}

/* The checks across documents and the slots of the points; 0 or AB_EINVAL. */
static int collect(const sweep_merge_request *req, json_t **docs, int *owner, json_t **slots, int count) {
    const json_t *first = docs[0];
    json_t *class0 = sweep_machine_class(first);
    int rc = 0;
    for (int d = 0; d < req->n_docs && !rc; d++) {
        const json_t *doc = docs[d];
        json_t *pts = json_object_get(doc, "points");
        if (json_integer_value(json_object_get(pts, "count")) != count) {
            rc = ab_fail(AB_EINVAL, "merge: %s: a sweep of %lld points, %s's has %d: another config", req->docs[d],
                         (long long)json_integer_value(json_object_get(pts, "count")), req->docs[0], count);
            break;
        }
        json_t *cfg0 = json_object_get(first, "config"), *cfg = json_object_get(doc, "config");
        if (!json_equal(cfg0, cfg)) {
            rc = ab_fail(AB_EINVAL, "merge: %s: another config than %s's (key '%s' differs)", req->docs[d],
                         req->docs[0], first_difference(cfg0, cfg));
            break;
        }
        json_t *cls = sweep_machine_class(doc);
        if (!json_equal(class0, cls))
            rc = ab_fail(AB_EINVAL, "merge: %s: another machine class than %s's (machine '%s' differs)",
                         req->docs[d], req->docs[0], first_difference(class0, cls));
        json_decref(cls);
        if (rc) break;
        json_t *git0 = json_object_get(json_object_get(first, "git"), "commit");
        json_t *git = json_object_get(json_object_get(doc, "git"), "commit");
        if (json_is_string(git0) && json_is_string(git) && !json_equal(git0, git)) {
            rc = ab_fail(AB_EINVAL, "merge: %s: measured by another build than %s's (git commit %.12s, not %.12s)",
                         req->docs[d], req->docs[0], json_string_value(git), json_string_value(git0));
            break;
        }
        size_t i;
        json_t *h;
        json_array_foreach(json_object_get(pts, "held"), i, h) {
            int k = (int)json_integer_value(h);
            if (slots[k]) {
                rc = ab_fail(AB_EINVAL, "merge: point %d twice (%s and %s)", k, req->docs[owner[k]], req->docs[d]);
                break;
            }
            slots[k] = json_array_get(json_object_get(doc, "records"), i);
            owner[k] = d;
        }
    }
    json_decref(class0);
    if (rc) return rc;
    char list[512] = "";
    int missing = 0;
    size_t used = 0;
    for (int k = 0; k < count; k++) {
        if (slots[k]) continue;
        if (missing++ < 32 && used < sizeof list - 16)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", missing > 1 ? ", " : "", k);
    }
    if (missing)
        return ab_fail(AB_EINVAL, "merge: %d of %d points missing: %s%s (attnbench bench CONFIG --point I writes "
                                  "them)", missing, count, list, missing > 32 ? ", ..." : "");
    return 0;
}

/* The merged records, in point order, with a full run's skips. */
static json_t *merged_records(json_t **slots, int count, bool *failed) {
    json_t *out = json_array(), *stopped = json_object(); /* "kind/variant" -> true */
    for (int k = 0; k < count; k++) {
        const json_t *r = slots[k];
        char key[160];
        snprintf(key, sizeof key, "%s/%s", json_string_value(json_object_get(r, "kind")),
                 json_string_value(json_object_get(r, "variant")));
        const char *st = json_string_value(json_object_get(r, "status"));
        st = st ? st : "";
        if (json_object_get(stopped, key) && strcmp(st, "skipped") != 0) {
            json_array_append_new(out, skipped_like_full_run(r));
            continue;
        }
        if (strcmp(st, "oom") == 0 || strcmp(st, "timeout") == 0 || strcmp(st, "failed") == 0)
            json_object_set_new(stopped, key, json_true());
        if (strcmp(st, "failed") == 0) *failed = true;
        json_array_append_new(out, json_deep_copy(r));
    }
    json_decref(stopped);
    return out;
}

int sweep_merge(const sweep_merge_request *req, bool *failed) {
    *failed = false;
    if (req->n_docs < 1) return ab_fail(AB_EINVAL, "merge: no point documents given");
    if (!req->out_path) return ab_fail(AB_EINVAL, "merge: --out FILE is required");
    json_t **docs = calloc((size_t)req->n_docs, sizeof *docs);
    if (!docs) return ab_fail(AB_ENOMEM, "out of memory");
    int rc = 0, count = 0;
    for (int d = 0; d < req->n_docs && !rc; d++) {
        docs[d] = load_doc(req->docs[d], &rc);
        if (!rc) rc = check_point_doc(req->docs[d], docs[d]);
    }
    if (!rc) count = (int)json_integer_value(json_object_get(json_object_get(docs[0], "points"), "count"));
    json_t **slots = rc ? NULL : calloc((size_t)count, sizeof *slots);
    int *owner = rc ? NULL : calloc((size_t)count, sizeof *owner);
    if (!rc && (!slots || !owner)) rc = ab_fail(AB_ENOMEM, "out of memory");
    if (!rc) rc = collect(req, docs, owner, slots, count);
    if (!rc) {
        /* the documents in the order of their first point: the first one's machine,
         * git, seed and start */
        json_t **ordered = calloc((size_t)req->n_docs, sizeof *ordered);
        int n = 0;
        for (int k = 0; k < count && ordered; k++) {
            bool seen = false;
            for (int j = 0; j < n; j++) seen |= ordered[j] == docs[owner[k]];
            if (!seen) ordered[n++] = docs[owner[k]];
        }
        if (!ordered) rc = ab_fail(AB_ENOMEM, "out of memory");
        const json_t *head = ordered ? ordered[0] : NULL;
        ab_run *run = NULL;
        if (!rc) {
            run = ab_run_begin(req->out_path, req->command_line, json_object_get(head, "config"),
                               (uint64_t)json_integer_value(json_object_get(head, "seed")), sweep_tsv_columns);
            if (!run) rc = ab_fail(AB_EIO, "merge: %s", ab_error());
        }
        if (!rc) {
            const char *earliest = NULL;
            for (int j = 0; j < n; j++) {
                const char *s = json_string_value(json_object_get(ordered[j], "started"));
                if (s && (!earliest || strcmp(s, earliest) < 0)) earliest = s;
            }
            ab_run_set(run, "machine", json_deep_copy(json_object_get(head, "machine")));
            ab_run_set(run, "git", json_deep_copy(json_object_get(head, "git")));
            if (earliest) ab_run_set(run, "started", json_string(earliest));
            json_t *gflops = json_array(), *gbps = json_array();
            ab_run_set(run, "sgemm", median_measurement(ordered, n, "sgemm", "gflops", gflops));
            ab_run_set(run, "copy", median_measurement(ordered, n, "copy", "gbps", gbps));
            json_t *records = merged_records(slots, count, failed);
            json_array_extend(ab_run_records(run), records);
            json_decref(records);
            for (int d = 0; d < req->n_docs; d++)
                if (strcmp(json_string_value(json_object_get(docs[d], "status")), "failed") == 0) *failed = true;
            ab_run_set(run, "summary", sweep_growth_summary(ab_run_records(run)));
            json_t *m = json_object(), *held = json_array(), *list = json_array(), *from = json_array();
            for (int k = 0; k < count; k++) {
                json_array_append_new(held, json_integer(k));
                json_t *pts = json_object_get(docs[owner[k]], "points");
                size_t i;
                json_t *h;
                json_array_foreach(json_object_get(pts, "held"), i, h) if (json_integer_value(h) == k)
                    json_array_append_new(list, json_deep_copy(json_array_get(json_object_get(pts, "list"), i)));
            }
            for (int d = 0; d < req->n_docs; d++) json_array_append_new(from, json_string(req->docs[d]));
            json_object_set_new(m, "count", json_integer(count));
            json_object_set_new(m, "held", held);
            json_object_set_new(m, "list", list);
            json_object_set_new(m, "merged_from", from);
            json_object_set_new(m, "sgemm_gflops", gflops);
            json_object_set_new(m, "copy_gbps", gbps);
            ab_run_set(run, "points", m);
            rc = ab_run_finish(run, *failed ? "failed" : "ok");
        }
        free(ordered);
    }
    free(slots);
    free(owner);
    for (int d = 0; d < req->n_docs; d++) json_decref(docs[d]);
    free(docs);
    return rc;
}
