/* A Kaldi data directory's text files (kaldi_dir.h). */
#include "kaldi_dir.h"

#include "error.h"
#include "fileio.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char WS[] = " \t\r\v\f";

/* ---- a map from strings (owned elsewhere) to ints ---- */

typedef struct {
    const char **keys;
    int *vals;
    size_t cap, n;
} smap;

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int smap_get(const smap *m, const char *key) {
    if (!m->cap) return -1;
    for (size_t i = hash_str(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->keys[i]) return -1;
        if (strcmp(m->keys[i], key) == 0) return m->vals[i];
    }
}

/* Inserts key -> val: 0, or 1 when the key is there already (its value unchanged), or
 * AB_ENOMEM. */
static int smap_put(smap *m, const char *key, int val) {
    if (2 * (m->n + 1) > m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 64;
        const char **k = calloc(cap, sizeof *k);
        int *v = malloc(cap * sizeof *v);
        if (!k || !v) {
            free(k);
            free(v);
            return ab_fail(AB_ENOMEM, "out of memory");
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->keys[i]) continue;
            size_t j = hash_str(m->keys[i]) & (cap - 1);
            while (k[j]) j = (j + 1) & (cap - 1);
            k[j] = m->keys[i];
            v[j] = m->vals[i];
        }
        free(m->keys);
        free(m->vals);
        m->keys = k;
        m->vals = v;
        m->cap = cap;
    }
    size_t i = hash_str(key) & (m->cap - 1);
    for (; m->keys[i]; i = (i + 1) & (m->cap - 1))
        if (strcmp(m->keys[i], key) == 0) return 1;
    m->keys[i] = key;
    m->vals[i] = val;
    m->n++;
    return 0;
}

static void smap_free(smap *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- tables: KEY REST lines ---- */

typedef struct {
    char *key, *value; /* value: the rest of the line, trimmed ("" when none) */
    int line;
} row;

typedef struct {
    char *path;
    row *rows;
    int n, cap;
    smap index; /* key -> its (first) row */
} table;

static void table_free(table *t) {
    for (int i = 0; i < t->n; i++) {
        free(t->rows[i].key);
        free(t->rows[i].value);
    }
    free(t->rows);
    free(t->path);
    smap_free(&t->index);
    memset(t, 0, sizeof *t);
}

/* Reads PATH: `what` names the file's role in messages. value_required: a line
 * holding only a key is malformed. dup_ok: a key may come again (its first row is
 * the one indexed). */
static int table_read(const char *path, const char *what, bool value_required, bool dup_ok, table *t) {
    memset(t, 0, sizeof *t);
    int rc;
    FILE *f = ab_fopen_regular(path, what, &rc);
    if (!f) return rc;
    if (!(t->path = strdup(path))) {
        fclose(f);
        return ab_fail(AB_ENOMEM, "out of memory");
    }
    char *buf = NULL;
    size_t cap = 0;
    ssize_t len;
    int line = 0;
    rc = 0;
    while (!rc && (len = getline(&buf, &cap, f)) >= 0) {
        line++;
        if (line == INT_MAX) {
            rc = ab_fail(AB_EINVAL, "%s: more than %d lines", path, INT_MAX - 1);
            break;
        }
        if ((size_t)len != strlen(buf)) {
            rc = ab_fail(AB_EINVAL, "%s:%d: a NUL byte (not a text file?)", path, line);
            break;
        }
        char *s = buf + strspn(buf, WS);
        size_t n = strlen(s);
        while (n && (strchr(WS, s[n - 1]) || s[n - 1] == '\n')) s[--n] = '\0';
        if (!n) continue; /* blank line */
        size_t klen = strcspn(s, WS);
        char *rest = s + klen;
        rest += strspn(rest, WS);
        s[klen] = '\0';
        if (value_required && !*rest) {
            rc = ab_fail(AB_EINVAL, "%s:%d: '%s' alone on its line (expected KEY VALUE)", path, line, s);
            break;
        }
        if (t->n == t->cap) {
            int nc = t->cap ? 2 * t->cap : 256;
            row *r = realloc(t->rows, sizeof *r * (size_t)nc);
            if (!r) {
                rc = ab_fail(AB_ENOMEM, "out of memory reading %s", path);
                break;
            }
            t->rows = r;
            t->cap = nc;
        }
        row *r = &t->rows[t->n];
        r->key = strdup(s);
        r->value = strdup(rest);
        r->line = line;
        if (!r->key || !r->value) {
            free(r->key);
            free(r->value);
            rc = ab_fail(AB_ENOMEM, "out of memory reading %s", path);
            break;
        }
        t->n++;
        int put = smap_put(&t->index, r->key, t->n - 1);
        if (put < 0) rc = put;
        else if (put == 1 && !dup_ok)
            rc = ab_fail(AB_EINVAL, "%s:%d: '%s' again (first on line %d)", path, line, r->key,
                         t->rows[smap_get(&t->index, r->key)].line);
    }
    if (!rc && ferror(f)) rc = ab_fail(ab_io_code(errno), "cannot read %s: %s", path, strerror(errno));
    free(buf);
    fclose(f);
    if (rc) table_free(t);
    return rc;
}

static const row *table_find(const table *t, const char *key) {
    int i = smap_get(&t->index, key);
    return i < 0 ? NULL : &t->rows[i];
}

/* ---- phones ---- */

void kd_phones_free(kd_phones *p) {
    if (!p) return;
    for (int i = 0; i < p->count; i++) free(p->names[i]);
    free(p->names);
    memset(p, 0, sizeof *p);
}

int kd_phones_copy(const kd_phones *src, kd_phones *dst) {
    memset(dst, 0, sizeof *dst);
    if (!(dst->names = calloc((size_t)src->count + 1, sizeof(char *)))) return ab_fail(AB_ENOMEM, "out of memory");
    for (int i = 0; i < src->count; i++) {
        if (!(dst->names[i] = strdup(src->names[i]))) {
            kd_phones_free(dst);
            return ab_fail(AB_ENOMEM, "out of memory");
        }
        dst->count = i + 1;
    }
    return 0;
}

static int phones_add(kd_phones *p, const char *name) {
    char **n = realloc(p->names, sizeof(char *) * ((size_t)p->count + 1));
    if (!n) return ab_fail(AB_ENOMEM, "out of memory");
    p->names = n;
    if (!(p->names[p->count] = strdup(name))) return ab_fail(AB_ENOMEM, "out of memory");
    p->count++;
    return 0;
}

/* The drop list: its symbols as a NULL-terminated array of pointers into `copy`. */
typedef struct {
    char *copy;
    char **sym;
    int n;
    bool *seen; /* whether the inventory's source holds each */
} droplist;

static void drop_free(droplist *d) {
    free(d->copy);
    free(d->sym);
    free(d->seen);
    memset(d, 0, sizeof *d);
}

static int drop_parse(const char *s, droplist *d) {
    memset(d, 0, sizeof *d);
    if (!s) s = "";
    size_t n = strlen(s);
    if (!(d->copy = strdup(s)) || !(d->sym = calloc(n / 2 + 2, sizeof(char *))) || !(d->seen = calloc(n / 2 + 2, 1))) {
        drop_free(d);
        return ab_fail(AB_ENOMEM, "out of memory");
    }
    char *save = NULL;
    for (char *tok = strtok_r(d->copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok += strspn(tok, WS);
        size_t k = strcspn(tok, WS);
        if (tok[k + strspn(tok + k, WS)] != '\0') {
            int rc = ab_fail(AB_EINVAL, "drop: '%s' holds whitespace (expected symbols separated by commas)", tok);
            drop_free(d);
            return rc;
        }
        tok[k] = '\0';
        if (*tok) d->sym[d->n++] = tok;
    }
    return 0;
}

/* Whether `sym` is dropped (and marks it seen). */
static bool dropped(droplist *d, const char *sym) {
    for (int i = 0; i < d->n; i++)
        if (strcmp(d->sym[i], sym) == 0) {
            d->seen[i] = true;
            return true;
        }
    return false;
}

static int drop_check_seen(const droplist *d, const char *source) {
    for (int i = 0; i < d->n; i++)
        if (!d->seen[i])
            return ab_fail(AB_EINVAL, "drop: '%s' is not a symbol of %s (a misspelling?)", d->sym[i], source);
    return 0;
}

/* Kaldi's symbol table: SYMBOL INTEGER lines; the inventory is its symbols by id, less
 * <eps>, #N and the dropped ones. */
static int read_phones_txt(const char *path, droplist *drop, kd_phones *out) {
    table t;
    int rc = table_read(path, "phone table", true, false, &t);
    if (rc) return rc;
    long long *ids = malloc(sizeof(long long) * ((size_t)t.n + 1));
    int *order = malloc(sizeof(int) * ((size_t)t.n + 1));
    if (!ids || !order) rc = ab_fail(AB_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < t.n; i++) {
        const row *r = &t.rows[i];
        char *end;
        errno = 0;
        long long v = strtoll(r->value, &end, 10);
        if (end == r->value || *end || errno || v < 0 || v > INT_MAX)
            rc = ab_fail(AB_EINVAL, "%s:%d: '%s %s' is not SYMBOL INTEGER (a Kaldi phones.txt line)", path, r->line,
                         r->key, r->value);
        ids[i] = v;
        order[i] = i;
    }
    /* by id (insertion sort: phone tables are small), refusing an id given twice */
    for (int i = 1; !rc && i < t.n; i++) {
        int k = order[i], j = i;
        while (j > 0 && ids[order[j - 1]] > ids[k]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = k;
    }
    for (int i = 1; !rc && i < t.n; i++)
        if (ids[order[i]] == ids[order[i - 1]]) {
            const row *a = &t.rows[order[i - 1]], *b = &t.rows[order[i]];
            const row *first = a->line < b->line ? a : b, *second = a->line < b->line ? b : a;
            rc = ab_fail(AB_EINVAL, "%s:%d: id %lld again (line %d gives it to '%s')", path, second->line,
                         ids[order[i]], first->line, first->key);
        }
    memset(out, 0, sizeof *out);
    for (int i = 0; !rc && i < t.n; i++) {
        const char *s = t.rows[order[i]].key;
        if (strcmp(s, "<eps>") == 0 || (s[0] == '#' && s[1] && strspn(s + 1, "0123456789") == strlen(s + 1))) continue;
        if (dropped(drop, s)) continue;
        rc = phones_add(out, s);
    }
    if (!rc && out->count == 0) rc = ab_fail(AB_EINVAL, "%s: no phone symbols (after <eps>, #N and drop)", path);
    if (!rc) {
        char where[1100];
        snprintf(where, sizeof where, "%s", path);
        rc = drop_check_seen(drop, where);
    }
    if (rc) kd_phones_free(out);
    free(ids);
    free(order);
    table_free(&t);
    return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* ---- the directory ---- */

void kd_dir_free(kd_dir *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        kd_utt *u = &d->utts[i];
        free(u->id);
        free(u->audio);
        free(u->feats_path);
        free(u->phones);
    }
    free(d->utts);
    for (int i = 0; i < d->n_speakers; i++) free(d->speakers[i]);
    free(d->speakers);
    kd_phones_free(&d->phones);
    free(d->dir);
    free(d->scp_path);
    free(d->text_path);
    free(d->phones_from);
    memset(d, 0, sizeof *d);
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Whether an optional file of the directory is there (*yes): no entry of its name is
 * "not there"; an entry that cannot be followed (a dangling symbolic link, a loop of
 * them) is refused, not taken for absent (utt2spk so would silently turn CMVN per
 * speaker into per utterance). What is there is then read, and refused if it is not a
 * readable regular file. */
static int present(const char *path, bool *yes) {
    struct stat st;
    *yes = false;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) return 0;
        return ab_fail(ab_io_code(errno), "cannot read %s: %s", path, strerror(errno));
    }
    if (stat(path, &st) != 0)
        return ab_fail(AB_EINVAL, "%s: a symbolic link that cannot be followed (%s)", path, strerror(errno));
    *yes = true;
    return 0;
}

/* wav.scp's value: a path, or a command ending in '|'. */
static int parse_wav(const table *t, const row *r, kd_utt *u) {
    const char *v = r->value;
    size_t n = strlen(v);
    if (v[n - 1] == '|') {
        size_t k = n - 1;
        while (k && strchr(WS, v[k - 1])) k--;
        if (!k) return ab_fail(AB_EINVAL, "%s:%d: utterance '%s': an empty command before '|'", t->path, r->line, r->key);
        if (!(u->audio = strndup(v, k))) return ab_fail(AB_ENOMEM, "out of memory");
        u->audio_command = true;
        return 0;
    }
    if (v[0] == '-' && !v[1])
        return ab_fail(AB_EINVAL, "%s:%d: utterance '%s': '-' (standard input) cannot be an utterance's audio", t->path,
                       r->line, r->key);
    if (v[strcspn(v, WS)])
        return ab_fail(AB_EINVAL, "%s:%d: utterance '%s': '%s' is neither a path (no spaces) nor a command ending in '|'",
                       t->path, r->line, r->key, v);
    if (!(u->audio = strdup(v))) return ab_fail(AB_ENOMEM, "out of memory");
    return 0;
}

/* feats.scp's value: ARCHIVE:OFFSET, or a file holding one matrix. */
static int parse_feats(const table *t, const row *r, kd_utt *u) {
    const char *v = r->value;
    size_t n = strlen(v);
    if (v[strcspn(v, WS)])
        return ab_fail(AB_EINVAL, "%s:%d: utterance '%s': '%s' is not ARCHIVE:OFFSET", t->path, r->line, r->key, v);
    if (v[n - 1] == ']')
        return ab_fail(AB_EINVAL, "%s:%d: utterance '%s': row or column ranges ('%s') are not supported", t->path,
                       r->line, r->key, strrchr(v, '['));
    if (v[n - 1] == '|' || (v[0] == '-' && !v[1]))
        return ab_fail(AB_EINVAL, "%s:%d: utterance '%s': features must be in a file (ARCHIVE:OFFSET), not '%s'", t->path,
                       r->line, r->key, v);
    const char *colon = strrchr(v, ':');
    u->feats_offset = 0;
    size_t plen = n;
    if (colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1)) {
        errno = 0;
        u->feats_offset = strtoll(colon + 1, NULL, 10);
        if (errno) return ab_fail(AB_EINVAL, "%s:%d: utterance '%s': offset '%s' is too large", t->path, r->line, r->key, colon + 1);
        plen = (size_t)(colon - v);
    }
    if (!plen) return ab_fail(AB_EINVAL, "%s:%d: utterance '%s': no archive before ':'", t->path, r->line, r->key);
    if (!(u->feats_path = strndup(v, plen))) return ab_fail(AB_ENOMEM, "out of memory");
    return 0;
}

/* The tokens of a text line, split in place. */
static int split(char *s, char ***tok, int *n) {
    *n = 0;
    *tok = NULL;
    size_t cap = strlen(s) / 2 + 1;
    if (!(*tok = malloc(sizeof(char *) * cap))) return ab_fail(AB_ENOMEM, "out of memory");
    char *save = NULL;
    for (char *t = strtok_r(s, WS, &save); t; t = strtok_r(NULL, WS, &save)) (*tok)[(*n)++] = t;
    return 0;
}

int kd_read(const char *dir, const kd_options *o, kd_dir *d) {
    memset(d, 0, sizeof *d);
    table scp = {0}, text = {0}, spk = {0}, lex = {0};
    smap phone_ids = {0}, spk_ids = {0};
    droplist drop = {0};
    char *p = NULL;
    char ***toks = NULL; /* per utterance: its target symbols (built inventory: resolved after) */
    int *ntok = NULL;
    int rc = 0;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return ab_fail(AB_EINVAL, "data directory %s: %s", dir, stat(dir, &st) != 0 ? strerror(errno) : "not a folder");
    if (!(d->dir = strdup(dir))) return ab_fail(AB_ENOMEM, "out of memory");
    if ((rc = drop_parse(o->drop, &drop))) goto done;

    if (!(p = join(dir, "segments"))) goto nomem;
    bool there;
    if ((rc = present(p, &there))) goto done;
    if (there) {
        rc = ab_fail(AB_EINVAL, "%s: segments files are not supported (cut the recordings into one file per utterance, "
                                "e.g. with Kaldi's extract-segments)", p);
        goto done;
    }
    free(p);
    p = NULL;
    /* where the features come from */
    char *wav = join(dir, "wav.scp"), *feats = join(dir, "feats.scp");
    if (!wav || !feats) {
        free(wav);
        free(feats);
        goto nomem;
    }
    d->source = o->source;
    if (d->source == KD_SOURCE_AUTO && (rc = present(feats, &there))) {
        free(wav);
        free(feats);
        goto done;
    }
    if (d->source == KD_SOURCE_AUTO) d->source = there ? KD_SOURCE_FEATS : KD_SOURCE_WAV;
    d->scp_path = d->source == KD_SOURCE_FEATS ? feats : wav;
    free(d->source == KD_SOURCE_FEATS ? wav : feats);
    if (o->source == KD_SOURCE_AUTO && d->source == KD_SOURCE_WAV && (rc = present(d->scp_path, &there))) goto done;
    if (o->source == KD_SOURCE_AUTO && !there) {
        rc = ab_fail(AB_EINVAL, "data directory %s: neither wav.scp nor feats.scp", dir);
        goto done;
    }
    if ((rc = table_read(d->scp_path, d->source == KD_SOURCE_FEATS ? "feature index" : "audio index", true, false, &scp)))
        goto done;
    if (!(p = join(dir, "utt2spk"))) goto nomem;
    if ((rc = present(p, &d->has_utt2spk))) goto done;
    if (d->has_utt2spk && (rc = table_read(p, "speaker table", true, false, &spk))) goto done;
    for (int i = 0; i < spk.n; i++)
        if (spk.rows[i].value[strcspn(spk.rows[i].value, WS)]) {
            rc = ab_fail(AB_EINVAL, "%s:%d: '%s %s' is not UTTERANCE SPEAKER", p, spk.rows[i].line, spk.rows[i].key,
                         spk.rows[i].value);
            goto done;
        }
    free(p);
    p = NULL;

    /* the inventory, when it is given or read (else built below) */
    bool built = false;
    if (o->inventory) {
        if ((rc = kd_phones_copy(o->inventory, &d->phones))) goto done;
        for (int i = 0; i < drop.n; i++)
            for (int k = 0; k < d->phones.count; k++)
                if (strcmp(drop.sym[i], d->phones.names[k]) == 0) {
                    rc = ab_fail(AB_EINVAL, "drop: '%s' is phone %d of the given inventory", drop.sym[i], k);
                    goto done;
                }
        if (!(d->phones_from = strdup("given"))) goto nomem;
    } else {
        const char *pt = o->phones;
        if (!pt) {
            if (!(p = join(dir, "phones.txt"))) goto nomem;
            if ((rc = present(p, &there))) goto done;
            if (there) pt = p;
        }
        if (pt) {
            if ((rc = read_phones_txt(pt, &drop, &d->phones))) goto done;
            if (!(d->phones_from = strdup(pt))) goto nomem;
        } else {
            built = true;
        }
        free(p);
        p = NULL;
    }
    if (!built)
        for (int i = 0; i < d->phones.count; i++)
            if ((rc = smap_put(&phone_ids, d->phones.names[i], i)) < 0) goto done;

    /* the lexicon: words to phone symbols */
    if (o->lexicon) {
        if ((rc = table_read(o->lexicon, "lexicon", true, true, &lex))) goto done;
        for (int i = 0; i < lex.n; i++) {
            if (table_find(&lex, lex.rows[i].key) != &lex.rows[i]) continue; /* a later pronunciation */
            char *copy = strdup(lex.rows[i].value), *save = NULL;
            if (!copy) goto nomem;
            for (char *t = strtok_r(copy, WS, &save); t && !rc; t = strtok_r(NULL, WS, &save)) {
                if (dropped(&drop, t) || smap_get(&phone_ids, t) >= 0) continue;
                if (!built)
                    rc = ab_fail(AB_EINVAL, "%s:%d: word '%s': unknown phone '%s' (not in %s)", o->lexicon,
                                 lex.rows[i].line, lex.rows[i].key, t,
                                 strcmp(d->phones_from, "given") == 0 ? "the given inventory" : d->phones_from);
                else if (!(rc = phones_add(&d->phones, t)) &&
                         smap_put(&phone_ids, d->phones.names[d->phones.count - 1], 0) < 0)
                    rc = ab_fail(AB_ENOMEM, "out of memory");
            }
            free(copy);
            if (rc) goto done;
        }
    }

    /* text: the utterances and their targets */
    if (!(d->text_path = join(dir, "text"))) goto nomem;
    if ((rc = table_read(d->text_path, "transcript", false, false, &text))) goto done;
    if (text.n == 0) {
        rc = ab_fail(AB_EINVAL, "%s: no utterances", d->text_path);
        goto done;
    }
    if (!(d->utts = calloc((size_t)text.n, sizeof *d->utts)) || !(toks = calloc((size_t)text.n, sizeof *toks)) ||
        !(ntok = calloc((size_t)text.n, sizeof *ntok)) || !(d->speakers = calloc((size_t)text.n, sizeof(char *))))
        goto nomem;
    for (int i = 0; i < text.n; i++) {
        const row *r = &text.rows[i];
        kd_utt *u = &d->utts[i];
        d->n = i + 1;
        if (!(u->id = strdup(r->key))) goto nomem;
        u->text_line = r->line;
        const row *s = table_find(&scp, r->key);
        if (!s) {
            rc = ab_fail(AB_EINVAL, "%s:%d: utterance '%s' has no %s: it is not in %s", d->text_path, r->line, r->key,
                         d->source == KD_SOURCE_FEATS ? "features" : "audio", d->scp_path);
            goto done;
        }
        u->scp_line = s->line;
        if ((rc = d->source == KD_SOURCE_FEATS ? parse_feats(&scp, s, u) : parse_wav(&scp, s, u))) goto done;
        /* its speaker */
        const char *sp = r->key;
        if (d->has_utt2spk) {
            const row *k = table_find(&spk, r->key);
            if (!k) {
                rc = ab_fail(AB_EINVAL, "%s:%d: utterance '%s' has no speaker in %s/utt2spk", d->text_path, r->line,
                             r->key, dir);
                goto done;
            }
            sp = k->value;
        }
        int si = smap_get(&spk_ids, sp);
        if (si < 0) {
            if (!(d->speakers[d->n_speakers] = strdup(sp))) goto nomem;
            si = d->n_speakers++;
            if (smap_put(&spk_ids, d->speakers[si], si) < 0) goto nomem;
        }
        u->speaker = si;
        /* its symbols: phones, or words through the lexicon */
        char **words;
        int nw;
        if ((rc = split(r->value, &words, &nw))) goto done;
        int cap = 0;
        for (int w = 0; w < nw; w++) {
            const char *ph = words[w];
            if (o->lexicon) {
                const row *l = table_find(&lex, ph);
                if (!l) {
                    rc = ab_fail(AB_EINVAL, "%s:%d: utterance '%s': word '%s' is not in the lexicon %s", d->text_path,
                                 r->line, r->key, ph, o->lexicon);
                    break;
                }
                ph = l->value;
            }
            /* ph: one phone, or a pronunciation's phones separated by whitespace */
            for (const char *q = ph; *q;) {
                q += strspn(q, WS);
                size_t k = strcspn(q, WS);
                if (!k) break;
                char sym[256];
                if (k >= sizeof sym) {
                    rc = ab_fail(AB_EINVAL, "%s:%d: utterance '%s': a symbol of %zu bytes (at most 255)", d->text_path,
                                 r->line, r->key, k);
                    break;
                }
                memcpy(sym, q, k);
                sym[k] = '\0';
                q += k;
                if (dropped(&drop, sym)) continue;
                if (!built && smap_get(&phone_ids, sym) < 0) {
                    rc = ab_fail(AB_EINVAL, "%s:%d: utterance '%s': unknown phone '%s' (not in %s)", d->text_path,
                                 r->line, r->key, sym, strcmp(d->phones_from, "given") == 0 ? "the given inventory" : d->phones_from);
                    break;
                }
                if (ntok[i] == cap) {
                    cap = cap ? 2 * cap : 16;
                    char **nt = realloc(toks[i], sizeof(char *) * (size_t)cap);
                    if (!nt) {
                        rc = ab_fail(AB_ENOMEM, "out of memory");
                        break;
                    }
                    toks[i] = nt;
                }
                if (!(toks[i][ntok[i]] = strdup(sym))) {
                    rc = ab_fail(AB_ENOMEM, "out of memory");
                    break;
                }
                ntok[i]++;
            }
            if (rc) break;
        }
        free(words);
        if (rc) goto done;
    }
    /* the inventory built from the data: every symbol seen, sorted */
    if (built) {
        if (!o->lexicon)
            for (int i = 0; i < text.n; i++)
                for (int k = 0; k < ntok[i]; k++)
                    if (smap_get(&phone_ids, toks[i][k]) < 0) {
                        if ((rc = phones_add(&d->phones, toks[i][k]))) goto done;
                        if (smap_put(&phone_ids, d->phones.names[d->phones.count - 1], 0) < 0) goto nomem;
                    }
        if (d->phones.count == 0) {
            rc = ab_fail(AB_EINVAL, "%s: no phones to build the inventory from (every symbol dropped?)",
                         o->lexicon ? o->lexicon : d->text_path);
            goto done;
        }
        qsort(d->phones.names, (size_t)d->phones.count, sizeof(char *), cmp_str);
        smap_free(&phone_ids);
        for (int i = 0; i < d->phones.count; i++)
            if (smap_put(&phone_ids, d->phones.names[i], i) < 0) goto nomem;
        if (!(d->phones_from = strdup(o->lexicon ? o->lexicon : "text"))) goto nomem;
        if ((rc = drop_check_seen(&drop, o->lexicon ? o->lexicon : d->text_path))) goto done;
    }
    for (int i = 0; i < text.n; i++) {
        kd_utt *u = &d->utts[i];
        if (ntok[i] && !(u->phones = malloc(sizeof(int) * (size_t)ntok[i]))) goto nomem;
        for (int k = 0; k < ntok[i]; k++) u->phones[k] = smap_get(&phone_ids, toks[i][k]);
        u->n_phones = ntok[i];
    }
    goto done;
nomem:
    rc = ab_fail(AB_ENOMEM, "out of memory reading %s", dir);
done:
    if (toks)
        for (int i = 0; i < text.n; i++) {
            for (int k = 0; k < ntok[i]; k++) free(toks[i][k]);
            free(toks[i]);
        }
    free(toks);
    free(ntok);
    free(p);
    table_free(&scp);
    table_free(&text);
    table_free(&spk);
    table_free(&lex);
    smap_free(&phone_ids);
    smap_free(&spk_ids);
    drop_free(&drop);
    if (rc) kd_dir_free(d);
    return rc;
}
