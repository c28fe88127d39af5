/* test_recognize_attn.c — unit tests of the RoPE and attention recognisers
 * (passes/graph/recognize_rope.c, passes/graph/recognize_attention.c) on small hand-built graphs.
 *
 * Each test builds the ONNX pattern an exporter emits after bind-dims and fold (constants for
 * the tables, masks and scales), runs the recogniser alone and checks what it made — or that it
 * left a near miss alone: non-causal and padded masks, tables that vary over the batch,
 * swapped rotate-half halves, intermediates used outside the pattern. The graph must still
 * verify afterwards.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recognize.h"

/* ---------------------------------------------------------------- building graphs */

typedef struct tg {
    ir_diag d;
    ir_graph *g;
} tg;

static void tg_init(tg *t)
{
    ir_diag_init(&t->d, NULL);
    t->g = ir_graph_new(&t->d, "test.onnx");
    t->g->opset = 17;
}

static void tg_free(tg *t)
{
    free(t->g->inputs);
    free(t->g->outputs);
    ir_graph_free(t->g);
    ir_diag_free(&t->d);
}

static ir_value *input4(tg *t, const char *name, int64_t a, int64_t b, int64_t c, int64_t d)
{
    ir_dim dims[4] = {{a, NULL}, {b, NULL}, {c, NULL}, {d, NULL}};
    ir_value *v = ir_value_new(t->g, name, IR_VAL_INPUT, IR_DT_FLOAT, 4, dims);
    ir_graph *g = t->g;
    g->inputs = realloc(g->inputs, sizeof(ir_value *) * (size_t)(g->n_inputs + 1));
    g->inputs[g->n_inputs++] = v;
    return v;
}

static void add_output(tg *t, ir_value *v)
{
    ir_graph *g = t->g;
    g->outputs = realloc(g->outputs, sizeof(ir_value *) * (size_t)(g->n_outputs + 1));
    g->outputs[g->n_outputs++] = v;
    v->is_output = true;
}

static ir_value *ints(tg *t, int n, const int64_t *v)
{
    const int64_t dims[1] = {n};
    return ir_const_new(t->g, "c", IR_DT_INT64, 1, dims, v);
}

static ir_value *int1(tg *t, int64_t v) { return ints(t, 1, &v); }

static ir_value *f32(tg *t, int rank, const int64_t *dims, const float *data)
{
    return ir_const_new(t->g, "f", IR_DT_FLOAT, rank, dims, data);
}

static ir_value *f32_scalar(tg *t, float x) { return f32(t, 0, NULL, &x); }

/* A node whose outputs start untyped, so attributes can be set before inference. */
static ir_node *begin(tg *t, ir_op op, int n_in, ir_value *const *in, int n_out)
{
    ir_value *outs[4];
    for (int i = 0; i < n_out; i++)
        outs[i] = ir_value_new(t->g, "t", IR_VAL_NODE, IR_DT_UNDEFINED, -1, NULL);
    ir_node *n = ir_node_new_with_outputs(t->g, op, NULL, NULL, n_in, in, n_out, outs);
    assert_non_null(n);
    return n;
}

static ir_value *end(tg *t, ir_node *n)
{
    assert_int_equal(ir_infer_node(t->g, n), IR_OK);
    return n->out[0];
}

static ir_value *op1(tg *t, ir_op op, ir_value *a) { return end(t, begin(t, op, 1, &a, 1)); }

static ir_value *op2(tg *t, ir_op op, ir_value *a, ir_value *b)
{
    ir_value *in[2] = {a, b};
    return end(t, begin(t, op, 2, in, 1));
}

static ir_value *transpose(tg *t, ir_value *x, const int64_t *perm)
{
    ir_node *n = begin(t, IR_OP_TRANSPOSE, 1, &x, 1);
    ir_attr_set_ints(t->g, n, "perm", perm, 4);
    return end(t, n);
}

static ir_value *slice_last(tg *t, ir_value *x, int64_t s, int64_t e, int64_t axis)
{
    ir_value *in[5] = {x, int1(t, s), int1(t, e), int1(t, axis), int1(t, 1)};
    return end(t, begin(t, IR_OP_SLICE, 5, in, 1));
}

static ir_value *concat_last(tg *t, ir_value *a, ir_value *b)
{
    ir_value *in[2] = {a, b};
    ir_node *n = begin(t, IR_OP_CONCAT, 2, in, 1);
    ir_attr_set_int(t->g, n, "axis", -1);
    return end(t, n);
}

static int count(tg *t, ir_op op) { return ir_graph_count_op(t->g, op); }

/* The graph is still well-formed and error-free after a recogniser (and dce-free sorting). */
static void check_valid(tg *t)
{
    assert_int_equal(ir_graph_toposort(t->g), IR_OK);
    assert_int_equal(ir_verify(t->g), IR_OK);
    assert_int_equal(t->d.n_errors, 0);
}

/* ---------------------------------------------------------------- RoPE */

enum { B = 2, HQ = 4, T = 6, HD = 8 };

static void fill_table(float *tab, int rows, int64_t per_row, float seed)
{
    for (int r = 0; r < rows; r++)
        for (int64_t i = 0; i < per_row; i++)
            tab[r * per_row + i] = sinf(seed + 0.37f * (float)r + 0.11f * (float)i);
}

typedef struct rope_opts {
    bool swap;       /* operands of Add and Muls in the other order */
    bool split;      /* halves from a Split instead of two Slices */
    bool halves_bad; /* Concat(Neg(lo), hi): not rotate-half */
    int cos_batch;   /* 0: cos [1,1,T,hd]; 1: [B,1,T,hd] same per batch; 2: differs per batch */
    bool leak;       /* the Neg's output is also a graph output */
    bool cos2d;      /* cos [T,hd] directly */
} rope_opts;

/* x [B,HQ,T,HD] -> x*cos + rotate_half(x)*sin; returns the Add's output. */
static ir_value *build_rope(tg *t, ir_value *x, const rope_opts *o, float *ctab, float *stab)
{
    fill_table(ctab, T, HD, 0.5f);
    fill_table(stab, T, HD, 1.5f);
    ir_value *cos, *sin;
    if (o->cos2d) {
        const int64_t d2[2] = {T, HD};
        cos = f32(t, 2, d2, ctab);
        sin = f32(t, 2, d2, stab);
    } else if (o->cos_batch) {
        const int64_t d4[4] = {B, 1, T, HD};
        float big[2 * T * HD], bigs[2 * T * HD];
        for (int b = 0; b < 2; b++) {
            memcpy(big + b * T * HD, ctab, sizeof(float) * T * HD);
            memcpy(bigs + b * T * HD, stab, sizeof(float) * T * HD);
        }
        if (o->cos_batch == 2)
            big[T * HD + 5] += 0.25f;
        cos = f32(t, 4, d4, big);
        sin = f32(t, 4, d4, bigs);
    } else {
        const int64_t d4[4] = {1, 1, T, HD};
        cos = f32(t, 4, d4, ctab);
        sin = f32(t, 4, d4, stab);
    }
    ir_value *lo, *hi;
    if (o->split) {
        const int64_t sz[2] = {HD / 2, HD / 2};
        ir_value *in[2] = {x, ints(t, 2, sz)};
        ir_node *n = begin(t, IR_OP_SPLIT, 2, in, 2);
        ir_attr_set_int(t->g, n, "axis", 3);
        end(t, n);
        lo = n->out[0];
        hi = n->out[1];
    } else {
        lo = slice_last(t, x, 0, HD / 2, 3);
        hi = slice_last(t, x, HD / 2, INT64_MAX, -1);
    }
    ir_value *neg = op1(t, IR_OP_NEG, o->halves_bad ? lo : hi);
    if (o->leak)
        add_output(t, neg);
    ir_value *rot = concat_last(t, neg, o->halves_bad ? hi : lo);
    ir_value *a = o->swap ? op2(t, IR_OP_MUL, cos, x) : op2(t, IR_OP_MUL, x, cos);
    ir_value *b = o->swap ? op2(t, IR_OP_MUL, sin, rot) : op2(t, IR_OP_MUL, rot, sin);
    return o->swap ? op2(t, IR_OP_ADD, b, a) : op2(t, IR_OP_ADD, a, b);
}

static void run_rope(const rope_opts *o, int expect)
{
    tg t;
    tg_init(&t);
    float ctab[T * HD], stab[T * HD];
    ir_value *x = input4(&t, "x", B, HQ, T, HD);
    ir_value *out = build_rope(&t, x, o, ctab, stab);
    ir_value *y = op1(&t, IR_OP_RELU, out); /* a consumer, so uses get redirected */
    add_output(&t, y);
    assert_int_equal(sbp_recognize_rope(t.g), IR_OK);
    assert_int_equal(count(&t, IR_OP_ROPE), expect);
    ir_node *relu = y->producer;
    if (expect) {
        ir_node *r = relu->in[0]->producer;
        assert_int_equal(r->op, IR_OP_ROPE);
        assert_ptr_equal(r->in[0], x);
        for (int i = 1; i <= 2; i++) {
            const ir_value *c = r->in[i];
            assert_true(ir_value_is_const(c));
            assert_int_equal(c->rank, 2);
            assert_int_equal(c->dims[0].value, T);
            assert_int_equal(c->dims[1].value, HD);
            assert_memory_equal(c->data, i == 1 ? ctab : stab, sizeof ctab);
        }
        for (int i = 0; i < 4; i++)
            assert_int_equal(r->out[0]->dims[i].value, x->dims[i].value);
        assert_true(r->n_origin >= (o->split ? 6 : 7));
    } else {
        assert_ptr_equal(relu->in[0], out);
    }
    check_valid(&t);
    tg_free(&t);
}

static void test_rope_basic(void **s) { (void)s; run_rope(&(rope_opts){0}, 1); }
static void test_rope_swapped(void **s) { (void)s; run_rope(&(rope_opts){.swap = true}, 1); }
static void test_rope_split(void **s) { (void)s; run_rope(&(rope_opts){.split = true}, 1); }
static void test_rope_cos2d(void **s) { (void)s; run_rope(&(rope_opts){.cos2d = true}, 1); }
static void test_rope_batch_same(void **s) { (void)s; run_rope(&(rope_opts){.cos_batch = 1}, 1); }
static void test_rope_batch_differs(void **s)
{
    (void)s;
    run_rope(&(rope_opts){.cos_batch = 2}, 0);
}
static void test_rope_bad_halves(void **s) { (void)s; run_rope(&(rope_opts){.halves_bad = true}, 0); }
static void test_rope_leak(void **s) { (void)s; run_rope(&(rope_opts){.leak = true}, 0); }

/* q and k of one layer share their tables: two Ropes, one cos and one sin constant. */
static void test_rope_shared_tables(void **s)
{
    (void)s;
    tg t;
    tg_init(&t);
    float ctab[T * HD], stab[T * HD];
    ir_value *q = input4(&t, "q", B, HQ, T, HD), *k = input4(&t, "k", B, 2, T, HD);
    add_output(&t, op1(&t, IR_OP_RELU, build_rope(&t, q, &(rope_opts){0}, ctab, stab)));
    add_output(&t, op1(&t, IR_OP_RELU, build_rope(&t, k, &(rope_opts){.swap = true}, ctab, stab)));
    assert_int_equal(sbp_recognize_rope(t.g), IR_OK);
    assert_int_equal(count(&t, IR_OP_ROPE), 2);
    ir_node *r0 = t.g->outputs[0]->producer->in[0]->producer;
    ir_node *r1 = t.g->outputs[1]->producer->in[0]->producer;
    assert_ptr_equal(r0->in[1], r1->in[1]);
    assert_ptr_equal(r0->in[2], r1->in[2]);
    assert_ptr_equal(r1->in[0], k);
    check_valid(&t);
    tg_free(&t);
}

/* ---------------------------------------------------------------- attention */

typedef struct attn_opts {
    bool gqa;           /* k/v [B,2,T,hd] through repeat_kv */
    bool gpt2_k;        /* kT = Transpose(k [B,T,H,hd], [0,2,3,1]) */
    bool k_pretrans;    /* kT is an input [B,H,hd,T] */
    int mask;           /* 0 additive, 1 Where(tril, s, fill), 2 Where(triu1, fill, s) */
    int scale;          /* 0 Div(s, sqrt hd), 1 Mul(s, 1/sqrt hd), 2 q and k each * hd^-1/4,
                           3 none, 4 Div after the mask */
    int bad;            /* 0 none; 1 padded (a key masked in batch 1); 2 diagonal masked;
                           3 weak fill (-1); 4 mask not over full T (broadcast [1,T]) */
    bool probs_out;     /* the softmax output is a graph output too */
    bool gqa_v_only;    /* v repeated but k not (k has Hq heads): no stripping */
} attn_opts;

typedef struct attn_built {
    ir_value *q, *k, *v; /* what Attention should read (k: NULL when a Transpose is made) */
    ir_value *k_src;     /* source of the expected Transpose */
    ir_value *o;         /* the second MatMul's output */
} attn_built;

static ir_value *repeat_kv(tg *t, ir_value *kv, int n_rep)
{
    int64_t hkv = kv->dims[1].value;
    ir_value *in[2] = {kv, int1(t, 2)};
    ir_value *u = end(t, begin(t, IR_OP_UNSQUEEZE, 2, in, 1));
    const int64_t es[5] = {B, hkv, n_rep, T, HD}, rs[4] = {B, hkv * n_rep, T, HD};
    ir_value *e = op2(t, IR_OP_EXPAND, u, ints(t, 5, es));
    return op2(t, IR_OP_RESHAPE, e, ints(t, 4, rs));
}

static ir_value *mask_const(tg *t, const attn_opts *o)
{
    const bool batch = o->bad == 1;
    const int64_t nb = batch ? B : 1;
    float add[B * T * T];
    uint8_t tril[B * T * T];
    for (int64_t b = 0; b < nb; b++)
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++) {
                bool keep = j <= i;
                if (o->bad == 1 && b == 1 && j == 0 && i > 0)
                    keep = false; /* left padding of one token in batch 1 */
                if (o->bad == 2 && i == j && i == 3)
                    keep = false;
                size_t e = (size_t)(b * T * T + i * T + j);
                add[e] = keep ? 0.0f : -FLT_MAX;
                tril[e] = o->mask == 2 ? !keep : keep;
            }
    if (o->bad == 4) { /* [1,T]: the same row for every query: not causal */
        const int64_t d2[2] = {1, T};
        return o->mask ? ir_const_new(t->g, "m", IR_DT_BOOL, 2, d2, tril + (T - 1) * T)
                       : f32(t, 2, d2, add + (T - 1) * T);
    }
    const int64_t d4[4] = {nb, 1, T, T};
    if (o->mask == 0)
        return f32(t, 4, d4, add);
    return ir_const_new(t->g, "m", IR_DT_BOOL, 4, d4, tril);
}

static ir_value *apply_mask(tg *t, const attn_opts *o, ir_value *s)
{
    ir_value *m = mask_const(t, o);
    if (o->mask == 0)
        return op2(t, IR_OP_ADD, s, m);
    ir_value *fill = f32_scalar(t, o->bad == 3 ? -1.0f : -FLT_MAX);
    ir_value *in[3] = {m, o->mask == 1 ? s : fill, o->mask == 1 ? fill : s};
    return end(t, begin(t, IR_OP_WHERE, 3, in, 1));
}

static void build_attn(tg *t, const attn_opts *o, attn_built *r)
{
    memset(r, 0, sizeof *r);
    const int64_t swap[4] = {0, 1, 3, 2}, gperm[4] = {0, 2, 3, 1};
    ir_value *q = r->q = input4(t, "q", B, HQ, T, HD);
    ir_value *kt, *vrep;
    if (o->gqa) {
        ir_value *k0 = r->k = input4(t, "k", B, 2, T, HD);
        ir_value *v0 = r->v = input4(t, "v", B, 2, T, HD);
        kt = transpose(t, repeat_kv(t, k0, 2), swap);
        vrep = repeat_kv(t, v0, 2);
    } else if (o->gqa_v_only) {
        ir_value *k = r->k = input4(t, "k", B, HQ, T, HD);
        ir_value *v0 = input4(t, "v", B, 2, T, HD);
        kt = transpose(t, k, swap);
        vrep = r->v = repeat_kv(t, v0, 2);
    } else if (o->gpt2_k) {
        ir_value *k = r->k_src = input4(t, "k", B, T, HQ, HD);
        kt = transpose(t, k, gperm);
        vrep = r->v = input4(t, "v", B, HQ, T, HD);
    } else if (o->k_pretrans) {
        kt = r->k_src = input4(t, "kt", B, HQ, HD, T);
        vrep = r->v = input4(t, "v", B, HQ, T, HD);
    } else {
        ir_value *k = r->k = input4(t, "k", B, HQ, T, HD);
        kt = transpose(t, k, swap);
        vrep = r->v = input4(t, "v", B, HQ, T, HD);
    }
    if (o->scale == 2) {
        float c = powf((float)HD, -0.25f);
        q = op2(t, IR_OP_MUL, q, f32_scalar(t, c));
        kt = op2(t, IR_OP_MUL, f32_scalar(t, c), kt);
    }
    ir_value *s = op2(t, IR_OP_MATMUL, q, kt);
    if (o->scale == 0)
        s = op2(t, IR_OP_DIV, s, f32_scalar(t, sqrtf((float)HD)));
    else if (o->scale == 1)
        s = op2(t, IR_OP_MUL, s, f32_scalar(t, 1.0f / sqrtf((float)HD)));
    s = apply_mask(t, o, s);
    if (o->scale == 4)
        s = op2(t, IR_OP_DIV, s, f32_scalar(t, sqrtf((float)HD)));
    ir_node *sm = begin(t, IR_OP_SOFTMAX, 1, &s, 1);
    ir_attr_set_int(t->g, sm, "axis", -1);
    ir_value *p = end(t, sm);
    if (o->probs_out)
        add_output(t, p);
    ir_node *cast = begin(t, IR_OP_CAST, 1, &p, 1);
    ir_attr_set_int(t->g, cast, "to", IR_DT_FLOAT);
    p = end(t, cast);
    r->o = op2(t, IR_OP_MATMUL, p, vrep);
    const int64_t merge[4] = {0, 2, 1, 3};
    add_output(t, transpose(t, r->o, merge));
}

static ir_node *run_attn(const attn_opts *o, int expect, tg *t, attn_built *r)
{
    tg_init(t);
    build_attn(t, o, r);
    assert_int_equal(sbp_recognize_attention(t->g), IR_OK);
    assert_int_equal(count(t, IR_OP_ATTENTION), expect);
    ir_node *merge = t->g->outputs[t->g->n_outputs - 1]->producer;
    ir_node *a = merge->in[0]->producer;
    if (!expect) {
        assert_ptr_equal(merge->in[0], r->o);
        check_valid(t);
        return NULL;
    }
    assert_int_equal(a->op, IR_OP_ATTENTION);
    assert_ptr_equal(a->in[0], r->q);
    assert_ptr_equal(a->in[2], r->v);
    if (r->k) {
        assert_ptr_equal(a->in[1], r->k);
    } else {
        ir_node *tr = a->in[1]->producer;
        assert_non_null(tr);
        assert_int_equal(tr->op, IR_OP_TRANSPOSE);
        assert_ptr_equal(tr->in[0], r->k_src);
    }
    const ir_value *k = a->in[1];
    assert_int_equal(k->rank, 4);
    assert_int_equal(k->dims[2].value, T);
    assert_int_equal(k->dims[3].value, HD);
    assert_int_equal(ir_attr_int(a, "causal", 0), 1);
    assert_int_equal(ir_attr_int(a, "kv_heads", 0), k->dims[1].value);
    const double want = 1.0 / sqrt((double)HD);
    double scale = o->scale == 3 ? 1.0 : want;
    assert_true(fabs(ir_attr_float(a, "scale", 0) - scale) < 1e-6 * scale);
    for (int i = 0; i < 4; i++)
        assert_int_equal(a->out[0]->dims[i].value, r->q->dims[i].value);
    check_valid(t);
    return a;
}

static void attn_case(const attn_opts *o, int expect, int kv_heads)
{
    tg t;
    attn_built r;
    ir_node *a = run_attn(o, expect, &t, &r);
    if (a)
        assert_int_equal(ir_attr_int(a, "kv_heads", 0), kv_heads);
    tg_free(&t);
}

static void test_attn_mha_add(void **s) { (void)s; attn_case(&(attn_opts){0}, 1, HQ); }
static void test_attn_gqa(void **s) { (void)s; attn_case(&(attn_opts){.gqa = true}, 1, 2); }
static void test_attn_gqa_mul(void **s)
{
    (void)s;
    attn_case(&(attn_opts){.gqa = true, .scale = 1}, 1, 2);
}
static void test_attn_gpt2(void **s)
{
    (void)s;
    attn_case(&(attn_opts){.gpt2_k = true, .mask = 1}, 1, HQ);
}
static void test_attn_where_inverted(void **s) { (void)s; attn_case(&(attn_opts){.mask = 2}, 1, HQ); }
static void test_attn_qk_scaled(void **s) { (void)s; attn_case(&(attn_opts){.scale = 2}, 1, HQ); }
static void test_attn_no_scale(void **s) { (void)s; attn_case(&(attn_opts){.scale = 3}, 1, HQ); }
static void test_attn_scale_after_mask(void **s)
{
    (void)s;
    attn_case(&(attn_opts){.scale = 4, .mask = 1}, 1, HQ);
}
static void test_attn_k_pretransposed(void **s)
{
    (void)s;
    attn_case(&(attn_opts){.k_pretrans = true}, 1, HQ);
}
static void test_attn_gqa_v_only(void **s) { (void)s; attn_case(&(attn_opts){.gqa_v_only = true}, 1, HQ); }

/* near misses: left as ONNX ops, no diagnostic */
static void test_attn_padded(void **s)
{
    (void)s;
    attn_case(&(attn_opts){.bad = 1}, 0, 0);
    attn_case(&(attn_opts){.bad = 1, .mask = 1}, 0, 0);
}
static void test_attn_diag_masked(void **s)
{
    (void)s;
    attn_case(&(attn_opts){.bad = 2}, 0, 0);
    attn_case(&(attn_opts){.bad = 2, .mask = 2}, 0, 0);
}
static void test_attn_weak_fill(void **s) { (void)s; attn_case(&(attn_opts){.bad = 3, .mask = 1}, 0, 0); }
static void test_attn_mask_not_tt(void **s)
{
    (void)s;
    attn_case(&(attn_opts){.bad = 4}, 0, 0);
    attn_case(&(attn_opts){.bad = 4, .mask = 1}, 0, 0);
}
static void test_attn_probs_used(void **s) { (void)s; attn_case(&(attn_opts){.probs_out = true}, 0, 0); }

/* No mask at all: bidirectional attention is not causal Attention. */
static void test_attn_unmasked(void **s)
{
    (void)s;
    tg t;
    tg_init(&t);
    const int64_t swap[4] = {0, 1, 3, 2};
    ir_value *q = input4(&t, "q", B, HQ, T, HD), *k = input4(&t, "k", B, HQ, T, HD);
    ir_value *v = input4(&t, "v", B, HQ, T, HD);
    ir_value *sc = op2(&t, IR_OP_MATMUL, q, transpose(&t, k, swap));
    ir_node *sm = begin(&t, IR_OP_SOFTMAX, 1, &sc, 1);
    ir_attr_set_int(t.g, sm, "axis", -1);
    add_output(&t, op2(&t, IR_OP_MATMUL, end(&t, sm), v));
    assert_int_equal(sbp_recognize_attention(t.g), IR_OK);
    assert_int_equal(count(&t, IR_OP_ATTENTION), 0);
    check_valid(&t);
    tg_free(&t);
}

/* ---------------------------------------------------------------- windows, soft-capping, SDPA
 *
 * A second builder with the sequence length as a parameter: sliding-window masks (keys
 * i-w < j <= i) as folded constants, Gemma-2's logit soft-capping, the SDPA NaN guard, the
 * dynamo kT through [B*H, T, hd] and the repeat_kv forms. */

typedef struct win_opts {
    int64_t T;
    int64_t window;    /* 0: plain causal */
    int mask;          /* 0 additive, 1 Where(keep, s, fill), 2 Where(masked, fill, s) */
    int bad;           /* 0 none; 1 key i-w kept in row fi (one past the window); 2 key i-1
                          masked in row fi (inside the window); 3 every key kept (bidirectional);
                          4 the last row alone has window w+1; 5 batch 1 plain causal; 6 the
                          mask is a graph input */
    int64_t fi;        /* the row for bad 1 and 2 */
    float scale;       /* factor on q.k; 0: 1/sqrt(HD) */
    float softcap;     /* > 0: s -> cap * tanh(s / cap) */
    bool cap_after;    /* soft-capping after the mask (not Gemma-2's order) */
    bool nan_guard;    /* Where(IsNaN(p), 0, p) after the Softmax */
    int guard_bad;     /* 1: the guard's fill is 1, not 0; 2: IsNaN of another tensor */
    bool kt3d;         /* kT = Reshape(Transpose(Reshape(k, [B*H,T,hd]), [0,2,1]), [B,H,hd,T]) */
    int rep;           /* repeat_kv: 0 none (k, v [B,HQ,T,hd]); 1 Expand; 2 Tile; 3 Unsqueeze
                          alone (n_rep 1); 4 Tile along the heads axis (not repeat_kv) */
} win_opts;

static bool win_keep(const win_opts *o, int64_t b, int64_t i, int64_t j)
{
    const int64_t w = o->window;
    bool keep = j <= i && (w == 0 || i - j < w);
    switch (o->bad) {
    case 1:
        if (i == o->fi && j == i - w)
            keep = true;
        break;
    case 2:
        if (i == o->fi && j == i - 1)
            keep = false;
        break;
    case 3: keep = true; break;
    case 4:
        if (i == o->T - 1)
            keep = j <= i && i - j < w + 1;
        break;
    case 5:
        if (b == 1)
            keep = j <= i;
        break;
    default: break;
    }
    return keep;
}

/* The mask value [nb,1,T,T] (nb = 2 for bad 5), as the Add's or the Where's operand. */
static ir_value *win_mask(tg *t, const win_opts *o)
{
    const int64_t T_ = o->T, nb = o->bad == 5 ? B : 1;
    const int64_t d4[4] = {nb, 1, T_, T_};
    if (o->bad == 6) {
        ir_value *in = input4(t, "attention_mask", 1, 1, T_, T_);
        in->dtype = o->mask ? IR_DT_BOOL : IR_DT_FLOAT;
        return in;
    }
    float *add = malloc(sizeof(float) * (size_t)(nb * T_ * T_));
    uint8_t *cond = malloc((size_t)(nb * T_ * T_));
    for (int64_t b = 0; b < nb; b++)
        for (int64_t i = 0; i < T_; i++)
            for (int64_t j = 0; j < T_; j++) {
                const bool keep = win_keep(o, b, i, j);
                const size_t e = (size_t)((b * T_ + i) * T_ + j);
                add[e] = keep ? 0.0f : -FLT_MAX;
                cond[e] = o->mask == 2 ? !keep : keep;
            }
    ir_value *m = o->mask == 0 ? f32(t, 4, d4, add)
                               : ir_const_new(t->g, "m", IR_DT_BOOL, 4, d4, cond);
    free(add);
    free(cond);
    return m;
}

static ir_value *win_apply_mask(tg *t, const win_opts *o, ir_value *s, ir_value *m)
{
    if (o->mask == 0)
        return op2(t, IR_OP_ADD, s, m);
    ir_value *fill = f32_scalar(t, -FLT_MAX);
    ir_value *in[3] = {m, o->mask == 1 ? s : fill, o->mask == 1 ? fill : s};
    return end(t, begin(t, IR_OP_WHERE, 3, in, 1));
}

static ir_value *reshape(tg *t, ir_value *x, int n, const int64_t *shape)
{
    return op2(t, IR_OP_RESHAPE, x, ints(t, n, shape));
}

/* kv [B,hkv,T,HD] -> [B,hkv*n,T,HD] in one of the repeat_kv forms */
static ir_value *win_repeat(tg *t, const win_opts *o, ir_value *kv, int64_t n)
{
    const int64_t T_ = o->T, hkv = kv->dims[1].value;
    ir_value *in[2] = {kv, int1(t, 2)};
    ir_value *u = end(t, begin(t, IR_OP_UNSQUEEZE, 2, in, 1));
    ir_value *e = u;
    if (o->rep == 1) {
        const int64_t es[5] = {B, hkv, n, T_, HD};
        e = op2(t, IR_OP_EXPAND, u, ints(t, 5, es));
    } else if (o->rep == 2) {
        const int64_t reps[5] = {1, 1, n, 1, 1};
        e = op2(t, IR_OP_TILE, u, ints(t, 5, reps));
    } else if (o->rep == 4) {
        const int64_t reps[5] = {1, n, 1, 1, 1};
        e = op2(t, IR_OP_TILE, u, ints(t, 5, reps));
    }
    const int64_t rs[4] = {B, hkv * n, T_, HD};
    return reshape(t, e, 4, rs);
}

typedef struct win_built {
    ir_value *q, *k, *v; /* what Attention should read */
    ir_value *o;         /* the second MatMul's output */
    ir_node *softmax;
    int64_t kv_heads;
} win_built;

static void build_win(tg *t, const win_opts *o, win_built *r)
{
    memset(r, 0, sizeof *r);
    const int64_t T_ = o->T, swap[4] = {0, 1, 3, 2};
    const int64_t hkv = o->rep == 0 || o->rep == 3 ? HQ : 2, n = HQ / hkv;
    ir_value *q = r->q = input4(t, "q", B, HQ, T_, HD);
    ir_value *k0 = input4(t, "k", B, hkv, T_, HD), *v0 = input4(t, "v", B, hkv, T_, HD);
    ir_value *k = o->rep ? win_repeat(t, o, k0, n) : k0;
    ir_value *v = o->rep ? win_repeat(t, o, v0, n) : v0;
    /* repeat_kv is stripped (Attention reads the Hkv heads) unless it is not repeat_kv */
    const bool stripped = o->rep != 0 && o->rep != 4;
    r->k = stripped ? k0 : k;
    r->v = stripped ? v0 : v;
    r->kv_heads = stripped ? hkv : HQ;
    ir_value *kt;
    if (o->kt3d) {
        const int64_t d3[3] = {B * HQ, T_, HD}, d4[4] = {B, HQ, HD, T_}, p3[3] = {0, 2, 1};
        ir_value *z = reshape(t, k, 3, d3);
        ir_node *tn = begin(t, IR_OP_TRANSPOSE, 1, &z, 1);
        ir_attr_set_ints(t->g, tn, "perm", p3, 3);
        kt = reshape(t, end(t, tn), 4, d4);
    } else {
        kt = transpose(t, k, swap);
    }
    ir_value *s = op2(t, IR_OP_MATMUL, q, kt);
    s = op2(t, IR_OP_MUL, s, f32_scalar(t, o->scale > 0 ? o->scale : 1.0f / sqrtf((float)HD)));
    ir_value *m = win_mask(t, o);
    if (o->softcap > 0 && o->cap_after)
        s = win_apply_mask(t, o, s, m);
    if (o->softcap > 0) {
        s = op2(t, IR_OP_DIV, s, f32_scalar(t, o->softcap));
        s = op1(t, IR_OP_TANH, s);
        s = op2(t, IR_OP_MUL, s, f32_scalar(t, o->softcap));
    }
    if (!(o->softcap > 0 && o->cap_after))
        s = win_apply_mask(t, o, s, m);
    ir_node *sm = r->softmax = begin(t, IR_OP_SOFTMAX, 1, &s, 1);
    ir_attr_set_int(t->g, sm, "axis", -1);
    ir_value *p = end(t, sm);
    if (o->nan_guard) {
        ir_value *isn = op1(t, IR_OP_IS_NAN, o->guard_bad == 2 ? s : p);
        ir_value *in[3] = {isn, f32_scalar(t, o->guard_bad == 1 ? 1.0f : 0.0f), p};
        p = end(t, begin(t, IR_OP_WHERE, 3, in, 1));
    }
    r->o = op2(t, IR_OP_MATMUL, p, v);
    const int64_t merge[4] = {0, 2, 1, 3};
    add_output(t, transpose(t, r->o, merge));
}

/* The one "is not recognised" warning, on the Softmax; NULL if there is none. */
static const ir_diag_entry *attn_warning(const tg *t)
{
    const ir_diag_entry *w = NULL;
    for (int i = 0; i < t->d.n; i++)
        if (t->d.entries[i].msg && strstr(t->d.entries[i].msg, "is not recognised")) {
            assert_null(w);
            w = &t->d.entries[i];
        }
    return w;
}

/* Builds, recognises, checks. expect: 1 Attention with the given window (0: none) and the
 * options' scale/softcap/kv_heads; 0 none, the MatMul left alone. */
static void win_case(const win_opts *o, int expect, int64_t window)
{
    tg t;
    win_built r;
    tg_init(&t);
    build_win(&t, o, &r);
    assert_int_equal(sbp_recognize_attention(t.g), IR_OK);
    assert_int_equal(count(&t, IR_OP_ATTENTION), expect);
    ir_node *merge = t.g->outputs[t.g->n_outputs - 1]->producer;
    if (!expect) {
        assert_ptr_equal(merge->in[0], r.o);
        assert_int_equal(r.o->producer->op, IR_OP_MATMUL);
        check_valid(&t);
        tg_free(&t);
        return;
    }
    ir_node *a = merge->in[0]->producer;
    assert_int_equal(a->op, IR_OP_ATTENTION);
    assert_ptr_equal(a->in[0], r.q);
    assert_ptr_equal(a->in[1], r.k);
    assert_ptr_equal(a->in[2], r.v);
    assert_int_equal(ir_attr_int(a, "causal", 0), 1);
    assert_int_equal(ir_attr_int(a, "kv_heads", 0), r.kv_heads);
    assert_int_equal(ir_attr_int(a, "window", -1), window ? window : -1); /* absent when 0 */
    const double scale = o->scale > 0 ? (double)o->scale : (double)(1.0f / sqrtf((float)HD));
    assert_true(fabs(ir_attr_float(a, "scale", 0) - scale) < 1e-6 * scale);
    if (o->softcap > 0)
        assert_true(ir_attr_float(a, "softcap", 0) == (double)o->softcap);
    else
        assert_true(ir_attr_float(a, "softcap", -1) == -1);
    assert_null(attn_warning(&t));
    assert_null(t.g->refusals);
    check_valid(&t);
    tg_free(&t);
}

/* A not-recognised case must say why, on the Softmax, as a warning naming the mask, and record
 * it as data (g->refusals: the reason, the Softmax, both MatMuls) for the training program's
 * builder, which names the cause from there. */
static void win_case_warns(const win_opts *o, const char *why)
{
    tg t;
    win_built r;
    tg_init(&t);
    build_win(&t, o, &r);
    assert_int_equal(sbp_recognize_attention(t.g), IR_OK);
    assert_int_equal(count(&t, IR_OP_ATTENTION), 0);
    const ir_diag_entry *w = attn_warning(&t);
    assert_non_null(w);
    assert_int_equal(w->sev, IR_SEV_WARNING);
    assert_string_equal(w->op, "Softmax");
    assert_string_equal(w->node, r.softmax->name);
    assert_non_null(strstr(w->msg, why));
    const ir_refusal *ref = t.g->refusals;
    assert_non_null(ref);
    assert_null(ref->next); /* one */
    assert_int_equal(ref->reason, o->bad == 6 ? IR_REFUSED_ATTENTION_MASK_INPUT
                                              : IR_REFUSED_ATTENTION_MASK_CONSTANT);
    assert_ptr_equal(ref->at, r.softmax);
    assert_non_null(ref->also[0]);
    assert_int_equal(ref->also[0]->op, IR_OP_MATMUL); /* the scores */
    assert_ptr_equal(ref->also[1], r.o->producer);    /* the output */
    assert_string_equal(ref->msg, w->msg);
    assert_int_equal(t.d.n_errors, 0);
    check_valid(&t);
    tg_free(&t);
}

/* Sliding windows as folded constants: w read off the last row and checked everywhere; a
 * window that is not a multiple of any tile size, one that is, w = 1 (the diagonal alone),
 * w = T-1; w >= T is plain causal (no window attr). */
static void test_attn_window(void **s)
{
    (void)s;
    for (int mask = 0; mask < 3; mask++) {
        win_case(&(win_opts){.T = 100, .window = 37, .mask = mask}, 1, 37);
        win_case(&(win_opts){.T = 100, .window = 1, .mask = mask}, 1, 1);
        win_case(&(win_opts){.T = 100, .window = 99, .mask = mask}, 1, 99);
        win_case(&(win_opts){.T = 100, .window = 100, .mask = mask}, 1, 0);
        win_case(&(win_opts){.T = 100, .window = 150, .mask = mask}, 1, 0);
    }
    win_case(&(win_opts){.T = 130, .window = 64}, 1, 64);
    win_case(&(win_opts){.T = 130, .window = 65, .rep = 1}, 1, 65);
    win_case(&(win_opts){.T = 1, .window = 0}, 1, 0);
    win_case(&(win_opts){.T = 2, .window = 1}, 1, 1);
}

/* Near misses: one element off the window (either side, first, middle and last rows), the last
 * row alone different (where w is read), batch 1 plain causal: unrecognised, with the warning. */
static void test_attn_window_off_by_one(void **s)
{
    (void)s;
    const char *why = "computed from constants but neither causal nor a causal sliding window";
    for (int mask = 0; mask < 3; mask++) {
        win_case_warns(&(win_opts){.T = 100, .window = 37, .mask = mask, .bad = 1, .fi = 50}, why);
        win_case_warns(&(win_opts){.T = 100, .window = 37, .mask = mask, .bad = 1, .fi = 37}, why);
        win_case_warns(&(win_opts){.T = 100, .window = 37, .mask = mask, .bad = 1, .fi = 99}, why);
        win_case_warns(&(win_opts){.T = 100, .window = 37, .mask = mask, .bad = 2, .fi = 1}, why);
        win_case_warns(&(win_opts){.T = 100, .window = 37, .mask = mask, .bad = 2, .fi = 99}, why);
        win_case_warns(&(win_opts){.T = 100, .window = 37, .mask = mask, .bad = 4}, why);
        win_case_warns(&(win_opts){.T = 100, .window = 37, .mask = mask, .bad = 5}, why);
    }
    /* a plain causal mask with one key past the diagonal's reach re-opened is no window */
    win_case_warns(&(win_opts){.T = 40, .window = 0, .bad = 2, .fi = 20}, why);
}

/* A bidirectional ("full") mask and a mask that is a graph input: not causal Attention, and
 * the warning on the Softmax says which. */
static void test_attn_not_causal_warns(void **s)
{
    (void)s;
    const char *why = "computed from constants but neither causal nor a causal sliding window";
    for (int mask = 0; mask < 3; mask++)
        win_case_warns(&(win_opts){.T = 16, .mask = mask, .bad = 3}, why);
    win_case_warns(&(win_opts){.T = 16, .mask = 1, .bad = 6}, "computed from the model's inputs");
    win_case_warns(&(win_opts){.T = 16, .mask = 2, .bad = 6}, "computed from the model's inputs");
    /* an additive mask from the inputs (padding): Add(scores, input) is followed along the
     * scores, so the attention is matched and then refused with the warning */
    win_case_warns(&(win_opts){.T = 16, .mask = 0, .bad = 6}, "computed from the model's inputs");
}

/* Two layers sharing one window mask (the memo must carry the window to the second), and a
 * causal layer next to a window layer (each its own). */
static void test_attn_window_shared(void **s)
{
    (void)s;
    const int64_t T_ = 48, swap[4] = {0, 1, 3, 2};
    for (int shared = 0; shared < 2; shared++) {
        tg t;
        tg_init(&t);
        ir_value *m[2];
        m[0] = win_mask(&t, &(win_opts){.T = T_, .window = 5});
        m[1] = shared ? m[0] : win_mask(&t, &(win_opts){.T = T_});
        ir_value *x = input4(&t, "x", B, HQ, T_, HD);
        ir_value *outs[2];
        for (int l = 0; l < 2; l++) {
            ir_value *sc = op2(&t, IR_OP_MATMUL, x, transpose(&t, x, swap));
            sc = op2(&t, IR_OP_ADD, sc, m[l]);
            ir_node *sm = begin(&t, IR_OP_SOFTMAX, 1, &sc, 1);
            ir_attr_set_int(t.g, sm, "axis", -1);
            x = outs[l] = op2(&t, IR_OP_MATMUL, end(&t, sm), x);
        }
        add_output(&t, op1(&t, IR_OP_RELU, x));
        assert_int_equal(sbp_recognize_attention(t.g), IR_OK);
        assert_int_equal(count(&t, IR_OP_ATTENTION), 2);
        assert_int_equal(outs[0]->producer->op, IR_OP_ATTENTION);
        assert_int_equal(outs[1]->producer->op, IR_OP_ATTENTION);
        assert_int_equal(ir_attr_int(outs[0]->producer, "window", 0), 5);
        assert_int_equal(ir_attr_int(outs[1]->producer, "window", 0), shared ? 5 : 0);
        check_valid(&t);
        tg_free(&t);
    }
}

/* Gemma-2: MatMul -> Mul(scale) -> Div(cap) -> Tanh -> Mul(cap) -> mask -> Softmax -> MatMul:
 * softcap = cap, scale = (scale / cap) * cap; with a window too (Gemma-2's local layers). */
static void test_attn_softcap(void **s)
{
    (void)s;
    for (int mask = 0; mask < 3; mask++)
        win_case(&(win_opts){.T = 12, .mask = mask, .scale = 0.0625f, .softcap = 50.0f}, 1, 0);
    win_case(&(win_opts){.T = 12, .scale = 0.25f, .softcap = 30.0f, .rep = 1}, 1, 0);
    win_case(&(win_opts){.T = 40, .window = 7, .scale = 0.0625f, .softcap = 50.0f, .rep = 1,
                         .nan_guard = true},
             1, 7);
}

/* The mask added before the soft-capping: masked scores come out of the tanh at -cap, not
 * <= -1e4, so the masked keys are not masked: not causal attention. */
static void test_attn_softcap_mask_first(void **s)
{
    (void)s;
    for (int mask = 0; mask < 3; mask++)
        win_case(&(win_opts){.T = 12, .mask = mask, .softcap = 50.0f, .cap_after = true}, 0, 0);
}

/* The SDPA NaN guard Where(IsNaN(p), 0, p) is absorbed; with a fill other than 0, or IsNaN of
 * something else, it is not the guard and nothing is recognised. */
static void test_attn_nan_guard(void **s)
{
    (void)s;
    for (int mask = 0; mask < 3; mask++)
        win_case(&(win_opts){.T = 10, .mask = mask, .nan_guard = true}, 1, 0);
    win_case(&(win_opts){.T = 10, .nan_guard = true, .rep = 2, .kt3d = true}, 1, 0);
    win_case(&(win_opts){.T = 10, .nan_guard = true, .guard_bad = 1}, 0, 0);
    win_case(&(win_opts){.T = 10, .nan_guard = true, .guard_bad = 2}, 0, 0);
}

/* The dynamo exporter's kT through [B*H, T, hd]: Attention reads k itself (no Transpose). */
static void test_attn_kt_3d(void **s)
{
    (void)s;
    win_case(&(win_opts){.T = 10, .kt3d = true}, 1, 0);
    win_case(&(win_opts){.T = 10, .kt3d = true, .mask = 2}, 1, 0);
    win_case(&(win_opts){.T = 10, .kt3d = true, .rep = 1}, 1, 0);
}

/* repeat_kv through Expand, through Tile(.., [1,1,n,1,1]), and as Reshape(Unsqueeze(kv)) when
 * n_rep == 1: stripped, kv_heads = Hkv. Tile along the heads axis ([1,n,1,1,1]) orders the
 * heads differently: not stripped, kv_heads = Hq reading the Reshape. */
static void test_attn_repeat_kv_forms(void **s)
{
    (void)s;
    win_case(&(win_opts){.T = 10, .rep = 1}, 1, 0);
    win_case(&(win_opts){.T = 10, .rep = 2}, 1, 0);
    win_case(&(win_opts){.T = 10, .rep = 3}, 1, 0);
    win_case(&(win_opts){.T = 10, .rep = 4}, 1, 0);
    win_case(&(win_opts){.T = 10, .rep = 2, .mask = 1, .window = 3}, 1, 3);
}

/* ---------------------------------------------------------------- the fixture exports */

#ifdef SBP_FIXTURES_DIR
/* Every fixture through bind-dims, fold, dce and the recognisers up to attention (the later
 * ones are another file's business): two Attentions, and for llama/qwen3 four Ropes, with the
 * expected kv_heads and scale 1/sqrt(hd), and no Softmax left over. */
static void fixture_case(const char *file, int64_t seq)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.onnx", SBP_FIXTURES_DIR, file);
    ir_diag d;
    ir_diag_init(&d, path);
    ir_graph *g = ir_import_onnx(path, &d, &(ir_import_options){0});
    if (!g)
        ir_diag_print(&d, stderr, "test");
    assert_non_null(g);
    int (*const steps[])(ir_graph *) = {sbp_pass_fold, sbp_pass_dce, sbp_recognize_norms,
                                        sbp_pass_dce, sbp_recognize_activations, sbp_pass_dce,
                                        sbp_recognize_rope, sbp_pass_dce, sbp_recognize_attention,
                                        sbp_pass_dce};
    assert_int_equal(sbp_pass_bind_dims(g, 2, seq), IR_OK);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
        assert_int_equal(steps[i](g), IR_OK);
    assert_int_equal(ir_graph_toposort(g), IR_OK);
    if (ir_verify(g) != IR_OK || d.n_errors)
        ir_diag_print(&d, stderr, "test");
    assert_int_equal(d.n_errors, 0);
    const bool gpt2 = strncmp(file, "gpt2", 4) == 0;
    assert_int_equal(ir_graph_count_op(g, IR_OP_ATTENTION), 2);
    assert_int_equal(ir_graph_count_op(g, IR_OP_ROPE), gpt2 ? 0 : 4);
    assert_int_equal(ir_graph_count_op(g, IR_OP_SOFTMAX), 0);
    for (int i = 0; i < g->n_nodes; i++) {
        const ir_node *n = g->nodes[i];
        if (n->op == IR_OP_ATTENTION) {
            const ir_value *q = n->in[0], *k = n->in[1], *v = n->in[2];
            assert_int_equal(q->dims[2].value, seq);
            assert_int_equal(ir_attr_int(n, "kv_heads", 0), gpt2 ? q->dims[1].value : 2);
            assert_int_equal(k->dims[1].value, ir_attr_int(n, "kv_heads", 0));
            assert_int_equal(v->dims[1].value, ir_attr_int(n, "kv_heads", 0));
            double want = 1.0 / sqrt((double)q->dims[3].value);
            assert_true(fabs(ir_attr_float(n, "scale", 0) - want) < 1e-6 * want);
            if (!gpt2) {
                assert_int_equal(q->producer->op, IR_OP_ROPE);
                assert_int_equal(k->producer->op, IR_OP_ROPE);
            }
        } else if (n->op == IR_OP_ROPE) {
            assert_int_equal(n->in[1]->dims[0].value, seq);
            assert_true(ir_value_is_const(n->in[1]) && ir_value_is_const(n->in[2]));
        }
    }
    ir_graph_free(g);
    ir_diag_free(&d);
}

static const char *const fixtures[] = {
    "gpt2_op14_dyn",   "gpt2_op14_static", "gpt2_op17_dyn",  "gpt2_op17_dyn_nofold",
    "gpt2_op17_static", "llama_op17_dyn",  "llama_op17_loss", "llama_op17_static",
    "qwen3_op17_dyn",  "qwen3_op17_static",
};

static void test_fixtures(void **s)
{
    (void)s;
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        fixture_case(fixtures[i], 64);
        if (strstr(fixtures[i], "dyn")) {
            fixture_case(fixtures[i], 17);
            fixture_case(fixtures[i], 1);
        }
    }
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_basic),
        cmocka_unit_test(test_rope_swapped),
        cmocka_unit_test(test_rope_split),
        cmocka_unit_test(test_rope_cos2d),
        cmocka_unit_test(test_rope_batch_same),
        cmocka_unit_test(test_rope_batch_differs),
        cmocka_unit_test(test_rope_bad_halves),
        cmocka_unit_test(test_rope_leak),
        cmocka_unit_test(test_rope_shared_tables),
        cmocka_unit_test(test_attn_mha_add),
        cmocka_unit_test(test_attn_gqa),
        cmocka_unit_test(test_attn_gqa_mul),
        cmocka_unit_test(test_attn_gpt2),
        cmocka_unit_test(test_attn_where_inverted),
        cmocka_unit_test(test_attn_qk_scaled),
        cmocka_unit_test(test_attn_no_scale),
        cmocka_unit_test(test_attn_scale_after_mask),
        cmocka_unit_test(test_attn_k_pretransposed),
        cmocka_unit_test(test_attn_gqa_v_only),
        cmocka_unit_test(test_attn_padded),
        cmocka_unit_test(test_attn_diag_masked),
        cmocka_unit_test(test_attn_weak_fill),
        cmocka_unit_test(test_attn_mask_not_tt),
        cmocka_unit_test(test_attn_probs_used),
        cmocka_unit_test(test_attn_unmasked),
        cmocka_unit_test(test_attn_window),
        cmocka_unit_test(test_attn_window_off_by_one),
        cmocka_unit_test(test_attn_not_causal_warns),
        cmocka_unit_test(test_attn_window_shared),
        cmocka_unit_test(test_attn_softcap),
        cmocka_unit_test(test_attn_softcap_mask_first),
        cmocka_unit_test(test_attn_nan_guard),
        cmocka_unit_test(test_attn_kt_3d),
        cmocka_unit_test(test_attn_repeat_kv_forms),
#ifdef SBP_FIXTURES_DIR
        cmocka_unit_test(test_fixtures),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
