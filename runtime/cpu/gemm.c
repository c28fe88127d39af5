/*
 * gemm.c — matrix products (OpenBLAS cblas_sgemm) and the bias half of a linear layer.
 *
 * The API is row-major like the rest of sbpc; cblas takes CblasRowMajor directly.
 *
 * Threads. OpenBLAS runs single-threaded (the context sets its thread count to 1) and the
 * products are split over the context's OpenMP team here: each thread computes one block of
 * C by one cblas_sgemm call. Debian's OpenBLAS is the pthreads build; left to parallelise
 * itself, its threads and the OpenMP team of the other kernels are two pools on the same
 * cores, and each pool's waiting threads spin while the other works. With many short kernels
 * (a StreamBP chunk loop) that cost a fifth of the step on two cores. One pool removes it.
 * The split is over the larger of C's two dimensions, so the operand every thread packs
 * again is the smaller one (a row split re-packs B, a column split re-packs A). Blocks start
 * at multiples of GEMM_SPLIT_ALIGN rows or columns. Each element of C is one dot product over
 * k whatever the block it falls in, and the blocks depend only on the sizes and the team
 * size, so a product is the same run to run.
 *
 * The bias gradient is a reduction over rows; it is partitioned over blocks of columns,
 * each summed over all rows in row order, so the result does not depend on the threads.
 */
#include <cblas.h>
#include <stdbool.h>
#include <string.h>

#include "cpu.h"

/* Columns per task of a column-partitioned row reduction: a whole cache line or more per
 * row, and a local accumulator that stays in registers/L1. */
#define GEMM_COL_BLOCK 64

/* A product below this many multiply-adds runs on one thread (forking costs more). */
#define GEMM_PARALLEL_MIN ((int64_t)1 << 18)
/* Block boundaries of a split product: a multiple of the kernels' register tile. */
#define GEMM_SPLIT_ALIGN 16

/* One block of C: rows [m0, m0 + mb) and columns [n0, n0 + nb). */
static void gemm_block(int trans_a, int trans_b, int m0, int mb, int n0, int nb, int k,
                       float alpha, const float *a, int lda, const float *b, int ldb, float beta,
                       float *c, int ldc)
{
    if (mb <= 0 || nb <= 0)
        return;
    /* row m0 of op(A): row m0 of A, or column m0 of A stored [k, m] */
    const float *ab = trans_a ? a + m0 : a + (size_t)m0 * lda;
    /* column n0 of op(B): column n0 of B, or row n0 of B stored [n, k] */
    const float *bb = trans_b ? b + (size_t)n0 * ldb : b + n0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, mb, nb, k, alpha, ab, lda, bb, ldb, beta,
                c + (size_t)m0 * ldc + n0, ldc);
}

/* [lo, hi) of part i of `total` split in `parts` blocks, boundaries aligned. */
static void split_range(int total, int parts, int i, int *lo, int *hi)
{
    int64_t per = ((int64_t)total + parts - 1) / parts;
    per = (per + GEMM_SPLIT_ALIGN - 1) / GEMM_SPLIT_ALIGN * GEMM_SPLIT_ALIGN;
    int64_t l = per * i, h = per * (i + 1);
    *lo = (int)(l < total ? l : total);
    *hi = (int)(h < total ? h : total);
}

/* One product C = alpha op(A) op(B) + beta C over the team. */
static void gemm_one(const sbprt_ctx *ctx, int trans_a, int trans_b, int m, int n, int k,
                     float alpha, const float *a, int lda, const float *b, int ldb, float beta,
                     float *c, int ldc)
{
    int nt = ctx->nthreads;
    int64_t work = (int64_t)m * n * (k > 0 ? k : 1);
    bool rows = m >= n;
    int span = rows ? m : n;
    int parts = span / GEMM_SPLIT_ALIGN < nt ? span / GEMM_SPLIT_ALIGN : nt;
    if (work < GEMM_PARALLEL_MIN || parts < 2) {
        gemm_block(trans_a, trans_b, 0, m, 0, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(parts)
    for (int i = 0; i < parts; i++) {
        int lo, hi;
        split_range(span, parts, i, &lo, &hi);
        if (rows)
            gemm_block(trans_a, trans_b, lo, hi - lo, 0, n, k, alpha, a, lda, b, ldb, beta, c,
                       ldc);
        else
            gemm_block(trans_a, trans_b, 0, m, lo, hi - lo, k, alpha, a, lda, b, ldb, beta, c,
                       ldc);
    }
}

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
    /* many small products: one per thread at a time; else each product split */
    if (batch >= 2 * ctx->nthreads && ctx->nthreads > 1) {
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads)
        for (int i = 0; i < batch; i++)
            gemm_block(trans_a, trans_b, 0, m, 0, n, k, alpha, a + i * stride_a, lda,
                       b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
        return SBPRT_OK;
    }
    for (int i = 0; i < batch; i++)
        gemm_one(ctx, trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b,
                 ldb, beta, c + i * stride_c, ldc);
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
