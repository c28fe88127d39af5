/* recognize_moe.c — Mixture-of-Experts blocks: router, top-k, routed SwiGLU experts and their
 * weighted sum become one MoE node, which the training step runs sparsely (tokens sorted by
 * expert, one GEMM per expert over its own tokens: runtime/sbprt.h, sbprt_moe_forward).
 *
 * Recognised (docs/moe-export.md has the exported graphs node by node), with N routed rows,
 * E experts, K choices per row, F the expert width, d the hidden size:
 *   z  = Gemm(x, router [E,d], transB=1)  or  MatMul(x, Transpose(router))         [N, E]
 *   p  = Softmax(z, axis -1), then any float Casts
 *   v, idx = TopK(p, K, axis -1, largest 1, sorted 1)                               [N, K]
 *   w  = v, or Div(v, ReduceSum(v, axes -1, keepdims 1))  (norm_topk = 1)
 *   xr = x repeated K times row by row: Reshape(Expand(Unsqueeze(x, 1), [N, K, d]))  [N*K, d]
 *   Wg = the expert tensor gathered per (row, choice): GatherND(gate_up [E,2F,d],
 *        Unsqueeze(Reshape(idx, [-1]), -1)) or Gather(gate_up, Reshape(idx, [-1]), axis 0),
 *        through identity Transposes, single-input Max / Concat and same-shape Expands
 *   h  = MatMul(Wg, Unsqueeze(xr, -1)), squeezed                                    [N*K, 2F]
 *   g, u = Split(h, [F, F], axis -1);  a = Mul(Mul(g, Sigmoid(g)), u)  (any operand order)
 *   y  = MatMul(gathered down [E,d,F], Unsqueeze(a, -1)), squeezed                  [N*K, d]
 *   out = ReduceSum(Reshape(Mul(y, Unsqueeze(Reshape(w, [-1]), -1)), [N, K, d]), axes 1)
 * -> MoE(x, router, gate_up, down) attrs k = K, norm_topk, taking over out [N, d]. The router
 * must read the same rows as the experts (the same value, up to Reshapes). A shared expert
 * (Qwen2-MoE) is ordinary Linear / SwiGLU / Sigmoid nodes beside it and stays as it is.
 *
 * Anything else that routes is refused, naming the TopK: a top-k over the tokens (expert-choice
 * routing), a router without a softmax before the top-k, an unsorted top-k, experts that are not
 * a SwiGLU pair, or pieces read elsewhere (capacity limits and dropped tokens show up as extra
 * readers of the routing values). A TopK the step cannot lower must not reach the training
 * passes, where it would read as a missing gradient rule.
 *
 * requires: bound dims, fold, dce. Runs first among the recognisers: it matches the raw
 * Sigmoid / Mul SiLU and the Gemm router before the activation and linear recognisers take them.
 * produces: MoE nodes; the replaced nodes are marked dead for dce.
 */
#include "recognize.h"

#include <stdio.h>
#include <string.h>

#define MAX_PAT 96

typedef struct moe_match {
    ir_node *nodes[MAX_PAT];
    int n;
    const char *why; /* the first reason the match failed (a static string) */
} moe_match;

static bool add(moe_match *m, ir_node *n)
{
    if (!n)
        return false;
    for (int i = 0; i < m->n; i++)
        if (m->nodes[i] == n)
            return true;
    if (m->n >= MAX_PAT)
        return false;
    m->nodes[m->n++] = n;
    return true;
}

static ir_node *prod(const ir_value *v)
{
    if (!v || v->kind != IR_VAL_NODE || !v->producer || v->producer->dead)
        return NULL;
    return v->producer;
}

static bool dims_are(const ir_value *v, int rank, const int64_t *d)
{
    if (!v || v->rank != rank)
        return false;
    for (int i = 0; i < rank; i++)
        if (v->dims[i].value != d[i])
            return false;
    return true;
}

static bool identity_perm(const ir_node *t)
{
    const ir_attr *a = ir_attr_get(t, "perm");
    if (!a)
        return t->in[0]->rank <= 1;
    if (a->kind != IR_ATTR_INTS)
        return false;
    for (int i = 0; i < a->n; i++)
        if (a->ints[i] != i)
            return false;
    return true;
}

/* Follows ops that leave the data as it is in memory (views: Reshape, Squeeze, Unsqueeze,
 * Flatten, Identity, float Casts to the same type, identity Transposes, single-input Max and
 * Concat, an Expand to the input's own shape) back to the first value made otherwise, adding
 * the nodes passed to m. */
static ir_value *unview(moe_match *m, ir_value *v)
{
    for (int guard = 0; guard < 64; guard++) {
        ir_node *p = prod(v);
        if (!p)
            return v;
        bool through = false;
        switch (p->op) {
        case IR_OP_RESHAPE: case IR_OP_SQUEEZE: case IR_OP_UNSQUEEZE: case IR_OP_FLATTEN:
        case IR_OP_IDENTITY:
            through = true;
            break;
        case IR_OP_CAST:
            through = p->in[0]->dtype == v->dtype;
            break;
        case IR_OP_TRANSPOSE:
            through = identity_perm(p);
            break;
        case IR_OP_MAX: case IR_OP_CONCAT:
            through = p->n_in == 1 && ir_value_numel(p->in[0]) == ir_value_numel(v);
            break;
        case IR_OP_EXPAND:
            through = ir_value_numel(p->in[0]) == ir_value_numel(v) && ir_value_numel(v) >= 0;
            break;
        default:
            break;
        }
        if (!through)
            return v;
        add(m, p);
        v = p->in[0];
    }
    return v;
}

/* The expert tensor [E, ...] a per-(row, choice) copy was gathered from, and the flat expert
 * index it was gathered by (as unview leaves it); NULL when v is not such a copy. */
static ir_value *gathered(moe_match *m, ir_value *v, int64_t rows, ir_value **index)
{
    ir_value *g = unview(m, v);
    ir_node *p = prod(g);
    if (!p || g->rank < 2 || g->dims[0].value != rows)
        return NULL;
    ir_value *data = NULL, *ind = NULL;
    if (p->op == IR_OP_GATHER_ND && ir_attr_int(p, "batch_dims", 0) == 0 &&
        p->in[1]->rank == 2 && p->in[1]->dims[1].value == 1) {
        data = p->in[0];
        ind = p->in[1];
    } else if (p->op == IR_OP_GATHER && ir_attr_int(p, "axis", 0) == 0 && p->in[1]->rank == 1) {
        data = p->in[0];
        ind = p->in[1];
    } else {
        return NULL;
    }
    add(m, p);
    data = unview(m, data);
    if (data->kind != IR_VAL_PARAM || data->rank != 3)
        return NULL;
    *index = unview(m, ind);
    return data;
}

/* x such that v is x [n, d] repeated k times row by row ([n*k, d], row r*k + j = x[r]): the
 * first [n, d] value before the Expand along a chain of views (k = 1: no Expand needed). */
static ir_value *repeated_rows(moe_match *m, ir_value *v, int64_t n, int64_t k, int64_t d)
{
    bool expanded = k == 1;
    ir_value *cur = v;
    for (int guard = 0; guard < 64; guard++) {
        if (expanded && dims_are(cur, 2, (int64_t[]){n, d}))
            return cur;
        ir_node *p = prod(cur);
        if (!p)
            return NULL;
        if (p->op == IR_OP_RESHAPE || p->op == IR_OP_SQUEEZE || p->op == IR_OP_UNSQUEEZE ||
            p->op == IR_OP_FLATTEN || p->op == IR_OP_IDENTITY ||
            (p->op == IR_OP_EXPAND && ir_value_numel(p->in[0]) == ir_value_numel(cur))) {
        } else if (p->op == IR_OP_EXPAND && !expanded && dims_are(cur, 3, (int64_t[]){n, k, d}) &&
                   dims_are(p->in[0], 3, (int64_t[]){n, 1, d})) {
            expanded = true;
        } else {
            return NULL;
        }
        add(m, p);
        cur = p->in[0];
    }
    return NULL;
}

/* The root of v through Reshapes alone: two views of the same rows share it. */
static const ir_value *rows_root(const ir_value *v)
{
    for (int guard = 0; guard < 64; guard++) {
        ir_node *p = prod(v);
        if (!p || (p->op != IR_OP_RESHAPE && p->op != IR_OP_IDENTITY))
            return v;
        v = p->in[0];
    }
    return v;
}

/* The SwiGLU of the two halves of h [rows, 2f]: a = silu(h[:, :f]) * h[:, f:]; returns h. */
static ir_value *swiglu_of(moe_match *m, ir_value *a, int64_t rows, int64_t f)
{
    ir_node *mul = prod(a);
    if (!mul || mul->op != IR_OP_MUL || !dims_are(a, 2, (int64_t[]){rows, f}))
        return NULL;
    add(m, mul);
    for (int side = 0; side < 2; side++) {
        ir_value *s = unview(m, mul->in[side]), *u = unview(m, mul->in[1 - side]);
        ir_node *sm = prod(s);
        ir_value *g = NULL;
        if (sm && sm->op == IR_OP_SILU) {
            g = sm->in[0];
        } else if (sm && sm->op == IR_OP_MUL) {
            for (int i = 0; i < 2 && !g; i++) {
                ir_node *sig = prod(sm->in[i]);
                if (sig && sig->op == IR_OP_SIGMOID && sig->in[0] == sm->in[1 - i]) {
                    g = sm->in[1 - i];
                    add(m, sig);
                }
            }
        }
        if (!g)
            continue;
        add(m, sm);
        g = unview(m, g);
        ir_node *sp = prod(g), *su = prod(u);
        if (!sp || sp != su || sp->op != IR_OP_SPLIT || sp->n_out != 2 || g != sp->out[0] ||
            u != sp->out[1])
            continue;
        ir_value *h = sp->in[0];
        int64_t axis = ir_attr_int(sp, "axis", 0);
        if (!(axis == -1 || axis == 1) || !dims_are(h, 2, (int64_t[]){rows, 2 * f}) ||
            !dims_are(sp->out[1], 2, (int64_t[]){rows, f}))
            continue;
        add(m, sp);
        return h;
    }
    return NULL;
}

/* One MatMul of a gathered expert tensor with a column per row: the tensor and the row
 * operand [rows, cols] (as unview leaves it). */
static ir_value *expert_matmul(moe_match *m, ir_value *y, int64_t rows, ir_value **row_operand,
                               ir_value **index)
{
    ir_value *b = unview(m, y);
    ir_node *mm = prod(b);
    if (!mm || mm->op != IR_OP_MATMUL || b->rank != 3 || b->dims[0].value != rows ||
        b->dims[2].value != 1)
        return NULL;
    add(m, mm);
    ir_value *w = gathered(m, mm->in[0], rows, index);
    if (!w)
        return NULL;
    *row_operand = unview(m, mm->in[1]);
    return w;
}

static int fail(moe_match *m, const char *why)
{
    if (!m->why)
        m->why = why;
    return 0;
}

/* Matches a MoE block ending in the ReduceSum `rs`; on success fills the MoE operands. */
static int match(ir_graph *g, moe_match *m, ir_node *rs, ir_value **ops, int64_t *kk, int *norm)
{
    (void)g;
    add(m, rs);
    ir_value *out = rs->out[0];
    if (ir_attr_int(rs, "keepdims", 1) != 0 || rs->n_in < 2 || out->rank != 2)
        return 0;
    int64_t ax[2];
    if (ir_const_ints(rs->in[1], ax, 2) != 1 || !(ax[0] == 1 || ax[0] == -2))
        return 0;
    ir_value *r3 = rs->in[0];
    if (r3->rank != 3)
        return 0;
    int64_t N = r3->dims[0].value, K = r3->dims[1].value, d = r3->dims[2].value;
    if (N < 1 || K < 1 || d < 1)
        return 0;
    ir_value *mv = unview(m, r3);
    ir_node *mul = prod(mv);
    if (!mul || mul->op != IR_OP_MUL || !dims_are(mv, 2, (int64_t[]){N * K, d}))
        return 0;
    add(m, mul);
    /* y times the routing weight of its (row, choice) */
    ir_value *y = NULL, *wcol = NULL;
    for (int side = 0; side < 2; side++) {
        ir_value *c = mul->in[side];
        if (dims_are(c, 2, (int64_t[]){N * K, 1}) &&
            dims_are(mul->in[1 - side], 2, (int64_t[]){N * K, d})) {
            wcol = c;
            y = mul->in[1 - side];
        }
    }
    if (!y)
        return 0;
    ir_value *a = NULL, *e2 = NULL;
    ir_value *down = expert_matmul(m, y, N * K, &a, &e2);
    if (!down)
        return 0;
    /* from here on the block is a routed sum of gathered expert products: a mismatch is a
     * MoE form sbpc does not support, worth naming */
    int64_t F = down->dims[2].value;
    if (down->dims[1].value != d || F < 1)
        return fail(m, "the down projection is not [E, d, F]");
    ir_value *h = swiglu_of(m, a, N * K, F);
    if (!h)
        return fail(m, "the experts are not SwiGLU pairs (silu(gate) * up of one Split)");
    ir_value *xr = NULL, *e1 = NULL;
    ir_value *gate_up = expert_matmul(m, h, N * K, &xr, &e1);
    int64_t E = gate_up ? gate_up->dims[0].value : 0;
    if (!gate_up || !dims_are(gate_up, 3, (int64_t[]){E, 2 * F, d}) || down->dims[0].value != E)
        return fail(m, "the experts' gate/up tensor is not [E, 2F, d] gathered per choice");
    if (e1 != e2)
        return fail(m, "the two expert tensors are gathered by different indices");
    ir_value *x = repeated_rows(m, xr, N, K, d);
    if (!x)
        return fail(m, "the experts do not read each row repeated top-k times");
    /* the selection */
    ir_node *topk = prod(e1);
    if (!topk || topk->op != IR_OP_TOP_K || e1 != topk->out[1])
        return fail(m, "the experts are not selected by a TopK's indices");
    add(m, topk);
    ir_value *probs = topk->in[0];
    int64_t kv[2];
    if (!dims_are(e1, 2, (int64_t[]){N, K}) || ir_const_ints(topk->in[1], kv, 2) != 1 ||
        kv[0] != K)
        return fail(m, "the top-k is not over each row's experts");
    if (ir_attr_int(topk, "largest", 1) != 1 || ir_attr_int(topk, "sorted", 1) != 1)
        return fail(m, "the top-k is not of the largest values, sorted");
    /* the routing weights: the top-k values, or those renormalised */
    ir_value *w = unview(m, wcol);
    if (!dims_are(w, 2, (int64_t[]){N, K}))
        return fail(m, "the routing weights are not [rows, top-k]");
    *norm = 0;
    ir_node *div = prod(w);
    if (div && div->op == IR_OP_DIV && div->in[0] == topk->out[0]) {
        ir_node *sum = prod(div->in[1]);
        int64_t sa[2];
        if (!sum || sum->op != IR_OP_REDUCE_SUM || sum->in[0] != topk->out[0] ||
            ir_attr_int(sum, "keepdims", 1) != 1 || sum->n_in < 2 ||
            ir_const_ints(sum->in[1], sa, 2) != 1 || !(sa[0] == -1 || sa[0] == 1))
            return fail(m, "the routing weights are divided by something other than their sum");
        add(m, div);
        add(m, sum);
        *norm = 1;
    } else if (w != topk->out[0]) {
        return fail(m, "the routing weights are not the top-k probabilities (or those "
                       "renormalised)");
    }
    /* the router: softmax of x's logits */
    ir_value *pv = unview(m, probs);
    ir_node *sm = prod(pv);
    if (!sm || sm->op != IR_OP_SOFTMAX)
        return fail(m, "the top-k does not read a softmax of the router logits");
    int64_t sax = ir_attr_int(sm, "axis", -1);
    if (!(sax == -1 || sax == 1) || !dims_are(pv, 2, (int64_t[]){N, E}))
        return fail(m, "the router's softmax is not over the E experts of each row");
    add(m, sm);
    ir_value *z = unview(m, sm->in[0]);
    ir_node *lin = prod(z);
    ir_value *router = NULL, *xin = NULL;
    if (lin && lin->op == IR_OP_GEMM && ir_attr_int(lin, "transA", 0) == 0 &&
        ir_attr_int(lin, "transB", 0) == 1 && ir_attr_float(lin, "alpha", 1.0) == 1.0 &&
        (lin->n_in < 3 || !lin->in[2])) {
        router = lin->in[1];
        xin = lin->in[0];
    } else if (lin && lin->op == IR_OP_MATMUL) {
        ir_node *tr = prod(lin->in[1]);
        const ir_attr *perm = tr && tr->op == IR_OP_TRANSPOSE ? ir_attr_get(tr, "perm") : NULL;
        if (perm && perm->kind == IR_ATTR_INTS && perm->n == 2 && perm->ints[0] == 1 &&
            perm->ints[1] == 0) {
            router = tr->in[0];
            xin = lin->in[0];
            add(m, tr);
        }
    } else if (lin && lin->op == IR_OP_LINEAR && ir_attr_int(lin, "trans_w", 0) == 1 &&
               (lin->n_in < 3 || !lin->in[2])) {
        router = lin->in[1];
        xin = lin->in[0];
    }
    if (!router || router->kind != IR_VAL_PARAM || !dims_are(router, 2, (int64_t[]){E, d}))
        return fail(m, "the router is not a bias-free linear map of the rows to E logits");
    add(m, lin);
    if (rows_root(xin) != rows_root(x))
        return fail(m, "the router and the experts read different rows");
    ops[0] = x;
    ops[1] = router;
    ops[2] = gate_up;
    ops[3] = down;
    *kk = K;
    return 1;
}

/* The axis of the Softmax the top-k's input comes from (through Casts, Identities and
 * Transposes), in that Softmax's frame, against the Softmax's own axis: 1 when they differ (the
 * top-k picks along another axis than the one normalised: expert-choice routing, where every
 * expert takes its top tokens of the per-token probabilities, transposed or not). */
static bool topk_crosses_softmax(const ir_node *topk)
{
    const ir_value *v = topk->in[0];
    int64_t axis = ir_attr_int(topk, "axis", -1);
    for (int guard = 0; guard < 16 && v && v->rank > 0; guard++) {
        if (axis < 0)
            axis += v->rank;
        if (axis < 0 || axis >= v->rank)
            return false;
        const ir_node *n = prod(v);
        if (!n)
            return false;
        if (n->op == IR_OP_SOFTMAX) {
            int64_t s = ir_attr_int(n, "axis", -1);
            if (s < 0)
                s += v->rank;
            return s != axis;
        }
        if (n->op == IR_OP_TRANSPOSE) {
            const ir_attr *a = ir_attr_get(n, "perm");
            if (a && a->kind == IR_ATTR_INTS && a->n == v->rank)
                axis = a->ints[axis];
            else /* no perm: the axes reversed */
                axis = v->rank - 1 - axis;
        } else if (n->op != IR_OP_CAST && n->op != IR_OP_IDENTITY) {
            return false;
        }
        v = n->in[0];
    }
    return false;
}

/* A CumSum within a few nodes downstream of the top-k's outputs: the running count of each
 * expert's tokens that a capacity limit compares with the capacity (Switch Transformer,
 * GShard) to drop the tokens past it. */
static const ir_node *capacity_cumsum(ir_graph *g, const ir_node *topk)
{
    enum { DEPTH = 8, WAVE = 64 };
    ir_uses u = ir_uses_build(g);
    if (!u.n_uses)
        return NULL;
    const ir_value *wave[WAVE];
    int n = 0;
    for (int o = 0; o < topk->n_out && n < WAVE; o++)
        if (topk->out[o])
            wave[n++] = topk->out[o];
    for (int depth = 0; depth < DEPTH && n > 0; depth++) {
        const ir_value *next[WAVE];
        int m = 0;
        for (int i = 0; i < n; i++) {
            const ir_value *v = wave[i];
            if (v->id < 0 || v->id >= g->n_values)
                continue;
            for (int q = 0; q < u.n_uses[v->id]; q++) {
                const ir_node *c = u.uses[v->id][q].node;
                if (c->dead)
                    continue;
                if (c->op == IR_OP_CUMSUM)
                    return c;
                for (int o = 0; o < c->n_out && m < WAVE; o++)
                    if (c->out[o])
                        next[m++] = c->out[o];
            }
        }
        memcpy(wave, next, sizeof(next[0]) * (size_t)m);
        n = m;
    }
    return NULL;
}

/* A TopK left after the sweep: why it is not a routed block sbpc can lower. */
static int refuse(ir_graph *g, const ir_node *topk, const char *why)
{
    char buf[256];
    const ir_node *cs = NULL;
    if (topk_crosses_softmax(topk)) {
        why = "the top-k runs over the tokens (expert-choice routing: each expert picks its "
              "tokens), not over each token's experts";
    } else if ((cs = capacity_cumsum(g, topk))) {
        snprintf(buf, sizeof buf,
                 "a capacity limit (the CumSum '%s' numbers each expert's tokens, and those "
                 "past its capacity are dropped)", cs->name ? cs->name : "?");
        why = buf;
    }
    return ir_diag_add(g->diag, IR_SEV_ERROR, topk->name, topk->op_type,
                       "a Mixture-of-Experts router sbpc does not support: %s. Supported: "
                       "softmax router, top-k experts per token (optionally renormalised), "
                       "SwiGLU experts, the weighted sum of the k outputs (docs/moe-export.md); "
                       "expert-choice routing and capacity limits that drop tokens are not",
                       why ? why : "its top-k does not feed a routed sum of expert outputs");
}

int sbp_recognize_moe(ir_graph *g)
{
    if (ir_graph_count_op(g, IR_OP_TOP_K) == 0)
        return IR_OK;
    ir_uses u = ir_uses_build(g);
    int nv = g->n_values;
    const char *why = NULL;
    int nn = g->n_nodes;
    for (int i = 0; i < nn; i++) {
        ir_node *rs = g->nodes[i];
        if (rs->dead || rs->op != IR_OP_REDUCE_SUM)
            continue;
        moe_match m = {.n = 0};
        ir_value *ops[4];
        int64_t k = 0;
        int norm = 0;
        if (!match(g, &m, rs, ops, &k, &norm)) {
            if (m.why && !why)
                why = m.why;
            continue;
        }
        /* the pieces must not be read outside the block, else they stay and nothing is gained
         * (and a dense per-token copy of the experts would still be computed) */
        bool inside = true;
        for (int j = 0; j < m.n && inside; j++) {
            ir_node *p = m.nodes[j];
            if (p == rs)
                continue;
            for (int o = 0; o < p->n_out && inside; o++) {
                ir_value *v = p->out[o];
                if (!v || v->id >= nv || v == ops[0])
                    continue;
                if (v->is_output)
                    inside = false;
                for (int q = 0; q < u.n_uses[v->id] && inside; q++) {
                    bool found = false;
                    for (int r = 0; r < m.n && !found; r++)
                        found = u.uses[v->id][q].node == m.nodes[r];
                    inside = found || u.uses[v->id][q].node->dead;
                }
            }
        }
        if (!inside) {
            if (!why)
                why = "its routing values or expert products are also read outside the block";
            continue;
        }
        /* x's producer may be one of the views passed (the experts' repetition reads it): keep
         * it */
        ir_node *keep = prod(ops[0]);
        for (int j = 0; j < m.n; j++)
            if (m.nodes[j] == keep || m.nodes[j] == rs)
                m.nodes[j] = NULL;
        ir_node *moe = rz_replace(g, IR_OP_MOE, ops, 4, rs->out[0], m.nodes, m.n);
        if (!moe)
            return IR_ERR;
        ir_attr_set_int(g, moe, "k", k);
        ir_attr_set_int(g, moe, "norm_topk", norm);
        if (ir_infer_node(g, moe) != IR_OK)
            return IR_ERR;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *t = g->nodes[i];
        if (!t->dead && t->op == IR_OP_TOP_K)
            return refuse(g, t, why);
    }
    return IR_OK;
}
