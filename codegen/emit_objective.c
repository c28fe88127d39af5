/* emit_objective.c — the DPO / GRPO parts of the emitted step (see emit_objective.h).
 *
 * The host steps run between kernels of a block, at the points the program puts them:
 *   obj_grpo_row_weights  (GRPO, before the loss) each row's weight of its token losses:
 *                         sequence normalisation 1 / (the row's scored tokens * rows), token
 *                         normalisation 1 / (scored tokens); rows and scored tokens are the
 *                         caller's denominator when given (gradient accumulation over
 *                         micro-batches), else this batch's;
 *   obj_dpo_coefficients  (DPO, after the per-token logp) the loss and dL/dlogp of each row,
 *                         written to each of its tokens: pairs (row i, row B/2 + i),
 *                         z = β ((logp_i - ref_i) - (logp_j - ref_j)), loss = Σ -log σ(z) /
 *                         pairs, dL/dlogp_i = -β σ(-z) / pairs = -dL/dlogp_j; the row sums
 *                         it has on the host anyway also go to args->row_logps when given
 *                         (host memory on either target, so no copy back is needed);
 *   obj_logp_outputs      (sbp_step_logps, after the log-probability program) its outputs:
 *                         each row's logp summed as obj_dpo_coefficients sums it, and a copy
 *                         of the per-token values.
 * Per document (sbpc --per-document, p->per_document): the unit is each document of a row, the
 * maximal runs of equal args->doc_ids that hold a scored label, numbered k = 0, 1, .. along
 * the row, document k of row b at b*T + k of the [B*T] per-unit arrays (ref_logps, advantages,
 * row_logps). The host steps walk the rows' runs in blocks (obj_runs) and write their outputs
 * front to back (obj_writer):
 *   obj_dpo_coefficients  pairs (document k of row i, document k of row B/2 + i), after
 *                         checking that both rows hold as many documents (else
 *                         SBPRT_ERR_INVALID); each document's tokens get its coefficient;
 *   obj_grpo_doc_weights  (GRPO, before the loss; GRPO_DOC_WEIGHTS) each token's weight, 1 /
 *                         (its document's scored tokens * documents) for the sequence
 *                         normalisation (1 / scored tokens for the token one), and its
 *                         document's advantage, into flat [B*T] buffers;
 *   obj_logp_outputs      each document's logp at b*T + k, 0 beyond the row's documents.
 * Sums are in double, in row order; -log σ and σ are evaluated in their stable forms.
 */
#include "emit_objective.h"

#include <string.h>

static bool is_pref(const sbp_train_program *p)
{
    return p->objective == SBP_OBJECTIVE_DPO || p->objective == SBP_OBJECTIVE_GRPO;
}

void sbp_emit_objective_info(const sbp_train_program *p, FILE *f)
{
    if (!is_pref(p))
        return;
    fprintf(f, "    .beta = %.17g,\n", p->beta);
    if (p->per_document)
        fputs("    .per_document = 1, /* ABI 8: the objective's unit is each document (sbpc "
              "--per-document) */\n", f);
    if (p->objective == SBP_OBJECTIVE_GRPO)
        fprintf(f, "    .epsilon = %.17g,\n    .grpo_norm = \"%s\",\n", p->epsilon,
                sbp_grpo_norm_name(p->grpo_norm));
}

void sbp_emit_objective_checks(const sbp_train_program *p, FILE *f)
{
    if (p->objective == SBP_OBJECTIVE_DPO)
        fputs("    if (!args->ref_logps) /* DPO: the reference model's logp of each row */\n"
              "        return SBPRT_ERR_INVALID;\n",
              f);
    else if (p->objective == SBP_OBJECTIVE_GRPO)
        fprintf(f,
                "    if (!args->advantages%s) /* GRPO: advantages%s */\n"
                "        return SBPRT_ERR_INVALID;\n",
                p->beta > 0 ? " || !args->ref_logps" : "",
                p->beta > 0 ? "; the reference logp (beta > 0)" : "");
}

/* Block copies between backend memory and small host arrays. */
static const char *const copy_helpers =
    "\n/* Host steps of the objective read and write backend memory in blocks of OBJ_BLOCK\n"
    " * values through sbprt_memcpy (a plain copy on the CPU, a device copy on CUDA). */\n"
    "#define OBJ_BLOCK 1024\n";

static const char *const count_helper =
    "\n/* *count = scored labels among labels[first .. first + n). */\n"
    "static int obj_count_scored(sbprt_ctx *ctx, const int32_t *labels, int64_t first, int64_t n,\n"
    "                            int64_t *count)\n"
    "{\n"
    "    int32_t buf[OBJ_BLOCK];\n"
    "    int64_t c = 0;\n"
    "    for (int64_t i = 0; i < n; i += OBJ_BLOCK) {\n"
    "        const int64_t k = n - i < OBJ_BLOCK ? n - i : OBJ_BLOCK;\n"
    "        TRY(sbprt_memcpy(ctx, buf, labels + first + i, sizeof(int32_t) * (size_t)k,\n"
    "                         SBPRT_COPY_DEVICE_TO_HOST));\n"
    "        for (int64_t j = 0; j < k; j++)\n"
    "            c += buf[j] != SBPRT_IGNORE_INDEX;\n"
    "    }\n"
    "    *count = c;\n"
    "    return SBPRT_OK;\n"
    "}\n";

/* Per document: a row's runs of equal document ids, and sequential block writes and reads of
 * backend memory. OBJ_T (the row length) is printed before them. */
static const char *const doc_helpers =
    "\n/* A row's runs of equal document ids (its documents: the runs that hold a scored label),\n"
    " * read from backend memory in blocks of OBJ_BLOCK positions. */\n"
    "typedef struct obj_runs {\n"
    "    const int32_t *docs, *labels; /* the row's [OBJ_T] document ids and labels */\n"
    "    const float *lp;              /* the row's [OBJ_T] token logp, or NULL (not summed) */\n"
    "    int64_t t;                    /* the next run's first position */\n"
    "    int64_t base, len;            /* the block held: positions [base, base + len) */\n"
    "    int32_t d[OBJ_BLOCK], l[OBJ_BLOCK];\n"
    "    float p[OBJ_BLOCK];\n"
    "} obj_runs;\n"
    "\n"
    "static void obj_runs_start(obj_runs *r, const int32_t *docs, const int32_t *labels,\n"
    "                           const float *lp)\n"
    "{\n"
    "    r->docs = docs;\n"
    "    r->labels = labels;\n"
    "    r->lp = lp;\n"
    "    r->t = r->base = r->len = 0;\n"
    "}\n"
    "\n"
    "/* The block holding position i (< OBJ_T). */\n"
    "static int obj_runs_hold(sbprt_ctx *ctx, obj_runs *r, int64_t i)\n"
    "{\n"
    "    if (i >= r->base && i < r->base + r->len)\n"
    "        return SBPRT_OK;\n"
    "    const int64_t k = OBJ_T - i < OBJ_BLOCK ? OBJ_T - i : OBJ_BLOCK;\n"
    "    TRY(sbprt_memcpy(ctx, r->d, r->docs + i, sizeof(int32_t) * (size_t)k,\n"
    "                     SBPRT_COPY_DEVICE_TO_HOST));\n"
    "    TRY(sbprt_memcpy(ctx, r->l, r->labels + i, sizeof(int32_t) * (size_t)k,\n"
    "                     SBPRT_COPY_DEVICE_TO_HOST));\n"
    "    if (r->lp)\n"
    "        TRY(sbprt_memcpy(ctx, r->p, r->lp + i, sizeof(float) * (size_t)k,\n"
    "                         SBPRT_COPY_DEVICE_TO_HOST));\n"
    "    r->base = i;\n"
    "    r->len = k;\n"
    "    return SBPRT_OK;\n"
    "}\n"
    "\n"
    "/* The next run of the row: positions [*start, *end) (*start == OBJ_T: none left), its\n"
    " * scored labels and, with lp, their logp summed in double, in order. */\n"
    "static int obj_next_run(sbprt_ctx *ctx, obj_runs *r, int64_t *start, int64_t *end,\n"
    "                        int64_t *scored, double *sum)\n"
    "{\n"
    "    *start = *end = r->t;\n"
    "    *scored = 0;\n"
    "    *sum = 0;\n"
    "    if (r->t >= OBJ_T)\n"
    "        return SBPRT_OK;\n"
    "    TRY(obj_runs_hold(ctx, r, r->t));\n"
    "    const int32_t id = r->d[r->t - r->base];\n"
    "    int64_t i = r->t;\n"
    "    for (; i < OBJ_T; i++) {\n"
    "        TRY(obj_runs_hold(ctx, r, i));\n"
    "        const int64_t j = i - r->base;\n"
    "        if (r->d[j] != id)\n"
    "            break;\n"
    "        if (r->l[j] != SBPRT_IGNORE_INDEX) {\n"
    "            ++*scored;\n"
    "            if (r->lp)\n"
    "                *sum += r->p[j];\n"
    "        }\n"
    "    }\n"
    "    *end = r->t = i;\n"
    "    return SBPRT_OK;\n"
    "}\n"
    "\n"
    "/* Writes of backend memory x[0 ..), front to back, in blocks: obj_put appends count copies\n"
    " * of v, obj_flush writes what is held. */\n"
    "typedef struct obj_writer {\n"
    "    float *x;\n"
    "    int64_t at, n; /* x[0 .. at) written; v[0 .. n) held for x[at ..) */\n"
    "    float v[OBJ_BLOCK];\n"
    "} obj_writer;\n"
    "\n"
    "static int obj_flush(sbprt_ctx *ctx, obj_writer *w)\n"
    "{\n"
    "    if (w->n > 0)\n"
    "        TRY(sbprt_memcpy(ctx, w->x + w->at, w->v, sizeof(float) * (size_t)w->n,\n"
    "                         SBPRT_COPY_HOST_TO_DEVICE));\n"
    "    w->at += w->n;\n"
    "    w->n = 0;\n"
    "    return SBPRT_OK;\n"
    "}\n"
    "\n"
    "static int obj_put(sbprt_ctx *ctx, obj_writer *w, float v, int64_t count)\n"
    "{\n"
    "    while (count > 0) {\n"
    "        if (w->n == OBJ_BLOCK)\n"
    "            TRY(obj_flush(ctx, w));\n"
    "        const int64_t k = count < OBJ_BLOCK - w->n ? count : OBJ_BLOCK - w->n;\n"
    "        for (int64_t j = 0; j < k; j++)\n"
    "            w->v[w->n++] = v;\n"
    "        count -= k;\n"
    "    }\n"
    "    return SBPRT_OK;\n"
    "}\n";

/* Per document: the next document of a row. */
static const char *const next_doc_helper =
    "\n/* The next document of the row (runs with nothing scored are skipped): as obj_next_run. */\n"
    "static int obj_next_doc(sbprt_ctx *ctx, obj_runs *r, int64_t *start, int64_t *end,\n"
    "                        int64_t *scored, double *sum)\n"
    "{\n"
    "    do\n"
    "        TRY(obj_next_run(ctx, r, start, end, scored, sum));\n"
    "    while (*start < OBJ_T && *scored == 0);\n"
    "    return SBPRT_OK;\n"
    "}\n";

/* Per document: the documents of a row, counted. */
static const char *const count_docs_helper =
    "\n/* *n = the documents of the row (docs, labels: its [OBJ_T], backend memory). */\n"
    "static int obj_count_docs(sbprt_ctx *ctx, const int32_t *docs, const int32_t *labels,\n"
    "                          int64_t *n)\n"
    "{\n"
    "    obj_runs r;\n"
    "    int64_t s, e, c;\n"
    "    double sum;\n"
    "    obj_runs_start(&r, docs, labels, NULL);\n"
    "    *n = 0;\n"
    "    for (;;) {\n"
    "        TRY(obj_next_doc(ctx, &r, &s, &e, &c, &sum));\n"
    "        if (s >= OBJ_T)\n"
    "            return SBPRT_OK;\n"
    "        ++*n;\n"
    "    }\n"
    "}\n";

/* Reads of x[i] (backend memory, i rising) through a block held on the host. */
static const char *const reader_helper =
    "\n/* x[i] of backend memory x[0 .. n), through a block of OBJ_BLOCK values held on the\n"
    " * host (reads that rise along x copy each block once). */\n"
    "typedef struct obj_reader {\n"
    "    const float *x;\n"
    "    int64_t n, base, len; /* the block held: x[base .. base + len) */\n"
    "    float v[OBJ_BLOCK];\n"
    "} obj_reader;\n"
    "\n"
    "static int obj_read(sbprt_ctx *ctx, obj_reader *r, int64_t i, float *out)\n"
    "{\n"
    "    if (i < r->base || i >= r->base + r->len) {\n"
    "        const int64_t k = r->n - i < OBJ_BLOCK ? r->n - i : OBJ_BLOCK;\n"
    "        TRY(sbprt_memcpy(ctx, r->v, r->x + i, sizeof(float) * (size_t)k,\n"
    "                         SBPRT_COPY_DEVICE_TO_HOST));\n"
    "        r->base = i;\n"
    "        r->len = k;\n"
    "    }\n"
    "    *out = r->v[i - r->base];\n"
    "    return SBPRT_OK;\n"
    "}\n";

/* The per-document helpers the host steps use (unused static functions would be warnings): the
 * runs and the writer always, the next document for the count and for sbp_step_logps's
 * outputs, the document count and the reader when asked. */
static void emit_doc_helpers(const sbp_train_program *p, bool count_docs, bool reader, FILE *f)
{
    fprintf(f, "\n#define OBJ_T ((int64_t)%lld) /* tokens per row */\n", (long long)p->seq_len);
    fputs(doc_helpers, f);
    if (count_docs || p->logps)
        fputs(next_doc_helper, f);
    if (count_docs)
        fputs(count_docs_helper, f);
    if (reader)
        fputs(reader_helper, f);
}

/* GRPO per document: each token's weight and advantage from its document. */
static void emit_grpo_doc(const sbp_train_program *p, FILE *f)
{
    long long B = (long long)p->batch;
    bool token = p->grpo_norm == SBP_GRPO_NORM_TOKEN;
    if (token)
        fputs(count_helper, f);
    fprintf(f,
            "\n/* GRPO per document (%s normalisation): each token's weight and advantage, its\n"
            " * document's (args->advantages[b*OBJ_T + k] for document k of row b), into the flat\n"
            " * [%lld*OBJ_T] buffers w and adv; 0 at the tokens of runs that are not documents. */\n"
            "static int obj_grpo_doc_weights(sbprt_ctx *ctx, const sbp_step_args *args, float *w,\n"
            "                                float *adv, const int32_t *labels)\n"
            "{\n",
            sbp_grpo_norm_name(p->grpo_norm), B);
    if (token)
        fprintf(f,
                "    /* 1 / the scored tokens: the caller's count over all micro-batches, else "
                "this batch's */\n"
                "    int64_t scored = 0;\n"
                "    if (args->denominator <= 0)\n"
                "        TRY(obj_count_scored(ctx, labels, 0, %lld * OBJ_T, &scored));\n"
                "    const double denom = args->denominator > 0 ? args->denominator : "
                "(double)scored;\n"
                "    const float each = denom > 0 ? (float)(1.0 / denom) : 0.0f;\n",
                B);
    else
        fprintf(f,
                "    /* 1 / (the document's scored tokens * documents): documents over all\n"
                "     * micro-batches when the caller says, else this batch's */\n"
                "    int64_t n_docs = 0;\n"
                "    if (args->denominator <= 0)\n"
                "        for (int64_t b = 0; b < %lld; b++) {\n"
                "            int64_t n = 0;\n"
                "            TRY(obj_count_docs(ctx, args->doc_ids + b * OBJ_T, labels + b * "
                "OBJ_T, &n));\n"
                "            n_docs += n;\n"
                "        }\n"
                "    const double docs = args->denominator > 0 ? args->denominator : "
                "(double)n_docs;\n",
                B);
    fprintf(f,
            "    obj_runs r;\n"
            "    obj_reader a;\n"
            "    obj_writer ww = {.x = w}, wa = {.x = adv};\n"
            "    for (int64_t b = 0; b < %lld; b++) {\n"
            "        obj_runs_start(&r, args->doc_ids + b * OBJ_T, labels + b * OBJ_T, NULL);\n"
            "        a = (obj_reader){.x = args->advantages + b * OBJ_T, .n = OBJ_T};\n"
            "        for (int64_t k = 0;;) {\n"
            "            int64_t s, e, n;\n"
            "            double sum;\n"
            "            TRY(obj_next_run(ctx, &r, &s, &e, &n, &sum));\n"
            "            if (s >= OBJ_T)\n"
            "                break;\n"
            "            float A = 0.0f, wt = 0.0f;\n"
            "            if (n > 0) { /* document k */\n"
            "                TRY(obj_read(ctx, &a, k++, &A));\n"
            "                wt = %s;\n"
            "            }\n"
            "            TRY(obj_put(ctx, &ww, wt, e - s));\n"
            "            TRY(obj_put(ctx, &wa, A, e - s));\n"
            "        }\n"
            "    }\n"
            "    TRY(obj_flush(ctx, &ww));\n"
            "    return obj_flush(ctx, &wa);\n"
            "}\n",
            B, token ? "each" : "docs > 0 ? (float)(1.0 / ((double)n * docs)) : 0.0f");
}

static void emit_grpo(const sbp_train_program *p, FILE *f)
{
    long long B = (long long)p->batch, T = (long long)p->seq_len;
    fputs(copy_helpers, f);
    if (p->per_document) {
        emit_doc_helpers(p, p->grpo_norm != SBP_GRPO_NORM_TOKEN, true, f);
        emit_grpo_doc(p, f);
        return;
    }
    fputs(count_helper, f);
    fprintf(f,
            "\n/* GRPO (%s normalisation): each row's weight of its token losses, from the "
            "labels. */\n"
            "static int obj_grpo_row_weights(sbprt_ctx *ctx, const sbp_step_args *args,\n"
            "                                float *row_weight, const int32_t *labels)\n"
            "{\n"
            "    float w[OBJ_BLOCK];\n",
            sbp_grpo_norm_name(p->grpo_norm));
    if (p->grpo_norm == SBP_GRPO_NORM_TOKEN)
        fprintf(f,
                "    /* 1 / the scored tokens: the caller's count over all micro-batches, else "
                "this batch's */\n"
                "    int64_t scored = 0;\n"
                "    if (args->denominator <= 0)\n"
                "        TRY(obj_count_scored(ctx, labels, 0, %lld, &scored));\n"
                "    const double denom = args->denominator > 0 ? args->denominator : "
                "(double)scored;\n"
                "    const float each = denom > 0 ? (float)(1.0 / denom) : 0.0f;\n"
                "    for (int64_t b0 = 0; b0 < %lld; b0 += OBJ_BLOCK) {\n"
                "        const int64_t k = %lld - b0 < OBJ_BLOCK ? %lld - b0 : OBJ_BLOCK;\n"
                "        for (int64_t i = 0; i < k; i++)\n"
                "            w[i] = each;\n",
                B * T, B, B, B);
    else
        fprintf(f,
                "    /* 1 / (the row's scored tokens * rows): rows over all micro-batches when "
                "the\n"
                "     * caller says, else B; a row with nothing scored adds nothing */\n"
                "    const double rows = args->denominator > 0 ? args->denominator : %lld.0;\n"
                "    for (int64_t b0 = 0; b0 < %lld; b0 += OBJ_BLOCK) {\n"
                "        const int64_t k = %lld - b0 < OBJ_BLOCK ? %lld - b0 : OBJ_BLOCK;\n"
                "        for (int64_t i = 0; i < k; i++) {\n"
                "            int64_t n = 0;\n"
                "            TRY(obj_count_scored(ctx, labels, (b0 + i) * %lld, %lld, &n));\n"
                "            w[i] = n > 0 ? (float)(1.0 / ((double)n * rows)) : 0.0f;\n"
                "        }\n",
                B, B, B, B, T, T);
    fputs("        TRY(sbprt_memcpy(ctx, row_weight + b0, w, sizeof(float) * (size_t)k,\n"
          "                         SBPRT_COPY_HOST_TO_DEVICE));\n"
          "    }\n"
          "    return SBPRT_OK;\n"
          "}\n",
          f);
}

/* DPO per document: pairs (document k of row i, document k of row B/2 + i). */
static void emit_dpo_doc(const sbp_train_program *p, FILE *f)
{
    long long H = (long long)p->batch / 2;
    fprintf(f,
            "\n/* DPO per document (beta %.17g): the loss and each document's coefficient\n"
            " * dL/dlogp, written to each of its tokens (0 to the tokens of runs that are not\n"
            " * documents), from the per-token logp. Pair (i, k) = (document k of row i, document\n"
            " * k of row %lld + i); rows i and %lld + i must hold as many documents\n"
            " * (SBPRT_ERR_INVALID). ref_logps and row_logps are [B*OBJ_T], document k of row b\n"
            " * at b*OBJ_T + k (row_logps 0 elsewhere); the mean is over the caller's pairs (all\n"
            " * micro-batches) when given, else this batch's document pairs. */\n"
            "static int obj_dpo_coefficients(sbprt_ctx *ctx, const sbp_step_args *args, "
            "float *coef,\n"
            "                                float *loss, const float *token_logp)\n"
            "{\n"
            "    const double beta = %.17g;\n"
            "    int64_t n_pairs = 0;\n"
            "    for (int64_t i = 0; i < %lld; i++) {\n"
            "        int64_t n[2];\n"
            "        for (int s = 0; s < 2; s++) {\n"
            "            const int64_t row = i + s * %lld;\n"
            "            TRY(obj_count_docs(ctx, args->doc_ids + row * OBJ_T, args->labels + row * "
            "OBJ_T,\n"
            "                               &n[s]));\n"
            "        }\n"
            "        if (n[0] != n[1]) /* a chosen document without its rejected one */\n"
            "            return SBPRT_ERR_INVALID;\n"
            "        n_pairs += n[0];\n"
            "    }\n"
            "    const double pairs = args->denominator > 0 ? args->denominator : "
            "(double)n_pairs;\n"
            "    double total = 0;\n"
            "    obj_runs r[2];\n"
            "    obj_reader ref[2];\n"
            "    obj_writer w[2];\n"
            "    for (int64_t i = 0; i < %lld; i++) {\n"
            "        for (int s = 0; s < 2; s++) {\n"
            "            const int64_t row = i + s * %lld;\n"
            "            obj_runs_start(&r[s], args->doc_ids + row * OBJ_T, args->labels + row * "
            "OBJ_T,\n"
            "                           token_logp + row * OBJ_T);\n"
            "            ref[s] = (obj_reader){.x = args->ref_logps + row * OBJ_T, .n = OBJ_T};\n"
            "            w[s] = (obj_writer){.x = coef + row * OBJ_T};\n"
            "        }\n"
            "        int64_t k = 0;\n"
            "        for (;; k++) {\n"
            "            int64_t st[2], en[2], n;\n"
            "            double lp[2];\n"
            "            float rf[2];\n"
            "            for (int s = 0; s < 2; s++)\n"
            "                TRY(obj_next_doc(ctx, &r[s], &st[s], &en[s], &n, &lp[s]));\n"
            "            if (st[0] >= OBJ_T || st[1] >= OBJ_T) {\n"
            "                if (st[0] < OBJ_T || st[1] < OBJ_T)\n"
            "                    return SBPRT_ERR_INVALID; /* counted above: cannot happen */\n"
            "                break;\n"
            "            }\n"
            "            for (int s = 0; s < 2; s++) {\n"
            "                TRY(obj_read(ctx, &ref[s], k, &rf[s]));\n"
            "                if (args->row_logps) /* host memory: the caller's rewards */\n"
            "                    args->row_logps[(i + s * %lld) * OBJ_T + k] = lp[s];\n"
            "            }\n"
            "            const double z = beta * ((lp[0] - rf[0]) - (lp[1] - rf[1]));\n"
            "            /* -log sigmoid(z) and sigmoid(-z), stable on both sides */\n"
            "            const double e = exp(-fabs(z));\n"
            "            total += (z < 0 ? -z : 0.0) + log1p(e);\n"
            "            const double sig = z > 0 ? e / (1.0 + e) : 1.0 / (1.0 + e);\n"
            "            const double c = pairs > 0 ? beta * sig / pairs : 0.0;\n"
            "            for (int s = 0; s < 2; s++) {\n"
            "                TRY(obj_put(ctx, &w[s], 0.0f, st[s] - (w[s].at + w[s].n)));\n"
            "                TRY(obj_put(ctx, &w[s], (float)(s == 0 ? -c : c), en[s] - st[s]));\n"
            "            }\n"
            "        }\n"
            "        for (int s = 0; s < 2; s++) {\n"
            "            TRY(obj_put(ctx, &w[s], 0.0f, OBJ_T - (w[s].at + w[s].n)));\n"
            "            TRY(obj_flush(ctx, &w[s]));\n"
            "            if (args->row_logps)\n"
            "                for (int64_t j = k; j < OBJ_T; j++)\n"
            "                    args->row_logps[(i + s * %lld) * OBJ_T + j] = 0;\n"
            "        }\n"
            "    }\n"
            "    const float l = pairs > 0 ? (float)(total / pairs) : 0.0f;\n"
            "    return sbprt_memcpy(ctx, loss, &l, sizeof l, SBPRT_COPY_HOST_TO_DEVICE);\n"
            "}\n",
            p->beta, H, H, p->beta, H, H, H, H, H, H);
}

static void emit_dpo(const sbp_train_program *p, FILE *f)
{
    long long B = (long long)p->batch, T = (long long)p->seq_len;
    fputs(copy_helpers, f);
    if (p->per_document) {
        emit_doc_helpers(p, true, true, f);
        emit_dpo_doc(p, f);
        return;
    }
    fputs("\n/* *sum = Σ x[0 .. n) (backend memory), in double, in order. */\n"
          "static int obj_sum(sbprt_ctx *ctx, const float *x, int64_t n, double *sum)\n"
          "{\n"
          "    float buf[OBJ_BLOCK];\n"
          "    double s = 0;\n"
          "    for (int64_t i = 0; i < n; i += OBJ_BLOCK) {\n"
          "        const int64_t k = n - i < OBJ_BLOCK ? n - i : OBJ_BLOCK;\n"
          "        TRY(sbprt_memcpy(ctx, buf, x + i, sizeof(float) * (size_t)k,\n"
          "                         SBPRT_COPY_DEVICE_TO_HOST));\n"
          "        for (int64_t j = 0; j < k; j++)\n"
          "            s += buf[j];\n"
          "    }\n"
          "    *sum = s;\n"
          "    return SBPRT_OK;\n"
          "}\n"
          "\n/* x[0 .. n) = v (backend memory). */\n"
          "static int obj_fill(sbprt_ctx *ctx, float *x, int64_t n, float v)\n"
          "{\n"
          "    float buf[OBJ_BLOCK];\n"
          "    for (int64_t j = 0; j < OBJ_BLOCK && j < n; j++)\n"
          "        buf[j] = v;\n"
          "    for (int64_t i = 0; i < n; i += OBJ_BLOCK) {\n"
          "        const int64_t k = n - i < OBJ_BLOCK ? n - i : OBJ_BLOCK;\n"
          "        TRY(sbprt_memcpy(ctx, x + i, buf, sizeof(float) * (size_t)k,\n"
          "                         SBPRT_COPY_HOST_TO_DEVICE));\n"
          "    }\n"
          "    return SBPRT_OK;\n"
          "}\n",
          f);
    fprintf(f,
            "\n/* DPO (beta %.17g): the loss and each row's coefficient dL/dlogp, written to "
            "each of its\n"
            " * tokens, from the per-token logp. Pair i = (row i, row %lld + i); the mean is "
            "over the\n"
            " * caller's pairs (all micro-batches) when given, else this batch's %lld. */\n"
            "static int obj_dpo_coefficients(sbprt_ctx *ctx, const sbp_step_args *args, "
            "float *coef,\n"
            "                                float *loss, const float *token_logp)\n"
            "{\n"
            "    const double beta = %.17g;\n"
            "    const double pairs = args->denominator > 0 ? args->denominator : %lld.0;\n"
            "    double total = 0;\n"
            "    for (int64_t i = 0; i < %lld; i++) {\n"
            "        double lp[2];\n"
            "        float ref[2];\n"
            "        for (int s = 0; s < 2; s++) {\n"
            "            const int64_t row = i + s * %lld;\n"
            "            TRY(obj_sum(ctx, token_logp + row * %lld, %lld, &lp[s]));\n"
            "            TRY(sbprt_memcpy(ctx, &ref[s], args->ref_logps + row, sizeof(float),\n"
            "                             SBPRT_COPY_DEVICE_TO_HOST));\n"
            "            if (args->row_logps) /* host memory: the caller's rewards */\n"
            "                args->row_logps[row] = lp[s];\n"
            "        }\n"
            "        const double z = beta * ((lp[0] - ref[0]) - (lp[1] - ref[1]));\n"
            "        /* -log sigmoid(z) and sigmoid(-z), stable on both sides */\n"
            "        const double e = exp(-fabs(z));\n"
            "        total += (z < 0 ? -z : 0.0) + log1p(e);\n"
            "        const double sig = z > 0 ? e / (1.0 + e) : 1.0 / (1.0 + e);\n"
            "        const double c = pairs > 0 ? beta * sig / pairs : 0.0;\n"
            "        TRY(obj_fill(ctx, coef + i * %lld, %lld, (float)-c));\n"
            "        TRY(obj_fill(ctx, coef + (i + %lld) * %lld, %lld, (float)c));\n"
            "    }\n"
            "    const float l = pairs > 0 ? (float)(total / pairs) : 0.0f;\n"
            "    return sbprt_memcpy(ctx, loss, &l, sizeof l, SBPRT_COPY_HOST_TO_DEVICE);\n"
            "}\n",
            p->beta, B / 2, B / 2, p->beta, B / 2, B / 2, B / 2, T, T, T, T, B / 2, T, T);
}

/* sbp_step_logps's outputs per document: row_logps[b*T + k] document k's logp. */
static void emit_logp_outputs_doc(const sbp_train_program *p, FILE *f)
{
    long long B = (long long)p->batch, T = (long long)p->seq_len;
    fprintf(f,
            "\n/* sbp_step_logps's outputs (either may be NULL), from each token's label "
            "log-probability\n"
            " * token_logp [%lld, %lld] (0 where not scored): token_logps a copy of it, "
            "row_logps[b*OBJ_T + k]\n"
            " * the logp of document k of row b, summed in double and in order (as\n"
            " * obj_dpo_coefficients sums it), 0 beyond the row's documents. */\n"
            "static int obj_logp_outputs(sbprt_ctx *ctx, const sbp_step_args *args, float "
            "*row_logps,\n"
            "                            float *token_logps, const float *token_logp)\n"
            "{\n"
            "    if (token_logps)\n"
            "        TRY(sbprt_memcpy(ctx, token_logps, token_logp, sizeof(float) * %lld,\n"
            "                         SBPRT_COPY_DEVICE_TO_DEVICE));\n"
            "    if (!row_logps)\n"
            "        return SBPRT_OK;\n"
            "    obj_runs r;\n"
            "    obj_writer w = {.x = row_logps};\n"
            "    for (int64_t b = 0; b < %lld; b++) {\n"
            "        obj_runs_start(&r, args->doc_ids + b * OBJ_T, args->labels + b * OBJ_T,\n"
            "                       token_logp + b * OBJ_T);\n"
            "        int64_t k = 0;\n"
            "        for (;; k++) {\n"
            "            int64_t s, e, n;\n"
            "            double sum;\n"
            "            TRY(obj_next_doc(ctx, &r, &s, &e, &n, &sum));\n"
            "            if (s >= OBJ_T)\n"
            "                break;\n"
            "            TRY(obj_put(ctx, &w, (float)sum, 1));\n"
            "        }\n"
            "        TRY(obj_put(ctx, &w, 0.0f, OBJ_T - k));\n"
            "    }\n"
            "    return obj_flush(ctx, &w);\n"
            "}\n",
            B, T, B * T, B);
}

/* sbp_step_logps's outputs from the log-probability program's per-token buffer. */
static void emit_logp_outputs(const sbp_train_program *p, FILE *f)
{
    long long B = (long long)p->batch, T = (long long)p->seq_len;
    if (p->per_document) {
        emit_logp_outputs_doc(p, f);
        return;
    }
    fprintf(f,
            "\n/* sbp_step_logps's outputs (either may be NULL), from each token's label "
            "log-probability\n"
            " * token_logp [%lld, %lld] (0 where not scored): token_logps a copy of it, "
            "row_logps[b] its\n"
            " * row's sum, in double and in order (as obj_dpo_coefficients sums it). */\n"
            "static int obj_logp_outputs(sbprt_ctx *ctx, const sbp_step_args *args, float "
            "*row_logps,\n"
            "                            float *token_logps, const float *token_logp)\n"
            "{\n"
            "    (void)args; /* per row: the labels' sums need no document ids */\n"
            "    if (token_logps)\n"
            "        TRY(sbprt_memcpy(ctx, token_logps, token_logp, sizeof(float) * %lld,\n"
            "                         SBPRT_COPY_DEVICE_TO_DEVICE));\n"
            "    if (!row_logps)\n"
            "        return SBPRT_OK;\n"
            "    float buf[OBJ_BLOCK], rows[OBJ_BLOCK];\n"
            "    for (int64_t b0 = 0; b0 < %lld; b0 += OBJ_BLOCK) {\n"
            "        const int64_t nb = %lld - b0 < OBJ_BLOCK ? %lld - b0 : OBJ_BLOCK;\n"
            "        for (int64_t i = 0; i < nb; i++) {\n"
            "            double s = 0;\n"
            "            for (int64_t t0 = 0; t0 < %lld; t0 += OBJ_BLOCK) {\n"
            "                const int64_t k = %lld - t0 < OBJ_BLOCK ? %lld - t0 : OBJ_BLOCK;\n"
            "                TRY(sbprt_memcpy(ctx, buf, token_logp + (b0 + i) * %lld + t0,\n"
            "                                 sizeof(float) * (size_t)k, "
            "SBPRT_COPY_DEVICE_TO_HOST));\n"
            "                for (int64_t j = 0; j < k; j++)\n"
            "                    s += buf[j];\n"
            "            }\n"
            "            rows[i] = (float)s;\n"
            "        }\n"
            "        TRY(sbprt_memcpy(ctx, row_logps + b0, rows, sizeof(float) * (size_t)nb,\n"
            "                         SBPRT_COPY_HOST_TO_DEVICE));\n"
            "    }\n"
            "    return SBPRT_OK;\n"
            "}\n",
            B, T, B * T, B, B, B, T, T, T, T);
}

void sbp_emit_objective_helpers(const sbp_train_program *p, FILE *f)
{
    if (!is_pref(p))
        return;
    fprintf(f, "\n/* ---------------------------------------------------------------- %s: host "
               "steps */\n",
            sbp_objective_name(p->objective));
    if (p->objective == SBP_OBJECTIVE_GRPO)
        emit_grpo(p, f);
    else
        emit_dpo(p, f);
    if (p->logps)
        emit_logp_outputs(p, f);
}
