/* The training driver as a library (experiments/driver, experiments/tasks/copy): the copy
 * task's rows (format, weights, determinism, length distribution), a tiny model's
 * full training step (forward, weighted loss, backward, clipping, RAdam update with
 * schedule and weight decay) against the double references, a save/restore that
 * continues bit for bit, and config validation naming the dotted key.
 * TEST_VERBOSE=1 prints the measured errors. */
#include <criterion/criterion.h>

#include "copy_task.h"
#include "error.h"
#include "memory.h"
#include "ref_model.h"
#include "reference.h"
#include "rng.h"
#include "test_model_util.h"
#include "test_util.h"
#include "task_list.h"
#include "trainer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static json_t *parse_json(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    cr_assert_not_null(j, "bad JSON in the test: %s", e.text);
    return j;
}

static train_task *make_task(const char *json) {
    json_t *j = parse_json(json);
    train_task *t = NULL;
    cr_assert_eq(task_create(j, &t), 0, "%s", ab_error());
    json_decref(j);
    return t;
}

static train_task *make_copy(int max_symbols, int symbols, int min_symbols) {
    char buf[256];
    snprintf(buf, sizeof buf, "{\"name\": \"copy\", \"max_symbols\": %d, \"symbols\": %d, \"min_symbols\": %d}",
             max_symbols, symbols, min_symbols);
    return make_task(buf);
}

/* ---- the copy task ---- */

/* The driver knows the tasks the program installs (task_list.h). */
static void install_tasks(void) { task_list_install(); }
TestSuite(copy_task, .init = install_tasks);
TestSuite(train_config, .init = install_tasks);
TestSuite(train_restore, .init = install_tasks);
TestSuite(train_step, .init = install_tasks);

Test(copy_task, row_format_and_weights) {
    const int X = 7, S = 4;
    train_task *t = make_copy(X, S, 1);
    cr_assert_eq(t->vocab, S + 2);
    cr_assert_eq(t->seq_len, 2 * X);
    cr_assert(t->causal);
    int N = t->seq_len;
    task_batch b;
    cr_assert_eq(task_batch_alloc(t, 50, &b), 0);
    task_batch_fill(t, 9, TASK_STREAM_DATA, 3, &b);
    for (int r = 0; r < b.B; r++) {
        const int *tok = b.tokens + r * N, *tg = b.targets + r * N;
        const float *w = b.weights + r * N;
        int len = b.lengths[r];
        cr_assert(len % 2 == 0 && len >= 2 && len <= 2 * X, "row %d: length %d", r, len);
        int L = len / 2;
        /* tokens: L symbols, separator, the same L - 1 symbols (the last copied symbol
         * is only a target), padding */
        for (int i = 0; i < L; i++) {
            cr_assert(tok[i] >= COPY_FIRST_SYMBOL && tok[i] < COPY_FIRST_SYMBOL + S, "row %d: symbol %d", r, tok[i]);
        }
        cr_assert_eq(tok[L], COPY_SEP);
        for (int i = 0; i < L - 1; i++) cr_assert_eq(tok[L + 1 + i], tok[i], "row %d: copy at %d", r, i);
        for (int i = 2 * L; i < N; i++) cr_assert_eq(tok[i], COPY_PAD, "row %d: padding at %d", r, i);
        /* targets are the next tokens (the last copied symbol is only a target);
         * weights 1 exactly on the copied half */
        for (int i = 0; i < 2 * L - 1; i++) cr_assert_eq(tg[i], tok[i + 1], "row %d: target %d", r, i);
        cr_assert_eq(tg[2 * L - 1], tok[L - 1], "row %d: the last copied symbol", r);
        for (int i = 2 * L; i < N; i++) cr_assert_eq(tg[i], COPY_PAD, "row %d: target %d after the copy", r, i);
        int ones = 0;
        for (int i = 0; i < N; i++) {
            bool copied = i >= L && i <= 2 * L - 1;
            cr_assert_eq(w[i], copied ? 1.0f : 0.0f, "row %d: weight at %d (L %d)", r, i, L);
            ones += copied;
            if (copied) cr_assert_eq(tg[i], tok[i - L], "row %d: target %d is not the symbol to copy", r, i);
        }
        cr_assert_eq(ones, L);
    }
    task_batch_free(&b);
    task_destroy(t);
}

Test(copy_task, determinism_from_seed_step_row) {
    train_task *t = make_copy(16, 10, 1);
    size_t N = (size_t)t->seq_len;
    task_batch a, b, c;
    cr_assert_eq(task_batch_alloc(t, 8, &a), 0);
    cr_assert_eq(task_batch_alloc(t, 8, &b), 0);
    cr_assert_eq(task_batch_alloc(t, 3, &c), 0);
    task_batch_fill(t, 5, TASK_STREAM_DATA, 17, &a);
    task_batch_fill(t, 5, TASK_STREAM_DATA, 17, &b);
    cr_assert(memcmp(a.tokens, b.tokens, sizeof(int) * 8 * N) == 0, "same (seed, step) gave other rows");
    cr_assert(memcmp(a.lengths, b.lengths, sizeof(int) * 8) == 0);
    /* a row depends on its index only, not on the batch size */
    task_batch_fill(t, 5, TASK_STREAM_DATA, 17, &c);
    cr_assert(memcmp(a.tokens, c.tokens, sizeof(int) * 3 * N) == 0, "row r depends on the batch size");
    /* other step, seed or stream: other rows */
    task_batch_fill(t, 5, TASK_STREAM_DATA, 18, &b);
    cr_assert(memcmp(a.tokens, b.tokens, sizeof(int) * 8 * N) != 0);
    task_batch_fill(t, 6, TASK_STREAM_DATA, 17, &b);
    cr_assert(memcmp(a.tokens, b.tokens, sizeof(int) * 8 * N) != 0);
    task_batch_fill(t, 5, TASK_STREAM_EVAL, 17, &b);
    cr_assert(memcmp(a.tokens, b.tokens, sizeof(int) * 8 * N) != 0);
    /* the documented derivation: row r of batch k is copy_draw from task_row_rng */
    int *d = malloc(sizeof(int) * (2 * 16 + 1));
    copy_options o = {16, 10, 1, 0};
    for (int r = 0; r < 8; r++) {
        ab_rng rng = task_row_rng(5, TASK_STREAM_DATA, 17, (uint64_t)r);
        int L = copy_draw(&o, &rng, d);
        cr_assert_eq(a.lengths[r], 2 * L);
        cr_assert(memcmp(d, a.tokens + r * N, sizeof(int) * 2 * L) == 0);
        cr_assert(memcmp(d + 1, a.targets + r * N, sizeof(int) * N) == 0);
    }
    free(d);
    task_batch_free(&a);
    task_batch_free(&b);
    task_batch_free(&c);
    task_destroy(t);
}

Test(copy_task, length_distribution) {
    /* L ~ uniform{3..10}: every value appears, none outside, and the counts agree
     * with uniform (chi-square over 8 cells with 4000 rows; the 99.9% point of
     * chi2(7) is 24.3). Symbols uniform over the alphabet likewise (chi2(4) 18.5). */
    train_task *t = make_copy(10, 5, 3);
    task_batch b;
    cr_assert_eq(task_batch_alloc(t, 4000, &b), 0);
    task_batch_fill(t, 1, TASK_STREAM_DATA, 1, &b);
    long counts[11] = {0}, sym[5] = {0}, nsym = 0;
    for (int r = 0; r < b.B; r++) {
        int L = b.lengths[r] / 2;
        cr_assert(L >= 3 && L <= 10, "L = %d", L);
        counts[L]++;
        for (int i = 0; i < L; i++) sym[b.tokens[r * t->seq_len + i] - COPY_FIRST_SYMBOL]++, nsym++;
    }
    double chi = 0, e = 4000.0 / 8;
    for (int L = 3; L <= 10; L++) chi += (counts[L] - e) * (counts[L] - e) / e;
    cr_expect_lt(chi, 24.3, "lengths are not uniform (chi2 %g)", chi);
    double chs = 0, es = nsym / 5.0;
    for (int s = 0; s < 5; s++) chs += (sym[s] - es) * (sym[s] - es) / es;
    cr_expect_lt(chs, 18.5, "symbols are not uniform (chi2 %g)", chs);
    task_batch_free(&b);
    task_destroy(t);
    /* min = max: every row has exactly that length */
    t = make_copy(4, 10, 4);
    cr_assert_eq(task_batch_alloc(t, 20, &b), 0);
    task_batch_fill(t, 2, TASK_STREAM_DATA, 1, &b);
    for (int r = 0; r < 20; r++) cr_assert_eq(b.lengths[r], 8);
    task_batch_free(&b);
    task_destroy(t);
}

Test(copy_task, prompts) {
    train_task *t = make_copy(9, 10, 1);
    int prompt[32], expected[32], P, G;
    for (int k = 0; k < 50; k++) {
        ab_rng rng = task_row_rng(3, TASK_STREAM_GEN, (uint64_t)k, 0);
        t->prompt(t, &rng, prompt, &P, expected, &G);
        cr_assert(G >= 1 && G <= 9 && P == G + 1 && P <= t->max_prompt && G <= t->max_gen);
        cr_assert(P + G - 1 <= t->seq_len);
        cr_assert_eq(prompt[G], COPY_SEP);
        for (int i = 0; i < G; i++) cr_assert_eq(expected[i], prompt[i]);
    }
    task_destroy(t);
}

Test(copy_task, noise_zero_is_the_noiseless_task) {
    /* noise 0 draws nothing: the rows are the noiseless task's bit for bit, and the
     * canonical options do not mention it (runs from before the option resume) */
    train_task *a = make_copy(9, 10, 1), *z = make_task("{\"name\": \"copy\", \"max_symbols\": 9, \"noise\": 0}");
    task_batch ba, bz;
    cr_assert_eq(task_batch_alloc(a, 64, &ba), 0);
    cr_assert_eq(task_batch_alloc(z, 64, &bz), 0);
    task_batch_fill(a, 4, TASK_STREAM_DATA, 2, &ba);
    task_batch_fill(z, 4, TASK_STREAM_DATA, 2, &bz);
    size_t n = (size_t)64 * (size_t)a->seq_len;
    cr_assert(memcmp(ba.tokens, bz.tokens, sizeof(int) * n) == 0);
    cr_assert(memcmp(ba.targets, bz.targets, sizeof(int) * n) == 0);
    json_t *ja = a->to_json(a), *jz = z->to_json(z);
    cr_assert(json_equal(ja, jz), "noise 0 changed the canonical task options");
    cr_assert_null(json_object_get(jz, "noise"));
    json_decref(ja);
    json_decref(jz);
    task_batch_free(&ba);
    task_batch_free(&bz);
    task_destroy(a);
    task_destroy(z);
}

Test(copy_task, loss_floor_hand_values) {
    /* q = 1 - p + p/S, floor = -(q ln q + (S - 1)(p/S) ln(p/S)); values from the
     * formula in double precision by hand (Python's math.log) */
    cr_assert_eq(copy_loss_floor(0, 10), 0.0);
    cr_assert_float_eq(copy_loss_floor(0.01, 10), 0.07112917546111897, 1e-15);
    cr_assert_float_eq(copy_loss_floor(0.2, 4), 0.5875009311062073, 1e-15);
    cr_assert_float_eq(copy_loss_floor(1, 10), log(10.0), 1e-15); /* a random copy: ln S */
    cr_assert_eq(copy_loss_floor(0.3, 1), 0.0);                   /* one symbol: nothing to get wrong */
}

Test(copy_task, noisy_rows) {
    /* p = 0.2 over S = 4: the layout, separator and clean first half are unchanged, the
     * targets are still the next tokens, and a copied target differs from the symbol to
     * copy with probability p (1 - 1/S) = 0.15: over the n copied positions of 4000
     * rows (about 22000), the count is within 5 binomial standard deviations (about
     * 0.0024 n; a chance failure has probability below 1e-6). The oracle that knows
     * the symbol to copy and predicts q on it and p/S on the others then has a mean
     * loss within 5 standard errors of copy_loss_floor: the data's noise is the one the
     * floor assumes. Generation prompts and continuations stay clean. */
    const int X = 10, S = 4;
    const double p = 0.2;
    train_task *t = make_task("{\"name\": \"copy\", \"max_symbols\": 10, \"symbols\": 4, \"noise\": 0.2}");
    json_t *j = t->to_json(t);
    cr_assert_float_eq(json_real_value(json_object_get(j, "noise")), p, 0);
    json_decref(j);
    int N = t->seq_len;
    task_batch b;
    cr_assert_eq(task_batch_alloc(t, 4000, &b), 0);
    task_batch_fill(t, 7, TASK_STREAM_DATA, 1, &b);
    long n = 0, changed = 0;
    double q = 1 - p + p / S, loss = 0, loss2 = 0;
    for (int r = 0; r < b.B; r++) {
        const int *tok = b.tokens + r * N, *tg = b.targets + r * N;
        const float *w = b.weights + r * N;
        int L = b.lengths[r] / 2;
        cr_assert(L >= 1 && L <= X);
        for (int i = 0; i < L; i++) cr_assert(tok[i] >= COPY_FIRST_SYMBOL && tok[i] < COPY_FIRST_SYMBOL + S);
        cr_assert_eq(tok[L], COPY_SEP);
        for (int i = 0; i < 2 * L - 1; i++) cr_assert_eq(tg[i], tok[i + 1], "row %d: target %d", r, i);
        for (int i = L; i < 2 * L; i++) {
            cr_assert_eq(w[i], 1.0f);
            cr_assert(tg[i] >= COPY_FIRST_SYMBOL && tg[i] < COPY_FIRST_SYMBOL + S, "row %d: copied %d", r, tg[i]);
            bool right = tg[i] == tok[i - L];
            n++;
            changed += !right;
            double l = right ? -log(q) : -log(p / S);
            loss += l;
            loss2 += l * l;
        }
    }
    double rate = p * (1 - 1.0 / S), sd = sqrt(rate * (1 - rate) / (double)n);
    double got = (double)changed / (double)n;
    double mean = loss / (double)n, se = sqrt((loss2 / (double)n - mean * mean) / (double)n);
    if (tu_verbose())
        printf("noisy copy: %ld of %ld changed (%.5f, expected %.5f +- %.5f); oracle loss %.5f, floor %.5f +- %.5f\n",
               changed, n, got, rate, sd, mean, copy_loss_floor(p, S), se);
    cr_assert_lt(fabs(got - rate), 5 * sd, "changed fraction %g, expected %g +- %g", got, rate, sd);
    cr_assert_lt(fabs(mean - copy_loss_floor(p, S)), 5 * se, "oracle loss %g vs floor %g", mean,
                 copy_loss_floor(p, S));
    /* the derivation: copy_draw with the same options from the row's cursor */
    int d[2 * 10 + 1];
    copy_options o = {X, S, 1, p};
    for (int r = 0; r < 16; r++) {
        ab_rng rng = task_row_rng(7, TASK_STREAM_DATA, 1, (uint64_t)r);
        int L = copy_draw(&o, &rng, d);
        cr_assert_eq(b.lengths[r], 2 * L);
        cr_assert(memcmp(d + 1, b.targets + r * N, sizeof(int) * (size_t)N) == 0);
    }
    int prompt[16], expected[16], P, G;
    for (int k = 0; k < 200; k++) {
        ab_rng rng = task_row_rng(3, TASK_STREAM_GEN, (uint64_t)k, 0);
        t->prompt(t, &rng, prompt, &P, expected, &G);
        cr_assert(P == G + 1 && prompt[G] == COPY_SEP);
        for (int i = 0; i < G; i++) cr_assert_eq(expected[i], prompt[i], "prompt %d: continuation not clean", k);
    }
    task_batch_free(&b);
    task_destroy(t);
}

Test(copy_task, bad_options) {
    const char *bad[][2] = {
        {"{\"name\": \"copy\", \"max_symbol\": 3}", "unknown key 'task.max_symbol'"},
        {"{\"name\": \"copy\", \"max_symbols\": 0}", "'task.max_symbols' = 0 is outside"},
        {"{\"name\": \"copy\", \"max_symbols\": \"8\"}", "'task.max_symbols' must be an integer"},
        {"{\"name\": \"copy\", \"max_symbols\": 4, \"min_symbols\": 5}", "'task.min_symbols' = 5 is larger"},
        {"{\"name\": \"copy\", \"noise\": -0.1}", "'task.noise' = -0.1 is outside [0, 1]"},
        {"{\"name\": \"copy\", \"noise\": 1.5}", "'task.noise' = 1.5 is outside [0, 1]"},
        {"{\"name\": \"copy\", \"noise\": \"0.1\"}", "'task.noise' must be a number"},
        {"{\"name\": \"mnist\"}", "'task.name' = 'mnist' is not a task"},
        {"{\"max_symbols\": 4}", "'task.name' must be a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *j = parse_json(bad[i][0]);
        train_task *t = (train_task *)1;
        cr_expect_lt(task_create(j, &t), 0, "accepted %s", bad[i][0]);
        cr_expect_null(t);
        cr_expect(strstr(ab_error(), bad[i][1]) != NULL, "message '%s' lacks '%s'", ab_error(), bad[i][1]);
        json_decref(j);
    }
}

/* ---- one training step against the references ---- */

static const char *const TINY_FMT =
    "{\"name\": \"tiny\", \"task\": {\"name\": \"copy\", \"max_symbols\": 3, \"symbols\": 3},"
    " \"model\": {\"d_model\": 8, \"heads\": 2, \"layers\": 2, \"d_ff\": 16, \"dropout\": 0.0,"
    "             \"attention\": {\"variant\": \"%s\"}},"
    " \"optim\": {\"kind\": \"radam\", \"lr\": 0.01, \"clip_norm\": %g, \"weight_decay\": 0.05,"
    "           \"schedule\": {\"milestones\": [3], \"gamma\": 0.5}},"
    " \"steps\": 8, \"batch\": 3, \"eval_every\": 4, \"eval_batches\": 2, \"seed\": 21}";

static trainer *make_trainer(const char *variant, double clip) {
    char buf[1024];
    snprintf(buf, sizeof buf, TINY_FMT, variant, clip);
    if (strcmp(variant, "lsh") == 0) { /* options: 2 rounds, chunks of 2 of the 6 positions */
        char *v = strstr(buf, "\"lsh\"");
        char rest[1024];
        snprintf(rest, sizeof rest, "%s", v + 5);
        snprintf(v, sizeof buf - (size_t)(v - buf), "\"lsh\", \"set\": {\"rounds\": 2, \"chunk\": 2, \"bits\": 2}%s", rest);
    }
    json_t *j = parse_json(buf);
    train_config c;
    cr_assert_eq(train_config_parse(j, &c), 0, "%s", ab_error());
    json_decref(j);
    trainer *t = NULL;
    cr_assert_eq(trainer_create(&c, &t), 0, "%s", ab_error());
    if (strcmp(variant, "lsh") == 0) { /* the options reached the model */
        const tf_config *mc = tf_get_config(t->model);
        cr_assert_eq(mc->n_attn_settings, 3);
        cr_assert_str_eq(mc->attn_settings[0], "rounds=2");
        cr_assert_str_eq(mc->attn_settings[1], "chunk=2");
    }
    return t;
}

typedef struct {
    const tf_model *m;
    ref_model_cfg rc;
    double *pd;
    const task_batch *b;
    double *weights;
} step_ctx;

static void ref_loss_fn(void *c_, double *out) {
    step_ctx *c = c_;
    ref_params rp = tm_ref_params(c->m, c->pd);
    int B = c->b->B, N = c->b->N, V = c->rc.V;
    double *logits = tu_alloc_d((size_t)B * N * V);
    ref_model_logits(&c->rc, &rp, c->b->tokens, B, N, c->b->lengths, logits);
    out[0] = ref_cross_entropy(logits, c->b->targets, c->weights, B * N, V);
    free(logits);
}

/* Tolerances. Loss: the float model against the double reference, two layers and the
 * head: measured <= 3e-8 relative; 1e-5 as in the model suite. Gradients: against
 * central differences of the double reference loss (h = 1e-5): measured <= 2e-6
 * tensor-relative; 5e-5 as in the model suite (a missing term gives 1e-2 or more).
 * Update: given the same (our) gradient, the reference optimiser in double and ours in
 * float differ by the rounding of float parameters and moments: |p| < 4 here, so one
 * float ulp is <= 4.8e-7; measured <= 2.4e-7; 2e-6 leaves 8x, while a wrong clip
 * scale, learning rate, bias correction or decay (every one of them changes the
 * update by >= 5% of lr = 1e-2 x 0.5 = 5e-3 ... 1e-2) is caught by orders of magnitude. */
#define STEP_LOSS_TOL 1e-5
#define FD_STEP_SIZE 1e-5
#define STEP_GRAD_TOL 5e-5
#define STEP_UPDATE_TOL 2e-6

static void step_case(const char *variant) {
    trainer *t = make_trainer(variant, 0.5);
    tf_model *m = t->model;
    size_t np = tf_param_count(m);
    const tf_config *mc = tf_get_config(m);
    ref_model_cfg rc = {mc->vocab, mc->d_model, mc->heads, mc->layers, mc->d_ff, mc->pre_norm, mc->final_norm,
                        mc->causal, strcmp(variant, "softmax") == 0 ? REF_ATTN_SOFTMAX : REF_ATTN_LINEAR_ELU, 0, 0, false, 0, 0, 0};
    bool *decay = calloc(np, sizeof(bool));
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *p = tf_param_tensor(m, i);
        for (size_t j = 0; j < p->count; j++) decay[p->offset + j] = p->decay;
    }
    const ab_optim_config *oc = &t->cfg.optim;
    ref_optim_cfg roc = {1, oc->lr, oc->beta1, oc->beta2, oc->eps, oc->weight_decay, oc->decoupled_decay,
                         oc->clip_norm, oc->rectify_threshold, oc->n_milestones, oc->milestones, oc->gamma, oc->warmup};
    double *rm = tu_alloc_d(np), *rv = tu_alloc_d(np), *fd = tu_alloc_d(np), one = 1.0;
    int rectified_steps = 0, clipped_steps = 0;
    double worst_g = 0, worst_u = 0, worst_l = 0;
    for (long long s = 1; s <= 7; s++) {
        double *p0 = tu_to_double(tf_params(m), np);
        task_batch_fill(t->cfg.task, t->cfg.seed, TASK_STREAM_DATA, (uint64_t)s, &t->batch);
        train_step_info info;
        cr_assert_eq(trainer_step(t, &info), 0, "%s", ab_error());
        cr_assert_eq(t->step, s);
        cr_assert_eq(t->losses[s - 1], info.loss);
        /* the loss and the gradient at p0 */
        step_ctx ctx = {m, rc, p0, &t->batch, tu_alloc_d((size_t)t->batch.B * t->batch.N)};
        for (int i = 0; i < t->batch.B * t->batch.N; i++) ctx.weights[i] = t->batch.weights[i];
        double want;
        ref_loss_fn(&ctx, &want);
        double le = fabs(info.loss - want) / want;
        worst_l = fmax(worst_l, le);
        cr_expect_lt(le, STEP_LOSS_TOL, "%s step %lld: loss %g, reference %g", variant, s, info.loss, want);
        tu_fd_grad(ref_loss_fn, &ctx, p0, np, &one, 1, FD_STEP_SIZE, fd);
        const float *g = tf_grads(m);
        for (int i = 0; i < tf_param_tensor_count(m); i++) {
            const tf_tensor *p = tf_param_tensor(m, i);
            double e = tu_rel_err(g + p->offset, fd + p->offset, p->count, 1e-30);
            worst_g = fmax(worst_g, e);
            cr_expect_lt(e, STEP_GRAD_TOL, "%s step %lld: gradient of %s err %g", variant, s, p->name, e);
        }
        /* the update: the reference optimiser from p0 with our gradient */
        double *gd = tu_to_double(g, np);
        int rect;
        double norm = ref_optim_step(&roc, s, (int)np, p0, gd, rm, rv, decay, &rect);
        rectified_steps += rect;
        clipped_steps += norm > oc->clip_norm;
        cr_expect(fabs(info.grad_norm - norm) <= 1e-6 * norm, "%s step %lld: grad norm %g vs %g", variant, s,
                  info.grad_norm, norm);
        cr_expect(fabs(info.lr - ref_optim_lr(&roc, s)) <= 1e-12, "%s step %lld: lr %g", variant, s, info.lr);
        double maxabs = 0;
        const float *pn = tf_params(m);
        for (size_t i = 0; i < np; i++) {
            double e = fabs(pn[i] - p0[i]);
            worst_u = fmax(worst_u, e);
            maxabs = fmax(maxabs, fabs(p0[i]));
        }
        cr_assert_lt(maxabs, 4.0, "parameters grew past the range the tolerance assumes");
        cr_expect_lt(worst_u, STEP_UPDATE_TOL, "%s step %lld: updated parameters differ by %g", variant, s, worst_u);
        free(gd);
        free(ctx.weights);
        free(p0);
    }
    if (tu_verbose())
        fprintf(stderr, "train step %s: loss err %.3g, grad err %.3g, update err %.3g (%d clipped, %d rectified)\n",
                variant, worst_l, worst_g, worst_u, clipped_steps, rectified_steps);
    /* the test exercised clipping, the un-rectified (1..5) and rectified (6, 7) RAdam
     * branches and the schedule's milestone (step 4 on) */
    cr_expect_gt(clipped_steps, 0, "clipping never active");
    cr_expect_eq(rectified_steps, 2, "rectified steps: %d", rectified_steps);
    free(rm);
    free(rv);
    free(fd);
    free(decay);
    trainer_destroy(t);
}

Test(train_step, tiny_softmax_against_reference) { step_case("softmax"); }
Test(train_step, tiny_linear_against_reference) { step_case("linear"); }

/* ---- save and restore ---- */

static void scratch(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/train-test", TEST_DATA_DIR);
    mkdir(TEST_DATA_DIR, 0777);
    mkdir(buf, 0777);
    snprintf(buf, cap, "%s/train-test/%s", TEST_DATA_DIR, name);
}

static void restore_case(const char *variant) {
    char path[600];
    scratch(path, sizeof path, "restore.bin");
    trainer *a = make_trainer(variant, 0.0), *b = make_trainer(variant, 0.0);
    train_step_info info;
    for (int s = 0; s < 8; s++) cr_assert_eq(trainer_step(a, &info), 0, "%s", ab_error());
    for (int s = 0; s < 3; s++) cr_assert_eq(trainer_step(b, &info), 0, "%s", ab_error());
    b->step_s = 1.25;
    b->step_cpu_s = 1.5;
    cr_assert_eq(b->positions, 3.0 * (double)b->batch.B * b->batch.N, "3 steps of B x N positions");
    cr_assert_eq(trainer_save(b, path, 7.5, 6.25), 0, "%s", ab_error());
    trainer_destroy(b);
    /* a fresh trainer from the same config continues from the file */
    trainer *c = make_trainer(variant, 0.0);
    ab_ckpt_reader *r;
    json_t *cfg;
    cr_assert_eq(train_ckpt_open(path, &r, &cfg), 0, "%s", ab_error());
    char key[128];
    cr_assert_eq(train_config_diff(cfg, c->cfg.canon, key, sizeof key), 0, "config differs at %s", key);
    cr_assert_eq(trainer_restore(c, r), 0, "%s", ab_error());
    ab_ckpt_close(r);
    json_decref(cfg);
    cr_assert_eq(c->step, 3);
    cr_assert_eq(c->elapsed_s, 7.5);
    cr_assert_eq(c->step_s, 1.25);
    cr_assert_eq(c->cpu_s, 6.25);
    cr_assert_eq(c->step_cpu_s, 1.5);
    cr_assert_eq(c->positions, 3.0 * (double)c->batch.B * c->batch.N);
    for (int s = 0; s < 5; s++) cr_assert_eq(trainer_step(c, &info), 0, "%s", ab_error());
    size_t np = tf_param_count(a->model);
    cr_assert(memcmp(tf_params(a->model), tf_params(c->model), sizeof(float) * np) == 0,
              "%s: restored run's parameters differ from the uninterrupted run", variant);
    cr_assert(memcmp(a->losses, c->losses, sizeof(double) * 8) == 0, "%s: losses differ", variant);
    const void *sa, *sc;
    size_t na, nc;
    ab_optim_state(a->opt, &sa, &na);
    ab_optim_state(c->opt, &sc, &nc);
    cr_assert(na == nc && memcmp(sa, sc, na) == 0, "%s: optimiser states differ", variant);
    trainer_destroy(a);
    trainer_destroy(c);
}

/* lsh: fresh rotations every step, from the step's seed */
Test(train_restore, bit_identical_linear) { restore_case("linear"); }
Test(train_restore, bit_identical_lsh) { restore_case("lsh"); }

Test(train_restore, refuses_other_model) {
    char path[600];
    scratch(path, sizeof path, "other.bin");
    trainer *a = make_trainer("linear", 0.0);
    cr_assert_eq(trainer_save(a, path, 0, 0), 0, "%s", ab_error());
    /* a model of another size: the parameter count differs */
    json_t *j = parse_json("{\"name\": \"x\", \"task\": {\"name\": \"copy\", \"max_symbols\": 3, \"symbols\": 3},"
                           " \"model\": {\"d_model\": 16, \"heads\": 2, \"attention\": {\"variant\": \"linear\"}},"
                           " \"seed\": 21}");
    train_config c;
    cr_assert_eq(train_config_parse(j, &c), 0, "%s", ab_error());
    json_decref(j);
    trainer *b;
    cr_assert_eq(trainer_create(&c, &b), 0, "%s", ab_error());
    ab_ckpt_reader *r;
    json_t *cfg;
    cr_assert_eq(train_ckpt_open(path, &r, &cfg), 0, "%s", ab_error());
    char key[128];
    cr_assert_eq(train_config_diff(cfg, b->cfg.canon, key, sizeof key), 1);
    cr_assert_str_eq(key, "model.d_model");
    cr_assert_lt(trainer_restore(b, r), 0);
    cr_assert(strstr(ab_error(), "parameters"), "%s", ab_error());
    ab_ckpt_close(r);
    json_decref(cfg);
    trainer_destroy(a);
    trainer_destroy(b);
}

/* ---- config ---- */

Test(train_config, errors_name_the_key) {
    const char *base = "\"name\": \"x\", \"task\": {\"name\": \"copy\", \"max_symbols\": 4}";
    const char *bad[][2] = {
        {"\"model\": {\"attention\": {\"variant\": \"linear\"}}, \"stepz\": 3", "unknown key 'stepz'"},
        {"\"model\": {\"attention\": {\"variant\": \"linear\"}}, \"steps\": \"3\"", "'steps' must be an integer"},
        {"\"model\": {\"attention\": {\"variant\": \"linear\"}}, \"batch\": 0", "'batch' = 0 is outside"},
        {"\"model\": {\"attention\": {\"variant\": \"bogus\"}}", "'model.attention.variant' = 'bogus'"},
        {"\"model\": {\"attention\": {\"variant\": \"lsh\", \"set\": {\"roundz\": 2}}}", "has no option 'roundz'"},
        {"\"model\": {\"attention\": {\"variant\": \"lsh\", \"set\": {\"rounds\": [2]}}}",
         "'model.attention.set.rounds' must be a string or a number"},
        {"\"model\": {\"d_model\": 10, \"heads\": 4, \"attention\": {\"variant\": \"linear\"}}",
         "'model.d_model' = 10 is not divisible by 'model.heads' = 4"},
        {"\"model\": {\"dropout\": 1.5, \"attention\": {\"variant\": \"linear\"}}", "'model.dropout' = 1.5"},
        {"\"model\": {\"widht\": 3, \"attention\": {\"variant\": \"linear\"}}", "unknown key 'model.widht'"},
        {"\"model\": {}", "missing key 'model.attention'"},
        {"\"model\": {\"attention\": {\"variant\": \"linear\"}}, \"optim\": {\"lr\": -1}", "'optim.lr'"},
        {"\"model\": {\"attention\": {\"variant\": \"linear\"}}, \"optim\": {\"kind\": \"sgd\"}", "'optim.kind'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char buf[1024];
        snprintf(buf, sizeof buf, "{%s, %s}", base, bad[i][0]);
        json_t *j = parse_json(buf);
        train_config c;
        cr_expect_lt(train_config_parse(j, &c), 0, "accepted %s", buf);
        cr_expect(strstr(ab_error(), bad[i][1]) != NULL, "message '%s' lacks '%s'", ab_error(), bad[i][1]);
        cr_expect(strchr(ab_error(), '\n') == NULL);
        json_decref(j);
    }
    /* no task, no name */
    json_t *j = parse_json("{\"name\": \"x\", \"model\": {\"attention\": {\"variant\": \"linear\"}}}");
    train_config c;
    cr_expect_lt(train_config_parse(j, &c), 0);
    cr_expect(strstr(ab_error(), "missing key 'task'"), "%s", ab_error());
    json_decref(j);
}

Test(train_config, canonical_form_and_diff) {
    json_t *j = parse_json("{\"name\": \"x\", \"task\": {\"name\": \"copy\", \"max_symbols\": 4},"
                           " \"model\": {\"attention\": {\"variant\": \"lsh\", \"set\": {\"rounds\": 4}}}}");
    train_config c;
    cr_assert_eq(train_config_parse(j, &c), 0, "%s", ab_error());
    /* defaults filled in; the model's vocabulary and length follow the task */
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(c.canon, "task"), "symbols")), 10);
    cr_assert_eq(json_integer_value(json_object_get(c.canon, "steps")), 1000);
    cr_assert_not_null(json_object_get(json_object_get(c.canon, "optim"), "schedule"));
    cr_assert_eq(c.model.vocab, 12);
    cr_assert_eq(c.model.max_len, 8);
    cr_assert_str_eq(c.model.attention, "lsh");
    cr_assert_str_eq(c.model.attn_settings[0], "rounds=4");
    /* parsing the canonical form gives the same canonical form */
    train_config c2;
    cr_assert_eq(train_config_parse(c.canon, &c2), 0, "%s", ab_error());
    cr_assert(json_equal(c.canon, c2.canon));
    char key[128];
    cr_assert_eq(train_config_diff(c.canon, c2.canon, key, sizeof key), 0);
    /* resumable keys may differ; others are named */
    json_object_set_new(c2.canon, "steps", json_integer(5));
    json_object_set_new(c2.canon, "log_every", json_integer(5));
    cr_assert_eq(train_config_diff(c.canon, c2.canon, key, sizeof key), 0);
    json_object_set_new(json_object_get(json_object_get(c2.canon, "model"), "attention"), "set", json_object());
    cr_assert_eq(train_config_diff(c.canon, c2.canon, key, sizeof key), 1);
    cr_assert_str_eq(key, "model.attention.set.rounds");
    json_object_set_new(json_object_get(json_object_get(c2.canon, "model"), "attention"), "set",
                        json_pack("{s:i}", "rounds", 4));
    json_object_set_new(c2.canon, "batch", json_integer(5));
    cr_assert_eq(train_config_diff(c.canon, c2.canon, key, sizeof key), 1);
    cr_assert_str_eq(key, "batch");
    train_config_free(&c);
    train_config_free(&c2);
    json_decref(j);
}

/* Issue 16, defect 8: tf_param_count_for gives the count of the model tf_create would
 * build, without building it: inputs, bodies, heads and options that change the
 * parameters; a config tf_create refuses is refused with the same message; a model of
 * billions of parameters is sized without a byte allocated. */
Test(train_config, param_count_for_equals_the_created_model) {
    tf_config base;
    tf_config_default(&base);
    base.vocab = 7;
    base.max_len = 6;
    base.d_model = 8;
    base.heads = 2;
    base.layers = 2;
    base.d_ff = 12;
    base.lstm_hidden = 5;
    base.attention = "linear";
    tf_config cs[6];
    for (int i = 0; i < 6; i++) cs[i] = base;
    cs[1].final_norm = !base.final_norm;
    cs[1].classes = 3;
    cs[2].input = TF_INPUT_FRAMES;
    cs[2].features = 4;
    cs[2].classes = 5;
    cs[2].layers = 3;
    cs[3].body = TF_BODY_LSTM;
    cs[3].causal = false;
    cs[3].bidirectional = true;
    cs[4].body = TF_BODY_LSTM;
    cs[4].bidirectional = false;
    cs[4].layers = 1;
    cs[5].attention = "softmax";
    cs[5].pre_norm = true;
    for (int i = 0; i < 6; i++) {
        size_t want = 0;
        cr_assert_eq(tf_param_count_for(&cs[i], &want), 0, "config %d: %s", i, ab_error());
        tf_model *m;
        cr_assert_eq(tf_create(&cs[i], 2, &m), 0, "config %d: %s", i, ab_error());
        cr_expect_eq(want, tf_param_count(m), "config %d: sized %zu, created %zu", i, want, tf_param_count(m));
        tf_destroy(m);
    }
    /* refused like tf_create */
    tf_config bad = base;
    bad.heads = 3;
    size_t n = 99;
    cr_assert_eq(tf_param_count_for(&bad, &n), AB_EINVAL);
    cr_assert(strstr(ab_error(), "not divisible by heads 3"), "%s", ab_error());
    cr_assert_eq(n, 0u);
    /* 12 C^2 L for C = 65536, L = 4: 2e11 parameters (800 GB), sized for free */
    tf_config huge = base;
    huge.d_model = 65536;
    huge.heads = 1;
    huge.d_ff = 4 * 65536;
    huge.layers = 4;
    size_t before = ab_mem_current(AB_DEV_CPU);
    ab_mem_reset_peak(AB_DEV_CPU);
    cr_assert_eq(tf_param_count_for(&huge, &n), 0, "%s", ab_error());
    cr_assert_gt(n, (size_t)12 * 65536 * 65536 * 4);
    cr_assert_eq(ab_mem_peak(AB_DEV_CPU), before, "sizing allocated tracked memory");
}

/* Issue 16, defect 8: a checkpoint's parameters are checked against its config's model
 * before the model exists: here a config edited to a 1.6-billion-parameter model. */
Test(train_restore, check_model_before_allocating) {
    char path[600];
    scratch(path, sizeof path, "edited.bin");
    trainer *a = make_trainer("linear", 0.0);
    cr_assert_eq(trainer_save(a, path, 0, 0), 0, "%s", ab_error());
    ab_ckpt_reader *r;
    json_t *cfg;
    cr_assert_eq(train_ckpt_open(path, &r, &cfg), 0, "%s", ab_error());
    cr_assert_eq(train_ckpt_check_model(r, &a->cfg.model, NULL), 0, "%s", ab_error());
    tf_config big = a->cfg.model;
    big.d_model = 8192;
    big.heads = 8;
    big.d_ff = 4 * 8192;
    size_t before = ab_mem_current(AB_DEV_CPU);
    ab_mem_reset_peak(AB_DEV_CPU);
    train_ckpt_state st;
    cr_assert_eq(train_ckpt_check_model(r, &big, &st), AB_EINVAL);
    cr_assert(strstr(ab_error(), path) && strstr(ab_error(), "parameters, its config's model has"), "%s", ab_error());
    cr_assert_eq(ab_mem_peak(AB_DEV_CPU), before, "checking allocated tracked memory");
    ab_ckpt_close(r);
    json_decref(cfg);
    trainer_destroy(a);
}
