/* train_print.c — the training program as text: sbpc --dump-ir=autodiff|stream|plan|program.
 *
 * The listings a reader follows to see what the compiler made of the model: the blocks with
 * their chunk loops (row ranges, which operands are slices of full-length buffers, which
 * gradients accumulate over chunks, what is recomputed), and the memory plan (each workspace
 * buffer's offset, size and lifetime).
 */
#include "train_internal.h"

#include <string.h>

/* ------------------------------------------------------------------ printer */

static const char *region_name(const sbp_train_program *p, int region)
{
    return region == TP_REGION_PERSIST ? "persistent" : p->segments[region].name;
}

/* Stream: the chunk sizes and the sequence analysis, per node of the chunked segments. */
static void print_stream(const sbp_train_program *p, FILE *f)
{
    fprintf(f, "\nstream: chunk %lld tokens per sequence in layers, %lld token rows in the head\n",
            (long long)p->chunk, (long long)p->logits_chunk);
    for (int s = 0; s < p->n_segments; s++) {
        const tp_segment *seg = &p->segments[s];
        if (seg->kind == TP_SEG_WHOLE)
            continue;
        int col = fprintf(f, "  %s:", seg->name);
        for (int k = seg->first_node; k < seg->end_node; k++) {
            const ir_node *n = p->g->nodes[k];
            char item[256];
            snprintf(item, sizeof item, " %s %s%s%s", n->name,
                     sbp_seq_class_name(p->seq_class[k]), p->pre_loop[k] ? " (once)" : "",
                     k + 1 < seg->end_node ? "," : "");
            if (col + (int)strlen(item) > 100)
                col = fprintf(f, "\n   ");
            col += fprintf(f, "%s", item);
        }
        fputc('\n', f);
    }
}

void sbp_train_print(const sbp_train_program *p, FILE *f)
{
    fprintf(f, "training program: strategy %s, objective %s, B=%lld T=%lld V=%lld\n",
            sbp_strategy_name(p->strategy), sbp_objective_name(p->objective),
            (long long)p->batch, (long long)p->seq_len, (long long)p->vocab);
    fprintf(f, "parameters: %d tensors, %zu floats\n", p->n_params, p->param_elems);
    for (int i = 0; i < p->n_params; i++) {
        const tp_param *q = &p->params[i];
        char ty[128];
        fprintf(f, "  [%d] %-40s %s offset %zu%s", i, q->value->name,
                ir_value_type_str(q->value, ty, sizeof ty), q->offset,
                q->trainable ? "" : " frozen");
        if (q->tied_to >= 0)
            fprintf(f, " tied to [%d] (transposed)", q->tied_to);
        fputc('\n', f);
    }
    fprintf(f, "segments:");
    for (int s = 0; s < p->n_segments; s++)
        fprintf(f, " %s[%d..%d)%s", p->segments[s].name, p->segments[s].first_node,
                p->segments[s].end_node,
                p->strategy != SBP_STRATEGY_STREAM         ? ""
                : p->segments[s].kind == TP_SEG_LAYER ? "(layer)"
                : p->segments[s].kind == TP_SEG_HEAD  ? "(head)"
                                                      : "(whole)");
    if (p->strategy == SBP_STRATEGY_STREAM)
        print_stream(p, f);
    fprintf(f, "\nworkspace: %zu bytes (liveness-planned, passes/memplan.c)\n", p->workspace_bytes);
    for (int i = 0; i < p->n_bufs; i++) {
        const tp_buf *b = p->bufs[i];
        if (b->kind != TP_BUF_WS)
            continue;
        fprintf(f, "  %-48s %-10s @%-9zu %9zu B  %s%s\n", b->name, region_name(p, b->region),
                b->offset, b->numel * tp_buf_elem_bytes(b), b->what ? b->what : "",
                b->chunk_local ? " (one chunk)" : "");
    }
    for (int bi = 0; bi < p->n_blocks; bi++) {
        const tp_block *blk = p->blocks[bi];
        fprintf(f, "block %s:\n", blk->name);
        int li = 0;
        for (int i = 0; i < blk->n_insts; i++) {
            const tp_inst *in = &blk->insts[i];
            const tp_loop *l = li < blk->n_loops ? &blk->loops[li] : NULL;
            if (l && l->first == i)
                fprintf(f, "  loop %s: b < %lld, t0 = %lld..%lld step %lld, rows [t0, t0+%lld) "
                           "{\n",
                        l->what ? l->what : "", (long long)l->batch, (long long)l->begin,
                        (long long)l->stop, (long long)l->step, (long long)l->len);
            fprintf(f, "  %s%-14s", l && l->first <= i ? "  " : "", tp_kernel_table[in->k].name);
            for (int j = 0; j < tp_kernel_table[in->k].n_buf; j++) {
                fprintf(f, " %s", in->buf[j] >= 0 ? p->bufs[in->buf[j]]->name : "NULL");
                if (in->off[j].per_row)
                    fprintf(f, "[+%lld*r0]", (long long)in->off[j].per_row);
                if (in->off[j].per_batch)
                    fprintf(f, "[+%lld*b]", (long long)in->off[j].per_batch);
            }
            if (in->node)
                fprintf(f, "   # %s %s", in->what, in->node->name);
            fputc('\n', f);
            if (l && l->end == i + 1) {
                fputs("  }\n", f);
                li++;
            }
        }
    }
}

