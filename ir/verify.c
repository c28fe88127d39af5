/* verify.c — the IR verifier, run between passes.
 *
 * It checks the invariants stated in ir.h and reports every violation it finds (not just the
 * first), each naming the node and input concerned. A pass that breaks the graph is caught at the
 * pass boundary rather than as a wrong number three stages later.
 */
#include "ir.h"

#include <stdlib.h>

__attribute__((format(printf, 3, 4)))
static int bad(ir_graph *g, const ir_node *n, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ir_diag_add(g->diag, IR_SEV_ERROR, n ? n->name : NULL, n ? n->op_type : NULL,
                       "verifier: %s", msg);
}

int ir_verify(ir_graph *g)
{
    int rc = IR_OK;
    /* defined[v] : value is available at this point of the node order */
    bool *defined = calloc((size_t)g->n_values + 1, 1);
    if (!defined)
        return ir_diag_error(g->diag, "out of memory in the verifier");
    for (int i = 0; i < g->n_values; i++) {
        ir_value *v = g->values[i];
        if (v->id != i)
            rc = bad(g, NULL, "value '%s' has id %d out of place", v->name, v->id);
        if (v->kind != IR_VAL_NODE)
            defined[i] = true;
        if (v->kind == IR_VAL_PARAM || v->kind == IR_VAL_CONST) {
            int64_t n = ir_value_numel(v);
            if (n < 0)
                rc = bad(g, NULL, "constant '%s' has an unknown shape", v->name);
            else if (!v->data || v->nbytes != (size_t)n * ir_dtype_size(v->dtype))
                rc = bad(g, NULL, "constant '%s' data size does not match its shape", v->name);
        }
        if (v->rank > IR_MAX_RANK)
            rc = bad(g, NULL, "value '%s' has rank %d", v->name, v->rank);
    }
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        if ((int)n->op < 0 || n->op >= IR_OP_COUNT) {
            rc = bad(g, n, "node has an invalid op");
            continue;
        }
        const ir_op_info *oi = &ir_op_table[n->op];
        if (n->n_in < oi->min_in || (oi->max_in >= 0 && n->n_in > oi->max_in))
            rc = bad(g, n, "has %d inputs, outside the op's arity", n->n_in);
        if (n->n_out < oi->min_out || (oi->max_out >= 0 && n->n_out > oi->max_out))
            rc = bad(g, n, "has %d outputs, outside the op's arity", n->n_out);
        for (int j = 0; j < n->n_in; j++) {
            ir_value *v = n->in[j];
            if (!v) {
                if (j < oi->min_in)
                    rc = bad(g, n, "required input %d is absent", j);
                continue;
            }
            if (v->id < 0 || v->id >= g->n_values || g->values[v->id] != v)
                rc = bad(g, n, "input %s (slot %d) is not a value of this graph", v->name, j);
            else if (!defined[v->id])
                rc = bad(g, n, "input '%s' (slot %d) is used before it is defined", v->name, j);
        }
        for (int j = 0; j < n->n_out; j++) {
            ir_value *v = n->out[j];
            if (!v)
                continue;
            if (v->producer != n || v->producer_slot != j || v->kind != IR_VAL_NODE)
                rc = bad(g, n, "output '%s' (slot %d) does not point back to its producer",
                         v->name, j);
            else if (defined[v->id])
                rc = bad(g, n, "output '%s' (slot %d) is defined twice", v->name, j);
            else
                defined[v->id] = true;
        }
    }
    if (g->n_outputs == 0)
        rc = ir_diag_error(g->diag, "verifier: the graph has no outputs");
    for (int i = 0; i < g->n_outputs; i++)
        if (!defined[g->outputs[i]->id])
            rc = bad(g, NULL, "graph output '%s' is never defined", g->outputs[i]->name);
    free(defined);
    return rc;
}
