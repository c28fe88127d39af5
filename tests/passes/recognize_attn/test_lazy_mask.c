/* test_lazy_mask.c — causal masks that fold does not materialise (the lazy verification of
 * passes/graph/recognize_attention.c, passes/graph/fold.c's cap).
 *
 * Above fold's cap (16 Mi elements, i.e. T > 4096 for a T x T mask) the mask chain an exporter
 * emits stays as nodes computed from constants only; the attention recogniser must prove it
 * causal from its structure plus a few element evaluations, never by building it. Tested here:
 *   - the fixture exports canonicalised with the cap lowered to 256 elements (so every mask stays
 *     lazy) give the same canonical dump as with the default cap, and nothing T x T survives;
 *   - hand-built mask chains of the forms exporters use (Llama's full(min) + triu(1), GPT-2's
 *     sliced bool buffer, the older arange-comparison mask, transposed and inverted forms,
 *     offset slices) are recognised, and near misses (diagonal masked, k = 2, lower instead of
 *     upper, weak fill, a graph input upstream, a per-batch padding term, a buffer with one
 *     wrong element, off-by-one slices) are not;
 *   - a T = 20000 Llama-style and arange-style graph goes through fold + recognition in well
 *     under a second of CPU time, with fold refusing the T x T results before allocating
 *     anything.
 */
#include "../pass_test.h"
#include "recognize.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

enum { B = 2, H = 4, HD = 8 };

/* ---------------------------------------------------------------- building */

static int seq_no;

static ir_value *op(ir_graph *g, ir_op o, int n_in, ir_value *const *in)
{
    char name[32];
    snprintf(name, sizeof name, "n%d", seq_no++);
    ir_node *n = mknode(g, o, name, n_in, in, 1);
    assert_non_null(n);
    if (ir_infer_node(g, n) != IR_OK)
        ir_diag_print(g->diag, stderr, "test");
    assert_int_equal(ir_infer_node(g, n), IR_OK);
    return n->out[0];
}

#define OP(g, o, ...)                                                                              \
    op((g), (o), (int)(sizeof((ir_value *[]){__VA_ARGS__}) / sizeof(ir_value *)),                 \
       (ir_value *[]){__VA_ARGS__})

/* Like op, with attributes set by the caller before inference. */
static ir_node *op_begin(ir_graph *g, ir_op o, int n_in, ir_value *const *in)
{
    char name[32];
    snprintf(name, sizeof name, "n%d", seq_no++);
    ir_node *n = mknode(g, o, name, n_in, in, 1);
    assert_non_null(n);
    return n;
}

static ir_value *op_end(ir_graph *g, ir_node *n)
{
    assert_int_equal(ir_infer_node(g, n), IR_OK);
    return n->out[0];
}

static ir_value *ints(ir_graph *g, int n, const int64_t *v) { return ci64(g, "c", n, v); }
static ir_value *int1(ir_graph *g, int64_t v) { return ints(g, 1, &v); }

static ir_value *input4(ir_graph *g, const char *name, int64_t a, int64_t b, int64_t c, int64_t d)
{
    char dims[96];
    snprintf(dims, sizeof dims, "%lld,%lld,%lld,%lld", (long long)a, (long long)b, (long long)c,
             (long long)d);
    return val(g, IR_VAL_INPUT, name, IR_DT_FLOAT, dims);
}

/* ConstantOfShape(shape, value) with a one-element value tensor of dtype dt. */
static ir_value *const_of_shape(ir_graph *g, ir_value *shape, ir_dtype dt, double fill)
{
    const int64_t one[1] = {1};
    ir_value *t;
    if (dt == IR_DT_FLOAT) {
        float f = (float)fill;
        t = ir_const_new(g, "fill", dt, 1, one, &f);
    } else {
        int64_t x = (int64_t)fill;
        t = ir_const_new(g, "fill", IR_DT_INT64, 1, one, &x);
    }
    ir_node *n = op_begin(g, IR_OP_CONSTANT_OF_SHAPE, 1, &shape);
    set_tensor_attr(g, n, "value", t);
    return op_end(g, n);
}

static ir_value *trilu(ir_graph *g, ir_value *x, int64_t k, int upper)
{
    ir_value *in[2] = {x, si64(g, "k", k)};
    ir_node *n = op_begin(g, IR_OP_TRILU, 2, in);
    ir_attr_set_int(g, n, "upper", upper);
    return op_end(g, n);
}

static ir_value *slice(ir_graph *g, ir_value *x, int64_t s, int64_t e, int64_t axis)
{
    return OP(g, IR_OP_SLICE, x, int1(g, s), int1(g, e), int1(g, axis), int1(g, 1));
}

static ir_value *transpose(ir_graph *g, ir_value *x, int rank, const int64_t *perm)
{
    ir_node *n = op_begin(g, IR_OP_TRANSPOSE, 1, &x);
    ir_attr_set_ints(g, n, "perm", perm, rank);
    return op_end(g, n);
}

static ir_value *cast(ir_graph *g, ir_value *x, ir_dtype to)
{
    ir_node *n = op_begin(g, IR_OP_CAST, 1, &x);
    ir_attr_set_int(g, n, "to", to);
    return op_end(g, n);
}

/* What the mask chain looks like. */
typedef enum {
    MK_LLAMA,      /* Slice(Expand(Unsqueeze(Unsqueeze(Trilu(CoS([T,T], fill), k, upper))))) + s */
    MK_RANGE,      /* Where(Less(arange(T), (arange(T) + 1).view(T, 1)), 0, CoS(min)) + s */
    MK_GPT2,       /* Where(Slice(Slice(bool tril [1,1,P,P])), s, fill) */
    MK_TRANSPOSED, /* Where(Cast(Transpose(Trilu(CoS(1), 0, upper)), bool), s, fill) */
    MK_INVERTED,   /* Where(Cast(Trilu(CoS(1), 1, upper), bool), fill, s) */
} mask_kind;

typedef struct mask_opts {
    mask_kind kind;
    int64_t k;        /* Trilu's diagonal (MK_LLAMA: 1 is causal) */
    int lower;        /* Trilu lower instead of upper */
    float fill;       /* 0: -FLT_MAX */
    int64_t row_off;  /* MK_LLAMA/MK_GPT2: the Trilu/buffer is bigger; rows sliced from here */
    int64_t col_off;  /* ... and columns from here */
    bool from_input;  /* + Unsqueeze(input [B,T]): a graph input upstream */
    bool trilu_input; /* the Trilu's operand is a graph input */
    int pad;          /* + const [B,1,1,T] (bool masks: And/Or): 1 harmless, 2 a key masked in
                         batch 1 only */
    int range_cmp;    /* MK_RANGE: 0 j < i+1, 1 j < i, 2 j <= i, 3 (j+2)-2 < i+1 */
    bool buf_bad;     /* MK_GPT2: one element of the buffer flipped */
    bool expand_wrap; /* MK_LLAMA: Expand's shape through the exporter's Where/Equal wrapper */
    int64_t hole;     /* MK_LLAMA: + (triu(full, h) - triu(full, h + 1)): fill at d == h only */
    int64_t window;   /* MK_LLAMA: + tril(full, -w); MK_RANGE: And/Where with j > i - w: the
                         sliding window i-w < j <= i */
    bool reopen;      /* MK_LLAMA with window: - tril(full, -2w): keys 2w or more back are
                         visible again (a masked band, not a window) */
} mask_opts;

/* The Expand target [B,1,T,T] the way the Llama export computes it: Where(Equal(s, -1), 1, s)
 * over s = [B,1,-1,-1] (all foldable shape arithmetic). */
static ir_value *expand_shape(ir_graph *g, int64_t b, int64_t T, bool wrap)
{
    const int64_t plain[4] = {b, 1, T, T};
    if (!wrap)
        return ints(g, 4, plain);
    const int64_t s[4] = {b, 1, -1, -1}, four[1] = {4};
    ir_value *sv = ints(g, 4, s);
    ir_value *ones = const_of_shape(g, ints(g, 1, four), IR_DT_INT64, 1);
    ir_value *neg = OP(g, IR_OP_MUL, ones, si64(g, "m1", -1));
    ir_value *eq = OP(g, IR_OP_EQUAL, sv, neg);
    return OP(g, IR_OP_WHERE, eq, ones, sv);
}

/* Returns the mask value; *where says how it is applied (0 Add, 1 Where keep, 2 Where inverted). */
static ir_value *build_mask(ir_graph *g, const mask_opts *o, int64_t b, int64_t T, int *where)
{
    const float fill = o->fill != 0 ? o->fill : -FLT_MAX;
    ir_value *m = NULL;
    *where = 0;
    switch (o->kind) {
    case MK_LLAMA: {
        int64_t R = T + (o->row_off > o->col_off ? o->row_off : o->col_off);
        const int64_t tt[2] = {R, R};
        ir_value *base = o->trilu_input ? NULL : const_of_shape(g, ints(g, 2, tt), IR_DT_FLOAT, fill);
        if (o->trilu_input) {
            char dims[64];
            snprintf(dims, sizeof dims, "%lld,%lld", (long long)R, (long long)R);
            base = val(g, IR_VAL_INPUT, "minus_inf", IR_DT_FLOAT, dims);
        }
        ir_value *tr = trilu(g, base, o->k, !o->lower);
        if (o->window) {
            ir_value *far = trilu(g, base, -o->window, 0);
            if (o->reopen)
                far = OP(g, IR_OP_SUB, far, trilu(g, base, -2 * o->window, 0));
            tr = OP(g, IR_OP_ADD, tr, far);
        }
        if (o->hole) {
            ir_value *a = trilu(g, base, o->hole, 1), *b2 = trilu(g, base, o->hole + 1, 1);
            tr = OP(g, IR_OP_ADD, tr, OP(g, IR_OP_SUB, a, b2));
        }
        if (R != T) {
            tr = slice(g, tr, o->row_off, o->row_off + T, 0);
            tr = slice(g, tr, o->col_off, o->col_off + T, 1);
        }
        ir_value *u = OP(g, IR_OP_UNSQUEEZE, tr, int1(g, 0));
        u = OP(g, IR_OP_UNSQUEEZE, u, int1(g, 1));
        ir_value *e = OP(g, IR_OP_EXPAND, u, expand_shape(g, b, T, o->expand_wrap));
        m = slice(g, e, 0, T, 3);
        break;
    }
    case MK_RANGE: {
        ir_value *r = OP(g, IR_OP_RANGE, si64(g, "s", 0), si64(g, "l", T), si64(g, "d", 1));
        const int64_t col[2] = {T, 1};
        ir_value *ri = o->range_cmp == 1 || o->range_cmp == 2 ? r : OP(g, IR_OP_ADD, r, si64(g, "one", 1));
        ir_value *rc = OP(g, IR_OP_RESHAPE, ri, ints(g, 2, col));
        ir_value *rj = o->range_cmp == 3 ? OP(g, IR_OP_SUB, OP(g, IR_OP_ADD, r, si64(g, "two", 2)),
                                              si64(g, "two", 2))
                                         : r;
        ir_value *cond = OP(g, o->range_cmp == 2 ? IR_OP_LESS_OR_EQUAL : IR_OP_LESS, rj, rc);
        if (o->window) { /* And(cond, j > i - w) */
            ir_value *lo = OP(g, IR_OP_SUB, OP(g, IR_OP_RESHAPE, r, ints(g, 2, col)),
                              si64(g, "w", o->window));
            cond = OP(g, IR_OP_AND, cond, OP(g, IR_OP_GREATER, r, lo));
        }
        const int64_t tt[2] = {T, T};
        ir_value *full = const_of_shape(g, ints(g, 2, tt), IR_DT_FLOAT, fill);
        ir_value *w = OP(g, IR_OP_WHERE, cond, sf32(g, "zero", 0.0f), full);
        ir_value *u = OP(g, IR_OP_UNSQUEEZE, w, int1(g, 0));
        m = OP(g, IR_OP_UNSQUEEZE, u, int1(g, 0));
        break;
    }
    case MK_GPT2: {
        const int64_t P = T + 8;
        const int64_t d4[4] = {1, 1, P, P};
        uint8_t *buf = calloc((size_t)(P * P), 1);
        for (int64_t i = 0; i < P; i++)
            for (int64_t j = 0; j <= i; j++)
                buf[i * P + j] = 1;
        if (o->buf_bad)
            buf[(o->row_off + 9) * P + o->col_off + 3] = 0;
        ir_value *bias = ir_const_new(g, "bias", IR_DT_BOOL, 4, d4, buf);
        free(buf);
        ir_value *sl = slice(g, bias, o->row_off, o->row_off + T, 2);
        m = slice(g, sl, o->col_off, o->col_off + T, 3);
        *where = 1;
        break;
    }
    case MK_TRANSPOSED:
    case MK_INVERTED: {
        const int64_t tt[2] = {T, T}, sw[2] = {1, 0};
        ir_value *ones = const_of_shape(g, ints(g, 2, tt), IR_DT_FLOAT, 1.0);
        bool tr = o->kind == MK_TRANSPOSED;
        ir_value *t = trilu(g, ones, tr ? o->k : o->k + 1, !o->lower);
        if (tr)
            t = transpose(g, t, 2, sw);
        m = cast(g, t, IR_DT_BOOL);
        *where = tr ? 1 : 2;
        break;
    }
    }
    if (o->from_input) {
        char dims[64];
        snprintf(dims, sizeof dims, "%lld,1,1,%lld", (long long)b, (long long)T);
        m = OP(g, IR_OP_ADD, m, val(g, IR_VAL_INPUT, "pad", IR_DT_FLOAT, dims));
    }
    if (o->pad && m->dtype == IR_DT_BOOL) {
        /* keep-condition And keep-padding; masked-condition Or masked-padding */
        const int64_t d4[4] = {b, 1, 1, T};
        const bool inv = *where == 2;
        uint8_t *p = malloc((size_t)(b * T));
        memset(p, !inv, (size_t)(b * T));
        if (o->pad == 2)
            p[T + 2] = inv; /* batch 1 does not see key 2 */
        ir_value *pv = ir_const_new(g, "padding", IR_DT_BOOL, 4, d4, p);
        m = OP(g, inv ? IR_OP_OR : IR_OP_AND, m, pv);
        free(p);
    } else if (o->pad) {
        const int64_t d4[4] = {b, 1, 1, T};
        float *p = calloc((size_t)(b * T), sizeof *p);
        if (o->pad == 2)
            p[T + 2] = -INFINITY; /* batch 1 does not see key 2 */
        m = OP(g, IR_OP_ADD, m, ir_const_new(g, "padding", IR_DT_FLOAT, 4, d4, p));
        free(p);
    }
    return m;
}

/* q.kT / sqrt(hd), masked, softmax, times v; returns the second MatMul's output. */
static ir_value *build_attention(ir_graph *g, const mask_opts *o, int64_t b, int64_t h, int64_t T)
{
    const int64_t swap[4] = {0, 1, 3, 2};
    ir_value *q = input4(g, "q", b, h, T, HD), *k = input4(g, "k", b, h, T, HD);
    ir_value *v = input4(g, "v", b, h, T, HD);
    ir_value *s = OP(g, IR_OP_MATMUL, q, transpose(g, k, 4, swap));
    s = OP(g, IR_OP_DIV, s, sf32(g, "sqrt_hd", sqrtf((float)HD)));
    int where;
    ir_value *m = build_mask(g, o, b, T, &where);
    if (where == 0) {
        s = OP(g, IR_OP_ADD, s, m);
    } else {
        ir_value *fill = sf32(g, "fill", o->fill != 0 ? o->fill : -FLT_MAX);
        s = where == 1 ? OP(g, IR_OP_WHERE, m, s, fill) : OP(g, IR_OP_WHERE, m, fill, s);
    }
    ir_node *sm = op_begin(g, IR_OP_SOFTMAX, 1, &s);
    ir_attr_set_int(g, sm, "axis", -1);
    ir_value *p = op_end(g, sm);
    ir_value *out = OP(g, IR_OP_MATMUL, p, v);
    add_output(g, out);
    return out;
}

/* Some live node reads or makes a value whose last two dims are T x T (scores [B,H,T,T], masks
 * [T,T] / [B|1,1,T,T]; not the fixtures' logits [B,T,V], whose V happens to be 64, nor weights). */
static bool has_tt(const ir_graph *g, int64_t T)
{
    for (int i = 0; i < g->n_nodes; i++) {
        const ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        for (int s = 0; s < n->n_in + n->n_out; s++) {
            const ir_value *v = s < n->n_in ? n->in[s] : n->out[s - n->n_in];
            if (v && v->kind != IR_VAL_PARAM && (v->rank == 2 || v->rank == 4) &&
                v->dims[v->rank - 1].value == T &&
                v->dims[v->rank - 2].value == T)
                return true;
        }
    }
    return false;
}

/* Live nodes whose inputs are all constants: what fold left unfolded. */
static int unfolded(const ir_graph *g)
{
    int c = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const ir_node *n = g->nodes[i];
        bool all = !n->dead && n->n_in > 0;
        for (int j = 0; j < n->n_in && all; j++)
            all = !n->in[j] || ir_value_is_const(n->in[j]);
        c += all;
    }
    return c;
}

static void check_valid(tgraph *t)
{
    assert_int_equal(ir_graph_toposort(t->g), IR_OK);
    if (ir_verify(t->g) != IR_OK || t->diag.n_errors)
        diag_dump(&t->diag);
    assert_int_equal(ir_verify(t->g), IR_OK);
    assert_int_equal(t->diag.n_errors, 0);
}

/* Builds the graph and runs the attention recogniser on it, checking the outcome: once on the
 * raw chain (every op lazily evaluated, Range included) and once after fold with its cap at 256
 * elements + dce (the pipeline's view: small shape arithmetic and index vectors folded, the
 * T x T pieces left as nodes). The exporter's Where/Equal wrapper on Expand's shape needs the
 * fold for shapes to be known at all. */
static void mask_case_once(const mask_opts *o, int expect, bool fold)
{
    const int64_t T = 64;
    tgraph *t = tg_new(17);
    ir_value *out = build_attention(t->g, o, B, H, T);
    assert_false(ir_value_is_const(out));
    if (fold) {
        assert_int_equal(sbp_pass_fold_max(t->g, 256), IR_OK);
        assert_int_equal(sbp_pass_dce(t->g), IR_OK);
        assert_true(has_tt(t->g, T)); /* the mask is still a chain of nodes */
    }
    assert_int_equal(sbp_recognize_attention(t->g), IR_OK);
    assert_int_equal(ir_graph_count_op(t->g, IR_OP_ATTENTION), expect);
    check_valid(t);
    if (expect) {
        ir_node *a = out->producer;
        assert_int_equal(a->op, IR_OP_ATTENTION);
        assert_int_equal(ir_attr_int(a, "causal", 0), 1);
        assert_true(fabs(ir_attr_float(a, "scale", 0) - 1.0 / sqrt((double)HD)) < 1e-6);
        /* a window of T or more keys is no window at this T */
        assert_int_equal(ir_attr_int(a, "window", 0), o->window < T ? o->window : 0);
        /* the mask chain is unused now: dce leaves nothing T x T behind */
        assert_int_equal(sbp_pass_dce(t->g), IR_OK);
        assert_false(has_tt(t->g, T));
        assert_int_equal(ir_graph_count_op(t->g, IR_OP_TRILU), 0);
        assert_int_equal(ir_graph_count_op(t->g, IR_OP_CONSTANT_OF_SHAPE), 0);
    } else {
        assert_int_equal(out->producer->op, IR_OP_MATMUL);
    }
    tg_free(t);
}

static void mask_case(const mask_opts *o, int expect)
{
    if (!o->expand_wrap)
        mask_case_once(o, expect, false);
    mask_case_once(o, expect, true);
}

/* ---------------------------------------------------------------- hand-built chains */

static void test_llama(void **s)
{
    (void)s;
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1}, 1);
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .expand_wrap = true}, 1);
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .fill = -10000.0f}, 1);
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .fill = -INFINITY}, 1);
    /* a same-sized padding term of zeros changes nothing */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .pad = 1}, 1);
    /* both axes sliced from the same offset of a bigger triu: still j - i */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .row_off = 3, .col_off = 3}, 1);
    /* masked twice at d = 5 (min + min = -inf): still causal */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .hole = 5}, 1);
}

static void test_llama_not_causal(void **s)
{
    (void)s;
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 0}, 0);              /* diagonal masked too */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 2}, 0);              /* sees one key ahead */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .lower = 1}, 0);  /* the wrong triangle */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .fill = -1.0f}, 0); /* too weak */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .pad = 2}, 0);    /* padded in batch 1 */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .from_input = true}, 0);
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .trilu_input = true}, 0);
    /* columns one ahead of rows: the diagonal is masked */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .row_off = 0, .col_off = 1}, 0);
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .row_off = 1, .col_off = 0}, 0);
    /* key i - 10 alone masked: found only by probing around the jumps the proof found */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .hole = -10}, 0);
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .hole = -10, .expand_wrap = true}, 0);
}

static void test_range(void **s)
{
    (void)s;
    mask_case(&(mask_opts){.kind = MK_RANGE, .range_cmp = 0}, 1); /* j < i + 1 */
    mask_case(&(mask_opts){.kind = MK_RANGE, .range_cmp = 2}, 1); /* j <= i */
    mask_case(&(mask_opts){.kind = MK_RANGE, .range_cmp = 3}, 1); /* (j + 2) - 2 < i + 1 */
    mask_case(&(mask_opts){.kind = MK_RANGE, .range_cmp = 1}, 0); /* j < i: diagonal masked */
    mask_case(&(mask_opts){.kind = MK_RANGE, .range_cmp = 0, .pad = 2}, 0);
}

static void test_gpt2(void **s)
{
    (void)s;
    mask_case(&(mask_opts){.kind = MK_GPT2}, 1);
    mask_case(&(mask_opts){.kind = MK_GPT2, .row_off = 5, .col_off = 5}, 1);
    mask_case(&(mask_opts){.kind = MK_GPT2, .fill = -1.0f}, 0);
    mask_case(&(mask_opts){.kind = MK_GPT2, .buf_bad = true}, 0);
    mask_case(&(mask_opts){.kind = MK_GPT2, .row_off = 0, .col_off = 1}, 0);
    mask_case(&(mask_opts){.kind = MK_GPT2, .from_input = false, .pad = 0, .row_off = 2}, 0);
}

static void test_transposed_inverted(void **s)
{
    (void)s;
    /* Transpose(triu(ones, 0)) = tril(ones, 0): keep j <= i */
    mask_case(&(mask_opts){.kind = MK_TRANSPOSED, .k = 0}, 1);
    mask_case(&(mask_opts){.kind = MK_TRANSPOSED, .k = 1}, 0);
    mask_case(&(mask_opts){.kind = MK_TRANSPOSED, .k = 0, .lower = 1}, 0);
    /* Where(triu(ones, 1), fill, s): the scores in the else-branch */
    mask_case(&(mask_opts){.kind = MK_INVERTED, .k = 0}, 1);
    mask_case(&(mask_opts){.kind = MK_INVERTED, .k = -1}, 0);
}

/* Attention's window (or -1: not recognised) for a graph folded with `cap`. */
static int64_t verdict_window(const mask_opts *o, int64_t T, int64_t cap)
{
    tgraph *t = tg_new(17);
    ir_value *out = build_attention(t->g, o, B, H, T);
    assert_int_equal(sbp_pass_fold_max(t->g, cap), IR_OK);
    assert_int_equal(sbp_pass_dce(t->g), IR_OK);
    assert_int_equal(unfolded(t->g) > 0, cap != 0);
    assert_int_equal(sbp_recognize_attention(t->g), IR_OK);
    check_valid(t);
    int64_t r = out->producer->op == IR_OP_ATTENTION ? ir_attr_int(out->producer, "window", 0)
                                                      : -1;
    tg_free(t);
    return r;
}

/* Sliding windows (keys i-w < j <= i) as chains: w read off the last row, then every interval
 * between the proof's jumps checked; w >= T is plain causal. */
static void test_window(void **s)
{
    (void)s;
    static const int64_t ws[] = {1, 2, 13, 37, 63, 64, 100};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = ws[i]}, 1);
        mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = ws[i], .expand_wrap = true},
                  1);
        mask_case(&(mask_opts){.kind = MK_RANGE, .window = ws[i]}, 1);
        mask_case(&(mask_opts){.kind = MK_RANGE, .range_cmp = 2, .window = ws[i]}, 1);
    }
    /* the oldest key of the window masked as well: that is the window w - 1, folded or not */
    for (int64_t cap = 0; cap <= 256; cap += 256) {
        assert_int_equal(verdict_window(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = 13,
                                                     .hole = -12},
                                        64, cap),
                         12);
        assert_int_equal(verdict_window(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = 2,
                                                     .hole = -1},
                                        64, cap),
                         1);
    }
    /* a hole where the window masks anyway (fill twice: -inf) changes nothing */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = 13, .hole = -20}, 1);
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = 13, .pad = 1}, 1);
}

static void test_window_not_causal(void **s)
{
    (void)s;
    /* one key inside the window masked (keys on both sides of it kept) */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = 13, .hole = -6}, 0);
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = 13, .hole = -11}, 0);
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = 13, .hole = -1}, 0);
    /* the diagonal masked, one key ahead visible */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 0, .window = 13}, 0);
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 2, .window = 13}, 0);
    mask_case(&(mask_opts){.kind = MK_RANGE, .range_cmp = 1, .window = 13}, 0);
    /* a masked band with the far past visible again */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = 13, .reopen = true}, 0);
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = 5, .reopen = true}, 0);
    /* weak fill, per-batch padding, an input upstream */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = 13, .fill = -1.0f}, 0);
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = 13, .pad = 2}, 0);
    mask_case(&(mask_opts){.kind = MK_RANGE, .window = 13, .pad = 2}, 0);
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = 13, .from_input = true}, 0);
    /* rows and columns sliced from different offsets: the window's edge moves too */
    mask_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .window = 13, .row_off = 0, .col_off = 1},
              0);
}

/* The lazy proof against the element-by-element check for windowed chains: same verdict and
 * same w, over windows, diagonals, holes, re-opened bands, offsets and padding. */
static void test_window_lazy_matches_folded(void **s)
{
    (void)s;
    const int64_t T = 16;
    static const int64_t ws[] = {1, 3, 5, 8, 15, 16, 20};
    static const int64_t holes[] = {0, -2, -4, -9, 3};
    const int64_t offs[3][2] = {{0, 0}, {2, 2}, {0, 1}};
    int n = 0, windows = 0;
    for (int kind = MK_LLAMA; kind <= MK_RANGE; kind++)
        for (size_t wi = 0; wi < sizeof ws / sizeof ws[0]; wi++)
            for (int64_t k = 0; k <= 2; k++)
                for (size_t hi = 0; hi < sizeof holes / sizeof holes[0]; hi++)
                    for (int off = 0; off < 3; off++)
                        for (int var = 0; var < 3; var++) {
                            /* var: 1 re-opened band (MK_LLAMA) / range_cmp 2 (MK_RANGE); 2
                             * padding of one key in batch 1 */
                            if (kind == MK_RANGE && (k != 1 || holes[hi] || off))
                                continue;
                            mask_opts o = {.kind = (mask_kind)kind, .k = k, .window = ws[wi],
                                           .hole = kind == MK_LLAMA ? holes[hi] : 0,
                                           .row_off = offs[off][0], .col_off = offs[off][1],
                                           .reopen = kind == MK_LLAMA && var == 1,
                                           .range_cmp = kind == MK_RANGE && var == 1 ? 2 : 0,
                                           .pad = var == 2 ? 2 : 0};
                            int64_t full = verdict_window(&o, T, 0);
                            int64_t lazy = verdict_window(&o, T, 64);
                            if (full != lazy)
                                fprintf(stderr,
                                        "kind %d w %lld k %lld hole %lld off %d var %d: folded "
                                        "%lld lazy %lld\n",
                                        kind, (long long)ws[wi], (long long)k,
                                        (long long)holes[hi], off, var, (long long)full,
                                        (long long)lazy);
                            assert_true(full == lazy);
                            n++;
                            windows += full > 0;
                        }
    fprintf(stderr, "  %d windowed chains, %d with a window\n", n, windows);
    assert_true(windows > 10 && windows < n / 2);
}

/* The lazy proof against the full-data check, over a grid of chains: each graph is built twice,
 * once folded with the default cap (the mask becomes a constant and is checked element by
 * element) and once with the cap below T x T (the mask stays a chain and is proved lazily). The
 * verdicts must agree: never accepting more, and here (every form is one the proof covers) not
 * accepting less either. (Some chains that look off are causal: Trilu k = 0 with the columns
 * sliced from one row below, say; the full-data check is the ground truth.) */
static int verdict(const mask_opts *o, int64_t T, int64_t cap)
{
    tgraph *t = tg_new(17);
    ir_value *out = build_attention(t->g, o, B, H, T);
    assert_int_equal(sbp_pass_fold_max(t->g, cap), IR_OK);
    assert_int_equal(sbp_pass_dce(t->g), IR_OK);
    assert_int_equal(unfolded(t->g) > 0, cap != 0); /* the mask: a constant, or a chain */
    assert_int_equal(sbp_recognize_attention(t->g), IR_OK);
    check_valid(t);
    int r = out->producer->op == IR_OP_ATTENTION;
    tg_free(t);
    return r;
}

static void test_lazy_matches_folded(void **s)
{
    (void)s;
    const int64_t T = 16;
    const float fills[4] = {0, -1e4f, -1.0f, -INFINITY};
    const int64_t offs[4][2] = {{0, 0}, {2, 2}, {0, 1}, {1, 0}};
    int n = 0, accepted = 0;
    for (int kind = MK_LLAMA; kind <= MK_INVERTED; kind++)
        for (int64_t k = -1; k <= 2; k++)
            for (int lower = 0; lower < 2; lower++)
                for (int f = 0; f < 4; f++)
                    for (int off = 0; off < 4; off++)
                        for (int pad = 0; pad < 3; pad++)
                            for (int var = 0; var < 4; var++) {
                                /* var: MK_LLAMA hole (none, d = -3, d = 4), MK_RANGE the
                                 * comparison, MK_GPT2 a flipped buffer element */
                                if ((kind == MK_RANGE || kind == MK_GPT2) && (k != -1 || lower))
                                    continue;
                                if (kind != MK_LLAMA && kind != MK_GPT2 && off)
                                    continue;
                                if (kind != MK_LLAMA && kind != MK_RANGE && var > 1)
                                    continue;
                                if (kind >= MK_TRANSPOSED && var)
                                    continue;
                                mask_opts o = {.kind = (mask_kind)kind, .k = k, .lower = lower,
                                               .fill = fills[f], .row_off = offs[off][0],
                                               .col_off = offs[off][1], .pad = pad,
                                               .range_cmp = var, .buf_bad = var == 1};
                                if (kind == MK_LLAMA)
                                    o.hole = var == 1 ? -3 : var == 2 ? 4 : 0;
                                o.range_cmp = kind == MK_RANGE ? var : 0;
                                o.buf_bad = kind == MK_GPT2 && var == 1;
                                int full = verdict(&o, T, 0), lazy = verdict(&o, T, 64);
                                if (full != lazy)
                                    fprintf(stderr,
                                            "kind %d k %lld lower %d fill %g off %d pad %d var %d: "
                                            "folded %d lazy %d\n",
                                            kind, (long long)k, lower, (double)fills[f], off, pad,
                                            var, full, lazy);
                                assert_int_equal(full, lazy);
                                n++;
                                accepted += full;
                            }
    fprintf(stderr, "  %d chains, %d causal\n", n, accepted);
    assert_true(accepted > 20 && accepted < n / 2);
}

/* ---------------------------------------------------------------- long sequences */

/* The CPU time this thread has used, in seconds: the bounds below are on the work done, which a
 * loaded machine (ctest -j, the sanitizers' CI run) does not change, while it can stretch the
 * wall-clock time of the same work many times over. */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* fold (default cap) + dce + attention + dce at T = 20000: the 400 M-element mask is never built,
 * fold refuses it before allocating, and the whole thing takes well under a second. */
static void long_case(const mask_opts *o)
{
    const int64_t T = 20000;
    tgraph *t = tg_new(17);
    ir_value *out = build_attention(t->g, o, 1, 2, T);
    const double t0 = now();
    const size_t bytes0 = ir_arena_bytes(t->g->arena);
    assert_int_equal(sbp_pass_fold(t->g), IR_OK);
    const size_t fold_bytes = ir_arena_bytes(t->g->arena) - bytes0;
    assert_true(fold_bytes < ((size_t)1 << 20));
    /* the chain is still there, unfolded */
    assert_true(ir_graph_count_op(t->g, IR_OP_CONSTANT_OF_SHAPE) >= 1);
    assert_int_equal(sbp_pass_dce(t->g), IR_OK);
    assert_int_equal(sbp_recognize_attention(t->g), IR_OK);
    assert_int_equal(sbp_pass_dce(t->g), IR_OK);
    const double dt = now() - t0;
    assert_int_equal(ir_graph_count_op(t->g, IR_OP_ATTENTION), 1);
    assert_int_equal(out->producer->op, IR_OP_ATTENTION);
    assert_int_equal(ir_attr_int(out->producer, "window", 0), o->window);
    assert_false(has_tt(t->g, T));
    /* no constant anywhere holds T x T elements (or anything near it) */
    for (int i = 0; i < t->g->n_values; i++) {
        const ir_value *v = t->g->values[i];
        if (v->kind == IR_VAL_CONST)
            assert_true(ir_value_numel(v) < T * 4);
    }
    check_valid(t);
    fprintf(stderr, "  T=%lld: fold+recognise %.3f ms (CPU), fold allocated %zu bytes\n",
            (long long)T, dt * 1e3, fold_bytes);
    assert_true(dt < 1.0);
    tg_free(t);
}

static void test_long_llama(void **s)
{
    (void)s;
    long_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .expand_wrap = true});
}

static void test_long_range(void **s)
{
    (void)s;
    long_case(&(mask_opts){.kind = MK_RANGE});
}

/* A wrong diagonal at T = 20000 is refused as fast. */
static void test_long_not_causal(void **s)
{
    (void)s;
    const int64_t T = 20000;
    tgraph *t = tg_new(17);
    ir_value *out = build_attention(t->g, &(mask_opts){.kind = MK_LLAMA, .k = 0}, 1, 2, T);
    const double t0 = now();
    assert_int_equal(sbp_pass_fold(t->g), IR_OK);
    assert_int_equal(sbp_recognize_attention(t->g), IR_OK);
    assert_true(now() - t0 < 1.0);
    assert_int_equal(ir_graph_count_op(t->g, IR_OP_ATTENTION), 0);
    assert_int_equal(out->producer->op, IR_OP_MATMUL);
    tg_free(t);
}

/* Mistral-style sliding windows at T = 20000, w = 4096: Trilu chains and Range comparisons,
 * never materialised, the window read off the proof. */
static void test_long_window(void **s)
{
    (void)s;
    long_case(&(mask_opts){.kind = MK_LLAMA, .k = 1, .expand_wrap = true, .window = 4096});
    long_case(&(mask_opts){.kind = MK_RANGE, .window = 4096});
    long_case(&(mask_opts){.kind = MK_RANGE, .range_cmp = 2, .window = 4096});
}

/* ... and a window with one key inside it masked, or the far past re-opened, is refused. */
static void test_long_window_not_causal(void **s)
{
    (void)s;
    const int64_t T = 20000;
    const mask_opts bad[3] = {
        {.kind = MK_LLAMA, .k = 1, .window = 4096, .hole = -4094},
        {.kind = MK_LLAMA, .k = 1, .window = 4096, .reopen = true},
        {.kind = MK_LLAMA, .k = 1, .window = 4096, .hole = -1000},
    };
    for (int i = 0; i < 3; i++) {
        tgraph *t = tg_new(17);
        ir_value *out = build_attention(t->g, &bad[i], 1, 2, T);
        const double t0 = now();
        assert_int_equal(sbp_pass_fold(t->g), IR_OK);
        assert_int_equal(sbp_recognize_attention(t->g), IR_OK);
        assert_true(now() - t0 < 1.0);
        assert_int_equal(ir_graph_count_op(t->g, IR_OP_ATTENTION), 0);
        assert_int_equal(out->producer->op, IR_OP_MATMUL);
        assert_true(diag_has(&t->diag, "is not recognised", NULL));
        tg_free(t);
    }
}

/* fold's cap: a node whose result is above it is left alone, without allocating its data. */
static void test_fold_cap(void **s)
{
    (void)s;
    tgraph *t = tg_new(17);
    const int64_t tt[2] = {20, 20};
    ir_value *m = const_of_shape(t->g, ints(t->g, 2, tt), IR_DT_FLOAT, -1.0);
    ir_value *small = const_of_shape(t->g, ints(t->g, 1, tt), IR_DT_FLOAT, -1.0);
    add_output(t->g, m);
    add_output(t->g, small);
    assert_int_equal(sbp_pass_fold_max(t->g, 256), IR_OK);
    assert_false(ir_value_is_const(m));        /* 400 > 256 */
    assert_true(ir_value_is_const(small));     /* 20 */
    assert_int_equal(sbp_pass_fold_max(t->g, 400), IR_OK);
    assert_true(ir_value_is_const(m));         /* 400 <= 400 */
    tg_free(t);
}

/* ---------------------------------------------------------------- the fixture exports */

static char *dump(const ir_graph *g)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ir_print(g, f);
    fclose(f);
    return buf;
}

static char *canon_t(const char *file, int64_t batch, int64_t seq, int64_t T, int64_t cap,
                     const char *stop, int *n_attn, int *n_unfolded, bool *tt)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.onnx", SBP_FIXTURES_DIR, file);
    ir_diag d;
    ir_diag_init(&d, path);
    ir_graph *g = ir_import_onnx(path, &d, NULL);
    assert_non_null(g);
    sbp_pass_options opt = {.batch = batch, .seq_len = seq, .verify = true, .fold_max_elems = cap};
    int rc = sbp_canonicalize(g, &opt, stop);
    if (rc != IR_OK)
        ir_diag_print(&d, stderr, file);
    assert_int_equal(rc, IR_OK);
    *n_attn = ir_graph_count_op(g, IR_OP_ATTENTION);
    *n_unfolded = unfolded(g);
    *tt = has_tt(g, T);
    char *s = dump(g);
    ir_graph_free(g);
    ir_diag_free(&d);
    return s;
}

static char *canon(const char *file, int64_t batch, int64_t seq, int64_t cap, const char *stop,
                   int *n_attn, int *n_unfolded, bool *tt)
{
    /* the static exports are built for T = 64 */
    return canon_t(file, batch, seq, seq ? seq : 64, cap, stop, n_attn, n_unfolded, tt);
}

/* With the cap at 256 elements every mask stays a chain of nodes after fold, and the canonical
 * IR must still be exactly the default one. */
static void test_fixtures_small_cap(void **s)
{
    (void)s;
    /* lazy: the mask is computed by nodes that a small cap leaves unfolded (gpt2's static
     * export stores the sliced [1,1,64,64] mask itself as an initializer: no chain to leave) */
    static const struct {
        const char *file;
        int64_t b, t;
        bool lazy;
    } fx[] = {
        {"llama_op17_dyn", 2, 64, true},       {"qwen3_op17_dyn", 2, 64, true},
        {"gpt2_op17_dyn", 2, 64, true},        {"gpt2_op14_dyn", 2, 64, true},
        {"gpt2_op17_dyn_nofold", 2, 64, true}, {"llama_op17_static", 0, 0, true},
        {"qwen3_op17_static", 0, 0, true},     {"llama_op17_loss", 0, 0, true},
        {"gpt2_op17_static", 0, 0, false},     {"llama_op17_dyn", 3, 17, true},
        {"gpt2_op17_dyn", 1, 33, true},
    };
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        int a0, a1, u0, u1;
        bool tt0, tt1;
        /* after fold: the small cap leaves the mask chain as nodes of constants */
        free(canon(fx[i].file, fx[i].b, fx[i].t, 0, "fold", &a0, &u0, &tt0));
        free(canon(fx[i].file, fx[i].b, fx[i].t, 256, "fold", &a1, &u1, &tt1));
        assert_int_equal(u0, 0);
        assert_int_equal(u1 > 0, fx[i].lazy);
        /* canonical: the same IR, two Attentions, no T x T value left */
        char *d0 = canon(fx[i].file, fx[i].b, fx[i].t, 0, NULL, &a0, &u0, &tt0);
        char *d1 = canon(fx[i].file, fx[i].b, fx[i].t, 256, NULL, &a1, &u1, &tt1);
        if (strcmp(d0, d1) != 0)
            fprintf(stderr, "%s: canonical IR differs with fold cap 256\n", fx[i].file);
        assert_string_equal(d0, d1);
        assert_int_equal(a0, 2);
        assert_int_equal(a1, 2);
        assert_false(tt0);
        assert_false(tt1);
        assert_int_equal(u1, 0);
        free(d0);
        free(d1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_llama_not_causal),
        cmocka_unit_test(test_range),
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_transposed_inverted),
        cmocka_unit_test(test_lazy_matches_folded),
        cmocka_unit_test(test_window),
        cmocka_unit_test(test_window_not_causal),
        cmocka_unit_test(test_window_lazy_matches_folded),
        cmocka_unit_test(test_fold_cap),
        cmocka_unit_test(test_long_llama),
        cmocka_unit_test(test_long_range),
        cmocka_unit_test(test_long_not_causal),
        cmocka_unit_test(test_long_window),
        cmocka_unit_test(test_long_window_not_causal),
        cmocka_unit_test(test_fixtures_small_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
