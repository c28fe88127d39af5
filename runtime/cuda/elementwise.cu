/*
 * elementwise.cu — flat elementwise helpers and activation functions, forward and backward.
 *
 * One grid-stride kernel serves every elementwise function: it switches on an op code that
 * is the same for the whole launch (no divergence), which keeps this file to one kernel
 * instantiation.  The scalar formulas are the CPU twin's (cpu/elementwise.c) written again
 * for the device; nvcc's default FMA contraction can change a last bit, nothing more.
 *
 * The bf16 entry points run the same kernel on cu_bf16 elements (cuda.h): each element is
 * read as fp32, computed in fp32 and rounded once when stored.
 *
 * sbprt_sum_squares is the one reduction: blocks of EW_SUMSQ_BLOCK elements (the CPU twin's
 * block size) are summed in double by one thread block each, in a fixed tree order; then one
 * block adds the block sums in a fixed order (cu_sum_doubles_into, shared with the losses).
 */
#include "cuda.h"

#define EW_THREADS 256
#define EW_SUMSQ_BLOCK CU_SUMSQ_BLOCK
#define EW_FINAL_THREADS 1024
static_assert(EW_THREADS == CU_SUMSQ_THREADS && EW_FINAL_THREADS == CU_SUMSQ_FINAL_THREADS,
              "the multi-tensor norm (optim.cu) sums as sbprt_grad_sq_norm does");

#define EW_SQRT_2_OVER_PI 0.7978845608028654f /* √(2/π) */
#define EW_INV_SQRT_2 0.7071067811865476f     /* 1/√2 */
#define EW_INV_SQRT_2PI 0.3989422804014327f   /* 1/√(2π) */
#define EW_GELU_CUBIC 0.044715f

__device__ __forceinline__ float ew_gelu_tanh(float x)
{
    float u = EW_SQRT_2_OVER_PI * (x + EW_GELU_CUBIC * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

__device__ __forceinline__ float ew_gelu_tanh_grad(float x)
{
    float u = EW_SQRT_2_OVER_PI * (x + EW_GELU_CUBIC * x * x * x);
    float t = tanhf(u);
    float du = EW_SQRT_2_OVER_PI * (1.0f + 3.0f * EW_GELU_CUBIC * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

__device__ __forceinline__ float ew_gelu_erf(float x)
{
    return 0.5f * x * (1.0f + erff(x * EW_INV_SQRT_2));
}

__device__ __forceinline__ float ew_gelu_erf_grad(float x)
{
    return 0.5f * (1.0f + erff(x * EW_INV_SQRT_2)) + x * EW_INV_SQRT_2PI * expf(-0.5f * x * x);
}

__device__ __forceinline__ float ew_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* The Sigmoid op's own form, as the CPU twin's ew_sigmoid_stable: e^-|x| never overflows, and
 * for x < 0 the quotient e^x / (1 + e^x) keeps the tiny values that 1 / (1 + e^-x) flushes to 0
 * once e^-x overflows.  SiLU and SwiGLU keep ew_sigmoid, as on the CPU. */
__device__ __forceinline__ float ew_sigmoid_stable(float x)
{
    float t = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + t) : t / (1.0f + t);
}

__device__ __forceinline__ float ew_silu_grad(float x)
{
    float s = ew_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

enum ew_op {
    EW_ADD,          /* out = a + b */
    EW_ACCUMULATE,   /* out += a */
    EW_SCALE,        /* out = a * alpha */
    EW_SCALE_ACC,    /* out += a * alpha */
    EW_DIV,          /* out = a / alpha */
    EW_DIV_ACC,      /* out += a / alpha */
    EW_GELU_TANH,    /* out = gelu_tanh(a) */
    EW_GELU_TANH_BW, /* out += b * gelu_tanh'(a)   (a: x, b: dout) */
    EW_GELU_ERF,
    EW_GELU_ERF_BW,
    EW_SILU,
    EW_SILU_BW,
    EW_SWIGLU,          /* out = silu(a) * b           (a: gate, b: up) */
    EW_SWIGLU_BW_GATE,  /* out += c * b * silu'(a)     (c: dout) */
    EW_SWIGLU_BW_UP,    /* out += c * silu(a) */
    EW_RELU,            /* out = max(a, 0), NaN kept */
    EW_RELU_BW,         /* out += a > 0 ? b : 0        (a: x or y, b: dout) */
    EW_TANH,
    EW_TANH_BW,         /* out += b * (1 - a²)         (a: y = tanh(x), b: dout) */
    EW_SIGMOID,         /* out = sigmoid(a), the stable form */
    EW_SIGMOID_BW,      /* out += b * (a (1 - a))      (a: y = sigmoid(x), b: dout) */
};

/* Every operand is indexed by the same i, and each element reads its inputs before it
 * writes out, so out may alias an input wherever the API allows it. */
template <class T>
__global__ void ew_kernel(int op, T *out, const T *a, const T *b, const T *c, float alpha, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        switch (op) {
        case EW_ADD: out[i] = a[i] + b[i]; break;
        case EW_ACCUMULATE: out[i] += a[i]; break;
        /* __fmul_rn: the product rounded before the sum, as the CPU twin (and the broadcast
         * kernels these replace for scalar constants) round it, never contracted into an FMA */
        case EW_SCALE: out[i] = __fmul_rn(a[i], alpha); break;
        case EW_SCALE_ACC: out[i] += __fmul_rn(a[i], alpha); break;
        case EW_DIV: out[i] = (float)a[i] / alpha; break;
        case EW_DIV_ACC: out[i] += (float)a[i] / alpha; break;
        case EW_GELU_TANH: out[i] = ew_gelu_tanh(a[i]); break;
        case EW_GELU_TANH_BW: out[i] += b[i] * ew_gelu_tanh_grad(a[i]); break;
        case EW_GELU_ERF: out[i] = ew_gelu_erf(a[i]); break;
        case EW_GELU_ERF_BW: out[i] += b[i] * ew_gelu_erf_grad(a[i]); break;
        case EW_SILU: out[i] = a[i] * ew_sigmoid(a[i]); break;
        case EW_SILU_BW: out[i] += b[i] * ew_silu_grad(a[i]); break;
        case EW_SWIGLU: out[i] = a[i] * ew_sigmoid(a[i]) * b[i]; break;
        case EW_SWIGLU_BW_GATE: out[i] += c[i] * b[i] * ew_silu_grad(a[i]); break;
        case EW_SWIGLU_BW_UP: out[i] += c[i] * a[i] * ew_sigmoid(a[i]); break;
        case EW_RELU: out[i] = (float)a[i] < 0.0f ? 0.0f : (float)a[i]; break;
        case EW_RELU_BW: out[i] += (float)a[i] > 0.0f ? (float)b[i] : 0.0f; break;
        case EW_TANH: out[i] = tanhf(a[i]); break;
        case EW_TANH_BW: out[i] += b[i] * (1.0f - a[i] * a[i]); break;
        case EW_SIGMOID: out[i] = ew_sigmoid_stable(a[i]); break;
        case EW_SIGMOID_BW: out[i] += b[i] * ((float)a[i] * (1.0f - a[i])); break;
        }
    }
}

template <class T>
static int ew_run(sbprt_ctx *ctx, int op, T *out, const T *a, const T *b, const T *c, float alpha,
                  size_t n)
{
    if (n == 0)
        return SBPRT_OK;
    CU_LAUNCH(ctx, ew_kernel<T>, cu_blocks(n, EW_THREADS), EW_THREADS, 0, op, out, a, b, c, alpha,
              n);
    return SBPRT_OK;
}

extern "C" int sbprt_add(sbprt_ctx *ctx, float *out, const float *a, const float *b, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (out && a && b)));
    return ew_run<float>(ctx, EW_ADD, out, a, b, NULL, 0, n);
}

extern "C" int sbprt_accumulate(sbprt_ctx *ctx, float *y, const float *x, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (y && x)));
    return ew_run<float>(ctx, EW_ACCUMULATE, y, x, NULL, NULL, 0, n);
}

/* The public pointer as the kernel's element type: itself, or cu_bf16 (cu_bf). */
static inline float *ew_el(float *p) { return p; }
static inline const float *ew_el(const float *p) { return p; }
static inline cu_bf16 *ew_el(sbprt_bf16 *p) { return cu_bf(p); }
static inline const cu_bf16 *ew_el(const sbprt_bf16 *p) { return cu_bf(p); }

#define EW_SCALAR(name, T, E, op)                                                              \
    extern "C" int name(sbprt_ctx *ctx, T *out, const T *x, size_t n, float c)                 \
    {                                                                                          \
        CU_CHECK(ctx && (n == 0 || (out && x)));                                               \
        return ew_run<E>(ctx, op, ew_el(out), ew_el(x), NULL, NULL, c, n);                     \
    }
EW_SCALAR(sbprt_scale, float, float, EW_SCALE)
EW_SCALAR(sbprt_scale_accumulate, float, float, EW_SCALE_ACC)
EW_SCALAR(sbprt_div_scalar, float, float, EW_DIV)
EW_SCALAR(sbprt_div_scalar_accumulate, float, float, EW_DIV_ACC)
EW_SCALAR(sbprt_scale_bf16, sbprt_bf16, cu_bf16, EW_SCALE)
EW_SCALAR(sbprt_scale_accumulate_bf16, sbprt_bf16, cu_bf16, EW_SCALE_ACC)
EW_SCALAR(sbprt_div_scalar_bf16, sbprt_bf16, cu_bf16, EW_DIV)
EW_SCALAR(sbprt_div_scalar_accumulate_bf16, sbprt_bf16, cu_bf16, EW_DIV_ACC)

extern "C" int sbprt_gelu_tanh_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (out && x)));
    return ew_run<float>(ctx, EW_GELU_TANH, out, x, NULL, NULL, 0, n);
}

extern "C" int sbprt_gelu_tanh_backward(sbprt_ctx *ctx, float *dx, const float *dout,
                                        const float *x, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (dx && dout && x)));
    return ew_run<float>(ctx, EW_GELU_TANH_BW, dx, x, dout, NULL, 0, n);
}

extern "C" int sbprt_gelu_erf_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (out && x)));
    return ew_run<float>(ctx, EW_GELU_ERF, out, x, NULL, NULL, 0, n);
}

extern "C" int sbprt_gelu_erf_backward(sbprt_ctx *ctx, float *dx, const float *dout,
                                       const float *x, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (dx && dout && x)));
    return ew_run<float>(ctx, EW_GELU_ERF_BW, dx, x, dout, NULL, 0, n);
}

extern "C" int sbprt_silu_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (out && x)));
    return ew_run<float>(ctx, EW_SILU, out, x, NULL, NULL, 0, n);
}

extern "C" int sbprt_silu_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *x,
                                   size_t n)
{
    CU_CHECK(ctx && (n == 0 || (dx && dout && x)));
    return ew_run<float>(ctx, EW_SILU_BW, dx, x, dout, NULL, 0, n);
}

extern "C" int sbprt_relu_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (out && x)));
    return ew_run<float>(ctx, EW_RELU, out, x, NULL, NULL, 0, n);
}

extern "C" int sbprt_relu_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *x,
                                   size_t n)
{
    CU_CHECK(ctx && (n == 0 || (dx && dout && x)));
    return ew_run<float>(ctx, EW_RELU_BW, dx, x, dout, NULL, 0, n);
}

extern "C" int sbprt_tanh_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (out && x)));
    return ew_run<float>(ctx, EW_TANH, out, x, NULL, NULL, 0, n);
}

extern "C" int sbprt_tanh_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *y,
                                   size_t n)
{
    CU_CHECK(ctx && (n == 0 || (dx && dout && y)));
    return ew_run<float>(ctx, EW_TANH_BW, dx, y, dout, NULL, 0, n);
}

extern "C" int sbprt_sigmoid_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (out && x)));
    return ew_run<float>(ctx, EW_SIGMOID, out, x, NULL, NULL, 0, n);
}

extern "C" int sbprt_sigmoid_backward(sbprt_ctx *ctx, float *dx, const float *dout,
                                      const float *y, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (dx && dout && y)));
    return ew_run<float>(ctx, EW_SIGMOID_BW, dx, y, dout, NULL, 0, n);
}

extern "C" int sbprt_swiglu_forward(sbprt_ctx *ctx, float *out, const float *gate,
                                    const float *up, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (out && gate && up)));
    return ew_run<float>(ctx, EW_SWIGLU, out, gate, up, NULL, 0, n);
}

extern "C" int sbprt_swiglu_backward(sbprt_ctx *ctx, float *dgate, float *dup, const float *dout,
                                     const float *gate, const float *up, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (dout && gate && up)));
    if (dgate)
        CU_STATUS(ew_run(ctx, EW_SWIGLU_BW_GATE, dgate, gate, up, dout, 0, n));
    if (dup)
        CU_STATUS(ew_run(ctx, EW_SWIGLU_BW_UP, dup, gate, up, dout, 0, n));
    return SBPRT_OK;
}

/* ---- bf16 (the same kernel on cu_bf16 elements: fp32 arithmetic, one rounding) --------- */

#define EW_BF16_FWD(name, op)                                                                  \
    extern "C" int name(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n)        \
    {                                                                                          \
        CU_CHECK(ctx && (n == 0 || (out && x)));                                               \
        return ew_run<cu_bf16>(ctx, op, cu_bf(out), cu_bf(x), NULL, NULL, 0, n);               \
    }
#define EW_BF16_BWD(name, op)                                                                  \
    extern "C" int name(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,                \
                        const sbprt_bf16 *x, size_t n)                                         \
    {                                                                                          \
        CU_CHECK(ctx && (n == 0 || (dx && dout && x)));                                        \
        return ew_run<cu_bf16>(ctx, op, cu_bf(dx), cu_bf(x), cu_bf(dout), NULL, 0, n);         \
    }
EW_BF16_FWD(sbprt_gelu_tanh_forward_bf16, EW_GELU_TANH)
EW_BF16_BWD(sbprt_gelu_tanh_backward_bf16, EW_GELU_TANH_BW)
EW_BF16_FWD(sbprt_gelu_erf_forward_bf16, EW_GELU_ERF)
EW_BF16_BWD(sbprt_gelu_erf_backward_bf16, EW_GELU_ERF_BW)
EW_BF16_FWD(sbprt_silu_forward_bf16, EW_SILU)
EW_BF16_BWD(sbprt_silu_backward_bf16, EW_SILU_BW)
EW_BF16_FWD(sbprt_relu_forward_bf16, EW_RELU)
EW_BF16_BWD(sbprt_relu_backward_bf16, EW_RELU_BW)
EW_BF16_FWD(sbprt_tanh_forward_bf16, EW_TANH)
EW_BF16_BWD(sbprt_tanh_backward_bf16, EW_TANH_BW) /* x is y here: the forward's output */

extern "C" int sbprt_add_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *a,
                              const sbprt_bf16 *b, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (out && a && b)));
    return ew_run<cu_bf16>(ctx, EW_ADD, cu_bf(out), cu_bf(a), cu_bf(b), NULL, 0, n);
}

extern "C" int sbprt_accumulate_bf16(sbprt_ctx *ctx, sbprt_bf16 *y, const sbprt_bf16 *x, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (y && x)));
    return ew_run<cu_bf16>(ctx, EW_ACCUMULATE, cu_bf(y), cu_bf(x), NULL, NULL, 0, n);
}

extern "C" int sbprt_swiglu_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *gate,
                                         const sbprt_bf16 *up, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (out && gate && up)));
    return ew_run<cu_bf16>(ctx, EW_SWIGLU, cu_bf(out), cu_bf(gate), cu_bf(up), NULL, 0, n);
}

extern "C" int sbprt_swiglu_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dgate, sbprt_bf16 *dup,
                                          const sbprt_bf16 *dout, const sbprt_bf16 *gate,
                                          const sbprt_bf16 *up, size_t n)
{
    CU_CHECK(ctx && (n == 0 || (dout && gate && up)));
    if (dgate)
        CU_STATUS(ew_run<cu_bf16>(ctx, EW_SWIGLU_BW_GATE, cu_bf(dgate), cu_bf(gate), cu_bf(up),
                                  cu_bf(dout), 0, n));
    if (dup)
        CU_STATUS(ew_run<cu_bf16>(ctx, EW_SWIGLU_BW_UP, cu_bf(dup), cu_bf(gate), cu_bf(up),
                                  cu_bf(dout), 0, n));
    return SBPRT_OK;
}

/* dst[i] = bf16(src[i]) (the cu_bf16 assignment rounds), and back (exact). */
__global__ void to_bf16_kernel(cu_bf16 *dst, const float *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

__global__ void from_bf16_kernel(float *dst, const cu_bf16 *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

extern "C" int sbprt_convert_f32_to_bf16(sbprt_ctx *ctx, sbprt_bf16 *dst, const float *src,
                                         size_t n)
{
    CU_CHECK(ctx && (n == 0 || (dst && src)));
    if (n == 0)
        return SBPRT_OK;
    CU_LAUNCH(ctx, to_bf16_kernel, cu_blocks(n, EW_THREADS), EW_THREADS, 0, cu_bf(dst), src, n);
    return SBPRT_OK;
}

extern "C" int sbprt_convert_bf16_to_f32(sbprt_ctx *ctx, float *dst, const sbprt_bf16 *src,
                                         size_t n)
{
    CU_CHECK(ctx && (n == 0 || (dst && src)));
    if (n == 0)
        return SBPRT_OK;
    CU_LAUNCH(ctx, from_bf16_kernel, cu_blocks(n, EW_THREADS), EW_THREADS, 0, dst, cu_bf(src), n);
    return SBPRT_OK;
}

/* ---- sum of squares ------------------------------------------------------------------- */

/* partial[blk] = Σ x[i]² over block blk of EW_SUMSQ_BLOCK elements, in double. */
__global__ void sumsq_part_kernel(double *partial, const float *x, size_t n)
{
    CU_SHARED(double, red, 32);
    const size_t i0 = (size_t)blockIdx.x * EW_SUMSQ_BLOCK;
    const size_t i1 = i0 + EW_SUMSQ_BLOCK < n ? i0 + EW_SUMSQ_BLOCK : n;
    const double s = cu_sumsq_range(x, i0, i1, red);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = s;
}

/* One block: out[0] += (float) Σ parts, each thread summing a fixed strided subset in order,
 * then a fixed tree. */
__global__ void sum_doubles_kernel(float *out, const double *parts, size_t n)
{
    CU_SHARED(double, red, 32);
    double s = 0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        s += parts[i];
    s = cu_block_sum(s, red);
    if (threadIdx.x == 0)
        out[0] += (float)s;
}

extern "C" int cu_sum_doubles_into(sbprt_ctx *ctx, float *out, const double *parts, size_t n)
{
    CU_LAUNCH(ctx, sum_doubles_kernel, 1, EW_FINAL_THREADS, 0, out, parts, n);
    return SBPRT_OK;
}

extern "C" int sbprt_sum_squares(sbprt_ctx *ctx, float *out, const float *x, size_t n)
{
    CU_CHECK(ctx && out && (n == 0 || x));
    if (n == 0)
        return SBPRT_OK; /* out[0] += 0 */
    const size_t nblocks = (n + EW_SUMSQ_BLOCK - 1) / EW_SUMSQ_BLOCK;
    CU_CHECK(nblocks <= 0x7fffffffu);
    double *partial;
    CU_STATUS(cu_scratch(ctx, nblocks * sizeof(double), (void **)&partial));
    CU_LAUNCH(ctx, sumsq_part_kernel, (unsigned)nblocks, EW_THREADS, 0, partial, x, n);
    return cu_sum_doubles_into(ctx, out, partial, nblocks);
}

/* One block: out[0] = Σ parts in double (sum_doubles_kernel's order, not rounded to fp32). */
__global__ void sum_doubles_f64_kernel(double *out, const double *parts, size_t n)
{
    CU_SHARED(double, red, 32);
    const double s = cu_sum_doubles_range(parts, n, red);
    if (threadIdx.x == 0)
        out[0] = s;
}

/* sbprt_sum_squares's blocks and order, the total kept in double and copied to the host. */
extern "C" int sbprt_grad_sq_norm(sbprt_ctx *ctx, double *out, const float *x, size_t n)
{
    CU_CHECK(ctx && out && (n == 0 || x));
    if (n == 0)
        return SBPRT_OK; /* *out += 0 */
    const size_t nblocks = (n + EW_SUMSQ_BLOCK - 1) / EW_SUMSQ_BLOCK;
    CU_CHECK(nblocks <= 0x7fffffffu);
    double *partial, total = 0;
    CU_STATUS(cu_scratch(ctx, (nblocks + 1) * sizeof(double), (void **)&partial));
    CU_LAUNCH(ctx, sumsq_part_kernel, (unsigned)nblocks, EW_THREADS, 0, partial, x, n);
    CU_LAUNCH(ctx, sum_doubles_f64_kernel, 1, EW_FINAL_THREADS, 0, partial + nblocks, partial,
              nblocks);
    CU_TRY(ctx, cudaMemcpyAsync(&total, partial + nblocks, sizeof total, cudaMemcpyDeviceToHost,
                                ctx->stream));
    CU_TRY(ctx, cudaStreamSynchronize(ctx->stream));
    *out += total;
    return SBPRT_OK;
}
