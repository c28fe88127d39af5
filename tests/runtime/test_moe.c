/*
 * test_moe.c — the Mixture-of-Experts kernels (sbprt_moe_forward / sbprt_moe_backward)
 * against a dense double reference written here: every expert's SwiGLU FFN on every row,
 * the softmax router, its top-k (ties to the lower index) and the renormalisation, and the
 * backward derived by hand from those formulas (the renormalisation as the Jacobian of v / Σv,
 * the softmax as its full Jacobian), so no expected value comes from the kernel's sparse
 * algorithm.  A few entries of every gradient are also checked against central finite
 * differences of the double forward's loss Σ dy·y + aux_scale Σ_i c_i P_i (c fixed).
 *
 * Besides the cases (k = 1, 2, e; norm_topk 0 and 1; an expert no row selects; equal router
 * logits; stats NULL or given; the aux term), it checks: NULL gradient outputs, accumulation,
 * that forward outputs are overwritten, the routing-only forward (y NULL), that the
 * unselected expert's weights are never read (NaN there changes nothing), that the kernels
 * stay inside sbprt_moe_scratch_floats and need nothing from its previous contents, bitwise
 * equality across thread counts, and the error statuses.
 */
#include <stdio.h>

#include "rt_test.h"

enum { KMAX = 16, GUARD = 256 };
#define GUARD_VALUE (-7777.0f)

/* One configuration. empty: an expert that no row selects (>= 0), or -1; tie: two experts
 * whose router rows are equal (so their logits are), or 0. */
typedef struct {
    int n, d, e, k, f, norm;
    int empty, tie, stats;
    float aux;
    const char *name;
} moe_case;

/* The inputs, in fp32 (what the kernel gets) and double (what the reference gets). */
typedef struct {
    float *x, *wr, *w1, *w2, *dy;
} moe_inputs;

static size_t sz_x(const moe_case *c) { return (size_t)c->n * c->d; }
static size_t sz_wr(const moe_case *c) { return (size_t)c->e * c->d; }
static size_t sz_w1(const moe_case *c) { return (size_t)c->e * 2 * c->f * c->d; }
static size_t sz_w2(const moe_case *c) { return (size_t)c->e * c->d * c->f; }

static moe_inputs make_inputs(const moe_case *c, uint64_t seed)
{
    rt_rng r = {seed};
    moe_inputs in;
    /* all-positive rows when an expert is starved: its router row is then a negative constant
     * and its logit far below every other */
    in.x = c->empty >= 0 ? rt_random(&r, sz_x(c), 0.25f, 1.0f) : rt_random(&r, sz_x(c), -1, 1);
    in.wr = rt_random(&r, sz_wr(c), -0.5f, 0.5f);
    float s1 = 1.5f / sqrtf((float)c->d), s2 = 1.5f / sqrtf((float)c->f);
    in.w1 = rt_random(&r, sz_w1(c), -s1, s1);
    in.w2 = rt_random(&r, sz_w2(c), -s2, s2);
    in.dy = rt_random(&r, sz_x(c), -1, 1);
    if (c->empty >= 0)
        for (int t = 0; t < c->d; t++)
            in.wr[(size_t)c->empty * c->d + t] = -4.0f;
    if (c->tie) /* expert 1 twice as strong (often on top), expert e-1 its copy */
        for (int t = 0; t < c->d; t++) {
            in.wr[(size_t)1 * c->d + t] *= 2.0f;
            in.wr[(size_t)(c->e - 1) * c->d + t] = in.wr[(size_t)1 * c->d + t];
        }
    return in;
}

static void free_inputs(moe_inputs *in)
{
    free(in->x), free(in->wr), free(in->w1), free(in->w2), free(in->dy);
}

/* ---- dense double reference ---------------------------------------------------------- */

typedef struct {
    int n, d, e, k, f, norm;
    double aux;          /* aux_scale */
    const double *cstat; /* [e] the counts c_i of the aux term, or NULL */
    double *x, *wr, *w1, *w2, *dy;
    /* forward results: y [n, d], p [n, e], sel [n, k], wts [n, k]; every expert on every
     * row: h [n, e, 2f], a [n, e, f], ye [n, e, d] */
    double *y, *p, *wts, *h, *a, *ye;
    int *sel;
} ref_moe;

static double ref_sigmoid(double v) { return 1 / (1 + exp(-v)); }

static void ref_alloc(ref_moe *m, const moe_case *c, const moe_inputs *in)
{
    memset(m, 0, sizeof *m);
    m->n = c->n, m->d = c->d, m->e = c->e, m->k = c->k, m->f = c->f, m->norm = c->norm;
    m->x = rt_to_double(in->x, sz_x(c)), m->wr = rt_to_double(in->wr, sz_wr(c));
    m->w1 = rt_to_double(in->w1, sz_w1(c)), m->w2 = rt_to_double(in->w2, sz_w2(c));
    m->dy = rt_to_double(in->dy, sz_x(c));
    size_t ne = (size_t)c->n * c->e;
    m->y = RT_NEW(double, sz_x(c)), m->p = RT_NEW(double, ne);
    m->wts = RT_NEW(double, (size_t)c->n * c->k), m->sel = RT_NEW(int, (size_t)c->n * c->k);
    m->h = RT_NEW(double, ne * 2 * c->f), m->a = RT_NEW(double, ne * c->f);
    m->ye = RT_NEW(double, ne * c->d);
}

static void ref_free(ref_moe *m)
{
    free(m->x), free(m->wr), free(m->w1), free(m->w2), free(m->dy), free(m->y), free(m->p);
    free(m->wts), free(m->sel), free(m->h), free(m->a), free(m->ye);
}

static void ref_forward(ref_moe *m)
{
    const int n = m->n, d = m->d, e = m->e, k = m->k, f = m->f;
    for (int r = 0; r < n; r++) {
        const double *xr = m->x + (size_t)r * d;
        double *pr = m->p + (size_t)r * e;
        double mx = -INFINITY;
        for (int i = 0; i < e; i++) {
            double z = 0;
            for (int t = 0; t < d; t++)
                z += xr[t] * m->wr[(size_t)i * d + t];
            pr[i] = z;
            mx = z > mx ? z : mx;
        }
        double s = 0;
        for (int i = 0; i < e; i++)
            s += (pr[i] = exp(pr[i] - mx));
        for (int i = 0; i < e; i++)
            pr[i] /= s;
        /* top-k by selection: the largest not yet taken, the lower index on equal values */
        int taken[64] = {0};
        double vs = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int i = 0; i < e; i++)
                if (!taken[i] && (best < 0 || pr[i] > pr[best]))
                    best = i;
            taken[best] = 1;
            m->sel[(size_t)r * k + j] = best;
            vs += pr[best];
        }
        for (int j = 0; j < k; j++) {
            double v = pr[m->sel[(size_t)r * k + j]];
            m->wts[(size_t)r * k + j] = m->norm ? v / vs : v;
        }
        /* every expert, dense */
        for (int i = 0; i < e; i++) {
            double *h = m->h + ((size_t)r * e + i) * 2 * f, *a = m->a + ((size_t)r * e + i) * f;
            double *ye = m->ye + ((size_t)r * e + i) * d;
            for (int o = 0; o < 2 * f; o++) {
                double s2 = 0;
                for (int t = 0; t < d; t++)
                    s2 += m->w1[((size_t)i * 2 * f + o) * d + t] * xr[t];
                h[o] = s2;
            }
            for (int t = 0; t < f; t++)
                a[t] = h[t] * ref_sigmoid(h[t]) * h[f + t];
            for (int o = 0; o < d; o++) {
                double s2 = 0;
                for (int t = 0; t < f; t++)
                    s2 += m->w2[((size_t)i * d + o) * f + t] * a[t];
                ye[o] = s2;
            }
        }
        double *yr = m->y + (size_t)r * d;
        for (int o = 0; o < d; o++) {
            double s2 = 0;
            for (int j = 0; j < k; j++)
                s2 += m->wts[(size_t)r * k + j] *
                      m->ye[((size_t)r * e + m->sel[(size_t)r * k + j]) * d + o];
            yr[o] = s2;
        }
    }
}

/* The scalar whose gradient the backward computes: Σ dy·y + aux Σ_i c_i Σ_r p[r, i]. */
static double ref_loss(void *st)
{
    ref_moe *m = st;
    ref_forward(m);
    double L = 0;
    for (size_t i = 0; i < (size_t)m->n * m->d; i++)
        L += m->dy[i] * m->y[i];
    if (m->cstat)
        for (int r = 0; r < m->n; r++)
            for (int i = 0; i < m->e; i++)
                L += m->aux * m->cstat[i] * m->p[(size_t)r * m->e + i];
    return L;
}

/* The gradients of ref_loss, written (not accumulated): dx [n, d], dwr [e, d],
 * dw1 [e, 2f, d], dw2 [e, d, f].  Runs ref_forward first. */
static void ref_backward(ref_moe *m, double *dx, double *dwr, double *dw1, double *dw2)
{
    const int n = m->n, d = m->d, e = m->e, k = m->k, f = m->f;
    ref_forward(m);
    memset(dx, 0, (size_t)n * d * sizeof(double));
    memset(dwr, 0, (size_t)e * d * sizeof(double));
    memset(dw1, 0, (size_t)e * 2 * f * d * sizeof(double));
    memset(dw2, 0, (size_t)e * d * f * sizeof(double));
    double *dye = RT_NEW(double, d), *da = RT_NEW(double, f), *dh = RT_NEW(double, 2 * f);
    double *dp = RT_NEW(double, e), *dz = RT_NEW(double, e);
    for (int r = 0; r < n; r++) {
        const double *xr = m->x + (size_t)r * d, *dyr = m->dy + (size_t)r * d;
        const double *pr = m->p + (size_t)r * e;
        const int *sr = m->sel + (size_t)r * k;
        const double *wr_ = m->wts + (size_t)r * k;
        double dwv[KMAX], dv[KMAX];
        for (int j = 0; j < k; j++) {
            const int i = sr[j];
            const double *ye = m->ye + ((size_t)r * e + i) * d;
            const double *a = m->a + ((size_t)r * e + i) * f;
            const double *h = m->h + ((size_t)r * e + i) * 2 * f;
            dwv[j] = 0;
            for (int o = 0; o < d; o++)
                dwv[j] += dyr[o] * ye[o];
            for (int o = 0; o < d; o++)
                dye[o] = wr_[j] * dyr[o];
            for (int o = 0; o < d; o++)
                for (int t = 0; t < f; t++)
                    dw2[((size_t)i * d + o) * f + t] += dye[o] * a[t];
            for (int t = 0; t < f; t++) {
                da[t] = 0;
                for (int o = 0; o < d; o++)
                    da[t] += m->w2[((size_t)i * d + o) * f + t] * dye[o];
                double g = h[t], u = h[f + t], sg = ref_sigmoid(g);
                dh[t] = da[t] * u * (sg + g * sg * (1 - sg)); /* d(g σ(g))/dg */
                dh[f + t] = da[t] * g * sg;
            }
            for (int o = 0; o < 2 * f; o++)
                for (int t = 0; t < d; t++) {
                    dw1[((size_t)i * 2 * f + o) * d + t] += dh[o] * xr[t];
                    dx[(size_t)r * d + t] += m->w1[((size_t)i * 2 * f + o) * d + t] * dh[o];
                }
        }
        /* w_j = v_j / s: ∂w_j/∂v_l = δ_jl / s − v_j / s² */
        double s = 0;
        for (int j = 0; j < k; j++)
            s += pr[sr[j]];
        for (int l = 0; l < k; l++) {
            if (!m->norm) {
                dv[l] = dwv[l];
                continue;
            }
            dv[l] = 0;
            for (int j = 0; j < k; j++)
                dv[l] += dwv[j] * ((j == l ? 1 / s : 0) - pr[sr[j]] / (s * s));
        }
        for (int i = 0; i < e; i++)
            dp[i] = m->cstat ? m->aux * m->cstat[i] : 0;
        for (int j = 0; j < k; j++)
            dp[sr[j]] += dv[j];
        /* ∂p_l/∂z_i = p_l (δ_li − p_i) */
        for (int i = 0; i < e; i++) {
            dz[i] = 0;
            for (int l = 0; l < e; l++)
                dz[i] += dp[l] * pr[l] * ((l == i ? 1 : 0) - pr[i]);
        }
        for (int i = 0; i < e; i++)
            for (int t = 0; t < d; t++) {
                dwr[(size_t)i * d + t] += dz[i] * xr[t];
                dx[(size_t)r * d + t] += m->wr[(size_t)i * d + t] * dz[i];
            }
    }
    free(dye), free(da), free(dh), free(dp), free(dz);
}

/* ---- kernel harness ------------------------------------------------------------------ */

/* Scratch of exactly sbprt_moe_scratch_floats floats, filled with NaN (a kernel that reads a
 * temporary before writing it shows), then GUARD floats of GUARD_VALUE behind it. */
static float *scratch_new(const moe_case *c, size_t *floats)
{
    *floats = sbprt_moe_scratch_floats(c->n, c->d, c->e, c->k, c->f);
    float *s = RT_NEW(float, *floats + GUARD);
    for (size_t i = 0; i < *floats; i++)
        s[i] = NAN;
    for (size_t i = 0; i < GUARD; i++)
        s[*floats + i] = GUARD_VALUE;
    return s;
}

static void scratch_check(const float *s, size_t floats)
{
    for (size_t i = 0; i < GUARD; i++)
        assert_true(s[floats + i] == GUARD_VALUE);
}

/* What one forward + backward of the kernels produced. */
typedef struct {
    float *y, *probs, *wts, *stats, *dx, *dwr, *dw1, *dw2;
    int32_t *sel;
} moe_outputs;

static moe_outputs outputs_new(const moe_case *c, rt_rng *r)
{
    moe_outputs o;
    o.y = rt_random(r, sz_x(c), -9, 9); /* garbage: the forward writes */
    o.probs = rt_random(r, (size_t)c->n * c->e, -9, 9);
    o.wts = rt_random(r, (size_t)c->n * c->k, -9, 9);
    o.sel = RT_NEW(int32_t, (size_t)c->n * c->k);
    for (size_t i = 0; i < (size_t)c->n * c->k; i++)
        o.sel[i] = -5;
    o.stats = RT_NEW(float, 2 * (size_t)c->e);
    for (int i = 0; i < c->e; i++) /* accumulated into: start from exact nonzero values */
        o.stats[i] = 2.0f * (float)(i + 1), o.stats[c->e + i] = 0.25f * (float)i;
    o.dx = rt_random(r, sz_x(c), -1, 1), o.dwr = rt_random(r, sz_wr(c), -1, 1);
    o.dw1 = rt_random(r, sz_w1(c), -1, 1), o.dw2 = rt_random(r, sz_w2(c), -1, 1);
    return o;
}

static moe_outputs outputs_copy(const moe_case *c, const moe_outputs *a)
{
    moe_outputs o;
    o.y = rt_copy(a->y, sz_x(c)), o.probs = rt_copy(a->probs, (size_t)c->n * c->e);
    o.wts = rt_copy(a->wts, (size_t)c->n * c->k);
    o.sel = RT_NEW(int32_t, (size_t)c->n * c->k);
    memcpy(o.sel, a->sel, (size_t)c->n * c->k * sizeof(int32_t));
    o.stats = rt_copy(a->stats, 2 * (size_t)c->e);
    o.dx = rt_copy(a->dx, sz_x(c)), o.dwr = rt_copy(a->dwr, sz_wr(c));
    o.dw1 = rt_copy(a->dw1, sz_w1(c)), o.dw2 = rt_copy(a->dw2, sz_w2(c));
    return o;
}

static void outputs_free(moe_outputs *o)
{
    free(o->y), free(o->probs), free(o->wts), free(o->sel), free(o->stats);
    free(o->dx), free(o->dwr), free(o->dw1), free(o->dw2);
}

static void assert_outputs_equal(const moe_case *c, const moe_outputs *a, const moe_outputs *b)
{
    assert_memory_equal(a->y, b->y, sz_x(c) * sizeof(float));
    assert_memory_equal(a->probs, b->probs, (size_t)c->n * c->e * sizeof(float));
    assert_memory_equal(a->wts, b->wts, (size_t)c->n * c->k * sizeof(float));
    assert_memory_equal(a->sel, b->sel, (size_t)c->n * c->k * sizeof(int32_t));
    assert_memory_equal(a->stats, b->stats, 2 * (size_t)c->e * sizeof(float));
    assert_memory_equal(a->dx, b->dx, sz_x(c) * sizeof(float));
    assert_memory_equal(a->dwr, b->dwr, sz_wr(c) * sizeof(float));
    assert_memory_equal(a->dw1, b->dw1, sz_w1(c) * sizeof(float));
    assert_memory_equal(a->dw2, b->dw2, sz_w2(c) * sizeof(float));
}

static void run_forward(sbprt_ctx *ctx, const moe_case *c, const moe_inputs *in, moe_outputs *o)
{
    size_t floats;
    float *s = scratch_new(c, &floats);
    rt_assert_ok(sbprt_moe_forward(ctx, o->y, o->probs, o->sel, o->wts, c->stats ? o->stats : NULL,
                                   in->x, in->wr, in->w1, in->w2, s, c->n, c->d, c->e, c->k, c->f,
                                   c->norm));
    scratch_check(s, floats);
    free(s);
}

/* The backward into the gradients that are not NULL. */
static void run_backward(sbprt_ctx *ctx, const moe_case *c, const moe_inputs *in,
                         const moe_outputs *o, float *dx, float *dwr, float *dw1, float *dw2)
{
    size_t floats;
    float *s = scratch_new(c, &floats);
    rt_assert_ok(sbprt_moe_backward(ctx, dx, dwr, dw1, dw2, in->dy, in->x, in->wr, in->w1, in->w2,
                                    o->probs, o->sel, o->wts, c->stats ? o->stats : NULL, s, c->n,
                                    c->d, c->e, c->k, c->f, c->norm, c->aux));
    scratch_check(s, floats);
    free(s);
}

/* ---- the cases against the reference -------------------------------------------------- */

static const moe_case cases[] = {
    {37, 16, 4, 1, 12, 0, -1, 0, 1, 0.0f, "k=1"},
    {37, 16, 4, 1, 12, 1, -1, 0, 1, 0.02f, "k=1 norm aux"},
    {37, 16, 4, 2, 12, 1, -1, 0, 1, 0.02f, "k=2 norm aux"},
    {37, 16, 4, 2, 12, 0, -1, 0, 0, 0.02f, "k=2 no stats"},
    {29, 16, 4, 4, 12, 1, -1, 0, 1, 0.01f, "k=e norm aux"},
    {29, 16, 4, 4, 12, 0, -1, 0, 0, 0.0f, "k=e no stats"},
    {41, 12, 6, 2, 10, 1, 2, 0, 1, 0.02f, "empty expert norm aux"},
    {41, 12, 6, 3, 10, 0, 4, 0, 1, 0.0f, "empty expert k=3"},
    {43, 16, 8, 3, 8, 1, -1, 1, 1, 0.01f, "tie norm aux"},
    {43, 16, 8, 3, 8, 0, -1, 1, 0, 0.0f, "tie no stats"},
};
#define NCASES (sizeof cases / sizeof cases[0])

/* The finite differences perturb wr too, except in a tie case, where a step in the tied
 * experts' router rows breaks the tie and may flip the selection (a discontinuity). */
enum { FD_POINTS = 24 };

static void check_case(const moe_case *c, uint64_t seed)
{
    char what[96];
    sbprt_ctx *ctx = rt_ctx(2);
    moe_inputs in = make_inputs(c, seed);
    rt_rng r = {seed + 1000};
    moe_outputs o = outputs_new(c, &r), o0 = outputs_copy(c, &o);
    run_forward(ctx, c, &in, &o);

    ref_moe m;
    ref_alloc(&m, c, &in);
    ref_forward(&m);
    const size_t nk = (size_t)c->n * c->k;
    for (size_t q = 0; q < nk; q++)
        assert_int_equal(o.sel[q], m.sel[q]);
    snprintf(what, sizeof what, "%s y", c->name);
    rt_assert_err(rt_rel_err(o.y, m.y, sz_x(c)), RT_TOL, what);
    snprintf(what, sizeof what, "%s probs", c->name);
    rt_assert_err(rt_rel_err(o.probs, m.p, (size_t)c->n * c->e), RT_TOL, what);
    snprintf(what, sizeof what, "%s wts", c->name);
    rt_assert_err(rt_rel_err(o.wts, m.wts, nk), RT_TOL, what);

    /* stats: exact counts added to the exact starting values; probability sums */
    double *count = RT_NEW(double, c->e), *psum = RT_NEW(double, c->e);
    for (int i = 0; i < c->e; i++) {
        count[i] = 0, psum[i] = 0;
        for (int rr = 0; rr < c->n; rr++)
            psum[i] += m.p[(size_t)rr * c->e + i];
    }
    for (size_t q = 0; q < nk; q++)
        count[m.sel[q]] += 1;
    if (c->stats) {
        for (int i = 0; i < c->e; i++)
            assert_true(o.stats[i] == o0.stats[i] + (float)count[i]);
        snprintf(what, sizeof what, "%s stats P", c->name);
        rt_assert_err(rt_rel_err_delta(o.stats + c->e, o0.stats + c->e, psum, c->e), RT_TOL, what);
    } else {
        assert_memory_equal(o.stats, o0.stats, 2 * (size_t)c->e * sizeof(float));
    }
    if (c->empty >= 0)
        assert_true(count[c->empty] == 0);
    if (c->tie) { /* the tied pair is often both selected, and then the lower index first */
        int both = 0;
        for (int rr = 0; rr < c->n; rr++) {
            int j1 = -1, j2 = -1;
            for (int j = 0; j < c->k; j++) {
                j1 = o.sel[(size_t)rr * c->k + j] == 1 ? j : j1;
                j2 = o.sel[(size_t)rr * c->k + j] == c->e - 1 ? j : j2;
            }
            if (j1 >= 0 && j2 >= 0) {
                assert_true(j1 < j2);
                assert_true(o.probs[(size_t)rr * c->e + 1] == o.probs[(size_t)rr * c->e + c->e - 1]);
                both++;
            }
        }
        assert_true(both >= 3);
    }

    /* backward: the increments of pre-filled gradients */
    run_backward(ctx, c, &in, &o, o.dx, o.dwr, o.dw1, o.dw2);
    double *cstat = c->stats ? rt_to_double(o.stats, c->e) : NULL;
    m.aux = c->aux, m.cstat = cstat;
    double *gx = RT_NEW(double, sz_x(c)), *gwr = RT_NEW(double, sz_wr(c));
    double *gw1 = RT_NEW(double, sz_w1(c)), *gw2 = RT_NEW(double, sz_w2(c));
    ref_backward(&m, gx, gwr, gw1, gw2);
    snprintf(what, sizeof what, "%s dx", c->name);
    rt_assert_err(rt_rel_err_delta(o.dx, o0.dx, gx, sz_x(c)), RT_TOL, what);
    snprintf(what, sizeof what, "%s dwr", c->name);
    rt_assert_err(rt_rel_err_delta(o.dwr, o0.dwr, gwr, sz_wr(c)), RT_TOL, what);
    snprintf(what, sizeof what, "%s dw1", c->name);
    rt_assert_err(rt_rel_err_delta(o.dw1, o0.dw1, gw1, sz_w1(c)), RT_TOL, what);
    snprintf(what, sizeof what, "%s dw2", c->name);
    rt_assert_err(rt_rel_err_delta(o.dw2, o0.dw2, gw2, sz_w2(c)), RT_TOL, what);
    if (c->empty >= 0) { /* nothing flows into the starved expert's weights */
        size_t o1 = (size_t)c->empty * 2 * c->f * c->d, o2 = (size_t)c->empty * c->d * c->f;
        assert_memory_equal(o.dw1 + o1, o0.dw1 + o1, 2 * (size_t)c->f * c->d * sizeof(float));
        assert_memory_equal(o.dw2 + o2, o0.dw2 + o2, (size_t)c->d * c->f * sizeof(float));
    }

    /* finite differences of the double loss, a few entries of each gradient */
    snprintf(what, sizeof what, "%s dx fd", c->name);
    rt_assert_err(rt_fd_check(ref_loss, NULL, &m, m.x, sz_x(c), o.dx, o0.dx, FD_POINTS), RT_TOL,
                  what);
    if (!c->tie) {
        snprintf(what, sizeof what, "%s dwr fd", c->name);
        rt_assert_err(rt_fd_check(ref_loss, NULL, &m, m.wr, sz_wr(c), o.dwr, o0.dwr, FD_POINTS),
                      RT_TOL, what);
    }
    snprintf(what, sizeof what, "%s dw1 fd", c->name);
    rt_assert_err(rt_fd_check(ref_loss, NULL, &m, m.w1, sz_w1(c), o.dw1, o0.dw1, FD_POINTS),
                  RT_TOL, what);
    snprintf(what, sizeof what, "%s dw2 fd", c->name);
    rt_assert_err(rt_fd_check(ref_loss, NULL, &m, m.w2, sz_w2(c), o.dw2, o0.dw2, FD_POINTS),
                  RT_TOL, what);

    free(count), free(psum), free(cstat), free(gx), free(gwr), free(gw1), free(gw2);
    ref_free(&m);
    outputs_free(&o), outputs_free(&o0);
    free_inputs(&in);
    sbprt_ctx_destroy(ctx);
}

static void test_moe_reference(void **state)
{
    (void)state;
    for (size_t i = 0; i < NCASES; i++)
        check_case(&cases[i], 100 + i);
}

/* ---- properties ---------------------------------------------------------------------- */

/* y NULL, the routing alone (a recomputation before the backward): the same probs, sel, wts
 * and stats bits as the full forward, the experts' weights unread (NULL), and a backward after
 * it the same gradient bits as after the full forward. */
static void test_moe_routing_only(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < NCASES; ci++) {
        const moe_case *c = &cases[ci];
        sbprt_ctx *ctx = rt_ctx(2);
        moe_inputs in = make_inputs(c, 300 + ci);
        rt_rng r = {400 + ci};
        moe_outputs full = outputs_new(c, &r), part = outputs_copy(c, &full);
        float *y0 = rt_copy(part.y, sz_x(c));
        run_forward(ctx, c, &in, &full);
        size_t floats;
        float *s = scratch_new(c, &floats);
        rt_assert_ok(sbprt_moe_forward(ctx, NULL, part.probs, part.sel, part.wts,
                                       c->stats ? part.stats : NULL, in.x, in.wr, NULL, NULL, s,
                                       c->n, c->d, c->e, c->k, c->f, c->norm));
        scratch_check(s, floats);
        free(s);
        assert_memory_equal(part.y, y0, sz_x(c) * sizeof(float));
        memcpy(part.y, full.y, sz_x(c) * sizeof(float));
        run_backward(ctx, c, &in, &full, full.dx, full.dwr, full.dw1, full.dw2);
        run_backward(ctx, c, &in, &part, part.dx, part.dwr, part.dw1, part.dw2);
        assert_outputs_equal(c, &full, &part);
        free(y0);
        outputs_free(&full), outputs_free(&part);
        free_inputs(&in);
        sbprt_ctx_destroy(ctx);
    }
}

/* NULL gradient outputs are skipped, and the others get the same bits as in a full call. */
static void test_moe_null_grads(void **state)
{
    (void)state;
    const moe_case *c = &cases[2]; /* k=2 norm aux */
    sbprt_ctx *ctx = rt_ctx(2);
    moe_inputs in = make_inputs(c, 7);
    rt_rng r = {8};
    moe_outputs full = outputs_new(c, &r);
    run_forward(ctx, c, &in, &full);
    moe_outputs before = outputs_copy(c, &full);
    run_backward(ctx, c, &in, &full, full.dx, full.dwr, full.dw1, full.dw2);
    for (int mask = 0; mask < 16; mask++) {
        moe_outputs o = outputs_copy(c, &before);
        run_backward(ctx, c, &in, &o, mask & 1 ? o.dx : NULL, mask & 2 ? o.dwr : NULL,
                     mask & 4 ? o.dw1 : NULL, mask & 8 ? o.dw2 : NULL);
        const moe_outputs *want_dx = mask & 1 ? &full : &before, *want_dwr = mask & 2 ? &full : &before;
        const moe_outputs *want_dw1 = mask & 4 ? &full : &before, *want_dw2 = mask & 8 ? &full : &before;
        assert_memory_equal(o.dx, want_dx->dx, sz_x(c) * sizeof(float));
        assert_memory_equal(o.dwr, want_dwr->dwr, sz_wr(c) * sizeof(float));
        assert_memory_equal(o.dw1, want_dw1->dw1, sz_w1(c) * sizeof(float));
        assert_memory_equal(o.dw2, want_dw2->dw2, sz_w2(c) * sizeof(float));
        outputs_free(&o);
    }
    outputs_free(&full), outputs_free(&before);
    free_inputs(&in);
    sbprt_ctx_destroy(ctx);
}

/* Two backward calls add twice the gradient; the forward overwrites whatever its outputs
 * held (the same bits from any starting contents). */
static void test_moe_accumulate(void **state)
{
    (void)state;
    const moe_case *c = &cases[6]; /* empty expert norm aux */
    sbprt_ctx *ctx = rt_ctx(2);
    moe_inputs in = make_inputs(c, 21);
    rt_rng r = {22};
    moe_outputs o = outputs_new(c, &r);
    run_forward(ctx, c, &in, &o);
    moe_outputs other = outputs_new(c, &r); /* other garbage in the forward outputs */
    memcpy(other.stats, o.stats, 2 * (size_t)c->e * sizeof(float));
    for (int i = 0; i < 2 * c->e; i++) /* undo o's accumulation so the stats compare */
        other.stats[i] = i < c->e ? 2.0f * (float)(i + 1) : 0.25f * (float)(i - c->e);
    run_forward(ctx, c, &in, &other);
    assert_memory_equal(o.y, other.y, sz_x(c) * sizeof(float));
    assert_memory_equal(o.probs, other.probs, (size_t)c->n * c->e * sizeof(float));
    assert_memory_equal(o.wts, other.wts, (size_t)c->n * c->k * sizeof(float));
    assert_memory_equal(o.sel, other.sel, (size_t)c->n * c->k * sizeof(int32_t));
    assert_memory_equal(o.stats, other.stats, 2 * (size_t)c->e * sizeof(float));

    moe_outputs o0 = outputs_copy(c, &o);
    run_backward(ctx, c, &in, &o, o.dx, o.dwr, o.dw1, o.dw2);
    run_backward(ctx, c, &in, &o, o.dx, o.dwr, o.dw1, o.dw2);
    ref_moe m;
    ref_alloc(&m, c, &in);
    double *cstat = rt_to_double(o.stats, c->e);
    m.aux = c->aux, m.cstat = cstat;
    double *gx = RT_NEW(double, sz_x(c)), *gwr = RT_NEW(double, sz_wr(c));
    double *gw1 = RT_NEW(double, sz_w1(c)), *gw2 = RT_NEW(double, sz_w2(c));
    ref_backward(&m, gx, gwr, gw1, gw2);
    for (size_t i = 0; i < sz_x(c); i++)
        gx[i] *= 2;
    for (size_t i = 0; i < sz_wr(c); i++)
        gwr[i] *= 2;
    for (size_t i = 0; i < sz_w1(c); i++)
        gw1[i] *= 2;
    for (size_t i = 0; i < sz_w2(c); i++)
        gw2[i] *= 2;
    rt_assert_err(rt_rel_err_delta(o.dx, o0.dx, gx, sz_x(c)), RT_TOL, "twice dx");
    rt_assert_err(rt_rel_err_delta(o.dwr, o0.dwr, gwr, sz_wr(c)), RT_TOL, "twice dwr");
    rt_assert_err(rt_rel_err_delta(o.dw1, o0.dw1, gw1, sz_w1(c)), RT_TOL, "twice dw1");
    rt_assert_err(rt_rel_err_delta(o.dw2, o0.dw2, gw2, sz_w2(c)), RT_TOL, "twice dw2");
    free(cstat), free(gx), free(gwr), free(gw1), free(gw2);
    ref_free(&m);
    outputs_free(&o), outputs_free(&o0), outputs_free(&other);
    free_inputs(&in);
    sbprt_ctx_destroy(ctx);
}

/* The kernels are sparse: an expert that no row selects is never computed, so NaN weights
 * there change no output bit (a dense product weighted by 0 would give NaN). */
static void test_moe_unselected_expert_unread(void **state)
{
    (void)state;
    const moe_case *c = &cases[6];
    sbprt_ctx *ctx = rt_ctx(2);
    moe_inputs in = make_inputs(c, 31), bad = make_inputs(c, 31);
    for (size_t i = 0; i < 2 * (size_t)c->f * c->d; i++)
        bad.w1[(size_t)c->empty * 2 * c->f * c->d + i] = NAN;
    for (size_t i = 0; i < (size_t)c->d * c->f; i++)
        bad.w2[(size_t)c->empty * c->d * c->f + i] = NAN;
    rt_rng r = {32};
    moe_outputs a = outputs_new(c, &r), b = outputs_copy(c, &a);
    run_forward(ctx, c, &in, &a);
    run_forward(ctx, c, &bad, &b);
    run_backward(ctx, c, &in, &a, a.dx, a.dwr, a.dw1, a.dw2);
    run_backward(ctx, c, &bad, &b, b.dx, b.dwr, b.dw1, b.dw2);
    assert_outputs_equal(c, &a, &b);
    outputs_free(&a), outputs_free(&b);
    free_inputs(&in), free_inputs(&bad);
    sbprt_ctx_destroy(ctx);
}

/* Bitwise the same for 1, 2 and 3 threads.  The sizes make every loop of the kernels fork
 * (n e = 16384, n k d = n k f = 16384, the parallel threshold) while each GEMM stays below
 * gemm.c's single-thread size (2^18 multiply-adds): the GEMMs alone may depend on the thread
 * count (sbprt.h), the rest must not. */
static void test_moe_threads(void **state)
{
    (void)state;
    const moe_case c = {256, 8, 64, 8, 8, 1, -1, 0, 1, 1e-3f, "threads"};
    moe_inputs in = make_inputs(&c, 41);
    rt_rng r = {42};
    moe_outputs first = outputs_new(&c, &r), start = outputs_copy(&c, &first);
    const int threads[] = {1, 2, 3};
    for (int t = 0; t < 3; t++) {
        sbprt_ctx *ctx = rt_ctx(threads[t]);
        moe_outputs o = outputs_copy(&c, &start);
        run_forward(ctx, &c, &in, &o);
        run_backward(ctx, &c, &in, &o, o.dx, o.dwr, o.dw1, o.dw2);
        if (t == 0) {
            outputs_free(&first);
            first = o;
        } else {
            assert_outputs_equal(&c, &first, &o);
            outputs_free(&o);
        }
        sbprt_ctx_destroy(ctx);
    }
    outputs_free(&first), outputs_free(&start);
    free_inputs(&in);
}

/* Bad sizes and NULL tensors: SBPRT_ERR_INVALID with nothing written; a sel value out of
 * range: SBPRT_ERR_RANGE with nothing written; n == 0: a no-op. */
static void test_moe_errors(void **state)
{
    (void)state;
    const moe_case *c = &cases[2];
    const int n = c->n, d = c->d, e = c->e, k = c->k, f = c->f;
    sbprt_ctx *ctx = rt_ctx(2);
    moe_inputs in = make_inputs(c, 51);
    rt_rng r = {52};
    moe_outputs o = outputs_new(c, &r), o0 = outputs_copy(c, &o);
    size_t floats;
    float *s = scratch_new(c, &floats);
    struct {
        int n, d, e, k, f;
    } bad[] = {{n, d, e, e + 1, f}, {n, d, e, 0, f}, {-1, d, e, k, f}, {n, 0, e, k, f},
               {n, d, 0, k, f},     {n, d, e, k, 0}, {n, -3, e, k, f}, {n, d, e, k, -1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(sbprt_moe_forward(ctx, o.y, o.probs, o.sel, o.wts, o.stats, in.x, in.wr,
                                           in.w1, in.w2, s, bad[i].n, bad[i].d, bad[i].e,
                                           bad[i].k, bad[i].f, 1),
                         SBPRT_ERR_INVALID);
        assert_int_equal(sbprt_moe_backward(ctx, o.dx, o.dwr, o.dw1, o.dw2, in.dy, in.x, in.wr,
                                            in.w1, in.w2, o.probs, o.sel, o.wts, o.stats, s,
                                            bad[i].n, bad[i].d, bad[i].e, bad[i].k, bad[i].f, 1,
                                            0.1f),
                         SBPRT_ERR_INVALID);
    }
    /* NULL required tensors */
    assert_int_equal(sbprt_moe_forward(ctx, o.y, o.probs, o.sel, o.wts, o.stats, NULL, in.wr,
                                       in.w1, in.w2, s, n, d, e, k, f, 1),
                     SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_moe_forward(ctx, o.y, o.probs, o.sel, o.wts, o.stats, in.x, in.wr,
                                       in.w1, in.w2, NULL, n, d, e, k, f, 1),
                     SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_moe_forward(ctx, o.y, o.probs, o.sel, o.wts, o.stats, in.x, in.wr,
                                       NULL, in.w2, s, n, d, e, k, f, 1),
                     SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_moe_forward(ctx, NULL, NULL, o.sel, o.wts, o.stats, in.x, in.wr,
                                       NULL, NULL, s, n, d, e, k, f, 1),
                     SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_moe_forward(NULL, o.y, o.probs, o.sel, o.wts, o.stats, in.x, in.wr,
                                       in.w1, in.w2, s, n, d, e, k, f, 1),
                     SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_moe_backward(ctx, o.dx, o.dwr, o.dw1, o.dw2, NULL, in.x, in.wr, in.w1,
                                        in.w2, o.probs, o.sel, o.wts, o.stats, s, n, d, e, k, f,
                                        1, 0.1f),
                     SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_moe_backward(ctx, o.dx, o.dwr, o.dw1, o.dw2, in.dy, NULL, in.wr, in.w1,
                                        in.w2, o.probs, o.sel, o.wts, o.stats, s, n, d, e, k, f,
                                        1, 0.1f),
                     SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_moe_backward(ctx, o.dx, o.dwr, o.dw1, o.dw2, in.dy, in.x, in.wr, in.w1,
                                        in.w2, o.probs, NULL, o.wts, o.stats, s, n, d, e, k, f, 1,
                                        0.1f),
                     SBPRT_ERR_INVALID);
    /* nothing was written by the failed calls (o.sel still holds o0's -5: also a backward
     * with it is a range error, tried below after a valid forward) */
    assert_outputs_equal(c, &o, &o0);

    /* n == 0: a no-op, whatever the tensors */
    rt_assert_ok(sbprt_moe_forward(ctx, NULL, NULL, NULL, NULL, o.stats, NULL, NULL, NULL, NULL,
                                   NULL, 0, d, e, k, f, 1));
    rt_assert_ok(sbprt_moe_backward(ctx, o.dx, o.dwr, o.dw1, o.dw2, NULL, NULL, NULL, NULL, NULL,
                                    NULL, NULL, NULL, o.stats, NULL, 0, d, e, k, f, 1, 0.1f));
    assert_outputs_equal(c, &o, &o0);

    /* sel out of range in the backward */
    rt_assert_ok(sbprt_moe_forward(ctx, o.y, o.probs, o.sel, o.wts, NULL, in.x, in.wr, in.w1,
                                   in.w2, s, n, d, e, k, f, 1));
    const int32_t wrong[] = {-1, e, 1 << 30};
    for (int t = 0; t < 3; t++) {
        int32_t keep = o.sel[(size_t)n * k / 2];
        o.sel[(size_t)n * k / 2] = wrong[t];
        assert_int_equal(sbprt_moe_backward(ctx, o.dx, o.dwr, o.dw1, o.dw2, in.dy, in.x, in.wr,
                                            in.w1, in.w2, o.probs, o.sel, o.wts, o.stats, s, n, d,
                                            e, k, f, 1, 0.1f),
                         SBPRT_ERR_RANGE);
        o.sel[(size_t)n * k / 2] = keep;
    }
    assert_memory_equal(o.dx, o0.dx, sz_x(c) * sizeof(float));
    assert_memory_equal(o.dwr, o0.dwr, sz_wr(c) * sizeof(float));
    assert_memory_equal(o.dw1, o0.dw1, sz_w1(c) * sizeof(float));
    assert_memory_equal(o.dw2, o0.dw2, sz_w2(c) * sizeof(float));
    /* every gradient NULL: valid, nothing to do */
    rt_assert_ok(sbprt_moe_backward(ctx, NULL, NULL, NULL, NULL, in.dy, in.x, in.wr, in.w1, in.w2,
                                    o.probs, o.sel, o.wts, o.stats, s, n, d, e, k, f, 1, 0.1f));
    scratch_check(s, floats);
    free(s);
    outputs_free(&o), outputs_free(&o0);
    free_inputs(&in);
    sbprt_ctx_destroy(ctx);
}

/* The scratch formula covers the carving for shapes of every kind (odd sizes, k = e, one
 * expert, one row, wide and narrow experts): each run checks its guard behind the scratch. */
static void test_moe_scratch_sizes(void **state)
{
    (void)state;
    const moe_case shapes[] = {
        {1, 1, 1, 1, 1, 0, -1, 0, 1, 0.0f, "1x1"},       {1, 3, 5, 5, 1, 1, -1, 0, 1, 0.5f, "k=e"},
        {3, 1, 2, 1, 7, 1, -1, 0, 1, 0.1f, "d=1"},       {65, 5, 3, 2, 2, 1, -1, 0, 1, 0.1f, "n=65"},
        {2, 70, 9, 4, 33, 0, -1, 0, 0, 0.0f, "wide"},    {17, 2, 17, 16, 3, 1, -1, 0, 1, 0.1f, "e=17"},
    };
    sbprt_ctx *ctx = rt_ctx(2);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const moe_case *c = &shapes[i];
        moe_inputs in = make_inputs(c, 60 + i);
        rt_rng r = {70 + i};
        moe_outputs o = outputs_new(c, &r);
        run_forward(ctx, c, &in, &o);
        run_backward(ctx, c, &in, &o, o.dx, o.dwr, o.dw1, o.dw2);
        for (size_t q = 0; q < sz_x(c); q++)
            assert_true(isfinite(o.y[q]) && isfinite(o.dx[q]));
        outputs_free(&o);
        free_inputs(&in);
    }
    sbprt_ctx_destroy(ctx);
}

/* ---- LoRA on the experts (sbprt_moe_lora_forward / _backward) -------------------------- */

/* The expected values come from the dense reference above run on the effective weights
 *   W1'_i = w1[i] + scale B1_i A1_i,   W2'_i = w2[i] + scale B2_i A2_i
 * formed here in double from PEFT's layout (A_i = rows [i r, (i+1) r) of a, B_i[o, j] =
 * b[o, j e + i]); its dW1', dW2' are the base weights' gradients, and the chain rule through
 * the product gives dA_i = scale B_iᵀ dW'_i, dB_i = scale dW'_i A_iᵀ (scattered back into
 * PEFT's interleaved columns).  Finite differences of the double loss as a function of a1, b1,
 * a2, b2 (the effective weights rebuilt at every evaluation) check that derivation too. */

typedef struct {
    moe_case base;
    int r, up, down; /* the rank; whether gate_up (a1, b1) and down (a2, b2) are adapted */
    float scale;
} lora_case;

/* The adapters (NULL where that projection is not adapted) or their gradients (always
 * allocated, so a gradient the kernel must not touch can be checked untouched). */
typedef struct {
    float *a1, *b1, *a2, *b2;
} lora_set;

static size_t sz_a1(const lora_case *l) { return (size_t)l->base.e * l->r * l->base.d; }
static size_t sz_b1(const lora_case *l) { return (size_t)2 * l->base.f * l->r * l->base.e; }
static size_t sz_a2(const lora_case *l) { return (size_t)l->base.e * l->r * l->base.f; }
static size_t sz_b2(const lora_case *l) { return (size_t)l->base.d * l->r * l->base.e; }

/* A's entries of the size of the base weights', B's such that scale B A is too (so the
 * adapters' share of every output is large: a kernel that dropped it fails by far). */
static lora_set make_adapters(const lora_case *l, uint64_t seed)
{
    rt_rng g = {seed};
    const moe_case *c = &l->base;
    float s1 = 1.5f / sqrtf((float)c->d), s2 = 1.5f / sqrtf((float)c->f);
    float sb = 1.0f / (l->scale * sqrtf((float)l->r));
    lora_set s = {NULL, NULL, NULL, NULL};
    if (l->up)
        s.a1 = rt_random(&g, sz_a1(l), -s1, s1), s.b1 = rt_random(&g, sz_b1(l), -sb, sb);
    if (l->down)
        s.a2 = rt_random(&g, sz_a2(l), -s2, s2), s.b2 = rt_random(&g, sz_b2(l), -sb, sb);
    return s;
}

static lora_set grads_new(const lora_case *l, rt_rng *g)
{
    lora_set s;
    s.a1 = rt_random(g, sz_a1(l), -1, 1), s.b1 = rt_random(g, sz_b1(l), -1, 1);
    s.a2 = rt_random(g, sz_a2(l), -1, 1), s.b2 = rt_random(g, sz_b2(l), -1, 1);
    return s;
}

static lora_set grads_copy(const lora_case *l, const lora_set *g)
{
    lora_set s;
    s.a1 = rt_copy(g->a1, sz_a1(l)), s.b1 = rt_copy(g->b1, sz_b1(l));
    s.a2 = rt_copy(g->a2, sz_a2(l)), s.b2 = rt_copy(g->b2, sz_b2(l));
    return s;
}

static void lora_free(lora_set *s) { free(s->a1), free(s->b1), free(s->a2), free(s->b2); }

static void assert_grads_equal(const lora_case *l, const lora_set *a, const lora_set *b)
{
    assert_memory_equal(a->a1, b->a1, sz_a1(l) * sizeof(float));
    assert_memory_equal(a->b1, b->b1, sz_b1(l) * sizeof(float));
    assert_memory_equal(a->a2, b->a2, sz_a2(l) * sizeof(float));
    assert_memory_equal(a->b2, b->b2, sz_b2(l) * sizeof(float));
}

/* Scratch of exactly sbprt_moe_lora_scratch_floats floats, NaN, then the guard. */
static float *lora_scratch_new(const lora_case *l, size_t *floats)
{
    const moe_case *c = &l->base;
    *floats = sbprt_moe_lora_scratch_floats(c->n, c->d, c->e, c->k, c->f, l->r);
    float *s = RT_NEW(float, *floats + GUARD);
    for (size_t i = 0; i < *floats; i++)
        s[i] = NAN;
    for (size_t i = 0; i < GUARD; i++)
        s[*floats + i] = GUARD_VALUE;
    return s;
}

static void run_lora_forward(sbprt_ctx *ctx, const lora_case *l, const moe_inputs *in,
                             const lora_set *ad, moe_outputs *o)
{
    const moe_case *c = &l->base;
    size_t floats;
    float *s = lora_scratch_new(l, &floats);
    rt_assert_ok(sbprt_moe_lora_forward(ctx, o->y, o->probs, o->sel, o->wts,
                                        c->stats ? o->stats : NULL, in->x, in->wr, in->w1, in->w2,
                                        ad->a1, ad->b1, ad->a2, ad->b2, s, c->n, c->d, c->e, c->k,
                                        c->f, c->norm, l->r, l->scale));
    scratch_check(s, floats);
    free(s);
}

/* The backward into the gradients that are not NULL (g's members may be NULL). */
static void run_lora_backward(sbprt_ctx *ctx, const lora_case *l, const moe_inputs *in,
                              const lora_set *ad, const moe_outputs *o, float *dx, float *dwr,
                              float *dw1, float *dw2, const lora_set *g)
{
    const moe_case *c = &l->base;
    size_t floats;
    float *s = lora_scratch_new(l, &floats);
    rt_assert_ok(sbprt_moe_lora_backward(
        ctx, dx, dwr, dw1, dw2, g->a1, g->b1, g->a2, g->b2, in->dy, in->x, in->wr, in->w1, in->w2,
        ad->a1, ad->b1, ad->a2, ad->b2, o->probs, o->sel, o->wts, c->stats ? o->stats : NULL, s,
        c->n, c->d, c->e, c->k, c->f, c->norm, c->aux, l->r, l->scale));
    scratch_check(s, floats);
    free(s);
}

/* w' = w + scale B_i A_i per expert, in double from the fp32 factors (a NULL pair: w itself).
 *   w: [e, out, in] double (read)    w': [e, out, in] (written)
 *   a: [e r, in] (NULL: not adapted)    b: [out, r e] */
static void lora_effective(double *wp, const double *w, const double *a, const double *b,
                           int e, int out, int in, int r, double scale)
{
    for (int i = 0; i < e; i++)
        for (int o = 0; o < out; o++)
            for (int t = 0; t < in; t++) {
                size_t q = ((size_t)i * out + o) * in + t;
                double s = 0;
                if (a)
                    for (int j = 0; j < r; j++)
                        s += b[(size_t)o * r * e + (size_t)j * e + i] *
                             a[((size_t)i * r + j) * in + t];
                wp[q] = w[q] + scale * s;
            }
}

/* dA_i = scale B_iᵀ dW'_i [r, in] and dB_i = scale dW'_i A_iᵀ [out, r], in PEFT's layout. */
static void lora_expected(double *da, double *db, const double *dw, const double *a,
                          const double *b, int e, int out, int in, int r, double scale)
{
    for (int i = 0; i < e; i++)
        for (int j = 0; j < r; j++) {
            for (int t = 0; t < in; t++) {
                double s = 0;
                for (int o = 0; o < out; o++)
                    s += b[(size_t)o * r * e + (size_t)j * e + i] *
                         dw[((size_t)i * out + o) * in + t];
                da[((size_t)i * r + j) * in + t] = scale * s;
            }
            for (int o = 0; o < out; o++) {
                double s = 0;
                for (int t = 0; t < in; t++)
                    s += dw[((size_t)i * out + o) * in + t] * a[((size_t)i * r + j) * in + t];
                db[(size_t)o * r * e + (size_t)j * e + i] = scale * s;
            }
        }
}

/* The double reference of a LoRA layer: the dense one on the effective weights, which
 * lora_loss rebuilds from the double adapters before each evaluation (for the finite
 * differences in a1 .. b2). */
typedef struct {
    ref_moe m; /* m.w1, m.w2: the effective weights */
    const lora_case *l;
    double *w1, *w2;         /* the base weights */
    double *a1, *b1, *a2, *b2; /* NULL where not adapted */
} ref_lora;

static void ref_lora_rebuild(ref_lora *R)
{
    const moe_case *c = &R->l->base;
    lora_effective(R->m.w1, R->w1, R->a1, R->b1, c->e, 2 * c->f, c->d, R->l->r, R->l->scale);
    lora_effective(R->m.w2, R->w2, R->a2, R->b2, c->e, c->d, c->f, R->l->r, R->l->scale);
}

static double lora_loss(void *st)
{
    ref_lora *R = st;
    ref_lora_rebuild(R);
    return ref_loss(&R->m);
}

static void ref_lora_alloc(ref_lora *R, const lora_case *l, const moe_inputs *in,
                           const lora_set *ad)
{
    const moe_case *c = &l->base;
    ref_alloc(&R->m, c, in);
    R->l = l;
    R->w1 = rt_to_double(in->w1, sz_w1(c)), R->w2 = rt_to_double(in->w2, sz_w2(c));
    R->a1 = ad->a1 ? rt_to_double(ad->a1, sz_a1(l)) : NULL;
    R->b1 = ad->b1 ? rt_to_double(ad->b1, sz_b1(l)) : NULL;
    R->a2 = ad->a2 ? rt_to_double(ad->a2, sz_a2(l)) : NULL;
    R->b2 = ad->b2 ? rt_to_double(ad->b2, sz_b2(l)) : NULL;
    ref_lora_rebuild(R);
}

static void ref_lora_free(ref_lora *R)
{
    ref_free(&R->m);
    free(R->w1), free(R->w2), free(R->a1), free(R->b1), free(R->a2), free(R->b2);
}

/* Expert i's slices of an adapter gradient are unchanged: rows [i r, (i+1) r) of da [e r, in]
 * and the columns j e + i of db [out, r e]. */
static void assert_expert_untouched(const float *da, const float *da0, const float *db,
                                    const float *db0, int i, int e, int out, int in, int r)
{
    assert_memory_equal(da + (size_t)i * r * in, da0 + (size_t)i * r * in,
                        (size_t)r * in * sizeof(float));
    for (int o = 0; o < out; o++)
        for (int j = 0; j < r; j++) {
            size_t q = (size_t)o * r * e + (size_t)j * e + i;
            assert_true(memcmp(&db[q], &db0[q], sizeof(float)) == 0);
        }
}

static const lora_case lora_cases[] = {
    {{37, 16, 4, 2, 12, 1, -1, 0, 1, 0.02f, "lora both r=3 k=2 norm aux"}, 3, 1, 1, 2.0f},
    {{37, 16, 4, 2, 12, 0, -1, 0, 0, 0.0f, "lora both r=1 k=2"}, 1, 1, 1, 2.0f},
    {{37, 16, 4, 1, 12, 1, -1, 0, 1, 0.02f, "lora gate_up r=3 k=1"}, 3, 1, 0, 2.0f},
    {{37, 16, 4, 2, 12, 1, -1, 0, 1, 0.0f, "lora gate_up r=1"}, 1, 1, 0, 0.5f},
    {{37, 16, 4, 2, 12, 1, -1, 0, 1, 0.02f, "lora down r=3"}, 3, 0, 1, 2.0f},
    {{37, 16, 4, 4, 12, 0, -1, 0, 0, 0.0f, "lora down r=1 k=e"}, 1, 0, 1, 2.0f},
    {{41, 12, 6, 2, 10, 1, 2, 0, 1, 0.02f, "lora both r=3 empty expert"}, 3, 1, 1, 2.0f},
    {{41, 12, 6, 3, 10, 0, 4, 0, 1, 0.0f, "lora both r=1 empty expert k=3"}, 1, 1, 1, 2.0f},
    {{23, 7, 5, 2, 5, 1, -1, 0, 1, 0.01f, "lora both r=3 odd sizes"}, 3, 1, 1, 1.5f},
};
#define NLORA (sizeof lora_cases / sizeof lora_cases[0])

static void check_lora_case(const lora_case *l, uint64_t seed)
{
    char what[96];
    const moe_case *c = &l->base;
    const int e = c->e, d = c->d, f = c->f, r = l->r;
    sbprt_ctx *ctx = rt_ctx(2);
    moe_inputs in = make_inputs(c, seed);
    lora_set ad = make_adapters(l, seed + 500);
    rt_rng g = {seed + 1000};
    moe_outputs o = outputs_new(c, &g), o0 = outputs_copy(c, &o);
    lora_set go = grads_new(l, &g), go0 = grads_copy(l, &go);
    run_lora_forward(ctx, l, &in, &ad, &o);

    ref_lora R;
    ref_lora_alloc(&R, l, &in, &ad);
    /* the adapters matter: the effective weights differ from the base ones by far */
    if (l->up)
        assert_true(rt_rel_err_dd(R.m.w1, R.w1, sz_w1(c)) > 0.1);
    if (l->down)
        assert_true(rt_rel_err_dd(R.m.w2, R.w2, sz_w2(c)) > 0.1);
    ref_forward(&R.m);
    const size_t nk = (size_t)c->n * c->k;
    for (size_t q = 0; q < nk; q++)
        assert_int_equal(o.sel[q], R.m.sel[q]);
    snprintf(what, sizeof what, "%s y", c->name);
    rt_assert_err(rt_rel_err(o.y, R.m.y, sz_x(c)), RT_TOL, what);
    snprintf(what, sizeof what, "%s probs", c->name);
    rt_assert_err(rt_rel_err(o.probs, R.m.p, (size_t)c->n * e), RT_TOL, what);
    snprintf(what, sizeof what, "%s wts", c->name);
    rt_assert_err(rt_rel_err(o.wts, R.m.wts, nk), RT_TOL, what);
    double *count = RT_NEW(double, e);
    for (int i = 0; i < e; i++)
        count[i] = 0;
    for (size_t q = 0; q < nk; q++)
        count[R.m.sel[q]] += 1;
    if (c->stats)
        for (int i = 0; i < e; i++)
            assert_true(o.stats[i] == o0.stats[i] + (float)count[i]);
    else
        assert_memory_equal(o.stats, o0.stats, 2 * (size_t)e * sizeof(float));
    if (c->empty >= 0)
        assert_true(count[c->empty] == 0);

    /* backward: the increments of pre-filled gradients */
    run_lora_backward(ctx, l, &in, &ad, &o, o.dx, o.dwr, o.dw1, o.dw2, &go);
    double *cstat = c->stats ? rt_to_double(o.stats, e) : NULL;
    R.m.aux = c->aux, R.m.cstat = cstat;
    double *gx = RT_NEW(double, sz_x(c)), *gwr = RT_NEW(double, sz_wr(c));
    double *gw1 = RT_NEW(double, sz_w1(c)), *gw2 = RT_NEW(double, sz_w2(c));
    ref_backward(&R.m, gx, gwr, gw1, gw2);
    snprintf(what, sizeof what, "%s dx", c->name);
    rt_assert_err(rt_rel_err_delta(o.dx, o0.dx, gx, sz_x(c)), RT_TOL, what);
    snprintf(what, sizeof what, "%s dwr", c->name);
    rt_assert_err(rt_rel_err_delta(o.dwr, o0.dwr, gwr, sz_wr(c)), RT_TOL, what);
    snprintf(what, sizeof what, "%s dw1", c->name);
    rt_assert_err(rt_rel_err_delta(o.dw1, o0.dw1, gw1, sz_w1(c)), RT_TOL, what);
    snprintf(what, sizeof what, "%s dw2", c->name);
    rt_assert_err(rt_rel_err_delta(o.dw2, o0.dw2, gw2, sz_w2(c)), RT_TOL, what);

    double *ea1 = RT_NEW(double, sz_a1(l)), *eb1 = RT_NEW(double, sz_b1(l));
    double *ea2 = RT_NEW(double, sz_a2(l)), *eb2 = RT_NEW(double, sz_b2(l));
    if (l->up) {
        lora_expected(ea1, eb1, gw1, R.a1, R.b1, e, 2 * f, d, r, l->scale);
        snprintf(what, sizeof what, "%s da1", c->name);
        rt_assert_err(rt_rel_err_delta(go.a1, go0.a1, ea1, sz_a1(l)), RT_TOL, what);
        snprintf(what, sizeof what, "%s db1", c->name);
        rt_assert_err(rt_rel_err_delta(go.b1, go0.b1, eb1, sz_b1(l)), RT_TOL, what);
    } else { /* no adapter, no gradient: the buffers passed are not touched */
        assert_memory_equal(go.a1, go0.a1, sz_a1(l) * sizeof(float));
        assert_memory_equal(go.b1, go0.b1, sz_b1(l) * sizeof(float));
    }
    if (l->down) {
        lora_expected(ea2, eb2, gw2, R.a2, R.b2, e, d, f, r, l->scale);
        snprintf(what, sizeof what, "%s da2", c->name);
        rt_assert_err(rt_rel_err_delta(go.a2, go0.a2, ea2, sz_a2(l)), RT_TOL, what);
        snprintf(what, sizeof what, "%s db2", c->name);
        rt_assert_err(rt_rel_err_delta(go.b2, go0.b2, eb2, sz_b2(l)), RT_TOL, what);
    } else {
        assert_memory_equal(go.a2, go0.a2, sz_a2(l) * sizeof(float));
        assert_memory_equal(go.b2, go0.b2, sz_b2(l) * sizeof(float));
    }
    if (c->empty >= 0) { /* nothing flows into the starved expert's weights or adapters */
        size_t o1 = (size_t)c->empty * 2 * f * d, o2 = (size_t)c->empty * d * f;
        assert_memory_equal(o.dw1 + o1, o0.dw1 + o1, 2 * (size_t)f * d * sizeof(float));
        assert_memory_equal(o.dw2 + o2, o0.dw2 + o2, (size_t)d * f * sizeof(float));
        assert_expert_untouched(go.a1, go0.a1, go.b1, go0.b1, c->empty, e, 2 * f, d, r);
        assert_expert_untouched(go.a2, go0.a2, go.b2, go0.b2, c->empty, e, d, f, r);
    }

    /* finite differences of the double loss in the adapters and x */
    snprintf(what, sizeof what, "%s dx fd", c->name);
    rt_assert_err(rt_fd_check(lora_loss, NULL, &R, R.m.x, sz_x(c), o.dx, o0.dx, FD_POINTS), RT_TOL,
                  what);
    if (l->up) {
        snprintf(what, sizeof what, "%s da1 fd", c->name);
        rt_assert_err(rt_fd_check(lora_loss, NULL, &R, R.a1, sz_a1(l), go.a1, go0.a1, FD_POINTS),
                      RT_TOL, what);
        snprintf(what, sizeof what, "%s db1 fd", c->name);
        rt_assert_err(rt_fd_check(lora_loss, NULL, &R, R.b1, sz_b1(l), go.b1, go0.b1, FD_POINTS),
                      RT_TOL, what);
    }
    if (l->down) {
        snprintf(what, sizeof what, "%s da2 fd", c->name);
        rt_assert_err(rt_fd_check(lora_loss, NULL, &R, R.a2, sz_a2(l), go.a2, go0.a2, FD_POINTS),
                      RT_TOL, what);
        snprintf(what, sizeof what, "%s db2 fd", c->name);
        rt_assert_err(rt_fd_check(lora_loss, NULL, &R, R.b2, sz_b2(l), go.b2, go0.b2, FD_POINTS),
                      RT_TOL, what);
    }

    free(count), free(cstat), free(gx), free(gwr), free(gw1), free(gw2);
    free(ea1), free(eb1), free(ea2), free(eb2);
    ref_lora_free(&R);
    outputs_free(&o), outputs_free(&o0);
    lora_free(&go), lora_free(&go0), lora_free(&ad);
    free_inputs(&in);
    sbprt_ctx_destroy(ctx);
}

static void test_moe_lora_reference(void **state)
{
    (void)state;
    for (size_t i = 0; i < NLORA; i++)
        check_lora_case(&lora_cases[i], 200 + i);
}

/* NULL gradient outputs, any subset of the eight, are skipped and the others get the same
 * bits as in the full call; with one projection not adapted, the gradient buffers passed for
 * its adapter are ignored (never written). */
static void check_lora_null_grads(const lora_case *l, uint64_t seed)
{
    const moe_case *c = &l->base;
    sbprt_ctx *ctx = rt_ctx(2);
    moe_inputs in = make_inputs(c, seed);
    lora_set ad = make_adapters(l, seed + 1);
    rt_rng g = {seed + 2};
    moe_outputs full = outputs_new(c, &g);
    lora_set gfull = grads_new(l, &g);
    run_lora_forward(ctx, l, &in, &ad, &full);
    moe_outputs before = outputs_copy(c, &full);
    lora_set gbefore = grads_copy(l, &gfull);
    run_lora_backward(ctx, l, &in, &ad, &full, full.dx, full.dwr, full.dw1, full.dw2, &gfull);
    for (int mask = 0; mask < 256; mask++) {
        moe_outputs o = outputs_copy(c, &before);
        lora_set go = grads_copy(l, &gbefore);
        lora_set pass = {mask & 16 ? go.a1 : NULL, mask & 32 ? go.b1 : NULL,
                         mask & 64 ? go.a2 : NULL, mask & 128 ? go.b2 : NULL};
        run_lora_backward(ctx, l, &in, &ad, &o, mask & 1 ? o.dx : NULL, mask & 2 ? o.dwr : NULL,
                          mask & 4 ? o.dw1 : NULL, mask & 8 ? o.dw2 : NULL, &pass);
        assert_memory_equal(o.dx, (mask & 1 ? &full : &before)->dx, sz_x(c) * sizeof(float));
        assert_memory_equal(o.dwr, (mask & 2 ? &full : &before)->dwr, sz_wr(c) * sizeof(float));
        assert_memory_equal(o.dw1, (mask & 4 ? &full : &before)->dw1, sz_w1(c) * sizeof(float));
        assert_memory_equal(o.dw2, (mask & 8 ? &full : &before)->dw2, sz_w2(c) * sizeof(float));
        assert_memory_equal(go.a1, (mask & 16 ? &gfull : &gbefore)->a1, sz_a1(l) * sizeof(float));
        assert_memory_equal(go.b1, (mask & 32 ? &gfull : &gbefore)->b1, sz_b1(l) * sizeof(float));
        assert_memory_equal(go.a2, (mask & 64 ? &gfull : &gbefore)->a2, sz_a2(l) * sizeof(float));
        assert_memory_equal(go.b2, (mask & 128 ? &gfull : &gbefore)->b2, sz_b2(l) * sizeof(float));
        outputs_free(&o);
        lora_free(&go);
    }
    if (!l->up) { /* the full call left the unadapted pair's buffers alone */
        assert_memory_equal(gfull.a1, gbefore.a1, sz_a1(l) * sizeof(float));
        assert_memory_equal(gfull.b1, gbefore.b1, sz_b1(l) * sizeof(float));
    }
    if (!l->down) {
        assert_memory_equal(gfull.a2, gbefore.a2, sz_a2(l) * sizeof(float));
        assert_memory_equal(gfull.b2, gbefore.b2, sz_b2(l) * sizeof(float));
    }
    outputs_free(&full), outputs_free(&before);
    lora_free(&gfull), lora_free(&gbefore), lora_free(&ad);
    free_inputs(&in);
    sbprt_ctx_destroy(ctx);
}

static void test_moe_lora_null_grads(void **state)
{
    (void)state;
    check_lora_null_grads(&lora_cases[0], 301); /* both */
    check_lora_null_grads(&lora_cases[6], 302); /* both, an empty expert */
    check_lora_null_grads(&lora_cases[2], 303); /* gate_up only */
    check_lora_null_grads(&lora_cases[4], 304); /* down only */
}

/* Two backward calls add twice the gradient to non-zero buffers; the forward overwrites
 * whatever its outputs held (the same bits from other garbage). */
static void test_moe_lora_accumulate(void **state)
{
    (void)state;
    const lora_case *l = &lora_cases[6]; /* both r=3 empty expert */
    const moe_case *c = &l->base;
    sbprt_ctx *ctx = rt_ctx(2);
    moe_inputs in = make_inputs(c, 41);
    lora_set ad = make_adapters(l, 42);
    rt_rng g = {43};
    moe_outputs o = outputs_new(c, &g), other = outputs_new(c, &g);
    memcpy(other.stats, o.stats, 2 * (size_t)c->e * sizeof(float));
    run_lora_forward(ctx, l, &in, &ad, &o);
    run_lora_forward(ctx, l, &in, &ad, &other);
    assert_memory_equal(o.y, other.y, sz_x(c) * sizeof(float));
    assert_memory_equal(o.probs, other.probs, (size_t)c->n * c->e * sizeof(float));
    assert_memory_equal(o.wts, other.wts, (size_t)c->n * c->k * sizeof(float));
    assert_memory_equal(o.sel, other.sel, (size_t)c->n * c->k * sizeof(int32_t));

    moe_outputs o0 = outputs_copy(c, &o);
    lora_set go = grads_new(l, &g), go0 = grads_copy(l, &go);
    for (int t = 0; t < 2; t++)
        run_lora_backward(ctx, l, &in, &ad, &o, o.dx, o.dwr, o.dw1, o.dw2, &go);
    ref_lora R;
    ref_lora_alloc(&R, l, &in, &ad);
    double *cstat = rt_to_double(o.stats, c->e);
    R.m.aux = c->aux, R.m.cstat = cstat;
    double *gx = RT_NEW(double, sz_x(c)), *gwr = RT_NEW(double, sz_wr(c));
    double *gw1 = RT_NEW(double, sz_w1(c)), *gw2 = RT_NEW(double, sz_w2(c));
    ref_backward(&R.m, gx, gwr, gw1, gw2);
    double *ea1 = RT_NEW(double, sz_a1(l)), *eb1 = RT_NEW(double, sz_b1(l));
    double *ea2 = RT_NEW(double, sz_a2(l)), *eb2 = RT_NEW(double, sz_b2(l));
    lora_expected(ea1, eb1, gw1, R.a1, R.b1, c->e, 2 * c->f, c->d, l->r, l->scale);
    lora_expected(ea2, eb2, gw2, R.a2, R.b2, c->e, c->d, c->f, l->r, l->scale);
    double *all[] = {gx, gwr, gw1, gw2, ea1, eb1, ea2, eb2};
    const size_t sizes[] = {sz_x(c), sz_wr(c), sz_w1(c), sz_w2(c),
                            sz_a1(l), sz_b1(l), sz_a2(l), sz_b2(l)};
    for (int t = 0; t < 8; t++)
        for (size_t q = 0; q < sizes[t]; q++)
            all[t][q] *= 2;
    rt_assert_err(rt_rel_err_delta(o.dx, o0.dx, gx, sz_x(c)), RT_TOL, "lora twice dx");
    rt_assert_err(rt_rel_err_delta(o.dwr, o0.dwr, gwr, sz_wr(c)), RT_TOL, "lora twice dwr");
    rt_assert_err(rt_rel_err_delta(o.dw1, o0.dw1, gw1, sz_w1(c)), RT_TOL, "lora twice dw1");
    rt_assert_err(rt_rel_err_delta(o.dw2, o0.dw2, gw2, sz_w2(c)), RT_TOL, "lora twice dw2");
    rt_assert_err(rt_rel_err_delta(go.a1, go0.a1, ea1, sz_a1(l)), RT_TOL, "lora twice da1");
    rt_assert_err(rt_rel_err_delta(go.b1, go0.b1, eb1, sz_b1(l)), RT_TOL, "lora twice db1");
    rt_assert_err(rt_rel_err_delta(go.a2, go0.a2, ea2, sz_a2(l)), RT_TOL, "lora twice da2");
    rt_assert_err(rt_rel_err_delta(go.b2, go0.b2, eb2, sz_b2(l)), RT_TOL, "lora twice db2");
    for (int t = 0; t < 8; t++)
        free(all[t]);
    free(cstat);
    ref_lora_free(&R);
    outputs_free(&o), outputs_free(&o0), outputs_free(&other);
    lora_free(&go), lora_free(&go0), lora_free(&ad);
    free_inputs(&in);
    sbprt_ctx_destroy(ctx);
}

/* An expert that no row selects is never computed with LoRA either: NaN in its weights and
 * in its slices of a1 .. b2 changes no output bit. */
static void test_moe_lora_unselected_expert_unread(void **state)
{
    (void)state;
    const lora_case *l = &lora_cases[6];
    const moe_case *c = &l->base;
    const int e = c->e, d = c->d, f = c->f, r = l->r, i = c->empty;
    sbprt_ctx *ctx = rt_ctx(2);
    moe_inputs in = make_inputs(c, 51), bad = make_inputs(c, 51);
    lora_set ad = make_adapters(l, 52), adb = make_adapters(l, 52);
    for (size_t q = 0; q < 2 * (size_t)f * d; q++)
        bad.w1[(size_t)i * 2 * f * d + q] = NAN;
    for (size_t q = 0; q < (size_t)d * f; q++)
        bad.w2[(size_t)i * d * f + q] = NAN;
    for (size_t q = 0; q < (size_t)r * d; q++)
        adb.a1[(size_t)i * r * d + q] = NAN;
    for (size_t q = 0; q < (size_t)r * f; q++)
        adb.a2[(size_t)i * r * f + q] = NAN;
    for (int j = 0; j < r; j++) {
        for (int o = 0; o < 2 * f; o++)
            adb.b1[(size_t)o * r * e + (size_t)j * e + i] = NAN;
        for (int o = 0; o < d; o++)
            adb.b2[(size_t)o * r * e + (size_t)j * e + i] = NAN;
    }
    rt_rng g = {53};
    moe_outputs a = outputs_new(c, &g), b = outputs_copy(c, &a);
    lora_set ga = grads_new(l, &g), gb = grads_copy(l, &ga);
    run_lora_forward(ctx, l, &in, &ad, &a);
    run_lora_forward(ctx, l, &bad, &adb, &b);
    run_lora_backward(ctx, l, &in, &ad, &a, a.dx, a.dwr, a.dw1, a.dw2, &ga);
    run_lora_backward(ctx, l, &bad, &adb, &b, b.dx, b.dwr, b.dw1, b.dw2, &gb);
    assert_outputs_equal(c, &a, &b);
    assert_grads_equal(l, &ga, &gb);
    outputs_free(&a), outputs_free(&b);
    lora_free(&ga), lora_free(&gb), lora_free(&ad), lora_free(&adb);
    free_inputs(&in), free_inputs(&bad);
    sbprt_ctx_destroy(ctx);
}

/* Bitwise the same for 1, 2 and 3 threads: the plain test's sizes (every loop forks, every
 * GEMM stays single-threaded) with a rank whose b1 copy and scatter fork too. */
static void test_moe_lora_threads(void **state)
{
    (void)state;
    const lora_case l = {{256, 8, 64, 8, 8, 1, -1, 0, 1, 1e-3f, "lora threads"}, 16, 1, 1, 2.0f};
    const moe_case *c = &l.base;
    moe_inputs in = make_inputs(c, 61);
    lora_set ad = make_adapters(&l, 62);
    rt_rng g = {63};
    moe_outputs start = outputs_new(c, &g), first = outputs_copy(c, &start);
    lora_set gstart = grads_new(&l, &g), gfirst = grads_copy(&l, &gstart);
    const int threads[] = {1, 2, 3};
    for (int t = 0; t < 3; t++) {
        sbprt_ctx *ctx = rt_ctx(threads[t]);
        moe_outputs o = outputs_copy(c, &start);
        lora_set go = grads_copy(&l, &gstart);
        run_lora_forward(ctx, &l, &in, &ad, &o);
        run_lora_backward(ctx, &l, &in, &ad, &o, o.dx, o.dwr, o.dw1, o.dw2, &go);
        if (t == 0) {
            outputs_free(&first), lora_free(&gfirst);
            first = o, gfirst = go;
        } else {
            assert_outputs_equal(c, &first, &o);
            assert_grads_equal(&l, &gfirst, &go);
            outputs_free(&o), lora_free(&go);
        }
        sbprt_ctx_destroy(ctx);
    }
    outputs_free(&first), outputs_free(&start);
    lora_free(&gfirst), lora_free(&gstart), lora_free(&ad);
    free_inputs(&in);
}

/* The scratch formula covers the LoRA carving for shapes of every kind and ranks 1 .. 5:
 * each run checks its guard behind the NaN scratch and that the results are finite. */
static void test_moe_lora_scratch_sizes(void **state)
{
    (void)state;
    const lora_case shapes[] = {
        {{1, 1, 1, 1, 1, 0, -1, 0, 1, 0.0f, "1x1"}, 1, 1, 1, 2.0f},
        {{1, 3, 5, 5, 1, 1, -1, 0, 1, 0.5f, "k=e"}, 5, 1, 1, 2.0f},
        {{3, 1, 2, 1, 7, 1, -1, 0, 1, 0.1f, "d=1"}, 2, 1, 0, 2.0f},
        {{65, 5, 3, 2, 2, 1, -1, 0, 1, 0.1f, "n=65"}, 3, 0, 1, 2.0f},
        {{2, 70, 9, 4, 33, 0, -1, 0, 0, 0.0f, "wide"}, 4, 1, 1, 0.25f},
        {{17, 2, 17, 16, 3, 1, -1, 0, 1, 0.1f, "e=17"}, 3, 1, 1, 2.0f},
    };
    sbprt_ctx *ctx = rt_ctx(2);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const lora_case *l = &shapes[s];
        const moe_case *c = &l->base;
        moe_inputs in = make_inputs(c, 80 + s);
        lora_set ad = make_adapters(l, 90 + s);
        rt_rng g = {100 + s};
        moe_outputs o = outputs_new(c, &g);
        lora_set go = grads_new(l, &g);
        run_lora_forward(ctx, l, &in, &ad, &o);
        run_lora_backward(ctx, l, &in, &ad, &o, o.dx, o.dwr, o.dw1, o.dw2, &go);
        for (size_t q = 0; q < sz_x(c); q++)
            assert_true(isfinite(o.y[q]) && isfinite(o.dx[q]));
        float *gs[] = {o.dw1, o.dw2, go.a1, go.b1, go.a2, go.b2};
        const size_t sizes[] = {sz_w1(c), sz_w2(c), sz_a1(l), sz_b1(l), sz_a2(l), sz_b2(l)};
        for (int t = 0; t < 6; t++)
            for (size_t q = 0; q < sizes[t]; q++)
                assert_true(isfinite(gs[t][q]));
        outputs_free(&o);
        lora_free(&go), lora_free(&ad);
        free_inputs(&in);
    }
    sbprt_ctx_destroy(ctx);
}

/* r = 0 with every adapter NULL is the plain layer, bit for bit (the adapter gradients
 * passed are ignored); an adapter without its pair, or a rank < 1 with adapters:
 * SBPRT_ERR_INVALID from both calls, with nothing written. */
static void test_moe_lora_errors(void **state)
{
    (void)state;
    const lora_case *l = &lora_cases[0];
    const moe_case *c = &l->base;
    const int n = c->n, d = c->d, e = c->e, k = c->k, f = c->f;
    sbprt_ctx *ctx = rt_ctx(2);
    moe_inputs in = make_inputs(c, 71);
    lora_set ad = make_adapters(l, 72);
    rt_rng g = {73};

    /* r = 0, no adapters: the plain calls' bits */
    moe_outputs plain = outputs_new(c, &g), zero = outputs_copy(c, &plain);
    lora_set gz = grads_new(l, &g), gz0 = grads_copy(l, &gz);
    run_forward(ctx, c, &in, &plain);
    run_backward(ctx, c, &in, &plain, plain.dx, plain.dwr, plain.dw1, plain.dw2);
    const lora_case l0 = {l->base, 0, 0, 0, 2.0f};
    const lora_set none = {NULL, NULL, NULL, NULL};
    run_lora_forward(ctx, &l0, &in, &none, &zero);
    size_t floats;
    float *s = lora_scratch_new(&l0, &floats);
    rt_assert_ok(sbprt_moe_lora_backward(ctx, zero.dx, zero.dwr, zero.dw1, zero.dw2, gz.a1, gz.b1,
                                         gz.a2, gz.b2, in.dy, in.x, in.wr, in.w1, in.w2, NULL,
                                         NULL, NULL, NULL, zero.probs, zero.sel, zero.wts,
                                         zero.stats, s, n, d, e, k, f, c->norm, c->aux, 0, 2.0f));
    scratch_check(s, floats);
    free(s);
    assert_true(sbprt_moe_lora_scratch_floats(n, d, e, k, f, 0) ==
                sbprt_moe_scratch_floats(n, d, e, k, f));
    assert_outputs_equal(c, &plain, &zero);
    assert_grads_equal(l, &gz, &gz0);

    /* the invalid adapter sets */
    moe_outputs o = outputs_new(c, &g), o0 = outputs_copy(c, &o);
    lora_set go = grads_new(l, &g), go0 = grads_copy(l, &go);
    s = lora_scratch_new(l, &floats);
    const struct {
        int r, has; /* has: bit t set when adapter t of (a1, b1, a2, b2) is passed */
    } bad[] = {{3, 1}, {3, 2}, {3, 4}, {3, 8}, {3, 1 | 4 | 8}, {3, 1 | 2 | 4}, {3, 2 | 8},
               {0, 15}, {0, 3}, {0, 12}, {-1, 15}, {-3, 3}};
    for (size_t t = 0; t < sizeof bad / sizeof bad[0]; t++) {
        const int h = bad[t].has, r = bad[t].r;
        const float *a1 = h & 1 ? ad.a1 : NULL, *b1 = h & 2 ? ad.b1 : NULL;
        const float *a2 = h & 4 ? ad.a2 : NULL, *b2 = h & 8 ? ad.b2 : NULL;
        assert_int_equal(sbprt_moe_lora_forward(ctx, o.y, o.probs, o.sel, o.wts, o.stats, in.x,
                                                in.wr, in.w1, in.w2, a1, b1, a2, b2, s, n, d, e,
                                                k, f, c->norm, r, l->scale),
                         SBPRT_ERR_INVALID);
        assert_int_equal(sbprt_moe_lora_backward(ctx, o.dx, o.dwr, o.dw1, o.dw2, go.a1, go.b1,
                                                 go.a2, go.b2, in.dy, in.x, in.wr, in.w1, in.w2,
                                                 a1, b1, a2, b2, plain.probs, plain.sel,
                                                 plain.wts, o.stats, s, n, d, e, k, f, c->norm,
                                                 c->aux, r, l->scale),
                         SBPRT_ERR_INVALID);
    }
    assert_outputs_equal(c, &o, &o0);
    assert_grads_equal(l, &go, &go0);
    scratch_check(s, floats);
    free(s);

    outputs_free(&plain), outputs_free(&zero), outputs_free(&o), outputs_free(&o0);
    lora_free(&gz), lora_free(&gz0), lora_free(&go), lora_free(&go0), lora_free(&ad);
    free_inputs(&in);
    sbprt_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_reference),
        cmocka_unit_test(test_moe_routing_only),
        cmocka_unit_test(test_moe_null_grads),
        cmocka_unit_test(test_moe_accumulate),
        cmocka_unit_test(test_moe_unselected_expert_unread),
        cmocka_unit_test(test_moe_threads),
        cmocka_unit_test(test_moe_errors),
        cmocka_unit_test(test_moe_scratch_sizes),
        cmocka_unit_test(test_moe_lora_reference),
        cmocka_unit_test(test_moe_lora_null_grads),
        cmocka_unit_test(test_moe_lora_accumulate),
        cmocka_unit_test(test_moe_lora_unselected_expert_unread),
        cmocka_unit_test(test_moe_lora_threads),
        cmocka_unit_test(test_moe_lora_scratch_sizes),
        cmocka_unit_test(test_moe_lora_errors),
    };
    return cmocka_run_group_tests_name("runtime_moe", tests, NULL, NULL);
}
