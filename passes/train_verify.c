/* train_verify.c — the training program's verifier (train.h: sbp_train_verify).
 *
 * What a builder bug would silently turn into wrong gradients, checked on the program itself:
 * operands and kernels well formed; chunk loops inside their blocks, disjoint; every chunk-loop
 * group (a chunk loop's full-chunk loop and its tail loop) covering the rows [0, seq) of every
 * sequence exactly once, by interval arithmetic on the loops' bounds (begin, stop, step, len);
 * every sliced operand inside its buffer at the last chunk; every chunk-local buffer large
 * enough for its loop's chunks; loop-only operand offsets and TP_ARG_T0 arguments only inside
 * loops. One diagnostic per problem; nothing is fixed.
 */
#include "train.h"

#include <stdlib.h>
#include <string.h>

typedef struct ivl {
    int64_t lo, hi;          /* rows [lo, hi) of one sequence */
    int block, loop;
} ivl;

static int cmp_ivl(const void *a, const void *b)
{
    const ivl *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : 0;
}

static int64_t n_iter(const tp_loop *l)
{
    return l->step > 0 && l->stop > l->begin ? (l->stop - l->begin + l->step - 1) / l->step : 0;
}

static const char *loop_what(const tp_loop *l) { return l->what ? l->what : "?"; }

/* The bounds of one loop on their own. */
static int check_loop(const sbp_train_program *p, const tp_block *blk, int li, ir_diag *d)
{
    const tp_loop *l = &blk->loops[li];
    int rc = IR_OK;
    if (l->first < 0 || l->end > blk->n_insts || l->first >= l->end)
        rc = ir_diag_error(d, "verify: %s: loop %d (%s) has body [%d, %d) outside its %d "
                              "instructions",
                           blk->name, li, loop_what(l), l->first, l->end, blk->n_insts);
    if (li > 0 && blk->loops[li - 1].end > l->first)
        rc = ir_diag_error(d, "verify: %s: loop %d (%s) overlaps the loop before it", blk->name,
                           li, loop_what(l));
    if (l->batch < 1 || l->seq < 1 || l->step < 1 || l->len < 1 || l->len > l->step ||
        l->begin < 0 || l->begin >= l->stop) {
        return ir_diag_error(d, "verify: %s: loop %d (%s) has bounds batch %lld seq %lld, t0 "
                                "from %lld to %lld step %lld, len %lld",
                             blk->name, li, loop_what(l), (long long)l->batch, (long long)l->seq,
                             (long long)l->begin, (long long)l->stop, (long long)l->step,
                             (long long)l->len);
    }
    int64_t last_t0 = l->begin + (n_iter(l) - 1) * l->step;
    if (last_t0 + l->len > l->seq)
        rc = ir_diag_error(d, "verify: %s: loop %d (%s): its last chunk [%lld, %lld) runs past "
                              "the sequence of %lld rows",
                           blk->name, li, loop_what(l), (long long)last_t0,
                           (long long)(last_t0 + l->len), (long long)l->seq);
    if (l->batch * l->seq != p->batch * p->seq_len ||
        !((l->batch == p->batch && l->seq == p->seq_len) || l->batch == 1))
        rc = ir_diag_error(d, "verify: %s: loop %d (%s): its rows [%lld, %lld] are not the "
                              "step's [B=%lld, T=%lld] token rows",
                           blk->name, li, loop_what(l), (long long)l->batch, (long long)l->seq,
                           (long long)p->batch, (long long)p->seq_len);
    /* the body's operands: slices inside their buffers, chunk-local buffers large enough */
    int64_t r0_max = (l->batch - 1) * l->seq + last_t0;
    for (int i = l->first; i < l->end && i < blk->n_insts && i >= 0; i++) {
        const tp_inst *in = &blk->insts[i];
        for (int j = 0; j < tp_kernel_table[in->k].n_buf; j++) {
            if (in->buf[j] < 0 || in->buf[j] >= p->n_bufs)
                continue;
            const tp_buf *b = p->bufs[in->buf[j]];
            const tp_off *o = &in->off[j];
            int64_t end = 0;
            if (o->per_row)
                end = o->per_row * (r0_max + l->len) + o->per_batch * (l->batch - 1);
            else if (o->per_batch)
                end = o->per_batch * l->batch;
            if ((o->per_row < 0 || o->per_batch < 0 || end > (int64_t)b->numel) && !b->span)
                rc = ir_diag_error(d, "verify: %s: instruction %d (%s) of loop %d (%s): operand "
                                      "%d reaches element %lld of %s, which has %zu",
                                   blk->name, i, tp_kernel_table[in->k].name, li, loop_what(l),
                                   j, (long long)end, b->name, b->numel);
            if (b->chunk_local && b->rows > 0 && b->rows < l->len)
                rc = ir_diag_error(d, "verify: %s: loop %d (%s) has chunks of %lld rows, but the "
                                      "chunk-local %s holds %lld",
                                   blk->name, li, loop_what(l), (long long)l->len, b->name,
                                   (long long)b->rows);
        }
    }
    return rc;
}

/* The loops of each group cover every row of a sequence exactly once. */
static int check_groups(const sbp_train_program *p, ir_diag *d)
{
    int n = 0, max_group = -1;
    for (int bi = 0; bi < p->n_blocks; bi++)
        for (int li = 0; li < p->blocks[bi]->n_loops; li++) {
            const tp_loop *l = &p->blocks[bi]->loops[li];
            n += (int)(n_iter(l) < (1 << 26) ? n_iter(l) : 0);
            max_group = l->group > max_group ? l->group : max_group;
        }
    if (max_group < 0)
        return IR_OK;
    ivl *v = malloc(sizeof *v * ((size_t)n + 1));
    if (!v)
        return ir_diag_error(d, "out of memory");
    int rc = IR_OK;
    for (int g = 0; g <= max_group; g++) {
        int m = 0;
        int64_t seq = -1, batch = -1;
        const char *name = NULL;
        for (int bi = 0; bi < p->n_blocks; bi++)
            for (int li = 0; li < p->blocks[bi]->n_loops; li++) {
                const tp_loop *l = &p->blocks[bi]->loops[li];
                if (l->group != g || n_iter(l) >= (1 << 26))
                    continue;
                if (seq >= 0 && (l->seq != seq || l->batch != batch))
                    rc = ir_diag_error(d, "verify: chunk loop '%s': its loops disagree on the "
                                          "rows ([%lld, %lld] and [%lld, %lld])",
                                       loop_what(l), (long long)batch, (long long)seq,
                                       (long long)l->batch, (long long)l->seq);
                seq = l->seq;
                batch = l->batch;
                name = name ? name : loop_what(l);
                for (int64_t t0 = l->begin; t0 < l->stop; t0 += l->step)
                    v[m++] = (ivl){t0, t0 + l->len, bi, li};
            }
        if (m == 0)
            continue;
        qsort(v, (size_t)m, sizeof *v, cmp_ivl);
        int64_t at = 0;
        for (int i = 0; i < m; i++) {
            if (v[i].lo > at) {
                rc = ir_diag_error(d, "verify: chunk loop '%s' misses rows [%lld, %lld) of each "
                                      "sequence",
                                   name, (long long)at, (long long)v[i].lo);
            } else if (v[i].lo < at) {
                rc = ir_diag_error(d, "verify: chunk loop '%s' runs rows [%lld, %lld) of each "
                                      "sequence twice",
                                   name, (long long)v[i].lo,
                                   (long long)(at < v[i].hi ? at : v[i].hi));
            }
            at = v[i].hi > at ? v[i].hi : at;
        }
        if (at != seq)
            rc = ir_diag_error(d, "verify: chunk loop '%s' covers rows [0, %lld) of each "
                                  "sequence, not [0, %lld)",
                               name, (long long)at, (long long)seq);
    }
    free(v);
    return rc;
}

int sbp_train_verify(const sbp_train_program *p, ir_diag *d)
{
    int rc = IR_OK;
    for (int bi = 0; bi < p->n_blocks; bi++) {
        const tp_block *blk = p->blocks[bi];
        int li = 0;
        for (int i = 0; i < blk->n_insts; i++) {
            const tp_inst *in = &blk->insts[i];
            if ((int)in->k < 0 || in->k >= TP_K_COUNT) {
                rc = ir_diag_error(d, "verify: %s: instruction %d has no kernel", blk->name, i);
                continue;
            }
            const tp_kernel_info *ki = &tp_kernel_table[in->k];
            while (li < blk->n_loops && blk->loops[li].end <= i)
                li++;
            bool in_loop = li < blk->n_loops && blk->loops[li].first <= i;
            for (int j = 0; j < TP_MAX_BUFS; j++) {
                int b = in->buf[j];
                if (b < -1 || b >= p->n_bufs || (j >= ki->n_buf && b != -1))
                    rc = ir_diag_error(d, "verify: %s: instruction %d (%s): operand %d names "
                                          "buffer %d",
                                       blk->name, i, ki->name, j, b);
                if (!in_loop && (in->off[j].per_row || in->off[j].per_batch))
                    rc = ir_diag_error(d, "verify: %s: instruction %d (%s): operand %d is a "
                                          "chunk's slice outside a chunk loop",
                                       blk->name, i, ki->name, j);
                if (j < ki->n_buf && b == -1 && (in->off[j].per_row || in->off[j].per_batch))
                    rc = ir_diag_error(d, "verify: %s: instruction %d (%s): NULL operand %d has "
                                          "an offset",
                                       blk->name, i, ki->name, j);
            }
            for (int j = 0; j < ki->n_arg; j++)
                if (in->arg[j].kind == TP_ARG_T0 && !in_loop)
                    rc = ir_diag_error(d, "verify: %s: instruction %d (%s): argument %d is a "
                                          "chunk start outside a chunk loop",
                                       blk->name, i, ki->name, j);
        }
        for (int l = 0; l < blk->n_loops; l++)
            if (check_loop(p, blk, l, d) != IR_OK)
                rc = IR_ERR;
    }
    if (check_groups(p, d) != IR_OK)
        rc = IR_ERR;
    return rc;
}
