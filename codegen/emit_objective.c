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

static void emit_grpo(const sbp_train_program *p, FILE *f)
{
    long long B = (long long)p->batch, T = (long long)p->seq_len;
    fputs(copy_helpers, f);
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

static void emit_dpo(const sbp_train_program *p, FILE *f)
{
    long long B = (long long)p->batch, T = (long long)p->seq_len;
    fputs(copy_helpers, f);
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

/* sbp_step_logps's outputs from the log-probability program's per-token buffer. */
static void emit_logp_outputs(const sbp_train_program *p, FILE *f)
{
    long long B = (long long)p->batch, T = (long long)p->seq_len;
    fprintf(f,
            "\n/* sbp_step_logps's outputs (either may be NULL), from each token's label "
            "log-probability\n"
            " * token_logp [%lld, %lld] (0 where not scored): token_logps a copy of it, "
            "row_logps[b] its\n"
            " * row's sum, in double and in order (as obj_dpo_coefficients sums it). */\n"
            "static int obj_logp_outputs(sbprt_ctx *ctx, float *row_logps, float *token_logps,\n"
            "                            const float *token_logp)\n"
            "{\n"
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
