/* train_adapter.h — sbp-train's side of LoRA (sbpc --lora, passes/graph/lora.h): the adapters'
 * initial values, --save-adapter DIR (PEFT's format) and --merge-lora (the adapters folded into
 * the base weights of --save's ONNX copy).
 *
 * A step compiled with --lora trains parameters the ONNX model does not hold:
 * `<module>.lora_A.weight` [r, in] and `<module>.lora_B.weight` [out, r]. The step describes its
 * LoRA itself (sbp_step_info: lora_rank, lora_alpha, lora_seed, recorded by sbpc), so nothing
 * of sbpc's --lora-* flags is repeated here. train_adapter_init adds the adapters to the
 * imported model as initializers, made by ir_lora_init (ir/torch.h) with the step's lora_seed,
 * so that the rest of sbp-train checks and loads them like any weight. --save-adapter DIR
 * writes what `peft.PeftModel.from_pretrained(model, DIR)` reads: DIR/adapter_model.safetensors
 * (float32, keyed `base_model.model.<module>.lora_A.weight` / `.lora_B.weight`, PEFT's layouts,
 * which are the step's) and DIR/adapter_config.json (peft_type LORA, task_type CAUSAL_LM, r and
 * lora_alpha the step's, target_modules the adapted modules' full paths, so PEFT adapts exactly
 * those, lora_dropout 0, bias none). Each file is written atomically (ir/files.h), the tensors
 * first.
 *
 * --save OUT.onnx --merge-lora writes the model PEFT's merge_and_unload() gives: the original
 * graph, every adapted weight W replaced by W + (alpha / r)·B·A in the initializer's own layout
 * (an exporter's transposed copy, such as TorchScript's `onnx::MatMul_N` = W^T or GPT-2's
 * Conv1D [in, out], gets the transposed update), no adapter. Which initializer an adapter
 * updates is planned before any training (train_adapter_merge_plan), from the PyTorch names
 * ir/torch.h recovers, as sbpc named the adapters. --save-safetensors F --merge-lora writes the
 * same merged weights under their transformers names (train_export.h): what
 * `model.load_state_dict(load_file(F))` on the original model loads, PEFT's merge_and_unload().
 * A LoRA step's --save or --save-safetensors without --merge-lora is an error: neither the ONNX
 * copy nor the model's state_dict has a place for the adapters (--save-adapter writes them).
 *
 * Functions that can fail write a message (without the program's prefix) into err, return -1
 * (or NULL).
 */
#ifndef SBP_TRAIN_ADAPTER_H
#define SBP_TRAIN_ADAPTER_H

#include <stdbool.h>
#include "train_opt.h"
#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "ir.h"
#include "sbp_step.h"

typedef struct train_adapter_opts {
    const char *save_dir; /* --save-adapter DIR, or NULL */
    bool merge;           /* --merge-lora: --save writes the merged base weights */
    bool save_onnx;       /* sbp-train's --save OUT.onnx was given (train_adapter_check_outputs) */
    bool save_safetensors;/* sbp-train's --save-safetensors F or --save-pretrained DIR was
                           * given (likewise) */
    bool save_pretrained; /* --save-pretrained DIR was (for the messages) */
} train_adapter_opts;

/* The options (train_opt.h): --save-adapter DIR, --merge-lora (no value); the parser answers
 * 0, -1 after cli's message, or TRAIN_OPT_NOT_MINE. Call train_adapter_opts_init first. */
extern const struct option train_adapter_options[];
void train_adapter_opts_init(train_adapter_opts *o);
int train_adapter_parse(train_adapter_opts *o, cli *c, const char *v);
/* After the parse: whether --save and --save-safetensors were given; --merge-lora needs one. */
int train_adapter_check_outputs(train_adapter_opts *o, bool save, bool save_safetensors,
                                char *err, size_t errlen);
/* The usage text of the options (ends in a newline). */
const char *train_adapter_usage(void);

/* Adds an initializer to g (the imported model) for every adapter of step `in` the model does
 * not hold, with its initial values (the step's lora_seed). For a step without adapters,
 * --save-adapter and --merge-lora are errors; for one with them, --save or --save-safetensors
 * without --merge-lora.
 * Returns the number of adapters added, or -1. */
int train_adapter_init(ir_graph *g, const sbp_step_info *in, const train_adapter_opts *o,
                       char *err, size_t errlen);

/* --save-adapter: writes o->save_dir's two files from the host parameter block params
 * ([param_elems]); the directory is made if missing. *n_written: the tensors written. */
int train_adapter_save(const train_adapter_opts *o, const sbp_step_info *in, const float *params,
                       int *n_written, char *err, size_t errlen);

/* --merge-lora: for each adapter pair of step `in`, the step parameter(s) holding its base
 * weight in g (the imported model) and their layouts. NULL with a message when an adapter's
 * base weight cannot be found or told apart, or its shape does not fit the adapters. */
typedef struct train_adapter_merge_plan train_adapter_merge_plan;
train_adapter_merge_plan *train_adapter_merge_plan_make(const ir_graph *g,
                                                        const sbp_step_info *in, char *err,
                                                        size_t errlen);
/* The number of base weights (storage blocks) the plan updates. */
int train_adapter_merge_count(const train_adapter_merge_plan *p);
/* out ([param_elems]) gets the parameter block params ([param_elems]) with every planned base
 * weight W replaced by W + (lora_alpha / lora_rank)·B·A (summed in double, rounded once), in W's
 * layout; a re-tied copy's update goes to its owner, so both views agree. out != params. */
void train_adapter_merge(const train_adapter_merge_plan *p, const sbp_step_info *in,
                         const float *params, float *out);
void train_adapter_merge_plan_free(train_adapter_merge_plan *p); /* NULL-safe */

/* Is step parameter `name` a LoRA adapter (not an initializer of the ONNX model)? */
bool train_adapter_is_adapter(const char *name);

#endif
