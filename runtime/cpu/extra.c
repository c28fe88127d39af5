/*
 * extra.c — layout and broadcasting kernels that compiled training steps need around the
 * semantic ops: axis permutation (the exporter's Transpose nodes that could not be folded into
 * a kernel's layout), strided column-block copies (Split / Slice / Concat along any axis) and
 * broadcasting elementwise binary ops (bias and position-embedding adds, scalar products),
 * each with its accumulating backward.
 *
 * Determinism: every output element is written by exactly one loop iteration; the broadcast
 * backward reduces each gradient element over its broadcast axes in one fixed order (in double),
 * so no result depends on the thread count.
 */
#include "cpu.h"

#define EX_MAX_RANK 8

/* Row-major strides of dims[rank] (in elements); returns the element count. Only for dims that
 * ex_check_dims accepted (which proves the product, and so every stride, fits). */
static size_t ex_strides(int rank, const int *dims, size_t *st)
{
    size_t n = 1;
    for (int i = rank - 1; i >= 0; i--) {
        st[i] = n;
        n *= (size_t)dims[i];
    }
    return n;
}

/* Dims a kernel may walk: a rank it handles, no negative extent, and an element count whose
 * bytes fit size_t. Every prefix product must fit, zeros read as 1 (strides are prefix
 * products, and a zero extent elsewhere must not hide a wrapped one): eight int extents can
 * multiply to 2^248. */
static int ex_check_dims(int rank, const int *dims)
{
    if (rank < 0 || rank > EX_MAX_RANK || (rank > 0 && !dims))
        return 0;
    size_t q = sizeof(float);
    for (int i = 0; i < rank; i++)
        if (dims[i] < 0 || !cpu_mul_size(q, dims[i] ? (size_t)dims[i] : 1, &q))
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

/* For output element o (flat), the flat offset of its source in x: out axis i walks x axis
 * perm[i]. */
static size_t ex_perm_src(size_t o, int rank, const int *odims, const size_t *xst_perm)
{
    size_t src = 0;
    for (int i = rank - 1; i >= 0; i--) {
        size_t c = o % (size_t)odims[i];
        o /= (size_t)odims[i];
        src += c * xst_perm[i];
    }
    return src;
}

static int ex_permute(sbprt_ctx *ctx, float *out, const float *x, int rank, const int *dims,
                      const int *perm, int accumulate)
{
    CPU_CHECK(ctx && ex_check_dims(rank, dims) && ex_check_perm(rank, perm));
    size_t xst[EX_MAX_RANK], xst_perm[EX_MAX_RANK];
    int odims[EX_MAX_RANK];
    size_t n = ex_strides(rank, dims, xst);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(out && x);
    for (int i = 0; i < rank; i++) {
        odims[i] = dims[perm[i]];
        xst_perm[i] = xst[perm[i]];
    }
    /* Blocks of the innermost output axis so the index arithmetic is per block, not per
     * element. */
    size_t inner = rank > 0 ? (size_t)odims[rank - 1] : 1;
    size_t inner_st = rank > 0 ? xst_perm[rank - 1] : 1;
    size_t nblk = n / inner;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) if (n >= CPU_PARALLEL_MIN)
    for (size_t blk = 0; blk < nblk; blk++) {
        size_t o = blk * inner;
        size_t s = ex_perm_src(o, rank, odims, xst_perm);
        if (accumulate) {
            /* backward: out is dx (x's layout), x is dout (the permuted layout) */
            for (size_t j = 0; j < inner; j++)
                out[s + j * inner_st] += x[o + j];
        } else {
            for (size_t j = 0; j < inner; j++)
                out[o + j] = x[s + j * inner_st];
        }
    }
    return SBPRT_OK;
}

int sbprt_permute_forward(sbprt_ctx *ctx, float *out, const float *x, int rank, const int *dims,
                          const int *perm)
{
    return ex_permute(ctx, out, x, rank, dims, perm, 0);
}

int sbprt_permute_backward(sbprt_ctx *ctx, float *dx, const float *dout, int rank,
                           const int *dims, const int *perm)
{
    return ex_permute(ctx, dx, dout, rank, dims, perm, 1);
}

int sbprt_copy_cols(sbprt_ctx *ctx, float *dst, const float *src, int rows, int w, int dst_ld,
                    int dst_off, int src_ld, int src_off, int accumulate)
{
    CPU_CHECK(ctx && rows >= 0 && w >= 0 && dst_off >= 0 && src_off >= 0);
    if (rows == 0 || w == 0)
        return SBPRT_OK;
    /* in 64 bits: off + w of two ints may pass INT_MAX */
    CPU_CHECK(dst && src && (int64_t)dst_off + w <= dst_ld && (int64_t)src_off + w <= src_ld);
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)rows * w >= CPU_PARALLEL_MIN)
    for (int r = 0; r < rows; r++) {
        float *d = dst + (size_t)r * dst_ld + dst_off;
        const float *s = src + (size_t)r * src_ld + src_off;
        if (accumulate)
            for (int j = 0; j < w; j++)
                d[j] += s[j];
        else
            for (int j = 0; j < w; j++)
                d[j] = s[j];
    }
    return SBPRT_OK;
}

/* Broadcast strides of an operand with dims od[rank] against the output dims: 0 on axes where
 * the operand has extent 1 and the output does not. Returns 0 on a mismatch. */
static int ex_bcast_strides(int rank, const int *dims, const int *od, size_t *st)
{
    size_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        if (od[i] != dims[i] && od[i] != 1)
            return 0;
        st[i] = od[i] == 1 ? 0 : s;
        s *= (size_t)od[i];
    }
    return 1;
}

static size_t ex_bcast_off(size_t o, int rank, const int *dims, const size_t *st)
{
    size_t off = 0;
    for (int i = rank - 1; i >= 0; i--) {
        off += (o % (size_t)dims[i]) * st[i];
        o /= (size_t)dims[i];
    }
    return off;
}

static inline float ex_binop(int op, float a, float b)
{
    switch (op) {
    case SBPRT_BIN_ADD: return a + b;
    case SBPRT_BIN_SUB: return a - b;
    case SBPRT_BIN_MUL: return a * b;
    default: return a / b;
    }
}

int sbprt_broadcast_forward(sbprt_ctx *ctx, float *out, const float *a, const float *b, int op,
                            int rank, const int *dims, const int *a_dims, const int *b_dims)
{
    CPU_CHECK(ctx && op >= SBPRT_BIN_ADD && op <= SBPRT_BIN_DIV && ex_check_dims(rank, dims));
    size_t ost[EX_MAX_RANK], ast[EX_MAX_RANK], bst[EX_MAX_RANK];
    size_t n = ex_strides(rank, dims, ost);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(out && a && b && (rank == 0 || (a_dims && b_dims)));
    CPU_CHECK(ex_bcast_strides(rank, dims, a_dims, ast) &&
              ex_bcast_strides(rank, dims, b_dims, bst));
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) if (n >= CPU_PARALLEL_MIN)
    for (size_t o = 0; o < n; o++)
        out[o] = ex_binop(op, a[ex_bcast_off(o, rank, dims, ast)],
                          b[ex_bcast_off(o, rank, dims, bst)]);
    return SBPRT_OK;
}

/* d_self += Σ over the broadcast axes of (∂ out / ∂ self) * dout, for one operand `self`
 * (which = 0: a, 1: b). Parallel over the operand's elements; each sums its output elements in
 * row-major order of the reduced axes. */
static void ex_bcast_grad(sbprt_ctx *ctx, float *dself, const float *dout, const float *a,
                          const float *b, int op, int which, int rank, const int *dims,
                          const int *sdims, const size_t *ast, const size_t *bst)
{
    size_t sst[EX_MAX_RANK], ost[EX_MAX_RANK];
    size_t ns = ex_strides(rank, sdims, sst);
    ex_strides(rank, dims, ost);
    /* reduced axes: output extent > 1 where the operand has extent 1 */
    int raxes[EX_MAX_RANK], nr = 0;
    size_t nred = 1;
    for (int i = 0; i < rank; i++)
        if (sdims[i] == 1 && dims[i] != 1) {
            raxes[nr++] = i;
            nred *= (size_t)dims[i];
        }
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (ns * nred >= CPU_PARALLEL_MIN)
    for (size_t e = 0; e < ns; e++) {
        /* output offset of the first element this operand element feeds */
        size_t base = 0, rest = e;
        for (int i = rank - 1; i >= 0; i--) {
            size_t c = rest % (size_t)sdims[i];
            rest /= (size_t)sdims[i];
            base += c * ost[i];
        }
        double acc = 0;
        for (size_t r = 0; r < nred; r++) {
            size_t o = base, q = r;
            for (int k = nr - 1; k >= 0; k--) {
                o += (q % (size_t)dims[raxes[k]]) * ost[raxes[k]];
                q /= (size_t)dims[raxes[k]];
            }
            float g = dout[o];
            float av = a[ex_bcast_off(o, rank, dims, ast)];
            float bv = b[ex_bcast_off(o, rank, dims, bst)];
            float d;
            switch (op) {
            case SBPRT_BIN_ADD: d = g; break;
            case SBPRT_BIN_SUB: d = which ? -g : g; break;
            case SBPRT_BIN_MUL: d = which ? g * av : g * bv; break;
            default: d = which ? -g * av / (bv * bv) : g / bv; break;
            }
            acc += d;
        }
        dself[e] += (float)acc;
    }
}

int sbprt_broadcast_backward(sbprt_ctx *ctx, float *da, float *db, const float *dout,
                             const float *a, const float *b, int op, int rank, const int *dims,
                             const int *a_dims, const int *b_dims)
{
    CPU_CHECK(ctx && op >= SBPRT_BIN_ADD && op <= SBPRT_BIN_DIV && ex_check_dims(rank, dims));
    size_t ost[EX_MAX_RANK], ast[EX_MAX_RANK], bst[EX_MAX_RANK];
    size_t n = ex_strides(rank, dims, ost);
    if (n == 0 || (!da && !db))
        return SBPRT_OK;
    CPU_CHECK(dout && a && b && (rank == 0 || (a_dims && b_dims)));
    CPU_CHECK(ex_bcast_strides(rank, dims, a_dims, ast) &&
              ex_bcast_strides(rank, dims, b_dims, bst));
    if (da)
        ex_bcast_grad(ctx, da, dout, a, b, op, 0, rank, dims, a_dims, ast, bst);
    if (db)
        ex_bcast_grad(ctx, db, dout, a, b, op, 1, rank, dims, b_dims, ast, bst);
    return SBPRT_OK;
}
