/*
 * docs.c — what a compiled step derives from the user's document ids when several documents
 * are packed into one row: each position's document start (the mask argument of the packed
 * attention, cpu/attention.c) and its position within the document (for RoPE or a position
 * embedding, so positions restart at 0 with every document).
 *
 * A document is one run of equal ids in a row.  Both kernels walk each row once, left to
 * right, carrying the start of the current run.  Ids are checked first, over the whole
 * tensor, so a decreasing id returns SBPRT_ERR_RANGE with nothing written (the API's rule).
 * Rows are independent and each element is written once, so nothing depends on threads.
 */
#include "cpu.h"

static int docs_check(const void *out, const int32_t *doc_ids, int b, int t)
{
    if (b < 0 || t < 0)
        return SBPRT_ERR_INVALID;
    if (b == 0 || t == 0) /* nothing to read (the pointers may be NULL) */
        return SBPRT_OK;
    if (!out || !doc_ids)
        return SBPRT_ERR_INVALID;
    for (int bi = 0; bi < b; bi++) {
        const int32_t *ids = doc_ids + (size_t)bi * t;
        for (int p = 1; p < t; p++)
            if (ids[p] < ids[p - 1])
                return SBPRT_ERR_RANGE;
    }
    return SBPRT_OK;
}

/* out[b, p] = doc_start[b, p] (relative = 0) or p - doc_start[b, p] (relative = 1). */
static int docs_run(sbprt_ctx *ctx, int32_t *out, const int32_t *doc_ids, int b, int t,
                    int relative)
{
    CPU_CHECK(ctx);
    const int st = docs_check(out, doc_ids, b, t);
    if (st || b == 0 || t == 0)
        return st;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((int64_t)b * t >= CPU_PARALLEL_MIN)
    for (int bi = 0; bi < b; bi++) {
        const int32_t *ids = doc_ids + (size_t)bi * t;
        int32_t *o = out + (size_t)bi * t;
        int start = 0;
        for (int p = 0; p < t; p++) {
            if (p > 0 && ids[p] != ids[p - 1])
                start = p;
            o[p] = relative ? p - start : start;
        }
    }
    return SBPRT_OK;
}

int sbprt_doc_starts(sbprt_ctx *ctx, int32_t *doc_start, const int32_t *doc_ids, int b, int t)
{
    return docs_run(ctx, doc_start, doc_ids, b, t, 0);
}

int sbprt_doc_positions(sbprt_ctx *ctx, int32_t *pos, const int32_t *doc_ids, int b, int t)
{
    return docs_run(ctx, pos, doc_ids, b, t, 1);
}
