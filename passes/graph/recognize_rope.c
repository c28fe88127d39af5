/* recognize_rope.c — rotary position embeddings (rotate-half convention) to Rope.
 *
 * Hugging Face's apply_rotary_pos_emb (GPT-NeoX, Llama, Qwen, Mistral, ...) computes
 *
 *     out = x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x[..., h:], x[..., :h])
 *
 * with h = hd / 2, x [B,H,T,hd] and cos/sin tables that the exporter gathers from a cached
 * buffer by position and unsqueezes over the head axis. After bind-dims and fold those tables
 * are plain constants ([1,1,T,hd] typically). The matcher starts at the Add:
 *
 *     Add( Mul(x, cos), Mul(Concat(Neg(Slice(x, h:)), Slice(x, :h), axis -1), sin) )
 *
 * accepting either operand order of the Add and both Muls, Split(x) in place of the two
 * Slices, and Mul(., -1) in place of Neg. cos and sin must be float constants of x's dtype that
 * broadcast against x without varying over B and H (checked element by element); they become
 * new [T,hd] constants (equal tables are shared). Qwen3's q_norm/k_norm sits before the
 * Transpose that makes x and does not change the pattern.
 *
 * requires: bound dims, fold (the tables are constants), norms/activations already recognised.
 * produces: Rope(x, cos [T,hd], sin [T,hd]) in place of the Add; the old nodes are left for dce.
 * Anything that does not match exactly (interleaved RoPE, partial rotary, tables that depend on
 * an input) stays as ONNX ops.
 */
#include "recognize.h"

#include <stdlib.h>
#include <string.h>

/* The live producer of v, whatever its op. */
static ir_node *producer(const ir_value *v)
{
    if (!v || v->kind != IR_VAL_NODE || !v->producer || v->producer->dead)
        return NULL;
    return v->producer;
}

/* One integer of a constant with exactly one element. */
static bool const_int1(const ir_value *v, int64_t *out)
{
    if (!ir_value_is_const(v) || !ir_dtype_is_int(v->dtype) || ir_value_numel(v) != 1)
        return false;
    *out = ir_const_i64(v, 0);
    return true;
}

/* Clamps a Slice bound as ONNX does (step 1): negative counts from the end, then [0, dim]. */
static int64_t clamp_bound(int64_t b, int64_t dim)
{
    if (b < 0)
        b += dim;
    if (b < 0)
        b = 0;
    if (b > dim)
        b = dim;
    return b;
}

/* n is a Slice of its data input along the last axis with step 1: [*start, *end) (clamped). */
static bool last_axis_slice(const ir_node *n, int64_t *start, int64_t *end)
{
    if (!n || n->op != IR_OP_SLICE || n->n_in < 3 || !n->in[0])
        return false;
    const ir_value *x = n->in[0];
    if (x->rank < 1 || x->dims[x->rank - 1].value < 0)
        return false;
    int64_t dim = x->dims[x->rank - 1].value, s, e, axis = 0, step = 1;
    if (!const_int1(n->in[1], &s) || !const_int1(n->in[2], &e))
        return false;
    if (n->n_in > 3 && n->in[3]) {
        if (!const_int1(n->in[3], &axis))
            return false;
        if (axis < 0)
            axis += x->rank;
    } else if (x->rank != 1) {
        return false; /* no axes: the one bound applies to axis 0 */
    }
    if (n->n_in > 4 && n->in[4] && !const_int1(n->in[4], &step))
        return false;
    if (axis != x->rank - 1 || step != 1)
        return false;
    *start = clamp_bound(s, dim);
    *end = clamp_bound(e, dim);
    return true;
}

/* The two halves of x as produced by a two-way Split on the last axis: lo = out[0], hi = out[1]. */
static bool split_halves(const ir_node *n, int64_t hd)
{
    if (!n || n->op != IR_OP_SPLIT || n->n_out != 2 || !n->in[0])
        return false;
    const ir_value *x = n->in[0];
    int64_t axis = ir_attr_int(n, "axis", 0);
    if (axis < 0)
        axis += x->rank;
    if (axis != x->rank - 1)
        return false;
    /* Sizes: from the outputs' inferred shapes, which shape inference took from the split
     * input/attribute (or the equal split). */
    for (int i = 0; i < 2; i++) {
        const ir_value *o = n->out[i];
        if (!o || o->rank != x->rank || o->dims[o->rank - 1].value != hd / 2)
            return false;
    }
    return true;
}

/* v == -a: Neg(a) or Mul(a, -1). Returns a and the node, or NULL. */
static ir_value *match_neg(ir_value *v, ir_node **node)
{
    ir_node *n = rz_producer(v, IR_OP_NEG);
    if (n) {
        *node = n;
        return n->in[0];
    }
    n = rz_producer(v, IR_OP_MUL);
    if (!n)
        return NULL;
    double c;
    for (int i = 0; i < 2; i++)
        if (rz_const_scalar(n->in[1 - i], &c) && c == -1.0 && n->in[i] &&
            n->in[i]->rank == v->rank) {
            *node = n;
            return n->in[i];
        }
    return NULL;
}

/* v == rotate_half(x) with every intermediate used only inside the pattern: returns x and
 * appends the matched nodes to nodes[*nn] (room for 4), or NULL. */
static ir_value *match_rotate_half(const ir_uses *u, ir_value *v, ir_node **nodes, int *nn)
{
    ir_node *cat = rz_producer(v, IR_OP_CONCAT);
    if (!cat || cat->n_in != 2 || v->rank < 1 || !rz_uses_exactly(u, v, 1))
        return NULL;
    int64_t axis = ir_attr_int(cat, "axis", 0);
    if (axis < 0)
        axis += v->rank;
    if (axis != v->rank - 1)
        return NULL;
    int64_t hd = v->dims[v->rank - 1].value;
    if (hd < 2 || hd % 2)
        return NULL;
    ir_node *neg = NULL;
    ir_value *hi = match_neg(cat->in[0], &neg), *lo = cat->in[1];
    if (!hi || !lo || !rz_uses_exactly(u, cat->in[0], 1) || !rz_uses_exactly(u, hi, 1) ||
        !rz_uses_exactly(u, lo, 1))
        return NULL;
    ir_node *phi = producer(hi), *plo = producer(lo);
    if (!phi || !plo)
        return NULL;
    ir_value *x = NULL;
    if (phi->op == IR_OP_SLICE && plo->op == IR_OP_SLICE) {
        int64_t s0, e0, s1, e1;
        if (!last_axis_slice(plo, &s0, &e0) || !last_axis_slice(phi, &s1, &e1))
            return NULL;
        if (plo->in[0] != phi->in[0] || s0 != 0 || e0 != hd / 2 || s1 != hd / 2 || e1 != hd)
            return NULL;
        x = plo->in[0];
        nodes[(*nn)++] = plo;
        nodes[(*nn)++] = phi;
    } else if (phi == plo && split_halves(phi, hd) && lo->producer_slot == 0 &&
               hi->producer_slot == 1) {
        x = phi->in[0];
        nodes[(*nn)++] = phi;
    } else {
        return NULL;
    }
    if (x->rank != v->rank || x->dims[x->rank - 1].value != hd)
        return NULL;
    nodes[(*nn)++] = neg;
    nodes[(*nn)++] = cat;
    return x;
}

/* The [T,hd] table of a constant `c` that x (rank 4 [B,H,T,hd], known) is multiplied by, or
 * NULL: c must be a float constant of x's dtype whose shape broadcasts to x's without changing
 * it, and whose elements must not vary along x's axes 0 and 1. Written to tab [T*hd] (f32). */
static bool rope_table(const ir_value *c, const ir_value *x, float *tab)
{
    if (!ir_value_is_const(c) || c->dtype != IR_DT_FLOAT || x->dtype != IR_DT_FLOAT)
        return false;
    if (c->rank < 0 || c->rank > 4 || !ir_value_shape_known(c))
        return false;
    int64_t cd[4], cstride[4];
    for (int j = 0; j < 4; j++) {
        int i = j - (4 - c->rank);
        cd[j] = i >= 0 ? c->dims[i].value : 1;
        if (cd[j] != 1 && cd[j] != x->dims[j].value)
            return false;
    }
    cstride[3] = 1;
    for (int j = 2; j >= 0; j--)
        cstride[j] = cstride[j + 1] * cd[j + 1];
    const int64_t T = x->dims[2].value, hd = x->dims[3].value;
    const float *cv = c->data;
    for (int64_t t = 0; t < T; t++)
        for (int64_t d = 0; d < hd; d++)
            tab[t * hd + d] = cv[(cd[2] == 1 ? 0 : t) * cstride[2] + (cd[3] == 1 ? 0 : d)];
    /* Every element over the broadcast B and H equals the table (bitwise); a full [T, hd]
     * slice is one comparison (long-T tables are 10^7 elements and more). */
    if (cd[2] == T && cd[3] == hd) {
        for (int64_t b = 0; b < cd[0]; b++)
            for (int64_t h = 0; h < cd[1]; h++)
                if (memcmp(&cv[b * cstride[0] + h * cstride[1]], tab,
                           (size_t)(T * hd) * sizeof(float)) != 0)
                    return false;
        return true;
    }
    for (int64_t b = 0; b < cd[0]; b++)
        for (int64_t h = 0; h < cd[1]; h++)
            for (int64_t t = 0; t < cd[2]; t++)
                for (int64_t d = 0; d < cd[3]; d++) {
                    const float *e = &cv[b * cstride[0] + h * cstride[1] + t * cstride[2] + d];
                    if (memcmp(e, &tab[t * hd + d], sizeof(float)) != 0)
                        return false;
                }
    return true;
}

/* Tables made so far in this pass, shared between equal ones (q and k, and every layer). */
typedef struct rope_tables {
    ir_value **v; /* [n] */
    int n, cap;
} rope_tables;

static ir_value *table_value(ir_graph *g, rope_tables *made, const char *name, int64_t T,
                             int64_t hd, const float *tab)
{
    for (int i = 0; i < made->n; i++) {
        ir_value *m = made->v[i];
        if (m->dims[0].value == T && m->dims[1].value == hd &&
            memcmp(m->data, tab, (size_t)(T * hd) * sizeof(float)) == 0)
            return m;
    }
    if (made->n == made->cap) {
        int nc = made->cap ? 2 * made->cap : 8;
        ir_value **nv = realloc(made->v, (size_t)nc * sizeof *nv);
        if (!nv)
            return NULL;
        made->v = nv;
        made->cap = nc;
    }
    const int64_t dims[2] = {T, hd};
    ir_value *v = ir_const_new(g, name, IR_DT_FLOAT, 2, dims, tab);
    if (v)
        made->v[made->n++] = v;
    return v;
}

/* One Add; IR_OK whether or not it matched, IR_ERR only when building the Rope failed. */
static int try_rope(ir_graph *g, const ir_uses *u, ir_node *add, rope_tables *made, float *buf)
{
    ir_value *out = add->out[0];
    for (int order = 0; order < 2; order++) {
        ir_value *a = add->in[order], *b = add->in[1 - order]; /* a: x*cos, b: rot*sin */
        ir_node *mcos = rz_producer(a, IR_OP_MUL), *msin = rz_producer(b, IR_OP_MUL);
        if (!mcos || !msin || mcos == msin || !rz_uses_exactly(u, a, 1) ||
            !rz_uses_exactly(u, b, 1))
            continue;
        for (int so = 0; so < 2; so++) {
            ir_node *nodes[8];
            int nn = 0;
            ir_value *x = match_rotate_half(u, msin->in[so], nodes, &nn);
            ir_value *sin = msin->in[1 - so];
            ir_value *cos = rz_other(mcos, x);
            if (!x || !cos || cos == x)
                continue;
            if (x->rank != 4 || !ir_value_shape_known(x) || out->rank != 4)
                continue;
            bool same = true;
            for (int i = 0; i < 4; i++)
                same = same && out->dims[i].value == x->dims[i].value;
            if (!same)
                continue; /* the tables would broadcast x to a larger shape */
            const int64_t T = x->dims[2].value, hd = x->dims[3].value;
            float *ctab = buf, *stab = buf + T * hd;
            if (!rope_table(cos, x, ctab) || !rope_table(sin, x, stab))
                continue;
            ir_value *ct = table_value(g, made, "rope_cos", T, hd, ctab);
            ir_value *st = ct ? table_value(g, made, "rope_sin", T, hd, stab) : NULL;
            if (!ct || !st)
                return ir_diag_error(g->diag, "out of memory building RoPE tables");
            nodes[nn++] = mcos;
            nodes[nn++] = msin;
            nodes[nn++] = add;
            ir_value *in[3] = {x, ct, st};
            if (!rz_replace(g, IR_OP_ROPE, in, 3, out, nodes, nn))
                return IR_ERR;
            return IR_OK;
        }
    }
    return IR_OK;
}

int sbp_recognize_rope(ir_graph *g)
{
    ir_uses u = ir_uses_build(g);
    if (!u.n_uses)
        return ir_diag_error(g->diag, "out of memory building use lists");
    /* Walk a snapshot: rz_replace inserts nodes into the list as it goes. */
    int n = g->n_nodes;
    ir_node **snap = malloc(((size_t)n + 1) * sizeof *snap);
    rope_tables made = {0};
    float *buf = NULL;
    size_t buf_n = 0;
    int rc = IR_OK;
    if (!snap) {
        rc = ir_diag_error(g->diag, "out of memory");
        goto out;
    }
    memcpy(snap, g->nodes, (size_t)n * sizeof *snap);
    for (int i = 0; i < n && rc == IR_OK; i++) {
        ir_node *add = snap[i];
        if (add->dead || add->op != IR_OP_ADD || add->n_in != 2 || !add->out[0] ||
            !add->in[0] || !add->in[1])
            continue;
        const ir_value *o = add->out[0];
        if (o->rank != 4 || !ir_value_shape_known(o))
            continue;
        /* x*cos + rotate_half(x)*sin adds two products: anything else (the attention mask's
         * Add on [B,H,T,T] scores) must not size the table buffer (2*T*T floats at long T) */
        if (!rz_producer(add->in[0], IR_OP_MUL) || !rz_producer(add->in[1], IR_OP_MUL))
            continue;
        size_t need = 2 * (size_t)(o->dims[2].value * o->dims[3].value);
        if (need > buf_n) {
            float *nb = realloc(buf, need * sizeof(float));
            if (!nb) {
                rc = ir_diag_error(g->diag, "out of memory");
                break;
            }
            buf = nb;
            buf_n = need;
        }
        rc = try_rope(g, &u, add, &made, buf);
    }
out:
    free(snap);
    free(made.v);
    free(buf);
    return rc;
}
