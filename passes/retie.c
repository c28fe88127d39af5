/* retie.c — restore weight tying that the exporter folded away.
 *
 * requires: parameters imported; shape arithmetic folded.
 * produces: for every 2-D parameter B that is bitwise equal to the transpose of another 2-D
 *           parameter A, B->tied_to = A and B's uses read Transpose(A) instead; later passes turn
 *           MatMul(x, Transpose(A)) into Linear(x, A, trans_w=1), so A gets one gradient.
 *
 * Why: the TorchScript exporter constant-folds `x @ wte.weight.T` of a tied LM head into a second
 * initializer holding wte.weight transposed. Training the two copies separately silently changes
 * the model (they drift apart). Parameters whose elements are all equal (zero-initialised
 * adapters, say) are never tied: equality there says nothing about the model.
 */
#include "passes.h"

#include <string.h>

static bool all_equal(const ir_value *v)
{
    size_t es = ir_dtype_size(v->dtype);
    for (size_t off = es; off < v->nbytes; off += es)
        if (memcmp((const char *)v->data, (const char *)v->data + off, es) != 0)
            return false;
    return true;
}

/* b == transpose(a), bitwise, a: [m,n], b: [n,m]. */
static bool is_transpose(const ir_value *a, const ir_value *b)
{
    int64_t m = a->dims[0].value, n = a->dims[1].value;
    size_t es = ir_dtype_size(a->dtype);
    const char *pa = a->data, *pb = b->data;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            if (memcmp(pa + (size_t)(i * n + j) * es, pb + (size_t)(j * m + i) * es, es) != 0)
                return false;
    return true;
}

static bool gathered(const ir_graph *g, const ir_value *v)
{
    for (int i = 0; i < g->n_nodes; i++)
        if (!g->nodes[i]->dead && g->nodes[i]->op == IR_OP_GATHER && g->nodes[i]->in[0] == v)
            return true;
    return false;
}

static bool candidate(const ir_value *v)
{
    return v->kind == IR_VAL_PARAM && v->rank == 2 && ir_value_shape_known(v) && v->data &&
           !v->tied_to && v->nbytes > 0;
}

int sbp_pass_retie(ir_graph *g)
{
    int nv = g->n_values;
    for (int bi = 0; bi < nv; bi++) {
        ir_value *b = g->values[bi];
        /* An embedding table (read by Gather) is always the owner, never the copy: with a
         * square pair either could be called the transpose of the other. */
        if (!candidate(b) || ir_value_use_count(g, b) == 0 || all_equal(b) || gathered(g, b))
            continue;
        for (int ai = 0; ai < nv; ai++) {
            ir_value *a = g->values[ai];
            if (a == b || !candidate(a) || a->dtype != b->dtype ||
                a->dims[0].value != b->dims[1].value || a->dims[1].value != b->dims[0].value ||
                ir_value_use_count(g, a) == 0 || !is_transpose(a, b))
                continue;
            ir_value *in[1] = {a};
            ir_node *t = ir_node_new(g, IR_OP_TRANSPOSE, NULL, 1, in, 1);
            if (!t)
                return ir_diag_error(g->diag, "out of memory re-tying '%s'", b->name);
            int64_t perm[2] = {1, 0};
            ir_attr_set_ints(g, t, "perm", perm, 2);
            if (ir_infer_node(g, t) != IR_OK)
                return IR_ERR;
            ir_node_move_after(g, t, NULL);
            ir_replace_uses(g, b, t->out[0]);
            t->in[0] = a; /* ir_replace_uses never touches it, but be explicit */
            b->tied_to = a;
            ir_diag_note(g->diag, "re-tied '%s' to the transpose of '%s' (the exporter had "
                         "folded a tied weight into a copy; --no-retie keeps them apart)",
                         b->name, a->name);
            break;
        }
    }
    return IR_OK;
}
