/*
 * optim.cu — parameter updates: SGD and AdamW, as the CPU twin (cpu/optim.c) and torch.optim.
 *
 * The scalar constants are formed on the host exactly as the CPU twin forms them (in double,
 * rounded to fp32 once); the per-element formulas are the CPU twin's, operation by operation,
 * written with the _rn intrinsics: nvcc would otherwise contract a * b + c into one fused
 * multiply-add, which the CPU twin (ISO C, no contraction) never does, and the update would no
 * longer be bitwise the host's (--offload optimizer runs AdamW on the host for a device step,
 * and bf16 weights turn a last-bit difference in a master weight into a different rounding).
 *
 * The multi-tensor forms (sbprt.h) run the same per-element code over a list of spans of the
 * flat blocks in one launch: the launch's blocks are numbered across the spans (each span
 * takes ceil(n / OPT_SPAN_ELEMS) blocks, the table holds each span's first block) and a block
 * finds its span by bisection.  The gradient norm is three launches: every span's partials of
 * CU_SUMSQ_BLOCK elements (the blocks and order of sbprt_grad_sq_norm), each span's partials
 * summed as sbprt_grad_sq_norm sums them, then the span totals added in order by one thread;
 * one copy to the host and one synchronisation.  The table is built on the host and kept on
 * the device (ctx->span_dev): a trainer passes the same list every step, and an upload from
 * pageable memory would wait for the stream each time.
 */
#include "cuda.h"

#define OPT_THREADS 256

#define OPT_SPAN_ELEMS (OPT_THREADS * 16) /* elements per block of the multi-tensor kernels */

/* AdamW's scalars for one step, formed on the host as the CPU twin forms them. */
struct adamw_consts {
    float step_size, bc2_sqrt, decay, w1, w2, b2, eps;
};

__device__ __forceinline__ void sgd_elem(float *param, const float *grad, size_t i, float lr,
                                         float wd)
{
    const float g = wd != 0.0f ? __fadd_rn(grad[i], __fmul_rn(wd, param[i])) : grad[i];
    param[i] = __fsub_rn(param[i], __fmul_rn(lr, g));
}

__device__ __forceinline__ void adamw_elem(float *param, float *m, float *v, const float *grad,
                                           size_t i, const adamw_consts &c)
{
    const float g = grad[i];
    const float p = __fmul_rn(param[i], c.decay);
    /* torch: exp_avg.lerp_(grad, 1 - beta1), with lerp's two formulas */
    const float d = __fsub_rn(g, m[i]);
    const float mi = c.w1 < 0.5f ? __fadd_rn(m[i], __fmul_rn(c.w1, d))
                                 : __fsub_rn(g, __fmul_rn(d, __fsub_rn(1.0f, c.w1)));
    const float vi = __fadd_rn(__fmul_rn(v[i], c.b2), __fmul_rn(__fmul_rn(c.w2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
    m[i] = mi;
    v[i] = vi;
    param[i] = __fsub_rn(p, __fmul_rn(c.step_size, __fdiv_rn(mi, denom)));
}

__global__ void sgd_kernel(float *param, const float *grad, size_t n, float lr, float wd)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        sgd_elem(param, grad, i, lr, wd);
}

__global__ void adamw_kernel(float *param, float *m, float *v, const float *grad, size_t n,
                             adamw_consts c)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        adamw_elem(param, m, v, grad, i, c);
}

static adamw_consts adamw_make(double lr, double beta1, double beta2, double eps,
                               double weight_decay, int step)
{
    const double bc1 = 1.0 - pow(beta1, step);
    const double bc2 = 1.0 - pow(beta2, step);
    adamw_consts c;
    c.step_size = (float)(lr / bc1);
    c.bc2_sqrt = (float)sqrt(bc2);
    c.decay = (float)(1.0 - lr * weight_decay);
    c.w1 = (float)(1.0 - beta1);
    c.w2 = (float)(1.0 - beta2);
    c.b2 = (float)beta2;
    c.eps = (float)eps;
    return c;
}

extern "C" int sbprt_sgd_update(sbprt_ctx *ctx, float *param, const float *grad, size_t n,
                                double lr, double weight_decay)
{
    CU_CHECK(ctx && (n == 0 || (param && grad)));
    if (n == 0)
        return SBPRT_OK;
    CU_LAUNCH(ctx, sgd_kernel, cu_blocks(n, OPT_THREADS), OPT_THREADS, 0, param, grad, n,
              (float)lr, (float)weight_decay);
    return SBPRT_OK;
}

extern "C" int sbprt_adamw_update(sbprt_ctx *ctx, float *param, float *m, float *v,
                                  const float *grad, size_t n, double lr, double beta1,
                                  double beta2, double eps, double weight_decay, int step)
{
    CU_CHECK(ctx && step >= 1);
    CU_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && eps >= 0);
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(param && m && v && grad);
    const adamw_consts c = adamw_make(lr, beta1, beta2, eps, weight_decay, step);
    CU_LAUNCH(ctx, adamw_kernel, cu_blocks(n, OPT_THREADS), OPT_THREADS, 0, param, m, v, grad, n,
              c);
    return SBPRT_OK;
}

/* ---- multi-tensor forms ---------------------------------------------------------------- */

/* One span on the device, with its first block in each numbering. */
struct opt_span {
    size_t param, grad, state, n;
    size_t block0; /* first block of the elementwise kernels (OPT_SPAN_ELEMS a block) */
    size_t part0;  /* first partial of the norm (CU_SUMSQ_BLOCK elements a partial) */
};

/* The device table (ctx->span_dev) for spans: [nspans + 1] entries, the last one holding the
 * totals (block0, part0: the launches' block counts), rebuilt only when the list changed.
 * Spans of 0 elements take no blocks. */
static int opt_spans(sbprt_ctx *ctx, const sbprt_span *spans, int nspans, const opt_span **dev,
                     size_t *nblocks, size_t *nparts)
{
    const size_t host_bytes = (size_t)nspans * sizeof *spans;
    const size_t dev_bytes = ((size_t)nspans + 1) * sizeof(opt_span);
    opt_span *tab = (opt_span *)malloc(dev_bytes);
    if (!tab)
        return cu_error(ctx, SBPRT_ERR_NOMEM, "out of host memory for %d spans", nspans);
    size_t b = 0, q = 0;
    for (int i = 0; i < nspans; i++) {
        const sbprt_span *s = &spans[i];
        tab[i].param = s->param;
        tab[i].grad = s->grad;
        tab[i].state = s->state;
        tab[i].n = s->n;
        tab[i].block0 = b;
        tab[i].part0 = q;
        b += (s->n + OPT_SPAN_ELEMS - 1) / OPT_SPAN_ELEMS;
        q += (s->n + CU_SUMSQ_BLOCK - 1) / CU_SUMSQ_BLOCK;
    }
    memset(&tab[nspans], 0, sizeof tab[nspans]);
    tab[nspans].block0 = b;
    tab[nspans].part0 = q;
    *nblocks = b;
    *nparts = q;
    int st = SBPRT_OK;
    const bool same = ctx->span_dev && ctx->span_count == nspans &&
                      (host_bytes == 0 || memcmp(ctx->span_host, spans, host_bytes) == 0);
    if (!same) {
        void *copy = malloc(host_bytes ? host_bytes : 1);
        if (!copy) {
            free(tab);
            return cu_error(ctx, SBPRT_ERR_NOMEM, "out of host memory for %d spans", nspans);
        }
        memcpy(copy, spans, host_bytes);
        if (ctx->span_cap < dev_bytes) {
            /* the old table may still be read by queued kernels */
            cudaError_t e = cudaStreamSynchronize(ctx->stream);
            if (e == cudaSuccess) {
                (void)cudaFree(ctx->span_dev);
                ctx->span_dev = NULL;
                ctx->span_cap = 0;
                st = cu_malloc(ctx, &ctx->span_dev, dev_bytes);
                if (st == SBPRT_OK)
                    ctx->span_cap = dev_bytes;
            } else {
                st = cu_fail(ctx, e, "cudaStreamSynchronize", __FILE__, __LINE__);
            }
        }
        if (st == SBPRT_OK) {
            cudaError_t e = cudaMemcpyAsync(ctx->span_dev, tab, dev_bytes,
                                            cudaMemcpyHostToDevice, ctx->stream);
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(ctx->stream); /* tab is freed below */
            if (e != cudaSuccess)
                st = cu_fail(ctx, e, "cudaMemcpyAsync (the span table)", __FILE__, __LINE__);
        }
        free(ctx->span_host);
        ctx->span_host = st == SBPRT_OK ? copy : NULL;
        ctx->span_count = st == SBPRT_OK ? nspans : 0;
        if (st != SBPRT_OK)
            free(copy);
    }
    free(tab);
    *dev = (const opt_span *)ctx->span_dev;
    return st;
}

/* The span whose blocks (numbering: 0 elementwise, 1 norm partials) hold block blk. */
__device__ __forceinline__ int opt_find(const opt_span *tab, int nspans, size_t blk, int norm)
{
    int lo = 0, hi = nspans - 1; /* the last span starting at or before blk */
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if ((norm ? tab[mid].part0 : tab[mid].block0) <= blk)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Elements [e0, e1) of the span that holds this block, as offsets into the span. */
__device__ __forceinline__ const opt_span *opt_block(const opt_span *tab, int nspans, size_t *e0,
                                                     size_t *e1)
{
    const opt_span *s = &tab[opt_find(tab, nspans, blockIdx.x, 0)];
    *e0 = (blockIdx.x - s->block0) * OPT_SPAN_ELEMS;
    *e1 = *e0 + OPT_SPAN_ELEMS < s->n ? *e0 + OPT_SPAN_ELEMS : s->n;
    return s;
}

__global__ void sgd_multi_kernel(float *params, const float *grads, const opt_span *tab,
                                 int nspans, float lr, float wd)
{
    size_t e0, e1;
    const opt_span *s = opt_block(tab, nspans, &e0, &e1);
    for (size_t i = e0 + threadIdx.x; i < e1; i += blockDim.x)
        sgd_elem(params + s->param, grads + s->grad, i, lr, wd);
}

__global__ void adamw_multi_kernel(float *params, float *m, float *v, const float *grads,
                                   const opt_span *tab, int nspans, adamw_consts c)
{
    size_t e0, e1;
    const opt_span *s = opt_block(tab, nspans, &e0, &e1);
    for (size_t i = e0 + threadIdx.x; i < e1; i += blockDim.x)
        adamw_elem(params + s->param, m + s->state, v + s->state, grads + s->grad, i, c);
}

/* grads = alpha * grads (sbprt_scale's one rounded product). */
__global__ void scale_multi_kernel(float *grads, const opt_span *tab, int nspans, float alpha)
{
    size_t e0, e1;
    const opt_span *s = opt_block(tab, nspans, &e0, &e1);
    float *g = grads + s->grad;
    for (size_t i = e0 + threadIdx.x; i < e1; i += blockDim.x)
        g[i] = alpha * g[i];
}

/* partial[q] for every partial q of every span: sumsq_part_kernel's (elementwise.cu). */
__global__ void sumsq_multi_kernel(double *partial, const float *grads, const opt_span *tab,
                                   int nspans)
{
    CU_SHARED(double, red, 32);
    const opt_span *s = &tab[opt_find(tab, nspans, blockIdx.x, 1)];
    const size_t i0 = (blockIdx.x - s->part0) * CU_SUMSQ_BLOCK;
    const size_t i1 = i0 + CU_SUMSQ_BLOCK < s->n ? i0 + CU_SUMSQ_BLOCK : s->n;
    const double t = cu_sumsq_range(grads + s->grad, i0, i1, red);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = t;
}

/* total[i] = span i's partials summed as sum_doubles_f64_kernel sums them (a block a span). */
__global__ void sumsq_spans_kernel(double *total, const double *partial, const opt_span *tab,
                                   int nspans)
{
    CU_SHARED(double, red, 32);
    for (int i = blockIdx.x; i < nspans; i += gridDim.x) {
        const double t = cu_sum_doubles_range(partial + tab[i].part0,
                                              tab[i + 1].part0 - tab[i].part0, red);
        if (threadIdx.x == 0)
            total[i] = t;
        __syncthreads(); /* red is reused by the next span */
    }
}

/* out[0] = total[0] + total[1] + ... in order from 0 (the host loop's sum; spans of no
 * elements add nothing, as the per-tensor call returns before adding). */
__global__ void sum_in_order_kernel(double *out, const double *total, const opt_span *tab,
                                    int nspans)
{
    if (threadIdx.x != 0)
        return;
    double s = 0;
    for (int i = 0; i < nspans; i++)
        if (tab[i].n > 0)
            s += total[i];
    out[0] = s;
}

/* What every multi-tensor call does first: the span list checked, its device table (opt_spans)
 * and the blocks of the launch, *nblocks (norm: the partials' count), checked against the grid;
 * *nblocks = 0: nothing to do. */
static int opt_prepare(sbprt_ctx *ctx, const sbprt_span *spans, int nspans, int norm,
                       const opt_span **tab, size_t *nblocks)
{
    CU_CHECK(ctx && nspans >= 0 && (nspans == 0 || spans));
    size_t elem = 0, parts = 0;
    CU_STATUS(opt_spans(ctx, spans, nspans, tab, &elem, &parts));
    *nblocks = norm ? parts : elem;
    if (*nblocks > 0x7fffffffu)
        return cu_error(ctx, SBPRT_ERR_INVALID, "multi-tensor call of %zu blocks: beyond the grid",
                        *nblocks);
    return SBPRT_OK;
}

extern "C" int sbprt_grad_sq_norm_multi(sbprt_ctx *ctx, double *out, const float *grads,
                                        const sbprt_span *spans, int nspans)
{
    CU_CHECK(out);
    const opt_span *tab;
    size_t nparts;
    CU_STATUS(opt_prepare(ctx, spans, nspans, 1, &tab, &nparts));
    if (nparts == 0)
        return SBPRT_OK; /* *out += 0 */
    CU_CHECK(grads);
    double *partial, total = 0; /* partial: [nparts] partials, [nspans] totals, [1] sum */
    CU_STATUS(cu_scratch(ctx, (nparts + (size_t)nspans + 1) * sizeof(double), (void **)&partial));
    double *totals = partial + nparts, *sum = totals + nspans;
    CU_LAUNCH(ctx, sumsq_multi_kernel, (unsigned)nparts, CU_SUMSQ_THREADS, 0, partial, grads, tab,
              nspans);
    const unsigned g = nspans < (int)CU_MAX_BLOCKS ? (unsigned)nspans : CU_MAX_BLOCKS;
    CU_LAUNCH(ctx, sumsq_spans_kernel, g, CU_SUMSQ_FINAL_THREADS, 0, totals, partial, tab, nspans);
    CU_LAUNCH(ctx, sum_in_order_kernel, 1, 32, 0, sum, totals, tab, nspans);
    CU_TRY(ctx, cudaMemcpyAsync(&total, sum, sizeof total, cudaMemcpyDeviceToHost, ctx->stream));
    CU_TRY(ctx, cudaStreamSynchronize(ctx->stream));
    *out += total;
    return SBPRT_OK;
}

extern "C" int sbprt_scale_multi(sbprt_ctx *ctx, float *grads, const sbprt_span *spans,
                                 int nspans, float alpha)
{
    const opt_span *tab;
    size_t nblocks;
    CU_STATUS(opt_prepare(ctx, spans, nspans, 0, &tab, &nblocks));
    if (nblocks == 0)
        return SBPRT_OK;
    CU_CHECK(grads);
    CU_LAUNCH(ctx, scale_multi_kernel, (unsigned)nblocks, OPT_THREADS, 0, grads, tab, nspans,
              alpha);
    return SBPRT_OK;
}

extern "C" int sbprt_sgd_update_multi(sbprt_ctx *ctx, float *params, const float *grads,
                                      const sbprt_span *spans, int nspans, double lr,
                                      double weight_decay)
{
    const opt_span *tab;
    size_t nblocks;
    CU_STATUS(opt_prepare(ctx, spans, nspans, 0, &tab, &nblocks));
    if (nblocks == 0)
        return SBPRT_OK;
    CU_CHECK(params && grads);
    CU_LAUNCH(ctx, sgd_multi_kernel, (unsigned)nblocks, OPT_THREADS, 0, params, grads, tab, nspans,
              (float)lr, (float)weight_decay);
    return SBPRT_OK;
}

extern "C" int sbprt_adamw_update_multi(sbprt_ctx *ctx, float *params, float *m, float *v,
                                        const float *grads, const sbprt_span *spans, int nspans,
                                        double lr, double beta1, double beta2, double eps,
                                        double weight_decay, int step)
{
    CU_CHECK(step >= 1);
    CU_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && eps >= 0);
    const opt_span *tab;
    size_t nblocks;
    CU_STATUS(opt_prepare(ctx, spans, nspans, 0, &tab, &nblocks));
    if (nblocks == 0)
        return SBPRT_OK;
    CU_CHECK(params && m && v && grads);
    const adamw_consts c = adamw_make(lr, beta1, beta2, eps, weight_decay, step);
    CU_LAUNCH(ctx, adamw_multi_kernel, (unsigned)nblocks, OPT_THREADS, 0, params, m, v, grads, tab,
              nspans, c);
    return SBPRT_OK;
}
