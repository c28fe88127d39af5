/* test_e2e.c — the compiled training step against PyTorch.
 *
 * For each fixture family (GPT-2, Llama, Qwen3 exported with symbolic dims and bound to B=2, T=64;
 * Qwen3's and Llama's static exports, unbound; Llama exported with its loss in the graph; GPT-2
 * without constant folding, whose tied head stays a Transpose) the model goes through the library
 * exactly as `sbpc -o x.so` does: import, canonicalise, objective, training program (store and
 * checkpoint), C, compiled with -Werror into a shared object, dlopen'd. One step on
 * tests/fixtures/ref/<family>_{input_ids,labels}.npy must give the loss and every parameter
 * gradient of the float64 PyTorch reference (ref/<family>_grads.safetensors): loss relative error
 * <= 1e-5, per tensor ||g - g_ref|| / ||g_ref|| <= 1e-4. The references are keyed by the
 * initializer names of <family>_op17_static.onnx; the dyn and loss exports name their folded
 * weights differently, so parameters are matched to reference names by value (same shape, same
 * bytes: the files hold identical weights). store and checkpoint must agree. The workspace is
 * allocated with exactly the size the step reports, so under AddressSanitizer an undersized plan
 * fails.
 *
 * Also: the generated C compiles without warnings under gcc and clang (-Wall -Wextra
 * -Wpedantic -Werror); --freeze; gradient accumulation and the denominator argument; and an
 * op with no gradient rule is a compile error naming it. Compiling, running and the reference
 * lookup are the e2e tests' shared steps (e2e_util.c).
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

#define B E2E_B
#define T E2E_T

/* ------------------------------------------------------------------ compiling */

/* The SFT step of a fixture (an export ending in its loss gets graph-loss) for strategy st,
 * with the batch and sequence length it was bound to (0: the export's static [2, 64]). */
static void compile_step(e2e_step *s, const char *model, int64_t b, int64_t t, sbp_strategy st,
                         const char *freeze, const char *tag, size_t blob_min_bytes)
{
    sbp_train_options to = {.strategy = st};
    const sbp_codegen_options cg = {.blob_min_bytes = blob_min_bytes};
    e2e_compile_with(s, model, b, t, SBP_OBJECTIVE_SFT, freeze, &to, &cg, tag);
    assert_int_equal(s->info->abi_version, SBP_STEP_ABI_VERSION);
    assert_int_equal(s->info->batch, b ? b : B);
    assert_int_equal(s->info->seq_len, t ? t : T);
}

/* Runs one step; returns the loss. grads must hold param_elems floats. */
static double run_step(const e2e_step *s, const float *params, float *grads, const e2e_batch *bt,
                       int accumulate, double denominator, int64_t *n_scored)
{
    sbp_step_args a = {
        .params = params,
        .grads = grads,
        .accumulate = accumulate,
        .input_ids = bt->ids,
        .labels = bt->labels,
        .denominator = denominator,
        .n_scored = n_scored,
    };
    return e2e_run(s, &a, false);
}

/* ------------------------------------------------------------------ the reference */

/* Compares the loss and every gradient; returns the largest relative gradient error.
 * all_refs: every reference tensor must belong to a parameter. Parameters expected frozen
 * (zero gradient) are those whose info row says so. */
static double check_against_reference(const e2e_step *s, const e2e_reference *r,
                                      const float *grads, double loss, bool all_refs,
                                      const char *label)
{
    double lerr = fabs(loss - r->loss) / fabs(r->loss);
    print_message("  %-28s loss %.9f (ref %.9f, rel err %.2e)\n", label, loss, r->loss, lerr);
    assert_true(lerr <= E2E_REF_LOSS_TOL);
    double worst = 0;
    const char *worst_name = "";
    int matched = 0;
    for (int i = 0; i < s->info->n_params; i++) {
        const sbp_step_param *q = &s->info->params[i];
        const ir_value *v = ir_value_find(s->g, q->name);
        assert_non_null(v);
        const char *rn = e2e_ref_name(r, v);
        if (!rn)
            print_message("  no reference for parameter '%s'\n", q->name);
        assert_non_null(rn);
        double *ref = malloc(q->numel * sizeof *ref), *got = malloc(q->numel * sizeof *got);
        assert_true(ref && got);
        char err[256];
        if (sbpio_st_copy_f64(r->st, rn, ref, (int64_t)q->numel, err, sizeof err) != 0) {
            free(ref); /* nothing to compare against: fail now, not on uninitialised memory */
            free(got);
            fail_msg("  reference '%s' for parameter '%s' is unreadable: %s", rn, q->name, err);
        }
        matched++;
        e2e_grad_of(s->info, grads, i, got);
        if (!q->trainable) {
            for (size_t k = 0; k < q->numel; k++)
                assert_true(got[k] == 0.0);
        } else {
            double rel = e2e_rel_err(got, ref, q->numel);
            if (!(rel <= E2E_REF_GRAD_TOL))
                print_message("  %s (ref %s): rel err %.3e\n", q->name, rn, rel);
            assert_true(rel <= E2E_REF_GRAD_TOL);
            if (rel > worst) {
                worst = rel;
                worst_name = q->name;
            }
        }
        free(ref);
        free(got);
    }
    if (all_refs)
        assert_int_equal(matched, sbpio_st_count(r->st));
    print_message("  %-28s %d parameters, max gradient rel err %.2e (%s)\n", label, matched,
                  worst, worst_name);
    return worst;
}

/* ------------------------------------------------------------------ the family tests */

typedef struct family_case {
    const char *model;   /* fixture file */
    const char *family;  /* reference prefix */
    int64_t b, t;        /* bindings (0: static) */
    bool all_refs;       /* the model has a parameter for every reference tensor */
    const char *objective;
    size_t blob_min_bytes; /* sbp_codegen_options' (0: the default) */
} family_case;

static void run_family(const family_case *fc)
{
    e2e_reference r;
    e2e_load_reference(&r, fc->family, NULL);
    e2e_step st[2];
    float *grads[2];
    double loss[2];
    const sbp_strategy strategies[2] = {SBP_STRATEGY_STORE, SBP_STRATEGY_CHECKPOINT};
    for (int k = 0; k < 2; k++) {
        char tag[256];
        snprintf(tag, sizeof tag, "%s_%s", fc->model, sbp_strategy_name(strategies[k]));
        char *dot = strstr(tag, ".onnx");
        if (dot)
            memmove(dot, dot + 5, strlen(dot + 5) + 1);
        compile_step(&st[k], fc->model, fc->b, fc->t, strategies[k], NULL, tag,
                     fc->blob_min_bytes);
        assert_string_equal(st[k].info->objective, fc->objective);
        float *params = e2e_param_block(st[k].info, st[k].g);
        grads[k] = malloc((st[k].info->param_elems + 1) * sizeof(float));
        for (size_t i = 0; i < st[k].info->param_elems; i++)
            grads[k][i] = NAN; /* accumulate = 0 must overwrite */
        int64_t n_scored = -1;
        loss[k] = run_step(&st[k], params, grads[k], &r.bt, 0, 0, &n_scored);
        assert_int_equal(n_scored, B * T - 5 - 7); /* the fixture's ignored positions */
        print_message("  %s: workspace %zu bytes\n", tag, st[k].info->workspace_bytes);
        check_against_reference(&st[k], &r, grads[k], loss[k], fc->all_refs, tag);
        free(params);
    }
    /* store and checkpoint: the same computation, segment by segment */
    assert_int_equal(st[0].info->param_elems, st[1].info->param_elems);
    assert_true(fabs(loss[0] - loss[1]) <= 1e-7 * fabs(loss[0]));
    double worst = e2e_max_rel_vs(&st[1], grads[1], &st[0], grads[0], 1e-6);
    print_message("  store vs checkpoint: max rel difference %.2e; workspace %zu -> %zu bytes\n",
                  worst, st[0].info->workspace_bytes, st[1].info->workspace_bytes);
    assert_true(worst <= 1e-6);
    assert_true(st[1].info->workspace_bytes < st[0].info->workspace_bytes);
    for (int k = 0; k < 2; k++) {
        free(grads[k]);
        e2e_free_step(&st[k]);
    }
    e2e_free_reference(&r);
}

static const family_case cases[] = {
    {"gpt2_op17_dyn.onnx", "gpt2", B, T, true, "sft", 0},
    {"llama_op17_dyn.onnx", "llama", B, T, true, "sft", 0},
    {"qwen3_op17_dyn.onnx", "qwen3", B, T, true, "sft", 0},
    {"llama_op17_loss.onnx", "llama", 0, 0, true, "graph-loss", 0},
    /* the tie survives as Transpose(wte): no MatMul copy, so not every reference is used */
    {"gpt2_op17_dyn_nofold.onnx", "gpt2", B, T, false, "sft", 0},
    /* a static export, no bindings (the fixture's own [2, 64]) */
    {"qwen3_op17_static.onnx", "qwen3", 0, 0, true, "sft", 0},
    /* every constant to the constants file (test_constants_file) */
    {"llama_op17_static.onnx", "llama", 0, 0, true, "sft", 1},
};

static void test_gpt2(void **state) { (void)state; run_family(&cases[0]); }
static void test_llama(void **state) { (void)state; run_family(&cases[1]); }
static void test_qwen3(void **state) { (void)state; run_family(&cases[2]); }
static void test_llama_graph_loss(void **state) { (void)state; run_family(&cases[3]); }
static void test_gpt2_nofold(void **state) { (void)state; run_family(&cases[4]); }
static void test_qwen3_static(void **state) { (void)state; run_family(&cases[5]); }

/* Every constant (the RoPE tables) in the side file PATH.consts.bin, assembled in by .incbin,
 * as long sequences need: the same gradients as inline arrays. */
static void test_constants_file(void **state)
{
    (void)state;
    run_family(&cases[6]); /* blob_min_bytes 1 */
    char path[1024];
    snprintf(path, sizeof path, "%s/llama_op17_static_store.consts.bin", SBP_E2E_OUT);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    assert_true(n >= (long)(2 * T * 4 * sizeof(float))); /* cos and sin, [T, head_dim 4] */
}

/* ------------------------------------------------------------------ other properties */

/* --freeze: matching parameters get trainable = 0 and a zero gradient; the others are as
 * before (a frozen parameter changes no other gradient). Freezing a tied pair by either name
 * freezes both rows. */
static void test_freeze(void **state)
{
    (void)state;
    e2e_reference r;
    e2e_load_reference(&r, "gpt2", NULL);
    e2e_step s;
    compile_step(&s, "gpt2_op17_dyn.onnx", B, T, SBP_STRATEGY_STORE, "ln_f|wpe|wte",
                 "gpt2_frozen", 0);
    int frozen = 0;
    for (int i = 0; i < s.info->n_params; i++) {
        const char *n = s.info->params[i].name;
        bool want = strstr(n, "ln_f") || strstr(n, "wpe") || strstr(n, "wte") ||
                    s.info->params[i].tied_to >= 0;
        assert_int_equal(s.info->params[i].trainable, want ? 0 : 1);
        frozen += want;
    }
    assert_int_equal(frozen, 5);
    /* the gradient block holds the trained parameters only, packed in table order */
    size_t trained = 0;
    for (int i = 0; i < s.info->n_params; i++) {
        const sbp_step_param *q = &s.info->params[i];
        if (q->trainable && q->tied_to < 0) {
            assert_int_equal(q->grad_offset, trained);
            trained += q->numel;
        } else if (q->tied_to < 0) {
            assert_true(q->grad_offset == SIZE_MAX);
        }
    }
    assert_int_equal(s.info->grad_elems, trained);
    assert_true(s.info->grad_elems < s.info->param_elems);
    assert_int_equal(s.info->planned_peak_bytes,
                     (s.info->param_elems + s.info->grad_elems) * sizeof(float) +
                         s.info->workspace_bytes);
    float *params = e2e_param_block(s.info, s.g);
    float *grads = malloc(s.info->param_elems * sizeof(float));
    double loss = run_step(&s, params, grads, &r.bt, 0, 0, NULL);
    check_against_reference(&s, &r, grads, loss, true, "gpt2 frozen");
    free(params);
    free(grads);
    e2e_free_step(&s);

    /* a bad regular expression is a diagnostic, not a crash */
    ir_diag d;
    sbp_objective chosen;
    ir_graph *g = e2e_front("gpt2_op17_dyn.onnx", B, T, SBP_OBJECTIVE_SFT, &d, &chosen);
    assert_int_equal(sbp_freeze_params(g, "(unclosed", NULL), IR_ERR);
    assert_true(d.n_errors > 0);
    ir_graph_free(g);
    ir_diag_free(&d);
    e2e_free_reference(&r);
}

/* accumulate adds to the gradients; the denominator replaces the batch's count. */
static void test_accumulate(void **state)
{
    (void)state;
    e2e_reference r;
    e2e_load_reference(&r, "llama", NULL);
    e2e_step s;
    compile_step(&s, "llama_op17_dyn.onnx", B, T, SBP_STRATEGY_CHECKPOINT, NULL, "llama_acc", 0);
    size_t n = s.info->param_elems;
    float *params = e2e_param_block(s.info, s.g), *g1 = malloc(n * sizeof(float)),
          *g2 = malloc(n * sizeof(float)), *g3 = malloc(n * sizeof(float));
    int64_t scored = 0;
    double l1 = run_step(&s, params, g1, &r.bt, 0, 0, &scored);
    memcpy(g2, g1, n * sizeof(float));
    double l2 = run_step(&s, params, g2, &r.bt, 1, 0, NULL);
    double l3 = run_step(&s, params, g3, &r.bt, 0, 2.0 * (double)scored, NULL);
    assert_true(l1 == l2);
    assert_true(fabs(l3 - l1 / 2) <= 1e-6 * l1);
    /* per tensor: the second step's contributions are added one by one, so elementwise the
     * rounding differs from 2 * g1 */
    for (int i = 0; i < s.info->n_params; i++) {
        const sbp_step_param *q = &s.info->params[i];
        double d2 = 0, d3 = 0, ref = 0;
        if (q->tied_to >= 0)
            continue; /* its gradient is its owner's */
        for (size_t k = q->grad_offset; k < q->grad_offset + q->numel; k++) {
            d2 += ((double)g2[k] - 2.0 * g1[k]) * ((double)g2[k] - 2.0 * g1[k]);
            d3 += ((double)g3[k] - 0.5 * g1[k]) * ((double)g3[k] - 0.5 * g1[k]);
            ref += (double)g1[k] * g1[k];
        }
        assert_true(sqrt(d2) <= 1e-6 * 2 * sqrt(ref));
        assert_true(sqrt(d3) <= 1e-6 * 0.5 * sqrt(ref));
    }
    free(params);
    free(g1);
    free(g2);
    free(g3);
    e2e_free_step(&s);
    e2e_free_reference(&r);
}

/* An op on the loss's path without a gradient rule is a compile error that names it. */
static void test_no_gradient_rule(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, "handmade");
    ir_graph *g = ir_graph_new(&d, "handmade");
    ir_dim dims[2] = {{2, NULL}, {4, NULL}};
    ir_value *ids = ir_value_new(g, "input_ids", IR_VAL_INPUT, IR_DT_INT64, 2, dims);
    g->inputs = ir_arena_calloc(g->arena, 1, sizeof *g->inputs);
    g->inputs[0] = ids;
    g->n_inputs = 1;
    float w[64];
    for (int i = 0; i < 64; i++)
        w[i] = (float)i / 64;
    ir_value *table = ir_const_new(g, "table", IR_DT_FLOAT, 2, (const int64_t[]){8, 8}, w);
    table->kind = IR_VAL_PARAM;
    ir_node *emb = ir_node_new(g, IR_OP_EMBEDDING, "embed", 2, (ir_value *[]){table, ids}, 1);
    assert_non_null(emb);
    ir_node *sin = ir_node_new(g, IR_OP_SIN, "the_sine", 1, (ir_value *[]){emb->out[0]}, 1);
    assert_non_null(sin);
    g->outputs = ir_arena_calloc(g->arena, 1, sizeof *g->outputs);
    g->outputs[0] = sin->out[0];
    g->n_outputs = 1;
    sin->out[0]->is_output = true;
    sbp_objective chosen;
    assert_int_equal(sbp_pass_objective(g, SBP_OBJECTIVE_SFT, &chosen), IR_OK);
    sbp_train_options to = {.strategy = SBP_STRATEGY_STORE};
    assert_null(sbp_train_build(g, chosen, &to));
    bool found = false;
    for (int i = 0; i < d.n; i++)
        if (strstr(d.entries[i].msg, "no gradient rule for op Sin") &&
            strstr(d.entries[i].msg, "the_sine"))
            found = true;
    e2e_print_diag(&d);
    assert_true(found);
    ir_graph_free(g);
    ir_diag_free(&d);
}

/* The generated C compiles without a warning under gcc and clang. */
static void test_warnings(void **state)
{
    (void)state;
    const char *models[] = {"gpt2_op17_dyn.onnx", "qwen3_op17_dyn.onnx", "llama_op17_loss.onnx"};
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        for (int st = 0; st < 2; st++) {
            bool dyn = strstr(models[m], "dyn") != NULL;
            sbp_train_options to = {.strategy = st ? SBP_STRATEGY_CHECKPOINT
                                                   : SBP_STRATEGY_STORE};
            e2e_step s;
            e2e_build(&s, models[m], dyn ? B : 0, dyn ? T : 0, SBP_OBJECTIVE_SFT, NULL, &to);
            char stem[64];
            snprintf(stem, sizeof stem, "warn_%zu_%d", m, st);
            e2e_check_warnings(s.p, models[m], stem, &s.diag);
            e2e_free_step(&s);
        }
    }
}

int main(void)
{
    e2e_init();
    if (sbprt_ctx_create(&e2e_ctx, 0) != SBPRT_OK)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_llama_graph_loss),
        cmocka_unit_test(test_gpt2_nofold),
        cmocka_unit_test(test_qwen3_static),
        cmocka_unit_test(test_constants_file),
        cmocka_unit_test(test_freeze),
        cmocka_unit_test(test_accumulate),
        cmocka_unit_test(test_no_gradient_rule),
        cmocka_unit_test(test_warnings),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    sbprt_ctx_destroy(e2e_ctx);
    return rc;
}
