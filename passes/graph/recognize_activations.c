/* recognize_activations.c — GELU (tanh and erf forms), SiLU and SwiGLU.
 *
 * Recognised:
 *   Gelu(x) of ONNX (opset 20) attr approximate "none" | "tanh" -> Gelu(x), the same attribute
 *                                                              (absent: "none", as ONNX says)
 *   0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))   -> Gelu(x) approximate="tanh"
 *   0.5 * x * (1 + erf(x / sqrt(2)))                           -> Gelu(x) approximate="none"
 *   x * Sigmoid(x)                                             -> Silu(x)
 *   Silu(gate) * up                                            -> SwiGLU(gate, up)
 *
 * The GELU matcher does not follow one fixed node order. The outer expression is flattened as a
 * product (Mul, and Div by a constant) of a constant coefficient, x and U = 1 + tanh(p) (or erf);
 * p is evaluated as a polynomial in x (Add, Sub, Mul, Div by a constant, Pow by 1..3) and its
 * coefficients compared with the formula's, relative tolerance 1e-6. So GPT-2's
 * Mul(Mul(x, 0.5), Add(Tanh(Mul(Add(x, Mul(Pow(x, 3), 0.044715)), 0.79788)), 1)), the
 * distributed k*x + k*a*x^3, x*x*x for the cube and any operand order all match. Only
 * intermediates used once are looked into, so x (used two or three times) is never mistaken for
 * part of the expression, and a partial match fails on its coefficient.
 *
 * ONNX's Gelu is converted first, so the SwiGLU sweep never sees it (a Gelu is not a Silu); an
 * approximate other than "none" or "tanh" is an error naming the node. It is converted here and
 * not evaluated by fold: a Gelu of constants (none in the exported LMs) becomes a semantic Gelu
 * of constants, which the training step computes like any other node.
 * SiLU and GELU run in one sweep; SwiGLU in a second one over the Silu nodes the first made (and
 * any already there). The Silu node is absorbed into the SwiGLU when nothing else reads it.
 * SwiGLU requires gate and up of the same type (no broadcasting).
 *
 * requires: bound dims, fold (the constants are constants), dce; norms already recognised.
 * produces: Gelu / Silu / SwiGLU taking over the pattern's result value (name, uses, graph-output
 *           role); replaced nodes are marked dead for dce to drop.
 */
#include "recognize.h"

#include <math.h>
#include <string.h>

#define MAX_PAT 32
#define MAX_DEPTH 12 /* recursion bound of the matchers */

static const double SQRT_2_OVER_PI = 0.79788456080286535588; /* sqrt(2/pi) */
static const double SQRT_1_2 = 0.70710678118654752440;       /* 1/sqrt(2) */

typedef struct act_ctx {
    ir_graph *g;
    ir_uses u;   /* built at the start of the sweep */
    int nv;      /* u covers value ids below nv */
} act_ctx;

typedef struct act_match {
    ir_node *nodes[MAX_PAT];
    int n;
} act_match;

/* ------------------------------------------------------------------ helpers */

static ir_node *producer(const ir_value *v)
{
    if (!v || v->kind != IR_VAL_NODE || !v->producer || v->producer->dead)
        return NULL;
    return v->producer;
}

static bool used_once(const act_ctx *c, const ir_value *v)
{
    return v && v->id < c->nv && rz_uses_exactly(&c->u, v, 1);
}

static bool add_node(act_match *m, ir_node *n)
{
    for (int i = 0; i < m->n; i++)
        if (m->nodes[i] == n)
            return true;
    if (m->n >= MAX_PAT)
        return false;
    m->nodes[m->n++] = n;
    return true;
}

static bool near(double got, double want)
{
    return fabs(got - want) <= 1e-6 * fabs(want);
}

/* x and y have the same dtype and rank and no known dims that differ. */
static bool same_type(const ir_value *x, const ir_value *y)
{
    if (!x || !y || x->dtype != y->dtype || x->rank < 0 || x->rank != y->rank)
        return false;
    for (int i = 0; i < x->rank; i++)
        if (x->dims[i].value >= 0 && y->dims[i].value >= 0 && x->dims[i].value != y->dims[i].value)
            return false;
    return true;
}

/* ------------------------------------------------------------------ GELU */

/* A product of factors: coef * prod(v[i] ^ e[i]). */
typedef struct product {
    double coef;
    ir_value *v[4];
    int e[4];
    int n;
} product;

static bool product_leaf(product *p, ir_value *v, int e)
{
    for (int i = 0; i < p->n; i++)
        if (p->v[i] == v) {
            p->e[i] += e;
            return true;
        }
    if (p->n == 4)
        return false;
    p->v[p->n] = v;
    p->e[p->n++] = e;
    return true;
}

/* Flattens v into p: Mul, Div by a constant and Pow by a small integer are looked into when
 * is_root or v is used once; everything else is a leaf. */
static bool flatten_product(const act_ctx *c, act_match *m, ir_value *v, bool is_root, int depth,
                            product *p)
{
    double k;
    if (rz_const_scalar(v, &k)) {
        p->coef *= k;
        return true;
    }
    ir_node *n = producer(v);
    if (!n || depth > MAX_DEPTH || !(is_root || used_once(c, v)))
        return product_leaf(p, v, 1);
    if (n->op == IR_OP_MUL)
        return add_node(m, n) && flatten_product(c, m, n->in[0], false, depth + 1, p) &&
               flatten_product(c, m, n->in[1], false, depth + 1, p);
    if (n->op == IR_OP_DIV && rz_const_scalar(n->in[1], &k) && k != 0) {
        p->coef /= k;
        return add_node(m, n) && flatten_product(c, m, n->in[0], false, depth + 1, p);
    }
    if (n->op == IR_OP_POW && rz_const_scalar(n->in[1], &k) && (k == 1 || k == 2 || k == 3) &&
        !rz_const_scalar(n->in[0], &k))
        return add_node(m, n) && product_leaf(p, n->in[0], (int)k);
    return product_leaf(p, v, 1);
}

/* v as a polynomial of degree <= 3 in x: v = sum c[i] x^i. Looks into single-use Add, Sub, Mul,
 * Div by a constant, Neg and Pow by 1..3. */
static bool poly(const act_ctx *c, act_match *m, ir_value *v, const ir_value *x, int depth,
                 double out[4])
{
    double k;
    memset(out, 0, 4 * sizeof out[0]);
    if (v == x) {
        out[1] = 1;
        return true;
    }
    if (rz_const_scalar(v, &k)) {
        out[0] = k;
        return true;
    }
    ir_node *n = producer(v);
    if (!n || depth > MAX_DEPTH || !used_once(c, v) || !add_node(m, n))
        return false;
    double a[4], b[4];
    switch (n->op) {
    case IR_OP_ADD:
    case IR_OP_SUB:
        if (!poly(c, m, n->in[0], x, depth + 1, a) || !poly(c, m, n->in[1], x, depth + 1, b))
            return false;
        for (int i = 0; i < 4; i++)
            out[i] = n->op == IR_OP_ADD ? a[i] + b[i] : a[i] - b[i];
        return true;
    case IR_OP_NEG:
        if (!poly(c, m, n->in[0], x, depth + 1, a))
            return false;
        for (int i = 0; i < 4; i++)
            out[i] = -a[i];
        return true;
    case IR_OP_MUL:
        if (!poly(c, m, n->in[0], x, depth + 1, a) || !poly(c, m, n->in[1], x, depth + 1, b))
            return false;
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                if (i + j <= 3)
                    out[i + j] += a[i] * b[j];
                else if (a[i] != 0 && b[j] != 0)
                    return false;
            }
        return true;
    case IR_OP_DIV:
        if (!rz_const_scalar(n->in[1], &k) || k == 0 || !poly(c, m, n->in[0], x, depth + 1, a))
            return false;
        for (int i = 0; i < 4; i++)
            out[i] = a[i] / k;
        return true;
    case IR_OP_POW: {
        if (!rz_const_scalar(n->in[1], &k) || !(k == 1 || k == 2 || k == 3) ||
            !poly(c, m, n->in[0], x, depth + 1, a))
            return false;
        double r[4] = {1, 0, 0, 0};
        for (int e = 0; e < (int)k; e++) {
            double t[4] = {0, 0, 0, 0};
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) {
                    if (i + j <= 3)
                        t[i + j] += r[i] * a[j];
                    else if (r[i] != 0 && a[j] != 0)
                        return false;
                }
            memcpy(r, t, sizeof r);
        }
        memcpy(out, r, sizeof r);
        return true;
    }
    default:
        return false;
    }
}

/* u == 1 + Tanh(p) or 1 + Erf(p), both used once; returns Tanh/Erf's node. */
static ir_node *match_one_plus(const act_ctx *c, act_match *m, ir_value *u)
{
    ir_node *add = rz_producer(u, IR_OP_ADD);
    if (!add || !used_once(c, u))
        return NULL;
    for (int k = 0; k < 2; k++) {
        double one;
        ir_node *f = producer(add->in[k]);
        if (f && (f->op == IR_OP_TANH || f->op == IR_OP_ERF) && used_once(c, add->in[k]) &&
            rz_const_scalar(add->in[1 - k], &one) && one == 1.0)
            return add_node(m, add) && add_node(m, f) ? f : NULL;
    }
    return NULL;
}

/* root's output is GELU(x): returns x and sets *approx. */
static ir_value *match_gelu(const act_ctx *c, act_match *m, ir_node *root, const char **approx)
{
    product p = {.coef = 1};
    m->n = 0;
    if (!add_node(m, root) || !flatten_product(c, m, root->out[0], true, 0, &p))
        return NULL;
    if (p.n != 2 || p.e[0] != 1 || p.e[1] != 1 || !near(p.coef, 0.5))
        return NULL;
    for (int k = 0; k < 2; k++) {
        ir_value *x = p.v[k];
        int saved = m->n;
        ir_node *f = match_one_plus(c, m, p.v[1 - k]);
        double q[4];
        if (!f || !ir_dtype_is_float(x->dtype) || !poly(c, m, f->in[0], x, 0, q)) {
            m->n = saved;
            continue;
        }
        double scale = fabs(q[1]);
        if (fabs(q[0]) > 1e-6 * scale || fabs(q[2]) > 1e-6 * scale) {
            m->n = saved;
            continue;
        }
        if (f->op == IR_OP_TANH && near(q[1], SQRT_2_OVER_PI) &&
            near(q[3], SQRT_2_OVER_PI * 0.044715)) {
            *approx = "tanh";
            return x;
        }
        if (f->op == IR_OP_ERF && near(q[1], SQRT_1_2) && fabs(q[3]) <= 1e-6 * scale) {
            *approx = "none";
            return x;
        }
        m->n = saved;
    }
    return NULL;
}

/* ------------------------------------------------------------------ SiLU, SwiGLU */

/* root == Mul(x, Sigmoid(x)) in either order, the Sigmoid used once: returns x. */
static ir_value *match_silu(const act_ctx *c, act_match *m, ir_node *root)
{
    for (int k = 0; k < 2; k++) {
        ir_node *s = rz_producer(root->in[k], IR_OP_SIGMOID);
        if (s && s->in[0] == root->in[1 - k] && used_once(c, root->in[k])) {
            m->n = 0;
            return add_node(m, root) && add_node(m, s) ? s->in[0] : NULL;
        }
    }
    return NULL;
}

static int rewrite(ir_graph *g, ir_op op, ir_value *const *in, int n_in, ir_node *root,
                   const act_match *m, const char *approx)
{
    if (!same_type(in[0], root->out[0]))
        return IR_OK; /* a broadcast made the result bigger than x: leave it */
    ir_node *n = rz_replace(g, op, in, n_in, root->out[0], m->nodes, m->n);
    if (!n)
        return ir_diag_error(g->diag, "out of memory");
    if (approx)
        ir_attr_set_string(g, n, "approximate", approx);
    return ir_infer_node(g, n);
}

/* ONNX Gelu -> the semantic Gelu, with the attribute spelled out as the matcher writes it. */
static int convert_onnx_gelu(ir_graph *g, ir_node *n)
{
    const ir_attr *a = ir_attr_get(n, "approximate");
    const char *approx = a ? (a->kind == IR_ATTR_STRING ? a->s : NULL) : "none";
    if (!approx || (strcmp(approx, "none") != 0 && strcmp(approx, "tanh") != 0))
        return ir_diag_add(g->diag, IR_SEV_ERROR, n->name, n->op_type,
                           "Gelu: approximate must be \"none\" or \"tanh\", not %s%s%s",
                           approx ? "\"" : "", approx ? approx : "a non-string attribute",
                           approx ? "\"" : "");
    ir_node *r = rz_replace(g, IR_OP_GELU, n->in, 1, n->out[0], &n, 1);
    if (!r)
        return ir_diag_error(g->diag, "out of memory");
    ir_attr_set_string(g, r, "approximate", approx);
    return ir_infer_node(g, r);
}

int sbp_recognize_activations(ir_graph *g)
{
    /* Sweep 0: ONNX's own Gelu. */
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        if (!n->dead && n->op == IR_OP_GELU_ONNX && n->out[0] &&
            convert_onnx_gelu(g, n) != IR_OK)
            return IR_ERR;
    }
    act_ctx c = {.g = g, .u = ir_uses_build(g), .nv = g->n_values};
    if (!c.u.n_uses)
        return ir_diag_error(g->diag, "out of memory building use lists");
    /* Sweep 1: Gelu and Silu, each rooted at its last Mul. */
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        if (n->dead || n->op != IR_OP_MUL || !n->out[0])
            continue;
        act_match m = {0};
        const char *approx = NULL;
        ir_value *x;
        if ((x = match_gelu(&c, &m, n, &approx))) {
            if (rewrite(g, IR_OP_GELU, &x, 1, n, &m, approx) != IR_OK)
                return IR_ERR;
        } else if ((x = match_silu(&c, &m, n))) {
            if (rewrite(g, IR_OP_SILU, &x, 1, n, &m, NULL) != IR_OK)
                return IR_ERR;
        }
    }
    /* Sweep 2: SwiGLU over the Silu nodes, with fresh use lists. */
    c.u = ir_uses_build(g);
    c.nv = g->n_values;
    if (!c.u.n_uses)
        return ir_diag_error(g->diag, "out of memory building use lists");
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        if (n->dead || n->op != IR_OP_MUL || !n->out[0])
            continue;
        for (int k = 0; k < 2; k++) {
            ir_node *s = rz_producer(n->in[k], IR_OP_SILU);
            ir_value *up = n->in[1 - k];
            if (!s || up == n->in[k] || ir_value_is_const(up) || !same_type(s->in[0], up))
                continue;
            act_match m = {.nodes = {n}, .n = 1};
            if (used_once(&c, n->in[k]))
                add_node(&m, s);
            ir_value *in[2] = {s->in[0], up};
            if (rewrite(g, IR_OP_SWIGLU, in, 2, n, &m, NULL) != IR_OK)
                return IR_ERR;
            break;
        }
    }
    return IR_OK;
}
