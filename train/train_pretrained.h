/* train_pretrained.h — sbp-train --save-pretrained DIR [--tokenizer TOKDIR]: the trained model
 * as a folder that `transformers` opens with from_pretrained.
 *
 * The folder holds:
 *   config.json             the model's own, as sbp-export recorded it in the ONNX file's
 *                           metadata_props ("sbp.config.json", verbatim);
 *   generation_config.json  likewise, when the export recorded one;
 *   model.safetensors       the trained weights under transformers' names and layouts (the
 *                           --save-safetensors writer, train_export.h; a LoRA step's merged
 *                           weights with --merge-lora);
 *   the tokenizer's files   copied from TOKDIR when given (tokenizer.json, tokenizer_config.json,
 *                           special_tokens_map.json, chat_template.jinja, and the vocabulary
 *                           files of slow tokenizers, whichever are there).
 * A model exported some other way has no recorded config: that is refused before step 1, as is
 * a TOKDIR without a tokenizer. The plan (what will be written) is made before step 1 so that
 * the output registry (train_outputs.h) checks every file; the writes come after training, each
 * one atomic. Functions that can fail write a message into err and return -1.
 */
#ifndef SBP_TRAIN_PRETRAINED_H
#define SBP_TRAIN_PRETRAINED_H

#include <stdbool.h>
#include <stddef.h>

#include "sbp_step.h"
#include "train_export.h"

typedef struct train_pretrained_opts {
    const char *dir;       /* --save-pretrained DIR, or NULL */
    const char *tokenizer; /* --tokenizer TOKDIR, or NULL */
} train_pretrained_opts;

enum { TRAIN_PRETRAINED_MAX_FILES = 16 };

typedef struct train_pretrained {
    char *config;          /* config.json's text (malloc'd) */
    char *generation;      /* generation_config.json's, or NULL */
    const char *names[TRAIN_PRETRAINED_MAX_FILES]; /* the files DIR will hold */
    int n_names;
    const char *tok_files[TRAIN_PRETRAINED_MAX_FILES]; /* those copied from TOKDIR */
    int n_tok;
} train_pretrained;

/* Reads the export's recorded config from model_path and finds TOKDIR's files. */
int train_pretrained_plan(train_pretrained *p, const train_pretrained_opts *o,
                          const char *model_path, char *err, size_t errlen);
/* Writes the folder (made one level deep when missing) from the host parameter block params
 * through the export plan x (merge: a LoRA step's merge plan, or NULL). */
int train_pretrained_write(const train_pretrained *p, const train_pretrained_opts *o,
                           const train_export *x, const sbp_step_info *in, const float *params,
                           const train_adapter_merge_plan *merge, char *err, size_t errlen);
void train_pretrained_free(train_pretrained *p); /* NULL-safe */

const char *train_pretrained_usage(void);

#endif
