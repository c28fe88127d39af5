/* recognize.c — the recognition pass: runs each recogniser in turn (their shared helpers are
 * recognize_util.c, below them).
 *
 * requires: bound dims, folded shape arithmetic, dce (so patterns are not obscured by dead uses).
 * produces: semantic ops in place of their ONNX patterns. Order matters: Mixture-of-Experts
 *           blocks first (their router Gemm and raw Sigmoid / Mul SiLU are theirs); norms and activations
 *           first (their patterns contain Mul/Div that the attention and linear matchers must not
 *           see), attention before linear (attention reads the projection MatMuls' outputs, not
 *           the MatMuls themselves), the loss last.
 */
#include "recognize.h"

int sbp_pass_recognize(ir_graph *g)
{
    int (*const recognisers[])(ir_graph *) = {
        sbp_recognize_moe,       sbp_recognize_norms,       sbp_recognize_activations,
        sbp_recognize_rope,
        sbp_recognize_attention, sbp_recognize_linear,      sbp_recognize_embedding,
        sbp_recognize_loss,
    };
    for (size_t i = 0; i < sizeof recognisers / sizeof recognisers[0]; i++) {
        if (recognisers[i](g) != IR_OK || ir_infer_graph(g) != IR_OK)
            return IR_ERR;
        if (sbp_pass_dce(g) != IR_OK)
            return IR_ERR;
    }
    return ir_graph_toposort(g);
}
