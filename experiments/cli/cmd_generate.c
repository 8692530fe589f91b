/* attnbench generate CHECKPOINT: autoregressive generation from a training checkpoint
 * (greedy, or sampling with a temperature and a seed), each variant in its own mode,
 * scored against the task's expected continuation (for the copy task: the copy
 * accuracy), with the decoding speed.
 *
 * Modes: "recurrent" (variants with a recurrent step: linear, polynomial,
 * stateful-softmax): the prompt runs through every layer in one parallel prefill,
 * then one step per generated token on the per-layer state; "recompute" (every
 * variant; the only one for softmax and lsh, as in the paper): a full forward over
 * the whole prefix for every new token. "auto" picks recurrent where there is one.
 * Prompts are decoded one at a time (batch 1, like the paper's generation timings).
 * The time covers decoding only (prefill and steps, or the recomputations). */
#include "commands.h"

#include "blas.h"
#include "cli_util.h"
#include "cuda_device.h"
#include "error.h"
#include "fileio.h"
#include "memory.h"
#include "results.h"
#include "timer.h"
#include "trainer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char GEN_USAGE[] =
    "usage: attnbench generate CHECKPOINT [--n K] [--seed S] [--mode auto|recurrent|recompute]\n"
    "                          [--temperature T] [--out FILE] [--tokens] [--device cpu|cuda]\n"
    "\n"
    "Loads the model of a training checkpoint, draws K prompts (default 64) from the\n"
    "task's distribution (seed S, default the run's seed; the prompts differ from the\n"
    "training and evaluation rows), decodes each (greedily, or with --temperature T > 0\n"
    "by sampling from softmax(logits / T), the draws a pure function of S, the prompt\n"
    "and the position) and scores the tokens against\n"
    "the expected continuation. Modes: recurrent (linear, polynomial, stateful-softmax:\n"
    "parallel prefill of the prompt, then one RNN step per token), recompute (any\n"
    "variant: a full forward per token; softmax and lsh have only this), auto (the\n"
    "default: recurrent where the variant has it). Prints a JSON document: mode,\n"
    "accuracy (fraction of generated tokens right: for the copy task, the copy\n"
    "accuracy), exact_rate (prompts copied without a mistake), tokens generated, wall\n"
    "time, tokens/s; --tokens adds the generated tokens; --out also writes it to FILE.\n";

static int argmax(const float *x, int n) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

/* A draw from softmax(x / T) (in double, from the largest logit down) with the
 * uniform u in (0, 1): the first class whose cumulative probability exceeds u. */
static int sample(const float *x, int n, double T, double u) {
    double mx = x[argmax(x, n)], z = 0;
    for (int i = 0; i < n; i++) z += exp(((double)x[i] - mx) / T);
    double c = 0, target = u * z;
    for (int i = 0; i < n; i++) {
        c += exp(((double)x[i] - mx) / T);
        if (c > target) return i;
    }
    return argmax(x, n); /* u z at the top of the sum's rounding: the likeliest class */
}

int cmd_generate(int argc, char **argv, const char *command_line) {
    const char *ckpt = NULL, *out = NULL, *mode_s = "auto";
    long long K = 64;
    double temperature = 0;
    uint64_t seed = 0;
    bool have_seed = false, tokens_out = false;
    ab_device device = AB_DEV_CPU;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            fputs(GEN_USAGE, stdout);
            return 0;
        } else if (strcmp(argv[i], "--n") == 0) K = cli_parse_int("--n", cli_value(argc, argv, &i), 1, 1 << 24);
        else if (strcmp(argv[i], "--seed") == 0) {
            seed = cli_parse_u64("--seed", cli_value(argc, argv, &i));
            have_seed = true;
        } else if (strcmp(argv[i], "--mode") == 0) {
            mode_s = cli_value(argc, argv, &i);
            if (strcmp(mode_s, "auto") && strcmp(mode_s, "recurrent") && strcmp(mode_s, "recompute"))
                cli_die(AB_EXIT_USAGE, "--mode %s: must be auto, recurrent or recompute", mode_s);
        } else if (strcmp(argv[i], "--temperature") == 0) {
            const char *v = cli_value(argc, argv, &i);
            char *end;
            temperature = strtod(v, &end);
            if (!*v || *end || !(temperature >= 0) || temperature > 1e6)
                cli_die(AB_EXIT_USAGE, "--temperature %s: must be a number in [0, 1e6] (0: greedy)", v);
        } else if (strcmp(argv[i], "--out") == 0) out = cli_path_value(argc, argv, &i);
        else if (strcmp(argv[i], "--tokens") == 0) tokens_out = true;
        else if (strcmp(argv[i], "--device") == 0) {
            device = cli_device_value(argc, argv, &i);
        } else if (argv[i][0] == '-') cli_die(AB_EXIT_USAGE, "generate: unknown argument '%s' (see attnbench generate --help)", argv[i]);
        else if (!ckpt) ckpt = argv[i];
        else cli_die(AB_EXIT_USAGE, "generate: more than one checkpoint given ('%s' and '%s')", ckpt, argv[i]);
    }
    if (!ckpt) cli_die(AB_EXIT_USAGE, "generate: a CHECKPOINT (e.g. results/NAME/checkpoint.bin) is required");
    if (device == AB_DEV_CUDA && ab_cuda_init()) cli_die(AB_EXIT_USAGE, "%s", ab_error());

    train_config cfg;
    tf_model *m;
    train_ckpt_state meta;
    int rc = train_ckpt_load_model(ckpt, 1, device, NULL, &cfg, &m, &meta);
    if (rc) cli_die(cli_status_for(rc), "%s", ab_error());
    const train_task *task = cfg.task;
    if (task->max_prompt <= 0 || !task->prompt)
        cli_die(AB_EXIT_USAGE, "generate: the task '%s' has no generation prompts", task->name);
    if (!have_seed) seed = cfg.seed;
    bool recurrent = strcmp(mode_s, "recurrent") == 0 || (strcmp(mode_s, "auto") == 0 && tf_has_recurrent(m));
    if (recurrent && !tf_has_recurrent(m)) cli_die(AB_EXIT_USAGE, "generate --mode recurrent: %s", ab_error());
    ab_clear_error();

    if (task->input != TASK_INPUT_TOKENS) cli_die(AB_EXIT_USAGE, "generate: the task '%s' does not take tokens", task->name);
    int N = task->seq_len, V = tf_classes(m);
    int *prompt = malloc(sizeof(int) * (size_t)N), *expected = malloc(sizeof(int) * (size_t)(task->max_gen + 1));
    int *seq = malloc(sizeof(int) * (size_t)(N + 1));
    float *logits = malloc(sizeof(float) * (size_t)V);
    if (!prompt || !expected || !seq || !logits) cli_die(AB_EXIT_FAILURE, "out of memory");
    tf_gen *g = NULL;
    if (recurrent && (rc = tf_gen_create(m, 1, N, &g))) cli_die(cli_status_for(rc), "%s", ab_error());
    uint64_t attn_seed = tf_step_seed(cfg.seed, TRAIN_EVAL_STEP);
    tf_gen_set_seed(g, attn_seed); /* both modes draw the attention's random choices alike */
    json_t *gen_tokens = tokens_out ? json_array() : NULL;
    long long generated = 0, correct = 0, exact = 0, prompt_tokens = 0;
    double decode_s = 0;
    for (long long k = 0; k < K; k++) {
        ab_rng rng = task_row_rng(seed, TASK_STREAM_GEN, (uint64_t)k, 0);
        int P, G;
        task->prompt(task, &rng, prompt, &P, expected, &G);
        memcpy(seq, prompt, sizeof(int) * (size_t)P);
        uint64_t t0 = ab_now_ns();
        for (int j = 0; j < G; j++) {
            if (recurrent) {
                if (j == 0) {
                    rc = tf_gen_init(g);
                    if (!rc) rc = tf_gen_prefill(g, seq, P, logits);
                } else {
                    rc = tf_gen_step(g, &seq[P + j - 1], logits);
                }
            } else {
                rc = tf_last_logits(m, seq, 1, P + j, attn_seed, logits);
            }
            if (rc) cli_die(cli_status_for(rc), "generate: prompt %lld, token %d: %s", k, j, ab_error());
            seq[P + j] = temperature > 0
                             ? sample(logits, V, temperature,
                                      ab_rng_uniform(seed, TASK_STREAM_SAMPLE, (uint64_t)k * (uint64_t)(N + 1) + (uint64_t)j))
                             : argmax(logits, V);
        }
        decode_s += (double)(ab_now_ns() - t0) * 1e-9;
        bool all = true;
        for (int j = 0; j < G; j++) {
            bool ok = seq[P + j] == expected[j];
            correct += ok;
            all &= ok;
        }
        exact += all;
        generated += G;
        prompt_tokens += P;
        if (gen_tokens) {
            json_t *row = json_array();
            for (int j = 0; j < G; j++) json_array_append_new(row, json_integer(seq[P + j]));
            json_array_append_new(gen_tokens, row);
        }
    }
    json_t *doc = json_object();
    json_object_set_new(doc, "schema", json_string("attnbench/generate/1"));
    json_object_set_new(doc, "command", json_string(command_line));
    json_object_set_new(doc, "checkpoint", json_string(ckpt));
    json_object_set_new(doc, "run", json_string(cfg.name));
    json_object_set_new(doc, "step", json_integer((json_int_t)meta.step));
    json_object_set_new(doc, "task", json_string(task->name));
    json_object_set_new(doc, "variant", json_string(cfg.model.attention));
    json_object_set_new(doc, "mode", json_string(recurrent ? "recurrent" : "recompute"));
    json_object_set_new(doc, "decoding", json_string(temperature > 0 ? "sample" : "greedy"));
    json_object_set_new(doc, "temperature", json_real(temperature));
    json_object_set_new(doc, "device", json_string(ab_device_name(device)));
    json_object_set_new(doc, "seed", json_integer((json_int_t)seed));
    json_object_set_new(doc, "prompts", json_integer(K));
    json_object_set_new(doc, "prompt_tokens", json_integer(prompt_tokens));
    json_object_set_new(doc, "tokens_generated", json_integer(generated));
    json_object_set_new(doc, "correct", json_integer(correct));
    json_object_set_new(doc, "accuracy", ab_json_num(generated ? (double)correct / (double)generated : NAN));
    json_object_set_new(doc, "exact_sequences", json_integer(exact));
    json_object_set_new(doc, "exact_rate", ab_json_num((double)exact / (double)K));
    json_object_set_new(doc, "wall_s", ab_json_num(decode_s));
    json_object_set_new(doc, "tokens_per_s", ab_json_num(decode_s > 0 ? (double)generated / decode_s : NAN));
    json_object_set_new(doc, "threads", json_integer(ab_threads()));
    json_object_set_new(doc, "peak_bytes", json_integer((json_int_t)ab_mem_peak(AB_DEV_CPU)));
    if (device == AB_DEV_CUDA)
        json_object_set_new(doc, "device_peak_bytes", json_integer((json_int_t)ab_mem_peak(AB_DEV_CUDA)));
    json_object_set_new(doc, "machine", ab_machine_info());
    if (gen_tokens) json_object_set_new(doc, "generated", gen_tokens);
    if (out) cli_write_json(out, doc);
    json_dumpf(doc, stdout, CLI_JSON_FLAGS);
    fputc('\n', stdout);
    json_decref(doc);
    tf_gen_destroy(g);
    tf_destroy(m);
    train_config_free(&cfg);
    free(prompt);
    free(expected);
    free(seq);
    free(logits);
    return 0;
}
