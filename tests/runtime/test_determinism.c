/*
 * test_determinism.c — kernels with reductions give bitwise identical results run to run
 * and for any thread count (1, 3, 4 threads here): attention forward/backward (plain, and
 * with a sliding window and soft-capping on each of its three paths), embedding backward,
 * LayerNorm backward, cross-entropy and sum of squares.  The inputs are large enough that
 * every kernel really forks a team.
 */
#include "rt_test.h"

enum { B = 2, T = 150, HQ = 4, HKV = 2, D = 16 };
enum { NE = 4096, VE = 50, CE = 256 };       /* embedding: many repeats of each id */
enum { NL = 96, CL = 300 };                  /* layernorm */
enum { NX = 64, VX = 700 };                  /* cross-entropy */

#define NQ ((size_t)B * T * HQ * D)
#define NKV ((size_t)B * T * HKV * D)

typedef struct {
    float *q, *k, *v, *dout;
    int32_t ids[NE], labels[NX];
    float *emb_dout, *x, *gamma, *ln_dout, *logits;
} inputs;

/* The attention variants run besides the plain one: window, cap, and the shape that picks the
 * path (D: AVX2 path; D2 = 12: scalar path; b = B: fused backward, b = 1: two passes). */
enum { D2 = 12, NVAR = 3 };
static const struct {
    int b, d, window;
    float softcap;
} variants[NVAR] = {{B, D, 37, 1.5f}, {1, D, 50, 0}, {B, D2, 45, 2.0f}};

/* Everything one run produces, zero-initialised where kernels accumulate. */
typedef struct {
    float out[NQ], lse[B * HQ * T], dq[NQ], dk[NKV], dv[NKV];
    struct {
        float out[NQ], lse[B * HQ * T], dq[NQ], dk[NKV], dv[NKV];
    } var[NVAR];
    float dtable[VE * CE];
    float ln_out[NL * CL], mean[NL], rstd[NL], dx[NL * CL], dgamma[CL], dbeta[CL];
    float loss[1], dlogits[NX * VX], sumsq[1];
} results;

static void run_all(const inputs *in, results *res, int nthreads)
{
    sbprt_ctx *ctx = rt_ctx(nthreads);
    memset(res, 0, sizeof *res);
    rt_assert_ok(sbprt_attention_forward(ctx, res->out, res->lse, in->q, in->k, in->v, B, T, T, HQ,
                                         HKV, D, 0, 0.25f));
    rt_assert_ok(sbprt_attention_backward(ctx, res->dq, res->dk, res->dv, in->dout, in->q, in->k,
                                          in->v, res->out, res->lse, B, T, T, HQ, HKV, D, 0,
                                          0.25f));
    for (int i = 0; i < NVAR; i++) {
        const int b = variants[i].b, d = variants[i].d, w = variants[i].window;
        const float c = variants[i].softcap;
        rt_assert_ok(sbprt_attention_forward_ex(ctx, res->var[i].out, res->var[i].lse, in->q, in->k,
                                                in->v, b, T, T, HQ, HKV, d, 0, 0.25f, w, c));
        rt_assert_ok(sbprt_attention_backward_ex(ctx, res->var[i].dq, res->var[i].dk,
                                                 res->var[i].dv, in->dout, in->q, in->k, in->v,
                                                 res->var[i].out, res->var[i].lse, b, T, T, HQ,
                                                 HKV, d, 0, 0.25f, w, c));
    }
    rt_assert_ok(sbprt_embedding_backward(ctx, res->dtable, in->emb_dout, in->ids, NE, VE, CE));
    rt_assert_ok(sbprt_layernorm_forward(ctx, res->ln_out, res->mean, res->rstd, in->x, in->gamma,
                                         NULL, NL, CL, 1e-5f));
    rt_assert_ok(sbprt_layernorm_backward(ctx, res->dx, res->dgamma, res->dbeta, in->ln_dout, in->x,
                                          in->gamma, res->mean, res->rstd, NL, CL));
    rt_assert_ok(sbprt_cross_entropy_forward_backward(ctx, res->loss, res->dlogits, in->logits,
                                                      in->labels, NX, VX, 1.0f / NX));
    rt_assert_ok(sbprt_sum_squares(ctx, res->sumsq, in->logits, (size_t)NX * VX));
    sbprt_ctx_destroy(ctx);
}

static void test_bitwise_across_runs_and_threads(void **state)
{
    (void)state;
    rt_rng r = {81};
    inputs in;
    in.q = rt_random(&r, NQ, -1, 1), in.k = rt_random(&r, NKV, -1, 1);
    in.v = rt_random(&r, NKV, -1, 1), in.dout = rt_random(&r, NQ, -1, 1);
    for (int i = 0; i < NE; i++)
        in.ids[i] = rt_randint(&r, VE);
    for (int i = 0; i < NX; i++)
        in.labels[i] = i % 7 == 0 ? SBPRT_IGNORE_INDEX : rt_randint(&r, VX);
    in.emb_dout = rt_random(&r, (size_t)NE * CE, -1, 1);
    in.x = rt_random(&r, (size_t)NL * CL, -1, 1), in.gamma = rt_random(&r, CL, 0.5f, 1.5f);
    in.ln_dout = rt_random(&r, (size_t)NL * CL, -1, 1);
    in.logits = rt_random(&r, (size_t)NX * VX, -3, 3);

    results *first = RT_NEW(results, 1), *again = RT_NEW(results, 1);
    run_all(&in, first, 4);
    const int threads[] = {4, 1, 3};
    for (int i = 0; i < 3; i++) {
        run_all(&in, again, threads[i]);
        assert_memory_equal(first->dq, again->dq, sizeof first->dq);
        assert_memory_equal(first->dk, again->dk, sizeof first->dk);
        assert_memory_equal(first->dv, again->dv, sizeof first->dv);
        assert_memory_equal(first->var, again->var, sizeof first->var);
        assert_memory_equal(first->dtable, again->dtable, sizeof first->dtable);
        assert_memory_equal(first, again, sizeof *first); /* and everything else */
    }
    free(first), free(again);
    free(in.q), free(in.k), free(in.v), free(in.dout), free(in.emb_dout), free(in.x),
        free(in.gamma), free(in.ln_dout), free(in.logits);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bitwise_across_runs_and_threads),
    };
    return cmocka_run_group_tests_name("runtime_determinism", tests, NULL, NULL);
}
