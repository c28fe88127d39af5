/* train_program.c — builds the training program from a graph that ends in its loss.
 *
 * Approach, in order (each step a function below):
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
 *                 one (the last cut after it whose value a residual Add made);
 *   5. regions    store: every buffer persistent. checkpoint, stream: a group used only inside
 *                 its segment, and every node-owned buffer, lives in the segment's overlay;
 *                 stream then runs the sequence analysis (sequence.c) and its plan (stream.c:
 *                 what runs once per layer, what chunk by chunk, chunk-local buffer sizes);
 *   6. emit       block "forward" (every node), then one backward block per segment, last
 *                 first: zero its gradients, recompute (checkpoint) what its gradient rules
 *                 read, run the rules in reverse node order (stream: stream.c's blocks with
 *                 chunk loops); then the verifier (train_verify.c);
 *   7. plan       liveness and offsets in one workspace arena (passes/memplan.c), which also
 *                 turns the region-wide gradient zeroing into per-buffer zeroing.
 */
#include "train_internal.h"
#include "memplan.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const tp_kernel_info tp_kernel_table[TP_K_COUNT] = {
#define K(e, nb, na, call) [TP_K_##e] = {#e, nb, na, call},
#include "train_kernels.def"
#undef K
};

#define TP_ALIGN 64 /* bytes; SBPRT_ALIGN */

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
    char msg[512];
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

/* A C identifier from prefix + base: alphanumerics kept, runs of anything else one '_',
 * at most 56 characters of base (the tail, which is the specific part), unique in the program. */
static const char *cname(tctx *t, const char *prefix, const char *base)
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
    for (int k = 2;; k++) {
        bool clash = false;
        for (int i = 0; i < t->p->n_bufs && !clash; i++)
            clash = strcmp(t->p->bufs[i]->name, name) == 0;
        if (!clash)
            return name;
        name = ir_arena_printf(t->g->arena, "%s%s_%d", prefix, s, k);
    }
}

/* The readable stem of a value: for a semantic op's result, the ONNX module path of the first
 * node it replaced plus the op ("model/layers.0/self_attn/q_proj" + "Linear"); else its name. */
static const char *value_stem(tctx *t, const ir_value *v)
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
    if (!b)
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
    int b = tx_new_buf(t, TP_BUF_CONST, cname(t, "c_", v->name), v, n, is_int, false,
                       TP_REGION_PERSIST, "constant");
    if (b >= 0)
        t->p->bufs[b]->data = data;
    return b;
}

/* The buffer of a value's alias group (constants are made on first use). */
static int group_buf(tctx *t, const ir_value *v)
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
    return group_buf(t, n->in[slot]);
}

int tx_out(tctx *t, const ir_node *n, int slot)
{
    if (slot >= n->n_out || !n->out[slot])
        return -1;
    return group_buf(t, n->out[slot]);
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
static int node_buf(tctx *t, const ir_node *n, size_t numel, bool is_int, bool is_grad,
                    const char *what)
{
    const char *stem = n->out[0] ? value_stem(t, n->out[0]) : n->name;
    const char *name = cname(t, is_grad ? "d_" : "s_", ir_arena_printf(t->g->arena, "%s_%s",
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
        r->aux[idx] = node_buf(t, n, numel, is_int, is_grad, what);
    return r->aux[idx];
}

int tx_positions(tctx *t, int64_t rows, int64_t T)
{
    for (int i = 0; i < t->n_rope_pos; i++)
        if (t->rope_pos_cache[i][0] == rows && t->rope_pos_cache[i][1] == T)
            return t->rope_pos_cache[i][2];
    int32_t *d = ir_arena_calloc(t->g->arena, (size_t)rows, sizeof *d);
    if (!d)
        return -1;
    for (int64_t r = 0; r < rows; r++)
        d[r] = (int32_t)(r % T);
    int b = tx_new_buf(t, TP_BUF_CONST,
                       cname(t, "c_", ir_arena_printf(t->g->arena, "positions_%lld_mod_%lld",
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
    int b = tx_new_buf(t, TP_BUF_CONST, cname(t, "c_", name), NULL, (size_t)n, false, false,
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
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: parameters with storage; pass 1: re-tied copies (they need the owner's row) */
        for (int i = 0; i < g->n_values; i++) {
            ir_value *v = g->values[i];
            if (v->kind != IR_VAL_PARAM || (pass == 0) != !v->tied_to)
                continue;
            if (pass == 0 && ir_value_use_count(g, v) == 0)
                continue;
            if (pass == 1 && (ir_value_use_count(g, v->tied_to) == 0 || v->tied_to->tied_to))
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
                q->buf = tx_new_buf(t, TP_BUF_PARAM, cname(t, "w_", v->name), v, q->numel,
                                    false, false, TP_REGION_PERSIST, "parameter");
                q->buf >= 0 ? (void)(p->bufs[q->buf]->offset = q->offset) : (void)0;
                t->v[v->id].buf = q->buf;
                t->v[v->id].needs_grad = !v->frozen;
            } else {
                q->tied_to = index[v->tied_to->id];
                q->offset = p->params[q->tied_to].offset;
            }
            index[v->id] = p->n_params++;
        }
    }
    return rc;
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

static int bind_inputs(tctx *t)
{
    ir_graph *g = t->g;
    sbp_train_program *p = t->p;
    ir_uses u = ir_uses_build(g);
    if (!u.uses)
        return ir_diag_error(g->diag, "out of memory");
    ir_value *ids = NULL, *labels = NULL;
    int rc = IR_OK;
    for (int i = 0; i < g->n_inputs; i++) {
        ir_value *v = g->inputs[i];
        if (u.n_uses[v->id] == 0)
            continue;
        if (!ir_dtype_is_int(v->dtype)) {
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
    return IR_OK;
}

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
    for (int k = 0; k < nn; k++) {
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
        if (!rule) {
            if (live && any)
                rc = tx_error(t, n, "no gradient rule for op %s (node '%s')", ir_op_name(n->op),
                              n->name);
            else
                rc = tx_error(t, n, "op %s (node '%s') cannot run in a training step (no "
                                    "lowering)", ir_op_name(n->op), n->name);
            continue;
        }
        if (live && any) {
            if (!rule->bwd && !t->n[k].view) {
                rc = tx_error(t, n, "no gradient rule for op %s (node '%s')", ir_op_name(n->op),
                              n->name);
                continue;
            }
            for (int s = 0; s < n->n_in; s++)
                if (n->in[s] && slot_diff(rule, s) && t->v[n->in[s]->id].needs_grad)
                    t->v[n->in[s]->id].grad_live = true;
        }
    }
    if (rc != IR_OK)
        return rc;
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

static int make_group_buffers(tctx *t)
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
            v->buf = tx_new_buf(t, TP_BUF_WS, cname(t, "a_", value_stem(t, val)), val, numel,
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
                v->grad = tx_new_buf(t, TP_BUF_WS, cname(t, "d_", value_stem(t, val)), val,
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
            v->grad = tx_new_buf(t, TP_BUF_GRAD, cname(t, "dw_", val->name), val, pb->numel,
                                 false, true, TP_REGION_PERSIST, "parameter gradient");
            if (v->grad < 0) {
                free(wants);
                return ir_diag_error(g->diag, "out of memory");
            }
            t->p->bufs[v->grad]->offset = pb->offset;
        }
    }
    free(wants);
    for (int i = 0; i < t->p->n_params; i++) {
        tp_param *q = &t->p->params[i];
        if (q->tied_to >= 0)
            continue;
        q->grad = t->v[q->value->id].grad;
        q->trainable = q->grad >= 0;
    }
    for (int i = 0; i < t->p->n_params; i++) {
        tp_param *q = &t->p->params[i];
        if (q->tied_to >= 0) {
            q->trainable = t->p->params[q->tied_to].trainable;
            q->grad = t->p->params[q->tied_to].grad;
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
            r->relay_buf[s] = node_buf(t, n, tx_numel(src), false, false, what);
            tv *root = tx_root(t, src);
            if (t->v[src->id].needs_grad && root->grad >= 0)
                r->relay_grad[s] = node_buf(t, n, tx_numel(src), false, true, what);
            if (r->relay_buf[s] < 0)
                return ir_diag_error(t->g->diag, "out of memory");
            t->p->bufs[r->relay_buf[s]]->swapped = r->relayout[s] == TL_SWAP;
        }
        int64_t d[4];
        phys_dims(src, t->v[src->id].layout, d);
        int b[2] = {r->relay_buf[s], group_buf(t, src)};
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

static int span_buf(tctx *t, int region)
{
    const char *name = region == TP_REGION_PERSIST
                           ? "d_persistent"
                           : ir_arena_printf(t->g->arena, "d_%s", t->p->segments[region].name);
    int b = tx_new_buf(t, TP_BUF_WS, cname(t, "", name), NULL, 0, false, true, region,
                       "every gradient buffer of the region");
    if (b >= 0)
        t->p->bufs[b]->span = true;
    return b;
}

static void emit_zero(tctx *t, int span)
{
    t->cur_node = NULL;
    t->cur_what = "zero the gradients";
    int b[1] = {span};
    tp_arg a[1] = {A_I(0)}; /* patched with the span's size by the layout */
    tx_emit(t, TP_K_MEMSET_ZERO, b, a);
}

/* Marks the buffers an instruction reads or writes. */
static void mark_bufs(const tp_block *b, int from, bool *used)
{
    for (int i = from; i < b->n_insts; i++)
        for (int j = 0; j < TP_MAX_BUFS; j++)
            if (b->insts[i].buf[j] >= 0)
                used[b->insts[i].buf[j]] = true;
}

void tx_zero_region(tctx *t, int region) { emit_zero(t, span_buf(t, region)); }

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
        if (!need || !run) {
            free(need);
            free(run);
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
        for (int k = first; k < end; k++)
            if (run[k] && tx_lower_forward(t, nodes[k], "recompute") != IR_OK) {
                free(need);
                free(run);
                return IR_ERR;
            }
        free(need);
        free(run);
    }
    return tx_append(t, blk, &grads);
}

static int emit_blocks(tctx *t, ir_node **nodes, int nn, const ir_value *loss)
{
    sbp_train_program *p = t->p;
    bool ckpt = p->strategy == SBP_STRATEGY_CHECKPOINT;
    t->cur = tx_new_block(t, "forward",
                          "The forward pass: every node in order, ending with the loss sum.");
    if (!t->cur)
        return ir_diag_error(t->g->diag, "out of memory");
    for (int k = 0; k < nn; k++)
        if (tx_lower_forward(t, nodes[k], "forward") != IR_OK)
            return IR_ERR;

    int persist_span = span_buf(t, TP_REGION_PERSIST);
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
            emit_zero(t, persist_span);
        if (ckpt)
            emit_zero(t, span_buf(t, s));
        if (tx_emit_rules(t, nodes, nn, NULL, seg->first_node, seg->end_node, loss, recompute) !=
            IR_OK)
            return IR_ERR;
        if (blk->n_insts == 0) /* nothing to do (e.g. every parameter before it frozen) */
            p->n_blocks--;
    }
    return IR_OK;
}

/* ------------------------------------------------------------------ 7. memory plan: passes/memplan.c */

/* ------------------------------------------------------------------ driver */

static sbp_train_program *oom(ir_graph *g)
{
    ir_diag_error(g->diag, "out of memory");
    return NULL;
}

sbp_train_program *sbp_train_build(ir_graph *g, sbp_objective objective,
                                   const sbp_train_options *opt)
{
    if (opt && opt->memory_budget)
        return stream_fit_budget(g, objective, opt);
    ir_graph_compact(g);
    if (g->n_outputs != 1) {
        ir_diag_error(g->diag, "the graph must end in one loss (run the objective pass)");
        return NULL;
    }
    const ir_value *loss = g->outputs[0];
    if (!loss->producer || (loss->producer->op != IR_OP_CROSS_ENTROPY &&
                            loss->producer->op != IR_OP_SOFTMAX_CE_LOSS)) {
        ir_diag_error(g->diag, "the loss '%s' must be made by a CrossEntropy node", loss->name);
        return NULL;
    }

    sbp_train_program *p = ir_arena_alloc(g->arena, sizeof *p);
    tctx *t = ir_arena_alloc(g->arena, sizeof *t);
    int nn = g->n_nodes, max_id = 0;
    for (int k = 0; k < nn; k++)
        if (g->nodes[k]->id > max_id)
            max_id = g->nodes[k]->id;
    if (!p || !t)
        return oom(g);
    t->g = g;
    t->p = p;
    t->v = ir_arena_calloc(g->arena, (size_t)g->n_values + 1, sizeof *t->v);
    t->n = ir_arena_calloc(g->arena, (size_t)nn + 1, sizeof *t->n);
    t->node_index = ir_arena_calloc(g->arena, (size_t)max_id + 1, sizeof *t->node_index);
    if (!t->v || !t->n || !t->node_index)
        return oom(g);
    for (int i = 0; i < g->n_values; i++) {
        t->v[i].group = i;
        t->v[i].buf = t->v[i].grad = -1;
        t->v[i].first_node = t->v[i].last_use = -1;
    }
    for (int k = 0; k < nn; k++) {
        t->node_index[g->nodes[k]->id] = k;
        for (int i = 0; i < TN_MAX_IN; i++)
            t->n[k].relayout[i] = t->n[k].relay_buf[i] = t->n[k].relay_grad[i] = -1;
        for (int i = 0; i < TN_MAX_AUX; i++)
            t->n[k].aux[i] = -1;
    }
    p->g = g;
    p->strategy = opt ? opt->strategy : SBP_STRATEGY_STORE;
    p->objective = objective;
    const char *red = ir_attr_string(loss->producer, "reduction", "mean");
    p->loss_is_mean = strcmp(red, "sum") != 0;
    p->vocab = loss->producer->in[0]->rank > 0
                   ? loss->producer->in[0]->dims[loss->producer->in[0]->rank - 1].value
                   : 0;

    if (build_params(t) != IR_OK || bind_inputs(t) != IR_OK || pref_setup(t, opt) != IR_OK)
        return NULL;
    if (plan(t, g->nodes, nn, loss) != IR_OK)
        return NULL;
    if (plan_segments(t, g->nodes, nn) != IR_OK)
        return NULL;
    if (p->strategy == SBP_STRATEGY_STREAM &&
        (seq_analyze(t, g->nodes, nn) != IR_OK || stream_plan(t, g->nodes, nn, loss, opt) != IR_OK))
        return NULL;
    if (make_group_buffers(t) != IR_OK)
        return NULL;
    p->loss_buf = tx_root(t, loss)->buf;
    if ((p->strategy == SBP_STRATEGY_STREAM ? stream_emit(t, g->nodes, nn, loss)
                                            : emit_blocks(t, g->nodes, nn, loss)) != IR_OK ||
        g->diag->n_errors)
        return NULL;
    if (sbp_train_verify(p, g->diag) != IR_OK)
        return NULL;
    p->bf16 = opt && opt->bf16; /* precision.c: bf16 storage, sized by the plan */
    if (p->bf16 && sbp_train_mark_bf16(p, g->diag) != IR_OK)
        return NULL;
    if (sbp_memplan(p, g->diag) != IR_OK)
        return NULL;
    if (p->bf16)
        sbp_train_place_bf16_shadow(p);
    return p;
}

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
