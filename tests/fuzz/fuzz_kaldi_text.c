/* experiments/tasks/speech/kaldi_dir.c: the three text files of a data directory that name
 * its utterances (wav.scp, text, utt2spk), read by kd_read and held against a parse of
 * their own here, and the consent the commands of wav.scp need (data_command.h).
 *
 * Input: sections "\0@@NAME\n" then the file's bytes (as kaldi_dir's), NAME one of
 * wav.scp, text, utt2spk; other names end the input. Written into the process's scratch
 * folder and read from there; no audio is ever read.
 *
 * Must hold for an accepted directory, by the rules of experiments/speech/README.md
 * (a line is a key, whitespace " \t\r\v\f", and the rest, trimmed; blank lines are
 * skipped): the utterances are text's keys in its order; each one's audio is its
 * wav.scp value (a command: the value less its final '|' and the whitespace before it);
 * its speaker is its utt2spk value (itself without utt2spk); its phones are its text
 * tokens, ids into an inventory that is those tokens sorted by byte value, each once.
 * And when every utterance's audio is a command, sd_load under the default policy
 * refuses the first one, naming --allow-commands, without running anything. */
#include "data_command.h"
#include "error.h"
#include "fuzz_util.h"
#include "kaldi_dir.h"
#include "speech_data.h"

#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MARK "\0@@"
#define MARK_LEN 3

static const char *const FILES[3] = {"wav.scp", "text", "utt2spk"};
static const char WS[] = " \t\r\v\f";

typedef struct {
    const uint8_t *data; /* the section's bytes, or NULL when the input has none */
    size_t n;
} section;

static const uint8_t *find_mark(const uint8_t *p, const uint8_t *end) {
    for (; end - p >= MARK_LEN; p++)
        if (memcmp(p, MARK, MARK_LEN) == 0) return p;
    return NULL;
}

/* ---- the reference parse of a table: rows of (key, value) ---- */

typedef struct {
    char **key, **value;
    int n;
} rows;

static void rows_free(rows *r) {
    for (int i = 0; i < r->n; i++) {
        free(r->key[i]);
        free(r->value[i]);
    }
    free(r->key);
    free(r->value);
    memset(r, 0, sizeof *r);
}

/* Every non-blank line of the bytes as (key, trimmed rest). The bytes hold no NUL here
 * (a file with one is refused, and then nothing is compared). */
static rows parse_rows(const section *s) {
    rows r = {0};
    if (!s->data) return r;
    r.key = malloc(sizeof(char *) * (s->n + 1));
    r.value = malloc(sizeof(char *) * (s->n + 1));
    size_t i = 0;
    while (i < s->n) {
        size_t e = i;
        while (e < s->n && s->data[e] != '\n') e++;
        char *line = strndup((const char *)s->data + i, e - i);
        char *a = line + strspn(line, WS);
        size_t len = strlen(a);
        while (len && strchr(WS, a[len - 1])) a[--len] = '\0';
        if (len) {
            size_t k = strcspn(a, WS);
            char *rest = a + k + strspn(a + k, WS);
            r.key[r.n] = strndup(a, k);
            r.value[r.n] = strdup(rest);
            r.n++;
        }
        free(line);
        i = e + 1;
    }
    return r;
}

static const char *lookup(const rows *r, const char *key) {
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->key[i], key) == 0) return r->value[i];
    return NULL;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* ---- the checks ---- */

static void check(const kd_dir *d, const section *sec) {
    rows wav = parse_rows(&sec[0]), text = parse_rows(&sec[1]), spk = parse_rows(&sec[2]);
    if (d->n != text.n) fuzz_fail("kd_read", "%d utterances, text has %d lines", d->n, text.n);
    if (d->has_utt2spk != (sec[2].data != NULL)) fuzz_fail("kd_read", "has_utt2spk %d", (int)d->has_utt2spk);
    /* the inventory the reference builds: every token of text, sorted, each once */
    char **tok = NULL;
    size_t nt = 0, cap = 0;
    for (int i = 0; i < text.n; i++) {
        char *copy = strdup(text.value[i]), *save = NULL;
        for (char *t = strtok_r(copy, WS, &save); t; t = strtok_r(NULL, WS, &save)) {
            if (nt == cap) tok = realloc(tok, sizeof(char *) * (cap = cap ? 2 * cap : 16));
            tok[nt++] = strdup(t);
        }
        free(copy);
    }
    if (nt) qsort(tok, nt, sizeof *tok, cmp_str);
    size_t uniq = 0;
    for (size_t i = 0; i < nt; i++) {
        if (uniq && strcmp(tok[uniq - 1], tok[i]) == 0) {
            free(tok[i]);
            continue;
        }
        tok[uniq++] = tok[i];
    }
    if ((size_t)d->phones.count != uniq) fuzz_fail("kd_read", "%d phones, text has %zu symbols", d->phones.count, uniq);
    for (size_t i = 0; i < uniq; i++)
        if (strcmp(d->phones.names[i], tok[i]) != 0)
            fuzz_fail("kd_read", "phone %zu is '%s', the sorted symbols say '%s'", i, d->phones.names[i], tok[i]);
    for (int i = 0; i < d->n; i++) {
        const kd_utt *u = &d->utts[i];
        if (strcmp(u->id, text.key[i]) != 0) fuzz_fail("kd_read", "utterance %d is '%s', text says '%s'", i, u->id, text.key[i]);
        /* its audio */
        const char *v = lookup(&wav, u->id);
        if (!v) fuzz_fail("kd_read", "'%s' accepted without a wav.scp line", u->id);
        char *want = strdup(v);
        size_t len = strlen(want);
        const bool command = len && want[len - 1] == '|';
        if (command) {
            want[--len] = '\0';
            while (len && strchr(WS, want[len - 1])) want[--len] = '\0';
        }
        if (command != u->audio_command || strcmp(want, u->audio) != 0)
            fuzz_fail("kd_read", "'%s': audio '%s' (command %d), wav.scp says '%s'", u->id, u->audio, (int)u->audio_command, v);
        free(want);
        /* its speaker */
        const char *s = sec[2].data ? lookup(&spk, u->id) : u->id;
        if (!s || strcmp(d->speakers[u->speaker], s) != 0)
            fuzz_fail("kd_read", "'%s': speaker '%s', utt2spk says '%s'", u->id, d->speakers[u->speaker], s ? s : "nothing");
        /* its phones: its tokens, in order */
        char *copy = strdup(text.value[i]), *save = NULL;
        int k = 0;
        for (char *t = strtok_r(copy, WS, &save); t; t = strtok_r(NULL, WS, &save), k++)
            if (k >= u->n_phones || strcmp(d->phones.names[u->phones[k]], t) != 0)
                fuzz_fail("kd_read", "'%s': phone %d is not the token '%s'", u->id, k, t);
        if (k != u->n_phones) fuzz_fail("kd_read", "'%s': %d phones for %d tokens", u->id, u->n_phones, k);
        free(copy);
    }
    for (size_t i = 0; i < uniq; i++) free(tok[i]);
    free(tok);
    rows_free(&wav);
    rows_free(&text);
    rows_free(&spk);
}

/* Every utterance's audio a command: sd_load under the default policy refuses, naming
 * the option, before anything runs (the command is not run: a run would fail or write
 * audio, and either would be another message). */
static void check_consent(const kd_dir *d) {
    for (int i = 0; i < d->n; i++)
        if (!d->utts[i].audio_command) return;
    sd_options o;
    sd_options_default(&o);
    o.source = KD_SOURCE_WAV;
    sd_data s;
    int rc = sd_load(".", &o, NULL, &s);
    if (rc == 0) fuzz_fail("sd_load", "a directory of commands loaded without consent");
    fuzz_refused(rc, "sd_load");
    if (rc != AB_EINVAL || !strstr(ab_error(), "--allow-commands"))
        fuzz_fail("sd_load", "a command refused for another reason than consent: %s", ab_error());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int home = -1;
    if (home < 0) {
        if ((home = open(".", O_RDONLY | O_DIRECTORY)) < 0) {
            perror("fuzz: open .");
            abort();
        }
        dc_policy p;
        dc_policy_default(&p); /* commands refused, as a user's run without the option */
        dc_set_policy(&p);
    }
    section sec[3] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
    for (int i = 0; i < 3; i++) unlink(fuzz_path(FILES[i]));
    const uint8_t *end = data + size, *p = find_mark(data, end);
    while (p) {
        const uint8_t *name = p + MARK_LEN, *nl = memchr(name, '\n', (size_t)(end - name));
        if (!nl || nl - name > 15) break;
        int k = 0;
        while (k < 3 && ((size_t)(nl - name) != strlen(FILES[k]) || memcmp(name, FILES[k], (size_t)(nl - name)) != 0)) k++;
        if (k == 3) break;
        const uint8_t *body = nl + 1, *next = find_mark(body, end);
        sec[k].data = body;
        sec[k].n = (size_t)((next ? next : end) - body);
        fuzz_file(FILES[k], body, sec[k].n);
        p = next;
    }
    if (chdir(fuzz_dir()) != 0) {
        perror("fuzz: chdir");
        abort();
    }
    kd_options ko = {KD_SOURCE_WAV, NULL, NULL, NULL, NULL};
    kd_dir d;
    int rc = kd_read(".", &ko, &d);
    if (rc) {
        fuzz_refused(rc, "kd_read");
    } else {
        for (int i = 0; i < 3; i++) /* accepted: no file held a NUL byte */
            if (sec[i].data && memchr(sec[i].data, '\0', sec[i].n)) fuzz_fail("kd_read", "%s with a NUL byte accepted", FILES[i]);
        check(&d, sec);
        check_consent(&d);
    }
    kd_dir_free(&d);
    if (fchdir(home) != 0) {
        perror("fuzz: fchdir");
        abort();
    }
    fuzz_no_tracked_memory("Kaldi data directory text files");
    return 0;
}
