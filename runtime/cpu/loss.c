/*
 * loss.c — fused softmax cross-entropy (loss and gradient in one pass over the logits) and
 * the per-row log-probability of the label used by preference / RL objectives.
 *
 * Each row is independent: max, then Σ exp(x - max) accumulated in double (rows are as long
 * as the vocabulary), then the gradient written in a last pass.  The label's logit is read
 * before that pass, which lets dlogits overwrite logits in place: the LM head's chunk of
 * logits becomes its gradient without a second [n, v] buffer.  Per-row losses go to scratch
 * and are added in row order on one thread, so the loss does not depend on the threads.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"

static int loss_check_labels(const int32_t *labels, int n, int v)
{
    for (int r = 0; r < n; r++)
        if (labels[r] != SBPRT_IGNORE_INDEX && (labels[r] < 0 || labels[r] >= v))
            return SBPRT_ERR_RANGE;
    return SBPRT_OK;
}

/* log Σ_j exp(x_j) of one row, shifted by its max for range. */
static float loss_logsumexp(const float *x, int v)
{
    float mx = -INFINITY;
    for (int j = 0; j < v; j++)
        mx = x[j] > mx ? x[j] : mx;
    double s = 0;
    for (int j = 0; j < v; j++)
        s += expf(x[j] - mx);
    return mx + (float)log(s);
}

int sbprt_cross_entropy_forward_backward(sbprt_ctx *ctx, float *loss_sum, float *dlogits,
                                         const float *logits, const int32_t *labels, int n,
                                         int v, float scale)
{
    CPU_CHECK(ctx && loss_sum && n >= 0 && v >= 0);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(v > 0 && logits && labels);
    int st = loss_check_labels(labels, n, v);
    if (st)
        return st;
    double *row_loss; /* [n] */
    st = cpu_scratch(ctx, (size_t)n * sizeof(double), (void **)&row_loss);
    if (st)
        return st;

#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * v >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        const float *x = logits + (size_t)r * v;
        float *dx = dlogits ? dlogits + (size_t)r * v : NULL;
        const int y = labels[r];
        if (y == SBPRT_IGNORE_INDEX) {
            row_loss[r] = 0;
            if (dx)
                memset(dx, 0, (size_t)v * sizeof(float));
            continue;
        }
        const float lse = loss_logsumexp(x, v);
        row_loss[r] = (double)lse - x[y];
        if (dx) {
            for (int j = 0; j < v; j++)
                dx[j] = expf(x[j] - lse) * scale; /* x[j] is read before dx[j] is written */
            dx[y] -= scale;
        }
    }

    double total = 0;
    for (int r = 0; r < n; r++)
        total += row_loss[r];
    loss_sum[0] += (float)total;
    return SBPRT_OK;
}

int sbprt_label_logprob_forward(sbprt_ctx *ctx, float *logp, float *lse, const float *logits,
                                const int32_t *labels, int n, int v)
{
    CPU_CHECK(ctx && n >= 0 && v >= 0);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(v > 0 && logp && logits && labels);
    int st = loss_check_labels(labels, n, v);
    if (st)
        return st;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * v >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        const float *x = logits + (size_t)r * v;
        const float z = loss_logsumexp(x, v);
        logp[r] = labels[r] == SBPRT_IGNORE_INDEX ? 0.0f : x[labels[r]] - z;
        if (lse)
            lse[r] = z;
    }
    return SBPRT_OK;
}

int sbprt_label_logprob_backward(sbprt_ctx *ctx, float *dlogits, const float *dlogp,
                                 const float *logits, const int32_t *labels, const float *lse,
                                 int n, int v)
{
    CPU_CHECK(ctx && n >= 0 && v >= 0);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(v > 0 && dlogits && dlogp && logits && labels && lse);
    int st = loss_check_labels(labels, n, v);
    if (st)
        return st;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * v >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        const int y = labels[r];
        if (y == SBPRT_IGNORE_INDEX)
            continue;
        const float *x = logits + (size_t)r * v;
        float *dx = dlogits + (size_t)r * v;
        const float g = dlogp[r], z = lse[r];
        for (int j = 0; j < v; j++)
            dx[j] -= g * expf(x[j] - z);
        dx[y] += g;
    }
    return SBPRT_OK;
}
