/* test_eval.c — the evaluation entry point (sbp_step_eval) end to end.
 *
 * For each fixture family (GPT-2, Llama, Qwen3 bound to B=2, T=64; Llama with its loss in the
 * graph) and each strategy (store, checkpoint, stream at its default chunks and at chunks that
 * do not divide the rows) the model is compiled with its evaluation program into a shared
 * object. On the reference batch, sbp_step_eval's loss must equal the training step's loss on
 * the same batch (relative difference <= 1e-6; the programs run the same forward kernels in the
 * same order, so it is in fact 0) and the float64 PyTorch loss (<= 1e-5, the independent
 * reference), with a workspace of exactly eval_workspace_bytes filled with garbage, and it
 * must not touch the gradient block (args->grads poisoned and checked).
 *
 * The evaluation program itself: no gradient buffer, no backward block, no dlogits (every
 * cross-entropy call has a NULL gradient operand), the parameter table of the training step,
 * and with stream a workspace below the training step's (a layer's input is dead once the next
 * layer read it). A DPO step has no sbp_step_eval (the symbol is absent and
 * eval_workspace_bytes is 0); options.eval = false builds none either.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "e2e_util.h"

#define B E2E_B
#define T E2E_T

typedef int (*eval_fn)(sbprt_ctx *, const sbp_step_args *);

/* The evaluation program's shape: forward only. */
static void check_eval_program(const sbp_train_program *p)
{
    const sbp_train_program *e = p->eval;
    assert_non_null(e);
    assert_true(e->forward_only);
    assert_int_equal(e->param_elems, p->param_elems);
    assert_int_equal(e->n_params, p->n_params);
    for (int i = 0; i < e->n_bufs; i++) {
        if (e->bufs[i]->span) /* a builder's zeroing span: covers nothing here, owns nothing */
            continue;
        assert_false(e->bufs[i]->is_grad);
        assert_int_not_equal(e->bufs[i]->kind, TP_BUF_GRAD);
    }
    int ce = 0;
    for (int b = 0; b < e->n_blocks; b++) {
        const tp_block *blk = e->blocks[b];
        assert_true(strncmp(blk->name, "eval_", 5) == 0);
        assert_null(strstr(blk->name, "backward"));
        for (int i = 0; i < blk->n_insts; i++) {
            const tp_inst *in = &blk->insts[i];
            if (in->k == TP_K_CROSS_ENTROPY) {
                assert_int_equal(in->buf[1], -1); /* no dlogits */
                ce++;
            }
            assert_true(in->k != TP_K_EMBEDDING_BWD && in->k != TP_K_ATTENTION_BWD &&
                        in->k != TP_K_RMSNORM_BWD && in->k != TP_K_LAYERNORM_BWD);
        }
    }
    assert_true(ce > 0);
}

/* Compiles `model` with strategy st (chunks c, lc: 0 automatic) and evaluation; runs the
 * training step and the evaluation on the family's batch; returns eval's loss. */
static void eval_case(const char *model, const char *family, int64_t b, int64_t t,
                      sbp_strategy st, int64_t c, int64_t lc, const char *tag)
{
    e2e_step s = {0};
    sbp_train_options o = {.strategy = st, .chunk = c, .logits_chunk = lc, .eval = true};
    e2e_compile(&s, model, b, t, SBP_OBJECTIVE_SFT, NULL, &o, tag);
    check_eval_program(s.p);
    const sbp_step_info *in = s.info;
    assert_int_equal(in->eval_workspace_bytes, s.p->eval->workspace_bytes);
    assert_int_equal(in->eval_planned_peak_bytes,
                     in->param_elems * sizeof(float) + in->eval_workspace_bytes);
    assert_true(in->eval_workspace_bytes > 0);
    if (st == SBP_STRATEGY_STREAM)
        assert_true(in->eval_workspace_bytes < in->workspace_bytes);
    eval_fn ev;
    *(void **)&ev = dlsym(s.lib, "sbp_step_eval");
    assert_non_null(ev);

    e2e_reference r;
    e2e_load_reference(&r, family, NULL);
    float *params = e2e_param_block(in, s.g);
    float *grads = malloc(sizeof *grads * (in->param_elems + 1));
    assert_non_null(grads);
    sbp_step_args a = {.params = params, .grads = grads, .input_ids = r.bt.ids,
                       .labels = r.bt.labels};
    double train = e2e_run(&s, &a, true);

    /* the evaluation: its own workspace size, garbage in it, the gradients poisoned */
    size_t wsb = in->eval_workspace_bytes;
    void *ws = aligned_alloc(SBPRT_ALIGN, (wsb + SBPRT_ALIGN - 1) / SBPRT_ALIGN * SBPRT_ALIGN);
    assert_non_null(ws);
    memset(ws, 0xff, wsb);
    for (size_t i = 0; i < in->param_elems; i++)
        grads[i] = NAN;
    double loss = NAN;
    int64_t scored = -1;
    sbp_step_args e = {.params = params, .grads = grads, .input_ids = r.bt.ids,
                       .labels = r.bt.labels, .workspace = ws, .loss = &loss,
                       .n_scored = &scored};
    int rc = ev(e2e_ctx, &e);
    if (rc)
        print_message("sbp_step_eval: %s\n", sbprt_status_string(rc));
    assert_int_equal(rc, SBPRT_OK);
    for (size_t i = 0; i < in->param_elems; i++)
        assert_true(isnan(grads[i])); /* untouched */
    int64_t n = 0;
    for (int64_t i = 0; i < b * t; i++)
        n += r.bt.labels[i] != -100;
    if (b > 0)
        assert_int_equal(scored, n);
    double vs_train = fabs(loss - train) / fabs(train);
    double vs_ref = fabs(loss - r.loss) / fabs(r.loss);
    print_message("%-28s eval %.9f train %.9f (rel %.1e) torch %.9f (rel %.1e); workspace "
                  "eval %zu train %zu\n",
                  tag, loss, train, vs_train, r.loss, vs_ref, in->eval_workspace_bytes,
                  in->workspace_bytes);
    assert_true(vs_train <= 1e-6);
    assert_true(vs_ref <= E2E_REF_LOSS_TOL);
    free(ws);
    free(grads);
    free(params);
    e2e_free_reference(&r);
    e2e_free_step(&s);
}

static void family(const char *model, const char *fam, int64_t b, int64_t t, const char *stem)
{
    static const sbp_strategy sts[] = {SBP_STRATEGY_STORE, SBP_STRATEGY_CHECKPOINT,
                                       SBP_STRATEGY_STREAM};
    char tag[128];
    for (int i = 0; i < 3; i++) {
        snprintf(tag, sizeof tag, "eval_%s_%s", stem, sbp_strategy_name(sts[i]));
        eval_case(model, fam, b, t, sts[i], 0, 0, tag);
    }
    snprintf(tag, sizeof tag, "eval_%s_stream_17_13", stem);
    eval_case(model, fam, b, t, SBP_STRATEGY_STREAM, 17, 13, tag);
}

static void test_gpt2(void **state)
{
    (void)state;
    family("gpt2_op17_dyn.onnx", "gpt2", B, T, "gpt2");
}

static void test_llama(void **state)
{
    (void)state;
    family("llama_op17_dyn.onnx", "llama", B, T, "llama");
}

static void test_qwen3(void **state)
{
    (void)state;
    family("qwen3_op17_dyn.onnx", "qwen3", B, T, "qwen3");
}

static void test_llama_graph_loss(void **state)
{
    (void)state;
    family("llama_op17_loss.onnx", "llama", 0, 0, "llama_loss");
}

/* DPO has no evaluation entry point: none is built, the symbol is absent, the info says 0. */
static void test_dpo_has_none(void **state)
{
    (void)state;
    e2e_step s = {0};
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .eval = true,
                           .beta = sbp_objective_default_beta(SBP_OBJECTIVE_DPO)};
    e2e_compile(&s, "llama_op17_dyn.onnx", B, T, SBP_OBJECTIVE_DPO, NULL, &o, "eval_dpo");
    assert_null(s.p->eval);
    assert_non_null(s.p->no_eval_why);
    assert_int_equal(s.info->eval_workspace_bytes, 0);
    assert_null(dlsym(s.lib, "sbp_step_eval"));
    e2e_free_step(&s);
}

/* Without options.eval there is none either (sbpc --no-eval). */
static void test_not_asked(void **state)
{
    (void)state;
    e2e_step s = {0};
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM};
    e2e_compile(&s, "llama_op17_dyn.onnx", B, T, SBP_OBJECTIVE_SFT, NULL, &o, "eval_none");
    assert_null(s.p->eval);
    assert_int_equal(s.info->eval_workspace_bytes, 0);
    assert_null(dlsym(s.lib, "sbp_step_eval"));
    e2e_free_step(&s);
}

int main(int argc, char **argv)
{
    e2e_init();
    if (sbprt_ctx_create(&e2e_ctx, 0) != SBPRT_OK)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_llama_graph_loss),
        cmocka_unit_test(test_dpo_has_none),
        cmocka_unit_test(test_not_asked),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    sbprt_ctx_destroy(e2e_ctx);
    return rc;
}
