/*
 * cuda.h — internals shared by the CUDA backend's files (not part of the public API).
 *
 * The context owns one stream, a cuBLAS handle bound to it, a device-side error flag and a
 * device scratch buffer.  Everything a call queues goes to that stream, so calls on one
 * context run in order and a kernel can reuse the scratch buffer of an earlier call.  A
 * sequence-parallel step also installs a communicator (the caller's all-to-all; seqpar.cu),
 * of which the context keeps a copy.
 *
 * Error handling: every runtime/cuBLAS call goes through CU_TRY / CU_BLAS_TRY and every
 * launch through CU_LAUNCH, which checks cudaGetLastError() right after it; a failure records
 * "file:line: call: error" in ctx->msg (read with sbprt_ctx_last_error) and returns
 * SBPRT_ERR_NOMEM for an allocation failure, SBPRT_ERR_BACKEND otherwise.  Faults inside a
 * kernel surface at the next synchronisation (sbprt_sync or a host copy).  Index tensors live
 * in device memory, so kernels check their ranges themselves and set ctx->dev_flag;
 * sbprt_sync reads it back (see "CUDA notes" in sbprt.h).
 *
 * Kernel code is written once for two compilers: nvcc, and a C++ compiler with
 * -DSBPRT_CUDA_EMU, which swaps the CUDA headers for tests/gpu/emu/cuda_emu.h so the same
 * kernels run on the CPU in the tests.  Hence launches go through CU_LAUNCH instead of <<<>>>,
 * shared arrays are declared with CU_SHARED / CU_SHARED_DYN, and kernels use only what the
 * emulator provides (__syncthreads, __syncwarp, __shfl_sync, __shfl_xor_sync, atomicOr,
 * __fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn, the C math functions).  Warp primitives are always called by all 32 lanes with
 * the full mask; block sizes are multiples of 32.
 *
 * Determinism: no float atomics anywhere.  Reductions use fixed partitions (fixed block
 * sizes, fixed rows or elements per partial, never derived from the device's SM count) and
 * combine partials in a fixed order, so a result is bitwise identical run to run on a given
 * device.  GEMMs are cuBLAS's (deterministic for a given device and toolkit).
 */
#ifndef SBPRT_CUDA_H
#define SBPRT_CUDA_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef SBPRT_CUDA_EMU
#include "cuda_emu.h"
#else
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif

#include "sbprt.h"

struct sbprt_ctx {
    int device;           /* the CUDA device current when the context was created */
    int nthreads;         /* as passed to sbprt_ctx_create (only reported back) */
    cudaStream_t stream;  /* every copy, kernel and GEMM of this context */
    cublasHandle_t blas;  /* bound to stream */
    int tf32;             /* GEMMs may round their inputs to TF32 (sbprt_ctx_set_tf32) */
    int smem_optin;       /* bytes of dynamic shared memory a block may opt in to */
    int *dev_flag;        /* [1] device: nonzero once a kernel found an index out of range */
    int *host_flag;       /* [1] pinned host memory that sbprt_sync copies dev_flag into */
    void *scratch;        /* device scratch, scratch_bytes long, or NULL */
    size_t scratch_bytes; /* capacity of scratch */
    cudaStream_t copy;    /* the transfers of sbprt_copy_async (created on first use) */
    cudaEvent_t queued;   /* recorded on stream before each transfer, which the copy stream
                           * waits for: a transfer starts after what was queued before it */
    cudaEvent_t *events;  /* [SBPRT_COPY_EVENTS] each transfer's completion, created on first use
                           * (NULL until a transfer names it) */
    sbprt_comm comm;      /* sbprt_ctx_set_comm's copy (seqpar.cu); meaningful only when
                           * has_comm */
    int has_comm;         /* 0: no communicator (size 1, rank 0) */
    void *span_dev;       /* the multi-tensor optimizer's span table on the device (optim.cu),
                           * built from span_host; NULL until the first multi-tensor call */
    void *span_host;      /* [span_count] sbprt_span: the list span_dev was built from */
    int span_count;       /* entries of span_host */
    size_t span_cap;      /* bytes of span_dev */
    unsigned long long launches; /* kernels and cuBLAS calls queued on this context so far
                                  * (sbprt_ctx_launches) */
    char msg[320];        /* diagnostic of the last failure on this context, "" if none */
};

#ifdef __cplusplus
extern "C" {
#endif

/* Records the failed call in ctx->msg (ctx may be NULL) and returns the status for it. */
int cu_fail(sbprt_ctx *ctx, cudaError_t err, const char *what, const char *file, int line);
int cu_fail_blas(sbprt_ctx *ctx, cublasStatus_t st, const char *what, const char *file, int line);
/* Records a formatted diagnostic in ctx->msg and returns status. */
int cu_error(sbprt_ctx *ctx, int status, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* cudaMalloc with a diagnostic naming the bytes asked and the bytes free on failure. */
int cu_malloc(sbprt_ctx *ctx, void **out, size_t bytes);
/* Returns ctx's device scratch buffer, grown to at least `bytes` (contents are garbage).
 * Valid until the next call that borrows scratch; growing waits for the stream first. */
int cu_scratch(sbprt_ctx *ctx, size_t bytes, void **out);
/* SBPRT_OK if a packed attention call (forward: backward = 0) with these b, hq, d fits this
 * backend's limits (head size, grid, shared memory); else SBPRT_ERR_INVALID with a message, as
 * the call itself would return (attention.cu). */
int cu_attention_fits(sbprt_ctx *ctx, int b, int hq, int d, int backward);
/* out[0] += (float) Σ parts[i] (double, summed in a fixed order on the device).
 *   out: [1]    parts: [n] (device) */
int cu_sum_doubles_into(sbprt_ctx *ctx, float *out, const double *parts, size_t n);
/* dst[j] += Σ_q parts[q * c + j] over q < nparts, in order of q (second stage of the
 * column-sum reductions: bias, norm parameter gradients).   dst: [c]    parts: [nparts, c] */
int cu_colsum_finish(sbprt_ctx *ctx, float *dst, const float *parts, int nparts, int c);

#ifdef __cplusplus
}
#endif

#define CU_CHECK(cond)                                                                         \
    do {                                                                                       \
        if (!(cond))                                                                           \
            return SBPRT_ERR_INVALID;                                                          \
    } while (0)

#define CU_TRY(ctx, call)                                                                      \
    do {                                                                                       \
        cudaError_t cu_e_ = (call);                                                            \
        if (cu_e_ != cudaSuccess)                                                              \
            return cu_fail((ctx), cu_e_, #call, __FILE__, __LINE__);                           \
    } while (0)

#define CU_BLAS_TRY(ctx, call)                                                                 \
    do {                                                                                       \
        cublasStatus_t cu_s_ = (call);                                                         \
        if (cu_s_ != CUBLAS_STATUS_SUCCESS)                                                    \
            return cu_fail_blas((ctx), cu_s_, #call, __FILE__, __LINE__);                      \
    } while (0)

/* Propagates a nonzero status. */
#define CU_STATUS(call)                                                                        \
    do {                                                                                       \
        int cu_st_ = (call);                                                                   \
        if (cu_st_ != SBPRT_OK)                                                                \
            return cu_st_;                                                                     \
    } while (0)

/* ---- kernel-side helpers (C++) ------------------------------------------------------- */
#ifdef __cplusplus

/* Launches kernel<<<grid, block, smem, ctx->stream>>>(args...) and checks the launch. */
#ifdef SBPRT_CUDA_EMU
#define CU_LAUNCH(ctx, kernel, grid, block, smem, ...)                                         \
    do {                                                                                       \
        emu_launch((const void *)&kernel, dim3(grid), dim3(block), (smem),                     \
                   [&]() { kernel(__VA_ARGS__); });                                            \
        (ctx)->launches++;                                                                     \
        CU_TRY((ctx), cudaGetLastError());                                                     \
    } while (0)
#define CU_SHARED(type, name, count)                                                           \
    static char cu_key_##name;                                                                 \
    type *name = (type *)emu_static_shared(&cu_key_##name, sizeof(type) * (count))
#define CU_SHARED_DYN(type, name) type *name = (type *)emu_dynamic_shared()
#else
#define CU_LAUNCH(ctx, kernel, grid, block, smem, ...)                                         \
    do {                                                                                       \
        kernel<<<(grid), (block), (smem), (ctx)->stream>>>(__VA_ARGS__);                       \
        (ctx)->launches++;                                                                     \
        CU_TRY((ctx), cudaGetLastError());                                                     \
    } while (0)
#define CU_SHARED(type, name, count) __shared__ type name[count]
#define CU_SHARED_DYN(type, name)                                                              \
    extern __shared__ float4 cu_dyn_smem_[];                                                   \
    type *name = (type *)cu_dyn_smem_
#endif

#define CU_FULL_MASK 0xffffffffu
/* Elements per partial of the sums of squares (sbprt_sum_squares, the gradient norms: the CPU
 * twin's block size), summed by CU_SUMSQ_THREADS threads; the partials are summed by one
 * block of CU_SUMSQ_FINAL_THREADS. */
#define CU_SUMSQ_BLOCK 8192
#define CU_SUMSQ_THREADS 256
#define CU_SUMSQ_FINAL_THREADS 1024
#define CU_MAX_BLOCKS 65535u /* cap of a grid-stride loop's grid (x); y and z are capped too */

/* Blocks for a grid-stride loop over n items with `threads` threads per block. */
static inline unsigned cu_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return b < 1 ? 1u : b > CU_MAX_BLOCKS ? CU_MAX_BLOCKS : (unsigned)b;
}

/* Warp-wide sum / max.  A butterfly: every lane ends with the same bits, since each step
 * adds the same two values (in swapped order, and float addition commutes). */
template <class T> __device__ __forceinline__ T cu_warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(CU_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float cu_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        float u = __shfl_xor_sync(CU_FULL_MASK, v, o);
        v = u > v ? u : v;
    }
    return v;
}

/* Block-wide sum (blockDim.x a multiple of 32, at most 1024), returned to every thread.
 * red: a shared array of 32 T.  Starts with a barrier so the same red can serve several
 * reductions in a row. */
template <class T> __device__ __forceinline__ T cu_block_sum(T v, T *red)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cu_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : (T)0;
    return cu_warp_sum(v);
}

/* Σ x[i]² over [i0, i1) in double: each thread sums a strided subset in order, then a fixed
 * tree (one block's partial of sbprt_sum_squares and of the multi-tensor norm, which must
 * agree bit for bit).   red: [32] shared */
__device__ __forceinline__ double cu_sumsq_range(const float *x, size_t i0, size_t i1,
                                                 double *red)
{
    double s = 0;
    for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x)
        s += (double)x[i] * x[i];
    return cu_block_sum(s, red);
}

/* Σ parts[0..n) in double, each thread a strided subset in order, then a fixed tree (the
 * second stage of the sums of squares).   red: [32] shared */
__device__ __forceinline__ double cu_sum_doubles_range(const double *parts, size_t n,
                                                       double *red)
{
    double s = 0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        s += parts[i];
    return cu_block_sum(s, red);
}

__device__ __forceinline__ float cu_block_max(float v, float *red)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cu_warp_max(v);
    __syncthreads();
    if (lane == 0)
        red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : -INFINITY;
    return cu_warp_max(v);
}

/* ---- bf16 storage (the *_bf16 entry points of sbprt.h) --------------------------------
 * cu_bf16 has sbprt_bf16's layout and reads as a float: a kernel written for float data
 * becomes its bf16 twin by being a template over the element type T (float or cu_bf16) of
 * its activation operands.  A read converts exactly (the bits shifted up); an assignment or
 * a compound assignment computes in fp32 and rounds once to nearest even (NaN stays NaN).
 * No CUDA bf16 intrinsics: the same integer code runs in the emulator and on the device,
 * and matches the CPU twin's rounding (cpu/bf16.c) bit for bit. */
__host__ __device__ __forceinline__ float cu_bf16_bits_to_float(uint16_t h)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float((unsigned)h << 16);
#else
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

__host__ __device__ __forceinline__ uint16_t cu_float_to_bf16_bits(float f)
{
#ifdef __CUDA_ARCH__
    uint32_t u = __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
#endif
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

struct cu_bf16 {
    uint16_t bits;
    __host__ __device__ __forceinline__ operator float() const
    {
        return cu_bf16_bits_to_float(bits);
    }
    __host__ __device__ __forceinline__ cu_bf16 &operator=(float v)
    {
        bits = cu_float_to_bf16_bits(v);
        return *this;
    }
    __host__ __device__ __forceinline__ cu_bf16 &operator+=(float v)
    {
        return *this = (float)*this + v;
    }
    __host__ __device__ __forceinline__ cu_bf16 &operator-=(float v)
    {
        return *this = (float)*this - v;
    }
    __host__ __device__ __forceinline__ cu_bf16 &operator*=(float v)
    {
        return *this = (float)*this * v;
    }
};

/* The public bf16 pointers as the kernels' element type (same layout). */
static inline cu_bf16 *cu_bf(sbprt_bf16 *p) { return reinterpret_cast<cu_bf16 *>(p); }
static inline const cu_bf16 *cu_bf(const sbprt_bf16 *p)
{
    return reinterpret_cast<const cu_bf16 *>(p);
}

/* Marks an index error for sbprt_sync. */
__device__ __forceinline__ void cu_flag_range(int *flag) { atomicOr(flag, 1); }

#endif /* __cplusplus */

#endif /* SBPRT_CUDA_H */
