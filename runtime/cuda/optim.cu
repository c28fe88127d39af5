/*
 * optim.cu — parameter updates: SGD and AdamW, as the CPU twin (cpu/optim.c) and torch.optim.
 *
 * The scalar constants are formed on the host exactly as the CPU twin forms them (in double,
 * rounded to fp32 once); the per-element formulas are the CPU twin's, operation by operation,
 * written with the _rn intrinsics: nvcc would otherwise contract a * b + c into one fused
 * multiply-add, which the CPU twin (ISO C, no contraction) never does, and the update would no
 * longer be bitwise the host's (--offload optimizer runs AdamW on the host for a device step,
 * and bf16 weights turn a last-bit difference in a master weight into a different rounding).
 */
#include "cuda.h"

#define OPT_THREADS 256

__global__ void sgd_kernel(float *param, const float *grad, size_t n, float lr, float wd)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = wd != 0.0f ? __fadd_rn(grad[i], __fmul_rn(wd, param[i])) : grad[i];
        param[i] = __fsub_rn(param[i], __fmul_rn(lr, g));
    }
}

__global__ void adamw_kernel(float *param, float *m, float *v, const float *grad, size_t n,
                             float step_size, float bc2_sqrt, float decay, float w1, float w2,
                             float b2, float eps)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = grad[i];
        const float p = __fmul_rn(param[i], decay);
        /* torch: exp_avg.lerp_(grad, 1 - beta1), with lerp's two formulas */
        const float d = __fsub_rn(g, m[i]);
        const float mi = w1 < 0.5f ? __fadd_rn(m[i], __fmul_rn(w1, d))
                                   : __fsub_rn(g, __fmul_rn(d, __fsub_rn(1.0f, w1)));
        const float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(__fmul_rn(w2, g), g));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
        m[i] = mi;
        v[i] = vi;
        param[i] = __fsub_rn(p, __fmul_rn(step_size, __fdiv_rn(mi, denom)));
    }
}

extern "C" int sbprt_sgd_update(sbprt_ctx *ctx, float *param, const float *grad, size_t n,
                                double lr, double weight_decay)
{
    CU_CHECK(ctx && (n == 0 || (param && grad)));
    if (n == 0)
        return SBPRT_OK;
    CU_LAUNCH(ctx, sgd_kernel, cu_blocks(n, OPT_THREADS), OPT_THREADS, 0, param, grad, n,
              (float)lr, (float)weight_decay);
    return SBPRT_OK;
}

extern "C" int sbprt_adamw_update(sbprt_ctx *ctx, float *param, float *m, float *v,
                                  const float *grad, size_t n, double lr, double beta1,
                                  double beta2, double eps, double weight_decay, int step)
{
    CU_CHECK(ctx && step >= 1);
    CU_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && eps >= 0);
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(param && m && v && grad);
    const double bc1 = 1.0 - pow(beta1, step);
    const double bc2 = 1.0 - pow(beta2, step);
    const float step_size = (float)(lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float decay = (float)(1.0 - lr * weight_decay);
    const float w1 = (float)(1.0 - beta1), w2 = (float)(1.0 - beta2);
    CU_LAUNCH(ctx, adamw_kernel, cu_blocks(n, OPT_THREADS), OPT_THREADS, 0, param, m, v, grad, n,
              step_size, bc2_sqrt, decay, w1, w2, (float)beta2, (float)eps);
    return SBPRT_OK;
}
