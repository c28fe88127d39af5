/*
 * test_objectives.c — the preference / RL objective kernels (runtime/cpu/objectives.c):
 * sbprt_label_logprob_grad (written, in place, with and without the forward's lse, ignored
 * rows, bad labels) and sbprt_grpo_token_loss (every branch of the clipped ratio, the KL term,
 * on-policy, a chunk that starts inside a sequence) against double references and finite
 * differences.
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

/* Σ_r w[r] * logp[r] over the scored rows of x (restricted to rows [r0, r1)). */
typedef struct {
    const int32_t *labels;
    const double *w;
    double *x;
    int r0, r1;
} wsum_fd;

static double wsum_f(void *p)
{
    wsum_fd *s = p;
    double f = 0;
    for (int r = s->r0; r < s->r1; r++)
        if (s->labels[r] != SBPRT_IGNORE_INDEX)
            f += s->w[r] * (s->x[r * V + s->labels[r]] - ref_lse(s->x + r * V));
    return f;
}

static void wsum_focus(void *p, size_t i)
{
    wsum_fd *s = p;
    s->r0 = (int)(i / V), s->r1 = s->r0 + 1;
}

static void test_logprob_grad(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {71};
    int32_t labels[N];
    for (int i = 0; i < N; i++)
        labels[i] = i % 5 == 2 ? SBPRT_IGNORE_INDEX : rt_randint(&r, V);
    labels[0] = 0, labels[1] = V - 1;
    float *logits = rt_random(&r, (size_t)N * V, -4, 4), *dlogp = rt_random(&r, N, -1, 1);
    double *xd = rt_to_double(logits, (size_t)N * V), *ref = RT_NEW(double, (size_t)N * V);
    for (int i = 0; i < N; i++) {
        double z = ref_lse(xd + i * V);
        for (int j = 0; j < V; j++)
            ref[i * V + j] = labels[i] == SBPRT_IGNORE_INDEX
                                 ? 0
                                 : dlogp[i] * ((j == labels[i]) - exp(xd[i * V + j] - z));
    }
    float lse[N], logp[N];
    rt_assert_ok(sbprt_label_logprob_forward(ctx, logp, lse, logits, labels, N, V));

    /* with the forward's lse, into garbage: written, ignored rows 0 */
    float *dl = RT_NEW(float, (size_t)N * V);
    memset(dl, 0xff, (size_t)N * V * sizeof(float));
    rt_assert_ok(sbprt_label_logprob_grad(ctx, dl, dlogp, logits, labels, lse, N, V));
    rt_assert_err(rt_rel_err(dl, ref, (size_t)N * V), RT_TOL, "logprob grad");
    for (int i = 0; i < N; i++)
        if (labels[i] == SBPRT_IGNORE_INDEX)
            for (int j = 0; j < V; j++)
                assert_true(dl[i * V + j] == 0.0f);
    double *w = rt_to_double(dlogp, N);
    wsum_fd st = {labels, w, xd, 0, N};
    rt_assert_err(rt_fd_check(wsum_f, wsum_focus, &st, xd, (size_t)N * V, dl, NULL, 2000),
                  RT_TOL, "logprob grad fd");

    /* lse computed here, and in place over the logits: the same bits */
    float *dl2 = RT_NEW(float, (size_t)N * V), *inplace = rt_copy(logits, (size_t)N * V);
    rt_assert_ok(sbprt_label_logprob_grad(ctx, dl2, dlogp, logits, labels, NULL, N, V));
    rt_assert_err(rt_rel_err(dl2, ref, (size_t)N * V), RT_TOL, "logprob grad (no lse)");
    rt_assert_ok(sbprt_label_logprob_grad(ctx, inplace, dlogp, inplace, labels, NULL, N, V));
    assert_memory_equal(inplace, dl2, (size_t)N * V * sizeof(float));

    labels[4] = V;
    assert_int_equal(sbprt_label_logprob_grad(ctx, dl, dlogp, logits, labels, NULL, N, V),
                     SBPRT_ERR_RANGE);
    assert_int_equal(sbprt_label_logprob_grad(ctx, NULL, dlogp, logits, labels, NULL, N, V),
                     SBPRT_ERR_INVALID);
    rt_assert_ok(sbprt_label_logprob_grad(ctx, NULL, NULL, NULL, NULL, NULL, 0, V));
    free(logits), free(dlogp), free(xd), free(ref), free(dl), free(w), free(dl2), free(inplace);
    sbprt_ctx_destroy(ctx);
}

/* ---- GRPO */

#define SEQ 7    /* tokens per sequence */
#define R0 5     /* the chunk starts inside sequence 0 */
#define NSEQ 5   /* sequences touched by rows [R0, R0 + N) */

typedef struct {
    const int32_t *labels;
    const double *old, *ref, *adv, *w; /* old NULL: on-policy */
    double beta, eps;
    double *lp; /* [N], differentiated */
    const double *lp0; /* on-policy: the detached value of lp (the ratio's denominator) */
} grpo_ref;

/* Σ_i w * l_i in double, from the definition (min and clip as torch computes them). */
static double grpo_f(void *p)
{
    grpo_ref *s = p;
    double f = 0;
    for (int i = 0; i < N; i++) {
        if (s->labels[i] == SBPRT_IGNORE_INDEX)
            continue;
        int r = R0 + i, q = r / SEQ;
        double old = s->old ? s->old[r] : s->lp0[i];
        double ratio = exp(s->lp[i] - old);
        double cl = fmin(fmax(ratio, 1 - s->eps), 1 + s->eps);
        double l = -fmin(ratio * s->adv[q], cl * s->adv[q]);
        if (s->beta != 0) {
            double d = s->ref[r] - s->lp[i];
            l += s->beta * (exp(d) - d - 1);
        }
        f += s->w[q] * l;
    }
    return f;
}

static void check_grpo(sbprt_ctx *ctx, const int32_t *labels, const float *logp,
                       const float *old, const float *ref, const float *adv, const float *w,
                       float beta, float eps, const char *what)
{
    double lpd[N], oldd[R0 + N], refd[R0 + N], advd[NSEQ], wd[NSEQ];
    for (int i = 0; i < N; i++)
        lpd[i] = logp[i];
    for (int i = 0; i < R0 + N; i++)
        oldd[i] = old ? old[i] : 0, refd[i] = ref ? ref[i] : 0;
    for (int i = 0; i < NSEQ; i++)
        advd[i] = adv[i], wd[i] = w[i];
    double lp0[N];
    memcpy(lp0, lpd, sizeof lp0);
    grpo_ref st = {labels, old ? oldd : NULL, refd, advd, wd, beta, eps, lpd, lp0};
    float loss[1] = {0.25f}, dlogp[N];
    memset(dlogp, 0xff, sizeof dlogp);
    rt_assert_ok(sbprt_grpo_token_loss(ctx, loss, dlogp, logp, labels, old, ref, adv, w, N, R0,
                                       SEQ, beta, eps));
    double want = grpo_f(&st);
    print_message("  grpo %s: loss %.9g (reference %.9g)\n", what, loss[0] - 0.25, want);
    rt_assert_err(fabs((loss[0] - 0.25) - want) / fmax(fabs(want), 1e-3), RT_TOL, what);
    for (int i = 0; i < N; i++)
        if (labels[i] == SBPRT_IGNORE_INDEX)
            assert_true(dlogp[i] == 0.0f);
    rt_assert_err(rt_fd_check(grpo_f, NULL, &st, lpd, N, dlogp, NULL, N), RT_TOL, what);
    /* the loss alone */
    float loss2[1] = {0.25f};
    rt_assert_ok(sbprt_grpo_token_loss(ctx, loss2, NULL, logp, labels, old, ref, adv, w, N, R0,
                                       SEQ, beta, eps));
    assert_true(loss2[0] == loss[0]);
}

static void test_grpo(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {72};
    int32_t labels[N];
    float logp[N], old[R0 + N], ref[R0 + N];
    for (int i = 0; i < N; i++) {
        labels[i] = i % 6 == 4 ? SBPRT_IGNORE_INDEX : rt_randint(&r, V);
        logp[i] = rt_uniform(&r, -6, -0.5f);
    }
    /* the ratio lands on every side of the clip range (epsilon 0.2), away from its edges */
    static const float shift[] = {-0.5f, -0.1f, 0.05f, 0.35f, -0.3f, 0.12f};
    for (int i = 0; i < R0 + N; i++) {
        int k = i - R0;
        old[i] = k >= 0 ? logp[k] + shift[k % 6] : 99.0f; /* rows before r0 are never read */
        ref[i] = k >= 0 ? logp[k] + rt_uniform(&r, -0.4f, 0.4f) : 99.0f;
    }
    const float adv[NSEQ] = {0.8f, -1.3f, 0.4f, -0.2f, 1.1f};
    const float w[NSEQ] = {0.11f, 0.07f, 0.2f, 0.05f, 0.13f};
    check_grpo(ctx, labels, logp, old, ref, adv, w, 0.04f, 0.2f, "clipped + kl");
    check_grpo(ctx, labels, logp, old, NULL, adv, w, 0.0f, 0.2f, "beta 0, no ref");
    check_grpo(ctx, labels, logp, NULL, ref, adv, w, 0.1f, 0.2f, "on-policy");
    check_grpo(ctx, labels, logp, old, ref, adv, w, 0.04f, 0.0f, "epsilon 0");

    /* on-policy, beta 0: the loss is -Σ w A over scored rows, dlogp = -w A */
    float loss[1] = {0}, dlogp[N];
    rt_assert_ok(sbprt_grpo_token_loss(ctx, loss, dlogp, logp, labels, NULL, NULL, adv, w, N, R0,
                                       SEQ, 0.0f, 0.2f));
    for (int i = 0; i < N; i++) {
        int q = (R0 + i) / SEQ;
        float want = labels[i] == SBPRT_IGNORE_INDEX ? 0.0f : (float)(-(double)w[q] * adv[q]);
        assert_true(fabsf(dlogp[i] - want) <= 1e-7f);
    }

    assert_int_equal(sbprt_grpo_token_loss(ctx, loss, dlogp, logp, labels, old, NULL, adv, w, N,
                                           R0, SEQ, 0.04f, 0.2f),
                     SBPRT_ERR_INVALID); /* beta > 0 needs ref */
    assert_int_equal(sbprt_grpo_token_loss(ctx, loss, dlogp, logp, labels, old, ref, adv, w, N,
                                           R0, 0, 0.04f, 0.2f),
                     SBPRT_ERR_INVALID);
    rt_assert_ok(sbprt_grpo_token_loss(ctx, loss, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0,
                                       1, 0.04f, 0.2f));
    sbprt_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logprob_grad),
        cmocka_unit_test(test_grpo),
    };
    return cmocka_run_group_tests_name("runtime_objectives", tests, NULL, NULL);
}
