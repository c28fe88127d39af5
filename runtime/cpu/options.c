/*
 * options.c — the backend options of sbprt.h as the CPU backend sees them: TF32 does not
 * exist here (OpenBLAS computes in fp32), and failures are described by their status alone,
 * so both calls are accepted and do nothing.
 */
#include "cpu.h"

int sbprt_ctx_set_tf32(sbprt_ctx *ctx, int enable)
{
    (void)enable;
    CPU_CHECK(ctx);
    return SBPRT_OK;
}

const char *sbprt_ctx_last_error(const sbprt_ctx *ctx)
{
    (void)ctx;
    return "";
}
