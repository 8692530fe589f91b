/* The registry as one JSON document: every attention variant with its options, modes
 * and devices, the feature maps, the training tasks, model bodies and heads (what
 * `attnbench list --json` prints, for programs: the cross-check reads its variants and
 * modes from it).
 *
 * Schema "attnbench/list/1":
 *   {"schema": "attnbench/list/1",
 *    "variants": [{"name", "summary",
 *                  "options": [{"name", "type": "double" | "int" | "choice",
 *                               "default" (text, as shown to users), "help",
 *                               "choices": [names] (choice only),
 *                               "min", "max" (double and int only: the allowed range,
 *                                             inclusive; numbers, integers for int),
 *                               "auto": whether "auto" is accepted}],
 *                  "modes": ["parallel"] or ["parallel", "recurrent"],
 *                  "causal": whether it takes causal shapes (false: non-causal only),
 *                  "params": whether it has learned parameters of its own (sized for a
 *                            max_len; `op` draws them from --seed),
 *                  "devices": the devices this build runs it on, "cpu" first}],
 *    "feature_maps": [{"name", "features" (feature count for input size D, a formula),
 *                      "help", "choice_of": [{"variant", "option"}: the choice options
 *                                            that offer it]}],
 *    "tasks": [{"name", "summary", "keys": [the keys of its config object]}],
 *    "bodies": [the model bodies: "transformer", ...],
 *    "heads": [the model heads (set by the task): "categorical", ...]}
 * Variants, options, choices, feature maps and tasks appear in registry order. */
#ifndef AB_LIST_DOC_H
#define AB_LIST_DOC_H

#include <jansson.h>

/* The document, schema "attnbench/list/1" (new reference). */
json_t *list_doc_json(void);

#endif
