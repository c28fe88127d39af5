/*
 * test_attention.c — causal grouped-query attention, forward and backward.
 *
 * The reference is naive softmax attention in double with the full causal mask (a whole
 * score row per query).  Shapes use GQA (hq = 4, hkv = 2) and several t, including t not a
 * multiple of the kernel's tiles (32 query rows, 64 keys) and t spanning several tiles; MHA
 * and MQA appear once each.  The chunked-query form is checked against the rows of the
 * unchunked computation, with the key rows the chunk must not read poisoned with NaN, and
 * dk/dv accumulated over the chunks against the unchunked dk/dv.
 */
#include "rt_test.h"

typedef struct {
    int b, t, tk, hq, hkv, d, q_start;
    double scale;
} shape;

static size_t q_len(const shape *s) { return (size_t)s->b * s->t * s->hq * s->d; }
static size_t kv_len(const shape *s) { return (size_t)s->b * s->tk * s->hkv * s->d; }
static size_t q_at(const shape *s, int b, int i, int h) { return (((size_t)b * s->t + i) * s->hq + h) * s->d; }
static size_t kv_at(const shape *s, int b, int j, int g) { return (((size_t)b * s->tk + j) * s->hkv + g) * s->d; }

/* Softmax probabilities of query row (b, i, h) over keys 0..pos into p (returns pos + 1). */
static int ref_probs(const shape *s, double *p, double *lse, const double *q, const double *k,
                     int b, int i, int h)
{
    int g = h / (s->hq / s->hkv), pos = s->q_start + i;
    const double *qr = q + q_at(s, b, i, h);
    double m = -INFINITY;
    for (int j = 0; j <= pos; j++) {
        const double *kr = k + kv_at(s, b, j, g);
        double dot = 0;
        for (int c = 0; c < s->d; c++)
            dot += qr[c] * kr[c];
        p[j] = s->scale * dot;
        m = p[j] > m ? p[j] : m;
    }
    double sum = 0;
    for (int j = 0; j <= pos; j++)
        sum += exp(p[j] - m);
    for (int j = 0; j <= pos; j++)
        p[j] = exp(p[j] - m) / sum;
    if (lse)
        *lse = m + log(sum);
    return pos + 1;
}

/* The part of the output a finite difference needs to recompute: batch b, query heads
 * [h0, h1), query rows [i0, i1). */
typedef struct {
    int b, h0, h1, i0, i1;
} region;

/* out: [b, t, hq, d], lse: [b, hq, t] (may be NULL), over region g only; p is [tk] scratch. */
static void ref_forward_region(const shape *s, double *out, double *lse, const double *q,
                               const double *k, const double *v, double *p, region rg)
{
    for (int h = rg.h0; h < rg.h1; h++)
        for (int i = rg.i0; i < rg.i1; i++) {
            double z;
            int n = ref_probs(s, p, &z, q, k, rg.b, i, h);
            int g = h / (s->hq / s->hkv);
            double *o = out + q_at(s, rg.b, i, h);
            memset(o, 0, s->d * sizeof(double));
            for (int j = 0; j < n; j++) {
                const double *vr = v + kv_at(s, rg.b, j, g);
                for (int c = 0; c < s->d; c++)
                    o[c] += p[j] * vr[c];
            }
            if (lse)
                lse[((size_t)rg.b * s->hq + h) * s->t + i] = z;
        }
}

static void ref_forward(const shape *s, double *out, double *lse, const double *q,
                        const double *k, const double *v, double *p)
{
    for (int b = 0; b < s->b; b++)
        ref_forward_region(s, out, lse, q, k, v, p, (region){b, 0, s->hq, 0, s->t});
}

/* Analytic backward in double (zeroes and fills dq, dk, dv). */
static void ref_backward(const shape *s, double *dq, double *dk, double *dv, const double *dout,
                         const double *q, const double *k, const double *v, double *p,
                         double *dp)
{
    memset(dq, 0, q_len(s) * sizeof(double));
    memset(dk, 0, kv_len(s) * sizeof(double));
    memset(dv, 0, kv_len(s) * sizeof(double));
    for (int b = 0; b < s->b; b++)
        for (int h = 0; h < s->hq; h++)
            for (int i = 0; i < s->t; i++) {
                int n = ref_probs(s, p, NULL, q, k, b, i, h);
                int g = h / (s->hq / s->hkv);
                const size_t qo = q_at(s, b, i, h);
                const double *go = dout + qo;
                double delta = 0;
                for (int j = 0; j < n; j++) {
                    const double *vr = v + kv_at(s, b, j, g);
                    dp[j] = 0;
                    for (int c = 0; c < s->d; c++)
                        dp[j] += go[c] * vr[c];
                    delta += p[j] * dp[j];
                }
                for (int j = 0; j < n; j++) {
                    const size_t ko = kv_at(s, b, j, g);
                    const double ds = p[j] * (dp[j] - delta);
                    for (int c = 0; c < s->d; c++) {
                        dq[qo + c] += s->scale * ds * k[ko + c];
                        dk[ko + c] += s->scale * ds * q[qo + c];
                        dv[ko + c] += p[j] * go[c];
                    }
                }
            }
}

/* f(q, k, v) = Σ dout ∘ out for the finite differences.  Perturbing one element changes
 * only some outputs (q[b, i, h, :]: row i of head h; k or v[b, j, g, :]: rows at or after
 * position j of the group's heads), so f is summed over that region alone: the other terms
 * cancel in the difference, and the test stays fast under sanitizers. */
typedef struct {
    const shape *s;
    const double *w;
    double *q, *k, *v, *out, *p;
    region rg;
} att_fd;

static double att_f(void *ptr)
{
    att_fd *st = ptr;
    const shape *s = st->s;
    ref_forward_region(s, st->out, NULL, st->q, st->k, st->v, st->p, st->rg);
    double f = 0;
    for (int h = st->rg.h0; h < st->rg.h1; h++)
        for (int i = st->rg.i0; i < st->rg.i1; i++) {
            const size_t o = q_at(s, st->rg.b, i, h);
            for (int c = 0; c < s->d; c++)
                f += st->w[o + c] * st->out[o + c];
        }
    return f;
}

/* Focus for an element of q: its own row and head. */
static void att_focus_q(void *ptr, size_t e)
{
    att_fd *st = ptr;
    const shape *s = st->s;
    const int h = (int)(e / s->d % s->hq), i = (int)(e / s->d / s->hq % s->t);
    st->rg = (region){(int)(e / s->d / s->hq / s->t), h, h + 1, i, i + 1};
}

/* Focus for an element of k or v: the group's heads, rows at or after its position. */
static void att_focus_kv(void *ptr, size_t e)
{
    att_fd *st = ptr;
    const shape *s = st->s;
    const int g = (int)(e / s->d % s->hkv), j = (int)(e / s->d / s->hkv % s->tk);
    const int group = s->hq / s->hkv;
    st->rg = (region){(int)(e / s->d / s->hkv / s->tk), g * group, (g + 1) * group,
                      j - s->q_start > 0 ? j - s->q_start : 0, s->t};
}

/* Forward and backward of one shape against the reference; fd_points finite-difference
 * checks per input tensor. */
static void check_shape(shape s, uint64_t seed, size_t fd_points)
{
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {seed};
    const size_t nq = q_len(&s), nkv = kv_len(&s), nl = (size_t)s.b * s.hq * s.t;
    float *q = rt_random(&r, nq, -1, 1), *k = rt_random(&r, nkv, -1, 1);
    float *v = rt_random(&r, nkv, -1, 1);
    float *out = RT_NEW(float, nq), *lse = RT_NEW(float, nl);
    double *qd = rt_to_double(q, nq), *kd = rt_to_double(k, nkv), *vd = rt_to_double(v, nkv);
    double *ref = RT_NEW(double, nq), *rlse = RT_NEW(double, nl);
    double *p = RT_NEW(double, s.tk), *dp = RT_NEW(double, s.tk);

    ref_forward(&s, ref, rlse, qd, kd, vd, p);
    rt_assert_ok(sbprt_attention_forward(ctx, out, lse, q, k, v, s.b, s.t, s.tk, s.hq, s.hkv, s.d,
                                         s.q_start, (float)s.scale));
    rt_assert_err(rt_rel_err(out, ref, nq), RT_TOL, "attention out");
    rt_assert_err(rt_rel_err(lse, rlse, nl), RT_TOL, "attention lse");

    float *dout = rt_random(&r, nq, -1, 1);
    float *dq = rt_random(&r, nq, -1, 1), *dk = rt_random(&r, nkv, -1, 1);
    float *dv = rt_random(&r, nkv, -1, 1);
    float *dq0 = rt_copy(dq, nq), *dk0 = rt_copy(dk, nkv), *dv0 = rt_copy(dv, nkv);
    rt_assert_ok(sbprt_attention_backward(ctx, dq, dk, dv, dout, q, k, v, out, lse, s.b, s.t,
                                          s.tk, s.hq, s.hkv, s.d, s.q_start, (float)s.scale));
    double *doutd = rt_to_double(dout, nq);
    double *rdq = RT_NEW(double, nq), *rdk = RT_NEW(double, nkv), *rdv = RT_NEW(double, nkv);
    ref_backward(&s, rdq, rdk, rdv, doutd, qd, kd, vd, p, dp);
    rt_assert_err(rt_rel_err_delta(dq, dq0, rdq, nq), RT_TOL, "attention dq");
    rt_assert_err(rt_rel_err_delta(dk, dk0, rdk, nkv), RT_TOL, "attention dk");
    rt_assert_err(rt_rel_err_delta(dv, dv0, rdv, nkv), RT_TOL, "attention dv");

    att_fd st = {&s, doutd, qd, kd, vd, RT_NEW(double, nq), p, {0, 0, 0, 0, 0}};
    rt_assert_err(rt_fd_check(att_f, att_focus_q, &st, qd, nq, dq, dq0, fd_points), RT_TOL,
                  "attention dq fd");
    rt_assert_err(rt_fd_check(att_f, att_focus_kv, &st, kd, nkv, dk, dk0, fd_points), RT_TOL,
                  "attention dk fd");
    rt_assert_err(rt_fd_check(att_f, att_focus_kv, &st, vd, nkv, dv, dv0, fd_points), RT_TOL,
                  "attention dv fd");

    free(st.out);
    free(q), free(k), free(v), free(out), free(lse), free(qd), free(kd), free(vd), free(ref),
        free(rlse), free(p), free(dp), free(dout), free(dq), free(dk), free(dv), free(dq0),
        free(dk0), free(dv0), free(doutd), free(rdq), free(rdk), free(rdv);
    sbprt_ctx_destroy(ctx);
}

#define SHAPE(B, T, HQ, HKV, D) {B, T, T, HQ, HKV, D, 0, 1.0 / sqrt(D)}

/* One query row, as in decoding: at position 0 it sees one key and its dq is exactly 0 (the
 * softmax of a single score is constant), so the checked row sits at position 5. */
static void test_single_row(void **state)
{
    (void)state;
    check_shape((shape){2, 1, 6, 4, 2, 8, 5, 1.0 / sqrt(8)}, 51, SIZE_MAX);
}

static void test_t17(void **state) /* less than one tile */
{
    (void)state;
    check_shape((shape)SHAPE(1, 17, 4, 2, 8), 52, SIZE_MAX);
}

static void test_t77(void **state) /* 3 query tiles, 2 key tiles, both partial */
{
    (void)state;
    check_shape((shape)SHAPE(2, 77, 4, 2, 16), 53, 60);
}

static void test_t130(void **state) /* 5 query tiles, 3 key tiles, larger scores */
{
    (void)state;
    shape s = SHAPE(1, 130, 4, 2, 12);
    s.scale = 0.9; /* sharper softmax than 1/√d */
    check_shape(s, 54, 50);
}

static void test_mha_mqa(void **state)
{
    (void)state;
    check_shape((shape)SHAPE(1, 40, 3, 3, 8), 55, 50);
    check_shape((shape)SHAPE(2, 40, 4, 1, 8), 56, 50);
}

/* One query chunk that starts at q_start > 0 and keys beyond the chunk's last position
 * present in the buffer: checked against the double reference directly. */
static void test_offset_chunk_reference(void **state)
{
    (void)state;
    check_shape((shape){2, 29, 100, 4, 2, 8, 50, 0.35}, 57, 80);
}

/* Copies rows [c0, c1) of x: [b, t, h, d] into a [b, c1 - c0, h, d] buffer, or back. */
static void copy_rows(float *dst, const float *src, int b, int t_dst, int t_src, int off_dst,
                      int off_src, int rows, int hd)
{
    for (int bi = 0; bi < b; bi++)
        memcpy(dst + ((size_t)bi * t_dst + off_dst) * hd, src + ((size_t)bi * t_src + off_src) * hd,
               (size_t)rows * hd * sizeof(float));
}

static void test_chunked_equals_full(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {58};
    const int B = 2, T = 130, HQ = 4, HKV = 2, D = 16;
    const float scale = 0.25f;
    const int bounds[] = {0, 1, 45, 96, 130}; /* chunk edges, none on a tile boundary */
    const int nchunks = 4;
    const size_t nq = (size_t)B * T * HQ * D, nkv = (size_t)B * T * HKV * D;
    const size_t nl = (size_t)B * HQ * T;
    float *q = rt_random(&r, nq, -1, 1), *k = rt_random(&r, nkv, -1, 1);
    float *v = rt_random(&r, nkv, -1, 1), *dout = rt_random(&r, nq, -1, 1);

    /* unchunked */
    float *out = RT_NEW(float, nq), *lse = RT_NEW(float, nl);
    float *dq = calloc(nq, sizeof(float)), *dk = calloc(nkv, sizeof(float)),
          *dv = calloc(nkv, sizeof(float));
    rt_assert_ok(sbprt_attention_forward(ctx, out, lse, q, k, v, B, T, T, HQ, HKV, D, 0, scale));
    rt_assert_ok(sbprt_attention_backward(ctx, dq, dk, dv, dout, q, k, v, out, lse, B, T, T, HQ,
                                          HKV, D, 0, scale));

    /* chunked: dk, dv accumulate over chunks; K/V rows past the chunk hold NaN */
    float *dk_acc = calloc(nkv, sizeof(float)), *dv_acc = calloc(nkv, sizeof(float));
    float *kp = RT_NEW(float, nkv), *vp = RT_NEW(float, nkv);
    for (int c = 0; c < nchunks; c++) {
        const int c0 = bounds[c], c1 = bounds[c + 1], tc = c1 - c0;
        const size_t ncq = (size_t)B * tc * HQ * D, ncl = (size_t)B * HQ * tc;
        for (size_t i = 0; i < nkv; i++) {
            int j = (int)(i / ((size_t)HKV * D) % T);
            kp[i] = j < c1 ? k[i] : NAN;
            vp[i] = j < c1 ? v[i] : NAN;
        }
        float *qc = RT_NEW(float, ncq), *gc = RT_NEW(float, ncq), *oc = RT_NEW(float, ncq);
        float *lc = RT_NEW(float, ncl), *dqc = calloc(ncq, sizeof(float));
        float *want = RT_NEW(float, ncq);
        copy_rows(qc, q, B, tc, T, 0, c0, tc, HQ * D);
        copy_rows(gc, dout, B, tc, T, 0, c0, tc, HQ * D);
        rt_assert_ok(sbprt_attention_forward(ctx, oc, lc, qc, kp, vp, B, tc, T, HQ, HKV, D, c0,
                                             scale));
        /* forward rows are bitwise those of the full computation: a row's key tiles and
         * summation order do not depend on where its chunk starts */
        copy_rows(want, out, B, tc, T, 0, c0, tc, HQ * D);
        assert_memory_equal(oc, want, ncq * sizeof(float));
        for (int bh = 0; bh < B * HQ; bh++)
            assert_memory_equal(lc + (size_t)bh * tc, lse + (size_t)bh * T + c0,
                                tc * sizeof(float));

        rt_assert_ok(sbprt_attention_backward(ctx, dqc, dk_acc, dv_acc, gc, qc, kp, vp, oc, lc, B,
                                              tc, T, HQ, HKV, D, c0, scale));
        copy_rows(want, dq, B, tc, T, 0, c0, tc, HQ * D);
        assert_memory_equal(dqc, want, ncq * sizeof(float));
        /* keys after the chunk received nothing */
        for (size_t i = 0; i < nkv; i++)
            if ((int)(i / ((size_t)HKV * D) % T) >= c1)
                assert_true(dk_acc[i] == 0.0f && dv_acc[i] == 0.0f);
        free(qc), free(gc), free(oc), free(lc), free(dqc), free(want);
    }
    double *dkd = rt_to_double(dk, nkv), *dvd = rt_to_double(dv, nkv);
    rt_assert_err(rt_rel_err(dk_acc, dkd, nkv), RT_TOL, "chunked dk");
    rt_assert_err(rt_rel_err(dv_acc, dvd, nkv), RT_TOL, "chunked dv");

    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv),
        free(dk_acc), free(dv_acc), free(kp), free(vp), free(dkd), free(dvd);
    sbprt_ctx_destroy(ctx);
}

static void test_invalid_shapes(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(1);
    float x[64] = {0}, l[8];
    /* hq not a multiple of hkv */
    assert_int_equal(sbprt_attention_forward(ctx, x, l, x, x, x, 1, 2, 2, 3, 2, 4, 0, 1),
                     SBPRT_ERR_INVALID);
    /* chunk runs past the key buffer */
    assert_int_equal(sbprt_attention_forward(ctx, x, l, x, x, x, 1, 2, 3, 2, 2, 4, 2, 1),
                     SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_attention_backward(ctx, x, x, NULL, x, x, x, x, x, l, 1, 2, 2, 2, 2, 4,
                                              0, 1),
                     SBPRT_ERR_INVALID); /* dk without dv */
    sbprt_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_row),
        cmocka_unit_test(test_t17),
        cmocka_unit_test(test_t77),
        cmocka_unit_test(test_t130),
        cmocka_unit_test(test_mha_mqa),
        cmocka_unit_test(test_offset_chunk_reference),
        cmocka_unit_test(test_chunked_equals_full),
        cmocka_unit_test(test_invalid_shapes),
    };
    return cmocka_run_group_tests_name("runtime_attention", tests, NULL, NULL);
}
