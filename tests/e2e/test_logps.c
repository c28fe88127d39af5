/* test_logps.c — sbp_step_logps, the log-probability entry point of DPO / GRPO steps, end to end.
 *
 * Two real transformers exports (tests/fixtures/hf: Llama by the dynamo exporter, GPT-2 by the
 * TorchScript one: tied LM head, learned positions) bound to B = 4, T = 32, each compiled as a
 * DPO step (beta 0.1) and a GRPO step (beta 0.04, epsilon 0.2) with store, checkpoint and stream
 * at chunks that do not divide the rows (layers 5 of 32, LM head 13 of 128; and 7 / 9), through C
 * into a shared object. On the batch of tests/fixtures/hf/ref/logps.safetensors (rows with
 * prompts and padding of different lengths), with a workspace of exactly logp_workspace_bytes
 * filled with garbage:
 *   - each row's log-probability must equal the float64 transformers value (gen_logps.py) within
 *     1e-5 relative, each token's within 1e-5 of max(1, |ref|), and unscored positions are 0;
 *   - the gradient block is not touched, n_scored is the batch's count;
 *   - the step's own objective agrees: the DPO loss with ref_logps = row_logps is ln 2 (z = 0 up
 *     to the float rounding of the row sums: 1e-5 relative), and the GRPO loss with old_logps =
 *     ref_logps = token_logps is the on-policy loss (old_logps NULL) bit for bit — the ratio is
 *     exp(0) = 1 only if the per-token values are the step's own — and -mean(A) within 1e-6.
 * The program itself: forward only, no gradient buffer, no backward block, no loss kernel (only
 * label log-probabilities), and with stream no [B*T, V] buffer and one chunk loop over the head;
 * the info reports its plan; the C compiles without a warning (gcc, clang -Wpedantic). An SFT
 * step, or a DPO step compiled without evaluation, has none.
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

#define LB 4
#define LT 32
#define N (LB * LT)

typedef int (*logps_fn)(sbprt_ctx *, const sbp_step_args *, float *, float *);

/* The batch and one family's float64 references. */
typedef struct logp_ref {
    int32_t ids[N], labels[N];
    double row[LB], tok[N];
} logp_ref;

static void load_ref(const char *family, logp_ref *r)
{
    char err[256], name[128];
    sbpio_st_file *f = NULL;
    if (sbpio_st_open(e2e_fixture("hf/ref/logps.safetensors"), &f, err, sizeof err) != 0)
        print_message("%s\n", err);
    assert_non_null(f);
    double tmp[N];
    assert_int_equal(sbpio_st_copy_f64(f, "input/ids", tmp, N, err, sizeof err), 0);
    for (int i = 0; i < N; i++)
        r->ids[i] = (int32_t)tmp[i];
    assert_int_equal(sbpio_st_copy_f64(f, "input/labels", tmp, N, err, sizeof err), 0);
    for (int i = 0; i < N; i++)
        r->labels[i] = (int32_t)tmp[i];
    snprintf(name, sizeof name, "%s/row_logps", family);
    assert_int_equal(sbpio_st_copy_f64(f, name, r->row, LB, err, sizeof err), 0);
    snprintf(name, sizeof name, "%s/token_logps", family);
    assert_int_equal(sbpio_st_copy_f64(f, name, r->tok, N, err, sizeof err), 0);
    sbpio_st_close(f);
}

/* The log-probability program: forward only, ending in each token's label log-probability. */
static void check_program(const sbp_train_program *p)
{
    const sbp_train_program *e = p->logps;
    assert_non_null(e);
    assert_null(p->eval);
    assert_true(e->forward_only && e->logp_only);
    assert_int_equal(e->param_elems, p->param_elems);
    assert_true(e->tok_logp_buf >= 0);
    size_t btv = (size_t)(e->batch * e->seq_len * e->vocab);
    for (int i = 0; i < e->n_bufs; i++) {
        const tp_buf *b = e->bufs[i];
        if (b->span)
            continue;
        assert_false(b->is_grad);
        assert_int_not_equal(b->kind, TP_BUF_GRAD);
        if (e->strategy == SBP_STRATEGY_STREAM && b->kind == TP_BUF_WS)
            assert_true(b->numel < btv); /* no full logits */
    }
    int lp = 0, head_loops = 0;
    for (int b = 0; b < e->n_blocks; b++) {
        const tp_block *blk = e->blocks[b];
        assert_true(strncmp(blk->name, "logp_", 5) == 0);
        assert_null(strstr(blk->name, "backward"));
        if (strcmp(blk->name, "logp_head") == 0) {
            head_loops = blk->n_loops;
            for (int l = 0; l < blk->n_loops; l++)
                assert_int_equal(blk->loops[l].group, blk->loops[0].group);
        }
        for (int i = 0; i < blk->n_insts; i++) {
            tp_kernel k = blk->insts[i].k;
            lp += k == TP_K_LOGPROB_FWD;
            assert_true(k != TP_K_LOGPROB_GRAD && k != TP_K_DPO_COEF && k != TP_K_GRPO_WEIGHTS &&
                        k != TP_K_GRPO_LOSS && k != TP_K_CROSS_ENTROPY &&
                        k != TP_K_EMBEDDING_BWD && k != TP_K_ATTENTION_BWD);
        }
    }
    assert_true(lp > 0);
    if (e->strategy == SBP_STRATEGY_STREAM) /* one chunk-loop group over the head (full + tail) */
        assert_true(head_loops >= 1 && head_loops <= 2);
}

typedef struct strat {
    sbp_strategy st;
    int64_t chunk, logits_chunk;
    const char *tag;
} strat;

static const strat strats[] = {
    {SBP_STRATEGY_STORE, 0, 0, "store"},
    {SBP_STRATEGY_CHECKPOINT, 0, 0, "checkpoint"},
    {SBP_STRATEGY_STREAM, 5, 13, "stream_5_13"},
    {SBP_STRATEGY_STREAM, 7, 9, "stream_7_9"},
};

static const float advantages[LB] = {0.9f, -1.1f, 0.35f, -0.6f};

static void logps_case(const char *model, const char *family, sbp_objective obj,
                       const strat *sc)
{
    char tag[128];
    snprintf(tag, sizeof tag, "logps_%s_%s_%s", family, sbp_objective_name(obj), sc->tag);
    sbp_train_options o = {.strategy = sc->st, .chunk = sc->chunk,
                           .logits_chunk = sc->logits_chunk, .eval = true,
                           .beta = obj == SBP_OBJECTIVE_DPO ? 0.1 : 0.04,
                           .epsilon = obj == SBP_OBJECTIVE_GRPO ? 0.2 : 0};
    e2e_step s = {0};
    assert_int_equal(e2e_compile(&s, model, LB, LT, obj, NULL, &o, tag), obj);
    check_program(s.p);
    if (sc->chunk == 5) /* the C with sbp_step_logps: no warning from gcc or clang -Wpedantic */
        e2e_check_warnings(s.p, model, tag, &s.diag);
    const sbp_step_info *in = s.info;
    assert_int_equal(in->logp_workspace_bytes, s.p->logps->workspace_bytes);
    assert_int_equal(in->logp_planned_peak_bytes,
                     in->param_elems * sizeof(float) + in->logp_workspace_bytes);
    assert_true(in->logp_workspace_bytes > 0 && in->logp_workspace_bytes < in->workspace_bytes);
    assert_int_equal(in->eval_workspace_bytes, 0);
    assert_null(dlsym(s.lib, "sbp_step_eval"));
    logps_fn lf;
    *(void **)&lf = dlsym(s.lib, "sbp_step_logps");
    assert_non_null(lf);

    logp_ref r;
    load_ref(family, &r);
    float *params = e2e_param_block(in, s.g);
    float *grads = malloc(sizeof *grads * (in->grad_elems + 1));
    assert_non_null(grads);
    for (size_t i = 0; i < in->grad_elems; i++)
        grads[i] = NAN;
    size_t wsb = in->logp_workspace_bytes;
    void *ws = aligned_alloc(SBPRT_ALIGN, (wsb + SBPRT_ALIGN - 1) / SBPRT_ALIGN * SBPRT_ALIGN);
    assert_non_null(ws);
    memset(ws, 0xff, wsb);
    float row[LB], tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = NAN;
    for (int b = 0; b < LB; b++)
        row[b] = NAN;
    int64_t scored = -1;
    sbp_step_args a = {.params = params, .grads = grads, .input_ids = r.ids, .labels = r.labels,
                       .workspace = ws, .n_scored = &scored};
    int rc = lf(e2e_ctx, &a, row, tok);
    if (rc)
        print_message("sbp_step_logps: %s\n", sbprt_status_string(rc));
    assert_int_equal(rc, SBPRT_OK);
    for (size_t i = 0; i < in->grad_elems; i++)
        assert_true(isnan(grads[i])); /* untouched */
    int64_t n = 0;
    for (int i = 0; i < N; i++)
        n += r.labels[i] != -100;
    assert_int_equal(scored, n);

    /* against the float64 transformers values */
    double row_err = 0, tok_err = 0;
    for (int b = 0; b < LB; b++) {
        double e = fabs(row[b] - r.row[b]) / fabs(r.row[b]);
        row_err = e > row_err ? e : row_err;
    }
    for (int i = 0; i < N; i++) {
        if (r.labels[i] == -100) {
            assert_true(tok[i] == 0.0f);
            continue;
        }
        double e = fabs(tok[i] - r.tok[i]) / fmax(1.0, fabs(r.tok[i]));
        tok_err = e > tok_err ? e : tok_err;
    }
    /* only one output asked for: the other is not written */
    float row2[LB];
    assert_int_equal(lf(e2e_ctx, &a, row2, NULL), SBPRT_OK);
    assert_memory_equal(row2, row, sizeof row);
    assert_int_equal(lf(e2e_ctx, &a, NULL, NULL), SBPRT_OK);
    /* a workspace that is not SBPRT_ALIGN-aligned, or no labels: refused */
    sbp_step_args bad = a;
    bad.workspace = (unsigned char *)ws + 4;
    assert_int_equal(lf(e2e_ctx, &bad, row2, NULL), SBPRT_ERR_INVALID);
    bad = a;
    bad.labels = NULL;
    assert_int_equal(lf(e2e_ctx, &bad, row2, NULL), SBPRT_ERR_INVALID);

    /* the training step's own objective at these values */
    double loss, want, obj_err;
    sbp_step_args t = {.params = params, .grads = grads, .input_ids = r.ids, .labels = r.labels};
    if (obj == SBP_OBJECTIVE_DPO) {
        t.ref_logps = row;
        loss = e2e_run(&s, &t, true);
        want = log(2.0);
        obj_err = fabs(loss - want) / want;
    } else {
        t.ref_logps = tok;
        t.old_logps = tok;
        t.advantages = advantages;
        loss = e2e_run(&s, &t, true);
        /* on-policy (old = the step's own logp, detached): ratio exactly 1 per token; with
         * old = token_logps the same loss, bit for bit, only if they are the step's values */
        t.old_logps = NULL;
        double on_policy = e2e_run(&s, &t, true);
        assert_true(loss == on_policy);
        want = 0; /* sequence normalisation, ratio 1, KL 0: -mean over rows of A */
        for (int b = 0; b < LB; b++)
            want -= advantages[b] / LB;
        obj_err = fabs(loss - want) / fabs(want);
    }
    print_message("%-34s rows rel %.1e, tokens %.1e (vs float64 transformers); step's loss at "
                  "these logps %.9f (want %.9f, rel %.1e); workspace logps %zu train %zu\n",
                  tag, row_err, tok_err, loss, want, obj_err, in->logp_workspace_bytes,
                  in->workspace_bytes);
    assert_true(row_err <= 1e-5);
    assert_true(tok_err <= 1e-5);
    assert_true(obj_err <= (obj == SBP_OBJECTIVE_DPO ? 1e-5 : 1e-6));
    free(ws);
    free(grads);
    free(params);
    e2e_free_step(&s);
}

static void family(const char *model, const char *fam, sbp_objective obj)
{
    for (size_t i = 0; i < sizeof strats / sizeof strats[0]; i++)
        logps_case(model, fam, obj, &strats[i]);
}

static void test_llama_dpo(void **state)
{
    (void)state;
    family("hf/llama_dynamo_eager.onnx", "llama", SBP_OBJECTIVE_DPO);
}

static void test_llama_grpo(void **state)
{
    (void)state;
    family("hf/llama_dynamo_eager.onnx", "llama", SBP_OBJECTIVE_GRPO);
}

static void test_gpt2_dpo(void **state)
{
    (void)state;
    family("hf/gpt2_ts_eager.onnx", "gpt2", SBP_OBJECTIVE_DPO);
}

static void test_gpt2_grpo(void **state)
{
    (void)state;
    family("hf/gpt2_ts_eager.onnx", "gpt2", SBP_OBJECTIVE_GRPO);
}

/* SFT has sbp_step_eval, not sbp_step_logps; a DPO step compiled without evaluation has
 * neither. */
static void test_none(void **state)
{
    (void)state;
    e2e_step s = {0};
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .eval = true};
    e2e_compile(&s, "hf/llama_dynamo_eager.onnx", LB, LT, SBP_OBJECTIVE_SFT, NULL, &o,
                "logps_none_sft");
    assert_null(s.p->logps);
    assert_non_null(s.p->eval);
    assert_int_equal(s.info->logp_workspace_bytes, 0);
    assert_null(dlsym(s.lib, "sbp_step_logps"));
    e2e_free_step(&s);
    o = (sbp_train_options){.strategy = SBP_STRATEGY_STREAM, .beta = 0.1};
    e2e_compile(&s, "hf/llama_dynamo_eager.onnx", LB, LT, SBP_OBJECTIVE_DPO, NULL, &o,
                "logps_none_dpo");
    assert_null(s.p->logps);
    assert_int_equal(s.info->logp_workspace_bytes, 0);
    assert_null(dlsym(s.lib, "sbp_step_logps"));
    e2e_free_step(&s);
}

int main(int argc, char **argv)
{
    e2e_init();
    if (sbprt_ctx_create(&e2e_ctx, 0) != SBPRT_OK)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_dpo), cmocka_unit_test(test_llama_grpo),
        cmocka_unit_test(test_gpt2_dpo),  cmocka_unit_test(test_gpt2_grpo),
        cmocka_unit_test(test_none),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    sbprt_ctx_destroy(e2e_ctx);
    return rc;
}
