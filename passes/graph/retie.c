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

#include <stdlib.h>
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

static bool candidate(const ir_value *v)
{
    return v->kind == IR_VAL_PARAM && v->rank == 2 && ir_value_shape_known(v) && v->data &&
           !v->tied_to && v->nbytes > 0;
}

static const uint64_t *retie_keys; /* qsort has no context argument; single-threaded */

static int cmp_key(const void *pa, const void *pb)
{
    int a = *(const int *)pa, b = *(const int *)pb;
    if (retie_keys[a] != retie_keys[b])
        return retie_keys[a] < retie_keys[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

int sbp_pass_retie(ir_graph *g)
{
    /* Use lists once: the pass is O(params^2) shape comparisons at worst, never O(nodes) per
     * pair (import + canonicalisation must stay linear in depth). */
    ir_uses u = ir_uses_build(g);
    if (!u.n_uses)
        return ir_diag_error(g->diag, "out of memory building use lists");
    int nv = g->n_values, nc = 0;
    ir_value **cand = ir_arena_calloc(g->arena, (size_t)nv + 1, sizeof *cand);
    bool *gathered = ir_arena_calloc(g->arena, (size_t)nv + 1, sizeof *gathered);
    if (!cand || !gathered)
        return ir_diag_error(g->diag, "out of memory re-tying");
    for (int i = 0; i < nv; i++) {
        ir_value *v = g->values[i];
        if (!candidate(v) || (u.n_uses[i] == 0 && !v->is_output))
            continue;
        cand[nc++] = v;
        for (int k = 0; k < u.n_uses[i]; k++)
            if (u.uses[i][k].node->op == IR_OP_GATHER && u.uses[i][k].slot == 0)
                gathered[i] = true;
    }
    /* Only candidates with the same key can be each other's transpose: the key hashes what a
     * transpose keeps (dtype, the two dims unordered, the diagonal), so a model with many
     * same-shaped weights is not O(params^2) element comparisons. Each group keeps the
     * candidates' order, so the first match is the same as over all of them. */
    uint64_t *key = ir_arena_calloc(g->arena, (size_t)nc + 1, sizeof *key);
    int *ord = ir_arena_calloc(g->arena, (size_t)nc + 1, sizeof *ord);
    int *grp = ir_arena_calloc(g->arena, (size_t)nc + 1, sizeof *grp);
    if (!key || !ord || !grp)
        return ir_diag_error(g->diag, "out of memory re-tying");
    for (int i = 0; i < nc; i++) {
        const ir_value *v = cand[i];
        int64_t m = v->dims[0].value, n = v->dims[1].value;
        size_t es = ir_dtype_size(v->dtype);
        uint64_t h = 1469598103934665603u ^ (uint64_t)v->dtype;
        h = (h ^ (uint64_t)(m < n ? m : n)) * 1099511628211u;
        h = (h ^ (uint64_t)(m < n ? n : m)) * 1099511628211u;
        const unsigned char *d = v->data;
        for (int64_t k = 0; k < m && k < n; k++)
            for (size_t e = 0; e < es; e++)
                h = (h ^ d[(size_t)(k * n + k) * es + e]) * 1099511628211u;
        key[i] = h;
        ord[i] = i;
    }
    retie_keys = key;
    qsort(ord, (size_t)nc, sizeof *ord, cmp_key);
    for (int i = 0; i < nc; i++) /* grp[c]: where c's group starts in ord */
        grp[ord[i]] = i > 0 && key[ord[i]] == key[ord[i - 1]] ? grp[ord[i - 1]] : i;
    for (int bi = 0; bi < nc; bi++) {
        ir_value *b = cand[bi];
        /* An embedding table (read by Gather) is always the owner, never the copy: with a
         * square pair either could be called the transpose of the other. */
        if (b->tied_to || gathered[b->id] || all_equal(b))
            continue;
        for (int oi = grp[bi]; oi < nc && key[ord[oi]] == key[bi]; oi++) {
            ir_value *a = cand[ord[oi]];
            if (a == b || a->tied_to || a->dtype != b->dtype ||
                a->dims[0].value != b->dims[1].value || a->dims[1].value != b->dims[0].value ||
                !is_transpose(a, b))
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
            b->tied_to = a;
            ir_diag_note(g->diag, "re-tied '%s' to the transpose of '%s' (the exporter had "
                         "folded a tied weight into a copy; --no-retie keeps them apart)",
                         b->name, a->name);
            break;
        }
    }
    return IR_OK;
}
