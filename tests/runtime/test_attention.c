/*
 * test_attention.c — causal grouped-query attention, forward and backward, plain and with
 * the variants of the _ex entry points (sliding window, logit soft-capping).
 *
 * The reference is naive softmax attention in double with the full causal mask (a whole
 * score row per query), the window mask (keys pos - window < j <= pos) and the tanh cap
 * applied densely.  Shapes use GQA (hq = 4, hkv = 2) and several t, including t not a
 * multiple of the kernel's tiles (32 query rows, 64 keys) and t spanning several tiles; MHA
 * and MQA appear once each.  The kernel has three code paths chosen by shape: the AVX2 path
 * (d a multiple of 8) with the fused backward (b * hkv >= 4) or the two-pass one, and the
 * scalar path (other d); the variant tests cover each.  The chunked-query form is checked
 * against the rows of the unchunked computation, with the key rows the chunk must not read
 * (after the chunk, and before its first row's window) poisoned with NaN, and dk/dv
 * accumulated over the chunks against the unchunked dk/dv.
 */
#include "rt_test.h"

typedef struct {
    int b, t, tk, hq, hkv, d, q_start;
    double scale;
    int window;     /* sliding window; 0: plain causal */
    double softcap; /* logit cap; 0: none */
} shape;

static size_t q_len(const shape *s) { return (size_t)s->b * s->t * s->hq * s->d; }
static size_t kv_len(const shape *s) { return (size_t)s->b * s->tk * s->hkv * s->d; }
static size_t q_at(const shape *s, int b, int i, int h) { return (((size_t)b * s->t + i) * s->hq + h) * s->d; }
static size_t kv_at(const shape *s, int b, int j, int g) { return (((size_t)b * s->tk + j) * s->hkv + g) * s->d; }

/* The first key the query at absolute position pos attends: keys j with pos - window < j. */
static int ref_lo(const shape *s, int pos)
{
    return s->window > 0 && pos - s->window + 1 > 0 ? pos - s->window + 1 : 0;
}

/* Softmax probabilities of query row (b, i, h) over its keys lo..pos into p[lo..pos], and
 * when dcap is not NULL the cap's derivative 1 - tanh^2 at each score (1 without a cap);
 * returns lo, *end = pos + 1. */
static int ref_probs(const shape *s, double *p, double *dcap, double *lse, const double *q,
                     const double *k, int b, int i, int h, int *end)
{
    int g = h / (s->hq / s->hkv), pos = s->q_start + i, lo = ref_lo(s, pos);
    const double *qr = q + q_at(s, b, i, h);
    double m = -INFINITY;
    for (int j = lo; j <= pos; j++) {
        const double *kr = k + kv_at(s, b, j, g);
        double dot = 0;
        for (int c = 0; c < s->d; c++)
            dot += qr[c] * kr[c];
        p[j] = s->scale * dot;
        if (dcap)
            dcap[j] = 1;
        if (s->softcap > 0) {
            double th = tanh(p[j] / s->softcap);
            p[j] = s->softcap * th;
            if (dcap)
                dcap[j] = 1 - th * th;
        }
        m = p[j] > m ? p[j] : m;
    }
    double sum = 0;
    for (int j = lo; j <= pos; j++)
        sum += exp(p[j] - m);
    for (int j = lo; j <= pos; j++)
        p[j] = exp(p[j] - m) / sum;
    if (lse)
        *lse = m + log(sum);
    *end = pos + 1;
    return lo;
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
            int n, lo = ref_probs(s, p, NULL, &z, q, k, rg.b, i, h, &n);
            int g = h / (s->hq / s->hkv);
            double *o = out + q_at(s, rg.b, i, h);
            memset(o, 0, s->d * sizeof(double));
            for (int j = lo; j < n; j++) {
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

/* Analytic backward in double (zeroes and fills dq, dk, dv); with a cap, the score's
 * gradient is the capped one times 1 - tanh^2.  p, dp, dc: [tk] scratch. */
static void ref_backward(const shape *s, double *dq, double *dk, double *dv, const double *dout,
                         const double *q, const double *k, const double *v, double *p,
                         double *dp, double *dc)
{
    memset(dq, 0, q_len(s) * sizeof(double));
    memset(dk, 0, kv_len(s) * sizeof(double));
    memset(dv, 0, kv_len(s) * sizeof(double));
    for (int b = 0; b < s->b; b++)
        for (int h = 0; h < s->hq; h++)
            for (int i = 0; i < s->t; i++) {
                int n, lo = ref_probs(s, p, dc, NULL, q, k, b, i, h, &n);
                int g = h / (s->hq / s->hkv);
                const size_t qo = q_at(s, b, i, h);
                const double *go = dout + qo;
                double delta = 0;
                for (int j = lo; j < n; j++) {
                    const double *vr = v + kv_at(s, b, j, g);
                    dp[j] = 0;
                    for (int c = 0; c < s->d; c++)
                        dp[j] += go[c] * vr[c];
                    delta += p[j] * dp[j];
                }
                for (int j = lo; j < n; j++) {
                    const size_t ko = kv_at(s, b, j, g);
                    const double ds = p[j] * (dp[j] - delta) * dc[j];
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
 * position j, and before j + window with a window, of the group's heads), so f is summed
 * over that region alone: the other terms cancel in the difference, and the test stays fast
 * under sanitizers. */
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

/* Focus for an element of k or v: the group's heads, the rows whose window holds it. */
static void att_focus_kv(void *ptr, size_t e)
{
    att_fd *st = ptr;
    const shape *s = st->s;
    const int g = (int)(e / s->d % s->hkv), j = (int)(e / s->d / s->hkv % s->tk);
    const int group = s->hq / s->hkv;
    int i0 = j - s->q_start > 0 ? j - s->q_start : 0, i1 = s->t;
    if (s->window > 0 && j + s->window - s->q_start < i1)
        i1 = j + s->window - s->q_start;
    st->rg = (region){(int)(e / s->d / s->hkv / s->tk), g * group, (g + 1) * group, i0,
                      i1 > i0 ? i1 : i0};
}

/* rt_rel_err_delta, except for a reference that is exactly zero (window 1: each row's
 * softmax has one key, so dq = dk = 0), where it is the increment's RMS. */
static double err_delta(const float *after, const float *before, const double *ref, size_t n)
{
    double den = 0, num = 0;
    for (size_t i = 0; i < n; i++)
        den += ref[i] * ref[i];
    if (den > 0)
        return rt_rel_err_delta(after, before, ref, n);
    for (size_t i = 0; i < n; i++)
        num += ((double)after[i] - before[i]) * ((double)after[i] - before[i]);
    return sqrt(num / (double)n);
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
    double *p = RT_NEW(double, s.tk), *dp = RT_NEW(double, s.tk), *dc = RT_NEW(double, s.tk);

    ref_forward(&s, ref, rlse, qd, kd, vd, p);
    rt_assert_ok(sbprt_attention_forward_ex(ctx, out, lse, q, k, v, s.b, s.t, s.tk, s.hq, s.hkv,
                                            s.d, s.q_start, (float)s.scale, s.window,
                                            (float)s.softcap));
    rt_assert_err(rt_rel_err(out, ref, nq), RT_TOL, "attention out");
    rt_assert_err(rt_rel_err(lse, rlse, nl), RT_TOL, "attention lse");

    float *dout = rt_random(&r, nq, -1, 1);
    float *dq = rt_random(&r, nq, -1, 1), *dk = rt_random(&r, nkv, -1, 1);
    float *dv = rt_random(&r, nkv, -1, 1);
    float *dq0 = rt_copy(dq, nq), *dk0 = rt_copy(dk, nkv), *dv0 = rt_copy(dv, nkv);
    rt_assert_ok(sbprt_attention_backward_ex(ctx, dq, dk, dv, dout, q, k, v, out, lse, s.b, s.t,
                                             s.tk, s.hq, s.hkv, s.d, s.q_start, (float)s.scale,
                                             s.window, (float)s.softcap));
    double *doutd = rt_to_double(dout, nq);
    double *rdq = RT_NEW(double, nq), *rdk = RT_NEW(double, nkv), *rdv = RT_NEW(double, nkv);
    ref_backward(&s, rdq, rdk, rdv, doutd, qd, kd, vd, p, dp, dc);
    rt_assert_err(err_delta(dq, dq0, rdq, nq), RT_TOL, "attention dq");
    rt_assert_err(err_delta(dk, dk0, rdk, nkv), RT_TOL, "attention dk");
    rt_assert_err(rt_rel_err_delta(dv, dv0, rdv, nkv), RT_TOL, "attention dv");

    att_fd st = {&s, doutd, qd, kd, vd, RT_NEW(double, nq), p, {0, 0, 0, 0, 0}};
    if (s.window != 1) { /* (window 1: f does not depend on q and k at all) */
        rt_assert_err(rt_fd_check(att_f, att_focus_q, &st, qd, nq, dq, dq0, fd_points), RT_TOL,
                      "attention dq fd");
        rt_assert_err(rt_fd_check(att_f, att_focus_kv, &st, kd, nkv, dk, dk0, fd_points), RT_TOL,
                      "attention dk fd");
    }
    rt_assert_err(rt_fd_check(att_f, att_focus_kv, &st, vd, nkv, dv, dv0, fd_points), RT_TOL,
                  "attention dv fd");

    free(st.out);
    free(q), free(k), free(v), free(out), free(lse), free(qd), free(kd), free(vd), free(ref),
        free(rlse), free(p), free(dp), free(dc), free(dout), free(dq), free(dk), free(dv),
        free(dq0), free(dk0), free(dv0), free(doutd), free(rdq), free(rdk), free(rdv);
    sbprt_ctx_destroy(ctx);
}

#define SHAPE(B, T, HQ, HKV, D) {B, T, T, HQ, HKV, D, 0, 1.0 / sqrt(D), 0, 0}

/* One query row, as in decoding: at position 0 it sees one key and its dq is exactly 0 (the
 * softmax of a single score is constant), so the checked row sits at position 5. */
static void test_single_row(void **state)
{
    (void)state;
    check_shape((shape){2, 1, 6, 4, 2, 8, 5, 1.0 / sqrt(8), 0, 0}, 51, SIZE_MAX);
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
    check_shape((shape){2, 29, 100, 4, 2, 8, 50, 0.35, 0, 0}, 57, 80);
}

/* Copies rows [c0, c1) of x: [b, t, h, d] into a [b, c1 - c0, h, d] buffer, or back. */
static void copy_rows(float *dst, const float *src, int b, int t_dst, int t_src, int off_dst,
                      int off_src, int rows, int hd)
{
    for (int bi = 0; bi < b; bi++)
        memcpy(dst + ((size_t)bi * t_dst + off_dst) * hd, src + ((size_t)bi * t_src + off_src) * hd,
               (size_t)rows * hd * sizeof(float));
}

/* One configuration of the chunked test: the variant and the shape that picks the path. */
typedef struct {
    int window;
    float softcap;
    int b, d; /* d = 16: AVX2 path (b = 2: fused backward, b = 1: two passes); d = 12: scalar */
} chunk_cfg;

static void chunked_equals_full(chunk_cfg cfg)
{
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {58};
    const int B = cfg.b, T = 130, HQ = 4, HKV = 2, D = cfg.d, W = cfg.window;
    const float scale = 0.25f, cap = cfg.softcap;
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
    rt_assert_ok(sbprt_attention_forward_ex(ctx, out, lse, q, k, v, B, T, T, HQ, HKV, D, 0, scale,
                                            W, cap));
    rt_assert_ok(sbprt_attention_backward_ex(ctx, dq, dk, dv, dout, q, k, v, out, lse, B, T, T,
                                             HQ, HKV, D, 0, scale, W, cap));

    /* chunked: dk, dv accumulate over chunks; K/V rows the chunk must not read (past the
     * chunk, and before its first row's window) hold NaN */
    float *dk_acc = calloc(nkv, sizeof(float)), *dv_acc = calloc(nkv, sizeof(float));
    float *kp = RT_NEW(float, nkv), *vp = RT_NEW(float, nkv);
    float *dk_before = RT_NEW(float, nkv), *dv_before = RT_NEW(float, nkv);
    for (int c = 0; c < nchunks; c++) {
        const int c0 = bounds[c], c1 = bounds[c + 1], tc = c1 - c0;
        const int klo = W > 0 && c0 - W + 1 > 0 ? c0 - W + 1 : 0;
        const size_t ncq = (size_t)B * tc * HQ * D, ncl = (size_t)B * HQ * tc;
        for (size_t i = 0; i < nkv; i++) {
            int j = (int)(i / ((size_t)HKV * D) % T);
            kp[i] = j >= klo && j < c1 ? k[i] : NAN;
            vp[i] = j >= klo && j < c1 ? v[i] : NAN;
        }
        float *qc = RT_NEW(float, ncq), *gc = RT_NEW(float, ncq), *oc = RT_NEW(float, ncq);
        float *lc = RT_NEW(float, ncl), *dqc = calloc(ncq, sizeof(float));
        float *want = RT_NEW(float, ncq);
        copy_rows(qc, q, B, tc, T, 0, c0, tc, HQ * D);
        copy_rows(gc, dout, B, tc, T, 0, c0, tc, HQ * D);
        rt_assert_ok(sbprt_attention_forward_ex(ctx, oc, lc, qc, kp, vp, B, tc, T, HQ, HKV, D, c0,
                                                scale, W, cap));
        /* forward rows are bitwise those of the full computation: a row's key tiles and
         * summation order do not depend on where its chunk starts */
        copy_rows(want, out, B, tc, T, 0, c0, tc, HQ * D);
        assert_memory_equal(oc, want, ncq * sizeof(float));
        for (int bh = 0; bh < B * HQ; bh++)
            assert_memory_equal(lc + (size_t)bh * tc, lse + (size_t)bh * T + c0,
                                tc * sizeof(float));

        memcpy(dk_before, dk_acc, nkv * sizeof(float));
        memcpy(dv_before, dv_acc, nkv * sizeof(float));
        rt_assert_ok(sbprt_attention_backward_ex(ctx, dqc, dk_acc, dv_acc, gc, qc, kp, vp, oc, lc,
                                                 B, tc, T, HQ, HKV, D, c0, scale, W, cap));
        copy_rows(want, dq, B, tc, T, 0, c0, tc, HQ * D);
        assert_memory_equal(dqc, want, ncq * sizeof(float));
        /* keys the chunk does not read received nothing */
        for (size_t i = 0; i < nkv; i++) {
            int j = (int)(i / ((size_t)HKV * D) % T);
            if (j < klo || j >= c1)
                assert_true(dk_acc[i] == dk_before[i] && dv_acc[i] == dv_before[i]);
        }
        free(qc), free(gc), free(oc), free(lc), free(dqc), free(want);
    }
    double *dkd = rt_to_double(dk, nkv), *dvd = rt_to_double(dv, nkv);
    rt_assert_err(rt_rel_err(dk_acc, dkd, nkv), RT_TOL, "chunked dk");
    rt_assert_err(rt_rel_err(dv_acc, dvd, nkv), RT_TOL, "chunked dv");

    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv),
        free(dk_acc), free(dv_acc), free(kp), free(vp), free(dk_before), free(dv_before),
        free(dkd), free(dvd);
    sbprt_ctx_destroy(ctx);
}

static void test_chunked_equals_full(void **state)
{
    (void)state;
    chunked_equals_full((chunk_cfg){0, 0, 2, 16});
    chunked_equals_full((chunk_cfg){0, 0, 1, 12});
}

/* The variants chunked: window 1, windows that are no multiple of a tile (some chunks start
 * past their first row's window, so whole key tiles are skipped), a window at least t, the
 * cap alone and with a window, on each of the three paths. */
static void test_chunked_equals_full_variants(void **state)
{
    (void)state;
    static const chunk_cfg cfgs[] = {
        {1, 0, 2, 16},   {50, 0, 2, 16},    {50, 0, 1, 16},  {37, 0, 2, 12},
        {200, 0, 2, 16}, {0, 1.5f, 2, 16}, {0, 2.0f, 1, 12}, {45, 1.5f, 2, 16},
        {45, 1.5f, 1, 16}, {29, 2.0f, 2, 12},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
        chunked_equals_full(cfgs[i]);
}

/* Window 1: every row attends to itself alone, so out = v of its own position and dq = dk = 0
 * (checked against the zero reference by RMS). */
static void test_window_one(void **state)
{
    (void)state;
    check_shape((shape){2, 70, 70, 4, 2, 16, 0, 0.25, 1, 0}, 61, 40);
    check_shape((shape){1, 40, 40, 4, 2, 12, 0, 0.25, 1, 3.0}, 62, 40);
}

/* A window of 50 over t = 130: no multiple of the 32-row or 64-key tiles, so rows cut tiles
 * at both ends and late query tiles skip the first key tile; on the three paths. */
static void test_window_tiles(void **state)
{
    (void)state;
    check_shape((shape){2, 130, 130, 4, 2, 16, 0, 0.5, 50, 0}, 63, 50); /* AVX2, fused */
    check_shape((shape){1, 130, 130, 4, 2, 8, 0, 0.5, 50, 0}, 64, 50);  /* AVX2, two passes */
    check_shape((shape){1, 130, 130, 4, 2, 12, 0, 0.5, 50, 0}, 65, 50); /* scalar */
    check_shape((shape){1, 100, 100, 3, 3, 16, 0, 0.4, 64, 0}, 66, 40); /* one key tile, MHA */
}

/* A chunk at q_start > 0 with a window that starts inside the K/V prefix and keys beyond the
 * chunk in the buffer. */
static void test_window_offset_chunk(void **state)
{
    (void)state;
    check_shape((shape){2, 29, 100, 4, 2, 8, 50, 0.35, 20, 0}, 67, 80);
    check_shape((shape){1, 40, 200, 4, 1, 12, 120, 0.35, 70, 0}, 68, 60);
}

/* Soft-capping with scores well beyond the cap (tanh saturates), on the three paths. */
static void test_softcap(void **state)
{
    (void)state;
    check_shape((shape){2, 77, 77, 4, 2, 16, 0, 0.9, 0, 1.5}, 69, 50);
    check_shape((shape){1, 77, 77, 4, 2, 16, 0, 0.9, 0, 1.5}, 70, 50);
    check_shape((shape){1, 77, 77, 4, 2, 12, 0, 1.0, 0, 2.0}, 71, 50);
}

static void test_window_softcap(void **state)
{
    (void)state;
    check_shape((shape){2, 130, 130, 4, 2, 16, 0, 0.6, 45, 2.0}, 72, 50);
    check_shape((shape){1, 130, 130, 4, 2, 8, 0, 0.6, 45, 2.0}, 73, 50);
    check_shape((shape){1, 29, 100, 4, 2, 12, 50, 0.6, 33, 2.0}, 74, 50);
}

/* A window holding every key of every row (window >= q_start + t) is plain causal, bit for
 * bit, forward and backward, on each path. */
static void test_window_covering_is_causal(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {75};
    static const struct {
        int b, d, q_start;
    } cases[] = {{2, 16, 0}, {1, 16, 0}, {1, 12, 0}, {2, 16, 40}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int B = cases[ci].b, D = cases[ci].d, Q0 = cases[ci].q_start;
        const int T = 90, TK = Q0 + T, HQ = 4, HKV = 2;
        const size_t nq = (size_t)B * T * HQ * D, nkv = (size_t)B * TK * HKV * D;
        const size_t nl = (size_t)B * HQ * T;
        float *q = rt_random(&r, nq, -1, 1), *k = rt_random(&r, nkv, -1, 1);
        float *v = rt_random(&r, nkv, -1, 1), *dout = rt_random(&r, nq, -1, 1);
        float *o[2], *l[2], *gq[2], *gk[2], *gv[2];
        const int windows[] = {Q0 + T, Q0 + T + 1000, 0x7fffffff};
        for (int w = 0; w < 3; w++)
            for (int x = 0; x < 2; x++) { /* x = 0: window 0; x = 1: windows[w] */
                const int win = x ? windows[w] : 0;
                o[x] = RT_NEW(float, nq), l[x] = RT_NEW(float, nl);
                gq[x] = calloc(nq, sizeof(float)), gk[x] = calloc(nkv, sizeof(float));
                gv[x] = calloc(nkv, sizeof(float));
                rt_assert_ok(sbprt_attention_forward_ex(ctx, o[x], l[x], q, k, v, B, T, TK, HQ, HKV,
                                                        D, Q0, 0.3f, win, 0));
                rt_assert_ok(sbprt_attention_backward_ex(ctx, gq[x], gk[x], gv[x], dout, q, k, v,
                                                         o[x], l[x], B, T, TK, HQ, HKV, D, Q0,
                                                         0.3f, win, 0));
                if (x) {
                    assert_memory_equal(o[0], o[1], nq * sizeof(float));
                    assert_memory_equal(l[0], l[1], nl * sizeof(float));
                    assert_memory_equal(gq[0], gq[1], nq * sizeof(float));
                    assert_memory_equal(gk[0], gk[1], nkv * sizeof(float));
                    assert_memory_equal(gv[0], gv[1], nkv * sizeof(float));
                    for (int y = 0; y < 2; y++)
                        free(o[y]), free(l[y]), free(gq[y]), free(gk[y]), free(gv[y]);
                }
            }
        /* and the old entry points are the _ex ones with no variant */
        float *o2 = RT_NEW(float, nq), *l2 = RT_NEW(float, nl);
        float *o3 = RT_NEW(float, nq), *l3 = RT_NEW(float, nl);
        rt_assert_ok(sbprt_attention_forward(ctx, o2, l2, q, k, v, B, T, TK, HQ, HKV, D, Q0, 0.3f));
        rt_assert_ok(sbprt_attention_forward_ex(ctx, o3, l3, q, k, v, B, T, TK, HQ, HKV, D, Q0,
                                                0.3f, 0, 0));
        assert_memory_equal(o2, o3, nq * sizeof(float));
        assert_memory_equal(l2, l3, nl * sizeof(float));
        free(o2), free(l2), free(o3), free(l3);
        free(q), free(k), free(v), free(dout);
    }
    sbprt_ctx_destroy(ctx);
}

/* bf16 round to nearest even (as the runtime's). */
static sbprt_bf16 to_bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    sbprt_bf16 h;
    h.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}

static float from_bf(sbprt_bf16 h)
{
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The bf16 variants are the fp32 ones applied to the bf16 values, each output rounded once
 * (dq, dk, dv from zero, so the rounding of the sum is that of the increment). */
static void test_bf16_variants(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {76};
    const int B = 2, T = 70, TK = 90, Q0 = 20, HQ = 4, HKV = 2, D = 16, W = 33;
    const float scale = 0.5f, cap = 1.5f;
    const size_t nq = (size_t)B * T * HQ * D, nkv = (size_t)B * TK * HKV * D;
    const size_t nl = (size_t)B * HQ * T;
    const size_t nall = 2 * nq + 2 * nkv;
    float *f = rt_random(&r, nall, -1, 1);
    sbprt_bf16 *h = RT_NEW(sbprt_bf16, nall);
    for (size_t i = 0; i < nall; i++)
        h[i] = to_bf(f[i]), f[i] = from_bf(h[i]);
    const float *q = f, *k = f + nq, *v = k + nkv, *dout = v + nkv;
    const sbprt_bf16 *hq_ = h, *hk = h + nq, *hv = hk + nkv, *hdout = hv + nkv;

    float *out = RT_NEW(float, nq), *lse = RT_NEW(float, nl), *lse_b = RT_NEW(float, nl);
    sbprt_bf16 *out_b = RT_NEW(sbprt_bf16, nq);
    rt_assert_ok(sbprt_attention_forward_ex_bf16(ctx, out_b, lse_b, hq_, hk, hv, B, T, TK, HQ, HKV,
                                                 D, Q0, scale, W, cap));
    /* fp32 on the values the bf16 output stands for */
    float *out_r = RT_NEW(float, nq);
    for (size_t i = 0; i < nq; i++)
        out_r[i] = from_bf(out_b[i]);
    rt_assert_ok(sbprt_attention_forward_ex(ctx, out, lse, q, k, v, B, T, TK, HQ, HKV, D, Q0,
                                            scale, W, cap));
    assert_memory_equal(lse, lse_b, nl * sizeof(float));
    for (size_t i = 0; i < nq; i++)
        assert_int_equal(out_b[i].bits, to_bf(out[i]).bits);

    float *dq = calloc(nq, sizeof(float)), *dk = calloc(nkv, sizeof(float));
    float *dv = calloc(nkv, sizeof(float));
    sbprt_bf16 *dq_b = calloc(nq, sizeof(sbprt_bf16)), *dk_b = calloc(nkv, sizeof(sbprt_bf16));
    sbprt_bf16 *dv_b = calloc(nkv, sizeof(sbprt_bf16));
    rt_assert_ok(sbprt_attention_backward_ex_bf16(ctx, dq_b, dk_b, dv_b, hdout, hq_, hk, hv, out_b,
                                                  lse_b, B, T, TK, HQ, HKV, D, Q0, scale, W, cap));
    rt_assert_ok(sbprt_attention_backward_ex(ctx, dq, dk, dv, dout, q, k, v, out_r, lse_b, B, T,
                                             TK, HQ, HKV, D, Q0, scale, W, cap));
    for (size_t i = 0; i < nq; i++)
        assert_int_equal(dq_b[i].bits, to_bf(dq[i]).bits);
    for (size_t i = 0; i < nkv; i++) {
        assert_int_equal(dk_b[i].bits, to_bf(dk[i]).bits);
        assert_int_equal(dv_b[i].bits, to_bf(dv[i]).bits);
    }
    free(f), free(h), free(out), free(lse), free(lse_b), free(out_b), free(out_r), free(dq),
        free(dk), free(dv), free(dq_b), free(dk_b), free(dv_b);
    sbprt_ctx_destroy(ctx);
}

static void test_invalid_shapes(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(1);
    float x[64] = {0}, l[8];
    sbprt_bf16 xb[64] = {{0}};
    /* hq not a multiple of hkv */
    assert_int_equal(sbprt_attention_forward(ctx, x, l, x, x, x, 1, 2, 2, 3, 2, 4, 0, 1),
                     SBPRT_ERR_INVALID);
    /* chunk runs past the key buffer */
    assert_int_equal(sbprt_attention_forward(ctx, x, l, x, x, x, 1, 2, 3, 2, 2, 4, 2, 1),
                     SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_attention_backward(ctx, x, x, NULL, x, x, x, x, x, l, 1, 2, 2, 2, 2, 4,
                                              0, 1),
                     SBPRT_ERR_INVALID); /* dk without dv */
    /* a negative window, a negative or non-finite cap; also for an empty chunk (t = 0) */
    const struct {
        int window;
        float softcap;
    } bad[] = {{-1, 0}, {0, -1.0f}, {0, NAN}, {0, INFINITY}, {-5, 2.0f}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        for (int t = 0; t <= 2; t += 2) {
            const int w = bad[i].window;
            const float c = bad[i].softcap;
            assert_int_equal(sbprt_attention_forward_ex(ctx, x, l, x, x, x, 1, t, 2, 2, 2, 4, 0, 1,
                                                        w, c),
                             SBPRT_ERR_INVALID);
            assert_int_equal(sbprt_attention_backward_ex(ctx, x, x, x, x, x, x, x, x, l, 1, t, 2, 2,
                                                         2, 4, 0, 1, w, c),
                             SBPRT_ERR_INVALID);
            assert_int_equal(sbprt_attention_forward_ex_bf16(ctx, xb, l, xb, xb, xb, 1, t, 2, 2, 2,
                                                             4, 0, 1, w, c),
                             SBPRT_ERR_INVALID);
            assert_int_equal(sbprt_attention_backward_ex_bf16(ctx, xb, xb, xb, xb, xb, xb, xb, xb,
                                                              l, 1, t, 2, 2, 2, 4, 0, 1, w, c),
                             SBPRT_ERR_INVALID);
        }
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
        cmocka_unit_test(test_chunked_equals_full_variants),
        cmocka_unit_test(test_window_one),
        cmocka_unit_test(test_window_tiles),
        cmocka_unit_test(test_window_offset_chunk),
        cmocka_unit_test(test_softcap),
        cmocka_unit_test(test_window_softcap),
        cmocka_unit_test(test_window_covering_is_causal),
        cmocka_unit_test(test_bf16_variants),
        cmocka_unit_test(test_invalid_shapes),
    };
    return cmocka_run_group_tests_name("runtime_attention", tests, NULL, NULL);
}
