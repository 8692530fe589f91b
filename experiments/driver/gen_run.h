/* Autoregressive generation from a training checkpoint (greedy, or sampling with a
 * temperature and a seed), each variant in its own mode, scored against the task's
 * expected continuation (for the copy task: the copy accuracy), with the decoding
 * speed: what `attnbench generate` runs, as a library (errors are AB_* codes with one
 * line in ab_error(); nothing here exits).
 *
 * Modes (sample_run.h): "recurrent" (variants with a recurrent step: linear,
 * polynomial, stateful-softmax): the prompt runs through every layer in one parallel
 * prefill, then one step per generated token on the per-layer state; "recompute"
 * (every variant; the only one for softmax and lsh, as in the paper): a full forward
 * over the whole prefix for every new token. "auto" picks recurrent where there is
 * one. Prompts are decoded one at a time (batch 1, like the paper's generation
 * timings). The time covers decoding only (prefill and steps, or the recomputations). */
#ifndef AB_GEN_RUN_H
#define AB_GEN_RUN_H

#include "sample_run.h"
#include "trainer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct {
    long long n;        /* prompts, drawn from the task's distribution (TASK_STREAM_GEN) */
    sample_mode mode;
    double temperature; /* 0: greedy; > 0: draws from softmax(logits / T) */
    uint64_t seed;      /* the prompts' and draws' seed, when have_seed; else the run's */
    bool have_seed;
    bool keep_tokens;   /* keep the generated tokens (gen_result.tokens) */
    ab_device device;
} gen_opts;

typedef struct {
    train_config cfg;      /* the run's config (gen_result_free) */
    train_ckpt_state meta; /* the checkpoint's step */
    bool recurrent;        /* the mode the options resolve to */
    uint64_t seed;
    long long prompts, prompt_tokens, generated, correct, exact;
    double accuracy;       /* correct / generated (NaN without any) */
    double exact_rate;     /* prompts continued without a mistake / prompts */
    double wall_s;         /* decoding alone */
    json_t *tokens;        /* keep_tokens: an array of each prompt's generated tokens; else NULL */
} gen_result;

/* Loads the checkpoint's model (batch 1), checks the request against its task and
 * variant, and decodes opts->n prompts into *r (gen_result_free). */
int gen_run(const char *checkpoint, const gen_opts *opts, gen_result *r);
/* The document of a run, schema "attnbench/generate/1" (tokens/s, memory, machine, the
 * source's git (harness/results.h: ab_git_info), and the generated tokens when kept:
 * the document takes them over). */
json_t *gen_document(gen_result *r, const gen_opts *opts, const char *checkpoint, const char *command_line);
void gen_result_free(gen_result *r);

#endif
