/* step_doc_emu.c — per-document DPO and GRPO steps of the CUDA target on the CUDA emulator
 * (gpu.step_emu_per_document).
 *
 * sbpc --packed --per-document makes the host steps of the objective (codegen/emit_objective.c)
 * walk each row's runs of document ids, and read and write the per-document inputs and outputs,
 * in backend memory: on CUDA every one of them (labels, doc_ids, ref_logps, advantages, the
 * per-token weights and coefficients, sbp_step_logps's row_logps) is device memory, reached
 * through sbprt_memcpy only. Here the Llama fixture (tests/fixtures/llama_op17_dyn.onnx) is
 * compiled for --target cuda (stream, chunks 5 / 7: the head's chunks cut documents), linked
 * against libsbprt_cuda_emu.a as tests/gpu/emu_step.cmake does, and run with every buffer in
 * the step's device memory on gen_packed.py's per-document batch (B = 4, T = 64):
 *
 *   dpo, grpo, grpo_token  one training step: the loss and every gradient against the float64
 *                          PyTorch references of tests/e2e/test_packed.c
 *                          (ref/llama_packed_doc_*_grads.safetensors; 1e-5 and 1e-4 per tensor),
 *                          DPO's row_logps (host memory) each document's logp at b*T + k
 *                          within 1e-6 of float64 and 0 elsewhere; a pair of rows with
 *                          different numbers of documents is refused (SBPRT_ERR_INVALID);
 *   and each case's sbp_step_logps: row_logps [B*T] in device memory, each document's logp at
 *   b*T + k within 1e-6, 0 elsewhere.
 *
 *   step_doc_emu   (SBP_EMU_LIB, SBP_EMU_CC, SBP_EMU_INCLUDES given at build time)
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

#include "codegen.h"
#include "e2e_util.h"
#include "emu_so.h"
#include "flow.h"

#define PB 4
#define PT 64
#define N (PB * PT)

typedef struct doc_case {
    const char *tag;
    sbp_objective obj;
    sbp_grpo_norm norm;
    const char *ref; /* the float64 gradients, under tests/fixtures/ref */
} doc_case;


/* The largest relative difference of per-document values got [N] (at b*T + k) from the
 * float64 ones; every other element must be exactly 0. */
static double doc_err(const double *got, const float *want)
{
    double worst = 0;
    for (int i = 0; i < N; i++) {
        if (want[i] == 0)
            assert_true(got[i] == 0);
        else
            worst = fmax(worst, fabs(got[i] - want[i]) / fabs(want[i]));
    }
    return worst;
}

static void run_case(const doc_case *dc)
{
    const char *model = e2e_fixture("llama_op17_dyn.onnx");
    sbp_flow_options fo = {
        .pass = {.batch = PB, .seq_len = PT, .verify = true},
        .objective = dc->obj,
        .train = {.strategy = SBP_STRATEGY_STREAM, .chunk = 5, .logits_chunk = 7,
                  .packed = true, .per_document = true, .eval = true,
                  .beta = sbp_objective_default_beta(dc->obj),
                  .epsilon = dc->obj == SBP_OBJECTIVE_GRPO ? 0.2 : 0, .grpo_norm = dc->norm}};
    sbp_flow fl = {.path = model};
    ir_diag d;
    ir_diag_init(&d, model);
    int frc = sbp_flow_run(&fl, &fo, &d, NULL);
    if (frc != IR_OK)
        e2e_print_diag(&d);
    assert_int_equal(frc, IR_OK);
    assert_non_null(fl.program->logps);

    emu_rt r;
    emu_so_load(fl.program, model, dc->tag, &r);
    const sbp_step_info *in = r.info();
    assert_string_equal(in->target, "cuda");
    assert_int_equal(in->packed, 1);
    assert_int_equal(in->per_document, 1);

    /* gen_packed.py's per-document batch and inputs */
    static int32_t ids[N], labels[N], docs[N], fewer[N];
    static float dpo_ref[N], adv[N], old[N], ref[N], doc_logps[N];
    e2e_read_i32("pref_doc_input_ids.npy", ids, N);
    e2e_read_i32("pref_doc_labels.npy", labels, N);
    e2e_read_i32("pref_doc_doc_ids.npy", docs, N);
    e2e_read_f32("llama_doc_dpo_ref_logps.npy", dpo_ref, N);
    e2e_read_f32("llama_doc_grpo_advantages.npy", adv, N);
    e2e_read_f32("llama_doc_grpo_old_logps.npy", old, N);
    e2e_read_f32("llama_doc_grpo_ref_logps.npy", ref, N);
    e2e_read_f32("llama_doc_logps.npy", doc_logps, N);
    const bool dpo = dc->obj == SBP_OBJECTIVE_DPO;

    sbprt_ctx *ctx = NULL;
    assert_int_equal(r.ctx_create(&ctx, 0), SBPRT_OK);
    float *params = e2e_param_block(in, fl.g);
    size_t wsb = in->workspace_bytes > in->logp_workspace_bytes ? in->workspace_bytes
                                                                 : in->logp_workspace_bytes;
    unsigned char *garbage = malloc(wsb + 1);
    float *grads = malloc(sizeof *grads * (in->grad_elems + 1));
    assert_true(garbage && grads);
    memset(garbage, 0xff, wsb);
    double loss = NAN, rows[N];
    for (int i = 0; i < N; i++)
        rows[i] = NAN;
    sbp_step_args a = {
        .params = emu_dev_copy(&r, ctx, params, sizeof(float) * in->param_elems),
        .grads = emu_dev_copy(&r, ctx, NULL, sizeof(float) * in->grad_elems),
        .input_ids = emu_dev_copy(&r, ctx, ids, sizeof ids),
        .labels = emu_dev_copy(&r, ctx, labels, sizeof labels),
        .doc_ids = emu_dev_copy(&r, ctx, docs, sizeof docs),
        .ref_logps = emu_dev_copy(&r, ctx, dpo ? dpo_ref : ref, sizeof ref),
        .old_logps = dpo ? NULL : emu_dev_copy(&r, ctx, old, sizeof old),
        .advantages = dpo ? NULL : emu_dev_copy(&r, ctx, adv, sizeof adv),
        .workspace = emu_dev_copy(&r, ctx, garbage, wsb),
        .loss = &loss,
        .row_logps = dpo ? rows : NULL, /* host memory on every target */
    };
    int rc = r.run(ctx, &a);
    if (rc)
        print_message("sbp_step_run: %s\n", sbprt_status_string(rc));
    assert_int_equal(rc, SBPRT_OK);
    assert_int_equal(r.memcpy(ctx, grads, a.grads, sizeof(float) * in->grad_elems,
                              SBPRT_COPY_DEVICE_TO_HOST),
                     SBPRT_OK);
    e2e_reference re;
    e2e_load_reference(&re, "llama", dc->ref);
    e2e_step s = {.g = fl.g, .info = in};
    double e_grad = e2e_max_rel_vs_ref(&s, grads, &re, true);
    double e_loss = fabs(loss - re.loss) / fabs(re.loss);
    double e_rows = dpo ? doc_err(rows, doc_logps) : 0;

    /* sbp_step_logps: row_logps [B*T] in device memory, per document */
    float *d_row = emu_dev_copy(&r, ctx, NULL, sizeof(float) * N);
    float nan_row[N], got_row[N];
    for (int i = 0; i < N; i++)
        nan_row[i] = NAN;
    assert_int_equal(r.memcpy(ctx, d_row, nan_row, sizeof nan_row, SBPRT_COPY_HOST_TO_DEVICE),
                     SBPRT_OK);
    assert_int_equal(r.logps(ctx, &a, d_row, NULL), SBPRT_OK);
    assert_int_equal(r.memcpy(ctx, got_row, d_row, sizeof got_row, SBPRT_COPY_DEVICE_TO_HOST),
                     SBPRT_OK);
    double got64[N];
    for (int i = 0; i < N; i++)
        got64[i] = got_row[i];
    double e_logps = doc_err(got64, doc_logps);

    print_message("%-22s (cuda, emulated) loss %.9f (PyTorch %.9f, rel %.1e), grads %.1e, "
                  "row_logps %.1e, sbp_step_logps %.1e\n",
                  dc->tag, loss, re.loss, e_loss, e_grad, e_rows, e_logps);
    assert_true(e_loss <= E2E_REF_LOSS_TOL);
    assert_true(e_grad <= E2E_REF_GRAD_TOL);
    assert_true(e_rows <= 1e-6);
    assert_true(e_logps <= 1e-6);

    if (dpo) { /* row 0 loses its second document: 2 against row 2's 3 */
        memcpy(fewer, labels, sizeof fewer);
        for (int t = 20; t < 45; t++)
            fewer[t] = -100;
        assert_int_equal(r.memcpy(ctx, (void *)a.labels, fewer, sizeof fewer,
                                  SBPRT_COPY_HOST_TO_DEVICE),
                         SBPRT_OK);
        assert_int_equal(r.run(ctx, &a), SBPRT_ERR_INVALID);
    }

    e2e_free_reference(&re);
    void *bufs[] = {(void *)a.params, a.grads, (void *)a.input_ids, (void *)a.labels,
                    (void *)a.doc_ids, (void *)a.ref_logps, (void *)a.old_logps,
                    (void *)a.advantages, a.workspace, d_row};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            r.free(ctx, bufs[i]);
    void (*release)(sbprt_ctx *);
    *(void **)&release = emu_so_sym(&r, "sbp_step_release");
    release(ctx);
    r.ctx_destroy(ctx);
    free(garbage);
    free(grads);
    free(params);
    /* no dlclose: the emulator's threads' state would look leaked (LSan) */
    ir_graph_free(fl.g);
    ir_diag_free(&d);
}

static const doc_case cases[] = {
    {"emu_doc_dpo", SBP_OBJECTIVE_DPO, SBP_GRPO_NORM_SEQUENCE,
     "llama_packed_doc_dpo_grads.safetensors"},
    {"emu_doc_grpo", SBP_OBJECTIVE_GRPO, SBP_GRPO_NORM_SEQUENCE,
     "llama_packed_doc_grpo_seq_grads.safetensors"},
    {"emu_doc_grpo_token", SBP_OBJECTIVE_GRPO, SBP_GRPO_NORM_TOKEN,
     "llama_packed_doc_grpo_token_grads.safetensors"},
};

static void test_case(void **state)
{
    run_case(*state);
}

int main(void)
{
    e2e_init();
    enum { N_CASES = sizeof cases / sizeof cases[0] };
    struct CMUnitTest tests[N_CASES];
    for (int i = 0; i < N_CASES; i++)
        tests[i] = (struct CMUnitTest){.name = cases[i].tag + strlen("emu_doc_"),
                                       .test_func = test_case,
                                       .initial_state = (void *)&cases[i]};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
