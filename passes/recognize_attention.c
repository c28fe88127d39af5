/* recognize_attention.c — causal self-attention (with grouped-query K/V) to Attention.
 *
 * The eager attention of Hugging Face models exports, after bind-dims and fold, as
 *
 *     s = MatMul(q, kT)                              q [B,Hq,T,hd], kT [B,Hq,hd,T]
 *     s = Div(s, c) | Mul(s, c)                      scale (or none; q and k may instead each
 *                                                    carry a scalar Mul before the MatMul)
 *     s = Where(tril, s, fill) | Add(s, mask)        the causal mask, a constant
 *     p = Softmax(s, axis -1)
 *     o = MatMul(p, v)                               v [B,Hq,T,hd]
 *
 * with float-to-float Casts anywhere on the s/p chain (the softmax up-cast), the scale before
 * or after the mask, and kT either Transpose(k, [0,1,3,2]) or a Transpose of the un-split heads
 * (GPT-2's [0,2,3,1] of [B,T,H,hd]); any other kT gets a new Transpose. The matcher starts at
 * the second MatMul and walks back. The mask is verified element by element over the whole
 * T x T (and every broadcast B/H slice): a bool condition must be exactly lower-triangular
 * (j <= i; or exactly strictly upper when the scores are the Where's else-branch) with a fill
 * <= -1e4 after any later scaling; an additive mask must be 0 on and below the diagonal and
 * <= -1e4 (or -inf) above it. Padded, sliding-window, non-constant or otherwise non-causal
 * masks are left as ONNX ops without a diagnostic: the op then simply stays unrecognised.
 *
 * GQA: repeat_kv = Reshape(Expand(Unsqueeze(kv, 2), [B,Hkv,n_rep,T,hd]), [B,Hkv*n_rep,T,hd]) on
 * k and v is stripped (checked from the inferred shapes), so Attention reads [B,Hkv,T,hd] with
 * kv_heads = Hkv, query head h reading kv head h / n_rep — the order repeat_kv produces. If only
 * one of k and v carries the repeat, neither is stripped (kv_heads = Hq).
 *
 * requires: bound dims (all shapes known), fold (the mask and scale are constants), dce.
 * produces: Attention(q, k, v) attrs scale (the multiplier on q.k), causal = 1, kv_heads, in
 * place of the second MatMul; the head split/merge Reshape/Transposes stay as ONNX ops.
 */
#include "recognize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Masked scores must be at most this (HF uses finfo.min or -inf; older code -10000). */
#define ATTN_MASK_MAX (-1e4)

#define ATTN_MAX_NODES 48

typedef struct attn_match {
    ir_node *nodes[ATTN_MAX_NODES]; /* replaced nodes, for the new node's origin */
    int n_nodes;
    ir_value *q;             /* [B,Hq,T,hd] */
    ir_value *k, *v;         /* [B,Hkv,T,hd]; k NULL when a Transpose must be made (k_src) */
    ir_value *k_src;         /* input of the Transpose to make, with perm k_perm */
    int64_t k_perm[4];
    ir_node *k_after;        /* the new Transpose goes right after this node (NULL: front) */
    ir_node *k_origin;       /* the exporter's Transpose that the new one stands for, or NULL */
    double scale;            /* product of all scalar factors on q.k */
    int64_t kv_heads;
    /* the mask, as found on the score chain */
    enum { MASK_NONE, MASK_WHERE, MASK_WHERE_INV, MASK_ADD } mask_kind;
    const ir_value *mask;    /* bool condition or additive constant */
    double fill;             /* Where's fill value */
    double post_scale;       /* factors applied after the mask */
} attn_match;

static void add_node(attn_match *m, ir_node *n)
{
    if (n && m->n_nodes < ATTN_MAX_NODES)
        m->nodes[m->n_nodes++] = n;
}

static bool is_floatish(ir_dtype t)
{
    return t == IR_DT_FLOAT || t == IR_DT_FLOAT16 || t == IR_DT_BFLOAT16 || t == IR_DT_DOUBLE;
}

/* Same rank and known dims. */
static bool same_shape(const ir_value *a, const ir_value *b)
{
    if (a->rank != b->rank || a->rank < 0)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i].value < 0 || a->dims[i].value != b->dims[i].value)
            return false;
    return true;
}

static bool dims_are(const ir_value *v, int rank, const int64_t *d)
{
    if (v->rank != rank)
        return false;
    for (int i = 0; i < rank; i++)
        if (v->dims[i].value < 0 || v->dims[i].value != d[i])
            return false;
    return true;
}

/* Cast between float types whose output keeps the input's shape. */
static ir_node *float_cast(const ir_value *v)
{
    ir_node *n = rz_producer(v, IR_OP_CAST);
    if (!n || !n->in[0] || !is_floatish(n->in[0]->dtype) || !is_floatish(v->dtype))
        return NULL;
    return n;
}

/* v = Mul(x, c) | Mul(c, x) | Div(x, c) with a positive finite scalar-valued constant c that
 * does not change x's shape, and v used once: returns x and multiplies *factor, else NULL. */
static ir_value *peel_scale(const ir_uses *u, const ir_value *v, double *factor, ir_node **node)
{
    if (!rz_uses_exactly(u, v, 1))
        return NULL;
    ir_node *n = rz_producer(v, IR_OP_MUL);
    double c;
    if (n) {
        for (int i = 0; i < 2; i++) {
            ir_value *x = n->in[i];
            if (x && !ir_value_is_const(x) && rz_const_scalar(n->in[1 - i], &c) && isfinite(c) &&
                c > 0 && same_shape(x, v)) {
                *factor *= c;
                *node = n;
                return x;
            }
        }
        return NULL;
    }
    n = rz_producer(v, IR_OP_DIV);
    if (n && n->in[0] && !ir_value_is_const(n->in[0]) && rz_const_scalar(n->in[1], &c) &&
        isfinite(c) && c > 0 && same_shape(n->in[0], v)) {
        *factor /= c;
        *node = n;
        return n->in[0];
    }
    return NULL;
}

/* ---------------------------------------------------------------- mask verification */

/* Calls ok(i, j, element) for every element of constant m broadcast against scores [4] (the
 * last two axes are query i, key j); false if the shape does not broadcast without growing the
 * scores or any call says no. */
typedef bool (*mask_elem_fn)(const attn_match *m, int64_t i, int64_t j, int64_t e);

static bool mask_walk(const attn_match *am, const ir_value *m, const int64_t *sd, mask_elem_fn ok)
{
    if (!ir_value_is_const(m) || m->rank < 0 || m->rank > 4 || !ir_value_shape_known(m))
        return false;
    int64_t md[4];
    for (int j = 0; j < 4; j++) {
        int i = j - (4 - m->rank);
        md[j] = i >= 0 ? m->dims[i].value : 1;
        if (md[j] != 1 && md[j] != sd[j])
            return false;
    }
    /* Causality is about the whole T x T: the mask may not broadcast over query or key. */
    if (md[2] != sd[2] || md[3] != sd[3])
        return false;
    int64_t n = md[0] * md[1] * md[2] * md[3];
    for (int64_t e = 0; e < n; e++) {
        int64_t j = e % md[3], i = e / md[3] % md[2];
        if (!ok(am, i, j, e))
            return false;
    }
    return true;
}

static bool elem_where(const attn_match *m, int64_t i, int64_t j, int64_t e)
{
    bool keep = ir_const_i64(m->mask, e) != 0;
    if (m->mask_kind == MASK_WHERE_INV)
        keep = !keep;
    return keep == (j <= i);
}

static bool masked_enough(double x, double post)
{
    return !isnan(x) && x * post <= ATTN_MASK_MAX;
}

static bool elem_add(const attn_match *m, int64_t i, int64_t j, int64_t e)
{
    double x = ir_const_f64(m->mask, e);
    return j <= i ? x == 0.0 : masked_enough(x, m->post_scale);
}

static bool mask_is_causal(const attn_match *m, const int64_t *sd)
{
    switch (m->mask_kind) {
    case MASK_WHERE:
    case MASK_WHERE_INV:
        if (m->mask->dtype != IR_DT_BOOL || !masked_enough(m->fill, m->post_scale))
            return false;
        return mask_walk(m, m->mask, sd, elem_where);
    case MASK_ADD:
        if (m->mask->dtype != IR_DT_FLOAT && m->mask->dtype != IR_DT_DOUBLE)
            return false;
        return mask_walk(m, m->mask, sd, elem_add);
    default:
        return false;
    }
}

/* ---------------------------------------------------------------- repeat_kv */

/* kv_rep == Reshape(Expand(Unsqueeze(kv, 2), [B,Hkv,n,T,hd]), [B,Hkv*n,T,hd]): returns kv and
 * appends the three nodes (room for 3), or NULL. */
static ir_value *strip_repeat_kv(const ir_value *rep, ir_node **nodes, int *nn)
{
    ir_node *rs = rz_producer(rep, IR_OP_RESHAPE);
    if (!rs || rep->rank != 4 || !ir_value_shape_known(rep))
        return NULL;
    ir_value *e = rs->in[0];
    ir_node *ex = rz_producer(e, IR_OP_EXPAND);
    if (!ex || e->rank != 5 || !ir_value_shape_known(e))
        return NULL;
    ir_value *us = ex->in[0];
    ir_node *un = rz_producer(us, IR_OP_UNSQUEEZE);
    if (!un || us->rank != 5 || !ir_value_shape_known(us))
        return NULL;
    ir_value *kv = un->in[0];
    if (!kv || kv->rank != 4 || !ir_value_shape_known(kv))
        return NULL;
    const ir_dim *d = kv->dims;
    const int64_t B = d[0].value, H = d[1].value, T = d[2].value, hd = d[3].value;
    const int64_t n = e->dims[2].value;
    const int64_t du[5] = {B, H, 1, T, hd}, de[5] = {B, H, n, T, hd}, dr[4] = {B, H * n, T, hd};
    /* The dims pin the unsqueezed axis to 2 (rank 4 -> 5 with a 1 there, the rest in order)
     * unless a neighbouring dim is 1 too; the Unsqueeze's axes settle that. */
    int64_t axis;
    if (un->n_in > 1 && un->in[1]) {
        if (!ir_value_is_const(un->in[1]) || ir_value_numel(un->in[1]) != 1)
            return NULL;
        axis = ir_const_i64(un->in[1], 0);
    } else {
        const ir_attr *a = ir_attr_get(un, "axes");
        if (!a || a->kind != IR_ATTR_INTS || a->n != 1)
            return NULL;
        axis = a->ints[0];
    }
    if (axis < 0)
        axis += 5;
    if (axis != 2 || n < 1 || !dims_are(us, 5, du) || !dims_are(e, 5, de) || !dims_are(rep, 4, dr))
        return NULL;
    nodes[(*nn)++] = un;
    nodes[(*nn)++] = ex;
    nodes[(*nn)++] = rs;
    return kv;
}

/* ---------------------------------------------------------------- the matcher */

/* Walks back from the softmax input s over Casts, scalings and one mask to the QK MatMul;
 * every value on the way must have the scores' shape (proto) and be used once. */
static ir_node *match_scores(const ir_uses *u, attn_match *m, ir_value *s, const ir_value *proto)
{
    double post = 1.0; /* factors met so far walking back: applied after anything further up */
    for (;;) {
        if (!rz_uses_exactly(u, s, 1) || !same_shape(s, proto) || s->kind != IR_VAL_NODE ||
            !s->producer || s->producer->dead)
            return NULL;
        ir_node *n = s->producer, *pn = NULL;
        double f = 1.0;
        ir_value *x;
        if (n->op == IR_OP_MATMUL)
            return n;
        if (float_cast(s)) {
            add_node(m, n);
            s = n->in[0];
        } else if ((x = peel_scale(u, s, &f, &pn))) {
            m->scale *= f;
            post *= f;
            add_node(m, pn);
            s = x;
        } else if (n->op == IR_OP_WHERE && m->mask_kind == MASK_NONE) {
            /* Where(cond, s, fill) or Where(cond, fill, s) */
            int slot = ir_value_is_const(n->in[1]) ? 2 : 1;
            ir_value *fill = n->in[slot == 1 ? 2 : 1];
            if (!n->in[0] || !n->in[slot] || ir_value_is_const(n->in[slot]) ||
                !rz_const_scalar(fill, &m->fill))
                return NULL;
            m->mask_kind = slot == 1 ? MASK_WHERE : MASK_WHERE_INV;
            m->mask = n->in[0];
            m->post_scale = post;
            add_node(m, n);
            s = n->in[slot];
        } else if (n->op == IR_OP_ADD && m->mask_kind == MASK_NONE) {
            int slot = ir_value_is_const(n->in[1]) ? 0 : ir_value_is_const(n->in[0]) ? 1 : -1;
            if (slot < 0 || !n->in[slot] || ir_value_is_const(n->in[slot]))
                return NULL;
            m->mask_kind = MASK_ADD;
            m->mask = n->in[1 - slot];
            m->post_scale = post;
            add_node(m, n);
            s = n->in[slot];
        } else {
            return NULL;
        }
    }
}

/* The Transpose permutation of n (default: reversed axes) into perm[4]; false unless rank 4. */
static bool perm4(const ir_node *n, int64_t *perm)
{
    const ir_value *x = n->in[0];
    if (!x || x->rank != 4)
        return false;
    const ir_attr *a = ir_attr_get(n, "perm");
    if (!a) {
        for (int i = 0; i < 4; i++)
            perm[i] = 3 - i;
        return true;
    }
    if (a->kind != IR_ATTR_INTS || a->n != 4)
        return false;
    int seen = 0;
    for (int i = 0; i < 4; i++) {
        int64_t p = a->ints[i] < 0 ? a->ints[i] + 4 : a->ints[i];
        if (p < 0 || p > 3 || (seen & (1 << p)))
            return false;
        seen |= 1 << p;
        perm[i] = p;
    }
    return true;
}

/* q and k from the QK MatMul's operands (q.kT), peeling scalar factors into m->scale. */
static bool match_qk(const ir_uses *u, attn_match *m, ir_node *mm)
{
    ir_value *q = mm->in[0], *kt = mm->in[1], *x;
    ir_node *pn;
    double f;
    if (!q || !kt)
        return false;
    while ((f = 1.0, x = peel_scale(u, q, &f, &pn))) {
        m->scale *= f;
        add_node(m, pn);
        q = x;
    }
    while ((f = 1.0, x = peel_scale(u, kt, &f, &pn))) {
        m->scale *= f;
        add_node(m, pn);
        kt = x;
    }
    ir_node *tr = rz_producer(kt, IR_OP_TRANSPOSE);
    int64_t p[4];
    if (tr && perm4(tr, p)) {
        /* kT = Transpose(src, p)  =>  k = Transpose(kT, [0,1,3,2]) = Transpose(src, p') */
        ir_value *src = tr->in[0];
        const int64_t pk[4] = {p[0], p[1], p[3], p[2]};
        if (rz_uses_exactly(u, kt, 1))
            add_node(m, tr);
        m->k_origin = tr;
        while ((f = 1.0, x = peel_scale(u, src, &f, &pn))) {
            m->scale *= f;
            add_node(m, pn);
            src = x;
        }
        if (pk[0] == 0 && pk[1] == 1 && pk[2] == 2 && pk[3] == 3) {
            m->k = src;
        } else {
            m->k_src = src;
            memcpy(m->k_perm, pk, sizeof pk);
        }
    } else {
        m->k_src = kt;
        const int64_t sw[4] = {0, 1, 3, 2};
        memcpy(m->k_perm, sw, sizeof sw);
    }
    if (m->k_src) {
        if (m->k_src->rank != 4 || !ir_value_shape_known(m->k_src))
            return false;
        m->k_after = m->k_src->kind == IR_VAL_NODE ? m->k_src->producer : NULL;
    }
    m->q = q;
    return true;
}

/* Dims of k, whether it exists or is still to be made. */
static void k_dims(const attn_match *m, int64_t *d)
{
    for (int i = 0; i < 4; i++)
        d[i] = m->k ? m->k->dims[i].value : m->k_src->dims[m->k_perm[i]].value;
}

/* One MatMul as the end of an attention; fills m and returns true when it all checks out. */
static bool match_attention(const ir_graph *g, const ir_uses *u, ir_node *mm2, attn_match *m)
{
    memset(m, 0, sizeof *m);
    m->scale = 1.0;
    m->post_scale = 1.0;
    ir_value *out = mm2->out[0], *p = mm2->in[0], *vrep = mm2->in[1];
    if (!out || !p || !vrep || out->rank != 4 || !ir_value_shape_known(out))
        return false;
    add_node(m, mm2);
    /* probabilities: Softmax(s, axis -1) under float Casts */
    ir_node *n;
    while (rz_uses_exactly(u, p, 1) && (n = float_cast(p))) {
        add_node(m, n);
        p = n->in[0];
    }
    ir_node *sm = rz_producer(p, IR_OP_SOFTMAX);
    if (!sm || !rz_uses_exactly(u, p, 1) || p->rank != 4 || !ir_value_shape_known(p))
        return false;
    int64_t axis = ir_attr_int(sm, "axis", g->opset >= 13 ? -1 : 1);
    if (axis < 0)
        axis += 4;
    if (axis != 3)
        return false;
    add_node(m, sm);
    /* scores */
    ir_node *mm1 = match_scores(u, m, sm->in[0], p);
    if (!mm1 || m->mask_kind == MASK_NONE)
        return false;
    add_node(m, mm1);
    if (!match_qk(u, m, mm1))
        return false;
    /* shapes: q [B,Hq,T,hd]; k, v [B,H?,T,hd]; scores [B,Hq,T,T]; out [B,Hq,T,hd] */
    const ir_value *q = m->q;
    if (q->rank != 4 || !ir_value_shape_known(q) || q->dtype != out->dtype ||
        !is_floatish(q->dtype))
        return false;
    const int64_t B = q->dims[0].value, Hq = q->dims[1].value, T = q->dims[2].value,
                  hd = q->dims[3].value;
    const int64_t sd[4] = {B, Hq, T, T}, od[4] = {B, Hq, T, hd};
    if (!dims_are(p, 4, sd) || !dims_are(out, 4, od))
        return false;
    /* GQA: strip repeat_kv from both k and v, or from neither */
    ir_node *rk[3], *rv[3];
    int nrk = 0, nrv = 0;
    ir_value *k0 = m->k ? strip_repeat_kv(m->k, rk, &nrk) : NULL;
    ir_value *v0 = strip_repeat_kv(vrep, rv, &nrv);
    if (k0 && v0 && k0->dims[1].value == v0->dims[1].value) {
        m->k = k0;
        m->v = v0;
        for (int i = 0; i < 3; i++) {
            if (rz_uses_exactly(u, rk[i]->out[0], 1))
                add_node(m, rk[i]);
            if (rz_uses_exactly(u, rv[i]->out[0], 1))
                add_node(m, rv[i]);
        }
    } else {
        m->v = vrep;
    }
    int64_t kd[4];
    k_dims(m, kd);
    m->kv_heads = kd[1];
    const int64_t kvd[4] = {B, m->kv_heads, T, hd};
    if (m->kv_heads < 1 || Hq % m->kv_heads != 0 || !dims_are(m->v, 4, kvd) ||
        memcmp(kd, kvd, sizeof kd) != 0)
        return false;
    const ir_value *kv = m->k ? m->k : m->k_src;
    if (kv->dtype != q->dtype || m->v->dtype != q->dtype)
        return false;
    if (!isfinite(m->scale) || !(m->scale > 0))
        return false;
    return mask_is_causal(m, sd);
}

/* Builds Attention (and k's Transpose when needed) for a verified match. */
static int build_attention(ir_graph *g, ir_node *mm2, attn_match *m)
{
    ir_value *k = m->k;
    if (!k) {
        /* The output starts untyped: inference must first see the perm (it merges shapes). */
        ir_value *o = ir_value_new(g, ir_arena_printf(g->arena, "%s.heads", m->k_src->name),
                                   IR_VAL_NODE, IR_DT_UNDEFINED, -1, NULL);
        ir_node *tr = o ? ir_node_new_with_outputs(g, IR_OP_TRANSPOSE, NULL, NULL, 1, &m->k_src,
                                                   1, &o)
                        : NULL;
        if (!tr)
            return ir_diag_error(g->diag, "out of memory building attention");
        ir_attr_set_ints(g, tr, "perm", m->k_perm, 4);
        if (ir_infer_node(g, tr) != IR_OK)
            return IR_ERR;
        ir_node_move_after(g, tr, m->k_after);
        if (m->k_origin)
            ir_node_add_origin(g, tr, m->k_origin);
        k = tr->out[0];
    }
    ir_value *in[3] = {m->q, k, m->v};
    ir_node *att = rz_replace(g, IR_OP_ATTENTION, in, 3, mm2->out[0], m->nodes, m->n_nodes);
    if (!att)
        return IR_ERR;
    ir_attr_set_float(g, att, "scale", m->scale);
    ir_attr_set_int(g, att, "causal", 1);
    ir_attr_set_int(g, att, "kv_heads", m->kv_heads);
    return IR_OK;
}

int sbp_recognize_attention(ir_graph *g)
{
    ir_uses u = ir_uses_build(g);
    if (!u.n_uses)
        return ir_diag_error(g->diag, "out of memory building use lists");
    /* Walk a snapshot: building inserts nodes into the list. */
    int n = g->n_nodes, rc = IR_OK;
    ir_node **snap = malloc(((size_t)n + 1) * sizeof *snap);
    attn_match *m = malloc(sizeof *m);
    if (!snap || !m) {
        rc = ir_diag_error(g->diag, "out of memory");
        goto out;
    }
    memcpy(snap, g->nodes, (size_t)n * sizeof *snap);
    for (int i = 0; i < n && rc == IR_OK; i++) {
        ir_node *mm2 = snap[i];
        if (mm2->dead || mm2->op != IR_OP_MATMUL)
            continue;
        if (match_attention(g, &u, mm2, m))
            rc = build_attention(g, mm2, m);
    }
out:
    free(snap);
    free(m);
    return rc;
}
