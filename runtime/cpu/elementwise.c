/*
 * elementwise.c — flat elementwise helpers and activation functions, forward and backward.
 *
 * Each element depends on the same element of the inputs only, so a static split of the
 * index range over threads cannot change any result.  The one reduction (sum of squares)
 * sums fixed-size blocks, whose boundaries do not depend on the thread count, and adds the
 * block sums in order on one thread.
 */
#include <math.h>

#include "cpu.h"

/* Elements per block of sbprt_sum_squares. */
#define EW_SUMSQ_BLOCK 8192

/* The body runs once per index i in [0, n) (n: the enclosing function's element count),
 * split statically over ctx's threads when n is large enough to pay for the fork. */
#define EW_FOR(body)                                                                           \
    do {                                                                                       \
        _Pragma("omp parallel for schedule(static) num_threads(ctx->nthreads) if (n >= CPU_PARALLEL_MIN)") \
        for (size_t i = 0; i < n; i++) {                                                       \
            body;                                                                              \
        }                                                                                      \
    } while (0)

int sbprt_add(sbprt_ctx *ctx, float *out, const float *a, const float *b, size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (out && a && b)));
    EW_FOR(out[i] = a[i] + b[i]);
    return SBPRT_OK;
}

int sbprt_accumulate(sbprt_ctx *ctx, float *y, const float *x, size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (y && x)));
    EW_FOR(y[i] += x[i]);
    return SBPRT_OK;
}

/* The product (quotient) is its own statement: under clang's default -ffp-contract=on an
 * expression `dx[i] += alpha * dy[i]` may become one fused multiply-add, which rounds once
 * where sbprt_broadcast_backward rounds twice (see sbprt.h). */
int sbprt_scale(sbprt_ctx *ctx, float *out, const float *x, size_t n, float alpha)
{
    CPU_CHECK(ctx && (n == 0 || (out && x)));
    EW_FOR(out[i] = alpha * x[i]);
    return SBPRT_OK;
}

int sbprt_scale_accumulate(sbprt_ctx *ctx, float *dx, const float *dy, size_t n, float alpha)
{
    CPU_CHECK(ctx && (n == 0 || (dx && dy)));
    EW_FOR(float d = alpha * dy[i]; dx[i] += d);
    return SBPRT_OK;
}

int sbprt_div_scalar(sbprt_ctx *ctx, float *out, const float *x, size_t n, float divisor)
{
    CPU_CHECK(ctx && (n == 0 || (out && x)));
    EW_FOR(out[i] = x[i] / divisor);
    return SBPRT_OK;
}

int sbprt_div_scalar_accumulate(sbprt_ctx *ctx, float *dx, const float *dy, size_t n,
                                float divisor)
{
    CPU_CHECK(ctx && (n == 0 || (dx && dy)));
    EW_FOR(float d = dy[i] / divisor; dx[i] += d);
    return SBPRT_OK;
}

/* Σ x² in double: fixed blocks summed in parallel, the block sums added in order. */
static int sum_squares_f64(sbprt_ctx *ctx, const float *x, size_t n, double *total)
{
    size_t nblocks = (n + EW_SUMSQ_BLOCK - 1) / EW_SUMSQ_BLOCK;
    double *partial;
    int st = cpu_scratch(ctx, (nblocks ? nblocks : 1) * sizeof(double), (void **)&partial);
    if (st)
        return st;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) if (nblocks > 1)
    for (size_t blk = 0; blk < nblocks; blk++) {
        size_t i0 = blk * EW_SUMSQ_BLOCK;
        size_t i1 = i0 + EW_SUMSQ_BLOCK < n ? i0 + EW_SUMSQ_BLOCK : n;
        double s = 0;
        for (size_t i = i0; i < i1; i++)
            s += (double)x[i] * x[i];
        partial[blk] = s;
    }
    double t = 0;
    for (size_t blk = 0; blk < nblocks; blk++)
        t += partial[blk];
    *total = t;
    return SBPRT_OK;
}

int sbprt_sum_squares(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CPU_CHECK(ctx && out && (n == 0 || x));
    double total;
    int st = sum_squares_f64(ctx, x, n, &total);
    if (st)
        return st;
    out[0] += (float)total;
    return SBPRT_OK;
}

int sbprt_grad_sq_norm(sbprt_ctx *ctx, double *out, const float *x, size_t n)
{
    CPU_CHECK(ctx && out && (n == 0 || x));
    double total;
    int st = sum_squares_f64(ctx, x, n, &total);
    if (st)
        return st;
    *out += total;
    return SBPRT_OK;
}

/* The per-span totals added in order from 0, then into *out (sbprt.h). */
int sbprt_grad_sq_norm_multi(sbprt_ctx *ctx, double *out, const float *grads,
                             const sbprt_span *spans, int nspans)
{
    CPU_CHECK(ctx && out && nspans >= 0 && (nspans == 0 || spans));
    double sum = 0;
    for (int i = 0; i < nspans; i++) {
        if (spans[i].n == 0)
            continue;
        CPU_CHECK(grads);
        double total;
        int st = sum_squares_f64(ctx, grads + spans[i].grad, spans[i].n, &total);
        if (st)
            return st;
        sum += total;
    }
    *out += sum;
    return SBPRT_OK;
}

int sbprt_scale_multi(sbprt_ctx *ctx, float *grads, const sbprt_span *spans, int nspans,
                      float alpha)
{
    CPU_CHECK(ctx && nspans >= 0 && (nspans == 0 || spans));
    for (int i = 0; i < nspans; i++) {
        if (spans[i].n == 0)
            continue;
        CPU_CHECK(grads);
        float *g = grads + spans[i].grad;
        int st = sbprt_scale(ctx, g, g, spans[i].n, alpha);
        if (st)
            return st;
    }
    return SBPRT_OK;
}

/* ---- activations -------------------------------------------------------------------- */

#define EW_SQRT_2_OVER_PI 0.7978845608028654f  /* √(2/π) */
#define EW_INV_SQRT_2 0.7071067811865476f      /* 1/√2 */
#define EW_INV_SQRT_2PI 0.3989422804014327f    /* 1/√(2π) */
#define EW_GELU_CUBIC 0.044715f

static inline float ew_gelu_tanh(float x)
{
    float u = EW_SQRT_2_OVER_PI * (x + EW_GELU_CUBIC * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

static inline float ew_gelu_tanh_grad(float x)
{
    float u = EW_SQRT_2_OVER_PI * (x + EW_GELU_CUBIC * x * x * x);
    float t = tanhf(u);
    float du = EW_SQRT_2_OVER_PI * (1.0f + 3.0f * EW_GELU_CUBIC * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

static inline float ew_gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * EW_INV_SQRT_2)); }

static inline float ew_gelu_erf_grad(float x)
{
    return 0.5f * (1.0f + erff(x * EW_INV_SQRT_2)) + x * EW_INV_SQRT_2PI * expf(-0.5f * x * x);
}

/* For very negative x, expf(-x) overflows to +inf and the sigmoid correctly becomes 0. */
static inline float ew_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* The Sigmoid op's own form (Qwen2-MoE's shared-expert gate, for one): e^-|x| never
 * overflows, and for x < 0 the quotient e^x / (1 + e^x) keeps the tiny values that
 * 1 / (1 + e^-x) flushes to 0 once e^-x overflows (x < -88.7).  SiLU and SwiGLU keep
 * ew_sigmoid: there x * sigmoid(x) underflows long before it matters, and their bits stay
 * as they were. */
static inline float ew_sigmoid_stable(float x)
{
    float t = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + t) : t / (1.0f + t);
}

static inline float ew_silu_grad(float x)
{
    float s = ew_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

int sbprt_gelu_tanh_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (out && x)));
    EW_FOR(out[i] = ew_gelu_tanh(x[i]));
    return SBPRT_OK;
}

int sbprt_gelu_tanh_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *x,
                             size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (dx && dout && x)));
    EW_FOR(dx[i] += dout[i] * ew_gelu_tanh_grad(x[i]));
    return SBPRT_OK;
}

int sbprt_gelu_erf_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (out && x)));
    EW_FOR(out[i] = ew_gelu_erf(x[i]));
    return SBPRT_OK;
}

int sbprt_gelu_erf_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *x,
                            size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (dx && dout && x)));
    EW_FOR(dx[i] += dout[i] * ew_gelu_erf_grad(x[i]));
    return SBPRT_OK;
}

int sbprt_silu_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (out && x)));
    EW_FOR(out[i] = x[i] * ew_sigmoid(x[i]));
    return SBPRT_OK;
}

int sbprt_silu_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *x, size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (dx && dout && x)));
    EW_FOR(dx[i] += dout[i] * ew_silu_grad(x[i]));
    return SBPRT_OK;
}

/* `x < 0 ? 0 : x` rather than `x > 0 ? x : 0`: a NaN input stays NaN instead of being hidden
 * as 0 (ONNX Relu is max(0, x), and torch propagates NaN). */
int sbprt_relu_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (out && x)));
    EW_FOR(out[i] = x[i] < 0.0f ? 0.0f : x[i]);
    return SBPRT_OK;
}

/* A select, not dout * mask: an inf or NaN gradient where the unit is off adds nothing, as
 * torch's threshold_backward. */
int sbprt_relu_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *x, size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (dx && dout && x)));
    EW_FOR(dx[i] += x[i] > 0.0f ? dout[i] : 0.0f);
    return SBPRT_OK;
}

int sbprt_tanh_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (out && x)));
    EW_FOR(out[i] = tanhf(x[i]));
    return SBPRT_OK;
}

int sbprt_tanh_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *y, size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (dx && dout && y)));
    EW_FOR(dx[i] += dout[i] * (1.0f - y[i] * y[i]));
    return SBPRT_OK;
}

int sbprt_sigmoid_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (out && x)));
    EW_FOR(out[i] = ew_sigmoid_stable(x[i]));
    return SBPRT_OK;
}

int sbprt_sigmoid_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *y,
                           size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (dx && dout && y)));
    EW_FOR(dx[i] += dout[i] * (y[i] * (1.0f - y[i])));
    return SBPRT_OK;
}

int sbprt_swiglu_forward(sbprt_ctx *ctx, float *out, const float *gate, const float *up,
                         size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (out && gate && up)));
    EW_FOR(out[i] = gate[i] * ew_sigmoid(gate[i]) * up[i]);
    return SBPRT_OK;
}

int sbprt_swiglu_backward(sbprt_ctx *ctx, float *dgate, float *dup, const float *dout,
                          const float *gate, const float *up, size_t n)
{
    CPU_CHECK(ctx && (n == 0 || (dout && gate && up)));
    if (dgate)
        EW_FOR(dgate[i] += dout[i] * up[i] * ew_silu_grad(gate[i]));
    if (dup)
        EW_FOR(dup[i] += dout[i] * gate[i] * ew_sigmoid(gate[i]));
    return SBPRT_OK;
}
