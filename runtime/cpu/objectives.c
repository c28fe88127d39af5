/*
 * objectives.c — the LM-head kernels of the preference / RL objectives (DPO, GRPO): the
 * gradient of a weighted sum of label log-probabilities written as dlogits, and GRPO's
 * per-token loss with its derivative by the log-probability.
 *
 * sbprt_label_logprob_grad lives in loss.c, next to the fused cross-entropy whose row passes
 * it shares. sbprt_grpo_token_loss is elementwise over the rows: each row's weighted loss goes to scratch
 * (double) and the rows are added in order on one thread, so the result does not depend on the
 * thread count.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"

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
