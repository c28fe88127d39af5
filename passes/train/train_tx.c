/* train_tx.c — the toolkit every training-program step is written with (the bottom layer of
 * the training half of passes/; train_internal.h).
 *
 * Containers (arena arrays, buffers, blocks), instruction emission with the A_* argument
 * helpers, the value and node records (alias groups, layouts), the operand buffers a gradient
 * rule sees (tx_in/out/gin/gout, node-owned aux buffers, shared constants), the layout
 * planners of the rules, and zeroing / appending of blocks. Everything here works on one tctx;
 * nothing here calls a rule, a strategy or the driver (scripts/check-passes-layers.py keeps it
 * so).
 */
#include "train_internal.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const tp_kernel_info tp_kernel_table[TP_K_COUNT] = {
#define K(e, nb, na, roles, bf16, args, call) [TP_K_##e] = {#e, nb, na, roles, bf16, args, call},
#include "train_kernels.def"
#undef K
};

/* ------------------------------------------------------------------ containers */

/* Grows an arena array of elem-sized items to hold `need`; old storage stays in the arena. */
int tx_grow(ir_arena *a, void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return 0;
    int nc = *cap ? *cap * 2 : 16;
    while (nc < need)
        nc *= 2;
    void *n = ir_arena_calloc(a, (size_t)nc, elem);
    if (!n)
        return -1;
    if (*arr)
        memcpy(n, *arr, (size_t)*cap * elem);
    *arr = n;
    *cap = nc;
    return 0;
}

int tx_error(tctx *t, const ir_node *n, const char *fmt, ...)
{
    char msg[1024]; /* as long as ir_diag keeps: the unrecognised-attention error quotes a mask */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ir_diag_add(t->g->diag, IR_SEV_ERROR, n ? n->name : NULL, n ? n->op_type : NULL, "%s",
                       msg);
}

size_t tx_numel(const ir_value *v)
{
    int64_t n = ir_value_numel(v);
    return n < 0 ? 0 : (size_t)n;
}

/* The buffers' names as a hash set (open addressing, FNV-1a): a name is looked up in O(1), not
 * against every buffer. name_add returns -1 when out of memory. */
static unsigned name_hash(const char *s)
{
    unsigned h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static bool name_taken(const tctx *t, const char *name)
{
    if (!t->names_cap)
        return false;
    for (unsigned i = name_hash(name) & (unsigned)(t->names_cap - 1);; i = (i + 1) & (unsigned)(t->names_cap - 1)) {
        if (!t->names[i])
            return false;
        if (strcmp(t->names[i], name) == 0)
            return true;
    }
}

static int name_add(tctx *t, const char *name)
{
    if (2 * (t->names_n + 1) > t->names_cap) {
        int nc = t->names_cap ? 2 * t->names_cap : 256;
        const char **old = t->names;
        int oc = t->names_cap;
        t->names = ir_arena_calloc(t->g->arena, (size_t)nc, sizeof *t->names);
        if (!t->names)
            return -1;
        t->names_cap = nc;
        t->names_n = 0;
        for (int i = 0; i < oc; i++)
            if (old[i] && name_add(t, old[i]))
                return -1;
    }
    unsigned i = name_hash(name) & (unsigned)(t->names_cap - 1);
    while (t->names[i]) {
        if (strcmp(t->names[i], name) == 0)
            return 0;
        i = (i + 1) & (unsigned)(t->names_cap - 1);
    }
    t->names[i] = name;
    t->names_n++;
    return 0;
}

/* A C identifier from prefix + base: alphanumerics kept, runs of anything else one '_',
 * at most 56 characters of base (the tail, which is the specific part), unique in the program. */
const char *tx_cname(tctx *t, const char *prefix, const char *base)
{
    char s[80];
    size_t n = 0, len = strlen(base);
    const char *b = len > 56 ? base + len - 56 : base;
    for (; *b && n < sizeof s - 1; b++) {
        unsigned char c = (unsigned char)*b;
        if (isalnum(c))
            s[n++] = (char)c;
        else if (n > 0 && s[n - 1] != '_')
            s[n++] = '_';
    }
    while (n > 0 && s[n - 1] == '_')
        n--;
    s[n] = 0;
    const char *name = ir_arena_printf(t->g->arena, "%s%s", prefix, s);
    for (int k = 2; name && name_taken(t, name); k++)
        name = ir_arena_printf(t->g->arena, "%s%s_%d", prefix, s, k);
    return name;
}

/* The readable stem of a value: for a semantic op's result, the ONNX module path of the first
 * node it replaced plus the op ("model/layers.0/self_attn/q_proj" + "Linear"); else its name. */
const char *tx_value_stem(tctx *t, const ir_value *v)
{
    const ir_node *p = v->producer;
    if (v->kind == IR_VAL_NODE && p && ir_op_is_semantic(p->op) && p->n_origin > 0) {
        const char *o = p->origin[0];
        const char *slash = strrchr(o, '/');
        size_t dir = slash && slash != o ? (size_t)(slash - o) : strlen(o);
        return ir_arena_printf(t->g->arena, "%.*s_%s", (int)dir, o, ir_op_name(p->op));
    }
    return v->name;
}

int tx_new_buf(tctx *t, tp_buf_kind kind, const char *name, const ir_value *v, size_t numel,
               bool is_int, bool is_grad, int region, const char *what)
{
    sbp_train_program *p = t->p;
    if (tx_grow(t->g->arena, (void **)&p->bufs, &p->cap_bufs, p->n_bufs + 1, sizeof *p->bufs))
        return -1;
    tp_buf *b = ir_arena_alloc(t->g->arena, sizeof *b);
    if (!b || (name && name_add(t, name)))
        return -1;
    b->id = p->n_bufs;
    b->name = name;
    b->kind = kind;
    b->is_int = is_int;
    b->is_grad = is_grad;
    b->numel = numel;
    b->region = region;
    b->value = v;
    b->what = what;
    if (v && v->rank >= 0 && v->rank <= IR_MAX_RANK) {
        b->rank = v->rank;
        for (int i = 0; i < v->rank; i++)
            b->dims[i] = v->dims[i].value;
    } else {
        b->rank = 1;
        b->dims[0] = (int64_t)numel;
    }
    p->bufs[p->n_bufs] = b;
    return p->n_bufs++;
}

tp_block *tx_new_block(tctx *t, const char *name, const char *comment)
{
    sbp_train_program *p = t->p;
    if (tx_grow(t->g->arena, (void **)&p->blocks, &p->cap_blocks, p->n_blocks + 1,
             sizeof *p->blocks))
        return NULL;
    tp_block *b = ir_arena_alloc(t->g->arena, sizeof *b);
    if (!b)
        return NULL;
    b->name = name;
    b->comment = comment;
    p->blocks[p->n_blocks++] = b;
    return b;
}

tp_arg A_I(int64_t i) { return (tp_arg){.kind = TP_ARG_INT, .i = i}; }
tp_arg A_F(double f) { return (tp_arg){.kind = TP_ARG_FLOAT, .f = f}; }
tp_arg A_E(const char *expr) { return (tp_arg){.kind = TP_ARG_EXPR, .expr = expr}; }
tp_arg A_T0(int64_t i) { return (tp_arg){.kind = TP_ARG_T0, .i = i}; }
tp_arg A_IS(tctx *t, const int64_t *v, int n)
{
    int64_t *c = ir_arena_calloc(t->g->arena, (size_t)(n > 0 ? n : 1), sizeof *c);
    if (c)
        memcpy(c, v, (size_t)n * sizeof *c);
    return (tp_arg){.kind = TP_ARG_INTS, .ints = c, .n = n};
}

tp_inst *tx_emit(tctx *t, tp_kernel k, const int *bufs, const tp_arg *args)
{
    tp_block *b = t->cur;
    if (tx_grow(t->g->arena, (void **)&b->insts, &b->cap_insts, b->n_insts + 1, sizeof *b->insts))
        return NULL;
    tp_inst *in = &b->insts[b->n_insts++];
    const tp_kernel_info *ki = &tp_kernel_table[k];
    in->k = k;
    for (int i = 0; i < TP_MAX_BUFS; i++)
        in->buf[i] = i < ki->n_buf ? bufs[i] : -1;
    for (int i = 0; i < ki->n_arg; i++)
        in->arg[i] = args[i];
    in->node = t->cur_node;
    in->what = t->cur_what;
    return in;
}

/* ------------------------------------------------------------------ value and node records */

int tx_index(const tctx *t, const ir_node *n) { return t->node_index[n->id]; }
tn *tx_node(tctx *t, const ir_node *n) { return &t->n[tx_index(t, n)]; }
tv *tx_root(tctx *t, const ir_value *v) { return &t->v[t->v[v->id].group]; }

int tx_layout(tctx *t, const ir_node *n, int slot)
{
    tn *r = tx_node(t, n);
    if (slot < TN_MAX_IN && r->relayout[slot] >= 0)
        return r->relayout[slot];
    return n->in[slot] ? t->v[n->in[slot]->id].layout : TL_NAT;
}

/* A constant's buffer: float data as f32, integer data as int32 (range-checked). */
static int const_buf(tctx *t, const ir_value *v)
{
    size_t n = tx_numel(v);
    bool is_int = ir_dtype_is_int(v->dtype);
    if (!v->data || (!is_int && !ir_dtype_is_float(v->dtype)))
        return -1;
    void *data;
    if (is_int) {
        int32_t *d = ir_arena_calloc(t->g->arena, n ? n : 1, sizeof *d);
        if (!d)
            return -1;
        for (size_t i = 0; i < n; i++) {
            int64_t x = ir_const_i64(v, (int64_t)i);
            if (x < INT32_MIN || x > INT32_MAX)
                return -1;
            d[i] = (int32_t)x;
        }
        data = d;
    } else if (v->dtype == IR_DT_FLOAT) {
        data = v->data;
    } else {
        float *d = ir_arena_calloc(t->g->arena, n ? n : 1, sizeof *d);
        if (!d)
            return -1;
        for (size_t i = 0; i < n; i++)
            d[i] = (float)ir_const_f64(v, (int64_t)i);
        data = d;
    }
    int b = tx_new_buf(t, TP_BUF_CONST, tx_cname(t, "c_", v->name), v, n, is_int, false,
                       TP_REGION_PERSIST, "constant");
    if (b >= 0)
        t->p->bufs[b]->data = data;
    return b;
}

/* The buffer of a value's alias group (constants are made on first use). */
int tx_group_buf(tctx *t, const ir_value *v)
{
    tv *r = tx_root(t, v);
    const ir_value *root = t->g->values[r->group];
    if (r->buf < 0 && root->kind == IR_VAL_CONST) {
        r->buf = const_buf(t, root);
        if (r->buf < 0)
            tx_error(t, t->cur_node, "constant '%s' (%s) cannot be an operand of the step",
                     root->name, ir_dtype_name(root->dtype));
    }
    return r->buf;
}

int tx_in(tctx *t, const ir_node *n, int slot)
{
    if (slot >= n->n_in || !n->in[slot])
        return -1;
    tn *r = tx_node(t, n);
    if (slot < TN_MAX_IN && r->relay_buf[slot] >= 0)
        return r->relay_buf[slot];
    return tx_group_buf(t, n->in[slot]);
}

int tx_out(tctx *t, const ir_node *n, int slot)
{
    if (slot >= n->n_out || !n->out[slot])
        return -1;
    return tx_group_buf(t, n->out[slot]);
}

int tx_gin(tctx *t, const ir_node *n, int slot)
{
    if (slot >= n->n_in || !n->in[slot])
        return -1;
    tn *r = tx_node(t, n);
    if (slot < TN_MAX_IN && r->relayout[slot] >= 0)
        return r->relay_grad[slot];
    if (!t->v[n->in[slot]->id].needs_grad)
        return -1;
    return tx_root(t, n->in[slot])->grad;
}

int tx_gout(tctx *t, const ir_node *n, int slot)
{
    if (slot >= n->n_out || !n->out[slot])
        return -1;
    return tx_root(t, n->out[slot])->grad;
}

static int node_region(tctx *t, const ir_node *n)
{
    return t->p->strategy != SBP_STRATEGY_STORE ? tx_node(t, n)->seg : TP_REGION_PERSIST;
}

/* A workspace buffer owned by node n, in n's region. */
int tx_node_buf(tctx *t, const ir_node *n, size_t numel, bool is_int, bool is_grad,
                    const char *what)
{
    const char *stem = n->out[0] ? tx_value_stem(t, n->out[0]) : n->name;
    const char *name = tx_cname(t, is_grad ? "d_" : "s_", ir_arena_printf(t->g->arena, "%s_%s",
                                                                         stem, what));
    int b = tx_new_buf(t, TP_BUF_WS, name, NULL, numel, is_int, is_grad, node_region(t, n), what);
    if (b >= 0 && t->chunk) /* made while a chunk body is lowered: sized for one chunk */
        t->p->bufs[b]->chunk_local = true;
    return b;
}

int tx_aux(tctx *t, const ir_node *n, int idx, size_t numel, bool is_int, bool is_grad,
           const char *what)
{
    tn *r = tx_node(t, n);
    if (r->aux[idx] < 0)
        r->aux[idx] = tx_node_buf(t, n, numel, is_int, is_grad, what);
    return r->aux[idx];
}

void tx_emit_doc_setup(tctx *t)
{
    sbp_train_program *p = t->p;
    if (p->moe_stats_buf >= 0) { /* the load-balancing sums count this step's rows only */
        t->cur_node = NULL;
        t->cur_what = "the load-balancing loss's sums start at zero";
        tx_zero_buf(t, p->moe_stats_buf);
    }
    if (p->seq_parallel >= 1) {
        /* one rank's tokens of every row: their positions in the whole row; packed, the
         * whole rows' document ids and starts first (seqpar.c) */
        t->cur_node = NULL;
        const tp_arg a[3] = {A_I(t->B), A_I(t->T), A_I(p->seq_parallel)};
        if (!p->packed) {
            t->cur_what = "each token's position in its whole row";
            tx_emit(t, TP_K_SP_POSITIONS, (const int[]){p->doc_pos_buf}, a);
            return;
        }
        t->cur_what = "every rank's document ids, their starts, and this rank's tokens' "
                      "positions in their documents";
        tx_emit(t, TP_K_SP_GATHER_ROWS,
                (const int[]){p->doc_all_buf, p->docs_buf, p->doc_gather_buf}, a);
        tx_emit(t, TP_K_DOC_STARTS, (const int[]){p->doc_start_buf, p->doc_all_buf},
                (const tp_arg[]){A_I(t->B), A_I(p->seq_len_global)});
        tx_emit(t, TP_K_SP_DOC_POSITIONS, (const int[]){p->doc_pos_buf, p->doc_start_buf}, a);
        return;
    }
    if (!p->packed)
        return;
    t->cur_node = NULL;
    t->cur_what = "each token's document start and position, from the document ids";
    const tp_arg a[2] = {A_I(t->B), A_I(t->T)};
    tx_emit(t, TP_K_DOC_STARTS, (const int[]){p->doc_start_buf, p->docs_buf}, a);
    tx_emit(t, TP_K_DOC_POSITIONS, (const int[]){p->doc_pos_buf, p->docs_buf}, a);
}

int tx_positions(tctx *t, int64_t rows, int64_t T)
{
    if (t->p->packed || t->p->seq_parallel >= 1) { /* packed: the position of each token in
                                                      * its document; sequence-parallel: in
                                                      * its whole row */
        if (rows == t->B * t->T && T == t->p->seq_len_global)
            return t->p->doc_pos_buf;
        ir_diag_error(t->g->diag, "%s: positions over %lld rows of a %lld-long table are "
                                  "not one per token (batch %lld x sequence %lld)",
                      t->p->packed ? "--packed" : "--seq-parallel", (long long)rows, (long long)T, (long long)t->B, (long long)t->T);
        return -1;
    }
    for (int i = 0; i < t->n_rope_pos; i++)
        if (t->rope_pos_cache[i][0] == rows && t->rope_pos_cache[i][1] == T)
            return t->rope_pos_cache[i][2];
    int32_t *d = ir_arena_calloc(t->g->arena, (size_t)rows, sizeof *d);
    if (!d)
        return -1;
    for (int64_t r = 0; r < rows; r++)
        d[r] = (int32_t)(r % T);
    int b = tx_new_buf(t, TP_BUF_CONST,
                       tx_cname(t, "c_", ir_arena_printf(t->g->arena, "positions_%lld_mod_%lld",
                                                      (long long)rows, (long long)T)),
                       NULL, (size_t)rows, true, false, TP_REGION_PERSIST,
                       "position of each row");
    if (b < 0)
        return -1;
    t->p->bufs[b]->data = d;
    if (rows == t->B * t->T) { /* one position per token: chunk loops slice it */
        t->p->bufs[b]->rows = rows;
        t->p->bufs[b]->row_elems = 1;
    }
    if (t->n_rope_pos < 8) {
        t->rope_pos_cache[t->n_rope_pos][0] = (int)rows;
        t->rope_pos_cache[t->n_rope_pos][1] = (int)T;
        t->rope_pos_cache[t->n_rope_pos][2] = b;
        t->n_rope_pos++;
    }
    return b;
}

static int const_fill(tctx *t, int64_t n, float x, const char *name, const char *what)
{
    for (int i = 0; i < t->p->n_bufs; i++) {
        const tp_buf *b = t->p->bufs[i];
        if (b->kind == TP_BUF_CONST && !b->is_int && !b->value && b->numel == (size_t)n &&
            b->what == what)
            return i;
    }
    float *d = ir_arena_calloc(t->g->arena, (size_t)(n > 0 ? n : 1), sizeof *d);
    if (!d)
        return -1;
    for (int64_t i = 0; i < n; i++)
        d[i] = x;
    int b = tx_new_buf(t, TP_BUF_CONST, tx_cname(t, "c_", name), NULL, (size_t)n, false, false,
                       TP_REGION_PERSIST, what);
    if (b >= 0)
        t->p->bufs[b]->data = d;
    return b;
}

static const char ones_what[] = "ones";
static const char zero_what[] = "zero";

int tx_ones(tctx *t, int64_t n)
{
    return const_fill(t, n, 1.0f, ir_arena_printf(t->g->arena, "ones_%lld", (long long)n),
                      ones_what);
}

int tx_zero(tctx *t) { return const_fill(t, 1, 0.0f, "zero", zero_what); }

/* ------------------------------------------------------------------ 3. plan */

int plan_natural(tctx *t, const ir_node *n)
{
    tn *r = tx_node(t, n);
    for (int i = 0; i < n->n_in && i < TN_MAX_IN; i++)
        if (n->in[i] && t->v[n->in[i]->id].layout != TL_NAT)
            r->relayout[i] = TL_NAT;
    r->out_layout = TL_NAT;
    return IR_OK;
}

int plan_view(tctx *t, const ir_node *n)
{
    tn *r = tx_node(t, n);
    const ir_value *in = n->in[0];
    if (t->v[in->id].layout == TL_NAT) {
        r->view = true;
        r->out_layout = TL_NAT;
    } else {
        /* the data must be put in logical order: the rule's forward permutes it */
        r->view = false;
        r->out_layout = TL_NAT;
    }
    return IR_OK;
}

int plan_rowwise(tctx *t, const ir_node *n)
{
    tn *r = tx_node(t, n);
    const ir_value *out = n->out[0];
    int lay = TL_NAT;
    if (n->in[0] && n->in[0]->rank == out->rank)
        lay = t->v[n->in[0]->id].layout;
    for (int i = 0; i < n->n_in && i < TN_MAX_IN; i++) {
        const ir_value *v = n->in[i];
        if (!v)
            continue;
        bool row_operand = ir_dtype_is_float(v->dtype) && v->rank == out->rank;
        int want = row_operand ? lay : TL_NAT;
        if (t->v[v->id].layout != want)
            r->relayout[i] = want;
    }
    r->out_layout = lay;
    return IR_OK;
}

/* ------------------------------------------------------------------ zeroing, appending */

int tx_span_buf(tctx *t, int region)
{
    const char *name = region == TP_REGION_PERSIST
                           ? "d_persistent"
                           : ir_arena_printf(t->g->arena, "d_%s", t->p->segments[region].name);
    int b = tx_new_buf(t, TP_BUF_WS, tx_cname(t, "", name), NULL, 0, false, true, region,
                       "every gradient buffer of the region");
    if (b >= 0)
        t->p->bufs[b]->span = true;
    return b;
}

void tx_zero_span(tctx *t, int span)
{
    t->cur_node = NULL;
    t->cur_what = "zero the gradients";
    int b[1] = {span};
    tp_arg a[1] = {A_I(0)}; /* patched with the span's size by the layout */
    tx_emit(t, TP_K_MEMSET_ZERO, b, a);
}

void tx_zero_region(tctx *t, int region) { tx_zero_span(t, tx_span_buf(t, region)); }

void tx_zero_buf(tctx *t, int buf)
{
    t->cur_node = NULL;
    t->cur_what = "zero the gradients";
    int b[1] = {buf};
    tp_arg a[1] = {A_I((int64_t)t->p->bufs[buf]->numel * 4)};
    tx_emit(t, TP_K_MEMSET_ZERO, b, a);
}

int tx_append(tctx *t, tp_block *dst, const tp_block *src)
{
    int base = dst->n_insts;
    for (int i = 0; i < src->n_insts; i++) {
        if (tx_grow(t->g->arena, (void **)&dst->insts, &dst->cap_insts, dst->n_insts + 1,
                    sizeof *dst->insts))
            return ir_diag_error(t->g->diag, "out of memory");
        dst->insts[dst->n_insts++] = src->insts[i];
    }
    for (int i = 0; i < src->n_loops; i++) {
        if (tx_grow(t->g->arena, (void **)&dst->loops, &dst->cap_loops, dst->n_loops + 1,
                    sizeof *dst->loops))
            return ir_diag_error(t->g->diag, "out of memory");
        tp_loop l = src->loops[i];
        l.first += base;
        l.end += base;
        dst->loops[dst->n_loops++] = l;
    }
    return IR_OK;
}

