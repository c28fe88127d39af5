/*
 * optim.c — parameter updates: SGD and AdamW, matching torch.optim's formulas.
 *
 * AdamW follows torch's single-tensor implementation operation by operation (decoupled
 * decay first, lerp for the first moment, bias corrections computed in double on the host
 * as Python floats are), so a step here and a step in PyTorch agree to fp32 rounding.
 */
#include <math.h>

#include "cpu.h"

int sbprt_sgd_update(sbprt_ctx *ctx, float *param, const float *grad, size_t n, float lr,
                     float weight_decay)
{
    CPU_CHECK(ctx && (n == 0 || (param && grad)));
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) if (n >= CPU_PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = weight_decay != 0.0f ? grad[i] + weight_decay * param[i] : grad[i];
        param[i] -= lr * g;
    }
    return SBPRT_OK;
}

int sbprt_adamw_update(sbprt_ctx *ctx, float *param, float *m, float *v, const float *grad,
                       size_t n, float lr, float beta1, float beta2, float eps,
                       float weight_decay, int step)
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
    const float decay = 1.0f - lr * weight_decay;
    const float w1 = 1.0f - beta1, w2 = 1.0f - beta2;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) if (n >= CPU_PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) {
        const float g = grad[i];
        const float p = param[i] * decay;
        const float mi = m[i] + w1 * (g - m[i]); /* torch: exp_avg.lerp_(grad, 1 - beta1) */
        const float vi = v[i] * beta2 + w2 * g * g;
        const float denom = sqrtf(vi) / bc2_sqrt + eps;
        m[i] = mi;
        v[i] = vi;
        param[i] = p - step_size * (mi / denom);
    }
    return SBPRT_OK;
}
