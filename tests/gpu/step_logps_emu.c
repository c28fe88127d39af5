/* step_logps_emu.c — sbp_step_logps of a CUDA step on the CUDA emulator (gpu.step_emu_logps).
 *
 * The transformers exports of tests/fixtures/hf bound to B = 4, T = 32 are compiled as DPO and
 * GRPO steps (stream, chunks 5 / 13: neither divides its rows, and they cut documents) for
 * --target cuda through the flow sbpc runs (passes/flow.h); the C is compiled and linked
 * against libsbprt_cuda_emu.a as tests/gpu/emu_step.cmake does (the CUDA backend's sources on
 * tests/gpu/emu), and sbp_step_logps runs with every buffer in the step's device memory
 * (sbprt_arena_alloc, sbprt_memcpy of the step's own runtime), the workspace filled with
 * garbage and the outputs with NaN first. The cases:
 *
 *   dpo, grpo           the Llama export (eager), unpacked: against the float64 transformers
 *                       values of tests/fixtures/hf/ref/logps.safetensors (gen_logps.py);
 *   dpo_packed,         sbpc --packed on the batch cut into documents (doc ids, in device
 *   grpo_packed         memory too): against ref/logps_packed.safetensors (gen_logps_packed.py:
 *                       every document run alone in float64 transformers, positions from 0,
 *                       each document's last token not scored as sbp-train --pack does);
 *                       besides rows and tokens, each document's token logps must sum to the
 *                       document's own logp;
 *   gpt2_grpo_packed    the same on GPT-2, whose learned position table shows a position
 *                       that did not restart at a document (Llama's RoPE scores depend only
 *                       on relative positions, so there only the attention mask shows);
 *   dpo_lora,           sbpc --lora 4 (default targets, alpha 8) on the dynamo export with
 *   grpo_packed_lora    scopes (what --lora needs), unpacked and packed: lora_A random and
 *                       lora_B 0 (the adapters' initial values, what sbp-train starts from), so
 *                       the step is the base model and the references above apply; the test
 *                       checks that the parameter block does hold such adapters.
 *
 * Bounds: each row within 1e-6 relative of float64, each document within 1e-6 of
 * max(1, |ref|), each token within 1e-5 of max(1, |ref|), unscored tokens exactly 0, each row
 * the sum of its tokens (1e-6), n_scored the batch's count. Measured: rows 4.6e-8, documents
 * 3.7e-8, tokens 1.3e-7. (fp32 only: sbpc refuses --precision bf16 for DPO and GRPO, whose
 * log-prob kernels have no bf16 form.)
 *
 *   step_logps_emu   (SBP_EMU_LIB, SBP_EMU_CC, SBP_EMU_INCLUDES given at build time)
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

#define LB 4
#define LT 32
#define N (LB * LT)

#define ROW_TOL 1e-6 /* relative */
#define DOC_TOL 1e-6 /* of max(1, |ref|) */
#define TOK_TOL 1e-5 /* of max(1, |ref|) */

/* One compiled step and what it is checked against. */
typedef struct emu_case {
    const char *tag;
    sbp_objective obj;
    const char *model;  /* under tests/fixtures */
    const char *family; /* the reference's key prefix */
    bool packed;        /* sbpc --packed, against ref/logps_packed.safetensors */
    int64_t lora_rank;  /* sbpc --lora RANK (0: none) */
} emu_case;


/* The reference tensor `name` [n] of file f as int32 (the file's F64 integers). */
static void read_ints(sbpio_st_file *f, const char *name, int32_t *dst)
{
    char err[256];
    double tmp[N];
    if (sbpio_st_copy_f64(f, name, tmp, N, err, sizeof err) != SBPIO_OK)
        fail_msg("%s", err);
    for (int i = 0; i < N; i++)
        dst[i] = (int32_t)tmp[i];
}

static void read_f64(sbpio_st_file *f, const char *name, double *dst, int64_t n)
{
    char err[256];
    if (sbpio_st_copy_f64(f, name, dst, n, err, sizeof err) != SBPIO_OK)
        fail_msg("%s", err);
}

/* The adapters must be what makes the step the base model: every lora_B zero, and lora_A not
 * (else the adapter would be out of the path for a reason the test cannot see). */
static void check_adapters(const sbp_step_info *in, const float *params)
{
    int na = 0, nb = 0;
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *q = &in->params[i];
        bool a = strstr(q->name, "lora_A") != NULL, b = strstr(q->name, "lora_B") != NULL;
        if (!a && !b)
            continue;
        double amax = 0;
        for (size_t k = 0; k < q->numel; k++)
            amax = fmax(amax, fabs(params[q->offset + k]));
        if (b)
            assert_true(amax == 0.0);
        else
            assert_true(amax > 0.0);
        na += a;
        nb += b;
    }
    assert_true(na > 0);
    assert_int_equal(na, nb);
}

static void run_case(const emu_case *ec)
{
    /* the flow as sbpc runs it, with the options sbpc's flags set */
    const char *model = e2e_fixture(ec->model);
    sbp_flow_options fo = {
        .pass = {.batch = LB, .seq_len = LT, .verify = true},
        .objective = ec->obj,
        .lora = {.rank = ec->lora_rank, .alpha = SBP_LORA_DEFAULT_ALPHA, .seed = 0},
        .train = {.strategy = SBP_STRATEGY_STREAM, .chunk = 5, .logits_chunk = 13,
                  .packed = ec->packed, .eval = true,
                  .beta = ec->obj == SBP_OBJECTIVE_DPO ? 0.1 : 0.04,
                  .epsilon = ec->obj == SBP_OBJECTIVE_GRPO ? 0.2 : 0}};
    sbp_flow fl = {.path = model};
    ir_diag d;
    ir_diag_init(&d, model);
    int frc = sbp_flow_run(&fl, &fo, &d, NULL);
    if (frc != IR_OK)
        e2e_print_diag(&d);
    assert_int_equal(frc, IR_OK);
    assert_int_equal(fl.chosen, ec->obj);
    assert_non_null(fl.program->logps);
    assert_int_equal(ec->lora_rank > 0, fl.n_adapted > 0);

    emu_rt r;
    emu_so_load(fl.program, model, ec->tag, &r);
    const sbp_step_info *in = r.info();
    assert_string_equal(in->target, "cuda");
    assert_int_equal(in->packed, ec->packed);
    assert_int_equal(in->lora_rank, ec->lora_rank);
    assert_int_equal(in->host_bytes, 0);
    assert_int_equal(in->logp_workspace_bytes, fl.program->logps->workspace_bytes);

    /* the batch and the float64 references */
    char err[256], key[64];
    sbpio_st_file *f = NULL;
    const char *ref = ec->packed ? "hf/ref/logps_packed.safetensors" : "hf/ref/logps.safetensors";
    if (sbpio_st_open(e2e_fixture(ref), &f, err, sizeof err) != SBPIO_OK)
        fail_msg("%s", err);
    double ref_row[LB], ref_tok[N];
    int32_t ids[N], labels[N], docs[N];
    read_ints(f, "input/ids", ids);
    read_ints(f, "input/labels", labels);
    if (ec->packed)
        read_ints(f, "input/docs", docs);
    snprintf(key, sizeof key, "%s/row_logps", ec->family);
    read_f64(f, key, ref_row, LB);
    snprintf(key, sizeof key, "%s/token_logps", ec->family);
    read_f64(f, key, ref_tok, N);
    sbpio_st_close(f);

    sbprt_ctx *ctx = NULL;
    assert_int_equal(r.ctx_create(&ctx, 0), SBPRT_OK);
    float *params = e2e_param_block(in, fl.g);
    if (ec->lora_rank)
        check_adapters(in, params);
    unsigned char *garbage = malloc(in->logp_workspace_bytes + 1);
    assert_non_null(garbage);
    memset(garbage, 0xff, in->logp_workspace_bytes);
    float nan_row[LB], nan_tok[N];
    for (int i = 0; i < N; i++)
        nan_tok[i] = NAN;
    for (int b = 0; b < LB; b++)
        nan_row[b] = NAN;
    sbp_step_args a = {
        .params = emu_dev_copy(&r, ctx, params, sizeof(float) * in->param_elems),
        .input_ids = emu_dev_copy(&r, ctx, ids, sizeof ids),
        .labels = emu_dev_copy(&r, ctx, labels, sizeof labels),
        .doc_ids = ec->packed ? emu_dev_copy(&r, ctx, docs, sizeof docs) : NULL,
        .workspace = emu_dev_copy(&r, ctx, garbage, in->logp_workspace_bytes),
    };
    float *d_row = emu_dev_copy(&r, ctx, nan_row, sizeof nan_row);
    float *d_tok = emu_dev_copy(&r, ctx, nan_tok, sizeof nan_tok);
    int64_t scored = -1;
    a.n_scored = &scored;
    int rc = r.logps(ctx, &a, d_row, d_tok);
    assert_int_equal(rc, SBPRT_OK);
    float row[LB], tok[N];
    assert_int_equal(r.memcpy(ctx, row, d_row, sizeof row, SBPRT_COPY_DEVICE_TO_HOST), SBPRT_OK);
    assert_int_equal(r.memcpy(ctx, tok, d_tok, sizeof tok, SBPRT_COPY_DEVICE_TO_HOST), SBPRT_OK);

    int64_t n = 0;
    double row_err = 0, tok_err = 0, doc_err = 0;
    int n_docs = 0;
    for (int i = 0; i < N; i++) {
        n += labels[i] != -100;
        if (labels[i] == -100) {
            assert_true(tok[i] == 0.0f);
            continue;
        }
        tok_err = fmax(tok_err, fabs(tok[i] - ref_tok[i]) / fmax(1.0, fabs(ref_tok[i])));
    }
    for (int b = 0; b < LB; b++) {
        row_err = fmax(row_err, fabs(row[b] - ref_row[b]) / fabs(ref_row[b]));
        double sum = 0; /* the row is its tokens' sum */
        for (int t = 0; t < LT; t++)
            sum += tok[b * LT + t];
        assert_true(fabs(row[b] - sum) <= 1e-6 * fmax(1.0, fabs(sum)));
        /* each document's logp: its tokens' sum against the document run alone */
        for (int s = 0; ec->packed && s < LT;) {
            int e = s;
            double got = 0, want = 0;
            for (; e < LT && docs[b * LT + e] == docs[b * LT + s]; e++) {
                got += tok[b * LT + e];
                want += ref_tok[b * LT + e];
            }
            doc_err = fmax(doc_err, fabs(got - want) / fmax(1.0, fabs(want)));
            n_docs++;
            s = e;
        }
    }
    assert_int_equal(scored, n);
    char docs_msg[64] = "";
    if (ec->packed)
        snprintf(docs_msg, sizeof docs_msg, ", %d documents %.1e", n_docs, doc_err);
    print_message("%-28s (cuda, emulated) rows rel %.1e%s, tokens %.1e vs float64 "
                  "transformers; workspace %zu\n",
                  ec->tag, row_err, docs_msg, tok_err, in->logp_workspace_bytes);
    assert_true(row_err <= ROW_TOL);
    assert_true(tok_err <= TOK_TOL);
    if (ec->packed) {
        assert_true(n_docs > LB); /* the rows were cut */
        assert_true(doc_err <= DOC_TOL);
    }
    r.free(ctx, (void *)a.params);
    r.free(ctx, (void *)a.input_ids);
    r.free(ctx, (void *)a.labels);
    if (a.doc_ids)
        r.free(ctx, (void *)a.doc_ids);
    r.free(ctx, a.workspace);
    r.free(ctx, d_row);
    r.free(ctx, d_tok);
    void (*release)(sbprt_ctx *);
    *(void **)&release = emu_so_sym(&r, "sbp_step_release");
    release(ctx);
    r.ctx_destroy(ctx);
    free(garbage);
    free(params);
    /* no dlclose: the emulator's threads' state would look leaked (LSan) */
    ir_graph_free(fl.g);
    ir_diag_free(&d);
}

static const emu_case cases[] = {
    {"emu_logps_dpo", SBP_OBJECTIVE_DPO, "hf/llama_dynamo_eager.onnx", "llama", false, 0},
    {"emu_logps_grpo", SBP_OBJECTIVE_GRPO, "hf/llama_dynamo_eager.onnx", "llama", false, 0},
    {"emu_logps_dpo_packed", SBP_OBJECTIVE_DPO, "hf/llama_dynamo_eager.onnx", "llama", true, 0},
    {"emu_logps_grpo_packed", SBP_OBJECTIVE_GRPO, "hf/llama_dynamo_eager.onnx", "llama", true, 0},
    {"emu_logps_gpt2_grpo_packed", SBP_OBJECTIVE_GRPO, "hf/gpt2_dynamo_eager.onnx", "gpt2", true,
     0},
    {"emu_logps_dpo_lora", SBP_OBJECTIVE_DPO, "hf/llama_dynamo_scoped.onnx", "llama", false, 4},
    {"emu_logps_grpo_packed_lora", SBP_OBJECTIVE_GRPO, "hf/llama_dynamo_scoped.onnx", "llama",
     true, 4},
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
        tests[i] = (struct CMUnitTest){.name = cases[i].tag + strlen("emu_logps_"),
                                       .test_func = test_case,
                                       .initial_state = (void *)&cases[i]};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
