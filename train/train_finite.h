/* train_finite.h — is a parameter block, or AdamW's moments, fit to be written or trained from?
 *
 * A learning rate or weight decay that overflows, or a damaged checkpoint, leaves weights that
 * are NaN or infinite; AdamW's second moment v is a running mean of squares, so a negative v is
 * as impossible as a NaN. sbp-train checks the blocks it loads (a checkpoint) and the blocks it
 * is about to write (a checkpoint, --save, --save-safetensors, --save-adapter), and names the
 * first bad tensor, so nothing non-finite leaves the run and nothing damaged enters it.
 *
 * Blocks are host memory in the step's layouts (codegen/sbp_step.h): the parameter block holds
 * each parameter's numel floats at its offset (a bf16-only frozen weight is skipped: it is the
 * model file's, rounded, and never updated); the gradient block, which is also the moments'
 * layout, holds each trained parameter's numel floats at its grad_offset. A check may cover a
 * range [first, first + n) of the block only (a ZeRO slice, a piece being written).
 */
#ifndef SBP_TRAIN_FINITE_H
#define SBP_TRAIN_FINITE_H

#include <stdbool.h>
#include <stddef.h>

#include "sbp_step.h"

typedef enum train_block {
    TRAIN_BLOCK_PARAMS,  /* the parameter block (offset) */
    TRAIN_BLOCK_MOMENTS, /* the gradient block's layout (grad_offset): gradients, m, v */
} train_block;

/* Checks elements [first, first + n) of a block held at v (v[0] is element `first`): every
 * value finite and, when nonneg, >= 0. 0 when they are; else -1 with err = "WHAT: tensor 'NAME'
 * holds VALUE at element K" for the first bad element (what: "the checkpoint's adamw.v", ...). */
int train_finite_check(const sbp_step_info *in, train_block block, const float *v, size_t first,
                       size_t n, bool nonneg, const char *what, char *err, size_t errlen);

#endif
