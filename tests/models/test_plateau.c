/* The reduce-on-plateau schedule (models/optim.h: schedule.plateau, ab_optim_plateau;
 * experiments/driver: the watched metric): the rule on a hand-made sequence of values
 * (improvements by the relative threshold, bad evaluations, the patience, the floor of
 * min_lr, NaN, negative values), the learning rate the steps then use, the state in
 * the optimiser's blob (version 2 with a schedule, version 1 without, a version 1 blob
 * restoring the start, malformed states refused), the JSON config (defaults, the
 * canonical form, bad values naming the key) and the driver's config (the metric a
 * task evaluates, its direction, evaluations needed). A run stopped and resumed across
 * a reduction is tested end to end in test_train_data.c. */
#include <criterion/criterion.h>

#include "error.h"
#include "optim.h"
#include "train_config.h"
#include "task_list.h"
#include "trainer.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static ab_optim_config plateau_cfg(void) {
    ab_optim_config c;
    ab_optim_config_default(&c);
    c.kind = AB_OPTIM_ADAM;
    c.lr = 1e-3;
    snprintf(c.plateau_metric, sizeof c.plateau_metric, "%s", "per");
    c.plateau_patience = 1;
    c.plateau_factor = 0.5;
    c.plateau_threshold = 0.1;
    c.plateau_min_lr = 3e-4; /* a floor at factor 0.3 */
    return c;
}

static ab_optim *make(const ab_optim_config *c, size_t n) {
    ab_optim *o = NULL;
    cr_assert_eq(ab_optim_create(c, n, NULL, 0, &o), 0, "%s", ab_error());
    return o;
}

/* The driver knows the tasks the program installs (task_list.h). */
static void install_tasks(void) { task_list_install(); }
TestSuite(plateau, .init = install_tasks);

Test(plateau, the_rule_on_a_hand_made_sequence) {
    ab_optim_config c = plateau_cfg();
    ab_optim *o = make(&c, 4);
    /* value, then the state after it: factor, best, bad, reductions, reduced */
    const struct {
        double v, factor, best;
        long long bad;
        int reductions;
        bool reduced;
    } seq[] = {
        {1.0, 1.0, 1.0, 0, 0, false},   /* the first value improves on +inf */
        {0.95, 1.0, 1.0, 1, 0, false},  /* not below 1 - 0.1 x 1 = 0.9: bad, within the patience (1) */
        {0.92, 0.5, 1.0, 0, 1, true},   /* a second bad one: more than the patience: halved, count restarts */
        {0.5, 0.5, 0.5, 0, 1, false},   /* below 0.9: the new best */
        {NAN, 0.5, 0.5, 1, 1, false},   /* NaN never improves */
        {NAN, 0.3, 0.5, 0, 2, true},    /* reduced to max(0.25, min_lr / lr = 0.3) */
        {0.49, 0.3, 0.5, 1, 2, false},  /* not below 0.5 - 0.05 = 0.45 */
        {0.48, 0.3, 0.5, 0, 2, false},  /* at the floor: no further reduction, the count restarts */
        {-1.0, 0.3, -1.0, 0, 2, false}, /* negative values: below best - 0.1 |best| */
        {-1.05, 0.3, -1.0, 1, 2, false}, /* not below -1.1 */
        {-1.2, 0.3, -1.2, 0, 2, false},
    };
    for (size_t i = 0; i < sizeof seq / sizeof *seq; i++) {
        bool reduced = !seq[i].reduced;
        cr_assert_eq(ab_optim_plateau(o, seq[i].v, &reduced), 0, "%s", ab_error());
        ab_optim_plateau_state st;
        ab_optim_plateau_get(o, &st);
        cr_expect(st.factor == seq[i].factor && st.best == seq[i].best && st.bad == seq[i].bad &&
                      st.reductions == seq[i].reductions && reduced == seq[i].reduced,
                  "value %zu (%g): factor %g best %g bad %lld reductions %d reduced %d; expected %g %g %lld %d %d", i,
                  seq[i].v, st.factor, st.best, st.bad, st.reductions, reduced, seq[i].factor, seq[i].best, seq[i].bad,
                  seq[i].reductions, seq[i].reduced);
    }
    /* the steps use lr x factor */
    cr_expect_eq(ab_optim_lr(o, 1), 1e-3 * 0.3);
    float p[4] = {1, 2, 3, 4}, g[4] = {1, -1, 1, -1};
    ab_optim_info info;
    cr_assert_eq(ab_optim_step(o, p, g, &info), 0, "%s", ab_error());
    cr_expect_eq(info.lr, 1e-3 * 0.3);
    /* Adam's first step moves each parameter by lr (|m_hat / sqrt(v_hat)| = 1) */
    cr_expect(fabsf(p[0] - (1.0f - 3e-4f)) < 1e-7f, "p[0] = %.9g", (double)p[0]);
    ab_optim_destroy(o);
    /* without a schedule: refused, and the lr is the schedule's */
    ab_optim_config d;
    ab_optim_config_default(&d);
    o = make(&d, 4);
    cr_expect_eq(ab_optim_plateau(o, 1.0, NULL), AB_EINVAL);
    cr_expect(strstr(ab_error(), "no plateau"), "%s", ab_error());
    cr_expect_eq(ab_optim_lr(o, 7), ab_optim_schedule_lr(&d, 7));
    ab_optim_destroy(o);
}

/* begin_below: nothing counts until the first value below it (a CTC model's all-blank
 * start at 100% PER); from there the rule is the one above. */
Test(plateau, begin_below_waits_for_the_first_value_below) {
    ab_optim_config c = plateau_cfg();
    c.plateau_begin_below = 0.9;
    ab_optim *o = make(&c, 4);
    const struct {
        double v, factor, best;
        long long bad;
        int reductions;
    } seq[] = {
        {1.0, 1.0, INFINITY, 0, 0},  /* not below 0.9: ignored, where the rule would count it */
        {1.0, 1.0, INFINITY, 0, 0},  /* ignored again: without begin_below, a reduction here */
        {NAN, 1.0, INFINITY, 0, 0},  /* NaN is not below either */
        {0.95, 1.0, INFINITY, 0, 0}, /* ignored */
        {0.8, 1.0, 0.8, 0, 0},       /* the first below 0.9: the first best */
        {0.85, 1.0, 0.8, 1, 0},      /* from here the rule: not below 0.72, bad */
        {0.95, 0.5, 0.8, 0, 1},      /* above begin_below, and counted: the second bad one halves */
        {NAN, 0.5, 0.8, 1, 1},       /* NaN counts as bad once started */
    };
    for (size_t i = 0; i < sizeof seq / sizeof *seq; i++) {
        cr_assert_eq(ab_optim_plateau(o, seq[i].v, NULL), 0, "%s", ab_error());
        ab_optim_plateau_state st;
        ab_optim_plateau_get(o, &st);
        cr_expect(st.factor == seq[i].factor && st.best == seq[i].best && st.bad == seq[i].bad &&
                      st.reductions == seq[i].reductions,
                  "value %zu (%g): factor %g best %g bad %lld reductions %d; expected %g %g %lld %d", i, seq[i].v,
                  st.factor, st.best, st.bad, st.reductions, seq[i].factor, seq[i].best, seq[i].bad,
                  seq[i].reductions);
    }
    ab_optim_destroy(o);
}

Test(plateau, state_is_in_the_optimiser_blob) {
    ab_optim_config c = plateau_cfg();
    ab_optim *a = make(&c, 5), *b = make(&c, 5);
    float pa[5] = {1, 2, 3, 4, 5}, g[5] = {0.5f, -1, 2, 0, 1};
    cr_assert_eq(ab_optim_step(a, pa, g, NULL), 0);
    const double vals[4] = {2.0, 2.0, 2.0, 1.5};
    for (int i = 0; i < 4; i++) cr_assert_eq(ab_optim_plateau(a, vals[i], NULL), 0);
    const void *st;
    size_t sb;
    cr_assert_eq(ab_optim_get_state(a, &st, &sb), 0);
    cr_expect_eq(((const unsigned char *)st)[8], 2, "a plateau schedule writes version 2");
    cr_assert_eq(ab_optim_set_state(b, st, sb), 0, "%s", ab_error());
    ab_optim_plateau_state sa, sb2;
    ab_optim_plateau_get(a, &sa);
    ab_optim_plateau_get(b, &sb2);
    cr_expect(memcmp(&sa, &sb2, sizeof sa) == 0, "the plateau state is not restored");
    cr_expect(sa.factor == 0.5 && sa.best == 1.5 && sa.bad == 0 && sa.reductions == 1);
    /* both continue alike */
    float pb[5];
    memcpy(pb, pa, sizeof pa);
    cr_assert_eq(ab_optim_step(a, pa, g, NULL), 0);
    cr_assert_eq(ab_optim_step(b, pb, g, NULL), 0);
    cr_expect(memcmp(pa, pb, sizeof pa) == 0, "a restored optimiser steps differently");
    /* malformed plateau states are refused */
    cr_assert_eq(ab_optim_get_state(a, &st, &sb), 0);
    unsigned char *buf = malloc(sb);
    const struct {
        size_t off;
        double v;
    } bad[] = {{40, 0.0}, {40, 1.5}, {40, NAN}, {48, NAN}, {48, -INFINITY}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memcpy(buf, st, sb);
        memcpy(buf + bad[i].off, &bad[i].v, 8);
        cr_expect_eq(ab_optim_set_state(b, buf, sb), AB_EINVAL, "case %zu accepted", i);
        cr_expect(strstr(ab_error(), "malformed plateau state"), "%s", ab_error());
    }
    free(buf);
    /* a version 1 state (an optimiser without the schedule) restores the start */
    ab_optim_config d = c;
    d.plateau_metric[0] = '\0';
    ab_optim *v1 = make(&d, 5);
    cr_assert_eq(ab_optim_get_state(v1, &st, &sb), 0);
    cr_expect_eq(((const unsigned char *)st)[8], 1, "no schedule: version 1, as before");
    for (size_t i = 36; i < 64; i++) cr_expect_eq(((const unsigned char *)st)[i], 0);
    cr_assert_eq(ab_optim_set_state(b, st, sb), 0, "%s", ab_error());
    ab_optim_plateau_get(b, &sb2);
    cr_expect(sb2.factor == 1.0 && isinf(sb2.best) && sb2.best > 0 && sb2.bad == 0 && sb2.reductions == 0);
    ab_optim_destroy(a), ab_optim_destroy(b), ab_optim_destroy(v1);
}

static int parse(const char *text, ab_optim_config *c) {
    json_t *j = json_loads(text, 0, NULL);
    cr_assert_not_null(j, "bad JSON in the test: %s", text);
    int rc = ab_optim_config_from_json(j, "optim", c);
    json_decref(j);
    return rc;
}

Test(plateau, json_config) {
    ab_optim_config c;
    cr_assert_eq(parse("{\"schedule\": {\"plateau\": {\"metric\": \"per\"}}}", &c), 0, "%s", ab_error());
    cr_expect_str_eq(c.plateau_metric, "per");
    cr_expect(c.plateau_factor == 0.5 && c.plateau_patience == 10 && c.plateau_threshold == 1e-4 &&
              c.plateau_min_lr == 0.0);
    cr_expect(ab_optim_config_has_plateau(&c));
    json_t *j = ab_optim_config_to_json(&c), *pl = json_object_get(json_object_get(j, "schedule"), "plateau");
    cr_assert_not_null(pl);
    cr_expect_eq(json_object_size(pl), 5);
    char *text = json_dumps(j, JSON_REAL_PRECISION(17));
    ab_optim_config back;
    cr_assert_eq(parse(text, &back), 0, "%s", ab_error());
    cr_expect(memcmp(&back, &c, sizeof c) == 0, "the canonical form does not read back the same");
    free(text);
    json_decref(j);
    /* begin_below: in the canonical form only when set, and read back */
    cr_expect(isinf(c.plateau_begin_below) && c.plateau_begin_below > 0);
    cr_assert_eq(parse("{\"schedule\": {\"plateau\": {\"metric\": \"per\", \"begin_below\": 0.95}}}", &c), 0, "%s",
                 ab_error());
    cr_expect(c.plateau_begin_below == 0.95);
    j = ab_optim_config_to_json(&c);
    pl = json_object_get(json_object_get(j, "schedule"), "plateau");
    cr_expect_eq(json_object_size(pl), 6);
    cr_expect(json_real_value(json_object_get(pl, "begin_below")) == 0.95);
    text = json_dumps(j, JSON_REAL_PRECISION(17));
    cr_assert_eq(parse(text, &back), 0, "%s", ab_error());
    cr_expect(memcmp(&back, &c, sizeof c) == 0, "begin_below does not read back the same");
    free(text);
    json_decref(j);
    /* no schedule: no "plateau" in the canonical form (the form of earlier runs) */
    ab_optim_config_default(&c);
    cr_expect(!ab_optim_config_has_plateau(&c));
    j = ab_optim_config_to_json(&c);
    cr_expect_null(json_object_get(json_object_get(j, "schedule"), "plateau"));
    json_decref(j);
    const struct {
        const char *plateau, *needle;
    } bad[] = {
        {"{}", "'optim.schedule.plateau.metric'"},
        {"{\"metric\": \"\"}", "'optim.schedule.plateau.metric' = ''"},
        {"{\"metric\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}", "1 to 31 characters"},
        {"{\"metric\": \"per\", \"factor\": 1}", "'optim.schedule.plateau.factor' = 1 must be in (0, 1)"},
        {"{\"metric\": \"per\", \"factor\": 0}", "plateau.factor"},
        {"{\"metric\": \"per\", \"patience\": -1}", "'optim.schedule.plateau.patience' = -1"},
        {"{\"metric\": \"per\", \"threshold\": -0.5}", "plateau.threshold"},
        {"{\"metric\": \"per\", \"min_lr\": -1}", "plateau.min_lr"},
        {"{\"metric\": \"per\", \"begin_below\": \"soon\"}", "plateau.begin_below"},
        {"{\"metric\": \"per\", \"mode\": \"max\"}", "mode"},
        {"\"per\"", "'optim.schedule.plateau' must be an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char t[400];
        snprintf(t, sizeof t, "{\"schedule\": {\"plateau\": %s}}", bad[i].plateau);
        cr_expect_eq(parse(t, &c), AB_EINVAL, "%s accepted", bad[i].plateau);
        cr_expect(strstr(ab_error(), bad[i].needle), "%s: '%s' lacks '%s'", bad[i].plateau, ab_error(), bad[i].needle);
    }
}

/* The driver's side: the metric must be one the task evaluates during training; a
 * maximised one (accuracy) is reported negated. */
static int driver_config(const char *extra, train_config *c) {
    char text[1500];
    snprintf(text, sizeof text,
             "{\"name\": \"p\", \"task\": {\"name\": \"copy\", \"max_symbols\": 4, \"symbols\": 4},"
             " \"model\": {\"d_model\": 8, \"heads\": 2, \"layers\": 1, \"d_ff\": 8, \"attention\": {\"variant\": \"linear\"}},"
             " \"steps\": 10, \"batch\": 2, \"eval_batches\": 1 %s}",
             extra);
    json_t *j = json_loads(text, 0, NULL);
    cr_assert_not_null(j, "%s", text);
    int rc = train_config_parse(j, c);
    json_decref(j);
    return rc;
}

Test(plateau, the_driver_resolves_the_metric) {
    train_config c;
    cr_assert_eq(driver_config("", &c), 0, "%s", ab_error());
    cr_expect_eq(c.plateau_metric, TRAIN_PLATEAU_NONE);
    train_config_free(&c);
    cr_assert_eq(driver_config(", \"optim\": {\"schedule\": {\"plateau\": {\"metric\": \"loss\"}}}", &c), 0, "%s",
                 ab_error());
    cr_expect_eq(c.plateau_metric, TRAIN_PLATEAU_LOSS);
    cr_expect(!c.plateau_maximise);
    train_config_free(&c);
    cr_assert_eq(driver_config(", \"optim\": {\"kind\": \"adam\", \"lr\": 0.01, \"schedule\": {\"plateau\": {\"metric\": "
                               "\"accuracy\", \"patience\": 0, \"threshold\": 0}}}",
                               &c),
                 0, "%s", ab_error());
    cr_expect_eq(c.plateau_metric, 0);
    cr_expect(c.plateau_maximise, "accuracy is better higher");
    /* through the trainer: accuracy 0.5, then 0.6 (better: no reduction), then 0.55 */
    trainer *t;
    cr_assert_eq(trainer_create(&c, &t), 0, "%s", ab_error());
    train_eval_info e = {0};
    const double acc[3] = {0.5, 0.6, 0.55};
    const bool want[3] = {false, false, true};
    for (int i = 0; i < 3; i++) {
        e.metrics[0] = acc[i];
        bool reduced = !want[i];
        cr_assert_eq(trainer_plateau(t, &e, &reduced), 0, "%s", ab_error());
        cr_expect_eq(reduced, want[i], "accuracy %g: reduced %d", acc[i], reduced);
    }
    cr_expect_eq(ab_optim_lr(t->opt, 1), 0.005);
    trainer_destroy(t);
    const struct {
        const char *extra, *needle;
    } bad[] = {
        {", \"optim\": {\"schedule\": {\"plateau\": {\"metric\": \"per\"}}}",
         "'optim.schedule.plateau.metric' = 'per' is not evaluated by task 'copy' (one of: loss, accuracy)"},
        {", \"eval_every\": 0, \"optim\": {\"schedule\": {\"plateau\": {\"metric\": \"loss\"}}}",
         "needs evaluations during training"},
        {", \"eval_batches\": 0, \"optim\": {\"schedule\": {\"plateau\": {\"metric\": \"loss\"}}}",
         "eval_batches > 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char extra[400];
        snprintf(extra, sizeof extra, "%s", bad[i].extra);
        if (strstr(extra, "\"eval_batches\": 0")) {
            /* the fixture's eval_batches 1 would come twice: give the key once */
            json_t *j = json_loads("{\"name\": \"p\", \"task\": {\"name\": \"copy\", \"max_symbols\": 4, \"symbols\": 4},"
                                   " \"model\": {\"d_model\": 8, \"heads\": 2, \"layers\": 1, \"d_ff\": 8, \"attention\":"
                                   " {\"variant\": \"linear\"}}, \"steps\": 10, \"batch\": 2, \"eval_batches\": 0,"
                                   " \"optim\": {\"schedule\": {\"plateau\": {\"metric\": \"loss\"}}}}",
                                   0, NULL);
            cr_assert_not_null(j);
            cr_expect_eq(train_config_parse(j, &c), AB_EINVAL);
            json_decref(j);
        } else {
            cr_expect_eq(driver_config(extra, &c), AB_EINVAL, "case %zu accepted", i);
        }
        cr_expect(strstr(ab_error(), bad[i].needle), "case %zu: '%s' lacks '%s'", i, ab_error(), bad[i].needle);
    }
}
