/* logps_run.c — one DPO or GRPO step's sbp_step_logps on one batch, for a Python reference to
 * compare (tests/e2e/logps_torch.py, ctest e2e.logps_torch).
 *
 *   e2e_logps_run MODEL.onnx BATCH.safetensors OUT.safetensors OBJECTIVE STRATEGY CHUNK
 *                 LOGITS_CHUNK LORA_RANK PACKED TAG [PER_DOCUMENT]
 *
 * The step is compiled the way sbpc compiles it (the whole flow, passes/flow.h, with --lora
 * RANK --lora-alpha 8 and the default targets when RANK > 0, --packed when PACKED is 1,
 * --per-document too when PER_DOCUMENT is 1 (default 0); CHUNK and LOGITS_CHUNK 0: the
 * strategy's defaults) into SBP_E2E_OUT/TAG.so. BATCH holds input/ids,
 * input/labels [B, T] and, for a packed step, input/docs (F64 with integer values, as
 * tests/fixtures/hf/ref/logps.safetensors); B and T are its shape. The parameters are the
 * model's initializers and, with LoRA, the adapters' initial values (lora_A from the seeded
 * generator, lora_B zeros), exactly what sbp-train starts from. sbp_step_logps runs once on a
 * workspace of exactly logp_workspace_bytes filled with garbage; OUT gets row_logps [B] (per
 * document: [B, T], document k of row b at [b, k]) and token_logps [B, T] as F32, the step's own
 * values, unconverted.
 *
 * The program checks only what needs no reference (the step is packed and adapted as asked,
 * the call succeeds, n_scored is the batch's count, unscored tokens are exactly 0, the row sums
 * are the token sums; per document, a row's document values add up to its token sum); whether the values are right is the Python side's question, asked of
 * float64 transformers. Exit status 0, or a cmocka failure.
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
#include "flow.h"

typedef int (*logps_fn)(sbprt_ctx *, const sbp_step_args *, float *, float *);

static char **g_argv;
static int g_argc;

static sbp_strategy strategy_of(const char *s)
{
    if (strcmp(s, "store") == 0)
        return SBP_STRATEGY_STORE;
    if (strcmp(s, "checkpoint") == 0)
        return SBP_STRATEGY_CHECKPOINT;
    if (strcmp(s, "stream") == 0)
        return SBP_STRATEGY_STREAM;
    fail_msg("unknown strategy '%s'", s);
    return SBP_STRATEGY_STORE;
}

/* The batch tensor `name` [n] as int32 (the file's F64 integers). */
static void read_ints(sbpio_st_file *f, const char *name, int32_t *dst, int64_t n)
{
    char err[256];
    double *tmp = malloc((size_t)n * sizeof *tmp);
    assert_non_null(tmp);
    if (sbpio_st_copy_f64(f, name, tmp, n, err, sizeof err) != SBPIO_OK)
        fail_msg("%s", err);
    for (int64_t i = 0; i < n; i++)
        dst[i] = (int32_t)tmp[i];
    free(tmp);
}

static void run(void **state)
{
    (void)state;
    const char *model = g_argv[1], *batch = g_argv[2], *out = g_argv[3], *tag = g_argv[10];
    const sbp_objective obj = strcmp(g_argv[4], "dpo") == 0 ? SBP_OBJECTIVE_DPO
                              : strcmp(g_argv[4], "grpo") == 0 ? SBP_OBJECTIVE_GRPO
                                                                : SBP_OBJECTIVE_SFT;
    assert_int_not_equal(obj, SBP_OBJECTIVE_SFT); /* only DPO and GRPO steps have logps */
    const int64_t rank = atoll(g_argv[8]);
    const bool packed = atoi(g_argv[9]) != 0;
    const bool per_doc = g_argc > 11 && atoi(g_argv[11]) != 0;

    char err[256];
    sbpio_st_file *bf = NULL;
    if (sbpio_st_open(batch, &bf, err, sizeof err) != SBPIO_OK)
        fail_msg("%s", err);
    const sbpio_st_info *shape = sbpio_st_find(bf, "input/ids");
    assert_non_null(shape);
    assert_int_equal(shape->rank, 2);
    const int64_t B = shape->shape[0], T = shape->shape[1], N = B * T;
    int32_t *ids = malloc((size_t)N * sizeof *ids), *labels = malloc((size_t)N * sizeof *labels);
    int32_t *docs = packed ? malloc((size_t)N * sizeof *docs) : NULL;
    assert_true(ids && labels && (!packed || docs));
    read_ints(bf, "input/ids", ids, N);
    read_ints(bf, "input/labels", labels, N);
    if (packed)
        read_ints(bf, "input/docs", docs, N);
    sbpio_st_close(bf);

    /* the flow as sbpc runs it, with the options sbpc's flags set */
    sbp_flow_options fo = {.pass = {.batch = B, .seq_len = T, .verify = true},
                           .objective = obj,
                           .lora = {.rank = rank, .alpha = 8.0, .seed = 0},
                           .train = {.strategy = strategy_of(g_argv[5]),
                                     .chunk = atoll(g_argv[6]),
                                     .logits_chunk = atoll(g_argv[7]), .packed = packed,
                                     .per_document = per_doc,
                                     .eval = true, .beta = sbp_objective_default_beta(obj),
                                     .epsilon = obj == SBP_OBJECTIVE_GRPO ? 0.2 : 0}};
    sbp_flow f = {.path = model};
    ir_diag d;
    ir_diag_init(&d, model);
    int rc = sbp_flow_run(&f, &fo, &d, NULL);
    if (rc != IR_OK)
        e2e_print_diag(&d);
    assert_int_equal(rc, IR_OK);
    e2e_step s = {.g = f.g};
    e2e_load_so(&s, f.program, f.path, tag, &d);
    const sbp_step_info *in = s.info;
    assert_int_equal(in->packed, packed);
    assert_int_equal(in->per_document, per_doc);
    assert_int_equal(in->lora_rank, rank);
    assert_int_equal(rank > 0, f.n_adapted > 0);
    assert_true(in->logp_workspace_bytes > 0);
    logps_fn lf;
    *(void **)&lf = dlsym(s.lib, "sbp_step_logps");
    assert_non_null(lf);

    float *params = e2e_param_block(in, f.g);
    size_t wsb = in->logp_workspace_bytes;
    void *ws = aligned_alloc(SBPRT_ALIGN, (wsb + SBPRT_ALIGN - 1) / SBPRT_ALIGN * SBPRT_ALIGN);
    const int64_t R = per_doc ? N : B; /* row_logps: per row, or per document [B, T] */
    float *row = malloc((size_t)R * sizeof *row), *tok = malloc((size_t)N * sizeof *tok);
    assert_true(ws && row && tok);
    memset(ws, 0xff, wsb); /* garbage: the entry point must not rely on zeroed memory */
    for (int64_t i = 0; i < N; i++)
        tok[i] = NAN;
    for (int64_t b = 0; b < R; b++)
        row[b] = NAN;
    int64_t scored = -1;
    sbp_step_args a = {.params = params, .input_ids = ids, .labels = labels, .doc_ids = docs,
                       .workspace = ws, .n_scored = &scored};
    rc = lf(e2e_ctx, &a, row, tok);
    if (rc)
        print_message("sbp_step_logps: %s\n", sbprt_status_string(rc));
    assert_int_equal(rc, SBPRT_OK);
    int64_t n = 0;
    for (int64_t i = 0; i < N; i++) {
        n += labels[i] != -100;
        if (labels[i] == -100)
            assert_true(tok[i] == 0.0f);
    }
    assert_int_equal(scored, n);
    for (int64_t b = 0; b < B; b++) { /* the row is its tokens' sum (in double, in order) */
        double sum = 0, docs = 0;
        for (int64_t t = 0; t < T; t++) {
            sum += tok[b * T + t];
            docs += per_doc ? row[b * T + t] : 0; /* its documents', 0 after them */
        }
        const double got = per_doc ? docs : row[b];
        assert_true(fabs(got - sum) <= 1e-6 * fmax(1.0, fabs(sum)));
    }

    int64_t rshape[2] = {B, T}, tshape[2] = {B, T};
    sbpio_st_tensor t[2] = {
        {.name = "row_logps", .dtype = SBPIO_DT_F32, .rank = per_doc ? 2 : 1, .shape = rshape,
         .data = row},
        {.name = "token_logps", .dtype = SBPIO_DT_F32, .rank = 2, .shape = tshape, .data = tok}};
    sbpio_kv meta[] = {{"model", model}, {"tag", tag}};
    if (sbpio_st_write(out, 2, t, 2, meta, false, err, sizeof err) != SBPIO_OK)
        fail_msg("%s", err);
    print_message("%s: %lld rows, %lld scored tokens, logp workspace %zu bytes -> %s\n", tag,
                  (long long)B, (long long)n, wsb, out);
    free(ws);
    free(row);
    free(tok);
    free(params);
    free(ids);
    free(labels);
    free(docs);
    e2e_free_step(&s); /* frees f.g */
    ir_diag_free(&d);
}

int main(int argc, char **argv)
{
    if (argc != 11 && argc != 12) {
        fprintf(stderr, "usage: e2e_logps_run MODEL.onnx BATCH.safetensors OUT.safetensors "
                        "dpo|grpo store|checkpoint|stream CHUNK LOGITS_CHUNK LORA_RANK PACKED "
                        "TAG [PER_DOCUMENT]\n");
        return 2;
    }
    g_argv = argv;
    g_argc = argc;
    e2e_init();
    if (sbprt_ctx_create(&e2e_ctx, 0) != SBPRT_OK)
        return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(run)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    sbprt_ctx_destroy(e2e_ctx);
    return rc;
}
