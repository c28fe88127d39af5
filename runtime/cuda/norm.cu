/*
 * norm.cu — LayerNorm and RMSNorm over the last axis, forward and backward.
 *
 * Row passes (forward, and dx in the backward) give each row to one block of NORM_THREADS
 * threads; the row statistics are summed in double, as in the CPU twin (cpu/norm.c), with a
 * fixed block tree, and every element is read and written by the same thread, which is what
 * makes out = x in place safe.  The parameter gradients are column sums over rows, done in two
 * stages like the bias gradient (gemm.cu): parts of NORM_ROWS_PER_PART rows, each column summed
 * in row order, then the parts added in order — no atomics, and the partition depends on n
 * alone, so results are identical run to run.  The kernels are templates over the activation
 * element type (float, or cu_bf16 for the _bf16 entry points: fp32 arithmetic, parameter
 * gradients summed in fp32).
 */
#include "cuda.h"

#define NORM_THREADS 256
#define NORM_ROWS_PER_PART 64

/* mode 0: LayerNorm; mode 1: RMSNorm (mean and beta unused). */
template <class T>
__global__ void norm_forward_kernel(int mode, T *out, float *mean, float *rstd, const T *x,
                                    const float *gamma, const float *beta, int c, float eps)
{
    CU_SHARED(double, red, 32);
    const size_t r = blockIdx.x;
    const T *xr = x + r * c;
    T *yr = out + r * c;
    float mu = 0;
    double ss = 0;
    if (mode == 0) {
        double s = 0;
        for (int j = threadIdx.x; j < c; j += blockDim.x)
            s += xr[j];
        s = cu_block_sum(s, red);
        mu = (float)(s / c);
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            float dlt = xr[j] - mu;
            ss += (double)dlt * dlt;
        }
    } else {
        for (int j = threadIdx.x; j < c; j += blockDim.x)
            ss += (double)xr[j] * xr[j];
    }
    ss = cu_block_sum(ss, red);
    const float rs = (float)(1.0 / sqrt(ss / c + eps));
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        if (mode == 0) {
            float y = (xr[j] - mu) * rs * gamma[j];
            yr[j] = beta ? y + beta[j] : y;
        } else {
            yr[j] = xr[j] * rs * gamma[j];
        }
    }
    if (threadIdx.x == 0) {
        if (mean)
            mean[r] = mu;
        if (rstd)
            rstd[r] = rs;
    }
}

/* dx += ∂L/∂x for one row per block.
 *   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dout * gamma
 *   RMSNorm:   dx = rstd * g - rstd³ * x * mean(g * x) */
template <class T>
__global__ void norm_dx_kernel(int mode, T *dx, const T *dout, const T *x, const float *gamma,
                               const float *mean, const float *rstd, int c)
{
    CU_SHARED(double, red, 32);
    const size_t r = blockIdx.x;
    const T *xr = x + r * c, *dyr = dout + r * c;
    T *dxr = dx + r * c;
    const float rs = rstd[r];
    if (mode == 0) {
        const float mu = mean[r];
        double sg = 0, sgx = 0;
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            float g = dyr[j] * gamma[j];
            sg += g;
            sgx += (double)g * ((xr[j] - mu) * rs);
        }
        sg = cu_block_sum(sg, red);
        sgx = cu_block_sum(sgx, red);
        const float mg = (float)(sg / c), mgx = (float)(sgx / c);
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            float xhat = (xr[j] - mu) * rs;
            dxr[j] += rs * (dyr[j] * gamma[j] - mg - xhat * mgx);
        }
    } else {
        double sgx = 0;
        for (int j = threadIdx.x; j < c; j += blockDim.x)
            sgx += (double)(dyr[j] * gamma[j]) * xr[j];
        sgx = cu_block_sum(sgx, red);
        const float k = rs * rs * rs * (float)(sgx / c);
        for (int j = threadIdx.x; j < c; j += blockDim.x)
            dxr[j] += rs * dyr[j] * gamma[j] - k * xr[j];
    }
}

/* Column sums over the rows of one part: gparts[q, j] = Σ dout * xhat, bparts[q, j] = Σ dout
 * (LayerNorm; RMSNorm has xhat = x * rstd and no bias).  With a single part the sums go
 * straight into dgamma / dbeta.  grid: (column blocks, parts) */
template <class T>
__global__ void norm_param_kernel(int mode, float *gparts, float *bparts, float *dgamma,
                                  float *dbeta, const T *dout, const T *x,
                                  const float *mean, const float *rstd, int n, int c,
                                  int rows_per_part, int direct)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c)
        return;
    const int r0 = blockIdx.y * rows_per_part;
    const int r1 = r0 + rows_per_part < n ? r0 + rows_per_part : n;
    float ag = 0, ab = 0;
    for (int r = r0; r < r1; r++) {
        const float dy = dout[(size_t)r * c + j], xv = x[(size_t)r * c + j];
        if (mode == 0) {
            ag += dy * ((xv - mean[r]) * rstd[r]);
            ab += dy;
        } else {
            ag += dy * (xv * rstd[r]);
        }
    }
    if (direct) {
        if (dgamma)
            dgamma[j] += ag;
        if (dbeta)
            dbeta[j] += ab;
    } else {
        const size_t off = (size_t)blockIdx.y * c + j;
        if (dgamma)
            gparts[off] = ag;
        if (dbeta)
            bparts[off] = ab;
    }
}

template <class T>
static int norm_backward(sbprt_ctx *ctx, int mode, T *dx, float *dgamma, float *dbeta,
                         const T *dout, const T *x, const float *gamma,
                         const float *mean, const float *rstd, int n, int c)
{
    if (dx)
        CU_LAUNCH(ctx, norm_dx_kernel<T>, (unsigned)n, NORM_THREADS, 0, mode, dx, dout, x, gamma,
                  mean, rstd, c);
    if (!dgamma && !dbeta)
        return SBPRT_OK;
    int rows_per_part = NORM_ROWS_PER_PART;
    if ((n + rows_per_part - 1) / rows_per_part > (int)CU_MAX_BLOCKS)
        rows_per_part = (int)((n + CU_MAX_BLOCKS - 1) / CU_MAX_BLOCKS);
    const int nparts = (n + rows_per_part - 1) / rows_per_part;
    float *gparts = NULL, *bparts = NULL;
    if (nparts > 1) {
        float *parts;
        CU_STATUS(cu_scratch(ctx, (size_t)2 * nparts * c * sizeof(float), (void **)&parts));
        gparts = parts;
        bparts = parts + (size_t)nparts * c;
    }
    const dim3 grid((c + NORM_THREADS - 1) / NORM_THREADS, nparts);
    CU_LAUNCH(ctx, norm_param_kernel<T>, grid, NORM_THREADS, 0, mode, gparts, bparts, dgamma, dbeta,
              dout, x, mean, rstd, n, c, rows_per_part, nparts == 1);
    if (nparts > 1) {
        if (dgamma)
            CU_STATUS(cu_colsum_finish(ctx, dgamma, gparts, nparts, c));
        if (dbeta)
            CU_STATUS(cu_colsum_finish(ctx, dbeta, bparts, nparts, c));
    }
    return SBPRT_OK;
}

template <class T>
static int layernorm_forward(sbprt_ctx *ctx, T *out, float *mean, float *rstd, const T *x,
                             const float *gamma, const float *beta, int n, int c, float eps)
{
    CU_CHECK(ctx && n >= 0 && c >= 0 && eps >= 0);
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(c > 0 && out && x && gamma);
    CU_LAUNCH(ctx, norm_forward_kernel<T>, (unsigned)n, NORM_THREADS, 0, 0, out, mean, rstd, x,
              gamma, beta, c, eps);
    return SBPRT_OK;
}

template <class T>
static int layernorm_backward(sbprt_ctx *ctx, T *dx, float *dgamma, float *dbeta, const T *dout,
                              const T *x, const float *gamma, const float *mean,
                              const float *rstd, int n, int c)
{
    CU_CHECK(ctx && n >= 0 && c >= 0);
    if (n == 0 || c == 0)
        return SBPRT_OK;
    CU_CHECK(dout && x && gamma && mean && rstd);
    return norm_backward(ctx, 0, dx, dgamma, dbeta, dout, x, gamma, mean, rstd, n, c);
}

template <class T>
static int rmsnorm_forward(sbprt_ctx *ctx, T *out, float *rstd, const T *x, const float *gamma,
                           int n, int c, float eps)
{
    CU_CHECK(ctx && n >= 0 && c >= 0 && eps >= 0);
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(c > 0 && out && x && gamma);
    CU_LAUNCH(ctx, norm_forward_kernel<T>, (unsigned)n, NORM_THREADS, 0, 1, out, (float *)NULL,
              rstd, x, gamma, (const float *)NULL, c, eps);
    return SBPRT_OK;
}

template <class T>
static int rmsnorm_backward(sbprt_ctx *ctx, T *dx, float *dgamma, const T *dout, const T *x,
                            const float *gamma, const float *rstd, int n, int c)
{
    CU_CHECK(ctx && n >= 0 && c >= 0);
    if (n == 0 || c == 0)
        return SBPRT_OK;
    CU_CHECK(dout && x && gamma && rstd);
    return norm_backward(ctx, 1, dx, dgamma, (float *)NULL, dout, x, gamma, (const float *)NULL,
                         rstd, n, c);
}

extern "C" int sbprt_layernorm_forward(sbprt_ctx *ctx, float *out, float *mean, float *rstd,
                                       const float *x, const float *gamma, const float *beta,
                                       int n, int c, float eps)
{
    return layernorm_forward(ctx, out, mean, rstd, x, gamma, beta, n, c, eps);
}

extern "C" int sbprt_layernorm_backward(sbprt_ctx *ctx, float *dx, float *dgamma, float *dbeta,
                                        const float *dout, const float *x, const float *gamma,
                                        const float *mean, const float *rstd, int n, int c)
{
    return layernorm_backward(ctx, dx, dgamma, dbeta, dout, x, gamma, mean, rstd, n, c);
}

extern "C" int sbprt_rmsnorm_forward(sbprt_ctx *ctx, float *out, float *rstd, const float *x,
                                     const float *gamma, int n, int c, float eps)
{
    return rmsnorm_forward(ctx, out, rstd, x, gamma, n, c, eps);
}

extern "C" int sbprt_rmsnorm_backward(sbprt_ctx *ctx, float *dx, float *dgamma,
                                      const float *dout, const float *x, const float *gamma,
                                      const float *rstd, int n, int c)
{
    return rmsnorm_backward(ctx, dx, dgamma, dout, x, gamma, rstd, n, c);
}

/* bf16: activations (x, out, dx, dout) bf16; gamma, beta, statistics and their gradients fp32 */
extern "C" int sbprt_layernorm_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *mean,
                                            float *rstd, const sbprt_bf16 *x, const float *gamma,
                                            const float *beta, int n, int c, float eps)
{
    return layernorm_forward(ctx, cu_bf(out), mean, rstd, cu_bf(x), gamma, beta, n, c, eps);
}

extern "C" int sbprt_layernorm_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, float *dgamma,
                                             float *dbeta, const sbprt_bf16 *dout,
                                             const sbprt_bf16 *x, const float *gamma,
                                             const float *mean, const float *rstd, int n, int c)
{
    return layernorm_backward(ctx, cu_bf(dx), dgamma, dbeta, cu_bf(dout), cu_bf(x), gamma, mean,
                              rstd, n, c);
}

extern "C" int sbprt_rmsnorm_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *rstd,
                                          const sbprt_bf16 *x, const float *gamma, int n, int c,
                                          float eps)
{
    return rmsnorm_forward(ctx, cu_bf(out), rstd, cu_bf(x), gamma, n, c, eps);
}

extern "C" int sbprt_rmsnorm_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, float *dgamma,
                                           const sbprt_bf16 *dout, const sbprt_bf16 *x,
                                           const float *gamma, const float *rstd, int n, int c)
{
    return rmsnorm_backward(ctx, cu_bf(dx), dgamma, cu_bf(dout), cu_bf(x), gamma, rstd, n, c);
}
