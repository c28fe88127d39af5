/* objective.c — make the graph end in the scalar loss to train (the flow's "objective" stage).
 *
 * A causal LM export outputs logits [B,T,V]. The SFT objective is the mean token
 * cross-entropy over the positions whose label is not -100, labels[b,t] being the target of
 * position t (the caller has already shifted them); the mean divides by the number of scored
 * positions in the whole batch. It is appended as a CrossEntropy node (ignore_index -100,
 * reduction mean) reading a new graph input `labels` shaped like the logits without V, and
 * becomes the only graph output; dce then drops whatever else the graph computed.
 *
 * A graph that already ends in a scalar loss (SoftmaxCrossEntropyLoss, canonicalised to
 * CrossEntropy) is trained on that loss as it is.
 *
 * DPO and GRPO append the same node (named dpo_loss / grpo_loss): it marks where the objective
 * sits, the LM head, and passes/train/objective_pref.c lowers it to the objective's kernels.
 *
 * requires: a canonical graph (sbp_canonicalize). produces: one output, a scalar loss.
 */
#include "passes.h"

#include <string.h>

const char *sbp_objective_name(sbp_objective o)
{
    switch (o) {
    case SBP_OBJECTIVE_GRAPH_LOSS: return "graph-loss";
    case SBP_OBJECTIVE_DPO: return "dpo";
    case SBP_OBJECTIVE_GRPO: return "grpo";
    default: return "sft";
    }
}

double sbp_objective_default_beta(sbp_objective o)
{
    return o == SBP_OBJECTIVE_DPO ? 0.1 : o == SBP_OBJECTIVE_GRPO ? 0.04 : 0.0;
}

static bool is_loss(const ir_value *v)
{
    if (!v || v->kind != IR_VAL_NODE || !v->producer || v->producer->dead)
        return false;
    ir_op op = v->producer->op;
    return (op == IR_OP_CROSS_ENTROPY || op == IR_OP_SOFTMAX_CE_LOSS) && v->producer_slot == 0 &&
           ir_dtype_is_float(v->dtype) && (v->rank == 0 || ir_value_numel(v) == 1);
}

/* Makes `keep` the only graph output. */
static int only_output(ir_graph *g, ir_value *keep)
{
    for (int i = 0; i < g->n_outputs; i++)
        g->outputs[i]->is_output = false;
    ir_value **outs = ir_arena_calloc(g->arena, 1, sizeof *outs);
    if (!outs)
        return ir_diag_error(g->diag, "out of memory");
    outs[0] = keep;
    keep->is_output = true;
    g->outputs = outs;
    g->n_outputs = 1;
    return sbp_pass_dce(g);
}

/* The logits output: the float output named "logits", else the only float output of rank >= 2. */
static ir_value *find_logits(ir_graph *g)
{
    ir_value *found = NULL;
    int n = 0;
    for (int i = 0; i < g->n_outputs; i++) {
        ir_value *v = g->outputs[i];
        if (!ir_dtype_is_float(v->dtype) || v->rank < 2)
            continue;
        if (strcmp(v->name, "logits") == 0)
            return v;
        found = v;
        n++;
    }
    return n == 1 ? found : NULL;
}

int sbp_pass_objective(ir_graph *g, sbp_objective requested, sbp_objective *chosen)
{
    bool pref = requested == SBP_OBJECTIVE_DPO || requested == SBP_OBJECTIVE_GRPO;
    const char *flag = sbp_objective_name(requested);
    for (int i = 0; i < g->n_outputs; i++) {
        if (is_loss(g->outputs[i])) {
            if (pref)
                return ir_diag_error(g->diag, "--objective %s needs the logits, but the graph "
                                              "ends in a loss ('%s'): export the model without "
                                              "its loss", flag, g->outputs[i]->name);
            *chosen = SBP_OBJECTIVE_GRAPH_LOSS;
            return only_output(g, g->outputs[i]);
        }
    }
    if (requested == SBP_OBJECTIVE_GRAPH_LOSS)
        return ir_diag_error(g->diag, "--objective graph-loss: the graph has no scalar loss "
                                      "output (CrossEntropy); use --objective sft");
    ir_value *logits = find_logits(g);
    if (!logits)
        return ir_diag_error(g->diag, "--objective %s: cannot tell which graph output holds "
                                      "the logits (want one float output [B,T,V], or one named "
                                      "'logits')", flag);
    if (!ir_value_shape_known(logits))
        return ir_diag_error(g->diag, "--objective %s: the logits '%s' have an unknown shape "
                                      "(bind --batch and --seq-len)", flag, logits->name);

    /* labels: logits' shape without the vocabulary axis */
    ir_dim dims[IR_MAX_RANK];
    for (int i = 0; i < logits->rank - 1; i++)
        dims[i] = logits->dims[i];
    ir_value *labels = ir_value_new(g, "labels", IR_VAL_INPUT, IR_DT_INT64, logits->rank - 1,
                                    dims);
    ir_value **ins = ir_arena_calloc(g->arena, (size_t)g->n_inputs + 1, sizeof *ins);
    if (!labels || !ins)
        return ir_diag_error(g->diag, "out of memory");
    memcpy(ins, g->inputs, (size_t)g->n_inputs * sizeof *ins);
    ins[g->n_inputs] = labels;
    g->inputs = ins;
    g->n_inputs++;

    ir_value *in[2] = {logits, labels};
    /* DPO / GRPO: the same node, lowered as the objective (objective_pref.c) */
    ir_node *ce = ir_node_new(g, IR_OP_CROSS_ENTROPY,
                              pref ? ir_arena_printf(g->arena, "%s_loss", flag) : "sft_loss", 2,
                              in, 1);
    if (!ce)
        return IR_ERR;
    ir_attr_set_int(g, ce, "ignore_index", -100);
    ir_attr_set_string(g, ce, "reduction", "mean");
    if (ir_infer_node(g, ce) != IR_OK)
        return IR_ERR;
    *chosen = pref ? requested : SBP_OBJECTIVE_SFT;
    return only_output(g, ce->out[0]);
}
