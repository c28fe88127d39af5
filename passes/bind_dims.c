/* bind_dims.c — give the batch and sequence symbols their extents (--batch, --seq-len).
 *
 * Requires: an imported graph. Produces: the symbols of the token-id input's two dims replaced by
 * the given extents in every value, and shapes re-inferred.
 *
 * Which symbols: exporters name them freely ("batch", "batch_size", "s0", "sequence", ...), so
 * they are read from the model rather than assumed: the first graph input that is an integer
 * tensor of rank 2 holds token ids [batch, sequence]; its dim 0's symbol is the batch symbol
 * and its dim 1's the sequence symbol. Where that dim is static instead, a binding must agree
 * with it. A zero binding means "not given" and leaves the symbol as it is; a negative one is
 * an error. Symbols other than these two are left alone (later stages report them).
 */
#include "passes.h"

#include <string.h>

/* The token-id input: the first integer input of rank 2, or NULL. */
static ir_value *token_input(const ir_graph *g)
{
    for (int i = 0; i < g->n_inputs; i++) {
        ir_value *v = g->inputs[i];
        if (v && v->rank == 2 && ir_dtype_is_int(v->dtype))
            return v;
    }
    return NULL;
}

/* Replaces symbol `sym` by `extent` in every value's dims. */
static void bind_symbol(ir_graph *g, const char *sym, int64_t extent)
{
    for (int i = 0; i < g->n_values; i++) {
        ir_value *v = g->values[i];
        for (int k = 0; k < v->rank; k++)
            if (v->dims[k].value < 0 && v->dims[k].sym && strcmp(v->dims[k].sym, sym) == 0)
                v->dims[k] = (ir_dim){extent, NULL};
    }
}

/* Checks one binding against dim `axis` of the token input; *sym gets its symbol (or NULL). */
static int check_binding(ir_graph *g, const ir_value *ids, int axis, int64_t extent,
                         const char *what, const char **sym)
{
    *sym = NULL;
    if (extent < 0)
        return ir_diag_error(g->diag, "%s must be positive, not %lld", what, (long long)extent);
    if (extent == 0)
        return IR_OK;
    const ir_dim *d = &ids->dims[axis];
    if (d->value >= 0) {
        if (d->value != extent)
            return ir_diag_error(g->diag,
                                 "input '%s' has a static %s dim (dim %d) of %lld but %s "
                                 "%lld was given",
                                 ids->name, axis == 0 ? "batch" : "sequence", axis,
                                 (long long)d->value, what, (long long)extent);
        return IR_OK;
    }
    if (!d->sym)
        return ir_diag_error(g->diag,
                             "input '%s': dim %d has neither an extent nor a name to bind "
                             "%s to",
                             ids->name, axis, what);
    *sym = d->sym;
    return IR_OK;
}

int sbp_pass_bind_dims(ir_graph *g, int64_t batch, int64_t seq_len)
{
    if (batch == 0 && seq_len == 0)
        return ir_infer_graph(g);
    ir_value *ids = token_input(g);
    if (!ids)
        return ir_diag_error(g->diag,
                             "--batch/--seq-len given but the model has no integer input "
                             "of rank 2 (token ids) to take the batch and sequence dims from");
    const char *bsym, *ssym;
    int rc = IR_OK;
    if (check_binding(g, ids, 0, batch, "--batch", &bsym) != IR_OK)
        rc = IR_ERR;
    if (check_binding(g, ids, 1, seq_len, "--seq-len", &ssym) != IR_OK)
        rc = IR_ERR;
    if (rc != IR_OK)
        return rc;
    if (bsym && ssym && strcmp(bsym, ssym) == 0 && batch != seq_len)
        return ir_diag_error(g->diag,
                             "input '%s' names both dims '%s'; they cannot be bound to %lld "
                             "and %lld",
                             ids->name, bsym, (long long)batch, (long long)seq_len);
    /* The symbol strings live in the arena, so they outlive the dims being rewritten. */
    if (bsym)
        bind_symbol(g, bsym, batch);
    if (ssym)
        bind_symbol(g, ssym, seq_len);
    if (batch > 0)
        g->bind_batch = batch;
    if (seq_len > 0)
        g->bind_seq = seq_len;
    return ir_infer_graph(g);
}
