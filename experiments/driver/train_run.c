/* A training run (train_run.h): the run policy of `attnbench train`, its cadence of
 * logs, evaluations and checkpoints, its run document and its messages. */
#include "train_run.h"

#include "blas.h"
#include "config.h"
#include "error.h"
#include "fileio.h"
#include "memory.h"
#include "progress.h"
#include "results.h"
#include "timer.h"
#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The TSV's columns: these, then eval_NAME for each of the task's metrics. */
static const char *const TSV_BASE[] = {"kind",         "step",      "loss",  "loss_last", "lr",       "grad_norm",
                                       "tokens_per_s", "elapsed_s", "cpu_s", "eval_loss"};
#define N_TSV_BASE ((int)(sizeof TSV_BASE / sizeof *TSV_BASE))

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* --resume in DIR without DIR/checkpoint.bin. A run killed before its first
 * checkpoint leaves only its train.json (status "running"): there is nothing to
 * resume, and the message says what to do instead. */
static int no_checkpoint(const char *dir, const char *ckpt_path, const char *json_path) {
    if (file_exists(json_path))
        return ab_fail(AB_EINVAL,
                       "train --resume: no checkpoint %s to resume: the run in %s stopped before its first "
                       "checkpoint; start it again with --overwrite (which replaces %s)",
                       ckpt_path, dir, json_path);
    return ab_fail(AB_EINVAL, "train --resume: no checkpoint %s to resume", ckpt_path);
}

typedef struct {
    trainer *t;
    ab_run *run;
    json_t *step_loss;       /* borrowed from the run document */
    char ckpt_path[4200];
    long long ckpt_step;     /* step of the checkpoint on disk (-1: none) */
    uint64_t t0_ns;          /* this process's start of training */
    uint64_t t0_cpu_ns;      /* the process's CPU time then (ab_cpu_ns) */
    /* the steps of the current log interval run by this process */
    long long int_steps;
    double int_time_s, int_positions;
    train_step_info last;
    train_eval_info last_eval, test;
    bool have_eval, have_test;
    ab_progress bar;
    bool quiet;
    const char *dir;
    ab_dist *dist;           /* the request's (NULL: one process) */
    bool writer;             /* rank 0: writes DIR; the other ranks keep their records here */
    json_t *records;         /* the records of a rank that does not write (owned) */
} run_state;

/* The document's records, or a non-writing rank's own list. */
static json_t *records_of(run_state *s) { return s->run ? ab_run_records(s->run) : s->records; }

static double elapsed(const run_state *s) { return s->t->elapsed_s + (double)(ab_now_ns() - s->t0_ns) * 1e-9; }
/* The run's CPU time so far: earlier processes' (NaN when a checkpoint of an earlier
 * release did not record it) and this process's since training began (loading the
 * data and building the model are left out, as they are from elapsed). */
static double cpu_elapsed(const run_state *s) {
    return s->t->cpu_s + (double)(ab_cpu_ns() - s->t0_cpu_ns) * 1e-9;
}

static int fail_run(run_state *s, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int save_checkpoint(run_state *s) {
    if (s->ckpt_step == s->t->step || !s->writer) return 0;
    int rc = trainer_save(s->t, s->ckpt_path, elapsed(s), cpu_elapsed(s));
    if (!rc) s->ckpt_step = s->t->step;
    return rc;
}

/* Mean and standard deviation of the losses of the last `w` steps. */
static void window_stats(const trainer *t, long long w, double *mean, double *sd) {
    *mean = *sd = NAN;
    if (w <= 0 || t->step == 0) return;
    if (w > t->step) w = t->step;
    double s = 0, ss = 0;
    for (long long i = t->step - w; i < t->step; i++) s += t->losses[i];
    double m = s / (double)w;
    for (long long i = t->step - w; i < t->step; i++) ss += (t->losses[i] - m) * (t->losses[i] - m);
    *mean = m;
    *sd = w > 1 ? sqrt(ss / (double)(w - 1)) : 0.0;
}

static json_t *summary_json(run_state *s) {
    trainer *t = s->t;
    json_t *o = json_object();
    long long w = t->step / 10 > 0 ? t->step / 10 : 1;
    double mean, sd;
    window_stats(t, w, &mean, &sd);
    double el = elapsed(s);
    const train_task *task = t->cfg.task;
    char key[96];
    json_object_set_new(o, "steps_done", json_integer(t->step));
    if (task_is_dataset(task)) /* passes over the training split */
        json_object_set_new(o, "epochs_done", ab_json_num((double)t->step * (double)t->cfg.batch /
                                                          (double)task->split_rows[t->train_split]));
    json_object_set_new(o, "final_eval_loss", s->have_eval ? ab_json_num(s->last_eval.loss) : json_null());
    for (int i = 0; i < task->n_metrics; i++) {
        snprintf(key, sizeof key, "final_eval_%s", task->metrics[i].name);
        json_object_set_new(o, key, s->have_eval ? ab_json_num(s->last_eval.metrics[i]) : json_null());
    }
    if (s->have_test) {
        json_object_set_new(o, "test_split", json_string(task->split_names[t->cfg.test_split]));
        json_object_set_new(o, "test_rows", json_integer(s->test.rows));
        json_object_set_new(o, "test_loss", ab_json_num(s->test.loss));
        for (int i = 0; i < task->n_metrics; i++) {
            snprintf(key, sizeof key, "test_%s", task->metrics[i].name);
            json_object_set_new(o, key, ab_json_num(s->test.metrics[i]));
        }
    }
    /* the recurrent state one sequence of the task's length holds, all layers (null:
     * no recurrent mode, e.g. softmax, lsh or a non-causal model) */
    const size_t state = t->model && tf_has_recurrent(t->model) ? tf_gen_state_bytes(t->model, 1, task->seq_len) : 0;
    json_object_set_new(o, "state_bytes", state ? json_integer((json_int_t)state) : json_null());
    json_object_set_new(o, "final_train_loss_window", json_integer(t->step ? w : 0));
    json_object_set_new(o, "final_train_loss_mean", ab_json_num(mean));
    json_object_set_new(o, "final_train_loss_std", ab_json_num(sd));
    json_object_set_new(o, "final_train_loss_rel_std", ab_json_num(sd / mean));
    json_object_set_new(o, "wall_s", ab_json_num(el));
    json_object_set_new(o, "step_s", ab_json_num(s->t->step_s));
    /* CPU time (all threads of the process) beside the wall time: on a shared machine
     * it is what the run cost; at one thread, about its wall time on an idle core */
    json_object_set_new(o, "cpu_s", ab_json_num(cpu_elapsed(s)));
    json_object_set_new(o, "step_cpu_s", ab_json_num(s->t->step_cpu_s));
    json_object_set_new(o, "positions", ab_json_num(t->positions));
    json_object_set_new(o, "train_tokens_per_s", ab_json_num(s->t->step_s > 0 ? t->positions / s->t->step_s : NAN));
    json_object_set_new(o, "peak_bytes", json_integer((json_int_t)ab_mem_peak(AB_DEV_CPU)));
    json_object_set_new(o, "peak_rss_bytes", json_integer((json_int_t)ab_process_peak_rss()));
    json_object_set_new(o, "params", json_integer((json_int_t)tf_param_count(t->model)));
    json_object_set_new(o, "threads", json_integer(ab_threads()));
    /* data-parallel ranks: how many, through which engine, and the time and bytes of
     * rank 0's share of the sums (waiting for the others included) */
    json_object_set_new(o, "ranks", json_integer(ab_dist_size(s->dist)));
    json_object_set_new(o, "dist", json_string(ab_dist_kind_name(ab_dist_kind_of(s->dist))));
    json_object_set_new(o, "accumulate", json_integer(t->cfg.accumulate));
    json_object_set_new(o, "comm_s", ab_json_num(ab_dist_comm_seconds(s->dist)));
    json_object_set_new(o, "comm_bytes", ab_json_num(ab_dist_comm_bytes(s->dist)));
    return o;
}

static int save_doc(run_state *s) {
    if (!s->run) return 0;
    ab_run_set(s->run, "summary", summary_json(s));
    return ab_run_save(s->run);
}

/* Ends the run with status "failed" and the reason (the document freed); returns
 * `code` with the reason as the message. */
static int fail_run(run_state *s, int code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ab_progress_end(&s->bar);
    if (s->run) {
        ab_run_set(s->run, "reason", json_string(msg));
        ab_run_set(s->run, "summary", summary_json(s));
        ab_run_finish(s->run, "failed");
        s->run = NULL;
    }
    return ab_fail(code, "%s", msg);
}

static void log_line(run_state *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_line(run_state *s, const char *fmt, ...) {
    if (s->quiet || ab_progress_on(&s->bar)) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

/* An evaluation record: kind "eval" (the config's evaluation set) or "test" (all of
 * the test split, at the end), with the loss and each of the task's metrics. With
 * `plateau` (an evaluation a plateau schedule counts) the watched value goes to the
 * optimiser, and the record holds the schedule's state after it: lr_factor (the
 * learning rate's multiplier), plateau_best, plateau_bad, lr_reduced. */
static int do_eval(run_state *s, bool test, bool plateau) {
    trainer *t = s->t;
    const train_task *task = t->cfg.task;
    const char *kind = test ? "test" : "eval";
    train_eval_info e;
    int rc = test ? trainer_eval(t, t->cfg.test_split, 0, &e) : trainer_eval(t, -1, 0, &e);
    if (rc) return fail_run(s, rc, "%s evaluation at step %lld failed: %s", kind, t->step, ab_error());
    if (test) {
        s->test = e;
        s->have_test = true;
    } else {
        s->last_eval = e;
        s->have_eval = true;
    }
    char key[96], line[512];
    size_t n = 0;
    json_t *r = json_object();
    json_object_set_new(r, "kind", json_string(kind));
    json_object_set_new(r, "step", json_integer(t->step));
    snprintf(key, sizeof key, "%s_loss", kind);
    json_object_set_new(r, key, ab_json_num(e.loss));
    line[0] = '\0';
    for (int i = 0; i < task->n_metrics; i++) {
        snprintf(key, sizeof key, "%s_%s", kind, task->metrics[i].name);
        json_object_set_new(r, key, ab_json_num(e.metrics[i]));
        n += (size_t)snprintf(line + n, n < sizeof line ? sizeof line - n : 0, " %s %.4f", task->metrics[i].name,
                              e.metrics[i]);
    }
    snprintf(key, sizeof key, "%s_positions", kind);
    json_object_set_new(r, key, json_integer(e.counted));
    if (task_is_dataset(task)) {
        int split = test ? t->cfg.test_split : t->cfg.eval_split;
        snprintf(key, sizeof key, "%s_split", kind);
        json_object_set_new(r, key, json_string(task->split_names[split]));
        snprintf(key, sizeof key, "%s_rows", kind);
        json_object_set_new(r, key, json_integer(e.rows));
    }
    json_object_set_new(r, "elapsed_s", ab_json_num(elapsed(s)));
    json_object_set_new(r, "cpu_s", ab_json_num(cpu_elapsed(s)));
    bool reduced = false;
    ab_optim_plateau_state ps;
    if (plateau) {
        if ((rc = trainer_plateau(t, &e, &reduced))) {
            json_decref(r);
            return fail_run(s, rc, "the plateau schedule at step %lld failed: %s", t->step, ab_error());
        }
        ab_optim_plateau_get(t->opt, &ps);
        json_object_set_new(r, "lr_factor", ab_json_num(ps.factor));
        json_object_set_new(r, "plateau_best", ab_json_num(ps.best));
        json_object_set_new(r, "plateau_bad", json_integer(ps.bad));
        json_object_set_new(r, "lr_reduced", json_boolean(reduced));
    }
    json_array_append_new(records_of(s), r);
    log_line(s, "train: step %lld %s loss %.6g%s\n", t->step, kind, e.loss, line);
    if (reduced)
        log_line(s, "train: step %lld: eval %s did not improve in %lld evaluation%s: the learning rate is now %g (x %g)\n",
                 t->step, t->cfg.optim.plateau_metric, t->cfg.optim.plateau_patience + 1,
                 t->cfg.optim.plateau_patience ? "s" : "", ab_optim_lr(t->opt, t->step + 1), ps.factor);
    return 0;
}

/* A "train" record for the log interval ending at this step: the steps since the
 * previous multiple of log_every. The mean loss comes from the per-step losses (which
 * a resumed run restores), so it does not depend on where a run was interrupted;
 * tokens/s covers the steps this process timed. */
static void do_log(run_state *s) {
    trainer *t = s->t;
    if (t->step == 0) return;
    long long prev = (t->step - 1) / t->cfg.log_every * t->cfg.log_every;
    double sum = 0;
    for (long long i = prev; i < t->step; i++) sum += t->losses[i];
    double mean = sum / (double)(t->step - prev);
    json_t *r = json_object();
    double tps = s->int_time_s > 0 ? s->int_positions / s->int_time_s : NAN;
    json_object_set_new(r, "kind", json_string("train"));
    json_object_set_new(r, "step", json_integer(t->step));
    json_object_set_new(r, "loss", ab_json_num(mean));
    json_object_set_new(r, "loss_last", ab_json_num(t->losses[t->step - 1]));
    /* the task's metrics on the last step's batch (when this process ran it) */
    const train_task *task = t->cfg.task;
    double values[TASK_MAX_METRICS];
    bool have = s->int_steps > 0 && trainer_step_metrics(t, &s->last, values) == 0;
    for (int i = 0; i < task->n_metrics; i++) {
        char key[96];
        snprintf(key, sizeof key, "%s_last", task->metrics[i].name);
        json_object_set_new(r, key, have ? ab_json_num(values[i]) : json_null());
    }
    json_object_set_new(r, "steps", json_integer(t->step - prev));
    json_object_set_new(r, "lr", s->int_steps ? ab_json_num(s->last.lr) : json_null());
    json_object_set_new(r, "grad_norm", s->int_steps ? ab_json_num(s->last.grad_norm) : json_null());
    json_object_set_new(r, "tokens_per_s", ab_json_num(tps));
    json_object_set_new(r, "elapsed_s", ab_json_num(elapsed(s)));
    json_object_set_new(r, "cpu_s", ab_json_num(cpu_elapsed(s)));
    json_array_append_new(records_of(s), r);
    log_line(s, "train: step %lld/%lld loss %.6g lr %.3g grad_norm %.3g %.0f tokens/s\n", t->step, t->cfg.steps, mean,
             s->last.lr, s->last.grad_norm, tps);
    s->int_steps = 0;
    s->int_time_s = s->int_positions = 0;
}

/* Copies the records of an earlier document at DIR/train.json with step <= `upto`
 * and its list of resumes; returns its "started" (new reference) or NULL when there
 * is no readable earlier document. */
static json_t *adopt_earlier(run_state *s, const char *path, long long upto, json_t *resumes) {
    int rc;
    FILE *f = ab_fopen_regular(path, "", &rc); /* a FIFO there is not waited on */
    if (!f) return NULL;
    json_error_t err;
    json_t *old = json_loadf(f, 0, &err);
    fclose(f);
    if (!old) return NULL;
    json_t *recs = json_object_get(old, "records"), *schema = json_object_get(old, "schema");
    json_t *started = NULL;
    if (json_is_array(recs) && json_is_string(schema) && strcmp(json_string_value(schema), "attnbench/run/1") == 0) {
        size_t i;
        json_t *r;
        json_array_foreach(recs, i, r) {
            json_t *st = json_object_get(r, "step");
            if (json_is_integer(st) && json_integer_value(st) <= upto)
                json_array_append(ab_run_records(s->run), r);
        }
        started = json_incref(json_object_get(old, "started"));
        json_t *res = json_object_get(old, "resumes");
        if (json_is_array(res)) json_array_extend(resumes, res);
        /* the last evaluation so far, for the summary */
        const train_task *task = s->t->cfg.task;
        json_array_foreach(recs, i, r) {
            json_t *st = json_object_get(r, "step"), *k = json_object_get(r, "kind");
            if (json_is_integer(st) && json_integer_value(st) <= upto && json_is_string(k) &&
                strcmp(json_string_value(k), "eval") == 0) {
                s->last_eval.loss = json_number_value(json_object_get(r, "eval_loss"));
                for (int m = 0; m < task->n_metrics; m++) {
                    char key[96];
                    snprintf(key, sizeof key, "eval_%s", task->metrics[m].name);
                    json_t *v = json_object_get(r, key);
                    s->last_eval.metrics[m] = json_is_number(v) ? json_number_value(v) : NAN;
                }
                s->have_eval = true;
            }
        }
    }
    json_decref(old);
    return started;
}

/* What a request holds before a trainer is built: the config, and with --resume the
 * open checkpoint. */
typedef struct {
    train_config cfg;
    bool have_cfg;
    ab_ckpt_reader *reader;
    json_t *ckpt_config;
    char ckpt_path[4200], json_path[4200];
} prepared;

static void prepared_free(prepared *p) {
    if (p->have_cfg) train_config_free(&p->cfg);
    p->have_cfg = false;
    ab_ckpt_close(p->reader);
    p->reader = NULL;
    json_decref(p->ckpt_config);
    p->ckpt_config = NULL;
}

/* The config: the request's, the file's, or with --resume and neither, the
 * checkpoint's; --set applied. */
static int load_config(const train_run_request *req, prepared *p) {
    const char *config_path = req->config_path, *out_dir = req->out_dir;
    if (req->resume && req->overwrite) return ab_fail(AB_EINVAL, "train: --resume and --overwrite exclude each other");
    if (!config_path && !req->config && !(req->resume && out_dir))
        return ab_fail(AB_EINVAL, "train: a CONFIG.json is required (or --resume --out DIR to continue a run)");
    json_t *root;
    int rc;
    if (req->config) {
        root = json_deep_copy(req->config);
        if (!root) return ab_fail(AB_ENOMEM, "out of memory");
    } else if (config_path) {
        root = ab_config_load(config_path);
        if (!root) return AB_EINVAL; /* the message is ab_config_load's */
    } else {
        snprintf(p->ckpt_path, sizeof p->ckpt_path, "%s/checkpoint.bin", out_dir);
        snprintf(p->json_path, sizeof p->json_path, "%s/train.json", out_dir);
        if (!file_exists(p->ckpt_path)) return no_checkpoint(out_dir, p->ckpt_path, p->json_path);
        if ((rc = train_ckpt_open(p->ckpt_path, &p->reader, &p->ckpt_config))) return rc;
        root = json_deep_copy(p->ckpt_config);
    }
    rc = train_config_apply_sets(root, req->sets, req->n_sets) ? AB_EINVAL : train_config_parse(root, &p->cfg);
    json_decref(root);
    if (rc) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", ab_error());
        const char *file = req->config ? NULL : config_path; /* what the message names */
        return ab_fail(rc, "%s%s%s", file ? file : "", file ? ": " : "", msg);
    }
    p->have_cfg = true;
    return 0;
}

/* The checkpoint against this run, before anything is allocated for it: its config in
 * this release's canonical form (keys added since it was written take their defaults)
 * against this run's, then its parameters against the model of its config (an edited
 * config must not make the model huge). */
static int check_resume(prepared *p) {
    int rc;
    if (!p->reader && (rc = train_ckpt_open(p->ckpt_path, &p->reader, &p->ckpt_config))) return rc;
    train_config old;
    if ((rc = train_config_parse(p->ckpt_config, &old))) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", ab_error());
        return ab_fail(rc, "%s: the checkpoint's config is not valid here: %s", p->ckpt_path, msg);
    }
    char key[512];
    if (train_config_diff(old.canon, p->cfg.canon, key, sizeof key)) {
        train_config_free(&old);
        return ab_fail(AB_EINVAL,
                       "train --resume: '%s' differs from the checkpoint's config (only name, label, description, "
                       "steps, epochs, eval_every, checkpoint_every and log_every may change)",
                       key);
    }
    if (ab_optim_config_has_plateau(&p->cfg.optim) && old.eval_every != p->cfg.eval_every) {
        const long long was = old.eval_every;
        train_config_free(&old);
        return ab_fail(AB_EINVAL,
                       "train --resume: 'eval_every' differs from the checkpoint's config (%lld): the plateau "
                       "schedule counts evaluations, so they must stay where they were",
                       was);
    }
    rc = train_ckpt_check_model(p->reader, &old.model, NULL);
    train_config_free(&old);
    return rc;
}

/* DIR and what it holds against --resume and --overwrite. */
static int check_dir(const train_run_request *req, prepared *p, char *dir, size_t cap) {
    if (req->out_dir) snprintf(dir, cap, "%s", req->out_dir);
    else snprintf(dir, cap, "results/%s", p->cfg.name);
    snprintf(p->ckpt_path, sizeof p->ckpt_path, "%s/checkpoint.bin", dir);
    snprintf(p->json_path, sizeof p->json_path, "%s/train.json", dir);
    /* the ranks that do not write leave DIR's checks to rank 0 (which may be writing
     * there already) and read only the checkpoint they resume from */
    if (ab_dist_rank(req->dist) != 0) return req->resume ? check_resume(p) : 0;
    const bool fresh = !req->resume && !req->overwrite;
    if (req->resume && !file_exists(p->ckpt_path)) return no_checkpoint(dir, p->ckpt_path, p->json_path);
    if (fresh && file_exists(p->ckpt_path))
        return ab_fail(AB_EINVAL,
                       "%s already holds a run; continue it with --resume, or replace it with --overwrite", dir);
    if (fresh && file_exists(p->json_path))
        return ab_fail(AB_EINVAL,
                       "%s already holds a run without a checkpoint (it stopped before its first one, so --resume "
                       "cannot continue it); start it again with --overwrite",
                       dir);
    return req->resume ? check_resume(p) : 0;
}

/* The trainer of the run, restored from the checkpoint on a resume. The config goes to
 * the trainer (also on failure). */
static int open_trainer(const train_run_request *req, prepared *p, trainer **out) {
    trainer *t;
    p->cfg.model.device = req->device;
    p->have_cfg = false;
    int rc = trainer_create_dist(&p->cfg, req->dist, &t);
    if (rc) return rc;
    /* --overwrite: the earlier run's checkpoint goes now, so that it can never be
     * taken for this run's (its document is replaced by the first save below) */
    if (!req->resume && ab_dist_rank(req->dist) == 0 && file_exists(p->ckpt_path) && remove(p->ckpt_path) != 0) {
        rc = ab_fail(AB_EIO, "cannot remove the earlier checkpoint %s: %s", p->ckpt_path, strerror(errno));
        trainer_destroy(t);
        return rc;
    }
    if (req->resume && (rc = trainer_restore(t, p->reader))) {
        trainer_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* The note of a resume in the document ("resumes"), the earlier records adopted. */
static void note_resume(run_state *s, const train_run_request *req, const char *json_path) {
    trainer *t = s->t;
    json_t *resumes = json_array();
    json_t *started = adopt_earlier(s, json_path, t->step, resumes);
    if (started) ab_run_set(s->run, "started", started);
    json_t *r = json_object();
    char now[32];
    ab_iso_time(now, sizeof now);
    json_object_set_new(r, "step", json_integer(t->step));
    json_object_set_new(r, "time", json_string(now));
    json_object_set_new(r, "threads", json_integer(ab_threads()));
    json_object_set_new(r, "ranks", json_integer(ab_dist_size(s->dist)));
    json_object_set_new(r, "earlier_records", json_boolean(started != NULL));
    json_array_append_new(resumes, r);
    ab_run_set(s->run, "resumes", resumes);
    if (!req->quiet) {
        fprintf(stderr, "train: resuming %s from step %lld%s\n", s->dir, t->step,
                started ? "" : " (no readable earlier train.json: earlier records are not carried over)");
        if (t->ckpt_threads && t->ckpt_threads != ab_threads())
            fprintf(stderr,
                    "train: note: the checkpoint was written with %d threads, this run uses %d: the steps are "
                    "not bit-identical to an uninterrupted run (use --threads %d)\n",
                    t->ckpt_threads, ab_threads(), t->ckpt_threads);
    }
}

/* Starts the run document at json_path and writes it a first time. */
static int begin_doc(run_state *s, const train_run_request *req, const char *json_path) {
    trainer *t = s->t;
    if (!s->writer) { /* the records and losses a rank keeps for itself */
        s->records = json_array();
        s->step_loss = json_array();
        for (long long i = 0; i < t->step; i++) json_array_append_new(s->step_loss, ab_json_num(t->losses[i]));
        return s->records && s->step_loss ? 0 : ab_fail(AB_ENOMEM, "out of memory");
    }
    const char *columns[N_TSV_BASE + TASK_MAX_METRICS + 1];
    char metric_cols[TASK_MAX_METRICS][96];
    for (int i = 0; i < N_TSV_BASE; i++) columns[i] = TSV_BASE[i];
    for (int i = 0; i < t->cfg.task->n_metrics; i++) {
        snprintf(metric_cols[i], sizeof metric_cols[i], "eval_%s", t->cfg.task->metrics[i].name);
        columns[N_TSV_BASE + i] = metric_cols[i];
    }
    columns[N_TSV_BASE + t->cfg.task->n_metrics] = NULL;
    s->run = ab_run_begin(json_path, req->command_line, t->cfg.canon, t->cfg.seed, columns);
    /* an output path that cannot be written is the request's */
    if (!s->run) return ab_fail(AB_EIO, "%s", ab_error());
    ab_run_set(s->run, "task", json_string(t->cfg.task->name));
    ab_run_set(s->run, "device", json_string(ab_device_name(req->device)));
    if (req->resume) note_resume(s, req, json_path);
    /* the loss of every step so far (restored from the checkpoint on a resume). A
     * non-finite loss is written as null (json_real refuses it, and the append of its
     * NULL would drop the element): the list keeps one entry per step. */
    s->step_loss = json_array();
    for (long long i = 0; i < t->step; i++) json_array_append_new(s->step_loss, ab_json_num(t->losses[i]));
    ab_run_set(s->run, "step_loss", json_incref(s->step_loss));
    json_decref(s->step_loss); /* the document holds it */
    return save_doc(s);
}

/* The line before the first step of a new run. */
static void print_start(const run_state *s) {
    const trainer *t = s->t;
    const train_config *c = &t->cfg;
    char body[128];
    if (c->model.body == TF_BODY_TRANSFORMER) snprintf(body, sizeof body, "%s attention", c->model.attention);
    else snprintf(body, sizeof body, "%s body", tf_body_name(c->model.body));
    char ranks[96] = "";
    if (ab_dist_size(s->dist) > 1 || c->accumulate > 1)
        snprintf(ranks, sizeof ranks, " x %d rank%s (%s), micro-batches of %d rows", ab_dist_size(s->dist),
                 ab_dist_size(s->dist) > 1 ? "s" : "", ab_dist_kind_name(ab_dist_kind_of(s->dist)), t->micro_rows);
    fprintf(stderr, "train: %s: %zu parameters, %s, %lld steps of %lld x %d positions, %d threads%s -> %s\n", c->name,
            tf_param_count(t->model), body, c->steps, c->batch, t->batch.N, ab_threads(), ranks, s->dir);
}

/* The progress bar after a step. */
static void draw_progress(run_state *s, const train_step_info *info, bool last) {
    if (!ab_progress_on(&s->bar)) return;
    const train_config *c = &s->t->cfg;
    char st[160];
    if (s->have_eval && c->task->n_metrics > 0)
        snprintf(st, sizeof st, "loss %.4g eval %.4g %s %.3f", info->loss, s->last_eval.loss,
                 c->task->metrics[0].name, s->last_eval.metrics[0]);
    else if (s->have_eval)
        snprintf(st, sizeof st, "loss %.4g eval %.4g", info->loss, s->last_eval.loss);
    else
        snprintf(st, sizeof st, "loss %.4g", info->loss);
    ab_progress_draw(&s->bar, s->t->step, st, last);
}

/* One step with its records, evaluations, checkpoint and document; 0 or the code of a
 * failed run (fail_run). */
static int one_step(run_state *s, bool has_eval) {
    trainer *t = s->t;
    const train_config *c = &t->cfg;
    uint64_t t1 = ab_now_ns(), c1 = ab_cpu_ns();
    train_step_info info;
    int rc = trainer_step(t, &info);
    if (rc) {
        if (info.diverged) {
            char where[4400];
            if (s->ckpt_step >= 0)
                snprintf(where, sizeof where, "the last good checkpoint (step %lld) is kept in %s", s->ckpt_step,
                         s->ckpt_path);
            else
                snprintf(where, sizeof where, "no checkpoint had been written yet");
            return fail_run(s, rc, "%s; %s", ab_error(), where);
        }
        return fail_run(s, rc, "step %lld failed: %s", t->step + 1, ab_error());
    }
    double dt = (double)(ab_now_ns() - t1) * 1e-9;
    t->step_s += dt;
    t->step_cpu_s += (double)(ab_cpu_ns() - c1) * 1e-9;
    s->int_steps++;
    s->int_time_s += dt;
    s->int_positions += (double)t->batch.rows * (double)t->batch.N;
    s->last = info;
    json_array_append_new(s->step_loss, ab_json_num(info.loss));
    bool last = t->step == c->steps;
    bool log = t->step % c->log_every == 0 || last;
    bool eval = has_eval && ((c->eval_every > 0 && t->step % c->eval_every == 0) || last);
    bool ckpt = (c->checkpoint_every > 0 && t->step % c->checkpoint_every == 0) || last;
    if (log) do_log(s);
    /* the plateau schedule counts the evaluations at multiples of eval_every only:
     * the extra one at the end of a run depends on where the run stops */
    if (eval && (rc = do_eval(s, false, c->eval_every > 0 && t->step % c->eval_every == 0))) return rc;
    if (last && c->test_split >= 0 && task_is_dataset(c->task) && (rc = do_eval(s, true, false))) return rc;
    /* the checkpoint first, then the document: the document never runs ahead of a
     * checkpoint at a checkpoint step */
    if (ckpt && (rc = save_checkpoint(s))) return fail_run(s, rc, "%s", ab_error());
    if ((log || eval || ckpt) && (rc = save_doc(s))) return fail_run(s, rc, "%s", ab_error());
    draw_progress(s, &info, last);
    return 0;
}

/* The steps up to the last or to *stop, then the end of the document: 0 (res->status
 * says how it ended) or the code of a failed run. */
static int run_steps(run_state *s, const train_run_request *req, train_run_result *res) {
    trainer *t = s->t;
    const train_config *c = &t->cfg;
    int rc;
    if (req->on_start) req->on_start(req->ctx);
    s->t0_ns = ab_now_ns();
    s->t0_cpu_ns = ab_cpu_ns();
    if (!req->quiet && !req->resume) print_start(s);
    ab_progress_begin(&s->bar, t->step, c->steps, !req->quiet);
    const bool has_eval = trainer_has_eval(t);
    if (t->step == 0 && has_eval && c->eval_every > 0) {
        if ((rc = do_eval(s, false, false))) return rc;
        if ((rc = save_doc(s))) return fail_run(s, rc, "%s", ab_error());
    }
    for (;;) {
        if (t->step >= c->steps) break;
        int stop = req->stop && *req->stop;
        if (ab_dist_size(s->dist) > 1) { /* a stop on any rank stops all before this step */
            int *all = malloc(sizeof(int) * (size_t)ab_dist_size(s->dist));
            if (!all) return fail_run(s, AB_ENOMEM, "out of memory");
            rc = ab_dist_allgather(s->dist, &stop, sizeof stop, all);
            for (int r = 0; r < ab_dist_size(s->dist) && !rc; r++) stop |= all[r];
            free(all);
            if (rc) return fail_run(s, rc, "%s", ab_error());
        }
        if (stop) break;
        if ((rc = one_step(s, has_eval))) return rc;
        if (req->on_step) req->on_step(req->ctx, t->step);
    }
    ab_progress_end(&s->bar);
    const char *status = "ok";
    if (t->step < c->steps) { /* stopped by a signal */
        status = "interrupted";
        if (t->step % c->log_every != 0) do_log(s); /* at a multiple, the record exists */
        if ((rc = save_checkpoint(s))) return fail_run(s, rc, "%s", ab_error());
    }
    rc = 0;
    if (s->run) {
        ab_run_set(s->run, "summary", summary_json(s));
        rc = ab_run_finish(s->run, status);
        s->run = NULL;
    }
    if (rc) return rc;
    res->status = strcmp(status, "ok") == 0 ? TRAIN_RUN_OK : TRAIN_RUN_INTERRUPTED;
    return 0;
}

/* The last line of a run that ended without an error. */
static void print_end(const run_state *s, train_run_status status) {
    const trainer *t = s->t;
    const train_config *c = &t->cfg;
    if (status == TRAIN_RUN_OK && s->have_test)
        fprintf(stderr, "train: done: %lld steps, final eval loss %.6g, test loss %.6g (%s), %.1f s -> %s\n", t->step,
                s->have_eval ? s->last_eval.loss : NAN, s->test.loss, c->task->split_names[c->test_split],
                elapsed(s), s->dir);
    else if (status == TRAIN_RUN_OK)
        fprintf(stderr, "train: done: %lld steps, final eval loss %.6g%s%s %.4f, %.1f s -> %s\n", t->step,
                s->have_eval ? s->last_eval.loss : NAN, c->task->n_metrics ? ", " : "",
                c->task->n_metrics ? c->task->metrics[0].name : "",
                s->have_eval && c->task->n_metrics ? s->last_eval.metrics[0] : NAN, elapsed(s), s->dir);
    else
        fprintf(stderr,
                "train: interrupted at step %lld; checkpoint written; continue with: attnbench train --resume --out "
                "%s\n",
                t->step, s->dir);
}

/* Every rank's verdict on the request before the first step: the refusal of one is
 * the refusal of all (a rank that agreed says which refused; the refusing ranks keep
 * their own message). */
static int ranks_agree(ab_dist *d, int rc) {
    const int R = ab_dist_size(d);
    int *all = malloc(sizeof(int) * (size_t)R);
    if (!all) return ab_fail(AB_ENOMEM, "out of memory");
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", rc ? ab_error() : "");
    int e = ab_dist_allgather(d, &rc, sizeof rc, all);
    if (e) {
        free(all);
        return e;
    }
    int first = -1;
    for (int r = 0; r < R && first < 0; r++)
        if (all[r]) first = r;
    const int code = first >= 0 ? all[first] : 0;
    free(all);
    if (rc) return ab_fail(rc, "%s", msg);
    if (first >= 0) return ab_fail(code, "rank %d of %d refused the run (its message is above)", first, R);
    return 0;
}

int train_run(const train_run_request *request, train_run_result *res) {
    /* the ranks other than 0 print nothing of the run's progress (their errors are the
     * caller's to print) */
    train_run_request quiet_rank = *request;
    quiet_rank.quiet = request->quiet || ab_dist_rank(request->dist) != 0;
    const train_run_request *req = &quiet_rank;
    memset(res, 0, sizeof *res);
    res->status = TRAIN_RUN_REFUSED;
    prepared p;
    memset(&p, 0, sizeof p);
    trainer *t = NULL;
    int rc = load_config(req, &p);
    if (!rc) rc = check_dir(req, &p, res->dir, sizeof res->dir);
    if (!rc) rc = open_trainer(req, &p, &t);
    prepared_free(&p);
    if (ab_dist_size(req->dist) > 1) rc = ranks_agree(req->dist, rc);
    if (rc) {
        trainer_destroy(t);
        return res->code = rc;
    }
    res->step = t->step;
    if (req->resume && t->step >= t->cfg.steps) { /* a complete run: leave its files as they are */
        if (!req->quiet)
            fprintf(stderr, "train: the run in %s is complete (step %lld of %lld): nothing to do\n", res->dir,
                    t->step, t->cfg.steps);
        trainer_destroy(t);
        res->status = TRAIN_RUN_OK;
        return 0;
    }
    run_state s;
    memset(&s, 0, sizeof s);
    s.t = t;
    s.dist = req->dist;
    s.writer = ab_dist_rank(req->dist) == 0;
    s.quiet = req->quiet;
    s.dir = res->dir;
    s.ckpt_step = req->resume ? t->step : -1;
    snprintf(s.ckpt_path, sizeof s.ckpt_path, "%s/checkpoint.bin", res->dir);
    char json_path[4200];
    snprintf(json_path, sizeof json_path, "%s/train.json", res->dir);
    if ((rc = begin_doc(&s, req, json_path))) {
        if (s.run) ab_run_discard(s.run);
    } else {
        res->status = TRAIN_RUN_FAILED; /* until run_steps says otherwise */
        rc = run_steps(&s, req, res);
        if (!rc && !req->quiet) print_end(&s, res->status);
    }
    res->step = t->step;
    json_decref(s.records);
    if (!s.writer) json_decref(s.step_loss);
    trainer_destroy(t);
    return res->code = rc;
}
