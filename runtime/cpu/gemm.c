/*
 * gemm.c — matrix products (OpenBLAS cblas_sgemm) and the bias half of a linear layer.
 *
 * The API is row-major like the rest of sbpc; cblas takes CblasRowMajor directly.  The
 * batched form loops over cblas_sgemm calls rather than forking an OpenMP team around them:
 * OpenBLAS here is the pthreads build and parallelises each call itself, and calling it from
 * inside an OpenMP region would oversubscribe the cores.
 *
 * The bias gradient is a reduction over rows; it is partitioned over blocks of columns,
 * each summed over all rows in row order, so the result does not depend on the threads.
 */
#include <cblas.h>
#include <string.h>

#include "cpu.h"

/* Columns per task of a column-partitioned row reduction: a whole cache line or more per
 * row, and a local accumulator that stays in registers/L1. */
#define GEMM_COL_BLOCK 64

int sbprt_gemm(sbprt_ctx *ctx, float *c, const float *a, const float *b, int trans_a,
               int trans_b, int m, int n, int k, float alpha, float beta)
{
    /* Dense operands: the leading dimension is the stored row length (at least 1, as BLAS
     * requires even when k == 0). */
    int lda = trans_a ? m : k, ldb = trans_b ? k : n;
    lda = lda > 1 ? lda : 1;
    ldb = ldb > 1 ? ldb : 1;
    return sbprt_gemm_strided_batched(ctx, c, a, b, trans_a, trans_b, m, n, k, alpha, beta,
                                      lda, 0, ldb, 0, n, 0, 1);
}

int sbprt_gemm_strided_batched(sbprt_ctx *ctx, float *c, const float *a, const float *b,
                               int trans_a, int trans_b, int m, int n, int k, float alpha,
                               float beta, int lda, int64_t stride_a, int ldb,
                               int64_t stride_b, int ldc, int64_t stride_c, int batch)
{
    CPU_CHECK(ctx);
    CPU_CHECK(m >= 0 && n >= 0 && k >= 0 && batch >= 0);
    if (m == 0 || n == 0 || batch == 0)
        return SBPRT_OK;
    CPU_CHECK(c && (k == 0 || (a && b)));
    /* Row length of each operand as stored; the leading dimension must cover it. */
    int a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    CPU_CHECK(lda >= (a_cols > 1 ? a_cols : 1) && ldb >= (b_cols > 1 ? b_cols : 1) &&
              ldc >= n);
    CPU_CHECK(stride_a >= 0 && stride_b >= 0 && (batch == 1 || stride_c >= (int64_t)m * ldc));
    for (int i = 0; i < batch; i++)
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a + i * stride_a, lda,
                    b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
    return SBPRT_OK;
}

int sbprt_bias_add(sbprt_ctx *ctx, float *y, const float *bias, int n, int c)
{
    CPU_CHECK(ctx && n >= 0 && c >= 0);
    if (n == 0 || c == 0)
        return SBPRT_OK;
    CPU_CHECK(y && bias);
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * c >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        float *row = y + (size_t)r * c;
        for (int j = 0; j < c; j++)
            row[j] += bias[j];
    }
    return SBPRT_OK;
}

int sbprt_bias_backward(sbprt_ctx *ctx, float *dbias, const float *dy, int n, int c)
{
    CPU_CHECK(ctx && n >= 0 && c >= 0);
    if (n == 0 || c == 0)
        return SBPRT_OK;
    CPU_CHECK(dbias && dy);
    int nblocks = (c + GEMM_COL_BLOCK - 1) / GEMM_COL_BLOCK;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * c >= CPU_PARALLEL_MIN)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * GEMM_COL_BLOCK;
        int w = c - c0 < GEMM_COL_BLOCK ? c - c0 : GEMM_COL_BLOCK;
        float acc[GEMM_COL_BLOCK];
        memset(acc, 0, sizeof acc);
        for (int r = 0; r < n; r++) {
            const float *row = dy + (size_t)r * c + c0;
            for (int j = 0; j < w; j++)
                acc[j] += row[j];
        }
        for (int j = 0; j < w; j++)
            dbias[c0 + j] += acc[j];
    }
    return SBPRT_OK;
}
