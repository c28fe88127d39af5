/* test_rules.c — gradient rules and layouts the fixture models do not reach, checked by
 * central finite differences of the compiled step's own loss.
 *
 * Small graphs are built with the IR builder (V = 11, B = 2, T = 5, D = 8, 2 heads of 4) so
 * that they exercise: attention inputs stored naturally (relayout copies into the runtime's
 * [B,T,H,hd] and their gradients permuted back), a Reshape of a value stored swapped (a
 * materialising permute), RoPE over naturally stored heads, broadcasting Mul / Sub / Div with
 * constants and parameters, Slice and Concat on the last and on an inner axis, Split, Expand,
 * erf-GELU, SiLU, LayerNorm without beta, RMSNorm without gamma, a generic Transpose, and a
 * value read by several nodes. Each graph is compiled for store and checkpoint through C into a
 * shared object (a third graph, whose chunk path holds layout changes — a query stored
 * naturally and its relayout copy inside the chunk loop — for stream too, at chunks of 2 rows
 * and LM-head chunks of 3, neither dividing T = 5); every gradient element is compared with
 * (L(w+h) - L(w-h)) / 2h, h = 1e-2, per tensor by relative norm (float32 losses: tolerance
 * 2e-2, far below what a wrong layout or rule gives), and the other strategies' gradients
 * with store's (1e-5 per tensor). Graphs stream cannot chunk are refused, naming the node.
 *
 * Activations of real Hugging Face models, under all three strategies: ReLU (OPT's MLP), tanh,
 * and ONNX's own Gelu of opset 20 with both approximations (canonicalised by the recognize
 * pass, as an imported model is); a layer with a ReLU x tanh MLP under Gemma-2's final-logit
 * soft-capping head, Linear -> Div by the cap -> Tanh -> Mul by the cap -> loss, which stream
 * runs inside its LM-head chunk loop; and heads whose logits are made by Tanh or ReLU
 * themselves, where stream writes dlogits over the logits, so those rules must not read their
 * output there (checked on the program too); the --precision bf16 programs of the activation
 * block are built (not run) too. Mul and Div by one-element constants (rank 0, [1], [1,1,1];
 * c * x and x * c) lower to the scalar kernels (sbprt_scale, sbprt_div_scalar), a query stored
 * swapped keeping its layout, under all three strategies and in bf16 programs (built, not
 * run). The biases feeding each ReLU are +-0.8 with small weights, so no pre-activation lies
 * within a finite-difference step of the kink at 0.
 * Compiling and running a step are the e2e tests' shared steps (e2e_util.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "e2e_util.h"

#define V 11
#define B 2
#define T 5
#define D 8
#define H 2
#define HD 4
#define FD_H 1e-2
#define FD_TOL 2e-2

static unsigned rng_state = 12345;

static float frand(void)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return ((float)((rng_state >> 8) & 0xffff) / 65536.0f - 0.5f);
}

/* ------------------------------------------------------------------ graph building */

typedef struct gb {
    ir_diag d;
    ir_graph *g;
    ir_value *ids;
    int n;
} gb;

static void gb_init(gb *b)
{
    memset(b, 0, sizeof *b);
    ir_diag_init(&b->d, "handmade");
    b->g = ir_graph_new(&b->d, "handmade");
    ir_dim dims[2] = {{B, NULL}, {T, NULL}};
    b->ids = ir_value_new(b->g, "input_ids", IR_VAL_INPUT, IR_DT_INT64, 2, dims);
    b->g->inputs = ir_arena_calloc(b->g->arena, 1, sizeof *b->g->inputs);
    b->g->inputs[0] = b->ids;
    b->g->n_inputs = 1;
}

static ir_value *param(gb *b, const char *name, int rank, const int64_t *dims, float scale,
                       float offset)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= dims[i];
    float *w = malloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++)
        w[i] = offset + scale * frand();
    ir_value *v = ir_const_new(b->g, name, IR_DT_FLOAT, rank, dims, w);
    free(w);
    v->kind = IR_VAL_PARAM;
    return v;
}

static ir_value *cfloat(gb *b, const char *name, int rank, const int64_t *dims, float scale,
                        float offset)
{
    ir_value *v = param(b, name, rank, dims, scale, offset);
    v->kind = IR_VAL_CONST;
    return v;
}

/* A parameter [n] alternating +-mag (biases that keep a ReLU's inputs away from its kink). */
static ir_value *param_pm(gb *b, const char *name, int64_t n, float mag)
{
    ir_value *v = param(b, name, 1, &n, 0, 0);
    float *w = (float *)v->data;
    for (int64_t i = 0; i < n; i++)
        w[i] = i % 2 ? -mag : mag;
    return v;
}

static ir_value *cints(gb *b, const char *name, int n, const int64_t *vals)
{
    return ir_const_new(b->g, name, IR_DT_INT64, 1, (const int64_t[]){n}, vals);
}

static void dump_diag(const gb *b)
{
    for (int i = 0; i < b->d.n; i++)
        print_message("%s: %s\n", b->d.entries[i].node ? b->d.entries[i].node : "",
                      b->d.entries[i].msg);
}

/* A node whose outputs are typed by infer() once its attributes are set. */
static ir_node *node(gb *b, ir_op op, int n_in, ir_value **in, int n_out)
{
    char name[32];
    snprintf(name, sizeof name, "n%d_%s", b->n++, ir_op_name(op));
    ir_value *out[4];
    for (int i = 0; i < n_out; i++) {
        char vn[48];
        snprintf(vn, sizeof vn, "%s_out%d", name, i);
        out[i] = ir_value_new(b->g, vn, IR_VAL_NODE, IR_DT_UNDEFINED, -1, NULL);
    }
    ir_node *n = ir_node_new_with_outputs(b->g, op, name, NULL, n_in, in, n_out, out);
    if (!n)
        dump_diag(b);
    assert_non_null(n);
    return n;
}

static ir_value *infer(gb *b, ir_node *n)
{
    if (ir_infer_node(b->g, n) != IR_OK)
        dump_diag(b);
    assert_int_equal(ir_infer_node(b->g, n), IR_OK);
    for (int i = 0; i < n->n_out; i++)
        assert_true(ir_value_shape_known(n->out[i]));
    return n->out[0];
}

static ir_value *op1(gb *b, ir_op op, ir_value *x) { return infer(b, node(b, op, 1, &x, 1)); }
static ir_value *op2(gb *b, ir_op op, ir_value *x, ir_value *y)
{
    return infer(b, node(b, op, 2, (ir_value *[]){x, y}, 1));
}

static ir_value *reshape(gb *b, ir_value *x, int n, const int64_t *shape)
{
    return op2(b, IR_OP_RESHAPE, x, cints(b, "shape", n, shape));
}

static ir_value *transpose(gb *b, ir_value *x, int n, const int64_t *perm)
{
    ir_node *t = node(b, IR_OP_TRANSPOSE, 1, &x, 1);
    ir_attr_set_ints(b->g, t, "perm", perm, n);
    return infer(b, t);
}

static ir_value *linear(gb *b, ir_value *x, ir_value *w, ir_value *bias, int trans_w)
{
    ir_value *in[3] = {x, w, bias};
    ir_node *n = node(b, IR_OP_LINEAR, bias ? 3 : 2, in, 1);
    if (trans_w)
        ir_attr_set_int(b->g, n, "trans_w", 1);
    return infer(b, n);
}

static ir_value *slice(gb *b, ir_value *x, int64_t axis, int64_t start, int64_t end)
{
    ir_value *in[4] = {x, cints(b, "starts", 1, &start), cints(b, "ends", 1, &end),
                       cints(b, "axes", 1, &axis)};
    return infer(b, node(b, IR_OP_SLICE, 4, in, 1));
}

static ir_value *concat(gb *b, int64_t axis, ir_value *x, ir_value *y)
{
    ir_node *n = node(b, IR_OP_CONCAT, 2, (ir_value *[]){x, y}, 1);
    ir_attr_set_int(b->g, n, "axis", axis);
    return infer(b, n);
}

static void set_output(gb *b, ir_value *logits)
{
    b->g->outputs = ir_arena_calloc(b->g->arena, 1, sizeof *b->g->outputs);
    b->g->outputs[0] = logits;
    b->g->n_outputs = 1;
    logits->is_output = true;
    if (ir_verify(b->g) != IR_OK)
        for (int i = 0; i < b->d.n; i++)
            print_message("%s\n", b->d.entries[i].msg);
    assert_int_equal(ir_verify(b->g), IR_OK);
}

/* Attention with heads re-laid out: q stored naturally (a broadcast Mul forces it), k through
 * RoPE over naturally stored heads, v the usual view; the output reshaped without transposing
 * back (a view of a swapped value). */
static void build_attention_layouts(gb *b)
{
    /* large enough weights that the attention is far from uniform (a strong q/k signal) */
    ir_value *table = param(b, "table", 2, (const int64_t[]){V, D}, 2.0f, 0);
    ir_value *x = op2(b, IR_OP_EMBEDDING, table, b->ids); /* [B,T,D] */
    ir_value *wq = param(b, "wq", 2, (const int64_t[]){D, D}, 2.0f, 0);
    ir_value *wk = param(b, "wk", 2, (const int64_t[]){D, D}, 2.0f, 0);
    ir_value *wv = param(b, "wv", 2, (const int64_t[]){D, D}, 0.6f, 0);
    const int64_t bthd[4] = {B, T, H, HD}, bhtd[4] = {B, H, T, HD}, p0213[4] = {0, 2, 1, 3};
    ir_value *q = transpose(b, reshape(b, linear(b, x, wq, NULL, 0), 4, bthd), 4, p0213);
    ir_value *hs = param(b, "head_scale", 4, (const int64_t[]){1, H, 1, 1}, 0.5f, 1.0f);
    q = op2(b, IR_OP_MUL, q, hs); /* broadcast: natural layout */
    ir_value *k = reshape(b, linear(b, x, wk, NULL, 0), 4, bhtd); /* natural [B,H,T,hd] */
    ir_value *cs = cfloat(b, "cos", 2, (const int64_t[]){T, HD}, 1.0f, 0);
    ir_value *sn = cfloat(b, "sin", 2, (const int64_t[]){T, HD}, 1.0f, 0);
    k = infer(b, node(b, IR_OP_ROPE, 3, (ir_value *[]){k, cs, sn}, 1));
    ir_value *v = transpose(b, reshape(b, linear(b, x, wv, NULL, 0), 4, bthd), 4, p0213);
    ir_node *an = node(b, IR_OP_ATTENTION, 3, (ir_value *[]){q, k, v}, 1);
    ir_attr_set_float(b->g, an, "scale", 0.5);
    ir_attr_set_int(b->g, an, "causal", 1);
    ir_attr_set_int(b->g, an, "kv_heads", H);
    ir_value *o = infer(b, an); /* stored swapped */
    ir_value *flat = reshape(b, o, 3, (const int64_t[]){B, T, D}); /* materialising view */
    ir_value *h = op2(b, IR_OP_ADD, x, flat);
    ir_value *wo = param(b, "wo", 2, (const int64_t[]){V, D}, 0.6f, 0);
    set_output(b, linear(b, h, wo, NULL, 1));
}

/* A layer whose chunk path changes layouts (for stream): q scaled per head by a broadcast Mul
 * (stored naturally, copied to the runtime's layout inside the chunk loop), k through RoPE,
 * an erf-GELU MLP with a broadcast Div, two residual adds, a biased LM head. */
static void build_stream_layouts(gb *b)
{
    ir_value *table = param(b, "table", 2, (const int64_t[]){V, D}, 2.0f, 0);
    ir_value *x = op2(b, IR_OP_EMBEDDING, table, b->ids); /* [B,T,D] */
    ir_value *wq = param(b, "wq", 2, (const int64_t[]){D, D}, 2.0f, 0);
    ir_value *wk = param(b, "wk", 2, (const int64_t[]){D, D}, 2.0f, 0);
    ir_value *wv = param(b, "wv", 2, (const int64_t[]){D, D}, 0.6f, 0);
    const int64_t bthd[4] = {B, T, H, HD}, p0213[4] = {0, 2, 1, 3};
    ir_value *q = transpose(b, reshape(b, linear(b, x, wq, NULL, 0), 4, bthd), 4, p0213);
    ir_value *hs = param(b, "head_scale", 4, (const int64_t[]){1, H, 1, 1}, 0.5f, 1.0f);
    q = op2(b, IR_OP_MUL, q, hs); /* broadcast: natural layout, chunk-local */
    ir_value *k = transpose(b, reshape(b, linear(b, x, wk, NULL, 0), 4, bthd), 4, p0213);
    ir_value *cs = cfloat(b, "cos", 2, (const int64_t[]){T, HD}, 1.0f, 0);
    ir_value *sn = cfloat(b, "sin", 2, (const int64_t[]){T, HD}, 1.0f, 0);
    k = infer(b, node(b, IR_OP_ROPE, 3, (ir_value *[]){k, cs, sn}, 1));
    ir_value *v = transpose(b, reshape(b, linear(b, x, wv, NULL, 0), 4, bthd), 4, p0213);
    ir_node *an = node(b, IR_OP_ATTENTION, 3, (ir_value *[]){q, k, v}, 1);
    ir_attr_set_float(b->g, an, "scale", 0.5);
    ir_attr_set_int(b->g, an, "causal", 1);
    ir_attr_set_int(b->g, an, "kv_heads", H);
    ir_value *o = transpose(b, infer(b, an), 4, p0213); /* back to [B,T,H,hd]: a view */
    ir_value *h = op2(b, IR_OP_ADD, x, reshape(b, o, 3, (const int64_t[]){B, T, D}));
    ir_value *dd = param(b, "divisor", 3, (const int64_t[]){1, 1, D}, 0.2f, 2.0f);
    ir_value *m = op2(b, IR_OP_DIV, h, dd);
    ir_node *gl = node(b, IR_OP_GELU, 1, &m, 1);
    ir_attr_set_string(b->g, gl, "approximate", "none");
    m = infer(b, gl);
    ir_value *w2 = param(b, "w2", 2, (const int64_t[]){D, D}, 0.6f, 0);
    h = op2(b, IR_OP_ADD, h, linear(b, m, w2, NULL, 0));
    ir_value *wo = param(b, "wo", 2, (const int64_t[]){D, V}, 0.6f, 0);
    ir_value *bo = param(b, "b_out", 1, (const int64_t[]){V}, 0.3f, 0);
    set_output(b, linear(b, h, wo, bo, 0));
}

/* Elementwise and shape ops: broadcasting Sub/Div/Mul, Slice/Concat on the last and an inner
 * axis, Split, Expand, a generic Transpose, erf-GELU, SiLU, LayerNorm without beta, RMSNorm
 * without gamma, a value read several times. */
static void build_elementwise(gb *b)
{
    ir_value *table = param(b, "table", 2, (const int64_t[]){V, D}, 1.0f, 0);
    ir_value *x = op2(b, IR_OP_EMBEDDING, table, b->ids); /* [B,T,D] */
    ir_value *gamma = param(b, "gamma", 1, (const int64_t[]){D}, 0.3f, 1.0f);
    ir_node *ln = node(b, IR_OP_LAYER_NORM, 2, (ir_value *[]){x, gamma}, 1);
    ir_attr_set_float(b->g, ln, "epsilon", 1e-5);
    ir_value *y = infer(b, ln);
    ir_value *shift = param(b, "shift", 1, (const int64_t[]){D}, 0.5f, 0);
    y = op2(b, IR_OP_SUB, y, shift);
    ir_value *den = cfloat(b, "den", 3, (const int64_t[]){1, T, 1}, 0.5f, 1.5f);
    y = op2(b, IR_OP_DIV, y, den);
    ir_value *dd = param(b, "divisor", 1, (const int64_t[]){1}, 0.2f, 2.0f);
    y = op2(b, IR_OP_DIV, y, dd);
    /* swap the halves of the last axis, and the first two rows of the time axis */
    y = concat(b, -1, slice(b, y, 2, 4, 8), slice(b, y, 2, 0, 4));
    y = concat(b, 1, slice(b, y, 1, 2, T), slice(b, y, 1, 0, 2));
    ir_node *gl = node(b, IR_OP_GELU, 1, &y, 1);
    ir_attr_set_string(b->g, gl, "approximate", "none");
    ir_value *a = infer(b, gl);
    ir_node *sp = node(b, IR_OP_SPLIT, 1, &a, 2);
    ir_attr_set_int(b->g, sp, "axis", 2);
    infer(b, sp);
    ir_value *s0 = sp->out[0], *s1 = sp->out[1]; /* [B,T,4] each */
    ir_value *m = op2(b, IR_OP_MUL, op1(b, IR_OP_SILU, s0), s1);
    ir_value *bias = param(b, "bias3", 3, (const int64_t[]){1, 1, 4}, 0.5f, 0);
    ir_value *e = op2(b, IR_OP_EXPAND, bias, cints(b, "eshape", 3, (const int64_t[]){B, T, 4}));
    m = op2(b, IR_OP_ADD, m, e);
    m = op2(b, IR_OP_MUL, m, m); /* one value, two reads */
    /* a transpose that is not a layout change: [B,T,4] -> [T,B,4] -> back */
    m = transpose(b, transpose(b, m, 3, (const int64_t[]){1, 0, 2}), 3,
                  (const int64_t[]){1, 0, 2});
    ir_value *r = op1(b, IR_OP_RMS_NORM, m);
    ir_value *cat = concat(b, 2, r, s1); /* [B,T,8] */
    ir_value *hid = linear(b, cat, param(b, "w_cat", 2, (const int64_t[]){8, 4}, 0.8f, 0), NULL, 0);
    ir_value *w = param(b, "w_out", 2, (const int64_t[]){4, V}, 0.8f, 0);
    ir_value *bo = param(b, "b_out", 1, (const int64_t[]){V}, 0.3f, 0);
    set_output(b, linear(b, hid, w, bo, 0));
}

/* ReLU, tanh and ONNX Gelu (both approximations, canonicalised by the recognize pass) in one
 * row-wise block: relu(x W1 + b1) * tanh(x W2) + gelu(x W3) + gelu_tanh(x W4), then the LM
 * head. Without attention it is one segment, which stream runs in its head chunk loop. */
static void build_activations(gb *b)
{
    ir_value *table = param(b, "table", 2, (const int64_t[]){V, D}, 1.0f, 0);
    ir_value *x = op2(b, IR_OP_EMBEDDING, table, b->ids); /* [B,T,D] */
    ir_value *w[4];
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "w%d", i + 1);
        w[i] = param(b, name, 2, (const int64_t[]){D, D}, i == 0 ? 0.3f : 1.0f, 0);
    }
    ir_value *a = op1(b, IR_OP_RELU, linear(b, x, w[0], param_pm(b, "b1", D, 0.8f), 0));
    ir_value *u = op1(b, IR_OP_TANH, linear(b, x, w[1], NULL, 0));
    ir_value *h = op2(b, IR_OP_MUL, a, u);
    const char *approx[2] = {"none", "tanh"};
    for (int i = 0; i < 2; i++) {
        ir_value *in = linear(b, x, w[2 + i], NULL, 0);
        ir_node *g = node(b, IR_OP_GELU_ONNX, 1, &in, 1);
        ir_attr_set_string(b->g, g, "approximate", approx[i]);
        h = op2(b, IR_OP_ADD, h, infer(b, g));
    }
    ir_value *wo = param(b, "w_out", 2, (const int64_t[]){D, V}, 0.8f, 0);
    set_output(b, linear(b, h, wo, param(b, "b_out", 1, (const int64_t[]){V}, 0.3f, 0), 0));
    if (sbp_pass_recognize(b->g) != IR_OK)
        dump_diag(b);
    assert_int_equal(b->d.n_errors, 0);
    assert_int_equal(ir_graph_count_op(b->g, IR_OP_GELU_ONNX), 0);
    assert_int_equal(ir_graph_count_op(b->g, IR_OP_GELU), 2);
}

/* One attention layer with an MLP of relu(h W1 + b1) * tanh(h W3), then Gemma-2's soft-capped
 * head: tanh(logits / cap) * cap (the cap a scalar, then a [1] constant). */
static void build_softcap(gb *b)
{
    ir_value *table = param(b, "table", 2, (const int64_t[]){V, D}, 2.0f, 0);
    ir_value *x = op2(b, IR_OP_EMBEDDING, table, b->ids); /* [B,T,D] */
    const int64_t bthd[4] = {B, T, H, HD}, p0213[4] = {0, 2, 1, 3};
    ir_value *qkv[3];
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof name, "w%c", "qkv"[i]);
        ir_value *w = param(b, name, 2, (const int64_t[]){D, D}, i < 2 ? 2.0f : 0.6f, 0);
        qkv[i] = transpose(b, reshape(b, linear(b, x, w, NULL, 0), 4, bthd), 4, p0213);
    }
    ir_node *an = node(b, IR_OP_ATTENTION, 3, qkv, 1);
    ir_attr_set_float(b->g, an, "scale", 0.5);
    ir_attr_set_int(b->g, an, "causal", 1);
    ir_attr_set_int(b->g, an, "kv_heads", H);
    ir_value *o = transpose(b, infer(b, an), 4, p0213);
    ir_value *h = op2(b, IR_OP_ADD, x, reshape(b, o, 3, (const int64_t[]){B, T, D}));
    ir_value *w1 = param(b, "w1", 2, (const int64_t[]){D, D}, 0.3f, 0);
    ir_value *w3 = param(b, "w3", 2, (const int64_t[]){D, D}, 0.6f, 0);
    ir_value *m = op2(b, IR_OP_MUL, op1(b, IR_OP_RELU, linear(b, h, w1, param_pm(b, "b1", D, 0.8f), 0)),
                      op1(b, IR_OP_TANH, linear(b, h, w3, NULL, 0)));
    ir_value *w2 = param(b, "w2", 2, (const int64_t[]){D, D}, 0.6f, 0);
    h = op2(b, IR_OP_ADD, h, linear(b, m, w2, NULL, 0));
    ir_value *wo = param(b, "w_out", 2, (const int64_t[]){D, V}, 1.0f, 0);
    ir_value *z = linear(b, h, wo, NULL, 0);
    const float cap = 1.5f;
    z = op2(b, IR_OP_DIV, z, ir_const_new(b->g, "cap", IR_DT_FLOAT, 0, NULL, &cap));
    z = op1(b, IR_OP_TANH, z);
    set_output(b, op2(b, IR_OP_MUL, z,
                      ir_const_new(b->g, "cap1", IR_DT_FLOAT, 1, (const int64_t[]){1}, &cap)));
}

/* Scaling by constants of one element, which lowers to sbprt_scale / sbprt_div_scalar with the
 * constant as an argument (not to the broadcast kernels): the embedding times a rank-0
 * constant (Gemma's normaliser), a query stored swapped times a [1] constant written first
 * (c * q: its layout is kept, so the step has no permute at all), the residual divided by a
 * [1,1,1] constant before a SiLU MLP, and logits divided by a rank-0 constant (the loss their
 * only reader: stream writes dlogits over them). */
static void build_scaled(gb *b)
{
    static const float c_embed = 2.5f, c_q = 0.8f, c_res = 3.0f, c_logits = 0.7f;
    ir_value *table = param(b, "table", 2, (const int64_t[]){V, D}, 0.8f, 0);
    ir_value *x = op2(b, IR_OP_EMBEDDING, table, b->ids); /* [B,T,D] */
    x = op2(b, IR_OP_MUL, x, ir_const_new(b->g, "embed_scale", IR_DT_FLOAT, 0, NULL, &c_embed));
    const int64_t bthd[4] = {B, T, H, HD}, p0213[4] = {0, 2, 1, 3};
    ir_value *qkv[3];
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof name, "w%c", "qkv"[i]);
        ir_value *w = param(b, name, 2, (const int64_t[]){D, D}, i < 2 ? 1.0f : 0.6f, 0);
        qkv[i] = transpose(b, reshape(b, linear(b, x, w, NULL, 0), 4, bthd), 4, p0213);
    }
    qkv[0] = op2(b, IR_OP_MUL,
                 ir_const_new(b->g, "q_scale", IR_DT_FLOAT, 1, (const int64_t[]){1}, &c_q), qkv[0]);
    ir_node *an = node(b, IR_OP_ATTENTION, 3, qkv, 1);
    ir_attr_set_float(b->g, an, "scale", 0.5);
    ir_attr_set_int(b->g, an, "causal", 1);
    ir_attr_set_int(b->g, an, "kv_heads", H);
    ir_value *o = transpose(b, infer(b, an), 4, p0213);
    ir_value *h = op2(b, IR_OP_ADD, x, reshape(b, o, 3, (const int64_t[]){B, T, D}));
    ir_value *m = op2(b, IR_OP_DIV, h,
                      ir_const_new(b->g, "res_div", IR_DT_FLOAT, 3, (const int64_t[]){1, 1, 1},
                                   &c_res));
    ir_value *w1 = param(b, "w1", 2, (const int64_t[]){D, D}, 1.0f, 0);
    m = op1(b, IR_OP_SILU, linear(b, m, w1, NULL, 0));
    ir_value *w2 = param(b, "w2", 2, (const int64_t[]){D, D}, 0.6f, 0);
    h = op2(b, IR_OP_ADD, h, linear(b, m, w2, NULL, 0));
    ir_value *wo = param(b, "w_out", 2, (const int64_t[]){D, V}, 1.0f, 0);
    ir_value *z = linear(b, h, wo, NULL, 0);
    set_output(b, op2(b, IR_OP_DIV, z,
                      ir_const_new(b->g, "logit_div", IR_DT_FLOAT, 0, NULL, &c_logits)));
}

/* Logits made by the activation itself (the loss their only reader): stream's head writes
 * dlogits over them. */
static void build_tanh_logits(gb *b)
{
    ir_value *table = param(b, "table", 2, (const int64_t[]){V, D}, 1.0f, 0);
    ir_value *x = op2(b, IR_OP_EMBEDDING, table, b->ids);
    ir_value *wo = param(b, "w_out", 2, (const int64_t[]){D, V}, 2.0f, 0);
    set_output(b, op1(b, IR_OP_TANH, linear(b, x, wo, NULL, 0)));
}

static void build_relu_logits(gb *b)
{
    ir_value *table = param(b, "table", 2, (const int64_t[]){V, D}, 1.0f, 0);
    ir_value *x = op2(b, IR_OP_EMBEDDING, table, b->ids);
    ir_value *wo = param(b, "w_out", 2, (const int64_t[]){D, V}, 0.3f, 0);
    set_output(b, op1(b, IR_OP_RELU, linear(b, x, wo, param_pm(b, "b_out", V, 0.8f), 0)));
}

/* ------------------------------------------------------------------ compile and check */

/* The graph b holds (b keeps it: s->g stays NULL), compiled for SFT with options to into
 * SBP_E2E_OUT/<tag>.so and loaded. */
static void compile(gb *b, const sbp_train_options *to, const char *tag, e2e_step *s)
{
    memset(s, 0, sizeof *s);
    sbp_objective chosen;
    assert_int_equal(sbp_pass_objective(b->g, SBP_OBJECTIVE_SFT, &chosen), IR_OK);
    s->p = sbp_train_build(b->g, chosen, to);
    if (!s->p)
        e2e_print_diag(&b->d);
    assert_non_null(s->p);
    e2e_load_so(s, s->p, "handmade", tag, &b->d);
}

static double loss_and_grads(const e2e_step *s, const float *params, float *grads)
{
    static int32_t ids[B * T], labels[B * T];
    for (int i = 0; i < B * T; i++) {
        ids[i] = (i * 7 + 3) % V;
        labels[i] = i == 3 ? SBPRT_IGNORE_INDEX : (i * 5 + 1) % V;
    }
    float *g = grads ? grads : malloc(s->info->param_elems * sizeof(float));
    sbp_step_args a = {.params = params, .grads = g, .input_ids = ids, .labels = labels};
    double loss = e2e_run(s, &a, false);
    if (!grads)
        free(g);
    return loss;
}

/* Builds the graph afresh for each strategy (the objective pass rewrites it), compiles it and
 * compares every gradient element with central differences of the step's loss. */
static void check_fd(void (*build)(gb *), unsigned seed, const char *tag, bool stream)
{
    const sbp_train_options sts[3] = {{.strategy = SBP_STRATEGY_STORE},
                                      {.strategy = SBP_STRATEGY_CHECKPOINT},
                                      {.strategy = SBP_STRATEGY_STREAM, .chunk = 2,
                                       .logits_chunk = 3}};
    float *store_grads = NULL;
    for (int k = 0; k < (stream ? 3 : 2); k++) {
        gb b;
        rng_state = seed;
        gb_init(&b);
        build(&b);
        e2e_step s;
        char t[128];
        snprintf(t, sizeof t, "%s_%s", tag, sbp_strategy_name(sts[k].strategy));
        compile(&b, &sts[k], t, &s);
        float *params = e2e_param_block(s.info, b.g);
        float *grads = calloc(s.info->param_elems, sizeof *grads);
        double loss = loss_and_grads(&s, params, grads);
        assert_true(isfinite(loss));
        double worst = 0;
        for (int i = 0; i < s.info->n_params; i++) {
            const sbp_step_param *q = &s.info->params[i];
            assert_int_equal(q->trainable, 1);
            double num = 0, den = 0;
            for (size_t e = q->offset; e < q->offset + q->numel; e++) {
                float keep = params[e];
                params[e] = keep + (float)FD_H;
                double lp = loss_and_grads(&s, params, NULL);
                params[e] = keep - (float)FD_H;
                double lm = loss_and_grads(&s, params, NULL);
                params[e] = keep;
                double fd = (lp - lm) / (2 * FD_H);
                num += (fd - grads[e]) * (fd - grads[e]);
                den += fd * fd;
            }
            double rel = sqrt(num / (den > 0 ? den : 1));
            if (!(rel <= FD_TOL))
                print_message("  %s %s: rel err %.3e (|fd| %.3e)\n", t, q->name, rel, sqrt(den));
            assert_true(rel <= FD_TOL);
            worst = rel > worst ? rel : worst;
        }
        print_message("  %s: loss %.6f, %d parameters, max rel err vs finite differences "
                      "%.2e\n",
                      t, loss, s.info->n_params, worst);
        if (k == 0) { /* store: what the other strategies must give up to rounding */
            free(store_grads);
            store_grads = malloc(s.info->param_elems * sizeof *store_grads);
            memcpy(store_grads, grads, s.info->param_elems * sizeof *store_grads);
        } else {
            for (int i = 0; i < s.info->n_params; i++) {
                const sbp_step_param *q = &s.info->params[i];
                double num = 0, den = 0;
                for (size_t e = q->offset; e < q->offset + q->numel; e++) {
                    double d = (double)grads[e] - store_grads[e];
                    num += d * d;
                    den += (double)store_grads[e] * store_grads[e];
                }
                assert_true(sqrt(num) <= 1e-5 * sqrt(den));
            }
        }
        free(params);
        free(grads);
        e2e_free_step(&s);
        ir_graph_free(b.g);
        ir_diag_free(&b.d);
    }
    free(store_grads);
}

static void test_attention_layouts(void **state)
{
    (void)state;
    check_fd(build_attention_layouts, 12345, "rules_attention", false);
}

static void test_stream_layouts(void **state)
{
    (void)state;
    check_fd(build_stream_layouts, 4242, "rules_stream", true);
}

/* Graphs stream cannot chunk are refused with a diagnostic naming the node, never computed
 * wrongly: K/V stored naturally (sliced by rows they would not be one token's), rows moved
 * along the sequence (Concat / Slice on the time axis). */
static void test_stream_refusals(void **state)
{
    (void)state;
    void (*builds[2])(gb *) = {build_attention_layouts, build_elementwise};
    for (int i = 0; i < 2; i++) {
        gb b;
        rng_state = 1;
        gb_init(&b);
        builds[i](&b);
        sbp_objective chosen;
        assert_int_equal(sbp_pass_objective(b.g, SBP_OBJECTIVE_SFT, &chosen), IR_OK);
        sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .chunk = 2};
        assert_null(sbp_train_build(b.g, chosen, &o));
        bool found = false;
        for (int k = 0; k < b.d.n; k++)
            if (b.d.entries[k].node && strstr(b.d.entries[k].msg, "stream: cannot run chunk")) {
                print_message("  %s: %s\n", b.d.entries[k].node, b.d.entries[k].msg);
                found = true;
            }
        assert_true(found);
        ir_graph_free(b.g);
        ir_diag_free(&b.d);
    }
}

/* The training program of the graph `build` makes (weights from seed), with the SFT objective
 * and options o; asserts that it builds. The caller frees b.g and b.d. */
static sbp_train_program *program_of(gb *b, void (*build)(gb *), unsigned seed,
                                     sbp_train_options o)
{
    rng_state = seed;
    gb_init(b);
    build(b);
    sbp_objective chosen;
    assert_int_equal(sbp_pass_objective(b->g, SBP_OBJECTIVE_SFT, &chosen), IR_OK);
    sbp_train_program *p = sbp_train_build(b->g, chosen, &o);
    if (!p)
        e2e_print_diag(&b->d);
    assert_non_null(p);
    return p;
}

static void test_elementwise(void **state)
{
    (void)state;
    check_fd(build_elementwise, 777, "rules_elementwise", false);
}

static void test_activations(void **state)
{
    (void)state;
    check_fd(build_activations, 31, "rules_activations", true);
    /* the --precision bf16 program too (built, not run: the CPU target has no bf16 steps):
     * ReLU and tanh have bf16 forms and take bf16 activations */
    for (int k = 0; k < 2; k++) {
        gb b;
        sbp_train_options o = {.strategy = k ? SBP_STRATEGY_STREAM : SBP_STRATEGY_STORE,
                               .chunk = 2, .logits_chunk = 3, .bf16 = true};
        sbp_train_program *p = program_of(&b, build_activations, 31, o);
        assert_true(p->bf16);
        ir_graph_free(b.g);
        ir_diag_free(&b.d);
    }
}

static void test_softcap_head(void **state)
{
    (void)state;
    check_fd(build_softcap, 2024, "rules_softcap", true);
}

/* x * c and x / c by one-element constants: gradients against finite differences (store,
 * checkpoint, stream), and the programs, fp32 and --precision bf16 (built, not run), hold the
 * scalar kernels and no broadcast or permute (with broadcasts, the constants would be fp32
 * operands of bf16 kernels, which --precision bf16 refuses). */
static void test_scaled(void **state)
{
    (void)state;
    check_fd(build_scaled, 555, "rules_scaled", true);
    for (int k = 0; k < 4; k++) {
        gb b;
        sbp_train_options o = {.strategy = k & 1 ? SBP_STRATEGY_STREAM : SBP_STRATEGY_STORE,
                               .chunk = 2, .logits_chunk = 3, .bf16 = k >= 2};
        sbp_train_program *p = program_of(&b, build_scaled, 555, o);
        int count[TP_K_COUNT] = {0};
        for (int bi = 0; bi < p->n_blocks; bi++)
            for (int i = 0; i < p->blocks[bi]->n_insts; i++)
                count[p->blocks[bi]->insts[i].k]++;
        print_message("  rules_scaled %s%s: %d scale, %d div_scalar, %d scale_accumulate, "
                      "%d div_scalar_accumulate\n",
                      sbp_strategy_name(o.strategy), o.bf16 ? " bf16" : "", count[TP_K_SCALE],
                      count[TP_K_DIV_SCALAR], count[TP_K_SCALE_ACCUMULATE],
                      count[TP_K_DIV_SCALAR_ACCUMULATE]);
        assert_true(count[TP_K_SCALE] >= 2 && count[TP_K_DIV_SCALAR] >= 2);
        assert_true(count[TP_K_SCALE_ACCUMULATE] >= 2 && count[TP_K_DIV_SCALAR_ACCUMULATE] >= 2);
        assert_int_equal(count[TP_K_BROADCAST_FWD] + count[TP_K_BROADCAST_BWD], 0);
        assert_int_equal(count[TP_K_PERMUTE_FWD] + count[TP_K_PERMUTE_BWD], 0);
        ir_graph_free(b.g);
        ir_diag_free(&b.d);
    }
}

/* The stream program of a head whose logits Tanh / ReLU make: the gradient does overwrite the
 * logits (the rule's dout operand is the logits' own buffer, not a gradient buffer), and the
 * rule reads something else (Tanh: its output recomputed, ReLU: its input). */
static void check_logits_rule(void (*build)(gb *), tp_kernel k)
{
    gb b;
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .chunk = 2, .logits_chunk = 3};
    sbp_train_program *p = program_of(&b, build, 5, o);
    int found = 0;
    for (int bi = 0; bi < p->n_blocks; bi++)
        for (int i = 0; i < p->blocks[bi]->n_insts; i++) {
            const tp_inst *in = &p->blocks[bi]->insts[i];
            if (in->k != k)
                continue;
            found++;
            assert_false(p->bufs[in->buf[1]]->is_grad); /* dout is the logits' buffer */
            assert_int_not_equal(in->buf[2], in->buf[1]);
        }
    assert_true(found > 0);
    ir_graph_free(b.g);
    ir_diag_free(&b.d);
}

static void test_activation_logits(void **state)
{
    (void)state;
    check_logits_rule(build_tanh_logits, TP_K_TANH_BWD);
    check_logits_rule(build_relu_logits, TP_K_RELU_BWD);
    check_fd(build_tanh_logits, 99, "rules_tanh_logits", true);
    check_fd(build_relu_logits, 98, "rules_relu_logits", true);
}

int main(void)
{
    e2e_init();
    if (sbprt_ctx_create(&e2e_ctx, 1) != SBPRT_OK)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_layouts),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_stream_layouts),
        cmocka_unit_test(test_stream_refusals),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_softcap_head),
        cmocka_unit_test(test_scaled),
        cmocka_unit_test(test_activation_logits),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    sbprt_ctx_destroy(e2e_ctx);
    return rc;
}
