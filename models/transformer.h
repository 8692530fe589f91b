/* The trainable model (the "tf_" prefix is historical: the body need not be a
 * transformer): an input stage, a body and an output head, with forward and backward
 * on the CPU or a CUDA device, and generation by recomputation or as an RNN.
 *
 *   input:  tokens into an embedding (V, C), or float frames (F per position) into a
 *           dense projection F -> C (tf_config.input); plus sinusoidal positions (no
 *           parameters) when the body has no notion of order (the transformer)
 *   body:   TF_BODY_TRANSFORMER: L encoder layers (encoder.h: post-norm as
 *           fast-transformers, or pre-norm), any registered attention variant with its
 *           "key=value" options; optional final layer normalisation. Width C.
 *           TF_BODY_LSTM: L LSTM layers of lstm_hidden units per direction,
 *           bidirectional or not (lstm.h), dropout between layers. Width 2H or H.
 *   head:   TF_HEAD_CATEGORICAL: dense width -> classes logits, softmax cross-entropy
 *           with per-position weights
 *           TF_HEAD_LOGISTIC_MIXTURE: dense width -> 3K outputs (K = mixtures: K
 *           mixture logits, K means, K log-scales), PixelCNN++'s discretised logistic
 *           mixture of one 8-bit value (classes must be 256), the weighted mean NLL
 *           (layers.h: mixture_*); generation draws from it with mixture_sample or
 *           takes mixture_mode, on the outputs of a position from tf_last_logits or
 *           the generator
 *           TF_HEAD_CTC: dense width -> classes + 1 outputs (output 0 the CTC blank,
 *           output c + 1 class c), the CTC loss of each row's label sequence over
 *           the row's valid frames (ctc.h), the weighted mean nll per row; scored
 *           with tf_loss_ctc (label sequences of up to max_labels labels per row)
 *           instead of tf_loss (per-position targets)
 *
 * Memory (the llm.c way): parameters in ONE float allocation carved by a size table
 * (tf_param_tensor: names, offsets and counts in floats, weight-decay flags),
 * gradients in one allocation with the same table, activations (incl. the scratch of
 * backward and the attention's saved buffers) in one allocation carved by an
 * activation table for (max_batch, max_len). All from the tracked allocator at
 * tf_create; nothing is allocated per step (the attention's workspace is reserved for
 * the largest shape at creation).
 *
 * Randomness (harness/rng.h, Philox, so every backend draws the same numbers):
 * - Initialisation from cfg.seed: tensor i of the parameter table (in table order)
 *   draws element j from stream TF_STREAM_INIT + i, index j:
 *     token embedding    normal(0, 1)                      (PyTorch nn.Embedding)
 *     dense weights      uniform(-1/sqrt(fan_in), +1/sqrt(fan_in))  (nn.Linear)
 *     dense biases       uniform(-1/sqrt(fan_in), +1/sqrt(fan_in))  (nn.Linear)
 *     LN gain 1, bias 0
 *     LSTM weights and biases uniform(-1/sqrt(H), +1/sqrt(H))      (nn.LSTM)
 *     the attention's own     the variant's rule (attn_param_init; linformer's E, F:
 *     parameters              uniform(+-1/sqrt(max_len)))
 *   with normal = ab_rng_normal and uniform = (2 ab_rng_uniform - 1) * bound.
 *   The attention's own parameters (attention.h; only linformer has any) are sized for
 *   cfg.max_len: "layers.L.attn.proj" after each layer's attention tensors, or, when the
 *   variant shares one set by all layers, one "attn.proj" after the last layer (every
 *   layer binds it and adds its gradient there). A variant without any adds no entry.
 * - Dropout: tf_forward takes a seed from the caller (per training step, e.g.
 *   tf_step_seed(run_seed, step)); dropout site k (0 attention output, 1 FFN hidden,
 *   2 FFN output; the LSTM's one site: its output) of layer l draws its mask from
 *   (seed, TF_STREAM_DROPOUT + 4 l + k) (rule in layers.h). Dropout is applied only
 *   when train is true.
 * - The attention object of layer l is reseeded with tf_attn_seed(seed, l) at every
 *   forward and backward (fresh LSH rotations per step, the same for a step's forward
 *   and backward); variants without random choices ignore it.
 * So a run that restores parameters, optimiser state and the step counter continues
 * bit for bit (same thread count: OpenBLAS partitions GEMMs by thread count).
 *
 * Padding: lengths[b] (optional) marks positions >= lengths[b] of row b as padding:
 * the attention ignores them as keys and gives them zero output, the LSTM does not
 * run over them (its reverse direction starts at lengths[b] - 1); the loss should
 * give them weight 0. Position-wise layers still compute them (cheap, and harmless).
 *
 * Devices (cfg.device): with AB_DEV_CPU (the default) everything is host memory.
 * With AB_DEV_CUDA the parameter, gradient and activation blocks are each one
 * device allocation (ab_cuda_malloc, tracked on AB_DEV_CUDA) carved by the same
 * tables, the attention object lives on the device, and every layer runs there
 * (layers_cuda.h). What the caller passes and receives stays on the host: tokens,
 * frames, lengths, targets and weights are host arrays, copied into preallocated device
 * buffers (one copy per tf_forward and per tf_loss; a small host staging block is
 * allocated at tf_create, so steps allocate nothing on either side); ce_stats and the
 * generation logits come back to the host. But the pointers the model hands out,
 * tf_params(), tf_grads(), tf_logits() and tf_acts(), point into DEVICE memory on
 * CUDA: pass them to device code (ab_optim created on AB_DEV_CUDA steps them in
 * place), or copy with tf_params_download / tf_params_upload / tf_grads_download /
 * tf_logits_download, which work on either device. Initialisation draws the same
 * numbers on the host and uploads them, so a seed gives the same parameters on both
 * devices, and dropout masks are the same on both (layers.h). CUDA calls return once
 * their work is queued, except tf_loss and the downloads, which wait for the device.
 * Results agree with the CPU's to float rounding (matrix products and reductions
 * run in another order); two runs on one device give the same bits. */
#ifndef AB_MODELS_TRANSFORMER_H
#define AB_MODELS_TRANSFORMER_H

#include "attention.h"
#include "layers.h"
#include "table.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TF_STREAM_INIT 0x494E495400000000ULL    /* "INIT" << 32 */
#define TF_STREAM_DROPOUT 0x44524F5000000000ULL /* "DROP" << 32 */
#define TF_STREAM_ATTN 0x4154544E00000000ULL    /* "ATTN" << 32 */
#define TF_STREAM_STEP 0x5354455000000000ULL    /* "STEP" << 32 */

/* The parts a model is built from (names: tf_*_name, as in configs). */
typedef enum { TF_INPUT_TOKENS = 0, TF_INPUT_FRAMES = 1, TF_INPUT_COUNT } tf_input;
typedef enum { TF_BODY_TRANSFORMER = 0, TF_BODY_LSTM = 1, TF_BODY_COUNT } tf_body;
typedef enum { TF_HEAD_CATEGORICAL = 0, TF_HEAD_LOGISTIC_MIXTURE = 1, TF_HEAD_CTC = 2, TF_HEAD_COUNT } tf_head;
#define TF_MAX_MIXTURES 4096 /* components of a mixture head */

const char *tf_input_name(tf_input i);
const char *tf_body_name(tf_body b);
const char *tf_head_name(tf_head h);
/* The enum value of a name, -1 if unknown. */
int tf_body_find(const char *name);
int tf_head_find(const char *name);
/* The names, comma-separated (messages). */
const char *tf_body_names(void);
const char *tf_head_names(void);

typedef struct {
    tf_input input;      /* TF_INPUT_TOKENS (default) or TF_INPUT_FRAMES */
    int vocab;           /* V: input tokens in [0, V) (TF_INPUT_TOKENS) */
    int features;        /* F: floats per position (TF_INPUT_FRAMES) */
    int classes;         /* head outputs, targets in [0, classes); 0: the vocabulary */
    tf_body body;        /* TF_BODY_TRANSFORMER (default) or TF_BODY_LSTM */
    tf_head head;        /* TF_HEAD_CATEGORICAL (default), TF_HEAD_LOGISTIC_MIXTURE or TF_HEAD_CTC */
    int mixtures;        /* a mixture head's components K, 1..TF_MAX_MIXTURES (0: the head has none) */
    int max_labels;      /* the CTC head's label slots per row S (the most labels a row has),
                            1..max_len (0: the head takes no label sequences) */
    int max_len;         /* longest sequence; rows of the positions table */
    int forward_len;     /* tf_create_inference only, not in configs: the longest forward
                            the model will run (a generator's prefill), 1..max_len; its
                            activations are sized for it while positions and generation
                            capacity stay max_len (0: max_len). A sampler that starts
                            every row from the start token needs 1. */
    int d_model;         /* C: width of the input stage (and of the transformer) */
    int heads;           /* transformer: H; C % H == 0, head dimension C / H */
    int layers;          /* L >= 1 */
    int d_ff;            /* transformer: FFN width */
    int lstm_hidden;     /* LSTM: units per direction */
    bool bidirectional;  /* LSTM: both directions (a causal model cannot be) */
    float dropout;       /* rate in [0, 1) of every dropout site */
    bool pre_norm;       /* false: post-norm (fast-transformers); true: pre-norm */
    bool final_norm;     /* a layer normalisation after the last layer (fast-transformers' default) */
    bool causal;         /* causal attention (autoregressive models) */
    const char *attention;              /* variant name, e.g. "linear" */
    int n_attn_settings;                /* "key=value" options of the variant */
    const char *const *attn_settings;
    uint64_t seed;       /* initialisation */
    ab_device device;    /* AB_DEV_CPU (default, 0) or AB_DEV_CUDA */
    int precision;       /* ab_precision (harness/cuda_blas.h): AB_PREC_FP32 (default, 0), or AB_PREC_TF32
                            (CUDA only): the arithmetic of every matrix product of the model, its layers'
                            (cuBLAS's math mode) and its attention's (the variant's precision option, which
                            the model sets: the attention's own settings must not name it) */
} tf_config;

typedef struct tf_model tf_model;

/* Defaults: the copy task of the paper (tokens, V 12, N 257, C 128, transformer of 8
 * heads, 4 layers, FFN 4C, dropout 0.1, post-norm with final LN, causal, linear
 * attention, categorical head, seed 1, CPU; LSTM fields 256 units, bidirectional). */
void tf_config_default(tf_config *c);

/* Validates cfg (one-line message: sizes positive, d_model % heads, dropout range,
 * attention variant and its options, device, sizes that overflow), then allocates
 * everything for batches up to max_batch and lengths up to cfg->max_len on
 * cfg->device and initialises the parameters from cfg->seed. The config's strings are
 * copied. CUDA without a usable device or in a build without CUDA: AB_EDEVICE with
 * the attention's message ("no CUDA device: ..."); a device too small: AB_ENOMEM. */
int tf_create(const tf_config *cfg, int max_batch, tf_model **out);
/* The same model for inference only (evaluation, generation, sampling): always in
 * inference mode (tf_set_inference cannot turn it off; tf_backward refuses), the
 * activations of two layers used in turn instead of one set per layer, and no saved
 * buffer for an attention that forwards without one (softmax's N x N scores per layer
 * at training would be 77 GB at the paper's CIFAR-10 shape, 16 layers x 8 heads x
 * 3,072^2 x batch 16). Same parameters, same results as tf_create's model. With
 * cfg.forward_len > 0 the activations hold forwards of at most that many positions (a
 * recurrent sampler's: 1, where max_len would cost 145 GB at MNIST's batch 4096, 8
 * layers of d_model 256); generation still reaches max_len positions. */
int tf_create_inference(const tf_config *cfg, int max_batch, tf_model **out);
void tf_destroy(tf_model *m);
/* The model's config (its strings owned by the model). */
const tf_config *tf_get_config(const tf_model *m);
/* Where the model's parameters, gradients and activations live (cfg.device). */
ab_device tf_device(const tf_model *m);

/* ---- parameters and gradients ---- */

size_t tf_param_count(const tf_model *m); /* floats */
/* The parameter count (floats) tf_create would give for cfg, computed without
 * allocating the model (its size tables only): a checkpoint's parameters can be
 * checked against a config before gigabytes are allocated for it. 0, or the code and
 * message of tf_create's config checks (the attention variant is created on the CPU,
 * which allocates nothing, for the count of its own parameters). */
int tf_param_count_for(const tf_config *cfg, size_t *count);
float *tf_params(tf_model *m);            /* tf_param_count() floats, memory of tf_device() */
float *tf_grads(tf_model *m);             /* same layout and device */
int tf_param_tensor_count(const tf_model *m);
/* Entry i of the parameter table: offset and count in floats; decay is true for the
 * dense weight matrices only (not biases, LN gains/biases or the embedding). */
const tf_tensor *tf_param_tensor(const tf_model *m, int i);
/* Re-initialises every parameter from `seed` (the scheme above). 0, or (CUDA) an
 * error code with a message. */
int tf_init_params(tf_model *m, uint64_t seed);
/* Sets the gradients to zero (queued on CUDA). 0, or (CUDA) an error code. */
int tf_zero_grad(tf_model *m);

/* Copies between the model's device and host arrays of tf_param_count() floats
 * (checkpoints, inspection), on either device; the downloads wait for queued work.
 * 0, or an error code with a message. */
int tf_params_download(const tf_model *m, float *host);
int tf_params_upload(tf_model *m, const float *host);
int tf_grads_download(const tf_model *m, float *host);

/* ---- activations ---- */

size_t tf_act_bytes(const tf_model *m);
void *tf_acts(tf_model *m); /* the activation block (tests and inspection), memory of tf_device() */
int tf_act_tensor_count(const tf_model *m);
const tf_tensor *tf_act_tensor(const tf_model *m, int i); /* offsets in bytes */

/* ---- training ---- */

/* Seed of training step `step` of a run: words 0, 1 of ab_philox4x32(run_seed,
 * TF_STREAM_STEP, step). */
uint64_t tf_step_seed(uint64_t run_seed, uint64_t step);
/* Seed given to layer l's attention for a forward with `seed`: words 0, 1 of
 * ab_philox4x32(seed, TF_STREAM_ATTN, l). */
uint64_t tf_attn_seed(uint64_t seed, int layer);

/* tokens (B, N) in [0, V) (a token-input model), 1 <= B <= max_batch,
 * 1 <= N <= max_len (an inference model's forward_len, when set); lengths NULL or B
 * values in [0, N]. Computes logits (B, N, K),
 * K = tf_classes() (the head's outputs). train: dropout on (masks from seed). */
int tf_forward(tf_model *m, const int *tokens, int B, int N, const int *lengths, bool train, uint64_t seed);
/* The same for a frame-input model: frames (B, N, F) finite floats (host memory). */
int tf_forward_frames(tf_model *m, const float *frames, int B, int N, const int *lengths, bool train, uint64_t seed);
/* The training forwards that follow draw row b's dropout masks as row row0 + b of a
 * larger batch with the same N (0, the default: the batch is a whole one). A
 * micro-batch (the trainer's accumulate, data-parallel ranks) holding rows r0.. of a
 * step's batch so draws the masks the whole batch would; every other random choice of a
 * forward (LSH rotations, random features) is per batch, not per row, already. */
void tf_set_row_offset(tf_model *m, long long row0);
/* K: the head's outputs per position (the width of the logits): the classes for the
 * categorical head, 3 x mixtures for the logistic mixture, classes + 1 for CTC. */
int tf_classes(const tf_model *m);
/* The targets' range [0, tf_target_classes()): the classes (256 for the mixture). */
int tf_target_classes(const tf_model *m);
/* Logits (B, N, K) of the last tf_forward, in memory of tf_device(). */
const float *tf_logits(const tf_model *m);
/* Copies them to host (B * N * K floats of the last forward; AB_EINVAL without one). */
int tf_logits_download(const tf_model *m, float *host);
/* Loss of the last forward: targets (B, N), weights (B, N) or NULL (all 1); positions
 * with weight 0 are not scored (their target may be anything); weighted targets must
 * be in [0, tf_target_classes()), weights finite and >= 0. Fills st (loss =
 * sum(w nll) / sum(w), the accuracy counts: the first argmax of the logits, or the
 * mixture's most probable value, equal to the target) and remembers targets and
 * weights for tf_backward. */
int tf_loss(tf_model *m, const int *targets, const float *weights, ce_stats *st);
/* The CTC head's loss of the last forward (ctc.h): labels (B, max_labels), row b's
 * first counts[b] entries its label sequence (classes in [0, tf_target_classes()); the
 * slots past it are not read), weights (B) per row or NULL (all 1); a row of weight 0
 * is not scored (neither its count nor its labels are read). Row b's frames are its
 * length of the forward (N without lengths). Fills st (loss = sum_b w_b nll_b /
 * sum_b w_b in nats per row; counted: the weighted rows; correct: those whose best
 * path is exactly their labels) and remembers the labels for tf_backward. Refused
 * (AB_EINVAL naming the row): a count outside [0, max_labels], a label outside the
 * classes, a weight that is not finite and >= 0, and a row whose labels cannot be
 * aligned to its frames (fewer frames than labels plus adjacent repeats: the CTC
 * loss would be infinite). tf_loss refuses a CTC model and tf_loss_ctc any other. */
int tf_loss_ctc(tf_model *m, const int *labels, const int *counts, const float *weights, ce_stats *st);
/* Gradient of the last tf_loss (or tf_loss_ctc) with respect to every parameter,
 * accumulated (+=) into tf_grads(). Needs a tf_forward then the loss, in that order,
 * with nothing between. */
int tf_backward(tf_model *m);

/* Inference mode (off at creation): while on, forwards keep nothing for backward
 * (tf_backward refuses to run after one), so an attention that saves for backward
 * skips it where it can (attn_can_forward_unsaved: softmax on the CPU computes its
 * N x N scores a row block at a time instead of writing them all). Results are the
 * same. Evaluation and generation by recomputation run in it. */
void tf_set_inference(tf_model *m, bool on); /* a tf_create_inference model stays on */

/* ---- generation ---- */

/* Recomputation (every variant and body; token input): a full forward over tokens
 * (B, N) in evaluation mode (attention seeds from `seed`), then logits (B, K) of
 * position N-1 copied to out
 * (host memory, on either device; the logits of the generator calls below too; NULL:
 * no copy, for tf_draw_last). */
int tf_last_logits(tf_model *m, const int *tokens, int B, int N, uint64_t seed, float *out);
/* One value per row of the last forward (its B rows) drawn from the outputs of its last
 * position, on the model's device, into out (B ints, host memory): d as layers.h's
 * draw_spec says, its n set here from the head (d->mixture must match the head).
 * With it the logits need not leave the device: tf_last_logits, tf_gen_prefill and
 * tf_gen_step take out / logits NULL and copy nothing. */
int tf_draw_last(tf_model *m, const draw_spec *d, int *out);

/* Recurrent mode (transformers over tokens whose variant has a step: linear (any
 * feature map), polynomial, stateful-softmax, local; causal models only): a per-layer attention state for B sequences of up to `capacity`
 * positions (capacity <= max_len, B <= max_batch). A generator uses the model's
 * activation buffers, so it overwrites the last forward's results; one generator runs
 * at a time. */
typedef struct tf_gen tf_gen;
/* Whether the model can generate as an RNN; false with a message when not. */
bool tf_has_recurrent(const tf_model *m);
/* Bytes of the states of all layers; 0 with a message when unsupported. */
size_t tf_gen_state_bytes(const tf_model *m, int B, int capacity);
/* AB_EUNSUPPORTED ("... has no recurrent mode ...") for softmax and lsh or a
 * non-causal model. The generator is initialised (empty). */
int tf_gen_create(tf_model *m, int B, int capacity, tf_gen **out);
/* Empties the states (position 0 next). */
int tf_gen_init(tf_gen *g);
/* The seed of the generator's forward passes, as tf_forward's and tf_last_logits's
 * `seed` (each layer's attention is reseeded from it: favor draws its random features
 * from it when a state is prefilled or takes its first step); 0 until set. A recurrent
 * generation gives a recomputed one's logits when both use the same seed. */
void tf_gen_set_seed(tf_gen *g, uint64_t seed);
/* Runs a prompt tokens (B, P), 1 <= P <= capacity, through every layer in one
 * parallel call each (the state must be empty) and writes the logits (B, K) of
 * position P-1 (NULL: they stay on the device, for tf_draw_last). */
int tf_gen_prefill(tf_gen *g, const int *tokens, int P, float *logits);
/* Feeds tokens (B) at the next position and writes its logits (B, K) (NULL: as for
 * tf_gen_prefill). tokens NULL feeds the values tf_gen_draw drew from the last
 * position's logits, which never left the device (AB_EINVAL when there are none). */
int tf_gen_step(tf_gen *g, const int *tokens, float *logits);
/* Draws one value per row from the logits of the generator's last position t - 1 (its
 * prefill's or step's; as tf_draw_last, d->mixture matching the head), on the model's
 * device: they stay there as the next tf_gen_step's input (tokens NULL) and in the
 * generator's table at position t - 1. So a sampling loop of steps and draws has no
 * copy between host and device per position. AB_EINVAL when the values (the classes,
 * or 0..255 for a mixture) are not all tokens of the vocabulary. */
int tf_gen_draw(tf_gen *g, const draw_spec *d);
/* The table of draws into out (host memory, B x capacity ints, row-major): row b's
 * value drawn at position j in out[b capacity + j], -1 where nothing was drawn since
 * tf_gen_init. */
int tf_gen_draws(const tf_gen *g, int *out);
/* Positions in the state so far. */
int tf_gen_position(const tf_gen *g);
/* Asks for (or stops) steps fed by tf_gen_draw's values to run their layers and head as
 * one CUDA graph (generate.c): recorded at the first such step after each prefill (and
 * after any other forward of the model), launched at the steps after it; the same
 * results, bit for bit. */
int tf_gen_set_graph(tf_gen *g, bool on);
/* Why the steps run without a graph (the model on the CPU, a variant whose step depends
 * on its position, a failed recording, not asked for), or NULL while one is used or may
 * be; *records and *launches (may be NULL): recordings and launches of a graph since
 * tf_gen_set_graph. */
const char *tf_gen_graph_note(const tf_gen *g, long long *records, long long *launches);
/* The attention object every layer runs (the model's device) and the shape of one
 * layer's attention in a generator's step of B rows (one position each): what a
 * measurement needs to reason about a step's attention state (its bytes; e.g. the
 * memory floor of sampling). */
const attn *tf_attention(const tf_model *m);
attn_shape tf_gen_step_shape(const tf_model *m, int B);
void tf_gen_destroy(tf_gen *g);

#endif
