/*
 * test_optim.c — SGD and AdamW against double references of torch.optim's formulas, over
 * three steps with fresh gradients each step; the multi-tensor forms (several spans of flat
 * blocks, with gaps and an empty span) against the same references and bit for bit against
 * the per-tensor calls, and the multi-tensor norm against a double sum.
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

/* Three tensors at scattered offsets of flat blocks (the gaps must stay untouched), one empty. */
#define MB 50000
static const sbprt_span spans_ref[] = {
    {100, 7, 3, 20000}, {30000, 25000, 21000, 4097}, {40000, 40000, 30000, 0}, {21000, 30000, 26000, 3}};
#define NSP ((int)(sizeof spans_ref / sizeof spans_ref[0]))

static void test_multi(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {73};
    const double lr = 0.05, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
    float *p = rt_random(&r, MB, -1, 1), *g = rt_random(&r, MB, -1, 1);
    float *m = calloc(MB, sizeof(float)), *v = calloc(MB, sizeof(float));
    float *p1 = rt_copy(p, MB), *m1 = calloc(MB, sizeof(float)), *v1 = calloc(MB, sizeof(float));
    double *rp = rt_to_double(p, MB), *rm = calloc(MB, sizeof(double)), *rv = calloc(MB, sizeof(double));
    const float *p0 = rt_copy(p, MB);
    for (int step = 1; step <= STEPS; step++) {
        rt_assert_ok(sbprt_adamw_update_multi(ctx, p, m, v, g, spans_ref, NSP, lr, b1, b2, eps, wd,
                                              step));
        for (int k = 0; k < NSP; k++) {
            const sbprt_span *s = &spans_ref[k];
            rt_assert_ok(sbprt_adamw_update(ctx, p1 + s->param, m1 + s->state, v1 + s->state,
                                            g + s->grad, s->n, lr, b1, b2, eps, wd, step));
            double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
            for (size_t i = 0; i < s->n; i++) { /* torch.optim.AdamW in double */
                double *x = &rp[s->param + i], *mm = &rm[s->state + i], *vv = &rv[s->state + i];
                const double gi = g[s->grad + i];
                *x *= 1 - lr * wd;
                *mm = b1 * *mm + (1 - b1) * gi;
                *vv = b2 * *vv + (1 - b2) * gi * gi;
                *x -= lr / bc1 * *mm / (sqrt(*vv) / sqrt(bc2) + eps);
            }
        }
    }
    assert_memory_equal(p, p1, MB * sizeof(float)); /* the per-tensor calls' bits, gaps too */
    assert_memory_equal(m, m1, MB * sizeof(float));
    assert_memory_equal(v, v1, MB * sizeof(float));
    double *upd = RT_NEW(double, MB);
    for (size_t i = 0; i < MB; i++)
        upd[i] = rp[i] - p0[i];
    rt_assert_err(rt_rel_err_delta(p, p0, upd, MB), RT_TOL, "adamw multi param update");
    rt_assert_err(rt_rel_err(m, rm, MB), RT_TOL, "adamw multi m");

    /* SGD, the norm and the scaling on the same spans */
    float *q = rt_copy(p0, MB), *q1 = rt_copy(p0, MB);
    rt_assert_ok(sbprt_sgd_update_multi(ctx, q, g, spans_ref, NSP, lr, wd));
    for (int k = 0; k < NSP; k++)
        rt_assert_ok(sbprt_sgd_update(ctx, q1 + spans_ref[k].param, g + spans_ref[k].grad,
                                      spans_ref[k].n, lr, wd));
    assert_memory_equal(q, q1, MB * sizeof(float));
    double sq = 0, sq1 = 0, ref = 0;
    rt_assert_ok(sbprt_grad_sq_norm_multi(ctx, &sq, g, spans_ref, NSP));
    for (int k = 0; k < NSP; k++) {
        rt_assert_ok(sbprt_grad_sq_norm(ctx, &sq1, g + spans_ref[k].grad, spans_ref[k].n));
        for (size_t i = 0; i < spans_ref[k].n; i++)
            ref += (double)g[spans_ref[k].grad + i] * g[spans_ref[k].grad + i];
    }
    assert_true(sq == sq1);
    assert_true(fabs(sq - ref) <= 1e-12 * ref);
    float *h = rt_copy(g, MB);
    rt_assert_ok(sbprt_scale_multi(ctx, h, spans_ref, NSP, 0.25f));
    for (int k = 0; k < NSP; k++)
        for (size_t i = 0; i < spans_ref[k].n; i++)
            g[spans_ref[k].grad + i] *= 0.25f; /* exact: a power of two */
    assert_memory_equal(h, g, MB * sizeof(float));
    free(p), free(g), free(m), free(v), free(p1), free(m1), free(v1), free(rp), free(rm), free(rv);
    free((void *)p0), free(upd), free(q), free(q1), free(h);
    sbprt_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_multi),
    };
    return cmocka_run_group_tests_name("runtime_optim", tests, NULL, NULL);
}
