/*
 * objectives.c — the LM-head kernels of the preference / RL objectives (DPO, GRPO): the
 * gradient of a weighted sum of label log-probabilities written as dlogits, and GRPO's
 * per-token loss with its derivative by the log-probability.
 *
 * sbprt_label_logprob_grad follows the fused cross-entropy (loss.c) row by row: the row's
 * logsumexp (given, or max then Σ exp(x - max) in double), then the gradient written in one
 * pass that reads x[j] before writing dx[j], so dlogits may overwrite the logits in place.
 * sbprt_grpo_token_loss is elementwise over the rows: each row's weighted loss goes to scratch
 * (double) and the rows are added in order on one thread, so the result does not depend on the
 * thread count.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"

/* log Σ_j exp(x_j) of one row, shifted by its max for range (as loss.c). */
static float obj_logsumexp(const float *x, int v)
{
    float mx = -INFINITY;
    for (int j = 0; j < v; j++)
        mx = x[j] > mx ? x[j] : mx;
    double s = 0;
    for (int j = 0; j < v; j++)
        s += expf(x[j] - mx);
    return mx + (float)log(s);
}

int sbprt_label_logprob_grad(sbprt_ctx *ctx, float *dlogits, const float *dlogp,
                             const float *logits, const int32_t *labels, const float *lse,
                             int n, int v)
{
    CPU_CHECK(ctx && n >= 0 && v >= 0);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(v > 0 && dlogits && dlogp && logits && labels);
    for (int r = 0; r < n; r++)
        if (labels[r] != SBPRT_IGNORE_INDEX && (labels[r] < 0 || labels[r] >= v))
            return SBPRT_ERR_RANGE;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * v >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        const float *x = logits + (size_t)r * v;
        float *dx = dlogits + (size_t)r * v;
        const int y = labels[r];
        if (y == SBPRT_IGNORE_INDEX) {
            memset(dx, 0, (size_t)v * sizeof(float));
            continue;
        }
        const float g = dlogp[r], z = lse ? lse[r] : obj_logsumexp(x, v);
        for (int j = 0; j < v; j++)
            dx[j] = -(g * expf(x[j] - z)); /* x[j] is read before dx[j] is written */
        dx[y] += g;
    }
    return SBPRT_OK;
}

int sbprt_grpo_token_loss(sbprt_ctx *ctx, float *loss_sum, float *dlogp, const float *logp,
                          const int32_t *labels, const float *old_logp, const float *ref_logp,
                          const float *advantages, const float *row_weight, int n, int r0,
                          int seq_len, float beta, float epsilon)
{
    CPU_CHECK(ctx && loss_sum && n >= 0 && r0 >= 0 && seq_len > 0);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(logp && labels && advantages && row_weight && (beta == 0 || ref_logp));
    double *row_loss; /* [n] */
    int st = cpu_scratch(ctx, (size_t)n * sizeof(double), (void **)&row_loss);
    if (st)
        return st;
    const double lo = 1.0 - (double)epsilon, hi = 1.0 + (double)epsilon;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) if (n >= CPU_PARALLEL_MIN)
    for (int i = 0; i < n; i++) {
        if (labels[i] == SBPRT_IGNORE_INDEX) {
            row_loss[i] = 0;
            if (dlogp)
                dlogp[i] = 0;
            continue;
        }
        const size_t r = (size_t)r0 + (size_t)i, s = r / (size_t)seq_len;
        const double lp = logp[i], A = advantages[s], w = row_weight[s];
        const double ratio = old_logp ? exp(lp - (double)old_logp[r]) : 1.0;
        const double clipped = ratio < lo ? lo : ratio > hi ? hi : ratio;
        const double un = ratio * A, cl = clipped * A;
        double l = -(un <= cl ? un : cl);
        double g = un <= cl || (ratio >= lo && ratio <= hi) ? -A * ratio : 0.0;
        if (beta != 0) {
            const double d = (double)ref_logp[r] - lp, e = exp(d);
            l += (double)beta * (e - d - 1.0);
            g -= (double)beta * (e - 1.0);
        }
        row_loss[i] = w * l;
        if (dlogp)
            dlogp[i] = (float)(w * g);
    }
    double total = 0;
    for (int i = 0; i < n; i++)
        total += row_loss[i];
    loss_sum[0] += (float)total;
    return SBPRT_OK;
}
