/*
 * gemm.cu — matrix products through cuBLAS, and the bias half of a linear layer.
 *
 * cuBLAS is column-major; a row-major [m, n] matrix with row stride ldc is, read column-major,
 * its [n, m] transpose with the same leading dimension.  So the row-major product
 * C = op(A) op(B) is computed as the column-major Cᵀ = op(B)ᵀ op(A)ᵀ: swap the operands and
 * m with n, keep every transpose flag and leading dimension.  One call covers the batched
 * form (cublasGemmStridedBatchedEx; a stride of 0 broadcasts an operand).  The compute type
 * is plain FP32 unless the context asked for TF32 (sbprt_ctx_set_tf32); the bf16 products
 * (sbprt_gemm_bf16, _f32: bf16 A and B, C bf16 or fp32) always accumulate in FP32.  k == 0
 * is handled here (C = beta C, and C = 0 when beta == 0 without reading C, as BLAS does)
 * rather than relying on how cuBLAS treats an empty inner dimension.
 *
 * The bias gradient is a column sum over rows, done in two deterministic stages: blocks of
 * GEMM_ROWS_PER_PART rows give one partial row each (each column summed in row order), then
 * cu_colsum_finish adds the partials in order.  The partition depends on n alone.
 */
#include "cuda.h"

#define GEMM_THREADS 256
#define GEMM_ROWS_PER_PART 64 /* rows per partial of a column sum (at least; see parts_for) */

/* C_i[r, j] = beta == 0 ? 0 : beta * C_i[r, j] for the k == 0 product. */
template <class T>
__global__ void gemm_scale_kernel(T *c, int m, int n, int ldc, long long stride_c, int batch,
                                  float beta)
{
    const size_t total = (size_t)batch * m * n;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t bi = e / ((size_t)m * n), rem = e % ((size_t)m * n);
        T *p = c + bi * stride_c + rem / n * ldc + rem % n;
        *p = beta == 0.0f ? 0.0f : beta * *p;
    }
}

extern "C" int sbprt_gemm(sbprt_ctx *ctx, float *c, const float *a, const float *b, int trans_a,
                          int trans_b, int m, int n, int k, float alpha, float beta)
{
    int lda = trans_a ? m : k, ldb = trans_b ? k : n;
    lda = lda > 1 ? lda : 1;
    ldb = ldb > 1 ? ldb : 1;
    return sbprt_gemm_strided_batched(ctx, c, a, b, trans_a, trans_b, m, n, k, alpha, beta, lda,
                                      0, ldb, 0, n, 0, 1);
}

/* The product for every precision: C = alpha op(A) op(B) + beta C with element types TC (of
 * C) and TA (of A and B), cuBLAS types ctype / atype. */
template <class TC, class TA>
static int gemm_any(sbprt_ctx *ctx, TC *c, const TA *a, const TA *b, cudaDataType ctype,
                    cudaDataType atype, int trans_a, int trans_b, int m, int n, int k,
                    float alpha, float beta, int lda, int64_t stride_a, int ldb,
                    int64_t stride_b, int ldc, int64_t stride_c, int batch)
{
    CU_CHECK(ctx);
    CU_CHECK(m >= 0 && n >= 0 && k >= 0 && batch >= 0);
    if (m == 0 || n == 0 || batch == 0)
        return SBPRT_OK;
    CU_CHECK(c && (k == 0 || (a && b)));
    const int a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    CU_CHECK(lda >= (a_cols > 1 ? a_cols : 1) && ldb >= (b_cols > 1 ? b_cols : 1) && ldc >= n);
    CU_CHECK(stride_a >= 0 && stride_b >= 0 && (batch == 1 || stride_c >= (int64_t)m * ldc));
    if (k == 0) {
        CU_LAUNCH(ctx, gemm_scale_kernel<TC>, cu_blocks((size_t)batch * m * n, GEMM_THREADS),
                  GEMM_THREADS, 0, c, m, n, ldc, (long long)stride_c, batch, beta);
        return SBPRT_OK;
    }
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    /* TF32 rounding applies to fp32 inputs only; bf16 inputs always accumulate in fp32 */
    const cublasComputeType_t compute = ctx->tf32 && atype == CUDA_R_32F
                                            ? CUBLAS_COMPUTE_32F_FAST_TF32
                                            : CUBLAS_COMPUTE_32F;
    CU_BLAS_TRY(ctx, cublasGemmStridedBatchedEx(ctx->blas, op_b, op_a, n, m, k, &alpha, b, atype,
                                                ldb, (long long)stride_b, a, atype, lda,
                                                (long long)stride_a, &beta, c, ctype, ldc,
                                                (long long)stride_c, batch, compute,
                                                CUBLAS_GEMM_DEFAULT));
    ctx->launches++;
    return SBPRT_OK;
}

extern "C" int sbprt_gemm_strided_batched(sbprt_ctx *ctx, float *c, const float *a,
                                          const float *b, int trans_a, int trans_b, int m, int n,
                                          int k, float alpha, float beta, int lda,
                                          int64_t stride_a, int ldb, int64_t stride_b, int ldc,
                                          int64_t stride_c, int batch)
{
    return gemm_any(ctx, c, a, b, CUDA_R_32F, CUDA_R_32F, trans_a, trans_b, m, n, k, alpha, beta,
                    lda, stride_a, ldb, stride_b, ldc, stride_c, batch);
}

/* Dense leading dimensions of sbprt_gemm's operands. */
static void gemm_dense_ld(int trans_a, int trans_b, int m, int n, int k, int *lda, int *ldb)
{
    *lda = trans_a ? m : k;
    *ldb = trans_b ? k : n;
    *lda = *lda > 1 ? *lda : 1;
    *ldb = *ldb > 1 ? *ldb : 1;
}

extern "C" int sbprt_gemm_bf16(sbprt_ctx *ctx, sbprt_bf16 *c, const sbprt_bf16 *a,
                               const sbprt_bf16 *b, int trans_a, int trans_b, int m, int n, int k,
                               float alpha, float beta)
{
    int lda, ldb;
    gemm_dense_ld(trans_a, trans_b, m, n, k, &lda, &ldb);
    return gemm_any(ctx, cu_bf(c), cu_bf(a), cu_bf(b), CUDA_R_16BF, CUDA_R_16BF, trans_a, trans_b,
                    m, n, k, alpha, beta, lda, 0, ldb, 0, n, 0, 1);
}

extern "C" int sbprt_gemm_bf16_f32(sbprt_ctx *ctx, float *c, const sbprt_bf16 *a,
                                   const sbprt_bf16 *b, int trans_a, int trans_b, int m, int n,
                                   int k, float alpha, float beta)
{
    int lda, ldb;
    gemm_dense_ld(trans_a, trans_b, m, n, k, &lda, &ldb);
    return gemm_any(ctx, c, cu_bf(a), cu_bf(b), CUDA_R_32F, CUDA_R_16BF, trans_a, trans_b, m, n, k,
                    alpha, beta, lda, 0, ldb, 0, n, 0, 1);
}

/* ---- bias ----------------------------------------------------------------------------- */

template <class T>
__global__ void bias_add_kernel(T *y, const float *bias, size_t total, int c)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x)
        y[e] += bias[e % c];
}

/* parts[q, j] = Σ dy[r, j] over rows r of part q (in row order); with one part the sum goes
 * straight into dbias.  grid: (column blocks, parts) */
template <class T>
__global__ void bias_part_kernel(float *parts, float *dbias, const T *dy, int n, int c,
                                 int rows_per_part)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c)
        return;
    const int r0 = blockIdx.y * rows_per_part;
    const int r1 = r0 + rows_per_part < n ? r0 + rows_per_part : n;
    float acc = 0;
    for (int r = r0; r < r1; r++)
        acc += dy[(size_t)r * c + j];
    if (parts)
        parts[(size_t)blockIdx.y * c + j] = acc;
    else
        dbias[j] += acc;
}

__global__ void colsum_finish_kernel(float *dst, const float *parts, int nparts, int c)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c)
        return;
    float acc = 0;
    for (int q = 0; q < nparts; q++)
        acc += parts[(size_t)q * c + j];
    dst[j] += acc;
}

extern "C" int cu_colsum_finish(sbprt_ctx *ctx, float *dst, const float *parts, int nparts, int c)
{
    CU_LAUNCH(ctx, colsum_finish_kernel, (c + GEMM_THREADS - 1) / GEMM_THREADS, GEMM_THREADS, 0,
              dst, parts, nparts, c);
    return SBPRT_OK;
}

template <class T> static int bias_add(sbprt_ctx *ctx, T *y, const float *bias, int n, int c)
{
    CU_CHECK(ctx && n >= 0 && c >= 0);
    if (n == 0 || c == 0)
        return SBPRT_OK;
    CU_CHECK(y && bias);
    const size_t total = (size_t)n * c;
    CU_LAUNCH(ctx, bias_add_kernel<T>, cu_blocks(total, GEMM_THREADS), GEMM_THREADS, 0, y, bias,
              total, c);
    return SBPRT_OK;
}

template <class T>
static int bias_backward(sbprt_ctx *ctx, float *dbias, const T *dy, int n, int c)
{
    CU_CHECK(ctx && n >= 0 && c >= 0);
    if (n == 0 || c == 0)
        return SBPRT_OK;
    CU_CHECK(dbias && dy);
    /* At least GEMM_ROWS_PER_PART rows per part, and few enough parts for grid.y. */
    int rows_per_part = GEMM_ROWS_PER_PART;
    if ((n + rows_per_part - 1) / rows_per_part > (int)CU_MAX_BLOCKS)
        rows_per_part = (int)((n + CU_MAX_BLOCKS - 1) / CU_MAX_BLOCKS);
    const int nparts = (n + rows_per_part - 1) / rows_per_part;
    float *parts = NULL;
    if (nparts > 1)
        CU_STATUS(cu_scratch(ctx, (size_t)nparts * c * sizeof(float), (void **)&parts));
    const dim3 grid((c + GEMM_THREADS - 1) / GEMM_THREADS, nparts);
    CU_LAUNCH(ctx, bias_part_kernel<T>, grid, GEMM_THREADS, 0, parts, dbias, dy, n, c,
              rows_per_part);
    if (nparts > 1)
        CU_STATUS(cu_colsum_finish(ctx, dbias, parts, nparts, c));
    return SBPRT_OK;
}

extern "C" int sbprt_bias_add(sbprt_ctx *ctx, float *y, const float *bias, int n, int c)
{
    return bias_add(ctx, y, bias, n, c);
}

extern "C" int sbprt_bias_backward(sbprt_ctx *ctx, float *dbias, const float *dy, int n, int c)
{
    return bias_backward(ctx, dbias, dy, n, c);
}

extern "C" int sbprt_bias_add_bf16(sbprt_ctx *ctx, sbprt_bf16 *y, const float *bias, int n, int c)
{
    return bias_add(ctx, cu_bf(y), bias, n, c);
}

extern "C" int sbprt_bias_backward_bf16(sbprt_ctx *ctx, float *dbias, const sbprt_bf16 *dy, int n,
                                        int c)
{
    return bias_backward(ctx, dbias, cu_bf(dy), n, c);
}
