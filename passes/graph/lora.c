/* lora.c — sbpc --lora: PEFT's low-rank adapters added to the canonical graph (lora.h).
 *
 * Approach: one sweep over the live Linear nodes whose weight is a parameter. Each weight is
 * named as PyTorch names it (ir/torch.h: the initializer's own name when the export says it is
 * PyTorch's, else recovered from the module scope of the Linear that reads it, which
 * canonicalisation keeps), and the ones REGEX matches get an adapter pair, made once per weight.
 * Each such Linear's output value y is then read through
 *     h = Linear(x, A) trans_w=1        [..., RANK]   A [RANK, in]: PEFT's layout, trans_w = 1
 *     u = Linear(h, B) trans_w=1        [..., out]    B [out, RANK]
 *     s = Mul(u, alpha / RANK)          (only when the scaling is not 1)
 *     y' = Add(y, s)                    takes over y's readers
 * so no new op kind and no new gradient rule is needed. Then every other parameter is frozen, as
 * PEFT freezes the base model. Nodes are appended and the graph is re-sorted once at the end.
 *
 * The experts of a MoE layer are not Linears: their fused tensors gate_up_proj [E, 2F, d] and
 * down_proj [E, d, F] are the MoE node's slots 2 and 3, matched by their own PyTorch names (as
 * PEFT's target_parameters names them). A matched one gets the pair `<tensor>.lora_A.weight`
 * [E RANK, in], `<tensor>.lora_B.weight` [out, RANK E] in PEFT's ParamWrapper layout, as the
 * MoE node's slots 4, 5 (gate_up) or 6, 7 (down), with attributes lora_rank and lora_scale:
 * the runtime applies them per expert as x A_iᵀ then · B_iᵀ (runtime/sbprt.h), never as a
 * delta matrix.
 *
 * Names that cannot be recovered (a dynamo export whose node metadata was stripped names its
 * transposed weights `val_N` and says no more) cannot be matched: they are counted and the error
 * for a regex that matches nothing says so.
 */
#include "lora.h"

#include "torch.h"

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A Linear's weight parameter, or NULL. */
static ir_value *linear_weight(const ir_node *n)
{
    if (n->dead || n->op != IR_OP_LINEAR || n->n_in < 2 || !n->in[1])
        return NULL;
    ir_value *w = n->in[1];
    return w->kind == IR_VAL_PARAM && w->rank == 2 && w->dtype == IR_DT_FLOAT ? w : NULL;
}

/* PyTorch's name of weight w (malloc'd), or NULL when it cannot be told. */
static char *weight_name(const ir_graph *g, const ir_uses *u, const ir_value *w,
                         const char *prefix)
{
    if (ir_torch_is_name(g, w->name))
        return strdup(w->name);
    ir_torch_name pn = {.tr_hint = -1};
    char err[512];
    if (ir_torch_name_from_scopes(g, u, w, prefix, &pn, err, sizeof err) != 0) {
        free(pn.name);
        return NULL; /* two consumers disagree: not a name to adapt by */
    }
    return pn.name;
}

/* A new node of op on in[0..n_in) with one output, trans_w = 1 for a Linear; its type
 * inferred. NULL after a diagnostic. */
static ir_value *add_node(ir_graph *g, ir_op op, const char *name, ir_value *a, ir_value *b)
{
    ir_value *out = ir_value_new(g, ir_arena_printf(g->arena, "%s_out", name), IR_VAL_NODE,
                                 IR_DT_UNDEFINED, -1, NULL);
    ir_value *in[2] = {a, b};
    ir_node *n = out ? ir_node_new_with_outputs(g, op, name, NULL, 2, in, 1, &out) : NULL;
    if (!n)
        return NULL;
    if (op == IR_OP_LINEAR)
        ir_attr_set_int(g, n, "trans_w", 1);
    return ir_infer_node(g, n) == IR_OK ? out : NULL;
}

/* The adapter parameter `<module><suffix>` [rows, cols], initialised by ir_lora_init. */
static ir_value *add_adapter(ir_graph *g, const char *module, const char *suffix, int64_t rows,
                             int64_t cols, uint64_t seed)
{
    const char *name = ir_arena_printf(g->arena, "%s%s", module, suffix);
    if (ir_value_find(g, name)) {
        ir_diag_error(g->diag, "--lora: the model already has a value named '%s'", name);
        return NULL;
    }
    ir_dim d[2] = {{rows, NULL}, {cols, NULL}};
    ir_value *v = ir_value_new(g, name, IR_VAL_PARAM, IR_DT_FLOAT, 2, d);
    if (!v)
        return NULL;
    v->nbytes = (size_t)(rows * cols) * sizeof(float);
    if (!(v->data = ir_arena_alloc(g->arena, v->nbytes))) {
        ir_diag_error(g->diag, "out of memory");
        return NULL;
    }
    ir_lora_init(name, seed, rows, cols, v->data);
    return v;
}

typedef struct adapter {
    ir_value *a, *b; /* [rank, in], [out, rank] */
} adapter;

/* The adapter of Linear n (weight w, PyTorch name `name`): made on first use. */
static int adapt(ir_graph *g, ir_node *n, const char *name, const sbp_lora_options *o,
                 adapter *ad, ir_value *scale)
{
    ir_value *w = n->in[1], *x = n->in[0], *y = n->out[0];
    const bool tw = ir_attr_int(n, "trans_w", 0) != 0;
    const int64_t in = tw ? w->dims[1].value : w->dims[0].value;
    const int64_t out = tw ? w->dims[0].value : w->dims[1].value;
    const char *op = ir_op_name(n->op);
    if (o->rank > in || o->rank > out)
        return ir_diag_add(g->diag, IR_SEV_ERROR, n->name, op,
                           "--lora %lld: the rank exceeds min(in, out) = min(%lld, %lld) of '%s'",
                           (long long)o->rank, (long long)in, (long long)out, name);
    size_t ml = strlen(name) - strlen(".weight");
    char *module = ir_arena_printf(g->arena, "%.*s", (int)ml, name);
    if (!ad->a && (!(ad->a = add_adapter(g, module, IR_LORA_A_SUFFIX, o->rank, in, o->seed)) ||
                   !(ad->b = add_adapter(g, module, IR_LORA_B_SUFFIX, out, o->rank, o->seed))))
        return IR_ERR;
    const char *base = ir_arena_printf(g->arena, "%s.lora", module);
    ir_value *h = add_node(g, IR_OP_LINEAR, ir_arena_printf(g->arena, "%s_A", base), x, ad->a);
    ir_value *u = h ? add_node(g, IR_OP_LINEAR, ir_arena_printf(g->arena, "%s_B", base), h,
                               ad->b)
                    : NULL;
    ir_value *s = u && scale ? add_node(g, IR_OP_MUL, ir_arena_printf(g->arena, "%s_scale",
                                                                      base), u, scale)
                             : u;
    if (!s)
        return IR_ERR;
    ir_value *y2 = add_node(g, IR_OP_ADD, ir_arena_printf(g->arena, "%s_add", base), y, s);
    if (!y2)
        return IR_ERR;
    /* y's readers (and its graph-output role) go to y'; the Add itself keeps reading y */
    ir_node *add = y2->producer;
    ir_replace_uses(g, y, y2);
    add->in[0] = y;
    return IR_OK;
}

/* The adapter pair of expert tensor w (slot 2: gate_up [E, 2F, d]; slot 3: down [E, d, F]) of
 * MoE node n, under w's own PyTorch name: `<name>.lora_A.weight` [E RANK, in] and
 * `<name>.lora_B.weight` [out, RANK E], PEFT's ParamWrapper layout (train/train_adapter.c maps
 * the names to PEFT's keys). Placed in slots 4, 5 (gate_up) or 6, 7 (down). */
static int adapt_experts(ir_graph *g, ir_node *n, int slot, const sbp_lora_options *o)
{
    ir_value *w = n->in[slot];
    const int64_t E = w->dims[0].value;
    const int64_t in = w->dims[2].value, out = w->dims[1].value;
    if (o->rank > in || o->rank > out)
        return ir_diag_add(g->diag, IR_SEV_ERROR, n->name, ir_op_name(n->op),
                           "--lora %lld: the rank exceeds min(in, out) = min(%lld, %lld) of "
                           "the experts' '%s'",
                           (long long)o->rank, (long long)in, (long long)out, w->name);
    if (n->n_in < 8) { /* the adapter slots, absent (NULL) until adapted */
        ir_value **in8 = ir_arena_alloc(g->arena, 8 * sizeof *in8);
        if (!in8)
            return ir_diag_error(g->diag, "out of memory");
        for (int i = 0; i < 8; i++)
            in8[i] = i < n->n_in ? n->in[i] : NULL;
        n->in = in8;
        n->n_in = 8;
    }
    ir_value *a = add_adapter(g, w->name, IR_LORA_A_SUFFIX, E * o->rank, in, o->seed);
    ir_value *b = a ? add_adapter(g, w->name, IR_LORA_B_SUFFIX, out, o->rank * E, o->seed)
                    : NULL;
    if (!b)
        return IR_ERR;
    n->in[slot == 2 ? 4 : 6] = a;
    n->in[slot == 2 ? 5 : 7] = b;
    ir_attr_set_int(g, n, "lora_rank", o->rank);
    ir_attr_set_float(g, n, "lora_scale", o->alpha / (double)o->rank);
    return IR_OK;
}

int sbp_pass_lora(ir_graph *g, const sbp_lora_options *o, int *n_adapted)
{
    if (n_adapted)
        *n_adapted = 0;
    if (o->rank <= 0)
        return IR_OK;
    const char *targets = o->targets ? o->targets : SBP_LORA_DEFAULT_TARGETS;
    regex_t re;
    int rc = regcomp(&re, targets, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
        char msg[256];
        regerror(rc, &re, msg, sizeof msg);
        return ir_diag_error(g->diag, "--lora-targets '%s': %s", targets, msg);
    }
    ir_uses u = ir_uses_build(g);
    const int nv = g->n_values, nn = g->n_nodes;
    adapter *ads = calloc((size_t)nv + 1, sizeof *ads);
    const ir_value **vals = calloc((size_t)nv + 1, sizeof *vals);
    const char **names = calloc((size_t)nv + 1, sizeof *names);
    ir_node **lin = calloc((size_t)nn + 1, sizeof *lin);
    char *prefix = NULL;
    rc = IR_OK;
    if (!u.n_uses || !ads || !vals || !names || !lin) {
        rc = ir_diag_error(g->diag, "out of memory");
        goto done;
    }
    /* the wrapper prefix of TorchScript scopes, from the parameters PyTorch named */
    for (int i = 0; i < nv; i++)
        if (g->values[i]->kind == IR_VAL_PARAM && ir_torch_is_name(g, g->values[i]->name)) {
            vals[i] = g->values[i];
            names[i] = g->values[i]->name;
        }
    if (!(prefix = ir_torch_learn_prefix(g, &u, nv, vals, names))) {
        rc = ir_diag_error(g->diag, "out of memory");
        goto done;
    }
    int n_lin = 0;
    for (int i = 0; i < nn; i++)
        if (linear_weight(g->nodes[i]))
            lin[n_lin++] = g->nodes[i];
    ir_value *scale = NULL;
    const double scaling = o->alpha / (double)o->rank;
    if (scaling != 1.0) {
        float f = (float)scaling;
        if (!(scale = ir_const_new(g, "lora_scaling", IR_DT_FLOAT, 0, NULL, &f))) {
            rc = ir_diag_error(g->diag, "out of memory");
            goto done;
        }
    }
    int matched = 0, unnamed = 0, n_named = 0;
    const char *example[3] = {NULL, NULL, NULL};
    for (int k = 0; k < n_lin && rc == IR_OK; k++) {
        ir_node *n = lin[k];
        ir_value *w = n->in[1];
        char *name = weight_name(g, &u, w, prefix);
        if (!name || strlen(name) <= strlen(".weight") ||
            strcmp(name + strlen(name) - strlen(".weight"), ".weight") != 0) {
            unnamed++;
            free(name);
            continue;
        }
        if (n_named < 3)
            example[n_named] = ir_arena_strdup(g->arena, name);
        n_named++;
        if (regexec(&re, name, 0, NULL, 0) == 0) {
            if (!ads[w->id].a)
                matched++;
            rc = adapt(g, n, name, o, &ads[w->id], scale);
        }
        free(name);
    }
    /* the experts of MoE layers: their fused tensors are parameters under PyTorch's names
     * (PEFT's target_parameters), matched by those names */
    int n_experts = 0;
    for (int i = 0; i < nn && rc == IR_OK; i++) {
        ir_node *n = g->nodes[i];
        if (n->dead || n->op != IR_OP_MOE || n->n_in < 4)
            continue;
        for (int slot = 2; slot <= 3 && rc == IR_OK; slot++) {
            ir_value *w = n->in[slot];
            if (!w || w->kind != IR_VAL_PARAM || w->rank != 3 || w->dtype != IR_DT_FLOAT ||
                !ir_torch_is_name(g, w->name))
                continue;
            n_experts++;
            if (regexec(&re, w->name, 0, NULL, 0) == 0) {
                rc = adapt_experts(g, n, slot, o);
                matched++;
            }
        }
    }
    if (rc == IR_OK && matched == 0) {
        char ex[600] = "";
        for (int i = 0; i < 3 && example[i]; i++)
            snprintf(ex + strlen(ex), sizeof ex - strlen(ex), "%s'%s'", i ? ", " : "",
                     example[i]);
        char exp_[160] = "";
        if (n_experts)
            snprintf(exp_, sizeof exp_, "; %d fused expert tensors, named like "
                     "'model.layers.0.mlp.experts.gate_up_proj'", n_experts);
        rc = ir_diag_error(g->diag,
                           "--lora-targets '%s' matches no Linear weight of the model (%d "
                           "Linear weights%s%s%s%s; %d without a recoverable PyTorch name%s)",
                           targets, n_named, n_named ? ", named like " : "", ex,
                           n_named > 3 ? ", ..." : "", exp_, unnamed,
                           unnamed ? ": a dynamo export keeps module names only in its nodes' "
                                     "pkg.torch.onnx.name_scopes metadata" : "");
    }
    if (rc == IR_OK) {
        /* PEFT's base model is frozen: only the adapters train */
        for (int i = 0; i < g->n_values; i++) {
            ir_value *v = g->values[i];
            if (v->kind == IR_VAL_PARAM && !ir_lora_kind(v->name))
                v->frozen = true;
        }
        rc = ir_graph_toposort(g);
    }
    if (n_adapted)
        *n_adapted = matched;
    if (rc == IR_OK && matched > 0) { /* recorded for sbp_step_info (codegen) */
        g->lora_rank = o->rank;
        g->lora_alpha = o->alpha;
        g->lora_seed = o->seed;
    }
done:
    free(prefix);
    free(ads);
    free(vals);
    free(names);
    free(lin);
    regfree(&re);
    return rc;
}

int sbp_lora_check_freeze(ir_graph *g, const char *regex)
{
    regex_t re;
    if (regcomp(&re, regex, REG_EXTENDED | REG_NOSUB) != 0)
        return IR_OK; /* sbp_freeze_params reports the bad regex */
    int rc = IR_OK;
    for (int i = 0; i < g->n_values && rc == IR_OK; i++) {
        const ir_value *v = g->values[i];
        if (v->kind == IR_VAL_PARAM && ir_lora_kind(v->name) &&
            regexec(&re, v->name, 0, NULL, 0) == 0)
            rc = ir_diag_error(g->diag,
                               "--freeze '%s' freezes the LoRA adapter '%s': with --lora the "
                               "adapters are what trains (the base model is frozen already); "
                               "narrow --lora-targets instead",
                               regex, v->name);
    }
    regfree(&re);
    return rc;
}
