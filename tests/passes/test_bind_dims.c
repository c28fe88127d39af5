/* test_bind_dims.c — binding the batch/sequence symbols read from the token-id input. */
#include "pass_test.h"

/* Symbols are whatever the exporter wrote; every value using them is bound, others are not. */
static void test_binds_everywhere(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *mask =
        val(g, IR_VAL_INPUT, "mask", IR_DT_FLOAT, "batch_size,s0"); /* float: skipped */
    ir_value *ids = val(g, IR_VAL_INPUT, "input_ids", IR_DT_INT64, "batch_size,s0");
    ir_value *lab = val(g, IR_VAL_INPUT, "labels", IR_DT_INT64, "batch_size,s0");
    ir_value *other = val(g, IR_VAL_INPUT, "other", IR_DT_FLOAT, "past,s0");
    ir_value *wte = val(g, IR_VAL_PARAM, "wte", IR_DT_FLOAT, "64,32");
    ir_node *e = NODE(g, IR_OP_GATHER, "emb", 1, wte, ids);
    ir_node *a = NODE(g, IR_OP_ADD, "add", 1, mask, lab);
    (void)a;
    add_output(g, e->out[0]);
    assert_int_equal(ir_infer_graph(g), IR_ERR); /* f32 + i64: unrelated, on purpose */
    ir_diag_free(&t->diag);
    ir_diag_init(&t->diag, NULL);
    a->dead = true;
    ir_graph_compact(g);
    assert_int_equal(sbp_pass_bind_dims(g, 2, 64), IR_OK);
    assert_type(ids, "i64[2,64]");
    assert_type(lab, "i64[2,64]");
    assert_type(mask, "f32[2,64]");
    assert_type(other, "f32[past,64]"); /* not ours to bind */
    assert_type(e->out[0], "f32[2,64,32]");
    assert_int_equal(g->bind_batch, 2);
    assert_int_equal(g->bind_seq, 64);
    tg_free(t);
}

static void test_static_mismatch(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    val(g, IR_VAL_INPUT, "input_ids", IR_DT_INT64, "2,64");
    assert_int_equal(sbp_pass_bind_dims(g, 2, 64), IR_OK); /* agreeing is fine */
    assert_int_equal(sbp_pass_bind_dims(g, 4, 128), IR_ERR);
    assert_true(diag_has(&t->diag, "'input_ids'", "batch", "2", "--batch 4", NULL));
    assert_true(diag_has(&t->diag, "'input_ids'", "sequence", "64", "--seq-len 128", NULL));
    tg_free(t);
}

static void test_partial_and_invalid(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *ids = val(g, IR_VAL_INPUT, "ids", IR_DT_INT32, "batch,sequence");
    assert_int_equal(sbp_pass_bind_dims(g, 0, 0), IR_OK); /* nothing given: left symbolic */
    assert_type(ids, "i32[batch,sequence]");
    assert_int_equal(sbp_pass_bind_dims(g, 0, 16), IR_OK); /* only --seq-len */
    assert_type(ids, "i32[batch,16]");
    assert_int_equal(sbp_pass_bind_dims(g, -1, 16), IR_ERR);
    assert_true(diag_has(&t->diag, "--batch", "-1", NULL));
    tg_free(t);
}

static void test_no_token_input(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    val(g, IR_VAL_INPUT, "embeds", IR_DT_FLOAT, "batch,sequence,32");
    val(g, IR_VAL_INPUT, "ids3", IR_DT_INT64, "batch,sequence,2");
    assert_int_equal(sbp_pass_bind_dims(g, 2, 64), IR_ERR);
    assert_true(diag_has(&t->diag, "no integer input of rank 2", NULL));
    tg_free(t);
}

/* Binding can expose a contradiction that was hidden behind symbols: inference reports it. */
static void test_reinfer_finds_contradiction(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *ids = val(g, IR_VAL_INPUT, "input_ids", IR_DT_INT64, "batch,sequence");
    ir_value *pos = val(g, IR_VAL_PARAM, "pos", IR_DT_FLOAT, "64,32");
    ir_value *wte = val(g, IR_VAL_PARAM, "wte", IR_DT_FLOAT, "64,32");
    ir_node *e = NODE(g, IR_OP_GATHER, "emb", 1, wte, ids);
    ir_node *a = NODE(g, IR_OP_ADD, "add_pos", 1, e->out[0], pos);
    assert_int_equal(ir_infer_graph(g), IR_OK);
    assert_type(a->out[0], "f32[batch,64,32]");
    assert_int_equal(sbp_pass_bind_dims(g, 2, 128), IR_ERR);
    assert_true(diag_has(&t->diag, "add_pos", "128", "64", NULL));
    tg_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binds_everywhere),
        cmocka_unit_test(test_static_mismatch),
        cmocka_unit_test(test_partial_and_invalid),
        cmocka_unit_test(test_no_token_input),
        cmocka_unit_test(test_reinfer_finds_contradiction),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
