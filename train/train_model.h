/* train_model.h — the model a step was compiled from, as the trainer uses it.
 *
 * Import: the ONNX file (ir_import_onnx, no passes); the files it read (its external data) join
 * the run's inputs, so the outputs can be checked against them before any training. Match:
 * every parameter of the step must be a float32 initializer of the same shape (a re-tied
 * parameter only has to exist: it has no storage, being the transpose of its owner), and a
 * model input with fixed dims must have the step's B and T; every mismatch is reported (the
 * first eight), not only the first. A LoRA step's adapters join the model's weights first.
 *
 * Out: the writers see every parameter in fp32. A step with a weight kept as bf16
 * (--base-precision bf16) gets a copy laid out as an fp32 step's (train_f32_view) whose bf16
 * weights, frozen, are the model file's own fp32 values (read once more): what the step started
 * from, and what a step with fp32 base weights writes. Any other step is used as is.
 */
#ifndef SBP_TRAIN_MODEL_H
#define SBP_TRAIN_MODEL_H

#include "files.h"
#include "ir.h"
#include "sbptrain.h"

/* The imported model and, for each step parameter, its initializer. */
typedef struct train_model {
    ir_diag diag;
    ir_graph *g;            /* owns the initializer data */
    const ir_value **vals;  /* [n_params] */
} train_model;

int train_model_import(train_model *m, const char *path, sbp_file_set *inputs,
                       const train_sink *s);
int train_model_match(train_model *m, const train_config *c, const sbp_step_info *in,
                      const train_sink *s);
/* The model's weights into the parameter block (host memory, [param_elems]); a warning where a
 * re-tied copy in the file is not the transpose of its owner. */
void train_model_copy_weights(const train_model *m, const train_config *c,
                              const sbp_step_info *in, float *params, const train_sink *s);
void train_model_free(train_model *m);

/* The parameter table and block with every parameter in fp32 (see above). */
typedef struct train_f32_view {
    sbp_step_info info;      /* the step's, with params and param_elems of the copy */
    sbp_step_param *params;  /* [n_params], or NULL: the step's own table and block */
    float *block;            /* [info.param_elems], or NULL */
} train_f32_view;

int train_f32_view_make(train_f32_view *v, const train_config *c, const sbp_step_info *in,
                        const float *block, const train_sink *s);
void train_f32_view_free(train_f32_view *v);

/* --dump-grads: the gradient block [grad_elems] as safetensors keyed by initializer name, the
 * loss in the metadata (a frozen parameter's gradient is zeros, a re-tied one its owner's
 * transposed). */
int train_write_grads(const char *path, const sbp_step_info *in, const float *grads, double loss,
                      const train_sink *s);
/* --save: a copy of the model with the block's weights (in, params: the fp32 view); a LoRA
 * step's adapters are not the model's and are left out (--merge-lora merges them first). */
int train_write_onnx(const train_config *c, const sbp_step_info *in, const float *params,
                     const train_sink *s);

#endif
