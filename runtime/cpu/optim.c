/*
 * optim.c — parameter updates: SGD and AdamW, matching torch.optim's formulas.
 *
 * AdamW follows torch's single-tensor implementation operation by operation (decoupled
 * decay first, lerp for the first moment, scalars formed in double as Python floats are and
 * rounded to fp32 once), so a step here and a step in PyTorch agree to fp32 rounding.
 */
#include <math.h>

#include "cpu.h"

int sbprt_sgd_update(sbprt_ctx *ctx, float *param, const float *grad, size_t n, double lr,
                     double weight_decay)
{
    CPU_CHECK(ctx && (n == 0 || (param && grad)));
    const float lrf = (float)lr, wdf = (float)weight_decay;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) if (n >= CPU_PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = wdf != 0.0f ? grad[i] + wdf * param[i] : grad[i];
        param[i] -= lrf * g;
    }
    return SBPRT_OK;
}

int sbprt_adamw_update(sbprt_ctx *ctx, float *param, float *m, float *v, const float *grad,
                       size_t n, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int step)
{
    CPU_CHECK(ctx && step >= 1);
    CPU_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && eps >= 0);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(param && m && v && grad);
    const double bc1 = 1.0 - pow(beta1, step);
    const double bc2 = 1.0 - pow(beta2, step);
    const float step_size = (float)(lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float decay = (float)(1.0 - lr * weight_decay);
    const float w1 = (float)(1.0 - beta1), w2 = (float)(1.0 - beta2);
    const float b2 = (float)beta2, epsf = (float)eps;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) if (n >= CPU_PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) {
        const float g = grad[i];
        const float p = param[i] * decay;
        /* torch: exp_avg.lerp_(grad, 1 - beta1), with lerp's two formulas */
        const float mi = w1 < 0.5f ? m[i] + w1 * (g - m[i]) : g - (g - m[i]) * (1.0f - w1);
        const float vi = v[i] * b2 + w2 * g * g;
        const float denom = sqrtf(vi) / bc2_sqrt + epsf;
        m[i] = mi;
        v[i] = vi;
        param[i] = p - step_size * (mi / denom);
    }
    return SBPRT_OK;
}

/* ---- multi-tensor forms: the per-tensor calls, span by span (sbprt.h) ---------------- */

int sbprt_sgd_update_multi(sbprt_ctx *ctx, float *params, const float *grads,
                           const sbprt_span *spans, int nspans, double lr, double weight_decay)
{
    CPU_CHECK(ctx && nspans >= 0 && (nspans == 0 || spans));
    for (int i = 0; i < nspans; i++) {
        if (spans[i].n == 0)
            continue;
        CPU_CHECK(params && grads);
        int st = sbprt_sgd_update(ctx, params + spans[i].param, grads + spans[i].grad,
                                  spans[i].n, lr, weight_decay);
        if (st)
            return st;
    }
    return SBPRT_OK;
}

int sbprt_adamw_update_multi(sbprt_ctx *ctx, float *params, float *m, float *v,
                             const float *grads, const sbprt_span *spans, int nspans, double lr,
                             double beta1, double beta2, double eps, double weight_decay,
                             int step)
{
    CPU_CHECK(ctx && nspans >= 0 && (nspans == 0 || spans) && step >= 1);
    for (int i = 0; i < nspans; i++) {
        if (spans[i].n == 0)
            continue;
        CPU_CHECK(params && m && v && grads);
        const sbprt_span *s = &spans[i];
        int st = sbprt_adamw_update(ctx, params + s->param, m + s->state, v + s->state,
                                    grads + s->grad, s->n, lr, beta1, beta2, eps, weight_decay,
                                    step);
        if (st)
            return st;
    }
    return SBPRT_OK;
}
