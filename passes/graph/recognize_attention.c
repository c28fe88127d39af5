/* recognize_attention.c — causal self-attention (with grouped-query K/V) to Attention.
 *
 * The eager attention of Hugging Face models exports, after bind-dims and fold, as
 *
 *     s = MatMul(q, kT)                              q [B,Hq,T,hd], kT [B,Hq,hd,T]
 *     s = Div(s, c) | Mul(s, c)                      scale (or none; q and k may instead each
 *                                                    carry a scalar Mul before the MatMul)
 *     s = Where(tril, s, fill) | Add(s, mask)        the causal mask, computed from constants
 *     p = Softmax(s, axis -1)
 *     o = MatMul(p, v)                               v [B,Hq,T,hd]
 *
 * with float-to-float Casts anywhere on the s/p chain (the softmax up-cast), the scale before
 * or after the mask, and kT either Transpose(k, [0,1,3,2]) or a Transpose of the un-split heads
 * (GPT-2's [0,2,3,1] of [B,T,H,hd]); any other kT gets a new Transpose. The matcher starts at
 * the second MatMul and walks back. The mask must say: a bool condition exactly lower-triangular
 * (j <= i; or exactly strictly upper when the scores are the Where's else-branch) with a fill
 * <= -1e4 after any later scaling; an additive mask 0 on and below the diagonal and <= -1e4 (or
 * -inf) above it; the same for every broadcast B/H slice. A mask that fold made a constant is
 * checked element by element over the whole T x T. Above fold's cap (long sequences) the mask
 * is still the exporter's chain of nodes computed from constants only (Llama's ConstantOfShape ->
 * Trilu -> Unsqueeze -> Expand -> Slice, GPT-2's Slice of its [1,1,P,P] bool buffer, the older
 * arange comparison): that is proved causal without being built, from its structure plus a few
 * element evaluations (see "lazily verified masks" below). The Add's mask operand is
 * the one computed from constants alone. Masks are classified by value: causal, or causal with
 * a sliding window of w keys (i-w < j <= i: Mistral, the local layers of Gemma-2/3), w read off
 * the last query row and then checked everywhere (element by element for a folded constant; at
 * every breakpoint of the proved step function for a lazy chain, below). Padded, bidirectional,
 * input-dependent or otherwise non-causal masks leave the attention unrecognised, with a
 * warning that says so; once it is recognised the mask chain is unused and dce removes it, so
 * nothing T x T is left in the graph. The transformers 5 masks (masking_utils: index arithmetic
 * with Range/CumSum/GatherND/LessOrEqual/And/Where over position vectors) need nothing special:
 * their O(T) and O(B*T) parts fold to constants, and the T x T comparisons of those vectors are
 * either folded (short T) or proved lazily (long T: comparisons of constants that are arithmetic
 * progressions along one axis are AFFINE operands, see below).
 *
 * Variants recorded on the op: logit soft-capping (Gemma-2: s -> c*tanh(s/c) between the
 * scale and the mask; every factor above the Tanh is c, the factors below it times c the
 * scale), a scale other than 1/sqrt(hd) (Gemma's query_pre_attn_scalar, Granite's multiplier:
 * whatever the factors multiply to), and the window. The SDPA decompositions are absorbed as
 * well: the softmax's NaN guard Where(IsNaN(p), 0, p) (TorchScript and onnxscript; the identity
 * under a causal mask, since every row keeps its diagonal) and the dynamo exporter's kT through
 * [B*H, T, hd] (Reshape, Transpose [0,2,1], Reshape).
 *
 * GQA: repeat_kv = Reshape(Expand(Unsqueeze(kv, 2), [B,Hkv,n_rep,T,hd]), [B,Hkv*n_rep,T,hd]) on
 * k and v (or Tile(.., [1,1,n_rep,1,1]) for the Expand, or no Expand at all when n_rep == 1) is
 * stripped (checked from the inferred shapes), so Attention reads [B,Hkv,T,hd] with
 * kv_heads = Hkv, query head h reading kv head h / n_rep — the order repeat_kv produces. If only
 * one of k and v carries the repeat, neither is stripped (kv_heads = Hq).
 *
 * requires: bound dims (all shapes known), fold (the scale and the mask's shape arithmetic are
 *           constants; the mask itself may be left unfolded), dce.
 * produces: Attention(q, k, v) attrs scale (the multiplier on q.k), causal = 1, kv_heads, and
 * window / softcap when present, in place of the second MatMul; the head split/merge
 * Reshape/Transposes stay as ONNX ops.
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
    int64_t window;          /* sliding window w (keys i-w < j <= i), 0: plain causal */
    double softcap;          /* c of c*tanh(s/c) on the scores (Gemma-2), 0: none */
} attn_match;

/* What the mask must say at (i, j): keep a key that is not in the future and, under a sliding
 * window, not w or more positions in the past. */
static bool keep_expected(const attn_match *m, int64_t i, int64_t j)
{
    return j <= i && (m->window == 0 || i - j < m->window);
}

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
    return keep == keep_expected(m, i, j);
}

static bool masked_enough(double x, double post)
{
    return !isnan(x) && x * post <= ATTN_MASK_MAX;
}

static bool elem_add(const attn_match *m, int64_t i, int64_t j, int64_t e)
{
    double x = ir_const_f64(m->mask, e);
    return keep_expected(m, i, j) ? x == 0.0 : masked_enough(x, m->post_scale);
}

/* ---------------------------------------------------------------- lazily verified masks
 *
 * Fold refuses results above its cap (16 Mi elements), so for long sequences the mask chain an
 * exporter emits stays as nodes computed only from constants, e.g. Llama's
 *
 *     Slice(Expand(Unsqueeze(Unsqueeze(Trilu(ConstantOfShape([T,T], min), k=1)))), axis 3, 0:T)
 *
 * and it must be verified without being materialised. Two tools do that:
 *
 * mask_at evaluates ONE element of such a value by walking its producers (index remapping for
 * Unsqueeze/Squeeze/pure-re-view Reshape/Expand/Slice/Transpose and broadcasting; arithmetic for
 * the elementwise ops; ConstantOfShape's fill, Trilu's (row, col) test, Range's progression and
 * constants' data at the leaves). Indices are carried as a view: per axis, an offset plus a step
 * times the query index i or the key index j (or fixed), so one walk serves all (i, j).
 *
 * mask_shape proves, from the structure alone, what the mask's value at output (b, h, i, j) can
 * depend on: nothing (UNIFORM), an affine function of i and j with small integer coefficients
 * (AFFINE: Range, an arithmetic-progression constant along one of the two axes, and sums of
 * those), or d = j - i alone, piecewise constant with the jumps confined to a few known d
 * (STEP: a Trilu's row/column test, a comparison of AFFINE operands whose difference depends on
 * d only, a T x T constant checked to be a function of j - i, and any elementwise combination of
 * STEP and UNIFORM operands). Nothing may depend on the batch and head indices: constants read
 * along those axes must be the same along them, and Trilu's two axes must be the query and key
 * axes themselves (after the remaps). A graph input or parameter anywhere upstream, or an op not
 * listed, fails the proof. Causality of a STEP mask then needs only O(breakpoints) element
 * evaluations: F(d) is checked at both ends of every interval between jumps over
 * d in [-(T-1), T-1] (plus a few fixed probes), each a short chain walk. Cost: O(1) in T for
 * chains generated from ConstantOfShape/Trilu/Range (T = 20000 takes well under a millisecond),
 * O(T) for index vectors that fold made constants, and one pass over a constant leaf that
 * varies over both axes (GPT-2's bool buffer: data that exists already, compared row by row).
 * Nothing T x T is ever allocated.
 */

#define LZ_MAX_DEPTH 48      /* producer chain length */
#define LZ_BUDGET 100000     /* node visits per mask, proof and evaluations together */
#define LZ_MAX_BP 48         /* jump candidates of a STEP value */
#define LZ_EXACT 16777216.0  /* 2^24: AFFINE values stay integers below this (exact in f32) */
#define LZ_SPAN ((int64_t)1 << 31) /* T, dims, offsets and steps beyond this are refused: */
                                   /* off + step * i then cannot overflow */

enum { AX_FIX, AX_I, AX_J, AX_LEAD };

/* index = off + step * (i | j | some batch/head index | nothing) */
typedef struct lz_axis {
    int src;
    int64_t off, step;
} lz_axis;

typedef struct lz_view {
    int rank;
    lz_axis ax[IR_MAX_RANK];
} lz_view;

typedef struct lz_ctx {
    int64_t T;   /* query and key extent */
    long budget; /* node visits left */
} lz_ctx;

typedef struct lz_desc {
    enum { LZ_UNIFORM, LZ_AFFINE, LZ_STEP } kind;
    int n_bp;
    int64_t bp[LZ_MAX_BP]; /* STEP: F(d-1) may differ from F(d) only for d in bp */
} lz_desc;

static bool lz_dtype_ok(ir_dtype t)
{
    return t == IR_DT_FLOAT || t == IR_DT_DOUBLE || t == IR_DT_BOOL || ir_dtype_is_int(t);
}

/* A value of known shape and supported type. */
static bool lz_value_ok(const ir_value *v)
{
    if (!v || v->rank < 0 || v->rank > IR_MAX_RANK || !ir_value_shape_known(v) ||
        !lz_dtype_ok(v->dtype) || ir_value_numel(v) < 0)
        return false;
    for (int a = 0; a < v->rank; a++)
        if (v->dims[a].value >= LZ_SPAN)
            return false;
    return true;
}

static bool lz_tick(lz_ctx *c, int depth) { return depth < LZ_MAX_DEPTH && --c->budget >= 0; }

/* x rounded to dtype t the way an ONNX runtime stores it; false where that is not exact
 * enough to reason about (NaN into an integer, integers beyond 2^53). */
static bool lz_round(ir_dtype t, double x, double *out)
{
    switch (t) {
    case IR_DT_FLOAT: *out = (double)(float)x; return true;
    case IR_DT_DOUBLE: *out = x; return true;
    case IR_DT_BOOL: *out = x != 0; return true;
    default: break;
    }
    if (!(fabs(x) < 9007199254740992.0))
        return false;
    int64_t v = (int64_t)x;
    switch (t) {
    case IR_DT_INT32: v = (int32_t)(uint32_t)(uint64_t)v; break;
    case IR_DT_INT16: v = (int16_t)(uint16_t)(uint64_t)v; break;
    case IR_DT_INT8: v = (int8_t)(uint8_t)(uint64_t)v; break;
    case IR_DT_UINT32: v = (uint32_t)(uint64_t)v; break;
    case IR_DT_UINT16: v = (uint16_t)(uint64_t)v; break;
    case IR_DT_UINT8: v = (uint8_t)(uint64_t)v; break;
    case IR_DT_UINT64:
        if (v < 0)
            return false;
        break;
    default: break;
    }
    *out = (double)v;
    return true;
}

static int64_t lz_index(const lz_axis *a, int64_t i, int64_t j)
{
    return a->off + a->step * (a->src == AX_I ? i : a->src == AX_J ? j : 0);
}

static bool lz_axis_ok(const lz_axis *a)
{
    return a->off > -LZ_SPAN && a->off < LZ_SPAN && a->step > -LZ_SPAN && a->step < LZ_SPAN;
}

/* ---- views of an input, from the view of a node's output */

static bool is_elementwise(ir_op op)
{
    switch (op) {
    case IR_OP_IDENTITY:
    case IR_OP_CAST:
    case IR_OP_ADD:
    case IR_OP_SUB:
    case IR_OP_MUL:
    case IR_OP_DIV:
    case IR_OP_MIN:
    case IR_OP_MAX:
    case IR_OP_EQUAL:
    case IR_OP_LESS:
    case IR_OP_LESS_OR_EQUAL:
    case IR_OP_GREATER:
    case IR_OP_GREATER_OR_EQUAL:
    case IR_OP_AND:
    case IR_OP_OR:
    case IR_OP_NOT:
    case IR_OP_WHERE:
    case IR_OP_NEG:
    case IR_OP_ABS: return true;
    default: return false;
    }
}

static bool is_compare(ir_op op)
{
    return op == IR_OP_EQUAL || op == IR_OP_LESS || op == IR_OP_LESS_OR_EQUAL ||
           op == IR_OP_GREATER || op == IR_OP_GREATER_OR_EQUAL;
}

/* numpy broadcasting of x into y (Expand and the elementwise ops) */
static bool map_bcast(const ir_value *x, const ir_value *y, const lz_view *o, lz_view *in)
{
    if (x->rank > y->rank)
        return false;
    in->rank = x->rank;
    for (int a = 0; a < x->rank; a++) {
        int b = a + y->rank - x->rank;
        int64_t d = x->dims[a].value;
        if (d == 1)
            in->ax[a] = (lz_axis){AX_FIX, 0, 0};
        else if (d == y->dims[b].value)
            in->ax[a] = o->ax[b];
        else
            return false;
    }
    return true;
}

/* Unsqueeze/Squeeze axes from the second input (opset >= 13) or the attribute; -1: none. */
static int squeeze_axes(const ir_node *n, int64_t *ax)
{
    if (n->n_in > 1 && n->in[1])
        return ir_const_ints(n->in[1], ax, IR_MAX_RANK);
    const ir_attr *a = ir_attr_get(n, "axes");
    if (!a)
        return -1;
    if (a->kind != IR_ATTR_INTS || a->n > IR_MAX_RANK)
        return -2;
    memcpy(ax, a->ints, (size_t)a->n * sizeof *ax);
    return a->n;
}

static bool map_unsqueeze(const ir_node *n, const ir_value *x, const ir_value *y,
                          const lz_view *o, lz_view *in)
{
    int64_t ax[IR_MAX_RANK];
    int na = squeeze_axes(n, ax);
    if (na < 0 || x->rank + na != y->rank)
        return false;
    bool ins[IR_MAX_RANK] = {false};
    for (int k = 0; k < na; k++) {
        int64_t a = ax[k] < 0 ? ax[k] + y->rank : ax[k];
        if (a < 0 || a >= y->rank || ins[a])
            return false;
        ins[a] = true;
    }
    in->rank = x->rank;
    for (int b = 0, a = 0; b < y->rank; b++)
        if (!ins[b])
            in->ax[a++] = o->ax[b];
    return true;
}

static bool map_squeeze(const ir_node *n, const ir_value *x, const ir_value *y,
                        const lz_view *o, lz_view *in)
{
    int64_t ax[IR_MAX_RANK];
    int na = squeeze_axes(n, ax);
    if (na < -1)
        return false;
    bool sq[IR_MAX_RANK] = {false};
    for (int a = 0; a < x->rank; a++)
        sq[a] = na < 0 && x->dims[a].value == 1;
    for (int k = 0; k < na; k++) {
        int64_t a = ax[k] < 0 ? ax[k] + x->rank : ax[k];
        if (a < 0 || a >= x->rank || x->dims[a].value != 1)
            return false;
        sq[a] = true;
    }
    in->rank = x->rank;
    int b = 0;
    for (int a = 0; a < x->rank; a++)
        in->ax[a] = sq[a] ? (lz_axis){AX_FIX, 0, 0} : o->ax[b++];
    return b == y->rank;
}

/* Reshape that only inserts or drops axes of extent 1 (a pure re-view); anything that merges
 * or splits axes is refused. */
static bool map_reshape(const ir_value *x, const ir_value *y, const lz_view *o, lz_view *in)
{
    in->rank = x->rank;
    int b = 0;
    for (int a = 0; a < x->rank; a++) {
        if (x->dims[a].value == 1) {
            in->ax[a] = (lz_axis){AX_FIX, 0, 0};
            continue;
        }
        while (b < y->rank && y->dims[b].value == 1)
            b++;
        if (b >= y->rank || y->dims[b].value != x->dims[a].value)
            return false;
        in->ax[a] = o->ax[b++];
    }
    while (b < y->rank && y->dims[b].value == 1)
        b++;
    return b == y->rank;
}

static bool map_transpose(const ir_node *n, const ir_value *x, const lz_view *o, lz_view *in)
{
    const ir_attr *p = ir_attr_get(n, "perm");
    if (p && (p->kind != IR_ATTR_INTS || p->n != x->rank))
        return false;
    bool seen[IR_MAX_RANK] = {false};
    in->rank = x->rank;
    for (int a = 0; a < x->rank; a++) {
        int64_t q = p ? p->ints[a] : x->rank - 1 - a;
        if (q < 0)
            q += x->rank;
        if (q < 0 || q >= x->rank || seen[q])
            return false;
        seen[q] = true;
        in->ax[q] = o->ax[a];
    }
    return true;
}

/* Slice with constant starts/ends/axes/steps (clamped as ONNX does, ir_slice_axis): input
 * index = start + step * output index on each sliced axis. */
static bool map_slice(const ir_node *n, const ir_value *x, const ir_value *y, const lz_view *o,
                      lz_view *in)
{
    int64_t st[IR_MAX_RANK], en[IR_MAX_RANK], ax[IR_MAX_RANK], sp[IR_MAX_RANK];
    int ns = ir_const_ints(n->in[1], st, IR_MAX_RANK);
    int ne = ir_const_ints(n->in[2], en, IR_MAX_RANK);
    if (ns < 0 || ne != ns)
        return false;
    if (n->n_in > 3 && n->in[3]) {
        if (ir_const_ints(n->in[3], ax, IR_MAX_RANK) != ns)
            return false;
    } else {
        for (int k = 0; k < ns; k++)
            ax[k] = k;
    }
    if (n->n_in > 4 && n->in[4]) {
        if (ir_const_ints(n->in[4], sp, IR_MAX_RANK) != ns)
            return false;
    } else {
        for (int k = 0; k < ns; k++)
            sp[k] = 1;
    }
    *in = *o;
    bool done[IR_MAX_RANK] = {false};
    for (int k = 0; k < ns; k++) {
        int64_t a = ax[k] < 0 ? ax[k] + x->rank : ax[k];
        if (a < 0 || a >= x->rank || done[a] || sp[k] == 0 || sp[k] <= -LZ_SPAN ||
            sp[k] >= LZ_SPAN)
            return false;
        done[a] = true;
        const int64_t step = sp[k];
        int64_t s; /* ONNX's clamp, as inference and the folder apply it (ir_slice_axis) */
        if (ir_slice_axis(x->dims[a].value, st[k], en[k], step, &s) != y->dims[a].value)
            return false;
        const lz_axis *oa = &o->ax[a];
        in->ax[a] = (lz_axis){oa->src, s + step * oa->off, oa->src == AX_FIX ? 0 : step * oa->step};
        if (!lz_axis_ok(&in->ax[a]))
            return false;
    }
    return true;
}

/* The view of input `slot` of n that the output view o reads (data movement and broadcasting);
 * false for inputs that are not data (shapes, axes, Trilu's k, ...) and for other ops. */
static bool lz_map(const ir_node *n, int slot, const lz_view *o, lz_view *in)
{
    const ir_value *x = n->in[slot], *y = n->out[0];
    if (!lz_value_ok(x) || !lz_value_ok(y) || o->rank != y->rank)
        return false;
    if (is_elementwise(n->op))
        return map_bcast(x, y, o, in);
    if (slot != 0)
        return false;
    switch (n->op) {
    case IR_OP_EXPAND:
    case IR_OP_TRILU: return map_bcast(x, y, o, in); /* Trilu: same shape, same element */
    case IR_OP_UNSQUEEZE: return map_unsqueeze(n, x, y, o, in);
    case IR_OP_SQUEEZE: return map_squeeze(n, x, y, o, in);
    case IR_OP_RESHAPE: return map_reshape(x, y, o, in);
    case IR_OP_TRANSPOSE: return map_transpose(n, x, o, in);
    case IR_OP_SLICE: return map_slice(n, x, y, o, in);
    default: return false;
    }
}

/* ---- evaluation of one element */

static bool mask_at(lz_ctx *c, const ir_value *v, const lz_view *w, int64_t i, int64_t j,
                    int depth, double *out);

/* A value of one element (Trilu's k, Range's start and delta). */
static bool lz_scalar(lz_ctx *c, const ir_value *v, int depth, double *out)
{
    if (!lz_value_ok(v) || ir_value_numel(v) != 1)
        return false;
    lz_view w = {.rank = v->rank};
    for (int a = 0; a < v->rank; a++)
        w.ax[a] = (lz_axis){AX_FIX, 0, 0};
    return mask_at(c, v, &w, 0, 0, depth, out);
}

static bool lz_binary(ir_op op, ir_dtype in_t, double a, double b, double *r)
{
    bool fl = in_t == IR_DT_FLOAT || in_t == IR_DT_DOUBLE;
    switch (op) {
    case IR_OP_ADD: *r = a + b; return true;
    case IR_OP_SUB: *r = a - b; return true;
    case IR_OP_MUL: *r = a * b; return true;
    case IR_OP_DIV:
        if (fl) {
            *r = a / b;
            return true;
        }
        if (b == 0)
            return false;
        /* integers below 2^53 (lz_round saw to it): C's truncating division, as ONNX's */
        *r = (double)((int64_t)a / (int64_t)b);
        return true;
    case IR_OP_MIN: *r = a != a || b != b ? NAN : a < b ? a : b; return true;
    case IR_OP_MAX: *r = a != a || b != b ? NAN : a > b ? a : b; return true;
    case IR_OP_EQUAL: *r = a == b; return true;
    case IR_OP_LESS: *r = a < b; return true;
    case IR_OP_LESS_OR_EQUAL: *r = a <= b; return true;
    case IR_OP_GREATER: *r = a > b; return true;
    case IR_OP_GREATER_OR_EQUAL: *r = a >= b; return true;
    case IR_OP_AND: *r = a != 0 && b != 0; return true;
    case IR_OP_OR: *r = a != 0 || b != 0; return true;
    default: return false;
    }
}

/* The element of v (of view w) at query i, key j; batch/head axes at their view offsets. */
static bool mask_at(lz_ctx *c, const ir_value *v, const lz_view *w, int64_t i, int64_t j,
                    int depth, double *out)
{
    if (!lz_tick(c, depth) || !lz_value_ok(v) || w->rank != v->rank)
        return false;
    if (v->kind == IR_VAL_CONST) {
        int64_t off = 0;
        for (int a = 0; a < v->rank; a++) {
            int64_t x = lz_index(&w->ax[a], i, j), d = v->dims[a].value;
            if (x < 0 || x >= d)
                return false;
            off = off * d + x;
        }
        *out = v->dtype == IR_DT_FLOAT || v->dtype == IR_DT_DOUBLE ? ir_const_f64(v, off)
                                                                    : (double)ir_const_i64(v, off);
        return true;
    }
    const ir_node *n = v->producer;
    if (v->kind != IR_VAL_NODE || !n || n->dead || n->n_out != 1)
        return false;
    lz_view iw;
    double a, b, r;
    switch (n->op) {
    case IR_OP_CONSTANT_OF_SHAPE: {
        const ir_attr *va = ir_attr_get(n, "value");
        if (!va) {
            r = 0;
        } else {
            const ir_value *t = va->t;
            if (va->kind != IR_ATTR_TENSOR || !t || !t->data || !lz_dtype_ok(t->dtype) ||
                ir_value_numel(t) != 1)
                return false;
            r = ir_const_f64(t, 0);
        }
        return lz_round(v->dtype, r, out);
    }
    case IR_OP_TRILU: {
        if (v->rank < 2)
            return false;
        double k = 0;
        if (n->n_in > 1 && n->in[1] && !lz_scalar(c, n->in[1], depth + 1, &k))
            return false;
        const int64_t row = lz_index(&w->ax[v->rank - 2], i, j);
        const double cr = (double)(lz_index(&w->ax[v->rank - 1], i, j) - row); /* col - row */
        const bool keep = ir_attr_int(n, "upper", 1) ? cr >= k : cr <= k;
        if (!keep) {
            *out = 0;
            return true;
        }
        return lz_map(n, 0, w, &iw) && mask_at(c, n->in[0], &iw, i, j, depth + 1, out);
    }
    case IR_OP_RANGE: {
        double s, d;
        if (v->rank != 1 || !lz_scalar(c, n->in[0], depth + 1, &s) ||
            !lz_scalar(c, n->in[2], depth + 1, &d))
            return false;
        int64_t x = lz_index(&w->ax[0], i, j);
        if (x < 0 || x >= v->dims[0].value)
            return false;
        if (v->dtype == IR_DT_FLOAT) { /* ONNX: repeated addition, in the output type */
            float acc = (float)s;
            if (s == floor(s) && d == floor(d) && fabs(s) + fabs(d) * (double)x < LZ_EXACT)
                acc = (float)(s + d * (double)x); /* exact either way */
            else if (x > ((int64_t)1 << 20))
                return false;
            else
                for (int64_t t = 0; t < x; t++)
                    acc += (float)d;
            *out = acc;
            return true;
        }
        return lz_round(v->dtype, s + d * (double)x, out);
    }
    case IR_OP_WHERE:
        if (!lz_map(n, 0, w, &iw) || !mask_at(c, n->in[0], &iw, i, j, depth + 1, &a))
            return false;
        if (!lz_map(n, a != 0 ? 1 : 2, w, &iw) ||
            !mask_at(c, n->in[a != 0 ? 1 : 2], &iw, i, j, depth + 1, &r))
            return false;
        return lz_round(v->dtype, r, out);
    default: break;
    }
    if (!lz_map(n, 0, w, &iw) || !mask_at(c, n->in[0], &iw, i, j, depth + 1, &a))
        return false;
    if (!is_elementwise(n->op)) /* data movement */
        return lz_round(v->dtype, a, out);
    switch (n->op) {
    case IR_OP_IDENTITY:
    case IR_OP_CAST: r = a; break;
    case IR_OP_NOT: r = a == 0; break;
    case IR_OP_NEG: r = -a; break;
    case IR_OP_ABS: r = fabs(a); break;
    default:
        if (n->n_in != 2 || !lz_map(n, 1, w, &iw) ||
            !mask_at(c, n->in[1], &iw, i, j, depth + 1, &b) ||
            !lz_binary(n->op, n->in[0]->dtype, a, b, &r))
            return false;
        break;
    }
    return lz_round(v->dtype, r, out);
}

/* ---- the structural proof */

static bool bp_add(lz_desc *d, int64_t x)
{
    for (int k = 0; k < d->n_bp; k++)
        if (d->bp[k] == x)
            return true;
    if (d->n_bp >= LZ_MAX_BP)
        return false;
    d->bp[d->n_bp++] = x;
    return true;
}

/* Jump candidates around t (generous: the exact side of a threshold is settled by evaluation). */
static bool bp_around(lz_ctx *c, lz_desc *d, double t)
{
    if (!isfinite(t))
        return true;
    double lim = (double)c->T + 4;
    t = t < -lim ? -lim : t > lim ? lim : t;
    int64_t f = (int64_t)floor(t);
    d->kind = LZ_STEP;
    for (int64_t x = f - 1; x <= f + 2; x++)
        if (!bp_add(d, x))
            return false;
    return true;
}

static bool bp_union(lz_desc *d, const lz_desc *e)
{
    for (int k = 0; k < e->n_bp; k++)
        if (!bp_add(d, e->bp[k]))
            return false;
    return true;
}

/* v (view w) as c0 + ci i + cj j: integer coefficients, checked at the corners, every value an
 * integer of magnitude below 2^24 (so f32 arithmetic on it is exact). co = {c0, ci, cj}. */
static bool lz_affine(lz_ctx *c, const ir_value *v, const lz_view *w, int depth, double *co)
{
    const int64_t T1 = c->T - 1;
    double f00, f;
    if (!mask_at(c, v, w, 0, 0, depth, &f00))
        return false;
    co[0] = f00;
    co[1] = co[2] = 0;
    if (T1 > 0) {
        if (!mask_at(c, v, w, 1, 0, depth, &f))
            return false;
        co[1] = f - f00;
        if (!mask_at(c, v, w, 0, 1, depth, &f))
            return false;
        co[2] = f - f00;
    }
    const int64_t pts[4][2] = {{0, 0}, {T1, 0}, {0, T1}, {T1, T1}};
    for (int k = 0; k < 4; k++) {
        if (!mask_at(c, v, w, pts[k][0], pts[k][1], depth, &f))
            return false;
        double want = co[0] + co[1] * (double)pts[k][0] + co[2] * (double)pts[k][1];
        if (!(fabs(f) < LZ_EXACT) || f != floor(f) || f != want)
            return false;
    }
    return co[1] == floor(co[1]) && co[2] == floor(co[2]);
}

/* A constant read through view w: uniform, affine along one of i/j, or a function of j - i. */
static bool shape_const(lz_ctx *c, const ir_value *v, const lz_view *w, lz_desc *d)
{
    const int64_t T = c->T, n = ir_value_numel(v);
    const size_t es = ir_dtype_size(v->dtype);
    const char *p = v->data;
    if (n < 1 || !p || v->nbytes != (size_t)n * es)
        return false;
    d->kind = LZ_UNIFORM;
    if (n == 1 || memcmp(p, p + es, (size_t)(n - 1) * es) == 0)
        return true; /* every element the same */
    /* strides, and the offset of (i, j) = base + i si + j sj; each axis's extreme indices in
     * range */
    int64_t str[IR_MAX_RANK], s = 1, base = 0, si = 0, sj = 0;
    bool lead = false;
    for (int a = v->rank - 1; a >= 0; a--) {
        str[a] = s;
        s *= v->dims[a].value;
    }
    for (int a = 0; a < v->rank; a++) {
        const lz_axis *x = &w->ax[a];
        const bool ij = (x->src == AX_I || x->src == AX_J) && T > 1;
        const int64_t dim = v->dims[a].value, hi = ij ? x->off + x->step * (T - 1) : x->off;
        if (x->off < 0 || x->off >= dim || hi < 0 || hi >= dim)
            return false;
        /* |off|, |step| < dim here, so none of these overflows: each stays below numel */
        base += x->off * str[a];
        if (ij && x->src == AX_I)
            si += x->step * str[a];
        else if (ij)
            sj += x->step * str[a];
        else if (x->src == AX_LEAD && dim > 1)
            lead = true;
    }
    /* Independent of the batch/head indices: equal along every such axis (whole constant). */
    if (lead) {
        for (int64_t e = 0; e < n; e++) {
            int64_t e0 = 0, r = e;
            for (int a = v->rank - 1; a >= 0; a--) {
                int64_t x = r % v->dims[a].value;
                r /= v->dims[a].value;
                if (w->ax[a].src != AX_LEAD)
                    e0 += x * str[a];
            }
            if (memcmp(p + e * (int64_t)es, p + e0 * (int64_t)es, es) != 0)
                return false;
        }
    }
#define AT(ii, jj) (p + (base + (ii) * si + (jj) * sj) * (int64_t)es)
    if (si == 0 && sj == 0)
        return true;
    if (si == 0 || sj == 0) { /* one axis: constant, or an exact integer progression */
        int64_t st = si ? si : sj;
        double f0 = ir_const_f64(v, base), f1 = T > 1 ? ir_const_f64(v, base + st) : f0;
        bool same = true, prog = f1 == floor(f1);
        for (int64_t t = 0; t < T; t++) {
            double f = ir_const_f64(v, base + t * st);
            same = same && f == f0;
            prog = prog && f == f0 + (f1 - f0) * (double)t && fabs(f) < LZ_EXACT && f == floor(f);
        }
        if (!same && !prog)
            return false;
        d->kind = same ? LZ_UNIFORM : LZ_AFFINE;
        return true;
    }
    /* two axes: g(i, j) == g(i-1, j-1) everywhere makes it F(j - i); then find F's jumps */
    for (int64_t i = 1; i < T; i++) {
        if (sj == 1) {
            if (memcmp(AT(i, 1), AT(i - 1, 0), (size_t)(T - 1) * es) != 0)
                return false;
        } else {
            for (int64_t j = 1; j < T; j++)
                if (memcmp(AT(i, j), AT(i - 1, j - 1), es) != 0)
                    return false;
        }
    }
    d->kind = LZ_STEP;
    d->n_bp = 0;
    for (int64_t x = -(T - 1) + 1; x <= T - 1; x++) {
        const char *cur = x >= 0 ? AT(0, x) : AT(-x, 0);
        const char *prev = x - 1 >= 0 ? AT(0, x - 1) : AT(-(x - 1), 0);
        if (memcmp(cur, prev, es) != 0 && !bp_add(d, x))
            return false;
    }
#undef AT
    if (d->n_bp == 0)
        d->kind = LZ_UNIFORM;
    return true;
}

/* What v, read through view w, depends on (see the top of this section); false when that
 * cannot be shown: an input or parameter upstream, an op or remap not handled, a constant that
 * varies over the batch/head axes or in a way that is neither affine nor a function of j - i. */
static bool mask_shape(lz_ctx *c, const ir_value *v, const lz_view *w, int depth, lz_desc *d)
{
    memset(d, 0, sizeof *d);
    d->kind = LZ_UNIFORM;
    if (!lz_tick(c, depth) || !lz_value_ok(v) || w->rank != v->rank)
        return false;
    for (int a = 0; a < w->rank; a++)
        if (!lz_axis_ok(&w->ax[a]))
            return false;
    if (v->kind == IR_VAL_CONST)
        return shape_const(c, v, w, d);
    const ir_node *n = v->producer;
    if (v->kind != IR_VAL_NODE || !n || n->dead || n->n_out != 1)
        return false;
    lz_view iw[3];
    double co[3], co2[3], k;
    switch (n->op) {
    case IR_OP_CONSTANT_OF_SHAPE: return true;
    case IR_OP_RANGE: {
        double s, dl;
        if (v->rank != 1 || !lz_scalar(c, n->in[0], depth + 1, &s) ||
            !lz_scalar(c, n->in[2], depth + 1, &dl) || w->ax[0].src == AX_LEAD)
            return false;
        if (w->ax[0].src == AX_FIX)
            return true;
        d->kind = LZ_AFFINE;
        return lz_affine(c, v, w, depth, co);
    }
    case IR_OP_TRILU: {
        const int r = v->rank;
        k = 0;
        if (r < 2 || (n->n_in > 1 && n->in[1] && !lz_scalar(c, n->in[1], depth + 1, &k)) ||
            k != floor(k) || fabs(k) > (double)LZ_SPAN)
            return false;
        if (!lz_map(n, 0, w, &iw[0]) || !mask_shape(c, n->in[0], &iw[0], depth + 1, d) ||
            d->kind == LZ_AFFINE)
            return false;
        const lz_axis *ra = &w->ax[r - 2], *ca = &w->ax[r - 1];
        if (ra->src == AX_FIX && ca->src == AX_FIX)
            return true; /* one fixed (row, col): the same test everywhere */
        /* col - row must be +-(j - i) + delta: the two axes are query and key, same unit step */
        if (!((ra->src == AX_I && ca->src == AX_J) || (ra->src == AX_J && ca->src == AX_I)) ||
            ra->step != ca->step || (ra->step != 1 && ra->step != -1))
            return false;
        const int64_t sigma = (ca->src == AX_J ? 1 : -1) * ra->step, delta = ca->off - ra->off;
        return bp_around(c, d, (double)sigma * (k - (double)delta));
    }
    default: break;
    }
    if (!is_elementwise(n->op)) { /* data movement: the same element function, remapped */
        return lz_map(n, 0, w, &iw[0]) && mask_shape(c, n->in[0], &iw[0], depth + 1, d);
    }
    if (n->n_in < 1 || n->n_in > 3)
        return false;
    lz_desc e[3];
    bool aff = false, step = false;
    for (int s = 0; s < n->n_in; s++) {
        if (!n->in[s] || !lz_map(n, s, w, &iw[s]) ||
            !mask_shape(c, n->in[s], &iw[s], depth + 1, &e[s]))
            return false;
        aff = aff || e[s].kind == LZ_AFFINE;
        step = step || e[s].kind == LZ_STEP;
    }
    if (!aff) { /* any elementwise function of STEP and UNIFORM operands */
        for (int s = 0; s < n->n_in; s++)
            if (!bp_union(d, &e[s]))
                return false;
        d->kind = step ? LZ_STEP : LZ_UNIFORM;
        return true;
    }
    if (step)
        return false;
    if (is_compare(n->op)) {
        /* a - b = c0 + ci i + cj j: a function of j - i when ci == -cj; the test flips near
         * d = -c0 / cj */
        double *cc[2] = {co, co2};
        for (int s = 0; s < 2; s++) {
            if (e[s].kind == LZ_AFFINE) {
                if (!lz_affine(c, n->in[s], &iw[s], depth + 1, cc[s]))
                    return false;
            } else {
                if (!mask_at(c, n->in[s], &iw[s], 0, 0, depth + 1, &cc[s][0]))
                    return false;
                cc[s][1] = cc[s][2] = 0;
            }
        }
        double d0 = co[0] - co2[0], di = co[1] - co2[1], dj = co[2] - co2[2];
        if (di != -dj)
            return false;
        if (dj == 0)
            return true;
        return bp_around(c, d, -d0 / dj);
    }
    switch (n->op) {
    case IR_OP_ADD:
    case IR_OP_SUB:
    case IR_OP_NEG:
    case IR_OP_IDENTITY: break;
    case IR_OP_MUL:
        if (e[0].kind == LZ_AFFINE && e[1].kind == LZ_AFFINE)
            return false;
        break;
    case IR_OP_CAST:
        if (v->dtype == IR_DT_BOOL)
            return false;
        break;
    default: return false;
    }
    d->kind = LZ_AFFINE;
    return lz_affine(c, v, w, depth, co);
}

/* One mask element at (i, j) says what a causal mask must: keep j <= i, mask j > i. */
static bool lz_elem_ok(const attn_match *m, int64_t i, int64_t j, double x)
{
    if (m->mask_kind == MASK_ADD)
        return keep_expected(m, i, j) ? x == 0.0 : masked_enough(x, m->post_scale);
    bool keep = x != 0;
    if (m->mask_kind == MASK_WHERE_INV)
        keep = !keep;
    return keep == keep_expected(m, i, j);
}

/* A mask computed from constants only, not materialised: proved to be a step function of
 * d = j - i that depends on nothing else, then checked at both ends of every interval between
 * its possible jumps (and at fixed probes). */
static bool mask_lazy_causal(attn_match *m, const int64_t *sd)
{
    const ir_value *mk = m->mask;
    if (!lz_value_ok(mk) || mk->rank < 2 || mk->rank > 4 || sd[2] != sd[3] || sd[2] < 1 ||
        sd[2] >= LZ_SPAN)
        return false;
    const int64_t T = sd[2];
    lz_view w = {.rank = mk->rank};
    for (int a = 0; a < mk->rank; a++) {
        int s = a + 4 - mk->rank;
        int64_t md = mk->dims[a].value;
        if (md != 1 && md != sd[s])
            return false;
        if (s >= 2 && md != sd[s]) /* no broadcast over query or key */
            return false;
        w.ax[a] = s == 2 ? (lz_axis){AX_I, 0, 1}
                  : s == 3 ? (lz_axis){AX_J, 0, 1}
                  : md == 1 ? (lz_axis){AX_FIX, 0, 0}
                            : (lz_axis){AX_LEAD, 0, 1};
    }
    lz_ctx c = {.T = T, .budget = LZ_BUDGET};
    lz_desc d;
    if (!mask_shape(&c, mk, &w, 0, &d) || d.kind == LZ_AFFINE)
        return false;
    /* The window: the smallest d = j - i <= 0 that is kept, read in the last row. F can change
     * only at the breakpoints, so d = -(T-1) and the breakpoints are the only candidates; the
     * probes below then check every interval against it. */
    {
        int64_t dmin = 1;
        for (int k = -1; k < d.n_bp; k++) {
            int64_t x = k < 0 ? -(T - 1) : d.bp[k];
            if (x < -(T - 1) || x > 0 || (dmin <= 0 && x >= dmin))
                continue;
            double v;
            if (!mask_at(&c, mk, &w, T - 1, T - 1 + x, 0, &v))
                return false;
            bool keep = m->mask_kind == MASK_ADD ? v == 0.0
                        : m->mask_kind == MASK_WHERE_INV ? v == 0 : v != 0;
            if (keep)
                dmin = x;
        }
        if (dmin > 0)
            return false; /* the last row keeps nothing: not a causal mask */
        m->window = dmin == -(T - 1) ? 0 : 1 - dmin;
    }
    /* probes: (i, j) for each d, twice (from the first row/column and from the last) */
    int64_t ds[2 * LZ_MAX_BP + 8];
    int nd = 0;
    ds[nd++] = -(T - 1);
    ds[nd++] = T - 1;
    ds[nd++] = 0;
    if (T > 1)
        ds[nd++] = 1;
    for (int k = 0; k < d.n_bp; k++)
        for (int64_t x = d.bp[k] - 1; x <= d.bp[k]; x++)
            if (x > -T && x < T)
                ds[nd++] = x;
    for (int k = 0; k < nd; k++) {
        const int64_t x = ds[k];
        const int64_t pi[2] = {x >= 0 ? 0 : -x, x >= 0 ? T - 1 - x : T - 1};
        for (int r = 0; r < 2; r++) {
            double v;
            if (!mask_at(&c, mk, &w, pi[r], pi[r] + x, 0, &v) ||
                !lz_elem_ok(m, pi[r], pi[r] + x, v))
                return false;
        }
    }
    const int64_t fixed[7][2] = {{0, 0}, {T - 1, 0}, {T - 1, T - 1}, {5, 3},
                                 {0, 1}, {0, T - 1}, {T - 2, T - 1}};
    for (int k = 0; k < 7; k++) {
        int64_t i = fixed[k][0], j = fixed[k][1];
        double v;
        if (i < 0 || j < 0 || i >= T || j >= T)
            continue;
        if (!mask_at(&c, mk, &w, i, j, 0, &v) || !lz_elem_ok(m, i, j, v))
            return false;
    }
    return true;
}

/* v is computed from constants only (no graph input or parameter upstream), within a budget. */
static bool const_derived(const ir_value *v, int depth, long *budget)
{
    if (!v || --*budget < 0 || depth > LZ_MAX_DEPTH)
        return false;
    if (v->kind == IR_VAL_CONST)
        return true;
    if (v->kind != IR_VAL_NODE || !v->producer || v->producer->dead)
        return false;
    const ir_node *n = v->producer;
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] && !const_derived(n->in[i], depth + 1, budget))
            return false;
    return true;
}

static bool is_const_derived(const ir_value *v)
{
    long budget = 4096;
    return const_derived(v, 0, &budget);
}

/* The window of a constant mask, read in the last query row of its first slice: the count of
 * keys kept (all T: plain causal, window 0). The walk that follows checks every element. */
static void const_mask_window(attn_match *m, const int64_t *sd)
{
    const int64_t T = sd[3];
    int64_t kept = 0;
    for (int64_t j = 0; j < T; j++) {
        int64_t e = (T - 1) * T + j;
        bool keep = m->mask_kind == MASK_ADD ? ir_const_f64(m->mask, e) == 0.0
                                             : ir_const_i64(m->mask, e) != 0;
        if (m->mask_kind == MASK_WHERE_INV)
            keep = !keep;
        kept += keep;
    }
    m->window = kept >= T ? 0 : kept;
}

static bool mask_is_causal(attn_match *m, const int64_t *sd)
{
    const bool lazy = !ir_value_is_const(m->mask);
    if (!lazy && ir_value_shape_known(m->mask) && m->mask->rank >= 2 &&
        m->mask->dims[m->mask->rank - 1].value == sd[3] &&
        m->mask->dims[m->mask->rank - 2].value == sd[2])
        const_mask_window(m, sd);
    switch (m->mask_kind) {
    case MASK_WHERE:
    case MASK_WHERE_INV:
        if (m->mask->dtype != IR_DT_BOOL || !masked_enough(m->fill, m->post_scale))
            return false;
        return lazy ? mask_lazy_causal(m, sd) : mask_walk(m, m->mask, sd, elem_where);
    case MASK_ADD:
        if (m->mask->dtype != IR_DT_FLOAT && m->mask->dtype != IR_DT_DOUBLE)
            return false;
        return lazy ? mask_lazy_causal(m, sd) : mask_walk(m, m->mask, sd, elem_add);
    default:
        return false;
    }
}

/* The last mask proved causal in this sweep: a model's layers share one mask value, so the
 * others need not be walked again (a folded T x T constant costs O(T^2) per walk). */
typedef struct mask_memo {
    const ir_value *mask;
    int kind;
    double fill, post_scale;
    int64_t sd[4];
    int64_t window;
} mask_memo;

static bool mask_is_causal_memo(mask_memo *memo, attn_match *m, const int64_t *sd)
{
    if (memo->mask && memo->mask == m->mask && memo->kind == (int)m->mask_kind &&
        memo->fill == m->fill && memo->post_scale == m->post_scale &&
        memcmp(memo->sd, sd, sizeof memo->sd) == 0) {
        m->window = memo->window;
        return true;
    }
    if (!mask_is_causal(m, sd))
        return false;
    *memo = (mask_memo){m->mask, (int)m->mask_kind, m->fill, m->post_scale,
                        {sd[0], sd[1], sd[2], sd[3]}, m->window};
    return true;
}

/* ---------------------------------------------------------------- repeat_kv */

/* kv_rep == Reshape(Expand(Unsqueeze(kv, 2), [B,Hkv,n,T,hd]), [B,Hkv*n,T,hd]), or the same
 * with Tile(.., [1,1,n,1,1]) for the Expand, or with neither when n == 1 (fold removed the
 * Expand to the same shape): returns kv and appends the nodes (room for 3), or NULL. */
static ir_value *strip_repeat_kv(const ir_value *rep, ir_node **nodes, int *nn)
{
    ir_node *rs = rz_producer(rep, IR_OP_RESHAPE);
    if (!rs || rep->rank != 4 || !ir_value_shape_known(rep))
        return NULL;
    ir_value *e = rs->in[0];
    ir_node *ex = rz_producer(e, IR_OP_EXPAND);
    if (!ex && (ex = rz_producer(e, IR_OP_TILE))) {
        /* Tile(Unsqueeze(kv, 2), [1, 1, n, 1, 1]): the same copies in the same order */
        const ir_value *r = ex->in[1];
        if (!r || !ir_value_is_const(r) || ir_value_numel(r) != 5)
            return NULL;
        for (int i = 0; i < 5; i++)
            if (i != 2 && ir_const_i64(r, i) != 1)
                return NULL;
    }
    if (e && e->rank != 5)
        return NULL;
    /* n_rep == 1: fold bypassed the Expand to the same shape, Reshape(Unsqueeze(kv)) is left */
    ir_value *us = ex ? ex->in[0] : e;
    ir_node *un = rz_producer(us, IR_OP_UNSQUEEZE);
    if (!un || us->rank != 5 || !ir_value_shape_known(us))
        return NULL;
    ir_value *kv = un->in[0];
    if (!kv || kv->rank != 4 || !ir_value_shape_known(kv))
        return NULL;
    const ir_dim *d = kv->dims;
    const int64_t B = d[0].value, H = d[1].value, T = d[2].value, hd = d[3].value;
    const int64_t n = ex ? e->dims[2].value : 1;
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
    if (ex)
        nodes[(*nn)++] = ex;
    nodes[(*nn)++] = rs;
    return kv;
}

/* ---------------------------------------------------------------- the matcher */

/* v is the QK MatMul's output, possibly under float Casts and scalar factors (a few steps). */
static bool leads_to_qk(const ir_value *v)
{
    for (int step = 0; v && step < 8; step++) {
        const ir_node *n = v->kind == IR_VAL_NODE ? v->producer : NULL;
        if (!n || n->dead)
            return false;
        if (n->op == IR_OP_MATMUL)
            return true;
        double c;
        if (n->op == IR_OP_CAST)
            v = n->in[0];
        else if ((n->op == IR_OP_MUL || n->op == IR_OP_DIV) && rz_const_scalar(n->in[1], &c))
            v = n->in[0];
        else if (n->op == IR_OP_MUL && rz_const_scalar(n->in[0], &c))
            v = n->in[1];
        else
            return false;
    }
    return false;
}

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
        } else if (n->op == IR_OP_TANH && m->softcap == 0 && m->scale > 0 && n->in[0] &&
                   m->mask_kind != MASK_NONE && same_shape(n->in[0], proto)) {
            /* Logit soft-capping (Gemma-2): every factor met so far multiplies c*tanh(x), so
             * it is the cap c; the factors below the tanh give x = s/c, and the kernel's scale
             * is their product times c (see build_attention). */
            m->softcap = m->scale;
            m->scale = 1.0;
            add_node(m, n);
            s = n->in[0];
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
            /* the mask is the operand computed from constants alone: a constant, or (above
             * fold's cap) the unfolded chain that mask_lazy_causal verifies */
            int slot = ir_value_is_const(n->in[1])   ? 0
                       : ir_value_is_const(n->in[0]) ? 1
                       : is_const_derived(n->in[1]) ? 0
                       : is_const_derived(n->in[0]) ? 1
                       /* a mask from the inputs (padding): follow the scores so that the
                        * attention is matched and then refused with a warning naming it */
                       : leads_to_qk(n->in[0]) && !leads_to_qk(n->in[1]) ? 0
                       : leads_to_qk(n->in[1]) && !leads_to_qk(n->in[0]) ? 1
                                                                         : -1;
            if (slot < 0 || !n->in[slot] || is_const_derived(n->in[slot]))
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

/* The dynamo exporter's SDPA decomposition transposes k as a 3-d tensor:
 *     kT = Reshape(Transpose(Reshape(k, [B*H, T, hd]), [0, 2, 1]), [B, H, hd, T])
 * which is Transpose(k, [0, 1, 3, 2]). Returns k (and records the three nodes) or NULL. */
static ir_value *kt_from_3d(const ir_uses *u, attn_match *m, ir_value *kt)
{
    ir_node *r2 = rz_producer(kt, IR_OP_RESHAPE);
    if (!r2 || kt->rank != 4 || !ir_value_shape_known(kt))
        return NULL;
    ir_value *y = r2->in[0];
    ir_node *t = rz_producer(y, IR_OP_TRANSPOSE);
    const ir_attr *pa = t ? ir_attr_get(t, "perm") : NULL;
    if (!t || !pa || pa->kind != IR_ATTR_INTS || pa->n != 3 || pa->ints[0] != 0 ||
        pa->ints[1] != 2 || pa->ints[2] != 1)
        return NULL;
    ir_value *z = t->in[0];
    ir_node *r1 = rz_producer(z, IR_OP_RESHAPE);
    if (!r1 || !z || z->rank != 3 || !ir_value_shape_known(z))
        return NULL;
    ir_value *k = r1->in[0];
    if (!k || k->rank != 4 || !ir_value_shape_known(k))
        return NULL;
    const int64_t B = k->dims[0].value, H = k->dims[1].value, T = k->dims[2].value,
                  D = k->dims[3].value;
    const int64_t zd[3] = {B * H, T, D}, ktd[4] = {B, H, D, T};
    if (!dims_are(z, 3, zd) || !dims_are(kt, 4, ktd))
        return NULL;
    if (rz_uses_exactly(u, kt, 1))
        add_node(m, r2);
    if (rz_uses_exactly(u, y, 1))
        add_node(m, t);
    if (rz_uses_exactly(u, z, 1))
        add_node(m, r1);
    return k;
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
    ir_value *k3 = NULL;
    if (!tr && (k3 = kt_from_3d(u, m, kt))) {
        m->k = k3; /* the dynamo SDPA decomposition: kT through [B*H, T, hd] */
    } else if (tr && perm4(tr, p)) {
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
static bool match_attention(ir_graph *g, const ir_uses *u, ir_node *mm2, attn_match *m,
                            mask_memo *memo)
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
    /* The SDPA decompositions (TorchScript and onnxscript) guard the softmax of a fully masked
     * row: Where(IsNaN(p), 0, p). Under a causal mask every row keeps its diagonal, so no row is
     * fully masked and the guard is the identity (the mask is proved causal below). */
    ir_node *guard = rz_producer(p, IR_OP_WHERE), *isnan = NULL;
    double zero;
    if (guard && rz_uses_exactly(u, p, 1) && guard->in[0] && guard->in[2] &&
        (isnan = rz_producer(guard->in[0], IR_OP_IS_NAN)) && isnan->in[0] == guard->in[2] &&
        rz_uses_exactly(u, guard->in[0], 1) && rz_uses_exactly(u, guard->in[2], 2) &&
        rz_const_scalar(guard->in[1], &zero) && zero == 0.0) {
        add_node(m, guard);
        add_node(m, isnan);
        p = guard->in[2];
        while (rz_uses_exactly(u, p, 1) && (n = float_cast(p))) {
            add_node(m, n);
            p = n->in[0];
        }
    } else {
        guard = NULL;
    }
    ir_node *sm = rz_producer(p, IR_OP_SOFTMAX);
    if (!sm || !rz_uses_exactly(u, p, guard ? 2 : 1) || p->rank != 4 || !ir_value_shape_known(p))
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
        for (int i = 0; i < nrk; i++)
            if (rz_uses_exactly(u, rk[i]->out[0], 1))
                add_node(m, rk[i]);
        for (int i = 0; i < nrv; i++)
            if (rz_uses_exactly(u, rv[i]->out[0], 1))
                add_node(m, rv[i]);
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
    if (m->softcap > 0)
        m->scale *= m->softcap; /* s = scale * q.k, then c * tanh(s / c) */
    if (!isfinite(m->scale) || !(m->scale > 0) || !isfinite(m->softcap))
        return false;
    if (mask_is_causal_memo(memo, m, sd))
        return true;
    /* Everything but the mask is attention: say why it stays unrecognised, since the only
     * other symptom is a later "no gradient rule for op MatMul"; the training program's
     * builder reads the refusal (g->refusals) to name this as the cause. */
    const bool constant = is_const_derived(m->mask);
    ir_refusal r = {
        .reason = constant ? IR_REFUSED_ATTENTION_MASK_CONSTANT : IR_REFUSED_ATTENTION_MASK_INPUT,
        .at = sm,
        .also = {mm1, mm2},
        .msg = ir_arena_printf(
            g->arena,
            "attention (MatMul '%s' .. Softmax .. MatMul '%s') is not recognised: its mask "
            "'%s' is %s; sbpc trains causal attention, optionally with a sliding window "
            "(keys i-w < j <= i), and nothing else (no padding, no bidirectional or "
            "input-dependent masks)",
            mm1->name, mm2->name, m->mask->name,
            constant ? "computed from constants but neither causal nor a causal sliding window"
                     : "computed from the model's inputs"),
    };
    ir_graph_refuse(g, &r); /* out of memory: an error, which stops the flow */
    return false;
}

/* Whether every use of n's outputs is by a node of m (a graph output is a use outside). */
static bool used_only_inside(const ir_uses *u, const ir_node *n, const attn_match *m)
{
    for (int o = 0; o < n->n_out; o++) {
        const ir_value *v = n->out[o];
        if (!v)
            continue;
        if (v->is_output)
            return false;
        for (int k = 0; k < u->n_uses[v->id]; k++) {
            bool inside = false;
            for (int i = 0; i < m->n_nodes && !inside; i++)
                inside = u->uses[v->id][k].node == m->nodes[i];
            if (!inside)
                return false;
        }
    }
    return true;
}

/* Drops from the replaced nodes those that must stay: the matchers check each piece's own use
 * count, but a piece used once by a node that itself stays is still needed. Found by
 * fuzz/fuzz_pipeline: a second layer's scores read the first layer's kT, so that Transpose
 * (two uses) stayed while the repeat_kv Reshape/Expand/Unsqueeze under it (one use each) were
 * replaced, and the kept Transpose read a value nothing defined any more. The same holds for a
 * scale Mul under a kept Transpose and for v's repeat_kv under a Reshape read elsewhere. Repeated
 * until nothing changes, since keeping one node keeps its producers' outputs in use. mm2 (the
 * root, whose output the Attention takes over) is always replaced. */
static void keep_shared_nodes(const ir_uses *u, const ir_node *mm2, attn_match *m)
{
    bool changed = true;
    while (changed) {
        changed = false;
        for (int i = 0; i < m->n_nodes; i++)
            if (m->nodes[i] != mm2 && !used_only_inside(u, m->nodes[i], m)) {
                m->nodes[i--] = m->nodes[--m->n_nodes];
                changed = true;
            }
    }
}

/* Builds Attention (and k's Transpose when needed) for a verified match. */
static int build_attention(ir_graph *g, const ir_uses *u, ir_node *mm2, attn_match *m)
{
    keep_shared_nodes(u, mm2, m);
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
    if (m->window > 0)
        ir_attr_set_int(g, att, "window", m->window);
    if (m->softcap > 0)
        ir_attr_set_float(g, att, "softcap", m->softcap);
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
    mask_memo memo = {0};
    if (!snap || !m) {
        rc = ir_diag_error(g->diag, "out of memory");
        goto out;
    }
    memcpy(snap, g->nodes, (size_t)n * sizeof *snap);
    for (int i = 0; i < n && rc == IR_OK; i++) {
        ir_node *mm2 = snap[i];
        if (mm2->dead || mm2->op != IR_OP_MATMUL)
            continue;
        if (match_attention(g, &u, mm2, m, &memo))
            rc = build_attention(g, &u, mm2, m);
    }
out:
    free(snap);
    free(m);
    return rc;
}
