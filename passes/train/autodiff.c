/* autodiff.c — reverse-mode differentiation of a graph into a training program: the
 * analysis (the "autodiff" stage) and the lowering of nodes to instructions that every
 * strategy uses.
 *
 * In order (the driver, train_build.c, calls them):
 *   1. params     the parameter table (initializer order; re-tied copies keep a row with their
 *                 owner's storage) and which parameters are trained;
 *   2. inputs     which graph input is the token ids and which the labels;
 *   3. plan       per node, in order: the rule's layout plan (views join their input's alias
 *                 group; ops that need the other layout get relayout copies); which values
 *                 depend on a trained parameter (needs_grad); then, in reverse, which of them
 *                 the loss depends on through differentiable inputs (grad_live) — a node on
 *                 that path without a gradient rule is an error;
 *   4. segments   cut the node order where exactly one activation group is live and that group
 *                 enters a layer (the last such cut before each Attention) or leaves the last
 *                 one (the last cut after it whose value a residual Add made); regions: store
 *                 keeps every buffer persistent; checkpoint and stream put a group used only
 *                 inside its segment, and every node-owned buffer, in the segment's overlay;
 *   5. buffers    one buffer (and gradient buffer) per alias group;
 *   6. emit       per node: its relayout copies and forward rule (tx_lower_forward), its gradient
 *                 rule (tx_lower_backward); the rules of a range of nodes in reverse with what
 *                 they read recomputed (tx_emit_rules); and the blocks of store and checkpoint
 *                 (block "forward", then one backward block per segment, last first). Stream
 *                 emits its own blocks (stream.c) with the same per-node lowering.
 * The gradient rules themselves are the table in grad_rules.c.
 */
#include "train_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ 1. parameters */

static int build_params(tctx *t)
{
    ir_graph *g = t->g;
    sbp_train_program *p = t->p;
    int *index = ir_arena_calloc(g->arena, (size_t)g->n_values + 1, sizeof *index);
    p->params = ir_arena_calloc(g->arena, (size_t)g->n_values + 1, sizeof *p->params);
    if (!index || !p->params)
        return ir_diag_error(g->diag, "out of memory");
    int rc = IR_OK;
    /* use counts of every value at once (ir_value_use_count per parameter is O(nodes) each) */
    ir_uses u = ir_uses_build(g);
    if (!u.n_uses)
        return ir_diag_error(g->diag, "out of memory");
#define USES(x) ((x)->is_output + u.n_uses[(x)->id])
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: parameters with storage; pass 1: re-tied copies (they need the owner's row) */
        for (int i = 0; i < g->n_values; i++) {
            ir_value *v = g->values[i];
            if (v->kind != IR_VAL_PARAM || (pass == 0) != !v->tied_to)
                continue;
            if (pass == 0 && USES(v) == 0)
                continue;
            if (pass == 1 && (USES(v->tied_to) == 0 || v->tied_to->tied_to))
                continue;
            if (v->dtype != IR_DT_FLOAT || !ir_value_shape_known(v)) {
                rc = ir_diag_error(g->diag, "parameter '%s' is %s: only f32 parameters of known "
                                            "shape are supported", v->name,
                                   ir_dtype_name(v->dtype));
                continue;
            }
            tp_param *q = &p->params[p->n_params];
            q->value = v;
            q->numel = tx_numel(v);
            q->tied_to = -1;
            q->buf = q->grad = -1;
            if (pass == 0) {
                q->offset = p->param_elems;
                p->param_elems += q->numel;
                q->buf = tx_new_buf(t, TP_BUF_PARAM, tx_cname(t, "w_", v->name), v, q->numel,
                                    false, false, TP_REGION_PERSIST, "parameter");
                q->buf >= 0 ? (void)(p->bufs[q->buf]->offset = q->offset) : (void)0;
                t->v[v->id].buf = q->buf;
                t->v[v->id].needs_grad = !v->frozen && !t->p->forward_only;
            } else {
                q->tied_to = index[v->tied_to->id];
                q->offset = p->params[q->tied_to].offset;
            }
            index[v->id] = p->n_params++;
        }
    }
    return rc;
#undef USES
}

/* ------------------------------------------------------------------ 2. inputs */

/* Follows views (Reshape, ...) forward from v to the node input it ends at; returns whether it
 * reaches the labels slot (input 1) of a loss node. */
static bool feeds_labels(const ir_graph *g, const ir_uses *u, const ir_value *v, int depth)
{
    if (depth > 16)
        return false;
    for (int i = 0; i < u->n_uses[v->id]; i++) {
        const ir_use *use = &u->uses[v->id][i];
        ir_op op = use->node->op;
        if ((op == IR_OP_CROSS_ENTROPY || op == IR_OP_SOFTMAX_CE_LOSS) && use->slot == 1)
            return true;
        if ((op == IR_OP_RESHAPE || op == IR_OP_FLATTEN || op == IR_OP_SQUEEZE ||
             op == IR_OP_UNSQUEEZE || op == IR_OP_IDENTITY || op == IR_OP_CAST) &&
            use->slot == 0 && use->node->out[0] &&
            feeds_labels(g, u, use->node->out[0], depth + 1))
            return true;
    }
    return false;
}

/* Packed steps (train.h, "Packed documents"): the step's document ids (TP_BUF_DOCS) and the
 * two int32 [B*T] workspace buffers the forward block fills first: each token's document start
 * (read whole by attention, at sequence b in a chunk) and its position in its document (one
 * per token: chunk loops slice it, RoPE reads it, and so does a learned position embedding
 * through the graph input doc_pos, when passes/graph/packed.c made one). */
static int bind_documents(tctx *t, const ir_value *doc_pos)
{
    sbp_train_program *p = t->p;
    size_t n = (size_t)(p->batch * p->seq_len);
    p->docs_buf = tx_new_buf(t, TP_BUF_DOCS, "docs", NULL, n, true, false, TP_REGION_PERSIST,
                             "document ids (args->doc_ids)");
    p->doc_start_buf = tx_new_buf(t, TP_BUF_WS, "doc_start", NULL, n, true, false,
                                  TP_REGION_PERSIST, "where each token's document starts");
    p->doc_pos_buf = tx_new_buf(t, TP_BUF_WS, "doc_pos", doc_pos, n, true, false,
                                TP_REGION_PERSIST, "each token's position in its document");
    if (p->docs_buf < 0 || p->doc_start_buf < 0 || p->doc_pos_buf < 0)
        return ir_diag_error(t->g->diag, "out of memory");
    p->bufs[p->docs_buf]->rows = p->bufs[p->doc_pos_buf]->rows = (int64_t)n;
    p->bufs[p->docs_buf]->row_elems = p->bufs[p->doc_pos_buf]->row_elems = 1;
    if (doc_pos) {
        if ((int64_t)tx_numel(doc_pos) != (int64_t)n)
            return ir_diag_error(t->g->diag, "'%s' must have batch x sequence elements",
                                 doc_pos->name);
        t->v[doc_pos->id].buf = p->doc_pos_buf;
    }
    return IR_OK;
}

/* Sequence-parallel steps without documents: each token's position in the whole row, one int32
 * per token (sliced by chunk loops), which RoPE and a learned position embedding (through the
 * graph input doc_pos, graph/packed.c's) read. The forward fills it (SP_POSITIONS). */
static int bind_sp_positions(tctx *t, const ir_value *doc_pos)
{
    sbp_train_program *p = t->p;
    size_t n = (size_t)(p->batch * p->seq_len);
    p->doc_pos_buf = tx_new_buf(t, TP_BUF_WS, "sp_pos", doc_pos, n, true, false,
                                TP_REGION_PERSIST, "each token's position in its whole row");
    if (p->doc_pos_buf < 0)
        return ir_diag_error(t->g->diag, "out of memory");
    p->bufs[p->doc_pos_buf]->rows = (int64_t)n;
    p->bufs[p->doc_pos_buf]->row_elems = 1;
    if (doc_pos) {
        if ((int64_t)tx_numel(doc_pos) != (int64_t)n)
            return ir_diag_error(t->g->diag, "'%s' must have batch x sequence elements",
                                 doc_pos->name);
        t->v[doc_pos->id].buf = p->doc_pos_buf;
    }
    return IR_OK;
}

static int bind_inputs(tctx *t)
{
    ir_graph *g = t->g;
    sbp_train_program *p = t->p;
    ir_uses u = ir_uses_build(g);
    if (!u.uses)
        return ir_diag_error(g->diag, "out of memory");
    ir_value *ids = NULL, *labels = NULL, *doc_pos = NULL;
    int rc = IR_OK;
    p->docs_buf = p->doc_start_buf = p->doc_pos_buf = -1;
    p->doc_all_buf = p->doc_gather_buf = -1;
    for (int i = 0; i < g->n_inputs; i++) {
        ir_value *v = g->inputs[i];
        if (u.n_uses[v->id] == 0)
            continue;
        if (v->name && strcmp(v->name, SBP_DOC_POSITIONS_INPUT) == 0) {
            /* passes/graph/packed.c's: each token's position in its document */
            if (!p->packed && p->seq_parallel < 1)
                rc = ir_diag_error(g->diag, "graph input '%s' is for packed and "
                                            "sequence-parallel steps",
                                   SBP_DOC_POSITIONS_INPUT);
            doc_pos = v;
        } else if (!ir_dtype_is_int(v->dtype)) {
            rc = ir_diag_error(g->diag, "graph input '%s' is %s: a training step takes token ids "
                                        "and labels only", v->name, ir_dtype_name(v->dtype));
        } else if (feeds_labels(g, &u, v, 0)) {
            labels = v;
        } else if (ids) {
            rc = ir_diag_error(g->diag, "graph inputs '%s' and '%s': a training step takes one "
                                        "token-id input (attention masks and position ids are "
                                        "not supported)", ids->name, v->name);
        } else {
            ids = v;
        }
    }
    if (rc != IR_OK)
        return rc;
    if (!ids || ids->rank != 2 || !ir_value_shape_known(ids))
        return ir_diag_error(g->diag, "the graph needs a token-id input [batch, sequence] of "
                                      "known shape (bind --batch and --seq-len)");
    t->B = p->batch = ids->dims[0].value;
    t->T = p->seq_len = ids->dims[1].value;
    if (p->batch * p->seq_len > INT32_MAX)
        return ir_diag_error(g->diag, "batch x sequence is too large");
    p->ids_buf = tx_new_buf(t, TP_BUF_IDS, "ids", ids, tx_numel(ids), true, false,
                            TP_REGION_PERSIST, "token ids (args->input_ids)");
    t->v[ids->id].buf = p->ids_buf;
    p->bufs[p->ids_buf]->rows = p->batch * p->seq_len;
    p->bufs[p->ids_buf]->row_elems = 1;
    p->labels_buf = -1;
    if (labels) {
        if ((int64_t)tx_numel(labels) != p->batch * p->seq_len)
            return ir_diag_error(g->diag, "labels '%s' must have batch x sequence elements",
                                 labels->name);
        p->labels_buf = tx_new_buf(t, TP_BUF_LABELS, "labels", labels, tx_numel(labels), true,
                                   false, TP_REGION_PERSIST, "labels (args->labels)");
        t->v[labels->id].buf = p->labels_buf;
        p->bufs[p->labels_buf]->rows = p->batch * p->seq_len;
        p->bufs[p->labels_buf]->row_elems = 1;
    }
    if (p->packed) /* the document ids, and what the forward derives from them */
        return bind_documents(t, doc_pos);
    if (p->seq_parallel >= 1) /* each token's position in its whole row (seqpar.c) */
        return bind_sp_positions(t, doc_pos);
    return IR_OK;
}

/* The attention the recogniser refused (graph/recognize_attention.c records why in
 * g->refusals) that node n is part of, as its Softmax or one of its MatMuls, or NULL: a MatMul
 * of two activations with no gradient rule is, in these models, nearly always an attention
 * whose mask did not match, and the error should say that rather than blame the MatMul. */
static const ir_refusal *unrecognised_attention(const ir_graph *g, const ir_node *n)
{
    for (const ir_refusal *r = g->refusals; r; r = r->next)
        if ((r->reason == IR_REFUSED_ATTENTION_MASK_CONSTANT ||
             r->reason == IR_REFUSED_ATTENTION_MASK_INPUT) &&
            (r->at == n || r->also[0] == n || r->also[1] == n))
            return r;
    return NULL;
}

/* The error for the nodes plan() found untrainable: only one. A mask that did not match leaves
 * its attention's MatMuls without a gradient rule and its Softmax without a lowering, in every
 * layer: reporting each would bury the cause under follow-on errors. So the error is the
 * earliest node explained by an unrecognised attention (the cause, named with its mask), else
 * the earliest untrainable node (kind 1: no gradient rule; 2: no lowering at all); a note counts
 * the others, which are the same problem again or a consequence of it. */
static int report_untrainable(tctx *t, ir_node **nodes, int failed, int k, int kind)
{
    const ir_node *n = nodes[k];
    const ir_refusal *why = unrecognised_attention(t->g, n);
    int rc;
    if (why) {
        /* at the attention's Softmax, the node the cause is about, in the warning's words */
        rc = ir_diag_add(t->g->diag, IR_SEV_ERROR, why->at->name, why->at->op_type,
                         "this attention cannot be trained (its MatMuls and Softmax have no "
                         "gradient rule): %s",
                         why->msg);
    } else if (kind == 1) {
        rc = tx_error(t, n, "no gradient rule for op %s (node '%s')", ir_op_name(n->op), n->name);
    } else {
        rc = tx_error(t, n, "op %s (node '%s') cannot run in a training step (no lowering)",
                      ir_op_name(n->op), n->name);
    }
    if (failed > 1)
        ir_diag_add(t->g->diag, IR_SEV_NOTE, NULL, NULL,
                    "%d more node%s cannot run in a training step, the same way or as a "
                    "consequence; only the first is reported",
                    failed - 1, failed > 2 ? "s" : "");
    return rc;
}

/* Whether a gradient flows to input `slot`; an op without a rule is taken to be differentiable
 * in every input, so that a missing rule on the loss's path is reported as such. */
static bool slot_diff(const grad_rule *r, int slot)
{
    return !r || (slot < 32 && (r->diff >> slot) & 1);
}

static int plan(tctx *t, ir_node **nodes, int nn, const ir_value *loss)
{
    ir_graph *g = t->g;
    int rc = IR_OK;
    /* stops at the first node that cannot be planned: the nodes after it read its outputs, so
     * their errors would be the same cause again */
    for (int k = 0; k < nn && rc == IR_OK; k++) {
        ir_node *n = nodes[k];
        tn *r = &t->n[k];
        const grad_rule *rule = train_rule(n->op);
        if (n->n_in > TN_MAX_IN) {
            rc = tx_error(t, n, "more than %d inputs are not supported", TN_MAX_IN);
            continue;
        }
        for (int i = 0; i < n->n_out; i++)
            if (n->out[i] && !ir_value_shape_known(n->out[i])) {
                rc = tx_error(t, n, "output '%s' has an unknown shape (bind --batch and "
                                    "--seq-len)", n->out[i]->name);
                goto next;
            }
        if (rule && (rule->plan ? rule->plan(t, n) : plan_natural(t, n)) != IR_OK) {
            rc = IR_ERR;
            continue;
        }
        for (int i = 0; i < n->n_out; i++) {
            ir_value *o = n->out[i];
            if (!o)
                continue;
            tv *ov = &t->v[o->id];
            ov->layout = r->out_layout;
            if (i == 0 && r->view)
                ov->group = t->v[n->in[0]->id].group;
            for (int s = 0; s < n->n_in; s++)
                if (n->in[s] && slot_diff(rule, s) && t->v[n->in[s]->id].needs_grad)
                    ov->needs_grad = true;
        }
    next:;
    }
    if (rc != IR_OK)
        return rc;

    /* grad_live, in reverse; first/last node of each group */
    int failed = 0, fail_k = -1, fail_kind = 0, attn_k = -1;
    t->v[loss->id].grad_live = true;
    for (int k = nn - 1; k >= 0; k--) {
        ir_node *n = nodes[k];
        const grad_rule *rule = train_rule(n->op);
        bool live = false;
        for (int i = 0; i < n->n_out; i++)
            if (n->out[i] && t->v[n->out[i]->id].grad_live && t->v[n->out[i]->id].needs_grad)
                live = true;
        if (n->n_out > 0 && n->out[0] == loss)
            live = true;
        bool any = false;
        for (int s = 0; s < n->n_in; s++)
            if (n->in[s] && slot_diff(rule, s) && t->v[n->in[s]->id].needs_grad)
                any = true;
        if (!rule || (live && any && !rule->bwd && !t->n[k].view)) {
            /* remembered, reported below: one error for the root cause */
            failed++;
            if (!rule && !(live && any))
                fail_k = k, fail_kind = 2; /* in reverse: the earliest node wins */
            else
                fail_k = k, fail_kind = 1;
            if (unrecognised_attention(t->g, n))
                attn_k = k;
            continue;
        }
        if (live && any) {
            for (int s = 0; s < n->n_in; s++)
                if (n->in[s] && slot_diff(rule, s) && t->v[n->in[s]->id].needs_grad)
                    t->v[n->in[s]->id].grad_live = true;
        }
    }
    if (failed)
        return report_untrainable(t, nodes, failed, attn_k >= 0 ? attn_k : fail_k,
                                  attn_k >= 0 ? 1 : fail_kind);
    for (int k = 0; k < nn; k++) {
        ir_node *n = nodes[k];
        for (int i = 0; i < n->n_out; i++)
            if (n->out[i] && t->v[n->out[i]->id].group == n->out[i]->id)
                t->v[n->out[i]->id].first_node = k;
        for (int s = 0; s < n->n_in; s++)
            if (n->in[s]) {
                tv *root = tx_root(t, n->in[s]);
                if (root->last_use < k)
                    root->last_use = k;
            }
    }
    tx_root(t, loss)->last_use = nn;
    (void)g;
    return IR_OK;
}

/* ------------------------------------------------------------------ 4. segments */

/* The activation group live across cut p (between node p-1 and node p), when there is exactly
 * one; else NULL. */
static const ir_value *crossing(tctx *t, int p)
{
    const ir_value *found = NULL;
    for (int i = 0; i < t->g->n_values; i++) {
        tv *v = &t->v[i];
        if (v->group != i || v->first_node < 0)
            continue;
        if (v->first_node < p && v->last_use >= p) {
            if (found)
                return NULL;
            found = t->g->values[i];
        }
    }
    return found;
}

static int plan_segments(tctx *t, ir_node **nodes, int nn)
{
    ir_graph *g = t->g;
    sbp_train_program *p = t->p;
    int *cnt = calloc((size_t)nn + 2, sizeof *cnt);
    int *cuts = calloc((size_t)nn + 2, sizeof *cuts);
    if (!cnt || !cuts) {
        free(cnt);
        free(cuts);
        return ir_diag_error(g->diag, "out of memory");
    }
    for (int i = 0; i < g->n_values; i++) {
        tv *v = &t->v[i];
        if (v->group == i && v->first_node >= 0 && v->last_use > v->first_node) {
            cnt[v->first_node + 1]++;
            cnt[v->last_use < nn ? v->last_use + 1 : nn + 1]--;
        }
    }
    for (int q = 1; q <= nn; q++)
        cnt[q] += cnt[q - 1];
    int ncut = 0, prev = 0, last_attn = -1;
    for (int k = 0; k < nn; k++) {
        if (nodes[k]->op != IR_OP_ATTENTION)
            continue;
        last_attn = k;
        for (int q = k; q > prev; q--)
            if (cnt[q] == 1 && crossing(t, q)) {
                cuts[ncut++] = q;
                prev = q;
                break;
            }
    }
    if (last_attn >= 0) {
        for (int q = nn - 1; q > last_attn && q > prev; q--) {
            const ir_value *c = cnt[q] == 1 ? crossing(t, q) : NULL;
            if (c && c->producer && c->producer->op == IR_OP_ADD) {
                cuts[ncut++] = q;
                break;
            }
        }
    }
    p->segments = ir_arena_calloc(g->arena, (size_t)ncut + 1, sizeof *p->segments);
    if (!p->segments) {
        free(cnt);
        free(cuts);
        return ir_diag_error(g->diag, "out of memory");
    }
    int start = 0;
    for (int c = 0; c <= ncut; c++) {
        int end = c < ncut ? cuts[c] : nn;
        if (end <= start)
            continue;
        tp_segment *s = &p->segments[p->n_segments];
        s->first_node = start;
        s->end_node = end;
        int attn = -1, n_attn_before = 0;
        bool has_loss = false;
        for (int k = 0; k < end; k++) {
            if (nodes[k]->op == IR_OP_ATTENTION) {
                if (k >= start && attn < 0)
                    attn = n_attn_before;
                n_attn_before++;
            }
            if (k >= start && (nodes[k]->op == IR_OP_CROSS_ENTROPY ||
                               nodes[k]->op == IR_OP_SOFTMAX_CE_LOSS))
                has_loss = true;
        }
        if (attn >= 0)
            s->name = ir_arena_printf(g->arena, "layer_%d", attn);
        else if (p->n_segments == 0)
            s->name = "prologue";
        else if (has_loss)
            s->name = "head";
        else
            s->name = ir_arena_printf(g->arena, "segment_%d", p->n_segments);
        for (int k = start; k < end; k++)
            t->n[k].seg = p->n_segments;
        p->n_segments++;
        start = end;
    }
    free(cnt);
    free(cuts);

    /* regions */
    for (int i = 0; i < g->n_values; i++) {
        tv *v = &t->v[i];
        v->region = TP_REGION_PERSIST;
        if (p->strategy == SBP_STRATEGY_STORE || v->group != i || v->first_node < 0)
            continue;
        if (v->last_use < v->first_node ||
            (v->last_use < nn && t->n[v->first_node].seg == t->n[v->last_use].seg))
            v->region = t->n[v->first_node].seg;
    }
    return IR_OK;
}

/* ------------------------------------------------------------------ buffers of the groups */

/* Stream: the token rows a group's buffers hold (tp_buf.rows / row_elems / chunk_local) and
 * its shape comment for one chunk ([1, n, ...] for [B, T, ...]). */
static void token_rows(tctx *t, const tv *v, const ir_value *val, int b)
{
    const sbp_train_program *p = t->p;
    if (b < 0 || !p->seq_values || p->seq_values[val->id].state != SBP_SEQ_TOKEN)
        return;
    tp_buf *buf = p->bufs[b];
    int64_t bt = t->B * t->T;
    if (bt <= 0 || tx_numel(val) % (size_t)bt)
        return;
    buf->row_elems = (int64_t)tx_numel(val) / bt;
    buf->rows = v->chunk_rows ? v->chunk_rows : bt;
    if (!v->chunk_rows)
        return;
    const sbp_seq_value *s = &p->seq_values[val->id];
    buf->chunk_local = true;
    if (s->bax >= 0)
        buf->dims[s->bax] = 1;
    buf->dims[s->sax] = v->chunk_rows;
}

int lower_group_buffers(tctx *t)
{
    ir_graph *g = t->g;
    bool *wants = calloc((size_t)g->n_values + 1, sizeof *wants);
    if (!wants)
        return ir_diag_error(g->diag, "out of memory");
    for (int j = 0; j < g->n_values; j++)
        if (t->v[j].needs_grad && t->v[j].grad_live)
            wants[t->v[j].group] = true;
    for (int i = 0; i < g->n_values; i++) {
        tv *v = &t->v[i];
        ir_value *val = g->values[i];
        if (v->group != i)
            continue;
        bool wants_grad = wants[i];
        if (val->kind == IR_VAL_NODE && v->first_node >= 0) {
            bool is_int = !ir_dtype_is_float(val->dtype);
            /* a chunk-local group (stream) holds one chunk's rows */
            size_t numel = tx_numel(val);
            if (v->chunk_rows)
                numel = numel / (size_t)(t->B * t->T) * (size_t)v->chunk_rows;
            v->buf = tx_new_buf(t, TP_BUF_WS, tx_cname(t, "a_", tx_value_stem(t, val)), val, numel,
                                is_int, false, v->region, "activation");
            if (v->buf < 0) {
                free(wants);
                return ir_diag_error(g->diag, "out of memory");
            }
            t->p->bufs[v->buf]->swapped = v->layout == TL_SWAP;
            token_rows(t, v, val, v->buf);
            /* the loss is seeded by its rule, not by a buffer; an in-place gradient overwrites
             * the value (the fused head's logits) */
            if (wants_grad && !val->is_output && v->grad_in_place) {
                v->grad = v->buf;
            } else if (wants_grad && !val->is_output) {
                v->grad = tx_new_buf(t, TP_BUF_WS, tx_cname(t, "d_", tx_value_stem(t, val)), val,
                                     numel, false, true, v->region, "gradient");
                if (v->grad < 0) {
                    free(wants);
                    return ir_diag_error(g->diag, "out of memory");
                }
                t->p->bufs[v->grad]->swapped = v->layout == TL_SWAP;
                token_rows(t, v, val, v->grad);
            }
        } else if (val->kind == IR_VAL_PARAM && wants_grad && v->buf >= 0) {
            const tp_buf *pb = t->p->bufs[v->buf];
            v->grad = tx_new_buf(t, TP_BUF_GRAD, tx_cname(t, "dw_", val->name), val, pb->numel,
                                 false, true, TP_REGION_PERSIST, "parameter gradient");
            if (v->grad < 0) {
                free(wants);
                return ir_diag_error(g->diag, "out of memory");
            }
        }
    }
    free(wants);
    /* the gradient block holds the trained parameters only, in table order: a frozen weight
     * (--freeze, LoRA's base model) costs no gradient and no optimizer state */
    t->p->grad_elems = 0;
    for (int i = 0; i < t->p->n_params; i++) {
        tp_param *q = &t->p->params[i];
        q->grad_offset = SIZE_MAX;
        if (q->tied_to >= 0)
            continue;
        q->grad = t->v[q->value->id].grad;
        q->trainable = q->grad >= 0;
        if (q->trainable) {
            q->grad_offset = t->p->grad_elems;
            t->p->grad_elems += q->numel;
            t->p->bufs[q->grad]->offset = q->grad_offset;
        }
    }
    for (int i = 0; i < t->p->n_params; i++) {
        tp_param *q = &t->p->params[i];
        if (q->tied_to >= 0) {
            q->trainable = t->p->params[q->tied_to].trainable;
            q->grad = t->p->params[q->tied_to].grad;
            q->grad_offset = t->p->params[q->tied_to].grad_offset;
        }
    }
    return IR_OK;
}

/* ------------------------------------------------------------------ 6. emission */

static const int64_t swap12[4] = {0, 2, 1, 3};

/* Physical dims of a value stored in `layout`. */
static void phys_dims(const ir_value *v, int layout, int64_t *d)
{
    for (int i = 0; i < v->rank; i++)
        d[i] = v->dims[i].value;
    if (layout == TL_SWAP) {
        int64_t x = d[1];
        d[1] = d[2];
        d[2] = x;
    }
}

int tx_lower_forward(tctx *t, const ir_node *n, const char *what)
{
    tn *r = tx_node(t, n);
    const grad_rule *rule = train_rule(n->op);
    if (r->view)
        return IR_OK;
    t->cur_node = n;
    t->cur_what = what;
    for (int s = 0; s < n->n_in && s < TN_MAX_IN; s++) {
        if (r->relayout[s] < 0)
            continue;
        const ir_value *src = n->in[s];
        if (src->rank != 4)
            return tx_error(t, n, "input %d needs a layout change that only rank-4 values "
                                  "support", s);
        if (r->relay_buf[s] < 0) {
            const char *what = ir_arena_printf(t->g->arena, "in%d_relayout", s);
            r->relay_buf[s] = tx_node_buf(t, n, tx_numel(src), false, false, what);
            tv *root = tx_root(t, src);
            if (t->v[src->id].needs_grad && root->grad >= 0)
                r->relay_grad[s] = tx_node_buf(t, n, tx_numel(src), false, true, what);
            if (r->relay_buf[s] < 0)
                return ir_diag_error(t->g->diag, "out of memory");
            t->p->bufs[r->relay_buf[s]]->swapped = r->relayout[s] == TL_SWAP;
        }
        int64_t d[4];
        phys_dims(src, t->v[src->id].layout, d);
        int b[2] = {r->relay_buf[s], tx_group_buf(t, src)};
        tp_arg a[3] = {A_I(4), A_IS(t, d, 4), A_IS(t, swap12, 4)};
        tx_emit(t, TP_K_PERMUTE_FWD, b, a);
    }
    return rule->fwd ? rule->fwd(t, n) : IR_OK;
}

bool tx_grad_live(tctx *t, const ir_node *n, const ir_value *loss)
{
    const grad_rule *rule = train_rule(n->op);
    bool live = n->n_out > 0 && n->out[0] == loss;
    for (int i = 0; i < n->n_out; i++)
        if (n->out[i] && t->v[n->out[i]->id].grad_live && tx_root(t, n->out[i])->grad >= 0)
            live = true;
    if (!live)
        return false;
    for (int s = 0; s < n->n_in; s++)
        if (n->in[s] && slot_diff(rule, s) && t->v[n->in[s]->id].needs_grad)
            return true;
    return false;
}

int tx_lower_backward(tctx *t, const ir_node *n)
{
    tn *r = tx_node(t, n);
    const grad_rule *rule = train_rule(n->op);
    if (r->view || !rule->bwd)
        return IR_OK;
    t->cur_node = n;
    t->cur_what = "gradient";
    if (rule->bwd(t, n) != IR_OK)
        return IR_ERR;
    for (int s = 0; s < n->n_in && s < TN_MAX_IN; s++) {
        if (r->relayout[s] < 0 || r->relay_grad[s] < 0)
            continue;
        const ir_value *src = n->in[s];
        int64_t d[4];
        phys_dims(src, t->v[src->id].layout, d);
        int b[2] = {tx_root(t, src)->grad, r->relay_grad[s]};
        tp_arg a[3] = {A_I(4), A_IS(t, d, 4), A_IS(t, swap12, 4)};
        tx_emit(t, TP_K_PERMUTE_BWD, b, a);
    }
    return IR_OK;
}

/* Marks the buffers an instruction reads or writes. */
static void mark_bufs(const tp_block *b, int from, bool *used)
{
    for (int i = from; i < b->n_insts; i++)
        for (int j = 0; j < TP_MAX_BUFS; j++)
            if (b->insts[i].buf[j] >= 0)
                used[b->insts[i].buf[j]] = true;
}

int tx_emit_rules(tctx *t, ir_node **nodes, int nn, const bool *sel, int first, int end,
                  const ir_value *loss, bool recompute)
{
    sbp_train_program *p = t->p;
    tp_block *blk = t->cur;
    /* gradient rules into a scratch block first: recompute only what they read */
    tp_block grads = {0};
    t->cur = &grads;
    for (int k = end - 1; k >= first; k--)
        if ((!sel || sel[k]) && tx_grad_live(t, nodes[k], loss) &&
            tx_lower_backward(t, nodes[k]) != IR_OK) {
            t->cur = blk;
            return IR_ERR;
        }
    t->cur = blk;
    if (recompute) {
        bool *need = calloc((size_t)p->n_bufs + 64, sizeof *need);
        bool *run = calloc((size_t)nn, sizeof *run);
        bool *unread = calloc((size_t)nn, sizeof *unread);
        if (!need || !run || !unread) {
            free(need);
            free(run);
            free(unread);
            return ir_diag_error(t->g->diag, "out of memory");
        }
        mark_bufs(&grads, 0, need);
        for (int k = end - 1; k >= first; k--) {
            const ir_node *n = nodes[k];
            tn *r = &t->n[k];
            if (r->view || (sel && !sel[k]))
                continue;
            /* a local output or node-owned buffer that something downstream reads */
            for (int i = 0; i < n->n_out && !run[k]; i++) {
                int b = n->out[i] ? tx_root(t, n->out[i])->buf : -1;
                if (b >= 0 && need[b] && p->bufs[b]->region != TP_REGION_PERSIST)
                    run[k] = true;
            }
            bool outs_read = run[k];
            for (int i = 0; i < n->n_out && !outs_read; i++) {
                int b = n->out[i] ? tx_root(t, n->out[i])->buf : -1;
                outs_read = b >= 0 && need[b];
            }
            unread[k] = !outs_read;
            for (int i = 0; i < TN_MAX_AUX && !run[k]; i++)
                if (r->aux[i] >= 0 && need[r->aux[i]] && !p->bufs[r->aux[i]]->is_grad)
                    run[k] = true;
            for (int i = 0; i < TN_MAX_IN && !run[k]; i++)
                if (r->relay_buf[i] >= 0 && need[r->relay_buf[i]])
                    run[k] = true;
            if (run[k])
                for (int i = 0; i < n->n_in; i++)
                    if (n->in[i] && tx_root(t, n->in[i])->buf >= 0)
                        need[tx_root(t, n->in[i])->buf] = true;
        }
        int rc = IR_OK;
        for (int k = first; k < end && rc == IR_OK; k++) {
            if (!run[k])
                continue;
            t->outs_unread = unread[k];
            rc = tx_lower_forward(t, nodes[k], "recompute");
            t->outs_unread = false;
        }
        free(need);
        free(run);
        free(unread);
        if (rc != IR_OK)
            return IR_ERR;
    }
    return tx_append(t, blk, &grads);
}

int lower_emit_blocks(tctx *t, ir_node **nodes, int nn, const ir_value *loss)
{
    sbp_train_program *p = t->p;
    bool ckpt = p->strategy == SBP_STRATEGY_CHECKPOINT;
    t->cur = tx_new_block(t, "forward",
                          "The forward pass: every node in order, ending with the loss sum.");
    if (!t->cur)
        return ir_diag_error(t->g->diag, "out of memory");
    tx_emit_doc_setup(t); /* packed: document starts and positions first */
    for (int k = 0; k < nn; k++)
        if (tx_lower_forward(t, nodes[k], "forward") != IR_OK)
            return IR_ERR;
    if (p->forward_only) /* evaluation: the forward and its loss are all */
        return IR_OK;

    int persist_span = tx_span_buf(t, TP_REGION_PERSIST);
    for (int s = p->n_segments - 1; s >= 0; s--) {
        const tp_segment *seg = &p->segments[s];
        bool recompute = ckpt && s < p->n_segments - 1;
        const char *comment = ir_arena_printf(
            t->g->arena, "The backward of segment %s (nodes %d..%d)%s.", seg->name,
            seg->first_node, seg->end_node - 1,
            recompute ? ": recompute the forward values its gradient rules read, from the "
                        "segment's input checkpoint, then run the rules in reverse order"
                      : ": the gradient rules in reverse node order");
        tp_block *blk = tx_new_block(t, ir_arena_printf(t->g->arena, "backward_%s", seg->name),
                                     comment);
        if (!blk)
            return ir_diag_error(t->g->diag, "out of memory");
        t->cur = blk;
        if (s == p->n_segments - 1)
            tx_zero_span(t, persist_span);
        if (ckpt)
            tx_zero_span(t, tx_span_buf(t, s));
        if (tx_emit_rules(t, nodes, nn, NULL, seg->first_node, seg->end_node, loss, recompute) !=
            IR_OK)
            return IR_ERR;
        if (blk->n_insts == 0) /* nothing to do (e.g. every parameter before it frozen) */
            p->n_blocks--;
    }
    return IR_OK;
}


/* Mixture-of-Experts: the load-balancing loss's sums, one [2E] buffer for the whole step (the
 * loss pools the layers), zeroed at the start of the forward (tx_emit_doc_setup), added to by
 * each MoE layer's forward, read by their backwards and by the step after its blocks. */
static int bind_moe(tctx *t, const sbp_train_options *opt)
{
    ir_graph *g = t->g;
    sbp_train_program *p = t->p;
    p->moe_stats_buf = -1;
    p->moe_layers = 0;
    p->moe_experts = 0;
    double rows = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const ir_node *n = g->nodes[i];
        if (n->dead || n->op != IR_OP_MOE)
            continue;
        const ir_value *x = n->in[0], *wr = n->in[1];
        int64_t e = wr->rank == 2 ? wr->dims[0].value : 0;
        if (p->moe_layers > 0 && e != p->moe_experts)
            return tx_error(t, n, "MoE layers with different expert counts (%lld and %lld): "
                                  "the load-balancing loss pools them over one set of experts",
                            (long long)p->moe_experts, (long long)e);
        p->moe_experts = e;
        p->moe_layers++;
        if (x->rank >= 1 && x->dims[x->rank - 1].value > 0)
            rows += (double)tx_numel(x) / (double)x->dims[x->rank - 1].value;
    }
    if (p->moe_layers == 0)
        return IR_OK;
    p->moe_aux_rows = rows;
    p->moe_aux_coef = opt->moe_aux_coef;
    p->moe_aux_scale = rows > 0 ? opt->moe_aux_coef * (double)p->moe_experts / (rows * rows) : 0;
    p->moe_stats_buf = tx_new_buf(t, TP_BUF_WS, "moe_stats", NULL, (size_t)(2 * p->moe_experts),
                                  false, false, TP_REGION_PERSIST,
                                  "load-balancing sums: routed pairs, then router probabilities, "
                                  "per expert over every MoE layer");
    if (p->moe_stats_buf < 0)
        return ir_diag_error(g->diag, "out of memory");
    return IR_OK;
}

int lower_analyze(tctx *t, const ir_value *loss, const sbp_train_options *opt)
{
    ir_graph *g = t->g;
    if (build_params(t) != IR_OK || bind_inputs(t) != IR_OK || pref_setup(t, opt) != IR_OK ||
        bind_moe(t, opt) != IR_OK)
        return IR_ERR;
    if (plan(t, g->nodes, g->n_nodes, loss) != IR_OK)
        return IR_ERR;
    return plan_segments(t, g->nodes, g->n_nodes);
}
