/*
 * ctx.c — context, memory, synchronisation, options and diagnostics of the CUDA backend.
 *
 * A context binds one stream and one cuBLAS handle on the device that is current when it is
 * created.  Host<->device copies wait for the stream, so host data is usable (or reusable)
 * as soon as sbprt_memcpy returns, as on the CPU backend; device->device copies and memsets
 * are queued.  The arena and the scratch buffer are plain cudaMalloc allocations (256-byte
 * aligned, which covers SBPRT_ALIGN).  Failures never print: they return a status and leave
 * a one-line diagnostic that sbprt_ctx_last_error returns — for an allocation, the bytes
 * asked and the bytes the device had free; for a machine without a usable device, a message
 * that starts with "no CUDA device".  sbprt_device_memory is cudaMemGetInfo.  The context
 * also holds the communicator of a sequence-parallel step (sbprt_ctx_set_comm; seqpar.cu).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"

/* Diagnostic of the last failed sbprt_ctx_create on this thread (there is no context to
 * hold it); sbprt_ctx_last_error(NULL) returns it. */
static _Thread_local char cu_create_msg[320];

const char *sbprt_status_string(int status)
{
    switch (status) {
    case SBPRT_OK: return "ok";
    case SBPRT_ERR_INVALID: return "invalid argument";
    case SBPRT_ERR_RANGE: return "index out of range";
    case SBPRT_ERR_NOMEM: return "out of memory";
    case SBPRT_ERR_BACKEND: return "backend failure";
    default: return "unknown status";
    }
}

const char *sbprt_backend_name(void) { return "cuda"; }

static const char *cu_basename(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int cu_error(sbprt_ctx *ctx, int status, const char *fmt, ...)
{
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->msg, sizeof ctx->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

int cu_fail(sbprt_ctx *ctx, cudaError_t err, const char *what, const char *file, int line)
{
    (void)cudaGetLastError(); /* clear a non-sticky error so later calls can succeed */
    cu_error(ctx, 0, "%s:%d: %s: %s (%s)", cu_basename(file), line, what, cudaGetErrorName(err),
             cudaGetErrorString(err));
    return err == cudaErrorMemoryAllocation ? SBPRT_ERR_NOMEM : SBPRT_ERR_BACKEND;
}

int cu_fail_blas(sbprt_ctx *ctx, cublasStatus_t st, const char *what, const char *file, int line)
{
    cu_error(ctx, 0, "%s:%d: %s: %s", cu_basename(file), line, what, cublasGetStatusString(st));
    return st == CUBLAS_STATUS_ALLOC_FAILED ? SBPRT_ERR_NOMEM : SBPRT_ERR_BACKEND;
}

int cu_malloc(sbprt_ctx *ctx, void **out, size_t bytes)
{
    *out = NULL;
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e == cudaSuccess)
        return SBPRT_OK;
    *out = NULL;
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        return cu_error(ctx, e == cudaErrorMemoryAllocation ? SBPRT_ERR_NOMEM : SBPRT_ERR_BACKEND,
                        "cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
    }
    return cu_error(ctx, e == cudaErrorMemoryAllocation ? SBPRT_ERR_NOMEM : SBPRT_ERR_BACKEND,
                    "cudaMalloc of %zu bytes failed: %s (device %d has %zu bytes free of %zu)",
                    bytes, cudaGetErrorString(e), ctx ? ctx->device : -1, free_b, total_b);
}

static void cu_release(sbprt_ctx *ctx)
{
    if (ctx->stream)
        (void)cudaStreamSynchronize(ctx->stream);
    if (ctx->blas)
        (void)cublasDestroy(ctx->blas);
    if (ctx->stream)
        (void)cudaStreamDestroy(ctx->stream);
    if (ctx->copy) {
        (void)cudaStreamSynchronize(ctx->copy);
        (void)cudaStreamDestroy(ctx->copy);
    }
    if (ctx->queued)
        (void)cudaEventDestroy(ctx->queued);
    for (int i = 0; ctx->events && i < SBPRT_COPY_EVENTS; i++)
        if (ctx->events[i])
            (void)cudaEventDestroy(ctx->events[i]);
    free(ctx->events);
    (void)cudaFree(ctx->scratch);
    (void)cudaFree(ctx->span_dev);
    free(ctx->span_host);
    (void)cudaFree(ctx->dev_flag);
    if (ctx->host_flag)
        (void)cudaFreeHost(ctx->host_flag);
    (void)cudaGetLastError();
    free(ctx);
}

static int cu_init(sbprt_ctx *ctx)
{
    /* Said plainly first: without a device every later call fails with something obscure
     * (no driver gives "CUDA driver version is insufficient for CUDA runtime version"). */
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev <= 0) {
        (void)cudaGetLastError();
        if (e != cudaSuccess)
            return cu_error(ctx, SBPRT_ERR_BACKEND, "no CUDA device: cudaGetDeviceCount: %s (%s)",
                            cudaGetErrorName(e), cudaGetErrorString(e));
        return cu_error(ctx, SBPRT_ERR_BACKEND,
                        "no CUDA device: cudaGetDeviceCount found none (CUDA_VISIBLE_DEVICES?)");
    }
    CU_TRY(ctx, cudaGetDevice(&ctx->device));
    CU_TRY(ctx, cudaDeviceGetAttribute(&ctx->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                       ctx->device));
    /* A blocking stream: it stays ordered with work the caller puts on the legacy default
     * stream (a plain cudaMemcpy, say). */
    CU_TRY(ctx, cudaStreamCreate(&ctx->stream));
    CU_BLAS_TRY(ctx, cublasCreate(&ctx->blas));
    CU_BLAS_TRY(ctx, cublasSetStream(ctx->blas, ctx->stream));
    CU_STATUS(cu_malloc(ctx, (void **)&ctx->dev_flag, sizeof(int)));
    CU_TRY(ctx, cudaMemsetAsync(ctx->dev_flag, 0, sizeof(int), ctx->stream));
    CU_TRY(ctx, cudaMallocHost((void **)&ctx->host_flag, sizeof(int)));
    *ctx->host_flag = 0;
    CU_TRY(ctx, cudaStreamSynchronize(ctx->stream));
    return SBPRT_OK;
}

int sbprt_ctx_create(sbprt_ctx **out, int nthreads)
{
    CU_CHECK(out);
    *out = NULL;
    sbprt_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        snprintf(cu_create_msg, sizeof cu_create_msg, "out of host memory for a context");
        return SBPRT_ERR_NOMEM;
    }
    ctx->nthreads = nthreads > 0 ? nthreads : 1;
    int st = cu_init(ctx);
    if (st != SBPRT_OK) {
        snprintf(cu_create_msg, sizeof cu_create_msg, "%s", ctx->msg);
        cu_release(ctx);
        return st;
    }
    cu_create_msg[0] = '\0';
    *out = ctx;
    return SBPRT_OK;
}

void sbprt_ctx_destroy(sbprt_ctx *ctx)
{
    if (ctx)
        cu_release(ctx);
}

int sbprt_ctx_nthreads(const sbprt_ctx *ctx) { return ctx ? ctx->nthreads : 0; }

unsigned long long sbprt_ctx_launches(const sbprt_ctx *ctx) { return ctx ? ctx->launches : 0; }

int sbprt_sync(sbprt_ctx *ctx)
{
    CU_CHECK(ctx);
    if (ctx->copy) /* a transfer nobody waited for is done too */
        CU_TRY(ctx, cudaStreamSynchronize(ctx->copy));
    CU_TRY(ctx, cudaMemcpyAsync(ctx->host_flag, ctx->dev_flag, sizeof(int),
                                cudaMemcpyDeviceToHost, ctx->stream));
    CU_TRY(ctx, cudaStreamSynchronize(ctx->stream));
    if (*ctx->host_flag) {
        *ctx->host_flag = 0;
        CU_TRY(ctx, cudaMemsetAsync(ctx->dev_flag, 0, sizeof(int), ctx->stream));
        return cu_error(ctx, SBPRT_ERR_RANGE,
                        "a kernel queued since the previous sbprt_sync met an index (token id, "
                        "position or label) out of range");
    }
    return SBPRT_OK;
}

/* The communicator of a sequence-parallel step (seqpar.cu uses it).  A copy is kept, so the
 * caller's struct may go away; the user pointer it carries must stay valid while installed. */
int sbprt_ctx_set_comm(sbprt_ctx *ctx, const sbprt_comm *comm)
{
    CU_CHECK(ctx);
    if (!comm) {
        memset(&ctx->comm, 0, sizeof ctx->comm);
        ctx->has_comm = 0;
        return SBPRT_OK;
    }
    CU_CHECK(comm->size >= 1 && comm->rank >= 0 && comm->rank < comm->size && comm->alltoall);
    ctx->comm = *comm;
    ctx->has_comm = 1;
    return SBPRT_OK;
}

int sbprt_ctx_comm_size(const sbprt_ctx *ctx) { return ctx && ctx->has_comm ? ctx->comm.size : 1; }

int sbprt_ctx_comm_rank(const sbprt_ctx *ctx) { return ctx && ctx->has_comm ? ctx->comm.rank : 0; }

int sbprt_ctx_set_tf32(sbprt_ctx *ctx, int enable)
{
    CU_CHECK(ctx);
    ctx->tf32 = enable != 0;
    return SBPRT_OK;
}

const char *sbprt_ctx_last_error(const sbprt_ctx *ctx) { return ctx ? ctx->msg : cu_create_msg; }

/* ---- memory --------------------------------------------------------------------------- */

int cu_scratch(sbprt_ctx *ctx, size_t bytes, void **out)
{
    if (bytes > ctx->scratch_bytes) {
        /* Grow geometrically (at least 1 MiB) so a sequence of growing requests costs few
         * reallocations; the old buffer may still be in use by queued kernels. */
        size_t want = ctx->scratch_bytes * 2;
        want = want > bytes ? want : bytes;
        want = want > ((size_t)1 << 20) ? want : ((size_t)1 << 20);
        CU_TRY(ctx, cudaStreamSynchronize(ctx->stream));
        CU_TRY(ctx, cudaFree(ctx->scratch));
        ctx->scratch = NULL;
        ctx->scratch_bytes = 0;
        void *p;
        size_t got = want;
        int st = cu_malloc(ctx, &p, want);
        if (st != SBPRT_OK && want > bytes) {
            got = bytes; /* the doubling may be what does not fit */
            st = cu_malloc(ctx, &p, bytes);
        }
        if (st != SBPRT_OK)
            return st;
        ctx->scratch = p;
        ctx->scratch_bytes = got;
    }
    *out = ctx->scratch;
    return SBPRT_OK;
}

int sbprt_arena_alloc(sbprt_ctx *ctx, void **out, size_t bytes)
{
    CU_CHECK(ctx && out);
    return cu_malloc(ctx, out, bytes);
}

void sbprt_arena_free(sbprt_ctx *ctx, void *base)
{
    if (!base)
        return;
    cudaError_t e = cudaFree(base);
    if (e != cudaSuccess)
        cu_fail(ctx, e, "cudaFree(base)", __FILE__, __LINE__);
}

int sbprt_memcpy(sbprt_ctx *ctx, void *dst, const void *src, size_t bytes, int kind)
{
    CU_CHECK(ctx);
    CU_CHECK(kind == SBPRT_COPY_HOST_TO_DEVICE || kind == SBPRT_COPY_DEVICE_TO_HOST ||
             kind == SBPRT_COPY_DEVICE_TO_DEVICE);
    if (bytes == 0)
        return SBPRT_OK;
    CU_CHECK(dst && src);
    enum cudaMemcpyKind k = kind == SBPRT_COPY_HOST_TO_DEVICE   ? cudaMemcpyHostToDevice
                            : kind == SBPRT_COPY_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost
                                                                : cudaMemcpyDeviceToDevice;
    CU_TRY(ctx, cudaMemcpyAsync(dst, src, bytes, k, ctx->stream));
    if (kind != SBPRT_COPY_DEVICE_TO_DEVICE)
        CU_TRY(ctx, cudaStreamSynchronize(ctx->stream));
    return SBPRT_OK;
}

int sbprt_memset_zero(sbprt_ctx *ctx, void *dst, size_t bytes)
{
    CU_CHECK(ctx);
    if (bytes == 0)
        return SBPRT_OK;
    CU_CHECK(dst);
    CU_TRY(ctx, cudaMemsetAsync(dst, 0, bytes, ctx->stream));
    return SBPRT_OK;
}

int sbprt_device_memory(sbprt_ctx *ctx, size_t *used, size_t *total)
{
    CU_CHECK(ctx);
    size_t free_b = 0, total_b = 0;
    CU_TRY(ctx, cudaMemGetInfo(&free_b, &total_b));
    if (used)
        *used = total_b - free_b;
    if (total)
        *total = total_b;
    return SBPRT_OK;
}

/* ---- transfers (sbpc --offload) -------------------------------------------------------- */

int sbprt_host_alloc(sbprt_ctx *ctx, void **out, size_t bytes)
{
    CU_CHECK(ctx && out);
    *out = NULL;
    cudaError_t e = cudaMallocHost(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError();
        return cu_error(ctx, SBPRT_ERR_NOMEM, "cudaMallocHost of %zu bytes (page-locked host "
                        "memory) failed: %s", bytes, cudaGetErrorString(e));
    }
    return SBPRT_OK;
}

void sbprt_host_free(sbprt_ctx *ctx, void *p)
{
    if (!p)
        return;
    cudaError_t e = cudaFreeHost(p);
    if (e != cudaSuccess)
        cu_fail(ctx, e, "cudaFreeHost(p)", __FILE__, __LINE__);
}

/* The copy stream is non-blocking: it must not wait for the legacy default stream, which would
 * serialise the transfers with the kernels they are meant to overlap. */
static int cu_copy_event(sbprt_ctx *ctx, int event)
{
    if (!ctx->copy) {
        CU_TRY(ctx, cudaStreamCreateWithFlags(&ctx->copy, cudaStreamNonBlocking));
        CU_TRY(ctx, cudaEventCreateWithFlags(&ctx->queued, cudaEventDisableTiming));
    }
    if (!ctx->events && !(ctx->events = calloc(SBPRT_COPY_EVENTS, sizeof *ctx->events)))
        return cu_error(ctx, SBPRT_ERR_NOMEM, "out of host memory for the transfer events");
    if (!ctx->events[event])
        CU_TRY(ctx, cudaEventCreateWithFlags(&ctx->events[event], cudaEventDisableTiming));
    return SBPRT_OK;
}

int sbprt_copy_async(sbprt_ctx *ctx, void *dst, const void *src, size_t bytes, int kind,
                     int event)
{
    CU_CHECK(ctx && event >= 0 && event < SBPRT_COPY_EVENTS);
    CU_CHECK(kind == SBPRT_COPY_HOST_TO_DEVICE || kind == SBPRT_COPY_DEVICE_TO_HOST ||
             kind == SBPRT_COPY_DEVICE_TO_DEVICE);
    CU_CHECK(bytes == 0 || (dst && src));
    CU_STATUS(cu_copy_event(ctx, event));
    enum cudaMemcpyKind k = kind == SBPRT_COPY_HOST_TO_DEVICE   ? cudaMemcpyHostToDevice
                            : kind == SBPRT_COPY_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost
                                                                : cudaMemcpyDeviceToDevice;
    CU_TRY(ctx, cudaEventRecord(ctx->queued, ctx->stream));
    CU_TRY(ctx, cudaStreamWaitEvent(ctx->copy, ctx->queued, 0));
    if (bytes)
        CU_TRY(ctx, cudaMemcpyAsync(dst, src, bytes, k, ctx->copy));
    CU_TRY(ctx, cudaEventRecord(ctx->events[event], ctx->copy));
    return SBPRT_OK;
}

int sbprt_copy_wait(sbprt_ctx *ctx, int event)
{
    CU_CHECK(ctx && event >= 0 && event < SBPRT_COPY_EVENTS);
    if (!ctx->events || !ctx->events[event])
        return cu_error(ctx, SBPRT_ERR_INVALID, "sbprt_copy_wait: no transfer named event %d",
                        event);
    CU_TRY(ctx, cudaStreamWaitEvent(ctx->stream, ctx->events[event], 0));
    return SBPRT_OK;
}
