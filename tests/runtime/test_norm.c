/*
 * test_norm.c — LayerNorm and RMSNorm, forward (with saved statistics) and backward (dx,
 * dgamma, dbeta), against double references and finite differences.
 */
#include "rt_test.h"

#define ROWS 19
#define COLS 150 /* three column blocks of the parameter-gradient pass, the last partial */
#define EPS 1e-5f /* the kernel gets it as float; the reference uses the same value */

/* Reference LayerNorm in double over `rows` rows; also the finite-difference function's
 * body. */
static void ref_layernorm(double *out, double *mean, double *rstd, const double *x,
                          const double *gamma, const double *beta, int rows)
{
    for (int r = 0; r < rows; r++) {
        const double *xr = x + r * COLS;
        double mu = 0, var = 0;
        for (int j = 0; j < COLS; j++)
            mu += xr[j];
        mu /= COLS;
        for (int j = 0; j < COLS; j++)
            var += (xr[j] - mu) * (xr[j] - mu);
        double rs = 1 / sqrt(var / COLS + EPS);
        for (int j = 0; j < COLS; j++)
            out[r * COLS + j] = (xr[j] - mu) * rs * gamma[j] + (beta ? beta[j] : 0);
        if (mean)
            mean[r] = mu;
        if (rstd)
            rstd[r] = rs;
    }
}

static void ref_rmsnorm(double *out, double *rstd, const double *x, const double *gamma, int rows)
{
    for (int r = 0; r < rows; r++) {
        const double *xr = x + r * COLS;
        double ss = 0;
        for (int j = 0; j < COLS; j++)
            ss += xr[j] * xr[j];
        double rs = 1 / sqrt(ss / COLS + EPS);
        for (int j = 0; j < COLS; j++)
            out[r * COLS + j] = xr[j] * rs * gamma[j];
        if (rstd)
            rstd[r] = rs;
    }
}

/* f = Σ w ∘ norm(x; gamma, beta) over rows [r0, r1). */
typedef struct {
    int rms;
    const double *w;
    double *x, *gamma, *beta, *out;
    int r0, r1;
} norm_fd;

static double norm_f(void *p)
{
    norm_fd *s = p;
    const size_t o = (size_t)s->r0 * COLS;
    if (s->rms)
        ref_rmsnorm(s->out + o, NULL, s->x + o, s->gamma, s->r1 - s->r0);
    else
        ref_layernorm(s->out + o, NULL, NULL, s->x + o, s->gamma, s->beta, s->r1 - s->r0);
    double f = 0;
    for (size_t i = o; i < (size_t)s->r1 * COLS; i++)
        f += s->w[i] * s->out[i];
    return f;
}

/* An element of x influences its own row only; gamma and beta influence every row. */
static void norm_focus_x(void *p, size_t i)
{
    norm_fd *s = p;
    s->r0 = (int)(i / COLS), s->r1 = s->r0 + 1;
}

static void norm_focus_all(void *p, size_t i)
{
    (void)i;
    norm_fd *s = p;
    s->r0 = 0, s->r1 = ROWS;
}

/* Analytic backward in double: dx, dgamma, dbeta (dbeta ignored for RMSNorm). */
static void ref_norm_backward(int rms, double *dx, double *dgamma, double *dbeta,
                              const double *dy, const double *x, const double *gamma)
{
    memset(dgamma, 0, COLS * sizeof(double));
    memset(dbeta, 0, COLS * sizeof(double));
    for (int r = 0; r < ROWS; r++) {
        const double *xr = x + r * COLS, *dyr = dy + r * COLS;
        double mu = 0, ss = 0;
        for (int j = 0; j < COLS; j++)
            mu += xr[j];
        mu = rms ? 0 : mu / COLS;
        for (int j = 0; j < COLS; j++)
            ss += (xr[j] - mu) * (xr[j] - mu);
        double rs = 1 / sqrt(ss / COLS + EPS);
        double mg = 0, mgx = 0;
        for (int j = 0; j < COLS; j++) {
            double xhat = (xr[j] - mu) * rs, g = dyr[j] * gamma[j];
            mg += g / COLS;
            mgx += g * xhat / COLS;
            dgamma[j] += dyr[j] * xhat;
            dbeta[j] += dyr[j];
        }
        for (int j = 0; j < COLS; j++) {
            double xhat = (xr[j] - mu) * rs, g = dyr[j] * gamma[j];
            dx[r * COLS + j] = rs * (g - (rms ? 0 : mg) - xhat * mgx);
        }
    }
}

static void check_norm(int rms)
{
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {21 + rms};
    const size_t n = (size_t)ROWS * COLS;
    float *x = rt_random(&r, n, -2, 3); /* nonzero mean, so LayerNorm's centring matters */
    float *gamma = rt_random(&r, COLS, 0.5f, 1.5f), *beta = rt_random(&r, COLS, -1, 1);
    float *out = RT_NEW(float, n), *mean = RT_NEW(float, ROWS), *rstd = RT_NEW(float, ROWS);
    double *xd = rt_to_double(x, n), *gd = rt_to_double(gamma, COLS),
           *bd = rt_to_double(beta, COLS);
    double *ref = RT_NEW(double, n), *rmean = RT_NEW(double, ROWS), *rrstd = RT_NEW(double, ROWS);
    const char *name = rms ? "rmsnorm" : "layernorm";

    if (rms) {
        ref_rmsnorm(ref, rrstd, xd, gd, ROWS);
        rt_assert_ok(sbprt_rmsnorm_forward(ctx, out, rstd, x, gamma, ROWS, COLS, EPS));
    } else {
        ref_layernorm(ref, rmean, rrstd, xd, gd, bd, ROWS);
        rt_assert_ok(sbprt_layernorm_forward(ctx, out, mean, rstd, x, gamma, beta, ROWS, COLS, EPS));
        rt_assert_err(rt_rel_err(mean, rmean, ROWS), RT_TOL, "layernorm mean");
    }
    rt_assert_err(rt_rel_err(out, ref, n), RT_TOL, name);
    rt_assert_err(rt_rel_err(rstd, rrstd, ROWS), RT_TOL, name);

    float *dy = rt_random(&r, n, -1, 1);
    float *dx = rt_random(&r, n, -1, 1), *dg = rt_random(&r, COLS, -1, 1),
          *db = rt_random(&r, COLS, -1, 1);
    float *dx0 = rt_copy(dx, n), *dg0 = rt_copy(dg, COLS), *db0 = rt_copy(db, COLS);
    if (rms)
        rt_assert_ok(sbprt_rmsnorm_backward(ctx, dx, dg, dy, x, gamma, rstd, ROWS, COLS));
    else
        rt_assert_ok(sbprt_layernorm_backward(ctx, dx, dg, db, dy, x, gamma, mean, rstd, ROWS,
                                              COLS));
    double *dyd = rt_to_double(dy, n), *rdx = RT_NEW(double, n), *rdg = RT_NEW(double, COLS),
           *rdb = RT_NEW(double, COLS);
    ref_norm_backward(rms, rdx, rdg, rdb, dyd, xd, gd);
    rt_assert_err(rt_rel_err_delta(dx, dx0, rdx, n), RT_TOL, "norm dx");
    rt_assert_err(rt_rel_err_delta(dg, dg0, rdg, COLS), RT_TOL, "norm dgamma");
    if (!rms)
        rt_assert_err(rt_rel_err_delta(db, db0, rdb, COLS), RT_TOL, "norm dbeta");

    norm_fd st = {rms, dyd, xd, gd, bd, RT_NEW(double, n), 0, ROWS};
    rt_assert_err(rt_fd_check(norm_f, norm_focus_x, &st, xd, n, dx, dx0, n), RT_TOL,
                  "norm dx fd");
    rt_assert_err(rt_fd_check(norm_f, norm_focus_all, &st, gd, COLS, dg, dg0, COLS), RT_TOL,
                  "norm dgamma fd");
    if (!rms)
        rt_assert_err(rt_fd_check(norm_f, norm_focus_all, &st, bd, COLS, db, db0, COLS), RT_TOL,
                      "norm dbeta fd");

    /* NULL gradient outputs are skipped: dgamma alone gives the same increment. */
    memcpy(dg, dg0, COLS * sizeof(float));
    if (rms)
        rt_assert_ok(sbprt_rmsnorm_backward(ctx, NULL, dg, dy, x, gamma, rstd, ROWS, COLS));
    else
        rt_assert_ok(sbprt_layernorm_backward(ctx, NULL, dg, NULL, dy, x, gamma, mean, rstd,
                                              ROWS, COLS));
    rt_assert_err(rt_rel_err_delta(dg, dg0, rdg, COLS), RT_TOL, "norm dgamma only");

    /* in-place forward */
    float *inplace = rt_copy(x, n);
    if (rms)
        rt_assert_ok(sbprt_rmsnorm_forward(ctx, inplace, NULL, inplace, gamma, ROWS, COLS, EPS));
    else
        rt_assert_ok(sbprt_layernorm_forward(ctx, inplace, NULL, NULL, inplace, gamma, beta, ROWS,
                                             COLS, EPS));
    assert_memory_equal(inplace, out, n * sizeof(float));

    free(st.out), free(inplace);
    free(x), free(gamma), free(beta), free(out), free(mean), free(rstd), free(xd), free(gd),
        free(bd), free(ref), free(rmean), free(rrstd), free(dy), free(dx), free(dg), free(db),
        free(dx0), free(dg0), free(db0), free(dyd), free(rdx), free(rdg), free(rdb);
    sbprt_ctx_destroy(ctx);
}

static void test_layernorm(void **state)
{
    (void)state;
    check_norm(0);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    check_norm(1);
}

static void test_layernorm_no_bias(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {23};
    const size_t n = (size_t)ROWS * COLS;
    float *x = rt_random(&r, n, -1, 1), *gamma = rt_random(&r, COLS, 0.5f, 1.5f);
    float *out = RT_NEW(float, n);
    double *xd = rt_to_double(x, n), *gd = rt_to_double(gamma, COLS), *ref = RT_NEW(double, n);
    ref_layernorm(ref, NULL, NULL, xd, gd, NULL, ROWS);
    rt_assert_ok(sbprt_layernorm_forward(ctx, out, NULL, NULL, x, gamma, NULL, ROWS, COLS, EPS));
    rt_assert_err(rt_rel_err(out, ref, n), RT_TOL, "layernorm without beta");
    assert_int_equal(sbprt_layernorm_forward(ctx, out, NULL, NULL, x, NULL, NULL, ROWS, COLS, EPS),
                     SBPRT_ERR_INVALID);
    free(x), free(gamma), free(out), free(xd), free(gd), free(ref);
    sbprt_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_layernorm_no_bias),
    };
    return cmocka_run_group_tests_name("runtime_norm", tests, NULL, NULL);
}
