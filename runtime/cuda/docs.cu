/*
 * docs.cu — each position's document start and its position within the document, from the
 * user's document ids (the CPU twin is cpu/docs.c, which walks each row once).
 *
 * Here every position is one thread and needs no neighbour's result: since a row's ids are
 * non-decreasing, the start of p's document is the first position of the row holding the
 * same id as p, a lower-bound bisection over [0, p].  Results equal the twin's exactly.  Ids
 * live in device memory, so a thread that sees its id below its left neighbour's raises the
 * context's index-error flag (sbprt_sync then returns SBPRT_ERR_RANGE); the bisection still
 * lands in [0, p], so the outputs stay in range, if meaningless.
 */
#include "cuda.h"

#define DOCS_THREADS 256

/* out[b, p] = doc_start (relative = 0) or p - doc_start (relative = 1), for n = b * t. */
__global__ void docs_kernel(int32_t *out, const int32_t *doc_ids, int t, size_t n, int relative,
                            int *flag)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const int p = (int)(e % t);
        const int32_t *ids = doc_ids + (e - p);
        const int32_t id = ids[p];
        if (p > 0 && ids[p - 1] > id)
            cu_flag_range(flag);
        int a = 0, z = p; /* the first position in [0, p] whose id is not below id */
        while (a < z) {
            const int mid = a + (z - a) / 2;
            if (ids[mid] < id)
                a = mid + 1;
            else
                z = mid;
        }
        out[e] = relative ? p - a : a;
    }
}

static int docs_run(sbprt_ctx *ctx, int32_t *out, const int32_t *doc_ids, int b, int t,
                    int relative)
{
    CU_CHECK(ctx);
    CU_CHECK(b >= 0 && t >= 0);
    if (b == 0 || t == 0)
        return SBPRT_OK;
    CU_CHECK(out && doc_ids);
    const size_t n = (size_t)b * t;
    CU_LAUNCH(ctx, docs_kernel, cu_blocks(n, DOCS_THREADS), DOCS_THREADS, 0, out, doc_ids, t, n,
              relative, ctx->dev_flag);
    return SBPRT_OK;
}

extern "C" int sbprt_doc_starts(sbprt_ctx *ctx, int32_t *doc_start, const int32_t *doc_ids, int b,
                                int t)
{
    return docs_run(ctx, doc_start, doc_ids, b, t, 0);
}

extern "C" int sbprt_doc_positions(sbprt_ctx *ctx, int32_t *pos, const int32_t *doc_ids, int b,
                                   int t)
{
    return docs_run(ctx, pos, doc_ids, b, t, 1);
}
