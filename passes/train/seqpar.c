/* seqpar.c — sequence parallelism (sbpc --seq-parallel N): the program of one rank of N that
 * share every row, each holding T/N consecutive tokens of it (train.h, "Sequence parallelism").
 *
 * requires: the autodiff analysis (bound inputs, layouts) and the sequence analysis
 * (sequence.c) of the graph bound at the whole length T.
 * produces: the same graph with every TOKEN value's sequence axis T/N (t->T and p->seq_len
 * too), the inputs' buffers sized for the rank's tokens, and, for packed documents, the
 * whole rows' document buffers; or a diagnostic naming the node that cannot be split.
 *
 * Why after the sequence analysis and not by binding the graph at T/N: the constants that
 * depend on positions (RoPE's cos/sin tables, folded from the exporter's arange) must cover
 * the whole row, since rank r's tokens sit at positions r*T/N and later. Binding at T keeps
 * them whole; the analysis then says which axis of each value is the sequence, and only
 * those axes shrink. What reads the sequence as a whole is refused: an op the analysis calls
 * positional (a constant that varies along the sequence, other than the position embedding
 * graph/packed.c turned into the positions input) or mixing. Attention is the one causal op;
 * grad_rules.c lowers it to the exchanging kernels, whose head split needs Hq % N == 0 and
 * Hkv % N == 0 or N % Hkv == 0 (each rank's query heads then read one replicated kv head).
 */
#include "train_internal.h"

#include <string.h>

/* The kv heads of one rank (runtime/sbprt.h: hkv_r), 0 when Hq, Hkv cannot be split N ways;
 * *why says which rule fails. */
int64_t sp_kv_heads(int64_t hq, int64_t hkv, int64_t n, const char **why)
{
    *why = NULL;
    if (n <= 1)
        return hkv;
    if (hkv <= 0 || hq % n != 0) {
        *why = "the query heads are not a multiple of N";
        return 0;
    }
    if (hkv % n == 0)
        return hkv / n;
    if (n % hkv == 0 && hq % hkv == 0)
        return 1;
    *why = "the kv heads are neither a multiple nor a divisor of N";
    return 0;
}

static int check_nodes(tctx *t, ir_node **nodes, int nn)
{
    sbp_train_program *p = t->p;
    const int64_t N = p->seq_parallel;
    for (int k = 0; k < nn; k++) {
        const ir_node *n = nodes[k];
        sbp_seq_class c = p->seq_class[k];
        if (c == SBP_SEQOP_POSITIONAL || c == SBP_SEQOP_MIXING)
            return tx_error(t, n, "--seq-parallel %lld: each rank holds %lld of a row's %lld "
                                  "tokens, and this node reads the row as a whole (%s)",
                            (long long)N, (long long)(t->T / N), (long long)t->T,
                            p->seq_why[k] ? p->seq_why[k] : sbp_seq_class_name(c));
        if (n->op != IR_OP_ATTENTION)
            continue;
        int64_t hq = n->in[0]->dims[1].value, hkv = n->in[1]->dims[1].value;
        const char *why;
        if (sp_kv_heads(hq, hkv, N, &why) == 0)
            return tx_error(t, n, "--seq-parallel %lld splits attention's heads over the ranks, "
                                  "and %lld query heads with %lld kv heads cannot be: %s",
                            (long long)N, (long long)hq, (long long)hkv, why);
    }
    return IR_OK;
}

/* A bound input's buffer, resized to the rank's tokens. */
static void local_rows(sbp_train_program *p, int b, int64_t rows)
{
    if (b < 0)
        return;
    tp_buf *buf = p->bufs[b];
    buf->numel = (size_t)rows;
    buf->rows = rows;
    if (buf->value && buf->value->rank <= IR_MAX_RANK) {
        buf->rank = buf->value->rank;
        for (int a = 0; a < buf->value->rank; a++)
            buf->dims[a] = buf->value->dims[a].value;
    }
}

int sp_localize(tctx *t, ir_node **nodes, int nn)
{
    ir_graph *g = t->g;
    sbp_train_program *p = t->p;
    const int64_t N = p->seq_parallel, T = t->T;
    if (T % N != 0) {
        int64_t lo = T / N * N, hi = lo + N;
        return ir_diag_error(g->diag, "--seq-parallel %lld needs a sequence length that %lld "
                                      "ranks share equally: %lld is not a multiple of %lld "
                                      "(the nearest are --seq-len %lld and %lld)",
                             (long long)N, (long long)N, (long long)T, (long long)N,
                             (long long)(lo > 0 ? lo : hi), (long long)(lo > 0 ? hi : 2 * hi));
    }
    if (check_nodes(t, nodes, nn) != IR_OK)
        return IR_ERR;
    sp_undo *u = t->sp_undo;
    u->n = 0;
    u->value = ir_arena_calloc(g->arena, (size_t)g->n_values + 1, sizeof *u->value);
    u->axis = ir_arena_calloc(g->arena, (size_t)g->n_values + 1, sizeof *u->axis);
    u->dim = ir_arena_calloc(g->arena, (size_t)g->n_values + 1, sizeof *u->dim);
    if (!u->value || !u->axis || !u->dim)
        return ir_diag_error(g->diag, "out of memory");
    for (int i = 0; i < g->n_values; i++) {
        const sbp_seq_value *s = &p->seq_values[i];
        ir_value *v = g->values[i];
        if (s->state != SBP_SEQ_TOKEN || s->sax < 0 || s->sax >= v->rank)
            continue;
        u->value[u->n] = i;
        u->axis[u->n] = s->sax;
        u->dim[u->n++] = v->dims[s->sax].value;
        v->dims[s->sax].value /= N; /* T -> T/N, or B*T -> B*T/N when the batch is merged */
    }
    const int64_t tl = T / N, rows = t->B * tl;
    p->seq_len_global = T;
    t->T = p->seq_len = tl;
    local_rows(p, p->ids_buf, rows);
    local_rows(p, p->labels_buf, rows);
    local_rows(p, p->docs_buf, rows);
    local_rows(p, p->doc_pos_buf, rows);
    if (p->packed) {
        /* the whole rows' document ids and starts: the attention of this rank's heads reads
         * every rank's queries and keys */
        p->doc_all_buf = tx_new_buf(t, TP_BUF_WS, "doc_all", NULL, (size_t)(t->B * T), true,
                                    false, TP_REGION_PERSIST,
                                    "every rank's document ids (the whole rows)");
        p->doc_gather_buf = tx_new_buf(t, TP_BUF_WS, "doc_exchange", NULL, (size_t)(N * tl),
                                       true, false, TP_REGION_PERSIST,
                                       "the document ids' exchange (one row)");
        if (p->doc_all_buf < 0 || p->doc_gather_buf < 0)
            return ir_diag_error(g->diag, "out of memory");
    }
    return IR_OK;
}

void sp_restore(ir_graph *g, const sp_undo *u)
{
    for (int i = 0; u && i < u->n; i++)
        g->values[u->value[i]]->dims[u->axis[i]].value = u->dim[i];
}

/* ------------------------------------------------------------------ what the exchanges move */

/* Bytes one call of `in` puts through all-to-alls (this rank's send buffers; what it receives
 * is as large), or 0 for a kernel that exchanges nothing. The figures follow runtime/sbprt.h:
 * the K/V exchange sends [N, T/N, hkv_r, hd] per batch row, the attention's forward its q and
 * its output, the backward q, out, dout and dq, each b * t * hq * hd floats. */
int64_t sp_inst_exchange_bytes(const tp_inst *in)
{
    const tp_arg *a = in->arg;
    switch (in->k) {
    case TP_K_SP_GATHER_ROWS:
        return a[0].i * a[2].i * a[1].i * 4;
    case TP_K_SP_KV_GATHER:
    case TP_K_SP_KV_SCATTER: {
        const char *why;
        int64_t hr = sp_kv_heads(a[2].i, a[3].i, a[5].i, &why);
        return a[0].i * a[5].i * a[1].i * hr * a[4].i * 4;
    }
    case TP_K_SP_ATTENTION_FWD:
    case TP_K_SP_ATTENTION_BWD:
        return (in->k == TP_K_SP_ATTENTION_FWD ? 2 : 4) * a[0].i * a[1].i * a[3].i * a[5].i * 4;
    default:
        return 0;
    }
}

int64_t sbp_train_sp_bytes_sent(const sbp_train_program *p)
{
    if (p->seq_parallel < 1)
        return 0;
    const int64_t N = p->seq_parallel;
    int64_t total = 0;
    for (int bi = 0; bi < p->n_blocks; bi++) {
        const tp_block *blk = p->blocks[bi];
        for (int i = 0; i < blk->n_insts; i++) {
            int64_t bytes = sp_inst_exchange_bytes(&blk->insts[i]), times = 1;
            if (!bytes)
                continue;
            for (int l = 0; l < blk->n_loops; l++) {
                const tp_loop *lp = &blk->loops[l];
                if (lp->first <= i && i < lp->end && lp->step > 0)
                    times *= lp->batch * ((lp->stop - lp->begin + lp->step - 1) / lp->step);
            }
            total += bytes * times / N * (N - 1); /* the block to itself stays on the rank */
        }
    }
    return total;
}
