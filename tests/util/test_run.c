/* Run documents and checkpoints of `attnbench train` (test_run.h). */
#include "test_run.h"

#include "checkpoint.h"
#include "error.h"
#include "test_proc.h"
#include "trainer.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

json_t *load(const char *path) {
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    cr_assert_not_null(j, "%s is not JSON: %s", path, e.text);
    return j;
}

double num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    cr_assert(json_is_number(v), "no number '%s'", key);
    return json_number_value(v);
}

void records(json_t *doc, const char *kind, json_t **first, json_t **last) {
    *first = *last = NULL;
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(doc, "records"), i, r) {
        if (strcmp(json_string_value(json_object_get(r, "kind")), kind) != 0) continue;
        if (!*first) *first = r;
        *last = r;
    }
    cr_assert_not_null(*first, "no '%s' record", kind);
}

void *blob(const char *path, const char *name, size_t *n) {
    ab_ckpt_reader *r;
    cr_assert_eq(ab_ckpt_open(path, &r), 0, "%s", ab_error());
    const void *p;
    cr_assert_eq(ab_ckpt_get(r, name, &p, n), 0, "%s", ab_error());
    void *c = malloc(*n ? *n : 1);
    memcpy(c, p, *n);
    ab_ckpt_close(r);
    return c;
}

void expect_same_state(const char *a, const char *b, const char *what) {
    const char *names[3] = {AB_CKPT_PARAMS, AB_CKPT_OPTIM, "losses"};
    for (int i = 0; i < 3; i++) {
        size_t na, nb;
        void *pa = blob(a, names[i], &na), *pb = blob(b, names[i], &nb);
        cr_expect(na == nb && memcmp(pa, pb, na) == 0, "%s: blob '%s' differs", what, names[i]);
        free(pa);
        free(pb);
    }
}

double *step_losses(const char *path, size_t *n) {
    json_t *doc = load(path);
    json_t *a = json_object_get(doc, "step_loss");
    *n = json_array_size(a);
    double *x = malloc(sizeof(double) * (*n ? *n : 1));
    for (size_t i = 0; i < *n; i++) x[i] = json_number_value(json_array_get(a, i));
    json_decref(doc);
    return x;
}

long long ckpt_step(const char *path) {
    ab_ckpt_reader *r;
    if (ab_ckpt_open(path, &r)) return -1;
    train_ckpt_state m;
    cr_assert_eq(train_ckpt_get_state(r, &m), 0, "%s", ab_error());
    ab_ckpt_close(r);
    return m.step;
}

/* Waits until the checkpoint of a running process reaches `step` (or the process
 * ends, or 60 s pass). Returns the step seen. */
long long wait_for_checkpoint(pid_t pid, const char *path, long long step) {
    for (int i = 0; i < 6000; i++) {
        long long s = tp_exists(path) ? ckpt_step(path) : -1;
        cr_assert(!tp_exists(path) || s >= 0, "checkpoint %s is unreadable while the run writes it", path);
        if (s >= step) return s;
        if (waitpid(pid, NULL, WNOHANG) == pid) cr_assert_fail("the run ended before step %lld", step);
        tp_sleep_s(0.01);
    }
    cr_assert_fail("no checkpoint at step %lld after 60 s", step);
    return -1;
}
