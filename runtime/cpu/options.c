/*
 * options.c — the backend options of sbprt.h as the CPU backend sees them: TF32 does not
 * exist here (OpenBLAS computes in fp32), and failures are described by their status alone,
 * so both calls are accepted and do nothing.  sbprt_device_memory reports the host's memory.
 */
#include "cpu.h"

#include <stdio.h>
#include <unistd.h>

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

/* The CPU backend's "device" is the host: the resident set of this process and the
 * machine's physical memory. */
int sbprt_device_memory(sbprt_ctx *ctx, size_t *used, size_t *total)
{
    CPU_CHECK(ctx);
    long page = sysconf(_SC_PAGESIZE), phys = sysconf(_SC_PHYS_PAGES);
    if (page <= 0 || phys <= 0)
        return SBPRT_ERR_INVALID;
    unsigned long long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return SBPRT_ERR_INVALID;
    int n = fscanf(f, "%llu %llu", &size, &resident);
    fclose(f);
    if (n != 2)
        return SBPRT_ERR_INVALID;
    if (used)
        *used = (size_t)resident * (size_t)page;
    if (total)
        *total = (size_t)phys * (size_t)page;
    return SBPRT_OK;
}
