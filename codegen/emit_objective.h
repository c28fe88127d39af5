/* emit_objective.h — what the emitted step adds for the DPO and GRPO objectives (internal to
 * codegen/; emit_objective.c).
 *
 * The training program (passes/train/objective_pref.c) holds host steps as instructions,
 * GRPO_WEIGHTS (per document: GRPO_DOC_WEIGHTS) and DPO_COEF (passes/train/train_kernels.def);
 * their call templates name static functions that these print into the step, before the
 * block functions. They read and write backend memory through sbprt_memcpy in small blocks
 * (stack buffers: the step allocates nothing), so they work for the CPU and the CUDA target
 * alike. Nothing is printed for SFT or
 * the graph's own loss.
 */
#ifndef SBP_EMIT_OBJECTIVE_H
#define SBP_EMIT_OBJECTIVE_H

#include <stdio.h>

#include "codegen.h"

/* Fields of sbp_step_info after planned_peak_bytes: beta, epsilon, grpo_norm, per_document. */
void sbp_emit_objective_info(const sbp_train_program *p, FILE *f);

/* The host steps' static functions (before the blocks); with p->logps, also
 * obj_logp_outputs, which sbp_step_logps calls. */
void sbp_emit_objective_helpers(const sbp_train_program *p, FILE *f);

/* In sbp_step_run, after the generic argument checks: the objective's inputs. */
void sbp_emit_objective_checks(const sbp_train_program *p, FILE *f);

#endif
