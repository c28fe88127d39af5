/* recognize_norms.c — LayerNorm and RMSNorm, as ONNX ops or spelled out elementwise.
 *
 * Recognised (the reduction must be over the last axis only, with keepdims):
 *   LayerNormalization(x, scale, bias?) axis -1   (opset 17; outputs 1 and 2 unused)
 *                                                  -> LayerNorm(x, scale, bias?)
 *   SimplifiedLayerNormalization / RMSNormalization(x, scale) axis -1
 *                                                  -> RMSNorm(x, scale)
 *   the decomposed forms that TorchScript writes below opset 17 and for Hugging Face RMSNorm:
 *     d = x - ReduceMean(x);  y = d * rsqrt(ReduceMean(d^2) + eps)     -> LayerNorm
 *     y = x * rsqrt(ReduceMean(x^2) + eps)                             -> RMSNorm
 *   each optionally followed by Mul(gamma) (either operand order) and, for LayerNorm, Add(beta).
 *   "rsqrt(a) * t" may be written Div(t, Sqrt(a)), Mul(t, Reciprocal(Sqrt(a))),
 *   Mul(t, Div(1, Sqrt(a))), Mul(t, Pow(a, -0.5)) or Div(t, Pow(a, 0.5)); the square may be
 *   Pow(t, 2) or Mul(t, t); the epsilon Add takes its constant on either side.
 *
 * Hugging Face's RMSNorm up-casts (`hidden_states.to(torch.float32)`) before and casts back
 * after; in a float32 export those are Casts to the dtype the value already has. A same-dtype
 * Cast after the normalisation is absorbed; one in front (x' = Cast(x)) is an identity, so the
 * norm reads x and every other use of x' (the residual branch, typically) is pointed at x, which
 * leaves the Cast dead. A Cast that really converts stays, and the norm reads its output.
 *
 * gamma and beta are rank-1 float parameters or constants of the normalised size D. A
 * LayerNorm without gamma gets a constant ones gamma (the op requires one). Every intermediate
 * value must be used only inside the pattern; otherwise the pattern is left alone.
 *
 * requires: bound dims (D known), fold (epsilon and exponents are constants), dce.
 * produces: LayerNorm(x, gamma, beta?) / RMSNorm(x, gamma?) with attribute epsilon (float). The
 *           semantic node takes over the pattern's result value (its name, its uses, its
 *           graph-output role); the replaced nodes are marked dead for dce to drop.
 */
#include "recognize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PAT 24 /* nodes in one pattern; the longest spelling has 10 */

typedef struct norm_ctx {
    ir_graph *g;
    ir_uses u;   /* built at the start of the sweep */
    int nv;      /* values that existed then: u covers ids below nv */
} norm_ctx;

typedef struct norm_match {
    ir_op op;            /* IR_OP_LAYER_NORM or IR_OP_RMS_NORM */
    ir_value *x;         /* normalised input [..., D] */
    ir_value *gamma;     /* [D] or NULL */
    ir_value *beta;      /* [D] or NULL (LayerNorm only) */
    double eps;
    ir_node *cast_in;    /* same-dtype Cast in front of the pattern whose other uses move to x */
    ir_node *nodes[MAX_PAT];
    int n;
} norm_match;

/* ------------------------------------------------------------------ small predicates */

static ir_node *producer(const ir_value *v)
{
    if (!v || v->kind != IR_VAL_NODE || !v->producer || v->producer->dead)
        return NULL;
    return v->producer;
}

static int n_uses(const norm_ctx *c, const ir_value *v)
{
    if (!v || v->id >= c->nv || v->is_output)
        return -1;
    return c->u.n_uses[v->id];
}

static bool used_once(const norm_ctx *c, const ir_value *v) { return n_uses(c, v) == 1; }

static bool add_node(norm_match *m, ir_node *n)
{
    if (m->n >= MAX_PAT)
        return false;
    m->nodes[m->n++] = n;
    return true;
}

static bool contains(const norm_match *m, const ir_node *n)
{
    for (int i = 0; i < m->n; i++)
        if (m->nodes[i] == n)
            return true;
    return false;
}

static int64_t last_dim(const ir_value *v)
{
    return v && v->rank >= 1 ? v->dims[v->rank - 1].value : -1;
}

/* A Cast to the dtype its input already has: an identity. */
static ir_node *same_dtype_cast(const ir_value *v)
{
    ir_node *n = rz_producer(v, IR_OP_CAST);
    if (!n || !n->in[0] || n->in[0]->dtype == IR_DT_UNDEFINED)
        return NULL;
    return ir_attr_int(n, "to", -1) == (int64_t)n->in[0]->dtype ? n : NULL;
}

static bool is_const_near(const ir_value *v, double want)
{
    double c;
    return rz_const_scalar(v, &c) && fabs(c - want) <= 1e-6 * fabs(want);
}

/* gamma or beta: a rank-1 float parameter or constant of d elements. */
static bool affine_operand(const ir_value *v, int64_t d)
{
    return v && (v->kind == IR_VAL_PARAM || ir_value_is_const(v)) && ir_dtype_is_float(v->dtype) &&
           v->rank == 1 && d > 0 && v->dims[0].value == d;
}

/* A ReduceMean over the last axis only, keeping dims (axes from the attribute, or from a
 * constant second input as of opset 18). */
static bool mean_last_axis(const ir_node *n)
{
    if (!n || n->op != IR_OP_REDUCE_MEAN || !n->in[0] || n->in[0]->rank < 1)
        return false;
    if (ir_attr_int(n, "keepdims", 1) != 1)
        return false;
    int64_t axis, rank = n->in[0]->rank;
    const ir_attr *a = ir_attr_get(n, "axes");
    if (a && a->kind == IR_ATTR_INTS && a->n == 1) {
        axis = a->ints[0];
    } else if (!a && n->n_in > 1 && ir_value_is_const(n->in[1]) &&
               ir_dtype_is_int(n->in[1]->dtype) && ir_value_numel(n->in[1]) == 1) {
        axis = ir_const_i64(n->in[1], 0);
    } else {
        return false; /* no axes: all of them; several axes: not a norm */
    }
    return axis == -1 || axis == rank - 1;
}

/* ------------------------------------------------------------------ the core: t * rsqrt(var+eps) */

/* s == t*t: Pow(t, 2) or Mul(t, t). Returns t and the number of times s's node reads t. */
static ir_value *match_square(ir_node *s, int *reads)
{
    if (s && s->op == IR_OP_POW && is_const_near(s->in[1], 2.0)) {
        *reads = 1;
        return s->in[0];
    }
    if (s && s->op == IR_OP_MUL && s->in[0] == s->in[1]) {
        *reads = 2;
        return s->in[0];
    }
    return NULL;
}

/* a == ReduceMean(t^2, last axis) + eps, each intermediate used once. Sets *t, *sq_reads. */
static bool match_variance(const norm_ctx *c, norm_match *m, ir_value *a, ir_value **t,
                           int *sq_reads)
{
    ir_node *add = rz_producer(a, IR_OP_ADD);
    if (!add || !used_once(c, a))
        return false;
    int k;
    for (k = 0; k < 2; k++)
        if (rz_const_scalar(add->in[1 - k], &m->eps) && m->eps >= 0)
            break;
    if (k == 2)
        return false;
    ir_value *var = add->in[k];
    ir_node *mean = rz_producer(var, IR_OP_REDUCE_MEAN);
    if (!mean_last_axis(mean) || !used_once(c, var))
        return false;
    ir_node *sq = producer(mean->in[0]);
    if (!used_once(c, mean->in[0]) || !(*t = match_square(sq, sq_reads)))
        return false;
    return add_node(m, add) && add_node(m, mean) && add_node(m, sq);
}

/* y == t * rsqrt(var + eps) in one of the spellings in the file comment; y's producer is the
 * first node added. Returns t. */
static ir_value *match_normalized(const norm_ctx *c, norm_match *m, ir_value *y, int *sq_reads)
{
    ir_node *root = producer(y);
    if (!root)
        return NULL;
    ir_value *t = NULL, *a = NULL;
    int start = m->n;
    if (root->op == IR_OP_DIV) {
        /* Div(t, Sqrt(a)) or Div(t, Pow(a, 0.5)) */
        ir_value *den = root->in[1];
        ir_node *sq = rz_producer(den, IR_OP_SQRT), *pw = rz_producer(den, IR_OP_POW);
        if (!used_once(c, den))
            return NULL;
        if (sq)
            a = sq->in[0];
        else if (pw && is_const_near(pw->in[1], 0.5))
            a = pw->in[0];
        else
            return NULL;
        t = root->in[0];
        if (!add_node(m, root) || !add_node(m, sq ? sq : pw))
            return NULL;
    } else if (root->op == IR_OP_MUL) {
        /* Mul(t, r), r = Reciprocal(Sqrt(a)) | Div(1, Sqrt(a)) | Pow(a, -0.5) */
        for (int k = 0; k < 2 && !a; k++) {
            ir_value *r = root->in[k];
            ir_node *rn = producer(r), *sq = NULL;
            if (!rn || !used_once(c, r))
                continue;
            m->n = start;
            if (rn->op == IR_OP_POW && is_const_near(rn->in[1], -0.5)) {
                a = rn->in[0];
            } else if ((rn->op == IR_OP_RECIPROCAL ||
                        (rn->op == IR_OP_DIV && is_const_near(rn->in[0], 1.0))) &&
                       (sq = rz_producer(rn->op == IR_OP_DIV ? rn->in[1] : rn->in[0],
                                         IR_OP_SQRT)) &&
                       used_once(c, sq->out[0])) {
                a = sq->in[0];
            } else {
                continue;
            }
            t = root->in[1 - k];
            if (!add_node(m, root) || !add_node(m, rn) || (sq && !add_node(m, sq)))
                return NULL;
        }
        if (!a)
            return NULL;
    } else {
        return NULL;
    }
    ir_value *t2;
    if (!match_variance(c, m, a, &t2, sq_reads) || t2 != t)
        return NULL;
    return t;
}

/* Fills m from the normalised value y (before gamma): decides LayerNorm (t = x - mean(x)) or
 * RMSNorm (t = x, or a same-dtype Cast of x), absorbing a same-dtype Cast after y. */
static bool match_core(const norm_ctx *c, norm_match *m, ir_value *y)
{
    ir_node *cast_out = same_dtype_cast(y);
    if (cast_out) {
        if (!used_once(c, cast_out->in[0]) || !add_node(m, cast_out))
            return false;
        y = cast_out->in[0];
    }
    int sq_reads = 0;
    ir_value *t = match_normalized(c, m, y, &sq_reads);
    if (!t || !ir_dtype_is_float(t->dtype) || last_dim(t) <= 0)
        return false;
    /* LayerNorm: t = Sub(x, ReduceMean(x)), t read only by the square and the normalisation. */
    ir_node *sub = rz_producer(t, IR_OP_SUB);
    ir_node *mu = sub ? rz_producer(sub->in[1], IR_OP_REDUCE_MEAN) : NULL;
    if (mu && mu->in[0] == sub->in[0] && mean_last_axis(mu) && used_once(c, sub->in[1]) &&
        n_uses(c, t) == sq_reads + 1) {
        m->op = IR_OP_LAYER_NORM;
        m->x = sub->in[0];
        return add_node(m, sub) && add_node(m, mu);
    }
    m->op = IR_OP_RMS_NORM;
    m->x = t;
    ir_node *cast_in = same_dtype_cast(t);
    if (cast_in && !t->is_output) {
        m->cast_in = cast_in;
        m->x = cast_in->in[0];
    }
    return true;
}

/* The whole pattern with root n: Add(Mul(core, gamma), beta), Add(core, beta) (LayerNorm),
 * Mul(core, gamma), or the core alone. */
static bool match_norm(const norm_ctx *c, ir_node *n, norm_match *m)
{
    memset(m, 0, sizeof *m);
    if (n->dead || n->n_out < 1 || !n->out[0])
        return false;
    if (n->op == IR_OP_ADD) {
        for (int k = 0; k < 2; k++) {
            ir_value *p = n->in[k], *beta = n->in[1 - k];
            if (!used_once(c, p) || !(beta->kind == IR_VAL_PARAM || ir_value_is_const(beta)))
                continue;
            memset(m, 0, sizeof *m);
            add_node(m, n);
            ir_node *mul = rz_producer(p, IR_OP_MUL);
            bool ok = false;
            for (int j = 0; mul && j < 2 && !ok; j++) {
                m->n = 1;
                m->gamma = mul->in[1 - j];
                ok = (m->gamma->kind == IR_VAL_PARAM || ir_value_is_const(m->gamma)) &&
                     used_once(c, mul->in[j]) && add_node(m, mul) && match_core(c, m, mul->in[j]);
            }
            if (!ok) {
                m->n = 1;
                m->gamma = NULL;
                ok = match_core(c, m, p);
            }
            int64_t d = last_dim(m->x);
            if (ok && m->op == IR_OP_LAYER_NORM && affine_operand(beta, d) &&
                (!m->gamma || affine_operand(m->gamma, d))) {
                m->beta = beta;
                return true;
            }
        }
        return false;
    }
    if (n->op == IR_OP_MUL) {
        for (int k = 0; k < 2; k++) {
            ir_value *y = n->in[k], *gamma = n->in[1 - k];
            if (!(gamma->kind == IR_VAL_PARAM || ir_value_is_const(gamma)) || !used_once(c, y))
                continue;
            memset(m, 0, sizeof *m);
            add_node(m, n);
            if (match_core(c, m, y) && affine_operand(gamma, last_dim(m->x))) {
                m->gamma = gamma;
                return true;
            }
        }
    }
    if (n->op == IR_OP_MUL || n->op == IR_OP_DIV || n->op == IR_OP_CAST) {
        memset(m, 0, sizeof *m);
        return match_core(c, m, n->out[0]);
    }
    return false;
}

/* ------------------------------------------------------------------ rewriting */

/* x and y have the same dtype and rank and no known dims that differ. */
static bool same_type(const ir_value *x, const ir_value *y)
{
    if (x->dtype != y->dtype || x->rank < 0 || x->rank != y->rank)
        return false;
    for (int i = 0; i < x->rank; i++)
        if (x->dims[i].value >= 0 && y->dims[i].value >= 0 && x->dims[i].value != y->dims[i].value)
            return false;
    return true;
}

/* A constant [d] of ones in dtype dt (float or double), or NULL. */
static ir_value *ones_like_gamma(ir_graph *g, ir_dtype dt, int64_t d)
{
    size_t es = ir_dtype_size(dt);
    if ((dt != IR_DT_FLOAT && dt != IR_DT_DOUBLE) || d <= 0)
        return NULL;
    char *buf = malloc((size_t)d * es);
    if (!buf)
        return NULL;
    for (int64_t i = 0; i < d; i++) {
        if (dt == IR_DT_FLOAT)
            ((float *)buf)[i] = 1.0f;
        else
            ((double *)buf)[i] = 1.0;
    }
    ir_value *v = ir_const_new(g, "layernorm_ones", dt, 1, &d, buf);
    free(buf);
    return v;
}

/* Rewrites the match rooted at root. IR_OK also when it turns out not to apply. */
static int commit(ir_graph *g, norm_match *m, ir_node *root)
{
    if (!same_type(m->x, root->out[0]))
        return IR_OK; /* a broadcast in the pattern changed the shape: not a norm */
    ir_value *gamma = m->gamma;
    if (m->op == IR_OP_LAYER_NORM && !gamma &&
        !(gamma = ones_like_gamma(g, m->x->dtype, last_dim(m->x))))
        return IR_OK;
    ir_value *in[3] = {m->x, gamma, m->beta};
    int n_in = m->op == IR_OP_LAYER_NORM ? (m->beta ? 3 : 2) : (gamma ? 2 : 1);
    if (m->cast_in) {
        /* The Cast is an identity: its other readers (the residual) read x instead. */
        ir_replace_uses(g, m->cast_in->out[0], m->x);
        add_node(m, m->cast_in);
    }
    ir_node *n = rz_replace(g, m->op, in, n_in, root->out[0], m->nodes, m->n);
    if (!n)
        return ir_diag_error(g->diag, "out of memory");
    ir_attr_set_float(g, n, "epsilon", m->eps);
    return ir_infer_node(g, n);
}

/* The ONNX normalisation ops. Returns IR_OK whether or not n was rewritten. */
static int onnx_norm(const norm_ctx *c, ir_node *n)
{
    ir_graph *g = c->g;
    ir_value *x = n->in[0];
    if (!x || x->rank < 1 || !n->out[0])
        return IR_OK;
    int64_t axis = ir_attr_int(n, "axis", -1);
    if (axis != -1 && axis != x->rank - 1)
        return IR_OK;
    for (int i = 1; i < n->n_out; i++)
        if (n->out[i] && (n->out[i]->is_output || n_uses(c, n->out[i]) != 0))
            return IR_OK; /* mean / inv-std-dev read by someone */
    norm_match m = {.eps = ir_attr_float(n, "epsilon", 1e-5), .x = x, .gamma = n->in[1]};
    if (n->op == IR_OP_LAYER_NORMALIZATION) {
        m.op = IR_OP_LAYER_NORM;
        m.beta = n->n_in > 2 ? n->in[2] : NULL;
    } else {
        m.op = IR_OP_RMS_NORM;
    }
    int64_t d = last_dim(x);
    if (!affine_operand(m.gamma, d) || (m.beta && !affine_operand(m.beta, d)))
        return IR_OK; /* a scale over more than the last axis, say */
    add_node(&m, n);
    return commit(g, &m, n);
}

int sbp_recognize_norms(ir_graph *g)
{
    norm_ctx c = {.g = g, .u = ir_uses_build(g), .nv = g->n_values};
    if (!c.u.n_uses)
        return ir_diag_error(g->diag, "out of memory building use lists");
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        if (n->op == IR_OP_LAYER_NORMALIZATION || n->op == IR_OP_SIMPLIFIED_LAYER_NORM ||
            n->op == IR_OP_RMS_NORMALIZATION) {
            if (onnx_norm(&c, n) != IR_OK)
                return IR_ERR;
            continue;
        }
        norm_match m;
        if (!match_norm(&c, n, &m))
            continue;
        /* Prefer the larger pattern: when this node's only reader (past same-dtype Casts) is the
         * root of a match that contains it, that root will be rewritten when the loop gets there. */
        ir_value *o = n->out[0];
        ir_node *next = NULL;
        while (used_once(&c, o)) {
            next = c.u.uses[o->id][0].node;
            if (!same_dtype_cast(next->out[0]) || next->n_out != 1)
                break;
            o = next->out[0];
        }
        norm_match bigger;
        if (next && match_norm(&c, next, &bigger) && contains(&bigger, n))
            continue;
        if (commit(g, &m, n) != IR_OK)
            return IR_ERR;
    }
    return IR_OK;
}
