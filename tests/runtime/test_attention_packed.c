/*
 * test_attention_packed.c — attention over packed documents (several documents per row, a
 * block-diagonal causal mask), forward and backward, and the two kernels that derive its
 * inputs from document ids (sbprt_doc_starts, sbprt_doc_positions).
 *
 * The reference is naive softmax attention in double with the mask written out: query
 * position P sees key j when doc_start[P] <= j <= P (and P - window < j with a window), the
 * tanh cap applied densely.  The cases cover the kernel's three code paths (AVX2 with the
 * fused backward: d a multiple of 8 and b * hkv >= 4; AVX2 two-pass: b * hkv < 4; scalar: other
 * d), documents of one token, boundaries on and off the 64-key tiles, rows of one document
 * (bitwise the _ex result), GQA and MQA, a window and a cap together with documents, two
 * batch rows with different boundaries, and StreamBP chunks whose first document started
 * before the chunk: the K/V rows a chunk must not read (before its first document, after its
 * end) hold NaN, and dk/dv rows it must not touch are checked to be bitwise unchanged.
 * Gradients are also checked against central differences of the reference on small cases.
 */
#include "rt_test.h"

typedef struct {
    int b, t, tk, hq, hkv, d, q_start;
    double scale;
    int window;            /* sliding window; 0: none */
    double softcap;        /* logit cap; 0: none */
    const int32_t *starts; /* doc_start: [b, tk] */
} pshape;

static size_t q_len(const pshape *s) { return (size_t)s->b * s->t * s->hq * s->d; }
static size_t kv_len(const pshape *s) { return (size_t)s->b * s->tk * s->hkv * s->d; }
static size_t q_at(const pshape *s, int b, int i, int h)
{
    return (((size_t)b * s->t + i) * s->hq + h) * s->d;
}
static size_t kv_at(const pshape *s, int b, int j, int g)
{
    return (((size_t)b * s->tk + j) * s->hkv + g) * s->d;
}

/* doc_start [b, tk] from each row's document lengths (lens[b], a 0-terminated list summing to
 * tk). */
static int32_t *starts_from_lens(int b, int tk, const int *const *lens)
{
    int32_t *ds = RT_NEW(int32_t, (size_t)b * tk);
    for (int bi = 0; bi < b; bi++) {
        int p = 0;
        for (const int *l = lens[bi]; *l; l++)
            for (int e = 0; e < *l; e++, p++)
                ds[(size_t)bi * tk + p] = p - e;
        assert_int_equal(p, tk);
    }
    return ds;
}

/* The first key position pos of row b sees. */
static int ref_lo(const pshape *s, int b, int pos)
{
    int lo = s->starts[(size_t)b * s->tk + pos];
    if (s->window > 0 && pos - s->window + 1 > lo)
        lo = pos - s->window + 1;
    return lo;
}

/* Probabilities of query (b, i, h) over its keys into p[lo..pos], the cap's derivative in
 * dcap (may be NULL), the logsumexp in *lse (may be NULL); returns lo. */
static int ref_probs(const pshape *s, double *p, double *dcap, double *lse, const double *q,
                     const double *k, int b, int i, int h)
{
    const int g = h / (s->hq / s->hkv), pos = s->q_start + i, lo = ref_lo(s, b, pos);
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
            const double th = tanh(p[j] / s->softcap);
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
    return lo;
}

/* out (and lse, when not NULL) of batch b, query rows [i0, i1); p: [tk] scratch. */
static void ref_forward_rows(const pshape *s, double *out, double *lse, const double *q,
                             const double *k, const double *v, double *p, int b, int i0, int i1)
{
    for (int h = 0; h < s->hq; h++)
        for (int i = i0; i < i1; i++) {
            double z;
            const int lo = ref_probs(s, p, NULL, &z, q, k, b, i, h);
            const int g = h / (s->hq / s->hkv);
            double *o = out + q_at(s, b, i, h);
            memset(o, 0, s->d * sizeof(double));
            for (int j = lo; j <= s->q_start + i; j++)
                for (int c = 0; c < s->d; c++)
                    o[c] += p[j] * v[kv_at(s, b, j, g) + c];
            if (lse)
                lse[((size_t)b * s->hq + h) * s->t + i] = z;
        }
}

/* The analytic backward in double (dq, dk, dv zeroed and filled). */
static void ref_backward(const pshape *s, double *dq, double *dk, double *dv, const double *dout,
                         const double *q, const double *k, const double *v, double *p,
                         double *dp, double *dc)
{
    memset(dq, 0, q_len(s) * sizeof(double));
    memset(dk, 0, kv_len(s) * sizeof(double));
    memset(dv, 0, kv_len(s) * sizeof(double));
    for (int b = 0; b < s->b; b++)
        for (int h = 0; h < s->hq; h++)
            for (int i = 0; i < s->t; i++) {
                const int lo = ref_probs(s, p, dc, NULL, q, k, b, i, h), pos = s->q_start + i;
                const int g = h / (s->hq / s->hkv);
                const size_t qo = q_at(s, b, i, h);
                double delta = 0;
                for (int j = lo; j <= pos; j++) {
                    dp[j] = 0;
                    for (int c = 0; c < s->d; c++)
                        dp[j] += dout[qo + c] * v[kv_at(s, b, j, g) + c];
                    delta += p[j] * dp[j];
                }
                for (int j = lo; j <= pos; j++) {
                    const size_t ko = kv_at(s, b, j, g);
                    const double ds = p[j] * (dp[j] - delta) * dc[j];
                    for (int c = 0; c < s->d; c++) {
                        dq[qo + c] += s->scale * ds * k[ko + c];
                        dk[ko + c] += s->scale * ds * q[qo + c];
                        dv[ko + c] += p[j] * dout[qo + c];
                    }
                }
            }
}

/* f = Σ w ∘ out for the finite differences, over the rows an element can change (its own
 * row for q; the rows at or after its position for k and v: rows that do not see it give
 * the same value on both sides of the difference). */
typedef struct {
    const pshape *s;
    const double *w;
    double *q, *k, *v, *out, *p;
    int b, i0, i1;
} pfd;

static double pfd_f(void *ptr)
{
    pfd *st = ptr;
    const pshape *s = st->s;
    ref_forward_rows(s, st->out, NULL, st->q, st->k, st->v, st->p, st->b, st->i0, st->i1);
    double f = 0;
    for (int i = st->i0; i < st->i1; i++)
        for (int h = 0; h < s->hq; h++)
            for (int c = 0; c < s->d; c++)
                f += st->w[q_at(s, st->b, i, h) + c] * st->out[q_at(s, st->b, i, h) + c];
    return f;
}

static void pfd_focus_q(void *ptr, size_t e)
{
    pfd *st = ptr;
    const pshape *s = st->s;
    st->i0 = (int)(e / s->d / s->hq % s->t);
    st->i1 = st->i0 + 1;
    st->b = (int)(e / s->d / s->hq / s->t);
}

static void pfd_focus_kv(void *ptr, size_t e)
{
    pfd *st = ptr;
    const pshape *s = st->s;
    const int j = (int)(e / s->d / s->hkv % s->tk);
    st->b = (int)(e / s->d / s->hkv / s->tk);
    st->i0 = j - s->q_start > 0 ? j - s->q_start : 0;
    st->i1 = st->i0 > s->t ? st->i0 : s->t;
}

/* The first key row b's chunk may read; keys before it and from q_start + t on hold NaN. */
static int chunk_klo(const pshape *s, int b) { return ref_lo(s, b, s->q_start); }

static int kv_unread(const pshape *s, size_t e)
{
    const int j = (int)(e / s->d / s->hkv % s->tk), b = (int)(e / s->d / s->hkv / s->tk);
    return j < chunk_klo(s, b) || j >= s->q_start + s->t;
}

/* Forward and backward of one case against the reference; fd_points finite-difference
 * checks per input (0: none). */
static void check_case(pshape s, uint64_t seed, size_t fd_points)
{
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {seed};
    const size_t nq = q_len(&s), nkv = kv_len(&s), nl = (size_t)s.b * s.hq * s.t;
    float *q = rt_random(&r, nq, -1, 1), *k = rt_random(&r, nkv, -1, 1);
    float *v = rt_random(&r, nkv, -1, 1);
    for (size_t e = 0; e < nkv; e++)
        if (kv_unread(&s, e))
            k[e] = v[e] = NAN;
    float *out = RT_NEW(float, nq), *lse = RT_NEW(float, nl);
    double *qd = rt_to_double(q, nq), *kd = rt_to_double(k, nkv), *vd = rt_to_double(v, nkv);
    double *ref = RT_NEW(double, nq), *rlse = RT_NEW(double, nl);
    double *p = RT_NEW(double, s.tk), *dp = RT_NEW(double, s.tk), *dc = RT_NEW(double, s.tk);

    for (int b = 0; b < s.b; b++)
        ref_forward_rows(&s, ref, rlse, qd, kd, vd, p, b, 0, s.t);
    rt_assert_ok(sbprt_attention_forward_packed(ctx, out, lse, q, k, v, s.starts, s.b, s.t, s.tk,
                                                s.hq, s.hkv, s.d, s.q_start, (float)s.scale,
                                                s.window, (float)s.softcap));
    rt_assert_err(rt_rel_err(out, ref, nq), RT_TOL, "packed out");
    rt_assert_err(rt_rel_err(lse, rlse, nl), RT_TOL, "packed lse");

    float *dout = rt_random(&r, nq, -1, 1);
    float *dq = rt_random(&r, nq, -1, 1), *dk = rt_random(&r, nkv, -1, 1);
    float *dv = rt_random(&r, nkv, -1, 1);
    float *dq0 = rt_copy(dq, nq), *dk0 = rt_copy(dk, nkv), *dv0 = rt_copy(dv, nkv);
    rt_assert_ok(sbprt_attention_backward_packed(ctx, dq, dk, dv, dout, q, k, v, out, lse,
                                                 s.starts, s.b, s.t, s.tk, s.hq, s.hkv, s.d,
                                                 s.q_start, (float)s.scale, s.window,
                                                 (float)s.softcap));
    /* the rows the chunk does not read get nothing added, bitwise */
    for (size_t e = 0; e < nkv; e++)
        if (kv_unread(&s, e)) {
            assert_memory_equal(&dk[e], &dk0[e], sizeof(float));
            assert_memory_equal(&dv[e], &dv0[e], sizeof(float));
        }
    double *doutd = rt_to_double(dout, nq);
    double *rdq = RT_NEW(double, nq), *rdk = RT_NEW(double, nkv), *rdv = RT_NEW(double, nkv);
    ref_backward(&s, rdq, rdk, rdv, doutd, qd, kd, vd, p, dp, dc);
    /* the NaN rows' reference is 0 and their increment is 0: compare the rest */
    for (size_t e = 0; e < nkv; e++)
        if (kv_unread(&s, e))
            rdk[e] = rdv[e] = 0, dk[e] = dk0[e] = dv[e] = dv0[e] = 0;
    rt_assert_err(rt_rel_err_delta(dq, dq0, rdq, nq), RT_TOL, "packed dq");
    rt_assert_err(rt_rel_err_delta(dk, dk0, rdk, nkv), RT_TOL, "packed dk");
    rt_assert_err(rt_rel_err_delta(dv, dv0, rdv, nkv), RT_TOL, "packed dv");

    if (fd_points) {
        pfd st = {&s, doutd, qd, kd, vd, RT_NEW(double, nq), p, 0, 0, 0};
        rt_assert_err(rt_fd_check(pfd_f, pfd_focus_q, &st, qd, nq, dq, dq0, fd_points), RT_TOL,
                      "packed dq fd");
        rt_assert_err(rt_fd_check(pfd_f, pfd_focus_kv, &st, kd, nkv, dk, dk0, fd_points), RT_TOL,
                      "packed dk fd");
        rt_assert_err(rt_fd_check(pfd_f, pfd_focus_kv, &st, vd, nkv, dv, dv0, fd_points), RT_TOL,
                      "packed dv fd");
        free(st.out);
    }
    free(q), free(k), free(v), free(out), free(lse), free(qd), free(kd), free(vd), free(ref),
        free(rlse), free(p), free(dp), free(dc), free(dout), free(dq), free(dk), free(dv),
        free(dq0), free(dk0), free(dv0), free(doutd), free(rdq), free(rdk), free(rdv);
    sbprt_ctx_destroy(ctx);
}

/* Two rows of 150 positions: row 0 with 1-token documents and boundaries off the tiles, row 1
 * with boundaries on the 64-key tiles. */
static const int LENS0[] = {1, 40, 1, 1, 70, 37, 0}, LENS1[] = {64, 64, 22, 0};

static pshape shape_of(int b, int t, int hq, int hkv, int d, const int32_t *starts)
{
    return (pshape){b, t, t, hq, hkv, d, 0, 1.0 / sqrt(d), 0, 0, starts};
}

static void test_several_documents(void **state)
{
    (void)state;
    const int *lens[] = {LENS0, LENS1};
    int32_t *ds = starts_from_lens(2, 150, lens);
    check_case(shape_of(2, 150, 4, 2, 16, ds), 81, 0); /* AVX2, fused backward */
    check_case(shape_of(2, 150, 4, 2, 12, ds), 82, 0); /* scalar */
    check_case(shape_of(1, 150, 4, 2, 16, ds), 83, 0); /* AVX2, two passes (row 0 only) */
    check_case(shape_of(1, 150, 4, 2, 16, ds + 150), 84, 0);
    free(ds);
}

/* GQA with a group of 3, MQA and MHA. */
static void test_gqa_mqa(void **state)
{
    (void)state;
    const int *lens[] = {LENS0, LENS1};
    int32_t *ds = starts_from_lens(2, 150, lens);
    check_case(shape_of(2, 150, 6, 2, 8, ds), 85, 0);
    check_case(shape_of(2, 150, 3, 1, 16, ds), 86, 0);
    check_case(shape_of(1, 150, 2, 2, 12, ds), 87, 0);
    free(ds);
}

/* Small cases, every gradient element against finite differences too. */
static void test_finite_differences(void **state)
{
    (void)state;
    static const int a[] = {7, 1, 12, 0}, b[] = {1, 1, 18, 0};
    const int *lens[] = {a, b};
    int32_t *ds = starts_from_lens(2, 20, lens);
    check_case(shape_of(2, 20, 4, 2, 8, ds), 88, SIZE_MAX); /* fused */
    check_case(shape_of(1, 20, 2, 1, 5, ds), 89, SIZE_MAX); /* scalar */
    pshape s = shape_of(2, 20, 4, 2, 8, ds);
    s.window = 5, s.softcap = 1.5;
    check_case(s, 90, SIZE_MAX);
    free(ds);
}

/* Chunks of a row whose first document started before the chunk (keys before it are NaN),
 * on each path; also one chunk starting exactly on a boundary and one inside a 1-token run. */
static void test_chunk_after_document_start(void **state)
{
    (void)state;
    static const int a[] = {30, 40, 1, 29, 60, 0}, b[] = {100, 1, 1, 58, 0};
    const int *lens[] = {a, b};
    int32_t *ds = starts_from_lens(2, 160, lens);
    static const struct {
        int b, d, q_start, t;
    } cs[] = {{2, 16, 50, 60}, {1, 16, 50, 60}, {2, 12, 50, 60}, {2, 16, 70, 90},
              {2, 16, 100, 60}, {2, 8, 101, 5}, {1, 12, 129, 31}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        pshape s = {cs[i].b, cs[i].t, 160, 4, 2, cs[i].d, cs[i].q_start, 0.3, 0, 0, ds};
        check_case(s, 91 + i, 0);
    }
    free(ds);
}

/* A window together with documents: the tighter of the two bounds wins, row by row. */
static void test_window_with_documents(void **state)
{
    (void)state;
    const int *lens[] = {LENS0, LENS1};
    int32_t *ds = starts_from_lens(2, 150, lens);
    static const int windows[] = {1, 20, 50, 70, 149};
    for (int w = 0; w < 5; w++) {
        pshape s = shape_of(2, 150, 4, 2, w % 2 ? 16 : 12, ds);
        s.window = windows[w];
        if (windows[w] > 1)
            check_case(s, 100 + w, 0);
        s.q_start = 40, s.t = 110; /* a chunk, first row inside the 70-token document's window */
        if (windows[w] > 1)
            check_case(s, 110 + w, 0);
    }
    free(ds);
}

static void test_softcap_with_documents(void **state)
{
    (void)state;
    const int *lens[] = {LENS0, LENS1};
    int32_t *ds = starts_from_lens(2, 150, lens);
    pshape s = shape_of(2, 150, 4, 2, 16, ds);
    s.softcap = 2.0, s.scale = 0.8;
    check_case(s, 120, 0);
    s.d = 12, s.window = 33;
    check_case(s, 121, 0);
    free(ds);
}

/* A row that is one document is plain causal attention: bitwise the _ex result (and NULL is
 * the same again), on each path and for a chunk. */
static void one_document_case(int b, int d, int q_start, int t, int window, float cap)
{
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {130};
    const int tk = 140, hq = 4, hkv = 2;
    const size_t nq = (size_t)b * t * hq * d, nkv = (size_t)b * tk * hkv * d;
    const size_t nl = (size_t)b * hq * t;
    int32_t *zeros = calloc((size_t)b * tk, sizeof(int32_t));
    float *q = rt_random(&r, nq, -1, 1), *k = rt_random(&r, nkv, -1, 1);
    float *v = rt_random(&r, nkv, -1, 1), *dout = rt_random(&r, nq, -1, 1);
    float *o[3], *l[3], *g[3][3];
    for (int m = 0; m < 3; m++) { /* _ex, packed with zeros, packed with NULL */
        o[m] = RT_NEW(float, nq), l[m] = RT_NEW(float, nl);
        g[m][0] = calloc(nq, sizeof(float));
        g[m][1] = calloc(nkv, sizeof(float)), g[m][2] = calloc(nkv, sizeof(float));
        const int32_t *docs = m == 1 ? zeros : NULL;
        if (m == 0) {
            rt_assert_ok(sbprt_attention_forward_ex(ctx, o[m], l[m], q, k, v, b, t, tk, hq, hkv,
                                                    d, q_start, 0.4f, window, cap));
            rt_assert_ok(sbprt_attention_backward_ex(ctx, g[m][0], g[m][1], g[m][2], dout, q, k,
                                                     v, o[m], l[m], b, t, tk, hq, hkv, d,
                                                     q_start, 0.4f, window, cap));
        } else {
            rt_assert_ok(sbprt_attention_forward_packed(ctx, o[m], l[m], q, k, v, docs, b, t, tk,
                                                        hq, hkv, d, q_start, 0.4f, window, cap));
            rt_assert_ok(sbprt_attention_backward_packed(ctx, g[m][0], g[m][1], g[m][2], dout, q,
                                                         k, v, o[m], l[m], docs, b, t, tk, hq,
                                                         hkv, d, q_start, 0.4f, window, cap));
        }
    }
    for (int m = 1; m < 3; m++) {
        assert_memory_equal(o[m], o[0], nq * sizeof(float));
        assert_memory_equal(l[m], l[0], nl * sizeof(float));
        assert_memory_equal(g[m][0], g[0][0], nq * sizeof(float));
        assert_memory_equal(g[m][1], g[0][1], nkv * sizeof(float));
        assert_memory_equal(g[m][2], g[0][2], nkv * sizeof(float));
    }
    for (int m = 0; m < 3; m++)
        free(o[m]), free(l[m]), free(g[m][0]), free(g[m][1]), free(g[m][2]);
    free(zeros), free(q), free(k), free(v), free(dout);
    sbprt_ctx_destroy(ctx);
}

static void test_one_document_equals_ex(void **state)
{
    (void)state;
    one_document_case(2, 16, 0, 140, 0, 0);
    one_document_case(1, 16, 0, 140, 0, 0);
    one_document_case(2, 12, 0, 140, 0, 0);
    one_document_case(2, 16, 37, 90, 0, 0);
    one_document_case(1, 12, 37, 90, 30, 1.5f);
    one_document_case(2, 16, 37, 90, 30, 1.5f);
}

/* Chunks of a packed row give bitwise the rows of the unchunked call (forward and dq), and
 * dk/dv accumulated over the chunks match the unchunked ones; each chunk gets only the K/V
 * rows from its first document's start on (the rest NaN). */
static void chunked_equals_full(int b, int d, int window)
{
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {140};
    static const int a[] = {30, 40, 1, 29, 60, 0}, bl[] = {100, 1, 1, 58, 0};
    const int *lens[] = {a, bl};
    const int T = 160, HQ = 4, HKV = 2;
    int32_t *ds = starts_from_lens(b, T, lens);
    const int bounds[] = {0, 45, 71, 101, 130, 160};
    const size_t nq = (size_t)b * T * HQ * d, nkv = (size_t)b * T * HKV * d;
    const size_t nl = (size_t)b * HQ * T;
    float *q = rt_random(&r, nq, -1, 1), *k = rt_random(&r, nkv, -1, 1);
    float *v = rt_random(&r, nkv, -1, 1), *dout = rt_random(&r, nq, -1, 1);
    float *out = RT_NEW(float, nq), *lse = RT_NEW(float, nl);
    float *dq = calloc(nq, sizeof(float)), *dk = calloc(nkv, sizeof(float));
    float *dv = calloc(nkv, sizeof(float));
    rt_assert_ok(sbprt_attention_forward_packed(ctx, out, lse, q, k, v, ds, b, T, T, HQ, HKV, d,
                                                0, 0.3f, window, 0));
    rt_assert_ok(sbprt_attention_backward_packed(ctx, dq, dk, dv, dout, q, k, v, out, lse, ds, b,
                                                 T, T, HQ, HKV, d, 0, 0.3f, window, 0));
    float *dka = calloc(nkv, sizeof(float)), *dva = calloc(nkv, sizeof(float));
    float *kp = RT_NEW(float, nkv), *vp = RT_NEW(float, nkv);
    for (int c = 0; c < 5; c++) {
        const int c0 = bounds[c], tc = bounds[c + 1] - c0;
        for (size_t e = 0; e < nkv; e++) {
            const int j = (int)(e / ((size_t)HKV * d) % T), bi = (int)(e / ((size_t)HKV * d * T));
            int klo = ds[(size_t)bi * T + c0];
            if (window > 0 && c0 - window + 1 > klo)
                klo = c0 - window + 1;
            const int keep = j >= klo && j < c0 + tc;
            kp[e] = keep ? k[e] : NAN;
            vp[e] = keep ? v[e] : NAN;
        }
        const size_t ncq = (size_t)b * tc * HQ * d, ncl = (size_t)b * HQ * tc;
        float *qc = RT_NEW(float, ncq), *gc = RT_NEW(float, ncq), *oc = RT_NEW(float, ncq);
        float *lc = RT_NEW(float, ncl), *dqc = calloc(ncq, sizeof(float));
        for (int bi = 0; bi < b; bi++) {
            const size_t row = (size_t)HQ * d;
            memcpy(qc + (size_t)bi * tc * row, q + ((size_t)bi * T + c0) * row,
                   tc * row * sizeof(float));
            memcpy(gc + (size_t)bi * tc * row, dout + ((size_t)bi * T + c0) * row,
                   tc * row * sizeof(float));
        }
        rt_assert_ok(sbprt_attention_forward_packed(ctx, oc, lc, qc, kp, vp, ds, b, tc, T, HQ, HKV,
                                                    d, c0, 0.3f, window, 0));
        rt_assert_ok(sbprt_attention_backward_packed(ctx, dqc, dka, dva, gc, qc, kp, vp, oc, lc,
                                                     ds, b, tc, T, HQ, HKV, d, c0, 0.3f, window,
                                                     0));
        for (int bi = 0; bi < b; bi++) {
            const size_t row = (size_t)HQ * d;
            assert_memory_equal(oc + (size_t)bi * tc * row, out + ((size_t)bi * T + c0) * row,
                                tc * row * sizeof(float));
            assert_memory_equal(dqc + (size_t)bi * tc * row, dq + ((size_t)bi * T + c0) * row,
                                tc * row * sizeof(float));
            for (int h = 0; h < HQ; h++)
                assert_memory_equal(lc + ((size_t)bi * HQ + h) * tc,
                                    lse + ((size_t)bi * HQ + h) * T + c0, tc * sizeof(float));
        }
        free(qc), free(gc), free(oc), free(lc), free(dqc);
    }
    double *dkd = rt_to_double(dk, nkv), *dvd = rt_to_double(dv, nkv);
    rt_assert_err(rt_rel_err(dka, dkd, nkv), RT_TOL, "chunked packed dk");
    rt_assert_err(rt_rel_err(dva, dvd, nkv), RT_TOL, "chunked packed dv");
    free(ds), free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk),
        free(dv), free(dka), free(dva), free(kp), free(vp), free(dkd), free(dvd);
    sbprt_ctx_destroy(ctx);
}

static void test_chunked_equals_full(void **state)
{
    (void)state;
    chunked_equals_full(2, 16, 0);
    chunked_equals_full(1, 16, 0);
    chunked_equals_full(2, 12, 0);
    chunked_equals_full(2, 16, 25);
}

static sbprt_bf16 to_bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (sbprt_bf16){(uint16_t)(u >> 16)};
}

static float from_bf(sbprt_bf16 h)
{
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The bf16 entry points are the fp32 ones on the bf16 values, each output rounded once. */
static void test_bf16(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {150};
    const int B = 2, T = 60, TK = 100, Q0 = 40, HQ = 4, HKV = 2, D = 16, W = 33;
    static const int a[] = {35, 1, 1, 63, 0}, bl[] = {50, 50, 0};
    const int *lens[] = {a, bl};
    int32_t *ds = starts_from_lens(B, TK, lens);
    const size_t nq = (size_t)B * T * HQ * D, nkv = (size_t)B * TK * HKV * D;
    const size_t nl = (size_t)B * HQ * T, nall = 2 * nq + 2 * nkv;
    float *f = rt_random(&r, nall, -1, 1);
    sbprt_bf16 *h = RT_NEW(sbprt_bf16, nall);
    for (size_t i = 0; i < nall; i++)
        h[i] = to_bf(f[i]), f[i] = from_bf(h[i]);
    const float *q = f, *k = f + nq, *v = k + nkv, *dout = v + nkv;
    const sbprt_bf16 *hq_ = h, *hk = h + nq, *hv = hk + nkv, *hdout = hv + nkv;
    float *out = RT_NEW(float, nq), *lse = RT_NEW(float, nl), *lse_b = RT_NEW(float, nl);
    sbprt_bf16 *out_b = RT_NEW(sbprt_bf16, nq);
    rt_assert_ok(sbprt_attention_forward_packed_bf16(ctx, out_b, lse_b, hq_, hk, hv, ds, B, T, TK,
                                                     HQ, HKV, D, Q0, 0.5f, W, 1.5f));
    rt_assert_ok(sbprt_attention_forward_packed(ctx, out, lse, q, k, v, ds, B, T, TK, HQ, HKV, D,
                                                Q0, 0.5f, W, 1.5f));
    assert_memory_equal(lse, lse_b, nl * sizeof(float));
    float *out_r = RT_NEW(float, nq);
    for (size_t i = 0; i < nq; i++) {
        assert_int_equal(out_b[i].bits, to_bf(out[i]).bits);
        out_r[i] = from_bf(out_b[i]);
    }
    float *dq = calloc(nq, sizeof(float)), *dk = calloc(nkv, sizeof(float));
    float *dv = calloc(nkv, sizeof(float));
    sbprt_bf16 *dq_b = calloc(nq, sizeof(sbprt_bf16)), *dk_b = calloc(nkv, sizeof(sbprt_bf16));
    sbprt_bf16 *dv_b = calloc(nkv, sizeof(sbprt_bf16));
    rt_assert_ok(sbprt_attention_backward_packed_bf16(ctx, dq_b, dk_b, dv_b, hdout, hq_, hk, hv,
                                                      out_b, lse_b, ds, B, T, TK, HQ, HKV, D, Q0,
                                                      0.5f, W, 1.5f));
    rt_assert_ok(sbprt_attention_backward_packed(ctx, dq, dk, dv, dout, q, k, v, out_r, lse_b, ds,
                                                 B, T, TK, HQ, HKV, D, Q0, 0.5f, W, 1.5f));
    for (size_t i = 0; i < nq; i++)
        assert_int_equal(dq_b[i].bits, to_bf(dq[i]).bits);
    for (size_t i = 0; i < nkv; i++) {
        assert_int_equal(dk_b[i].bits, to_bf(dk[i]).bits);
        assert_int_equal(dv_b[i].bits, to_bf(dv[i]).bits);
    }
    free(ds), free(f), free(h), free(out), free(lse), free(lse_b), free(out_b), free(out_r),
        free(dq), free(dk), free(dv), free(dq_b), free(dk_b), free(dv_b);
    sbprt_ctx_destroy(ctx);
}

/* A doc_start of the chunk that is negative, past its position or decreasing gives
 * SBPRT_ERR_RANGE with nothing written; values outside the chunk are not looked at. */
static void test_bad_doc_start(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(1);
    enum { T = 6, TK = 8, D = 8 };
    float q[T * D], kv[TK * D], out[T * D], lse[T], g[3 * TK * D], before[3 * TK * D];
    rt_rng r = {160};
    rt_fill(&r, q, T * D, -1, 1);
    rt_fill(&r, kv, TK * D, -1, 1);
    static const int32_t bad[][TK] = {
        {0, 0, -1, 3, 3, 3, 3, 3}, /* negative */
        {0, 0, 0, 4, 3, 3, 3, 3},  /* past its position (p = 3) */
        {0, 0, 2, 1, 1, 1, 1, 1},  /* decreasing */
    };
    for (int c = 0; c < 3; c++) {
        rt_fill(&r, out, T * D, -1, 1);
        rt_fill(&r, g, 3 * TK * D, -1, 1);
        float out0[T * D];
        memcpy(out0, out, sizeof out);
        memcpy(before, g, sizeof g);
        /* the chunk: positions 2 .. 2 + t - 1 */
        assert_int_equal(sbprt_attention_forward_packed(ctx, out, lse, q, kv, kv, bad[c], 1, T, TK,
                                                        1, 1, D, 2, 1.0f, 0, 0),
                         SBPRT_ERR_RANGE);
        assert_memory_equal(out, out0, sizeof out);
        assert_int_equal(sbprt_attention_backward_packed(ctx, g, g + TK * D, g + 2 * TK * D, q, q,
                                                         kv, kv, q, lse, bad[c], 1, 2, TK, 1, 1,
                                                         D, 2, 1.0f, 0, 0),
                         SBPRT_ERR_RANGE);
        assert_memory_equal(g, before, sizeof g);
    }
    /* garbage before the chunk (q_start = 5) is never looked at */
    const int32_t ok[TK] = {-7, 99, 3, 0, 5, 5, 6, 6};
    rt_assert_ok(sbprt_attention_forward_packed(ctx, out, lse, q, kv, kv, ok, 1, 3, TK, 1, 1, D, 5,
                                                1.0f, 0, 0));
    sbprt_bf16 xb[64] = {{0}};
    assert_int_equal(sbprt_attention_forward_packed_bf16(ctx, xb, lse, xb, xb, xb, bad[0], 1, 2,
                                                         TK, 1, 1, D, 2, 1.0f, 0, 0),
                     SBPRT_ERR_RANGE);
    /* argument errors as the _ex functions */
    assert_int_equal(sbprt_attention_forward_packed(ctx, out, lse, q, kv, kv, ok, 1, 3, TK, 3, 2,
                                                    D, 5, 1.0f, 0, 0),
                     SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_attention_backward_packed(ctx, g, g, g, q, q, kv, kv, q, lse, ok, 1, 3,
                                                     TK, 1, 1, D, 5, 1.0f, -1, 0),
                     SBPRT_ERR_INVALID);
    sbprt_ctx_destroy(ctx);
}

static void test_doc_starts_positions(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    enum { B = 2, T = 10 };
    const int32_t ids[B * T] = {5, 5, 5, 7, 7, 9, 10, 10, 10, 10, /* */
                                -3, 0, 0, 0, 0, 0, 0, 0, 0, 2};
    const int32_t want_s[B * T] = {0, 0, 0, 3, 3, 5, 6, 6, 6, 6, /* */
                                   0, 1, 1, 1, 1, 1, 1, 1, 1, 9};
    int32_t got[B * T], pos[B * T];
    rt_assert_ok(sbprt_doc_starts(ctx, got, ids, B, T));
    assert_memory_equal(got, want_s, sizeof got);
    rt_assert_ok(sbprt_doc_positions(ctx, pos, ids, B, T));
    for (int e = 0; e < B * T; e++)
        assert_int_equal(pos[e], e % T - want_s[e]);
    /* the starts feed the packed attention as they are */
    float x[T * 8], o[T * 8], l[T];
    rt_rng r = {170};
    rt_fill(&r, x, T * 8, -1, 1);
    rt_assert_ok(sbprt_attention_forward_packed(ctx, o, l, x, x, x, got, 1, T, T, 1, 1, 8, 0, 1.0f,
                                                0, 0));
    /* a decreasing id: SBPRT_ERR_RANGE, nothing written */
    int32_t dec[B * T];
    memcpy(dec, ids, sizeof dec);
    dec[17] = -1;
    memset(got, 0x55, sizeof got);
    int32_t untouched[B * T];
    memcpy(untouched, got, sizeof got);
    assert_int_equal(sbprt_doc_starts(ctx, got, dec, B, T), SBPRT_ERR_RANGE);
    assert_int_equal(sbprt_doc_positions(ctx, got, dec, B, T), SBPRT_ERR_RANGE);
    assert_memory_equal(got, untouched, sizeof got);
    /* a new row may start with a smaller id; sizes 0 are no-ops; bad arguments */
    rt_assert_ok(sbprt_doc_starts(ctx, got, ids + T, 1, T));
    rt_assert_ok(sbprt_doc_starts(ctx, NULL, NULL, 0, T));
    rt_assert_ok(sbprt_doc_positions(ctx, NULL, NULL, B, 0));
    assert_int_equal(sbprt_doc_starts(ctx, NULL, ids, B, T), SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_doc_positions(ctx, pos, ids, -1, T), SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_doc_starts(NULL, got, ids, B, T), SBPRT_ERR_INVALID);
    sbprt_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_several_documents),
        cmocka_unit_test(test_gqa_mqa),
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_chunk_after_document_start),
        cmocka_unit_test(test_window_with_documents),
        cmocka_unit_test(test_softcap_with_documents),
        cmocka_unit_test(test_one_document_equals_ex),
        cmocka_unit_test(test_chunked_equals_full),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_bad_doc_start),
        cmocka_unit_test(test_doc_starts_positions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
