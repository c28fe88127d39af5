/*
 * seqpar.cu — sequence parallelism on the CUDA backend (sbpc --seq-parallel N; sbprt.h,
 * "sequence parallelism"): DeepSpeed Ulysses' exchange of rows for heads around attention.
 * The CPU twin is cpu/seqpar.c; this file follows it step for step, with the copies as
 * kernels on the context's stream.
 *
 * Each of N ranks holds tl consecutive tokens of every row.  Attention needs the whole
 * sequence, so an all-to-all (the caller's, through the context's communicator) trades the
 * rank's rows of all heads for all rows of the rank's heads; the attention itself is the
 * packed kernel of attention.cu run on those heads; a second all-to-all sends the output rows
 * home.  The pieces:
 *
 *   - K and V are exchanged once per layer (sbprt_sp_kv_gather, one all-to-all per batch
 *     row): kh holds the rank's hkv_r kv heads for all N*tl positions.  sbprt_sp_kv_scatter
 *     is its backward: each rank's dkh rows go back to the rank that owns them and are ADDED
 *     to the kv heads they came from, in rank order, one thread per element of dk (no
 *     atomics: a replicated kv head gets its N / hkv contributions added 0, 1, ... N-1 by one
 *     thread, in the CPU twin's order).
 *   - A query chunk (local rows q_start .. q_start + t - 1) is exchanged per call.  The send
 *     layout is [N][b][t][hq/N][d]: block m holds rank m's heads, so what arrives from rank n
 *     is a [b, t, hq/N, d] query tensor for rank n's rows, at absolute positions
 *     n*tl + q_start + i.  sbprt_attention_{forward,backward}_packed run once per source
 *     rank n on that block (hq' = hq/N, hkv' = hkv_r, tk = N*tl, q_start' = n*tl + q_start),
 *     in order n = 0 .. N-1, so dkh and dvh, which the backward accumulates into directly,
 *     always get their terms in one order.
 *   - Buffers: only the scratch the API passes, used as the CPU twin uses it.  Forward:
 *     s1 = packed q, then the kernel outputs; s2 = received q, then the received outputs.
 *     Backward: s4 sends q, out and dout in turn (received into s1, s2, s3), then holds the
 *     zeroed head-layout dq that the kernels accumulate into; its exchange lands in s1 and is
 *     added into dq.  The context scratch is not borrowed here: the attention backward
 *     borrows it itself, for its delta.
 *
 * The exchange is ctx->comm.alltoall(user, send, recv, bytes, stream).  With stream_ordered
 * 0 (MPI on host or emulated memory) the stream is synchronised first, so the callback reads
 * finished data, and it returns with recv filled, ready for the kernels queued next; with
 * stream_ordered 1 (NCCL) the call only queues the exchange on the stream, after the kernel
 * that packed send and before the one that reads recv.  A send buffer is rewritten (the next
 * batch row's pack, the kernel outputs in s1) only by work queued after its exchange, so
 * stream order keeps both modes correct.  A group of one needs no collective: its block is
 * copied on the stream.
 *
 * Checks are on the host and come first: sizes, the heads rule, nranks against the
 * communicator, NULL tensors, and the attention kernels' own limits (head size, grid,
 * shared memory: cu_attention_fits), so a refused call queues nothing and every rank of a
 * group, given the same arguments, refuses the same call before any exchange.  doc_start is
 * in device memory: each attention call checks the chunk it reads on the device (positions
 * n*tl + q_start .. of every row, together what the CPU twin checks up front) and raises the
 * context's index flag on a bad value, as sbprt_attention_forward_packed does (the CUDA
 * notes); sbprt_sp_doc_positions checks its starts the same way and skips a bad one.  After
 * the checks a call can fail only in the CUDA runtime or for memory; a rank where an
 * attention call fails still takes part in the remaining exchanges (so the others do not
 * hang) and returns the error.  A nonzero return of the communicator is SBPRT_ERR_BACKEND,
 * returned at once, with a message in ctx->msg.
 */
#include <limits.h>

#include "cuda.h"

#define SP_THREADS 256

/* ---- kernels ---------------------------------------------------------------------------- */

/* The first kv head of rank r's share (see sp_check_heads). */
static __host__ __device__ __forceinline__ int sp_kv0(int r, int hq, int hkv, int nranks)
{
    return hkv % nranks == 0 ? r * (hkv / nranks) : (r * (hq / nranks)) / (hq / hkv);
}

/* dst[m][r][c] = src[r][m*w + c] for m < nranks, r < rows, c < w: rows of all heads into one
 * block per rank of that rank's heads.  n = nranks * rows * w, indexed by dst. */
__global__ void sp_pack_kernel(float *dst, const float *src, int nranks, size_t rows, size_t w,
                               size_t n)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t c = e % w, mr = e / w, r = mr % rows, m = mr / rows;
        dst[e] = src[(r * nranks + m) * w + c];
    }
}

/* The inverse: dst[r][m*w + c] = (or += with add) src[m][r][c].  One term per element.
 * n = rows * nranks * w, indexed by dst. */
__global__ void sp_unpack_kernel(float *dst, const float *src, int nranks, size_t rows, size_t w,
                                 size_t n, int add)
{
    const size_t row = (size_t)nranks * w;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / row, mc = e % row, m = mc / w, c = mc % w;
        const float x = src[(m * rows + r) * w + c];
        if (add)
            dst[e] += x;
        else
            dst[e] = x;
    }
}

/* One batch row of the K/V gather's send buffer: dst[m][i][c] = kb[i][kv0(m)*d + c] for
 * c < w = hkv_r * d (rank m's kv heads are contiguous).  n = nranks * tl * w. */
__global__ void sp_kv_pack_kernel(float *dst, const float *kb, int tl, int hq, int hkv, int d,
                                  int nranks, size_t w, size_t n)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t c = e % w, mi = e / w, i = mi % (size_t)tl;
        const int m = (int)(mi / (size_t)tl);
        dst[e] = kb[(i * hkv + sp_kv0(m, hq, hkv, nranks)) * d + c];
    }
}

/* One batch row of the K/V scatter: db[i][h][c] += scratch[n][i][h - kv0(n)][c] for every
 * rank n whose share holds head h, in rank order (one thread per element of db, so the sum
 * order is the CPU twin's).  n_el = tl * hkv * d. */
__global__ void sp_kv_unpack_add_kernel(float *db, const float *scratch, int tl, int hq, int hkv,
                                        int d, int hkv_r, int nranks, size_t n_el)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n_el;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t c = e % (size_t)d, ih = e / (size_t)d, i = ih / (size_t)hkv;
        const int h = (int)(ih % (size_t)hkv);
        float acc = db[e];
        for (int n = 0; n < nranks; n++) {
            const int k0 = sp_kv0(n, hq, hkv, nranks);
            if (h >= k0 && h < k0 + hkv_r)
                acc += scratch[(((size_t)n * tl + i) * hkv_r + (h - k0)) * d + c];
        }
        db[e] = acc;
    }
}

/* pos[b, i] = base + i.   n = b * tl. */
__global__ void sp_positions_kernel(int32_t *pos, int tl, int base, size_t n)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x)
        pos[e] = base + (int)(e % (size_t)tl);
}

/* The same block for every rank: dst[m][i] = row[i].   n = nranks * tl. */
__global__ void sp_rows_pack_kernel(int32_t *dst, const int32_t *row, int tl, size_t n)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x)
        dst[e] = row[e % (size_t)tl];
}

/* pos[b, i] = base + i - doc_start[b, base + i]; a start outside [0, base + i] raises the
 * index flag and leaves its position as it was.   n = b * tl; doc_start rows of `row`. */
__global__ void sp_doc_positions_kernel(int32_t *pos, const int32_t *doc_start, int tl,
                                        size_t row, int base, size_t n, int *flag)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t bi = e / (size_t)tl;
        const int p = base + (int)(e % (size_t)tl);
        const int32_t s = doc_start[bi * row + p];
        if (s < 0 || s > p) {
            cu_flag_range(flag);
            continue;
        }
        pos[e] = p - s;
    }
}

/* ---- arguments ------------------------------------------------------------------------ */

/* nranks must be the group's size: the context's communicator's, or 1 without one. */
static int sp_check_ranks(sbprt_ctx *ctx, const char *what, int nranks)
{
    if (nranks >= 1 && nranks == sbprt_ctx_comm_size(ctx))
        return SBPRT_OK;
    return cu_error(ctx, SBPRT_ERR_INVALID,
                    "%s: compiled for %d ranks, but the context's communicator has %d", what,
                    nranks, sbprt_ctx_comm_size(ctx));
}

/* The heads rule (sbprt.h): hq % N == 0 and either hkv % N == 0 (hkv / N kv heads each) or
 * N % hkv == 0 (one, replicated on N / hkv ranks); hq % hkv == 0 as for any GQA attention. */
static int sp_check_heads(sbprt_ctx *ctx, const char *what, int hq, int hkv, int d, int nranks,
                          int *hkv_r)
{
    if (hq > 0 && hkv > 0 && d > 0 && hq % hkv == 0 && hq % nranks == 0) {
        if (hkv % nranks == 0) {
            *hkv_r = hkv / nranks;
            return SBPRT_OK;
        }
        if (nranks % hkv == 0) {
            *hkv_r = 1;
            return SBPRT_OK;
        }
    }
    return cu_error(ctx, SBPRT_ERR_INVALID,
                    "%s: hq = %d, hkv = %d, d = %d cannot be split over %d ranks", what, hq, hkv,
                    d, nranks);
}

/* b, tl >= 0 and the whole sequence N * tl fits an int (positions are int32). */
static int sp_check_rows(int b, int tl, int nranks)
{
    return b >= 0 && tl >= 0 && (int64_t)nranks * tl <= INT_MAX ? SBPRT_OK : SBPRT_ERR_INVALID;
}

/* a * b without wrapping size_t. */
static int sp_mul(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

/* n = a * b * c * d (and its bytes) without wrapping size_t. */
static int sp_numel(size_t *n, size_t a, size_t b, size_t c, size_t d)
{
    size_t x;
    return sp_mul(a, b, &x) && sp_mul(x, c, &x) && sp_mul(x, d, n) &&
                   sp_mul(*n, sizeof(float), &x)
               ? SBPRT_OK
               : SBPRT_ERR_INVALID;
}

/* Everything the attention pair checks before queuing anything; *hkv_r is the rank's kv
 * heads and *numel the b * t * hq * d of q and of each scratch. */
static int sp_check_attention(sbprt_ctx *ctx, const char *what, int b, int t, int tl, int hq,
                              int hkv, int d, int q_start, int window, float softcap,
                              int nranks, int *hkv_r, size_t *numel)
{
    CU_STATUS(sp_check_ranks(ctx, what, nranks));
    CU_STATUS(sp_check_heads(ctx, what, hq, hkv, d, nranks, hkv_r));
    CU_STATUS(sp_check_rows(b, tl, nranks));
    CU_CHECK(t >= 0 && q_start >= 0 && (int64_t)q_start + t <= tl);
    CU_CHECK(window >= 0 && isfinite(softcap) && softcap >= 0);
    size_t whole; /* kh and vh */
    CU_STATUS(sp_numel(&whole, (size_t)b * nranks, (size_t)tl, (size_t)*hkv_r, (size_t)d));
    return sp_numel(numel, (size_t)b, (size_t)t, (size_t)hq, (size_t)d);
}

/* The checks of the K/V pair; *blk is one rank's block, tl * hkv_r * d floats. */
static int sp_check_kv(sbprt_ctx *ctx, const char *what, int b, int tl, int hq, int hkv, int d,
                       int nranks, int *hkv_r, size_t *blk)
{
    CU_STATUS(sp_check_ranks(ctx, what, nranks));
    CU_STATUS(sp_check_heads(ctx, what, hq, hkv, d, nranks, hkv_r));
    CU_STATUS(sp_check_rows(b, tl, nranks));
    size_t whole; /* the whole kh, b * N * blk floats, must be addressable too */
    CU_STATUS(sp_numel(&whole, (size_t)b * nranks, (size_t)tl, (size_t)*hkv_r, (size_t)d));
    return sp_numel(blk, (size_t)tl, (size_t)*hkv_r, (size_t)d, 1);
}

/* ---- exchange ------------------------------------------------------------------------- */

/* All-to-all of blocks of `bytes` through the context's communicator (see the file's
 * header for the two modes).  A group of one copies its one block on the stream. */
static int sp_alltoall(sbprt_ctx *ctx, const char *what, const void *send, void *recv,
                       size_t bytes)
{
    if (sbprt_ctx_comm_size(ctx) == 1) {
        CU_TRY(ctx, cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, ctx->stream));
        return SBPRT_OK;
    }
    if (!ctx->comm.stream_ordered)
        CU_TRY(ctx, cudaStreamSynchronize(ctx->stream));
    const int rc = ctx->comm.alltoall(ctx->comm.user, send, recv, bytes, (void *)ctx->stream);
    if (rc != 0)
        return cu_error(ctx, SBPRT_ERR_BACKEND,
                        "%s: the communicator's all-to-all (rank %d of %d, blocks of %zu bytes) "
                        "returned %d",
                        what, ctx->comm.rank, ctx->comm.size, bytes, rc);
    return SBPRT_OK;
}

static int sp_pack(sbprt_ctx *ctx, float *dst, const float *src, int nranks, size_t rows,
                   size_t w)
{
    const size_t n = (size_t)nranks * rows * w;
    CU_LAUNCH(ctx, sp_pack_kernel, cu_blocks(n, SP_THREADS), SP_THREADS, 0, dst, src, nranks,
              rows, w, n);
    return SBPRT_OK;
}

static int sp_unpack(sbprt_ctx *ctx, float *dst, const float *src, int nranks, size_t rows,
                     size_t w, int add)
{
    const size_t n = (size_t)nranks * rows * w;
    CU_LAUNCH(ctx, sp_unpack_kernel, cu_blocks(n, SP_THREADS), SP_THREADS, 0, dst, src, nranks,
              rows, w, n, add);
    return SBPRT_OK;
}

/* ---- positions and document ids ------------------------------------------------------- */

extern "C" int sbprt_sp_positions(sbprt_ctx *ctx, int32_t *pos, int b, int tl, int nranks)
{
    CU_CHECK(ctx);
    CU_STATUS(sp_check_ranks(ctx, "sbprt_sp_positions", nranks));
    CU_STATUS(sp_check_rows(b, tl, nranks));
    if (b == 0 || tl == 0)
        return SBPRT_OK;
    CU_CHECK(pos);
    const size_t n = (size_t)b * tl;
    CU_LAUNCH(ctx, sp_positions_kernel, cu_blocks(n, SP_THREADS), SP_THREADS, 0, pos, tl,
              sbprt_ctx_comm_rank(ctx) * tl, n);
    return SBPRT_OK;
}

extern "C" int sbprt_sp_gather_rows(sbprt_ctx *ctx, int32_t *all, const int32_t *mine,
                                    int32_t *scratch, int b, int tl, int nranks)
{
    static const char what[] = "sbprt_sp_gather_rows";
    CU_CHECK(ctx);
    CU_STATUS(sp_check_ranks(ctx, what, nranks));
    CU_STATUS(sp_check_rows(b, tl, nranks));
    if (b == 0 || tl == 0)
        return SBPRT_OK;
    CU_CHECK(all && mine && scratch);
    /* every rank gets the same block, this rank's share of the row; what arrives from rank n
     * is rank n's share, which is where all's row keeps it */
    const size_t row = (size_t)nranks * tl;
    for (int bi = 0; bi < b; bi++) {
        CU_LAUNCH(ctx, sp_rows_pack_kernel, cu_blocks(row, SP_THREADS), SP_THREADS, 0, scratch,
                  mine + (size_t)bi * tl, tl, row);
        CU_STATUS(sp_alltoall(ctx, what, scratch, all + (size_t)bi * row,
                              (size_t)tl * sizeof(int32_t)));
    }
    return SBPRT_OK;
}

extern "C" int sbprt_sp_doc_positions(sbprt_ctx *ctx, int32_t *pos, const int32_t *doc_start,
                                      int b, int tl, int nranks)
{
    CU_CHECK(ctx);
    CU_STATUS(sp_check_ranks(ctx, "sbprt_sp_doc_positions", nranks));
    CU_STATUS(sp_check_rows(b, tl, nranks));
    if (b == 0 || tl == 0)
        return SBPRT_OK;
    CU_CHECK(pos && doc_start);
    const size_t n = (size_t)b * tl;
    CU_LAUNCH(ctx, sp_doc_positions_kernel, cu_blocks(n, SP_THREADS), SP_THREADS, 0, pos,
              doc_start, tl, (size_t)nranks * tl, sbprt_ctx_comm_rank(ctx) * tl, n,
              ctx->dev_flag);
    return SBPRT_OK;
}

/* ---- K and V -------------------------------------------------------------------------- */

extern "C" int sbprt_sp_kv_gather(sbprt_ctx *ctx, float *kh, const float *k, float *scratch,
                                  int b, int tl, int hq, int hkv, int d, int nranks)
{
    static const char what[] = "sbprt_sp_kv_gather";
    CU_CHECK(ctx);
    int hkv_r;
    size_t blk;
    CU_STATUS(sp_check_kv(ctx, what, b, tl, hq, hkv, d, nranks, &hkv_r, &blk));
    if (b == 0 || tl == 0)
        return SBPRT_OK;
    CU_CHECK(kh && k && scratch);
    const size_t w = (size_t)hkv_r * d, n = (size_t)nranks * blk;
    for (int bi = 0; bi < b; bi++) {
        /* block m: rank m's kv heads of this rank's rows, [tl, hkv_r, d] */
        CU_LAUNCH(ctx, sp_kv_pack_kernel, cu_blocks(n, SP_THREADS), SP_THREADS, 0, scratch,
                  k + (size_t)bi * tl * hkv * d, tl, hq, hkv, d, nranks, w, n);
        /* from rank n come its rows n*tl .. n*tl + tl - 1: kh's row bi is [N][tl][hkv_r][d],
         * so they land in place */
        CU_STATUS(sp_alltoall(ctx, what, scratch, kh + (size_t)bi * n, blk * sizeof(float)));
    }
    return SBPRT_OK;
}

extern "C" int sbprt_sp_kv_scatter(sbprt_ctx *ctx, float *dk, const float *dkh, float *scratch,
                                   int b, int tl, int hq, int hkv, int d, int nranks)
{
    static const char what[] = "sbprt_sp_kv_scatter";
    CU_CHECK(ctx);
    int hkv_r;
    size_t blk;
    CU_STATUS(sp_check_kv(ctx, what, b, tl, hq, hkv, d, nranks, &hkv_r, &blk));
    if (b == 0 || tl == 0)
        return SBPRT_OK;
    CU_CHECK(dk && dkh && scratch);
    const size_t n_el = (size_t)tl * hkv * d;
    for (int bi = 0; bi < b; bi++) {
        /* block m of dkh's row is rows m*tl .. of this rank's heads: rank m's tokens */
        CU_STATUS(sp_alltoall(ctx, what, dkh + (size_t)bi * nranks * blk, scratch,
                              blk * sizeof(float)));
        /* scratch[n] is rank n's gradient of this rank's rows, for rank n's kv heads */
        CU_LAUNCH(ctx, sp_kv_unpack_add_kernel, cu_blocks(n_el, SP_THREADS), SP_THREADS, 0,
                  dk + (size_t)bi * n_el, scratch, tl, hq, hkv, d, hkv_r, nranks, n_el);
    }
    return SBPRT_OK;
}

/* ---- attention ------------------------------------------------------------------------ */

extern "C" int sbprt_sp_attention_forward(sbprt_ctx *ctx, float *out, float *lse,
                                          const float *q, const float *kh, const float *vh,
                                          const int32_t *doc_start, float *s1, float *s2, int b,
                                          int t, int tl, int hq, int hkv, int d, int q_start,
                                          float scale, int window, float softcap, int nranks)
{
    static const char what[] = "sbprt_sp_attention_forward";
    CU_CHECK(ctx);
    int hkv_r;
    size_t numel;
    CU_STATUS(sp_check_attention(ctx, what, b, t, tl, hq, hkv, d, q_start, window, softcap,
                                 nranks, &hkv_r, &numel));
    if (b == 0 || t == 0)
        return SBPRT_OK;
    CU_CHECK(out && q && kh && vh && s1 && s2);
    if (nranks == 1) /* the whole sequence is here: plain attention */
        return sbprt_attention_forward_packed(ctx, out, lse, q, kh, vh, doc_start, b, t, tl, hq,
                                              hkv, d, q_start, scale, window, softcap);

    const int hq_r = hq / nranks;
    CU_STATUS(cu_attention_fits(ctx, b, hq_r, d, 0));
    const size_t rows = (size_t)b * t, w = (size_t)hq_r * d;
    const size_t blk = numel / nranks, lse_blk = (size_t)b * hq_r * t;
    CU_STATUS(sp_pack(ctx, s1, q, nranks, rows, w));
    CU_STATUS(sp_alltoall(ctx, what, s1, s2, blk * sizeof(float)));
    /* s2[n]: rank n's chunk, this rank's heads; its outputs go to s1[n] (s1 was sent) */
    int kst = SBPRT_OK;
    for (int n = 0; n < nranks && !kst; n++)
        kst = sbprt_attention_forward_packed(ctx, s1 + n * blk, lse ? lse + n * lse_blk : NULL,
                                             s2 + n * blk, kh, vh, doc_start, b, t,
                                             nranks * tl, hq_r, hkv_r, d, n * tl + q_start,
                                             scale, window, softcap);
    /* even after a failure: the other ranks are waiting in this exchange */
    char kmsg[sizeof ctx->msg];
    memcpy(kmsg, ctx->msg, sizeof kmsg);
    const int st = sp_alltoall(ctx, what, s1, s2, blk * sizeof(float));
    if (kst) {
        memcpy(ctx->msg, kmsg, sizeof kmsg); /* the kernel's diagnostic, not the exchange's */
        return kst;
    }
    CU_STATUS(st);
    return sp_unpack(ctx, out, s2, nranks, rows, w, 0);
}

extern "C" int sbprt_sp_attention_backward(sbprt_ctx *ctx, float *dq, float *dkh, float *dvh,
                                           const float *dout, const float *q, const float *kh,
                                           const float *vh, const float *out, const float *lse,
                                           const int32_t *doc_start, float *s1, float *s2,
                                           float *s3, float *s4, int b, int t, int tl, int hq,
                                           int hkv, int d, int q_start, float scale, int window,
                                           float softcap, int nranks)
{
    static const char what[] = "sbprt_sp_attention_backward";
    CU_CHECK(ctx);
    int hkv_r;
    size_t numel;
    CU_STATUS(sp_check_attention(ctx, what, b, t, tl, hq, hkv, d, q_start, window, softcap,
                                 nranks, &hkv_r, &numel));
    if (b == 0 || t == 0)
        return SBPRT_OK;
    CU_CHECK(dq && dkh && dvh && dout && q && kh && vh && out && lse);
    CU_CHECK(s1 && s2 && s3 && s4);
    if (nranks == 1)
        return sbprt_attention_backward_packed(ctx, dq, dkh, dvh, dout, q, kh, vh, out, lse,
                                               doc_start, b, t, tl, hq, hkv, d, q_start, scale,
                                               window, softcap);

    const int hq_r = hq / nranks;
    CU_STATUS(cu_attention_fits(ctx, b, hq_r, d, 1));
    const size_t rows = (size_t)b * t, w = (size_t)hq_r * d;
    const size_t blk = numel / nranks, lse_blk = (size_t)b * hq_r * t;
    /* q, out and dout of every rank's chunk, this rank's heads: s4 sends each in turn */
    const float *src[3] = {q, out, dout};
    float *dst[3] = {s1, s2, s3};
    for (int x = 0; x < 3; x++) {
        CU_STATUS(sp_pack(ctx, s4, src[x], nranks, rows, w));
        CU_STATUS(sp_alltoall(ctx, what, s4, dst[x], blk * sizeof(float)));
    }
    /* the kernel accumulates into dq: from zero, so that s4 holds the increment alone */
    int kst = SBPRT_OK;
    {
        const cudaError_t e = cudaMemsetAsync(s4, 0, numel * sizeof(float), ctx->stream);
        if (e != cudaSuccess)
            kst = cu_fail(ctx, e, "cudaMemsetAsync(s4)", __FILE__, __LINE__);
    }
    for (int n = 0; n < nranks && !kst; n++)
        kst = sbprt_attention_backward_packed(ctx, s4 + n * blk, dkh, dvh, s3 + n * blk,
                                              s1 + n * blk, kh, vh, s2 + n * blk,
                                              lse + n * lse_blk, doc_start, b, t, nranks * tl,
                                              hq_r, hkv_r, d, n * tl + q_start, scale, window,
                                              softcap);
    char kmsg[sizeof ctx->msg];
    memcpy(kmsg, ctx->msg, sizeof kmsg);
    const int st = sp_alltoall(ctx, what, s4, s1, blk * sizeof(float)); /* even after a failure */
    if (kst) {
        memcpy(ctx->msg, kmsg, sizeof kmsg);
        return kst;
    }
    CU_STATUS(st);
    return sp_unpack(ctx, dq, s1, nranks, rows, w, 1);
}
