/* params.c — which initializers are trainable parameters and which are constants.
 *
 * The importer makes every float initializer a PARAM. That is wrong for what exporters store as
 * initializers besides weights: the dynamo exporter writes scalars (eps, exponents, scales, fill
 * values), rotary `inv_freq`, Gemma's embedding normaliser and similar buffers as initializers,
 * and TorchScript keeps named buffers such as `model.rotary_emb.inv_freq`. Taken for parameters
 * they would be "trained", and nothing computed from them would fold, so norms, RoPE and masks
 * would stay unrecognised. This pass demotes them to CONST, in this order of authority:
 *
 *   1. What the file says. The dynamo exporter records torch.export's graph signature (see
 *      ir/onnx_import.c): an initializer named by a `PARAMETER target='NAME'` line stays a
 *      parameter; one named by a `BUFFER` or `CONSTANT_TENSOR` line is a constant.
 *   2. By use, for the rest (the dynamo exporter renames weights it transposed to `val_N`, and a
 *      TorchScript export has no signature): a float initializer is a parameter only if it has
 *      more than one element and it meets the token data — some node reads it (directly, or
 *      through layout-only ops: Transpose, Reshape, (Un)Squeeze, Flatten, Cast, Identity, and
 *      arithmetic with a scalar constant, as Gemma's 1 + w) together with a value computed
 *      from a graph input — or it is the table of a Gather. A
 *      weight always does one or the other (MatMul with the activations, Mul/Add with the
 *      normalised rows, a token or learned position embedding); a rotary frequency vector meets
 *      only positions, which are constants once the dims are bound, and a scalar is a
 *      hyper-parameter.
 *
 * requires: the imported graph (before fold, which folds only CONST values); shapes known where
 *           numel is asked (bind-dims ran; an initializer's shape is always static).
 * produces: PARAM values only for trainable weights; every other initializer is CONST. Nothing
 *           else changes. One note line says how many initializers became constants and why.
 * `sbpc --dump-params` lists what remains (tools/sbpc.c).
 */
#include "passes.h"
#include "torch.h"

#include <stdlib.h>
#include <string.h>

enum { SIG_NONE, SIG_PARAM, SIG_CONST };

struct sig_lookup {
    const char *name;
    size_t len;
    int kind;
};

static void sig_lookup_cb(const char *kind, const char *name, size_t len, void *ctx)
{
    struct sig_lookup *q = ctx;
    if (q->kind != SIG_NONE || len != q->len || strncmp(name, q->name, len) != 0)
        return;
    if (strncmp(kind, "PARAMETER", 9) == 0)
        q->kind = SIG_PARAM;
    else if (strncmp(kind, "BUFFER", 6) == 0 || strncmp(kind, "CONSTANT_TENSOR", 15) == 0)
        q->kind = SIG_CONST;
}

/* The kind the signature gives `name` (its first entry of a kind that says one). */
static int signature_kind(const char *sig, const char *name)
{
    struct sig_lookup q = {name, strlen(name), SIG_NONE};
    ir_signature_each(sig, sig_lookup_cb, &q);
    return q.kind;
}

static bool is_layout_op(ir_op op)
{
    switch (op) {
    case IR_OP_TRANSPOSE: case IR_OP_RESHAPE: case IR_OP_UNSQUEEZE: case IR_OP_SQUEEZE:
    case IR_OP_FLATTEN: case IR_OP_CAST: case IR_OP_IDENTITY:
        return true;
    default:
        return false;
    }
}

/* n = Add/Sub/Mul/Div(v, c) or (c, v) with c a scalar constant: Gemma's norms scale by (1 + w),
 * so the weight meets the tokens one such step later. A non-scalar constant operand (positions
 * times a rotary frequency vector) does not count: that is how tables are made. */
static bool scalar_arith(const ir_node *n, const ir_value *v)
{
    if (n->op != IR_OP_ADD && n->op != IR_OP_SUB && n->op != IR_OP_MUL && n->op != IR_OP_DIV)
        return false;
    const ir_value *c = n->in[0] == v ? n->in[1] : n->in[1] == v ? n->in[0] : NULL;
    return c && ir_value_is_const(c) && ir_value_numel(c) == 1;
}

/* Does v (an initializer, or a layout-only view of one, or one of those shifted or scaled by a
 * scalar constant) meet token data at some use? */
static bool meets_tokens(const ir_uses *u, const bool *dep, const ir_value *v, int depth)
{
    if (depth > 16)
        return false;
    for (int k = 0; k < u->n_uses[v->id]; k++) {
        const ir_node *n = u->uses[v->id][k].node;
        if (n->dead)
            continue;
        /* the table of a lookup: a learned position embedding is read with positions only,
         * which are constants once the dims are bound, but it is a weight */
        if ((n->op == IR_OP_GATHER || n->op == IR_OP_GATHER_ND) && u->uses[v->id][k].slot == 0)
            return true;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] && n->in[i] != v && dep[n->in[i]->id])
                return true;
        if ((is_layout_op(n->op) && u->uses[v->id][k].slot == 0) || scalar_arith(n, v))
            for (int o = 0; o < n->n_out; o++)
                if (n->out[o] && meets_tokens(u, dep, n->out[o], depth + 1))
                    return true;
    }
    return false;
}

int sbp_pass_params(ir_graph *g)
{
    /* dep[v]: v is computed from a graph input (the token ids, labels, ...) */
    bool *dep = calloc((size_t)g->n_values + 1, sizeof *dep);
    if (!dep)
        return ir_diag_error(g->diag, "out of memory");
    for (int i = 0; i < g->n_inputs; i++)
        dep[g->inputs[i]->id] = true;
    for (int i = 0; i < g->n_nodes; i++) {
        const ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        /* Shape and Size read only the shape, which bind-dims made static */
        bool d = false;
        for (int j = 0; j < n->n_in && !d && n->op != IR_OP_SHAPE && n->op != IR_OP_SIZE; j++)
            d = n->in[j] && dep[n->in[j]->id];
        for (int j = 0; j < n->n_out; j++)
            if (n->out[j])
                dep[n->out[j]->id] = d;
    }
    ir_uses u = ir_uses_build(g);
    if (!u.n_uses) {
        free(dep);
        return ir_diag_error(g->diag, "out of memory building use lists");
    }
    int by_signature = 0, scalars = 0, by_use = 0;
    const char *example = NULL;
    for (int i = 0; i < g->n_values; i++) {
        ir_value *v = g->values[i];
        if (v->kind != IR_VAL_PARAM)
            continue;
        int sk = signature_kind(g->torch_signature, v->name);
        /* A zero-sized weight (an embedding with 0 rows) would compile into a step that fails
         * at every call (no row to gather) or trains nothing: refuse it here, by name. Rank 2
         * or more, or the exporter's own PARAMETER: an empty 1-d initializer is the exporters'
         * "absent" (Resize's roi, an empty shape) and stays a constant. */
        if (ir_value_numel(v) == 0 && v->rank >= 1 && u.n_uses[v->id] > 0 &&
            (sk == SIG_PARAM || (v->rank >= 2 && meets_tokens(&u, dep, v, 0)))) {
            char ty[160];
            ir_diag_error(g->diag,
                          "parameter '%s' %s has no elements: a zero-sized weight cannot be "
                          "trained (read by node '%s' (%s))",
                          v->name, ir_value_type_str(v, ty, sizeof ty),
                          u.uses[v->id][0].node->name, u.uses[v->id][0].node->op_type);
            continue;
        }
        if (sk == SIG_PARAM)
            continue;
        if (sk == SIG_CONST) {
            by_signature++;
        } else if (ir_value_numel(v) <= 1) {
            scalars++;
        } else if (!meets_tokens(&u, dep, v, 0)) {
            by_use++;
        } else {
            continue;
        }
        v->kind = IR_VAL_CONST;
        if (!example)
            example = v->name;
    }
    free(dep);
    ir_torch_warn_merged(g, &u, g->diag); /* equal weights the exporter stored once */
    if (by_signature + scalars + by_use)
        ir_diag_note(g->diag,
                     "%d float initializer(s) are constants, not parameters: %d buffer(s) by the "
                     "exporter's graph signature, %d scalar(s), %d that never meet the token data "
                     "(e.g. '%s'); `sbpc --dump-params` lists the parameters",
                     by_signature + scalars + by_use, by_signature, scalars, by_use, example);
    return IR_OK;
}
