/*
 * norm.c — LayerNorm and RMSNorm over the last axis, forward and backward.
 *
 * Row statistics are accumulated in double: it costs little next to the memory traffic and
 * keeps the saved mean/rstd accurate for long rows.  The backward runs in two passes with
 * different partitions: rows for dx (each row depends on its own statistics only), and
 * blocks of columns for dgamma/dbeta, which are sums over rows — each column block sums all
 * rows in order, so the parameter gradients are independent of the thread count without any
 * per-thread copies of [c]-sized buffers.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"

/* Columns per task of the parameter-gradient pass (see gemm.c's GEMM_COL_BLOCK). */
#define NORM_COL_BLOCK 64

int sbprt_layernorm_forward(sbprt_ctx *ctx, float *out, float *mean, float *rstd,
                            const float *x, const float *gamma, const float *beta, int n, int c,
                            float eps)
{
    CPU_CHECK(ctx && n >= 0 && c >= 0 && eps >= 0);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(c > 0 && out && x && gamma);
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * c >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * c;
        float *yr = out + (size_t)r * c;
        double s = 0;
        for (int j = 0; j < c; j++)
            s += xr[j];
        float mu = (float)(s / c);
        double ss = 0;
        for (int j = 0; j < c; j++) {
            float dlt = xr[j] - mu;
            ss += (double)dlt * dlt;
        }
        float rs = (float)(1.0 / sqrt(ss / c + eps));
        for (int j = 0; j < c; j++) {
            float y = (xr[j] - mu) * rs * gamma[j];
            yr[j] = beta ? y + beta[j] : y;
        }
        if (mean)
            mean[r] = mu;
        if (rstd)
            rstd[r] = rs;
    }
    return SBPRT_OK;
}

int sbprt_layernorm_backward(sbprt_ctx *ctx, float *dx, float *dgamma, float *dbeta,
                             const float *dout, const float *x, const float *gamma,
                             const float *mean, const float *rstd, int n, int c)
{
    CPU_CHECK(ctx && n >= 0 && c >= 0);
    if (n == 0 || c == 0)
        return SBPRT_OK;
    CPU_CHECK(dout && x && gamma && mean && rstd);
    int par = (size_t)n * c >= CPU_PARALLEL_MIN;
    if (dx) {
        /* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dout * gamma */
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) if (par)
        for (int r = 0; r < n; r++) {
            const float *xr = x + (size_t)r * c, *dyr = dout + (size_t)r * c;
            float mu = mean[r], rs = rstd[r];
            double sg = 0, sgx = 0;
            for (int j = 0; j < c; j++) {
                float g = dyr[j] * gamma[j];
                sg += g;
                sgx += (double)g * ((xr[j] - mu) * rs);
            }
            float mg = (float)(sg / c), mgx = (float)(sgx / c);
            float *dxr = dx + (size_t)r * c;
            for (int j = 0; j < c; j++) {
                float xhat = (xr[j] - mu) * rs;
                dxr[j] += rs * (dyr[j] * gamma[j] - mg - xhat * mgx);
            }
        }
    }
    if (dgamma || dbeta) {
        int nblocks = (c + NORM_COL_BLOCK - 1) / NORM_COL_BLOCK;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) if (par)
        for (int blk = 0; blk < nblocks; blk++) {
            int c0 = blk * NORM_COL_BLOCK;
            int w = c - c0 < NORM_COL_BLOCK ? c - c0 : NORM_COL_BLOCK;
            float ag[NORM_COL_BLOCK], ab[NORM_COL_BLOCK];
            memset(ag, 0, sizeof ag);
            memset(ab, 0, sizeof ab);
            for (int r = 0; r < n; r++) {
                const float *xr = x + (size_t)r * c + c0, *dyr = dout + (size_t)r * c + c0;
                float mu = mean[r], rs = rstd[r];
                for (int j = 0; j < w; j++) {
                    ag[j] += dyr[j] * ((xr[j] - mu) * rs);
                    ab[j] += dyr[j];
                }
            }
            for (int j = 0; j < w; j++) {
                if (dgamma)
                    dgamma[c0 + j] += ag[j];
                if (dbeta)
                    dbeta[c0 + j] += ab[j];
            }
        }
    }
    return SBPRT_OK;
}

int sbprt_rmsnorm_forward(sbprt_ctx *ctx, float *out, float *rstd, const float *x,
                          const float *gamma, int n, int c, float eps)
{
    CPU_CHECK(ctx && n >= 0 && c >= 0 && eps >= 0);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(c > 0 && out && x && gamma);
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * c >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * c;
        float *yr = out + (size_t)r * c;
        double ss = 0;
        for (int j = 0; j < c; j++)
            ss += (double)xr[j] * xr[j];
        float rs = (float)(1.0 / sqrt(ss / c + eps));
        for (int j = 0; j < c; j++)
            yr[j] = xr[j] * rs * gamma[j];
        if (rstd)
            rstd[r] = rs;
    }
    return SBPRT_OK;
}

int sbprt_rmsnorm_backward(sbprt_ctx *ctx, float *dx, float *dgamma, const float *dout,
                           const float *x, const float *gamma, const float *rstd, int n, int c)
{
    CPU_CHECK(ctx && n >= 0 && c >= 0);
    if (n == 0 || c == 0)
        return SBPRT_OK;
    CPU_CHECK(dout && x && gamma && rstd);
    int par = (size_t)n * c >= CPU_PARALLEL_MIN;
    if (dx) {
        /* dx = rstd * g - rstd³ * x * mean(g * x),  g = dout * gamma */
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) if (par)
        for (int r = 0; r < n; r++) {
            const float *xr = x + (size_t)r * c, *dyr = dout + (size_t)r * c;
            float rs = rstd[r];
            double sgx = 0;
            for (int j = 0; j < c; j++)
                sgx += (double)(dyr[j] * gamma[j]) * xr[j];
            float k = rs * rs * rs * (float)(sgx / c);
            float *dxr = dx + (size_t)r * c;
            for (int j = 0; j < c; j++)
                dxr[j] += rs * dyr[j] * gamma[j] - k * xr[j];
        }
    }
    if (dgamma) {
        int nblocks = (c + NORM_COL_BLOCK - 1) / NORM_COL_BLOCK;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) if (par)
        for (int blk = 0; blk < nblocks; blk++) {
            int c0 = blk * NORM_COL_BLOCK;
            int w = c - c0 < NORM_COL_BLOCK ? c - c0 : NORM_COL_BLOCK;
            float ag[NORM_COL_BLOCK];
            memset(ag, 0, sizeof ag);
            for (int r = 0; r < n; r++) {
                const float *xr = x + (size_t)r * c + c0, *dyr = dout + (size_t)r * c + c0;
                float rs = rstd[r];
                for (int j = 0; j < w; j++)
                    ag[j] += dyr[j] * (xr[j] * rs);
            }
            for (int j = 0; j < w; j++)
                dgamma[c0 + j] += ag[j];
        }
    }
    return SBPRT_OK;
}
