/*
 * cpu.h — internals shared by the CPU backend's files (not part of the public API).
 *
 * The context is a thread count plus one scratch buffer that kernels needing temporary
 * space (attention's per-thread tiles, per-row loss partials) borrow for the duration of a
 * call; it grows on demand and is freed with the context, so steady-state steps allocate
 * nothing.  A sequence-parallel step also installs a communicator (the caller's all-to-all,
 * seqpar.c): the context keeps a copy of it, so the caller's struct need not outlive the
 * call that installed it.  Parallel loops name the team size explicitly (num_threads(ctx->nthreads)) and
 * use a static schedule over work items whose results never depend on which thread ran
 * them, which is what makes every kernel here independent of the thread count.
 */
#ifndef SBPRT_CPU_H
#define SBPRT_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "sbprt.h"

struct sbprt_ctx {
    int nthreads;         /* OpenMP team size for every parallel loop */
    void *scratch;        /* SBPRT_ALIGN-aligned, scratch_bytes long, or NULL */
    size_t scratch_bytes; /* capacity of scratch */
    sbprt_comm comm;      /* sbprt_ctx_set_comm's copy; meaningful only when has_comm */
    int has_comm;         /* 0: no communicator (size 1, rank 0) */
};

/* Returns ctx's scratch buffer, grown to at least `bytes`; its contents are garbage.
 * Valid until the next call that borrows scratch. */
int cpu_scratch(sbprt_ctx *ctx, size_t bytes, void **out);

/* Below this many elements an elementwise loop runs on one thread: forking a team costs
 * more than the work.  Only speed depends on it, never results. */
#define CPU_PARALLEL_MIN 16384

/* Checked size arithmetic for sizes computed from a caller's dims (the runtime's twin of the
 * compiler's ir/checked.h, which the runtime does not include: libsbprt stands alone). A
 * product that would wrap size_t is an argument error (SBPRT_ERR_INVALID through CPU_CHECK),
 * never a short count that then indexes out of bounds. */
static inline int cpu_mul_size(size_t a, size_t b, size_t *r)
{
    return !__builtin_mul_overflow(a, b, r);
}
static inline int cpu_add_size(size_t a, size_t b, size_t *r)
{
    return !__builtin_add_overflow(a, b, r);
}

#define CPU_CHECK(cond)                                                                        \
    do {                                                                                       \
        if (!(cond))                                                                           \
            return SBPRT_ERR_INVALID;                                                          \
    } while (0)

/* Dot product with eight independent partial sums in a fixed order: the compiler may keep
 * them in one vector register (no -ffast-math needed), and the order never changes, so the
 * result is the same on every call. */
static inline float cpu_dot(const float *a, const float *b, int n)
{
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += a[i + l] * b[i + l];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* y += alpha * x over n floats. */
static inline void cpu_axpy(float *restrict y, float alpha, const float *restrict x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

#endif /* SBPRT_CPU_H */
