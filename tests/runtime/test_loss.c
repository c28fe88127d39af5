/*
 * test_loss.c — fused softmax cross-entropy (with ignored labels, in place and not) and the
 * per-row label log-probability, forward and backward, against double references and
 * finite differences.
 */
#include "rt_test.h"

#define N 23
#define V 1000 /* n * v above the parallel threshold */

static double ref_lse(const double *x)
{
    double m = -INFINITY, s = 0;
    for (int j = 0; j < V; j++)
        m = x[j] > m ? x[j] : m;
    for (int j = 0; j < V; j++)
        s += exp(x[j] - m);
    return m + log(s);
}

/* scale * Σ over scored rows of (lse - x[label]), the loss the CE gradient differentiates;
 * with w set, instead Σ_r w[r] * logp[r]. */
typedef struct {
    const int32_t *labels;
    double scale;
    const double *w; /* NULL: cross-entropy */
    double *x;
    int r0, r1; /* rows summed: a logit influences its own row only */
} loss_fd;

static double loss_f(void *p)
{
    loss_fd *s = p;
    double f = 0;
    for (int r = s->r0; r < s->r1; r++) {
        if (s->labels[r] == SBPRT_IGNORE_INDEX)
            continue;
        double lp = s->x[r * V + s->labels[r]] - ref_lse(s->x + r * V);
        f += s->w ? s->w[r] * lp : -s->scale * lp;
    }
    return f;
}

static void loss_focus(void *p, size_t i)
{
    loss_fd *s = p;
    s->r0 = (int)(i / V), s->r1 = s->r0 + 1;
}

/* Random labels with every fifth row ignored, and the vocabulary's edges (0, v - 1) used. */
static void make_labels(rt_rng *r, int32_t *labels, int *scored)
{
    for (int i = 0; i < N; i++)
        labels[i] = i % 5 == 2 ? SBPRT_IGNORE_INDEX : rt_randint(r, V);
    labels[0] = 0, labels[1] = V - 1;
    *scored = 0;
    for (int i = 0; i < N; i++)
        *scored += labels[i] != SBPRT_IGNORE_INDEX;
}

static void test_cross_entropy(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {61};
    int32_t labels[N];
    int scored;
    make_labels(&r, labels, &scored);
    const double scale = 1.0 / scored;
    float *logits = rt_random(&r, (size_t)N * V, -4, 4), *dl = RT_NEW(float, (size_t)N * V);
    double *xd = rt_to_double(logits, (size_t)N * V), *ref = RT_NEW(double, (size_t)N * V);
    double loss = 0;
    for (int i = 0; i < N; i++) {
        double z = ref_lse(xd + i * V);
        for (int j = 0; j < V; j++)
            ref[i * V + j] = labels[i] == SBPRT_IGNORE_INDEX
                                 ? 0
                                 : (exp(xd[i * V + j] - z) - (j == labels[i])) * scale;
        if (labels[i] != SBPRT_IGNORE_INDEX)
            loss += z - xd[i * V + labels[i]];
    }
    float loss_sum[1] = {0.5f}; /* accumulates */
    memset(dl, 0xff, (size_t)N * V * sizeof(float)); /* NaN garbage: dlogits is written */
    rt_assert_ok(sbprt_cross_entropy_forward_backward(ctx, loss_sum, dl, logits, labels, N, V,
                                                      (float)scale));
    rt_assert_err(fabs((loss_sum[0] - 0.5) - loss) / loss, RT_TOL, "ce loss");
    rt_assert_err(rt_rel_err(dl, ref, (size_t)N * V), RT_TOL, "ce dlogits");
    for (int i = 0; i < N; i++)
        if (labels[i] == SBPRT_IGNORE_INDEX)
            for (int j = 0; j < V; j++)
                assert_true(dl[i * V + j] == 0.0f);
    loss_fd st = {labels, scale, NULL, xd, 0, N};
    rt_assert_err(rt_fd_check(loss_f, loss_focus, &st, xd, (size_t)N * V, dl, NULL, 2000), RT_TOL, "ce fd");

    /* in place: the gradient overwrites the logits, same values */
    float *inplace = rt_copy(logits, (size_t)N * V), ls2[1] = {0};
    rt_assert_ok(sbprt_cross_entropy_forward_backward(ctx, ls2, inplace, inplace, labels, N, V,
                                                      (float)scale));
    assert_memory_equal(inplace, dl, (size_t)N * V * sizeof(float));
    /* loss only */
    float ls3[1] = {0};
    rt_assert_ok(sbprt_cross_entropy_forward_backward(ctx, ls3, NULL, logits, labels, N, V, 1));
    assert_true(ls3[0] == ls2[0]);

    labels[4] = V;
    assert_int_equal(sbprt_cross_entropy_forward_backward(ctx, ls3, dl, logits, labels, N, V, 1),
                     SBPRT_ERR_RANGE);
    labels[4] = -1;
    assert_int_equal(sbprt_cross_entropy_forward_backward(ctx, ls3, dl, logits, labels, N, V, 1),
                     SBPRT_ERR_RANGE);

    free(logits), free(dl), free(xd), free(ref), free(inplace);
    sbprt_ctx_destroy(ctx);
}

static void test_label_logprob(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {62};
    int32_t labels[N];
    int scored;
    make_labels(&r, labels, &scored);
    float *logits = rt_random(&r, (size_t)N * V, -4, 4);
    float logp[N], lse[N];
    double *xd = rt_to_double(logits, (size_t)N * V), rlogp[N], rlse[N];
    for (int i = 0; i < N; i++) {
        rlse[i] = ref_lse(xd + i * V);
        rlogp[i] = labels[i] == SBPRT_IGNORE_INDEX ? 0 : xd[i * V + labels[i]] - rlse[i];
    }
    rt_assert_ok(sbprt_label_logprob_forward(ctx, logp, lse, logits, labels, N, V));
    rt_assert_err(rt_rel_err(logp, rlogp, N), RT_TOL, "logprob");
    rt_assert_err(rt_rel_err(lse, rlse, N), RT_TOL, "logprob lse");

    float *dlogp = rt_random(&r, N, -1, 1);
    float *dl = rt_random(&r, (size_t)N * V, -1, 1), *dl0 = rt_copy(dl, (size_t)N * V);
    rt_assert_ok(sbprt_label_logprob_backward(ctx, dl, dlogp, logits, labels, lse, N, V));
    double *ref = RT_NEW(double, (size_t)N * V);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < V; j++)
            ref[i * V + j] = labels[i] == SBPRT_IGNORE_INDEX
                                 ? 0
                                 : dlogp[i] * ((j == labels[i]) - exp(xd[i * V + j] - rlse[i]));
    rt_assert_err(rt_rel_err_delta(dl, dl0, ref, (size_t)N * V), RT_TOL, "logprob bwd");
    double *w = rt_to_double(dlogp, N);
    loss_fd st = {labels, 0, w, xd, 0, N};
    rt_assert_err(rt_fd_check(loss_f, loss_focus, &st, xd, (size_t)N * V, dl, dl0, 2000), RT_TOL,
                  "logprob bwd fd");

    labels[3] = V + 3;
    assert_int_equal(sbprt_label_logprob_forward(ctx, logp, lse, logits, labels, N, V),
                     SBPRT_ERR_RANGE);
    free(logits), free(xd), free(dlogp), free(dl), free(dl0), free(ref), free(w);
    sbprt_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_label_logprob),
    };
    return cmocka_run_group_tests_name("runtime_loss", tests, NULL, NULL);
}
