/* recognize_linear.c — projections by a weight parameter to Linear.
 *
 * Recognised (W a rank-2 float parameter; x of rank >= 1):
 *   MatMul(x, W)                              -> Linear(x, W)             W [K,N]
 *   MatMul(x, Transpose(W, perm [1,0]))       -> Linear(x, W) trans_w=1   W [N,K]
 *   Gemm(x, B, C?) alpha=1, beta=1, transA=0  -> Linear(x, W, C?) with trans_w = transB, flipped
 *                                                when B is Transpose(W)
 *   either followed by Add(out, bias) (operands in either order), bias a rank-1 float parameter
 *   or constant of N elements, which becomes the third input.
 *
 * Transpose(W) is how a tied LM head reads the embedding table, in an export without constant
 * folding and after retie.c restored the tie, so the head and the embedding share one W.
 *
 * Exporters flatten the rows for Gemm (and sometimes MatMul): Reshape(x [...,K] -> [M,K]), the
 * product, Reshape(-> [...,N]). When the first Reshape keeps the last dim and the second restores
 * x's leading dims, both are absorbed and the Linear reads x directly, so the sequence axis stays
 * visible to the passes after canonicalisation. A Reshape in front of x that changes nothing is
 * looked through as well.
 *
 * requires: bound dims, fold, dce, retie; attention already recognised (its MatMuls are gone).
 * produces: Linear(x, W, bias?) (attribute trans_w only when 1) taking over the pattern's result
 *           value (name, uses, graph-output role); replaced nodes are marked dead for dce.
 *           MatMuls whose right operand is not a parameter (attention, say) stay as they are.
 */
#include "recognize.h"

#include <string.h>

#define MAX_PAT 8

typedef struct lin_ctx {
    ir_graph *g;
    ir_uses u;   /* built at the start of the sweep */
    int nv;      /* u covers value ids below nv */
} lin_ctx;

typedef struct lin_match {
    ir_value *x, *w, *bias;
    bool trans_w;
    ir_value *result;          /* the value the Linear takes over */
    ir_node *nodes[MAX_PAT];   /* replaced nodes */
    int n;
} lin_match;

static bool used_once(const lin_ctx *c, const ir_value *v)
{
    return v && v->id < c->nv && rz_uses_exactly(&c->u, v, 1);
}

/* The only reader of v (v used once), or NULL. */
static ir_node *only_reader(const lin_ctx *c, const ir_value *v)
{
    return used_once(c, v) ? c->u.uses[v->id][0].node : NULL;
}

static void add_node(lin_match *m, ir_node *n)
{
    if (m->n < MAX_PAT)
        m->nodes[m->n++] = n;
}

static bool dim_eq(ir_dim a, ir_dim b)
{
    if (a.value >= 0 || b.value >= 0)
        return a.value == b.value;
    return a.sym && b.sym && strcmp(a.sym, b.sym) == 0;
}

/* Same rank and every dim provably equal. */
static bool shape_eq(const ir_value *a, const ir_value *b)
{
    if (a->rank < 0 || a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (!dim_eq(a->dims[i], b->dims[i]))
            return false;
    return true;
}

static bool is_weight(const ir_value *v)
{
    return v && v->kind == IR_VAL_PARAM && v->rank == 2 && ir_dtype_is_float(v->dtype) &&
           ir_value_shape_known(v);
}

/* The right operand b as a weight: a parameter, or Transpose of one (sets *flipped). The
 * Transpose is replaced too when nothing else reads it. */
static ir_value *weight_of(const lin_ctx *c, lin_match *m, ir_value *b, bool *flipped)
{
    if (is_weight(b)) {
        *flipped = false;
        return b;
    }
    ir_node *t = rz_producer(b, IR_OP_TRANSPOSE);
    if (!t || !is_weight(t->in[0]))
        return NULL;
    const ir_attr *perm = ir_attr_get(t, "perm");
    if (perm && !(perm->kind == IR_ATTR_INTS && perm->n == 2 && perm->ints[0] == 1 &&
                  perm->ints[1] == 0))
        return NULL;
    if (used_once(c, b))
        add_node(m, t);
    *flipped = true;
    return t->in[0];
}

/* A bias for an N-wide output: a rank-1 float parameter or constant of N elements. */
static bool is_bias(const ir_value *v, int64_t n)
{
    return v && (v->kind == IR_VAL_PARAM || ir_value_is_const(v)) && ir_dtype_is_float(v->dtype) &&
           v->rank == 1 && v->dims[0].value == n;
}

/* Looks for Reshape(x -> [M,K]) in front and Reshape(-> x's leading dims + [N]) after the
 * current result, and absorbs both. */
static void absorb_flatten(const lin_ctx *c, lin_match *m, int64_t n_out)
{
    ir_node *pre = rz_producer(m->x, IR_OP_RESHAPE);
    if (!pre || !used_once(c, m->x) || m->x->rank != 2)
        return;
    ir_value *x0 = pre->in[0];
    if (!x0 || x0->rank < 2 || !dim_eq(x0->dims[x0->rank - 1], m->x->dims[1]))
        return;
    ir_node *post = only_reader(c, m->result);
    if (!post || post->op != IR_OP_RESHAPE || post->in[0] != m->result || !post->out[0])
        return;
    ir_value *y = post->out[0];
    if (y->rank != x0->rank || y->dims[y->rank - 1].value != n_out)
        return;
    for (int i = 0; i < x0->rank - 1; i++)
        if (!dim_eq(y->dims[i], x0->dims[i]))
            return;
    add_node(m, pre);
    add_node(m, post);
    m->x = x0;
    m->result = y;
}

/* MatMul(x, W) / Gemm(x, W, C) at n, with the bias Add and the flattening Reshapes. */
static bool match_linear(const lin_ctx *c, ir_node *n, lin_match *m)
{
    memset(m, 0, sizeof *m);
    if (n->n_in < 2 || !n->in[0] || !n->in[1] || !n->out[0])
        return false;
    add_node(m, n);
    bool flipped;
    m->w = weight_of(c, m, n->in[1], &flipped);
    m->x = n->in[0];
    if (!m->w || m->x->rank < 1 || !ir_dtype_is_float(m->x->dtype))
        return false;
    if (n->op == IR_OP_GEMM) {
        if (ir_attr_int(n, "transA", 0) != 0 || ir_attr_float(n, "alpha", 1.0) != 1.0)
            return false;
        m->trans_w = (ir_attr_int(n, "transB", 0) != 0) != flipped;
        if (n->n_in > 2 && n->in[2]) {
            if (ir_attr_float(n, "beta", 1.0) != 1.0)
                return false;
            m->bias = n->in[2];
        }
    } else {
        m->trans_w = flipped;
    }
    int64_t k = m->w->dims[m->trans_w ? 1 : 0].value, n_out = m->w->dims[m->trans_w ? 0 : 1].value;
    int64_t xk = m->x->dims[m->x->rank - 1].value;
    if (xk >= 0 && xk != k)
        return false; /* unknown (unbound dims, unfolded shape arithmetic) is fine: MatMul checks */
    if (m->bias && !is_bias(m->bias, n_out))
        return false;
    m->result = n->out[0];
    if (!m->bias) {
        ir_node *add = only_reader(c, m->result);
        ir_value *b = add && add->op == IR_OP_ADD ? rz_other(add, m->result) : NULL;
        if (b && b != m->result && is_bias(b, n_out) && add->out[0] &&
            shape_eq(add->out[0], m->result)) {
            m->bias = b;
            m->result = add->out[0];
            add_node(m, add);
        }
    }
    absorb_flatten(c, m, n_out);
    /* Reshape(x0 -> the same shape) in front of x: read x0. */
    ir_node *noop = rz_producer(m->x, IR_OP_RESHAPE);
    if (noop && noop->in[0] && shape_eq(noop->in[0], m->x) && ir_value_shape_known(m->x)) {
        if (used_once(c, m->x))
            add_node(m, noop);
        m->x = noop->in[0];
    }
    return true;
}

int sbp_recognize_linear(ir_graph *g)
{
    lin_ctx c = {.g = g, .u = ir_uses_build(g), .nv = g->n_values};
    if (!c.u.n_uses)
        return ir_diag_error(g->diag, "out of memory building use lists");
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        lin_match m;
        if (n->dead || (n->op != IR_OP_MATMUL && n->op != IR_OP_GEMM) || !match_linear(&c, n, &m))
            continue;
        ir_value *in[3] = {m.x, m.w, m.bias};
        ir_node *l = rz_replace(g, IR_OP_LINEAR, in, m.bias ? 3 : 2, m.result, m.nodes, m.n);
        if (!l)
            return ir_diag_error(g->diag, "out of memory");
        if (m.trans_w)
            ir_attr_set_int(g, l, "trans_w", 1);
        if (ir_infer_node(g, l) != IR_OK)
            return IR_ERR;
    }
    return IR_OK;
}
