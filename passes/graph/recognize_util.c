/* recognize_util.c — the helpers every recogniser (recognize_*.c) shares (recognize.h):
 * finding a pattern's producers, reading scalar constants, checking that a pattern's pieces have
 * no other uses, and replacing a pattern by its semantic node. They sit below the recognisers
 * and the pass that runs them (recognize.c), so that no file calls back up.
 */
#include "recognize.h"

#include <math.h>

ir_node *rz_producer(const ir_value *v, ir_op op)
{
    if (!v || v->kind != IR_VAL_NODE || !v->producer || v->producer->dead)
        return NULL;
    return v->producer->op == op ? v->producer : NULL;
}

bool rz_const_scalar(const ir_value *v, double *out)
{
    if (!ir_value_is_const(v))
        return false;
    int64_t n = ir_value_numel(v);
    if (n < 1 || !(ir_dtype_is_float(v->dtype) || ir_dtype_is_int(v->dtype)))
        return false;
    if (v->dtype == IR_DT_FLOAT16 || v->dtype == IR_DT_BFLOAT16)
        return false;
    double x = ir_const_f64(v, 0);
    for (int64_t i = 1; i < n; i++) {
        double y = ir_const_f64(v, i);
        if (!(y == x || (isnan(x) && isnan(y))))
            return false;
    }
    *out = x;
    return true;
}

bool rz_uses_exactly(const ir_uses *u, const ir_value *v, int n)
{
    return !v->is_output && u->n_uses[v->id] == n;
}

ir_value *rz_other(const ir_node *bin, const ir_value *one)
{
    if (bin->n_in != 2)
        return NULL;
    if (bin->in[0] == one)
        return bin->in[1];
    if (bin->in[1] == one)
        return bin->in[0];
    return NULL;
}

ir_node *rz_replace(ir_graph *g, ir_op op, ir_value *const *in, int n_in, ir_value *result,
                    ir_node *const *replaced, int n_replaced)
{
    /* The semantic node takes over the pattern's result value, so ONNX names (a graph output
     * called "logits", say) survive canonicalisation. Its type is re-inferred by the caller or
     * by sbp_pass_recognize, after attributes that decide it (Linear's trans_w) are set. */
    ir_node *root = result->producer;
    ir_node *n = ir_node_new_with_outputs(g, op, NULL, NULL, n_in, in, 1, &result);
    if (!n)
        return NULL;
    for (int i = 0; i < n_replaced; i++)
        if (replaced[i]) {
            ir_node_add_origin(g, n, replaced[i]);
            /* Dead at once: use lists are built once per sweep, and a later match in the same
             * sweep must not pick up pieces already replaced. dce removes them. */
            replaced[i]->dead = true;
        }
    if (root) {
        root->dead = true;
        ir_node_move_after(g, n, root);
        /* the module it was exported from (dynamo metadata) stays known: --lora names the
         * Linear it adapts by it (ir/torch.h) */
        n->scope = root->scope;
    }
    return n;
}
