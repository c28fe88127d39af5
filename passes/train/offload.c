/* offload.c — the layer checkpoints in host memory between the forward and the backward
 * (sbpc --offload checkpoints; train.h: tp_transfer).
 *
 * requires: the strategy's program (stream or checkpoint), after the precision pass (a
 * transfer copies the buffer as stored: 2 bytes an element when it is bf16).
 * produces: OFFLOAD_OUT / OFFLOAD_IN / OFFLOAD_WAIT instructions (train_kernels.def), a host
 * copy (TP_BUF_HOST) per offloaded buffer and p->transfers; the memory plan (plan.c) then sees
 * the device buffer dead between the wait after its way out and the copy back, so its bytes go
 * to other buffers meanwhile.
 *
 * Which buffers. A workspace buffer that holds every token's rows, is no gradient, lives across
 * segments, and whose accesses leave a gap, from one block to a later block that is not the
 * next one, ending in a read: the value it held before the gap is needed after it. Those are
 * the checkpoints: a layer's input, read by the layer's forward and again by its backward's
 * recomputation, with the rest of the forward, the head and the later layers' backwards in
 * between. Values rewritten after the gap (stream's K/V, recomputed once per layer) are dead
 * in it and need no copy; the head's input, read by the head right after the forward, has no
 * block in between.
 *
 * When. Out: the copy starts right after the buffer's last write before the gap (outside any
 * chunk loop), so it runs while the rest of the layer reads the buffer; the wait comes after
 * its last read before the gap, the point from which the plan may give its bytes away. Back:
 * the copy starts at the beginning of the block before the one that reads it (for a layer's
 * input: at the start of the next layer's backward, one layer ahead) and the wait comes just
 * before the first read (before the chunk loop holding it). So each transfer has a block of
 * compute to hide behind, and at most two checkpoints are on the device in the backward: the
 * one being read and the one arriving.
 *
 * Exactness: the same kernels run on the same values (a copy out and back is bit for bit), so
 * an offloaded step computes what the plain one does.
 *
 * Gradients (sbpc --offload optimizer: the caller's gradient block is host memory). Each trained
 * parameter's gradient becomes a workspace buffer of its own, which the plan places like any
 * other, and a transfer (p->grad_transfers) to the parameter's place in the host block:
 *   - GRAD_IN at the start of the block before the one of its first contribution (one layer
 *     ahead in the backward; for the first backward block's, after its gradient zeroing) fills
 *     it with what earlier micro-batches accumulated (a copy from the host block, when the step
 *     accumulates) or zeros, and GRAD_WAIT waits for the copy just before the chunk loop of
 *     the first contribution;
 *   - OFFLOAD_OUT right after its last contribution (its block's chunk loop) sends it to the
 *     host block, and its wait, which frees the bytes, comes at the end of the next block, so
 *     that the copy runs behind a layer's backward.
 * So the device holds about three layers' gradients (the one being accumulated, the one
 * arriving and the one leaving) instead of the whole block, and the contributions add up in the
 * order they would in the gradient block: the gradients are bit for bit the plain step's.
 */
#include <stdlib.h>
#include <string.h>

#include "memplan.h"
#include "train_internal.h"

/* One instruction to insert before instruction `at` of block `block` (at == n_insts: at the
 * end); among those at one place, lower `order` first, then earlier `seq`. */
typedef struct ins {
    int block, at, order, seq;
    tp_inst inst;
    int *slot; /* its transfer's field that records where it landed */
} ins;

static int cmp_ins(const void *x, const void *y)
{
    const ins *a = x, *b = y;
    if (a->block != b->block)
        return a->block < b->block ? -1 : 1;
    if (a->at != b->at)
        return a->at < b->at ? -1 : 1;
    if (a->order != b->order)
        return a->order < b->order ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* The insertions so far. */
typedef struct ins_list {
    ins *v;
    int n, cap;
} ins_list;

static int push(ins_list *l, int block, int at, int order, tp_inst inst, int *slot)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        ins *g = realloc(l->v, (size_t)cap * sizeof *g);
        if (!g)
            return -1;
        l->v = g;
        l->cap = cap;
    }
    l->v[l->n] = (ins){block, at, order, l->n, inst, slot};
    l->n++;
    return 0;
}

/* The first index after instruction i outside any chunk loop (i's loop's end, or i + 1). */
static int after_loops(const tp_block *blk, int i)
{
    for (int l = 0; l < blk->n_loops; l++)
        if (blk->loops[l].first <= i && i < blk->loops[l].end)
            return blk->loops[l].end;
    return i + 1;
}

/* The index of the first instruction before i outside any chunk loop (i's loop's first). */
static int before_loops(const tp_block *blk, int i)
{
    for (int l = 0; l < blk->n_loops; l++)
        if (blk->loops[l].first <= i && i < blk->loops[l].end)
            return blk->loops[l].first;
    return i;
}

typedef struct acc {
    int block, inst;
    mp_role role;
} acc;

/* The accesses of buffer b in program order, into *out ([n]); -1 when out of memory. */
static int accesses(const sbp_train_program *p, int b, acc **out)
{
    int n = 0, cap = 0;
    acc *a = NULL;
    size_t bytes = p->bufs[b]->numel * 4; /* the roles' byte counts are in fp32 units */
    for (int bi = 0; bi < p->n_blocks; bi++)
        for (int i = 0; i < p->blocks[bi]->n_insts; i++) {
            const tp_inst *in = &p->blocks[bi]->insts[i];
            for (int j = 0; j < tp_kernel_table[in->k].n_buf; j++) {
                if (in->buf[j] != b)
                    continue;
                if (n == cap) {
                    cap = cap ? 2 * cap : 16;
                    acc *g = realloc(a, (size_t)cap * sizeof *a);
                    if (!g) {
                        free(a);
                        return -1;
                    }
                    a = g;
                }
                a[n++] = (acc){bi, i, memplan_operand_role(in, j, bytes)};
            }
        }
    *out = a;
    return n;
}

/* Whether b is a candidate and, if so, where its gap is: the accesses g (last before) and
 * g + 1 (first after), the longest gap over the blocks that ends in a read. */
static bool find_gap(const sbp_train_program *p, int b, const acc *a, int n, int *g)
{
    const tp_buf *bb = p->bufs[b];
    /* every token's rows: stream records them (rows); checkpoint's buffers have the shape */
    bool token_rows = bb->rows > 0 ? bb->rows == p->batch * p->seq_len
                                   : bb->rank >= 2 && !bb->swapped && bb->dims[0] == p->batch &&
                                         bb->dims[1] == p->seq_len;
    if (bb->kind != TP_BUF_WS || bb->span || bb->is_grad || bb->chunk_local ||
        bb->region != TP_REGION_PERSIST || !token_rows)
        return false;
    int best = -1, width = 1;
    for (int k = 0; k + 1 < n; k++)
        if (a[k + 1].role == MP_R && a[k + 1].block - a[k].block > width) {
            width = a[k + 1].block - a[k].block;
            best = k;
        }
    *g = best;
    return best >= 0;
}

static tp_inst mk(tp_kernel k, int b0, int b1, size_t bytes, int event, const char *what)
{
    tp_inst in = {.k = k, .what = what};
    for (int j = 0; j < TP_MAX_BUFS; j++)
        in.buf[j] = -1;
    in.buf[0] = b0;
    in.buf[1] = b1;
    if (k == TP_K_OFFLOAD_WAIT || k == TP_K_GRAD_WAIT)
        in.arg[0] = (tp_arg){.kind = TP_ARG_INT, .i = event};
    else {
        in.arg[0] = (tp_arg){.kind = TP_ARG_INT, .i = (int64_t)bytes};
        in.arg[1] = (tp_arg){.kind = TP_ARG_INT, .i = event};
    }
    return in;
}

/* Inserts the sorted insertions of block bi (list[lo, hi)) and records where each landed. */
static int apply_block(sbp_train_program *p, ir_arena *arena, int bi, ins *list, int lo, int hi)
{
    tp_block *blk = p->blocks[bi];
    int n = blk->n_insts + (hi - lo);
    tp_inst *out = ir_arena_alloc(arena, (size_t)n * sizeof *out);
    if (!out)
        return -1;
    int o = 0, k = lo;
    for (int i = 0; i <= blk->n_insts; i++) {
        for (; k < hi && list[k].at == i; k++) {
            *list[k].slot = o;
            out[o++] = list[k].inst;
        }
        if (i < blk->n_insts)
            out[o++] = blk->insts[i];
    }
    /* loops: an insertion at a loop's first index goes before it, one at its end after it */
    for (int l = 0; l < blk->n_loops; l++) {
        int f = blk->loops[l].first, e = blk->loops[l].end, before_f = 0, before_e = 0;
        for (int j = lo; j < hi; j++) {
            before_f += list[j].at <= f;
            before_e += list[j].at < e;
        }
        blk->loops[l].first = f + before_f;
        blk->loops[l].end = e + before_e;
    }
    blk->insts = out;
    blk->n_insts = blk->cap_insts = n;
    return 0;
}

/* A new buffer of the program, a copy of buffer b's description; its id, -1 out of memory. */
static int buf_copy(sbp_train_program *p, ir_arena *arena, int b)
{
    if (p->n_bufs == p->cap_bufs) {
        int cap = p->cap_bufs ? 2 * p->cap_bufs : 64;
        tp_buf **g = ir_arena_alloc(arena, (size_t)cap * sizeof *g);
        if (!g)
            return -1;
        memcpy(g, p->bufs, (size_t)p->n_bufs * sizeof *g);
        p->bufs = g;
        p->cap_bufs = cap;
    }
    tp_buf *h = ir_arena_alloc(arena, sizeof *h);
    if (!h)
        return -1;
    *h = *p->bufs[b];
    h->id = p->n_bufs;
    p->bufs[p->n_bufs++] = h;
    return h->id;
}

/* A TP_BUF_HOST copy of workspace buffer b at host offset *off (advanced past it). */
static int host_copy(sbp_train_program *p, ir_arena *arena, int b, size_t *off)
{
    const tp_buf *src = p->bufs[b];
    int h = buf_copy(p, arena, b);
    if (h < 0)
        return -1;
    tp_buf *hb = p->bufs[h];
    hb->kind = TP_BUF_HOST;
    hb->name = ir_arena_printf(arena, "h_%s", src->name);
    hb->what = "its host copy";
    hb->region = TP_REGION_PERSIST;
    hb->offset = *off;
    *off += (src->numel * tp_buf_elem_bytes(src) + MEMPLAN_ALIGN - 1) / MEMPLAN_ALIGN *
            MEMPLAN_ALIGN;
    return h;
}

/* The layer checkpoints' transfers (the file's header): into p->transfers and the list. */
static int plan_checkpoints(sbp_train_program *p, ir_arena *arena, ins_list *list, ir_diag *d)
{
    int nb = p->n_bufs;
    p->transfers = ir_arena_alloc(arena, ((size_t)nb + 1) * sizeof *p->transfers);
    if (!p->transfers)
        return ir_diag_error(d, "out of memory");
    p->n_transfers = 0;
    size_t host_off = 0;
    for (int b = 0; b < nb; b++) {
        acc *a = NULL;
        int n = accesses(p, b, &a), g = -1;
        if (n < 0)
            return ir_diag_error(d, "out of memory");
        if (!find_gap(p, b, a, n, &g)) {
            free(a);
            continue;
        }
        if (2 * p->n_transfers + 1 >= TP_COPY_EVENTS) {
            free(a);
            return ir_diag_error(d, "--offload checkpoints: more than %d buffers to offload",
                                 TP_COPY_EVENTS / 2);
        }
        int w = g; /* the last write before the gap (the buffer is written before it is read) */
        while (w > 0 && a[w].role == MP_R)
            w--;
        int t = p->n_transfers++, h = host_copy(p, arena, b, &host_off);
        if (h < 0) {
            free(a);
            return ir_diag_error(d, "out of memory");
        }
        size_t bytes = p->bufs[b]->numel * tp_buf_elem_bytes(p->bufs[b]);
        tp_transfer *tr = &p->transfers[t];
        *tr = (tp_transfer){.buf = b, .host = h, .bytes = bytes, .out_event = 2 * t,
                            .in_event = 2 * t + 1};
        const tp_block *wb = p->blocks[a[w].block], *lb = p->blocks[a[g].block],
                       *rb = p->blocks[a[g + 1].block];
        tr->out_block = a[w].block;
        tr->out_wait_block = a[g].block;
        tr->in_block = a[g + 1].block - 1;
        tr->in_wait_block = a[g + 1].block;
        int out_at = after_loops(wb, a[w].inst), wait_at = after_loops(lb, a[g].inst);
        if (tr->out_wait_block == tr->out_block && wait_at < out_at)
            wait_at = out_at; /* never before its copy */
        int rc = push(list, tr->out_block, out_at, 0,
                      mk(TP_K_OFFLOAD_OUT, h, b, bytes, tr->out_event, "offload out"),
                      &tr->out_inst) ||
                 push(list, tr->out_wait_block, wait_at, 2,
                      mk(TP_K_OFFLOAD_WAIT, b, -1, 0, tr->out_event, "offload out"),
                      &tr->out_wait_inst) ||
                 push(list, tr->in_block, 0, 1,
                      mk(TP_K_OFFLOAD_IN, b, h, bytes, tr->in_event, "offload in"),
                      &tr->in_inst) ||
                 push(list, tr->in_wait_block, before_loops(rb, a[g + 1].inst), 3,
                      mk(TP_K_OFFLOAD_WAIT, b, -1, 0, tr->in_event, "offload in"),
                      &tr->in_wait_inst);
        free(a);
        if (rc)
            return ir_diag_error(d, "out of memory");
    }
    p->host_bytes = host_off;
    return IR_OK;
}

/* Whether instruction i of block bi zeroes the persistent region's gradients (the backward's
 * first span zero, which the planner turns into per-buffer zeroing: plan.c). */
static bool persist_zero(const sbp_train_program *p, int bi, int i)
{
    const tp_inst *in = &p->blocks[bi]->insts[i];
    return in->k == TP_K_MEMSET_ZERO && in->buf[0] >= 0 && p->bufs[in->buf[0]]->span &&
           p->bufs[in->buf[0]]->region == TP_REGION_PERSIST;
}

/* The gradients' transfers (the file's header): each trained parameter's gradient moves to a
 * workspace buffer of its own, the gradient block's buffer becoming its host side; into
 * p->grad_transfers and the list, events from first_event. */
static int plan_grads(sbp_train_program *p, ir_arena *arena, ins_list *list, int first_event,
                      ir_diag *d)
{
    int nb = p->n_bufs;
    int *dev = malloc(((size_t)nb + 1) * sizeof *dev); /* by gradient block buffer */
    p->grad_transfers = ir_arena_alloc(arena, ((size_t)p->n_params + 1) *
                                                  sizeof *p->grad_transfers);
    if (!dev || !p->grad_transfers) {
        free(dev);
        return ir_diag_error(d, "out of memory");
    }
    for (int b = 0; b < nb; b++)
        dev[b] = -1;
    for (int i = 0; i < p->n_params; i++) {
        const tp_param *q = &p->params[i];
        int gb = q->grad;
        if (q->tied_to >= 0 || !q->trainable || gb < 0 || p->bufs[gb]->kind != TP_BUF_GRAD ||
            dev[gb] >= 0)
            continue;
        int w = buf_copy(p, arena, gb);
        if (w < 0) {
            free(dev);
            return ir_diag_error(d, "out of memory");
        }
        tp_buf *wb = p->bufs[w], *hb = p->bufs[gb];
        wb->kind = TP_BUF_WS;
        wb->region = TP_REGION_PERSIST;
        wb->offset = 0;
        wb->what = "parameter gradient (streamed to the host)";
        hb->name = ir_arena_printf(arena, "h_%s", hb->name);
        hb->what = "its place in the host gradient block";
        dev[gb] = w;
    }
    for (int bi = 0; bi < p->n_blocks; bi++)
        for (int i = 0; i < p->blocks[bi]->n_insts; i++) {
            tp_inst *in = &p->blocks[bi]->insts[i];
            for (int j = 0; j < tp_kernel_table[in->k].n_buf; j++)
                if (in->buf[j] >= 0 && in->buf[j] < nb && dev[in->buf[j]] >= 0)
                    in->buf[j] = dev[in->buf[j]];
        }
    p->n_grad_transfers = 0;
    for (int gb = 0; gb < nb; gb++) {
        int w = dev[gb];
        if (w < 0)
            continue;
        acc *a = NULL;
        int n = accesses(p, w, &a);
        if (n < 0) {
            free(dev);
            return ir_diag_error(d, "out of memory");
        }
        if (n == 0) {
            free(a);
            continue;
        }
        int t = p->n_grad_transfers++, ev = first_event + 2 * t;
        if (ev + 1 >= TP_COPY_EVENTS) {
            free(a);
            free(dev);
            return ir_diag_error(d, "--offload optimizer: more than %d gradients and "
                                 "checkpoints to move", TP_COPY_EVENTS / 2);
        }
        size_t bytes = p->bufs[w]->numel * sizeof(float);
        tp_transfer *tr = &p->grad_transfers[t];
        *tr = (tp_transfer){.buf = w, .host = gb, .bytes = bytes, .in_event = ev,
                            .out_event = ev + 1};
        const acc *first = &a[0], *last = &a[n - 1];
        /* in: at the start of the block before the first contribution's, unless the backward's
         * gradient zeroing comes in between (it would zero what came in): right after it */
        int in_block = first->block > 0 ? first->block - 1 : 0, in_at = 0;
        for (int bi = in_block; bi <= first->block; bi++)
            for (int i = 0; i < (bi == first->block ? first->inst : p->blocks[bi]->n_insts); i++)
                if (persist_zero(p, bi, i)) {
                    in_block = bi;
                    in_at = after_loops(p->blocks[bi], i);
                }
        int wait_at = before_loops(p->blocks[first->block], first->inst);
        if (in_block == first->block && wait_at < in_at) {
            free(a);
            free(dev);
            return ir_diag_error(d, "--offload optimizer: the gradient '%s' is accumulated in "
                                 "the chunk loop that zeroes the backward's gradients",
                                 p->bufs[w]->name);
        }
        tr->in_block = in_block;
        tr->in_wait_block = first->block;
        /* out: after its last contribution; waited for at the end of the next block */
        tr->out_block = last->block;
        tr->out_wait_block = last->block + 1 < p->n_blocks ? last->block + 1 : last->block;
        int rc = push(list, tr->in_block, in_at, 1,
                      mk(TP_K_GRAD_IN, w, gb, bytes, tr->in_event, "gradient in"),
                      &tr->in_inst) ||
                 push(list, tr->in_wait_block, wait_at, 3,
                      mk(TP_K_GRAD_WAIT, w, -1, 0, tr->in_event, "gradient in"),
                      &tr->in_wait_inst) ||
                 push(list, tr->out_block, after_loops(p->blocks[last->block], last->inst), 0,
                      mk(TP_K_OFFLOAD_OUT, gb, w, bytes, tr->out_event, "gradient out"),
                      &tr->out_inst) ||
                 push(list, tr->out_wait_block, p->blocks[tr->out_wait_block]->n_insts, 2,
                      mk(TP_K_OFFLOAD_WAIT, w, -1, 0, tr->out_event, "gradient out"),
                      &tr->out_wait_inst);
        free(a);
        if (rc) {
            free(dev);
            return ir_diag_error(d, "out of memory");
        }
    }
    free(dev);
    p->grads_on_host = true;
    return IR_OK;
}

int sbp_train_offload(sbp_train_program *p, bool checkpoints, bool grads, ir_diag *d)
{
    ir_arena *arena = p->g->arena;
    if (checkpoints && p->strategy == SBP_STRATEGY_STORE)
        return ir_diag_error(d, "--offload checkpoints: the store strategy keeps every "
                             "activation and has no layer checkpoints (use stream or "
                             "checkpoint)");
    ins_list list = {0};
    /* both sets of positions are taken on the program as it is, then inserted at once (the
     * transfers record where their instructions land) */
    if ((checkpoints && plan_checkpoints(p, arena, &list, d) != IR_OK) ||
        (grads && plan_grads(p, arena, &list, 2 * p->n_transfers, d) != IR_OK)) {
        free(list.v);
        return IR_ERR;
    }
    qsort(list.v, (size_t)list.n, sizeof *list.v, cmp_ins);
    for (int lo = 0, hi; lo < list.n; lo = hi) {
        for (hi = lo; hi < list.n && list.v[hi].block == list.v[lo].block; hi++)
            ;
        if (apply_block(p, arena, list.v[lo].block, list.v, lo, hi)) {
            free(list.v);
            return ir_diag_error(d, "out of memory");
        }
    }
    free(list.v);
    return IR_OK;
}
