/* recognize_embedding.c — table lookups by a parameter to Embedding.
 *
 * Recognised:
 *   Gather(table, ids) axis 0, table a rank-2 float parameter [V,D], ids integers of any rank
 *                                                   -> Embedding(table, ids)   [..., D]
 * Token embeddings read the input ids; learned position embeddings (GPT-2's wpe) read a
 * constant position range after fold, and become an Embedding with constant ids all the same.
 * A Reshape in front of ids that does not change the shape (GPT-2's input_ids.view(-1, T)) is
 * looked through. Gathers from constants (RoPE's cos/sin caches) are not embeddings and stay.
 *
 * requires: bound dims, fold, dce.
 * produces: Embedding(table, ids) taking over the Gather's output value (name, uses, graph-output
 *           role); replaced nodes are marked dead for dce.
 */
#include "recognize.h"

#include <string.h>

static bool dim_eq(ir_dim a, ir_dim b)
{
    if (a.value >= 0 || b.value >= 0)
        return a.value == b.value;
    return a.sym && b.sym && strcmp(a.sym, b.sym) == 0;
}

static bool shape_eq(const ir_value *a, const ir_value *b)
{
    if (a->rank < 0 || a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (!dim_eq(a->dims[i], b->dims[i]))
            return false;
    return true;
}

int sbp_recognize_embedding(ir_graph *g)
{
    ir_uses u = ir_uses_build(g);
    int nv = g->n_values;
    if (!u.n_uses)
        return ir_diag_error(g->diag, "out of memory building use lists");
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        if (n->dead || n->op != IR_OP_GATHER || !n->out[0] || ir_attr_int(n, "axis", 0) != 0)
            continue;
        ir_value *table = n->in[0], *ids = n->in[1];
        if (!table || table->kind != IR_VAL_PARAM || table->rank != 2 ||
            !ir_dtype_is_float(table->dtype) || !ids || !ir_dtype_is_int(ids->dtype) ||
            ids->rank < 0)
            continue;
        ir_node *replaced[2] = {n, NULL};
        int n_replaced = 1;
        ir_node *noop = rz_producer(ids, IR_OP_RESHAPE);
        if (noop && noop->in[0] && shape_eq(noop->in[0], ids)) {
            if (ids->id < nv && rz_uses_exactly(&u, ids, 1))
                replaced[n_replaced++] = noop;
            ids = noop->in[0];
        }
        /* The Embedding takes over the Gather's output value. */
        ir_value *result = n->out[0], *in[2] = {table, ids};
        ir_node *e = ir_node_new_with_outputs(g, IR_OP_EMBEDDING, NULL, NULL, 2, in, 1, &result);
        if (!e)
            return ir_diag_error(g->diag, "out of memory");
        for (int k = 0; k < n_replaced; k++) {
            ir_node_add_origin(g, e, replaced[k]);
            replaced[k]->dead = true;
        }
        ir_node_move_after(g, e, n);
        if (ir_infer_node(g, e) != IR_OK)
            return IR_ERR;
    }
    return IR_OK;
}
