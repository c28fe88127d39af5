/* shape.c — shape and dtype inference, one function per INFER name of ir/ops.def.
 *
 * Each function reads its node's inputs (dtype, rank, dims and, where the output shape depends
 * on them, the data of CONST inputs: Reshape's shape, Slice's starts, ...) and writes the
 * outputs' dtype and shape. A dim is a known extent, a symbol ("batch") or unknown:
 *   - symbols travel unchanged through elementwise ops, copies (Reshape's 0), transposes;
 *     1 broadcasts against anything; two different symbols broadcast to unknown;
 *   - arithmetic on symbols (products, sums, Slice of a symbolic dim) gives unknown;
 *   - unknown inputs give unknown outputs, never an error.
 * A contradiction between facts that are both known (inner dims of a MatMul, broadcast of 3
 * against 4, a Reshape that changes the element count, a negative dim from a constant) is an
 * error recorded with the node's name and op type and naming the input concerned.
 *
 * Outputs are merged, not overwritten: what inference cannot tell keeps what the value already
 * had (a type the importer read from the model's value_info); a known fact that disagrees with
 * a known declared one is an error. So re-running inference (after bind_dims, during fold) only
 * ever sharpens shapes.
 *
 * ir_node_new (ir.h's builder of a node with fresh, inferred outputs) lives here, at the end,
 * rather than in ir.c: it is the one builder that needs inference, and with it here the two
 * files depend one way only: shape.c uses ir.c's graph API (values, attributes,
 * ir_node_new_with_outputs), ir.c never calls into shape.c. A callback set on the graph would
 * also break the circle, but would hide the dependency instead of removing it.
 */
#include "ir.h"
#include "checked.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A shape under construction; rank -1 when unknown. */
typedef struct shp {
    int rank;
    ir_dim d[IR_MAX_RANK];
} shp;

static const ir_dim DIM_UNKNOWN = {-1, NULL};

static ir_dim dim_known(int64_t v) { return (ir_dim){v, NULL}; }
static bool dk(ir_dim d) { return d.value >= 0; }
static bool dsym(ir_dim d) { return d.value < 0 && d.sym != NULL; }

static const char *dim_str(ir_dim d, char *buf, size_t n)
{
    if (dk(d))
        snprintf(buf, n, "%lld", (long long)d.value);
    else
        snprintf(buf, n, "%s", d.sym ? d.sym : "?");
    return buf;
}

static ir_value *in_at(const ir_node *n, int i) { return i < n->n_in ? n->in[i] : NULL; }

static shp shp_of(const ir_value *v)
{
    shp s = {.rank = -1};
    if (!v || v->rank < 0)
        return s;
    s.rank = v->rank;
    for (int i = 0; i < v->rank; i++)
        s.d[i] = v->dims[i];
    return s;
}

static shp shp_unknown_rank(int rank)
{
    shp s = {.rank = rank};
    for (int i = 0; i < rank && i < IR_MAX_RANK; i++)
        s.d[i] = DIM_UNKNOWN;
    return s;
}

static int node_err(ir_graph *g, const ir_node *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int node_err(ir_graph *g, const ir_node *n, const char *fmt, ...)
{
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return ir_diag_add(g->diag, IR_SEV_ERROR, n->name, n->op_type, "%s", buf);
}

/* "input 1 ('x')" for messages. */
static const char *in_desc(const ir_node *n, int i, char *buf, size_t len)
{
    const ir_value *v = in_at(n, i);
    snprintf(buf, len, "input %d ('%s')", i, v ? v->name : "");
    return buf;
}

static const char *shp_str(const shp *s, char *buf, size_t n)
{
    if (s->rank < 0) {
        snprintf(buf, n, "[?]");
        return buf;
    }
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < s->rank && k < n; i++) {
        char db[32];
        k +=
            (size_t)snprintf(buf + k, n - k, "%s%s", i ? "," : "", dim_str(s->d[i], db, sizeof db));
    }
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}

/* Writes output `slot`, merging with what the value already holds (see the file comment). */
static int merge_out(ir_graph *g, ir_node *n, int slot, ir_dtype dt, const shp *s)
{
    ir_value *v = slot < n->n_out ? n->out[slot] : NULL;
    if (!v)
        return IR_OK;
    if (dt != IR_DT_UNDEFINED) {
        if (v->dtype != IR_DT_UNDEFINED && v->dtype != dt && v->kind == IR_VAL_NODE)
            return node_err(g, n, "output %d ('%s'): inferred dtype %s but the model declares %s",
                            slot, v->name, ir_dtype_name(dt), ir_dtype_name(v->dtype));
        v->dtype = dt;
    }
    if (!s || s->rank < 0)
        return IR_OK;
    if (s->rank > IR_MAX_RANK)
        return node_err(g, n, "output %d ('%s') would have rank %d; at most %d is supported", slot,
                        v->name, s->rank, IR_MAX_RANK);
    if (v->rank >= 0 && v->rank != s->rank) {
        char b1[160], b2[160];
        shp old = shp_of(v);
        return node_err(g, n, "output %d ('%s'): inferred shape %s but the model declares %s", slot,
                        v->name, shp_str(s, b1, sizeof b1), shp_str(&old, b2, sizeof b2));
    }
    if (v->rank < 0) {
        ir_dim *d = ir_arena_calloc(g->arena, (size_t)(s->rank ? s->rank : 1), sizeof(ir_dim));
        if (!d)
            return node_err(g, n, "out of memory");
        v->dims = d;
        v->rank = s->rank;
        for (int i = 0; i < s->rank; i++)
            v->dims[i] = s->d[i];
        return IR_OK;
    }
    for (int i = 0; i < s->rank; i++) {
        ir_dim d = s->d[i], e = v->dims[i];
        if (dk(d)) {
            if (dk(e) && e.value != d.value) {
                char b1[160], b2[160];
                shp old = shp_of(v);
                return node_err(
                    g, n, "output %d ('%s'): inferred shape %s but the model declares %s", slot,
                    v->name, shp_str(s, b1, sizeof b1), shp_str(&old, b2, sizeof b2));
            }
            v->dims[i] = d;
        } else if (dsym(d) && !dk(e)) {
            v->dims[i] = d;
        }
    }
    return IR_OK;
}

/* merge_out, then the size check (ir/checked.h): no shape leaves inference with dims whose
 * product wraps or that no target could hold, so later passes can multiply dims freely. This is
 * where a hostile Expand to [3, (2^64+2)/3] is stopped, naming the node. */
static int set_out(ir_graph *g, ir_node *n, int slot, ir_dtype dt, const shp *s)
{
    if (merge_out(g, n, slot, dt, s) != IR_OK)
        return IR_ERR;
    char what[32];
    snprintf(what, sizeof what, "output %d", slot);
    return ir_check_shape_size(g, n, what, slot < n->n_out ? n->out[slot] : NULL);
}

/* (ir.h) BOOL is read too (as 0 / 1), as the folder reads any operand: inference, the folder and
 * the attention recogniser's lazy mask evaluation then agree on what an operand says. */
int ir_const_ints(const ir_value *v, int64_t *out, int max)
{
    if (!ir_value_is_const(v) || !(ir_dtype_is_int(v->dtype) || v->dtype == IR_DT_BOOL))
        return -1;
    if (v->rank > 1)
        return -1;
    int64_t cnt = ir_value_numel(v);
    if (cnt < 0 || cnt > max)
        return -1;
    for (int64_t i = 0; i < cnt; i++)
        out[i] = ir_const_i64(v, i);
    return (int)cnt;
}

/* Length of a 1-D value (its dim 0) when known, else -1. */
static int64_t len_1d(const ir_value *v)
{
    if (!v || v->rank != 1 || !dk(v->dims[0]))
        return -1;
    return v->dims[0].value;
}

/* Normalises an axis against rank; -1 (after an error) when out of range. */
static int norm_axis(ir_graph *g, ir_node *n, int64_t axis, int rank, const char *what)
{
    if (axis < -rank || axis >= rank) {
        node_err(g, n, "%s %lld is out of range for rank %d", what, (long long)axis, rank);
        return -1;
    }
    return (int)(axis < 0 ? axis + rank : axis);
}

/* Product of dims: known when all are known; a lone symbol times known 1s stays that symbol;
 * anything else (a product involving symbols) is unknown. */
static ir_dim dim_product(const ir_dim *d, int n)
{
    int64_t p = 1;
    int n_other = 0;
    ir_dim other = DIM_UNKNOWN;
    for (int i = 0; i < n; i++) {
        if (dk(d[i])) {
            if (d[i].value == 0)
                return dim_known(0);
            if (p > INT64_MAX / d[i].value)
                return DIM_UNKNOWN;
            p *= d[i].value;
        } else {
            n_other++;
            other = d[i];
        }
    }
    if (n_other == 0)
        return dim_known(p);
    if (n_other == 1 && p == 1)
        return other;
    return DIM_UNKNOWN;
}

/* Numpy broadcast of one dim pair; IR_ERR when both are known and incompatible. */
static int bcast_dim(ir_dim a, ir_dim b, ir_dim *r)
{
    if (dk(a) && a.value == 1) {
        *r = b;
    } else if (dk(b) && b.value == 1) {
        *r = a;
    } else if (dk(a) && dk(b)) {
        if (a.value != b.value)
            return IR_ERR;
        *r = a;
    } else if (dk(a)) {
        *r = a; /* b is 1 or equal to a */
    } else if (dk(b)) {
        *r = b;
    } else if (a.sym && b.sym && strcmp(a.sym, b.sym) == 0) {
        *r = a;
    } else {
        *r = DIM_UNKNOWN;
    }
    return IR_OK;
}

/* Broadcasts the shapes of inputs first..first+count-1 (absent inputs skipped) into *out. */
static int bcast_inputs(ir_graph *g, ir_node *n, int first, int count, shp *out)
{
    out->rank = 0;
    int n_used = 0;
    for (int i = first; i < first + count; i++) {
        const ir_value *v = in_at(n, i);
        if (!v)
            continue;
        if (v->rank < 0) {
            out->rank = -1;
            return IR_OK;
        }
        if (n_used++ == 0) {
            *out = shp_of(v);
            continue;
        }
        int r = v->rank > out->rank ? v->rank : out->rank;
        shp res = {.rank = r};
        for (int k = 0; k < r; k++) {
            int ia = k - (r - out->rank), ib = k - (r - v->rank);
            ir_dim a = ia >= 0 ? out->d[ia] : dim_known(1);
            ir_dim b = ib >= 0 ? v->dims[ib] : dim_known(1);
            if (bcast_dim(a, b, &res.d[k]) != IR_OK) {
                char b1[32], b2[32], nb[128];
                return node_err(g, n,
                                "%s: cannot broadcast dim %s against %s (axis %d of the result)",
                                in_desc(n, i, nb, sizeof nb), dim_str(b, b1, sizeof b1),
                                dim_str(a, b2, sizeof b2), k);
            }
        }
        *out = res;
    }
    return IR_OK;
}

/* The dtype all inputs first..last share; an error when two known ones differ. */
static int common_dtype(ir_graph *g, ir_node *n, int first, int last, ir_dtype *dt)
{
    *dt = IR_DT_UNDEFINED;
    int at = -1;
    for (int i = first; i <= last && i < n->n_in; i++) {
        const ir_value *v = n->in[i];
        if (!v || v->dtype == IR_DT_UNDEFINED)
            continue;
        if (*dt == IR_DT_UNDEFINED) {
            *dt = v->dtype;
            at = i;
        } else if (v->dtype != *dt) {
            char nb[128];
            return node_err(g, n, "%s has dtype %s but input %d has %s",
                            in_desc(n, i, nb, sizeof nb), ir_dtype_name(v->dtype), at,
                            ir_dtype_name(*dt));
        }
    }
    return IR_OK;
}

/* Checks a dim read from a constant (shape inputs): -1 allowed only where allow_m1. */
static int check_const_dim(ir_graph *g, ir_node *n, int input, int64_t v, int idx, bool allow_m1)
{
    if (v >= 0 || (allow_m1 && v == -1))
        return IR_OK;
    char nb[128];
    return node_err(g, n, "%s: element %d is %lld, not a valid dimension",
                    in_desc(n, input, nb, sizeof nb), idx, (long long)v);
}

/* ------------------------------------------------------------------ elementwise */

static int infer_same(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0);
    if (!x)
        return set_out(g, n, 0, IR_DT_UNDEFINED, NULL);
    shp s = shp_of(x);
    ir_dtype dt = (n->op == IR_OP_NOT || n->op == IR_OP_IS_NAN || n->op == IR_OP_IS_INF)
                      ? IR_DT_BOOL : x->dtype;
    return set_out(g, n, 0, dt, &s);
}

static int infer_broadcast(ir_graph *g, ir_node *n)
{
    ir_dtype dt;
    if (common_dtype(g, n, 0, n->n_in - 1, &dt) != IR_OK)
        return IR_ERR;
    shp s;
    if (bcast_inputs(g, n, 0, n->n_in, &s) != IR_OK)
        return IR_ERR;
    return set_out(g, n, 0, dt, &s);
}

/* Pow: the base's dtype; the exponent may have another. */
static int infer_broadcast_lhs(ir_graph *g, ir_node *n)
{
    shp s;
    if (bcast_inputs(g, n, 0, n->n_in, &s) != IR_OK)
        return IR_ERR;
    return set_out(g, n, 0, in_at(n, 0) ? in_at(n, 0)->dtype : IR_DT_UNDEFINED, &s);
}

static int infer_compare(ir_graph *g, ir_node *n)
{
    ir_dtype dt;
    if (common_dtype(g, n, 0, n->n_in - 1, &dt) != IR_OK)
        return IR_ERR;
    shp s;
    if (bcast_inputs(g, n, 0, n->n_in, &s) != IR_OK)
        return IR_ERR;
    return set_out(g, n, 0, IR_DT_BOOL, &s);
}

static int infer_where(ir_graph *g, ir_node *n)
{
    ir_dtype dt;
    if (common_dtype(g, n, 1, 2, &dt) != IR_OK)
        return IR_ERR;
    const ir_value *c = in_at(n, 0);
    if (c && c->dtype != IR_DT_UNDEFINED && c->dtype != IR_DT_BOOL) {
        char nb[128];
        return node_err(g, n, "%s: the condition must be bool, not %s",
                        in_desc(n, 0, nb, sizeof nb), ir_dtype_name(c->dtype));
    }
    shp s;
    if (bcast_inputs(g, n, 0, 3, &s) != IR_OK)
        return IR_ERR;
    return set_out(g, n, 0, dt, &s);
}

static int infer_cast(ir_graph *g, ir_node *n)
{
    const ir_attr *to = ir_attr_get(n, "to");
    if (!to || to->kind != IR_ATTR_INT)
        return node_err(g, n, "Cast without an integer 'to' attribute");
    ir_dtype dt = (ir_dtype)to->i;
    if (ir_dtype_size(dt) == 0)
        return node_err(g, n, "Cast to unsupported dtype %lld", (long long)to->i);
    shp s = shp_of(in_at(n, 0));
    return set_out(g, n, 0, dt, &s);
}

static int infer_dropout(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0);
    shp s = shp_of(x);
    if (set_out(g, n, 0, x ? x->dtype : IR_DT_UNDEFINED, &s) != IR_OK)
        return IR_ERR;
    return set_out(g, n, 1, IR_DT_BOOL, &s);
}

static int infer_scalar_f32(ir_graph *g, ir_node *n)
{
    shp s = {.rank = 0};
    return set_out(g, n, 0, IR_DT_FLOAT, &s);
}

/* ------------------------------------------------------------------ shapes of shapes */

/* Shape: i64 [the dims taken], start/end attributes (opset 15) clamped (ir_shape_op_range). */
static int infer_shape(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0);
    if (!x || x->rank < 0)
        return set_out(g, n, 0, IR_DT_INT64, &(shp){.rank = 1, .d = {{-1, NULL}}});
    shp s = {.rank = 1, .d = {dim_known(ir_shape_op_range(n, x->rank, NULL))}};
    return set_out(g, n, 0, IR_DT_INT64, &s);
}

static int infer_size(ir_graph *g, ir_node *n)
{
    shp s = {.rank = 0};
    return set_out(g, n, 0, IR_DT_INT64, &s);
}

/* ------------------------------------------------------------------ linear algebra */

static int infer_matmul(ir_graph *g, ir_node *n)
{
    ir_dtype dt;
    if (common_dtype(g, n, 0, 1, &dt) != IR_OK)
        return IR_ERR;
    const ir_value *a = in_at(n, 0), *b = in_at(n, 1);
    if (!a || !b || a->rank < 0 || b->rank < 0)
        return set_out(g, n, 0, dt, NULL);
    if (a->rank == 0 || b->rank == 0)
        return node_err(g, n, "MatMul of a scalar (input %d)", a->rank == 0 ? 0 : 1);
    shp sa = shp_of(a), sb = shp_of(b);
    bool a_vec = sa.rank == 1, b_vec = sb.rank == 1;
    if (a_vec) { /* [K] -> [1,K] */
        sa.d[1] = sa.d[0];
        sa.d[0] = dim_known(1);
        sa.rank = 2;
    }
    if (b_vec) { /* [K] -> [K,1] */
        sb.d[1] = dim_known(1);
        sb.rank = 2;
    }
    ir_dim ka = sa.d[sa.rank - 1], kb = sb.d[sb.rank - 2];
    if (dk(ka) && dk(kb) && ka.value != kb.value)
        return node_err(
            g, n,
            "inner dims differ: input 0 ('%s') has %lld columns, input 1 ('%s') has %lld rows",
            a->name, (long long)ka.value, b->name, (long long)kb.value);
    /* batch dims: broadcast sa[:-2] with sb[:-2] */
    int ra = sa.rank - 2, rb = sb.rank - 2, r = ra > rb ? ra : rb;
    shp out = {.rank = r + 2};
    if (out.rank > IR_MAX_RANK)
        return node_err(g, n, "result rank %d exceeds %d", out.rank, IR_MAX_RANK);
    for (int k = 0; k < r; k++) {
        int ia = k - (r - ra), ib = k - (r - rb);
        ir_dim da = ia >= 0 ? sa.d[ia] : dim_known(1), db = ib >= 0 ? sb.d[ib] : dim_known(1);
        if (bcast_dim(da, db, &out.d[k]) != IR_OK) {
            char b1[32], b2[32];
            return node_err(
                g, n, "batch dims do not broadcast: input 0 ('%s') has %s, input 1 ('%s') has %s",
                a->name, dim_str(da, b1, sizeof b1), b->name, dim_str(db, b2, sizeof b2));
        }
    }
    out.d[r] = sa.d[sa.rank - 2];
    out.d[r + 1] = sb.d[sb.rank - 1];
    if (b_vec) /* drop the appended N = 1 */
        out.rank--;
    if (a_vec) { /* drop the prepended M = 1 */
        if (!b_vec)
            out.d[out.rank - 2] = out.d[out.rank - 1];
        out.rank--;
    }
    return set_out(g, n, 0, dt, &out);
}

static int infer_gemm(ir_graph *g, ir_node *n)
{
    ir_dtype dt;
    if (common_dtype(g, n, 0, 1, &dt) != IR_OK)
        return IR_ERR;
    const ir_value *a = in_at(n, 0), *b = in_at(n, 1), *c = in_at(n, 2);
    if (!a || !b || a->rank < 0 || b->rank < 0)
        return set_out(g, n, 0, dt, &(shp){.rank = 2, .d = {{-1, NULL}, {-1, NULL}}});
    if (a->rank != 2 || b->rank != 2)
        return node_err(g, n, "Gemm needs rank-2 inputs; input %d ('%s') has rank %d",
                        a->rank != 2 ? 0 : 1, a->rank != 2 ? a->name : b->name,
                        a->rank != 2 ? a->rank : b->rank);
    bool ta = ir_attr_int(n, "transA", 0) != 0, tb = ir_attr_int(n, "transB", 0) != 0;
    ir_dim m = a->dims[ta ? 1 : 0], ka = a->dims[ta ? 0 : 1];
    ir_dim kb = b->dims[tb ? 1 : 0], nn = b->dims[tb ? 0 : 1];
    if (dk(ka) && dk(kb) && ka.value != kb.value)
        return node_err(
            g, n, "inner dims differ: input 0 ('%s') gives K=%lld, input 1 ('%s') gives K=%lld",
            a->name, (long long)ka.value, b->name, (long long)kb.value);
    shp out = {.rank = 2, .d = {m, nn}};
    if (c && c->rank >= 0) {
        if (c->rank > 2)
            return node_err(g, n, "input 2 ('%s') has rank %d; Gemm's C broadcasts to 2-D", c->name,
                            c->rank);
        for (int k = 0; k < c->rank; k++) {
            ir_dim cd = c->dims[k], od = out.d[2 - c->rank + k], r;
            if (bcast_dim(od, cd, &r) != IR_OK) {
                char b1[32], b2[32];
                return node_err(g, n, "input 2 ('%s'): dim %s does not broadcast to %s", c->name,
                                dim_str(cd, b1, sizeof b1), dim_str(od, b2, sizeof b2));
            }
        }
    }
    return set_out(g, n, 0, dt, &out);
}

static int infer_linear(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0), *w = in_at(n, 1), *b = in_at(n, 2);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    if (!x || !w || x->rank < 0 || w->rank < 0)
        return set_out(g, n, 0, dt, NULL);
    if (w->rank != 2)
        return node_err(g, n, "input 1 ('%s'): the weight must be [K,N], not rank %d", w->name,
                        w->rank);
    if (x->rank < 1)
        return node_err(g, n, "input 0 ('%s') is a scalar", x->name);
    /* W is [K,N], or [N,K] with trans_w = 1 (torch's layout; how re-tied heads read). */
    int tw = ir_attr_int(n, "trans_w", 0) ? 1 : 0;
    ir_dim k = x->dims[x->rank - 1], wk = w->dims[tw], wn = w->dims[1 - tw];
    if (dk(k) && dk(wk) && k.value != wk.value)
        return node_err(g, n, "input 1 ('%s') has %lld %s but input 0 ('%s') has %lld features",
                        w->name, (long long)wk.value, tw ? "columns" : "rows", x->name,
                        (long long)k.value);
    if (b && b->rank == 1 && dk(b->dims[0]) && dk(wn) && b->dims[0].value != wn.value)
        return node_err(g, n, "input 2 ('%s') has %lld elements, the output has %lld features",
                        b->name, (long long)b->dims[0].value, (long long)wn.value);
    shp out = shp_of(x);
    out.d[out.rank - 1] = wn;
    return set_out(g, n, 0, dt, &out);
}

static int infer_embedding(ir_graph *g, ir_node *n)
{
    const ir_value *t = in_at(n, 0), *ids = in_at(n, 1);
    ir_dtype dt = t ? t->dtype : IR_DT_UNDEFINED;
    if (!t || !ids || t->rank < 0 || ids->rank < 0)
        return set_out(g, n, 0, dt, NULL);
    if (t->rank != 2)
        return node_err(g, n, "input 0 ('%s'): the table must be [V,D], not rank %d", t->name,
                        t->rank);
    if (ids->dtype != IR_DT_UNDEFINED && !ir_dtype_is_int(ids->dtype))
        return node_err(g, n, "input 1 ('%s'): ids must be integers, not %s", ids->name,
                        ir_dtype_name(ids->dtype));
    shp out = shp_of(ids);
    if (out.rank + 1 > IR_MAX_RANK)
        return node_err(g, n, "result rank exceeds %d", IR_MAX_RANK);
    out.d[out.rank++] = t->dims[1];
    return set_out(g, n, 0, dt, &out);
}

/* ------------------------------------------------------------------ indexing and layout */

static int infer_gather(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0), *idx = in_at(n, 1);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    if (!x || !idx || x->rank < 0 || idx->rank < 0)
        return set_out(g, n, 0, dt, NULL);
    if (x->rank == 0)
        return node_err(g, n, "input 0 ('%s') is a scalar; Gather needs rank >= 1", x->name);
    int axis = norm_axis(g, n, ir_attr_int(n, "axis", 0), x->rank, "axis");
    if (axis < 0)
        return IR_ERR;
    if (x->rank - 1 + idx->rank > IR_MAX_RANK)
        return node_err(g, n, "result rank exceeds %d", IR_MAX_RANK);
    if (idx->dtype != IR_DT_UNDEFINED && !ir_dtype_is_int(idx->dtype))
        return node_err(g, n, "input 1 ('%s'): indices must be integers, not %s", idx->name,
                        ir_dtype_name(idx->dtype));
    /* Constant indices must lie in [-d, d). */
    if (ir_value_is_const(idx) && dk(x->dims[axis])) {
        int64_t d = x->dims[axis].value, cnt = ir_value_numel(idx);
        for (int64_t i = 0; i < cnt; i++) {
            int64_t k = ir_const_i64(idx, i);
            if (k < -d || k >= d)
                return node_err(g, n,
                                "input 1 ('%s'): index %lld is out of range for dim %d of "
                                "input 0 ('%s'), which is %lld",
                                idx->name, (long long)k, axis, x->name, (long long)d);
        }
    }
    shp out = {.rank = 0};
    for (int i = 0; i < axis; i++)
        out.d[out.rank++] = x->dims[i];
    for (int i = 0; i < idx->rank; i++)
        out.d[out.rank++] = idx->dims[i];
    for (int i = axis + 1; i < x->rank; i++)
        out.d[out.rank++] = x->dims[i];
    return set_out(g, n, 0, dt, &out);
}

/* CumSum(x, axis): like x. ONNX types it for numbers only: a bool input is invalid (onnxruntime
 * refuses such a model), so it is refused here rather than given a meaning. */
static int infer_cumsum(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0);
    if (x && (x->dtype == IR_DT_BOOL || x->dtype == IR_DT_STRING)) {
        char nb[128];
        return node_err(g, n, "%s: CumSum of %s is not valid ONNX (numbers only)",
                        in_desc(n, 0, nb, sizeof nb), ir_dtype_name(x->dtype));
    }
    return infer_same(g, n);
}

/* GatherND(data [r dims], indices [q dims], batch_dims b): indices' last dim k picks a slice of
 * data; out = indices.shape[:-1] ++ data.shape[b + k:]. */
static int infer_gather_nd(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0), *idx = in_at(n, 1);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    if (!x || !idx || x->rank < 0 || idx->rank < 0)
        return set_out(g, n, 0, dt, NULL);
    if (idx->rank < 1 || x->rank < 1)
        return node_err(g, n, "GatherND needs data and indices of rank >= 1");
    if (idx->dtype != IR_DT_INT64 && idx->dtype != IR_DT_UNDEFINED)
        return node_err(g, n, "input 1 ('%s'): GatherND indices must be int64, not %s",
                        idx->name, ir_dtype_name(idx->dtype));
    int64_t b = ir_attr_int(n, "batch_dims", 0);
    if (b < 0 || b >= idx->rank || b >= x->rank)
        return node_err(g, n, "batch_dims %lld is out of range", (long long)b);
    if (!dk(idx->dims[idx->rank - 1]))
        return set_out(g, n, 0, dt, NULL);
    int64_t k = idx->dims[idx->rank - 1].value;
    if (k < 1 || k > x->rank - b)
        return node_err(g, n, "input 1 ('%s'): the last dim of the indices (%lld) plus batch_dims "
                        "exceeds the rank of the data (%d)", idx->name, (long long)k, x->rank);
    shp out = {.rank = 0};
    if (idx->rank - 1 + x->rank - b - k > IR_MAX_RANK)
        return node_err(g, n, "result rank exceeds %d", IR_MAX_RANK);
    for (int i = 0; i < idx->rank - 1; i++)
        out.d[out.rank++] = idx->dims[i];
    for (int64_t i = b + k; i < x->rank; i++)
        out.d[out.rank++] = x->dims[i];
    return set_out(g, n, 0, dt, &out);
}

/* ScatterND(data, indices, updates): data's shape and dtype. */
static int infer_scatter_nd(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0), *idx = in_at(n, 1);
    if (idx && idx->dtype != IR_DT_INT64 && idx->dtype != IR_DT_UNDEFINED)
        return node_err(g, n, "input 1 ('%s'): ScatterND indices must be int64, not %s",
                        idx->name, ir_dtype_name(idx->dtype));
    if (!x)
        return set_out(g, n, 0, IR_DT_UNDEFINED, NULL);
    shp s = shp_of(x);
    return set_out(g, n, 0, x->dtype, &s);
}

/* The axes of Unsqueeze/Squeeze/Reduce*: input 1 when present (opset 13+, ReduceMean 18+),
 * else the 'axes' attribute. Returns the count, -1 when given but not constant (with
 * *count_if_known the number of axes when the input's length is known, else -1), -2 when
 * absent. */
static int get_axes(const ir_node *n, int64_t *axes, int max, int *count_if_known)
{
    const ir_value *a = in_at(n, 1);
    *count_if_known = -1;
    if (a) {
        int k = ir_const_ints(a, axes, max);
        if (k < 0) {
            int64_t l = len_1d(a);
            *count_if_known = l >= 0 && l <= max ? (int)l : -1;
            return -1;
        }
        return k;
    }
    const ir_attr *at = ir_attr_get(n, "axes");
    if (!at || at->kind != IR_ATTR_INTS)
        return -2;
    if (at->n > max)
        return -1;
    for (int i = 0; i < at->n; i++)
        axes[i] = at->ints[i];
    return at->n;
}

/* Normalises axes against rank, rejecting duplicates; marks[] gets 1 per axis. */
static int norm_axes(ir_graph *g, ir_node *n, const int64_t *axes, int k, int rank, bool *marks)
{
    for (int i = 0; i < rank; i++)
        marks[i] = false;
    for (int i = 0; i < k; i++) {
        int a = norm_axis(g, n, axes[i], rank, "axis");
        if (a < 0)
            return IR_ERR;
        if (marks[a])
            return node_err(g, n, "axis %lld appears twice", (long long)axes[i]);
        marks[a] = true;
    }
    return IR_OK;
}

static int infer_unsqueeze(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    int64_t axes[IR_MAX_RANK + 1];
    int known;
    int k = get_axes(n, axes, IR_MAX_RANK + 1, &known);
    if (k == -2)
        return node_err(g, n, "Unsqueeze without axes");
    if (!x || x->rank < 0)
        return set_out(g, n, 0, dt, NULL);
    if (k < 0) {
        shp s = shp_unknown_rank(known >= 0 ? x->rank + known : -1);
        if (s.rank > IR_MAX_RANK)
            return node_err(g, n, "result rank exceeds %d", IR_MAX_RANK);
        return set_out(g, n, 0, dt, &s);
    }
    int r = x->rank + k;
    if (r > IR_MAX_RANK)
        return node_err(g, n, "result rank %d exceeds %d", r, IR_MAX_RANK);
    bool marks[IR_MAX_RANK];
    if (norm_axes(g, n, axes, k, r, marks) != IR_OK)
        return IR_ERR;
    shp out = {.rank = r};
    for (int i = 0, j = 0; i < r; i++)
        out.d[i] = marks[i] ? dim_known(1) : x->dims[j++];
    return set_out(g, n, 0, dt, &out);
}

static int infer_squeeze(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    int64_t axes[IR_MAX_RANK + 1];
    int known;
    int k = get_axes(n, axes, IR_MAX_RANK + 1, &known);
    if (!x || x->rank < 0)
        return set_out(g, n, 0, dt, NULL);
    if (k == -1) {
        shp s = shp_unknown_rank(known >= 0 && known <= x->rank ? x->rank - known : -1);
        return set_out(g, n, 0, dt, &s);
    }
    bool marks[IR_MAX_RANK];
    if (k == -2) { /* no axes: every dim of extent 1 goes; needs all dims known */
        for (int i = 0; i < x->rank; i++) {
            if (!dk(x->dims[i]))
                return set_out(g, n, 0, dt, NULL);
            marks[i] = x->dims[i].value == 1;
        }
    } else if (norm_axes(g, n, axes, k, x->rank, marks) != IR_OK) {
        return IR_ERR;
    }
    shp out = {.rank = 0};
    for (int i = 0; i < x->rank; i++) {
        if (!marks[i]) {
            out.d[out.rank++] = x->dims[i];
            continue;
        }
        if (dk(x->dims[i]) && x->dims[i].value != 1)
            return node_err(g, n, "input 0 ('%s'): cannot squeeze axis %d of extent %lld", x->name,
                            i, (long long)x->dims[i].value);
    }
    return set_out(g, n, 0, dt, &out);
}

static int infer_concat(ir_graph *g, ir_node *n)
{
    ir_dtype dt;
    if (common_dtype(g, n, 0, n->n_in - 1, &dt) != IR_OK)
        return IR_ERR;
    const ir_attr *ax = ir_attr_get(n, "axis");
    if (!ax || ax->kind != IR_ATTR_INT)
        return node_err(g, n, "Concat without an 'axis' attribute");
    int rank = -1, first = -1;
    for (int i = 0; i < n->n_in; i++) {
        const ir_value *v = n->in[i];
        if (!v || v->rank < 0)
            continue;
        if (rank < 0) {
            rank = v->rank;
            first = i;
        } else if (v->rank != rank) {
            char nb[128];
            return node_err(g, n, "%s has rank %d but input %d has rank %d",
                            in_desc(n, i, nb, sizeof nb), v->rank, first, rank);
        }
    }
    if (rank < 0)
        return set_out(g, n, 0, dt, NULL);
    if (rank == 0)
        return node_err(g, n, "Concat of scalars");
    int axis = norm_axis(g, n, ax->i, rank, "axis");
    if (axis < 0)
        return IR_ERR;
    bool all_ranked = true;
    shp out = {.rank = rank};
    for (int k = 0; k < rank; k++)
        out.d[k] = DIM_UNKNOWN;
    int64_t sum = 0;
    int n_unknown = 0;
    ir_dim lone = DIM_UNKNOWN;
    for (int i = 0; i < n->n_in; i++) {
        const ir_value *v = n->in[i];
        if (!v)
            continue;
        if (v->rank < 0) {
            all_ranked = false;
            continue;
        }
        for (int k = 0; k < rank; k++) {
            if (k == axis)
                continue;
            ir_dim d = v->dims[k];
            if (dk(out.d[k]) && dk(d) && out.d[k].value != d.value) {
                char nb[128];
                return node_err(g, n, "%s has %lld at axis %d where the other inputs have %lld",
                                in_desc(n, i, nb, sizeof nb), (long long)d.value, k,
                                (long long)out.d[k].value);
            }
            if (dk(d) || (dsym(d) && !dk(out.d[k])))
                out.d[k] = d;
        }
        ir_dim d = v->dims[axis];
        if (dk(d)) {
            if (!ck_add_i64(sum, d.value, &sum)) {
                char nb[128];
                return node_err(g, n, "the extents along axis %d add up to more than 64 bits "
                                "at %s (%lld)", axis, in_desc(n, i, nb, sizeof nb),
                                (long long)d.value);
            }
        } else {
            n_unknown++;
            lone = d;
        }
    }
    if (!all_ranked || n_unknown > 1 || (n_unknown == 1 && sum != 0))
        out.d[axis] = DIM_UNKNOWN;
    else
        out.d[axis] = n_unknown ? lone : dim_known(sum);
    return set_out(g, n, 0, dt, &out);
}

static int infer_reshape(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0), *sv = in_at(n, 1);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    int64_t t[IR_MAX_RANK + 1];
    int k = sv ? ir_const_ints(sv, t, IR_MAX_RANK + 1) : -1;
    if (k < 0) {
        int64_t l = len_1d(sv);
        if (l > IR_MAX_RANK)
            return node_err(g, n, "input 1 ('%s'): target rank %lld exceeds %d", sv->name,
                            (long long)l, IR_MAX_RANK);
        shp s = shp_unknown_rank(l >= 0 ? (int)l : -1);
        return set_out(g, n, 0, dt, &s);
    }
    if (sv->rank != 1)
        return node_err(g, n, "input 1 ('%s'): the shape must be 1-D", sv->name);
    bool allowzero = ir_attr_int(n, "allowzero", 0) != 0;
    shp out = {.rank = k};
    int neg = -1;
    for (int i = 0; i < k; i++) {
        if (check_const_dim(g, n, 1, t[i], i, true) != IR_OK)
            return IR_ERR;
        if (t[i] == -1) {
            if (neg >= 0)
                return node_err(g, n, "input 1 ('%s'): more than one -1 in the shape", sv->name);
            neg = i;
            out.d[i] = DIM_UNKNOWN;
        } else if (t[i] == 0 && !allowzero) {
            if (!x || x->rank < 0) {
                out.d[i] = DIM_UNKNOWN;
            } else if (i >= x->rank) {
                return node_err(g, n,
                                "input 1 ('%s'): element %d is 0 (copy) but input 0 ('%s') "
                                "has rank %d",
                                sv->name, i, x->name, x->rank);
            } else {
                out.d[i] = x->dims[i];
            }
        } else {
            out.d[i] = dim_known(t[i]);
        }
    }
    if (allowzero && neg >= 0)
        for (int i = 0; i < k; i++)
            if (t[i] == 0)
                return node_err(g, n, "input 1 ('%s'): -1 together with 0 under allowzero",
                                sv->name);
    if (!x || x->rank < 0)
        return set_out(g, n, 0, dt, &out);
    /* Cancel symbolic dims shared by input and output; the rest must multiply to the same. */
    bool used[IR_MAX_RANK] = {false};
    int64_t pin = 1, pout = 1;
    bool in_known = true, out_known = true, overflow = false;
    for (int i = 0; i < k; i++) {
        if (i == neg)
            continue;
        ir_dim d = out.d[i];
        if (dk(d)) {
            if (d.value && pout > INT64_MAX / d.value)
                overflow = true;
            else
                pout *= d.value;
            continue;
        }
        bool matched = false;
        if (d.sym)
            for (int j = 0; j < x->rank && !matched; j++)
                if (!used[j] && dsym(x->dims[j]) && strcmp(x->dims[j].sym, d.sym) == 0)
                    used[j] = matched = true;
        if (!matched)
            out_known = false;
    }
    for (int j = 0; j < x->rank; j++) {
        if (used[j])
            continue;
        ir_dim d = x->dims[j];
        if (!dk(d))
            in_known = false;
        else if (d.value && pin > INT64_MAX / d.value)
            overflow = true;
        else
            pin *= d.value;
    }
    if (overflow || !in_known || !out_known)
        return set_out(g, n, 0, dt, &out);
    char b1[160], b2[160], sb[256];
    size_t p = (size_t)snprintf(sb, sizeof sb, "[");
    for (int i = 0; i < k && p < sizeof sb; i++)
        p += (size_t)snprintf(sb + p, sizeof sb - p, "%s%lld", i ? "," : "", (long long)t[i]);
    if (p < sizeof sb)
        snprintf(sb + p, sizeof sb - p, "]");
    shp xs = shp_of(x);
    if (neg >= 0) {
        if (pout == 0 || pin % pout != 0)
            return node_err(g, n, "cannot reshape input 0 ('%s') %s (%lld elements) to %s", x->name,
                            shp_str(&xs, b1, sizeof b1), (long long)pin, sb);
        out.d[neg] = dim_known(pin / pout);
    } else if (pin != pout) {
        return node_err(g, n,
                        "cannot reshape input 0 ('%s') %s (%lld elements) to %s (%lld elements)",
                        x->name, shp_str(&xs, b1, sizeof b1), (long long)pin,
                        shp_str(&out, b2, sizeof b2), (long long)pout);
    }
    return set_out(g, n, 0, dt, &out);
}

static int infer_flatten(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    if (!x || x->rank < 0)
        return set_out(g, n, 0, dt, &(shp){.rank = 2, .d = {{-1, NULL}, {-1, NULL}}});
    int64_t a = ir_attr_int(n, "axis", 1);
    if (a < -x->rank || a > x->rank)
        return node_err(g, n, "axis %lld is out of range for rank %d", (long long)a, x->rank);
    int axis = (int)(a < 0 ? a + x->rank : a);
    shp out = {.rank = 2,
               .d = {dim_product(x->dims, axis), dim_product(x->dims + axis, x->rank - axis)}};
    return set_out(g, n, 0, dt, &out);
}

static int infer_transpose(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    const ir_attr *p = ir_attr_get(n, "perm");
    if (!x || x->rank < 0) {
        shp s = shp_unknown_rank(p && p->kind == IR_ATTR_INTS ? p->n : -1);
        if (s.rank > IR_MAX_RANK)
            s.rank = -1;
        return set_out(g, n, 0, dt, &s);
    }
    shp out = {.rank = x->rank};
    if (!p) {
        for (int i = 0; i < x->rank; i++)
            out.d[i] = x->dims[x->rank - 1 - i];
        return set_out(g, n, 0, dt, &out);
    }
    if (p->kind != IR_ATTR_INTS || p->n != x->rank)
        return node_err(g, n, "perm has %d entries but input 0 ('%s') has rank %d", p->n, x->name,
                        x->rank);
    bool seen[IR_MAX_RANK] = {false};
    for (int i = 0; i < p->n; i++) {
        int64_t a = p->ints[i];
        if (a < 0 || a >= x->rank || seen[a])
            return node_err(g, n, "perm is not a permutation of 0..%d (entry %d is %lld)",
                            x->rank - 1, i, (long long)a);
        seen[a] = true;
        out.d[i] = x->dims[a];
    }
    return set_out(g, n, 0, dt, &out);
}

/* (ir.h) start and end are clamped into [-1, d] before any difference is taken, and the step
 * is at least -INT64_MAX, so nothing here wraps whatever the model's numbers. */
int64_t ir_slice_axis(int64_t d, int64_t start, int64_t end, int64_t step, int64_t *start_out)
{
    if (step < -INT64_MAX)
        step = -INT64_MAX;
    if (start < 0)
        start += d;
    if (end < 0)
        end += d;
    if (step > 0) {
        start = start < 0 ? 0 : start > d ? d : start;
        end = end < 0 ? 0 : end > d ? d : end;
    } else {
        start = start < 0 ? 0 : start > d - 1 ? d - 1 : start;
        end = end < -1 ? -1 : end > d - 1 ? d - 1 : end;
    }
    if (start_out)
        *start_out = start;
    if (step > 0)
        return end > start ? (end - start - 1) / step + 1 : 0;
    return start > end ? (start - end - 1) / (-step) + 1 : 0;
}

int64_t ir_shape_op_range(const ir_node *n, int64_t r, int64_t *start_out)
{
    return ir_slice_axis(r, ir_attr_int(n, "start", 0), ir_attr_int(n, "end", r), 1, start_out);
}

/* Starts/ends/axes/steps of a Slice as per-axis arrays (unsliced axes: 0, INT64_MAX, 1);
 * returns IR_OK with *known = false when some of them are not constant. */
static int slice_params(ir_graph *g, ir_node *n, int rank, int64_t *st, int64_t *en, int64_t *sp,
                        bool *sliced, bool *known)
{
    int64_t s[IR_MAX_RANK + 1], e[IR_MAX_RANK + 1], a[IR_MAX_RANK + 1], p[IR_MAX_RANK + 1];
    *known = false;
    for (int i = 0; i < rank; i++) {
        st[i] = 0;
        en[i] = INT64_MAX;
        sp[i] = 1;
        sliced[i] = false;
    }
    const ir_value *vs = in_at(n, 1), *ve = in_at(n, 2), *va = in_at(n, 3), *vp = in_at(n, 4);
    int ks = ir_const_ints(vs, s, IR_MAX_RANK + 1), ke = ir_const_ints(ve, e, IR_MAX_RANK + 1);
    if (ks < 0 || ke < 0)
        return IR_OK;
    if (ks != ke)
        return node_err(g, n, "input 1 ('%s') has %d starts but input 2 ('%s') has %d ends",
                        vs->name, ks, ve->name, ke);
    int ka = ks, kp = ks;
    if (va) {
        ka = ir_const_ints(va, a, IR_MAX_RANK + 1);
        if (ka < 0)
            return IR_OK;
    } else {
        for (int i = 0; i < ks; i++)
            a[i] = i;
    }
    if (vp) {
        kp = ir_const_ints(vp, p, IR_MAX_RANK + 1);
        if (kp < 0)
            return IR_OK;
    } else {
        for (int i = 0; i < ks; i++)
            p[i] = 1;
    }
    if (ka != ks || kp != ks)
        return node_err(g, n, "starts, ends, axes and steps differ in length (%d, %d, %d, %d)", ks,
                        ke, ka, kp);
    for (int i = 0; i < ks; i++) {
        int ax = norm_axis(g, n, a[i], rank, "axis");
        if (ax < 0)
            return IR_ERR;
        if (sliced[ax])
            return node_err(g, n, "axis %lld is sliced twice", (long long)a[i]);
        if (p[i] == 0)
            return node_err(g, n, "input 4 ('%s'): step 0", vp ? vp->name : "");
        sliced[ax] = true;
        st[ax] = s[i];
        en[ax] = e[i];
        sp[ax] = p[i] < -INT64_MAX ? -INT64_MAX : p[i];
    }
    *known = true;
    return IR_OK;
}

static int infer_slice(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    if (!x || x->rank < 0)
        return set_out(g, n, 0, dt, NULL);
    int64_t st[IR_MAX_RANK], en[IR_MAX_RANK], sp[IR_MAX_RANK];
    bool sliced[IR_MAX_RANK], known;
    if (slice_params(g, n, x->rank, st, en, sp, sliced, &known) != IR_OK)
        return IR_ERR;
    shp out = shp_of(x);
    if (!known) {
        int64_t ax[IR_MAX_RANK + 1];
        int ka = in_at(n, 3) ? ir_const_ints(in_at(n, 3), ax, IR_MAX_RANK + 1) : -1;
        if (ka < 0) {
            out = shp_unknown_rank(x->rank);
        } else {
            for (int i = 0; i < ka; i++) {
                int a = norm_axis(g, n, ax[i], x->rank, "axis");
                if (a < 0)
                    return IR_ERR;
                out.d[a] = DIM_UNKNOWN;
            }
        }
        return set_out(g, n, 0, dt, &out);
    }
    for (int i = 0; i < x->rank; i++) {
        if (!sliced[i])
            continue;
        ir_dim d = x->dims[i];
        if (dk(d))
            out.d[i] = dim_known(ir_slice_axis(d.value, st[i], en[i], sp[i], NULL));
        else if (!(sp[i] == 1 && st[i] == 0 && en[i] >= INT32_MAX))
            out.d[i] = DIM_UNKNOWN; /* a whole symbolic axis keeps its symbol */
    }
    return set_out(g, n, 0, dt, &out);
}

static int infer_split(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    int nout = n->n_out;
    if (!x || x->rank < 0) {
        for (int i = 0; i < nout; i++)
            if (set_out(g, n, i, dt, NULL) != IR_OK)
                return IR_ERR;
        return IR_OK;
    }
    if (x->rank == 0)
        return node_err(g, n, "input 0 ('%s') is a scalar", x->name);
    int axis = norm_axis(g, n, ir_attr_int(n, "axis", 0), x->rank, "axis");
    if (axis < 0)
        return IR_ERR;
    int64_t *sizes = ir_arena_calloc(g->arena, (size_t)nout + 1, sizeof(int64_t));
    if (!sizes)
        return node_err(g, n, "out of memory");
    bool have = false;
    const ir_value *sv = in_at(n, 1);
    const ir_attr *sa = ir_attr_get(n, "split");
    ir_dim d = x->dims[axis];
    if (sv) {
        if (ir_value_is_const(sv)) {
            int64_t cnt = ir_value_numel(sv);
            if (cnt != nout)
                return node_err(g, n, "input 1 ('%s') has %lld sizes for %d outputs", sv->name,
                                (long long)cnt, nout);
            if (!ir_dtype_is_int(sv->dtype))
                return node_err(g, n, "input 1 ('%s'): split sizes must be integers, not %s",
                                sv->name, ir_dtype_name(sv->dtype));
            for (int i = 0; i < nout; i++)
                sizes[i] = ir_const_i64(sv, i);
            have = true;
        }
    } else if (sa && sa->kind == IR_ATTR_INTS) {
        if (sa->n != nout)
            return node_err(g, n, "'split' has %d sizes for %d outputs", sa->n, nout);
        for (int i = 0; i < nout; i++)
            sizes[i] = sa->ints[i];
        have = true;
    } else if (dk(d)) {
        int64_t parts = ir_attr_int(n, "num_outputs", nout);
        if (parts != nout)
            return node_err(g, n, "num_outputs is %lld but the node has %d outputs",
                            (long long)parts, nout);
        int64_t chunk = d.value / nout + (d.value % nout != 0); /* ceil, without d + nout */
        if (!ir_attr_get(n, "num_outputs") && d.value % nout != 0)
            return node_err(g, n,
                            "input 0 ('%s'): dim %d (%lld) does not split into %d equal parts",
                            x->name, axis, (long long)d.value, nout);
        for (int i = 0; i < nout; i++) {
            int64_t rest = d.value - chunk * i;
            sizes[i] = rest < 0 ? 0 : rest < chunk ? rest : chunk;
        }
        have = true;
    }
    if (have) {
        int64_t sum = 0;
        for (int i = 0; i < nout; i++) {
            if (sizes[i] < 0)
                return node_err(g, n, "split size %d is negative (%lld)", i, (long long)sizes[i]);
            if (!ck_add_i64(sum, sizes[i], &sum))
                return node_err(g, n, "split sizes add up to more than 64 bits (size %d is %lld)",
                                i, (long long)sizes[i]);
        }
        if (dk(d) && sum != d.value)
            return node_err(g, n, "split sizes add up to %lld but dim %d of input 0 ('%s') is %lld",
                            (long long)sum, axis, x->name, (long long)d.value);
    }
    for (int i = 0; i < nout; i++) {
        shp out = shp_of(x);
        out.d[axis] = have ? dim_known(sizes[i]) : DIM_UNKNOWN;
        if (set_out(g, n, i, dt, &out) != IR_OK)
            return IR_ERR;
    }
    return IR_OK;
}

static int infer_expand(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0), *sv = in_at(n, 1);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    int64_t t[IR_MAX_RANK + 1];
    int k = sv ? ir_const_ints(sv, t, IR_MAX_RANK + 1) : -1;
    if (k < 0) {
        int64_t l = len_1d(sv);
        int r = -1;
        if (l >= 0 && x && x->rank >= 0)
            r = l > x->rank ? (int)l : x->rank;
        if (r > IR_MAX_RANK)
            return node_err(g, n, "result rank exceeds %d", IR_MAX_RANK);
        shp s = shp_unknown_rank(r);
        return set_out(g, n, 0, dt, &s);
    }
    shp ts = {.rank = k};
    for (int i = 0; i < k; i++) {
        if (check_const_dim(g, n, 1, t[i], i, false) != IR_OK)
            return IR_ERR;
        ts.d[i] = dim_known(t[i]);
    }
    if (!x || x->rank < 0)
        return set_out(g, n, 0, dt, &(shp){.rank = -1});
    int r = k > x->rank ? k : x->rank;
    shp out = {.rank = r};
    for (int i = 0; i < r; i++) {
        int ix = i - (r - x->rank), it = i - (r - k);
        ir_dim a = ix >= 0 ? x->dims[ix] : dim_known(1), b = it >= 0 ? ts.d[it] : dim_known(1);
        if (bcast_dim(a, b, &out.d[i]) != IR_OK) {
            char b1[32], b2[32];
            return node_err(g, n, "input 0 ('%s') dim %s cannot expand to %s (input 1 ('%s'))",
                            x->name, dim_str(a, b1, sizeof b1), dim_str(b, b2, sizeof b2),
                            sv->name);
        }
    }
    return set_out(g, n, 0, dt, &out);
}

static int infer_tile(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0), *rv = in_at(n, 1);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    if (!x || x->rank < 0)
        return set_out(g, n, 0, dt, NULL);
    int64_t rep[IR_MAX_RANK + 1];
    int k = rv ? ir_const_ints(rv, rep, IR_MAX_RANK + 1) : -1;
    shp out = shp_of(x);
    if (k < 0) {
        out = shp_unknown_rank(x->rank);
        return set_out(g, n, 0, dt, &out);
    }
    if (k != x->rank)
        return node_err(g, n, "input 1 ('%s') has %d repeats for rank %d", rv->name, k, x->rank);
    for (int i = 0; i < k; i++) {
        if (rep[i] < 0)
            return node_err(g, n, "input 1 ('%s'): repeat %d is negative (%lld)", rv->name, i,
                            (long long)rep[i]);
        ir_dim d = x->dims[i];
        if (rep[i] == 1)
            continue;
        if (dk(d) && (rep[i] == 0 || d.value <= INT64_MAX / rep[i]))
            out.d[i] = dim_known(d.value * rep[i]);
        else
            out.d[i] = rep[i] == 0 ? dim_known(0) : DIM_UNKNOWN;
    }
    return set_out(g, n, 0, dt, &out);
}

/* ------------------------------------------------------------------ generators */

static int infer_constant_of_shape(ir_graph *g, ir_node *n)
{
    const ir_value *sv = in_at(n, 0);
    const ir_attr *va = ir_attr_get(n, "value");
    ir_dtype dt = IR_DT_FLOAT;
    if (va) {
        if (va->kind != IR_ATTR_TENSOR || !va->t)
            return node_err(g, n, "'value' must be a one-element tensor");
        if (ir_value_numel(va->t) != 1)
            return node_err(g, n, "'value' has %lld elements; one is required",
                            (long long)ir_value_numel(va->t));
        dt = va->t->dtype;
    }
    int64_t t[IR_MAX_RANK + 1];
    int k = sv ? ir_const_ints(sv, t, IR_MAX_RANK + 1) : -1;
    if (k < 0) {
        int64_t l = len_1d(sv);
        if (l > IR_MAX_RANK)
            return node_err(g, n, "input 0 ('%s'): rank %lld exceeds %d", sv->name, (long long)l,
                            IR_MAX_RANK);
        shp s = shp_unknown_rank(l >= 0 ? (int)l : -1);
        return set_out(g, n, 0, dt, &s);
    }
    shp out = {.rank = k};
    for (int i = 0; i < k; i++) {
        if (check_const_dim(g, n, 0, t[i], i, false) != IR_OK)
            return IR_ERR;
        out.d[i] = dim_known(t[i]);
    }
    return set_out(g, n, 0, dt, &out);
}

/* Range: max(ceil((limit - start) / delta), 0) elements, computed in the inputs' dtype. */
static int infer_range(ir_graph *g, ir_node *n)
{
    ir_dtype dt;
    if (common_dtype(g, n, 0, 2, &dt) != IR_OK)
        return IR_ERR;
    shp out = {.rank = 1, .d = {{-1, NULL}}};
    const ir_value *s = in_at(n, 0), *l = in_at(n, 1), *d = in_at(n, 2);
    for (int i = 0; i < 3; i++) {
        const ir_value *v = in_at(n, i);
        if (v && v->rank > 0 && ir_value_numel(v) != 1 && ir_value_numel(v) >= 0) {
            char nb[128];
            return node_err(g, n, "%s must be a scalar", in_desc(n, i, nb, sizeof nb));
        }
    }
    if (ir_value_is_const(s) && ir_value_is_const(l) && ir_value_is_const(d)) {
        int64_t cnt;
        if (ir_dtype_is_int(dt)) {
            int64_t a = ir_const_i64(s, 0), b = ir_const_i64(l, 0), st = ir_const_i64(d, 0);
            if (st == 0)
                return node_err(g, n, "input 2 ('%s'): delta is 0", d->name);
            /* ceil((b - a) / st) without overflow for the ranges exporters make */
            __int128 num = (__int128)b - a;
            __int128 q = num / st;
            if ((num % st != 0) && ((num > 0) == (st > 0)))
                q++;
            cnt = q < 0 ? 0 : q > INT64_MAX ? -1 : (int64_t)q;
        } else if (dt == IR_DT_FLOAT) {
            float a = (float)ir_const_f64(s, 0), b = (float)ir_const_f64(l, 0),
                  st = (float)ir_const_f64(d, 0);
            if (st == 0)
                return node_err(g, n, "input 2 ('%s'): delta is 0", d->name);
            double c = ceil((double)((b - a) / st));
            if (c != c)
                return node_err(g, n, "start, limit and delta give no length (NaN)");
            cnt = c < 0 ? 0 : c > 1e15 ? -1 : (int64_t)c;
        } else {
            double a = ir_const_f64(s, 0), b = ir_const_f64(l, 0), st = ir_const_f64(d, 0);
            if (st == 0)
                return node_err(g, n, "input 2 ('%s'): delta is 0", d->name);
            double c = ceil((b - a) / st);
            if (c != c)
                return node_err(g, n, "start, limit and delta give no length (NaN)");
            cnt = c < 0 ? 0 : c > 1e15 ? -1 : (int64_t)c;
        }
        if (cnt >= 0)
            out.d[0] = dim_known(cnt);
    }
    return set_out(g, n, 0, dt, &out);
}

static int infer_constant(ir_graph *g, ir_node *n)
{
    const ir_attr *a = NULL;
    static const char *names[] = {"value",      "value_float",  "value_floats", "value_int",
                                  "value_ints", "sparse_value", "value_string", "value_strings"};
    for (size_t i = 0; i < sizeof names / sizeof *names && !a; i++)
        a = ir_attr_get(n, names[i]);
    if (!a)
        return node_err(g, n, "Constant without a value attribute");
    shp s = {.rank = 0};
    switch (a->kind) {
    case IR_ATTR_TENSOR:
        if (!a->t)
            return node_err(g, n, "Constant with an empty tensor attribute");
        s = shp_of(a->t);
        return set_out(g, n, 0, a->t->dtype, &s);
    case IR_ATTR_FLOAT: return set_out(g, n, 0, IR_DT_FLOAT, &s);
    case IR_ATTR_INT: return set_out(g, n, 0, IR_DT_INT64, &s);
    case IR_ATTR_FLOATS:
        s = (shp){.rank = 1, .d = {dim_known(a->n)}};
        return set_out(g, n, 0, IR_DT_FLOAT, &s);
    case IR_ATTR_INTS:
        s = (shp){.rank = 1, .d = {dim_known(a->n)}};
        return set_out(g, n, 0, IR_DT_INT64, &s);
    default:
        return node_err(g, n, "Constant of a kind sbpc does not support (attribute '%s')", a->name);
    }
}

/* TopK(X, K): values like X with K along the axis (default -1), and int64 indices of the same
 * shape. K is a one-element int64 input; unknown until it is constant. */
static int infer_top_k(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0), *kv = in_at(n, 1);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    if (!x || x->rank < 0) {
        if (set_out(g, n, 0, dt, NULL) != IR_OK)
            return IR_ERR;
        return set_out(g, n, 1, IR_DT_INT64, NULL);
    }
    if (x->rank < 1)
        return node_err(g, n, "TopK needs an input of rank >= 1");
    int axis = norm_axis(g, n, ir_attr_int(n, "axis", -1), x->rank, "axis");
    if (axis < 0)
        return IR_ERR;
    shp s = shp_of(x);
    int64_t k[2];
    if (kv && ir_const_ints(kv, k, 2) == 1) {
        if (k[0] < 0 || (dk(x->dims[axis]) && k[0] > x->dims[axis].value))
            return node_err(g, n, "input 1 ('%s'): k = %lld is outside [0, %lld]", kv->name,
                            (long long)k[0], (long long)x->dims[axis].value);
        s.d[axis] = dim_known(k[0]);
    } else {
        s.d[axis] = (ir_dim){-1, NULL};
    }
    if (set_out(g, n, 0, dt, &s) != IR_OK)
        return IR_ERR;
    return set_out(g, n, 1, IR_DT_INT64, &s);
}

/* ------------------------------------------------------------------ reductions and norms */

static int infer_reduce(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    int64_t axes[IR_MAX_RANK + 1];
    int known;
    int k = get_axes(n, axes, IR_MAX_RANK + 1, &known);
    bool keep = ir_attr_int(n, "keepdims", 1) != 0;
    bool noop = ir_attr_int(n, "noop_with_empty_axes", 0) != 0;
    if (!x || x->rank < 0)
        return set_out(g, n, 0, dt, NULL);
    if (k == -1) {
        shp s = shp_unknown_rank(keep                             ? x->rank
                                 : known >= 0 && known <= x->rank ? x->rank - known
                                                                  : -1);
        return set_out(g, n, 0, dt, &s);
    }
    shp out = shp_of(x);
    if (k <= 0) { /* absent or empty: all axes, or nothing with noop_with_empty_axes */
        if (noop)
            return set_out(g, n, 0, dt, &out);
        out.rank = keep ? x->rank : 0;
        for (int i = 0; i < out.rank; i++)
            out.d[i] = dim_known(1);
        return set_out(g, n, 0, dt, &out);
    }
    bool marks[IR_MAX_RANK];
    if (norm_axes(g, n, axes, k, x->rank, marks) != IR_OK)
        return IR_ERR;
    out.rank = 0;
    for (int i = 0; i < x->rank; i++) {
        if (!marks[i])
            out.d[out.rank++] = x->dims[i];
        else if (keep)
            out.d[out.rank++] = dim_known(1);
    }
    return set_out(g, n, 0, dt, &out);
}

/* LayerNormalization / SimplifiedLayerNormalization: Y like X; mean and inverse std-dev (when
 * present) are X.shape[:axis] followed by 1s, in the stash type (float by default). */
static int infer_layer_normalization(ir_graph *g, ir_node *n)
{
    const ir_value *x = in_at(n, 0), *sc = in_at(n, 1);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    shp s = shp_of(x);
    if (set_out(g, n, 0, dt, &s) != IR_OK)
        return IR_ERR;
    ir_dtype st = (ir_dtype)ir_attr_int(n, "stash_type", IR_DT_FLOAT);
    if (ir_dtype_size(st) == 0)
        st = IR_DT_FLOAT;
    if (!x || x->rank < 0) {
        for (int i = 1; i < n->n_out; i++)
            if (set_out(g, n, i, st, NULL) != IR_OK)
                return IR_ERR;
        return IR_OK;
    }
    int64_t a = ir_attr_int(n, "axis", -1);
    int axis = norm_axis(g, n, a, x->rank, "axis");
    if (axis < 0)
        return IR_ERR;
    if (sc && sc->rank >= 0) {
        int nd = x->rank - axis;
        if (sc->rank > nd)
            return node_err(g, n, "input 1 ('%s') has rank %d but only %d dims are normalised",
                            sc->name, sc->rank, nd);
        for (int i = 0; i < sc->rank; i++) {
            ir_dim dsc = sc->dims[i], dx = x->dims[x->rank - sc->rank + i], r;
            if (bcast_dim(dx, dsc, &r) != IR_OK || (dk(r) && dk(dx) && r.value != dx.value)) {
                char b1[32], b2[32];
                return node_err(g, n, "input 1 ('%s'): dim %s does not match input 0 ('%s') dim %s",
                                sc->name, dim_str(dsc, b1, sizeof b1), x->name,
                                dim_str(dx, b2, sizeof b2));
            }
        }
    }
    shp stat = shp_of(x);
    for (int i = axis; i < x->rank; i++)
        stat.d[i] = dim_known(1);
    for (int i = 1; i < n->n_out; i++)
        if (set_out(g, n, i, st, &stat) != IR_OK)
            return IR_ERR;
    return IR_OK;
}

/* Checks labels [N, d1..] against scores [N, C, d1..]. */
static int check_loss_labels(ir_graph *g, ir_node *n, const ir_value *x, const ir_value *y)
{
    if (x->rank < 2)
        return node_err(g, n, "input 0 ('%s') must be [N, C, ...], not rank %d", x->name, x->rank);
    if (y->rank != x->rank - 1)
        return node_err(g, n, "input 1 ('%s') has rank %d; input 0 ('%s') of rank %d needs %d",
                        y->name, y->rank, x->name, x->rank, x->rank - 1);
    for (int i = 0; i < y->rank; i++) {
        ir_dim dx = x->dims[i == 0 ? 0 : i + 1], dy = y->dims[i];
        if (dk(dx) && dk(dy) && dx.value != dy.value)
            return node_err(g, n, "input 1 ('%s') dim %d is %lld but input 0 ('%s') has %lld there",
                            y->name, i, (long long)dy.value, x->name, (long long)dx.value);
    }
    if (y->dtype != IR_DT_UNDEFINED && !ir_dtype_is_int(y->dtype))
        return node_err(g, n, "input 1 ('%s'): labels must be integers, not %s", y->name,
                        ir_dtype_name(y->dtype));
    return IR_OK;
}

static int infer_loss(ir_graph *g, ir_node *n, bool has_log_prob)
{
    const ir_value *x = in_at(n, 0), *y = in_at(n, 1);
    ir_dtype dt = x ? x->dtype : IR_DT_UNDEFINED;
    const char *red = ir_attr_string(n, "reduction", "mean");
    bool none = strcmp(red, "none") == 0;
    if (!none && strcmp(red, "mean") != 0 && strcmp(red, "sum") != 0)
        return node_err(g, n, "unknown reduction '%s'", red);
    if (x && y && x->rank >= 0 && y->rank >= 0 && check_loss_labels(g, n, x, y) != IR_OK)
        return IR_ERR;
    shp s0 = none ? shp_of(y) : (shp){.rank = 0};
    if (set_out(g, n, 0, dt, &s0) != IR_OK)
        return IR_ERR;
    if (has_log_prob) {
        shp s1 = shp_of(x);
        return set_out(g, n, 1, dt, &s1);
    }
    return IR_OK;
}

static int infer_softmax_ce_loss(ir_graph *g, ir_node *n) { return infer_loss(g, n, true); }
static int infer_nll_loss(ir_graph *g, ir_node *n) { return infer_loss(g, n, false); }

/* ------------------------------------------------------------------ dispatch */

typedef int (*infer_fn)(ir_graph *g, ir_node *n);

static const infer_fn infer_table[IR_OP_COUNT] = {
#define OP(e, name, dom, mi, ma, mo, mao, inf) [IR_OP_##e] = inf,
#include "ops.def"
#undef OP
};

int ir_infer_node(ir_graph *g, ir_node *n)
{
    if ((int)n->op < 0 || n->op >= IR_OP_COUNT)
        return ir_diag_add(g->diag, IR_SEV_ERROR, n->name, n->op_type, "unknown op");
    const ir_op_info *oi = &ir_op_table[n->op];
    if (n->n_in < oi->min_in || (oi->max_in >= 0 && n->n_in > oi->max_in))
        return node_err(g, n, "%d inputs; %s takes %d to %d", n->n_in, oi->name, oi->min_in,
                        oi->max_in);
    if (n->n_out < oi->min_out || (oi->max_out >= 0 && n->n_out > oi->max_out))
        return node_err(g, n, "%d outputs; %s makes %d to %d", n->n_out, oi->name, oi->min_out,
                        oi->max_out);
    for (int i = 0; i < oi->min_in; i++)
        if (!n->in[i])
            return node_err(g, n, "required input %d is missing", i);
    return infer_table[n->op](g, n);
}

/* Every node in order; a node that fails poisons its outputs, and a node that reads a poisoned
 * value is skipped (its outputs poisoned in turn). The shapes a failed node leaves behind are
 * not to be trusted (an Expand whose size wraps has already merged its wrapped dims), so
 * inferring its consumers would only repeat the same error once per consumer: one root cause,
 * one diagnostic. Independent failures are still each reported. */
int ir_infer_graph(ir_graph *g)
{
    int rc = IR_OK;
    bool *bad = NULL; /* by value id, allocated at the first failure */
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        bool skip = false;
        for (int k = 0; bad && k < n->n_in && !skip; k++)
            skip = n->in[k] && n->in[k]->id >= 0 && n->in[k]->id < g->n_values &&
                   bad[n->in[k]->id];
        if (!skip && ir_infer_node(g, n) == IR_OK)
            continue;
        rc = IR_ERR;
        if (!bad)
            bad = calloc((size_t)g->n_values + 1, sizeof *bad);
        for (int k = 0; bad && k < n->n_out; k++)
            if (n->out[k] && n->out[k]->id >= 0 && n->out[k]->id < g->n_values)
                bad[n->out[k]->id] = true;
    }
    free(bad);
    return rc;
}

/* ------------------------------------------------------------------ builder */

/* ir_node_new_with_outputs (ir.c) with fresh outputs "<name>_out<i>", typed by inference: the
 * builder the passes use for the nodes they add. */
ir_node *ir_node_new(ir_graph *g, ir_op op, const char *name, int n_in, ir_value *const *in,
                     int n_out)
{
    ir_node *n = ir_node_new_with_outputs(g, op, name, NULL, n_in, in, n_out, NULL);
    if (!n)
        return NULL;
    for (int i = 0; i < n_out; i++) {
        char *vn = ir_arena_printf(g->arena, "%s_out%d", n->name, i);
        ir_value *v = ir_value_new(g, vn, IR_VAL_NODE, IR_DT_UNDEFINED, -1, NULL);
        if (!v)
            return NULL;
        v->producer = n;
        v->producer_slot = i;
        n->out[i] = v;
    }
    if (ir_infer_node(g, n) != IR_OK)
        return NULL;
    return n;
}
