/*
 * test_extra.c — the layout and broadcasting helpers (runtime/cpu/extra.c): axis
 * permutation, column-block copies, and broadcasting add/sub/mul/div, forward and backward,
 * against double references written with explicit multi-indices, and finite differences;
 * and dims whose element count wraps 64 bits, which must be refused (SBPRT_ERR_INVALID) rather
 * than walked with a wrapped count.
 */
#include "rt_test.h"

#include <limits.h>

/* Row-major multi-index of flat index o in dims[rank]. */
static void unravel(size_t o, int rank, const int *dims, int *idx)
{
    for (int i = rank - 1; i >= 0; i--) {
        idx[i] = (int)(o % (size_t)dims[i]);
        o /= (size_t)dims[i];
    }
}

static size_t ravel(int rank, const int *dims, const int *idx)
{
    size_t o = 0;
    for (int i = 0; i < rank; i++)
        o = o * (size_t)dims[i] + (size_t)idx[i];
    return o;
}

static size_t numel(int rank, const int *dims)
{
    size_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= (size_t)dims[i];
    return n;
}

/* ---- permute ------------------------------------------------------------------------ */

/* out[i0..] = x[j..] with j[perm[i]] = i[i] */
static void ref_permute(double *out, const double *x, int rank, const int *dims, const int *perm)
{
    int odims[8], oi[8], xi[8];
    for (int i = 0; i < rank; i++)
        odims[i] = dims[perm[i]];
    for (size_t o = 0; o < numel(rank, dims); o++) {
        unravel(o, rank, odims, oi);
        for (int i = 0; i < rank; i++)
            xi[perm[i]] = oi[i];
        out[o] = x[ravel(rank, dims, xi)];
    }
}

typedef struct {
    int rank;
    const int *dims, *perm;
    const double *w;
    double *x, *out;
} perm_fd;

static double perm_f(void *p)
{
    perm_fd *s = p;
    ref_permute(s->out, s->x, s->rank, s->dims, s->perm);
    double f = 0;
    for (size_t i = 0; i < numel(s->rank, s->dims); i++)
        f += s->w[i] * s->out[i];
    return f;
}

static void check_permute(int rank, const int *dims, const int *perm, uint64_t seed)
{
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {seed};
    const size_t n = numel(rank, dims);
    float *x = rt_random(&r, n, -1, 1), *out = RT_NEW(float, n);
    double *xd = rt_to_double(x, n), *ref = RT_NEW(double, n);
    ref_permute(ref, xd, rank, dims, perm);
    rt_assert_ok(sbprt_permute_forward(ctx, out, x, rank, dims, perm));
    rt_assert_err(rt_rel_err(out, ref, n), RT_TOL, "permute fwd");

    /* backward: dx[j] += dout[i] where out[i] = x[j], i.e. the adjoint of the forward */
    float *dout = rt_random(&r, n, -1, 1), *dx = rt_random(&r, n, -1, 1), *dx0 = rt_copy(dx, n);
    rt_assert_ok(sbprt_permute_backward(ctx, dx, dout, rank, dims, perm));
    double *rdx = RT_NEW(double, n), *e = RT_NEW(double, n), *col = RT_NEW(double, n);
    for (size_t k = 0; k < n; k++) { /* column k of the permutation matrix */
        memset(e, 0, n * sizeof(double));
        e[k] = 1;
        ref_permute(col, e, rank, dims, perm);
        rdx[k] = 0;
        for (size_t i = 0; i < n; i++)
            rdx[k] += col[i] * dout[i];
    }
    rt_assert_err(rt_rel_err_delta(dx, dx0, rdx, n), RT_TOL, "permute bwd");
    perm_fd st = {rank, dims, perm, rt_to_double(dout, n), xd, RT_NEW(double, n)};
    rt_assert_err(rt_fd_check(perm_f, NULL, &st, xd, n, dx, dx0, 200), RT_TOL, "permute bwd fd");

    int bad[4] = {0, 0, 1, 2}; /* not a permutation */
    assert_int_equal(sbprt_permute_forward(ctx, out, x, 4, dims, bad), SBPRT_ERR_INVALID);
    free((void *)st.w), free(st.out);
    free(x), free(out), free(xd), free(ref), free(dout), free(dx), free(dx0), free(rdx), free(e),
        free(col);
    sbprt_ctx_destroy(ctx);
}

static void test_permute(void **state)
{
    (void)state;
    const int dims[4] = {2, 3, 4, 5};
    const int heads_first[4] = {0, 2, 1, 3}; /* [B, T, H, D] <-> [B, H, T, D] */
    const int scrambled[4] = {3, 1, 0, 2};
    check_permute(4, dims, heads_first, 91);
    check_permute(4, dims, scrambled, 92);
}

/* ---- column-block copies ------------------------------------------------------------ */

static void test_copy_cols(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {93};
    enum { ROWS = 7, SLD = 10, DLD = 12, W = 4, SOFF = 3, DOFF = 5 };
    float *src = rt_random(&r, ROWS * SLD, -1, 1), *dst = rt_random(&r, ROWS * DLD, -1, 1);
    float *dst0 = rt_copy(dst, ROWS * DLD);
    double *ref = RT_NEW(double, ROWS * DLD);
    for (int acc = 0; acc < 2; acc++) {
        memcpy(dst, dst0, ROWS * DLD * sizeof(float));
        for (int i = 0; i < ROWS * DLD; i++) {
            int row = i / DLD, c = i % DLD;
            ref[i] = dst0[i];
            if (c >= DOFF && c < DOFF + W)
                ref[i] = (acc ? (double)dst0[i] : 0.0) + src[row * SLD + SOFF + c - DOFF];
        }
        rt_assert_ok(sbprt_copy_cols(ctx, dst, src, ROWS, W, DLD, DOFF, SLD, SOFF, acc));
        rt_assert_err(rt_rel_err(dst, ref, ROWS * DLD), RT_TOL, "copy_cols");
        for (int i = 0; i < ROWS * DLD; i++) /* columns outside the block are untouched */
            if (i % DLD < DOFF || i % DLD >= DOFF + W)
                assert_true(dst[i] == dst0[i]);
    }
    assert_int_equal(sbprt_copy_cols(ctx, dst, src, ROWS, W, DLD, DLD - W + 1, SLD, SOFF, 0),
                     SBPRT_ERR_INVALID); /* block runs past the row */
    free(src), free(dst), free(dst0), free(ref);
    sbprt_ctx_destroy(ctx);
}

/* ---- broadcasting binary ops -------------------------------------------------------- */

#define BR 3 /* rank */
static const int OUT_DIMS[BR] = {2, 3, 5}, A_DIMS[BR] = {2, 1, 5}, B_DIMS[BR] = {1, 3, 1};

static double ref_op(int op, double a, double b)
{
    switch (op) {
    case SBPRT_BIN_ADD: return a + b;
    case SBPRT_BIN_SUB: return a - b;
    case SBPRT_BIN_MUL: return a * b;
    default: return a / b;
    }
}

/* Operand element feeding output multi-index oi: its extent-1 axes read index 0. */
static size_t operand_at(const int *odims, const int *oi)
{
    int idx[BR];
    for (int i = 0; i < BR; i++)
        idx[i] = odims[i] == 1 ? 0 : oi[i];
    return ravel(BR, odims, idx);
}

static void ref_broadcast(double *out, const double *a, const double *b, int op)
{
    int oi[BR];
    for (size_t o = 0; o < numel(BR, OUT_DIMS); o++) {
        unravel(o, BR, OUT_DIMS, oi);
        out[o] = ref_op(op, a[operand_at(A_DIMS, oi)], b[operand_at(B_DIMS, oi)]);
    }
}

typedef struct {
    int op;
    const double *w;
    double *a, *b, *out;
} bc_fd;

static double bc_f(void *p)
{
    bc_fd *s = p;
    ref_broadcast(s->out, s->a, s->b, s->op);
    double f = 0;
    for (size_t i = 0; i < numel(BR, OUT_DIMS); i++)
        f += s->w[i] * s->out[i];
    return f;
}

static void test_broadcast(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {94};
    const size_t n = numel(BR, OUT_DIMS), na = numel(BR, A_DIMS), nb = numel(BR, B_DIMS);
    const char *names[4] = {"broadcast add", "broadcast sub", "broadcast mul", "broadcast div"};
    for (int op = SBPRT_BIN_ADD; op <= SBPRT_BIN_DIV; op++) {
        float *a = rt_random(&r, na, -1, 1), *b = rt_random(&r, nb, 0.5f, 1.5f); /* b ≠ 0 */
        float *out = RT_NEW(float, n);
        double *ad = rt_to_double(a, na), *bd = rt_to_double(b, nb), *ref = RT_NEW(double, n);
        ref_broadcast(ref, ad, bd, op);
        rt_assert_ok(sbprt_broadcast_forward(ctx, out, a, b, op, BR, OUT_DIMS, A_DIMS, B_DIMS));
        rt_assert_err(rt_rel_err(out, ref, n), RT_TOL, names[op]);

        float *dout = rt_random(&r, n, -1, 1);
        float *da = rt_random(&r, na, -1, 1), *db = rt_random(&r, nb, -1, 1);
        float *da0 = rt_copy(da, na), *db0 = rt_copy(db, nb);
        rt_assert_ok(sbprt_broadcast_backward(ctx, da, db, dout, a, b, op, BR, OUT_DIMS, A_DIMS,
                                              B_DIMS));
        /* analytic: sum ∂out/∂operand * dout over the output elements each operand feeds */
        double *rda = calloc(na, sizeof(double)), *rdb = calloc(nb, sizeof(double));
        int oi[BR];
        for (size_t o = 0; o < n; o++) {
            unravel(o, BR, OUT_DIMS, oi);
            size_t ia = operand_at(A_DIMS, oi), ib = operand_at(B_DIMS, oi);
            double g = dout[o], x = ad[ia], y = bd[ib];
            double pa = op == SBPRT_BIN_MUL ? y : op == SBPRT_BIN_DIV ? 1 / y : 1;
            double pb = op == SBPRT_BIN_ADD ? 1
                      : op == SBPRT_BIN_SUB ? -1
                      : op == SBPRT_BIN_MUL ? x
                                            : -x / (y * y);
            rda[ia] += g * pa;
            rdb[ib] += g * pb;
        }
        rt_assert_err(rt_rel_err_delta(da, da0, rda, na), RT_TOL, names[op]);
        rt_assert_err(rt_rel_err_delta(db, db0, rdb, nb), RT_TOL, names[op]);
        bc_fd st = {op, rt_to_double(dout, n), ad, bd, RT_NEW(double, n)};
        rt_assert_err(rt_fd_check(bc_f, NULL, &st, ad, na, da, da0, na), RT_TOL, names[op]);
        rt_assert_err(rt_fd_check(bc_f, NULL, &st, bd, nb, db, db0, nb), RT_TOL, names[op]);

        free((void *)st.w), free(st.out);
        free(a), free(b), free(out), free(ad), free(bd), free(ref), free(dout), free(da),
            free(db), free(da0), free(db0), free(rda), free(rdb);
    }
    const int bad[BR] = {2, 2, 5}; /* 2 does not broadcast to 3 */
    float x[30] = {0}, y[30] = {0}, z[30];
    assert_int_equal(sbprt_broadcast_forward(ctx, z, x, y, SBPRT_BIN_ADD, BR, OUT_DIMS, bad,
                                             B_DIMS),
                     SBPRT_ERR_INVALID);
    sbprt_ctx_destroy(ctx);
}

/* Five extents of 2^16: 2^80 elements, a count that wraps size_t to exactly 0, so an
 * unchecked product would return SBPRT_OK having done nothing ("success" on a wrong size). A
 * zero extent does not excuse the others. The buffers are never touched: the dims are refused
 * before any element is. */
static void test_overflowing_dims(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    float x[4] = {0}, y[4] = {0}, out[4] = {0};
    sbprt_bf16 hx[4] = {{0}}, hout[4] = {{0}};
    const int wrap[5] = {65536, 65536, 65536, 65536, 65536};
    const int wrap0[6] = {0, 65536, 65536, 65536, 65536, 65536};
    const int ones[5] = {1, 1, 1, 1, 1};
    const int perm[5] = {4, 3, 2, 1, 0}, perm6[6] = {5, 4, 3, 2, 1, 0};
    assert_int_equal(sbprt_permute_forward(ctx, out, x, 5, wrap, perm), SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_permute_backward(ctx, out, x, 5, wrap, perm), SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_permute_forward(ctx, out, x, 6, wrap0, perm6), SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_permute_forward_bf16(ctx, hout, hx, 5, wrap, perm), SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_broadcast_forward(ctx, out, x, y, SBPRT_BIN_ADD, 5, wrap, ones, ones),
                     SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_broadcast_backward(ctx, out, NULL, x, x, y, SBPRT_BIN_MUL, 5, wrap,
                                              ones, ones),
                     SBPRT_ERR_INVALID);
    /* copy_cols: an offset plus a width past INT_MAX must not wrap into "inside the row" */
    assert_int_equal(sbprt_copy_cols(ctx, out, x, 1, 2, INT_MAX, INT_MAX - 1, 2, 0, 0),
                     SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_copy_cols(ctx, out, x, 1, 2, 2, 0, INT_MAX, INT_MAX - 1, 0),
                     SBPRT_ERR_INVALID);
    sbprt_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_permute),
        cmocka_unit_test(test_copy_cols),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_overflowing_dims),
    };
    return cmocka_run_group_tests_name("runtime_extra", tests, NULL, NULL);
}
