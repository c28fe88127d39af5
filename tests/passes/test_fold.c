/* test_fold.c — constant folding (passes/graph/fold.c): the exporters' shape arithmetic folded
 * away after binding, each evaluator against hand-computed values, float32 math done in float,
 * integer division and Mod semantics, the bypasses, and what must not fold (parameters, results
 * above the size cap). */
#include "pass_test.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

static const float *f32d(const ir_value *v) { return (const float *)v->data; }

static void assert_i64s(const ir_value *v, int n, const int64_t *want)
{
    assert_true(ir_value_is_const(v));
    assert_int_equal(ir_value_numel(v), n);
    for (int i = 0; i < n; i++)
        assert_int_equal(ir_const_i64(v, i), want[i]);
}

static void assert_f32s(const ir_value *v, int n, const float *want)
{
    assert_true(ir_value_is_const(v));
    assert_int_equal(v->dtype, IR_DT_FLOAT);
    assert_int_equal(ir_value_numel(v), n);
    for (int i = 0; i < n; i++)
        assert_memory_equal(&f32d(v)[i], &want[i], sizeof(float)); /* bitwise */
}

static int count_live(const ir_graph *g)
{
    int c = 0;
    for (int i = 0; i < g->n_nodes; i++)
        c += !g->nodes[i]->dead;
    return c;
}

/* GPT-2's split_heads as TorchScript exports it with dynamic axes:
 *   Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), Unsqueeze(Gather(Shape(x), 1)), [4, 8]))
 * After bind_dims(2, 64) the whole chain folds and only the Reshape remains, fully typed. */
static void test_shape_chain(void **state)
{
    (void)state;
    tgraph *t = tg_new(14);
    ir_graph *g = t->g;
    ir_value *ids = val(g, IR_VAL_INPUT, "input_ids", IR_DT_INT64, "batch,sequence");
    ir_value *wte = val(g, IR_VAL_PARAM, "wte", IR_DT_FLOAT, "64,32");
    ir_node *emb = NODE(g, IR_OP_GATHER, "emb", 1, wte, ids);
    ir_value *x = emb->out[0];
    ir_node *sh = NODE(g, IR_OP_SHAPE, "/Shape", 1, x);
    ir_node *g0 = NODE(g, IR_OP_GATHER, "/Gather0", 1, sh->out[0], si64(g, "c0", 0));
    ir_node *g1 = NODE(g, IR_OP_GATHER, "/Gather1", 1, sh->out[0], si64(g, "c1", 1));
    ir_node *u0 =
        NODE(g, IR_OP_UNSQUEEZE, "/Unsq0", 1, g0->out[0], ci64(g, "ax0", 1, (int64_t[]){0}));
    ir_node *u1 =
        NODE(g, IR_OP_UNSQUEEZE, "/Unsq1", 1, g1->out[0], ci64(g, "ax0b", 1, (int64_t[]){0}));
    ir_node *cat = NODE(g, IR_OP_CONCAT, "/Concat", 1, u0->out[0], u1->out[0],
                        ci64(g, "heads", 2, (int64_t[]){4, 8}));
    ir_attr_set_int(g, cat, "axis", 0);
    ir_node *rs = NODE(g, IR_OP_RESHAPE, "/Reshape", 1, x, cat->out[0]);
    add_output(g, rs->out[0]);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(x, "f32[batch,sequence,32]");
    assert_type(rs->out[0], "f32[?,?,?,?]");

    assert_int_equal(sbp_pass_bind_dims(g, 2, 64), IR_OK);
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_int_equal(sbp_pass_dce(g), IR_OK);
    assert_int_equal(g->n_nodes, 2);
    assert_int_equal(ir_graph_count_op(g, IR_OP_RESHAPE), 1);
    assert_int_equal(ir_graph_count_op(g, IR_OP_GATHER), 1); /* the embedding, not shape math */
    assert_i64s(cat->out[0], 4, (int64_t[]){2, 64, 4, 8});
    assert_string_equal(rs->in[1]->name, "/Concat_out0"); /* the folded value keeps its name */
    assert_type(rs->out[0], "f32[2,64,4,8]");
    assert_int_equal(ir_verify(g), IR_OK);
    tg_free(t);
}

/* Shape of a value whose shape is known folds even though its data is not constant. */
static void test_shape_of_known_shape(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,64,32");
    ir_node *sh = NODE(g, IR_OP_SHAPE, "shape", 1, x);
    ir_attr_set_int(g, sh, "start", 1);
    ir_node *sz = NODE(g, IR_OP_SIZE, "size", 1, x);
    ir_value *y = val(g, IR_VAL_INPUT, "y", IR_DT_FLOAT, "batch,64");
    ir_node *sy = NODE(g, IR_OP_SHAPE, "shape_sym", 1, y);
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_i64s(sh->out[0], 2, (int64_t[]){64, 32});
    assert_i64s(sz->out[0], 1, (int64_t[]){4096});
    assert_int_equal(sz->out[0]->rank, 0);
    assert_false(ir_value_is_const(sy->out[0])); /* batch unbound: stays */
    assert_int_equal(g->n_nodes, 1);
    tg_free(t);
}

static void test_range(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_node *r1 = NODE(g, IR_OP_RANGE, "r1", 1, si64(g, "a", 0), si64(g, "b", 10), si64(g, "c", 3));
    ir_node *r2 =
        NODE(g, IR_OP_RANGE, "r2", 1, si64(g, "d", 10), si64(g, "e", 0), si64(g, "f", -3));
    ir_node *r3 =
        NODE(g, IR_OP_RANGE, "r3", 1, sf32(g, "g0", 0), sf32(g, "g1", 1), sf32(g, "gd", 0.1f));
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_i64s(r1->out[0], 4, (int64_t[]){0, 3, 6, 9});
    assert_i64s(r2->out[0], 4, (int64_t[]){10, 7, 4, 1});
    /* float Range is repeated float addition, as the ONNX definition (and ORT) computes it */
    float want[10], v = 0.0f;
    for (int i = 0; i < 10; i++, v += 0.1f)
        want[i] = v;
    assert_f32s(r3->out[0], 10, want);
    tg_free(t);
}

/* Llama's additive causal mask: triu(full((T, T), finfo.min), 1) expanded to [B, 1, T, T]. */
static void test_trilu_expand_mask(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    const float mn = -3.4028234663852886e38f;
    ir_node *full =
        NODE(g, IR_OP_CONSTANT_OF_SHAPE, "full", 1, ci64(g, "tt", 2, (int64_t[]){4, 4}));
    set_tensor_attr(g, full, "value", ir_const_new(g, "minv", IR_DT_FLOAT, 1, (int64_t[]){1}, &mn));
    ir_node *tri = NODE(g, IR_OP_TRILU, "triu", 1, full->out[0], si64(g, "k1", 1));
    ir_node *tril = NODE(g, IR_OP_TRILU, "tril", 1, full->out[0], si64(g, "km1", -1));
    ir_attr_set_int(g, tril, "upper", 0);
    ir_node *u =
        NODE(g, IR_OP_UNSQUEEZE, "u", 1, tri->out[0], ci64(g, "ax01", 2, (int64_t[]){0, 1}));
    ir_node *ex =
        NODE(g, IR_OP_EXPAND, "expand", 1, u->out[0], ci64(g, "shp", 4, (int64_t[]){2, 1, 1, 4}));
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_int_equal(g->n_nodes, 0);
    float want[16], wantl[16];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            want[i * 4 + j] = j - i >= 1 ? mn : 0.0f;
            wantl[i * 4 + j] = j - i <= -1 ? mn : 0.0f;
        }
    assert_f32s(tri->out[0], 16, want);
    assert_f32s(tril->out[0], 16, wantl);
    assert_type(ex->out[0], "f32[2,1,4,4]");
    float want2[32];
    memcpy(want2, want, sizeof want);
    memcpy(want2 + 16, want, sizeof want);
    assert_f32s(ex->out[0], 32, want2);
    tg_free(t);
}

static void test_where_compare(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    /* Where(Equal(shape, -1), ones, shape): the exporter's expand(-1) fix-up */
    ir_value *shp = ci64(g, "shp", 3, (int64_t[]){2, -1, 8});
    ir_node *eq = NODE(g, IR_OP_EQUAL, "eq", 1, shp, si64(g, "m1", -1));
    ir_node *w =
        NODE(g, IR_OP_WHERE, "where", 1, eq->out[0], ci64(g, "ones", 3, (int64_t[]){1, 1, 1}), shp);
    ir_node *lt = NODE(g, IR_OP_LESS, "lt", 1, ci64(g, "a", 3, (int64_t[]){INT64_MAX, -5, 0}),
                       ci64(g, "b", 3, (int64_t[]){INT64_MAX - 1, 3, 0}));
    ir_node *no = NODE(g, IR_OP_NOT, "not", 1, lt->out[0]);
    ir_node *an = NODE(g, IR_OP_AND, "and", 1, lt->out[0], no->out[0]);
    ir_node *ge = NODE(g, IR_OP_GREATER_OR_EQUAL, "ge", 1, ci64(g, "c", 3, (int64_t[]){1, 2, 3}),
                       si64(g, "two", 2));
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_int_equal(eq->out[0]->dtype, IR_DT_BOOL);
    assert_i64s(eq->out[0], 3, (int64_t[]){0, 1, 0});
    assert_i64s(w->out[0], 3, (int64_t[]){2, 1, 8});
    assert_i64s(lt->out[0], 3, (int64_t[]){0, 1, 0});
    assert_i64s(no->out[0], 3, (int64_t[]){1, 0, 1});
    assert_i64s(an->out[0], 3, (int64_t[]){0, 0, 0});
    assert_i64s(ge->out[0], 3, (int64_t[]){0, 1, 1});
    tg_free(t);
}

static void test_slice_values(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    int64_t d10[10];
    for (int i = 0; i < 10; i++)
        d10[i] = i;
    ir_value *x = ci64(g, "x", 10, d10);
    ir_value *imax = ci64(g, "imax", 1, (int64_t[]){INT64_MAX});
    ir_value *imin = ci64(g, "imin", 1, (int64_t[]){INT64_MIN});
    ir_node *s1 = NODE(g, IR_OP_SLICE, "tail", 1, x, ci64(g, "m3", 1, (int64_t[]){-3}), imax);
    ir_node *s2 = NODE(g, IR_OP_SLICE, "rev", 1, x, ci64(g, "m1", 1, (int64_t[]){-1}), imin,
                       ci64(g, "ax0", 1, (int64_t[]){0}), ci64(g, "sm1", 1, (int64_t[]){-1}));
    ir_node *s3 = NODE(g, IR_OP_SLICE, "neg_end", 1, x, ci64(g, "s2", 1, (int64_t[]){2}),
                       ci64(g, "em2", 1, (int64_t[]){-2}));
    ir_node *s4 = NODE(g, IR_OP_SLICE, "rev_step2", 1, x, ci64(g, "s8", 1, (int64_t[]){8}),
                       ci64(g, "e1", 1, (int64_t[]){1}), ci64(g, "ax0b", 1, (int64_t[]){0}),
                       ci64(g, "sm2", 1, (int64_t[]){-2}));
    /* 2-D: m[1:, ::2] of a 3x4 float matrix */
    float m[12];
    for (int i = 0; i < 12; i++)
        m[i] = (float)i;
    ir_value *mv = ir_const_new(g, "m", IR_DT_FLOAT, 2, (int64_t[]){3, 4}, m);
    ir_node *s5 = NODE(g, IR_OP_SLICE, "s2d", 1, mv, ci64(g, "st", 2, (int64_t[]){1, 0}),
                       ci64(g, "en", 2, (int64_t[]){INT64_MAX, INT64_MAX}),
                       ci64(g, "axs", 2, (int64_t[]){0, -1}), ci64(g, "sts", 2, (int64_t[]){1, 2}));
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_i64s(s1->out[0], 3, (int64_t[]){7, 8, 9});
    assert_i64s(s2->out[0], 10, (int64_t[]){9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
    assert_i64s(s3->out[0], 6, (int64_t[]){2, 3, 4, 5, 6, 7});
    assert_i64s(s4->out[0], 4, (int64_t[]){8, 6, 4, 2});
    assert_type(s5->out[0], "f32[2,2]");
    assert_f32s(s5->out[0], 4, (float[]){4, 6, 8, 10});
    tg_free(t);
}

static void test_integer_arith(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *a = ci64(g, "a", 4, (int64_t[]){-7, 7, -7, 7});
    ir_value *b = ci64(g, "b", 4, (int64_t[]){2, -2, -2, 2});
    ir_value *c = ci64(g, "c", 4, (int64_t[]){3, -3, -3, 3});
    ir_node *dv = NODE(g, IR_OP_DIV, "div", 1, a, b);
    ir_node *md = NODE(g, IR_OP_MOD, "mod", 1, a, c);
    ir_node *fm = NODE(g, IR_OP_MOD, "fmod", 1, a, c);
    ir_attr_set_int(g, fm, "fmod", 1);
    ir_node *mx = NODE(g, IR_OP_MAX, "max", 1, a, b, si64(g, "z", 0));
    ir_node *pw =
        NODE(g, IR_OP_POW, "pow", 1, ci64(g, "pb", 3, (int64_t[]){2, 3, -2}), si64(g, "e3", 3));
    ir_node *sub = NODE(g, IR_OP_SUB, "sub", 1, si64(g, "s10", 10), a);
    int32_t i32[2] = {INT32_MAX, -3};
    ir_value *v32 = ir_const_new(g, "v32", IR_DT_INT32, 1, (int64_t[]){2}, i32);
    ir_node *add32 = NODE(g, IR_OP_ADD, "add32", 1, v32,
                          ir_const_new(g, "one32", IR_DT_INT32, 0, NULL, (int32_t[]){1}));
    ir_node *dz = NODE(g, IR_OP_DIV, "div0", 1, a, si64(g, "zero", 0));
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_i64s(dv->out[0], 4, (int64_t[]){-3, -3, 3, 3}); /* truncation toward zero */
    assert_i64s(md->out[0], 4, (int64_t[]){2, -2, -1, 1}); /* sign of the divisor */
    assert_i64s(fm->out[0], 4, (int64_t[]){-1, 1, -1, 1}); /* sign of the dividend */
    assert_i64s(mx->out[0], 4, (int64_t[]){2, 7, 0, 7});
    assert_i64s(pw->out[0], 3, (int64_t[]){8, 27, -8});
    assert_i64s(sub->out[0], 4, (int64_t[]){17, 3, 17, 3});
    assert_int_equal(add32->out[0]->dtype, IR_DT_INT32);
    assert_i64s(add32->out[0], 2, (int64_t[]){INT32_MIN, -2}); /* wraps like int32 */
    assert_false(ir_value_is_const(dz->out[0]));               /* division by zero stays */
    assert_true(diag_has(&t->diag, "div0", "division by zero", NULL));
    assert_int_equal(t->diag.n_errors, 0);
    tg_free(t);
}

/* float32 results are what float arithmetic gives, bit for bit. */
static void test_float_math(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_node *dv = NODE(g, IR_OP_DIV, "div", 1, sf32(g, "one", 1.0f), sf32(g, "three", 3.0f));
    ir_node *sq = NODE(g, IR_OP_SQRT, "sqrt", 1, sf32(g, "eight", 8.0f));
    ir_node *pw =
        NODE(g, IR_OP_POW, "pow", 1, sf32(g, "base", 10000.0f),
             ir_const_new(g, "ex", IR_DT_FLOAT, 1, (int64_t[]){2}, (float[]){0.0f, 0.25f}));
    ir_node *rc = NODE(g, IR_OP_RECIPROCAL, "recip", 1, pw->out[0]);
    ir_node *ex = NODE(g, IR_OP_EXP, "exp", 1, sf32(g, "half", 0.5f));
    ir_node *sg = NODE(g, IR_OP_SIGMOID, "sig", 1, sf32(g, "two", 2.0f));
    ir_node *ng = NODE(g, IR_OP_NEG, "neg", 1, sf32(g, "x", 1.5f));
    ir_node *er = NODE(g, IR_OP_ERF, "erf", 1, sf32(g, "y", 0.3f));
    ir_node *mdf = NODE(g, IR_OP_MOD, "fmodf", 1, sf32(g, "m5", -5.5f), sf32(g, "m2", 2.0f));
    ir_attr_set_int(g, mdf, "fmod", 1);
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    volatile float one = 1.0f, three = 3.0f;
    assert_f32s(dv->out[0], 1, (float[]){one / three});
    assert_f32s(sq->out[0], 1, (float[]){sqrtf(8.0f)});
    assert_f32s(pw->out[0], 2, (float[]){1.0f, powf(10000.0f, 0.25f)});
    assert_f32s(rc->out[0], 2, (float[]){1.0f, 1.0f / powf(10000.0f, 0.25f)});
    assert_f32s(ex->out[0], 1, (float[]){expf(0.5f)});
    assert_f32s(sg->out[0], 1, (float[]){1.0f / (1.0f + expf(-2.0f))});
    assert_f32s(ng->out[0], 1, (float[]){-1.5f});
    assert_f32s(er->out[0], 1, (float[]){erff(0.3f)});
    assert_f32s(mdf->out[0], 1, (float[]){-1.5f});
    tg_free(t);
}

static void test_cast(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *f =
        ir_const_new(g, "f", IR_DT_FLOAT, 1, (int64_t[]){4}, (float[]){-2.7f, 2.7f, 0.0f, 1e30f});
    ir_node *c1 = NODE(g, IR_OP_CAST, "to_i64", 1, f);
    ir_attr_set_int(g, c1, "to", IR_DT_INT64);
    ir_node *c2 = NODE(g, IR_OP_CAST, "to_bool", 1, f);
    ir_attr_set_int(g, c2, "to", IR_DT_BOOL);
    ir_node *c3 = NODE(g, IR_OP_CAST, "i_to_f", 1, ci64(g, "i", 2, (int64_t[]){3, -1}));
    ir_attr_set_int(g, c3, "to", IR_DT_FLOAT);
    ir_node *c4 =
        NODE(g, IR_OP_CAST, "to_i32", 1, ci64(g, "big", 1, (int64_t[]){((int64_t)1 << 32) + 5}));
    ir_attr_set_int(g, c4, "to", IR_DT_INT32);
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_i64s(c1->out[0], 4, (int64_t[]){-2, 2, 0, INT64_MAX});
    assert_int_equal(c2->out[0]->dtype, IR_DT_BOOL);
    assert_i64s(c2->out[0], 4, (int64_t[]){1, 1, 0, 1});
    assert_f32s(c3->out[0], 2, (float[]){3.0f, -1.0f});
    assert_i64s(c4->out[0], 1, (int64_t[]){5});
    tg_free(t);
}

/* A BOOL byte other than 0 and 1 (raw_data is stored as written: an importer does not rewrite
 * it) is true, read by the folder and by ir_const_i64 alike: Cast of the bool constant to int64
 * gives 1 where it is nonzero, and the constant itself reads the same. These once disagreed
 * (the folder read 1, ir_const_i64 the byte: 2, 255), so what shape inference, the printer and
 * the training program's constant buffers saw differed from what fold computed. */
static void test_bool_bytes(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *b = ir_const_new(g, "b", IR_DT_BOOL, 1, (int64_t[]){4}, (uint8_t[]){0, 1, 2, 255});
    ir_node *c = NODE(g, IR_OP_CAST, "to_i64", 1, b);
    ir_attr_set_int(g, c, "to", IR_DT_INT64);
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_i64s(c->out[0], 4, (int64_t[]){0, 1, 1, 1});
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ir_const_i64(b, i), ir_const_i64(c->out[0], i));
        assert_true(ir_const_f64(b, i) == (double)ir_const_i64(c->out[0], i));
    }
    tg_free(t);
}

static void test_layout_ops(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    float m[6] = {0, 1, 2, 3, 4, 5};
    ir_value *mv = ir_const_new(g, "m", IR_DT_FLOAT, 2, (int64_t[]){2, 3}, m);
    ir_node *tp = NODE(g, IR_OP_TRANSPOSE, "tp", 1, mv);
    ir_node *ga = NODE(g, IR_OP_GATHER, "gather", 1, mv, ci64(g, "idx", 2, (int64_t[]){-1, 0}));
    ir_attr_set_int(g, ga, "axis", 1);
    ir_node *cc = NODE(g, IR_OP_CONCAT, "cat", 1, mv, tp->out[0] /* 3x2: rank ok, dims differ */);
    ir_attr_set_int(g, cc, "axis", 0);
    ir_node *cc2 = NODE(g, IR_OP_CONCAT, "cat1", 1, mv, ga->out[0]);
    ir_attr_set_int(g, cc2, "axis", 1);
    ir_node *tl = NODE(g, IR_OP_TILE, "tile", 1, mv, ci64(g, "rep", 2, (int64_t[]){1, 2}));
    ir_node *fl = NODE(g, IR_OP_FLATTEN, "flat", 1, mv);
    ir_attr_set_int(g, fl, "axis", 0);
    ir_node *sp = NODE(g, IR_OP_SPLIT, "split", 2, mv, ci64(g, "sz", 2, (int64_t[]){1, 2}));
    ir_attr_set_int(g, sp, "axis", 1);
    ir_node *cs = NODE(g, IR_OP_CUMSUM, "cumsum", 1, mv, si64(g, "a1", 1));
    ir_node *cse = NODE(g, IR_OP_CUMSUM, "cumsum_ex_rev", 1, mv, si64(g, "a1b", 1));
    ir_attr_set_int(g, cse, "exclusive", 1);
    ir_attr_set_int(g, cse, "reverse", 1);
    assert_int_equal(ir_infer_graph(g), IR_ERR); /* 'cat' is broken on purpose */
    assert_true(diag_has(&t->diag, "cat", "input 1", "has 2 at axis 1", NULL));
    cc->dead = true;
    ir_graph_compact(g);
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_f32s(tp->out[0], 6, (float[]){0, 3, 1, 4, 2, 5});
    assert_f32s(ga->out[0], 4, (float[]){2, 0, 5, 3});
    assert_type(cc2->out[0], "f32[2,5]");
    assert_f32s(cc2->out[0], 10, (float[]){0, 1, 2, 2, 0, 3, 4, 5, 5, 3});
    assert_f32s(tl->out[0], 12, (float[]){0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5});
    assert_type(fl->out[0], "f32[1,6]");
    assert_f32s(sp->out[0], 2, (float[]){0, 3});
    assert_f32s(sp->out[1], 4, (float[]){1, 2, 4, 5});
    assert_f32s(cs->out[0], 6, (float[]){0, 1, 3, 3, 7, 12});
    assert_f32s(cse->out[0], 6, (float[]){3, 2, 0, 9, 5, 0});
    tg_free(t);
}

static void test_reductions_softmax(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    float m[6] = {1, 2, 3, 4, 5, 6};
    ir_value *mv = ir_const_new(g, "m", IR_DT_FLOAT, 2, (int64_t[]){2, 3}, m);
    ir_node *rs = NODE(g, IR_OP_REDUCE_SUM, "sum", 1, mv, ci64(g, "ax1", 1, (int64_t[]){1}));
    ir_node *rm = NODE(g, IR_OP_REDUCE_MEAN, "mean", 1, mv);
    ir_attr_set_ints(g, rm, "axes", (int64_t[]){0}, 1);
    ir_attr_set_int(g, rm, "keepdims", 0);
    ir_node *rx = NODE(g, IR_OP_REDUCE_MAX, "max", 1, mv);
    ir_node *sm = NODE(g, IR_OP_SOFTMAX, "softmax", 1, mv);
    ir_node *ls = NODE(g, IR_OP_LOG_SOFTMAX, "logsoftmax", 1, mv);
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_type(rs->out[0], "f32[2,1]");
    assert_f32s(rs->out[0], 2, (float[]){6, 15});
    assert_type(rm->out[0], "f32[3]");
    assert_f32s(rm->out[0], 3, (float[]){2.5f, 3.5f, 4.5f});
    assert_type(rx->out[0], "f32[1,1]");
    assert_f32s(rx->out[0], 1, (float[]){6});
    float s = expf(-2.0f) + expf(-1.0f) + expf(0.0f);
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 3; j++) {
            assert_true(fabsf(f32d(sm->out[0])[r * 3 + j] - expf((float)j - 2.0f) / s) < 1e-7f);
            assert_true(fabsf(f32d(ls->out[0])[r * 3 + j] - ((float)j - 2.0f - logf(s))) < 1e-6f);
        }
    tg_free(t);
}

static void test_broadcast_matmul(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    /* [2,1,3] + [4,1] -> [2,4,3]: out[i][j][k] = a[i][0][k] + b[j][0] */
    float a[6] = {0, 1, 2, 10, 11, 12}, b[4] = {100, 200, 300, 400};
    ir_value *av = ir_const_new(g, "a", IR_DT_FLOAT, 3, (int64_t[]){2, 1, 3}, a);
    ir_value *bv = ir_const_new(g, "b", IR_DT_FLOAT, 2, (int64_t[]){4, 1}, b);
    ir_node *ad = NODE(g, IR_OP_ADD, "add", 1, av, bv);
    /* [2,2,3] @ [3,2] with a batch dim on the left only */
    float m[12], w[6] = {1, 0, 0, 1, 1, 1};
    for (int i = 0; i < 12; i++)
        m[i] = (float)i;
    ir_node *mm = NODE(g, IR_OP_MATMUL, "mm", 1,
                       ir_const_new(g, "m", IR_DT_FLOAT, 3, (int64_t[]){2, 2, 3}, m),
                       ir_const_new(g, "w", IR_DT_FLOAT, 2, (int64_t[]){3, 2}, w));
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_type(ad->out[0], "f32[2,4,3]");
    float want[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 3; k++)
                want[(i * 4 + j) * 3 + k] = a[i * 3 + k] + b[j];
    assert_f32s(ad->out[0], 24, want);
    assert_type(mm->out[0], "f32[2,2,2]");
    /* row r = [3r, 3r+1, 3r+2] -> [3r + 3r+2, 3r+1 + 3r+2] */
    float wm[8];
    for (int r = 0; r < 4; r++) {
        wm[r * 2] = (float)(3 * r) + (float)(3 * r + 2);
        wm[r * 2 + 1] = (float)(3 * r + 1) + (float)(3 * r + 2);
    }
    assert_f32s(mm->out[0], 8, wm);
    tg_free(t);
}

static void test_constant_node(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_node *c = mknode(g, IR_OP_CONSTANT, "const", 0, NULL, 1);
    ir_attr_set_ints(g, c, "value_ints", (int64_t[]){5, 6}, 2);
    ir_node *c2 = mknode(g, IR_OP_CONSTANT, "const_t", 0, NULL, 1);
    set_tensor_attr(g, c2, "value", ir_const_new(g, "tv", IR_DT_FLOAT, 0, NULL, (float[]){2.5f}));
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_i64s(c->out[0], 2, (int64_t[]){5, 6});
    assert_f32s(c2->out[0], 1, (float[]){2.5f});
    assert_int_equal(g->n_nodes, 0);
    tg_free(t);
}

/* Identity, Dropout (eval), Cast to the same dtype and Reshape/Expand to the same shape vanish;
 * a graph output keeps its name (its node turns into an Identity). */
static void test_bypass(void **state)
{
    (void)state;
    tgraph *t = tg_new(13);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,32");
    ir_node *r0 = NODE(g, IR_OP_RELU, "relu", 1, x);
    ir_node *id = NODE(g, IR_OP_IDENTITY, "id", 1, r0->out[0]);
    ir_node *dr = NODE(g, IR_OP_DROPOUT, "drop", 1, id->out[0], sf32(g, "ratio", 0.1f));
    ir_node *ca = NODE(g, IR_OP_CAST, "cast", 1, dr->out[0]);
    ir_attr_set_int(g, ca, "to", IR_DT_FLOAT);
    ir_node *rs =
        NODE(g, IR_OP_RESHAPE, "reshape", 1, ca->out[0], ci64(g, "s", 3, (int64_t[]){0, 0, 32}));
    ir_node *ex =
        NODE(g, IR_OP_EXPAND, "expand", 1, rs->out[0], ci64(g, "e", 3, (int64_t[]){1, 1, 32}));
    ir_node *tanh_ = NODE(g, IR_OP_TANH, "tanh", 1, ex->out[0]);
    ir_node *dr2 = NODE(g, IR_OP_DROPOUT, "drop_out", 1, tanh_->out[0]);
    ir_node *dr3 = NODE(g, IR_OP_DROPOUT, "drop_train", 1, tanh_->out[0], sf32(g, "ratio2", 0.1f),
                        ir_const_new(g, "train", IR_DT_BOOL, 0, NULL, (uint8_t[]){1}));
    add_output(g, dr2->out[0]);
    add_output(g, dr3->out[0]);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_int_equal(sbp_pass_dce(g), IR_OK);
    assert_int_equal(ir_verify(g), IR_OK);
    assert_int_equal(g->n_nodes, 4);
    assert_ptr_equal(tanh_->in[0], r0->out[0]);
    assert_int_equal(dr2->op, IR_OP_IDENTITY); /* graph output 'drop_out_out0' keeps its name */
    assert_ptr_equal(g->outputs[0], dr2->out[0]);
    assert_int_equal(dr3->op, IR_OP_DROPOUT); /* training mode: random, kept */
    tg_free(t);
}

/* logits = Cast(MatMul(...), to=float): the MatMul takes the output value over, so the output
 * keeps its name and no Identity is left. */
static void test_bypass_output_handover(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,64,32");
    ir_value *w = val(g, IR_VAL_PARAM, "w", IR_DT_FLOAT, "32,64");
    ir_node *mm = NODE(g, IR_OP_MATMUL, "/lm_head/MatMul", 1, x, w);
    ir_value *logits = val(g, IR_VAL_NODE, "logits", IR_DT_FLOAT, "2,64,64");
    ir_node *ca = ir_node_new_with_outputs(g, IR_OP_CAST, "/Cast", NULL, 1,
                                           (ir_value *[]){mm->out[0]}, 1, (ir_value *[]){logits});
    ir_attr_set_int(g, ca, "to", IR_DT_FLOAT);
    add_output(g, logits);
    /* an Identity whose input is a graph input cannot hand over: it stays */
    ir_node *id = NODE(g, IR_OP_IDENTITY, "id", 1, x);
    add_output(g, id->out[0]);
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_int_equal(sbp_pass_dce(g), IR_OK);
    assert_int_equal(ir_verify(g), IR_OK);
    assert_int_equal(g->n_nodes, 2);
    assert_ptr_equal(mm->out[0], logits);
    assert_ptr_equal(logits->producer, mm);
    assert_ptr_equal(g->outputs[0], logits);
    assert_int_equal(id->op, IR_OP_IDENTITY);
    assert_false(id->dead);
    tg_free(t);
}

/* Parameters are trained, so never constant; results above the cap stay nodes. */
static void test_not_folded(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *w = val(g, IR_VAL_PARAM, "wte", IR_DT_FLOAT, "64,32");
    ir_node *tp = NODE(g, IR_OP_TRANSPOSE, "tp", 1, w);
    ir_node *big =
        NODE(g, IR_OP_CONSTANT_OF_SHAPE, "big", 1, ci64(g, "s", 2, (int64_t[]){5000, 5000}));
    ir_node *ok =
        NODE(g, IR_OP_CONSTANT_OF_SHAPE, "ok", 1, ci64(g, "s2", 2, (int64_t[]){4096, 4096}));
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_false(ir_value_is_const(tp->out[0]));
    assert_false(ir_value_is_const(big->out[0]));
    assert_true(ir_value_is_const(ok->out[0]));
    assert_int_equal(count_live(g), 2);
    tg_free(t);
}

/* GatherND, by the ONNX operator spec's definition: each index tuple (the last axis of the
 * indices, k long) picks data[b..., i0, .., ik-1, :]; the out shape is indices.shape[:-1] ++
 * data.shape[batch_dims + k:]; negative indices count from the end. The first four cases are
 * the spec's own examples. */
static void test_gather_nd(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    const int64_t d22[2] = {2, 2}, d222[3] = {2, 2, 2}, d223[3] = {2, 2, 3};
    ir_value *x2 = ir_const_new(g, "x2", IR_DT_INT64, 2, d22, (int64_t[]){0, 1, 2, 3});
    ir_value *x3 =
        ir_const_new(g, "x3", IR_DT_FLOAT, 3, d222, (float[]){0, 1, 2, 3, 4, 5, 6, 7});
    float f12[12];
    for (int i = 0; i < 12; i++)
        f12[i] = (float)(10 + i);
    ir_value *x4 = ir_const_new(g, "x4", IR_DT_FLOAT, 3, d223, f12);
    /* spec example 1: elements */
    ir_node *e1 = NODE(g, IR_OP_GATHER_ND, "e1", 1, x2,
                       ir_const_new(g, "i1", IR_DT_INT64, 2, d22, (int64_t[]){0, 0, 1, 1}));
    /* example 2: rows */
    ir_node *e2 = NODE(g, IR_OP_GATHER_ND, "e2", 1, x2,
                       ir_const_new(g, "i2", IR_DT_INT64, 2, (int64_t[]){2, 1},
                                    (int64_t[]){1, 0}));
    /* example 3: rows of a 3-d tensor */
    ir_node *e3 = NODE(g, IR_OP_GATHER_ND, "e3", 1, x3,
                       ir_const_new(g, "i3", IR_DT_INT64, 2, d22, (int64_t[]){0, 1, 1, 0}));
    /* example 5: batch_dims 1 */
    ir_node *e5 = NODE(g, IR_OP_GATHER_ND, "e5", 1, x3,
                       ir_const_new(g, "i5", IR_DT_INT64, 2, (int64_t[]){2, 1},
                                    (int64_t[]){1, 0}));
    ir_attr_set_int(g, e5, "batch_dims", 1);
    /* batch_dims 1, two tuples per batch, k = 1: x4[b][i] rows of 3 */
    ir_node *b1 = NODE(g, IR_OP_GATHER_ND, "b1", 1, x4,
                       ir_const_new(g, "ib1", IR_DT_INT64, 3, (int64_t[]){2, 2, 1},
                                    (int64_t[]){1, 0, 1, -2}));
    ir_attr_set_int(g, b1, "batch_dims", 1);
    /* batch_dims 1, k = 2: single elements x4[b][i][j], negative j */
    ir_node *b2 = NODE(g, IR_OP_GATHER_ND, "b2", 1, x4,
                       ir_const_new(g, "ib2", IR_DT_INT64, 2, d22, (int64_t[]){1, 2, 0, -1}));
    ir_attr_set_int(g, b2, "batch_dims", 1);
    /* negative indices, batch_dims 0: x2[-1][-2] = x2[1][0] */
    ir_node *ng = NODE(g, IR_OP_GATHER_ND, "neg", 1, x2,
                       ir_const_new(g, "ineg", IR_DT_INT64, 2, (int64_t[]){1, 2},
                                    (int64_t[]){-1, -2}));
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_int_equal(count_live(g), 0);
    assert_type(e1->out[0], "i64[2]");
    assert_i64s(e1->out[0], 2, (int64_t[]){0, 3});
    assert_type(e2->out[0], "i64[2,2]");
    assert_i64s(e2->out[0], 4, (int64_t[]){2, 3, 0, 1});
    assert_type(e3->out[0], "f32[2,2]");
    assert_f32s(e3->out[0], 4, (float[]){2, 3, 4, 5});
    assert_type(e5->out[0], "f32[2,2]");
    assert_f32s(e5->out[0], 4, (float[]){2, 3, 4, 5});
    assert_type(b1->out[0], "f32[2,2,3]");
    /* batch 0: rows 1, 0 = {13,14,15}, {10,11,12}; batch 1: rows 1, -2 = 0: {19,20,21},
     * {16,17,18} */
    assert_f32s(b1->out[0], 12, (float[]){13, 14, 15, 10, 11, 12, 19, 20, 21, 16, 17, 18});
    assert_type(b2->out[0], "f32[2]");
    assert_f32s(b2->out[0], 2, (float[]){15, 18}); /* x4[0][1][2], x4[1][0][2] */
    assert_type(ng->out[0], "i64[1]");
    assert_i64s(ng->out[0], 1, (int64_t[]){2});
    tg_free(t);
}

/* An index outside [-d, d) is an error that names the node (the model is broken); -d is the
 * first element, d is one past the end. */
static void test_gather_nd_out_of_range(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    const int64_t d22[2] = {2, 2};
    ir_value *x = ir_const_new(g, "x", IR_DT_INT64, 2, d22, (int64_t[]){0, 1, 2, 3});
    ir_node *ok = NODE(g, IR_OP_GATHER_ND, "gnd_ok", 1, x,
                       ir_const_new(g, "iok", IR_DT_INT64, 2, (int64_t[]){1, 2},
                                    (int64_t[]){-2, 1}));
    bool folded;
    assert_int_equal(sbp_eval_node(g, ok, &folded), IR_OK);
    assert_true(folded);
    assert_i64s(ok->out[0], 1, (int64_t[]){1});
    ir_node *hi = NODE(g, IR_OP_GATHER_ND, "gnd_hi", 1, x,
                       ir_const_new(g, "ihi", IR_DT_INT64, 2, (int64_t[]){1, 2},
                                    (int64_t[]){0, 2}));
    assert_int_equal(sbp_eval_node(g, hi, &folded), IR_ERR);
    assert_true(diag_has(&t->diag, "gnd_hi", "GatherND", "out of range", NULL));
    ir_node *lo = NODE(g, IR_OP_GATHER_ND, "gnd_lo", 1, x,
                       ir_const_new(g, "ilo", IR_DT_INT64, 2, (int64_t[]){1, 1},
                                    (int64_t[]){-3}));
    assert_int_equal(sbp_eval_node(g, lo, &folded), IR_ERR);
    assert_true(diag_has(&t->diag, "gnd_lo", "out of range", NULL));
    /* through the pass: the error stops it */
    tgraph *t2 = tg_new(17);
    ir_value *x2 = ir_const_new(t2->g, "x", IR_DT_INT64, 2, d22, (int64_t[]){0, 1, 2, 3});
    NODE(t2->g, IR_OP_GATHER_ND, "/model/GatherND_7", 1, x2,
         ir_const_new(t2->g, "i", IR_DT_INT64, 2, (int64_t[]){1, 2}, (int64_t[]){5, 0}));
    assert_int_equal(sbp_pass_fold(t2->g), IR_ERR);
    assert_true(diag_has(&t2->diag, "/model/GatherND_7", "out of range", NULL));
    tg_free(t2);
    tg_free(t);
}

/* ScatterND (reduction none): output = data with the slices the indices name replaced by the
 * updates; the spec's example 1, row slices, element updates with negative indices, a repeated
 * index (the later update is the result), an out-of-range index (an error naming the node),
 * and a reduction that is not folded. */
static void test_scatter_nd(void **state)
{
    (void)state;
    tgraph *t = tg_new(18);
    ir_graph *g = t->g;
    ir_value *d8 =
        ir_const_new(g, "d8", IR_DT_FLOAT, 1, (int64_t[]){8}, (float[]){1, 2, 3, 4, 5, 6, 7, 8});
    ir_node *s1 = NODE(g, IR_OP_SCATTER_ND, "s1", 1, d8,
                       ir_const_new(g, "i1", IR_DT_INT64, 2, (int64_t[]){4, 1},
                                    (int64_t[]){4, 3, 1, 7}),
                       ir_const_new(g, "u1", IR_DT_FLOAT, 1, (int64_t[]){4},
                                    (float[]){9, 10, 11, 12}));
    const int64_t d32[2] = {3, 2};
    ir_value *m = ir_const_new(g, "m", IR_DT_INT64, 2, d32, (int64_t[]){1, 2, 3, 4, 5, 6});
    ir_node *s2 = NODE(g, IR_OP_SCATTER_ND, "rows", 1, m,
                       ir_const_new(g, "i2", IR_DT_INT64, 2, (int64_t[]){2, 1},
                                    (int64_t[]){2, 0}),
                       ir_const_new(g, "u2", IR_DT_INT64, 2, (int64_t[]){2, 2},
                                    (int64_t[]){10, 20, 30, 40}));
    ir_node *s3 = NODE(g, IR_OP_SCATTER_ND, "elems", 1, m,
                       ir_const_new(g, "i3", IR_DT_INT64, 2, (int64_t[]){2, 2},
                                    (int64_t[]){0, 1, -1, 0}),
                       ir_const_new(g, "u3", IR_DT_INT64, 1, (int64_t[]){2}, (int64_t[]){7, 8}));
    ir_value *d3 = ir_const_new(g, "d3", IR_DT_INT64, 1, (int64_t[]){3}, (int64_t[]){1, 2, 3});
    ir_node *s4 = NODE(g, IR_OP_SCATTER_ND, "repeat", 1, d3,
                       ir_const_new(g, "i4", IR_DT_INT64, 2, (int64_t[]){2, 1},
                                    (int64_t[]){1, 1}),
                       ir_const_new(g, "u4", IR_DT_INT64, 1, (int64_t[]){2},
                                    (int64_t[]){100, 200}));
    ir_node *s5 = NODE(g, IR_OP_SCATTER_ND, "add_red", 1, d3,
                       ir_const_new(g, "i5", IR_DT_INT64, 2, (int64_t[]){1, 1}, (int64_t[]){0}),
                       ir_const_new(g, "u5", IR_DT_INT64, 1, (int64_t[]){1}, (int64_t[]){5}));
    ir_attr_set_string(g, s5, "reduction", "add");
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_type(s1->out[0], "f32[8]");
    assert_f32s(s1->out[0], 8, (float[]){1, 11, 3, 10, 9, 6, 7, 12});
    assert_type(s2->out[0], "i64[3,2]");
    assert_i64s(s2->out[0], 6, (int64_t[]){30, 40, 3, 4, 10, 20});
    assert_i64s(s3->out[0], 6, (int64_t[]){1, 7, 3, 4, 8, 6});
    assert_i64s(s4->out[0], 3, (int64_t[]){1, 200, 3});
    assert_i64s(m, 6, (int64_t[]){1, 2, 3, 4, 5, 6}); /* the data itself is not written */
    assert_false(ir_value_is_const(s5->out[0]));        /* reduction 'add': left as a node */
    assert_int_equal(count_live(g), 1);
    ir_node *bad = NODE(g, IR_OP_SCATTER_ND, "scatter_bad", 1, d3,
                        ir_const_new(g, "i6", IR_DT_INT64, 2, (int64_t[]){1, 1}, (int64_t[]){3}),
                        ir_const_new(g, "u6", IR_DT_INT64, 1, (int64_t[]){1}, (int64_t[]){0}));
    bool folded;
    assert_int_equal(sbp_eval_node(g, bad, &folded), IR_ERR);
    assert_true(diag_has(&t->diag, "scatter_bad", "ScatterND", "out of range", NULL));
    tg_free(t);
}

/* IsNaN, IsInf with each detect_positive/detect_negative setting, and Xor (with broadcasting):
 * bool results. */
static void test_isnan_isinf_xor(void **state)
{
    (void)state;
    tgraph *t = tg_new(20);
    ir_graph *g = t->g;
    ir_value *x = ir_const_new(g, "x", IR_DT_FLOAT, 1, (int64_t[]){6},
                               (float[]){1.0f, NAN, INFINITY, -INFINITY, 0.0f, -FLT_MAX});
    ir_node *nan = NODE(g, IR_OP_IS_NAN, "isnan", 1, x);
    ir_node *inf = NODE(g, IR_OP_IS_INF, "isinf", 1, x);
    ir_node *pos = NODE(g, IR_OP_IS_INF, "isinf_pos", 1, x);
    ir_attr_set_int(g, pos, "detect_negative", 0);
    ir_node *neg = NODE(g, IR_OP_IS_INF, "isinf_neg", 1, x);
    ir_attr_set_int(g, neg, "detect_positive", 0);
    ir_node *none = NODE(g, IR_OP_IS_INF, "isinf_none", 1, x);
    ir_attr_set_int(g, none, "detect_positive", 0);
    ir_attr_set_int(g, none, "detect_negative", 0);
    ir_value *xd = ir_const_new(g, "xd", IR_DT_DOUBLE, 1, (int64_t[]){3},
                                (double[]){NAN, -INFINITY, 1e308});
    ir_node *nand = NODE(g, IR_OP_IS_NAN, "isnan_d", 1, xd);
    ir_node *infd = NODE(g, IR_OP_IS_INF, "isinf_d", 1, xd);
    ir_value *a = ir_const_new(g, "a", IR_DT_BOOL, 1, (int64_t[]){4}, (uint8_t[]){1, 1, 0, 0});
    ir_value *b = ir_const_new(g, "b", IR_DT_BOOL, 1, (int64_t[]){4}, (uint8_t[]){1, 0, 1, 0});
    ir_node *xr = NODE(g, IR_OP_XOR, "xor", 1, a, b);
    ir_value *c = ir_const_new(g, "c", IR_DT_BOOL, 2, (int64_t[]){2, 1}, (uint8_t[]){1, 0});
    ir_value *e = ir_const_new(g, "e", IR_DT_BOOL, 1, (int64_t[]){3}, (uint8_t[]){1, 0, 1});
    ir_node *xb = NODE(g, IR_OP_XOR, "xor_bcast", 1, c, e);
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_int_equal(count_live(g), 0);
    assert_type(nan->out[0], "bool[6]");
    assert_i64s(nan->out[0], 6, (int64_t[]){0, 1, 0, 0, 0, 0});
    assert_type(inf->out[0], "bool[6]");
    assert_i64s(inf->out[0], 6, (int64_t[]){0, 0, 1, 1, 0, 0});
    assert_i64s(pos->out[0], 6, (int64_t[]){0, 0, 1, 0, 0, 0});
    assert_i64s(neg->out[0], 6, (int64_t[]){0, 0, 0, 1, 0, 0});
    assert_i64s(none->out[0], 6, (int64_t[]){0, 0, 0, 0, 0, 0});
    assert_i64s(nand->out[0], 3, (int64_t[]){1, 0, 0});
    assert_i64s(infd->out[0], 3, (int64_t[]){0, 1, 0});
    assert_type(xr->out[0], "bool[4]");
    assert_i64s(xr->out[0], 4, (int64_t[]){0, 1, 1, 0});
    assert_type(xb->out[0], "bool[2,3]");
    assert_i64s(xb->out[0], 6, (int64_t[]){0, 1, 0, 1, 0, 1});
    tg_free(t);
}

/* sbp_eval_node on its own: folds one node, says so, leaves the rest. */
static void test_eval_node(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "3");
    ir_node *a = NODE(g, IR_OP_ADD, "add", 1, si64(g, "a", 2), si64(g, "b", 3));
    ir_node *b = NODE(g, IR_OP_RELU, "relu", 1, x);
    bool folded;
    assert_int_equal(sbp_eval_node(g, a, &folded), IR_OK);
    assert_true(folded);
    assert_true(a->dead);
    assert_i64s(a->out[0], 1, (int64_t[]){5});
    assert_int_equal(sbp_eval_node(g, b, &folded), IR_OK);
    assert_false(folded);
    ir_node *bad =
        NODE(g, IR_OP_GATHER, "gbad", 1, ci64(g, "d", 2, (int64_t[]){1, 2}), si64(g, "i", 7));
    assert_int_equal(sbp_eval_node(g, bad, &folded), IR_ERR);
    assert_true(diag_has(&t->diag, "gbad", "out of range", NULL));
    tg_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape_chain),
        cmocka_unit_test(test_shape_of_known_shape),
        cmocka_unit_test(test_range),
        cmocka_unit_test(test_trilu_expand_mask),
        cmocka_unit_test(test_where_compare),
        cmocka_unit_test(test_slice_values),
        cmocka_unit_test(test_integer_arith),
        cmocka_unit_test(test_float_math),
        cmocka_unit_test(test_cast),
        cmocka_unit_test(test_layout_ops),
        cmocka_unit_test(test_reductions_softmax),
        cmocka_unit_test(test_broadcast_matmul),
        cmocka_unit_test(test_constant_node),
        cmocka_unit_test(test_bypass),
        cmocka_unit_test(test_bypass_output_handover),
        cmocka_unit_test(test_not_folded),
        cmocka_unit_test(test_eval_node),
        cmocka_unit_test(test_gather_nd),
        cmocka_unit_test(test_gather_nd_out_of_range),
        cmocka_unit_test(test_scatter_nd),
        cmocka_unit_test(test_isnan_isinf_xor),
        cmocka_unit_test(test_bool_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
