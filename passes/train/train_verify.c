/* train_verify.c — the training program's verifier (train.h: sbp_train_verify).
 *
 * What a builder bug would silently turn into wrong gradients, checked on the program itself:
 * operands and kernels well formed; chunk loops inside their blocks, disjoint; every chunk-loop
 * group (a chunk loop's full-chunk loop and its tail loop) covering the rows [0, seq) of every
 * sequence exactly once, by interval arithmetic on the loops' bounds (begin, stop, step, len);
 * every sliced operand inside its buffer at the last chunk; every chunk-local buffer large
 * enough for its loop's chunks; loop-only operand offsets and TP_ARG_T0 arguments only inside
 * loops. One diagnostic per problem; nothing is fixed.
 *
 * Limits (sbp_train_verify, then sbp_train_check_totals after the plan): what the program asks
 * of a target must be something the target can do, or the emitted C silently truncates it. A
 * buffer larger than any address space (IR_MAX_TENSOR_BYTES) is refused with its size, and so
 * is a scalar argument the runtime takes as C `int` (runtime/sbprt.h) whose value does not fit:
 * a copy_cols leading dimension of 2^46 elements would be printed into the call and wrap. These
 * stop at the first problem, naming the kernel, the node and the value: the rest are nearly
 * always the same oversized value seen again by the next instruction.
 */
#include "train.h"

#include "checked.h"

#include <limits.h>

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

/* The C type of each scalar argument of each kernel, as runtime/sbprt.h declares the function
 * the CALL column of train_kernels.def names (#0, #1, ...; the bf16 variants take the same):
 *   i  int, or const int * (an `(const int[]){...}` of ints: every element is an int)
 *   z  size_t (a flat element or byte count)
 *   f  float
 *   e  an enum constant (an expression)
 * One string per kernel, of length NARG (sbp_train_verify checks it). */
static const char *const arg_types[TP_K_COUNT] = {
    [TP_K_MEMSET_ZERO] = "z",
    [TP_K_COPY] = "z",
    [TP_K_GEMM] = "iiiiiff",
    [TP_K_BIAS_ADD] = "ii",
    [TP_K_BIAS_BACKWARD] = "ii",
    [TP_K_ADD] = "z",
    [TP_K_ACCUMULATE] = "z",
    [TP_K_SCALE] = "zf",
    [TP_K_SCALE_ACCUMULATE] = "zf",
    [TP_K_DIV_SCALAR] = "zf",
    [TP_K_DIV_SCALAR_ACCUMULATE] = "zf",
    [TP_K_EMBEDDING_FWD] = "iii",
    [TP_K_EMBEDDING_BWD] = "iii",
    [TP_K_LAYERNORM_FWD] = "iif",
    [TP_K_LAYERNORM_BWD] = "ii",
    [TP_K_RMSNORM_FWD] = "iif",
    [TP_K_RMSNORM_BWD] = "ii",
    [TP_K_GELU_TANH_FWD] = "z",
    [TP_K_GELU_TANH_BWD] = "z",
    [TP_K_GELU_ERF_FWD] = "z",
    [TP_K_GELU_ERF_BWD] = "z",
    [TP_K_SILU_FWD] = "z",
    [TP_K_SILU_BWD] = "z",
    [TP_K_RELU_FWD] = "z",
    [TP_K_RELU_BWD] = "z",
    [TP_K_TANH_FWD] = "z",
    [TP_K_TANH_BWD] = "z",
    [TP_K_SIGMOID_FWD] = "z",
    [TP_K_SIGMOID_BWD] = "z",
    [TP_K_MOE_FWD] = "iiiiii",
    [TP_K_MOE_BWD] = "iiiiiif",
    [TP_K_MOE_LORA_FWD] = "iiiiiiif",
    [TP_K_MOE_LORA_BWD] = "iiiiiifif",
    [TP_K_SWIGLU_FWD] = "z",
    [TP_K_SWIGLU_BWD] = "z",
    [TP_K_ROPE_FWD] = "iiiii",
    [TP_K_ROPE_BWD] = "iiiii",
    [TP_K_ATTENTION_FWD] = "iiiiiiifif",
    [TP_K_ATTENTION_BWD] = "iiiiiiifif",
    [TP_K_ATTENTION_PACKED_FWD] = "iiiiiiifif",
    [TP_K_ATTENTION_PACKED_BWD] = "iiiiiiifif",
    [TP_K_DOC_STARTS] = "ii",
    [TP_K_DOC_POSITIONS] = "ii",
    [TP_K_SP_POSITIONS] = "iii",
    [TP_K_SP_GATHER_ROWS] = "iii",
    [TP_K_SP_DOC_POSITIONS] = "iii",
    [TP_K_SP_KV_GATHER] = "iiiiii",
    [TP_K_SP_KV_SCATTER] = "iiiiii",
    [TP_K_SP_ATTENTION_FWD] = "iiiiiiififi",
    [TP_K_SP_ATTENTION_BWD] = "iiiiiiififi",
    [TP_K_CROSS_ENTROPY] = "iif",
    [TP_K_PERMUTE_FWD] = "iii",
    [TP_K_PERMUTE_BWD] = "iii",
    [TP_K_COPY_COLS] = "iiiiiii",
    [TP_K_BROADCAST_FWD] = "eiiii",
    [TP_K_BROADCAST_BWD] = "eiiii",
    [TP_K_LOGPROB_FWD] = "ii",
    [TP_K_LOGPROB_GRAD] = "ii",
    [TP_K_GRPO_LOSS] = "iiiff",
    [TP_K_GRPO_WEIGHTS] = "",
    [TP_K_DPO_COEF] = "",
    [TP_K_GRPO_DOC_LOSS] = "iiff",
    [TP_K_GRPO_DOC_WEIGHTS] = "",
    [TP_K_OFFLOAD_OUT] = "zi",
    [TP_K_OFFLOAD_IN] = "zi",
    [TP_K_OFFLOAD_WAIT] = "i",
    [TP_K_GRAD_IN] = "zi",
    [TP_K_GRAD_WAIT] = "i",
};

/* The runtime function a kernel calls ("sbprt_copy_cols"), from its CALL template. */
static const char *kernel_fn(const tp_kernel_info *ki, char *buf, size_t n)
{
    const char *c = ki->call, *q = strstr(c, "? "); /* "(args->... ? call : ...)" */
    if (*c == '(' && q)
        c = q + 2;
    size_t len = strcspn(c, "(");
    snprintf(buf, n, "%.*s", (int)(len < n ? len : n - 1), c);
    return buf;
}

/* The largest value argument j of `in` takes (a chunk start adds the loop's last t0), and
 * whether it is an integer at all. */
static bool arg_extreme(const tp_inst *in, int j, const tp_loop *l, int64_t *lo, int64_t *hi)
{
    const tp_arg *a = &in->arg[j];
    switch (a->kind) {
    case TP_ARG_INT:
        *lo = *hi = a->i;
        return true;
    case TP_ARG_T0:
        *lo = a->i;
        *hi = ck_add_sat_i64(a->i, l && l->stop > 0 ? l->stop - 1 : 0);
        return true;
    case TP_ARG_INTS:
        *lo = INT64_MAX;
        *hi = INT64_MIN;
        for (int e = 0; e < a->n && a->ints; e++) {
            *lo = a->ints[e] < *lo ? a->ints[e] : *lo;
            *hi = a->ints[e] > *hi ? a->ints[e] : *hi;
        }
        return a->n > 0 && a->ints;
    default:
        return false;
    }
}

/* The first scalar argument of instruction i that does not fit the C type the runtime takes;
 * IR_OK when there is none. */
static int check_args(const sbp_train_program *p, const tp_block *blk, int i, const tp_loop *l,
                      ir_diag *d)
{
    (void)p;
    const tp_inst *in = &blk->insts[i];
    const tp_kernel_info *ki = &tp_kernel_table[in->k];
    const char *ty = arg_types[in->k];
    char fn[64];
    if (!ty || (int)strlen(ty) != ki->n_arg)
        return ir_diag_error(d, "verify: kernel %s: the verifier's argument types '%s' do not "
                                "match its %d arguments (passes/train/train_verify.c: arg_types)",
                             ki->name, ty ? ty : "", ki->n_arg);
    for (int j = 0; j < ki->n_arg; j++) {
        int64_t lo, hi;
        if ((ty[j] != 'i' && ty[j] != 'z') || !arg_extreme(in, j, l, &lo, &hi))
            continue;
        bool fits = ty[j] == 'i' ? lo >= INT_MIN && hi <= INT_MAX : lo >= 0;
        if (fits)
            continue;
        int64_t bad = ty[j] == 'i' && hi > INT_MAX ? hi : lo;
        return ir_diag_add(d, IR_SEV_ERROR, in->node ? in->node->name : NULL,
                           in->node ? in->node->op_type : NULL,
                           "kernel %s (%s, block %s): scalar argument %d is %lld, %s: the sizes of "
                           "this node are more than the runtime's kernels can index",
                           kernel_fn(ki, fn, sizeof fn), in->what ? in->what : ki->name,
                           blk->name, j, (long long)bad,
                           ty[j] == 'i' ? "outside what its C int parameter holds "
                                          "([-2147483648, 2147483647])"
                                        : "negative for a size_t count");
    }
    return IR_OK;
}

/* The first buffer larger than any target can address (checked in fp32 units, an upper bound
 * for a bf16 buffer). */
static int check_buf_sizes(const sbp_train_program *p, ir_diag *d)
{
    for (int i = 0; i < p->n_bufs; i++) {
        const tp_buf *b = p->bufs[i];
        if (b->span)
            continue; /* overlaps its region's gradients, owns no bytes */
        int64_t bytes;
        if (b->numel <= (size_t)INT64_MAX && ck_mul_i64((int64_t)b->numel, 4, &bytes) &&
            bytes <= IR_MAX_TENSOR_BYTES)
            continue;
        const ir_node *n = b->value ? b->value->producer : NULL;
        return ir_diag_add(d, IR_SEV_ERROR, n ? n->name : NULL, n ? n->op_type : NULL,
                           "buffer %s (%s) has %zu elements, %s bytes: more than any target "
                           "can address (%lld bytes, 2^47)",
                           b->name, b->what ? b->what : "?", b->numel,
                           b->numel <= (size_t)INT64_MAX / 4
                               ? ir_arena_printf(p->g->arena, "%lld", (long long)b->numel * 4)
                               : "over 2^63",
                           (long long)IR_MAX_TENSOR_BYTES);
    }
    return IR_OK;
}

int sbp_train_check_totals(const sbp_train_program *p, ir_diag *d)
{
    int64_t params, peak;
    /* parameters + gradients (grad_elems <= param_elems) */
    bool ok = p->param_elems <= (size_t)INT64_MAX && p->workspace_bytes <= (size_t)INT64_MAX &&
              ck_mul_i64((int64_t)p->param_elems, 8, &params) &&
              ck_add_i64(params, (int64_t)p->workspace_bytes, &peak) &&
              peak <= IR_MAX_TENSOR_BYTES;
    if (ok)
        return IR_OK;
    return ir_diag_error(d, "the step needs %zu bytes of parameters, %zu of gradients and %zu of "
                            "workspace: more than any target can address (%lld bytes, 2^47)",
                         p->param_elems * 4, p->grad_elems * 4, p->workspace_bytes,
                         (long long)IR_MAX_TENSOR_BYTES);
}

int sbp_train_verify(const sbp_train_program *p, ir_diag *d)
{
    int rc = IR_OK;
    if (check_buf_sizes(p, d) != IR_OK)
        return IR_ERR;
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
            if (check_args(p, blk, i, in_loop ? &blk->loops[li] : NULL, d) != IR_OK)
                return IR_ERR;
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
