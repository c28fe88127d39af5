/*
 * objectives.cu — the LM-head kernels of the preference / RL objectives (DPO, GRPO); CPU
 * twin: cpu/objectives.c.
 *
 * sbprt_label_logprob_grad: one block per row, as the fused cross-entropy (loss.cu): the
 * row's logsumexp (given, or a block max then Σ exp(x - max) in double), then each thread
 * writes its own columns, reading x[j] just before writing dx[j], so dlogits may overwrite the
 * logits in place.  sbprt_grpo_token_loss: one thread per row; each row's weighted loss goes
 * to device scratch (double) and is added into loss_sum in a fixed order
 * (cu_sum_doubles_into), as the CPU twin adds them in row order.  A label that is neither
 * SBPRT_IGNORE_INDEX nor in [0, v) leaves its dlogits row untouched and raises the
 * index-error flag for sbprt_sync.
 */
#include "cuda.h"

#define OBJ_THREADS 256

/* The row's log Σ exp(x) (every thread gets it); as loss.cu's. */
static __device__ __forceinline__ float obj_logsumexp(const float *x, int v, float *fred,
                                                      double *dred)
{
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < v; j += blockDim.x)
        mx = x[j] > mx ? x[j] : mx;
    mx = cu_block_max(mx, fred);
    double s = 0;
    for (int j = threadIdx.x; j < v; j += blockDim.x)
        s += expf(x[j] - mx);
    s = cu_block_sum(s, dred);
    return mx + (float)log(s);
}

__global__ void logprob_grad_kernel(float *dlogits, const float *dlogp, const float *logits,
                                    const int32_t *labels, const float *lse, int v, int *flag)
{
    CU_SHARED(float, fred, 32);
    CU_SHARED(double, dred, 32);
    const size_t r = blockIdx.x;
    const int y = labels[r];
    float *dx = dlogits + r * v;
    if (y == SBPRT_IGNORE_INDEX) {
        for (int j = threadIdx.x; j < v; j += blockDim.x)
            dx[j] = 0;
        return;
    }
    if (y < 0 || y >= v) { /* block-uniform */
        if (threadIdx.x == 0)
            cu_flag_range(flag);
        return;
    }
    const float *x = logits + r * v;
    const float g = dlogp[r];
    /* the barriers inside obj_logsumexp come before any thread writes dx */
    const float z = lse ? lse[r] : obj_logsumexp(x, v, fred, dred);
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        const float d = -__fmul_rn(g, expf(x[j] - z)); /* as the CPU twin: rounded, then + g */
        dx[j] = j == y ? d + g : d;
    }
}

__global__ void grpo_kernel(double *row_loss, float *dlogp, const float *logp,
                            const int32_t *labels, const float *old_logp, const float *ref_logp,
                            const float *advantages, const float *row_weight, int n, int r0,
                            int seq_len, float beta, float epsilon)
{
    const double lo = 1.0 - (double)epsilon, hi = 1.0 + (double)epsilon;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)n;
         i += (size_t)gridDim.x * blockDim.x) {
        if (labels[i] == SBPRT_IGNORE_INDEX) {
            row_loss[i] = 0;
            if (dlogp)
                dlogp[i] = 0;
            continue;
        }
        const size_t r = (size_t)r0 + i, s = r / (size_t)seq_len;
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
}

extern "C" int sbprt_label_logprob_grad(sbprt_ctx *ctx, float *dlogits, const float *dlogp,
                                        const float *logits, const int32_t *labels,
                                        const float *lse, int n, int v)
{
    CU_CHECK(ctx && n >= 0 && v >= 0);
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(v > 0 && dlogits && dlogp && logits && labels);
    CU_LAUNCH(ctx, logprob_grad_kernel, (unsigned)n, OBJ_THREADS, 0, dlogits, dlogp, logits,
              labels, lse, v, ctx->dev_flag);
    return SBPRT_OK;
}

extern "C" int sbprt_grpo_token_loss(sbprt_ctx *ctx, float *loss_sum, float *dlogp,
                                     const float *logp, const int32_t *labels,
                                     const float *old_logp, const float *ref_logp,
                                     const float *advantages, const float *row_weight, int n,
                                     int r0, int seq_len, float beta, float epsilon)
{
    CU_CHECK(ctx && loss_sum && n >= 0 && r0 >= 0 && seq_len > 0);
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(logp && labels && advantages && row_weight && (beta == 0 || ref_logp));
    double *row_loss; /* [n] */
    CU_STATUS(cu_scratch(ctx, (size_t)n * sizeof(double), (void **)&row_loss));
    CU_LAUNCH(ctx, grpo_kernel, cu_blocks((size_t)n, OBJ_THREADS), OBJ_THREADS, 0, row_loss,
              dlogp, logp, labels, old_logp, ref_logp, advantages, row_weight, n, r0, seq_len,
              beta, epsilon);
    return cu_sum_doubles_into(ctx, loss_sum, row_loss, (size_t)n);
}
