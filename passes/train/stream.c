/* stream.c — StreamBP: the training program of the stream strategy (DESIGN.md, step 5).
 *
 * requires: the segments (autodiff.c, step 4) and the sequence analysis (sequence.c).
 * produces: the program's blocks, with chunk loops (train.h: tp_loop), for make_group_buffers'
 * buffers; the memory planner (plan.c) then places them.
 *
 * Plan. A segment is whole (the prologue: the embeddings, run on the whole sequence and
 * recomputed in the backward, as checkpoint does), a layer (it holds attention) or the head (it
 * holds the loss). In a layer, the nodes K and V depend on (the K/V path: the norm feeding the
 * projections, the k/v projections, RoPE of k, ...) and the static nodes run once per layer on
 * the whole sequence ("pre-loop"); every other node runs in the chunk loop, one chunk of rows of
 * one sequence at a time, and must be row-wise or causal. In the head, every node but the static
 * ones runs in a chunk loop over the B*T token rows and must be row-wise or the loss. Values made
 * and used inside a chunk loop get chunk-local buffers (one chunk's rows); the others (the
 * checkpoints between layers, the K/V path, and their gradients) hold every token's rows and are
 * sliced by the loop (tp_inst.off).
 *
 * Emission.
 *   forward   the prologue; per layer its pre-loop nodes, then the chunk loop that computes the
 *             layer's output rows (attention of query chunk [t0, t0 + n) reads keys < t0 + n).
 *   head      the loss sum zeroed; per logits chunk: the final norm and LM head rows, the fused
 *             cross-entropy (loss sum +=, dlogits written over the logits, scaled by 1 / the
 *             scored positions of the whole batch, counted before the step), then the head's
 *             gradient rules (dW +=, the chunk's rows of the hidden state's gradient). The full
 *             logits never exist, and the loss is exact whatever the chunks and label masks.
 *             DPO and GRPO replace the fused cross-entropy by their own (objective_pref.c);
 *             DPO first runs a chunk loop over the head for each token's log-probability and
 *             a host step for each row's coefficient, GRPO a host step for the row weights.
 *             A log-probability program (logp_only) runs that first chunk loop alone.
 *   backward  per layer, last first: the pre-loop nodes recomputed (K and V once per layer),
 *             then per chunk: its chunk-local gradients zeroed, the forward rows its gradient
 *             rules read recomputed, the rules in reverse (weight gradients +=, dK/dV over the
 *             prefix +=, the chunk's rows of the input gradient); after the loop the K/V path's
 *             rules on the whole sequence, which add their rows into the input gradient. Then
 *             the prologue's backward.
 * A chunk body is lowered by the ordinary rules (grad_rules.c) while every TOKEN value's dims read
 * as one chunk ([1, n, ...] for [B, T, ...]; tctx.chunk); a chunk that does not divide the
 * sequence makes a second loop, of one iteration per sequence, for the tail.
 */
#include "train_internal.h"

#include <stdlib.h>
#include <string.h>

/* Automatic chunk sizes: a layer chunk of at most 1024 rows (the chunk's scratch then stays a
 * small part of a long sequence's checkpoints and K/V); a logits chunk of about 2^22 floats
 * (16 MB), at least 64 rows for the LM head GEMM and at most one sequence, so that B*T*V never
 * exists for B > 1. */
#define STREAM_AUTO_CHUNK 1024
#define STREAM_LOGITS_FLOATS ((int64_t)1 << 22)
#define STREAM_MIN_LOGITS_ROWS 64
/* Mixture-of-Experts layers: every chunk reads each expert's weights and accumulates into each
 * expert's gradients whatever its rows, so the experts' weight traffic grows with the number of
 * chunks while their FLOPs do not, and an expert's GEMMs get c k / E rows of a chunk of c. The
 * automatic chunk gives each expert about this many rows per chunk on average (c >= rows E / k;
 * bench/bench_moe.py: E = 32, top-2 at T = 2048 steps 8% faster with one chunk than with two,
 * E = 4 the same either way). */
#define STREAM_MOE_EXPERT_ROWS 128

/* The automatic layer chunk: STREAM_AUTO_CHUNK, or more for the MoE layers above. */
static int64_t auto_chunk(ir_node **nodes, int nn)
{
    int64_t c = STREAM_AUTO_CHUNK;
    for (int k = 0; k < nn; k++) {
        const ir_node *n = nodes[k];
        if (n->op != IR_OP_MOE || n->n_in < 2 || !n->in[1] || n->in[1]->rank != 2)
            continue;
        int64_t e = n->in[1]->dims[0].value, top = ir_attr_int(n, "k", 1);
        if (e > 0 && top > 0) {
            int64_t want = (STREAM_MOE_EXPERT_ROWS * e + top - 1) / top;
            c = want > c ? want : c;
        }
    }
    return c;
}

static int64_t clamp64(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

static const char *seg_kind_name(tp_seg_kind k)
{
    return k == TP_SEG_LAYER ? "layer" : k == TP_SEG_HEAD ? "head" : "whole";
}

/* ------------------------------------------------------------------ plan */

/* Marks, in [first, end), the producers of what the causal nodes' k and v depend on. */
static int mark_kv_path(tctx *t, ir_node **nodes, int first, int end, bool *pre)
{
    ir_graph *g = t->g;
    const ir_value **stack = malloc(sizeof *stack * ((size_t)g->n_values + 1));
    bool *seen = calloc((size_t)g->n_values + 1, sizeof *seen);
    if (!stack || !seen) {
        free(stack);
        free(seen);
        return ir_diag_error(g->diag, "out of memory");
    }
    int sp = 0;
    for (int k = first; k < end; k++)
        if (t->p->seq_class[k] == SBP_SEQOP_CAUSAL)
            for (int i = 1; i <= 2 && i < nodes[k]->n_in; i++)
                if (nodes[k]->in[i] && !seen[nodes[k]->in[i]->id]) {
                    seen[nodes[k]->in[i]->id] = true;
                    stack[sp++] = nodes[k]->in[i];
                }
    while (sp > 0) {
        const ir_value *v = stack[--sp];
        const ir_node *n = v->producer;
        if (v->kind != IR_VAL_NODE || !n)
            continue;
        int k = tx_index(t, n);
        if (k < first || k >= end || pre[k])
            continue;
        pre[k] = true;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] && !seen[n->in[i]->id]) {
                seen[n->in[i]->id] = true;
                stack[sp++] = n->in[i];
            }
    }
    free(stack);
    free(seen);
    return IR_OK;
}

static int refuse(tctx *t, const ir_node *n, const tp_segment *seg, const char *why)
{
    return tx_error(t, n, "stream: cannot run chunk by chunk in %s: %s (--strategy checkpoint "
                          "trains this model without streaming)",
                    seg->name, why);
}

/* Checks a chunk-loop node; sizes the groups it makes. A chunk-local value may be stored in
 * any layout (its buffer holds the chunk as the rules see it, [1, n, ...]); what the loop
 * slices by rows (values of the pre-loop nodes, the checkpoints) must be stored one row per
 * token, and RoPE and attention, which read rows as positions, must read token rows. */
static int plan_chunk_node(tctx *t, const ir_node *n, int k, const tp_segment *seg)
{
    const sbp_train_program *p = t->p;
    sbp_seq_class c = p->seq_class[k];
    bool ok = c == SBP_SEQOP_ROWWISE || (seg->kind == TP_SEG_LAYER && c == SBP_SEQOP_CAUSAL) ||
              (seg->kind == TP_SEG_HEAD && c == SBP_SEQOP_REDUCING);
    if (!ok)
        return refuse(t, n, seg,
                      p->seq_why[k] ? p->seq_why[k]
                                    : ir_arena_printf(t->g->arena, "a %s op in a %s segment",
                                                      sbp_seq_class_name(c),
                                                      seg_kind_name(seg->kind)));
    bool positions = n->op == IR_OP_ROPE || n->op == IR_OP_ATTENTION;
    for (int i = 0; i < n->n_in; i++) {
        const ir_value *v = n->in[i];
        if (!v || p->seq_values[v->id].state != SBP_SEQ_TOKEN)
            continue;
        bool sliced = !tx_root(t, v)->chunk_rows;
        if ((sliced && !seq_token_major(t, v, t->v[v->id].layout)) ||
            (positions && i < 3 && !seq_token_major(t, v, tx_layout(t, n, i))))
            return refuse(t, n, seg,
                          ir_arena_printf(t->g->arena, "its input '%s' is not stored one row "
                                                       "per token",
                                          v->name));
    }
    for (int i = 0; i < n->n_out; i++) {
        const ir_value *v = n->out[i];
        if (!v || p->seq_values[v->id].state != SBP_SEQ_TOKEN)
            continue;
        tv *root = tx_root(t, v);
        if (root->group != v->id)
            continue; /* a view: its group's root decides */
        if (root->region != TP_REGION_PERSIST)
            root->chunk_rows = seg->kind == TP_SEG_HEAD ? p->logits_chunk : p->chunk;
        else if (!seq_token_major(t, v, root->layout))
            return refuse(t, n, seg,
                          ir_arena_printf(t->g->arena, "its result '%s' is not stored one row "
                                                       "per token",
                                          v->name));
    }
    return IR_OK;
}

/* The head's logits may take their gradient in place (the fused cross-entropy writes dlogits
 * over them) when the loss is their only reader. */
static void plan_logits_in_place(tctx *t, ir_node **nodes, const tp_segment *seg, int loss_k)
{
    const ir_node *ce = nodes[loss_k];
    if (tx_node(t, ce)->relayout[0] >= 0)
        return;
    tv *root = tx_root(t, ce->in[0]);
    if (!root->chunk_rows || root->last_use != loss_k)
        return;
    int readers = 0;
    for (int k = seg->first_node; k < seg->end_node; k++)
        for (int i = 0; i < nodes[k]->n_in; i++)
            if (nodes[k]->in[i] && t->v[nodes[k]->in[i]->id].group == root->group &&
                !tx_node(t, nodes[k])->view)
                readers++;
    if (readers == 1)
        root->grad_in_place = true;
}

int stream_plan(tctx *t, ir_node **nodes, int nn, const ir_value *loss,
                const sbp_train_options *opt)
{
    sbp_train_program *p = t->p;
    ir_graph *g = t->g;
    (void)loss;
    int64_t bt = t->B * t->T;
    int64_t chunk = opt && opt->chunk > 0 ? opt->chunk : auto_chunk(nodes, nn);
    p->chunk = clamp64(chunk, 1, t->T);
    int64_t lc = opt && opt->logits_chunk > 0
                     ? opt->logits_chunk
                     : clamp64(STREAM_LOGITS_FLOATS / (p->vocab > 0 ? p->vocab : 1),
                               STREAM_MIN_LOGITS_ROWS, t->T);
    p->logits_chunk = clamp64(lc, 1, bt);
    p->pre_loop = ir_arena_calloc(g->arena, (size_t)nn + 1, sizeof *p->pre_loop);
    t->saved_dims = ir_arena_calloc(g->arena, (size_t)g->n_values * IR_MAX_RANK + 1,
                                    sizeof *t->saved_dims);
    if (!p->pre_loop || !t->saved_dims)
        return ir_diag_error(g->diag, "out of memory");

    int rc = IR_OK;
    for (int s = 0; s < p->n_segments; s++) {
        tp_segment *seg = &p->segments[s];
        int n_causal = 0, loss_k = -1;
        for (int k = seg->first_node; k < seg->end_node; k++) {
            /* by op: an attention the analysis could not prove causal is refused below */
            n_causal += nodes[k]->op == IR_OP_ATTENTION;
            if (nodes[k]->op == IR_OP_CROSS_ENTROPY || nodes[k]->op == IR_OP_SOFTMAX_CE_LOSS)
                loss_k = k;
        }
        seg->kind = loss_k >= 0 ? TP_SEG_HEAD : n_causal ? TP_SEG_LAYER : TP_SEG_WHOLE;
        if (seg->kind == TP_SEG_WHOLE)
            continue;
        if (seg->kind == TP_SEG_HEAD && n_causal) {
            for (int k = seg->first_node; k < seg->end_node; k++)
                if (nodes[k]->op == IR_OP_ATTENTION)
                    rc = refuse(t, nodes[k], seg,
                                "the loss's segment holds attention (no single residual value "
                                "separates the last layer from the LM head)");
            continue;
        }
        for (int k = seg->first_node; k < seg->end_node; k++)
            if (p->seq_class[k] == SBP_SEQOP_STATIC)
                p->pre_loop[k] = true;
        if (seg->kind == TP_SEG_LAYER &&
            mark_kv_path(t, nodes, seg->first_node, seg->end_node, p->pre_loop) != IR_OK)
            return IR_ERR;
        /* the first node that cannot be chunked is the cause; what reads it follows */
        for (int k = seg->first_node; k < seg->end_node; k++) {
            const ir_node *n = nodes[k];
            if (p->pre_loop[k] && p->seq_class[k] == SBP_SEQOP_CAUSAL) {
                rc = refuse(t, n, seg, "another attention of the segment computes its K/V");
                break;
            }
            if (!p->pre_loop[k] && plan_chunk_node(t, n, k, seg) != IR_OK) {
                rc = IR_ERR;
                break;
            }
        }
        if (seg->kind == TP_SEG_HEAD && rc == IR_OK)
            plan_logits_in_place(t, nodes, seg, loss_k);
    }
    return rc;
}

/* ------------------------------------------------------------------ chunk bodies */

/* CH_LOGP: DPO's first pass over the head, each token's label log-probability (no gradient) */
typedef enum { CH_FORWARD, CH_BACKWARD, CH_HEAD, CH_LOGP } ch_mode;

/* Every TOKEN value's dims as one chunk of n rows (enter), or back (leave). */
static void chunk_dims(tctx *t, int64_t n, bool enter)
{
    ir_graph *g = t->g;
    for (int i = 0; i < g->n_values; i++) {
        const sbp_seq_value *s = &t->p->seq_values[i];
        ir_value *v = g->values[i];
        if (s->state != SBP_SEQ_TOKEN || v->rank > IR_MAX_RANK)
            continue;
        int64_t *save = &t->saved_dims[(size_t)i * IR_MAX_RANK];
        for (int a = 0; a < v->rank; a++) {
            if (enter)
                save[a] = v->dims[a].value;
            else
                v->dims[a].value = save[a];
        }
        if (enter) {
            if (s->bax >= 0)
                v->dims[s->bax].value = 1;
            v->dims[s->sax].value = n;
        }
    }
}

/* Operands holding every token's rows are read at the chunk's rows (unless the rule placed
 * them, as attention does with K/V). */
static void slice_operands(tctx *t, tp_block *b)
{
    const sbp_train_program *p = t->p;
    for (int i = 0; i < b->n_insts; i++) {
        tp_inst *in = &b->insts[i];
        for (int j = 0; j < tp_kernel_table[in->k].n_buf; j++) {
            if (in->buf[j] < 0 || in->off[j].per_row || in->off[j].per_batch)
                continue;
            const tp_buf *buf = p->bufs[in->buf[j]];
            if (buf->rows == t->B * t->T && buf->row_elems > 0 && !buf->chunk_local)
                in->off[j].per_row = buf->row_elems;
        }
    }
}

typedef struct chunk_job {
    ir_node **nodes;
    int nn;
    const ir_value *loss;
    const tp_segment *seg;
    const bool *sel;         /* [nn] the chunk-loop nodes of seg */
    ch_mode mode;
    int loss_k;              /* CH_HEAD: the loss node */
} chunk_job;

/* The body for chunks of len rows into `body`. */
static int chunk_body(tctx *t, const chunk_job *j, int64_t len, tp_block *body)
{
    tchunk ch = {.n = len, .fused_loss = j->mode == CH_HEAD};
    tp_block *outer = t->cur;
    chunk_dims(t, len, true);
    t->chunk = &ch;
    t->cur = body;
    int rc = IR_OK;
    const tp_segment *seg = j->seg;
    switch (j->mode) {
    case CH_FORWARD:
        for (int k = seg->first_node; k < seg->end_node && rc == IR_OK; k++)
            if (j->sel[k])
                rc = tx_lower_forward(t, j->nodes[k], "forward");
        break;
    case CH_BACKWARD:
        rc = tx_emit_rules(t, j->nodes, j->nn, j->sel, seg->first_node, seg->end_node, j->loss,
                           true);
        break;
    case CH_LOGP:
        for (int k = seg->first_node; k < seg->end_node && rc == IR_OK; k++)
            if (j->sel[k] && k != j->loss_k)
                rc = tx_lower_forward(t, j->nodes[k], "forward");
        t->cur_node = j->nodes[j->loss_k];
        t->cur_what = "forward";
        if (rc == IR_OK)
            rc = pref_loss_logp(t, j->nodes[j->loss_k]);
        break;
    case CH_HEAD: {
        for (int k = seg->first_node; k < seg->end_node && rc == IR_OK; k++)
            if (j->sel[k] && k != j->loss_k)
                rc = tx_lower_forward(t, j->nodes[k], "forward");
        if (rc == IR_OK) {
            t->cur_node = j->nodes[j->loss_k];
            rc = tx_lower_backward(t, j->nodes[j->loss_k]);
        }
        bool *rest = calloc((size_t)j->nn + 1, sizeof *rest);
        if (!rest) {
            rc = ir_diag_error(t->g->diag, "out of memory");
            break;
        }
        for (int k = seg->first_node; k < seg->end_node; k++)
            rest[k] = j->sel[k] && k != j->loss_k;
        if (rc == IR_OK)
            rc = tx_emit_rules(t, j->nodes, j->nn, rest, seg->first_node, seg->end_node,
                               j->loss, false);
        free(rest);
        break;
    }
    }
    t->chunk = NULL;
    chunk_dims(t, len, false);
    t->cur = outer;
    if (rc == IR_OK)
        slice_operands(t, body);
    return rc;
}

/* A chunk loop of segment j->seg into t->cur: the full chunks, then the tail. */
static int chunk_loop(tctx *t, const chunk_job *j)
{
    sbp_train_program *p = t->p;
    bool head = j->mode == CH_HEAD || j->mode == CH_LOGP;
    int64_t batch = head ? 1 : t->B, seq = head ? t->B * t->T : t->T;
    int64_t c = head ? p->logits_chunk : p->chunk;
    int64_t nfull = seq / c, rem = seq % c;
    int group = t->n_loop_groups++;
    const char *const mode_name[] = {"forward", "backward", "loss, forward and backward",
                                     p->logp_only ? "log-probabilities"
                                                  : "log-probabilities (first pass)"};
    for (int pass = 0; pass < 2; pass++) {
        int64_t len = pass ? rem : c;
        if (len == 0 || (pass == 0 && nfull == 0))
            continue;
        tp_block body = {0};
        if (chunk_body(t, j, len, &body) != IR_OK)
            return IR_ERR;
        tp_block *blk = t->cur;
        tp_loop l = {
            .first = blk->n_insts,
            .batch = batch,
            .seq = seq,
            .begin = pass ? nfull * c : 0,
            .stop = pass ? seq : nfull * c,
            .step = len,
            .len = len,
            .group = group,
            .what = ir_arena_printf(t->g->arena, "%s %s%s", j->seg->name,
                                    j->mode == CH_HEAD && p->forward_only ? "loss, forward only"
                                                                          : mode_name[j->mode],
                                    pass ? " (tail chunk)" : ""),
        };
        /* the chunk-local gradients the body accumulates into start at zero in each
         * iteration */
        bool *zeroed = calloc((size_t)p->n_bufs + 1, sizeof *zeroed);
        if (!zeroed)
            return ir_diag_error(t->g->diag, "out of memory");
        for (int i = 0; i < body.n_insts; i++)
            for (int o = 0; o < tp_kernel_table[body.insts[i].k].n_buf; o++) {
                int b = body.insts[i].buf[o];
                if (b >= 0 && !zeroed[b] && p->bufs[b]->chunk_local && p->bufs[b]->is_grad &&
                    p->bufs[b]->kind == TP_BUF_WS) {
                    zeroed[b] = true;
                    tx_zero_buf(t, b);
                }
            }
        free(zeroed);
        if (tx_append(t, blk, &body) != IR_OK)
            return IR_ERR;
        l.end = blk->n_insts;
        if (tx_grow(t->g->arena, (void **)&blk->loops, &blk->cap_loops, blk->n_loops + 1,
                    sizeof *blk->loops))
            return ir_diag_error(t->g->diag, "out of memory");
        blk->loops[blk->n_loops++] = l;
    }
    return IR_OK;
}

/* ------------------------------------------------------------------ blocks */

static int lower_nodes(tctx *t, ir_node **nodes, const tp_segment *seg, const bool *sel,
                       const char *what)
{
    for (int k = seg->first_node; k < seg->end_node; k++)
        if ((!sel || sel[k]) && tx_lower_forward(t, nodes[k], what) != IR_OK)
            return IR_ERR;
    return IR_OK;
}

/* Sequence parallelism: around a layer's chunk loop, each attention's K/V of the rank's heads
 * over the whole sequence (before: the K/V path has run), or their gradients back to the
 * ranks that own the rows (after, before the K/V path's rules). */
static int sp_around_loop(tctx *t, ir_node **nodes, const tp_segment *seg, bool after)
{
    if (t->p->seq_parallel < 1)
        return IR_OK;
    for (int k = seg->first_node; k < seg->end_node; k++)
        if (nodes[k]->op == IR_OP_ATTENTION &&
            (after ? sp_kv_scatter(t, nodes[k]) : sp_kv_gather(t, nodes[k])) != IR_OK)
            return IR_ERR;
    return IR_OK;
}

int stream_emit(tctx *t, ir_node **nodes, int nn, const ir_value *loss)
{
    sbp_train_program *p = t->p;
    ir_graph *g = t->g;
    bool *pre = p->pre_loop;
    bool *sel = calloc((size_t)nn + 1, sizeof *sel); /* the chunk-loop nodes */
    if (!sel)
        return ir_diag_error(g->diag, "out of memory");
    int head = -1, loss_k = -1;
    for (int s = 0; s < p->n_segments; s++) {
        const tp_segment *seg = &p->segments[s];
        for (int k = seg->first_node; k < seg->end_node; k++) {
            sel[k] = seg->kind != TP_SEG_WHOLE && !pre[k];
            if (nodes[k]->op == IR_OP_CROSS_ENTROPY || nodes[k]->op == IR_OP_SOFTMAX_CE_LOSS)
                loss_k = k;
        }
        if (seg->kind == TP_SEG_HEAD)
            head = s;
    }
    int rc = IR_OK;
    if (head != p->n_segments - 1 || loss_k < 0) {
        rc = ir_diag_error(g->diag, "stream: the loss must be in the last segment");
        goto out;
    }

    /* forward: the prologue, then each layer's pre-loop nodes and chunk loop */
    t->cur = tx_new_block(t, "forward",
                          "The forward pass: the prologue on the whole sequence; per layer, the "
                          "K/V path once on the whole sequence, then the layer's output chunk "
                          "by chunk (only the residual stream between layers is kept).");
    if (!t->cur) {
        rc = ir_diag_error(g->diag, "out of memory");
        goto out;
    }
    tx_emit_doc_setup(t); /* packed: document starts and positions first */
    for (int s = 0; s < head && rc == IR_OK; s++) {
        const tp_segment *seg = &p->segments[s];
        if (seg->kind == TP_SEG_WHOLE) {
            rc = lower_nodes(t, nodes, seg, NULL, "forward");
            continue;
        }
        rc = lower_nodes(t, nodes, seg, pre, "forward");
        if (rc == IR_OK)
            rc = sp_around_loop(t, nodes, seg, false);
        chunk_job j = {nodes, nn, loss, seg, sel, CH_FORWARD, -1};
        if (rc == IR_OK)
            rc = chunk_loop(t, &j);
    }
    if (rc != IR_OK)
        goto out;

    /* the head: the loss and its backward, chunk by chunk */
    const tp_segment *hs = &p->segments[head];
    t->cur = tx_new_block(t, "head",
                          p->logp_only
                              ? "The LM head chunk by chunk over the token rows: each token's "
                                "label log-probability (no loss, no gradient). The full logits "
                                "never exist."
                          : p->forward_only
                              ? "The LM head and the loss, chunk by chunk over the token rows: "
                                "the cross-entropy adds the chunk's token losses to the loss "
                                "sum (no dlogits: evaluation). The full logits never exist."
                              : "The LM head and the loss, chunk by chunk over the token rows, "
                                "forward and backward fused: the fused cross-entropy adds the "
                                "chunk's token losses to the loss sum and writes dlogits (scaled "
                                "by 1 / the scored positions of the whole batch) over the logits "
                                "chunk, which the head's gradient rules then consume. The full "
                                "logits never exist.");
    if (!t->cur) {
        rc = ir_diag_error(g->diag, "out of memory");
        goto out;
    }
    if (!p->forward_only) {
        tx_zero_region(t, TP_REGION_PERSIST);
        tx_zero_region(t, head);
    }
    t->cur_node = nodes[loss_k];
    t->cur_what = "forward";
    if (!p->logp_only)
        tx_emit(t, TP_K_MEMSET_ZERO, (const int[]){tx_root(t, loss)->buf},
                (const tp_arg[]){A_I(4)});
    rc = lower_nodes(t, nodes, hs, pre, "forward");
    if (rc == IR_OK && p->logp_only) {
        /* the log-probability program: DPO's first pass alone, for either objective */
        chunk_job lj = {nodes, nn, loss, hs, sel, CH_LOGP, loss_k};
        rc = chunk_loop(t, &lj);
        goto out;
    }
    if (rc == IR_OK && p->objective == SBP_OBJECTIVE_DPO) {
        /* DPO: a first pass over the head for each row's logp, then its coefficients
         * (objective_pref.c) */
        chunk_job lj = {nodes, nn, loss, hs, sel, CH_LOGP, loss_k};
        rc = chunk_loop(t, &lj);
        if (rc == IR_OK)
            rc = pref_emit_coefficients(t);
    }
    if (rc == IR_OK)
        rc = pref_emit_row_weights(t); /* GRPO: each row's weight, before the loop */
    chunk_job hj = {nodes, nn, loss, hs, sel, CH_HEAD, loss_k};
    if (rc == IR_OK)
        rc = chunk_loop(t, &hj);
    if (rc == IR_OK)
        rc = tx_emit_rules(t, nodes, nn, pre, hs->first_node, hs->end_node, loss, false);

    /* the backward of each layer, last first, then the prologue (none for evaluation) */
    for (int s = head - 1; s >= 0 && rc == IR_OK && !p->forward_only; s--) {
        const tp_segment *seg = &p->segments[s];
        bool layer = seg->kind == TP_SEG_LAYER;
        const char *comment =
            layer ? ir_arena_printf(g->arena,
                                    "The backward of %s: its K/V path recomputed once from the "
                                    "layer's input checkpoint; then per chunk of rows, the "
                                    "forward rows the gradient rules read recomputed and the "
                                    "rules run (weight gradients and dK/dV accumulate, the "
                                    "chunk's rows of the input gradient are added); then the "
                                    "K/V path's gradients on the whole sequence.",
                                    seg->name)
                  : ir_arena_printf(g->arena,
                                    "The backward of segment %s (nodes %d..%d): recompute the "
                                    "forward values its gradient rules read, then run the rules "
                                    "in reverse order.",
                                    seg->name, seg->first_node, seg->end_node - 1);
        t->cur = tx_new_block(t, ir_arena_printf(g->arena, "backward_%s", seg->name), comment);
        if (!t->cur) {
            rc = ir_diag_error(g->diag, "out of memory");
            break;
        }
        tx_zero_region(t, s);
        if (!layer) {
            rc = tx_emit_rules(t, nodes, nn, NULL, seg->first_node, seg->end_node, loss, true);
            continue;
        }
        rc = lower_nodes(t, nodes, seg, pre, "recompute");
        if (rc == IR_OK)
            rc = sp_around_loop(t, nodes, seg, false);
        chunk_job j = {nodes, nn, loss, seg, sel, CH_BACKWARD, -1};
        if (rc == IR_OK)
            rc = chunk_loop(t, &j);
        if (rc == IR_OK)
            rc = sp_around_loop(t, nodes, seg, true);
        if (rc == IR_OK)
            rc = tx_emit_rules(t, nodes, nn, pre, seg->first_node, seg->end_node, loss, false);
    }

    /* backward blocks without a gradient rule to run (every parameter before them frozen):
     * their recomputation would be for nothing */
    int kept = 0;
    for (int b = 0; b < p->n_blocks; b++) {
        const tp_block *blk = p->blocks[b];
        bool work = strncmp(blk->name, "backward_", 9) != 0;
        for (int i = 0; i < blk->n_insts && !work; i++)
            work = blk->insts[i].what && strcmp(blk->insts[i].what, "gradient") == 0;
        if (work)
            p->blocks[kept++] = p->blocks[b];
    }
    p->n_blocks = kept;
out:
    free(sel);
    return rc;
}
