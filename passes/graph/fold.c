/* fold.c — constant folding, and the removal of nodes that do nothing.
 *
 * Requires: a graph whose shapes have been inferred as far as the bindings allow (bind_dims).
 * Produces: every node whose inputs are all constants (CONST values; a PARAM is not constant,
 * it is trained), and every Shape/Size of a value whose shape is fully known, is evaluated and
 * its outputs become constants; Identity, Dropout in inference mode, a Cast to the same dtype
 * and a Reshape/Expand/Flatten to the input's own shape are bypassed. Shapes are re-inferred
 * node by node on the way, so one pass in topological order folds whole chains (the exporters'
 * Shape -> Gather -> Unsqueeze -> Concat -> Reshape arithmetic). Dead nodes are compacted away;
 * nodes that became unused are left for dce.
 *
 * Folded outputs keep their value (and so their name and every use): the value is turned into
 * a CONST in place and its producer is marked dead. Dumps therefore show the ONNX names, and no
 * rewiring is needed.
 *
 * Arithmetic is done in the tensor's own type, so results equal what an fp32 runtime computes
 * for the exported graph: float32 math in float (expf, sqrtf, ...), integer division truncating
 * toward zero, Mod with ONNX's fmod semantics, Range by repeated addition as the ONNX spec
 * defines it. Results above FOLD_MAX_ELEMS elements (or the cap given to sbp_pass_fold_max) stay
 * as nodes: a big table is cheaper to compute than to store. The cap is checked on the inferred
 * output shapes before anything is allocated or evaluated, so an unfolded T x T causal-mask chain
 * costs O(rank) per node here, not O(T^2); the attention recogniser verifies such a chain lazily
 * (recognize_attention.c) and dce drops it once attention is recognised. Half-precision math is
 * not folded (data movement of it is).
 */
#include "passes.h"
#include "checked.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FOLD_MAX_ELEMS ((int64_t)1 << 24)

enum { EV_OK, EV_SKIP, EV_ERR };

/* A tensor being read or written: CONST data, or (for Shape/Size) only a shape. */
typedef struct tens {
    ir_dtype dt;
    int rank;
    int64_t dims[IR_MAX_RANK];
    int64_t numel;
    size_t es;  /* element size */
    void *data; /* [numel] elements of dt; NULL for a shape-only input */
} tens;

static ir_value *in_at(const ir_node *n, int i) { return i < n->n_in ? n->in[i] : NULL; }

static int ev_err(ir_graph *g, const ir_node *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int ev_err(ir_graph *g, const ir_node *n, const char *fmt, ...)
{
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ir_diag_add(g->diag, IR_SEV_ERROR, n->name, n->op_type, "%s", buf);
    return EV_ERR;
}

/* ------------------------------------------------------------------ element access */

/* Elements as int64 / double: ir_data_i64 / ir_data_f64 (ir.h), the readers shape inference
 * and the recognisers use too, so that all agree (a BOOL byte 2 is true everywhere). Float to
 * integer is ir_f64_to_i64: NaN gives 0, out-of-range values saturate to int64 before
 * wrapping to the target width. */
static int64_t ld_i(const tens *t, int64_t i) { return ir_data_i64(t->dt, t->data, i); }

static double ld_d(const tens *t, int64_t i) { return ir_data_f64(t->dt, t->data, i); }

static float ld_f(const tens *t, int64_t i)
{
    return t->dt == IR_DT_FLOAT ? ((const float *)t->data)[i] : (float)ld_d(t, i);
}

/* Stores an integer, wrapping to the width of the dtype (two's complement). */
static void st_i(tens *t, int64_t i, int64_t v)
{
    void *p = t->data;
    switch (t->dt) {
    case IR_DT_INT64: ((int64_t *)p)[i] = v; break;
    case IR_DT_INT32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)v; break;
    case IR_DT_INT16: ((int16_t *)p)[i] = (int16_t)(uint16_t)(uint64_t)v; break;
    case IR_DT_INT8: ((int8_t *)p)[i] = (int8_t)(uint8_t)(uint64_t)v; break;
    case IR_DT_UINT64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case IR_DT_UINT32: ((uint32_t *)p)[i] = (uint32_t)(uint64_t)v; break;
    case IR_DT_UINT16: ((uint16_t *)p)[i] = (uint16_t)(uint64_t)v; break;
    case IR_DT_UINT8: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)v; break;
    case IR_DT_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case IR_DT_FLOAT: ((float *)p)[i] = (float)v; break;
    case IR_DT_DOUBLE: ((double *)p)[i] = (double)v; break;
    default: break;
    }
}

/* Stores a double into any dtype (floats round, ints truncate, bool tests nonzero). */
static void st_d(tens *t, int64_t i, double v)
{
    switch (t->dt) {
    case IR_DT_FLOAT: ((float *)t->data)[i] = (float)v; break;
    case IR_DT_DOUBLE: ((double *)t->data)[i] = v; break;
    case IR_DT_BOOL: ((uint8_t *)t->data)[i] = v != 0; break;
    case IR_DT_UINT64:
        ((uint64_t *)t->data)[i] = v >= 18446744073709551615.0 ? UINT64_MAX
                                   : v > 0                     ? (uint64_t)v
                                                               : (uint64_t)ir_f64_to_i64(v);
        break;
    default: st_i(t, i, ir_f64_to_i64(v)); break;
    }
}

static bool is_int_dt(ir_dtype d) { return ir_dtype_is_int(d) || d == IR_DT_BOOL; }
static bool is_math_dt(ir_dtype d) { return d == IR_DT_FLOAT || d == IR_DT_DOUBLE || is_int_dt(d); }

/* ------------------------------------------------------------------ index helpers */

static void strides_of(const tens *t, int64_t *st)
{
    int64_t s = 1;
    for (int i = t->rank - 1; i >= 0; i--) {
        st[i] = s;
        s *= t->dims[i];
    }
}

/* Walks an output index space, keeping the matching offset into up to 3 broadcast inputs. */
typedef struct bcast_it {
    int rank, n_in;
    int64_t dims[IR_MAX_RANK];
    int64_t str[3][IR_MAX_RANK];
    int64_t idx[IR_MAX_RANK];
    int64_t off[3];
} bcast_it;

static void bc_init(bcast_it *it, const tens *o, const tens *const *ins, int n_in)
{
    memset(it, 0, sizeof *it);
    it->rank = o->rank;
    it->n_in = n_in;
    for (int i = 0; i < o->rank; i++)
        it->dims[i] = o->dims[i];
    for (int k = 0; k < n_in; k++) {
        const tens *t = ins[k];
        int64_t st[IR_MAX_RANK];
        strides_of(t, st);
        for (int i = 0; i < o->rank; i++) {
            int j = i - (o->rank - t->rank);
            it->str[k][i] = (j >= 0 && t->dims[j] != 1) ? st[j] : 0;
        }
    }
}

static void bc_next(bcast_it *it)
{
    for (int i = it->rank - 1; i >= 0; i--) {
        it->idx[i]++;
        for (int k = 0; k < it->n_in; k++)
            it->off[k] += it->str[k][i];
        if (it->idx[i] < it->dims[i])
            return;
        for (int k = 0; k < it->n_in; k++)
            it->off[k] -= it->str[k][i] * it->dims[i];
        it->idx[i] = 0;
    }
}

static int norm_axis(int64_t a, int rank) { return (int)(a < 0 ? a + rank : a); }

static bool const_scalar_i(const tens *t, int64_t *v)
{
    if (!t->data || t->numel != 1 || !is_int_dt(t->dt))
        return false;
    *v = ld_i(t, 0);
    return true;
}

/* ------------------------------------------------------------------ data movement */

/* Identity, Reshape, Flatten, Squeeze, Unsqueeze, Dropout (eval): same data, new shape. */
static int ev_copy(tens *in, tens *out)
{
    if (in[0].numel != out[0].numel || in[0].es != out[0].es)
        return EV_SKIP;
    if (out[0].data != in[0].data) /* views share the bytes (see sbp_eval_node) */
        memcpy(out[0].data, in[0].data, (size_t)out[0].numel * out[0].es);
    return EV_OK;
}

static int ev_dropout(ir_graph *g, ir_node *n, tens *in, tens *out)
{
    (void)g;
    const ir_value *tm = in_at(n, 2);
    if (tm && (!in[2].data || ld_i(&in[2], 0) != 0))
        return EV_SKIP; /* training mode: random, not foldable */
    if (ev_copy(in, out) != EV_OK)
        return EV_SKIP;
    if (n->n_out > 1 && n->out[1])
        memset(out[1].data, 1, (size_t)out[1].numel);
    return EV_OK;
}

static int ev_shape(ir_node *n, tens *in, tens *out)
{
    int64_t st, len = ir_shape_op_range(n, in[0].rank, &st); /* as inference sized out[0] */
    for (int64_t i = 0; i < len; i++)
        ((int64_t *)out[0].data)[i] = in[0].dims[st + i];
    return EV_OK;
}

static int ev_size(tens *in, tens *out)
{
    ((int64_t *)out[0].data)[0] = in[0].numel;
    return EV_OK;
}

static int ev_gather(ir_graph *g, ir_node *n, tens *in, tens *out)
{
    const tens *x = &in[0], *ix = &in[1];
    if (!is_int_dt(ix->dt))
        return EV_SKIP;
    int axis = norm_axis(ir_attr_int(n, "axis", 0), x->rank);
    int64_t outer = 1, inner = 1, d = x->dims[axis];
    for (int i = 0; i < axis; i++)
        outer *= x->dims[i];
    for (int i = axis + 1; i < x->rank; i++)
        inner *= x->dims[i];
    size_t blk = (size_t)inner * x->es;
    char *o = out[0].data;
    for (int64_t a = 0; a < outer; a++)
        for (int64_t j = 0; j < ix->numel; j++) {
            int64_t k = ld_i(ix, j);
            if (k < 0)
                k += d;
            if (k < 0 || k >= d)
                return ev_err(g, n, "index %lld is out of range for an axis of %lld",
                              (long long)ld_i(ix, j), (long long)d);
            memcpy(o, (const char *)x->data + ((size_t)(a * d + k)) * blk, blk);
            o += blk;
        }
    return EV_OK;
}

/* The element offset in x (strides xst) of index tuple t of ix (k = ix's last dim), whose
 * entries address x's axes first, first + 1, ...: negative entries count from the end, as the
 * spec says; one out of range is an error (onnxruntime rejects it too). GatherND and ScatterND. */
static int nd_offset(ir_graph *g, ir_node *n, const tens *x, const tens *ix, int64_t t,
                     int64_t first, const int64_t *xst, int64_t *off)
{
    const int64_t k = ix->dims[ix->rank - 1];
    *off = 0;
    for (int64_t j = 0; j < k; j++) {
        int64_t d = x->dims[first + j], v = ld_i(ix, t * k + j);
        if (v < 0)
            v += d;
        if (v < 0 || v >= d)
            return ev_err(g, n, "index %lld is out of range for an axis of %lld",
                          (long long)ld_i(ix, t * k + j), (long long)d);
        *off += v * xst[first + j];
    }
    return EV_OK;
}

/* GatherND(data, indices, batch_dims b): for each index tuple (the last dim of indices, k
 * long) copy the slice data[batch..., i_0, ..., i_{k-1}, ...]. */
static int ev_gather_nd(ir_graph *g, ir_node *n, tens *in, tens *out)
{
    const tens *x = &in[0], *ix = &in[1];
    if (!is_int_dt(ix->dt) || ix->rank < 1)
        return EV_SKIP;
    int64_t b = ir_attr_int(n, "batch_dims", 0), k = ix->dims[ix->rank - 1];
    if (b < 0 || b >= ix->rank || k > x->rank - b) /* b is the model's: no b + k */
        return EV_SKIP;
    int64_t nbatch = 1, slice = 1;
    for (int i = 0; i < b; i++)
        nbatch *= x->dims[i];
    for (int64_t i = b + k; i < x->rank; i++)
        slice *= x->dims[i];
    int64_t xst[IR_MAX_RANK];
    strides_of(x, xst);
    int64_t tuples = k ? ix->numel / k : 0, per_batch = nbatch ? tuples / nbatch : 0;
    size_t blk = (size_t)slice * x->es;
    char *o = out[0].data;
    for (int64_t t = 0; t < tuples; t++) {
        int64_t bi = per_batch ? t / per_batch : 0, off;
        if (nd_offset(g, n, x, ix, t, b, xst, &off) != EV_OK)
            return EV_ERR;
        off += bi * (b ? xst[b - 1] : 0);
        memcpy(o, (const char *)x->data + (size_t)off * x->es, blk);
        o += blk;
    }
    return EV_OK;
}

/* ScatterND(data, indices, updates) with reduction none: a copy of data with the slices the
 * index tuples name replaced, in order (a repeated index: the last update wins, as the
 * reference implementation does). */
static int ev_scatter_nd(ir_graph *g, ir_node *n, tens *in, tens *out)
{
    const tens *x = &in[0], *ix = &in[1], *up = &in[2];
    const char *red = ir_attr_string(n, "reduction", "none");
    if (!is_int_dt(ix->dt) || ix->rank < 1 || up->dt != x->dt || strcmp(red, "none") != 0)
        return EV_SKIP;
    int64_t k = ix->dims[ix->rank - 1];
    if (k > x->rank)
        return EV_SKIP;
    int64_t slice = 1;
    for (int64_t i = k; i < x->rank; i++)
        slice *= x->dims[i];
    int64_t xst[IR_MAX_RANK];
    strides_of(x, xst);
    int64_t tuples = k ? ix->numel / k : 0;
    if (up->numel != tuples * slice)
        return ev_err(g, n, "updates hold %lld elements, but the indices name %lld slices of %lld",
                      (long long)up->numel, (long long)tuples, (long long)slice);
    memcpy(out[0].data, x->data, (size_t)x->numel * x->es);
    size_t blk = (size_t)slice * x->es;
    for (int64_t t = 0; t < tuples; t++) {
        int64_t off;
        if (nd_offset(g, n, x, ix, t, 0, xst, &off) != EV_OK)
            return EV_ERR;
        memcpy((char *)out[0].data + (size_t)off * x->es,
               (const char *)up->data + (size_t)t * blk, blk);
    }
    return EV_OK;
}

/* IsNaN / IsInf (attributes detect_positive / detect_negative) of a float tensor. */
static int ev_isnan_isinf(const ir_node *n, tens *in, tens *out)
{
    const tens *x = &in[0];
    if (x->dt != IR_DT_FLOAT && x->dt != IR_DT_DOUBLE)
        return EV_SKIP;
    bool pos = ir_attr_int(n, "detect_positive", 1) != 0;
    bool neg = ir_attr_int(n, "detect_negative", 1) != 0;
    uint8_t *r = out[0].data;
    for (int64_t i = 0; i < x->numel; i++) {
        double v = ld_d(x, i);
        r[i] = n->op == IR_OP_IS_NAN ? v != v : (isinf(v) && (v > 0 ? pos : neg));
    }
    return EV_OK;
}

static int ev_concat(ir_node *n, tens *in, tens *out)
{
    const tens *o = &out[0];
    int axis = norm_axis(ir_attr_int(n, "axis", 0), o->rank);
    int64_t outer = 1;
    for (int i = 0; i < axis; i++)
        outer *= o->dims[i];
    char *p = o->data;
    for (int64_t a = 0; a < outer; a++)
        for (int k = 0; k < n->n_in; k++) {
            if (!n->in[k] || in[k].numel == 0)
                continue;
            size_t blk = (size_t)(in[k].numel / outer) * in[k].es;
            memcpy(p, (const char *)in[k].data + a * blk, blk);
            p += blk;
        }
    return EV_OK;
}

static int ev_transpose(ir_node *n, tens *in, tens *out)
{
    const tens *x = &in[0];
    tens *o = &out[0];
    int perm[IR_MAX_RANK];
    const ir_attr *p = ir_attr_get(n, "perm");
    for (int i = 0; i < x->rank; i++)
        perm[i] = p ? (int)p->ints[i] : x->rank - 1 - i;
    int64_t xs[IR_MAX_RANK];
    strides_of(x, xs);
    tens view = *o; /* output index space, with input strides permuted */
    const tens *vs[1] = {&view};
    bcast_it it;
    bc_init(&it, o, vs, 1);
    for (int i = 0; i < o->rank; i++)
        it.str[0][i] = xs[perm[i]];
    for (int64_t i = 0; i < o->numel; i++, bc_next(&it))
        memcpy((char *)o->data + i * o->es, (const char *)x->data + it.off[0] * x->es, o->es);
    return EV_OK;
}

static int ev_slice(tens *in, tens *out)
{
    const tens *x = &in[0];
    tens *o = &out[0];
    int64_t st[IR_MAX_RANK], sp[IR_MAX_RANK], xs[IR_MAX_RANK];
    for (int i = 0; i < x->rank; i++) {
        st[i] = 0;
        sp[i] = 1;
    }
    for (int k = 1; k <= 4; k++)
        if (in[k].rank > 1 || (in[k].numel > 0 && !in[k].data))
            return EV_SKIP;
    for (int64_t j = 0; j < in[1].numel; j++) {
        int64_t ax = in[3].data ? ld_i(&in[3], j) : j;
        int a = norm_axis(ax, x->rank);
        int64_t step = in[4].data ? ld_i(&in[4], j) : 1;
        if (step < -INT64_MAX)
            step = -INT64_MAX;
        if (a < 0 || a >= x->rank || step == 0)
            return EV_SKIP;
        int64_t len = ir_slice_axis(x->dims[a], ld_i(&in[1], j), ld_i(&in[2], j), step, &st[a]);
        sp[a] = step;
        if (len != o->dims[a])
            return EV_SKIP; /* inference disagrees: leave it to the verifier */
    }
    if (o->numel == 0)
        return EV_OK;
    /* Offsets in checked arithmetic: a step is the model's number, and INT64_MAX is valid ONNX.
     * On an axis whose output has one element the step is never taken, so it is not used; on a
     * longer axis |step| is below the axis' extent and every offset lies inside x, which the
     * checks confirm rather than assume (an offset that does not fit leaves the node as it is). */
    strides_of(x, xs);
    int64_t base = 0;
    const tens *vs[1] = {o};
    bcast_it it;
    bc_init(&it, o, vs, 1);
    for (int i = 0; i < x->rank; i++) {
        int64_t t;
        if (!ck_mul_i64(st[i], xs[i], &t) || !ck_add_i64(base, t, &base))
            return EV_SKIP;
        if (o->dims[i] <= 1)
            it.str[0][i] = 0;
        else if (!ck_mul_i64(sp[i], xs[i], &it.str[0][i]) ||
                 !ck_mul_i64(it.str[0][i], o->dims[i], &t))
            return EV_SKIP; /* bc_next steps back by stride x length */
    }
    for (int64_t i = 0; i < o->numel; i++, bc_next(&it))
        memcpy((char *)o->data + i * o->es, (const char *)x->data + (base + it.off[0]) * x->es,
               o->es);
    return EV_OK;
}

static int ev_split(ir_node *n, tens *in, tens *out)
{
    const tens *x = &in[0];
    int axis = norm_axis(ir_attr_int(n, "axis", 0), x->rank);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis; i++)
        outer *= x->dims[i];
    for (int i = axis + 1; i < x->rank; i++)
        inner *= x->dims[i];
    int64_t off = 0;
    for (int k = 0; k < n->n_out; k++) {
        int64_t len = out[k].dims[axis];
        if (n->out[k]) {
            size_t blk = (size_t)(len * inner) * x->es;
            for (int64_t a = 0; a < outer; a++)
                memcpy((char *)out[k].data + a * blk,
                       (const char *)x->data + ((size_t)(a * x->dims[axis] + off) * inner) * x->es,
                       blk);
        }
        off += len;
    }
    return EV_OK;
}

static int ev_expand(tens *in, tens *out)
{
    const tens *ins[1] = {&in[0]};
    bcast_it it;
    bc_init(&it, &out[0], ins, 1);
    size_t es = out[0].es;
    for (int64_t i = 0; i < out[0].numel; i++, bc_next(&it))
        memcpy((char *)out[0].data + i * es, (const char *)in[0].data + it.off[0] * es, es);
    return EV_OK;
}

static int ev_tile(tens *in, tens *out)
{
    const tens *x = &in[0];
    tens *o = &out[0];
    int64_t xs[IR_MAX_RANK], idx[IR_MAX_RANK] = {0};
    strides_of(x, xs);
    for (int64_t i = 0; i < o->numel; i++) {
        int64_t off = 0;
        for (int a = 0; a < o->rank; a++)
            off += (idx[a] % x->dims[a]) * xs[a];
        memcpy((char *)o->data + i * o->es, (const char *)x->data + off * x->es, o->es);
        for (int a = o->rank - 1; a >= 0; a--) {
            if (++idx[a] < o->dims[a])
                break;
            idx[a] = 0;
        }
    }
    return EV_OK;
}

static int ev_where(tens *in, tens *out)
{
    const tens *ins[3] = {&in[0], &in[1], &in[2]};
    bcast_it it;
    bc_init(&it, &out[0], ins, 3);
    size_t es = out[0].es;
    for (int64_t i = 0; i < out[0].numel; i++, bc_next(&it)) {
        bool c = ld_i(&in[0], it.off[0]) != 0;
        const tens *src = c ? &in[1] : &in[2];
        memcpy((char *)out[0].data + i * es, (const char *)src->data + it.off[c ? 1 : 2] * es, es);
    }
    return EV_OK;
}

static int ev_trilu(ir_node *n, tens *in, tens *out)
{
    const tens *x = &in[0];
    tens *o = &out[0];
    if (x->rank < 2)
        return EV_SKIP;
    int64_t k = 0;
    if (in_at(n, 1) && !const_scalar_i(&in[1], &k))
        return EV_SKIP;
    bool upper = ir_attr_int(n, "upper", 1) != 0;
    int64_t rows = x->dims[x->rank - 2], cols = x->dims[x->rank - 1];
    memcpy(o->data, x->data, (size_t)o->numel * o->es);
    int64_t mats = rows > 0 && cols > 0 ? o->numel / (rows * cols) : 0;
    for (int64_t m = 0; m < mats; m++)
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                bool keep = upper ? (j - i >= k) : (j - i <= k);
                if (!keep)
                    memset((char *)o->data + ((m * rows + i) * cols + j) * o->es, 0, o->es);
            }
    return EV_OK;
}

static int ev_constant_of_shape(ir_node *n, tens *out)
{
    const ir_attr *va = ir_attr_get(n, "value");
    tens *o = &out[0];
    if (!va) {
        memset(o->data, 0, (size_t)o->numel * o->es);
        return EV_OK;
    }
    if (!va->t || !va->t->data || ir_dtype_size(va->t->dtype) != o->es)
        return EV_SKIP;
    for (int64_t i = 0; i < o->numel; i++)
        memcpy((char *)o->data + i * o->es, va->t->data, o->es);
    return EV_OK;
}

static int ev_constant(ir_node *n, tens *out)
{
    tens *o = &out[0];
    const ir_attr *a = ir_attr_get(n, "value");
    if (a && a->kind == IR_ATTR_TENSOR && a->t && a->t->data) {
        if (a->t->nbytes != (size_t)o->numel * o->es)
            return EV_SKIP;
        memcpy(o->data, a->t->data, a->t->nbytes);
        return EV_OK;
    }
    if ((a = ir_attr_get(n, "value_float")) && a->kind == IR_ATTR_FLOAT) {
        ((float *)o->data)[0] = (float)a->f;
    } else if ((a = ir_attr_get(n, "value_int")) && a->kind == IR_ATTR_INT) {
        ((int64_t *)o->data)[0] = a->i;
    } else if ((a = ir_attr_get(n, "value_floats")) && a->kind == IR_ATTR_FLOATS) {
        if (a->n != o->numel)
            return EV_SKIP;
        for (int i = 0; i < a->n; i++)
            ((float *)o->data)[i] = a->floats[i];
    } else if ((a = ir_attr_get(n, "value_ints")) && a->kind == IR_ATTR_INTS) {
        if (a->n != o->numel)
            return EV_SKIP;
        for (int i = 0; i < a->n; i++)
            ((int64_t *)o->data)[i] = a->ints[i];
    } else {
        return EV_SKIP;
    }
    return EV_OK;
}

/* Range: out[0] = start, out[i] = out[i-1] + delta (the ONNX definition: repeated addition). */
static int ev_range(tens *in, tens *out)
{
    tens *o = &out[0];
    if (o->dt == IR_DT_FLOAT) {
        float v = ld_f(&in[0], 0), d = ld_f(&in[2], 0);
        for (int64_t i = 0; i < o->numel; i++, v += d)
            ((float *)o->data)[i] = v;
    } else if (o->dt == IR_DT_DOUBLE) {
        double v = ld_d(&in[0], 0), d = ld_d(&in[2], 0);
        for (int64_t i = 0; i < o->numel; i++, v += d)
            ((double *)o->data)[i] = v;
    } else if (is_int_dt(o->dt)) {
        uint64_t v = (uint64_t)ld_i(&in[0], 0), d = (uint64_t)ld_i(&in[2], 0);
        for (int64_t i = 0; i < o->numel; i++, v += d)
            st_i(o, i, (int64_t)v);
    } else {
        return EV_SKIP;
    }
    return EV_OK;
}

/* ------------------------------------------------------------------ casts and math */

static int ev_cast(tens *in, tens *out)
{
    const tens *x = &in[0];
    tens *o = &out[0];
    if (!is_math_dt(x->dt) || !is_math_dt(o->dt))
        return EV_SKIP;
    for (int64_t i = 0; i < o->numel; i++) {
        if (x->dt == IR_DT_FLOAT || x->dt == IR_DT_DOUBLE)
            st_d(o, i, ld_d(x, i));
        else if (x->dt == IR_DT_UINT64 && o->dt != IR_DT_BOOL && !is_int_dt(o->dt))
            st_d(o, i, ld_d(x, i));
        else
            st_i(o, i, ld_i(x, i));
    }
    return EV_OK;
}

static int64_t ipow(int64_t b, int64_t e)
{
    if (e < 0)
        return b == 1 ? 1 : b == -1 ? (e % 2 ? -1 : 1) : 0;
    uint64_t r = 1, x = (uint64_t)b;
    while (e) {
        if (e & 1)
            r *= x;
        x *= x;
        e >>= 1;
    }
    return (int64_t)r;
}

/* One binary op in float. */
static float bin_f(ir_op op, float a, float b, bool fmod_)
{
    switch (op) {
    case IR_OP_ADD: return a + b;
    case IR_OP_SUB: return a - b;
    case IR_OP_MUL: return a * b;
    case IR_OP_DIV: return a / b;
    case IR_OP_POW: return powf(a, b);
    case IR_OP_MIN: return a != a || b != b ? NAN : a < b ? a : b;
    case IR_OP_MAX: return a != a || b != b ? NAN : a > b ? a : b;
    case IR_OP_MOD: {
        float r = fmodf(a, b);
        if (!fmod_ && r != 0 && ((r < 0) != (b < 0)))
            r += b;
        return r;
    }
    default: return 0;
    }
}

static double bin_d(ir_op op, double a, double b, bool fmod_)
{
    switch (op) {
    case IR_OP_ADD: return a + b;
    case IR_OP_SUB: return a - b;
    case IR_OP_MUL: return a * b;
    case IR_OP_DIV: return a / b;
    case IR_OP_POW: return pow(a, b);
    case IR_OP_MIN: return a != a || b != b ? NAN : a < b ? a : b;
    case IR_OP_MAX: return a != a || b != b ? NAN : a > b ? a : b;
    case IR_OP_MOD: {
        double r = fmod(a, b);
        if (!fmod_ && r != 0 && ((r < 0) != (b < 0)))
            r += b;
        return r;
    }
    default: return 0;
    }
}

/* Integer ops; *ok = false on division by zero. */
static int64_t bin_i(ir_op op, int64_t a, int64_t b, bool fmod_, bool *ok)
{
    switch (op) {
    case IR_OP_ADD: return (int64_t)((uint64_t)a + (uint64_t)b);
    case IR_OP_SUB: return (int64_t)((uint64_t)a - (uint64_t)b);
    case IR_OP_MUL: return (int64_t)((uint64_t)a * (uint64_t)b);
    case IR_OP_POW: return ipow(a, b);
    case IR_OP_MIN: return a < b ? a : b;
    case IR_OP_MAX: return a > b ? a : b;
    case IR_OP_DIV:
        if (b == 0) {
            *ok = false;
            return 0;
        }
        if (a == INT64_MIN && b == -1)
            return INT64_MIN;
        return a / b; /* C truncates toward zero, as ONNX does */
    case IR_OP_MOD: {
        if (b == 0) {
            *ok = false;
            return 0;
        }
        if (b == -1)
            return 0;
        int64_t r = a % b;
        if (!fmod_ && r != 0 && ((r < 0) != (b < 0)))
            r += b;
        return r;
    }
    default: return 0;
    }
}

/* Elementwise binary arithmetic with numpy broadcasting (Min/Max fold their inputs pairwise). */
static int ev_arith(ir_graph *g, ir_node *n, tens *in, tens *out)
{
    tens *o = &out[0];
    if (!is_math_dt(o->dt))
        return EV_SKIP;
    bool fm = ir_attr_int(n, "fmod", 0) != 0;
    int n_in = n->n_in;
    if (n_in == 1)
        return ev_copy(in, out);
    /* Accumulate pairwise: acc = in0 op in1, then acc op in2 ... (acc lives in out). */
    tens acc = in[0];
    for (int k = 1; k < n_in; k++) {
        tens res = *o;
        if (k > 1) { /* acc already has the output's shape */
            acc = *o;
            size_t nb = (size_t)o->numel * o->es;
            acc.data = malloc(nb ? nb : 1);
            if (!acc.data)
                return ev_err(g, n, "out of memory");
            memcpy(acc.data, o->data, nb);
        }
        const tens *ins[2] = {&acc, &in[k]};
        bcast_it it;
        bc_init(&it, &res, ins, 2);
        bool ok = true;
        for (int64_t i = 0; i < res.numel && ok; i++, bc_next(&it)) {
            if (o->dt == IR_DT_FLOAT) {
                ((float *)res.data)[i] =
                    bin_f(n->op, ld_f(&acc, it.off[0]), ld_f(&in[k], it.off[1]), fm);
            } else if (o->dt == IR_DT_DOUBLE) {
                ((double *)res.data)[i] =
                    bin_d(n->op, ld_d(&acc, it.off[0]), ld_d(&in[k], it.off[1]), fm);
            } else if (n->op == IR_OP_POW && !is_int_dt(in[k].dt)) {
                st_d(&res, i, pow(ld_d(&acc, it.off[0]), ld_d(&in[k], it.off[1])));
            } else {
                st_i(&res, i,
                     bin_i(n->op, ld_i(&acc, it.off[0]), ld_i(&in[k], it.off[1]), fm, &ok));
            }
        }
        if (k > 1)
            free(acc.data);
        if (!ok) {
            ir_diag_add(g->diag, IR_SEV_WARNING, n->name, n->op_type,
                        "integer division by zero in constant data; left unfolded");
            return EV_SKIP;
        }
    }
    return EV_OK;
}

static int ev_logic(ir_op op, tens *in, tens *out)
{
    const tens *a = &in[0], *b = &in[1];
    if (!is_math_dt(a->dt) || !is_math_dt(b->dt))
        return EV_SKIP;
    const tens *ins[2] = {a, b};
    tens *o = &out[0];
    bcast_it it;
    bc_init(&it, o, ins, 2);
    bool fl = !is_int_dt(a->dt);
    uint8_t *r = o->data;
    for (int64_t i = 0; i < o->numel; i++, bc_next(&it)) {
        bool v;
        if (fl) {
            double x = ld_d(a, it.off[0]), y = ld_d(b, it.off[1]);
            switch (op) {
            case IR_OP_EQUAL: v = x == y; break;
            case IR_OP_LESS: v = x < y; break;
            case IR_OP_LESS_OR_EQUAL: v = x <= y; break;
            case IR_OP_GREATER: v = x > y; break;
            case IR_OP_GREATER_OR_EQUAL: v = x >= y; break;
            case IR_OP_AND: v = x != 0 && y != 0; break;
            case IR_OP_XOR: v = (x != 0) != (y != 0); break;
            default: v = x != 0 || y != 0; break;
            }
        } else {
            int64_t x = ld_i(a, it.off[0]), y = ld_i(b, it.off[1]);
            switch (op) {
            case IR_OP_EQUAL: v = x == y; break;
            case IR_OP_LESS: v = x < y; break;
            case IR_OP_LESS_OR_EQUAL: v = x <= y; break;
            case IR_OP_GREATER: v = x > y; break;
            case IR_OP_GREATER_OR_EQUAL: v = x >= y; break;
            case IR_OP_AND: v = x && y; break;
            case IR_OP_XOR: v = (x != 0) != (y != 0); break;
            default: v = x || y; break;
            }
        }
        r[i] = v;
    }
    return EV_OK;
}

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

static int ev_unary(ir_op op, tens *in, tens *out)
{
    const tens *x = &in[0];
    tens *o = &out[0];
    if (op == IR_OP_NOT) {
        for (int64_t i = 0; i < o->numel; i++)
            ((uint8_t *)o->data)[i] = ld_i(x, i) == 0;
        return EV_OK;
    }
    if (x->dt == IR_DT_FLOAT) {
        const float *a = x->data;
        float *r = o->data;
        for (int64_t i = 0; i < o->numel; i++) {
            float v = a[i];
            switch (op) {
            case IR_OP_NEG: v = -v; break;
            case IR_OP_ABS: v = fabsf(v); break;
            case IR_OP_SQRT: v = sqrtf(v); break;
            case IR_OP_RECIPROCAL: v = 1.0f / v; break;
            case IR_OP_EXP: v = expf(v); break;
            case IR_OP_LOG: v = logf(v); break;
            case IR_OP_TANH: v = tanhf(v); break;
            case IR_OP_ERF: v = erff(v); break;
            case IR_OP_SIGMOID: v = sigmoidf_(v); break;
            case IR_OP_RELU: v = v > 0 ? v : 0.0f; break;
            case IR_OP_SIN: v = sinf(v); break;
            case IR_OP_COS: v = cosf(v); break;
            case IR_OP_FLOOR: v = floorf(v); break;
            case IR_OP_CEIL: v = ceilf(v); break;
            default: return EV_SKIP;
            }
            r[i] = v;
        }
        return EV_OK;
    }
    if (x->dt == IR_DT_DOUBLE) {
        const double *a = x->data;
        double *r = o->data;
        for (int64_t i = 0; i < o->numel; i++) {
            double v = a[i];
            switch (op) {
            case IR_OP_NEG: v = -v; break;
            case IR_OP_ABS: v = fabs(v); break;
            case IR_OP_SQRT: v = sqrt(v); break;
            case IR_OP_RECIPROCAL: v = 1.0 / v; break;
            case IR_OP_EXP: v = exp(v); break;
            case IR_OP_LOG: v = log(v); break;
            case IR_OP_TANH: v = tanh(v); break;
            case IR_OP_ERF: v = erf(v); break;
            case IR_OP_SIGMOID: v = 1.0 / (1.0 + exp(-v)); break;
            case IR_OP_RELU: v = v > 0 ? v : 0.0; break;
            case IR_OP_SIN: v = sin(v); break;
            case IR_OP_COS: v = cos(v); break;
            case IR_OP_FLOOR: v = floor(v); break;
            case IR_OP_CEIL: v = ceil(v); break;
            default: return EV_SKIP;
            }
            r[i] = v;
        }
        return EV_OK;
    }
    if (ir_dtype_is_int(x->dt)) {
        for (int64_t i = 0; i < o->numel; i++) {
            int64_t v = ld_i(x, i);
            switch (op) {
            case IR_OP_NEG: v = (int64_t)(0 - (uint64_t)v); break;
            case IR_OP_ABS: v = v < 0 ? (int64_t)(0 - (uint64_t)v) : v; break;
            case IR_OP_RELU: v = v > 0 ? v : 0; break;
            default: return EV_SKIP;
            }
            st_i(o, i, v);
        }
        return EV_OK;
    }
    return EV_SKIP;
}

static int ev_cumsum(ir_node *n, tens *in, tens *out)
{
    const tens *x = &in[0];
    tens *o = &out[0];
    int64_t ax;
    if (!const_scalar_i(&in[1], &ax) || ax < -x->rank || ax >= x->rank || x->rank == 0)
        return EV_SKIP;
    if (!is_math_dt(x->dt) || x->dt == IR_DT_BOOL)
        return EV_SKIP;
    int axis = norm_axis(ax, x->rank);
    bool excl = ir_attr_int(n, "exclusive", 0) != 0, rev = ir_attr_int(n, "reverse", 0) != 0;
    int64_t outer = 1, inner = 1, len = x->dims[axis];
    for (int i = 0; i < axis; i++)
        outer *= x->dims[i];
    for (int i = axis + 1; i < x->rank; i++)
        inner *= x->dims[i];
    for (int64_t a = 0; a < outer; a++)
        for (int64_t c = 0; c < inner; c++) {
            float sf = 0;
            double sd = 0;
            uint64_t si = 0;
            for (int64_t t = 0; t < len; t++) {
                int64_t j = rev ? len - 1 - t : t;
                int64_t i = (a * len + j) * inner + c;
                if (x->dt == IR_DT_FLOAT) {
                    float v = ld_f(x, i);
                    ((float *)o->data)[i] = excl ? sf : sf + v;
                    sf += v;
                } else if (x->dt == IR_DT_DOUBLE) {
                    double v = ld_d(x, i);
                    ((double *)o->data)[i] = excl ? sd : sd + v;
                    sd += v;
                } else {
                    uint64_t v = (uint64_t)ld_i(x, i);
                    st_i(o, i, (int64_t)(excl ? si : si + v));
                    si += v;
                }
            }
        }
    return EV_OK;
}

/* ReduceSum / ReduceMean / ReduceMax over the axes the output shape shows as reduced. */
static int ev_reduce(ir_graph *g, ir_node *n, tens *in, tens *out)
{
    const tens *x = &in[0];
    tens *o = &out[0];
    if (!is_math_dt(x->dt) || x->dt == IR_DT_BOOL)
        return EV_SKIP;
    /* Which axes are reduced: from the axes attribute or input. */
    bool red[IR_MAX_RANK] = {false};
    int64_t nax = 0;
    const ir_attr *aa = ir_attr_get(n, "axes");
    if (in_at(n, 1)) {
        if (!in[1].data)
            return EV_SKIP;
        nax = in[1].numel;
        for (int64_t i = 0; i < nax; i++) {
            int64_t a = ld_i(&in[1], i);
            if (a < -x->rank || a >= x->rank)
                return EV_SKIP;
            red[norm_axis(a, x->rank)] = true;
        }
    } else if (aa && aa->kind == IR_ATTR_INTS) {
        nax = aa->n;
        for (int i = 0; i < aa->n; i++) {
            if (aa->ints[i] < -x->rank || aa->ints[i] >= x->rank)
                return EV_SKIP;
            red[norm_axis(aa->ints[i], x->rank)] = true;
        }
    }
    if (nax == 0) {
        if (ir_attr_int(n, "noop_with_empty_axes", 0))
            return ev_copy(in, out);
        for (int i = 0; i < x->rank; i++)
            red[i] = true;
    }
    /* Output offsets follow the keepdims layout (same linear order either way). */
    int64_t ostr[IR_MAX_RANK], s = 1, count = 1;
    for (int i = x->rank - 1; i >= 0; i--) {
        ostr[i] = red[i] ? 0 : s;
        if (!red[i])
            s *= x->dims[i];
        else
            count *= x->dims[i];
    }
    if (s != o->numel)
        return EV_SKIP;
    double *accd = malloc((size_t)(o->numel ? o->numel : 1) * sizeof(double));
    float *accf = malloc((size_t)(o->numel ? o->numel : 1) * sizeof(float));
    int64_t *acci = malloc((size_t)(o->numel ? o->numel : 1) * sizeof(int64_t));
    if (!accd || !accf || !acci) {
        free(accd);
        free(accf);
        free(acci);
        return ev_err(g, n, "out of memory");
    }
    bool mx = n->op == IR_OP_REDUCE_MAX;
    for (int64_t i = 0; i < o->numel; i++) {
        accf[i] = mx ? -INFINITY : 0.0f;
        accd[i] = mx ? -INFINITY : 0.0;
        acci[i] = mx ? INT64_MIN : 0;
    }
    int64_t idx[IR_MAX_RANK] = {0}, off = 0;
    for (int64_t i = 0; i < x->numel; i++) {
        if (x->dt == IR_DT_FLOAT) {
            float v = ld_f(x, i);
            accf[off] = mx ? (v > accf[off] || v != v ? v : accf[off]) : accf[off] + v;
        } else if (x->dt == IR_DT_DOUBLE) {
            double v = ld_d(x, i);
            accd[off] = mx ? (v > accd[off] || v != v ? v : accd[off]) : accd[off] + v;
        } else {
            int64_t v = ld_i(x, i);
            acci[off] =
                mx ? (v > acci[off] ? v : acci[off]) : (int64_t)((uint64_t)acci[off] + (uint64_t)v);
        }
        for (int a = x->rank - 1; a >= 0; a--) {
            off += ostr[a];
            if (++idx[a] < x->dims[a])
                break;
            off -= ostr[a] * x->dims[a];
            idx[a] = 0;
        }
    }
    bool mean = n->op == IR_OP_REDUCE_MEAN;
    for (int64_t i = 0; i < o->numel; i++) {
        if (x->dt == IR_DT_FLOAT)
            ((float *)o->data)[i] = mean ? accf[i] / (float)count : accf[i];
        else if (x->dt == IR_DT_DOUBLE)
            ((double *)o->data)[i] = mean ? accd[i] / (double)count : accd[i];
        else
            st_i(o, i, mean ? (count ? acci[i] / count : 0) : acci[i]);
    }
    free(accd);
    free(accf);
    free(acci);
    return EV_OK;
}

static int ev_softmax(ir_graph *g, ir_node *n, tens *in, tens *out)
{
    const tens *x = &in[0];
    tens *o = &out[0];
    if (x->dt != IR_DT_FLOAT && x->dt != IR_DT_DOUBLE)
        return EV_SKIP;
    bool new_sem = g->opset >= 13;
    int64_t a = ir_attr_int(n, "axis", new_sem ? -1 : 1);
    if (a < -x->rank || a >= x->rank || x->rank == 0)
        return EV_SKIP;
    int axis = norm_axis(a, x->rank);
    int64_t outer = 1, len = 1, inner = 1;
    for (int i = 0; i < axis; i++)
        outer *= x->dims[i];
    if (new_sem) {
        len = x->dims[axis];
        for (int i = axis + 1; i < x->rank; i++)
            inner *= x->dims[i];
    } else {
        for (int i = axis; i < x->rank; i++)
            len *= x->dims[i];
    }
    bool lg = n->op == IR_OP_LOG_SOFTMAX;
    for (int64_t p = 0; p < outer; p++)
        for (int64_t c = 0; c < inner; c++) {
#define SOFTMAX_LOOP(T, EXP, LOG)                                                                  \
    do {                                                                                           \
        const T *xs = (const T *)x->data;                                                          \
        T *os = (T *)o->data;                                                                      \
        T m = -INFINITY, sum = 0;                                                                  \
        for (int64_t j = 0; j < len; j++) {                                                        \
            T v = xs[(p * len + j) * inner + c];                                                   \
            m = v > m ? v : m;                                                                     \
        }                                                                                          \
        for (int64_t j = 0; j < len; j++)                                                          \
            sum += EXP(xs[(p * len + j) * inner + c] - m);                                         \
        for (int64_t j = 0; j < len; j++) {                                                        \
            int64_t k = (p * len + j) * inner + c;                                                 \
            os[k] = lg ? xs[k] - m - LOG(sum) : EXP(xs[k] - m) / sum;                              \
        }                                                                                          \
    } while (0)
            if (x->dt == IR_DT_FLOAT)
                SOFTMAX_LOOP(float, expf, logf);
            else
                SOFTMAX_LOOP(double, exp, log);
#undef SOFTMAX_LOOP
        }
    return EV_OK;
}

static int ev_matmul(tens *in, tens *out)
{
    const tens *a = &in[0], *b = &in[1];
    tens *o = &out[0];
    if ((a->dt != IR_DT_FLOAT && a->dt != IR_DT_DOUBLE) || a->rank < 2 || b->rank < 2)
        return EV_SKIP;
    int64_t m = a->dims[a->rank - 2], k = a->dims[a->rank - 1], nn = b->dims[b->rank - 1];
    /* batch broadcast: view a and b as [batch..., 1, 1] over the output's batch dims */
    tens ab = *a, bb = *b, ob = *o;
    ab.rank -= 2;
    bb.rank -= 2;
    ob.rank -= 2;
    const tens *ins[2] = {&ab, &bb};
    bcast_it it;
    bc_init(&it, &ob, ins, 2);
    int64_t nbatch = 1;
    for (int i = 0; i < ob.rank; i++)
        nbatch *= ob.dims[i];
    for (int64_t bi = 0; bi < nbatch; bi++, bc_next(&it)) {
        int64_t ao = it.off[0] * m * k, bo = it.off[1] * k * nn, oo = bi * m * nn;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < nn; j++) {
                if (a->dt == IR_DT_FLOAT) {
                    float s = 0;
                    for (int64_t t = 0; t < k; t++)
                        s += ((const float *)a->data)[ao + i * k + t] *
                             ((const float *)b->data)[bo + t * nn + j];
                    ((float *)o->data)[oo + i * nn + j] = s;
                } else {
                    double s = 0;
                    for (int64_t t = 0; t < k; t++)
                        s += ((const double *)a->data)[ao + i * k + t] *
                             ((const double *)b->data)[bo + t * nn + j];
                    ((double *)o->data)[oo + i * nn + j] = s;
                }
            }
    }
    return EV_OK;
}

/* ------------------------------------------------------------------ driver */

static bool tens_of_value(const ir_value *v, tens *t)
{
    memset(t, 0, sizeof *t);
    if (!v)
        return true;
    if (v->rank < 0 || !ir_value_shape_known(v))
        return false;
    t->dt = v->dtype;
    t->rank = v->rank;
    for (int i = 0; i < v->rank; i++)
        t->dims[i] = v->dims[i].value;
    t->numel = ir_value_numel(v);
    t->es = ir_dtype_size(v->dtype);
    t->data = ir_value_is_const(v) ? v->data : NULL;
    return t->numel >= 0;
}

/* Whether n is a folding candidate: all present inputs constant, or Shape/Size of a known shape. */
static bool foldable(const ir_node *n)
{
    if (n->dead)
        return false;
    if (n->op == IR_OP_SHAPE || n->op == IR_OP_SIZE)
        return n->in[0] && ir_value_shape_known(n->in[0]);
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] && !ir_value_is_const(n->in[i]))
            return false;
    return true;
}

/* Evaluates an already-inferred candidate node whose outputs have at most max_elems elements
 * each (it is left as a node otherwise). mem_limit > 0: the compilation's arena may not grow
 * past it; a node whose outputs would take it there is an error before anything is allocated
 * (a huge --seq-len makes the exporters' position and rotary tables huge). */
static int eval_inferred(ir_graph *g, ir_node *n, int64_t max_elems, int64_t mem_limit,
                         bool *folded)
{
    *folded = false;
    if (n->n_in > 64 || n->n_out > 64 || n->op >= IR_OP_COUNT || ir_op_is_semantic(n->op))
        return IR_OK;
    tens in[64], out[64];
    for (int i = 0; i < 64; i++)
        memset(&in[i], 0, sizeof in[i]);
    for (int i = 0; i < n->n_in; i++)
        if (!tens_of_value(n->in[i], &in[i]))
            return IR_OK;
    /* Every output's size is checked before any is allocated: a refused node costs nothing. */
    for (int i = 0; i < n->n_out; i++) {
        ir_value *v = n->out[i];
        if (!tens_of_value(v, &out[i]))
            return IR_OK;
        if (v && (out[i].es == 0 || out[i].numel > max_elems))
            return IR_OK;
    }
    if (mem_limit > 0) {
        /* numel * es fits (ir_check_shape_size); the sum saturates */
        int64_t need = (int64_t)ir_arena_bytes(g->arena);
        for (int i = 0; i < n->n_out; i++)
            if (n->out[i])
                need = ck_add_sat_i64(need, out[i].numel * (int64_t)out[i].es);
        if (need > mem_limit) {
            char ty[256];
            ir_value_type_str(n->out[0], ty, sizeof ty);
            ev_err(g, n,
                   "folding output 0 ('%s') %s into a constant would bring this compilation to "
                   "%lld bytes, more than the %lld bytes it may use (this machine's memory, or "
                   "SBPC_MAX_COMPILE_BYTES): give a shorter --seq-len or a smaller --batch",
                   n->out[0]->name, ty, (long long)need, (long long)mem_limit);
            return IR_ERR;
        }
    }
    /* A re-view (Reshape, (Un)Squeeze, Flatten, Identity) shares its input's bytes: constant
     * data is never written after it is made, and a long-T RoPE table ([T, head_dim], 128 MiB at
     * T = 131072, head_dim 256) is not worth a copy per view. */
    const bool view = n->op == IR_OP_IDENTITY || n->op == IR_OP_RESHAPE ||
                      n->op == IR_OP_FLATTEN || n->op == IR_OP_SQUEEZE ||
                      n->op == IR_OP_UNSQUEEZE;
    for (int i = 0; i < n->n_out; i++) {
        if (!n->out[i])
            continue;
        if (view && i == 0 && in[0].data && in[0].numel == out[0].numel && in[0].es == out[0].es) {
            out[0].data = in[0].data;
            continue;
        }
        out[i].data = ir_arena_alloc(g->arena, (size_t)out[i].numel * out[i].es);
        if (!out[i].data)
            return ir_diag_add(g->diag, IR_SEV_ERROR, n->name, n->op_type, "out of memory folding");
    }
    int r;
    switch (n->op) {
    case IR_OP_CONSTANT: r = ev_constant(n, out); break;
    case IR_OP_IDENTITY:
    case IR_OP_RESHAPE:
    case IR_OP_FLATTEN:
    case IR_OP_SQUEEZE:
    case IR_OP_UNSQUEEZE: r = ev_copy(in, out); break;
    case IR_OP_DROPOUT: r = ev_dropout(g, n, in, out); break;
    case IR_OP_SHAPE: r = ev_shape(n, in, out); break;
    case IR_OP_SIZE: r = ev_size(in, out); break;
    case IR_OP_CAST: r = ev_cast(in, out); break;
    case IR_OP_GATHER: r = ev_gather(g, n, in, out); break;
    case IR_OP_GATHER_ND: r = ev_gather_nd(g, n, in, out); break;
    case IR_OP_SCATTER_ND: r = ev_scatter_nd(g, n, in, out); break;
    case IR_OP_IS_NAN:
    case IR_OP_IS_INF: r = ev_isnan_isinf(n, in, out); break;
    case IR_OP_CONCAT: r = ev_concat(n, in, out); break;
    case IR_OP_TRANSPOSE: r = ev_transpose(n, in, out); break;
    case IR_OP_SLICE: r = ev_slice(in, out); break;
    case IR_OP_SPLIT: r = ev_split(n, in, out); break;
    case IR_OP_EXPAND: r = ev_expand(in, out); break;
    case IR_OP_TILE: r = ev_tile(in, out); break;
    case IR_OP_WHERE: r = ev_where(in, out); break;
    case IR_OP_TRILU: r = ev_trilu(n, in, out); break;
    case IR_OP_CONSTANT_OF_SHAPE: r = ev_constant_of_shape(n, out); break;
    case IR_OP_RANGE: r = ev_range(in, out); break;
    case IR_OP_CUMSUM: r = ev_cumsum(n, in, out); break;
    case IR_OP_ADD:
    case IR_OP_SUB:
    case IR_OP_MUL:
    case IR_OP_DIV:
    case IR_OP_MOD:
    case IR_OP_POW:
    case IR_OP_MIN:
    case IR_OP_MAX: r = ev_arith(g, n, in, out); break;
    case IR_OP_EQUAL:
    case IR_OP_LESS:
    case IR_OP_LESS_OR_EQUAL:
    case IR_OP_GREATER:
    case IR_OP_GREATER_OR_EQUAL:
    case IR_OP_AND:
    case IR_OP_XOR:
    case IR_OP_OR: r = ev_logic(n->op, in, out); break;
    case IR_OP_NOT:
    case IR_OP_NEG:
    case IR_OP_ABS:
    case IR_OP_SQRT:
    case IR_OP_RECIPROCAL:
    case IR_OP_EXP:
    case IR_OP_LOG:
    case IR_OP_TANH:
    case IR_OP_ERF:
    case IR_OP_SIGMOID:
    case IR_OP_RELU:
    case IR_OP_SIN:
    case IR_OP_COS:
    case IR_OP_FLOOR:
    case IR_OP_CEIL: r = ev_unary(n->op, in, out); break;
    case IR_OP_REDUCE_SUM:
    case IR_OP_REDUCE_MEAN:
    case IR_OP_REDUCE_MAX: r = ev_reduce(g, n, in, out); break;
    case IR_OP_SOFTMAX:
    case IR_OP_LOG_SOFTMAX: r = ev_softmax(g, n, in, out); break;
    case IR_OP_MATMUL: r = ev_matmul(in, out); break;
    default: r = EV_SKIP; break;
    }
    if (r == EV_ERR)
        return IR_ERR;
    if (r == EV_SKIP)
        return IR_OK;
    /* Turn each output value into a constant in place: name and uses stay. */
    for (int i = 0; i < n->n_out; i++) {
        ir_value *v = n->out[i];
        if (!v)
            continue;
        v->kind = IR_VAL_CONST;
        v->producer = NULL;
        v->producer_slot = 0;
        v->data = out[i].data;
        v->nbytes = (size_t)out[i].numel * out[i].es;
    }
    n->dead = true;
    *folded = true;
    return IR_OK;
}

int sbp_eval_node(ir_graph *g, ir_node *n, bool *folded)
{
    *folded = false;
    if (!foldable(n))
        return IR_OK;
    if (ir_infer_node(g, n) != IR_OK)
        return IR_ERR;
    return eval_inferred(g, n, FOLD_MAX_ELEMS, 0, folded);
}

/* ------------------------------------------------------------------ bypasses */

static bool same_shape(const ir_value *a, const ir_value *b)
{
    if (a->rank < 0 || a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++) {
        ir_dim x = a->dims[i], y = b->dims[i];
        if (x.value >= 0 || y.value >= 0) {
            if (x.value != y.value)
                return false;
        } else if (!x.sym || !y.sym || strcmp(x.sym, y.sym) != 0) {
            return false;
        }
    }
    return true;
}

/* The value that n merely passes on unchanged, or NULL. */
static ir_value *passthrough(ir_graph *g, const ir_node *n)
{
    ir_value *x = in_at(n, 0), *y = n->out[0];
    if (!x || !y)
        return NULL;
    switch (n->op) {
    case IR_OP_IDENTITY: return x;
    case IR_OP_DROPOUT: {
        const ir_value *tm = in_at(n, 2);
        if (tm && !(ir_value_is_const(tm) && ir_const_i64(tm, 0) == 0))
            return NULL;
        if (n->n_out > 1 && n->out[1] && ir_value_use_count(g, n->out[1]) > 0)
            return NULL; /* the mask is used: keep the node (or fold it when x is constant) */
        return x;
    }
    case IR_OP_CAST: return x->dtype != IR_DT_UNDEFINED && x->dtype == y->dtype ? x : NULL;
    case IR_OP_RESHAPE:
    case IR_OP_EXPAND:
    case IR_OP_FLATTEN: return x->dtype == y->dtype && same_shape(x, y) ? x : NULL;
    default: return NULL;
    }
}

/* Replaces n by its input x. A graph output keeps its name: when n's output y is one and x is
 * a node output read only by n, x's producer takes y over as its output (x is left without a
 * producer and unused); otherwise n becomes a plain Identity. */
static bool bypass(ir_graph *g, ir_node *n, ir_value *x, ir_value **fwd)
{
    ir_value *y = n->out[0];
    if (y->is_output) {
        ir_node *p = x->producer;
        if (x->kind == IR_VAL_NODE && p && !p->dead && !x->is_output &&
            ir_value_use_count(g, x) == 1) {
            p->out[x->producer_slot] = y;
            y->producer = p;
            y->producer_slot = x->producer_slot;
            x->producer = NULL;
            x->producer_slot = 0;
            n->dead = true;
            return true;
        }
        if (n->op == IR_OP_IDENTITY)
            return false;
        n->op = IR_OP_IDENTITY;
        n->op_type = ir_op_name(IR_OP_IDENTITY);
        n->in[0] = x;
        n->n_in = 1;
        n->n_out = 1;
        n->n_attr = 0;
        return true;
    }
    /* Readers of y all come later in the (topological) node order: the fold loop rewrites
     * them as it reaches them, which keeps the pass linear (no scan of the graph per bypass). */
    if (y->id >= 0 && y->id < g->n_values)
        fwd[y->id] = x;
    n->dead = true;
    return true;
}

int sbp_pass_fold(ir_graph *g) { return sbp_pass_fold_max(g, 0); }

int sbp_pass_fold_max(ir_graph *g, int64_t max_elems)
{
    return sbp_pass_fold_limited(g, max_elems, 0);
}

int sbp_pass_fold_limited(ir_graph *g, int64_t max_elems, int64_t mem_limit)
{
    if (max_elems <= 0)
        max_elems = FOLD_MAX_ELEMS;
    int rc = IR_OK;
    /* fwd[v]: the value that replaces bypassed value v (NULL: v stands). */
    const int nv0 = g->n_values; /* fold makes no values; guard anyway */
    ir_value **fwd = calloc((size_t)nv0 + 1, sizeof *fwd);
    if (!fwd)
        return ir_diag_error(g->diag, "out of memory folding");
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        for (int j = 0; j < n->n_in; j++)
            while (n->in[j] && n->in[j]->id < nv0 && fwd[n->in[j]->id])
                n->in[j] = fwd[n->in[j]->id];
        if (ir_infer_node(g, n) != IR_OK) {
            rc = IR_ERR;
            continue;
        }
        ir_value *x = passthrough(g, n);
        if (x && !ir_value_is_const(x)) {
            bypass(g, n, x, fwd);
            continue;
        }
        if (!foldable(n))
            continue;
        bool folded;
        if (eval_inferred(g, n, max_elems, mem_limit, &folded) != IR_OK)
            rc = IR_ERR;
    }
    free(fwd);
    ir_graph_compact(g);
    return rc;
}
