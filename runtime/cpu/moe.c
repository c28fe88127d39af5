/*
 * moe.c — a routed layer of SwiGLU experts (sbprt_moe_forward / sbprt_moe_backward).
 *
 * The work is sparse: the n*k (row, choice) pairs are counting-sorted by expert, stably (row,
 * then choice, within an expert), the selected rows are gathered into one contiguous copy in
 * that order, and every expert that received c > 0 rows runs one sbprt_gemm per matrix over
 * its own c rows.  The output is then combined per row over the k copies in choice order.
 * The backward recomputes the same sort and activations from x (nothing but probs, sel and
 * wts is kept between the two calls), so the forward and the recomputation are bitwise equal.
 *
 * Determinism: the sort runs on one thread; every other loop is a static split over rows or
 * pairs (or experts, for the statistics) in which each item's result is computed in a fixed
 * order by one thread, and nothing is summed across items except by the GEMMs.  So results
 * depend on the thread count only through sbprt_gemm (see sbprt.h).
 *
 * All temporaries live in the caller's scratch (sbprt_moe_scratch_floats floats):
 * sbprt_moe_layout_plan (runtime/moe_layout.h, shared with the CUDA twin) carves it into
 * pieces whose offsets are multiples of 64 floats and checks, for the sizes given, that the
 * carving fits the formula.
 */
#include <math.h>
#include <stdint.h>

#include "cpu.h"
#include "moe_layout.h"

_Static_assert(sizeof(int32_t) == sizeof(float), "routing tables are int32 in float slots");

/* The same formulas as elementwise.c's SwiGLU, so an expert's product is bitwise what
 * sbprt_swiglu_forward / sbprt_swiglu_backward give. */
static inline float moe_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

static inline float moe_silu_grad(float x)
{
    float s = moe_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

/* Whether expert a ranks before expert b in the top-k order: the larger probability, and on
 * equal values the lower index (ONNX TopK).  A NaN ranks before nothing. */
static inline int moe_before(const float *p, int a, int b)
{
    return p[a] > p[b] || (p[a] == p[b] && a < b);
}

/* Softmax of one row of logits in place, its top-k and the routing weights.
 *   p: [e] (logits in, probabilities out)    sel, wts: [k] */
static void moe_route_row(float *p, int32_t *sel, float *wts, int e, int k, int norm_topk)
{
    float mx = p[0];
    for (int i = 1; i < e; i++)
        mx = p[i] > mx ? p[i] : mx;
    float s = 0;
    for (int i = 0; i < e; i++) {
        p[i] = expf(p[i] - mx);
        s += p[i];
    }
    for (int i = 0; i < e; i++)
        p[i] /= s;
    /* Each choice is the best expert ranked after the previous choice: k passes over the row
     * and no marks, since the order is total on non-NaN values. */
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < e; i++) {
            if (j > 0 && !moe_before(p, sel[j - 1], i))
                continue;
            if (best < 0 || moe_before(p, i, best))
                best = i;
        }
        if (best < 0) { /* only after a NaN: the lowest expert not chosen yet, so sel is valid */
            for (int i = 0; i < e && best < 0; i++) {
                int taken = 0;
                for (int jj = 0; jj < j; jj++)
                    taken |= sel[jj] == i;
                if (!taken)
                    best = i;
            }
        }
        sel[j] = best;
    }
    float vs = 0;
    for (int j = 0; j < k; j++) {
        wts[j] = p[sel[j]];
        vs += wts[j];
    }
    if (norm_topk)
        for (int j = 0; j < k; j++)
            wts[j] /= vs;
}

/* Stable counting sort of the pairs by expert: start [e + 1], order and pos [nk] (see
 * sbprt_moe_layout).  One thread, pairs in row-major order.  A sel value outside [0, e) gives
 * SBPRT_ERR_RANGE before anything but the counts is written. */
static int moe_sort(const int32_t *sel, size_t nk, int e, int32_t *start, int32_t *order,
                    int32_t *pos)
{
    for (int i = 0; i <= e; i++)
        start[i] = 0;
    for (size_t q = 0; q < nk; q++) {
        if (sel[q] < 0 || sel[q] >= e)
            return SBPRT_ERR_RANGE;
        start[sel[q] + 1]++;
    }
    for (int i = 0; i < e; i++)
        start[i + 1] += start[i];
    /* start[i] doubles as expert i's next free slot and is restored afterwards */
    for (size_t q = 0; q < nk; q++) {
        int32_t p = start[sel[q]]++;
        order[p] = (int32_t)q;
        pos[q] = p;
    }
    for (int i = e; i > 0; i--)
        start[i] = start[i - 1];
    start[0] = 0;
    return SBPRT_OK;
}

/* The experts over the sorted pairs: xs gathered from x, h = xs w1ᵀ, a = swiglu(h),
 * ye = a w2ᵀ, per expert one GEMM each over its rows.  Scratch pieces as sbprt_moe_layout.
 *   x: [n, d]    w1: [e, 2f, d]    w2: [e, d, f] */
static int moe_experts(sbprt_ctx *ctx, float *scratch, const sbprt_moe_layout *L,
                       const float *x, const float *w1, const float *w2, int d, int e, int k,
                       int f)
{
    float *xs = scratch + L->xs, *h = scratch + L->h, *a = scratch + L->a;
    float *ye = scratch + L->ye;
    const int32_t *order = (const int32_t *)(scratch + L->order);
    const int32_t *start = (const int32_t *)(scratch + L->start);
    const int64_t nk = (int64_t)L->nk, f2 = 2 * (int64_t)f;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (L->nk * (size_t)d >= CPU_PARALLEL_MIN)
    for (int64_t p = 0; p < nk; p++) {
        const float *src = x + (size_t)(order[p] / k) * d;
        float *dst = xs + (size_t)p * d;
        for (int c = 0; c < d; c++)
            dst[c] = src[c];
    }
    for (int i = 0; i < e; i++) {
        int c = start[i + 1] - start[i];
        if (c == 0)
            continue;
        int st = sbprt_gemm(ctx, h + (size_t)start[i] * f2, xs + (size_t)start[i] * d,
                            w1 + (size_t)i * f2 * d, 0, 1, c, (int)f2, d, 1.0f, 0.0f);
        if (st)
            return st;
    }
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (L->nk * (size_t)f >= CPU_PARALLEL_MIN)
    for (int64_t p = 0; p < nk; p++) {
        const float *gate = h + (size_t)p * f2, *up = gate + f;
        float *ap = a + (size_t)p * f;
        for (int c = 0; c < f; c++)
            ap[c] = gate[c] * moe_sigmoid(gate[c]) * up[c];
    }
    for (int i = 0; i < e; i++) {
        int c = start[i + 1] - start[i];
        if (c == 0)
            continue;
        int st = sbprt_gemm(ctx, ye + (size_t)start[i] * d, a + (size_t)start[i] * f,
                            w2 + (size_t)i * d * f, 0, 1, c, d, f, 1.0f, 0.0f);
        if (st)
            return st;
    }
    return SBPRT_OK;
}

int sbprt_moe_forward(sbprt_ctx *ctx, float *y, float *probs, int32_t *sel, float *wts,
                      float *stats, const float *x, const float *wr, const float *w1,
                      const float *w2, float *scratch, int n, int d, int e, int k, int f,
                      int norm_topk)
{
    CPU_CHECK(ctx);
    sbprt_moe_layout L;
    int st = sbprt_moe_layout_plan(n, d, e, k, f, &L);
    if (st)
        return st;
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(y && probs && sel && wts && x && wr && w1 && w2 && scratch);

    /* router: logits straight into probs, then softmax and top-k per row */
    st = sbprt_gemm(ctx, probs, x, wr, 0, 1, n, e, d, 1.0f, 0.0f);
    if (st)
        return st;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * e * k >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++)
        moe_route_row(probs + (size_t)r * e, sel + (size_t)r * k, wts + (size_t)r * k, e, k,
                      norm_topk);

    int32_t *start = (int32_t *)(scratch + L.start);
    int32_t *pos = (int32_t *)(scratch + L.pos);
    st = moe_sort(sel, L.nk, e, start, (int32_t *)(scratch + L.order), pos);
    if (st)
        return st; /* not reached: the routing above only writes valid experts */
    st = moe_experts(ctx, scratch, &L, x, w1, w2, d, e, k, f);
    if (st)
        return st;

    /* y[r] = Σ_j wts[r, j] ye[pos(r, j)], j in order */
    const float *ye = scratch + L.ye;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (L.nk * (size_t)d >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        float *yr = y + (size_t)r * d;
        for (int j = 0; j < k; j++) {
            size_t q = (size_t)r * k + j;
            const float *src = ye + (size_t)pos[q] * d;
            float w = wts[q];
            if (j == 0)
                for (int c = 0; c < d; c++)
                    yr[c] = w * src[c];
            else
                for (int c = 0; c < d; c++) {
                    float t = w * src[c];
                    yr[c] += t;
                }
        }
    }

    /* The load-balancing sums: this call's share per expert in double (the probabilities
     * in row order), added to the fp32 totals once. */
    if (stats) {
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * e >= CPU_PARALLEL_MIN)
        for (int i = 0; i < e; i++) {
            double ps = 0;
            for (int r = 0; r < n; r++)
                ps += probs[(size_t)r * e + i];
            stats[i] += (float)(double)(start[i + 1] - start[i]);
            stats[e + i] += (float)ps;
        }
    }
    return SBPRT_OK;
}

int sbprt_moe_backward(sbprt_ctx *ctx, float *dx, float *dwr, float *dw1, float *dw2,
                       const float *dy, const float *x, const float *wr, const float *w1,
                       const float *w2, const float *probs, const int32_t *sel,
                       const float *wts, const float *stats, float *scratch, int n, int d,
                       int e, int k, int f, int norm_topk, float aux_scale)
{
    CPU_CHECK(ctx);
    sbprt_moe_layout L;
    int st = sbprt_moe_layout_plan(n, d, e, k, f, &L);
    if (st)
        return st;
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(dy && x && wr && w1 && w2 && probs && sel && wts && scratch);
    const int32_t *start = (const int32_t *)(scratch + L.start);
    const int32_t *order = (const int32_t *)(scratch + L.order);
    const int32_t *pos = (const int32_t *)(scratch + L.pos);
    st = moe_sort(sel, L.nk, e, (int32_t *)(scratch + L.start), (int32_t *)(scratch + L.order),
                  (int32_t *)(scratch + L.pos));
    if (st)
        return st;
    if (!dx && !dwr && !dw1 && !dw2)
        return SBPRT_OK;
    st = moe_experts(ctx, scratch, &L, x, w1, w2, d, e, k, f);
    if (st)
        return st;

    float *xs = scratch + L.xs, *h = scratch + L.h, *a = scratch + L.a, *ye = scratch + L.ye;
    float *da = scratch + L.da, *dh = scratch + L.dh, *dw = scratch + L.dw;
    float *dz = scratch + L.dz;
    const int64_t nk = (int64_t)L.nk, f2 = 2 * (int64_t)f;

    /* per pair: dL/dwts = dy[r] · ye, then ye becomes dye = wts dy[r] */
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (L.nk * (size_t)d >= CPU_PARALLEL_MIN)
    for (int64_t p = 0; p < nk; p++) {
        int32_t q = order[p];
        const float *dyr = dy + (size_t)(q / k) * d;
        float *yp = ye + (size_t)p * d;
        dw[q] = cpu_dot(dyr, yp, d);
        float w = wts[q];
        for (int c = 0; c < d; c++)
            yp[c] = w * dyr[c];
    }

    /* down projection: dw2[i] += dyeᵀ a, da = dye w2[i] */
    for (int i = 0; i < e; i++) {
        int c = start[i + 1] - start[i];
        if (c == 0)
            continue;
        const float *dye_i = ye + (size_t)start[i] * d;
        if (dw2) {
            st = sbprt_gemm(ctx, dw2 + (size_t)i * d * f, dye_i, a + (size_t)start[i] * f, 1, 0,
                            d, f, c, 1.0f, 1.0f);
            if (st)
                return st;
        }
        if (dw1 || dx) {
            st = sbprt_gemm(ctx, da + (size_t)start[i] * f, dye_i, w2 + (size_t)i * d * f, 0, 0,
                            c, f, d, 1.0f, 0.0f);
            if (st)
                return st;
        }
    }

    if (dw1 || dx) {
        /* SwiGLU backward, written (dh is a temporary) */
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (L.nk * (size_t)f >= CPU_PARALLEL_MIN)
        for (int64_t p = 0; p < nk; p++) {
            const float *gate = h + (size_t)p * f2, *up = gate + f, *dap = da + (size_t)p * f;
            float *dg = dh + (size_t)p * f2, *du = dg + f;
            for (int c = 0; c < f; c++) {
                dg[c] = dap[c] * up[c] * moe_silu_grad(gate[c]);
                du[c] = dap[c] * gate[c] * moe_sigmoid(gate[c]);
            }
        }
        /* up/gate projection: dw1[i] += dhᵀ xs, then dxs = dh w1[i] over xs (each expert's
         * rows of xs are read by its own dw1 product only, which comes first) */
        for (int i = 0; i < e; i++) {
            int c = start[i + 1] - start[i];
            if (c == 0)
                continue;
            const float *dh_i = dh + (size_t)start[i] * f2;
            float *xs_i = xs + (size_t)start[i] * d;
            if (dw1) {
                st = sbprt_gemm(ctx, dw1 + (size_t)i * f2 * d, dh_i, xs_i, 1, 0, (int)f2, d, c,
                                1.0f, 1.0f);
                if (st)
                    return st;
            }
            if (dx) {
                st = sbprt_gemm(ctx, xs_i, dh_i, w1 + (size_t)i * f2 * d, 0, 0, c, d, (int)f2,
                                1.0f, 0.0f);
                if (st)
                    return st;
            }
        }
    }

    if (dx) {
        /* scatter-add: the k copies of row r summed in choice order, then added to dx[r] */
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (L.nk * (size_t)d >= CPU_PARALLEL_MIN)
        for (int r = 0; r < n; r++) {
            const int32_t *pr = pos + (size_t)r * k;
            float *dxr = dx + (size_t)r * d;
            for (int c = 0; c < d; c++) {
                float s = 0;
                for (int j = 0; j < k; j++)
                    s += xs[(size_t)pr[j] * d + c];
                dxr[c] += s;
            }
        }
    }

    if (!dx && !dwr)
        return SBPRT_OK;
    /* Router, per row: dL/dv through the renormalisation w = v / s (dv_j = (dw_j -
     * Σ_i dw_i w_i) / s), scattered into dL/dp with the load-balancing term's aux_scale c_i
     * on every expert, then the softmax backward dz = p ⊙ (dp - dp · p). */
    const int aux = stats && aux_scale != 0.0f;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * e >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        const float *pr = probs + (size_t)r * e;
        const int32_t *sr = sel + (size_t)r * k;
        const float *wr_ = wts + (size_t)r * k;
        float *dvr = dw + (size_t)r * k, *dzr = dz + (size_t)r * e;
        if (norm_topk) {
            float s = 0, g = 0;
            for (int j = 0; j < k; j++)
                s += pr[sr[j]];
            for (int j = 0; j < k; j++)
                g += dvr[j] * wr_[j];
            for (int j = 0; j < k; j++)
                dvr[j] = (dvr[j] - g) / s;
        }
        for (int i = 0; i < e; i++)
            dzr[i] = aux ? aux_scale * stats[i] : 0.0f;
        for (int j = 0; j < k; j++)
            dzr[sr[j]] += dvr[j];
        float g = cpu_dot(dzr, pr, e);
        for (int i = 0; i < e; i++)
            dzr[i] = pr[i] * (dzr[i] - g);
    }
    if (dwr) {
        st = sbprt_gemm(ctx, dwr, dz, x, 1, 0, e, d, n, 1.0f, 1.0f);
        if (st)
            return st;
    }
    if (dx) {
        st = sbprt_gemm(ctx, dx, dz, wr, 0, 0, n, d, e, 1.0f, 1.0f);
        if (st)
            return st;
    }
    return SBPRT_OK;
}
