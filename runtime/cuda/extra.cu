/*
 * extra.cu — layout and broadcasting kernels (the CPU twin is cpu/extra.c): axis permutation,
 * strided column-block copies, broadcasting binary ops, each with its accumulating backward.
 *
 * Shapes (rank <= 8) travel to the kernels by value in small structs.  Permutations and copies
 * write every output element from exactly one thread.  The broadcast backward reduces each
 * operand element over its broadcast axes in double, in the CPU twin's order; when there are
 * many terms they are split into parts of EX_TERMS_PER_PART consecutive terms (the partition
 * depends on the shapes alone) whose sums are added in order — no atomics.
 */
#include <string.h>

#include "cuda.h"

#define EX_MAX_RANK 8
#define EX_THREADS 256
#define EX_TERMS_PER_PART 256

struct ex_perm_args {
    int rank;
    int odims[EX_MAX_RANK];             /* output extents */
    unsigned long long xst[EX_MAX_RANK]; /* x stride along each output axis */
};

struct ex_bcast_args {
    int rank;
    int dims[EX_MAX_RANK];               /* output extents */
    unsigned long long ost[EX_MAX_RANK]; /* output strides */
    unsigned long long ast[EX_MAX_RANK]; /* a's strides against the output (0: broadcast) */
    unsigned long long bst[EX_MAX_RANK];
    int sdims[EX_MAX_RANK]; /* backward: extents of the operand being differentiated */
    int raxes[EX_MAX_RANK]; /* backward: its reduced axes, in order */
    int nr;                 /* backward: number of reduced axes */
};

/* ---- host-side shape checks (as the CPU twin's) ---------------------------------------- */

static size_t ex_strides(int rank, const int *dims, unsigned long long *st)
{
    size_t n = 1;
    for (int i = rank - 1; i >= 0; i--) {
        st[i] = n;
        n *= (size_t)dims[i];
    }
    return n;
}

static int ex_check_dims(int rank, const int *dims)
{
    if (rank < 0 || rank > EX_MAX_RANK || (rank > 0 && !dims))
        return 0;
    for (int i = 0; i < rank; i++)
        if (dims[i] < 0)
            return 0;
    return 1;
}

static int ex_check_perm(int rank, const int *perm)
{
    int seen[EX_MAX_RANK] = {0};
    if (rank > 0 && !perm)
        return 0;
    for (int i = 0; i < rank; i++) {
        if (perm[i] < 0 || perm[i] >= rank || seen[perm[i]])
            return 0;
        seen[perm[i]] = 1;
    }
    return 1;
}

static int ex_bcast_strides(int rank, const int *dims, const int *od, unsigned long long *st)
{
    unsigned long long s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        if (od[i] != dims[i] && od[i] != 1)
            return 0;
        st[i] = od[i] == 1 ? 0 : s;
        s *= (unsigned long long)od[i];
    }
    return 1;
}

/* ---- permute ---------------------------------------------------------------------------- */

template <class T>
__global__ void permute_kernel(T *out, const T *x, ex_perm_args pa, size_t n, int accumulate)
{
    for (size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x; o < n;
         o += (size_t)gridDim.x * blockDim.x) {
        size_t rest = o, src = 0;
        for (int i = pa.rank - 1; i >= 0; i--) {
            src += rest % (size_t)pa.odims[i] * pa.xst[i];
            rest /= (size_t)pa.odims[i];
        }
        if (accumulate)
            out[src] += x[o]; /* backward: out is dx (x's layout), x is dout */
        else
            out[o] = x[src];
    }
}

template <class T>
static int ex_permute(sbprt_ctx *ctx, T *out, const T *x, int rank, const int *dims,
                      const int *perm, int accumulate)
{
    CU_CHECK(ctx && ex_check_dims(rank, dims) && ex_check_perm(rank, perm));
    unsigned long long xst[EX_MAX_RANK];
    const size_t n = ex_strides(rank, dims, xst);
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(out && x);
    ex_perm_args pa;
    memset(&pa, 0, sizeof pa);
    pa.rank = rank;
    for (int i = 0; i < rank; i++) {
        pa.odims[i] = dims[perm[i]];
        pa.xst[i] = xst[perm[i]];
    }
    CU_LAUNCH(ctx, permute_kernel<T>, cu_blocks(n, EX_THREADS), EX_THREADS, 0, out, x, pa, n,
              accumulate);
    return SBPRT_OK;
}

/* ---- column copies ------------------------------------------------------------------------ */

template <class T>
__global__ void copy_cols_kernel(T *dst, const T *src, int w, int dst_ld, int dst_off,
                                 int src_ld, int src_off, size_t total, int accumulate)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / w, j = e % w;
        T *d = dst + r * dst_ld + dst_off + j;
        const float s = src[r * src_ld + src_off + j];
        if (accumulate)
            *d += s;
        else
            *d = s;
    }
}

template <class T>
static int copy_cols(sbprt_ctx *ctx, T *dst, const T *src, int rows, int w, int dst_ld, int dst_off,
                     int src_ld, int src_off, int accumulate)
{
    CU_CHECK(ctx && rows >= 0 && w >= 0 && dst_off >= 0 && src_off >= 0);
    if (rows == 0 || w == 0)
        return SBPRT_OK;
    CU_CHECK(dst && src && dst_off + w <= dst_ld && src_off + w <= src_ld);
    const size_t total = (size_t)rows * w;
    CU_LAUNCH(ctx, copy_cols_kernel<T>, cu_blocks(total, EX_THREADS), EX_THREADS, 0, dst, src, w,
              dst_ld, dst_off, src_ld, src_off, total, accumulate);
    return SBPRT_OK;
}

/* ---- broadcasting binary ops ------------------------------------------------------------ */

__device__ __forceinline__ size_t ex_bcast_off(size_t o, const ex_bcast_args &ba,
                                               const unsigned long long *st)
{
    size_t off = 0;
    for (int i = ba.rank - 1; i >= 0; i--) {
        off += o % (size_t)ba.dims[i] * st[i];
        o /= (size_t)ba.dims[i];
    }
    return off;
}

template <class T>
__global__ void bcast_forward_kernel(T *out, const T *a, const T *b, int op,
                                     ex_bcast_args ba, size_t n)
{
    for (size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x; o < n;
         o += (size_t)gridDim.x * blockDim.x) {
        const float av = a[ex_bcast_off(o, ba, ba.ast)], bv = b[ex_bcast_off(o, ba, ba.bst)];
        float r;
        switch (op) {
        case SBPRT_BIN_ADD: r = av + bv; break;
        case SBPRT_BIN_SUB: r = av - bv; break;
        case SBPRT_BIN_MUL: r = av * bv; break;
        default: r = av / bv; break;
        }
        out[o] = r;
    }
}

/* Terms [t0, t1) of the reduction of operand element e (which: 0 = a, 1 = b), in double. */
template <class T>
__device__ __forceinline__ double ex_grad_terms(size_t e, size_t t0, size_t t1,
                                                const ex_bcast_args &ba, const T *dout, const T *a,
                                                const T *b, int op, int which)
{
    /* output offset of the first element this operand element feeds */
    size_t base = 0, rest = e;
    for (int i = ba.rank - 1; i >= 0; i--) {
        base += rest % (size_t)ba.sdims[i] * ba.ost[i];
        rest /= (size_t)ba.sdims[i];
    }
    double acc = 0;
    for (size_t r = t0; r < t1; r++) {
        size_t o = base, q = r;
        for (int k = ba.nr - 1; k >= 0; k--) {
            const int ax = ba.raxes[k];
            o += q % (size_t)ba.dims[ax] * ba.ost[ax];
            q /= (size_t)ba.dims[ax];
        }
        const float g = dout[o];
        const float av = a[ex_bcast_off(o, ba, ba.ast)];
        const float bv = b[ex_bcast_off(o, ba, ba.bst)];
        float d;
        switch (op) {
        case SBPRT_BIN_ADD: d = g; break;
        case SBPRT_BIN_SUB: d = which ? -g : g; break;
        case SBPRT_BIN_MUL: d = which ? g * av : g * bv; break;
        default: d = which ? -g * av / (bv * bv) : g / bv; break;
        }
        acc += d;
    }
    return acc;
}

/* grid: (operand element blocks, parts).  One part: dself[e] += sum; else parts[q, e] = sum. */
template <class T>
__global__ void bcast_grad_kernel(T *dself, double *parts, const T *dout, const T *a, const T *b,
                                  int op, int which, ex_bcast_args ba, size_t ns,
                                  size_t nred, size_t per_part)
{
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= ns)
        return;
    const size_t t0 = (size_t)blockIdx.y * per_part;
    const size_t t1 = t0 + per_part < nred ? t0 + per_part : nred;
    const double s = ex_grad_terms(e, t0, t1, ba, dout, a, b, op, which);
    if (parts)
        parts[(size_t)blockIdx.y * ns + e] = s;
    else
        dself[e] += (float)s;
}

template <class T>
__global__ void bcast_grad_finish_kernel(T *dself, const double *parts, size_t ns, int nparts)
{
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= ns)
        return;
    double s = 0;
    for (int q = 0; q < nparts; q++)
        s += parts[(size_t)q * ns + e];
    dself[e] += (float)s;
}

static int ex_check_bcast(int op, int rank, const int *dims)
{
    return op >= SBPRT_BIN_ADD && op <= SBPRT_BIN_DIV && ex_check_dims(rank, dims);
}

template <class T>
static int broadcast_forward(sbprt_ctx *ctx, T *out, const T *a, const T *b, int op, int rank,
                             const int *dims, const int *a_dims, const int *b_dims)
{
    CU_CHECK(ctx && ex_check_bcast(op, rank, dims));
    ex_bcast_args ba;
    memset(&ba, 0, sizeof ba);
    const size_t n = ex_strides(rank, dims, ba.ost);
    if (n == 0)
        return SBPRT_OK;
    CU_CHECK(out && a && b && (rank == 0 || (a_dims && b_dims)));
    CU_CHECK(ex_bcast_strides(rank, dims, a_dims, ba.ast) &&
             ex_bcast_strides(rank, dims, b_dims, ba.bst));
    ba.rank = rank;
    for (int i = 0; i < rank; i++)
        ba.dims[i] = dims[i];
    CU_LAUNCH(ctx, bcast_forward_kernel<T>, cu_blocks(n, EX_THREADS), EX_THREADS, 0, out, a, b, op,
              ba, n);
    return SBPRT_OK;
}

template <class T>
static int ex_bcast_grad(sbprt_ctx *ctx, T *dself, const T *dout, const T *a, const T *b, int op,
                         int which, ex_bcast_args ba, const int *sdims)
{
    unsigned long long sst[EX_MAX_RANK];
    const size_t ns = ex_strides(ba.rank, sdims, sst);
    size_t nred = 1;
    ba.nr = 0;
    for (int i = 0; i < ba.rank; i++) {
        ba.sdims[i] = sdims[i];
        if (sdims[i] == 1 && ba.dims[i] != 1) {
            ba.raxes[ba.nr++] = i;
            nred *= (size_t)ba.dims[i];
        }
    }
    size_t per_part = EX_TERMS_PER_PART;
    if ((nred + per_part - 1) / per_part > CU_MAX_BLOCKS)
        per_part = (nred + CU_MAX_BLOCKS - 1) / CU_MAX_BLOCKS;
    const size_t nparts = (nred + per_part - 1) / per_part;
    const size_t xblocks = (ns + EX_THREADS - 1) / EX_THREADS;
    CU_CHECK(xblocks <= 0x7fffffffu);
    double *parts = NULL;
    if (nparts > 1)
        CU_STATUS(cu_scratch(ctx, nparts * ns * sizeof(double), (void **)&parts));
    const dim3 grid((unsigned)xblocks, (unsigned)nparts);
    CU_LAUNCH(ctx, bcast_grad_kernel<T>, grid, EX_THREADS, 0, dself, parts, dout, a, b, op, which,
              ba, ns, nred, per_part);
    if (nparts > 1)
        CU_LAUNCH(ctx, bcast_grad_finish_kernel<T>, (unsigned)xblocks, EX_THREADS, 0, dself, parts,
                  ns, (int)nparts);
    return SBPRT_OK;
}

template <class T>
static int broadcast_backward(sbprt_ctx *ctx, T *da, T *db, const T *dout, const T *a, const T *b,
                              int op, int rank, const int *dims, const int *a_dims,
                              const int *b_dims)
{
    CU_CHECK(ctx && ex_check_bcast(op, rank, dims));
    ex_bcast_args ba;
    memset(&ba, 0, sizeof ba);
    const size_t n = ex_strides(rank, dims, ba.ost);
    if (n == 0 || (!da && !db))
        return SBPRT_OK;
    CU_CHECK(dout && a && b && (rank == 0 || (a_dims && b_dims)));
    CU_CHECK(ex_bcast_strides(rank, dims, a_dims, ba.ast) &&
             ex_bcast_strides(rank, dims, b_dims, ba.bst));
    ba.rank = rank;
    for (int i = 0; i < rank; i++)
        ba.dims[i] = dims[i];
    if (da)
        CU_STATUS(ex_bcast_grad(ctx, da, dout, a, b, op, 0, ba, a_dims));
    if (db)
        CU_STATUS(ex_bcast_grad(ctx, db, dout, a, b, op, 1, ba, b_dims));
    return SBPRT_OK;
}

/* ---- entry points: fp32, and bf16 (the same kernels on cu_bf16 elements) ------------------ */

extern "C" int sbprt_permute_forward(sbprt_ctx *ctx, float *out, const float *x, int rank,
                                     const int *dims, const int *perm)
{
    return ex_permute(ctx, out, x, rank, dims, perm, 0);
}

extern "C" int sbprt_permute_backward(sbprt_ctx *ctx, float *dx, const float *dout, int rank,
                                      const int *dims, const int *perm)
{
    return ex_permute(ctx, dx, dout, rank, dims, perm, 1);
}

extern "C" int sbprt_copy_cols(sbprt_ctx *ctx, float *dst, const float *src, int rows, int w,
                               int dst_ld, int dst_off, int src_ld, int src_off, int accumulate)
{
    return copy_cols(ctx, dst, src, rows, w, dst_ld, dst_off, src_ld, src_off, accumulate);
}

extern "C" int sbprt_broadcast_forward(sbprt_ctx *ctx, float *out, const float *a, const float *b,
                                       int op, int rank, const int *dims, const int *a_dims,
                                       const int *b_dims)
{
    return broadcast_forward(ctx, out, a, b, op, rank, dims, a_dims, b_dims);
}

extern "C" int sbprt_broadcast_backward(sbprt_ctx *ctx, float *da, float *db, const float *dout,
                                        const float *a, const float *b, int op, int rank,
                                        const int *dims, const int *a_dims, const int *b_dims)
{
    return broadcast_backward(ctx, da, db, dout, a, b, op, rank, dims, a_dims, b_dims);
}

extern "C" int sbprt_permute_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x,
                                          int rank, const int *dims, const int *perm)
{
    return ex_permute(ctx, cu_bf(out), cu_bf(x), rank, dims, perm, 0);
}

extern "C" int sbprt_permute_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                                           int rank, const int *dims, const int *perm)
{
    return ex_permute(ctx, cu_bf(dx), cu_bf(dout), rank, dims, perm, 1);
}

extern "C" int sbprt_copy_cols_bf16(sbprt_ctx *ctx, sbprt_bf16 *dst, const sbprt_bf16 *src,
                                    int rows, int w, int dst_ld, int dst_off, int src_ld,
                                    int src_off, int accumulate)
{
    return copy_cols(ctx, cu_bf(dst), cu_bf(src), rows, w, dst_ld, dst_off, src_ld, src_off,
                     accumulate);
}

extern "C" int sbprt_broadcast_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *a,
                                            const sbprt_bf16 *b, int op, int rank,
                                            const int *dims, const int *a_dims,
                                            const int *b_dims)
{
    return broadcast_forward(ctx, cu_bf(out), cu_bf(a), cu_bf(b), op, rank, dims, a_dims, b_dims);
}

extern "C" int sbprt_broadcast_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *da, sbprt_bf16 *db,
                                             const sbprt_bf16 *dout, const sbprt_bf16 *a,
                                             const sbprt_bf16 *b, int op, int rank,
                                             const int *dims, const int *a_dims,
                                             const int *b_dims)
{
    return broadcast_backward(ctx, cu_bf(da), cu_bf(db), cu_bf(dout), cu_bf(a), cu_bf(b), op, rank,
                              dims, a_dims, b_dims);
}
