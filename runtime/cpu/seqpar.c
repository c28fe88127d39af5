/*
 * seqpar.c — sequence parallelism on the CPU backend (sbpc --seq-parallel N; sbprt.h,
 * "sequence parallelism"): DeepSpeed Ulysses' exchange of rows for heads around attention.
 *
 * Each of N ranks holds tl consecutive tokens of every row.  Attention needs the whole
 * sequence, so an all-to-all (the caller's, through the context's communicator) trades the
 * rank's rows of all heads for all rows of the rank's heads; the attention itself is the
 * existing packed kernel (attention.c) run on those heads; a second all-to-all sends the
 * output rows home.  The pieces:
 *
 *   - K and V are exchanged once per layer (sbprt_sp_kv_gather, one all-to-all per batch
 *     row): kh holds the rank's hkv_r kv heads for all N*tl positions, so every query chunk
 *     of a StreamBP loop reads it without another exchange.  sbprt_sp_kv_scatter is its
 *     backward: each rank's dkh rows go back to the rank that owns them and are ADDED to the
 *     kv heads they came from, in rank order (a replicated kv head gets N / hkv
 *     contributions; adding them 0, 1, ... N-1 is what keeps dk bitwise reproducible).
 *   - A query chunk (local rows q_start .. q_start + t - 1) is exchanged per call.  The send
 *     layout is [N][b][t][hq/N][d]: block m holds rank m's heads, so what arrives from rank
 *     n is exactly a [b, t, hq/N, d] query tensor for rank n's rows, which sit at absolute
 *     positions n*tl + q_start + i.  The kernel runs once per source rank n on that block
 *     (q_start' = n*tl + q_start, tk = N*tl), in order n = 0 .. N-1, so dkh and dvh, which
 *     the backward kernel accumulates into directly, always get their terms in one order.
 *     Each (row, head) is computed by the kernel from its own q and the K/V rows alone, so
 *     the results do not depend on the exchange at all.
 *   - Buffers: only the scratch the API passes.  Forward: s1 = packed q, then (once q has
 *     been sent) the kernel outputs; s2 = received q, then the received outputs.  Backward:
 *     s4 is the send buffer for q, out and dout in turn (received into s1, s2, s3), then the
 *     zeroed head-layout dq that the kernels accumulate into (it starts from zero so that
 *     what goes home is the increment alone); its exchange lands in s1 (no longer needed)
 *     and is added into dq.  No context scratch is borrowed here: the attention kernels
 *     borrow it themselves, and it must not hold anything across their calls.
 *
 * Checks come first and cover everything a later step could refuse (sizes, the heads rule,
 * nranks against the communicator, NULL tensors, the document starts of every chunk the
 * kernels will read), so a refused call writes nothing and every rank of a group, given the
 * same arguments, refuses the same call before any exchange: no rank is left waiting in an
 * all-to-all.  The kernels can then only fail for memory; a rank where one does still takes
 * part in the remaining exchanges (so the others do not hang) and returns the error.  A
 * nonzero return of the communicator is SBPRT_ERR_BACKEND, returned at once (what was
 * written until then, e.g. earlier batch rows of kh, stays written).  Lenient where the
 * plain attention is: lse of the forward may be NULL (no backward follows).  hq, hkv and d
 * must be positive (the heads rule has no meaning for zero heads); b, t, tl of 0 are no-ops.
 *
 * With nranks == 1 nothing is exchanged and no communicator is needed: the attention calls
 * are the plain packed kernel on the caller's tensors, the K/V gather a copy.  Every copy is
 * exact and every sum has a fixed order, so results do not depend on threads (the OpenMP
 * loops below only copy, or add one term per element per rank in rank order).
 */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "cpu.h"

/* ---- arguments ------------------------------------------------------------------------ */

/* nranks must be the group's size: the context's communicator's, or 1 without one. */
static int sp_check_ranks(const sbprt_ctx *ctx, int nranks)
{
    return nranks >= 1 && nranks == sbprt_ctx_comm_size(ctx) ? SBPRT_OK : SBPRT_ERR_INVALID;
}

/* The heads rule (sbprt.h): hq % N == 0 and either hkv % N == 0 (hkv / N kv heads each) or
 * N % hkv == 0 (one, replicated on N / hkv ranks); hq % hkv == 0 as for any GQA attention. */
static int sp_check_heads(int hq, int hkv, int d, int nranks, int *hkv_r)
{
    if (hq <= 0 || hkv <= 0 || d <= 0 || hq % hkv != 0 || hq % nranks != 0)
        return SBPRT_ERR_INVALID;
    if (hkv % nranks == 0)
        *hkv_r = hkv / nranks;
    else if (nranks % hkv == 0)
        *hkv_r = 1;
    else
        return SBPRT_ERR_INVALID;
    return SBPRT_OK;
}

/* The first kv head of rank r's share.  In the replicated case the rank's query heads all
 * lie in one group (hq / N divides hq / hkv), the one of its first query head. */
static int sp_kv0(int r, int hq, int hkv, int nranks)
{
    return hkv % nranks == 0 ? r * (hkv / nranks) : (r * (hq / nranks)) / (hq / hkv);
}

/* b, tl >= 0 and the whole sequence N * tl fits an int (positions are int32). */
static int sp_check_rows(int b, int tl, int nranks)
{
    return b >= 0 && tl >= 0 && (int64_t)nranks * tl <= INT_MAX ? SBPRT_OK : SBPRT_ERR_INVALID;
}

/* n = a * b * c * d without wrapping size_t. */
static int sp_numel(size_t *n, size_t a, size_t b, size_t c, size_t d)
{
    size_t x;
    return cpu_mul_size(a, b, &x) && cpu_mul_size(x, c, &x) && cpu_mul_size(x, d, n) &&
                   cpu_mul_size(*n, sizeof(float), &x)
               ? SBPRT_OK
               : SBPRT_ERR_INVALID;
}

/* The document starts of every chunk the N kernel calls read: positions n*tl + q_start ..
 * n*tl + q_start + t - 1 of each row, within [0, position] and non-decreasing within the
 * chunk, as attention.c checks them; checked here up front so that no call fails halfway
 * through the exchanges. */
static int sp_check_docs(const int32_t *doc_start, int b, int t, int tl, int q_start,
                         int nranks)
{
    if (!doc_start)
        return SBPRT_OK;
    const size_t row = (size_t)nranks * tl;
    for (int bi = 0; bi < b; bi++) {
        const int32_t *docs = doc_start + (size_t)bi * row;
        for (int n = 0; n < nranks; n++) {
            const int p0 = n * tl + q_start;
            for (int p = p0; p < p0 + t; p++)
                if (docs[p] < 0 || docs[p] > p || (p > p0 && docs[p] < docs[p - 1]))
                    return SBPRT_ERR_RANGE;
        }
    }
    return SBPRT_OK;
}

/* Everything the attention pair checks before touching memory; *hkv_r is the rank's kv
 * heads and *numel the b * t * hq * d of q and of each scratch. */
static int sp_check_attention(const sbprt_ctx *ctx, int b, int t, int tl, int hq, int hkv,
                              int d, int q_start, int window, float softcap, int nranks,
                              int *hkv_r, size_t *numel)
{
    int st = sp_check_ranks(ctx, nranks);
    if (!st)
        st = sp_check_heads(hq, hkv, d, nranks, hkv_r);
    if (!st)
        st = sp_check_rows(b, tl, nranks);
    if (st)
        return st;
    if (t < 0 || q_start < 0 || (int64_t)q_start + t > tl)
        return SBPRT_ERR_INVALID;
    if (window < 0 || !isfinite(softcap) || softcap < 0)
        return SBPRT_ERR_INVALID;
    size_t whole; /* kh and vh */
    st = sp_numel(&whole, (size_t)b * nranks, (size_t)tl, (size_t)*hkv_r, (size_t)d);
    return st ? st : sp_numel(numel, (size_t)b, (size_t)t, (size_t)hq, (size_t)d);
}

/* ---- exchange ------------------------------------------------------------------------- */

/* All-to-all of blocks of `bytes` through the context's communicator.  A group of one needs
 * no collective: its one block goes to itself. */
static int sp_alltoall(sbprt_ctx *ctx, const void *send, void *recv, size_t bytes)
{
    if (sbprt_ctx_comm_size(ctx) == 1) {
        memcpy(recv, send, bytes);
        return SBPRT_OK;
    }
    return ctx->comm.alltoall(ctx->comm.user, send, recv, bytes, NULL) ? SBPRT_ERR_BACKEND
                                                                        : SBPRT_OK;
}

/* dst[m][r][:w] = src[r][m*w .. m*w + w) for m < nranks, r < rows: rows of all heads into
 * one block per rank of that rank's heads (w = hq / N * d floats). */
static void sp_pack(sbprt_ctx *ctx, float *dst, const float *src, int nranks, size_t rows,
                    size_t w)
{
    const int64_t items = (int64_t)nranks * (int64_t)rows;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)items * w >= CPU_PARALLEL_MIN)
    for (int64_t it = 0; it < items; it++) {
        const size_t m = (size_t)it / rows, r = (size_t)it % rows;
        memcpy(dst + (m * rows + r) * w, src + (r * nranks + m) * w, w * sizeof(float));
    }
}

/* The inverse: dst[r][m*w + c] = (or += with add) src[m][r][c].  One term per element, so
 * adding does not depend on the order of the loop. */
static void sp_unpack(sbprt_ctx *ctx, float *dst, const float *src, int nranks, size_t rows,
                      size_t w, int add)
{
    const int64_t items = (int64_t)nranks * (int64_t)rows;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)items * w >= CPU_PARALLEL_MIN)
    for (int64_t it = 0; it < items; it++) {
        const size_t m = (size_t)it / rows, r = (size_t)it % rows;
        float *restrict o = dst + (r * nranks + m) * w;
        const float *restrict s = src + (m * rows + r) * w;
        if (add)
            for (size_t c = 0; c < w; c++)
                o[c] += s[c];
        else
            memcpy(o, s, w * sizeof(float));
    }
}

/* ---- positions and document ids ------------------------------------------------------- */

int sbprt_sp_positions(sbprt_ctx *ctx, int32_t *pos, int b, int tl, int nranks)
{
    CPU_CHECK(ctx);
    int st = sp_check_ranks(ctx, nranks);
    if (!st)
        st = sp_check_rows(b, tl, nranks);
    if (st)
        return st;
    if (b == 0 || tl == 0)
        return SBPRT_OK;
    CPU_CHECK(pos);
    const int base = sbprt_ctx_comm_rank(ctx) * tl;
    for (int bi = 0; bi < b; bi++)
        for (int i = 0; i < tl; i++)
            pos[(size_t)bi * tl + i] = base + i;
    return SBPRT_OK;
}

int sbprt_sp_gather_rows(sbprt_ctx *ctx, int32_t *all, const int32_t *mine, int32_t *scratch,
                         int b, int tl, int nranks)
{
    CPU_CHECK(ctx);
    int st = sp_check_ranks(ctx, nranks);
    if (!st)
        st = sp_check_rows(b, tl, nranks);
    if (st)
        return st;
    if (b == 0 || tl == 0)
        return SBPRT_OK;
    CPU_CHECK(all && mine && scratch);
    /* every rank gets the same block, this rank's share of the row; what arrives from rank n
     * is rank n's share, which is where all's row keeps it */
    const size_t row = (size_t)nranks * tl;
    for (int bi = 0; bi < b; bi++) {
        for (int m = 0; m < nranks; m++)
            memcpy(scratch + (size_t)m * tl, mine + (size_t)bi * tl, (size_t)tl * sizeof(int32_t));
        st = sp_alltoall(ctx, scratch, all + (size_t)bi * row, (size_t)tl * sizeof(int32_t));
        if (st)
            return st;
    }
    return SBPRT_OK;
}

int sbprt_sp_doc_positions(sbprt_ctx *ctx, int32_t *pos, const int32_t *doc_start, int b,
                           int tl, int nranks)
{
    CPU_CHECK(ctx);
    int st = sp_check_ranks(ctx, nranks);
    if (!st)
        st = sp_check_rows(b, tl, nranks);
    if (st)
        return st;
    if (b == 0 || tl == 0)
        return SBPRT_OK;
    CPU_CHECK(pos && doc_start);
    const int base = sbprt_ctx_comm_rank(ctx) * tl;
    const size_t row = (size_t)nranks * tl;
    /* a start outside [0, position] is an out-of-range index, as the packed attention calls
     * it; checked before anything is written */
    for (int bi = 0; bi < b; bi++)
        for (int i = 0; i < tl; i++) {
            const int32_t s = doc_start[(size_t)bi * row + base + i];
            if (s < 0 || s > base + i)
                return SBPRT_ERR_RANGE;
        }
    for (int bi = 0; bi < b; bi++)
        for (int i = 0; i < tl; i++)
            pos[(size_t)bi * tl + i] = base + i - doc_start[(size_t)bi * row + base + i];
    return SBPRT_OK;
}

/* ---- K and V -------------------------------------------------------------------------- */

/* The checks of the K/V pair; *blk is one rank's block, tl * hkv_r * d floats. */
static int sp_check_kv(const sbprt_ctx *ctx, int b, int tl, int hq, int hkv, int d, int nranks,
                       int *hkv_r, size_t *blk)
{
    int st = sp_check_ranks(ctx, nranks);
    if (!st)
        st = sp_check_heads(hq, hkv, d, nranks, hkv_r);
    if (!st)
        st = sp_check_rows(b, tl, nranks);
    size_t whole;
    if (!st) /* the whole kh, b * N * blk floats, must be addressable too */
        st = sp_numel(&whole, (size_t)b * nranks, (size_t)tl, (size_t)*hkv_r, (size_t)d);
    if (!st)
        st = sp_numel(blk, (size_t)tl, (size_t)*hkv_r, (size_t)d, 1);
    return st;
}

int sbprt_sp_kv_gather(sbprt_ctx *ctx, float *kh, const float *k, float *scratch, int b,
                       int tl, int hq, int hkv, int d, int nranks)
{
    CPU_CHECK(ctx);
    int hkv_r;
    size_t blk;
    int st = sp_check_kv(ctx, b, tl, hq, hkv, d, nranks, &hkv_r, &blk);
    if (st)
        return st;
    if (b == 0 || tl == 0)
        return SBPRT_OK;
    CPU_CHECK(kh && k && scratch);
    const size_t w = (size_t)hkv_r * d; /* one row's share for one rank: contiguous heads */
    const int64_t items = (int64_t)nranks * tl;
    for (int bi = 0; bi < b; bi++) {
        const float *kb = k + (size_t)bi * tl * hkv * d;
        /* block m: rank m's kv heads of this rank's rows, [tl, hkv_r, d] */
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)items * w >= CPU_PARALLEL_MIN)
        for (int64_t it = 0; it < items; it++) {
            const int m = (int)(it / tl), i = (int)(it % tl);
            memcpy(scratch + ((size_t)m * tl + i) * w,
                   kb + ((size_t)i * hkv + sp_kv0(m, hq, hkv, nranks)) * d, w * sizeof(float));
        }
        /* from rank n come its rows n*tl .. n*tl + tl - 1: kh's row bi is [N][tl][hkv_r][d],
         * so they land in place */
        st = sp_alltoall(ctx, scratch, kh + (size_t)bi * nranks * blk, blk * sizeof(float));
        if (st)
            return st;
    }
    return SBPRT_OK;
}

int sbprt_sp_kv_scatter(sbprt_ctx *ctx, float *dk, const float *dkh, float *scratch, int b,
                        int tl, int hq, int hkv, int d, int nranks)
{
    CPU_CHECK(ctx);
    int hkv_r;
    size_t blk;
    int st = sp_check_kv(ctx, b, tl, hq, hkv, d, nranks, &hkv_r, &blk);
    if (st)
        return st;
    if (b == 0 || tl == 0)
        return SBPRT_OK;
    CPU_CHECK(dk && dkh && scratch);
    const size_t w = (size_t)hkv_r * d;
    for (int bi = 0; bi < b; bi++) {
        /* block m of dkh's row is rows m*tl .. of this rank's heads: rank m's tokens */
        st = sp_alltoall(ctx, dkh + (size_t)bi * nranks * blk, scratch, blk * sizeof(float));
        if (st)
            return st;
        float *db = dk + (size_t)bi * tl * hkv * d;
        /* scratch[n] is rank n's gradient of this rank's rows, for rank n's kv heads; ranks in
         * order, so a replicated head sums its contributions the same way every time */
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)tl * nranks * w >= CPU_PARALLEL_MIN)
        for (int i = 0; i < tl; i++)
            for (int n = 0; n < nranks; n++)
                cpu_axpy(db + ((size_t)i * hkv + sp_kv0(n, hq, hkv, nranks)) * d, 1.0f,
                         scratch + ((size_t)n * tl + i) * w, (int)w);
    }
    return SBPRT_OK;
}

/* ---- attention ------------------------------------------------------------------------ */

int sbprt_sp_attention_forward(sbprt_ctx *ctx, float *out, float *lse, const float *q,
                               const float *kh, const float *vh, const int32_t *doc_start,
                               float *s1, float *s2, int b, int t, int tl, int hq, int hkv,
                               int d, int q_start, float scale, int window, float softcap,
                               int nranks)
{
    CPU_CHECK(ctx);
    int hkv_r;
    size_t numel;
    int st = sp_check_attention(ctx, b, t, tl, hq, hkv, d, q_start, window, softcap, nranks,
                                &hkv_r, &numel);
    if (st)
        return st;
    if (b == 0 || t == 0)
        return SBPRT_OK;
    CPU_CHECK(out && q && kh && vh && s1 && s2);
    st = sp_check_docs(doc_start, b, t, tl, q_start, nranks);
    if (st)
        return st;
    if (nranks == 1) /* the whole sequence is here: plain attention */
        return sbprt_attention_forward_packed(ctx, out, lse, q, kh, vh, doc_start, b, t, tl, hq,
                                              hkv, d, q_start, scale, window, softcap);

    const int hq_r = hq / nranks;
    const size_t rows = (size_t)b * t, w = (size_t)hq_r * d;
    const size_t blk = numel / nranks, lse_blk = (size_t)b * hq_r * t;
    sp_pack(ctx, s1, q, nranks, rows, w);
    st = sp_alltoall(ctx, s1, s2, blk * sizeof(float));
    if (st)
        return st;
    /* s2[n]: rank n's chunk, this rank's heads; its outputs go to s1[n] (s1 was sent) */
    int kst = SBPRT_OK;
    for (int n = 0; n < nranks && !kst; n++)
        kst = sbprt_attention_forward_packed(ctx, s1 + n * blk, lse ? lse + n * lse_blk : NULL,
                                             s2 + n * blk, kh, vh, doc_start, b, t,
                                             nranks * tl, hq_r, hkv_r, d, n * tl + q_start,
                                             scale, window, softcap);
    /* even after a failure: the other ranks are waiting in this exchange */
    st = sp_alltoall(ctx, s1, s2, blk * sizeof(float));
    if (kst)
        return kst;
    if (st)
        return st;
    sp_unpack(ctx, out, s2, nranks, rows, w, 0);
    return SBPRT_OK;
}

int sbprt_sp_attention_backward(sbprt_ctx *ctx, float *dq, float *dkh, float *dvh,
                                const float *dout, const float *q, const float *kh,
                                const float *vh, const float *out, const float *lse,
                                const int32_t *doc_start, float *s1, float *s2, float *s3,
                                float *s4, int b, int t, int tl, int hq, int hkv, int d,
                                int q_start, float scale, int window, float softcap,
                                int nranks)
{
    CPU_CHECK(ctx);
    int hkv_r;
    size_t numel;
    int st = sp_check_attention(ctx, b, t, tl, hq, hkv, d, q_start, window, softcap, nranks,
                                &hkv_r, &numel);
    if (st)
        return st;
    if (b == 0 || t == 0)
        return SBPRT_OK;
    CPU_CHECK(dq && dkh && dvh && dout && q && kh && vh && out && lse);
    CPU_CHECK(s1 && s2 && s3 && s4);
    st = sp_check_docs(doc_start, b, t, tl, q_start, nranks);
    if (st)
        return st;
    if (nranks == 1)
        return sbprt_attention_backward_packed(ctx, dq, dkh, dvh, dout, q, kh, vh, out, lse,
                                               doc_start, b, t, tl, hq, hkv, d, q_start, scale,
                                               window, softcap);

    const int hq_r = hq / nranks;
    const size_t rows = (size_t)b * t, w = (size_t)hq_r * d;
    const size_t blk = numel / nranks, lse_blk = (size_t)b * hq_r * t;
    /* q, out and dout of every rank's chunk, this rank's heads: s4 sends each in turn */
    const float *src[3] = {q, out, dout};
    float *dst[3] = {s1, s2, s3};
    for (int x = 0; x < 3; x++) {
        sp_pack(ctx, s4, src[x], nranks, rows, w);
        st = sp_alltoall(ctx, s4, dst[x], blk * sizeof(float));
        if (st)
            return st;
    }
    /* the kernel accumulates into dq: from zero, so that s4 holds the increment alone */
    memset(s4, 0, numel * sizeof(float));
    int kst = SBPRT_OK;
    for (int n = 0; n < nranks && !kst; n++)
        kst = sbprt_attention_backward_packed(ctx, s4 + n * blk, dkh, dvh, s3 + n * blk,
                                              s1 + n * blk, kh, vh, s2 + n * blk,
                                              lse + n * lse_blk, doc_start, b, t, nranks * tl,
                                              hq_r, hkv_r, d, n * tl + q_start, scale, window,
                                              softcap);
    st = sp_alltoall(ctx, s4, s1, blk * sizeof(float)); /* even after a failure, as above */
    if (kst)
        return kst;
    if (st)
        return st;
    sp_unpack(ctx, dq, s1, nranks, rows, w, 1);
    return SBPRT_OK;
}
