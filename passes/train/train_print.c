/* train_print.c — the training program as text: sbpc --dump-ir=autodiff|stream|plan|program.
 *
 * The listings a reader follows to see what the compiler made of the model: the blocks with
 * their chunk loops (row ranges, which operands are slices of full-length buffers, which
 * gradients accumulate over chunks, what is recomputed), and the memory plan (each workspace
 * buffer's offset, size and lifetime).
 */
#include "memplan.h"
#include "train_internal.h"

#include <stdlib.h>
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

/* The segments in node order (stream: with their kinds), then stream's analysis per node;
 * newline: end the segments' line first (the full listing leaves it to the next section). */
static void print_segments(const sbp_train_program *p, FILE *f, bool newline)
{
    fprintf(f, "segments:");
    for (int s = 0; s < p->n_segments; s++)
        fprintf(f, " %s[%d..%d)%s", p->segments[s].name, p->segments[s].first_node,
                p->segments[s].end_node,
                p->strategy != SBP_STRATEGY_STREAM         ? ""
                : p->segments[s].kind == TP_SEG_LAYER ? "(layer)"
                : p->segments[s].kind == TP_SEG_HEAD  ? "(head)"
                                                      : "(whole)");
    if (newline)
        fputc('\n', f);
    if (p->strategy == SBP_STRATEGY_STREAM)
        print_stream(p, f);
}

/* --offload: the host copies and each transfer's way out and back (offload.c). */
static void print_offload(const sbp_train_program *p, FILE *f)
{
    if (p->n_grad_transfers > 0)
        fprintf(f, "\noffload: %d gradient%s accumulated in the workspace and sent to the host "
                   "gradient block after the last contribution\n",
                p->n_grad_transfers, p->n_grad_transfers == 1 ? "" : "s");
    for (int i = 0; i < p->n_grad_transfers; i++) {
        const tp_transfer *t = &p->grad_transfers[i];
        fprintf(f, "  %-48s %9zu B  in from %s in %s (event %d, waited in %s), out in %s "
                   "(event %d, waited in %s)\n",
                p->bufs[t->buf]->name, t->bytes, p->bufs[t->host]->name,
                p->blocks[t->in_block]->name, t->in_event, p->blocks[t->in_wait_block]->name,
                p->blocks[t->out_block]->name, t->out_event, p->blocks[t->out_wait_block]->name);
    }
    if (p->n_transfers == 0)
        return;
    fprintf(f, "\noffload: %d buffer%s in host memory between forward and backward, %zu bytes "
               "of host workspace; copies on the copy stream, waits on the compute stream\n",
            p->n_transfers, p->n_transfers == 1 ? "" : "s", p->host_bytes);
    for (int i = 0; i < p->n_transfers; i++) {
        const tp_transfer *t = &p->transfers[i];
        fprintf(f, "  %-48s %9zu B  host @%zu: out in %s (event %d, waited in %s), back in %s "
                   "(event %d, waited in %s)\n",
                p->bufs[t->buf]->name, t->bytes, p->bufs[t->host]->offset,
                p->blocks[t->out_block]->name, t->out_event, p->blocks[t->out_wait_block]->name,
                p->blocks[t->in_block]->name, t->in_event, p->blocks[t->in_wait_block]->name);
    }
}

void sbp_train_print(const sbp_train_program *p, FILE *f)
{
    fprintf(f, "training program: strategy %s, objective %s%s, B=%lld T=%lld V=%lld\n",
            sbp_strategy_name(p->strategy), sbp_objective_name(p->objective),
            p->per_document ? " per document" : "", (long long)p->batch,
            (long long)p->seq_len, (long long)p->vocab);
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
    print_segments(p, f, false);
    fprintf(f, "\nworkspace: %zu bytes (liveness-planned, passes/train/plan.c)\n",
            p->workspace_bytes);
    print_offload(p, f);
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


/* ------------------------------------------------------------------ --dump-ir=autodiff|stream */

/* The program line, the parameters (trained or frozen), the segments and stream's analysis. */
static void print_header(const sbp_train_program *p, FILE *f, const char *stage)
{
    int trained = 0;
    for (int i = 0; i < p->n_params; i++)
        trained += p->params[i].trainable;
    fprintf(f, "training program after %s: strategy %s, objective %s%s, B=%lld T=%lld V=%lld\n",
            stage, sbp_strategy_name(p->strategy), sbp_objective_name(p->objective),
            p->per_document ? " per document" : "", (long long)p->batch,
            (long long)p->seq_len, (long long)p->vocab);
    fprintf(f, "parameters: %d tensors (%d trained), %zu floats\n", p->n_params, trained,
            p->param_elems);
    for (int i = 0; i < p->n_params; i++) {
        const tp_param *q = &p->params[i];
        char ty[128];
        fprintf(f, "  %-48s %-16s %s", q->value->name,
                ir_value_type_str(q->value, ty, sizeof ty), q->trainable ? "trained" : "frozen");
        if (q->tied_to >= 0)
            fprintf(f, ", tied to %s (transposed)", p->params[q->tied_to].value->name);
        fputc('\n', f);
    }
    print_segments(p, f, true);
}

/* One operand: its name, and inside a chunk loop the part of it the chunk reads or writes. */
static void print_operand(const sbp_train_program *p, const tp_inst *in, int j, FILE *f)
{
    if (in->buf[j] < 0) {
        fputs(" NULL", f);
        return;
    }
    const tp_buf *b = p->bufs[in->buf[j]];
    fprintf(f, " %s", b->name);
    const tp_off *o = &in->off[j];
    if (o->per_row && b->row_elems > 0 && o->per_row == b->row_elems)
        fputs("[rows r0..]", f); /* the chunk's rows of a buffer that holds every token's */
    else if (o->per_row)
        fprintf(f, "[+%lld*r0]", (long long)o->per_row);
    if (o->per_batch)
        fprintf(f, "[+%lld*b]", (long long)o->per_batch);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Gradient buffers a chunk loop's body uses whole (not sliced to the chunk's rows, not
 * chunk-local; at most offset to the batch element): every chunk adds into them (weight
 * gradients, dK/dV over the prefix). Listed in buffer order; one pass over the body, so the
 * listing of a long program stays linear (seen: [n_bufs] scratch, all false on entry and
 * exit). */
static void print_accumulators(const sbp_train_program *p, const tp_block *blk, const tp_loop *l,
                               bool *seen, FILE *f)
{
    int *ids = malloc(sizeof *ids * (size_t)(TP_MAX_BUFS * (l->end - l->first) + 1)), n = 0;
    if (!ids) {
        fputs("    # (out of memory)\n", f);
        return;
    }
    for (int i = l->first; i < l->end; i++) {
        const tp_inst *in = &blk->insts[i];
        if (in->k == TP_K_MEMSET_ZERO)
            continue;
        for (int j = 0; j < tp_kernel_table[in->k].n_buf; j++) {
            int b = in->buf[j];
            if (b < 0 || in->off[j].per_row || seen[b])
                continue;
            const tp_buf *buf = p->bufs[b];
            if (buf->is_grad && !buf->chunk_local && !buf->span) {
                seen[b] = true;
                ids[n++] = b;
            }
        }
    }
    qsort(ids, (size_t)n, sizeof *ids, cmp_int);
    int col = fprintf(f, "    # accumulated over the chunks:");
    for (int k = 0; k < n; k++) {
        const char *name = p->bufs[ids[k]]->name;
        if (col + (int)strlen(name) > 98)
            col = fprintf(f, "\n    #  ");
        col += fprintf(f, " %s", name);
        seen[ids[k]] = false;
    }
    if (!n)
        fputs(" none", f);
    fputc('\n', f);
    free(ids);
}

void sbp_train_print_schedule(const sbp_train_program *p, const char *stage, FILE *f)
{
    print_header(p, f, stage);
    print_offload(p, f);
    bool *seen = calloc((size_t)p->n_bufs + 1, sizeof *seen);
    if (!seen) {
        fputs("(out of memory)\n", f);
        return;
    }
    for (int bi = 0; bi < p->n_blocks; bi++) {
        const tp_block *blk = p->blocks[bi];
        fprintf(f, "\nblock %s: %s\n", blk->name, blk->comment ? blk->comment : "");
        int li = 0;
        for (int i = 0; i < blk->n_insts; i++) {
            const tp_inst *in = &blk->insts[i];
            const tp_loop *l = li < blk->n_loops ? &blk->loops[li] : NULL;
            bool inside = l && l->first <= i;
            if (l && l->first == i) {
                int64_t n_chunks = l->step > 0 ? (l->stop - l->begin + l->step - 1) / l->step : 0;
                fprintf(f, "  loop %s: for b in [0, %lld), t0 = %lld, %lld, ... < %lld "
                           "(%lld chunk%s): rows [t0, t0+%lld) of each b {\n",
                        l->what ? l->what : "", (long long)l->batch, (long long)l->begin,
                        (long long)(l->begin + l->step), (long long)l->stop,
                        (long long)n_chunks, n_chunks == 1 ? "" : "s", (long long)l->len);
            }
            fprintf(f, "  %s%-16s", inside ? "  " : "", tp_kernel_table[in->k].name);
            for (int j = 0; j < tp_kernel_table[in->k].n_buf; j++)
                print_operand(p, in, j, f);
            int64_t xb = sp_inst_exchange_bytes(in);
            if (xb > 0) /* sequence parallelism: the all-to-all's size */
                fprintf(f, "   # %s%s%s: all-to-all of %lld bytes (%lld to each other rank)",
                        in->what ? in->what : "", in->node ? " " : "",
                        in->node ? in->node->name : "", (long long)xb,
                        (long long)(xb / p->seq_parallel));
            else if (in->node)
                fprintf(f, "   # %s %s", in->what ? in->what : "", in->node->name);
            else if (in->k == TP_K_OFFLOAD_OUT || in->k == TP_K_OFFLOAD_IN)
                fprintf(f, "   # %s: %lld bytes on the copy stream, then event %lld", in->what,
                        (long long)in->arg[0].i, (long long)in->arg[1].i);
            else if (in->k == TP_K_GRAD_IN)
                fprintf(f, "   # %s: accumulating, %lld bytes on the copy stream, then event "
                           "%lld; else zeros", in->what, (long long)in->arg[0].i,
                        (long long)in->arg[1].i);
            else if (in->k == TP_K_GRAD_WAIT)
                fprintf(f, "   # %s: accumulating, the compute stream waits for event %lld",
                        in->what, (long long)in->arg[0].i);
            else if (in->k == TP_K_OFFLOAD_WAIT)
                fprintf(f, "   # %s: the compute stream waits for event %lld", in->what,
                        (long long)in->arg[0].i);
            else if (in->what)
                fprintf(f, "   # %s", in->what);
            fputc('\n', f);
            if (l && l->end == i + 1) {
                print_accumulators(p, blk, l, seen, f);
                fputs("  }\n", f);
                li++;
            }
        }
    }
    free(seen);
}

/* ------------------------------------------------------------------ --dump-ir=plan */

typedef struct plan_key {
    size_t offset;
    int first, buf;
} plan_key;

static int cmp_plan_key(const void *a, const void *b)
{
    const plan_key *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    return (x->buf > y->buf) - (x->buf < y->buf);
}

void sbp_train_print_plan(const sbp_train_program *p, FILE *f)
{
    /* the planner's own lifetimes (memplan.h: a buffer's ranges of schedule positions) */
    const memplan *m = memplan_analyze(p);
    if (!m) {
        fputs("memory plan: cannot analyse the schedule (out of memory)\n", f);
        return;
    }
    fprintf(f, "memory plan: strategy %s, B=%lld T=%lld%s\n", sbp_strategy_name(p->strategy),
            (long long)p->batch, (long long)p->seq_len, p->bf16 ? ", bf16 activations" : "");
    fprintf(f, "  parameters %zu B + gradients %zu B + workspace %zu B = planned peak %zu B\n",
            p->param_elems * sizeof(float), sbp_train_device_grad_bytes(p), p->workspace_bytes,
            sbp_train_planned_peak(p));
    fprintf(f, "  liveness lower bound %zu B (at %s); the plan's workspace is %.3fx of it\n",
            m->lower_bound, m->lower_bound ? memplan_pos_name(m, m->lower_bound_pos) : "-",
            m->lower_bound ? (double)p->workspace_bytes / (double)m->lower_bound : 1.0);
    fprintf(f, "  schedule: %d positions (one per instruction, a loop's body once) in %d "
               "blocks:",
            m->n_pos, p->n_blocks);
    for (int b = 0; b < p->n_blocks; b++)
        fprintf(f, " %s %d..%d%s", p->blocks[b]->name, m->block_first[b],
                m->block_first[b + 1] - 1, b + 1 < p->n_blocks ? "," : "\n");
    fprintf(f, "  a lifetime is the positions where the buffer holds a value still needed "
               "(memplan.h); a buffer live over a loop holds it across the chunks\n");
    fprintf(f, "  %10s %10s  %-24s %s\n", "offset", "bytes", "live", "buffer");
    /* workspace buffers by offset, then by the start of their lifetime, then by id */
    plan_key *keys = calloc((size_t)p->n_bufs + 1, sizeof *keys);
    int n = 0;
    if (!keys) {
        fputs("  (out of memory)\n", f);
        return;
    }
    for (int b = 0; b < p->n_bufs; b++)
        if (p->bufs[b]->kind == TP_BUF_WS && !p->bufs[b]->span)
            keys[n++] = (plan_key){p->bufs[b]->offset, m->lv.hull[b].first, b};
    qsort(keys, (size_t)n, sizeof *keys, cmp_plan_key);
    for (int i = 0; i < n; i++) {
        const tp_buf *b = p->bufs[keys[i].buf];
        char live[64];
        int nr = m->lv.start[keys[i].buf + 1] - m->lv.start[keys[i].buf];
        const mp_interval *r = &m->lv.range[m->lv.start[keys[i].buf]];
        if (nr == 0 || r[0].first < 0)
            snprintf(live, sizeof live, "never");
        else if (nr == 1)
            snprintf(live, sizeof live, "%d..%d", r[0].first, r[0].last);
        else if (nr == 2)
            snprintf(live, sizeof live, "%d..%d, %d..%d", r[0].first, r[0].last, r[1].first,
                     r[1].last);
        else
            snprintf(live, sizeof live, "%d..%d, +%d ranges to %d", r[0].first, r[0].last, nr - 1,
                     r[nr - 1].last);
        char shape[160];
        int k = snprintf(shape, sizeof shape, "%s[", b->is_int ? "i32" : b->bf16 ? "bf16" : "f32");
        for (int d = 0; d < b->rank && k < (int)sizeof shape - 24; d++)
            k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", d ? "," : "",
                          (long long)b->dims[d]);
        snprintf(shape + k, sizeof shape - (size_t)k, "]");
        fprintf(f, "  %10zu %10zu  %-24s %s %s %s%s\n", b->offset,
                b->numel * tp_buf_elem_bytes(b), live, b->name, shape, b->what ? b->what : "",
                b->chunk_local ? " (one chunk)" : "");
    }
    free(keys);
}
