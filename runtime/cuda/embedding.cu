/*
 * embedding.cu — token (or position) embedding lookup and its scatter-add backward.
 *
 * Ids live in device memory, so kernels check them: a row whose id is outside [0, v) is
 * skipped and raises the context's index-error flag, which the next sbprt_sync reports as
 * SBPRT_ERR_RANGE (the CPU twin returns that status up front instead).
 *
 * The backward must add several rows into the same table row without float atomics and in
 * row order, to be deterministic and to match the CPU twin (cpu/embedding.c), which adds the
 * rows of each table row in row order.  So the (id, row) pairs are sorted as 64-bit keys
 * id << 32 | row (a bitonic sort on the device; keys are unique, so the order is fully
 * determined), which groups equal ids with their rows in ascending order; then one block per
 * group head walks its group and adds the rows into the table row, columns spread over the
 * threads.  Each table element receives exactly the CPU twin's additions in the same order,
 * so the results are bitwise equal to it.  The sort costs log²(n)/2 small launches, which is
 * nothing next to a step; rows with a bad id sort to the end as "no id" and are skipped.
 * The bf16 entry points read the table (fp32) into bf16 rows, and add bf16 rows of dout into
 * the fp32 table gradient, summing in fp32 (templates over the activation element type);
 * sbprt_embedding_forward_bf16_table reads a table kept as bf16 (a frozen embedding under
 * sbpc --base-precision bf16) and copies its rows bit for bit.
 */
#include "cuda.h"

#define EMB_THREADS 256
#define EMB_NO_KEY 0xffffffffffffffffull /* padding and bad ids; sorts last */

/* The forward's element types: T of out, S of the table (fp32, or bf16 for a table kept as
 * bf16). One template argument, since CU_LAUNCH takes the kernel as a macro argument. */
template <class T, class S>
struct emb_types {
    typedef T out_t;
    typedef S table_t;
};

template <class K>
__global__ void emb_forward_kernel(typename K::out_t *out, const typename K::table_t *table,
                                   const int32_t *ids, int v, int c, int *flag)
{
    typedef typename K::out_t T;
    typedef typename K::table_t S;
    const size_t r = blockIdx.x;
    const int id = ids[r];
    if (id < 0 || id >= v) {
        if (threadIdx.x == 0)
            cu_flag_range(flag);
        return;
    }
    const S *src = table + (size_t)id * c;
    T *dst = out + r * c;
    for (int j = threadIdx.x; j < c; j += blockDim.x)
        dst[j] = src[j];
}

/* keys[i] = ids[i] << 32 | i for i < n with a valid id, EMB_NO_KEY otherwise (i < npad). */
__global__ void emb_keys_kernel(unsigned long long *keys, const int32_t *ids, int n, int npad,
                                int v, int *flag)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= npad)
        return;
    unsigned long long key = EMB_NO_KEY;
    if (i < n) {
        const int id = ids[i];
        if (id >= 0 && id < v)
            key = (unsigned long long)id << 32 | (unsigned)i;
        else
            cu_flag_range(flag);
    }
    keys[i] = key;
}

/* One compare-exchange step (k, j) of a bitonic sort of npad (a power of two) keys into
 * ascending order. */
__global__ void emb_bitonic_kernel(unsigned long long *keys, int npad, int j, int k)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= npad)
        return;
    const int l = i ^ j;
    if (l <= i)
        return;
    const unsigned long long a = keys[i], b = keys[l];
    const bool ascending = (i & k) == 0;
    if ((a > b) == ascending) {
        keys[i] = b;
        keys[l] = a;
    }
}

/* Block p handles the group of equal ids starting at sorted position p (if p starts one):
 * dtable[id, :] += dout[row, :] for the group's rows in ascending order. */
template <class T>
__global__ void emb_backward_kernel(float *dtable, const T *dout,
                                    const unsigned long long *keys, int n, int c)
{
    const int p = blockIdx.x;
    const unsigned long long key = keys[p];
    if (key == EMB_NO_KEY)
        return;
    const unsigned id = (unsigned)(key >> 32);
    if (p > 0 && (unsigned)(keys[p - 1] >> 32) == id)
        return; /* not the first of its group */
    int end = p + 1;
    while (end < n && keys[end] != EMB_NO_KEY && (unsigned)(keys[end] >> 32) == id)
        end++;
    float *dst = dtable + (size_t)id * c;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        float acc = dst[j];
        for (int q = p; q < end; q++)
            acc += dout[(size_t)(unsigned)keys[q] * c + j];
        dst[j] = acc;
    }
}

template <class T, class S>
static int embedding_forward(sbprt_ctx *ctx, T *out, const S *table, const int32_t *ids, int n,
                             int v, int c)
{
    CU_CHECK(ctx && n >= 0 && v >= 0 && c >= 0);
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(out && table && ids);
    typedef emb_types<T, S> K;
    CU_LAUNCH(ctx, emb_forward_kernel<K>, (unsigned)n, EMB_THREADS, 0, out, table, ids, v, c,
              ctx->dev_flag);
    return SBPRT_OK;
}

template <class T>
static int embedding_backward(sbprt_ctx *ctx, float *dtable, const T *dout, const int32_t *ids,
                              int n, int v, int c)
{
    CU_CHECK(ctx && n >= 0 && v >= 0 && c >= 0);
    if (n == 0 || c == 0)
        return SBPRT_OK;
    CU_CHECK(dtable && dout && ids);
    CU_CHECK(n <= (1 << 30)); /* npad must fit an int */
    int npad = 1;
    while (npad < n)
        npad <<= 1;
    unsigned long long *keys;
    CU_STATUS(cu_scratch(ctx, (size_t)npad * sizeof *keys, (void **)&keys));
    const unsigned blocks = (unsigned)((npad + EMB_THREADS - 1) / EMB_THREADS);
    CU_LAUNCH(ctx, emb_keys_kernel, blocks, EMB_THREADS, 0, keys, ids, n, npad, v, ctx->dev_flag);
    for (int k = 2; k <= npad; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1)
            CU_LAUNCH(ctx, emb_bitonic_kernel, blocks, EMB_THREADS, 0, keys, npad, j, k);
    CU_LAUNCH(ctx, emb_backward_kernel<T>, (unsigned)n, EMB_THREADS, 0, dtable, dout, keys, n, c);
    return SBPRT_OK;
}

extern "C" int sbprt_embedding_forward(sbprt_ctx *ctx, float *out, const float *table,
                                       const int32_t *ids, int n, int v, int c)
{
    return embedding_forward(ctx, out, table, ids, n, v, c);
}

extern "C" int sbprt_embedding_backward(sbprt_ctx *ctx, float *dtable, const float *dout,
                                        const int32_t *ids, int n, int v, int c)
{
    return embedding_backward(ctx, dtable, dout, ids, n, v, c);
}

extern "C" int sbprt_embedding_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const float *table,
                                            const int32_t *ids, int n, int v, int c)
{
    return embedding_forward(ctx, cu_bf(out), table, ids, n, v, c);
}

/* a table kept as bf16: each element copied as is (cu_bf16 to cu_bf16 copies the bits) */
extern "C" int sbprt_embedding_forward_bf16_table(sbprt_ctx *ctx, sbprt_bf16 *out,
                                                  const sbprt_bf16 *table, const int32_t *ids,
                                                  int n, int v, int c)
{
    return embedding_forward(ctx, cu_bf(out), cu_bf(table), ids, n, v, c);
}

extern "C" int sbprt_embedding_backward_bf16(sbprt_ctx *ctx, float *dtable,
                                             const sbprt_bf16 *dout, const int32_t *ids, int n,
                                             int v, int c)
{
    return embedding_backward(ctx, dtable, cu_bf(dout), ids, n, v, c);
}
