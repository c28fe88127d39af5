/* test_step.c — a hand-written training step implementing codegen/sbp_step.h, so that sbp-train
 * can be tested end to end before (and independently of) the code generator.
 *
 * Two tiny models, chosen at compile time, each also written as ONNX by train_fixture.c:
 *
 *   TEST_STEP_KIND 0, "bigram":  logits = W[ids]                          W: [V, V]
 *   TEST_STEP_KIND 1, "tied":    logits = E[ids] @ head + bias            E: [V, D]
 *                                head: [D, V] re-tied to E (head = Eᵀ, no storage of its own),
 *                                bias: [V] frozen (trainable 0: no gradient, no slot in the
 *                                gradient block, which holds E's only)
 *
 * Both end in the SFT mean cross-entropy over the scored labels. Dims come from TEST_STEP_B,
 * TEST_STEP_T, TEST_STEP_V, TEST_STEP_D; TEST_STEP_ABI overrides the ABI version (to test that
 * sbp-train refuses a step of another ABI). Like a generated step it never allocates: every
 * temporary lives in the caller's workspace at a fixed offset.
 *
 * TEST_STEP_PACKED 1 makes a step that says it was compiled with sbpc --packed: it
 * requires args->doc_ids (SBPRT_ERR_INVALID without them, or when they decrease along a row or
 * a label crosses a document boundary). Every kind, when the environment names a file in
 * SBP_TEST_PACK_TRACE, appends to it the ids, labels and doc ids (-1s without them) of every
 * call, so that tests/train/pack_ref.py and dataset_ref.py can compare what sbp-train gave the
 * step with their reference rows.
 * The model itself is the bigram's (it has no attention for the documents to restrict).
 */
#include "sbp_step.h"

#ifndef TEST_STEP_KIND
#define TEST_STEP_KIND 0
#endif
#ifndef TEST_STEP_B
#define TEST_STEP_B 2
#endif
#ifndef TEST_STEP_T
#define TEST_STEP_T 8
#endif
#ifndef TEST_STEP_V
#define TEST_STEP_V 16
#endif
#ifndef TEST_STEP_D
#define TEST_STEP_D 4
#endif
#ifndef TEST_STEP_ABI
#define TEST_STEP_ABI SBP_STEP_ABI_VERSION
#endif
#ifndef TEST_STEP_PACKED
#define TEST_STEP_PACKED 0
#endif

#include <stdio.h>
#include <stdlib.h>

enum { B = TEST_STEP_B, T = TEST_STEP_T, V = TEST_STEP_V, D = TEST_STEP_D, N = B * T };

/* Workspace layout, in floats (each part a multiple of 16 floats = SBPRT_ALIGN bytes). */
#define ROUND16(x) (((x) + 15) / 16 * 16)
enum {
    WS_LOSS = 0,                              /* [1] loss sum */
    WS_LOGITS = 16,                           /* [N, V] logits, then dlogits in place */
    WS_X = WS_LOGITS + ROUND16(N * V),        /* [N, D] (tied) embedded rows */
    WS_DX = WS_X + ROUND16(N * D),            /* [N, D] (tied) their gradient */
    WS_FLOATS = WS_DX + ROUND16(N * D),
};

#if TEST_STEP_KIND == 0
static const sbp_step_param params[] = {
    {.name = "W", .rank = 2, .dims = {V, V}, .numel = V * V, .offset = 0, .trainable = 1,
     .tied_to = -1, .grad_offset = 0},
};
#define PARAM_ELEMS (V * V)
#define GRAD_ELEMS (V * V)
#define WS_USED WS_X
#else
static const sbp_step_param params[] = {
    {.name = "E", .rank = 2, .dims = {V, D}, .numel = V * D, .offset = 0, .trainable = 1,
     .tied_to = -1, .grad_offset = 0},
    {.name = "head", .rank = 2, .dims = {D, V}, .numel = D * V, .offset = 0, .trainable = 1,
     .tied_to = 0, .grad_offset = 0},
    {.name = "bias", .rank = 1, .dims = {V}, .numel = V, .offset = V * D, .trainable = 0,
     .tied_to = -1, .grad_offset = SIZE_MAX},
};
#define PARAM_ELEMS (V * D + V)
#define GRAD_ELEMS (V * D)
#define WS_USED WS_FLOATS
#endif

static const sbp_step_info info = {
    .abi_version = TEST_STEP_ABI,
    .target = "cpu",
    .strategy = "store",
    .objective = "sft",
    .model_path = "(hand-written test step)",
    .model_fingerprint = 0,
    .batch = B,
    .seq_len = T,
    .vocab = V,
    .n_params = (int)(sizeof params / sizeof params[0]),
    .params = params,
    .param_elems = PARAM_ELEMS,
    .workspace_bytes = WS_USED * sizeof(float),
    .planned_peak_bytes = (PARAM_ELEMS + GRAD_ELEMS + WS_USED) * sizeof(float),
    .grad_elems = GRAD_ELEMS,
    .packed = TEST_STEP_PACKED,
};

const sbp_step_info *sbp_step_get_info(void) { return &info; }

int sbp_step_run(sbprt_ctx *ctx, const sbp_step_args *args)
{
    if (!args || !args->params || !args->grads || !args->input_ids || !args->labels ||
        !args->workspace || !args->loss)
        return SBPRT_ERR_INVALID;
#if TEST_STEP_PACKED
    /* what a packed step may assume of its doc ids: given, non-decreasing along each row; and
     * what sbp-train's packing promises besides: no label across a document boundary */
    if (!args->doc_ids)
        return SBPRT_ERR_INVALID;
    for (int i = 0; i < N; i++)
        if (i % T > 0 && (args->doc_ids[i] < args->doc_ids[i - 1] ||
                          (args->doc_ids[i] != args->doc_ids[i - 1] &&
                           args->labels[i - 1] != SBPRT_IGNORE_INDEX)))
            return SBPRT_ERR_INVALID;
#endif
    const char *trace = getenv("SBP_TEST_PACK_TRACE");
    FILE *tf = trace && *trace ? fopen(trace, "a") : NULL;
    if (tf) { /* an unpacked step has no doc ids: its "docs" line holds -1s */
        const int32_t *arr[3] = {args->input_ids, args->labels, args->doc_ids};
        const char *key[3] = {"ids", "labels", "docs"};
        for (int k = 0; k < 3; k++) {
            fputs(key[k], tf);
            for (int i = 0; i < N; i++)
                fprintf(tf, " %d", arr[k] ? (int)arr[k][i] : -1);
            fputc('\n', tf);
        }
        fclose(tf);
    }
    float *ws = args->workspace;
    float *loss_sum = ws + WS_LOSS, *logits = ws + WS_LOGITS;
    const float *p = args->params;
    float *g = args->grads;
    int st;

    int64_t scored = 0;
    for (int i = 0; i < N; i++)
        scored += args->labels[i] != SBPRT_IGNORE_INDEX;
    double denom = args->denominator > 0 ? args->denominator : (double)scored;
    if (!args->accumulate && (st = sbprt_memset_zero(ctx, g, GRAD_ELEMS * sizeof(float))))
        return st;
    *loss_sum = 0;

#if TEST_STEP_KIND == 0
    if ((st = sbprt_embedding_forward(ctx, logits, p, args->input_ids, N, V, V)) ||
        (st = sbprt_cross_entropy_forward_backward(ctx, loss_sum, logits, logits, args->labels,
                                                   N, V, (float)(1.0 / denom))) ||
        (st = sbprt_embedding_backward(ctx, g, logits, args->input_ids, N, V, V)))
        return st;
#else
    float *x = ws + WS_X, *dx = ws + WS_DX;
    const float *E = p, *bias = p + V * D;
    float *dE = g;
    if ((st = sbprt_embedding_forward(ctx, x, E, args->input_ids, N, V, D)) ||
        (st = sbprt_gemm(ctx, logits, x, E, 0, 1, N, V, D, 1, 0)) ||   /* x @ head = x Eᵀ */
        (st = sbprt_bias_add(ctx, logits, bias, N, V)) ||
        (st = sbprt_cross_entropy_forward_backward(ctx, loss_sum, logits, logits, args->labels,
                                                   N, V, (float)(1.0 / denom))) ||
        (st = sbprt_gemm(ctx, dx, logits, E, 0, 0, N, D, V, 1, 0)) ||  /* dx = dlogits E */
        (st = sbprt_gemm(ctx, dE, logits, x, 1, 0, V, D, N, 1, 1)) ||  /* dE += dlogitsᵀ x */
        (st = sbprt_embedding_backward(ctx, dE, dx, args->input_ids, N, V, D)))
        return st;
    /* bias is frozen: no gradient */
#endif
    *args->loss = *loss_sum / denom;
    if (args->n_scored)
        *args->n_scored = scored;
    return SBPRT_OK;
}
