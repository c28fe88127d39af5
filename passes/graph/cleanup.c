/* cleanup.c — fold and dce again after recognition (the flow's "cleanup" stage; passes.h).
 *
 * Recognition leaves behind what its semantic ops replaced: the patterns' nodes are marked dead,
 * and the constant chains only they read (the causal mask's T x T arithmetic, RoPE's table
 * gathers, a norm's epsilon) are left without readers. Folding again evaluates any node that
 * recognition left with only constant inputs, and dce then drops everything no output needs,
 * so that the training program sees only the semantic graph.
 *
 * requires: a recognised graph. produces: the graph with nothing left to fold (under max_elems,
 * as sbp_pass_fold_max) and no node that does not reach an output.
 */
#include "passes.h"

int sbp_pass_cleanup(ir_graph *g, int64_t max_elems)
{
    if (sbp_pass_fold_max(g, max_elems) != IR_OK)
        return IR_ERR;
    return sbp_pass_dce(g);
}
