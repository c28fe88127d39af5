/* packed.c — packed documents: learned position embeddings read each token's position in its
 * document (sbpc --packed; passes/train/train.h, "Packed documents").
 *
 * A packed row holds several documents back to back, and each must see positions that restart
 * at 0. RoPE needs nothing here: after recognition its positions are an operand of the kernel,
 * which a packed program fills with doc_pos (train_tx.c, tx_positions). A learned position
 * table (GPT-2's wpe) is different: the exporter gathers it by the constant positions 0..T-1,
 * which fold into an Embedding of a [1,T] (or [T]) index constant, broadcast over the batch by
 * the Add that follows. This pass gives such an Embedding the graph input
 * SBP_DOC_POSITIONS_INPUT [B,T] (int32) instead, so its output becomes [B,T,D]: the same Add
 * then adds each token its own document position's row. The training program binds that input
 * to the buffer the step computes from the document ids (train/autodiff.c), so nothing else
 * changes, gradients included (the table's gradient scatters by document position).
 *
 * requires: the canonical graph (Embedding recognised, dims bound, constants folded).
 * produces: as above; a consumer whose output shape would change is an error naming it (the
 * broadcast Add keeps its [B,T,D]).
 */
#include "passes.h"

#include <string.h>

/* v is an integer constant of n elements holding 0, 1, ..., T-1 (repeated: element i == i % T). */
static bool is_positions(const ir_value *v, int64_t T)
{
    if (!ir_value_is_const(v) || !ir_dtype_is_int(v->dtype) || T <= 0)
        return false;
    int64_t n = ir_value_numel(v);
    if (n != T)
        return false;
    for (int64_t i = 0; i < n; i++)
        if (ir_const_i64(v, i) != i % T)
            return false;
    return true;
}

/* The token-id input [B, T]: the graph's one integer input of rank 2 (before the objective
 * adds labels). */
static const ir_value *token_input(const ir_graph *g)
{
    for (int i = 0; i < g->n_inputs; i++) {
        const ir_value *v = g->inputs[i];
        if (ir_dtype_is_int(v->dtype) && v->rank == 2 && ir_value_shape_known(v) &&
            !(v->name && strcmp(v->name, SBP_DOC_POSITIONS_INPUT) == 0))
            return v;
    }
    return NULL;
}

/* The new graph input, once. */
static ir_value *doc_positions_input(ir_graph *g, const ir_value *ids)
{
    ir_value *found = ir_value_find(g, SBP_DOC_POSITIONS_INPUT);
    if (found && found->kind == IR_VAL_INPUT)
        return found;
    ir_value *v = ir_value_new(g, SBP_DOC_POSITIONS_INPUT, IR_VAL_INPUT, IR_DT_INT32, 2,
                               ids->dims);
    ir_value **ins = ir_arena_calloc(g->arena, (size_t)g->n_inputs + 1, sizeof *ins);
    if (!v || !ins)
        return NULL;
    memcpy(ins, g->inputs, (size_t)g->n_inputs * sizeof *ins);
    ins[g->n_inputs] = v;
    g->inputs = ins;
    g->n_inputs++;
    return v;
}

int sbp_pass_packed(ir_graph *g, int *n_rewritten)
{
    if (n_rewritten)
        *n_rewritten = 0;
    const ir_value *ids = token_input(g);
    if (!ids)
        return ir_diag_error(g->diag, "--packed: the graph needs a token-id input [batch, "
                                      "sequence] of known shape (bind --batch and --seq-len)");
    const int64_t T = ids->dims[1].value;
    ir_uses u = ir_uses_build(g);
    if (!u.uses)
        return ir_diag_error(g->diag, "out of memory");
    int n = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        ir_node *e = g->nodes[k];
        if (e->dead || e->op != IR_OP_EMBEDDING || e->n_in < 2 || !is_positions(e->in[1], T))
            continue;
        ir_value *pos = doc_positions_input(g, ids);
        if (!pos)
            return ir_diag_error(g->diag, "out of memory");
        ir_value *out = e->out[0];
        e->in[1] = pos;
        /* the output gets the batch: [B, T, D] (inferred afresh: rank -1 is unknown) */
        out->rank = -1;
        if (ir_infer_node(g, e) != IR_OK)
            return IR_ERR;
        /* its readers must keep their shapes (the broadcast Add does) */
        for (int j = 0; j < u.n_uses[out->id]; j++) {
            ir_node *r = u.uses[out->id][j].node;
            if (r->dead)
                continue;
            ir_dim before[IR_MAX_RANK];
            int rank = r->out[0] ? r->out[0]->rank : 0;
            if (r->out[0]) {
                memcpy(before, r->out[0]->dims, (size_t)rank * sizeof *before);
                r->out[0]->rank = -1;
            }
            if (ir_infer_node(g, r) != IR_OK)
                return IR_ERR;
            bool same = r->out[0] && r->out[0]->rank == rank;
            for (int a = 0; same && a < rank; a++)
                same = r->out[0]->dims[a].value == before[a].value;
            if (!same)
                return ir_diag_add(g->diag, IR_SEV_ERROR, r->name, ir_op_name(r->op),
                                   "--packed: the position embedding '%s' now has one row per "
                                   "token, and this node's output shape would change with it",
                                   e->name ? e->name : "?");
        }
        n++;
    }
    if (n_rewritten)
        *n_rewritten = n;
    return IR_OK;
}
