/* test_ir.c — unit tests of the IR core: arena, diagnostics, builder, name index, attributes,
 * use lists, topological sort (including cycle detection), the verifier and the printer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

static ir_value *input(ir_graph *g, const char *name, int64_t a, int64_t b)
{
    ir_dim d[2] = {{a, NULL}, {b, NULL}};
    ir_value *v = ir_value_new(g, name, IR_VAL_INPUT, IR_DT_FLOAT, 2, d);
    g->inputs = realloc(g->inputs, sizeof(ir_value *) * (size_t)(g->n_inputs + 1));
    g->inputs[g->n_inputs++] = v;
    return v;
}

static void set_output(ir_graph *g, ir_value *v)
{
    g->outputs = ir_arena_alloc(g->arena, sizeof(ir_value *));
    g->outputs[0] = v;
    g->n_outputs = 1;
    v->is_output = true;
}

static void free_graph(ir_graph *g)
{
    free(g->inputs);
    ir_graph_free(g);
}

static void test_arena(void **state)
{
    (void)state;
    ir_arena *a = ir_arena_new();
    char *s = ir_arena_printf(a, "%s_%d", "x", 42);
    assert_string_equal(s, "x_42");
    void *big = ir_arena_alloc(a, 3u << 20); /* larger than a block */
    assert_non_null(big);
    assert_true(((uintptr_t)big & 15) == 0);
    assert_null(ir_arena_calloc(a, SIZE_MAX / 2, 4)); /* overflow refused, not attempted */
    ir_arena_free(a);
}

static void test_diag_format(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, "model.onnx");
    assert_int_equal(ir_diag_add(&d, IR_SEV_ERROR, "/blocks.0/Add_3", "Add", "bad %d", 7), IR_ERR);
    ir_diag_note(&d, "just so");
    char buf[512] = {0};
    FILE *f = fmemopen(buf, sizeof buf, "w");
    ir_diag_print(&d, f, "sbpc");
    fclose(f);
    assert_string_equal(buf, "sbpc: model.onnx: node '/blocks.0/Add_3' (Add): error: bad 7\n"
                             "sbpc: model.onnx: note: just so\n");
    assert_int_equal(d.n_errors, 1);
    ir_diag_free(&d);
}

static void test_names_unique(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = ir_graph_new(&d, "m.onnx");
    ir_value *a = ir_value_new(g, "x", IR_VAL_INPUT, IR_DT_FLOAT, 0, NULL);
    ir_value *b = ir_value_new(g, "x", IR_VAL_INPUT, IR_DT_FLOAT, 0, NULL);
    assert_string_equal(a->name, "x");
    assert_string_not_equal(b->name, "x");
    assert_ptr_equal(ir_value_find(g, "x"), a);
    assert_ptr_equal(ir_value_find(g, b->name), b);
    for (int i = 0; i < 1000; i++) /* grow the index */
        ir_value_new(g, "y", IR_VAL_CONST, IR_DT_FLOAT, 0, NULL);
    assert_ptr_equal(ir_value_find(g, "x"), a);
    assert_null(ir_value_find(g, "nope"));
    ir_graph_free(g);
    ir_diag_free(&d);
}

/* The one reader of constant elements (ir_data_i64 / ir_data_f64, ir_const_*): a BOOL byte
 * other than 0 and 1 is true (1), not the byte; a float becomes an int64 without undefined
 * behaviour (NaN 0, out of range saturated); a uint64 above INT64_MAX reads as a double in
 * range, not through a negative int64. */
static void test_const_readers(void **state)
{
    (void)state;
    const uint8_t b[4] = {0, 1, 2, 255};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ir_data_i64(IR_DT_BOOL, b, i), i > 0);
        assert_true(ir_data_f64(IR_DT_BOOL, b, i) == (i > 0 ? 1.0 : 0.0));
    }
    const float f[4] = {NAN, 1e30f, -1e30f, -2.7f};
    assert_int_equal(ir_data_i64(IR_DT_FLOAT, f, 0), 0);
    assert_int_equal(ir_data_i64(IR_DT_FLOAT, f, 1), INT64_MAX);
    assert_int_equal(ir_data_i64(IR_DT_FLOAT, f, 2), INT64_MIN);
    assert_int_equal(ir_data_i64(IR_DT_FLOAT, f, 3), -2);
    const uint64_t u = UINT64_MAX;
    assert_true(ir_data_f64(IR_DT_UINT64, &u, 0) == 18446744073709551615.0);
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = ir_graph_new(&d, "m.onnx");
    ir_value *c = ir_const_new(g, "mask", IR_DT_BOOL, 1, (int64_t[]){4}, b);
    for (int i = 0; i < 4; i++)
        assert_int_equal(ir_const_i64(c, i), i > 0);
    ir_graph_free(g);
    ir_diag_free(&d);
}

static void test_const_and_types(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = ir_graph_new(&d, "m.onnx");
    int64_t dims[1] = {3};
    int64_t data[3] = {5, -1, 7};
    ir_value *c = ir_const_new(g, "shape", IR_DT_INT64, 1, dims, data);
    assert_int_equal(ir_const_i64(c, 1), -1);
    assert_int_equal(c->nbytes, 24);
    char buf[64];
    assert_string_equal(ir_value_type_str(c, buf, sizeof buf), "i64[3]");
    ir_dim sd[2] = {{-1, "batch"}, {32, NULL}};
    ir_value *v = ir_value_new(g, "h", IR_VAL_INPUT, IR_DT_FLOAT, 2, sd);
    assert_string_equal(ir_value_type_str(v, buf, sizeof buf), "f32[batch,32]");
    assert_int_equal(ir_value_numel(v), -1);
    ir_dim big[3] = {{1ll << 40, NULL}, {1ll << 40, NULL}, {4, NULL}};
    ir_value *o = ir_value_new(g, "o", IR_VAL_INPUT, IR_DT_FLOAT, 3, big);
    assert_int_equal(ir_value_numel(o), -1); /* overflow reported, not wrapped */
    assert_int_equal(ir_dtype_size(IR_DT_BFLOAT16), 2);
    assert_string_equal(ir_dtype_name(IR_DT_INT64), "i64");
    assert_int_equal(ir_op_lookup("", "MatMul"), IR_OP_MATMUL);
    assert_int_equal(ir_op_lookup("ai.onnx", "Softmax"), IR_OP_SOFTMAX);
    assert_int_equal(ir_op_lookup("", "FancyOp"), IR_OP_COUNT);
    assert_int_equal(ir_op_lookup("", "Attention"), IR_OP_COUNT); /* semantic ops never read */
    ir_graph_free(g);
    ir_diag_free(&d);
}

/* a -> Relu -> b ; b,b -> Add -> c  built out of order, then sorted. */
static void test_toposort_and_verify(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = ir_graph_new(&d, "m.onnx");
    ir_value *a = input(g, "a", 2, 3);
    ir_value *b = ir_value_new(g, "b", IR_VAL_NODE, IR_DT_FLOAT, 2, a->dims);
    ir_value *c = ir_value_new(g, "c", IR_VAL_NODE, IR_DT_FLOAT, 2, a->dims);
    ir_value *bb[2] = {b, b};
    ir_node *add = ir_node_new_with_outputs(g, IR_OP_ADD, "add", "Add", 2, bb, 1, &c);
    ir_node *relu = ir_node_new_with_outputs(g, IR_OP_RELU, "relu", "Relu", 1, &a, 1, &b);
    set_output(g, c);
    assert_int_equal(ir_verify(g), IR_ERR); /* b used before defined */
    ir_diag_free(&d);
    ir_diag_init(&d, NULL);
    assert_int_equal(ir_graph_toposort(g), IR_OK);
    assert_ptr_equal(g->nodes[0], relu);
    assert_ptr_equal(g->nodes[1], add);
    assert_int_equal(ir_verify(g), IR_OK);
    assert_int_equal(d.n_errors, 0);
    assert_int_equal(ir_value_use_count(g, b), 2);
    ir_uses u = ir_uses_build(g);
    assert_int_equal(u.n_uses[b->id], 2);
    assert_ptr_equal(u.uses[b->id][1].node, add);
    assert_int_equal(u.uses[b->id][1].slot, 1);
    ir_replace_uses(g, b, a);
    assert_int_equal(ir_value_use_count(g, b), 0);
    assert_ptr_equal(add->in[0], a);

    /* a cycle: relu reads c, which add produces from relu's output */
    relu->in[0] = c;
    add->in[0] = b;
    assert_int_equal(ir_graph_toposort(g), IR_ERR);
    assert_true(d.n_errors > 0);
    assert_non_null(strstr(d.entries[d.n - 1].msg, "cycle"));
    free_graph(g);
    ir_diag_free(&d);
}

static void test_attrs_and_print(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = ir_graph_new(&d, "m.onnx");
    ir_value *a = input(g, "a", 2, 3);
    ir_value *o = ir_value_new(g, "o", IR_VAL_NODE, IR_DT_FLOAT, 2, a->dims);
    ir_node *n = ir_node_new_with_outputs(g, IR_OP_SOFTMAX, "sm", "Softmax", 1, &a, 1, &o);
    ir_attr_set_int(g, n, "axis", -1);
    ir_attr_set_int(g, n, "axis", 1); /* replaces */
    ir_attr_set_string(g, n, "note", "hi");
    assert_int_equal(n->n_attr, 2);
    assert_int_equal(ir_attr_int(n, "axis", 0), 1);
    assert_int_equal(ir_attr_int(n, "missing", 9), 9);
    assert_string_equal(ir_attr_string(n, "note", NULL), "hi");
    set_output(g, o);
    char buf[1024] = {0};
    FILE *f = fmemopen(buf, sizeof buf, "w");
    ir_print(g, f);
    fclose(f);
    assert_non_null(strstr(buf, "input  %a: f32[2,3]\n"));
    assert_non_null(strstr(buf, "%o = Softmax(%a) {axis=1, note=\"hi\"} : f32[2,3]  # sm\n"));
    assert_non_null(strstr(buf, "output %o: f32[2,3]\n"));
    free_graph(g);
    ir_diag_free(&d);
}

static void test_verifier_arity(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = ir_graph_new(&d, "m.onnx");
    ir_value *a = input(g, "a", 2, 3);
    ir_value *o = ir_value_new(g, "o", IR_VAL_NODE, IR_DT_FLOAT, 2, a->dims);
    ir_node_new_with_outputs(g, IR_OP_ADD, "add1", "Add", 1, &a, 1, &o);
    set_output(g, o);
    assert_int_equal(ir_verify(g), IR_ERR);
    assert_string_equal(d.entries[0].node, "add1");
    assert_non_null(strstr(d.entries[0].msg, "inputs"));
    free_graph(g);
    ir_diag_free(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena),
        cmocka_unit_test(test_diag_format),
        cmocka_unit_test(test_names_unique),
        cmocka_unit_test(test_const_readers),
        cmocka_unit_test(test_const_and_types),
        cmocka_unit_test(test_toposort_and_verify),
        cmocka_unit_test(test_attrs_and_print),
        cmocka_unit_test(test_verifier_arity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
