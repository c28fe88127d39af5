/* test_dce.c — dead-code elimination keeps exactly what reaches a graph output. */
#include "pass_test.h"

static void test_dce(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2,8");
    ir_value *w = val(g, IR_VAL_PARAM, "w", IR_DT_FLOAT, "8,8");
    ir_value *unused_w = val(g, IR_VAL_PARAM, "unused_w", IR_DT_FLOAT, "8,8");
    ir_node *mm = NODE(g, IR_OP_MATMUL, "mm", 1, x, w);
    ir_node *dead1 = NODE(g, IR_OP_MATMUL, "dead_mm", 1, x, unused_w);
    ir_node *dead2 = NODE(g, IR_OP_RELU, "dead_relu", 1, dead1->out[0]);
    ir_node *sp = NODE(g, IR_OP_SPLIT, "split", 2, mm->out[0]); /* only output 0 used */
    ir_attr_set_int(g, sp, "axis", 1);
    ir_node *r = NODE(g, IR_OP_RELU, "relu", 1, sp->out[0]);
    ir_node *dead3 = NODE(g, IR_OP_TANH, "dead_tanh", 1, sp->out[1]);
    add_output(g, r->out[0]);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_int_equal(sbp_pass_dce(g), IR_OK);
    assert_int_equal(g->n_nodes, 3);
    assert_true(dead1->dead && dead2->dead && dead3->dead);
    assert_int_equal(ir_value_use_count(g, unused_w), 0);
    assert_int_equal(ir_verify(g), IR_OK);
    /* idempotent */
    assert_int_equal(sbp_pass_dce(g), IR_OK);
    assert_int_equal(g->n_nodes, 3);
    tg_free(t);
}

/* A graph output that is an input or a constant needs no node at all. */
static void test_outputs_without_nodes(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_FLOAT, "2");
    NODE(g, IR_OP_RELU, "relu", 1, x);
    add_output(g, x);
    assert_int_equal(sbp_pass_dce(g), IR_OK);
    assert_int_equal(g->n_nodes, 0);
    tg_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dce),
        cmocka_unit_test(test_outputs_without_nodes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
