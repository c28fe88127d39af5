/* sequence.c — the sequence analysis: which axis of every value is the sequence, and how every
 * op treats it (DESIGN.md, pipeline step 3). StreamBP (stream.c) chunks exactly what this
 * analysis proves row-wise, and refuses, naming the node, what it cannot.
 *
 * Approach: one walk over the nodes in order, after the training program's layout plan
 * (autodiff.c, step 3), because whether a value's rows are contiguous depends on how it is
 * stored. The token ids [B, T] (and labels) start as TOKEN (batch axis 0, sequence axis 1);
 * parameters and constants are NONE. Each op's rule below derives its outputs' states from its
 * inputs' and classifies the node:
 *   ROWWISE    Embedding (rows of the ids), Linear / LayerNorm / RMSNorm over the last axis,
 *              activations, SwiGLU, RoPE (the sequence is its position axis), elementwise ops
 *              whose other operands broadcast only within a row, Split / Slice / Concat along
 *              a non-token axis, Transpose and the view ops (Reshape keeps the token rows when
 *              a prefix of its output dims multiplies to B*T);
 *   CAUSAL     Attention (q, k, v [B, H, T, hd]: query row i reads key rows <= i);
 *   REDUCING   the cross-entropy loss (a sum over the token rows);
 *   POSITIONAL row-wise, but combining each row with a constant that varies along the sequence
 *              (GPT-2's position embedding add): fine on the whole sequence, not in a chunk;
 *   MIXING     anything else that reads a sequence-dependent value, with the reason.
 * The result: sbp_train_program.seq_values (by value id), seq_class and seq_why (by node index).
 */
#include "train_internal.h"

#include <string.h>

const char *sbp_seq_class_name(sbp_seq_class c)
{
    switch (c) {
    case SBP_SEQOP_STATIC: return "static";
    case SBP_SEQOP_ROWWISE: return "row-wise";
    case SBP_SEQOP_CAUSAL: return "causal";
    case SBP_SEQOP_REDUCING: return "sequence-reducing";
    case SBP_SEQOP_POSITIONAL: return "positional";
    case SBP_SEQOP_MIXING: return "mixing";
    }
    return "?";
}

static const sbp_seq_value seq_none = {SBP_SEQ_NONE, -1, -1};
static const sbp_seq_value seq_mixed = {SBP_SEQ_MIXED, -1, -1};

/* Stored position of logical axis a of a rank-`rank` value in `layout`. */
static int stored_pos(int rank, int layout, int a)
{
    if (layout == TL_SWAP && rank == 4 && (a == 1 || a == 2))
        return 3 - a;
    return a;
}

bool seq_token_major(const tctx *t, const ir_value *v, int layout)
{
    const sbp_seq_value *s = &t->p->seq_values[v->id];
    if (s->state != SBP_SEQ_TOKEN || s->sax < 0 || s->sax >= v->rank)
        return false;
    int r = v->rank, ps = stored_pos(r, layout, s->sax);
    for (int a = 0; a < r; a++) {
        if (a == s->sax || a == s->bax || stored_pos(r, layout, a) > ps)
            continue;
        if (v->dims[a].value != 1)
            return false;
    }
    if (s->bax >= 0)
        return stored_pos(r, layout, s->bax) < ps && v->dims[s->bax].value == t->B &&
               v->dims[s->sax].value == t->T;
    return v->dims[s->sax].value == t->B * t->T;
}

/* The axes of a value whose data, in natural order, are the token rows: the first prefix of its
 * dims that multiplies to B*T ends at the sequence axis. MIXED when there is none or the batch
 * is spread over several axes. */
static sbp_seq_value rows_axes(const tctx *t, const ir_value *v)
{
    int64_t bt = t->B * t->T, pre = 1;
    for (int j = 0; j < v->rank; j++) {
        int64_t d = v->dims[j].value;
        if (d > 0 && pre * d == bt) {
            if (pre == 1)
                return (sbp_seq_value){SBP_SEQ_TOKEN, -1, j};
            if (d == t->T && pre == t->B) {
                int k = -1, cnt = 0;
                for (int i = 0; i < j; i++)
                    if (v->dims[i].value != 1) {
                        k = i;
                        cnt++;
                    }
                if (cnt == 1)
                    return (sbp_seq_value){SBP_SEQ_TOKEN, k, j};
            }
            return seq_mixed;
        }
        if (d <= 0 || pre * d > bt)
            return seq_mixed;
        pre *= d;
    }
    return seq_mixed;
}

typedef struct sctx {
    tctx *t;
    int k;                   /* node index */
} sctx;

static sbp_seq_value *sv(sctx *s, const ir_value *v) { return &s->t->p->seq_values[v->id]; }

static int classify(sctx *s, sbp_seq_class c, const char *why)
{
    s->t->p->seq_class[s->k] = c;
    s->t->p->seq_why[s->k] = why;
    return 0;
}

static void set_outs(sctx *s, const ir_node *n, sbp_seq_value v)
{
    for (int i = 0; i < n->n_out; i++)
        if (n->out[i])
            *sv(s, n->out[i]) = v;
}

static int mixing(sctx *s, const ir_node *n, const char *fmt, const char *arg)
{
    set_outs(s, n, seq_mixed);
    return classify(s, SBP_SEQOP_MIXING, ir_arena_printf(s->t->g->arena, fmt, arg ? arg : ""));
}

static bool same_axes(const sbp_seq_value *a, const sbp_seq_value *b)
{
    return a->state == b->state && a->bax == b->bax && a->sax == b->sax;
}

/* Row-wise ops whose output has input 0's rank and axes (norms, linears, activations): every
 * TOKEN input has input 0's axes; feature_last: the op transforms the last axis, which must
 * then not be the sequence; a NONE operand of the output's rank (not a weight) that is not
 * broadcast along the token axes makes the op positional. */
static int rowwise_like(sctx *s, const ir_node *n, bool feature_last, int n_row_operands)
{
    const sbp_seq_value *x = sv(s, n->in[0]);
    if (x->state != SBP_SEQ_TOKEN)
        return mixing(s, n, "its first input '%s' is not one row per token", n->in[0]->name);
    if (feature_last && x->sax == n->in[0]->rank - 1)
        return mixing(s, n, "it reduces or transforms the sequence axis of '%s'",
                      n->in[0]->name);
    bool positional = false;
    for (int i = 1; i < n->n_in && i < n_row_operands; i++) {
        const ir_value *v = n->in[i];
        if (!v)
            continue;
        const sbp_seq_value *o = sv(s, v);
        if (o->state == SBP_SEQ_TOKEN && !same_axes(o, x))
            return mixing(s, n, "its operand '%s' has its sequence on another axis", v->name);
        if (o->state == SBP_SEQ_NONE)
            positional = true;
    }
    set_outs(s, n, *x);
    return classify(s, positional ? SBP_SEQOP_POSITIONAL : SBP_SEQOP_ROWWISE,
                    positional ? "a sequence-long constant operand" : NULL);
}

/* Elementwise with numpy broadcasting: operands aligned to the output's rank. */
static int broadcast_rule(sctx *s, const ir_node *n)
{
    const ir_value *y = n->out[0];
    int R = y->rank;
    sbp_seq_value ref = seq_none;
    for (int i = 0; i < n->n_in && i < 2; i++) {
        const ir_value *v = n->in[i];
        const sbp_seq_value *o = sv(s, v);
        if (o->state != SBP_SEQ_TOKEN)
            continue;
        int sh = R - v->rank;
        sbp_seq_value a = {SBP_SEQ_TOKEN, o->bax >= 0 ? o->bax + sh : -1, o->sax + sh};
        if (ref.state == SBP_SEQ_TOKEN && !same_axes(&ref, &a))
            return mixing(s, n, "its operand '%s' has its sequence on another axis", v->name);
        if (v->dims[a.sax - sh].value != y->dims[a.sax].value ||
            (a.bax >= 0 && v->dims[a.bax - sh].value != y->dims[a.bax].value))
            return mixing(s, n, "its operand '%s' is broadcast along the token rows",
                          v->name);
        ref = a;
    }
    if (ref.state != SBP_SEQ_TOKEN)
        return mixing(s, n, "no operand is one row per token%s", NULL);
    /* a constant operand that varies along the batch or the sequence */
    bool positional = false;
    for (int i = 0; i < n->n_in && i < 2; i++) {
        const ir_value *v = n->in[i];
        if (sv(s, v)->state != SBP_SEQ_NONE)
            continue;
        int sh = R - v->rank;
        if ((ref.sax >= sh && v->dims[ref.sax - sh].value != 1) ||
            (ref.bax >= sh && v->dims[ref.bax - sh].value != 1))
            positional = true;
    }
    set_outs(s, n, ref);
    return classify(s, positional ? SBP_SEQOP_POSITIONAL : SBP_SEQOP_ROWWISE,
                    positional ? "an operand that varies along the sequence but is not a row "
                                 "of the input (a position table)"
                               : NULL);
}

static int norm_axis(const ir_node *n, const ir_value *v)
{
    int64_t a = ir_attr_int(n, "axis", 0);
    return (int)(a < 0 ? a + v->rank : a);
}

/* Split / Slice / Concat along `axis` of the value ref. */
static int axis_rule(sctx *s, const ir_node *n, int axis)
{
    sbp_seq_value ref = seq_none;
    bool positional = false;
    for (int i = 0; i < n->n_in; i++) {
        const ir_value *v = n->in[i];
        if (!v || !ir_dtype_is_float(v->dtype))
            continue;
        const sbp_seq_value *o = sv(s, v);
        if (o->state == SBP_SEQ_NONE) {
            positional |= n->op == IR_OP_CONCAT;
            continue;
        }
        if (ref.state == SBP_SEQ_TOKEN && !same_axes(&ref, o))
            return mixing(s, n, "its operand '%s' has its sequence on another axis", v->name);
        ref = *o;
    }
    if (ref.state != SBP_SEQ_TOKEN)
        return mixing(s, n, "no operand is one row per token%s", NULL);
    if (axis == ref.sax || axis == ref.bax)
        return mixing(s, n, "it %s along the sequence (rows move)",
                      n->op == IR_OP_SPLIT   ? "splits"
                      : n->op == IR_OP_SLICE ? "slices"
                                             : "concatenates");
    set_outs(s, n, ref);
    return classify(s, positional ? SBP_SEQOP_POSITIONAL : SBP_SEQOP_ROWWISE,
                    positional ? "it concatenates a sequence-long constant" : NULL);
}

static int attention_rule(sctx *s, const ir_node *n)
{
    for (int i = 0; i < 3; i++) {
        const sbp_seq_value *o = sv(s, n->in[i]);
        if (o->state != SBP_SEQ_TOKEN || o->sax != 2 || (o->bax != 0 && s->t->B != 1))
            return mixing(s, n, "its input '%s' is not [B, heads, T, head_dim] per token",
                          n->in[i]->name);
    }
    set_outs(s, n, *sv(s, n->in[0]));
    return classify(s, SBP_SEQOP_CAUSAL, NULL);
}

static int transpose_rule(sctx *s, const ir_node *n)
{
    const ir_value *x = n->in[0];
    const sbp_seq_value *o = sv(s, x);
    const ir_attr *a = ir_attr_get(n, "perm");
    sbp_seq_value r = {SBP_SEQ_TOKEN, -1, -1};
    for (int i = 0; i < x->rank; i++) {
        int64_t p = a ? (i < a->n ? a->ints[i] : -1) : x->rank - 1 - i;
        if (p == o->sax)
            r.sax = i;
        if (o->bax >= 0 && p == o->bax)
            r.bax = i;
    }
    if (r.sax < 0)
        return mixing(s, n, "invalid perm%s", NULL);
    if (o->bax >= 0 && r.bax > r.sax)
        return mixing(s, n, "it moves the batch after the sequence%s", NULL);
    set_outs(s, n, r);
    return classify(s, SBP_SEQOP_ROWWISE, NULL);
}

/* Reshape and friends: the data in natural order must be the token rows, and so must a prefix
 * of the new dims. */
static int view_rule(sctx *s, const ir_node *n)
{
    const ir_value *x = n->in[0], *y = n->out[0];
    if (!seq_token_major(s->t, x, TL_NAT))
        return mixing(s, n, "its input '%s' is not stored one row per token", x->name);
    sbp_seq_value r = rows_axes(s->t, y);
    if (r.state != SBP_SEQ_TOKEN)
        return mixing(s, n, "its result '%s' does not keep the token rows", y->name);
    set_outs(s, n, r);
    return classify(s, SBP_SEQOP_ROWWISE, NULL);
}

static int loss_rule(sctx *s, const ir_node *n)
{
    const ir_value *logits = n->in[0], *labels = n->in[1];
    if (!seq_token_major(s->t, logits, TL_NAT) || sv(s, logits)->sax == logits->rank - 1)
        return mixing(s, n, "its logits '%s' are not one row per token", logits->name);
    if (!seq_token_major(s->t, labels, TL_NAT))
        return mixing(s, n, "its labels '%s' are not one per token", labels->name);
    set_outs(s, n, (sbp_seq_value){SBP_SEQ_REDUCED, -1, -1});
    return classify(s, SBP_SEQOP_REDUCING, NULL);
}

static int node_rule(sctx *s, const ir_node *n)
{
    bool any_seq = false;
    for (int i = 0; i < n->n_in; i++) {
        if (!n->in[i])
            continue;
        sbp_seq_state st = sv(s, n->in[i])->state;
        if (st == SBP_SEQ_MIXED)
            return mixing(s, n, "it reads '%s', which is not one row per token", n->in[i]->name);
        if (st == SBP_SEQ_REDUCED)
            return mixing(s, n, "it reads '%s', which is reduced over the sequence",
                          n->in[i]->name);
        any_seq |= st == SBP_SEQ_TOKEN;
    }
    if (!any_seq) {
        set_outs(s, n, seq_none);
        return classify(s, SBP_SEQOP_STATIC, NULL);
    }
    switch (n->op) {
    case IR_OP_EMBEDDING:
    case IR_OP_GATHER: {
        const sbp_seq_value *ids = sv(s, n->in[1]);
        if (sv(s, n->in[0])->state != SBP_SEQ_NONE || ids->state != SBP_SEQ_TOKEN)
            return mixing(s, n, "its table depends on the sequence%s", NULL);
        set_outs(s, n, *ids);
        return classify(s, SBP_SEQOP_ROWWISE, NULL);
    }
    case IR_OP_LINEAR:
        for (int i = 1; i < n->n_in; i++)
            if (n->in[i] && sv(s, n->in[i])->state != SBP_SEQ_NONE)
                return mixing(s, n, "its weight '%s' depends on the sequence", n->in[i]->name);
        return rowwise_like(s, n, true, 1);
    case IR_OP_MOE: /* each row routed on its own: row-wise, with weights */
    case IR_OP_LAYER_NORM:
    case IR_OP_RMS_NORM:
        for (int i = 1; i < n->n_in; i++)
            if (n->in[i] && sv(s, n->in[i])->state != SBP_SEQ_NONE)
                return mixing(s, n, "its weight '%s' depends on the sequence", n->in[i]->name);
        return rowwise_like(s, n, true, 1);
    case IR_OP_GELU:
    case IR_OP_SILU:
    case IR_OP_RELU:
    case IR_OP_TANH:
    case IR_OP_SIGMOID:
    case IR_OP_IDENTITY:
    case IR_OP_CAST:
        return rowwise_like(s, n, false, 1);
    case IR_OP_SWIGLU:
        if (sv(s, n->in[0])->state != SBP_SEQ_TOKEN) {
            set_outs(s, n, *sv(s, n->in[1]));
            return classify(s, SBP_SEQOP_POSITIONAL, "a sequence-long constant operand");
        }
        return rowwise_like(s, n, false, 2);
    case IR_OP_ROPE: {
        const sbp_seq_value *x = sv(s, n->in[0]);
        if (x->state != SBP_SEQ_TOKEN || x->sax != n->in[0]->rank - 2)
            return mixing(s, n, "the position axis of '%s' is not its sequence axis",
                          n->in[0]->name);
        set_outs(s, n, *x);
        return classify(s, SBP_SEQOP_ROWWISE, NULL);
    }
    case IR_OP_ATTENTION:
        return attention_rule(s, n);
    case IR_OP_ADD:
    case IR_OP_SUB:
    case IR_OP_MUL:
    case IR_OP_DIV:
    case IR_OP_EXPAND:
        return broadcast_rule(s, n);
    case IR_OP_SPLIT:
    case IR_OP_SLICE: {
        int axis = norm_axis(n, n->in[0]);
        if (n->op == IR_OP_SLICE) { /* the axis whose extent changes (the rule allows one) */
            axis = n->in[0]->rank - 1;
            for (int i = 0; i < n->in[0]->rank && i < n->out[0]->rank; i++)
                if (n->in[0]->dims[i].value != n->out[0]->dims[i].value)
                    axis = i;
        }
        return axis_rule(s, n, axis);
    }
    case IR_OP_CONCAT:
        return axis_rule(s, n, norm_axis(n, n->out[0]));
    case IR_OP_TRANSPOSE:
        return transpose_rule(s, n);
    case IR_OP_RESHAPE:
    case IR_OP_FLATTEN:
    case IR_OP_SQUEEZE:
    case IR_OP_UNSQUEEZE:
        return view_rule(s, n);
    case IR_OP_CROSS_ENTROPY:
    case IR_OP_SOFTMAX_CE_LOSS:
        return loss_rule(s, n);
    default:
        return mixing(s, n, "op %s has no sequence rule", ir_op_name(n->op));
    }
}

int seq_analyze(tctx *t, ir_node **nodes, int nn)
{
    ir_graph *g = t->g;
    sbp_train_program *p = t->p;
    p->seq_values = ir_arena_calloc(g->arena, (size_t)g->n_values + 1, sizeof *p->seq_values);
    p->seq_class = ir_arena_calloc(g->arena, (size_t)nn + 1, sizeof *p->seq_class);
    p->seq_why = ir_arena_calloc(g->arena, (size_t)nn + 1, sizeof *p->seq_why);
    if (!p->seq_values || !p->seq_class || !p->seq_why)
        return ir_diag_error(g->diag, "out of memory");
    for (int i = 0; i < g->n_values; i++)
        p->seq_values[i] = seq_none;
    for (int i = 0; i < g->n_inputs; i++) {
        const ir_value *v = g->inputs[i];
        if (v->id != (p->ids_buf >= 0 ? p->bufs[p->ids_buf]->value->id : -1) &&
            v->id != (p->labels_buf >= 0 ? p->bufs[p->labels_buf]->value->id : -1) &&
            !(p->doc_pos_buf >= 0 && p->bufs[p->doc_pos_buf]->value == v)) /* packed */
            continue;
        p->seq_values[v->id] = rows_axes(t, v);
    }
    sctx s = {.t = t};
    for (int k = 0; k < nn; k++) {
        s.k = k;
        node_rule(&s, nodes[k]);
    }
    return IR_OK;
}
