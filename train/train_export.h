/* train_export.h — sbp-train --save-safetensors: the trained weights under their PyTorch names.
 *
 * A step's parameters are the model's ONNX initializers, named and laid out as the exporter
 * wrote them: the TorchScript exporter constant-folds `x @ W.T` into a transposed copy named
 * `onnx::MatMul_N`, the dynamo exporter names such copies `val_N`, and a tied LM head becomes a
 * second, transposed copy of the embedding (re-tied by sbpc: tied_to in the step's table).
 * train_export_plan_lora works out, once, before any training, which PyTorch key each parameter is
 * written under and in which layout; train_export_write_lora writes the file (sbpio's atomic
 * safetensors writer). How names are recovered is described in train_export.c.
 *
 * A LoRA step (sbpc --lora) is written merged (sbp-train --merge-lora): every adapted weight
 * W + (alpha/r)·B·A under W's transformers name, no adapter key, so the file is the original
 * model's state_dict after PEFT's merge_and_unload(). The adapters alone are --save-adapter's.
 */
#ifndef SBP_TRAIN_EXPORT_H
#define SBP_TRAIN_EXPORT_H

#include "ir.h"
#include "sbp_step.h"
#include "train_say.h"
#include "train_adapter.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct train_export train_export; /* the plan: one entry per key written */

/* Plans the keys for step `in` trained from graph g (the imported model, no passes run; for a
 * LoRA step with the adapters train_adapter_init added). merge: the LoRA adapters will be
 * merged (--merge-lora): they get no key of their own. `note` gets one line per recovered name
 * (and other remarks); it may be NULL. Returns NULL with a message in err when the step has
 * LoRA adapters and merge is false, when a parameter's PyTorch name cannot be recovered, or
 * could be either of two names, or two parameters would be written under one name. */
train_export *train_export_plan_lora(const ir_graph *g, const sbp_step_info *in, bool merge,
                                     const train_sink *note, char *err, size_t errlen);

/* Writes the planned keys, float32, from the host parameter block `params` ([param_elems]),
 * atomically to path; with merge (a LoRA step planned with merge; else NULL) every adapted
 * weight is written as W + (alpha/r)·B·A (train_adapter_merge, on a copy). Returns 0, or -1
 * with a message in err. */
int train_export_write_lora(const train_export *x, const sbp_step_info *in, const float *params,
                            const train_adapter_merge_plan *merge, const char *path, char *err,
                            size_t errlen);

/* The number of keys the plan writes. */
int train_export_count(const train_export *x);

void train_export_free(train_export *x); /* NULL-safe */

#endif
