/*
 * moe.cu — a routed layer of SwiGLU experts (sbprt_moe_forward / sbprt_moe_backward); the CPU
 * twin is cpu/moe.c, whose scratch layout, sort order and summation orders this file keeps.
 *
 * Pipeline: the router's logits are one GEMM, then one thread per row does the softmax, the
 * top-k and the routing weights serially, exactly as the twin's moe_route_row (e is small, and
 * a serial scan gives the twin's choice bit for bit on ties and even on NaN rows, which a tree
 * argmax would not).  One block counting-sorts the n*k (row, choice) pairs by expert, stably;
 * the selected rows are gathered in that order and each expert with c > 0 rows runs one cuBLAS
 * GEMM per matrix (sbprt_gemm) over its own rows.  cuBLAS takes a GEMM's row count as a host
 * argument, so each call copies the e + 1 expert offsets to the host once, with a synchronous
 * copy: that is the one host synchronisation of this file.  The backward recomputes the sort
 * and the activations from x, as the twin does.
 *
 * Determinism: every output element is written by one thread, which sums its terms in a fixed
 * order (the k choices of a row in choice order, a dot product in a fixed lane tree); the
 * statistics reduce each expert's probabilities in double over a fixed block tree; there are
 * no atomics but the index-error flag.  So results are bitwise equal run to run.
 *
 * All temporaries live in the caller's scratch (sbprt_moe_scratch_floats floats), carved into
 * the twin's pieces.  The sort's per-chunk counters borrow the dz piece ([n, e]), which only
 * the backward's router stage uses, after the sort is done.
 */
#include <stdlib.h>

#include "cuda.h"
#include "moe_layout.h"

static_assert(sizeof(int32_t) == sizeof(float), "routing tables are int32 in float slots");

#define MOE_THREADS 256      /* threads of the elementwise and per-row kernels */
#define MOE_SORT_THREADS 256 /* the sort's one block; also its most chunks of rows */

/* ---- kernels ---------------------------------------------------------------------------- */

/* The twin's SwiGLU formulas (those of elementwise.c), so the experts' products match. */
__device__ __forceinline__ float moe_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float moe_silu_grad(float x)
{
    float s = moe_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

/* Whether expert a ranks before expert b in the top-k order: the larger probability, and on
 * equal values the lower index (ONNX TopK).  A NaN ranks before nothing. */
__device__ __forceinline__ bool moe_before(const float *p, int a, int b)
{
    return p[a] > p[b] || (p[a] == p[b] && a < b);
}

/* One thread per row: the softmax of the logits in probs (in place), the top-k into sel and
 * the routing weights into wts — the twin's moe_route_row step for step.
 *   probs: [n, e]    sel, wts: [n, k] */
__global__ void moe_route_kernel(float *probs, int32_t *sel, float *wts, int n, int e, int k,
                                 int norm_topk)
{
    for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < (size_t)n;
         r += (size_t)gridDim.x * blockDim.x) {
        float *p = probs + r * e;
        int32_t *sr = sel + r * k;
        float *wr = wts + r * k;
        float mx = p[0];
        for (int i = 1; i < e; i++)
            mx = p[i] > mx ? p[i] : mx;
        float s = 0;
        for (int i = 0; i < e; i++) {
            p[i] = expf(p[i] - mx);
            s += p[i];
        }
        for (int i = 0; i < e; i++)
            p[i] /= s;
        /* each choice is the best expert ranked after the previous choice */
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int i = 0; i < e; i++) {
                if (j > 0 && !moe_before(p, sr[j - 1], i))
                    continue;
                if (best < 0 || moe_before(p, i, best))
                    best = i;
            }
            if (best < 0) /* only after a NaN: the lowest expert not chosen yet */
                for (int i = 0; i < e && best < 0; i++) {
                    bool taken = false;
                    for (int jj = 0; jj < j; jj++)
                        taken |= sr[jj] == i;
                    if (!taken)
                        best = i;
                }
            sr[j] = best;
        }
        float vs = 0;
        for (int j = 0; j < k; j++) {
            wr[j] = p[sr[j]];
            vs += wr[j];
        }
        if (norm_topk)
            for (int j = 0; j < k; j++)
                wr[j] /= vs;
    }
}

/* Stable counting sort of the n*k pairs by expert, in one block of MOE_SORT_THREADS.  The rows
 * are split into nchunk = min(n, blockDim.x) contiguous chunks, one per thread:
 *   1. thread t counts its chunk's pairs per expert into cnt[t, :];
 *   2. per expert (threads over experts), an exclusive scan over the chunks turns cnt[:, i]
 *      into each chunk's first rank among expert i's pairs, and the totals into start;
 *   3. thread 0 scans the totals into the offsets start[0..e] (e is small);
 *   4. each chunk's ranks are offset by its expert's start;
 *   5. thread t places its pairs in order: within an expert, chunk by chunk, pair by pair —
 *      row, then choice, as the twin's one-thread sort.
 * A sel value outside [0, e) raises the index-error flag and sets start[e] = -1 (a valid sort
 * has start[e] = nk >= 1), and nothing but the counters is written.
 *   start: [e + 1]    order, pos, sel: [n * k]    cnt: [min(n, blockDim.x), e] */
__global__ void moe_sort_kernel(int32_t *start, int32_t *order, int32_t *pos, int32_t *cnt,
                                const int32_t *sel, int n, int e, int k, int *flag)
{
    CU_SHARED(int, bad, 1);
    const int t = threadIdx.x, nt = blockDim.x;
    const int nchunk = n < nt ? n : nt;
    const size_t q0 = (size_t)((int64_t)n * t / nchunk) * k;
    const size_t q1 = (size_t)((int64_t)n * (t + 1) / nchunk) * k;
    int32_t *mine = cnt + (size_t)(t < nchunk ? t : 0) * e;
    if (t == 0)
        bad[0] = 0;
    __syncthreads();
    if (t < nchunk) {
        for (int i = 0; i < e; i++)
            mine[i] = 0;
        for (size_t q = q0; q < q1; q++) {
            const int32_t s = sel[q];
            if (s < 0 || s >= e)
                bad[0] = 1; /* every writer writes the same value */
            else
                mine[s]++;
        }
    }
    __syncthreads();
    if (bad[0]) { /* block-uniform */
        if (t == 0) {
            cu_flag_range(flag);
            start[e] = -1;
        }
        return;
    }
    for (int i = t; i < e; i += nt) {
        int32_t run = 0;
        for (int c = 0; c < nchunk; c++) {
            const int32_t v = cnt[(size_t)c * e + i];
            cnt[(size_t)c * e + i] = run;
            run += v;
        }
        start[i + 1] = run;
    }
    __syncthreads();
    if (t == 0) {
        start[0] = 0;
        for (int i = 0; i < e; i++)
            start[i + 1] += start[i];
    }
    __syncthreads();
    for (int i = t; i < e; i += nt)
        for (int c = 0; c < nchunk; c++)
            cnt[(size_t)c * e + i] += start[i];
    __syncthreads();
    if (t < nchunk)
        for (size_t q = q0; q < q1; q++) {
            const int32_t p = mine[sel[q]]++;
            order[p] = (int32_t)q;
            pos[q] = p;
        }
}

/* xs[p, :] = x[order[p] / k, :].   xs: [nk, d]    x: [n, d] */
__global__ void moe_gather_kernel(float *xs, const float *x, const int32_t *order, size_t nk,
                                  int d, int k)
{
    const size_t total = nk * d;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t p = i / d, c = i % d;
        xs[i] = x[(size_t)(order[p] / k) * d + c];
    }
}

/* a[p, c] = silu(h[p, c]) * h[p, f + c].   a: [nk, f]    h: [nk, 2f] */
__global__ void moe_swiglu_kernel(float *a, const float *h, size_t nk, int f)
{
    const size_t total = nk * f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t p = i / f, c = i % f;
        const float gate = h[p * 2 * f + c], up = h[p * 2 * f + f + c];
        a[i] = gate * moe_sigmoid(gate) * up;
    }
}

/* y[r, c] = Σ_j wts[r, j] ye[pos[r, j], c], j in order, each product rounded before the sum
 * as the twin rounds it.   y: [n, d]    ye: [nk, d]    pos, wts: [n, k] */
__global__ void moe_combine_kernel(float *y, const float *ye, const int32_t *pos,
                                   const float *wts, int n, int d, int k)
{
    const size_t total = (size_t)n * d;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / d, c = i % d;
        float acc = 0;
        for (int j = 0; j < k; j++) {
            const size_t q = r * k + j;
            const float t = __fmul_rn(wts[q], ye[(size_t)pos[q] * d + c]);
            acc = j == 0 ? t : __fadd_rn(acc, t);
        }
        y[i] = acc;
    }
}

/* One block per expert (grid-stride over experts): stats[i] += its pair count, stats[e + i] +=
 * Σ_r probs[r, i] in double (each thread a strided subset of the rows in order, then a fixed
 * tree).   stats: [2e]    probs: [n, e]    start: [e + 1] */
__global__ void moe_stats_kernel(float *stats, const float *probs, const int32_t *start, int n,
                                 int e)
{
    CU_SHARED(double, red, 32);
    for (int i = blockIdx.x; i < e; i += gridDim.x) { /* block-uniform */
        double s = 0;
        for (int r = threadIdx.x; r < n; r += blockDim.x)
            s += probs[(size_t)r * e + i];
        s = cu_block_sum(s, red);
        if (threadIdx.x == 0) {
            stats[i] += (float)(double)(start[i + 1] - start[i]);
            stats[e + i] += (float)s;
        }
    }
}

/* One warp per sorted pair p of pair q = order[p], row r = q / k: dw[q] = dy[r] · ye[p] (lanes
 * over columns, then a butterfly), then ye[p] = wts[q] dy[r] (each lane rewrites only what it
 * read).   dw: [nk]    ye: [nk, d]    dy: [n, d] */
__global__ void moe_pair_grad_kernel(float *dw, float *ye, const float *dy, const float *wts,
                                     const int32_t *order, size_t nk, int d, int k)
{
    const int lane = threadIdx.x & 31;
    const size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
    for (size_t p = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; p < nk;
         p += warps) { /* warp-uniform */
        const int32_t q = order[p];
        const float *dyr = dy + (size_t)(q / k) * d;
        float *yp = ye + p * d;
        const float w = wts[q];
        float s = 0;
        for (int c = lane; c < d; c += 32) {
            s += dyr[c] * yp[c];
            yp[c] = w * dyr[c];
        }
        s = cu_warp_sum(s);
        if (lane == 0)
            dw[q] = s;
    }
}

/* The SwiGLU backward, written: dh[p, c] = da * up * silu'(gate), dh[p, f + c] = da * silu(gate).
 *   dh, h: [nk, 2f]    da: [nk, f] */
__global__ void moe_swiglu_backward_kernel(float *dh, const float *da, const float *h, size_t nk,
                                           int f)
{
    const size_t total = nk * f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t p = i / f, c = i % f;
        const float gate = h[p * 2 * f + c], up = h[p * 2 * f + f + c], g = da[i];
        dh[p * 2 * f + c] = g * up * moe_silu_grad(gate);
        dh[p * 2 * f + f + c] = g * gate * moe_sigmoid(gate);
    }
}

/* dx[r, c] += Σ_j dxs[pos[r, j], c], the k copies summed in choice order first.
 *   dx: [n, d]    dxs: [nk, d]    pos: [n, k] */
__global__ void moe_scatter_kernel(float *dx, const float *dxs, const int32_t *pos, int n, int d,
                                   int k)
{
    const size_t total = (size_t)n * d;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / d, c = i % d;
        float s = 0;
        for (int j = 0; j < k; j++)
            s += dxs[(size_t)pos[r * k + j] * d + c];
        dx[i] += s;
    }
}

/* One thread per row, the twin's router backward: dL/dv through the renormalisation, scattered
 * into dL/dp over the load-balancing term's aux_scale * stats[i] (aux), then the softmax
 * backward dz = p (dp - dp · p).
 *   dz, probs: [n, e]    dw, sel, wts: [n, k]    stats: [2e] (read only when aux) */
__global__ void moe_router_backward_kernel(float *dz, float *dw, const float *probs,
                                           const int32_t *sel, const float *wts,
                                           const float *stats, int n, int e, int k,
                                           int norm_topk, int aux, float aux_scale)
{
    for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < (size_t)n;
         r += (size_t)gridDim.x * blockDim.x) {
        const float *pr = probs + r * e;
        const int32_t *sr = sel + r * k;
        const float *wr = wts + r * k;
        float *dvr = dw + r * k, *dzr = dz + r * e;
        if (norm_topk) {
            float s = 0, g = 0;
            for (int j = 0; j < k; j++)
                s += pr[sr[j]];
            for (int j = 0; j < k; j++)
                g += dvr[j] * wr[j];
            for (int j = 0; j < k; j++)
                dvr[j] = (dvr[j] - g) / s;
        }
        for (int i = 0; i < e; i++)
            dzr[i] = aux ? aux_scale * stats[i] : 0.0f;
        for (int j = 0; j < k; j++)
            dzr[sr[j]] += dvr[j];
        float g = 0;
        for (int i = 0; i < e; i++)
            g += dzr[i] * pr[i];
        for (int i = 0; i < e; i++)
            dzr[i] = pr[i] * (dzr[i] - g);
    }
}

/* ---- host side ---------------------------------------------------------------------------- */

/* Queues the sort of sel into scratch.  With hstart, also copies the e + 1 expert offsets to
 * it and waits for them (the GEMMs' row counts are host arguments; see the file comment);
 * *valid is then 0 when sel held an index outside [0, e) (the flag is raised for sbprt_sync). */
static int moe_sort(sbprt_ctx *ctx, float *scratch, const sbprt_moe_layout *L,
                    const int32_t *sel, int n, int e, int k, int32_t *hstart, int *valid)
{
    int32_t *start = (int32_t *)(scratch + L->start);
    CU_LAUNCH(ctx, moe_sort_kernel, 1, MOE_SORT_THREADS, 0, start,
              (int32_t *)(scratch + L->order), (int32_t *)(scratch + L->pos),
              (int32_t *)(scratch + L->dz), sel, n, e, k, ctx->dev_flag);
    if (!hstart)
        return SBPRT_OK;
    CU_TRY(ctx, cudaMemcpyAsync(hstart, start, ((size_t)e + 1) * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, ctx->stream));
    CU_TRY(ctx, cudaStreamSynchronize(ctx->stream));
    *valid = hstart[e] == (int32_t)L->nk;
    return SBPRT_OK;
}

/* The experts over the sorted pairs: xs gathered from x, h = xs w1ᵀ, a = swiglu(h),
 * ye = a w2ᵀ, per expert one GEMM each over its rows (hstart: the offsets on the host).
 *   x: [n, d]    w1: [e, 2f, d]    w2: [e, d, f] */
static int moe_experts(sbprt_ctx *ctx, float *scratch, const sbprt_moe_layout *L,
                       const int32_t *hstart, const float *x, const float *w1, const float *w2,
                       int d, int e, int k, int f)
{
    float *xs = scratch + L->xs, *h = scratch + L->h, *a = scratch + L->a;
    float *ye = scratch + L->ye;
    const int32_t *order = (const int32_t *)(scratch + L->order);
    const size_t f2 = 2 * (size_t)f;
    CU_LAUNCH(ctx, moe_gather_kernel, cu_blocks(L->nk * d, MOE_THREADS), MOE_THREADS, 0, xs, x,
              order, L->nk, d, k);
    for (int i = 0; i < e; i++) {
        const int c = hstart[i + 1] - hstart[i];
        if (c > 0)
            CU_STATUS(sbprt_gemm(ctx, h + (size_t)hstart[i] * f2, xs + (size_t)hstart[i] * d,
                                 w1 + (size_t)i * f2 * d, 0, 1, c, (int)f2, d, 1.0f, 0.0f));
    }
    CU_LAUNCH(ctx, moe_swiglu_kernel, cu_blocks(L->nk * f, MOE_THREADS), MOE_THREADS, 0, a, h,
              L->nk, f);
    for (int i = 0; i < e; i++) {
        const int c = hstart[i + 1] - hstart[i];
        if (c > 0)
            CU_STATUS(sbprt_gemm(ctx, ye + (size_t)hstart[i] * d, a + (size_t)hstart[i] * f,
                                 w2 + (size_t)i * d * f, 0, 1, c, d, f, 1.0f, 0.0f));
    }
    return SBPRT_OK;
}

/* Host memory for the e + 1 offsets (freed by the caller). */
static int moe_host_offsets(sbprt_ctx *ctx, int e, int32_t **out)
{
    *out = (int32_t *)malloc(((size_t)e + 1) * sizeof(int32_t));
    if (!*out)
        return cu_error(ctx, SBPRT_ERR_NOMEM, "moe: out of host memory for %d expert offsets",
                        e + 1);
    return SBPRT_OK;
}

static int moe_forward_run(sbprt_ctx *ctx, int32_t *hstart, float *y, float *probs,
                           int32_t *sel, float *wts, float *stats, const float *x,
                           const float *wr, const float *w1, const float *w2, float *scratch,
                           const sbprt_moe_layout *L, int n, int d, int e, int k, int f,
                           int norm_topk)
{
    /* router: logits straight into probs, then softmax and top-k per row */
    CU_STATUS(sbprt_gemm(ctx, probs, x, wr, 0, 1, n, e, d, 1.0f, 0.0f));
    CU_LAUNCH(ctx, moe_route_kernel, cu_blocks((size_t)n, MOE_THREADS), MOE_THREADS, 0, probs,
              sel, wts, n, e, k, norm_topk);
    int valid = 0;
    CU_STATUS(moe_sort(ctx, scratch, L, sel, n, e, k, hstart, &valid));
    if (!valid)
        return SBPRT_OK; /* not reached: the routing above only writes valid experts */
    CU_STATUS(moe_experts(ctx, scratch, L, hstart, x, w1, w2, d, e, k, f));
    CU_LAUNCH(ctx, moe_combine_kernel, cu_blocks((size_t)n * d, MOE_THREADS), MOE_THREADS, 0, y,
              scratch + L->ye, (const int32_t *)(scratch + L->pos), wts, n, d, k);
    if (stats) {
        const unsigned blocks = (unsigned)e < CU_MAX_BLOCKS ? (unsigned)e : CU_MAX_BLOCKS;
        CU_LAUNCH(ctx, moe_stats_kernel, blocks, MOE_THREADS, 0, stats, probs,
                  (const int32_t *)(scratch + L->start), n, e);
    }
    return SBPRT_OK;
}

extern "C" int sbprt_moe_forward(sbprt_ctx *ctx, float *y, float *probs, int32_t *sel,
                                 float *wts, float *stats, const float *x, const float *wr,
                                 const float *w1, const float *w2, float *scratch, int n, int d,
                                 int e, int k, int f, int norm_topk)
{
    CU_CHECK(ctx);
    sbprt_moe_layout L;
    CU_STATUS(sbprt_moe_layout_plan(n, d, e, k, f, &L));
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(y && probs && sel && wts && x && wr && w1 && w2 && scratch);
    int32_t *hstart;
    CU_STATUS(moe_host_offsets(ctx, e, &hstart));
    const int st = moe_forward_run(ctx, hstart, y, probs, sel, wts, stats, x, wr, w1, w2,
                                   scratch, &L, n, d, e, k, f, norm_topk);
    free(hstart);
    return st;
}

static int moe_backward_run(sbprt_ctx *ctx, int32_t *hstart, float *dx, float *dwr, float *dw1,
                            float *dw2, const float *dy, const float *x, const float *wr,
                            const float *w1, const float *w2, const float *probs,
                            const int32_t *sel, const float *wts, const float *stats,
                            float *scratch, const sbprt_moe_layout *L, int n, int d, int e, int k,
                            int f, int norm_topk, float aux_scale)
{
    int valid = 0;
    CU_STATUS(moe_sort(ctx, scratch, L, sel, n, e, k, hstart, &valid));
    if (!valid)
        return SBPRT_OK; /* a bad expert index: nothing written, sbprt_sync reports it */
    CU_STATUS(moe_experts(ctx, scratch, L, hstart, x, w1, w2, d, e, k, f));

    float *xs = scratch + L->xs, *h = scratch + L->h, *a = scratch + L->a, *ye = scratch + L->ye;
    float *da = scratch + L->da, *dh = scratch + L->dh, *dw = scratch + L->dw;
    float *dz = scratch + L->dz;
    const int32_t *order = (const int32_t *)(scratch + L->order);
    const int32_t *pos = (const int32_t *)(scratch + L->pos);
    const size_t f2 = 2 * (size_t)f;

    /* per pair: dL/dwts = dy[r] · ye, then ye becomes dye = wts dy[r] */
    CU_LAUNCH(ctx, moe_pair_grad_kernel, cu_blocks(L->nk, MOE_THREADS / 32), MOE_THREADS, 0, dw,
              ye, dy, wts, order, L->nk, d, k);

    /* down projection: dw2[i] += dyeᵀ a, da = dye w2[i] */
    for (int i = 0; i < e; i++) {
        const int c = hstart[i + 1] - hstart[i];
        if (c == 0)
            continue;
        const float *dye_i = ye + (size_t)hstart[i] * d;
        if (dw2)
            CU_STATUS(sbprt_gemm(ctx, dw2 + (size_t)i * d * f, dye_i, a + (size_t)hstart[i] * f,
                                 1, 0, d, f, c, 1.0f, 1.0f));
        if (dw1 || dx)
            CU_STATUS(sbprt_gemm(ctx, da + (size_t)hstart[i] * f, dye_i, w2 + (size_t)i * d * f,
                                 0, 0, c, f, d, 1.0f, 0.0f));
    }

    if (dw1 || dx) {
        CU_LAUNCH(ctx, moe_swiglu_backward_kernel, cu_blocks(L->nk * f, MOE_THREADS),
                  MOE_THREADS, 0, dh, da, h, L->nk, f);
        /* up/gate projection: dw1[i] += dhᵀ xs, then dxs = dh w1[i] over xs (each expert's
         * rows of xs are read by its own dw1 product only, which comes first) */
        for (int i = 0; i < e; i++) {
            const int c = hstart[i + 1] - hstart[i];
            if (c == 0)
                continue;
            const float *dh_i = dh + (size_t)hstart[i] * f2;
            float *xs_i = xs + (size_t)hstart[i] * d;
            if (dw1)
                CU_STATUS(sbprt_gemm(ctx, dw1 + (size_t)i * f2 * d, dh_i, xs_i, 1, 0, (int)f2, d,
                                     c, 1.0f, 1.0f));
            if (dx)
                CU_STATUS(sbprt_gemm(ctx, xs_i, dh_i, w1 + (size_t)i * f2 * d, 0, 0, c, d,
                                     (int)f2, 1.0f, 0.0f));
        }
    }

    if (dx)
        CU_LAUNCH(ctx, moe_scatter_kernel, cu_blocks((size_t)n * d, MOE_THREADS), MOE_THREADS, 0,
                  dx, xs, pos, n, d, k);

    if (!dx && !dwr)
        return SBPRT_OK;
    const int aux = stats && aux_scale != 0.0f;
    CU_LAUNCH(ctx, moe_router_backward_kernel, cu_blocks((size_t)n, MOE_THREADS), MOE_THREADS, 0,
              dz, dw, probs, sel, wts, stats, n, e, k, norm_topk, aux, aux_scale);
    if (dwr)
        CU_STATUS(sbprt_gemm(ctx, dwr, dz, x, 1, 0, e, d, n, 1.0f, 1.0f));
    if (dx)
        CU_STATUS(sbprt_gemm(ctx, dx, dz, wr, 0, 0, n, d, e, 1.0f, 1.0f));
    return SBPRT_OK;
}

extern "C" int sbprt_moe_backward(sbprt_ctx *ctx, float *dx, float *dwr, float *dw1, float *dw2,
                                  const float *dy, const float *x, const float *wr,
                                  const float *w1, const float *w2, const float *probs,
                                  const int32_t *sel, const float *wts, const float *stats,
                                  float *scratch, int n, int d, int e, int k, int f,
                                  int norm_topk, float aux_scale)
{
    CU_CHECK(ctx);
    sbprt_moe_layout L;
    CU_STATUS(sbprt_moe_layout_plan(n, d, e, k, f, &L));
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(dy && x && wr && w1 && w2 && probs && sel && wts && scratch);
    if (!dx && !dwr && !dw1 && !dw2) /* nothing to compute, but sel is still checked */
        return moe_sort(ctx, scratch, &L, sel, n, e, k, NULL, NULL);
    int32_t *hstart;
    CU_STATUS(moe_host_offsets(ctx, e, &hstart));
    const int st = moe_backward_run(ctx, hstart, dx, dwr, dw1, dw2, dy, x, wr, w1, w2, probs, sel,
                                    wts, stats, scratch, &L, n, d, e, k, f, norm_topk, aux_scale);
    free(hstart);
    return st;
}
