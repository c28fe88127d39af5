/* test_objectives.c — DPO and GRPO end to end, against float64 PyTorch references.
 *
 * For each fixture family (GPT-2, Llama, Qwen3, the dynamic exports bound to B = 4, T = 64) and
 * each objective (DPO beta 0.1; GRPO beta 0.04, epsilon 0.2 with the sequence and the token
 * normalisation) the model is compiled with store, checkpoint and stream at chunk sizes 64, 17
 * and 5 (layer chunk = logits chunk; 17 and 5 do not divide T or B*T), through C into a shared
 * object, and one step runs on the batch of tests/fixtures/ref/pref_*.npy (rows with prompts
 * and padding of different lengths) with the family's inputs (reference logp, advantages, old
 * logp). The loss must match PyTorch's within 1e-5 relative, every gradient within 1e-4
 * (per-tensor relative L2), and each strategy must agree with store within 1e-5.
 *
 * Also: GRPO on-policy with beta 0 (no old or reference logp) against the SFT references of
 * the B = 2 batch — with advantages 1 (token normalisation), or n_b * rows / scored
 * (sequence), its gradient is the mean cross-entropy's and its loss -1 exactly; the stream
 * plans of DPO and GRPO hold no B*T*V buffer, and DPO's head runs two chunk loops (the logp
 * pass, then the fused backward) with the host step between; a step refuses missing inputs.
 * Compiling, running and the comparisons are the e2e tests' shared steps (e2e_util.c).
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

#define T E2E_T
#define PB 4 /* rows of the DPO / GRPO batch */

/* ------------------------------------------------------------------ compiling */

/* The program only: fixture `model` bound to b rows of T, objective obj with options o. */
static void build(e2e_step *s, const char *model, int64_t b, sbp_objective obj,
                  const sbp_train_options *o)
{
    assert_int_equal(e2e_build(s, model, b, T, obj, NULL, o), obj);
}

static void compile_step(e2e_step *s, const char *model, int64_t b, sbp_objective obj,
                         const sbp_train_options *o, const char *tag)
{
    assert_int_equal(e2e_compile(s, model, b, T, obj, NULL, o, tag), obj);
    assert_string_equal(s->info->objective, sbp_objective_name(obj));
    assert_true(s->info->beta == o->beta);
    if (obj == SBP_OBJECTIVE_GRPO) {
        assert_true(s->info->epsilon == o->epsilon);
        assert_string_equal(s->info->grpo_norm, sbp_grpo_norm_name(o->grpo_norm));
    }
}

/* ------------------------------------------------------------------ inputs */

typedef struct inputs {
    int64_t b;
    int32_t ids[PB * T], labels[PB * T];
    float dpo_ref[PB], adv[PB], old[PB * T], ref[PB * T];
} inputs;

static void load_inputs(const char *family, inputs *in)
{
    char name[256];
    in->b = PB;
    e2e_read_i32("pref_input_ids.npy", in->ids, PB * T);
    e2e_read_i32("pref_labels.npy", in->labels, PB * T);
    snprintf(name, sizeof name, "%s_dpo_ref_logps.npy", family);
    e2e_read_f32(name, in->dpo_ref, PB);
    snprintf(name, sizeof name, "%s_grpo_advantages.npy", family);
    e2e_read_f32(name, in->adv, PB);
    snprintf(name, sizeof name, "%s_grpo_old_logps.npy", family);
    e2e_read_f32(name, in->old, PB * T);
    snprintf(name, sizeof name, "%s_grpo_ref_logps.npy", family);
    e2e_read_f32(name, in->ref, PB * T);
}

/* One step with the objective's inputs (old NULL: on-policy); returns the loss. */
static double run_step(const e2e_step *s, const float *params, float *grads, const int32_t *ids,
                       const int32_t *labels, const float *ref, const float *old,
                       const float *adv)
{
    sbp_step_args a = {.params = params, .grads = grads, .input_ids = ids, .labels = labels,
                       .ref_logps = ref, .old_logps = old, .advantages = adv};
    return e2e_run(s, &a, true);
}

/* ------------------------------------------------------------------ plans */

/* No workspace buffer of B*T*V elements (the full logits) in a stream plan. */
static void check_no_full_logits(const sbp_train_program *p)
{
    size_t btv = (size_t)(p->batch * p->seq_len * p->vocab);
    for (int i = 0; i < p->n_bufs; i++) {
        const tp_buf *b = p->bufs[i];
        if (b->kind == TP_BUF_WS && !b->span && b->numel >= btv) {
            print_message("  buffer %s has %zu elements (B*T*V = %zu)\n", b->name, b->numel, btv);
            fail();
        }
    }
}

/* ------------------------------------------------------------------ the family tests */

typedef struct objective_case {
    const char *name;      /* reference file: <family>_<name>_grads.safetensors */
    sbp_objective obj;
    double beta, epsilon;
    sbp_grpo_norm norm;
} objective_case;

static const objective_case objective_cases[] = {
    {"dpo", SBP_OBJECTIVE_DPO, 0.1, 0, SBP_GRPO_NORM_SEQUENCE},
    {"grpo_seq", SBP_OBJECTIVE_GRPO, 0.04, 0.2, SBP_GRPO_NORM_SEQUENCE},
    {"grpo_token", SBP_OBJECTIVE_GRPO, 0.04, 0.2, SBP_GRPO_NORM_TOKEN},
};

typedef struct strategy_case {
    sbp_strategy strategy;
    int64_t chunk; /* stream: layer chunk = logits chunk */
} strategy_case;

static const strategy_case strategy_cases[] = {
    {SBP_STRATEGY_STORE, 0},   {SBP_STRATEGY_CHECKPOINT, 0}, {SBP_STRATEGY_STREAM, 64},
    {SBP_STRATEGY_STREAM, 17}, {SBP_STRATEGY_STREAM, 5},
};

static void run_family(const char *family)
{
    char model[256];
    snprintf(model, sizeof model, "%s_op17_dyn.onnx", family);
    inputs in;
    load_inputs(family, &in);
    for (size_t oi = 0; oi < sizeof objective_cases / sizeof objective_cases[0]; oi++) {
        const objective_case *oc = &objective_cases[oi];
        char file[256];
        snprintf(file, sizeof file, "%s_%s_grads.safetensors", family, oc->name);
        e2e_reference r;
        e2e_load_reference(&r, family, file);
        bool dpo = oc->obj == SBP_OBJECTIVE_DPO;
        e2e_step st = {0};
        float *params = NULL, *gstore = NULL;
        double lstore = 0;
        for (size_t si = 0; si < sizeof strategy_cases / sizeof strategy_cases[0]; si++) {
            const strategy_case *sc = &strategy_cases[si];
            sbp_train_options o = {.strategy = sc->strategy, .chunk = sc->chunk,
                                   .logits_chunk = sc->chunk, .beta = oc->beta,
                                   .epsilon = oc->epsilon, .grpo_norm = oc->norm};
            char tag[256];
            snprintf(tag, sizeof tag, "obj_%s_%s_%s%lld", family, oc->name,
                     sbp_strategy_name(sc->strategy), (long long)sc->chunk);
            e2e_step s;
            compile_step(&s, model, PB, oc->obj, &o, tag);
            if (sc->strategy == SBP_STRATEGY_STREAM)
                check_no_full_logits(s.p);
            if (!params)
                params = e2e_param_block(s.info, s.g);
            float *g = malloc(s.info->param_elems * sizeof(float));
            double l = run_step(&s, params, g, in.ids, in.labels, dpo ? in.dpo_ref : in.ref,
                                dpo ? NULL : in.old, dpo ? NULL : in.adv);
            double e_ref = e2e_max_rel_vs_ref(&s, g, &r, true);
            double e_loss = fabs(l - r.loss) / fabs(r.loss);
            double e_store = 0, e_lstore = 0;
            if (si > 0) {
                e_store = e2e_max_rel_vs(&s, g, &st, gstore, E2E_STORE_TOL);
                e_lstore = fabs(l - lstore) / fabs(lstore);
            }
            print_message("  %-36s loss %.9f (PyTorch %.9f, rel %.2e; store %.2e)  grads: vs "
                          "PyTorch %.2e, vs store %.2e; workspace %zu\n",
                          tag, l, r.loss, e_loss, e_lstore, e_ref, e_store,
                          s.info->workspace_bytes);
            assert_true(e_loss <= E2E_REF_LOSS_TOL);
            assert_true(e_ref <= E2E_REF_GRAD_TOL);
            assert_true(e_lstore <= E2E_STORE_TOL);
            assert_true(e_store <= E2E_STORE_TOL);
            if (si == 0) {
                st = s;
                gstore = g;
                lstore = l;
            } else {
                free(g);
                e2e_free_step(&s);
            }
        }
        free(params);
        free(gstore);
        e2e_free_step(&st);
        e2e_free_reference(&r);
    }
}

static void test_gpt2(void **state) { (void)state; run_family("gpt2"); }
static void test_llama(void **state) { (void)state; run_family("llama"); }
static void test_qwen3(void **state) { (void)state; run_family("qwen3"); }

/* ------------------------------------------------------------------ GRPO on-policy, beta 0 */

/* With old = the current logp (on-policy) the ratio is 1 and each token's loss is -A of its
 * row, its gradient -A dlogp: advantages 1 (token normalisation) or n_b * rows / scored
 * (sequence) make it the mean cross-entropy's, whose float64 reference exists (B = 2). */
static void test_grpo_on_policy(void **state)
{
    (void)state;
    static const char *const families[] = {"gpt2", "llama", "qwen3"};
    for (int fi = 0; fi < 3; fi++) {
        char model[256], file[256], name[256];
        snprintf(model, sizeof model, "%s_op17_static.onnx", families[fi]);
        snprintf(file, sizeof file, "%s_grads.safetensors", families[fi]);
        e2e_reference r;
        e2e_load_reference(&r, families[fi], file);
        int32_t ids[2 * T], labels[2 * T];
        snprintf(name, sizeof name, "%s_input_ids.npy", families[fi]);
        e2e_read_i32(name, ids, 2 * T);
        snprintf(name, sizeof name, "%s_labels.npy", families[fi]);
        e2e_read_i32(name, labels, 2 * T);
        double n[2] = {0, 0};
        for (int i = 0; i < 2 * T; i++)
            n[i / T] += labels[i] != SBPRT_IGNORE_INDEX;
        for (int norm = 0; norm < 2; norm++) {
            float adv[2];
            for (int b = 0; b < 2; b++)
                adv[b] = norm ? 1.0f : (float)(n[b] * 2 / (n[0] + n[1]));
            sbp_train_options o = {.strategy = fi == 1 ? SBP_STRATEGY_CHECKPOINT
                                                       : SBP_STRATEGY_STREAM,
                                   .chunk = 17, .logits_chunk = 13, .beta = 0,
                                   .epsilon = 0.2,
                                   .grpo_norm = norm ? SBP_GRPO_NORM_TOKEN
                                                     : SBP_GRPO_NORM_SEQUENCE};
            char tag[256];
            snprintf(tag, sizeof tag, "obj_%s_grpo_onpolicy_%s", families[fi],
                     norm ? "token" : "sequence");
            e2e_step s;
            compile_step(&s, model, 0, SBP_OBJECTIVE_GRPO, &o, tag);
            float *params = e2e_param_block(s.info, s.g);
            float *g = malloc(s.info->param_elems * sizeof(float));
            double l = run_step(&s, params, g, ids, labels, NULL, NULL, adv);
            double e = e2e_max_rel_vs_ref(&s, g, &r, true);
            print_message("  %-36s loss %.9f (want -1), grads vs the SFT reference %.2e\n", tag,
                          l, e);
            assert_true(fabs(l + 1) <= 1e-6);
            assert_true(e <= E2E_REF_GRAD_TOL);
            free(params);
            free(g);
            e2e_free_step(&s);
        }
        e2e_free_reference(&r);
    }
}

/* ------------------------------------------------------------------ plans and checks */

/* DPO with stream: the head block holds the logp pass (its own chunk-loop group), the host
 * step, then the fused loop; GRPO: the row weights before its one loop group. */
static void test_plan_shape(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        sbp_objective obj = k ? SBP_OBJECTIVE_GRPO : SBP_OBJECTIVE_DPO;
        sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .chunk = 17, .logits_chunk = 13,
                               .beta = 0.1, .epsilon = 0.2};
        e2e_step s;
        build(&s, "llama_op17_dyn.onnx", PB, obj, &o);
        assert_int_equal(sbp_train_verify(s.p, &s.diag), IR_OK);
        check_no_full_logits(s.p);
        const tp_block *head = NULL;
        for (int b = 0; b < s.p->n_blocks; b++)
            if (strcmp(s.p->blocks[b]->name, "head") == 0)
                head = s.p->blocks[b];
        assert_non_null(head);
        int groups = 0, last = -1, host = -1, first_loop = head->n_loops ? head->loops[0].first : -1;
        for (int l = 0; l < head->n_loops; l++)
            if (head->loops[l].group != last)
                groups++, last = head->loops[l].group;
        for (int i = 0; i < head->n_insts; i++)
            if (head->insts[i].k == (k ? TP_K_GRPO_WEIGHTS : TP_K_DPO_COEF))
                host = i;
        print_message("  %s: head has %d loops in %d groups, host step at %d\n",
                      sbp_objective_name(obj), head->n_loops, groups, host);
        assert_int_equal(groups, k ? 1 : 2);
        assert_true(host >= 0);
        if (k)
            assert_true(host < first_loop);
        else /* between the two groups */
            assert_true(host >= head->loops[1].end && host < head->loops[2].first);
        e2e_free_step(&s);
    }
}

/* A step refuses to run without the inputs its objective needs. */
static void test_missing_inputs(void **state)
{
    (void)state;
    inputs in;
    load_inputs("llama", &in);
    for (int k = 0; k < 2; k++) {
        sbp_objective obj = k ? SBP_OBJECTIVE_GRPO : SBP_OBJECTIVE_DPO;
        sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .chunk = 17, .logits_chunk = 13,
                               .beta = 0.1, .epsilon = 0.2};
        e2e_step s;
        compile_step(&s, "llama_op17_dyn.onnx", PB, obj, &o, k ? "obj_missing_grpo" : "obj_missing_dpo");
        float *params = e2e_param_block(s.info, s.g);
        float *g = malloc(s.info->param_elems * sizeof(float));
        void *ws = aligned_alloc(SBPRT_ALIGN, (s.info->workspace_bytes + SBPRT_ALIGN) / SBPRT_ALIGN * SBPRT_ALIGN);
        double loss;
        sbp_step_args a = {.params = params, .grads = g, .input_ids = in.ids,
                           .labels = in.labels, .workspace = ws, .loss = &loss,
                           .advantages = in.adv};
        assert_int_equal(s.run(e2e_ctx, &a), SBPRT_ERR_INVALID); /* no ref_logps (beta > 0) */
        if (k) {
            a.ref_logps = in.ref;
            a.advantages = NULL;
            assert_int_equal(s.run(e2e_ctx, &a), SBPRT_ERR_INVALID);
        }
        free(ws);
        free(params);
        free(g);
        e2e_free_step(&s);
    }
}

/* sbp_train_build's refusals: DPO with an odd batch; DPO on a graph that ends in a loss. */
static void test_refusals(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, "llama");
    ir_graph *g = ir_import_onnx(e2e_fixture("llama_op17_dyn.onnx"), &d, NULL);
    sbp_pass_options po = {.batch = 3, .seq_len = T, .verify = true};
    assert_int_equal(sbp_canonicalize(g, &po, NULL), IR_OK);
    sbp_objective chosen;
    assert_int_equal(sbp_pass_objective(g, SBP_OBJECTIVE_DPO, &chosen), IR_OK);
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .beta = 0.1};
    assert_null(sbp_train_build(g, chosen, &o));
    assert_non_null(strstr(d.entries[d.n - 1].msg, "the batch must be even"));
    ir_graph_free(g);
    ir_diag_free(&d);

    ir_diag_init(&d, "llama_loss");
    g = ir_import_onnx(e2e_fixture("llama_op17_loss.onnx"), &d, NULL);
    sbp_pass_options po2 = {.verify = true};
    assert_int_equal(sbp_canonicalize(g, &po2, NULL), IR_OK);
    assert_int_equal(sbp_pass_objective(g, SBP_OBJECTIVE_GRPO, &chosen), IR_ERR);
    assert_non_null(strstr(d.entries[d.n - 1].msg, "needs the logits"));
    ir_graph_free(g);
    ir_diag_free(&d);
}

static int setup(void **state)
{
    (void)state;
    return sbprt_ctx_create(&e2e_ctx, 2) == SBPRT_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    sbprt_ctx_destroy(e2e_ctx);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_plan_shape),
        cmocka_unit_test(test_missing_inputs),
        cmocka_unit_test(test_grpo_on_policy),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_gpt2),
    };
    return cmocka_run_group_tests_name("e2e_objectives", tests, setup, teardown);
}
