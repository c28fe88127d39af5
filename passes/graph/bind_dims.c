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
 *
 * Sizes (ir/checked.h). Binding is where untrusted numbers (the command line's) meet the model's
 * shapes, so it is also where sizes are first checked as a whole: B*T token rows must fit the C
 * `int` the runtime's kernels count rows with, and every value's shape, now known, must pass
 * ir_check_shape_size (shape inference checks node outputs; inputs, initializers and declared
 * shapes are checked here). sbp_check_compile_size (run by the pipeline before fold) then refuses
 * a binding whose constants alone could not be built on this machine, before building any.
 */
#include "passes.h"
#include "checked.h"

#include <string.h>
#include <unistd.h>

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
    /* B*T token rows: the runtime's kernels (embedding, the LM head's GEMM and cross-entropy,
     * the norms) take the row count as a C int, on the CPU and the CUDA target alike */
    int64_t rows;
    if (ids->dims[0].value > 0 && ids->dims[1].value > 0 &&
        (!ck_mul_i64(ids->dims[0].value, ids->dims[1].value, &rows) || rows > IR_MAX_KERNEL_INT))
        return ir_diag_error(g->diag,
                             "--batch %lld x --seq-len %lld is more token rows than the "
                             "runtime's kernels can index (they count rows with a C int: at "
                             "most %lld)",
                             (long long)ids->dims[0].value, (long long)ids->dims[1].value,
                             (long long)IR_MAX_KERNEL_INT);
    if (ir_infer_graph(g) != IR_OK)
        return IR_ERR;
    /* inference checked every node output; what is left (inputs, initializers) stops at the
     * first too-large value: one error, not one per value sized from it */
    for (int i = 0; i < g->n_values && rc == IR_OK; i++) {
        const ir_value *v = g->values[i];
        if (ir_check_shape_size(g, v->producer, v->producer ? "output" : "value", v) != IR_OK)
            rc = IR_ERR;
    }
    return rc;
}

/* ------------------------------------------------------------------ the compile-size check */

static void human_bytes(char *buf, size_t n, double b)
{
    static const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (b >= 1024 && u < 6) {
        b /= 1024;
        u++;
    }
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
}

int64_t sbp_compile_mem_limit(int64_t given)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    int64_t phys = pages > 0 && psz > 0 ? ck_mul_sat_i64(pages, psz) : INT64_MAX;
    return given > 0 && given < phys ? given : phys;
}

int sbp_check_compile_size(ir_graph *g, int64_t fold_cap, int64_t mem_limit)
{
    mem_limit = sbp_compile_mem_limit(mem_limit);
    /* What fold will build: every output of a node fed only by constants (transitively), up to
     * the cap, is evaluated into a constant, and the arena keeps it for the compilation. The
     * shapes are known and checked (bind_dims), so this costs O(nodes), allocates nothing. */
    bool *cd = ir_arena_calloc(g->arena, (size_t)g->n_values + 1, sizeof(bool));
    if (!cd)
        return ir_diag_error(g->diag, "out of memory");
    int64_t fold_bytes = 0, param_bytes = 0, token_bytes = 0;
    const ir_node *largest = NULL;
    int64_t largest_bytes = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        cd[v->id] = ir_value_is_const(v);
        if (v->kind == IR_VAL_PARAM)
            param_bytes = ck_add_sat_i64(param_bytes, (int64_t)v->nbytes);
        if (v->kind == IR_VAL_INPUT && ir_value_numel(v) > 0)
            token_bytes = ck_add_sat_i64(token_bytes, ck_mul_sat_i64(ir_value_numel(v), 4));
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        bool all = true;
        if ((n->op == IR_OP_SHAPE || n->op == IR_OP_SIZE) && n->n_in > 0 && n->in[0])
            all = ir_value_shape_known(n->in[0]); /* fold reads only the shape */
        else
            for (int k = 0; k < n->n_in && all; k++)
                all = !n->in[k] || cd[n->in[k]->id];
        for (int k = 0; k < n->n_out; k++) {
            const ir_value *o = n->out[k];
            if (!o)
                continue;
            int64_t ne = ir_value_numel(o);
            cd[o->id] = all && ne >= 0 && ne <= fold_cap;
            if (!cd[o->id])
                continue;
            int64_t b = ck_mul_sat_i64(ne, (int64_t)ir_dtype_size(o->dtype));
            fold_bytes = ck_add_sat_i64(fold_bytes, b);
            if (b > largest_bytes) {
                largest_bytes = b;
                largest = n;
            }
        }
    }
    /* the step's own floor: its parameters and their gradients, and the token inputs (int32) */
    int64_t step_floor = ck_add_sat_i64(ck_mul_sat_i64(param_bytes, 2), token_bytes);
    int64_t need = ck_add_sat_i64(fold_bytes, step_floor);
    if (need <= mem_limit)
        return IR_OK;
    char b_need[32], b_fold[32], b_step[32], b_big[32], b_lim[32];
    human_bytes(b_need, sizeof b_need, (double)need);
    human_bytes(b_fold, sizeof b_fold, (double)fold_bytes);
    human_bytes(b_step, sizeof b_step, (double)step_floor);
    human_bytes(b_big, sizeof b_big, (double)largest_bytes);
    human_bytes(b_lim, sizeof b_lim, (double)mem_limit);
    return ir_diag_error(g->diag,
                         "--batch %lld --seq-len %lld: compiling needs at least %lld bytes "
                         "(%s): the step's parameters, gradients and token inputs take %s, "
                         "and the constants sbpc must fold at this length %s (the largest, "
                         "of node '%s' (%s), %s); that is more than the %lld bytes (%s) of "
                         "memory allowed (this machine's, or SBPC_MAX_COMPILE_BYTES): give a "
                         "shorter --seq-len or a smaller --batch",
                         (long long)g->bind_batch, (long long)g->bind_seq, (long long)need,
                         b_need, b_step, b_fold, largest ? largest->name : "-",
                         largest ? largest->op_type : "-", b_big, (long long)mem_limit, b_lim);
}
