/*
 * ctx.c — context, memory and status functions of the CPU backend.
 *
 * "Backend memory" is host memory here, so copies are memcpy and the arena is one
 * aligned_alloc.  OpenBLAS keeps its thread count in process-wide state; the context sets
 * it at creation so that sbprt_ctx_create(…, n) means n threads for GEMMs too.  The context
 * also holds the communicator of a sequence-parallel step (sbprt_ctx_set_comm; seqpar.c).
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#ifdef SBPRT_HAVE_OPENBLAS
#include <cblas.h> /* openblas_set_num_threads */
#endif

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

const char *sbprt_backend_name(void) { return "cpu"; }

int sbprt_ctx_create(sbprt_ctx **out, int nthreads)
{
    CPU_CHECK(out);
    *out = NULL;
    sbprt_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return SBPRT_ERR_NOMEM;
    ctx->nthreads = nthreads > 0 ? nthreads : omp_get_max_threads();
    if (ctx->nthreads < 1)
        ctx->nthreads = 1;
#ifdef SBPRT_HAVE_OPENBLAS
    /* gemm.c splits the products over the OpenMP team: one thread pool, not two */
    openblas_set_num_threads(1);
#endif
    *out = ctx;
    return SBPRT_OK;
}

void sbprt_ctx_destroy(sbprt_ctx *ctx)
{
    if (!ctx)
        return;
    free(ctx->scratch);
    free(ctx);
}

int sbprt_ctx_nthreads(const sbprt_ctx *ctx) { return ctx ? ctx->nthreads : 0; }

unsigned long long sbprt_ctx_launches(const sbprt_ctx *ctx)
{
    (void)ctx;
    return 0;
}

int sbprt_sync(sbprt_ctx *ctx)
{
    CPU_CHECK(ctx);
    return SBPRT_OK;
}

/* The communicator of a sequence-parallel step (seqpar.c uses it).  A copy is kept, so the
 * caller's struct may go away; the user pointer it carries must stay valid while installed. */
int sbprt_ctx_set_comm(sbprt_ctx *ctx, const sbprt_comm *comm)
{
    CPU_CHECK(ctx);
    if (!comm) {
        memset(&ctx->comm, 0, sizeof ctx->comm);
        ctx->has_comm = 0;
        return SBPRT_OK;
    }
    CPU_CHECK(comm->size >= 1 && comm->rank >= 0 && comm->rank < comm->size && comm->alltoall);
    ctx->comm = *comm;
    ctx->has_comm = 1;
    return SBPRT_OK;
}

int sbprt_ctx_comm_size(const sbprt_ctx *ctx) { return ctx && ctx->has_comm ? ctx->comm.size : 1; }

int sbprt_ctx_comm_rank(const sbprt_ctx *ctx) { return ctx && ctx->has_comm ? ctx->comm.rank : 0; }

/* aligned_alloc wants a size that is a multiple of the alignment; round up, guarding the
 * overflow that rounding could cause. */
static void *cpu_aligned_alloc(size_t bytes)
{
    if (bytes == 0)
        bytes = 1;
    if (bytes > SIZE_MAX - (SBPRT_ALIGN - 1))
        return NULL;
    size_t rounded = (bytes + SBPRT_ALIGN - 1) / SBPRT_ALIGN * SBPRT_ALIGN;
    return aligned_alloc(SBPRT_ALIGN, rounded);
}

int cpu_scratch(sbprt_ctx *ctx, size_t bytes, void **out)
{
    if (bytes > ctx->scratch_bytes) {
        void *p = cpu_aligned_alloc(bytes);
        if (!p)
            return SBPRT_ERR_NOMEM;
        free(ctx->scratch);
        ctx->scratch = p;
        ctx->scratch_bytes = bytes;
    }
    *out = ctx->scratch;
    return SBPRT_OK;
}

int sbprt_arena_alloc(sbprt_ctx *ctx, void **out, size_t bytes)
{
    CPU_CHECK(ctx && out);
    *out = cpu_aligned_alloc(bytes);
    return *out ? SBPRT_OK : SBPRT_ERR_NOMEM;
}

void sbprt_arena_free(sbprt_ctx *ctx, void *base)
{
    (void)ctx;
    free(base);
}

int sbprt_memcpy(sbprt_ctx *ctx, void *dst, const void *src, size_t bytes, int kind)
{
    CPU_CHECK(ctx);
    CPU_CHECK(kind == SBPRT_COPY_HOST_TO_DEVICE || kind == SBPRT_COPY_DEVICE_TO_HOST ||
              kind == SBPRT_COPY_DEVICE_TO_DEVICE);
    if (bytes == 0)
        return SBPRT_OK;
    CPU_CHECK(dst && src);
    memcpy(dst, src, bytes);
    return SBPRT_OK;
}

int sbprt_memset_zero(sbprt_ctx *ctx, void *dst, size_t bytes)
{
    CPU_CHECK(ctx);
    if (bytes == 0)
        return SBPRT_OK;
    CPU_CHECK(dst);
    memset(dst, 0, bytes);
    return SBPRT_OK;
}

int sbprt_host_alloc(sbprt_ctx *ctx, void **out, size_t bytes)
{
    CPU_CHECK(ctx && out);
    *out = cpu_aligned_alloc(bytes);
    return *out ? SBPRT_OK : SBPRT_ERR_NOMEM;
}

void sbprt_host_free(sbprt_ctx *ctx, void *p)
{
    (void)ctx;
    free(p);
}

/* Host and backend memory are one here: the copy is done when the call returns. */
int sbprt_copy_async(sbprt_ctx *ctx, void *dst, const void *src, size_t bytes, int kind,
                     int event)
{
    CPU_CHECK(event >= 0 && event < SBPRT_COPY_EVENTS);
    return sbprt_memcpy(ctx, dst, src, bytes, kind);
}

int sbprt_copy_wait(sbprt_ctx *ctx, int event)
{
    CPU_CHECK(ctx && event >= 0 && event < SBPRT_COPY_EVENTS);
    return SBPRT_OK;
}
