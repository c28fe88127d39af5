/* emit_target.h — what the emitted step does differently per target (internal to codegen/).
 *
 * emit_c.c prints one program the same way for every target; the few places where the CUDA
 * target differs call in here (emit_target.c):
 *   - constants live on the device: after emit_c.c has printed them as host arrays,
 *     sbp_emit_target_constants prints their device copies (one allocation, uploaded once by
 *     sbp_step_init) and macros that make the block functions' constant names refer to the
 *     device copies; for the CPU target it prints sbp_step_init / sbp_step_release as no-ops;
 *   - the labels are device memory: the scored positions are counted on a host copy;
 *   - kernels run asynchronously: the step ends with sbprt_sync, whose status it returns.
 */
#ifndef SBP_EMIT_TARGET_H
#define SBP_EMIT_TARGET_H

#include <stdbool.h>
#include <stdio.h>

#include "codegen.h"

/* The target of o: "cpu" (o->target NULL or "cpu") or "cuda". */
const char *sbp_codegen_target_name(const sbp_codegen_options *o);
bool sbp_codegen_target_cuda(const sbp_codegen_options *o);

/* A paragraph of the file's header comment (nothing for the CPU target). */
void sbp_emit_target_comment(const sbp_train_program *p, const sbp_codegen_options *o, FILE *f);

/* After the constants: their device copies, sbp_step_init and sbp_step_release. */
void sbp_emit_target_constants(const sbp_train_program *p, const sbp_codegen_options *o,
                               FILE *f);

/* In sbp_step_run, after the argument checks: CUDA: the lazy sbp_step_init and the count of
 * scored positions (n_scored) from a host copy of the labels. bt = B*T. */
void sbp_emit_target_run_start(const sbp_train_program *p, const sbp_codegen_options *o,
                               size_t bt, FILE *f);

/* In sbp_step_run, after the blocks and before the loss is read: CUDA: sbprt_sync. */
void sbp_emit_target_run_end(const sbp_train_program *p, const sbp_codegen_options *o, FILE *f);

#endif
