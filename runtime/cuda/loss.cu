/*
 * loss.cu — fused softmax cross-entropy with its gradient, and the per-row log-probability of
 * the label (forward and backward).
 *
 * One block per row, as the CPU twin (cpu/loss.c) does per row: the row max (block tree),
 * Σ exp(x - max) in double, lse = max + log(sum), then the gradient in a last pass.  Each
 * thread reads and writes only its own columns, and the label's logit is read by every thread
 * before the barriers of the sum reduction, so dlogits may overwrite logits in place.  Row
 * losses go to device scratch (double) and are added into loss_sum in a fixed order
 * (cu_sum_doubles_into).  A label that is neither SBPRT_IGNORE_INDEX nor in [0, v) skips its
 * row (loss 0, dlogits row untouched) and raises the index-error flag for sbprt_sync.  The
 * cross-entropy is a template over the logits' element type: its bf16 entry point reads bf16
 * logits, keeps the max, the sum, lse and the loss in fp32 / double, and rounds dlogits once.
 */
#include "cuda.h"

#define LOSS_THREADS 256

/* The row's max and log Σ exp(x - max) (every thread gets both). */
template <class T>
__device__ __forceinline__ float loss_logsumexp(const T *x, int v, float *fred, double *dred)
{
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < v; j += blockDim.x)
        mx = (float)x[j] > mx ? (float)x[j] : mx;
    mx = cu_block_max(mx, fred);
    double s = 0;
    for (int j = threadIdx.x; j < v; j += blockDim.x)
        s += expf(x[j] - mx);
    s = cu_block_sum(s, dred);
    return mx + (float)log(s);
}

template <class T>
__global__ void ce_kernel(double *row_loss, T *dlogits, const T *logits, const int32_t *labels,
                          int v, float scale, int *flag)
{
    CU_SHARED(float, fred, 32);
    CU_SHARED(double, dred, 32);
    const size_t r = blockIdx.x;
    const T *x = logits + r * v;
    T *dx = dlogits ? dlogits + r * v : NULL;
    const int y = labels[r];
    if (y == SBPRT_IGNORE_INDEX || y < 0 || y >= v) { /* block-uniform */
        if (y != SBPRT_IGNORE_INDEX) {
            if (threadIdx.x == 0)
                cu_flag_range(flag);
        } else if (dx) {
            for (int j = threadIdx.x; j < v; j += blockDim.x)
                dx[j] = 0;
        }
        if (threadIdx.x == 0)
            row_loss[r] = 0;
        return;
    }
    const float xy = x[y]; /* before any thread writes dx (barriers in loss_logsumexp) */
    const float lse = loss_logsumexp(x, v, fred, dred);
    if (threadIdx.x == 0)
        row_loss[r] = (double)lse - xy;
    if (dx)
        for (int j = threadIdx.x; j < v; j += blockDim.x) {
            /* as the CPU twin: the product rounded, then the label's scale subtracted */
            const float e = __fmul_rn(expf(x[j] - lse), scale);
            dx[j] = j == y ? e - scale : e;
        }
}

__global__ void logprob_forward_kernel(float *logp, float *lse, const float *logits,
                                       const int32_t *labels, int v, int *flag)
{
    CU_SHARED(float, fred, 32);
    CU_SHARED(double, dred, 32);
    const size_t r = blockIdx.x;
    const float *x = logits + r * v;
    const int y = labels[r];
    if (y != SBPRT_IGNORE_INDEX && (y < 0 || y >= v)) {
        if (threadIdx.x == 0)
            cu_flag_range(flag);
        return;
    }
    const float z = loss_logsumexp(x, v, fred, dred);
    if (threadIdx.x == 0) {
        logp[r] = y == SBPRT_IGNORE_INDEX ? 0.0f : x[y] - z;
        if (lse)
            lse[r] = z;
    }
}

/* dlogits[r, :] += dlogp[r] * (onehot(label) - softmax); one block per row. */
__global__ void logprob_backward_kernel(float *dlogits, const float *dlogp, const float *logits,
                                        const int32_t *labels, const float *lse, int v, int *flag)
{
    const size_t r = blockIdx.x;
    const int y = labels[r];
    if (y == SBPRT_IGNORE_INDEX)
        return;
    if (y < 0 || y >= v) {
        if (threadIdx.x == 0)
            cu_flag_range(flag);
        return;
    }
    const float *x = logits + r * v;
    float *dx = dlogits + r * v;
    const float g = dlogp[r], z = lse[r];
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float d = dx[j] - g * expf(x[j] - z);
        dx[j] = j == y ? d + g : d;
    }
}

template <class T>
static int cross_entropy(sbprt_ctx *ctx, float *loss_sum, T *dlogits, const T *logits,
                         const int32_t *labels, int n, int v, float scale)
{
    CU_CHECK(ctx && loss_sum && n >= 0 && v >= 0);
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(v > 0 && logits && labels);
    double *row_loss; /* [n] */
    CU_STATUS(cu_scratch(ctx, (size_t)n * sizeof(double), (void **)&row_loss));
    CU_LAUNCH(ctx, ce_kernel<T>, (unsigned)n, LOSS_THREADS, 0, row_loss, dlogits, logits, labels, v,
              scale, ctx->dev_flag);
    return cu_sum_doubles_into(ctx, loss_sum, row_loss, (size_t)n);
}

extern "C" int sbprt_cross_entropy_forward_backward(sbprt_ctx *ctx, float *loss_sum,
                                                    float *dlogits, const float *logits,
                                                    const int32_t *labels, int n, int v,
                                                    float scale)
{
    return cross_entropy(ctx, loss_sum, dlogits, logits, labels, n, v, scale);
}

extern "C" int sbprt_cross_entropy_forward_backward_bf16(sbprt_ctx *ctx, float *loss_sum,
                                                         sbprt_bf16 *dlogits,
                                                         const sbprt_bf16 *logits,
                                                         const int32_t *labels, int n, int v,
                                                         float scale)
{
    return cross_entropy(ctx, loss_sum, cu_bf(dlogits), cu_bf(logits), labels, n, v, scale);
}

extern "C" int sbprt_label_logprob_forward(sbprt_ctx *ctx, float *logp, float *lse,
                                           const float *logits, const int32_t *labels, int n,
                                           int v)
{
    CU_CHECK(ctx && n >= 0 && v >= 0);
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(v > 0 && logp && logits && labels);
    CU_LAUNCH(ctx, logprob_forward_kernel, (unsigned)n, LOSS_THREADS, 0, logp, lse, logits, labels,
              v, ctx->dev_flag);
    return SBPRT_OK;
}

extern "C" int sbprt_label_logprob_backward(sbprt_ctx *ctx, float *dlogits, const float *dlogp,
                                            const float *logits, const int32_t *labels,
                                            const float *lse, int n, int v)
{
    CU_CHECK(ctx && n >= 0 && v >= 0);
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(v > 0 && dlogits && dlogp && logits && labels && lse);
    CU_LAUNCH(ctx, logprob_backward_kernel, (unsigned)n, LOSS_THREADS, 0, dlogits, dlogp, logits,
              labels, lse, v, ctx->dev_flag);
    return SBPRT_OK;
}
