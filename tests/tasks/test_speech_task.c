/* The speech task (experiments/tasks/speech/speech_task.h) and `attnbench decode`, on a tiny
 * corpus of synthetic speech the tests write: utterances of 3 to 6 "phones" out of 4,
 * each phone a tone of its own pitch for 80 to 160 ms, between short stretches of
 * quiet noise, as 16 kHz WAVs in Kaldi data directories train/ (12 utterances),
 * valid/ and test/ (4 each) with a phones.txt beside them, as get-data.sh lays out
 * festvox-ru.
 * - The task's rows: frames stacked and subsampled exactly as documented (compared with
 *   the features speech_data.h loads), the phones as label sequences, the inventory of
 *   phones.txt, utterance ids and phone names; a batch cut to its longest row.
 * - Training through `attnbench train` with a non-causal transformer and with a
 *   bidirectional LSTM, on the CPU and on the CUDA backend (attnbench-emu, its device
 *   emulated on the CPU): the loss falls, a run stopped in the middle of an epoch and
 *   resumed ends bit for bit where the uninterrupted run does, CUDA agrees with the
 *   CPU; `attnbench decode` over the whole test split gives the run's test PER.
 * - Bad configs and data: one line naming the key, the file or the utterance, exit 2,
 *   nothing written; a resume on changed audio is refused. */
#include <criterion/criterion.h>

#include "checkpoint.h"
#include "error.h"
#include "memory.h"
#include "speech_data.h"
#include "task.h"
#include "task_list.h"
#include "test_proc.h"
#include "test_run.h"

#include <glob.h>
#include <jansson.h>
#include <math.h>
#include <sndfile.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char g_dir[600];
static char *g_out, *g_err;
static const char *g_exe = ATTNBENCH_EXE;

static void setup(void) {
    task_list_install();
    tp_scratch_make(g_dir, sizeof g_dir, TEST_DATA_DIR "/speech-task-tmp");
}

static void teardown(void) {
    tp_rm_tree(g_dir);
    free(g_out);
    free(g_err);
    g_out = g_err = NULL;
}

TestSuite(speech_task, .init = setup, .fini = teardown, .timeout = 300);

/* A path in the scratch folder (tp_path). */
#define P(...) tp_path(g_dir, __VA_ARGS__)

#define run(...) tp_wait(g_dir, tp_spawn(g_dir, g_exe, NULL, TP_ARGV("--threads", "1", __VA_ARGS__, NULL)), &g_out, &g_err)

static void put(const char *path, const char *text) { tp_write_bytes(path, text, strlen(text)); }

/* ---- the corpus ---- */

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static double unif(void) { /* xorshift64*: a fixed sequence in [0, 1) */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (double)((g_rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static const char *const PHONES[4] = {"a", "b", "c", "d"};
static const double PITCH[4] = {300, 700, 1300, 2200}; /* Hz */
static const char *const SPLITS[3] = {"train", "valid", "test"};
static const int UTTS[3] = {12, 4, 4};
enum { RATE = 16000, MAX_SAMPLES = RATE * 2 };

/* One utterance: 50 ms of quiet, its phones (80..160 ms each), 50 ms of quiet, as a
 * WAV at PATH; its phones' ids into ph (3..6 of them), returned. */
static int write_utterance(const char *path, int *ph) {
    static short s[MAX_SAMPLES];
    const int n = 3 + (int)(unif() * 4);
    long i = 0;
    for (; i < RATE / 20; i++) s[i] = (short)lrint((unif() - 0.5) * 200);
    for (int k = 0; k < n; k++) {
        ph[k] = (int)(unif() * 4);
        const long len = (long)(RATE * (0.08 + 0.08 * unif()));
        for (long j = 0; j < len; j++, i++)
            s[i] = (short)lrint(6000 * sin(2 * M_PI * PITCH[ph[k]] * (double)j / RATE) + (unif() - 0.5) * 200);
    }
    for (long j = 0; j < RATE / 20; j++, i++) s[i] = (short)lrint((unif() - 0.5) * 200);
    SF_INFO info = {.samplerate = RATE, .channels = 1, .format = SF_FORMAT_WAV | SF_FORMAT_PCM_16};
    SNDFILE *sf = sf_open(path, SFM_WRITE, &info);
    cr_assert_not_null(sf, "cannot write %s: %s", path, sf_strerror(NULL));
    cr_assert_eq(sf_writef_short(sf, s, i), i);
    sf_close(sf);
    return n;
}

/* The corpus in DIR (under the scratch folder): DIR/{train,valid,test}/ with wav.scp,
 * text and utt2spk (one speaker), DIR/phones.txt, the WAVs in DIR/wav/. */
static const char *corpus(const char *name) {
    g_rng = 0x2545F4914F6CDD1Dull; /* the same corpus in every test */
    mkdir(P("%s", name), 0755);
    mkdir(P("%s/wav", name), 0755);
    for (int sp = 0; sp < 3; sp++) {
        mkdir(P("%s/%s", name, SPLITS[sp]), 0755);
        char scp[8000] = "", text[8000] = "", spk[8000] = "", line[1400];
        for (int u = 0; u < UTTS[sp]; u++) {
            char id[32], wav[1200];
            snprintf(id, sizeof id, "%s_%02d", SPLITS[sp], u);
            snprintf(wav, sizeof wav, "%s", P("%s/wav/%s.wav", name, id));
            int ph[8], n = write_utterance(wav, ph);
            snprintf(line, sizeof line, "%s %s\n", id, wav);
            strcat(scp, line);
            snprintf(line, sizeof line, "%s", id);
            for (int k = 0; k < n; k++) strcat(strcat(line, " "), PHONES[ph[k]]);
            strcat(strcat(text, line), "\n");
            snprintf(line, sizeof line, "%s spk\n", id);
            strcat(spk, line);
        }
        put(P("%s/%s/wav.scp", name, SPLITS[sp]), scp);
        put(P("%s/%s/text", name, SPLITS[sp]), text);
        put(P("%s/%s/utt2spk", name, SPLITS[sp]), spk);
    }
    put(P("%s/phones.txt", name), "<eps> 0\na 1\nb 2\nc 3\nd 4\n");
    return P("%s", name);
}

static json_t *parse(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    cr_assert_not_null(j, "bad JSON in the test: %s", e.text);
    return j;
}

/* ---- the rows ---- */

/* The task config of the corpus in DIR with 3 frames stacked every 2. */
static json_t *stacked_config(const char *dir) {
    char text[1400];
    snprintf(text, sizeof text, "{\"name\": \"speech\", \"path\": \"%s\", \"stack\": 3, \"subsample\": 2}", dir);
    return parse(text);
}

/* Rows against the features speech_data.h loads from the same directories: position j
 * of a row is frames j s .. j s + k - 1 side by side (the last frame repeated past the
 * end), zeros beyond the row's ceil(T / s) positions; labels are the phones. */
Test(speech_task, rows_are_stacked_subsampled_frames_and_phones) {
    const char *dir = corpus("c");
    json_t *cfg = stacked_config(dir);
    train_task *t;
    cr_assert_eq(task_create(cfg, &t), 0, "%s", ab_error());
    json_decref(cfg);
    cr_expect_str_eq(t->name, "speech");
    cr_expect_eq(t->input, TASK_INPUT_FRAMES);
    cr_expect_eq(t->features, 3 * 40);
    cr_expect_str_eq(t->head, "ctc");
    cr_expect_eq(t->classes, 4, "the phones of phones.txt");
    cr_expect_not(t->causal);
    cr_expect(t->pad_to_longest);
    cr_assert_eq(t->n_splits, 3);
    int longest = 0, most = 0;
    sd_options o;
    sd_options_default(&o);
    char phones[1200];
    snprintf(phones, sizeof phones, "%s/phones.txt", dir);
    o.phones = phones;
    sd_data d[3];
    for (int sp = 0; sp < 3; sp++) {
        cr_expect_str_eq(t->split_names[sp], SPLITS[sp]);
        cr_expect_eq(t->split_rows[sp], UTTS[sp]);
        char sub[1200];
        snprintf(sub, sizeof sub, "%s/%s", dir, SPLITS[sp]);
        cr_assert_eq(sd_load(sub, &o, sp ? &d[0].phones : NULL, &d[sp]), 0, "%s", ab_error());
        for (int u = 0; u < d[sp].n; u++) {
            const int n = (d[sp].utts[u].frames + 1) / 2;
            if (n > longest) longest = n;
            if (d[sp].utts[u].n_phones > most) most = d[sp].utts[u].n_phones;
        }
    }
    cr_expect_eq(t->seq_len, longest, "N: the longest row's positions");
    cr_expect_eq(t->max_labels, most);
    const int N = t->seq_len, F = t->features;
    float *x = malloc(sizeof(float) * (size_t)N * F);
    int *tg = malloc(sizeof(int) * N), *lab = malloc(sizeof(int) * t->max_labels), len, count;
    float *w = malloc(sizeof(float) * N);
    for (int sp = 0; sp < 3; sp++)
        for (int u = 0; u < d[sp].n; u++) {
            const sd_utt *ut = &d[sp].utts[u];
            t->fill(t, sp, u, NULL, x, tg, w, &len);
            cr_assert_eq(len, (ut->frames + 1) / 2, "%s: %d positions of %d frames", ut->id, len, ut->frames);
            int bad = 0;
            for (int j = 0; j < N; j++)
                for (int i = 0; i < 3; i++)
                    for (int c = 0; c < 40; c++) {
                        int src = 2 * j + i < ut->frames ? 2 * j + i : ut->frames - 1;
                        float want = j < len ? ut->feats[(size_t)src * 40 + c] : 0.0f;
                        bad += x[(size_t)j * F + i * 40 + c] != want;
                    }
            cr_expect_eq(bad, 0, "%s: %d values differ from the stacked frames", ut->id, bad);
            t->fill_labels(t, sp, u, lab, &count);
            cr_assert_eq(count, ut->n_phones);
            cr_expect(memcmp(lab, ut->phones, sizeof(int) * count) == 0, "%s: labels", ut->id);
            cr_expect_str_eq(t->row_name(t, sp, u), ut->id);
        }
    for (int p = 0; p < 4; p++) cr_expect_str_eq(t->label_name(t, p), PHONES[p]);
    /* a batch is cut to its longest row, each row packed at that stride */
    task_batch b;
    cr_assert_eq(task_batch_alloc(t, 4, &b), 0, "%s", ab_error());
    const long long rows[4] = {3, 0, 7, 5};
    task_batch_fill_rows(t, 0, rows, 4, &b);
    int m = 0;
    for (int r = 0; r < 4; r++) m = b.lengths[r] > m ? b.lengths[r] : m;
    cr_expect_eq(b.N, m, "the batch's N: its longest row");
    cr_expect_lt(m, N, "the corpus's rows differ in length (the cut is tested)");
    for (int r = 0; r < 4; r++) {
        t->fill(t, 0, rows[r], NULL, x, tg, w, &len);
        cr_expect(memcmp(b.frames + (size_t)r * b.N * F, x, sizeof(float) * (size_t)b.N * F) == 0, "row %d", r);
        t->fill_labels(t, 0, rows[r], lab, &count);
        cr_expect(b.label_counts[r] == count && memcmp(b.labels + (size_t)r * b.S, lab, sizeof(int) * count) == 0);
    }
    task_batch_free(&b);
    /* the canonical options: the inventory, the data's fingerprint */
    json_t *canon = t->to_json(t);
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(canon, "features"), "phones")), phones);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(canon, "rows"), "valid")), 4);
    cr_expect(json_is_integer(json_object_get(json_object_get(canon, "crc32"), "test")));
    json_decref(canon);
    for (int sp = 0; sp < 3; sp++) sd_data_free(&d[sp]);
    free(x);
    free(tg);
    free(w);
    free(lab);
    task_destroy(t);
}

/* An utterance whose text line holds only its id has no phones: its row's labels are
 * empty, and filling them reads nothing (the sanitized build checks that no null
 * pointer reaches memcpy, which it did: issue 28, defect 1). */
Test(speech_task, an_utterance_with_an_empty_transcript_has_no_labels) {
    const char *dir = corpus("c");
    put(P("c/train/text"), "train_00 a b\ntrain_01\ntrain_02 c\ntrain_03 d a\n");
    char text[1400];
    snprintf(text, sizeof text, "{\"name\": \"speech\", \"path\": \"%s\"}", dir);
    json_t *cfg = parse(text);
    train_task *t;
    cr_assert_eq(task_create(cfg, &t), 0, "%s", ab_error());
    json_decref(cfg);
    cr_assert_eq(t->split_rows[0], 4);
    int lab[8] = {-7, -7}, count = -1;
    t->fill_labels(t, 0, 1, lab, &count);
    cr_expect_eq(count, 0, "train_01's text holds only its id");
    cr_expect_eq(lab[0], -7, "nothing is written for an empty transcript");
    task_batch b;
    cr_assert_eq(task_batch_alloc(t, 4, &b), 0, "%s", ab_error());
    const long long rows[4] = {1, 0, 1, 2};
    task_batch_fill_rows(t, 0, rows, 4, &b);
    cr_expect_eq(b.label_counts[0], 0);
    cr_expect_eq(b.label_counts[1], 2);
    cr_expect_eq(b.label_counts[2], 0);
    cr_expect_eq(b.label_counts[3], 1);
    task_batch_free(&b);
    task_destroy(t);
}

/* ---- augmentation ---- */

/* `augment`: each training row gets bands of channels (in every stacked frame of every
 * position) and spans of positions set to 0, drawn from its cursor in the documented
 * order (speech_task.h); the rest of the batch is untouched; off by default. */
Test(speech_task, augment_masks_channel_bands_and_position_spans) {
    json_t *cfg = stacked_config(corpus("c"));
    train_task *t;
    cr_assert_eq(task_create(cfg, &t), 0, "%s", ab_error());
    cr_expect_null(t->augment, "no augment option: no augmentation");
    json_t *canon = t->to_json(t);
    cr_expect_null(json_object_get(canon, "augment"), "off: not in the canonical options");
    json_decref(canon);
    task_destroy(t);
    json_object_set_new(cfg, "augment", json_pack("{s:i, s:i, s:i, s:i}", "freq_masks", 2, "freq_width", 9,
                                                  "time_masks", 2, "time_width", 6));
    cr_assert_eq(task_create(cfg, &t), 0, "%s", ab_error());
    json_decref(cfg);
    cr_assert_not_null(t->augment);
    canon = t->to_json(t);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(canon, "augment"), "time_width")), 6);
    json_decref(canon);
    task_batch b;
    cr_assert_eq(task_batch_alloc(t, 4, &b), 0, "%s", ab_error());
    const long long rows[4] = {2, 9, 4, 11};
    task_batch_fill_rows(t, 0, rows, 4, &b);
    const int F = t->features, D = 40;
    const size_t row = (size_t)b.N * F;
    float *orig = malloc(sizeof(float) * row * 4), *want = malloc(sizeof(float) * row);
    memcpy(orig, b.frames, sizeof(float) * row * 4);
    long long masked = 0;
    for (int r = 0; r < 4; r++) {
        ab_rng c1 = task_row_rng(7, TASK_STREAM_AUGMENT, 3, (uint64_t)r), c2 = c1;
        t->augment(t, &c1, &b, r);
        /* the same draws by hand: bands first, then spans */
        memcpy(want, orig + (size_t)r * row, sizeof(float) * row);
        const int n = b.lengths[r];
        for (int m = 0; m < 2; m++) {
            int f = (int)ab_rng_next_below(&c2, 10), f0 = (int)ab_rng_next_below(&c2, (uint32_t)(D - f) + 1);
            for (int j = 0; j < n; j++)
                for (int i = 0; i < 3; i++)
                    for (int c = f0; c < f0 + f; c++) want[(size_t)j * F + i * D + c] = 0;
        }
        for (int m = 0; m < 2; m++) {
            int w = (int)ab_rng_next_below(&c2, 7), t0 = (int)ab_rng_next_below(&c2, (uint32_t)(n - w) + 1);
            for (int j = t0; j < t0 + w; j++)
                for (int c = 0; c < F; c++) want[(size_t)j * F + c] = 0;
        }
        int bad = 0;
        for (size_t e = 0; e < row; e++) {
            bad += b.frames[(size_t)r * row + e] != want[e];
            masked += want[e] == 0 && orig[(size_t)r * row + e] != 0;
        }
        cr_expect_eq(bad, 0, "row %d: %d values differ from the masks drawn by hand", r, bad);
        /* the rows after r are untouched so far */
        for (int q = r + 1; q < 4; q++)
            cr_expect(memcmp(b.frames + (size_t)q * row, orig + (size_t)q * row, sizeof(float) * row) == 0);
    }
    cr_expect_gt(masked, 0, "some values were masked");
    free(orig);
    free(want);
    task_batch_free(&b);
    task_destroy(t);
}

/* ---- training ---- */

/* A run config: 4 epochs of batches of 4 over the 12 training utterances (3 steps an
 * epoch), stacking 2 frames every 2, evaluation on valid every 3 steps, the test split
 * at the end; the features cached in DIR/cache. */
static const char *run_config(const char *dir, const char *model, const char *optim) {
    char text[3000];
    snprintf(text, sizeof text,
             "{\"name\": \"sp\", \"task\": {\"name\": \"speech\", \"path\": \"%s\", \"cache\": \"%s/cache\","
             " \"stack\": 2, \"subsample\": 2},"
             " \"model\": %s, \"optim\": %s, \"epochs\": 4, \"batch\": 4,"
             " \"eval_every\": 3, \"checkpoint_every\": 3, \"log_every\": 3, \"seed\": 11}",
             dir, dir, model, optim);
    put(P("sp.json"), text);
    return P("sp.json");
}

#define LSTM_BODY "{\"body\": \"lstm\", \"d_model\": 16, \"layers\": 2, \"hidden\": 12, \"dropout\": 0.1}"
#define TF_BODY                                                                                                      \
    "{\"d_model\": 16, \"heads\": 2, \"layers\": 2, \"d_ff\": 32, \"dropout\": 0.1, \"attention\": {\"variant\": " \
    "\"softmax\"}}"

/* Trains on the CPU (whole, and stopped at step 5 of 12 in the second epoch then
 * resumed) and on the emulated CUDA backend (the same two ways). */
static void train_case(const char *model, const char *optim, const char *what) {
    const char *dir = corpus("c");
    char cfg[1100];
    snprintf(cfg, sizeof cfg, "%s", run_config(dir, model, optim));
    cr_assert_eq(run("train", cfg, "--out", P("a"), "--quiet"), 0, "%s: %s", what, g_err);
    json_t *doc = load(P("a/train.json")), *r, *first = NULL, *last = NULL, *test = NULL;
    size_t i;
    cr_expect_str_eq(json_string_value(json_object_get(doc, "status")), "ok");
    cr_expect_eq(json_array_size(json_object_get(doc, "step_loss")), 12, "4 epochs of 12 rows in batches of 4");
    json_array_foreach(json_object_get(doc, "records"), i, r) {
        const char *k = json_string_value(json_object_get(r, "kind"));
        if (strcmp(k, "eval") == 0) {
            if (!first) first = r;
            last = r;
        } else if (strcmp(k, "test") == 0) test = r;
    }
    cr_assert(first && last && test, "%s: eval and test records", what);
    cr_expect_eq(num(last, "eval_rows"), 4, "the whole valid split");
    cr_expect_eq(num(test, "test_rows"), 4, "the whole test split");
    cr_expect_eq(num(last, "eval_positions"), 4, "an utterance is one scored unit");
    if (getenv("TEST_VERBOSE"))
        fprintf(stderr, "%s: eval loss %g -> %g, per %g -> %g\n", what, num(first, "eval_loss"), num(last, "eval_loss"),
                num(first, "eval_per"), num(last, "eval_per"));
    /* 12 steps from a random start: the CTC loss of an untrained model (outputs near
     * uniform over 5 classes: about T' ln 5 nats an utterance) falls as the model
     * learns to emit blanks and some phones (measured: 33.9 -> 9.0 nats with the LSTM,
     * 26.5 -> 9.8 with the transformer); a fall of 20% is asked */
    cr_expect_lt(num(last, "eval_loss"), 0.8 * num(first, "eval_loss"), "%s: eval loss %g -> %g", what,
                 num(first, "eval_loss"), num(last, "eval_loss"));
    const double test_per = num(json_object_get(doc, "summary"), "test_per");
    cr_expect(isfinite(test_per) && test_per >= 0, "%s: test per %g", what, test_per);
    json_t *task = json_object_get(json_object_get(doc, "config"), "task");
    cr_expect_eq(json_integer_value(json_object_get(task, "stack")), 2);
    json_decref(doc);
    cr_expect(tp_exists(P("c/cache/train.ark")) && tp_exists(P("c/cache/test.json")), "%s: the feature cache", what);

    /* decode: the whole test split gives the run's test PER; 2 rows show their phones */
    cr_assert_eq(run("decode", P("a/checkpoint.bin"), "--n", "0", "--out", P("dec.json")), 0, "%s: %s", what, g_err);
    json_t *dec = load(P("dec.json"));
    cr_expect_eq(num(dec, "per"), test_per, "%s: decode per %.17g, the run's test per %.17g", what, num(dec, "per"),
                 test_per);
    cr_expect_str_eq(json_string_value(json_object_get(dec, "split")), "test");
    cr_expect_eq(json_array_size(json_object_get(dec, "utterances")), 4);
    json_t *u0 = json_array_get(json_object_get(dec, "utterances"), 0);
    cr_expect_str_eq(json_string_value(json_object_get(u0, "id")), "test_00");
    const char *ref = json_string_value(json_object_get(u0, "ref"));
    cr_expect(ref && strlen(ref) >= 5 && strspn(ref, "abcd ") == strlen(ref), "%s: ref '%s'", what, ref);
    json_decref(dec);
    cr_assert_eq(run("decode", P("a/checkpoint.bin"), "--n", "2", "--split", "valid"), 0, "%s", g_err);
    dec = parse(g_out);
    cr_expect_eq(json_array_size(json_object_get(dec, "utterances")), 2);
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(dec, "utterances"), 1), "id")),
                     "valid_01");
    json_decref(dec);

    cr_assert_eq(run("train", cfg, "--out", P("b"), "--quiet", "--set", "epochs=1.4"), 0, "%s", g_err);
    cr_assert_eq(run("train", "--resume", "--out", P("b"), "--quiet", "--set", "epochs=4"), 0, "%s", g_err);
    expect_same_state(P("a/checkpoint.bin"), P("b/checkpoint.bin"), what);

    g_exe = ATTNBENCH_EMU_EXE;
    cr_assert_eq(run("train", cfg, "--out", P("c2"), "--quiet", "--device", "cuda"), 0, "%s: %s", what, g_err);
    cr_assert_eq(run("train", cfg, "--out", P("d"), "--quiet", "--device", "cuda", "--set", "epochs=1.4"), 0, "%s",
                 g_err);
    cr_assert_eq(run("train", "--resume", "--out", P("d"), "--quiet", "--device", "cuda", "--set", "epochs=4"), 0, "%s",
                 g_err);
    g_exe = ATTNBENCH_EXE;
    expect_same_state(P("c2/checkpoint.bin"), P("d/checkpoint.bin"), what);
    size_t na, nb;
    double *a = step_losses(P("a/train.json"), &na), *b = step_losses(P("c2/train.json"), &nb);
    cr_assert_eq(na, nb);
    double worst = 0;
    for (size_t k = 0; k < na; k++) worst = fmax(worst, fabs(a[k] - b[k]) / fabs(a[k]));
    /* as the frames task's (test_train_data.c): float sums in other orders, carried by
     * training through 12 steps */
    cr_expect_lt(worst, 1e-4, "%s: CUDA vs CPU step losses differ by %g relative", what, worst);
    free(a);
    free(b);
}

Test(speech_task, trains_and_resumes_with_a_transformer) {
    train_case(TF_BODY, "{\"kind\": \"radam\", \"lr\": 0.003}", "speech, transformer");
}

/* Training with `augment`: the document records it, the steps differ from a plain
 * run's from the first on (its rows are masked), and a run stopped in its second epoch
 * and resumed ends bit for bit where the uninterrupted one does (the masks depend on
 * the step, not on the process). Evaluation sees the rows unmasked: at step 0 the
 * evaluations agree exactly. */
Test(speech_task, augmented_training_is_recorded_and_resumes_bit_for_bit) {
    const char *dir = corpus("c");
    char cfg[1100];
    snprintf(cfg, sizeof cfg, "%s", run_config(dir, TF_BODY, "{\"kind\": \"radam\", \"lr\": 0.003}"));
    const char *aug = "task.augment={\"freq_masks\": 2, \"freq_width\": 8, \"time_masks\": 2, \"time_width\": 4}";
    cr_assert_eq(run("train", cfg, "--out", P("plain"), "--quiet", "--set", "epochs=1"), 0, "%s", g_err);
    cr_assert_eq(run("train", cfg, "--out", P("a"), "--quiet", "--set", aug), 0, "%s", g_err);
    cr_assert_eq(run("train", cfg, "--out", P("b"), "--quiet", "--set", aug, "--set", "epochs=1.4"), 0, "%s", g_err);
    cr_assert_eq(run("train", "--resume", "--out", P("b"), "--quiet", "--set", "epochs=4"), 0, "%s", g_err);
    expect_same_state(P("a/checkpoint.bin"), P("b/checkpoint.bin"), "augmented, resumed");
    json_t *doc = load(P("a/train.json")), *plain = load(P("plain/train.json"));
    json_t *a = json_object_get(json_object_get(json_object_get(doc, "config"), "task"), "augment");
    cr_expect_eq(json_integer_value(json_object_get(a, "freq_width")), 8, "the run document records augment");
    cr_expect_null(json_object_get(json_object_get(json_object_get(plain, "config"), "task"), "augment"));
    json_t *e0 = json_array_get(json_object_get(doc, "records"), 0), *p0 = json_array_get(json_object_get(plain, "records"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(e0, "kind")), "eval");
    cr_assert_eq(num(e0, "step"), 0);
    cr_expect_eq(num(e0, "eval_loss"), num(p0, "eval_loss"), "step 0's evaluation: unmasked rows, the same model");
    json_decref(doc);
    json_decref(plain);
    size_t na, np;
    double *la = step_losses(P("a/train.json"), &na), *lp = step_losses(P("plain/train.json"), &np);
    cr_assert(na >= 1 && np >= 1);
    cr_expect_neq(la[0], lp[0], "step 1's loss: masked rows against plain ones");
    free(la);
    free(lp);
}

Test(speech_task, trains_and_resumes_with_a_bidirectional_lstm) {
    train_case(LSTM_BODY, "{\"kind\": \"adam\", \"lr\": 0.01}", "speech, bidirectional LSTM");
}

/* ---- bad configs and data ---- */

Test(speech_task, bad_configs_and_data_are_one_line_exit_2) {
    char dir[1100], cfg[1100];
    snprintf(dir, sizeof dir, "%s", corpus("c"));
    snprintf(cfg, sizeof cfg, "%s", run_config(dir, LSTM_BODY, "{\"kind\": \"adam\"}"));
    struct {
        const char *set, *needle1, *needle2;
    } cases[] = {
        {"task.path=/nonexistent-attnbench", "task.path", "nonexistent-attnbench"},
        {"task.dirs={\"train\": \"x\"}", "exactly one of", "task.dirs"},
        {"task.stack=0", "task.stack", NULL},
        {"task.subsample=65", "task.subsample", NULL},
        {"task.features={\"cache\": \"x\"}", "task.features.cache", "task.cache"},
        {"task.features={\"cmvn\": \"global\"}", "task.features.cmvn", "global"},
        {"task.features={\"num_mel_bins\": \"many\"}", "task.features.num_mel_bins", NULL},
        {"task.max_frames=10", "task.max_frames", "nothing is truncated"},
        {"task.subsample=40", "need at least", "subsample"},
        {"task.rows={\"train\": 11, \"valid\": 4, \"test\": 4}", "task.rows.train", NULL},
        {"task.crc32={\"train\": 1}", "task.crc32.train", NULL},
        {"task.colour=red", "colour", NULL},
        {"task.augment={\"freq_masks\": 2}", "task.augment", "give both or neither"},
        {"task.augment={\"freq_masks\": 1, \"freq_width\": 41}", "freq_width 41", "40 filterbank channels"},
        {"task.augment={\"time_masks\": 65, \"time_width\": 3}", "task.augment", "at most 64"},
        {"task.augment={\"time_masks\": 1, \"time_width\": 3, \"warp\": 5}", "warp", NULL},
        {"task.augment=3", "task.augment", "must be an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *out = P("bad%zu", i);
        int st = run("train", cfg, "--out", out, "--set", cases[i].set);
        tp_usage_error(st, g_err, cases[i].set, TP_ARGV(cases[i].needle1, cases[i].needle2, NULL));
        cr_expect(!tp_exists(out), "%s: a refused run wrote %s", cases[i].set, out);
    }
    /* dirs: one per split, a split of another name, a folder that is not there */
    char sets[3][4096]; /* three copies of a path of up to 1100 bytes and the JSON around them */
    snprintf(sets[0], sizeof sets[0], "task={\"name\": \"speech\", \"dirs\": {\"train\": \"%s/train\", \"dev\": \"%s/valid\"}}",
             dir, dir);
    snprintf(sets[1], sizeof sets[1], "task={\"name\": \"speech\", \"dirs\": {\"valid\": \"%s/valid\"}}", dir);
    snprintf(sets[2], sizeof sets[2], "task={\"name\": \"speech\", \"dirs\": {\"train\": \"%s/nowhere\"}}", dir);
    const char *needles[3] = {"task.dirs.dev", "lacks 'train'", "nowhere"};
    for (int i = 0; i < 3; i++) {
        int st = run("train", cfg, "--out", P("dirs%d", i), "--set", sets[i]);
        tp_usage_error(st, g_err, sets[i], TP_ARGV(needles[i], NULL));
    }
    /* dirs naming some of the folders: those splits (no valid: the evaluation is on test) */
    snprintf(sets[0], sizeof sets[0],
             "task={\"name\": \"speech\", \"dirs\": {\"train\": \"%s/train\", \"test\": \"%s/test\"}}", dir, dir);
    cr_assert_eq(run("train", cfg, "--out", P("dirs"), "--quiet", "--set", sets[0], "--set", "steps=1"), 0, "%s", g_err);
    json_t *doc = load(P("dirs/train.json"));
    json_t *task = json_object_get(json_object_get(doc, "config"), "task");
    cr_expect_null(json_object_get(json_object_get(task, "rows"), "valid"));
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(task, "rows"), "test")), 4);
    cr_expect(json_is_null(json_object_get(json_object_get(task, "features"), "phones")),
              "with dirs, the inventory is built from the training text");
    json_decref(doc);
    /* a phone of valid that the training split's inventory lacks; audio missing */
    put(P("c/valid/text"), "valid_00 a b\nvalid_01 a zz b\nvalid_02 a\nvalid_03 b\n");
    int st = run("train", cfg, "--out", P("t1"));
    tp_usage_error(st, g_err, "unknown phone", TP_ARGV("valid/text", "zz", NULL));
    put(P("c/valid/text"), "valid_00 a b\nvalid_09 a b\n");
    st = run("train", cfg, "--out", P("t2"));
    tp_usage_error(st, g_err, "no audio", TP_ARGV("valid_09", NULL));
    cr_expect(!tp_exists(P("t1")) && !tp_exists(P("t2")));
}

/* A data directory whose audio comes from commands: training runs them only with
 * --allow-commands, and so does `decode` when it reloads the checkpoint's data (with no
 * feature cache to read instead): a checkpoint from someone else, naming such a
 * directory, runs nothing unasked (issue 28, defect 6). */
Test(speech_task, reloading_a_checkpoint_runs_no_command_unasked) {
    char dir[1100], cfg[1100];
    snprintf(dir, sizeof dir, "%s", corpus("c"));
    for (int sp = 0; sp < 3; sp++) { /* every wav.scp line "ID PATH" as "ID cat PATH |" */
        char *scp = tp_slurp(P("c/%s/wav.scp", SPLITS[sp]), NULL), out[16000] = "", *save = NULL;
        for (char *line = strtok_r(scp, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            char *sp1 = strchr(line, ' ');
            *sp1 = '\0';
            snprintf(out + strlen(out), sizeof out - strlen(out), "%s cat %s |\n", line, sp1 + 1);
        }
        put(P("c/%s/wav.scp", SPLITS[sp]), out);
        free(scp);
    }
    snprintf(cfg, sizeof cfg, "%s", run_config(dir, LSTM_BODY, "{\"kind\": \"adam\"}"));
    int st = run("train", cfg, "--out", P("a"), "--quiet", "--set", "steps=1", "--set", "task.cache=null");
    tp_usage_error(st, g_err, "train without consent", TP_ARGV("--allow-commands", "wav.scp:1", NULL));
    cr_expect(!tp_exists(P("a")), "a refused run wrote its folder");
    st = run("--allow-commands", "train", cfg, "--out", P("a"), "--quiet", "--set", "steps=1", "--set", "task.cache=null");
    cr_assert_eq(st, 0, "%s", g_err);
    st = run("decode", P("a/checkpoint.bin"), "--n", "1");
    tp_usage_error(st, g_err, "decode without consent", TP_ARGV("--allow-commands", NULL));
    st = run("--allow-commands", "decode", P("a/checkpoint.bin"), "--n", "1");
    cr_expect_eq(st, 0, "decode with consent: %s", g_err);
}

/* A run whose data changed under it is not resumed: the canonical config's CRC-32 of
 * the features and phones; decode refuses what it cannot do, in one line. */
Test(speech_task, resume_on_changed_data_and_bad_decodes_are_refused) {
    char dir[1100], cfg[1100];
    snprintf(dir, sizeof dir, "%s", corpus("c"));
    snprintf(cfg, sizeof cfg, "%s", run_config(dir, LSTM_BODY, "{\"kind\": \"adam\"}"));
    cr_assert_eq(run("train", cfg, "--out", P("a"), "--quiet", "--set", "steps=2"), 0, "%s", g_err);
    int st = run("decode", P("a/checkpoint.bin"), "--split", "nope");
    tp_usage_error(st, g_err, "no split", TP_ARGV("nope", "train, valid, test", NULL));
    st = run("decode", P("nothing.bin"));
    tp_usage_error(st, g_err, "no checkpoint", TP_ARGV("nothing.bin", NULL));
    st = run("decode", P("a/checkpoint.bin"), "--n", "-1");
    tp_usage_error(st, g_err, "--n -1", TP_ARGV("--n", NULL));
    /* a model without a ctc head: the copy task */
    cr_assert_eq(run("train", ATTNBENCH_SOURCE_DIR "/experiments/copy/smoke.json", "--out", P("copy"), "--quiet", "--set",
                     "steps=1"),
                 0, "%s", g_err);
    st = run("decode", P("copy/checkpoint.bin"));
    tp_usage_error(st, g_err, "copy model", TP_ARGV("no ctc head", NULL));
    /* another utterance's audio in place of test_01's */
    size_t n;
    unsigned char *wav = tp_read_bytes(P("c/wav/test_02.wav"), &n);
    tp_write_bytes(P("c/wav/test_01.wav"), wav, n);
    free(wav);
    st = run("train", "--resume", "--out", P("a"), "--set", "steps=4");
    tp_usage_error(st, g_err, "changed audio", TP_ARGV("task.crc32.test", "changed", NULL));
}

/* ---- the experiment's configs ---- */

/* Every config of experiments/speech/ trains a step on the corpus here: the CPU-scale
 * ones with their task pointed at it, the paper's WSJ ones with their split
 * directories, lexicon, dropped symbols and cache pointed at it (a lexicon mapping
 * each phone to itself as a word, and WSJ's silence and noise symbols). The models,
 * optimisers and schedules are the configs' own. */
Test(speech_task, the_experiment_configs_train_a_step) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s", corpus("c"));
    put(P("c/lexicon.txt"), "a a\nb b\nc c\nd d\n!SIL SIL\n<SPOKEN_NOISE> SPN\n<NOISE> NSN\n");
    /* every speech-cpu-*.json (Table 3's five, the Bi-LSTM with the schedule, the
     * ablations of PROTOCOL.md's addendum, the further seeds), then the WSJ ones */
    char pat[1200];
    snprintf(pat, sizeof pat, "%s/experiments/speech/speech-cpu-*.json", ATTNBENCH_SOURCE_DIR);
    glob_t g;
    cr_assert_eq(glob(pat, 0, NULL, &g), 0, "no configs match %s", pat);
    /* 23 when the further seeds were added (14 before them): fewer means the pattern lost some */
    cr_assert_geq(g.gl_pathc, 23, "%zu configs match %s", g.gl_pathc, pat);
    static const char *const wsj[] = {"bilstm", "softmax", "lsh-4", "linear"};
    const int n_cpu = (int)g.gl_pathc, n_wsj = sizeof wsj / sizeof *wsj;
    char cfg[1200], set1[4096], set2[4096], set3[4096]; /* up to three copies of dir and the JSON */
    for (int i = 0; i < n_cpu + n_wsj; i++) {
        const bool paper = i >= n_cpu;
        if (paper)
            snprintf(cfg, sizeof cfg, "%s/experiments/speech/wsj-%s.json", ATTNBENCH_SOURCE_DIR, wsj[i - n_cpu]);
        else
            snprintf(cfg, sizeof cfg, "%s", g.gl_pathv[i]);
        if (paper) {
            snprintf(set1, sizeof set1, "task.dirs={\"train\": \"%s/train\", \"valid\": \"%s/valid\", \"test\": \"%s/test\"}",
                     dir, dir, dir);
            snprintf(set2, sizeof set2, "task.features={\"lexicon\": \"%s/lexicon.txt\", \"drop\": \"SIL,SPN,NSN\"}", dir);
            snprintf(set3, sizeof set3, "task.cache=%s/wsj-cache", dir);
        } else {
            snprintf(set1, sizeof set1, "task.path=%s", dir);
            snprintf(set2, sizeof set2, "task.cache=%s/cache", dir);
            snprintf(set3, sizeof set3, "batch=2");
        }
        const char *out = P("cfg%d", i);
        int st = run("train", cfg, "--out", out, "--quiet", "--set", set1, "--set", set2, "--set", set3, "--set",
                     "steps=1", "--set", "eval_rows=1", "--set", "test_split=\"\"");
        cr_expect_eq(st, 0, "%s: %s", cfg, g_err);
        if (st) continue;
        char path[1200];
        snprintf(path, sizeof path, "%s/train.json", out);
        json_t *doc = load(path);
        json_t *task = json_object_get(json_object_get(doc, "config"), "task");
        cr_expect_eq(json_integer_value(json_object_get(json_object_get(task, "rows"), "train")), 12, "%s", cfg);
        if (paper) /* words through the lexicon: its phones, less the dropped ones */
            cr_expect(json_is_string(json_object_get(json_object_get(task, "features"), "lexicon")), "%s", cfg);
        json_decref(doc);
    }
    globfree(&g);
}
