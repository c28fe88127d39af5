/*
 * test_embedding.c — embedding lookup and its scatter-add backward (with repeated ids),
 * out-of-range ids, against a double reference and finite differences.
 */
#include "rt_test.h"

#define N 53
#define V 17 /* fewer rows than ids, so ids repeat */
#define C 100

/* f(table) = Σ_r w[r, :] · table[ids[r], :] */
typedef struct {
    const int32_t *ids;
    const double *w;
    double *table;
} emb_fd;

static double emb_f(void *p)
{
    emb_fd *s = p;
    double f = 0;
    for (int r = 0; r < N; r++)
        for (int j = 0; j < C; j++)
            f += s->w[r * C + j] * s->table[s->ids[r] * C + j];
    return f;
}

static void test_embedding(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {31};
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = rt_randint(&r, V);
    ids[3] = ids[7] = ids[40] = 5; /* at least one id repeats three times */
    float *table = rt_random(&r, V * C, -1, 1), *out = RT_NEW(float, N * C);
    double *ref = RT_NEW(double, N * C);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < C; j++)
            ref[i * C + j] = table[ids[i] * C + j];
    rt_assert_ok(sbprt_embedding_forward(ctx, out, table, ids, N, V, C));
    rt_assert_err(rt_rel_err(out, ref, N * C), RT_TOL, "embedding fwd");

    float *dout = rt_random(&r, N * C, -1, 1);
    float *dt = rt_random(&r, V * C, -1, 1), *dt0 = rt_copy(dt, V * C);
    double *dref = RT_NEW(double, V * C);
    memset(dref, 0, V * C * sizeof(double));
    for (int i = 0; i < N; i++)
        for (int j = 0; j < C; j++)
            dref[ids[i] * C + j] += dout[i * C + j];
    rt_assert_ok(sbprt_embedding_backward(ctx, dt, dout, ids, N, V, C));
    rt_assert_err(rt_rel_err_delta(dt, dt0, dref, V * C), RT_TOL, "embedding bwd");
    emb_fd st = {ids, rt_to_double(dout, N * C), rt_to_double(table, V * C)};
    rt_assert_err(rt_fd_check(emb_f, NULL, &st, st.table, V * C, dt, dt0, V * C), RT_TOL,
                  "embedding bwd fd");

    /* Out-of-range ids are an error and leave the outputs untouched. */
    float *snap = rt_copy(dt, V * C);
    ids[N - 1] = V;
    assert_int_equal(sbprt_embedding_forward(ctx, out, table, ids, N, V, C), SBPRT_ERR_RANGE);
    assert_int_equal(sbprt_embedding_backward(ctx, dt, dout, ids, N, V, C), SBPRT_ERR_RANGE);
    ids[N - 1] = -1;
    assert_int_equal(sbprt_embedding_backward(ctx, dt, dout, ids, N, V, C), SBPRT_ERR_RANGE);
    assert_memory_equal(dt, snap, V * C * sizeof(float));

    free((void *)st.w), free(st.table), free(snap);
    free(table), free(out), free(ref), free(dout), free(dt), free(dt0), free(dref);
    sbprt_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),
    };
    return cmocka_run_group_tests_name("runtime_embedding", tests, NULL, NULL);
}
