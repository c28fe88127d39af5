/* test_shape.c — shape inference (ir/shape.c): symbolic propagation through each family of ops,
 * the constant-driven shapes (Reshape, Slice, Expand, ...), and every contradiction reported
 * with the node, the op and the input concerned. */
#include "pass_test.h"

#include <stdint.h>

#define INFER_OK(t, n) assert_int_equal(ir_infer_node((t)->g, (n)), IR_OK)
#define INFER_ERR(t, n) assert_int_equal(ir_infer_node((t)->g, (n)), IR_ERR)

static void test_broadcast_symbolic(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,32");
    ir_value *b = val(g, IR_VAL_PARAM, "b", IR_DT_FLOAT, "32");
    ir_value *m = val(g, IR_VAL_INPUT, "m", IR_DT_FLOAT, "batch,1,sequence");
    ir_value *k = val(g, IR_VAL_INPUT, "k", IR_DT_FLOAT, "1,4,1");
    ir_value *o = val(g, IR_VAL_INPUT, "o", IR_DT_FLOAT, "other,32");
    ir_value *u = val(g, IR_VAL_INPUT, "u", IR_DT_FLOAT, "?,32");
    ir_node *n1 = NODE(g, IR_OP_ADD, "add1", 1, x, b);
    ir_node *n2 = NODE(g, IR_OP_MUL, "mul", 1, m, k);
    ir_node *n3 = NODE(g, IR_OP_SUB, "sub", 1, x, o); /* sequence vs other -> unknown */
    ir_node *n4 = NODE(g, IR_OP_LESS, "lt", 1, x, b);
    ir_node *n5 = NODE(g, IR_OP_MAX, "max3", 1, b, x, b); /* variadic */
    ir_node *n6 = NODE(g, IR_OP_ADD, "add_unknown", 1, u, x);
    ir_node *n7 = NODE(g, IR_OP_NOT, "not", 1, n4->out[0]);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(n1->out[0], "f32[batch,sequence,32]");
    assert_type(n2->out[0], "f32[batch,4,sequence]");
    assert_type(n3->out[0], "f32[batch,?,32]");
    assert_type(n4->out[0], "bool[batch,sequence,32]");
    assert_type(n5->out[0], "f32[batch,sequence,32]");
    assert_type(n6->out[0], "f32[batch,?,32]");
    assert_type(n7->out[0], "bool[batch,sequence,32]");
    tg_free(t);
}

static void test_broadcast_error(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *a = val(g, IR_VAL_INPUT, "a", IR_DT_FLOAT, "2,3");
    ir_value *b = val(g, IR_VAL_INPUT, "b", IR_DT_FLOAT, "4");
    ir_value *i = val(g, IR_VAL_INPUT, "i", IR_DT_INT64, "3");
    ir_node *n = NODE(g, IR_OP_ADD, "/h.0/Add_3", 1, a, b);
    INFER_ERR(t, n);
    assert_true(diag_has(&t->diag, "node '/h.0/Add_3' (Add)", "input 1 ('b')", "broadcast", "4",
                         "3", NULL));
    ir_node *m = NODE(g, IR_OP_MUL, "mixed", 1, a, i);
    INFER_ERR(t, m);
    assert_true(diag_has(&t->diag, "mixed", "input 1 ('i')", "i64", "f32", NULL));
    tg_free(t);
}

static void test_where_cast_dropout(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *c = val(g, IR_VAL_INPUT, "c", IR_DT_BOOL, "1,1,sequence,sequence");
    ir_value *s = val(g, IR_VAL_INPUT, "s", IR_DT_FLOAT, "batch,4,sequence,sequence");
    ir_value *mv = sf32(g, "minval", -3.4e38f);
    ir_node *w = NODE(g, IR_OP_WHERE, "where", 1, c, s, mv);
    INFER_OK(t, w);
    assert_type(w->out[0], "f32[batch,4,sequence,sequence]");
    ir_node *ca = NODE(g, IR_OP_CAST, "cast", 1, s);
    ir_attr_set_int(g, ca, "to", IR_DT_DOUBLE);
    INFER_OK(t, ca);
    assert_type(ca->out[0], "f64[batch,4,sequence,sequence]");
    ir_node *d = NODE(g, IR_OP_DROPOUT, "drop", 2, s);
    INFER_OK(t, d);
    assert_type(d->out[0], "f32[batch,4,sequence,sequence]");
    assert_type(d->out[1], "bool[batch,4,sequence,sequence]");
    ir_node *wb = NODE(g, IR_OP_WHERE, "where_bad", 1, s, s, s);
    INFER_ERR(t, wb);
    assert_true(diag_has(&t->diag, "where_bad", "condition must be bool", NULL));
    tg_free(t);
}

static void test_shape_size(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,32");
    ir_node *s = NODE(g, IR_OP_SHAPE, "shape", 1, x);
    ir_node *s2 = NODE(g, IR_OP_SHAPE, "shape_tail", 1, x);
    ir_attr_set_int(g, s2, "start", -2);
    ir_node *s3 = NODE(g, IR_OP_SHAPE, "shape_mid", 1, x);
    ir_attr_set_int(g, s3, "start", 1);
    ir_attr_set_int(g, s3, "end", 2);
    ir_node *s4 = NODE(g, IR_OP_SHAPE, "shape_empty", 1, x);
    ir_attr_set_int(g, s4, "start", 5);
    ir_node *sz = NODE(g, IR_OP_SIZE, "size", 1, x);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(s->out[0], "i64[3]");
    assert_type(s2->out[0], "i64[2]");
    assert_type(s3->out[0], "i64[1]");
    assert_type(s4->out[0], "i64[0]");
    assert_type(sz->out[0], "i64[]");
    tg_free(t);
}

static void test_matmul(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,32");
    ir_value *w = val(g, IR_VAL_PARAM, "w", IR_DT_FLOAT, "32,64");
    ir_value *q = val(g, IR_VAL_INPUT, "q", IR_DT_FLOAT, "batch,4,sequence,8");
    ir_value *kt = val(g, IR_VAL_INPUT, "kt", IR_DT_FLOAT, "batch,1,8,sequence");
    ir_value *v3 = val(g, IR_VAL_INPUT, "v3", IR_DT_FLOAT, "3");
    ir_value *m35 = val(g, IR_VAL_INPUT, "m35", IR_DT_FLOAT, "3,5");
    ir_value *m234 = val(g, IR_VAL_INPUT, "m234", IR_DT_FLOAT, "2,3,4");
    ir_value *v4 = val(g, IR_VAL_INPUT, "v4", IR_DT_FLOAT, "4");
    ir_node *a = NODE(g, IR_OP_MATMUL, "mm", 1, x, w);
    ir_node *b = NODE(g, IR_OP_MATMUL, "qk", 1, q, kt);
    ir_node *c = NODE(g, IR_OP_MATMUL, "vec_mat", 1, v3, m35);
    ir_node *d = NODE(g, IR_OP_MATMUL, "mat_vec", 1, m234, v4);
    ir_node *e = NODE(g, IR_OP_MATMUL, "vec_vec", 1, v3, v3);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(a->out[0], "f32[batch,sequence,64]");
    assert_type(b->out[0], "f32[batch,4,sequence,sequence]");
    assert_type(c->out[0], "f32[5]");
    assert_type(d->out[0], "f32[2,3]");
    assert_type(e->out[0], "f32[]");
    ir_node *bad = NODE(g, IR_OP_MATMUL, "mm_bad", 1, x, m35);
    INFER_ERR(t, bad);
    assert_true(diag_has(&t->diag, "node 'mm_bad' (MatMul)", "inner dims", "'x'", "32", "'m35'",
                         "3", NULL));
    tg_free(t);
}

static void test_gemm_linear_embedding(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *a = val(g, IR_VAL_INPUT, "a", IR_DT_FLOAT, "128,32");
    ir_value *w = val(g, IR_VAL_PARAM, "w", IR_DT_FLOAT, "96,32");
    ir_value *b = val(g, IR_VAL_PARAM, "b", IR_DT_FLOAT, "96");
    ir_node *n = NODE(g, IR_OP_GEMM, "gemm", 1, a, w, b);
    ir_attr_set_int(g, n, "transB", 1);
    INFER_OK(t, n);
    assert_type(n->out[0], "f32[128,96]");
    ir_node *bad = NODE(g, IR_OP_GEMM, "gemm_bad", 1, a, w);
    INFER_ERR(t, bad);
    assert_true(diag_has(&t->diag, "gemm_bad", "inner dims", NULL));

    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,32");
    ir_value *wl = val(g, IR_VAL_PARAM, "wl", IR_DT_FLOAT, "32,64");
    ir_node *l = NODE(g, IR_OP_LINEAR, "lin", 1, x, wl);
    INFER_OK(t, l);
    assert_type(l->out[0], "f32[batch,sequence,64]");
    ir_value *tab = val(g, IR_VAL_PARAM, "wte", IR_DT_FLOAT, "64,32");
    ir_value *ids = val(g, IR_VAL_INPUT, "ids", IR_DT_INT64, "batch,sequence");
    ir_node *e = NODE(g, IR_OP_EMBEDDING, "emb", 1, tab, ids);
    INFER_OK(t, e);
    assert_type(e->out[0], "f32[batch,sequence,32]");
    ir_node *ce = NODE(g, IR_OP_CROSS_ENTROPY, "ce", 1, l->out[0], ids);
    INFER_OK(t, ce);
    assert_type(ce->out[0], "f32[]");
    tg_free(t);
}

static void test_gather(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,32");
    ir_node *sh = NODE(g, IR_OP_SHAPE, "shape", 1, x);
    ir_node *g0 = NODE(g, IR_OP_GATHER, "g0", 1, sh->out[0], si64(g, "zero", 0));
    ir_value *tab = val(g, IR_VAL_PARAM, "wpe", IR_DT_FLOAT, "128,32");
    ir_value *pos = val(g, IR_VAL_INPUT, "pos", IR_DT_INT64, "1,sequence");
    ir_node *g1 = NODE(g, IR_OP_GATHER, "g1", 1, tab, pos);
    ir_node *g2 = NODE(g, IR_OP_GATHER, "g2", 1, x, ci64(g, "idx2", 2, (int64_t[]){0, -1}));
    ir_attr_set_int(g, g2, "axis", -1);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(g0->out[0], "i64[]");
    assert_type(g1->out[0], "f32[1,sequence,32]");
    assert_type(g2->out[0], "f32[batch,sequence,2]");
    ir_node *bad = NODE(g, IR_OP_GATHER, "g_bad", 1, sh->out[0], si64(g, "three", 3));
    INFER_ERR(t, bad);
    assert_true(diag_has(&t->diag, "g_bad", "index 3 is out of range", NULL));
    ir_node *bad2 = NODE(g, IR_OP_GATHER, "g_axis", 1, x, pos);
    ir_attr_set_int(g, bad2, "axis", 3);
    INFER_ERR(t, bad2);
    assert_true(diag_has(&t->diag, "g_axis", "axis 3 is out of range for rank 3", NULL));
    tg_free(t);
}

static void test_unsqueeze_squeeze(void **state)
{
    (void)state;
    tgraph *t = tg_new(13);
    ir_graph *g = t->g;
    ir_value *s = val(g, IR_VAL_INPUT, "s", IR_DT_INT64, "");
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence");
    ir_node *u1 = NODE(g, IR_OP_UNSQUEEZE, "u1", 1, s, ci64(g, "ax0", 1, (int64_t[]){0}));
    ir_node *u2 = NODE(g, IR_OP_UNSQUEEZE, "u2", 1, x, ci64(g, "ax13", 2, (int64_t[]){1, -1}));
    ir_node *u3 = NODE(g, IR_OP_UNSQUEEZE, "u3_attr", 1, x); /* opset < 13 form */
    ir_attr_set_ints(g, u3, "axes", (int64_t[]){0}, 1);
    ir_value *dyn_axes = val(g, IR_VAL_INPUT, "dyn_axes", IR_DT_INT64, "2");
    ir_node *u4 = NODE(g, IR_OP_UNSQUEEZE, "u4_dyn", 1, x, dyn_axes);
    ir_node *q1 = NODE(g, IR_OP_SQUEEZE, "q1", 1, u2->out[0], ci64(g, "ax1", 1, (int64_t[]){1}));
    ir_value *y = val(g, IR_VAL_INPUT, "y", IR_DT_FLOAT, "1,4,1");
    ir_node *q2 = NODE(g, IR_OP_SQUEEZE, "q2_all", 1, y);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(u1->out[0], "i64[1]");
    assert_type(u2->out[0], "f32[batch,1,sequence,1]");
    assert_type(u3->out[0], "f32[1,batch,sequence]");
    assert_type(u4->out[0], "f32[?,?,?,?]");
    assert_type(q1->out[0], "f32[batch,sequence,1]");
    assert_type(q2->out[0], "f32[4]");
    ir_node *bad = NODE(g, IR_OP_SQUEEZE, "q_bad", 1, y, ci64(g, "ax1b", 1, (int64_t[]){1}));
    INFER_ERR(t, bad);
    assert_true(diag_has(&t->diag, "q_bad", "cannot squeeze axis 1 of extent 4", NULL));
    ir_node *dup = NODE(g, IR_OP_UNSQUEEZE, "u_dup", 1, x, ci64(g, "axdup", 2, (int64_t[]){0, 0}));
    INFER_ERR(t, dup);
    assert_true(diag_has(&t->diag, "u_dup", "twice", NULL));
    tg_free(t);
}

static void test_concat(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *a = val(g, IR_VAL_INPUT, "a", IR_DT_FLOAT, "batch,3");
    ir_value *b = val(g, IR_VAL_INPUT, "b", IR_DT_FLOAT, "batch,5");
    ir_value *c = val(g, IR_VAL_INPUT, "c", IR_DT_FLOAT, "?,sequence");
    ir_value *r3 = val(g, IR_VAL_INPUT, "r3", IR_DT_FLOAT, "batch,3,1");
    ir_value *e0 = val(g, IR_VAL_INPUT, "e0", IR_DT_FLOAT, "batch,0");
    ir_node *n1 = NODE(g, IR_OP_CONCAT, "cat", 1, a, b);
    ir_attr_set_int(g, n1, "axis", -1);
    ir_node *n2 = NODE(g, IR_OP_CONCAT, "cat_sym", 1, a, c);
    ir_attr_set_int(g, n2, "axis", 1);
    ir_node *n3 = NODE(g, IR_OP_CONCAT, "cat_lone", 1, e0, c);
    ir_attr_set_int(g, n3, "axis", 1);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(n1->out[0], "f32[batch,8]");
    assert_type(n2->out[0], "f32[batch,?]");
    assert_type(n3->out[0], "f32[batch,sequence]");
    ir_node *bad = NODE(g, IR_OP_CONCAT, "cat_rank", 1, a, r3);
    ir_attr_set_int(g, bad, "axis", 0);
    INFER_ERR(t, bad);
    assert_true(diag_has(&t->diag, "node 'cat_rank' (Concat)", "input 1 ('r3') has rank 3",
                         "rank 2", NULL));
    ir_value *d = val(g, IR_VAL_INPUT, "d", IR_DT_FLOAT, "4,5");
    ir_value *e = val(g, IR_VAL_INPUT, "e", IR_DT_FLOAT, "3,5");
    ir_node *bad2 = NODE(g, IR_OP_CONCAT, "cat_dim", 1, d, e);
    ir_attr_set_int(g, bad2, "axis", 1);
    INFER_ERR(t, bad2);
    assert_true(diag_has(&t->diag, "cat_dim", "input 1 ('e') has 3 at axis 0", NULL));
    tg_free(t);
}

static void test_reshape(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,32");
    ir_value *y = val(g, IR_VAL_INPUT, "y", IR_DT_FLOAT, "3,4");
    ir_node *r1 =
        NODE(g, IR_OP_RESHAPE, "split_heads", 1, x, ci64(g, "s1", 4, (int64_t[]){0, 0, 4, -1}));
    ir_node *r2 = NODE(g, IR_OP_RESHAPE, "r2", 1, y, ci64(g, "s2", 2, (int64_t[]){2, -1}));
    ir_node *r3 =
        NODE(g, IR_OP_RESHAPE, "merge", 1, r1->out[0], ci64(g, "s3", 3, (int64_t[]){0, 0, 32}));
    ir_node *r4 = NODE(g, IR_OP_RESHAPE, "flat", 1, x, ci64(g, "s4", 2, (int64_t[]){-1, 32}));
    ir_value *dyn = val(g, IR_VAL_INPUT, "dyn", IR_DT_INT64, "3");
    ir_node *r5 = NODE(g, IR_OP_RESHAPE, "r_dyn", 1, x, dyn);
    ir_value *z = val(g, IR_VAL_INPUT, "z", IR_DT_FLOAT, "0,4");
    ir_node *r6 = NODE(g, IR_OP_RESHAPE, "r_allowzero", 1, z, ci64(g, "s6", 2, (int64_t[]){4, 0}));
    ir_attr_set_int(g, r6, "allowzero", 1);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(r1->out[0], "f32[batch,sequence,4,8]");
    assert_type(r2->out[0], "f32[2,6]");
    assert_type(r3->out[0], "f32[batch,sequence,32]");
    assert_type(r4->out[0], "f32[?,32]");
    assert_type(r5->out[0], "f32[?,?,?]");
    assert_type(r6->out[0], "f32[4,0]");

    ir_node *b1 = NODE(g, IR_OP_RESHAPE, "r_bad", 1, y, ci64(g, "b1", 2, (int64_t[]){5, -1}));
    INFER_ERR(t, b1);
    assert_true(diag_has(&t->diag, "node 'r_bad' (Reshape)", "'y'", "12 elements", "[5,-1]", NULL));
    ir_node *b2 = NODE(g, IR_OP_RESHAPE, "r_bad2", 1, y, ci64(g, "b2", 2, (int64_t[]){5, 3}));
    INFER_ERR(t, b2);
    assert_true(diag_has(&t->diag, "r_bad2", "12 elements", "15 elements", NULL));
    ir_node *b3 = NODE(g, IR_OP_RESHAPE, "r_m2", 1, y, ci64(g, "b3", 2, (int64_t[]){-2, 6}));
    INFER_ERR(t, b3);
    assert_true(diag_has(&t->diag, "r_m2", "input 1 ('b3')", "-2", "not a valid dimension", NULL));
    ir_node *b4 = NODE(g, IR_OP_RESHAPE, "r_two", 1, y, ci64(g, "b4", 2, (int64_t[]){-1, -1}));
    INFER_ERR(t, b4);
    assert_true(diag_has(&t->diag, "r_two", "more than one -1", NULL));
    tg_free(t);
}

static void test_flatten_transpose(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,4,8");
    ir_node *f1 = NODE(g, IR_OP_FLATTEN, "f1", 1, x);
    ir_node *f2 = NODE(g, IR_OP_FLATTEN, "f2", 1, x);
    ir_attr_set_int(g, f2, "axis", -2);
    ir_node *f3 = NODE(g, IR_OP_FLATTEN, "f3", 1, x);
    ir_attr_set_int(g, f3, "axis", 0);
    ir_node *tp = NODE(g, IR_OP_TRANSPOSE, "tp", 1, x);
    ir_attr_set_ints(g, tp, "perm", (int64_t[]){0, 2, 1, 3}, 4);
    ir_node *tr = NODE(g, IR_OP_TRANSPOSE, "trev", 1, x);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(f1->out[0], "f32[batch,?]");
    assert_type(f2->out[0], "f32[?,32]");
    assert_type(f3->out[0], "f32[1,?]");
    assert_type(tp->out[0], "f32[batch,4,sequence,8]");
    assert_type(tr->out[0], "f32[8,4,sequence,batch]");
    ir_node *bad = NODE(g, IR_OP_TRANSPOSE, "tp_bad", 1, x);
    ir_attr_set_ints(g, bad, "perm", (int64_t[]){0, 2, 2, 3}, 4);
    INFER_ERR(t, bad);
    assert_true(diag_has(&t->diag, "tp_bad", "not a permutation", NULL));
    tg_free(t);
}

static void test_slice(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,10");
    ir_value *big = val(g, IR_VAL_INPUT, "big", IR_DT_BOOL, "1,1,128,128");
    ir_value *imax = ci64(g, "imax", 1, (int64_t[]){INT64_MAX});
    ir_value *imin = ci64(g, "imin", 1, (int64_t[]){INT64_MIN});
    ir_value *ax2 = ci64(g, "ax2", 1, (int64_t[]){2});
    ir_value *axm1 = ci64(g, "axm1", 1, (int64_t[]){-1});
    /* x[..., -3:] */
    ir_node *s1 = NODE(g, IR_OP_SLICE, "s1", 1, x, ci64(g, "m3", 1, (int64_t[]){-3}), imax, ax2);
    /* x[..., ::-1] */
    ir_node *s2 = NODE(g, IR_OP_SLICE, "s2", 1, x, ci64(g, "m1", 1, (int64_t[]){-1}), imin, axm1,
                       ci64(g, "stepm1", 1, (int64_t[]){-1}));
    /* x[..., 1:8:3] -> 1,4,7 */
    ir_node *s3 =
        NODE(g, IR_OP_SLICE, "s3", 1, x, ci64(g, "one", 1, (int64_t[]){1}),
             ci64(g, "eight", 1, (int64_t[]){8}), ax2, ci64(g, "three", 1, (int64_t[]){3}));
    /* whole symbolic axis keeps its symbol; slicing into it does not */
    ir_node *s4 = NODE(g, IR_OP_SLICE, "s4", 1, x, ci64(g, "z", 1, (int64_t[]){0}), imax,
                       ci64(g, "ax1", 1, (int64_t[]){1}));
    ir_node *s5 = NODE(g, IR_OP_SLICE, "s5", 1, x, ci64(g, "z2", 1, (int64_t[]){0}),
                       ci64(g, "e5", 1, (int64_t[]){5}), ci64(g, "ax1b", 1, (int64_t[]){1}));
    /* the GPT-2 mask slice: bias[:, :, 0:64, :64] on axes 2,3, ends beyond clamp */
    ir_node *s6 =
        NODE(g, IR_OP_SLICE, "s6", 1, big, ci64(g, "zz", 2, (int64_t[]){0, 0}),
             ci64(g, "e6", 2, (int64_t[]){64, 1000}), ci64(g, "ax23", 2, (int64_t[]){2, 3}));
    /* start past the end: empty */
    ir_node *s7 = NODE(g, IR_OP_SLICE, "s7", 1, x, ci64(g, "st20", 1, (int64_t[]){20}), imax, ax2);
    ir_value *dyn = val(g, IR_VAL_INPUT, "dyn", IR_DT_INT64, "1");
    ir_node *s8 = NODE(g, IR_OP_SLICE, "s8", 1, x, dyn, imax, ax2);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(s1->out[0], "f32[batch,sequence,3]");
    assert_type(s2->out[0], "f32[batch,sequence,10]");
    assert_type(s3->out[0], "f32[batch,sequence,3]");
    assert_type(s4->out[0], "f32[batch,sequence,10]");
    assert_type(s5->out[0], "f32[batch,?,10]");
    assert_type(s6->out[0], "bool[1,1,64,128]");
    assert_type(s7->out[0], "f32[batch,sequence,0]");
    assert_type(s8->out[0], "f32[batch,sequence,?]");
    ir_node *bad = NODE(g, IR_OP_SLICE, "s_bad", 1, x, ci64(g, "zz2", 2, (int64_t[]){0, 0}), imax);
    INFER_ERR(t, bad);
    assert_true(diag_has(&t->diag, "s_bad", "2 starts", "1 ends", NULL));
    ir_node *bad2 = NODE(g, IR_OP_SLICE, "s_step0", 1, x, ci64(g, "z3", 1, (int64_t[]){0}), imax,
                         ax2, ci64(g, "step0", 1, (int64_t[]){0}));
    INFER_ERR(t, bad2);
    assert_true(diag_has(&t->diag, "s_step0", "step 0", NULL));
    tg_free(t);
}

static void test_split(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,96");
    ir_node *s1 = NODE(g, IR_OP_SPLIT, "qkv", 3, x, ci64(g, "sizes", 3, (int64_t[]){32, 32, 32}));
    ir_attr_set_int(g, s1, "axis", 2);
    ir_node *s2 = NODE(g, IR_OP_SPLIT, "even", 3, x);
    ir_attr_set_int(g, s2, "axis", -1);
    ir_node *s3 = NODE(g, IR_OP_SPLIT, "attr", 2, x);
    ir_attr_set_int(g, s3, "axis", 2);
    ir_attr_set_ints(g, s3, "split", (int64_t[]){64, 32}, 2);
    ir_node *s4 = NODE(g, IR_OP_SPLIT, "symbolic", 2, x);
    ir_attr_set_int(g, s4, "axis", 1);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    for (int i = 0; i < 3; i++) {
        assert_type(s1->out[i], "f32[batch,sequence,32]");
        assert_type(s2->out[i], "f32[batch,sequence,32]");
    }
    assert_type(s3->out[0], "f32[batch,sequence,64]");
    assert_type(s3->out[1], "f32[batch,sequence,32]");
    assert_type(s4->out[1], "f32[batch,?,96]");
    ir_node *bad = NODE(g, IR_OP_SPLIT, "split_bad", 2, x, ci64(g, "bad", 2, (int64_t[]){32, 32}));
    ir_attr_set_int(g, bad, "axis", 2);
    INFER_ERR(t, bad);
    assert_true(diag_has(&t->diag, "split_bad", "add up to 64", "96", NULL));
    ir_node *bad2 = NODE(g, IR_OP_SPLIT, "uneven", 5, x);
    ir_attr_set_int(g, bad2, "axis", 2);
    INFER_ERR(t, bad2);
    assert_true(diag_has(&t->diag, "uneven", "5 equal parts", NULL));
    tg_free(t);
}

static void test_expand_tile(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "1,3,1");
    ir_value *k = val(g, IR_VAL_INPUT, "k", IR_DT_FLOAT, "batch,2,1,sequence,8");
    ir_node *e1 = NODE(g, IR_OP_EXPAND, "e1", 1, x, ci64(g, "s1", 3, (int64_t[]){2, 1, 4}));
    ir_node *e2 = NODE(g, IR_OP_EXPAND, "e2", 1, x, ci64(g, "s2", 4, (int64_t[]){5, 1, 1, 1}));
    ir_node *e3 =
        NODE(g, IR_OP_EXPAND, "repeat_kv", 1, k, ci64(g, "s3", 5, (int64_t[]){1, 2, 2, 1, 8}));
    ir_node *t1 = NODE(g, IR_OP_TILE, "tile", 1, x, ci64(g, "rep", 3, (int64_t[]){2, 1, 3}));
    ir_node *t2 =
        NODE(g, IR_OP_TILE, "tile_sym", 1, k, ci64(g, "rep2", 5, (int64_t[]){1, 1, 2, 2, 1}));
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(e1->out[0], "f32[2,3,4]");
    assert_type(e2->out[0], "f32[5,1,3,1]");
    assert_type(e3->out[0], "f32[batch,2,2,sequence,8]");
    assert_type(t1->out[0], "f32[2,3,3]");
    assert_type(t2->out[0], "f32[batch,2,2,?,8]");
    ir_node *bad = NODE(g, IR_OP_EXPAND, "e_bad", 1, x, ci64(g, "s4", 3, (int64_t[]){1, 4, 1}));
    INFER_ERR(t, bad);
    assert_true(diag_has(&t->diag, "node 'e_bad' (Expand)", "'x'", "3", "4", "'s4'", NULL));
    ir_node *bad2 = NODE(g, IR_OP_EXPAND, "e_neg", 1, x, ci64(g, "s5", 3, (int64_t[]){1, -1, 1}));
    INFER_ERR(t, bad2);
    assert_true(diag_has(&t->diag, "e_neg", "input 1 ('s5')", "-1", NULL));
    tg_free(t);
}

static void test_generators(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_node *c1 =
        NODE(g, IR_OP_CONSTANT_OF_SHAPE, "cos1", 1, ci64(g, "sh", 2, (int64_t[]){64, 64}));
    ir_node *c2 = NODE(g, IR_OP_CONSTANT_OF_SHAPE, "cos2", 1, ci64(g, "sh1", 1, (int64_t[]){3}));
    set_tensor_attr(g, c2, "value",
                    ir_const_new(g, "one_t", IR_DT_INT64, 1, (int64_t[]){1}, (int64_t[]){1}));
    ir_node *r1 =
        NODE(g, IR_OP_RANGE, "range", 1, si64(g, "r0", 0), si64(g, "r10", 10), si64(g, "r3", 3));
    ir_node *r2 = NODE(g, IR_OP_RANGE, "range_neg", 1, si64(g, "q10", 10), si64(g, "q0", 0),
                       si64(g, "qm3", -3));
    ir_node *r3 =
        NODE(g, IR_OP_RANGE, "range_f", 1, sf32(g, "f0", 0), sf32(g, "f1", 1), sf32(g, "fd", 0.1f));
    ir_value *lim = val(g, IR_VAL_INPUT, "lim", IR_DT_INT64, "");
    ir_node *r4 = NODE(g, IR_OP_RANGE, "range_dyn", 1, si64(g, "d0", 0), lim, si64(g, "d1", 1));
    ir_node *r5 = NODE(g, IR_OP_RANGE, "range_empty", 1, si64(g, "e0", 5), si64(g, "e1", 2),
                       si64(g, "e2", 1));
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(c1->out[0], "f32[64,64]");
    assert_type(c2->out[0], "i64[3]");
    assert_type(r1->out[0], "i64[4]");
    assert_type(r2->out[0], "i64[4]");
    assert_type(r3->out[0], "f32[10]");
    assert_type(r4->out[0], "i64[?]");
    assert_type(r5->out[0], "i64[0]");
    ir_node *bad =
        NODE(g, IR_OP_CONSTANT_OF_SHAPE, "cos_bad", 1, ci64(g, "shb", 2, (int64_t[]){4, -3}));
    INFER_ERR(t, bad);
    assert_true(diag_has(&t->diag, "cos_bad", "-3", "not a valid dimension", NULL));
    ir_node *bad2 =
        NODE(g, IR_OP_RANGE, "range0", 1, si64(g, "z0", 0), si64(g, "z1", 4), si64(g, "z2", 0));
    INFER_ERR(t, bad2);
    assert_true(diag_has(&t->diag, "range0", "delta is 0", NULL));
    tg_free(t);
}

static void test_reduce(void **state)
{
    (void)state;
    tgraph *t = tg_new(18);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,32");
    ir_node *m1 = NODE(g, IR_OP_REDUCE_MEAN, "mean_attr", 1, x); /* opset < 18 form */
    ir_attr_set_ints(g, m1, "axes", (int64_t[]){-1}, 1);
    ir_node *m2 = NODE(g, IR_OP_REDUCE_MEAN, "mean_in", 1, x, ci64(g, "axm1", 1, (int64_t[]){-1}));
    ir_node *s1 =
        NODE(g, IR_OP_REDUCE_SUM, "sum_nokeep", 1, x, ci64(g, "ax01", 2, (int64_t[]){0, 1}));
    ir_attr_set_int(g, s1, "keepdims", 0);
    ir_node *s2 = NODE(g, IR_OP_REDUCE_SUM, "sum_all", 1, x);
    ir_attr_set_int(g, s2, "keepdims", 0);
    ir_node *s3 = NODE(g, IR_OP_REDUCE_SUM, "sum_noop", 1, x, ci64(g, "none", 0, NULL));
    ir_attr_set_int(g, s3, "noop_with_empty_axes", 1);
    ir_node *mx = NODE(g, IR_OP_REDUCE_MAX, "max_keep_all", 1, x);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(m1->out[0], "f32[batch,sequence,1]");
    assert_type(m2->out[0], "f32[batch,sequence,1]");
    assert_type(s1->out[0], "f32[32]");
    assert_type(s2->out[0], "f32[]");
    assert_type(s3->out[0], "f32[batch,sequence,32]");
    assert_type(mx->out[0], "f32[1,1,1]");
    ir_node *bad = NODE(g, IR_OP_REDUCE_SUM, "sum_bad", 1, x, ci64(g, "ax5", 1, (int64_t[]){5}));
    INFER_ERR(t, bad);
    assert_true(diag_has(&t->diag, "sum_bad", "axis 5 is out of range", NULL));
    tg_free(t);
}

static void test_norms_and_losses(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,32");
    ir_value *gam = val(g, IR_VAL_PARAM, "gamma", IR_DT_FLOAT, "32");
    ir_value *bet = val(g, IR_VAL_PARAM, "beta", IR_DT_FLOAT, "32");
    ir_node *ln = NODE(g, IR_OP_LAYER_NORMALIZATION, "ln", 3, x, gam, bet);
    ir_node *ln2 = NODE(g, IR_OP_LAYER_NORMALIZATION, "ln_axis1", 3, x, gam, bet);
    ir_attr_set_int(g, ln2, "axis", 2);
    ir_node *sln = NODE(g, IR_OP_SIMPLIFIED_LAYER_NORM, "sln", 2, x, gam);
    ir_value *logits = val(g, IR_VAL_INPUT, "logits", IR_DT_FLOAT, "N,64");
    ir_value *labels = val(g, IR_VAL_INPUT, "labels", IR_DT_INT64, "N");
    ir_node *ce = NODE(g, IR_OP_SOFTMAX_CE_LOSS, "ce", 2, logits, labels);
    ir_node *ce2 = NODE(g, IR_OP_SOFTMAX_CE_LOSS, "ce_none", 1, logits, labels);
    ir_attr_set_string(g, ce2, "reduction", "none");
    ir_value *s3 = val(g, IR_VAL_INPUT, "s3", IR_DT_FLOAT, "batch,64,sequence");
    ir_value *l3 = val(g, IR_VAL_INPUT, "l3", IR_DT_INT64, "batch,sequence");
    ir_node *nll = NODE(g, IR_OP_NLL_LOSS, "nll", 1, s3, l3);
    ir_attr_set_string(g, nll, "reduction", "none");
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(ln->out[0], "f32[batch,sequence,32]");
    assert_type(ln->out[1], "f32[batch,sequence,1]");
    assert_type(ln->out[2], "f32[batch,sequence,1]");
    assert_type(ln2->out[1], "f32[batch,sequence,1]");
    assert_type(sln->out[1], "f32[batch,sequence,1]");
    assert_type(ce->out[0], "f32[]");
    assert_type(ce->out[1], "f32[N,64]");
    assert_type(ce2->out[0], "f32[N]");
    assert_type(nll->out[0], "f32[batch,sequence]");
    ir_value *bad_lab = val(g, IR_VAL_INPUT, "bad_lab", IR_DT_INT64, "batch,7");
    ir_value *s4 = val(g, IR_VAL_INPUT, "s4", IR_DT_FLOAT, "batch,64,8");
    ir_node *bad = NODE(g, IR_OP_SOFTMAX_CE_LOSS, "ce_bad", 1, s4, bad_lab);
    INFER_ERR(t, bad);
    assert_true(diag_has(&t->diag, "ce_bad", "input 1 ('bad_lab')", "7", "8", NULL));
    ir_value *g16 = val(g, IR_VAL_PARAM, "g16", IR_DT_FLOAT, "16");
    ir_node *bad2 = NODE(g, IR_OP_LAYER_NORMALIZATION, "ln_bad", 1, x, g16);
    INFER_ERR(t, bad2);
    assert_true(diag_has(&t->diag, "ln_bad", "input 1 ('g16')", NULL));
    tg_free(t);
}

/* Inference keeps declared facts it cannot derive, and reports a known fact contradicting them. */
static void test_merge_with_declared(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,32");
    ir_value *dyn = val(g, IR_VAL_INPUT, "dyn", IR_DT_INT64, "3");
    ir_value *decl = val(g, IR_VAL_NODE, "decl", IR_DT_FLOAT, "batch,sequence,32");
    ir_node *r = ir_node_new_with_outputs(g, IR_OP_RESHAPE, "r", NULL, 2, (ir_value *[]){x, dyn}, 1,
                                          (ir_value *[]){decl});
    INFER_OK(t, r);
    assert_type(decl, "f32[batch,sequence,32]"); /* kept, not wiped to [?,?,?] */
    ir_value *decl2 = val(g, IR_VAL_NODE, "decl2", IR_DT_FLOAT, "batch,sequence,16");
    ir_node *a = ir_node_new_with_outputs(g, IR_OP_RELU, "relu", NULL, 1, (ir_value *[]){x}, 1,
                                          (ir_value *[]){decl2});
    INFER_ERR(t, a);
    assert_true(diag_has(&t->diag, "relu", "output 0 ('decl2')", "[batch,sequence,32]",
                         "[batch,sequence,16]", NULL));
    tg_free(t);
}

/* ir_infer_graph reports every broken node, and unknown inputs are never errors. */
static void test_graph_reports_all(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *a = val(g, IR_VAL_INPUT, "a", IR_DT_FLOAT, "2,3");
    ir_value *b = val(g, IR_VAL_INPUT, "b", IR_DT_FLOAT, "4,5");
    ir_value *u = ir_value_new(g, "u", IR_VAL_INPUT, IR_DT_FLOAT, -1, NULL);
    NODE(g, IR_OP_MATMUL, "first", 1, a, b);
    ir_node *ok = NODE(g, IR_OP_MATMUL, "unknown_ok", 1, u, b);
    NODE(g, IR_OP_ADD, "second", 1, a, b);
    assert_int_equal(ir_infer_graph(g), IR_ERR);
    assert_int_equal(t->diag.n_errors, 2);
    assert_true(diag_has(&t->diag, "first", NULL));
    assert_true(diag_has(&t->diag, "second", NULL));
    assert_type(ok->out[0], "f32[?]");
    tg_free(t);
}

/* The builder runs inference: ir_node_new types its outputs. */
static void test_node_new_infers(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,32");
    ir_node *n = ir_node_new(g, IR_OP_SILU, "silu", 1, (ir_value *[]){x}, 1);
    assert_non_null(n);
    assert_type(n->out[0], "f32[batch,sequence,32]");
    tg_free(t);
}

/* GatherND: out = indices.shape[:-1] ++ data.shape[batch_dims + k:] (k = indices' last dim),
 * symbolic dims carried through; k + batch_dims beyond the data's rank, batch_dims out of
 * range and non-int64 indices are errors. ScatterND: data's type. */
static void test_gather_scatter_nd(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "batch,sequence,5,7");
    ir_value *i1 = val(g, IR_VAL_INPUT, "i1", IR_DT_INT64, "3,4,1");
    ir_value *i2 = val(g, IR_VAL_INPUT, "i2", IR_DT_INT64, "6,2");
    ir_value *i4 = val(g, IR_VAL_INPUT, "i4", IR_DT_INT64, "9,4");
    ir_value *ib = val(g, IR_VAL_INPUT, "ib", IR_DT_INT64, "batch,11,2");
    ir_value *iu = val(g, IR_VAL_INPUT, "iu", IR_DT_INT64, "8,?");
    ir_node *n1 = NODE(g, IR_OP_GATHER_ND, "gnd1", 1, x, i1);
    INFER_OK(t, n1);
    assert_type(n1->out[0], "f32[3,4,sequence,5,7]");
    ir_node *n2 = NODE(g, IR_OP_GATHER_ND, "gnd2", 1, x, i2);
    INFER_OK(t, n2);
    assert_type(n2->out[0], "f32[6,5,7]");
    ir_node *n4 = NODE(g, IR_OP_GATHER_ND, "gnd4", 1, x, i4); /* k = rank: elements */
    INFER_OK(t, n4);
    assert_type(n4->out[0], "f32[9]");
    ir_node *nb = NODE(g, IR_OP_GATHER_ND, "gnd_b1", 1, x, ib);
    ir_attr_set_int(g, nb, "batch_dims", 1);
    INFER_OK(t, nb);
    assert_type(nb->out[0], "f32[batch,11,7]"); /* [batch,11] ++ x.shape[1 + 2:] */
    ir_node *nu = NODE(g, IR_OP_GATHER_ND, "gnd_u", 1, x, iu); /* k unknown: rank unknown */
    INFER_OK(t, nu);
    assert_int_equal(nu->out[0]->dtype, IR_DT_FLOAT);
    assert_int_equal(nu->out[0]->rank, -1);
    /* errors */
    ir_value *i5 = val(g, IR_VAL_INPUT, "i5", IR_DT_INT64, "2,5");
    ir_node *e1 = NODE(g, IR_OP_GATHER_ND, "gnd_k_big", 1, x, i5);
    INFER_ERR(t, e1);
    assert_true(diag_has(&t->diag, "gnd_k_big", "GatherND", "exceeds the rank", NULL));
    ir_node *e2 = NODE(g, IR_OP_GATHER_ND, "gnd_kb_big", 1, x, i2 /* k = 2 */);
    ir_attr_set_int(g, e2, "batch_dims", 3);
    INFER_ERR(t, e2);
    assert_true(diag_has(&t->diag, "gnd_kb_big", NULL));
    ir_node *e3 = NODE(g, IR_OP_GATHER_ND, "gnd_neg_b", 1, x, i2);
    ir_attr_set_int(g, e3, "batch_dims", -1);
    INFER_ERR(t, e3);
    assert_true(diag_has(&t->diag, "gnd_neg_b", "batch_dims -1", NULL));
    ir_value *i32 = val(g, IR_VAL_INPUT, "i32", IR_DT_INT32, "6,2");
    ir_node *e4 = NODE(g, IR_OP_GATHER_ND, "gnd_i32", 1, x, i32);
    INFER_ERR(t, e4);
    assert_true(diag_has(&t->diag, "gnd_i32", "input 1 ('i32')", "int64", NULL));
    /* ScatterND */
    ir_value *up = val(g, IR_VAL_INPUT, "up", IR_DT_FLOAT, "6,5,7");
    ir_node *s1 = NODE(g, IR_OP_SCATTER_ND, "snd", 1, x, i2, up);
    INFER_OK(t, s1);
    assert_type(s1->out[0], "f32[batch,sequence,5,7]");
    ir_node *s2 = NODE(g, IR_OP_SCATTER_ND, "snd_i32", 1, x, i32, up);
    INFER_ERR(t, s2);
    assert_true(diag_has(&t->diag, "snd_i32", "ScatterND", "int64", NULL));
    tg_free(t);
}

/* IsNaN and IsInf give bool of the input's shape; Xor too (broadcast); CumSum of a bool is not
 * valid ONNX and is refused, of an integer it is fine. */
static void test_isnan_isinf_cumsum(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *p = val(g, IR_VAL_INPUT, "p", IR_DT_FLOAT, "batch,4,sequence,sequence");
    ir_node *n1 = NODE(g, IR_OP_IS_NAN, "isnan", 1, p);
    INFER_OK(t, n1);
    assert_type(n1->out[0], "bool[batch,4,sequence,sequence]");
    ir_node *n2 = NODE(g, IR_OP_IS_INF, "isinf", 1, p);
    INFER_OK(t, n2);
    assert_type(n2->out[0], "bool[batch,4,sequence,sequence]");
    ir_value *a = val(g, IR_VAL_INPUT, "a", IR_DT_BOOL, "batch,1,sequence");
    ir_value *b = val(g, IR_VAL_INPUT, "b", IR_DT_BOOL, "3,1");
    ir_node *n3 = NODE(g, IR_OP_XOR, "xor", 1, a, b);
    INFER_OK(t, n3);
    assert_type(n3->out[0], "bool[batch,3,sequence]");
    ir_node *c1 = NODE(g, IR_OP_CUMSUM, "/model/CumSum", 1, a, si64(g, "ax", -1));
    INFER_ERR(t, c1);
    assert_true(diag_has(&t->diag, "/model/CumSum", "CumSum", "input 0 ('a')", "bool",
                         "not valid ONNX", NULL));
    ir_value *m = val(g, IR_VAL_INPUT, "m", IR_DT_INT64, "batch,sequence");
    ir_node *c2 = NODE(g, IR_OP_CUMSUM, "cumsum_i64", 1, m, si64(g, "ax1", 1));
    INFER_OK(t, c2);
    assert_type(c2->out[0], "i64[batch,sequence]");
    tg_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_broadcast_symbolic),
        cmocka_unit_test(test_broadcast_error),
        cmocka_unit_test(test_where_cast_dropout),
        cmocka_unit_test(test_shape_size),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_gemm_linear_embedding),
        cmocka_unit_test(test_gather),
        cmocka_unit_test(test_unsqueeze_squeeze),
        cmocka_unit_test(test_concat),
        cmocka_unit_test(test_reshape),
        cmocka_unit_test(test_flatten_transpose),
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_expand_tile),
        cmocka_unit_test(test_generators),
        cmocka_unit_test(test_reduce),
        cmocka_unit_test(test_norms_and_losses),
        cmocka_unit_test(test_merge_with_declared),
        cmocka_unit_test(test_graph_reports_all),
        cmocka_unit_test(test_node_new_infers),
        cmocka_unit_test(test_gather_scatter_nd),
        cmocka_unit_test(test_isnan_isinf_cumsum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
