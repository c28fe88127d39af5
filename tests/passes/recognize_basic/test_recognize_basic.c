/* test_recognize_basic.c — unit tests of the norm, activation, Linear, Embedding and loss
 * recognisers (passes/graph/recognize_{norms,activations,linear,embedding,loss}.c).
 *
 * Each test builds, by hand, the ONNX pattern an exporter writes (after bind-dims and fold:
 * constants are constants), runs one recogniser and dce, and checks the semantic op made, its
 * operands and attributes — or that a near miss (wrong axis, wrong constant, an intermediate
 * read elsewhere, a broadcast, an unsupported reduction) was left alone. The verifier must pass
 * afterwards. The patterns the real fixtures contain are covered by the golden/fixture tests;
 * these cover the variants the fixtures do not (Casts that fold would remove, other spellings of
 * rsqrt, operand orders, missing gamma/beta, Gemm flags, the NLL form of the loss).
 */
#include "../pass_test.h"

#include <math.h>

#include "recognize.h"

/* ---------------------------------------------------------------- helpers */

/* Infers, runs the recogniser and dce, verifies; fails the test on any error. */
static void run(tgraph *t, int (*rec)(ir_graph *))
{
    if (ir_infer_graph(t->g) != IR_OK || rec(t->g) != IR_OK || sbp_pass_dce(t->g) != IR_OK ||
        ir_verify(t->g) != IR_OK) {
        diag_dump(&t->diag);
        fail_msg("recogniser or verifier failed");
    }
    assert_int_equal(t->diag.n_errors, 0);
}

/* The only live node with op `op` (fails unless there is exactly one). */
static ir_node *only(const ir_graph *g, ir_op op)
{
    ir_node *found = NULL;
    for (int i = 0; i < g->n_nodes; i++)
        if (!g->nodes[i]->dead && g->nodes[i]->op == op) {
            assert_null(found);
            found = g->nodes[i];
        }
    assert_non_null(found);
    return found;
}

static ir_value *f32c(ir_graph *g, float x) { return sf32(g, "c", x); }

static ir_node *reduce_mean(ir_graph *g, ir_value *x, int64_t axis)
{
    ir_node *n = NODE(g, IR_OP_REDUCE_MEAN, "mean", 1, x);
    ir_attr_set_ints(g, n, "axes", &axis, 1);
    ir_attr_set_int(g, n, "keepdims", 1);
    return n;
}

static ir_node *cast_f32(ir_graph *g, ir_value *x)
{
    ir_node *n = NODE(g, IR_OP_CAST, "cast", 1, x);
    ir_attr_set_int(g, n, "to", IR_DT_FLOAT);
    return n;
}

/* ---------------------------------------------------------------- norms */

/* Hugging Face RMSNorm as TorchScript writes it, with the float32 up-cast Casts that fold would
 * normally remove: the front Cast also feeds the residual Add. */
static void test_rmsnorm_hf_casts(void **state)
{
    (void)state;
    tgraph *t = tg_new(14);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,8,16");
    ir_value *w = val(g, IR_VAL_PARAM, "w", IR_DT_FLOAT, "16");
    ir_value *c = cast_f32(g, x)->out[0];
    ir_value *p = NODE(g, IR_OP_POW, "pow", 1, c, f32c(g, 2))->out[0];
    ir_value *m = reduce_mean(g, p, -1)->out[0];
    ir_value *a = NODE(g, IR_OP_ADD, "add", 1, m, f32c(g, 1e-6f))->out[0];
    ir_value *s = NODE(g, IR_OP_SQRT, "sqrt", 1, a)->out[0];
    ir_value *r = NODE(g, IR_OP_DIV, "div", 1, f32c(g, 1), s)->out[0];
    ir_value *y = NODE(g, IR_OP_MUL, "mul", 1, c, r)->out[0];
    ir_value *y2 = cast_f32(g, y)->out[0];
    ir_value *o = NODE(g, IR_OP_MUL, "mul_w", 1, w, y2)->out[0];
    ir_value *res = NODE(g, IR_OP_ADD, "residual", 1, c, o)->out[0];
    add_output(g, res);
    run(t, sbp_recognize_norms);
    ir_node *n = only(g, IR_OP_RMS_NORM);
    assert_ptr_equal(n->in[0], x);
    assert_ptr_equal(n->in[1], w);
    assert_ptr_equal(n->out[0], o); /* the result value keeps its name */
    assert_true(fabs(ir_attr_float(n, "epsilon", 0) - 1e-6) < 1e-12);
    ir_node *add = only(g, IR_OP_ADD);
    assert_ptr_equal(add->in[0], x); /* the identity Cast is gone */
    assert_int_equal(ir_graph_count_op(g, IR_OP_CAST), 0);
    assert_int_equal(g->n_nodes, 2);
    tg_free(t);
}

/* Reciprocal(Sqrt) spelling, gamma on the right, reduction axis given as rank-1. */
static void test_rmsnorm_reciprocal(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,4,8,4");
    ir_value *w = val(g, IR_VAL_PARAM, "w", IR_DT_FLOAT, "4");
    ir_value *p = NODE(g, IR_OP_MUL, "sq", 1, x, x)->out[0];
    ir_value *m = reduce_mean(g, p, 3)->out[0];
    ir_value *a = NODE(g, IR_OP_ADD, "add", 1, f32c(g, 1e-5f), m)->out[0];
    ir_value *s = NODE(g, IR_OP_SQRT, "sqrt", 1, a)->out[0];
    ir_value *r = NODE(g, IR_OP_RECIPROCAL, "rcp", 1, s)->out[0];
    ir_value *y = NODE(g, IR_OP_MUL, "mul", 1, r, x)->out[0];
    ir_value *o = NODE(g, IR_OP_MUL, "mul_w", 1, y, w)->out[0];
    add_output(g, o);
    run(t, sbp_recognize_norms);
    ir_node *n = only(g, IR_OP_RMS_NORM);
    assert_ptr_equal(n->in[0], x);
    assert_ptr_equal(n->in[1], w);
    assert_int_equal(g->n_nodes, 1);
    assert_true(g->outputs[0] == o && o->producer == n);
    tg_free(t);
}

/* Without gamma: RMSNorm(x) with one input. */
static void test_rmsnorm_no_gamma(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "3,16");
    ir_value *p = NODE(g, IR_OP_POW, "pow", 1, x, f32c(g, 2))->out[0];
    ir_value *m = reduce_mean(g, p, -1)->out[0];
    ir_value *a = NODE(g, IR_OP_ADD, "add", 1, m, f32c(g, 1e-6f))->out[0];
    ir_value *s = NODE(g, IR_OP_POW, "rsqrt", 1, a, f32c(g, -0.5f))->out[0];
    ir_value *y = NODE(g, IR_OP_MUL, "mul", 1, x, s)->out[0];
    add_output(g, y);
    run(t, sbp_recognize_norms);
    ir_node *n = only(g, IR_OP_RMS_NORM);
    assert_int_equal(n->n_in, 1);
    assert_int_equal(g->n_nodes, 1);
    tg_free(t);
}

/* Near misses: the mean over a non-last axis; an intermediate read outside the pattern. */
static void test_rmsnorm_near_misses(void **state)
{
    (void)state;
    for (int variant = 0; variant < 2; variant++) {
        tgraph *t = tg_new(17);
        ir_graph *g = t->g;
        ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,8,16");
        ir_value *w = val(g, IR_VAL_PARAM, "w", IR_DT_FLOAT, "16");
        ir_value *p = NODE(g, IR_OP_POW, "pow", 1, x, f32c(g, 2))->out[0];
        ir_value *m = reduce_mean(g, p, variant == 0 ? 1 : -1)->out[0];
        ir_value *a = NODE(g, IR_OP_ADD, "add", 1, m, f32c(g, 1e-6f))->out[0];
        ir_value *s = NODE(g, IR_OP_SQRT, "sqrt", 1, a)->out[0];
        ir_value *y = NODE(g, IR_OP_DIV, "div", 1, x, s)->out[0];
        ir_value *o = NODE(g, IR_OP_MUL, "mul_w", 1, y, w)->out[0];
        add_output(g, o);
        if (variant == 1)
            add_output(g, s); /* the rsqrt is wanted elsewhere */
        run(t, sbp_recognize_norms);
        assert_int_equal(ir_graph_count_op(g, IR_OP_RMS_NORM), 0);
        tg_free(t);
    }
}

/* The opset-14 TorchScript LayerNorm: x - mean, Pow 2, mean, + eps, Sqrt, Div, * gamma, + beta. */
static void build_layernorm(ir_graph *g, ir_value *x, ir_value *gamma, ir_value *beta)
{
    ir_value *mu = reduce_mean(g, x, -1)->out[0];
    ir_value *d = NODE(g, IR_OP_SUB, "sub", 1, x, mu)->out[0];
    ir_value *p = NODE(g, IR_OP_POW, "pow", 1, d, f32c(g, 2))->out[0];
    ir_value *v = reduce_mean(g, p, -1)->out[0];
    ir_value *a = NODE(g, IR_OP_ADD, "add", 1, v, f32c(g, 1e-5f))->out[0];
    ir_value *s = NODE(g, IR_OP_SQRT, "sqrt", 1, a)->out[0];
    ir_value *y = NODE(g, IR_OP_DIV, "div", 1, d, s)->out[0];
    if (gamma)
        y = NODE(g, IR_OP_MUL, "mul", 1, y, gamma)->out[0];
    if (beta)
        y = NODE(g, IR_OP_ADD, "add_b", 1, beta, y)->out[0];
    add_output(g, y);
}

static void test_layernorm_decomposed(void **state)
{
    (void)state;
    for (int variant = 0; variant < 4; variant++) {
        tgraph *t = tg_new(14);
        ir_graph *g = t->g;
        ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,8,16");
        ir_value *w = val(g, IR_VAL_PARAM, "w", IR_DT_FLOAT, "16");
        ir_value *b = val(g, IR_VAL_PARAM, "b", IR_DT_FLOAT, "16");
        bool has_w = variant == 0 || variant == 1, has_b = variant == 0 || variant == 2;
        build_layernorm(g, x, has_w ? w : NULL, has_b ? b : NULL);
        run(t, sbp_recognize_norms);
        ir_node *n = only(g, IR_OP_LAYER_NORM);
        assert_int_equal(g->n_nodes, 1);
        assert_ptr_equal(n->in[0], x);
        if (has_w) {
            assert_ptr_equal(n->in[1], w);
        } else { /* a ones constant */
            assert_true(ir_value_is_const(n->in[1]));
            assert_true(ir_const_f64(n->in[1], 15) == 1.0);
        }
        assert_int_equal(n->n_in, has_b ? 3 : 2);
        if (has_b)
            assert_ptr_equal(n->in[2], b);
        assert_true(fabs(ir_attr_float(n, "epsilon", 0) - 1e-5) < 1e-11);
        assert_ptr_equal(g->outputs[0]->producer, n);
        tg_free(t);
    }
}

/* ONNX LayerNormalization (opset 17) and the contrib SimplifiedLayerNormalization. */
static void test_norm_onnx_ops(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,8,16");
    ir_value *w = val(g, IR_VAL_PARAM, "w", IR_DT_FLOAT, "16");
    ir_value *b = val(g, IR_VAL_PARAM, "b", IR_DT_FLOAT, "16");
    ir_node *ln = NODE(g, IR_OP_LAYER_NORMALIZATION, "ln", 1, x, w, b);
    ir_attr_set_int(g, ln, "axis", -1);
    ir_attr_set_float(g, ln, "epsilon", 1e-5);
    ir_node *sl = NODE(g, IR_OP_SIMPLIFIED_LAYER_NORM, "sln", 1, ln->out[0], w);
    ir_attr_set_float(g, sl, "epsilon", 1e-6);
    ir_value *w2 = val(g, IR_VAL_PARAM, "w2", IR_DT_FLOAT, "8,16");
    ir_node *ln1 = NODE(g, IR_OP_LAYER_NORMALIZATION, "ln_axis1", 1, sl->out[0], w2);
    ir_attr_set_int(g, ln1, "axis", 1); /* over [8,16]: not a LayerNorm of the last axis */
    add_output(g, ln1->out[0]);
    run(t, sbp_recognize_norms);
    assert_int_equal(ir_graph_count_op(g, IR_OP_LAYER_NORM), 1);
    assert_int_equal(ir_graph_count_op(g, IR_OP_RMS_NORM), 1);
    assert_int_equal(ir_graph_count_op(g, IR_OP_LAYER_NORMALIZATION), 1);
    ir_node *n = only(g, IR_OP_RMS_NORM);
    assert_true(fabs(ir_attr_float(n, "epsilon", 0) - 1e-6) < 1e-12);
    tg_free(t);
}

/* ---------------------------------------------------------------- activations */

/* GPT-2's NewGELUActivation as TorchScript writes it. */
static ir_value *gelu_gpt2(ir_graph *g, ir_value *x, float k)
{
    ir_value *h = NODE(g, IR_OP_MUL, "half", 1, x, f32c(g, 0.5f))->out[0];
    ir_value *cube = NODE(g, IR_OP_POW, "cube", 1, x, f32c(g, 3))->out[0];
    ir_value *ac = NODE(g, IR_OP_MUL, "ac", 1, cube, f32c(g, 0.044715f))->out[0];
    ir_value *in = NODE(g, IR_OP_ADD, "in", 1, x, ac)->out[0];
    ir_value *kin = NODE(g, IR_OP_MUL, "kin", 1, in, f32c(g, k))->out[0];
    ir_value *th = NODE(g, IR_OP_TANH, "tanh", 1, kin)->out[0];
    ir_value *u = NODE(g, IR_OP_ADD, "one_plus", 1, th, f32c(g, 1))->out[0];
    return NODE(g, IR_OP_MUL, "gelu", 1, h, u)->out[0];
}

static void test_gelu_tanh(void **state)
{
    (void)state;
    tgraph *t = tg_new(14);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,8,64");
    ir_value *y = gelu_gpt2(g, x, 0.7978845834732056f);
    add_output(g, y);
    run(t, sbp_recognize_activations);
    ir_node *n = only(g, IR_OP_GELU);
    assert_ptr_equal(n->in[0], x);
    assert_string_equal(ir_attr_string(n, "approximate", ""), "tanh");
    assert_int_equal(g->n_nodes, 1);
    tg_free(t);
}

/* Another order: x * (0.5 * (1 + tanh(k*x + k*a*x*x*x))), distributed, cube as x*x*x. */
static void test_gelu_tanh_other_order(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "4,32");
    const double k = 0.7978845608028654;
    ir_value *kx = NODE(g, IR_OP_MUL, "kx", 1, f32c(g, (float)k), x)->out[0];
    ir_value *xx = NODE(g, IR_OP_MUL, "xx", 1, x, x)->out[0];
    ir_value *xxx = NODE(g, IR_OP_MUL, "xxx", 1, xx, x)->out[0];
    ir_value *kax3 = NODE(g, IR_OP_MUL, "kax3", 1, xxx, f32c(g, (float)(k * 0.044715)))->out[0];
    ir_value *arg = NODE(g, IR_OP_ADD, "arg", 1, kx, kax3)->out[0];
    ir_value *th = NODE(g, IR_OP_TANH, "tanh", 1, arg)->out[0];
    ir_value *u = NODE(g, IR_OP_ADD, "one_plus", 1, f32c(g, 1), th)->out[0];
    ir_value *hu = NODE(g, IR_OP_MUL, "hu", 1, f32c(g, 0.5f), u)->out[0];
    ir_value *y = NODE(g, IR_OP_MUL, "gelu", 1, x, hu)->out[0];
    add_output(g, y);
    run(t, sbp_recognize_activations);
    ir_node *n = only(g, IR_OP_GELU);
    assert_ptr_equal(n->in[0], x);
    assert_string_equal(ir_attr_string(n, "approximate", ""), "tanh");
    tg_free(t);
}

/* A wrong constant (sqrt(2/pi) off by 1e-3) is not GELU. */
static void test_gelu_wrong_constant(void **state)
{
    (void)state;
    tgraph *t = tg_new(14);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,8,64");
    add_output(g, gelu_gpt2(g, x, 0.7987f));
    run(t, sbp_recognize_activations);
    assert_int_equal(ir_graph_count_op(g, IR_OP_GELU), 0);
    assert_int_equal(ir_graph_count_op(g, IR_OP_TANH), 1);
    tg_free(t);
}

/* torch's exact GELU below opset 20: Div(x, sqrt 2), Erf, Add 1, Mul x, Mul 0.5. */
static void test_gelu_erf(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,8,64");
    ir_value *d = NODE(g, IR_OP_DIV, "div", 1, x, f32c(g, 1.4142135381698608f))->out[0];
    ir_value *e = NODE(g, IR_OP_ERF, "erf", 1, d)->out[0];
    ir_value *u = NODE(g, IR_OP_ADD, "add", 1, e, f32c(g, 1))->out[0];
    ir_value *xu = NODE(g, IR_OP_MUL, "xu", 1, x, u)->out[0];
    ir_value *y = NODE(g, IR_OP_MUL, "half", 1, xu, f32c(g, 0.5f))->out[0];
    add_output(g, y);
    run(t, sbp_recognize_activations);
    ir_node *n = only(g, IR_OP_GELU);
    assert_string_equal(ir_attr_string(n, "approximate", ""), "none");
    assert_int_equal(g->n_nodes, 1);
    tg_free(t);
}

/* ONNX's own Gelu (opset 20, the dynamo exporter): the semantic Gelu with the same
 * approximate ("none" when absent); any other value is an error naming the node. */
static void test_gelu_onnx(void **state)
{
    (void)state;
    const char *attr[3] = {"tanh", "none", NULL};
    for (int k = 0; k < 3; k++) {
        tgraph *t = tg_new(20);
        ir_graph *g = t->g;
        ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,8,64");
        ir_node *gl = NODE(g, IR_OP_GELU_ONNX, "gelu_onnx", 1, x);
        if (attr[k])
            ir_attr_set_string(g, gl, "approximate", attr[k]);
        add_output(g, gl->out[0]);
        run(t, sbp_recognize_activations);
        ir_node *n = only(g, IR_OP_GELU);
        assert_ptr_equal(n->in[0], x);
        assert_ptr_equal(n->out[0], g->outputs[0]);
        assert_string_equal(ir_attr_string(n, "approximate", ""), attr[k] ? attr[k] : "none");
        assert_int_equal(ir_graph_count_op(g, IR_OP_GELU_ONNX), 0);
        tg_free(t);
    }
    tgraph *t = tg_new(20);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,8,64");
    ir_node *gl = NODE(g, IR_OP_GELU_ONNX, "gelu_fast", 1, x);
    ir_attr_set_string(g, gl, "approximate", "fast");
    add_output(g, gl->out[0]);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_int_equal(sbp_recognize_activations(g), IR_ERR);
    assert_true(t->diag.n_errors > 0);
    const ir_diag_entry *e = &t->diag.entries[t->diag.n - 1];
    assert_non_null(e->node);
    assert_string_equal(e->node, "gelu_fast");
    assert_non_null(strstr(e->msg, "\"fast\""));
    tg_free(t);
}

/* Llama's MLP: silu(gate) * up in both orders; the Silu node is absorbed. */
static void test_swiglu(void **state)
{
    (void)state;
    for (int order = 0; order < 2; order++) {
        tgraph *t = tg_new(17);
        ir_graph *g = t->g;
        ir_value *gate = val(g, IR_VAL_INPUT, "gate", IR_DT_FLOAT, "2,8,64");
        ir_value *up = val(g, IR_VAL_INPUT, "up", IR_DT_FLOAT, "2,8,64");
        ir_value *s = NODE(g, IR_OP_SIGMOID, "sig", 1, gate)->out[0];
        ir_value *si = order ? NODE(g, IR_OP_MUL, "silu", 1, s, gate)->out[0]
                             : NODE(g, IR_OP_MUL, "silu", 1, gate, s)->out[0];
        ir_value *y = order ? NODE(g, IR_OP_MUL, "glu", 1, up, si)->out[0]
                            : NODE(g, IR_OP_MUL, "glu", 1, si, up)->out[0];
        add_output(g, y);
        run(t, sbp_recognize_activations);
        ir_node *n = only(g, IR_OP_SWIGLU);
        assert_ptr_equal(n->in[0], gate);
        assert_ptr_equal(n->in[1], up);
        assert_int_equal(g->n_nodes, 1);
        tg_free(t);
    }
}

/* Silu read twice: SwiGLU is made, the Silu stays for its other reader; a broadcast up is not
 * SwiGLU. */
static void test_silu_shared_and_broadcast(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *gate = val(g, IR_VAL_INPUT, "gate", IR_DT_FLOAT, "2,8,64");
    ir_value *up = val(g, IR_VAL_INPUT, "up", IR_DT_FLOAT, "2,8,64");
    ir_value *up1 = val(g, IR_VAL_INPUT, "up1", IR_DT_FLOAT, "1,8,64");
    ir_value *s = NODE(g, IR_OP_SIGMOID, "sig", 1, gate)->out[0];
    ir_value *si = NODE(g, IR_OP_MUL, "silu", 1, gate, s)->out[0];
    ir_value *y = NODE(g, IR_OP_MUL, "glu", 1, si, up)->out[0];
    ir_value *z = NODE(g, IR_OP_MUL, "bcast", 1, si, up1)->out[0];
    add_output(g, y);
    add_output(g, z);
    run(t, sbp_recognize_activations);
    assert_int_equal(ir_graph_count_op(g, IR_OP_SILU), 1);
    assert_int_equal(ir_graph_count_op(g, IR_OP_SWIGLU), 1);
    assert_int_equal(ir_graph_count_op(g, IR_OP_MUL), 1);
    tg_free(t);
}

/* ---------------------------------------------------------------- Linear */

static void test_linear_matmul_bias(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,8,16");
    ir_value *w = val(g, IR_VAL_PARAM, "w", IR_DT_FLOAT, "16,32");
    ir_value *b = val(g, IR_VAL_PARAM, "b", IR_DT_FLOAT, "32");
    ir_value *mm = NODE(g, IR_OP_MATMUL, "mm", 1, x, w)->out[0];
    ir_value *y = NODE(g, IR_OP_ADD, "bias", 1, b, mm)->out[0];
    add_output(g, y);
    run(t, sbp_recognize_linear);
    ir_node *n = only(g, IR_OP_LINEAR);
    assert_int_equal(n->n_in, 3);
    assert_ptr_equal(n->in[0], x);
    assert_ptr_equal(n->in[1], w);
    assert_ptr_equal(n->in[2], b);
    assert_int_equal(ir_attr_int(n, "trans_w", 0), 0);
    assert_ptr_equal(n->out[0], y);
    assert_type(y, "f32[2,8,32]");
    assert_int_equal(g->n_nodes, 1);
    tg_free(t);
}

/* The tied head: MatMul(x, Transpose(wte)) -> Linear(x, wte, trans_w=1). */
static void test_linear_tied_head(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,8,16");
    ir_value *wte = val(g, IR_VAL_PARAM, "wte", IR_DT_FLOAT, "64,16");
    ir_node *tr = NODE(g, IR_OP_TRANSPOSE, "t", 1, wte);
    int64_t perm[2] = {1, 0};
    ir_attr_set_ints(g, tr, "perm", perm, 2);
    ir_value *y = NODE(g, IR_OP_MATMUL, "head", 1, x, tr->out[0])->out[0];
    add_output(g, y);
    run(t, sbp_recognize_linear);
    ir_node *n = only(g, IR_OP_LINEAR);
    assert_ptr_equal(n->in[1], wte);
    assert_int_equal(ir_attr_int(n, "trans_w", 0), 1);
    assert_type(y, "f32[2,8,64]");
    assert_int_equal(g->n_nodes, 1);
    tg_free(t);
}

/* HF Conv1D: Reshape(x [2,8,16] -> [-1,16]), Gemm(., W, b), Reshape(-> [2,8,48]): one Linear
 * on the 3-D x. Gemm with transB reads W as [N,K]. */
static void test_linear_gemm_flattened(void **state)
{
    (void)state;
    for (int trans_b = 0; trans_b < 2; trans_b++) {
        tgraph *t = tg_new(14);
        ir_graph *g = t->g;
        ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,8,16");
        ir_value *w = val(g, IR_VAL_PARAM, "w", IR_DT_FLOAT, trans_b ? "48,16" : "16,48");
        ir_value *b = val(g, IR_VAL_PARAM, "b", IR_DT_FLOAT, "48");
        const int64_t s1[2] = {-1, 16}, s2[3] = {2, 8, 48};
        ir_value *x2 = NODE(g, IR_OP_RESHAPE, "flat", 1, x, ci64(g, "s1", 2, s1))->out[0];
        ir_node *gemm = NODE(g, IR_OP_GEMM, "gemm", 1, x2, w, b);
        ir_attr_set_float(g, gemm, "alpha", 1.0);
        ir_attr_set_float(g, gemm, "beta", 1.0);
        if (trans_b)
            ir_attr_set_int(g, gemm, "transB", 1);
        ir_value *y = NODE(g, IR_OP_RESHAPE, "unflat", 1, gemm->out[0], ci64(g, "s2", 3, s2))
                          ->out[0];
        add_output(g, y);
        run(t, sbp_recognize_linear);
        ir_node *n = only(g, IR_OP_LINEAR);
        assert_ptr_equal(n->in[0], x);
        assert_ptr_equal(n->in[2], b);
        assert_int_equal(ir_attr_int(n, "trans_w", 0), trans_b);
        assert_ptr_equal(n->out[0], y);
        assert_int_equal(g->n_nodes, 1);
        tg_free(t);
    }
}

/* Not Linear: Gemm with alpha 2, MatMul by an input, MatMul by a rank-3 parameter. */
static void test_linear_near_misses(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "8,16");
    ir_value *w = val(g, IR_VAL_PARAM, "w", IR_DT_FLOAT, "16,16");
    ir_value *k = val(g, IR_VAL_INPUT, "k", IR_DT_FLOAT, "16,16");
    ir_value *w3 = val(g, IR_VAL_PARAM, "w3", IR_DT_FLOAT, "1,16,16");
    ir_node *gemm = NODE(g, IR_OP_GEMM, "gemm", 1, x, w);
    ir_attr_set_float(g, gemm, "alpha", 2.0);
    ir_value *a = NODE(g, IR_OP_MATMUL, "mm_in", 1, gemm->out[0], k)->out[0];
    ir_value *b = NODE(g, IR_OP_MATMUL, "mm_r3", 1, a, w3)->out[0];
    add_output(g, b);
    run(t, sbp_recognize_linear);
    assert_int_equal(ir_graph_count_op(g, IR_OP_LINEAR), 0);
    assert_int_equal(g->n_nodes, 3);
    tg_free(t);
}

/* ---------------------------------------------------------------- Embedding */

static void test_embedding(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *ids = val(g, IR_VAL_INPUT, "ids", IR_DT_INT64, "2,8");
    ir_value *wte = val(g, IR_VAL_PARAM, "wte", IR_DT_FLOAT, "64,16");
    ir_value *wpe = val(g, IR_VAL_PARAM, "wpe", IR_DT_FLOAT, "32,16");
    const int64_t shape[2] = {-1, 8}, pos[8] = {0, 1, 2, 3, 4, 5, 6, 7}, pd[2] = {1, 8};
    ir_value *positions = ir_const_new(g, "pos", IR_DT_INT64, 2, pd, pos);
    ir_value *cos = ir_const_new(g, "cos", IR_DT_FLOAT, 2, (int64_t[]){8, 16}, NULL);
    ir_value *ids2 = NODE(g, IR_OP_RESHAPE, "view", 1, ids, ci64(g, "s", 2, shape))->out[0];
    ir_value *te = NODE(g, IR_OP_GATHER, "wte", 1, wte, ids2)->out[0];
    ir_value *pe = NODE(g, IR_OP_GATHER, "wpe", 1, wpe, positions)->out[0];
    ir_value *ce = NODE(g, IR_OP_GATHER, "cos", 1, cos, positions)->out[0]; /* constant table */
    ir_value *h = NODE(g, IR_OP_ADD, "add", 1, te, pe)->out[0];
    ir_value *y = NODE(g, IR_OP_ADD, "add2", 1, h, ce)->out[0];
    add_output(g, y);
    run(t, sbp_recognize_embedding);
    assert_int_equal(ir_graph_count_op(g, IR_OP_EMBEDDING), 2);
    assert_int_equal(ir_graph_count_op(g, IR_OP_GATHER), 1);
    assert_int_equal(ir_graph_count_op(g, IR_OP_RESHAPE), 0); /* the no-op view is looked through */
    assert_ptr_equal(te->producer->in[1], ids);
    assert_ptr_equal(pe->producer->in[1], positions);
    assert_type(pe, "f32[1,8,16]");
    tg_free(t);
}

/* ---------------------------------------------------------------- loss */

/* F.cross_entropy(logits.view(-1, V), labels.view(-1)) after a same-dtype Cast. */
static void test_loss_sce_flattened(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *logits = val(g, IR_VAL_INPUT, "logits", IR_DT_FLOAT, "2,8,64");
    ir_value *labels = val(g, IR_VAL_INPUT, "labels", IR_DT_INT64, "2,8");
    const int64_t s1[2] = {-1, 64}, s2[1] = {-1};
    ir_value *lc = cast_f32(g, logits)->out[0];
    ir_value *l2 = NODE(g, IR_OP_RESHAPE, "rl", 1, lc, ci64(g, "s1", 2, s1))->out[0];
    ir_value *y2 = NODE(g, IR_OP_RESHAPE, "ry", 1, labels, ci64(g, "s2", 1, s2))->out[0];
    ir_node *ce = NODE(g, IR_OP_SOFTMAX_CE_LOSS, "loss", 1, l2, y2);
    ir_attr_set_int(g, ce, "ignore_index", -100);
    ir_attr_set_string(g, ce, "reduction", "mean");
    add_output(g, ce->out[0]);
    run(t, sbp_recognize_loss);
    ir_node *n = only(g, IR_OP_CROSS_ENTROPY);
    assert_ptr_equal(n->in[0], logits);
    assert_ptr_equal(n->in[1], labels);
    assert_int_equal(ir_attr_int(n, "ignore_index", 0), -100);
    assert_string_equal(ir_attr_string(n, "reduction", ""), "mean");
    assert_ptr_equal(g->outputs[0], ce->out[0]);
    assert_int_equal(g->n_nodes, 1);
    tg_free(t);
}

/* NLL(LogSoftmax(x)) with reduction sum and no ignore_index; [B,V,T] scores via Transpose. */
static void test_loss_nll_transposed(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *logits = val(g, IR_VAL_INPUT, "logits", IR_DT_FLOAT, "2,8,64");
    ir_value *labels = val(g, IR_VAL_INPUT, "labels", IR_DT_INT64, "2,8");
    ir_node *tr = NODE(g, IR_OP_TRANSPOSE, "t", 1, logits);
    ir_attr_set_ints(g, tr, "perm", (int64_t[]){0, 2, 1}, 3);
    ir_node *ls = NODE(g, IR_OP_LOG_SOFTMAX, "ls", 1, tr->out[0]);
    ir_attr_set_int(g, ls, "axis", 1);
    ir_node *nll = NODE(g, IR_OP_NLL_LOSS, "nll", 1, ls->out[0], labels);
    ir_attr_set_string(g, nll, "reduction", "sum");
    add_output(g, nll->out[0]);
    run(t, sbp_recognize_loss);
    ir_node *n = only(g, IR_OP_CROSS_ENTROPY);
    assert_ptr_equal(n->in[0], logits);
    assert_string_equal(ir_attr_string(n, "reduction", ""), "sum");
    assert_null(ir_attr_get(n, "ignore_index"));
    assert_int_equal(g->n_nodes, 1);
    tg_free(t);
}

/* reduction none and class weights stay ONNX. */
static void test_loss_near_misses(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *logits = val(g, IR_VAL_INPUT, "logits", IR_DT_FLOAT, "16,64");
    ir_value *labels = val(g, IR_VAL_INPUT, "labels", IR_DT_INT64, "16");
    ir_value *wt = val(g, IR_VAL_PARAM, "wt", IR_DT_FLOAT, "64");
    ir_node *a = NODE(g, IR_OP_SOFTMAX_CE_LOSS, "none", 1, logits, labels);
    ir_attr_set_string(g, a, "reduction", "none");
    ir_node *b = NODE(g, IR_OP_SOFTMAX_CE_LOSS, "weighted", 1, logits, labels, wt);
    add_output(g, a->out[0]);
    add_output(g, b->out[0]);
    run(t, sbp_recognize_loss);
    assert_int_equal(ir_graph_count_op(g, IR_OP_CROSS_ENTROPY), 0);
    tg_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_hf_casts),
        cmocka_unit_test(test_rmsnorm_reciprocal),
        cmocka_unit_test(test_rmsnorm_no_gamma),
        cmocka_unit_test(test_rmsnorm_near_misses),
        cmocka_unit_test(test_layernorm_decomposed),
        cmocka_unit_test(test_norm_onnx_ops),
        cmocka_unit_test(test_gelu_tanh),
        cmocka_unit_test(test_gelu_tanh_other_order),
        cmocka_unit_test(test_gelu_wrong_constant),
        cmocka_unit_test(test_gelu_erf),
        cmocka_unit_test(test_gelu_onnx),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_silu_shared_and_broadcast),
        cmocka_unit_test(test_linear_matmul_bias),
        cmocka_unit_test(test_linear_tied_head),
        cmocka_unit_test(test_linear_gemm_flattened),
        cmocka_unit_test(test_linear_near_misses),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_loss_sce_flattened),
        cmocka_unit_test(test_loss_nll_transposed),
        cmocka_unit_test(test_loss_near_misses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
