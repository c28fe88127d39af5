/* train_adapter.h — sbp-train's side of LoRA (sbpc --lora, passes/lora.h): the adapters'
 * initial values and --save-adapter DIR, PEFT's format.
 *
 * A step compiled with --lora trains parameters the ONNX model does not hold:
 * `<module>.lora_A.weight` [r, in] and `<module>.lora_B.weight` [out, r]. train_adapter_init
 * adds them to the imported model as initializers, made by ir_lora_init (ir/torch.h) with the
 * seed sbpc used (--lora-seed, here and there; default 0), so that the rest of sbp-train checks
 * and loads them like any weight. --save-adapter DIR writes what
 * `peft.PeftModel.from_pretrained(model, DIR)` reads: DIR/adapter_model.safetensors (float32,
 * keyed `base_model.model.<module>.lora_A.weight` / `.lora_B.weight`, PEFT's layouts, which are
 * the step's) and DIR/adapter_config.json (peft_type LORA, task_type CAUSAL_LM, r from the
 * adapters' shapes, lora_alpha = --lora-alpha (sbpc's, default 8, PEFT's), target_modules the
 * adapted modules' full paths, so PEFT adapts exactly those, lora_dropout 0, bias none). Each
 * file is written atomically (ir/files.h), the tensors first.
 *
 * The step's table says which parameters are adapters (their names) but not the scaling or the
 * seed sbpc compiled in, hence the two flags; they must repeat sbpc's.
 *
 * Functions that can fail write a message (without the program's prefix) into err, return -1.
 */
#ifndef SBP_TRAIN_ADAPTER_H
#define SBP_TRAIN_ADAPTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "ir.h"
#include "sbp_step.h"

typedef struct train_adapter_opts {
    const char *save_dir; /* --save-adapter DIR, or NULL */
    double alpha;         /* --lora-alpha (default 8, PEFT's and sbpc's) */
    int64_t seed;         /* --lora-seed (default 0, sbpc's) */
    const char *given;    /* a --lora-* flag seen (its name), or NULL */
} train_adapter_opts;

/* The options, in this order, have consecutive getopt vals base .. base + 2 in the tool's
 * table: --save-adapter, --lora-alpha, --lora-seed. Call train_adapter_opts_init first. */
void train_adapter_opts_init(train_adapter_opts *o);
int train_adapter_parse(train_adapter_opts *o, cli *c, int val, int base, const char *v);
/* The usage text of the options (ends in a newline). */
const char *train_adapter_usage(void);

/* Adds an initializer to g (the imported model) for every adapter of step `in` the model does
 * not hold, with its initial values. A --lora-* flag for a step without adapters is an error.
 * Returns the number of adapters added, or -1. */
int train_adapter_init(ir_graph *g, const sbp_step_info *in, const train_adapter_opts *o,
                       char *err, size_t errlen);

/* --save-adapter: writes o->save_dir's two files from the host parameter block params
 * ([param_elems]); the directory is made if missing. *n_written: the tensors written. */
int train_adapter_save(const train_adapter_opts *o, const sbp_step_info *in, const float *params,
                       int *n_written, char *err, size_t errlen);

#endif
