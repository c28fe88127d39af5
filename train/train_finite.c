/* train_finite.c — the finite checks of train_finite.h: a scan of the block, then the parameter
 * table to name the tensor that holds the first bad element (the scan is over the whole range,
 * so elements that belong to no tensor, alignment padding, are checked too: they are zero).
 * The owner lookup is linear in the parameters, but runs once, for the element that fails. */
#include "train_finite.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"

/* The floats a tensor occupies in the block: a bf16-only weight, (numel + 1) / 2. */
static size_t room(const sbp_step_param *p, train_block block)
{
    return block == TRAIN_BLOCK_PARAMS && p->storage == SBP_STEP_PARAM_BF16 ? (p->numel + 1) / 2
                                                                            : p->numel;
}

/* The tensor of the block that holds element e (NULL: none, padding). */
static const sbp_step_param *owner(const sbp_step_info *in, train_block block, size_t e)
{
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (p->tied_to >= 0)
            continue;
        if (block == TRAIN_BLOCK_MOMENTS && (!p->trainable || p->grad_offset == SIZE_MAX))
            continue;
        size_t at = block == TRAIN_BLOCK_PARAMS ? p->offset : p->grad_offset;
        if (e >= at && e - at < room(p, block))
            return p;
    }
    return NULL;
}

int train_finite_check(const sbp_step_info *in, train_block block, const float *v, size_t first,
                       size_t n, bool nonneg, const char *what, char *err, size_t errlen)
{
    for (size_t k = 0; k < n; k++) {
        const float x = v[k];
        if (isfinite(x) && !(nonneg && x < 0))
            continue;
        const size_t e = first + k;
        const sbp_step_param *p = owner(in, block, e);
        /* bf16-only weights hold two values a float: their bits are no float's */
        if (p && block == TRAIN_BLOCK_PARAMS && p->storage == SBP_STEP_PARAM_BF16)
            continue;
        const size_t at = !p ? 0 : block == TRAIN_BLOCK_PARAMS ? p->offset : p->grad_offset;
        if (p)
            return cli_errf(err, errlen, "%s: tensor '%s' holds %g at element %zu (of %zu)%s",
                            what, p->name, (double)x, e - at, p->numel,
                            nonneg && x < 0 ? ", and it cannot be negative" : "");
        return cli_errf(err, errlen, "%s: element %zu of the block (padding between tensors) "
                        "holds %g", what, e, (double)x);
    }
    return 0;
}
