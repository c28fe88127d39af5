/* test_params.c — which float initializers stay trainable PARAMs (passes/graph/params.c).
 *
 * Each rule on a small hand-built graph: the exporter's graph signature first (PARAMETER keeps
 * even a scalar, BUFFER / CONSTANT_TENSOR demote even a weight-shaped tensor, names must match
 * exactly), then scalars, then "by use": a tensor is a parameter only when it meets token data
 * (directly or through layout-only ops) or is the table of a Gather/GatherND; Shape and Size
 * of an input carry no token data, so a rotary inv_freq multiplied with positions computed from
 * Shape(input_ids) is a constant.
 */
#include "pass_test.h"

enum { BATCH = 2, SEQ = 16, HID = 8 };

static void infer_ok(tgraph *t)
{
    if (ir_infer_graph(t->g) != IR_OK)
        diag_dump(&t->diag);
    assert_int_equal(ir_infer_graph(t->g), IR_OK);
}

/* input_ids [2,16] -> Gather(wte [32,8]) -> h [2,16,8]: token data to meet. */
static ir_value *embed(ir_graph *g, ir_value **ids_out, ir_value **wte_out)
{
    ir_value *ids = val(g, IR_VAL_INPUT, "input_ids", IR_DT_INT64, "2,16");
    ir_value *wte = val(g, IR_VAL_PARAM, "wte", IR_DT_FLOAT, "32,8");
    ir_node *e = NODE(g, IR_OP_GATHER, "embed", 1, wte, ids);
    if (ids_out)
        *ids_out = ids;
    if (wte_out)
        *wte_out = wte;
    return e->out[0];
}

/* positions [16] as float, computed from Shape(input_ids): Range(0, Shape(ids)[1], 1). */
static ir_value *positions(ir_graph *g, ir_value *ids)
{
    ir_node *sh = NODE(g, IR_OP_SHAPE, "pos_shape", 1, ids);
    ir_node *g1 = NODE(g, IR_OP_GATHER, "pos_len", 1, sh->out[0], si64(g, "one_i", 1));
    ir_node *r = NODE(g, IR_OP_RANGE, "pos_range", 1, si64(g, "zero_i", 0), g1->out[0],
                      si64(g, "step_i", 1));
    ir_node *c = NODE(g, IR_OP_CAST, "pos_float", 1, r->out[0]);
    ir_attr_set_int(g, c, "to", IR_DT_FLOAT);
    return c->out[0];
}

/* A weight read by MatMul with the activations stays a parameter; one read through
 * Transpose (slot 0) and then MatMul too; and through a chain of every layout-only op. */
static void test_matmul_and_layout(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *wte;
    ir_value *h = embed(g, NULL, &wte);
    ir_value *w = val(g, IR_VAL_PARAM, "q_proj.weight", IR_DT_FLOAT, "8,8");
    ir_node *mm = NODE(g, IR_OP_MATMUL, "q_proj", 1, h, w);
    ir_value *wt = val(g, IR_VAL_PARAM, "val_12", IR_DT_FLOAT, "8,8"); /* dynamo's name */
    ir_node *tp = NODE(g, IR_OP_TRANSPOSE, "wt_T", 1, wt);
    ir_attr_set_ints(g, tp, "perm", (int64_t[]){1, 0}, 2);
    ir_node *mm2 = NODE(g, IR_OP_MATMUL, "k_proj", 1, mm->out[0], tp->out[0]);
    /* [1,8] -> Reshape [8] -> Cast -> Identity -> Unsqueeze [1,8] -> Squeeze [8] -> Flatten
     * [1,8] ... -> Mul with the rows */
    ir_value *nw = val(g, IR_VAL_PARAM, "norm.weight", IR_DT_FLOAT, "1,8");
    ir_node *rs = NODE(g, IR_OP_RESHAPE, "nw_rs", 1, nw, ci64(g, "s8", 1, (int64_t[]){8}));
    ir_node *ca = NODE(g, IR_OP_CAST, "nw_cast", 1, rs->out[0]);
    ir_attr_set_int(g, ca, "to", IR_DT_FLOAT);
    ir_node *id = NODE(g, IR_OP_IDENTITY, "nw_id", 1, ca->out[0]);
    ir_node *us = NODE(g, IR_OP_UNSQUEEZE, "nw_us", 1, id->out[0], ci64(g, "a0", 1, (int64_t[]){0}));
    ir_node *sq = NODE(g, IR_OP_SQUEEZE, "nw_sq", 1, us->out[0], ci64(g, "a0b", 1, (int64_t[]){0}));
    ir_node *fl = NODE(g, IR_OP_FLATTEN, "nw_fl", 1, sq->out[0]);
    ir_attr_set_int(g, fl, "axis", 0);
    ir_node *mul = NODE(g, IR_OP_MUL, "norm_mul", 1, mm2->out[0], fl->out[0]);
    add_output(g, mul->out[0]);
    infer_ok(t);
    assert_int_equal(sbp_pass_params(g), IR_OK);
    assert_int_equal(wte->kind, IR_VAL_PARAM);
    assert_int_equal(w->kind, IR_VAL_PARAM);
    assert_int_equal(wt->kind, IR_VAL_PARAM);
    assert_int_equal(nw->kind, IR_VAL_PARAM);
    assert_int_equal(t->diag.n, 0); /* nothing demoted: no note */
    tg_free(t);
}

/* Rotary inv_freq meets only positions computed from Shape(input_ids) (no token data): a
 * constant, whether multiplied directly or read through Unsqueeze into a MatMul (HF's
 * inv_freq[None, :, None] @ position_ids[:, None, :]). The weights next to it stay. */
static void test_rotary_inv_freq(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *ids, *wte;
    ir_value *h = embed(g, &ids, &wte);
    ir_value *pos = positions(g, ids);
    /* (a) Mul(Unsqueeze(pos, 1) [16,1], inv_freq [4]) -> [16,4] */
    ir_value *inv = val(g, IR_VAL_PARAM, "model.rotary_emb.inv_freq", IR_DT_FLOAT, "4");
    ir_node *pu = NODE(g, IR_OP_UNSQUEEZE, "pos_u", 1, pos, ci64(g, "ax1", 1, (int64_t[]){1}));
    ir_node *fr = NODE(g, IR_OP_MUL, "freqs", 1, pu->out[0], inv);
    ir_node *cs = NODE(g, IR_OP_COS, "cos", 1, fr->out[0]);
    /* (b) MatMul(Unsqueeze(inv2, [0, 2]) [1,4,1], Unsqueeze(pos, [0, 1]) [1,1,16]) */
    ir_value *inv2 = val(g, IR_VAL_PARAM, "val_3", IR_DT_FLOAT, "4");
    ir_node *iu = NODE(g, IR_OP_UNSQUEEZE, "inv_u", 1, inv2, ci64(g, "ax02", 2, (int64_t[]){0, 2}));
    ir_node *pu2 = NODE(g, IR_OP_UNSQUEEZE, "pos_u2", 1, pos, ci64(g, "ax01", 2, (int64_t[]){0, 1}));
    ir_node *fm = NODE(g, IR_OP_MATMUL, "freqs_mm", 1, iu->out[0], pu2->out[0]);
    ir_node *sn = NODE(g, IR_OP_SIN, "sin", 1, fm->out[0]);
    /* the projection that the tables would rotate: a real weight */
    ir_value *w = val(g, IR_VAL_PARAM, "q_proj.weight", IR_DT_FLOAT, "8,8");
    ir_node *mm = NODE(g, IR_OP_MATMUL, "q_proj", 1, h, w);
    add_output(g, cs->out[0]);
    add_output(g, sn->out[0]);
    add_output(g, mm->out[0]);
    infer_ok(t);
    assert_int_equal(sbp_pass_params(g), IR_OK);
    assert_int_equal(inv->kind, IR_VAL_CONST);
    assert_int_equal(inv2->kind, IR_VAL_CONST);
    assert_int_equal(w->kind, IR_VAL_PARAM);
    assert_int_equal(wte->kind, IR_VAL_PARAM);
    assert_true(diag_has(&t->diag, "2 float initializer(s) are constants", "0 buffer(s)",
                         "0 scalar(s)", "2 that never meet the token data",
                         "'model.rotary_emb.inv_freq'", NULL));
    /* now foldable: the whole table is a function of constants */
    assert_int_equal(sbp_pass_fold(g), IR_OK);
    assert_true(ir_value_is_const(cs->out[0]));
    assert_true(ir_value_is_const(sn->out[0]));
    assert_type(cs->out[0], "f32[16,4]");
    assert_type(sn->out[0], "f32[1,4,16]");
    assert_false(ir_value_is_const(mm->out[0]));
    tg_free(t);
}

/* Shape and Size read only the shape: a tensor that meets Cast(Size(x)) or a Shape-derived
 * value is a constant; one that meets Cast(x) itself is a parameter. */
static void test_shape_size_no_tokens(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *x = val(g, IR_VAL_INPUT, "x", IR_DT_INT64, "2,16");
    ir_node *sz = NODE(g, IR_OP_SIZE, "size", 1, x);
    ir_node *szf = NODE(g, IR_OP_CAST, "size_f", 1, sz->out[0]);
    ir_attr_set_int(g, szf, "to", IR_DT_FLOAT);
    ir_value *a = val(g, IR_VAL_PARAM, "a", IR_DT_FLOAT, "4");
    ir_node *ma = NODE(g, IR_OP_MUL, "mul_size", 1, a, szf->out[0]);
    ir_node *sh = NODE(g, IR_OP_SHAPE, "shape", 1, x);
    ir_node *shf = NODE(g, IR_OP_CAST, "shape_f", 1, sh->out[0]);
    ir_attr_set_int(g, shf, "to", IR_DT_FLOAT);
    ir_value *b = val(g, IR_VAL_PARAM, "b", IR_DT_FLOAT, "2");
    ir_node *mb = NODE(g, IR_OP_ADD, "add_shape", 1, shf->out[0], b);
    ir_node *xf = NODE(g, IR_OP_CAST, "x_f", 1, x);
    ir_attr_set_int(g, xf, "to", IR_DT_FLOAT);
    ir_value *c = val(g, IR_VAL_PARAM, "c", IR_DT_FLOAT, "16");
    ir_node *mc = NODE(g, IR_OP_MUL, "mul_x", 1, c, xf->out[0]);
    /* a tensor that meets only other constants and parameters */
    ir_value *d = val(g, IR_VAL_PARAM, "d", IR_DT_FLOAT, "16");
    ir_node *md = NODE(g, IR_OP_ADD, "add_consts", 1, d, c);
    add_output(g, ma->out[0]);
    add_output(g, mb->out[0]);
    add_output(g, mc->out[0]);
    add_output(g, md->out[0]);
    infer_ok(t);
    assert_int_equal(sbp_pass_params(g), IR_OK);
    assert_int_equal(a->kind, IR_VAL_CONST);
    assert_int_equal(b->kind, IR_VAL_CONST);
    assert_int_equal(c->kind, IR_VAL_PARAM);
    assert_int_equal(d->kind, IR_VAL_CONST);
    tg_free(t);
}

/* A learned position embedding is read with positions only (constant indices): still a
 * weight, as the table (input 0) of Gather or GatherND. The same tensor as Gather's indices
 * would not count, nor does a table read through a non-layout op first. */
static void test_gather_tables(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *ids, *wte;
    ir_value *h = embed(g, &ids, &wte);
    int64_t pidx[SEQ];
    for (int i = 0; i < SEQ; i++)
        pidx[i] = i;
    ir_value *wpe = val(g, IR_VAL_PARAM, "wpe", IR_DT_FLOAT, "16,8");
    ir_node *pe = NODE(g, IR_OP_GATHER, "pos_embed", 1, wpe, ci64(g, "pidx", SEQ, pidx));
    ir_node *add = NODE(g, IR_OP_ADD, "add_pos", 1, h, pe->out[0]);
    /* GatherND: table [16,8], indices [16,1] -> [16,8] */
    ir_value *tab = val(g, IR_VAL_PARAM, "table_nd", IR_DT_FLOAT, "16,8");
    const int64_t id2[2] = {SEQ, 1};
    ir_value *ndidx = ir_const_new(g, "ndidx", IR_DT_INT64, 2, id2, pidx);
    ir_node *gnd = NODE(g, IR_OP_GATHER_ND, "pos_embed_nd", 1, tab, ndidx);
    ir_node *add2 = NODE(g, IR_OP_ADD, "add_pos_nd", 1, add->out[0], gnd->out[0]);
    /* a table transposed first (layout op) and then gathered: still the table */
    ir_value *tabt = val(g, IR_VAL_PARAM, "table_t", IR_DT_FLOAT, "8,16");
    ir_node *tp = NODE(g, IR_OP_TRANSPOSE, "table_T", 1, tabt);
    ir_attr_set_ints(g, tp, "perm", (int64_t[]){1, 0}, 2);
    ir_node *gt = NODE(g, IR_OP_GATHER, "pos_embed_t", 1, tp->out[0], ci64(g, "pidx2", SEQ, pidx));
    ir_node *add3 = NODE(g, IR_OP_ADD, "add_pos_t", 1, add2->out[0], gt->out[0]);
    /* a table scaled by a scalar constant first, then gathered with constant indices: still a
     * weight (arithmetic with a scalar is followed, as for Gemma's 1 + w) */
    ir_value *tabs = val(g, IR_VAL_PARAM, "table_scaled", IR_DT_FLOAT, "16,8");
    ir_node *ms = NODE(g, IR_OP_MUL, "table_mul", 1, tabs, sf32(g, "two", 2.0f));
    ir_node *gs = NODE(g, IR_OP_GATHER, "pos_embed_s", 1, ms->out[0], ci64(g, "pidx3", SEQ, pidx));
    ir_node *add4 = NODE(g, IR_OP_ADD, "add_pos_s", 1, add3->out[0], gs->out[0]);
    add_output(g, add4->out[0]);
    infer_ok(t);
    assert_type(gnd->out[0], "f32[16,8]");
    assert_int_equal(sbp_pass_params(g), IR_OK);
    assert_int_equal(wte->kind, IR_VAL_PARAM);
    assert_int_equal(wpe->kind, IR_VAL_PARAM);
    assert_int_equal(tab->kind, IR_VAL_PARAM);
    assert_int_equal(tabt->kind, IR_VAL_PARAM);
    assert_int_equal(tabs->kind, IR_VAL_PARAM);
    tg_free(t);
}

/* Gemma's RMSNorm scales by (1 + w): without constant folding (TorchScript,
 * do_constant_folding=False) w meets the tokens only through Add(w, 1). It is a weight; a vector
 * multiplied by a non-scalar constant first (a rotary table in the making) is not. */
static void test_one_plus_w(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *h = embed(g, NULL, NULL);
    ir_value *w = val(g, IR_VAL_PARAM, "norm.weight", IR_DT_FLOAT, "8");
    ir_node *a = NODE(g, IR_OP_ADD, "one_plus_w", 1, w, sf32(g, "one", 1.0f));
    ir_node *m = NODE(g, IR_OP_MUL, "scale", 1, h, a->out[0]);
    ir_value *f = val(g, IR_VAL_PARAM, "freq", IR_DT_FLOAT, "8");
    float pv[16];
    for (int i = 0; i < 16; i++)
        pv[i] = (float)i;
    ir_value *pos = ir_const_new(g, "pos", IR_DT_FLOAT, 2, (const int64_t[]){16, 1}, pv);
    ir_node *pf = NODE(g, IR_OP_MUL, "pos_freq", 1, pos, f);
    ir_node *c = NODE(g, IR_OP_COS, "cos", 1, pf->out[0]);
    ir_node *m2 = NODE(g, IR_OP_MUL, "rot", 1, m->out[0], c->out[0]);
    add_output(g, m2->out[0]);
    infer_ok(t);
    assert_int_equal(sbp_pass_params(g), IR_OK);
    assert_int_equal(w->kind, IR_VAL_PARAM);
    assert_int_equal(f->kind, IR_VAL_CONST);
    tg_free(t);
}

/* Scalars (numel <= 1) are hyper-parameters: eps, a scale, a [1] fill value, even when they
 * meet token data. */
static void test_scalars(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *h = embed(g, NULL, NULL);
    ir_value *eps = val(g, IR_VAL_PARAM, "eps", IR_DT_FLOAT, "");
    ir_value *one = val(g, IR_VAL_PARAM, "one_elem", IR_DT_FLOAT, "1");
    ir_value *two = val(g, IR_VAL_PARAM, "two_elem", IR_DT_FLOAT, "2");
    ir_node *a = NODE(g, IR_OP_ADD, "add_eps", 1, h, eps);
    ir_node *m = NODE(g, IR_OP_MUL, "mul_one", 1, a->out[0], one);
    ir_node *u = NODE(g, IR_OP_UNSQUEEZE, "u", 1, m->out[0], ci64(g, "ax", 1, (int64_t[]){3}));
    ir_node *m2 = NODE(g, IR_OP_MUL, "mul_two", 1, u->out[0], two); /* [2,16,8,1] * [2] */
    add_output(g, m2->out[0]);
    infer_ok(t);
    assert_int_equal(sbp_pass_params(g), IR_OK);
    assert_int_equal(eps->kind, IR_VAL_CONST);
    assert_int_equal(one->kind, IR_VAL_CONST);
    assert_int_equal(two->kind, IR_VAL_PARAM);
    assert_true(diag_has(&t->diag, "2 float initializer(s) are constants", "2 scalar(s)", "'eps'",
                         NULL));
    tg_free(t);
}

/* The exporter's signature outranks both other rules: a PARAMETER scalar stays a parameter, a
 * BUFFER or CONSTANT_TENSOR that meets the tokens (MatMul with the activations, a Gather table)
 * becomes a constant; a name not in the signature (or only a prefix of a target there) falls
 * back to the rules by use. */
static void test_signature(void **state)
{
    (void)state;
    tgraph *t = tg_new(18);
    ir_graph *g = t->g;
    g->torch_signature =
        "# parameters\n"
        "p_model_scale: PARAMETER target='model.scale'\n"
        "p_model_layers_0_mlp_weight_extra: PARAMETER target='model.mlp.weight.extra'\n"
        "b_model_big: BUFFER target='model.big' persistent=True\n"
        "b_model_rotary_emb_inv_freq: BUFFER target='model.rotary_emb.inv_freq' "
        "persistent=False\n"
        "c_lifted_tensor_0: CONSTANT_TENSOR target='lifted_tensor_0'\n"
        "input_ids: USER_INPUT\n"
        "logits: USER_OUTPUT\n";
    ir_value *h = embed(g, NULL, NULL);
    ir_value *scale = val(g, IR_VAL_PARAM, "model.scale", IR_DT_FLOAT, "");
    ir_value *big = val(g, IR_VAL_PARAM, "model.big", IR_DT_FLOAT, "8,8");
    ir_value *inv = val(g, IR_VAL_PARAM, "model.rotary_emb.inv_freq", IR_DT_FLOAT, "8");
    ir_value *lifted = val(g, IR_VAL_PARAM, "lifted_tensor_0", IR_DT_FLOAT, "4,8");
    ir_value *mw = val(g, IR_VAL_PARAM, "model.mlp.weight", IR_DT_FLOAT, ""); /* prefix only */
    ir_value *other = val(g, IR_VAL_PARAM, "val_7", IR_DT_FLOAT, "8,8"); /* not listed */
    ir_node *s = NODE(g, IR_OP_MUL, "scale", 1, h, scale);
    ir_node *mm = NODE(g, IR_OP_MATMUL, "big_mm", 1, s->out[0], big);
    ir_node *mi = NODE(g, IR_OP_MUL, "inv_mul", 1, mm->out[0], inv);
    ir_node *gl = NODE(g, IR_OP_GATHER, "lifted_gather", 1, lifted,
                       ci64(g, "gi", 2, (int64_t[]){0, 3}));
    ir_node *mw_m = NODE(g, IR_OP_MUL, "mw_mul", 1, mi->out[0], mw);
    ir_node *mo = NODE(g, IR_OP_MATMUL, "other_mm", 1, mw_m->out[0], other);
    add_output(g, mo->out[0]);
    add_output(g, gl->out[0]);
    infer_ok(t);
    assert_int_equal(sbp_pass_params(g), IR_OK);
    assert_int_equal(scale->kind, IR_VAL_PARAM);
    assert_int_equal(big->kind, IR_VAL_CONST);
    assert_int_equal(inv->kind, IR_VAL_CONST);
    assert_int_equal(lifted->kind, IR_VAL_CONST);
    assert_int_equal(mw->kind, IR_VAL_CONST); /* scalar, and 'model.mlp.weight.extra' != it */
    assert_int_equal(other->kind, IR_VAL_PARAM);
    assert_true(diag_has(&t->diag, "4 float initializer(s) are constants", "3 buffer(s)",
                         "1 scalar(s)", "0 that never meet", NULL));
    tg_free(t);
}

/* Dead nodes are not uses; non-float initializers and values already constant stay as they
 * are; a second run changes nothing. */
static void test_dead_uses_and_idempotent(void **state)
{
    (void)state;
    tgraph *t = tg_new(17);
    ir_graph *g = t->g;
    ir_value *h = embed(g, NULL, NULL);
    ir_value *w = val(g, IR_VAL_PARAM, "w", IR_DT_FLOAT, "8,8");
    ir_node *mm = NODE(g, IR_OP_MATMUL, "mm", 1, h, w);
    add_output(g, h);
    infer_ok(t);
    mm->dead = true; /* its only use is gone */
    assert_int_equal(sbp_pass_params(g), IR_OK);
    assert_int_equal(w->kind, IR_VAL_CONST);
    int notes = t->diag.n;
    assert_int_equal(sbp_pass_params(g), IR_OK);
    assert_int_equal(t->diag.n, notes); /* nothing more to demote: no second note */
    tg_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_and_layout),
        cmocka_unit_test(test_rotary_inv_freq),
        cmocka_unit_test(test_shape_size_no_tokens),
        cmocka_unit_test(test_gather_tables),
        cmocka_unit_test(test_one_plus_w),
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_signature),
        cmocka_unit_test(test_dead_uses_and_idempotent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
