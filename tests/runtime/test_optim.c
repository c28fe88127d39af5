/*
 * test_optim.c — SGD and AdamW against double references of torch.optim's formulas, over
 * three steps with fresh gradients each step.
 */
#include "rt_test.h"

#define N 20000 /* above the parallel threshold */
#define STEPS 3

static void test_adamw(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {71};
    const double lr = 0.05, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
    float *p = rt_random(&r, N, -1, 1), *m = calloc(N, sizeof(float)), *v = calloc(N, sizeof(float));
    float *p0 = rt_copy(p, N);
    double *rp = rt_to_double(p, N), *rm = calloc(N, sizeof(double)), *rv = calloc(N, sizeof(double));
    float *g = RT_NEW(float, N);
    for (int step = 1; step <= STEPS; step++) {
        rt_fill(&r, g, N, -1, 1);
        rt_assert_ok(sbprt_adamw_update(ctx, p, m, v, g, N, lr, b1, b2, eps, wd, step));
        /* torch.optim.AdamW, single-tensor path, in double */
        double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
        for (size_t i = 0; i < N; i++) {
            rp[i] *= 1 - lr * wd;
            rm[i] = b1 * rm[i] + (1 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1 - b2) * (double)g[i] * g[i];
            rp[i] -= lr / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + eps);
        }
    }
    /* compare the total update, not the parameters (which would hide its error) */
    double *upd = RT_NEW(double, N);
    for (size_t i = 0; i < N; i++)
        upd[i] = rp[i] - p0[i];
    rt_assert_err(rt_rel_err_delta(p, p0, upd, N), RT_TOL, "adamw param update");
    rt_assert_err(rt_rel_err(m, rm, N), RT_TOL, "adamw m");
    rt_assert_err(rt_rel_err(v, rv, N), RT_TOL, "adamw v");
    assert_int_equal(sbprt_adamw_update(ctx, p, m, v, g, N, 0.1f, 0.9f, 0.999f, 1e-8f, 0, 0),
                     SBPRT_ERR_INVALID); /* steps count from 1 */
    free(p), free(m), free(v), free(p0), free(rp), free(rm), free(rv), free(g), free(upd);
    sbprt_ctx_destroy(ctx);
}

static void test_sgd(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {72};
    const double lr = 0.1, wd = 0.01;
    float *p = rt_random(&r, N, -1, 1), *p0 = rt_copy(p, N), *g = RT_NEW(float, N);
    double *rp = rt_to_double(p, N), *upd = RT_NEW(double, N);
    for (int step = 1; step <= STEPS; step++) {
        rt_fill(&r, g, N, -1, 1);
        rt_assert_ok(sbprt_sgd_update(ctx, p, g, N, lr, wd));
        for (size_t i = 0; i < N; i++)
            rp[i] -= lr * (g[i] + wd * rp[i]);
    }
    for (size_t i = 0; i < N; i++)
        upd[i] = rp[i] - p0[i];
    rt_assert_err(rt_rel_err_delta(p, p0, upd, N), RT_TOL, "sgd update");
    free(p), free(p0), free(g), free(rp), free(upd);
    sbprt_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_sgd),
    };
    return cmocka_run_group_tests_name("runtime_optim", tests, NULL, NULL);
}
