/*
 * test_core.c — context, memory and status functions; GEMM and strided-batched GEMM; the
 * linear-layer bias; flat elementwise helpers, scaling by a scalar (fp32 and bf16, also
 * bitwise against the broadcast kernels they stand in for).  References are double loops.
 */
#include "rt_test.h"

static void test_ctx_and_memory(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(3);
    assert_int_equal(sbprt_ctx_nthreads(ctx), 3);
    assert_string_equal(sbprt_backend_name(), "cpu");
    rt_assert_ok(sbprt_sync(ctx));

    void *arena = NULL;
    rt_assert_ok(sbprt_arena_alloc(ctx, &arena, 1000));
    assert_non_null(arena);
    assert_int_equal((uintptr_t)arena % SBPRT_ALIGN, 0);

    float host[250], back[250];
    rt_rng r = {1};
    rt_fill(&r, host, 250, -1, 1);
    rt_assert_ok(sbprt_memcpy(ctx, arena, host, sizeof host, SBPRT_COPY_HOST_TO_DEVICE));
    rt_assert_ok(sbprt_memcpy(ctx, back, arena, sizeof back, SBPRT_COPY_DEVICE_TO_HOST));
    assert_memory_equal(host, back, sizeof host);
    rt_assert_ok(sbprt_memset_zero(ctx, arena, sizeof host));
    for (int i = 0; i < 250; i++)
        assert_true(((float *)arena)[i] == 0.0f);
    assert_int_equal(sbprt_memcpy(ctx, back, arena, 4, 7), SBPRT_ERR_INVALID);
    /* the "device" is the host: this process's resident set within physical memory */
    size_t used = 0, total = 0;
    rt_assert_ok(sbprt_device_memory(ctx, &used, &total));
    assert_true(used > 0 && used <= total);
    rt_assert_ok(sbprt_device_memory(ctx, NULL, NULL));
    assert_int_equal(sbprt_device_memory(NULL, &used, &total), SBPRT_ERR_INVALID);
    sbprt_arena_free(ctx, arena);
    sbprt_arena_free(ctx, NULL);

    sbprt_ctx *dflt = rt_ctx(0); /* the OpenMP default */
    assert_true(sbprt_ctx_nthreads(dflt) >= 1);
    sbprt_ctx_destroy(dflt);
    sbprt_ctx_destroy(ctx);
    sbprt_ctx_destroy(NULL);

    assert_int_equal(sbprt_ctx_create(NULL, 1), SBPRT_ERR_INVALID);
    assert_string_equal(sbprt_status_string(SBPRT_ERR_RANGE), "index out of range");
    assert_non_null(sbprt_status_string(12345));
}

/* c[m, n] = alpha * op(a) op(b) + beta * c0, a[i, l] read through lda and transposition. */
static void ref_gemm(double *c, const float *a, const float *b, const float *c0, int ta, int tb,
                     int m, int n, int k, double alpha, double beta, int lda, int ldb, int ldc)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int l = 0; l < k; l++) {
                double av = ta ? a[(size_t)l * lda + i] : a[(size_t)i * lda + l];
                double bv = tb ? b[(size_t)j * ldb + l] : b[(size_t)l * ldb + j];
                s += av * bv;
            }
            c[i * n + j] = alpha * s + beta * c0[(size_t)i * ldc + j];
        }
}

static void test_gemm(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {2};
    const int m = 13, n = 9, k = 17;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            float *a = rt_random(&r, (size_t)m * k, -1, 1);
            float *b = rt_random(&r, (size_t)k * n, -1, 1);
            float *c = rt_random(&r, (size_t)m * n, -1, 1);
            double *ref = RT_NEW(double, m * n);
            ref_gemm(ref, a, b, c, ta, tb, m, n, k, 0.7, 0.3, ta ? m : k, tb ? k : n, n);
            rt_assert_ok(sbprt_gemm(ctx, c, a, b, ta, tb, m, n, k, 0.7f, 0.3f));
            rt_assert_err(rt_rel_err(c, ref, (size_t)m * n), RT_TOL, "gemm");
            free(a), free(b), free(c), free(ref);
        }
    assert_int_equal(sbprt_gemm(ctx, NULL, NULL, NULL, 0, 0, 2, 2, 2, 1, 0), SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_gemm(ctx, NULL, NULL, NULL, 0, 0, -1, 2, 2, 1, 0), SBPRT_ERR_INVALID);
    rt_assert_ok(sbprt_gemm(ctx, NULL, NULL, NULL, 0, 0, 0, 2, 2, 1, 0));
    sbprt_ctx_destroy(ctx);
}

static void test_gemm_strided_batched(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {3};
    /* a_i: [m, k] stored with lda = k + 3 (a view into wider rows); b_i: [n, k] (trans_b),
     * shared by every batch (stride 0); c_i: [m, n] with ldc = n + 2. */
    const int m = 7, n = 5, k = 11, batch = 3, lda = k + 3, ldb = k, ldc = n + 2;
    const int64_t sa = (int64_t)m * lda + 4, sc = (int64_t)m * ldc + 1;
    float *a = rt_random(&r, (size_t)sa * batch, -1, 1);
    float *b = rt_random(&r, (size_t)n * k, -1, 1);
    float *c = rt_random(&r, (size_t)sc * batch, -1, 1);
    float *c0 = rt_copy(c, (size_t)sc * batch);
    rt_assert_ok(sbprt_gemm_strided_batched(ctx, c, a, b, 0, 1, m, n, k, 1.5f, -0.5f, lda, sa,
                                            ldb, 0, ldc, sc, batch));
    double *ref = RT_NEW(double, m * n);
    float *got = RT_NEW(float, m * n);
    for (int i = 0; i < batch; i++) {
        ref_gemm(ref, a + i * sa, b, c0 + i * sc, 0, 1, m, n, k, 1.5, -0.5, lda, ldb, ldc);
        for (int row = 0; row < m; row++)
            memcpy(got + row * n, c + i * sc + (size_t)row * ldc, n * sizeof(float));
        rt_assert_err(rt_rel_err(got, ref, (size_t)m * n), RT_TOL, "strided batched gemm");
        /* the padding between rows of c_i is not touched */
        for (int row = 0; row < m; row++)
            for (int j = n; j < ldc; j++)
                assert_true(c[i * sc + (size_t)row * ldc + j] == c0[i * sc + (size_t)row * ldc + j]);
    }
    assert_int_equal(sbprt_gemm_strided_batched(ctx, c, a, b, 0, 1, m, n, k, 1, 0, k - 1, sa, ldb,
                                                0, ldc, sc, batch),
                     SBPRT_ERR_INVALID);
    free(a), free(b), free(c), free(c0), free(ref), free(got);
    sbprt_ctx_destroy(ctx);
}

/* The products large enough to be split over threads (gemm.c): rows split (m >= n) and
 * columns split (n > m), every transposition, sizes that are not multiples of the split's
 * alignment, leading dimensions wider than the rows, 1 to 3 threads; and a batch of small
 * products run one per thread. Each against the float64 reference; the padding of C and
 * the results for the same thread count run twice must be untouched / identical. */
static void test_gemm_split(void **state)
{
    (void)state;
    rt_rng r = {4};
    const int shapes[][3] = {{150, 70, 40}, {37, 301, 29}, {64, 64, 130}};
    for (int si = 0; si < 3; si++)
        for (int nt = 1; nt <= 3; nt++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                    sbprt_ctx *ctx = rt_ctx(nt);
                    const int m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
                    const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 5;
                    float *a = rt_random(&r, (size_t)(ta ? k : m) * lda, -1, 1);
                    float *b = rt_random(&r, (size_t)(tb ? n : k) * ldb, -1, 1);
                    float *c = rt_random(&r, (size_t)m * ldc, -1, 1);
                    float *c0 = rt_copy(c, (size_t)m * ldc);
                    double *ref = RT_NEW(double, (size_t)m * n);
                    float *got = RT_NEW(float, (size_t)m * n);
                    ref_gemm(ref, a, b, c0, ta, tb, m, n, k, 0.5, -1.25, lda, ldb, ldc);
                    rt_assert_ok(sbprt_gemm_strided_batched(ctx, c, a, b, ta, tb, m, n, k, 0.5f,
                                                            -1.25f, lda, 0, ldb, 0, ldc, 0, 1));
                    for (int row = 0; row < m; row++) {
                        memcpy(got + (size_t)row * n, c + (size_t)row * ldc, n * sizeof(float));
                        for (int j = n; j < ldc; j++)
                            assert_true(c[(size_t)row * ldc + j] == c0[(size_t)row * ldc + j]);
                    }
                    rt_assert_err(rt_rel_err(got, ref, (size_t)m * n), RT_TOL, "split gemm");
                    float *again = rt_copy(c0, (size_t)m * ldc);
                    rt_assert_ok(sbprt_gemm_strided_batched(ctx, again, a, b, ta, tb, m, n, k,
                                                            0.5f, -1.25f, lda, 0, ldb, 0, ldc, 0,
                                                            1));
                    assert_memory_equal(again, c, (size_t)m * ldc * sizeof(float));
                    free(a), free(b), free(c), free(c0), free(ref), free(got), free(again);
                    sbprt_ctx_destroy(ctx);
                }
    /* 7 products of [9, 12] x [12, 6]^T on 3 threads: each product on one thread */
    sbprt_ctx *ctx = rt_ctx(3);
    const int m = 9, n = 6, k = 12, batch = 7;
    float *a = rt_random(&r, (size_t)batch * m * k, -1, 1);
    float *b = rt_random(&r, (size_t)batch * n * k, -1, 1);
    float *c = rt_random(&r, (size_t)batch * m * n, -1, 1);
    float *c0 = rt_copy(c, (size_t)batch * m * n);
    rt_assert_ok(sbprt_gemm_strided_batched(ctx, c, a, b, 0, 1, m, n, k, 1.0f, 1.0f, k,
                                            (int64_t)m * k, k, (int64_t)n * k, n,
                                            (int64_t)m * n, batch));
    double *ref = RT_NEW(double, (size_t)m * n);
    for (int i = 0; i < batch; i++) {
        ref_gemm(ref, a + (size_t)i * m * k, b + (size_t)i * n * k, c0 + (size_t)i * m * n, 0, 1,
                 m, n, k, 1.0, 1.0, k, k, n);
        rt_assert_err(rt_rel_err(c + (size_t)i * m * n, ref, (size_t)m * n), RT_TOL,
                      "batched gemm over threads");
    }
    free(a), free(b), free(c), free(c0), free(ref);
    sbprt_ctx_destroy(ctx);
}

/* Finite-difference state for the bias: f(bias) = Σ w[r, j] * (y0[r, j] + bias[j]). */
typedef struct {
    const double *w, *y0;
    double *bias;
    int n, c;
} bias_fd;

static double bias_f(void *p)
{
    bias_fd *s = p;
    double f = 0;
    for (int r = 0; r < s->n; r++)
        for (int j = 0; j < s->c; j++)
            f += s->w[r * s->c + j] * (s->y0[r * s->c + j] + s->bias[j]);
    return f;
}

static void test_bias(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {4};
    const int n = 37, c = 150; /* c spans three column blocks, the last one partial */
    float *y = rt_random(&r, (size_t)n * c, -1, 1), *bias = rt_random(&r, c, -1, 1);
    float *y0 = rt_copy(y, (size_t)n * c);
    double *ref = RT_NEW(double, n * c);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c; j++)
            ref[i * c + j] = (double)y0[i * c + j] + bias[j];
    rt_assert_ok(sbprt_bias_add(ctx, y, bias, n, c));
    rt_assert_err(rt_rel_err(y, ref, (size_t)n * c), RT_TOL, "bias_add");

    float *dy = rt_random(&r, (size_t)n * c, -1, 1);
    float *db = rt_random(&r, c, -1, 1), *db0 = rt_copy(db, c);
    double *dref = RT_NEW(double, c);
    for (int j = 0; j < c; j++) {
        dref[j] = 0;
        for (int i = 0; i < n; i++)
            dref[j] += dy[i * c + j];
    }
    rt_assert_ok(sbprt_bias_backward(ctx, db, dy, n, c));
    rt_assert_err(rt_rel_err_delta(db, db0, dref, c), RT_TOL, "bias_backward");
    bias_fd st = {rt_to_double(dy, (size_t)n * c), rt_to_double(y0, (size_t)n * c),
                  rt_to_double(bias, c), n, c};
    rt_assert_err(rt_fd_check(bias_f, NULL, &st, st.bias, c, db, db0, c), RT_TOL, "bias_backward fd");
    free((void *)st.w), free((void *)st.y0), free(st.bias);
    free(y), free(bias), free(y0), free(ref), free(dy), free(db), free(db0), free(dref);
    sbprt_ctx_destroy(ctx);
}

static void test_elementwise_helpers(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {5};
    const size_t n = 40000; /* above the parallel threshold */
    float *a = rt_random(&r, n, -2, 2), *b = rt_random(&r, n, -2, 2), *out = RT_NEW(float, n);
    double *ref = RT_NEW(double, n);

    for (size_t i = 0; i < n; i++)
        ref[i] = (double)a[i] + b[i];
    rt_assert_ok(sbprt_add(ctx, out, a, b, n));
    rt_assert_err(rt_rel_err(out, ref, n), RT_TOL, "add");

    float *y = rt_copy(a, n);
    rt_assert_ok(sbprt_accumulate(ctx, y, b, n));
    rt_assert_err(rt_rel_err(y, ref, n), RT_TOL, "accumulate");


    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (double)a[i] * a[i];
    float got[1] = {0.25f};
    rt_assert_ok(sbprt_sum_squares(ctx, got, a, n));
    double want = 0.25 + ss;
    rt_assert_err(fabs(got[0] - want) / want, RT_TOL, "sum_squares");

    assert_int_equal(sbprt_add(ctx, NULL, a, b, n), SBPRT_ERR_INVALID);
    rt_assert_ok(sbprt_add(ctx, NULL, NULL, NULL, 0));
    free(a), free(b), free(out), free(ref), free(y);
    sbprt_ctx_destroy(ctx);
}

/* ---- scaling by a scalar (sbprt_scale, sbprt_div_scalar and their backwards) ----------- */

/* f = Σ w_i g(x_i) over [lo, hi), g(x) = x * c or x / c. */
typedef struct {
    const double *w;
    double *x;
    double c;
    int divide;
    size_t lo, hi;
} scale_fd;

static double scale_f(void *p)
{
    scale_fd *s = p;
    double f = 0;
    for (size_t i = s->lo; i < s->hi; i++)
        f += s->w[i] * (s->divide ? s->x[i] / s->c : s->x[i] * s->c);
    return f;
}

static void scale_focus(void *p, size_t i)
{
    scale_fd *s = p;
    s->lo = i, s->hi = i + 1;
}

static sbprt_bf16 bf_round(float f) /* nearest even, as the runtime (no NaN here) */
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    sbprt_bf16 h;
    h.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}

static float bf_value(sbprt_bf16 h)
{
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

typedef int (*scalar_fn)(sbprt_ctx *, float *, const float *, size_t, float);
typedef int (*scalar_bf_fn)(sbprt_ctx *, sbprt_bf16 *, const sbprt_bf16 *, size_t, float);

/* One of the two pairs, with constant c: against double formulas and finite differences;
 * in place; bitwise the broadcast kernels' result for a one-element operand, which is what
 * the compiler lowered x * c and x / c to before (and still does for non-constant ones), for
 * both operand orders of Mul; the same for any thread count; the bf16 forms bitwise the fp32
 * arithmetic on the bf16 values with one rounding. */
static void check_scalar_pair(scalar_fn fwd, scalar_fn bwd, scalar_bf_fn fwd_bf,
                              scalar_bf_fn bwd_bf, int divide, float c, const char *name)
{
    sbprt_ctx *ctx = rt_ctx(2), *ctx4 = rt_ctx(4);
    rt_rng r = {divide ? 23u : 21u};
    const size_t n = 40000; /* above the parallel threshold */
    const int dims[1] = {(int)n}, one[1] = {1};
    float *x = rt_random(&r, n, -3, 3), *y = RT_NEW(float, n), *y2 = RT_NEW(float, n);
    double *ref = RT_NEW(double, n);
    for (size_t i = 0; i < n; i++)
        ref[i] = divide ? (double)x[i] / c : (double)x[i] * c;
    rt_assert_ok(fwd(ctx, y, x, n, c));
    rt_assert_err(rt_rel_err(y, ref, n), RT_TOL, name);
    rt_assert_ok(sbprt_broadcast_forward(ctx, y2, x, &c, divide ? SBPRT_BIN_DIV : SBPRT_BIN_MUL,
                                         1, dims, dims, one));
    assert_memory_equal(y, y2, n * sizeof(float));
    if (!divide) { /* c * x */
        rt_assert_ok(sbprt_broadcast_forward(ctx, y2, &c, x, SBPRT_BIN_MUL, 1, dims, one, dims));
        assert_memory_equal(y, y2, n * sizeof(float));
    }
    float *inplace = rt_copy(x, n);
    rt_assert_ok(fwd(ctx4, inplace, inplace, n, c));
    assert_memory_equal(inplace, y, n * sizeof(float));

    float *dy = rt_random(&r, n, -1, 1);
    float *dx = rt_random(&r, n, -1, 1), *dx0 = rt_copy(dx, n), *dx2 = rt_copy(dx, n);
    for (size_t i = 0; i < n; i++)
        ref[i] = divide ? (double)dy[i] / c : (double)dy[i] * c;
    rt_assert_ok(bwd(ctx, dx, dy, n, c));
    rt_assert_err(rt_rel_err_delta(dx, dx0, ref, n), RT_TOL, name);
    scale_fd st = {rt_to_double(dy, n), rt_to_double(x, n), c, divide, 0, n};
    rt_assert_err(rt_fd_check(scale_f, scale_focus, &st, st.x, n, dx, dx0, n), RT_TOL, name);
    rt_assert_ok(sbprt_broadcast_backward(ctx, dx2, NULL, dy, x, &c,
                                          divide ? SBPRT_BIN_DIV : SBPRT_BIN_MUL, 1, dims, dims,
                                          one));
    assert_memory_equal(dx, dx2, n * sizeof(float));
    if (!divide) {
        memcpy(dx2, dx0, n * sizeof(float));
        rt_assert_ok(sbprt_broadcast_backward(ctx, NULL, dx2, dy, &c, x, SBPRT_BIN_MUL, 1, dims,
                                              one, dims));
        assert_memory_equal(dx, dx2, n * sizeof(float));
    }
    memcpy(dx2, dx0, n * sizeof(float));
    rt_assert_ok(bwd(ctx4, dx2, dy, n, c));
    assert_memory_equal(dx, dx2, n * sizeof(float));

    /* bf16: x, dy, dx as bf16; every output the fp32 arithmetic rounded once */
    sbprt_bf16 *xb = RT_NEW(sbprt_bf16, n), *yb = RT_NEW(sbprt_bf16, n);
    sbprt_bf16 *dyb = RT_NEW(sbprt_bf16, n), *dxb = RT_NEW(sbprt_bf16, n);
    for (size_t i = 0; i < n; i++) {
        xb[i] = bf_round(x[i]);
        dyb[i] = bf_round(dy[i]);
        dxb[i] = bf_round(dx0[i]);
    }
    rt_assert_ok(fwd_bf(ctx, yb, xb, n, c));
    for (size_t i = 0; i < n; i++) {
        float v = bf_value(xb[i]);
        float want = divide ? v / c : v * c;
        assert_int_equal(yb[i].bits, bf_round(want).bits);
    }
    rt_assert_ok(fwd_bf(ctx, xb, xb, n, c)); /* in place */
    assert_memory_equal(xb, yb, n * sizeof(sbprt_bf16));
    rt_assert_ok(bwd_bf(ctx, dxb, dyb, n, c));
    for (size_t i = 0; i < n; i++) {
        float g = bf_value(dyb[i]);
        float d = divide ? g / c : g * c;
        float want = bf_value(bf_round(dx0[i])) + d;
        assert_int_equal(dxb[i].bits, bf_round(want).bits);
    }

    assert_int_equal(fwd(ctx, NULL, x, n, c), SBPRT_ERR_INVALID);
    assert_int_equal(bwd(ctx, dx, NULL, n, c), SBPRT_ERR_INVALID);
    assert_int_equal(fwd_bf(ctx, yb, NULL, n, c), SBPRT_ERR_INVALID);
    rt_assert_ok(fwd(ctx, NULL, NULL, 0, c));
    rt_assert_ok(bwd_bf(ctx, NULL, NULL, 0, c));
    free((void *)st.w), free(st.x);
    free(x), free(y), free(y2), free(ref), free(inplace), free(dy), free(dx), free(dx0), free(dx2);
    free(xb), free(yb), free(dyb), free(dxb);
    sbprt_ctx_destroy(ctx);
    sbprt_ctx_destroy(ctx4);
}

static void test_scale(void **state)
{
    (void)state;
    /* constants whose reciprocal is not exact: a Div that multiplied by 1/c would differ */
    check_scalar_pair(sbprt_scale, sbprt_scale_accumulate, sbprt_scale_bf16,
                      sbprt_scale_accumulate_bf16, 0, -0.37f, "scale");
    check_scalar_pair(sbprt_div_scalar, sbprt_div_scalar_accumulate, sbprt_div_scalar_bf16,
                      sbprt_div_scalar_accumulate_bf16, 1, 30.0f, "div_scalar");
    check_scalar_pair(sbprt_div_scalar, sbprt_div_scalar_accumulate, sbprt_div_scalar_bf16,
                      sbprt_div_scalar_accumulate_bf16, 1, 0.7f, "div_scalar 0.7");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ctx_and_memory),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_gemm_strided_batched),
        cmocka_unit_test(test_gemm_split),
        cmocka_unit_test(test_bias),
        cmocka_unit_test(test_elementwise_helpers),
        cmocka_unit_test(test_scale),
    };
    return cmocka_run_group_tests_name("runtime_core", tests, NULL, NULL);
}
