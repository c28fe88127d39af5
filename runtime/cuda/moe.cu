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
 * and the gate/up activations from x, as the twin does, and, as it, never the experts' outputs:
 * the routing weights' gradient goes through the down projection's input gradient.  A forward
 * without y runs the router alone.
 *
 * LoRA on the experts (sbprt_moe_lora_forward / _backward; the plain calls are these without
 * adapters) adds, after each expert's dense GEMM of an adapted projection, the adapter's two
 * thin GEMMs (rows · A_iᵀ, then · B_iᵀ times scale), and in the backward the three of their
 * gradients, in the twin's order.  PEFT's B interleaves the experts' columns, so a kernel
 * copies it expert-major into scratch first and another adds the per-expert tiles of its
 * gradient back, one thread per element of B (no atomics), skipping experts with no rows.
 *
 * Determinism: every output element is written by one thread, which sums its terms in a fixed
 * order (the k choices of a row in choice order, a dot product in a fixed lane tree); the
 * statistics reduce each expert's probabilities in double over a fixed block tree; there are
 * no atomics but the index-error flag.  So results are bitwise equal run to run.
 *
 * All temporaries live in the caller's scratch (sbprt_moe_scratch_floats floats, or
 * sbprt_moe_lora_scratch_floats with adapters), carved into the twin's pieces (moe_layout.h).
 * The sort's per-chunk counters borrow the dz piece ([n, e]), which only the backward's router
 * stage uses, after the sort is done.
 */
#include <stdlib.h>
#include <string.h>

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

/* One warp per sorted pair p of pair q = order[p]: with G = da[p] (dy of its row through the
 * expert's down projection) and u = a[p], dw[q] = G · u (need_g; lanes over columns, then a
 * butterfly), and G, ye[p] (dy of the row) and g[p] (the down adapter's scale dy B, when given)
 * take the routing weight wts[q] (each lane rewrites only what it read).
 *   dw: [nk]    da, a: [nk, f]    ye: [nk, d]    g: [nk, r] or NULL */
__global__ void moe_pair_weight_kernel(float *dw, float *da, float *ye, float *g, const float *a,
                                       const float *wts, const int32_t *order, size_t nk, int d,
                                       int f, int r, int need_g)
{
    const int lane = threadIdx.x & 31;
    const size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
    for (size_t p = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; p < nk;
         p += warps) { /* warp-uniform */
        const int32_t q = order[p];
        const float w = wts[q];
        if (need_g) {
            float *gp = da + p * f;
            const float *ap = a + p * f;
            float s = 0;
            for (int c = lane; c < f; c += 32) {
                s += gp[c] * ap[c];
                gp[c] *= w;
            }
            s = cu_warp_sum(s);
            if (lane == 0)
                dw[q] = s;
        }
        for (int c = lane; c < d; c += 32)
            ye[p * d + c] *= w;
        if (g)
            for (int c = lane; c < r; c += 32)
                g[p * r + c] *= w;
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

/* ---- LoRA kernels ------------------------------------------------------------------------
 * PEFT stores expert i's B factor as the columns j e + i (j < r) of b [out, r e], so one expert's
 * factor is strided by e.  These two kernels move it to and from expert-major tiles [e, out, r]
 * so that every GEMM operand is dense.  Both walk b in its own order (i fastest): the gather's
 * reads and the scatter's read-modify-writes are the coalesced side. */

/* bg[i, o, j] = b[o, j e + i].   bg: [e, out, r]    b: [out, r e] */
__global__ void moe_lora_gather_kernel(float *bg, const float *b, int e, int out, int r)
{
    const size_t total = (size_t)out * r * e;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (size_t)gridDim.x * blockDim.x) {
        const size_t i = t % e, j = (t / e) % r, o = t / ((size_t)e * r);
        bg[(i * out + o) * r + j] = b[t];
    }
}

/* b[o, j e + i] += db[i, o, j] for the experts i that received rows (start[i + 1] > start[i]);
 * the tiles of the others were never written.  One thread per element of b, one addition each,
 * so the result does not depend on the launch shape.
 *   b: [out, r e]    db: [e, out, r]    start: [e + 1] (device) */
__global__ void moe_lora_scatter_kernel(float *b, const float *db, const int32_t *start, int e,
                                        int out, int r)
{
    const size_t total = (size_t)out * r * e;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (size_t)gridDim.x * blockDim.x) {
        const size_t i = t % e, j = (t / e) % r, o = t / ((size_t)e * r);
        if (start[i + 1] != start[i])
            b[t] += db[(i * out + o) * r + j];
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

/* LoRA on the experts: one adapted projection, u [c, in] -> [c, out] per expert, with its
 * factors, gradients and temporaries.  Projection 0 is the gate/up one (in d, out 2f, on xs),
 * projection 1 the down one (in f, out d, on a).  The twin (cpu/moe.c) runs the same GEMMs in
 * the same order on the same operands, so the two differ only inside the GEMMs. */
typedef struct moe_lora_proj {
    const float *a; /* A stacked by expert [e r, in]; NULL: the projection is not adapted */
    const float *b; /* B as PEFT lays it out [out, r e] */
    float *da, *db; /* their gradients (backward), same shapes; NULL: not wanted */
    float *t, *g;   /* scratch [nk, r]: u Aᵀ per sorted pair, then scale · dout B */
    float *bg;      /* scratch [e, out, r]: b expert-major */
    float *dbg;     /* scratch [e, out, r]: each expert's share of db, before the scatter */
    int in, out;
} moe_lora_proj;

typedef struct moe_lora {
    moe_lora_proj p[2];
    int r;       /* the rank; 0: no adapter at all (the plain layer) */
    float scale; /* alpha / r */
} moe_lora;

/* Checks the adapters' arguments as the twin does (each A with its B; with any adapter a rank
 * whose pieces fit) and, with one, carves their pieces out of scratch.  lo->r = 0: none. */
static int moe_lora_plan(moe_lora *lo, float *scratch, const float *a1, const float *b1,
                         const float *a2, const float *b2, int n, int d, int e, int k, int f,
                         int r, float scale)
{
    memset(lo, 0, sizeof *lo);
    CU_CHECK(!a1 == !b1 && !a2 == !b2);
    if (!a1 && !a2)
        return SBPRT_OK;
    sbprt_moe_lora_layout LL;
    CU_STATUS(sbprt_moe_lora_layout_plan(n, d, e, k, f, r, &LL));
    lo->r = r;
    lo->scale = scale;
    const float *as[2] = {a1, a2}, *bs[2] = {b1, b2};
    const size_t t[2] = {LL.t1, LL.t2}, g[2] = {LL.g1, LL.g2};
    const size_t bg[2] = {LL.bg1, LL.bg2}, dbg[2] = {LL.db1, LL.db2};
    const int in[2] = {d, f}, out[2] = {2 * f, d};
    for (int q = 0; q < 2; q++) {
        moe_lora_proj *pj = &lo->p[q];
        pj->a = as[q];
        pj->b = bs[q];
        pj->in = in[q];
        pj->out = out[q];
        if (scratch) { /* NULL only with n = 0, when nothing runs */
            pj->t = scratch + t[q];
            pj->g = scratch + g[q];
            pj->bg = scratch + bg[q];
            pj->dbg = scratch + dbg[q];
        }
    }
    return SBPRT_OK;
}

/* b -> bg for each adapted projection (queued before the experts' GEMMs read it). */
static int moe_lora_gather(sbprt_ctx *ctx, const moe_lora *lo, int e)
{
    for (int q = 0; q < 2; q++) {
        const moe_lora_proj *pj = &lo->p[q];
        if (!pj->a)
            continue;
        const size_t total = (size_t)pj->out * lo->r * e;
        CU_LAUNCH(ctx, moe_lora_gather_kernel, cu_blocks(total, MOE_THREADS), MOE_THREADS, 0,
                  pj->bg, pj->b, e, pj->out, lo->r);
    }
    return SBPRT_OK;
}

/* Expert i's adapter on its c rows from sorted position s0: t_i = u A_iᵀ [c, r] (kept: the
 * backward's db reads it), then y [c, out] += scale · t_i B_iᵀ, on top of the dense product
 * already in y.  Factored, so the per-expert delta B_i A_i [out, in] never exists. */
static int moe_lora_forward_proj(sbprt_ctx *ctx, const moe_lora *lo, const moe_lora_proj *pj,
                                 int i, int s0, int c, const float *u, float *y)
{
    const int r = lo->r;
    float *ti = pj->t + (size_t)s0 * r;
    CU_STATUS(sbprt_gemm(ctx, ti, u, pj->a + (size_t)i * r * pj->in, 0, 1, c, r, pj->in, 1.0f,
                         0.0f));
    return sbprt_gemm(ctx, y, ti, pj->bg + (size_t)i * pj->out * r, 0, 1, c, pj->out, r,
                      lo->scale, 1.0f);
}

/* The factors' gradients for expert i from dout [c, out] (its rows of the sorted pairs) and u:
 *   dB_i = scale · doutᵀ t_i  [out, r]   written to its tile of dbg (scattered into db later);
 *   g_i  = scale · dout B_i   [c, r]     kept when the input gradient (need_g) or dA needs it;
 *   dA_i += g_iᵀ u            [r, in]    straight into da (A_i is a contiguous block of rows).
 * The input gradient's share, du += g_i A_i, is moe_lora_input_grad, run once du holds the
 * dense product. */
static int moe_lora_backward_proj(sbprt_ctx *ctx, const moe_lora *lo, const moe_lora_proj *pj,
                                  int i, int s0, int c, const float *u, const float *dout,
                                  int need_g)
{
    const int r = lo->r;
    const float *ti = pj->t + (size_t)s0 * r;
    float *gi = pj->g + (size_t)s0 * r;
    if (pj->db)
        CU_STATUS(sbprt_gemm(ctx, pj->dbg + (size_t)i * pj->out * r, dout, ti, 1, 0, pj->out, r,
                             c, lo->scale, 0.0f));
    if (need_g || pj->da)
        CU_STATUS(sbprt_gemm(ctx, gi, dout, pj->bg + (size_t)i * pj->out * r, 0, 0, c, r,
                             pj->out, lo->scale, 0.0f));
    if (pj->da)
        CU_STATUS(sbprt_gemm(ctx, pj->da + (size_t)i * r * pj->in, gi, u, 1, 0, r, pj->in, c,
                             1.0f, 1.0f));
    return SBPRT_OK;
}

/* du [c, in] += g_i A_i: the adapter's share of the projection's input gradient. */
static int moe_lora_input_grad(sbprt_ctx *ctx, const moe_lora *lo, const moe_lora_proj *pj,
                               int i, int s0, int c, float *du)
{
    const int r = lo->r;
    return sbprt_gemm(ctx, du, pj->g + (size_t)s0 * r, pj->a + (size_t)i * r * pj->in, 0, 0, c,
                      pj->in, r, 1.0f, 1.0f);
}

/* db += the tiles of dbg, for the experts that received rows (start: the device offsets). */
static int moe_lora_scatter(sbprt_ctx *ctx, const moe_lora *lo, const moe_lora_proj *pj,
                            const int32_t *start, int e)
{
    const size_t total = (size_t)pj->out * lo->r * e;
    CU_LAUNCH(ctx, moe_lora_scatter_kernel, cu_blocks(total, MOE_THREADS), MOE_THREADS, 0,
              pj->db, pj->dbg, start, e, pj->out, lo->r);
    return SBPRT_OK;
}

/* The experts over the sorted pairs: xs gathered from x, h = xs w1ᵀ, a = swiglu(h),
 * ye = a w2ᵀ, per expert one GEMM each over its rows (hstart: the offsets on the host), each
 * followed by its adapter's two thin GEMMs when lo adapts that projection (lo NULL: none).
 * down 0 (the backward's recomputation): no ye, only the down adapter's t = a A_iᵀ.
 *   x: [n, d]    w1: [e, 2f, d]    w2: [e, d, f] */
static int moe_experts(sbprt_ctx *ctx, float *scratch, const sbprt_moe_layout *L,
                       const moe_lora *lo, const int32_t *hstart, const float *x,
                       const float *w1, const float *w2, int d, int e, int k, int f, int down)
{
    float *xs = scratch + L->xs, *h = scratch + L->h, *a = scratch + L->a;
    float *ye = scratch + L->ye;
    const int32_t *order = (const int32_t *)(scratch + L->order);
    const size_t f2 = 2 * (size_t)f;
    const moe_lora_proj *up = lo && lo->p[0].a ? &lo->p[0] : NULL;
    const moe_lora_proj *dn = lo && lo->p[1].a ? &lo->p[1] : NULL;
    CU_LAUNCH(ctx, moe_gather_kernel, cu_blocks(L->nk * d, MOE_THREADS), MOE_THREADS, 0, xs, x,
              order, L->nk, d, k);
    for (int i = 0; i < e; i++) {
        const int s0 = hstart[i], c = hstart[i + 1] - s0;
        if (c == 0)
            continue;
        float *h_i = h + (size_t)s0 * f2;
        const float *xs_i = xs + (size_t)s0 * d;
        CU_STATUS(sbprt_gemm(ctx, h_i, xs_i, w1 + (size_t)i * f2 * d, 0, 1, c, (int)f2, d, 1.0f,
                             0.0f));
        if (up)
            CU_STATUS(moe_lora_forward_proj(ctx, lo, up, i, s0, c, xs_i, h_i));
    }
    CU_LAUNCH(ctx, moe_swiglu_kernel, cu_blocks(L->nk * f, MOE_THREADS), MOE_THREADS, 0, a, h,
              L->nk, f);
    for (int i = 0; i < e; i++) {
        const int s0 = hstart[i], c = hstart[i + 1] - s0;
        if (c == 0 || (!down && !dn))
            continue;
        float *ye_i = ye + (size_t)s0 * d;
        const float *a_i = a + (size_t)s0 * f;
        if (!down) {
            CU_STATUS(sbprt_gemm(ctx, dn->t + (size_t)s0 * lo->r, a_i,
                                 dn->a + (size_t)i * lo->r * f, 0, 1, c, lo->r, f, 1.0f, 0.0f));
            continue;
        }
        CU_STATUS(sbprt_gemm(ctx, ye_i, a_i, w2 + (size_t)i * d * f, 0, 1, c, d, f, 1.0f, 0.0f));
        if (dn)
            CU_STATUS(moe_lora_forward_proj(ctx, lo, dn, i, s0, c, a_i, ye_i));
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

static int moe_forward_run(sbprt_ctx *ctx, int32_t *hstart, const moe_lora *lo, float *y,
                           float *probs, int32_t *sel, float *wts, float *stats, const float *x,
                           const float *wr, const float *w1, const float *w2, float *scratch,
                           const sbprt_moe_layout *L, int n, int d, int e, int k, int f,
                           int norm_topk)
{
    /* router: logits straight into probs, then softmax and top-k per row */
    CU_STATUS(sbprt_gemm(ctx, probs, x, wr, 0, 1, n, e, d, 1.0f, 0.0f));
    CU_LAUNCH(ctx, moe_route_kernel, cu_blocks((size_t)n, MOE_THREADS), MOE_THREADS, 0, probs,
              sel, wts, n, e, k, norm_topk);
    if (!y && !stats)
        return SBPRT_OK; /* the routing alone, and nothing to count */
    if (!y) { /* the counts only: the sort, with no host copy of its offsets */
        CU_STATUS(moe_sort(ctx, scratch, L, sel, n, e, k, NULL, NULL));
    } else {
        int valid = 0;
        CU_STATUS(moe_sort(ctx, scratch, L, sel, n, e, k, hstart, &valid));
        if (!valid)
            return SBPRT_OK; /* not reached: the routing above only writes valid experts */
        CU_STATUS(moe_experts(ctx, scratch, L, lo, hstart, x, w1, w2, d, e, k, f, 1));
        CU_LAUNCH(ctx, moe_combine_kernel, cu_blocks((size_t)n * d, MOE_THREADS), MOE_THREADS, 0,
                  y, scratch + L->ye, (const int32_t *)(scratch + L->pos), wts, n, d, k);
    }
    if (stats) {
        const unsigned blocks = (unsigned)e < CU_MAX_BLOCKS ? (unsigned)e : CU_MAX_BLOCKS;
        CU_LAUNCH(ctx, moe_stats_kernel, blocks, MOE_THREADS, 0, stats, probs,
                  (const int32_t *)(scratch + L->start), n, e);
    }
    return SBPRT_OK;
}

/* The plain layer is the LoRA one without adapters: one code path, as in the twin. */
extern "C" int sbprt_moe_forward(sbprt_ctx *ctx, float *y, float *probs, int32_t *sel,
                                 float *wts, float *stats, const float *x, const float *wr,
                                 const float *w1, const float *w2, float *scratch, int n, int d,
                                 int e, int k, int f, int norm_topk)
{
    return sbprt_moe_lora_forward(ctx, y, probs, sel, wts, stats, x, wr, w1, w2, NULL, NULL,
                                  NULL, NULL, scratch, n, d, e, k, f, norm_topk, 0, 0.0f);
}

extern "C" int sbprt_moe_lora_forward(sbprt_ctx *ctx, float *y, float *probs, int32_t *sel,
                                      float *wts, float *stats, const float *x, const float *wr,
                                      const float *w1, const float *w2, const float *a1,
                                      const float *b1, const float *a2, const float *b2,
                                      float *scratch, int n, int d, int e, int k, int f,
                                      int norm_topk, int r, float scale)
{
    CU_CHECK(ctx);
    sbprt_moe_layout L;
    CU_STATUS(sbprt_moe_layout_plan(n, d, e, k, f, &L));
    CU_CHECK(n == 0 || scratch);
    moe_lora lo;
    CU_STATUS(moe_lora_plan(&lo, scratch, a1, b1, a2, b2, n, d, e, k, f, r, scale));
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(probs && sel && wts && x && wr && (!y || (w1 && w2)));
    if (lo.r && y)
        CU_STATUS(moe_lora_gather(ctx, &lo, e));
    int32_t *hstart;
    CU_STATUS(moe_host_offsets(ctx, e, &hstart));
    const int st = moe_forward_run(ctx, hstart, lo.r ? &lo : NULL, y, probs, sel, wts, stats, x,
                                   wr, w1, w2, scratch, &L, n, d, e, k, f, norm_topk);
    free(hstart);
    return st;
}

static int moe_backward_run(sbprt_ctx *ctx, int32_t *hstart, const moe_lora *lo, float *dx,
                            float *dwr, float *dw1, float *dw2, const float *dy, const float *x,
                            const float *wr, const float *w1, const float *w2,
                            const float *probs, const int32_t *sel, const float *wts,
                            const float *stats, float *scratch, const sbprt_moe_layout *L, int n,
                            int d, int e, int k, int f, int norm_topk, float aux_scale)
{
    int valid = 0;
    CU_STATUS(moe_sort(ctx, scratch, L, sel, n, e, k, hstart, &valid));
    if (!valid)
        return SBPRT_OK; /* a bad expert index: nothing written, sbprt_sync reports it */
    CU_STATUS(moe_experts(ctx, scratch, L, lo, hstart, x, w1, w2, d, e, k, f, 0));

    float *xs = scratch + L->xs, *h = scratch + L->h, *a = scratch + L->a, *ye = scratch + L->ye;
    float *da = scratch + L->da, *dh = scratch + L->dh, *dw = scratch + L->dw;
    float *dz = scratch + L->dz;
    const int32_t *order = (const int32_t *)(scratch + L->order);
    const int32_t *pos = (const int32_t *)(scratch + L->pos);
    const int32_t *dstart = (const int32_t *)(scratch + L->start);
    const size_t f2 = 2 * (size_t)f;
    /* the adapted projections, and whether their factors want a gradient */
    const moe_lora_proj *up = lo && lo->p[0].a ? &lo->p[0] : NULL;
    const moe_lora_proj *down = lo && lo->p[1].a ? &lo->p[1] : NULL;
    const int up_g = up && (up->da || up->db);

    /* The down projection, as the twin: G = dy[r] W of each pair (W the expert's effective
     * down projection, dy unweighted) into da, dL/dwts = G · u, then G, dy and the adapter's g
     * weighted; the weight gradients from the weighted dy.  dh (and so da) is needed by dw1,
     * by dx and by the gate/up adapter's factors, G also by the router. */
    const int need_dh = dw1 || dx || up_g;
    const int need_g = need_dh || dwr;
    const int lora_gd = down && (need_g || down->da);
    const int r = lo ? lo->r : 0;
    CU_LAUNCH(ctx, moe_gather_kernel, cu_blocks(L->nk * d, MOE_THREADS), MOE_THREADS, 0, ye, dy,
              order, L->nk, d, k);
    for (int i = 0; i < e && (need_g || lora_gd); i++) {
        const int s0 = hstart[i], c = hstart[i + 1] - s0;
        if (c == 0)
            continue;
        const float *dys_i = ye + (size_t)s0 * d;
        float *da_i = da + (size_t)s0 * f;
        if (lora_gd)
            CU_STATUS(sbprt_gemm(ctx, down->g + (size_t)s0 * r, dys_i,
                                 down->bg + (size_t)i * d * r, 0, 0, c, r, d, lo->scale, 0.0f));
        if (need_g) {
            CU_STATUS(sbprt_gemm(ctx, da_i, dys_i, w2 + (size_t)i * d * f, 0, 0, c, f, d, 1.0f,
                                 0.0f));
            if (down)
                CU_STATUS(moe_lora_input_grad(ctx, lo, down, i, s0, c, da_i));
        }
    }
    CU_LAUNCH(ctx, moe_pair_weight_kernel, cu_blocks(L->nk, MOE_THREADS / 32), MOE_THREADS, 0,
              dw, da, ye, lora_gd ? down->g : (float *)NULL, a, wts, order, L->nk, d, f, r,
              need_g);
    for (int i = 0; i < e; i++) {
        const int s0 = hstart[i], c = hstart[i + 1] - s0;
        if (c == 0)
            continue;
        const float *dye_i = ye + (size_t)s0 * d, *a_i = a + (size_t)s0 * f;
        if (dw2)
            CU_STATUS(sbprt_gemm(ctx, dw2 + (size_t)i * d * f, dye_i, a_i, 1, 0, d, f, c, 1.0f,
                                 1.0f));
        if (down && down->db)
            CU_STATUS(sbprt_gemm(ctx, down->dbg + (size_t)i * d * r, dye_i,
                                 down->t + (size_t)s0 * r, 1, 0, d, r, c, lo->scale, 0.0f));
        if (down && down->da)
            CU_STATUS(sbprt_gemm(ctx, down->da + (size_t)i * r * f, down->g + (size_t)s0 * r,
                                 a_i, 1, 0, r, f, c, 1.0f, 1.0f));
    }
    if (down && down->db)
        CU_STATUS(moe_lora_scatter(ctx, lo, down, dstart, e));

    if (need_dh) {
        CU_LAUNCH(ctx, moe_swiglu_backward_kernel, cu_blocks(L->nk * f, MOE_THREADS),
                  MOE_THREADS, 0, dh, da, h, L->nk, f);
        /* up/gate projection: the adapter's factors and dw1[i] += dhᵀ xs, then dxs = dh w1[i]
         * over xs (each expert's rows of xs are read only by its own products above it) */
        for (int i = 0; i < e; i++) {
            const int s0 = hstart[i], c = hstart[i + 1] - s0;
            if (c == 0)
                continue;
            const float *dh_i = dh + (size_t)s0 * f2;
            float *xs_i = xs + (size_t)s0 * d;
            if (up && (up_g || dx))
                CU_STATUS(moe_lora_backward_proj(ctx, lo, up, i, s0, c, xs_i, dh_i, dx != NULL));
            if (dw1)
                CU_STATUS(sbprt_gemm(ctx, dw1 + (size_t)i * f2 * d, dh_i, xs_i, 1, 0, (int)f2, d,
                                     c, 1.0f, 1.0f));
            if (dx) {
                CU_STATUS(sbprt_gemm(ctx, xs_i, dh_i, w1 + (size_t)i * f2 * d, 0, 0, c, d,
                                     (int)f2, 1.0f, 0.0f));
                if (up)
                    CU_STATUS(moe_lora_input_grad(ctx, lo, up, i, s0, c, xs_i));
            }
        }
        if (up && up->db)
            CU_STATUS(moe_lora_scatter(ctx, lo, up, dstart, e));
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
    return sbprt_moe_lora_backward(ctx, dx, dwr, dw1, dw2, NULL, NULL, NULL, NULL, dy, x, wr,
                                   w1, w2, NULL, NULL, NULL, NULL, probs, sel, wts, stats,
                                   scratch, n, d, e, k, f, norm_topk, aux_scale, 0, 0.0f);
}

extern "C" int sbprt_moe_lora_backward(sbprt_ctx *ctx, float *dx, float *dwr, float *dw1,
                                       float *dw2, float *da1, float *db1, float *da2,
                                       float *db2, const float *dy, const float *x,
                                       const float *wr, const float *w1, const float *w2,
                                       const float *a1, const float *b1, const float *a2,
                                       const float *b2, const float *probs, const int32_t *sel,
                                       const float *wts, const float *stats, float *scratch,
                                       int n, int d, int e, int k, int f, int norm_topk,
                                       float aux_scale, int r, float scale)
{
    CU_CHECK(ctx);
    sbprt_moe_layout L;
    CU_STATUS(sbprt_moe_layout_plan(n, d, e, k, f, &L));
    CU_CHECK(n == 0 || scratch);
    moe_lora lo;
    CU_STATUS(moe_lora_plan(&lo, scratch, a1, b1, a2, b2, n, d, e, k, f, r, scale));
    if (n == 0)
        return SBPRT_OK;
    /* a projection without an adapter has no factor gradients, whatever was passed */
    if (lo.p[0].a) {
        lo.p[0].da = da1;
        lo.p[0].db = db1;
    }
    if (lo.p[1].a) {
        lo.p[1].da = da2;
        lo.p[1].db = db2;
    }
    const int lora_g = lo.p[0].da || lo.p[0].db || lo.p[1].da || lo.p[1].db;
    CU_CHECK(dy && x && wr && w1 && w2 && probs && sel && wts);
    if (!dx && !dwr && !dw1 && !dw2 && !lora_g) /* nothing to compute, but sel is still checked */
        return moe_sort(ctx, scratch, &L, sel, n, e, k, NULL, NULL);
    if (lo.r)
        CU_STATUS(moe_lora_gather(ctx, &lo, e));
    int32_t *hstart;
    CU_STATUS(moe_host_offsets(ctx, e, &hstart));
    const int st = moe_backward_run(ctx, hstart, lo.r ? &lo : NULL, dx, dwr, dw1, dw2, dy, x, wr,
                                    w1, w2, probs, sel, wts, stats, scratch, &L, n, d, e, k, f,
                                    norm_topk, aux_scale);
    free(hstart);
    return st;
}
