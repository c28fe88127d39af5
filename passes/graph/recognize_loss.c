/* recognize_loss.c — the token-level cross-entropy loss to CrossEntropy.
 *
 * Recognised (reduction "mean" or "sum"; no class weights; the per-class log-probability
 * output unused):
 *   SoftmaxCrossEntropyLoss(scores, labels) attrs ignore_index?, reduction
 *   NegativeLogLikelihoodLoss(LogSoftmax(scores, class axis), labels) attrs ignore_index?,
 *                                                                      reduction
 *                                     -> CrossEntropy(logits [..., V], labels [...])
 * ONNX puts the classes on axis 1: scores [N,V] is used as is; scores [N,V,d1..] must be
 * Transpose(logits [N,d1..,V]) moving the last axis to 1 (what torch writes for a [B,V,T]
 * input), and the Linear's logits are read directly. When scores is Reshape(logits [B,T,V] ->
 * [B*T,V]) and labels is Reshape(labels [B,T] -> [B*T]) (F.cross_entropy(logits.view(-1, V),
 * labels.view(-1))), both Reshapes are absorbed, so the loss reads [B,T,V] and the sequence axis
 * stays visible; mean and sum over the non-ignored tokens do not depend on that shape. A Cast of
 * the logits to the dtype they already have (HF's logits.float()) is looked through.
 *
 * The loss value must be float32 (CrossEntropy's result type). ignore_index is copied when the
 * model sets it; absent, no label is ignored.
 *
 * requires: bound dims, fold, dce; Linear already recognised (the LM head).
 * produces: CrossEntropy(logits, labels) attrs reduction, ignore_index? taking over the loss
 *           value (its name and graph-output role); replaced nodes are marked dead for dce.
 *           Other reductions, class weights and LogSoftmax over another axis stay as ONNX ops.
 */
#include "recognize.h"

#include <string.h>

#define MAX_PAT 8

typedef struct loss_ctx {
    ir_graph *g;
    ir_uses u;   /* built at the start of the pass */
    int nv;      /* u covers value ids below nv */
} loss_ctx;

typedef struct loss_match {
    ir_value *logits, *labels;
    ir_node *nodes[MAX_PAT];
    int n;
} loss_match;

static bool used_once(const loss_ctx *c, const ir_value *v)
{
    return v && v->id < c->nv && rz_uses_exactly(&c->u, v, 1);
}

/* Records n as replaced when its output is read only by the pattern. */
static void absorb(const loss_ctx *c, loss_match *m, ir_node *n)
{
    if (m->n < MAX_PAT && used_once(c, n->out[0]))
        m->nodes[m->n++] = n;
}

static bool dim_eq(ir_dim a, ir_dim b)
{
    if (a.value >= 0 || b.value >= 0)
        return a.value == b.value;
    return a.sym && b.sym && strcmp(a.sym, b.sym) == 0;
}

/* labels has logits' shape without the last (class) axis. */
static bool labels_fit(const ir_value *logits, const ir_value *labels)
{
    if (logits->rank < 1 || labels->rank != logits->rank - 1)
        return false;
    for (int i = 0; i < labels->rank; i++)
        if (!dim_eq(labels->dims[i], logits->dims[i]))
            return false;
    return true;
}

/* perm == [0, r-1, 1, 2, ..., r-2]: the last axis moved to position 1. */
static bool moves_last_to_1(const ir_node *t, int r)
{
    const ir_attr *p = ir_attr_get(t, "perm");
    if (!p || p->kind != IR_ATTR_INTS || p->n != r || r < 3 || p->ints[0] != 0 ||
        p->ints[1] != r - 1)
        return false;
    for (int i = 2; i < r; i++)
        if (p->ints[i] != i - 1)
            return false;
    return true;
}

/* scores (classes on axis 1) and labels -> logits (classes last) and labels, absorbing the
 * Transpose or the two flattening Reshapes and a same-dtype Cast. */
static bool resolve_operands(const loss_ctx *c, loss_match *m, ir_value *scores, ir_value *labels)
{
    if (scores->rank < 2 || labels->rank != scores->rank - 1 || !ir_dtype_is_int(labels->dtype))
        return false;
    if (scores->rank > 2) {
        ir_node *t = rz_producer(scores, IR_OP_TRANSPOSE);
        if (!t || !moves_last_to_1(t, scores->rank))
            return false;
        absorb(c, m, t);
        scores = t->in[0];
    } else {
        ir_node *rs = rz_producer(scores, IR_OP_RESHAPE), *rl = rz_producer(labels, IR_OP_RESHAPE);
        if (rs && rl && rs->in[0] && rl->in[0] && rs->in[0]->rank >= 2 &&
            dim_eq(rs->in[0]->dims[rs->in[0]->rank - 1], scores->dims[1]) &&
            labels_fit(rs->in[0], rl->in[0])) {
            absorb(c, m, rs);
            absorb(c, m, rl);
            scores = rs->in[0];
            labels = rl->in[0];
        }
    }
    ir_node *cast = rz_producer(scores, IR_OP_CAST);
    if (cast && cast->in[0] && cast->in[0]->dtype == scores->dtype &&
        ir_attr_int(cast, "to", -1) == (int64_t)scores->dtype) {
        absorb(c, m, cast);
        scores = cast->in[0];
    }
    if (!labels_fit(scores, labels) || scores->dtype != IR_DT_FLOAT)
        return false;
    m->logits = scores;
    m->labels = labels;
    return true;
}

static bool match_loss(const loss_ctx *c, ir_node *n, loss_match *m)
{
    memset(m, 0, sizeof *m);
    const char *red = ir_attr_string(n, "reduction", "mean");
    if (strcmp(red, "mean") != 0 && strcmp(red, "sum") != 0)
        return false;
    if (n->n_in > 2 && n->in[2])
        return false; /* class weights */
    for (int i = 1; i < n->n_out; i++)
        if (n->out[i] && (n->out[i]->is_output || n->out[i]->id >= c->nv ||
                          c->u.n_uses[n->out[i]->id] != 0))
            return false; /* log_prob read by someone */
    if (!n->out[0] || !n->in[0] || !n->in[1] || n->out[0]->dtype != IR_DT_FLOAT)
        return false;
    m->nodes[m->n++] = n;
    ir_value *scores = n->in[0];
    if (n->op == IR_OP_NLL_LOSS) {
        ir_node *ls = rz_producer(scores, IR_OP_LOG_SOFTMAX);
        if (!ls || !ls->in[0] || !used_once(c, scores) || scores->rank < 2)
            return false;
        int64_t axis = ir_attr_int(ls, "axis", c->g->opset >= 13 ? -1 : 1);
        if (axis < 0)
            axis += scores->rank;
        /* Before opset 13 LogSoftmax flattens from `axis` on: the same only for rank 2. */
        if (axis != 1 || (c->g->opset < 13 && scores->rank != 2))
            return false;
        m->nodes[m->n++] = ls;
        scores = ls->in[0];
    }
    return resolve_operands(c, m, scores, n->in[1]);
}

int sbp_recognize_loss(ir_graph *g)
{
    loss_ctx c = {.g = g, .u = ir_uses_build(g), .nv = g->n_values};
    if (!c.u.n_uses)
        return ir_diag_error(g->diag, "out of memory building use lists");
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        loss_match m;
        if (n->dead || (n->op != IR_OP_SOFTMAX_CE_LOSS && n->op != IR_OP_NLL_LOSS) ||
            !match_loss(&c, n, &m))
            continue;
        /* CrossEntropy takes over the loss value: same name, same graph-output role. */
        ir_value *result = n->out[0], *in[2] = {m.logits, m.labels};
        ir_node *ce = ir_node_new_with_outputs(g, IR_OP_CROSS_ENTROPY, NULL, NULL, 2, in, 1,
                                               &result);
        if (!ce)
            return ir_diag_error(g->diag, "out of memory");
        for (int k = 0; k < m.n; k++) {
            ir_node_add_origin(g, ce, m.nodes[k]);
            m.nodes[k]->dead = true;
        }
        ir_node_move_after(g, ce, n);
        ir_attr_set_string(g, ce, "reduction", ir_attr_string(n, "reduction", "mean"));
        const ir_attr *ii = ir_attr_get(n, "ignore_index");
        if (ii && ii->kind == IR_ATTR_INT)
            ir_attr_set_int(g, ce, "ignore_index", ii->i);
        if (ir_infer_node(g, ce) != IR_OK)
            return IR_ERR;
    }
    return IR_OK;
}
