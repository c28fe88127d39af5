/*
 * embedding.c — token (or position) embedding lookup and its scatter-add backward.
 *
 * Ids are validated before anything is written, so an out-of-range id leaves the outputs
 * untouched.  The backward is a scatter-add where several rows may hit the same table row;
 * instead of atomics, work is partitioned over blocks of columns and every task walks all
 * rows in order, so each table element receives its contributions in row order whatever
 * the thread count.
 */
#include <string.h>

#include "cpu.h"

/* Columns per task of the backward: one or more cache lines per row touched. */
#define EMB_COL_BLOCK 64

static int emb_check_ids(const int32_t *ids, int n, int v)
{
    for (int r = 0; r < n; r++)
        if (ids[r] < 0 || ids[r] >= v)
            return SBPRT_ERR_RANGE;
    return SBPRT_OK;
}

int sbprt_embedding_forward(sbprt_ctx *ctx, float *out, const float *table, const int32_t *ids,
                            int n, int v, int c)
{
    CPU_CHECK(ctx && n >= 0 && v >= 0 && c >= 0);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(out && table && ids);
    int st = emb_check_ids(ids, n, v);
    if (st)
        return st;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * c >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++)
        memcpy(out + (size_t)r * c, table + (size_t)ids[r] * c, (size_t)c * sizeof(float));
    return SBPRT_OK;
}

int sbprt_embedding_backward(sbprt_ctx *ctx, float *dtable, const float *dout,
                             const int32_t *ids, int n, int v, int c)
{
    CPU_CHECK(ctx && n >= 0 && v >= 0 && c >= 0);
    if (n == 0 || c == 0)
        return SBPRT_OK;
    CPU_CHECK(dtable && dout && ids);
    int st = emb_check_ids(ids, n, v);
    if (st)
        return st;
    int nblocks = (c + EMB_COL_BLOCK - 1) / EMB_COL_BLOCK;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * c >= CPU_PARALLEL_MIN)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * EMB_COL_BLOCK;
        int w = c - c0 < EMB_COL_BLOCK ? c - c0 : EMB_COL_BLOCK;
        for (int r = 0; r < n; r++) {
            float *dst = dtable + (size_t)ids[r] * c + c0;
            const float *src = dout + (size_t)r * c + c0;
            for (int j = 0; j < w; j++)
                dst[j] += src[j];
        }
    }
    return SBPRT_OK;
}
